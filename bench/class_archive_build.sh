#!/usr/bin/env bash
# make jvm-archive's two class archives (jar-free; the Delta jars on the class path) built from nothing, three ways:
# one after the other with Spark's default JIT and GC (as before 2026-12-07), one after the other with C1 and the
# serial GC (what build() gives its JVM now), side by side with C1 (what make jvm-archive does now). Each into a
# temporary folder; prints the wall of each and the CPU flags. docs/development.md ("CI") has the figures.
#   bash bench/class_archive_build.sh [REPEATS]
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
py=.venv/bin/python
repeats=${1:-2}
echo "# $(date -u +%F) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores;" \
  "$(for f in avx2 avx512f avx512_bf16; do grep -qw $f /proc/cpuinfo && echo "$f yes" || echo "$f no"; done | paste -sd, -)"
build() {  # folder, groups (python tuple)
  $py -c "from pathlib import Path; from pipeline.spark.class_archive import build; print(build(Path('$1'), groups=$2))"
}
run() {  # label, SPARK_SUBMIT_OPTS (after build()'s own, so they win), side by side (0/1)
  local d s
  d=$(mktemp -d /tmp/archive-build.XXXX)
  s=$(date +%s.%N)
  if [ "$3" = 1 ]; then
    SPARK_SUBMIT_OPTS="$2" build "$d" "()" >"$d/a.log" 2>&1 &
    SPARK_SUBMIT_OPTS="$2" build "$d" "('delta',)" >"$d/b.log" 2>&1
    wait
  else
    { SPARK_SUBMIT_OPTS="$2" build "$d" "()"; SPARK_SUBMIT_OPTS="$2" build "$d" "('delta',)"; } >"$d/a.log" 2>&1
  fi
  printf '%-40s %6.1f s, %s archives (load average %s at the end)\n' "$1:" "$(echo "$(date +%s.%N) - $s" | bc)" \
    "$(ls "$d"/*.jsa | wc -l)" "$(cut -d' ' -f1 /proc/loadavg)"
  rm -rf "$d"
}
for _ in $(seq "$repeats"); do
  run "default JIT and GC, one after the other" "-XX:TieredStopAtLevel=4 -XX:-UseSerialGC -XX:+UseG1GC" 0
  run "C1 and serial GC, one after the other" "" 0
  run "C1 and serial GC, side by side" "" 1
done

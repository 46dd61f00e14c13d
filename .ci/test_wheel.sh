#!/usr/bin/env bash
# The wheel as users install it (make test-wheel): built once from this checkout, then for each pyspark version
# given (default: every supported Spark line, 4.0 on Python 3.12: Databricks 17.3 LTS's pair; the others on $PYTHON,
# 3.11 in CI; add 4.0.1 for 4.0 on it too) a fresh venv
# on that Python gets that pyspark first (the platform's Spark), then the wheel with its extras; pip must resolve
# the wheel beside it without touching it. The smoke set tests/wheel/ runs there from a folder outside the
# checkout, so the installed package is what runs: every public entry point and each shipped notebook's code path.
#
#   .ci/test_wheel.sh [PYSPARK_VERSION[@PYTHON_X.Y] ...]      e.g. .ci/test_wheel.sh 4.0.1@3.12 4.3.0
#
# PYTHON (default python3) builds the wheel and is the venvs' Python where none is named; @3.12 takes $PYTHON_3_12,
# else python3.12 on the PATH, else a pyenv 3.12, else whatever uv finds. Installs go through uv (its cache
# hardlinks torch's few GB into each venv instead of copying them again) with requirements.lock as constraints
# (the versions the suite runs; pyspark and delta-spark left to the matrix).
#
# Each line's smoke set writes what passed, per entry point and notebook, to a results file; a line whose set
# did not pass completely (a failure, a skip, a test not run) fails the script. At the end the results are
# merged into docs/wheel_matrix.json and the docs' matrix (README.md, docs/install.md) rendered from it
# (.ci/wheel_matrix.py); SBI_WHEEL_MATRIX=0 leaves the checkout's files alone.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
PYTHON=${PYTHON:-python3}
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(4.0.1@3.12 4.1.4 4.2.0 4.3.0)
extras=transformers,extract,images,endpoint,test
work=${SBI_WHEEL_WORK:-$repo/.cache/wheel-test}
started=$(date +%s)
mkdir -p "$work"

# uv, in a venv of its own
uv_venv=$work/uv
[ -x "$uv_venv/bin/uv" ] || { "$PYTHON" -m venv "$uv_venv" && "$uv_venv/bin/pip" install -q "uv==0.13.9"; }
uv=$uv_venv/bin/uv
export UV_CACHE_DIR=${UV_CACHE_DIR:-$HOME/.cache/uv}
[ -n "${PIP_CERT:-}" ] && export SSL_CERT_FILE=${SSL_CERT_FILE:-$PIP_CERT}

python_for() {  # the interpreter for "X.Y" (empty: $PYTHON)
  local want=$1 var found
  [ -n "$want" ] || { echo "$PYTHON"; return; }
  var=PYTHON_${want//./_}
  if [ -n "${!var:-}" ]; then echo "${!var}"; return; fi
  # on the PATH (a pyenv shim may name a version it does not run: try it), else a pyenv install
  if found=$(command -v "python$want") && "$found" -c 'import sys' 2>/dev/null; then echo "$found"; return; fi
  found=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$want".*/bin/python"$want" 2>/dev/null | sort -V | tail -1)
  [ -n "$found" ] && { echo "$found"; return; }
  echo "$want"  # uv's own discovery (or a managed download where allowed)
}

# the wheel
rm -rf "$work/dist"
"$PYTHON" -m pip wheel -q --no-deps -w "$work/dist" .
wheel=$(ls "$work"/dist/spark_batch_inference-*.whl)
echo "[test-wheel] built $(basename "$wheel")"
unzip -p "$wheel" '*/METADATA' | grep -E '^(Version|Requires-Python|License-Expression|Requires-Dist: (pyspark|torch))' | sed 's/^/[test-wheel]   /'
if unzip -p "$wheel" '*/METADATA' | grep -E '^Requires-Dist: pyspark' | grep -vq 'extra =='; then
  echo "[test-wheel] FAIL: the wheel requires pyspark outside an extra"; exit 1
fi

# constraints: the lock's pins, but not the Spark the matrix sets nor torch's local +cpu tag
constraints=$work/constraints.txt
grep -Ev '^(pyspark|delta[-_]spark)==' requirements.lock | sed -E 's/^torch==([^+ ]+)\+[a-z0-9]+/torch==\1/' >"$constraints"
# the OCR notebook's model: the PP-OCR files the rapidocr wheel ships (a data package, as in the dev venv)
ocr_models=$(grep -E '^rapidocr-onnxruntime==' requirements-data.lock)

# what the lines of this run share: the tiny models (the same weights everywhere) and score(df)'s embeddings
# (SBI_WHEEL_KEEP_SHARED=1: keep an earlier run's, so this run's lines are compared with its lines too)
shared=$work/shared
results=$work/results
pyspark_wheels=$work/pyspark-wheels
mkdir -p "$pyspark_wheels"
[ "${SBI_WHEEL_KEEP_SHARED:-0}" = 1 ] || rm -rf "$shared"
rm -rf "$results"
mkdir -p "$shared" "$results"

line() {  # one Spark line (PYSPARK_VERSION[@PYTHON_X.Y]): its venv, the install checks and the smoke set
  local run=$1 failed=0
  spark=${run%@*}
  want=$([ "$run" != "$spark" ] && echo "${run#*@}" || true)
  python=$(python_for "$want")
  line_started=$(date +%s)
  venv=$work/venv-spark-$spark${want:+-py$want}
  echo "[test-wheel] ===== pyspark $spark on $python: fresh venv $venv ====="
  rm -rf "$venv"
  "$uv" venv -q --python "$python" "$venv"
  pyver=$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  # pyspark's wheel, built from its sdist once per version into $work/pyspark-wheels (PyPI has no pyspark wheel,
  # and uv's cache built the sdist again for every new revision it fetched: 1 GB a build, 43 GB on one machine)
  if ! ls "$pyspark_wheels"/pyspark-"$spark"-*.whl >/dev/null 2>&1; then
    local built
    built=$(mktemp -d "$pyspark_wheels/.build-XXXXXX")
    # its files stored, not deflated: the 450 MB are jars, zipped already (pyspark 4.3.0: 23 s against 45 s, a
    # 499 MB wheel against 457 MB)
    "$PYTHON" -m pip wheel -q --no-deps --no-cache-dir --config-settings=--build-option=--compression=stored \
      -w "$built" "pyspark==$spark"
    mv "$built"/pyspark-"$spark"-*.whl "$pyspark_wheels/"
    rm -rf "$built"
  fi
  "$uv" pip install -q --python "$venv/bin/python" --find-links "$pyspark_wheels" --only-binary pyspark \
    "pyspark[connect]==$spark" --constraint "$constraints"
  # pip itself must resolve the wheel and its extras beside the platform's pyspark without touching it
  "$uv" pip install -q --python "$venv/bin/python" pip
  "$venv/bin/python" -m pip install -q --dry-run --report "$work/report-$spark-$pyver.json" "$wheel[$extras]" \
    --constraint "$constraints"
  "$venv/bin/python" - "$work/report-$spark-$pyver.json" <<'PY'
import json, sys
moved = [i["metadata"]["name"] + "==" + i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"]
         if i["metadata"]["name"].lower() in ("pyspark", "delta-spark", "delta_spark")]
print(f"[test-wheel]   pip install of the wheel beside the platform's pyspark would install: {moved or 'no pyspark'}")
sys.exit(1 if moved else 0)
PY
  # --compile-bytecode: the whole venv's bytecode now, on every core (as pip does at install), or each process of the
  # smoke set compiles torch, transformers and pyspark again where Python writes no bytecode (PYTHONDONTWRITEBYTECODE,
  # as on this project's CI machines: importing them took 9.5 s instead of 6.0 s in each process)
  "$uv" pip install -q --python "$venv/bin/python" --find-links "$pyspark_wheels" --only-binary pyspark \
    --compile-bytecode "$wheel[$extras]" --constraint "$constraints"
  "$uv" pip install -q --python "$venv/bin/python" --no-deps "$ocr_models"
  found=$("$venv/bin/python" -c 'import pyspark; print(pyspark.__version__)')
  [ "$found" = "$spark" ] || { echo "[test-wheel] FAIL: pyspark is $found after installing the wheel, not $spark"; exit 1; }
  echo "[test-wheel]   $("$venv/bin/sbi" --version)"
  # the Delta connector's jars for this Spark line, where a Delta release is built for it (its own cache folder)
  jars=$HOME/.cache/spark-batch-inference/jars-spark-$spark
  SBI_JARS_DIR=$jars "$venv/bin/python" -m pipeline.spark.jars fetch delta
  tests=$(mktemp -d)
  mkdir -p "$tests/tests"
  cp tests/__init__.py "$tests/tests/"
  cp -r tests/support tests/wheel "$tests/tests/"
  cp -r notebooks "$tests/"
  echo "[test-wheel]   smoke set (tests/wheel) with pyspark $spark, Python $pyver"
  result=$results/$spark-py$pyver.json
  if ! (cd "$tests" && SBI_JARS_DIR=$jars SBI_EXPECT_PYSPARK=$spark SBI_WHEEL_RESULTS=$results \
        SBI_WHEEL_SHARED=$shared PYSPARK_PYTHON="$venv/bin/python" \
        "$venv/bin/python" -m pytest -q -s -p no:cacheprovider -o addopts="" --timeout 900 -rs --durations=8 \
        tests/wheel); then
    failed=1
    echo "[test-wheel] FAIL: the smoke set failed with pyspark $spark on Python $pyver"
  elif ! "$PYTHON" .ci/wheel_matrix.py complete "$result"; then
    failed=1
    echo "[test-wheel] FAIL: the smoke set with pyspark $spark on Python $pyver did not run whole"
  fi
  rm -rf "$tests"
  echo "pyspark $spark on Python $pyver: $(( $(date +%s) - line_started )) s" >"$work/line-$1.time"
  echo "[test-wheel]   $(cat "$work/line-$1.time")"
  return $failed
}

# SBI_WHEEL_JOBS lines at a time (default 1): each line's venv, jars and results are its own; the tiny models they
# share are built under a lock (tests/wheel/conftest.py), and a line's output is printed whole when it ends
jobs=${SBI_WHEEL_JOBS:-1}
status=0
pids=()
for run in "${runs[@]}"; do
  rm -f "$work/line-$run.time" "$work/line-$run.log"
  # in a subshell of its own with -e (a failed install ends the line, not the others); its exit status is the line's
  if [ "$jobs" -le 1 ]; then
    set +e
    (set -e; line "$run") 2>&1 | tee "$work/line-$run.log"
    rc=${PIPESTATUS[0]}
    set -e
    [ "$rc" = 0 ] || status=1
    continue
  fi
  echo "[test-wheel] $run: started ($jobs lines at a time; its output when it ends)"
  (set -e; line "$run") >"$work/line-$run.log" 2>&1 &
  pids+=("$!")
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 2; done
done
i=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=1
  cat "$work/line-${runs[$i]}.log"
  i=$((i + 1))
done
timings=()
for run in "${runs[@]}"; do
  timings+=("$(cat "$work/line-$run.time" 2>/dev/null || echo "pyspark $run: did not finish")")
done
if [ "${SBI_WHEEL_MATRIX:-1}" = 1 ] && ls "$results"/*.json >/dev/null 2>&1; then
  "$PYTHON" .ci/wheel_matrix.py merge "$results"/*.json
  "$PYTHON" .ci/wheel_matrix.py render --write
  git diff --stat -- docs/wheel_matrix.json README.md docs/install.md 2>/dev/null | sed 's/^/[test-wheel] matrix: /' || true
fi
printf '[test-wheel] %s\n' "${timings[@]}"
echo "[test-wheel] ${runs[*]}: $([ $status = 0 ] && echo passed || echo FAILED) in $(( $(date +%s) - started )) s"
exit $status

#!/usr/bin/env bash
# The wheel as users install it (make test-wheel): built once from this checkout, then for each pyspark version
# given (default: the oldest and the newest supported Spark line) a fresh venv gets that pyspark first (the
# platform's Spark), then the wheel with its extras; pip must resolve the wheel beside it without touching it.
# The smoke set tests/wheel/ runs there from a folder outside the checkout, so the installed package is what runs.
#
#   .ci/test_wheel.sh [PYSPARK_VERSION ...]        e.g. .ci/test_wheel.sh 4.0.0 4.3.0
#
# Installs go through uv (its cache hardlinks torch's few GB into the second venv instead of copying them again)
# with requirements.lock as constraints (the versions the suite runs; pyspark and delta-spark left to the matrix).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
PYTHON=${PYTHON:-python3}
sparks=("$@")
[ ${#sparks[@]} -gt 0 ] || sparks=(4.0.0 4.3.0)
extras=transformers,extract,endpoint,test
work=${SBI_WHEEL_WORK:-$repo/.cache/wheel-test}
started=$(date +%s)
mkdir -p "$work"

# uv, in a venv of its own
uv_venv=$work/uv
[ -x "$uv_venv/bin/uv" ] || { "$PYTHON" -m venv "$uv_venv" && "$uv_venv/bin/pip" install -q "uv==0.13.9"; }
uv=$uv_venv/bin/uv
export UV_CACHE_DIR=${UV_CACHE_DIR:-$HOME/.cache/uv}
[ -n "${PIP_CERT:-}" ] && export SSL_CERT_FILE=${SSL_CERT_FILE:-$PIP_CERT}

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

status=0
for spark in "${sparks[@]}"; do
  venv=$work/venv-spark-$spark
  echo "[test-wheel] ===== pyspark $spark: fresh venv $venv ====="
  rm -rf "$venv"
  "$uv" venv -q --python "$PYTHON" "$venv"
  "$uv" pip install -q --python "$venv/bin/python" "pyspark[connect]==$spark" --constraint "$constraints"
  # pip itself must resolve the wheel and its extras beside the platform's pyspark without touching it
  "$uv" pip install -q --python "$venv/bin/python" pip
  "$venv/bin/python" -m pip install -q --dry-run --report "$work/report-$spark.json" "$wheel[$extras]" \
    --constraint "$constraints"
  "$venv/bin/python" - "$work/report-$spark.json" <<'PY'
import json, sys
moved = [i["metadata"]["name"] + "==" + i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"]
         if i["metadata"]["name"].lower() in ("pyspark", "delta-spark", "delta_spark")]
print(f"[test-wheel]   pip install of the wheel beside the platform's pyspark would install: {moved or 'no pyspark'}")
sys.exit(1 if moved else 0)
PY
  "$uv" pip install -q --python "$venv/bin/python" "$wheel[$extras]" --constraint "$constraints"
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
  echo "[test-wheel]   smoke set (tests/wheel) with pyspark $spark"
  if ! (cd "$tests" && SBI_JARS_DIR=$jars SBI_EXPECT_PYSPARK=$spark PYSPARK_PYTHON="$venv/bin/python" \
        "$venv/bin/python" -m pytest -q -p no:cacheprovider -o addopts="" --timeout 900 tests/wheel); then
    status=1
    echo "[test-wheel] FAIL: the smoke set failed with pyspark $spark"
  fi
  rm -rf "$tests"
done
echo "[test-wheel] pyspark ${sparks[*]}: $([ $status = 0 ] && echo passed || echo FAILED) in $(( $(date +%s) - started )) s"
exit $status

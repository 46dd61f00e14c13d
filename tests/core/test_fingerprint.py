"""The task fingerprint: which settings change it, and incremental runs that rescore on a change (real Spark)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from pipeline.config import build_config
from pipeline.config.fingerprint import (check_declarations, fingerprint_settings, fingerprint_task_keys,
                                         task_fingerprint)
from pipeline.registry import register_task, task_kinds
from pipeline.runner import JobError, run_job
from pipeline.stages.inputs import prepare_inputs

from tests.support.data import REPO
from tests.support.generation_models import generate_job, save_model_folder
from tests.support.jobs import job_config, read_scores

REV = "0123456789abcdef"


def _job(**sections: Any):
    data: dict[str, Any] = {
        "job": "fp", "source": {"path": "docs"}, "model": {"path": "models/a"},
        "task": {"kind": "embed", "labels": {"pos": "good", "neg": "bad"}}, "sink": {"path": "out"},
    }
    for key, value in sections.items():
        data[key] = value if key == "task" and "kind" in value else {**data.get(key, {}), **value}
    return build_config(data)


BASE = task_fingerprint(_job(), revision=REV)

CHANGES_RESULTS = {
    "labels": dict(task={"labels": {"pos": "great", "neg": "bad"}}),
    "a label added": dict(task={"labels": {"pos": "good", "neg": "bad", "meh": "so so"}}),
    "pooling": dict(task={"pooling": "cls"}),
    "max_length": dict(batching={"max_length": 128}),
    "precision": dict(model={"precision": "bf16"}),
    "int8": dict(model={"precision": "int8"}),
    "model name": dict(model={"name": "other"}),
}
CHANGES_NOTHING = {
    "batch_size": dict(batching={"batch_size": 7}),
    "token_budget": dict(batching={"token_budget": 4096}),
    "bucket_shapes": dict(batching={"bucket_shapes": [32, 64, 128, 256]}),
    "sort_by_length": dict(batching={"sort_by_length": False}),
    "chunks_ahead": dict(batching={"chunks_ahead": 0}),
    "pad_to_multiple_of": dict(batching={"pad_to_multiple_of": 8}),
    "model folder moved": dict(model={"path": "/mnt/elsewhere/a"}),
    "device": dict(model={"device": "cpu"}),
    "torch_threads": dict(model={"torch_threads": 2}),
    "int8 options while fp32": dict(model={"int8": {"per_channel": False}}),
    "accuracy gate while fp32": dict(model={"accuracy_gate": {"min_mean_cosine": 0.9}}),
    "spark": dict(spark={"rows_per_task": 10, "master": "local[1]"}),
    "source": dict(source={"limit": 5, "repartition": 3}),
    "sink": dict(sink={"mode": "append", "path": "elsewhere"}),
    "run": dict(run={"incremental": True, "progress": False, "run_id": "r1", "faults": {"poison_marker": "X"}}),
}


@pytest.mark.parametrize("change", list(CHANGES_RESULTS))
def test_a_result_changing_setting_changes_the_fingerprint(change):
    assert task_fingerprint(_job(**CHANGES_RESULTS[change]), revision=REV) != BASE


@pytest.mark.parametrize("change", list(CHANGES_NOTHING))
def test_a_setting_that_changes_no_result_leaves_it(change):
    assert task_fingerprint(_job(**CHANGES_NOTHING[change]), revision=REV) == BASE


def test_other_weights_and_reduced_precision_options_change_it():
    assert task_fingerprint(_job(), revision="fedcba9876543210") != BASE
    bf16 = _job(model={"precision": "bf16"})
    gate = _job(model={"precision": "bf16", "accuracy_gate": {"min_mean_cosine": 0.9}})
    assert task_fingerprint(gate, revision=REV) != task_fingerprint(bf16, revision=REV)
    int8 = _job(model={"precision": "int8"})
    skip = _job(model={"precision": "int8", "int8": {"skip_modules": ["output.dense"]}})
    assert task_fingerprint(skip, revision=REV) != task_fingerprint(int8, revision=REV)


def test_generate_template_changes_it_slots_and_mode_do_not():
    def gen(**task: Any) -> str:
        return task_fingerprint(_job(task={"kind": "generate", **task}), revision=REV)

    base = gen()
    for result_changing in ({"template": "Summarise: {text}"}, {"system_prompt": "be brief"},
                            {"max_new_tokens": 8}, {"max_input_tokens": 64}, {"truncation": "keep_end"},
                            {"temperature": 0.7}, {"stop": ["."]}, {"backend": "vllm"},
                            {"vllm": {"engine_args": {"quantization": "fp8"}}}):
        assert gen(**result_changing) != base, result_changing
    for neutral in ({"slots": 3}, {"mode": "static"}, {"max_kv_cache_mb": 64.0},
                    {"vllm": {"max_num_seqs": 4, "gpu_memory_utilization": 0.5, "in_process": False}}):
        assert gen(**neutral) == base, neutral
    # generate reads no batching key: even max_length leaves it
    assert task_fingerprint(_job(task={"kind": "generate"}, batching={"max_length": 64}), revision=REV) == base


def test_the_hash_is_stable_across_processes():
    """No Python ``hash()`` or set order in it: another interpreter with another hash seed agrees."""
    code = ("from tests.core.test_fingerprint import _job, REV\n"
            "from pipeline.config.fingerprint import task_fingerprint\n"
            "print(task_fingerprint(_job(), revision=REV))")
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == BASE


def test_every_kind_declares_keys_its_config_has():
    kinds = task_kinds()
    for entry in kinds.values():
        check_declarations(entry.config)  # raises on a key the config does not have
    generate = kinds["generate"].config
    assert set(fingerprint_task_keys(generate)[1]) == {f"task.{k}" for k in generate.fingerprint_ignore}
    # a kind that names a key its config lacks is refused when it registers
    broken = type("Broken", (kinds["embed"].config,), {"fingerprint_ignore": frozenset({"pooling", "nope"})})
    with pytest.raises(ValueError, match=r"unknown keys \['nope'\]"):
        register_task(broken, kinds["embed"].task)
    assert task_kinds()["embed"].config is kinds["embed"].config


def test_the_config_reference_lists_what_is_in_the_fingerprint():
    """Fails when the page's list drifts from the code:
    `python -m pipeline config-reference --write docs/reference/config.md`."""
    from pipeline.docs import FINGERPRINT_BEGIN, FINGERPRINT_END, fingerprint_reference

    page = (REPO / "docs" / "reference" / "config.md").read_text()
    block = page.split(FINGERPRINT_BEGIN, 1)[1].split(FINGERPRINT_END, 1)[0].strip()
    assert block == fingerprint_reference()
    assert "`batching.max_length`" in block and "`task.slots`" in block


# ------------------------------------------------------------------ incremental runs on Spark

def _docs(texts: list[str]) -> pa.Table:
    return pa.table({"doc_id": [f"d{i:02d}" for i in range(len(texts))], "text": texts,
                     "source": ["test"] * len(texts)})


TEXTS = ["this movie was very good", "an awful, boring film", "i loved the music and the story",
         "the plot was long and the actor was not funny", "great", "POISON but good", "sad song", "a quiet night"]


def _latest(table: pa.Table) -> dict[str, dict[str, Any]]:
    latest: dict[str, dict[str, Any]] = {}
    for row in sorted(table.to_pylist(), key=lambda r: r["scored_at"]):
        latest[row["doc_id"]] = row
    return latest


def _pending(spark, config, revision: str) -> int:
    """Rows an incremental run of ``config`` would score: the runner's own anti-join, counted in Spark."""
    return prepare_inputs(spark, config, revision=revision).count()


def test_incremental_runs_rescore_rows_whose_fingerprint_changed(spark, tmp_path, tiny_embed_model):
    write_deltalake(str(tmp_path / "docs"), _docs(TEXTS))
    n = len(TEXTS)
    base = job_config(tmp_path, tiny_embed_model, run={"incremental": True})
    first = run_job(base, spark=spark, out=io.StringIO())
    revision = first.model_revision
    assert (first.rows_in, first.rows_out) == (n, n)
    assert set(read_scores(tmp_path)["task_fingerprint"].to_pylist()) == {task_fingerprint(base, revision=revision)}

    def changed(**sections: Any):
        data = base.model_dump(mode="json")
        for key, value in sections.items():
            data[key] = value if key == "task" else {**data[key], **value}
        return build_config(data)

    # unchanged, or only batching that changes no result: nothing to rescore
    assert _pending(spark, base, revision) == 0
    assert _pending(spark, changed(batching={"batch_size": 3, "token_budget": 512}), revision) == 0
    # task.labels, max_length, precision: every row again
    labels = changed(task={"kind": "embed", "labels": {"pos": "great fun", "neg": "bad awful"}},
                     run={"faults": {"poison_marker": "POISON"}, "max_error_fraction": 0.2})
    for config in (labels, changed(batching={"max_length": 64}), changed(model={"precision": "bf16"})):
        assert _pending(spark, config, revision) == n

    # the second incremental run (labels changed, one row failing) rescored every row: read back
    second = run_job(labels, spark=spark, out=io.StringIO())
    fp = task_fingerprint(labels, revision=revision)
    assert (second.rows_in, second.rows_out, second.rows_quarantined) == (n, n - 1, 1)
    table = read_scores(tmp_path)
    assert table.num_rows == 2 * n - 1
    latest = _latest(table)
    assert {k for k, r in latest.items() if (r["task_fingerprint"], r["run_id"]) == (fp, second.run_id)} == (
        set(latest) - {"d05"})
    assert latest["d05"]["run_id"] == first.run_id  # its new score failed: the old one stays the latest
    # the failed row is in quarantine with the run's fingerprint: the next run skips it as known-bad,
    # and retries only it when asked to
    quarantine = pa.table(DeltaTable(str(tmp_path / "scores_quarantine")).to_pyarrow_table()).to_pylist()
    assert [(r["doc_id"], r["task_fingerprint"]) for r in quarantine] == [("d05", fp)]
    assert _pending(spark, labels, revision) == 0
    retry = labels.model_copy(update={"run": labels.run.model_copy(update={"retry_quarantined": True})})
    assert _pending(spark, retry, revision) == 1

    # an output written before fingerprints existed: a clear error, and the advice in it works
    old = read_scores(tmp_path).drop_columns(["task_fingerprint"])
    write_deltalake(str(tmp_path / "scores"), old, mode="overwrite", schema_mode="overwrite", partition_by=["ds"])
    # (another day: a rerun of `base` itself is a no-op, its transaction id being in the table)
    with pytest.raises(JobError, match="no task_fingerprint column .* run once without run.incremental"):
        run_job(changed(run={"ds": "2026-12-02"}), spark=spark, out=io.StringIO())
    full = changed(run={"incremental": False}, sink={"mode": "overwrite_partition"})
    assert run_job(full, spark=spark, out=io.StringIO()).rows_out == n
    assert read_scores(tmp_path).num_rows == n
    assert _pending(spark, base, revision) == 0


def test_a_changed_prompt_template_rescores_generated_rows(spark, tmp_path):
    model_dir = save_model_folder(tmp_path / "tiny-llama")
    texts = ["the film is funny", "a dull mess", "smart and moving"]
    task = {"backend": "transformers", "template": "{text}", "max_input_tokens": 32, "max_new_tokens": 3, "slots": 2}

    base = generate_job(tmp_path, model_dir, texts, task=task).model_dump(mode="json")

    def run(**changes: Any):
        run_section = {**base["run"], "incremental": True}
        config = build_config({**base, "task": {**base["task"], **changes}, "run": run_section})
        return config, run_job(config, spark=spark, out=io.StringIO())

    _, first = run()
    assert first.rows_out == 3
    slots = build_config({**base, "task": {**base["task"], "slots": 3, "mode": "static"},
                          "run": {**base["run"], "incremental": True}})
    assert _pending(spark, slots, first.model_revision) == 0  # batching only: the same tokens
    config, templated = run(template="Summarise: {text}")
    assert (templated.rows_in, templated.rows_out) == (3, 3)
    latest = _latest(pa.table(DeltaTable(str(tmp_path / "out")).to_pyarrow_table()))
    assert {r["task_fingerprint"] for r in latest.values()} == {
        task_fingerprint(config, revision=templated.model_revision)}

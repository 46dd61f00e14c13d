"""The precision gate's verdicts remembered (pipeline.models.verdicts): replayed without a forward pass, measured
again when the model, the precision, a setting or the machine changes, never trusted when damaged, written whole."""

from __future__ import annotations

import datetime as dt
import io
import json
import multiprocessing
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.config import BatchingConfig, ModelConfig
from pipeline.core.metrics import WorkerCounts
from pipeline.models.onnx_int8 import CACHE_FOLDER
from pipeline.models.verdicts import VERDICT_FOLDER, MachineIdentity, VerdictMemory, VerdictMissing
from pipeline.tasks.embed import EmbedTask, EmbedTaskConfig

from tests.support.data import SENTENCES, make_documents, write_delta

LABELS = {"pos": "good great loved", "neg": "bad awful hated"}
# bf16 passes these on the tiny model (mean cosine about 0.9999), with room
GATE = {"min_mean_cosine": 0.99, "min_top_label_agreement": 0.9}
ROWS = tuple(SENTENCES)


class CountingEmbed(EmbedTask):
    """The embed task, counting the gate's calibration passes (``score_texts``: fp32 and each precision measured)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.passes = 0

    def score_texts(self, loaded, texts):
        self.passes += 1
        return super().score_texts(loaded, texts)


def _task(model_dir, precision="bf16", *, gate=None, batching=None, rows=ROWS, kind=CountingEmbed, **model):
    return kind(EmbedTaskConfig(labels=LABELS),
                model=ModelConfig(path=str(model_dir), precision=precision, accuracy_gate=gate or GATE, **model),
                batching=batching or BatchingConfig(batch_size=4, max_length=32), calibration_rows=rows)


def _load(task, model_dir, machine=None):
    return task.load(model_dir, "cpu", machine=machine)


def _embeddings(task, loaded):
    chunk = pa.record_batch([pa.array(SENTENCES * 2, pa.string())], names=["text"])
    return np.array(task.process(loaded, chunk, WorkerCounts()).column("embedding").to_pylist())


def _verdict_file(model_dir) -> Path:
    (path,) = (Path(model_dir) / VERDICT_FOLDER).glob("*.json")
    return path


@pytest.fixture
def model_dir(tiny_embed_model, tmp_path):
    """A copy of the tiny encoder of its own: its verdicts and its weights are this test's."""
    return shutil.copytree(tiny_embed_model, tmp_path / "tiny-embed")


def test_a_second_load_replays_the_verdict_without_a_forward_pass(model_dir):
    first = _task(model_dir)
    measured = _load(first, model_dir)
    assert first.passes == 2 and not measured.gate.remembered  # fp32 and bf16 on the sample
    assert measured.precision == "bf16"

    second = _task(model_dir)
    replayed = _load(second, model_dir)
    assert second.passes == 0 and replayed.gate.remembered and replayed.precision == "bf16"
    assert [c.record() for c in replayed.gate.checks] == [c.record() for c in measured.gate.checks]
    (check,) = replayed.gate.checks
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    assert check.describe().endswith(f"on {len(ROWS)} run rows (pass; remembered verdict from {today})")
    assert replayed.load_counts == {"precision_used": {"bf16": 1}, "precision_checks": {check.describe(): 1}}
    # the replayed load scores as the measured one does: bf16
    assert np.array_equal(_embeddings(first, measured), _embeddings(second, replayed))

    # tomorrow's sample (other rows of the same job) replays the same verdict: the rows are not in its key
    other_rows = _task(model_dir, rows=tuple(reversed(SENTENCES[1:])))
    assert _load(other_rows, model_dir).gate.remembered and other_rows.passes == 0


def test_auto_replays_its_choice_and_speeds(model_dir):
    gate = {"min_mean_cosine": 0.5, "min_top_label_agreement": 0.0}
    first = _task(model_dir, "auto", gate=gate)
    measured = _load(first, model_dir)
    assert first.passes >= 2 and all(c.speedup is not None for c in measured.gate.checks)
    second = _task(model_dir, "auto", gate=gate)
    replayed = _load(second, model_dir)
    assert second.passes == 0 and replayed.precision == measured.precision
    assert [c.speedup for c in replayed.gate.checks] == [c.speedup for c in measured.gate.checks]
    (choice,) = replayed.load_counts["precision_auto"]
    assert choice.startswith(f"auto -> {measured.precision} (remembered verdict from ")


OTHER_CPU = MachineIdentity(cpu="Some Other CPU @ 2.0GHz", flags=("avx2", "fma", "sse4_2"))
CHANGES = {
    "precision asked": dict(precision="fp16"),
    "a threshold": dict(gate={**GATE, "min_mean_cosine": 0.98}),
    "the sample's size": dict(gate={**GATE, "sample_rows": 64}),
    "the configured texts": dict(gate={**GATE, "calibration_texts": ["one more text"]}),
    "the length the sample is cut to": dict(batching=BatchingConfig(batch_size=4, max_length=16)),
    "the batch size": dict(batching=BatchingConfig(batch_size=2, max_length=32)),
    "the torch threads": dict(torch_threads=3),
    "the task's labels": dict(labels={"pos": "good", "neg": "bad"}),
    "the CPU": dict(machine=OTHER_CPU),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_measures_again_and_is_then_remembered_itself(model_dir, change):
    """Each change is a key of its own: measured once, then replayed; the first verdict is still there."""
    import torch

    settings = dict(CHANGES[change])
    machine = settings.pop("machine", None)
    labels = settings.pop("labels", None)
    threads = settings.pop("torch_threads", None)

    def task():
        made = _task(model_dir, **settings)
        if labels:
            made.config = EmbedTaskConfig(labels=labels)
        return made

    _load(_task(model_dir), model_dir)
    before = torch.get_num_threads()
    try:
        if threads:  # the worker sets its threads before loading (pipeline.spark.udf.load_model)
            torch.set_num_threads(threads)
        changed, again = task(), task()
        assert not _load(changed, model_dir, machine).gate.remembered and changed.passes >= 2
        assert _load(again, model_dir, machine).gate.remembered and again.passes == 0
    finally:
        torch.set_num_threads(before)
    unchanged = _task(model_dir)
    assert _load(unchanged, model_dir).gate.remembered and unchanged.passes == 0
    assert len(list((model_dir / VERDICT_FOLDER).glob("*.json"))) == 2


def test_new_weights_measure_again(model_dir):
    from safetensors.torch import load_file, save_file

    first = _task(model_dir)
    _load(first, model_dir)
    weights = model_dir / "model.safetensors"
    tensors = load_file(str(weights))
    name = next(k for k in tensors if k.endswith("bias"))
    tensors[name] = tensors[name] + 0.01
    save_file(tensors, str(weights), metadata={"format": "pt"})
    retrained = _task(model_dir)
    assert not _load(retrained, model_dir).gate.remembered and retrained.passes == 2


def test_the_machine_identity_is_the_cpus_name_and_flags(tmp_path):
    def machine(text):
        (tmp_path / "cpuinfo").write_text(text)
        return MachineIdentity.here("cpu", cpuinfo=tmp_path / "cpuinfo")

    zen = "processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\n" \
          "processor\t: 1\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
    here = machine(zen)
    assert here.cpu == "AMD EPYC 9R14" and here.flags == ("avx2", "avx512_bf16", "avx512f", "fpu")
    assert dict(here.libraries)["torch"]
    no_bf16 = machine(zen.replace(" avx512_bf16", ""))
    other = machine(zen.replace("9R14", "7R13"))
    keys = {VerdictMemory(tmp_path, {}, machine=m).key for m in (here, no_bf16, other)}
    assert len(keys) == 3
    assert VerdictMemory(tmp_path, {}, machine=machine(zen)).key == VerdictMemory(tmp_path, {}, machine=here).key


def _flip_pass(record):
    record["checks"][0]["passed"] = not record["checks"][0]["passed"]


def _other_key(record):
    record["material"]["settings"]["threads"] += 1


def _no_checks(record):
    record["checks"] = []


def _timed(record):
    record["checks"][0]["speedup"] = 1.5


def _bad_figure(record):
    record["checks"][0]["mean_cosine"] = True  # 1 to a comparison, not a figure


def _bad_count(record):
    record["checks"][0]["rows"] = "16"


def _bad_date(record):
    record["written"] = "yesterday"


TEXT_DAMAGE = {
    "truncated": lambda text: text[: len(text) // 2],
    "not text": lambda text: "\x00\xff\x00",
    "empty": lambda text: "",
    "a list": lambda text: "[]",
}
RECORD_DAMAGE = {
    "a pass its figures do not give": _flip_pass,
    "another key's verdict": _other_key,
    "fewer checks than the chain measures": _no_checks,
    "a speed where none is measured": _timed,
    "a figure of the wrong type": _bad_figure,
    "a count of the wrong type": _bad_count,
    "no date": _bad_date,
}


@pytest.mark.parametrize("damage", [*TEXT_DAMAGE, *RECORD_DAMAGE])
def test_a_damaged_verdict_is_measured_again_and_rewritten(model_dir, damage):
    _load(_task(model_dir), model_dir)
    path = _verdict_file(model_dir)
    if damage in TEXT_DAMAGE:
        path.write_text(TEXT_DAMAGE[damage](path.read_text()))
    else:
        record = json.loads(path.read_text())
        RECORD_DAMAGE[damage](record)
        path.write_text(json.dumps(record))
    again = _task(model_dir)
    loaded = _load(again, model_dir)
    assert not loaded.gate.remembered and again.passes == 2 and loaded.precision == "bf16"
    replayed = _task(model_dir)  # and what it measured was written whole in its place
    assert _load(replayed, model_dir).gate.remembered and replayed.passes == 0


def test_a_precision_the_verdict_failed_is_not_prepared_again(model_dir):
    """int8 failed (threshold 1.0): a later load neither measures it nor exports its graph again."""
    strict = {"min_mean_cosine": 1.0}
    first = _task(model_dir, "int8", gate=strict)
    measured = _load(first, model_dir)
    assert measured.precision == "fp32" and measured.gate.checks[0].precision == "int8"
    assert not measured.gate.checks[0].passed
    shutil.rmtree(model_dir / CACHE_FOLDER)
    second = _task(model_dir, "int8", gate=strict)
    replayed = _load(second, model_dir)
    assert replayed.gate.remembered and second.passes == 0 and replayed.precision == "fp32"
    assert not (model_dir / CACHE_FOLDER).exists()
    (reason,) = replayed.load_counts["precision_fallbacks"]
    assert reason.startswith("int8->fp32 (int8: mean cosine") and "remembered verdict from" in reason


def test_remember_false_measures_every_load_and_keeps_nothing(model_dir):
    for _ in range(2):
        task = _task(model_dir, gate={**GATE, "remember": False})
        assert not _load(task, model_dir).gate.remembered and task.passes == 2
    assert not (model_dir / VERDICT_FOLDER).exists()


def test_a_failure_that_fails_the_load_is_not_remembered(model_dir):
    from pipeline.models.precision import PrecisionGateError

    for _ in range(2):
        task = _task(model_dir, gate={"min_mean_cosine": 1.0, "on_fail": "fail"})
        failed = f"model.precision bf16 failed the accuracy gate on {len(ROWS)} run rows"
        with pytest.raises(PrecisionGateError, match=failed):
            _load(task, model_dir)
        assert task.passes == 2  # measured each time
    assert not list((model_dir / VERDICT_FOLDER).glob("*.json"))


def test_a_read_only_model_folder_keeps_its_verdicts_in_the_user_cache(model_dir, tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("SBI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as root, nothing here is read-only
    _load(_task(model_dir), model_dir)
    assert len(list((tmp_path / "cache" / "gate").glob("*.json"))) == 1
    assert not (model_dir / VERDICT_FOLDER).exists()
    again = _task(model_dir)
    assert _load(again, model_dir).gate.remembered and again.passes == 0


def test_a_load_that_may_only_replay_loads_nothing_without_a_verdict(model_dir):
    warm = CountingEmbed(EmbedTaskConfig(labels=LABELS), model=ModelConfig(path=str(model_dir), precision="bf16",
                                                                           accuracy_gate=GATE),
                         batching=BatchingConfig(batch_size=4, max_length=32), recall_verdict_only=True)
    with pytest.raises(VerdictMissing, match=r"no remembered precision gate verdict at .*\.sbi-gate"):
        _load(warm, model_dir)
    assert warm.passes == 0
    _load(_task(model_dir), model_dir)  # the job's own load, on its rows
    assert _load(warm, model_dir).gate.remembered and warm.passes == 0
    # and it is the same model in the worker's cache as the job's rows would load
    assert warm.cache_key() == _task(model_dir).cache_key() != _task(model_dir, rows=()).cache_key()


# ------------------------------------------------------------------------------------ concurrency

def _memory_at_one_thread(model_dir: Path) -> VerdictMemory:
    """The verdict's place as a one-thread worker sees it (the key holds the thread count: each process sets it)."""
    import torch

    torch.set_num_threads(1)
    return VerdictMemory.for_model(model_dir, _task(model_dir).verdict_settings(), machine=MachineIdentity.here())


class SignallingEmbed(CountingEmbed):
    """Sets ``loaded`` once the fp32 model is loaded, just before the gate (and its lock)."""

    loaded = None

    def load_extras(self, loaded):
        labels = super().load_extras(loaded)
        type(self).loaded.set()
        return labels


def _load_in_process(model_dir: str, loaded, results) -> None:
    import torch

    torch.set_num_threads(1)
    SignallingEmbed.loaded = loaded
    task = _task(Path(model_dir), kind=SignallingEmbed)
    loaded = _load(task, Path(model_dir))
    results.put((task.passes, loaded.gate.remembered, loaded.precision))


@pytest.fixture
def one_thread():
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_worker_waits_for_the_one_measuring_on_its_host_and_replays_its_verdict(model_dir, one_thread):
    """While one worker holds the verdict's lock (it is measuring), another waits, then replays what it kept."""
    memory = _memory_at_one_thread(model_dir)
    spawn = multiprocessing.get_context("spawn")
    loaded, results = spawn.Event(), spawn.Queue()
    with memory.measuring():
        waiter = spawn.Process(target=_load_in_process, args=(str(model_dir), loaded, results))
        waiter.start()
        assert loaded.wait(180)
        time.sleep(3)  # from there to the lock is milliseconds; measuring the tiny model on its own well under this
        assert waiter.is_alive() and results.empty()
        # what the measuring worker keeps (here: a bf16 pass, as if measured on the same sample)
        memory.keep([{"precision": "bf16", "mean_cosine": 0.99995, "top_label_agreement": 1.0, "passed": True,
                      "rows": len(ROWS), "sample": "run rows", "speedup": None}], "bf16")
    passes, remembered, precision = results.get(timeout=120)
    waiter.join(30)
    assert (passes, remembered, precision) == (0, True, "bf16")


def _keep_often(model_dir: str, n: int) -> None:
    memory = _memory_at_one_thread(Path(model_dir))
    check = {"precision": "bf16", "mean_cosine": 0.9999, "top_label_agreement": 1.0, "passed": True,
             "rows": 16, "sample": "run rows " + "x" * 4000, "speedup": None}
    for _ in range(n):
        memory.keep([check], "bf16")


@pytest.mark.drills  # a race: writers and readers at once
def test_concurrent_writers_leave_a_whole_verdict_readers_always_can_read(model_dir, one_thread):
    memory = _memory_at_one_thread(model_dir)
    _keep_often(str(model_dir), 1)
    spawn = multiprocessing.get_context("spawn")
    writers = [spawn.Process(target=_keep_often, args=(str(model_dir), 300)) for _ in range(2)]
    for w in writers:
        w.start()
    reads = unreadable = 0
    while any(w.is_alive() for w in writers) or reads < 100:
        reads += 1
        unreadable += memory.recall() is None
    for w in writers:
        w.join(60)
        assert w.exitcode == 0
    assert unreadable == 0, f"{unreadable} of {reads} reads found no whole verdict"
    assert memory.recall()["checks"][0]["precision"] == "bf16"
    assert not [p for p in (model_dir / VERDICT_FOLDER).iterdir() if p.suffix == ".tmp"]


# ------------------------------------------------------------------------------------- in a run

def test_the_second_run_replays_the_first_runs_verdict(spark, tmp_path, model_dir):
    """Run one: one worker measures, any other replays its verdict. Run two, new rows (a new sample): every
    load replays it; no calibration pass anywhere; the summary says from when."""
    from pipeline.runner import run_job

    from tests.support.jobs import D2, job_config

    write_delta(tmp_path / "docs", make_documents(40))
    def config(name, **sections):
        job = job_config(tmp_path, model_dir, **sections)
        return job.model_copy(update={"model": ModelConfig(path=str(model_dir), name=name, precision="bf16",
                                                           accuracy_gate=GATE)})

    first = run_job(config("tiny-bert"), spark=spark)
    loads = sum(first.model_loads.values())
    measured = {c: n for c, n in first.precision_checks.items() if "remembered" not in c}
    assert loads >= 1 and list(measured.values()) == [1] and first.precision_used == {"bf16": loads}

    write_delta(tmp_path / "docs", make_documents(60), mode="overwrite")
    # another lineage name: a new key in the workers' model cache, so each worker loads again
    out = io.StringIO()
    second = run_job(config("tiny-bert-2", run={"progress": False, "ds": D2}), spark=spark, out=out)
    loads = sum(second.model_loads.values())
    assert loads >= 1 and second.precision_used == {"bf16": loads}
    (check,) = second.precision_checks
    assert "(pass; remembered verdict from " in check and second.precision_checks[check] == loads
    assert f"precision gate          : {check} in {loads} load(s)" in out.getvalue()


# ----------------------------------------------------------------------------------- the warm-up

def _job(tmp_path, model_dir, **model):
    from pipeline.config import build_config

    return build_config({
        "job": "nightly", "source": {"format": "delta", "path": str(tmp_path / "docs"), "id_column": "doc_id"},
        "model": {"path": str(model_dir), "name": "tiny-bert", "precision": "bf16", "accuracy_gate": GATE, **model},
        "task": {"kind": "embed", "labels": LABELS}, "batching": {"batch_size": 4, "max_length": 32},
        "sink": {"path": str(tmp_path / "scores"), "mode": "overwrite"}, "spark": {"master": "local[2]"},
        "run": {"progress": False, "summary_path": str(tmp_path / "summary.json")},
    })


def test_the_warm_up_loads_the_model_only_with_a_remembered_verdict(tmp_path, model_dir):
    """A gate calibrating on the job's rows (drawn later) used to rule the warm-up out; now it replays a remembered
    verdict into the worker's cache, under the key the job's tasks use, and loads nothing where none is kept."""
    from pipeline.models import cache
    from pipeline.registry import get_task_kind
    from pipeline.spark.warmup import warm_up, warm_up_plan

    kind = get_task_kind("embed").task
    plan = warm_up_plan(_job(tmp_path, model_dir), model_path=str(model_dir), task_class=kind)
    assert plan.recall_verdict_only and not plan.calibration_rows
    assert warm_up_plan(_job(tmp_path, model_dir, accuracy_gate={**GATE, "remember": False}),
                        model_path=str(model_dir), task_class=kind) is None
    fp32 = warm_up_plan(_job(tmp_path, model_dir, precision="fp32"), model_path=str(model_dir), task_class=kind)
    assert fp32 is not None and not fp32.recall_verdict_only

    cache.clear()
    loads = cache.load_count()
    assert [b.to_pydict() for b in warm_up(plan, iter([]))] == [{"loaded": [False]}]
    assert cache.load_count() == loads  # nothing measured, nothing cached
    job_task = plan.build_task()
    job_task.calibration_rows, job_task.recall_verdict_only = ROWS, False
    _load(job_task, model_dir)  # a task of the job measures on its rows and keeps the verdict
    assert [b.to_pydict() for b in warm_up(plan, iter([]))] == [{"loaded": [True]}]
    assert cache.load_count() == loads + 1
    assert job_task.cache_key() == plan.build_task().cache_key()
    cache.clear()


_NIGHT = """
import json, sys
from pipeline import load_config, run_job
summary = run_job(load_config(sys.argv[1]))
print("RESULT " + json.dumps({"loads": sum(summary.model_loads.values()), "checks": summary.precision_checks,
                              "used": summary.precision_used}))
"""


@pytest.mark.slow  # two jobs, each with a Spark of its own in a subprocess
@pytest.mark.beside
def test_the_second_night_measures_nothing(tmp_path, model_dir):
    """Two nights of one small job, each a new process (a light session: the warm-up loads while the driver
    plans), the second on more rows: night one measures once, night two replays in every load."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps(_job(tmp_path, model_dir).model_dump(mode="json")))
    env = {**os.environ, "PYTHONPATH": str(repo), "PYSPARK_PYTHON": sys.executable}
    for key in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_GATEWAY_PORT", "SPARK_SUBMIT_OPTS"):
        env.pop(key, None)
    nights = []
    for rows in (40, 60):
        write_delta(tmp_path / "docs", make_documents(rows), mode="overwrite")
        done = subprocess.run([sys.executable, "-c", _NIGHT, str(job)], cwd=repo, env=env, capture_output=True,
                              text=True, timeout=400)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "small job" in done.stdout
        nights.append(json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0]))
    first, second = nights
    assert [n for c, n in first["checks"].items() if "remembered" not in c] == [1]
    assert second["loads"] >= 1 and second["used"] == {"bf16": second["loads"]}
    (check,) = second["checks"]
    assert "remembered verdict from" in check and second["checks"][check] == second["loads"]


# ------------------------------------------------------------------------------ the first night's cost

def test_auto_stops_measuring_a_precision_too_slow_to_win_after_the_probe(tiny_embed_model):
    """auto times the sample's first PROBE_ROWS rows apart: a precision under SLOWER of fp32's speed there is not run
    on the rest of the sample (here int8, slowed by the run function), and its check says on how many rows."""
    from pipeline.config import AccuracyGateConfig, Int8Config
    from pipeline.models.loading import load_model
    from pipeline.models.precision import PROBE_ROWS, SLOWER, select_precision
    from pipeline.tasks.base import LoadedText

    task = _task(tiny_embed_model, "auto")
    tokenizer, model = load_model(tiny_embed_model, kind="embed")
    reference = LoadedText(tokenizer, model)
    reference.labels = task.load_extras(reference)
    calls = []

    def run(candidate, precision, texts):
        calls.append((precision, len(texts)))
        started = time.perf_counter()
        out = task.score_texts(LoadedText(tokenizer, candidate, precision, reference.labels), texts)
        if precision == "int8":  # a quarter of its own speed at most, and a second slower than fp32's few
            # milliseconds: a busy machine's pause in fp32's timed pass never makes int8 look fast enough
            time.sleep(max(3 * (time.perf_counter() - started), 1.0))
        return out

    texts = [f"{SENTENCES[i % len(SENTENCES)]} ({i})" for i in range(3 * PROBE_ROWS)]
    gate = AccuracyGateConfig(min_mean_cosine=0.5, min_top_label_agreement=0.0)
    _, result = select_precision(model, "auto", run=run, top_labels=lambda out: task.top_labels(reference, out),
                                 gate=gate, int8=Int8Config(backend="torch"), texts=texts)
    int8 = result.checks[0]
    assert int8.precision == "int8" and int8.rows == PROBE_ROWS and int8.speedup < SLOWER and not int8.kept
    assert int8.describe().endswith(f"on {PROBE_ROWS} run rows (pass, but not faster than fp32)")
    assert max(n for p, n in calls if p == "int8") == PROBE_ROWS  # never the rest of the sample
    assert sum(n for p, n in calls if p == "fp32") == len(texts) + 4  # one pass in two parts, after a warm-up
    # the next precision (bf16 where this CPU has it fast, else fp32) is tried as before
    assert result.checks[1:] == () or result.checks[1].precision == "bf16"

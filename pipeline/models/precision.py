"""Reduced precision for encoder models, and the accuracy gate that guards it.

``fp32`` is the reference. ``bf16``/``fp16`` run under CPU autocast (weights
stay fp32) or with cast weights on CUDA. ``int8`` (CPU only) is, by default,
the model exported to ONNX and run on ONNX Runtime with int8 weight MatMuls
(``pipeline.models.onnx_int8``, cached per model revision), or torch dynamic
quantisation of the ``nn.Linear`` layers (``model.int8.backend: torch``);
per channel by default, the FFN down-projection left in fp32. ``auto`` tries
the precisions that can be faster on the device (:func:`auto_chain`) and keeps
the first that passes the gate and also ran the calibration sample faster than
fp32 did (timed after a warm-up); otherwise fp32.

Reduced precision can silently wreck a model (measured on MiniLM: per-tensor
int8 on every layer has embeddings with mean cosine ~0.93 to fp32), so at
load the worker scores a calibration sample in fp32 and in the chosen
precision (:func:`select_precision`): rows of the job's own input drawn on
the driver (``model.accuracy_gate.sample_rows``), else configured or
built-in texts. Below the configured agreement it falls back along
:data:`SAFER` (int8 -> bf16 -> fp32, fp16 -> fp32; int8 -> fp32 on a CPU
without native bf16, where bf16 is slower than fp32) and reports the
fallback, or fails when the config says so. Every check's figures go into
the run's counts, so the summary prints what was measured. The verdict is
remembered per model, precision, settings and machine
(:mod:`pipeline.models.verdicts`): later loads replay it without measuring.
Imported lazily on executors (torch).
"""

from __future__ import annotations

import copy
import re
import time
import warnings
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np

from pipeline.config import AccuracyGateConfig, Int8Config
from pipeline.errors import PrecisionGateError
from pipeline.models.gate_checks import GateCheck, GateResult, agreement, gate_error, passes

__all__ = [
    "CALIBRATION_TEXTS", "SAFER", "GateCheck", "GateResult", "PrecisionGateError", "agreement", "auto_chain",
    "autocast_dtype", "fallback_chain", "has_fast_bf16", "prepare_model", "select_precision", "timed_run",
]

# The next safer precision: bf16 keeps fp32's range, so it is int8's first
# fallback; fp16 can overflow, so it falls straight back to fp32.
SAFER: dict[str, str] = {"int8": "bf16", "bf16": "fp32", "fp16": "fp32"}

# auto times the calibration sample's first rows apart: a precision below this share of fp32's speed on them
# cannot win on the rest (timing noise on 64 rows is a few percent), so its accuracy is checked on them only
PROBE_ROWS = 64
SLOWER = 0.8

# Built-in calibration sample: short and long, positive and negative, review-
# and tweet-like, so both the embedding and the zero-shot label are exercised.
CALIBRATION_TEXTS: tuple[str, ...] = (
    "A wonderful, moving film with a brilliant cast. I loved every minute of it.",
    "Boring, predictable and far too long; I nearly walked out.",
    "The plot follows a retired detective who returns to his home town when an old friend disappears.",
    "Great night at the rally, thank you Ohio! Huge crowd, tremendous energy.",
    "Fake news media is at it again. Sad!",
    "It's not great, but the music is good and the leads have real chemistry.",
    "An awful script sinks what could have been a fun summer blockbuster.",
    "Quietly devastating, and the best performance of the actor's career.",
    "meh",
    "Two sisters inherit a crumbling hotel on the coast and must decide whether to sell it to a developer "
    "or restore it themselves, while old family secrets surface one summer at a time.",
    "This is the worst sequel I have seen in years; the jokes are stale and the action is incoherent.",
    "Funny, warm and surprisingly wise about growing older.",
    "Congratulations to the team on a great win tonight!",
    "The director never decides whether this is a thriller or a comedy, and it fails at both.",
    "A visually stunning but emotionally hollow epic.",
    "I laughed, I cried, I bought the soundtrack.",
)


def fallback_chain(precision: str, *, fast_bf16: bool = True) -> list[str]:
    """``precision`` then each safer one down to fp32: ``fallback_chain("int8") == ["int8", "bf16", "fp32"]``.

    Without ``fast_bf16`` (a CPU with no native bf16, where bf16 autocast is
    several times slower than fp32) bf16 is no fallback: int8 falls back to fp32.
    """
    chain = [precision]
    while chain[-1] != "fp32":
        chain.append(SAFER[chain[-1]])
        if chain[-1] == "bf16" and not fast_bf16:
            chain[-1] = "fp32"
    return chain


def auto_chain(device_type: str, *, fast_bf16: bool) -> list[str]:
    """``precision: auto``: the precisions to try, fastest first, on this device; the gate keeps the first that passes.

    On CUDA bf16 (fp32's range, half the bytes); on a CPU int8 (ONNX Runtime),
    then bf16 where the CPU has native bf16, then fp32.

    >>> auto_chain("cpu", fast_bf16=False), auto_chain("cuda", fast_bf16=True)
    (['int8', 'fp32'], ['bf16', 'fp32'])
    """
    if device_type != "cpu":
        return ["bf16", "fp32"]
    return fallback_chain("int8", fast_bf16=fast_bf16)


def has_fast_bf16(device_type: str) -> bool:
    """Whether bf16 is a speed-up on this device: CUDA, or a CPU with native bf16 (AVX-512 BF16, AMX)."""
    if device_type != "cpu":
        return True
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # pragma: no cover - builds without oneDNN
        return False


def autocast_dtype(precision: str, device_type: str) -> Any:
    """The CPU autocast dtype for ``precision``, or None (fp32, int8, or CUDA where weights are cast)."""
    import torch

    if device_type == "cpu" and precision in ("bf16", "fp16"):
        return torch.bfloat16 if precision == "bf16" else torch.float16
    return None


def prepare_model(model: Any, precision: str, *, int8: Int8Config | None = None, copy_model: bool = False,
                  model_dir: Any = None, kind: str | None = None) -> Any:
    """``model`` ready to run at ``precision`` (fp32 weights in; a new object when quantising or ``copy_model``).

    On CPU bf16/fp16 change nothing here (autocast at forward time); on CUDA
    they cast the weights. int8 is refused on CUDA, where bf16/fp16 are the
    fast, accurate choice; on the onnxruntime backend it needs the model's
    folder (``model_dir``: the cache of its exported graph) and task ``kind``.
    """
    import torch

    device = model.device
    if precision == "fp32":
        return model
    if precision == "int8":
        config = int8 or Int8Config()
        if device.type != "cpu":
            raise ValueError(
                f"model.precision int8 runs on the CPU only, but this model is on {device}; use model.precision "
                "bf16 or fp16 (or auto) on CUDA, or model.device cpu"
            )
        if config.backend == "torch":
            return _quantize_int8(model, config)
        if model_dir is None or kind is None:
            raise ValueError("int8 on onnxruntime needs the model folder and the task kind (prepare_model(model_dir=, "
                             "kind=)); or set model.int8.backend: torch")
        from pipeline.models.onnx_int8 import load_int8_encoder

        return load_int8_encoder(model, model_dir, kind=kind, int8=config, threads=torch.get_num_threads())
    if precision not in ("bf16", "fp16"):
        raise ValueError(f"unknown precision {precision!r}; use fp32, bf16, fp16 or int8")
    if device.type == "cpu":
        return model
    target = copy.deepcopy(model) if copy_model else model
    return target.to(torch.bfloat16 if precision == "bf16" else torch.float16)


def _quantize_int8(model: Any, config: Int8Config) -> Any:
    import torch
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

    qconfig = per_channel_dynamic_qconfig if config.per_channel else default_dynamic_qconfig
    spec = {
        name: qconfig for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and not any(re.search(skip, name) for skip in config.skip_modules)
    }
    if not spec:
        raise ValueError(
            f"model.int8.skip_modules {config.skip_modules} leaves no Linear layer to quantise; "
            "skip fewer layers or use model.precision fp32"
        )
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao on every call
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, qconfig_spec=spec, dtype=torch.qint8, inplace=False)


def timed_run(run: Callable[[Any, str, Sequence[str]], dict[str, np.ndarray]], model: Any, precision: str,
              texts: Sequence[str], *, warm: bool) -> tuple[dict[str, np.ndarray], float]:
    """``(run(model, precision, texts), seconds it took)``; with ``warm``, after a first call on a few texts
    (first-call set-up: kernels chosen, sessions started) that is not timed."""
    if warm:
        run(model, precision, list(texts)[:4])
    started = time.perf_counter()
    outputs = run(model, precision, texts)
    return outputs, time.perf_counter() - started


def select_precision(
    model: Any,
    requested: str,
    *,
    run: Callable[[Any, str, Sequence[str]], dict[str, np.ndarray]],
    top_labels: Callable[[dict[str, np.ndarray]], np.ndarray | None],
    gate: AccuracyGateConfig,
    int8: Int8Config | None = None,
    texts: Sequence[str] | None = None,
    sample: str = "run rows",
    model_dir: Any = None,
    kind: str | None = None,
    memory: Any = None,
) -> tuple[Any, GateResult]:
    """The model to use and the gate's verdict, trying ``requested`` (or, for ``auto``, the fastest first) then each
    safer precision.

    ``run(model, precision, texts)`` scores texts and returns the task's
    outputs (row-aligned arrays). ``texts`` are the job's sampled rows (named
    ``sample`` in the checks); with none, ``gate.calibration_texts`` or the
    built-in sentences. With the gate disabled, or for fp32, the requested
    precision is used unchecked (``auto`` then means its fastest choice).

    ``memory`` (a :class:`pipeline.models.verdicts.VerdictMemory`): a verdict it
    remembers is replayed without a forward pass (a precision that failed is
    not even prepared: no int8 graph exported for it); otherwise this worker
    measures under the memory's lock, so one worker per host measures and the
    others replay, and keeps what it measured.
    """
    device_type = model.device.type
    fast_bf16 = has_fast_bf16(device_type)
    chain = auto_chain(device_type, fast_bf16=fast_bf16) if requested == "auto" else fallback_chain(
        requested, fast_bf16=fast_bf16)
    prepare = dict(int8=int8, model_dir=model_dir, kind=kind)
    if requested == "fp32" or not gate.enabled:
        return prepare_model(model, chain[0], **prepare), GateResult(requested, chain[0])
    calibration = list(texts or ()) + list(gate.calibration_texts)
    if not calibration:
        calibration, sample = list(CALIBRATION_TEXTS), "built-in calibration texts"
    elif not texts:
        sample = "configured calibration texts"
    measure = partial(_measure, model, requested, chain, run=run, top_labels=top_labels, gate=gate,
                      calibration=calibration, sample=sample, prepare=prepare)
    if memory is None:
        return measure()
    checks = memory.recall_checks(requested, chain, gate)
    if checks is None and memory.recall_only:
        from pipeline.models.verdicts import VerdictMissing

        raise VerdictMissing(f"no remembered precision gate verdict at {memory.path}")
    if checks is None:
        with memory.measuring():  # one worker per host measures; the others wait here, then replay its verdict
            checks = memory.recall_checks(requested, chain, gate)
            if checks is None:
                chosen, result = measure()
                memory.keep([c.record() for c in result.checks], result.precision)
                return chosen, result
    return _replay(model, requested, chain, checks, gate=gate, prepare=prepare)


def _measure(model: Any, requested: str, chain: list[str], *, run: Callable[..., dict[str, np.ndarray]],
             top_labels: Callable[[dict[str, np.ndarray]], np.ndarray | None], gate: AccuracyGateConfig,
             calibration: list[str], sample: str, prepare: dict[str, Any]) -> tuple[Any, GateResult]:
    """The gate measured now: fp32 and each precision of ``chain`` in turn on ``calibration``, up to the first kept.

    ``auto`` times each pass in two parts, the first :data:`PROBE_ROWS` rows then the rest: a precision
    below :data:`SLOWER` of fp32's speed on the first part cannot win, and is not run on the rest (its
    check reports the probe's rows).
    """
    timed = requested == "auto"  # auto keeps a precision only where it is faster here, measured on the sample
    head, rest = (calibration[:PROBE_ROWS], calibration[PROBE_ROWS:]) if timed else (calibration, [])
    reference, fp32_head_s = timed_run(run, model, "fp32", head, warm=timed)
    reference, fp32_rest_s = _more(run, model, "fp32", rest, reference)
    checks: list[GateCheck] = []
    for precision in chain:
        if precision == "fp32":
            return model, GateResult(requested, "fp32", tuple(checks))
        candidate = prepare_model(model, precision, copy_model=True, **prepare)
        outputs, head_s = timed_run(run, candidate, precision, head, warm=timed)
        if timed and fp32_head_s / max(head_s, 1e-9) < SLOWER:  # too slow to win: no need to measure the rest
            rows, speedup = len(head), fp32_head_s / max(head_s, 1e-9)
            cosine, top = agreement({k: v[:rows] for k, v in reference.items()}, outputs, top_labels)
        else:
            outputs, rest_s = _more(run, candidate, precision, rest, outputs)
            rows, speedup = len(calibration), (fp32_head_s + fp32_rest_s) / max(head_s + rest_s, 1e-9)
            cosine, top = agreement(reference, outputs, top_labels)
        checks.append(GateCheck(precision, cosine, top, passes(cosine, top, gate), rows, sample,
                                speedup if timed else None))
        if checks[-1].kept:
            return candidate, GateResult(requested, precision, tuple(checks))
        if gate.on_fail == "fail" and requested != "auto":
            raise gate_error(requested, checks[-1], gate)
        del candidate
    raise AssertionError("unreachable: the chain ends at fp32")  # pragma: no cover


def _more(run: Callable[..., dict[str, np.ndarray]], model: Any, precision: str, texts: list[str],
          outputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    """``outputs`` followed by ``run``'s outputs for ``texts`` (timed, no warm-up: the model just ran), and the
    seconds they took."""
    if not texts:
        return outputs, 0.0
    more, seconds = timed_run(run, model, precision, texts, warm=False)
    return {name: np.concatenate([array, more[name]]) for name, array in outputs.items()}, seconds


def _replay(model: Any, requested: str, chain: list[str], checks: list[GateCheck], *, gate: AccuracyGateConfig,
            prepare: dict[str, Any]) -> tuple[Any, GateResult]:
    """The remembered verdict applied: only the precision it kept is prepared (fp32 when none was)."""
    for check in checks:
        if check.kept:
            return prepare_model(model, check.precision, **prepare), GateResult(requested, check.precision,
                                                                                tuple(checks))
        if gate.on_fail == "fail" and requested != "auto":
            raise gate_error(requested, check, gate)
    return model, GateResult(requested, "fp32", tuple(checks))

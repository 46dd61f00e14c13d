"""The task fingerprint: one short hash of everything that changes what a row's output is.

Incremental runs (``run.incremental``) skip a row when the output already
holds its ``(id, content_hash, task_fingerprint)``: the same input scored by
the same model with the same result-changing settings. Any setting in the
fingerprint that changes (``task.labels``, a prompt template,
``batching.max_length``, ``model.precision``, new weights...) gives every row a
new fingerprint, so the next incremental run rescores them; a setting left out
(batch sizes, slots, threads, progress...) rescores nothing.

What goes in (:func:`fingerprint_settings`):

- the model: its revision (a hash of the weights, config and tokenizer files,
  wherever the folder lives), ``model.name`` and ``model.precision``, plus
  ``model.int8`` when the precision is ``int8`` or ``auto`` and ``model.accuracy_gate``
  (all but ``remember``) when it is not ``fp32`` (the gate may fall back to another precision);
- every ``task.*`` key except those the kind lists in
  ``fingerprint_ignore`` (its config class, see :class:`~pipeline.config.TaskConfig`);
- the ``batching.*`` keys the kind lists in ``fingerprint_batching`` (all of
  them when it does not say).

Nothing else: paths, the device, threads, ``spark.*``, ``source.*`` (the
input's content is the ``content_hash``), ``sink.*`` and ``run.*``.

A kind leaves a key out only when it provably does not change results:
``generate``'s ``mode`` and ``slots`` give the same tokens as unbatched
generation (tests/generation/test_generation.py); an encoder's batch size and padding
only regroup rows whose padding is masked. OCR leaves nothing out: padding a
line wider moves its confidence (tests/images/test_ocr.py). Values are hashed with
their defaults filled in, so a new result-changing setting in a later version
changes every fingerprint once.

>>> from pipeline.config import build_config
>>> base = {"job": "j", "source": {"path": "docs"}, "model": {"path": "m"}, "task": {"kind": "embed"},
...         "sink": {"path": "out"}}
>>> fp = task_fingerprint(build_config(base), revision="abc")
>>> len(fp), fp == task_fingerprint(build_config({**base, "batching": {"batch_size": 7}}), revision="abc")
(16, True)
>>> fp == task_fingerprint(build_config({**base, "batching": {"max_length": 64}}), revision="abc")
False
>>> fp == task_fingerprint(build_config(base), revision="abd")
False

This module is pure (no pyspark, no torch): the runner stores the fingerprint
as the lineage column ``task_fingerprint`` of every output and quarantine row.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel

from pipeline.config import BatchingConfig, JobConfig, TaskConfig

__all__ = ["FINGERPRINT_VERSION", "check_declarations", "drop_keys", "fingerprint_batching_keys", "fingerprint_settings", "fingerprint_task_keys",
           "task_fingerprint"]

# Bumped when what goes into the hash changes (every row is then rescored once).
FINGERPRINT_VERSION = 1

# model keys that are in every fingerprint, and those in it only for some precisions
MODEL_KEYS = ("model.name", "model.precision")
MODEL_KEYS_WHEN = {"model.int8": "`model.precision` is `int8` or `auto`",
                   "model.accuracy_gate": "`model.precision` is not `fp32` (all but `remember`)"}


def task_fingerprint(config: JobConfig, *, revision: str) -> str:
    """sha256 (16 hex digits) of :func:`fingerprint_settings`: what incremental runs compare per row."""
    payload = json.dumps(fingerprint_settings(config, revision=revision), sort_keys=True,
                         separators=(",", ":"), default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def fingerprint_settings(config: JobConfig, *, revision: str) -> dict[str, Any]:
    """The settings hashed into the fingerprint: ``version``, ``model``, ``task`` and ``batching``.

    >>> from pipeline.config import build_config
    >>> job = build_config({"job": "j", "source": {"path": "d"}, "model": {"path": "m"},
    ...                     "task": {"kind": "generate", "slots": 4}, "sink": {"path": "o"}})
    >>> s = fingerprint_settings(job, revision="abc")
    >>> s["model"], s["batching"], "slots" in s["task"], s["task"]["template"]
    ({'revision': 'abc', 'name': None, 'precision': 'fp32'}, {}, False, '{text}')
    """
    model = config.model
    settings: dict[str, Any] = {"revision": revision, "name": model.name, "precision": model.precision}
    if model.precision in ("int8", "auto"):  # auto may choose int8
        settings["int8"] = model.int8.model_dump(mode="json")
    if model.precision != "fp32":
        # whether a verdict is remembered changes when the gate measures, not what it decides
        settings["accuracy_gate"] = model.accuracy_gate.model_dump(mode="json", exclude={"remember"})
    task_class = type(config.task)
    task = config.task.model_dump(mode="json")
    for path in task_class.fingerprint_ignore:
        _drop(task, path.split("."))
    batching = config.batching.model_dump(mode="json")
    return {
        "version": FINGERPRINT_VERSION,
        "model": settings,
        "task": task,
        "batching": {key: batching[key] for key in fingerprint_batching_keys(task_class)},
    }


def fingerprint_batching_keys(task_class: type[TaskConfig]) -> tuple[str, ...]:
    """The ``batching`` keys in the fingerprint of ``task_class``'s kind (all of them unless it says)."""
    keys = task_class.fingerprint_batching
    return tuple(BatchingConfig.model_fields) if keys is None else tuple(keys)


def fingerprint_task_keys(task_class: type[TaskConfig]) -> tuple[list[str], list[str]]:
    """``(in, out)``: the kind's ``task.*`` leaf keys in the fingerprint, and those it leaves out.

    >>> from pipeline.registry import get_task_kind
    >>> _, out = fingerprint_task_keys(get_task_kind("generate").config)
    >>> "task.slots" in out and "task.template" not in out
    True
    """
    ignored = task_class.fingerprint_ignore
    keys_in, keys_out = [], []
    for key in _leaf_keys(task_class):
        if key == "kind":
            continue
        parts = key.split(".")
        left_out = any(".".join(parts[:i]) in ignored for i in range(1, len(parts) + 1))
        (keys_out if left_out else keys_in).append(f"task.{key}")
    return keys_in, keys_out


def check_declarations(task_class: type[TaskConfig]) -> None:
    """Raise ``ValueError`` when a kind's fingerprint declarations name keys its configs do not have."""
    leaves = set(_leaf_keys(task_class))
    prefixes = {".".join(k.split(".")[:i]) for k in leaves for i in range(1, len(k.split(".")) + 1)}
    unknown = sorted(set(task_class.fingerprint_ignore) - prefixes)
    if unknown:
        raise ValueError(f"{task_class.__name__}.fingerprint_ignore names unknown keys {unknown}")
    bad = sorted(set(task_class.fingerprint_batching or ()) - set(BatchingConfig.model_fields))
    if bad:
        raise ValueError(f"{task_class.__name__}.fingerprint_batching names unknown batching keys {bad}")


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The settings class of a field typed ``Model`` or ``Model | None``; None for any other field."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(args) == 1 and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0]
    return None


def drop_keys(settings: dict[str, Any], paths: Any) -> dict[str, Any]:
    """``settings`` (a config dumped as JSON) without the dotted ``paths``, changed in place and returned.

    >>> drop_keys({"task": {"endpoint": {"base_url": "u", "model": "m"}}}, ["task.endpoint.base_url"])
    {'task': {'endpoint': {'model': 'm'}}}
    """
    for path in paths:
        _drop(settings, path.split("."))
    return settings


def _leaf_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        annotation = _submodel(field.annotation) or field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys += _leaf_keys(annotation, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _drop(data: dict[str, Any], path: list[str]) -> None:
    if len(path) == 1:
        data.pop(path[0], None)
    elif isinstance(data.get(path[0]), dict):
        _drop(data[path[0]], path[1:])

"""The precision gate's verdicts, remembered per model, precision, settings and machine.

What the gate measures when a worker loads a model (each precision's agreement
with fp32 on the calibration sample and, for ``auto``, its speed against fp32:
:func:`pipeline.models.precision.select_precision`) depends on the model's
files, the precision asked, the gate's settings, the task and the batching it
calibrates with, the worker's torch threads, the machine (the CPU's model name
and flags; the GPU), and the libraries that run the model. None of these
changes from one night to the next, so the first load that measures keeps its
verdict in the model cache, beside the exported int8 graphs
(``<model folder>/.sbi-gate/<key>.json``, or ``$SBI_CACHE_DIR/gate/`` when the
model folder is read-only), and later loads with the same of all of these
replay it without a forward pass. A change to any of them is a new key: the
next load measures again.

The sample's rows are not in the key, only where they come from (the job's
rows, configured texts, the built-in sentences) and how many: a nightly job's
sample moves with its input, and a verdict re-measured on every new sample
would be measured every night. A shift in what the model is fed is what the
drift gate watches, on every row's output (``run.quality``).

A verdict file is written whole (a temporary file renamed into place), so a
reader never sees half of one; workers on one host measure one at a time under
a file lock (:meth:`VerdictMemory.measuring`), so the first measures and the
others replay what it kept. A file that cannot be read, parsed or matched to
this key is ignored and measured again, never trusted. Imported lazily on
executors.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import platform
import socket
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

__all__ = ["VERDICT_FOLDER", "MachineIdentity", "VerdictMemory", "VerdictMissing"]

# the folder beside the model's own files that holds its verdicts
VERDICT_FOLDER = ".sbi-gate"
# bump when what a verdict holds or how it is measured changes: older files are then not reused
_FORMAT = "precision gate verdict v1"
# the libraries whose kernels and tokenizers the gate measured
_LIBRARIES = ("torch", "transformers", "tokenizers", "onnxruntime", "onnx")


class VerdictMissing(LookupError):
    """No verdict is remembered for this key, and the load may only replay one (a warm-up without the run's rows)."""


@dataclass(frozen=True)
class MachineIdentity:
    """What a verdict depends on of the machine: the CPU's model name and flags, the accelerator, the libraries.

    :meth:`here` reads them; tests and tools pass another machine's identity to
    :class:`VerdictMemory` to see a verdict re-measured on it.
    """

    cpu: str
    flags: tuple[str, ...] = ()
    accelerator: str = ""  # the CUDA device's name and CUDA version; empty on a CPU
    libraries: tuple[tuple[str, str], ...] = ()

    @classmethod
    def here(cls, device: str = "cpu", *, cpuinfo: Path = Path("/proc/cpuinfo")) -> "MachineIdentity":
        """This machine: ``cpuinfo``'s first ``model name`` and its ``flags`` (``Features`` on ARM), else the
        platform's processor name; the CUDA device ``device`` names; the installed versions of the libraries."""
        name, flags = "", ()
        try:
            for line in cpuinfo.read_text().splitlines():
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Hardware", "CPU part") and not name:
                    name = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = tuple(sorted(set(value.split())))
        except OSError:
            pass
        accelerator = ""
        if device.startswith("cuda"):
            import torch

            index = torch.device(device).index or 0
            accelerator = f"{torch.cuda.get_device_name(index)} (CUDA {torch.version.cuda})"
        return cls(cpu=name or f"{platform.processor()} {platform.machine()}".strip(), flags=flags,
                   accelerator=accelerator, libraries=tuple((lib, _version(lib)) for lib in _LIBRARIES))

    def as_dict(self) -> dict[str, Any]:
        return {"cpu": self.cpu, "flags": list(self.flags), "accelerator": self.accelerator,
                "libraries": dict(self.libraries)}


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return ""


class VerdictMemory:
    """One verdict's place in the model cache: replayed when it is there, kept when it was measured.

    ``settings`` is everything of the job the verdict depends on (the model's
    revision, precision, gate, task, batching, threads: built by the task);
    ``recall_only``: a load that may only replay (:class:`VerdictMissing` when
    there is nothing to replay), such as a warm-up that has no sample to measure on.
    """

    def __init__(self, folder: Path, settings: dict[str, Any], *, machine: MachineIdentity,
                 recall_only: bool = False) -> None:
        material = {"format": _FORMAT, "settings": settings, "machine": machine.as_dict()}
        text = json.dumps(material, sort_keys=True, default=str)
        self.material = json.loads(text)  # as it reads back from the file: lists, not tuples
        self.key = hashlib.sha256(text.encode()).hexdigest()[:24]
        self.path = Path(folder) / f"{self.key}.json"
        self.recall_only = recall_only

    @classmethod
    def for_model(cls, model_dir: Path, settings: dict[str, Any], *, machine: MachineIdentity,
                  recall_only: bool = False) -> "VerdictMemory":
        """The verdict of the model in ``model_dir`` (its revision added to ``settings``), in its cache folder."""
        from pipeline.models.files import model_cache_folder
        from pipeline.models.loading import model_revision

        folder = model_cache_folder(Path(model_dir), VERDICT_FOLDER, "gate")
        return cls(folder, {"revision": model_revision(Path(model_dir)), **settings}, machine=machine,
                   recall_only=recall_only)

    def recall(self) -> dict[str, Any] | None:
        """The remembered record (``written``: its UTC time, ``checks``: the gate's checks in order), or None when
        there is none, or the file cannot be read or parsed, or holds another key's verdict."""
        try:
            record = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        if (not isinstance(record, dict) or record.get("material") != self.material
                or not isinstance(record.get("checks"), list) or not isinstance(record.get("written"), str)):
            return None
        try:
            dt.datetime.fromisoformat(record["written"])
        except ValueError:
            return None
        return record

    def recall_checks(self, requested: str, chain: list[str], gate: Any) -> list[Any] | None:
        """The remembered :class:`~pipeline.models.gate_checks.GateCheck` s, or None unless they are whole and are
        what measuring ``chain`` would have made: in its order up to its first kept precision (else up to fp32),
        each passed or failed by ``gate``'s thresholds, timed exactly when ``requested`` is auto."""
        from pipeline.models.gate_checks import GateCheck

        record = self.recall()
        if record is None:
            return None
        try:
            checks = [GateCheck.from_record(r, gate=gate, remembered=record["written"][:10]) for r in record["checks"]]
        except (TypeError, ValueError):
            return None
        measured_until = next((i + 1 for i, c in enumerate(checks) if c.kept), len(chain) - 1)
        if ([c.precision for c in checks] != chain[:measured_until]
                or any((c.speedup is not None) != (requested == "auto") for c in checks)):
            return None
        return checks

    def keep(self, checks: list[dict[str, Any]], precision: str) -> None:
        """Remember ``checks`` (and the precision they chose), written whole; an unwritable cache only costs
        the next load a measurement."""
        record = {"material": self.material, "key": self.key, "precision": precision, "checks": checks,
                  "written": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
                  "host": socket.gethostname()}
        from pipeline.models.files import write_whole

        try:
            write_whole(self.path, json.dumps(record, indent=1))
        except OSError:
            pass

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        """Held while this worker measures: the other workers on this host wait here, then replay what it kept.

        Where no lock file can be made (a read-only cache) each worker measures for itself.
        """
        from pipeline.models.files import file_lock

        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(file_lock(self.path.with_suffix(".lock")))
            except OSError:
                pass
            yield

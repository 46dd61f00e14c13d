"""INT8 encoders on ONNX Runtime: exported and quantised once per model revision, cached beside the model.

``model.precision: int8`` (with ``model.int8.backend: onnxruntime``, the
default) runs an encoder as an ONNX graph whose MatMul weights are int8, one
scale per output channel, activations quantised per batch by ONNX Runtime
(dynamic quantisation: its u8s8 kernels use AVX-512 VNNI where the CPU has
it). Layers whose dotted module name matches ``model.int8.skip_modules``
stay fp32: by default the FFN down-projection of each layer
(``layer.N.output.dense``), whose GELU inputs carry outliers that cost the
most accuracy.

Chosen by measuring (``make bench-precision``, docs/benchmarks_precision.md,
"Quantized encoders"): against static (calibrated QDQ) quantisation in ONNX
Runtime and OpenVINO, dynamic per-channel quantisation was as fast and as
accurate (mean cosine 0.9965 to fp32 on news and reviews) and needs no
calibration set, so the file depends on the weights only.

The file is made once per (model revision, task kind, int8 settings,
onnxruntime/onnx/torch versions): exported from the fp32 model already
loaded, quantised, and written whole (a temporary file renamed into place)
under ``<model folder>/.sbi-onnx/<key>/``, or, where the model folder is
not writable (a wheel in a read-only site-packages), under
``$SBI_CACHE_DIR/onnx/<key>/``. Workers that start together wait on one
file lock, so one of them exports and the others load its file. Each worker
then holds one :class:`OnnxEncoder` for its life (the per-worker model cache).
Imported lazily on executors.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator, Sequence

from pipeline.config import Int8Config

__all__ = ["CACHE_FOLDER", "OnnxEncoder", "int8_onnx_path", "load_int8_encoder", "matmul_module_names"]

# the folder beside the model's own files that holds its exported graphs
CACHE_FOLDER = ".sbi-onnx"
# bump when the export or the quantisation recipe changes: old files are then not reused
_RECIPE = "onnx-int8 v1"
_OUTPUT = {"embed": "last_hidden_state", "classify": "logits"}


class OnnxEncoder:
    """An exported encoder on ONNX Runtime, called like the transformers model it came from.

    ``encoder(input_ids=..., attention_mask=...)`` returns an object with the
    task's output (``last_hidden_state`` or ``logits``) as a CPU torch tensor,
    so the tasks' pooling and softmax code runs unchanged. ``config`` is the
    transformers config (label names), ``device`` is the CPU.
    """

    def __init__(self, path: Path, *, kind: str, config: Any, threads: int) -> None:
        import onnxruntime as ort
        import torch

        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, int(threads))
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.path = path
        self.kind = kind
        self.config = config
        self.device = torch.device("cpu")
        self._output = _OUTPUT[kind]

    def __call__(self, *, input_ids: Any, attention_mask: Any) -> Any:
        import numpy as np
        import torch

        feed = {"input_ids": np.ascontiguousarray(input_ids.numpy(), dtype=np.int64),
                "attention_mask": np.ascontiguousarray(attention_mask.numpy(), dtype=np.int64)}
        (out,) = self.session.run([self._output], feed)
        return SimpleNamespace(**{self._output: torch.from_numpy(out)})


def load_int8_encoder(model: Any, model_dir: Path, *, kind: str, int8: Int8Config, threads: int) -> OnnxEncoder:
    """The int8 :class:`OnnxEncoder` of ``model`` (the fp32 transformers model loaded from ``model_dir``).

    Exports and quantises on the first call for this revision and settings;
    later calls, in this process or any other, load the cached file.
    """
    path = int8_onnx_path(model, model_dir, kind=kind, int8=int8)
    return OnnxEncoder(path, kind=kind, config=model.config, threads=threads)


def int8_onnx_path(model: Any, model_dir: Path, *, kind: str, int8: Int8Config) -> Path:
    """The cached int8 graph of ``model`` for these settings, made now if it is not there yet."""
    if kind not in _OUTPUT:
        raise ValueError(f"int8 on onnxruntime is for the encoder kinds {sorted(_OUTPUT)}, not {kind!r}")
    key = _cache_key(model_dir, kind, int8)
    folder = _cache_folder(model_dir, key)
    target = folder / "model.int8.onnx"
    if target.is_file():
        return target
    from pipeline.models.files import file_lock

    folder.mkdir(parents=True, exist_ok=True)
    with file_lock(folder / ".lock"):
        if target.is_file():  # another worker made it while this one waited
            return target
        with tempfile.TemporaryDirectory(dir=folder, prefix=".export-") as tmp:
            fp32 = Path(tmp) / "model.fp32.onnx"
            export_onnx(model, fp32, kind=kind)
            quantised = Path(tmp) / target.name
            quantize_int8(fp32, quantised, int8)
            (folder / "settings.json").write_text(json.dumps(
                {"recipe": _RECIPE, "kind": kind, "int8": int8.model_dump(mode="json"), "key": key}, indent=1))
            os.replace(quantised, target)  # whole or absent
    return target


def export_onnx(model: Any, out: Path, *, kind: str) -> None:
    """``model`` (fp32, CPU) as an ONNX graph with dynamic batch and sequence axes (torch's TorchScript exporter)."""
    import torch

    class _Forward(torch.nn.Module):  # positional inputs, the one output the task reads
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            out = self.inner(input_ids=input_ids, attention_mask=attention_mask)
            return getattr(out, _OUTPUT[kind])

    name = _OUTPUT[kind]
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            name: {0: "batch", 1: "sequence"} if kind == "embed" else {0: "batch"}}
    ids = torch.ones((2, 8), dtype=torch.long)
    # The exporter puts the module it is given back in that module's own mode when it is done: a fresh
    # wrapper is in training mode, which would leave the fp32 model (the gate's fallback) with dropout on.
    wrapper = _Forward(model).eval()
    training = model.training
    try:
        with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
            warnings.simplefilter("ignore")  # the exporter announces its deprecation and traces with warnings
            torch.onnx.export(wrapper, (ids, torch.ones_like(ids)), str(out),
                              input_names=["input_ids", "attention_mask"], output_names=[name], dynamic_axes=axes,
                              opset_version=17, dynamo=False)
    finally:
        model.train(training)


def matmul_module_names(onnx_path: Path) -> dict[str, str]:
    """``{MatMul node name: dotted module name}`` of a graph torch exported (``/m/encoder/layer.0/output/dense/MatMul``
    -> ``encoder.layer.0.output.dense``), for the MatMuls that multiply by a weight (not attention's own)."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    weights = {init.name for init in graph.initializer}
    names = {}
    for node in graph.node:
        if node.op_type == "MatMul" and any(i in weights for i in node.input):
            parts = [p for p in node.name.split("/") if p][1:-1]  # drop the wrapper ("inner") and the op name
            names[node.name] = ".".join(parts)
    return names


def quantize_int8(fp32: Path, out: Path, int8: Int8Config) -> None:
    """Dynamic int8 quantisation of ``fp32``'s weight MatMuls (per channel unless configured per tensor).

    MatMuls whose module name matches a ``skip_modules`` pattern (``re.search``) stay fp32.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    modules = matmul_module_names(fp32)
    skipped = [node for node, module in modules.items() if _skipped(module, int8.skip_modules)]
    if len(skipped) == len(modules):
        raise ValueError(
            f"model.int8.skip_modules {int8.skip_modules} leaves no layer to quantise (the graph's layers: "
            f"{sorted(set(modules.values()))[:6]}...); skip fewer layers or use model.precision fp32"
        )
    with warnings.catch_warnings(), _quiet_logging():
        warnings.simplefilter("ignore")
        quantize_dynamic(
            str(fp32), str(out), weight_type=QuantType.QInt8, per_channel=int8.per_channel,
            op_types_to_quantize=["MatMul"], nodes_to_exclude=skipped,
            nodes_to_quantize=[n for n in modules if n not in skipped],
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )


def _skipped(module: str, patterns: Sequence[str]) -> bool:
    return any(re.search(p, module) for p in patterns)


def _cache_key(model_dir: Path, kind: str, int8: Int8Config) -> str:
    import onnx
    import onnxruntime
    import torch

    from pipeline.models.loading import model_revision

    what = json.dumps({"recipe": _RECIPE, "revision": model_revision(model_dir), "kind": kind,
                       "int8": int8.model_dump(mode="json"), "onnxruntime": onnxruntime.__version__,
                       "onnx": onnx.__version__, "torch": torch.__version__}, sort_keys=True)
    return hashlib.sha256(what.encode()).hexdigest()[:16]


def _cache_folder(model_dir: Path, key: str) -> Path:
    """``<model_dir>/.sbi-onnx/<key>`` when the model folder is writable, else the user's cache folder."""
    from pipeline.models.files import model_cache_folder

    return model_cache_folder(model_dir, CACHE_FOLDER, "onnx") / key


@contextlib.contextmanager
def _quiet_logging() -> Iterator[None]:
    """onnxruntime.quantization logs a line per skipped node on the root logger; keep the worker's stderr readable."""
    import logging

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)

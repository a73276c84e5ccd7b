"""The prompt embedder's speed against its accuracy (the target: predict <= 5 ms p50).

    python bench/bench_embedder.py [--repeat 200] [--json out.json]

Variants of all-MiniLM-L6-v2 through onnxruntime on one thread (casmoe/planner/embedding.py):

- `fp32`: the `onnx` backend (the reference here: it equals torch's to cosine 0.99999);
- `int8`: the `onnx-int8` backend (MatMul weights int8 per output channel), the default;
- `int8 per-tensor, all ops`: onnxruntime's plain `quantize_dynamic` (one scale per tensor,
  every op it can quantize), built here in a temporary folder: the obvious first try;
- `int8, 16 tokens`: `int8` with prompts truncated to 16 tokens (the model reads 256; the
  shipped traces' prompts have 12 tokens at the median, 27 at the 90th percentile).

For each: thread-CPU p50 of one prompt's embedding (interleaved, each call on a novel prompt:
a held-out prompt of the tiny traces with a counter suffix), the cosine of its vectors to
`fp32`'s over every prompt of the tiny traces and the held-out-domain traces (min, mean), and
what it does to a planner: one planner per variant and trace, fitted with that variant's
vectors on the trace's fit split (default config), scored by `evaluate` (recall@k of the
matcher, predictor, cascade and trajectory stage, and popularity) on the held-out split and
on the held-out-domain trace. Then `Planner.predict` p50 with the default (int8) planner.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from casmoe.planner import PlannerConfig, fit_planner, load_planner  # noqa: E402
from casmoe.planner import eam as eam_module  # noqa: E402
from casmoe.planner.embedding import OnnxEmbedder, embedder, int8_export, model_dir, onnx_export  # noqa: E402
from casmoe.planner.evaluate import evaluate  # noqa: E402
from casmoe.planner.planner import heldout_split  # noqa: E402
from casmoe.shipped import data_dir  # noqa: E402
from casmoe.trace import Trace  # noqa: E402
from casmoe.trace_io import load_trace  # noqa: E402

from bench_planner import p50_ms  # noqa: E402
from side_by_side import emit, load_average  # noqa: E402

TRACES = ("tiny-mixtral", "tiny-olmoe")
METHODS = ("eam", "eap", "cascade", "trajectory", "popularity")


def variants(tmp: Path) -> dict[str, OnnxEmbedder]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    naive = tmp / "naive-int8.onnx"
    quantize_dynamic(onnx_export(), naive, weight_type=QuantType.QInt8)
    short = OnnxEmbedder(int8_export())
    short.tokenizer.enable_truncation(max_length=16)
    return {
        "fp32": embedder("onnx"),
        "int8": embedder("onnx-int8"),
        "int8 per-tensor, all ops": OnnxEmbedder(naive),
        "int8, 16 tokens": short,
    }


def vectors(model: OnnxEmbedder, texts: list[str], batch: int = 64) -> np.ndarray:
    return np.concatenate([model.embed(texts[a : a + batch]) for a in range(0, len(texts), batch)])


def interleaved_p50(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Thread-CPU ms p50 per function, the calls alternated so load drifts hit all alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            c = time.thread_time()
            fn()
            times[k].append(time.thread_time() - c)
    return {k: float(np.median(v) * 1e3) for k, v in times.items()}


def planner_recall(model: OnnxEmbedder, trace: Trace, heldout: Trace, folder: Path) -> dict[str, Any]:
    """Fit with the variant's vectors and score; the matcher module's `embed` (through which
    the planner embeds) is this variant's for the duration."""
    original = eam_module.embed
    eam_module.embed = lambda texts, progress=False, backend=None, batch_size=64: vectors(model, list(texts))
    try:
        planner = fit_planner(trace, PlannerConfig())
        planner.save(folder)
        served = load_planner(folder)
        out = {}
        for name, tr in (("in-split held-out", trace), ("held-out domains", heldout)):
            scores = evaluate(served, tr).to_dict()
            out[name] = {m: round(scores[m]["recall_at_k"], 4) for m in METHODS}
        return out
    finally:
        eam_module.embed = original


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    traces = {n: load_trace(data_dir() / f"{n}.npz") for n in TRACES}
    heldouts = {n: load_trace(data_dir() / "eval" / f"{n}-heldout.npz") for n in TRACES}
    rec: dict[str, Any] = {"model": model_dir().name, "load_start": load_average()}
    with tempfile.TemporaryDirectory() as tmp:
        models = variants(Path(tmp))
        tests = [t.requests[i].prompt for t in traces.values() for i in heldout_split(t, PlannerConfig().holdout_every)[1]]
        counter = iter(range(10**9))
        rec["embed_cpu_p50_ms"] = interleaved_p50(
            {k: (lambda m=m: m.embed([f"{tests[next(counter) % len(tests)]} #{next(counter)}"])) for k, m in models.items()},
            args.repeat,
        )
        every = sorted({r.prompt for t in [*traces.values(), *heldouts.values()] for r in t.requests})
        ref = vectors(models["fp32"], every)
        rec["cosine_to_fp32"] = {}
        for k, m in models.items():
            cos = (vectors(m, every) * ref).sum(axis=1)
            rec["cosine_to_fp32"][k] = {"min": round(float(cos.min()), 5), "mean": round(float(cos.mean()), 5), "prompts": len(every)}
        rec["recall_at_k"] = {
            n: {k: planner_recall(m, traces[n], heldouts[n], Path(tmp) / f"{n}-{i}") for i, (k, m) in enumerate(models.items())}
            for n in TRACES
        }
        predict = {}
        for n, t in traces.items():
            folder = Path(tmp) / f"{n}-default"
            fit_planner(t, PlannerConfig()).save(folder)
            served = load_planner(folder)
            prompts = [t.requests[i].prompt for i in heldout_split(t, served.config.holdout_every)[1]]
            predict[n] = dict(zip(("wall", "cpu"), p50_ms(lambda: served.predict(f"{prompts[next(counter) % len(prompts)]} #{next(counter)}"))))
        rec["predict_p50_ms (default planner, int8)"] = predict
    rec["load_end"] = load_average()
    emit(rec, args.json)


if __name__ == "__main__":
    main()

"""Prompt embedding and planner prediction: onnxruntime against torch, side by side.

A planner is fitted on the shipped synthetic Mixtral trace (pinned: `traces/synthetic-mixtral.npz`
as committed with this script's results; `--planner DIR` uses a fitted one instead). Then, in
this process, one call of each in turn per round (interleaved), `--repeat` rounds, each call
on a prompt never seen before (a held-out prompt with a fresh suffix), thread-CPU time:

- `embed`: one prompt, onnx vs torch backend;
- `planner predict`: `Planner.predict` (embed + matcher query + gate + predictor), with each;
- `EAP`: the predictor alone (torch), the part of predict the embedder does not touch.

Memory, each backend in a fresh process: RSS growth when the embedder loads (after numpy and
the casmoe planner modules), and when the planner loads on top (its predictor, EAP, is a torch
model, so torch loads there if the embedder did not load it). First use: the ONNX export
into an empty cache, and loading it from the cache, also in fresh processes.

Run:  python bench/bench_embedding.py [--repeat 200] [--planner DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from side_by_side import in_fresh_process, load_average

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MEMORY = """
import json, os
def rss():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS:')).split()[1]) / 1024
import numpy
from casmoe.planner import load_planner
from casmoe.planner.embedding import embed, embedder
r0 = rss()
embedder('{backend}')
embed(['warm up'], backend='{backend}')
r1 = rss()
planner = load_planner('{planner}')
planner.predict('warm up the planner')
r2 = rss()
print(json.dumps({{'embedder': r1 - r0, 'planner': r2 - r1, 'total': r2 - r0, 'torch': 'torch' in __import__('sys').modules}}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--planner", type=Path, default=None)
    args = ap.parse_args()
    import torch

    from casmoe.planner import PlannerConfig, fit_planner, load_planner
    from casmoe.planner.embedding import embed
    from casmoe.planner.planner import heldout_split
    from casmoe.shipped import SYNTHETIC_TRACE, shipped
    from casmoe.trace_io import load_trace

    trace = load_trace(shipped(SYNTHETIC_TRACE))
    tmp = tempfile.TemporaryDirectory()
    folder = args.planner
    if folder is None:
        folder = Path(tmp.name) / "planner"
        fit_planner(trace, PlannerConfig(), progress=False).save(folder)
    planner = load_planner(folder)
    _, test = heldout_split(trace, planner.config.holdout_every)
    prompts = [trace.requests[i].prompt for i in test]
    torch.set_num_threads(1)
    counter = iter(range(10**9))

    def novel() -> str:
        i = next(counter)
        return f"{prompts[i % len(prompts)]} (variant {i})"

    def with_backend(backend: str, fn):
        def call():
            os.environ["CASMOE_EMBEDDER"] = backend  # planner.predict embeds through the default backend
            fn()
        return call

    calls = {
        "embed, onnx": with_backend("onnx", lambda: embed([novel()], backend="onnx")),
        "embed, torch": with_backend("torch", lambda: embed([novel()], backend="torch")),
        "planner predict, onnx embedder": with_backend("onnx", lambda: planner.predict(novel())),
        "planner predict, torch embedder": with_backend("torch", lambda: planner.predict(novel())),
        "EAP alone (torch)": lambda: planner.predictor.predict([novel()]),
    }
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(10):  # warm up every path
        for fn in calls.values():
            fn()
    for _ in range(args.repeat):
        for name, fn in calls.items():
            c = time.thread_time()
            fn()
            times[name].append(time.thread_time() - c)
    print(f"load average {load_average()}; {args.repeat} interleaved rounds, one thread, thread-CPU ms per call\n")
    print("| call (novel prompt) | p50 ms | min ms |")
    print("|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts) * 1e3:.2f} | {min(ts) * 1e3:.2f} |")
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"\nonnx / torch: embed {med['embed, onnx'] / med['embed, torch']:.2f}x, "
          f"planner predict {med['planner predict, onnx embedder'] / med['planner predict, torch embedder']:.2f}x "
          f"(goal: predict <= 10 ms)")

    print("\n| embedder | RSS growth: embedder loads | then the planner loads (EAP: torch) | planner with its embedder |")
    print("|---|---|---|---|")
    for backend in ("onnx", "torch"):
        m = json.loads(in_fresh_process(MEMORY.format(backend=backend, planner=folder)).splitlines()[-1])
        print(f"| {backend} | {m['embedder']:.0f} MiB | {m['planner']:.0f} MiB | {m['total']:.0f} MiB |")
    with tempfile.TemporaryDirectory() as cache:
        code = "import time; t = time.perf_counter(); from casmoe.planner.embedding import embedder; embedder('onnx'); print(time.perf_counter() - t)"
        export = float(in_fresh_process(code, {"CASMOE_CACHE": cache}).splitlines()[-1])
        load = float(in_fresh_process(code, {"CASMOE_CACHE": cache}).splitlines()[-1])
    code = "import time; t = time.perf_counter(); from casmoe.planner.embedding import embedder; embedder('torch'); print(time.perf_counter() - t)"
    torch_load = float(in_fresh_process(code).splitlines()[-1])
    print(f"\nfirst use (wall): onnx export into an empty cache {export:.1f} s, then loading it {load:.2f} s; torch model load {torch_load:.2f} s")
    tmp.cleanup()


if __name__ == "__main__":
    main()

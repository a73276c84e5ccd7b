"""Planner speed and footprint: fit time, predict latency on novel prompts,
and serving without torch.

    python bench/bench_planner_speed.py [--trace T ...] [--old] [--json out.json]

For each trace: `fit_planner` with the defaults (linear predictor, confidence gate, trajectory
stage) on the trace's fit split, timed (wall and process CPU seconds), then `Planner.predict`
on held-out prompts made novel by a counter suffix (embed + matcher + gate + predictor: wall
and thread-CPU p50 over 200 calls, and the embedding alone), planner state bytes. `--old` also
fits the seed's transformer predictor (the default before the ridge predictor, 30 epochs) back to back on
the same trace, so the two fit times are measured under the same machine load. Then, in a
fresh interpreter, a planner is loaded, predicts and serves a casmoe replay, and the script
reports whether torch was imported. Load average is recorded before and after each timing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from casmoe.planner import EAPConfig, PlannerConfig, fit_planner, load_planner  # noqa: E402
from casmoe.planner.planner import heldout_split  # noqa: E402
from casmoe.shipped import data_dir  # noqa: E402
from casmoe.trace_io import load_trace  # noqa: E402

from bench_planner import p50_ms  # noqa: E402  (one timing helper for the planner benches)

TRACES = ("tiny-mixtral.npz", "tiny-olmoe.npz")
TORCH_FREE = """
import sys
from casmoe.cache import Capacity
from casmoe.planner import load_planner
from casmoe.policies import get_policy
from casmoe.replay import replay
from casmoe.trace_io import load_trace
planner = load_planner(sys.argv[1])
planner.predict("a prompt it never saw")
trace = load_trace(sys.argv[2]).subset(range(5))
cache = get_policy("casmoe").create(trace.geometry, Capacity(2 * trace.geometry.top_k), trace=trace, planner=sys.argv[1])
replay(trace, cache)
print("torch" in sys.modules)
"""


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float, str]:
    """(result, wall s, process CPU s, load averages before -> after)."""
    before = os.getloadavg()[0]
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    return out, wall, cpu, f"{before:.1f} -> {os.getloadavg()[0]:.1f}"


def measure(path: Path, old: bool) -> dict[str, Any]:
    from casmoe.planner.embedding import backend_for, embed

    trace = load_trace(path)
    rec: dict[str, Any] = {"trace": path.name, "geometry": trace.geometry.describe()}
    planner, rec["fit_s"], rec["fit_cpu_s"], rec["fit_load"] = timed(lambda: fit_planner(trace, PlannerConfig()))
    if old:
        cfg = PlannerConfig(eap=EAPConfig(kind="transformer"))
        _, rec["old_fit_s"], rec["old_fit_cpu_s"], rec["old_fit_load"] = timed(lambda: fit_planner(trace, cfg))
    with tempfile.TemporaryDirectory() as tmp:
        planner.save(tmp)
        served = load_planner(tmp)
        _, test = heldout_split(trace, served.config.holdout_every)
        prompts = [trace.requests[i].prompt for i in test]
        counter = iter(range(10**9))
        novel = lambda: f"{prompts[next(counter) % len(prompts)]} #{next(counter)}"  # noqa: E731
        rec["predict_load"] = f"{os.getloadavg()[0]:.1f}"
        rec["predict_p50_ms"], rec["predict_cpu_p50_ms"] = p50_ms(lambda: served.predict(novel()))
        backend = backend_for(served.config.embedding)  # the embedder predict calls
        rec["embed_backend"] = backend
        rec["embed_p50_ms"], rec["embed_cpu_p50_ms"] = p50_ms(lambda: embed([novel()], backend=backend))
        rec["state_mib"] = sum(served.nbytes().values()) / 2**20
        res = subprocess.run([sys.executable, "-c", TORCH_FREE, tmp, str(path)], capture_output=True, text=True, check=True)
        rec["serving_imports_torch"] = res.stdout.strip().splitlines()[-1] == "True"
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", action="append", help="trace(s); default: the two shipped tiny traces")
    ap.add_argument("--old", action="store_true", help="also fit the seed's transformer predictor, back to back")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    paths = [Path(t) for t in args.trace] if args.trace else [data_dir() / n for n in TRACES]
    records = []
    for p in paths:
        records.append(measure(p, args.old))
        print(json.dumps(records[-1]), flush=True)
        if args.json:
            args.json.write_text(json.dumps(records, indent=2))


if __name__ == "__main__":
    main()

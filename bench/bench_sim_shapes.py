"""Simulator speed against replay's at real-model and tiny shapes, offline and serving.

Per trace, one cache (`--policy`, `--slots` per layer; the tiny shapes `--tiny-slots`) on
rtx4090x4 (one device), all timed in one process, interleaved (`side_by_side.interleaved`,
min CPU seconds of `--repeat` rounds), start-up excluded on every side: numba compiled or
loaded before timing, and the inputs each runtime starts from (replay's `StepArrays`, the
simulator's `TraceSteps`) built once, untimed. Rows:

- replay: `casmoe.replay.replay`, compiled (the count-only floor);
- simulate, offline: requests back to back (`simulate`, compiled decisions and timing);
- simulate, serving: the SimPy scheduler with one closed-loop user (the offline path's
  numbers, checked) and Poisson arrivals at `--rate` with continuous batching, reading the
  same `TraceSteps`'s batch-1 arrays (and once building its own, "no shared plan").

Speeds are routed accesses per CPU second (the trace's accesses at batch 1); the ratio column
is each row's speed over replay's on the same trace.

    python bench/bench_sim_shapes.py [--requests 200] [--repeat 3]
"""

from __future__ import annotations

import argparse

from side_by_side import interleaved, load_average

from casmoe.cache import Capacity
from casmoe.policies import get_policy
from casmoe.presets import get_preset
from casmoe.replay import replay
from casmoe.shipped import shipped
from casmoe.sim.passes.assembly import Run, TraceSteps
from casmoe.sim.passes.driver import run_trace
from casmoe.sim.cost.machine import Machine
from casmoe.sim.box.hardware import load_profile
from casmoe.sim.passes.traffic import Arrival, Traffic
from casmoe.step_arrays import StepArrays
from casmoe.trace_io import load_trace

SHAPES = [("synthetic-qwen3.npz", "qwen3-30b-a3b"), ("tiny-mixtral.npz", "mixtral-8x7b"), ("tiny-olmoe.npz", "olmoe-1b-7b")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200, help="first N requests of each trace")
    ap.add_argument("--policy", default="lru")
    ap.add_argument("--slots", type=int, default=12, help="slots per layer at the Qwen3 shape")
    ap.add_argument("--tiny-slots", type=int, default=0, help="slots per layer at the tiny shapes; 0: twice top_k")
    ap.add_argument("--rate", type=float, default=0.5, help="Poisson arrivals, requests/s")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    hw, cls = load_profile("rtx4090x4"), get_policy(args.policy)
    print(f"load average {load_average()}; {args.policy}; min CPU of {args.repeat} interleaved rounds")
    print("\n| trace | run | CPU s | M accesses/s | vs replay |")
    print("|---|---|---|---|---|")
    for name, model in SHAPES:
        trace = load_trace(shipped(name))
        trace = trace.subset(range(min(args.requests, len(trace.requests))))
        preset = get_preset(model)
        cap = Capacity(args.slots if "qwen" in name else args.tiny_slots or 2 * trace.geometry.top_k)
        arrays, plan = StepArrays.from_trace(trace), TraceSteps.build(trace, 1, 1)
        fns = {
            "replay (compiled)": lambda: replay(trace, cls.create(trace.geometry, cap, trace=trace), arrays=arrays, compiled=True),
            "simulate, offline": lambda: run_trace(Run(trace, cls, cap, Machine(preset, hw)), plan=plan, compiled=True),
            "simulate, serving, 1 closed-loop user": lambda: run_trace(Run(trace, cls, cap, Machine(preset, hw), traffic=Traffic(Arrival.CLOSED, max_batch=1)), compiled=True, plan=plan),
            f"simulate, serving, poisson {args.rate:g}/s, max batch 8": lambda: run_trace(Run(trace, cls, cap, Machine(preset, hw), traffic=Traffic(Arrival.POISSON, rate=args.rate)), compiled=True, plan=plan),
            f"simulate, serving, poisson {args.rate:g}/s, max batch 8, no shared plan": lambda: run_trace(Run(trace, cls, cap, Machine(preset, hw), traffic=Traffic(Arrival.POISSON, rate=args.rate)), compiled=True),
        }
        for fn in fns.values():  # numba: compile or load from its cache, untimed
            fn()
        res = interleaved(fns, args.repeat)
        offline, closed = (res[k][1].to_dict() for k in list(fns)[1:3])
        skip = ("traffic", "queue_length", "future_runs")
        assert {k: v for k, v in offline.items() if k not in skip} == {k: v for k, v in closed.items() if k not in skip}
        n = arrays.accesses
        base = res["replay (compiled)"][0]
        for run, (t, _) in res.items():
            print(f"| {name} ({n / 1e6:.2f} M accesses) | {run} | {t:.3f} | {n / t / 1e6:.2f} | {base / t:.2f}x |", flush=True)


if __name__ == "__main__":
    main()

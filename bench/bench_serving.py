"""Serving simulator speed: simulated decode tokens per CPU second, offline and under load.

Mixtral-8x7B shape on the first `--requests` requests of the shipped synthetic trace, `lru`
with 4 slots per layer on rtx4090x4 (one device), all timed interleaved in one process
(`side_by_side.interleaved`): the offline fast path (Python decision pass, with and without the
per-layer timeliness figures), the same run through the SimPy serving path with one
closed-loop user (identical results, checked), and Poisson arrivals at several rates with
continuous batching (`--max-batch`). A run at a higher rate batches more tokens per step, so
it simulates more tokens per CPU second.

    python bench/bench_serving.py [--requests 60] [--rates 0.02,0.05,0.2] [--repeat 3]
"""

from __future__ import annotations

import argparse

from side_by_side import interleaved, load_average

from casmoe.cache import Capacity
from casmoe.policies import get_policy
from casmoe.presets import get_preset
from casmoe.shipped import SYNTHETIC_TRACE, shipped
from casmoe.sim.passes.assembly import Run, TraceSteps
from casmoe.sim.passes.driver import run_trace
from casmoe.sim.cost.machine import Machine
from casmoe.sim.box.hardware import load_profile
from casmoe.sim.passes.traffic import Arrival, Traffic
from casmoe.trace_io import load_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--policy", default="lru")
    ap.add_argument("--capacity", type=int, default=4)
    ap.add_argument("--rates", default="0.02,0.05,0.2", help="Poisson rates, requests/s")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    trace = load_trace(shipped(SYNTHETIC_TRACE)).subset(range(args.requests))
    preset, hw = get_preset("mixtral-8x7b"), load_profile("rtx4090x4")
    cls, cap = get_policy(args.policy), Capacity(args.capacity)
    plan = TraceSteps.build(trace, 1, 1)
    run = lambda **kw: run_trace(Run(trace, cls, cap, Machine(preset, hw, devices=1)), compiled=False, **kw)  # noqa: E731
    fns = {
        "offline fast path (Python decision pass)": lambda: run(plan=plan),
        "offline fast path, no timeliness figures": lambda: run(plan=plan, detail=False),
        "serving path, 1 closed-loop user (SimPy)": lambda: run(traffic=Traffic(Arrival.CLOSED, max_batch=1)),
    }
    for rate in (float(x) for x in args.rates.split(",")):
        wl = Traffic(Arrival.POISSON, rate=rate, max_batch=args.max_batch)
        fns[f"serving path, poisson {rate:g}/s, max batch {args.max_batch}"] = lambda wl=wl: run(traffic=wl)
    res = interleaved(fns, args.repeat)
    offline, closed = (res[k][1].to_dict() for k in list(fns)[:3:2])
    same = {k: v for k, v in offline.items() if k not in ("traffic", "queue_length", "future_runs")} == {
        k: v for k, v in closed.items() if k not in ("traffic", "queue_length", "future_runs")
    }
    decode = res[list(fns)[0]][1].decode_tokens
    print(f"{len(trace.requests)} requests, {decode} decode tokens, {args.policy} {cap.describe()}, rtx4090x4 x1")
    print(f"load average {load_average()}; min CPU of {args.repeat} interleaved rounds; "
          f"closed loop == offline: {same}")
    print("\n| run | CPU s | decode tokens/s | mean batch | TTFT p99 | TPOT p50 |")
    print("|---|---|---|---|---|---|")
    for name, (t, r) in res.items():
        print(f"| {name} | {t:.3f} | {decode / t:,.0f} | {r.mean_batch:.2f} | {r.ttft_p99_s:.3g} s | {r.tpot_p50_s:.3g} s |")


if __name__ == "__main__":
    main()

"""Replay speed of the field's policies with compiled twins: Python path vs twin.

Input: a shipped trace (default `traces/tiny-olmoe.npz`, its first `--requests`), batch 1.
Pairs, in this process, interleaved, minimum CPU time of `--repeat` rounds, identical counts
asserted: `least-stale` on one pool shared by the layers (`--global-capacity`, default 2 x top_k
x layers) and `speculative` (its default `ahead=1`) at `--capacity` slots per layer. The Step
lists and StepArrays are built once, untimed; the first compiled call (numba's cache) is untimed.

A placement evicts nothing (`--placement-trace`, `n-cpu-moe` at `--placement-capacity`): its
Python replay is timed once beside `lru` compiled on the same trace, for scale.

Run:  python bench/bench_field_twins.py [--requests 200] [--repeat 2]
"""

from __future__ import annotations

import argparse
import time

from casmoe.cache import Capacity
from casmoe.policies import POLICIES
from casmoe.replay import replay
from casmoe.step_arrays import StepArrays
from casmoe.trace_io import load_trace
from side_by_side import interleaved, load_average


def runner(name: str, trace, cap: Capacity, steps, arrays, compiled: bool):
    def go():
        cache = POLICIES[name].create(trace.geometry, cap, trace=trace)
        return replay(trace, cache, steps=None if compiled else steps, arrays=arrays if compiled else None,
                      compiled=compiled).stats
    return go


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="traces/tiny-olmoe.npz")
    ap.add_argument("--requests", type=int, default=200, help="the trace's first N requests (0: all)")
    ap.add_argument("--global-capacity", type=int, default=0, help="least-stale's shared pool (0: 2 x top_k x layers)")
    ap.add_argument("--capacity", type=int, default=16, help="speculative's slots per layer")
    ap.add_argument("--placement-trace", default="traces/synthetic-qwen3.npz")
    ap.add_argument("--placement-capacity", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    trace = load_trace(args.trace)
    if args.requests:
        trace = trace.subset(range(min(args.requests, len(trace.requests))))
    g = trace.geometry
    steps, arrays = trace.steps(), StepArrays.from_trace(trace)
    n = arrays.accesses
    shared = Capacity(args.global_capacity or 2 * g.top_k * g.layers, per_layer=False)
    per_layer = Capacity(args.capacity)
    print(f"{args.trace}: {len(trace.requests)} requests, {trace.tokens} tokens, {n} routed accesses, "
          f"{g.describe()}; load average {load_average()}", flush=True)
    pairs = {"least-stale": shared, "speculative": per_layer}
    for name, cap in pairs.items():
        runner(name, trace, cap, steps, arrays, True)()  # numba: load its cache, untimed
    res = interleaved({f"{name} {path} ({cap.describe()})": runner(name, trace, cap, steps, arrays, path == "compiled")
                       for name, cap in pairs.items() for path in ("python", "compiled")}, args.repeat)
    print("\n| run | CPU s (min) | M accesses/s |")
    print("|---|---|---|")
    for what, (t, _) in res.items():
        print(f"| {what} | {t:.2f} | {n / t / 1e6:.2f} |")
    for name, cap in pairs.items():
        py, co = (res[f"{name} {path} ({cap.describe()})"] for path in ("python", "compiled"))
        assert py[1] == co[1], f"{name}: the twin's counts differ"
        print(f"{name}: compiled {py[0] / co[0]:.1f}x the Python path, hit rate {co[1].hit_rate:.4f}, "
              f"{co[1].evictions} evictions, {co[1].prefetch_loads} prefetches")

    place = load_trace(args.placement_trace)
    pa = StepArrays.from_trace(place)
    cap = Capacity(args.placement_capacity)
    t0 = time.process_time()
    stats = replay(place, POLICIES["n-cpu-moe"].create(place.geometry, cap, trace=place)).stats
    t_place = time.process_time() - t0
    runner("lru", place, cap, None, pa, True)()
    t0 = time.process_time()
    lru = runner("lru", place, cap, None, pa, True)()
    t_lru = time.process_time() - t0
    print(f"\n{args.placement_trace} ({pa.accesses} accesses), {cap.describe()}: n-cpu-moe Python {t_place:.2f} s CPU "
          f"({pa.accesses / t_place / 1e6:.2f} M accesses/s, {stats.evictions} evictions, {stats.cpu_computed} host-computed); "
          f"lru compiled {t_lru:.2f} s ({lru.evictions} evictions); load average {load_average()}")


if __name__ == "__main__":
    main()

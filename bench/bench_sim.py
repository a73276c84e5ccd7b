"""Simulator speed: simulated decode tokens per second of CPU time on one core.

Mixtral-8x7B shape (32 layers, 8 experts, top-2) from the shipped synthetic trace, `lru`,
one device and four. For scale it also times the count-only replay of the same cache (the
floor: the cache's own work) and profiles one run to show where the time goes, grouped by
module (cache and policy / simulator / SimPy / other).

    python bench/bench_sim.py [--requests 60] [--capacity 4] [--repeat 3]

Times are process CPU seconds (best of --repeat), so other load on the machine inflates them
less than wall time would.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections import defaultdict

from casmoe.cache import Capacity
from casmoe.policies import get_policy
from casmoe.presets import get_preset
from casmoe.replay import replay
from casmoe.shipped import SYNTHETIC_TRACE, shipped
from casmoe.sim.engine import StepPlan, simulate
from casmoe.sim.hardware import load_profile
from casmoe.trace import Trace


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def group(filename: str) -> str:
    if "/casmoe/cache.py" in filename or "/casmoe/policies/" in filename:
        return "cache + policy"
    if "/sim/" in filename:
        return "simulator (sim/)"
    if "simpy" in filename:
        return "SimPy"
    return "other (builtins, numpy, ...)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--capacity", type=int, default=4)
    ap.add_argument("--policy", default="lru")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    trace = Trace.load(shipped(SYNTHETIC_TRACE)).subset(range(args.requests))
    preset = get_preset("mixtral-8x7b")
    hw = load_profile("rtx4090x4")
    cls = get_policy(args.policy)
    cap = Capacity(args.capacity)
    steps = trace.steps()
    decode = sum(1 for s in steps if not s.prefill)
    print(f"trace: {len(trace.requests)} requests, {len(steps)} steps ({decode} decode tokens), {args.policy} {cap.describe()}")

    rows = []
    t_replay = best(lambda: replay(trace, cls.create(trace.geometry, cap, trace=trace), steps=steps), args.repeat)
    rows.append(("replay (counts only, same cache)", t_replay))
    for devices in (1, 4):
        plan = StepPlan.build(trace, 1, devices)
        t = best(lambda: simulate(trace, cls, cap, hw, preset, devices=devices, plan=plan), args.repeat)
        rows.append((f"simulate, {devices} device{'s' if devices > 1 else ''}", t))
    print("\n| runtime | CPU s | steps/s | decode tokens/s |")
    print("|---|---|---|---|")
    for name, t in rows:
        print(f"| {name} | {t:.3f} | {len(steps) / t:,.0f} | {decode / t:,.0f} |")

    plan = StepPlan.build(trace, 1, 1)
    prof = cProfile.Profile()
    prof.enable()
    simulate(trace, cls, cap, hw, preset, devices=1, plan=plan)
    prof.disable()
    stats = pstats.Stats(prof)
    by_group: dict[str, float] = defaultdict(float)
    total = 0.0
    for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        by_group[group(filename)] += tottime
        total += tottime
    print("\n| where the time goes (cProfile, 1 device) | share |")
    print("|---|---|")
    for name, t in sorted(by_group.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {100 * t / total:.0f}% |")
    print("\ntop functions by own time:")
    stats.sort_stats("tottime").print_stats(8)


if __name__ == "__main__":
    main()

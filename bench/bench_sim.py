"""Simulator speed: simulated decode tokens per second of CPU time on one core.

Mixtral-8x7B shape (32 layers, 8 experts, top-2) from the shipped synthetic trace, `lru`,
one device and four. For scale it also times the count-only replay of the same cache (the
floor: the cache's own work) and profiles one run to show where the time goes, grouped by
module (cache and policy / simulator / SimPy / other).

    python bench/bench_sim.py [--requests 60] [--capacity 4] [--repeat 3]

Times are process CPU seconds, each run interleaved with the others in one process, minimum of
--repeat rounds (other load on the machine inflates CPU time less than wall time, and alike for
both sides of a ratio). The simulator runs with the compiled decision pass (the built-in
policy's twin, as `simulate` picks by default for runs this long) and with the Python one.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from collections import defaultdict

from casmoe.cache import Capacity
from casmoe.policies import get_policy
from casmoe.presets import get_preset
from casmoe.replay import replay
from casmoe.shipped import SYNTHETIC_TRACE, shipped
from casmoe.sim.passes.assembly import Run, TraceSteps
from casmoe.sim.passes.driver import run_trace
from casmoe.sim.cost.machine import Machine
from casmoe.sim.box.hardware import load_profile
from casmoe.trace_io import load_trace
from side_by_side import interleaved, load_average


def group(filename: str) -> str:
    if "/casmoe/cache.py" in filename or "/casmoe/policies/" in filename:
        return "cache + policy"
    if "/sim/" in filename:
        return "simulator (casmoe/sim/)"
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

    trace = load_trace(shipped(SYNTHETIC_TRACE)).subset(range(args.requests))
    preset = get_preset("mixtral-8x7b")
    hw = load_profile("rtx4090x4")
    cls = get_policy(args.policy)
    cap = Capacity(args.capacity)
    steps = trace.steps()
    decode = sum(1 for s in steps if not s.prefill)
    print(f"trace: {len(trace.requests)} requests, {len(steps)} steps ({decode} decode tokens), {args.policy} {cap.describe()}")

    plans = {devices: TraceSteps.build(trace, 1, devices) for devices in (1, 4)}
    fns = {
        "replay (counts only, same cache, compiled)": lambda: replay(trace, cls.create(trace.geometry, cap, trace=trace), steps=steps),
        "replay, Python": lambda: replay(trace, cls.create(trace.geometry, cap, trace=trace), steps=steps, compiled=False),
    }
    for devices, plan in plans.items():
        for compiled in (True, False):
            name = f"simulate, {devices} device{'s' if devices > 1 else ''}, {'compiled' if compiled else 'Python'} decision pass"
            fns[name] = lambda plan=plan, devices=devices, compiled=compiled: run_trace(Run(trace, cls, cap, Machine(preset, hw, devices=devices)), plan=plan, compiled=compiled)
    for fn in fns.values():  # numba: compile or load from its cache, untimed
        fn()
    res = interleaved(fns, args.repeat)
    print(f"load average {load_average()}; min CPU of {args.repeat} interleaved rounds")
    print("\n| runtime | CPU s | steps/s | decode tokens/s |")
    print("|---|---|---|---|")
    for name, (t, _) in res.items():
        print(f"| {name} | {t:.3f} | {len(steps) / t:,.0f} | {decode / t:,.0f} |")
    for devices in (1, 4):
        fast = res[f"simulate, {devices} device{'s' if devices > 1 else ''}, compiled decision pass"]
        slow = res[f"simulate, {devices} device{'s' if devices > 1 else ''}, Python decision pass"]
        assert fast[1].to_dict() == slow[1].to_dict()
        print(f"\n{devices} device(s): compiled / Python decision pass = {fast[0] / slow[0]:.2f}x the time; "
              f"{decode / fast[0]:,.0f} decode tokens/s (goal >= 20,000 at batch 1, one core)")

    plan = TraceSteps.build(trace, 1, 1)
    prof = cProfile.Profile()
    prof.enable()
    run_trace(Run(trace, cls, cap, Machine(preset, hw, devices=1)), plan=plan)
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

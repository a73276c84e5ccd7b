"""Replay speed: routed accesses per second for `lru` and `belady` on a Mixtral-shaped trace.

    python bench/bench_replay.py [--tokens 100000]

Times CPU seconds of this process (time.process_time), so a busy machine inflates the figures
less than wall time would. Building the step list is timed separately: runtimes build it once
and share it between policies.
"""

from __future__ import annotations

import argparse
import platform
import time

from casmoe.geometry import Geometry
from casmoe.policies import POLICIES
from casmoe.replay import replay
from casmoe.synthetic import SynthConfig, generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--capacity", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="best of N (the machine is shared)")
    args = ap.parse_args()
    g = Geometry(32, 8, 2, hidden=4096, intermediate=14336)
    per_request = 200
    trace = generate(g, SynthConfig(requests=args.tokens // per_request, prefill=(1, 1), decode=(per_request - 1, per_request - 1)))
    t0 = time.process_time()
    steps = trace.steps()
    build = time.process_time() - t0
    accesses = sum(len(e) for s in steps for e in s.experts)
    print(f"python {platform.python_version()}, trace: {trace.tokens} tokens, {accesses} routed accesses")
    print(f"step list: {build:.2f} s CPU ({accesses / build / 1e6:.2f} M accesses/s)")
    for name in ("lru", "belady"):
        times = []
        for _ in range(args.repeat):
            cache = POLICIES[name].create(g, args.capacity, trace=trace)
            t0 = time.process_time()
            stats = replay(trace, cache, steps=steps).stats
            times.append(time.process_time() - t0)
        dt = min(times)
        print(f"{name}: {dt:.2f} s CPU (best of {args.repeat}), {stats.accesses / dt / 1e6:.2f} M accesses/s, hit rate {stats.hit_rate:.3f}")


if __name__ == "__main__":
    main()

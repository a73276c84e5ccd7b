"""Replay speed: the compiled twins against the Python policies and a bare-loop floor.

Input (pinned: generated, not read from a shipped trace): a Mixtral-shaped synthetic trace
(32 layers x 8 experts, top-2; `casmoe.synthetic` seed 0), `--tokens` tokens in requests of
1 prompt token + 199 decoded, `--capacity` slots per layer. Pairs, each run in this process,
interleaved, minimum CPU time of `--repeat` rounds, with identical counts asserted:

- `lru` compiled (`casmoe.replay`, its twin) vs the floor: a bare per-layer `OrderedDict` LRU
  over the same step lists (in routing order; a miss evicts the least recent expert the step
  does not use: the same hits as casmoe's `lru`), no events, no counters beyond hits;
- `lru` and `belady` compiled vs the same policies on the Python path (`compiled=False`).

The inputs each path starts from are built once, outside the timing, and timed separately:
the `Step` lists (`Trace.steps`, what the Python paths walk) and the `StepArrays`. The first
compiled replay in a new process (numba compile, or loading its cache) is measured apart.

Run:  python bench/bench_replay.py [--tokens 100000] [--capacity 4] [--repeat 3]
"""

from __future__ import annotations

import argparse
import platform
import time

from casmoe.cache import Capacity
from casmoe.geometry import Geometry
from casmoe.policies import POLICIES
from casmoe.replay import replay
from casmoe.step_arrays import StepArrays
from casmoe.synthetic import SynthConfig, generate
from casmoe.testing import textbook_lru_hits
from casmoe.trace import Step
from side_by_side import first_call_seconds, interleaved, load_average


def bare_lru_hits(steps: list[Step], layers: int, capacity: int) -> int:
    """The floor: the textbook OrderedDict LRU of each layer's pool, nothing but the hit count."""
    return sum(textbook_lru_hits([step.experts[layer] for step in steps], capacity) for layer in range(layers))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--capacity", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the minimum counts")
    args = ap.parse_args()
    g = Geometry(32, 8, 2, hidden=4096, intermediate=14336)
    per_request = 200
    trace = generate(g, SynthConfig(requests=args.tokens // per_request, prefill=(1, 1), decode=(per_request - 1, per_request - 1)))
    cap = Capacity(args.capacity)
    t0 = time.process_time()
    steps = trace.steps()
    t_steps = time.process_time() - t0
    t0 = time.process_time()
    arrays = StepArrays.from_trace(trace)
    t_arrays = time.process_time() - t0
    n = arrays.accesses
    print(f"python {platform.python_version()}, trace: {trace.tokens} tokens, {n} routed accesses, "
          f"{cap.describe()}; load average {load_average()}")
    print(f"inputs, built once: Step lists {t_steps:.2f} s CPU, StepArrays {t_arrays:.3f} s CPU", flush=True)

    def run(name: str, compiled: bool):
        def go():
            cache = POLICIES[name].create(g, cap, trace=trace)
            return replay(trace, cache, steps=None if compiled else steps, arrays=arrays if compiled else None, compiled=compiled).stats
        return go

    run("lru", True)(), run("belady", True)()  # numba: compile or load from its cache, untimed
    res = interleaved(
        {
            "lru compiled": run("lru", True),
            "bare OrderedDict LRU": lambda: bare_lru_hits(steps, g.layers, cap.slots),
            "lru python": run("lru", False),
            "belady compiled": run("belady", True),
            "belady python": run("belady", False),
        },
        args.repeat,
    )
    assert res["lru compiled"][1] == res["lru python"][1] and res["belady compiled"][1] == res["belady python"][1]
    assert res["lru compiled"][1].hits == res["bare OrderedDict LRU"][1], "the floor must make the same decisions"
    print("\n| what | CPU s (min) | M accesses/s |")
    print("|---|---|---|")
    for name, (t, _) in res.items():
        print(f"| {name} | {t:.3f} | {n / t / 1e6:.2f} |")
    rate = lambda name: n / res[name][0]  # noqa: E731
    print(f"\nlru compiled / bare floor: {rate('lru compiled') / rate('bare OrderedDict LRU'):.2f}x the floor's speed (goal >= 0.5x)")
    print(f"lru compiled / python: {rate('lru compiled') / rate('lru python'):.1f}x; belady compiled / python: "
          f"{rate('belady compiled') / rate('belady python'):.1f}x; hit rates lru {res['lru compiled'][1].hit_rate:.3f}, "
          f"belady {res['belady compiled'][1].hit_rate:.3f}")
    setup = (
        "from casmoe.geometry import Geometry\nfrom casmoe.policies import POLICIES\nfrom casmoe.replay import replay\n"
        "from casmoe.synthetic import SynthConfig, generate\n"
        "g = Geometry(4, 8, 2)\ntrace = generate(g, SynthConfig(requests=2, prefill=(1, 1), decode=(9, 9)))"
    )
    cold, warm = first_call_seconds(setup, "replay(trace, POLICIES['lru'].create(g, 4, trace=trace), compiled=True)")
    print(f"\nfirst compiled replay in a new process (import of numba included): {cold:.1f} s with an empty "
          f"numba cache (compile), {warm:.2f} s from the cache")


if __name__ == "__main__":
    main()

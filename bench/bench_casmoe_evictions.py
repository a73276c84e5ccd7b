"""Where casmoe's hit rate goes on an unseen task, against LFU: a data look.

    python bench/bench_casmoe_evictions.py --trace traces/tiny-olmoe.npz --task code [--planner DIR] [--json out.json]

Fits the `loto:TASK` planner of `casmoe planner bench` (the fit split less TASK, default config;
`--planner` takes one that bench wrote instead)
and replays TASK's requests as one stream at 2k slots per layer with LRU, LFU, Belady (the
ceiling of any eviction; an oracle), casmoe and casmoe with `prefill_prefetch=False`. For
each: hit rate, demand and prefetch loads (used / wasted), and, for every eviction, how soon
the evicted expert is routed again (runtime steps to its next use in the stream: a victim
reused within a few steps was a bad choice; one never reused a free one), and the hit rate of
the first 10 requests (the stream's cold start, where LFU has no counts yet), and the hit
rate of decode accesses alone (the simulator's decode tokens/s depends on those; the replay's
hit rate also counts every prefill access).
"""

from __future__ import annotations

import argparse
import bisect
import os
import tempfile
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from casmoe.cache import Capacity  # noqa: E402
from casmoe.planner import PlannerConfig, fit_planner  # noqa: E402
from casmoe.planner.planner import heldout_split  # noqa: E402
from casmoe.policies import get_policy  # noqa: E402
from casmoe.replay import replay  # noqa: E402
from casmoe.trace import Trace  # noqa: E402
from casmoe.trace_io import load_trace  # noqa: E402

from side_by_side import emit, load_average  # noqa: E402

COLD = 10


def next_uses(trace: Trace) -> tuple[list[Any], dict[int, list[int]]]:
    steps = trace.steps(1)
    used: dict[int, list[int]] = defaultdict(list)
    for s, step in enumerate(steps):
        for experts in step.experts:
            for e in experts:
                used[int(e)].append(s)
    return steps, used


def run(trace: Trace, name: str, cap: Capacity, opts: dict[str, Any], used: dict[int, list[int]], steps: list[Any]) -> dict[str, Any]:
    cache = get_policy(name).create(trace.geometry, cap, trace=trace, **opts)
    gaps: list[float] = []
    victim, step_of = cache.victim, {"s": 0}
    before = cache.before_layer

    def logged_before(step: int, layer: int):  # the replay calls it per layer when per-layer prefetch is on
        step_of["s"] = step
        return before(step, layer)

    route = cache.route
    decode = {"accesses": 0, "hits": 0}

    def logged_route(step: int, layer: int, experts, scores=None):
        step_of["s"] = step
        acc = route(step, layer, experts, scores)
        if not steps[step].prefill:
            decode["accesses"] += len(experts)
            decode["hits"] += acc.hits + len(acc.late)
        return acc

    def logged_victim(layer: int, candidates):
        v = victim(layer, candidates)
        uses = used.get(int(v), [])
        i = bisect.bisect_right(uses, step_of["s"])
        gaps.append(uses[i] - step_of["s"] if i < len(uses) else np.inf)
        return v

    cache.victim, cache.route, cache.before_layer = logged_victim, logged_route, logged_before
    stats = replay(trace, cache, compiled=False).stats
    g = np.array(gaps)
    cold = get_policy(name).create(trace.geometry, cap, trace=trace, **opts)
    cold_hit = replay(trace.subset(range(min(COLD, len(trace.requests)))), cold, compiled=False).stats
    return {
        "hit_rate": round(stats.hit_rate, 4),
        "decode hit rate": round(decode["hits"] / max(decode["accesses"], 1), 4),
        "demand_loads": stats.demand_loads, "prefetch_loads": stats.prefetch_loads,
        "prefetch_used": stats.prefetch_used, "prefetch_wasted": stats.prefetch_wasted, "evictions": len(g),
        "victims reused within 1 / 8 / 32 steps": [round(float(np.mean(g <= k)), 3) for k in (1, 8, 32)] if len(g) else [],
        "victims never reused": round(float(np.mean(np.isinf(g))), 3) if len(g) else 0.0,
        f"hit rate, first {COLD} requests": round(cold_hit.hit_rate, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--task", required=True)
    ap.add_argument("--planner", type=Path, help="a loto:TASK planner folder to use instead of fitting one")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    trace = load_trace(args.trace)
    fit, _ = heldout_split(trace, 5)
    part = trace.subset([i for i in fit if trace.requests[i].task != args.task])
    scored = trace.subset([i for i, r in enumerate(trace.requests) if r.task == args.task])
    cap = Capacity(2 * trace.geometry.top_k)
    rec: dict[str, Any] = {"trace": args.trace.name, "task": args.task, "scored_requests": len(scored.requests), "load_start": load_average()}
    steps, used = next_uses(scored)
    with tempfile.TemporaryDirectory() as tmp:
        if args.planner is None:
            fit_planner(part, replace(PlannerConfig(), holdout_every=0)).save(tmp)
        else:
            tmp = str(args.planner)
        runs = {
            "lru": ("lru", {}), "lfu": ("lfu", {}), "belady*": ("belady", {}),
            "casmoe": ("casmoe", {"planner": tmp}), "casmoe, no top-up": ("casmoe", {"planner": tmp, "prefill_prefetch": False}),
        }
        rec["policies"] = {label: run(scored, name, cap, opts, used, steps) for label, (name, opts) in runs.items()}
    rec["load_end"] = load_average()
    emit(rec, args.json)


if __name__ == "__main__":
    main()

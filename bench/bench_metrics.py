"""How long SRP and SCH take on one 512-token sequence of a Qwen3-30B-A3B-shaped trace.

48 MoE layers x 128 experts, top-8, synthetic (casmoe.synthetic: Zipf popularity, sticky
routing), one request of 512 tokens (all tokens measured, as moe-lrc does). Times are CPU
seconds of this process (`time.process_time`, so other load on a shared machine inflates
them less than wall time would), best of `--repeat`:

- SRP for m in `--m` (the four moe-lrc lengths by default), histograms and the best F1, model
  level and per layer, no bootstrap;
- model-level SCH: the full hit curve over C = 1..6144 for one m (`--sch-m`, default 16);
- per-layer SCH: 48 curves over C = 1..128, all layers in lockstep, same m.

Run:  python bench/bench_metrics.py [--repeat 3] [--m 4,16,64,256] [--sch-m 16]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from casmoe.geometry import Geometry
from casmoe.metrics.sch import lookahead_hits
from casmoe.metrics.srp import segment_stats, srp_from_hist
from casmoe.metrics.tokens import sequences
from casmoe.synthetic import SynthConfig, generate


def best_of(repeat: int, fn) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.process_time()
        out = fn()
        times.append(time.process_time() - t0)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--m", default="4,16,64,256")
    ap.add_argument("--sch-m", type=int, default=16)
    args = ap.parse_args()
    ms = [int(x) for x in args.m.split(",")]
    g = Geometry(layers=48, experts=128, top_k=8)
    trace = generate(g, SynthConfig(requests=1, prefill=(128, 128), decode=(384, 384), seed=1))
    (seq,) = sequences(trace)
    L, E, k = g.layers, g.experts, g.top_k
    T = len(seq)
    print(f"trace: {T} tokens x {L} layers x top-{k} of {E} experts = {T * L * k} accesses")

    def srp():
        return [srp_from_hist(s.hist.sum(axis=(0, 1)), s.m).srp for s in segment_stats([seq], E, ms)]

    t_srp, vals = best_of(args.repeat, srp)
    print(f"SRP, m = {ms}: {t_srp:.3f} s CPU; model SRP = {[round(float(v), 4) for v in vals]}")

    flat = (seq + (np.arange(L) * E)[None, :, None]).reshape(1, T, L * k)
    t_model, res = best_of(args.repeat, lambda: lookahead_hits(flat, L * E, args.sch_m))
    rate = res.hits[0] / res.requests[0]
    at = {rho: round(float(rate[int(rho * L * k) - 1]), 4) for rho in (1, 2, 4)}
    print(f"model-level SCH curve (C = 1..{L * E}), m = {args.sch_m}: {t_model:.3f} s CPU; SCH at rho 1/2/4 = {at}")

    lanes = seq.transpose(1, 0, 2).copy()  # [L, T, k]
    t_layer, res = best_of(args.repeat, lambda: lookahead_hits(lanes, E, args.sch_m))
    pooled = res.hits.sum(0) / res.requests.sum()
    at = {rho: round(float(pooled[int(rho * k) - 1]), 4) for rho in (1, 2, 4)}
    print(f"per-layer SCH curves (48 x C = 1..{E}), m = {args.sch_m}: {t_layer:.3f} s CPU; pooled SCH at rho 1/2/4 = {at}")


if __name__ == "__main__":
    main()

"""SRP and SCH: the compiled kernels against the previous numpy implementation, side by side.

Input (pinned: generated, not read from a shipped trace): one 512-token request of a
Qwen3-30B-A3B-shaped synthetic trace (48 MoE layers x 128 experts, top-8; `casmoe.synthetic`
seed 1), every token measured (196,608 accesses), as moe-lrc measures fixed-length samples.

- SRP for m in `--m` (the four moe-lrc lengths by default): histograms and best F1, model
  level and per layer, no bootstrap;
- model-level SCH: the full hit curve over C = 1..6144 for one m (`--sch-m`, default 16);
- per-layer SCH: 48 curves over C = 1..128, same m.

The reference is casmoe's previous pure-numpy implementation (`tests/support/reference_metrics.py`,
the oracle the kernels are tested against; it was 0.72x / 0.20x of a plainer numpy version of
moe-lrc's definition, so ratios against it are the stricter ones). Each pair runs in this
process, interleaved, minimum CPU time of `--repeat` rounds; both results must be identical.
The kernels' first call in a new process (numba compile with an empty cache, then loading the
cached machine code) is measured in fresh processes.

Run:  python bench/bench_metrics.py [--repeat 5] [--m 4,16,64,256] [--sch-m 16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from casmoe.geometry import Geometry
from casmoe.metrics.sch import lookahead_hits
from casmoe.metrics.srp import segment_stats, srp_from_hist
from casmoe.metrics.tokens import sequences
from casmoe.synthetic import SynthConfig, generate
from side_by_side import first_call_seconds, interleaved, load_average, ratio_row

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from reference_metrics import numpy_lookahead_hits, numpy_segment_stats  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--m", default="4,16,64,256")
    ap.add_argument("--sch-m", type=int, default=16)
    args = ap.parse_args()
    ms = [int(x) for x in args.m.split(",")]
    g = Geometry(layers=48, experts=128, top_k=8)
    trace = generate(g, SynthConfig(requests=1, prefill=(128, 128), decode=(384, 384), seed=1))
    (seq,) = sequences(trace)
    L, E, k = g.layers, g.experts, g.top_k
    T = len(seq)
    flat = (seq + (np.arange(L) * E)[None, :, None]).reshape(1, T, L * k)
    lanes = seq.transpose(1, 0, 2).copy()  # [L, T, k]
    print(f"trace: {T} tokens x {L} layers x top-{k} of {E} experts = {T * L * k} accesses; load average {load_average()}")
    lookahead_hits(flat[:, :2], L * E, args.sch_m), segment_stats([seq[:2]], E, [1])  # compile / load outside the timing

    def srp(stats):
        return lambda: [srp_from_hist(s.hist.sum(axis=(0, 1)), s.m).srp for s in stats([seq], E, ms)]

    pairs = {
        "model-level SCH curve": (lambda: lookahead_hits(flat, L * E, args.sch_m), lambda: numpy_lookahead_hits(flat, L * E, args.sch_m), 0.1),
        f"per-layer SCH curves ({L} x C = 1..{E})": (lambda: lookahead_hits(lanes, E, args.sch_m), lambda: numpy_lookahead_hits(lanes, E, args.sch_m), None),
        f"SRP, m = {args.m}": (srp(segment_stats), srp(numpy_segment_stats), 0.1),
    }
    print("\n| what | compiled | previous numpy | ratio | goal |")
    print("|---|---|---|---|---|")
    for what, (new, ref, goal) in pairs.items():
        res = interleaved({"new": new, "ref": ref}, args.repeat)
        (t_new, a), (t_ref, b) = res["new"], res["ref"]
        same = all(np.array_equal(x, y) for x, y in zip(a, b)) if isinstance(a, list) else np.array_equal(a.hits, b.hits)
        assert same, f"{what}: compiled and numpy results differ"
        print(ratio_row(what, t_new, t_ref, "numpy", goal))
    model = lookahead_hits(flat, L * E, args.sch_m)
    rate = model.hits[0] / model.requests[0]
    print(f"\nmodel-level SCH at rho 1/2/4 = {[round(float(rate[int(rho * L * k) - 1]), 4) for rho in (1, 2, 4)]}; "
          f"model SRP = {[round(float(v), 4) for v in srp(segment_stats)()]}")

    setup = (
        "import numpy as np\nfrom casmoe.metrics.sch import lookahead_hits\nfrom casmoe.metrics.srp import segment_stats\n"
        "x = np.array([[[0, 1], [1, 0], [0, 1], [1, 0]]], dtype=np.int64)"
    )
    cold, warm = first_call_seconds(setup, "lookahead_hits(x, 2, 1); segment_stats([x.reshape(4, 1, 2)], 2, [2])")
    print(f"\nfirst call in a new process (SCH + SRP kernels, import of numba included): "
          f"{cold:.2f} s with an empty numba cache (compile), {warm:.2f} s from the cache")


if __name__ == "__main__":
    main()

"""How long `load_trace` takes for a 1-million token-layer trace (31,250 tokens x 32 layers, top-2).

Loading includes reading the file, decompressing, validating every array (ids in range, no
duplicate expert, finite non-negative weights) and slicing requests. Run:

    python bench/bench_trace_load.py [--repeat 7] [--logits]

`--logits` also stores router logits [T, L, E] (8 M floats more) to show what they cost.

A process keeps the traces it decoded, by the digest of their bytes (`casmoe.trace_io`): each
timed first load starts with none kept; a load again is the file's read and digest, and a trace
of the caller's own over the kept requests.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from casmoe.geometry import Geometry
from casmoe.synthetic import SynthConfig, generate
from casmoe import trace_io
from casmoe.trace_io import load_trace, save_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--logits", action="store_true")
    args = ap.parse_args()
    g = Geometry(layers=32, experts=8, top_k=2, hidden=4096, intermediate=14336)
    # 250 requests x (50 prefill + 75 decode) = 31,250 tokens; x 32 layers = 1,000,000 token-layers
    cfg = SynthConfig(requests=250, prefill=(50, 50), decode=(75, 75), spec=True, logits=args.logits, seed=0)
    tr = generate(g, cfg)
    assert tr.tokens * g.layers == 1_000_000
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "million.npz"
        t0 = time.perf_counter()
        save_trace(tr, path)
        save_s = time.perf_counter() - t0
        times, again = [], []
        for _ in range(args.repeat):
            trace_io._DECODED.clear()  # a first load: nothing kept
            t0 = time.perf_counter()
            back = load_trace(path)
            times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert load_trace(path).tokens == back.tokens
            again.append(time.perf_counter() - t0)
        assert back.tokens == tr.tokens
        size = path.stat().st_size
    print(
        f"1,000,000 token-layers (31,250 tokens x 32 layers, top-2, spec{', logits' if args.logits else ''}): "
        f"file {size / 1e6:.1f} MB, save {save_s:.2f} s, load min {min(times):.3f} s, "
        f"median {statistics.median(times):.3f} s over {args.repeat} loads; "
        f"loaded again min {min(again):.3f} s, median {statistics.median(again):.3f} s"
    )


if __name__ == "__main__":
    main()

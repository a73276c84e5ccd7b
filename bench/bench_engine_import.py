"""Time importing serving-engine dumps: SGLang per_token (`.pt`) and vLLM per-request `.npz`.

    python bench/bench_engine_import.py [--requests 64] [--prompt 64] [--decode 64] [--batch 16]

Writes, in a temporary folder, a dump of `--requests` requests of a Qwen3-30B-A3B-shaped model
(48 MoE layers, 128 experts, top-8; random routing, which only the speed depends on) as SGLang
records them (each group of `--batch` requests: one extend pass of their prompts, then batched
decode passes) and as vLLM completions, then times `import_trace` on each: CPU seconds of this
process (`time.process_time`, less inflated by other jobs on a shared machine than wall time),
best of `--repeat`, and checks that both give back the same routing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from casmoe.importers import import_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "engine-dumps"))
from make_examples import sglang_record, write_sglang  # noqa: E402

L, E, K = 48, 128, 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    T = args.prompt + args.decode
    rows = np.argsort(rng.random((args.requests, T, L, E), dtype=np.float32), axis=3)[..., :K]  # [R, T, L, K]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "vllm").mkdir()
        for r in range(args.requests):
            np.savez(tmp / "vllm" / f"r{r:05d}.npz", prompt_routed_experts=rows[r, : args.prompt].astype(np.int16),
                     routed_experts=rows[r, args.prompt :].astype(np.int16))
        records, fid = [], 0
        for g in range(0, args.requests, args.batch):
            group = range(g, min(g + args.batch, args.requests))
            records.append(sglang_record(fid, "extend", [(0, rows[r, : args.prompt], np.zeros(args.prompt)) for r in group], L))
            fid += 1
            for t in range(args.prompt, T):
                records.append(sglang_record(fid, "decode", [(t, rows[r, t : t + 1], [1]) for r in group], L))
                fid += 1
        write_sglang(tmp / "dump.pt", records, np.tile(np.arange(E), (L, 1)))
        tokens = args.requests * T
        for name, src, fmt in (("sglang per_token", tmp / "dump.pt", "sglang"), ("vllm npz", tmp / "vllm", "vllm")):
            size = sum(p.stat().st_size for p in ([src] if src.is_file() else src.iterdir()))
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.process_time()
                tr = import_trace([src], fmt, num_experts=E)
                best = min(best, time.process_time() - t0)
            got = np.stack([r.topk for r in tr.requests])
            assert np.array_equal(got, rows), f"{name}: the imported routing differs from the dump's"
            print(f"{name}: {len(tr.requests)} requests, {tokens} tokens, {size / 2**20:.1f} MiB: "
                  f"{best:.2f} CPU s ({tokens / best:,.0f} tokens/s)")


if __name__ == "__main__":
    main()

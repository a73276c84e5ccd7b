"""Time to first token and tokens/s of the torch backend on the CPU by tier configuration, and
the copy rates behind them against this machine's memcpy rate.

Input: a Mixtral-shaped random-init bf16 checkpoint of 1.38 GiB (bench_backend_memory.py's
`mixtral`, written under --root if absent, removed afterwards unless --keep); 4 held-out
prompts of 32 tokens served twice (8 requests, so a RAM tier meets experts again), 8 new tokens
each, LRU at top-k (2) slots per MoE layer, one torch thread. Configurations, one
OffloadedModel each, served in interleaved rounds (a round runs every configuration once, in
order; each run is a new session, so a RAM tier starts empty), the best of --rounds:

- `resident`: a slot per expert (loaded once on first use, then nothing moves);
- `disk-warm`: experts read from the checkpoint every load, its pages in the page cache (the
  kernel's own RAM tier, outside the process);
- `disk-cold`: the same with the checkpoint's pages dropped (posix_fadvise) before the run;
- `disk-direct`: reads with O_DIRECT (no page cache at all: the drive's speed every time);
- `ram-half-direct` / `ram-all-direct`: O_DIRECT reads under a RAM tier holding half / all of
  the experts.

Copy rates (same process, same bytes): the loader's copies of 4 experts out of RAM-tier rows
into 4 other pool slots against the same copies by a plain `copy_` loop, and the store's reads
(page cache, O_DIRECT) of one expert.

Run:  python bench/bench_backend_tiers.py [--rounds 3] [--root /tmp/casmoe-ckpt]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench_backend_memory import drop_page_cache

HERE = Path(__file__).resolve().parent
CONFIGS = ("resident", "disk-warm", "disk-cold", "disk-direct", "ram-half-direct", "ram-all-direct")


def copy_rates(path: Path, reps: int = 20) -> dict[str, float]:
    """GB/s of one expert: loader RAM-row -> pool copies, store reads (page cache, O_DIRECT),
    plain copy_."""
    from casmoe.backends.copier import Loader, Ticket, responsive_copies
    from casmoe.backends.experts import find_moe_blocks, model_geometry
    from casmoe.backends.hostcache import HostTier
    from casmoe.backends.models import open_files, open_model
    from casmoe.backends.pool import SlotPool
    from casmoe.policies import get_policy

    model, store = open_model(open_files(str(path)))
    g = model_geometry(model, find_moe_blocks(model))
    row = store.expert_bytes(0)
    host = HostTier(store, g, 4, get_policy("lru"))
    pool = SlotPool(store.layout, 4, "cpu")
    loader = Loader(torch.device("cpu"), store, None, host)
    for e in range(4):  # fill the RAM rows
        t = Ticket(e, e, True, pool.row(e), row, 0, e)
        t.ram, t.fill = host.plan(0, 0, e)
        loader.submit(t)
        loader.wait(t)
    best = plain = float("inf")
    with responsive_copies():
        for r in range(reps):
            tickets = []
            t0 = time.perf_counter()
            for e in range(4):
                t = Ticket(e, (e + r + 1) % 4, True, pool.row((e + r + 1) % 4), row, 0, e)
                t.ram, t.fill = host.plan(1 + r, 0, e)
                loader.submit(t)
                tickets.append(t)
            for t in tickets:
                loader.wait(t)
            best = min(best, (time.perf_counter() - t0) / 4)
            t0 = time.perf_counter()
            for e in range(4):  # the same bytes, row to slot, by plain copies
                for n, dst in pool.row((e + r + 2) % 4).items():
                    dst.copy_(host.rows[n][host.row_of(0, e)])
            plain = min(plain, (time.perf_counter() - t0) / 4)
    loader.close()
    rows = store.empty_rows()

    def rate(fn) -> float:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return row / min(times) / 1e9

    direct = open_model(open_files(str(path), direct=True))[1]
    return {
        "expert_mib": row / 2**20,
        "loader_ram_to_pool_gbs": row / best / 1e9,
        "memcpy_ram_to_pool_gbs": row / plain / 1e9,
        "store_read_page_cache_gbs": rate(lambda: store.read(0, 1, rows)),
        "store_read_direct_gbs": rate(lambda: direct.read(0, 1, rows)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--root", type=Path, default=Path("/tmp/casmoe-ckpt"))
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--out", type=Path, default=HERE / "backend-tiers.json")
    args = ap.parse_args()
    path = args.root / "mixtral"
    if not (path / "config.json").exists():
        subprocess.run([sys.executable, str(HERE / "bench_backend_memory.py"), "make", "--arch", "mixtral",
                        "--root", str(args.root)], check=True)
    torch.set_num_threads(1)
    from casmoe.backends.bench import bench, open_offloaded
    from casmoe.backends.corpus import load_corpus
    from casmoe.backends.runtime import Prompt
    from casmoe.policies import get_policy

    opened = {}
    for name in CONFIGS:
        experts = None
        if name.startswith("ram"):
            meta = opened["disk-warm"].om.geometry
            experts = meta.layers * meta.experts // (2 if name.startswith("ram-half") else 1)
        opened[name] = open_offloaded(str(path), capacity="8" if name == "resident" else "2",
                                      host_cache=None if experts is None else str(experts),
                                      direct_io=name.endswith("direct"))
    tok = opened["resident"].tokenizer
    rows = load_corpus(split="heldout")
    prompts = [Prompt(tok(r.text)["input_ids"][:32]) for r in rows[:: len(rows) // 4][:4]] * 2
    results: dict[str, list[dict]] = {n: [] for n in CONFIGS}
    for _ in range(args.rounds):
        for name in CONFIGS:
            if name == "disk-cold":
                drop_page_cache(path)
            rec = bench(opened[name], prompts, get_policy("lru"), {}, max_new_tokens=8)
            results[name].append({k: rec[k] for k in ("ttft_s", "tokens_per_s", "stall_s", "store_read_s", "wall_s")})
    best = {n: {"ttft_s": min(r["ttft_s"] for r in rs), "tokens_per_s": max(r["tokens_per_s"] for r in rs),
                "store_read_s": min(r["store_read_s"] for r in rs)} for n, rs in results.items()}
    for n, b in best.items():
        print(f"{n:16s} TTFT {b['ttft_s']:.3f} s  {b['tokens_per_s']:6.2f} tok/s  "
              f"store reads {b['store_read_s']:.2f} s")
    rates = copy_rates(path)
    print(json.dumps(rates))
    args.out.write_text(json.dumps({"machine": platform.node(), "load_avg": os.getloadavg(), "best": best,
                                    "rounds": results, "copy_rates": rates}, indent=2))
    if not args.keep:
        shutil.rmtree(path)


if __name__ == "__main__":
    main()

"""GPU checks of the torch backend that can fail: PASS/FAIL per check, the figures, and a JSON
record (`--out`). `bench/gpu_check.sh` runs this and the CUDA unit tests; about 3 minutes on one
GPU. `--device cpu --small` runs the same code on the CPU with small experts (a dry run).

1. exactness, large experts: a random-init Mixtral-shaped bf16 checkpoint with 96 MiB experts
   (hidden 4096, intermediate 4096; 2 MoE layers x 8 experts, top-2), written sharded to a temp
   folder and read by offset; prompts of 24-40 tokens at 2 slots per layer, so every prefill
   streams all 8 experts through 2 slots. Logits must equal (`torch.equal`) the un-offloaded
   model's on the same GPU at every step: LRU and SE-MoE, with and without a RAM tier smaller
   than the experts, three requests decoded together, on 2 GPUs when present; `--verify`
   reports 0.0.
2. race stress: a smaller model (hidden 512, 4 MoE layers x 8 experts) at 2-3 slots per layer
   with prefetching policies and a RAM tier: copies on the copy stream overlap compute; after
   every layer each arrived slot must hold exactly its expert's bytes, and the logits must be
   exact. A use-before-arrival bug shows up as a residency or logit mismatch.
3. copy bandwidth: the loader's rate copying 96 MiB experts from pinned RAM-tier rows into the
   slot pool, against the device's pinned host-to-device rate measured with plain tensor copies
   (goal: at least 90%). The store's read rate (page cache) is reported too.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

RESULTS: list[dict[str, Any]] = []


def check(name: str, fn: Callable[[], tuple[bool, dict[str, Any]]]) -> None:
    t0 = time.perf_counter()
    try:
        ok, figures = fn()
    except Exception as exc:  # noqa: BLE001  (a crash is a FAIL with its reason)
        ok, figures = False, {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=3)}
    figures["seconds"] = round(time.perf_counter() - t0, 2)
    RESULTS.append({"check": name, "pass": ok, **figures})
    shown = {k: v for k, v in figures.items() if k != "trace"}
    print(f"{'PASS' if ok else 'FAIL'}  {name}  {json.dumps(shown)}", flush=True)


def _model(hidden: int, inter: int, layers: int, vocab: int, device: str) -> Any:
    import transformers

    cfg = transformers.MixtralConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                                     num_hidden_layers=layers, num_attention_heads=max(4, hidden // 128),
                                     num_key_value_heads=max(2, hidden // 512), num_local_experts=8,
                                     num_experts_per_tok=2, max_position_embeddings=256, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.MixtralForCausalLM(cfg).to(torch.bfloat16).eval()
    return model


def _logits(model: Any, prompts: list[list[int]], steps: int, batch: int, device: str) -> list[list[torch.Tensor]]:
    """The un-offloaded model through the backend's decode loop: each step's last logits."""
    from casmoe.backends.generate import step_logits

    return [[x.float().cpu() for x in row] for row in step_logits(model, prompts, steps, batch=batch, device=device)]


def _equal(got: list[list[torch.Tensor]], want: list[list[torch.Tensor]]) -> tuple[bool, float]:
    delta = max(float((a.float().cpu() - b).abs().max()) for ra, rb in zip(got, want) for a, b in zip(ra, rb))
    same = all(torch.equal(a.float().cpu(), b) for ra, rb in zip(got, want) for a, b in zip(ra, rb))
    return same, delta


def _save(model: Any, folder: Path, device: str) -> Any:
    """Write `model` as a sharded checkpoint (with a tokenizer); return the un-offloaded
    reference: the checkpoint loaded by transformers onto `device`."""
    import transformers

    from casmoe.shipped import data_dir

    model.save_pretrained(folder, max_shard_size="500MB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(data_dir() / "models" / "tiny-mixtral" / name, folder / name)
    del model
    return transformers.AutoModelForCausalLM.from_pretrained(folder).to(device).eval()


def exactness(folder: Path, devices: list[str], small: bool) -> None:
    from casmoe.backends.bench import open_offloaded
    from casmoe.backends.hostcache import HostCache
    from casmoe.backends.runtime import Prompt
    from casmoe.policies import get_policy

    dev = devices[0]
    hidden, inter = (256, 512) if small else (4096, 4096)
    model = _save(_model(hidden, inter, 2, 4096, dev), folder, dev)
    expert_mib = 3 * hidden * inter * 2 / 2**20
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 4096, (n,), generator=gen).tolist() for n in (24, 40, 31)]
    steps = 6
    want = {b: _logits(model, prompts, steps, b, dev) for b in (1, 3)}
    del model
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
    P = [Prompt(p) for p in prompts]
    sets = [[dev]] + ([devices[:2]] if len(devices) > 1 else [])
    for devs in sets:
        opened = open_offloaded(str(folder), devices=devs, capacity="2")
        om = opened.om
        for policy in ("lru", "semoe"):
            for ram in (None, 6):
                for batch in (1, 3):
                    if batch == 3 and (policy != "lru" or ram is None):
                        continue
                    name = f"exact {'+'.join(devs)} {policy} {'RAM 6/16' if ram else 'disk'} batch {batch}"

                    def run(policy=policy, ram=ram, batch=batch, om=om) -> tuple[bool, dict[str, Any]]:
                        host = HostCache(ram, get_policy("lru")) if ram else None
                        r = om.run(P, get_policy(policy), 2, max_new_tokens=steps, keep_logits=True, host=host,
                                   batch=batch)
                        same, delta = _equal(r.logits, want[batch])
                        return same, {"max_abs_delta": delta, "expert_mib": expert_mib, "loads": r.stats.loads,
                                      "ram_hits": None if r.host_stats is None else r.host_stats.hits}

                    check(name, run)
        del opened, om
    opened = open_offloaded(str(folder), devices=[dev], capacity="2")

    def verify() -> tuple[bool, dict[str, Any]]:
        from casmoe.backends.bench import bench

        rec = bench(opened, P, get_policy("lru"), {}, max_new_tokens=steps, verify=True)
        return rec["verify_max_abs_delta"] == 0.0 and rec["verify_token_agreement"] == 1.0, {
            "max_abs_delta": rec["verify_max_abs_delta"], "token_agreement": rec["verify_token_agreement"]}

    check(f"bench --verify {dev}", verify)


def stress(folder: Path, dev: str, small: bool) -> None:
    from casmoe.backends.bench import open_offloaded
    from casmoe.backends.hostcache import HostCache
    from casmoe.backends.runtime import Prompt
    from casmoe.cache import Capacity
    from casmoe.policies import get_policy

    model = _save(_model(256 if small else 512, 512 if small else 1024, 4, 4096, dev), folder, dev)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 4096, (int(n),), generator=gen).tolist() for n in torch.randint(1, 30, (8,))]
    want = _logits(model, prompts, 8, 1, dev)
    del model
    opened = open_offloaded(str(folder), devices=[dev], capacity="2")
    om = opened.om
    P = [Prompt(p) for p in prompts]
    layers = [0]

    def resident(om_: Any, layer: int) -> None:
        layers[0] += 1
        om_.check_residency()

    om.on_layer = resident
    for policy, cap, ram in (("semoe", Capacity(2), None), ("semoe", Capacity(3), 10), ("lfu", Capacity(2), 12),
                             ("lru", Capacity(5, per_layer=False), None)):
        def run(policy=policy, cap=cap, ram=ram) -> tuple[bool, dict[str, Any]]:
            layers[0] = 0
            host = HostCache(ram, get_policy("lru")) if ram else None
            r = om.run(P, get_policy(policy), cap, max_new_tokens=8, keep_logits=True, host=host)
            same, delta = _equal(r.logits, want)
            return same, {"max_abs_delta": delta, "layers_checked": layers[0], "prefetches": r.stats.prefetch_loads,
                          "late_hits": r.stats.late_hits, "stall_s": r.stall}

        check(f"race stress {dev} {policy} {cap.describe()}{' RAM ' + str(ram) if ram else ''}", run)


def bandwidth(folder: Path, dev: str) -> None:
    """Loader copies out of pinned RAM-tier rows vs plain pinned tensor copies."""
    from casmoe.backends.copier import Loader, Ticket
    from casmoe.backends.hostcache import HostTier
    from casmoe.backends.models import open_files, open_model
    from casmoe.backends.pool import SlotPool
    from casmoe.policies import get_policy

    device = torch.device(dev)
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    model, store = open_model(open_files(str(folder)))
    from casmoe.backends.experts import find_moe_blocks, model_geometry

    g = model_geometry(model, find_moe_blocks(model))
    row = store.expert_bytes(0)
    host = HostTier(store, g, 8, get_policy("lru"), pin=cuda)
    loader = Loader(device, store, None, host)
    pool = SlotPool(store.layout, 8, device)
    t0 = time.perf_counter()
    fills = []
    for e in range(8):
        t = Ticket(e, e, True, pool.row(e), row, 0, e)
        t.ram, t.fill = host.plan(0, 0, e)
        loader.submit(t)
        fills.append(t)
    for t in fills:
        loader.wait(t)
    read_rate = 8 * row / loader.read_s
    rates = []
    for _ in range(3):
        tickets = []
        sync()
        t0 = time.perf_counter()
        for e in range(8):
            t = Ticket(e, (e + 1) % 8, True, pool.row((e + 1) % 8), row, 0, e)
            t.ram, t.fill = host.plan(1, 0, e)
            loader.submit(t)
            tickets.append(t)
        for t in tickets:
            loader.wait(t)
        sync()
        rates.append(8 * row / (time.perf_counter() - t0))
    loader.close()
    src = torch.empty(256 * 2**20, dtype=torch.uint8, pin_memory=cuda)
    dst = torch.empty_like(src, device=device)
    plain = []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync()
        plain.append(src.numel() / (time.perf_counter() - t0))
    loader_rate, plain_rate = max(rates), max(plain)
    check(f"copy bandwidth {dev}", lambda: (loader_rate >= 0.9 * plain_rate, {
        "loader_gbs": loader_rate / 1e9, "pinned_h2d_gbs": plain_rate / 1e9, "ratio": loader_rate / plain_rate,
        "store_read_gbs": read_rate / 1e9, "expert_mib": row / 2**20}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (1 or 2 GPUs as found) or cpu (dry run)")
    ap.add_argument("--small", action="store_true", help="small experts (a quick dry run)")
    ap.add_argument("--out", type=Path, default=Path("bench/gpu_check/results.json"))
    args = ap.parse_args()
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("gpu_check: torch sees no CUDA device")
        devices = [f"cuda:{i}" for i in range(min(2, torch.cuda.device_count()))]
    else:
        devices = ["cpu", "cpu"]
    with tempfile.TemporaryDirectory(prefix="casmoe-gpu-check-") as tmp:
        root = Path(tmp)
        exactness(root / "large", devices, args.small)
        bandwidth(root / "large", devices[0])
        shutil.rmtree(root / "large")
        stress(root / "stress", devices[0], args.small)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(0) if devices[0].startswith("cuda") else "cpu",
            "gpus": len(set(devices)), "torch": torch.__version__}
    args.out.write_text(json.dumps({**meta, "results": RESULTS}, indent=2))
    failed = [r["check"] for r in RESULTS if not r["pass"]]
    print(f"{len(RESULTS) - len(failed)}/{len(RESULTS)} checks passed" + (f"; FAILED: {failed}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

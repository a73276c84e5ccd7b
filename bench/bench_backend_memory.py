"""Peak RSS of the torch backend on real-size checkpoints, per architecture and mode; TTFT and
tokens/s by tier configuration.

Checkpoints: random-init transformers models (Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE,
DeepSeek-V2, DeepSeek-V3 shapes below), sharded bf16 safetensors of 0.8-1.5 GiB, written under
`--root` (default /tmp/casmoe-ckpt) at bench time and never committed; the shipped tiny-mixtral
tokenizer is copied beside them (its ids fit every vocabulary here).

Each configuration runs in a fresh child process (`child` subcommand), which reports
- `import_rss`: its RSS right after importing torch, transformers (with the architecture's model
  class: transformers imports its modeling code lazily, `transformers.modeling_utils` alone is
  0.12 GiB) and casmoe's backend;
- `peak_rss`: `ru_maxrss` at the end (serving 4 prompts of 32 tokens, 8 new tokens each, LRU,
  top-k slots per MoE layer on the CPU: every prefill streams through them);
- the target: import_rss + dense bytes + RAM tier + slot pool + 0.25 GiB.
The checkpoint's pages are dropped from the page cache before each child (posix_fadvise
DONTNEED), so every run starts cold; page-cache pages are never RSS, mapped pages are.

Modes: `before-memory` / `before-mmap` run the code of commit 0a18d47 (the last one before the
checkpoint store) with `--before-python` (a venv with that commit installed): the whole model
loaded by from_pretrained, experts in memory or in a `--mmap` copy. `disk` runs today's code with
no RAM tier, `ram-half` / `ram-all` with a RAM tier of half / all the experts, `resident` with
every expert's slot on the device (nothing moves after first use).

Run:  python bench/bench_backend_memory.py --before-python /tmp/casmoe-before-venv/bin/python
      [--archs mixtral,olmoe] [--modes disk,ram-half] [--out bench/backend-memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

GiB = 2**30
VOCAB = 32000
COMMON = dict(vocab_size=VOCAB, hidden_size=1024, num_attention_heads=16, num_key_value_heads=4,
              max_position_embeddings=512, tie_word_embeddings=False)
DEEPSEEK = dict(num_key_value_heads=16, kv_lora_rank=128, q_lora_rank=None, qk_rope_head_dim=32,  # MLA: kv heads = heads
                v_head_dim=64, qk_nope_head_dim=64,
                n_group=8, topk_group=3, first_k_dense_replace=1, intermediate_size=2816)
ARCHS = {  # (config class, its fields): 0.8-1.5 GiB in bf16
    "mixtral": ("MixtralConfig", dict(intermediate_size=3328, num_hidden_layers=8, num_local_experts=8,
                                      num_experts_per_tok=2)),
    "olmoe": ("OlmoeConfig", dict(intermediate_size=512, num_hidden_layers=4, num_experts=64, num_experts_per_tok=8)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(intermediate_size=2816, moe_intermediate_size=704,
                                         shared_expert_intermediate_size=2816, num_hidden_layers=4, num_experts=60,
                                         num_experts_per_tok=4)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(intermediate_size=2816, moe_intermediate_size=768, num_hidden_layers=4,
                                         num_experts=64, num_experts_per_tok=8, head_dim=64)),
    "deepseek_v2": ("DeepseekV2Config", dict(**DEEPSEEK, moe_intermediate_size=704, num_hidden_layers=5,
                                             n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2,
                                             topk_method="group_limited_greedy")),
    "deepseek_v3": ("DeepseekV3Config", dict(**DEEPSEEK, moe_intermediate_size=512, num_hidden_layers=5,
                                             n_routed_experts=64, num_experts_per_tok=8, n_shared_experts=1)),
}
MODES = ("before-memory", "before-mmap", "disk", "ram-half", "ram-all", "resident")
PROMPTS, PROMPT_TOKENS, NEW_TOKENS = 4, 32, 8  # slots per MoE layer: top-k


def make(arch: str, out: Path) -> None:
    """Write the random-init bf16 checkpoint of `arch` (sharded) and a tokenizer."""
    import torch
    import transformers

    from casmoe.shipped import data_dir

    cls_name, fields = ARCHS[arch]
    config = getattr(transformers, cls_name)(**{**COMMON, **fields})
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    model = transformers.AutoModelForCausalLM.from_config(config)
    for name, p in model.named_parameters():
        if name.endswith("gate.weight") and p.dim() == 2 and p.shape[0] != 1:  # routers: not all-zero
            torch.nn.init.normal_(p, std=0.02)
    model.save_pretrained(out, max_shard_size="300MB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(data_dir() / "models" / "tiny-mixtral" / name, out / name)


def _rss() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _prompts(tokenizer: object, Prompt: type) -> list:
    from casmoe.backends.corpus import load_corpus

    rows = load_corpus(split="heldout")
    return [Prompt(tokenizer(r.text)["input_ids"][:PROMPT_TOKENS]) for r in rows[:: len(rows) // PROMPTS][:PROMPTS]]


def child(mode: str, path: Path, threads: int) -> dict:
    """One configuration in this (fresh) process; see the module docstring."""
    import torch
    import transformers

    import casmoe.backends.runtime  # noqa: F401

    cls = json.loads((path / "config.json").read_text())["architectures"][0]
    getattr(transformers, cls)  # transformers imports a model's code lazily: 0.12 GiB of it is shared machinery
    import_rss = _rss()
    torch.set_num_threads(threads)
    from casmoe.backends.runtime import OffloadedModel, Prompt
    from casmoe.policies import get_policy

    t0 = time.perf_counter()
    if mode.startswith("before"):
        from casmoe.backends.models import load_model

        model, tok = load_model(str(path), dtype="bfloat16")
        om = OffloadedModel(model, mmap_path=path / "experts.mmap.safetensors" if mode == "before-mmap" else None)
        loaded = time.perf_counter() - t0
        run = om.run(_prompts(tok, Prompt), get_policy("lru"), om.geometry.top_k, max_new_tokens=NEW_TOKENS)
        d = run.to_dict()
        terms = {}
    else:
        from casmoe.backends.bench import bench, open_offloaded

        from casmoe.backends.experts import find_moe_blocks, model_geometry
        from casmoe.backends.models import open_files, skeleton

        meta = skeleton(open_files(str(path)))  # the meta-device model: sizes, no memory
        g = model_geometry(meta, find_moe_blocks(meta))
        experts, row = g.layers * g.experts, g.expert_bytes(0)
        host = {"ram-half": str(experts // 2), "ram-all": str(experts)}.get(mode)
        capacity = str(g.experts if mode == "resident" else g.top_k)
        opened = open_offloaded(str(path), capacity=capacity, host_cache=host)
        loaded = time.perf_counter() - t0
        d = bench(opened, _prompts(opened.tokenizer, Prompt), get_policy("lru"), {}, max_new_tokens=NEW_TOKENS)
        pool = opened.capacity.total(g) * row
        ram = 0 if opened.host is None else opened.host.rows * row
        terms = {"dense_bytes": opened.dense_bytes, "pool_bytes": pool, "ram_tier_bytes": ram,
                 "target": import_rss + opened.dense_bytes + pool + ram + GiB // 4}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"mode": mode, "import_rss": import_rss, "peak_rss": peak, "load_s": loaded, **terms,
            **{k: d[k] for k in ("ttft_s", "tokens_per_s", "median_token_latency_s", "stall_s", "wall_s") if k in d},
            "store_read_s": d.get("store_read_s"), "ram_hit_rate": d.get("ram_hit_rate")}


def drop_page_cache(path: Path) -> None:
    """Evict the checkpoint's pages from the page cache: the next read comes from the drive."""
    for f in path.glob("*.safetensors"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", nargs="?", default="run", choices=("run", "make", "child"))
    ap.add_argument("--arch", default="mixtral")
    ap.add_argument("--mode", default="disk")
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--root", type=Path, default=Path("/tmp/casmoe-ckpt"))
    ap.add_argument("--before-python", default=None, help="python of a venv with commit 0a18d47 installed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints afterwards")
    ap.add_argument("--out", type=Path, default=Path("bench/backend-memory.json"))
    args = ap.parse_args()
    path = args.root / args.arch
    if args.cmd == "make":
        make(args.arch, path)
        return
    if args.cmd == "child":
        print(json.dumps(child(args.mode, path, args.threads)))
        return
    results = []
    for arch in args.archs.split(","):
        path = args.root / arch
        if not (path / "config.json").exists():
            subprocess.run([sys.executable, __file__, "make", "--arch", arch, "--root", str(args.root)], check=True)
        size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        for mode in args.modes.split(","):
            python = args.before_python if mode.startswith("before") else sys.executable
            if python is None:
                continue
            drop_page_cache(path)
            proc = subprocess.run([python, __file__, "child", "--arch", arch, "--mode", mode, "--root", str(args.root),
                                   "--threads", str(args.threads)], capture_output=True, text=True)
            (path / "experts.mmap.safetensors").unlink(missing_ok=True)
            if proc.returncode:
                reason = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
                results.append({"arch": arch, "checkpoint_bytes": size, "mode": mode, "failed": reason})
                print(f"{arch:12s} {mode:14s} failed: {reason}", flush=True)
                continue
            r = {"arch": arch, "checkpoint_bytes": size, **json.loads(proc.stdout.strip().splitlines()[-1])}
            results.append(r)
            target = f" target {r['target'] / GiB:.2f}" if "target" in r else ""
            print(f"{arch:12s} {mode:14s} ckpt {size / GiB:.2f} GiB  peak {r['peak_rss'] / GiB:.2f} GiB"
                  f" ({r['peak_rss'] / size:.2f}x){target}  TTFT {r['ttft_s']:.2f} s  {r['tokens_per_s']:.2f} tok/s",
                  flush=True)
        if not args.keep:
            shutil.rmtree(path)
    args.out.write_text(json.dumps({"machine": platform.node(), "load_avg": os.getloadavg(), "results": results},
                                   indent=2))


if __name__ == "__main__":
    main()

"""CasMoE planner benchmarks: latency and memory, quality (ablation, epsilon curve), policies.

    python bench/bench_planner.py latency  [--trace T]            # p50 timings, bytes, RSS
    python bench/bench_planner.py quality  [--trace T ...]        # ablation table + epsilon curve
    python bench/bench_planner.py policies [--trace T ...]        # replay (+ simulator) comparison
    python bench/bench_planner.py all      [--trace T ...]        # the three, sharing the fits

Latency runs first in `all`, so its RSS figures see a fresh process.

Every section fits its planners itself (timed: that is the fit figure) on the trace's fit split
and scores the held-out split (casmoe/planner/planner.py documents the split). Output is
Markdown on stdout, pasted into bench/RESULTS.md; `--json PATH` also stores the raw records.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable


os.environ.setdefault("HF_HUB_OFFLINE", "1")

from casmoe.cache import Capacity  # noqa: E402
from casmoe.planner import EAPConfig, PlannerConfig, fit_planner, load_planner  # noqa: E402
from casmoe.planner.evaluate import METHODS, evaluate, score, serve_online  # noqa: E402
from casmoe.planner.planner import heldout_split  # noqa: E402
from casmoe.policies import get_policy  # noqa: E402
from casmoe.replay import replay  # noqa: E402
from casmoe.shipped import data_dir  # noqa: E402
from casmoe.trace import Trace  # noqa: E402
from casmoe.trace_io import load_trace  # noqa: E402

TRACES = ("tiny-mixtral.npz", "tiny-olmoe.npz", "synthetic-mixtral.npz")


def shipped_traces(names: list[str] | None) -> list[Path]:
    paths = [Path(n) for n in names] if names else [data_dir() / n for n in TRACES]
    return [p for p in paths if p.exists()]


def p50_ms(fn: Callable[[], Any], repeat: int = 200, warmup: int = 10) -> tuple[float, float]:
    """Median wall and thread-CPU milliseconds per call. Every timed call runs on one thread
    (casmoe/planner/threads.py), so its CPU time is what the wall time would be on an idle
    core: the figure that survives the shared machine's load."""
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.thread_time()
        fn()
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - t)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024


_FITS: dict[tuple[str, PlannerConfig], tuple[Any, float]] = {}


def timed_fit(path: Path, trace: Trace, cfg: PlannerConfig) -> tuple[Any, float]:
    """Fit (once per trace and config in this process: `all` reuses the default planner)."""
    key = (str(path), cfg)
    if key not in _FITS:
        t = time.perf_counter()
        planner = fit_planner(trace, cfg, progress=False)
        _FITS[key] = planner, time.perf_counter() - t
    return _FITS[key]


# ---- latency and memory ----------------------------------------------------------------------


def latency(paths: list[Path]) -> list[dict[str, Any]]:
    import torch

    from casmoe.planner.eap import wordpiece
    from casmoe.planner.embedding import default_backend, embed, embedder

    rss0 = rss_mib()
    model = embedder(default_backend())
    wordpiece()
    embed(["warm up"])
    rss_model = rss_mib()
    model_bytes = model.nbytes()
    records = []
    for path in paths:
        trace = load_trace(path)
        planner, fit_s = timed_fit(path, trace, PlannerConfig())
        with tempfile.TemporaryDirectory() as tmp:
            planner.save(tmp)
            before = rss_mib()
            planner = load_planner(tmp)
            rss_planner = rss_mib() - before
        _, test = heldout_split(trace, planner.config.holdout_every)
        prompts = [trace.requests[i].prompt for i in test] or [trace.requests[0].prompt]
        cycle = iter(range(10**9))
        pick = lambda: prompts[next(cycle) % len(prompts)]  # noqa: E731
        emb = embed(prompts[:1])
        sizes = planner.nbytes()
        torch.set_num_threads(1)  # see casmoe/planner/threads.py
        timings = {
            "embed": lambda: embed([pick()]),
            "eam_query": lambda: planner.matcher.query(emb),
            "eap": lambda: planner._predictor_answers([pick()], emb),  # linear: from the embedding
            "planner_predict": lambda: planner.predict(pick() + f" #{next(cycle)}"),  # novel: embed + gate
        }
        repeats = {"embed": 100, "eam_query": 2000, "eap": 200, "planner_predict": 100}
        measured: dict[str, float] = {}
        for name, fn in timings.items():
            measured[f"{name}_p50_ms"], measured[f"{name}_cpu_p50_ms"] = p50_ms(fn, repeat=repeats[name])
        records.append(
            {
                "trace": path.name,
                "geometry": trace.geometry.describe(),
                "indexed_prompts": len(planner.matcher),
                "fit_s": fit_s,
                **measured,
                "eam_bytes": sizes["eam"],
                "eap_bytes": sizes["eap"],
                "planner_state_mib": sum(sizes.values()) / 2**20,
                "planner_rss_delta_mib": rss_planner,
                "sentence_model_param_mib": model_bytes / 2**20,
                "sentence_model_rss_delta_mib": rss_model - rss0,
                "loadavg_1m": os.getloadavg()[0],
            }
        )
    return records


# ---- quality: ablation and epsilon curve -----------------------------------------------------

VARIANTS: dict[str, PlannerConfig] = {
    "CasMoE (EAM + EAP, weighted EP, SimCSE)": PlannerConfig(),
    "EAP without SimCSE (alpha = 0)": PlannerConfig(eap=EAPConfig(alpha=0.0)),
    "count labels instead of router weights": PlannerConfig(weighted=False),
}


def quality(paths: list[Path], ablation: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in paths:
        trace = load_trace(path)
        rows: dict[str, dict[str, float]] = {}
        curve: list[dict[str, float]] = []
        fits: dict[str, float] = {}
        for name, cfg in list(VARIANTS.items())[: None if ablation else 1]:
            planner, fits[name] = timed_fit(path, trace, cfg)
            ev = evaluate(planner, trace)
            res = ev.to_dict()
            if name.startswith("CasMoE"):
                rows.update({m: res[m] for m in METHODS})
                curve = ev.epsilon_curve([i / 20 for i in range(21)])
                with tempfile.TemporaryDirectory() as tmp:  # serving mutates the index: use a copy
                    planner.save(tmp)
                    online = serve_online(load_planner(tmp), trace)
                online_scores = score(online, ev.truth, ev.counts, ev.k)
                rows[f"cascade + online buffer (C={cfg.buffer})"] = {**online_scores, "requests": len(online)}
            else:
                rows[f"{name}: eap"] = res["eap"]
                rows[f"{name}: cascade"] = res["cascade"]
        out[path.name] = {"rows": rows, "curve": curve, "fit_s": fits, "geometry": trace.geometry.describe()}
    return out


# ---- policies --------------------------------------------------------------------------------

POLICIES = ("ondemand", "lru", "semoe", "casmoe", "belady")


def policies(paths: list[Path], simulate: bool) -> list[dict[str, Any]]:
    records = []
    for path in paths:
        trace = load_trace(path)
        planner, _ = timed_fit(path, trace, PlannerConfig())
        _, test_idx = heldout_split(trace, planner.config.holdout_every)
        test = trace.subset(test_idx)  # serve only prompts the planner never saw
        g = trace.geometry
        sim = _simulator(g) if simulate else None
        with tempfile.TemporaryDirectory() as tmp:
            planner.save(tmp)
            runs = [(p, {}) for p in POLICIES] + [("casmoe", {"predictor": "exact"})]
            for slots in range(g.top_k, 2 * g.top_k + 1):
                cap = Capacity(slots)
                for name, opts in runs:
                    opts = {"planner": tmp} if name == "casmoe" and not opts else opts
                    label = "casmoe-oracle" if opts.get("predictor") == "exact" else name
                    cache = get_policy(name).create(g, cap, trace=test, **opts)
                    rec = {"trace": path.name, "policy": label, "slots_per_layer": slots}
                    rec["hit_rate"] = replay(test, cache).stats.hit_rate
                    if sim is not None:
                        res = sim(test, get_policy(name), cap, opts)
                        rec["decode_tokens_per_s"] = res.decode_tokens_per_s
                        rec["sim_hit_rate"] = res.stats.hit_rate
                        rec["sim_model"] = res.model
                    records.append(rec)
    return records


def _simulator(geometry) -> Callable[..., Any] | None:
    """The simulator on the seed paper's box with the first preset of the trace's routing shape,
    at that preset's bf16 expert sizes: a tiny model's trace then answers "this routing on the
    real model's sizes" (its own 100 KB experts would make every policy look free)."""
    try:
        from casmoe.geometry import Quant
        from casmoe.presets import load_presets
        from casmoe.sim.passes.driver import run_trace
        from casmoe.sim.passes.assembly import Run
        from casmoe.sim.box.hardware import load_profile
        from casmoe.sim.cost.machine import Machine
    except ImportError:
        return None
    shape = (geometry.layers, geometry.experts, geometry.top_k)
    presets = [p for p in load_presets().values() if (p.geometry.layers, p.geometry.experts, p.geometry.top_k) == shape]
    if not presets:
        return None
    machine = Machine(presets[0], load_profile("rtx4090x4"), quant=Quant.BF16)
    return lambda trace, policy, cap, opts: run_trace(Run(trace, policy, cap, machine, options=opts))


# ---- markdown --------------------------------------------------------------------------------


def md_table(records: list[dict[str, Any]], columns: list[str]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in records]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("section", choices=["latency", "quality", "policies", "all"])
    ap.add_argument("--trace", action="append", help="trace path (repeatable); default: the shipped traces present")
    ap.add_argument("--no-sim", action="store_true", help="policies: replay hit rates only")
    ap.add_argument("--no-ablation", action="store_true", help="quality: the default planner only")
    ap.add_argument("--json", type=Path, help="also write the raw records here")
    args = ap.parse_args()
    paths = shipped_traces(args.trace)
    if not paths:
        raise SystemExit("no traces found")
    data: dict[str, Any] = {}
    if args.section in ("latency", "all"):
        data["latency"] = latency(paths)
        print(md_table(data["latency"], list(data["latency"][0])))
    if args.section in ("quality", "all"):
        data["quality"] = quality(paths, ablation=not args.no_ablation)
        for name, q in data["quality"].items():
            print(f"\n### {name} ({q['geometry']}), held-out prompts\n")
            rows = [{"method": m, **r} for m, r in q["rows"].items()]
            print(md_table(rows, ["method", "recall_at_k", "coverage_at_2k", "requests"]))
            print("\nfit seconds: " + ", ".join(f"{k}: {v:.0f}" for k, v in q["fit_s"].items()))
            print("\nepsilon curve:\n")
            print(md_table(q["curve"], ["epsilon", "eam_share", "recall_at_k", "coverage_at_2k"]))
    if args.section in ("policies", "all"):
        data["policies"] = policies(paths, simulate=not args.no_sim)
        sim = "decode_tokens_per_s" in data["policies"][0]
        print()
        cols = ["trace", "policy", "slots_per_layer", "hit_rate"] + ["decode_tokens_per_s", "sim_model"] * sim
        print(md_table(data["policies"], cols))
    if args.json:
        args.json.write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()

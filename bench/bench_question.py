"""The CasMoE question on a realistic trace: does prompt-level prediction beat popularity and
reactive caching, in-split and on tasks the planner never saw?

    python bench/bench_question.py --trace traces/tiny-mixtral.npz --json out.json \
        [--settings insplit,quote,arithmetic,...] [--no-sim]

Settings: `insplit` fits on the trace's `meta["splits"]` train requests and scores its heldout
ones; a task name T is leave-one-task-out: fit on the train requests of every other task, score
every request of T (train and heldout: the planner saw none of them). Each setting fits a
planner with the `casmoe planner fit` defaults (timed), then reports

- recall@k / coverage@2k (casmoe/planner/evaluate.py) of eam, eap, cascade and the baselines of
  the fit data (global popularity, per-task popularity: the fit data's mean pattern of the
  request's task, i.e. global popularity for an unseen task, random); two references that are
  not methods: `same_task_others` (mean pattern of the *evaluated* task's other evaluated
  requests: what knowing the task perfectly would give, the ceiling of a task-level predictor)
  and the cascade blended with global popularity (`blend_w`: (1 - w) cascade + w popularity);
- hit rate (replay) and simulated decode tokens/s (rtx4090x4, the real model's bf16 expert sizes
  of the trace's shape) on the evaluated requests for casmoe with the fitted planner, casmoe with
  the exact-pattern oracle (the ceiling of any prompt-level predictor), lru, lfu, semoe, belady,
  sch and ondemand at k, 1.5k and 2k slots per layer.

Records are appended to `--json` after every setting, so a long run keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

from bench_planner import _simulator  # noqa: E402

from casmoe.cache import Capacity  # noqa: E402
from casmoe.planner import EAPConfig, PlannerConfig, fit_planner  # noqa: E402
from casmoe.planner.evaluate import score  # noqa: E402
from casmoe.planner.patterns import Phase, expert_patterns, normalise  # noqa: E402
from casmoe.policies import get_policy  # noqa: E402
from casmoe.replay import replay  # noqa: E402
from casmoe.trace import Trace  # noqa: E402

POLICIES = ("ondemand", "lru", "lfu", "semoe", "sch", "belady", "casmoe", "casmoe-oracle")
BLENDS = (0.25, 0.5, 0.75)


def split(trace: Trace, setting: str) -> tuple[list[int], list[int]]:
    """(fit, evaluated) request indices of a setting (see the module docstring)."""
    labels = trace.meta["splits"]
    if setting == "insplit":
        return [i for i, s in enumerate(labels) if s == "train"], [i for i, s in enumerate(labels) if s == "heldout"]
    fit = [i for i, (r, s) in enumerate(zip(trace.requests, labels)) if s == "train" and r.task != setting]
    return fit, [i for i, r in enumerate(trace.requests) if r.task == setting]


def same_task_others(test: Trace) -> np.ndarray:
    """Per evaluated request, the mean normalised decode pattern of the other evaluated requests
    of its task (leave-one-out; its own pattern is never used)."""
    pats = normalise(expert_patterns(test, Phase.DECODE, True)).astype(np.float64)
    tasks = np.array([r.task for r in test.requests])
    out = np.empty_like(pats)
    for t in set(tasks):
        idx = np.flatnonzero(tasks == t)
        total = pats[idx].sum(axis=0)
        for i in idx:
            out[i] = (total - pats[i]) / max(len(idx) - 1, 1)
    return out


def accuracy(planner, test: Trace) -> dict[str, dict[str, float]]:
    cfg = planner.config
    answers = planner.answers([r.prompt for r in test.requests])
    preds = {"eam": answers.eam, "eap": answers.eap, "cascade": answers.cascade(cfg.epsilon)}
    preds.update(planner.fit_data.baselines(test))
    preds["same_task_others"] = same_task_others(test)
    for w in BLENDS:
        preds[f"blend_w{w}"] = (1 - w) * preds["cascade"] + w * preds["popularity"]
    truth = expert_patterns(test, Phase.DECODE, weighted=True)
    counts = expert_patterns(test, Phase.DECODE, weighted=False)
    k = planner.geometry.top_k
    out = {name: score(p, truth, counts, k) for name, p in preds.items()}
    out["cascade"]["eam_share"] = float(np.mean(answers.similarity > cfg.epsilon))
    return out


def policies(planner, test: Trace, simulate: bool) -> list[dict[str, Any]]:
    g = test.geometry
    sim = _simulator(g) if simulate else None
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        planner.save(tmp)
        for slots in sorted({g.top_k, (3 * g.top_k) // 2, 2 * g.top_k}):
            cap = Capacity(slots)
            for label in POLICIES:
                name = "casmoe" if label.startswith("casmoe") else label
                opts: dict[str, Any] = {"casmoe": {"planner": tmp}, "casmoe-oracle": {"predictor": "exact"}}.get(label, {})
                cache = get_policy(name).create(g, cap, trace=test, **opts)
                rec: dict[str, Any] = {"policy": label, "slots_per_layer": slots}
                rec["hit_rate"] = replay(test, cache).stats.hit_rate
                if sim is not None:
                    res = sim(test, get_policy(name), cap, opts)
                    rec["decode_tokens_per_s"] = res.decode_tokens_per_s
                    rec["sim_model"] = res.model
                records.append(rec)
    return records


def run_setting(trace: Trace, setting: str, simulate: bool, epochs: int) -> dict[str, Any]:
    fit_idx, test_idx = split(trace, setting)
    fit, test = trace.subset(fit_idx), trace.subset(test_idx)
    fit.meta.pop("splits", None)  # the fit subset is all fit data (holdout_every=0)
    load0 = os.getloadavg()[0]
    t = time.perf_counter()
    planner = fit_planner(fit, PlannerConfig(holdout_every=0, eap=EAPConfig(epochs=epochs)))
    fit_s = time.perf_counter() - t
    t = time.perf_counter()
    acc = accuracy(planner, test)
    pol = policies(planner, test, simulate)
    return {
        "setting": setting,
        "fit_requests": len(fit_idx),
        "eval_requests": len(test_idx),
        "eval_decode_tokens": int(sum(r.tokens - r.prefill for r in test.requests)),
        "epochs": epochs,
        "fit_s": fit_s,
        "eval_s": time.perf_counter() - t,
        "loadavg_1m_start": load0,
        "loadavg_1m_end": os.getloadavg()[0],
        "accuracy": acc,
        "policies": pol,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--settings", help="comma-separated: insplit and/or task names (default: insplit, then every task)")
    ap.add_argument("--no-sim", action="store_true", help="replay hit rates only")
    ap.add_argument("--epochs", type=int, default=EAPConfig().epochs, help="EAP epochs (default: the fit default)")
    ap.add_argument("--json", type=Path, required=True, help="records are appended here after every setting")
    args = ap.parse_args()
    trace = Trace.load(args.trace)
    tasks = sorted({r.task for r in trace.requests}, key=lambda t: -sum(r.task == t for r in trace.requests))
    settings = args.settings.split(",") if args.settings else ["insplit", *tasks]
    done: list[dict[str, Any]] = json.loads(args.json.read_text()) if args.json.exists() else []
    for setting in settings:
        if any(d["setting"] == setting for d in done):
            continue
        rec = {"trace": args.trace.name, **run_setting(trace, setting, not args.no_sim, args.epochs)}
        done.append(rec)
        args.json.write_text(json.dumps(done, indent=2))
        acc = rec["accuracy"]
        print(
            f"{args.trace.name} {setting}: fit {rec['fit_s']:.0f}s eval {rec['eval_s']:.0f}s "
            f"cascade {acc['cascade']['recall_at_k']:.3f} popularity {acc['popularity']['recall_at_k']:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()

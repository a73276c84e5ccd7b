"""The CasMoE question on a realistic trace: does prompt-level prediction beat popularity and
reactive caching, in-split and on tasks the planner never saw?

    python bench/bench_question.py --trace traces/tiny-mixtral.npz --json out.json \
        [--settings insplit,quote,arithmetic,...] [--no-sim] [--planners DIR]
    python bench/bench_question.py --trace traces/tiny-mixtral.npz --improve --planners DIR --json improve.json
    python bench/bench_question.py --markdown out.json [improve.json]      # the RESULTS.md tables

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

`--improve` reads the planners a run kept (`--planners DIR`) and tries the cheap improvements
the issue names, with no refit (records in `--json`, one per setting):

- per-layer: recall@k per layer of cascade and popularity, and the best of the two per layer
  chosen *on the evaluated data* (an optimistic bound on any per-layer calibration);
- the request's own prefill routing as the decode prediction (known once the prompt has run,
  before decode: how much of decode's routing the prompt's routing already shows), alone and
  averaged with the cascade;
- gate-blended popularity prior: (1 - w) cascade + w popularity with w = 1 - similarity of the
  matcher's best match (an unfamiliar prompt leans on popularity);
- decode-time adaptation (`AdaptiveCasMoE`): evicts by (1 - a) planner score + a share of the
  layer's accesses each expert took so far in the request; hit rates by replay (the planner's
  answers precomputed, no online buffer; a = 0 is casmoe under the same conditions);
- decode-time adaptation across requests (`carry`: the previous requests' counts, decayed by
  0.9 per request, stay in the blend: what LFU learns of a stream);
- the online buffer on the unseen task: its requests served in trace order, each joining the
  planner's buffer after its answer (C = 30), at the fit epsilon 0.8 and lower ones that let
  the matcher answer from the task's served prompts (recall; and hit rate with a = 0.8).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

from bench_planner import _simulator  # noqa: E402

from casmoe.cache import Capacity  # noqa: E402
from casmoe.planner import EAPConfig, PlannerConfig, fit_planner  # noqa: E402
from casmoe.planner.evaluate import evaluate, score  # noqa: E402
from casmoe.planner.patterns import Phase, expert_patterns, normalise  # noqa: E402
from casmoe.policies import get_policy  # noqa: E402
from casmoe.policies.casmoe import CasMoE, PlannerPredictor  # noqa: E402
from casmoe.replay import replay  # noqa: E402
from casmoe.trace import Trace  # noqa: E402
from casmoe.trace_io import load_trace  # noqa: E402

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
    """`casmoe planner eval`'s scores (every request of `test`: the planner was fitted on
    another trace), the cascade's matcher share and the two references of the docstring."""
    ev = evaluate(planner, test)
    out = ev.scores
    out["cascade"]["eam_share"] = float(np.mean(ev.answers.similarity > ev.epsilon))
    out["same_task_others"] = score(same_task_others(test), ev.truth, ev.counts, ev.k)
    cascade, pop = ev.answers.cascade(ev.epsilon), planner.fit_data.baselines(test)["popularity"]
    for w in BLENDS:
        out[f"blend_w{w}"] = score((1 - w) * cascade + w * pop, ev.truth, ev.counts, ev.k)
    return out


def policies(folder: Path, test: Trace, simulate: bool) -> list[dict[str, Any]]:
    """Replay (and simulate) every policy; `casmoe` loads the planner saved in `folder` afresh
    for each run (serving feeds its online buffer)."""
    g = test.geometry
    sim = _simulator(g) if simulate else None
    records = []
    for slots in sorted({g.top_k, (3 * g.top_k) // 2, 2 * g.top_k}):
        cap = Capacity(slots)
        for label in POLICIES:
            name = "casmoe" if label.startswith("casmoe") else label
            opts: dict[str, Any] = {"casmoe": {"planner": str(folder)}, "casmoe-oracle": {"predictor": "exact"}}.get(label, {})
            cache = get_policy(name).create(g, cap, trace=test, **opts)
            rec: dict[str, Any] = {"policy": label, "slots_per_layer": slots}
            rec["hit_rate"] = replay(test, cache).stats.hit_rate
            if sim is not None:
                res = sim(test, get_policy(name), cap, opts)
                rec["decode_tokens_per_s"] = res.decode_tokens_per_s
                rec["sim_model"] = res.model
            records.append(rec)
    return records


class AdaptiveCasMoE(CasMoE):
    """casmoe evicting by a blend of the planner's scores and the request's own access shares so
    far at that layer (a bench-only subclass: it runs the Python hooks, not the compiled twin)."""

    name = "casmoe-adapt"

    def __init__(self, *args: Any, adapt: float, carry: float = 0.0, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.adapt, self.carry = adapt, carry

    def prefetch_request(self, request) -> list[int]:
        """`carry` > 0 keeps that share of the previous requests' access counts (decayed per
        request): the stream's recent popularity, which LFU also learns. Not for a planner that
        observes served patterns (they would include the carried counts)."""
        kept = self._served * self.carry
        chosen = super().prefetch_request(request)
        self._served += kept
        return chosen

    def victim(self, layer: int, candidates) -> int:
        e = self.geometry.experts
        served, scores, last, a = self._served, self._scores, self._last, self.adapt
        total = served[layer * e : (layer + 1) * e].sum() or 1.0
        return min(candidates, key=lambda x: ((1 - a) * scores[x] + a * served[x] / total, last[x]))


ADAPT = (0.0, 0.8)
ONLINE_EPSILONS = (0.8, 0.5, 0.3)
CARRY = 0.9


def improve(folder: Path, trace: Trace, setting: str) -> dict[str, Any]:
    """The no-refit improvements of the module docstring, for one kept planner."""
    from casmoe.planner import load_planner
    from casmoe.planner.evaluate import _top, serve_online

    planner = load_planner(folder)
    test = trace.subset(split(trace, setting)[1])
    g, k = test.geometry, test.geometry.top_k
    ev = evaluate(planner, test)
    answers, truth, counts = ev.answers, ev.truth, ev.counts
    cascade = answers.cascade(ev.epsilon)
    pop = planner.fit_data.baselines(test)["popularity"]
    live = (truth > 0).any(-1)  # [N, L]

    def per_layer(pred: np.ndarray) -> np.ndarray:
        hit = (_top(pred, k) & _top(truth, k) & (truth > 0)).sum(-1) / np.minimum((truth > 0).sum(-1), k).clip(1)
        return np.array([hit[live[:, layer], layer].mean() for layer in range(g.layers)])

    pl_c, pl_p = per_layer(cascade), per_layer(pop)
    w = (1.0 - answers.similarity).clip(0, 1)[:, None, None]
    prefill = normalise(expert_patterns(test, Phase.PREFILL, True))
    out: dict[str, Any] = {
        "setting": setting,
        "per_layer_cascade": pl_c.tolist(),
        "per_layer_popularity": pl_p.tolist(),
        "layers_cascade_better": int((pl_c > pl_p).sum()),
        "per_layer_best_bound": float(np.maximum(pl_c, pl_p).mean()),
        "similarity_mean": float(answers.similarity.mean()),
        "gate_blend": score((1 - w) * cascade + w * pop, truth, counts, k),
        "cascade": ev.scores["cascade"],
        "popularity": ev.scores["popularity"],
        "prefill_pattern": score(prefill, truth, counts, k),
        "cascade_plus_prefill": score(0.5 * cascade + 0.5 * prefill, truth, counts, k),
    }
    for eps in ONLINE_EPSILONS:  # served in trace order, each observed after its answer (buffer C)
        online = load_planner(folder)
        online.config = replace(online.config, epsilon=eps)
        out[f"online_eps{eps}"] = score(serve_online(online, test), truth, counts, k)
    preds = {r.prompt: c for r, c in zip(test.requests, cascade)}
    sim = _simulator(g)
    hits = []
    for slots in ((3 * k) // 2, 2 * k):  # at k slots every policy holds the running token's experts
        cap = Capacity(slots)
        for a in ADAPT:
            opts = {"predictor": lambda r: preds[r.prompt], "adapt": a}
            rec = {"policy": f"casmoe-adapt{a}", "slots_per_layer": slots}
            rec["hit_rate"] = replay(test, AdaptiveCasMoE.create(g, cap, **opts)).stats.hit_rate
            if slots == 2 * k and sim is not None:
                rec["decode_tokens_per_s"] = sim(test, AdaptiveCasMoE, cap, opts).decode_tokens_per_s
            hits.append(rec)
        opts = {"predictor": lambda r: preds[r.prompt], "adapt": 0.8, "carry": CARRY}
        cache = AdaptiveCasMoE.create(g, cap, **opts)
        hits.append({"policy": "casmoe-adapt0.8-carry", "slots_per_layer": slots, "hit_rate": replay(test, cache).stats.hit_rate})
        for eps in ONLINE_EPSILONS[1:]:
            predictor = PlannerPredictor(str(folder), g)
            predictor.planner.config = replace(predictor.planner.config, epsilon=eps)
            cache = AdaptiveCasMoE.create(g, cap, predictor=predictor, adapt=0.8)
            rec = {"policy": f"casmoe-online{eps}-adapt0.8", "slots_per_layer": slots}
            hits.append({**rec, "hit_rate": replay(test, cache).stats.hit_rate})
    out["adapt"] = hits
    return out


def run_setting(trace: Trace, setting: str, simulate: bool, epochs: int, folder: Path) -> dict[str, Any]:
    """Fit (saved to `folder`), score, replay and simulate one setting."""
    fit_idx, test_idx = split(trace, setting)
    fit, test = trace.subset(fit_idx), trace.subset(test_idx)
    load0 = os.getloadavg()[0]
    t = time.perf_counter()
    planner = fit_planner(fit, PlannerConfig(holdout_every=0, eap=EAPConfig(epochs=epochs)))
    fit_s = time.perf_counter() - t
    planner.save(folder)
    t = time.perf_counter()
    acc = accuracy(planner, test)
    pol = policies(folder, test, simulate)
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
    ap.add_argument("--improve", action="store_true", help="try the no-refit improvements on kept --planners")
    ap.add_argument("--planners", type=Path, help="keep the fitted planners here, one folder per setting (default: temporary)")
    args = ap.parse_args()
    trace = load_trace(args.trace)
    tasks = sorted({r.task for r in trace.requests}, key=lambda t: -sum(r.task == t for r in trace.requests))
    settings = args.settings.split(",") if args.settings else ["insplit", *tasks]
    done: list[dict[str, Any]] = json.loads(args.json.read_text()) if args.json.exists() else []
    if args.improve:
        for setting in settings:
            folder = args.planners / f"{args.trace.stem}-{setting}"
            if (folder / "planner.json").exists() and not any(d["setting"] == setting for d in done):
                done.append({"trace": args.trace.name, **improve(folder, trace, setting)})
                args.json.write_text(json.dumps(done, indent=2))
                print(f"{args.trace.name} {setting}: improve done", flush=True)
        return
    for setting in settings:
        if any(d["setting"] == setting for d in done):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            folder = (args.planners or Path(tmp)) / f"{args.trace.stem}-{setting}"
            rec = {"trace": args.trace.name, **run_setting(trace, setting, not args.no_sim, args.epochs, folder)}
        done.append(rec)
        args.json.write_text(json.dumps(done, indent=2))
        acc = rec["accuracy"]
        print(
            f"{args.trace.name} {setting}: fit {rec['fit_s']:.0f}s eval {rec['eval_s']:.0f}s "
            f"cascade {acc['cascade']['recall_at_k']:.3f} popularity {acc['popularity']['recall_at_k']:.3f}",
            flush=True,
        )


# ---- markdown (`--markdown MAIN.json [IMPROVE.json]`) ----------------------------------------


def _cell(acc: dict[str, dict[str, float]], name: str) -> str:
    return f"{acc[name]['recall_at_k']:.3f} / {acc[name]['coverage_at_2k']:.3f}"


ACC_ROWS = ("cascade", "eam", "eap", "popularity", "task_popularity", "same_task_others", "blend_w0.5", "random")


def markdown(main_json: Path, improve_json: Path | None) -> str:
    runs = json.loads(main_json.read_text())
    trace = runs[0]["trace"]
    loto = [r for r in runs if r["setting"] != "insplit"]
    out = [f"#### {trace}: recall@k / coverage@2k\n"]
    cols = [f"{r['setting']} ({r['eval_requests']})" for r in runs]
    out.append("| method | " + " | ".join(cols) + " |")
    out.append("|---|" + "---|" * len(runs))
    for name in ACC_ROWS:
        out.append(f"| {name} | " + " | ".join(_cell(r["accuracy"], name) for r in runs) + " |")
    lead = [r["accuracy"]["cascade"]["recall_at_k"] - r["accuracy"]["popularity"]["recall_at_k"] for r in runs]
    out.append("| **cascade - popularity (recall)** | " + " | ".join(f"**{x:+.3f}**" for x in lead) + " |")
    if loto:
        mean = np.mean(lead[1:] if runs[0]["setting"] == "insplit" else lead)
        out.append(f"\nLeave-one-task-out, mean over {len(loto)} tasks of cascade - popularity recall@k: {mean:+.3f}")
    out.append(f"\n#### {trace}: hit rate / simulated decode tok/s ({runs[0]['policies'][0].get('sim_model', '-')} sizes)\n")
    slots = sorted({p["slots_per_layer"] for p in runs[0]["policies"]})
    for title, group in (("in-split (heldout)", runs[:1]), (f"leave-one-task-out, mean over {len(loto)} tasks", loto)):
        if not group or (title.startswith("in") and group[0]["setting"] != "insplit"):
            continue
        out.append(f"{title}:\n")
        out.append("| policy | " + " | ".join(f"{c} slots/layer" for c in slots) + " |")
        out.append("|---|" + "---|" * len(slots))
        for pol in POLICIES:
            cells = []
            for c in slots:
                recs = [p for r in group for p in r["policies"] if p["policy"] == pol and p["slots_per_layer"] == c]
                hit = np.mean([p["hit_rate"] for p in recs])
                tps = np.mean([p.get("decode_tokens_per_s", np.nan) for p in recs])
                cells.append(f"{hit:.3f} / {tps:.3g}")
            out.append(f"| {pol} | " + " | ".join(cells) + " |")
        out.append("")
    if loto:
        out.append("casmoe - max(lru, lfu) hit rate per unseen task:\n")
        out.append("| task (requests) | " + " | ".join(f"{c} slots" for c in slots) + " | oracle - max(lru, lfu) at 2k |")
        out.append("|---|" + "---|" * (len(slots) + 1))
        for r in loto:
            hit = {(p["policy"], p["slots_per_layer"]): p["hit_rate"] for p in r["policies"]}
            d = [hit["casmoe", c] - max(hit["lru", c], hit["lfu", c]) for c in slots]
            o = hit["casmoe-oracle", slots[-1]] - max(hit["lru", slots[-1]], hit["lfu", slots[-1]])
            out.append(f"| {r['setting']} ({r['eval_requests']}) | " + " | ".join(f"{x:+.3f}" for x in d) + f" | {o:+.3f} |")
    fits = ", ".join(f"{r['setting']} {r['fit_s']:.0f} s (load {r['loadavg_1m_start']:.1f})" for r in runs)
    out.append(f"\nfit times: {fits}")
    if improve_json is not None and improve_json.exists():
        out.append(_improve_markdown(json.loads(improve_json.read_text()), runs))
    return "\n".join(out)


def _improve_markdown(recs: list[dict[str, Any]], runs: list[dict[str, Any]]) -> str:
    main = {r["setting"]: r for r in runs}
    recs = sorted(recs, key=lambda r: r["setting"] != "insplit")
    slots = sorted({a["slots_per_layer"] for a in recs[0]["adapt"]})  # k itself is not run
    acc_cols = {
        "cascade": lambda r: r["cascade"]["recall_at_k"],
        "gate blend": lambda r: r["gate_blend"]["recall_at_k"],
        "per-layer best (bound)": lambda r: r["per_layer_best_bound"],
        "layers where cascade > pop": lambda r: r["layers_cascade_better"],
        "prefill pattern": lambda r: r["prefill_pattern"]["recall_at_k"],
        "cascade + prefill": lambda r: r["cascade_plus_prefill"]["recall_at_k"],
        **{f"online eps {e}": (lambda r, e=e: r[f"online_eps{e}"]["recall_at_k"]) for e in ONLINE_EPSILONS},
        "popularity": lambda r: r["popularity"]["recall_at_k"],
    }
    hit_cols = [("casmoe (a = 0)", "casmoe-adapt0.0"), ("adapt 0.8", "casmoe-adapt0.8"),
                (f"adapt 0.8 carry {CARRY}", "casmoe-adapt0.8-carry")]
    hit_cols += [(f"online eps {e} + adapt 0.8", f"casmoe-online{e}-adapt0.8") for e in ONLINE_EPSILONS[1:]]

    def hit_row(r: dict[str, Any]) -> list[float]:
        hit = {(a["policy"], a["slots_per_layer"]): a["hit_rate"] for a in r["adapt"]}
        base = {(p["policy"], p["slots_per_layer"]): p["hit_rate"] for p in main[r["setting"]]["policies"]}
        return [hit[key, c] for c in slots for _, key in hit_cols] + [max(base["lru", c], base["lfu", c]) for c in slots]

    def fmt(v: float) -> str:
        return str(v) if isinstance(v, int) else f"{v:.3f}"

    loto = [r for r in recs if r["setting"] != "insplit"]
    out = ["\nno-refit improvements, recall@k:\n", "| setting | " + " | ".join(acc_cols) + " |"]
    out.append("|---|" + "---|" * len(acc_cols))
    for r in recs:
        out.append(f"| {r['setting']} | " + " | ".join(fmt(f(r)) for f in acc_cols.values()) + " |")
    means = [float(np.mean([f(r) for r in loto])) for f in acc_cols.values()]
    out.append(f"| **LOTO mean ({len(loto)})** | " + " | ".join(f"**{m:.3f}**" for m in means) + " |")
    names = [f"{n} @{c}" for c in slots for n, _ in hit_cols] + [f"max(lru, lfu) @{c}" for c in slots]
    out += ["\nno-refit improvements, hit rate (replay; planner answers precomputed except online):\n"]
    out.append("| setting | " + " | ".join(names) + " |")
    out.append("|---|" + "---|" * len(names))
    for r in recs:
        out.append(f"| {r['setting']} | " + " | ".join(fmt(v) for v in hit_row(r)) + " |")
    means = np.mean([hit_row(r) for r in loto], axis=0)
    out.append(f"| **LOTO mean ({len(loto)})** | " + " | ".join(f"**{m:.3f}**" for m in means) + " |")
    tps = [(a["policy"], a["slots_per_layer"], a["decode_tokens_per_s"]) for r in loto for a in r["adapt"] if "decode_tokens_per_s" in a]
    for pol in sorted({t[0] for t in tps}):
        v = [t[2] for t in tps if t[0] == pol]
        out.append(f"\n{pol} at {slots[-1]} slots, simulated decode tok/s, LOTO mean: {np.mean(v):.3g}")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--markdown":
        print(markdown(Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None))
    else:
        main()

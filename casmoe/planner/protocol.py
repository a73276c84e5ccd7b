"""The fair protocol for a fitted cascade: every score on requests the planner never saw, every
hyperparameter chosen on the fit data alone (`casmoe planner bench`).

Settings, on one trace with task labels (and `meta["splits"]`, else the held-out rule of
casmoe/planner/planner.py):

- `insplit`: fit on the fit split, score its held-out requests;
- `loto:T` (leave-one-task-out, for every task T): fit on the fit split less task T, score every
  request of T (fit and held out alike: the planner saw none);
- `mixed:T`: the `loto:T` planner on one stream in which T's requests alternate with the
  held-out requests of the other tasks (one unseen task among seen ones);
- `domain:NAME`: the `insplit` planner on every request of another trace of the same routing
  shape (held-out-domain evaluation traces).

Hyperparameters (the trajectory stage's `horizon`, over `grid`, and the policy's `fallback`,
off or on) are chosen per setting on a
declared validation split of that setting's own fit data: the `VALID_FOLDS` validation folds
(`validation_folds`: whole tasks) whose routing is least like the rest of the fit data's
(`unlike_first`: the unseen task is the setting that matters), each scored by replayed casmoe hit rate at the first
capacity with a planner fitted on the rest, the choice by their mean; the record names the
folds' tasks and sizes. Evaluation
tasks never enter the choice: they are not in the fit data.

Each setting reports recall@k / coverage@2k (casmoe/planner/evaluate.py: the cascade, the
trajectory stage after prefill, the fit data's popularity), replay hit rates of casmoe (the
fitted planner, as served), of `casmoe_static` (the same planner with `update=False`: the
request-start prediction pinned, the seed's policy), LRU and LFU, and the starred oracles
(`CEILINGS`) at each capacity, and, given a `simulate` callable
(the CLI passes the simulator: `casmoe/` does not import it), simulated decode tokens/s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from casmoe.cache import Capacity
from casmoe.planner import load_planner
from casmoe.planner.config import PlannerConfig, PlannerError
from casmoe.planner.evaluate import evaluate
from casmoe.planner.fitdata import FitData
from casmoe.planner.patterns import expert_patterns, normalise
from casmoe.planner.planner import (
    Embeddings,
    Planner,
    embed_prompts,
    fit_planner,
    fit_prompt_stages,
    heldout_split,
    validation_folds,
)
from casmoe.planner.trajectory import fit_trajectory
from casmoe.policies import get_policy
from casmoe.replay import replay
from casmoe.trace import Trace

BASELINES = ("lru", "lfu")
CEILINGS = (("belady*", "belady", {}), ("casmoe_exact*", "casmoe", {"predictor": "exact"}))
"""Oracles scored beside every setting (starred: they read the scored requests' own routing),
so that a missed target can be read against what is reachable: Belady's MIN, the best any
eviction can do without prefetching, and casmoe serving each request's own decode pattern as
its prediction, the best any prompt-level prediction can give this policy."""
Simulate = Callable[[Trace, str, Capacity, dict[str, Any]], float]
"""(trace, policy name, capacity, options) -> simulated decode tokens/s."""


@dataclass(frozen=True)
class Setting:
    name: str
    fit: tuple[int, ...]  # request indices of the main trace fitted on
    scored: Trace  # the requests scored, in serving order
    planner_of: str  # the setting whose planner serves it (mixed and domain reuse one)


def settings(trace: Trace, config: PlannerConfig, eval_traces: Sequence[tuple[str, Trace]] = (), only: Sequence[str] = ()) -> list[Setting]:
    """Every setting of the module docstring, in that order (`only`: these names)."""
    fit, held = heldout_split(trace, config.holdout_every or 5)
    tasks = sorted({r.task for r in trace.requests if r.task is not None})
    out = [Setting("insplit", tuple(fit), trace.subset(held), "insplit")]
    for t in tasks if len(tasks) >= 2 else []:
        others = tuple(i for i in fit if trace.requests[i].task != t)
        unseen = [i for i, r in enumerate(trace.requests) if r.task == t]
        out.append(Setting(f"loto:{t}", others, trace.subset(unseen), f"loto:{t}"))
    for t in tasks if len(tasks) >= 2 else []:
        unseen = [i for i, r in enumerate(trace.requests) if r.task == t]
        seen = [i for i in held if trace.requests[i].task != t]
        stream = [i for pair in zip(unseen, seen) for i in pair] + unseen[len(seen):] + seen[len(unseen):]
        out.append(Setting(f"mixed:{t}", tuple(i for i in fit if trace.requests[i].task != t), trace.subset(stream), f"loto:{t}"))
    for name, other in eval_traces:
        g, h = trace.geometry, other.geometry
        if (g.layers, g.experts, g.top_k) != (h.layers, h.experts, h.top_k):
            raise PlannerError(f"evaluation trace {name} has {h.describe()}, the fit trace {g.describe()}")
        out.append(Setting(f"domain:{name}", tuple(fit), other, "insplit"))
    if only:
        unknown = [n for n in only if n not in {s.name for s in out}]
        if unknown:
            raise PlannerError(f"unknown setting {unknown[0]!r}; this trace has: {', '.join(s.name for s in out)}")
        out = [s for s in out if s.name in only]  # a reused planner is fitted from the setting's own fit indices
    return out


def _hit_rate(trace: Trace, policy: str, cap: Capacity, options: dict[str, Any]) -> float:
    return replay(trace, get_policy(policy).create(trace.geometry, cap, trace=trace, **options)).stats.hit_rate


MAX_VALID = 120
VALID_FOLDS = 2
"""Validation folds a choice is scored on (each a whole-task fold, scored by a planner fitted on
the rest): one task can favour what another refutes (the fallback helps on a task unlike the fit
data and costs a little on one like it; bench/RESULTS.md, "How the planner's defaults were chosen")."""
FALLBACK = (False, True)  # `casmoe[fallback=...]` candidates, chosen on validation with the horizon


def choose(
    part: Trace, config: PlannerConfig, grid: Sequence[int], cap: Capacity, folder: Path, max_valid: int = MAX_VALID,
    embeddings: Embeddings | None = None, valid_folds: int = VALID_FOLDS,
) -> dict[str, Any]:
    """The grid value of `horizon`, and whether the policy runs with `fallback` (LFU's order
    where the learned map proves wrong on the request), with the best mean casmoe hit rate over
    the `valid_folds` validation folds of `part` (the fit data) least like the rest
    (`unlike_first`; each fold's first `max_valid` requests, scored by a planner fitted on the
    other folds); with what data chose them."""
    folds = unlike_first(validation_folds(part, config.folds), _patterns(part, config))
    horizons = list(grid) or [config.horizon]
    if len(folds) < 2:
        return {"horizon": horizons[0], "fallback": False, "chosen_on": "nothing (one fold)"}

    scores: dict[tuple[int, bool], list[float]] = {}
    used = []
    for i, fold in enumerate(folds[:valid_folds]):
        val = fold[:max_valid]
        rest = np.setdiff1d(np.arange(len(part.requests)), fold)
        train, valid = part.subset(rest.tolist()), part.subset(val.tolist())
        stages = fit_prompt_stages(train, config, embeddings=embeddings) if train.has_prompts else None
        fit_data = FitData.of(train, train, _patterns(train, config))
        for h in horizons:
            traj = fit_trajectory(
                train, None if stages is None else stages.answers, horizon=h, cadence=config.cadence,
                neighbours=config.neighbours, seed=config.seed,
            )
            prompt_parts = (stages.matcher, stages.predictor) if stages is not None else (None, None)
            planner = Planner(train.geometry, replace(config, horizon=h), *prompt_parts, fit_data, stages and stages.gate, traj)
            sub = folder / f"fold{i}-h{h}"
            planner.save(sub)
            for fallback in FALLBACK:
                scores.setdefault((h, fallback), []).append(
                    _hit_rate(valid, "casmoe", cap, {"planner": str(sub), "fallback": fallback}))
        tasks = sorted({r.task for r in valid.requests if r.task is not None})
        used.append(f"{len(val)} requests ({', '.join(tasks) or 'no task labels'}), planner fitted on the other {len(rest)}")
    mean = {hf: float(np.mean(v)) for hf, v in scores.items()}
    # ties: the earlier horizon, then no fallback
    best = max(mean, key=lambda hf: (mean[hf], -horizons.index(hf[0]), -FALLBACK.index(hf[1])))
    return {
        "horizon": best[0],
        "fallback": best[1],
        "chosen_on": f"{len(used)} validation fold(s) of the fit data (those least like the rest): " + "; ".join(used),
        "validation_hit_rate": {f"{h}{'+fallback' if fb else ''}": s for (h, fb), s in mean.items()},
    }


def unlike_first(folds: list[np.ndarray], patterns: np.ndarray) -> list[np.ndarray]:
    """The validation folds ordered by how unlike the rest of the fit data their routing is
    (total variation between the fold's mean expert pattern and the other folds', averaged over
    layers; the most unlike first, ties in fold order). Why: the settings that matter most are
    tasks the planner never saw, and a choice scored on folds like the rest of the fit data
    cannot see what a guard against unlike tasks is worth (bench/RESULTS.md, "How the planner's
    defaults were chosen": on
    in-distribution folds the fallback's candidates differed by 0.0001-0.0012 and the choice
    went against it on the unseen tasks where it pays)."""
    def distance(i: int) -> float:
        rest = np.concatenate([f for j, f in enumerate(folds) if j != i])
        a, b = patterns[folds[i]].mean(axis=0), patterns[rest].mean(axis=0)  # [L, E], rows sum 1
        return float(0.5 * np.abs(a - b).sum(axis=-1).mean())

    if len(folds) < 2:
        return list(folds)
    order = sorted(range(len(folds)), key=lambda i: (-distance(i), i))
    return [folds[i] for i in order]


def _patterns(part: Trace, config: PlannerConfig) -> np.ndarray:
    return normalise(expert_patterns(part, config.phase, config.weighted))


def run(
    trace: Trace, config: PlannerConfig, slots: Sequence[int], folder: Path, *, eval_traces: Sequence[tuple[str, Trace]] = (),
    grid: Sequence[int] = (), only: Sequence[str] = (), simulate: Simulate | None = None,
) -> Iterator[dict[str, Any]]:
    """One record per setting (see the module docstring), as each finishes; planners are kept
    under `folder/<setting>`."""
    caps = [Capacity(s) for s in slots]
    planners: dict[str, tuple[Path, dict[str, Any], float]] = {}
    known: dict[str, np.ndarray] = {}  # every fit here embeds the same prompts: once
    if trace.has_prompts:
        prompts = sorted({r.prompt for r in trace.requests})
        known = dict(zip(prompts, embed_prompts(prompts, config.embedding)))
    for s in settings(trace, config, eval_traces, only):
        if s.planner_of not in planners:
            part = trace.subset(list(s.fit))
            cfg = replace(config, holdout_every=0, exclude_tasks=())
            t0 = time.perf_counter()
            chosen = choose(part, cfg, list(grid), caps[0], folder / "choose" / s.planner_of.replace(":", "-"), embeddings=known)
            cfg = replace(cfg, horizon=int(chosen["horizon"]))
            planner = fit_planner(part, cfg, embeddings=known)
            fit_s = time.perf_counter() - t0
            path = folder / s.planner_of.replace(":", "-")
            planner.save(path)
            planners[s.planner_of] = (path, chosen, fit_s)
        path, chosen, fit_s = planners[s.planner_of]

        ev = evaluate(load_planner(path), s.scored)
        rec: dict[str, Any] = {
            "setting": s.name, "fit_requests": len(s.fit), "scored_requests": len(s.scored.requests),
            "fit_and_choose_s": round(fit_s, 1), **chosen,
            "accuracy": ev.to_dict(),
        }
        rows = []
        for cap in caps:
            row: dict[str, Any] = {"slots_per_layer": cap.slots}
            runs = [("casmoe", "casmoe", {"planner": str(path), "fallback": chosen["fallback"]}),
                    ("casmoe_static", "casmoe", {"planner": str(path), "update": False})]
            for label, name, opts in [*runs, *((b, b, {}) for b in BASELINES), *CEILINGS]:
                row[label] = _hit_rate(s.scored, name, cap, opts)
                if simulate is not None and label != "casmoe_static":
                    row[f"{label}_tok_s"] = simulate(s.scored, name, cap, opts)
            rows.append(row)
        rec["policies"] = rows
        yield rec

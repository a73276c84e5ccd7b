"""How well a planner predicts decode experts on held-out prompts, against simple baselines.

Metrics, per held-out request and MoE layer (layers with no decode tokens are skipped):

- `recall_at_k`: |predicted top-k ∩ true top-k| / k, where the true top-k are the k experts of
  highest router-weighted decode pattern (the experts decode actually leaned on) and k is the
  model's top_k; averaged over layers, then requests.
- `coverage_at_2k`: share of decode accesses (token-layer selections, all of them) that fall
  on the predicted top-2k experts of their layer: what a per-layer prefetch of 2k slots
  would have served.

Methods: `eam` (matcher alone), `eap` (predictor alone), `cascade` (gated at epsilon), and
baselines fitted on the same fit split: `popularity` (mean normalised pattern),
`task_popularity` (mean per task label of the trace; requests of unseen or missing tasks fall
back to `popularity`; it reads the task label, which the planner never sees), `random`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from casmoe.planner.patterns import Phase, expert_patterns, normalise, request_pattern
from casmoe.planner.planner import Answers, Planner, PlannerError, heldout_split
from casmoe.trace import Trace

METHODS = ("eam", "eap", "cascade", "popularity", "task_popularity", "random")


def _top(scores: np.ndarray, b: int) -> np.ndarray:
    """Bool mask [N, L, E] of each layer's `b` highest scores (ties: lower expert id)."""
    idx = np.argsort(-scores, axis=-1, kind="stable")[..., :b]
    mask = np.zeros(scores.shape, dtype=bool)
    np.put_along_axis(mask, idx, True, axis=-1)
    return mask


def recall_at_k(pred: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Mean over requests of the mean over decoded layers of top-k overlap / k."""
    hit = (_top(pred, k) & _top(truth, k) & (truth > 0)).sum(-1)  # [N, L]
    denom = np.minimum((truth > 0).sum(-1), k)  # a layer with one decode token has k experts
    live = denom > 0
    per_layer = np.divide(hit, denom, out=np.zeros(hit.shape), where=live)
    per_req = np.divide(per_layer.sum(-1), live.sum(-1), out=np.zeros(len(pred)), where=live.any(-1))
    return float(per_req[live.any(-1)].mean()) if live.any() else 0.0


def coverage_at(pred: np.ndarray, counts: np.ndarray, b: int) -> float:
    """Share of all decode accesses landing on each layer's predicted top-`b` experts."""
    total = counts.sum()
    return float((counts * _top(pred, b)).sum() / total) if total else 0.0


def baselines(fit: Trace, test: Trace, phase: Phase, weighted: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Popularity, per-task popularity and random scores [N_test, L, E]."""
    g = fit.geometry
    pats = normalise(expert_patterns(fit, phase, weighted))
    pop = pats.mean(axis=0)
    tasks: dict[str, list[int]] = {}
    for i, r in enumerate(fit.requests):
        if r.task is not None:
            tasks.setdefault(r.task, []).append(i)
    per_task = {t: pats[idx].mean(axis=0) for t, idx in tasks.items()}
    n = len(test.requests)
    rng = np.random.default_rng(seed)
    return {
        "popularity": np.broadcast_to(pop, (n, g.layers, g.experts)),
        "task_popularity": np.stack([per_task.get(r.task, pop) for r in test.requests]) if n else pop[None][:0],
        "random": rng.random((n, g.layers, g.experts)),
    }


def score(pred: np.ndarray, truth: np.ndarray, counts: np.ndarray, k: int) -> dict[str, float]:
    return {"recall_at_k": recall_at_k(pred, truth, k), "coverage_at_2k": coverage_at(pred, counts, 2 * k)}


@dataclass(frozen=True)
class Evaluation:
    """Scores of every method on the held-out requests, plus the raw answers for curves."""

    k: int
    epsilon: float
    scores: dict[str, dict[str, float]]
    answers: Answers
    truth: np.ndarray  # router-weighted decode patterns [N, L, E]
    counts: np.ndarray  # decode selection counts [N, L, E]

    def epsilon_curve(self, epsilons: Sequence[float]) -> list[dict[str, float]]:
        """Per epsilon: share of prompts the matcher answers, and the cascade's accuracy."""
        out = []
        for eps in epsilons:
            share = float(np.mean(self.answers.similarity > eps)) if len(self.truth) else 0.0
            scores = score(self.answers.cascade(eps), self.truth, self.counts, self.k)
            out.append({"epsilon": float(eps), "eam_share": share, **scores})
        return out

    def to_dict(self) -> dict[str, Any]:
        """One entry per method (pandas: `DataFrame.from_dict(d, orient="index")`)."""
        n = len(self.truth)
        share = float(np.mean(self.answers.similarity > self.epsilon)) if n else 0.0
        out: dict[str, Any] = {}
        for name in METHODS:
            entry: dict[str, Any] = {**self.scores[name], "k": self.k, "requests": n}
            if name == "cascade":
                entry.update(epsilon=self.epsilon, eam_share=share)
            out[name] = entry
        return out


def evaluate(
    planner: Planner, trace: Trace, epsilon: float | None = None, progress: bool = False, seed: int = 0
) -> Evaluation:
    """Score the planner and the baselines on the trace's held-out requests."""
    planner.check(trace)
    cfg = planner.config
    fit_idx, test_idx = heldout_split(trace, cfg.holdout_every)
    if not test_idx:
        raise PlannerError(
            "no held-out requests: the planner was fitted on every request (holdout_every=0) or the "
            "trace's split labels hold none out; refit with --holdout-every N to evaluate"
        )
    if not trace.has_prompts:
        raise PlannerError("evaluation needs prompt text for every request")
    fit, test = trace.subset(fit_idx), trace.subset(test_idx)
    answers = planner.answers([r.prompt for r in test.requests], progress=progress)
    eps = cfg.epsilon if epsilon is None else epsilon
    preds = {"eam": answers.eam, "eap": answers.eap, "cascade": answers.cascade(eps)}
    preds.update(baselines(fit, test, cfg.phase, cfg.weighted, seed))
    truth = expert_patterns(test, Phase.DECODE, weighted=True)
    counts = expert_patterns(test, Phase.DECODE, weighted=False)
    k = planner.geometry.top_k
    scores = {name: score(preds[name], truth, counts, k) for name in METHODS}
    return Evaluation(k, eps, scores, answers, truth, counts)


def serve_online(planner: Planner, trace: Trace) -> np.ndarray:
    """Cascade answers [N, L, E] for the held-out requests served in order, each observed after
    its answer (the online buffer: with C = 30 a prompt helps the ones 30 or more after it).
    Mutates `planner`'s index; pass a freshly loaded one."""
    planner.check(trace)
    _, test_idx = heldout_split(trace, planner.config.holdout_every)
    cfg = planner.config
    out = []
    for i in test_idx:
        r = trace.requests[i]
        out.append(planner.predict(r.prompt))
        planner.observe(r.prompt, request_pattern(r, trace.geometry, cfg.phase, cfg.weighted))
    return np.stack(out) if out else np.zeros((0, trace.geometry.layers, trace.geometry.experts), np.float32)

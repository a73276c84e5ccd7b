"""How well a planner predicts decode experts on held-out prompts, against simple baselines.

Metrics, per held-out request and MoE layer (layers with no decode tokens are skipped):

- `recall_at_k`: |predicted top-k ∩ true top-k| / k, where the true top-k are the k experts of
  highest router-weighted decode pattern (the experts decode actually leaned on) and k is the
  model's top_k; averaged over layers, then requests.
- `coverage_at_2k`: share of decode accesses (token-layer selections, all of them) that fall
  on the predicted top-2k experts of their layer: what a per-layer prefetch of 2k slots
  would have served.

Methods: `eam` (matcher alone), `eap` (predictor alone), `cascade` (the confidence gate's blend,
or the seed's epsilon rule for planners before it or when `epsilon` is given), `trajectory`
(the trajectory stage once the request's prefill has run, before any decode token: the
cascade's answer refined by the request's own prefill routing and the path match; the stream
features read the fit data's popularity), and the
baselines of the planner's own fit data (casmoe/planner/fitdata.py, never the evaluated trace's):
`popularity` (mean normalised pattern), `task_popularity` (mean pattern of the request's task in
the fit data; it reads the task label, which the planner never sees; for a task the fit data
lacks it has nothing to go on and equals `popularity`), `random`.

Which requests are scored: on the planner's fit trace, those it was not fitted on (the held-out
split and any excluded task); on any other trace of the same routing shape, every request.
The scope says how many scored requests of another trace share a prompt with the fit data.
`holdout_task` keeps only one task's requests, and must be a task the planner never saw
(leave-one-task-out: `casmoe planner fit --exclude-task T`, then `eval --holdout-task T`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from casmoe.planner.fitdata import fingerprint
from casmoe.planner.patterns import Phase, expert_patterns, request_pattern
from casmoe.planner.planner import Answers, Planner, PlannerError, fit_split
from casmoe.planner.trajectory import after_prefill
from casmoe.trace import Trace

METHODS = ("eam", "eap", "cascade", "trajectory", "popularity", "task_popularity", "random")
PROMPT_METHODS = ("eam", "eap", "cascade")


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


def score(pred: np.ndarray, truth: np.ndarray, counts: np.ndarray, k: int) -> dict[str, float]:
    return {"recall_at_k": recall_at_k(pred, truth, k), "coverage_at_2k": coverage_at(pred, counts, 2 * k)}


@dataclass(frozen=True)
class Evaluation:
    """Scores of every method on the held-out requests, plus the raw answers for curves."""

    k: int
    epsilon: float | None  # None: the confidence gate
    scope: str  # which requests were scored, in words
    scores: dict[str, dict[str, float]]
    answers: Answers | None  # None: a prompt-free planner
    truth: np.ndarray  # router-weighted decode patterns [N, L, E]
    counts: np.ndarray  # decode selection counts [N, L, E]

    def epsilon_curve(self, epsilons: Sequence[float]) -> list[dict[str, float]]:
        """Per epsilon: share of prompts the matcher answers, and the cascade's accuracy."""
        out: list[dict[str, float]] = []
        if self.answers is None:
            return out
        for eps in epsilons:
            share = float(np.mean(self.answers.similarity > eps)) if len(self.truth) else 0.0
            scores = score(self.answers.cascade(eps), self.truth, self.counts, self.k)
            out.append({"epsilon": float(eps), "eam_share": share, **scores})
        return out

    def to_dict(self) -> dict[str, Any]:
        """One entry per method (pandas: `DataFrame.from_dict(d, orient="index")`)."""
        n = len(self.truth)
        out: dict[str, Any] = {}
        for name in METHODS:
            if name not in self.scores:
                continue
            entry: dict[str, Any] = {**self.scores[name], "k": self.k, "requests": n}
            if name == "cascade" and self.answers is not None:
                if self.epsilon is None:
                    w = self.answers.gate.matcher_weight(self.answers.similarity) if n else np.zeros(0)
                    entry.update(gate="confidence", eam_weight=float(w.mean()) if n else 0.0)
                else:
                    share = float(np.mean(self.answers.similarity > self.epsilon)) if n else 0.0
                    entry.update(epsilon=self.epsilon, eam_share=share)
            out[name] = entry
        return out


def scored_requests(planner: Planner, trace: Trace, holdout_task: str | None = None) -> tuple[list[int], str]:
    """Indices of the requests an evaluation scores (see the module docstring), and in words."""
    planner.check(trace)
    fit = planner.fit_data
    if fit is None:
        raise PlannerError(
            "this planner folder predates stored fit baselines, so it cannot be evaluated; refit it with casmoe planner fit"
        )
    n, same = len(trace.requests), fit.trace == fingerprint(trace)
    if same:
        fitted = set(fit_split(trace, planner.config))
        idx, scope = [i for i in range(n) if i not in fitted], "held-out requests of the fit trace"
    else:
        idx, scope = list(range(n)), "every request of a trace the planner was not fitted on"
    if holdout_task is not None:
        if holdout_task in fit.tasks:
            raise PlannerError(
                f"the planner was fitted on task {holdout_task!r}; for a leave-one-task-out score fit "
                f"with --exclude-task {holdout_task}"
            )
        idx = [i for i in idx if trace.requests[i].task == holdout_task]
        if not idx:
            tasks = ", ".join(sorted({str(r.task) for r in trace.requests}))
            raise PlannerError(f"no request of task {holdout_task!r} to score (the trace's tasks: {tasks})")
        scope = f"task {holdout_task!r}, unseen in the fit data: " + scope
    seen = 0 if same else fit.fitted_prompts(trace, idx)
    if seen:
        scope += f" ({seen} of them with a prompt it was fitted on)"
    if not idx:
        raise PlannerError(
            "no held-out requests: the planner was fitted on every request of this trace (holdout_every=0, "
            "or split labels that hold none out); refit with --holdout-every N or --exclude-task T to evaluate"
        )
    return idx, scope


def evaluate(
    planner: Planner,
    trace: Trace,
    epsilon: float | None = None,
    progress: bool = False,
    seed: int = 0,
    holdout_task: str | None = None,
) -> Evaluation:
    """Score the planner and its fit data's baselines on the trace's scored requests."""
    idx, scope = scored_requests(planner, trace, holdout_task)
    test = trace.subset(idx)
    preds: dict[str, np.ndarray] = dict(planner.fit_data.baselines(test, seed))
    answers = None
    eps = epsilon if epsilon is not None or planner.gate is not None else planner.config.epsilon
    g = planner.geometry
    if planner.serves_prompts:
        if not test.has_prompts:
            raise PlannerError("evaluation needs prompt text for every scored request")
        answers = planner.answers([r.prompt for r in test.requests], progress=progress)
        preds.update(eam=answers.eam, eap=answers.eap, cascade=answers.cascade(eps))
    if planner.trajectory is not None:
        prompt = preds["cascade"] if answers is not None else np.broadcast_to(planner.popularity(), (len(idx), g.layers, g.experts))
        stream = planner.fit_data.popularity * g.experts
        preds["trajectory"] = np.stack(
            [after_prefill(planner.trajectory, r, g, p, stream) for r, p in zip(test.requests, prompt)]
        ) if idx else prompt
    truth = expert_patterns(test, Phase.DECODE, weighted=True)
    counts = expert_patterns(test, Phase.DECODE, weighted=False)
    k = g.top_k
    scores = {name: score(preds[name], truth, counts, k) for name in METHODS if name in preds}
    return Evaluation(k, eps, scope, scores, answers, truth, counts)


def serve_online(planner: Planner, trace: Trace) -> np.ndarray:
    """Cascade answers [N, L, E] for the scored requests (as `evaluate`) served in order, each
    observed after its answer (the online buffer: with C = 30 a prompt helps the ones 30 or more
    after it). Mutates `planner`'s index; pass a freshly loaded one."""
    test_idx, _ = scored_requests(planner, trace)
    if not planner.serves_prompts:
        raise PlannerError("a prompt-free planner has no online buffer to serve")
    cfg = planner.config
    out = []
    for i in test_idx:
        r = trace.requests[i]
        out.append(planner.predict(r.prompt))
        planner.observe(r.prompt, request_pattern(r, trace.geometry, cfg.phase, cfg.weighted))
    return np.stack(out) if out else np.zeros((0, trace.geometry.layers, trace.geometry.experts), np.float32)

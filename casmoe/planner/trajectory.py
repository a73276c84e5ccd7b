"""The trajectory stage: what the request has routed so far predicts what it routes next.

The matcher and the predictor read the prompt; this stage reads the request's own routing,
which a server sees as it runs: the prefill (the union of the prompt tokens' experts per layer,
heaviest first), then every decode token. Two parts, both fitted on the planner's fit data:

- **Path matching** (FineMoE-style): the fit requests' prefill observations and decode patterns
  are stored; a request is matched to them by cosine similarity of its prefill observation, and
  during decode also of its decode pattern so far (the routing path), weighted by how many
  decode tokens back the path; the neighbours' decode patterns, weighted by similarity, are the
  prediction, and the best similarity its confidence. As in FineMoE, a prefetch stops when the
  predicted probability mass reaches one minus that confidence (`prefetch_depth`).
- **A learned map** from what the request has shown to what it uses next: a logistic model of
  "expert e of layer l is routed in the next `horizon` decode tokens" on a handful of features of
  the state (`FEATURES`: recency of its last use at three time scales, its share of this
  request's decode uses, its prefill rank, the stream's access share so far, the prompt-level
  cascade's score, the path match's score, and the *transition* score: how often, in the fit
  data, a decode token that routed the current token's experts of this layer was followed by
  one routing this expert, `transitions`). The features carry the three stages' answers and
  the stream's own frequency, so the fitted weights *are* the gate: each signal counts as much
  as it measured on held-out fit data (trained on out-of-fold answers, never in-sample ones).

The map is fitted where the policy uses it: an eviction during decode token t + 1, at a layer
whose routed experts (of token t + 1) are known and protected, chooses among the others, so a
training row is the state after token t, a candidate not routed by token t + 1 at its layer,
and the label is its use in tokens t + 2 ... t + 1 + `horizon`. (A data look,
bench/bench_casmoe_evictions.py: without the current token's routing casmoe evicted experts
the very next token routes more often than LFU did, 29 % of its victims against Belady's 4 %.)

The casmoe policy evicts the lowest `scores(...)` and re-matches the path at a cadence. A trace
without prompts is served by this stage alone (its prompt feature is the fit data's popularity).
Everything is numpy; on disk it is `trajectory.npz` in the planner folder (no pickle).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from casmoe.geometry import Geometry
from casmoe.npz import read_npz, require
from casmoe.output import atomic_open
from casmoe.planner.config import PlannerError
from casmoe.trace import NOT_COMPUTED, Request, Trace

FILE = "trajectory.npz"
FEATURES = (
    "recent_1", "recent_4", "recent_16", "request_share", "prefill", "stream", "recent_stream", "prompt", "path",
    "transition", "bias",
)
TAUS = (1.0, 4.0, 16.0)
STREAM_CARRY = 0.9
"""Per request, the share of the recent stream's counts that carries over (about ten requests)."""
PATH_T0 = 4.0
"""Decode tokens at which the path so far weighs as much as the prefill in path matching."""
MAX_ROWS = 400_000


def prefill_observation(order: Sequence[Sequence[int]], geometry: Geometry) -> np.ndarray:
    """The prefill as the cache sees it, float64 [L, E]: per layer, expert at rank r of the union
    (heaviest router weight first; `order[l]` flat or per-layer ids) scores exp(-r / k)."""
    L, E, k = geometry.layers, geometry.experts, geometry.top_k
    out = np.zeros((L, E))
    for layer, ids in enumerate(order):
        if len(ids):
            local = np.asarray(ids, dtype=np.int64) % E
            out[layer, local] = np.exp(-np.arange(len(local)) / k)
    return out


def request_prefill(request: Request, geometry: Geometry) -> np.ndarray:
    """`prefill_observation` of a recorded request (zeros without a prompt phase): the rank
    of each expert in its layer's prefill union, ordered as `casmoe.trace.prefill_step` orders
    it (heaviest total router weight first, lower id among equals)."""
    L, E, k = geometry.layers, geometry.experts, geometry.top_k
    topk = request.topk[: request.prefill].astype(np.int64)  # [P, L, k]
    keep = topk != NOT_COMPUTED
    flat = (topk + (np.arange(L, dtype=np.int64) * E)[None, :, None])[keep]
    used = np.bincount(flat, minlength=L * E).reshape(L, E) > 0
    wsum = np.bincount(flat, weights=request.weights[: request.prefill][keep].astype(np.float64), minlength=L * E)
    order = np.argsort(-wsum.reshape(L, E), axis=1, kind="stable")  # [L, E]
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(E)[None, :].repeat(L, 0), axis=1)
    # unused experts rank after every used one, so a used expert's rank is its union position
    return np.where(used, np.exp(-rank / k), 0.0)


def decode_uses(request: Request, geometry: Geometry) -> np.ndarray:
    """Bool [Td, L, E]: which experts each decode token routed to (gaps route none)."""
    L, E = geometry.layers, geometry.experts
    dec = request.topk[request.prefill :].astype(np.int64)  # [Td, L, k]
    out = np.zeros((len(dec), L, E), dtype=bool)
    t, layer, _ = np.nonzero(dec != NOT_COMPUTED)
    out[t, layer, dec[dec != NOT_COMPUTED]] = True
    return out


def _unit(x: np.ndarray) -> np.ndarray:
    """Rows of [N, ...] flattened and scaled to unit length (zero rows stay zero)."""
    flat = x.reshape(len(x), -1).astype(np.float32)
    norm = np.linalg.norm(flat, axis=1, keepdims=True)
    return np.divide(flat, norm, out=np.zeros_like(flat), where=norm > 0)


def _rows(x: np.ndarray) -> np.ndarray:
    """Each layer's row scaled to sum 1 (zero rows stay zero)."""
    total = x.sum(axis=-1, keepdims=True)
    return np.divide(x, total, out=np.zeros_like(x, dtype=np.float64), where=total > 0)


@dataclass
class PathMatcher:
    """Stored requests' prefill observations and decode patterns, matched by routing path."""

    prefill_keys: np.ndarray  # [N, L*E] unit
    decode_keys: np.ndarray  # [N, L*E] unit
    decode: np.ndarray  # [N, L, E] normalised decode patterns
    neighbours: int = 5

    @classmethod
    def build(cls, prefills: np.ndarray, decodes: np.ndarray, neighbours: int = 5) -> PathMatcher:
        return cls(_unit(prefills), _unit(decodes), _rows(decodes).astype(np.float32), neighbours)

    def __len__(self) -> int:
        return len(self.decode)

    def match(self, prefill: np.ndarray, decoded: np.ndarray | None = None, tokens: int = 0, exclude: int = -1) -> tuple[np.ndarray, float]:
        """Prediction [L, E] (rows sum to 1) and confidence (best similarity in [0, 1]) for a
        request whose prefill observation is `prefill` [L, E] and whose first `tokens` decode
        tokens routed the counts `decoded` [L, E]; `exclude` leaves one stored request out."""
        sim = self.prefill_keys @ _unit(prefill[None])[0]
        if tokens and decoded is not None:
            w = tokens / (tokens + PATH_T0)
            sim = (sim + w * (self.decode_keys @ _unit(decoded[None])[0])) / (1.0 + w)
        if 0 <= exclude < len(sim):
            sim[exclude] = -np.inf
        n = min(self.neighbours, int(np.isfinite(sim).sum()))
        if n == 0:
            return np.zeros(self.decode.shape[1:]), 0.0
        top = np.argpartition(-sim, n - 1)[:n]
        w = np.clip(sim[top], 1e-6, None)
        pred = np.tensordot(w / w.sum(), self.decode[top], axes=1)
        return pred, float(max(sim[top].max(), 0.0))


def prefetch_depth(scores: np.ndarray, confidence: float, slots: int) -> int:
    """FineMoE's stopping rule for one layer: the fewest top experts whose share of the
    predicted mass reaches 1 - confidence (an unsure match hedges with more experts, a sure
    one needs few); at least one, at most `slots`."""
    p = np.sort(np.asarray(scores, dtype=np.float64))[::-1]
    total = p.sum()
    if total <= 0:
        return 0
    need = 1.0 - min(max(confidence, 0.0), 1.0)
    return int(min(slots, max(1, np.searchsorted(np.cumsum(p) / total, need) + 1)))


def fit_transitions(uses: Sequence[np.ndarray]) -> np.ndarray:
    """[L, E, E]: per layer, E x P(the next decode token routes e | this one routed c) - 1
    (0 = no information), from consecutive decode tokens of the requests' `decode_uses`
    (one count of smoothing per pair)."""
    L, E = uses[0].shape[1:] if len(uses) else (0, 0)
    counts = np.ones((L, E, E))
    for u in uses:
        if len(u) > 1:
            a, b = u[:-1].astype(np.float32), u[1:].astype(np.float32)
            counts += np.einsum("tlc,tle->lce", a, b)
    return counts / counts.sum(axis=-1, keepdims=True) * E - 1.0


def transition_scores(transitions: np.ndarray, current: np.ndarray) -> np.ndarray:
    """[L, E]: each layer's mean `transitions` row over the experts `current` [L, E] (bool)
    says the running token routed there; 0 for a layer with none known."""
    cur = current.astype(np.float64)
    n = cur.sum(axis=-1, keepdims=True)
    return np.divide(np.einsum("lc,lce->le", cur, transitions), n, out=np.zeros(cur.shape), where=n > 0)


def feature_stack(
    now: int, last: np.ndarray, uses: np.ndarray, prefill: np.ndarray, stream: np.ndarray, recent: np.ndarray,
    prompt: np.ndarray, path: np.ndarray, transition: np.ndarray | float = 0.0,
) -> np.ndarray:
    """Features [..., F] of experts in the state after decode token `now` (0-based; -1 right
    after prefill): `last` their last decode use (-1: only in prefill, -inf: never), `uses` their
    decode uses so far, `prefill` their prefill observation, `stream` and `recent` the stream's
    access share (x E; all of it, and decayed by `STREAM_CARRY` per request), `prompt` and
    `path` the stages' scores (x E), `transition` the `transition_scores` of the token now
    running (0: none known). All arrays broadcast together."""
    age = now - last
    feats = [np.exp(-age / tau) for tau in TAUS]
    feats.append(uses / (now + 1.0) if now >= 0 else np.zeros_like(uses))
    feats += [prefill, stream, recent, prompt, path, np.asarray(transition, dtype=np.float64), np.ones_like(prefill)]
    return np.stack(np.broadcast_arrays(*feats), axis=-1)


def stream_share(counts: np.ndarray) -> np.ndarray:
    """The stream's access counts [L, E] as per-layer shares x E (1 = uniform)."""
    return _rows(counts) * counts.shape[-1]


@dataclass
class Trajectory:
    """Path matcher, the fit data's decode transitions and the learned map's weights (one per
    `FEATURES` entry)."""

    weights: np.ndarray  # [F]
    paths: PathMatcher
    popularity: np.ndarray  # [L, E] normalised: the prompt feature when there is no prompt stage
    horizon: int = 8
    cadence: int = 8
    transitions: np.ndarray | None = None  # [L, E, E] (`fit_transitions`); None: files from before it

    def scores(self, feats: np.ndarray) -> np.ndarray:
        """Log-odds that each expert is used within the next `horizon` decode tokens."""
        return feats @ self.weights

    def save(self, folder: Path) -> None:
        p = self.paths
        with atomic_open(folder / FILE, "wb") as fh:
            np.savez(
                fh, weights=self.weights, prefill_keys=p.prefill_keys, decode_keys=p.decode_keys, decode=p.decode,
                popularity=self.popularity, settings=np.array([self.horizon, self.cadence, p.neighbours], np.int64),
                **({} if self.transitions is None else {"transitions": self.transitions}),
            )

    @classmethod
    def load(cls, folder: Path, layers: int, experts: int) -> Trajectory:
        """Read and check `trajectory.npz` against the planner's geometry and itself (the three
        path arrays hold the same stored requests): a PlannerError naming the file otherwise.
        A file from before the transition feature loads with that feature's weight at 0."""
        where = folder / FILE
        a = read_npz(where, PlannerError)
        n = len(a.get("decode", ()))
        old = "transitions" not in a  # before the transition feature: one weight fewer
        got = {name: require(a, name, shape, kind, str(where), PlannerError) for name, shape, kind in (
            ("weights", (len(FEATURES) - old,), "f"), ("prefill_keys", (n, layers * experts), "f"),
            ("decode_keys", (n, layers * experts), "f"), ("decode", (n, layers, experts), "f"),
            ("popularity", (layers, experts), "f"), ("settings", (3,), "i"),
            *(() if old else (("transitions", (layers, experts, experts), "f"),)))}
        horizon, cadence, neighbours = (int(x) for x in got["settings"])
        if horizon < 0 or cadence < 1 or neighbours < 1:
            raise PlannerError(f"{where}: settings horizon={horizon}, cadence={cadence}, neighbours={neighbours} "
                               "out of range (horizon >= 0, cadence and neighbours >= 1); refit")
        paths = PathMatcher(got["prefill_keys"], got["decode_keys"], got["decode"], neighbours)
        weights = got["weights"].astype(np.float64)
        if old:
            weights = np.insert(weights, FEATURES.index("transition"), 0.0)
        return cls(weights, paths, got["popularity"], horizon, cadence, got.get("transitions"))

    def nbytes(self) -> int:
        p = self.paths
        extra = 0 if self.transitions is None else self.transitions.nbytes
        return int(p.prefill_keys.nbytes + p.decode_keys.nbytes + p.decode.nbytes + self.weights.nbytes + extra)


def after_prefill(traj: Trajectory, request: Request, geometry: Geometry, prompt: np.ndarray, stream: np.ndarray) -> np.ndarray:
    """The learned map's scores [L, E] for `request` once its prefill has run (before any
    decode token): `prompt` the prompt stages' answer [L, E] (rows sum to 1), `stream` the
    stream's access share [L, E] (x E) standing in for both stream features."""
    E = geometry.experts
    pre = request_prefill(request, geometry)
    path = traj.paths.match(pre)[0] * E
    last = np.where(pre > 0, -1.0, -np.inf)
    return traj.scores(feature_stack(-1, last, np.zeros_like(pre), pre, stream, stream, prompt * E, path))


def fit_trajectory(
    part: Trace, prompt_scores: np.ndarray | None, *, horizon: int = 8, cadence: int = 8, neighbours: int = 5,
    seed: int = 0, l2: float = 1e-3,
) -> Trajectory:
    """Fit on the requests of `part` served in order, as one stream. `prompt_scores` [N, L, E]
    are the prompt stages' answers for them *out of fold* (None: no prompt stage; popularity
    stands in). The path feature of a request never matches the request itself."""
    g = part.geometry
    prefills = np.stack([request_prefill(r, g) for r in part.requests])
    uses = [decode_uses(r, g) for r in part.requests]
    decodes = np.stack([u.sum(axis=0) for u in uses]).astype(np.float64)
    paths = PathMatcher.build(prefills, decodes, neighbours)
    popularity = _rows(decodes.mean(axis=0))
    transitions = fit_transitions(uses)
    X, y = _training_rows(part, prefills, uses, paths, transitions, prompt_scores, popularity, horizon, cadence, seed)
    w = _logistic(X, y, l2) if horizon > 0 else _least_squares(X, y.astype(np.float64), l2)
    return Trajectory(w, paths, popularity.astype(np.float32), horizon, cadence, transitions.astype(np.float32))


def _training_rows(
    part: Trace, prefills: np.ndarray, uses: list[np.ndarray], paths: PathMatcher, transitions: np.ndarray,
    prompt_scores: np.ndarray | None, popularity: np.ndarray, horizon: int, cadence: int, seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(features [R, F], label [R]) over the stream, as the module docstring says: in the
    state after decode token t (-1: right after prefill) while token t + 1 runs, for the
    experts an eviction would choose among (each layer's `2 k` most recently used over the
    stream, what an LRU cache of that size holds, less those token t + 1 routes there),
    whether each is routed in the `horizon` tokens after t + 1. Tokens are subsampled to
    keep about `MAX_ROWS` rows."""
    g = part.geometry
    L, E = g.layers, g.experts
    held = min(2 * g.top_k, E)
    total = sum(len(u) for u in uses) * L * held
    keep = min(1.0, MAX_ROWS / max(total, 1))
    rng = np.random.default_rng(seed)
    stream, recent = np.zeros((L, E)), np.zeros((L, E))
    touched = np.full((L, E), -np.inf)  # stream-wide tick of the last use (the LRU order)
    tick = 0
    rows_l = np.arange(L)[:, None]
    X, y = [], []
    for i, (r, u) in enumerate(zip(part.requests, uses)):
        pre = prefills[i]
        prompt = (prompt_scores[i] if prompt_scores is not None else popularity) * E
        share, recent_share = stream_share(stream), stream_share(recent)
        last = np.where(pre > 0, -1.0, -np.inf)
        count = np.zeros((L, E))
        path = paths.match(pre, exclude=i)[0] * E
        if horizon <= 0:
            nxt = _next_use(u)
        tick += 1
        touched[pre > 0] = tick
        for t in range(-1, len(u) - 2):  # the state after token t (-1: after prefill); t + 1 runs
            if t >= 0:
                last[u[t]] = t
                count += u[t]
                tick += 1
                touched[u[t]] = tick
                if (t + 1) % cadence == 0:
                    path = paths.match(pre, count, t + 1, exclude=i)[0] * E
            if rng.random() < keep:
                cand = np.argpartition(-touched, held - 1, axis=1)[:, :held]  # [L, held]
                at = (rows_l, cand)
                running = u[t + 1]
                trans = transition_scores(transitions, running)
                feats = feature_stack(
                    t, last[at], count[at], pre[at], share[at], recent_share[at], prompt[at], path[at], trans[at]
                )
                free = ~running[at]  # the running token's experts are protected, not candidates
                X.append(feats[free])
                if horizon > 0:
                    y.append(u[t + 2 : t + 2 + horizon].any(axis=0)[at][free])
                else:  # -log(1 + tokens to the next use), 64 when none in this request
                    y.append(-np.log1p(nxt[t + 2][at][free]))
        counts = (pre > 0) + u.sum(axis=0)
        stream += counts
        recent = recent * STREAM_CARRY + counts
    if not X:
        return np.zeros((0, len(FEATURES))), np.zeros(0, bool)
    return np.concatenate(X), np.concatenate(y)


def _next_use(u: np.ndarray, cap: float = 64.0) -> np.ndarray:
    """[Td + 1, L, E]: from token t on, tokens until each expert's next use (`cap` if none)."""
    out = np.full((len(u) + 1, *u.shape[1:]), cap)
    for t in range(len(u) - 1, -1, -1):
        out[t] = np.where(u[t], 0.0, np.minimum(out[t + 1] + 1, cap))
    return out


def _least_squares(X: np.ndarray, y: np.ndarray, l2: float) -> np.ndarray:
    F = X.shape[1]
    reg = l2 * len(X) * np.eye(F)
    reg[-1, -1] = 0.0
    return np.linalg.solve(X.T @ X + reg, X.T @ y)


def _logistic(X: np.ndarray, y: np.ndarray, l2: float, iterations: int = 25) -> np.ndarray:
    """L2-regularised logistic regression by Newton's method (F is small)."""
    F = X.shape[1]
    w = np.zeros(F)
    if not len(X):
        w[FEATURES.index("recent_1")] = 1.0  # nothing to learn from: behave like LRU
        return w
    yf = y.astype(np.float64)
    reg = l2 * len(X) * np.eye(F)
    reg[-1, -1] = 0.0  # the bias is not shrunk
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(X @ w)))
        grad = X.T @ (p - yf) + reg @ w
        hess = (X * (p * (1 - p))[:, None]).T @ X + reg
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-4:
            break
    return w

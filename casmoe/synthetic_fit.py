"""Fit the synthetic generator to a recorded trace, and generate requests of the same shape.

`casmoe trace synth --like REAL` answers "what would N requests of this model look like" with
the routing model of `casmoe.synthetic` (Gumbel-top-k draws plus stickiness), its parameters
measured on the trace instead of chosen:

- **groups**: one per task label (or one for an unlabelled trace), each with its share of
  requests, its (prefill, decode) lengths and its prompts (task affinity);
- **popularity** per group and layer, of decode tokens: log-weights fitted so that the
  generator's per-token *inclusion* frequencies equal the trace's (Gumbel-top-k without
  replacement flattens a plain `log(count)`: the hottest expert cannot be drawn twice);
- **drift**: every token adds to its group's log-weights a Gaussian AR(1) latent per expert
  (scale `drift`, lag-1 correlation `persistence`), so a request's hot set wanders: local
  working sets are narrower than the whole request's, and with a persistence near 1 each
  request keeps preferring its own experts (per-request affinity). The pair is chosen on a grid
  so that simulated requests of the trace's decode lengths have its reuse-distance profile:
  the share of decode accesses whose LRU stack distance (distinct experts used since the
  expert's last use) is below k, 1.5k, 2k and 4k;
- **stickiness** per layer: the trace's `kept_share` (share of the previous token's experts
  used again), tuned on simulated requests; negative when tokens keep fewer than drifting
  independent draws would (the generator then leaves the previous experts out).

Prompt tokens drift like decode tokens but keep their own stickiness, and route from their
own frequencies per group, widened until a prompt uses as many distinct experts as the
trace's prompts (`prompt_phase`).

Router weights are the trace's mean weight of each routing rank, per layer and phase: real
routers' weights vary little around it (the real traces' per-rank standard deviation is
0.02-0.1), the Gumbel draws' own softmax would be far sharper than real routing, and a
constant per rank keeps a generated file compressible (its expert ids alone cost ~5 bytes per
token-layer at 6 of 128).

**Another k** (`with_top_k`, `casmoe trace synth --like REAL --top-k K`): a router's scores do
not depend on how many experts it takes, and the generator's routing is a ranking of the
experts (Gumbel-top-k over the fitted log-weights plus drift draws the first k of a
Plackett-Luce ranking), so the extrapolation keeps every fitted score and takes the first K of
the same ranking: the per-group log-weights, the drift and its persistence, and the stickiness
per expert (each of the previous token's experts recurs with that probability, now K of them).
Router weights per rank extend the fitted ranks' log-linear decay over rank (or drop the last
ranks) and keep each layer's total weight. Checked on the real Qwen3 trace
(bench/RESULTS.md, "Qwen3-30B-A3B at its native top-8"): fitted on its first 4 ranks, extrapolated to
6, against the real top-6 routing and a fit at 6.

A trace with one group can be given `tasks` synthetic tasks: each relabels a random share
`task_shuffle` of every layer's experts (a permutation among them), so a request's statistics
are those fitted while different tasks prefer different experts, as prompt-level prediction
assumes. That cross-task structure is an assumption, stated in the trace's metadata, not a
measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from casmoe.geometry import Geometry
from casmoe.metrics.srp import segment_stats, srp_from_hist
from casmoe.synthetic import TASKS, SynthError, make_prompt, route_request
from casmoe.trace import NOT_COMPUTED, Request, Trace, expert_counts
from casmoe.workload import SLOT_MULTIPLES, SRP_M, slots_for


@dataclass(frozen=True)
class PhaseRouting:
    """How the tokens of one phase (prompt or decode) route: per-group log-weights [L, E],
    stickiness [L] and the drift of the latent hot set."""

    weights: tuple[np.ndarray, ...]
    stickiness: np.ndarray
    drift: float
    persistence: float
    rank_weights: np.ndarray
    """[L, k] router weight of each routing rank (the trace's mean)."""

    def summary(self) -> dict[str, Any]:
        return {"stickiness": [round(float(x), 4) for x in self.stickiness], "drift": self.drift, "persistence": self.persistence,
                "rank_weights": [round(float(x), 4) for x in self.rank_weights.mean(axis=0)]}

    def route(self, group: int, tokens: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """topk and weights [tokens, L, k] of one request's tokens of this phase."""
        w = self.weights[group]
        topk, _, _ = route_request(w[None] + latent(tokens, w.shape, self.drift, self.persistence, rng), tokens, k, self.stickiness, rng)
        return topk, np.broadcast_to(self.rank_weights, topk.shape).astype(np.float32)

FLOOR = 0.02
"""Pseudo-count of an expert the trace never routes (in tokens of its group)."""
FIT_TOKENS = 2048
"""Monte Carlo draws per iteration of the inclusion fit."""
FIT_ROUNDS = 12
DRIFTS = (0.0, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
SEARCH_DRAWS = 512
SEARCH_TOKENS = 1024
SEARCH_REQUESTS = 16
BISECTIONS = 10
PERSISTENCES = (0.8, 0.9, 0.95, 0.98)


@dataclass(frozen=True)
class Group:
    """The requests of one task (or of the whole trace): their share, lengths and prompts."""

    task: str | None
    share: float
    lengths: np.ndarray  # [n, 2] (prefill, decode) of the group's requests
    prompts: tuple[str, ...]


@dataclass(frozen=True)
class RoutingModel:
    """The fitted generator: groups, and how prompt and decode tokens route (per group)."""

    geometry: Geometry
    groups: tuple[Group, ...]
    prompt: PhaseRouting
    decode: PhaseRouting
    source: str
    prompt_gaps: np.ndarray | None = None
    """Bool [L]: layers the source's engine skipped for every prompt token but the last (the
    synthetic prompts skip them alike, as `NOT_COMPUTED` rows)."""

    def summary(self) -> dict[str, Any]:
        """Plain values for a trace's metadata: what was fitted (not the log-weights)."""
        return {
            "source": self.source,
            "groups": [{"task": g.task, "share": round(g.share, 4), "requests": len(g.lengths)} for g in self.groups],
            **{name: phase.summary() for name, phase in (("prompt", self.prompt), ("decode", self.decode))},
        }


def inclusion(topk: np.ndarray, E: int) -> tuple[np.ndarray, np.ndarray]:
    """Per layer, how many computed tokens route to each expert [L, E], and computed tokens [L]."""
    return expert_counts(topk, E).astype(np.float64), (topk[:, :, 0] >= 0).sum(axis=0).astype(np.float64)


def latent(n: int, shape: tuple[int, ...], scale: float, persistence: float, rng: np.random.Generator) -> np.ndarray:
    """A stationary AR(1) sequence [n, *shape] with standard deviation `scale` and lag-1
    correlation `persistence` (0: independent draws)."""
    out = rng.standard_normal((n, *shape), dtype=np.float32)
    if scale == 0:
        return np.zeros((n, *shape), np.float32)
    step = np.float32(np.sqrt(1 - persistence**2))
    for t in range(1, n):
        out[t] = persistence * out[t - 1] + step * out[t]
    return out * np.float32(scale)


def _draw(w: np.ndarray, k: int, n: int, rng: np.random.Generator, drift: np.ndarray | float = 0.0) -> np.ndarray:
    """`n` Gumbel-top-k draws per layer from log-weights `w[L, E]` (+ `drift[n, L, E]`): ids [n, L, k]."""
    u = rng.random((n, *w.shape), dtype=np.float32)
    z = w[None].astype(np.float32) - np.log(-np.log(np.maximum(u, np.float32(1e-30)))) + drift
    return np.argpartition(-z, k - 1, axis=2)[:, :, :k]


def fit_log_weights(
    counts: np.ndarray, tokens: np.ndarray, k: int, rng: np.random.Generator, spread: float = 0.0,
    draws: int = FIT_TOKENS, rounds: int = FIT_ROUNDS,
) -> np.ndarray:
    """Log-weights [L, E] whose Gumbel-top-k inclusion frequencies match `counts / tokens`,
    averaged over Gaussian log-weight noise of scale `spread` (drift and request spread);
    `rounds` Monte Carlo rounds of `draws` tokens."""
    L, E = counts.shape
    n = np.maximum(tokens, 1)[:, None]
    target = np.maximum(counts, FLOOR) / n
    target *= k / target.sum(axis=1, keepdims=True)  # inclusions sum to k per token
    w = np.log(target)
    for _ in range(rounds):
        noise = latent(draws, (L, E), spread, 0.0, rng)
        got, _ = inclusion(_draw(w, k, draws, rng, noise), E)
        got = (got + FLOOR * 0.1) / (draws + FLOOR * 0.1 * E / k)
        w += 0.7 * (np.log(target) - np.log(got))
        w -= w.max(axis=1, keepdims=True)
    return w


def lag_overlap(topk: np.ndarray, k: int, lag: int) -> np.ndarray:
    """[L] mean share of a token's experts that the token `lag` steps later uses again."""
    a, b = topk[lag:].astype(np.int64), topk[:-lag].astype(np.int64)
    live = (a[:, :, 0] >= 0) & (b[:, :, 0] >= 0)
    shared = (a[:, :, :, None] == b[:, :, None, :]).any(axis=3).sum(axis=2) / k
    with np.errstate(invalid="ignore"):
        return np.where(live, shared, 0).sum(axis=0) / live.sum(axis=0)


def chance_kept(
    w: np.ndarray, k: int, rng: np.random.Generator, drift: float = 0.0, persistence: float = 0.0, draws: int = FIT_TOKENS
) -> np.ndarray:
    """[L] share of a token's experts that the next token, drawn without stickiness, routes again."""
    d = _draw(w, k, draws, rng, latent(draws, w.shape, drift, persistence, rng))
    return lag_overlap(d, k, 1)


def rank_weights(topk: list[np.ndarray], weights: list[np.ndarray], k: int) -> np.ndarray:
    """[L, k] mean router weight of each rank (weights sorted descending) over the computed
    token-layers of token sequences `topk` / `weights` ([T, L, k] each); 1/k where a layer
    has none."""
    L = topk[0].shape[1]
    total, count = np.zeros((L, k)), np.zeros(L)
    for ids, w in zip(topk, weights):
        live = ids[:, :, 0] >= 0  # [T, L]
        total += np.where(live[:, :, None], -np.sort(-w.astype(np.float64), axis=2), 0).sum(axis=0)
        count += live.sum(axis=0)
    return np.where(count[:, None] > 0, total / np.maximum(count, 1)[:, None], 1.0 / k)


def _groups(trace: Trace) -> dict[str | None, list[int]]:
    labels = [r.task for r in trace.requests]
    if len(set(labels)) <= 1:
        return {labels[0] if labels else None: list(range(len(labels)))}
    out: dict[str | None, list[int]] = {}
    for i, t in enumerate(labels):
        out.setdefault(t, []).append(i)
    return out


def stack_distances(topk: np.ndarray) -> np.ndarray:
    """LRU stack distance of every access of a request's routing `topk[T, L, k]`: how many
    distinct experts of the layer were used more recently than this expert's last use (-1:
    first use, -2: gap). Within a token, recency follows routing order, as the cache's
    `on_access` calls do, so a per-layer LRU cache of C >= k slots, walking one token per step,
    hits exactly the accesses whose distance is below C."""
    T, L, k = topk.shape
    ids = topk.astype(np.int64)
    E = int(ids.max()) + 1 if ids.size else 1
    last = np.full((L, E), -1, dtype=np.int64)  # stamp (token * k + slot) of each expert's last use
    rows = np.arange(L)[:, None]
    stamps = np.arange(k)[None, :]
    out = np.empty((T, L, k), dtype=np.int64)
    for t in range(T):
        e = ids[t]  # [L, k]
        live = e >= 0
        seen = last[rows, np.where(live, e, 0)]  # [L, k]
        newer = (last[:, None, :] > seen[:, :, None]).sum(axis=2)
        out[t] = np.where(live, np.where(seen >= 0, newer, -1), -2)
        last[np.broadcast_to(rows, e.shape)[live], e[live]] = np.broadcast_to(t * k + stamps, e.shape)[live]
    return out


def profile(seqs: list[np.ndarray], E: int, k: int) -> np.ndarray:
    """What the drift fit matches, over requests' routing `[T, L, k]`: the share of accesses
    whose LRU stack distance is below C, for the cache sizes C of `casmoe trace stats`
    (`slots_for` each of `SLOT_MULTIPLES`: the LRU curve of the tokens one by one, a fresh cache
    per request), then SRP at m = 16 (how well one expert set serves each 16-token stretch; NaN
    when no request is that long)."""
    d = np.concatenate([stack_distances(x).ravel() for x in seqs])
    d = d[d != -2]
    lru = [float(np.mean((d >= 0) & (d < slots_for(m, k)))) for m in SLOT_MULTIPLES]
    [st] = segment_stats([x.astype(np.int64) for x in seqs], E, [SRP_M])
    return np.array(lru + [float(srp_from_hist(st.hist.sum(axis=(0, 1)), SRP_M).srp)])


def _simulate(w: np.ndarray, stick: np.ndarray, drift: float, rho: float, lengths: list[int], k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Decode routing of requests of the given lengths from log-weights `w` (no prompt)."""
    out = []
    for T in lengths:
        topk, _, _ = route_request(w[None] + latent(T, w.shape, drift, rho, rng), T, k, stick, rng)
        out.append(topk)
    return out


def tune_stickiness(
    w: np.ndarray, kept: np.ndarray, drift: float, rho: float, lengths: list[int], k: int, rng: np.random.Generator, rounds: int = 2
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Stickiness [L] whose simulated requests keep `kept` of the previous token's experts, and
    the last simulation. Starts from `stickiness_for`, which assumes fresh draws independent of
    the kept experts (they are drawn without them), then corrects on simulated requests."""
    chance = chance_kept(w, k, rng, drift, rho, SEARCH_DRAWS)
    stick = stickiness_for(kept, chance)
    scale = np.maximum(np.where(stick >= 0, 1 - chance, chance), 0.05)
    for i in range(rounds):
        sims = _simulate(w, stick, drift, rho, lengths, k, rng)
        if i == rounds - 1:
            break
        got = np.nanmean([lag_overlap(x, k, 1) for x in sims if len(x) > 1], axis=0)
        stick = np.clip(stick + np.nan_to_num(kept - got) / scale, -1.0, 1.0)
    return stick, sims


def fit_drift(
    counts: np.ndarray, tokens: np.ndarray, kept: np.ndarray, lengths: list[int], k: int, target: np.ndarray, rng: np.random.Generator
) -> tuple[float, float]:
    """(drift, persistence) on the grid whose simulated requests best match the `profile` `target`.

    Each candidate gets its own log-weights (coarse Monte Carlo) and stickiness, then requests
    of the trace's decode `lengths` are measured like the trace."""
    live = np.isfinite(target)
    best = (np.inf, 0.0, 0.0)
    for drift in DRIFTS:
        w = fit_log_weights(counts, tokens, k, rng, drift, SEARCH_DRAWS, FIT_ROUNDS // 2)
        for rho in PERSISTENCES if drift else (0.0,):
            _, sims = tune_stickiness(w, kept, drift, rho, lengths, k, rng)
            got = profile(sims, counts.shape[1], k)
            err = float(np.sum((got[live] - target[live]) ** 2))
            if err < best[0]:
                best = (err, drift, rho)
    return best[1], best[2]


def search_lengths(lengths: list[int], tokens: int) -> list[int]:
    """`lengths` repeated until they hold at least `tokens` tokens (zero lengths dropped)."""
    lengths = [int(t) for t in lengths if t > 0][:SEARCH_REQUESTS]
    reps = max(1, -(-tokens // max(sum(lengths), 1)))
    return lengths * reps


def stickiness_for(kept: np.ndarray, chance: np.ndarray) -> np.ndarray:
    """[L] stickiness so that `kept` of the previous token's experts recur, when independent
    draws already recur `chance` of them: keep each with probability s > 0, or, when fewer
    recur than chance gives, leave each out of the next draw with probability -s."""
    up = (kept - chance) / np.maximum(1 - chance, 1e-9)
    down = (kept - chance) / np.maximum(chance, 1e-9)
    return np.clip(np.nan_to_num(np.where(kept >= chance, up, down)), -1.0, 1.0)


def kept_share(seqs: list[np.ndarray], k: int) -> np.ndarray:
    """[L] share of a token's experts the next token uses again, pooled over sequences."""
    num = den = 0.0
    for x in seqs:
        if len(x) > 1:
            v = lag_overlap(x, k, 1)
            live = np.isfinite(v)
            num, den = num + np.where(live, v, 0) * (len(x) - 1), den + live * (len(x) - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.nan_to_num(np.asarray(num / den))


def fit_phase(
    seqs: dict[str | None, list[np.ndarray]], E: int, k: int, rng: np.random.Generator, say: Callable[[str], object], rank_w: np.ndarray
) -> PhaseRouting:
    """Fit one phase's routing to its token sequences per group (see the module docstring), with
    router weights `rank_w` [L, k]; a group without tokens of this phase gets uniform
    log-weights (it never draws any)."""
    everything = [x for group in seqs.values() for x in group if len(x)]
    kept = kept_share(everything, k)
    largest = max(seqs, key=lambda t: sum(len(x) for x in seqs[t]))
    lengths = search_lengths([len(x) for x in seqs[largest]], SEARCH_TOKENS)
    drift, rho = fit_drift(*inclusion(np.concatenate(seqs[largest]), E), kept, lengths, k, profile(everything, E, k), rng)
    weights, sticks, sizes = [], [], []
    for task, group in seqs.items():
        size = sum(len(x) for x in group)
        if not size:
            weights.append(np.zeros((group[0].shape[1], E)))
            continue
        say(f"popularity of {task or 'all requests'}")
        w = fit_log_weights(*inclusion(np.concatenate(group), E), k, rng, drift)
        stick, _ = tune_stickiness(w, kept, drift, rho, search_lengths([len(x) for x in group], FIT_TOKENS), k, rng, 3)
        weights.append(w)
        sticks.append(stick)
        sizes.append(size)
    return PhaseRouting(tuple(weights), np.average(sticks, axis=0, weights=sizes), drift, rho, rank_w)


def union_width(seqs: list[np.ndarray], E: int) -> np.ndarray:
    """[L] mean over sequences of the distinct experts each routes to."""
    return np.mean([(inclusion(x, E)[0] > 0).sum(axis=1) for x in seqs if len(x)], axis=0)


def prompt_phase(
    decode: PhaseRouting, seqs: dict[str | None, list[np.ndarray]], E: int, k: int, rng: np.random.Generator, rank_w: np.ndarray
) -> PhaseRouting:
    """Prompt tokens: the decode tokens' drift, their own stickiness (their own kept share), and
    per group their own frequencies blended with uniform until simulated prompts of the group's
    lengths use as many distinct experts per layer as the trace's. Resampling a few tokens'
    frequencies would narrow a prompt (an expert it used once is drawn ~63% of the time), and a
    prompt's width is what a cache must stream (the replay's prefill step is the union of its
    tokens' experts). Stickiness and blend are fitted in turn, twice."""
    everything = [x for group in seqs.values() for x in group if len(x)]
    kept = kept_share(everything, k)
    stick = decode.stickiness
    weights: list[np.ndarray] = []
    for _ in range(2):
        weights = [_widen(group, E, k, stick, decode, rng) for group in seqs.values()]
        live = [(w, g) for w, g in zip(weights, seqs.values()) if any(len(x) for x in g)]
        w, g = max(live, key=lambda wg: sum(len(x) for x in wg[1]))
        stick, _ = tune_stickiness(w, kept, decode.drift, decode.persistence, search_lengths([len(x) for x in g], FIT_TOKENS), k, rng, 3)
    return replace(decode, weights=tuple(weights), stickiness=stick, rank_weights=rank_w)


def _widen(group: list[np.ndarray], E: int, k: int, stick: np.ndarray, decode: PhaseRouting, rng: np.random.Generator) -> np.ndarray:
    """One group's prompt log-weights: its frequencies blended with uniform until simulated
    prompts are as wide as the group's (bisection per layer)."""
    if not any(len(x) for x in group):
        return np.zeros((len(stick), E))  # no prompt tokens: never drawn
    counts, tokens = inclusion(np.concatenate(group), E)
    f = counts / np.maximum(tokens, 1)[:, None]
    lengths = [len(x) for x in group if len(x)][:SEARCH_REQUESTS]
    want = union_width(group, E)

    def fitted(lam: np.ndarray, draws: int = SEARCH_DRAWS, rounds: int = FIT_ROUNDS // 3) -> np.ndarray:
        blend = (1 - lam)[:, None] * f + lam[:, None] * k / E
        return fit_log_weights(blend * tokens[:, None], tokens, k, rng, decode.drift, draws, rounds)

    lo, hi = np.zeros(len(f)), np.ones(len(f))
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        sims = _simulate(fitted(mid), stick, decode.drift, decode.persistence, lengths, k, rng)
        narrow = union_width(sims, E) < want
        lo, hi = np.where(narrow, mid, lo), np.where(narrow, hi, mid)
    return fitted((lo + hi) / 2, FIT_TOKENS, FIT_ROUNDS)


def prompt_gaps(trace: Trace) -> np.ndarray:
    """Bool [L]: layers that no prompt token but a request's last one computed (llama.cpp-style
    engines skip the last layer there); False for a trace whose prompts have one token."""
    rows = [r.topk[: r.prefill - 1, :, 0] for r in trace.requests if r.prefill > 1]
    if not rows:
        return np.zeros(trace.geometry.layers, dtype=bool)
    return (np.concatenate(rows) < 0).all(axis=0)


def fit(trace: Trace, source: str = "trace", seed: int = 0, progress: Callable[[str], object] | None = None) -> RoutingModel:
    """Measure `trace` and fit the generator to it (see the module docstring)."""
    g = trace.geometry
    if not any(r.decode_tokens for r in trace.requests):
        raise SynthError("--like needs a trace with decode tokens")
    if not any(r.computed[r.prefill :].any() for r in trace.requests):
        raise SynthError("--like needs computed decode routing, but every decode token-layer of this trace is a gap")
    rng = np.random.default_rng(seed)
    say = progress or (lambda _: None)
    parts = _groups(trace)
    reqs = {t: [trace.requests[i] for i in idx] for t, idx in parts.items()}
    every = trace.requests
    say("decode tokens")
    rank_w = rank_weights([r.topk[r.prefill :] for r in every], [r.weights[r.prefill :] for r in every], g.top_k)
    decode = fit_phase({t: [r.topk[r.prefill :] for r in rs] for t, rs in reqs.items()}, g.experts, g.top_k, rng, say, rank_w)
    if any(r.prefill for r in trace.requests):
        say("prompt tokens")
        prompts = {t: [r.topk[: r.prefill] for r in rs] for t, rs in reqs.items()}
        rank_w = rank_weights([r.topk[: r.prefill] for r in every], [r.weights[: r.prefill] for r in every], g.top_k)
        prompt = prompt_phase(decode, prompts, g.experts, g.top_k, rng, rank_w)
    else:
        prompt = decode
    gaps = prompt_gaps(trace)
    groups = tuple(
        Group(
            t,
            len(rs) / len(trace.requests),
            np.array([(r.prefill, r.decode_tokens) for r in rs], dtype=np.int64),
            tuple(r.prompt for r in rs if r.prompt is not None),
        )
        for t, rs in reqs.items()
    )
    return RoutingModel(g, groups, prompt, decode, source, gaps if gaps.any() else None)


def with_tasks(model: RoutingModel, tasks: int, shuffle: float, seed: int) -> RoutingModel:
    """Split a one-group model into `tasks` tasks, each relabelling a share `shuffle` of every
    layer's experts (a random permutation among them, the same for prompt and decode): same
    per-request statistics, different preferred experts per task."""
    if len(model.groups) != 1:
        raise SynthError("--tasks applies to a trace without task labels; this one has its own tasks")
    if not 1 <= tasks <= len(TASKS):
        raise SynthError(f"tasks must be in [1, {len(TASKS)}]")
    if not 0.0 <= shuffle <= 1.0:
        raise SynthError("task shuffle must be in [0, 1]")
    rng = np.random.default_rng(seed)
    L, E = model.decode.weights[0].shape
    perms = []
    for _ in range(tasks):
        perm = np.tile(np.arange(E), (L, 1))
        for layer in range(L):
            chosen = rng.choice(E, size=int(round(shuffle * E)), replace=False)
            perm[layer, chosen] = rng.permutation(chosen)
        perms.append(perm)

    def split(phase: PhaseRouting) -> PhaseRouting:
        return replace(phase, weights=tuple(np.take_along_axis(phase.weights[0], p, axis=1) for p in perms))

    [base] = model.groups
    groups = tuple(Group(TASKS[t], 1.0 / tasks, base.lengths, ()) for t in range(tasks))
    return replace(model, groups=groups, prompt=split(model.prompt), decode=split(model.decode))


def extend_rank_weights(rank_w: np.ndarray, k: int) -> np.ndarray:
    """[L, k] router weight per rank from fitted `rank_w` [L, k0]: the first k ranks, or the k0
    ranks followed by their least-squares log-linear decay over rank; each layer's total kept."""
    L, k0 = rank_w.shape
    if k <= k0:
        out = rank_w[:, :k].astype(np.float64)
    else:
        ranks = np.arange(k0, dtype=np.float64)
        logw = np.log(np.maximum(rank_w.astype(np.float64), 1e-9))
        slope = np.polyfit(ranks, logw.T, 1)[0] if k0 > 1 else np.zeros(L)  # [L]
        slope = np.minimum(slope, 0.0)  # weights never grow with rank
        extra = logw[:, -1:] + slope[:, None] * np.arange(1, k - k0 + 1)[None, :]
        out = np.concatenate([rank_w, np.exp(extra)], axis=1)
    return out * (rank_w.sum(axis=1, keepdims=True) / out.sum(axis=1, keepdims=True))


def with_top_k(model: RoutingModel, k: int) -> RoutingModel:
    """The fitted routing with `k` experts per token (see the module docstring, "Another k")."""
    E = model.geometry.experts
    if not 1 <= k <= E:
        raise SynthError(f"--top-k must be in [1, {E}] for {E} experts, not {k}")

    def phase(ph: PhaseRouting) -> PhaseRouting:
        return replace(ph, rank_weights=extend_rank_weights(ph.rank_weights, k))

    return replace(model, geometry=replace(model.geometry, top_k=k), prompt=phase(model.prompt), decode=phase(model.decode))


def sample(model: RoutingModel, requests: int, seed: int = 0) -> Trace:
    """`requests` requests from the fitted model, reproducible from `seed`."""
    k = model.geometry.top_k
    rng = np.random.default_rng(seed)
    shares = np.array([grp.share for grp in model.groups])
    out = []
    for _ in range(requests):
        i = int(rng.choice(len(shares), p=shares / shares.sum()))
        grp = model.groups[i]
        prefill, decode = (int(x) for x in grp.lengths[rng.integers(len(grp.lengths))])
        pre_topk, pre_w = model.prompt.route(i, prefill, k, rng)
        if model.prompt_gaps is not None and prefill > 1:
            pre_topk[:-1, model.prompt_gaps] = NOT_COMPUTED
            pre_w[:-1, model.prompt_gaps] = 0.0
        dec_topk, dec_w = model.decode.route(i, decode, k, rng)
        if grp.prompts:
            prompt = grp.prompts[rng.integers(len(grp.prompts))]
        else:
            prompt = make_prompt(grp.task, rng) if grp.task in TASKS else None
        out.append(Request(topk=np.concatenate([pre_topk, dec_topk]).astype(np.int16), weights=np.concatenate([pre_w, dec_w]),
                           prefill=prefill, prompt=prompt, task=grp.task))
    return Trace(model.geometry, out, {"source_model": f"synthetic, fitted to {model.source}", "recorded_by": "casmoe.synthetic_fit"})

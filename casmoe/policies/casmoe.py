"""CasMoE: prefetch every layer's predicted experts at request start, then follow the request.

A predictor maps a request's prompt to scores [L, E] (the planner of `casmoe.planner`, or a
test predictor). At request start the policy fetches the highest-scored experts of every layer
within the budget, in layer order so that early layers arrive first; misses load on demand.

Eviction, with a fitted planner (`planner=DIR`, the default `update=True`): the planner's
trajectory stage (casmoe/planner/trajectory.py) scores every resident by the log-odds that it
is routed within the next few decode tokens, from the current prompt-level prediction, the
routing path match (re-matched after prefill and every `cadence` decode tokens, default the
planner's), this request's own use (recency at three time scales, share of its decode tokens,
prefill rank), the stream's access share across requests (what LFU counts) and, during decode,
which experts tend to follow the ones the running token has routed at this layer so far (the
fit data's decode transitions); the lowest is evicted, least recently used among equals. The weights were fitted on held-out fit data, so
a stale guess never outweighs the evidence the request shows. After prefill the policy tops
up every layer with the re-matched prediction's best experts, as deep as the match is unsure
(FineMoE's rule, `trajectory.prefetch_depth`), never evicting more than it brings in
(`prefill_prefetch=False` turns it off; `start_prefetch=False` turns off the request-start
prefetch, leaving an eviction policy: on a link slower than the layers, prefetched copies
delay the demand loads queued behind them). `fallback=True` checks the learned map against
LFU's order on the request's own tokens, as LeCaR (Vietri et al., HotStorage 2018) weighs two
policies by their regret: wherever the two would evict different experts, both are remembered,
and the one the request routes again within `FALLBACK_WINDOW` decode tokens counts against the
policy that chose it; while the map's count exceeds LFU's in this request, LFU's order evicts
(a request unlike the fit data, where the map's features mislead it: leave-one-task-out
arithmetic in bench/RESULTS.md). Counts restart with each request. With `update=False`, or an oracle predictor, the
prediction is fixed for the request and the lowest-scored resident is evicted (the static
policy of the seed paper; that form has a compiled twin, `casmoe/compiled.py`). The
updating form runs its Python hooks; it keeps one request's state, so run it at batch 1.

A request without a prompt, or a planner fitted on a trace without prompts, is served by the
trajectory stage alone (its prompt-level prediction is the fit data's popularity).

Predictors by option: `planner=DIR` (a fitted planner, which also learns online from the
routing each served request showed), `predictor="exact"` (the request's own
decode pattern: an oracle, so the policy then declares it reads the future) or
`predictor="noisy"` (that oracle blended with random scores: `noise` in [0, 1]).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from casmoe.cache import CacheConfigError, ExpertCache
from casmoe.geometry import ExpertId
from casmoe.planner import load_planner
from casmoe.planner.cached import AUTO
from casmoe.planner.patterns import request_pattern
from casmoe.planner.trajectory import FEATURES, STREAM_CARRY, prefetch_depth, stream_share
from casmoe.policies.fitting import PlannerFit
from casmoe.trace import Request
from casmoe.twin import Twin, TwinState

if TYPE_CHECKING:
    from casmoe.planner.trajectory import Trajectory

ExpertScorer = Callable[[Request], np.ndarray]


def lowest_score(mc, expert):
    """The compiled victim order (`Twin.order`) of the static form: the lowest predicted score of
    the running request first (`mc.key`, from `Twin.request_key`), then the least recently touched."""
    return mc.key[expert], mc.last[expert]


FALLBACK_WINDOW = 8
"""`fallback`: a disagreement counts when its victim is routed again within this many decode
tokens (later reuse says little about which choice was right: nearly every victim of any policy
is reused within 32 steps at 2k slots, bench/bench_casmoe_evictions.py)."""


def exact_predictor(geometry) -> ExpertScorer:
    """The request's own decode expert pattern: the best any prompt-level planner can do."""
    return lambda request: request_pattern(request, geometry)


def noisy_predictor(geometry, noise: float, rng: np.random.Generator) -> ExpertScorer:
    """Per layer, (1 - noise) x normalised exact pattern + noise x random scores."""
    if not 0.0 <= noise <= 1.0:
        raise CacheConfigError(f"noise must lie in [0, 1], got {noise}")
    exact = exact_predictor(geometry)

    def predict(request: Request) -> np.ndarray:
        ep = exact(request).astype(np.float64)
        total = ep.sum(axis=1, keepdims=True)
        ep = np.divide(ep, total, out=np.zeros_like(ep), where=total > 0)
        rand = rng.random(ep.shape)
        return (1.0 - noise) * ep + noise * rand / rand.sum(axis=1, keepdims=True)

    return predict


class PlannerPredictor:
    """A fitted planner as a predictor, fed back with what serving each prompt routed to (the
    seed's online update: served prompts wait in the planner's buffer, then join its index)."""

    def __init__(self, path: str, geometry) -> None:
        self.planner = load_planner(path)
        g = self.planner.geometry
        if (g.layers, g.experts, g.top_k) != (geometry.layers, geometry.experts, geometry.top_k):
            raise CacheConfigError(f"planner at {path} was fitted on {g.describe()}, the trace is {geometry.describe()}")

    @property
    def trajectory(self) -> Trajectory | None:
        return self.planner.trajectory

    def __call__(self, request) -> np.ndarray:
        return self.planner.predict(request.prompt)

    def observe(self, prompt: str | None, pattern: np.ndarray) -> None:
        if prompt and pattern.any() and self.planner.serves_prompts:
            self.planner.observe(prompt, pattern)


class CasMoE(ExpertCache):
    name = "casmoe"
    summary = "predicts every layer's experts from the prompt and prefetches them (CasMoE)"
    variant_notes = {
        "planner=auto": "CasMoE with a planner fitted on the trace's train split",
        "planner": "CasMoE with the planner fitted in that folder",
        "predictor=exact": "CasMoE told the request's own routing: its best case, a bound",
        "predictor=noisy": "CasMoE told the request's routing blended with noise, a bound",
    }
    runtime = "mixtral-offloading"  # no runtime of its own: the PyTorch caching one
    fit = PlannerFit()
    variants = ({"planner": AUTO}, {"predictor": "exact"}, {"predictor": "noisy"})
    """The deployable planner (fitted on the trace's train split, or `--planner DIR`), beside the
    two oracle predictors that bracket what a planner can reach."""

    def __init__(
        self, *args, predictor: ExpertScorer, oracle: bool = False, trajectory: Trajectory | None = None,
        cadence: int | None = None, prefill_prefetch: bool = True, start_prefetch: bool = True,
        fallback: bool = False, **kw,
    ) -> None:
        super().__init__(*args, **kw)
        if fallback and trajectory is None:
            raise CacheConfigError("casmoe's fallback checks the updating policy's learned map: it needs planner=DIR "
                                   "(with update=true, the default)")
        self.fallback = fallback
        self.predictor = predictor
        self.needs_future = oracle  # an oracle predictor reads the request's own routing
        self.trajectory = trajectory  # None: the static policy (fixed scores per request)
        self.start_prefetch = start_prefetch
        g = self.geometry
        self._scores = np.zeros(g.total_experts)
        self._last: dict[ExpertId, int] = {}
        self._tick = 0
        self._prompt: str | None = None
        self._served = np.zeros(g.total_experts)  # routed uses seen while serving this request
        self._routing: Sequence[ExpertId] = ()  # the running layer's routed experts
        if trajectory is not None:
            self.cadence = max(1, cadence or trajectory.cadence)
            self.prefill_prefetch = prefill_prefetch
            self._weights = trajectory.weights

            w = float(trajectory.weights[FEATURES.index("transition")])
            self._transition = None if trajectory.transitions is None or not w else w * np.asarray(trajectory.transitions, np.float64)
            self._stream = np.zeros(g.total_experts)  # accesses across requests (LFU's counts)
            self._recent = np.zeros(g.total_experts)  # the same, decayed per request
            self._confidence = 0.0
            self._begin_state(0)
        self.prefetches_per_layer = trajectory is not None

    @classmethod
    def reads_future(cls, options: dict[str, Any]) -> bool:
        """The `exact` and `noisy` predictors read the request's own routing; a planner does not."""
        return options.get("planner") is None and not callable(options.get("predictor"))

    @classmethod
    def create(
        cls,
        geometry,
        capacity,
        *,
        trace: Any = None,
        predictor: str | ExpertScorer | None = None,
        noise: float | None = None,
        planner: str | None = None,
        update: bool = True,
        cadence: int | None = None,
        prefill_prefetch: bool = True,
        start_prefetch: bool = True,
        fallback: bool = False,
        seed: int = 0,
        **kw: Any,
    ) -> ExpertCache:
        if cadence is not None and cadence < 1:
            raise CacheConfigError(f"cadence must be >= 1 decode token, got {cadence}")
        if planner is not None and predictor is not None:
            raise CacheConfigError("casmoe takes planner=DIR (a fitted planner) or predictor=exact|noisy (an oracle), "
                                   "not both")
        if noise is not None and predictor != "noisy":
            raise CacheConfigError("casmoe's noise option shapes the noisy oracle: give predictor=noisy with it")
        if planner is None and (not update or cadence is not None or not prefill_prefetch or fallback):
            raise CacheConfigError("casmoe's update, cadence, prefill_prefetch and fallback options shape a fitted "
                                   "planner's policy: give planner=DIR with them")
        predictor = "exact" if predictor is None and planner is None else predictor
        noise = 0.3 if noise is None else noise
        if planner == AUTO:
            raise CacheConfigError("casmoe[planner=auto] is fitted on the run's trace (replay, simulate, sweep); "
                                   "give planner=DIR, a folder of `casmoe planner fit`, here")
        if planner is not None:
            pp = PlannerPredictor(planner, geometry)
            traj = pp.trajectory if update else None
            return cls(
                geometry, capacity, predictor=pp, trajectory=traj, cadence=cadence, prefill_prefetch=prefill_prefetch,
                start_prefetch=start_prefetch, fallback=fallback, **kw,
            )
        if callable(predictor):
            return cls(geometry, capacity, predictor=predictor, fallback=fallback, **kw)
        if predictor == "exact":
            return cls(geometry, capacity, predictor=exact_predictor(geometry), oracle=True, fallback=fallback, **kw)
        if predictor == "noisy":
            rng = np.random.default_rng(seed)
            return cls(geometry, capacity, predictor=noisy_predictor(geometry, noise, rng), oracle=True,
                       fallback=fallback, **kw)
        raise CacheConfigError(f"casmoe predictor must be 'exact', 'noisy' or a planner=DIR, got {predictor!r}")

    def prefetch_request(self, request) -> list[ExpertId]:
        g, cap = self.geometry, self.capacity
        scores = np.asarray(self.predictor(request), dtype=np.float64)
        if scores.shape != (g.layers, g.experts):
            raise CacheConfigError(f"predictor returned scores of shape {scores.shape}, expected ({g.layers}, {g.experts})")
        self._scores = scores.ravel()
        self._prompt = request.prompt
        self._served[:] = 0
        if self.trajectory is not None:
            self._begin_state(request.prefill)
        if not self.start_prefetch:
            return []
        if cap.per_layer:
            top = np.argsort(-scores, axis=1, kind="stable")[:, : cap.slots]
            chosen = (top + (np.arange(g.layers) * g.experts)[:, None]).ravel()
        else:
            chosen = np.sort(np.argsort(-self._scores, kind="stable")[: cap.slots])  # flat ids sort by layer
        return [int(e) for e in chosen if self._scores[e] > 0]

    # ---- the updating form: the request's state, as the trajectory stage reads it ----------

    def _begin_state(self, prefill: int) -> None:
        N, E = self.geometry.total_experts, self.geometry.experts
        self._step_seen = -1  # the runtime's step index last seen
        self._in_prefill = bool(prefill)
        self._prefill_begun = False
        self._tokens = 0  # decode tokens begun; the current one is _n - 1
        self._decode_last = np.full(N, -np.inf)
        self._decode_uses = np.zeros(N)
        self._prefill = np.zeros(N)
        self._rank = [0] * self.geometry.layers
        self._regret = 0  # this request's misses the learned map's choices caused, minus LFU order's
        self._ghosts: dict[ExpertId, tuple[int, int]] = {}  # expert -> (+1 map's victim / -1 LFU's, token)
        norm = self._scores.reshape(-1, E)
        total = norm.sum(axis=1, keepdims=True)
        self._prompt_feat = (np.divide(norm, total, out=np.zeros_like(norm), where=total > 0) * E).ravel()

        self._share = stream_share(self._stream.reshape(-1, E)).ravel()
        self._recent_share = stream_share(self._recent.reshape(-1, E)).ravel()
        self._recent *= STREAM_CARRY
        self._path = self._prompt_feat.copy()
        self._refresh()

    def _rematch(self) -> np.ndarray:
        """Re-match the routing path (prefill and the decode tokens done); the match [L, E]."""
        g = self.geometry
        L, E = g.layers, g.experts
        pred, self._confidence = self.trajectory.paths.match(
            self._prefill.reshape(L, E), self._decode_uses.reshape(L, E), max(self._tokens - 1, 0)
        )
        self._path = (pred * E).ravel()
        return pred

    def _new_step(self, step: int) -> bool:
        """A runtime step begins: the prefill, or a decode token. True when it ends a prefill."""
        self._step_seen = step
        if self._in_prefill and not self._prefill_begun:
            self._prefill_begun = True
            return False
        after_prefill, self._in_prefill = self._in_prefill, False
        self._tokens += 1
        if after_prefill or (self._tokens - 1) % self.cadence == 0:
            self._rematch()
        self._refresh()
        return after_prefill

    def prefetch_layer(self, step: int, layer: int) -> list[ExpertId]:
        """When decode begins after a prefill: the re-matched prediction's top-up (see the
        module docstring); nothing otherwise."""
        if step == self._step_seen or not self._new_step(step) or not self.prefill_prefetch or not self.capacity.per_layer:
            return []

        E, slots = self.geometry.experts, self.capacity.slots
        pred = self._path.reshape(-1, E)
        out = []
        for lay in range(len(pred)):
            off = lay * E
            scores = self._now_scores[off : off + E]
            held = np.array([self.is_resident(off + e) for e in range(E)])
            floors = np.sort(scores[held])  # each top-up evicts the next lowest-scored resident
            floors = np.concatenate([np.full(slots - len(floors), -np.inf), floors])
            want = [int(e) for e in np.argsort(-pred[lay], kind="stable")[: prefetch_depth(pred[lay], self._confidence, slots)]]
            new = [e for e in want if not held[e]]
            out += [off + e for e, floor in zip(new, floors) if scores[e] > floor]
        return out

    def _refresh(self) -> None:
        """The learned map's scores of every expert in the state before the current token
        (`now`: the tokens before it); kept for the step, since within a step only the running
        layer's routed experts change state, and those are protected from eviction."""
        w, now = self._weights, self._tokens - 2
        age = now - self._decode_last
        s = w[0] * np.exp(-age) + w[1] * np.exp(-age / 4.0) + w[2] * np.exp(-age / 16.0)
        if now >= 0:
            s += w[3] * self._decode_uses / (now + 1.0)
        s += w[4] * self._prefill + w[5] * self._share + w[6] * self._recent_share
        s += w[7] * self._prompt_feat + w[8] * self._path
        self._now_scores = s

    # ---- hooks ---------------------------------------------------------------------------

    def _twin_state(self) -> TwinState:
        return TwinState(served=self._served)  # the kernel counts uses here; on_request_end reads them

    def _twin_key(self) -> np.ndarray:
        return self._scores

    def _twin_runs(self) -> bool:
        """Only the static form is what the compiled twin computes."""
        return self.trajectory is None and self.start_prefetch

    twin = Twin(lowest_score, state=_twin_state, request_key=_twin_key, runs=_twin_runs)

    def on_access(self, expert: ExpertId) -> None:
        self._tick += 1
        self._last[expert] = self._tick
        self._served[expert] += 1
        if self.trajectory is None:
            return
        if self._step != self._step_seen:
            self._new_step(self._step)
        self._stream[expert] += 1
        self._recent[expert] += 1
        ghost = self._ghosts.pop(expert, None)
        if ghost is not None and self._tokens - ghost[1] <= FALLBACK_WINDOW:
            self._regret += ghost[0]
        if self._in_prefill:  # experts arrive heaviest first per layer
            layer = expert // self.geometry.experts
            if not self._prefill[expert]:
                self._prefill[expert] = np.exp(-self._rank[layer] / self.geometry.top_k)
                self._rank[layer] += 1
                self._decode_last[expert] = -1.0
        else:
            self._decode_last[expert] = self._tokens - 1
            self._decode_uses[expert] += 1

    def on_insert(self, expert: ExpertId) -> None:
        self._tick += 1
        self._last[expert] = self._tick

    def on_request_end(self) -> None:
        observe = getattr(self.predictor, "observe", None)
        if observe is not None:
            g = self.geometry
            observe(self._prompt, self._served.reshape(g.layers, g.experts))

    def victim(self, layer: int, candidates) -> ExpertId:
        last = self._last
        if self.trajectory is None:
            scores = self._scores
            return min(candidates, key=lambda e: (scores[e], last[e]))
        scores = self._now_scores
        if self._transition is not None and not self._in_prefill and self._routing:
            E = self.geometry.experts
            follow = self._transition[layer, [e % E for e in self._routing]].mean(axis=0)
            mapped = min(candidates, key=lambda e: (scores[e] + follow[e % E], last[e]))
        else:
            mapped = min(candidates, key=lambda e: (scores[e], last[e]))
        if not self.fallback:
            return mapped
        stream = self._stream
        frequent = min(candidates, key=lambda e: (stream[e], last[e]))  # what LFU would evict
        if frequent != mapped:  # a disagreement: whichever victim the request routes again soon was the wrong one
            self._ghosts[mapped] = (1, self._tokens)
            self._ghosts[frequent] = (-1, self._tokens)
        return frequent if self._regret > 0 else mapped

    def route(self, step: int, layer: int, experts, scores: np.ndarray | None = None):
        """The base class's accounting; the updating form first notes the layer's routed
        experts, which its evictions read (the router has chosen them before any is loaded)."""
        self._routing = experts
        return super().route(step, layer, experts, scores)

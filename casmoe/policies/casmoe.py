"""CasMoE: prefetch every layer's predicted experts once per prompt, before decoding.

A predictor maps a request's prompt to scores [L, E] (the planner of `casmoe.planner`, or a
test predictor). At request start the policy fetches the highest-scored experts of every layer
within the budget, in layer order so that early layers arrive first; misses load on demand;
the lowest-scored resident is evicted (least recently used among equals).

Predictors by option: `planner=DIR` (a fitted planner, which also learns online from the
routing each served request showed), `predictor="exact"` (the request's own
decode pattern: an oracle, so the policy then declares it reads the future) or
`predictor="noisy"` (that oracle blended with random scores: `noise` in [0, 1]).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from casmoe.cache import CacheConfigError, ExpertCache, TwinState
from casmoe.geometry import ExpertId
from casmoe.kernels.kinds import Kind
from casmoe.trace import Request

ExpertScorer = Callable[[Request], np.ndarray]


def exact_predictor(geometry) -> ExpertScorer:
    """The request's own decode expert pattern: the best any prompt-level planner can do."""
    from casmoe.planner.patterns import request_pattern

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
        from casmoe.planner import load_planner

        self.planner = load_planner(path)
        g = self.planner.geometry
        if (g.layers, g.experts, g.top_k) != (geometry.layers, geometry.experts, geometry.top_k):
            raise CacheConfigError(f"planner at {path} was fitted on {g.describe()}, the trace is {geometry.describe()}")

    def __call__(self, request) -> np.ndarray:
        return self.planner.predict(request.prompt or "")

    def observe(self, prompt: str | None, pattern: np.ndarray) -> None:
        if prompt and pattern.any():
            self.planner.observe(prompt, pattern)


class CasMoE(ExpertCache):
    name = "casmoe"
    compiled_kind = Kind.CASMOE

    def __init__(self, *args, predictor: ExpertScorer, oracle: bool = False, **kw) -> None:
        super().__init__(*args, **kw)
        self.predictor = predictor
        self.needs_future = oracle  # an oracle predictor reads the request's own routing
        g = self.geometry
        self._scores = np.zeros(g.total_experts)
        self._last: dict[ExpertId, int] = {}
        self._tick = 0
        self._prompt: str | None = None
        self._served = np.zeros(g.total_experts)  # routed uses seen while serving this request

    @classmethod
    def reads_future(cls, options: dict[str, Any]) -> bool:
        """The `exact` and `noisy` predictors read the request's own routing; a planner does not."""
        return options.get("planner") is None and not callable(options.get("predictor"))

    @classmethod
    def fitted_requests(cls, options: dict[str, Any], trace: Any) -> set[int]:
        """With a planner: the requests whose prompt it was fitted on (its stored fit data)."""
        folder = options.get("planner")
        if folder is None:
            return set()
        from casmoe.planner.fitdata import prompt_digests
        from casmoe.planner.planner import read_fit_data

        fit = read_fit_data(folder)
        if fit is None:
            return set()
        seen = np.isin(prompt_digests([r.prompt for r in trace.requests]), fit.prompts)
        return {int(i) for i in np.flatnonzero(seen)}

    @classmethod
    def create(
        cls,
        geometry,
        capacity,
        *,
        trace: Any = None,
        predictor: str | ExpertScorer = "exact",
        noise: float = 0.3,
        planner: str | None = None,
        seed: int = 0,
        **kw: Any,
    ) -> ExpertCache:
        if planner is not None:
            missing = 0 if trace is None else sum(not r.prompt for r in trace.requests)
            if missing:
                raise CacheConfigError(
                    f"{missing} of the trace's {len(trace.requests)} requests have no prompt text, and a planner predicts "
                    "from the prompt; use a trace recorded with prompts, or casmoe[predictor=exact|noisy] for the bounds"
                )
            return cls(geometry, capacity, predictor=PlannerPredictor(planner, geometry), **kw)
        if callable(predictor):
            return cls(geometry, capacity, predictor=predictor, **kw)
        if predictor == "exact":
            return cls(geometry, capacity, predictor=exact_predictor(geometry), oracle=True, **kw)
        if predictor == "noisy":
            rng = np.random.default_rng(seed)
            return cls(geometry, capacity, predictor=noisy_predictor(geometry, noise, rng), oracle=True, **kw)
        raise CacheConfigError(f"casmoe predictor must be 'exact', 'noisy' or a planner=DIR, got {predictor!r}")

    def prefetch_request(self, request) -> list[ExpertId]:
        g, cap = self.geometry, self.capacity
        scores = np.asarray(self.predictor(request), dtype=np.float64)
        if scores.shape != (g.layers, g.experts):
            raise CacheConfigError(f"predictor returned scores of shape {scores.shape}, expected ({g.layers}, {g.experts})")
        self._scores = scores.ravel()
        self._prompt = request.prompt
        self._served[:] = 0
        if cap.per_layer:
            top = np.argsort(-scores, axis=1, kind="stable")[:, : cap.slots]
            chosen = (top + (np.arange(g.layers) * g.experts)[:, None]).ravel()
        else:
            chosen = np.sort(np.argsort(-self._scores, kind="stable")[: cap.slots])  # flat ids sort by layer
        return [int(e) for e in chosen if self._scores[e] > 0]

    def twin_state(self) -> TwinState:
        return TwinState(served=self._served)  # the kernel counts uses here; on_request_end reads them

    def twin_request_key(self) -> np.ndarray:
        return self._scores

    def on_access(self, expert: ExpertId) -> None:
        self._tick += 1
        self._last[expert] = self._tick
        self._served[expert] += 1

    def on_insert(self, expert: ExpertId) -> None:
        self._tick += 1
        self._last[expert] = self._tick

    def on_request_end(self) -> None:
        observe = getattr(self.predictor, "observe", None)
        if observe is not None:
            g = self.geometry
            observe(self._prompt, self._served.reshape(g.layers, g.experts))

    def victim(self, layer: int, candidates) -> ExpertId:
        scores, last = self._scores, self._last
        return min(candidates, key=lambda e: (scores[e], last[e]))

"""The contract every cache policy must keep, in the count-only replay; the simulator's half
(the same policy, driven through `casmoe.sim`, makes the same decisions) is in
`casmoe.sim.testing`, whose `check_policy` a user calls on their own class:

    from casmoe.sim.testing import check_policy

    def test_my_policy_keeps_the_contract():
        check_policy(MyPolicy)

This module stays in the core, so it imports neither runtime built on it (tests/project/test_layers.py).
The contract generates small random geometries, traces and capacities with hypothesis,
replays them through the policy wrapped in a checker, and fails with a minimal counter-example
when an invariant breaks:

- resident plus in-flight experts never exceed a pool's slots, and no slot holds two experts;
- an expert routed in the running layer is never evicted;
- hits + late hits + misses = routed accesses; bytes loaded = loads x expert bytes;
- in `load` mode every routed expert is resident once `route` returns (when the layer's
  routed set fits in its pool), unless the layer computes it on the host (`Access.cpu`);
- the same inputs give the same counts (no hidden randomness or global state);
- a policy that does not declare `needs_future` never reads it (the base raises if it tries);
- all of it in every miss mode (`load`, `substitute`, `cpu`).

The contract needs hypothesis, which comes with the test extra (`pip install 'casmoe[test]'`);
without it, importing this module (or `casmoe.sim.testing`) is one `MissingExtraError` that
says so, not a `ModuleNotFoundError` from deep inside.

`run_contract` runs any per-case check (`check_replay`, or a runtime's that starts from it) on
generated cases, so a runtime built on the core adds its own comparison without repeating the
generators. The built-in policies pass the full suite
(tests/policies/test_policies.py).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from casmoe.errors import CasmoeError


class MissingExtraError(CasmoeError, ModuleNotFoundError):
    """An optional dependency of casmoe is not installed; the message names the extra to install."""


try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ModuleNotFoundError as exc:  # only the test extra brings hypothesis
    if exc.name != "hypothesis":
        raise
    raise MissingExtraError(
        "check_policy (casmoe.sim.testing, casmoe.testing) generates its cases with hypothesis, which is not "
        "installed: pip install 'casmoe[test]'", name="hypothesis") from None

from casmoe.cache import CacheStats, Capacity, ExpertCache, Load, MissMode
from casmoe.costs import ExpertCosts
from casmoe.geometry import Geometry
from casmoe.replay import replay
from casmoe.trace import Request, Trace

PolicyFactory = Callable[..., ExpertCache]


@dataclass(frozen=True)
class Case:
    """One generated scenario: a trace, a capacity and a miss mode."""

    trace: Trace
    capacity: Capacity
    miss_mode: MissMode = MissMode.LOAD

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        g = self.trace.geometry
        reqs = [(r.prefill, r.topk[:, :, :].tolist()) for r in self.trace.requests]
        return f"Case({g.describe()}, capacity={self.capacity.describe()}, {self.miss_mode.value}, requests={reqs})"


@st.composite
def geometries(draw: st.DrawFn, max_layers: int = 3, max_experts: int = 6) -> Geometry:
    layers = draw(st.integers(1, max_layers))
    experts = draw(st.integers(2, max_experts))
    top_k = draw(st.integers(1, min(3, experts)))
    return Geometry(layers, experts, top_k, hidden=8, intermediate=4)


@st.composite
def traces(draw: st.DrawFn, geometry: Geometry | None = None, max_requests: int = 3, max_tokens: int = 12) -> Trace:
    """Random requests; prompts are distinct so prompt-keyed predictors can tell them apart."""
    g = geometry if geometry is not None else draw(geometries())
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    hot = draw(st.integers(g.top_k, g.experts))  # a small working set makes caching matter
    requests = []
    for i in range(draw(st.integers(1, max_requests))):
        tokens = draw(st.integers(1, max_tokens))
        prefill = draw(st.integers(0, tokens))
        topk = np.stack(
            [[rng.choice(hot, g.top_k, replace=False) for _ in range(g.layers)] for _ in range(tokens)]
        ).astype(np.int16)
        weights = rng.dirichlet(np.ones(g.top_k), size=(tokens, g.layers)).astype(np.float32)
        requests.append(Request(topk, weights, prefill, prompt=f"request {i} seed {seed}", task=f"t{i % 2}",
                                spec=_spec(topk, g, rng)))
    return Trace(g, requests, {"source": "casmoe.testing"})


def _spec(topk: np.ndarray, g: Geometry, rng: np.random.Generator) -> np.ndarray:
    """A recorded-like next-layer guess: `spec[t, l]` is layer l+1's routing, one row in four
    replaced by random experts (a guess is often, not always, right); the last layer has none."""
    spec = np.full_like(topk, -1)
    spec[:, :-1] = topk[:, 1:]
    wrong = rng.random(spec.shape[:2]) < 0.25
    wrong[:, -1] = False
    for t, layer in zip(*np.nonzero(wrong)):
        spec[t, layer] = rng.choice(g.experts, g.top_k, replace=False)
    return spec


@st.composite
def cases(draw: st.DrawFn, transient: bool = True) -> Case:
    """A trace, a capacity (from one slot: fewer than top_k passes the rest of a layer's experts
    through staging slots; `transient=False` keeps to top_k and up, where compiled twins run)
    and a miss mode."""
    trace = draw(traces())
    g = trace.geometry
    least = 1 if transient else g.top_k
    if draw(st.booleans()):
        capacity = Capacity(draw(st.integers(least, g.experts + 1)))
    else:
        capacity = Capacity(draw(st.integers(least, g.total_experts + 1)), per_layer=False)
    return Case(trace, capacity, draw(st.sampled_from(list(MissMode))))


def checked(policy: type[ExpertCache]) -> type[ExpertCache]:
    """A subclass of `policy` that checks the invariants after every runtime event."""

    class Checked(policy):  # type: ignore[misc, valid-type]
        def _check_loads(self, loads: list[Load] | tuple[Load, ...], protected: frozenset[int]) -> None:
            for ld in loads:
                assert ld.victim not in protected, f"{policy.__name__} evicted {ld.victim}, used by the running layer"
                assert self.slot(ld.expert) in (ld.slot, None), "load names a slot its expert does not hold"
            self._check_capacity()

        def _check_capacity(self, settled: bool = False) -> None:
            """Slots distinct and inside their pool; no more experts than slots, the staging
            slots of a cache with fewer than top_k included until its layer is done (`settled`)."""
            slots = list(self._slot_of.values())
            assert len(slots) == len(set(slots)), f"{policy.__name__}: a slot holds two experts"
            per_pool = self.capacity.slots
            physical = max(per_pool, self.geometry.top_k) if self.transient else per_pool
            most = per_pool if settled else physical
            for pool, members in enumerate(self._pool_members):
                assert len(members) <= most, f"pool {pool} holds {len(members)} experts in {most} slots"
                for e in members:
                    assert pool * physical <= self._slot_of[e] < (pool + 1) * physical, "slot outside its pool"

        def _trim(self) -> None:
            super()._trim()  # a layer is done: staged experts gave their slots back
            self._check_capacity(settled=True)

        def begin_request(self, request):  # type: ignore[override]
            loads = super().begin_request(request)
            self._check_loads(loads, frozenset())
            return loads

        def before_layer(self, step, layer):  # type: ignore[override]
            loads = super().before_layer(step, layer)
            self._check_loads(loads, frozenset())  # the previous layer is done: nothing protected
            return loads

        def route(self, step, layer, experts, scores=None, counts=None, tokens=None):  # type: ignore[override]
            if counts is None and tokens is None:  # what runtimes pass a cache that does not decide where misses run
                acc = super().route(step, layer, experts, scores)
            else:
                acc = super().route(step, layer, experts, scores, counts, tokens)
            slots = max(self.capacity.slots, self.geometry.top_k) if self.transient else self.capacity.slots
            fits = len(experts) <= slots  # else a long prefill streams through the slots
            # what the layer runs: its routed experts, but a substituted one runs its stand-in
            # instead (that miss's background fetch may be evicted again, as a wasted prefetch)
            used = (set(experts) - {m for m, _ in acc.substitutes}) | {s for _, s in acc.substitutes}
            self._check_loads(acc.loads + acc.background, frozenset(used) if fits else frozenset())
            if self.miss_mode is MissMode.LOAD and fits:
                on_host = set(acc.cpu)  # a placement's host experts, or the misses the policy left to the host
                missing = [e for e in experts if not self.is_resident(e) and e not in on_host]
                assert not missing, f"{policy.__name__}: routed experts {missing} not resident when layer {layer} runs"
            assert acc.hits + len(acc.late) + len(acc.misses) + len(acc.substitutes) + len(acc.cpu) == len(experts)
            return acc

    Checked.__name__ = f"Checked{policy.__name__}"
    return Checked


def textbook_lru_hits(visits: Iterable[Sequence[int]], capacity: int) -> int:
    """Hits of a textbook LRU over one pool, uses in routing order, a whole visit protected:
    the reference casmoe's `lru` is diffed against (tests/policies/test_policies.py) and the floor its
    speed is measured against (bench/bench_replay.py)."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for visit in visits:
        for e in visit:
            if e in cache:
                hits += 1
                cache.move_to_end(e)
            else:
                if len(cache) >= capacity:
                    del cache[next(x for x in cache if x not in visit)]
                cache[e] = None
    return hits


def check_replay(policy: type[ExpertCache], case: Case, options: dict[str, Any] | None = None,
                 costs: ExpertCosts | None = None) -> CacheStats:
    """Replay one case through the checked policy twice, compare the counts and check them;
    returns them (a runtime's own check compares its counts with these). `costs`: the prices a
    runtime attaches (`casmoe.costs`), so that a cost-based policy decides as it does there."""
    options = options or {}
    g = case.trace.geometry
    results = []
    for _ in range(2):
        cache = checked(policy).create(g, case.capacity, trace=case.trace, miss_mode=case.miss_mode, **options)
        if costs is not None:
            cache.attach_costs(costs)
        results.append(replay(case.trace, cache).stats)
    stats = results[0]
    assert results[0] == results[1], f"{policy.__name__} is not deterministic: {results[0]} != {results[1]}"
    assert stats.hits + stats.late_hits + stats.misses == stats.accesses
    assert stats.misses == stats.demand_loads + stats.substitutions + stats.cpu_computed
    bytes_per = g.bytes_per_layer()
    if len(set(bytes_per)) == 1:
        assert stats.bytes_loaded == stats.loads * bytes_per[0]
    assert stats.prefetch_used + stats.prefetch_wasted <= stats.prefetch_loads
    if case.miss_mode is not MissMode.SUBSTITUTE:
        assert stats.substitutions == 0
    if case.miss_mode is not MissMode.CPU and not cache.host_experts and not cache.decides_host:  # those run there
        assert stats.cpu_computed == 0
    return stats


def run_contract(check: Callable[[Case], object], *, max_examples: int = 60) -> None:
    """Run `check` on `max_examples` generated cases; hypothesis shrinks a failure to a minimal one."""

    @settings(max_examples=max_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(case=cases())
    def contract(case: Case) -> None:
        check(case)

    contract()


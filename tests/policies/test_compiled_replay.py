"""The compiled twins (casmoe/kernels/cache_machine.py) make the Python policies' decisions.

For random traces (prefills that stream, gaps), capacities (per-layer and global pools), miss
modes, batch sizes and every built-in policy variant, the compiled replay must issue the same
loads (expert, slot, victim, demand or prefetch) in the same order, choose the same stand-ins
(and host-computed misses) and end with the same counters as `casmoe.replay`'s Python loop over the Python classes. The
kernels run both compiled and interpreted (plain Python, which bounds-checks every index).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.cache import Access, CacheConfigError, CacheStats, Capacity, LoadReason, MissMode, PolicyError
from casmoe.compiled import has_twin, replay_compiled
from casmoe.kernels.cache_machine import LOG_CPU, LOG_DEMAND, LOG_PREFETCH, LOG_SUBSTITUTE
from casmoe.policies import POLICIES, PolicySpec
from casmoe.policies.lru import LRU
from casmoe.replay import replay
from casmoe.step_arrays import StepArrays
from casmoe.testing import cases, geometries, traces
from casmoe.trace import NOT_COMPUTED, Request, Trace
from casmoe.twin import twin_of
from support.kernel_modes import kernels

OPTIONS = {"casmoe": [{"predictor": "exact"}, {"predictor": "noisy", "noise": 0.5}], "sch": [{"m": 1}, {"m": 3}],
           "speculative": [{}, {"experts": 1}]}
VARIANTS = [PolicySpec(name, tuple(sorted(o.items()))) for name, cls in POLICIES.items() if twin_of(cls) is not None
            for o in OPTIONS.get(name, [{}])]
"""Every built-in policy that declares a compiled twin, in the forms it runs compiled (moe-infinity runs in Python)."""


def logged(cls):
    """`cls` recording every load and stand-in the Python mechanics decide (a subclass, so it
    never has a compiled twin itself)."""

    class Logged(cls):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.loads: list[tuple[int, int, int, int]] = []
            self.subs: list[tuple[int, int, int, int]] = []

        def _admit(self, expert, reason):
            ld = super()._admit(expert, reason)
            self.loads.append((LOG_DEMAND if reason is LoadReason.DEMAND else LOG_PREFETCH, ld.expert, ld.slot, ld.victim))
            return ld

        def route(self, step, layer, experts, scores=None) -> Access:
            acc = super().route(step, layer, experts, scores)
            self.subs += [(LOG_SUBSTITUTE, e, sub, -1) for e, sub in acc.substitutes]
            self.subs += [(LOG_CPU, e, -1, -1) for e in acc.cpu]
            return acc

    return Logged


def with_gaps(trace: Trace, seed: int) -> Trace:
    """Some token-layers NOT_COMPUTED (zero weight), as llama.cpp-style engines record."""
    rng = np.random.default_rng(seed)
    reqs = []
    for r in trace.requests:
        gap = rng.random(r.topk.shape[:2]) < 0.15
        topk = np.where(gap[:, :, None], NOT_COMPUTED, r.topk).astype(r.topk.dtype)
        weights = np.where(gap[:, :, None], 0, r.weights).astype(r.weights.dtype)
        reqs.append(Request(topk, weights, r.prefill, r.prompt, r.task, r.logits, r.spec))
    return Trace(trace.geometry, reqs, trace.meta)


def both_paths(spec: PolicySpec, trace: Trace, capacity: Capacity, mode: MissMode, batch: int):
    g = trace.geometry
    python = PolicySpec(spec.name, spec.options)
    ref = logged(python.cls).create(g, capacity, trace=trace, miss_mode=mode, **dict(spec.options))
    want = replay(trace, ref, batch=batch).stats
    twin = spec.create(g, capacity, trace=trace, miss_mode=mode)
    assert has_twin(twin)
    log: list = []
    got = replay_compiled(trace, twin, StepArrays.from_trace(trace, batch), log)
    return want, ref, got, log


def outcome(spec: PolicySpec, trace: Trace, capacity: Capacity, mode: MissMode, batch: int, compiled: bool):
    """The counts of a replay on the chosen path, or the refusal it ends in."""
    cache = spec.create(trace.geometry, capacity, trace=trace, miss_mode=mode)
    try:
        if compiled:
            return replay_compiled(trace, cache, StepArrays.from_trace(trace, batch))
        return replay(trace, cache, batch=batch, compiled=False).stats
    except (CacheConfigError, PolicyError) as exc:
        return str(exc)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "interpreted"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(
    spec=st.sampled_from(VARIANTS),
    case=cases(transient=False),
    mode=st.sampled_from(list(MissMode)),
    batch=st.integers(1, 3),
    gaps=st.none() | st.integers(0, 2**32 - 1),
)
def test_compiled_twin_decides_like_the_python_policy(compiled, spec, case, mode, batch, gaps):
    trace = case.trace if gaps is None else with_gaps(case.trace, gaps)
    with kernels("casmoe.kernels.cache_machine", compiled):
        if spec.name == "speculative" and batch > 1:  # one request at a time: both refuse alike, or both run
            python, twin = (outcome(spec, trace, case.capacity, mode, batch, c) for c in (False, True))
            assert twin == python
            return
        assert_same(spec, trace, case.capacity, mode, batch)


def assert_same(spec: PolicySpec, trace: Trace, capacity: Capacity, mode: MissMode, batch: int = 1) -> CacheStats:
    want, ref, got, log = both_paths(spec, trace, capacity, mode, batch)
    assert [row for row in log if row[0] in (LOG_DEMAND, LOG_PREFETCH)] == ref.loads
    assert [row for row in log if row[0] in (LOG_SUBSTITUTE, LOG_CPU)] == ref.subs
    assert got == want
    return got


@st.composite
def shared_pools(draw: st.DrawFn) -> tuple[Trace, Capacity]:
    """Longer traces over more layers and a pool shared by them, small enough to evict across
    layers on most visits: where least-stale's layer order decides (the generic cases rarely get there)."""
    g = draw(geometries(max_layers=5, max_experts=8).filter(lambda g: g.layers > 1))
    trace = draw(traces(g, max_requests=3, max_tokens=24))
    return trace, Capacity(draw(st.integers(g.top_k, g.top_k * g.layers + g.experts)), per_layer=False)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "interpreted"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(
    spec=st.sampled_from([v for v in VARIANTS if v.name in ("least-stale", "speculative")]),
    pool=shared_pools(),
    mode=st.sampled_from(list(MissMode)),
)
def test_the_layer_order_twins_on_a_shared_pool(compiled, spec, pool, mode):
    trace, capacity = pool
    with kernels("casmoe.kernels.cache_machine", compiled):
        assert_same(spec, trace, capacity, mode)


@settings(max_examples=60, deadline=None, database=None)
@given(trace=traces(max_requests=4, max_tokens=10), gaps=st.none() | st.integers(0, 2**32 - 1))
def test_batch_one_arrays_equal_the_step_objects(trace, gaps):
    trace = trace if gaps is None else with_gaps(trace, gaps)
    g = trace.geometry
    fast, slow = StepArrays.from_trace(trace), StepArrays.from_steps(trace.steps(), g.layers, len(trace.requests))
    for name in ("visit_ptr", "experts", "first_step", "last_step", "counts", "weighted"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name), err_msg=name)


def test_replay_chooses_the_twin_only_for_fresh_built_in_policies(tiny_trace):
    g = tiny_trace.geometry

    class Mine(LRU):  # a user's policy, even one that only inherits: Python
        pass

    assert not has_twin(Mine(g, 2))
    used = POLICIES["lru"](g, 2)
    replay(tiny_trace, used, compiled=False)
    assert not has_twin(used)  # not fresh: its state lives in Python objects
    with pytest.raises(PolicyError):
        replay_compiled(tiny_trace, used, StepArrays.from_trace(tiny_trace))
    fresh = POLICIES["lru"](g, 2)
    res = replay(tiny_trace, fresh, compiled=True)
    assert fresh.stats() == res.stats == replay(tiny_trace, Mine(g, 2)).stats


@pytest.fixture
def tiny_trace() -> Trace:
    from casmoe.geometry import Geometry

    g = Geometry(2, 4, 1, hidden=8, intermediate=4)
    topk = np.array([[[0], [1]], [[2], [3]], [[0], [1]], [[1], [2]]], dtype=np.int16)
    return Trace(g, [Request(topk, np.ones(topk.shape, np.float32), 1, prompt="p")])

"""Every registered policy against the shared contract, plus the properties specific to each."""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.cache import Capacity, CacheConfigError, ExpertCache, MissMode, PolicyError
from casmoe.geometry import Geometry
from casmoe.policies import POLICIES, get_policy, PolicyNotFound
from casmoe.replay import replay
from casmoe.sim.testing import check_policy
from casmoe.testing import geometries, textbook_lru_hits, traces
from casmoe.trace import Request, Trace
from support.paths import REPO

OPTIONS = {"casmoe": [{"predictor": "exact"}, {"predictor": "noisy", "noise": 0.5}], "sch": [{"m": 1}, {"m": 4}],
           "speculative": [{}, {"ahead": 3, "experts": 1}], "moe-infinity": [{}, {"size": 1, "ahead": 1}]}
VARIANTS = [(name, opts) for name in POLICIES for opts in OPTIONS.get(name, [{}])]
DEMAND_ONLY = ["ondemand", "lru", "lfu", "static", "sch"]
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


@pytest.mark.parametrize(("name", "options"), VARIANTS, ids=[f"{n}{o or ''}" for n, o in VARIANTS])
def test_policy_keeps_the_contract(name, options):
    check_policy(POLICIES[name], max_examples=40, options=options)


def _run(name: str, trace: Trace, capacity: Capacity, **options) -> ExpertCache:
    cache = get_policy(name).create(trace.geometry, capacity, trace=trace, **options)
    replay(trace, cache)
    return cache


def decode_only(max_tokens: int = 10) -> st.SearchStrategy[Trace]:
    """Traces without prefill: every step routes exactly k experts per layer, so any capacity
    >= k holds a whole layer and demand-only policies face the classic paging problem."""
    return traces(max_tokens=max_tokens).map(
        lambda t: Trace(t.geometry, [Request(r.topk, r.weights, 0, r.prompt) for r in t.requests])
    )


@FAST
@given(trace=decode_only(), extra=st.integers(0, 4), per_layer=st.booleans(), m=st.integers(1, 6))
def test_belady_beats_every_demand_only_policy(trace, extra, per_layer, m):
    g = trace.geometry
    cap = Capacity(g.top_k + extra) if per_layer else Capacity(g.top_k + extra, per_layer=False)
    best = _run("belady", trace, cap).stats().hits
    for name in DEMAND_ONLY:
        opts = {"m": m} if name == "sch" else {}
        assert best >= _run(name, trace, cap, **opts).stats().hits, name


def optimum_hits(visits: list[tuple[int, ...]], capacity: int) -> int:
    """Most hits any demand-loading cache of `capacity` slots can get (exhaustive search)."""

    @lru_cache(maxsize=None)
    def best(i: int, cache: frozenset[int]) -> int:
        if i == len(visits):
            return 0
        need = set(visits[i])
        hits = len(need & cache)
        missing = need - cache
        keep_pool = cache - need  # residents the step does not use may be evicted
        room = capacity - len(cache)
        evict_n = max(0, len(missing) - room)
        options = []
        for gone in itertools.combinations(sorted(keep_pool), evict_n):
            options.append(best(i + 1, frozenset((cache - set(gone)) | need)))
        return hits + max(options)

    return best(0, frozenset())


def one_layer_case(data, geometry: Geometry, **trace_kw) -> tuple[Trace, int, list[tuple[int, ...]]]:
    """A decode-only one-layer trace, a per-layer capacity, and its visits as expert tuples."""
    drawn = data.draw(traces(geometry=geometry, **trace_kw))
    trace = Trace(geometry, [Request(r.topk, r.weights, 0, r.prompt) for r in drawn.requests])
    cap = data.draw(st.integers(geometry.top_k, geometry.experts))
    visits = [tuple(int(e) for e in r.topk[t, 0]) for r in trace.requests for t in range(r.tokens)]
    return trace, cap, visits


@FAST
@given(data=st.data())
def test_belady_equals_the_exhaustive_optimum(data):
    g = Geometry(1, data.draw(st.integers(2, 5)), data.draw(st.integers(1, 2)), hidden=8, intermediate=4)
    trace, cap, visits = one_layer_case(data, g, max_requests=2, max_tokens=7)
    assert _run("belady", trace, Capacity(cap)).stats().hits == optimum_hits(visits, cap)


@FAST
@given(trace=decode_only(), per_layer=st.booleans())
def test_lru_hits_never_drop_as_capacity_grows(trace, per_layer):
    g = trace.geometry
    top = g.experts + 1 if per_layer else g.total_experts + 1
    hits = [_run("lru", trace, Capacity(c, per_layer)).stats().hits for c in range(g.top_k, top + 1)]
    assert hits == sorted(hits)


@FAST
@given(data=st.data())
def test_lru_matches_a_textbook_lru(data):
    trace, cap, visits = one_layer_case(data, data.draw(geometries(max_layers=1)))
    assert _run("lru", trace, Capacity(cap)).stats().hits == textbook_lru_hits(visits, cap)


@FAST
@given(trace=traces(), per_layer=st.booleans())
def test_capacity_for_every_expert_leaves_only_compulsory_misses(trace, per_layer):
    g = trace.geometry
    cap = Capacity(g.experts) if per_layer else Capacity(g.total_experts, per_layer=False)
    distinct = len({(l, int(e)) for r in trace.requests for l in range(g.layers) for e in np.unique(r.topk[:, l])})
    for name in POLICIES:
        if not POLICIES[name].keeps_experts:
            continue
        stats = _run(name, trace, cap).stats()
        assert stats.evictions == 0, name
        if stats.cpu_computed:  # a miss the policy computes on the host (hybrimoe's decode split) loads nothing
            assert stats.loads <= distinct, name
        elif stats.prefetch_loads == 0:
            assert stats.misses == distinct, name
        else:
            assert stats.misses <= distinct, name


def test_ondemand_keeps_nothing_between_layers():
    g = Geometry(2, 4, 2, hidden=8, intermediate=4)
    topk = np.array([[[0, 1], [2, 3]]] * 5, dtype=np.int16)
    trace = Trace(g, [Request(topk, np.full(topk.shape, 0.5, np.float32), 0)])
    stats = _run("ondemand", trace, Capacity(4)).stats()
    assert stats.hits == 0 and stats.misses == stats.accesses == 20


def test_semoe_prefetches_the_next_layer_and_wraps_to_layer_zero():
    g = Geometry(2, 2, 1, hidden=8, intermediate=4)
    topk = np.array([[[0], [1]]] * 3, dtype=np.int16)
    trace = Trace(g, [Request(topk, np.ones(topk.shape, np.float32), 0)])
    stats = _run("semoe", trace, Capacity(2)).stats()
    # capacity holds whole layers: after the first visit of layer 0 everything was prefetched
    assert stats.misses == 1 and stats.prefetch_loads == 3


def test_static_pins_the_profile_hot_experts():
    g = Geometry(1, 6, 1, hidden=8, intermediate=4)
    seq = [0, 1, 0, 2, 0, 3, 0, 4, 0, 5]
    topk = np.array(seq, dtype=np.int16).reshape(-1, 1, 1)
    trace = Trace(g, [Request(topk, np.ones(topk.shape, np.float32), 0)])
    cache = _run("static", trace, Capacity(2))
    assert cache.pinned == frozenset({0})
    assert cache.stats().hits == 4  # every reuse of expert 0; 1..5 rotate through one slot


def test_casmoe_exact_prefetch_turns_misses_into_hits():
    g = Geometry(2, 8, 2, hidden=8, intermediate=4)
    rng = np.random.default_rng(0)
    topk = np.stack([[rng.choice(3, 2, replace=False) + 3 * l for l in range(2)] for _ in range(20)]).astype(np.int16)
    trace = Trace(g, [Request(topk, np.full(topk.shape, 0.5, np.float32), 0, prompt="p")])
    exact = _run("casmoe", trace, Capacity(3)).stats()
    lru = _run("lru", trace, Capacity(3)).stats()
    assert exact.misses == 0 and exact.prefetch_loads == 6
    assert lru.misses == 6
    noisy = _run("casmoe", trace, Capacity(3), predictor="noisy", noise=1.0).stats()
    assert noisy.misses >= exact.misses


class Peeker(ExpertCache):
    """Reads the future without declaring it."""

    name = "peeker"

    def victim(self, layer, candidates):
        self.future  # noqa: B018
        return next(iter(candidates))


class Sneaky(ExpertCache):
    """Tries to read the request's routing at request start."""

    name = "sneaky"

    def prefetch_request(self, request):
        return [int(request.topk[0, 0, 0])]

    def victim(self, layer, candidates):
        return next(iter(candidates))


@pytest.mark.parametrize("cls", [Peeker, Sneaky])
def test_policies_that_do_not_declare_the_future_cannot_read_it(cls):
    g = Geometry(1, 4, 1, hidden=8, intermediate=4)
    topk = np.array([0, 1, 2, 3, 0], dtype=np.int16).reshape(-1, 1, 1)
    trace = Trace(g, [Request(topk, np.ones(topk.shape, np.float32), 0)])
    with pytest.raises((PolicyError, AttributeError)):
        replay(trace, cls(g, 1))


def test_only_oracles_declare_the_future():
    oracles = {name for name, cls in POLICIES.items() if cls.needs_future}
    assert oracles == {"belady", "sch"}
    g = Geometry(1, 4, 1, hidden=8, intermediate=4)
    assert get_policy("casmoe").create(g, 2, predictor="exact").needs_future
    assert get_policy("casmoe").create(g, 2, predictor="noisy").needs_future


def test_capacity_below_top_k_keeps_that_many_between_layers():
    """Mixtral-Offloading's one resident expert per layer: a token's second expert passes
    through a staging slot and leaves once the layer is done, the policy choosing which."""
    g = Geometry(2, 8, 2, hidden=8, intermediate=4)
    cache = POLICIES["lru"](g, 1)
    assert cache.transient
    for step, routes in enumerate([[(0, 1), (8, 9)], [(1, 2), (9, 10)], [(1, 3), (10, 11)]]):
        for layer, experts in enumerate(routes):
            cache.before_layer(step, layer)
            acc = cache.route(step, layer, list(experts))
            assert all(cache.is_resident(e) for e in experts)  # both ran from the GPU
            assert acc.hits + len(acc.late) + len(acc.misses) == 2
    cache.before_layer(3, 0)  # the last layer is done
    assert sorted(cache.resident) == [3, 11]  # the most recently used of each layer stayed
    stats = cache.stats()
    # kept a token and used again: 1 (layer 0), 9 and 10 (layer 1); 3 was the last-used of layer 0
    assert stats.hits + stats.late_hits == 3 and stats.misses == 9 and stats.evictions == 7


def test_unknown_policy_names_the_choices():
    with pytest.raises(PolicyNotFound, match="lru"):
        get_policy("nope")
    with pytest.raises(PolicyNotFound):
        get_policy("no_such_module:Cls")


def test_substitute_mode_uses_the_best_resident_and_fetches_the_missed_one_meanwhile():
    g = Geometry(1, 4, 1, hidden=8, intermediate=4)
    cache = POLICIES["lru"](g, 2, miss_mode=MissMode.SUBSTITUTE)

    def land(acc):
        for ld in acc.loads + acc.background:
            cache.arrived(ld.expert)
        return acc

    first = land(cache.route(0, 0, [0]))  # cold: nothing to stand in, so it loads and waits
    assert [ld.expert for ld in first.loads] == [0] and first.substitutes == ()
    second = land(cache.route(1, 0, [1]))  # 0 stands in now; 1 comes in the background
    assert second.substitutes == ((1, 0),) and second.loads == ()
    assert [ld.expert for ld in second.background] == [1]
    assert land(cache.route(2, 0, [1])).hits == 1  # the next token finds it
    acc = cache.route(3, 0, [3], scores=np.array([0.1, 0.7, 0.0, 0.2]))
    assert acc.substitutes == ((3, 1),) and acc.loads == ()  # the best-scored resident
    assert [ld.victim for ld in acc.background] == [0]  # never the stand-in itself
    stats = cache.stats()
    assert stats.substitutions == 2 and stats.misses == 3 and stats.prefetch_used == 1


REAL = REPO / "traces" / "real"


@pytest.mark.parametrize("model", ["qwen", "gemma", "gptoss"])
def test_every_policy_replays_the_real_traces(model):
    from casmoe.importers import read_route_csv
    from casmoe.policies import POLICIES, default_policies

    trace = read_route_csv(REAL / f"{model}.route.csv")
    g = trace.geometry
    results = {}
    for spec in default_policies(POLICIES):
        if "planner" in dict(spec.options):  # a planner fits on prompts; a route CSV has none
            continue
        if spec.name == "speculative":  # route CSVs carry no next-layer guess: a one-line refusal
            with pytest.raises(CacheConfigError, match="casmoe record --spec"):
                spec.create(g, Capacity(2 * g.top_k), trace=trace)
            continue
        stats = replay(trace, spec.create(g, Capacity(2 * g.top_k), trace=trace)).stats
        assert stats.hits + stats.late_hits + stats.misses == stats.accesses > 0
        results[spec.label] = stats.hits
    assert results["belady"] >= max(results[n] for n in ("lru", "lfu", "ondemand"))


class _ScanLayerOffload(get_policy("layer-offload")):
    """layer-offload's victim as the plain scan of every streamed expert (the reference)."""

    def victim(self, layer, candidates):
        streamed = [e for e in self._streamed if e in candidates]
        return min(streamed, key=lambda e: (e // self.geometry.experts == layer, e))


@FAST
@given(trace=traces(), extra=st.integers(0, 12))
def test_layer_offload_victims_match_the_scan(trace, extra):
    """The per-layer heaps pick the victim the scan of every streamed expert picks: the same loads."""
    g = trace.geometry
    cap = Capacity(g.top_k + extra, per_layer=False)
    try:
        fast = _run("layer-offload", trace, cap)
    except CacheConfigError:
        return
    ref = _ScanLayerOffload(g, cap)
    replay(trace, ref)
    assert fast.stats() == ref.stats()


@pytest.mark.parametrize("name", ["lru", "lfu", "ondemand"])
def test_warm_hit_rate_counts_only_slots_never_filled_as_cold(name):
    """A cache that starts warm has no cold misses after its slots first fill: a staging slot
    refilled (fewer slots than top_k) or an on-demand layer's refill is a warm cache's miss.
    So the warm hit rate never falls as the cache grows, as a hit rate of nested caches does not."""
    from casmoe.shipped import shipped
    from casmoe.trace_io import load_trace

    trace = load_trace(shipped("tiny-mixtral.npz")).subset(range(6))
    warm = [replay(trace, get_policy(name).create(trace.geometry, Capacity(c), trace=trace)).stats for c in (1, 2)]
    for s, slots in zip(warm, (1, 2)):
        assert s.cold_misses <= trace.geometry.layers * max(slots, trace.geometry.top_k)
    if name != "ondemand":
        assert warm[1].warm_hit_rate >= warm[0].warm_hit_rate

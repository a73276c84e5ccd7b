"""Per-step CPU-or-copy decisions: `fiddler`, `hybrimoe` and the placements'
GPU-prefill threshold (`gpu_prefill`), through `ExpertCache.host_misses`.

The shared contract runs each in every miss mode, the replay given the simulator's prices
(`casmoe.sim.testing`); here each is held to closed forms: with prices where a copy always
wins a policy is its caching base, where the host always wins it loads nothing after the
request's start, the threshold flips exactly at T, the simulator decides as replay given its
prices, and the backend computes on the host exactly what the policy chose, exactly.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.cache import Capacity, CacheConfigError, MissMode
from casmoe.costs import ExpertCosts, PublishedCosts
from casmoe.geometry import Geometry
from casmoe.policies import POLICIES
from casmoe.policies.fiddler import Fiddler
from casmoe.policies.hybrimoe import HybriMoE
from casmoe.policies.ktransformers import KTransformers
from casmoe.policies.n_cpu_moe import NCpuMoE
from casmoe.replay import replay
from casmoe.sim.testing import SAME_DECISIONS, check_case, check_policy
from casmoe.testing import Case, traces
from casmoe.trace import Request, Trace

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
DECISIONS = ("accesses", "hits", "misses", "cpu_computed", "substitutions", "demand_loads", "prefetch_loads",
             "evictions", "bytes_loaded")

CONTRACT = [("fiddler", {}), ("fiddler", {"tokens": 2}), ("fiddler", {"published": True, "gpu_prefill": 2}),
            ("fiddler", {"stage": 1}), ("hybrimoe", {}), ("hybrimoe", {"published": True, "prefetch": 2}),
            ("hybrimoe", {"split": False}), ("n-cpu-moe", {"gpu_prefill": 2}), ("ktransformers", {"gpu_prefill": 3})]


@pytest.mark.parametrize(("name", "options"), CONTRACT, ids=[f"{n}{o}" for n, o in CONTRACT])
def test_the_per_step_policies_keep_the_contract(name, options):
    check_policy(POLICIES[name], max_examples=40, options=options)


class Flat(ExpertCosts):
    """The same prices for every layer: a copy, the host per token, the GPU."""

    def __init__(self, copy: float, host: float, gpu: float = 0.0) -> None:
        self.c, self.h, self.g = copy, host, gpu

    def copy(self, layer: int) -> float:
        return self.c

    def host(self, layer: int, tokens: int) -> float:
        return self.h * tokens

    def gpu(self, layer: int, tokens: int) -> float:
        return self.g


COPY_WINS = Flat(copy=0.0, host=math.inf)
HOST_WINS = Flat(copy=math.inf, host=0.0, gpu=math.inf)


def _replay(cls, trace: Trace, capacity: Capacity, mode: MissMode, costs: ExpertCosts | None = None, batch: int = 1,
            **options):
    cache = cls.create(trace.geometry, capacity, trace=trace, miss_mode=mode, **options)
    if costs is not None:
        cache.attach_costs(costs)
    return cache, replay(trace, cache, batch).stats


def _same(a, b) -> None:
    for f in DECISIONS:
        assert getattr(a, f) == getattr(b, f), f"{f}: {a} != {b}"


def _land(cache, loads) -> None:
    for ld in loads:
        cache.arrived(ld.expert)


def decode_only() -> st.SearchStrategy[Trace]:
    return traces().map(lambda t: Trace(t.geometry, [Request(r.topk, r.weights, 0, r.prompt) for r in t.requests]))


# ---- fiddler -----------------------------------------------------------------------------------


@FAST
@given(trace=traces(), mode=st.sampled_from(list(MissMode)), slots=st.integers(0, 3), stage=st.integers(1, 4),
       batch=st.integers(1, 2))
def test_fiddler_where_a_copy_always_wins_is_its_staging_placement(trace, mode, slots, stage, batch):
    """Every miss copied for its step: ktransformers' frequency placement copying every host
    expert it meets (`gpu_prefill=1`), with the same staging slots and profile."""
    g = trace.geometry
    cap = Capacity(g.top_k + slots)
    _, fiddler = _replay(Fiddler, trace, cap, mode, COPY_WINS, batch, stage=stage)
    _, base = _replay(KTransformers, trace, cap, mode, None, batch, stage=stage, gpu_prefill=1)
    _same(fiddler, base)


@FAST
@given(trace=traces(), mode=st.sampled_from(list(MissMode)), slots=st.integers(0, 3), batch=st.integers(1, 2))
def test_fiddler_where_the_host_always_wins_loads_nothing_after_the_start(trace, mode, slots, batch):
    g = trace.geometry
    cap = Capacity(g.top_k + slots)
    cache, stats = _replay(Fiddler, trace, cap, mode, HOST_WINS, batch)
    assert stats.demand_loads == 0 and stats.prefetch_loads == len(cache.gpu)  # the GPU set, at the first request
    assert stats.cpu_computed == stats.misses and stats.evictions == 0


def test_fiddler_copies_at_the_published_ratio_of_ten_tokens_a_tie_included():
    """7 per token on the CPU against 70 per copy: 9 tokens stay on the host, 10 copy (a tie
    keeps the GPU, as the released code's first configuration does); `tokens=N` is the same rule
    at N. More copies than free staging slots: the most tokens copy, the rest stay on the host."""
    g = Geometry(1, 4, 1)
    start = Request(np.zeros((1, 1, 1), np.int16), np.ones((1, 1, 1), np.float32), 0)
    popular = np.array([4.0, 3.0, 2.0, 1.0])
    cache = Fiddler(g, Capacity(3), popularity=popular, stage=2)  # GPU: expert 0; two staging slots
    assert cache.gpu == (0,) and cache.costs is None
    _land(cache, cache.begin_request(start))
    acc = cache.route(0, 0, [0, 1, 2, 3], counts=[30, 9, 10, 11], tokens=30)
    assert acc.hits == 1 and acc.cpu == (1,) and [ld.expert for ld in acc.loads] == [2, 3]
    one = Fiddler(g, Capacity(2), popularity=popular, stage=1)  # one staging slot
    _land(one, one.begin_request(start))
    acc = one.route(0, 0, [0, 1, 2, 3], counts=[30, 9, 10, 11], tokens=30)
    assert acc.cpu == (1, 2) and [ld.expert for ld in acc.loads] == [3]
    fixed = Fiddler(g, Capacity(3), popularity=popular, stage=2, tokens=10)
    fixed.attach_costs(COPY_WINS)  # the fixed rule ignores prices
    _land(fixed, fixed.begin_request(start))
    acc = fixed.route(0, 0, [1, 2], counts=[9, 10], tokens=10)
    assert acc.cpu == (1,) and [ld.expert for ld in acc.loads] == [2]


def test_fiddler_releases_its_copies_after_their_layer():
    g = Geometry(2, 4, 1)
    cache = Fiddler(g, Capacity(2), popularity=np.arange(8.0)[::-1].copy(), tokens=2)  # GPU: 0, 1, 2; one stage slot
    assert cache.gpu == (0, 1, 2)
    _land(cache, cache.begin_request(Request(np.zeros((1, 2, 1), np.int16), np.ones((1, 2, 1), np.float32), 0)))
    acc = cache.route(0, 0, [3], counts=[5], tokens=5)
    assert [ld.expert for ld in acc.loads] == [3] and cache.is_resident(3)
    assert cache.route(0, 1, [5], counts=[1], tokens=5).cpu == (5,)  # one token of five: the host
    assert not cache.is_resident(3)  # the next layer started: the copy is gone
    assert cache.route(1, 0, [3]).cpu == (3,) and cache.stats().evictions == 1


# ---- hybrimoe ----------------------------------------------------------------------------------


@FAST
@given(trace=traces(), mode=st.sampled_from(list(MissMode)), slots=st.integers(0, 3), per_layer=st.booleans(),
       batch=st.integers(1, 2))
def test_hybrimoe_where_a_copy_always_wins_is_its_cache(trace, mode, slots, per_layer, batch):
    g = trace.geometry
    cap = Capacity(g.top_k + slots) if per_layer else Capacity(g.top_k + slots, per_layer=False)
    _, split = _replay(HybriMoE, trace, cap, mode, COPY_WINS, batch)
    _, cache = _replay(HybriMoE, trace, cap, mode, None, batch, split=False)
    _same(split, cache)


@FAST
@given(trace=decode_only(), mode=st.sampled_from([MissMode.LOAD, MissMode.CPU]), slots=st.integers(0, 3))
def test_hybrimoe_where_the_host_always_wins_loads_nothing_in_decode(trace, mode, slots):
    g = trace.geometry
    _, stats = _replay(HybriMoE, trace, Capacity(g.top_k + slots), mode, HOST_WINS)
    assert stats.loads == 0 and stats.cpu_computed == stats.misses == stats.accesses


def test_hybrimoe_greedy_with_its_published_times():
    """Three uncached experts of one token: the GPU takes two (0.5 each, the first waiting for
    its 0.418 copy: 0.918, then 1.418), the CPU the third (1 + its 0.79 start-up = 1.79 < 1.918);
    a prefill step (more than one token) loads every miss."""
    g = Geometry(1, 8, 3)
    cache = HybriMoE(g, Capacity(8))
    acc = cache.route(0, 0, [5, 6, 7])
    assert acc.cpu == (7,) and [ld.expert for ld in acc.loads] == [5, 6]
    assert HybriMoE(g, Capacity(8)).route(0, 0, [5, 6, 7], counts=[2, 1, 1], tokens=2).cpu == ()


def test_hybrimoe_evicts_the_lowest_decayed_score():
    g = Geometry(1, 4, 1)
    cache = HybriMoE(g, Capacity(2), split=False)
    for e in (0, 0, 1, 0):  # S: 0 high, 1 lower
        _land(cache, cache.route(0, 0, [e]).loads)
    acc = cache.route(0, 0, [2])
    assert acc.loads[0].victim == 1


def test_hybrimoe_prefetches_the_next_layers_best_scored_uncached_experts_in_decode():
    g = Geometry(2, 4, 1)
    cache = HybriMoE(g, Capacity(1), prefetch=1, split=False)
    for step, layer1 in enumerate((5, 6)):  # layer 1: expert 1, then expert 2 (which evicts it)
        _land(cache, cache.before_layer(step, 0) + list(cache.route(step, 0, [0]).loads))
        _land(cache, cache.before_layer(step, 1) + list(cache.route(step, 1, [layer1]).loads))
    assert cache.is_resident(6) and not cache.is_resident(5)
    assert [ld.expert for ld in cache.before_layer(2, 0)] == [5]  # S[1]: expert 2 (resident) 0.5, expert 1 0.25
    cache.route(2, 0, [0], counts=[3], tokens=3)  # a prefill-sized step: no prefetch after it
    assert cache.before_layer(2, 1) == [] and cache.before_layer(3, 0) == []


# ---- the GPU-prefill threshold -----------------------------------------------------------------


@FAST
@given(trace=traces(), T=st.integers(1, 13), mode=st.sampled_from(list(MissMode)))
def test_the_gpu_prefill_threshold_flips_exactly_at_t(trace, T, mode):
    """Every layer on the host (n = L): a prefill of T tokens or more copies its routed experts
    (all fit the staging slots), a shorter one and every decode token computes them on the host."""
    g = trace.geometry
    cache, stats = _replay(NCpuMoE, trace, Capacity(g.experts), mode, None, 1, n=g.layers, gpu_prefill=T)
    copied = sum(sum(len(e) for e in step.experts) for step in trace.steps() if step.tokens >= T)
    assert stats.demand_loads == copied and stats.cpu_computed == stats.accesses - copied and stats.hits == 0
    _, off = _replay(NCpuMoE, trace, Capacity(g.experts), mode, None, 1, n=g.layers)
    assert off.cpu_computed == off.accesses and off.loads == 0


def test_the_threshold_reserves_a_layer_of_slots_out_of_the_capacity():
    g = Geometry(8, 8, 2)
    assert NCpuMoE(g, Capacity(2)).n == 6 and NCpuMoE(g, Capacity(2), gpu_prefill=32).n == 7
    k = KTransformers(g, Capacity(2), popularity=np.arange(64.0), gpu_prefill=4)
    assert len(k.gpu) == 16 - 8 and k.stage == 8
    assert NCpuMoE(g, Capacity(8), gpu_prefill=32).stage == 0  # every expert on the GPUs: nothing to copy
    with pytest.raises(CacheConfigError, match="gpu_prefill"):
        NCpuMoE(g, Capacity(2), gpu_prefill=0)
    from casmoe.policies import variants

    assert [s.label for s in variants("n-cpu-moe")] == ["n-cpu-moe", "n-cpu-moe[gpu_prefill=32]"]


# ---- runtimes: the simulator and the backend decide as replay ------------------------------------


def _machine(trace: Trace):
    from casmoe.presets import shape_preset
    from casmoe.sim.box.hardware import load_profile
    from casmoe.sim.cost.machine import Machine

    return Machine(shape_preset(trace.geometry, "contract"), load_profile("rtx4090x4"))


@pytest.fixture(scope="module")
def shipped_mixtral() -> Trace:
    from casmoe.shipped import shipped
    from casmoe.trace_io import load_trace

    trace = load_trace(shipped("tiny-mixtral.npz"))
    return trace.subset(list(range(6)))


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("mode", [MissMode.LOAD, MissMode.CPU])
@pytest.mark.parametrize("spec", ["fiddler", "hybrimoe", "hybrimoe[prefetch=2]", "n-cpu-moe[gpu_prefill=32]",
                                  "ktransformers[gpu_prefill=16]"])
def test_the_simulator_decides_as_replay_given_its_prices(shipped_mixtral, spec, mode, batch):
    from casmoe.policies import PolicySpec
    from casmoe.presets import load_presets
    from casmoe.sim.passes.decide import machine_costs
    from casmoe.sim.passes.driver import run_trace
    from casmoe.sim.passes.assembly import Run
    from casmoe.sim.box.hardware import load_profile
    from casmoe.sim.cost.machine import Machine

    trace = shipped_mixtral
    machine = Machine(load_presets()["mixtral-8x7b"], load_profile("rtx4090x4"))
    ps = PolicySpec.parse(spec)
    cap = Capacity(3)
    sim = run_trace(Run(trace, ps.cls, cap, machine, options=dict(ps.options), miss_mode=mode, batch=batch)).stats
    cache = ps.cls.create(trace.geometry, cap, trace=trace, miss_mode=mode, expert_bytes=machine.expert_bytes(trace),
                          **dict(ps.options))
    cache.attach_costs(machine_costs(machine, trace))
    want = replay(trace, cache, batch).stats
    for f in SAME_DECISIONS:
        assert getattr(sim, f) == getattr(want, f), f
    assert sim.hits + sim.late_hits == want.hits
    assert want.cpu_computed > 0


def test_the_prices_change_fiddlers_decisions(shipped_mixtral):
    """On an RTX 4090 box a Mixtral expert copies in ~15 ms and the host computes one token in ~1 ms:
    the simulator's crossover lies near 90 tokens, Fiddler's published one at 10."""
    from casmoe.presets import load_presets
    from casmoe.sim.passes.decide import machine_costs
    from casmoe.sim.box.hardware import load_profile
    from casmoe.sim.cost.machine import Machine

    trace = shipped_mixtral
    costs = machine_costs(Machine(load_presets()["mixtral-8x7b"], load_profile("rtx4090x4")), trace)
    crossover = next(n for n in range(1, 1000) if costs.host(0, n) >= costs.copy(0) + costs.gpu(0, n))
    assert 30 < crossover < 300
    _, published = _replay(Fiddler, trace, Capacity(3), MissMode.LOAD)
    _, priced = _replay(Fiddler, trace, Capacity(3), MissMode.LOAD, costs)
    _, ten = _replay(Fiddler, trace, Capacity(3), MissMode.LOAD, None, 1, tokens=10)
    _same(published, ten)
    assert priced.demand_loads < published.demand_loads


def test_serving_and_substitute_mode_pass_the_step_counts(shipped_mixtral):
    from casmoe.presets import load_presets
    from casmoe.sim.passes.assembly import Run
    from casmoe.sim.passes.driver import run_trace
    from casmoe.sim.box.hardware import load_profile
    from casmoe.sim.cost.machine import Machine
    from casmoe.sim.passes.traffic import Arrival, Traffic

    trace = shipped_mixtral
    machine = Machine(load_presets()["mixtral-8x7b"], load_profile("rtx4090x4"))
    options = {"gpu_prefill": 16}
    offline = run_trace(Run(trace, NCpuMoE, Capacity(3), machine, options=options))
    served = run_trace(Run(trace, NCpuMoE, Capacity(3), machine, options=options, traffic=Traffic(Arrival.CLOSED, max_batch=1)))
    walked = run_trace(Run(trace, NCpuMoE, Capacity(3), machine, options=options, miss_mode=MissMode.SUBSTITUTE))
    assert offline.stats.demand_loads > 0
    for res in (served, walked):
        for f in ("demand_loads", "cpu_computed", "misses"):
            assert getattr(res.stats, f) == getattr(offline.stats, f), f


def test_no_ram_tier_runs_a_policy_that_computes_on_the_host():
    from casmoe.errors import CasmoeError
    from casmoe.sim.box.hardware import load_profile
    from casmoe.sim.passes.tiers import HostCache

    g = Geometry(2, 4, 1)
    tier = HostCache(6, HybriMoE, {})
    with pytest.raises(CasmoeError, match="RAM-tier"):
        tier.build(g, [1000, 1000], load_profile("rtx4090x4"), None)


def test_published_costs_are_flat_and_shift_to_a_shard():
    c = PublishedCosts(copy_cost=70, host_per_token=7)
    assert c.copy(3) == 70 and c.host(3, 2) == 14 and c.gpu(3, 5) == 0 and c.shifted(2) is c


# ---- the backend: the host computes what the policy chose, exactly ---------------------------------


class Noted(Fiddler):
    """Fiddler noting, per (step, layer), the experts it left to the host."""

    def route(self, step, layer, experts, scores=None, counts=None, tokens=None):
        acc = super().route(step, layer, experts, scores, counts, tokens)
        self.noted = getattr(self, "noted", []) + [(layer, sorted(acc.cpu))]
        return acc


@pytest.mark.parametrize("mode", [MissMode.CPU, MissMode.LOAD])
def test_the_backend_computes_on_the_host_exactly_what_the_policy_chose(mode, monkeypatch):
    torch = pytest.importorskip("torch")
    from support.backend_models import plain_greedy, tiny

    from casmoe.backends.device import DeviceRuntime
    from casmoe.backends.runtime import OffloadedModel, Prompt

    prompts = [Prompt([1, 5, 9, 3, 7, 2, 5, 9, 1, 1], "a"), Prompt([4, 4, 8, 1], "b")]
    model = tiny("mixtral")
    want = [plain_greedy(copy.deepcopy(model), p.ids, 4) for p in prompts]
    computed: list[tuple[int, int]] = []
    on_host = DeviceRuntime._on_host

    def note(self, plan, x, local):
        computed.append((local, x))
        return on_host(self, plan, x, local)

    monkeypatch.setattr(DeviceRuntime, "_on_host", note)
    om = OffloadedModel(model)
    with om.session(Noted, Capacity(4), prompts, max_new_tokens=4, miss_mode=mode, options={"tokens": 2}) as s:
        cache = s.devs[0].cache
        s.serve(prompts, 4, keep_logits=True)
        run = s.result()
    chose = [(layer, e - layer * 8) for layer, cpu in cache.noted for e in cpu]
    assert computed == chose and len(chose) == run.stats.cpu_computed > 0
    assert 0 < run.stats.demand_loads  # prompt experts with two tokens or more were copied
    again = Noted.create(run.trace.geometry, Capacity(4), trace=run.trace, miss_mode=mode, tokens=2)
    replay(run.trace, again)
    assert again.noted == cache.noted  # replay decides the same, visit by visit
    for ra, rb in zip(run.logits, want, strict=True):
        for a, b in zip(ra, rb, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert [t.new_tokens for t in run.requests] == [[int(x.argmax()) for x in r] for r in want]


def test_a_substituted_miss_never_evicts_the_gpu_set_for_its_background_copy():
    """Fiddler with one staging slot, substituting misses: when the staging slot holds a copy the
    layer uses, the background copy of a substituted miss has no slot to take (every other
    resident is in the GPU set) and is dropped instead of asking the policy for a victim it
    does not have (a case hypothesis found: PolicyError 'no slot to evict')."""
    g = Geometry(layers=2, experts=3, top_k=1, hidden=8, intermediate=4)
    topk = np.array([[[2], [1]], [[1], [0]], [[0], [0]], [[0], [0]], [[0], [2]], [[1], [2]], [[1], [1]],
                     [[2], [2]], [[1], [1]], [[1], [2]]], dtype=np.int16)
    trace = Trace(g, [Request(topk, np.ones(topk.shape, np.float32), 0, prompt="r", task="t")])
    for miss_mode in MissMode:  # the contract's checks, with the simulator's prices attached
        check_case(Fiddler, Case(trace, Capacity(3, per_layer=False), miss_mode), {"stage": 1})

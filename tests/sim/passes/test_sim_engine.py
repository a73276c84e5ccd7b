"""The simulator against closed forms, the replay runtime, and its own invariants."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from support.builders import shaped_preset, sim_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.cache import Capacity, CacheConfigError, MissMode
from casmoe.geometry import Geometry, GeometryError, split_layers
from casmoe.policies import POLICIES, get_policy
from casmoe.presets import get_preset
from casmoe.replay import replay
from casmoe.sim.cost.compute import FixedCompute
from casmoe.sim.passes.decide import link_costs
from casmoe.sim.passes.assembly import Run, TraceSteps
from casmoe.sim.cost.machine import Machine, SimConfigError
from casmoe.sim.passes.driver import run_trace
from casmoe.sim.box.hardware import HardwareError, load_profile
from casmoe.sim.cost.stack import load_stack
from casmoe.sim.passes.timing import Shard, StepTimer
from casmoe.testing import cases, traces
from casmoe.trace import Request, Trace
from support.paths import REPO

HW = load_profile("rtx4090x4")
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# casmoe runs with each predictor the issue names; every other policy with its defaults.
VARIANTS = [(name, {}) for name in POLICIES if name != "casmoe"] + [
    ("casmoe", {"predictor": "exact"}),
    ("casmoe", {"predictor": "noisy"}),
]




def trace_of(g: Geometry, rows: list[np.ndarray], prefill: int = 0) -> Trace:
    topk = np.asarray(rows, dtype=np.int16)  # [T, L, k]
    weights = np.full(topk.shape, 1.0 / g.top_k, np.float32)
    return Trace(g, [Request(topk, weights, prefill, prompt="p")])


def run(trace, policy="lru", capacity=2, hw=HW, **kw):
    return sim_run(trace, policy, capacity, hw, **kw)


def random_rows(rng, g: Geometry, tokens: int) -> list[np.ndarray]:
    return [np.stack([rng.choice(g.experts, g.top_k, replace=False) for _ in range(g.layers)]) for _ in range(tokens)]


# ---- closed forms --------------------------------------------------------------------------


def test_ondemand_with_zero_compute_is_the_sum_of_copy_times():
    g = Geometry(3, 4, 2, layer_expert_bytes=(1_000_000, 3_000_000, 7_000_000))
    rows = random_rows(np.random.default_rng(1), g, 6)
    res = run(trace_of(g, rows), "ondemand", 2, compute=FixedCompute())
    rate = HW.h2d_pinned_gbs * 1e9
    loads = res.stats.demand_loads
    assert loads == 6 * 3 * 2  # keeps nothing: every routed expert of every token is loaded
    expected = sum(2 * (HW.copy_latency_us * 1e-6 + b / rate) for b in g.layer_expert_bytes) * 6
    assert res.sim_time_s == pytest.approx(expected, rel=1e-12)
    assert res.stall_demand_s == pytest.approx(expected, rel=1e-12) and res.stall_late_s == 0
    assert res.link_bytes == res.stats.bytes_loaded == 6 * 2 * sum(g.layer_expert_bytes)


def test_issuing_overlaps_the_copies_and_a_layer_that_waited_resumes_slower():
    # On-demand with zero compute: each layer issues its k = 2 loads in one burst, host time
    # 2 x load_host_us + load_layer_us during which the copies already run, then waits for the
    # rest of the copies; a layer that waited computes resume_per_stall x its wait more.
    g = Geometry(3, 4, 2, layer_expert_bytes=(1_000_000, 3_000_000, 7_000_000))
    rows = random_rows(np.random.default_rng(1), g, 6)
    hw = dataclasses.replace(HW, load_host_us=7.0, load_layer_us=40.0)
    base = run(trace_of(g, rows), "ondemand", 2, compute=FixedCompute())
    res = run(trace_of(g, rows), "ondemand", 2, hw=hw, compute=FixedCompute())
    layers, issuing = 6 * 3, 2 * 7e-6 + 40e-6
    assert res.compute_s == pytest.approx(layers * issuing, rel=1e-12)
    assert res.sim_time_s == pytest.approx(base.sim_time_s, rel=1e-12)  # issuing is hidden by the copies
    assert res.stall_s == pytest.approx(base.stall_s - layers * issuing, rel=1e-12)
    slower = run(trace_of(g, rows), "ondemand", 2, hw=dataclasses.replace(hw, resume_per_stall=0.25),
                 compute=FixedCompute())
    assert slower.stall_s == pytest.approx(res.stall_s, rel=1e-12)
    assert slower.compute_s == pytest.approx(res.compute_s + 0.25 * res.stall_s, rel=1e-12)
    assert slower.sim_time_s == pytest.approx(res.sim_time_s + 0.25 * res.stall_s, rel=1e-12)
    # Copies shorter than issuing: the layer takes the host's time, and nothing waits or resumes.
    tiny = Geometry(3, 4, 2, layer_expert_bytes=(1000, 1000, 1000))
    quick = run(trace_of(tiny, rows), "ondemand", 2, hw=dataclasses.replace(hw, copy_latency_us=0.0, resume_per_stall=0.25),
                compute=FixedCompute())
    assert quick.stall_s == 0 and quick.sim_time_s == pytest.approx(layers * issuing, rel=1e-12)
    # Every expert resident after a warm-up: layers that issue nothing pay nothing.
    warm = run(trace_of(g, rows[:1] * 5), "lru", 2, hw=hw, compute=FixedCompute())
    assert warm.compute_s == pytest.approx(3 * issuing, rel=1e-12)


def test_the_policys_decisions_delay_the_loads_they_ask_for():
    # On-demand with zero compute: each layer decides (decide_us, plus decide_load_us for each of
    # its k = 2 loads) before issuing, so the loads start that much later and the step is longer
    # by it; a warm LRU that loads nothing pays decide_us per layer and nothing per load.
    g = Geometry(3, 4, 2, layer_expert_bytes=(1_000_000, 3_000_000, 7_000_000))
    rows = random_rows(np.random.default_rng(1), g, 6)
    hw = dataclasses.replace(HW, decide_us=11.0, decide_load_us=3.0)
    base = run(trace_of(g, rows), "ondemand", 2, compute=FixedCompute())
    res = run(trace_of(g, rows), "ondemand", 2, hw=hw, compute=FixedCompute())
    layers, deciding = 6 * 3, 11e-6 + 2 * 3e-6
    assert res.compute_s == pytest.approx(layers * deciding, rel=1e-12)
    assert res.stall_s == pytest.approx(base.stall_s, rel=1e-12)  # the copies start later, take as long
    assert res.sim_time_s == pytest.approx(base.sim_time_s + layers * deciding, rel=1e-12)
    warm = run(trace_of(g, rows[:1] * 5), "lru", 2, hw=hw, compute=FixedCompute())
    cold = run(trace_of(g, rows[:1] * 5), "lru", 2, compute=FixedCompute())
    assert warm.sim_time_s == pytest.approx(cold.sim_time_s + 5 * 3 * 11e-6 + 3 * 2 * 3e-6, rel=1e-12)


def test_a_prefetch_costs_the_compute_it_runs_beside():
    # semoe prefetches the next layer's 4 experts at each layer's start (capacity 4 = E): with
    # copy_beside_us, each of those loads adds its cost to the compute that issued it.
    g = Geometry(3, 4, 2, hidden=8, intermediate=4)
    rows = random_rows(np.random.default_rng(2), g, 4)
    plain = run(trace_of(g, rows), "semoe", 4, compute=FixedCompute(layer_s=1e-2))
    beside = run(trace_of(g, rows), "semoe", 4, hw=dataclasses.replace(HW, copy_beside_us=50.0),
                 compute=FixedCompute(layer_s=1e-2))
    assert beside.compute_s == pytest.approx(plain.compute_s + plain.stats.prefetch_loads * 50e-6, rel=1e-12)


def test_a_prefetch_may_land_while_the_dense_part_runs():
    # semoe prefetches layer l + 1's experts (E = k = 2: both) when layer l starts (2 copies of x);
    # layer l + 1 needs them once its dense part is done, 2 layers later (the router chooses
    # after it). With layer_s = 1.5x: layer 0's demand loads (issued after its dense part, at
    # 1.5x) queue behind the prefetches on the wire until 2x, land at 4x (stall 2.5x). Layers
    # 1-4 never wait: each prefetch lands by the end of its layer's dense part (layer 4's just
    # then: the wire, busy 2x per 1.5x layer, falls behind), so 4x + 4 x 1.5x. Waiting from the
    # layer's start instead would stall layers 2-4.
    g = Geometry(5, 2, 2, hidden=8, intermediate=4, layer_expert_bytes=(8_000_000,) * 5)
    x = HW.copy_latency_us * 1e-6 + 8_000_000 / (HW.h2d_pinned_gbs * 1e9)
    rows = random_rows(np.random.default_rng(5), g, 1)
    res = run(trace_of(g, rows), "semoe", g.experts, compute=FixedCompute(layer_s=1.5 * x))
    assert res.stall_by_layer_s[0] == pytest.approx(2.5 * x, rel=1e-12)
    assert res.stall_by_layer_s[1:] == pytest.approx([0.0] * 4, abs=1e-12)
    assert res.sim_time_s == pytest.approx(10 * x, rel=1e-12)


def test_every_expert_resident_takes_exactly_the_compute_time():
    # Request 0 is prefill only and touches every expert; request 1 then decodes with all of
    # them resident, so each of its tokens takes L x (layer + k x expert) and never stalls.
    g = Geometry(4, 3, 2, hidden=8, intermediate=4)
    warm = [np.stack([[0, 1], [1, 2], [2, 0], [0, 2]])] + [np.stack([[1, 2], [0, 1], [0, 1], [1, 0]])]
    rng = np.random.default_rng(3)
    decode = np.asarray(random_rows(rng, g, 7), dtype=np.int16)
    reqs = [
        Request(np.asarray(warm, np.int16), np.full((2, 4, 2), 0.5, np.float32), prefill=2, prompt="a"),
        Request(decode, np.full(decode.shape, 0.5, np.float32), prefill=0, prompt="b"),
    ]
    compute = FixedCompute(layer_s=1e-3, expert_s=2e-4)
    res = run_trace(Run(Trace(g, reqs), get_policy("lru"), Capacity(3), Machine(shaped_preset(g), HW)), compute=compute)
    per_token = g.layers * (1e-3 + g.top_k * 2e-4)
    assert res.decode_tokens == 7
    for q in ("p50", "p90", "p99"):
        assert getattr(res, f"token_latency_{q}_s") == pytest.approx(per_token, rel=1e-12)
    assert res.decode_tokens_per_s == pytest.approx(1 / per_token, rel=1e-12)
    # A fixed cost per device pass over a layer's experts: once per layer.
    passing = run_trace(Run(Trace(g, reqs), get_policy("lru"), Capacity(3), Machine(shaped_preset(g), HW)), compute=dataclasses.replace(compute, expert_pass=3e-4))
    assert passing.token_latency_p50_s == pytest.approx(per_token + g.layers * 3e-4, rel=1e-12)
    # Split over 2 devices: each token pays one activation hand-over more.
    handover = dataclasses.replace(compute, handover_s=5e-5)
    split = run_trace(Run(Trace(g, reqs), get_policy("lru"), Capacity(3), Machine(shaped_preset(g), HW, devices=2)), compute=handover)
    assert split.token_latency_p50_s == pytest.approx(per_token + 5e-5, rel=1e-12)
    assert res.stats.misses == g.total_experts  # only the warm-up's cold misses


def test_the_expert_pass_is_paid_by_device_experts_only_and_host_experts_add_as_cpu_serial_says():
    g = Geometry(3, 4, 2, hidden=8, intermediate=4)
    rows = random_rows(np.random.default_rng(7), g, 5)
    compute = FixedCompute(layer_s=1e-3, expert_s=1e-4, cpu_expert_s=3e-4, expert_pass=2e-4)
    # ondemand in the cpu miss mode: every routed expert runs on the host, no pass, no copy
    host = run(trace_of(g, rows), "ondemand", 2, compute=compute, miss_mode=MissMode.CPU)
    assert host.stats.cpu_computed == 5 * 3 * 2 and host.stall_s == 0
    assert host.sim_time_s == pytest.approx(5 * 3 * (1e-3 + 2 * 3e-4), rel=1e-12)
    # a layer with experts on both sides: the longer of the two beside a GPU, the sum on one thread
    timer = StepTimer([], [], compute, MissMode.CPU, 1, 4)
    shard = Shard(None, 0, [], [0], [1], [1e-4])
    assert timer._experts_time(shard, 0, [0, 1, 2], [1, 1, 1], [2]) == pytest.approx(4e-4)  # max(2e-4 + 2 x 1e-4, 3e-4)
    timer.compute = dataclasses.replace(compute, cpu_serial=1.0)
    assert timer._experts_time(shard, 0, [0, 1, 2], [1, 1, 1], [2]) == pytest.approx(7e-4)
    assert timer._experts_time(shard, 0, [0, 1], [1, 1], [0, 1]) == pytest.approx(6e-4)  # all on the host: no pass


def test_semoe_with_long_compute_hides_every_transfer_but_the_first_layers():
    g = Geometry(5, 4, 2, hidden=8, intermediate=4, layer_expert_bytes=(8_000_000,) * 5)
    x = HW.copy_latency_us * 1e-6 + 8_000_000 / (HW.h2d_pinned_gbs * 1e9)
    layer_s = 1.5 * g.experts * x  # longer than loading a whole layer
    rows = random_rows(np.random.default_rng(5), g, 1)
    res = run(trace_of(g, rows), "semoe", g.experts, compute=FixedCompute(layer_s=layer_s))
    assert res.stall_by_layer_s[0] == pytest.approx(g.top_k * x, rel=1e-12)
    assert all(s == 0 for s in res.stall_by_layer_s[1:])
    assert res.sim_time_s == pytest.approx(g.top_k * x + g.layers * layer_s, rel=1e-12)
    assert res.stats.hits + res.stats.late_hits == (g.layers - 1) * g.top_k


def test_prefetch_arriving_late_is_a_late_hit_and_stalls_as_late_prefetch():
    # semoe prefetches layer 1 while layer 0 runs; with no compute it cannot arrive in time.
    g = Geometry(2, 2, 1, hidden=8, intermediate=4, layer_expert_bytes=(4_000_000, 4_000_000))
    res = run(trace_of(g, [np.array([[0], [1]])]), "semoe", 2, compute=FixedCompute())
    assert res.stats.late_hits == 1
    assert res.stall_late_s > 0


# ---- counts equal replay's ------------------------------------------------------------------


@pytest.mark.parametrize("name,options", VARIANTS, ids=[f"{n}{o.get('predictor', '')}" for n, o in VARIANTS])
@FAST
@given(case=cases(), instant=st.booleans())
def test_counts_equal_replay_in_load_mode(name, options, case, instant):
    # With zero compute nothing prefetched lands in time: late hits and evictions of experts
    # still in flight (cancelled loads) happen often.
    trace, cap = case.trace, case.capacity
    cls = get_policy(name)
    compute = FixedCompute() if instant else None
    machine = Machine(shaped_preset(trace.geometry), HW)
    cache = cls.create(trace.geometry, cap, trace=trace, **options)
    nbytes = machine.expert_bytes(trace)  # a cost-based policy weighs the simulator's prices (fiddler, hybrimoe)
    cache.attach_costs(link_costs(compute or machine.compute(nbytes), machine, nbytes))
    expected = replay(trace, cache).stats
    got = run_trace(Run(trace, cls, cap, machine, options=options), compute=compute).stats
    assert got.hits + got.late_hits == expected.hits
    assert dataclasses.replace(got, hits=expected.hits, late_hits=0) == expected


@pytest.mark.parametrize("name", ["lru", "belady", "semoe"])
@FAST
@given(trace=traces(max_tokens=8), devices=st.integers(2, 3))
def test_layers_split_over_devices_count_like_one_device(name, trace, devices):
    # Per-layer pools live on their layer's device: splitting moves time, never decisions.
    devices = min(devices, trace.geometry.layers)
    cap = trace.geometry.top_k + 1
    one = run(trace, name, cap)
    split = run(trace, name, cap, devices=devices)
    assert split.stats.hits + split.stats.late_hits == one.stats.hits + one.stats.late_hits
    assert split.stats.loads == one.stats.loads and split.stats.bytes_loaded == one.stats.bytes_loaded
    assert len(split.link_utilisation) == devices


def test_global_pool_is_split_into_one_cache_per_device():
    tr = _mixtral_trace(2)
    p = get_preset("mixtral-8x7b")
    res = run_trace(Run(tr, get_policy("lru"), Capacity(96, per_layer=False), Machine(p, HW, devices=4)))
    assert res.stats.accesses == sum(len(e) for s in tr.steps() for e in s.experts)
    assert all(u > 0 for u in res.link_utilisation)
    with pytest.raises(CacheConfigError, match="split over 4 devices"):
        run_trace(Run(tr, get_policy("lru"), Capacity(4, per_layer=False), Machine(p, HW, devices=4)))


def test_next_layer_prefetch_crosses_to_the_next_devices_link():
    # Two layers on two devices: semoe prefetches layer 1 while layer 0 runs, over link 1.
    g = Geometry(2, 4, 1, hidden=8, intermediate=4, layer_expert_bytes=(8_000_000, 8_000_000))
    rows = [np.array([[0], [1]]), np.array([[0], [1]])]
    res = run(trace_of(g, rows), "semoe", 4, devices=2, compute=FixedCompute(layer_s=1.0))
    assert res.stall_by_layer_s[1] == 0  # layer 1's experts arrived during layer 0's compute
    assert res.link_utilisation[1] > 0


# ---- monotone -------------------------------------------------------------------------------


def _profile_with(rate: float):
    return HW.with_values(h2d_pinned_gbs=rate, sources={"h2d_pinned_gbs": "test"})


@pytest.mark.parametrize("name", ["ondemand", "lru", "belady", "lfu"])
@FAST
@given(trace=traces(max_tokens=8), slow=st.floats(1.0, 30.0), factor=st.floats(1.0, 10.0))
def test_more_bandwidth_is_never_slower(name, trace, slow, factor):
    cap = trace.geometry.top_k + 1
    a = run(trace, name, cap, hw=_profile_with(slow))
    b = run(trace, name, cap, hw=_profile_with(slow * factor))
    assert b.sim_time_s <= a.sim_time_s * (1 + 1e-12)


@pytest.mark.parametrize("name", ["lru", "belady"])
@FAST
@given(trace=traces(max_tokens=10), extra=st.integers(1, 3))
def test_a_larger_cache_is_never_slower(name, trace, extra):
    k = trace.geometry.top_k
    small = run(trace, name, k)
    large = run(trace, name, k + extra)
    assert large.sim_time_s <= small.sim_time_s * (1 + 1e-12)
    assert large.stats.misses <= small.stats.misses


# ---- determinism, batching, miss modes ----------------------------------------------------------


def _mixtral_trace(requests: int = 3, seed: int = 0) -> Trace:
    g = get_preset("mixtral-8x7b").geometry
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(requests):
        rows = np.asarray(random_rows(rng, g, 12), dtype=np.int16)
        reqs.append(Request(rows, np.full(rows.shape, 0.5, np.float32), prefill=4, prompt=f"p{i}"))
    return Trace(g, reqs)


def test_same_inputs_same_result():
    tr = _mixtral_trace()
    p = get_preset("mixtral-8x7b")
    a = run_trace(Run(tr, get_policy("casmoe"), Capacity(4), Machine(p, HW, devices=4), options={"predictor": "noisy"}))
    b = run_trace(Run(tr, get_policy("casmoe"), Capacity(4), Machine(p, HW, devices=4), options={"predictor": "noisy"}))
    assert a.to_dict() == b.to_dict()


def test_a_callers_latency_log_holds_each_decode_step_in_request_order():
    from casmoe.sim.passes.latency import LatencyLog
    from casmoe.sim.passes.traffic import Arrival, Traffic

    g = Geometry(2, 4, 2)
    rng = np.random.default_rng(3)
    requests = [Request(np.asarray(random_rows(rng, g, n), np.int16), np.full((n, 2, 2), 0.5, np.float32), 2, prompt="p")
                for n in (5, 3)]
    tr = Trace(g, requests)
    log = LatencyLog()
    res = run(tr, "ondemand", 2, compute=FixedCompute(), latency=log)
    # prompts of 2: a prefill (its first token), then the rest decode one step each
    assert len(log.token_latency) == res.decode_tokens == (5 - 2) + (3 - 2)
    assert sorted(log.ttft) == [0, 1] and log.ttft[1] > log.ttft[0]
    # on-demand without compute: every step copies k experts per layer, the same time each
    assert log.token_latency == pytest.approx([log.token_latency[0]] * 4, rel=1e-12)
    assert log.token_latency[0] > 2 * g.layers * HW.copy_latency_us * 1e-6 * (1 - 1e-9)
    assert np.median(log.token_latency) == pytest.approx(res.token_latency_p50_s)
    with pytest.raises(SimConfigError, match="one after another"):
        run(tr, "lru", 2, latency=LatencyLog(), traffic=Traffic(Arrival.CLOSED, users=1))


def test_roofline_decode_is_bound_by_weight_streaming():
    p = get_preset("mixtral-8x7b")
    c = Machine(p, HW).compute(p.geometry.bytes_per_layer())
    stream = p.geometry.expert_bytes() / (HW.mem_bw_gbs * 1e9 * HW.mem_efficiency)
    assert c.expert(0, 1) == pytest.approx(stream)  # the ideal stack launches nothing from the host
    eager = Machine(p, HW, stack=dataclasses.replace(load_stack("ideal"), launch_share=1.0)).compute(p.geometry.bytes_per_layer())
    assert eager.expert(0, 1) == pytest.approx(stream + HW.expert_overhead_us * 1e-6)  # an eager one pays each launch
    assert c.expert(0, 4096) > c.expert(0, 1)  # prefill-size batches become FLOP bound


def test_batching_merges_decode_steps_and_raises_throughput():
    tr = _mixtral_trace(4)
    p = get_preset("mixtral-8x7b")
    one = run_trace(Run(tr, get_policy("lru"), Capacity(8), Machine(p, HW), batch=1))
    four = run_trace(Run(tr, get_policy("lru"), Capacity(8), Machine(p, HW), batch=4), plan=TraceSteps.build(tr, 4, 1))
    assert one.decode_tokens == four.decode_tokens == 4 * 8
    assert four.decode_tokens_per_s > one.decode_tokens_per_s


def test_substitute_and_cpu_modes_never_stall_on_misses():
    tr = _mixtral_trace()
    p = get_preset("mixtral-8x7b")
    load = run_trace(Run(tr, get_policy("lru"), Capacity(2), Machine(p, HW)))
    for mode in (MissMode.SUBSTITUTE, MissMode.CPU):
        res = run_trace(Run(tr, get_policy("lru"), Capacity(2), Machine(p, HW), miss_mode=mode))
        assert res.sim_time_s < load.sim_time_s
        assert res.stats.demand_loads < load.stats.demand_loads


def test_host_cap_slows_parallel_prefetch():
    tr = _mixtral_trace(2)
    p = get_preset("mixtral-8x7b")
    capped = HW.with_values(host_cap_gbs=10.0, sources={"host_cap_gbs": "test"})
    free = run_trace(Run(tr, get_policy("casmoe"), Capacity(4), Machine(p, HW, 4), options={"predictor": "exact"}))
    slow = run_trace(Run(tr, get_policy("casmoe"), Capacity(4), Machine(p, capped, 4), options={"predictor": "exact"}))
    assert slow.sim_time_s > free.sim_time_s
    assert slow.stats.late_hits > free.stats.late_hits  # the same prefetches, landing later
    assert slow.stats.hits + slow.stats.late_hits == free.stats.hits + free.stats.late_hits


# ---- invalid input ------------------------------------------------------------------------------


def test_unknown_profile_names_the_shipped_ones():
    with pytest.raises(HardwareError, match="rtx4090x4"):
        load_profile("rtx9999")


def test_capacity_below_top_k_runs_with_staging_slots():
    """Mixtral-Offloading's one resident expert per layer: it runs, and keeps fewer experts than
    two slots do (more misses, more bytes on the link, a longer run)."""
    tr = _mixtral_trace(1)
    one = run_trace(Run(tr, get_policy("lru"), Capacity(1), Machine(get_preset("mixtral-8x7b"), HW)))
    two = run_trace(Run(tr, get_policy("lru"), Capacity(2), Machine(get_preset("mixtral-8x7b"), HW)))
    assert one.stats.accesses == two.stats.accesses
    assert one.stats.misses > two.stats.misses and one.link_bytes > two.link_bytes
    assert one.sim_time_s > two.sim_time_s


def test_trace_that_does_not_match_the_preset_names_the_fix():
    tr = _mixtral_trace(1)
    with pytest.raises(SimConfigError, match="--model mixtral-8x7b"):
        run_trace(Run(tr, get_policy("lru"), Capacity(4), Machine(get_preset("qwen3-30b-a3b"), HW)))


def test_devices_beyond_layers_is_an_error():
    with pytest.raises(GeometryError, match="devices"):
        split_layers(4, 5)
    assert [len(r) for r in split_layers(32, 3)] == [11, 11, 10]


def test_four_4090s_hold_every_mixtral_expert_with_a_2_gib_reserve_and_seven_with_more():
    p = get_preset("mixtral-8x7b")
    # 22 GiB per card after the 2 GiB reserve: 8 layers x 8 x 352 MB (22.55 GB) + their dense
    # part (0.67 GB) + the embedding table or the head (0.26 GB) = 23.48 GB of 23.62 GB.
    assert HW.reserved_gib == 2.0
    assert Machine(p, HW, 4).max_slots(p.geometry.bytes_per_layer()) == 8
    tighter = dataclasses.replace(HW, reserved_gib=2.2)  # 0.21 GB more: the eighth expert no longer fits
    assert Machine(p, tighter, 4).max_slots(p.geometry.bytes_per_layer()) == 7
    assert Machine(p, HW, 1).max_slots(p.geometry.bytes_per_layer()) == 1


QWEN = REPO / "traces" / "real" / "qwen.route.csv"


def test_real_qwen_trace_with_forced_top6_and_measured_bytes():
    from casmoe.importers import read_route_csv

    tr = read_route_csv(QWEN)  # Qwen3-30B-A3B, 6 of 8 experts forced, Q4_K_M bytes per layer
    p = get_preset("qwen3-30b-a3b")
    res = run_trace(Run(tr, get_policy("lru"), Capacity(12), Machine(p, HW)))
    expected = replay(tr, get_policy("lru").create(tr.geometry, Capacity(12), trace=tr)).stats
    assert res.quant == "trace" and res.stats.bytes_loaded == expected.bytes_loaded
    assert res.stats.hits + res.stats.late_hits == expected.hits and res.stats.misses == expected.misses
    assert res.decode_tokens == tr.requests[0].decode_tokens > 0


@pytest.mark.parametrize("capacity", [Capacity(2), Capacity(4, per_layer=False)])
def test_timeline_names_copies_by_global_layer_on_their_devices_track(capacity):
    from casmoe.sim.passes.timeline import LINK_TRACK, Timeline

    g = Geometry(2, 4, 1, hidden=8, intermediate=4, layer_expert_bytes=(1000, 1000))
    tr = trace_of(g, [np.array([[3], [2]])])
    tl = Timeline(g.experts, 2)
    run_trace(Run(tr, get_policy("lru"), capacity, Machine(shaped_preset(g), HW, devices=2)), timeline=tl)
    copies = {(e["pid"], e["name"]) for e in tl.to_chrome()["traceEvents"] if e.get("tid") == LINK_TRACK and e["ph"] == "X"}
    assert copies == {(0, "L0E3"), (1, "L1E2")}


@pytest.mark.parametrize("name", ["lru", "semoe", "belady"])
@FAST
@given(trace=traces(max_tokens=8), devices=st.integers(1, 2), instant=st.booleans())
def test_time_accounting_and_serial_tracks(name, trace, devices, instant):
    """Time is compute + stalls (+ hand-overs); a wire and a compute stream never overlap."""
    from casmoe.sim.passes.timeline import Timeline

    devices = min(devices, trace.geometry.layers)
    tl = Timeline(trace.geometry.experts, devices)
    compute = FixedCompute(layer_s=0.0 if instant else 2e-6, expert_s=1e-6) if devices == 1 else None
    res = run(trace, name, trace.geometry.top_k + 1, devices=devices, compute=compute, timeline=tl)
    if devices == 1:
        assert res.sim_time_s == pytest.approx(res.compute_s + res.stall_s, rel=1e-9, abs=1e-15)
    assert res.link_bytes <= res.stats.bytes_loaded
    assert sum(res.stall_by_layer_s) == pytest.approx(res.stall_s, rel=1e-9, abs=1e-15)
    tracks: dict = {}
    for e in tl.to_chrome()["traceEvents"]:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        spans.sort()
        assert all(b[0] >= a[1] - 1e-6 for a, b in zip(spans, spans[1:]))  # microseconds

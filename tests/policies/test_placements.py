"""Closed forms for the fixed placements: llama.cpp's `n-cpu-moe` and KTransformers' frequency
placement. `check_policy` runs both in every miss mode in tests/policies/test_policies.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.cache import Capacity, CacheConfigError, MissMode
from casmoe.geometry import Geometry
from casmoe.policies import get_policy
from casmoe.policies.ktransformers import KTransformers
from casmoe.policies.n_cpu_moe import NCpuMoE
from casmoe.presets import ModelPreset
from casmoe.replay import replay
from casmoe.sim.passes.driver import run_trace
from casmoe.sim.passes.assembly import Run
from casmoe.sim.cost.machine import Machine
from casmoe.sim.box.hardware import load_profile
from casmoe.testing import traces
from casmoe.trace import Request, Trace
from casmoe.trace_io import load_trace

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


def _sim(trace: Trace, name: str, capacity: Capacity, miss_mode: MissMode, **options):
    g = trace.geometry
    preset = ModelPreset("contract", "test", g, heads=1, kv_heads=1, head_dim=g.hidden or 8, vocab=16)
    return run_trace(Run(trace, get_policy(name), capacity, Machine(preset, load_profile("rtx4090x4")), options=options, miss_mode=miss_mode), compiled=False)


@FAST
@given(trace=traces(), mode=st.sampled_from(list(MissMode)))
def test_n_cpu_moe_with_every_layer_on_the_host_is_the_cpu_miss_mode_of_on_demand(trace, mode):
    g = trace.geometry
    placed = _sim(trace, "n-cpu-moe", Capacity(g.top_k), mode, n=g.layers)
    host = _sim(trace, "ondemand", Capacity(g.top_k), MissMode.CPU)
    assert placed.stats.cpu_computed == placed.stats.accesses == host.stats.cpu_computed
    assert placed.stats.loads == 0
    assert placed.sim_time_s == host.sim_time_s and placed.decode_tokens_per_s == host.decode_tokens_per_s


@FAST
@given(trace=traces(), mode=st.sampled_from(list(MissMode)))
def test_n_cpu_moe_with_no_host_layer_holds_every_expert_from_the_first_request(trace, mode):
    g = trace.geometry
    cache = NCpuMoE.create(g, Capacity(g.experts), trace=trace, miss_mode=mode, n=0)
    stats = replay(trace, cache).stats
    assert stats.hits == stats.accesses and stats.misses == stats.cpu_computed == 0
    assert stats.prefetch_loads == g.total_experts and stats.demand_loads == stats.evictions == 0
    res = _sim(trace, "n-cpu-moe", Capacity(g.experts), mode, n=0)
    assert res.stall_demand_s == 0 and res.stats.cpu_computed == 0
    # the same placement, named by frequency: every expert on the GPUs
    same = _sim(trace, "ktransformers", Capacity(g.experts), mode)
    assert same.sim_time_s == res.sim_time_s


@FAST
@given(trace=traces(), data=st.data())
def test_n_cpu_moe_hosts_exactly_its_first_layers(trace, data):
    g = trace.geometry
    n = data.draw(st.integers(0, g.layers))
    cache = NCpuMoE.create(g, Capacity(g.experts), trace=trace, n=n)
    stats = replay(trace, cache).stats
    routed = np.array([[len(e) for e in step.experts] for step in trace.steps()]).reshape(-1, g.layers).sum(axis=0)  # [L]
    assert stats.cpu_computed == int(routed[:n].sum())
    assert stats.hits == int(routed[n:].sum())


def test_n_cpu_moe_by_default_hosts_the_fewest_layers_the_capacity_needs_and_refuses_too_few():
    g = Geometry(8, 8, 2)
    assert NCpuMoE(g, Capacity(2)).n == 6  # 16 slots: two whole layers
    assert NCpuMoE(g, Capacity(3)).n == 5  # 24 slots: three
    assert NCpuMoE(g, Capacity(20, per_layer=False)).n == 6
    with pytest.raises(CacheConfigError, match=r"n-cpu-moe\[n=3\] keeps 5 layers .* use n >= 6"):
        NCpuMoE(g, Capacity(2), n=3)


@FAST
@given(trace=traces(), extra=st.integers(0, 3))
def test_ktransformers_keeps_the_most_routed_experts_of_all_layers(trace, extra):
    g = trace.geometry
    cap = Capacity(min(g.top_k + extra, g.experts))
    cache = KTransformers.create(g, cap, trace=trace)  # profiled on the very requests it runs: exact
    counts = trace.popularity().ravel()  # what it ranks by (tokens)
    used = np.zeros(g.total_experts, np.int64)  # what the runtime routes (a prefill's union once)
    for step in trace.steps():
        for ids in step.experts:
            np.add.at(used, ids, 1)
    budget = cap.slots * g.layers
    on_gpu = np.zeros(g.total_experts, bool)
    on_gpu[list(cache.gpu)] = True
    assert on_gpu.sum() == budget
    if (~on_gpu).any():  # no hotter expert left on the host
        assert counts[on_gpu].min() >= counts[~on_gpu].max()
    stats = replay(trace, cache).stats
    assert stats.hits == int(used[on_gpu].sum()) and stats.cpu_computed == int(used[~on_gpu].sum())


@FAST
@given(trace=traces(), extra=st.integers(0, 3))
def test_ktransformers_uniform_holds_the_same_count_per_layer_by_id(trace, extra):
    """SGLang's default placement: each layer's lowest ids, layers differing by one at most."""
    g = trace.geometry
    cap = Capacity(min(g.top_k + extra, g.experts))
    cache = KTransformers.create(g, cap, strategy="uniform")
    per_layer = [sorted(e % g.experts for e in cache.gpu if e // g.experts == layer) for layer in range(g.layers)]
    assert sum(map(len, per_layer)) == cap.slots * g.layers
    assert max(map(len, per_layer)) - min(map(len, per_layer)) <= 1
    assert all(ids == list(range(len(ids))) for ids in per_layer)
    used = np.zeros(g.total_experts, np.int64)
    for step in trace.steps():
        for ids in step.experts:
            np.add.at(used, ids, 1)
    on_gpu = np.zeros(g.total_experts, bool)
    on_gpu[list(cache.gpu)] = True
    stats = replay(trace, cache).stats
    assert stats.hits == int(used[on_gpu].sum()) and stats.cpu_computed == int(used[~on_gpu].sum())


def test_ktransformers_uniform_reads_no_routing():
    from casmoe.policies import PolicySpec
    from casmoe.shipped import shipped

    trace = load_trace(shipped("tiny-mixtral.npz"))
    assert PolicySpec.parse("ktransformers[strategy=uniform]").fitted_requests(trace) == set()
    with pytest.raises(CacheConfigError, match="strategy must be one of"):
        KTransformers.create(trace.geometry, Capacity(2), strategy="random")


def test_ktransformers_and_n_cpu_moe_profile_only_the_train_split():
    from casmoe.policies import PolicySpec
    from casmoe.selection import split_indices
    from casmoe.shipped import shipped

    trace = load_trace(shipped("tiny-mixtral.npz"))
    train = set(split_indices(trace, "train"))
    assert PolicySpec("ktransformers").fitted_requests(trace) == train
    assert PolicySpec("n-cpu-moe").fitted_requests(trace) == set()  # llama.cpp's layers depend on no routing
    bound = PolicySpec("ktransformers").bound(trace)["profile"]
    assert len(bound.requests) == len(train)


def test_a_placement_needs_host_compute_in_the_profile():
    import dataclasses

    from casmoe.errors import CasmoeError

    g = Geometry(2, 4, 1, hidden=8, intermediate=8)
    trace = Trace(g, [Request(np.zeros((3, 2, 1), np.int16), np.ones((3, 2, 1), np.float32), 1)])
    preset = ModelPreset("contract", "test", g, heads=1, kv_heads=1, head_dim=8, vocab=16)
    hw = dataclasses.replace(load_profile("rtx4090x4"), cpu_tflops=0.0)
    with pytest.raises(CasmoeError, match="cpu_tflops"):
        run_trace(Run(trace, NCpuMoE, Capacity(1), Machine(preset, hw)))


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("served", [False, True])
def test_the_start_up_fill_lands_before_the_clock_starts(compiled, served):
    """A placement's GPU experts are loaded once, at start-up: never a wait of the first
    request (its TTFT), counted apart at the links' rate, the decisions unchanged."""
    from casmoe.presets import get_preset
    from casmoe.shipped import shipped
    from casmoe.sim.passes.traffic import Arrival, Traffic

    trace = load_trace(shipped("tiny-mixtral.npz")).subset(range(3))
    machine = Machine(get_preset("mixtral-8x7b"), load_profile("rtx4090x4@gpus=1"))
    traffic = Traffic(Arrival.CLOSED, max_batch=1) if served else None
    cap = Capacity(96, per_layer=False)
    res = run_trace(Run(trace, NCpuMoE, cap, machine, traffic=traffic), compiled=compiled)
    nbytes = machine.expert_bytes(trace)
    held = [e for e in range(trace.geometry.total_experts)
            if e // trace.geometry.experts >= trace.geometry.layers - 12]  # 96 experts: the last 12 layers
    assert res.setup_bytes == sum(nbytes[e // trace.geometry.experts] for e in held)
    assert res.setup_s == pytest.approx(sum(machine.copy_seconds(nbytes[e // trace.geometry.experts]) for e in held))
    assert res.link_bytes == 0 and res.stall_demand_s == 0 and res.stall_late_s == 0  # nothing is copied in the run
    first = trace.requests[0]
    expect = replay(trace, NCpuMoE.create(trace.geometry, cap, trace=trace)).stats
    assert (res.stats.hits, res.stats.misses) == (expect.hits, expect.misses)  # the same decisions
    assert res.ttft_p50_s < res.setup_s  # the fill is not in the first answer's wait
    assert first.prefill > 0

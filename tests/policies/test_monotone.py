"""Metrics that their definitions make monotone stay so: a run never gets slower with more host
threads, a faster link or more host bandwidth, and a reactive cache's hit rate never falls as it
gets more slots (LRU, a stack algorithm: every smaller cache's contents are a subset)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.cache import Capacity
from casmoe.policies import get_policy
from casmoe.presets import get_preset
from casmoe.replay import replay
from casmoe.shipped import shipped
from casmoe.sim.box.hardware import load_profile
from casmoe.sim.cost.machine import Machine
from casmoe.sim.passes.assembly import Run
from casmoe.sim.passes.driver import run_trace
from casmoe.trace_io import load_trace

FEW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
REL = 1e-9  # float arithmetic's own noise


@pytest.fixture(scope="module")
def trace():
    return load_trace(shipped("tiny-mixtral.npz")).subset(range(2))


def decode(trace, hw, policy="n-cpu-moe", capacity=Capacity(64, per_layer=False), **machine) -> float:
    m = Machine(get_preset("mixtral-8x7b"), hw, **machine)
    return run_trace(Run(trace, get_policy(policy), capacity, m)).decode_tokens_per_s


def box(threads: int | None = None, thread_gbs: float = 4.0):
    hw = load_profile("rtx4090x4@gpus=1").with_values(cpu_cores=24, cpu_thread_gbs=thread_gbs,
                                                      sources={"cpu_cores": "test", "cpu_thread_gbs": "test"})
    return hw if threads is None else hw.with_values(cpu_threads=threads, sources={"cpu_threads": "test"})


@FEW
@given(a=st.integers(1, 48), b=st.integers(1, 48))
def test_more_host_threads_never_slow_a_placement(trace, a, b):
    lo, hi = sorted((a, b))
    assert decode(trace, box(hi)) >= decode(trace, box(lo)) * (1 - REL)


@FEW
@given(a=st.floats(2.0, 64.0), b=st.floats(2.0, 64.0))
def test_a_faster_link_never_slows_a_cache(trace, a, b):
    lo, hi = sorted((a, b))
    slow = decode(trace, box().with_values(h2d_pinned_gbs=lo, sources={"h2d_pinned_gbs": "test"}), "lru", Capacity(3))
    fast = decode(trace, box().with_values(h2d_pinned_gbs=hi, sources={"h2d_pinned_gbs": "test"}), "lru", Capacity(3))
    assert fast >= slow * (1 - REL)


@FEW
@given(a=st.floats(20.0, 400.0), b=st.floats(20.0, 400.0))
def test_more_host_bandwidth_never_slows_a_placement(trace, a, b):
    lo, hi = sorted((a, b))
    slow = decode(trace, box().with_values(cpu_mem_bw_gbs=lo, sources={"cpu_mem_bw_gbs": "test"}))
    fast = decode(trace, box().with_values(cpu_mem_bw_gbs=hi, sources={"cpu_mem_bw_gbs": "test"}))
    assert fast >= slow * (1 - REL)


@pytest.mark.parametrize("name", ["lru", "lfu"])
def test_a_reactive_cache_hits_more_with_more_slots(trace, name):
    rates = [replay(trace, get_policy(name).create(trace.geometry, Capacity(c), trace=trace)).stats.warm_hit_rate
             for c in range(1, 8)]
    assert rates == sorted(rates)

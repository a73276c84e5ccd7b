"""Per-layer prefetch timeliness and the perfect-prefetch stall bound."""

from __future__ import annotations

import numpy as np
import pytest
from support.builders import shaped_preset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.cache import Capacity
from casmoe.geometry import Geometry
from casmoe.policies import POLICIES, get_policy
from casmoe.sim.cost.compute import FixedCompute
from casmoe.sim.passes.driver import run_trace
from casmoe.sim.passes.assembly import Run
from casmoe.sim.cost.machine import Machine
from casmoe.sim.box.hardware import load_profile
from casmoe.testing import cases
from casmoe.trace import Request, Trace

HW = load_profile("rtx4090x4")
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VARIANTS = [(name, {}) for name in POLICIES if name not in ("casmoe", "ondemand")] + [("casmoe", {"predictor": "noisy"})]




@pytest.mark.parametrize("name,options", VARIANTS, ids=[n for n, _ in VARIANTS])
@FAST
@given(case=cases(), layer_s=st.sampled_from([0.0, 1e-4, 1e-2]), devices=st.sampled_from([1, 2, 3]))
def test_bound_never_exceeds_the_stall_and_per_layer_counts_add_up(name, options, case, layer_s, devices):
    trace, cap = case.trace, case.capacity
    g = trace.geometry
    devices = min(devices, g.layers)
    if not cap.per_layer:  # a global pool is split over the devices: each share must hold top_k
        devices = max((d for d in range(1, devices + 1) if cap.slots * (g.layers // d) // g.layers >= g.top_k), default=1)
    res = run_trace(Run(trace, get_policy(name), cap, Machine(shaped_preset(trace.geometry), HW, devices=devices), options=options), compute=FixedCompute(layer_s=layer_s), detail=True)
    assert 0 <= res.stall_bound_s <= res.stall_s * (1 + 1e-9) + 1e-15
    assert len(res.stall_bound_by_device_s) == devices and max(res.stall_bound_by_device_s) == res.stall_bound_s
    for bound, stall in zip(res.stall_bound_by_layer_s, res.stall_by_layer_s, strict=True):
        assert 0 <= bound <= stall * (1 + 1e-9) + 1e-15  # each layer's value bounds its own stall
    assert sum(res.late_by_layer) == res.stats.late_hits
    assert sum(res.wasted_by_layer) == res.stats.prefetch_wasted


def _request(topk, weights, spec, prefill=0):
    """A request with speculative's next-layer guesses (the last layer has none: -1)."""
    return Request(np.array(topk, np.int16), np.array(weights, np.float32), prefill=prefill,
                   spec=np.array([[guess, [-1, -1]] for guess in spec], np.int16))


@pytest.mark.parametrize("name,options", VARIANTS, ids=[n for n, _ in VARIANTS])
def test_a_prefetch_a_staging_pool_gives_back_unused_is_wasted_at_its_layer(name, options):
    """A cache with fewer slots per layer than top_k passes the rest through staging slots
    and gives them back when the next layer starts: MoE-Infinity's prefetch of expert 2 of layer 1
    leaves unused that way, with no load taking its slot. It is one wasted prefetch of layer 1
    (the cache's count) and, routed again later, one demand load (never also a used prefetch)."""
    g = Geometry(2, 4, 2, hidden=8, intermediate=4)
    trace = Trace(g, [_request([[[2, 3], [1, 0]]], [[[0.1, 0.9], [0.7, 0.3]]], [[1, 0]]),
                      _request([[[3, 1], [3, 2]]], [[[0.9, 0.1], [0.6, 0.4]]], [[3, 2]]),
                      _request([[[1, 0], [3, 1]], [[3, 0], [2, 3]]], [[[0.8, 0.2], [0.2, 0.8]], [[0.8, 0.2], [0.1, 0.9]]],
                               [[3, 1], [2, 3]], prefill=1)])
    res = run_trace(Run(trace, get_policy(name), Capacity(1, per_layer=True), Machine(shaped_preset(g), HW), options=options),
                    compute=FixedCompute(layer_s=0.0), detail=True)
    assert sum(res.wasted_by_layer) == res.stats.prefetch_wasted
    assert 0 <= res.stall_bound_s <= res.stall_s * (1 + 1e-9) + 1e-15
    if name == "moe-infinity":
        assert res.wasted_by_layer[1] >= 1


def test_on_demand_with_no_compute_is_all_bandwidth():
    # Every load is needed and nothing overlaps: the actual stall is the bound.
    g = Geometry(3, 4, 2, layer_expert_bytes=(1_000_000,) * 3)
    rng = np.random.default_rng(0)
    rows = np.stack([np.stack([rng.choice(4, 2, replace=False) for _ in range(3)]) for _ in range(5)]).astype(np.int16)
    tr = Trace(g, [Request(rows, np.full(rows.shape, 0.5, np.float32), prefill=0)])
    res = run_trace(Run(tr, get_policy("ondemand"), Capacity(2), Machine(shaped_preset(g), HW)), compute=FixedCompute(), detail=True)
    assert res.stall_bound_s == pytest.approx(res.stall_s, rel=1e-12)
    # the link never idles, so each layer's stall is its copies: the per-layer bound is tight too
    assert res.stall_bound_by_layer_s == pytest.approx(res.stall_by_layer_s, rel=1e-12)


def test_the_bound_is_zero_with_ample_compute_and_the_link_deficit_without():
    # Compute far longer than a copy: a perfect prefetcher hides every load, even the first
    # (its copy runs while layer 0's dense part does, before the router chooses). With one
    # copy 1.5 layers long the link falls behind by copy / 3 a layer: 24 layers, 8 copies.
    g = Geometry(4, 4, 1, layer_expert_bytes=(1_000_000,) * 4)
    rows = np.tile(np.arange(4, dtype=np.int16)[None, :, None] % 4, (6, 1, 1))
    rows = (rows + np.arange(6, dtype=np.int16)[:, None, None]) % 4
    tr = Trace(g, [Request(rows, np.ones(rows.shape, np.float32), prefill=0)])
    copy = HW.copy_latency_us * 1e-6 + 1_000_000 / (HW.h2d_pinned_gbs * 1e9)
    ample = run_trace(Run(tr, get_policy("lru"), Capacity(1), Machine(shaped_preset(g), HW)), compute=FixedCompute(layer_s=10 * copy), detail=True)
    assert ample.stall_bound_s == 0
    assert ample.stall_s == pytest.approx(4 * 6 * copy, rel=1e-9)  # lru loads every layer on demand
    res = run_trace(Run(tr, get_policy("lru"), Capacity(1), Machine(shaped_preset(g), HW)), compute=FixedCompute(layer_s=copy / 1.5), detail=True)
    assert res.stall_bound_s == pytest.approx(8 * copy, rel=1e-9)
    assert res.stall_s > 2 * res.stall_bound_s  # lru fetches on demand: it loses by timing too

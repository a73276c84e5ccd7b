"""The compiled timing pass (casmoe/sim/passes/timing_kernel.py) changes nothing.

Same decisions (the built-in policy's compiled twin), priced once by the Python `StepTimer`
and once by the kernel: the `SimResult` must agree to the last bit (times, stalls by cause
and layer, late hits, link bytes and cancellations, utilisation, timeliness, latency
percentiles), on random traces and on machines that make prefetches late, cap the host,
charge issuing and waking, and split the layers over devices.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.cache import CacheConfigError, Capacity, MissMode, PolicyError
from casmoe.policies import get_policy
from casmoe.presets import get_preset
from casmoe.shipped import SYNTHETIC_TRACE, shipped
from casmoe.sim.passes import driver as engine
from casmoe.sim.passes.driver import run_trace
from casmoe.sim.passes.assembly import Run
from casmoe.sim.cost.machine import Machine
from casmoe.sim.box.hardware import load_profile
from casmoe.sim.passes.traffic import Arrival, Schedule, Traffic
from casmoe.testing import cases
from casmoe.trace_io import load_trace
from support.builders import shaped_preset
from support.variants import VARIANTS, box


def _both(monkeypatch, run):
    """`run()` priced by the Python timing pass, then by the compiled one where it fits (and
    whether it did)."""
    real = engine.run_offline
    monkeypatch.setattr(engine, "run_offline", lambda *a: real(*a, compiled_timing=False))
    want = run()
    monkeypatch.setattr(engine, "run_offline", real)
    used = []
    kernel = engine.compiled_pass.run
    monkeypatch.setattr(engine.compiled_pass, "run", lambda *a: used.append(1) or kernel(*a))
    return want, run(), used


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
          database=None)
@given(
    variant=st.sampled_from(VARIANTS),
    case=cases(transient=False),
    mode=st.sampled_from([MissMode.LOAD, MissMode.CPU]),
    batch=st.integers(1, 3),
    devices=st.integers(1, 3),
    slow_link=st.booleans(),
    host_cap=st.booleans(),
    detail=st.booleans(),
    context=st.sampled_from([0, 40, 3000]),
    prefill_batch=st.integers(1, 3),
)
def test_compiled_timing_to_the_last_bit(monkeypatch, variant, case, mode, batch, devices, slow_link, host_cap, detail,
                                         context, prefill_batch):
    name, options = variant
    g = case.trace.geometry
    devices = min(devices, g.layers)
    hw = box(slow_link, load_layer_us=5.0)
    if host_cap:  # the links share one host pipe
        hw = dataclasses.replace(hw, host_cap_gbs=hw.h2d_pinned_gbs / (3e3 if slow_link else 3))

    def run():
        try:
            return run_trace(Run(case.trace, get_policy(name), case.capacity, Machine(shaped_preset(g), hw, devices=devices), options=options, batch=batch, miss_mode=mode, context=context, prefill_batch=min(prefill_batch, batch)), compiled=True, detail=detail).to_dict()
        except CacheConfigError as exc:  # a global pool too small to split over the devices
            return str(exc)

    want, got, _ = _both(monkeypatch, run)
    assert got == want


@pytest.mark.parametrize("policy", ["lru", "semoe", "casmoe"])
def test_compiled_timing_on_the_shipped_trace(monkeypatch, policy):
    """Mixtral's shape on the seed paper's box, four devices, timeliness on: the kernel ran
    (not the Python fallback) and agrees."""
    trace = load_trace(shipped(SYNTHETIC_TRACE)).subset(range(8))
    options = {"predictor": "exact"} if policy == "casmoe" else {}
    hw = dataclasses.replace(load_profile("rtx4090x4"), load_host_us=20.0, wake_us=5.0)

    def run():
        return run_trace(Run(trace, get_policy(policy), Capacity(3), Machine(get_preset("mixtral-8x7b"), hw, devices=4), options=options), compiled=True, detail=True).to_dict()

    want, got, used = _both(monkeypatch, run)
    assert got == want and used
    assert want["late_hits"] > 0 or policy == "lru"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(
    variant=st.sampled_from([v for v in VARIANTS if not get_policy(v[0]).needs_future and v[1].get("predictor") != "exact"]),
    case=cases(transient=False),
    mode=st.sampled_from([MissMode.LOAD, MissMode.CPU]),
    devices=st.integers(1, 2),
    slow_link=st.booleans(),
    rate=st.floats(0.5, 500.0),
    max_batch=st.integers(1, 4),
    schedule=st.sampled_from(list(Schedule)),
    chunk=st.integers(1, 6),
    context=st.sampled_from([0, 40, 3000]),
    prefill_batch=st.integers(1, 3),
)
def test_compiled_serving_to_the_last_bit(variant, case, mode, devices, slow_link, rate, max_batch, schedule, chunk,
                                          context, prefill_batch):
    """The serving scheduler's steps (continuous batching, chunked prompts) decided by the twin
    and priced by the kernel, one at a time: the Python passes' result to the last bit."""
    name, options = variant
    g = case.trace.geometry
    hw = box(slow_link)
    wl = Traffic(Arrival.POISSON, rate=rate, max_batch=max_batch, schedule=schedule, chunk=chunk,
                 prefill_batch=prefill_batch if schedule is Schedule.PREFILL_FIRST else 1)

    def run(compiled: bool):
        try:
            return run_trace(Run(case.trace, get_policy(name), case.capacity, Machine(shaped_preset(g), hw, devices=min(devices, g.layers)), options=options, miss_mode=mode, traffic=wl, context=context), compiled=compiled, detail=True).to_dict()
        except (CacheConfigError, PolicyError) as exc:  # speculative: one request at a time, whole prefills
            return str(exc)

    assert run(True) == run(False)

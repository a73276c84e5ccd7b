"""The simulator's compiled decision pass (casmoe/sim/passes/decide.py `CompiledDecider`) changes nothing.

Same trace, policy, capacity, devices, batch and miss mode: `simulate` with the built-in
policy's compiled twin deciding must give the `SimResult` of the Python decision pass to the
last bit (times, stalls, counts, timeliness, latency percentiles).
"""

from __future__ import annotations


import pytest
from support.builders import shaped_preset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.cache import CacheConfigError, MissMode
from casmoe.policies import get_policy
from casmoe.sim.passes.driver import run_trace
from casmoe.sim.passes.assembly import Run
from casmoe.sim.cost.machine import Machine
from casmoe.testing import cases
from support.sim_golden import SHAPES, Case, run
from support.variants import VARIANTS, box





@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(
    variant=st.sampled_from(VARIANTS),
    case=cases(transient=False),
    mode=st.sampled_from([MissMode.LOAD, MissMode.CPU]),
    batch=st.integers(1, 3),
    devices=st.integers(1, 2),
    slow_link=st.booleans(),
    prefill_batch=st.integers(1, 3),
)
def test_compiled_decisions_simulate_to_the_last_bit(variant, case, mode, batch, devices, slow_link, prefill_batch):
    name, options = variant
    g = case.trace.geometry
    devices = min(devices, g.layers)
    hw = box(slow_link, load_layer_us=5.0)

    def result(compiled: bool):
        try:
            return run_trace(Run(case.trace, get_policy(name), case.capacity, Machine(shaped_preset(g), hw, devices=devices), options=options, batch=batch, miss_mode=mode, prefill_batch=min(prefill_batch, batch)), compiled=compiled).to_dict()
        except CacheConfigError as exc:  # a global pool too small to split over the devices
            return str(exc)

    assert result(False) == result(True)


@pytest.mark.parametrize("shape", [s for s in SHAPES if s[3] != "substitute"], ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("policy", ["lru", "belady", "semoe", "casmoe"])
def test_compiled_decisions_on_shipped_traces(policy, shape, monkeypatch):
    """The golden cases of tests/support/sim_golden.py, forced through the compiled decision pass."""
    import casmoe.sim.passes.driver as engine

    real = engine.run_offline
    monkeypatch.setattr(engine, "run_offline", lambda *a: real(*a[:4], True))
    options = (("predictor", "exact"),) if policy == "casmoe" else ()
    for trace in ("tiny-mixtral.npz", "synthetic-mixtral.npz"):
        case = Case(trace, 6, policy, options, *shape)
        monkeypatch.setattr(engine, "run_offline", real)
        want = run(case)
        monkeypatch.setattr(engine, "run_offline", lambda *a: real(*a[:4], True))
        assert run(case) == want

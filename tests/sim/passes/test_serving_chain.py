"""The serving scheduler's fast path for steps that follow from the running requests alone
changes nothing.

With the compiled passes, requests that all decode (or one alone, with its prompt) have their
steps decided and priced in one kernel call until one finishes or another process's next
event comes due (`Server._serve_chain`, `ServingPass.chain`). These tests hold it to the Python passes' result
to the last bit on closed loops (users, think times) and open loops, and check that the fast
path is taken, and stopped by arrivals, where it should be.
"""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.cache import CacheConfigError, Capacity, MissMode, PolicyError
from casmoe.policies import get_policy
from casmoe.presets import get_preset
from casmoe.shipped import shipped
from casmoe.sim.passes.assembly import Run, TraceSteps
from casmoe.sim.cost.machine import SimConfigError
from casmoe.sim.passes.compiled_timing import ServingPass
from casmoe.sim.passes.driver import run_trace
from casmoe.sim.cost.machine import Machine
from casmoe.sim.box.hardware import load_profile
from casmoe.sim.passes.serving import clock_delays
from casmoe.sim.passes.traffic import Arrival, Schedule, Traffic
from casmoe.testing import cases
from casmoe.trace_io import load_trace
from support.builders import shaped_preset
from support.variants import VARIANTS, box

SERVING = [v for v in VARIANTS if not get_policy(v[0]).needs_future and v[1].get("predictor") != "exact"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(
    variant=st.sampled_from(SERVING),
    case=cases(),
    mode=st.sampled_from([MissMode.LOAD, MissMode.CPU]),
    devices=st.integers(1, 2),
    slow_link=st.booleans(),
    users=st.integers(1, 3),
    think=st.sampled_from([0.0, 1e-4, 0.01]),
    max_batch=st.integers(1, 3),
    schedule=st.sampled_from(list(Schedule)),
    chunk=st.integers(1, 6),
)
def test_closed_loop_alone_to_the_last_bit(variant, case, mode, devices, slow_link, users, think, max_batch,
                                           schedule, chunk):
    """Closed-loop users (whose next request waits on the last one's end and a think time):
    the compiled passes with the fast path give the Python passes' result to the last bit."""
    name, options = variant
    g = case.trace.geometry
    hw = box(slow_link)
    wl = Traffic(Arrival.CLOSED, users=users, think=think, max_batch=max_batch, schedule=schedule, chunk=chunk)

    def run(compiled: bool):
        try:
            return run_trace(Run(case.trace, get_policy(name), case.capacity, Machine(shaped_preset(g), hw, devices=min(devices, g.layers)), options=options, miss_mode=mode, traffic=wl), compiled=compiled, detail=True).to_dict()
        except (CacheConfigError, PolicyError) as exc:  # speculative: one request at a time, whole prefills
            return str(exc)

    assert run(True) == run(False)


def _spied(monkeypatch, widths: list[int] | None = None) -> list[int]:
    """How many steps each `ServingPass.chain` call priced (and, in `widths`, how many
    requests shared them)."""
    calls: list[int] = []
    real = ServingPass.chain

    def spy(self, parts, *a):
        starts, ends = real(self, parts, *a)
        calls.append(len(ends))
        if widths is not None:
            widths.append(len(parts))
        return starts, ends

    monkeypatch.setattr(ServingPass, "chain", spy)
    return calls


def test_a_lone_user_runs_whole_and_arrivals_cut_the_chains(monkeypatch):
    """One closed-loop user: every request's steps in one call each (nothing else can act);
    Poisson arrivals faster than a request takes: calls cut short, more calls than requests,
    and both still equal to the Python passes."""
    trace = load_trace(shipped("tiny-mixtral.npz")).subset(range(6))
    hw, preset, cap = load_profile("rtx4090x4"), get_preset("mixtral-8x7b"), Capacity(4)
    lru = get_policy("lru")
    calls = _spied(monkeypatch)
    closed = Traffic(Arrival.CLOSED, max_batch=1)
    fast = run_trace(Run(trace, lru, cap, Machine(preset, hw), traffic=closed), compiled=True).to_dict()
    assert calls == [len(r.steps(trace.geometry)) for r in trace.requests]
    assert fast == run_trace(Run(trace, lru, cap, Machine(preset, hw), traffic=closed), compiled=False).to_dict()
    calls.clear()
    busy = Traffic(Arrival.POISSON, rate=50.0, max_batch=1)
    fast = run_trace(Run(trace, lru, cap, Machine(preset, hw), traffic=busy), compiled=True).to_dict()
    assert len(calls) > len(trace.requests) and sum(calls) == sum(len(r.steps(trace.geometry)) for r in trace.requests)
    assert fast == run_trace(Run(trace, lru, cap, Machine(preset, hw), traffic=busy), compiled=False).to_dict()


def _land(now: float, delays: list[float]) -> float:
    for d in delays:
        now = now + d  # SimPy: a timeout of `d` fires at `env.now + d`
    return now


def test_clock_delays_land_where_a_timeout_per_step_would():
    """One timeout where the float sum allows it; a timeout per step where a single one would
    land an ulp away (0.00804... + (0.18499... - 0.00804...) is not 0.18499...)."""
    now, end = 0.008046280826190008, 0.18499849047597902
    assert now + (end - now) != end
    ends = [0.1, end]
    per_step = _land(now, [])
    for t in ends:
        per_step = per_step + (t - per_step)
    assert per_step == end
    delays = clock_delays(now, ends)
    assert len(delays) == 2 and _land(now, delays) == end
    ends = [0.5, 0.75, 1.25]
    assert clock_delays(0.25, ends) == [1.0] and _land(0.25, [1.0]) == 1.25


def test_batched_chains_and_a_shared_plan_serve_alike_and_a_foreign_plan_is_refused(monkeypatch):
    """Requests decoding together are chained too (the Python passes' result); with
    `simulate(plan=..., traffic=...)` the plan's batch-1 arrays give the same result as
    arrays built by the run; a plan of another trace or batch is a one-line error."""
    trace = load_trace(shipped("tiny-olmoe.npz")).subset(range(5))
    hw, preset, cap = load_profile("rtx4090x4"), get_preset("olmoe-1b-7b"), Capacity(16)
    wl = Traffic(Arrival.POISSON, rate=5.0, max_batch=3)
    lru = get_policy("lru")
    widths: list[int] = []
    calls = _spied(monkeypatch, widths)
    own = run_trace(Run(trace, lru, cap, Machine(preset, hw), traffic=wl), compiled=True).to_dict()
    assert max(widths) > 1 and max(c for c, w in zip(calls, widths) if w > 1) > 1
    assert own == run_trace(Run(trace, lru, cap, Machine(preset, hw), traffic=wl), compiled=False).to_dict()
    assert run_trace(Run(trace, lru, cap, Machine(preset, hw), traffic=wl), compiled=True, plan=TraceSteps.build(trace)).to_dict() == own
    for plan in (TraceSteps.build(trace.subset(range(4))), TraceSteps.build(trace, 2)):
        with pytest.raises(SimConfigError, match="batch 1 only"):
            run_trace(Run(trace, lru, cap, Machine(preset, hw), traffic=wl), plan=plan)


def test_a_request_submitted_while_the_streams_are_taken_joins_at_the_next_step():
    """A user whose request ends with a step submits the next one at that instant, after the
    scheduler has formed the following step: the chain must stop at that step's end, where the
    Python passes admit it (found by the closed-loop test: the chain ran the lone request to its
    end and admitted the new one a step late)."""
    import numpy as np

    from casmoe.geometry import Geometry
    from casmoe.trace import Request, Trace

    g = Geometry(layers=1, experts=2, top_k=1, hidden=8, intermediate=4)

    def request(tokens: int, prefill: int) -> Request:
        return Request(np.zeros((tokens, 1, 1), np.int16), np.ones((tokens, 1, 1), np.float32), prefill=prefill)

    trace = Trace(g, [request(2, 0), request(1, 1), request(1, 0)])  # a lone decoder, a prompt, then another
    wl = Traffic(Arrival.CLOSED, users=2, think=0.0, max_batch=2, schedule=Schedule.PREFILL_FIRST)
    runs = [run_trace(Run(trace, get_policy("ondemand"), Capacity(1, per_layer=False), Machine(shaped_preset(g), load_profile("rtx4090x4")), traffic=wl), compiled=compiled, detail=True).to_dict() for compiled in (True, False)]
    assert runs[0] == runs[1]

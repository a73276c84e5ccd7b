"""The simulator: routing traces through real `ExpertCache` objects on a modelled machine.

One machine model (`assembly.py`: `RunState`, each device's link and compute, the caches, the timing pass of
`timing.py`) and two drivers:

- offline (`traffic=None`): the requests one after another, or in static batches of `batch`
  whose decode tokens share steps. The step sequence is known in advance, so the run is a
  decision pass (`decide.py`: the cache events in replay's order) followed by a timing pass
  over what they returned, chunk by chunk: no SimPy event at all. The clock advances as SimPy's
  does (`now + (t - now)` per step), so this path and the serving driver with one user and no
  think time agree to the last bit.
- serving (`traffic`: Poisson or recorded arrivals, or a closed loop of users): SimPy
  processes for the requests, the scheduler (continuous batching up to `max_batch`) and the
  devices (`serving.py`).

Event order is replay's (casmoe/replay.py): per request `begin_request`; per step and computed
layer `before_layer`, `route`; `end_request` after a request's last step. Because cache
decisions never depend on timing, the counts equal replay's in `load` mode, except that a hit
on an expert still on the wire is a *late* hit.

Layers are split across devices in contiguous ranges; each device has its own link and holds
the slots of its layers. With per-layer capacity one cache object serves all devices (its
pools are per layer, so each pool lives on its layer's device, and a next-layer prefetch that
crosses a device boundary goes over the next device's link). A global pool cannot span
devices: with `--global-capacity` each device gets its own cache, built on the sub-model of
its layers, with a share of the slots proportional to its layers.

With `host_cache`, experts come from a RAM tier over the storage drive (`tiers.py`).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

from casmoe.cache import ExpertCache, MissMode
from casmoe.compiled import uses_twin
from casmoe.geometry import split_layers
from casmoe.replay import check_replayable, starts_and_ends
from casmoe.sim.passes import compiled_timing as compiled_pass
from casmoe.sim.passes.assembly import Run, RunState, Setup, TraceSteps
from casmoe.sim.cost.compute import ComputeModel
from casmoe.sim.passes.decide import CompiledDecider, Decider, StepDecisions
from casmoe.sim.passes.latency import LatencyLog
from casmoe.sim.cost.machine import SimConfigError
from casmoe.sim.passes.result import SimResult
from casmoe.sim.passes.timeline import Timeline
from casmoe.sim.passes.timing import work_for

CHUNK_STEPS = 512
"""Steps decided ahead of the timing pass at a time: bounds the memory of the record."""


def run_trace(
    run: Run,
    *,
    plan: TraceSteps | None = None,
    compute: ComputeModel | None = None,
    timeline: Timeline | None = None,
    detail: bool = False,
    compiled: bool | None = None,
    latency: LatencyLog | None = None,
) -> SimResult:
    """Simulate `run` (see the module docstring): its trace through fresh caches of its policy
    on its machine. What else a caller may give changes how the run is computed or recorded,
    never its result: `plan` shares the trace's steps between runs (with traffic: its batch-1
    arrays, which the compiled serving passes read); `compute` replaces the roofline (closed-form
    checks); `timeline` records a Chrome/Perfetto trace; `detail` adds the per-layer timeliness
    figures and the perfect-prefetch bound (off by default, like the timeline: the hot loop stays
    bare; the CLI and sweeps turn it on); `compiled` chooses the offline decision pass as
    `casmoe.replay.replay` chooses its path (built-in policies' compiled twins; identical results
    either way); `latency`, a log to fill instead of a fresh one, gives a caller every step's time
    (requests one after another only)."""
    policy, trace, machine = run.policy, run.trace, run.machine
    if not (isinstance(policy, type) and issubclass(policy, ExpertCache)):
        raise SimConfigError(
            f"a run takes a policy class (each run builds fresh caches), e.g. LRU, not {type(policy).__name__} "
            "object; casmoe.sim.simulate takes names"
        )
    check_replayable(trace)
    machine.check_geometry(trace.geometry)
    devices = machine.devices
    if run.miss_mode is MissMode.CPU and compute is None:
        machine.hardware.check_host_compute()
    g = trace.geometry
    nbytes = machine.expert_bytes(trace)
    cache_per_device = devices > 1 and not run.capacity.per_layer
    if run.traffic is None:
        batch, prefill_batch = run.batch, run.prefill_batch
        if not 1 <= prefill_batch <= batch:
            raise SimConfigError(f"--prefill-batch {prefill_batch} prefills the prompts of a static batch together: "
                                 f"give at most --batch ({batch}), or serve arrivals (--users, --arrival)")
        if plan is None:
            plan = TraceSteps.build(trace, batch, devices, cache_per_device, prefill_batch)
        elif plan.trace is not trace or plan.batch != batch or len(plan.ranges) != devices or (
            len(plan.shards) > 1
        ) != cache_per_device or plan.prefill_batch != prefill_batch:
            raise SimConfigError("the step plan was built for another trace, batch, prefill batch, device count or "
                                 "capacity kind")
        ranges, shard_ranges, shard_traces = plan.ranges, plan.shards, plan.shard_traces
    else:
        if plan is not None and (plan.trace is not trace or plan.batch != 1):
            raise SimConfigError("a served trace shares the step plan of the same trace at batch 1 only")
        ranges = split_layers(g.layers, devices)
        shard_ranges = list(ranges) if cache_per_device else [range(g.layers)]
        shard_traces = [trace.layer_slice(r) for r in ranges] if cache_per_device else [trace]
    setup = Setup(run, ranges, shard_ranges, shard_traces, nbytes, compute or machine.compute(nbytes), timeline, detail)
    describe = run.describe(nbytes)
    if run.traffic is not None:
        from casmoe.sim.passes.serving import serve

        if latency is not None:
            raise SimConfigError("a latency log is filled by requests one after another only, not by served traffic")

        arrays = plan.arrays(0) if plan is not None and len(plan.shards) == 1 == len(shard_ranges) else None
        with no_gc():
            return serve(setup, run.traffic, describe, compiled, arrays)
    state = setup.start(plan.shard_steps)
    log = LatencyLog() if latency is None else latency
    with no_gc():
        end = run_offline(plan, state, setup, log, compiled)
    back_to_back = "back-to-back" if run.batch == 1 else f"static batches of {run.batch}"
    return state.result(setup, log, end, batch=run.batch, traffic=back_to_back, max_batch=run.batch, **describe)


@contextmanager
def no_gc() -> Iterator[None]:
    """Python's cyclic garbage collector paused for a run: the decision records are many small
    container objects, and rescanning them doubled the time of a run; a run forms no cycles
    that need collecting before it ends."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run_offline(plan: TraceSteps, machine: RunState, setup: Setup, log: LatencyLog, compiled: bool | None = None,
                compiled_timing: bool = True) -> float:
    """The fast path: requests one after another (or in static batches), each chunk of steps
    decided first, then priced. Returns the makespan. Where a compiled twin decides and the
    compiled timing pass mirrors the run (`compiled_timing.fits`), both passes run compiled
    (`compiled_timing=False`: the twin decides, Python prices; identical results)."""
    timer = machine.timer
    interleaved = timer.interleaved
    deciders: list[Decider | CompiledDecider] = [
        CompiledDecider(shard.cache, plan.shard_traces[i].requests, plan.arrays(i), CHUNK_STEPS)
        if not interleaved and uses_twin(shard.cache, plan.shard_traces[i], compiled)
        else shard.decider
        for i, shard in enumerate(machine.shards)
    ]
    if compiled_timing and compiled_pass.fits(machine, setup, deciders):
        return compiled_pass.run(plan, machine, setup, log, deciders[0], CHUNK_STEPS)  # type: ignore[arg-type]
    steps = plan.steps
    batch = plan.batch
    starts, finishing = starts_and_ends(steps)
    compute = setup.compute
    shard_steps = plan.shard_steps
    pos = setup.positions()  # tokens of context each request has
    prompts = [r.prefill for r in setup.trace.requests]
    now = 0.0
    for c0 in range(0, len(steps), CHUNK_STEPS):
        c1 = min(len(steps), c0 + CHUNK_STEPS)
        records: list[list[StepDecisions]] | None = None
        if not interleaved:  # the decision pass for this chunk, shard by shard
            records = [d.chunk(shard_steps[i], c0, c1, starts, finishing) for i, d in enumerate(deciders)]
        for s in range(c0, c1):  # the timing pass
            step = steps[s]
            decisions = None if records is None else [rec[s - c0] for rec in records]
            t = now
            starting = starts.get(s, ())
            for r in starting:
                log.arrive(r, log.arrival.get(r - r % batch, t))  # a static batch arrives together
                log.admit(r, t, r % batch + 1)
            if starting:
                t = timer.begin(t, starting, decisions)
            step_start = now
            work = work_for(step.prefill, step.tokens, step.requests, pos, compute, prompts)
            if interleaved:  # decided layer by layer: the deciders read the step's token counts
                for i, d in enumerate(deciders):
                    d.walking = shard_steps[i][s]  # type: ignore[union-attr]
            t = timer.step(s, work, [sub[s] for sub in shard_steps], decisions, t)
            now = now + (t - now)  # SimPy's clock arithmetic (env.timeout(t - now))
            if step.prefill:
                for r in step.requests:
                    log.prefilled(r, prompts[r] if len(step.requests) > 1 else step.tokens, t)
            else:
                log.decoded(step_start, t, step.requests)
            done = finishing.get(s, ())
            if done:
                for r in done:
                    log.finished(r, t)
                timer.end(t, len(done))
    return now

"""Serving: requests arrive, queue, are batched continuously and decoded together.

The SimPy processes, in the style of SimPy's own examples:

- `open_loop`: requests arrive at given times (a Poisson process of `rate` per second, or the
  times recorded in the trace) and are submitted to the server;
- `user`: one of `users` in a closed loop: submit a request, wait for its last token, think
  `think` seconds, submit the next (the requests are dealt out in trace order);
- `Server.scheduler`: admits waiting requests, first come first served, while fewer than
  `max_batch` are running (each admission is the request's `begin_request`), then runs one
  step and repeats. A decode step carries one token of every running request that has its
  prompt done: the union of their experts is routed per layer (as the backend's batch does),
  a request that finishes leaves and a waiting one takes its place (continuous batching).
  Prompts are scheduled by one of two policies: `prefill-first` (vLLM's default before
  chunking: a newly admitted request's whole prompt runs as its own step before the next
  decode step; with `prefill_batch` N, the oldest N waiting prompts run together as one step,
  as a throughput-oriented server (MoE-Lightning) batches them) or `chunked` (Sarathi-style:
  every step carries the running requests' decode tokens plus up to `chunk - decodes` prompt
  tokens of the oldest request still prefilling);
- `GPU`: one device: its compute stream (a `simpy.Resource`: one step's kernels at a time)
  and its copy engine (the host-to-device `Link`, a free-at time). A step holds the streams of
  the devices it runs on for its duration; its layer-by-layer cost is the timing pass
  (`timing.py`): within a step nothing else acts, so it costs one timeout, not one per layer.
  With the compiled passes, the steps up to the next event elsewhere that follow from the
  running requests alone (all decoding) are priced in one call and cost one timeout
  (`Server._serve_chain`).

Policies that read the future (belady, sch, casmoe's oracle predictors) need the step sequence,
which here depends on timing: they run again with the sequence of the previous run until it
repeats (at most `MAX_FUTURE_RUNS` runs; `future_runs` in the result says how many it took).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterator, Sequence

import numpy as np
import simpy

from casmoe.sim.cost.compute import attention_span
from casmoe.sim.passes.assembly import RunState, Setup
from casmoe.sim.passes.compiled_timing import ServingPass
from casmoe.sim.passes.latency import LatencyLog
from casmoe.sim.passes.timing import StepWork
from casmoe.sim.passes.traffic import Arrival, Schedule, Traffic
from casmoe.geometry import Geometry
from casmoe.step_arrays import StepArrays
from casmoe.trace import Request, Step, merge_steps, prefill_step

MAX_FUTURE_RUNS = 5


@dataclass(eq=False)
class Job:
    """A request in the server: where it stands and when it is done."""

    r: int
    request: Request
    done: simpy.Event
    geometry: Geometry
    pos: int = 0  # tokens computed
    decoded: int = 0  # decode steps done
    history: int = 0  # tokens of earlier context its attention reads (`timing.histories`)

    @property
    def prompt(self) -> int:
        """Prompt tokens."""
        return self.request.prefill

    @property
    def nsteps(self) -> int:
        """How many `steps`: the prompt (if any) as one, then one per decode token."""
        return bool(self.request.prefill) + self.request.decode_tokens

    @cached_property
    def steps(self) -> list[Step]:
        """Its own steps (`Request.steps`), built for the Python passes (the compiled ones read
        the batch-1 arrays)."""
        return self.request.steps(self.geometry)

    @property
    def prefilling(self) -> bool:
        return self.pos < self.prompt


class GPU:
    """One device: a compute stream (one step's kernels at a time) and a copy engine."""

    def __init__(self, env: simpy.Environment, index: int, copy_engine: Any) -> None:
        self.index = index
        self.stream = simpy.Resource(env, capacity=1)
        self.copy_engine = copy_engine


@dataclass
class ScheduledStep:
    """The next step: its parts, what it costs besides experts, who finishes."""

    parts: list[tuple[Job, int]]  # each request's share: its own step's index in `Job.steps`, -1: `chunk` of its prompt
    work: StepWork
    decoding: list[Job]
    prefill: Job | None = None
    chunk: tuple[int, int] = (0, 0)
    finishing: list[Job] = field(default_factory=list)
    together: list[Job] = field(default_factory=list)  # whole prompts prefilled with `prefill` (prefill_batch)


class Server:
    """The scheduler and the devices of one run."""

    def __init__(self, env: simpy.Environment, setup: Setup, machine: RunState, traffic: Traffic,
                 log: LatencyLog, compiled: bool | None = None, arrays: StepArrays | None = None) -> None:
        self.env = env
        self.setup = setup
        self.machine = machine
        self.traffic = traffic
        self.log = log
        self.gpus = [GPU(env, i, link) for i, link in enumerate(machine.links)]
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []
        self.wake = env.event()
        self.steps: list[Step] = []
        """The step sequence, for oracles' next run (kept by the Python passes: the compiled
        ones serve no policy that reads the future)."""
        self.clock = 0.0  # the end of the last step: the makespan, once all is served
        self.history = setup.positions()
        g = setup.trace.geometry
        self._offsets = (np.arange(g.layers, dtype=np.int64) * g.experts)[None, :, None]
        self._E = g.experts
        fits = ServingPass.fits(machine, setup, compiled, traffic.schedule is not Schedule.CHUNKED)
        self.compiled = ServingPass(machine, setup, traffic.max_batch, arrays) if fits else None
        """Both passes compiled for a built-in policy (`compiled_timing.ServingPass`), else None."""

    def submit(self, r: int) -> simpy.Event:
        """Request `r` arrives now; the event fires with its last token."""
        request = self.setup.trace.requests[r]
        job = Job(r, request, self.env.event(), self.setup.trace.geometry, history=self.history[r])
        self.log.arrive(r, self.env.now)
        if not job.nsteps:
            self.log.admit(r, self.env.now, len(self.running))
            self.log.finished(r, self.env.now)
            job.done.succeed()
            return job.done
        self.waiting.append(job)
        self.log.queue_length(self.env.now, len(self.waiting))
        if not self.wake.triggered:
            self.wake.succeed()
        return job.done

    def scheduler(self) -> Iterator[simpy.Event]:
        env = self.env
        timer = self.machine.timer
        deciders = [shard.decider for shard in self.machine.shards]
        while True:
            if not self.waiting and not self.running:
                self.wake = env.event()
                yield self.wake
                continue
            admitted = self._admit()
            decoding, prefill, chunk, together = self._next_step()
            starting = [job.r for job in admitted]
            start = env.now
            chained = [] if together else self._chained(decoding, prefill, chunk)
            if chained:
                yield from self._serve_chain(chained, starting, start)
                continue
            plan = self._plan(decoding, prefill, chunk, together)
            if self.compiled is not None:
                parts = [(job.r, k) for job, k in plan.parts]
                t = self.compiled.step(parts, chunk, starting, len(plan.finishing), plan.work, start)
            else:
                step = self._step(plan)
                s = len(self.steps)
                self.steps.append(step)
                subs = self._views(step)
                decisions = None
                if not timer.interleaved:
                    decisions = [d.step(s, sub.experts, starting, len(plan.finishing), sub.counts, sub.tokens)
                                 for sub, d in zip(subs, deciders)]
                else:  # decided layer by layer: the deciders read the step's token counts
                    for d, sub in zip(deciders, subs):
                        d.walking = sub
                t = timer.begin(start, starting, decisions) if starting else start
                t = timer.step(s, plan.work, subs, decisions, t)
            requests = [gpu.stream.request() for gpu in self.gpus]
            yield simpy.AllOf(env, requests)
            yield env.timeout(t - env.now)
            self.clock = env.now
            for gpu, req in zip(self.gpus, requests):
                gpu.stream.release(req)
            self._account(plan.prefill, plan.chunk, plan.decoding, plan.finishing, start, t, plan.together)

    def _chained(self, decoding: list[Job], prefill: Job | None, chunk: tuple[int, int]) -> list[tuple[Job, int]]:
        """With the compiled passes, when the next steps until a request finishes or arrives
        follow from the running requests alone: the running requests all decoding, or one
        alone about to compute its whole prompt. Each with the index of its next own step
        (`Request.steps`); [] otherwise."""
        if self.compiled is None:
            return []
        if prefill is not None:
            return [(prefill, 0)] if len(self.running) == 1 and chunk == (0, prefill.prompt) else []
        return [(job, job.decoded + bool(job.prompt)) for job in decoding]

    def _serve_chain(self, parts: list[tuple[Job, int]], starting: list[int], start: float) -> Iterator[simpy.Event]:
        """The steps of `parts`' requests until one finishes or another process's next event
        (`env.peek()`, once the streams are held) comes due: until then nobody else acts, so
        the scheduler would form the same steps one by one. They are decided and priced in
        one go (`ServingPass.chain`); the clock then moves to the last one's end as the
        scheduler's own timeouts would have moved it (one timeout where the float sum lands on
        the same time, else one per step), and the steps are accounted in their order."""
        env = self.env
        requests = [gpu.stream.request() for gpu in self.gpus]
        yield simpy.AllOf(env, requests)  # what was due now before this step (the last one's releases) is done
        limit = env.peek()
        if self.waiting and len(self.running) < self.traffic.max_batch:
            limit = env.now  # a request arrived while the streams were taken: the next step boundary admits it
        starts, ends = self.compiled.chain([(job.r, k) for job, k in parts], starting, start, limit)  # type: ignore[union-attr]
        for delay in clock_delays(env.now, ends):
            yield env.timeout(delay)
        self.clock = env.now
        for gpu, req in zip(self.gpus, requests):
            gpu.stream.release(req)
        log = self.log
        job, k = parts[0]
        prompt = len(parts) == 1 and k == 0 and job.prompt > 0
        if prompt:
            job.pos = job.prompt
            log.prefilled(job.r, job.prompt, ends[0])
        steps = len(ends) - prompt
        if len(parts) == 1 and steps:
            log.decoded_alone(job.r, starts[prompt:], ends[prompt:])
        elif steps:
            rs = [job.r for job, _ in parts]
            for t0, t in zip(starts, ends):
                log.decoded(t0, t, rs)
        for job, _ in parts:
            job.pos += steps
            job.decoded += steps
        finishing = [job for job, k in parts if k + len(ends) == job.nsteps]
        if finishing:
            self._account(None, (0, 0), [], finishing, start, ends[-1])

    def _admit(self) -> list[Job]:
        admitted = []
        while self.waiting and len(self.running) < self.traffic.max_batch:
            job = self.waiting.popleft()
            self.running.append(job)
            self.log.admit(job.r, self.env.now, len(self.running))
            admitted.append(job)
        if admitted:
            self.log.queue_length(self.env.now, len(self.waiting))
        return admitted

    def _next_step(self) -> tuple[list[Job], Job | None, tuple[int, int], list[Job]]:
        """What the next step carries: the requests decoding a token, the one prefilling and
        its chunk of prompt tokens, and the whole prompts prefilled with it. Prefill-first: the
        oldest unprefilled prompt (with the next `prefill_batch` - 1 of them), else one decode
        token of every running request. Chunked: decode tokens plus a chunk of the oldest prompt."""
        traffic = self.traffic
        prefilling = [job for job in self.running if job.prefilling]
        decoding = [job for job in self.running if not job.prefilling]
        if traffic.schedule is Schedule.PREFILL_FIRST:
            if prefilling:
                job = prefilling[0]
                return [], job, (0, job.prompt), prefilling[1 : traffic.prefill_batch]
            return decoding, None, (0, 0), []
        budget = traffic.chunk - len(decoding)
        if prefilling and (budget > 0 or not decoding):
            job = prefilling[0]
            end = min(job.prompt, job.pos + max(budget, 1))
            return decoding, job, (job.pos, end), []
        return decoding, None, (0, 0), []

    def _plan(self, decoding: list[Job], prefill: Job | None, chunk: tuple[int, int],
              together: Sequence[Job] = ()) -> ScheduledStep:
        parts: list[tuple[Job, int]] = []
        pairs = kv = 0
        heads = 0
        tokens = len(decoding)
        finishing = []
        prompts = [] if prefill is None else [(prefill, chunk), *((job, (0, job.prompt)) for job in together)]
        for job, (a, b) in prompts:  # each prompt attends to its own tokens (and its earlier context)
            parts.append((job, 0 if (a, b) == (0, job.prompt) else -1))  # the whole prompt: as offline
            tokens += b - a
            read = attention_span(a, b, job.history)
            pairs += read[0]
            kv += read[1]
            if b == job.prompt:
                heads += 1
                if job.nsteps == 1:
                    finishing.append(job)
        for job in decoding:
            k = job.decoded + bool(job.prompt)
            parts.append((job, k))
            read = attention_span(job.history + job.pos, job.history + job.pos + 1, 0)
            pairs += read[0]
            kv += read[1]
            heads += 1
            if k + 1 == job.nsteps:
                finishing.append(job)
        compute = self.setup.compute
        head, fixed = compute.head(heads), compute.step_fixed(tokens)
        work = StepWork(tokens, compute.dense(tokens, pairs, kv, len(parts)), head + fixed if fixed else head)
        return ScheduledStep(parts, work, decoding, prefill, chunk, finishing, list(together))

    def _step(self, plan: ScheduledStep) -> Step:
        """The step's routing as a `Step` (the Python passes): its parts merged."""
        steps = []
        for job, k in plan.parts:
            if k < 0:
                a, b = plan.chunk
                steps.append(prefill_step(job.request.topk[a:b], job.request.weights[a:b], self._offsets, self._E))
            else:
                steps.append(job.steps[k])
        return steps[0] if len(steps) == 1 else merge_steps(steps, tuple(job.r for job, _ in plan.parts))

    def _views(self, step: Step) -> list[Step]:
        """The step as each cache sees it (a device's layers, with a global pool per device)."""
        shards = self.setup.shards
        if len(shards) == 1:
            return [step]
        return [step.layer_slice(layers, self._E) for layers in shards]

    def _account(self, prefill: Job | None, chunk: tuple[int, int], decoding: list[Job], finishing: list[Job],
                 start: float, t: float, together: Sequence[Job] = ()) -> None:
        """A step from `start` to `t` is done: `prefill`'s `chunk` of its prompt and a token of
        each of `decoding`; `finishing` leave."""
        log = self.log
        if prefill is not None:
            a, b = chunk
            prefill.pos = b
            log.prefilled(prefill.r, b - a, t, first_token=b == prefill.prompt)
        for job in together:
            job.pos = job.prompt
            log.prefilled(job.r, job.prompt, t)
        if decoding:
            log.decoded(start, t, [job.r for job in decoding])
            for job in decoding:
                job.pos += 1
                job.decoded += 1
        if finishing:
            for job in finishing:
                self.running.remove(job)
                log.finished(job.r, t)
                job.done.succeed()
            self.machine.timer.end(t, len(finishing))


def clock_delays(now: float, ends: Sequence[float]) -> list[float]:
    """The timeouts that take a SimPy clock from `now` to where steps ending at `ends`, each
    from the clock the one before left, take it with a timeout each (`now + (t - now)` per
    step): one timeout where that float sum lands on the same time, else one per step."""
    clock = now
    for t in ends:
        clock = clock + (t - clock)
    if now + (clock - now) == clock:
        return [clock - now]
    delays = []
    clock = now
    for t in ends:
        delays.append(t - clock)
        clock = clock + (t - clock)
    return delays


def open_loop(env: simpy.Environment, server: Server, times: Sequence[float]) -> Iterator[simpy.Event]:
    """Submit each request at its arrival time (in time order, ties in trace order)."""
    for r in sorted(range(len(times)), key=lambda i: (times[i], i)):
        if times[r] > env.now:
            yield env.timeout(times[r] - env.now)
        server.submit(r)


def user(env: simpy.Environment, server: Server, queue: Iterator[int], think: float) -> Iterator[simpy.Event]:
    """One closed-loop user: a request, its answer, a pause, the next request."""
    for r in queue:
        yield server.submit(r)
        if think:
            yield env.timeout(think)


def run_once(setup: Setup, traffic: Traffic, futures: Sequence[Sequence[Step]] | None,
             compiled: bool | None = None, arrays: StepArrays | None = None,
             ) -> tuple[RunState, LatencyLog, float, list[Step]]:
    env = simpy.Environment()
    machine = setup.start(futures)
    log = LatencyLog()
    server = Server(env, setup, machine, traffic, log, compiled, arrays)
    n = len(setup.trace.requests)
    if traffic.arrival is Arrival.CLOSED:
        queue = iter(range(n))
        for _ in range(traffic.users):
            env.process(user(env, server, queue, traffic.think))
    else:
        env.process(open_loop(env, server, traffic.arrival_times(setup.trace.requests)))
    env.process(server.scheduler())
    env.run()
    if server.compiled is not None:
        server.compiled.finish()
    return machine, log, server.clock, server.steps


def serve(setup: Setup, traffic: Traffic, describe: dict[str, Any], compiled: bool | None = None,
          arrays: StepArrays | None = None) -> Any:
    """Serve the trace's requests under `traffic`; the result of the last run. `compiled`
    chooses the passes as `simulate` does (a built-in policy's twin and the compiled timing);
    `arrays`, the trace's batch-1 steps if built already (`TraceSteps.arrays`), spare the
    compiled passes building them."""
    futures = None
    previous: list[Step] | None = None
    runs = 0
    while True:
        runs += 1
        machine, log, end, steps = run_once(setup, traffic, futures, compiled, arrays)
        reads_future = any(shard.cache.needs_future for shard in machine.shards)
        if not reads_future or runs == MAX_FUTURE_RUNS or (previous is not None and _same(previous, steps)):
            break
        previous = steps
        E = setup.trace.geometry.experts
        futures = [steps] if len(setup.shards) == 1 else [[s.layer_slice(r, E) for s in steps] for r in setup.shards]
    return machine.result(
        setup, log, end, batch=traffic.max_batch, traffic=traffic.describe(), max_batch=traffic.max_batch,
        future_runs=runs, **describe,
    )


def _same(a: Sequence[Step], b: Sequence[Step]) -> bool:
    return len(a) == len(b) and all(x.experts == y.experts for x, y in zip(a, b))

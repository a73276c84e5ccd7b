"""Running `RunSpec`s: one (`run`), or many into a folder that keeps their results (`run_all`).

`run_all` stores each finished run as `points/<key>.json` under its output folder
(`RunSpec.key`: the content of everything the result depends on), so an interrupted sweep,
search or leaderboard resumes where it stopped, a repeated one is free, and an edited input
(a profile, a preset, a trace, a planner folder, a user's policy module) is computed again.
Runs go to local processes (`multiprocessing`, spawned) or, for users who outgrow one machine,
to a Ray cluster. One folder takes one writer at a time (a lock file): a second sweep into it
is refused in one line instead of interleaving its records.

The traces a process runs are parsed once (`routing`, `scored_trace`, `step_plan`: cached by the
file's content digest), because a grid runs many specs over one trace.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import multiprocessing
import os
import signal
import threading
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from casmoe.errors import CasmoeError
from casmoe.gating import gate_trace
from casmoe.output import write_text
from casmoe.sim.passes.assembly import Run, TraceSteps
from casmoe.sim.passes.driver import run_trace
from casmoe.sim.passes.timeline import Timeline
from casmoe.sim.run.spec import RunSpec, TraceRef
from casmoe.sim.trust.error_model import point_of
from casmoe.sim.trust.uncertainty import annotate, family
from casmoe.trace import Trace
from casmoe.trace_io import load_trace


class RunStoreError(CasmoeError, ValueError):
    """An output folder another run is writing to."""


@lru_cache(maxsize=4)
def whole_trace(path: str, digest: str) -> Trace:
    """One trace object per trace file and process (the digest keys a changed file apart): the
    gated routings and step plans cached below are built on it and keyed with it (`load_trace`
    itself decodes a file once, but gives each call a trace object of its own)."""
    return load_trace(path)


@lru_cache(maxsize=4)
def routing(path: str, digest: str, gating: float | None) -> Trace:
    """The whole trace as the run's model routes it: gated (`casmoe.gating`), or as recorded."""
    return gate_trace(whole_trace(path, digest), gating)


@lru_cache(maxsize=4)
def scored_trace(ref: TraceRef) -> Trace:
    """The scored requests of `ref` (all when none are named), routed as the run routes them."""
    whole = routing(ref.path, ref.digest, ref.gating)
    return whole.subset(ref.requests) if ref.requests else whole


@lru_cache(maxsize=4)
def step_plan(ref: TraceRef, batch: int, devices: int, cache_per_device: bool, prefill_batch: int = 1) -> TraceSteps:
    """The scored trace cut into steps and shards, shared by every run over it."""
    return TraceSteps.build(scored_trace(ref), batch, devices, cache_per_device, prefill_batch)


def resolve(spec: RunSpec) -> tuple[Run, TraceSteps | None]:
    """`spec` with its files read: the engine's `Run` (its scored trace, policy class and bound
    options, capacity in slots) and, for requests one after another, the trace's step plan
    shared by every run over it. The one place a `RunSpec` is taken apart."""
    ref = spec.trace
    trace = scored_trace(ref)
    machine = spec.machine
    capacity = spec.capacity.resolve(machine.expert_bytes(trace))
    plan = None
    if spec.traffic is None:
        per_device = machine.devices > 1 and not capacity.per_layer
        plan = step_plan(ref, spec.batch, machine.devices, per_device, spec.prefill_batch)
        trace = plan.trace  # the object the plan was built on: the two caches let their entries go apart
    run = Run(
        trace, spec.policy.check(), capacity, machine,
        options=spec.policy.bound(routing(ref.path, ref.digest, ref.gating)),
        label=spec.policy.label, trace_name=ref.name, batch=spec.batch, miss_mode=spec.miss_mode,
        traffic=spec.traffic, host_cache=spec.host_cache, context=spec.context, prefill_batch=spec.prefill_batch,
    )
    return run, plan


def run(spec: RunSpec, timeline: Timeline | None = None) -> dict[str, Any]:
    """Simulate one spec; returns its description (`RunSpec.describe`) and the result's
    `to_dict()` as one record."""
    resolved, plan = resolve(spec)
    result = run_trace(resolved, plan=plan, timeline=timeline, detail=True)
    point = point_of(spec.machine, family(spec.policy.label, spec.miss_mode.value), spec.host_cache is not None)
    return annotate({**spec.describe(), **result.to_dict(), "error_point": point.to_dict()})


def run_or_skip(spec: RunSpec) -> dict[str, Any]:
    """A run a policy cannot build (missing options, a trace it cannot serve) is a record
    that says why (`skipped`), not a failure of the whole grid."""
    try:
        return run(spec)
    except CasmoeError as exc:
        return {**spec.describe(), "skipped": str(exc)}


def skipped(spec: RunSpec, why: str) -> dict[str, Any]:
    """The record of a spec refused before it ran (a cache the box cannot hold, say)."""
    return {**spec.describe(), "skipped": why}


def _stored(out: Path, spec: RunSpec) -> dict[str, Any] | None:
    """The stored record of `spec`, or None to compute it: none stored, or one that is not a
    finished record of this very spec (cut short, emptied, hand-edited)."""
    path = out / "points" / f"{spec.key}.json"
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(rec, dict) or rec.get("key") != spec.key:
        return None
    if "skipped" in rec:
        return rec if isinstance(rec["skipped"], str) else None
    speed = rec.get("decode_tokens_per_s")
    return rec if isinstance(speed, (int, float)) and not isinstance(speed, bool) else None


def _store(out: Path, spec: RunSpec, record: dict[str, Any]) -> None:
    path = out / "points" / f"{spec.key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(record))


@contextmanager
def one_writer(out: Path) -> Iterator[None]:
    """Hold `out/points/.lock` for the duration: a second writer is refused in one line. The
    lock is the kernel's (`flock`), so a killed run leaves none behind."""
    folder = out / "points"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            raise RunStoreError(f"{out} is being written by another casmoe run ({holder}); wait for it to finish or "
                                "give another --out") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}")
        fh.flush()
        try:
            yield
        finally:
            fh.seek(0)
            fh.truncate()


def run_all(
    specs: Sequence[RunSpec],
    out: str | Path,
    *,
    jobs: int = 1,
    ray_address: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    refused: dict[RunSpec, str] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Run the specs not yet stored under `out`; returns every record (in spec order) and how
    many were computed now. `refused` specs are recorded as skipped, with the reason, without
    running; `ray_address` "local" starts a local Ray."""
    out = Path(out)
    refused = refused or {}
    with one_writer(out):
        records: dict[str, dict[str, Any]] = {}
        todo = []
        for s in specs:
            rec = skipped(s, refused[s]) if s in refused else _stored(out, s)
            if rec is None:
                todo.append(s)
            else:
                records[s.key] = rec
        done = 0
        if progress:
            progress(0, len(todo))
        runner = _run_ray if ray_address else _run_local
        for s, rec in runner(todo, jobs, ray_address):
            _store(out, s, rec)
            records[s.key] = rec
            done += 1
            if progress:
                progress(done, len(todo))
    # re-annotated: a stored point's words are those of the spreads when it ran
    return [annotate(records[s.key]) for s in specs], len(todo)


def _run_pair(spec: RunSpec) -> tuple[RunSpec, dict[str, Any]]:
    return spec, run_or_skip(spec)


def _die_with_parent(parent: int) -> None:
    """Worker initializer: a run that is killed outright (SIGKILL) takes its workers with it,
    through Linux's parent-death signal or, elsewhere, a thread watching the parent. `parent`
    is the run's pid as the run saw it: a worker whose start-up outlasted the run sees
    another parent already and leaves at once (reading `getppid` here would adopt the new one)."""
    try:
        if ctypes.CDLL(None).prctl(1, signal.SIGKILL) == 0:  # PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the parent died before the call
                os._exit(1)
            return
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


_shared: dict[str, Any] = {}
"""The pool `workers` opened for the block it guards, once started (key "pool"), and its size."""


@contextmanager
def workers(jobs: int) -> Iterator[None]:
    """One pool of `jobs` local processes for every `run_all` in the block (a search's rounds,
    each a few points): started when first needed and terminated on leaving, so that its
    processes start (about a second each, importing casmoe) once, not once per round."""
    _shared.update(jobs=jobs)
    try:
        yield
    finally:
        pool = _shared.pop("pool", None)
        _shared.clear()
        if pool is not None:
            pool.terminate()
            pool.join()


def _pool(processes: int) -> Any:
    # Pool, not ProcessPoolExecutor: leaving the block for any reason (Ctrl-C, SIGTERM, an
    # error) terminates the workers instead of waiting for their runs. Spawned, not forked:
    # a fork of a process with threads (torch, numba) can inherit a held lock and hang.
    ctx = multiprocessing.get_context("spawn")
    return ctx.Pool(processes, initializer=_die_with_parent, initargs=(os.getpid(),))


def _run_local(specs: Sequence[RunSpec], jobs: int, _: str | None) -> Iterator[tuple[RunSpec, dict[str, Any]]]:
    if jobs <= 1 or len(specs) <= 1:  # one run gains nothing from a process that must start first
        for s in specs:
            yield s, run_or_skip(s)
        return
    if _shared.get("jobs") == jobs:
        if "pool" not in _shared:
            _shared["pool"] = _pool(jobs)
        yield from _shared["pool"].imap_unordered(_run_pair, specs)
        return
    with _pool(min(jobs, len(specs))) as pool:
        yield from pool.imap_unordered(_run_pair, specs)


def _run_ray(specs: Sequence[RunSpec], jobs: int, address: str | None) -> Iterator[tuple[RunSpec, dict[str, Any]]]:
    import ray

    started = not ray.is_initialized()
    if started:
        if address in (None, "local"):
            ray.init(num_cpus=max(1, jobs), include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    try:
        remote = ray.remote(run_or_skip)
        pending = {remote.remote(s): s for s in specs}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                yield pending.pop(ref), ray.get(ref)
    finally:
        if started:
            ray.shutdown()

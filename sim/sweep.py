"""Grids of simulations: policies x capacities x hardware x models x traces (x arrival rates).

A `Point` is one fully specified run; its `key()` hashes everything that determines the result:
its fields, the trace file's contents, the scored requests, and `input_digest` (the profile's
numbers, the preset, every file or folder an option names, a user's policy module and its
package, casmoe's version), so a changed input is a new point; `run_grid` stores each finished point as
`points/<key>.json` in the output folder, so an interrupted sweep resumes where it stopped and a
re-run with more points only computes the new ones. Points run on local processes
(`concurrent.futures`) or, for users who outgrow one machine, on a Ray cluster.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from casmoe.cache import MissMode
from casmoe.errors import CasmoeError
from casmoe.options import CapacitySpec, OptionError, parse_miss_mode, parse_quant
from casmoe.output import write_text
from casmoe.policies import POLICIES, PolicySpec, get_policy
from casmoe.presets import get_preset, load_presets
from casmoe.selection import Selection
from casmoe.sim.assembly import StepPlan, check_geometry, expert_bytes_for, max_slots
from casmoe.sim.engine import simulate
from casmoe.sim.fits import check_capacity, check_devices, default_host_cache
from casmoe.sim.hardware import load_profile
from casmoe.sim.serving import Workload
from casmoe.sim.tiers import HostCache
from casmoe.sim.timeline import Timeline
from casmoe.trace import Trace
from casmoe.trace_io import load_trace

RESULT_VERSION = 3
"""Bump when the simulator's semantics change, so stored points are recomputed."""


class SweepError(CasmoeError, ValueError):
    """A grid that cannot be run (bad TOML, unknown keys, malformed capacity or policy)."""


@dataclass(frozen=True)
class Point:
    """One simulation: everything that determines its result."""

    trace: str
    model: str
    hardware: str
    policy: PolicySpec
    capacity: CapacitySpec
    batch: int = 1
    miss_mode: str = "load"
    devices: int = 0  # 0: every GPU of the profile
    quant: str = ""  # "": the trace's measured bytes, else bf16
    pinned: bool = True
    requests: tuple[int, ...] = ()  # the scored requests (indices into the trace); (): all
    trace_digest: str = ""
    workload: Workload | None = None  # None: requests back to back (or in static batches)
    host_cache: str = ""  # "": every expert in host RAM; else the RAM tier's size (40GB or experts)
    host_policy: str = "lru"
    inputs: str = ""  # digest of everything else the result depends on (`input_digest`)
    fitted: bool = False  # the policy was fitted on some of the scored requests: starred
    scored: str = ""  # the selection in words, for the record
    overcommit: bool = False  # the user allows capacities and devices the profile does not have
    gating: float | None = None  # AdapMoE's adaptive gating threshold (`casmoe.gating`); None: the exact routing

    def key(self) -> str:
        fields = asdict(self)
        if fields["gating"] is None:  # a point without gating keeps the key it had before gating existed
            del fields["gating"]
        blob = json.dumps({"v": RESULT_VERSION, **fields}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        return {
            "trace": Path(self.trace).name,
            "model": self.model,
            "hardware": self.hardware,
            "policy": self.policy.label,
            "capacity_spec": self.capacity.label,
            "oracle": self.policy.oracle or self.fitted,
            "scored": self.scored,
            **({} if self.gating is None else {"adaptive_gating": self.gating}),
            **self._load(),
            "key": self.key(),
        }

    def _load(self) -> dict[str, Any]:
        """The offered load, for latency-vs-load plots: arrival kind and rate (or users)."""
        w = self.workload
        if w is None:
            return {}
        return {"arrival": w.arrival.value, "rate": w.rate, "users": w.users}


def file_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def input_digest(hardware: str, model: str, policy: PolicySpec) -> str:
    """What a point's result depends on beyond its own fields and the trace's bytes: the
    profile's numbers and the preset (by content, whether named or a file), every file or
    folder an option names, a user's policy module with its package, casmoe's version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        casmoe_version = version("casmoe")
    except PackageNotFoundError:
        casmoe_version = "source"
    profile = {k: v for k, v in load_profile(hardware).to_dict().items() if k != "sources"}
    parts = [casmoe_version, json.dumps(profile, sort_keys=True), repr(get_preset(model))]
    for _, value in policy.options:
        if isinstance(value, str) and Path(value).exists():
            parts.append(path_digest(value))
    if policy.name not in POLICIES:
        parts += [path_digest(p) for p in _user_sources(policy.name)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def path_digest(path: str | Path) -> str:
    """A file's content digest, or a folder's: every file below it, by relative name."""
    path = Path(path)
    if not path.is_dir():
        return file_digest(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(path)}:{file_digest(f)}\n".encode())
    return h.hexdigest()[:16]


def _user_sources(spec: str) -> list[Path]:
    """The files of a user's policy `pkg.mod:Class`: its module, and every module of its
    top-level package (a helper it imports may change the result)."""
    import sys

    get_policy(spec)  # imports it, with the user's folder on the path
    module = sys.modules[spec.partition(":")[0]]
    top = sys.modules.get(module.__name__.partition(".")[0], module)
    files = [Path(module.__file__)] if getattr(module, "__file__", None) else []
    if getattr(top, "__path__", None):
        files += [p for d in top.__path__ for p in sorted(Path(d).rglob("*.py"))]
    return sorted(set(files))


@lru_cache(maxsize=4)
def _load_whole(path: str, digest: str) -> Trace:
    """One parse per trace file and process (the digest keys a changed file apart)."""
    return load_trace(path)


@lru_cache(maxsize=4)
def _routing(path: str, digest: str, gating: float | None) -> Trace:
    """The whole trace as the run's model routes it: gated (`casmoe.gating`), or as recorded."""
    from casmoe.gating import gate_trace

    return gate_trace(_load_whole(path, digest), gating)


@lru_cache(maxsize=4)
def _load_trace(path: str, digest: str, requests: tuple[int, ...], gating: float | None = None) -> Trace:
    """The trace's `requests` (all when empty), gated if `gating`."""
    whole = _routing(path, digest, gating)
    return whole.subset(requests) if requests else whole


@lru_cache(maxsize=4)
def _plan(path: str, digest: str, requests: tuple[int, ...], batch: int, devices: int, cache_per_device: bool,
          gating: float | None) -> StepPlan:
    return StepPlan.build(_load_trace(path, digest, requests, gating), batch, devices, cache_per_device)


def run_point(point: Point, timeline: Timeline | None = None) -> dict[str, Any]:
    """Simulate one point; returns the result's `to_dict()` plus the point's description."""
    hardware = load_profile(point.hardware)
    devices = point.devices or hardware.gpus
    trace = _load_trace(point.trace, point.trace_digest, point.requests, point.gating)
    preset = get_preset(point.model)
    check_geometry(trace.geometry, preset)
    quant = parse_quant(point.quant)
    nbytes = expert_bytes_for(trace, preset, quant)
    capacity = point.capacity.resolve(nbytes)
    miss_mode = parse_miss_mode(point.miss_mode)
    g = trace.geometry
    check_devices(hardware, devices, point.overcommit)
    check_capacity(capacity, max_slots(hardware, preset, nbytes, devices), g.experts, g.layers, point.capacity.label,
                   f"{hardware.name} x{devices}", point.overcommit)
    host_text = point.host_cache or default_host_cache(hardware, nbytes, g.experts, preset, point.overcommit)[0]
    host_cache = HostCache.parse(host_text, point.host_policy, nbytes) if host_text else None
    plan = None
    if point.workload is None:
        per_device = devices > 1 and not capacity.per_layer
        plan = _plan(point.trace, point.trace_digest, point.requests, point.batch, devices, per_device, point.gating)
        trace = plan.trace  # the object the plan was built on: the two caches let their entries go apart
    result = simulate(
        trace,
        get_policy(point.policy.name),
        capacity,
        hardware,
        preset,
        options=point.policy.bound(_routing(point.trace, point.trace_digest, point.gating)),
        label=point.policy.label,
        batch=point.batch,
        miss_mode=miss_mode,
        devices=devices,
        quant=quant,
        pinned=point.pinned,
        timeline=timeline,
        trace_name=Path(point.trace).name,
        plan=plan,
        workload=point.workload,
        host_cache=host_cache,
        detail=True,
    )
    return {**point.describe(), **result.to_dict()}


def _run_or_skip(point: Point) -> dict[str, Any]:
    """Worker entry: a point a policy cannot build (missing options) is recorded as skipped."""
    try:
        return run_point(point)
    except CasmoeError as exc:
        return {**point.describe(), "skipped": str(exc)}


@dataclass
class Grid:
    """The axes of a sweep; `points()` is their product."""

    traces: list[str]
    models: list[str]
    hardware: list[str]
    policies: list[PolicySpec]
    capacities: list[CapacitySpec]
    batch: list[int] = field(default_factory=lambda: [1])
    miss_modes: list[str] = field(default_factory=lambda: ["load"])
    devices: int = 0
    quant: str = ""
    pinned: bool = True
    requests: int = 0
    rates: list[float] = field(default_factory=list)  # requests/s: Poisson arrivals, one point per rate
    arrival: str = ""  # "": poisson with rates, else none (back to back); or "trace"
    users: int = 0  # > 0: a closed loop of this many users
    think: float = 0.0
    max_batch: int = 8
    schedule: str = "prefill-first"
    chunk: int = 512
    seed: int = 0
    host_cache: str = ""
    host_policy: str = "lru"
    split: str = "auto"
    tasks: list[str] = field(default_factory=list)
    range: str = ""
    allow_overcommit: bool = False
    adaptive_gating: float | None = None  # AdapMoE's threshold for every point (`casmoe.gating`)

    _AXES = {
        "traces": str,
        "models": str,
        "hardware": str,
        "policies": str,
        "capacities": str,
        "global_capacities": str,
        "batch": int,
        "miss_modes": str,
        "rates": float,
        "tasks": str,
    }
    _SCALARS = {
        "devices": int, "quant": str, "pinned": bool, "requests": int, "arrival": str, "users": int, "think": float,
        "max_batch": int, "schedule": str, "chunk": int, "seed": int, "host_cache": str, "host_policy": str,
        "split": str, "range": str, "allow_overcommit": bool, "adaptive_gating": float,
    }
    _LEAST = {"batch": 1, "devices": 0, "requests": 0, "users": 0, "max_batch": 1, "chunk": 1}
    """Smallest value of the integer keys (a batch of 0 or -1 requests is no what-if)."""

    @classmethod
    def from_toml(cls, path: str | Path) -> Grid:
        """Keys: traces, models, hardware, policies, capacities (slots or "6GB"),
        global_capacities, batch, miss_modes, rates (lists) and devices, quant, pinned, requests,
        arrival, users, think, max_batch, schedule, chunk, seed, host_cache, host_policy; the
        scored requests: split, tasks (a list), range (`casmoe.selection`); allow_overcommit;
        adaptive_gating (a threshold, `casmoe.gating`)."""
        from casmoe.userfile import read_toml

        raw = read_toml(path, "sweep file", SweepError)
        unknown = sorted(set(raw) - set(cls._AXES) - set(cls._SCALARS))
        if unknown:
            raise SweepError(f"{path}: unknown keys {unknown}; known: {sorted({**cls._AXES, **cls._SCALARS})}")
        axes: dict[str, list[Any]] = {}
        for key, kind in cls._AXES.items():
            v = raw.get(key, [])
            v = v if isinstance(v, list) else [v]
            bad = [x for x in v if not (_fits(x, kind) or (kind is str and _fits(x, int)))]
            if bad:
                raise SweepError(f"{path}: {key} = {v!r}: {bad[0]!r} is not {_AXIS_HINTS.get(key, _KINDS[kind])}")
            axes[key] = [kind(x) if kind in (str, float) else x for x in v]
            _check_least(path, key, axes[key])
        base = Path(path).parent
        try:
            caps = [CapacitySpec(c) for c in axes["capacities"]]
            caps += [CapacitySpec(c, False) for c in axes["global_capacities"]]
        except OptionError as exc:
            raise SweepError(f"{path}: {exc}") from None
        for key in ("traces", "models", "hardware", "policies"):
            if not axes[key]:
                raise SweepError(f"{path}: {key} is empty; list at least one")
        if not caps:
            raise SweepError(f"{path}: give capacities or global_capacities")
        scalars = {k: raw[k] for k in cls._SCALARS if k in raw}
        for k, kind in cls._SCALARS.items():
            if k in scalars and not _fits(scalars[k], kind):
                raise SweepError(f"{path}: {k} = {scalars[k]!r} is not {_KINDS[kind]}")
            if k in scalars and kind is float:
                scalars[k] = float(scalars[k])
            if k in scalars:
                _check_least(path, k, [scalars[k]])
        traces = [str(base / t) if not Path(t).is_absolute() and (base / t).exists() else t for t in axes["traces"]]
        return cls(
            traces=traces,
            models=axes["models"],
            hardware=axes["hardware"],
            policies=[PolicySpec.parse(p) for p in axes["policies"]],
            capacities=caps,
            batch=axes["batch"] or [1],
            miss_modes=axes["miss_modes"] or ["load"],
            rates=axes["rates"],
            tasks=axes["tasks"],
            **scalars,
        )

    def workloads(self) -> list[Workload | None]:
        """One per rate (Poisson unless `arrival` says otherwise), else the one `arrival` or
        `users` give, else None (requests back to back)."""
        common = dict(think_s=self.think, max_batch=self.max_batch, schedule=self.schedule, chunk=self.chunk,
                      seed=self.seed)
        if self.rates:
            return [Workload.from_options(self.arrival or "poisson", r, None, **common) for r in self.rates]
        return [Workload.from_options(self.arrival or None, None, self.users or None, **common)]

    def fill_defaults(self, trace: str) -> None:
        """The axes nobody gave: `trace`, the preset of the first trace's model, the seed paper's
        box, every policy, 4 slots per layer."""
        from casmoe.policies import POLICIES, default_policies

        self.traces = self.traces or [trace]
        if not self.models:
            first = self.traces[0]
            if not Path(first).exists():
                raise SweepError(f"trace {first} not found")
            self.models = [preset_for(_load_whole(first, file_digest(first)), None)]
        self.hardware = self.hardware or ["rtx4090x4"]
        self.policies = self.policies or default_policies(POLICIES)
        self.capacities = self.capacities or [CapacitySpec("4")]

    def points(self) -> list[Point]:
        """Every combination, each once; traces are hashed once, and each is checked to exist.
        The scored requests of each trace are chosen once for all its points (`casmoe.selection`:
        by default the requests no fitted policy of the grid saw)."""
        for key, values in (("batch", self.batch), ("devices", [self.devices]), ("requests", [self.requests]),
                            ("max_batch", [self.max_batch]), ("chunk", [self.chunk])):
            _check_least("sweep", key, values)
        selection = Selection.of(self.split, self.tasks, self.range, self.requests)
        digests, scored = {}, {}
        for t in self.traces:
            if not Path(t).exists():
                raise SweepError(f"trace {t} not found")
            digests[t] = file_digest(t)
            scored[t] = selection.resolve(_load_whole(t, digests[t]), self.policies)
        for m in self.models:
            get_preset(m)
        miss_modes = [parse_miss_mode(m, "miss mode").value for m in self.miss_modes]  # points keyed canonically
        for h in self.hardware:
            hw = load_profile(h)
            if MissMode.CPU.value in miss_modes:
                hw.check_host_compute(h)
        for p in self.policies:
            get_policy(p.name)
        parse_quant(self.quant, "quant")
        if self.adaptive_gating is not None:
            from casmoe.gating import check_threshold

            check_threshold(self.adaptive_gating)
        inputs = {(h, m, p): input_digest(h, m, p) for h in self.hardware for m in self.models for p in self.policies}
        out: dict[str, Point] = {}
        for t, m, h, p, c, b, mm, w in itertools.product(
            self.traces, self.models, self.hardware, self.policies, self.capacities, self.batch, miss_modes,
            self.workloads(),
        ):
            sc = scored[t]
            point = Point(t, m, h, p, c, b, mm, self.devices, self.quant, self.pinned,
                          () if sc.everything else sc.indices, digests[t], w, self.host_cache, self.host_policy,
                          inputs[h, m, p], p.label in sc.starred, sc.describe(), self.allow_overcommit,
                          self.adaptive_gating)
            out.setdefault(point.key(), point)  # a point listed twice runs and reports once
        return list(out.values())


_KINDS = {str: "a string", int: "a whole number", float: "a finite number", bool: "true or false"}
_AXIS_HINTS = {
    "capacities": 'a capacity: whole slots per layer (4) or memory as a string ("6GB")',
    "global_capacities": 'a capacity: whole slots (64) or memory as a string ("6GB")',
}


def _fits(value: Any, kind: type) -> bool:
    """A TOML value of the wanted kind (an integer is a fine float; a boolean is no number;
    TOML's nan and inf are no number either)."""
    if isinstance(value, bool):
        return kind is bool
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return isinstance(value, kind) or (kind is float and isinstance(value, int))


def _check_least(where: str | Path, key: str, values: Sequence[Any]) -> None:
    least = Grid._LEAST.get(key)
    bad = [v for v in values if least is not None and isinstance(v, int) and v < least]
    if bad:
        raise SweepError(f"{where}: {key} must be >= {least}, got {bad[0]}")


def _stored(out: Path, point: Point) -> dict[str, Any] | None:
    """The stored record of `point`, or None to compute it: none stored, or one that is not a
    finished record of this very point (cut short, emptied, hand-edited)."""
    path = out / "points" / f"{point.key()}.json"
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(rec, dict) or rec.get("key") != point.key():
        return None
    if "skipped" in rec:
        return rec if isinstance(rec["skipped"], str) else None
    speed = rec.get("decode_tokens_per_s")
    return rec if isinstance(speed, (int, float)) and not isinstance(speed, bool) else None


def _store(out: Path, point: Point, record: dict[str, Any]) -> None:
    path = out / "points" / f"{point.key()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(record))


def run_grid(
    points: Sequence[Point],
    out: str | Path,
    *,
    jobs: int = 1,
    ray_address: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Run the points not yet stored under `out`; returns all records (in point order) and
    how many were computed now. `ray_address` "local" starts a local Ray."""
    out = Path(out)
    records: dict[str, dict[str, Any]] = {}
    todo = []
    for p in points:
        rec = _stored(out, p)
        if rec is None:
            todo.append(p)
        else:
            records[p.key()] = rec
    done = 0
    if progress:
        progress(0, len(todo))
    runner = _run_ray if ray_address else _run_local
    for p, rec in runner(todo, jobs, ray_address):
        _store(out, p, rec)
        records[p.key()] = rec
        done += 1
        if progress:
            progress(done, len(todo))
    return [records[p.key()] for p in points], len(todo)


def _run_pair(point: Point) -> tuple[Point, dict[str, Any]]:
    return point, _run_or_skip(point)


def _die_with_parent(parent: int) -> None:
    """Worker initializer: a sweep that is killed outright (SIGKILL) takes its workers with it,
    through Linux's parent-death signal or, elsewhere, a thread watching the parent. `parent`
    is the sweep's pid as the sweep saw it: a worker whose start-up outlasted the sweep sees
    another parent already and leaves at once (reading `getppid` here would adopt the new one)."""
    try:
        import ctypes

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


def _run_local(points: Sequence[Point], jobs: int, _: str | None) -> Iterator[tuple[Point, dict[str, Any]]]:
    if jobs <= 1:
        for p in points:
            yield p, _run_or_skip(p)
        return
    # Pool, not ProcessPoolExecutor: leaving the block for any reason (Ctrl-C, SIGTERM, an
    # error) terminates the workers instead of waiting for their points. Spawned, not forked:
    # a fork of a process with threads (torch, numba) can inherit a held lock and hang.
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(min(jobs, len(points)) or 1, initializer=_die_with_parent, initargs=(os.getpid(),)) as pool:
        yield from pool.imap_unordered(_run_pair, points)


def _run_ray(points: Sequence[Point], jobs: int, address: str | None) -> Iterator[tuple[Point, dict[str, Any]]]:
    import ray

    started = not ray.is_initialized()
    if started:
        if address in (None, "local"):
            ray.init(num_cpus=max(1, jobs), include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    try:
        remote = ray.remote(_run_or_skip)
        pending = {remote.remote(p): p for p in points}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                yield pending.pop(ref), ray.get(ref)
    finally:
        if started:
            ray.shutdown()


def preset_for(trace: Trace, wanted: str | None) -> str:
    """`wanted`, else the trace's recorded preset, else the only preset with its shape."""
    if wanted:
        return wanted
    presets = load_presets()
    recorded = trace.meta.get("model_preset")
    if recorded in presets:
        return recorded
    g = trace.geometry
    fits = [n for n, p in presets.items() if (p.geometry.layers, p.geometry.experts) == (g.layers, g.experts)]
    return fits[0] if len(fits) == 1 else "mixtral-8x7b"


"""`RunSpec`: one simulation, every value parsed, keyed by the content of what it depends on.

Every command that simulates (simulate, sweep, search, leaderboard, the Python API) builds its
runs as `RunSpec`s through one function (`casmoe.sim.run.grid.Grid.specs`) and runs them through
one function (`casmoe.sim.run.runner.run`); nothing downstream parses a string or checks a profile
again. `RunSpec.key` is the one place a stored result is keyed: the trace file's content and
the scored requests, the profile's numbers, the preset, the policy with the content of every
file or folder its options name (and a user's policy module with its package), every setting,
and casmoe's version, so no command can reuse a result its inputs no longer produce.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from functools import cached_property, lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from casmoe.cache import MissMode
from casmoe.options import CapacitySpec
from casmoe.policies import POLICIES, PolicySpec, get_policy
from casmoe.sim.cost.machine import Machine
from casmoe.sim.passes.tiers import HostCache
from casmoe.sim.passes.traffic import Traffic

RESULT_VERSION = 4
"""Bump when the simulator's semantics change, so stored results are recomputed."""


@dataclass(frozen=True)
class TraceRef:
    """The routing a run replays: a trace file by path and content digest, the requests of it
    that are scored (indices; () all), why those (in words), and AdapMoE's gating threshold
    applied to its routing (`casmoe.gating`; None: the routing as recorded)."""

    path: str
    digest: str
    requests: tuple[int, ...] = ()
    scored: str = ""
    gating: float | None = None

    @property
    def name(self) -> str:
        return Path(self.path).name


@dataclass(frozen=True)
class RunSpec:
    """One run: a policy with a cache on a machine, replaying a trace, served some way.

    `host_cache` None keeps every expert in host RAM; `fitted` says that the policy was fitted
    on some of the scored requests (starred beside the oracles); `overcommit` records that the
    user allowed what the box lacks; `context` serves each request at that many tokens of
    context (`timing.histories`); `hardware` is the profile as the user named it (a shipped
    name, a file, a variant), for the record."""

    trace: TraceRef
    policy: PolicySpec
    capacity: CapacitySpec
    machine: Machine
    hardware: str = ""
    batch: int = 1
    miss_mode: MissMode = MissMode.LOAD
    traffic: Traffic | None = None
    host_cache: HostCache | None = None
    overcommit: bool = False
    fitted: bool = False
    context: int = 0  # tokens of context each request is served at (0: its own length)
    prefill_batch: int = 1  # prompts of a static batch prefilled together (served: `Traffic.prefill_batch`)

    @cached_property
    def key(self) -> str:
        """A digest of everything the result depends on (see the module docstring)."""
        tier = None
        if self.host_cache is not None:
            hc = self.host_cache
            tier = [hc.rows, hc.policy.name or hc.policy.__qualname__, list(hc.options), hc.chunk_bytes]
        blob = {
            "v": RESULT_VERSION,
            "casmoe": casmoe_version(),
            "trace": [self.trace.path, self.trace.digest, list(self.trace.requests), self.trace.gating],
            "policy": self.policy.label,
            "policy_inputs": policy_inputs(self.policy),
            "capacity": [self.capacity.text, self.capacity.per_layer],
            **self.machine.content(),
            "batch": self.batch,
            "miss_mode": self.miss_mode.value,
            "traffic": None if self.traffic is None else {
                k: v for k, v in asdict(self.traffic).items() if k != "prefill_batch" or v != 1  # older keys stay
            },
            "host_cache": tier,
            "overcommit": self.overcommit,
            "fitted": self.fitted,
            **({"context": self.context} if self.context else {}),  # absent when not given: older keys stay
            **({"prefill_batch": self.prefill_batch} if self.prefill_batch != 1 else {}),
        }
        text = json.dumps(blob, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        """The fields a record carries besides the result: what ran, on what, and its key."""
        t = self.traffic
        return {
            "trace": self.trace.name,
            "model": self.machine.preset.name,
            "hardware": self.machine.hardware.name,
            "policy": self.policy.label,
            "stack": self.machine.stack.label,
            "upper_bound": self.machine.stack.upper_bound,
            "capacity_spec": self.capacity.label,
            "oracle": self.policy.oracle or self.fitted,
            "scored": self.trace.scored,
            **({} if self.trace.gating is None else {"adaptive_gating": self.trace.gating}),
            **({"context": self.context} if self.context else {}),
            **({} if t is None else {"arrival": t.arrival.value, "rate": t.rate, "users": t.users}),
            "key": self.key,
        }


def casmoe_version() -> str:
    """The installed package's version ("source" for a checkout without metadata)."""
    try:
        return version("casmoe")
    except PackageNotFoundError:
        return "source"


def policy_inputs(policy: PolicySpec) -> list[str]:
    """Digests of what a policy's result depends on beyond its label: every file or folder an
    option names, and a user's policy module with every module of its package."""
    parts = [path_digest(value) for _, value in policy.options if isinstance(value, str) and Path(value).exists()]
    if policy.name not in POLICIES:
        parts += [path_digest(p) for p in user_sources(policy.name)]
    return parts


def file_digest(path: str | Path) -> str:
    """The first 16 hex digits of a file's SHA-256, read in chunks; remembered per (path,
    size, modification time), so a grid of many runs over one trace hashes it once."""
    st = Path(path).stat()
    return _file_digest(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=256)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def path_digest(path: str | Path) -> str:
    """A file's content digest, or a folder's: every file below it, by relative name."""
    path = Path(path)
    if not path.is_dir():
        return file_digest(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(path)}:{file_digest(f)}\n".encode())
    return h.hexdigest()[:16]


def user_sources(spec: str) -> list[Path]:
    """The files of a user's policy `pkg.mod:Class`: its module, and every module of its
    top-level package (a helper it imports may change the result)."""
    get_policy(spec)  # imports it, with the user's folder on the path
    module = sys.modules[spec.partition(":")[0]]
    top = sys.modules.get(module.__name__.partition(".")[0], module)
    files = [Path(module.__file__)] if getattr(module, "__file__", None) else []
    if getattr(top, "__path__", None):
        files += [p for d in top.__path__ for p in sorted(Path(d).rglob("*.py"))]
    return sorted(set(files))

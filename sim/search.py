"""The cheapest configurations that meet a target: `casmoe search`.

"What do I need for 10 tokens/s, or a TTFT p99 under 2 s at 0.5 requests/s?" A *config* is
everything but the cache size: hardware profile, GPU count, policy, quantisation, RAM tier.
For each config the search finds the fewest slots per layer that meet the target, by bisection
over `[top_k, most that fit the GPUs]`: it assumes the target metric improves (or stays) as
the cache grows, which holds for the built-in policies' demand hit rates on the traces tried
(tests/test_sim_search.py checks the answer against a brute-force grid). A config whose largest
cache misses the target is settled by that one run. The rounds of all configs' probes run
together through `sweep.run_grid` (local processes or Ray), whose point store under `out`
makes an interrupted search resume and a repeated one free.

The answer per config is its cheapest point that meets the target; memory is the GPUs' expert
cache plus the RAM tier. The Pareto table keeps the answers no other answer beats on GPUs,
memory and the metric together; every row carries its evidence (the point's key: its
simulate record is `points/<key>.json`).
"""

from __future__ import annotations

import itertools
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from casmoe.errors import CasmoeError
from casmoe.options import CapacitySpec, parse_quant
from casmoe.policies import PolicySpec
from casmoe.presets import ModelPreset, get_preset
from casmoe.sim.assembly import expert_bytes_for, max_slots
from casmoe.sim.hardware import load_profile, variant_spec
from casmoe.sim.serving import Workload
from casmoe.sim.sweep import Point, _load_trace, file_digest, input_digest, run_grid
from casmoe.trace import Trace

METRICS = {
    "tok/s": ("decode_tokens_per_s", ">="),
    "tpot_p50": ("tpot_p50_s", "<="),
    "tpot_p99": ("tpot_p99_s", "<="),
    "ttft_p99": ("ttft_p99_s", "<="),
}
"""Short names of the targets users ask for, with the direction that is better."""
_OPS = {">=": operator.ge, "<=": operator.le}


class SearchError(CasmoeError, ValueError):
    """A search that cannot run (a target that does not parse, no config to try)."""


@dataclass(frozen=True)
class Target:
    """`metric op value`, e.g. `tok/s>=10`, `ttft_p99<=2` or any SimResult field."""

    metric: str
    op: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Target:
        m = re.fullmatch(r"\s*([\w/]+)\s*(>=|<=)\s*([0-9.eE+-]+)\s*", text)
        if not m:
            raise SearchError(f"bad target {text!r}; write METRIC>=X or METRIC<=X, e.g. tok/s>=10, ttft_p99<=2")
        name, op, value = m.groups()
        metric, better = METRICS.get(name, (name, op))
        if op != better:
            raise SearchError(f"target {text!r}: {name} is better {'higher' if better == '>=' else 'lower'}; use {better}")
        try:
            return cls(metric, op, float(value))
        except ValueError:
            raise SearchError(f"bad target value {value!r} in {text!r}") from None

    def met(self, record: dict[str, Any]) -> bool:
        return "skipped" not in record and _OPS[self.op](record[self.metric], self.value)

    def better(self, a: float, b: float) -> bool:
        """`a` at least as good as `b`."""
        return a >= b if self.op == ">=" else a <= b

    def describe(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"


@dataclass(frozen=True)
class Config:
    """Everything but the cache size."""

    hardware: str
    devices: int
    policy: PolicySpec
    quant: str = ""
    host_cache: str = ""
    link: str = ""  # "": the profile's own host link; else a generation of sim/links.toml
    host_ram_gib: float | None = None  # None: the profile's host RAM

    def spec(self) -> str:
        """The hardware spec the points load (`hardware.variant_spec`)."""
        return variant_spec(self.hardware, self.link, self.host_ram_gib)

    def label(self) -> str:
        parts = [self.hardware, f"{self.devices} GPU{'s' if self.devices > 1 else ''}", self.policy.label,
                 self.quant or "trace bytes"]
        parts += [f"link {self.link}"] if self.link else []
        parts += [f"{self.host_ram_gib:g} GiB RAM"] if self.host_ram_gib is not None else []
        return ", ".join(parts + ([f"RAM tier {self.host_cache}"] if self.host_cache else []))

    def dominates(self, other: Config) -> bool:
        """Whether this config is `other` with a host link at least as fast and at least as much
        host RAM, one of them more (the rest equal): then, as with a larger cache, it is assumed to do no worse at
        any cache size, and it holds the same cache sizes."""
        if (self.hardware, self.devices, self.policy, self.quant, self.host_cache) != (
            other.hardware, other.devices, other.policy, other.quant, other.host_cache
        ) or self == other:
            return False
        a, b = load_profile(self.spec()), load_profile(other.spec())
        mine = (a.h2d_pinned_gbs, a.h2d_pageable_gbs, a.host_ram_gib)
        theirs = (b.h2d_pinned_gbs, b.h2d_pageable_gbs, b.host_ram_gib)
        return mine != theirs and all(x >= y for x, y in zip(mine, theirs))


@dataclass
class _Bisect:
    """One config's search state: the fewest slots meeting the target lie in [lo, hi]."""

    config: Config
    lo: int
    hi: int
    best: dict[str, Any] | None = None  # the record at `hi` once it met the target
    last: dict[str, Any] | None = None  # the last record probed
    settled: bool = False
    bounded_by: Config | None = None  # settled unprobed: a config that dominates it misses the target

    def probe(self) -> int | None:
        if self.settled:
            return None
        return self.hi if self.best is None else (self.lo + self.hi) // 2

    def update(self, slots: int, record: dict[str, Any], target: Target) -> None:
        self.last = record
        if self.best is None:  # the largest cache: meets it, or nothing will
            self.settled = not target.met(record)
            if not self.settled:
                self.best = record
        elif target.met(record):
            self.hi, self.best = slots, record
        else:
            self.lo = slots + 1
        self.settled = self.settled or self.lo >= self.hi


@dataclass
class SearchResult:
    target: Target
    answers: list[tuple[Config, dict[str, Any]]]  # each feasible config's cheapest point
    infeasible: list[tuple[Config, str]]  # configs that cannot meet it, and why
    simulated: int  # points computed now
    probed: int  # points the search looked at (computed or stored)
    grid: int  # points a full grid over the same slot ranges would hold
    records: list[dict[str, Any]] = field(default_factory=list)  # every point looked at

    def pareto(self) -> list[tuple[Config, dict[str, Any]]]:
        """Answers no other beats on GPUs, memory and the metric at once."""
        def beats(a: tuple[Config, dict[str, Any]], b: tuple[Config, dict[str, Any]]) -> bool:
            (ca, ra), (cb, rb) = a, b
            key_a = (ca.devices, memory_gb(ra))
            key_b = (cb.devices, memory_gb(rb))
            no_worse = all(x <= y for x, y in zip(key_a, key_b)) and self.target.better(ra[self.target.metric], rb[self.target.metric])
            return no_worse and (key_a != key_b or ra[self.target.metric] != rb[self.target.metric])

        front = [a for a in self.answers if not any(beats(b, a) for b in self.answers if b is not a)]
        return sorted(front, key=lambda a: (memory_gb(a[1]), a[0].devices))


def memory_gb(record: dict[str, Any]) -> float:
    """What a point costs in memory: the GPUs' expert cache plus the RAM tier."""
    return record["capacity_gb"] + record.get("host_cache_gb", 0.0)


def configs(hardware: Sequence[str], gpus: Sequence[int], policies: Sequence[PolicySpec], quants: Sequence[str],
            host_caches: Sequence[str], links: Sequence[str] = (), host_rams: Sequence[float] = ()) -> list[Config]:
    """Every combination of the axes (0 GPUs: every GPU of the profile; no link or RAM: the
    profile's own)."""
    out = []
    axes = itertools.product(hardware, gpus or [0], policies, quants or [""], host_caches or [""], links or [""],
                             host_rams or [None])
    for h, n, p, q, tier, link, ram in axes:
        c = Config(h, n or load_profile(h).gpus, p, q, tier, link, ram)
        load_profile(c.spec())  # a bad link or RAM size fails here, in one line
        out.append(c)
    if not out:
        raise SearchError("nothing to search: give at least one hardware profile and one policy")
    return out


def slot_range(trace: Trace, preset: ModelPreset, config: Config) -> tuple[int, int]:
    """The cache sizes a config can have: from top_k slots per layer to the most the GPUs hold
    beside the dense weights (at most every expert)."""
    nbytes = expert_bytes_for(trace, preset, parse_quant(config.quant))
    g = trace.geometry
    return g.top_k, min(max_slots(load_profile(config.spec()), preset, nbytes, config.devices), g.experts)


def search(
    trace: str,
    model: str,
    candidates: Sequence[Config],
    target: Target,
    out: str,
    *,
    workload: Workload | None = None,
    requests: int = 0,
    miss_mode: str = "load",
    jobs: int = 1,
    ray_address: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """Bisect each config's cache size (on the first `requests` requests, 0: all); the rounds
    of all configs run as one grid each. Configs that dominate others (`Config.dominates`: a
    faster link, more host RAM) are searched first: one that misses the target at its largest
    cache settles every config it dominates unprobed, and one's answer is the others' lower
    bound."""
    digest = file_digest(trace)
    scored = tuple(range(min(requests, len(_load_trace(trace, digest, ()).requests)))) if requests else ()
    tr = _load_trace(trace, digest, scored)
    preset = get_preset(model)
    states, infeasible = [], []
    for c in candidates:
        lo, hi = slot_range(tr, preset, c)
        if hi < lo:
            infeasible.append((c, f"the GPUs hold {hi} slots per layer, below top_k={lo}"))
        else:
            states.append(_Bisect(c, lo, hi))
    grid = sum(s.hi - s.lo + 1 for s in states)

    inputs = {c: input_digest(c.spec(), model, c.policy) for c in {s.config for s in states}}

    def point(c: Config, slots: int) -> Point:
        return Point(trace, model, c.spec(), c.policy, CapacitySpec(str(slots)), 1, miss_mode, c.devices, c.quant,
                     True, scored, digest, workload, c.host_cache, inputs=inputs[c])

    betters = {id(s): [b for b in states if b.config.dominates(s.config)] for s in states}
    simulated = probed = 0
    records = []
    while True:
        for s in states:
            if s.settled or s.best is not None or s.last is not None:
                continue
            ahead = betters[id(s)]
            missed = [b for b in ahead if b.settled and b.best is None and "skipped" not in (b.last or {})]
            if missed:
                s.settled, s.bounded_by = True, missed[0].config
            elif all(b.settled for b in ahead):
                s.lo = max([s.lo] + [b.hi for b in ahead])  # a better config's fewest slots
        ready = [s for s in states if all(b.settled for b in betters[id(s)])]
        probes = [(s, s.probe()) for s in ready]
        probes = [(s, slots) for s, slots in probes if slots is not None]
        if not probes:
            break
        recs, computed = run_grid([point(s.config, slots) for s, slots in probes], out, jobs=jobs,
                                  ray_address=ray_address, progress=progress)
        simulated, probed = simulated + computed, probed + len(probes)
        for (s, slots), rec in zip(probes, recs):
            records.append(rec)
            s.update(slots, rec, target)
    answers = []
    for s in states:
        if s.best is not None:
            answers.append((s.config, s.best))
        elif s.bounded_by is not None:
            infeasible.append((s.config, f"not simulated: its link is no faster and its RAM no larger than those of "
                                         f"{s.bounded_by.label()}, which misses it with every cache that fits"))
        elif s.last is not None and "skipped" in s.last:
            infeasible.append((s.config, s.last["skipped"]))
        elif s.last is not None:
            infeasible.append((s.config, f"{target.metric} = {s.last[target.metric]:.4g} at {s.hi} slots per layer, the most that fit"))
    return SearchResult(target, answers, infeasible, simulated, probed, grid, records)

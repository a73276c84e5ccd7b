"""The cheapest configurations that meet a target: `casmoe search`.

"What do I need for 10 tokens/s, or a TTFT p99 under 2 s at 0.5 requests/s?" A *config* is a
run without its cache size (`RunSpec` with every option but the capacity: box variant, GPUs,
policy, precision, RAM tier, ...), built by the same `Grid.specs` as every other command. For
each config the search finds the fewest slots per layer that meet the target, by bisection
over `[top_k, most that fit the GPUs]`: it assumes the target metric improves (or stays) as
the cache grows, which holds for the built-in policies' demand hit rates on the traces tried
(tests/test_sim_search.py checks the answer against a brute-force grid). A config whose largest
cache misses the target is settled by that one run. The rounds of all configs' probes run
together through `casmoe.sim.run.run_all` (local processes or Ray), whose store under `out`
makes an interrupted search resume and a repeated one free.

The answer per config is its cheapest point that meets the target; memory is the GPUs' expert
cache plus the RAM tier. The Pareto table keeps the answers no other answer beats on GPUs,
memory and the metric together; every row carries its evidence (the point's key: its
simulate record is `points/<key>.json`).
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from casmoe.errors import CasmoeError
from casmoe.options import CapacitySpec
from casmoe.sim.grid import Grid
from casmoe.sim.run import run_all, whole_trace
from casmoe.sim.spec import RunSpec

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


def numeric_fields() -> dict[str, str]:
    """The fields of a simulate record a target may name: the `SimResult` numbers (and the cache
    counters it carries), with how each is better; unknown ones are lower-is-better."""
    from dataclasses import fields

    from casmoe.cache import CacheStats
    from casmoe.sim.result import SimResult

    out = {f.name: "<=" for f in fields(SimResult) if f.type in ("int", "float")}
    out.update({f.name: ">=" for f in fields(CacheStats) if f.type in ("int", "float")})
    for better in ("decode_tokens_per_s", "throughput_tokens_per_s", "requests_per_s", "hit_rate", "warm_hit_rate",
                   "hits", "prefetch_used", "mean_batch", "peak_batch"):
        out[better] = ">="
    out.update({"hit_rate": ">=", "warm_hit_rate": ">="})
    return out


@dataclass(frozen=True)
class Target:
    """`metric op value`, e.g. `tok/s>=10`, `ttft_p99<=2` or any numeric simulate field."""

    metric: str
    op: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Target:
        m = re.fullmatch(r"\s*([\w/]+)\s*(>=|<=)\s*(\S+)\s*", text)
        if not m:
            raise SearchError(f"bad target {text!r}; write METRIC>=X or METRIC<=X, e.g. tok/s>=10, ttft_p99<=2")
        name, op, value = m.groups()
        known = numeric_fields()
        if name in METRICS:
            metric, better = METRICS[name]
        elif name in known:
            metric, better = name, known[name]
        else:
            raise SearchError(f"target {text!r}: unknown metric {name!r}; use {', '.join(METRICS)} or a numeric "
                              "simulate field (decode_tokens_per_s, e2e_p99_s, hit_rate, ...)")
        if op != better:
            raise SearchError(f"target {text!r}: {name} is better {'higher' if better == '>=' else 'lower'}; use {better}")
        try:
            number = float(value)
        except ValueError:
            raise SearchError(f"bad target value {value!r} in {text!r}; give a number") from None
        if number != number or number in (float("inf"), float("-inf")):
            raise SearchError(f"bad target value {value!r} in {text!r}; give a finite number")
        return cls(metric, op, number)

    def met(self, record: dict[str, Any]) -> bool:
        return "skipped" not in record and _OPS[self.op](record[self.metric], self.value)

    def better(self, a: float, b: float) -> bool:
        """`a` at least as good as `b`."""
        return a >= b if self.op == ">=" else a <= b

    def describe(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"


def label(spec: RunSpec) -> str:
    """A config in words: the box, GPUs used, policy, precision, RAM tier."""
    m = spec.machine
    parts = [m.hardware.name, f"{m.devices} GPU{'s' if m.devices > 1 else ''}", spec.policy.label,
             m.quant.value if m.quant else "trace bytes"]
    if spec.host_cache is not None:
        parts.append(f"RAM tier {spec.host_cache.rows} experts")
    return ", ".join(parts)


_FASTER = ("h2d_pinned_gbs", "h2d_pageable_gbs", "host_ram_gib")
"""The profile numbers a config may have more of and dominate another (the search's link and
RAM axes); every other number must be equal."""


def dominates(a: RunSpec, b: RunSpec) -> bool:
    """Whether config `a` is `b` with a host link at least as fast and at least as much host RAM,
    one of them more (the rest equal): then, as with a larger cache, it is assumed to do no worse
    at any cache size, and it holds the same cache sizes."""
    if a is b or replace(a, machine=b.machine, hardware=b.hardware) != b:
        return False
    ha, hb = a.machine.hardware.to_dict(), b.machine.hardware.to_dict()
    ignore = {"name", "description", "sources", *_FASTER}
    if any(ha[k] != hb[k] for k in ha if k not in ignore) or replace(a.machine, hardware=b.machine.hardware) != b.machine:
        return False
    mine, theirs = [ha[k] for k in _FASTER], [hb[k] for k in _FASTER]
    return mine != theirs and all(x >= y for x, y in zip(mine, theirs))


@dataclass
class _Bisect:
    """One config's search state: the fewest slots meeting the target lie in [lo, hi]."""

    config: RunSpec
    lo: int
    hi: int
    best: dict[str, Any] | None = None  # the record at `hi` once it met the target
    last: dict[str, Any] | None = None  # the last record probed
    settled: bool = False
    bounded_by: RunSpec | None = None  # settled unprobed: a config that dominates it misses the target

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
    answers: list[tuple[RunSpec, dict[str, Any]]]  # each feasible config's cheapest point
    infeasible: list[tuple[RunSpec, str]]  # configs that cannot meet it, and why
    simulated: int  # points computed now
    probed: int  # points the search looked at (computed or stored)
    grid: int  # points a full grid over the same slot ranges would hold
    records: list[dict[str, Any]] = field(default_factory=list)  # every point looked at

    def pareto(self) -> list[tuple[RunSpec, dict[str, Any]]]:
        """Answers no other beats on GPUs, memory and the metric at once."""
        def beats(a: tuple[RunSpec, dict[str, Any]], b: tuple[RunSpec, dict[str, Any]]) -> bool:
            (ca, ra), (cb, rb) = a, b
            key_a = (ca.machine.devices, memory_gb(ra))
            key_b = (cb.machine.devices, memory_gb(rb))
            no_worse = all(x <= y for x, y in zip(key_a, key_b)) and self.target.better(ra[self.target.metric], rb[self.target.metric])
            return no_worse and (key_a != key_b or ra[self.target.metric] != rb[self.target.metric])

        front = [a for a in self.answers if not any(beats(b, a) for b in self.answers if b is not a)]
        return sorted(front, key=lambda a: (memory_gb(a[1]), a[0].machine.devices))


def memory_gb(record: dict[str, Any]) -> float:
    """What a point costs in memory: the GPUs' expert cache plus the RAM tier."""
    return record["capacity_gb"] + record.get("host_cache_gb", 0.0)


def configs(grid: Grid) -> list[RunSpec]:
    """Every combination of the grid's options, each a run whose capacity the search chooses."""
    if grid.given.get("capacity") or grid.given.get("global_capacity"):
        raise SearchError("search chooses the cache size itself (slots per layer, from top_k to what the GPUs hold); "
                          "leave out --capacity and --global-capacity")
    runs = grid.with_values(capacity="1").specs(strict=False)
    return list(dict.fromkeys(runs.specs))


def slot_range(config: RunSpec) -> tuple[int, int]:
    """The cache sizes a config can have: from top_k slots per layer to the most the GPUs hold
    beside the dense weights (at most every expert)."""
    trace = whole_trace(config.trace.path, config.trace.digest)
    g = trace.geometry
    m = config.machine
    return g.top_k, min(m.max_slots(m.expert_bytes(trace)), g.experts)


def search(
    candidates: Sequence[RunSpec],
    target: Target,
    out: str,
    *,
    jobs: int = 1,
    ray_address: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """Bisect each config's cache size; the rounds of all configs run as one batch each. Configs
    that dominate others (`dominates`: a faster link, more host RAM) are searched first: one
    that misses the target at its largest cache settles every config it dominates unprobed, and
    one's answer is the others' lower bound."""
    states, infeasible = [], []
    for c in candidates:
        lo, hi = slot_range(c)
        if hi < lo:
            infeasible.append((c, f"the GPUs hold {hi} slots per layer, below top_k={lo}"))
        else:
            states.append(_Bisect(c, lo, hi))
    grid = sum(s.hi - s.lo + 1 for s in states)

    def point(c: RunSpec, slots: int) -> RunSpec:
        return replace(c, capacity=CapacitySpec(str(slots)))

    betters = {id(s): [b for b in states if dominates(b.config, s.config)] for s in states}
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
        recs, computed = run_all([point(s.config, slots) for s, slots in probes], out, jobs=jobs,
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
                                         f"{label(s.bounded_by)}, which misses it with every cache that fits"))
        elif s.last is not None and "skipped" in s.last:
            infeasible.append((s.config, s.last["skipped"]))
        elif s.last is not None:
            infeasible.append((s.config, f"{target.metric} = {s.last[target.metric]:.4g} at {s.hi} slots per layer, the most that fit"))
    return SearchResult(target, answers, infeasible, simulated, probed, grid, records)

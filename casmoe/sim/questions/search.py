"""The cheapest configurations that meet a target: `casmoe search`.

"What do I need for 10 tokens/s, or a TTFT p99 under 2 s at 0.5 requests/s?" A *config* is a
run without its cache size (`RunSpec` with every option but the capacity: box variant, GPUs,
policy, precision, RAM tier, ...), built by the same `Grid.specs` as every other command. For
each config the search finds the fewest slots per layer that meet the target, by bisection
over `[top_k, most that fit the GPUs]`: it assumes the target metric improves (or stays) as
the cache grows, which holds for the built-in policies' demand hit rates on the traces tried
(tests/sim/questions/test_sim_search.py checks the answer against a brute-force grid). A config whose largest
cache misses the target is settled by that one run. The rounds of all configs' probes run
together through `casmoe.sim.run.runner.run_all` (local processes or Ray), whose store under `out`
makes an interrupted search resume and a repeated one free.

The answer per config is its cheapest point that meets the target; memory is the GPUs' expert
cache plus the RAM tier. Each config's box has a price (`casmoe.sim.box.prices`: its GPUs, host RAM
and host link, from casmoe/sim/box/prices.toml or a user's file; unknown when a part has none, never
guessed). The Pareto table keeps the answers no other answer beats on GPUs, memory, price and
the metric together, where two metrics within `TIE` (1%) of each other are equal, so that a tie
goes to the cheaper box; every row carries its evidence (the point's key: its simulate record
is `points/<key>.json`).
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Sequence

from casmoe.cache import CacheStats
from casmoe.errors import CasmoeError
from casmoe.options import CapacitySpec, parse_quant
from casmoe.sim.box.hardware import variant
from casmoe.sim.box.prices import BoxPrice, Prices, load_prices
from casmoe.sim.passes.result import SimResult
from casmoe.sim.questions.deploy.terms import engine_terms
from casmoe.sim.run.grid import Grid
from casmoe.sim.run.runner import run_all, whole_trace, workers
from casmoe.sim.run.spec import RunSpec

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


INPUTS = ("capacity_slots", "capacity_gb", "host_cache_gb", "batch", "devices", "requests", "prefill_tokens",
          "decode_tokens", "max_batch", "accesses", "future_runs")
"""Numeric record fields that a run is given, not what it measures: no target."""
SERVING = ("queue_wait_mean_s", "queue_wait_p99_s", "queue_mean", "queue_max", "peak_batch", "mean_batch")
"""Fields measured only when requests arrive over time (0 or 1 back to back)."""
HIGHER = ("decode_tokens_per_s", "throughput_tokens_per_s", "requests_per_s", "hit_rate", "warm_hit_rate", "hits",
          "host_hits", "prefetch_used", "mean_batch", "peak_batch")
"""Measured fields where more is better; every other measured number is better lower."""
SHARES = ("hit_rate", "warm_hit_rate")
"""Measured fields that are shares, between 0 and 1."""
TIE = 0.01
"""Two answers whose metric differs by at most this share of the larger are tied: the cheaper wins."""


def numeric_fields() -> dict[str, str]:
    """The fields of a simulate record a target may name, with how each is better: the
    `SimResult` numbers and the cache counters it carries, and the record's derived totals
    (`stall_s`, `loads`, `hit_rate`, `warm_hit_rate`), less what a run is given (`INPUTS`)."""
    names = [f.name for f in fields(SimResult) if f.type in ("int", "float")]
    names += [f.name for f in fields(CacheStats) if f.type in ("int", "float")]
    names += ["stall_s", "loads", "hit_rate", "warm_hit_rate"]
    return {n: (">=" if n in HIGHER else "<=") for n in names if n not in INPUTS}


def _not_a_metric(name: str) -> str | None:
    """Why a record field that exists cannot be a target, or None when it is unknown."""
    if name in INPUTS:
        return f"{name} is what a run is given, not what it measures; search chooses the cache size, and --batch, " \
               "--gpus, --requests set the rest"
    types = {f.name: str(f.type) for f in fields(SimResult)}
    if name in types and types[name].startswith("tuple"):
        return f"{name} is a list (per layer, device or time), not one number; target a total such as stall_s"
    if name in types or name in ("trace", "model", "hardware", "policy", "capacity_spec", "oracle", "scored", "key",
                                 "arrival", "rate", "users", "adaptive_gating"):
        return f"{name} is not a measured number"
    return None


@dataclass(frozen=True)
class Target:
    """`metric op value`, e.g. `tok/s>=10`, `ttft_p99<=2` or any numeric simulate field."""

    metric: str
    op: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Target:
        example = "e.g. tok/s>=10, ttft_p99<=2, hit_rate>=0.5"
        m = re.fullmatch(r"\s*([\w/]+)\s*(>=|<=)\s*(\S+)\s*", text)
        if not m:
            raise SearchError(f"bad target {text!r}; write METRIC>=X or METRIC<=X, {example}")
        name, op, value = m.groups()
        known = numeric_fields()
        if name in METRICS:
            metric, better = METRICS[name]
        elif name in known:
            metric, better = name, known[name]
        else:
            why = _not_a_metric(name)
            hint = f"use {', '.join(METRICS)} or a measured simulate field (decode_tokens_per_s, e2e_p99_s, " \
                   "hit_rate, stall_s, ...)"
            raise SearchError(f"target {text!r}: {why}; {hint}" if why else
                              f"target {text!r}: unknown metric {name!r}; {hint}")
        if op != better:
            raise SearchError(f"target {text!r}: {name} is better {'higher' if better == '>=' else 'lower'}; write "
                              f"{name}{better}{value}")
        try:
            number = float(value.rstrip("%")) / 100 if value.endswith("%") and metric.endswith("rate") else float(value)
        except ValueError:
            raise SearchError(f"bad target value {value!r} in {text!r}; give a number, {example}") from None
        if not math.isfinite(number):
            raise SearchError(f"bad target value {value!r} in {text!r}; give a finite number, {example}")
        if number < 0:
            raise SearchError(f"target {text!r}: {name} is never negative; give a number >= 0")
        if metric in SHARES and number > 1:
            raise SearchError(f"target {text!r}: {name} is a share between 0 and 1; write {name}{op}0.5 or "
                              f"{name}{op}50%")
        return cls(metric, op, number)

    def check(self, configs: Sequence[RunSpec]) -> None:
        """A metric measured only under arrivals needs them in every config."""
        if self.metric in SERVING and any(c.traffic is None for c in configs):
            raise SearchError(f"{self.metric} is measured only when requests arrive over time (it is 0 or 1 back to "
                              "back); add --rate R (Poisson arrivals) or --users N, or target tok/s or ttft_p99")

    def value_of(self, record: dict[str, Any]) -> float:
        value = record.get(self.metric)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SearchError(f"point {record.get('key', '?')} has no number {self.metric} (got {value!r}); "
                              "remove its file under points/ to simulate it again")
        return float(value)

    def met(self, record: dict[str, Any]) -> bool:
        return "skipped" not in record and _OPS[self.op](self.value_of(record), self.value)

    def better(self, a: float, b: float) -> bool:
        """`a` at least as good as `b`."""
        return a >= b if self.op == ">=" else a <= b

    def tied(self, a: float, b: float) -> bool:
        """Within `TIE` of each other (a relative tolerance)."""
        return abs(a - b) <= TIE * max(abs(a), abs(b))

    def describe(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"


def label(spec: RunSpec) -> str:
    """A config in words: the box, GPUs used, the runtime's stack (what its figure assumed),
    policy, precision, RAM tier."""
    m = spec.machine
    precision = m.precision_label(whole_trace(spec.trace.path, spec.trace.digest).geometry)
    parts = [m.hardware.name, f"{m.devices} GPU{'s' if m.devices > 1 else ''}", f"{m.stack.label} stack", spec.policy.label,
             "trace bytes" if precision == "trace" else precision]
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
    prices: dict[RunSpec, BoxPrice] = field(default_factory=dict)  # each config's box price

    def price(self, config: RunSpec) -> BoxPrice | None:
        return self.prices.get(config)

    def beats(self, a: tuple[RunSpec, dict[str, Any]], b: tuple[RunSpec, dict[str, Any]]) -> bool:
        """`a` costs no more GPUs, memory and money than `b` and its metric is at least as good
        (within `TIE`: a tie), and it is cheaper somewhere or its metric better beyond the tie.
        A price that is unknown compares with no known one (neither beats the other on it)."""
        (ca, ra), (cb, rb) = a, b
        pa, pb = self.price(ca), self.price(cb)
        usd_a, usd_b = (pa.usd if pa else None), (pb.usd if pb else None)
        if (usd_a is None) != (usd_b is None):
            return False
        cost_a = (ca.machine.devices, memory_gb(ra), usd_a or 0.0)
        cost_b = (cb.machine.devices, memory_gb(rb), usd_b or 0.0)
        if not all(x <= y for x, y in zip(cost_a, cost_b)):
            return False
        t = self.target
        ma, mb = t.value_of(ra), t.value_of(rb)
        tied = t.tied(ma, mb)
        if not (tied or t.better(ma, mb)):
            return False
        return cost_a != cost_b or (t.better(ma, mb) and not tied)

    def pareto(self) -> list[tuple[RunSpec, dict[str, Any]]]:
        """Answers no other beats (`beats`) on GPUs, memory, price and the metric at once,
        cheapest box first (an unknown price last)."""
        front = [a for a in self.answers if not any(self.beats(b, a) for b in self.answers if b is not a)]

        def order(a: tuple[RunSpec, dict[str, Any]]) -> tuple[Any, ...]:
            price = self.price(a[0])
            usd = price.usd if price is not None else None
            return (usd is None, usd or 0.0, memory_gb(a[1]), a[0].machine.devices)

        return sorted(front, key=order)


def answer_spec(config: RunSpec, record: dict[str, Any]) -> RunSpec:
    """The run of a config at the cache size a record of it was simulated at."""
    text, _, pool = str(record["capacity_spec"]).partition(" ")
    return replace(config, capacity=CapacitySpec(text, per_layer=not pool))


def in_engine_terms(config: RunSpec, record: dict[str, Any]) -> str:
    """An answer as its engine is told it: `--n-cpu-moe N`, `-ot` layers, KTransformers' GPU experts,
    all on the GPU, or a cache's slots per layer (`casmoe.sim.questions.deploy.terms`)."""
    return engine_terms(answer_spec(config, record))


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


def priced(candidates: Sequence[RunSpec]) -> list[str]:
    """What the search priced, one line per trace and model: the requests scored, the model, the
    precision of each part and the top-k ('synthetic-qwen3-top8.npz: 2 of 150 requests (...), model
    qwen3-30b-a3b, experts at q4_k_m (...), dense part at bf16, top-8 of 128'); the box, the
    stack and the policy are each row's."""

    lines: dict[str, None] = {}
    for c in candidates:
        trace = whole_trace(c.trace.path, c.trace.digest)
        scored = f": {c.trace.scored}" if c.trace.scored else ""
        lines[f"{c.trace.name}{scored}, model {c.machine.preset.name}, {c.machine.priced(trace)}"] = None
    return list(lines)


def slot_range(config: RunSpec) -> tuple[int, int]:
    """The cache sizes a config can have: from top_k slots per layer to the most the GPUs hold
    beside the dense weights (at most every expert)."""
    trace = whole_trace(config.trace.path, config.trace.digest)
    g = trace.geometry
    m = config.machine
    return g.top_k, min(m.max_slots(m.expert_bytes(trace)), g.experts)


def cache_range(config: RunSpec) -> tuple[int, int, bool]:
    """(fewest, most, per_layer): the cache sizes the search bisects for a config. Slots per
    layer from top_k (`slot_range`) on a box that holds top_k per layer; else, as `simulate`'s
    default sizes on such a box (one 24 GB card under Mixtral-8x7B bf16), one pool of whole
    experts for all layers, up to the most the GPUs hold: from none for a placement, which
    computes every expert it does not hold on the host (`loads_on_demand` False), from top_k
    for a cache, which loads a layer's routed experts before computing them."""
    lo, hi = slot_range(config)
    if hi >= lo:
        return lo, hi, True
    trace = whole_trace(config.trace.path, config.trace.digest)
    m = config.machine
    fewest = lo if getattr(config.policy.cls, "loads_on_demand", True) else 0
    return fewest, m.max_pool_slots(m.expert_bytes(trace)), False


def search(
    candidates: Sequence[RunSpec],
    target: Target,
    out: str,
    *,
    jobs: int = 1,
    ray_address: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    prices: Prices | None = None,
    budget: float | None = None,
) -> SearchResult:
    """Bisect each config's cache size; the rounds of all configs run as one batch each. Configs
    that dominate others (`dominates`: a faster link, more host RAM) are searched first: one
    that misses the target at its largest cache settles every config it dominates unprobed, and
    one's answer is the others' lower bound. Each config's box is priced (`prices`, default the
    shipped `casmoe/sim/box/prices.toml`); one whose known price exceeds `budget` (USD) is not searched."""
    target.check(candidates)
    if budget is not None and (isinstance(budget, bool) or not math.isfinite(budget) or budget <= 0):
        raise SearchError(f"--budget must be a finite number of USD > 0, got {budget!r}")
    prices = prices or load_prices()
    priced = {c: prices.box(c.machine.hardware) for c in candidates}
    states, infeasible = [], []
    pools: dict[RunSpec, bool] = {}  # per config: slots per layer (True) or one pool of whole experts
    for c in candidates:
        usd = priced[c].usd
        if budget is not None and usd is not None and usd > budget:
            infeasible.append((c, f"its box costs {priced[c].describe()}, over --budget ${budget:,.0f}"))
            continue
        lo, hi, per_layer = cache_range(c)
        if hi < lo:
            infeasible.append((c, f"the GPUs hold {hi} whole experts beside the dense weights, below top_k={lo}; "
                                  f"{fits_instead(c, lo)}"))
        else:
            states.append(_Bisect(c, lo, hi))
            pools[c] = per_layer
    grid = sum(s.hi - s.lo + 1 for s in states)

    def point(c: RunSpec, slots: int) -> RunSpec:
        return replace(c, capacity=CapacitySpec(str(slots), per_layer=pools[c]))

    betters = {id(s): [b for b in states if dominates(b.config, s.config)] for s in states}
    simulated = probed = 0
    records = []
    with workers(jobs):  # the rounds share one pool of processes
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
            most = f"{s.hi} slots per layer" if pools[s.config] else f"{s.hi} whole experts in one pool"
            infeasible.append((s.config, f"{target.metric} = {s.last[target.metric]:.4g} at {most}, the most that fit"))
    return SearchResult(target, answers, infeasible, simulated, probed, grid, records, priced)


def fits_instead(config: RunSpec, top_k: int) -> str:
    """Steps that make `config` hold top_k experts, per layer (`steps_to_hold`) or else in one
    pool of whole experts, and, for a cache, the placements that need no GPU slot at all."""
    trace = whole_trace(config.trace.path, config.trace.digest)
    steps = steps_to_hold(config.machine, trace, top_k)
    if not steps:
        pools = [f"{flag} holds {held} whole experts" for flag, held in holds(config.machine, trace, pool=True)
                 if held >= top_k]
        steps = "; ".join(pools[:1])
    if getattr(config.policy.cls, "loads_on_demand", True):
        steps += ("; or " if steps else "") + ("a placement that computes the experts it does not hold on the host "
                                               "needs none (--policy n-cpu-moe)")
    return steps or "use GPUs with more memory (--hardware), or a smaller model"


def steps_to_hold(machine: Any, trace: Any, slots: int, smallest: int | None = None) -> str:
    """Options that make `machine` hold `slots` per layer of `trace`'s experts: a smaller
    precision, or more GPUs of the same kind, each with the slots it would hold ('' if none).
    With `smallest`, an option that holds at least that many is named too."""
    needed = slots if smallest is None else smallest
    steps = [f"{flag} holds {held}" for flag, held in holds(machine, trace) if held >= needed]
    enough = [s for s in steps if int(s.rpartition(" ")[2]) >= slots]
    return "; ".join(steps[: steps.index(enough[0]) + 1] if enough else steps)


def holds(machine: Any, trace: Any, pool: bool = False) -> list[tuple[str, int]]:
    """(option, slots per layer it holds) for --quant int8 and int4 (where smaller than now)
    and --gpus 2, 4, 8 (where more than now), in that order; with `pool`, the whole experts one
    pool of all layers holds instead."""
    m = machine
    layers = trace.geometry.layers
    out = []
    for q in ("int8", "int4"):
        cheaper = replace(m, quant=parse_quant(q))
        if cheaper.expert_bytes(trace)[0] < m.expert_bytes(trace)[0]:
            out.append((f"--quant {q}", _held(cheaper, trace, pool)))
    for gpus in (2, 4, 8):
        if gpus > m.hardware.gpus:
            more = replace(m, hardware=variant(m.hardware, gpus=gpus), devices=min(gpus, layers))
            out.append((f"--gpus {gpus}", _held(more, trace, pool)))
    return out


def _held(machine: Any, trace: Any, pool: bool) -> int:
    nbytes = machine.expert_bytes(trace)
    return machine.max_pool_slots(nbytes) if pool else min(machine.max_slots(nbytes), trace.geometry.experts)

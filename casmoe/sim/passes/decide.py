"""The decision pass: one cache's events for a step, in replay's order, kept for the timing pass.

Cache decisions never depend on when loads arrive (casmoe/cache.py), so wherever the steps are
known before they are priced (one request after another, static batches, and each step of the
serving scheduler) the simulator asks the cache first and prices its answers afterwards
(`timing.StepTimer`). The events are replay's (`casmoe.replay`): `begin_request` for the
requests starting at the step, `before_layer` then `route` for every computed layer,
`end_request` for the requests it finishes. Loads are not reported as arrived: in-flight state
only tells a late hit from a hit, and the timing pass reads that from the links.

`Decider` is the one place that calls the cache; the timing pass calls its `begin`, `visit` and
`end` itself, layer by layer, where decisions do depend on time (the substitute miss mode picks
among arrived experts; the driver then names the step being walked, `Decider.walking`). A cache
that decides per step where a miss runs (`ExpertCache.decides_host`) gets each layer's token
counts with `route`, and the prices of `ComputeCosts` (seconds from the compute model and the
link, never a clock) from the assembly. `CompiledDecider` makes the same decisions for a fresh built-in policy
through the compiled twin it declares (`casmoe.compiled`), a chunk of steps per kernel call; the records it
returns carry what the timing pass reads (loads, background loads, host-computed misses, hit
counts) and leave `Access.late` empty (lateness is the links' to say).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, NamedTuple, Sequence

import numpy as np

from casmoe.cache import Access, ExpertCache, Load, LoadReason
from casmoe.compiled import TwinMachine
from casmoe.costs import ExpertCosts
from casmoe.step_arrays import StepArrays
from casmoe.trace import Request, Step
from casmoe.twin import twin_of

if TYPE_CHECKING:
    from casmoe.sim.cost.compute import ComputeModel
    from casmoe.sim.cost.machine import Machine
    from casmoe.trace import Trace

Visit = tuple[Sequence[Load], Access]
"""One computed layer: the loads `before_layer` asked for, and what `route` found."""


class StepDecisions(NamedTuple):
    """One cache's events for one step."""

    begin: list[Load]  # loads of the requests that start with this step
    visits: list[Visit]  # per computed layer, in layer order


class Decider:
    """Drives one cache (a shard: the whole model, or one device's layers)."""

    def __init__(self, cache: ExpertCache, requests: Sequence[Request]) -> None:
        self.cache = cache
        self.requests = requests
        self._before = cache.before_layer if cache.prefetches_per_layer else None
        self._route = cache.route
        self.counted = cache.decides_host
        """Whether `route` gets the step's token counts (the cache decides where misses run)."""
        self.walking: Step | None = None
        """The step the timing pass walks layer by layer (substitute mode), named by the driver."""

    def begin(self, starting: Sequence[int]) -> list[Load]:
        loads: list[Load] = []
        for r in starting:
            loads += self.cache.begin_request(self.requests[r])
        return loads

    def visit(self, step: int, layer: int, experts: list[int]) -> Visit:
        before = self._before
        pre = before(step, layer) if before is not None else ()
        if self.counted and self.walking is not None:
            walking = self.walking
            counts = None if walking.counts is None else walking.counts[layer]
            return pre, self._route(step, layer, experts, None, counts, walking.tokens)
        return pre, self._route(step, layer, experts)

    def end(self, requests: int) -> None:
        for _ in range(requests):
            self.cache.end_request()

    def step(self, step: int, experts: list[list[int]], starting: Sequence[int], ending: int,
             counts: list[list[int]] | None = None, tokens: int = 1) -> StepDecisions:
        """Every event of one step (`experts` per layer; an empty list: layer not computed;
        `counts`, tokens per routed expert, None: one each; `tokens`, the step's)."""
        begin = self.begin(starting) if starting else []
        before, route = self._before, self._route
        visits: list[Visit]
        if self.counted:
            visits = []
            for layer, routed in enumerate(experts):
                if routed:
                    pre = before(step, layer) if before is not None else ()
                    tally = None if counts is None else counts[layer]
                    visits.append((pre, route(step, layer, routed, None, tally, tokens)))
        elif before is None:
            visits = [((), route(step, layer, routed)) for layer, routed in enumerate(experts) if routed]
        else:
            visits = [(before(step, layer), route(step, layer, routed))
                      for layer, routed in enumerate(experts) if routed]
        if ending:
            self.end(ending)
        return StepDecisions(begin, visits)

    def chunk(self, steps: Sequence[Step], first: int, last: int, starts: Mapping[int, Sequence[int]],
              finishing: Mapping[int, Sequence[int]]) -> list[StepDecisions]:
        """The decisions of steps `first..last-1` (this shard's view of them)."""
        return [self.step(s, steps[s].experts, starts.get(s, ()), len(finishing.get(s, ())), steps[s].counts,
                          steps[s].tokens) for s in range(first, last)]


class ComputeCosts(ExpertCosts):
    """A cost-based policy's prices in the simulator (`casmoe.costs`): seconds to copy one expert
    of a layer over the link (its per-copy latency plus bytes over the H2D rate), and the
    compute model's time for one expert on the host (`cpu_expert`, activations both ways) or on
    the GPU (`expert`), for n tokens. Global layer numbers; `shifted` gives a shard's view."""

    def __init__(self, compute: ComputeModel, copy_s: Sequence[float]) -> None:
        self.compute = compute
        self.copy_s = list(copy_s)

    def copy(self, layer: int) -> float:
        return self.copy_s[layer]

    def host(self, layer: int, tokens: int) -> float:
        return self.compute.cpu_expert(layer, tokens)

    def gpu(self, layer: int, tokens: int) -> float:
        return self.compute.expert(layer, tokens)


def link_costs(compute: ComputeModel, machine: Machine, expert_bytes: Sequence[int]) -> ComputeCosts:
    """The prices a run on `machine` gives a cache: a copy of one expert per layer
    (`Machine.copy_seconds`, the price the links charge), and its compute."""
    return ComputeCosts(compute, [machine.copy_seconds(b) for b in expert_bytes])


def machine_costs(machine: Machine, trace: Trace) -> ComputeCosts:
    """The prices the simulator gives a cache of `trace` on `machine`; the backend's, from a
    calibrated profile: `machine_costs(Machine(preset, load_profile("calibrated.toml")), trace)`."""
    nbytes = machine.expert_bytes(trace)
    return link_costs(machine.compute(nbytes), machine, nbytes)


class CompiledDecider:
    """`Decider` for a fresh built-in cache, through its compiled twin (decision mode)."""

    def __init__(self, cache: ExpertCache, requests: Sequence[Request], arrays: StepArrays, chunk_steps: int) -> None:
        L = cache.geometry.layers
        ptr = arrays.visit_ptr
        per_chunk = max((int(ptr[min(c + chunk_steps, arrays.steps) * L] - ptr[c * L]) for c in range(0, arrays.steps, chunk_steps)), default=0)
        budget = twin_of(type(cache)).state(cache).per_visit
        starts_per_chunk = max(np.bincount(arrays.first_step[arrays.first_step >= 0] // chunk_steps).max(initial=0), 0)
        # a demand load (or a host-computed miss) per access, the next-layer budget per visit,
        # every expert per request start
        rows = per_chunk + budget * chunk_steps * L + cache.geometry.total_experts * int(starts_per_chunk)
        self.twin = TwinMachine(cache, arrays, log_rows=max(rows, 1), decide=True)
        self.cache = cache
        self.requests = requests
        self.L = L
        self._hit_only = [((), Access(h, (), (), ())) for h in range(cache.geometry.experts + 1)]  # shared records

    def chunk(self, steps: Sequence[Step], first: int, last: int, starts: Mapping[int, Sequence[int]],
              finishing: Mapping[int, Sequence[int]]) -> list[StepDecisions]:
        return self._records(first, last, *self.decide(first, last, starts, finishing))

    def decide(self, first: int, last: int, starts: Mapping[int, Sequence[int]],
               finishing: Mapping[int, Sequence[int]]) -> tuple[np.ndarray, np.ndarray, dict[int, tuple[int, int]]]:
        """The twin's decisions of steps `first..last-1`, as it keeps them: its log rows (a view,
        overwritten by the next call), each visit's marks into them (`[(last - first) * L, 5]`,
        by visit) and the log rows of each step's request starts."""
        twin, L = self.twin, self.L
        mc, km = twin.mc, twin.km
        mc.reg[km.R_LOG] = 0
        marks = np.zeros(((last - first) * L, 5), np.int64)
        begin_rows: dict[int, tuple[int, int]] = {}
        done = first
        for s in range(first, last):
            if s in starts:
                twin.run(done, s, marks[(done - first) * L :])
                done = s
                a = int(mc.reg[km.R_LOG])
                for r in starts[s]:
                    twin.begin(self.requests[r])
                begin_rows[s] = (a, int(mc.reg[km.R_LOG]))
            if s in finishing:
                twin.run(done, s + 1, marks[(done - first) * L :])
                done = s + 1
                for _ in finishing[s]:
                    twin.end()
        twin.run(done, last, marks[(done - first) * L :])
        twin.sync()
        return mc.log[: mc.reg[km.R_LOG]], marks, begin_rows

    def _records(self, first: int, last: int, rows: np.ndarray, marks: np.ndarray,
                 begin_rows: dict[int, tuple[int, int]]) -> list[StepDecisions]:
        from casmoe.kernels.cache_machine import LOG_CPU, LOG_DEMAND, M_END, M_HITS, M_PRE, M_ROUTE

        log = rows.tolist()
        L = self.L
        ptr = self.twin.arrays.visit_ptr
        computed = ptr[first * L + 1 : last * L + 1] != ptr[first * L : last * L]  # [steps * L]
        marks = marks[computed]  # the computed visits, in order
        per_step = computed.reshape(-1, L).sum(axis=1).tolist()
        hits = marks[:, M_HITS].tolist()
        pre_at, route_at, end_at = (marks[:, c].tolist() for c in (M_PRE, M_ROUTE, M_END))
        hit_only = self._hit_only
        load, access = Load._make, Access._make  # tuple.__new__: no per-field Python call
        DEMAND, PREFETCH = LoadReason.DEMAND, LoadReason.PREFETCH

        def loads(a: int, b: int) -> tuple[Load, ...]:
            return tuple([load((e, slot, victim, DEMAND if what == LOG_DEMAND else PREFETCH)) for what, e, slot, victim in log[a:b]])

        def visit(i: int) -> Visit:
            pre, route, end = pre_at[i], route_at[i], end_at[i]
            if route == end:
                acc = access((hits[i], (), (), (), (), (), ()))
            elif end - route == 1 and log[route][0] == LOG_DEMAND:  # the usual miss: one demand load
                _, e, slot, victim = log[route]
                acc = access((hits[i], (), (e,), (load((e, slot, victim, DEMAND)),), (), (), ()))
            elif log[route][0] == LOG_CPU:  # cpu mode: route's rows are its host-computed misses
                acc = access((hits[i], (), (), (), (), tuple([row[1] for row in log[route:end]]), ()))
            else:  # load mode: its demand loads
                demanded = loads(route, end)
                acc = access((hits[i], (), tuple([ld[0] for ld in demanded]), demanded, (), (), ()))
            return (loads(pre, route) if pre != route else ()), acc

        # a visit that issued nothing shares one record per hit count
        visits = [hit_only[h] if p == e else visit(i) for i, (p, e, h) in enumerate(zip(pre_at, end_at, hits))]
        out = []
        at = 0
        for j, n in enumerate(per_step):
            a, b = begin_rows.get(first + j, (0, 0))
            out.append(StepDecisions(list(loads(a, b)) if a != b else [], visits[at : at + n]))
            at += n
        return out

"""One device's share of an offloaded run: its MoE layers, cache, slot pool and loader, and the
per-layer path that turns the router's choices into cache events, copies and exact compute.

The cache events are the simulator's, in its order: `begin_request`; per step and layer
`before_layer` then `route`; `arrived` when a copy lands; `end_request`. A layer is computed by
an `expert_ops.ExpertPlan` in rounds: each round waits for the routed experts still in flight, computes
every routed expert resident at that point, then starts the loads that had to wait for one of
this layer's own experts to be computed (a prefill routing more experts than the layer has
slots streams through them). A miss in `cpu` mode, a placement's host expert, or a miss a
per-step policy leaves to the host (`ExpertCache.host_misses`) is computed on the host from the
RAM tier or the store, while the device runs the rest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from casmoe.cache import Capacity, ExpertCache, Load, LoadReason
from casmoe.geometry import Geometry

from casmoe.backends.copier import EmulatedLink, Loader, Ticket
from casmoe.backends.expert_ops import ExpertPlan, host_expert
from casmoe.backends.pool import SlotPool


class DeviceRuntime:
    """`layers` (global MoE layer numbers) of the model on `device`, under `cache`."""

    def __init__(self, device: torch.device, layers: range, geometry: Geometry, cache: ExpertCache, store: Any,
                 template: Any, link: EmulatedLink, host: Any = None, requests: list | None = None) -> None:
        self.device = device
        self.layers = layers
        self.geometry = geometry
        self.cache = cache
        self.store = store
        self.template = template  # attributes of the experts module (act_fn, _apply_gate, ...)
        self.host = host  # the RAM tier (HostTier) or None
        self.requests = requests  # known routing per request (oracles, profile policies)
        self.pool = SlotPool(store.layout, cache.capacity.total(geometry), device)
        self.loader = Loader(device, store, link, host)
        self.weights = _layer_weights(self.pool, cache.capacity, geometry.layers)
        self.tickets: dict[int, Ticket] = {}  # expert -> open copy
        self.slot_ticket: dict[int, Ticket] = {}
        self.step = 0
        self.stall = 0.0  # seconds waiting for copies
        self.host_s = 0.0  # seconds computing experts on the host (cpu miss mode)
        self.issues = IssueCost()
        self.passes = PassCost()  # the device's one-token expert passes
        self.decisions = DecideCost()  # the cache's own decisions, per layer visit
        self._decided = (0.0, 0)  # this visit's `before_layer` so far: seconds, loads
        self.direct = device.type == "cpu" and getattr(store, "tensors", None) is not None

    # ---- cache events --------------------------------------------------------------------

    def begin_request(self, request: Any) -> None:
        self.issue_all(self.cache.begin_request(request))

    def before_layer(self, step: int, local: int) -> None:
        self.step = step
        if not self.cache.prefetches_per_layer:
            return  # route() releases the previous layer itself
        self.drain()
        t0 = time.perf_counter()
        pre = self.cache.before_layer(step, local)
        self._decided = (time.perf_counter() - t0, len(pre))
        self.issue_all(pre)

    def end_request(self) -> None:
        self.cache.end_request()

    # ---- the per-layer path --------------------------------------------------------------

    def layer(self, step: int, local: int, plan: ExpertPlan, experts: Sequence[int], scores: np.ndarray | None,
              counts: Sequence[int] | None = None, tokens: int = 1) -> torch.Tensor:
        """Route `experts` (flat ids, in the trace's step order; `counts` tokens each, None: one;
        `tokens` in the step), then compute `plan`: the experts the cache leaves to the host
        (`Access.cpu`: a placement's, or those a per-step policy chose) on the host, the rest here."""
        self.step = step
        cache = self.cache
        self.drain()
        t0 = time.perf_counter()
        if cache.decides_host:
            acc = cache.route(step, local, experts, scores, counts, tokens)
        else:
            acc = cache.route(step, local, experts, scores)
        before_s, before_loads = self._decided
        self.decisions.add(before_s + time.perf_counter() - t0, before_loads + len(acc.loads) + len(acc.background))
        self._decided = (0.0, 0)
        for e in acc.late:  # still-queued prefetches this layer needs go first, as in the simulator
            t = self.tickets.get(e)
            if t is not None:
                self.loader.promote(t)
        routed = set(experts)
        deferred = [ld for ld in acc.loads if ld.victim in routed]
        # background loads are not waited for: the tokens after this one may hit them
        self.issue_all([ld for ld in acc.loads if ld.victim not in routed] + list(acc.background))
        base = local * self.geometry.experts
        use = {x: base + x for x in plan.experts}  # routed expert -> the expert whose slot computes it
        for missed, sub in acc.substitutes:
            use[missed - base] = sub
        for e in acc.cpu:
            self._on_host(plan, e - base, local)
            del use[e - base]
        self._rounds(plan, local, use, deferred)
        return plan.finish()

    def _rounds(self, plan: ExpertPlan, local: int, use: dict[int, int], deferred: list[Load]) -> None:
        weights, first = self.weights[local]
        slot_of = self.pool.slot_of
        one_token = plan.hidden.shape[0] == 1
        while use:
            self.wait([e for e in use.values() if e in self.tickets])
            ready = [x for x, e in use.items() if slot_of(e) is not None and e not in self.tickets]
            if not ready:
                raise RuntimeError(f"layer {local}: experts {sorted(use)} are neither resident nor on their way")
            t0 = time.perf_counter()
            plan.compute(ready, [slot_of(use[x]) - first for x in ready], weights)
            if one_token:
                self.passes.add(len(ready), time.perf_counter() - t0)
            computed = {use.pop(x) for x in ready}
            now = [ld for ld in deferred if ld.victim in computed]
            for ld in now:
                deferred.remove(ld)
            self.issue_all(now)

    def _on_host(self, plan: ExpertPlan, x: int, local: int) -> None:
        """The `cpu` miss mode: expert `x` of this layer computed on the host, from its RAM-tier
        row if the RAM tier holds it, else read from the store."""
        t0 = time.perf_counter()
        layer = self.layers.start + local
        row = self.host.row_of(layer, x) if self.host is not None else None
        rows = None if row is None else self.host.acquire(row, layer, x, self.loader)
        try:
            if rows is None:
                rows = self.store.empty_rows()
                self.loader.read(layer, x, rows)
                row = None
            out = host_expert(self.template, plan.host_inputs(x).to("cpu"), rows)
        finally:
            if row is not None:
                self.host.release(row)
        plan.put(x, out)
        self.host_s += time.perf_counter() - t0

    # ---- copies --------------------------------------------------------------------------

    def issue_all(self, loads: Sequence[Load]) -> None:
        """Issue the loads one cache event asked for, timing the compute thread's part."""
        if not loads:
            return
        t0 = time.perf_counter()
        self.issue(loads[0])
        t1 = time.perf_counter()
        for ld in loads[1:]:
            self.issue(ld)
        self.issues.add(len(loads), t1 - t0, time.perf_counter() - t1)

    def issue(self, ld: Load) -> None:
        """Start the copy a cache `Load` asks for; cancel what it overwrites."""
        old = self.tickets.pop(ld.victim, None) if ld.victim != -1 else None
        if old is not None:
            old.cancelled = True
        prev = self.slot_ticket.get(ld.slot)
        if prev is not None:
            prev.cancelled = True  # a released slot reused before its previous copy ran
        local, x = divmod(ld.expert, self.geometry.experts)
        layer = self.layers.start + local
        self.pool.assign(ld.slot, ld.expert)
        t = Ticket(ld.expert, ld.slot, ld.reason is LoadReason.DEMAND, self.pool.row(ld.slot),
                   self.store.expert_bytes(layer), layer, x)
        if self.host is not None:
            t.ram, t.fill = self.host.plan(self.step, layer, x)
        elif self.direct:  # experts already in this device's memory: copy from them
            t.src = {n: v[x] for n, v in self.store.tensors[layer].items()}
        self.tickets[ld.expert] = t
        self.slot_ticket[ld.slot] = t
        self.loader.submit(t)

    def wait(self, experts: Sequence[int]) -> None:
        """Block until the copies of `experts` land (the stall), then tell the cache."""
        if not experts:
            return
        t0 = time.perf_counter()
        for e in experts:
            t = self.tickets.pop(e, None)
            if t is not None:
                self.loader.wait(t)
                self.cache.arrived(e)
        self.stall += time.perf_counter() - t0

    def drain(self) -> None:
        """Tell the cache about copies that have landed."""
        done = self.loader.done
        for e, t in list(self.tickets.items()):
            if done(t):
                del self.tickets[e]
                self.cache.arrived(e)

    def close(self) -> None:
        self.loader.close()

    # ---- checks --------------------------------------------------------------------------

    def check_residency(self) -> None:
        """Every arrived resident expert's slot holds exactly that expert's weights, and no slot
        or expert is claimed twice (raises AssertionError otherwise). For tests: slow."""
        holder = self.pool.holder
        claimed = [h for h in holder if h != -1]
        assert len(claimed) == len(set(claimed)), f"an expert sits in two slots: {holder}"
        E = self.geometry.experts
        for e in self.cache.resident:
            if self.cache.in_flight(e) or e in self.tickets:
                continue
            s = self.cache.slot(e)
            assert holder[s] == e, f"slot {s} holds {holder[s]}, cache says {e}"
            local, x = divmod(e, E)
            want = self.store.empty_rows()
            self.store.read(self.layers.start + local, x, want)
            for name, t in self.pool.row(s).items():
                assert torch.equal(t.cpu(), want[name]), f"slot {s} does not hold expert {e}'s {name}"


@dataclass
class IssueCost:
    """Compute-thread seconds spent issuing loads, in bursts (the loads of one cache event):
    the first load of a burst also wakes the copy thread, which then competes for the
    interpreter, so it costs more than the others (`calibrate` separates the two)."""

    bursts: int = 0
    loads: int = 0
    first_s: float = 0.0  # the first load of each burst
    rest_s: float = 0.0  # the others

    def add(self, loads: int, first: float, rest: float) -> None:
        self.bursts += 1
        self.loads += loads
        self.first_s += first
        self.rest_s += rest

    @property
    def per_load(self) -> float:
        """A load after the first of its burst (all loads if bursts are single)."""
        more = self.loads - self.bursts
        return self.rest_s / more if more else self.first_s / max(self.bursts, 1)

    @property
    def per_burst(self) -> float:
        """What the first load of a burst costs beyond `per_load`."""
        return max(self.first_s / self.bursts - self.per_load, 0.0) if self.bursts else 0.0


@dataclass
class DecideCost:
    """Compute-thread seconds of the cache's own decisions (`before_layer` and `route`) per
    layer visit, with the loads each visit asked for: what the policy's code costs the thread
    that runs the model, beside the issuing `IssueCost` times (`calibrate.decision_cost` fits
    the simulator's `decide_us` and `decide_load_us` from such visits)."""

    seconds: list[float] = field(default_factory=list)
    loads: list[int] = field(default_factory=list)

    def add(self, seconds: float, loads: int) -> None:
        self.seconds.append(seconds)
        self.loads.append(loads)


@dataclass
class PassCost:
    """Seconds of the device's expert passes for one token: one `ExpertPlan.compute` call (the
    experts function over the experts resident at that point). `calibrate` reads their fixed
    cost from them."""

    passes: int = 0
    experts: int = 0
    seconds: float = 0.0

    def add(self, experts: int, seconds: float) -> None:
        self.passes += 1
        self.experts += experts
        self.seconds += seconds

    @property
    def mean(self) -> float:
        return self.seconds / self.passes if self.passes else 0.0


def _layer_weights(pool: SlotPool, capacity: Capacity, layers: int) -> list[tuple[dict[str, torch.Tensor], int]]:
    """What each layer's plan computes on, and the first slot of it: with per-layer capacity,
    only that layer's slots (the cache numbers them layer * slots ...), so its cost does not grow
    with the device's layer count; with one shared pool, all of it."""
    if not capacity.per_layer:
        return [(pool.tensors, 0)] * layers
    c = capacity.slots
    return [({n: t[i * c : (i + 1) * c] for n, t in pool.tensors.items()}, i * c) for i in range(layers)]

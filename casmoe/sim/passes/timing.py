"""The timing pass: what one step's cache decisions cost on the machine, layer by layer.

A layer starts once the previous one is done (plus an activation hand-over when it changes
device). It issues its `before_layer` prefetches, computes its dense part (attention and the
router: the experts are known only after it), issues the loads routing asks for, and computes
its routed experts (`compute.py`) once every one of them has arrived: a copy in flight keeps
landing while the dense part runs. Issuing takes host time (`load_host_us` per load,
`load_layer_us` per burst) while the copies already run; a copy not waited for where it is
issued (a prefetch) costs the compute `copy_beside_us` too; the policy's own decisions take
`decide_us` per layer and `decide_load_us` per load they ask for, before the loads start. The wait beyond the host's own work
is a stall, charged to `late prefetch` up to the last arrival of an expert already in flight
when the router chose it (a late hit), and to `demand miss` beyond; a layer that waited
resumes `wake_us` after its last copy landed (a blocked host thread) and computes longer by
`resume_per_stall` of the time it waited. Loads go onto the link of their layer's device
(`link.py`); which experts are still in flight is the link's to say, so the same walk prices
decisions made in advance (`decide.py`) or, in the substitute miss mode, made layer by layer as
it goes (its substitutes must have arrived). With a RAM tier, an expert computed on the host that
the tier does not hold is read from storage first (`HostTier.host_ready`): the host's share of
the layer starts that much later, a demand stall on storage.

Within a step no other process acts, so the walk is arithmetic: one step costs no SimPy event.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, NamedTuple, Sequence

from casmoe.cache import Access, CacheStats, ExpertCache, Load, MissMode
from casmoe.geometry import ExpertId
from casmoe.sim.cost.compute import ComputeModel, attention_span
from casmoe.sim.passes.decide import Decider, StepDecisions, Visit
from casmoe.sim.passes.link import Link
from casmoe.sim.passes.tiers import HostTier
from casmoe.sim.passes.timeline import Timeline
from casmoe.sim.passes.timeliness import Timeliness
from casmoe.trace import Request, Step


@dataclass
class Shard:
    """One cache and what the walk needs to run its layers, unpacked once; lists are indexed
    by the shard's local layer."""

    decider: Decider
    first: int  # first global layer
    links: list[Link]  # the link of each layer's device
    device: list[int]
    expert_bytes: list[int]
    expert_time: list[float]  # one routed expert, one token

    @property
    def cache(self) -> ExpertCache:
        return self.decider.cache


class StepWork(NamedTuple):
    """What a step computes besides its experts: new tokens, the dense part of one layer and
    the LM head (both priced by the driver, which knows the requests' context lengths)."""

    tokens: int
    dense: float
    head: float


def histories(requests: Sequence[Request], context: int) -> list[int]:
    """Tokens of earlier context each request continues at served context `context` (0: the
    trace's own lengths): a request of n tokens continues a conversation of `context` - n
    earlier tokens, whose KV cache its attention reads, so its last token attends over exactly
    `context` tokens. The routing replayed stays the trace's own."""
    return [max(0, context - r.tokens) if context else 0 for r in requests]


def work_for(prefill: bool, T: int, requests: Sequence[int], pos: list[int], compute: ComputeModel,
             prompts: Sequence[int] = ()) -> StepWork:
    """Dense and head time of a prefill (all `T` prompt tokens of one request, or of several
    prefilled together: request r's `prompts[r]` of them) or a decode step (one token per
    request), from the requests' context lengths (`pos`, updated; a request's starts at its
    earlier context, `histories`). Prompts prefilled together attend each to its own tokens
    only, and each gives one output token."""
    pairs = kv = 0
    for r in requests:
        n = (T if len(requests) == 1 else prompts[r]) if prefill else 1
        p, k = attention_span(0, n, pos[r]) if prefill else attention_span(pos[r], pos[r] + 1, 0)
        pairs += p
        kv += k
        pos[r] += n
    head = compute.head(len(requests) if prefill else T)
    fixed = compute.step_fixed(T)
    return StepWork(T, compute.dense(T, pairs, kv, len(requests)), head + fixed if fixed else head)


def _ignore(expert: ExpertId) -> None:
    """Arrivals of decisions made in advance: nothing to tell the cache."""


class StepTimer:
    """Prices steps on the links and compute streams of the machine, accumulating the run's
    time accounting (compute, stalls by cause, layer, device and tier, late hits)."""

    def __init__(
        self,
        shards: list[Shard],
        links: list[Link],
        compute: ComputeModel,
        miss_mode: MissMode,
        layers: int,
        experts: int,
        *,
        load_host_s: float = 0.0,
        load_layer_s: float = 0.0,
        wake_s: float = 0.0,
        resume_rate: float = 0.0,
        beside_s: float = 0.0,
        decide_s: float = 0.0,
        decide_load_s: float = 0.0,
        prefetch_early: bool = False,
        timeline: Timeline | None = None,
        timeliness: Timeliness | None = None,
        tier: HostTier | None = None,
        requests: Sequence[Request] = (),
    ) -> None:
        self.shards = shards
        self.links = links
        self.compute = compute
        self.miss_mode = miss_mode
        self.interleaved = miss_mode is MissMode.SUBSTITUTE
        self.E = experts
        self.load_host_s = load_host_s
        self.load_layer_s = load_layer_s
        self.wake_s = wake_s
        self.resume_rate = resume_rate
        self.beside_s = beside_s
        self.decide_s = decide_s  # the policy's decisions per layer visit (beyond the resident step's)
        self.decide_load_s = decide_load_s  # and per load a visit asks for
        self.prefetch_early = prefetch_early  # a layer's prefetches issued once the layer before it has routed
        self.timeline = timeline
        self.timeliness = timeliness
        self.tier = tier  # the RAM tier the links read through, told of request boundaries
        self.requests = requests
        self.compute_s = 0.0
        self.stall_demand = 0.0
        self.stall_late = 0.0
        self.stall_storage = 0.0
        self.stall_by_layer = [0.0] * layers
        self.late = 0
        self.late_by_layer = [0] * layers
        self.device_busy = [0.0] * len(links)
        self.setup_pending = [shard.cache.fills_at_start for shard in shards]
        """Per shard: its first request start's loads are still the start-up fill (`ExpertCache.fills_at_start`)."""
        self.setup_s = 0.0  # how long the links took to load the start-up fill, before the clock started
        self.setup_bytes = 0

    # ---- request boundaries ----------------------------------------------------------------

    def begin(self, t: float, starting: Sequence[int], decisions: Sequence[StepDecisions] | None) -> float:
        """Requests start at `t`: their `begin_request` loads go on the links. Returns when the
        first device can compute (after the host time of issuing them)."""
        if self.tier is not None:
            for r in starting:
                self.tier.begin_request(t, self.requests[r])
        issued = 0
        for i, shard in enumerate(self.shards):
            self._land_all(shard, t)
            loads = decisions[i].begin if decisions is not None else shard.decider.begin(starting)
            if self.setup_pending[i]:
                self.setup_pending[i] = False
                self.setup(i, [ld.expert for ld in loads])
                continue
            if loads:
                self._issue(shard, t, loads)
                issued += len(loads)
        host = self._host_time(issued, issued)  # prefetches: the compute runs beside them
        if not host:
            return t
        self.compute_s += host
        self.device_busy[0] += host
        return t + host

    def setup(self, i: int, experts: Sequence[ExpertId]) -> None:
        """Shard `i`'s start-up fill (`experts`, its local ids): landed before the clock starts,
        each link taking its copies' time one after another; counted apart from the run."""
        shard = self.shards[i]
        per_link: dict[int, float] = {}
        for e in experts:
            layer = e // self.E
            link = shard.links[layer]
            per_link[id(link)] = per_link.get(id(link), 0.0) + link.latency + shard.expert_bytes[layer] / link.rate
            self.setup_bytes += shard.expert_bytes[layer]
            if self.interleaved:  # decided as the walk goes: the cache is told they are in
                shard.cache.arrived(e)
        self.setup_s = max(self.setup_s, *per_link.values(), 0.0)

    def end(self, t: float, requests: int) -> None:
        """`requests` finish at `t` (their `end_request`, when decisions are made as we go)."""
        for shard in self.shards:
            self._land_all(shard, t)
            if self.interleaved:
                shard.decider.end(requests)
        if self.tier is not None:
            for _ in range(requests):
                self.tier.end_request()

    # ---- one step ----------------------------------------------------------------------------

    def step(self, s: int, work: StepWork, steps: Sequence[Step], decisions: Sequence[StepDecisions] | None,
             t: float) -> float:
        """Price step `s` (`steps`: its view per shard) from `t`; returns when it is done.
        `decisions` None: ask the caches layer by layer (substitute mode). The shards' layers
        run in order, each on its device; the LM head ends the step on the last one."""
        on_device = 0
        for i, shard in enumerate(self.shards):
            visits = None if decisions is None else decisions[i].visits
            t, on_device = self._walk(s, work, shard, steps[i], visits, t, on_device)
        head = work.head
        self.compute_s += head
        self.device_busy[on_device] += head
        return t + head

    def _walk(self, s: int, work: StepWork, shard: Shard, sub: Step, visits: list[Visit] | None, t: float,
              on_device: int) -> tuple[float, int]:
        """Run `shard`'s layers of step `s` from `t`, each once its device is free; returns when
        the last is done, and on which device. A layer issues its `before_layer` prefetches, runs
        its dense part (the router needs it), issues the loads routing asks for, and computes its
        experts once they have arrived (`_wait`): a copy in flight overlaps the dense part."""
        compute, timeline, timeliness, device_busy = self.compute, self.timeline, self.timeliness, self.device_busy
        interleaved, counts, multi = visits is None, sub.counts, len(self.links) > 1
        host_cost = self.load_host_s or self.load_layer_s or self.beside_s
        decide_s, decide_load_s = self.decide_s, self.decide_load_s
        resume_rate, expert_pass = self.resume_rate, compute.expert_pass
        T, dense, links, first, exp_time = work.tokens, work.dense, shard.links, shard.first, shard.expert_time
        decide = shard.decider.visit
        landed: Callable[[ExpertId], None] = shard.cache.arrived if interleaved else _ignore
        early = self.prefetch_early and not interleaved
        tier = self.tier
        host_bytes = getattr(compute, "host_expert_bytes", ())  # the host experts' precision, if another
        visit_list = visits or []
        k = -1  # index of the running visit
        busy_total = self.compute_s
        for ll, experts in enumerate(sub.experts):
            if not experts:
                continue
            if multi and shard.device[ll] != on_device:
                on_device = shard.device[ll]
                t += compute.handover(T)
            link = links[ll]
            if link.queue or (link.heap and link.heap[0][0] <= t):
                link.land(t, landed)  # only this layer's experts are observed next
            k += 1
            pre, acc = decide(s, ll, experts) if interleaved else visit_list[k]
            routed = t + dense
            if decide_s or decide_load_s:  # the policy decides on the compute thread before any load
                routed += decide_s + decide_load_s * (len(pre) + len(acc.loads) + len(acc.background))
            if pre and not (early and k):  # an early runtime issued them while the layer before ran
                self._issue(shard, t, pre)
                if host_cost:
                    routed += self._host_time(len(pre), len(pre))
            ready = routed
            if host_cost and (acc.loads or acc.background):
                ready += self._host_time(len(acc.loads) + len(acc.background), len(acc.background))
            nxt = visit_list[k + 1][0] if early and k + 1 < len(visit_list) else ()
            if nxt and host_cost:
                ready += self._host_time(len(nxt), len(nxt))
            start = ready
            if acc.loads or link.tokens or acc.background or (timeliness is not None and timeliness.unused):
                start = self._wait(shard, link, ll, experts, acc, routed, ready, on_device, interleaved)
            if nxt:  # the next layer's prefetches, issued as soon as this layer's router has run
                self._issue(shard, routed, nxt)
            stored = 0.0  # of `run`, the wait for host experts' storage reads
            if counts is None and not acc.cpu:  # one token per routed expert, all on the GPU
                run = expert_pass + len(experts) * exp_time[ll]
            else:
                run = self._experts_time(shard, ll, experts, None if counts is None else counts[ll], acc.cpu)
                if acc.cpu and tier is not None:  # host experts not in RAM are read from storage first
                    wait = tier.host_ready(routed, [first * self.E + e for e in acc.cpu],
                                           host_bytes[first + ll] if host_bytes else shard.expert_bytes[ll]) - start
                    if wait > 0:
                        slower = self._experts_time(shard, ll, experts, None if counts is None else counts[ll],
                                                    acc.cpu, wait)
                        stored = slower - run
                        self._storage_stall(first + ll, on_device, start, stored)
                        run = slower
            if start > ready:
                run += resume_rate * (start - ready)
            busy, end = ready - t + run - stored, start + run  # waiting on the drive is no compute
            busy_total += busy
            device_busy[on_device] += busy
            if timeline is not None:
                self._record(on_device, first + ll, t, ready, start, end)
            t = end
        self.compute_s = busy_total
        return t, on_device

    def _wait(self, shard: Shard, link: Link, ll: int, experts: Sequence[ExpertId], acc: Access, routed: float,
              ready: float, on_device: int, interleaved: bool) -> float:
        """When the layer's experts can start, the router having chosen at `routed` and the host
        being done issuing at `ready`: once its late hits (experts still in flight, promoted to
        demand priority) and its demand loads (issued at `routed`, ahead of queued prefetches;
        the loads of the experts they evict are cancelled) have arrived. The stall is `late
        prefetch` up to the last late hit, `demand miss` beyond; a layer that stalled resumes
        `wake_s` after the last arrival."""
        layer = shard.first + ll
        loads = acc.loads
        if link.tokens:
            for ld in loads:  # a miss whose evicted copy is still tracked is loaded anew, not waited for
                if ld.expert in link.tokens:
                    link.supersede(routed, ld.expert)
        late_until = self._late(link, layer, experts, routed, ready) if link.tokens else ready
        start = late_until
        from_storage = False
        for ld in loads:
            if ld.victim >= 0 and ld.victim in shard.links[ld.victim // self.E].tokens:  # its load in flight
                shard.links[ld.victim // self.E].cancel(routed, ld.victim)
            a = link.demand(routed, ld.expert, shard.expert_bytes[ll])
            if a > start:
                start, from_storage = a, link.last_from_storage
        if interleaved:
            for ld in loads:  # landed by `start`, before the next cache event
                shard.cache.arrived(ld.expert)
        if acc.background:
            self._issue(shard, routed, acc.background)
        timeliness = self.timeliness
        if timeliness is not None and (loads or timeliness.unused):  # before the stall: compute clock
            clock = routed - self.stall_late - self.stall_demand
            timeliness.visit(shard.first, ll, on_device, clock, ready, experts, acc)
        if start > ready:
            if self.wake_s:  # a host thread that blocked wakes up after the last copy landed
                if late_until == start:
                    late_until += self.wake_s
                start += self.wake_s
            self.stall_late += late_until - ready
            self.stall_demand += start - late_until
            self.stall_by_layer[layer] += start - ready
            if from_storage:
                self.stall_storage += start - ready
            if self.timeline is not None:
                self.timeline.stall(on_device, ready, start, layer)
        return start

    def _storage_stall(self, layer: int, device: int, start: float, stall: float) -> None:
        """`stall` seconds the layer's host-computed experts, started at `start`, added by
        waiting for their storage reads: a demand stall on storage, like a GPU load's."""
        self.stall_demand += stall
        self.stall_storage += stall
        self.stall_by_layer[layer] += stall
        if self.timeline is not None:
            self.timeline.stall(device, start, start + stall, layer)

    def _late(self, link: Link, layer: int, experts: Sequence[ExpertId], routed: float, ready: float) -> float:
        """The last arrival of the layer's late hits (experts still in flight when the router
        chose them, promoted to demand priority), at least `ready`; counts them."""
        late_until = ready
        tokens = link.tokens
        late = 0
        for e in experts:
            if e in tokens:
                a = link.need(routed, e)
                if a > routed:  # still on its way when the router chose it
                    late += 1
                    if a > late_until:
                        late_until = a
        if late:
            self.late += late
            self.late_by_layer[layer] += late
        return late_until

    # ---- helpers -------------------------------------------------------------------------------

    def _record(self, device: int, layer: int, t: float, ready: float, start: float, end: float) -> None:
        """A computed layer on the timeline: one span, or two around the stall."""
        timeline = self.timeline
        if start > ready:
            timeline.compute(device, t, ready, layer)  # type: ignore[union-attr]
            timeline.compute(device, start, end, layer)  # type: ignore[union-attr]
        else:
            timeline.compute(device, t, end, layer)  # type: ignore[union-attr]

    def _host_time(self, issued: int, beside: int = 0) -> float:
        """Compute-thread time of issuing `issued` loads at once (one burst: a layer's, or a
        request start's), `beside` of which copy while the compute runs."""
        return self.load_host_s * issued + self.load_layer_s + self.beside_s * beside if issued else 0.0

    def _land_all(self, shard: Shard, t: float) -> None:
        landed = shard.cache.arrived if self.interleaved else _ignore
        for link in dict.fromkeys(shard.links):
            link.land(t, landed)

    def _issue(self, shard: Shard, t: float, loads: Sequence[Load]) -> None:
        """Queue prefetch loads on their layers' links, cancelling the loads of the experts
        they evict."""
        links = shard.links
        nbytes = shard.expert_bytes
        E = self.E
        for ld in loads:
            if ld.victim >= 0 and ld.victim in links[ld.victim // E].tokens:  # its load in flight
                links[ld.victim // E].cancel(t, ld.victim)
            layer = ld.expert // E
            links[layer].prefetch(t, ld.expert, nbytes[layer])
        if self.timeliness is not None:
            self.timeliness.issued(shard.first, loads)

    def _experts_time(self, shard: Shard, ll: int, experts, counts, cpu, host_wait: float = 0.0) -> float:
        """Routed-expert time when tokens per expert vary or some experts run on the host:
        the device's pass (if any expert runs there) and the host's work combine as the
        profile's `cpu_serial` says (the longer of the two beside a GPU, their sum on one thread).
        `host_wait`: the host starts that much later (its experts being read from storage)."""
        layer = shard.first + ll
        compute = self.compute
        expert = compute.expert
        if counts is None:
            counts = [1] * len(experts)
        if not cpu:
            if len(counts) == 1 or counts.count(1) == len(counts):
                return compute.expert_pass + len(counts) * shard.expert_time[ll]
            return compute.expert_pass + sum(expert(layer, c) for c in counts)
        on_host = set(cpu)
        gpu, host = 0.0, host_wait
        on_gpu = False
        cpu_expert = compute.cpu_expert
        for e, c in zip(experts, counts):
            if e in on_host:
                host += cpu_expert(layer, c)
            else:
                gpu += expert(layer, c)
                on_gpu = True
        if on_gpu:
            gpu += compute.expert_pass
        return max(gpu, host) + compute.cpu_serial * min(gpu, host)

    def stats(self, parts: Sequence[CacheStats]) -> CacheStats:
        """The caches' counters with late hits as the links saw them (decisions made in advance
        count every resident use as a hit)."""
        total = CacheStats.total(list(parts))
        used = total.hits + total.late_hits
        return replace(total, hits=used - self.late, late_hits=self.late)

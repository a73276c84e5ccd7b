"""`ExpertCache`: the one interface every cache policy implements, for every runtime.

The cache decides *what* is resident; the runtime (replay, simulator, torch backend) decides
*when* bytes move. The base class owns the mechanics once: slots, in-flight loads, protection
of the running layer's experts, eviction bookkeeping, miss modes and accounting. A policy only
chooses, through a few hooks:

- `prefetch_request(request)` / `prefetch_layer(step, layer)`: experts to load ahead of need;
- `victim(layer, candidates)`: which resident to evict (candidates are set-like);
- `host_misses(layer, misses, routing)`: which of a layer's misses to compute on the host
  instead of loading (the per-step CPU-or-copy choice of Fiddler and HybriMoE), from the tokens
  routed to each and, where the runtime gives one, its cost model (`casmoe.costs`, never a clock);
- `keeps(expert)`: whether an expert keeps its slot once its layer is done (a copy made for one
  layer only is released, as on-demand loading releases every expert);
- `on_access`, `on_insert`, `on_evict`: bookkeeping for the policy's own order.

A policy is one file. Beside the hooks it declares what it is, as class attributes: its
compiled twin (`twin`, `casmoe.twin`), how it is fitted and on what (`fit`,
`casmoe.policies.fitting`), the variants a bare name runs (`variants`: CasMoE's deployable
planner beside its oracle brackets), a line that says what it does (`summary`, `variant_notes`)
and the runtime that runs it (`runtime`, a stack's name). Its family (reactive cache,
prefetcher, host compute, oracle) is read off these hooks and flags (`casmoe.policies.family`). Adding a built-in policy is its module plus its name in
`casmoe/policies/registry.py`.

Runtimes call the events in this order per request: `begin_request`, then per step and layer
`before_layer`, `route`, and `arrived` whenever a load completes; finally `end_request`.
Every event returns the `Load`s to perform. Decisions never depend on *when* loads arrive
(an in-flight expert can be a victim; its load is then cancelled), so every runtime makes the
same decisions as the count-only replay; timing only turns hits into late hits.
"""

from __future__ import annotations

import enum
import functools
import operator
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Collection, Iterator, Mapping, NamedTuple, Sequence

from casmoe.errors import CasmoeError
from casmoe.geometry import ExpertId, Geometry
from casmoe.resources import check_allocation

if TYPE_CHECKING:
    import numpy as np

    from casmoe.costs import ExpertCosts
    from casmoe.policies.fitting import Fit
    from casmoe.trace import Future, Request
    from casmoe.twin import Twin


class MissMode(enum.Enum):
    """What a layer does when a routed expert is not resident."""

    LOAD = "load"  # stall until it arrives: lossless
    SUBSTITUTE = "substitute"  # run the best resident expert of that layer instead: lossy
    CPU = "cpu"  # compute it where it lives (Fiddler-style); counted, never loaded


class LoadReason(enum.Enum):
    DEMAND = "demand"
    PREFETCH = "prefetch"


class Load(NamedTuple):
    """Copy `expert` into `slot`, evicting `victim` (-1 for a free slot)."""

    expert: ExpertId
    slot: int
    victim: ExpertId
    reason: LoadReason


class Access(NamedTuple):
    """What `route` found: counts for hits, the experts still in flight (late hits), misses,
    the demand loads issued for them (the layer waits for these), (missed, used-instead) pairs
    in substitute mode, experts computed on the host (cpu mode's misses, a placement's host
    experts, the misses `host_misses` chose), and `background` loads the
    layer does not wait for (a substituted expert is fetched for the tokens after this one)."""

    hits: int
    late: tuple[ExpertId, ...]
    misses: tuple[ExpertId, ...]
    loads: tuple[Load, ...]
    substitutes: tuple[tuple[ExpertId, ExpertId], ...] = ()
    cpu: tuple[ExpertId, ...] = ()
    background: tuple[Load, ...] = ()


class Routing(NamedTuple):
    """The running layer's routing as `route` got it, for `host_misses`: the routed experts (in
    routing order), how many of the step's tokens route to each, and the step's tokens through
    the layer (a decode token: 1 each, 1 token)."""

    experts: Sequence[ExpertId]
    counts: Sequence[int]
    tokens: int

    def count(self, expert: ExpertId) -> int:
        """Tokens routed to `expert` (0 if it is not routed)."""
        for e, c in zip(self.experts, self.counts):
            if e == expert:
                return c
        return 0


class CacheConfigError(CasmoeError, ValueError):
    """A cache that cannot work at all (capacity below the routed experts, ...)."""


class PolicyError(CasmoeError, RuntimeError):
    """A policy broke the contract (evicted a protected or absent expert, ...)."""


@dataclass(frozen=True)
class Capacity:
    """Slots per MoE layer (`per_layer`) or one pool shared by all layers."""

    slots: int
    per_layer: bool = True

    def __post_init__(self) -> None:
        try:
            slots = operator.index(self.slots)  # ints and numpy ints; not 4.7, "4" or True
        except TypeError:
            slots = None
        if slots is None or isinstance(self.slots, bool):
            raise CacheConfigError(f"capacity must be a whole number of slots, got {self.slots!r}")
        object.__setattr__(self, "slots", slots)

    def total(self, geometry: Geometry) -> int:
        return self.slots * geometry.layers if self.per_layer else self.slots

    def clamped(self, geometry: Geometry) -> Capacity:
        """No more slots than experts to hold (a pool that holds them all gains nothing from
        more), so a what-if of `--capacity 1000000000000` costs no memory."""
        most = geometry.experts if self.per_layer else geometry.total_experts
        return self if self.slots <= most else Capacity(most, self.per_layer)

    def describe(self) -> str:
        return f"{self.slots}/layer" if self.per_layer else f"{self.slots} global"


@dataclass(frozen=True)
class CacheStats:
    """Counters of one run. `hit_rate` = (hits + late hits) / routed accesses.

    `cold_misses` are the misses that filled a slot never filled before (nothing evicted: the
    cache was not yet full); the moe-lrc convention counts those as hits (`warm_hit_rate`), so
    SCH curves compare with it. A slot freed and filled again (a staging slot's refill, an
    on-demand release) is a warm cache's miss, not a cold one.
    """

    accesses: int
    hits: int
    late_hits: int
    misses: int
    cold_misses: int
    substitutions: int
    cpu_computed: int
    demand_loads: int
    prefetch_loads: int
    prefetch_used: int
    prefetch_wasted: int
    evictions: int
    bytes_loaded: int

    @classmethod
    def total(cls, parts: Sequence[CacheStats]) -> CacheStats:
        """Counters summed over caches (one per device)."""
        if len(parts) == 1:
            return parts[0]
        return cls(**{f: sum(getattr(p, f) for p in parts) for f in cls.__dataclass_fields__})

    @property
    def loads(self) -> int:
        return self.demand_loads + self.prefetch_loads

    @property
    def hit_rate(self) -> float:
        return (self.hits + self.late_hits) / self.accesses if self.accesses else 0.0

    @property
    def warm_hit_rate(self) -> float:
        """Hit rate when filling an empty slot is free (a cache that starts warm)."""
        return (self.hits + self.late_hits + self.cold_misses) / self.accesses if self.accesses else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["loads"] = self.loads
        d["hit_rate"] = self.hit_rate
        d["warm_hit_rate"] = self.warm_hit_rate
        return d


@dataclass(frozen=True)
class RequestStart:
    """What a policy that does not read the future may know when a request starts."""

    prompt: str | None
    task: str | None
    prefill: int


class _Candidates:
    """Set-like view of the evictable experts of one pool: resident and not protected."""

    __slots__ = ("_members", "_protected")

    def __init__(self, members: set[ExpertId], protected: dict[ExpertId, None]) -> None:
        self._members = members
        self._protected = protected

    def __contains__(self, expert: object) -> bool:
        return expert in self._members and expert not in self._protected

    def __iter__(self) -> Iterator[ExpertId]:
        protected = self._protected
        return (e for e in self._members if e not in protected)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __bool__(self) -> bool:
        return any(True for _ in self)


class ExpertCache:
    """Base of every policy; see the module docstring for the event protocol."""

    name: ClassVar[str] = ""
    needs_future: ClassVar[bool] = False
    keeps_experts: ClassVar[bool] = True
    """False: a layer's experts are released when the next layer starts (on-demand loading)."""
    loads_on_demand: ClassVar[bool] = True
    """False: the policy never loads a routed expert on demand (a placement computes misses on
    the host), so it may have fewer slots than top_k, even none. With True and fewer slots than
    top_k (Mixtral-Offloading's `offload_per_layer=7`: one resident expert per layer), a layer's
    other routed experts are loaded into staging slots and evicted (by the policy's `victim`)
    once the layer is done: at most `capacity` experts stay."""
    fills_at_start: ClassVar[bool] = False
    """True: the loads of the first request's start are the set a server loads once, before it
    takes any request (a placement's GPU experts: llama.cpp and KTransformers load them at
    start-up); runtimes land them before the clock starts and count them apart (`setup_s`),
    never as a wait of that request. The decisions are the same either way."""
    twin: ClassVar[Twin | None] = None
    """The compiled twin this very class declares (`casmoe.twin`); subclasses run in Python."""
    fit: ClassVar[Fit | None] = None
    """How the policy is fitted, and on which requests (`casmoe.policies.fitting`); None: nothing."""
    variants: ClassVar[tuple[Mapping[str, Any], ...]] = ({},)
    """The options a bare name runs with, one run each (CasMoE: its planner and its oracle brackets)."""
    summary: ClassVar[str] = ""
    """What the policy does and whose method it is, in one line for a newcomer: the legend under
    `simulate`'s table names every policy shown with it."""
    variant_notes: ClassVar[Mapping[str, str]] = {}
    """One line per option (`key=value`, or `key` for any value) that changes what a variant is
    (`casmoe[predictor=exact]`: an oracle bracket), said in the legend instead of `summary`."""
    runtime: ClassVar[str | None] = None
    """The shipped stack (`casmoe/sim/cost/stacks/NAME.toml`) of the runtime that runs this
    policy, or None where none is shipped: the headline prices its figure there beside the
    ideal stack's upper bound."""
    host_experts: frozenset[ExpertId] = frozenset()
    """Experts a placement keeps on the host for good (`casmoe.policies.placement`): a miss on
    one is computed there, whatever the miss mode, as the cpu miss mode computes every miss
    (counted in `cpu_computed`, reported in `Access.cpu`), unless the policy's `host_misses`
    chooses to copy it for the step (a GPU-prefill threshold)."""

    def __init__(
        self,
        geometry: Geometry,
        capacity: int | Capacity,
        *,
        miss_mode: MissMode = MissMode.LOAD,
        expert_bytes: Sequence[int] | None = None,
    ) -> None:
        cap = capacity if isinstance(capacity, Capacity) else Capacity(capacity)
        cap = cap.clamped(geometry)
        if cap.slots < 0:
            raise CacheConfigError(f"capacity must be >= 0 slots, got {cap.slots}")
        physical = cap.slots
        if self.loads_on_demand and cap.slots < geometry.top_k:
            physical = geometry.top_k  # the rest of a layer's routed experts pass through staging slots
        self._keep = cap.slots if physical > cap.slots else -1
        """Slots per pool that keep experts between layers when fewer than top_k (-1: all)."""
        self._over: set[int] = set()  # pools holding more than `_keep` experts
        if geometry.total_experts > 1_000_000:  # per-expert tables below: a typo'd geometry fails here
            check_allocation(geometry.total_experts * 200, f"a cache over {geometry.describe()}")
        self.geometry = geometry
        self.capacity = cap
        self.miss_mode = miss_mode
        self._E = geometry.experts
        self._layer_bytes = list(expert_bytes) if expert_bytes is not None else geometry.bytes_per_layer()
        pools = geometry.layers if cap.per_layer else 1
        self.pools = pools
        self.pool_of: list[int] = [
            (e // geometry.experts if cap.per_layer else 0) for e in range(geometry.total_experts)
        ]
        """Pool (slot group) of every flat expert id: its layer, or 0 for a global pool."""
        self._pool_members: list[set[ExpertId]] = [set() for _ in range(pools)]
        self._free: list[list[int]] = [
            list(range((p + 1) * physical - 1, p * physical - 1, -1)) for p in range(pools)
        ]
        self._high = [0] * pools  # the most residents each pool has held: its slots ever filled
        self._slot_of: dict[ExpertId, int] = {}
        self._by_layer: list[set[ExpertId]] = [set() for _ in range(geometry.layers)]
        self._inflight: set[ExpertId] = set()
        self._protected: dict[ExpertId, None] = {}
        self._unused_prefetch: set[ExpertId] = set()
        self._future: Future | None = None
        self.prefetches_per_layer = type(self).prefetch_layer is not ExpertCache.prefetch_layer
        """False: `before_layer` would only return [] and runtimes may skip calling it."""
        self.decides_host = type(self).host_misses is not ExpertCache.host_misses
        """True: `host_misses` decides per step, and runtimes pass `route` the step's token counts."""
        self._releasing = not self.keeps_experts or type(self).keeps is not ExpertCache.keeps
        self._costs: ExpertCosts | None = None
        self._step = 0
        self._layer = 0
        self._n = dict.fromkeys(CacheStats.__dataclass_fields__, 0)
        self._wasted = [0] * geometry.layers

    def take_stats(self, stats: CacheStats, wasted_by_layer: Sequence[int]) -> None:
        """The counters of a run made by this cache's compiled twin become its `stats()` and
        `wasted_by_layer()`; its residency and policy order are not mirrored back (the cache is
        good for its counts only)."""
        self._n.update(asdict(stats))
        self._wasted = list(wasted_by_layer)

    def wasted_by_layer(self) -> list[int]:
        """`stats().prefetch_wasted` by layer: the prefetched experts of each layer that left
        the cache unused (a policy's eviction or a pool giving staging slots back). The one count
        of a wasted prefetch; the simulator's per-layer report reads it here."""
        return list(self._wasted)

    @property
    def fresh(self) -> bool:
        """Nothing loaded or routed yet: the state a compiled twin starts from."""
        return not self._slot_of and self._n["accesses"] == 0

    @property
    def layer_bytes(self) -> list[int]:
        """Bytes one expert of each layer moves when it loads."""
        return self._layer_bytes

    @classmethod
    def reads_future(cls, options: dict[str, Any]) -> bool:
        """Whether this policy with these options is an oracle (reads the trace's future):
        a bound to compare with, not something a server can run."""
        return cls.needs_future

    def __init_subclass__(cls, **kw: Any) -> None:
        """A policy's own `create` refuses, in one line, an option that collides with what it
        fills itself (`n-cpu-moe[gpu=3]`: the GPU set is the policy's), as the base's does."""
        super().__init_subclass__(**kw)
        own = cls.__dict__.get("create")
        if isinstance(own, classmethod):
            cls.create = classmethod(_refusing_collisions(own.__func__))  # type: ignore[method-assign]

    @classmethod
    def create(
        cls,
        geometry: Geometry,
        capacity: int | Capacity,
        *,
        miss_mode: MissMode = MissMode.LOAD,
        expert_bytes: Sequence[int] | None = None,
        trace: Any = None,
        **options: Any,
    ) -> ExpertCache:
        """Build from what a runtime knows (its `trace`, CLI `options`); policies that need
        more than the constructor's arguments (a profile, a predictor) override this."""
        try:
            return cls(geometry, capacity, miss_mode=miss_mode, expert_bytes=expert_bytes, **options)
        except TypeError as exc:
            raise _collision(cls, exc, options) from None

    # ---- policy hooks (override these) ----------------------------------------------------

    def prefetch_request(self, request: Request | RequestStart) -> Sequence[ExpertId]:
        """Experts to load when a request starts, most wanted first."""
        return ()

    def prefetch_layer(self, step: int, layer: int) -> Sequence[ExpertId]:
        """Experts to load as `layer` of `step` is about to run (overlapping its compute)."""
        return ()

    def victim(self, layer: int, candidates: _Candidates) -> ExpertId:
        """Which of `candidates` (unprotected residents of the pool that needs a slot) to evict."""
        raise NotImplementedError(f"{type(self).__name__} must choose a victim")

    def can_evict(self, pool: int) -> bool:
        """Whether `victim` has a candidate in `pool` now: asked before a fetch nothing waits for
        (a prefetch, a substituted miss's background copy), which is dropped rather than made to
        evict what the policy never gives up. Any unprotected resident, unless the policy keeps
        some for good (a placement's GPU set)."""
        return not self._all_protected(pool)

    def on_access(self, expert: ExpertId) -> None:
        """A routed use of a resident expert (hit, late hit, or just loaded on demand)."""

    def on_insert(self, expert: ExpertId) -> None:
        """`expert` got a slot (demand or prefetch load issued)."""

    def on_evict(self, expert: ExpertId) -> None:
        """`expert` lost its slot."""

    def on_request_end(self) -> None:
        """The current request finished."""

    @classmethod
    def held_on_gpus(cls, geometry: Geometry, capacity: Capacity) -> int:
        """Experts a run of this policy keeps on the GPUs for good, with no copy of them left
        in use on the host: none for a cache (it copies from the host, which keeps every
        expert); a placement's whole budget (`casmoe.policies.placement`). The host RAM a run
        needs is every expert less these (`casmoe.sim.run.fits.HostDemand`)."""
        return 0

    @classmethod
    def computes_on_host(cls, miss_mode: MissMode) -> bool:
        """Whether a run of this policy may compute experts on the host: the cpu miss mode, a
        placement (its misses run there), or a policy that chooses per step which experts do
        (`host_misses`)."""
        return miss_mode is MissMode.CPU or not cls.loads_on_demand or cls.host_misses is not ExpertCache.host_misses

    def host_misses(self, layer: int, misses: Sequence[ExpertId], routing: Routing) -> Collection[ExpertId]:
        """Which of `layer`'s `misses` (routed, not resident, in routing order) to compute on the
        host this step; every other one loads (or, in substitute mode, is substituted). Called
        once per layer with misses, before any of them is served; `routing` says how many of the
        step's tokens route to each expert. The default is the miss mode's answer: every miss
        in `cpu` mode, else a placement's host experts. A policy that overrides it decides in
        every miss mode; it may read `self.costs` (the runtime's prices, or None), never a clock."""
        if self.miss_mode is MissMode.CPU:
            return misses
        host = self.host_experts
        return [e for e in misses if e in host] if host else ()

    def keeps(self, expert: ExpertId) -> bool:
        """Whether `expert` keeps its slot once the layer that used it is done; False releases it
        when the next layer starts (on-demand loading: every expert; a placement: the host experts
        it copied for one step)."""
        return self.keeps_experts

    # ---- costs ---------------------------------------------------------------------------

    def attach_costs(self, costs: ExpertCosts) -> None:
        """The runtime's prices of copying an expert and of computing it on the host or the GPU
        (`casmoe.costs`): the simulator's from its compute model, the backend's from a
        calibrated profile. Runtimes call this before the first event; replay has none."""
        self._costs = costs

    @property
    def costs(self) -> ExpertCosts | None:
        """The prices the runtime attached, or None (replay: a policy then uses its published ones)."""
        return self._costs

    # ---- oracle support ------------------------------------------------------------------

    def attach_future(self, future: Future) -> None:
        """Runtimes call this before the first event, only for `needs_future` policies."""
        if not self.needs_future:
            raise PolicyError(f"{type(self).__name__} did not declare needs_future")
        self._future = future

    @property
    def future(self) -> Future:
        if self._future is None:
            raise PolicyError(
                f"{type(self).__name__} reads the future without declaring needs_future = True"
                if not self.needs_future
                else f"{type(self).__name__} needs the future: the runtime must call attach_future()"
            )
        return self._future

    @property
    def visit(self) -> int:
        """Index of the running (step, layer) in the runtime's order: step * L + layer."""
        return self._step * self.geometry.layers + self._layer

    # ---- runtime events ------------------------------------------------------------------

    def begin_request(self, request: Request) -> list[Load]:
        return self._prefetch(self._expert_ids(self.prefetch_request(self.request_view(request)), "prefetch_request"))

    def request_view(self, request: Request) -> Request | RequestStart:
        """What `prefetch_request` sees: oracles the whole request, other policies its prompt."""
        return request if self.needs_future else RequestStart(request.prompt, request.task, request.prefill)

    def before_layer(self, step: int, layer: int) -> list[Load]:
        self._release()
        self._step = step
        self._layer = layer
        return self._prefetch(self._expert_ids(self.prefetch_layer(step, layer), "prefetch_layer"))

    def route(self, step: int, layer: int, experts: Sequence[ExpertId], scores: np.ndarray | None = None,
              counts: Sequence[int] | None = None, tokens: int | None = None) -> Access:
        """Account `layer`'s routed experts and return the demand loads its misses need.

        Two phases, so that a miss can never evict an expert this same layer is about to use:
        first every routed resident is counted (hit, or late hit if still in flight) and
        protected, then the misses are served in order. Everything routed stays protected
        until the next `before_layer`. `scores` ([E] router scores of this layer) choose the
        substitute in substitute mode. `counts[i]`, the step's tokens routed to `experts[i]`
        (None: one each), and `tokens`, the step's tokens through the layer (None: one, or the
        counts over top_k), are what `host_misses` reads; runtimes pass them to a cache that
        `decides_host`.
        """
        protected = self._protected
        if protected:  # the previous layer is done (runtimes may skip before_layer)
            if self._releasing:
                self._release()
            else:
                protected.clear()
                if self._over:
                    self._trim()
        self._step = step
        self._layer = layer
        slot_of = self._slot_of
        inflight = self._inflight
        unused = self._unused_prefetch
        on_access = self.on_access
        n = self._n
        hits = 0
        late: list[ExpertId] = []
        absent: list[ExpertId] = []
        tail: list[ExpertId] = []  # from the first miss on: phase 2 reports uses in routing order
        for e in experts:
            if e in slot_of:
                if e in inflight:
                    late.append(e)
                else:
                    hits += 1
                if e in unused:
                    unused.discard(e)
                    n["prefetch_used"] += 1
                protected[e] = None
                if absent:
                    tail.append(e)
                else:
                    on_access(e)
            else:
                absent.append(e)
                tail.append(e)
        n["accesses"] += len(experts)
        n["hits"] += hits
        if late:
            n["late_hits"] += len(late)
        if not absent:
            return Access(hits, tuple(late), (), ())
        if self.decides_host:
            if counts is None:
                routing = Routing(experts, (1,) * len(experts), 1 if tokens is None else tokens)
            else:  # without `tokens`: the token-expert pairs over top_k (exact unless a gate dropped some)
                routing = Routing(experts, counts, -(-sum(counts) // self.geometry.top_k) if tokens is None else tokens)
            return self._serve_misses(layer, scores, hits, tuple(late), absent, tail, routing)
        return self._serve_misses(layer, scores, hits, tuple(late), absent, tail)

    def _serve_misses(
        self, layer: int, scores: np.ndarray | None, hits: int, late: tuple[ExpertId, ...], absent: list[ExpertId],
        tail: list[ExpertId], routing: Routing | None = None,
    ) -> Access:
        """Phase 2 of `route`, for a layer with misses: in routing order from the first miss,
        load each miss (or substitute it, or leave it to the CPU) and report each use. With
        `routing` (a cache that `decides_host`), `host_misses` says which misses run on the host."""
        n, slot_of, protected, on_access = self._n, self._slot_of, self._protected, self.on_access
        n["misses"] += len(absent)
        if routing is not None:
            host: Collection[ExpertId] = self.host_misses(layer, absent, routing)
            if host and not isinstance(host, (set, frozenset)):
                host = set(host)
        elif self.miss_mode is MissMode.CPU:
            n["cpu_computed"] += len(absent)
            for e in tail:
                if e in slot_of:
                    on_access(e)
            return Access(hits, late, (), (), (), tuple(absent))
        else:
            host = self.host_experts
        misses: list[ExpertId] = []
        loads: list[Load] = []
        subs: list[tuple[ExpertId, ExpertId]] = []
        background: list[Load] = []
        on_host: list[ExpertId] = []
        missing = set(absent)
        for e in tail:
            if e not in missing:
                if e in slot_of:  # a long prefill may have streamed it out already
                    on_access(e)
                continue
            if e in host:
                on_host.append(e)
                continue
            if self.miss_mode is MissMode.SUBSTITUTE:
                sub = self._substitute(layer, scores)
                if sub is not None:
                    subs.append((e, sub))
                    protected[sub] = None
                    on_access(sub)
                    background += self._prefetch((e,))  # else the resident set would freeze
                    continue
            misses.append(e)
            loads.append(self._admit(e, LoadReason.DEMAND))
            protected[e] = None
            on_access(e)
        n["substitutions"] += len(subs)
        n["cpu_computed"] += len(on_host)
        return Access(hits, late, tuple(misses), tuple(loads), tuple(subs), tuple(on_host), tuple(background))

    def arrived(self, expert: ExpertId) -> None:
        """A load finished; a cancelled load's arrival is ignored."""
        self._inflight.discard(expert)

    def end_request(self) -> None:
        self._release()
        self.on_request_end()

    # ---- queries -------------------------------------------------------------------------

    def is_resident(self, expert: ExpertId) -> bool:
        """Resident or in flight."""
        return expert in self._slot_of

    def in_flight(self, expert: ExpertId) -> bool:
        return expert in self._inflight

    def slot(self, expert: ExpertId) -> int | None:
        return self._slot_of.get(expert)

    @property
    def resident(self) -> frozenset[ExpertId]:
        return frozenset(self._slot_of)

    @property
    def protected(self) -> frozenset[ExpertId]:
        return frozenset(self._protected)

    def stats(self) -> CacheStats:
        return CacheStats(**self._n)

    @property
    def has_run(self) -> bool:
        """Whether any runtime event has reached this cache (a fresh one is empty and counts 0)."""
        return bool(self._slot_of) or any(self._n.values())

    # ---- mechanics -----------------------------------------------------------------------

    def _expert_ids(self, experts: Any, hook: str) -> Sequence[ExpertId]:
        """A prefetch hook's answer, checked once per call (not per access): flat expert ids,
        ints in [0, L x E). numpy integers are converted; anything else is the policy's bug."""
        if type(experts) is not list and type(experts) is not tuple:
            if hasattr(experts, "tolist"):  # a numpy array
                experts = experts.tolist()
            else:
                try:
                    experts = list(experts)
                except TypeError:
                    raise PolicyError(
                        f"{type(self).__name__}.{hook} must return a list of expert ids, not {type(experts).__name__}"
                    ) from None
        if not experts:
            return experts
        kinds = set(map(type, experts))
        if kinds != {int}:
            if not all(isinstance(e, int) or hasattr(e, "__index__") for e in experts) or bool in kinds:
                bad = next(e for e in experts if type(e) is not int)
                raise PolicyError(f"{type(self).__name__}.{hook} returned {bad!r}; expert ids are ints (layer * E + expert)")
            experts = [int(e) for e in experts]
        if min(experts) < 0 or max(experts) >= len(self.pool_of):
            bad = next(e for e in experts if not 0 <= e < len(self.pool_of))
            raise PolicyError(
                f"{type(self).__name__}.{hook} returned expert id {bad}, outside [0, {len(self.pool_of)}) "
                f"({self.geometry.layers} layers x {self.geometry.experts} experts)"
            )
        return experts

    def _pool(self, layer: int) -> int:
        return layer if self.capacity.per_layer else 0

    def _release(self) -> None:
        """The running layer is done: its experts lose protection (and their slots, those the
        policy does not keep)."""
        if self._releasing:
            keeps = self.keeps
            for e in self._protected:
                if e in self._slot_of and not keeps(e):
                    pool = self._pool(e // self._E)
                    self._free[pool].append(self._evict(e, pool, force=True))
        self._protected.clear()
        if self._over:
            self._trim()

    def _trim(self) -> None:
        """Pools holding more than the capacity (staging slots used by a layer) give the
        surplus back, the policy choosing what leaves."""
        for pool in sorted(self._over):
            members = self._pool_members[pool]
            while len(members) > self._keep:
                victim = self.victim(pool if self.capacity.per_layer else self._layer, _Candidates(members, self._protected))
                self._free[pool].append(self._evict(victim, pool))
        self._over.clear()

    @property
    def transient(self) -> bool:
        """Whether the cache has fewer slots than top_k and passes the rest through staging."""
        return self._keep >= 0

    def _prefetch(self, experts: Sequence[ExpertId]) -> list[Load]:
        loads = []
        for e in experts:
            if e in self._slot_of:
                continue
            layer = e // self._E
            pool = self._pool(layer)
            if not self._free[pool] and not self.can_evict(pool):
                continue  # every slot holds an expert the running layer uses, or one kept for good
            loads.append(self._admit(e, LoadReason.PREFETCH))
        return loads

    def _all_protected(self, pool: int) -> bool:
        members, protected = self._pool_members[pool], self._protected
        return len(protected) >= len(members) and all(e in protected for e in members)

    def _admit(self, expert: ExpertId, reason: LoadReason) -> Load:
        layer = expert // self._E
        pool = self.pool_of[expert]
        free = self._free[pool]
        if free:
            slot, victim = free.pop(), -1
            if len(self._pool_members[pool]) == self._high[pool]:  # a slot never filled (freed ones are taken first)
                self._high[pool] += 1
                if reason is LoadReason.DEMAND:
                    self._n["cold_misses"] += 1
        else:
            members = self._pool_members[pool]
            candidates = _Candidates(members, self._protected)
            if len(self._protected) >= len(members) and self._all_protected(pool):
                # More routed experts than slots (a long prefill): the earliest-routed ones of
                # this pool have been computed already, so their protection lapses (streaming).
                oldest = next(e for e in self._protected if e in self._pool_members[pool])
                del self._protected[oldest]
            victim = self.victim(layer, candidates)
            slot = self._evict(victim, pool)
        self._slot_of[expert] = slot
        self._pool_members[pool].add(expert)
        if self._keep >= 0 and len(self._pool_members[pool]) > self._keep:
            self._over.add(pool)
        self._by_layer[layer].add(expert)
        self._inflight.add(expert)
        n = self._n
        if reason is LoadReason.DEMAND:
            n["demand_loads"] += 1
        else:
            n["prefetch_loads"] += 1
            self._unused_prefetch.add(expert)
        n["bytes_loaded"] += self._layer_bytes[layer]
        self.on_insert(expert)
        return Load(expert, slot, victim, reason)

    def _evict(self, victim: ExpertId, pool: int, force: bool = False) -> int:
        """Drop `victim`, returning its slot; `force` skips the contract check (a release)."""
        if not force and (victim not in self._pool_members[pool] or victim in self._protected):
            raise PolicyError(
                f"{type(self).__name__}.victim returned {victim}, which is "
                + ("protected (used by the running layer)" if victim in self._protected else "not an evictable resident")
            )
        slot = self._slot_of.pop(victim)
        self._pool_members[pool].discard(victim)
        self._by_layer[victim // self._E].discard(victim)
        self._inflight.discard(victim)
        if victim in self._unused_prefetch:
            self._unused_prefetch.discard(victim)
            self._n["prefetch_wasted"] += 1
            self._wasted[victim // self._E] += 1
        self._n["evictions"] += 1
        self.on_evict(victim)
        return slot

    def _substitute(self, layer: int, scores: np.ndarray | None) -> ExpertId | None:
        """Best arrived resident of `layer` by router score (lowest id without scores)."""
        ready = [e for e in self._by_layer[layer] if e not in self._inflight]
        if not ready:
            return None
        if scores is None:
            return min(ready)
        base = layer * self._E
        return max(ready, key=lambda e: (scores[e - base], -e))


def _collision(cls: type, exc: TypeError, options: Mapping[str, Any]) -> Exception:
    """`exc` as a one-line refusal when it says that an option of the user's collided with an
    argument the policy fills itself, or reached no constructor; else `exc` itself."""
    m = re.search(r"(?:multiple values for|unexpected) keyword argument '(\w+)'", str(exc))
    if m is None or m.group(1) not in options:
        return exc
    return CacheConfigError(f"policy {cls.name or cls.__name__} has no option {m.group(1)!r} (the policy sets it "
                            "itself, or takes no such argument)")


def _refusing_collisions(create: Any) -> Any:
    @functools.wraps(create)
    def checked(cls: type, geometry: Geometry, capacity: Any, **kw: Any) -> ExpertCache:
        try:
            return create(cls, geometry, capacity, **kw)
        except TypeError as exc:
            raise _collision(cls, exc, kw) from None

    return checked

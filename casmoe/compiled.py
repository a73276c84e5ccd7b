"""Replay through the compiled twin a policy declares (`casmoe/kernels/cache_machine.py`).

A class that declares `twin` has one (see `casmoe.twin`); a subclass that does not
declare its own (a user's `HotNextLayer(LRU)`), or any other policy, runs the Python path,
unchanged. This module names no policy: it reads the declaration, and hands the kernels the
policy's victim order (`Twin.order`, with its `touched` hook, as `cache_machine.Order`) and the
state it reads (`Twin.state`). The per-access work (route, admit, evict, the policy's bookkeeping
and victim) runs compiled;
the per-request hooks stay the policy's own Python methods, called between kernel calls:
`prefetch_request` (a planner's prediction), with the table of per-visit guesses the policy
reads itself (`Twin.request_guesses`, copied into the kernel's buffers), and `on_request_end`
(its online update), which reads the array of its own it handed the kernel to fill
(`TwinState.served`).

After a compiled replay the cache object's counters (`stats()`) are the run's; its residency
and policy order are not mirrored back, so a compiled replay needs a fresh cache and leaves
it good for `stats()` only.
"""

from __future__ import annotations

import numpy as np

from casmoe.cache import CacheStats, ExpertCache, MissMode, PolicyError
from casmoe.step_arrays import StepArrays
from casmoe.trace import Request, Trace
from casmoe.twin import beyond_guesses, twin_of

_MISS = {MissMode.LOAD: 0, MissMode.SUBSTITUTE: 1, MissMode.CPU: 2}
_NO_MARKS = np.zeros((0, 5), np.int64)
COMPILE_WORTH = 200_000
"""Routed accesses from which the automatic choice compiles: below, the Python replay is done
before numba has even loaded (about a second per process; see bench/RESULTS.md)."""


def has_twin(cache: ExpertCache) -> bool:
    """Whether `cache` is fresh, its class declares a compiled twin itself, and its options keep
    it to that twin's decisions (`Twin.runs`)."""
    twin = twin_of(type(cache))
    return twin is not None and twin.runs(cache) and cache.fresh and not cache.transient


def uses_twin(cache: ExpertCache, trace: Trace, compiled: bool | None = None) -> bool:
    """The path `casmoe.replay.replay` takes: the twin if there is one and `compiled` is True,
    or None and the trace routes about `COMPILE_WORTH` accesses or more."""
    g = trace.geometry
    return compiled is not False and has_twin(cache) and (bool(compiled) or trace.tokens * g.layers * g.top_k >= COMPILE_WORTH)


class TwinMachine:
    """A fresh built-in cache's compiled twin: the kernel's state, driven step range by step
    range, with the policy's own Python hooks at request boundaries. `log_rows` > 0 keeps the
    decisions in `mc.log`; `decide` is the simulator's decision pass (loads never land)."""

    def __init__(self, cache: ExpertCache, arrays: StepArrays, *, log_rows: int = 0, decide: bool = False) -> None:
        from casmoe.kernels import cache_machine as km

        if not has_twin(cache):
            raise PolicyError(f"{type(cache).__name__} has no compiled twin (or is not fresh)")
        g = cache.geometry
        if arrays.accesses and not (
            0 <= int(arrays.experts.min()) <= int(arrays.experts.max()) < g.total_experts
            and np.diff(arrays.visit_ptr).max() <= g.experts
        ):  # the kernel's arrays are sized for these (numba does not bounds-check)
            raise PolicyError(f"the step arrays route expert ids outside [0, {g.total_experts}) or more experts than a layer has")
        self.km = km
        self.cache = cache
        self.arrays = arrays
        twin = twin_of(type(cache))
        self.order = km.order_of(twin.order, twin.touched)  # the kernels' victim order
        self.mc = _machine(km, cache, arrays, log_rows, decide)

    def begin(self, request: Request) -> None:
        self.km.begin_request(self.mc, self.order, _prefetch_request(self.km, self.cache, request, self.mc))

    def run(self, first: int, last: int, marks: np.ndarray = _NO_MARKS) -> None:
        self.km.replay_steps(self.mc, self.order, self.arrays.visit_ptr, self.arrays.experts, first, last, marks)
        self.check()

    def end(self) -> None:
        self.check()
        self.km.end_request(self.mc)
        self.cache.on_request_end()

    def check(self) -> None:
        """Raise what the Python policy raised where the kernel read past a request's guesses."""
        over = int(self.mc.reg[self.km.R_GUESS_OVER])
        if over >= 0:
            raise beyond_guesses(self.cache.name, over)

    def sync(self) -> None:
        """The run's counters into the cache object (its `stats()`)."""
        self.cache.take_stats(CacheStats(*self.mc.n.tolist()), self.mc.wasted.tolist())


def replay_compiled(trace: Trace, cache: ExpertCache, arrays: StepArrays, log: list | None = None) -> CacheStats:
    """The counts `casmoe.replay.replay` gives, from the twin; `log` (a list) receives the
    decision rows `(what, expert, slot or stand-in, victim)` of `cache_machine.LOG_*`."""
    N = cache.geometry.total_experts
    budget = twin_of(type(cache)).state(cache).per_visit
    # decisions are at most: a demand load or a stand-in and its background load per access,
    # the per-visit prefetches (next-layer budget, guesses), and every expert per request start
    rows = 2 * arrays.accesses + budget * (len(arrays.visit_ptr) - 1) + N * len(arrays.first_step)
    twin = TwinMachine(cache, arrays, log_rows=rows if log is not None else 0)
    begins: dict[int, list[int]] = {}
    ends: dict[int, int] = {}
    for r, (a, b) in enumerate(zip(arrays.first_step.tolist(), arrays.last_step.tolist())):
        if a >= 0:
            begins.setdefault(a, []).append(r)
            ends[b] = ends.get(b, 0) + 1
    done = 0
    for s in sorted(set(begins) | set(ends)):
        if s in begins:
            twin.run(done, s)
            done = s
            for r in begins[s]:
                twin.begin(trace.requests[r])
        if s in ends:
            twin.run(done, s + 1)
            done = s + 1
            for _ in range(ends[s]):
                twin.end()
    twin.run(done, arrays.steps)
    if log is not None:
        log.extend(tuple(row) for row in twin.mc.log[: twin.mc.reg[twin.km.R_LOG]].tolist())
    twin.sync()
    return cache.stats()


def _prefetch_request(km, cache: ExpertCache, request: Request, mc) -> np.ndarray:
    """The policy's own `prefetch_request` answer, checked, with the state it set for the kernel."""
    N = cache.geometry.total_experts
    experts = np.asarray(cache.prefetch_request(cache.request_view(request)), dtype=np.int64).ravel()
    if experts.size and not 0 <= int(experts.min()) <= int(experts.max()) < N:
        raise PolicyError(f"{type(cache).__name__}.prefetch_request returned expert ids outside [0, {N})")
    key = twin_of(type(cache)).request_key(cache)
    if key is not None:
        mc.key[:] = key  # the victim order of this request
    if mc.cfg[km.C_GUESSES]:
        _load_guesses(km, cache, mc)
    return experts


def _load_guesses(km, cache: ExpertCache, mc) -> None:
    """The running request's guess table (`Twin.request_guesses`), checked, into the kernel's buffers."""
    reg = mc.reg
    reg[km.R_GUESS_ROWS], reg[km.R_GUESS_FIRST] = -1, -1
    guesses = twin_of(type(cache)).request_guesses(cache)
    if guesses is None:
        return
    ptr, ids = np.asarray(guesses.ptr, np.int64), np.asarray(guesses.ids, np.int64)
    n = int(ptr[-1])
    fits = len(ptr) <= len(mc.guess_ptr) and n <= min(len(mc.guess_ids), len(ids))
    if not fits or (n and not 0 <= int(ids[:n].min()) <= int(ids[:n].max()) < cache.geometry.experts):
        raise PolicyError(f"{type(cache).__name__}.request_guesses: a table larger than its twin state declares, "
                          "or ids outside a layer")  # numba does not bounds-check
    mc.guess_ptr[: len(ptr)] = ptr
    mc.guess_ids[:n] = ids[:n]
    reg[km.R_GUESS_ROWS] = len(ptr) - 1


def _machine(km, cache: ExpertCache, arrays: StepArrays, log_rows: int, decide: bool):
    g, cap = cache.geometry, cache.capacity
    N, L, E, slots = g.total_experts, g.layers, g.experts, cap.slots
    pools = cache.pools
    twin = twin_of(type(cache))
    state = twin.state(cache)
    cfg = np.zeros(km.N_CFG, np.int64)
    cfg[[km.C_E, km.C_L, km.C_SLOTS, km.C_PER_LAYER, km.C_MISS, km.C_KEEPS]] = (
        E, L, slots, cap.per_layer, _MISS[cache.miss_mode], cache.keeps_experts,
    )
    cfg[km.C_NEXT_LAYER_BUDGET] = state.next_layer_budget
    cfg[km.C_LOOKAHEAD] = state.lookahead
    cfg[km.C_LOG] = log_rows > 0
    cfg[km.C_DECIDE] = decide
    cfg[km.C_GUESSES] = state.guess_rows > 0
    free = np.array([list(reversed(range(p * slots, (p + 1) * slots))) for p in range(pools)], np.int64)
    pinned = np.zeros(N, np.bool_)
    if state.pinned:
        pinned[list(state.pinned)] = True
    use_ptr, use_visit = arrays.uses(N) if twin.reads_future else (np.zeros(N + 1, np.int64), np.zeros(0, np.int64))
    return km.Machine(
        cfg=cfg,
        reg=np.array([0] * km.R_GUESS_ROWS + [-1, -1, -1], np.int64),
        n=np.zeros(13, np.int64),
        slot_of=np.full(N, -1, np.int64),
        slot_expert=np.full(pools * slots, -1, np.int64),
        free=free,
        nfree=np.full(pools, slots, np.int64),
        members=np.zeros(pools, np.int64),
        high=np.zeros(pools, np.int64),
        prot_pool=np.zeros(pools, np.int64),
        protected=np.zeros(N, np.bool_),
        prot_at=np.zeros(N, np.int64),
        prot_list=np.zeros(2 * E + 2, np.int64),
        inflight=np.zeros(N, np.bool_),
        unused=np.zeros(N, np.bool_),
        wasted=np.zeros(L, np.int64),
        last=np.zeros(N, np.int64),
        count=np.zeros(N, np.int64),
        served=state.served if state.served is not None else np.zeros(N),
        key=np.zeros(N),
        pinned=pinned,
        layer_bytes=np.asarray(cache.layer_bytes, np.int64),
        use_ptr=use_ptr,
        use_visit=use_visit,
        issued=np.zeros(N + 2 * E + 2, np.int64),
        tail=np.zeros(E, np.int64),
        was_absent=np.zeros(E, np.bool_),
        next_order=np.arange(N, dtype=np.int64).reshape(L, E),
        guess_ptr=np.zeros(state.guess_rows + 1, np.int64),
        guess_ids=np.zeros(state.guess_ids, np.int64),
        log=np.zeros((log_rows, 4), np.int64),
    )

"""A compiled twin of `ExpertCache` and the built-in policies, and a replay loop over it.

Everything here mirrors Python that stays the definition: the mechanics of `casmoe/cache.py`
(`route`, `_admit`, `_evict`, `_prefetch`, `_release`, `_substitute`), the per-access hooks
of the built-in policies in `casmoe/policies/`, and the event order of `casmoe/replay.py`.
Per-request hooks (`prefetch_request`, `on_request_end`) are not duplicated: the driver in
`casmoe/compiled.py` calls the policy's own Python methods between kernel calls.
tests/policies/test_compiled_replay.py keeps the twins equal: same loads, victims, slots,
substitutions and counters as the Python classes on random traces, for every built-in policy,
pool kind and miss mode.

This module names no policy. A policy's victim is the candidate (unprotected resident of the
pool) with the smallest `(primary, secondary)` of its victim order, a small function its own
module declares (`twin = Twin(order, ...)`, `casmoe.twin`): every built-in policy's choice is
such a minimum with unique keys, so a scan over the pool's slots finds the one the Python heap
or order finds. The kernels take the order as an argument (`Order`: the order and its optional
`touched` hook as one value of a numba type of its own), so numba compiles each kernel once per
order, with the order's code in it, and caches each on disk like any other signature.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable, NamedTuple

import numba
import numpy as np
from numba.core import types
from numba.extending import NativeValue, models, overload, register_model, typeof_impl, unbox

from casmoe.kernels import layout
from casmoe.kernels.layout import (C_DECIDE, C_E, C_GUESSES, C_KEEPS, C_L, C_LOG, C_LOOKAHEAD, C_MISS,  # noqa: F401
                                   C_NEXT_LAYER_BUDGET, C_PER_LAYER, C_SLOTS, N_CFG, N_REG, R_GUESS_FIRST,
                                   R_GUESS_OVER, R_GUESS_ROWS, R_ISSUED, R_LAYER, R_LIVE, R_LOG, R_NPROT, R_STEP,
                                   R_TICK)

# the slot numbers these kernels were written for (`layout.py`): numba's cache checks only this
# file, so a renumbering there must come with an edit here (see layout.py)
assert (C_E, C_L, C_SLOTS, C_PER_LAYER, C_MISS, C_KEEPS, C_NEXT_LAYER_BUDGET, C_LOOKAHEAD, C_LOG, C_DECIDE,
        C_GUESSES, N_CFG) == (*range(11), 11), "layout.py's cfg slots changed: update cache_machine.py"
assert (R_TICK, R_STEP, R_LAYER, R_NPROT, R_LIVE, R_LOG, R_ISSUED, R_GUESS_ROWS, R_GUESS_FIRST, R_GUESS_OVER,
        N_REG) == (*range(10), 10), "layout.py's reg slots changed: update cache_machine.py"
# miss modes, as `casmoe.cache.MissMode`
LOAD, SUBSTITUTE, CPU = range(3)
# counters, in the field order of `casmoe.cache.CacheStats`
(N_ACCESSES, N_HITS, N_LATE, N_MISSES, N_COLD, N_SUBS, N_CPU, N_DEMAND, N_PREFETCH, N_USED, N_WASTED,
 N_EVICTIONS, N_BYTES) = range(13)
# log rows: (what, expert, slot or stand-in, victim); LOG_CPU: a miss computed on the host
LOG_DEMAND, LOG_PREFETCH, LOG_SUBSTITUTE, LOG_CPU = range(4)
# marks columns (decision mode): log rows of a visit's before_layer start at PRE, its route's
# at ROUTE and end before END; HITS and LATE are route's counts
M_PRE, M_ROUTE, M_END, M_HITS, M_LATE = range(5)


_kernel = numba.njit(cache=True, nogil=True, _nrt=False)
"""Compiled without numba's reference counting (NRT): the kernels allocate nothing (the driver
does), and with it every call that passes the machine's arrays would pay ~0.3 us of refcounts."""
_inlined = numba.njit(cache=True, nogil=True, _nrt=False, inline="always")
"""A named step of a kernel, inlined into it by numba: called instead, each step that takes the
machine (27 arrays, passed by value) made a compiled replay 15% slower."""


class Machine(NamedTuple):
    """The state of one cache, as arrays (N = L x E experts, S slots, P pools).

    The name stays although `sim` and `casmoe` once had Machines of their own (now `RunState`,
    `resources`): numba's cache index pickles this class by name in every kernel signature that
    takes it (here and in casmoe/sim/passes/timing_kernel.py) and unpickles the index before checking it is
    stale, so after a rename every checkout with a warm cache fails with AttributeError until its
    `__pycache__/*.nbi` files are deleted (tried: bench/RESULTS.md, "Speed parity of the refactors")."""

    cfg: np.ndarray  # int64 [N_CFG], the C_* settings (`layout.py`)
    reg: np.ndarray  # int64 [N_REG], the R_* scalars
    n: np.ndarray  # int64 [13], the counters
    slot_of: np.ndarray  # int64 [N], -1 when not resident
    slot_expert: np.ndarray  # int64 [S], -1 for a free slot
    free: np.ndarray  # int64 [P, slots]: each pool's free-slot stack
    nfree: np.ndarray  # int64 [P]
    members: np.ndarray  # int64 [P]: residents per pool
    high: np.ndarray  # int64 [P]: the most residents each pool has held (its slots ever filled)
    prot_pool: np.ndarray  # int64 [P]: protected residents per pool
    protected: np.ndarray  # bool [N]
    prot_at: np.ndarray  # int64 [N]: index of an expert's live entry in prot_list
    prot_list: np.ndarray  # int64 [2E + 2]: protection order (the Python dict's insertion order)
    inflight: np.ndarray  # bool [N]
    unused: np.ndarray  # bool [N]: prefetched, not used yet
    wasted: np.ndarray  # int64 [L]: prefetches each layer evicted unused (`ExpertCache.wasted_by_layer`)
    last: np.ndarray  # int64 [N]: tick of the last access or insert
    count: np.ndarray  # int64 [N]: routed uses so far (lfu, semoe)
    served: np.ndarray  # float64 [N]: routed uses this request (casmoe's own `_served`)
    key: np.ndarray  # float64 [N]: belady's -next use at the last touch, casmoe's scores
    pinned: np.ndarray  # bool [N]: static's pinned experts
    layer_bytes: np.ndarray  # int64 [L]
    use_ptr: np.ndarray  # int64 [N + 1]: each expert's visits, for the oracles
    use_visit: np.ndarray  # int64 [uses]
    issued: np.ndarray  # int64 [N + 2E]: experts loaded by the running event (they land after it)
    tail: np.ndarray  # int64 [E]: scratch of `route`
    was_absent: np.ndarray  # bool [E]: scratch of `route`
    next_order: np.ndarray  # int64 [L, E]: semoe's experts of each layer by (-uses, id), kept sorted
    guess_ptr: np.ndarray  # int64 [rows + 1]: the running request's guesses, row j * L + layer (speculative)
    guess_ids: np.ndarray  # int64 [ids]: their local expert ids, best first
    log: np.ndarray  # int64 [rows, 4]: the decisions, when cfg[C_LOG]


@_kernel
def _pool(mc, expert):
    return expert // mc.cfg[C_E] if mc.cfg[C_PER_LAYER] else 0


@_kernel
def _log(mc, what, expert, a, b):
    if mc.cfg[C_LOG]:
        i = mc.reg[R_LOG]
        mc.log[i, 0] = what
        mc.log[i, 1] = expert
        mc.log[i, 2] = a
        mc.log[i, 3] = b
        mc.reg[R_LOG] = i + 1


# ---- a policy's victim order, as a kernel argument -----------------------------------------


class OrderType(types.Dummy):
    """The numba type of one `Order`: named by its functions and a hash of the files they and the
    slot numbers are written in (`Order.name`), so a cached kernel is found again by the next
    process, and one compiled for an edited order is not. Like `Machine`, the class keeps its
    name and module: numba's cache index pickles it into every signature that takes an order."""

    def __init__(self, order_name: str) -> None:
        self.order_name = order_name
        super().__init__(name=f"Order({order_name})")


register_model(OrderType)(models.OpaqueModel)


@unbox(OrderType)
def _unbox_order(typ, obj, c):
    return NativeValue(c.context.get_dummy_value())  # no data: the order is in the type


_ORDERS: dict[str, tuple] = {}
"""`Order.name` -> (victim order, touched hook or None), compiled: what the overloads below call."""


class Order:
    """A policy's victim order (`Twin.order`) and its `touched` hook, as one kernel argument.

    Its numba type names the two functions, so a kernel that takes it is compiled for them and
    calls them directly (no indirect call). The functions are compiled without numba's own
    cache: they are compiled only into a kernel, and numba would not see an edit to the slot
    numbers they read (`layout.py`); the kernels that take an order are cached under a name
    that hashes those files. Use `order_of`: one per pair of functions and process."""

    def __init__(self, key: Callable, touched: Callable | None) -> None:
        files = sorted({Path(f.__code__.co_filename) for f in (key, touched) if f is not None} | {Path(layout.__file__)})
        digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:16]
        names = "+".join(f"{f.__module__}.{f.__qualname__}" for f in (key, touched) if f is not None)
        self.name = f"{names}@{digest}"
        self.key, self.touched = key, touched
        self.type = OrderType(self.name)
        jit = numba.njit(nogil=True, _nrt=False)
        _ORDERS[self.name] = (jit(key), jit(touched) if touched is not None else None)


@typeof_impl.register(Order)
def _typeof_order(val, c):
    return val.type


_ORDER_OF: dict[tuple, Order] = {}


def order_of(key: Callable, touched: Callable | None = None) -> Order:
    """The kernel argument of a victim order (and its touched hook), made once per process."""
    if (key, touched) not in _ORDER_OF:
        _ORDER_OF[key, touched] = Order(key, touched)
    return _ORDER_OF[key, touched]


def _victim_key(order, mc, expert):
    """`(primary, secondary)` of `expert` in `order` (smallest evicted first). Compiled, the
    overload below calls the order's compiled function; this body runs in interpreted kernels."""
    return order.key(mc, expert)


def _touched(order, mc, expert):
    """The order's `touched` hook, after `expert` was accessed or inserted (nothing without one)."""
    if order.touched is not None:
        order.touched(mc, expert)


@overload(_victim_key, inline="always")
def _victim_key_of(order, mc, expert):
    key = _ORDERS[order.order_name][0]
    return lambda order, mc, expert: key(mc, expert)


@overload(_touched, inline="always")
def _touched_of(order, mc, expert):
    hook = _ORDERS[order.order_name][1]
    if hook is None:
        return lambda order, mc, expert: None
    return lambda order, mc, expert: hook(mc, expert)


# ---- the machine ---------------------------------------------------------------------------


@_kernel
def _touch(mc, order, expert, access):
    """`on_access` (access) or `on_insert` of every built-in policy."""
    mc.reg[R_TICK] += 1
    mc.last[expert] = mc.reg[R_TICK]
    if access:
        mc.count[expert] += 1
        mc.served[expert] += 1.0
    _touched(order, mc, expert)


@_kernel
def _victim(mc, order, pool):
    slots = mc.cfg[C_SLOTS]
    best = -1
    best_a, best_b = 0.0, 0
    for s in range(pool * slots, (pool + 1) * slots):
        e = mc.slot_expert[s]
        if e < 0 or mc.protected[e]:
            continue
        a, b = _victim_key(order, mc, e)
        if best < 0 or a < best_a or (a == best_a and b < best_b):
            best, best_a, best_b = e, a, b
    return best


@_kernel
def _protect(mc, expert):
    if not mc.protected[expert]:
        mc.protected[expert] = True
        i = mc.reg[R_NPROT]
        mc.prot_list[i] = expert
        mc.prot_at[expert] = i
        mc.reg[R_NPROT] = i + 1
        mc.reg[R_LIVE] += 1
        mc.prot_pool[_pool(mc, expert)] += 1


@_kernel
def _unprotect(mc, expert):
    mc.protected[expert] = False
    mc.reg[R_LIVE] -= 1
    mc.prot_pool[_pool(mc, expert)] -= 1


@_kernel
def _clear_protection(mc):
    for i in range(mc.reg[R_NPROT]):
        e = mc.prot_list[i]
        if mc.protected[e] and mc.prot_at[e] == i:
            _unprotect(mc, e)
    mc.reg[R_NPROT] = 0


@_kernel
def _evict(mc, victim, pool):
    slot = mc.slot_of[victim]
    mc.slot_of[victim] = -1
    mc.slot_expert[slot] = -1
    mc.members[pool] -= 1
    mc.inflight[victim] = False
    if mc.unused[victim]:
        mc.unused[victim] = False
        mc.n[N_WASTED] += 1
        mc.wasted[victim // mc.cfg[C_E]] += 1
    mc.n[N_EVICTIONS] += 1
    return slot


@_kernel
def _release(mc):
    """The running layer is done (cache.py `_release`)."""
    if not mc.cfg[C_KEEPS]:
        for i in range(mc.reg[R_NPROT]):
            e = mc.prot_list[i]
            if mc.protected[e] and mc.prot_at[e] == i and mc.slot_of[e] >= 0:
                pool = _pool(mc, e)
                mc.free[pool, mc.nfree[pool]] = _evict(mc, e, pool)
                mc.nfree[pool] += 1
    _clear_protection(mc)


@_kernel
def _admit(mc, order, expert, demand):
    pool = _pool(mc, expert)
    layer = expert // mc.cfg[C_E]
    victim = -1
    if mc.nfree[pool] > 0:
        mc.nfree[pool] -= 1
        slot = mc.free[pool, mc.nfree[pool]]
        if mc.members[pool] == mc.high[pool]:  # a slot never filled (freed ones are taken first)
            mc.high[pool] += 1
            if demand:
                mc.n[N_COLD] += 1
    else:
        if mc.prot_pool[pool] >= mc.members[pool]:
            # every resident is routed by this layer (a long prefill): the earliest-routed of
            # this pool has been computed, so its protection lapses (streaming)
            for i in range(mc.reg[R_NPROT]):
                e = mc.prot_list[i]
                if mc.protected[e] and mc.prot_at[e] == i and _pool(mc, e) == pool:
                    _unprotect(mc, e)
                    break
        victim = _victim(mc, order, pool)
        slot = _evict(mc, victim, pool)
    mc.slot_of[expert] = slot
    mc.slot_expert[slot] = expert
    mc.members[pool] += 1
    mc.inflight[expert] = True
    mc.issued[mc.reg[R_ISSUED]] = expert
    mc.reg[R_ISSUED] += 1
    if demand:
        mc.n[N_DEMAND] += 1
    else:
        mc.n[N_PREFETCH] += 1
        mc.unused[expert] = True
    mc.n[N_BYTES] += mc.layer_bytes[layer]
    _touch(mc, order, expert, False)
    _log(mc, LOG_DEMAND if demand else LOG_PREFETCH, expert, slot, victim)


@_kernel
def _prefetch_one(mc, order, e):
    """cache.py `_prefetch` for one expert: skip residents and pools held whole by the running layer."""
    if mc.slot_of[e] >= 0:
        return
    pool = _pool(mc, e)
    if mc.nfree[pool] == 0 and mc.prot_pool[pool] >= mc.members[pool]:
        return
    _admit(mc, order, e, False)


@_kernel
def prefetch(mc, order, experts):
    for e in experts:
        _prefetch_one(mc, order, e)


@_kernel
def _substitute(mc, layer):
    """The lowest-id arrived resident of `layer` (no router scores in replay), or -1."""
    E = mc.cfg[C_E]
    for e in range(layer * E, (layer + 1) * E):
        if mc.slot_of[e] >= 0 and not mc.inflight[e]:
            return e
    return -1


@_kernel
def _next_layer_prefetch(mc, order, layer):
    """semoe.py `prefetch_layer`: the next layer's most used experts (lower id first among
    equals), within the budget. Uses only grow, so an insertion sort keeps the order cheaply."""
    nl = (layer + 1) % mc.cfg[C_L]
    ranked = mc.next_order[nl]
    for i in range(1, len(ranked)):
        e = ranked[i]
        j = i
        while j > 0 and (mc.count[ranked[j - 1]] < mc.count[e] or (mc.count[ranked[j - 1]] == mc.count[e] and ranked[j - 1] > e)):
            ranked[j] = ranked[j - 1]
            j -= 1
        ranked[j] = e
    for i in range(mc.cfg[C_NEXT_LAYER_BUDGET]):
        _prefetch_one(mc, order, ranked[i])


@_kernel
def _guess_prefetch(mc, order, step, layer):
    """speculative.py `prefetch_layer`: the running request's guess for this visit (its table's
    row for the request's step, counted from the first step a guess was read at); a guessed
    resident counts as just used before the absent ones load."""
    rows = mc.reg[R_GUESS_ROWS]
    if rows < 0 or layer == 0:
        return
    if mc.reg[R_GUESS_FIRST] < 0:
        mc.reg[R_GUESS_FIRST] = step
    row = (step - mc.reg[R_GUESS_FIRST]) * mc.cfg[C_L] + layer
    if row >= rows:  # the Python policy raises; the driver does, after this call
        if mc.reg[R_GUESS_OVER] < 0:
            mc.reg[R_GUESS_OVER] = step
        return
    base = layer * mc.cfg[C_E]
    lo, hi = mc.guess_ptr[row], mc.guess_ptr[row + 1]
    for i in range(lo, hi):
        e = base + mc.guess_ids[i]
        if mc.slot_of[e] >= 0:
            _touch(mc, order, e, False)
    for i in range(lo, hi):
        _prefetch_one(mc, order, base + mc.guess_ids[i])


@_kernel
def route(mc, order, step, layer, experts):
    """cache.py `route`: count hits, protect, then serve the misses in routing order."""
    if mc.reg[R_LIVE] > 0:  # the previous layer is done
        if mc.cfg[C_KEEPS]:
            _clear_protection(mc)
        else:
            _release(mc)
    mc.reg[R_STEP] = step
    mc.reg[R_LAYER] = layer
    absent, ntail = _count_hits(mc, order, experts)
    if absent == 0:
        return
    mc.n[N_MISSES] += absent
    if mc.cfg[C_MISS] == CPU:
        mc.n[N_CPU] += absent
        _compute_on_host(mc, order, ntail)
    else:
        _serve_misses(mc, order, layer, ntail)


@_inlined
def _count_hits(mc, order, experts):
    """Count hits and late hits and protect the residents; touch those routed before the first
    miss, and queue in `mc.tail` (with `mc.was_absent`) the experts from the first miss on, to
    be served in routing order. Returns (misses, length of the tail)."""
    tail, was_absent = mc.tail, mc.was_absent
    hits = 0
    late = 0
    absent = 0
    ntail = 0
    for e in experts:
        if mc.slot_of[e] >= 0:
            if mc.inflight[e]:
                late += 1
            else:
                hits += 1
            if mc.unused[e]:
                mc.unused[e] = False
                mc.n[N_USED] += 1
            _protect(mc, e)
            if absent:
                tail[ntail] = e
                was_absent[ntail] = False
                ntail += 1
            else:
                _touch(mc, order, e, True)
        else:
            absent += 1
            tail[ntail] = e
            was_absent[ntail] = True
            ntail += 1
    mc.n[N_ACCESSES] += len(experts)
    mc.n[N_HITS] += hits
    mc.n[N_LATE] += late
    return absent, ntail


@_inlined
def _compute_on_host(mc, order, ntail):
    """cpu miss mode: the misses run on the host (logged), the residents after them are touched."""
    for i in range(ntail):
        if mc.slot_of[mc.tail[i]] >= 0:
            _touch(mc, order, mc.tail[i], True)
        elif mc.was_absent[i]:
            _log(mc, LOG_CPU, mc.tail[i], -1, -1)


@_inlined
def _serve_misses(mc, order, layer, ntail):
    """load and substitute miss modes: in routing order, touch the residents and load each miss
    on demand, or (substitute) run an arrived resident of the layer in its place while the
    miss is fetched in the background."""
    for i in range(ntail):
        e = mc.tail[i]
        if not mc.was_absent[i]:
            if mc.slot_of[e] >= 0:  # a long prefill may have streamed it out already
                _touch(mc, order, e, True)
            continue
        if mc.cfg[C_MISS] == SUBSTITUTE:
            sub = _substitute(mc, layer)
            if sub >= 0:
                mc.n[N_SUBS] += 1
                _log(mc, LOG_SUBSTITUTE, e, sub, -1)
                _protect(mc, sub)
                _touch(mc, order, sub, True)
                _prefetch_one(mc, order, e)  # fetched in the background, else the resident set freezes
                continue
        _admit(mc, order, e, True)
        _protect(mc, e)
        _touch(mc, order, e, True)


@_kernel
def land(mc):
    """The loads of the event that just ran arrive (replay: at once)."""
    for i in range(mc.reg[R_ISSUED]):
        mc.inflight[mc.issued[i]] = False
    mc.reg[R_ISSUED] = 0


@_kernel
def begin_request(mc, order, experts):
    """The loads of `prefetch_request`'s answer, landed (replay) or left to the timing pass."""
    prefetch(mc, order, experts)
    if mc.cfg[C_DECIDE]:
        mc.reg[R_ISSUED] = 0
    else:
        land(mc)


@_kernel
def end_request(mc):
    _release(mc)


@_kernel
def replay_steps(mc, order, visit_ptr, visit_experts, first, last, marks):
    """replay.py's layer loop for steps `first..last-1`: per computed layer `before_layer`
    (for policies that prefetch per layer) and `route`, every load landing after its event.

    In decision mode (`cfg[C_DECIDE]`, the simulator's decision pass, `casmoe/sim/passes/decide.py`) loads
    never land (the timing pass prices them) and each visit `v` records in `marks[v - first * L]`
    where its decisions lie in the log, and route's hit counts."""
    L = mc.cfg[C_L]
    decide = mc.cfg[C_DECIDE]
    record = marks.shape[0] > 0
    for s in range(first, last):
        for layer in range(L):
            v = s * L + layer
            lo, hi = visit_ptr[v], visit_ptr[v + 1]
            if lo == hi:
                continue
            i = v - first * L
            if record:
                marks[i, M_PRE] = mc.reg[R_LOG]
            if mc.cfg[C_NEXT_LAYER_BUDGET] > 0 or mc.cfg[C_GUESSES]:  # before_layer
                _release(mc)
                mc.reg[R_STEP] = s
                mc.reg[R_LAYER] = layer
                if mc.cfg[C_GUESSES]:
                    _guess_prefetch(mc, order, s, layer)
                else:
                    _next_layer_prefetch(mc, order, layer)
                if not decide:
                    land(mc)
            hits, late = mc.n[N_HITS], mc.n[N_LATE]
            if record:
                marks[i, M_ROUTE] = mc.reg[R_LOG]
            route(mc, order, s, layer, visit_experts[lo:hi])
            if record:
                marks[i, M_END] = mc.reg[R_LOG]
                marks[i, M_HITS] = mc.n[N_HITS] - hits
                marks[i, M_LATE] = mc.n[N_LATE] - late
            if decide:
                mc.reg[R_ISSUED] = 0
            else:
                land(mc)

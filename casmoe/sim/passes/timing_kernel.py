"""The timing pass compiled: `timing.StepTimer` and `link.Link` as numba kernels over arrays.

Everything here mirrors Python that stays the definition (`casmoe/sim/passes/timing.py` `StepTimer.begin`,
`step`, `_walk`, `_wait`, `_experts_time`, `end`; `casmoe/sim/passes/link.py` `Link`; `casmoe/sim/passes/timeliness.py`
`Timeliness`), for decisions made in advance by a compiled twin (`casmoe/sim/passes/decide.py`
`CompiledDecider`): it reads the twin's decision log and per-visit marks directly, so no
Python record exists per visit. The floating-point operations are the Python ones in the same
order (numba compiles without fast-math), so the results agree to the last bit;
tests/sim/passes/test_compiled_timing.py checks it on random traces and machines.

A link's Python dicts become arrays over the shard's experts (an expert's loads always go over
its own layer's link, so one array serves every link): `token` (0: no tracked load),
`pending` (the queue index of a prefetch not yet on the wire, -1: none), `arrival`. Its FIFO
of prefetches is a ring per link (`q_*`, indices counted up from 0; the driver grows it
between chunks), its arrival heap a binary heap per link ordered by (arrival, token), as
Python's heap of (arrival, token, expert) tuples (tokens are unique per link, so the order
and every pop agree).
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from casmoe.kernels.cache_machine import LOG_CPU, M_END, M_PRE, M_ROUTE, R_LOG, replay_steps

# cfg slots (int64)
C_E, C_L, C_D, C_MULTI, C_CPU_MODE, C_DETAIL, C_HOST_CAP, C_HOST_COST, C_EARLY = range(9)
N_CFG = 9
# par slots (float64): the link and the machine's host costs
P_RATE, P_LATENCY, P_HOST_RATE, P_LOAD_HOST, P_LOAD_LAYER, P_WAKE, P_RESUME, P_BESIDE, P_EXPERT_PASS, P_CPU_SERIAL = range(10)
P_DECIDE, P_DECIDE_LOAD = 10, 11  # the policy's decisions: per layer visit, per load asked for
N_PAR = 12
# acc slots (float64): the run's accumulators and the host cap's free-at time
A_COMPUTE, A_STALL_DEMAND, A_STALL_LATE, A_BOUND, A_HOST_FREE = range(5)
# n slots (int64)
N_LATE, N_UNUSED = range(2)

_kernel = numba.njit(cache=True, nogil=True, _nrt=False)
_inlined = numba.njit(cache=True, nogil=True, _nrt=False, inline="always")
"""A layer's steps are inlined by numba into the step loop, the rarer ones (the queue's advance,
a burst of prefetches, a request start, counts that vary, timeliness) are calls: a call copies
the state (39 arrays, passed by value), and with every step called the timing pass was about 3x
slower; with every step inlined numba took minutes to compile it."""


class State(NamedTuple):
    """One run's timing state (N experts of the shard, L layers, D links, Q ring, H heap)."""

    cfg: np.ndarray  # int64 [N_CFG], the C_* settings
    par: np.ndarray  # float64 [10], the P_* parameters
    acc: np.ndarray  # float64 [5], the A_* accumulators
    n: np.ndarray  # int64 [2], the N_* counters
    device: np.ndarray  # int64 [L]: each layer's link
    layer_bytes: np.ndarray  # int64 [L]
    expert_time: np.ndarray  # float64 [L]: one routed expert, one token
    exp_tab: np.ndarray  # float64 [L, C]: `compute.expert(layer, c)` for the counts routed
    cpu_tab: np.ndarray  # float64 [L, C]: `compute.cpu_expert(layer, c)`
    copy_s: np.ndarray  # float64 [L]: timeliness' copy time of one expert
    stall_by_layer: np.ndarray  # float64 [L]
    late_by_layer: np.ndarray  # int64 [L]
    bound_by_layer: np.ndarray  # float64 [L]
    busy_until: np.ndarray  # float64 [D]
    busy: np.ndarray  # float64 [D]
    moved: np.ndarray  # int64 [D]: bytes moved
    cancelled: np.ndarray  # int64 [D]
    seq: np.ndarray  # int64 [D]: the last token handed out
    ntokens: np.ndarray  # int64 [D]: tracked loads in flight
    device_busy: np.ndarray  # float64 [D]
    copied: np.ndarray  # float64 [D]: timeliness' copy time of the needed loads so far
    bound_by_device: np.ndarray  # float64 [D]: timeliness' bound of each link alone
    q_head: np.ndarray  # int64 [D]
    q_tail: np.ndarray  # int64 [D]
    q_expert: np.ndarray  # int64 [D, Q]
    q_nbytes: np.ndarray  # int64 [D, Q]
    q_token: np.ndarray  # int64 [D, Q]
    q_enq: np.ndarray  # float64 [D, Q]
    q_alive: np.ndarray  # bool [D, Q]
    h_size: np.ndarray  # int64 [D]
    h_time: np.ndarray  # float64 [D, H]
    h_token: np.ndarray  # int64 [D, H]
    h_expert: np.ndarray  # int64 [D, H]
    token: np.ndarray  # int64 [N]
    pending: np.ndarray  # int64 [N]
    arrival: np.ndarray  # float64 [N]
    unused: np.ndarray  # bool [N]: prefetched, not used yet (timeliness)
    on_host: np.ndarray  # bool [N]: scratch of `_experts_time`


# ---- the link ------------------------------------------------------------------------------


@_inlined
def _wire(st, d, nbytes, start):
    """`Link._wire` without storage chunks: occupy the wire (and the host cap) from `start`."""
    end = start + st.par[P_LATENCY] + nbytes / st.par[P_RATE]
    if st.cfg[C_HOST_CAP]:
        free = st.acc[A_HOST_FREE]
        through = (free if free > start else start) + nbytes / st.par[P_HOST_RATE]
        st.acc[A_HOST_FREE] = through
        if through > end:
            end = through
    st.busy_until[d] = end
    st.busy[d] += end - start
    st.moved[d] += nbytes
    return end


@_inlined
def _heap_less(st, d, i, j):
    a, b = st.h_time[d, i], st.h_time[d, j]
    return a < b or (a == b and st.h_token[d, i] < st.h_token[d, j])


@_inlined
def _heap_swap(st, d, i, j):
    st.h_time[d, i], st.h_time[d, j] = st.h_time[d, j], st.h_time[d, i]
    st.h_token[d, i], st.h_token[d, j] = st.h_token[d, j], st.h_token[d, i]
    st.h_expert[d, i], st.h_expert[d, j] = st.h_expert[d, j], st.h_expert[d, i]


@_inlined
def _heap_push(st, d, time, token, expert):
    i = st.h_size[d]
    st.h_time[d, i], st.h_token[d, i], st.h_expert[d, i] = time, token, expert
    st.h_size[d] = i + 1
    while i > 0 and _heap_less(st, d, i, (i - 1) // 2):
        _heap_swap(st, d, i, (i - 1) // 2)
        i = (i - 1) // 2


@_inlined
def _heap_pop(st, d):
    """Drop the earliest arrival (read it at index 0 first)."""
    last = st.h_size[d] - 1
    _heap_swap(st, d, 0, last)
    st.h_size[d] = last
    i = 0
    while True:
        c = 2 * i + 1
        if c >= last:
            return
        if c + 1 < last and _heap_less(st, d, c + 1, c):
            c += 1
        if not _heap_less(st, d, c, i):
            return
        _heap_swap(st, d, i, c)
        i = c


@_inlined
def _commit(st, d, expert, nbytes, token, start):
    """`Link._commit`: a tracked load on the wire; its arrival lands later."""
    end = _wire(st, d, nbytes, start)
    st.arrival[expert] = end
    _heap_push(st, d, end, token, expert)
    return end


@_kernel
def _advance(st, d, now):
    """`Link._advance`: commit, in FIFO order, the queued prefetches that started before `now`."""
    Q = st.q_expert.shape[1]
    while st.q_head[d] < st.q_tail[d]:
        i = st.q_head[d] % Q
        if not st.q_alive[d, i]:
            st.q_head[d] += 1
            continue
        bu, enq = st.busy_until[d], st.q_enq[d, i]
        start = bu if bu > enq else enq
        if start >= now:
            return
        st.q_head[d] += 1
        e = st.q_expert[d, i]
        st.pending[e] = -1
        _commit(st, d, e, st.q_nbytes[d, i], st.q_token[d, i], start)


@_inlined
def _land(st, d, now):
    """`Link.land`, for decisions made in advance (nothing to tell the cache)."""
    if st.q_head[d] < st.q_tail[d]:
        _advance(st, d, now)
    while st.h_size[d] > 0 and st.h_time[d, 0] <= now:
        token, e = st.h_token[d, 0], st.h_expert[d, 0]
        _heap_pop(st, d)
        if st.token[e] == token:
            st.token[e] = 0
            st.ntokens[d] -= 1


@_inlined
def _prefetch(st, d, now, expert, nbytes):
    """`Link.prefetch`: queue behind every earlier copy."""
    Q = st.q_expert.shape[1]
    st.seq[d] += 1
    idx = st.q_tail[d]
    i = idx % Q
    st.q_expert[d, i], st.q_nbytes[d, i], st.q_token[d, i] = expert, nbytes, st.seq[d]
    st.q_enq[d, i], st.q_alive[d, i] = now, True
    st.q_tail[d] = idx + 1
    st.pending[expert] = idx
    if st.token[expert] == 0:
        st.ntokens[d] += 1
    st.token[expert] = st.seq[d]


@_inlined
def _demand(st, d, now, expert, nbytes):
    """`Link.demand` without a tier: commit ahead of the queued prefetches, untracked."""
    if st.q_head[d] < st.q_tail[d]:
        _advance(st, d, now)
    bu = st.busy_until[d]
    return _wire(st, d, nbytes, bu if bu > now else now)


@_inlined
def _need(st, d, now, expert):
    """`Link.need`: the arrival of an in-flight expert, a queued prefetch promoted to demand."""
    if st.q_head[d] < st.q_tail[d]:
        _advance(st, d, now)
    idx = st.pending[expert]
    if idx < 0:
        return st.arrival[expert]
    st.pending[expert] = -1
    i = idx % st.q_expert.shape[1]
    st.q_alive[d, i] = False
    start = st.busy_until[d]
    if now > start:
        start = now
    if st.q_enq[d, i] > start:
        start = st.q_enq[d, i]
    return _commit(st, d, expert, st.q_nbytes[d, i], st.q_token[d, i], start)


@_inlined
def _cancel(st, d, now, expert):
    """`Link.cancel`: drop the queued load of an evicted expert, or ignore its arrival."""
    if st.token[expert] == 0:
        return
    st.token[expert] = 0
    st.ntokens[d] -= 1
    if st.q_head[d] < st.q_tail[d]:
        _advance(st, d, now)
    idx = st.pending[expert]
    if idx >= 0:
        st.pending[expert] = -1
        st.q_alive[d, idx % st.q_expert.shape[1]] = False
        st.cancelled[d] += 1


# ---- timeliness ----------------------------------------------------------------------------


@_inlined
def _evicted(st, expert):
    if st.unused[expert]:
        st.unused[expert] = False
        st.n[N_UNUSED] -= 1


@_kernel
def _timeliness_visit(st, ll, device, clock, ready, experts, lo, hi, log, a, nloads):
    """`Timeliness.visit`: count the loads the visit needed, raise the bounds if they must."""
    needed = nloads
    if st.n[N_UNUSED]:
        for x in range(lo, hi):
            e = experts[x]
            if st.unused[e]:
                st.unused[e] = False
                st.n[N_UNUSED] -= 1
                needed += 1
                for r in range(a, a + nloads):  # a demand load now: the prefetch left unused
                    if log[r, 1] == e:
                        needed -= 1
                        break
        for r in range(a, a + nloads):
            if log[r, 3] >= 0:
                _evicted(st, log[r, 3])
    if needed:
        copied = st.copied[device] + needed * st.copy_s[ll]
        st.copied[device] = copied
        if copied > ready:
            st.bound_by_layer[ll] += copied - ready
        excess = copied - clock
        if excess > st.bound_by_device[device]:
            st.bound_by_device[device] = excess
            if excess > st.acc[A_BOUND]:
                st.acc[A_BOUND] = excess


# ---- the timing pass -----------------------------------------------------------------------


@_inlined
def _host_time(st, issued, beside):
    if not issued:
        return 0.0
    return st.par[P_LOAD_HOST] * issued + st.par[P_LOAD_LAYER] + st.par[P_BESIDE] * beside


@_kernel
def _issue(st, t, log, a, b):
    """`StepTimer._issue`: queue prefetch rows `a..b-1` of the log, cancelling their victims' loads."""
    E = st.cfg[C_E]
    for r in range(a, b):
        e, victim = log[r, 1], log[r, 3]
        if victim >= 0 and st.token[victim] != 0:
            _cancel(st, st.device[victim // E], t, victim)
        layer = e // E
        _prefetch(st, st.device[layer], t, e, st.layer_bytes[layer])
    if st.cfg[C_DETAIL]:  # `Timeliness.issued`
        for r in range(a, b):
            if log[r, 3] >= 0:
                _evicted(st, log[r, 3])
            if not st.unused[log[r, 1]]:
                st.unused[log[r, 1]] = True
                st.n[N_UNUSED] += 1


@_kernel
def _land_all(st, t):
    for d in range(st.cfg[C_D]):
        _land(st, d, t)


@_kernel
def _begin(st, t, log, a, b):
    """`StepTimer.begin`: requests start at `t`; their loads (rows `a..b-1`) go on the links."""
    _land_all(st, t)
    if b > a:
        _issue(st, t, log, a, b)
    host = _host_time(st, b - a, b - a)
    if not host:
        return t
    st.acc[A_COMPUTE] += host
    st.device_busy[0] += host
    return t + host


@_inlined
def _wait(st, d, ll, on_device, experts, lo, hi, log, a, nloads, routed, ready):
    """`StepTimer._wait`: when the layer's experts can start (late hits, then demand loads)."""
    late_until = ready
    if st.ntokens[d]:
        late = 0
        for x in range(lo, hi):
            e = experts[x]
            if st.token[e] != 0:
                arrive = _need(st, d, routed, e)
                if arrive > routed:  # still on its way when the router chose it
                    late += 1
                    if arrive > late_until:
                        late_until = arrive
        if late:
            st.n[N_LATE] += late
            st.late_by_layer[ll] += late
    start = late_until
    for r in range(a, a + nloads):
        victim = log[r, 3]
        if victim >= 0 and st.token[victim] != 0:  # its load in flight
            _cancel(st, st.device[victim // st.cfg[C_E]], routed, victim)
        arrive = _demand(st, d, routed, log[r, 1], st.layer_bytes[ll])
        if arrive > start:
            start = arrive
    if st.cfg[C_DETAIL] and (nloads or st.n[N_UNUSED]):
        clock = routed - st.acc[A_STALL_LATE] - st.acc[A_STALL_DEMAND]
        _timeliness_visit(st, ll, on_device, clock, ready, experts, lo, hi, log, a, nloads)
    if start > ready:
        wake = st.par[P_WAKE]
        if wake:
            if late_until == start:
                late_until += wake
            start += wake
        st.acc[A_STALL_LATE] += late_until - ready
        st.acc[A_STALL_DEMAND] += start - late_until
        st.stall_by_layer[ll] += start - ready
    return start


@_kernel
def _experts_time(st, ll, experts, counts, weighted, lo, hi, log, a, ncpu):
    """`StepTimer._experts_time`: token counts that vary, or experts computed on the host."""
    n = hi - lo
    if not ncpu:
        ones = True
        if weighted:
            for x in range(lo, hi):
                ones = ones and counts[x] == 1
        if n == 1 or ones:
            return st.par[P_EXPERT_PASS] + n * st.expert_time[ll]
        total = 0.0
        for x in range(lo, hi):
            total += st.exp_tab[ll, counts[x]]
        return st.par[P_EXPERT_PASS] + total
    for r in range(a, a + ncpu):
        st.on_host[log[r, 1]] = True
    gpu = host = 0.0
    on_gpu = False
    for x in range(lo, hi):
        c = counts[x] if weighted else 1
        if st.on_host[experts[x]]:
            host += st.cpu_tab[ll, c]
        else:
            gpu += st.exp_tab[ll, c]
            on_gpu = True
    for r in range(a, a + ncpu):
        st.on_host[log[r, 1]] = False
    if on_gpu:
        gpu += st.par[P_EXPERT_PASS]
    most = host if host > gpu else gpu
    least = host if host < gpu else gpu
    return most + st.par[P_CPU_SERIAL] * least


@_inlined
def _layer(st, ll, on_device, t, dense, experts, counts, weighted, lo, hi, log, mark, issued, nxt_a, nxt_b):
    """One computed layer of `StepTimer._walk` from `t`; returns when it is done. `issued`:
    this layer's prefetches went out while the layer before ran (an early runtime, `C_EARLY`);
    `nxt_a..nxt_b`: the next layer's prefetch rows, to issue once this layer has routed."""
    pre, a, b = mark[M_PRE], mark[M_ROUTE], mark[M_END]
    cpu = b > a and log[a, 0] == LOG_CPU  # cpu mode: route's rows are its host-computed misses
    nloads = 0 if cpu else b - a
    ncpu = b - a if cpu and st.cfg[C_CPU_MODE] else 0
    d = st.device[ll]
    routed = t + dense
    if st.par[P_DECIDE] or st.par[P_DECIDE_LOAD]:
        routed += st.par[P_DECIDE] + st.par[P_DECIDE_LOAD] * ((a - pre) + nloads)
    if a > pre and not issued:
        _issue(st, t, log, pre, a)
        if st.cfg[C_HOST_COST]:
            routed += _host_time(st, a - pre, a - pre)
    ready = routed
    if st.cfg[C_HOST_COST] and nloads:
        ready += _host_time(st, nloads, 0)
    if st.cfg[C_HOST_COST] and nxt_b > nxt_a:
        ready += _host_time(st, nxt_b - nxt_a, nxt_b - nxt_a)
    start = ready
    if nloads or st.ntokens[d] or (st.cfg[C_DETAIL] and st.n[N_UNUSED]):
        start = _wait(st, d, ll, on_device, experts, lo, hi, log, a, nloads, routed, ready)
    if nxt_b > nxt_a:  # the next layer's prefetches, issued as soon as this layer's router has run
        _issue(st, routed, log, nxt_a, nxt_b)
    if not weighted and not ncpu:  # one token per routed expert, all on the GPU
        run = st.par[P_EXPERT_PASS] + (hi - lo) * st.expert_time[ll]
    else:
        run = _experts_time(st, ll, experts, counts, weighted, lo, hi, log, a, ncpu)
    if start > ready:
        run += st.par[P_RESUME] * (start - ready)
    busy = ready - t + run
    st.acc[A_COMPUTE] += busy
    st.device_busy[on_device] += busy
    return start + run


@_kernel
def run_steps(st, visit_ptr, experts, counts, weighted, log, marks, first, last, begin_a, begin_b, ending,
              dense, head, handover, now, out_start, out_end):
    """Steps `first..last-1` from `now` (`StepTimer.begin`, `step`, `end` in the offline
    driver's order, and its clock arithmetic); per step its start and end go to `out_*`.
    Per-step arrays are indexed from `first`; `begin_a[j]` < 0: no request starts there."""
    L = st.cfg[C_L]
    for s in range(first, last):
        j = s - first
        out_start[j] = now
        t = now
        if begin_a[j] >= 0:
            t = _begin(st, t, log, begin_a[j], begin_b[j])
        on_device = 0
        issued = False  # the running layer's prefetches went out while the layer before ran
        for ll in range(L):
            v = s * L + ll
            lo, hi = visit_ptr[v], visit_ptr[v + 1]
            if lo == hi:
                continue
            d = st.device[ll]
            if st.cfg[C_MULTI] and d != on_device:
                on_device = d
                t += handover[j]
            if st.q_head[d] < st.q_tail[d] or (st.h_size[d] > 0 and st.h_time[d, 0] <= t):
                _land(st, d, t)  # only this layer's experts are observed next
            nxt_a = nxt_b = 0
            if st.cfg[C_EARLY]:  # the next computed layer's prefetch rows
                for l2 in range(ll + 1, L):
                    v2 = s * L + l2
                    if visit_ptr[v2] < visit_ptr[v2 + 1]:
                        nxt_a, nxt_b = marks[v2 - first * L, M_PRE], marks[v2 - first * L, M_ROUTE]
                        break
            t = _layer(st, ll, on_device, t, dense[j], experts, counts, weighted[s], lo, hi, log, marks[v - first * L],
                       issued, nxt_a, nxt_b)
            issued = st.cfg[C_EARLY] != 0
        st.acc[A_COMPUTE] += head[j]
        st.device_busy[on_device] += head[j]
        t = t + head[j]
        now = now + (t - now)  # SimPy's clock arithmetic (env.timeout(t - now))
        out_end[j] = t
        if ending[j]:
            _land_all(st, t)
    return now


@_kernel
def serve_step(mc, order, st, visit_ptr, experts, counts, weighted, marks, begin_a, begin_b, ending, work, now, out):
    """One serving step (`visit_ptr` over its L visits): the twin's decisions (`mc`, in
    decision mode, its request starts already logged; `order`, its victim order), then their price from `now`;
    `work` holds the step's dense, head and hand-over times, `out` gets its start and end."""
    replay_steps(mc, order, visit_ptr, experts, 0, 1, marks)
    run_steps(st, visit_ptr, experts, counts, weighted, mc.log[: mc.reg[R_LOG]], marks, 0, 1, begin_a, begin_b,
              ending, work[0:1], work[1:2], work[2:3], now, out[0:1], out[1:2])


@_kernel
def serve_chain(mc, order, st, visit_ptr, experts, counts, weighted, marks, firsts, steps, begin_a, begin_b, ending_last,
                ending, dense, head, handover, now, limit, ptrs, pos, unweighted, one, out_ptr, out_experts,
                out_counts, out_start, out_end):
    """`steps` steps of the requests whose next own steps (in the batch-1 arrays) are
    `firsts` [P], each step carrying the next one of each (merged as `merge_parts` merges them
    when P > 1), each as `serve_step` would run it from the clock the step before left (the
    first begins the requests logged in `begin_*`; the last ends some if `ending_last`), until
    a step ends at or after `limit`, the next event elsewhere in the simulation, which the
    scheduler must see before it forms another step. Per-step arrays (`dense`, `out_*`, ...)
    are indexed from 0; `begin_a`, `begin_b`, `ending`, `one` (True) are one-element scratch,
    `ptrs` [P, L + 1], `out_*` one merged step's, `unweighted` [P] False. Returns the steps run."""
    P, L = firsts.shape[0], st.cfg[C_L]
    for j in range(steps):
        if j > 0:
            mc.reg[R_LOG] = 0
            begin_a[0] = -1
        ending[0] = ending_last and j == steps - 1
        if P == 1:
            s = firsts[0] + j
            replay_steps(mc, order, visit_ptr, experts, s, s + 1, marks)
            now = run_steps(st, visit_ptr, experts, counts, weighted, mc.log[: mc.reg[R_LOG]], marks, s, s + 1,
                            begin_a, begin_b, ending, dense[j : j + 1], head[j : j + 1], handover[j : j + 1], now,
                            out_start[j : j + 1], out_end[j : j + 1])
        else:
            for p in range(P):
                for ll in range(L + 1):
                    ptrs[p, ll] = visit_ptr[(firsts[p] + j) * L + ll]
            m = merge_parts(ptrs, experts, counts, unweighted, pos, out_ptr, out_experts, out_counts)
            replay_steps(mc, order, out_ptr, out_experts[:m], 0, 1, marks)
            now = run_steps(st, out_ptr, out_experts[:m], out_counts[:m], one, mc.log[: mc.reg[R_LOG]], marks, 0, 1,
                            begin_a, begin_b, ending, dense[j : j + 1], head[j : j + 1], handover[j : j + 1], now,
                            out_start[j : j + 1], out_end[j : j + 1])
        if not limit > now:
            return j + 1
    return steps


@_kernel
def merge_parts(ptrs, experts, counts, weighted, pos, out_ptr, out_experts, out_counts):
    """`trace.merge_steps` over arrays: part `p` routes `experts[ptrs[p, l]:ptrs[p, l + 1]]`
    at layer `l` (token counts in `counts` where `weighted[p]`, else one each); per layer the
    union, first seen first, with the tokens routed to each. `pos` [N] is scratch, all -1 on
    entry and exit. Returns the merged step's visit count."""
    P, L = ptrs.shape[0], ptrs.shape[1] - 1
    m = 0
    for ll in range(L):
        out_ptr[ll] = m
        for p in range(P):
            for i in range(ptrs[p, ll], ptrs[p, ll + 1]):
                e = experts[i]
                c = counts[i] if weighted[p] else 1
                if pos[e] < 0:
                    pos[e] = m
                    out_experts[m] = e
                    out_counts[m] = c
                    m += 1
                else:
                    out_counts[pos[e]] += c
        for i in range(out_ptr[ll], m):
            pos[out_experts[i]] = -1
    out_ptr[L] = m
    return m

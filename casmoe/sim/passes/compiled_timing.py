"""The offline fast path with both passes compiled: the twin decides a chunk, a kernel prices it.

`engine.run_offline` asks the cache (or its compiled twin) for a chunk of steps and prices the
returned records in Python (`timing.StepTimer`). For a built-in policy whose twin decides, this
driver hands the twin's decision log and per-visit marks straight to the compiled timing pass
(`timing_kernel.py`): no Python record per visit, and no Python per layer. What stays Python
is per step (the dense and head times from the requests' context lengths, the latency log) and
per chunk. It runs where the kernel mirrors everything the run needs: one cache (per-layer
capacity on any number of devices, or a global pool on one), decisions made in advance (the
load and cpu miss modes), no timeline and no RAM tier; anything else keeps the Python pass.
After the run it writes the kernel's state back into the `StepTimer`, the links and the
`Timeliness`, so `RunState.result` reads them as after a Python run.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from casmoe.cache import MissMode
from casmoe.compiled import TwinMachine, uses_twin
from casmoe.replay import starts_and_ends
from casmoe.sim.cost.compute import attention_span
from casmoe.sim.passes.decide import CompiledDecider
from casmoe.sim.passes.latency import LatencyLog
from casmoe.sim.passes.timing import work_for
from casmoe.step_arrays import StepArrays
from casmoe.trace import prefill_union
from casmoe.twin import twin_of

RING = 256
"""Initial room per link for queued prefetches and arrivals in flight (grown between chunks)."""
CHAIN = 256
"""Steps of a chain (`ServingPass.chain`) that one serving kernel call decides and prices at most."""


def fits(machine: Any, setup: Any, deciders: Sequence[Any]) -> bool:
    """Whether the compiled timing pass mirrors this run (else the Python pass prices it)."""
    return (
        len(deciders) == 1 and isinstance(deciders[0], CompiledDecider) and not machine.timer.interleaved
        and setup.timeline is None and machine.tier is None
    )


def run(plan: Any, machine: Any, setup: Any, log: LatencyLog, decider: CompiledDecider, chunk_steps: int) -> float:
    """`engine.run_offline` for one compiled decider; returns the makespan."""
    from casmoe.kernels.cache_machine import LOG_PREFETCH
    from casmoe.sim.passes import timing_kernel as tk

    arrays = plan.arrays(0)
    meta = _step_meta(plan.trace, plan.batch, plan.steps, arrays)
    starts, finishing = meta[3], meta[4]
    st = _state(tk, machine, setup, arrays)
    dense, head, handover = _work(plan.trace, plan.batch, meta, setup.compute, len(machine.links) > 1,
                                  setup.positions())
    now = 0.0
    S = arrays.steps
    for c0 in range(0, S, chunk_steps):
        c1 = min(S, c0 + chunk_steps)
        rows, marks, begin_rows = decider.decide(c0, c1, starts, finishing)
        if machine.timer.setup_pending[0] and begin_rows:  # the start-up fill: landed before the clock starts
            first = min(begin_rows)
            a, b = begin_rows[first]
            machine.timer.setup_pending[0] = False
            machine.timer.setup(0, rows[a:b, 1].tolist())
            begin_rows = {**begin_rows, first: (b, b)}
        st = _room(tk, st, int(np.count_nonzero(rows[:, 0] == LOG_PREFETCH)))
        out_start, out_end = np.empty(c1 - c0), np.empty(c1 - c0)
        now = tk.run_steps(st, arrays.visit_ptr, arrays.experts, arrays.counts, arrays.weighted, rows, marks, c0, c1,
                           *_per_step(meta, c0, c1, begin_rows), dense[c0:c1], head[c0:c1], handover[c0:c1], now,
                           out_start, out_end)
        _log(log, plan.trace, meta, plan.batch, c0, c1, out_start.tolist(), out_end.tolist())
    _write_back(tk, st, machine)
    return now


def _step_meta(
    trace: Any, batch: int, steps: Sequence[Any], arrays: StepArrays,
) -> tuple[list[bool], list[int], list[tuple[int, ...]], dict, dict]:
    """Per step (of `steps`, the trace cut at `batch`): whether it is a prefill, its tokens and
    requests; the requests starting and finishing at each step. Batch 1 reads them off the
    arrays (no `Step` objects needed)."""
    if batch != 1:
        starts, finishing = starts_and_ends(steps)
        return [s.prefill for s in steps], [s.tokens for s in steps], [s.requests for s in steps], starts, finishing
    prefill: list[bool] = []
    tokens: list[int] = []
    requests: list[tuple[int, ...]] = []
    starts: dict[int, list[int]] = {}
    finishing: dict[int, list[int]] = {}
    for r, (a, b) in enumerate(zip(arrays.first_step.tolist(), arrays.last_step.tolist())):
        if a < 0:
            continue
        p = trace.requests[r].prefill
        n = b - a + 1
        prefill += [bool(p)] + [False] * (n - 1)
        tokens += [p or 1] + [1] * (n - 1)
        requests += [(r,)] * n
        starts[a] = [r]
        finishing[b] = [r]
    return prefill, tokens, requests, starts, finishing


def _work(trace: Any, batch: int, meta: tuple, compute: Any, multi: bool,
          history: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every step's dense, head and hand-over times (`work_for`'s), from the requests' context
    lengths (each starting at its `history`, `Setup.positions`); at batch 1 over arrays
    (`dense_many`: the same bits, no Python per step)."""
    prefill, tokens, requests = meta[:3]
    S = len(prefill)
    if batch != 1:
        pos = list(history)
        prompts = [r.prefill for r in trace.requests]
        works = [work_for(prefill[s], tokens[s], requests[s], pos, compute, prompts) for s in range(S)]
        dense, head = np.array([w.dense for w in works]), np.array([w.head for w in works])
    else:  # a request's prefill step (T tokens) attends T(T + 1)/2 pairs, its i-th decode token P + i
        T, is_prefill = np.array(tokens, np.int64), np.array(prefill, np.bool_)
        req = np.array([r for (r,) in requests], np.int64)
        first = np.searchsorted(req, req)  # each step's request's first step (requests in order)
        P = np.array([r.prefill for r in trace.requests], np.int64)[req]
        H = np.array(history, np.int64)[req]  # earlier context (`timing.histories`)
        context = H + P + np.arange(S) - first + (P == 0)  # a decode step's position, counting itself
        pairs, kv = attention_span(np.where(is_prefill, 0, context - 1), np.where(is_prefill, T, context),
                                   np.where(is_prefill, H, 0))
        dense, head = compute.dense_many(T, pairs, kv), np.full(S, compute.head(1))
        fixed = {t: compute.step_fixed(t) for t in set(tokens)}
        if any(fixed.values()):  # the runtime's own cost per pass, the dense-only blocks
            head = head + np.array([fixed[t] for t in tokens])
    handover = np.zeros(S)
    if multi:
        per_tokens = {t: compute.handover(t) for t in set(tokens)}
        handover = np.array([per_tokens[t] for t in tokens])
    return dense, head, handover


def _per_step(meta: tuple, c0: int, c1: int, begin_rows: dict[int, tuple[int, int]]) -> tuple[np.ndarray, ...]:
    """The chunk's request-start log rows and finishing flags, for `run_steps`."""
    starts, finishing = meta[3], meta[4]
    n = c1 - c0
    begin_a, begin_b = np.full(n, -1, np.int64), np.zeros(n, np.int64)
    for s in starts:
        if c0 <= s < c1:
            begin_a[s - c0], begin_b[s - c0] = begin_rows[s]
    ending = np.array([s in finishing for s in range(c0, c1)], np.bool_)
    return begin_a, begin_b, ending


def _log(log: LatencyLog, trace: Any, meta: tuple, batch: int, c0: int, c1: int, start: list[float],
         end: list[float]) -> None:
    """The latency log's events of the chunk, as `engine.run_offline` records them."""
    prefill, tokens, requests, starts, finishing = meta
    prompts = [r.prefill for r in trace.requests]
    for j, s in enumerate(range(c0, c1)):
        t0, t = start[j], end[j]
        for r in starts.get(s, ()):
            log.arrive(r, log.arrival.get(r - r % batch, t0))  # a static batch arrives together
            log.admit(r, t0, r % batch + 1)
        if prefill[s]:
            for r in requests[s]:
                log.prefilled(r, prompts[r] if len(requests[s]) > 1 else tokens[s], t)
        else:
            log.decoded(t0, t, requests[s])
        for r in finishing.get(s, ()):
            log.finished(r, t)


def _state(tk: Any, machine: Any, setup: Any, arrays: StepArrays) -> Any:
    """The kernel's state for a fresh machine (links idle, nothing in flight)."""
    timer, shard = machine.timer, machine.shards[0]
    links = machine.links
    compute = setup.compute
    L, E, D = len(shard.device), timer.E, len(links)
    N = L * E
    cfg = np.zeros(tk.N_CFG, np.int64)
    cfg[[tk.C_E, tk.C_L, tk.C_D, tk.C_MULTI, tk.C_CPU_MODE, tk.C_DETAIL, tk.C_HOST_CAP, tk.C_HOST_COST, tk.C_EARLY]] = (
        E, L, D, D > 1, timer.miss_mode is MissMode.CPU, timer.timeliness is not None, links[0].host is not None,
        bool(timer.load_host_s or timer.load_layer_s or timer.beside_s), timer.prefetch_early,
    )
    par = np.zeros(tk.N_PAR)
    par[[tk.P_RATE, tk.P_LATENCY, tk.P_HOST_RATE, tk.P_LOAD_HOST, tk.P_LOAD_LAYER, tk.P_WAKE, tk.P_RESUME, tk.P_BESIDE,
         tk.P_EXPERT_PASS, tk.P_CPU_SERIAL, tk.P_DECIDE, tk.P_DECIDE_LOAD]] = (
        links[0].rate, links[0].latency, links[0].host.rate if links[0].host is not None else 0.0, timer.load_host_s,
        timer.load_layer_s, timer.wake_s, timer.resume_rate, timer.beside_s, compute.expert_pass, compute.cpu_serial,
        timer.decide_s, timer.decide_load_s,
    )
    exp_tab, cpu_tab = _tables(compute, L, arrays.counts, cfg[tk.C_CPU_MODE])
    tl = timer.timeliness
    zf, zi = (lambda *shape: np.zeros(shape)), (lambda *shape: np.zeros(shape, np.int64))  # noqa: E731
    return tk.State(
        cfg=cfg, par=par, acc=zf(5), n=zi(2), device=np.asarray(shard.device, np.int64),
        layer_bytes=np.asarray(shard.expert_bytes, np.int64), expert_time=np.asarray(shard.expert_time, np.float64),
        exp_tab=exp_tab, cpu_tab=cpu_tab, copy_s=np.asarray(tl.copy_s if tl is not None else [0.0] * L),
        stall_by_layer=zf(L), late_by_layer=zi(L), bound_by_layer=zf(L),
        busy_until=zf(D), busy=zf(D), moved=zi(D), cancelled=zi(D), seq=zi(D), ntokens=zi(D), device_busy=zf(D),
        copied=zf(D), bound_by_device=zf(D), q_head=zi(D), q_tail=zi(D), q_expert=zi(D, RING), q_nbytes=zi(D, RING), q_token=zi(D, RING),
        q_enq=zf(D, RING), q_alive=np.zeros((D, RING), np.bool_), h_size=zi(D), h_time=zf(D, RING),
        h_token=zi(D, RING), h_expert=zi(D, RING), token=zi(N), pending=np.full(N, -1, np.int64), arrival=zf(N),
        unused=np.zeros(N, np.bool_), on_host=np.zeros(N, np.bool_),
    )


def _tables(compute: Any, L: int, counts: np.ndarray, cpu_mode: bool) -> tuple[np.ndarray, np.ndarray]:
    """`compute.expert(layer, c)` (and `cpu_expert`) for every token count the steps route."""
    uniq = [1] + np.unique(counts[counts > 1]).tolist()
    exp_tab = np.zeros((L, uniq[-1] + 1))
    cpu_tab = np.zeros((L, uniq[-1] + 1) if cpu_mode else (L, 2))
    for layer in range(L):
        for c in uniq:
            exp_tab[layer, c] = compute.expert(layer, c)
            if cpu_mode:
                cpu_tab[layer, c] = compute.cpu_expert(layer, c)
    return exp_tab, cpu_tab


def _room(tk: Any, st: Any, prefetches: int) -> Any:
    """Grow the rings so a chunk issuing `prefetches` cannot overflow them: each queued prefetch
    commits at most once, so the heap needs its size plus the queue plus the new ones."""
    queued = int((st.q_tail - st.q_head).max())
    need = max(queued + prefetches, int(st.h_size.max()) + queued + prefetches)
    Q = st.q_expert.shape[1]
    if need <= min(Q, st.h_time.shape[1]):
        return st
    size = max(2 * need, 2 * Q)
    D = len(st.q_head)
    moved = {}
    for name in ("q_expert", "q_nbytes", "q_token", "q_enq", "q_alive"):
        old = getattr(st, name)
        new = np.zeros((D, size), old.dtype)
        for d in range(D):
            idx = np.arange(st.q_head[d], st.q_tail[d])  # live ring indices keep their number
            new[d, idx % size] = old[d, idx % Q]
        moved[name] = new
    H = st.h_time.shape[1]
    for name in ("h_time", "h_token", "h_expert"):
        old = getattr(st, name)
        new = np.zeros((D, size), old.dtype)
        new[:, :H] = old
        moved[name] = new
    return st._replace(**moved)


def _write_back(tk: Any, st: Any, machine: Any) -> None:
    """The kernel's accumulators into the Python objects `RunState.result` reads."""
    timer = machine.timer
    timer.compute_s = float(st.acc[tk.A_COMPUTE])
    timer.stall_demand = float(st.acc[tk.A_STALL_DEMAND])
    timer.stall_late = float(st.acc[tk.A_STALL_LATE])
    timer.stall_by_layer = st.stall_by_layer.tolist()
    timer.late = int(st.n[tk.N_LATE])
    timer.late_by_layer = st.late_by_layer.tolist()
    timer.device_busy = st.device_busy.tolist()
    for d, link in enumerate(machine.links):
        link.busy_until, link.busy = float(st.busy_until[d]), float(st.busy[d])
        link.bytes, link.cancelled = int(st.moved[d]), int(st.cancelled[d])
    tl = machine.timeliness
    if tl is not None:
        tl.bound_by_layer = st.bound_by_layer.tolist()
        tl.bound = float(st.acc[tk.A_BOUND])
        tl.bound_by_device = st.bound_by_device.tolist()


class ServingPass:
    """Both passes compiled for the serving scheduler (`serving.Server`): the steps are known
    only as the scheduler forms them, so each (`step`), or each run of steps up to the next
    event elsewhere (`chain`), is read off the trace's batch-1 arrays, decided by the twin and
    priced by the kernel in one call. For a fresh built-in policy that does not read the future
    (oracles re-run on the previous run's steps: they keep the Python passes)."""

    def __init__(self, machine: Any, setup: Any, max_batch: int, arrays: StepArrays | None = None) -> None:
        from casmoe.sim.passes import timing_kernel as tk

        shard = machine.shards[0]
        g = shard.cache.geometry
        self.tk, self.machine, self.setup = tk, machine, setup
        self.L = g.layers
        one, none = np.zeros(1, np.int64), np.zeros(0, np.int64)
        empty = StepArrays(g.layers, one, none, none, none, none, np.zeros(0, np.bool_))
        self.budget = twin_of(type(shard.cache)).state(shard.cache).per_visit * g.layers
        rows = g.total_experts * (max_batch + 2) + self.budget
        self.twin = TwinMachine(shard.cache, empty, log_rows=rows, decide=True)
        self.st = _state(tk, machine, setup, empty)
        self.room = 0  # log rows the rings take before they must be checked again
        self.multi = len(machine.links) > 1
        self.marks = np.zeros((g.layers, 5), np.int64)
        self.begin_a, self.begin_b, self.ending = np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.bool_)
        self.weighted = np.zeros(1, np.bool_)
        self.work = np.zeros(3)  # dense, head, hand-over
        self.out = np.zeros(2)
        self.arrays = arrays  # the trace's batch-1 steps, if built already
        self.batch1: tuple[StepArrays, np.ndarray, np.ndarray, np.ndarray] | None = None  # `_batch1`
        self.offsets = (np.arange(g.layers, dtype=np.int64) * g.experts)[None, :, None]
        self.pos = np.full(g.total_experts, -1, np.int64)  # `merge_parts`' scratch
        self.one = np.ones(1, np.bool_)
        self.history = setup.positions()  # each request's earlier context (`timing.histories`)
        self.merged = np.empty(g.total_experts, np.int64), np.empty(g.total_experts, np.int64)  # a merged step's visits

    @staticmethod
    def fits(machine: Any, setup: Any, compiled: bool | None, whole_prefills: bool) -> bool:
        """Whether this pass mirrors the run. A twin that reads a per-visit guess table
        (`TwinState.guess_rows`: speculative) lays it out by the request's whole-prefill steps, so
        prompts split into chunks take the Python passes (whose policy refuses them)."""
        caches = [shard.cache for shard in machine.shards]
        return (
            len(caches) == 1 and not machine.timer.interleaved and setup.timeline is None and machine.tier is None
            and not caches[0].needs_future and uses_twin(caches[0], setup.trace, compiled)
            and (whole_prefills or not twin_of(type(caches[0])).state(caches[0]).guess_rows)
        )

    def step(self, parts: Sequence[tuple[int, int]], chunk: tuple[int, int], starting: Sequence[int], ending: int,
             work: Any, start: float) -> float:
        """Decide and price one step from `start`: `parts` are its requests' shares, each
        (request, the index of its own step in `Request.steps`, or -1 for the `chunk` of its
        prompt tokens), merged as `trace.merge_steps` merges them; requests `starting` begin
        with it, `ending` finish with it. Returns when it is done."""
        twin, tk = self.twin, self.tk
        mc, km = twin.mc, twin.km
        ptr, experts, counts, weighted = self._arrays_of(parts, chunk)
        if weighted:
            self._tables(counts)
        mc.reg[km.R_LOG] = 0
        for r in starting:
            twin.begin(self.setup.trace.requests[r])
        begin = int(mc.reg[km.R_LOG])
        self._room(begin + len(experts) + self.budget)
        self.begin_a[0], self.begin_b[0], self.ending[0], self.weighted[0] = (
            self._first_begin(starting) if starting else -1), begin, ending > 0, weighted
        self.work[0], self.work[1] = work.dense, work.head
        if self.multi:
            self.work[2] = self.setup.compute.handover(work.tokens)
        tk.serve_step(mc, twin.order, self.st, ptr, experts, counts, self.weighted, self.marks, self.begin_a, self.begin_b,
                      self.ending, self.work, start, self.out)
        for _ in range(ending):
            twin.end()
        return float(self.out[1])

    def _first_begin(self, starting: Sequence[int]) -> int:
        """The first log row of a request start's loads to put on the links: 0, or past them all
        when they are the start-up fill, which lands before the clock starts (`StepTimer.setup`)."""
        timer, mc, km = self.machine.timer, self.twin.mc, self.twin.km
        if not timer.setup_pending[0]:
            return 0
        begin = int(mc.reg[km.R_LOG])
        timer.setup_pending[0] = False
        timer.setup(0, mc.log[:begin, 1].tolist())
        return begin

    def _batch1(self) -> tuple[StepArrays, np.ndarray, np.ndarray, np.ndarray]:
        """The trace's batch-1 steps (`Request.steps`) as arrays, with their dense, head and
        hand-over times; built at the first call."""
        if self.batch1 is None:
            arrays = self.arrays if self.arrays is not None else StepArrays.from_trace(self.setup.trace)
            meta = _step_meta(self.setup.trace, 1, [], arrays)
            self.batch1 = (arrays, *_work(self.setup.trace, 1, meta, self.setup.compute, self.multi, self.history))
            if arrays.weighted.any():
                self._tables(arrays.counts)
        return self.batch1

    def _arrays_of(self, parts: Sequence[tuple[int, int]], chunk: tuple[int, int]) -> tuple[np.ndarray, ...]:
        """A step's visits (`ptr` [L + 1], flat experts, token counts) and whether it counts
        tokens (`Step.counts` is not None): a request's own step is a slice of the batch-1
        arrays, a chunk of a prompt its `prefill_union`; several are merged."""
        arrays, L = self._batch1()[0], self.L
        pieces = []
        for r, k in parts:
            if k < 0:
                req = self.setup.trace.requests[r]
                lens, ids, count = prefill_union(req.topk[chunk[0]:chunk[1]], req.weights[chunk[0]:chunk[1]],
                                                 self.offsets)
                pieces.append((np.concatenate([np.zeros(1, np.int64), np.cumsum(lens)]), ids, count, True))
            else:
                s = int(arrays.first_step[r]) + k
                ptr = arrays.visit_ptr[s * L : (s + 1) * L + 1]
                lo, hi = int(ptr[0]), int(ptr[-1])
                pieces.append((ptr - lo, arrays.experts[lo:hi], arrays.counts[lo:hi], bool(arrays.weighted[s])))
        if len(pieces) == 1:
            return pieces[0]
        sizes = [len(p[1]) for p in pieces]
        starts = np.cumsum([0] + sizes[:-1])
        ptrs = np.stack([p[0] + o for p, o in zip(pieces, starts.tolist())])
        n = sum(sizes)
        out_ptr, out_experts, out_counts = np.empty(L + 1, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
        m = self.tk.merge_parts(ptrs, np.concatenate([p[1] for p in pieces]), np.concatenate([p[2] for p in pieces]),
                                np.array([p[3] for p in pieces], np.bool_), self.pos, out_ptr, out_experts, out_counts)
        return out_ptr, out_experts[:m], out_counts[:m], True

    def chain(self, parts: Sequence[tuple[int, int]], starting: Sequence[int], start: float,
              limit: float) -> tuple[list[float], list[float]]:
        """Requests decoding together (or one alone, its whole prompt first): each of `parts`
        is (request, the index of its next own step in `Request.steps`). Decide and price the
        steps that carry the next step of each, from `start`, as `step` would one by one, until
        one of them finishes or a step ends at or after `limit` (no other process acts before
        then, so the scheduler would have formed these very steps); requests `starting` begin
        with the first. Returns the steps' starts and ends. One kernel call for up to `CHAIN`
        steps, reading the batch-1 arrays: no `Step` objects, no arrays per step."""
        twin, tk = self.twin, self.tk
        mc, km = twin.mc, twin.km
        arrays, dense1, head1, handover1 = self._batch1()
        firsts = np.array([int(arrays.first_step[r]) + k for r, k in parts], np.int64)
        left = min(int(arrays.last_step[r]) + 1 - int(f) for (r, _), f in zip(parts, firsts.tolist()))
        P = len(parts)
        if P > 1:  # one decode token each: dense time over the requests' contexts, as `Server._plan` prices it
            trace, compute = self.setup.trace, self.setup.compute
            history = self.history
            first = np.array([history[r] + int(trace.requests[r].prefill) + k + (trace.requests[r].prefill == 0)
                              for r, k in parts], np.int64)  # each request's next position, counting itself
            position = first[None, :] + np.arange(left, dtype=np.int64)[:, None]  # [left, P]
            pairs, kv = (a.sum(axis=1) for a in attention_span(position - 1, position, 0))
            dense_all = compute.dense_many(np.full(left, P, np.int64), pairs, kv, P)
            fixed = compute.step_fixed(P)
            head_all = np.full(left, compute.head(P) + fixed if fixed else compute.head(P))
            handover_all = np.full(left, compute.handover(P) if self.multi else 0.0)
            self._tables(np.array([P], np.int64))
        mc.reg[km.R_LOG] = 0
        for r in starting:
            twin.begin(self.setup.trace.requests[r])
        self.begin_a[0], self.begin_b[0] = (self._first_begin(starting) if starting else -1), mc.reg[km.R_LOG]
        ptr, L = arrays.visit_ptr, self.L
        ptrs, unweighted = np.empty((P, L + 1), np.int64), np.zeros(P, np.bool_)
        out_ptr, out_experts, out_counts = np.empty(L + 1, np.int64), self.merged[0], self.merged[1]
        starts: list[float] = []
        ends: list[float] = []
        done = 0
        while True:
            n_max = min(left - done, CHAIN)
            lo, hi = firsts + done, firsts + done + n_max
            visits = int((ptr[hi * L] - ptr[lo * L]).sum())
            self._room(int(self.begin_b[0]) + visits + self.budget * n_max)
            if P == 1:
                s = int(lo[0])
                dense, head, handover = dense1[s : s + n_max], head1[s : s + n_max], handover1[s : s + n_max]
            else:
                dense, head = dense_all[done : done + n_max], head_all[done : done + n_max]
                handover = handover_all[done : done + n_max]
            out_start, out_end = np.empty(n_max), np.empty(n_max)
            n = tk.serve_chain(mc, twin.order, self.st, ptr, arrays.experts, arrays.counts, arrays.weighted, self.marks, lo, n_max,
                               self.begin_a, self.begin_b, done + n_max == left, self.ending, dense, head, handover,
                               start, limit, ptrs, self.pos, unweighted, self.one, out_ptr, out_experts, out_counts,
                               out_start, out_end)
            starts += out_start[:n].tolist()
            ends += out_end[:n].tolist()
            stopped, done = n < n_max, done + n
            if done == left:
                for (r, _), f in zip(parts, firsts.tolist()):
                    if f + left == int(arrays.last_step[r]) + 1:
                        twin.end()
                return starts, ends
            start = starts[-1] + (ends[-1] - starts[-1])  # the clock after the last step, as SimPy's
            if stopped or not limit > start:
                return starts, ends
            mc.reg[km.R_LOG] = 0
            self.begin_a[0] = -1

    def _room(self, rows: int) -> None:
        """Grow the rings before a step that may issue `rows` loads, checking their fill only
        when the loads issued since the last check could have used up the room it found."""
        if rows > self.room:
            st = self.st
            self.st = _room(self.tk, st, 2 * rows)
            queued = int((self.st.q_tail - self.st.q_head).max())
            free = min(self.st.q_expert.shape[1] - queued, self.st.h_time.shape[1] - int(self.st.h_size.max()) - queued)
            self.room = free
        self.room -= rows

    def _tables(self, counts: np.ndarray) -> None:
        """Widen the per-count expert times to this step's counts."""
        top = int(counts.max())
        if top >= self.st.exp_tab.shape[1]:
            cpu_mode = bool(self.st.cfg[self.tk.C_CPU_MODE])
            exp_tab, cpu_tab = _tables(self.setup.compute, self.L, np.arange(1, 2 * top + 1), cpu_mode)
            self.st = self.st._replace(exp_tab=exp_tab, cpu_tab=cpu_tab)

    def finish(self) -> None:
        """The run's counters into the cache, the timer, the links and the timeliness."""
        self.twin.sync()
        _write_back(self.tk, self.st, self.machine)

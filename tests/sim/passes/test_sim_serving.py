"""The serving simulator against closed forms: queues, closed loops, tiers, continuous batching,
and the decisions every runtime shares."""

from __future__ import annotations

import numpy as np
import pytest
from support.builders import shaped_preset, sim_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.cache import Access, CacheConfigError, MissMode
from casmoe.geometry import Geometry
from casmoe.policies import POLICIES, get_policy
from casmoe.policies.lru import LRU
from casmoe.replay import replay
from casmoe.sim.cost.compute import FixedCompute
from casmoe.sim.passes.driver import run_trace
from casmoe.sim.passes.assembly import Run
from casmoe.sim.cost.machine import Machine
from casmoe.sim.box.hardware import load_profile
from casmoe.sim.passes.traffic import Arrival, Schedule, ServingError, Traffic
from casmoe.sim.passes.tiers import HostCache, TierError
from casmoe.testing import cases, traces
from casmoe.trace import Request, Trace

HW = load_profile("rtx4090x4")
HW0 = HW.with_values(copy_latency_us=0.0, sources={"copy_latency_us": "test: instant copies of tiny experts"})
FAST = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VARIANTS = [(name, {}) for name in POLICIES if name != "casmoe"] + [("casmoe", {"predictor": "noisy"})]
SERVING_ONLY = {"traffic", "queue_length", "future_runs", "max_batch", "batch"}




def run(trace, policy="lru", capacity=2, hw=HW, **kw):
    return sim_run(trace, policy, capacity, hw, **kw)


def closed(users=1, think=0.0, **kw) -> Traffic:
    return Traffic(Arrival.CLOSED, users=users, think=think, **kw)


# ---- the fast path is the serving path with one user ----------------------------------------


@pytest.mark.parametrize("name,options", VARIANTS, ids=[n + o.get("predictor", "") for n, o in VARIANTS])
@FAST
@given(case=cases(), devices=st.integers(1, 2), mode=st.sampled_from(list(MissMode)), context=st.sampled_from([0, 3000]))
def test_closed_loop_with_zero_think_time_equals_back_to_back(name, options, case, devices, mode, context):
    trace, cap = case.trace, case.capacity
    devices = min(devices, trace.geometry.layers) if cap.per_layer else 1
    kw = dict(options=options, miss_mode=mode, devices=devices, context=context)
    cls = get_policy(name)
    offline = sim_run(trace, cls, cap, HW, **kw).to_dict()
    served = sim_run(trace, cls, cap, HW, traffic=closed(max_batch=1), **kw).to_dict()
    assert {k: v for k, v in served.items() if k not in SERVING_ONLY} == {
        k: v for k, v in offline.items() if k not in SERVING_ONLY
    }


# ---- queueing ---------------------------------------------------------------------------------


def _one_step_requests(n: int) -> Trace:
    """`n` requests of one prompt token and nothing to decode: one step each, always expert 0."""
    g = Geometry(1, 2, 1, hidden=8, intermediate=4, layer_expert_bytes=(1,))
    topk = np.zeros((1, 1, 1), np.int16)
    return Trace(g, [Request(topk, np.ones((1, 1, 1), np.float32), prefill=1) for _ in range(n)])


def test_poisson_arrivals_on_one_server_wait_as_m_d_1():
    # Deterministic service D per request, Poisson arrivals at rate lam, one request at a time:
    # an M/D/1 queue, whose mean wait is rho * D / (2 (1 - rho)) (Pollaczek-Khinchine).
    D, lam, n = 1.0, 0.3, 20_000
    res = run(_one_step_requests(n), "lru", 2, hw=HW0, compute=FixedCompute(layer_s=D),
              traffic=Traffic(Arrival.POISSON, rate=lam, max_batch=1, seed=1))
    rho = lam * D
    assert res.queue_wait_mean_s == pytest.approx(rho * D / (2 * (1 - rho)), rel=0.05)
    assert res.e2e_mean_s == pytest.approx(res.queue_wait_mean_s + D, rel=1e-6)
    assert res.ttft_p50_s >= D and res.requests_per_s == pytest.approx(lam, rel=0.03)
    assert res.queue_mean == pytest.approx(lam * res.queue_wait_mean_s, rel=0.05)  # Little's law


def test_arrivals_recorded_in_the_trace_are_replayed():
    tr = _one_step_requests(3)
    for r, t in zip(tr.requests, (5.0, 0.5, 0.7)):
        r.arrival = t
    res = run(tr, "lru", 2, hw=HW0, compute=FixedCompute(layer_s=1.0), traffic=Traffic(Arrival.TRACE, max_batch=1))
    # served in arrival order: 0.5 -> 1.5, 0.7 waits until 1.5 -> 2.5, 5.0 -> 6.0
    assert res.sim_time_s == pytest.approx(6.0, rel=1e-6)
    assert res.queue_wait_mean_s == pytest.approx(0.8 / 3, rel=1e-6)
    with pytest.raises(ServingError, match="arrival times"):
        run(_one_step_requests(2), traffic=Traffic(Arrival.TRACE))


def test_think_time_spaces_a_users_requests():
    tr = _one_step_requests(4)
    res = run(tr, "lru", 2, hw=HW0, compute=FixedCompute(layer_s=1.0), traffic=closed(users=1, think=2.0, max_batch=1))
    assert res.sim_time_s == pytest.approx(4 * 1.0 + 3 * 2.0, rel=1e-6)
    two = run(tr, "lru", 2, hw=HW0, compute=FixedCompute(layer_s=1.0), traffic=closed(users=2, max_batch=1))
    assert two.sim_time_s == pytest.approx(4.0, rel=1e-6) and two.queue_max == 1


# ---- continuous batching ------------------------------------------------------------------------


@FAST
@given(
    trace=traces(max_tokens=8),
    max_batch=st.integers(1, 4),
    rate=st.floats(0.5, 500.0),
    schedule=st.sampled_from(list(Schedule)),
    chunk=st.integers(1, 6),
    users=st.integers(0, 3),
)
def test_continuous_batching_conserves_tokens_and_never_exceeds_max_batch(trace, max_batch, rate, schedule, chunk, users):
    wl = (Traffic(Arrival.POISSON, rate=rate, max_batch=max_batch, schedule=schedule, chunk=chunk) if not users
          else closed(users=users, max_batch=max_batch, schedule=schedule, chunk=chunk))
    res = run(trace, "lru", trace.geometry.top_k, traffic=wl)
    assert res.prefill_tokens + res.decode_tokens == trace.tokens
    assert 1 <= res.peak_batch <= max_batch or not trace.tokens
    assert res.requests_per_s * res.sim_time_s == pytest.approx(len(trace.requests)) or not trace.tokens
    assert res.mean_batch <= max_batch
    assert res.stats.hits + res.stats.late_hits + res.stats.misses == res.stats.accesses


def test_batched_decode_routes_the_union_and_shares_the_step():
    # Two requests decoding together: each step routes both tokens' experts once; both tokens
    # come out at the step's end, so throughput doubles when experts are resident.
    g = Geometry(2, 4, 1, hidden=8, intermediate=4, layer_expert_bytes=(1, 1))
    rows = np.zeros((5, 2, 1), np.int16)
    reqs = [Request(rows.copy(), np.ones(rows.shape, np.float32), prefill=1) for _ in range(2)]
    compute = FixedCompute(layer_s=1.0)
    one = run(Trace(g, reqs), "lru", 4, compute=compute, traffic=closed(users=2, max_batch=1))
    two = run(Trace(g, reqs), "lru", 4, compute=compute, traffic=closed(users=2, max_batch=2))
    assert one.mean_batch == 1 and two.mean_batch == 2 and two.peak_batch == 2
    assert two.decode_tokens == one.decode_tokens == 8
    assert two.stats.accesses < one.stats.accesses  # the shared expert is routed once per step
    assert two.sim_time_s < one.sim_time_s


# ---- tiers --------------------------------------------------------------------------------------


def _tier_case(chunk: int, host_policy: str = "lru"):
    b = 64_000_000
    g = Geometry(1, 4, 1, hidden=8, intermediate=4, layer_expert_bytes=(b,))
    topk = np.array([[[2]], [[2]]], np.int16)  # two tokens, the same expert
    tr = Trace(g, [Request(topk, np.ones(topk.shape, np.float32), prefill=0)])
    tier = HostCache(2, get_policy(host_policy) if isinstance(host_policy, str) else host_policy, chunk_bytes=chunk)
    res = run(tr, "ondemand", 1, compute=FixedCompute(), host_cache=tier)
    Bs, Ls = HW.storage_read_gbs * 1e9, HW.storage_latency_us * 1e-6
    Bh, Lh = HW.h2d_pinned_gbs * 1e9, HW.copy_latency_us * 1e-6
    return res, b, Bs, Ls, Bh, Lh


def test_a_two_tier_miss_costs_storage_plus_copy_then_a_ram_hit_costs_the_copy():
    res, b, Bs, Ls, Bh, Lh = _tier_case(chunk=10**9)  # one chunk: no overlap
    first = Ls + b / Bs + Lh + b / Bh
    assert res.ttft_mean_s == pytest.approx(first, rel=1e-12)
    assert res.sim_time_s == pytest.approx(first + Lh + b / Bh, rel=1e-12)  # ondemand reloads from RAM
    assert (res.host_misses, res.host_hits, res.storage_bytes) == (1, 1, b)
    assert res.stall_storage_s == pytest.approx(first, rel=1e-12)


def test_a_two_tier_miss_in_chunks_hides_the_copies_behind_the_reads():
    chunk = 16_000_000
    res, b, Bs, Ls, Bh, Lh = _tier_case(chunk=chunk)
    assert Lh + chunk / Bh < chunk / Bs  # the drive is the slower stage
    first = Ls + b / Bs + Lh + chunk / Bh  # the last chunk's copy follows the whole read
    assert res.sim_time_s == pytest.approx(first + Lh + b / Bh, rel=1e-12)


class _PrefetchTwo(LRU):
    """A causal tier policy that prefetches experts 2 and 3 at request start."""

    name = "prefetch-two"

    def prefetch_request(self, request):
        return (2, 3)


def test_a_tier_policy_that_prefetches_at_request_start_reads_into_ram_then_hits():
    # As the backend's RAM tier: request-start prefetches are read into RAM, so the GPU's first
    # load of such an expert is a RAM hit, not a storage read.
    res, b, *_ = _tier_case(chunk=10**9, host_policy=_PrefetchTwo)
    assert res.storage_bytes == 2 * b  # two picks read at request start, nothing on demand
    assert (res.host_misses, res.host_hits) == (0, 2)


def test_tier_errors_are_one_line():
    tr = _one_step_requests(1)
    with pytest.raises(TierError, match="fewer than the 1"):
        run(tr, host_cache=HostCache(0, get_policy("lru")))
    big = HW.with_values(storage_read_gbs=7.0, sources={"storage_read_gbs": "test"})
    g = Geometry(1, 2, 1, layer_expert_bytes=(10**12,))
    huge = Trace(g, [Request(np.zeros((1, 1, 1), np.int16), np.ones((1, 1, 1), np.float32), prefill=1)])
    with pytest.raises(TierError, match="host RAM"):
        run(huge, hw=big, host_cache=HostCache(2, get_policy("lru")))
    with pytest.raises(TierError, match="reads the future"):
        run(tr, host_cache=HostCache(2, get_policy("belady")))
    assert HostCache.parse("3", "lru", [100]).rows == 3 and HostCache.parse("1KB", "lfu", [100]).rows == 10


# ---- one set of decisions -----------------------------------------------------------------------


def _recording(cls):
    """`cls` with every load its events return appended to `log`."""
    log: list[tuple] = []

    def keep(kind, loads):
        log.extend((kind, ld.expert, ld.slot, ld.victim, ld.reason.value) for ld in loads)
        return loads

    class Recorded(cls):  # type: ignore[misc, valid-type]
        def begin_request(self, request):
            return keep("begin", super().begin_request(request))

        def before_layer(self, step, layer):
            return keep("before", super().before_layer(step, layer))

        def route(self, step, layer, experts, *args) -> Access:  # a cache that decides_host gets counts too
            acc = super().route(step, layer, experts, *args)
            keep("route", acc.loads)
            log.append(("misses", tuple(acc.misses)))
            return acc

        def attach_costs(self, costs):  # the same prices in every runtime: the policy's published ones
            pass

    Recorded.name = cls.name
    return Recorded, log


@pytest.mark.parametrize("name,options", VARIANTS, ids=[n + o.get("predictor", "") for n, o in VARIANTS])
@FAST
@given(case=cases(), batch=st.integers(1, 2))
def test_no_policy_decides_differently_in_replay_and_simulate(name, options, case, batch):
    trace, cap = case.trace, case.capacity
    cls, log_replay = _recording(get_policy(name))
    try:
        replay(trace, cls.create(trace.geometry, cap, trace=trace, **options), batch=batch)
    except CacheConfigError as exc:  # speculative reads one request's spec per step: batch 1 only
        assert name == "speculative" and batch > 1 and "batch 1" in str(exc)
        return
    cls2, log_sim = _recording(get_policy(name))
    run_trace(Run(trace, cls2, cap, Machine(shaped_preset(trace.geometry), HW), options=options, batch=batch), compute=FixedCompute())
    assert log_sim == log_replay
    if batch == 1:
        cls3, log_served = _recording(get_policy(name))
        run_trace(Run(trace, cls3, cap, Machine(shaped_preset(trace.geometry), HW), options=options, traffic=closed(max_batch=1)))
        assert log_served[-len(log_replay):] == log_replay or log_served == log_replay

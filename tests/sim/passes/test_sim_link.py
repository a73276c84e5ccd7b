"""The link against a plain reference queue: FIFO copies, demand ahead of queued prefetches."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from casmoe.sim.passes.link import HostCap, Link

RATE = 1e9
LAT = 1e-6


def reference(ops):
    """Arrival times by a direct model of the queue: whenever the wire frees, the oldest queued
    demand starts, else the oldest queued prefetch; a cancelled queued prefetch never starts; a
    needed prefetch joins the demand queue, whose loads are committed: cancelling one only voids
    its arrival (the caller's business). `ops` are (time, kind, expert, bytes)."""
    wire = 0.0
    demands: deque = deque()
    prefetches: deque = deque()
    arrival = {}

    def run_until(now, demand_first):
        nonlocal wire
        while demands or prefetches:
            q = demands if demands else prefetches
            expert, nbytes, enq = q[0]
            start = max(wire, enq)
            if start > now or (start == now and q is prefetches and not demand_first):
                return
            q.popleft()
            wire = start + LAT + nbytes / RATE
            arrival[expert] = wire

    for now, kind, expert, nbytes in ops:
        run_until(now, False)
        if kind == "cancel":  # a demand (or needed prefetch) is committed at once: it still runs
            for item in list(prefetches):
                if item[0] == expert:
                    prefetches.remove(item)
        elif kind == "need":
            for item in list(prefetches):
                if item[0] == expert:
                    prefetches.remove(item)
                    demands.append((expert, item[1], now))
        elif kind == "demand":
            demands.append((expert, nbytes, now))
        else:
            prefetches.append((expert, nbytes, now))
        if kind in ("need", "demand"):
            run_until(now, True)
    run_until(float("inf"), True)
    return arrival


ops_strategy = st.lists(
    st.tuples(
        st.floats(0, 2e-3),
        st.sampled_from(["prefetch", "prefetch", "demand", "cancel", "need"]),
        st.integers(0, 100),
        st.integers(1, 2_000_000),
    ),
    max_size=30,
)


@settings(max_examples=100, deadline=None)
@given(ops=ops_strategy)
def test_link_matches_reference_queue(ops):
    """Each load op loads a fresh expert; cancel and need pick one still in flight."""
    link = Link(RATE, LAT)
    now = 0.0
    in_flight: list[int] = []
    applied = []
    got = {}
    landed_at = {}
    for i, (dt, kind, pick, nbytes) in enumerate(ops):
        now += dt
        if kind in ("cancel", "need"):
            if not in_flight:
                continue
            expert = in_flight[pick % len(in_flight)]
            if kind == "cancel":
                in_flight.remove(expert)
                link.cancel(now, expert)
                got.pop(expert, None)  # a cancelled load never arrives: its earlier need() is void
            else:
                got[expert] = link.need(now, expert)
        else:
            expert = i
            if kind == "demand":  # the caller waits for it and reports its arrival itself
                got[expert] = link.demand(now, expert, nbytes)
            else:
                in_flight.append(expert)
                link.prefetch(now, expert, nbytes)
        applied.append((now, kind, expert, nbytes))
        landed = []
        link.land(now, landed.append)
        for e in landed:
            in_flight.remove(e)
            landed_at[e] = now
    ref = reference(applied)
    for expert, t in got.items():
        assert t == pytest.approx(ref[expert], rel=1e-9, abs=1e-15)
    for expert, seen in landed_at.items():
        assert ref[expert] <= seen * (1 + 1e-12)  # never reported before it lands


def test_demand_never_waits_behind_a_prefetch_queued_after_it():
    link = Link(RATE, LAT)
    link.prefetch(0.0, 1, 1_000_000)  # on the wire 0 .. 1.001 ms
    link.prefetch(0.0, 2, 1_000_000)  # queued
    d = link.demand(1e-4, 3, 1_000)  # jumps ahead of 2, not of 1
    assert d == pytest.approx(1.001e-3 + LAT + 1e-6)
    link.prefetch(2e-4, 4, 1_000_000)  # queued after the demand: cannot delay it
    assert link.need(3e-4, 2) == pytest.approx(d + LAT + 1e-3)  # needed now: next in line


def test_cancelled_queued_load_moves_no_bytes_and_on_wire_arrival_is_ignored():
    link = Link(RATE, LAT)
    link.prefetch(0.0, 1, 1_000_000)
    link.prefetch(0.0, 2, 1_000_000)
    link.land(1e-5, lambda e: None)  # 1 is on the wire now, 2 queued
    link.cancel(1e-5, 2)
    link.cancel(1e-5, 1)
    link.prefetch(2e-5, 1, 1_000_000)  # re-loaded: queues behind its old copy
    seen = []
    link.land(1.5e-3, seen.append)
    assert seen == []  # the old copy of 1 landed at ~1 ms but was cancelled
    link.land(1.0, seen.append)
    assert seen == [1]
    assert link.cancelled == 1 and link.bytes == 2_000_000
    assert link.demand(1.0, 5, 1_000) == pytest.approx(1.0 + LAT + 1e-6)  # idle wire: no wait


def test_a_second_copy_of_a_tracked_expert_supersedes_the_first():
    # a staging slot's trim evicts an in-flight expert without a cancel; the cache then asks for it
    # again: the link keeps one live copy (two queued entries of one expert broke `_advance`)
    link = Link(RATE, LAT)
    link.prefetch(0.0, 1, 1_000_000)
    link.prefetch(0.0, 2, 1_000_000)
    link.prefetch(1e-7, 2, 1_000_000)  # 2 still queued behind 1: its first entry is dropped
    seen = []
    link.land(1.0, seen.append)
    assert seen == [1, 2] and link.cancelled == 1 and link.bytes == 2_000_000
    link.prefetch(2.0, 3, 1_000_000)
    link.supersede(2.0, 3)  # a demand load of 3 is about to go: the prefetch is not waited for
    assert 3 not in link.tokens
    link.land(3.0, seen.append)
    assert seen == [1, 2]


def test_host_cap_shares_bandwidth_between_links():
    host = HostCap(RATE)
    a, b = Link(RATE, 0.0, host), Link(RATE, 0.0, host)
    ta = a.demand(0.0, 1, 1_000_000)
    tb = b.demand(0.0, 1, 1_000_000)
    assert ta == pytest.approx(1e-3) and tb == pytest.approx(2e-3)
    free = Link(RATE, 0.0).demand(0.0, 1, 1_000_000)
    assert free == pytest.approx(1e-3)

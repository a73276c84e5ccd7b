"""The `sch` policy against a straightforward implementation of moe-lrc's SCH definition.

moe-lrc (src/41_sch_calc.py) defines SCH per sequence: at token i an expert's priority is its
count in tokens i..i+m-1 less the uses already served in token i, ties by most recent use;
each of the token's k lookups is checked against the cache as it stood when the token began;
an expert's first use counts as a hit while the cache still has a free slot. The reference below
follows that text directly (a window re-counted every token, a set for the cache).

casmoe's caches never evict an expert that the running layer uses; moe-lrc's lookups are
instantaneous, so it may. The policy therefore equals the reference run with that protection,
and equals the pure definition whenever a token routes one expert (k = 1), where the two rules
cannot differ.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmoe.cache import Capacity
from casmoe.geometry import Geometry
from casmoe.policies import POLICIES
from casmoe.replay import replay
from casmoe.trace import Request, Trace


def moe_lrc_sch_hits(seq: list[tuple[int, ...]], capacity: int, m: int, protect: bool) -> int:
    cache: set[int] = set()
    last: dict[int, int] = {}
    tick = seen = hits = 0
    for i, token in enumerate(seq):
        count: dict[int, int] = {}
        for x in (x for t in seq[i : i + m] for x in t):
            count[x] = count.get(x, 0) + 1
        before = set(cache)
        for x in token:
            if x in before or (x not in last and seen < capacity):
                hits += 1
            if x not in last:
                seen += 1
                last[x] = 0
        for x in token:
            count[x] -= 1
            if x not in cache:
                if len(cache) >= capacity:
                    pool = [y for y in cache if not (protect and y in token)]
                    cache.discard(min(pool, key=lambda y: (count.get(y, 0), last[y])))
                cache.add(x)
            tick += 1
            last[x] = tick
    return hits


@st.composite
def sequences(draw, k: int | None = None):
    experts = draw(st.integers(2, 8))
    k = draw(st.integers(1, min(3, experts))) if k is None else k
    hot = draw(st.integers(k, experts))
    length = draw(st.integers(1, 30))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    topk = np.stack([[rng.choice(hot, k, replace=False)] for _ in range(length)]).astype(np.int16)
    capacity = draw(st.integers(k, experts))
    return Geometry(1, experts, k, hidden=8, intermediate=4), topk, capacity, draw(st.integers(1, 8))


def policy_hits(g: Geometry, topk: np.ndarray, capacity: int, m: int) -> int:
    trace = Trace(g, [Request(topk, np.ones(topk.shape, np.float32), 0)])
    stats = replay(trace, POLICIES["sch"](g, Capacity(capacity), m=m)).stats
    return stats.hits + stats.cold_misses  # moe-lrc counts filling a free slot as a hit


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


@SETTINGS
@given(case=sequences())
def test_sch_policy_equals_moe_lrc_sch_with_the_running_layer_protected(case):
    g, topk, capacity, m = case
    seq = [tuple(int(x) for x in row[0]) for row in topk]
    assert policy_hits(g, topk, capacity, m) == moe_lrc_sch_hits(seq, capacity, m, protect=True)


@SETTINGS
@given(case=sequences(k=1))
def test_sch_policy_equals_pure_moe_lrc_sch_with_one_expert_per_token(case):
    g, topk, capacity, m = case
    seq = [tuple(int(x) for x in row[0]) for row in topk]
    assert policy_hits(g, topk, capacity, m) == moe_lrc_sch_hits(seq, capacity, m, protect=False)


def test_more_lookahead_can_lower_sch():
    """SCH is not Belady. Sequence 0 1 2 0 1 2, two slots, k = 1; 0 and 1 fill free slots.
    m = 2: at token 2 the window (2, 0) keeps 0 and evicts 1; token 3 (0) hits; at token 4 the
    window (1, 2) evicts 0; token 5 (2) hits: 4 hits. m = 3: at token 2 the window (2, 0, 1)
    ties 0 and 1, recency keeps 1 and evicts 0; token 3 misses and evicts 1 (tie with 2, 2 is
    newer); token 4 misses; token 5 hits: 3 hits."""
    g = Geometry(1, 3, 1, hidden=8, intermediate=4)
    seq = [(0,), (1,), (2,), (0,), (1,), (2,)]
    topk = np.array(seq, np.int16).reshape(-1, 1, 1)
    assert [moe_lrc_sch_hits(seq, 2, m, protect=False) for m in (2, 3)] == [4, 3]
    assert [policy_hits(g, topk, 2, m) for m in (2, 3)] == [4, 3]

"""Hit rates of the registered cache policies on the SCH axis, by replaying them.

SCH curves are only meaningful next to what ordinary caches achieve on the same routing, so
the baselines (LRU, LFU, Belady, or any registered policy) are the policies of
`casmoe.policies` themselves, replayed by `casmoe.replay.replay` under the conventions SCH
uses: every token is its own step (prompt tokens too, unless `tokens=decode`), every request
starts with an empty cache, and a miss that fills a free slot counts as a hit
(`CacheStats.warm_hit_rate`, the moe-lrc convention; moe-lrc's `src/50_chr_calc.py` counts
its LRU/LFU/Belady hits the same way). `per_layer` gives each layer its own C-slot cache
(pooled over layers: the per-layer curve), otherwise one cache of C slots serves all layers.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from casmoe.cache import Capacity
from casmoe.compiled import COMPILE_WORTH
from casmoe.policies import get_policy
from casmoe.replay import replay
from casmoe.trace import Request, Trace


def token_trace(trace: Trace, seqs: Sequence[np.ndarray]) -> Trace:
    """The same routing with every token a decode step (`seqs` from `metrics.tokens.sequences`)."""
    k = trace.geometry.top_k
    reqs = [Request(topk=s.astype(np.int16), weights=np.where(s >= 0, 1.0 / k, 0.0).astype(np.float32), prefill=0) for s in seqs]
    return Trace(trace.geometry, reqs, dict(trace.meta))


def replay_hit_rate(
    trace: Trace,
    policy: str,
    slots: int,
    per_layer: bool,
    progress: Callable[[int], object] | None = None,
    **options,
) -> float:
    """Warm hit rate of `policy` with `slots` (per layer or global), a fresh cache per request.

    `trace` should come from `token_trace` so that each token is one step."""
    cls = get_policy(policy)
    hits = accesses = 0
    g = trace.geometry
    compiled = True if trace.tokens * g.layers * g.top_k >= COMPILE_WORTH else None  # many short runs add up
    for i in range(len(trace.requests)):
        sub = trace.subset([i])
        cache = cls.create(sub.geometry, Capacity(slots, per_layer=per_layer), trace=sub, **options)
        st = replay(sub, cache, compiled=compiled).stats
        hits += st.hits + st.late_hits + st.cold_misses
        accesses += st.accesses
        if progress is not None:
            progress(1)
    return hits / accesses if accesses else 0.0

"""SCH, segment cache best hit rate: how well a cache that sees m tokens ahead can do.

The definition is moe-lrc's (arXiv 2505.16056, public code ljcleo/moe-lrc,
`src/41_sch_calc.py` `calc_fsf`, aggregated by `src/42_sch_refine.py`), reimplemented here:

- A cache of C items is kept for every C at once as one Mattson stack (the top C entries are
  the cache of size C). An item's **priority** is `(count, last use)`: `count` is how often it
  is routed in the current token and the next m-1 tokens, minus the uses of it already served
  in the current token; ties go to the most recently used (a global clock that ticks once per
  access, in routing order). A miss in a cache of size C evicts its lowest-priority item.
- A token's accesses are a **batch**: whether each is a hit at size C is decided by its stack
  depth at the *start* of the token (an item evicted by an earlier access of the same token
  still counts as a hit), then the accesses update the stack one by one in routing order.
- An item's **first use** in a sequence counts as a hit for every C larger than the number of
  distinct items seen before it: a cache that still has a free slot fills it for free (the
  cache starts warm). Hence SCH at C = all items is exactly 1, and a sequence that uses D
  distinct items gets exactly min(C, D) more hits than a cold-start count would give it.
- **Per layer**: items are the E experts of one layer, a token's batch its k routed experts
  (in the trace's slot order). **Model level**: items are all L x E experts, a token's batch
  all its layers' experts, layer by layer (moe-lrc concatenates the per-layer top-k).
- Every sequence (request) starts from an empty cache. The curve is hits / requests summed
  over sequences (moe-lrc averages per-sequence rates of equal-length samples: the same
  number), against `rho = C / active` with `active = k` per layer and `L x k` model-wide.
- `NOT_COMPUTED` token-layers issue no accesses and add nothing to any count.

Why it differs from replaying `casmoe.policies` 'sch': the runtime protects the running
layer's experts and serves its hits before its misses (so the recency ticks of one token go
hits-then-misses, not routing order), and model-wide it walks layers in time, so a miss at
layer l can evict what layer l' > l of the same token needs. With one routed expert per layer
(k = 1), per-layer caches, fresh caches per request and `warm_hit_rate`, the two agree exactly
(tests/metrics/test_metrics_sch.py checks it).

The stack update (Mattson et al. 1970, for any priority that does not depend on C): when the
item at depth p is accessed, the running minima ("records") of depths 0..p-1 each move down to
the next record's depth, the last one to depth p, and the accessed item goes to the top. It is
sequential per access, so it runs compiled (`casmoe.kernels.lookahead_stack`), one lane
(independent stack: a sequence, or a sequence x layer) after another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from casmoe.metrics.tokens import MetricsError


@dataclass(frozen=True)
class StackHits:
    """Per lane: `hits[lane, C-1]` accesses that hit a cache of C items, and `requests[lane]`."""

    hits: np.ndarray
    requests: np.ndarray


_LANE_ACCESSES = 1 << 20
"""About how many accesses one kernel call walks before `progress` hears of it."""


def lookahead_hits(batches: np.ndarray, items: int, m: int, progress: Callable[[int], object] | None = None) -> StackHits:
    """SCH hit counts for every cache size, for each lane of `batches` `[lanes, T, B]`.

    `batches[lane, t]` lists the items token t accesses, in order, -1 for none (padding,
    gaps); a lane never accesses an item twice in one token. `progress(n)` is called with the
    number of lane-tokens done (T per lane).
    """
    from casmoe.kernels.lookahead_stack import lanes_hits

    if m < 1:
        raise MetricsError(f"lookahead m must be >= 1 token (got {m})")
    batches = np.ascontiguousarray(batches, dtype=np.int64)
    lanes, T, B = batches.shape
    item_bits = max(items.bit_length(), 1)
    clock_bits = (T * B + 1).bit_length()
    count_shift = item_bits + clock_bits
    if count_shift + (m + 1).bit_length() > 62:
        raise MetricsError(f"sequences too long for the packed SCH priority ({T} tokens x {B} accesses)")
    stat = np.zeros((lanes, items), dtype=np.int64)
    per_call = max(1, _LANE_ACCESSES // max(T * B, 1))  # lanes between progress reports
    for first in range(0, lanes, per_call):
        last = min(first + per_call, lanes)
        if not lanes_hits(batches, first, last, items, m, count_shift, item_bits, stat):
            raise MetricsError(f"an item id lies outside [0, {items}) or repeats within a token")
        if progress is not None:
            progress((last - first) * T)
    return StackHits(np.cumsum(stat, axis=1), (batches >= 0).sum(axis=(1, 2)))


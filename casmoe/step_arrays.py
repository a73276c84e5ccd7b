"""A runtime's step sequence as flat arrays, for compiled runtimes.

`Trace.steps()` gives `Step` objects (lists of lists): convenient for Python runtimes, but
converting millions of small lists is itself slower than a compiled replay. `StepArrays`
holds the same sequence in CSR form: visit `v = step * L + layer` routes
`experts[visit_ptr[v]:visit_ptr[v + 1]]` (flat expert ids, empty for a layer not computed),
in the order the `Step` lists them, with how many tokens routed to each (`counts`, 1 for a
decode token's experts) and which steps carry such counts (`weighted`: a prefill or a batch, the
steps whose `Step.counts` is not None). For batch 1 it is built from the trace's arrays directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Sequence

import numpy as np

from casmoe.trace import NOT_COMPUTED, Request, Step, Trace, prefill_union, visit_csr, visit_uses


@dataclass(frozen=True)
class StepArrays:
    layers: int
    visit_ptr: np.ndarray  # int64 [steps * L + 1]
    experts: np.ndarray  # int64 [routed accesses]
    first_step: np.ndarray  # int64 [requests]: each request's first step, -1 if it has none
    last_step: np.ndarray  # int64 [requests]
    counts: np.ndarray  # int64 [routed accesses]: tokens routed to each
    weighted: np.ndarray  # bool [steps]: the step's `Step.counts` is not None

    @property
    def steps(self) -> int:
        return (len(self.visit_ptr) - 1) // self.layers

    @property
    def accesses(self) -> int:
        return len(self.experts)

    @classmethod
    def from_steps(cls, steps: Sequence[Step], layers: int, requests: int) -> StepArrays:
        visit_ptr, experts = visit_csr(steps, layers)
        counts = np.fromiter(
            chain.from_iterable(chain.from_iterable(s.counts if s.counts is not None else ([1] * len(e) for e in s.experts)
                                                    for s in steps)),
            np.int64, len(experts),
        )
        weighted = np.fromiter((s.counts is not None for s in steps), np.bool_, len(steps))
        first = np.full(requests, -1, np.int64)
        last = np.full(requests, -1, np.int64)
        for i, step in enumerate(steps):
            for r in step.requests:
                if first[r] < 0:
                    first[r] = i
                last[r] = i
        return cls(layers, visit_ptr, experts, first, last, counts, weighted)

    @classmethod
    def from_trace(cls, trace: Trace, batch: int = 1) -> StepArrays:
        """`trace.steps(batch)` as arrays; batch 1 without building `Step` objects."""
        g = trace.geometry
        if batch != 1:
            return cls.from_steps(trace.steps(batch), g.layers, len(trace.requests))
        lens, experts, counts, steps = [], [], [], []
        for r in trace.requests:
            n_lens, n_experts, n_counts = _request_visits(r, g.layers, g.experts)
            lens.append(n_lens)
            experts.append(n_experts)
            counts.append(n_counts)
            steps.append(len(n_lens) // g.layers)
        steps_of = np.array(steps, np.int64)
        last = np.cumsum(steps_of) - 1
        first = last - steps_of + 1
        none = steps_of == 0
        first[none] = last[none] = -1
        all_lens = np.concatenate([np.zeros(1, np.int64)] + lens)
        weighted = np.zeros(int(steps_of.sum()), np.bool_)
        weighted[first[[bool(r.prefill) and f >= 0 for r, f in zip(trace.requests, first.tolist())]]] = True
        none = np.zeros(0, np.int64)
        return cls(g.layers, np.cumsum(all_lens), np.concatenate([none] + experts), first, last,
                   np.concatenate([none] + counts), weighted)

    def uses(self, total_experts: int) -> tuple[np.ndarray, np.ndarray]:
        """Every expert's visits in order, CSR `(use_ptr [N + 1], use_visit)`: the `Future`."""
        return visit_uses(self.visit_ptr, self.experts, total_experts)


def _request_visits(r: Request, L: int, E: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One request's visit lengths, flat experts and their token counts: `Request.steps`
    (prefill as one step, `prefill_union`, then one step per decode token), as arrays."""
    offsets = (np.arange(L, dtype=np.int64) * E)[None, :, None]
    lens, experts, counts = [], [], []
    if r.prefill:
        layer_lens, ids, count = prefill_union(r.topk[: r.prefill], r.weights[: r.prefill], offsets)
        lens.append(layer_lens)
        experts.append(ids)
        counts.append(count)
    dec = r.topk[r.prefill :].astype(np.int64)
    if len(dec):
        routed = dec != NOT_COMPUTED  # [T, L, k]: a gap routes none, a gated token-layer fewer than k
        lens.append(routed.sum(axis=2).ravel())
        experts.append((dec + offsets)[routed])
        counts.append(np.ones(len(experts[-1]), np.int64))
    if not lens:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(lens), np.concatenate(experts), np.concatenate(counts).astype(np.int64)

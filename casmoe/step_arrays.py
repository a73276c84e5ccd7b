"""A runtime's step sequence as flat arrays, for compiled runtimes.

`Trace.steps()` gives `Step` objects (lists of lists): convenient for Python runtimes, but
converting millions of small lists is itself slower than a compiled replay. `StepArrays`
holds the same sequence in CSR form: visit `v = step * L + layer` routes
`experts[visit_ptr[v]:visit_ptr[v + 1]]` (flat expert ids, empty for a layer not computed),
in the order the `Step` lists them. For batch 1 it is built from the trace's arrays directly.
"""

from __future__ import annotations

from dataclasses import dataclass
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

    @property
    def steps(self) -> int:
        return (len(self.visit_ptr) - 1) // self.layers

    @property
    def accesses(self) -> int:
        return len(self.experts)

    @classmethod
    def from_steps(cls, steps: Sequence[Step], layers: int, requests: int) -> StepArrays:
        visit_ptr, experts = visit_csr(steps, layers)
        first = np.full(requests, -1, np.int64)
        last = np.full(requests, -1, np.int64)
        for i, step in enumerate(steps):
            for r in step.requests:
                if first[r] < 0:
                    first[r] = i
                last[r] = i
        return cls(layers, visit_ptr, experts, first, last)

    @classmethod
    def from_trace(cls, trace: Trace, batch: int = 1) -> StepArrays:
        """`trace.steps(batch)` as arrays; batch 1 without building `Step` objects."""
        g = trace.geometry
        if batch != 1:
            return cls.from_steps(trace.steps(batch), g.layers, len(trace.requests))
        lens, experts, counts = [], [], []
        for r in trace.requests:
            n_lens, n_experts = _request_visits(r, g.layers, g.experts)
            lens.append(n_lens)
            experts.append(n_experts)
            counts.append(len(n_lens) // g.layers)
        steps_of = np.array(counts, np.int64)
        last = np.cumsum(steps_of) - 1
        first = last - steps_of + 1
        none = steps_of == 0
        first[none] = last[none] = -1
        all_lens = np.concatenate([np.zeros(1, np.int64)] + lens)
        return cls(g.layers, np.cumsum(all_lens), np.concatenate([np.zeros(0, np.int64)] + experts), first, last)

    def uses(self, total_experts: int) -> tuple[np.ndarray, np.ndarray]:
        """Every expert's visits in order, CSR `(use_ptr [N + 1], use_visit)`: the `Future`."""
        return visit_uses(self.visit_ptr, self.experts, total_experts)


def _request_visits(r: Request, L: int, E: int) -> tuple[np.ndarray, np.ndarray]:
    """One request's visit lengths and flat experts: `Request.steps` (prefill as one step,
    `prefill_union`, then one step per decode token), as arrays."""
    offsets = (np.arange(L, dtype=np.int64) * E)[None, :, None]
    lens, experts = [], []
    if r.prefill:
        layer_lens, ids, _ = prefill_union(r.topk[: r.prefill], r.weights[: r.prefill], offsets)
        lens.append(layer_lens)
        experts.append(ids)
    dec = r.topk[r.prefill :].astype(np.int64)
    if len(dec):
        computed = dec[:, :, 0] != NOT_COMPUTED  # [T, L]
        lens.append((computed * dec.shape[2]).ravel())
        experts.append((dec + offsets)[computed].ravel())
    if not lens:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(lens), np.concatenate(experts)

"""Random traces of any shape, and trace equality field by field."""

from __future__ import annotations

import numpy as np

from casmoe.geometry import Geometry
from casmoe.trace import NOT_COMPUTED, Request, Trace


def random_trace(rng: np.random.Generator, L: int, E: int, k: int, n: int, optional: bool = True) -> Trace:
    """Valid random trace: distinct experts per token-layer, some gap rows, optional arrays."""
    g = Geometry(layers=L, experts=E, top_k=k, hidden=8, intermediate=16)
    reqs = []
    for i in range(n):
        T = int(rng.integers(0, 7))
        topk = np.argsort(rng.random((T, L, E)), axis=2)[:, :, :k].astype(np.int16)
        weights = rng.random((T, L, k)).astype(np.float32)
        if T > 1:
            topk[0, L - 1] = NOT_COMPUTED  # a gap, as engines that skip the last layer write it
            weights[0, L - 1] = 0
        spec = np.roll(topk, -1, axis=1)
        spec[:, L - 1] = NOT_COMPUTED
        reqs.append(
            Request(
                topk=topk,
                weights=weights,
                prefill=int(rng.integers(0, T + 1)),
                prompt=f"prompt {i} \u00e9" if i % 2 else None,
                task="code" if i % 3 else None,
                logits=rng.standard_normal((T, L, E)).astype(np.float32) if optional else None,
                spec=spec if optional else None,
                arrival=float(rng.exponential(2.0)) if optional else None,
                output_ids=rng.integers(0, 50, int(rng.integers(0, 5))).astype(np.int32) if optional else None,
                output=f"said {i}" if optional and i % 2 else None,
            )
        )
    return Trace(g, reqs, {"source_model": "test", "nested": {"a": [1, 2]}})


def assert_same(a: Trace, b: Trace) -> None:
    assert a.geometry == b.geometry
    assert len(a.requests) == len(b.requests)
    for x, y in zip(a.requests, b.requests):
        assert (x.prefill, x.prompt, x.task, x.arrival, x.output) == (y.prefill, y.prompt, y.task, y.arrival, y.output)
        for name in ("topk", "weights", "logits", "spec", "output_ids"):
            u, v = getattr(x, name), getattr(y, name)
            assert (u is None) == (v is None), name
            if u is not None:
                np.testing.assert_array_equal(u, v, err_msg=name)

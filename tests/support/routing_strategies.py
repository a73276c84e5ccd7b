"""Hypothesis strategies for routing metrics (SRP, SCH), shared by their tests: sequences of
routed experts, and the relabelling both metrics must not notice."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import strategies as st


@st.composite
def routed(draw: st.DrawFn, max_layers: int = 3, max_tokens: int = 14, max_seqs: int = 3, max_k: int | None = 3):
    """(E, sequences [T, L, k]): distinct experts per token and layer, k <= `max_k` (None: up to E)."""
    E = draw(st.integers(2, 6))
    k = draw(st.integers(1, E if max_k is None else min(E, max_k)))
    L = draw(st.integers(1, max_layers))
    seqs = []
    for _ in range(draw(st.integers(1, max_seqs))):
        T = draw(st.integers(1, max_tokens))
        perm = draw(st.lists(st.permutations(list(range(E))), min_size=T * L, max_size=T * L))
        seqs.append(np.array([p[:k] for p in perm], dtype=np.int64).reshape(T, L, k))
    return E, seqs


def relabelled(seqs: list[np.ndarray], E: int, rnd: random.Random) -> list[np.ndarray]:
    """The same routing with each layer's experts renamed by its own random permutation."""
    L = seqs[0].shape[1]
    perms = [np.array(rnd.sample(range(E), E)) for _ in range(L)]
    return [np.stack([perms[layer][s[:, layer]] for layer in range(L)], axis=1) for s in seqs]

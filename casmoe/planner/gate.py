"""The confidence gate between matcher and predictor, and the online buffer that grows the index.

The matcher is cheap and exact near prompts it has seen, but guesses far from them; the
predictor generalises but blurs. The seed's gate trusts the matcher when its best cosine
similarity exceeds epsilon (`use_matcher`, kept for planners fitted before `ConfidenceGate`).
`ConfidenceGate` weighs the two by what they measured: the fit data's out-of-fold answers are
binned by the matcher's similarity, and in each bin the matcher's weight is the least-squares
blend of the two answers against the true pattern (clipped to [0, 1]); a query takes its bin's
weight. The trajectory stage joins later, once the request has routed (trajectory.py). Served prompts, with the patterns observed while serving them, wait in a
buffer of `capacity` entries and join the index together when it fills (the seed paper's
online update): batching the inserts keeps them off the per-prompt path.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np


class Source(enum.Enum):
    EAM = "eam"
    EAP = "eap"
    BLEND = "blend"  # the confidence gate's weighted answer
    POPULARITY = "popularity"  # no prompt stage: the fit data's mean pattern


def use_matcher(similarity: np.ndarray, epsilon: float) -> np.ndarray:
    """Bool per query: whether the gate answers with the matcher."""
    return np.asarray(similarity) > epsilon


@dataclass(frozen=True)
class ConfidenceGate:
    """Matcher weight per similarity bin; `edges` [B - 1] split the bins, `weights` [B]."""

    edges: np.ndarray
    weights: np.ndarray

    @classmethod
    def fit(cls, eam: np.ndarray, eap: np.ndarray, similarity: np.ndarray, truth: np.ndarray, bins: int = 5) -> ConfidenceGate:
        """From out-of-fold answers [N, L, E] of both stages, their similarity [N] and the true
        normalised patterns [N, L, E]."""
        sim = np.asarray(similarity, dtype=np.float64)
        bins = max(1, min(bins, len(sim) // 20))  # at least about 20 prompts a bin
        edges = np.quantile(sim, np.linspace(0, 1, bins + 1)[1:-1]) if bins > 1 else np.zeros(0)
        which = np.searchsorted(edges, sim, side="right")
        weights = np.zeros(bins)
        for b in range(bins):
            m = which == b
            d = (eam[m] - eap[m]).astype(np.float64)
            denom = float((d * d).sum())
            weights[b] = np.clip(float((d * (truth[m] - eap[m])).sum()) / denom, 0.0, 1.0) if denom > 0 else 0.0
        return cls(edges, weights)

    def matcher_weight(self, similarity: np.ndarray) -> np.ndarray:
        return self.weights[np.searchsorted(self.edges, np.asarray(similarity, dtype=np.float64), side="right")]

    def blend(self, eam: np.ndarray, eap: np.ndarray, similarity: np.ndarray) -> np.ndarray:
        """[N, L, E]: per query, its bin's weight on the matcher, the rest on the predictor."""
        w = self.matcher_weight(similarity).astype(np.float32)[:, None, None]
        return w * eam + (1.0 - w) * eap

    def to_dict(self) -> dict[str, list[float]]:
        return {"edges": self.edges.tolist(), "weights": self.weights.tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, list[float]]) -> ConfidenceGate:
        edges, weights = np.asarray(d["edges"], dtype=np.float64), np.asarray(d["weights"], dtype=np.float64)
        if weights.ndim != 1 or edges.ndim != 1 or len(weights) != len(edges) + 1:
            raise ValueError("gate needs one more weight than edges")
        if not (np.isfinite(edges).all() and np.isfinite(weights).all()) or (np.diff(edges) < 0).any() \
                or ((weights < 0) | (weights > 1)).any():
            raise ValueError("gate edges must be finite and sorted, its weights in [0, 1]")
        return cls(edges, weights)


class Buffer:
    """Pending (embedding, normalised pattern) pairs; `add` returns them all once full."""

    def __init__(self, capacity: int = 30) -> None:
        if capacity < 1:
            raise ValueError("buffer capacity must be >= 1")
        self.capacity = capacity
        self._embeddings: list[np.ndarray] = []
        self._patterns: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self._embeddings)

    def add(self, embedding: np.ndarray, pattern: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Queue one pair; when the buffer is full, empty it and return the stacked batch."""
        self._embeddings.append(np.asarray(embedding, dtype=np.float32))
        self._patterns.append(np.asarray(pattern, dtype=np.float32))
        if len(self._embeddings) < self.capacity:
            return None
        batch = np.stack(self._embeddings), np.stack(self._patterns)
        self._embeddings, self._patterns = [], []
        return batch

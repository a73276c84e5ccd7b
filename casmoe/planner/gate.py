"""The confidence gate between matcher and predictor, and the online buffer that grows the index.

The matcher is cheap and exact near prompts it has seen, but guesses far from them; the
predictor generalises but blurs. The gate trusts the matcher when its best cosine similarity
exceeds epsilon. Served prompts, with the patterns observed while serving them, wait in a
buffer of `capacity` entries and join the index together when it fills (the seed paper's
online update): batching the inserts keeps them off the per-prompt path.
"""

from __future__ import annotations

import enum

import numpy as np


class Source(enum.Enum):
    EAM = "eam"
    EAP = "eap"


def use_matcher(similarity: np.ndarray, epsilon: float) -> np.ndarray:
    """Bool per query: whether the gate answers with the matcher."""
    return np.asarray(similarity) > epsilon


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

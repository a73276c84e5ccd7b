"""EAM, the expert activation matcher: similar prompts use similar experts.

Keys are all-MiniLM-L6-v2 sentence embeddings (unit length, 384-d; `casmoe.planner.embedding`)
of the prompts seen while fitting, in an hnswlib cosine index; values are their normalised
expert patterns. A query averages the patterns of its `neighbours` nearest keys; its
confidence is the best cosine similarity, which the gate compares with epsilon. The index is non-parametric: new prompts are
added without retraining (the online buffer feeds it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from casmoe.planner.embedding import EMBED_DIM, embed  # noqa: F401  (the keys; planner.py embeds through here)


class Matcher:
    """hnswlib cosine index of prompt embeddings with their normalised patterns as values."""

    def __init__(self, patterns: np.ndarray, index: Any, neighbours: int) -> None:
        self.patterns = np.ascontiguousarray(patterns, dtype=np.float32)  # [N, L, E]
        self.index = index
        self.neighbours = neighbours

    @classmethod
    def build(cls, embeddings: np.ndarray, patterns: np.ndarray, neighbours: int, seed: int = 0) -> Matcher:
        import hnswlib

        index = hnswlib.Index(space="cosine", dim=EMBED_DIM)
        index.init_index(max_elements=max(len(embeddings), 1), M=16, ef_construction=200, random_seed=seed)
        index.set_num_threads(1)  # insertion order fixed: the same fit gives the same graph
        if len(embeddings):
            index.add_items(embeddings, np.arange(len(embeddings)))
        index.set_ef(64)
        return cls(patterns, index, neighbours)

    def __len__(self) -> int:
        return len(self.patterns)

    def add(self, embeddings: np.ndarray, patterns: np.ndarray) -> None:
        """Insert new keys and values (the buffer's flush)."""
        n = len(self.patterns)
        if self.index.get_max_elements() < n + len(embeddings):
            self.index.resize_index(max(2 * n, n + len(embeddings)))
        self.index.add_items(embeddings, np.arange(n, n + len(embeddings)))
        self.patterns = np.concatenate([self.patterns, patterns.astype(np.float32)])

    def query(self, embeddings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean pattern of each query's nearest keys [Q, L, E] and its best similarity [Q]."""
        k = min(self.neighbours, len(self.patterns))
        labels, dist = self.index.knn_query(embeddings, k=k)  # [Q, k], cosine distance = 1 - sim
        return self.patterns[labels].mean(axis=1), 1.0 - dist[:, 0]

    def save(self, folder: Path) -> None:
        from casmoe.output import atomic_open, atomic_path

        with atomic_path(folder / "eam.index") as tmp:
            self.index.save_index(str(tmp))
        with atomic_open(folder / "eam_patterns.npy", "wb") as fh:
            np.save(fh, self.patterns, allow_pickle=False)

    @classmethod
    def load(cls, folder: Path, neighbours: int) -> Matcher:
        import hnswlib

        patterns = np.load(folder / "eam_patterns.npy", allow_pickle=False)
        index = hnswlib.Index(space="cosine", dim=EMBED_DIM)
        index.load_index(str(folder / "eam.index"), max_elements=max(len(patterns), 1))
        index.set_ef(64)
        return cls(patterns, index, neighbours)

    def nbytes(self) -> int:
        """Pattern table plus the index file's size (what the index holds in memory)."""
        return int(self.patterns.nbytes + self.index.index_file_size())

"""EAM, the expert activation matcher: similar prompts use similar experts.

Keys are all-MiniLM-L6-v2 sentence embeddings (unit length, 384-d; `casmoe.planner.embedding`)
of the prompts seen while fitting, in an hnswlib cosine index; values are their normalised
expert patterns. A query averages the patterns of its `neighbours` nearest keys; its
confidence is the best cosine similarity, which the gate compares with epsilon. The index is non-parametric: new prompts are
added without retraining (the online buffer feeds it).
"""

from __future__ import annotations

import errno
import struct
from pathlib import Path
from typing import Any

import numpy as np

from casmoe.output import atomic_open, atomic_path
from casmoe.planner.config import PlannerError
from casmoe.planner.embedding import EMBED_DIM, embed  # noqa: F401  (the keys; planner.py embeds through here)

INDEX, PATTERNS = "eam.index", "eam_patterns.npy"
_HEADER = struct.Struct("<6QiI3QdQ")  # hnswlib's HierarchicalNSW::saveIndex, in order


def index_header(path: Path) -> tuple[int, int]:
    """(dimension, element count) of an hnswlib index file, after checking that the file is as
    long as its header says: hnswlib reads a file of another dimension as garbage, silently."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PlannerError(f"{path}: unreadable ({exc.strerror or exc})") from None
    if len(data) < _HEADER.size:
        raise PlannerError(f"{path}: {len(data)} bytes, too short for an hnswlib index; refit")
    _, _, count, per_element, label_offset, data_offset, *_ = _HEADER.unpack_from(data)
    pos = _HEADER.size + count * per_element
    if not 0 < label_offset - data_offset <= per_element or pos > len(data):
        raise PlannerError(f"{path}: truncated or not an hnswlib index; refit with casmoe planner fit")
    for _ in range(count):  # each element's upper-level link list: a uint32 size, then the links
        if pos + 4 > len(data):
            break
        pos += 4 + int.from_bytes(data[pos : pos + 4], "little")
    if pos != len(data):
        raise PlannerError(f"{path}: {len(data)} bytes where the header implies {pos}: truncated or damaged; refit")
    return (label_offset - data_offset) // 4, count


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
        with atomic_path(folder / INDEX) as tmp:
            self.index.save_index(str(tmp))
            written, expected = tmp.stat().st_size, self.index.index_file_size()
            if written != expected:  # hnswlib ignores write errors (a full disk): check what landed
                raise OSError(errno.ENOSPC, f"wrote {written} of {expected} bytes", str(folder / INDEX))
        with atomic_open(folder / PATTERNS, "wb") as fh:
            np.save(fh, self.patterns, allow_pickle=False)

    @classmethod
    def load(cls, folder: Path, neighbours: int, layers: int, experts: int) -> Matcher:
        """Read and check both files against each other and the planner's geometry: a damaged
        or foreign component is a `PlannerError` naming its file, never a crash or garbage."""
        import hnswlib

        where = folder / PATTERNS
        try:
            patterns = np.load(where, allow_pickle=False)
        except (OSError, ValueError, EOFError, MemoryError) as exc:
            raise PlannerError(f"{where}: not a readable .npy array ({exc}); refit with casmoe planner fit") from None
        if not isinstance(patterns, np.ndarray) or patterns.ndim != 3 or patterns.shape[1:] != (layers, experts) or patterns.dtype != np.float32:
            shape = getattr(patterns, "shape", "?")
            raise PlannerError(
                f"{where}: patterns of shape {shape}, expected float32 [N, {layers}, "
                f"{experts}] for the geometry in planner.json; refit with casmoe planner fit"
            )
        if not len(patterns) or not np.isfinite(patterns).all():
            raise PlannerError(f"{where}: {'no patterns' if not len(patterns) else 'non-finite patterns'}; refit")
        where = folder / INDEX
        dim, count = index_header(where)
        if (dim, count) != (EMBED_DIM, len(patterns)):
            raise PlannerError(
                f"{where}: an index of {count} prompts of dimension {dim}, but {PATTERNS} holds {len(patterns)} "
                f"patterns and embeddings have {EMBED_DIM} dimensions (files from different fits?); refit"
            )
        index = hnswlib.Index(space="cosine", dim=EMBED_DIM)
        try:
            index.load_index(str(where), max_elements=max(len(patterns), 1))
        except (RuntimeError, ValueError, MemoryError) as exc:
            raise PlannerError(f"{where}: damaged hnswlib index ({exc}); refit with casmoe planner fit") from None
        index.set_ef(64)
        return cls(patterns, index, neighbours)

    def nbytes(self) -> int:
        """Pattern table plus the index file's size (what the index holds in memory)."""
        return int(self.patterns.nbytes + self.index.index_file_size())

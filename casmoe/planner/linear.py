"""The linear expert activation predictor: a ridge map from the prompt's sentence embedding to
its normalised expert pattern.

The default learned stage of the cascade. The sentence embedding the matcher computes anyway
carries what the prompt is about; a ridge regression on it (closed form, in the dual: N fit
prompts, not 384 x L x E unknowns) generalises to prompts far from the fit data as well as the
transformer predictor (`eap.py`, kept as `EAPConfig.kind = "transformer"`) did on these
traces, fits in well under a second and predicts with one matrix product, without torch.
Negative outputs are clipped and each layer renormalised; a layer left empty falls back to
the fit data's mean pattern. On disk: `eap_linear.npz` (no pickle).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from casmoe.npz import read_npz, require
from casmoe.output import atomic_open
from casmoe.planner.config import PlannerError

FILE = "eap_linear.npz"


@dataclass
class LinearEAP:
    weights: np.ndarray  # [D + 1, L * E] (last row: the intercept)
    mean: np.ndarray  # [L, E] the fit data's mean pattern

    @classmethod
    def fit(cls, embeddings: np.ndarray, patterns: np.ndarray, l2: float = 1.0) -> LinearEAP:
        """Ridge on centred inputs and targets (the intercept is not shrunk)."""
        N, L, E = patterns.shape
        mean = patterns.mean(axis=0)
        X = np.asarray(embeddings, dtype=np.float64)
        x_mean = X.mean(axis=0)
        X = X - x_mean
        Y = patterns.reshape(N, -1).astype(np.float64) - mean.reshape(1, -1)
        alpha = np.linalg.solve(X @ X.T + l2 * np.eye(N), Y)  # [N, L*E]
        W = X.T @ alpha  # [D, L*E]
        intercept = mean.reshape(1, -1) - x_mean[None] @ W
        return cls(np.vstack([W, intercept]).astype(np.float32), mean.astype(np.float32))

    def predict(self, embeddings: np.ndarray) -> np.ndarray:
        """Normalised patterns float32 [N, L, E] (rows sum to 1)."""
        L, E = self.mean.shape
        raw = np.asarray(embeddings, dtype=np.float32) @ self.weights[:-1] + self.weights[-1]
        out = np.clip(raw, 0.0, None).reshape(-1, L, E)
        total = out.sum(axis=-1, keepdims=True)
        return np.where(total > 0, out / np.where(total > 0, total, 1.0), self.mean[None]).astype(np.float32)

    def save(self, folder: Path) -> None:
        with atomic_open(folder / FILE, "wb") as fh:
            np.savez(fh, weights=self.weights, mean=self.mean)

    @classmethod
    def load(cls, folder: Path, layers: int, experts: int, inputs: int) -> LinearEAP:
        """Read and check `eap_linear.npz` against the planner's geometry and the embedding's
        `inputs` dimensions (a PlannerError naming the file otherwise)."""
        where = folder / FILE
        a = read_npz(where, PlannerError)
        weights = require(a, "weights", (inputs + 1, layers * experts), "f", str(where), PlannerError)
        mean = require(a, "mean", (layers, experts), "f", str(where), PlannerError)
        return cls(weights.astype(np.float32), mean.astype(np.float32))

    def nbytes(self) -> int:
        return int(self.weights.nbytes + self.mean.nbytes)

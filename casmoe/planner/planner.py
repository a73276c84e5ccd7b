"""The planner facade: fit from a trace, predict every layer's experts for a prompt, save, load.

`Planner.predict(prompt)` returns scores [L, E] (higher = more likely used in decode), once per
prompt, before decoding, so a cache can prefetch. Behind it: the matcher (EAM), the predictor
(EAP) and the epsilon gate between them; `observe` feeds served prompts to the online buffer.

On disk a planner is a folder with no pickle anywhere: `planner.json` (geometry, config, fit
data summary), `eam.index` (hnswlib's own format), `eam_patterns.npy`, `eap.safetensors` and
`fit.npz` (the fit data's popularity baselines, casmoe/planner/fitdata.py; folders written
before it existed still load and serve, but cannot be evaluated), and `manifest.json` (every
file's size and SHA-256: the folder is written all at once and checked on load, casmoe/folder.py;
folders from before manifests load with each component's own checks only).

Held-out split: fitting leaves out the requests that evaluation scores. If the trace metadata
labels every request (`meta["splits"]`, one "train" / "heldout" per request, as `casmoe record`
writes from the prompt corpus), the "heldout" ones are held out; otherwise every
`holdout_every`-th request (indices `holdout_every - 1, 2 * holdout_every - 1, ...`, i.e. 20%
with the default 5) is. `holdout_every = 0` fits on every request, labels or not (a planner to
deploy rather than to evaluate). Requests of `exclude_tasks` are never fitted on (`fit_split`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from casmoe.geometry import Geometry
from casmoe.planner.config import EAPConfig, PlannerConfig, PlannerError
from casmoe.planner.fitdata import FitData
from casmoe.planner.gate import Buffer, Source, use_matcher
from casmoe.planner.patterns import expert_patterns, normalise
from casmoe.trace import Trace

if TYPE_CHECKING:
    from casmoe.folder import Manifest
    from casmoe.planner.eam import Matcher
    from casmoe.planner.eap import EAP

FORMAT = "casmoe-planner"
VERSION = 1
META = "planner.json"
EMBED_CACHE = 256
"""Prompts whose embeddings are kept, so `observe` after `predict` does not embed twice."""


def heldout_split(trace: Trace, holdout_every: int) -> tuple[list[int], list[int]]:
    """(fit, held-out) request indices; see the module docstring for the rule."""
    n = len(trace.requests)
    labels = trace.meta.get("splits")
    if not holdout_every:
        test = []
    elif isinstance(labels, list) and len(labels) == n:
        test = [i for i, label in enumerate(labels) if label == "heldout"]
    else:
        test = list(range(holdout_every - 1, n, holdout_every))
    held = set(test)
    return [i for i in range(n) if i not in held], test


def fit_split(trace: Trace, config: PlannerConfig) -> list[int]:
    """Indices of the requests a planner with `config` fits on: the held-out rule's fit part,
    less the requests of `config.exclude_tasks`."""
    fit, _ = heldout_split(trace, config.holdout_every)
    excluded = set(config.exclude_tasks)
    return [i for i in fit if trace.requests[i].task not in excluded]


@dataclass(frozen=True)
class Prediction:
    """One prompt's answer: scores [L, E], which component gave them, the matcher's confidence."""

    scores: np.ndarray
    source: Source
    similarity: float


@dataclass(frozen=True)
class Answers:
    """Both components' answers for many prompts, so any epsilon's cascade is a cheap choice."""

    eam: np.ndarray  # [N, L, E]
    eap: np.ndarray  # [N, L, E]
    similarity: np.ndarray  # [N]

    def cascade(self, epsilon: float) -> np.ndarray:
        return np.where(use_matcher(self.similarity, epsilon)[:, None, None], self.eam, self.eap)


class Planner:
    """Matcher + predictor + gate + buffer for one geometry."""

    def __init__(
        self, geometry: Geometry, config: PlannerConfig, matcher: Matcher, predictor: EAP, fit_data: FitData | None = None
    ) -> None:
        self.geometry = geometry
        self.config = config
        self.fit_data = fit_data  # None: loaded from a folder older than stored baselines
        self.matcher = matcher
        self.predictor = predictor
        self.buffer = Buffer(config.buffer)
        self._embeddings: dict[str, np.ndarray] = {}

    def _embed(self, prompt: str) -> np.ndarray:
        vec = self._embeddings.get(prompt)
        if vec is None:
            from casmoe.planner.eam import embed

            vec = embed([prompt])[0]
            if len(self._embeddings) >= EMBED_CACHE:
                del self._embeddings[next(iter(self._embeddings))]
            self._embeddings[prompt] = vec
        return vec

    def explain(self, prompt: str) -> Prediction:
        """The gated answer with its source and the matcher's best similarity."""
        scores, sim = self.matcher.query(self._embed(prompt)[None])
        similarity = float(sim[0])
        if use_matcher(similarity, self.config.epsilon):
            return Prediction(scores[0], Source.EAM, similarity)
        return Prediction(self.predictor.predict([prompt])[0], Source.EAP, similarity)

    def predict(self, prompt: str) -> np.ndarray:
        """Scores float32 [L, E]: higher = more likely used in decode (rows sum to 1)."""
        return self.explain(prompt).scores

    def answers(self, prompts: Sequence[str], progress: bool = False) -> Answers:
        """Matcher and predictor answers for every prompt (batched; for evaluation)."""
        from casmoe.planner.eam import embed

        eam, sim = self.matcher.query(embed(prompts, progress=progress))
        return Answers(eam, self.predictor.predict(prompts), sim)

    def observe(self, prompt: str, pattern: np.ndarray) -> bool:
        """Buffer a served prompt with its observed pattern [L, E]; True when this filled the
        buffer and its prompts joined the index."""
        if pattern.shape != (self.geometry.layers, self.geometry.experts):
            want = (self.geometry.layers, self.geometry.experts)
            raise PlannerError(f"pattern has shape {pattern.shape}, expected {want}")
        batch = self.buffer.add(self._embed(prompt), normalise(pattern))
        if batch is None:
            return False
        self.matcher.add(*batch)
        return True

    def check(self, trace: Trace, where: str = "trace") -> None:
        """Refuse a trace whose routing shape differs from the one this planner was fitted on."""
        g, t = self.geometry, trace.geometry
        if (g.layers, g.experts, g.top_k) != (t.layers, t.experts, t.top_k):
            raise PlannerError(
                f"planner was fitted on {g.describe()} but {where} has {t.describe()}; "
                f"fit a planner on a trace of this model (casmoe planner fit --trace ...)"
            )

    def nbytes(self) -> dict[str, int]:
        """Bytes held by the planner's own state (the shared sentence model is not counted)."""
        return {"eam": self.matcher.nbytes(), "eap": self.predictor.nbytes()}

    def save(self, folder: str | Path) -> None:
        """Write the planner folder all at once (casmoe/folder.py): a failed or killed save
        leaves the old folder, never one fit's index beside another's weights."""
        from casmoe.folder import write_folder
        from casmoe.output import write_text

        with write_folder(folder, FORMAT, marker=META) as tmp:
            self.matcher.save(tmp)
            self.predictor.save(tmp / "eap.safetensors")
            meta = {
                "format": FORMAT,
                "version": VERSION,
                "geometry": self.geometry.to_dict(),
                "config": self.config.to_dict(),
            }
            if self.fit_data is not None:
                self.fit_data.save(tmp)
                meta["fit"] = self.fit_data.to_dict()
            write_text(tmp / META, json.dumps(meta, indent=2))


def fit_planner(trace: Trace, config: PlannerConfig = PlannerConfig(), progress: bool = False) -> Planner:
    """Fit matcher and predictor on the trace's non-held-out requests."""
    from casmoe.planner.eam import Matcher, embed
    from casmoe.planner.eap import train

    if not trace.has_prompts:
        raise PlannerError("the planner learns from prompts, but this trace has requests without prompt text")
    present = {r.task for r in trace.requests}
    missing = [t for t in config.exclude_tasks if t not in present]
    if missing:
        tasks = ", ".join(sorted(t for t in present if t is not None)) or "none"
        raise PlannerError(f"excluded task {missing[0]!r} has no request in the trace (its tasks: {tasks})")
    fit_idx = fit_split(trace, config)
    if len(fit_idx) < 2:
        raise PlannerError(f"need at least 2 requests to fit a planner, the trace and split leave {len(fit_idx)}")
    part = trace.subset(fit_idx)
    prompts = [r.prompt for r in part.requests]
    patterns = normalise(expert_patterns(part, config.phase, config.weighted))
    matcher = Matcher.build(embed(prompts, progress=progress), patterns, config.neighbours, config.seed)
    predictor = train(prompts, patterns, config.eap, config.seed, progress=progress)
    fit_data = FitData.of(trace, part, patterns)
    return Planner(trace.geometry, config, matcher, predictor, fit_data)


def load_planner(path: str | Path) -> Planner:
    """Read a planner folder written by `Planner.save`: the manifest first (a mixed, truncated
    or damaged folder is refused naming the file), then every component checked against
    `planner.json` and each other; a clear error for anything else."""
    from casmoe.planner.eam import INDEX, PATTERNS, Matcher
    from casmoe.planner.eap import EAP

    folder = Path(path)
    meta, manifest = _read_meta(folder)
    geometry = _geometry(folder, meta)
    try:
        config = PlannerConfig.from_dict(meta.get("config"))
    except (KeyError, TypeError, ValueError) as exc:  # PlannerError is a ValueError
        raise PlannerError(f"{folder / META}: bad config: {exc}") from None
    for name in (INDEX, PATTERNS, "eap.safetensors"):
        if name not in manifest:
            raise PlannerError(f"{folder}: missing {name}")
    matcher = Matcher.load(folder, config.neighbours, geometry.layers, geometry.experts)
    predictor = EAP.load(folder / "eap.safetensors", config.eap, geometry.layers, geometry.experts)
    return Planner(geometry, config, matcher, predictor, _fit_data(folder, meta, geometry))


def read_fit_data(path: str | Path) -> FitData | None:
    """A planner folder's fit data alone (which prompts it saw), without loading its models."""
    folder = Path(path)
    meta, _ = _read_meta(folder)
    return _fit_data(folder, meta, _geometry(folder, meta))


def _read_meta(folder: Path) -> tuple[dict[str, Any], Manifest]:
    """`planner.json` of a folder whose manifest checks out (casmoe/folder.py), and the manifest."""
    from casmoe.folder import FolderError, read_folder

    if not folder.is_dir():
        raise PlannerError(f"{folder}: not a planner folder; write one with casmoe planner fit --out {folder}")
    try:
        manifest = read_folder(folder, FORMAT, "planner (casmoe planner fit)")
    except FolderError as exc:
        raise PlannerError(str(exc)) from None
    where = folder / META
    if META not in manifest:
        raise PlannerError(f"{folder}: not a planner folder (no {META}); write one with casmoe planner fit")
    try:
        meta = json.loads(where.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise PlannerError(f"{where} is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise PlannerError(f"{folder}: not a {FORMAT} v{VERSION} folder")
    return meta, manifest


def _geometry(folder: Path, meta: dict[str, Any]) -> Geometry:
    try:
        return Geometry.from_dict(meta.get("geometry"))
    except (TypeError, ValueError) as exc:  # GeometryError is a ValueError
        raise PlannerError(f"{folder / META}: bad geometry: {exc}") from None


def _fit_data(folder: Path, meta: dict[str, Any], geometry: Geometry) -> FitData | None:
    return FitData.load(folder, meta.get("fit"), geometry.layers, geometry.experts)

"""The planner facade: fit from a trace, predict every layer's experts for a prompt, save, load.

`Planner.predict(prompt)` returns scores [L, E] (higher = more likely used in decode), once per
prompt, before decoding, so a cache can prefetch. Behind it: the matcher (EAM), the predictor
(EAP: linear on the prompt embedding by default, casmoe/planner/linear.py) and the confidence
gate between them (casmoe/planner/gate.py); `observe` feeds served prompts to the online
buffer. The third stage, `planner.trajectory` (casmoe/planner/trajectory.py), refines the
answer from the routing the request shows once it runs: the casmoe policy drives it.

On disk a planner is a folder with no pickle anywhere: `planner.json` (geometry, config, the
stages, the gate's weights, fit data summary), `eam.index` (hnswlib's own format),
`eam_patterns.npy`, `eap_linear.npz` (or `eap.safetensors` for the transformer predictor),
`trajectory.npz` and `fit.npz` (the fit data's popularity baselines, casmoe/planner/fitdata.py;
folders written before it existed still load and serve, but cannot be evaluated), and
`manifest.json` (every file's size and SHA-256: the folder is written all at once and checked
on load, casmoe/folder.py; folders from before manifests load with each component's own checks).

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
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union

import numpy as np

from casmoe.folder import FolderError, read_folder, write_folder
from casmoe.geometry import Geometry
from casmoe.output import write_text
from casmoe.planner.config import PlannerConfig, PlannerError
from casmoe.planner.eam import EMBED_DIM, INDEX, PATTERNS, Matcher, embed
from casmoe.planner.embedding import backend_for
from casmoe.planner.fitdata import FitData
from casmoe.planner.gate import Buffer, ConfidenceGate, Source, use_matcher
from casmoe.planner.linear import FILE as LINEAR_FILE
from casmoe.planner.linear import LinearEAP
from casmoe.planner.patterns import expert_patterns, normalise
from casmoe.planner.trajectory import FILE as TRAJECTORY_FILE
from casmoe.planner.trajectory import Trajectory, fit_trajectory
from casmoe.trace import Trace

if TYPE_CHECKING:
    from casmoe.folder import Manifest
    from casmoe.planner.eam import Matcher
    from casmoe.planner.eap import EAP
    from casmoe.planner.trajectory import Trajectory

FORMAT = "casmoe-planner"
VERSION = 2
"""v2: stages listed in planner.json (a prompt-free planner has the trajectory alone), the
confidence gate, the linear predictor; v1 folders (matcher + transformer, epsilon gate) load."""
META = "planner.json"
STAGE_SETS = (["eam", "eap"], ["eam", "eap", "trajectory"], ["trajectory"])
"""What `planner.json`'s `stages` may list (`Planner.stages`): the prompt stages come together."""
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
    """One prompt's answer: scores [L, E], which stage gave them, the matcher's confidence."""

    scores: np.ndarray
    source: Source
    similarity: float


@dataclass(frozen=True)
class Answers:
    """Both prompt stages' answers for many prompts, so any gate's cascade is a cheap choice."""

    eam: np.ndarray  # [N, L, E]
    eap: np.ndarray  # [N, L, E]
    similarity: np.ndarray  # [N]
    gate: ConfidenceGate | None = None

    def cascade(self, epsilon: float | None = None) -> np.ndarray:
        """The confidence gate's blend, or the seed's epsilon rule when `epsilon` is given (or
        the planner predates the confidence gate)."""
        if epsilon is None and self.gate is not None:
            return self.gate.blend(self.eam, self.eap, self.similarity)
        return np.where(use_matcher(self.similarity, epsilon if epsilon is not None else 0.8)[:, None, None], self.eam, self.eap)


Predictor = Union["EAP", LinearEAP]
Embeddings = Mapping[str, np.ndarray]


class Planner:
    """Matcher + predictor + gate + buffer, and the trajectory stage, for one geometry.

    A planner fitted on a trace without prompts has no prompt stages (`serves_prompts` False):
    it predicts the fit data's popularity before a request routes and leaves the rest to the
    trajectory stage; so does any planner for a request without a prompt."""

    def __init__(
        self, geometry: Geometry, config: PlannerConfig, matcher: Matcher | None, predictor: Predictor | None,
        fit_data: FitData | None = None, gate: ConfidenceGate | None = None, trajectory: Trajectory | None = None,
    ) -> None:
        self.geometry = geometry
        self.config = config
        self.fit_data = fit_data  # None: loaded from a folder older than stored baselines
        self.matcher = matcher
        self.predictor = predictor
        self.gate = gate  # None: the seed's epsilon rule (folders before the confidence gate)
        self.trajectory = trajectory  # None: folders before the trajectory stage
        self.buffer = Buffer(config.buffer)
        self._embeddings: dict[str, np.ndarray] = {}

    @property
    def serves_prompts(self) -> bool:
        return self.matcher is not None and self.predictor is not None

    @property
    def stages(self) -> list[str]:
        out = ["eam", "eap"] if self.serves_prompts else []
        return out + (["trajectory"] if self.trajectory is not None else [])

    def _embed(self, prompt: str) -> np.ndarray:
        vec = self._embeddings.get(prompt)
        if vec is None:
            vec = embed_prompts([prompt], self.config.embedding)[0]
            if len(self._embeddings) >= EMBED_CACHE:
                del self._embeddings[next(iter(self._embeddings))]
            self._embeddings[prompt] = vec
        return vec

    def _predictor_answers(self, prompts: Sequence[str], embeddings: np.ndarray) -> np.ndarray:
        if isinstance(self.predictor, LinearEAP):
            return self.predictor.predict(embeddings)
        return self.predictor.predict(prompts)

    def popularity(self) -> np.ndarray:
        """The fit data's mean decode pattern [L, E]: the answer before any evidence."""
        if self.trajectory is not None:
            return self.trajectory.popularity.astype(np.float32)
        return self.fit_data.popularity if self.fit_data is not None else self.matcher.patterns.mean(axis=0)

    def explain(self, prompt: str | None) -> Prediction:
        """The gated answer with its source and the matcher's best similarity."""
        if prompt is None or not self.serves_prompts:
            return Prediction(self.popularity(), Source.POPULARITY, 0.0)
        vec = self._embed(prompt)[None]
        scores, sim = self.matcher.query(vec)
        similarity = float(sim[0])
        if self.gate is not None:
            eap = self._predictor_answers([prompt], vec)
            return Prediction(self.gate.blend(scores, eap, sim)[0], Source.BLEND, similarity)
        if use_matcher(similarity, self.config.epsilon):
            return Prediction(scores[0], Source.EAM, similarity)
        return Prediction(self._predictor_answers([prompt], vec)[0], Source.EAP, similarity)

    def predict(self, prompt: str | None) -> np.ndarray:
        """Scores float32 [L, E]: higher = more likely used in decode (rows sum to 1)."""
        return self.explain(prompt).scores

    def answers(self, prompts: Sequence[str], progress: bool = False) -> Answers:
        """Matcher and predictor answers for every prompt (batched; for evaluation)."""
        if not self.serves_prompts:
            raise PlannerError("this planner was fitted on a trace without prompts: it has no prompt stages to score")
        emb = embed_prompts(prompts, self.config.embedding, progress=progress)
        eam, sim = self.matcher.query(emb)
        return Answers(eam, self._predictor_answers(prompts, emb), sim, self.gate)

    def observe(self, prompt: str, pattern: np.ndarray) -> bool:
        """Buffer a served prompt with its observed pattern [L, E]; True when this filled the
        buffer and its prompts joined the index."""
        if pattern.shape != (self.geometry.layers, self.geometry.experts):
            want = (self.geometry.layers, self.geometry.experts)
            raise PlannerError(f"pattern has shape {pattern.shape}, expected {want}")
        if not self.serves_prompts:
            return False
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
        out = {"eam": self.matcher.nbytes(), "eap": self.predictor.nbytes()} if self.serves_prompts else {}
        if self.trajectory is not None:
            out["trajectory"] = self.trajectory.nbytes()
        return out

    def save(self, folder: str | Path) -> None:
        """Write the planner folder all at once (casmoe/folder.py): a failed or killed save
        leaves the old folder, never one fit's index beside another's weights."""
        with write_folder(folder, FORMAT, marker=META) as tmp:
            if self.serves_prompts:
                self.matcher.save(tmp)
                if isinstance(self.predictor, LinearEAP):
                    self.predictor.save(tmp)
                else:
                    self.predictor.save(tmp / "eap.safetensors")
            if self.trajectory is not None:
                self.trajectory.save(tmp)
            meta: dict[str, Any] = {
                "format": FORMAT,
                "version": VERSION,
                "geometry": self.geometry.to_dict(),
                "config": self.config.to_dict(),
                "stages": self.stages,
            }
            if self.gate is not None:
                meta["gate"] = self.gate.to_dict()
            if self.fit_data is not None:
                self.fit_data.save(tmp)
                meta["fit"] = self.fit_data.to_dict()
            write_text(tmp / META, json.dumps(meta, indent=2))


def validation_folds(part: Trace, folds: int) -> list[np.ndarray]:
    """Index arrays of the fit data's validation folds: whole tasks when it has two or more
    (so that the gate and the trajectory stage learn how the prompt stages do on tasks they
    never saw: task i joins fold i mod `folds`), else every `folds`-th request."""
    n = len(part.requests)
    tasks = sorted({r.task for r in part.requests if r.task is not None})
    if len(tasks) >= 2:
        fold_of = {t: i % folds for i, t in enumerate(tasks)}
        labels = np.array([fold_of.get(r.task, -1) for r in part.requests])
        labels[labels < 0] = np.flatnonzero(labels < 0) % folds
    else:
        labels = np.arange(n) % folds
    return [np.flatnonzero(labels == f) for f in range(folds) if (labels == f).any()]


def _fit_predictor(cfg: PlannerConfig, prompts: Sequence[str], embeddings: np.ndarray, patterns: np.ndarray, progress: bool) -> Predictor:
    if cfg.eap.kind == "linear":
        return LinearEAP.fit(embeddings, patterns, cfg.eap.ridge)
    from casmoe.planner.eap import train

    return train(prompts, patterns, cfg.eap, cfg.seed, progress=progress)


def _out_of_fold(
    part: Trace, cfg: PlannerConfig, prompts: list[str], embeddings: np.ndarray, patterns: np.ndarray
) -> Answers:
    """Both prompt stages' answers for every fit request from stages fitted without its fold."""
    N = len(prompts)
    eam, eap, sim = np.zeros_like(patterns), np.zeros_like(patterns), np.zeros(N)
    for val in validation_folds(part, cfg.folds):
        train = np.setdiff1d(np.arange(N), val)
        if not len(train):
            continue
        m = Matcher.build(embeddings[train], patterns[train], cfg.neighbours, cfg.seed)
        eam[val], sim[val] = m.query(embeddings[val])
        p = _fit_predictor(cfg, [prompts[i] for i in train], embeddings[train], patterns[train], False)
        eap[val] = p.predict(embeddings[val]) if isinstance(p, LinearEAP) else p.predict([prompts[i] for i in val])
    return Answers(eam, eap, sim)


def fit_planner(
    trace: Trace, config: PlannerConfig = PlannerConfig(), progress: bool = False, *, embeddings: Embeddings | None = None
) -> Planner:
    """Fit every stage on the trace's non-held-out requests: matcher, predictor and confidence
    gate from the prompts, the trajectory stage from the routing. A trace without prompts fits
    the trajectory stage alone (a prompt-free planner, served by that stage). `embeddings`
    (prompt -> its `embed` vector) spares re-embedding prompts a caller fits on repeatedly."""
    with_prompts = [r.prompt is not None for r in trace.requests]
    if any(with_prompts) and not all(with_prompts):
        raise PlannerError("some requests of this trace have prompt text and some have none; fit on one kind")
    present = {r.task for r in trace.requests}
    missing = [t for t in config.exclude_tasks if t not in present]
    if missing:
        tasks = ", ".join(sorted(t for t in present if t is not None)) or "none"
        raise PlannerError(f"excluded task {missing[0]!r} has no request in the trace (its tasks: {tasks})")
    fit_idx = fit_split(trace, config)
    if len(fit_idx) < 2:
        raise PlannerError(f"need at least 2 requests to fit a planner, the trace and split leave {len(fit_idx)}")
    part = trace.subset(fit_idx)
    patterns = normalise(expert_patterns(part, config.phase, config.weighted))
    fit_data = FitData.of(trace, part, patterns)
    stages = fit_prompt_stages(part, config, progress, embeddings=embeddings) if trace.has_prompts else None
    traj = fit_trajectory(
        part, None if stages is None else stages.answers, horizon=config.horizon, cadence=config.cadence,
        neighbours=config.neighbours, seed=config.seed,
    )
    if stages is None:
        return Planner(trace.geometry, config, None, None, fit_data, None, traj)
    return Planner(trace.geometry, config, stages.matcher, stages.predictor, fit_data, stages.gate, traj)


@dataclass(frozen=True)
class PromptStages:
    """The fitted prompt stages and their out-of-fold cascade answers [N, L, E] on the fit
    requests (what the trajectory stage trains on)."""

    matcher: Matcher
    predictor: Predictor
    gate: ConfidenceGate
    answers: np.ndarray


def embed_prompts(prompts: Sequence[str], precision: str, known: Embeddings | None = None, progress: bool = False) -> np.ndarray:
    """`embed(prompts)` at `precision` (a planner config's `embedding`), taking the vectors
    `known` already holds (which must be of that precision)."""
    backend = backend_for(precision)
    if not known:
        return embed(prompts, progress=progress, backend=backend)
    todo = sorted({p for p in prompts if p not in known})
    fresh = dict(zip(todo, embed(todo, progress=progress, backend=backend))) if todo else {}
    return np.stack([known[p] if p in known else fresh[p] for p in prompts])


def fit_prompt_stages(part: Trace, config: PlannerConfig, progress: bool = False, *, embeddings: Embeddings | None = None) -> PromptStages:
    """Matcher, predictor and confidence gate on every request of `part` (all with prompts)."""
    patterns = normalise(expert_patterns(part, config.phase, config.weighted))
    prompts = [r.prompt for r in part.requests]
    vectors = embed_prompts(prompts, config.embedding, embeddings, progress)
    oof = _out_of_fold(part, config, prompts, vectors, patterns)
    gate = ConfidenceGate.fit(oof.eam, oof.eap, oof.similarity, patterns)
    matcher = Matcher.build(vectors, patterns, config.neighbours, config.seed)
    predictor = _fit_predictor(config, prompts, vectors, patterns, progress)
    return PromptStages(matcher, predictor, gate, gate.blend(oof.eam, oof.eap, oof.similarity))


def load_planner(path: str | Path) -> Planner:
    """Read a planner folder written by `Planner.save`: the manifest first (a mixed, truncated
    or damaged folder is refused naming the file), then every component checked against
    `planner.json` and each other; a clear error for anything else."""
    folder = Path(path)
    meta, manifest = _read_meta(folder)
    geometry = _geometry(folder, meta)
    try:
        config = PlannerConfig.from_dict(meta.get("config"))
        stages = meta.get("stages", ["eam", "eap"])  # v1: the two prompt stages
        gate = ConfidenceGate.from_dict(meta["gate"]) if "gate" in meta else None
    except (KeyError, TypeError, ValueError) as exc:  # PlannerError is a ValueError
        raise PlannerError(f"{folder / META}: bad config: {exc}") from None
    if stages not in STAGE_SETS:
        raise PlannerError(f"{folder / META}: stages {stages!r}, expected one of "
                           f"{' or '.join(map(repr, STAGE_SETS))}; refit with casmoe planner fit")
    linear = config.eap.kind == "linear"
    need = ([INDEX, PATTERNS, LINEAR_FILE if linear else "eap.safetensors"] if "eam" in stages else [])
    need += [TRAJECTORY_FILE] if "trajectory" in stages else []
    for name in need:
        if name not in manifest:
            raise PlannerError(f"{folder}: missing {name}")
    matcher = predictor = trajectory = None
    try:
        if "eam" in stages:
            matcher = Matcher.load(folder, config.neighbours, geometry.layers, geometry.experts)
            if linear:
                predictor = LinearEAP.load(folder, geometry.layers, geometry.experts, EMBED_DIM)
            else:
                from casmoe.planner.eap import EAP

                predictor = EAP.load(folder / "eap.safetensors", config.eap, geometry.layers, geometry.experts)
        if "trajectory" in stages:
            trajectory = Trajectory.load(folder, geometry.layers, geometry.experts)
    except PlannerError:
        raise
    except (KeyError, TypeError, ValueError, OSError) as exc:
        raise PlannerError(f"{folder}: bad planner data ({exc}); refit with casmoe planner fit") from exc
    return Planner(geometry, config, matcher, predictor, _fit_data(folder, meta, geometry), gate, trajectory)


def read_fit_data(path: str | Path) -> FitData | None:
    """A planner folder's fit data alone (which prompts it saw), without loading its models."""
    folder = Path(path)
    meta, _ = _read_meta(folder)
    return _fit_data(folder, meta, _geometry(folder, meta))


def _read_meta(folder: Path) -> tuple[dict[str, Any], Manifest]:
    """`planner.json` of a folder whose manifest checks out (casmoe/folder.py), and the manifest."""
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
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") not in (1, VERSION):
        raise PlannerError(f"{folder}: not a {FORMAT} v1 or v{VERSION} folder")
    return meta, manifest


def _geometry(folder: Path, meta: dict[str, Any]) -> Geometry:
    try:
        return Geometry.from_dict(meta.get("geometry"))
    except (TypeError, ValueError) as exc:  # GeometryError is a ValueError
        raise PlannerError(f"{folder / META}: bad geometry: {exc}") from None


def _fit_data(folder: Path, meta: dict[str, Any], geometry: Geometry) -> FitData | None:
    return FitData.load(folder, meta.get("fit"), geometry.layers, geometry.experts)

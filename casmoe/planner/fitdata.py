"""What a planner keeps of the data it was fitted on, so that it can be scored on any trace.

The baselines a planner is judged against (global popularity, per-task popularity) must be what
was knowable from the *fit* data: computed from the evaluated trace instead, they would read the
answers (a popularity of the evaluated requests themselves), and on a trace of unseen tasks they
would not exist. So fitting stores them, with the task names it saw and a fingerprint of the fit
trace, which tells evaluation whether it is scoring the fit trace (then only the requests not
fitted on) or another one (then every request).

It also keeps a 64-bit digest of every fitted prompt, so that an evaluation on another trace
can say how many of the requests it scores have a prompt the planner was fitted on (a
re-recording of the same prompts, say).

On disk: `fit.npz` (float32 arrays `popularity` [L, E], `task_popularity` [T, L, E], uint64
`prompts` [N]; no pickle) and the `fit` entry of `planner.json` (fingerprint, request count,
task names).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from casmoe.npz import read_npz
from casmoe.output import atomic_open
from casmoe.planner.config import PlannerError
from casmoe.trace import Trace

FILE = "fit.npz"


def prompt_digests(prompts: Sequence[str | None]) -> np.ndarray:
    """A uint64 digest per prompt (None hashes as the empty prompt)."""
    return np.array(
        [int.from_bytes(hashlib.blake2b((p or "").encode(), digest_size=8).digest(), "little") for p in prompts],
        dtype=np.uint64,
    )


def fingerprint(trace: Trace) -> str:
    """A digest of the trace's routing, prompts and tasks: equal for the same trace file."""
    h = hashlib.sha256(trace.geometry.describe().encode())
    for r in trace.requests:
        h.update(f"{r.prompt!r}|{r.task!r}|{r.prefill}|{r.tokens}".encode())
        h.update(np.ascontiguousarray(r.topk, dtype=np.int16).tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class FitData:
    """The fit trace's fingerprint, how many of its requests were fitted on, and their baselines."""

    trace: str
    requests: int
    popularity: np.ndarray  # mean normalised pattern [L, E]
    tasks: tuple[str, ...]
    task_popularity: np.ndarray  # per task of `tasks`, its requests' mean pattern [T, L, E]
    prompts: np.ndarray  # digests of the fitted prompts [N] (prompt_digests)

    @classmethod
    def of(cls, trace: Trace, part: Trace, patterns: np.ndarray) -> FitData:
        """Baselines of `part`, the requests of `trace` fitted on (at least one), from their
        normalised patterns [N, L, E] (the ones the planner was fitted to)."""
        tasks = sorted({r.task for r in part.requests if r.task is not None})
        per_task = [patterns[[i for i, r in enumerate(part.requests) if r.task == t]].mean(axis=0) for t in tasks]
        g = trace.geometry
        return cls(
            trace=fingerprint(trace),
            requests=len(part.requests),
            popularity=patterns.mean(axis=0).astype(np.float32),
            tasks=tuple(tasks),
            task_popularity=np.array(per_task, dtype=np.float32).reshape(len(tasks), g.layers, g.experts),
            prompts=prompt_digests([r.prompt for r in part.requests]),
        )

    def fitted_prompts(self, trace: Trace, indices: Sequence[int]) -> int:
        """How many of the requests at `indices` have a prompt the planner was fitted on."""
        seen = prompt_digests([trace.requests[i].prompt for i in indices])
        return int(np.isin(seen, self.prompts).sum())

    def baselines(self, test: Trace, seed: int = 0) -> dict[str, np.ndarray]:
        """Scores [N, L, E] for the test requests: `popularity`, `task_popularity` (the fit data's
        pattern of the request's task; a task the fit data lacks, or no task, gets `popularity`:
        for an unseen task the two coincide), `random`."""
        n, (layers, experts) = len(test.requests), self.popularity.shape
        index = {t: i for i, t in enumerate(self.tasks)}
        per_task = [self.task_popularity[index[r.task]] if r.task in index else self.popularity for r in test.requests]
        return {
            "popularity": np.broadcast_to(self.popularity, (n, layers, experts)),
            "task_popularity": np.stack(per_task) if n else self.popularity[None][:0],
            "random": np.random.default_rng(seed).random((n, layers, experts)),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"trace": self.trace, "requests": self.requests, "tasks": list(self.tasks)}

    def save(self, folder: Path) -> None:
        with atomic_open(folder / FILE, "wb") as fh:
            np.savez(fh, popularity=self.popularity, task_popularity=self.task_popularity, prompts=self.prompts)

    @classmethod
    def load(cls, folder: Path, meta: Any, layers: int, experts: int) -> FitData | None:
        """None for a folder written before planners kept their fit data; a `PlannerError`
        naming the file for one whose arrays or summary are damaged or disagree."""
        if not (folder / FILE).exists() and not (isinstance(meta, dict) and meta):
            return None
        where = folder / FILE
        if not isinstance(meta, dict) or not isinstance(meta.get("trace"), str) \
                or not isinstance(meta.get("requests"), int) or isinstance(meta.get("requests"), bool) \
                or not isinstance(meta.get("tasks"), list) or not all(isinstance(t, str) for t in meta["tasks"]):
            raise PlannerError(f"{folder / 'planner.json'}: bad 'fit' entry (trace, requests, tasks); refit")
        arrays = read_npz(where, PlannerError)
        pop, per_task = arrays.get("popularity"), arrays.get("task_popularity")
        prompts = arrays.get("prompts", np.zeros(0, np.uint64))  # the first fit.npz had none
        tasks = tuple(meta["tasks"])
        if pop is None or pop.shape != (layers, experts) or per_task is None \
                or per_task.shape != (len(tasks), layers, experts) or prompts.ndim != 1 or prompts.dtype != np.uint64:
            raise PlannerError(
                f"{where}: arrays do not match planner.json ({len(tasks)} tasks, {layers} layers x {experts} "
                "experts); files from different fits? refit with casmoe planner fit"
            )
        return cls(meta["trace"], meta["requests"], pop, tasks, per_task, prompts)

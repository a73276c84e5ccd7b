"""A CasMoE planner fitted on first use and kept in the user cache: `casmoe[planner=auto]`.

`casmoe simulate` with no policies runs every policy, CasMoE with a real planner among them:
`casmoe[planner=auto]` is bound (`CasMoE.bind`) to the planner fitted on the run's trace's train
split with the default settings (`PlannerConfig()`: the ridge predictor, no torch training, and
the trajectory stage), so the requests it is scored on are ones it never saw. The planner is
keyed by the trace's content (routing, weights, prompts, tasks, split labels), the settings and
the planner format, and lives in the user cache (`$CASMOE_CACHE`, else `$XDG_CACHE_HOME/casmoe`,
else `~/.cache/casmoe`, where the embedding export lives), written all at once
(`casmoe.folder`): a re-recorded trace is a new key, a killed fit leaves nothing half-written,
and the next run (any process) reads it back instead of fitting. An entry damaged since (a
file cut or edited, a part deleted) is fitted again with a one-line note, never an error; a
cache path that cannot hold folders (`CASMOE_CACHE` naming a file) is one error before the fit.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from casmoe.filekind import one_line
from casmoe.folder import MANIFEST, FolderError
from casmoe.planner.config import PlannerConfig
from casmoe.planner.embedding import cache_dir
from casmoe.planner.planner import VERSION, fit_planner, fit_split, load_planner
from casmoe.trace import Trace

AUTO = "auto"
"""`casmoe[planner=auto]`: the planner of this module, fitted on the run's trace."""


@dataclass(frozen=True)
class CachedPlanner:
    folder: Path
    fit_s: float | None  # seconds the fit took in this call; None: read from the cache
    requests: int  # the requests it was fitted on
    note: str | None = None  # set when a damaged cache entry was fitted again

    def describe(self, label: str = "casmoe[planner=auto]") -> str:
        how = "read from the cache" if self.fit_s is None else f"fitted in {self.fit_s:.0f} s on first use, then cached"
        if self.fit_s is not None and self.note:
            how = f"fitted again in {self.fit_s:.0f} s (the cached one was damaged), then cached"
        return f"{label}: a planner fitted on the trace's {self.requests} train requests, {how} ({self.folder})"


def trace_key(trace: Trace, config: PlannerConfig) -> str:
    """A digest of everything the fit reads: the routing and its weights, prompts, tasks, the
    split labels, the settings, the planner format and casmoe's version."""
    try:
        code = version("casmoe")
    except PackageNotFoundError:
        code = "source"
    h = hashlib.sha256(f"{trace.geometry.describe()} {json.dumps(config.to_dict(), sort_keys=True)} format {VERSION} "
                       f"casmoe {code} splits {json.dumps(trace.meta.get('splits'))}".encode())
    for r in trace.requests:
        h.update(f"{r.prompt!r}|{r.task!r}|{r.prefill}|{r.tokens}".encode())
        h.update(np.ascontiguousarray(r.topk, dtype=np.int16).tobytes())
        h.update(np.ascontiguousarray(r.weights, dtype=np.float32).tobytes())
    return h.hexdigest()[:16]


def cached_planner(trace: Trace, config: PlannerConfig = PlannerConfig()) -> CachedPlanner | None:
    """The planner of `trace` at `config`: from the cache, else fitted now and cached; None for
    a trace without prompts (CasMoE plans from the prompt).

    The cache folder is checked first (`cache_dir(create=True)`: one error naming it, before a
    fit whose result could not be kept). A damaged entry (a truncated file, wrong JSON, a part
    or the manifest missing: anything `load_planner` refuses) is never trusted and never fails
    the run: it is removed and fitted again, with one note on stderr saying so."""
    if not trace.has_prompts:
        return None
    folder = cache_dir(create=True) / f"planner-{trace_key(trace, config)}"
    fitted = len(fit_split(trace, config))
    note = None
    if folder.exists() or folder.is_symlink():
        try:
            if not (folder / MANIFEST).is_file():
                raise FolderError(f"{folder}: no {MANIFEST} (a part is missing)")
            load_planner(folder)
            return CachedPlanner(folder, None, fitted)
        except Exception as exc:  # any damage at all: the entry is the cache's own, fitted again
            note = _damaged(folder, exc)
    t0 = time.perf_counter()
    planner = fit_planner(trace, config)
    planner.save(folder)
    return CachedPlanner(folder, time.perf_counter() - t0, fitted, note)


def _damaged(folder: Path, exc: Exception) -> str:
    """Remove a damaged cache entry and say so in one line on stderr (the line names the entry
    and the fault, and is a note: the run goes on)."""
    reason = one_line(exc, 160)
    if "error" in reason.lower():  # keep the run's one error line its only one
        reason = "unreadable"
    note = f"the cached planner {folder.name} was damaged ({reason}); fitting it again"
    print(f"casmoe: note: {note}", file=sys.stderr)
    if folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder, ignore_errors=True)
    else:
        folder.unlink(missing_ok=True)
    return note

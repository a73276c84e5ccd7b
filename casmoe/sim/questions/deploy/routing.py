"""The routing a plan is fitted and scored on: the user's trace, else the shipped one of the
model's shape, else a synthetic one fitted to the shipped real routing of that model.

A placement chosen from routing is only as good as the routing, so a plan says which it used.
The user's own trace comes first (`--trace`: a recorded or imported `.npz`). Without one, a
shipped trace of the model's layers, experts and top-k (Qwen3-30B-A3B: `synthetic-qwen3-top8.npz`,
fitted to the real Qwen3 trace); without that, the real route CSV of the model in
`traces/real/` (one prompt, recorded with fewer experts per token than the model routes) is
fitted by `casmoe.synthetic_fit`, extended to the model's top-k and sampled into 100 requests
with held-out ones (`casmoe trace synth --like ... --top-k K`), once: the result is kept in the
user cache under the CSV's content and casmoe's version (about a minute of CPU the first time).
A shape with no routing at all gets a generated trace (`casmoe.synthetic`: Zipf popularity, no
fit), and the plan says in capitals that its expert choice is a guess.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from casmoe import synthetic_fit
from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry
from casmoe.importers import read_specs
from casmoe.planner.embedding import cache_dir
from casmoe.presets import ModelPreset
from casmoe.shipped import data_dir
from casmoe.sim.run.spec import casmoe_version, file_digest
from casmoe.synthetic import SynthConfig, generate
from casmoe.trace_io import load_trace, save_trace

SYNTH_REQUESTS = 100
SYNTH_TASKS = 6


class RoutingError(CasmoeError, ValueError):
    """No routing of the model's shape to fit a placement on."""


@dataclass(frozen=True)
class Routing:
    path: Path
    how: str  # in words, for the plan's header


def _shipped_npz() -> list[Path]:
    return sorted(data_dir().glob("*.npz"))


def _npz_shape(path: Path) -> tuple[int, int, int] | None:
    """(layers, experts, top_k) from a trace file's metadata alone (None: not a casmoe trace)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(bytes(npz["meta"]).decode())
        geo = meta["geometry"]
        return int(geo["layers"]), int(geo["experts"]), int(geo["top_k"])
    except Exception:  # not a casmoe trace: not a candidate
        return None


def _csv_shape(path: Path) -> tuple[int, int, int] | None:
    """(layers, experts, routed per token) from a route CSV's `#` header, without reading it."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.startswith("#"):
                break
            m = re.search(r"n_layer=(\d+)\s+n_expert=(\d+)\s+n_expert_used=(\d+)", line)
            if m:
                return int(m.group(1)), int(m.group(2)), int(m.group(3))
    return None


def resolve(preset: ModelPreset, given: str | None, progress: Callable[[str], object] | None = None) -> Routing:
    """The trace file a plan uses for `preset` (see the module docstring)."""
    g = preset.geometry
    if given:
        path = Path(given)
        if not path.exists():
            raise RoutingError(f"trace {given} not found")
        tr = load_trace(path)
        if (tr.geometry.layers, tr.geometry.experts) != (g.layers, g.experts):
            raise RoutingError(f"trace {given} has {tr.geometry.describe()}; {preset.name} has {g.layers} MoE layers x "
                               f"{g.experts} experts: give a trace of this model (casmoe trace import)")
        return Routing(path, f"your trace {path.name} ({len(tr.requests)} requests)")
    best = None
    for path in _shipped_npz():
        shape = _npz_shape(path)
        if shape and shape[:2] == (g.layers, g.experts):
            rank = (shape[2] == g.top_k, path.stat().st_size)
            if best is None or rank > best[0]:
                best = (rank, path, shape[2])
    if best is not None and best[0][0]:
        _, path, k = best
        return Routing(path, f"the shipped {path.name} (routing of {preset.name}'s shape, top-{k}; no --trace given)")
    for csv in sorted((data_dir() / "real").glob("*.route.csv")):
        shape = _csv_shape(csv)
        if shape and shape[:2] == (g.layers, g.experts):
            return Routing(_synthesized(csv, preset, progress), f"synthetic routing fitted to the real {csv.name} "
                           f"(one recorded prompt at top-{shape[2]}) and extended to top-{g.top_k}: "
                           f"{SYNTH_REQUESTS} requests (no --trace given; record or import yours for a placement "
                           "fitted to your own requests)")
    if best is not None:
        _, path, k = best
        return Routing(path, f"the shipped {path.name} (top-{k}: another top-k than {preset.name}'s {g.top_k}; no "
                             "--trace given)")
    return Routing(_generated(preset), f"GENERATED routing of {preset.name}'s shape (Zipf popularity, not fitted to "
                                       "any recorded routing: no shipped trace has this shape): which experts it keeps "
                                       "on the GPU is a guess; give --trace (casmoe trace import turns vLLM, SGLang "
                                       "and llama.cpp routing dumps into one)")


def _generated(preset: ModelPreset) -> Path:
    """A synthetic trace of the preset's shape (`casmoe.synthetic`, default knobs), cached."""
    g = preset.geometry
    shape = Geometry(g.layers, g.experts, g.top_k, hidden=g.hidden, intermediate=g.intermediate, gated=g.gated)
    key = hashlib.sha256(f"{shape.describe()} {SYNTH_REQUESTS}".encode()).hexdigest()[:12]
    folder = cache_dir(create=True) / "plan-routing"
    path = folder / f"generated-{preset.name}-{key}.npz"
    if not path.exists():
        tr = generate(shape, SynthConfig(requests=SYNTH_REQUESTS // 2, seed=0, meta={"model_preset": preset.name}))
        folder.mkdir(parents=True, exist_ok=True)
        save_trace(tr, path)
    return path


def _synthesized(csv: Path, preset: ModelPreset, progress: Callable[[str], object] | None) -> Path:
    k = preset.geometry.top_k
    key = hashlib.sha256(f"{file_digest(csv)} {k} {SYNTH_REQUESTS} {SYNTH_TASKS} {casmoe_version()}".encode()).hexdigest()[:12]
    folder = cache_dir(create=True) / "plan-routing"
    path = folder / f"{csv.name.removesuffix('.route.csv')}-top{k}-{key}.npz"
    if path.exists():
        return path
    if progress:
        progress(f"fitting synthetic {preset.name} routing to {csv.name} (once; kept in {folder})")
    [(name, source)] = read_specs([str(csv)])
    fitted = synthetic_fit.with_tasks(synthetic_fit.fit(source, name, 0), SYNTH_TASKS, 0.5, 0)
    if k != fitted.geometry.top_k:
        fitted = synthetic_fit.with_top_k(fitted, k)
    tr = synthetic_fit.sample(fitted, SYNTH_REQUESTS, 0)
    tr.meta["model_preset"] = preset.name
    tr.meta["synth_like"] = {"source": csv.name, "requests": SYNTH_REQUESTS, "tasks": SYNTH_TASKS, "top_k": k,
                             "command": f"casmoe trace synth OUT.npz --like {csv} --requests {SYNTH_REQUESTS} "
                                        f"--tasks {SYNTH_TASKS} --seed 0 --top-k {k}"}
    folder.mkdir(parents=True, exist_ok=True)
    save_trace(tr, path)
    return path

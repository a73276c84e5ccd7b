"""TensorRT-LLM's expert statistics (`EXPERT_STATISTIC_ITER_RANGE`, `EXPERT_STATISTIC_PATH`)
-> a popularity profile.

The folder holds `meta_info.json` (`num_experts`, `num_experts_per_token`, written by rank 0)
and one `rank{r}.safetensors` per rank whose tensors are named `{iteration}_{layer}`, each the
count of tokens routed to every expert `[num_experts]` in that iteration and layer. Counts are
summed over ranks and iterations, as TensorRT-LLM's own load-balancer scripts do; the layer ids
are the model's decoder layers that hold MoE, kept in order. Other files of the folder
(`rank{r}_raw.safetensors` with per-token ids, co-occurrence files) are not read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from casmoe.filekind import TEXT, one_line, require
from casmoe.importers.dump_files import distinct_files
from casmoe.profile import Profile, ProfileError, from_engine_counts

_RANK_FILE = re.compile(r"rank(\d+)\.safetensors")
_KEY = re.compile(r"(\d+)_(\d+)")


def read_trtllm(sources: Sequence[str | Path], *, model_layers: int | None = None) -> Profile:
    """One expert-statistic folder (or its files) -> Profile."""
    paths = [Path(s) for s in sources]
    folder = paths[0] if len(paths) == 1 and paths[0].is_dir() else None
    files = sorted(folder.iterdir()) if folder else paths
    if not folder and len({p.parent for p in paths}) != 1:
        raise ProfileError("give TensorRT-LLM's expert-statistic folder (or files of one folder)")
    where = str(folder or paths[0].parent)
    meta_file = (folder or paths[0].parent) / "meta_info.json"
    if meta_file.exists():
        require(meta_file, TEXT, "TensorRT-LLM's meta_info.json", ProfileError)
    try:
        info = json.loads(meta_file.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise ProfileError(f"{where}: no meta_info.json (TensorRT-LLM writes it with the rank files)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ProfileError(f"{meta_file}: not readable JSON: {one_line(exc)}") from None
    E = info.get("num_experts") if isinstance(info, dict) else None
    if type(E) is not int or E < 1:
        raise ProfileError(f"{meta_file}: needs an integer num_experts >= 1, got {E!r}")
    ranks = distinct_files([p for p in files if _RANK_FILE.fullmatch(p.name)], ProfileError, same_bytes=False)
    if not ranks:
        raise ProfileError(f"{where}: no rank{{r}}.safetensors files")
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    per_layer: dict[int, np.ndarray] = {}
    iterations: set[int] = set()
    for f in ranks:
        require(f, {"safetensors"}, "a TensorRT-LLM rank file (safetensors)", ProfileError)
        try:
            tensors = load_file(str(f))
        except (SafetensorError, OSError, ValueError) as exc:
            raise ProfileError(f"{f}: not a readable safetensors file: {one_line(exc)}") from None
        for key, counts in tensors.items():
            m = _KEY.fullmatch(key)
            if not m:
                raise ProfileError(f"{f}: tensor {key!r} is not named ITERATION_LAYER")
            if counts.shape != (E,) or not np.issubdtype(counts.dtype, np.integer) or (counts < 0).any():
                raise ProfileError(f"{f}: {key} must hold {E} non-negative integer counts, got {counts.dtype} {counts.shape}")
            iteration, layer = int(m[1]), int(m[2])
            iterations.add(iteration)
            per_layer[layer] = per_layer.get(layer, 0) + counts.astype(np.float64)
    if not per_layer:
        raise ProfileError(f"{where}: the rank files hold no counts (was the iteration range ever reached?)")
    layer_ids = sorted(per_layer)
    counts = np.stack([per_layer[i] for i in layer_ids])  # [MoE layers, E]
    profile = from_engine_counts(counts, where, model_layers=model_layers, meta={
        "source": "TensorRT-LLM expert statistics", "files": [p.name for p in ranks],
        "iterations": [min(iterations), max(iterations)],
        "top_k": info.get("num_experts_per_token"),
    })
    kept = [layer_ids[i] for i in profile.meta["moe_layers"]]
    return Profile(profile.counts, {**profile.meta, "moe_layers": kept})

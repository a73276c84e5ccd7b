"""KTransformers' activation frequencies -> a popularity profile.

With `--record-kt-gpu-expert-distribution` the server records how often each expert of each
layer is activated, and `--kt-expert-placement-strategy frequency` later reads the `.pt` file
back (through `--init-expert-location`) to choose the experts kept on the GPU: a `torch.save`d
tensor `[layers, experts]`, or `[steps, layers, experts]` summed over the steps, or a dict whose
`logical_count` is such a tensor (SGLang's stat dump). Layers are the model's decoder layers;
dense ones count nothing and are dropped. Loaded with `weights_only=True` only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from casmoe.importers.dump_files import engine_files
from casmoe.importers.torch_file import load_torch_file
from casmoe.profile import Profile, ProfileError, from_engine_counts


def frequency_table(obj: object, where: str) -> np.ndarray:
    """[layers, experts] counts from a tensor or a dict with `logical_count`, summed over steps."""
    if isinstance(obj, dict):
        if "logical_count" not in obj:
            raise ProfileError(f"{where}: a dict without 'logical_count' (keys: {', '.join(map(str, obj))})")
        obj = obj["logical_count"]
    if not isinstance(obj, np.ndarray) or obj.ndim not in (2, 3):
        shape = getattr(obj, "shape", type(obj).__name__)
        raise ProfileError(f"{where}: expected a tensor [layers, experts] or [steps, layers, experts], got {shape}")
    return (obj.sum(axis=0) if obj.ndim == 3 else obj).astype(np.float64)


def read_ktransformers(sources: Sequence[str | Path], *, model_layers: int | None = None) -> Profile:
    """One or more `.pt` frequency files, or their folder (summed) -> Profile."""
    paths = engine_files(sources, (".pt",), "KTransformers")
    tables = [frequency_table(load_torch_file(p), str(p)) for p in paths]
    if len({t.shape for t in tables}) != 1:
        raise ProfileError(f"the files disagree on [layers, experts]: {sorted({t.shape for t in tables})}")
    return from_engine_counts(sum(tables), ", ".join(map(str, paths)), model_layers=model_layers, meta={
        "source": "KTransformers activation frequency", "files": [p.name for p in paths]})

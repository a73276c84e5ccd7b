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
from casmoe.profile import Profile, ProfileError, count_array, from_engine_counts


def frequency_table(obj: object, where: str) -> np.ndarray:
    """[layers, experts] counts from a tensor or a dict with `logical_count`, summed over steps.

    The tensor must hold counts (`casmoe.profile.count_array`): a boolean mask or a table of
    anything but finite non-negative numbers is refused before it is summed."""
    if isinstance(obj, dict):
        if "logical_count" not in obj:
            keys = ", ".join(map(str, list(obj)[:8])) + (" ..." if len(obj) > 8 else "")
            raise ProfileError(f"{where}: a torch.save file of a dict without 'logical_count' (keys: {keys}), not "
                               "activation counts [layers, experts] or an SGLang stat dump")
        obj = obj["logical_count"]
    if not isinstance(obj, np.ndarray) or obj.ndim not in (2, 3):
        shape = list(obj.shape) if isinstance(obj, np.ndarray) else type(obj).__name__
        raise ProfileError(f"{where}: expected a tensor of counts [layers, experts] or [steps, layers, experts], "
                           f"got {shape}")
    counts = count_array(obj, where)
    return counts.sum(axis=0) if counts.ndim == 3 else counts


def read_ktransformers(sources: Sequence[str | Path], *, model_layers: int | None = None) -> Profile:
    """One or more `.pt` frequency files, or their folder (summed) -> Profile."""
    paths = engine_files(sources, (".pt",), "KTransformers", ProfileError)
    tables = [frequency_table(load_torch_file(p, "KTransformers activation frequencies (.pt)", ProfileError), str(p))
              for p in paths]
    if len({t.shape for t in tables}) != 1:
        raise ProfileError(f"the files disagree on [layers, experts]: {sorted({t.shape for t in tables})}")
    return from_engine_counts(sum(tables), ", ".join(map(str, paths)), model_layers=model_layers, meta={
        "source": "KTransformers activation frequency", "files": [p.name for p in paths]})

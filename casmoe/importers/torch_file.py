"""`torch.save` files (SGLang and KTransformers dumps) read without executing pickled code.

`torch.load(..., weights_only=True)` rebuilds only tensors, dicts, lists, tuples, numbers and
strings; anything else in the pickle (a class, a function) is refused and so is the file. The
tensors come back as numpy arrays, so the readers never touch torch themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


from casmoe.trace import TraceError


def _to_numpy(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        return t.float().numpy() if t.dtype in (torch.bfloat16, torch.float16) else t.numpy()
    if isinstance(obj, dict):
        return {k: _to_numpy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_numpy(v) for v in obj]
    return obj


def load_torch_file(path: str | Path) -> Any:
    """The file's object with tensors as numpy arrays; `TraceError` for a missing, damaged or
    pickled-code file (one line naming it)."""
    import pickle

    import torch

    where = str(path)
    if not Path(path).is_file():
        raise TraceError(f"{where}: no such file")
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TraceError(
            f"{where}: refused: it holds pickled Python objects beyond tensors, lists and numbers, which casmoe never "
            f"loads ({first[:160]})"
        ) from None
    except Exception as exc:  # zip, EOF and torch's own errors for a damaged or foreign file
        raise TraceError(f"{where}: not a readable torch.save file: {type(exc).__name__}: {str(exc)[:160]}") from None
    return _to_numpy(obj)

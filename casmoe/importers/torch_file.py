"""`torch.save` files (SGLang and KTransformers dumps) read without executing pickled code.

`torch.load(..., weights_only=True)` rebuilds only tensors, dicts, lists, tuples, numbers and
strings; anything else in the pickle (a class, a function) is refused and so is the file. The
tensors come back as numpy arrays, so the readers never touch torch themselves.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

from casmoe.filekind import TORCH, one_line, require
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


def load_torch_file(path: str | Path, what: str = "a torch.save file", error: type[Exception] = TraceError) -> Any:
    """The file's object with tensors as numpy arrays; `error` in one line naming the file for a
    missing, damaged or pickled-code file, and for a file of another kind (a zip, an `.npz`, a
    plain pickle: `casmoe.filekind`), named as what it is, not `what`."""
    import torch

    where = str(path)
    require(path, TORCH, what, error)
    try:
        with warnings.catch_warnings():  # torch's notes on pickle protocols: the file is refused or read, no more
            warnings.simplefilter("ignore")
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if "Unsupported" in ln or "GLOBAL" in ln]
        raise error(
            f"{where}: refused: it holds pickled Python objects beyond tensors, lists and numbers, which casmoe never "
            f"loads ({lines[0][:160] if lines else one_line(exc, 160)})"
        ) from None
    except MemoryError as exc:
        raise error(f"{where}: out of memory reading it ({one_line(exc)}); check the sizes it declares") from None
    except Exception as exc:  # zip, EOF and torch's own errors for a damaged or foreign file
        raise error(f"{where}: not a readable torch.save file: {type(exc).__name__}: {one_line(exc, 160)}") from None
    return _to_numpy(obj)

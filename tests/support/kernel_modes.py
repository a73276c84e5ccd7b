"""Run a module's numba kernels as the plain Python they are written in (`py_func`).

Compiled numba code does not check array bounds: an index past an array writes memory and a
test can still pass. Interpreted, the same index raises IndexError, so the equality tests run
each kernel both ways (interpreted on their small hypothesis inputs is fast enough)."""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from typing import Iterator

import pytest


@contextmanager
def kernels(module: str, compiled: bool) -> Iterator[None]:
    """Inside the block, `module`'s kernels are compiled (as shipped) or interpreted."""
    mod = importlib.import_module(module)
    with pytest.MonkeyPatch.context() as mp:
        if not compiled:
            for name, obj in list(vars(mod).items()):
                if hasattr(obj, "py_func"):
                    mp.setattr(mod, name, obj.py_func)
        yield

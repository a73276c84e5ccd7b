"""casmoe: expert offloading for mixture-of-experts models.

One `ExpertCache` interface for every cache policy, a count-only replay, a SimPy simulator
(`casmoe.sim`) and a torch backend (`casmoe.backends`) that run the same policy objects.
Importing this package imports nothing heavy (no torch, transformers or matplotlib).
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from casmoe.cache import Access, CacheStats, Capacity, ExpertCache, Load, LoadReason, MissMode
    from casmoe.geometry import ExpertId, Geometry, Quant
    from casmoe.trace import Future, Request, Step, Trace, TraceError

_HOME = {
    **dict.fromkeys(("Access", "CacheStats", "Capacity", "ExpertCache", "Load", "LoadReason", "MissMode"), "casmoe.cache"),
    **dict.fromkeys(("ExpertId", "Geometry", "Quant"), "casmoe.geometry"),
    **dict.fromkeys(("Future", "Request", "Step", "Trace", "TraceError"), "casmoe.trace"),
}


def __getattr__(name: str) -> Any:
    """The public names load with their module on first use, so that `casmoe.cli` (whose
    `--help` should start in a blink) does not pay for numpy through this package."""
    if name not in _HOME:
        raise AttributeError(f"module 'casmoe' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)


__version__ = "0.1.0"

__all__ = [
    "Access",
    "CacheStats",
    "Capacity",
    "ExpertCache",
    "ExpertId",
    "Future",
    "Geometry",
    "Load",
    "LoadReason",
    "MissMode",
    "Quant",
    "Request",
    "Step",
    "Trace",
    "TraceError",
]

"""casmoe: expert offloading for mixture-of-experts models.

One `ExpertCache` interface for every cache policy, a count-only replay, a SimPy simulator
(`casmoe.sim`) and a torch backend (`casmoe.backends`) that run the same policy objects.
Importing this package imports nothing heavy (no torch, transformers or matplotlib).
"""

from casmoe.cache import Access, CacheStats, Capacity, ExpertCache, Load, LoadReason, MissMode
from casmoe.geometry import ExpertId, Geometry, Quant
from casmoe.trace import Future, Request, Step, Trace, TraceError

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

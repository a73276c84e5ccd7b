"""A fixed placement chosen from the routing: the experts (or whole layers) a host would spend
most time on stay on the GPUs, the rest are computed on the host.

`n-cpu-moe` keeps the *first* layers' experts on the host whatever the model routes, and
`ktransformers` ranks experts by how many tokens they saw. What a host expert costs is a read
of its weights per step that uses it (decode on a CPU is bound by memory bandwidth: one token
or four routed to an expert in a step read its weights once), so the saving of keeping an
expert on the GPUs is the share of steps that use it, and the GPU memory it takes is its
bytes. Both scale with the expert's bytes, so experts rank by that share alone, at the
engine's granularity:

- `unit=expert` (KTransformers' GPU mask, casmoe's backend): the `budget` experts of highest
  step share over all layers (ties to the lower flat id);
- `unit=layer` (llama.cpp, whose expert tensors hold a whole layer: `-ot` can place layers, not
  experts): the `budget // E` layers whose experts a step uses most (expected distinct experts
  per step), ties to the later layer, so that where the routing says nothing (one decode token
  routes `top_k` experts in every layer) the choice is llama.cpp's own: the first layers on the
  host, the last on the GPUs.

Shares are counted over the decode steps of the profile served `batch` requests at a time
(`Trace.steps(batch)`, the steps the simulator runs), so concurrency changes the choice: at
batch 4 a layer whose requests disagree uses more distinct experts per step than one whose
requests share them. The profile is `profile` (a trace or trace file), by default the trace's
train split (`TraceFit`), never the scored requests; a counts-only profile (`casmoe profile
import`) counts one token per step. `casmoe plan` writes the engine's configuration from the
same ranking (the class's `shares` and `order`, reached through the registry), so what it
prints is what was simulated.

Not modelled: where the host's experts sit across NUMA nodes, the host's real kernels (the
profile's `cpu_tflops` and `cpu_mem_bw_gbs` price them), prefill on the GPU of host experts
(llama.cpp's op offload, KTransformers' layerwise prefill).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from casmoe.cache import CacheConfigError, Capacity, ExpertCache
from casmoe.geometry import Geometry
from casmoe.policies.fitting import TraceFit, as_trace, profile_counts
from casmoe.policies.placement import Placement
from casmoe.trace import Trace

UNITS = ("expert", "layer")


def step_shares(trace: Trace, batch: int = 1) -> np.ndarray:
    """[L, E] float64: the share of `trace`'s decode steps, `batch` requests a step, that route
    to each expert (the decode steps of `Trace.steps(batch)`: token t of `batch` consecutive
    requests together); a trace without decode tokens counts each request's prefill as one step."""
    g = trace.geometry
    L, E = g.layers, g.experts
    used = np.zeros((L, E), dtype=np.float64)
    steps = 0
    for start in range(0, len(trace.requests), batch):
        group = [r.topk[r.prefill:] for r in trace.requests[start:start + batch]]  # [T, L, k] each
        T = max((len(d) for d in group), default=0)
        if T == 0:
            continue
        mark = np.zeros((T, L, E), dtype=bool)
        for d in group:
            t, layer, slot = np.nonzero(d >= 0)  # gaps and dropped slots are NOT_COMPUTED (< 0)
            mark[t, layer, d[t, layer, slot]] = True
        used += mark.sum(axis=0)
        steps += T
    if steps == 0:  # prompts only: one step each, the union of its tokens
        for r in trace.requests:
            d = r.topk[: r.prefill]
            if len(d):
                mark = np.zeros((L, E), dtype=bool)
                t, layer, slot = np.nonzero(d >= 0)
                mark[layer, d[t, layer, slot]] = True
                used += mark
                steps += 1
    return used / max(1, steps)


def gpu_experts(shares: np.ndarray, budget: int, unit: str = "expert") -> list[int]:
    """Flat ids kept on the GPUs: the `budget` experts of highest share (ties to the lower id),
    or, by layer, the `budget // E` layers of highest total share (ties to the later layer)."""
    shares = np.asarray(shares, dtype=np.float64)
    L, E = shares.shape
    budget = max(0, min(int(budget), L * E))
    if unit == "expert":
        order = np.argsort(-shares.ravel(), kind="stable")
        return sorted(int(e) for e in order[:budget])
    if unit != "layer":
        raise CacheConfigError(f"routed-placement: unit must be one of {', '.join(UNITS)}, not {unit!r}")
    return [layer * E + e for layer in gpu_layers(shares, budget // E) for e in range(E)]


def gpu_layers(shares: np.ndarray, count: int) -> list[int]:
    """The `count` layers of highest total share (expected distinct experts per step), ties to
    the later layer; sorted."""
    per_layer = np.asarray(shares, dtype=np.float64).sum(axis=1)  # [L]
    L = len(per_layer)
    order = sorted(range(L), key=lambda layer: (-round(float(per_layer[layer]), 12), -layer))
    return sorted(order[: max(0, min(count, L))])


def layer_order(shares: np.ndarray) -> list[int]:
    """Every layer, the first to keep on the GPUs first (`gpu_layers`' ranking)."""
    per_layer = np.asarray(shares, dtype=np.float64).sum(axis=1)
    return sorted(range(len(per_layer)), key=lambda layer: (-round(float(per_layer[layer]), 12), -layer))


class RoutedPlacement(Placement):
    name = "routed-placement"
    summary = "the experts most decode steps use stay on the GPUs, the CPU computes the rest (casmoe plan)"
    runtime = "ktransformers"  # its GPU mask is what `casmoe plan` writes for KTransformers
    fit = TraceFit("profile")

    def __init__(self, geometry: Geometry, capacity: int | Capacity, *, shares: np.ndarray, unit: str = "expert",
                 **kw) -> None:
        self.unit = unit
        self.shares = np.asarray(shares, dtype=np.float64)
        super().__init__(geometry, capacity, **kw)

    def choose_gpu(self, slots: int) -> list[int]:
        """The experts (or whole layers) most decode steps use, as many as `slots` hold."""
        return gpu_experts(self.shares, slots, self.unit)

    @classmethod
    def create(cls, geometry, capacity, *, trace: Trace | None = None,
               profile: Trace | str | os.PathLike[str] | None = None, unit: str = "expert", batch: int = 1,
               **kw: Any) -> ExpertCache:
        """Shares from `profile` (a trace, a trace file, or a counts-only profile file); without
        one (a direct call), from the trace being run (the command line binds the train split)."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise CacheConfigError(f"routed-placement: batch must be a whole number >= 1, not {batch!r}")
        if unit not in UNITS:
            raise CacheConfigError(f"routed-placement: unit must be one of {', '.join(UNITS)}, not {unit!r}")
        source = profile if profile is not None else trace
        if source is None:
            raise CacheConfigError("routed-placement needs a profile (routed-placement[profile=FILE]: a trace or a "
                                   "profile)")
        shares = _shares(source, batch)
        if shares.shape != (geometry.layers, geometry.experts):
            raise CacheConfigError(
                f"routed-placement profile has {shares.shape[0]} layers x {shares.shape[1]} experts, the run "
                f"{geometry.layers} x {geometry.experts}; profile a trace of the same model"
            )
        return cls(geometry, capacity, shares=shares, unit=unit, **kw)

    @staticmethod
    def shares(profile: Trace | str | os.PathLike[str], batch: int = 1) -> np.ndarray:
        """[L, E] step shares of a profile (a trace, a trace file or a counts-only profile)."""
        return _shares(profile, batch)

    @staticmethod
    def order(shares: np.ndarray, unit: str = "expert") -> list[int]:
        """Keep-first order: flat expert ids (`unit=expert`) or layers (`unit=layer`); the
        placement of a budget keeps its first `budget` experts, or `budget // E` layers."""
        if unit == "layer":
            return layer_order(shares)
        return [int(e) for e in np.argsort(-np.asarray(shares, dtype=np.float64).ravel(), kind="stable")]


def _shares(source: Trace | str | os.PathLike[str], batch: int) -> np.ndarray:
    """Step shares of a trace (object or file); a counts-only profile's counts, normalised."""
    trace = source if isinstance(source, Trace) else as_trace(source)
    if trace is not None:
        return step_shares(trace, batch)
    counts = profile_counts(source)
    return counts / max(1.0, float(counts.sum()))

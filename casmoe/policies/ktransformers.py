"""KTransformers' frequency placement: the experts a profile routes to most stay on the GPUs,
every other expert is computed on the host.

KTransformers with SGLang (doc/en/kt-kernel/experts-sched-Tutorial.md: `--kt-num-gpu-experts N`
per MoE layer, `--kt-expert-placement-strategy frequency`, `--init-expert-location` an
activation-statistics file) builds a GPU expert mask with `generate_gpu_experts_masks`
(kt-kernel/python/experts_base.py): the N x L experts of highest activation frequency across
*all* layers (a flat `torch.topk`), so some layers keep more experts on the GPUs than others.
The GPU runs its experts, the CPU (AMX/AVX-512 kernels) the rest, side by side.

Modelled: the slots of the capacity (slots per layer x layers) hold the experts the profile
routes to most, ranked over all layers (ties to the lower id); the others run on the host, as
the cpu miss mode runs a miss (beside the GPU's or after them, as the profile's `cpu_serial`
says). The profile is `profile` (a trace, a trace file or a `casmoe popularity import` file), by
default the popularity of the trace's train split, never of the scored requests (as `static`).

`--kt-gpu-prefill-token-threshold T` is the placements' `gpu_prefill` option
(`casmoe.policies.placement`): `ktransformers[gpu_prefill=T]` copies a step's routed host
experts to a temporary GPU layer (E slots of the capacity) when the step has T tokens or more
(its default, 0, is off: kt_ep_wrapper.py:2514).

`ktransformers[strategy=uniform]` is SGLang's default placement when no frequency file is
given: the same count per layer, by expert ordinal, round robin over the layers ("Round-robin by
expert ordinal keeps every MoE layer near the same GPU footprint", `_build_gpu_expert_masks` in
an SGLang kt_ep_wrapper.py read in the code index, find_string id 59662472624): each layer's
lowest ids, chosen without looking at routing, so nothing is fitted.

Not modelled: the dynamic expert update (`--kt-enable-dynamic-expert-update` re-ranks the GPU
set during long prefills), expert deferral, the other strategies (front-loading, random), and
the CPU kernels' real speed (the profile's `cpu_tflops`, `cpu_mem_bw_gbs`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from casmoe.cache import Capacity, CacheConfigError, ExpertCache
from casmoe.geometry import Geometry
from casmoe.policies.placement import Placement
from casmoe.policies.fitting import TraceFit, profile_counts
from casmoe.trace import Trace


STRATEGIES = ("frequency", "uniform")
"""`--kt-expert-placement-strategy` values modelled (see the module docstring)."""


class _StrategyFit(TraceFit):
    """Static's fit on a routing profile, except under the uniform strategy, which reads none."""

    def fitted_requests(self, options: dict[str, Any], trace: Trace) -> set[int]:
        return set() if options.get("strategy") == "uniform" else super().fitted_requests(options, trace)

    def bind(self, options: dict[str, Any], trace: Trace) -> dict[str, Any]:
        return options if options.get("strategy") == "uniform" else super().bind(options, trace)


class KTransformers(Placement):
    name = "ktransformers"
    summary = "the most routed experts stay on the GPUs, the CPU computes the rest (KTransformers)"
    runtime = "ktransformers"
    variant_notes = {"strategy=uniform": "the same count of experts per layer on the GPUs, by expert id, routing not "
                                         "read (SGLang's default placement); the CPU computes the rest"}

    def __init__(self, geometry: Geometry, capacity: int | Capacity, *, popularity: np.ndarray | None = None,
                 strategy: str = "frequency", **kw) -> None:
        if strategy not in STRATEGIES:
            raise CacheConfigError(f"{self.name}: strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        if strategy == "frequency" and popularity is None:
            raise CacheConfigError(f"{self.name}: the frequency strategy needs a routing profile")
        self.strategy = strategy
        self.popularity = None if popularity is None else np.asarray(popularity, dtype=np.float64).ravel()
        super().__init__(geometry, capacity, **kw)

    def choose_gpu(self, slots: int) -> list[int]:
        """Frequency: the `slots` experts the profile routes to most, over all layers (ties: the
        lower id). Uniform: by expert ordinal, round robin over the layers."""
        if self.strategy == "uniform":
            L, E = self.geometry.layers, self.geometry.experts
            return [layer * E + e for e in range(E) for layer in range(L)][:slots]
        return np.argsort(-self.popularity, kind="stable")[:slots].tolist()

    fit = _StrategyFit("profile")

    @classmethod
    def create(cls, geometry, capacity, *, trace: Trace | None = None, profile: Trace | str | os.PathLike[str] | None = None,
               **kw: Any) -> ExpertCache:
        """Frequencies from `profile`; without one (a direct call), from the trace being run:
        a profile of the very requests it is scored on (the command line binds the train split)."""
        if kw.get("strategy", "frequency") != "frequency":  # reads no routing (or is refused by name)
            return cls(geometry, capacity, **kw)
        if profile is None and trace is None:
            raise CacheConfigError(f"{cls.name} needs a profile ({cls.name}[profile=FILE.npz]: a profile or a trace)")
        counts = profile_counts(profile) if profile is not None else trace.popularity()
        if counts.shape != (geometry.layers, geometry.experts):
            raise CacheConfigError(
                f"{cls.name} profile has {counts.shape[0]} layers x {counts.shape[1]} experts, the run "
                f"{geometry.layers} x {geometry.experts}; profile a trace of the same model"
            )
        return cls(geometry, capacity, popularity=counts, **kw)

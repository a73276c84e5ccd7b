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

Not modelled: the dynamic expert update (`--kt-enable-dynamic-expert-update` re-ranks the GPU
set during long prefills), expert deferral, the other strategies (uniform, front-loading,
random), and the CPU kernels' real speed (the profile's `cpu_tflops`, `cpu_mem_bw_gbs`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from casmoe.cache import Capacity, CacheConfigError, ExpertCache
from casmoe.geometry import Geometry
from casmoe.policies.placement import Placement
from casmoe.policies.fitting import profile_counts
from casmoe.policies.static import Static
from casmoe.trace import Trace


class KTransformers(Placement):
    name = "ktransformers"
    summary = "the most routed experts stay on the GPUs, the CPU computes the rest (KTransformers)"
    runtime = "ktransformers"

    def __init__(self, geometry: Geometry, capacity: int | Capacity, *, popularity: np.ndarray, **kw) -> None:
        self.popularity = np.asarray(popularity, dtype=np.float64).ravel()
        super().__init__(geometry, capacity, **kw)

    def choose_gpu(self, slots: int) -> list[int]:
        """The `slots` experts the profile routes to most, over all layers (ties: the lower id)."""
        return np.argsort(-self.popularity, kind="stable")[:slots].tolist()

    fit = Static.fit

    @classmethod
    def create(cls, geometry, capacity, *, trace: Trace | None = None, profile: Trace | str | os.PathLike[str] | None = None,
               **kw: Any) -> ExpertCache:
        """Frequencies from `profile`; without one (a direct call), from the trace being run:
        a profile of the very requests it is scored on (the command line binds the train split)."""
        if profile is None and trace is None:
            raise CacheConfigError(f"{cls.name} needs a profile ({cls.name}[profile=FILE.npz]: a profile or a trace)")
        counts = profile_counts(profile) if profile is not None else trace.popularity()
        if counts.shape != (geometry.layers, geometry.experts):
            raise CacheConfigError(
                f"{cls.name} profile has {counts.shape[0]} layers x {counts.shape[1]} experts, the run "
                f"{geometry.layers} x {geometry.experts}; profile a trace of the same model"
            )
        return cls(geometry, capacity, popularity=counts, **kw)

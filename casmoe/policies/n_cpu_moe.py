"""llama.cpp's `--n-cpu-moe N`: the experts of the first N MoE layers live on the host and are
computed there; every other layer's experts are on the GPUs.

llama.cpp (common/arg.cpp, `-ncmoe, --n-cpu-moe N`: "keep the Mixture of Experts (MoE) weights
of the first N layers in the CPU") adds a buffer-type override that puts the expert tensors
(`blk.i.ffn_{up,gate,down}_exps`) of blocks 0..N-1 in host memory; ggml then runs those
layers' expert matmuls on the CPU and every other tensor where `-ngl` put it. A layer's experts
are one merged tensor, so the placement is whole layers.

Modelled: layers 0..n-1 have every expert on the host (each routed one is computed there, as
the cpu miss mode computes a miss), layers n..L-1 have all theirs on the GPUs (filled when the
first request starts, then never moved). `n` defaults to the fewest host layers whose
complement fits the capacity (slots per layer x layers: the same expert memory every other
policy gets); an `n` whose GPU layers do not fit is refused. Nothing is profiled: llama.cpp's
choice of layers does not depend on routing, so nothing is fitted on any request.

Not modelled: llama.cpp's op offload (for prompt batches of at least 32 tokens ggml copies a
host layer's expert weights to the GPU and computes there; here prefill runs host experts on
the host too), its tensor split (which GPU holds which layer: the budget here is the box's, not
each GPU's), and quantised kernels (the host's speed is the profile's `cpu_tflops` and
`cpu_mem_bw_gbs`).
"""

from __future__ import annotations

from casmoe.cache import Capacity, CacheConfigError
from casmoe.geometry import Geometry
from casmoe.policies.placement import Placement, budget_slots


class NCpuMoE(Placement):
    name = "n-cpu-moe"

    def __init__(self, geometry: Geometry, capacity: int | Capacity, *, n: int | None = None, **kw) -> None:
        L, E = geometry.layers, geometry.experts
        cap = capacity if isinstance(capacity, Capacity) else Capacity(capacity)
        budget = budget_slots(geometry, cap)
        fewest = L - min(L, budget // E)
        n = fewest if n is None else n
        if not 0 <= n <= L:
            raise CacheConfigError(f"n-cpu-moe: n must lie in [0, {L}] layers, got {n}")
        if n < fewest:
            raise CacheConfigError(
                f"n-cpu-moe[n={n}] keeps {L - n} layers x {E} experts on the GPUs, more than the {budget} slots "
                f"of the capacity; use n >= {fewest} or a larger capacity"
            )
        self.n = n
        super().__init__(geometry, cap, gpu=range(n * E, L * E), **kw)

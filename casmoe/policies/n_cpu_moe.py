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

llama.cpp's op offload (on by default: for ubatches of at least 32 tokens ggml copies the used
experts of a host layer to the GPU and computes there) is the placements' `gpu_prefill` option
(`casmoe.policies.placement`): `n-cpu-moe[gpu_prefill=32]`, one of the two variants a bare
`n-cpu-moe` runs; its copies take a layer's worth of the capacity (E slots), so `n` defaults to
one host layer more.

Not modelled: its tensor split (which GPU holds which layer: the budget here is the box's, not
each GPU's), and quantised kernels (the host's speed is the profile's `cpu_tflops` and
`cpu_mem_bw_gbs`).
"""

from __future__ import annotations

from casmoe.cache import Capacity, CacheConfigError
from casmoe.geometry import Geometry
from casmoe.policies.placement import Placement


class NCpuMoE(Placement):
    name = "n-cpu-moe"
    summary = "the CPU computes the first layers' experts, the GPUs hold the rest (llama.cpp --n-cpu-moe)"
    variant_notes = {"gpu_prefill": "llama.cpp --n-cpu-moe with its op offload: prompt batches copy host experts to the GPU"}
    runtime = "llama.cpp"
    variants = ({}, {"gpu_prefill": 32})
    """llama.cpp as configured by `--n-cpu-moe` alone, and with its op offload (on by default,
    32 tokens: `casmoe/engines/llama.cpp.toml [op_offload]`)."""

    def __init__(self, geometry: Geometry, capacity: int | Capacity, *, n: int | None = None, **kw) -> None:
        self.n = n
        super().__init__(geometry, capacity, **kw)

    def choose_gpu(self, slots: int) -> range:
        L, E = self.geometry.layers, self.geometry.experts
        fewest = L - min(L, slots // E)
        n = fewest if self.n is None else self.n
        if not 0 <= n <= L:
            raise CacheConfigError(f"n-cpu-moe: n must lie in [0, {L}] layers, got {n}")
        if n < fewest:
            beside = f" beside {self.stage} staging slots" if self.stage else ""
            raise CacheConfigError(
                f"n-cpu-moe[n={n}] keeps {L - n} layers x {E} experts on the GPUs, more than the {slots} slots "
                f"of the capacity{beside}; use n >= {fewest} or a larger capacity"
            )
        self.n = n
        return range(n * E, L * E)

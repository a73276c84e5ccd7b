"""How long a GPU computes: roofline times of a layer's dense part and of its routed experts.

Each part takes max(FLOPs / achieved FLOP/s, bytes / achieved bytes/s) plus a launch overhead:
decode is bound by streaming weights, prefill by FLOPs. The dense part of an MoE layer is
attention (projections, plus score and value products over the context), norms and the router;
a routed expert is three (gated) or two matrices applied to the tokens routed to it.

`FixedCompute` replaces the roofline with constants: closed-form checks and what-ifs such as
"compute takes 2 ms per layer" need it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from casmoe.presets import ModelPreset
from casmoe.sim.hardware import HardwareProfile

DENSE_BYTES_PER_PARAM = 2
"""Dense weights (attention, router) stay in bf16; `--quant` applies to experts, which move."""


@dataclass(frozen=True)
class RooflineCompute:
    """Per-part compute times in seconds for one model on one GPU of a profile."""

    flops: float  # achieved FLOP/s on the GPU
    bw: float  # achieved bytes/s of GPU memory
    cpu_flops: float
    cpu_bw: float
    h2d: float  # bytes/s of the host link (activations for CPU experts)
    cpu_hop: float  # one activation transfer between the GPU and the host (cpu miss mode)
    dense_params: int
    attn_width: int  # heads * head_dim
    kv_bytes_per_token: int
    head_params: int  # lm head: vocab * hidden
    hidden: int
    expert_params: int
    expert_bytes: tuple[int, ...]  # per MoE layer
    layer_overhead: float
    expert_overhead: float
    handover_latency: float
    p2p: float
    expert_pass: float = 0.0  # fixed cost of a layer's pass over its device experts
    cpu_serial: float = 0.0  # 0: host experts run beside the device's; 1: on the same thread

    @classmethod
    def build(
        cls,
        hw: HardwareProfile,
        preset: ModelPreset,
        expert_bytes: Sequence[int],
        pinned: bool = True,
    ) -> RooflineCompute:
        """`expert_bytes` per layer carry the quantisation (weight-only: FLOPs are unchanged)."""
        g = preset.geometry
        return cls(
            flops=hw.dense_tflops * 1e12 * hw.matmul_efficiency,
            bw=hw.mem_bw_gbs * 1e9 * hw.mem_efficiency,
            cpu_flops=hw.cpu_tflops * 1e12 * hw.matmul_efficiency,
            cpu_bw=hw.cpu_mem_bw_gbs * 1e9 * hw.mem_efficiency,
            h2d=hw.h2d_gbs(pinned) * 1e9,
            cpu_hop=hw.cpu_hop_us * 1e-6,
            dense_params=preset.dense_params_per_layer,
            attn_width=preset.heads * preset.head_dim,
            kv_bytes_per_token=preset.kv_bytes_per_token(),
            head_params=preset.vocab * g.hidden,
            hidden=g.hidden,
            expert_params=g.expert_params,
            expert_bytes=tuple(int(b) for b in expert_bytes),
            layer_overhead=hw.layer_overhead_us * 1e-6,
            expert_overhead=hw.expert_overhead_us * 1e-6,
            handover_latency=hw.handover_us * 1e-6,
            p2p=hw.p2p_gbs * 1e9,
            expert_pass=hw.expert_pass_us * 1e-6,
            cpu_serial=hw.cpu_serial,
        )

    def dense(self, tokens: int, attn_pairs: int, kv_tokens: int) -> float:
        """One layer's dense part for `tokens` new tokens that attend over `attn_pairs`
        (query, key) pairs in all and read `kv_tokens` cached tokens."""
        flops = 2 * self.dense_params * tokens + 4 * self.attn_width * attn_pairs
        nbytes = DENSE_BYTES_PER_PARAM * self.dense_params + self.kv_bytes_per_token * kv_tokens
        return max(flops / self.flops, nbytes / self.bw) + self.layer_overhead

    def dense_many(self, tokens: np.ndarray, attn_pairs: np.ndarray, kv_tokens: np.ndarray) -> np.ndarray:
        """`dense` over int64 arrays of steps: the same operations elementwise, so the same bits."""
        flops = 2 * self.dense_params * tokens + 4 * self.attn_width * attn_pairs
        nbytes = DENSE_BYTES_PER_PARAM * self.dense_params + self.kv_bytes_per_token * kv_tokens
        return np.maximum(flops / self.flops, nbytes / self.bw) + self.layer_overhead

    def expert(self, layer: int, tokens: int) -> float:
        """One routed expert of `layer` applied to `tokens` tokens."""
        return max(2 * self.expert_params * tokens / self.flops, self.expert_bytes[layer] / self.bw) + self.expert_overhead

    def cpu_expert(self, layer: int, tokens: int) -> float:
        """One expert computed on the host (cpu miss mode), activations sent both ways."""
        run = max(2 * self.expert_params * tokens / self.cpu_flops, self.expert_bytes[layer] / self.cpu_bw)
        return run + 2 * (self.cpu_hop + 2 * self.hidden * tokens / self.h2d)

    def head(self, tokens: int) -> float:
        """The LM head for `tokens` output positions."""
        flops = 2 * self.head_params * tokens
        return max(flops / self.flops, DENSE_BYTES_PER_PARAM * self.head_params / self.bw) + self.layer_overhead

    def handover(self, tokens: int) -> float:
        """Activations of `tokens` tokens moving to the next device."""
        return self.handover_latency + 2 * self.hidden * tokens / self.p2p


@dataclass(frozen=True)
class FixedCompute:
    """Constant times: `layer_s` per computed layer plus `expert_s` per routed expert (any
    token count); nothing for the head and the hand-over. Zero everything for pure link time."""

    layer_s: float = 0.0
    expert_s: float = 0.0
    cpu_expert_s: float = 0.0
    handover_s: float = 0.0
    expert_pass: float = 0.0
    cpu_serial: float = 0.0

    def dense(self, tokens: int, attn_pairs: int, kv_tokens: int) -> float:
        return self.layer_s

    def dense_many(self, tokens: np.ndarray, attn_pairs: np.ndarray, kv_tokens: np.ndarray) -> np.ndarray:
        return np.full(len(tokens), self.layer_s)

    def expert(self, layer: int, tokens: int) -> float:
        return self.expert_s

    def cpu_expert(self, layer: int, tokens: int) -> float:
        return self.cpu_expert_s

    def head(self, tokens: int) -> float:
        return 0.0

    def handover(self, tokens: int) -> float:
        return self.handover_s


ComputeModel = RooflineCompute | FixedCompute

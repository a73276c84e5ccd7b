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

import numpy as np


def attention_span(start, end, history):
    """What attention reads when a request's tokens `start`..`end`-1 (counted within the request)
    run after `history` tokens of earlier context: (query, key) pairs, each token attending to the
    earlier context, the request's earlier tokens and itself; and the cached tokens read, its
    context up to `end`. A whole prompt is (0, n, history); the decode token at position p
    (counting itself, history included) is (p - 1, p, 0). Ints or numpy arrays alike: every pass
    (Python, compiled, served) prices attention with this one function."""
    pairs = (end * (end + 1) - start * (start + 1)) // 2 + (end - start) * history
    return pairs, end + history


@dataclass(frozen=True)
class RooflineCompute:
    """Per-part compute times in seconds for one model on one GPU of a profile, built by
    `Machine.compute` (the model's precisions and structure, the box, the software stack)."""

    flops: float  # achieved FLOP/s on the GPU (a box without one: the host's, at the dense part's precision)
    bw: float  # achieved bytes/s of GPU memory for the dense part
    cpu_flops: float  # achieved FLOP/s of the host's expert kernels at their precision (int8 dot products or FMAs)
    cpu_bw: float  # achieved bytes/s of the host's expert kernels
    h2d: float  # bytes/s of the host link (activations for host experts)
    cpu_hop: float  # one activation transfer between the GPU and the host (cpu miss mode)
    dense_params: int
    attn_pair_flops: int  # FLOPs of one (query, key) pair in one layer (`ModelPreset.attention_pair_flops`)
    kv_bytes_per_token: float  # cache bytes one token adds to a layer attending to the whole context (averaged over layers)
    head_params: int  # lm head: vocab * hidden
    hidden: int
    expert_params: int
    expert_bytes: tuple[int, ...]  # per MoE layer, at the experts' precision on the GPU
    layer_overhead: float
    expert_overhead: float
    handover_latency: float
    p2p: float
    expert_pass: float = 0.0  # fixed cost of a layer's pass over its device experts
    cpu_serial: float = 0.0  # 0: host experts run beside the device's; 1: on the same thread
    dense_bytes_per_param: float = 2.0  # the dense part's precision
    expert_bw: float = 0.0  # bytes/s the expert kernels reach (0: `bw`)
    dequant_ops: float = 0.0  # extra arithmetic per expert weight a GPU kernel spends dequantising
    host_expert_bytes: tuple[int, ...] = ()  # per MoE layer, at the host experts' precision (): `expert_bytes`
    host_dequant_ops: float = 0.0
    host_expert_overhead: float = 0.0  # the runtime's own cost per host expert
    kv_window_bytes_per_token: float = 0.0  # the same for layers attending to a window of `window` tokens
    window: int = 0
    step_overhead: float = 0.0  # the runtime's own cost per forward pass
    dense_block_params: int = 0  # one dense-only block (attention and its FFN)
    dense_blocks: int = 0  # dense-only blocks a token passes (DeepSeek's first layers)
    moe_layer_overhead: float = 0.0  # the runtime's own cost per MoE layer beyond `layer_overhead` (its loop over every expert)
    head_bytes: float = 0.0  # the LM head's bytes at its own precision (0: `dense_bytes_per_param` x `head_params`)
    dense_block_bytes: float = 0.0  # one dense-only block's bytes (0: `dense_bytes_per_param` x `dense_block_params`)
    attn_flops: float = 0.0  # FLOP/s of attention's score and value products where not `flops` (0: `flops`)

    def dense(self, tokens: int, attn_pairs: int, kv_tokens: int, requests: int = 1) -> float:
        """One layer's dense part for `tokens` new tokens of `requests` requests that attend over
        `attn_pairs` (query, key) pairs in all and read `kv_tokens` cached tokens (a windowed
        layer reads at most `window` of each request's)."""
        nbytes = self.dense_bytes_per_param * self.dense_params + self.kv_bytes_per_token * kv_tokens
        if self.window:
            nbytes += self.kv_window_bytes_per_token * min(kv_tokens, requests * self.window)
        arithmetic = self._dense_arithmetic(tokens, attn_pairs)
        return max(arithmetic, nbytes / self.bw) + self.layer_overhead + self.moe_layer_overhead

    def dense_many(self, tokens: np.ndarray, attn_pairs: np.ndarray, kv_tokens: np.ndarray,
                   requests: int = 1) -> np.ndarray:
        """`dense` over int64 arrays of steps of `requests` requests each: the same operations
        elementwise, so the same bits."""
        nbytes = self.dense_bytes_per_param * self.dense_params + self.kv_bytes_per_token * kv_tokens
        if self.window:
            nbytes = nbytes + self.kv_window_bytes_per_token * np.minimum(kv_tokens, requests * self.window)
        arithmetic = self._dense_arithmetic(tokens, attn_pairs)
        return np.maximum(arithmetic, nbytes / self.bw) + self.layer_overhead + self.moe_layer_overhead

    def _dense_arithmetic(self, tokens, attn_pairs):
        """Seconds of the dense part's arithmetic (ints or arrays alike): its weights' products at
        `flops`, attention's over the cached tokens at `attn_flops` where that differs (a host
        multiplying a GGUF's weights with int8 dot products reads an F16 cache with FMAs)."""
        if self.attn_flops:
            return 2 * self.dense_params * tokens / self.flops + self.attn_pair_flops * attn_pairs / self.attn_flops
        return (2 * self.dense_params * tokens + self.attn_pair_flops * attn_pairs) / self.flops

    def expert(self, layer: int, tokens: int) -> float:
        """One routed expert of `layer` applied to `tokens` tokens."""
        flops = 2 * self.expert_params * tokens
        if self.dequant_ops:
            flops += self.dequant_ops * self.expert_params
        return max(flops / self.flops, self.expert_bytes[layer] / (self.expert_bw or self.bw)) + self.expert_overhead

    def cpu_expert(self, layer: int, tokens: int) -> float:
        """One expert computed on the host (cpu miss mode), activations sent both ways."""
        flops = 2 * self.expert_params * tokens
        if self.host_dequant_ops:
            flops += self.host_dequant_ops * self.expert_params
        nbytes = (self.host_expert_bytes or self.expert_bytes)[layer]
        run = max(flops / self.cpu_flops, nbytes / self.cpu_bw) + self.host_expert_overhead
        return run + 2 * (self.cpu_hop + 2 * self.hidden * tokens / self.h2d)

    def head(self, tokens: int) -> float:
        """The LM head for `tokens` output positions."""
        flops = 2 * self.head_params * tokens
        nbytes = self.head_bytes or self.dense_bytes_per_param * self.head_params
        return max(flops / self.flops, nbytes / self.bw) + self.layer_overhead

    def step_fixed(self, tokens: int) -> float:
        """What a forward pass of `tokens` tokens costs besides its MoE layers and head: the
        dense-only blocks (their weights and FFN; their attention's cache reads are left out)
        and the runtime's own cost per pass."""
        if not self.dense_blocks:
            return self.step_overhead
        flops = 2 * self.dense_block_params * tokens
        nbytes = self.dense_block_bytes or self.dense_bytes_per_param * self.dense_block_params
        block = max(flops / self.flops, nbytes / self.bw)
        return self.dense_blocks * (block + self.layer_overhead) + self.step_overhead

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

    def dense(self, tokens: int, attn_pairs: int, kv_tokens: int, requests: int = 1) -> float:
        return self.layer_s

    def dense_many(self, tokens: np.ndarray, attn_pairs: np.ndarray, kv_tokens: np.ndarray,
                   requests: int = 1) -> np.ndarray:
        return np.full(len(tokens), self.layer_s)

    def expert(self, layer: int, tokens: int) -> float:
        return self.expert_s

    def cpu_expert(self, layer: int, tokens: int) -> float:
        return self.cpu_expert_s

    def head(self, tokens: int) -> float:
        return 0.0

    def step_fixed(self, tokens: int) -> float:
        return 0.0

    def handover(self, tokens: int) -> float:
        return self.handover_s


ComputeModel = RooflineCompute | FixedCompute

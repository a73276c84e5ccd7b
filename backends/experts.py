"""The experts module that computes with offloaded weights, and how to find a model's MoE blocks.

transformers 5 keeps a layer's experts as fused 3D parameters (`gate_up_proj[E, 2I, H]`,
`down_proj[E, H, I]`, biases alike) and dispatches the computation through
`ALL_EXPERTS_FUNCTIONS` (`eager`, `grouped_mm`, `batched_mm`, ...). `OffloadedExperts` replaces
a block's `experts` module: it asks the runtime which pool slot holds each routed expert and
then calls *the same* transformers function on a view whose parameters are the device's slot
pool and whose expert indices are slot indices. The arithmetic (op order, kernels, dtypes) is
therefore transformers' own, which is what makes `miss_mode=load` logits bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch
from torch import nn

from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry


class NotMoEModel(CasmoeError, ValueError):
    """The model has no mixture-of-experts block this backend can offload."""


@dataclass(frozen=True)
class MoEBlock:
    """One sparse MoE block: where it sits in the decoder stack and its router and experts."""

    decoder_index: int
    block: Any  # nn.Module with .gate and .experts
    experts: Any
    gate: Any


def find_moe_blocks(model: nn.Module) -> list[MoEBlock]:
    """The model's MoE blocks in decoder order (dense layers, e.g. Qwen2-MoE `mlp_only_layers`,
    are skipped: casmoe's `Geometry.layers` counts MoE layers only)."""
    decoder = getattr(getattr(model, "model", model), "layers", None)
    if decoder is None:
        raise NotMoEModel(f"{type(model).__name__} has no decoder layer stack (model.model.layers)")
    blocks = []
    for i, layer in enumerate(decoder):
        mlp = getattr(layer, "mlp", None)
        experts = getattr(mlp, "experts", None)
        gate = getattr(mlp, "gate", None)
        if experts is None or gate is None:
            continue
        if not hasattr(experts, "num_experts") or not hasattr(gate, "top_k"):
            raise NotMoEModel(f"decoder layer {i} has an experts module of an unsupported kind ({type(experts).__name__})")
        blocks.append(MoEBlock(i, mlp, experts, gate))
    if not blocks:
        raise NotMoEModel(
            f"{type(model).__name__} has no mixture-of-experts layers; the backend offloads MoE models "
            "(Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE classes of transformers)"
        )
    return blocks


def expert_param_names(experts: nn.Module) -> list[str]:
    """Names of the per-expert parameters (leading dimension = number of experts)."""
    E = experts.num_experts
    names = [n for n, p in experts.named_parameters(recurse=False) if p.dim() >= 2 and p.shape[0] == E]
    if not names:
        raise NotMoEModel(f"{type(experts).__name__} holds no fused [experts, ...] parameters")
    return names


def model_geometry(model: nn.Module, blocks: list[MoEBlock]) -> Geometry:
    """Routing shape and real bytes per expert of a loaded model."""
    first = blocks[0]
    cfg = model.config
    shared = 1 if getattr(first.block, "shared_expert", None) is not None else 0
    bytes_per_layer = tuple(
        sum(p[0].numel() * p.element_size() for p in (getattr(b.experts, n) for n in expert_param_names(b.experts)))
        for b in blocks
    )
    return Geometry(
        layers=len(blocks),
        experts=int(first.experts.num_experts),
        top_k=int(first.gate.top_k),
        shared_experts=shared,
        hidden=int(cfg.hidden_size),
        intermediate=int(getattr(first.experts, "intermediate_dim", 0) or getattr(cfg, "moe_intermediate_size", 0) or 0),
        gated=bool(getattr(first.experts, "has_gate", True)),
        layer_expert_bytes=bytes_per_layer,
    )


def model_preset(model: nn.Module, geometry: Geometry, name: str = "") -> Any:
    """The `ModelPreset` the simulator prices this model with (dense shape from its config)."""
    from casmoe.presets import ModelPreset

    cfg = model.config
    heads = int(cfg.num_attention_heads)
    return ModelPreset(
        name=name or getattr(cfg, "model_type", type(model).__name__),
        source=f"measured from the loaded {type(model).__name__}",
        geometry=geometry,
        heads=heads,
        kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
        vocab=int(cfg.vocab_size),
        dense_layers=int(cfg.num_hidden_layers) - geometry.layers,
    )


def experts_function(experts: nn.Module) -> Callable[..., torch.Tensor]:
    """The forward transformers would run for this experts module (registered implementation,
    or the class's own eager loop)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    eager = getattr(type(experts).forward, "__wrapped__", type(experts).forward)
    impl = getattr(experts.config, "_experts_implementation", None) or "eager"
    return ALL_EXPERTS_FUNCTIONS.get_interface(impl, eager)


class SlotView:
    """Stands in for an experts module inside transformers' experts functions: the same
    attributes, but the fused parameters are a slot pool's tensors and `num_experts` its slot count."""

    def __init__(self, experts: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        skip = set(tensors) | {"num_experts"}
        for name in ("config", "act_fn", "has_gate", "has_bias", "has_post_expert_norm", "is_transposed",
                     "is_concatenated", "_is_expert_parallel", "hidden_dim", "intermediate_dim",
                     "post_expert_norm"):
            if name not in skip and hasattr(experts, name):
                setattr(self, name, getattr(experts, name))
        for name, t in tensors.items():
            setattr(self, name, t)
        self.num_experts = next(iter(tensors.values())).shape[0]
        self.training = False
        if hasattr(type(experts), "_apply_gate"):
            self._apply_gate = partial(type(experts)._apply_gate, self)


class OffloadedExperts(nn.Module):
    """Replaces a block's experts: routes through the runtime (cache events, loads, waits),
    then runs transformers' experts function on the device's slot pool."""

    def __init__(self, layer: int, fn: Callable[..., torch.Tensor], runtime: Any) -> None:
        super().__init__()
        self.layer = layer
        self.fn = fn
        self.runtime = runtime

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        # [T, H], [T, k], [T, k] -> [T, H]
        return self.runtime.experts_forward(self.layer, self.fn, hidden_states, top_k_index, top_k_weights)

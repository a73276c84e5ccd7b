"""How the backend finds a model's MoE blocks and measures them, and the experts module that
hands every layer call to the offloaded runtime.

transformers 5 keeps a layer's experts as fused 3D parameters (`gate_up_proj[E, 2I, H]`,
`down_proj[E, H, I]`, biases alike) and dispatches the computation through
`ALL_EXPERTS_FUNCTIONS` (`eager`, `grouped_mm`, `batched_mm`, ...). `OffloadedExperts`
replaces a block's `experts` module; the runtime computes the layer with an `expert_ops.ExpertPlan` that
reproduces that function exactly on the device's slot pool. `SlotView` stands in for the
experts module where transformers' functions or the plans read its attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch
from torch import nn

from casmoe.backends.adapters import adapter_for
from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry
from casmoe.presets import ModelPreset


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
    names = expert_param_names(first.experts)
    bytes_per_layer = tuple(
        sum(p[0].numel() * p.element_size() for p in (getattr(b.experts, n) for n in names)) for b in blocks
    )
    params = sum(getattr(first.experts, n)[0].numel() for n in names)
    return Geometry(
        layers=len(blocks),
        experts=int(first.experts.num_experts),
        top_k=int(first.gate.top_k),
        shared_experts=shared_experts(model, first.block, params),
        hidden=int(cfg.hidden_size),
        intermediate=int(getattr(first.experts, "intermediate_dim", 0) or getattr(cfg, "moe_intermediate_size", 0) or 0),
        gated=bool(getattr(first.experts, "has_gate", True)),
        layer_expert_bytes=bytes_per_layer,
    )


def shared_experts(model: nn.Module, block: nn.Module, expert_params: int) -> int:
    """Always-on shared experts of an MoE block, in routed-expert units (Geometry's convention:
    Qwen1.5-MoE's 5632-wide shared MLP beside 1408-wide experts counts 4; DeepSeek's
    `n_shared_experts` MLPs fused into one count n)."""
    name = adapter_for(model.config.model_type).shared
    mlp = getattr(block, name, None) if name else None
    if mlp is None:
        return 0
    return round(sum(p.numel() for p in mlp.parameters()) / expert_params)


def model_preset(model: nn.Module, geometry: Geometry, name: str = "") -> Any:
    """The `ModelPreset` the simulator prices this model with (dense shape from its config)."""
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

    def __init__(self, experts: nn.Module, tensors: dict[str, torch.Tensor], num_experts: int | None = None) -> None:
        skip = set(tensors) | {"num_experts"}
        for name in ("config", "act_fn", "has_gate", "has_bias", "has_post_expert_norm", "is_transposed",
                     "is_concatenated", "_is_expert_parallel", "hidden_dim", "intermediate_dim",
                     "post_expert_norm"):
            if name not in skip and hasattr(experts, name):
                setattr(self, name, getattr(experts, name))
        for name, t in tensors.items():
            setattr(self, name, t)
        self.num_experts = num_experts if num_experts is not None else next(iter(tensors.values())).shape[0]
        self.training = False
        for name, default in (("has_gate", True), ("has_bias", False), ("has_post_expert_norm", False),
                              ("is_transposed", False)):
            if not hasattr(self, name):
                setattr(self, name, default)
        if hasattr(type(experts), "_apply_gate"):
            self._apply_gate = partial(type(experts)._apply_gate, self)


class OffloadedExperts(nn.Module):
    """Replaces a block's experts: the runtime routes (cache events, loads, waits) and computes."""

    def __init__(self, layer: int, runtime: Any) -> None:
        super().__init__()
        self.layer = layer
        self.runtime = runtime

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        # [T, H], [T, k], [T, k] -> [T, H]
        return self.runtime.experts_forward(self.layer, hidden_states, top_k_index, top_k_weights)

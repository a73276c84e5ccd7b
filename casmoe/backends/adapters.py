"""Per-architecture adapters: the one table that says how each supported MoE family is laid out.

transformers 5 gives every supported family the same runtime shape (a decoder layer's `mlp`
holds a `gate` router and an `experts` module with fused `[E, ...]` parameters), but their
checkpoints differ: hub files keep one tensor per expert and projection under family-specific
names (Mixtral's `block_sparse_moe.experts.{e}.w1`, the others' `mlp.experts.{e}.gate_proj`),
and some families carry dense "shared" experts next to the routed ones. An `Adapter` records
exactly those differences; everything else in the backend is family-agnostic. A family not in
`ADAPTERS` is refused with one line naming the supported ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from casmoe.errors import CasmoeError


class UnsupportedModel(CasmoeError, ValueError):
    """A model family the backend has no adapter for."""


# transformers' fused names -> the per-expert hub tensors concatenated (along dim 0) into one row
_GATE_UP_DOWN = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}


@dataclass(frozen=True)
class Adapter:
    """How one model family stores its experts.

    `hub_prefix`: where a decoder layer's experts sit in a hub checkpoint (per-expert tensors
    `model.layers.{i}.{hub_prefix}.{e}.{name}.weight`); `hub_names`: which of those tensors make
    up each fused transformers parameter, in row order; `renames`: checkpoint -> model key
    substitutions for the dense tensors; `shared`: the MoE block attribute holding its always-on
    shared expert MLP, if the family has one.
    """

    model_type: str
    class_name: str
    hub_prefix: str = "mlp.experts"
    hub_names: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(_GATE_UP_DOWN))
    renames: tuple[tuple[str, str], ...] = ()
    shared: str | None = None

    def model_key(self, checkpoint_key: str) -> str:
        """The model's name for a dense checkpoint tensor."""
        for old, new in self.renames:
            checkpoint_key = checkpoint_key.replace(old, new)
        return checkpoint_key

    def model_class(self) -> Any:
        import transformers

        return getattr(transformers, self.class_name)


ADAPTERS: dict[str, Adapter] = {
    a.model_type: a
    for a in (
        Adapter("mixtral", "MixtralForCausalLM", hub_prefix="block_sparse_moe.experts",
                hub_names={"gate_up_proj": ("w1", "w3"), "down_proj": ("w2",)},
                renames=((".block_sparse_moe.", ".mlp."),)),
        Adapter("olmoe", "OlmoeForCausalLM"),
        Adapter("qwen2_moe", "Qwen2MoeForCausalLM", shared="shared_expert"),
        Adapter("qwen3_moe", "Qwen3MoeForCausalLM"),
        Adapter("deepseek_v2", "DeepseekV2ForCausalLM", shared="shared_experts"),
        Adapter("deepseek_v3", "DeepseekV3ForCausalLM", shared="shared_experts"),
    )
}


def adapter_for(model_type: str, where: str = "") -> Adapter:
    """The adapter of `model_type`, or a one-line error naming the supported families."""
    adapter = ADAPTERS.get(model_type)
    if adapter is None:
        prefix = f"{where}: " if where else ""
        raise UnsupportedModel(f"{prefix}model type {model_type!r} is not a supported MoE model "
                               f"(supported: {', '.join(ADAPTERS)})")
    return adapter

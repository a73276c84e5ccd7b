"""`casmoe plan --model`: a preset name, or a checkpoint's `config.json` (or its folder).

A checkpoint's config is read for its routing shape (Hugging Face's keys: `num_hidden_layers`,
`num_experts` / `num_local_experts` / `n_routed_experts`, `num_experts_per_tok`, `hidden_size`,
`moe_intermediate_size` or `intermediate_size`, `first_k_dense_replace`) and matched to the
preset of that shape, whose sizes the plan then prices: the memory map and the simulator need
a preset's attention and embedding sizes too, and a shape no preset has is refused with what to
add. The checkpoint's folder becomes the weights the engines are told to load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from casmoe.errors import CasmoeError
from casmoe.presets import load_presets


class ModelError(CasmoeError, ValueError):
    """A --model that is neither a preset nor a readable MoE config."""


@dataclass(frozen=True)
class ModelChoice:
    preset: str
    weights: str = ""  # the checkpoint folder, when --model named one
    note: str = ""


def _first(config: dict, *keys: str) -> int | None:
    for k in keys:
        v = config.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def resolve_model(text: str) -> ModelChoice:
    """The preset a plan prices (see the module docstring)."""
    presets = load_presets()
    if text in presets:
        return ModelChoice(text)
    path = Path(text)
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.is_file():
        raise ModelError(f"unknown model {text!r}: not a preset ({', '.join(sorted(presets))}) and not a config.json "
                         "or a checkpoint folder holding one")
    try:
        config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{config_path}: not a JSON config ({exc})") from None
    if not isinstance(config, dict):
        raise ModelError(f"{config_path}: not a model config (a JSON object)")
    config = config.get("text_config", config) if isinstance(config.get("text_config"), dict) else config
    blocks = _first(config, "num_hidden_layers")
    experts = _first(config, "num_experts", "num_local_experts", "n_routed_experts")
    top_k = _first(config, "num_experts_per_tok", "experts_per_token", "moe_topk")
    hidden = _first(config, "hidden_size")
    inter = _first(config, "moe_intermediate_size", "intermediate_size")
    dense = _first(config, "first_k_dense_replace") or 0
    missing = [n for n, v in (("num_hidden_layers", blocks), ("num_experts", experts), ("num_experts_per_tok", top_k),
                              ("hidden_size", hidden)) if v is None]
    if missing:
        raise ModelError(f"{config_path}: not an MoE config casmoe can read (no {', '.join(missing)})")
    shape = (blocks - dense, experts, top_k, hidden)
    for name, p in presets.items():
        g = p.geometry
        if (g.layers, g.experts, g.top_k, g.hidden) == shape and (inter is None or g.intermediate == inter):
            weights = str(config_path.parent) if path.is_dir() or path.name == "config.json" else ""
            return ModelChoice(name, weights, f"{config_path} has the shape of preset {name} ({g.describe()}): "
                                              f"priced as {name}")
    raise ModelError(f"{config_path}: no preset has its shape ({blocks - dense} MoE layers x {experts} experts, top-"
                     f"{top_k}, hidden {hidden}, expert width {inter}); add one to casmoe/presets/models.toml "
                     "(casmoe presets shows the keys) and pass its name")

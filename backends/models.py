"""Load a MoE model for recording or running: a shipped tiny model's name, a local directory,
or a hub id whose weights are already in the local cache (these machines never download).

Only the transformers MoE classes casmoe knows how to hook are accepted; anything else is a
clear `CasmoeError` rather than a stack trace from deep inside a forward pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from casmoe.errors import CasmoeError
from casmoe.shipped import data_dir

SHIPPED_MODELS = ("tiny-mixtral", "tiny-olmoe")
SUPPORTED_TYPES = {
    "mixtral": "MixtralForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}


class ModelError(CasmoeError, ValueError):
    """The model cannot be found, or is not a supported mixture-of-experts model."""


def resolve_model(name_or_path: str | Path) -> str:
    """A shipped model name becomes its folder under traces/models; a path or hub id stays."""
    text = str(name_or_path)
    if text in SHIPPED_MODELS and not Path(text).exists():
        path = data_dir() / "models" / text
        if not (path / "config.json").exists():
            raise ModelError(f"shipped model {text!r} is missing under {path.parent}; "
                             f"rebuild it with `casmoe train-tiny {text}`")
        return str(path)
    return text


def load_config(name_or_path: str | Path) -> Any:
    """The model's transformers config, checked to be a supported MoE class."""
    from transformers import AutoConfig

    where = resolve_model(name_or_path)
    path = Path(where)
    if path.exists() and not (path / "config.json").exists():
        raise ModelError(f"{where}: not a model directory (no config.json)")
    try:
        config = AutoConfig.from_pretrained(where)
    except (OSError, ValueError) as exc:
        raise ModelError(f"{where}: cannot load a model config (no such directory, or a hub id "
                         f"without locally cached weights): {str(exc).splitlines()[0]}") from None
    if config.model_type not in SUPPORTED_TYPES:
        raise ModelError(f"{where}: model type {config.model_type!r} is not a supported MoE model "
                         f"(supported: {', '.join(SUPPORTED_TYPES)})")
    return config


def checkpoint_dtype(name_or_path: str | Path) -> str:
    """The dtype the checkpoint's weights are stored in (its config's `dtype`), e.g.
    "bfloat16"; "float32" when the config does not say."""
    dtype = getattr(load_config(name_or_path), "dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else "float32"


def load_model(name_or_path: str | Path, dtype: str = "float32") -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) for a supported MoE model; `dtype` names a torch dtype."""
    import torch
    import transformers
    from transformers import AutoTokenizer

    config = load_config(name_or_path)
    where = resolve_model(name_or_path)
    cls = getattr(transformers, SUPPORTED_TYPES[config.model_type])
    try:
        model = cls.from_pretrained(where, dtype=getattr(torch, dtype)).eval()
        tokenizer = AutoTokenizer.from_pretrained(where)
    except (OSError, ValueError) as exc:
        raise ModelError(f"{where}: cannot load weights or tokenizer: "
                         f"{str(exc).splitlines()[0]}") from None
    return model, tokenizer

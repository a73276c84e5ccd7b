"""`casmoe plan --model`: a preset name, a GGUF file, a checkpoint's `config.json` (or its
folder), or a Hugging Face repo id (`org/name`).

A GGUF's header states the model exactly (casmoe/presets/gguf.py): its shape becomes a preset
and its tensors the bytes it stores (`FileWeights`). A checkpoint's config is read for its
routing shape (Hugging Face's keys: `num_hidden_layers`, `num_experts` / `num_local_experts` /
`n_routed_experts`, `num_experts_per_tok`, `hidden_size`, `moe_intermediate_size` or
`intermediate_size`, `first_k_dense_replace`); a repo id's config.json is fetched with
huggingface_hub (and kept in its cache). Either is matched to the shipped preset of that shape,
whose sizes a plan prices: the memory map and the simulator take a shipped preset today, so a
shape no preset has is refused with what to add. The file, folder or repo id becomes the
weights the engines are told to load.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from casmoe.errors import CasmoeError
from casmoe.presets import ModelPreset, load_presets
from casmoe.presets.gguf import read_gguf
from casmoe.presets.weights import FileWeights

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
"""A Hugging Face repo id, `org/name` (huggingface_hub's validate_repo_id allows these characters)."""
GGUF_MAGIC = b"GGUF"  # gguf.GGUF_MAGIC, as the file's first four bytes


class ModelError(CasmoeError, ValueError):
    """A --model that is neither a preset nor a readable MoE config or GGUF."""


@dataclass(frozen=True)
class ModelChoice:
    """What `--model` resolved to. `preset` names the shipped preset a plan prices ("" when
    `resolve_model` was told not to require one and none has the model's shape), `weights` what
    the engines load, `note` how the match was made. `model` is the model as its source states
    it (the shipped preset, or the one read from a GGUF header: exact even when no preset
    matches) and `file` a GGUF's stored bytes (None for anything but a GGUF)."""

    preset: str
    weights: str = ""
    note: str = ""
    model: ModelPreset | None = None
    file: FileWeights | None = None


def _first(config: dict, *keys: str) -> int | None:
    for k in keys:
        v = config.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _is_gguf(path: Path) -> bool:
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _choices(presets: dict[str, ModelPreset]) -> str:
    return (f"pass a preset ({', '.join(sorted(presets))}), a GGUF file, a config.json or a checkpoint folder "
            "holding one, or a Hugging Face repo id (org/name)")


def resolve_model(text: str, need_preset: bool = True) -> ModelChoice:
    """The model a plan prices (see the module docstring). With `need_preset` False, a GGUF of a
    shape no shipped preset has still resolves, with `preset` "" and the model read from it."""
    presets = load_presets()
    if text in presets:
        return ModelChoice(text, model=presets[text])
    path = Path(text)
    if path.is_file() and _is_gguf(path) or not path.exists() and path.suffix.lower() == ".gguf":
        return _from_gguf(path, presets, need_preset)
    if path.exists():
        config_path = path / "config.json" if path.is_dir() else path
        if not config_path.is_file():
            raise ModelError(f"unknown model {text!r}: a folder without a config.json; {_choices(presets)}")
        weights = str(config_path.parent) if path.is_dir() or path.name == "config.json" else ""
        return _from_config(config_path, weights, str(config_path), presets)
    if _REPO_ID.match(text) and not text.endswith(".json"):
        return _from_config(_hub_config(text, presets), text, f"{text} (its config.json on the Hugging Face Hub)",
                            presets)
    raise ModelError(f"unknown model {text!r}: no such preset, file or folder; {_choices(presets)}")


def _hub_config(repo: str, presets: dict[str, ModelPreset]) -> Path:
    """`config.json` of a Hugging Face repo, downloaded once into huggingface_hub's cache (which
    it also answers from when offline and the file was fetched before)."""
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError
    except ImportError:
        raise ModelError(f"{repo!r} looks like a Hugging Face repo id, but huggingface_hub is not installed; "
                         f"{_choices(presets)}") from None
    try:
        return Path(hf_hub_download(repo_id=repo, filename="config.json"))
    except (OSError, ValueError, EntryNotFoundError) + _http_errors():
        raise ModelError(f"cannot fetch config.json of {repo!r} from the Hugging Face Hub (offline, or no such "
                         f"repo); {_choices(presets)}") from None


def _http_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's own errors, which some huggingface_hub versions let through."""
    try:
        import httpx
    except ImportError:
        return ()
    return (httpx.HTTPError,)


def _from_config(config_path: Path, weights: str, label: str, presets: dict[str, ModelPreset]) -> ModelChoice:
    try:
        config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{label}: not a JSON config ({exc})") from None
    if not isinstance(config, dict):
        raise ModelError(f"{label}: not a model config (a JSON object)")
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
        raise ModelError(f"{label}: not an MoE config casmoe can read (no {', '.join(missing)})")
    assert blocks is not None
    shape = (blocks - dense, experts, top_k, hidden)
    for name, p in presets.items():
        g = p.geometry
        if (g.layers, g.experts, g.top_k, g.hidden) == shape and (inter is None or g.intermediate == inter):
            return ModelChoice(name, weights, f"{label} has the shape of preset {name} ({g.describe()}): priced as "
                                              f"{name}", model=p)
    raise ModelError(f"{label}: no preset has its shape ({blocks - dense} MoE layers x {experts} experts, top-"
                     f"{top_k}, hidden {hidden}, expert width {inter}); add one to casmoe/presets/models.toml "
                     "(casmoe presets shows the keys) and pass its name")


_SAME = ("dense_layers", "attention")
_NOTED = ("heads", "kv_heads", "head_dim", "vocab", "tie_embeddings", "sliding_window", "kv_lora_rank", "q_lora_rank")


def _from_gguf(path: Path, presets: dict[str, ModelPreset], need_preset: bool) -> ModelChoice:
    model, weights = read_gguf(path)
    g = model.geometry
    shape = f"{g.describe()}, {model.dense_layers} dense blocks, {model.attention.value} attention"
    read = f"{path} (GGUF, {weights.file_type or weights.precision_name()})"
    if weights.split_experts:
        read += (" [its experts are the old per-expert tensors, which current llama.cpp does not load: re-convert "
                 "it with a current convert_hf_to_gguf.py]")
    for name, p in presets.items():
        if _routing(p) == _routing(model) and all(getattr(p, k) == getattr(model, k) for k in _SAME):
            differ = [f"{k} {getattr(model, k)} (preset {getattr(p, k)})" for k in _NOTED
                      if getattr(p, k) != getattr(model, k)]
            note = f"{read} has the shape of preset {name} ({shape}): priced as {name}"
            note += f"; the file differs in {', '.join(differ)}" if differ else ""
            return ModelChoice(name, weights.path, note, model=model, file=weights)
    if need_preset:
        raise ModelError(f"{read}: no shipped preset has its shape ({shape}); add it to casmoe/presets/models.toml "
                         "(casmoe presets shows the keys; the GGUF's values are those of "
                         "casmoe.presets.gguf.read_gguf) and pass its name")
    return ModelChoice("", weights.path, f"{read}: {shape}; no shipped preset has this shape", model=model,
                       file=weights)


def _routing(p: ModelPreset) -> tuple[Any, ...]:
    g = p.geometry
    return g.layers, g.experts, g.top_k, g.shared_experts, g.hidden, g.intermediate, g.gated

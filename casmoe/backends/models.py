"""Load a MoE model for recording or running: a shipped tiny model's name, a local directory,
or a hub id whose weights are already in the local cache (these machines never download).

Two ways in. `load_model` builds the whole transformers model (the recorder runs it as it is).
`open_model` is what the offloaded backend runs: the model built on the meta device with only
its dense tensors read from the checkpoint, and a `CheckpointStore` that reads experts by
offset from the same files, so the experts never exist in memory as a whole.

Only the families in `adapters.ADAPTERS` are accepted; anything else is a clear `CasmoeError`
rather than a stack trace from deep inside a forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from casmoe.backends.adapters import adapter_for
from casmoe.errors import CasmoeError
from casmoe.quiet import quiet_loads
from casmoe.shipped import data_dir

SHIPPED_MODELS = ("tiny-mixtral", "tiny-olmoe")
DTYPES = ("float32", "bfloat16", "float16")


class ModelError(CasmoeError, ValueError):
    """The model cannot be found, or is not a supported mixture-of-experts model."""


def resolve_model(name_or_path: str | Path) -> str:
    """A local folder: a shipped model name becomes its folder under traces/models, a path
    stays, and a hub id becomes its snapshot in the local hub cache, found without the network
    (an id that is not cached is one error now, not a minute of hub retries that end in one)."""
    text = str(name_or_path)
    if Path(text).exists():
        return text
    if text in SHIPPED_MODELS:
        path = data_dir() / "models" / text
        if not (path / "config.json").exists():
            raise ModelError(f"shipped model {text!r} is missing under {path.parent}; "
                             f"rebuild it with `casmoe train-tiny {text}`")
        return str(path)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return snapshot_download(text, local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, OSError, ValueError):
        raise ModelError(
            f"unknown model {text!r}: not a shipped model ({', '.join(SHIPPED_MODELS)}), not a local folder, and "
            "not in the local hub cache (casmoe never downloads); pass the folder of its weights"
        ) from None


def load_config(name_or_path: str | Path) -> Any:
    """The model's transformers config, checked to be a supported MoE family."""
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
    adapter_for(config.model_type, where)
    return config


def checkpoint_dtype(name_or_path: str | Path) -> str:
    """The dtype the checkpoint's weights are stored in (its config's `dtype`), e.g.
    "bfloat16"; "float32" when the config does not say."""
    dtype = getattr(load_config(name_or_path), "dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else "float32"


def torch_dtype(name: str | None) -> Any:
    """`None` or a name in DTYPES -> torch dtype (None stays None: the checkpoint's)."""
    import torch

    if name is None:
        return None
    if name not in DTYPES:
        raise ModelError(f"--dtype must be one of {', '.join(DTYPES)}, not {name!r}")
    return getattr(torch, name)


def load_model(name_or_path: str | Path, dtype: str | None = None) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) for a supported MoE model, in `dtype` (a name in DTYPES;
    default: the checkpoint's)."""
    from transformers import AutoTokenizer

    config = load_config(name_or_path)
    where = resolve_model(name_or_path)
    cls = adapter_for(config.model_type).model_class()

    try:
        with quiet_loads():
            model = cls.from_pretrained(where, dtype=torch_dtype(dtype) or "auto").eval()
            tokenizer = AutoTokenizer.from_pretrained(where)
    except (OSError, ValueError) as exc:
        raise ModelError(f"{where}: cannot load weights or tokenizer: "
                         f"{str(exc).splitlines()[0]}") from None
    return model, tokenizer


@dataclass
class ModelFiles:
    """A model folder opened but not loaded: config, adapter, the checkpoint's tensor index and
    the dtype the model will run in; enough to check that a run fits before reading weights."""

    where: str
    config: Any
    adapter: Any
    checkpoint: Any
    dtype: Any  # torch dtype


def open_files(name_or_path: str | Path, dtype: str | None = None, direct: bool = False) -> ModelFiles:
    """Config, adapter and tensor index of a model folder (safetensors headers only); `direct`:
    read its experts with O_DIRECT, past the page cache."""
    from casmoe.backends.checkpoint import Checkpoint, CheckpointError

    config = load_config(name_or_path)
    where = resolve_model(name_or_path)
    try:
        ckpt = Checkpoint(where, direct)
    except CheckpointError as exc:
        raise ModelError(str(exc)) from None
    return ModelFiles(where, config, adapter_for(config.model_type), ckpt, torch_dtype(dtype) or ckpt.float_dtype())


def experts_paths(model: Any) -> list[str]:
    """Dotted names of the model's experts modules, in MoE-layer order."""
    from casmoe.backends.experts import find_moe_blocks

    names = {id(m): n for n, m in model.named_modules()}
    return [names[id(b.experts)] for b in find_moe_blocks(model)]


def skeleton(files: ModelFiles) -> Any:
    """The model on the meta device (no weights: its geometry and sizes, for `fit` checks)."""
    from casmoe.backends.checkpoint import build_skeleton

    return build_skeleton(files.config, files.adapter, files.dtype)


def open_model(files: ModelFiles, model: Any = None) -> tuple[Any, Any]:
    """(model, `CheckpointStore`): the `skeleton` with its dense part read once, the experts
    left in the checkpoint files (see the module docstring)."""
    from casmoe.backends.checkpoint import ExpertSources, load_dense
    from casmoe.backends.experts import expert_param_names, find_moe_blocks
    from casmoe.backends.store import CheckpointStore

    model = skeleton(files) if model is None else model
    paths = experts_paths(model)
    load_dense(model, files.checkpoint, files.adapter, paths)
    first = find_moe_blocks(model)[0].experts
    layout = {n: (tuple(getattr(first, n).shape[1:]), getattr(first, n).dtype) for n in expert_param_names(first)}
    E = int(first.num_experts)
    sources = ExpertSources(files.checkpoint, files.adapter, paths, layout, E)
    return model, CheckpointStore(files.checkpoint, sources, layout, E)


def load_tokenizer(files: ModelFiles) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(files.where)
    except (OSError, ValueError) as exc:
        raise ModelError(f"{files.where}: cannot load the tokenizer: {str(exc).splitlines()[0]}") from None



"""A model folder's safetensors files, read by offset: the bottom memory tier.

A safetensors file is an 8-byte header length, a JSON header naming every tensor's dtype,
shape and byte range, then the raw bytes. `Checkpoint` parses the headers of every shard once
and then reads any byte range with `os.preadv` straight into the memory of a destination
tensor: nothing is memory-mapped (mapped pages would count against the process and linger) and
nothing is copied twice. `build_skeleton` builds the transformers model on the meta device and
`load_dense` materialises only its dense tensors from the files, so the experts never exist as
one tensor;
`ExpertSources` says where each expert's bytes are, for both layouts found in the wild (hub
files with one tensor per expert and projection, or transformers' fused `[E, ...]` tensors).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from casmoe.errors import CasmoeError

from casmoe.backends.adapters import Adapter

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
FLOATS = ("F64", "F32", "F16", "BF16")


class CheckpointError(CasmoeError, ValueError):
    """A model folder whose weights cannot be read (no safetensors, a missing tensor, ...)."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes are: absolute `offset` and `nbytes` in file `path`."""

    path: str
    offset: int
    nbytes: int
    dtype: str  # safetensors name: F32, BF16, ...
    shape: tuple[int, ...]

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def byte_view(t: torch.Tensor) -> Any:
    """A writable buffer over a contiguous CPU tensor's bytes (for `os.preadv`)."""
    return t.reshape(-1).view(torch.uint8).numpy()


class Checkpoint:
    """Every tensor of a model folder's safetensors shards, by name. With `direct`, reads bypass
    the page cache (O_DIRECT, through an aligned bounce buffer per thread): the drive's own speed,
    and the kernel keeps no copy of the checkpoint."""

    def __init__(self, folder: str | os.PathLike[str], direct: bool = False) -> None:
        self._fds: dict[str, int] = {}
        self.folder = Path(folder)
        self.direct = direct
        self._bounce = threading.local()
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{self.folder}: no .safetensors weights (other formats are not read)")
        self.tensors: dict[str, TensorInfo] = {}
        for f in files:
            self.tensors.update(_header(f))

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def float_dtype(self) -> torch.dtype:
        """The floating dtype holding most of the bytes: the checkpoint's dtype."""
        size: dict[str, int] = {}
        for t in self.tensors.values():
            if t.dtype in FLOATS:
                size[t.dtype] = size.get(t.dtype, 0) + t.nbytes
        if not size:
            raise CheckpointError(f"{self.folder}: no floating-point tensors")
        return DTYPES[max(size, key=size.__getitem__)]

    def read(self, path: str, offset: int, dst: Any) -> None:
        """Fill the writable buffer `dst` with the file's bytes from `offset` on."""
        view = memoryview(dst).cast("B")
        if self.direct:
            self._read_direct(path, offset, view)
        else:
            _pread(self._fd(path, 0), path, offset, view)

    def _fd(self, path: str, flags: int) -> int:
        key = f"{flags}:{path}"
        fd = self._fds.get(key)
        if fd is None:
            fd = self._fds.setdefault(key, os.open(path, os.O_RDONLY | flags))
        return fd

    def _read_direct(self, path: str, offset: int, view: memoryview) -> None:
        start = offset - offset % ALIGN
        stop = -(-(offset + len(view)) // ALIGN) * ALIGN
        buf = getattr(self._bounce, "buf", None)
        if buf is None or len(buf) < stop - start:
            buf = self._bounce.buf = mmap.mmap(-1, stop - start)  # page-aligned, as O_DIRECT needs
        region = memoryview(buf)[: stop - start]
        fd = self._fd(path, os.O_DIRECT)
        _pread(fd, path, start, region, need=offset - start + len(view))
        view[:] = region[offset - start : offset - start + len(view)]

    def tensor(self, key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A new CPU tensor holding `key` (converted to `dtype` if given)."""
        info = self.tensors[key]
        out = torch.empty(info.shape, dtype=info.torch_dtype)
        if info.nbytes:
            self.read(info.path, info.offset, byte_view(out))
        return out if dtype is None or dtype == out.dtype else out.to(dtype)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __del__(self) -> None:
        self.close()


ALIGN = 4096
"""O_DIRECT reads start, end and land at multiples of this (the usual logical block size)."""


def _pread(fd: int, path: str, offset: int, view: memoryview, need: int | None = None) -> None:
    """Read into `view` from `offset` until `need` bytes (default: all of it) are in."""
    need = len(view) if need is None else need
    done = 0
    while done < need:
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise CheckpointError(f"{path}: short read at byte {offset + done} (file truncated?)")
        done += n


def _header(path: Path) -> dict[str, TensorInfo]:
    try:
        with open(path, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
    except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not a safetensors file: {exc}") from None
    header.pop("__metadata__", None)
    base = 8 + size
    out = {}
    for key, info in header.items():
        if info.get("dtype") not in DTYPES:
            raise CheckpointError(f"{path}: tensor {key!r} has dtype {info.get('dtype')!r}, which is not read "
                                  f"(supported: {', '.join(DTYPES)})")
        a, b = info["data_offsets"]
        out[key] = TensorInfo(str(path), base + a, b - a, info["dtype"], tuple(info["shape"]))
    return out


# ---- where each expert's bytes are -------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """`nbytes` of one expert row, at byte `dst` of the row, read from `offset` of `path`."""

    path: str
    offset: int
    nbytes: int
    dst: int


class ExpertSources:
    """For every MoE layer, expert and fused parameter name: the file ranges that make up its row.

    Fused checkpoints hold `[E, ...]` tensors: row e is one contiguous range. Hub checkpoints
    hold per-expert tensors; a fused row concatenates them along dim 0 (gate then up for
    `gate_up_proj`), which in a contiguous row is one range after the other.
    """

    def __init__(self, ckpt: Checkpoint, adapter: Adapter, experts_paths: list[str],
                 layout: dict[str, tuple[tuple[int, ...], torch.dtype]], experts: int) -> None:
        self.dtype: dict[str, str] = {}
        self.parts: list[dict[str, list[list[Part]]]] = []  # [layer][name][expert] -> parts
        for path in experts_paths:
            per_name = {}
            for name, (row_shape, _) in layout.items():
                per_name[name] = self._locate(ckpt, adapter, path, name, row_shape, experts)
            self.parts.append(per_name)

    def _locate(self, ckpt: Checkpoint, adapter: Adapter, path: str, name: str, row_shape: tuple[int, ...],
                experts: int) -> list[list[Part]]:
        numel = 1
        for s in row_shape:
            numel *= s
        fused = _find(ckpt, adapter, f"{path}.{name}")
        if fused is not None:
            info = ckpt.tensors[fused]
            if info.shape != (experts, *row_shape):
                raise CheckpointError(f"{fused}: shape {list(info.shape)}, the model expects "
                                      f"{[experts, *row_shape]}")
            self._dtype(name, info)
            row = info.nbytes // experts
            return [[Part(info.path, info.offset + e * row, row, 0)] for e in range(experts)]
        sources = adapter.hub_names.get(name)
        if sources is None:
            raise CheckpointError(f"{ckpt.folder}: no tensor for the experts' {name!r} ({path}.{name})")
        out = []
        for e in range(experts):
            parts, at, rows = [], 0, 0
            for src in sources:
                key = _find(ckpt, adapter, f"{path}.{e}.{src}.weight")
                if key is None:
                    raise CheckpointError(f"{ckpt.folder}: expert tensor {path}.{e}.{src}.weight is missing")
                info = ckpt.tensors[key]
                self._dtype(name, info)
                if tuple(info.shape[1:]) != tuple(row_shape[1:]):
                    raise CheckpointError(f"{key}: shape {list(info.shape)} does not fit the model's "
                                          f"{name} row {list(row_shape)}")
                parts.append(Part(info.path, info.offset, info.nbytes, at))
                at += info.nbytes
                rows += info.shape[0]
            if rows != row_shape[0]:
                raise CheckpointError(f"{path}.{e}: {'+'.join(sources)} hold {rows} rows, the model's {name} "
                                      f"has {row_shape[0]}")
            out.append(parts)
        return out

    def _dtype(self, name: str, info: TensorInfo) -> None:
        if info.dtype not in FLOATS:
            raise CheckpointError(f"{info.path}: expert tensors of dtype {info.dtype} are not supported")
        if self.dtype.setdefault(name, info.dtype) != info.dtype:
            raise CheckpointError(f"{info.path}: the experts' {name} tensors mix dtypes")


def _find(ckpt: Checkpoint, adapter: Adapter, model_key: str) -> str | None:
    """The checkpoint key whose model name is `model_key` (renames applied), if any."""
    if model_key in ckpt.tensors:
        return model_key
    index = _index(ckpt, adapter)
    return index.get(model_key)


def _index(ckpt: Checkpoint, adapter: Adapter) -> dict[str, str]:
    cache = getattr(ckpt, "_model_keys", None)
    if cache is None:
        cache = {adapter.model_key(k): k for k in ckpt.tensors}
        ckpt._model_keys = cache  # type: ignore[attr-defined]
    return cache


# ---- the dense skeleton ------------------------------------------------------------------

def build_skeleton(config: Any, adapter: Adapter, dtype: torch.dtype) -> Any:
    """The model on the meta device: shapes and dtypes, no memory."""
    with torch.device("meta"):
        model = adapter.model_class()._from_config(config, dtype=dtype)
    return model.eval()


def load_dense(model: Any, ckpt: Checkpoint, adapter: Adapter, experts: list[str]) -> Any:
    """Read every tensor of the meta-device `model` except the experts modules' (`experts`:
    their dotted names, left on the meta device) from `ckpt`, cast to what the model declares;
    compute the non-persistent buffers (rotary frequencies) with transformers' own init."""
    skip = tuple(p + "." for p in experts)
    index = _index(ckpt, adapter)
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    modules = dict(model.named_modules())
    nonpersistent = {n for n, _ in model.named_non_persistent_buffers()}
    missing = []
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if name.startswith(skip) or name in nonpersistent:
            continue
        key = index.get(name)
        if key is None:
            if name not in tied:
                missing.append(name)
            continue
        info = ckpt.tensors[key]
        if info.shape != tuple(t.shape):
            raise CheckpointError(f"{key}: shape {list(info.shape)}, the model expects {list(t.shape)}")
        _set(modules, name, ckpt.tensor(key, t.dtype), isinstance(t, torch.nn.Parameter))
    if missing:
        raise CheckpointError(f"{ckpt.folder}: no weights for {len(missing)} tensors of the model "
                              f"(first: {missing[0]})")
    for name in nonpersistent:
        owner, _, attr = name.rpartition(".")
        module = modules[owner]
        module._buffers[attr] = torch.empty_like(module._buffers[attr], device="cpu")
        model._init_weights(module)
    if tied:
        model.tie_weights()
    return model


def _set(modules: dict[str, Any], name: str, value: torch.Tensor, param: bool) -> None:
    owner, _, attr = name.rpartition(".")
    module = modules[owner]
    if param:
        module._parameters[attr] = torch.nn.Parameter(value, requires_grad=False)
    else:
        module._buffers[attr] = value

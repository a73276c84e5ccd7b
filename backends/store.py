"""The host expert store: every MoE layer's expert weights in the slow tier.

Weights stay in the fused layout transformers uses (`[E, ...]` per parameter name), so an
expert is the row `tensor[e]` of each of its layer's tensors and a load is one row copy per
name. On CUDA the store is pinned (page-locked) so copies run asynchronously at full link
speed; alternatively it is a memory-mapped safetensors file, so a model larger than RAM pages
its experts in from disk on demand.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import torch

from casmoe.errors import CasmoeError

_DTYPES = {
    "F32": (torch.float32, np.float32),
    "F16": (torch.float16, np.float16),
    "BF16": (torch.bfloat16, np.uint16),  # numpy has no bfloat16: map the bits, view in torch
    "F64": (torch.float64, np.float64),
}
_NAMES = {v[0]: k for k, v in _DTYPES.items()}


class StoreError(CasmoeError, ValueError):
    """A store file that cannot serve as an expert store."""


class HostStore:
    """Per MoE layer, a dict of fused expert tensors `name -> [E, ...]` on the host."""

    def __init__(self, layers: list[dict[str, torch.Tensor]]) -> None:
        self.layers = layers
        self.names = list(layers[0]) if layers else []
        self._bytes = [sum(t[0].numel() * t.element_size() for t in row.values()) for row in layers]

    @classmethod
    def from_tensors(cls, layers: list[dict[str, torch.Tensor]], pin: bool = False) -> HostStore:
        """Detached host copies of the given tensors (pinned when `pin`, for async CUDA copies)."""
        out = []
        for tensors in layers:
            row = {}
            for name, t in tensors.items():
                t = t.detach().to("cpu")
                row[name] = t.pin_memory() if pin else t  # the model drops its own copy
            out.append(row)
        return cls(out)

    def expert(self, layer: int, expert: int) -> dict[str, torch.Tensor]:
        """One expert's tensors (views, no copy)."""
        return {name: t[expert] for name, t in self.layers[layer].items()}

    def expert_bytes(self, layer: int) -> int:
        return self._bytes[layer]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for row in self.layers for t in row.values())

    # ---- memory-mapped safetensors -------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write a safetensors file (`{layer}.{name}` keys) that `open_mmap` maps back."""
        from safetensors.torch import save_file

        from casmoe.output import atomic_path

        with atomic_path(path) as tmp:
            save_file({f"{i}.{n}": t.contiguous() for i, row in enumerate(self.layers) for n, t in row.items()}, str(tmp))

    @classmethod
    def open_mmap(cls, path: str | os.PathLike[str]) -> HostStore:
        """Map a safetensors file written by `save` without reading it: rows page in from disk
        when a load touches them (copy-on-write mapping, so the file is never modified)."""
        path = Path(path)
        try:
            with open(path, "rb") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(size))
        except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise StoreError(f"{path}: not a safetensors expert store: {exc}") from exc
        header.pop("__metadata__", None)
        raw = np.memmap(path, dtype=np.uint8, mode="c")
        base = 8 + size
        layers: dict[int, dict[str, torch.Tensor]] = {}
        for key, info in header.items():
            layer, _, name = key.partition(".")
            if not layer.isdigit() or info.get("dtype") not in _DTYPES:
                raise StoreError(f"{path}: tensor {key!r} is not a `layer.name` expert tensor of a float dtype")
            tdtype, ndtype = _DTYPES[info["dtype"]]
            a, b = info["data_offsets"]
            arr = raw[base + a : base + b].view(ndtype).reshape(info["shape"])
            t = torch.from_numpy(arr)
            layers.setdefault(int(layer), {})[name] = t.view(tdtype) if tdtype is torch.bfloat16 else t
        if sorted(layers) != list(range(len(layers))):
            raise StoreError(f"{path}: layers {sorted(layers)} are not numbered 0..n-1")
        return cls([layers[i] for i in range(len(layers))])

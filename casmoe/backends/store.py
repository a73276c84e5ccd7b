"""The expert store: where every MoE layer's experts live when they are in no faster tier.

One small interface, two sources. An expert is one row per fused transformers parameter
(`gate_up_proj[e]`, `down_proj[e]`); `read(layer, expert, rows)` fills the caller's row
tensors (a RAM-tier row, a staging buffer, or on the CPU a slot of the pool itself), so the
store never hands out a second copy:

- `CheckpointStore`: the checkpoint's safetensors files, read by offset (`checkpoint.py`);
  bytes in another dtype than the rows are read into a scratch row and converted.
- `TensorStore`: fused tensors already in memory (a model built in Python, as in the tests);
  the model's own tensors, never copied.
"""

from __future__ import annotations

from math import prod
from typing import Sequence

import torch

from casmoe.backends.checkpoint import DTYPES, Checkpoint, ExpertSources, byte_view

Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]
"""Fused parameter name -> (one expert's row shape, dtype)."""


class ExpertStore:
    """Per MoE layer, `experts` experts of the row `layout` (the same for every layer)."""

    def __init__(self, layout: Layout, layers: int, experts: int) -> None:
        self.layout = layout
        self.layers = layers
        self.experts = experts
        self.row_bytes = sum(prod(shape) * dtype.itemsize for shape, dtype in layout.values())

    def read(self, layer: int, expert: int, rows: dict[str, torch.Tensor]) -> None:
        """Fill `rows` (contiguous host tensors shaped like `layout`) with the expert's weights."""
        raise NotImplementedError

    def expert_bytes(self, layer: int) -> int:
        return self.row_bytes

    @property
    def nbytes(self) -> int:
        return self.row_bytes * self.experts * self.layers

    def empty_rows(self, n: int | None = None, device: str | torch.device = "cpu", pin: bool = False
                   ) -> dict[str, torch.Tensor]:
        """Uninitialised rows (`[n, *row]` per name, or one row when `n` is None)."""
        lead = () if n is None else (n,)
        return {name: torch.empty((*lead, *shape), dtype=dtype, device=device, pin_memory=pin)
                for name, (shape, dtype) in self.layout.items()}

    def layer_tensors(self, layer: int, device: str | torch.device, experts: Sequence[int] | None = None,
                      out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """`layer` as fused `[E, ...]` tensors on `device`, what the un-offloaded model holds.
        With `experts`, only those rows are read, into `out` (one layer's buffer, reused: the
        other rows keep whatever they held, which an experts function never reads for experts
        nobody routed to)."""
        if out is None:
            out = self.empty_rows(self.experts, device)
        staging = None if next(iter(out.values())).device.type == "cpu" else self.empty_rows()
        for e in range(self.experts) if experts is None else experts:
            row = {n: t[e] for n, t in out.items()}
            if staging is None:
                self.read(layer, e, row)
            else:  # through one host row
                self.read(layer, e, staging)
                for n, t in row.items():
                    t.copy_(staging[n])
        return out


class TensorStore(ExpertStore):
    """Fused `[E, ...]` tensors per layer, as a transformers model holds them."""

    def __init__(self, layers: list[dict[str, torch.Tensor]]) -> None:
        first = layers[0]
        E = next(iter(first.values())).shape[0]
        super().__init__({n: (tuple(t.shape[1:]), t.dtype) for n, t in first.items()}, len(layers), E)
        self.tensors = [{n: t.detach() for n, t in row.items()} for row in layers]

    def read(self, layer: int, expert: int, rows: dict[str, torch.Tensor]) -> None:
        for name, t in self.tensors[layer].items():
            rows[name].copy_(t[expert])

    def layer_tensors(self, layer: int, device: str | torch.device, experts: Sequence[int] | None = None,
                      out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """The model's own tensors (moved to `device` when it is not theirs)."""
        return {n: t.to(device) for n, t in self.tensors[layer].items()}


class CheckpointStore(ExpertStore):
    """Experts read by offset from a checkpoint's files (see `ExpertSources`)."""

    def __init__(self, ckpt: Checkpoint, sources: ExpertSources, layout: Layout, experts: int) -> None:
        super().__init__(layout, len(sources.parts), experts)
        self.ckpt = ckpt
        self.sources = sources
        self._same = {n: DTYPES[sources.dtype[n]] == layout[n][1] for n in layout}

    def read(self, layer: int, expert: int, rows: dict[str, torch.Tensor]) -> None:
        parts = self.sources.parts[layer]
        for name, row in rows.items():
            if self._same[name]:
                self._read(parts[name][expert], byte_view(row))
            else:  # another dtype on disk: read it as it is, convert once
                scratch = torch.empty(row.shape, dtype=DTYPES[self.sources.dtype[name]])
                self._read(parts[name][expert], byte_view(scratch))
                row.copy_(scratch)

    def _read(self, parts: list, buf: object) -> None:
        for p in parts:
            self.ckpt.read(p.path, p.offset, buf[p.dst : p.dst + p.nbytes])

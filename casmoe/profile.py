"""Popularity profiles: how often each expert of each MoE layer was routed, `counts[L, E]`.

Serving engines that keep only counts (TensorRT-LLM's expert statistics, KTransformers'
activation frequencies, SGLang's `stat` recorder) cannot give a trace, but they give what a
static placement needs: which experts are hot. `casmoe popularity import` turns their dumps into
a profile file; `load_profile` reads one, or a casmoe trace (its routed counts), so every
placement that ranks experts by popularity (`static[profile=FILE]`, frequency placements) takes
either.

On disk a profile is one `.npz` (never pickled): `counts` float64 [L, E] and JSON metadata
(`format`, `version`, the engine and files it came from, the engine's layer ids kept) as a uint8
array. Counts are finite and non-negative, and at least one is positive.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from casmoe.errors import CasmoeError
from casmoe.npz import format_meta, members, read_npz
from casmoe.output import atomic_open, check_file_target
from casmoe.trace_io import load_trace

FORMAT_NAME = "casmoe-profile"
FORMAT_VERSION = 1


class ProfileError(CasmoeError, ValueError):
    """A profile that cannot be read or used; the message names the file and the fault."""


@dataclass(frozen=True, eq=False)
class Profile:
    """Routed counts per MoE layer and expert, with where they came from."""

    counts: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_counts(self.counts, "<profile>")
        object.__setattr__(self, "counts", np.asarray(self.counts, dtype=np.float64))

    @property
    def layers(self) -> int:
        return int(self.counts.shape[0])

    @property
    def experts(self) -> int:
        return int(self.counts.shape[1])

    def summary(self, top: int = 4) -> dict[str, Any]:
        """Shape, totals and per-layer share of the `top` hottest experts, as plain values."""
        rows = []
        for layer, row in enumerate(self.counts):
            total = float(row.sum())
            hot = np.argsort(-row, kind="stable")[:top]
            rows.append({"layer": layer, "routed": total, "distinct": int((row > 0).sum()),
                         "top_share": float(row[hot].sum() / total) if total else 0.0})
        return {"layers": self.layers, "experts": self.experts, "routed": float(self.counts.sum()),
                "meta": self.meta, "per_layer": rows}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically (an interrupted write leaves the old file intact)."""
        path = check_file_target(path, "profile")
        meta = dict(self.meta)
        meta.setdefault("created", datetime.now(timezone.utc).isoformat(timespec="seconds"))
        meta.update(format=FORMAT_NAME, version=FORMAT_VERSION)
        with atomic_open(path, "wb") as fh:
            np.savez_compressed(fh, counts=self.counts,
                                meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Profile:
        """Read and validate a profile file; `ProfileError` names the file and the fault."""
        arrays = _npz_arrays(path)
        return cls._from_arrays(arrays, str(path))

    @classmethod
    def _from_arrays(cls, arrays: dict[str, np.ndarray], where: str) -> Profile:
        if "counts" not in arrays:
            raise ProfileError(f"{where}: not a {FORMAT_NAME} file (needs 'counts' and 'meta' arrays)")
        meta = format_meta(arrays.get("meta"), where, ProfileError, FORMAT_NAME, FORMAT_VERSION)
        check_counts(arrays["counts"], where)
        for name in ("format", "version"):
            meta.pop(name)
        return cls(arrays["counts"], meta)


def count_array(counts: Any, where: str) -> np.ndarray:
    """`counts` as float64 if they are counts: an integer or float array (never a boolean mask,
    strings, objects or complex numbers, whose conversion would make "counts" of a flag or
    fail later), finite, non-negative and with a finite total. Every engine's counts pass here
    before they are summed or converted."""
    arr = np.asarray(counts)
    kind = "a boolean mask" if arr.dtype == bool else str(arr.dtype)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ProfileError(f"{where}: counts must be numbers of routed tokens, not {kind}")
    out = arr.astype(np.float64)
    bad = ~np.isfinite(out)
    if bad.any():
        raise ProfileError(f"{where}: counts hold NaN or infinity (at {_index(bad)})")
    if (out < 0).any():
        raise ProfileError(f"{where}: negative count {float(out.min())} (at {_index(out < 0)})")
    if out.size and not np.isfinite(out.sum()):
        raise ProfileError(f"{where}: counts too large to add up (their total is beyond a float)")
    return out


def _index(mask: np.ndarray) -> str:
    """The first True position of `mask`, as `[i, j]`."""
    return str([int(x[0]) for x in np.nonzero(mask)])


def check_counts(counts: Any, where: str) -> None:
    """Refuse what no popularity ranking can use: not [L, E] counts (`count_array`), all zero."""
    arr = np.asarray(counts)
    if arr.ndim != 2 or 0 in arr.shape:
        raise ProfileError(f"{where}: counts must be [layers, experts], got shape {arr.shape}")
    arr = count_array(arr, where)
    if not (arr > 0).any():
        raise ProfileError(f"{where}: every count is zero; the dump recorded no routing")


def from_engine_counts(counts: np.ndarray, where: str, *, model_layers: int | None = None,
                       meta: dict[str, Any] | None = None) -> Profile:
    """An engine's counts over its own layers -> a profile over the MoE layers.

    Engines count every decoder layer; dense layers stay all zero and are dropped (the kept
    engine layer ids go in the metadata), unless `model_layers` (the model's MoE layer count)
    equals the engine's layer count: then a zero row is a real, cold layer."""
    check_counts(counts, where)  # before any conversion: a boolean mask is no counts
    counts = np.asarray(counts, dtype=np.float64)
    keep = np.arange(len(counts))
    if model_layers is None or model_layers != len(counts):
        keep = np.nonzero(counts.sum(axis=1) > 0)[0]
    if model_layers is not None and len(keep) != model_layers:
        raise ProfileError(f"{where}: {len(keep)} layers with routed counts (of {len(counts)}), but --model has "
                           f"{model_layers} MoE layers")
    info = {**(meta or {}), "engine_layers": int(len(counts)), "moe_layers": [int(i) for i in keep]}
    return Profile(counts[keep], info)


_WHAT = "a casmoe profile or trace (.npz)"
_HINT = "turn engine dumps into a profile with `casmoe popularity import`"


def _npz_arrays(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The arrays of a profile or trace archive: sizes checked before inflating, no pickle, a
    file of another kind named as what it is (`casmoe.npz.read_npz`)."""
    return read_npz(path, ProfileError, _WHAT, hint=_HINT)


def read_profile(path: str | os.PathLike[str]) -> Profile:
    """A profile file, or a casmoe trace as the profile of its routed counts (a trace is read
    once, by `load_trace`, which keeps what a process reads again)."""
    if "counts" in members(path, ProfileError, _WHAT, hint=_HINT):
        return Profile._from_arrays(_npz_arrays(path), str(path))

    trace = load_trace(path)
    counts = trace.popularity().astype(np.float64)
    check_counts(counts, str(path))
    return Profile(counts, {"source": "casmoe trace (routed counts of its computed token-layers)",
                            "files": [Path(path).name], "requests": len(trace.requests)})


def load_profile(path: str | os.PathLike[str]) -> np.ndarray:
    """Expert popularity `counts[L, E]` (float64) from a profile file or a casmoe trace.

    The one loader for every placement that ranks experts by popularity: a profile written by
    `casmoe popularity import` gives its counts, a trace `.npz` the number of computed token-layers
    routed to each expert (`Trace.popularity`)."""
    return read_profile(path).counts

"""moe-lrc's per-layer arrays: one file per layer (`.npy`, `.npz` or `.safetensors`, ordered by
the layer number in the name), holding expert ids `[sequences, tokens, k]`, raw router logits
`[sequences, tokens, E]` (top-k taken here) or moe-lrc's int8 ranks `[sequences, tokens, E]`.
Each sequence is one request; all its tokens are decode steps unless `prefill` says otherwise.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

import numpy as np

from casmoe.filekind import one_line, require
from casmoe.geometry import Geometry, GeometryError
from casmoe.importers.checks import positive_option
from casmoe.importers.dump_files import distinct_files
from casmoe.npz import read_npz
from casmoe.trace import Request, Trace, TraceError
from casmoe.trace_io import checked_trace

ARRAY_SUFFIXES = (".npy", ".npz", ".safetensors")


def _layer_files(sources: Sequence[str | Path]) -> list[Path]:
    """Files in layer order: a directory expands to its array files, sorted by the last number in the name."""
    files: list[Path] = []
    for src in map(Path, sources):
        if src.is_dir():
            files += [p for p in src.iterdir() if p.suffix in ARRAY_SUFFIXES]
        else:
            files.append(src)
    if not files:
        raise TraceError(f"{', '.join(map(str, sources))}: no .npy/.npz/.safetensors files")
    distinct_files(files, same_bytes=False)  # a layer file twice is a layer twice (equal layers are possible)

    def layer_of(p: Path) -> tuple[int, str]:
        nums = re.findall(r"\d+", p.stem)
        return (int(nums[-1]) if nums else -1, p.name)

    return sorted(files, key=layer_of)


def _read_arrays(path: Path) -> np.ndarray:
    """All arrays of one layer file stacked as [sequences, tokens, last]; 2D arrays are one sequence."""
    where = str(path)
    what = f"a per-layer routing array ({path.suffix or 'no suffix'}; layer files are {', '.join(ARRAY_SUFFIXES)})"
    try:
        if path.suffix == ".npy":
            require(path, {"npy"}, what, TraceError)
            arrays = [np.load(path, allow_pickle=False)]
        elif path.suffix == ".npz":  # declared sizes checked before anything is inflated
            arrays = [a for _, a in sorted(read_npz(path, TraceError, what).items())]
        elif path.suffix == ".safetensors":
            from safetensors.numpy import load_file

            require(path, {"safetensors"}, what, TraceError)
            loaded = load_file(str(path))
            arrays = [loaded[n] for n in sorted(loaded)]
        else:
            kind = require(path, {"npy", "npz", "safetensors"}, what, TraceError)
            raise TraceError(f"{where}: {kind} data named {path.suffix or 'without a suffix'}; name layer files "
                             f"{', '.join(ARRAY_SUFFIXES)} after what they hold")
    except TraceError:
        raise
    except FileNotFoundError:
        raise TraceError(f"{where}: no such file") from None
    except MemoryError as exc:
        raise TraceError(f"{where}: out of memory reading it ({one_line(exc)}); check the shape its header "
                         "declares") from None
    except Exception as exc:  # numpy/zip/safetensors raise many types for a damaged file
        raise TraceError(f"{where}: not a readable array file: {type(exc).__name__}: {one_line(exc)}") from None
    out = []
    for a in arrays:
        if a.ndim == 2:
            a = a[None]
        if a.ndim != 3:
            raise TraceError(f"{where}: array of shape {a.shape}; expected [sequences, tokens, k or E]")
        out.append(a)
    if not out:
        raise TraceError(f"{where}: holds no arrays")
    try:
        return np.concatenate(out)
    except ValueError as exc:
        raise TraceError(f"{where}: its arrays disagree in shape: {one_line(exc)}") from None


def _to_topk(
    a: np.ndarray, kind: str, num_experts: int | None, top_k: int | None, where: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int | None]:
    """One layer's array -> topk [S, T, k], weights [S, T, k], logits [S, T, E] or None, and E
    when the array reveals it (logits and ranks have one column per expert)."""
    if kind == "auto":
        if np.issubdtype(a.dtype, np.floating):
            kind = "logits"
        elif top_k is not None and a.shape[-1] > top_k and num_experts in (None, a.shape[-1]):
            kind = "rank"
        else:
            kind = "topk"
    if kind == "topk":
        if not np.issubdtype(a.dtype, np.integer):
            raise TraceError(f"{where}: expert ids must be integers, not {a.dtype}")
        k = a.shape[-1]
        if top_k is not None and top_k != k:
            raise TraceError(f"{where}: --top-k {top_k}, but the expert-id arrays hold {k} ids per token")
        return a.astype(np.int64), np.full(a.shape, 1.0 / k, dtype=np.float32), None, None
    if kind not in ("rank", "logits"):
        raise TraceError(f"unknown array kind {kind!r} (auto, topk, logits, rank)")
    if top_k is None:
        raise TraceError(f"{where}: {kind} arrays need --top-k")
    if a.shape[-1] < top_k:
        raise TraceError(f"{where}: last dimension {a.shape[-1]} < top_k={top_k}")
    E = int(a.shape[-1])
    if kind == "rank":  # moe-lrc: rank of each expert's logit, highest = E - 1
        order = np.argsort(-a.astype(np.int64), axis=-1, kind="stable")[..., :top_k]
        return order, np.full(order.shape, 1.0 / top_k, dtype=np.float32), None, E
    logits = a.astype(np.float64)
    if not np.isfinite(logits).all():
        raise TraceError(f"{where}: router logits contain NaN or infinity")
    order = np.argsort(-logits, axis=-1, kind="stable")[..., :top_k]
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return order, np.take_along_axis(p, order, axis=-1).astype(np.float32), a.astype(np.float32), E


def read_lrc_arrays(
    sources: Sequence[str | Path],
    *,
    kind: str = "auto",
    num_experts: int | None = None,
    top_k: int | None = None,
    prefill: int = 0,
    keep_logits: bool = False,
) -> Trace:
    """Per-layer moe-lrc arrays -> one request per sequence."""
    positive_option(num_experts, "--num-experts")
    positive_option(top_k, "--top-k")
    files = _layer_files(sources)
    layers = [_to_topk(_read_arrays(f), kind, num_experts, top_k, str(f)) for f in files]
    where = ", ".join(str(f) for f in files[:3]) + (" ..." if len(files) > 3 else "")
    shapes = {t.shape for t, _, _, _ in layers}
    if len(shapes) != 1:
        raise TraceError(f"{where}: layers disagree on [sequences, tokens, k]: {sorted(shapes)}")
    S, T, k = shapes.pop()
    if S == 0:
        raise TraceError(f"{where}: the arrays hold no sequences; nothing to import")
    seen_E = {e for _, _, _, e in layers if e is not None}
    if len(seen_E) > 1:
        raise TraceError(f"{where}: layers disagree on the expert count {sorted(seen_E)}")
    if num_experts is not None and seen_E and seen_E != {num_experts}:
        raise TraceError(f"{where}: --num-experts {num_experts}, but the arrays have {seen_E.pop()} columns (one per expert)")
    if num_experts is None:
        if not seen_E:
            raise TraceError(f"{where}: expert-id arrays need --num-experts")
        num_experts = seen_E.pop()
    try:
        g = Geometry(layers=len(files), experts=num_experts, top_k=k)
    except GeometryError as exc:
        raise TraceError(f"{where}: {exc}") from None
    topk = np.stack([t for t, _, _, _ in layers], axis=2)  # [S, T, L, k]
    bad = (topk < 0) | (topk >= num_experts)
    if bad.any():
        s, t, layer, j = (int(x[0]) for x in np.nonzero(bad))
        raise TraceError(f"{files[layer]}: sequence {s}, token {t}: expert id {int(topk[s, t, layer, j])} outside "
                         f"[0, {num_experts})")
    weights = np.stack([w for _, w, _, _ in layers], axis=2)
    logits = None
    if keep_logits and all(lg is not None for _, _, lg, _ in layers):
        logits = np.stack([lg for _, _, lg, _ in layers], axis=2)
    if not 0 <= prefill <= T:
        raise TraceError(f"{where}: prefill {prefill} outside [0, {T}] tokens")
    requests = [
        Request(
            topk=topk[s].astype(np.int16),
            weights=weights[s],
            prefill=prefill,
            logits=None if logits is None else logits[s],
        )
        for s in range(S)
    ]
    return checked_trace(g, requests, {"source_model": "unknown", "recorded_by": f"moe-lrc arrays ({len(files)} layer files)"},
                         where)

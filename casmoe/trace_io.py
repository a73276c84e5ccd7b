"""A trace on disk: one `.npz` (never pickled), saved atomically, read with its sizes checked first.

The archive's arrays are the requests' concatenated tokens (`topk`, `weights` and the optional
`logits`, `spec`), `offsets` partitioning them into requests, `prefill`, the optional `arrival`
and `output_ids` / `output_offsets`, plus JSON metadata stored as a uint8 array. Loading checks
how the arrays partition into requests; each request's own shapes and ranges are checked once,
by `Request` and `Trace` themselves when built. `validate_trace` adds what construction leaves
out because it costs more (a token routed to the same expert twice, a gap row mixing real ids,
weights on a gap): saving and loading run it, and importers call it on what they read.

A process reads one file many times over (a leaderboard's policies each read their profile, the
train half of a trace), so the last files decoded are kept by the digest of their bytes: a
file read again costs its read and digest, and an edited file is new bytes, so never stale.
Their arrays are read-only, as every loaded trace's are, because the requests are shared.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import threading
import zipfile
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Any

import numpy as np

from casmoe.filekind import NPZ, one_line, reading, require
from casmoe.geometry import Geometry, GeometryError
from casmoe.npz import check_sizes, format_meta
from casmoe.output import atomic_open, check_file_target
from casmoe.trace import NOT_COMPUTED, Request, Trace, TraceError

FORMAT_NAME = "casmoe-trace"
FORMAT_VERSION = 1
TOKEN_ARRAYS = ("topk", "weights", "logits", "spec")
"""The arrays with one row per token, concatenated over the requests."""


def save_trace(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Validate, then write atomically: an interrupted write leaves the old file intact."""
    path = check_file_target(path, "trace")
    validate_trace(trace, str(path))
    arrays = trace_arrays(trace)
    with atomic_open(path, "wb") as fh:
        np.savez_compressed(fh, **arrays)


def trace_arrays(trace: Trace) -> dict[str, np.ndarray]:
    """The archive's arrays for a trace (validated: optional arrays are all or none)."""
    reqs, g = trace.requests, trace.geometry
    meta = dict(trace.meta)
    meta.setdefault("created", datetime.now(timezone.utc).isoformat(timespec="seconds"))
    meta.update(
        format=FORMAT_NAME,
        version=FORMAT_VERSION,
        geometry=g.to_dict(),
        requests=[{"prompt": r.prompt, "task": r.task,
                   **({"output": r.output} if r.output is not None else {})} for r in reqs],
    )
    empty3 = np.zeros((0, g.layers, g.top_k))
    arrays = {
        "meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
        "topk": np.concatenate([r.topk for r in reqs] or [empty3]).astype(np.int16),
        "weights": np.concatenate([r.weights for r in reqs] or [empty3]).astype(np.float32),
        "offsets": np.cumsum([0] + [r.tokens for r in reqs]).astype(np.int64),
        "prefill": np.array([r.prefill for r in reqs], dtype=np.int64),
    }
    if not reqs:
        return arrays
    first = reqs[0]
    for name in ("logits", "spec"):
        if getattr(first, name) is not None:
            arrays[name] = np.concatenate([getattr(r, name) for r in reqs]).astype(np.int16 if name == "spec" else np.float32)
    if first.arrival is not None:
        arrays["arrival"] = np.array([r.arrival for r in reqs], dtype=np.float64)
    if first.output_ids is not None:
        arrays["output_ids"] = np.concatenate([r.output_ids for r in reqs]).astype(np.int32)
        arrays["output_offsets"] = np.cumsum([0] + [len(r.output_ids) for r in reqs]).astype(np.int64)
    return arrays


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate; every fault raises `TraceError` naming the file (a file of another
    kind is named as what it is: `casmoe.filekind`)."""
    where = str(path)
    require(path, NPZ, "a casmoe trace (.npz)", TraceError,
            hint="convert other formats with `casmoe trace import`")
    with reading(where):
        return _load_trace(path, where)


KEEP_BYTES = 256 * 2**20
"""Decoded arrays kept for files read again, at most (the least recently read go first)."""
_DECODED: OrderedDict[bytes, tuple[Trace, int]] = OrderedDict()
_KEEPING = threading.Lock()


def _load_trace(path: str | os.PathLike[str], where: str) -> Trace:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise TraceError(f"{where}: no such file") from None
    except OSError as exc:
        raise TraceError(f"{where}: not a readable casmoe trace (.npz): {one_line(exc)}") from None
    key = hashlib.blake2b(data, digest_size=16).digest()
    with _KEEPING:
        kept = _DECODED.get(key)
        if kept is not None:
            _DECODED.move_to_end(key)
    if kept is None:
        trace, size = _decode(data, where)
        if size > KEEP_BYTES:  # too large to keep alive: the caller's own
            return trace
        with _KEEPING:
            _DECODED[key] = kept = trace, size
            while sum(s for _, s in _DECODED.values()) > KEEP_BYTES:
                _DECODED.popitem(last=False)
    trace = kept[0]
    # a trace of its own: the caller may edit its list and metadata; the requests are read-only
    return Trace(trace.geometry, list(trace.requests), copy.deepcopy(trace.meta))


def _decode(data: bytes, where: str) -> tuple[Trace, int]:
    """The trace an archive's bytes hold, with its arrays made read-only, and their size."""
    try:
        check_sizes(io.BytesIO(data), where, TraceError)  # before anything is inflated
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except TraceError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, RuntimeError) as exc:
        raise TraceError(f"{where}: not a readable casmoe trace (.npz): {one_line(exc)}") from None
    except MemoryError:
        raise
    except Exception as exc:  # zlib.error and friends from corrupted members
        raise TraceError(f"{where}: corrupted trace file: {type(exc).__name__}: {one_line(exc)}") from None
    arrays = {name: arr for name, arr in arrays.items() if isinstance(arr, np.ndarray)}  # not raw bytes
    for arr in arrays.values():
        arr.flags.writeable = False
    return trace_from_arrays(arrays, where), sum(arr.nbytes for arr in arrays.values())


def trace_from_arrays(arrays: dict[str, np.ndarray], where: str) -> Trace:
    """The trace an archive's arrays hold, checked as a whole; faults name `where`."""
    for name in ("meta", "topk", "weights", "offsets", "prefill"):
        if name not in arrays:
            raise TraceError(f"{where}: missing array {name!r}")
    meta, geometry = _meta(arrays["meta"], where)
    topk = arrays["topk"]
    if topk.ndim == 0:
        raise TraceError(f"{where}: topk is a single value, not [tokens, {geometry.layers}, {geometry.top_k}] expert ids")
    for name in TOKEN_ARRAYS:
        arr = arrays.get(name)
        if arr is not None and (arr.ndim == 0 or len(arr) != len(topk)):
            raise TraceError(f"{where}: {name} has shape {list(arr.shape)}: not one row per token ({len(topk)})")
    offsets, prefill = _partition(arrays, meta, len(topk), where)
    n = len(prefill)
    arrival = arrays.get("arrival")
    if arrival is not None and (arrival.ndim != 1 or len(arrival) != n or arrival.dtype.kind != "f"):
        raise TraceError(f"{where}: arrival must be a float array with one time per request")
    outputs = _output_ids(arrays, n, where)
    info = meta.pop("requests")
    requests = []
    for i in range(n):
        a, b = int(offsets[i]), int(offsets[i + 1])
        r = info[i]
        if not isinstance(r, dict) or not all(isinstance(r.get(f), (str, type(None))) for f in ("prompt", "task", "output")):
            raise TraceError(f"{where}: request {i}: metadata must be an object whose prompt, task and output are strings")
        cut = {name: arrays[name][a:b] if name in arrays else None for name in TOKEN_ARRAYS}
        try:
            requests.append(Request(
                prefill=int(prefill[i]), prompt=r.get("prompt"), task=r.get("task"),
                arrival=None if arrival is None else float(arrival[i]),
                output_ids=None if outputs is None else outputs[i], output=r.get("output"), **cut,
            ))
        except TraceError as exc:
            raise exc.within(f"{where}: request {i}") from None
    for name in ("format", "version", "geometry"):
        meta.pop(name, None)
    try:
        trace = Trace(geometry, requests, meta)
    except TraceError as exc:
        raise exc.within(where) from None
    _check_rows(where, topk, arrays["weights"], offsets)
    return trace


def validate_trace(trace: Trace, where: str = "<trace>") -> None:
    """Raise `TraceError` for any inconsistency, naming `where`, the request and the fault:
    the construction checks again (fields may have changed since), then the costlier ones."""
    try:
        for i, r in enumerate(trace.requests):
            try:
                r.check()
            except TraceError as exc:
                raise exc.within(f"request {i}") from None
        trace.check()
    except TraceError as exc:
        raise exc.within(where) from None
    if trace.requests:
        cat = lambda name: np.concatenate([getattr(r, name) for r in trace.requests])  # noqa: E731
        _check_rows(where, cat("topk"), cat("weights"), np.cumsum([0] + [r.tokens for r in trace.requests]))


def checked_trace(geometry: Geometry, requests: list[Request], meta: dict[str, Any], where: str) -> Trace:
    """The trace an importer read from `where`, built and validated as a loaded file is: every
    fault, from construction on, names `where`."""
    try:
        trace = Trace(geometry, requests, meta)
    except TraceError as exc:
        raise exc.within(where) from None
    validate_trace(trace, where)
    return trace


def _check_rows(where: str, topk: np.ndarray, weights: np.ndarray, offsets: np.ndarray) -> None:
    """What construction does not check, on the concatenated rows: a gap is a whole row of
    `NOT_COMPUTED` with zero weights, and no token routes to the same expert twice."""

    def fail(token: int, what: str) -> None:
        req = int(np.searchsorted(offsets, token, side="right") - 1)
        raise TraceError(f"{where}: request {req}: token {token - int(offsets[req])}: {what}")

    if len(topk) == 0:
        return
    gap = topk == NOT_COMPUTED
    row_gap = gap.all(axis=2)
    mixed = gap.any(axis=2) & ~row_gap
    if mixed.any():
        fail(int(np.nonzero(mixed)[0][0]), "a token-layer mixes NOT_COMPUTED (-1) with real expert ids")
    k = topk.shape[2]
    if k > 1:
        if k <= 8:  # pairwise slot compares beat a sort for the usual small k
            dup = np.zeros(topk.shape[:2], dtype=bool)
            for i in range(k):
                for j in range(i + 1, k):
                    dup |= topk[:, :, i] == topk[:, :, j]
            dup &= ~row_gap
        else:
            srt = np.sort(topk, axis=2)
            dup = np.any((srt[:, :, 1:] == srt[:, :, :-1]) & (srt[:, :, 1:] != NOT_COMPUTED), axis=2)
        if dup.any():
            t, layer = (int(x[0]) for x in np.nonzero(dup))
            fail(t, f"layer {layer}: routes to the same expert twice {sorted(topk[t, layer].tolist())}")
    if row_gap.any() and np.any(weights[row_gap] != 0):
        fail(int(np.nonzero((weights != 0).any(axis=2) & row_gap)[0][0]), "a NOT_COMPUTED token-layer has non-zero router weights")


def _meta(raw: np.ndarray, where: str) -> tuple[dict[str, Any], Geometry]:
    """The archive's JSON metadata and the geometry it declares."""
    meta = format_meta(raw, where, TraceError, FORMAT_NAME, FORMAT_VERSION)
    try:
        geometry = Geometry.from_dict(meta["geometry"])
    except (KeyError, TypeError, ValueError, GeometryError) as exc:
        raise TraceError(f"{where}: bad geometry in metadata: {exc}") from exc
    return meta, geometry


def _partition(arrays: dict[str, np.ndarray], meta: dict[str, Any], tokens: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """`offsets` (int64, n + 1) and `prefill` (int64, n), checked to split the `tokens` rows
    into the n requests the metadata describes."""
    offsets, prefill = arrays["offsets"], arrays["prefill"]
    for name, arr in (("offsets", offsets), ("prefill", prefill)):
        if not np.issubdtype(arr.dtype, np.integer):
            raise TraceError(f"{where}: {name} must hold integers, not {arr.dtype}")
        if arr.size and arr.max() > np.iinfo(np.int64).max // 2:
            raise TraceError(f"{where}: {name} holds {arr.max()}, far beyond any token count")
    offsets, prefill = offsets.astype(np.int64), prefill.astype(np.int64)  # signed: a step back is < 0
    info = meta.get("requests", [])
    n = len(prefill) if prefill.ndim == 1 else -1
    counts_agree = offsets.ndim == 1 and len(offsets) == n + 1 and isinstance(info, list) and len(info) == n
    if prefill.ndim != 1 or not counts_agree:
        raise TraceError(f"{where}: offsets, prefill and request metadata disagree on the request count")
    if n and (offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] != tokens):
        raise TraceError(f"{where}: offsets do not partition the {tokens} tokens")
    if not n and tokens:
        raise TraceError(f"{where}: tokens without requests")
    meta["requests"] = info
    return offsets, prefill


def _output_ids(arrays: dict[str, np.ndarray], n: int, where: str) -> list[np.ndarray] | None:
    """Per request its output token ids, from the `output_ids` / `output_offsets` pair."""
    ids, offsets = arrays.get("output_ids"), arrays.get("output_offsets")
    if ids is None and offsets is None:
        return None
    if ids is None or offsets is None:
        raise TraceError(f"{where}: output_ids and output_offsets come together")
    if not (np.issubdtype(ids.dtype, np.integer) and np.issubdtype(offsets.dtype, np.integer)):
        raise TraceError(f"{where}: output_ids and output_offsets must hold integers")
    if ids.ndim != 1 or offsets.ndim != 1 or len(offsets) != n + 1:
        raise TraceError(f"{where}: output_offsets must hold one entry per request plus one")
    if offsets.size and offsets.max() > np.iinfo(np.int64).max // 2:
        raise TraceError(f"{where}: output_offsets hold {offsets.max()}, far beyond any token count")
    offsets = offsets.astype(np.int64)  # signed: a step back is < 0, not a wrap-around
    if offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] != len(ids):
        raise TraceError(f"{where}: output_offsets do not partition the {len(ids)} output ids")
    return [ids[offsets[i]:offsets[i + 1]] for i in range(n)]

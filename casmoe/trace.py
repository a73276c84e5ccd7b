"""Routing traces: which experts every token used at every MoE layer, and how they are stored.

One trace format serves the replay runtime, the simulator, the real backend, the planner and
the metrics. On disk it is one `.npz` (never pickled) whose arrays are the requests'
concatenated tokens, plus JSON metadata stored as a uint8 array. A token-layer that was not
computed (some engines skip the last layer for all prompt tokens but the last) is a row of
`NOT_COMPUTED` ids with zero weight: the format never invents experts, and every runtime and
metric skips such rows.

Runtimes walk *steps*: a request's prefill is one step over all its prompt tokens (the union
of their experts per layer), each decode token one step. `Future` precomputes, once, when each
expert is next used, so oracle policies read the future as data instead of scanning a trace.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import chain
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry, GeometryError
from casmoe.npz import check_sizes

FORMAT_NAME = "casmoe-trace"
FORMAT_VERSION = 1
NOT_COMPUTED = -1
"""Expert id marking a token-layer that the recording engine did not compute."""


class TraceError(CasmoeError, ValueError):
    """A trace that cannot be read or is inconsistent; the message names file, request and fault."""


@dataclass(eq=False)
class Request:
    """One prompt and its generated tokens.

    `topk[T, L, k]` holds expert ids per token and layer (`NOT_COMPUTED` rows for gaps),
    `weights[T, L, k]` their router weights. In memory (never in a file), a token-layer may
    route to fewer than k experts, its last slots `NOT_COMPUTED` (`casmoe.gating`). The first `prefill` tokens are the prompt.
    `logits[T, L, E]` (full router scores) and `spec[T, L, k]` (what layer l+1's router picks
    from layer l's hidden state; row L-1 is `NOT_COMPUTED`) are optional. `arrival` (seconds
    from the start of the recording, finite and >= 0) is when the request reached the server:
    optional, for every request or for none; the simulator's `--arrival trace` replays it.
    The tokens the request produced after its prompt are optional too: `output_ids` (1-D token
    ids, generated or teacher-forced, the end-of-text token included when reached) and
    `output`, their text.
    """

    topk: np.ndarray
    weights: np.ndarray
    prefill: int
    prompt: str | None = None
    task: str | None = None
    logits: np.ndarray | None = None
    spec: np.ndarray | None = None
    arrival: float | None = None
    output_ids: np.ndarray | None = None
    output: str | None = None

    @property
    def tokens(self) -> int:
        return int(self.topk.shape[0])

    @property
    def decode_tokens(self) -> int:
        return self.tokens - self.prefill

    @property
    def computed(self) -> np.ndarray:
        """Bool [T, L]: whether the token-layer was computed (not a gap)."""
        return self.topk[:, :, 0] != NOT_COMPUTED

    def layer_slice(self, layers: range) -> Request:
        """This request's routing at `layers` only (a device's share; ids stay per layer)."""
        sl = slice(layers.start, layers.stop)
        cut = lambda a: None if a is None else a[:, sl]  # noqa: E731
        return Request(cut(self.topk), cut(self.weights), self.prefill, self.prompt, self.task, cut(self.logits),
                       cut(self.spec), self.arrival, self.output_ids, self.output)

    def steps(self, geometry: Geometry) -> list[Step]:
        """Prefill as one step (if any prompt tokens), then one step per decode token."""
        L, E = geometry.layers, geometry.experts
        offsets = (np.arange(L, dtype=np.int64) * E)[None, :, None]
        steps: list[Step] = []
        if self.prefill:
            steps.append(prefill_step(self.topk[: self.prefill], self.weights[: self.prefill], offsets, E))
        dec = self.topk[self.prefill :].astype(np.int64)
        if len(dec):
            flat = dec + offsets  # [T, L, k]
            rows = flat.tolist()
            short = dec == NOT_COMPUTED  # [T, L, k]: gaps, and the slots a gated token-layer dropped
            if short.any():
                for t, layer in zip(*np.nonzero(short.any(axis=2))):
                    rows[t][layer] = flat[t, layer][~short[t, layer]].tolist()
            steps.extend(Step(False, 1, r) for r in rows)
        return steps


def expert_counts(topk: np.ndarray, experts: int) -> np.ndarray:
    """[L, E] int64: how many of the tokens `topk[T, L, k]` route to each expert (gaps skipped)."""
    L = topk.shape[1]
    ids = topk.astype(np.int64)
    flat = (ids + (np.arange(L, dtype=np.int64) * experts)[None, :, None])[ids >= 0]
    return np.bincount(flat, minlength=L * experts).reshape(L, experts)


def prefill_union(topk: np.ndarray, weights: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The one definition of a prefill's routing: per layer, the union of the prompt tokens'
    experts (`topk[T, L, k] + offsets`, gaps skipped), heaviest total router weight first, the
    lowest id among equals. Returns (experts per layer [L], their flat ids, tokens routed to
    each), the layers concatenated; `prefill_step` and `StepArrays` build on it."""
    T, L, k = topk.shape
    flat = np.where(topk >= 0, topk.astype(np.int64) + offsets, -1).ravel()  # [T * L * k], token-major
    layer = np.broadcast_to(np.arange(L, dtype=np.int64)[None, :, None], topk.shape).ravel()
    w = weights.ravel().astype(np.float64)
    keep = flat >= 0
    flat, layer, w = flat[keep], layer[keep], w[keep]
    span = int(flat.max()) + 1 if flat.size else 1
    keys, inv = np.unique(layer * span + flat, return_inverse=True)  # one key per (layer, expert)
    wsum = np.bincount(inv, weights=w, minlength=len(keys))  # summed in token order
    count = np.bincount(inv, minlength=len(keys))
    layer_of, ids = keys // span, keys % span
    order = np.lexsort((ids, -wsum, layer_of))
    return np.bincount(layer_of, minlength=L).astype(np.int64), ids[order], count[order]


def prefill_step(topk: np.ndarray, weights: np.ndarray, offsets: np.ndarray, E: int) -> Step:
    """A prompt (`topk[T, L, k]`) as one step: `prefill_union` as per-layer lists."""
    lens, ids, count = prefill_union(topk, weights, offsets)
    bounds = np.concatenate([[0], np.cumsum(lens)]).tolist()
    ids, counts = ids.tolist(), count.tolist()
    return Step(True, int(topk.shape[0]), [ids[a:b] for a, b in zip(bounds, bounds[1:])],
                [counts[a:b] for a, b in zip(bounds, bounds[1:])])


@dataclass(slots=True)
class Step:
    """What one forward pass routes: per layer, the flat expert ids it needs.

    `experts[layer]` is ordered by descending router weight (the order a streaming prefill
    would load them); an empty list means the layer was not computed. `counts[layer][i]` is
    how many tokens routed to `experts[layer][i]`; `None` means one each (a decode token).
    """

    prefill: bool
    tokens: int
    experts: list[list[int]]
    counts: list[list[int]] | None = None
    requests: tuple[int, ...] = ()

    def layer_slice(self, layers: range, experts: int) -> Step:
        """This step at `layers` only, flat ids renumbered from the first of them."""
        off = layers.start * experts
        return Step(
            self.prefill,
            self.tokens,
            [[e - off for e in lst] for lst in self.experts[layers.start : layers.stop]],
            None if self.counts is None else self.counts[layers.start : layers.stop],
            self.requests,
        )


@dataclass
class Trace:
    """A geometry, its requests and free-form provenance metadata."""

    geometry: Geometry
    requests: list[Request]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.requests)

    @property
    def has_prompts(self) -> bool:
        return bool(self.requests) and all(r.prompt is not None for r in self.requests)

    def steps(self, batch: int = 1) -> list[Step]:
        """The runtime's step sequence. `batch` > 1 merges the decode tokens of `batch`
        consecutive requests into shared steps (each request still prefills alone)."""
        if batch < 1:
            raise ValueError("batch must be >= 1")
        out: list[Step] = []
        for start in range(0, len(self.requests), batch):
            group = list(range(start, min(start + batch, len(self.requests))))
            per_req = {i: self.requests[i].steps(self.geometry) for i in group}
            decodes: dict[int, list[Step]] = {}
            for i in group:
                req_steps = per_req[i]
                if self.requests[i].prefill:
                    first = req_steps[0]
                    first.requests = (i,)
                    out.append(first)
                    req_steps = req_steps[1:]
                decodes[i] = req_steps
            if batch == 1:
                for s in decodes[group[0]]:
                    s.requests = (group[0],)
                    out.append(s)
                continue
            longest = max((len(v) for v in decodes.values()), default=0)
            for t in range(longest):
                parts = [(i, decodes[i][t]) for i in group if t < len(decodes[i])]
                out.append(merge_steps([p for _, p in parts], tuple(i for i, _ in parts)))
        return out

    def popularity(self) -> np.ndarray:
        """[L, E] int64: how many computed token-layers routed to each expert (gaps skipped)."""
        g = self.geometry
        counts = np.zeros((g.layers, g.experts), dtype=np.int64)
        for r in self.requests:
            counts += expert_counts(r.topk, g.experts)
        return counts

    def summary(self, top: int = 4) -> dict[str, Any]:
        """Counts and per-layer popularity (`routed`, `distinct` experts, share of the `top`
        hottest) as plain values, for `casmoe trace info` and scripts."""
        g = self.geometry
        prefill = sum(r.prefill for r in self.requests)
        counts = self.popularity()  # [L, E]
        layers = []
        for layer, row in enumerate(counts):
            total = int(row.sum())
            order = [int(e) for e in row.argsort(kind="stable")[::-1][:top] if row[e]]
            layers.append(
                {
                    "layer": layer,
                    "routed": total,
                    "distinct": int((row > 0).sum()),
                    "top_share": float(row[order].sum() / total) if total else 0.0,
                    "hottest": [[e, float(row[e] / total)] for e in order],
                }
            )
        first = self.requests[0] if self.requests else None
        return {
            "geometry": g.to_dict(),
            "expert_bytes": g.bytes_per_layer(),
            "requests": len(self.requests),
            "tokens": self.tokens,
            "prefill_tokens": prefill,
            "decode_tokens": self.tokens - prefill,
            "not_computed": sum(int((~r.computed).sum()) for r in self.requests),
            "prompts": self.has_prompts,
            "tasks": sorted({r.task for r in self.requests if r.task}),
            "optional": [
                n for n in ("logits", "spec", "arrival", "output_ids") if first is not None and getattr(first, n) is not None
            ],
            "meta": self.meta,
            "layers": layers,
        }

    def subset(self, indices: Sequence[int]) -> Trace:
        """The requests at `indices`, in that order; per-request metadata (`meta["splits"]`)
        follows them, so a subset's split labels still name its own requests."""
        indices, meta = list(indices), dict(self.meta)
        splits = meta.get("splits")
        if isinstance(splits, list) and len(splits) == len(self.requests):
            meta["splits"] = [splits[i] for i in indices]
        return Trace(self.geometry, [self.requests[i] for i in indices], meta)

    def layer_slice(self, layers: range) -> Trace:
        """The trace a device's cache sees: its `layers` only, numbered from 0."""
        return Trace(self.geometry.layer_slice(layers), [r.layer_slice(layers) for r in self.requests], dict(self.meta))

    # ---- storage -------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Validate, then write atomically: an interrupted write leaves the old file intact."""
        from casmoe.output import atomic_open, check_file_target

        path = check_file_target(path, "trace")
        self.validate(str(path))
        arrays = self._to_arrays()
        with atomic_open(path, "wb") as fh:
            np.savez_compressed(fh, **arrays)

    def _to_arrays(self) -> dict[str, np.ndarray]:
        reqs = self.requests
        g = self.geometry
        meta = dict(self.meta)
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
        for name in ("logits", "spec"):
            present = [getattr(r, name) is not None for r in reqs]
            if reqs and all(present):
                arr = np.concatenate([getattr(r, name) for r in reqs])
                arrays[name] = arr.astype(np.int16 if name == "spec" else np.float32)
            elif any(present):
                raise TraceError(f"{name} must be given for every request or for none")
        arrival = _arrivals(reqs, "<trace>")
        if arrival is not None:
            arrays["arrival"] = arrival
        present = [r.output_ids is not None for r in reqs]
        if reqs and all(present):
            arrays["output_ids"] = np.concatenate([r.output_ids for r in reqs]).astype(np.int32)
            arrays["output_offsets"] = np.cumsum([0] + [len(r.output_ids) for r in reqs]).astype(np.int64)
        elif any(present):
            raise TraceError("output_ids must be given for every request or for none")
        return arrays

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trace:
        """Read and validate; every fault raises `TraceError` naming the file."""
        where = str(path)
        try:
            with open(path, "rb") as fh:
                data = fh.read()
            if data[:2] != b"PK":
                raise TraceError(
                    f"{where}: not an .npz file (a casmoe trace is a zip of .npy arrays); "
                    "convert other formats with `casmoe trace import`"
                )
            check_sizes(io.BytesIO(data), where, TraceError)  # before anything is inflated
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in npz.files}
        except FileNotFoundError:
            raise TraceError(f"{where}: no such file") from None
        except TraceError:
            raise
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, RuntimeError) as exc:
            raise TraceError(f"{where}: not a readable casmoe trace (.npz): {exc}") from exc
        except Exception as exc:  # zlib.error and friends from corrupted members
            raise TraceError(f"{where}: corrupted trace file: {type(exc).__name__}: {exc}") from exc
        return cls._from_arrays(arrays, where)

    @classmethod
    def _from_arrays(cls, arrays: dict[str, np.ndarray], where: str) -> Trace:
        for name in ("meta", "topk", "weights", "offsets", "prefill"):
            if name not in arrays:
                raise TraceError(f"{where}: missing array {name!r}")
        if arrays["meta"].dtype != np.uint8 or arrays["meta"].ndim != 1:
            raise TraceError(f"{where}: metadata must be a 1-D uint8 array of JSON text")
        try:
            meta = json.loads(arrays["meta"].tobytes().decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TraceError(f"{where}: metadata is not valid JSON: {exc}") from exc
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
            raise TraceError(f"{where}: not a {FORMAT_NAME} file")
        if meta.get("version") != FORMAT_VERSION:
            raise TraceError(
                f"{where}: unknown format version {meta.get('version')!r} (this casmoe reads {FORMAT_VERSION})"
            )
        try:
            geometry = Geometry.from_dict(meta["geometry"])
        except (KeyError, TypeError, ValueError, GeometryError) as exc:
            raise TraceError(f"{where}: bad geometry in metadata: {exc}") from exc
        offsets, prefill = arrays["offsets"], arrays["prefill"]
        topk, weights = arrays["topk"], arrays["weights"]
        optional = {name: arrays.get(name) for name in ("logits", "spec")}
        arrival = arrays.get("arrival")
        if arrival is not None and (arrival.ndim != 1 or len(arrival) != len(prefill) or arrival.dtype.kind != "f"):
            raise TraceError(f"{where}: arrival must be a float array with one time per request")
        g = geometry
        if topk.ndim != 3:
            raise TraceError(f"{where}: topk has shape {topk.shape}, expected [tokens, {g.layers}, {g.top_k}]")
        for name, arr, last in (
            ("topk", topk, g.top_k),
            ("weights", weights, g.top_k),
            ("logits", optional["logits"], g.experts),
            ("spec", optional["spec"], g.top_k),
        ):
            if arr is not None and (arr.ndim != 3 or arr.shape[1:] != (g.layers, last) or len(arr) != len(topk)):
                raise TraceError(f"{where}: {name} has shape {arr.shape}, expected [{len(topk)}, {g.layers}, {last}]")
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
        if n and (offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] != len(topk)):
            raise TraceError(f"{where}: offsets do not partition the {len(topk)} tokens")
        if not n and len(topk):
            raise TraceError(f"{where}: tokens without requests")
        outputs = _output_ids(arrays, n, where)
        requests = []
        for i in range(n):
            a, b = int(offsets[i]), int(offsets[i + 1])
            r = info[i]
            fields = ("prompt", "task", "output")
            if not isinstance(r, dict) or not all(isinstance(r.get(f), (str, type(None))) for f in fields):
                raise TraceError(f"{where}: request {i}: metadata must be an object whose prompt, task and output are strings")
            requests.append(
                Request(
                    topk=topk[a:b],
                    weights=weights[a:b],
                    prefill=int(prefill[i]),
                    prompt=r.get("prompt"),
                    task=r.get("task"),
                    logits=None if optional["logits"] is None else optional["logits"][a:b],
                    spec=None if optional["spec"] is None else optional["spec"][a:b],
                    arrival=None if arrival is None else float(arrival[i]),
                    output_ids=None if outputs is None else outputs[i],
                    output=r.get("output"),
                )
            )
        for name in ("format", "version", "geometry", "requests"):
            meta.pop(name, None)
        _check_splits(meta, n, where)
        trace = cls(geometry, requests, meta)
        trace._validate_arrays(where, topk, weights, offsets, optional)
        _arrivals(requests, where)
        return trace

    # ---- validation ----------------------------------------------------------------------

    def validate(self, where: str = "<trace>") -> None:
        """Raise `TraceError` for any inconsistency, naming the request and the fault."""
        g = self.geometry
        _check_splits(self.meta, len(self.requests), where)
        for i, r in enumerate(self.requests):
            for name in ("topk", "weights", "logits", "spec"):
                arr = getattr(r, name)
                want = (g.layers, g.experts if name == "logits" else g.top_k)
                if arr is not None and (arr.ndim != 3 or arr.shape[1:] != want or len(arr) != len(r.topk)):
                    raise TraceError(
                        f"{where}: request {i}: {name} has shape {arr.shape}, "
                        f"expected [{len(r.topk)}, {want[0]}, {want[1]}]"
                    )
            ids = r.output_ids
            if ids is not None and (ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer) or np.any(ids < 0)):
                raise TraceError(f"{where}: request {i}: output_ids must be a 1-D array of token ids >= 0")
        if not self.requests:
            return
        _arrivals(self.requests, where)
        cat = lambda name: np.concatenate([getattr(r, name) for r in self.requests])  # noqa: E731
        offsets = np.cumsum([0] + [r.tokens for r in self.requests])
        optional = {
            name: cat(name) if all(getattr(r, name) is not None for r in self.requests) else None
            for name in ("logits", "spec")
        }
        self._validate_arrays(where, cat("topk"), cat("weights"), offsets, optional)

    def _validate_arrays(
        self,
        where: str,
        topk: np.ndarray,
        weights: np.ndarray,
        offsets: np.ndarray,
        optional: dict[str, np.ndarray | None],
    ) -> None:
        g = self.geometry
        N = len(topk)

        def fail(token: int | None, what: str) -> None:
            if token is None:
                raise TraceError(f"{where}: {what}")
            req = int(np.searchsorted(offsets, token, side="right") - 1)
            raise TraceError(f"{where}: request {req}, token {token - int(offsets[req])}: {what}")

        for name, arr, last in (("topk", topk, g.top_k), ("weights", weights, g.top_k)):
            if arr.ndim != 3 or arr.shape != (N, g.layers, last):
                fail(None, f"{name} has shape {arr.shape}, expected [{N}, {g.layers}, {last}]")
        if not np.issubdtype(topk.dtype, np.integer):
            fail(None, f"topk must hold integers, not {topk.dtype}")
        if not np.issubdtype(weights.dtype, np.floating):
            fail(None, f"weights must hold floats, not {weights.dtype}")
        spec, logits = optional.get("spec"), optional.get("logits")
        if spec is not None and not np.issubdtype(spec.dtype, np.integer):
            fail(None, f"spec must hold integers, not {spec.dtype}")
        if logits is not None and not np.issubdtype(logits.dtype, np.floating):
            fail(None, f"logits must hold floats, not {logits.dtype}")
        for i, r in enumerate(self.requests):
            if not 0 <= r.prefill <= r.tokens:
                raise TraceError(f"{where}: request {i}: prefill {r.prefill} outside [0, {r.tokens}] tokens")
        if N == 0:
            return
        gap = topk == NOT_COMPUTED
        row_gap = gap.all(axis=2)
        if np.any(gap.any(axis=2) & ~row_gap):
            t = int(np.nonzero(gap.any(axis=2) & ~row_gap)[0][0])
            fail(t, "a token-layer mixes NOT_COMPUTED (-1) with real expert ids")
        bad = ~gap & ((topk < 0) | (topk >= g.experts))
        if bad.any():
            t, layer, j = (int(x[0]) for x in np.nonzero(bad))
            fail(t, f"layer {layer}: expert id {int(topk[t, layer, j])} outside [0, {g.experts})")
        if g.top_k > 1:
            k = g.top_k
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
            t = int(np.nonzero((weights != 0).any(axis=2) & row_gap)[0][0])
            fail(t, "a NOT_COMPUTED token-layer has non-zero router weights")
        finite = np.isfinite(weights)
        if not finite.all():
            t = int(np.nonzero(~finite.all(axis=(1, 2)))[0][0])
            fail(t, "router weight is NaN or infinite")
        if np.any(weights < 0):
            t = int(np.nonzero((weights < 0).any(axis=(1, 2)))[0][0])
            fail(t, "negative router weight")
        if logits is not None and (logits.ndim != 3 or logits.shape != (N, g.layers, g.experts)):
            fail(None, f"logits has shape {logits.shape}, expected [{N}, {g.layers}, {g.experts}]")
        if logits is not None and not np.isfinite(logits).all():
            fail(int(np.nonzero(~np.isfinite(logits).all(axis=(1, 2)))[0][0]), "router logit is NaN or infinite")
        if spec is not None:
            if spec.ndim != 3 or spec.shape != topk.shape:
                fail(None, f"spec has shape {spec.shape}, expected {topk.shape}")
            sbad = (spec != NOT_COMPUTED) & ((spec < 0) | (spec >= g.experts))
            if sbad.any():
                fail(int(np.nonzero(sbad)[0][0]), "spec expert id outside [0, E)")


def _arrivals(requests: Sequence[Request], where: str) -> np.ndarray | None:
    """The requests' arrival times as one float64 array (None when no request has one);
    refuses a trace where only some requests have one, or a time that is negative or not finite."""
    given = [r.arrival is not None for r in requests]
    if not any(given):
        return None
    if not all(given):
        raise TraceError(f"{where}: request {given.index(False)}: arrival must be given for every request or for none")
    times = np.array([r.arrival for r in requests], dtype=np.float64)
    bad = ~np.isfinite(times) | (times < 0)
    if bad.any():
        i = int(np.nonzero(bad)[0][0])
        raise TraceError(f"{where}: request {i}: arrival {float(times[i])!r} is not a finite time >= 0 seconds")
    return times


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
    if np.any(ids < 0):
        raise TraceError(f"{where}: negative output token id")
    return [ids[offsets[i]:offsets[i + 1]] for i in range(n)]


def merge_steps(parts: Iterable[Step], requests: tuple[int, ...]) -> Step:
    """One step computing several requests' tokens together (a batch): per layer the union of
    their experts, first seen first, with how many tokens routed to each."""
    parts = list(parts)
    L = len(parts[0].experts)
    experts: list[list[int]] = []
    counts: list[list[int]] = []
    for layer in range(L):
        tally: dict[int, int] = {}
        for p in parts:
            if p.counts is None:
                for e in p.experts[layer]:
                    tally[e] = tally.get(e, 0) + 1
            else:
                for e, c in zip(p.experts[layer], p.counts[layer]):
                    tally[e] = tally.get(e, 0) + c
        experts.append(list(tally))
        counts.append(list(tally.values()))
    return Step(any(p.prefill for p in parts), sum(p.tokens for p in parts), experts, counts, requests)


def visit_csr(steps: Sequence[Step], layers: int) -> tuple[np.ndarray, np.ndarray]:
    """A step sequence in CSR form: visit `v = step * L + layer` routes
    `experts[visit_ptr[v]:visit_ptr[v + 1]]` (int64; empty for a layer not computed)."""
    lens = np.fromiter((len(e) for s in steps for e in s.experts), np.int64, len(steps) * layers)
    experts = np.fromiter(chain.from_iterable(chain.from_iterable(s.experts for s in steps)), np.int64, int(lens.sum()))
    return np.concatenate([[0], np.cumsum(lens)]), experts


def visit_uses(visit_ptr: np.ndarray, experts: np.ndarray, total_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """The future of a step sequence in CSR form: every expert's visits in order,
    `(use_ptr [N + 1], use_visit)`. The one builder behind `Future` and `StepArrays.uses`."""
    visit = np.repeat(np.arange(len(visit_ptr) - 1, dtype=np.int64), np.diff(visit_ptr))
    order = np.argsort(experts, kind="stable")
    ptr = np.zeros(total_experts + 1, np.int64)
    ptr[1:] = np.cumsum(np.bincount(experts, minlength=total_experts))
    return ptr, visit[order]


class Future:
    """When each expert is used next, for oracle policies (computed once per step sequence).

    A *visit* is one (step, layer) pair, numbered `step * L + layer` in the runtime's order.
    """

    def __init__(self, steps: Sequence[Step], geometry: Geometry) -> None:
        self.steps = steps
        self.layers = geometry.layers
        use_ptr, use_visit = visit_uses(*visit_csr(steps, geometry.layers), geometry.total_experts)
        bounds = zip(use_ptr[:-1].tolist(), use_ptr[1:].tolist())
        visits = use_visit.tolist()
        self.uses: dict[int, list[int]] = {e: visits[a:b] for e, (a, b) in enumerate(bounds) if b > a}

    def next_use(self, expert: int, visit: int) -> float:
        """First visit strictly after `visit` that routes `expert`, or infinity."""
        lst = self.uses.get(expert)
        if not lst:
            return float("inf")
        i = bisect_right(lst, visit)
        return lst[i] if i < len(lst) else float("inf")

    def count_between(self, expert: int, after_visit: int, until_visit: int) -> int:
        """Uses of `expert` in visits (after_visit, until_visit]."""
        lst = self.uses.get(expert)
        if not lst:
            return 0
        return bisect_right(lst, until_visit) - bisect_right(lst, after_visit)


def _check_splits(meta: dict[str, Any], n: int, where: str) -> None:
    """`meta["splits"]`, when present, labels every request: a shorter list would silently
    fall back to another held-out rule (or index past its end)."""
    splits = meta.get("splits")
    if splits is not None and (
        not isinstance(splits, list) or len(splits) != n or not all(isinstance(s, str) for s in splits)
    ):
        count = len(splits) if isinstance(splits, list) else type(splits).__name__
        raise TraceError(f"{where}: metadata 'splits' must be one label (a string) per request: {count} for {n} requests")

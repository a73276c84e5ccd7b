"""Routing traces: which experts every token used at every MoE layer (the data model).

One trace serves the replay runtime, the simulator, the real backend, the planner and the
metrics. A token-layer that was not computed (some engines skip the last layer for all prompt
tokens but the last) is a row of `NOT_COMPUTED` ids with zero weight: the format never invents
experts, and every runtime and metric skips such rows. Storage (the `.npz` file) and the
thorough validation a file gets live in `casmoe.trace_io`.

A `Request` and a `Trace` check themselves when constructed, cheaply (one numpy reduction per
array, never a Python loop over tokens): shapes agree with each other and with the geometry,
ids are experts or `NOT_COMPUTED`, weights and logits finite, times finite, so bad data never
gets in. What costs more (a token routed to the same expert twice, a gap row mixing real ids)
is left to `trace_io.validate_trace`, which saving and loading run.

Runtimes walk *steps*: a request's prefill is one step over all its prompt tokens (the union
of their experts per layer), each decode token one step. `Future` precomputes, once, when each
expert is next used, so oracle policies read the future as data instead of scanning a trace.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Iterable, Sequence

import numpy as np

from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry

NOT_COMPUTED = -1
"""Expert id marking a token-layer that the recording engine did not compute."""


class TraceError(CasmoeError, ValueError):
    """A trace that cannot be read or is inconsistent; the message names file, request and fault."""

    def within(self, where: str) -> TraceError:
        """The same fault, its message prefixed by where it was found (a file, a request)."""
        return TraceError(f"{where}: {self}")


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

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise `TraceError` if the fields disagree: what needs no geometry, one numpy
        reduction per array. Construction runs it; `validate_trace` reruns it (fields can change)."""
        topk, w = self.topk, self.weights
        if not _array_of(topk, 3, np.integer):
            raise TraceError(f"topk must be an integer array [tokens, layers, k], not {_describe(topk)}")
        if not _array_of(w, 3, np.floating) or w.shape != topk.shape:
            raise TraceError(f"weights must be a float array of topk's shape {list(topk.shape)}, not {_describe(w)}")
        if not isinstance(self.prefill, (int, np.integer)) or not 0 <= self.prefill <= len(topk):
            raise TraceError(f"prefill {self.prefill!r} outside [0, {len(topk)}] tokens")
        _check_ids("", topk)
        _check_finite("router weight", w)
        if w.size and w.min() < 0:
            raise TraceError(f"token {_first_token(w < 0)}: negative router weight")
        if self.logits is not None:
            if not _array_of(self.logits, 3, np.floating) or self.logits.shape[:2] != topk.shape[:2]:
                raise TraceError(f"logits must be a float array [{len(topk)}, {topk.shape[1]}, experts], "
                                 f"not {_describe(self.logits)}")
            _check_finite("router logit", self.logits)
        if self.spec is not None:
            if not _array_of(self.spec, 3, np.integer) or self.spec.shape != topk.shape:
                raise TraceError(f"spec must be an integer array of topk's shape {list(topk.shape)}, "
                                 f"not {_describe(self.spec)}")
            _check_ids("spec ", self.spec)
        a = self.arrival
        if a is not None and (not isinstance(a, (int, float, np.number)) or not np.isfinite(a) or a < 0):
            raise TraceError(f"arrival {a!r} is not a finite time >= 0 seconds")
        ids = self.output_ids
        if ids is not None and (not _array_of(ids, 1, np.integer) or (ids.size and ids.min() < 0)):
            raise TraceError("output_ids must be a 1-D array of token ids >= 0")

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

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise `TraceError` if a request does not fit the geometry (shapes, ids in [0, E)),
        an optional array is given for some requests only, or the split labels do not match.
        Cheap: a few numpy reductions per request. Each request checked itself when built."""
        g = self.geometry
        for i, r in enumerate(self.requests):
            try:
                _check_fits(r, g)
            except TraceError as exc:
                raise exc.within(f"request {i}") from None
        for name in OPTIONAL:
            given = [getattr(r, name) is not None for r in self.requests]
            if any(given) and not all(given):
                raise TraceError(f"request {given.index(False)}: {name} must be given for every request or for none")
        check_splits(self.meta, len(self.requests))

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.requests)

    @property
    def has_prompts(self) -> bool:
        return bool(self.requests) and all(r.prompt is not None for r in self.requests)

    def steps(self, batch: int = 1, prefill_batch: int = 1) -> list[Step]:
        """The runtime's step sequence. `batch` > 1 merges the decode tokens of `batch`
        consecutive requests into shared steps; their prompts are prefilled `prefill_batch` at
        a time (1: each alone), each group's as one step (`merge_steps`: the union of their
        experts per layer, the tokens routed to each summed), as a throughput-oriented server
        (MoE-Lightning) batches prompts."""
        if batch < 1 or not 1 <= prefill_batch <= batch:
            raise ValueError("batch must be >= 1 and prefill_batch between 1 and batch")
        out: list[Step] = []
        for start in range(0, len(self.requests), batch):
            group = list(range(start, min(start + batch, len(self.requests))))
            per_req = {i: self.requests[i].steps(self.geometry) for i in group}
            decodes: dict[int, list[Step]] = {}
            prompts = [i for i in group if self.requests[i].prefill]
            for a in range(0, len(prompts), prefill_batch):
                together = prompts[a : a + prefill_batch]
                if len(together) == 1:
                    first = per_req[together[0]][0]
                    first.requests = (together[0],)
                    out.append(first)
                else:
                    out.append(merge_steps([per_req[i][0] for i in together], tuple(together)))
            for i in group:
                decodes[i] = per_req[i][1:] if self.requests[i].prefill else per_req[i]
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


OPTIONAL = ("logits", "spec", "arrival", "output_ids")
"""A request's optional fields: each is given for every request of a trace or for none."""


def check_splits(meta: dict[str, Any], n: int) -> None:
    """`meta["splits"]`, when present, labels every request: a shorter list would silently
    fall back to another held-out rule (or index past its end)."""
    splits = meta.get("splits")
    if splits is not None and (
        not isinstance(splits, list) or len(splits) != n or not all(isinstance(s, str) for s in splits)
    ):
        count = len(splits) if isinstance(splits, list) else type(splits).__name__
        raise TraceError(f"metadata 'splits' must be one label (a string) per request: {count} for {n} requests")


def _check_fits(r: Request, g: Geometry) -> None:
    T = len(r.topk)
    if r.topk.shape[1:] != (g.layers, g.top_k):
        raise TraceError(f"topk has shape {list(r.topk.shape)}, expected [{T}, {g.layers}, {g.top_k}]")
    if r.logits is not None and r.logits.shape[2] != g.experts:
        raise TraceError(f"logits has shape {list(r.logits.shape)}, expected [{T}, {g.layers}, {g.experts}]")
    for what, ids in (("", r.topk), ("spec ", r.spec)):
        if ids is not None and ids.size and ids.max() >= g.experts:
            t, layer, j = (int(x[0]) for x in np.nonzero(ids >= g.experts))
            raise TraceError(f"token {t}: layer {layer}: {what}expert id {int(ids[t, layer, j])} outside [0, {g.experts})")


def _check_ids(what: str, ids: np.ndarray) -> None:
    """Every id an expert (>= 0) or `NOT_COMPUTED`; the upper bound needs the geometry."""
    if ids.size and ids.min() < NOT_COMPUTED:
        t, layer, j = (int(x[0]) for x in np.nonzero(ids < NOT_COMPUTED))
        raise TraceError(f"token {t}: layer {layer}: {what}expert id {int(ids[t, layer, j])} "
                         f"is neither an expert (>= 0) nor NOT_COMPUTED ({NOT_COMPUTED})")


def _check_finite(what: str, arr: np.ndarray) -> None:
    finite = np.isfinite(arr)
    if not finite.all():
        raise TraceError(f"token {_first_token(~finite)}: {what} is NaN or infinite")


def _first_token(bad: np.ndarray) -> int:
    """The first token (row) of `bad[T, ...]` that holds a True."""
    return int(np.nonzero(bad.reshape(len(bad), -1).any(axis=1))[0][0])


def _array_of(arr: object, ndim: int, kind: type) -> bool:
    return isinstance(arr, np.ndarray) and arr.ndim == ndim and np.issubdtype(arr.dtype, kind)


def _describe(arr: object) -> str:
    if isinstance(arr, np.ndarray):
        return f"{arr.dtype} of shape {list(arr.shape)}"
    return type(arr).__name__

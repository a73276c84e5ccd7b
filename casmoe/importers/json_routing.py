"""Plain JSON routing: one or more requests, each a list per layer of each token's expert ids,
with `num_experts` and `top_k`; a dict of named single-layer entries (moe-lrc's case traces,
with `experts_per_token`) imports too, all of them or the one `key` names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from casmoe.filekind import TEXT, one_line, reading, require
from casmoe.geometry import Geometry, GeometryError
from casmoe.importers.checks import exact_int, unique_pairs
from casmoe.trace import NOT_COMPUTED, Request, Trace, TraceError
from casmoe.trace_io import checked_trace


def _json_request(entry: Any, E: int, k: int, where: str) -> tuple[Request, int]:
    """One JSON request -> (Request, its layer count)."""
    if not isinstance(entry, dict):
        raise TraceError(f"{where}: a request must be an object, not {type(entry).__name__}")
    if "layers" in entry:
        per_layer = entry["layers"]
    elif "experts_per_token" in entry:
        per_layer = [entry["experts_per_token"]]
    else:
        raise TraceError(f"{where}: a request needs 'layers' (per layer, per token expert ids) or 'experts_per_token'")
    if not isinstance(per_layer, list) or not per_layer or not all(isinstance(x, list) for x in per_layer):
        raise TraceError(f"{where}: 'layers' must be a non-empty list of per-token lists")
    T = len(per_layer[0])
    if any(len(x) != T for x in per_layer):
        raise TraceError(f"{where}: layers disagree on the token count {sorted({len(x) for x in per_layer})}")
    L = len(per_layer)
    topk = np.full((T, L, k), NOT_COMPUTED, dtype=np.int64)
    for layer, tokens in enumerate(per_layer):
        for t, ids in enumerate(tokens):
            if ids is None or ids == []:
                continue  # not computed
            ints = isinstance(ids, list) and all(isinstance(e, int) and not isinstance(e, bool) for e in ids)
            if not ints or len(ids) != k:
                raise TraceError(f"{where}: layer {layer}, token {t}: expected {k} integer expert ids, got {ids!r}")
            if not all(0 <= e < E for e in ids):
                raise TraceError(f"{where}: layer {layer}, token {t}: expert id outside [0, {E}) in {ids}")
            topk[t, layer] = ids
    computed = topk != NOT_COMPUTED
    if "weights" in entry:
        try:
            w = np.asarray(entry["weights"], dtype=np.float64)
        except (ValueError, TypeError):
            raise TraceError(f"{where}: 'weights' must be numbers shaped like the expert ids") from None
        if w.shape != (L, T, k):
            raise TraceError(f"{where}: 'weights' has shape {w.shape}, expected [{L}, {T}, {k}]")
        weights = np.where(computed, w.transpose(1, 0, 2), 0.0)
    else:
        weights = np.where(computed, 1.0 / k, 0.0)
    prefill = entry.get("prefill", 0)
    if type(prefill) is not int or not 0 <= prefill <= T:
        raise TraceError(f"{where}: prefill {prefill!r} outside [0, {T}] tokens")
    prompt, task = entry.get("prompt"), entry.get("task")
    for name, v in (("prompt", prompt), ("task", task)):
        if v is not None and not isinstance(v, str):
            raise TraceError(f"{where}: {name} must be a string")
    req = Request(
        topk=topk.astype(np.int16), weights=weights.astype(np.float32), prefill=prefill, prompt=prompt, task=task
    )
    return req, L


def _geometry(layers: int, experts: int, top_k: int, where: str) -> Geometry:
    try:
        return Geometry(layers=layers, experts=experts, top_k=top_k)
    except GeometryError as exc:
        raise TraceError(f"{where}: {exc}") from None


def read_json(path: str | Path, key: str | None = None) -> Trace:
    """Plain JSON routing -> Trace (see the module docstring for the accepted shapes)."""
    where = str(path)
    require(path, TEXT | {"other-text"}, "a JSON routing file", TraceError)
    with reading(where):
        return _read_json(path, key, where)


def _read_json(path: str | Path, key: str | None, where: str) -> Trace:
    try:
        with open(path, encoding="utf-8-sig") as fh:
            doc = json.load(fh, object_pairs_hook=lambda pairs: unique_pairs(pairs, where))
    except FileNotFoundError:
        raise TraceError(f"{where}: no such file") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise TraceError(f"{where}: not readable JSON: {one_line(exc)}") from None
    except RecursionError:
        raise TraceError(f"{where}: JSON nested too deeply to be a routing trace") from None
    common: dict[str, Any] = {}
    if isinstance(doc, list):
        entries = [(f"request {i}", e) for i, e in enumerate(doc)]
    elif isinstance(doc, dict) and "requests" in doc:
        common = doc
        if not isinstance(doc["requests"], list):
            raise TraceError(f"{where}: 'requests' must be a list")
        entries = [(f"request {i}", e) for i, e in enumerate(doc["requests"])]
    elif isinstance(doc, dict) and ("layers" in doc or "experts_per_token" in doc):
        entries = [("request 0", doc)]
    elif isinstance(doc, dict):  # named entries, e.g. moe-lrc case traces; "_..." keys are notes
        entries = [(name, e) for name, e in doc.items() if not name.startswith("_")]
    else:
        raise TraceError(f"{where}: expected a JSON object or list of requests")
    if key is not None:
        entries = [(n, e) for n, e in entries if n == key]
        if not entries:
            names = [n for n in doc if not n.startswith("_")] if isinstance(doc, dict) else []
            raise TraceError(f"{where}: no entry {key!r} (entries: {', '.join(names) or 'none named'})")
    if not entries:
        raise TraceError(f"{where}: no requests")

    def shape_of(name: str, e: Any) -> tuple[int, int]:
        src = e if isinstance(e, dict) and "num_experts" in e else common
        try:
            return exact_int(src["num_experts"], "num_experts"), exact_int(src["top_k"], "top_k")
        except ValueError as exc:
            raise TraceError(f"{where}: {name}: {exc}") from None
        except (KeyError, TypeError):
            raise TraceError(f"{where}: {name}: needs integer num_experts and top_k") from None

    shapes = {shape_of(n, e) for n, e in entries}
    if len(shapes) != 1:
        raise TraceError(f"{where}: entries disagree on (num_experts, top_k) {sorted(shapes)}; import one with --key")
    E, k = shapes.pop()
    _geometry(1, E, k, where)  # before any array is sized by k: a negative or huge k is refused, not allocated
    requests, layer_counts, models = [], set(), []
    for name, e in entries:
        req, L = _json_request(e, E, k, f"{where}: {name}")
        requests.append(req)
        layer_counts.add(L)
        if isinstance(e, dict) and e.get("model"):
            models.append(f"{e['model']}" + (f" layer {e['layer_idx']}" if "layer_idx" in e else ""))
    if len(layer_counts) != 1:
        raise TraceError(f"{where}: requests disagree on the layer count {sorted(layer_counts)}")
    g = _geometry(layer_counts.pop(), E, k, where)
    meta = {
        "source_model": "; ".join(dict.fromkeys(models)) or str(common.get("model", "unknown")),
        "recorded_by": f"JSON {Path(where).name}" + (f" (key {key})" if key else ""),
        "request_names": [n for n, _ in entries],
    }
    return checked_trace(g, requests, meta, where)

"""The long routing CSV (`route_trace v1`): a llama.cpp-based engine writes it, and it is the
minimal form any user's own tool can write.

`#` header lines give `n_layer`, `n_expert`, `n_expert_used` (and optionally per-layer
`expert_bytes`), then one row per routed expert: `turn,phase,step,layer,slot,expert,weight[,...]`.
Each turn is one request; each step one token (prefill tokens are steps too, phase 0); a missing
(step, layer) is a token-layer the engine did not compute and becomes a `NOT_COMPUTED` row,
never an invented expert. `write_route_csv` writes the same format plus `# casmoe ...` lines
(geometry, per-request prompt/task/lengths, metadata) so that export then import gives the
trace back (all but the optional logits and spec, which the CSV has no column for).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from casmoe.geometry import Geometry, GeometryError
from casmoe.importers.checks import exact_int
from casmoe.machine import check_allocation
from casmoe.trace import NOT_COMPUTED, Request, Trace, TraceError

CSV_COLUMNS = ("turn", "phase", "step", "layer", "slot", "expert", "weight")
_CASMOE_LINE = "# casmoe "


# ---- route CSV ------------------------------------------------------------------------------


def _parse_header(lines: Iterable[str], where: str) -> tuple[dict[str, str], dict[int, int], dict[str, Any]]:
    """Key=value pairs, per-layer expert bytes, and casmoe's own JSON lines from `#` lines."""
    keys: dict[str, str] = {}
    layer_bytes: dict[int, int] = {}
    extra: dict[str, Any] = {"request": {}}
    for line in lines:
        if line.startswith(_CASMOE_LINE):
            name, _, payload = line[len(_CASMOE_LINE) :].partition("=")
            try:
                value = json.loads(payload)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{where}: bad '# casmoe {name}=' line: {exc}") from None
            if name == "request":
                ints = ("turn", "tokens", "prefill", "first_step", "rows")
                if (
                    not isinstance(value, dict)
                    or type(value.get("turn")) is not int
                    or not all(type(value.get(n, 0)) is int and value.get(n, 0) >= 0 for n in ints)
                    or not all(isinstance(value.get(n), (str, type(None))) for n in ("prompt", "task"))
                ):
                    raise TraceError(
                        f"{where}: '# casmoe request=' needs an object with non-negative integer turn, tokens, "
                        "prefill, first_step and string prompt, task"
                    )
                extra["request"][value["turn"]] = value
            elif name in ("geometry", "meta"):
                if not isinstance(value, dict):
                    raise TraceError(f"{where}: '# casmoe {name}=' must hold a JSON object")
                extra[name] = value
            continue
        pairs = dict(tok.split("=", 1) for tok in line[1:].split() if "=" in tok)
        if "layer" in pairs and "expert_bytes" in pairs:
            try:
                layer_bytes[int(pairs["layer"])] = int(pairs["expert_bytes"])
            except ValueError:
                raise TraceError(f"{where}: bad per-layer header line {line.strip()!r}") from None
        else:
            keys.update(pairs)
    return keys, layer_bytes, extra


def _csv_geometry(keys: dict[str, str], layer_bytes: dict[int, int], extra: dict[str, Any], where: str) -> Geometry:
    try:
        if "geometry" in extra:
            return Geometry.from_dict(extra["geometry"])
        L, E, k = (exact_int(keys[n], n, text=True) for n in ("n_layer", "n_expert", "n_expert_used"))
        complete = len(layer_bytes) >= L and all(i in layer_bytes for i in range(L))
        per_layer = tuple(layer_bytes[i] for i in range(L)) if complete else ()
        return Geometry(layers=L, experts=E, top_k=k, layer_expert_bytes=per_layer)
    except KeyError as exc:
        raise TraceError(f"{where}: header lacks {exc} (need n_layer, n_expert, n_expert_used)") from None
    except (ValueError, TypeError, GeometryError) as exc:
        raise TraceError(f"{where}: bad geometry in header: {exc}") from None


def read_route_csv(path: str | Path) -> Trace:
    """Import a `route_trace v1` CSV; one request per turn, gaps kept as `NOT_COMPUTED`."""
    import pandas as pd

    where = str(path)
    try:
        with open(path, encoding="utf-8") as fh:
            header = [line for line in fh if line.startswith("#")]
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - 1))
            cut = size > 0 and fh.read(1) != b"\n"
        if cut:
            raise TraceError(
                f"{where}: the last line has no newline, so the file looks cut mid-row; if it is complete, "
                "end it with a newline"
            )
        df = pd.read_csv(path, comment="#", skipinitialspace=True)
    except FileNotFoundError:
        raise TraceError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise TraceError(f"{where}: not a readable route CSV: {exc}") from None
    keys, layer_bytes, extra = _parse_header(header, where)
    g = _csv_geometry(keys, layer_bytes, extra, where)
    missing = [c for c in CSV_COLUMNS if c not in df.columns]
    if missing:
        raise TraceError(f"{where}: missing columns {missing} (have {list(df.columns)})")
    try:
        raw = {c: df[c].to_numpy(dtype=np.float64) for c in CSV_COLUMNS}
    except (ValueError, TypeError) as exc:
        raise TraceError(f"{where}: non-numeric value in a routing column: {exc}") from None
    for c in CSV_COLUMNS[:-1]:
        bad = ~np.isfinite(raw[c]) | (raw[c] != np.round(raw[c])) | (np.abs(raw[c]) > 2**40)
        if bad.any():
            row = int(np.nonzero(bad)[0][0])
            raise TraceError(f"{where}: data row {row + 1}: {c} {raw[c][row]!r} is not an integer")
    cols = {c: raw[c].astype(np.int64) for c in CSV_COLUMNS[:-1]}
    weight = raw["weight"]
    for name, lo, hi in (("layer", 0, g.layers), ("slot", 0, g.top_k), ("expert", 0, g.experts), ("phase", 0, 2)):
        bad = (cols[name] < lo) | (cols[name] >= hi)
        if bad.any():
            row = int(np.nonzero(bad)[0][0])
            raise TraceError(f"{where}: data row {row + 1}: {name} {cols[name][row]} outside [{lo}, {hi})")
    requests = []
    turns = list(dict.fromkeys(cols["turn"].tolist()))  # order of first appearance
    declared = extra["request"]
    for turn in sorted(set(turns) | set(declared)):
        sel = np.nonzero(cols["turn"] == turn)[0]
        info = declared.get(turn, {})
        if "rows" in info and info["rows"] != len(sel):
            raise TraceError(f"{where}: turn {turn} declares {info['rows']} rows but has {len(sel)}; the file is cut or edited")
        if not len(sel) and "tokens" not in info:
            raise TraceError(f"{where}: '# casmoe request=' declares turn {turn} but neither its tokens nor any row")
        rows = {c: v[sel] for c, v in cols.items()}
        requests.append(_csv_request(g, rows, weight[sel], info, f"{where}: turn {turn}"))
    meta = {
        "source_model": keys.get("model", "unknown"),
        "arch": keys.get("arch"),
        "recorded_by": f"route CSV {Path(where).name}",
        **extra.get("meta", {}),
    }
    trace = Trace(g, requests, {k: v for k, v in meta.items() if v is not None})
    trace.validate(where)
    return trace


def _csv_request(
    g: Geometry, cols: dict[str, np.ndarray], weight: np.ndarray, info: dict[str, Any], where: str
) -> Request:
    """One turn's rows -> Request: token = step - first step, slot order kept."""
    L, k = g.layers, g.top_k
    steps = cols["step"]
    first = int(info.get("first_step", steps.min() if len(steps) else 0))
    tok = steps - first
    T = int(info.get("tokens", tok.max() + 1 if len(tok) else 0))
    seen = len(np.unique(tok))
    if T > 4 * seen + 64:  # whole tokens without rows are rare; a wide span means a damaged step column
        raise TraceError(f"{where}: {T} tokens but only {seen} steps have rows; the step column looks damaged")
    if len(tok) and (tok.min() < 0 or tok.max() >= T):
        raise TraceError(f"{where}: steps outside the declared {T} tokens")
    check_allocation(T * L * k * 14, f"{where}: {T} tokens x {L} layers x top-{k}")
    cell = (tok * L + cols["layer"]) * k + cols["slot"]  # unique per (token, layer, slot)
    uniq, counts = np.unique(cell, return_counts=True)
    if (counts > 1).any():
        c = int(uniq[counts > 1][0])
        raise TraceError(f"{where}: step {first + c // (L * k)}, layer {c // k % L}: slot {c % k} given twice")
    topk = np.full(T * L * k, NOT_COMPUTED, dtype=np.int16)
    weights = np.zeros(T * L * k, dtype=np.float32)
    topk[cell] = cols["expert"]
    weights[cell] = weight
    topk, weights = topk.reshape(T, L, k), weights.reshape(T, L, k)
    partial = (topk == NOT_COMPUTED).any(axis=2) & (topk != NOT_COMPUTED).any(axis=2)
    if partial.any():
        t, layer = (int(x[0]) for x in np.nonzero(partial))
        raise TraceError(f"{where}: step {first + t}, layer {layer}: fewer than top_k={k} experts routed")
    phase = np.full(T, -1)
    phase[tok] = cols["phase"]
    if "prefill" in info:
        prefill = int(info["prefill"])
    else:
        pre = np.nonzero(phase == 0)[0]
        prefill = int(pre.max() + 1) if len(pre) else 0
        if (phase[:prefill] == 1).any():
            raise TraceError(f"{where}: a decode step (phase 1) precedes a prefill step (phase 0)")
    return Request(topk=topk, weights=weights, prefill=prefill, prompt=info.get("prompt"), task=info.get("task"))


def write_route_csv(trace: Trace, path: str | Path, progress: bool = False) -> None:
    """Write the long routing CSV (gaps as absent rows); `read_route_csv` reads it back."""
    g = trace.geometry
    lines = [
        "# route_trace v1",
        f"# model={str(trace.meta.get('source_model', 'unknown')).replace(' ', '_')} "
        + (f"arch={trace.meta['arch']} " if trace.meta.get("arch") else "")
        + f"n_layer={g.layers} n_expert={g.experts} n_expert_used={g.top_k}",
    ]
    lines += [f"# layer={i} expert_bytes={b}" for i, b in enumerate(g.bytes_per_layer())]
    lines.append(_CASMOE_LINE + "geometry=" + json.dumps(g.to_dict()))
    meta = {k: v for k, v in trace.meta.items() if k != "arch"}
    lines.append(_CASMOE_LINE + "meta=" + json.dumps(meta))
    for i, r in enumerate(trace.requests):
        rows = int((r.topk != NOT_COMPUTED).sum())
        info = {"turn": i, "first_step": 0, "tokens": r.tokens, "prefill": r.prefill, "rows": rows}
        info.update(prompt=r.prompt, task=r.task)
        lines.append(_CASMOE_LINE + "request=" + json.dumps(info))
    lines.append(",".join(CSV_COLUMNS))
    import pandas as pd
    from tqdm import tqdm

    from casmoe.output import atomic_open

    with atomic_open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write("\n".join(lines) + "\n")
        for i, r in enumerate(tqdm(trace.requests, desc="export", unit="req", disable=not progress)):
            t, layer, slot = np.nonzero(r.topk != NOT_COMPUTED)  # row-major: step, layer, slot
            rows = pd.DataFrame(
                {
                    "turn": np.full(len(t), i),
                    "phase": (t >= r.prefill).astype(np.int64),
                    "step": t,
                    "layer": layer,
                    "slot": slot,
                    "expert": r.topk[t, layer, slot].astype(np.int64),
                    "weight": r.weights[t, layer, slot].astype(np.float64),
                }
            )
            rows.to_csv(fh, header=False, index=False, float_format="%.9g", lineterminator="\n")

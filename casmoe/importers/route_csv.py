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
import math
import re
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from casmoe.filekind import TEXT, one_line, reading, require
from casmoe.geometry import Geometry, GeometryError
from casmoe.importers.checks import exact_int, unique_pairs
from casmoe.output import atomic_open
from casmoe.resources import check_allocation
from casmoe.trace import NOT_COMPUTED, Request, Trace, TraceError
from casmoe.trace_io import checked_trace

CSV_COLUMNS = ("turn", "phase", "step", "layer", "slot", "expert", "weight")
"""The columns casmoe writes; a user's own tool needs only `MINIMAL_COLUMNS`."""
MINIMAL_COLUMNS = ("turn", "step", "layer", "expert")
"""The columns a CSV must have: `phase` defaults to 1 (every step a decode token), `slot` to the
rows' order within a (turn, step, layer), `weight` to 1/k."""
_CASMOE_LINE = "# casmoe "
_REQUEST_INTS = ("turn", "tokens", "prefill", "first_step", "rows")


def _finite_seconds(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value)) and value >= 0
    except OverflowError:  # an integer beyond any float
        return False


def _request_line(value: Any, where: str) -> dict[str, Any]:
    """A `# casmoe request=` object, checked field by field."""
    ok = (
        isinstance(value, dict)
        and type(value.get("turn")) is int
        and all(type(value.get(n, 0)) is int and 0 <= value.get(n, 0) < 2**40 for n in _REQUEST_INTS)
        and all(isinstance(value.get(n), (str, type(None))) for n in ("prompt", "task", "output"))
    )
    if not ok:
        raise TraceError(
            f"{where}: '# casmoe request=' needs an object with non-negative integer turn, tokens, "
            "prefill, first_step and string prompt, task, output"
        )
    arrival = value.get("arrival")
    if arrival is not None and not _finite_seconds(arrival):
        raise TraceError(f"{where}: turn {value['turn']}: arrival must be a finite number of seconds >= 0, got {arrival!r}")
    ids = value.get("output_ids")
    if ids is not None and not (
        isinstance(ids, list) and all(type(i) is int and i >= 0 for i in ids)
    ):
        raise TraceError(f"{where}: turn {value['turn']}: output_ids must be a list of token ids >= 0")
    return value


def _parse_header(lines: Iterable[str], where: str) -> tuple[dict[str, str], dict[int, int], dict[str, Any]]:
    """Key=value pairs, per-layer expert bytes, and casmoe's own JSON lines from `#` lines.

    A key given twice (in one line or in two) is refused: which one the tool meant is unknown."""
    keys: dict[str, str] = {}
    layer_bytes: dict[int, int] = {}
    extra: dict[str, Any] = {"request": {}}
    for line in lines:
        if line.startswith(_CASMOE_LINE):
            name, _, payload = line[len(_CASMOE_LINE) :].partition("=")
            try:
                value = json.loads(payload, object_pairs_hook=lambda p: unique_pairs(p, where))
            except json.JSONDecodeError as exc:
                raise TraceError(f"{where}: bad '# casmoe {name}=' line: {exc}") from None
            if name == "request":
                value = _request_line(value, where)
                if value["turn"] in extra["request"]:
                    raise TraceError(f"{where}: '# casmoe request=' describes turn {value['turn']} twice")
                extra["request"][value["turn"]] = value
            elif name in ("geometry", "meta"):
                if not isinstance(value, dict):
                    raise TraceError(f"{where}: '# casmoe {name}=' must hold a JSON object")
                if name in extra:
                    raise TraceError(f"{where}: two '# casmoe {name}=' lines; keep one")
                extra[name] = value
            continue
        tokens = [tuple(tok.split("=", 1)) for tok in line[1:].split() if "=" in tok]
        names = [n for n, _ in tokens]
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice is not None:
            raise TraceError(f"{where}: header line {line.strip()!r} gives {twice!r} twice; keep one")
        pairs = dict(tokens)
        if "layer" in pairs and "expert_bytes" in pairs:
            try:
                layer, size = int(pairs["layer"]), int(pairs["expert_bytes"])
            except ValueError:
                raise TraceError(f"{where}: bad per-layer header line {line.strip()!r}") from None
            if layer in layer_bytes:
                raise TraceError(f"{where}: the header gives expert_bytes of layer {layer} twice; keep one")
            layer_bytes[layer] = size
            continue
        for name, value in pairs.items():
            if name in keys:
                raise TraceError(f"{where}: the header gives {name!r} twice ({keys[name]} and {value}); keep one")
            keys[name] = value
    return keys, layer_bytes, extra


def _csv_geometry(keys: dict[str, str], layer_bytes: dict[int, int], extra: dict[str, Any], where: str) -> Geometry:
    try:
        if "geometry" in extra:
            g = Geometry.from_dict(extra["geometry"])
            said = {n: keys[n] for n in ("n_layer", "n_expert", "n_expert_used") if n in keys}
            found = {"n_layer": g.layers, "n_expert": g.experts, "n_expert_used": g.top_k}
            bad = [n for n, v in said.items() if exact_int(v, n, text=True) != found[n]]
            if bad:
                raise TraceError(f"{where}: header {bad[0]}={said[bad[0]]} disagrees with its '# casmoe geometry=' line")
            return g
        L, E, k = (exact_int(keys[n], n, text=True) for n in ("n_layer", "n_expert", "n_expert_used"))
        complete = len(layer_bytes) >= L and all(i in layer_bytes for i in range(L))
        per_layer = tuple(layer_bytes[i] for i in range(L)) if complete else ()
        return Geometry(layers=L, experts=E, top_k=k, layer_expert_bytes=per_layer)
    except KeyError as exc:
        raise TraceError(
            f"{where}: header lacks {exc}; a route CSV starts with a line '# n_layer=L n_expert=E n_expert_used=K'"
        ) from None
    except (ValueError, TypeError, GeometryError) as exc:
        raise TraceError(f"{where}: bad geometry in header: {exc}") from None


def _columns(df: Any, k: int, where: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Integer columns (the optional ones filled in) and the weights, each checked."""
    missing = [c for c in MINIMAL_COLUMNS if c not in df.columns]
    if missing:
        raise TraceError(
            f"{where}: missing columns {missing} (have {list(df.columns)}; need {', '.join(MINIMAL_COLUMNS)}, "
            "optionally phase, slot, weight)"
        )
    present = [c for c in CSV_COLUMNS if c in df.columns]
    raw = {}
    for c in present:
        try:
            raw[c] = df[c].to_numpy(dtype=np.float64)
        except (ValueError, TypeError):
            import pandas as pd

            bad = pd.to_numeric(df[c], errors="coerce").isna().to_numpy() & df[c].notna().to_numpy()
            row = int(np.nonzero(bad)[0][0]) if bad.any() else 0
            raise TraceError(f"{where}: data row {row + 1}: {c} {df[c].iloc[row]!r} is not a number") from None
    for c in present:
        if c == "weight":
            continue
        bad = ~np.isfinite(raw[c]) | (raw[c] != np.round(raw[c])) | (np.abs(raw[c]) > 2**40)
        if bad.any():
            row = int(np.nonzero(bad)[0][0])
            raise TraceError(f"{where}: data row {row + 1}: {c} {raw[c][row]!r} is not an integer")
    cols = {c: raw[c].astype(np.int64) for c in present if c != "weight"}
    n = len(df)
    if "phase" not in cols:
        cols["phase"] = np.ones(n, dtype=np.int64)
    if "slot" not in cols:  # the rows' order within each (turn, step, layer)
        import pandas as pd

        key = pd.DataFrame({c: cols[c] for c in ("turn", "step", "layer")})
        cols["slot"] = key.groupby(["turn", "step", "layer"], sort=False).cumcount().to_numpy(dtype=np.int64)
    weight = raw["weight"] if "weight" in raw else np.full(n, 1.0 / k)
    return cols, weight


def read_route_csv(path: str | Path) -> Trace:
    """Import a route CSV (casmoe's own, a `route_trace v1` engine's, or the minimal form); one
    request per turn, gaps kept as `NOT_COMPUTED`. A UTF-8 byte-order mark is skipped."""
    where = str(path)
    require(path, TEXT | {"other-text"}, "a routing CSV", TraceError)
    with reading(where):
        return _read_route_csv(path, where)


def _read_route_csv(path: str | Path, where: str) -> Trace:
    import pandas as pd

    try:
        with open(path, encoding="utf-8-sig") as fh:
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
        df = pd.read_csv(path, comment="#", skipinitialspace=True, encoding="utf-8-sig")
    except FileNotFoundError:
        raise TraceError(f"{where}: no such file") from None
    except pd.errors.EmptyDataError:
        raise TraceError(f"{where}: no column line and no rows (need {','.join(MINIMAL_COLUMNS)} and one row per routed expert)") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise TraceError(f"{where}: not a readable route CSV: {one_line(exc)}") from None
    keys, layer_bytes, extra = _parse_header(header, where)
    g = _csv_geometry(keys, layer_bytes, extra, where)
    twice = next((c for c in df.columns if isinstance(c, str) and re.fullmatch(r".+\.\d+", c) and c.rsplit(".", 1)[0] in df.columns), None)
    if twice is not None:
        raise TraceError(f"{where}: column {twice.rsplit('.', 1)[0]!r} appears twice in the column line")
    cols, weight = _columns(df, g.top_k, where)
    for name, lo, hi in (("layer", 0, g.layers), ("slot", 0, g.top_k), ("expert", 0, g.experts), ("phase", 0, 2)):
        bad = (cols[name] < lo) | (cols[name] >= hi)
        if bad.any():
            row = int(np.nonzero(bad)[0][0])
            raise TraceError(f"{where}: data row {row + 1}: {name} {cols[name][row]} outside [{lo}, {hi})")
    declared = extra["request"]
    if not len(df) and not declared:
        raise TraceError(f"{where}: a header and no rows; a route CSV needs one row per routed expert")
    requests = []
    for turn in sorted(set(cols["turn"].tolist()) | set(declared)):
        sel = np.nonzero(cols["turn"] == turn)[0]
        info = declared.get(turn, {})
        if "rows" in info and info["rows"] != len(sel):
            raise TraceError(f"{where}: turn {turn} declares {info['rows']} rows but has {len(sel)}; the file is cut or edited")
        if not len(sel) and "tokens" not in info:
            raise TraceError(f"{where}: '# casmoe request=' declares turn {turn} but neither its tokens nor any row")
        rows = {c: v[sel] for c, v in cols.items()}
        requests.append(_csv_request(g, rows, weight[sel], info, f"{where}: turn {turn}", sel + 1))
    meta = {
        "source_model": keys.get("model", "unknown"),
        "arch": keys.get("arch"),
        "recorded_by": f"route CSV {Path(where).name}",
        **extra.get("meta", {}),
    }
    return checked_trace(g, requests, {k: v for k, v in meta.items() if v is not None}, where)


def _csv_request(
    g: Geometry, cols: dict[str, np.ndarray], weight: np.ndarray, info: dict[str, Any], where: str,
    data_rows: np.ndarray,
) -> Request:
    """One turn's rows -> Request: token = step - first step, slot order kept. A fault in given
    rows names the first of them (`data_rows`: their numbers among the file's data rows)."""
    L, k = g.layers, g.top_k
    steps = cols["step"]
    first = int(info.get("first_step", steps.min() if len(steps) else 0))
    tok = steps - first
    T = int(info.get("tokens", tok.max() + 1 if len(tok) else 0))
    seen = len(np.unique(tok))
    if T > 4 * seen + 64:  # whole tokens without rows are rare; a wide span means a damaged step column
        raise TraceError(f"{where}: {T} tokens but only {seen} steps have rows; the step column looks damaged")
    outside = (tok < 0) | (tok >= T)
    if outside.any():
        i = int(np.nonzero(outside)[0][0])
        raise TraceError(f"{where}: data row {data_rows[i]}: step {int(steps[i])} outside the declared {T} tokens "
                         f"(from step {first})")
    check_allocation(T * L * k * 14, f"{where}: {T} tokens x {L} layers x top-{k}")
    cell = (tok * L + cols["layer"]) * k + cols["slot"]  # unique per (token, layer, slot)
    uniq, counts = np.unique(cell, return_counts=True)
    if (counts > 1).any():
        c = int(uniq[counts > 1][0])
        again = int(np.nonzero(cell == c)[0][1])
        raise TraceError(f"{where}: data row {data_rows[again]}: step {first + c // (L * k)}, layer {c // k % L}: slot "
                         f"{c % k} given twice (first in data row {data_rows[np.nonzero(cell == c)[0][0]]})")
    same = (tok * L + cols["layer"]) * g.experts + cols["expert"]  # one expert twice in a token-layer
    uniq_e, counts_e = np.unique(same, return_counts=True)
    if (counts_e > 1).any():
        rows_twice = np.nonzero(same == uniq_e[counts_e > 1][0])[0]
        raise TraceError(f"{where}: data row {data_rows[rows_twice[1]]}: step {int(steps[rows_twice[1]])}, layer "
                         f"{int(cols['layer'][rows_twice[1]])}: expert {int(cols['expert'][rows_twice[1]])} routed twice "
                         f"(first in data row {data_rows[rows_twice[0]]})")
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
        early = np.nonzero((tok < prefill) & (cols["phase"] == 1))[0]
        if len(early):
            raise TraceError(f"{where}: data row {data_rows[early[0]]}: a decode step (phase 1) precedes a prefill "
                             "step (phase 0)")
    ids = info.get("output_ids")
    if ids is not None and any(i > np.iinfo(np.int32).max for i in ids):
        raise TraceError(f"{where}: output token id {max(ids)} is beyond any vocabulary")
    try:
        return Request(
            topk=topk, weights=weights, prefill=prefill, prompt=info.get("prompt"), task=info.get("task"),
            arrival=None if info.get("arrival") is None else float(info["arrival"]),
            output_ids=None if ids is None else np.array(ids, dtype=np.int32), output=info.get("output"),
        )
    except TraceError as exc:  # the request's own checks: every fault names the file and turn
        raise exc.within(where) from None


def write_route_csv(trace: Trace, path: str | Path, progress: bool = False) -> None:
    """Write the long routing CSV (gaps as absent rows); `read_route_csv` reads it back with
    everything but the optional router logits and spec (the CSV has no column for them)."""
    if not trace.requests:
        raise TraceError("the trace has no requests; nothing to export")
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
        if r.arrival is not None:
            info["arrival"] = float(r.arrival)
        if r.output is not None:
            info["output"] = r.output
        if r.output_ids is not None:
            info["output_ids"] = [int(x) for x in r.output_ids]
        lines.append(_CASMOE_LINE + "request=" + json.dumps(info))
    lines.append(",".join(CSV_COLUMNS))
    import pandas as pd
    from tqdm import tqdm

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

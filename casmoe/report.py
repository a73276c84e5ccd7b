"""Tables and JSON/CSV files of results; the PNG plots are `casmoe.cli.figures`, the simulator's
summary (its headline and the table by family) `casmoe.summary`.

Sections: number formatting and tables; files; the replay's table; what a simulate record says
(its axes, labels and uncertainty); serving, timeliness and tiers.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import IO, Any, Callable, Collection, Sequence

from casmoe.output import atomic_open, write_text


ORACLE_NOTE = ("* an oracle: reads the trace's future, or was fitted on requests it is scored on "
               "(a bound, not a deployable policy)")


def sig(x: float, digits: int = 3) -> str:
    """`x` to `digits` significant digits, never in exponent form: 0.00123, 1.23, 123, 12,300."""
    if not math.isfinite(x) or x == 0:
        return f"{x:g}"
    r = float(f"{x:.{digits}g}")
    mag = math.floor(math.log10(abs(r)))
    return f"{r:,.0f}" if mag >= digits - 1 else f"{r:.{digits - 1 - mag}f}"


def human_bytes(n: float) -> str:
    """Decimal units, as link speeds and cache sizes are given: 247 GB, 1.5 MB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{sig(n / scale)} {unit}"
    return f"{int(n)} B"


def percent(x: float) -> str:
    return f"{sig(100 * x)}%"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return sig(v)
    return str(v)


def print_table(records: Sequence[dict[str, Any]], columns: Sequence[str], title: str | None = None,
                sections: Collection[int] = ()) -> None:
    """A rich table on stdout, one row per record; a rule under each row index in `sections`."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c, justify="left" if c in ("policy", "capacity", "name", "family", "field", "from") else "right")
    for i, r in enumerate(records):
        table.add_row(*(escape(_fmt(r.get(c, ""))) for c in columns),  # policy labels hold [key=value]
                      end_section=i in sections)
    Console(width=200).print(table)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(data, indent=2))


def write_csv(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Flat CSV that pandas reads; nested values are stored as JSON strings."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "w", newline="") as fh:
        write_csv_to(fh, records)


def write_csv_to(fh: IO[str], records: Sequence[dict[str, Any]]) -> None:
    """`write_csv` into an open text stream (stdout for `--csv` flags)."""
    columns: list[str] = []
    for r in records:
        columns.extend(k for k in r if k not in columns)
    w = csv.DictWriter(fh, fieldnames=columns)
    w.writeheader()
    for r in records:
        w.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()})


# ---- the replay's table --------------------------------------------------------------------------

_REPLAY_COLUMNS = {  # record key -> (heading, format)
    "hit_rate": ("hit rate", percent),
    "hits": ("hits", lambda v: f"{v:,}"),
    "late_hits": ("late hits", lambda v: f"{v:,}"),
    "misses": ("misses", lambda v: f"{v:,}"),
    "substitutions": ("substituted", lambda v: f"{v:,}"),
    "cpu_computed": ("on CPU", lambda v: f"{v:,}"),
    "loads": ("loads", lambda v: f"{v:,}"),
    "prefetch_loads": ("prefetched", lambda v: f"{v:,}"),
    "prefetch_wasted": ("prefetch wasted", lambda v: f"{v:,}"),
    "bytes_loaded": ("loaded", human_bytes),
}


def print_replay(records: Sequence[dict[str, Any]], title: str) -> None:
    """Hit rates and counts per policy, in human units; a column that is zero for every
    policy (late hits in a replay, prefetches of demand-only policies) is left out."""
    cols = [k for k in _REPLAY_COLUMNS if k == "hit_rate" or any(r.get(k) for r in records)]
    rows = [
        {"policy": policy_label(r), "capacity": r["capacity"],
         **{_REPLAY_COLUMNS[k][0]: _REPLAY_COLUMNS[k][1](r[k]) for k in cols}}
        for r in records
    ]
    print_table(rows, ["policy", "capacity", *(_REPLAY_COLUMNS[k][0] for k in cols)], title=title)
    if any(r.get("oracle") for r in records):
        print(ORACLE_NOTE)


# ---- what a simulate record says (the summaries: `casmoe.summary`) -----------------------------

AXES = ("trace", "model", "hardware", "stack", "batch", "miss_mode", "quant", "devices", "rate", "users", "host_cache_gb")
"""Record fields a sweep may vary beside policy and capacity."""
SPEED = "decode_tokens_per_s"


def policy_label(r: dict[str, Any]) -> str:
    """A record's policy as the tables write it: starred when it is an oracle."""
    return r["policy"] + ("*" if r.get("oracle") else "")


def varied_axes(records: Sequence[dict[str, Any]]) -> list[str]:
    """The axes (besides policy and capacity) whose value differs between records."""
    return [k for k in AXES if len({str(r.get(k)) for r in records}) > 1]


def upper_bound(record: dict[str, Any]) -> bool:
    """Whether the record's stack charges nothing beyond the hardware (`Stack.upper_bound`: by
    what it charges, not its name); a record of before that flag: its stack named ideal."""
    return bool(record.get("upper_bound", record.get("stack", "ideal") == "ideal"))


UNCERTAINTY = "uncertainty"
"""The column of a predicted figure's validated spread (`casmoe.sim.trust.uncertainty`)."""


def uncertainty_cell(record: dict[str, Any]) -> str:
    """A record's spread as a table cell, from the fields `casmoe.sim.trust.uncertainty.annotate` sets:
    'x/÷ 1.50', marked † where the configuration lies outside the published table; 'upper bound'
    on the ideal stack; 'not validated' for a kind no published row measured; '' for a record
    without them (a replay's)."""
    if "uncertainty" not in record:
        return ""
    f = record.get("uncertainty_factor")
    if f is None:
        return "upper bound" if upper_bound(record) else "not validated"
    return f"x/÷ {f:.2f}" + (OUTSIDE_MARK[0] if record.get("uncertainty_outside") else "")


OUTSIDE_MARK = "† outside what was validated (the words say where)"
"""The mark of a spread measured on other configurations, and its footnote."""


_NOT_PUBLISHED = "is not one of the"
"""How an uncertainty names a box outside the published ones ('rtx4090-64g is not one of the 14 published boxes')."""


def uncertainty_notes(records: Sequence[dict[str, Any]], label: Callable[[dict[str, Any]], str]) -> list[str]:
    """One line per distinct uncertainty the records carry, naming the rows (`label`) it covers:
    the words behind the table's uncertainty column, and the mark's footnote where it is used."""
    texts: dict[str, list[str]] = {}
    boxes: dict[str, list[str]] = {}  # a note that differs only in the box it names is one note naming them all
    for r in records:
        if r.get("uncertainty"):
            text, box = r["uncertainty"], str(r.get("hardware", ""))
            if box and f"{box} {_NOT_PUBLISHED}" in text:
                text = text.replace(f"{box} {_NOT_PUBLISHED}", "{boxes}")
                boxes.setdefault(text, []).append(box)
            texts.setdefault(text, []).append(label(r))

    def said(text: str) -> str:
        named = list(dict.fromkeys(boxes.get(text, ())))
        verb = _NOT_PUBLISHED if len(named) == 1 else "are not among the"
        return text.replace("{boxes}", f"{', '.join(named)} {verb}") if named else text

    lines = [f"{'every row' if len(texts) == 1 else '; '.join(dict.fromkeys(names))}: {said(text)}"
             for text, names in texts.items()]
    if any(OUTSIDE_MARK[0] in uncertainty_cell(r) for r in records):
        lines.append(OUTSIDE_MARK)
    return lines


# ---- serving (simulate --arrival / --users, sweep rates), prefetch timeliness, tiers -----------


def _label(r: dict[str, Any]) -> str:
    return f"{r['policy']} @ {r['capacity']}"


def _s(v: float) -> str:
    """Seconds with 3 significant digits, in the unit that reads best."""
    if v == 0:
        return "0"
    if abs(v) < 1:
        return f"{v * 1e3:.3g} ms"
    return f"{v:.3g} s"


def print_serving(records: Sequence[dict[str, Any]], title: str) -> None:
    """Latency percentiles, throughput, queue and utilisation of serving runs, one row each."""
    rows = [
        {
            "policy": _label(r),
            "load": r["traffic"].split(", max batch")[0],
            "TTFT p50": _s(r["ttft_p50_s"]),
            "TTFT p99": _s(r["ttft_p99_s"]),
            "TPOT p50": _s(r["tpot_p50_s"]),
            "TPOT p99": _s(r["tpot_p99_s"]),
            "e2e p50": _s(r["e2e_p50_s"]),
            "e2e p99": _s(r["e2e_p99_s"]),
            "req/s": f"{r['requests_per_s']:.3g}",
            "run tok/s": f"{r['throughput_tokens_per_s']:.3g}",
            "batch": f"{r['mean_batch']:.3g}",
            "queue mean/max": f"{r['queue_mean']:.3g} / {r['queue_max']}",
            "GPU busy": " ".join(f"{u:.0%}" for u in r["compute_utilisation"]),
            "link busy": " ".join(f"{u:.0%}" for u in r["link_utilisation"]),
        }
        for r in records
    ]
    if rows:
        print_table(rows, list(rows[0]), title=title)
        print("run tok/s: output tokens over the whole run (prefill, idle and queueing included); the decode "
              "tokens/s above count the time spent in decode steps only")


def print_timeliness(records: Sequence[dict[str, Any]], title: str) -> None:
    """Does a policy lose by prediction or by bandwidth: its stall against the stall a perfect
    prefetcher would still suffer with the same loads (the bound), late hits, wasted prefetches."""
    rows = []
    for r in records:
        stall, bound = r["stall_s"], r["stall_bound_s"]
        rows.append(
            {
                "policy": _label(r),
                "stall": _s(stall),
                "bandwidth-bound stall": _s(bound),
                **({"bound per device": " ".join(_s(b) for b in r["stall_bound_by_device_s"])}
                   if len(r.get("stall_bound_by_device_s") or ()) > 1 else {}),
                "lost to timing/prediction": f"{(stall - bound) / stall:.0%}" if stall else "-",
                "late hits": r["late_hits"],
                "wasted prefetches": r["prefetch_wasted"],
                "hit rate": f"{r['hit_rate']:.3f}",
            }
        )
    if rows:
        print_table(rows, list(rows[0]), title=title)


def print_tiers(records: Sequence[dict[str, Any]], title: str) -> None:
    """Bytes and stall per tier: the RAM tier's hits and misses, storage reads, host-to-device copies."""
    rows = []
    for r in records:
        looked = r["host_hits"] + r["host_misses"]
        rows.append(
            {
                "policy": _label(r),
                "RAM tier GB": f"{r['host_cache_gb']:.3g}",
                "RAM hit rate": f"{r['host_hits'] / looked:.3f}" if looked else "-",
                "read from storage GB": f"{r['storage_bytes'] / 1e9:.3g}",
                "host experts from storage": r.get("host_storage_reads", 0),
                "copied to GPUs GB": f"{r['link_bytes'] / 1e9:.3g}",
                "stall on storage": _s(r["stall_storage_s"]),
                "stall, all": _s(r["stall_s"]),
            }
        )
    if rows:
        print_table(rows, list(rows[0]), title=title)



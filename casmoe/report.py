"""Tables, JSON/CSV files and PNG plots of results (matplotlib imported lazily).

Sections: number formatting and tables; files; the simulator's summaries (headline and the
policies x cache sizes table, shared by `simulate` and `sweep`); the simulator's plots; the
routing-consistency plots; the planner's plot.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import IO, Any, Callable, Sequence

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


def print_table(records: Sequence[dict[str, Any]], columns: Sequence[str], title: str | None = None) -> None:
    """A rich table on stdout, one row per record."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c, justify="left" if c in ("policy", "capacity", "name") else "right")
    for r in records:
        table.add_row(*(escape(_fmt(r.get(c, ""))) for c in columns))  # policy labels hold [key=value]
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
        {"policy": _policy_label(r), "capacity": r["capacity"],
         **{_REPLAY_COLUMNS[k][0]: _REPLAY_COLUMNS[k][1](r[k]) for k in cols}}
        for r in records
    ]
    print_table(rows, ["policy", "capacity", *(_REPLAY_COLUMNS[k][0] for k in cols)], title=title)
    if any(r.get("oracle") for r in records):
        print(ORACLE_NOTE)


# ---- the simulator's summaries ----------------------------------------------------------------

AXES = ("trace", "model", "hardware", "batch", "miss_mode", "quant", "devices", "rate", "users", "host_cache_gb")
"""Record fields a sweep may vary beside policy and capacity."""
SPEED = "decode_tokens_per_s"


def varied_axes(records: Sequence[dict[str, Any]]) -> list[str]:
    """The axes (besides policy and capacity) whose value differs between records."""
    return [k for k in AXES if len({str(r.get(k)) for r in records}) > 1]


def _policy_label(r: dict[str, Any]) -> str:
    return r["policy"] + ("*" if r.get("oracle") else "")


def _capacity_columns(records: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(capacity label, heading) in growing cache size; the heading adds the size in GB when
    every record of that label has the same one."""
    sizes: dict[str, set[float]] = {}
    for r in records:
        sizes.setdefault(r["capacity"], set()).add(round(r["capacity_gb"], 6))
    order = sorted(sizes, key=lambda c: (min(sizes[c]), c))
    return [(c, f"{c}\n{sig(next(iter(sizes[c])))} GB" if len(sizes[c]) == 1 else c) for c in order]


def print_capacity_table(records: Sequence[dict[str, Any]], title: str, value: str = SPEED,
                         show: Callable[[float], str] = sig) -> None:
    """One row per policy (and per value of every varied axis), one column per cache size."""
    axes = varied_axes(records)
    columns = _capacity_columns(records)
    rows: dict[tuple, dict[str, Any]] = {}
    for r in records:
        key = (_policy_label(r), *(str(r.get(a)) for a in axes))
        row = rows.setdefault(key, {"policy": key[0], **dict(zip(axes, key[1:]))})
        row[r["capacity"]] = show(r[value])
    shown = [{**row, **{head: row.get(c, "-") for c, head in columns}} for row in rows.values()]
    print_table(shown, ["policy", *axes, *(head for _, head in columns)], title=title)


def headline(records: Sequence[dict[str, Any]]) -> list[str]:
    """Per cache size (and varied axes): the fastest policy, its decode tok/s and its speed-up
    over on-demand loading and over LRU; an oracle winner is followed by the best policy a
    server could run."""
    axes = varied_axes(records)
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:  # in the records' order of axes, then growing cache
        groups.setdefault((*(_axis_value(a, r.get(a)) for a in axes), r["capacity"]), []).append(r)
    seen: dict[tuple, int] = {}
    for k in groups:
        seen.setdefault(k[:-1], len(seen))
    order = sorted(groups, key=lambda k: (seen[k[:-1]], groups[k][0]["capacity_gb"]))
    lines = []
    for key in order:
        group = groups[key]
        best = max(group, key=lambda r: (r[SPEED], not r.get("oracle")))
        where = ", ".join([*key[:-1], f"{key[-1]} ({sig(best['capacity_gb'])} GB)"])
        text = f"{where}: {_policy_label(best)} {sig(best[SPEED])} tok/s" + _speedups(best, group)
        if best.get("oracle"):
            real = [r for r in group if not r.get("oracle")]
            if real:
                runner = max(real, key=lambda r: r[SPEED])
                text += f"; best without an oracle: {runner['policy']} {sig(runner[SPEED])} tok/s"
        lines.append(text)
    return lines


def _axis_value(axis: str, value: Any) -> str:
    """'rtx4090x4' for names, 'devices 4' for numbers that need their axis to read."""
    return str(value) if axis in ("trace", "model", "hardware") else f"{axis.replace('_', ' ')} {value}"


def _speedups(best: dict[str, Any], group: Sequence[dict[str, Any]]) -> str:
    parts = []
    for name in ("ondemand", "lru"):
        base = next((r for r in group if r["policy"] == name), None)
        if base is not None and base is not best and base[SPEED] > 0:
            parts.append(f"{sig(best[SPEED] / base[SPEED])}x {name}")
    return f" ({', '.join(parts)})" if parts else ""


def print_simulation(records: Sequence[dict[str, Any]], title: str, details: str) -> None:
    """What `simulate` and `sweep` print: the headline, then decode tok/s per policy and cache
    size; `details` names the files that hold every other measurement."""
    from rich.console import Console

    console = Console(width=200, highlight=False)
    console.print(f"[bold]{title}[/bold]", markup=True)
    console.print("Fastest policy per cache size (decode tokens/s; speed-up over on-demand loading and LRU):",
                  markup=False)
    for line in headline(records):
        console.print("  " + line, markup=False)
    print_capacity_table(records, title="decode tokens/s by policy and expert-cache size")
    if any(r.get("oracle") for r in records):
        console.print(ORACLE_NOTE, markup=False)
    console.print(details, markup=False)


# ---- plots ------------------------------------------------------------------------------------


def _pyplot():
    """pyplot on the file-only Agg backend, imported on first use (it costs ~0.5 s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path, dpi: int = 110) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    try:
        with atomic_open(path, "wb") as fh:
            fig.savefig(fh, dpi=dpi, format="png")
    finally:
        _pyplot().close(fig)
    return path


# ---- simulator plots -------------------------------------------------------------------------


_STYLES = [(m, ls) for ls in ("-", "--", ":", "-.") for m in "osD^v<>ph*"]


def _merged(series: dict[str, list[float]]) -> dict[str, list[float]]:
    """Series with equal values drawn once, labelled with every name ("lru = lfu = static"),
    so that policies hiding under one line still show in the legend."""
    out: dict[str, list[float]] = {}
    by_values: dict[tuple, str] = {}
    for name, values in series.items():
        key = tuple(round(v, 9) for v in values)
        if key in by_values:
            old = by_values[key]
            out[f"{old} = {name}"] = out.pop(old)
            by_values[key] = f"{old} = {name}"
        else:
            by_values[key] = name
            out[name] = values
    return out


def _lines(ax: Any, x: Sequence[float], series: dict[str, list[float]]) -> None:
    for i, (label, ys) in enumerate(_merged(series).items()):
        marker, style = _STYLES[i % len(_STYLES)]
        ax.plot(x, ys, marker=marker, linestyle=style, label=label, markersize=5, linewidth=1.2)


def plot_decode_vs_capacity(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    """Against expert-cache size (GB, all devices): decode tokens/s; the same relative to LRU
    (where policies close to each other separate); and the miss rate (100% - hit rate) on a log
    scale. One line per policy and per value of every axis a sweep varies; equal lines share
    one legend entry."""
    plt = _pyplot()
    axes = varied_axes(records)
    sizes = sorted({r["capacity_gb"] for r in records})
    speed: dict[str, list[float]] = {}
    misses: dict[str, list[float]] = {}
    lru: dict[tuple, float] = {}
    for r in records:
        if r["policy"] == "lru":
            lru[(*(str(r[a]) for a in axes), r["capacity_gb"])] = r[SPEED]
    relative: dict[str, list[float]] = {}
    for r in sorted(records, key=lambda r: r["capacity_gb"]):
        label = " ".join([_policy_label(r), *(str(r[a]) for a in axes)])
        i = sizes.index(r["capacity_gb"])
        speed.setdefault(label, [math.nan] * len(sizes))[i] = r[SPEED]
        misses.setdefault(label, [math.nan] * len(sizes))[i] = 100 * (1 - r["hit_rate"])
        base = lru.get((*(str(r[a]) for a in axes), r["capacity_gb"]))
        if base:
            relative.setdefault(label, [math.nan] * len(sizes))[i] = 100 * (r[SPEED] / base - 1)
    panels = [(speed, "decode tokens/s", "linear")]
    if relative:
        panels.append((relative, "decode tokens/s vs LRU (%)", "linear"))
    panels.append((misses, "miss rate = 100% - hit rate (log)", "log"))
    fig, axs = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.8), squeeze=False)
    for ax, (series, ylabel, scale) in zip(axs[0], panels):
        _lines(ax, sizes, series)
        ax.set_ylabel(ylabel)
        ax.set_yscale(scale)
        ax.set_xlabel("expert cache, all devices (GB)")
        ax.grid(True, which="both", alpha=0.3)
    if relative and axs[0][1].get_ylim()[0] < -50:  # far-off policies would flatten the rest
        axs[0][1].set_ylim(bottom=-50)
        axs[0][1].set_ylabel("decode tokens/s vs LRU (%; below -50% cut off)")
    axs[0][-1].legend(fontsize="x-small", loc="best")
    if any(r.get("oracle") for r in records):
        fig.text(0.01, 0.01, "* oracle (reads the future, or fitted on the requests it is scored on)", fontsize="x-small")
    return _save(fig, path)


def plot_stall_by_layer(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    """Stall seconds per MoE layer, one line per run (policy at capacity); equal lines merge."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    one = len({r["capacity"] for r in records}) == 1
    series = {_policy_label(r) + ("" if one else f" @ {r['capacity']}"): list(r["stall_by_layer_s"])
              for r in records if r.get("stall_by_layer_s") and any(r["stall_by_layer_s"])}
    if series:
        _lines(ax, list(range(len(next(iter(series.values()))))), series)
        ax.set_yscale("log")
    if one and records:
        ax.set_title(f"stall per MoE layer at {records[0]['capacity']} (policies without stalls omitted)", fontsize="small")
    ax.set_xlabel("MoE layer")
    ax.set_ylabel("stall (s, log)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small")
    return _save(fig, path)


# ---- local routing consistency (casmoe lrc) --------------------------------------------------


def plot_lrc_sch(path: Path, results: Sequence[Any]) -> Path:
    """Model-level SCH vs rho = C / active experts, one panel per m, one curve per trace
    (with its bootstrap band), replayed baselines as dashed markers in the trace's colour."""
    plt = _pyplot()
    ms = list(results[0].sch)
    fig, axes = plt.subplots(1, len(ms), figsize=(4.2 * len(ms), 3.8), squeeze=False, sharey=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "osD^v<>"
    for ax, m in zip(axes[0], ms):
        for i, res in enumerate(results):
            c = colours[i % len(colours)]
            g = res.geometry
            rho = [(j + 1) / g.active_experts for j in range(g.total_experts)]
            est = res.sch[m].model
            ax.plot(rho, est.value, color=c, label=f"{res.name} SCH")
            ax.fill_between(rho, est.lower, est.upper, color=c, alpha=0.2, linewidth=0)
            for j, (policy, levels) in enumerate(res.baselines.items()):
                pts = sorted(levels.get("model", {}).items())
                if pts:
                    ax.plot([p for p, _ in pts], [v for _, v in pts], linestyle="--", marker=markers[j % len(markers)],
                            color=c, alpha=0.7, markersize=4, label=f"{res.name} {policy}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"m = {m}")
        ax.set_xlabel("rho = C / active experts")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("hit rate")
    axes[0][-1].legend(fontsize="x-small")
    return _save(fig, path)


def plot_lrc_srp(path: Path, results: Sequence[Any]) -> Path:
    """Model-level SRP vs segment length m (log scale) with bootstrap intervals, one line per trace."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for res in results:
        ms = list(res.srp)
        v = [float(res.srp[m].model.value) for m in ms]
        lo = [v[i] - float(res.srp[m].model.lower) for i, m in enumerate(ms)]
        hi = [float(res.srp[m].model.upper) - v[i] for i, m in enumerate(ms)]
        ax.errorbar(ms, v, yerr=[lo, hi], marker="o", capsize=3, label=res.name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("segment length m (tokens)")
    ax.set_ylabel("SRP (best F1)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def plot_lrc_layers(path: Path, results: Sequence[Any], rho: float = 2.0) -> Path:
    """Per-layer heatmaps (layer x m): SRP, and SCH of a per-layer cache at `rho`, per trace."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, len(results), figsize=(1.6 + 2.4 * len(results), 2 + 0.12 * max(r.geometry.layers for r in results) * 2),
                             squeeze=False)
    for col, res in enumerate(results):
        ms = list(res.srp)
        srp = [[float(res.srp[m].layers.value[layer]) for m in ms] for layer in range(res.geometry.layers)]
        sch = [[(res.sch_at(m, rho, "layer", layer) or {"value": float("nan")})["value"] for m in ms] for layer in range(res.geometry.layers)]
        for row, (data, what) in enumerate(((srp, "SRP"), (sch, f"SCH @ rho={rho:g}"))):
            ax = axes[row][col]
            im = ax.imshow(data, aspect="auto", vmin=0, vmax=1, cmap="viridis", interpolation="nearest")
            ax.set_xticks(range(len(ms)), [str(m) for m in ms])
            ax.set_xlabel("m")
            ax.set_ylabel("layer")
            ax.set_title(f"{res.name}: {what}", fontsize="small")
            fig.colorbar(im, ax=ax, fraction=0.05)
    return _save(fig, path)


def plot_epsilon_curve(points: Sequence[dict[str, Any]], path: Path, baseline: float | None = None) -> None:
    """The planner's gate trade-off: share answered by the matcher and cascade recall@k, per epsilon."""
    plt = _pyplot()
    eps = [p["epsilon"] for p in points]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(eps, [p["recall_at_k"] for p in points], marker="o", label="cascade recall@k")
    ax.plot(eps, [p["coverage_at_2k"] for p in points], marker=".", label="cascade coverage@2k")
    ax.plot(eps, [p["eam_share"] for p in points], linestyle="--", label="share answered by EAM")
    if baseline is not None:
        ax.axhline(baseline, color="grey", linewidth=0.8, label="popularity recall@k")
    ax.set_xlabel("epsilon (cosine similarity threshold)")
    ax.set_ylim(0, 1.02)
    ax.legend(loc="lower left", fontsize=8)
    ax.set_title("CasMoE planner: matcher/predictor gate")
    _save(fig, path, dpi=120)


# ---- serving (simulate --arrival / --users, sweep rates) and prefetch timeliness -------------


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


def plot_latency_vs_load(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    """TTFT and TPOT (p50 solid, p99 dashed) against the offered load, one colour per policy
    at each cache size: the curve that shows where a configuration saturates."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    by: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault(_label(r), []).append(r)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, rs) in enumerate(sorted(by.items())):
        rs = sorted(rs, key=lambda r: r["rate"])
        x = [r["rate"] for r in rs]
        c = colours[i % len(colours)]
        for ax, what in zip(axes, ("ttft", "tpot")):
            ax.plot(x, [r[f"{what}_p50_s"] for r in rs], marker="o", color=c, label=f"{label} p50")
            ax.plot(x, [r[f"{what}_p99_s"] for r in rs], marker=".", linestyle="--", color=c, label=f"{label} p99")
    for ax, what in zip(axes, ("time to first token (s)", "time per output token (s)")):
        ax.set_xlabel("offered load (requests/s)")
        ax.set_ylabel(what)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize="x-small")
    return _save(fig, path)


def plot_queue(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    """Requests waiting for admission over simulated time, one line per run."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in records:
        pts = r.get("queue_length") or []
        if pts:
            ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", label=_label(r), linewidth=1)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("requests waiting")
    ax.grid(True, alpha=0.3)
    if len(records) <= 12:
        ax.legend(fontsize="x-small")
    return _save(fig, path)


def plot_timeliness(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    """Per MoE layer: stall (solid) against its lower bound (dashed: the stall no earlier issuing
    of the same loads could have saved, given when the run reached the layer), and late hits,
    one colour per run."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, r in enumerate(records):
        c = colours[i % len(colours)]
        layers = range(len(r["stall_by_layer_s"]))
        top.plot(layers, r["stall_by_layer_s"], color=c, linewidth=1, label=_label(r))
        if r.get("stall_bound_by_layer_s"):
            top.plot(layers, r["stall_bound_by_layer_s"], color=c, linewidth=1, linestyle="--")
        if r.get("late_by_layer"):
            bottom.plot(layers, r["late_by_layer"], color=c, linewidth=1)
    top.set_ylabel("stall (s); dashed: bound")
    bottom.set_ylabel("late hits")
    bottom.set_xlabel("MoE layer")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    if len(records) <= 12:
        top.legend(fontsize="x-small")
    return _save(fig, path)


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
                "copied to GPUs GB": f"{r['link_bytes'] / 1e9:.3g}",
                "stall on storage": _s(r["stall_storage_s"]),
                "stall, all": _s(r["stall_s"]),
            }
        )
    if rows:
        print_table(rows, list(rows[0]), title=title)


def plot_search(path: Path, points: Sequence[tuple[str, float, float, bool]], pareto: Sequence[tuple[float, float]],
                metric: str, target: float) -> Path:
    """`casmoe search`: every point it simulated, memory against the target metric (`points`:
    config label, memory GB, metric value, meets the target), one marker per config, filled
    where it meets the target; the Pareto answers circled; the target as a dashed line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = list(dict.fromkeys(p[0] for p in points))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, label in enumerate(labels):
        c, (marker, _) = colours[i % len(colours)], _STYLES[i % len(_STYLES)]
        mine = [p for p in points if p[0] == label]
        for met in (True, False):
            xs = [p[1] for p in mine if p[3] == met]
            ys = [p[2] for p in mine if p[3] == met]
            if xs:
                ax.scatter(xs, ys, marker=marker, color=c if met else "none", edgecolors=c, s=30,
                           label=label if met or not any(p[3] for p in mine) else None)
    if pareto:
        ax.scatter([p[0] for p in pareto], [p[1] for p in pareto], s=160, facecolors="none", edgecolors="black",
                   linewidths=1.2, label="Pareto answers")
    ax.axhline(target, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("memory: expert cache on the GPUs + RAM tier (GB)")
    ax.set_ylabel(metric)
    ax.grid(True, alpha=0.3)
    if len(labels) <= 12:
        ax.legend(fontsize="x-small")
    return _save(fig, path)

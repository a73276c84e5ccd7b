"""Tables, JSON/CSV files and PNG plots of results (matplotlib imported lazily)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Sequence

from casmoe.output import atomic_open, write_text


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1e4 else f"{v:.4g}"
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
    columns: list[str] = []
    for r in records:
        columns.extend(k for k in r if k not in columns)
    with atomic_open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns)
        w.writeheader()
        for r in records:
            w.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()})


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


def plot_latency_vs_capacity(path: Path, records: Sequence[dict[str, Any]], metric: str = "token_latency_p50_s") -> Path:
    """Per-token decode latency (ms) against expert-cache size (GB), one line per policy (and
    per hardware, model, trace, batch or miss mode when a sweep varies them)."""
    plt = _pyplot()
    varied = [k for k in ("hardware", "model", "trace", "batch", "miss_mode") if len({r.get(k) for r in records}) > 1]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    by_policy: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        if metric in r:
            label = " ".join([r["policy"], *(str(r[k]) for k in varied)])
            by_policy.setdefault(label, []).append((r["capacity_gb"], r[metric] * 1e3))
    for policy, pts in by_policy.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy)
    ax.set_xlabel("expert cache, all devices (GB)")
    ax.set_ylabel(f"{metric.removesuffix('_s').replace('_', ' ')} (ms)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def plot_stall_by_layer(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    """Stall seconds per MoE layer, one line per run (policy at capacity)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in records:
        stalls = r.get("stall_by_layer_s")
        if stalls:
            ax.plot(range(len(stalls)), stalls, label=f"{r['policy']} @ {r['capacity']}", linewidth=1)
    ax.set_xlabel("MoE layer")
    ax.set_ylabel("stall (s)")
    ax.grid(True, alpha=0.3)
    if len(records) <= 12:
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
            "load": r["workload"].split(", max batch")[0],
            "TTFT p50": _s(r["ttft_p50_s"]),
            "TTFT p99": _s(r["ttft_p99_s"]),
            "TPOT p50": _s(r["tpot_p50_s"]),
            "TPOT p99": _s(r["tpot_p99_s"]),
            "e2e p50": _s(r["e2e_p50_s"]),
            "e2e p99": _s(r["e2e_p99_s"]),
            "req/s": f"{r['requests_per_s']:.3g}",
            "tok/s": f"{r['throughput_tokens_per_s']:.3g}",
            "batch": f"{r['mean_batch']:.3g}",
            "queue mean/max": f"{r['queue_mean']:.3g} / {r['queue_max']}",
            "GPU busy": " ".join(f"{u:.0%}" for u in r["compute_utilisation"]),
            "link busy": " ".join(f"{u:.0%}" for u in r["link_utilisation"]),
        }
        for r in records
    ]
    if rows:
        print_table(rows, list(rows[0]), title=title)


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
    """Per MoE layer: stall (solid) against the perfect-prefetch bound (dashed), and late hits,
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

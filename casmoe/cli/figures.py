"""PNG plots of results (matplotlib imported lazily, on the file-only Agg backend).

Every figure reads without the source: a title naming what it shows and the run (model, box,
trace), y axes that say what they measure and in which unit, one colour and marker per policy
that all plots of a run share (`PolicyStyles`; oracles, starred, dashed), legends beside the axes
instead of over the data, zeros drawn (no log axis that drops them).

Each plot is a pair: `figure_X(...)` builds the matplotlib Figure (the tests inspect it), and
`plot_X(path, ...)` writes it as a PNG, atomically (a file that exists is whole), and closes it.
`report_plots` chooses the PNGs of a `simulate`/`sweep` report folder and `draw_report` draws them.

Sections: styles and titles; the report folder; the simulator's plots; serving; `casmoe search`;
routing consistency (`casmoe lrc`); the planner's gate.
"""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from casmoe.output import atomic_open
from casmoe.report import SPEED, policy_label, sig, varied_axes

ORACLE_LEGEND = ("* oracle (dashed): reads the future,\nor fitted on the requests it is\n"
                 "scored on: a bound, not deployable")

# ---- styles and titles ---------------------------------------------------------------------------

COLOURS = (  # tab10, then ten darker or more saturated ones; with the markers, 60 distinct pairs
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#000000", "#393b79", "#a6761d", "#e7298a", "#006d6f", "#66a61e", "#a50f15", "#6a3d9a", "#b15928", "#6b6b00",
)
# no two alike at the legend's size: a thin diamond ('d') read as the diamond ('D') of another
# policy in a blue-purple neighbour's colour (fiddler beside n-cpu-moe[gpu_prefill=32])
MARKERS = ("o", "s", "D", "^", "v", "<", ">", "p", "*", "X", "P", "1", "h", "x", "+")


@dataclass(frozen=True)
class Style:
    """How one policy is drawn: its colour and marker, dashed when it is an oracle."""

    colour: str
    marker: str
    dashed: bool = False

    @property
    def linestyle(self) -> str:
        return "--" if self.dashed else "-"

    def line(self) -> dict[str, Any]:
        """Keyword arguments of `Axes.plot`."""
        return {"color": self.colour, "marker": self.marker, "linestyle": self.linestyle}


def _base(label: str) -> str:
    """'casmoe[predictor=exact]*' -> 'casmoe'."""
    return label.rstrip("*").split("[", 1)[0]


class PolicyStyles:
    """Policy label -> `Style`, distinct per label, the same in every plot given this object.

    A built-in policy has a fixed slot (its place in the registry), so that `lru` looks alike in
    every run; a variant (`casmoe[predictor=noisy]`) or a user's class takes its base name's slot
    when no other label of the run has it, else the next free one. Slot i is (COLOURS[i % 20],
    MARKERS[i % 15]): colour and marker both differ up to 15 labels, the pair up to 60. A label
    that ends in '*' (an oracle) is dashed.
    """

    def __init__(self, labels: Iterable[str] = ()) -> None:
        from casmoe.policies.registry import POLICIES

        self._fixed = {name: i for i, name in enumerate(POLICIES)}
        self._slots: dict[str, int] = {}
        for label in labels:
            self(label)

    @classmethod
    def of(cls, records: Iterable[dict[str, Any]]) -> PolicyStyles:
        """The styles of every policy in `records`, in their order."""
        return cls(policy_label(r) for r in records)

    def __call__(self, label: str) -> Style:
        key = label.rstrip("*")
        if key not in self._slots:
            taken = set(self._slots.values())
            slot = self._fixed.get(_base(key))
            if slot is None or slot in taken:
                slot = next(i for i in range(len(self._fixed), 10**6) if i not in taken)
            self._slots[key] = slot
        slot = self._slots[key]
        return Style(COLOURS[slot % len(COLOURS)], MARKERS[slot % len(MARKERS)], label.endswith("*"))

    def sort(self, labels: Iterable[str]) -> list[str]:
        """`labels` in slot order (the registry's, then first seen): the legends' order."""
        return sorted(labels, key=lambda label: (self._slots.get(label.rstrip("*"), 10**6), label))


def box(record: dict[str, Any]) -> str:
    """'rtx4090x4 (4 GPUs)': the hardware profile and how many of its GPUs the run used."""
    n = record.get("devices")
    return record["hardware"] if n is None else f"{record['hardware']} ({n} GPU{'s' * (n != 1)})"


def _trace(record: dict[str, Any]) -> str:
    scored = (record.get("scored") or "").split(" (")[0]  # '2 of 800 requests': which ones, results.json says
    return f"trace {Path(str(record['trace'])).name}" + (f" ({scored})" if scored else "")


_MISS_MODES = {"load": "misses loaded on demand", "substitute": "misses substituted (lossy)",
               "cpu": "misses computed on the host"}


def _setting(axis: str, r: dict[str, Any]) -> str:
    """One axis of a run in words: 'batch 4', 'bf16 experts', 'h100-sxm (1 GPU)'."""
    v = r.get(axis)
    if axis in ("hardware", "devices"):
        return box(r)
    if axis == "model":
        return str(v)
    if axis == "trace":
        return _trace(r)
    if axis == "quant":
        return "expert bytes as the trace's" if v in (None, "trace") else f"{v} experts"
    if axis == "miss_mode":
        return _MISS_MODES.get(str(v), f"miss mode {v}")
    if axis == "rate":
        return f"{v:g} requests/s"
    if axis == "host_cache_gb":
        return f"RAM tier {sig(v)} GB" if v else "every expert in RAM"
    if axis == "capacity":
        return f"cache {v} ({sig(r['capacity_gb'])} GB)"
    if axis == "stack":
        return "ideal stack (an upper bound)" if v in (None, "ideal") else f"{v} stack"
    return f"{axis.replace('_', ' ')} {v}"


def run_context(records: Sequence[dict[str, Any]], per: str = "panel") -> str:
    """The run for a title: model on box, trace, then batch, miss mode, expert precision and
    workload; what varies between `records` is named as shown `per` panel."""
    if not records:
        return ""
    r = records[0]

    def same(*keys: str) -> bool:
        return len({tuple(str(x.get(k)) for k in keys) for x in records}) == 1

    model = r.get("model", "?") if same("model") else f"each {per}'s model"
    where = box(r) if same("hardware", "devices") else f"each {per}'s box"
    trace = _trace(r) if same("trace") else f"each {per}'s trace"
    # the served workload: records carry it as `traffic` ('poisson 0.5/s, max batch 8, prefill-first'),
    # older ones (and the tests' synthetic records) as `workload`; a served one says its max batch itself
    work = "traffic" if "traffic" in r else "workload"
    served = work in r and same(work) and "back-to-back" not in str(r[work])
    settings = [_setting(a, r) for a in ("batch", "miss_mode", "quant", "host_cache_gb") if a in r and same(a)
                and (a != "host_cache_gb" or r[a]) and not (a == "batch" and served)]
    if "stack" in r:  # every figure assumed a runtime's costs: say whose (a record without one predates stacks)
        settings.append(_setting("stack", r) if same("stack") else f"each {per}'s stack")
    if work in r and same(work):
        settings.append(str(r[work]).replace("back-to-back", "requests back to back"))
    return f"{model} on {where}, {trace}" + (f"\n{', '.join(settings)}" if settings else "")


def _facets(records: Sequence[dict[str, Any]], ignore: Sequence[str] = (), extra: Sequence[str] = ()
            ) -> list[tuple[str, list[dict[str, Any]]]]:
    """Records grouped by every axis a sweep varies (and `extra` fields that vary), less
    `ignore`: one panel (or row of panels) each, in the records' order, named in words."""
    axes = [a for a in varied_axes(records) if a not in ignore]
    axes += [a for a in extra if a not in axes and len({str(r.get(a)) for r in records}) > 1]
    if "devices" in axes and "hardware" in axes:
        axes.remove("devices")  # box() names both
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(tuple(str(r.get(a)) for a in axes), []).append(r)
    return [(", ".join(_setting(a, rs[0]) for a in axes), rs) for rs in groups.values()]


def _pyplot():
    """pyplot on the file-only Agg backend, imported on first use (it costs ~0.5 s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure(rows: int, cols: int, width: float, height: float, legend_width: float = 2.6, **kw: Any):
    """A constrained-layout figure of rows x cols panels of width x height inches each, with room
    on the right for a legend beside them."""
    plt = _pyplot()
    fig, axs = plt.subplots(rows, cols, figsize=(cols * width + legend_width, rows * height + 0.9), squeeze=False,
                            layout="constrained", **kw)
    return fig, axs


def _facet_grid(n: int, width: float, height: float, small_width: float, small_height: float):
    """`_figure` for n panels that share their y axis: one big panel, or smaller ones two to a row."""
    if n == 1:
        return _figure(1, 1, width, height)
    fig, axs = _figure(-(-n // 2), 2, small_width, small_height, sharey=True, sharex=False)
    for ax in axs.flat[n:]:
        ax.set_visible(False)
    return fig, axs


def _title(fig: Any, what: str, context: str) -> None:
    """What the figure shows, then the run, centred over the panels and wrapped to their width
    (the legend beside them keeps its place: call this after the legend)."""
    fig.draw_without_rendering()  # lays the legend out
    width_in = fig.get_figwidth()
    right = min((leg.get_window_extent().x0 / fig.dpi for leg in fig.legends), default=width_in)
    lines = [textwrap.fill(line, max(40, int(right * 13))) for line in [what, *context.splitlines()] if line]
    fig.suptitle("\n".join(lines), fontsize="medium", x=right / 2 / width_in)


def _legend(fig: Any, handles: Sequence[Any], title: str | None = None) -> Any:
    """The figure's legend beside its panels (constrained layout keeps it off the axes)."""
    return fig.legend(handles=list(handles), loc="outside right upper", fontsize="small", title=title,
                      title_fontsize="small", alignment="left")


def _handle(style: Style, label: str, **kw: Any) -> Any:
    from matplotlib.lines import Line2D

    return Line2D([], [], **{**style.line(), "markersize": 6, "linewidth": 1.3, **kw}, label=label)


def _policy_legend(fig: Any, styles: PolicyStyles, labels: Iterable[str], same: dict[str, set[str]] | None = None,
                   extra: Sequence[Any] = ()) -> Any:
    """One entry per policy in `labels`, oracles explained; where lines lie on each other in
    every panel, the first of them says so ('lru (= lfu, static)'), the others name it ('= lru')."""
    labels = styles.sort(set(labels))
    same = same or {}
    names = []
    for label in labels:
        earlier = [x for x in styles.sort(same.get(label, ())) if labels.index(x) < labels.index(label)]
        later = [x for x in styles.sort(same.get(label, ())) if labels.index(x) > labels.index(label)]
        alike = earlier[:1] or later
        names.append(f"{label}  (= {', '.join(alike)})" if alike else label)
    handles = [_handle(styles(label), name) for label, name in zip(labels, names)]
    title = "policy" + (f"\n{ORACLE_LEGEND}" if any(label.endswith("*") for label in labels) else "")
    return _legend(fig, [*handles, *extra], title)


def _series(ax: Any, x: Sequence[float], series: dict[str, Sequence[float]], styles: PolicyStyles,
            same: dict[str, set[str]], step: bool = False) -> None:
    """One line per policy in its style, every one drawn even where lines lie on each other:
    the earlier ones a little wider, and their markers either bigger (few points: concentric)
    or at other points (many points: every n-th, staggered by the line's place). `same` keeps, per label, the
    labels equal to it in every panel so far."""
    def key(ys: Sequence[float]) -> tuple:
        return tuple(round(float(v), 9) if math.isfinite(v) else None for v in ys)

    groups: dict[tuple, list[str]] = {}
    for label, ys in series.items():
        groups.setdefault(key(ys), []).append(label)
    for i, (label, ys) in enumerate(series.items()):
        group = groups[key(ys)]
        j = group.index(label)
        under = min(4, len(group) - 1 - j)  # lines drawn over this one
        others = set(group) - {label}
        same[label] = others if label not in same else same[label] & others
        kw: dict[str, Any] = {**styles(label).line(), "linewidth": 1.2 + 0.8 * under, "gid": label, "label": label}
        if len(ys) > 12:
            every = max(len(ys) // 10, len(group))
            start = j if len(group) > 1 else i  # equal lines' markers all at different points, others spread
            kw.update(markersize=5, markevery=(start % every, every))
        else:
            kw.update(markersize=5 + 2.5 * under)
        if step:
            ax.step(x, ys, where="post", **kw)
        else:
            ax.plot(x, ys, **kw)


def _zero_safe_log(ax: Any, values: Iterable[float], linear_below: float | None = None, unit: str = "") -> None:
    """A log y axis where the values span a decade or more, else a linear one from 0; when a
    value is zero, symlog instead of log (linear from 0 to the smallest positive value's power
    of ten, log above, the switch marked): zeros are drawn, not dropped."""
    finite = [v for v in values if math.isfinite(v)]
    positive = [v for v in finite if v > 0]
    if not positive or max(positive) < 10 * min(positive):
        ax.set_yscale("linear")
        top = 1.05 * max(positive, default=1.0)
        ax.set_ylim(-0.03 * top, top)
        return
    if all(v > 0 for v in finite) and linear_below is None:
        ax.set_yscale("log")
        return
    thresh = linear_below or 10 ** math.floor(math.log10(min(positive)))
    ax.set_yscale("symlog", linthresh=thresh, linscale=0.6)
    top = max(positive)
    ax.set_ylim(-thresh * 0.15, top * 1.6)
    ax.axhline(thresh, color="0.6", linewidth=0.6, linestyle=":")
    ax.text(0.005, thresh, f" linear below {thresh:g}{unit}", transform=ax.get_yaxis_transform(), fontsize="x-small",
            color="0.4", ha="left", va="bottom")


def _log_ticks(ax: Any) -> None:
    """Labelled major ticks at 1, 2 and 5 times the powers of ten on a log or symlog y axis
    (at every integer multiple when the data span less than a decade), no minor labels: values
    read without counting gridlines."""
    from matplotlib.ticker import LogLocator, NullFormatter, SymmetricalLogLocator

    scale = ax.get_yscale()
    lo, hi = ax.get_ylim()
    subs = (1.0, 2.0, 5.0) if lo <= 0 or hi / lo >= 10 else (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0)
    if scale == "log":
        ax.yaxis.set_major_locator(LogLocator(subs=subs))
    elif scale == "symlog":
        ax.yaxis.set_major_locator(SymmetricalLogLocator(linthresh=ax.yaxis.get_transform().linthresh, base=10,
                                                         subs=subs))
    else:
        return
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:g}")


def _from_zero(ax: Any, counts: bool = False) -> None:
    """A linear y axis from just below 0 (points at 0 drawn whole, not cut by the frame); whole
    numbers only for counts; an axis with nothing above 0 still shows its zeros."""
    from matplotlib.ticker import MaxNLocator

    data = [float(v) for line in ax.get_lines() for v in line.get_ydata() if math.isfinite(float(v))]
    hi = max(ax.get_ylim()[1], 1.05 * max(data, default=0.0))  # a top point drawn whole too
    if not any(v > 0 for v in data):
        hi = 1.0
    ax.set_ylim(-0.03 * hi, hi)
    if counts:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _save(fig: Any, path: Path, dpi: int = 110) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_open(path, "wb") as fh:
            fig.savefig(fh, dpi=dpi, format="png")
    finally:
        _pyplot().close(fig)
    return path


def _gb_ticks(ax: Any, sizes: Sequence[float], rs: Sequence[dict[str, Any]]) -> None:
    """Ticks at the cache sizes run, 'GB' over the capacity label the tables use."""
    labels = {}
    for r in rs:
        labels.setdefault(r["capacity_gb"], set()).add(r["capacity"])
    if len(sizes) <= 8:
        ax.set_xticks(sizes, [sig(s) + ("\n" + next(iter(labels[s])) if len(labels[s]) == 1 else "") for s in sizes],
                      fontsize="small")


# ---- the report folder (`simulate`, `sweep`) ----------------------------------------------------


@dataclass(frozen=True)
class ReportPlot:
    """One PNG of a report folder: its file name, the `plot_*` function and its records."""

    name: str
    draw: Callable[..., Path]
    records: list[dict[str, Any]]


def report_plots(records: Sequence[dict[str, Any]]) -> list[ReportPlot]:
    """Which PNGs a report holds: decode_vs_capacity.png (every run), stall_by_layer.png and
    timeliness.png (at the smallest cache, where stalls differ most), and for serving runs
    queue.png (requests waiting over time, smallest cache) and, across rates,
    latency_vs_load.png. Skipped points are left out."""
    ran = [r for r in records if "skipped" not in r]
    if not ran:
        return []
    smallest = min(r["capacity_gb"] for r in ran)
    at_smallest = [r for r in ran if r["capacity_gb"] == smallest]
    plots = [
        ReportPlot("decode_vs_capacity.png", plot_decode_vs_capacity, ran),
        ReportPlot("stall_by_layer.png", plot_stall_by_layer, at_smallest),
        ReportPlot("timeliness.png", plot_timeliness, at_smallest),
    ]
    served = [r for r in ran if "arrival" in r]
    if served:
        plots.append(ReportPlot("queue.png", plot_queue, [r for r in served if r["capacity_gb"] == smallest]))
    if len({r.get("rate") for r in served}) > 1:
        plots.append(ReportPlot("latency_vs_load.png", plot_latency_vs_load, served))
    return plots


def draw_report(folder: Path, records: Sequence[dict[str, Any]] | None = None) -> list[Path]:
    """Draw a report folder's PNGs from `records` (default: its results.json), every plot in
    the same policy styles; returns the files written."""
    if records is None:
        records = json.loads((folder / "results.json").read_text())
    styles = PolicyStyles.of(r for r in records if "skipped" not in r)
    return [p.draw(folder / p.name, p.records, styles=styles) for p in report_plots(records)]


# ---- the simulator's plots -------------------------------------------------------------------


def _share(key: str) -> Callable[[dict[str, Any], Any], float | None]:
    def value(r: dict[str, Any], _: Any) -> float | None:
        return 100 * r.get(key, 0) / r["accesses"] if r.get("accesses") else None
    return value


def _loaded_misses(r: dict[str, Any], _: Any) -> float | None:
    """Accesses that waited for a load over the link: the misses less those computed on the host
    or substituted, and the late hits (a prefetch still in flight). A hit on an expert still
    being copied waits as a miss does: layer-offload, whose every streamed expert is a
    prefetch, drew at 0% here while it waited on the link most of all."""
    if not r.get("accesses"):
        return 100 * (1 - r["hit_rate"])
    waited = r["misses"] - r.get("cpu_computed", 0) - r.get("substitutions", 0) + r.get("late_hits", 0)
    return 100 * waited / r["accesses"]


def _vs_lru(r: dict[str, Any], lru: dict[str, Any] | None) -> float | None:
    return 100 * (r[SPEED] / lru[SPEED] - 1) if lru and lru[SPEED] > 0 else None


def _change_axis(ax: Any, values: Sequence[float]) -> None:
    """The change over LRU: a line at 0 (LRU itself); linear, or, when some policy gains more
    than +100%, linear up to +100% and logarithmic above (symlog), the switch marked."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.axhline(0, color="0.3", linewidth=0.8)
    finite = [v for v in values if math.isfinite(v)]
    if finite and max(finite) > 100:
        ax.set_yscale("symlog", linthresh=100, linscale=1.5)
        ax.axhline(100, color="0.6", linewidth=0.6, linestyle=":")
        ax.text(0.005, 100, " log above +100%", transform=ax.get_yaxis_transform(), fontsize="x-small", color="0.4",
                ha="left", va="bottom")
        ax.set_ylim(min(-10.0, min(finite) - 10), 1.6 * max(finite))  # headroom: the top point drawn whole
        ticks = [-100, -50, 0, 50, 100] + [t for t in (200, 500, 1000, 2000, 5000, 10000) if t <= 1.2 * max(finite)]
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:+,.4g}%" if v else "0 (LRU)")


def figure_decode_vs_capacity(records: Sequence[dict[str, Any]], styles: PolicyStyles | None = None) -> Any:
    """Against the expert-cache size: decode tokens/s; the change over LRU; the misses loaded
    over the link (log, zeros kept); and, when some policy has them, the misses computed on the
    host or substituted instead, apart from the loaded ones. One row of panels per value of the
    axes a sweep varies.

    The change over LRU is linear up to +100% and logarithmic above (symlog): a policy 8x
    faster than LRU (host compute) would flatten a linear axis to a line at 0 for the others,
    and clipping would hide by how much it wins; below +100% no point moves, so the middle
    stays readable, and the switch is marked on the axis."""
    styles = styles or PolicyStyles.of(records)
    rows = _facets(records)
    panels: list[tuple[str, str, Callable[[dict[str, Any], Any], float | None]]] = [
        ("decode speed", "decode tokens/s", lambda r, _: r[SPEED]),
    ]
    if any(r["policy"] == "lru" for r in records) and any(r["policy"] != "lru" for r in records):
        panels.append(("change over LRU", "decode tokens/s vs LRU at the same size (%)", _vs_lru))
    panels.append(("misses and late prefetches: loaded over the link", "waited for a load (% of expert accesses)",
                   _loaded_misses))
    if any(r.get("cpu_computed") for r in records):
        panels.append(("misses computed on the host (not loaded)", "computed on the host (% of accesses)",
                       _share("cpu_computed")))
    if any(r.get("substitutions") for r in records):
        panels.append(("misses substituted (lossy, not loaded)", "substituted (% of accesses)",
                       _share("substitutions")))
    square = len(rows) == 1 and len(panels) == 4  # 2 x 2 rather than a strip
    fig, axs = _figure(2 if square else len(rows), 2 if square else len(panels), 4.3, 3.5)
    same: dict[str, set[str]] = {}
    drawn: set[str] = set()
    for row, (facet, rs) in enumerate(rows):
        sizes = sorted({r["capacity_gb"] for r in rs})
        lru = {r["capacity_gb"]: r for r in rs if r["policy"] == "lru"}
        for ax, (name, ylabel, value) in zip(axs.flat if square else axs[row], panels):
            series: dict[str, list[float]] = {}
            for r in sorted(rs, key=lambda r: r["capacity_gb"]):
                v = value(r, lru.get(r["capacity_gb"]))
                if v is not None:
                    series.setdefault(policy_label(r), [math.nan] * len(sizes))[sizes.index(r["capacity_gb"])] = v
            if name.startswith(("misses computed", "misses substituted")):  # only the policies that do it
                series = {k: v for k, v in series.items() if any(x > 0 for x in v)}
                ax.text(0.01, 0.98, "policies not shown: 0%", transform=ax.transAxes, fontsize="x-small", va="top",
                        color="0.4")
            _series(ax, sizes, series, styles, same)
            drawn |= set(series)
            values = [v for ys in series.values() for v in ys]
            if name == "change over LRU":
                _change_axis(ax, values)
            elif name.startswith("misses and late"):
                _zero_safe_log(ax, values, linear_below=1 if any(v == 0 for v in values) else None, unit="%")
                _log_ticks(ax)
                ax.yaxis.set_major_formatter(lambda v, _: f"{v:g}%" if v else "0")
            elif name.startswith("misses"):
                ax.set_ylim(-3, 103)
            else:
                _from_zero(ax)
            # the row's setting on a line of its own, wrapped to the panel: long box names
            # ('rtx4090-64g@gpus=2,link=pcie5 (2 GPUs)') would run into the next panel's title
            ax.set_title(textwrap.fill(facet, 48) + f"\n{name}" if facet else name, fontsize="small")
            ax.set_ylabel(ylabel, fontsize="small")
            ax.set_xlabel("expert cache, all GPUs (GB)", fontsize="small")
            _gb_ticks(ax, sizes, rs)
            ax.grid(True, which="major", alpha=0.3)
    _policy_legend(fig, styles, drawn, same)
    _title(fig, "Decode speed and expert misses against the expert-cache size", run_context(records, "row"))
    return fig


def plot_decode_vs_capacity(path: Path, records: Sequence[dict[str, Any]], styles: PolicyStyles | None = None) -> Path:
    return _save(figure_decode_vs_capacity(records, styles), path)


def _where(records: Sequence[dict[str, Any]]) -> str:
    """'at 2/layer (22.5 GB)' when every record has that cache, else ''."""
    caps = {(r["capacity"], r["capacity_gb"]) for r in records}
    if len(caps) != 1:
        return ""
    cap, gb = next(iter(caps))
    return f" at the cache {cap} ({sig(gb)} GB, the smallest run)"


def figure_stall_by_layer(records: Sequence[dict[str, Any]], styles: PolicyStyles | None = None) -> Any:
    """Seconds decode waited for expert loads at each MoE layer, over the whole run, one line
    per policy (zeros drawn: a symlog axis when a layer has none), one panel per value of the
    axes that vary."""
    styles = styles or PolicyStyles.of(records)
    facets = _facets(records, extra=("capacity",))
    fig, axs = _facet_grid(len(facets), 7.6, 5.6, 6.0, 4.4)
    same: dict[str, set[str]] = {}
    drawn: set[str] = set()
    values: list[float] = []
    for ax, (facet, rs) in zip(axs.flat, facets):
        series = {policy_label(r): [float(v) for v in r["stall_by_layer_s"]] for r in rs if r.get("stall_by_layer_s")}
        if series:
            _series(ax, list(range(len(next(iter(series.values()))))), series, styles, same)
        drawn |= set(series)
        values += [v for ys in series.values() for v in ys]
        ax.set_title(facet, fontsize="small")
        ax.set_xlabel("MoE layer", fontsize="small")
        ax.grid(True, alpha=0.3)
    _zero_safe_log(axs[0][0], values, unit=" s")  # shared by every panel
    _log_ticks(axs[0][0])
    for ax in axs[:, 0]:
        ax.set_ylabel("stall waiting for expert loads (s, run total)", fontsize="small")
    _policy_legend(fig, styles, drawn, same)
    _title(fig, "Stall per MoE layer" + _where(records), run_context(records))
    return fig


def plot_stall_by_layer(path: Path, records: Sequence[dict[str, Any]], styles: PolicyStyles | None = None) -> Path:
    return _save(figure_stall_by_layer(records, styles), path)


_TIMELINESS = (
    ("stall_by_layer_s", "stall (s, run total)", "stall: decode waiting for expert loads"),
    ("stall_bound_by_layer_s", "bound (s, run total)",
     "bandwidth bound: the stall the same loads would cost if each were issued as early as the link allows"),
    ("late_by_layer", "late hits (count)", "late hits: prefetched experts still in flight when needed"),
)


def figure_timeliness(records: Sequence[dict[str, Any]], styles: PolicyStyles | None = None) -> Any:
    """Does a policy lose by prediction or by bandwidth: per MoE layer, its stall, the
    bandwidth bound of the same loads (what no earlier issuing could save) and its late hits,
    one line per policy, on linear axes (zeros drawn)."""
    styles = styles or PolicyStyles.of(records)
    facets = _facets(records, extra=("capacity",))
    fig, axs = _figure(len(_TIMELINESS), len(facets), 7.6 if len(facets) == 1 else 5.4, 2.8, sharex=True)
    same: dict[str, set[str]] = {}
    drawn: set[str] = set()
    for col, (facet, rs) in enumerate(facets):
        for row, (key, ylabel, what) in enumerate(_TIMELINESS):
            ax = axs[row][col]
            series = {policy_label(r): [float(v) for v in r[key]] for r in rs if r.get(key)}
            if series:
                _series(ax, list(range(len(next(iter(series.values()))))), series, styles, same)
            drawn |= set(series)
            ax.set_title(textwrap.fill((f"{facet}: " if facet else "") + what, 70), fontsize="small")
            ax.set_ylabel(ylabel, fontsize="small")
            _from_zero(ax, counts=key == "late_by_layer")
            ax.grid(True, alpha=0.3)
        axs[-1][col].set_xlabel("MoE layer", fontsize="small")
    _policy_legend(fig, styles, drawn, same)
    _title(fig, "Prefetch timeliness per MoE layer" + _where(records), run_context(records))
    return fig


def plot_timeliness(path: Path, records: Sequence[dict[str, Any]], styles: PolicyStyles | None = None) -> Path:
    return _save(figure_timeliness(records, styles), path)


# ---- serving (simulate --arrival / --users, sweep rates) -----------------------------------------


def figure_queue(records: Sequence[dict[str, Any]], styles: PolicyStyles | None = None) -> Any:
    """Requests waiting for admission over simulated time, one step line per policy (a run
    whose queue stayed empty is drawn at 0), one panel per value of the axes that vary."""
    styles = styles or PolicyStyles.of(records)
    facets = _facets(records, extra=("capacity",))
    fig, axs = _facet_grid(len(facets), 7.6, 4.2, 6.0, 3.6)
    same: dict[str, set[str]] = {}
    drawn: set[str] = set()
    for ax, (facet, rs) in zip(axs.flat, facets):
        for r in rs:  # runs differ in their times: one call each
            pts = [tuple(p) for p in r.get("queue_length") or [(0.0, 0)]]
            if r.get("sim_time_s", 0) > pts[-1][0]:  # the last length holds to the end of the run
                pts.append((r["sim_time_s"], pts[-1][1]))
            x, y = [p[0] for p in pts], [float(p[1]) for p in pts]
            _series(ax, x, {policy_label(r): y}, styles, same, step=True)
            drawn.add(policy_label(r))
        ax.set_title(facet, fontsize="small")
        ax.set_xlabel("simulated time (s)", fontsize="small")
        ax.grid(True, alpha=0.3)
    _from_zero(axs[0][0], counts=True)  # shared by every panel: after all are drawn
    for ax in axs[:, 0]:
        ax.set_ylabel("requests waiting for admission (count)", fontsize="small")
    _policy_legend(fig, styles, drawn)
    _title(fig, "Admission queue over time" + _where(records), run_context(records))
    return fig


def plot_queue(path: Path, records: Sequence[dict[str, Any]], styles: PolicyStyles | None = None) -> Path:
    return _save(figure_queue(records, styles), path)


_LATENCY = (("ttft", "p50"), ("ttft", "p99"), ("tpot", "p50"), ("tpot", "p99"))
_LATENCY_NAMES = {"ttft": "time to first token", "tpot": "time per output token"}


def figure_latency_vs_load(records: Sequence[dict[str, Any]], styles: PolicyStyles | None = None) -> Any:
    """TTFT and TPOT, p50 and p99 each in its own column, against the offered load, one line
    per policy, one row per cache size (and per other axis that varies): where a
    configuration saturates. Time axes are log (zeros kept)."""
    styles = styles or PolicyStyles.of(records)
    rows = _facets(records, ignore=("rate",), extra=("capacity",))
    fig, axs = _figure(len(rows), len(_LATENCY), 3.4, 3.0)
    same: dict[str, set[str]] = {}
    drawn: set[str] = set()
    for row, (facet, rs) in enumerate(rows):
        rates = sorted({r["rate"] for r in rs})
        for ax, (what, pct) in zip(axs[row], _LATENCY):
            series: dict[str, list[float]] = {}
            for r in rs:
                ys = series.setdefault(policy_label(r), [math.nan] * len(rates))
                ys[rates.index(r["rate"])] = r[f"{what}_{pct}_s"]
            _series(ax, rates, series, styles, same)
            drawn |= set(series)
            ax.set_title((f"{facet}\n" if facet else "") + f"{_LATENCY_NAMES[what]}, {pct}", fontsize="small")
            ax.set_xlabel("offered load (requests/s)", fontsize="small")
            ax.set_ylabel(f"{what.upper()} {pct} (s)", fontsize="small")
            ax.grid(True, which="both", alpha=0.3)
    for metric in dict.fromkeys(what for what, _ in _LATENCY):  # one scale per metric: p50 and p99 alike
        shared = [axs[row][c] for row in range(len(rows)) for c, (what, _) in enumerate(_LATENCY) if what == metric]
        values = [float(v) for ax in shared for line in ax.get_lines() for v in line.get_ydata()]
        for ax in shared[1:]:
            ax.sharey(shared[0])
        _zero_safe_log(shared[0], values, unit=" s")
        _log_ticks(shared[0])
    _policy_legend(fig, styles, drawn, same)
    _title(fig, "Latency against the offered load (Poisson arrivals)", run_context(records, "row"))
    return fig


def plot_latency_vs_load(path: Path, records: Sequence[dict[str, Any]], styles: PolicyStyles | None = None) -> Path:
    return _save(figure_latency_vs_load(records, styles), path)


# ---- casmoe search ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchPoint:
    """One simulated point of `casmoe search`: its simulate record, what it costs in memory
    (expert cache on the GPUs + RAM tier), whether it meets the target, whether it is a Pareto answer."""

    record: dict[str, Any]
    memory_gb: float
    meets: bool
    pareto: bool = False


def metric_label(metric: str) -> str:
    """A record field as an axis label with its unit: 'decode tokens/s', 'TTFT p99 (s)'."""
    if metric == SPEED:
        return "decode tokens/s"
    words = metric[:-2] if metric.endswith("_s") else metric
    words = " ".join(w.upper() if w in ("ttft", "tpot", "e2e") else w for w in words.split("_"))
    return f"{words} (s)" if metric.endswith("_s") else words


_SEARCH_AXES = ("hardware", "devices", "quant", "host_cache_gb")


def figure_search(points: Sequence[SearchPoint], metric: str, target: str, value: float,
                  styles: PolicyStyles | None = None) -> Any:
    """`casmoe search`: every simulated point, memory against the target metric, one panel per
    configuration besides the policy (box, GPUs, precision, RAM tier), one colour and marker per
    policy; filled where the point meets `target`, hollow where not; Pareto answers circled; the
    target as a dashed line. Panels share their axes."""
    from matplotlib.lines import Line2D

    records = [p.record for p in points]
    styles = styles or PolicyStyles.of(records)
    varied = [a for a in _SEARCH_AXES if len({str(r.get(a)) for r in records}) > 1]
    if "hardware" in varied and "devices" in varied:
        varied.remove("devices")
    panels: dict[str, list[SearchPoint]] = {}
    for p in points:
        panels.setdefault(", ".join(_setting(a, p.record) for a in varied), []).append(p)
    cols = min(len(panels), 3)
    nrows = -(-len(panels) // cols)
    fig, axs = _figure(nrows, cols, 4.4, 3.4, sharex=True, sharey=True)
    for ax in axs.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (panel, mine) in zip(axs.flat, panels.items()):
        for p in mine:
            st = styles(policy_label(p.record))
            ax.scatter([p.memory_gb], [p.record[metric]], marker=st.marker, s=36, linewidths=1.2, edgecolors=st.colour,
                       facecolors=st.colour if p.meets else "none", gid=policy_label(p.record), zorder=3)
            if p.pareto:
                ax.scatter([p.memory_gb], [p.record[metric]], s=220, facecolors="none", edgecolors="black",
                           linewidths=1.2, zorder=2)
        ax.axhline(value, color="0.4", linestyle="--", linewidth=1)
        ax.set_title(panel, fontsize="small")
        ax.grid(True, alpha=0.3)
    for ax in axs[-1]:
        ax.set_xlabel("memory: expert cache on the GPUs + RAM tier (GB)", fontsize="small")
    for ax in axs[:, 0]:
        ax.set_ylabel(metric_label(metric), fontsize="small")
    axs[0][0].set_ylim(bottom=0)
    grey = Style("0.35", "o")
    extra = [
        _handle(grey, "meets the target (filled)", linestyle="none"),
        _handle(grey, "misses it (hollow)", linestyle="none", markerfacecolor="none"),
        Line2D([], [], marker="o", markersize=13, markerfacecolor="none", markeredgecolor="black", linestyle="none",
               label="Pareto answer (circled)"),
        Line2D([], [], color="0.4", linestyle="--", label=f"target: {target}"),
    ]
    labels = {policy_label(r) for r in records}
    handles = [_handle(styles(label), label, linestyle="none") for label in styles.sort(labels)]
    _legend(fig, [*handles, *extra], "policy")
    context = run_context(records)
    if varied:
        context = context.replace("each panel's box", "each panel's box, precision or RAM tier")
    _title(fig, f"Cheapest configurations meeting {target}: every point simulated", context)
    return fig


def plot_search(path: Path, points: Sequence[SearchPoint], metric: str, target: str, value: float,
                styles: PolicyStyles | None = None) -> Path:
    return _save(figure_search(points, metric, target, value, styles), path)


# ---- local routing consistency (casmoe lrc) --------------------------------------------------


def _lrc_trace(res: Any) -> str:
    g = res.geometry
    return (f"{res.name}: {g.layers} MoE layer{'s' * (g.layers != 1)}, {g.experts} experts, top-{g.top_k}; "
            f"{res.requests} request{'s' * (res.requests != 1)}, {res.tokens:,} tokens ({res.token_selection})")


def _lrc_context(results: Sequence[Any]) -> str:
    return "; ".join(_lrc_trace(res) for res in results) + "\nrouting only: no hardware is modelled"


def figure_lrc_sch(results: Sequence[Any], styles: PolicyStyles | None = None) -> Any:
    """Model-level SCH (the best hit rate a cache of C slots reaches on segments of m tokens)
    against rho = C / active experts, one row per trace, one column per m, with its bootstrap
    interval; replayed baselines in their policy styles."""
    from matplotlib.ticker import LogLocator

    from casmoe.policies.registry import POLICIES

    def label(policy: str) -> str:  # starred (and dashed) when it reads the future, as elsewhere
        return policy + ("*" if getattr(POLICIES.get(policy), "needs_future", False) else "")

    policies = list(dict.fromkeys(label(p) for res in results for p in res.baselines))
    styles = styles or PolicyStyles(policies)
    ms = list(results[0].sch)
    fig, axs = _figure(len(results), len(ms), 3.6, 3.0, sharey=True)
    sch = Style("black", "")
    for row, res in enumerate(results):
        g = res.geometry
        rho = [(j + 1) / g.active_experts for j in range(g.total_experts)]
        for ax, m in zip(axs[row], ms):
            est = res.sch[m].model
            ax.plot(rho, est.value, color="black", linewidth=1.6, label="SCH", gid="SCH")
            ax.fill_between(rho, est.lower, est.upper, color="black", alpha=0.15, linewidth=0)
            for policy, levels in res.baselines.items():
                pts = sorted(levels.get("model", {}).items())
                if pts:
                    ax.plot([p for p, _ in pts], [v for _, v in pts], **styles(label(policy)).line(), markersize=5,
                            linewidth=1.1, gid=label(policy), label=label(policy))
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(LogLocator(base=2, numticks=7))
            ax.xaxis.set_major_formatter(lambda v, _: f"{v:g}" if v >= 1 else f"1/{1 / v:g}")
            ax.set_ylim(0, 1.02)
            ax.set_title(f"{res.name}, m = {m} tokens", fontsize="small")
            ax.set_xlabel("rho = cache slots C / active experts", fontsize="small")
            ax.grid(True, alpha=0.3)
        axs[row][0].set_ylabel("hit rate (0-1)", fontsize="small")
    handles = [_handle(sch, "SCH (band: bootstrap interval)", linewidth=1.6, marker="")]
    handles += [_handle(styles(p), f"{p} (replayed, warm hit rate)") for p in styles.sort(policies)]
    _legend(fig, handles, ORACLE_LEGEND if any(p.endswith("*") for p in policies) else None)
    _title(fig, "SCH: best segment hit rate against the cache size, beside replayed policies", _lrc_context(results))
    return fig


def plot_lrc_sch(path: Path, results: Sequence[Any]) -> Path:
    return _save(figure_lrc_sch(results), path)


_TRACE_STYLES = [Style(c, m) for c, m in zip(COLOURS, MARKERS)]


def figure_lrc_srp(results: Sequence[Any]) -> Any:
    """Model-level SRP (best F1 of predicting a segment's experts) against the segment length
    m, with bootstrap intervals, one colour and marker per trace."""
    fig, axs = _figure(1, 1, 5.6, 4.0)
    ax = axs[0][0]
    handles = []
    for i, res in enumerate(results):
        st = _TRACE_STYLES[i % len(_TRACE_STYLES)]
        ms = list(res.srp)
        v = [float(res.srp[m].model.value) for m in ms]
        lo = [v[j] - float(res.srp[m].model.lower) for j, m in enumerate(ms)]
        hi = [float(res.srp[m].model.upper) - v[j] for j, m in enumerate(ms)]
        ax.errorbar(ms, v, yerr=[lo, hi], capsize=3, gid=res.name, **st.line())
        handles.append(_handle(st, res.name))
    ax.set_xscale("log", base=2)
    ms = sorted({m for res in results for m in res.srp})
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("segment length m (tokens)", fontsize="small")
    ax.set_ylabel("SRP: best F1 (0-1)", fontsize="small")
    ax.grid(True, alpha=0.3)
    _legend(fig, handles, "trace (bars: bootstrap interval)")
    _title(fig, "SRP: how well a segment's experts can be predicted, by segment length", _lrc_context(results))
    return fig


def plot_lrc_srp(path: Path, results: Sequence[Any]) -> Path:
    return _save(figure_lrc_srp(results), path)


def figure_lrc_layers(results: Sequence[Any], rho: float = 2.0) -> Any:
    """Per-layer heatmaps (m x MoE layer, layers along the width so that a deep model stays
    readable): SRP, and SCH of a per-layer cache at `rho`, per trace (a column each when
    models are shallow, else two rows each), on one 0-1 colour scale; small maps print
    their values."""
    plt = _pyplot()
    layers = max(r.geometry.layers for r in results)
    ms_most = max(len(r.srp) for r in results)
    side = layers <= 12  # traces side by side
    width = min(14.0, max(3.2, 0.16 * layers + 1.5))
    rows, cols = (2, len(results)) if side else (2 * len(results), 1)
    fig, axs = plt.subplots(rows, cols, figsize=(cols * width + 1.2, rows * (0.3 * ms_most + 1.3) + 1.2),
                            squeeze=False, layout="constrained")
    im = None
    for i, res in enumerate(results):
        ms = list(res.srp)
        n = res.geometry.layers
        srp = [[float(res.srp[m].layers.value[layer]) for layer in range(n)] for m in ms]
        sch = [[(res.sch_at(m, rho, "layer", layer) or {"value": math.nan})["value"] for layer in range(n)]
               for m in ms]
        for j, (data, what) in enumerate(((srp, "SRP (best F1)"), (sch, f"SCH of a per-layer cache at rho = {rho:g}"))):
            ax = axs[j][i] if side else axs[2 * i + j][0]
            im = ax.imshow(data, aspect="auto", vmin=0, vmax=1, cmap="viridis", interpolation="nearest")
            ax.set_yticks(range(len(ms)), [str(m) for m in ms])
            ax.set_xticks(range(n) if n <= 16 else range(0, n, max(1, n // 12)))
            ax.set_ylabel("m (tokens)", fontsize="small")
            ax.set_xlabel("MoE layer", fontsize="small")
            ax.set_title(f"{res.name}: {what}", fontsize="small")
            if n * len(ms) <= 60:
                for y, row in enumerate(data):
                    for x, v in enumerate(row):
                        if math.isfinite(v):
                            ax.text(x, y, f"{v:.2f}", ha="center", va="center", fontsize="x-small",
                                    color="black" if v > 0.6 else "white")
    fig.colorbar(im, ax=axs, fraction=0.04, label="SRP or hit rate (0-1)")
    _title(fig, "Per-layer routing consistency", _lrc_context(results))
    return fig


def plot_lrc_layers(path: Path, results: Sequence[Any], rho: float = 2.0) -> Path:
    return _save(figure_lrc_layers(results, rho), path)


# ---- the planner's gate (casmoe planner eval --plot) -----------------------------------------


_EPSILON = (  # key, label, style
    ("recall_at_k", "cascade recall@k (of the top-k experts)", Style(COLOURS[0], "o")),
    ("coverage_at_2k", "cascade coverage@2k", Style(COLOURS[1], "s")),
    ("eam_share", "share of requests answered by the matcher (EAM)", Style(COLOURS[2], "^", dashed=True)),
)


def figure_epsilon_curve(points: Sequence[dict[str, Any]], baseline: float | None = None, trace: str = "",
                         model: str = "", scope: str = "", k: int | None = None, epsilon: float | None = None) -> Any:
    """The planner's gate trade-off per epsilon: the share of requests the matcher answers,
    and the cascade's recall@k and coverage@2k, all fractions; popularity's recall@k and the
    chosen epsilon as reference lines."""
    fig, axs = _figure(1, 1, 5.6, 3.8, legend_width=3.2)
    ax = axs[0][0]
    eps = [p["epsilon"] for p in points]
    handles = []
    for key, label, st in _EPSILON:
        handles += ax.plot(eps, [p[key] for p in points], **st.line(), markersize=4, label=label, gid=key)
    if baseline is not None:
        handles.append(ax.axhline(baseline, color="0.4", linewidth=0.9, linestyle=":", label="popularity recall@k"))
    if epsilon is not None:
        handles.append(ax.axvline(epsilon, color="0.2", linewidth=0.9, linestyle="-.", label=f"--epsilon {epsilon:g}"))
    ax.set_xlabel("epsilon: cosine-similarity threshold of the matcher", fontsize="small")
    ax.set_ylabel("fraction (0-1)", fontsize="small")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(True, alpha=0.3)
    _legend(fig, handles)
    what = "CasMoE planner: matcher/predictor gate against epsilon" + (f", k = {k}" if k else "")
    context = ", ".join(x for x in (f"model {model}" if model else "", f"trace {trace}" if trace else "", scope) if x)
    _title(fig, what, context + "\nrouting only: no hardware is modelled")
    return fig


def plot_epsilon_curve(points: Sequence[dict[str, Any]], path: Path, baseline: float | None = None, trace: str = "",
                       model: str = "", scope: str = "", k: int | None = None, epsilon: float | None = None) -> Path:
    return _save(figure_epsilon_curve(points, baseline, trace, model, scope, k, epsilon), path, dpi=120)

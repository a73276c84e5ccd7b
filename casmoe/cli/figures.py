"""PNG plots of results (matplotlib imported lazily, on the file-only Agg backend).

Every figure reads without the source: a title of two lines, what it shows and then the setting
(model, box, trace, what is not the default), sized to fit; y axes that say what they measure and
in which unit, one scale a panel (logarithmic only where values span decades and none is 0, never
linear-then-log); at most eight series a panel: the simulator's plots put each family of policies
(`casmoe.policies.family`) in a column of its own with its legend under it; colours from Okabe and
Ito's colour-blind-safe palette, distinct in a panel, one colour and marker per policy that all
plots of a run share (`PolicyStyles`; oracles, starred, dashed); legends beside or under the axes,
never over the data.

Each plot is a pair: `figure_X(...)` builds the matplotlib Figure (the tests inspect it), and
`plot_X(path, ...)` writes it as a PNG, atomically (a file that exists is whole), and closes it.
`report_plots` chooses the PNGs of a `simulate`/`sweep` report folder and `draw_report` draws
them; `draw_plan` draws a plan folder's from its plan.json.

Sections: styles and titles; the report folder; the simulator's plots; serving; `casmoe plan`;
`casmoe search`; routing consistency (`casmoe lrc`); the planner's gate.
"""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from casmoe.output import atomic_open
from casmoe.report import SPEED, human_bytes, policy_label, sig, varied_axes

ORACLE_LEGEND = ("* oracle (dashed): reads the future,\nor fitted on the requests it is\n"
                 "scored on: a bound, not deployable")

# ---- styles and titles ---------------------------------------------------------------------------

PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442")
"""Okabe and Ito's colour-blind-safe palette ("Color Universal Design", 2008), the pale yellow last."""
REFERENCE = "0.45"
"""The grey of reference lines (the best plain cache drawn beside other families): in no series' palette."""
# no two alike at the legend's size: a thin diamond ('d') read as the diamond ('D') of another
# policy in a blue-purple neighbour's colour (fiddler beside n-cpu-moe[gpu_prefill=32])
MARKERS = ("o", "s", "D", "^", "v", "<", ">", "p", "*", "X", "P", "1", "h", "x", "+")
MIN_WIDTH = 12.0
"""Inches a figure of family columns is at least wide: its two-line title fits at 7 points or more."""
SERIES_PER_PANEL = 8
"""At most this many series in one panel: more cannot be told apart (families go on separate panels)."""


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
    """Policy label -> `Style`, the same in every plot given this object.

    Labels are ordered by family (`casmoe.policies.family`: the plots put each family on panels
    of its own), built-ins in the registry's order within it, then the others as first seen.
    Colours come from PALETTE: dealt over the whole run when it has at most 8 labels, else
    per family, so that the (at most 8) series of any panel differ in colour. Markers follow
    the run's order, the next free one where a (colour, marker) pair is taken, so no two labels
    of a run look alike even where families meet in one panel (`casmoe search`). An oracle (its
    label ends in '*') is dashed.
    """

    def __init__(self, labels: Iterable[str] = (), families: dict[str, Any] | None = None) -> None:
        from casmoe.policies.registry import POLICIES

        self._order = {name: i for i, name in enumerate(POLICIES)}
        self._families: dict[str, Any] = dict(families or {})
        self._seen: list[str] = []
        self._styles: dict[str, Style] = {}
        for label in labels:
            if label not in self._seen:
                self._seen.append(label)
        self._deal()

    @classmethod
    def of(cls, records: Iterable[dict[str, Any]]) -> PolicyStyles:
        """The styles of every policy in `records` (families from the records: their oracle
        flag and miss mode count)."""
        from casmoe.policies.family import record_family

        records = list(records)
        return cls((policy_label(r) for r in records), {policy_label(r): record_family(r) for r in records})

    def family(self, label: str) -> Any:
        """The family a label is drawn with."""
        if label not in self._families:
            from casmoe.policies.family import record_family

            self._families[label] = record_family({"policy": label.rstrip("*"), "oracle": label.endswith("*")})
        return self._families[label]

    def _key(self, label: str) -> tuple[int, int, bool, int]:
        from casmoe.policies.family import Family

        return (list(Family).index(self.family(label)), self._order.get(_base(label), len(self._order)),
                label != _base(label), self._seen.index(label))

    def _deal(self) -> None:
        order = sorted(self._seen, key=self._key)
        few = len(order) <= len(PALETTE)
        taken: set[tuple[int, int]] = set()
        ranks: dict[Any, int] = {}
        for place, label in enumerate(order):
            family = self.family(label)
            colour = (place if few else ranks.get(family, 0)) % len(PALETTE)
            ranks[family] = ranks.get(family, 0) + 1
            marker = next(m % len(MARKERS) for m in range(place, place + len(MARKERS))
                          if (colour, m % len(MARKERS)) not in taken)
            taken.add((colour, marker))
            self._styles[label] = Style(PALETTE[colour], MARKERS[marker], label.endswith("*"))

    def __call__(self, label: str) -> Style:
        if label not in self._styles:
            self._seen.append(label)
            self._deal()
        return self._styles[label]

    def sort(self, labels: Iterable[str]) -> list[str]:
        """`labels` by family, then in their family's order: the legends' order."""
        labels = list(labels)
        for label in labels:
            self(label)
        return sorted(labels, key=self._key)


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
    """The run for a title's second line: model on box, trace, then what is not the default of
    batch, miss mode, expert precision and workload, and the stack; what varies between
    `records` is named as shown `per` panel."""
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
    defaults = {"batch": 1, "miss_mode": "load", "host_cache_gb": 0}  # said by nothing: what a plain run is
    settings = [_setting(a, r) for a in ("batch", "miss_mode", "quant", "host_cache_gb") if a in r and same(a)
                and r[a] != defaults.get(a) and not (a == "batch" and served)]
    if "stack" in r:  # every figure assumed a runtime's costs: say whose (a record without one predates stacks)
        settings.append(_setting("stack", r) if same("stack") else f"each {per}'s stack")
    if served:
        settings.append(str(r[work]))
    return f"{model} on {where}, {trace}" + (f"; {', '.join(settings)}" if settings else "")


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
    """Two lines over the panels: what the figure shows, then the setting (the context's lines
    joined), in the largest font up to 10 points in which both fit the panels' width, as
    measured (the legend beside them keeps its place: call this after the legend). Only a
    setting too long even at 7 points wraps."""
    if fig.legends:  # laid out only to place them (a whole draw: most figures have none)
        fig.draw_without_rendering()
    width_in = fig.get_figwidth()
    right = min((leg.get_window_extent().x0 / fig.dpi for leg in fig.legends), default=width_in) - 0.1
    setting = "; ".join(line for line in context.splitlines() if line)
    text = "\n".join([what, *([setting] if setting else [])])
    renderer = fig.canvas.get_renderer()
    size = 10.0
    for _ in range(4):  # glyph widths do not scale exactly with the size: shrink until it fits
        title = fig.suptitle(text, fontsize=size, x=right / 2 / width_in)
        over = title.get_window_extent(renderer).width / fig.dpi / (0.95 * right)  # hinting varies with the dpi
        if over <= 1.0 or size == 7.0:
            break
        size = max(7.0, size / over * 0.98)
    if over > 1.0:  # too long even at 7 points: the setting wraps
        chars = int(len(max(text.splitlines(), key=len)) / over)
        fig.suptitle("\n".join([what, textwrap.fill(setting, chars)]), fontsize=size, x=right / 2 / width_in)


def _legend(fig: Any, handles: Sequence[Any], title: str | None = None) -> Any:
    """The figure's legend beside its panels (constrained layout keeps it off the axes)."""
    return fig.legend(handles=list(handles), loc="outside right upper", fontsize="small", title=title,
                      title_fontsize="small", alignment="left")


def _handle(style: Style, label: str, **kw: Any) -> Any:
    from matplotlib.lines import Line2D

    return Line2D([], [], **{**style.line(), "markersize": 6, "linewidth": 1.3, **kw}, label=label)


def _policy_handles(styles: PolicyStyles, labels: Iterable[str], same: dict[str, set[str]] | None = None
                    ) -> list[Any]:
    """One legend entry per policy in `labels`, in family order; where lines lie on each other in
    every panel, the first of them says so ('lru (= least-stale)'), the others name it ('= lru')."""
    labels = styles.sort(set(labels))
    same = same or {}
    handles = []
    for label in labels:
        earlier = [x for x in styles.sort(same.get(label, ())) if labels.index(x) < labels.index(label)]
        later = [x for x in styles.sort(same.get(label, ())) if labels.index(x) > labels.index(label)]
        alike = earlier[:1] or later
        handles.append(_handle(styles(label), f"{label}  (= {', '.join(alike)})" if alike else label))
    return handles


def _policy_legend(fig: Any, styles: PolicyStyles, labels: Iterable[str], same: dict[str, set[str]] | None = None,
                   extra: Sequence[Any] = ()) -> Any:
    """The figure's legend of the policies in `labels` (`_policy_handles`), oracles explained."""
    title = "policy" + (f"\n{ORACLE_LEGEND}" if any(label.endswith("*") for label in labels) else "")
    return _legend(fig, [*_policy_handles(styles, labels, same), *extra], title)


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


def _one_scale(ax: Any, values: Iterable[float]) -> None:
    """A log y axis where the values span a decade or more and none is 0, else a linear one
    from 0 (zeros drawn, never dropped; no axis switches from linear to log part-way)."""
    finite = [v for v in values if math.isfinite(v)]
    positive = [v for v in finite if v > 0]
    if positive and max(positive) >= 10 * min(positive) and len(positive) == len(finite):
        ax.set_yscale("log")
        return
    ax.set_yscale("linear")
    top = 1.05 * max(positive, default=1.0)
    ax.set_ylim(-0.03 * top, top)


def _log_ticks(ax: Any) -> None:
    """Labelled major ticks at 1, 2 and 5 times the powers of ten on a log y axis (at every
    integer multiple when the data span less than a decade), no minor labels: values read
    without counting gridlines."""
    from matplotlib.ticker import LogLocator, NullFormatter

    if ax.get_yscale() != "log":
        return
    lo, hi = ax.get_ylim()
    subs = (1.0, 2.0, 5.0) if hi / lo >= 10 else (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0)
    ax.yaxis.set_major_locator(LogLocator(subs=subs))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:g}")


def _from_zero(ax: Any, counts: bool = False, lines: Sequence[Any] | None = None) -> None:
    """A linear y axis from just below 0 (points at 0 drawn whole, not cut by the frame); whole
    numbers only for counts; an axis with nothing above 0 still shows its zeros. `lines`: the
    lines of every panel sharing the axis (default: this panel's)."""
    from matplotlib.ticker import MaxNLocator

    lines = ax.get_lines() if lines is None else lines
    data = [float(v) for line in lines for v in line.get_ydata() if math.isfinite(float(v))]
    hi = 1.05 * max(data, default=0.0)  # a top point drawn whole too
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
    """One PNG of a report folder: its file name, the `figure_*` function and its records."""

    name: str
    figure: Callable[..., Any]
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
        ReportPlot("decode_vs_capacity.png", figure_decode_vs_capacity, ran),
        ReportPlot("stall_by_layer.png", figure_stall_by_layer, at_smallest),
        ReportPlot("timeliness.png", figure_timeliness, at_smallest),
    ]
    served = [r for r in ran if "arrival" in r]
    if served:
        plots.append(ReportPlot("queue.png", figure_queue, [r for r in served if r["capacity_gb"] == smallest]))
    if len({r.get("rate") for r in served}) > 1:
        plots.append(ReportPlot("latency_vs_load.png", figure_latency_vs_load, served))
    return plots


def draw_report(folder: Path, records: Sequence[dict[str, Any]] | None = None, dpi: int = 110) -> list[Path]:
    """Draw a report folder's PNGs from `records` (default: its results.json), every plot in
    the same policy styles; returns the files written."""
    if records is None:
        records = json.loads((folder / "results.json").read_text())
    styles = PolicyStyles.of(r for r in records if "skipped" not in r)
    return [_save(p.figure(p.records, styles), folder / p.name, dpi) for p in report_plots(records)]


# ---- the simulator's plots -------------------------------------------------------------------


def _loaded_misses(r: dict[str, Any]) -> float:
    """Accesses that waited for a load over the link: the misses less those computed on the host
    or substituted, and the late hits (a prefetch still in flight). A hit on an expert still
    being copied waits as a miss does: layer-offload, whose every streamed expert is a
    prefetch, drew at 0% here while it waited on the link most of all."""
    if not r.get("accesses"):
        return 100 * (1 - r["hit_rate"])
    waited = r["misses"] - r.get("cpu_computed", 0) - r.get("substitutions", 0) + r.get("late_hits", 0)
    return 100 * waited / r["accesses"]


@dataclass
class Columns:
    """A figure of one column of panels per family of policies (`casmoe.policies.family`), each
    column a subfigure with its own legend under it, so a panel holds at most a family's series;
    and, where some run uploaded experts before its first request, a last narrow column for
    that one-time setup (`setup`)."""

    fig: Any
    families: list[Any]
    axes: list[list[Any]]  # [column][row]
    subfigures: list[Any]
    setup: Any = None  # the setup column's axes, or None

    @classmethod
    def build(cls, records: Sequence[dict[str, Any]], styles: PolicyStyles, rows: int, width: float, height: float,
              setup: bool = False) -> Columns:
        from casmoe.policies.family import Family

        present = {styles.family(policy_label(r)) for r in records}
        families = [f for f in Family if f in present]
        setup = setup and any(_setup_s(r) for r in records)
        plt = _pyplot()
        widths = [width] * len(families) + ([width * 1.1] if setup else [])
        widths = [w * max(1.0, MIN_WIDTH / sum(widths)) for w in widths]  # room for the setting's line
        fig = plt.figure(figsize=(sum(widths), rows * height + 2.2), layout="constrained")
        subs = list(fig.subfigures(1, len(widths), width_ratios=widths, squeeze=False)[0])
        axes = [list(sub.subplots(rows, 1, squeeze=False)[:, 0]) for sub in subs[:len(families)]]
        extra = subs[-1].subplots(1, 1) if setup else None
        for family, column in zip(families, axes):
            column[0].set_title(f"{family.value}\n{textwrap.fill(family.means, int(width * 12))}", fontsize="small")
        return cls(fig, families, axes, subs, extra)

    def legends(self, styles: PolicyStyles, drawn: dict[Any, set[str]], same: dict[str, set[str]],
                extra: dict[Any, list[Any]] | None = None) -> None:
        """Each column's policies under it (and the reference lines drawn in it)."""
        from matplotlib.lines import Line2D

        columns = [_policy_handles(styles, drawn.get(family, ()), same) + (extra or {}).get(family, [])
                   for family in self.families]
        rows = max(map(len, columns), default=0)
        for handles, sub in zip(columns, self.subfigures):  # padded to one length: the columns' panels line up
            blank = [Line2D([], [], linestyle="none", label=" ") for _ in range(rows - len(handles))]
            sub.legend(handles=handles + blank, loc="outside lower center", fontsize="small", frameon=False)


def _setup_s(r: dict[str, Any]) -> float:
    """Seconds a run spent before its first request uploading the experts it places (the
    simulator's `setup_s`; absent from older records: 0)."""
    return float(r.get("setup_s") or 0.0)


def _draw_setup(ax: Any, records: Sequence[dict[str, Any]], styles: PolicyStyles) -> None:
    """The one-time setup apart from the run's stalls: a bar per policy that has one, its
    bytes beside it. It is paid once, before the first request, not per token."""
    rs = sorted((r for r in records if _setup_s(r)), key=lambda r: _setup_s(r))
    labels = [policy_label(r) for r in rs]
    ax.barh(range(len(rs)), [_setup_s(r) for r in rs], color=[styles(label).colour for label in labels], height=0.6)
    for i, r in enumerate(rs):
        if r.get("setup_bytes"):
            ax.text(_setup_s(r), i, f" {human_bytes(r['setup_bytes'])}", va="center", fontsize="x-small")
    ax.set_yticks(range(len(rs)), labels, fontsize="small")
    ax.set_xlim(0, 1.35 * max(_setup_s(r) for r in rs))
    ax.set_xlabel("s, once per run", fontsize="small")
    ax.set_title("one-time setup, before\nthe first request (no stall)", fontsize="small")
    ax.grid(True, axis="x", alpha=0.3)


def _plain_best(records: Sequence[dict[str, Any]]) -> tuple[dict[float, float], list[str]]:
    """The best plain cache's decode tok/s per cache size (the headline's baseline,
    `casmoe.policies.family.plain_cache`), and the policies it is, in order."""
    from casmoe.policies.family import plain_cache

    best: dict[float, dict[str, Any]] = {}
    for r in records:
        if not r.get("oracle") and plain_cache(r):
            size = r["capacity_gb"]
            if size not in best or r[SPEED] > best[size][SPEED]:
                best[size] = r
    return {k: v[SPEED] for k, v in best.items()}, list(dict.fromkeys(policy_label(r) for r in best.values()))


def _reference(ax: Any, sizes: Sequence[float], best: dict[float, float], names: Sequence[str]) -> Any:
    """The best plain cache as a grey reference line in another family's panel."""
    ys = [best.get(x, math.nan) for x in sizes]
    label = f"best plain cache ({' or '.join(names)})"
    return ax.plot(sizes, ys, color=REFERENCE, linewidth=2.2, linestyle=":", gid=f"reference:{label}",
                   label=label, zorder=1)[0]


def _speed_scale(axes: Sequence[Any], values: Sequence[float]) -> None:
    """One y scale for every speed panel: logarithmic when the speeds span a decade or more
    (a ratio reads as the same distance everywhere), else linear from 0."""
    positive = [v for v in values if math.isfinite(v) and v > 0]
    for ax in axes:  # the same limits set on each: an axis shared across subfigures redraws the figure per change
        if positive and max(positive) >= 10 * min(positive):
            ax.set_yscale("log")
            ax.set_ylim(min(positive) / 1.3, max(positive) * 1.3)
            _log_ticks(ax)
        else:
            top = 1.05 * max(positive, default=1.0)
            ax.set_ylim(-0.03 * top, top)


def figure_decode_vs_capacity(records: Sequence[dict[str, Any]], styles: PolicyStyles | None = None) -> Any:
    """Against the expert-cache size, one column per family of policies: decode tokens/s, with
    the best plain cache (the headline's baseline) as a grey reference in the other families'
    panels; and the share of expert accesses that waited for a load over the link (misses and
    late prefetches). A pair of rows per value of the axes a sweep varies. Every speed panel
    has one scale (logarithmic when speeds span a decade, so ratios read alike at every size;
    else linear from 0); the waits are linear, 0-100%."""
    styles = styles or PolicyStyles.of(records)
    facets = _facets(records)
    cols = Columns.build(records, styles, 2 * len(facets), 3.5, 2.7)
    same: dict[str, set[str]] = {}
    drawn: dict[Any, set[str]] = {}
    refs: dict[Any, list[Any]] = {}
    speed_axes, speeds = [], []
    for f, (facet, rs) in enumerate(facets):
        sizes = sorted({r["capacity_gb"] for r in rs})
        plain, names = _plain_best(rs)
        for family, column in zip(cols.families, cols.axes):
            mine = sorted((r for r in rs if styles.family(policy_label(r)) is family), key=lambda r: r["capacity_gb"])
            top, bottom = column[2 * f], column[2 * f + 1]
            for ax, value in ((top, lambda r: r[SPEED]), (bottom, _loaded_misses)):
                series: dict[str, list[float]] = {}
                for r in mine:
                    series.setdefault(policy_label(r), [math.nan] * len(sizes))[sizes.index(r["capacity_gb"])] = value(r)
                _series(ax, sizes, series, styles, same)
                drawn.setdefault(family, set()).update(series)
                _gb_ticks(ax, sizes, rs)
                ax.grid(True, which="major", alpha=0.3)
            speeds += [r[SPEED] for r in mine]
            if plain and family.name != "REACTIVE":
                refs.setdefault(family, [_reference(top, sizes, plain, names)])
                speeds += list(plain.values())
            speed_axes.append(top)
            bottom.set_ylim(-3, 103)
            bottom.set_xlabel("expert cache, all GPUs (GB)", fontsize="small")
            if facet:
                top.set_title((f"{family.value}\n" if f else top.get_title() + "\n") + textwrap.fill(facet, 44),
                              fontsize="small")
        cols.axes[0][2 * f].set_ylabel("decode tokens/s", fontsize="small")
        cols.axes[0][2 * f + 1].set_ylabel("waited for the link\n(% of expert accesses)", fontsize="small")
    _speed_scale(speed_axes, speeds)
    cols.legends(styles, drawn, same, refs)
    _title(cols.fig, "Decode speed and waits for the link against the expert-cache size, by family of policy",
           run_context(records, "row"))
    return cols.fig


def plot_decode_vs_capacity(path: Path, records: Sequence[dict[str, Any]], styles: PolicyStyles | None = None) -> Path:
    return _save(figure_decode_vs_capacity(records, styles), path)


def _where(records: Sequence[dict[str, Any]]) -> str:
    """' at 2/layer (22.5 GB)' when every record has that cache, else ''."""
    caps = {(r["capacity"], r["capacity_gb"]) for r in records}
    if len(caps) != 1:
        return ""
    cap, gb = next(iter(caps))
    return f" at the smallest cache, {cap} ({sig(gb)} GB)"


def _per_layer(cols: Columns, rows: Sequence[tuple[str, str]], facets: Sequence[tuple[str, list[dict[str, Any]]]],
               styles: PolicyStyles, counts: Sequence[str] = ()) -> None:
    """Draw per-layer lists (`rows`: record key, y label) one row of panels each, per facet, a
    family per column, every panel of a row on one linear scale from 0 (`counts`: whole numbers)."""
    same: dict[str, set[str]] = {}
    drawn: dict[Any, set[str]] = {}
    for f, (facet, rs) in enumerate(facets):
        for i, (key, ylabel) in enumerate(rows):
            row = [column[f * len(rows) + i] for column in cols.axes]
            for family, ax in zip(cols.families, row):
                series = {policy_label(r): [float(v) for v in r[key]] for r in rs
                          if r.get(key) and styles.family(policy_label(r)) is family}
                if series:
                    _series(ax, list(range(len(next(iter(series.values()))))), series, styles, same)
                drawn.setdefault(family, set()).update(series)
                ax.grid(True, alpha=0.3)
                if facet and i == 0:
                    ax.set_title((ax.get_title() + "\n" if f == 0 else "") + textwrap.fill(facet, 44),
                                 fontsize="small")
            for ax in row:  # one scale for the row, set on each panel (see `_speed_scale`)
                _from_zero(ax, counts=key in counts, lines=[ln for other in row for ln in other.get_lines()])
            row[0].set_ylabel(ylabel, fontsize="small")
    for column in cols.axes:
        column[-1].set_xlabel("MoE layer", fontsize="small")
    cols.legends(styles, drawn, same)


def figure_stall_by_layer(records: Sequence[dict[str, Any]], styles: PolicyStyles | None = None) -> Any:
    """Seconds decode waited for expert loads at each MoE layer over the whole run, one column
    per family (a row per value of the axes that vary), every panel on one linear scale from 0;
    the one-time upload of a placement's experts before the first request, where a record has
    one (`setup_s`), in a panel of its own: it is no stall of the run."""
    styles = styles or PolicyStyles.of(records)
    facets = _facets(records, extra=("capacity",))
    cols = Columns.build(records, styles, len(facets), 3.6, 3.2, setup=True)
    _per_layer(cols, [("stall_by_layer_s", "stall waiting for expert loads (s, run total)")], facets, styles)
    if cols.setup is not None:
        _draw_setup(cols.setup, records, styles)
    _title(cols.fig, "Stall per MoE layer" + _where(records), run_context(records))
    return cols.fig


def plot_stall_by_layer(path: Path, records: Sequence[dict[str, Any]], styles: PolicyStyles | None = None) -> Path:
    return _save(figure_stall_by_layer(records, styles), path)


_TIMELINESS = (
    ("stall_by_layer_s", "stall (s, run total)"),
    ("stall_bound_by_layer_s", "bandwidth bound (s, run total)"),
    ("late_by_layer", "late hits (count)"),
)


def figure_timeliness(records: Sequence[dict[str, Any]], styles: PolicyStyles | None = None) -> Any:
    """Does a policy lose by prediction or by bandwidth: per MoE layer, its stall, the
    bandwidth bound of the same loads (the stall if each were issued as early as the link
    allows: what no earlier issuing could save) and its late hits (prefetches still in flight
    when needed); a family per column, each row on one linear scale from 0; the one-time setup
    apart, as in `figure_stall_by_layer`."""
    styles = styles or PolicyStyles.of(records)
    facets = _facets(records, extra=("capacity",))
    cols = Columns.build(records, styles, len(_TIMELINESS) * len(facets), 3.6, 2.3, setup=True)
    _per_layer(cols, _TIMELINESS, facets, styles, counts=("late_by_layer",))
    if cols.setup is not None:
        _draw_setup(cols.setup, records, styles)
    _title(cols.fig, "Prefetch timeliness per MoE layer" + _where(records)
           + ": stall, bandwidth bound and late hits", run_context(records))
    return cols.fig


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
    configuration saturates. Time axes are log where they span a decade and none is 0, else linear."""
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
        _one_scale(shared[0], values)
        _log_ticks(shared[0])
    _policy_legend(fig, styles, drawn, same)
    _title(fig, "Latency against the offered load (Poisson arrivals)", run_context(records, "row"))
    return fig


def plot_latency_vs_load(path: Path, records: Sequence[dict[str, Any]], styles: PolicyStyles | None = None) -> Path:
    return _save(figure_latency_vs_load(records, styles), path)


# ---- casmoe plan ----------------------------------------------------------------------------


_MEMORY_PARTS = (  # plan.json key -> (legend, colour): the memory map's segments, left to right
    ("reserve_gib", "runtime reserve", "0.62"),
    ("dense_gib", "dense weights", PALETTE[0]),
    ("embeddings_gib", "embeddings", PALETTE[5]),
    ("kv_gib", "KV cache", PALETTE[1]),
    ("experts_gib", "expert slots", PALETTE[2]),
    ("free_gib", "free", "white"),
)


def _plan_setting(plan: dict[str, Any]) -> str:
    """'qwen3-30b-a3b on rtx4090x4@gpus=1: 1 GPU (24 GiB), 64 GiB host RAM; context 8192 x 1; experts bf16; ...'."""
    b = plan["box"]
    gpus = b["gpus_gib"]
    return (f"{plan['model']} on {plan['hardware']}: {len(gpus)} GPU{'s' * (len(gpus) != 1)} "
            f"({', '.join(f'{g:g}' for g in gpus)} GiB), {b['host_ram_gib']:g} GiB host RAM; "
            f"context {plan['context']} x {plan['concurrency']}; {plan['precisions']}")


def _plan_engines(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The engines that have a configuration (each one's best)."""
    return [e for e in plan["engines"] if e.get("best")]


def _memory_bars(ax: Any, memory: dict[str, Any]) -> None:
    """A stacked horizontal bar per GPU and per host NUMA node, GiB; what overflows the device
    runs past its total, marked."""
    places = [(f"GPU {g['gpu']}", g) for g in memory["gpus"]] + [(f"host {h['node']}", h) for h in memory["host"]]
    for y, (_, part) in enumerate(places):
        left = 0.0
        for key, _, colour in _MEMORY_PARTS:
            width = max(0.0, float(part.get(key) or 0.0))
            if width:
                ax.barh(y, width, left=left, height=0.62, color=colour, edgecolor="0.35", linewidth=0.6)
                if key == "experts_gib" and part.get("expert_count") and width > 0.12 * part["total_gib"]:
                    ax.text(left + width / 2, y, f"{part['expert_count']:,} experts", ha="center", va="center",
                            fontsize="x-small", color="white")
                left += width
        ax.plot([part["total_gib"]] * 2, [y - 0.4, y + 0.4], color="black", linewidth=1.6)
        if part["used_gib"] > part["total_gib"]:
            ax.text(part["total_gib"], y + 0.42, " over by " + f"{part['used_gib'] - part['total_gib']:.3g} GiB",
                    fontsize="x-small", color=PALETTE[3], va="bottom")
    ax.set_yticks(range(len(places)), [name for name, _ in places], fontsize="small")
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.3)


def _layer_strip(ax: Any, cand: dict[str, Any]) -> Any:
    """Which layers' experts live where: per GPU (and the host), the share of each MoE layer's
    experts it holds; None when plan.json does not say (`gpu_experts_by_layer`)."""
    counts = cand.get("gpu_experts_by_layer")
    per = cand.get("experts_per_layer")
    if not counts or not per:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "plan.json does not list\nthe experts per layer", ha="center", va="center",
                fontsize="small", transform=ax.transAxes)
        return None
    shares = [[c / per for c in row] for row in counts]
    shares.append([1 - sum(col) for col in zip(*shares)])
    image = ax.imshow(shares, aspect="auto", vmin=0, vmax=1, cmap="viridis", interpolation="nearest")
    ax.set_yticks(range(len(shares)), [*(f"GPU {i}" for i in range(len(counts))), "host"], fontsize="small")
    layers = len(shares[0])
    ax.set_xticks(range(0, layers, max(1, layers // 8)))
    return image


def figure_plan_memory(plan: dict[str, Any]) -> Any:
    """The memory map of each engine's configuration on the box: a stacked bar per GPU and per
    host NUMA node (runtime reserve, dense weights, embeddings, KV cache, expert slots, free;
    the device's total marked, what overflows it past the mark), and beside it which layers'
    experts live where (the share of each MoE layer's experts on each GPU and on the host)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    engines = _plan_engines(plan)
    places = max((len(e["best"]["memory"]["gpus"]) + len(e["best"]["memory"]["host"]) for e in engines), default=1)
    plt = _pyplot()
    fig, axs = plt.subplots(max(1, len(engines)), 2, figsize=(12.5, max(1, len(engines)) * (0.45 * places + 1.0) + 1.0),
                            squeeze=False, layout="constrained", width_ratios=(3, 2))
    image = None
    for (bars, strip), e in zip(axs, engines):
        cand = e["best"]
        _memory_bars(bars, cand["memory"])
        verdict = "fits" if cand["fits"] else "DOES NOT FIT"
        precision = f", {cand['precision_name']}" if cand.get("precision_name") else ""
        bars.set_title(textwrap.shorten(f"{e['engine']}: {cand['label']}{precision} ({verdict})", 80), fontsize="small",
                       loc="left")
        image = _layer_strip(strip, cand) or image
    for bars, strip in axs[1:]:
        bars.sharex(axs[0][0])
    axs[-1][0].set_xlabel("GiB", fontsize="small")
    axs[-1][1].set_xlabel("MoE layer", fontsize="small")
    axs[0][1].set_title("share of each layer's experts held there", fontsize="small")
    if image is not None:
        fig.colorbar(image, ax=axs[:, 1], fraction=0.05, label="share of the layer's experts (0-1)")
    handles = [Patch(facecolor=c, edgecolor="0.35", label=name) for key, name, c in _MEMORY_PARTS]
    handles.append(Line2D([], [], color="black", linewidth=1.6, label="the device's memory"))
    _legend(fig, handles)
    _title(fig, "Memory map of each engine's best configuration, and which layers' experts live where",
           _plan_setting(plan))
    return fig


def _candidates(plan: dict[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
    """(engine, candidate, is the engine's best) for every configuration plan.json holds."""
    return [(e["engine"], c, i == 0) for e in plan["engines"] for i, c in
            enumerate([e["best"], *e.get("runners_up", [])] if e.get("best") else [])]


def figure_plan_speed(plan: dict[str, Any]) -> Any:
    """Every candidate configuration's expected decode tokens/s at the plan's context (filled: its
    engine's best), with the interval the published table measured for its
    kind of configuration as a bar; one colour per engine; a configuration that does not fit
    drawn grey and crossed. Log axis: the intervals are factors (x/÷)."""
    from matplotlib.lines import Line2D

    rows = [(engine, c, best) for engine, c, best in _candidates(plan) if (c.get("speed") or {}).get("decode_tok_s")]
    rows.sort(key=lambda row: row[1]["speed"]["decode_tok_s"])
    engines = list(dict.fromkeys(e["engine"] for e in plan["engines"]))
    colour = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(engines)}
    plt = _pyplot()
    fig, axs = plt.subplots(1, 1, figsize=(12.0, 0.38 * len(rows) + 1.8), squeeze=False, layout="constrained")
    ax = axs[0][0]
    for y, (engine, c, best) in enumerate(rows):
        s = c["speed"]
        tint = colour[engine] if c["fits"] else "0.6"
        band = s.get("decode_band_tok_s")
        if band:
            ax.plot(band, [y, y], color=tint, linewidth=3, alpha=0.35, solid_capstyle="butt")
        ax.plot([s["decode_tok_s"]], [y], marker="o" if c["fits"] else "X", markersize=8 if best else 6, color=tint,
                markerfacecolor=tint if best else "white", linestyle="none", gid=f"{engine}: {c['label']}")
        note = "" if band else ("  upper bound (ideal stack)" if "upper bound" in s.get("uncertainty", "")
                                else "  no validated interval")
        ax.text(s["decode_tok_s"], y + 0.3, f" {s['decode_tok_s']:.3g}{note}", fontsize="x-small", va="bottom",
                color="0.25")
    ax.set_yticks(range(len(rows)), [textwrap.shorten(f"{e}: {c['label']}" + (f", {c['precision_name']}" if
                                                                           c.get("precision_name") else ""), 72)
                                     + ("" if c["fits"] else " [does not fit]") for e, c, _ in rows], fontsize="small")
    ax.set_xscale("log")
    ax.set_xlabel("decode tokens/s (log scale)", fontsize="small")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.set_ylim(-0.7, len(rows) - 0.2)
    handles = [Line2D([], [], marker="o", color=colour[name], linestyle="none", label=name) for name in engines]
    handles += [Line2D([], [], marker="o", color="0.3", markerfacecolor="white", linestyle="none",
                       label="a runner-up (filled: the engine's best)"),
                Line2D([], [], color="0.3", linewidth=3, alpha=0.35, label="80% interval of the published table"),
                Line2D([], [], marker="X", color="0.6", linestyle="none", label="does not fit")]
    _legend(fig, handles, "engine")
    _title(fig, "Expected decode speed of every configuration, with its interval", _plan_setting(plan))
    return fig


def plan_pictures(plan: dict[str, Any]) -> list[str]:
    """The files `draw_plan` writes for `plan`: none when no engine has a configuration."""
    return ["plan_memory.png", "plan_speed.png"] if _plan_engines(plan) else []


def draw_plan(folder: Path, out: Path | None = None, dpi: int = 110) -> list[Path]:
    """The plan's pictures, drawn from its plan.json alone (so they follow whatever the plan
    writes), into `out` (default: beside it): plan_memory.png (`figure_plan_memory`) and
    plan_speed.png (`figure_plan_speed`); returns the files written."""
    plan = json.loads((folder / "plan.json").read_text())
    if not plan_pictures(plan):
        return []
    out = folder if out is None else out
    return [_save(figure_plan_memory(plan), out / "plan_memory.png", dpi),
            _save(figure_plan_speed(plan), out / "plan_speed.png", dpi)]


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


_TRACE_STYLES = [Style(c, m) for c, m in zip(PALETTE, MARKERS)]


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
    ("recall_at_k", "cascade recall@k (of the top-k experts)", Style(PALETTE[0], "o")),
    ("coverage_at_2k", "cascade coverage@2k", Style(PALETTE[1], "s")),
    ("eam_share", "share of requests answered by the matcher (EAM)", Style(PALETTE[2], "^", dashed=True)),
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

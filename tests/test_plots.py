"""`casmoe.cli.figures`: each figure, built from a few synthetic records, read back through matplotlib's
objects before it is saved: a title naming the model, the box and the trace; y axes with a unit;
one (colour, marker) pair per policy, the same in every plot of a run, oracles dashed; the legend
beside the axes, not over them; zeros drawn, not dropped by a log axis; host-computed misses
apart from loaded ones."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from casmoe.cli import figures as plots  # noqa: E402
from casmoe.cli.figures import PolicyStyles, SearchPoint  # noqa: E402

LAYERS = 6
POLICIES = ["ondemand", "lru", "least-stale", "n-cpu-moe", "casmoe[predictor=exact]", "belady"]
ORACLES = {"casmoe[predictor=exact]", "belady"}


def record(policy: str, slots: int, rate: float | None = None) -> dict[str, Any]:
    """A simulate record with the fields the plots read; least-stale equals lru, n-cpu-moe
    computes its misses on the host and never stalls on layers 0-2, belady is 9x LRU."""
    i = POLICIES.index(policy)
    speed = {"ondemand": 1.0, "lru": 2.0 * slots, "least-stale": 2.0 * slots, "n-cpu-moe": 9.0 + slots,
             "casmoe[predictor=exact]": 2.5 * slots, "belady": 18.0 * slots}[policy]
    accesses, misses = 1000, (1000 if policy == "ondemand" else 600 // slots)
    stall = [0.0 if policy == "n-cpu-moe" and layer < 3 else 0.1 * (i + 1) + 0.01 * layer for layer in range(LAYERS)]
    if policy == "least-stale":
        stall = [0.1 * 2 + 0.01 * layer for layer in range(LAYERS)]  # = lru's
    r = {
        "trace": "tiny-mixtral.npz", "model": "mixtral-8x7b", "hardware": "rtx4090x4", "devices": 4,
        "policy": policy, "oracle": policy in ORACLES, "capacity": f"{slots}/layer", "capacity_gb": 11.3 * slots,
        "batch": 1, "miss_mode": "load", "quant": "trace", "scored": "2 of 800 requests (the first 2 of the trace)",
        "workload": "back-to-back", "decode_tokens_per_s": speed, "accesses": accesses, "hits": accesses - misses,
        "late_hits": 0, "misses": misses, "cpu_computed": misses if policy == "n-cpu-moe" else 0, "substitutions": 0,
        "hit_rate": 1 - misses / accesses, "stall_by_layer_s": stall,
        "stall_bound_by_layer_s": [0.0 if layer % 2 else 0.05 for layer in range(LAYERS)],
        "late_by_layer": [0] * LAYERS if policy != "casmoe[predictor=exact]" else list(range(LAYERS)),
        "queue_length": [], "sim_time_s": 10.0,
    }
    if rate is not None:
        r.update(arrival="poisson", rate=rate, workload=f"poisson {rate} req/s, max batch 8",
                 queue_length=[] if policy == "lru" else [[0.0, 0], [1.0, 2], [2.5, 0]],
                 **{f"{m}_{p}_s": (i + 1) * (1 + rate) * (3 if p == "p99" else 1) * (0.1 if m == "tpot" else 1)
                    for m in ("ttft", "tpot") for p in ("p50", "p99")})
    return r


RECORDS = [record(p, s) for s in (2, 4, 6) for p in POLICIES]
AT_SMALLEST = [r for r in RECORDS if r["capacity"] == "2/layer"]
SERVED = [record(p, 2, rate) for rate in (0.1, 0.5, 1.0) for p in POLICIES]


def lines(fig: Any) -> list[Line2D]:
    """Every policy's line in the figure (their gid is the policy label)."""
    return [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_gid()]


def pairs(fig: Any) -> dict[str, set[tuple[str, str]]]:
    out: dict[str, set[tuple[str, str]]] = {}
    for ln in lines(fig):
        out.setdefault(ln.get_gid(), set()).add((to_hex(ln.get_color()), ln.get_marker()))
    return out


def check_common(fig: Any, labels: set[str], context: tuple[str, ...] = ("mixtral-8x7b", "rtx4090x4 (4 GPUs)",
                                                                          "tiny-mixtral.npz")) -> None:
    title = fig.get_suptitle()
    for part in context:
        assert part in title, (part, title)
    styles = pairs(fig)
    assert set(styles) == labels
    assert all(len(p) == 1 for p in styles.values()), styles  # one style per policy in every panel
    assert len({next(iter(p)) for p in styles.values()}) == len(labels)  # and distinct
    for ln in lines(fig):
        assert (ln.get_linestyle() == "--") == ln.get_gid().endswith("*"), ln.get_gid()
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert any("(" in ax.get_ylabel() and ")" in ax.get_ylabel() for ax in shown)  # a unit
    fig.draw_without_rendering()
    assert fig.legends, "no legend"
    title_box = fig._suptitle.get_window_extent()
    for leg in fig.legends:
        box = leg.get_window_extent()
        for ax in shown:
            assert not box.overlaps(ax.get_window_extent()), "the legend covers an axes"
        assert not box.overlaps(title_box), "the legend covers the title"


def drawn(ax: Any, x: float, y: float) -> bool:
    """(x, y) lands inside the axes, at a finite place (a log axis sends 0 to -inf)."""
    px, py = ax.transData.transform((x, y))
    box = ax.get_window_extent()
    return math.isfinite(px) and math.isfinite(py) and box.x0 - 1 <= px <= box.x1 + 1 and box.y0 - 1 <= py <= box.y1 + 1


def zero_drawn(fig: Any, gid: str) -> bool:
    """A point of `gid`'s line at 0 lands inside its axes in some panel."""
    fig.draw_without_rendering()
    for ax in fig.axes:
        for ln in ax.get_lines():
            if ln.get_gid() == gid:
                for x, y in zip(ln.get_xdata(), ln.get_ydata()):
                    if y == 0 and drawn(ax, x, y):
                        return True
    return False


def labels_of(records: list[dict[str, Any]]) -> set[str]:
    return {plots.policy_label(r) for r in records}


@pytest.fixture(autouse=True)
def _close():
    yield
    plots._pyplot().close("all")


def test_decode_vs_capacity_panels_title_styles_legend_and_zeros():
    fig = plots.figure_decode_vs_capacity(RECORDS)
    check_common(fig, labels_of(RECORDS))
    titles = [ax.get_title() for ax in fig.axes]
    assert any("loaded over the link" in t for t in titles) and any("computed on the host" in t for t in titles)
    host = next(ax for ax in fig.axes if "computed on the host" in ax.get_title())
    assert {ln.get_gid() for ln in host.get_lines() if ln.get_gid()} == {"n-cpu-moe"}  # host compute apart
    loaded = next(ax for ax in fig.axes if "loaded over the link" in ax.get_title())
    assert loaded.get_yscale() != "log" and zero_drawn(fig, "n-cpu-moe")  # 0 loaded misses, drawn
    change = next(ax for ax in fig.axes if "change over LRU" in ax.get_title())
    assert change.get_yscale() == "symlog"  # belady at +800% leaves the middle readable
    lo, hi = change.get_ylim()
    assert hi > 700 and lo < -80
    # the middle (-50%..+50%) keeps at least a third of the panel's height
    y = [change.transData.transform((0, v))[1] for v in (-50, 50, lo, hi)]
    assert (y[1] - y[0]) / (y[3] - y[2]) > 1 / 3
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(t.startswith("lru") and "least-stale" in t for t in legend)  # equal lines say so


def test_decode_vs_capacity_without_lru_or_host_compute_has_two_panels():
    rs = [r for r in RECORDS if r["policy"] in ("ondemand", "belady")]
    fig = plots.figure_decode_vs_capacity(rs)
    check_common(fig, labels_of(rs))
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 2


def test_decode_vs_capacity_facets_a_sweep_axis_into_rows():
    rs = RECORDS + [{**r, "hardware": "h100-sxm", "devices": 1, "decode_tokens_per_s": 2 * r["decode_tokens_per_s"]}
                    for r in RECORDS]
    fig = plots.figure_decode_vs_capacity(rs)
    check_common(fig, labels_of(rs), ("mixtral-8x7b", "tiny-mixtral.npz", "each row's box"))
    titles = " ".join(ax.get_title() for ax in fig.axes)
    assert "rtx4090x4 (4 GPUs)" in titles and "h100-sxm (1 GPU)" in titles


def test_stall_by_layer_draws_zero_stalls():
    fig = plots.figure_stall_by_layer(AT_SMALLEST)
    check_common(fig, labels_of(AT_SMALLEST))
    assert "2/layer" in fig.get_suptitle()
    assert fig.axes[0].get_yscale() == "linear"  # less than a decade: linear from 0
    assert zero_drawn(fig, "n-cpu-moe")
    spread = [{**r, "stall_by_layer_s": [v / 1000 for v in r["stall_by_layer_s"]]} if r["policy"] == "n-cpu-moe" else r
              for r in AT_SMALLEST]  # decades apart: log, and symlog for the zeros
    fig = plots.figure_stall_by_layer(spread)
    assert fig.axes[0].get_yscale() == "symlog" and zero_drawn(fig, "n-cpu-moe")


def test_timeliness_has_a_legend_and_separate_panels():
    fig = plots.figure_timeliness(AT_SMALLEST)
    check_common(fig, labels_of(AT_SMALLEST))
    assert len(fig.axes) == 3
    assert zero_drawn(fig, "lru")  # its bound is 0 at odd layers, its late hits 0 everywhere


def test_queue_draws_an_empty_queue_at_zero():
    fig = plots.figure_queue([r for r in SERVED if r["rate"] == 0.5])
    check_common(fig, labels_of(SERVED))
    assert zero_drawn(fig, "lru")


def test_latency_vs_load_one_column_per_percentile():
    fig = plots.figure_latency_vs_load(SERVED)
    check_common(fig, labels_of(SERVED))
    assert [ax.get_title() for ax in fig.axes] == ["time to first token, p50", "time to first token, p99",
                                                    "time per output token, p50", "time per output token, p99"]
    assert all("(s)" in ax.get_ylabel() for ax in fig.axes)


def test_report_plots_share_one_style_per_policy(tmp_path, monkeypatch):
    served = [{**r, "capacity_gb": 11.3 * 2} for r in SERVED]
    chosen = plots.report_plots(served + [{"policy": "lru", "skipped": "does not fit"}])
    assert [p.name for p in chosen] == ["decode_vs_capacity.png", "stall_by_layer.png", "timeliness.png", "queue.png",
                                        "latency_vs_load.png"]
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path, dpi=110: figures.append(fig) or path)
    written = plots.draw_report(tmp_path, served)
    assert [w.name for w in written] == [p.name for p in chosen] and len(figures) == len(chosen)
    seen: dict[str, set[tuple[str, str]]] = {}
    for fig in figures:
        for label, pair in pairs(fig).items():
            seen.setdefault(label, set()).update(pair)
    assert set(seen) == labels_of(served)
    assert all(len(p) == 1 for p in seen.values()), seen  # one style per policy across the run's plots


def test_policy_styles_are_distinct_fixed_for_built_ins_and_dashed_for_oracles():
    labels = [f"casmoe[x={i}]" for i in range(30)] + ["lru", "belady*", "my.module:Mine"]
    styles = PolicyStyles(labels)
    got = [styles(label) for label in labels]
    assert len({(s.colour, s.marker) for s in got}) == len(labels)
    assert len({s.colour for s in got[:15]}) == 15 and len({s.marker for s in got[:15]}) == 15
    assert styles("lru") == PolicyStyles(["belady*", "lru"])("lru")  # the same in any run
    assert styles("belady*").dashed and not styles("lru").dashed


def test_the_loaded_panel_counts_late_prefetches_as_waits():
    """A policy whose every load is a prefetch still in flight when needed (layer-offload) waits on
    the link as a miss does: drawn at its share, not at 0%."""
    streamed = [{**r, "policy": "layer-offload", "misses": 0, "hits": 1000, "late_hits": 900, "hit_rate": 1.0}
                for r in RECORDS if r["policy"] == "ondemand"]
    fig = plots.figure_decode_vs_capacity(RECORDS + streamed)
    loaded = next(ax for ax in fig.axes if "loaded over the link" in ax.get_title())
    (line,) = [ln for ln in loaded.get_lines() if ln.get_gid() == "layer-offload"]
    assert list(line.get_ydata()) == pytest.approx([90.0] * 3)


def test_a_served_runs_title_names_its_arrivals():
    """simulate's records carry the served workload as `traffic`: the title says it (and not the
    max batch twice, as 'batch 8')."""
    served = [{k: v for k, v in r.items() if k != "workload"} | {"traffic": "poisson 0.5/s, max batch 8, prefill-first",
                                                                   "batch": 8} for r in SERVED]
    title = plots.figure_queue([r for r in served if r["rate"] == 0.5]).get_suptitle()
    assert "poisson 0.5/s, max batch 8" in title and "batch 8," not in title.replace("max batch 8", "")


def test_markers_are_unlike_each_other():
    """A thin and a thick diamond (or hexagon) read as one marker in a small legend."""
    markers = set(plots.MARKERS)
    assert len(markers) == len(plots.MARKERS)
    assert not {"d", "D"} <= markers and not {"h", "H"} <= markers and not {"o", "8"} <= markers


def test_titles_name_the_stack_the_figures_assumed():
    fig = plots.figure_decode_vs_capacity([{**r, "stack": "llama.cpp"} for r in RECORDS])
    assert "llama.cpp stack" in fig.get_suptitle()
    fig = plots.figure_stall_by_layer([{**r, "stack": "ideal"} for r in AT_SMALLEST])
    assert "ideal stack (an upper bound)" in fig.get_suptitle()
    both = [{**r, "stack": "ideal"} for r in RECORDS] + [{**r, "stack": "llama.cpp"} for r in RECORDS]
    fig = plots.figure_decode_vs_capacity(both)
    assert "each row's stack" in fig.get_suptitle()
    assert any(ax.get_title().startswith("llama.cpp stack\n") for ax in fig.axes)  # the row's setting on its own line


def test_search_panels_per_config_policies_styled_target_in_legend():
    recs = [{**record(p, s), "quant": q} for p in ("lru", "ondemand") for s in (2, 4) for q in ("bf16", "int8")]
    points = [SearchPoint(r, r["capacity_gb"], r["decode_tokens_per_s"] >= 5, r["capacity"] == "4/layer" and
                          r["policy"] == "lru") for r in recs]
    fig = plots.figure_search(points, "decode_tokens_per_s", "decode_tokens_per_s >= 5", 5.0)
    title = fig.get_suptitle()
    assert "mixtral-8x7b" in title and "rtx4090x4 (4 GPUs)" in title and "tiny-mixtral.npz" in title
    assert sorted(ax.get_title() for ax in fig.axes if ax.get_visible()) == ["bf16 experts", "int8 experts"]
    marks = {}
    for ax in fig.axes:
        for coll in ax.collections:
            if coll.get_gid():
                marks.setdefault(coll.get_gid(), set()).add(to_hex(coll.get_edgecolor()[0]))
    assert set(marks) == {"lru", "ondemand"} and all(len(c) == 1 for c in marks.values())
    assert len({next(iter(c)) for c in marks.values()}) == 2
    assert fig.axes[0].get_ylabel() == "decode tokens/s"
    fig.draw_without_rendering()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "target: decode_tokens_per_s >= 5" in legend and any("Pareto" in t for t in legend)
    box = fig.legends[0].get_window_extent()
    assert not any(box.overlaps(ax.get_window_extent()) for ax in fig.axes if ax.get_visible())


@pytest.fixture(scope="module")
def lrc_results():
    from casmoe.geometry import Geometry
    from casmoe.metrics.lrc import measure
    from casmoe.trace import Request, Trace

    out = []
    for seed, name in ((0, "a"), (1, "b")):
        rng = np.random.default_rng(seed)
        reqs = [Request(topk=np.stack([np.stack([rng.choice(8, 2, replace=False) for _ in range(3)])
                                       for _ in range(16)]).astype(np.int16),
                        weights=np.full((16, 3, 2), 0.5, np.float32), prefill=4) for _ in range(2)]
        out.append(measure(Trace(Geometry(3, 8, 2), reqs), [2, 4], name=name, replicates=10,
                           rng=np.random.default_rng(0), baselines=["lru", "belady"]))
    return out


def test_lrc_plots_name_their_traces_and_style_baselines_as_policies(lrc_results):
    for fig in (plots.figure_lrc_sch(lrc_results), plots.figure_lrc_srp(lrc_results),
                plots.figure_lrc_layers(lrc_results)):
        title = fig.get_suptitle()
        assert "a: 3 MoE layers, 8 experts, top-2" in title and "b: 3 MoE layers" in title
        assert "no hardware" in title
        fig.draw_without_rendering()
        for leg in fig.legends:
            assert not any(leg.get_window_extent().overlaps(ax.get_window_extent()) for ax in fig.axes)
    sch = plots.figure_lrc_sch(lrc_results)
    styles = pairs(sch)
    assert set(styles) == {"SCH", "lru", "belady*"} and all(len(p) == 1 for p in styles.values())
    assert len({next(iter(p)) for p in styles.values()}) == 3
    assert styles["lru"] == {(to_hex(PolicyStyles(["lru"])("lru").colour), PolicyStyles(["lru"])("lru").marker)}
    assert all(ax.get_ylabel() == "hit rate (0-1)" for ax in sch.axes[::2])


def test_epsilon_curve_names_the_trace_and_marks_the_chosen_epsilon():
    points = [{"epsilon": e / 4, "recall_at_k": 0.6, "coverage_at_2k": 0.7, "eam_share": 1 - e / 4} for e in range(5)]
    fig = plots.figure_epsilon_curve(points, baseline=0.4, trace="tiny-mixtral.npz", model="tiny-mixtral",
                                     scope="held-out requests of the fit trace", k=2, epsilon=0.75)
    title = fig.get_suptitle()
    assert "tiny-mixtral.npz" in title and "model tiny-mixtral" in title and "k = 2" in title
    assert fig.axes[0].get_ylabel() == "fraction (0-1)"
    share = next(ln for ln in fig.axes[0].get_lines() if ln.get_gid() == "eam_share")
    fig.draw_without_rendering()
    assert drawn(fig.axes[0], 1.0, 0.0) and share.get_ydata()[-1] == 0
    assert not fig.legends[0].get_window_extent().overlaps(fig.axes[0].get_window_extent())
    assert any("--epsilon 0.75" in t.get_text() for t in fig.legends[0].get_texts())


def test_plot_functions_write_whole_pngs(tmp_path, lrc_results):
    written = [
        plots.plot_decode_vs_capacity(tmp_path / "d.png", RECORDS),
        plots.plot_lrc_sch(tmp_path / "sch.png", lrc_results),
        plots.plot_epsilon_curve([{"epsilon": 0.5, "recall_at_k": 0.5, "coverage_at_2k": 0.6, "eam_share": 0.2}],
                                 tmp_path / "e.png"),
    ]
    assert all(isinstance(p, Path) and p.read_bytes()[:4] == b"\x89PNG" for p in written)
    assert not plots._pyplot().get_fignums()  # closed after saving

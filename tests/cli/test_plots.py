"""`casmoe.cli.figures`: each figure, built from a few synthetic records, read back through matplotlib's
objects before it is saved, as a reader would check it: a title of at most two lines naming what
it shows, with the model, the box and the trace in the second; y axes with a unit and one scale
each (no linear-then-log axis); at most eight series in a panel, in distinct colours; one (colour,
marker) pair per policy, the same in every plot of a run, oracles dashed; families of policies on
panels of their own, each column's legend under it, not over the data; zeros drawn; the one-time
setup before the first request apart from the run's stalls."""

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
from casmoe.policies import POLICIES  # noqa: E402
from support.paths import REPO
from support.scripts import load_script

LAYERS = 6
POLICIES_RUN = ["ondemand", "lru", "least-stale", "n-cpu-moe", "casmoe[predictor=exact]", "belady"]
ORACLES = {"casmoe[predictor=exact]", "belady"}
FAMILY_COLUMNS = ["reactive caches", "host-compute placements", "oracles"]


def record(policy: str, slots: int, rate: float | None = None, oracle: bool | None = None) -> dict[str, Any]:
    """A simulate record with the fields the plots read; least-stale equals lru, n-cpu-moe
    computes its misses on the host and never stalls on layers 0-2, belady is 9x LRU."""
    i = POLICIES_RUN.index(policy) if policy in POLICIES_RUN else len(POLICIES_RUN) + len(policy) % 7
    speed = {"ondemand": 1.0, "lru": 2.0 * slots, "least-stale": 2.0 * slots, "n-cpu-moe": 9.0 + slots,
             "casmoe[predictor=exact]": 2.5 * slots, "belady": 18.0 * slots}.get(policy, 1.5 * slots + i / 10)
    accesses, misses = 1000, (1000 if policy == "ondemand" else 600 // slots)
    stall = [0.0 if policy == "n-cpu-moe" and layer < 3 else 0.1 * (i + 1) + 0.01 * layer for layer in range(LAYERS)]
    if policy == "least-stale":
        stall = [0.1 * 2 + 0.01 * layer for layer in range(LAYERS)]  # = lru's
    r = {
        "trace": "tiny-mixtral.npz", "model": "mixtral-8x7b", "hardware": "rtx4090x4", "devices": 4,
        "policy": policy, "oracle": policy in ORACLES if oracle is None else oracle, "capacity": f"{slots}/layer",
        "capacity_gb": 11.3 * slots, "batch": 1, "miss_mode": "load", "quant": "trace",
        "scored": "2 of 800 requests (the first 2 of the trace)", "workload": "back-to-back",
        "decode_tokens_per_s": speed, "accesses": accesses, "hits": accesses - misses,
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


RECORDS = [record(p, s) for s in (2, 4, 6) for p in POLICIES_RUN]
AT_SMALLEST = [r for r in RECORDS if r["capacity"] == "2/layer"]
SERVED = [record(p, 2, rate) for rate in (0.1, 0.5, 1.0) for p in POLICIES_RUN]
EVERY = [record(label, s, oracle=label.startswith("casmoe[predictor") or label in ("belady", "sch"))
         for s in (2, 4) for label in [*POLICIES, "n-cpu-moe[gpu_prefill=32]", "casmoe[planner=auto]",
                                       "casmoe[predictor=noisy]", "casmoe[predictor=exact]"] if label != "casmoe"]
"""The default run's 20 policies: more than a panel can hold."""


def lines(fig: Any) -> list[Line2D]:
    """Every policy's line in the figure (their gid is the policy label; reference lines' start 'reference:')."""
    return [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_gid() and not ln.get_gid().startswith("reference:")]


def legends(fig: Any) -> list[Any]:
    """The figure's legends and those of its subfigures (a column each)."""
    return [*fig.legends, *(leg for sub in fig.subfigs for leg in sub.legends)]


def entries(fig: Any) -> list[str]:
    return [t.get_text() for leg in legends(fig) for t in leg.get_texts() if t.get_text().strip()]


def pairs(fig: Any) -> dict[str, set[tuple[str, str]]]:
    out: dict[str, set[tuple[str, str]]] = {}
    for ln in lines(fig):
        out.setdefault(ln.get_gid(), set()).add((to_hex(ln.get_color()), ln.get_marker()))
    return out


def check_common(fig: Any, labels: set[str], context: tuple[str, ...] = ("mixtral-8x7b", "rtx4090x4 (4 GPUs)",
                                                                          "tiny-mixtral.npz")) -> None:
    title = fig.get_suptitle()
    assert len(title.splitlines()) <= 2, title  # what, then the setting
    for part in context:
        assert part in title.splitlines()[-1], (part, title)
    styles = pairs(fig)
    assert set(styles) == labels
    assert all(len(p) == 1 for p in styles.values()), styles  # one style per policy in every panel
    assert len({next(iter(p)) for p in styles.values()}) == len(labels)  # and distinct
    for ln in lines(fig):
        assert (ln.get_linestyle() == "--") == ln.get_gid().endswith("*"), ln.get_gid()
    shown = [ax for ax in fig.axes if ax.get_visible()]
    for ax in shown:
        mine = [ln for ln in ax.get_lines() if ln.get_gid() and not ln.get_gid().startswith("reference:")]
        assert len({ln.get_gid() for ln in mine}) <= plots.SERIES_PER_PANEL, ax.get_title()
        assert len({to_hex(ln.get_color()) for ln in mine}) == len({ln.get_gid() for ln in mine}), ax.get_title()
        assert ax.get_yscale() in ("linear", "log"), ax.get_yscale()  # one scale: no symlog
    assert any("(" in ax.get_ylabel() and ")" in ax.get_ylabel() for ax in shown)  # a unit
    fig.draw_without_rendering()
    assert legends(fig), "no legend"
    title_box = fig._suptitle.get_window_extent()
    for leg in legends(fig):
        box = leg.get_window_extent()
        for ax in shown:
            assert not box.overlaps(ax.get_window_extent()), "a legend covers an axes"
        assert not box.overlaps(title_box), "a legend covers the title"


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


def column_titles(fig: Any) -> list[str]:
    """The family each column of a family-column figure holds (its top panel's first title line)."""
    return [sub.axes[0].get_title().splitlines()[0] for sub in fig.subfigs if sub.axes and sub.axes[0].get_lines()]


@pytest.fixture(autouse=True)
def _close():
    yield
    plots._pyplot().close("all")


def test_decode_vs_capacity_puts_each_family_in_its_column_on_one_scale():
    fig = plots.figure_decode_vs_capacity(RECORDS)
    check_common(fig, labels_of(RECORDS))
    assert column_titles(fig) == FAMILY_COLUMNS
    speed = [sub.axes[0] for sub in fig.subfigs]
    assert {ax.get_yscale() for ax in speed} == {"log"}  # 1 to 108 tok/s: ratios read as distances
    assert len({ax.get_ylim() for ax in speed}) == 1  # one scale for every family
    waits = [sub.axes[1] for sub in fig.subfigs]
    assert {ax.get_yscale() for ax in waits} == {"linear"} and {ax.get_ylim() for ax in waits} == {(-3, 103)}
    assert zero_drawn(fig, "n-cpu-moe")  # 0 loaded misses, drawn
    host = fig.subfigs[1].axes[0]
    (ref,) = [ln for ln in host.get_lines() if ln.get_gid().startswith("reference:")]
    assert "best plain cache (lru)" in ref.get_gid() and list(ref.get_ydata()) == [4.0, 8.0, 12.0]
    assert not any(ln.get_gid().startswith("reference:") for ln in fig.subfigs[0].axes[0].get_lines())
    legend = [t.get_text() for t in fig.subfigs[0].legends[0].get_texts()]
    assert any(t.startswith("lru") and "least-stale" in t for t in legend)  # equal lines say so
    assert "best plain cache (lru)" in [t.get_text() for t in fig.subfigs[1].legends[0].get_texts()]


def test_the_default_runs_twenty_policies_fit_their_panels():
    fig = plots.figure_decode_vs_capacity(EVERY)
    check_common(fig, labels_of(EVERY))
    assert column_titles(fig) == ["reactive caches", "prefetchers", "host-compute placements", "oracles"]
    for sub in fig.subfigs:  # each column's legend names its own family's policies, and only those
        names = {t.get_text().split("  (=")[0] for t in sub.legends[0].get_texts() if t.get_text().strip()}
        drawn_here = {ln.get_gid() for ax in sub.axes for ln in ax.get_lines()}
        assert names == {g.split(":", 1)[1] if g.startswith("reference:") else g for g in drawn_here}


def test_decode_vs_capacity_of_two_families_has_two_columns():
    rs = [r for r in RECORDS if r["policy"] in ("ondemand", "belady")]
    fig = plots.figure_decode_vs_capacity(rs)
    check_common(fig, labels_of(rs))
    assert column_titles(fig) == ["reactive caches", "oracles"] and len(fig.axes) == 4


def test_decode_vs_capacity_facets_a_sweep_axis_into_rows():
    rs = RECORDS + [{**r, "hardware": "h100-sxm", "devices": 1, "decode_tokens_per_s": 2 * r["decode_tokens_per_s"]}
                    for r in RECORDS]
    fig = plots.figure_decode_vs_capacity(rs)
    check_common(fig, labels_of(rs), ("mixtral-8x7b", "tiny-mixtral.npz", "each row's box"))
    titles = " ".join(ax.get_title() for ax in fig.axes)
    assert "rtx4090x4 (4 GPUs)" in titles and "h100-sxm (1 GPU)" in titles
    assert all(len(sub.axes) == 4 for sub in fig.subfigs)  # speed and waits per box


def test_stall_by_layer_draws_zero_stalls_on_one_linear_scale():
    fig = plots.figure_stall_by_layer(AT_SMALLEST)
    check_common(fig, labels_of(AT_SMALLEST))
    assert "2/layer" in fig.get_suptitle()
    assert {ax.get_yscale() for ax in fig.axes} == {"linear"} and len({ax.get_ylim() for ax in fig.axes}) == 1
    assert zero_drawn(fig, "n-cpu-moe")
    assert column_titles(fig) == FAMILY_COLUMNS


def test_the_one_time_setup_is_drawn_apart_from_the_stalls():
    setup = [{**r, "setup_s": 2.5, "setup_bytes": 45e9} if r["policy"] == "n-cpu-moe" else {**r, "setup_s": 0.0}
             for r in AT_SMALLEST]
    for figure in (plots.figure_stall_by_layer, plots.figure_timeliness):
        fig = figure(setup)
        (panel,) = [ax for ax in fig.axes if "setup" in ax.get_title()]
        assert [t.get_text() for t in panel.get_yticklabels()] == ["n-cpu-moe"]  # only the run that has one
        (bar,) = panel.patches
        assert bar.get_width() == 2.5 and any("45.0 GB" in t.get_text() for t in panel.texts)
        assert to_hex(bar.get_facecolor()) == pairs(fig)["n-cpu-moe"].pop()[0]
        placed = [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_gid() == "n-cpu-moe"]
        assert placed and all(max(ln.get_ydata()) < 2.5 for ln in placed)  # not among its stalls
    assert not any("setup" in ax.get_title() for ax in plots.figure_stall_by_layer(AT_SMALLEST).axes)


def test_timeliness_has_three_rows_per_family_column():
    fig = plots.figure_timeliness(AT_SMALLEST)
    check_common(fig, labels_of(AT_SMALLEST))
    assert len(fig.axes) == 3 * len(FAMILY_COLUMNS) and column_titles(fig) == FAMILY_COLUMNS
    assert zero_drawn(fig, "lru")  # its bound is 0 at odd layers, its late hits 0 everywhere
    assert [fig.subfigs[0].axes[i].get_ylabel() for i in range(3)] == [
        "stall (s, run total)", "bandwidth bound (s, run total)", "late hits (count)"]


def test_queue_draws_an_empty_queue_at_zero():
    fig = plots.figure_queue([r for r in SERVED if r["rate"] == 0.5])
    check_common(fig, labels_of(SERVED))
    assert zero_drawn(fig, "lru")


def test_latency_vs_load_one_column_per_percentile():
    fig = plots.figure_latency_vs_load(SERVED)
    assert [ax.get_title() for ax in fig.axes] == ["time to first token, p50", "time to first token, p99",
                                                    "time per output token, p50", "time per output token, p99"]
    assert all("(s)" in ax.get_ylabel() for ax in fig.axes)
    assert len(fig.get_suptitle().splitlines()) <= 2


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


def test_policy_styles_differ_within_a_family_and_across_the_run():
    labels = [f"casmoe[x={i}]" for i in range(30)] + ["lru", "belady*", "my.module:Mine"]
    styles = PolicyStyles(labels)
    got = [styles(label) for label in labels]
    assert len({(s.colour, s.marker) for s in got}) == len(labels)
    every = PolicyStyles.of(EVERY)
    for family in {every.family(plots.policy_label(r)) for r in EVERY}:
        mine = [plots.policy_label(r) for r in EVERY if every.family(plots.policy_label(r)) is family]
        assert len({every(x).colour for x in set(mine)}) == len(set(mine))  # a panel's colours differ
    assert set(plots.PALETTE) >= {every(plots.policy_label(r)).colour for r in EVERY}  # colour-blind-safe
    assert styles("lru") == PolicyStyles(["belady*", "lru"])("lru")  # the same in any run of these
    assert styles("belady*").dashed and not styles("lru").dashed


def test_the_loaded_panel_counts_late_prefetches_as_waits():
    """A policy whose every load is a prefetch still in flight when needed (layer-offload) waits on
    the link as a miss does: drawn at its share, not at 0%."""
    streamed = [{**r, "policy": "layer-offload", "misses": 0, "hits": 1000, "late_hits": 900, "hit_rate": 1.0}
                for r in RECORDS if r["policy"] == "ondemand"]
    fig = plots.figure_decode_vs_capacity(RECORDS + streamed)
    (line,) = [ln for ax in fig.axes for ln in ax.get_lines()
               if ln.get_gid() == "layer-offload" and ax.get_ylim() == (-3, 103)]
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
    assert "each row's stack" in fig.get_suptitle() and len(fig.get_suptitle().splitlines()) == 2
    assert any("llama.cpp stack" in ax.get_title() for ax in fig.axes)  # the row's setting in its panels' titles


def test_a_long_setting_still_fits_two_lines():
    long = [{**r, "hardware": "rtx4090-64g@gpus=2,link=pcie5", "quant": "q4_k_m", "batch": 4,
             "miss_mode": "substitute", "stack": "mixtral-offloading"} for r in RECORDS]
    for figure in (plots.figure_decode_vs_capacity, plots.figure_stall_by_layer, plots.figure_timeliness):
        title = figure(long).get_suptitle()
        assert len(title.splitlines()) == 2 and "misses substituted" in title and "mixtral-offloading stack" in title


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
        title = " ".join(fig.get_suptitle().split())  # a narrow figure's setting may wrap
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


# ---- casmoe plan's pictures ----------------------------------------------------------------------


def candidate(engine: str, label: str, decode: float, band: list[float] | None, fits: bool = True,
              on_gpu: tuple[int, ...] = (8, 8)) -> dict[str, Any]:
    """A plan.json configuration on two GPUs and two host nodes, 4 MoE layers of 8 experts:
    `on_gpu` experts of each layer on GPU 0 (layers 0-1) and GPU 1 (layers 2-3)."""
    gpus = [{"gpu": i, "total_gib": 24.0, "reserve_gib": 2.0, "dense_gib": 1.5, "embeddings_gib": 0.5, "kv_gib": 1.0,
             "experts_gib": 18.0 if fits else 30.0, "expert_count": on_gpu[i] * 2, "used_gib": 23.0 if fits else 35.0,
             "free_gib": 1.0 if fits else -11.0, "moe_layers": [2 * i, 2 * i + 1]} for i in range(2)]
    host = [{"node": n, "total_gib": 64.0, "reserve_gib": 2.0, "embeddings_gib": 0.5, "experts_gib": 10.0,
             "expert_count": 8, "used_gib": 12.5, "free_gib": 51.5} for n in range(2)]
    return {"engine": engine, "label": label, "fits": fits, "unit": "layer", "gpu_layers": [[0, 1], [2, 3]],
            "experts_per_layer": 8, "gpu_experts_by_layer": [[on_gpu[0], on_gpu[0], 0, 0], [0, 0, on_gpu[1], on_gpu[1]]],
            "memory": {"fits": fits, "problems": [] if fits else ["GPU 0 over by 11 GiB"], "gpus": gpus, "host": host},
            "speed": {"decode_tok_s": decode, "decode_band_tok_s": band,
                      "uncertainty": "x/÷ 2.00" if band else "not validated: the ideal stack is an upper bound"}}


PLAN = {"model": "qwen3-30b-a3b", "hardware": "rtx4090x4@gpus=2", "context": 8192, "concurrency": 1,
        "box": {"gpus_gib": [24.0, 24.0], "host_ram_gib": 128.0, "numa_nodes": 2, "threads": 56},
        "precisions": "experts bf16; dense bf16",
        "engines": [{"engine": "llama.cpp", "best": candidate("llama.cpp", "--n-cpu-moe 2", 20.0, [10.0, 40.0]),
                     "runners_up": [candidate("llama.cpp", "--n-cpu-moe 3", 15.0, [7.5, 30.0])]},
                    {"engine": "casmoe", "best": candidate("casmoe", "routed experts", 30.0, None, on_gpu=(4, 6)),
                     "runners_up": [candidate("casmoe", "everything on the GPUs", 50.0, None, fits=False)]},
                    {"engine": "vllm", "best": None, "runners_up": []}]}


def test_plan_memory_map_draws_each_engines_bars_and_where_each_layer_lives():
    fig = plots.figure_plan_memory(PLAN)
    assert len(fig.get_suptitle().splitlines()) == 2 and "qwen3-30b-a3b on rtx4090x4@gpus=2" in fig.get_suptitle()
    bars = [ax for ax in fig.axes if ax.patches]
    assert [ax.get_title(loc="left").split(":")[0] for ax in bars] == ["llama.cpp", "casmoe"]  # vllm has no configuration
    for ax in bars:
        assert [t.get_text() for t in ax.get_yticklabels()] == ["GPU 0", "GPU 1", "host 0", "host 1"]
        assert ax.get_xscale() == "linear"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["runtime reserve", "dense weights", "embeddings", "KV cache", "expert slots", "free",
                      "the device's memory"]
    strips = [ax for ax in fig.axes if ax.images]
    shares = np.asarray(strips[1].images[0].get_array())  # casmoe: 4 of 8 experts of layers 0-1 on GPU 0
    assert shares[:, 0].tolist() == [0.5, 0.0, 0.5] and shares[:, 3].tolist() == [0.0, 0.75, 0.25]
    assert np.allclose(shares.sum(axis=0), 1.0)


def test_plan_memory_map_marks_what_does_not_fit():
    over = {**PLAN, "engines": [{"engine": "casmoe", "best": PLAN["engines"][1]["runners_up"][0], "runners_up": []}]}
    fig = plots.figure_plan_memory(over)
    (ax,) = [ax for ax in fig.axes if ax.patches]
    assert "DOES NOT FIT" in ax.get_title(loc="left") and any("over by 11 GiB" in t.get_text() for t in ax.texts)


def test_plan_speed_draws_every_candidate_with_its_interval():
    fig = plots.figure_plan_speed(PLAN)
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and len(fig.get_suptitle().splitlines()) == 2
    marks = {ln.get_gid(): ln for ln in ax.get_lines() if ln.get_gid()}
    assert set(marks) == {"llama.cpp: --n-cpu-moe 2", "llama.cpp: --n-cpu-moe 3", "casmoe: routed experts",
                          "casmoe: everything on the GPUs"}
    assert to_hex(marks["casmoe: everything on the GPUs"].get_color()) == to_hex("0.6")  # does not fit: grey
    assert marks["casmoe: everything on the GPUs"].get_marker() == "X"
    assert to_hex(marks["llama.cpp: --n-cpu-moe 2"].get_color()) != to_hex(marks["casmoe: routed experts"].get_color())
    bands = [ln for ln in ax.get_lines() if not ln.get_gid() and len(ln.get_xdata()) == 2]
    assert sorted(tuple(ln.get_xdata()) for ln in bands) == [(7.5, 30.0), (10.0, 40.0)]
    assert any("upper bound" in t.get_text() for t in ax.texts)  # no interval: said why
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[-1] == "casmoe: everything on the GPUs [does not fit]"  # fastest on top


def test_draw_plan_reads_plan_json_alone(tmp_path):
    import json

    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    written = plots.draw_plan(tmp_path)
    assert [p.name for p in written] == ["plan_memory.png", "plan_speed.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in written)


def test_the_readmes_pictures_are_drawn_from_committed_results():
    """bench/readme_figures.py draws docs/img/ from result files in the tree: they exist, hold
    what each picture needs, and the README or a docs page shows every picture it writes."""
    import json

    root = REPO
    script = load_script(root / "bench" / "readme_figures.py")
    records = json.loads(script.SIMULATE.read_text())
    assert {r["policy"] for r in records} >= {"lru", "lfu", "routed-placement", "belady"}
    assert [p.name for p in plots.report_plots(records)] == list(script.PICTURES[:3])
    assert plots._plan_engines(json.loads(script.PLAN.read_text()))
    readme = (root / "README.md").read_text()
    pages = "".join(p.read_text() for p in (root / "docs").glob("*.md"))
    for name in script.PICTURES:
        assert (script.OUT / name).exists() and (f"](docs/img/{name})" in readme or f"](img/{name})" in pages), name

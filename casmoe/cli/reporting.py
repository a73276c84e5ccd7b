"""The report folder of simulate and sweep: results.json, results.csv and PNG plots, and the
tables printed from the same records.

The PNGs (a plan's too) are drawn by a detached process (`python -m casmoe.cli.plots KIND OUT`)
unless `--plots wait` asks to wait for them, so matplotlib's seconds are not spent before the
command returns. `CASMOE_PLOTS` sets the default for scripts and CI that never look at them.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Optional

import typer


class Plots(str, Enum):
    BACKGROUND = "background"
    WAIT = "wait"
    NONE = "none"


PLOTS = typer.Option(
    Plots.BACKGROUND, "--plots", envvar="CASMOE_PLOTS",
    help="background: draw the PNGs in a detached process (the command does not wait; each file appears whole when "
    "drawn); wait: draw them before the command ends; none: no plots.",
)


def draw_as(plots: Plots, kind: str, out: Path, names: list[str], now: Callable[[], Any]) -> str:
    """The pictures `names` of `out` as --plots asks: none; drawn by `now()` before returning; or
    drawn by a detached `python -m casmoe.cli.plots KIND OUT`, a file of an earlier run removed
    first so that none passes for this one's. Returns the line to print about them, or ''."""
    import subprocess
    import sys

    if plots is Plots.NONE or not names:
        return ""
    if plots is Plots.WAIT:
        now()
        return ""
    for name in names:
        (out / name).unlink(missing_ok=True)
    with open(out / "plots.log", "wb") as log:
        subprocess.Popen([sys.executable, "-m", "casmoe.cli.plots", kind, str(out)], stdin=subprocess.DEVNULL,
                         stdout=log, stderr=log, start_new_session=True)
    return (f"plots are being drawn in the background: {', '.join(names)} appear in {out} when done "
            f"(errors in {out / 'plots.log'}; --plots wait draws them before the command ends)")


def write_report(out: Path, records: list[dict[str, Any]], plots: Plots) -> tuple[list[Path], str]:
    """results.json (every record) and results.csv (the runs), then the plots as `plots` asks;
    returns the files written and a line on the plots."""
    from casmoe.cli.figures import draw_report, report_plots
    from casmoe.report import write_csv, write_json

    ran = [r for r in records if "skipped" not in r]
    write_json(out / "results.json", records)
    write_csv(out / "results.csv", ran)
    written = [out / "results.json", out / "results.csv"]
    drawn: list[Path] = []
    pending = draw_as(plots, "report", out, [p.name for p in report_plots(records)],
                      lambda: drawn.extend(draw_report(out, records)))
    return written + drawn, pending


def report(out: Path, records: list[dict[str, Any]], as_json: bool, title: str, timeline: Optional[Path],
            serving_title: str, timeliness: bool, plots: Plots) -> None:
    """Write the report folder, then print the records as JSON or as tables (and what was skipped)."""
    from casmoe.summary import YOUR_BOX, print_simulation

    written, pending = write_report(out, records, plots)
    if as_json:
        typer.echo(json.dumps(records, indent=2))
        return
    ran = [r for r in records if "skipped" not in r]
    if ran:
        files = ", ".join(str(p) for p in [*written, *([timeline] if timeline else [])])
        print_simulation(ran, title, f"every measurement (latency percentiles, TTFT, stalls, bytes moved) is in {files}")
    _print_serving(records, serving_title, timeliness)
    for line in skipped_lines(records):
        typer.echo(line)
    if pending:
        typer.echo(pending)
    if ran:
        typer.echo(YOUR_BOX)


def skipped_lines(records: list[dict[str, Any]]) -> list[str]:
    """One line per policy and reason it was skipped for, with the cache sizes it covers
    (`skipped speculative @ 6, 12, 18: ...`), not one line per size."""
    reasons: dict[tuple[str, str], list[str]] = {}
    for r in records:
        if "skipped" in r:
            reasons.setdefault((r["policy"], r["skipped"]), []).append(str(r["capacity_spec"]))
    return [f"skipped {policy} @ {', '.join(dict.fromkeys(sizes))}: {why}" for (policy, why), sizes in reasons.items()]


def _print_serving(records: list[dict[str, Any]], title: str, timeliness: bool) -> None:
    from casmoe.report import print_serving, print_tiers, print_timeliness

    ran = [r for r in records if "skipped" not in r]
    if title:
        print_serving(ran, title)
    if any(r["host_cache_gb"] for r in ran):
        print_tiers(ran, "memory tiers: storage -> RAM tier -> GPU slots")
    if timeliness:
        print_timeliness(ran, "stall vs the perfect-prefetch bound (same loads, issued as early as the link allows)")

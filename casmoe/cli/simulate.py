"""`casmoe simulate`: one what-if on modelled hardware, every option a flag (`casmoe.sim.run.grid`).

The simulator is imported inside the command (simpy and numpy load only when used).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from casmoe.cli.app import app, progress
from casmoe.cli.reporting import PLOTS, Plots, report
from casmoe.cli.flags import run_options
from casmoe.errors import CasmoeError
if TYPE_CHECKING:
    from casmoe.sim.box.hardware import HardwareProfile
    from casmoe.sim.run.grid import Grid


@app.command()
@run_options("routing", "box", "serving")
def simulate(
    grid: Grid,
    out: Path = typer.Option(Path("casmoe-sim"), help="Report folder: results.json, results.csv, PNG plots."),
    timeline: Optional[Path] = typer.Option(None, help="Write a Chrome/Perfetto trace (of the first run) here."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON records instead of a table."),
    plots: Plots = PLOTS,
    timeliness: bool = typer.Option(
        False, "--timeliness", help="Also print stall vs the perfect-prefetch bound, late hits and wasted prefetches."
    ),
) -> None:
    """Simulate policies on modelled hardware: latency, throughput, stalls, bytes moved.

    With --arrival or --users, requests arrive over time and are served with continuous
    batching: TTFT, time per output token and end-to-end latency percentiles, throughput, queue.

    With no arguments: the first requests of the shipped default trace on rtx4090x4 with the
    preset of its model, every policy, at cache sizes the box holds; prints the fastest policy
    per cache size (with the --stack it assumed, default ideal: an upper bound) and a policies x
    sizes table of decode tokens/s with the uncertainty `casmoe validate published` measured for
    each kind of configuration, writes every measurement to --out.
    """
    from casmoe.output import check_dir_target, check_file_target
    from casmoe.sim.api import run_specs

    check_dir_target(out, "--out")
    if timeline is not None:
        check_file_target(timeline, "--timeline", create_parent=True)
        from casmoe.shipped import DEFAULT_TRACE, shipped

        if any(timeline.resolve() == Path(t).resolve() for t in grid.given.get("trace") or [shipped(DEFAULT_TRACE)]):
            raise CasmoeError(f"--timeline {timeline} is the trace being simulated; write the timeline elsewhere")
    runs = grid.specs(strict=True)
    bar = progress(total=len(runs.specs), desc="simulate", unit="run", quiet=as_json or len(runs.specs) < 2)
    res = run_specs(runs, timeline, lambda done, total: bar.update(1))
    bar.close()
    if not as_json:
        for line in res.priced():
            typer.echo(line)
        for note in runs.notes:
            typer.echo(note)
    traffic = runs.specs[0].traffic
    boxes = sorted({f"{g.machine.preset.name} on {g.machine.box()}" + _parts(g.machine.hardware) for g in runs.groups})
    report(out, res.records, as_json, "; ".join(boxes), timeline, f"serving {traffic.describe()}" if traffic else "",
           timeliness, plots)


def _parts(hw: HardwareProfile) -> str:
    """': 4x NVIDIA GeForce RTX 4090 24 GB, ..., 256 GiB host RAM': what the box is, for a
    reader who does not know the profile's name."""
    parts = [p for p in (hw.description, f"{hw.host_ram_gib:g} GiB host RAM" if hw.host_ram_gib else "") if p]
    return f": {', '.join(parts)}" if parts else ""

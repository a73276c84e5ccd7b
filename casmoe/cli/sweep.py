"""`casmoe sweep`: a grid of simulations (a sweep file, flags, or both), kept point by point."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from casmoe.cli.app import JOBS, RAY, RAY_ADDRESS, app, progress, ray_target
from casmoe.cli.reporting import PLOTS, Plots, report
from casmoe.cli.flags import run_options
from casmoe.errors import CasmoeError
if TYPE_CHECKING:
    from casmoe.sim.run.grid import Grid


@app.command()
@run_options("routing", "box", "serving")
def sweep(
    grid: Grid,
    config: Optional[Path] = typer.Argument(
        None, help="Sweep TOML: option names as keys (trace, model, hardware, policy, capacity, rate, ...), a value or "
        "a list each; flags given on the command line replace the file's keys."),
    out: Path = typer.Option(Path("casmoe-sweep"), help="Output folder; finished points are kept and skipped on re-runs."),
    jobs: int = JOBS,
    ray: bool = RAY,
    ray_address: Optional[str] = RAY_ADDRESS,
    as_json: bool = typer.Option(False, "--json", help="Print JSON records instead of a table."),
    plots: Plots = PLOTS,
) -> None:
    """Run a grid of simulations in parallel; results merge into one table (results.csv).

    Every combination of the options given more than once is a point; a cache the box cannot
    hold is skipped (with the reason) unless --allow-overcommit."""
    from casmoe.output import check_dir_target
    from casmoe.sim.run.grid import Grid
    from casmoe.sim.run.runner import run_all

    check_dir_target(out, "--out")
    if config is not None:
        grid = Grid.from_toml(config).with_flags(grid)
    runs = grid.specs(strict=False)
    specs = runs.specs
    bar = progress(total=len(specs), desc="sweep", unit="run", quiet=as_json)

    def advance(done: int, total: int) -> None:
        if done == 0:
            bar.update(len(specs) - total)  # already stored
            if total < len(specs):
                bar.set_postfix_str(f"{len(specs) - total} stored")
        else:
            bar.update(1)

    records, computed = run_all(specs, out, jobs=jobs, ray_address=ray_target(ray, ray_address), progress=advance,
                                refused=runs.refused)
    bar.close()
    if records and all("skipped" in r for r in records):  # nothing to report: a refusal, not an empty table
        first = records[0]
        raise CasmoeError(f"no point of the sweep could be simulated; {first['policy']} @ {first['capacity_spec']}: "
                          f"{first['skipped']}")
    if not as_json:
        for note in runs.notes:
            typer.echo(note)
    report(out, records, as_json, f"sweep: {len(specs)} points, {computed} computed now", None,
           "serving" if any("arrival" in r for r in records) else "", False, plots)

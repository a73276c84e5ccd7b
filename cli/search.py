"""`casmoe search`: the cheapest configurations that meet a decode-speed or latency target.

The simulator is imported inside the command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from casmoe.cli.app import JOBS, RAY, RAY_ADDRESS, app, ray_target
from casmoe.cli.flags import run_options

if TYPE_CHECKING:
    from casmoe.sim.grid import Grid


@app.command()
@run_options("routing", "box", "serving", exclude=("capacity", "global_capacity"))
def search(
    grid: Grid,
    target: str = typer.Option(..., help="What to meet: tok/s>=10 (decode at batch 1), tpot_p50<=0.1, tpot_p99<=0.2, "
                                         "ttft_p99<=2 (with --rate), or any numeric simulate field, e.g. e2e_p99_s<=30."),
    out: Path = typer.Option(Path("casmoe-search"), help="Output folder; simulated points are kept and reused on re-runs."),
    jobs: int = JOBS,
    ray: bool = RAY,
    ray_address: Optional[str] = RAY_ADDRESS,
    as_json: bool = typer.Option(False, "--json", help="Print the answer as JSON instead of tables."),
) -> None:
    """Find the cheapest configurations (cache slots per layer for every combination of the
    options given: policy, precision, RAM tier, GPUs, host link, host RAM, ...) that meet a
    target: a Pareto table of memory against the metric, with each point's simulate record as
    evidence, and search.png. Bisects the cache size per configuration instead of running the
    whole grid, searches faster links and more RAM first (a miss there settles the slower ones;
    a hit bounds them), and says how many points it simulated. Default: lru and semoe on the
    first 12 requests."""
    from casmoe.output import check_dir_target, write_text
    from casmoe.sim.search import Target, configs
    from casmoe.sim.search import search as run_search

    check_dir_target(out, "--out")
    goal = Target.parse(target)
    defaults = {"policy": ("lru", "semoe"), "requests": 12}
    grid = grid.with_values(**{k: v for k, v in defaults.items() if k not in grid.given})
    result = run_search(configs(grid), goal, str(out), jobs=jobs, ray_address=ray_target(ray, ray_address))
    summary = _summary(result)
    write_text(out / "search.json", json.dumps(summary, indent=2))
    _plot(out / "search.png", result)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    _print(summary, result, out)


def _row(config: Any, record: dict[str, Any], metric: str) -> dict[str, Any]:
    from casmoe.sim.search import label, memory_gb

    return {
        "config": label(config), "gpus": config.machine.devices, "policy": config.policy.label,
        "slots_per_layer": record["capacity_slots"], "memory_gb": round(memory_gb(record), 3),
        metric: record[metric], "evidence": f"points/{record['key']}.json",
    }


def _summary(result: Any) -> dict[str, Any]:
    from casmoe.sim.search import label

    metric = result.target.metric
    return {
        "target": result.target.describe(),
        "pareto": [_row(c, r, metric) for c, r in result.pareto()],
        "answers": [_row(c, r, metric) for c, r in result.answers],
        "infeasible": [{"config": label(c), "why": why} for c, why in result.infeasible],
        "simulated_now": result.simulated, "points_looked_at": result.probed, "full_grid_points": result.grid,
    }


def _plot(path: Path, result: Any) -> None:
    from casmoe.plots import SearchPoint, plot_search
    from casmoe.sim.search import memory_gb

    metric = result.target.metric
    pareto = {r["key"] for _, r in result.pareto()}
    points = [SearchPoint(r, memory_gb(r), result.target.met(r), r["key"] in pareto)
              for r in result.records if "skipped" not in r]
    if points:
        plot_search(path, points, metric, result.target.describe(), result.target.value)


def _print(summary: dict[str, Any], result: Any, out: Path) -> None:
    from casmoe.report import print_table

    metric = result.target.metric
    cols = ["config", "slots_per_layer", "memory_gb", metric, "evidence"]
    if summary["pareto"]:
        print_table(summary["pareto"], cols, f"cheapest configurations meeting {summary['target']} (Pareto: GPUs, memory, {metric})")
    else:
        typer.echo(f"no configuration tried meets {summary['target']}")
    others = [r for r in summary["answers"] if r not in summary["pareto"]]
    if others:
        print_table(others, cols, "also meeting it (beaten on GPUs, memory or the metric)")
    for row in summary["infeasible"]:
        typer.echo(f"cannot meet it: {row['config']}: {row['why']}")
    typer.echo(f"simulated {result.simulated} points now ({result.probed} looked at; the full grid over the same "
               f"cache sizes has {result.grid}); records in {out}/points, table in {out}/search.json, plot {out}/search.png")

"""`casmoe search`: the cheapest configurations that meet a decode-speed or latency target.

The simulator is imported inside the command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from casmoe.cli.app import JOBS, RAY, RAY_ADDRESS, app, ray_target
from casmoe.shipped import DEFAULT_TRACE


@app.command()
def search(
    target: str = typer.Option(..., help="What to meet: tok/s>=10 (decode at batch 1), tpot_p50<=0.1, tpot_p99<=0.2, "
                                         "ttft_p99<=2 (with --rate), or any simulate field, e.g. e2e_p99_s<=30."),
    trace: Optional[Path] = typer.Option(None, help=f"Trace (.npz); default: the shipped {DEFAULT_TRACE}."),
    model: Optional[str] = typer.Option(None, help="Model preset; default: the trace's."),
    hardware: Optional[list[str]] = typer.Option(None, help="Hardware profiles or TOML paths to try, repeatable; default rtx4090x4."),
    gpus: Optional[list[int]] = typer.Option(None, min=1, help="GPU counts to try, repeatable; default: each profile's."),
    policy: Optional[list[str]] = typer.Option(None, help="Policies to try, repeatable (NAME or NAME[key=value]); default: lru, semoe."),
    quant: Optional[list[str]] = typer.Option(None, help="Expert precisions to try (bf16, int8, int4), repeatable; default: the trace's bytes."),
    host_cache: Optional[list[str]] = typer.Option(None, help="RAM tier sizes to try (40GB; 'none': every expert in RAM), repeatable."),
    link: Optional[list[str]] = typer.Option(None, help="Host-link generations to try (pcie3, pcie4, pcie5: sim/links.toml), "
                                                        "repeatable; default: each profile's own."),
    host_ram: Optional[list[float]] = typer.Option(None, min=0.0, help="Host RAM sizes to try, GiB, repeatable; default: "
                                                                       "each profile's (experts beyond it get a RAM tier over storage)."),
    rate: Optional[float] = typer.Option(None, min=0.0, help="Serve Poisson arrivals at this rate (requests/s) instead of back to back."),
    max_batch: int = typer.Option(8, min=1, help="Serving: most requests decoded together (with --rate)."),
    requests: int = typer.Option(12, min=0, help="First N requests of the trace (0: all)."),
    out: Path = typer.Option(Path("casmoe-search"), help="Output folder; simulated points are kept and reused on re-runs."),
    jobs: int = JOBS,
    ray: bool = RAY,
    ray_address: Optional[str] = RAY_ADDRESS,
    as_json: bool = typer.Option(False, "--json", help="Print the answer as JSON instead of tables."),
) -> None:
    """Find the cheapest configurations (cache slots per layer, policy, quantisation, RAM tier,
    GPUs, host link, host RAM) that meet a target: a Pareto table of memory against the metric,
    with each point's simulate record as evidence, and search.png. Bisects the cache size per
    configuration instead of running the whole grid, searches faster links and more RAM first
    (a miss there settles the slower ones; a hit bounds them), and says how many points it
    simulated."""
    from casmoe.output import check_dir_target, write_text
    from casmoe.policies import POLICIES, parse_policies
    from casmoe.shipped import shipped
    from casmoe.sim.search import Target, configs
    from casmoe.sim.search import search as run_search
    from casmoe.sim.serving import Workload
    from casmoe.sim.sweep import _load_trace, file_digest, preset_for

    check_dir_target(out, "--out")
    goal = Target.parse(target)
    path = str(trace or shipped(DEFAULT_TRACE))
    if not Path(path).exists():
        raise typer.BadParameter(f"trace {path} not found", param_hint="--trace")
    preset = preset_for(_load_trace(path, file_digest(path), (0,)), model)
    candidates = configs(hardware or ["rtx4090x4"], gpus or [], parse_policies(policy or ["lru", "semoe"], POLICIES),
                         quant or [], [("" if t == "none" else t) for t in host_cache or []], link or [], host_ram or [])
    workload = Workload.from_options(None, rate, None, max_batch=max_batch) if rate is not None else None
    result = run_search(path, preset, candidates, goal, str(out), workload=workload, requests=requests, jobs=jobs,
                        ray_address=ray_target(ray, ray_address))
    summary = _summary(result)
    write_text(out / "search.json", json.dumps(summary, indent=2))
    _plot(out / "search.png", result)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    _print(summary, result, out)


def _row(config: Any, record: dict[str, Any], metric: str) -> dict[str, Any]:
    from casmoe.sim.search import memory_gb

    return {
        "config": config.label(), "gpus": config.devices, "policy": config.policy.label,
        "slots_per_layer": record["capacity_slots"], "memory_gb": round(memory_gb(record), 3),
        metric: record[metric], "evidence": f"points/{record['key']}.json",
    }


def _summary(result: Any) -> dict[str, Any]:
    metric = result.target.metric
    return {
        "target": result.target.describe(),
        "pareto": [_row(c, r, metric) for c, r in result.pareto()],
        "answers": [_row(c, r, metric) for c, r in result.answers],
        "infeasible": [{"config": c.label(), "why": why} for c, why in result.infeasible],
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

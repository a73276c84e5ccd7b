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
    from casmoe.sim.run.grid import Grid


@app.command()
@run_options("routing", "box", "serving", exclude=("capacity", "global_capacity"), helps={
    "policy": "Policy, repeatable: NAME, NAME[key=value,...] (casmoe[predictor=noisy]) or package.module:Class; "
              "default: lru and semoe.",
    "requests": "Only the first N selected requests (0: all); default: 12.",
})
def search(
    grid: Grid,
    target: list[str] = typer.Option(..., help="What to meet: tok/s>=10 (decode at batch 1), tpot_p50<=0.1, tpot_p99<=0.2, "
                                         "ttft_p99<=2 (with --rate), or any numeric simulate field, e.g. e2e_p99_s<=30."),
    out: Path = typer.Option(Path("casmoe-search"), help="Output folder; simulated points are kept and reused on re-runs."),
    jobs: int = JOBS,
    ray: bool = RAY,
    ray_address: Optional[str] = RAY_ADDRESS,
    prices: Optional[Path] = typer.Option(
        None, "--prices", help="A TOML of hardware prices over the shipped casmoe/sim/box/prices.toml (same shape: [gpu.\"NAME\"] "
        "usd, [ram.ddr4|ddr5] usd_per_gib, [link.pcie3|4|5] usd, each with a source)."),
    budget: Optional[float] = typer.Option(None, help="Most a box may cost (USD); dearer "
                                           "configs are not searched (one of unknown price is)."),
    as_json: bool = typer.Option(False, "--json", help="Print the answer as JSON instead of tables."),
) -> None:
    """Find the cheapest configurations (cache slots per layer for every combination of the
    options given: policy, precision, RAM tier, GPUs, host link, host RAM, ...) that meet a
    target: a Pareto table of memory against the metric, each answer in its engine's terms
    (--n-cpu-moe N, -ot layers, KTransformers' GPU experts, all on the GPU, a cache's slots per
    layer), with each point's simulate record as evidence, and search.png. Bisects the cache size per configuration instead of running the
    whole grid, searches faster links and more RAM first (a miss there settles the slower ones;
    a hit bounds them), and says how many points it simulated. Every row prints its box's price
    (casmoe/sim/box/prices.toml, or --prices); answers whose metric is within 1% of each other are a tie,
    won by the cheaper box. Default: lru and semoe on the first 12 requests."""
    from casmoe.output import check_dir_target, write_text
    from casmoe.sim.box.prices import load_prices
    from casmoe.sim.questions.search import SearchError, Target, configs, priced
    from casmoe.sim.questions.search import search as run_search

    check_dir_target(out, "--out")
    if len(target) > 1:
        raise SearchError(f"give one --target (got {len(target)}: {', '.join(target)}); search meets one metric at a "
                          "time: run it once per target, with the same --out to reuse the points")
    goal = Target.parse(target[0])
    table = load_prices(prices)
    defaults = {"policy": ("lru", "semoe"), "requests": 12}
    grid = grid.with_values(**{k: v for k, v in defaults.items() if k not in grid.given})
    candidates = configs(grid)
    result = run_search(candidates, goal, str(out), jobs=jobs, ray_address=ray_target(ray, ray_address),
                        prices=table, budget=budget)
    summary = {"priced": priced(candidates), **_summary(result)}
    out.mkdir(parents=True, exist_ok=True)  # no point ran when every config is settled before a run
    write_text(out / "search.json", json.dumps(summary, indent=2))
    _plot(out / "search.png", result)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    _print(summary, result, out)


def _row(config: Any, record: dict[str, Any], result: Any) -> dict[str, Any]:
    from casmoe.sim.questions.search import in_engine_terms, label, memory_gb

    metric = result.target.metric
    price = result.price(config)
    return {
        "config": label(config), "gpus": config.machine.devices, "policy": config.policy.label,
        "stack": config.machine.stack.label,
        # '22/layer', or '51 global' (one pool of whole experts, on a box that holds fewer than top_k per layer)
        "cache": record["capacity"],
        "slots_per_layer": record["capacity_slots"] if record["capacity"].endswith("/layer") else None,
        "engine_terms": in_engine_terms(config, record),  # '--n-cpu-moe 30', 'all on the GPU', '22 slots per layer'
        "memory_gb": round(memory_gb(record), 3),
        "price_usd": None if price is None or price.usd is None else round(price.usd, 2),
        "price": "unknown" if price is None else price.describe(),
        "price_caveat": bool(price is not None and price.caveats),
        metric: record[metric], "uncertainty": record.get("uncertainty"),
        "uncertainty_factor": record.get("uncertainty_factor"), "uncertainty_outside": record.get("uncertainty_outside"),
        "evidence": f"points/{record['key']}.json",
    }


def _summary(result: Any) -> dict[str, Any]:
    from casmoe.sim.questions.search import TIE, label

    boxes = {c.machine.hardware.name: p for c, p in result.prices.items()}
    return {
        "target": result.target.describe(),
        "tie": f"answers within {TIE:.0%} of each other on the metric are tied; the cheaper box wins",
        "pareto": [_row(c, r, result) for c, r in result.pareto()],
        "answers": [_row(c, r, result) for c, r in result.answers],
        "infeasible": [{"config": label(c), "why": why} for c, why in result.infeasible],
        "boxes": {name: {"usd": p.usd, "parts": p.breakdown(), "price": p.describe(),
                         "sources": {part.what: part.price.where for part in p.parts if part.price is not None}}
                  for name, p in boxes.items()},
        "simulated_now": result.simulated, "points_looked_at": result.probed, "full_grid_points": result.grid,
    }


def _plot(path: Path, result: Any) -> None:
    from casmoe.cli.figures import SearchPoint, plot_search
    from casmoe.sim.questions.search import memory_gb

    metric = result.target.metric
    pareto = {r["key"] for _, r in result.pareto()}
    points = [SearchPoint(r, memory_gb(r), result.target.met(r), r["key"] in pareto)
              for r in result.records if "skipped" not in r]
    if points:
        plot_search(path, points, metric, result.target.describe(), result.target.value)


def _print(summary: dict[str, Any], result: Any, out: Path) -> None:
    from casmoe.report import UNCERTAINTY, print_table, uncertainty_notes

    from casmoe.sim.questions.search import TIE

    metric = result.target.metric
    for line in summary["priced"]:  # the model, its precisions and the requests every row below was priced on
        typer.echo(line)
    cols = ["config", "price_usd", "engine_terms", "memory_gb", metric, UNCERTAINTY, "evidence"]
    shown = [_priced(r) for r in summary["pareto"]]
    if shown:
        print_table(shown, cols, f"cheapest configurations meeting {summary['target']} (Pareto: GPUs, memory, box "
                                 f"price, {metric}; within {TIE:.0%} on {metric} is a tie, won by the cheaper box)")
    else:
        typer.echo(f"no configuration tried meets {summary['target']}")
    others = [_priced(r) for r in summary["answers"] if r not in summary["pareto"]]
    if others:
        print_table(others, cols, "also meeting it (beaten on GPUs, memory, price or the metric)")
    if any(r["price_caveat"] for r in shown + others):
        typer.echo("* part of this price is a proxy, a street price or an old figure (casmoe/sim/box/prices.toml says which; "
                   "--prices FILE gives your own)")
    answers = summary["pareto"] + [r for r in summary["answers"] if r not in summary["pareto"]]
    notes = uncertainty_notes(answers, lambda r: r["config"])
    if notes:
        typer.echo(f"uncertainty of {metric} (the spread casmoe validate published measured for each kind of "
                   "configuration; it speaks for decode tok/s):")
        for line in notes:
            typer.echo("  " + line)
    for name, box in summary["boxes"].items():
        typer.echo(f"price of {name}: {box['price']} = {box['parts']}")
    for row in summary["infeasible"]:
        typer.echo(f"cannot meet it: {row['config']}: {row['why']}")
    typer.echo(f"simulated {result.simulated} points now ({result.probed} looked at; the full grid over the same "
               f"cache sizes has {result.grid}); records in {out}/points, table in {out}/search.json, plot {out}/search.png")


def _priced(row: dict[str, Any]) -> dict[str, Any]:
    """A row as the table prints it: the price in USD, starred where a part of it is a proxy."""
    from casmoe.report import UNCERTAINTY, uncertainty_cell

    usd = row["price_usd"]
    return {**row, "price_usd": "unknown" if usd is None else f"{usd:,.0f}" + ("*" if row["price_caveat"] else ""),
            UNCERTAINTY: uncertainty_cell(row)}

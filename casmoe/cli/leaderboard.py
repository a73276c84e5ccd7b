"""`casmoe leaderboard`: every built-in policy on every shipped workload, scored on unseen requests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from casmoe.cli.app import JOBS, RAY, RAY_ADDRESS, app, progress, ray_target
from casmoe.cli.flags import run_options
from casmoe.cli.reporting import PLOTS, Plots, draw_as

if TYPE_CHECKING:
    from casmoe.sim.run.grid import Grid

FIXED = ("policy", "planner", "capacity", "global_capacity", "split", "task", "span", "requests")
"""What the leaderboard chooses itself: every policy, its cache sizes, the held-out requests."""
PLOTTED = "plots.json"
"""Each workload's picture and the records it draws, as drawn: what --plots draws from."""


def draw_pictures(out: Path) -> list[Path]:
    """One <workload>.png per workload, from `out`/plots.json alone."""
    from casmoe.cli.figures import plot_decode_vs_capacity

    pictures = json.loads((out / PLOTTED).read_text())
    return [plot_decode_vs_capacity(out / name, records) for name, records in pictures.items()]


@app.command()
@run_options("routing", "box", "serving", exclude=FIXED, helps={
    "trace": "Trace (.npz), repeatable: one workload each, split into train and held-out requests; default: the "
             "shipped tiny-mixtral, tiny-olmoe and synthetic-qwen3.",
})
def leaderboard(
    grid: Grid,
    requests: int = typer.Option(24, min=0, help="Held-out requests scored per workload (0: all of them)."),
    out: Path = typer.Option(Path("casmoe-leaderboard"), help="Output folder; finished points are kept and skipped on re-runs."),
    jobs: int = JOBS,
    ray: bool = RAY,
    ray_address: Optional[str] = RAY_ADDRESS,
    fit_planner: bool = typer.Option(
        True, "--fit-planner/--no-fit-planner",
        help="Also run CasMoE with a planner fitted on each workload's train half (cached by its content).",
    ),
    plots: Plots = PLOTS,
) -> None:
    """Every built-in policy (oracles starred) x workload x 1, 1.5, 2 and 4 x top_k slots per layer.

    Workloads: the --trace files, else the shipped tiny-mixtral, tiny-olmoe and synthetic-qwen3.
    Each workload's train requests fit static's and ktransformers' profiles, moe-infinity's
    collection and CasMoE's planner (`casmoe[planner=train]`); only its held-out requests are
    simulated. Writes leaderboard.md, leaderboard.csv, results.json and one <workload>.png per
    workload to --out; an interrupted run resumes where it stopped.
    """
    from casmoe.output import check_dir_target, write_text
    from casmoe.report import write_csv, write_json
    from casmoe.shipped import shipped
    from casmoe.sim.questions import leaderboard as lb
    from casmoe.sim.run.runner import run_all

    check_dir_target(out, "--out")
    paths = grid.given.get("trace") or [shipped(name) for name in lb.TRACES]
    halves = [lb.prepare(Path(p), out / "workloads", requests) for p in paths]
    runs = lb.runs(halves, grid, fit_planner)
    for note in runs.notes:
        typer.echo(note)
    specs = runs.specs
    bar = progress(total=len(specs), desc="leaderboard", unit="run")

    def advance(done: int, total: int) -> None:
        bar.update(len(specs) - total if done == 0 else 1)

    records, computed = run_all(specs, out, jobs=jobs, ray_address=ray_target(ray, ray_address), progress=advance,
                                refused=runs.refused)
    bar.close()
    write_json(out / "results.json", records)
    write_csv(out / "leaderboard.csv", [r for r in records if "skipped" not in r])
    table = lb.markdown(records, halves, specs)
    write_text(out / "leaderboard.md", table)
    pictures = {}
    for h in halves:
        # the table's labels, and the user's trace with the requests scored of it, not the held-out
        # half's file name ('synthetic-qwen3-top8-f5081f7244451172-heldout4.npz') in the title
        ran = [{**r, "policy": lb.short_label(r["policy"], h), "trace": f"{h.name}.npz",
                "scored": f"{h.requests} held-out request{'s' * (h.requests != 1)}"}
               for r in records if "skipped" not in r and Path(r["trace"]).name == h.scored.name]
        if ran:
            pictures[f"{h.name}.png"] = ran
    write_json(out / PLOTTED, pictures)
    pending = draw_as(plots, "leaderboard", out, list(pictures), lambda: draw_pictures(out))
    typer.echo(table)
    boxes = sorted({g.machine.box() for g in runs.groups})
    typer.echo(f"{len(specs)} points ({computed} computed now) on {', '.join(boxes)}; written to {out}/")
    if pending:
        typer.echo(pending)

"""`casmoe leaderboard`: every built-in policy on every shipped workload, scored on unseen requests."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from casmoe.cli.app import ADAPTIVE_GATING, JOBS, RAY, RAY_ADDRESS, app, ray_target


@app.command()
def leaderboard(
    trace: Optional[list[Path]] = typer.Option(None, help="Workload traces, repeatable (default: the shipped tiny-mixtral, tiny-olmoe, synthetic-qwen3)."),
    hardware: str = typer.Option("rtx4090x4", help="Hardware profile or TOML path (default: the seed's 4x RTX 4090 box)."),
    requests: int = typer.Option(24, min=0, help="Held-out requests scored per workload (0: all of them)."),
    out: Path = typer.Option(Path("casmoe-leaderboard"), help="Output folder; finished points are kept and skipped on re-runs."),
    jobs: int = JOBS,
    ray: bool = RAY,
    ray_address: Optional[str] = RAY_ADDRESS,
    allow_overcommit: bool = typer.Option(False, "--allow-overcommit", help="Simulate cache sizes beyond what the GPUs hold (else n/a)."),
    adaptive_gating: Optional[float] = ADAPTIVE_GATING,
    fit_planner: bool = typer.Option(
        True, "--fit-planner/--no-fit-planner",
        help="Also run CasMoE with a planner fitted on each workload's train half (cached by its content).",
    ),
) -> None:
    """Every built-in policy (oracles starred) x workload x 1, 1.5, 2 and 4 x top_k slots per layer.

    Each workload's train requests fit static's and ktransformers' profiles, moe-infinity's
    collection and CasMoE's planner (`casmoe[planner=train]`); only its held-out requests are simulated. Writes leaderboard.md, leaderboard.csv, results.json and
    one <workload>.png per workload to --out; an interrupted run resumes where it stopped.
    """
    from tqdm import tqdm

    from casmoe.output import check_dir_target, write_text
    from casmoe.plots import plot_decode_vs_capacity
    from casmoe.report import write_csv, write_json
    from casmoe.shipped import shipped
    from casmoe.sim import leaderboard as lb
    from casmoe.sim.hardware import load_profile
    from casmoe.sim.sweep import run_grid

    check_dir_target(out, "--out")
    load_profile(hardware)  # an unknown profile fails before any work
    paths = trace or [shipped(name) for name in lb.WORKLOADS]
    workloads = [lb.prepare(Path(p), out / "workloads", requests) for p in paths]
    planners = {}
    if fit_planner:
        from casmoe.gating import gate_trace
        from casmoe.planner.cached import cached_planner
        from casmoe.trace_io import load_trace

        for w in workloads:
            fitted = cached_planner(gate_trace(load_trace(w.train), adaptive_gating))
            if fitted is not None:
                planners[w.name] = str(fitted.folder)
                typer.echo(f"{w.name}: {fitted.describe('casmoe[planner=train]')}")
    points = lb.points(workloads, hardware, planners, overcommit=allow_overcommit, gating=adaptive_gating)
    bar = tqdm(total=len(points), desc="leaderboard", unit="run")

    def progress(done: int, total: int) -> None:
        bar.update(len(points) - total if done == 0 else 1)

    records, computed = run_grid(points, out, jobs=jobs, ray_address=ray_target(ray, ray_address),
                                 progress=progress)
    bar.close()
    write_json(out / "results.json", records)
    write_csv(out / "leaderboard.csv", [r for r in records if "skipped" not in r])
    table = lb.markdown(records, workloads, planners)
    write_text(out / "leaderboard.md", table)
    for w in workloads:
        ran = [{**r, "policy": lb.short_label(r["policy"], w, planners.get(w.name))}  # the table's labels
               for r in records if "skipped" not in r and Path(r["trace"]).name == w.scored.name]
        if ran:
            plot_decode_vs_capacity(out / f"{w.name}.png", ran)
    typer.echo(table)
    typer.echo(f"{len(points)} points ({computed} computed now) on {hardware}; written to {out}/")

"""`casmoe planner fit|eval`: build a CasMoE planner from a trace and score it on held-out prompts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from casmoe.cli.app import app
from casmoe.planner.config import EAPConfig, Phase, PlannerConfig
from casmoe.shipped import DEFAULT_TRACE, shipped

planner_app = typer.Typer(
    name="planner",
    help="The CasMoE planner: predict every layer's experts from the prompt, before decoding.",
    no_args_is_help=True,
)
app.add_typer(planner_app, name="planner")
_D = PlannerConfig()


TRACE_HELP = f"Trace with prompts (.npz); default: the shipped {DEFAULT_TRACE}."


@planner_app.command()
def fit(
    trace: Optional[Path] = typer.Option(None, help=TRACE_HELP),
    out: Path = typer.Option(..., help="Folder to write the planner to (created if missing)."),
    epsilon: float = typer.Option(_D.epsilon, help="Gate: use the matcher when its best similarity exceeds this."),
    neighbours: int = typer.Option(_D.neighbours, min=1, help="Matcher: average this many nearest prompts."),
    buffer: int = typer.Option(_D.buffer, min=1, help="Online buffer C: served prompts join the index C at a time."),
    phase: Phase = typer.Option(Phase.DECODE, help="Tokens the expert patterns sum over."),
    counts: bool = typer.Option(False, "--counts", help="Label with selection counts instead of router weights."),
    holdout_every: int = typer.Option(
        _D.holdout_every,
        min=0,
        help="Hold out every N-th request for evaluation, or the trace's labelled split if any (0: fit on all).",
    ),
    exclude_task: Optional[List[str]] = typer.Option(
        None, help="Leave this task's requests out of the fit (repeatable): for leave-one-task-out eval."
    ),
    alpha: float = typer.Option(_D.eap.alpha, min=0.0, help="Weight of the SimCSE contrastive loss in the predictor."),
    epochs: int = typer.Option(_D.eap.epochs, min=1, help="Predictor training epochs."),
    seed: int = typer.Option(_D.seed, help="Seed for the predictor's initialisation, dropout and batches."),
) -> None:
    """Fit matcher and predictor on a trace's prompts and write the planner folder."""
    from casmoe.folder import check_folder_target
    from casmoe.planner import fit_planner
    from casmoe.planner.planner import FORMAT, META
    from casmoe.trace import Trace

    check_folder_target(out, FORMAT, "--out", marker=META)  # before the fit: an unwritable --out fails now
    tr = Trace.load(trace or shipped(DEFAULT_TRACE))
    cfg = PlannerConfig(
        epsilon=epsilon,
        neighbours=neighbours,
        buffer=buffer,
        phase=phase,
        weighted=not counts,
        holdout_every=holdout_every,
        exclude_tasks=tuple(exclude_task or ()),
        seed=seed,
        eap=EAPConfig(alpha=alpha, epochs=epochs),
    )
    planner = fit_planner(tr, cfg, progress=sys.stderr.isatty())  # bars on a terminal only
    planner.save(out)
    sizes = planner.nbytes()
    typer.echo(
        f"planner for {tr.geometry.describe()} written to {out}: {len(planner.matcher)} prompts indexed, "
        f"{sum(sizes.values()) / 2**20:.1f} MiB of state"
    )


@planner_app.command("eval")
def evaluate(
    planner: Path = typer.Option(..., help="Planner folder written by `casmoe planner fit`."),
    trace: Optional[Path] = typer.Option(None, help=TRACE_HELP),
    epsilon: Optional[float] = typer.Option(None, help="Gate threshold for `cascade` (default: the planner's)."),
    holdout_task: Optional[str] = typer.Option(
        None, help="Score only this task's requests; the planner must have been fitted with --exclude-task on it."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (one entry per method) instead of a table."),
    curve: Optional[Path] = typer.Option(None, help="Write the epsilon curve (CSV) here."),
    plot: Optional[Path] = typer.Option(None, help="Write the epsilon curve as a PNG here."),
) -> None:
    """Score the planner (eam, eap, cascade) and its fit data's baselines: on the fit trace, the
    requests it was not fitted on; on another trace of the same routing shape, every request."""
    from casmoe.planner import load_planner
    from casmoe.output import check_file_target
    from casmoe.planner.evaluate import evaluate as run_eval
    from casmoe.trace import Trace

    for path, what in ((curve, "--curve"), (plot, "--plot")):
        if path is not None:
            check_file_target(path, what, create_parent=True)
    tr = Trace.load(trace or shipped(DEFAULT_TRACE))
    ev = run_eval(load_planner(planner), tr, epsilon=epsilon, progress=not as_json and sys.stderr.isatty(),
                  holdout_task=holdout_task)
    result = ev.to_dict()
    if curve or plot:
        points = ev.epsilon_curve([i / 20 for i in range(21)])
        from casmoe.report import plot_epsilon_curve, write_csv

        if curve:
            write_csv(curve, points)
        if plot:
            plot_epsilon_curve(points, plot, baseline=result["popularity"]["recall_at_k"])
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    from casmoe.report import print_table

    records = [{"name": name, **entry} for name, entry in result.items()]
    print_table(records, ["name", "recall_at_k", "coverage_at_2k", "requests"], title=f"{ev.scope}, k={ev.k}")

"""`casmoe planner fit|eval`: build a CasMoE planner from a trace and score it on held-out prompts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, List, Optional

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
    epsilon: float = typer.Option(
        _D.epsilon, help="The seed's fixed gate (eval --epsilon); the planner gates by measured confidence."
    ),
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
    predictor: str = typer.Option(
        _D.eap.kind, help="Predictor: linear (ridge on the prompt embedding, no torch) or transformer (the seed's encoder)."
    ),
    folds: int = typer.Option(_D.folds, min=2, help="Validation folds of the fit data (by task) for the gate and trajectory."),
    horizon: int = typer.Option(_D.horizon, min=0, help="Trajectory: predict use within this many decode tokens (0: next-use distance)."),
    cadence: int = typer.Option(_D.cadence, min=1, help="Trajectory: re-match the routing path every this many decode tokens."),
    alpha: float = typer.Option(_D.eap.alpha, min=0.0, help="Transformer predictor: weight of the SimCSE contrastive loss."),
    epochs: int = typer.Option(_D.eap.epochs, min=1, help="Transformer predictor: training epochs."),
    seed: int = typer.Option(_D.seed, help="Seed for the predictor's initialisation, dropout and batches."),
    embedding: str = typer.Option(
        _D.embedding, help="Prompt embedder precision: int8 (quantized MiniLM, ~3x faster) or fp32; served as fitted."
    ),
) -> None:
    """Fit the cascade (matcher, predictor, confidence gate, trajectory stage) on a trace and
    write the planner folder. A trace without prompts (an imported route CSV) fits the
    trajectory stage alone: a prompt-free planner that serves from the routing it sees."""
    from casmoe.folder import check_folder_target
    from casmoe.planner import fit_planner
    from casmoe.planner.planner import FORMAT, META
    from casmoe.trace_io import load_trace

    check_folder_target(out, FORMAT, "--out", marker=META)  # before the fit: an unwritable --out fails now
    tr = load_trace(trace or shipped(DEFAULT_TRACE))
    cfg = PlannerConfig(
        epsilon=epsilon,
        neighbours=neighbours,
        buffer=buffer,
        phase=phase,
        weighted=not counts,
        holdout_every=holdout_every,
        exclude_tasks=tuple(exclude_task or ()),
        seed=seed,
        folds=folds,
        horizon=horizon,
        cadence=cadence,
        embedding=embedding,
        eap=EAPConfig(kind=predictor, alpha=alpha, epochs=epochs),
    )
    planner = fit_planner(tr, cfg, progress=sys.stderr.isatty())  # bars on a terminal only
    planner.save(out)
    sizes = planner.nbytes()
    what = f"{len(planner.matcher)} prompts indexed" if planner.serves_prompts else "no prompts: trajectory stage alone"
    typer.echo(
        f"planner for {tr.geometry.describe()} written to {out} ({', '.join(planner.stages)}): {what}, "
        f"{sum(sizes.values()) / 2**20:.1f} MiB of state"
    )


@planner_app.command("eval")
def evaluate(
    planner: Path = typer.Option(..., help="Planner folder written by `casmoe planner fit`."),
    trace: Optional[Path] = typer.Option(None, help=TRACE_HELP),
    epsilon: Optional[float] = typer.Option(
        None, help="Score `cascade` with the seed's fixed gate at this threshold (default: the confidence gate)."
    ),
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
    from casmoe.trace_io import load_trace

    for path, what in ((curve, "--curve"), (plot, "--plot")):
        if path is not None:
            check_file_target(path, what, create_parent=True)
    tr = load_trace(trace or shipped(DEFAULT_TRACE))
    ev = run_eval(load_planner(planner), tr, epsilon=epsilon, progress=not as_json and sys.stderr.isatty(),
                  holdout_task=holdout_task)
    result = ev.to_dict()
    if curve or plot:
        points = ev.epsilon_curve([i / 20 for i in range(21)])
        from casmoe.cli.figures import plot_epsilon_curve
        from casmoe.report import write_csv

        if curve:
            write_csv(curve, points)
        if plot:
            plot_epsilon_curve(points, plot, baseline=result["popularity"]["recall_at_k"],
                               trace=Path(trace or shipped(DEFAULT_TRACE)).name, model=str(tr.meta.get("model", "")),
                               scope=ev.scope, k=ev.k, epsilon=epsilon)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    from casmoe.report import print_table

    records = [{"name": name, **entry} for name, entry in result.items()]
    print_table(records, ["name", "recall_at_k", "coverage_at_2k", "requests"], title=f"{ev.scope}, k={ev.k}")


def _simulator(trace_geometry: Any, hardware: str) -> Any:
    """Decode tokens/s on `hardware` at the first preset of the trace's routing shape, in bf16
    (a tiny model's trace then answers "this routing on the real model's sizes")."""
    from casmoe.errors import CasmoeError
    from casmoe.geometry import Quant
    from casmoe.policies import get_policy
    from casmoe.presets import load_presets
    from casmoe.sim.passes.driver import run_trace
    from casmoe.sim.passes.assembly import Run
    from casmoe.sim.box.hardware import load_profile
    from casmoe.sim.cost.machine import Machine

    g = trace_geometry
    shape = (g.layers, g.experts, g.top_k)
    presets = [p for p in load_presets().values() if (p.geometry.layers, p.geometry.experts, p.geometry.top_k) == shape]
    if not presets:
        raise CasmoeError(f"no model preset has the routing shape {g.describe()}; run without --simulate")
    machine = Machine(presets[0], load_profile(hardware), quant=Quant.BF16)

    def run(trace: Any, policy: str, cap: Any, opts: dict[str, Any]) -> float:
        res = run_trace(Run(trace, get_policy(policy), cap, machine, options=opts))
        return res.decode_tokens_per_s

    return run, presets[0].name


@planner_app.command("bench")
def bench(
    trace: Optional[Path] = typer.Option(None, help=TRACE_HELP + " Needs task labels for the unseen-task settings."),
    out: Path = typer.Option(..., help="Folder for the planners and results.json (created if missing)."),
    eval_trace: Optional[List[Path]] = typer.Option(
        None, help="Held-out-domain evaluation trace (repeatable): scored by the in-split planner, every request."
    ),
    slots: Optional[List[int]] = typer.Option(None, min=1, help="Slots per layer to replay at (repeatable; default 2k)."),
    grid: str = typer.Option("2,4,8", help="Trajectory horizons to choose from, on each setting's validation fold."),
    setting: Optional[List[str]] = typer.Option(
        None, help="Run only these settings (insplit, loto:TASK, mixed:TASK, domain:NAME; repeatable)."
    ),
    simulate: bool = typer.Option(False, "--simulate", help="Also simulate decode tokens/s (slower)."),
    hardware: str = typer.Option("rtx4090x4", help="Hardware profile for --simulate."),
    predictor: str = typer.Option(_D.eap.kind, help="Predictor kind (linear or transformer)."),
) -> None:
    """The fair protocol: in-split, leave-one-task-out for every task, a mixed stream with one
    unseen task, held-out-domain traces; horizons chosen on each setting's own fit data."""
    from casmoe.errors import CasmoeError
    from casmoe.output import check_dir_target
    from casmoe.planner.protocol import BASELINES, CEILINGS, run
    from casmoe.report import print_table, write_json
    from casmoe.trace_io import load_trace

    check_dir_target(out, "--out")
    tr = load_trace(trace or shipped(DEFAULT_TRACE))
    try:
        horizons = [int(h) for h in grid.split(",") if h.strip()]
    except ValueError:
        raise CasmoeError(f"--grid must be comma-separated integers, got {grid!r}") from None
    evals = [(p.stem, load_trace(p)) for p in eval_trace or ()]
    sim = None
    if simulate:
        sim, preset = _simulator(tr.geometry, hardware)
        typer.echo(f"simulating {hardware} with the {preset} preset's expert sizes (bf16)")
    cfg = PlannerConfig(eap=EAPConfig(kind=predictor))
    records = []
    for rec in run(tr, cfg, slots or [2 * tr.geometry.top_k], out, eval_traces=evals, grid=horizons, only=setting or (), simulate=sim):
        records.append(rec)
        write_json(out / "results.json", records)
        acc = rec["accuracy"]
        title = (
            f"{rec['setting']}: fit on {rec['fit_requests']} requests, {rec['scored_requests']} scored; "
            f"horizon {rec['horizon']}, fallback {'on' if rec['fallback'] else 'off'}, chosen on {rec['chosen_on']}"
        )
        recall = {m: acc[m]["recall_at_k"] for m in ("cascade", "trajectory", "popularity") if m in acc}
        rows = [{**row, **{f"recall {m}": v for m, v in recall.items()}} for row in rec["policies"]]
        cols = (["slots_per_layer", "casmoe", "casmoe_static", *BASELINES, *(c for c, _, _ in CEILINGS)]
                + [c for c in rows[0] if c.endswith("_tok_s")] + [f"recall {m}" for m in recall])
        print_table(rows, cols, title=title)
    typer.echo(f"records written to {out / 'results.json'}")

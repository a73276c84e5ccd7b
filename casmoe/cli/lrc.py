"""`casmoe lrc`: local routing consistency (SRP, SCH) of one or more traces, side by side."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer

from casmoe.cli.app import app, progress
from casmoe.errors import CasmoeError
from casmoe.shipped import DEFAULT_TRACE, shipped


def _ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CasmoeError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise CasmoeError(f"{what} must be integers >= 1, got {text!r}")
    return vals


def _floats(text: str, what: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CasmoeError(f"{what} must be comma-separated numbers, got {text!r}") from None
    if not vals or min(vals) <= 0 or not all(math.isfinite(v) for v in vals):
        raise CasmoeError(f"{what} must be positive finite numbers, got {text!r}")
    return vals


@app.command()
def lrc(
    trace: Optional[list[str]] = typer.Option(
        None, "--trace", "-t", help="Trace: .npz, route .csv or .json; PATH#KEY picks one entry of a JSON file (an "
        "existing file's name is read whole, # and all). Repeat to compare. "
        f"Default: the shipped {DEFAULT_TRACE}."
    ),
    m: str = typer.Option("4,16,64,256", "--m", help="Segment lengths / lookahead in tokens, comma-separated."),
    rho: str = typer.Option("1,2,4", "--rho", help="Cache sizes C / active experts for the table and baselines."),
    baselines: str = typer.Option("lru,lfu,belady", help="Policies replayed on the SCH axis ('none' to skip)."),
    tokens: str = typer.Option("all", help="'all' tokens (as moe-lrc) or 'decode' tokens only."),
    replicates: int = typer.Option(1000, min=1, help="Bootstrap replicates over requests."),
    confidence: float = typer.Option(0.95, help="Confidence of the basic bootstrap interval."),
    seed: int = typer.Option(0, help="Seed of the bootstrap's random generator."),
    layers: bool = typer.Option(False, "--layers", help="Print per-layer rows too (files always have them)."),
    as_json: bool = typer.Option(False, "--json", help="Print everything (full curves) as JSON instead of tables."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write everything (full curves) to this JSON file."),
    csv_out: Optional[Path] = typer.Option(None, "--csv", help="Write the table as CSV (baselines to *-baselines.csv)."),
    plots: Optional[Path] = typer.Option(None, help="Directory for PNG plots: sch.png, srp.png, layers.png."),
) -> None:
    """SRP and SCH (arXiv 2505.16056's routing-consistency metrics) per layer and model-wide.

    Example: casmoe lrc -t a.npz -t b.npz --m 4,16,64 --plots out/
    """
    import numpy as np
    from casmoe.metrics.lrc import measure, work_units
    from casmoe.metrics.tokens import TokenSelection
    from casmoe.policies import get_policy
    from casmoe.output import check_dir_target, check_file_target
    from casmoe.cli.figures import plot_lrc_layers, plot_lrc_sch, plot_lrc_srp
    from casmoe.report import print_table, write_csv, write_json

    for path, what in ((out, "--out"), (csv_out, "--csv")):
        if path is not None:
            check_file_target(path, what, create_parent=True)
    if plots is not None:
        check_dir_target(plots, "--plots")
    if not 0 < confidence < 1:
        raise CasmoeError(f"--confidence must be between 0 and 1 (exclusive), got {confidence}")
    ms = _ints(m, "--m")
    rhos = _floats(rho, "--rho")
    try:
        selection = TokenSelection(tokens)
    except ValueError:
        raise CasmoeError(f"--tokens must be 'all' or 'decode', got {tokens!r}") from None
    policies = [] if baselines.strip().lower() == "none" else [p.strip() for p in baselines.split(",") if p.strip()]
    for p in policies:
        get_policy(p)  # unknown names fail before any work
    from casmoe.importers import read_specs

    loaded = read_specs(trace or [str(shipped(DEFAULT_TRACE))])
    labels = [name for name, _ in loaded]
    total = sum(work_units(tr, ms, rhos, policies, selection) for _, tr in loaded)
    results = []
    with progress(total=total, desc="lrc", unit="tok", leave=False, quiet=as_json) as bar:
        for label, (_, tr) in zip(labels, loaded):
            results.append(
                measure(
                    tr, ms, name=label, tokens=selection, replicates=replicates, confidence=confidence,
                    rng=np.random.default_rng(seed), baselines=policies, rhos=rhos, progress=bar.update,
                )
            )
    records = [r for res in results for r in res.records(rhos)]
    base = [r for res in results for r in res.baseline_records()]
    everything = [res.to_dict() for res in results]
    if as_json:
        typer.echo(json.dumps(everything, indent=2))
    else:
        shown = records if layers else [r for r in records if r["level"] == "model"]
        cols = ["trace", "m", "level", "srp", "srp_lower", "srp_upper", "preds_per_active"] + [f"sch@{x:g}" for x in rhos]
        print_table(shown, cols, title="Local routing consistency (SCH at rho = C / active experts)")
        if base:
            print_table(base, ["trace", "policy", "level", "rho", "slots", "hit_rate"] + [f"sch_m{x}" for x in ms],
                        title="Baselines (replayed, warm hit rate)")
    if out:
        write_json(out, everything)
    if csv_out:
        write_csv(csv_out, records)
        if base:
            write_csv(csv_out.with_name(csv_out.stem + "-baselines.csv"), base)
    if plots:
        plots.mkdir(parents=True, exist_ok=True)
        plot_lrc_sch(plots / "sch.png", results)
        plot_lrc_srp(plots / "srp.png", results)
        plot_lrc_layers(plots / "layers.png", results)
        if not as_json:
            typer.echo(f"plots written to {plots}")

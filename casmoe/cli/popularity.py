"""`casmoe popularity ...`: popularity profiles from engines that keep only expert counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from casmoe.cli.app import app

profile_app = typer.Typer(
    help="Popularity profiles (routed counts per layer and expert) from counts-only engine dumps; hardware profiles are `casmoe hardware list`.",
    no_args_is_help=True,
)
app.add_typer(profile_app, name="popularity")


@profile_app.command("import")
def import_(
    sources: list[Path] = typer.Argument(
        ..., help="trtllm: the EXPERT_STATISTIC_PATH folder; ktransformers, sglang-stat: .pt files or their folder."
    ),
    fmt: str = typer.Option(..., "--format", help="trtllm, ktransformers or sglang-stat."),
    out: Path = typer.Option(..., "--out", "-o", help="Output profile (.npz)."),
    model: Optional[str] = typer.Option(
        None, help="Model preset the counts must match (MoE layers, experts): dense layers are told from cold ones."
    ),
) -> None:
    """Turn an engine's expert counts into a profile that `static[profile=FILE]` (and every
    popularity placement, through casmoe.profile.load_profile) reads.

    Engines count every decoder layer; layers with no count (dense) are dropped and the
    engine layer ids kept are stored in the profile.
    """
    from casmoe.importers import import_profile
    from casmoe.output import check_file_target, check_not_input
    from casmoe.presets import get_preset

    check_file_target(out, "--out")
    check_not_input(out, sources, "--out")
    geometry = get_preset(model).geometry if model is not None else None
    profile = import_profile(sources, fmt, model=geometry)
    profile.save(out)
    dropped = profile.meta["engine_layers"] - profile.layers
    typer.echo(
        f"wrote {out}: {profile.layers} MoE layers x {profile.experts} experts, {profile.counts.sum():.0f} routed"
        + (f"; {dropped} of the engine's {profile.meta['engine_layers']} layers counted nothing (dense) and were dropped"
           if dropped else "")
    )


@profile_app.command("info")
def info(
    profile: Path = typer.Argument(..., help="Profile (.npz) or trace (.npz)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Print a profile's shape, where it came from, and how concentrated each layer is."""
    from casmoe.profile import read_profile
    from casmoe.report import print_table

    s = read_profile(profile).summary()
    if as_json:
        typer.echo(json.dumps({"path": str(profile), **s}, indent=2))
        return
    typer.echo(f"{profile}: {s['layers']} MoE layers x {s['experts']} experts, {s['routed']:.0f} routed")
    for key in ("source", "files", "moe_layers", "created"):
        if key in s["meta"]:
            typer.echo(f"{key}: {s['meta'][key]}")
    rows = [{"layer": r["layer"], "routed": f"{r['routed']:.0f}", "distinct": r["distinct"],
             "top4 share": f"{r['top_share']:.3f}"} for r in s["per_layer"]]
    print_table(rows, ["layer", "routed", "distinct", "top4 share"], title="popularity per layer")

"""`casmoe presets` and `casmoe stacks`: the model presets and software stacks a run names (hardware profiles:
`casmoe hardware list`)."""

from __future__ import annotations

import json

import typer

from casmoe.cli.app import app


@app.command()
def presets(
    as_json: bool = typer.Option(False, "--json", help="Print the presets' full geometry as JSON."),
) -> None:
    """List the model presets (`--model NAME`): the geometry and dense shape each run prices."""
    from casmoe.presets import PRESETS_FILE, load_presets, preset_rows

    rows = preset_rows()
    if as_json:
        loaded = load_presets()
        typer.echo(json.dumps({r["name"]: {**loaded[r["name"]].to_dict(), **r} for r in rows}, indent=2))
        return
    from casmoe.report import human_bytes, print_table

    shown = [
        {
            "name": r["name"],
            "layers": f"{r['layers']}+{r['dense_layers']}" if r["dense_layers"] else r["layers"],
            "experts": r["experts"],
            "top_k": r["top_k"],
            "shared": r["shared"],
            "attention": r["attention"],
            "precision": f"{r['expert_precision']}/{r['dense_precision']}",
            "experts native": human_bytes(r["experts_bytes"]),
            "experts bf16": human_bytes(r["experts_bf16_bytes"]),
            "KV/token": human_bytes(r["kv_bytes_per_token"]),
        }
        for r in rows
    ]
    print_table(shown, list(shown[0]), title="model presets (layers: MoE+dense; precision: experts/dense)")
    typer.echo(f"defined in {PRESETS_FILE} (each with its source: --json); pass --model NAME")


@app.command()
def stacks(
    as_json: bool = typer.Option(False, "--json", help="Print the full stacks (with sources and fitted rows) as JSON."),
) -> None:
    """List the software stacks (`--stack NAME`): each runtime's own costs, fitted on published rows."""
    from casmoe.sim.cost.stack import STACKS_DIR, load_shared, load_stack, stack_paths

    loaded = [load_stack(name) for name in stack_paths()]
    if as_json:
        typer.echo(json.dumps([s.to_dict() for s in loaded], indent=2))
        return
    from casmoe.report import print_table

    shared = load_shared()
    rows = [
        {
            "name": s.name,
            "per layer us": f"{s.layer_us:.4g}",
            "per pass us": f"{s.step_us:.4g}",
            "copy share": f"{s.copy_efficiency:.3g}",
            "host bw share": f"{s.host_efficiency:.3g}" if s.host_efficiency else f"{shared.host_efficiency:.3g} (shared)",
            "NUMA-aware": "yes" if s.numa_aware else "no",
            "early prefetch": "yes" if s.prefetch_early else "no",
            "fitted on": "; ".join(f"{k}: {', '.join(v)}" for k, v in s.fitted_on.items()) or "-",
        }
        for s in loaded
    ]
    print_table(rows, list(rows[0]), title="software stacks")
    typer.echo(f"files in {STACKS_DIR}; each number has a source (--json); copy one, edit it, pass --stack PATH")

"""`casmoe presets` and `casmoe profiles`: the model presets and hardware profiles a run names."""

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
def profiles(
    as_json: bool = typer.Option(False, "--json", help="Print the full profiles (with sources) as JSON."),
    published: bool = typer.Option(False, "--published", help="Also the boxes of the published measurements "
                                   "(casmoe/sim/trust/published/profiles: what `casmoe validate --published` simulates)."),
) -> None:
    """List the shipped hardware profiles; add your own as a TOML file and pass its path."""
    from casmoe.sim.box.hardware import PROFILES_DIR, load_profile, profile_paths

    loaded = [load_profile(name) for name in profile_paths(published)]
    if as_json:
        typer.echo(json.dumps([p.to_dict() for p in loaded], indent=2))
        return
    from casmoe.report import print_table

    def stated(value: float) -> str:
        """A profile's 0 is 'not stated by the source (0: not modelled)', not a measurement of nothing."""
        return f"{value:g}" if value else "-"

    rows = [
        {
            "name": p.name,
            "gpus": f"{p.gpus}x {p.gpu}",
            "GiB": f"{p.memory_gib:g}",
            "TFLOPS": f"{p.dense_tflops:g}",
            "mem GB/s": f"{p.mem_bw_gbs:g}",
            "H2D pinned GB/s": f"{p.h2d_pinned_gbs:g}",
            "pageable GB/s": f"{p.h2d_pageable_gbs:g}",
            "NVMe GB/s": stated(p.storage_read_gbs),
            "host RAM GiB": stated(p.host_ram_gib),
            "OS reserve GiB": stated(p.host_reserved_gib),
            "host": p.cpu,
            "host compute": p.describe_host() if p.cpu_tflops or p.cpu_mem_bw_gbs else "-",
        }
        for p in loaded
    ]
    print_table(rows, list(rows[0]), title="hardware profiles")
    if any(not (p.storage_read_gbs and p.host_ram_gib and (p.cpu_tflops or p.cpu_mem_bw_gbs)) for p in loaded):
        typer.echo("-: not stated by the profile's source (0 in the file: not modelled; --json gives each source)")
    typer.echo(f"files in {PROFILES_DIR}; copy one, edit it (every number needs a [sources] entry), pass --hardware PATH")


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

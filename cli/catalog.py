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
) -> None:
    """List the shipped hardware profiles; add your own as a TOML file and pass its path."""
    from casmoe.sim.hardware import PROFILES_DIR, load_profile, profile_paths

    loaded = [load_profile(name) for name in profile_paths()]
    if as_json:
        typer.echo(json.dumps([p.to_dict() for p in loaded], indent=2))
        return
    from casmoe.report import print_table

    rows = [
        {
            "name": p.name,
            "gpus": f"{p.gpus}x {p.gpu}",
            "GiB": f"{p.memory_gib:g}",
            "TFLOPS": f"{p.dense_tflops:g}",
            "mem GB/s": f"{p.mem_bw_gbs:g}",
            "H2D pinned GB/s": f"{p.h2d_pinned_gbs:g}",
            "pageable GB/s": f"{p.h2d_pageable_gbs:g}",
            "NVMe GB/s": f"{p.storage_read_gbs:g}",
            "host RAM GiB": f"{p.host_ram_gib:g}",
            "host": p.cpu,
        }
        for p in loaded
    ]
    print_table(rows, list(rows[0]), title="hardware profiles")
    typer.echo(f"files in {PROFILES_DIR}; copy one, edit it (every number needs a [sources] entry), pass --hardware PATH")

"""`casmoe hardware ...`: the user's own box as a hardware profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from casmoe.cli.app import app

hardware_app = typer.Typer(
    help="Hardware profiles: the shipped ones and the published boxes (`list`), and the box you run on (`detect`), "
         "for `--hardware NAME or FILE` anywhere.",
    no_args_is_help=True,
)
app.add_typer(hardware_app, name="hardware")


@hardware_app.command("detect")
def detect(
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the profile here (TOML), for --hardware FILE."),
    measure: bool = typer.Option(True, "--measure/--no-measure",
                                 help="Measure the host's memory bandwidth (about a second) where it cannot be read."),
    recorded: Optional[Path] = typer.Option(
        None, "--from", help="Detect a box from outputs recorded on it instead of this machine: a folder with "
                             "commands/lscpu, commands/nvidia-smi, ..., proc/meminfo (see casmoe/sim/box/reader.py); "
                             "nothing is measured."),
    name: str = typer.Option("", help="The profile's name (default: --out's file name, else 'detected')."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile, how each number was obtained and the "
                                                       "other facts read as JSON."),
) -> None:
    """Read this machine (GPUs through NVML, nvidia-smi or rocm-smi; CPU through lscpu; RAM,
    memory modules through dmidecode as root; NUMA nodes), take its parts' vendor figures from
    the shipped catalogs, and print every number with how it was obtained: read (from what),
    measured (how) or assumed (why). With --out, write the profile that --hardware accepts."""
    from casmoe.errors import CasmoeError
    from casmoe.output import check_file_target
    from casmoe.sim.box.bandwidth import stream_copy
    from casmoe.sim.box.detect import detect as detect_box
    from casmoe.sim.box.reader import RecordedReader, SystemReader

    if out is not None:
        check_file_target(out, "--out")
    if recorded is not None and not recorded.is_dir():
        raise CasmoeError(f"--from {recorded}: not a folder of recorded outputs")
    reader = RecordedReader(recorded) if recorded is not None else SystemReader()
    probe = stream_copy if measure and recorded is None else None
    found = detect_box(reader, probe, name or (out.stem if out else "detected"),
                       note=lambda line: typer.echo(line, err=True))
    if out is not None:
        found.profile.write(out)
    if as_json:
        typer.echo(json.dumps(found.to_dict(), indent=2))
        return
    from casmoe.report import print_table

    print_table(found.rows(), ["field", "value", "how", "from"], title=f"{found.profile.name}: {found.profile.description}")
    counts = {how: sum(1 for h in found.provenance.values() if h == how) for how in ("detected", "measured", "assumed")}
    typer.echo(f"{counts['detected']} numbers read, {counts['measured']} measured, {counts['assumed']} assumed "
               "(check those: edit the file, each number keeps its [sources] line)")
    if out is not None:
        typer.echo(f"wrote {out}; pass --hardware {out}")


@hardware_app.command("list")
def list_profiles(
    as_json: bool = typer.Option(False, "--json", help="Print the full profiles (with sources) as JSON."),
    published: bool = typer.Option(False, "--published", help="Also the boxes of the published measurements "
                                   "(casmoe/sim/trust/published/profiles: what `casmoe validate published` simulates)."),
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

"""`casmoe hardware ...`: the user's own box as a hardware profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from casmoe.cli.app import app

hardware_app = typer.Typer(
    help="The box you run on, as a hardware profile (`--hardware FILE` anywhere); shipped profiles are `casmoe profiles`.",
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

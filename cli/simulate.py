"""`casmoe simulate`, `casmoe sweep`, `casmoe profiles`: the simulator's what-if commands.

The simulator is imported inside the commands (simpy and numpy load only when used).
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer

from casmoe.cli import requests as choose
from casmoe.cli.app import ADAPTIVE_GATING, JOBS, RAY, RAY_ADDRESS, app, progress, ray_target
from casmoe.errors import CasmoeError
from casmoe.shipped import DEFAULT_TRACE


class Plots(str, Enum):
    BACKGROUND = "background"
    WAIT = "wait"
    NONE = "none"


PLOTS = typer.Option(
    Plots.BACKGROUND, "--plots",
    help="background: draw the PNGs in a detached process (the command does not wait; each file appears whole when "
    "drawn); wait: draw them before the command ends; none: no plots.",
)


def _write_report(out: Path, records: list[dict[str, Any]], plots: Plots) -> tuple[list[Path], str]:
    """results.json (every record) and results.csv (the runs), then the plots as `plots` asks;
    returns the files written and a line on the plots."""
    import subprocess
    import sys

    from casmoe.plots import draw_report, report_plots
    from casmoe.report import write_csv, write_json

    ran = [r for r in records if "skipped" not in r]
    write_json(out / "results.json", records)
    write_csv(out / "results.csv", ran)
    written = [out / "results.json", out / "results.csv"]
    names = [p.name for p in report_plots(records)]
    if plots is Plots.NONE or not names:
        return written, ""
    if plots is Plots.WAIT:
        return written + draw_report(out, records), ""
    for name in names:  # a plot of an earlier run must not pass for this one's
        (out / name).unlink(missing_ok=True)
    with open(out / "plots.log", "wb") as log:
        subprocess.Popen([sys.executable, "-m", "casmoe.cli.plots", str(out)], stdin=subprocess.DEVNULL,
                         stdout=log, stderr=log, start_new_session=True)
    return written, (f"plots are being drawn in the background: {', '.join(names)} appear in {out} when done "
                     f"(errors in {out / 'plots.log'}; --plots wait draws them before the command ends)")


def _report(out: Path, records: list[dict[str, Any]], as_json: bool, title: str, timeline: Optional[Path],
            serving_title: str, timeliness: bool, plots: Plots) -> None:
    """Write the report folder, then print the records as JSON or as tables (and what was skipped)."""
    from casmoe.report import print_simulation

    written, pending = _write_report(out, records, plots)
    if as_json:
        typer.echo(json.dumps(records, indent=2))
        return
    ran = [r for r in records if "skipped" not in r]
    if ran:
        files = ", ".join(str(p) for p in [*written, *([timeline] if timeline else [])])
        print_simulation(ran, title, f"every measurement (latency percentiles, TTFT, stalls, bytes moved) is in {files}")
    _print_serving(records, serving_title, timeliness)
    for r in records:
        if "skipped" in r:
            typer.echo(f"skipped {r['policy']} @ {r['capacity_spec']}: {r['skipped']}")
    if pending:
        typer.echo(pending)


def _print_serving(records: list[dict[str, Any]], title: str, timeliness: bool) -> None:
    from casmoe.report import print_serving, print_tiers, print_timeliness

    ran = [r for r in records if "skipped" not in r]
    if title:
        print_serving(ran, title)
    if any(r["host_cache_gb"] for r in ran):
        print_tiers(ran, "memory tiers: storage -> RAM tier -> GPU slots")
    if timeliness:
        print_timeliness(ran, "stall vs the perfect-prefetch bound (same loads, issued as early as the link allows)")


@app.command()
def simulate(
    trace: Optional[Path] = typer.Option(None, help=f"Trace (.npz); default: the shipped {DEFAULT_TRACE}."),
    model: Optional[str] = typer.Option(None, help="Model preset; default: the trace's, else the one matching its shape."),
    hardware: str = typer.Option("rtx4090x4", help="Hardware profile name (see `casmoe profiles`) or a TOML path."),
    policy: Optional[list[str]] = typer.Option(
        None, help="Policy, repeatable: NAME or NAME[key=value,...] (e.g. casmoe[predictor=noisy]); default: all."
    ),
    capacity: Optional[list[str]] = typer.Option(
        None, help="Cache per layer in slots (4) or for all devices in memory (6GB), repeatable; default: a few sizes that fit."
    ),
    global_capacity: Optional[list[str]] = typer.Option(None, help="One pool for all layers: slots or memory, repeatable."),
    batch: int = typer.Option(1, min=1, help="Requests whose decode tokens share a step."),
    miss_mode: str = typer.Option("load", help="load (stall), substitute (lossy) or cpu (compute on the host)."),
    quant: Optional[str] = typer.Option(None, help="Expert precision: bf16, fp16, int8, int4 (default: trace bytes or bf16)."),
    devices: int = typer.Option(0, min=0, help="GPUs the layers are split over (0: every GPU of the profile)."),
    pageable: bool = typer.Option(False, "--pageable", help="Copy from pageable host memory instead of pinned."),
    requests: Optional[int] = choose.requests_option("Default: 12 for the shipped trace, else all."),
    split: str = choose.SPLIT,
    task: Optional[list[str]] = choose.TASK,
    span: Optional[str] = choose.RANGE,
    allow_overcommit: bool = typer.Option(
        False, "--allow-overcommit", help="Simulate capacities, devices or RAM the profile does not have (else refused)."
    ),
    out: Path = typer.Option(Path("casmoe-sim"), help="Report folder: results.json, results.csv, PNG plots."),
    timeline: Optional[Path] = typer.Option(None, help="Write a Chrome/Perfetto trace (of the first run) here."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON records instead of a table."),
    plots: Plots = PLOTS,
    arrival: Optional[str] = typer.Option(
        None, help="Serve requests as they arrive: poisson (needs --rate) or trace (the trace's arrival times)."
    ),
    rate: Optional[float] = typer.Option(None, min=0.0, help="Poisson arrivals, requests per second."),
    users: Optional[int] = typer.Option(
        None, min=1, help="A closed loop of N users: each waits for its answer, thinks --think s, asks again."
    ),
    think: float = typer.Option(0.0, min=0.0, help="Closed loop: seconds between an answer and the next request."),
    max_batch: int = typer.Option(8, min=1, help="Serving: most requests decoded together (continuous batching)."),
    schedule: str = typer.Option(
        "prefill-first", help="Serving: prefill-first (a new prompt runs alone, first) or chunked (prompt chunks join decode steps)."
    ),
    chunk: int = typer.Option(512, min=1, help="Serving, chunked: tokens per step (decode tokens + a prompt chunk)."),
    seed: int = typer.Option(0, help="Seed of the Poisson arrivals."),
    host_cache: Optional[str] = typer.Option(
        None, "--host-cache", help="RAM tier between storage and the GPUs: memory (40GB) or experts; default: every expert in RAM "
        "if they fit the profile's host RAM, else a RAM tier of all of it."
    ),
    host_policy: str = typer.Option("lru", help="Policy managing the RAM tier (any that does not read the future)."),
    timeliness: bool = typer.Option(
        False, "--timeliness", help="Also print stall vs the perfect-prefetch bound, late hits and wasted prefetches."
    ),
    adaptive_gating: Optional[float] = ADAPTIVE_GATING,
) -> None:
    """Simulate policies on modelled hardware: latency, throughput, stalls, bytes moved.

    With --arrival or --users, requests arrive over time and are served with continuous
    batching: TTFT, time per output token and end-to-end latency percentiles, throughput, queue.

    With no arguments: the first requests of the shipped default trace on rtx4090x4 with the
    preset of its model, every policy, at cache sizes the box holds; prints the fastest policy
    per cache size and a policies x sizes table of decode tokens/s, writes every measurement to
    --out.
    """
    from casmoe.output import check_dir_target, check_file_target
    from casmoe.shipped import shipped
    from casmoe.sim.api import simulate as run

    check_dir_target(out, "--out")
    source = trace or shipped(DEFAULT_TRACE)
    if timeline is not None:
        check_file_target(timeline, "--timeline", create_parent=True)
        if timeline.resolve() == Path(source).resolve():
            raise CasmoeError(f"--timeline {timeline} is the trace being simulated; write the timeline elsewhere")
    bar = None

    def advance(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = progress(total=total, desc="simulate", unit="run", quiet=as_json or total < 2)
        bar.update(1)

    res = run(
        trace, policy, capacity, global_capacities=global_capacity, model=model, hardware=hardware, batch=batch,
        miss_mode=miss_mode, quant=quant, devices=devices, pinned=not pageable, requests=requests, split=split,
        tasks=task or (), span=span or "", arrival=arrival, rate=rate, users=users, think=think, max_batch=max_batch,
        schedule=schedule, chunk=chunk, seed=seed, host_cache=host_cache, host_policy=host_policy,
        allow_overcommit=allow_overcommit, adaptive_gating=adaptive_gating, timeline=timeline, progress=advance,
    )
    if bar is not None:
        bar.close()
    plan = res.plan
    if not as_json:
        typer.echo(plan.describe())
        for note in plan.notes:
            typer.echo(note)
    workload = plan.points[0].workload
    _report(out, res.records, as_json, f"{plan.preset.name} on {plan.box()}", timeline,
            f"serving {workload.describe()}" if workload else "", timeliness, plots)


@app.command()
def sweep(
    config: Optional[Path] = typer.Argument(None, help="Sweep TOML (keys: traces, models, hardware, policies, capacities, ...)."),
    trace: Optional[list[Path]] = typer.Option(None, help="Trace(s), repeatable (instead of / on top of the TOML)."),
    model: Optional[list[str]] = typer.Option(None, help="Model preset(s), repeatable."),
    hardware: Optional[list[str]] = typer.Option(None, help="Hardware profile(s) or TOML paths, repeatable."),
    policy: Optional[list[str]] = typer.Option(None, help="Policies NAME or NAME[key=value,...], repeatable; 'all'."),
    capacity: Optional[list[str]] = typer.Option(None, help="Capacities per layer in slots or memory (6GB), repeatable."),
    global_capacity: Optional[list[str]] = typer.Option(None, help="Global-pool capacities, repeatable."),
    batch: Optional[list[int]] = typer.Option(None, help="Batch sizes, repeatable."),
    requests: Optional[int] = choose.requests_option(""),
    split: Optional[str] = typer.Option(None, help=choose.SPLIT.help),
    task: Optional[list[str]] = choose.TASK,
    span: Optional[str] = choose.RANGE,
    allow_overcommit: bool = typer.Option(
        False, "--allow-overcommit", help="Simulate capacities, devices or RAM the profiles do not have (else skipped)."
    ),
    rate: Optional[list[float]] = typer.Option(
        None, min=0.0, help="Poisson arrival rates (requests/s), repeatable: a grid axis; plots latency vs load."
    ),
    max_batch: Optional[int] = typer.Option(None, min=1, help="Serving: most requests decoded together."),
    out: Path = typer.Option(Path("casmoe-sweep"), help="Output folder; finished points are kept and skipped on re-runs."),
    jobs: int = JOBS,
    ray: bool = RAY,
    ray_address: Optional[str] = RAY_ADDRESS,
    adaptive_gating: Optional[float] = ADAPTIVE_GATING,
    as_json: bool = typer.Option(False, "--json", help="Print JSON records instead of a table."),
    plots: Plots = PLOTS,
) -> None:
    """Run a grid of simulations in parallel; results merge into one table (results.csv)."""
    from casmoe.policies import POLICIES
    from casmoe.shipped import shipped
    from casmoe.policies import parse_policies
    from casmoe.options import capacity_specs
    from casmoe.sim.sweep import Grid, run_grid

    from casmoe.output import check_dir_target

    check_dir_target(out, "--out")
    grid = Grid.from_toml(config) if config else Grid([], [], [], [], [])
    if trace:
        grid.traces += [str(t) for t in trace]
    if model:
        grid.models += model
    if hardware:
        grid.hardware += hardware
    if policy:
        grid.policies += parse_policies(policy, POLICIES)
    grid.capacities += capacity_specs(capacity, global_capacity)
    if batch:
        grid.batch = batch
    if requests is not None:
        grid.requests = requests
    if split is not None:
        grid.split = split
    if task:
        grid.tasks = task
    if span is not None:
        grid.range = span
    grid.allow_overcommit = grid.allow_overcommit or allow_overcommit
    if rate:
        grid.rates = rate
    if max_batch is not None:
        grid.max_batch = max_batch
    if adaptive_gating is not None:
        grid.adaptive_gating = adaptive_gating
    grid.fill_defaults(str(shipped(DEFAULT_TRACE)))
    points = grid.points()
    bar = progress(total=len(points), desc="sweep", unit="run", quiet=as_json)

    def advance(done: int, total: int) -> None:
        if done == 0:
            bar.update(len(points) - total)  # already stored
            if total < len(points):
                bar.set_postfix_str(f"{len(points) - total} stored")
        else:
            bar.update(1)

    address = ray_target(ray, ray_address)
    records, computed = run_grid(points, out, jobs=jobs, ray_address=address, progress=advance)
    bar.close()
    if records and all("skipped" in r for r in records):  # nothing to report: a refusal, not an empty table
        first = records[0]
        raise CasmoeError(f"no point of the sweep could be simulated; {first['policy']} @ {first['capacity_spec']}: "
                          f"{first['skipped']}")
    _report(out, records, as_json, f"sweep: {len(points)} points, {computed} computed now", None,
            "serving" if any("arrival" in r for r in records) else "", False, plots)


@app.command()
def presets(
    as_json: bool = typer.Option(False, "--json", help="Print the presets' full geometry as JSON."),
) -> None:
    """List the model presets (`--model NAME`): the geometry and dense shape each run prices."""
    from casmoe.geometry import Quant
    from casmoe.presets import PRESETS_FILE, load_presets

    loaded = load_presets()
    if as_json:
        typer.echo(json.dumps({n: {"source": p.source, **p.geometry.to_dict()} for n, p in loaded.items()}, indent=2))
        return
    from casmoe.report import human_bytes, print_table

    rows = [
        {
            "name": name,
            "layers": p.geometry.layers,
            "experts": p.geometry.experts,
            "top_k": p.geometry.top_k,
            "shared": p.geometry.shared_experts,
            "hidden": p.geometry.hidden,
            "experts bf16": human_bytes(sum(p.geometry.bytes_per_layer(Quant.BF16)) * p.geometry.experts),
        }
        for name, p in loaded.items()
    ]
    print_table(rows, list(rows[0]), title="model presets")
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

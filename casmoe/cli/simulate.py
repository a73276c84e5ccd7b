"""`casmoe simulate`, `casmoe sweep`, `casmoe profiles`: the simulator's what-if commands.

The simulator is imported inside the commands (simpy and numpy load only when used).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from casmoe.cli.app import app
from casmoe.errors import CasmoeError

COLUMNS = {
    "policy": ("policy", 1),
    "capacity": ("capacity", 1),
    "capacity_gb": ("cache GB", 1),
    "decode_tokens_per_s": ("tok/s", 1),
    "token_latency_p50_s": ("p50 ms", 1e3),
    "token_latency_p99_s": ("p99 ms", 1e3),
    "ttft_mean_s": ("TTFT s", 1),
    "hit_rate": ("hit rate", 1),
    "late_hits": ("late", 1),
    "stall_demand_s": ("miss stall s", 1),
    "stall_late_s": ("late stall s", 1),
    "prefetch_wasted": ("wasted", 1),
    "link_bytes": ("GB moved", 1e-9),
}
"""Result key -> (table heading, scale) for the printed summary."""


def _print_results(records: list[dict[str, Any]], title: str) -> None:
    from casmoe.report import print_table

    def cell(v: Any, scale: float) -> Any:
        return v if isinstance(v, str) else v * scale

    rows = [
        {head: cell(r[key], scale) for key, (head, scale) in COLUMNS.items()}
        for r in records
        if "skipped" not in r
    ]
    print_table(rows, [head for head, _ in COLUMNS.values()], title=title)


def _write_report(out: Path, records: list[dict[str, Any]]) -> list[Path]:
    """results.json, results.csv and the two PNG plots."""
    from casmoe.report import plot_latency_vs_capacity, plot_stall_by_layer, write_csv, write_json

    ran = [r for r in records if "skipped" not in r]
    write_json(out / "results.json", records)
    write_csv(out / "results.csv", ran)
    written = [out / "results.json", out / "results.csv"]
    if ran:
        written.append(plot_latency_vs_capacity(out / "latency_vs_capacity.png", ran))
        smallest = min(r["capacity_gb"] for r in ran)
        written.append(plot_stall_by_layer(out / "stall_by_layer.png", [r for r in ran if r["capacity_gb"] == smallest]))
    return written


def _write_serving_report(out: Path, records: list[dict[str, Any]]) -> list[Path]:
    """timeliness.png (stall vs the perfect-prefetch bound per layer, smallest cache), and for
    serving runs queue.png (requests waiting over time) and, across rates, latency_vs_load.png."""
    from casmoe.report import plot_latency_vs_load, plot_queue, plot_timeliness

    ran = [r for r in records if "skipped" not in r]
    if not ran:
        return []
    smallest = min(r["capacity_gb"] for r in ran)
    written = [plot_timeliness(out / "timeliness.png", [r for r in ran if r["capacity_gb"] == smallest])]
    served = [r for r in ran if "arrival" in r]
    if served:
        written.append(plot_queue(out / "queue.png", [r for r in served if r["capacity_gb"] == smallest]))
    if len({r.get("rate") for r in served}) > 1:
        written.append(plot_latency_vs_load(out / "latency_vs_load.png", served))
    return written


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
    trace: Optional[Path] = typer.Option(None, help="Trace (.npz); default: the shipped synthetic Mixtral trace."),
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
    requests: Optional[int] = typer.Option(
        None, min=0, help="Simulate only the first N requests (0: all). Default: 12 for the shipped trace, else all."
    ),
    out: Path = typer.Option(Path("casmoe-sim"), help="Report folder: results.json, results.csv, PNG plots."),
    timeline: Optional[Path] = typer.Option(None, help="Write a Chrome/Perfetto trace (of the first run) here."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON records instead of a table."),
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
        None, "--host-cache", help="RAM tier between storage and the GPUs: memory (40GB) or experts; default: all experts in RAM."
    ),
    host_policy: str = typer.Option("lru", help="Policy managing the RAM tier (any that does not read the future)."),
    timeliness: bool = typer.Option(
        False, "--timeliness", help="Also print stall vs the perfect-prefetch bound, late hits and wasted prefetches."
    ),
) -> None:
    """Simulate policies on modelled hardware: latency, throughput, stalls, bytes moved.

    With --arrival or --users, requests arrive over time and are served with continuous
    batching: TTFT, time per output token and end-to-end latency percentiles, throughput, queue.

    With no arguments: the shipped Mixtral-shaped trace (first 12 requests) on rtx4090x4 with
    the mixtral-8x7b preset, every policy, at cache sizes the box holds.
    """
    from tqdm import tqdm

    from casmoe.options import CapacitySpec, capacity_specs, parse_miss_mode, parse_quant
    from casmoe.policies import POLICIES
    from casmoe.presets import get_preset
    from casmoe.shipped import DEFAULT_TRACE, shipped
    from casmoe.sim.engine import check_geometry, expert_bytes_for, max_slots
    from casmoe.sim.hardware import load_profile
    from casmoe.policies import parse_policies
    from casmoe.sim.serving import Workload
    from casmoe.sim.sweep import Point, file_digest, preset_for, run_point
    from casmoe.sim.tiers import HostCache
    from casmoe.sim.timeline import Timeline
    from casmoe.trace import Trace

    from casmoe.output import check_dir_target, check_file_target

    check_dir_target(out, "--out")
    if timeline is not None:
        check_file_target(timeline, "--timeline", create_parent=True)
    path = trace or shipped(DEFAULT_TRACE)
    tr = Trace.load(path)
    if requests is None:
        requests = 12 if trace is None else 0
    preset = get_preset(preset_for(tr, model))
    check_geometry(tr.geometry, preset)
    hw = load_profile(hardware)
    n_dev = devices or hw.gpus
    q = parse_quant(quant)
    miss_mode = parse_miss_mode(miss_mode).value
    nbytes = expert_bytes_for(tr, preset, q)
    workload = Workload.from_options(arrival, rate, users, think, max_batch, schedule, chunk, seed)
    if workload is not None and batch != 1:
        raise CasmoeError("--batch makes static batches of back-to-back requests; with --arrival or --users use --max-batch")
    if workload is not None:
        workload.arrival_times(tr.requests)  # --arrival trace on a trace without times fails here
    if host_cache is not None:  # a RAM tier that cannot work fails here, before any run
        HostCache.parse(host_cache, host_policy, nbytes).build(tr.geometry, nbytes, hw)
    fit = max_slots(hw, preset, nbytes, n_dev)
    k = tr.geometry.top_k
    caps = capacity_specs(capacity, global_capacity)
    for c in caps:
        slots = c.resolve(nbytes).slots
        if (slots if c.per_layer else slots / tr.geometry.layers) > fit and not as_json:
            typer.echo(f"note: capacity {c.text} exceeds the {fit} experts/layer that fit in GPU memory; simulated anyway")
    if not caps:
        if fit < k:
            raise CasmoeError(
                f"{hw.name} x{n_dev} holds {fit} experts per layer beside the dense weights, below top_k={k}; "
                "use more --devices, a smaller --quant, bigger hardware, or give --capacity for a what-if"
            )
        sizes = sorted({k, *(s for s in (2 * k, 3 * k, 4 * k) if s < fit), fit})
        caps = [CapacitySpec(str(s)) for s in sizes]
    specs = parse_policies(policy, POLICIES)
    digest = file_digest(path)
    points = [
        Point(str(path), preset.name, hardware, p, c, batch, miss_mode, n_dev, quant or "", not pageable, requests, digest,
              workload=workload, host_cache=host_cache or "", host_policy=host_policy)
        for c in caps
        for p in specs
    ]
    shown = tr.subset(range(min(requests, len(tr.requests)))) if requests else tr
    if not as_json:
        note = f" (first {len(shown.requests)} of {len(tr.requests)} requests; --requests 0 for all)" if requests else ""
        typer.echo(
            f"{path.name}{note}: {shown.tokens} tokens on {hw.name} x{n_dev}, model {preset.name}; "
            f"up to {fit} experts/layer fit in GPU memory"
        )
    records = []
    skipped = []
    recorder = None
    if timeline is not None:
        recorder = Timeline(tr.geometry.experts, n_dev, f"{points[0].policy.label} @ {points[0].capacity.text}")
    for i, p in enumerate(tqdm(points, desc="simulate", unit="run", disable=as_json or len(points) < 2)):
        try:
            rec = run_point(p, recorder if i == 0 else None)
        except CasmoeError as exc:
            if len(points) == 1:
                raise
            skipped.append(f"{p.policy.label} @ {p.capacity.text}: {exc}")
            records.append({**p.describe(), "skipped": str(exc)})
            continue
        records.append(rec)
    if recorder is not None:
        recorder.write(timeline)
    written = _write_report(out, records) + _write_serving_report(out, records)
    if as_json:
        typer.echo(json.dumps(records, indent=2))
        return
    _print_results(records, f"{preset.name} on {hw.name} x{n_dev}")
    _print_serving(records, f"serving {workload.describe()}" if workload else "", timeliness)
    for s in skipped:
        typer.echo(f"skipped {s}")
    typer.echo("wrote " + ", ".join(str(w) for w in written) + (f", {timeline}" if timeline else ""))



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
    requests: Optional[int] = typer.Option(None, min=0, help="Only the first N requests of each trace (0: all)."),
    rate: Optional[list[float]] = typer.Option(
        None, min=0.0, help="Poisson arrival rates (requests/s), repeatable: a grid axis; plots latency vs load."
    ),
    max_batch: Optional[int] = typer.Option(None, min=1, help="Serving: most requests decoded together."),
    out: Path = typer.Option(Path("casmoe-sweep"), help="Output folder; finished points are kept and skipped on re-runs."),
    jobs: int = typer.Option(2, min=1, help="Parallel local processes (or Ray CPUs for a local Ray)."),
    ray: bool = typer.Option(False, "--ray", help="Run the points on Ray (a local Ray unless --ray-address)."),
    ray_address: Optional[str] = typer.Option(None, help="Ray cluster address (e.g. ray://head:10001); implies --ray."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON records instead of a table."),
) -> None:
    """Run a grid of simulations in parallel; results merge into one table (results.csv)."""
    from tqdm import tqdm

    from casmoe.policies import POLICIES
    from casmoe.shipped import DEFAULT_TRACE, shipped
    from casmoe.policies import default_policies, parse_policies
    from casmoe.options import CapacitySpec, capacity_specs
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
    if rate:
        grid.rates = rate
    if max_batch is not None:
        grid.max_batch = max_batch
    grid.traces = grid.traces or [str(shipped(DEFAULT_TRACE))]
    grid.models = grid.models or ["mixtral-8x7b"]
    grid.hardware = grid.hardware or ["rtx4090x4"]
    grid.policies = grid.policies or default_policies(POLICIES)
    grid.capacities = grid.capacities or [CapacitySpec("4")]
    points = grid.points()
    bar = tqdm(total=len(points), desc="sweep", unit="run", disable=as_json)

    def progress(done: int, total: int) -> None:
        if done == 0:
            bar.update(len(points) - total)  # already stored
            if total < len(points):
                bar.set_postfix_str(f"{len(points) - total} stored")
        else:
            bar.update(1)

    address = ray_address or ("local" if ray else None)
    records, computed = run_grid(points, out, jobs=jobs, ray_address=address, progress=progress)
    bar.close()
    _write_report(out, records)
    _write_serving_report(out, records)
    if as_json:
        typer.echo(json.dumps(records, indent=2))
        return
    _print_results(records, f"sweep: {len(points)} points, {computed} computed now")
    if any("arrival" in r for r in records):
        _print_serving(records, "serving", False)
    for r in records:
        if "skipped" in r:
            typer.echo(f"skipped {r['policy']} @ {r['capacity_spec']}: {r['skipped']}")
    typer.echo(f"wrote {out}/results.csv ({len(records)} rows)")


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

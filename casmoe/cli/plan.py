"""`casmoe plan`: the engine configuration to run, with its memory map and expected speed.

The simulator is imported inside the command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from casmoe.cli.app import JOBS, RAY, RAY_ADDRESS, app, progress, ray_target
from casmoe.cli.flags import run_options

if TYPE_CHECKING:
    from casmoe.sim.run.grid import Grid

ENGINE_HELP = "Engine to plan for, repeatable: llama.cpp, ktransformers, vllm, sglang, casmoe; default: all five."


@app.command()
@run_options("box", exclude=("devices", "pinned", "host_cache", "host_policy", "allow_overcommit"))
def plan(
    grid: Grid,
    model: str = typer.Option(..., help="Model preset (`casmoe presets`), or a checkpoint's config.json or folder."),
    engine: Optional[list[str]] = typer.Option(None, help=ENGINE_HELP),
    context: int = typer.Option(8192, min=1, help="Context to serve per sequence, in tokens."),
    concurrency: int = typer.Option(1, min=1, help="Sequences served at once (each with a full context)."),
    trace: Optional[Path] = typer.Option(None, help="Your routing trace (.npz; `casmoe trace import` makes one); "
                                                     "default: the shipped routing of the model's shape."),
    precision: Optional[str] = typer.Option(None, help="Expert precision (bf16, mxfp4, q4_k_m, q8_0, ...); default: "
                                                       "the checkpoint's own."),
    gpu_precision: Optional[str] = typer.Option(None, help="Precision of the experts kept on the GPUs (default: "
                                                           "--precision)."),
    host_precision: Optional[str] = typer.Option(None, help="Precision of the host's experts (default: the GPU's)."),
    dense_precision: Optional[str] = typer.Option(None, help="Precision of the dense part (default: the checkpoint's)."),
    gpu_memory: Optional[list[float]] = typer.Option(None, help="GiB of each GPU, repeatable, one per GPU, for boxes "
                                                                "whose GPUs differ (default: the profile's)."),
    threads: int = typer.Option(0, min=0, help="Host threads for the experts: physical cores (0: from the profile)."),
    numa_nodes: int = typer.Option(0, min=0, help="Host NUMA nodes (0: the profile's sockets)."),
    weights: str = typer.Option("", help="What the engines load (a GGUF file, a checkpoint folder or a Hugging Face "
                                         "id); default: named after the model."),
    requests: int = typer.Option(16, min=1, help="Held-out requests each configuration is simulated on."),
    compare: bool = typer.Option(True, "--compare/--no-compare", help="Also hold the routing-aware placements to "
                                                                      "llama.cpp's --n-cpu-moe at equal memory."),
    out: Path = typer.Option(Path("casmoe-plan"), help="Output folder: plan.json, candidates.csv, one .sh per "
                                                       "configuration, the files they read; simulated points are kept."),
    jobs: int = JOBS,
    ray: bool = RAY,
    ray_address: Optional[str] = RAY_ADDRESS,
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON instead of tables."),
) -> None:
    """Print, for each engine, the configuration to run (its command line, and the files it
    reads), its memory map (per GPU: dense weights, KV cache at --context x --concurrency,
    expert slots, runtime reserve; host RAM per NUMA node; what does not fit and why) and its
    expected prefill and decode tokens/s, with the runners-up. Which experts stay on the GPU is
    chosen from the routing (your --trace, else the shipped one of the model's shape), fitted
    on its train split and scored on its held-out requests. Every flag is one the engine's own
    source has at the version named (casmoe/engines/)."""
    from casmoe.cli.figures import draw_plan
    from casmoe.output import check_dir_target
    from casmoe.sim.questions.deploy import PlanRequest
    from casmoe.sim.questions.deploy.engines import ENGINES
    from casmoe.sim.questions.deploy.model import resolve_model
    from casmoe.sim.box.hardware import variant_spec

    check_dir_target(out, "--out")
    engines = tuple(dict.fromkeys(engine or ENGINES))
    choice = resolve_model(model)
    boxes = [variant_spec(hw, link or "", ram, gpus) for hw in grid.values("hardware") for gpus in grid.values("gpus")
             for link in grid.values("link") for ram in grid.values("host_ram")]
    summaries = []
    for i, box in enumerate(dict.fromkeys(boxes)):
        req = PlanRequest(choice.preset, box, engines, context, concurrency, str(trace) if trace else None,
                          gpu_precision or precision, host_precision or gpu_precision or precision, dense_precision,
                          tuple(gpu_memory or ()), threads, numa_nodes, requests, weights or choice.weights, compare)
        folder = out if len(boxes) == 1 else out / _safe(box)
        result = _run(req, folder, jobs, ray_target(ray, ray_address), as_json)
        if choice.note:
            result.notes.insert(0, choice.note)
        summary = _write(result, folder)
        draw_plan(folder)  # plan_memory.png and plan_speed.png, from plan.json alone
        summaries.append(summary)
        if not as_json:
            _print(result, folder)
    if as_json:
        typer.echo(json.dumps(summaries[0] if len(summaries) == 1 else summaries, indent=2))


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(name).name)


def _run(req: Any, folder: Path, jobs: int, ray_address: Optional[str], quiet: bool) -> Any:
    from casmoe.backends.adapters import ADAPTERS
    from casmoe.sim.questions.deploy import make_plan

    bar = progress(total=0, desc="plan", unit="run", quiet=quiet)

    def advance(done: int, total: int) -> None:
        if done == 0:
            bar.reset(total=total)
        else:
            bar.update(1)

    def say(text: str) -> None:
        if not quiet:
            typer.echo(text, err=True)

    try:
        return make_plan(req, folder, jobs=jobs, ray_address=ray_address, progress=advance, say=say,
                         families=tuple(ADAPTERS))
    finally:
        bar.close()


def _write(result: Any, folder: Path) -> dict[str, Any]:
    from casmoe.output import write_text

    summary = result.to_dict()
    write_text(folder / "plan.json", json.dumps(summary, indent=2))
    rows = [c.row() for c in result.candidates()]
    write_text(folder / "candidates.json", json.dumps(rows, indent=2))
    if rows:
        import csv
        import io

        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        write_text(folder / "candidates.csv", buf.getvalue())
    return summary


def _speed_line(c: Any, context: int) -> str:
    s = c.speed
    if s is None or s.decode is None:
        return f"expected speed: {s.how if s else 'not simulated'}"
    band = f" ({s.band[0]:.3g}-{s.band[1]:.3g})" if s.band else ""
    parts = [f"decode {s.decode:.3g} tok/s{band}"]
    if s.decode_at_context:
        parts.append(f"{s.decode_at_context:.3g} tok/s at a full {context}-token context")
    if s.prefill:
        parts.append(f"prefill {s.prefill:.3g} tok/s (short prompts)")
    return "expected: " + ", ".join(parts) + f"; {s.uncertainty}; {s.how}" + (f" ({s.evidence})" if s.evidence else "")


def _print(result: Any, folder: Path) -> None:
    from casmoe.report import print_table

    r = result.request
    b = result.box
    typer.echo(f"{result.preset.name} on {r.hardware}: {b.gpus} GPU{'s' * (b.gpus > 1)} "
               f"({', '.join(f'{g:g}' for g in b.gpu_gib)} GiB), {b.host_ram_gib:g} GiB host RAM, "
               f"{b.numa_nodes} NUMA node{'s' * (b.numa_nodes > 1)}, {b.threads or 'unknown'} threads; "
               f"context {r.context} x {r.concurrency}; {result.precisions.describe()}")
    for note in result.notes:
        typer.echo(f"  {note}")
    for e in result.engines:
        c = e.best
        typer.echo("")
        typer.echo(f"== {e.engine} (flags as read in its source: {e.version})")
        if c is None:
            typer.echo("  no configuration")
            continue
        verdict = "fits" if c.fits else "DOES NOT FIT"
        typer.echo(f"  best: {c.label} [{verdict}]")
        for step in c.prepare:
            typer.echo("  once:\n    " + step.text().replace("\n", "\n  "))
        typer.echo("  run:\n    " + c.command.text().replace("\n", "\n  "))
        if c.files:
            typer.echo("  files: " + "; ".join(f"{folder / n} ({w})" for n, w in c.files.items()))
        print_table(c.placement.memory.rows(), ["where", "total", "reserve", "dense", "embeddings", "kv cache",
                                                "experts", "free"], f"memory map, GiB ({e.engine}: {c.label})")
        for p in c.placement.memory.problems:
            typer.echo(f"  does not fit: {p}")
        typer.echo("  " + _speed_line(c, r.context))
        for note in [*c.placement.memory.notes, *c.notes]:
            typer.echo(f"  - {note}")
        if e.others:
            print_table([o.row() for o in e.others], ["configuration", "fits", "gpu_experts", "decode_tok_s",
                                                      "decode_at_context_tok_s", "prefill_tok_s", "how"],
                        f"{e.engine}: runners-up")
    comp = result.comparison
    if comp is not None:
        typer.echo("")
        print_table(list(comp.rows), ["placement", "split", "policy", "decode_tok_s", "scored"],
                    f"routing-aware vs llama.cpp's --n-cpu-moe at equal memory ({comp.gpu_layers} layers' experts, "
                    f"{comp.gpu_experts} experts on the GPU)")
        gains = comp.to_dict()["gains"]
        typer.echo("  " + "; ".join(f"{k}: {'n/a' if v is None else f'{v:+.1%}'}" for k, v in gains.items()))
        typer.echo(f"  reproduce: {comp.command}")
    if result.published:
        typer.echo("")
        print_table(result.published, ["engine", "metric", "value", "setting", "box", "id"],
                    "published measurements of this model on these engines (casmoe/sim/trust/published/measurements.toml)")
    typer.echo(f"\nplan in {folder}/plan.json, candidates in {folder}/candidates.csv, commands in {folder}/*.sh; "
               f"simulated {result.simulated} points now (kept in {folder}/points)")

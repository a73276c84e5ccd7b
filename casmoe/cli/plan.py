"""`casmoe plan`: the engine configuration to run, with its memory map and expected speed.

The simulator is imported inside the command.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from casmoe.cli.app import JOBS, RAY, RAY_ADDRESS, app, progress, ray_target
from casmoe.cli.flags import run_options
from casmoe.cli.reporting import PLOTS, Plots, draw_as

if TYPE_CHECKING:
    from casmoe.sim.run.grid import Grid

ENGINE_HELP = ("Engine to plan for, repeatable: llama.cpp, ktransformers, vllm, sglang, casmoe; default: all five "
               "(on a box without a GPU, llama.cpp runs the model on the CPU and the others say why they do not).")
DETECTED = "detected-box.toml"
"""The profile of the machine a plan ran on, written beside the plan when no --hardware was given."""
BOX_FIELDS = (("gpus", "GPUs"), ("memory_gib", "GiB per GPU"), ("h2d_pinned_gbs", "host link GB/s"),
              ("host_ram_gib", "host RAM GiB"), ("cpu_cores", "CPU cores"), ("cpu_sockets", "sockets (NUMA nodes)"),
              ("cpu_mem_bw_gbs", "host memory GB/s"), ("cpu_tflops", "host TFLOPS"),
              ("storage_read_gbs", "storage read GB/s"))
"""The detected numbers a plan shows with how each was obtained (read, measured, assumed)."""


@app.command()
@run_options("box", exclude=("devices", "pinned", "host_cache", "host_policy", "allow_overcommit", "cpu_threads", "numa"),
             helps={
    "hardware": "Hardware profile (`casmoe hardware list`) or TOML path, repeatable; variants: "
                "NAME@gpus=2,link=pcie5,host_ram_gib=64. Default: this machine, detected (`casmoe hardware detect`; "
                f"the profile is written to --out/{DETECTED}, each number marked read, measured or assumed).",
    "stack": "Software stack of the one --engine planned: your own runtime's costs (`casmoe stacks`, or a TOML "
             "path). Default: each engine's own (llama.cpp, ktransformers, vllm; SGLang and casmoe on ideal, an "
             "upper bound).",
})
def plan(
    grid: Grid,
    model: str = typer.Option(..., help="The model: your GGUF file (its every tensor read from the header), a "
                                         "preset (`casmoe presets`), a checkpoint's config.json or folder, or a "
                                         "Hugging Face id (org/name)."),
    engine: Optional[list[str]] = typer.Option(None, help=ENGINE_HELP),
    context: int = typer.Option(8192, min=1, help="Context to serve per sequence, in tokens: the KV cache holds it and "
                                                  "each simulated request is served at it."),
    concurrency: int = typer.Option(1, min=1, help="Sequences served at once (each with a full context)."),
    trace: Optional[Path] = typer.Option(None, help="Your routing trace (.npz; `casmoe trace import` makes one); "
                                                     "default: the shipped routing of the model's shape."),
    precision: Optional[str] = typer.Option(None, help="Expert precision to plan (q4_k_m, q8_0, mxfp4_moe, bf16, fp8, "
                                                       "...); default: compare those users download (GGUF: Q8_0, Q6_K, "
                                                       "Q5_K_M, Q4_K_M, IQ4_XS, Q3_K_M and the model's own) and pick "
                                                       "the fastest at or above --quality-floor. A GGUF --model is "
                                                       "its own precision."),
    gpu_precision: Optional[str] = typer.Option(None, help="Precision of the experts kept on the GPUs (llama.cpp: "
                                                           "one GGUF made by llama-quantize --tensor-type)."),
    host_precision: Optional[str] = typer.Option(None, help="Precision of the host's experts (default: the GPU's)."),
    quality_floor: Optional[str] = typer.Option(None, help="The lowest quality a compared precision may have, as a "
                                                           "llama-quantize type whose published KL divergence it must "
                                                           "not exceed (casmoe/engines/quant_quality.toml), or none; "
                                                           "default: q4_k_m."),
    gpu_memory: Optional[list[float]] = typer.Option(None, help="GiB of each GPU, repeatable, one per GPU, for boxes "
                                                                "whose GPUs differ (default: the profile's)."),
    threads: int = typer.Option(0, min=0, help="Host threads for the experts (llama.cpp -t, --kt-cpuinfer), priced "
                                               "as such (0: one per physical core of the profile)."),
    weights: str = typer.Option("", help="The checkpoint the engines load (a folder or a Hugging Face id) when it "
                                         "is not the one --model names."),
    requests: int = typer.Option(16, min=1, help="Held-out requests each configuration is simulated on."),
    compare: bool = typer.Option(True, "--compare/--no-compare", help="Also hold the routing-aware placements to "
                                                                      "llama.cpp's --n-cpu-moe at equal memory."),
    out: Path = typer.Option(Path("casmoe-plan"), help="Output folder: plan.json, candidates.csv, one .sh per "
                                                       "configuration, the files they read; simulated points are kept."),
    jobs: int = JOBS,
    ray: bool = RAY,
    ray_address: Optional[str] = RAY_ADDRESS,
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON instead of tables."),
    plots: Plots = PLOTS,
) -> None:
    """Print, for each engine, the configuration to run (its command line, the steps that make
    what it loads, and the files it reads), its memory map (per GPU: dense weights, KV cache at
    --context x --concurrency, expert slots, the engine's reserve; host RAM per NUMA node; what
    does not fit and why) and its expected prefill and decode tokens/s, with the runners-up.
    Without --hardware the box is this machine, detected. Without --precision the precisions users
    download are compared. Which experts stay on the GPU is chosen from the routing (your --trace,
    else the shipped one of the model's shape), fitted on its train split and scored on its
    held-out requests. Every flag is one the engine's own source has at the version named
    (casmoe/engines/), and an engine that cannot run the model says why in one line."""
    from casmoe.output import check_dir_target
    from casmoe.sim.box.hardware import variant_spec
    from casmoe.sim.questions.deploy import PlanRequest
    from casmoe.sim.questions.deploy.engines import ENGINES

    check_dir_target(out, "--out")
    engines = tuple(dict.fromkeys(engine or ENGINES))
    detected = None
    hardware = grid.given.get("hardware")
    if not hardware:
        detected = _detect(out, as_json)
        hardware = (str((out / DETECTED).resolve()),)
    boxes = list(dict.fromkeys(variant_spec(hw, link or "", ram, gpus) for hw in hardware for gpus in grid.values("gpus")
                               for link in grid.values("link") for ram in grid.values("host_ram")))
    folders = _folders(boxes, out)
    stacks = grid.values("stack")
    if len(stacks) > 1:
        from casmoe.sim.questions.deploy import PlanError

        raise PlanError(f"--stack is given {len(stacks)} times; plan prices one engine on one stack")
    summaries = []
    for box, folder in zip(boxes, folders):
        req = PlanRequest(model, box, engines, context, concurrency, str(trace) if trace else None, precision,
                          gpu_precision, host_precision, quality_floor, tuple(gpu_memory or ()), threads, requests,
                          weights, compare, stacks[0])
        result = _run(req, folder, jobs, ray_target(ray, ray_address), as_json)
        summary = _write(result, folder, detected)
        pending = _draw(folder, plots)
        summaries.append(summary)
        if not as_json:
            _print(result, folder, detected)
            if pending:
                typer.echo(pending)
    if as_json:
        typer.echo(json.dumps(summaries[0] if len(summaries) == 1 else summaries, indent=2))


STAMP = ".figures-of"
"""Beside the pictures: the digest of the plan.json they were drawn from."""


def _to_draw(folder: Path) -> tuple[list[str], str]:
    """The pictures plan.json has, and the digest of what they show (plan.json but for its
    bookkeeping); no pictures when those in the folder were drawn from that same content."""
    from casmoe.cli.figures import plan_pictures

    summary = json.loads((folder / "plan.json").read_text())
    shown = {k: v for k, v in summary.items() if k != "simulated_now"}
    digest = hashlib.sha256(json.dumps(shown, sort_keys=True).encode()).hexdigest()
    names = plan_pictures(summary)
    stamp = folder / STAMP
    if stamp.exists() and stamp.read_text() == digest and all((folder / n).exists() for n in names):
        return [], digest
    return names, digest


def draw_pictures(folder: Path) -> None:
    """plan_memory.png and plan_speed.png, from plan.json alone; not again when what they show is
    what they were drawn from (a repeated plan: about two seconds of drawing saved)."""
    from casmoe.cli.figures import draw_plan

    names, digest = _to_draw(folder)
    if names:
        draw_plan(folder)
        (folder / STAMP).write_text(digest)


def _draw(folder: Path, plots: Plots) -> str:
    """The pictures as --plots asks (none, now, or by a detached process); the line to print."""
    names = [] if plots is Plots.NONE else _to_draw(folder)[0]
    return draw_as(plots, "plan", folder, names, lambda: draw_pictures(folder))


def _detect(out: Path, quiet: bool) -> Any:
    """This machine's profile (`casmoe hardware detect`), written to `out/detected-box.toml`. A
    profile this plan folder already holds is kept when every number read from the machine is
    the same again: its measured ones (host bandwidth, a probe whose result varies run to run)
    stand, so a repeated plan prices the same box and reuses its points."""
    from dataclasses import replace

    from casmoe.sim.box.detect import Detected, detect_profile
    from casmoe.sim.box.hardware import HardwareError, HardwareProfile

    path = out / DETECTED
    if path.exists():
        read = detect_profile(measure=False)
        try:
            kept = HardwareProfile.from_file(path)
        except (HardwareError, OSError, ValueError):
            kept = None
        same = kept is not None and all(getattr(kept, n) == getattr(read.profile, n)
                                        for n, how in read.provenance.items() if how == "detected")
        if same:
            return Detected(replace(kept, name=read.profile.name), read.facts)
    if not quiet:
        typer.echo("no --hardware: detecting this machine (measuring its host memory bandwidth, about a second) ...",
                   err=True)
    found = detect_profile(measure=True)
    out.mkdir(parents=True, exist_ok=True)
    found.profile.write(path)
    return found


def _folders(boxes: list[str], out: Path) -> list[Path]:
    """One folder per box: `out` for one; else each box's name, made distinct by a digest of its
    spec where two share a name (two --hardware files of one name in different folders)."""
    if len(boxes) == 1:
        return [out]
    names = [_safe(b) for b in boxes]
    return [out / (n if names.count(n) == 1 else f"{n}-{hashlib.sha256(str(Path(b.split('@')[0]).resolve()).encode() + b.encode()).hexdigest()[:8]}")
            for n, b in zip(names, boxes)]


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


def _box_rows(detected: Any) -> list[dict[str, str]]:
    """The detected numbers a plan rests on, each with how it was obtained."""
    shown = {"detected": "read", "measured": "measured", "assumed": "assumed"}
    p = detected.profile
    rows = []
    for name, label in BOX_FIELDS:
        how, _, source = p.sources.get(name, "assumed: not stated").partition(": ")
        rows.append({"field": label, "value": f"{getattr(p, name):.4g}", "how": shown.get(how, how), "from": source})
    for key in ("ISA", "NUMA nodes"):
        fact = detected.facts.get(key)
        if fact is not None:
            rows.append({"field": key, "value": str(fact.value), "how": shown.get(fact.how, fact.how),
                         "from": fact.source})
    return rows


def _write(result: Any, folder: Path, detected: Any) -> dict[str, Any]:
    from casmoe.output import write_text

    summary = result.to_dict()
    if detected is not None:
        summary["detected_box"] = {"profile": str(folder / DETECTED) if (folder / DETECTED).exists() else DETECTED,
                                   "fields": _box_rows(detected), "provenance": detected.provenance}
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
    band = f" (80%: {s.band[0]:.3g}-{s.band[1]:.3g})" if s.band else ""
    parts = [f"decode {s.decode:.3g} tok/s{band} at a context of {context} tokens"]
    if s.prefill:
        parts.append(f"prefill {s.prefill:.3g} tok/s (the routing's prompts)")
    return "expected: " + ", ".join(parts) + f"; {s.uncertainty}; {s.how}" + (f" ({s.evidence})" if s.evidence else "")


def _print(result: Any, folder: Path, detected: Any) -> None:
    from casmoe.report import print_table

    r = result.request
    b = result.box
    gpus = f"{b.gpus} GPU{'s' * (b.gpus > 1)} ({', '.join(f'{g:g}' for g in b.gpu_gib)} GiB)" if b.gpus else "no GPU"
    typer.echo(f"{result.preset.name} on {r.hardware}: {gpus}, {b.host_ram_gib:g} GiB host RAM, "
               f"{b.numa_nodes} NUMA node{'s' * (b.numa_nodes > 1)}, {b.threads or 'unknown'} threads; "
               f"context {r.context} x {r.concurrency}")
    if detected is not None:
        counts = {h: sum(1 for row in _box_rows(detected) if row["how"] == h) for h in ("read", "measured", "assumed")}
        print_table(_box_rows(detected), ["field", "value", "how", "from"],
                    f"this machine, detected ({counts['read']} read, {counts['measured']} measured, {counts['assumed']} "
                    f"assumed: check those in {folder / DETECTED})")
    if result.model_note:
        typer.echo(f"  model: {result.model_note}")
    for note in result.notes:
        typer.echo(f"  {note}")
    for e in result.engines:
        typer.echo("")
        if e.refused:
            typer.echo(f"== {e.engine}: not planned: {e.refused}")
            continue
        typer.echo(f"== {e.engine} (flags as read in its source: {e.version})")
        if e.precisions:
            print_table(e.precisions, ["precision", "weights_gib", "configuration", "fits", "decode_tok_s", "band",
                                       "at_floor", "quality"],
                        f"{e.engine}: precisions compared (quality floor: {r.quality_floor or 'q4_k_m'}'s published KL "
                        "divergence; quality as published, with the model it was measured on)")
        c = e.best
        if c is None:
            typer.echo(f"  no configuration to run: {e.why_none}")
        else:
            typer.echo(f"  best: {c.label}, {c.precisions.describe()} [fits]")
            for step in c.prepare:
                typer.echo("  once:\n    " + step.text().replace("\n", "\n  "))
            need = f" (needs {e.engine} {'b' if e.engine == 'llama.cpp' else ''}{c.minimum} or newer: {c.minimum_why})" \
                if c.minimum else ""
            typer.echo(f"  run{need}:\n    " + c.command.text().replace("\n", "\n  "))
            if c.files:
                typer.echo("  files: " + "; ".join(f"{folder / n} ({w})" for n, w in c.files.items()))
            print_table(c.placement.memory.rows(), ["where", "total", "reserve", "dense", "embeddings", "kv cache",
                                                    "experts", "free"], f"memory map, GiB ({e.engine}: {c.label})")
            typer.echo("  " + _speed_line(c, r.context))
            if c.reproduce:
                typer.echo(f"  reproduce: {c.reproduce}")
            typer.echo(f"  quality: {c.quality.text}")
            for note in [*c.placement.memory.notes, *c.notes]:
                typer.echo(f"  - {note}")
        if e.others:
            print_table([o.row() for o in e.others], ["configuration", "precision", "fits", "gpu_experts",
                                                      "decode_tok_s", "band", "how"],
                        f"{e.engine}: {'runners-up' if c is not None else 'configurations'} (scripts "
                        f"{e.engine}-1.sh, ...)")
    comp = result.comparison
    if comp is not None:
        typer.echo("")
        print_table(list(comp.rows), ["placement", "engine", "stack", "policy", "decode_tok_s", "scored"],
                    f"routing-aware vs llama.cpp's --n-cpu-moe at equal memory ({comp.gpu_layers} layers' experts, "
                    f"{comp.gpu_experts} experts on the GPU, {comp.rows[0]['precision']}), each on its engine's stack")
        gains = comp.to_dict()["gains"]
        typer.echo("  " + "; ".join(f"{k}: {'n/a' if v is None else f'{v:+.1%}'}" for k, v in gains.items()))
        for row in comp.rows:
            typer.echo(f"  reproduce {row['placement']}: {row['reproduce']}")
    if result.published:
        typer.echo("")
        print_table(result.published, ["engine", "metric", "value", "setting", "box", "id"],
                    "published measurements of this model on these engines (casmoe/sim/trust/published/measurements.toml)")
    typer.echo(f"\nplan in {folder}/plan.json, candidates in {folder}/candidates.csv, commands in {folder}/*.sh (each "
               f"engine's best is <engine>.sh); simulated {result.simulated} points now (kept in {folder}/points)")

"""`casmoe trace ...`: make, convert and inspect routing traces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from casmoe.cli.app import app, progress
from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry
from casmoe.shipped import DEFAULT_TRACE, shipped

trace_app = typer.Typer(help="Make, convert and inspect routing traces (.npz).", no_args_is_help=True)
app.add_typer(trace_app, name="trace")


def parse_range(text: str, what: str) -> tuple[int, int]:
    """'16:64' -> (16, 64); '32' -> (32, 32)."""
    try:
        lo, _, hi = text.partition(":")
        return int(lo), int(hi or lo)
    except ValueError:
        raise CasmoeError(f"--{what} must be LOW:HIGH or N (got {text!r})") from None


def _geometry(model: Optional[str], layers: Optional[int], experts: Optional[int], top_k: Optional[int]) -> Geometry:
    """A preset's geometry, with any of layers / experts / top_k overridden."""
    from dataclasses import replace

    from casmoe.presets import get_preset

    base = get_preset(model or "mixtral-8x7b").geometry
    changes = {k: v for k, v in (("layers", layers), ("experts", experts), ("top_k", top_k)) if v is not None}
    return replace(base, **changes) if changes else base


@trace_app.command("synth")
def synth(
    out: Path = typer.Argument(..., help="Output trace (.npz)."),
    like: Optional[str] = typer.Option(
        None, help="Fit the generator to this trace (.npz, route .csv, .json#KEY) instead of using the knobs below."
    ),
    model: Optional[str] = typer.Option(None, help="Model preset whose geometry (and bytes per expert) to use [default: mixtral-8x7b]."),
    layers: Optional[int] = typer.Option(None, help="Override the preset's MoE layer count."),
    experts: Optional[int] = typer.Option(None, help="Override the preset's experts per layer."),
    top_k: Optional[int] = typer.Option(None, help="Override the preset's routed experts per token; with "
                                        "--like, extrapolate the fitted routing to this many (the same "
                                        "expert ranking, its first K; see casmoe.synthetic_fit)."),
    requests: int = typer.Option(300, min=1, help="Number of requests."),
    tasks: Optional[int] = typer.Option(
        None, min=1, help="Task clusters (code, math, cooking, ...) [default: 6; with --like: the trace's own labels]."
    ),
    task_shuffle: float = typer.Option(
        0.5, min=0.0, max=1.0, help="With --like and --tasks: share of each layer's experts a task relabels."
    ),
    zipf: Optional[float] = typer.Option(None, min=0.0, help="Popularity skew per layer: p(rank r) ~ 1/r^zipf [default: 1.0]."),
    stickiness: Optional[float] = typer.Option(
        None, min=0.0, max=1.0, help="P(a token keeps each of the previous token's experts) [default: 0.3]."
    ),
    task_affinity: Optional[float] = typer.Option(None, min=0.0, max=1.0, help="Weight of the task's preferred set [default: 0.6]."),
    task_experts: Optional[int] = typer.Option(
        None, help="Preferred experts per task and layer (default max(2k, E/4))."
    ),
    prefill: Optional[str] = typer.Option(None, help="Prompt length range LOW:HIGH (tokens) [default: 16:64]."),
    decode: Optional[str] = typer.Option(None, help="Generated length range LOW:HIGH (tokens) [default: 32:96]."),
    logits: bool = typer.Option(False, help="Store router logits [T, L, E] (not with --like)."),
    spec: Optional[bool] = typer.Option(None, help="Store speculative next-layer routing [T, L, k] [default: on; not with --like]."),
    spec_accuracy: float = typer.Option(
        0.8, min=0.0, max=1.0, help="P(a spec slot equals the true next-layer expert)."
    ),
    seed: int = typer.Option(0, help="Seed of the numpy Generator."),
) -> None:
    """Generate a synthetic trace with task-labelled prompts (see casmoe.synthetic for the model).

    With --like TRACE the generator is fitted to TRACE's routing (per-layer popularity of prompt
    and decode tokens, stickiness, drift, task groups, lengths; see casmoe.synthetic_fit) and
    the knobs are not used.
    """
    if like is not None:
        knobs = {"--model": model, "--layers": layers, "--experts": experts, "--zipf": zipf,
                 "--stickiness": stickiness, "--task-affinity": task_affinity, "--task-experts": task_experts,
                 "--prefill": prefill, "--decode": decode, "--spec": spec or None, "--logits": logits or None}
        given = [name for name, value in knobs.items() if value is not None]
        if given:
            raise CasmoeError(f"--like fits the routing to the trace; drop {', '.join(given)}")
        _synth_like(out, like, requests, tasks, task_shuffle, seed, top_k)
        return
    from casmoe.output import check_file_target
    from casmoe.synthetic import SynthConfig, generate
    from casmoe.trace_io import save_trace

    check_file_target(out, "trace")
    geometry = _geometry(model, layers, experts, top_k)
    cfg = SynthConfig(
        requests=requests,
        tasks=6 if tasks is None else tasks,
        zipf=1.0 if zipf is None else zipf,
        stickiness=0.3 if stickiness is None else stickiness,
        task_affinity=0.6 if task_affinity is None else task_affinity,
        task_experts=task_experts,
        prefill=parse_range(prefill or "16:64", "prefill"),
        decode=parse_range(decode or "32:96", "decode"),
        logits=logits,
        spec=True if spec is None else spec,
        spec_accuracy=spec_accuracy,
        seed=seed,
        meta={"model_preset": model or "mixtral-8x7b"},
    )
    tr = generate(geometry, cfg)
    save_trace(tr, out)
    typer.echo(f"wrote {out}: {len(tr.requests)} requests, {tr.tokens} tokens, {geometry.describe()}")


def _synth_like(out: Path, like: str, requests: int, tasks: Optional[int], task_shuffle: float, seed: int,
                top_k: Optional[int] = None) -> None:
    """`synth --like`: fit, optionally split into tasks, generate, save with provenance."""
    from casmoe import synthetic_fit
    from casmoe.importers import read_specs
    from casmoe.output import check_file_target, check_not_input
    from casmoe.trace_io import save_trace

    check_file_target(out, "trace")
    check_not_input(out, [like.partition("#")[0]], "trace")
    [(name, source)] = read_specs([like])
    if top_k is not None and not 1 <= top_k <= source.geometry.experts:
        raise CasmoeError(f"--top-k must be in [1, {source.geometry.experts}] for {like}, not {top_k}")
    typer.echo(f"fitting the generator to {like} ({len(source.requests)} requests, {source.tokens} tokens)", err=True)
    fitted = synthetic_fit.fit(source, name, seed, progress=lambda what: typer.echo(f"  fitting {what}", err=True))
    if tasks is not None:
        fitted = synthetic_fit.with_tasks(fitted, tasks, task_shuffle, seed)
    fitted_k = fitted.geometry.top_k
    if top_k is not None:
        fitted = synthetic_fit.with_top_k(fitted, top_k)
    tr = synthetic_fit.sample(fitted, requests, seed)
    tr.meta["synth_like"] = {
        **fitted.summary(),
        "requests": requests,
        "seed": seed,
        "tasks": tasks,
        "task_shuffle": task_shuffle if tasks is not None else None,
        "top_k": {"fitted": fitted_k, "generated": tr.geometry.top_k},
        "command": f"casmoe trace synth {out.name} --like {like} --requests {requests} --seed {seed}"
        + (f" --tasks {tasks} --task-shuffle {task_shuffle:g}" if tasks is not None else "")
        + (f" --top-k {top_k}" if top_k is not None else ""),
    }
    save_trace(tr, out)
    typer.echo(f"wrote {out}: {len(tr.requests)} requests, {tr.tokens} tokens, {tr.geometry.describe()}")


@trace_app.command("info")
def info(
    trace: Optional[Path] = typer.Argument(None, help=f"Trace (.npz); default: the shipped {DEFAULT_TRACE}."),
    top: int = typer.Option(4, min=1, help="Most popular experts listed per layer."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON instead of text and a table."),
) -> None:
    """Print geometry, request and token counts, and per-layer expert popularity."""
    from casmoe.report import print_table
    from casmoe.trace_io import load_trace

    path = trace or shipped(DEFAULT_TRACE)
    s = load_trace(path).summary(top)
    if as_json:
        typer.echo(json.dumps({"path": str(path), **s}, indent=2))
        return
    g = s["geometry"]
    size = s["expert_bytes"][0] / 2**20 if s["expert_bytes"] else 0
    typer.echo(str(path))
    typer.echo(
        f"geometry: {g['layers']} MoE layers x {g['experts']} experts, top-{g['top_k']}, {g['shared_experts']} shared; "
        + (f"{size:.1f} MiB per expert (layer 0)" if size else "expert size unknown")
    )
    typer.echo(
        f"requests: {s['requests']}; tokens: {s['tokens']} ({s['prefill_tokens']} prefill, {s['decode_tokens']} "
        f"decode); token-layers not computed: {s['not_computed']}"
    )
    typer.echo(f"prompts: {'yes' if s['prompts'] else 'no'}; tasks: {', '.join(s['tasks']) or '-'}")
    typer.echo(f"optional arrays: {', '.join(s['optional']) or 'none'}")
    for key in ("source_model", "recorded_by", "created"):
        if key in s["meta"]:
            typer.echo(f"{key}: {s['meta'][key]}")
    records = [
        {
            "layer": row["layer"],
            "routed": row["routed"],
            "distinct": row["distinct"],
            f"top{top} share": row["top_share"],
            "hottest (expert:share)": " ".join(f"{e}:{share:.2f}" for e, share in row["hottest"]),
        }
        for row in s["layers"]
    ]
    print_table(records, list(records[0]) if records else ["layer"], title="expert popularity per layer")


@trace_app.command("import")
def import_(
    sources: list[Path] = typer.Argument(
        ..., help="Route CSV, JSON, per-layer arrays, vLLM or SGLang dumps: files, or a folder of them."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Output trace (.npz)."),
    fmt: str = typer.Option(
        "auto", "--format", help="auto (by suffix and content), csv, json, arrays, npz, vllm or sglang."
    ),
    model: Optional[str] = typer.Option(
        None, help="Model preset the data must match (MoE layers, experts, top-k); the trace takes its expert sizes."
    ),
    key: Optional[str] = typer.Option(None, help="JSON with named entries: import only this one."),
    kind: str = typer.Option("auto", help="Arrays: topk (expert ids), logits, rank (moe-lrc int8 ranks) or auto."),
    num_experts: Optional[int] = typer.Option(
        None, help="Experts per layer, where the data does not say (expert-id arrays, vLLM); checked where it does."
    ),
    top_k: Optional[int] = typer.Option(
        None, help="Routed experts per token, where the data does not say (logits, ranks, SGLang responses); checked where it does."
    ),
    prefill: int = typer.Option(0, min=0, help="Arrays: leading tokens of each sequence that are the prompt."),
    keep_logits: bool = typer.Option(False, help="Arrays of logits: store them in the trace."),
) -> None:
    """Convert an external routing trace into casmoe's .npz format.

    Several files or a folder become one trace. vLLM (--enable-return-routed-experts) and SGLang
    (per_token recorder dumps, return_routed_experts responses) keep only MoE layers; the
    geometry is printed. A route CSV needs only a '# n_layer=L n_expert=E n_expert_used=K'
    line and the columns turn,step,layer,expert (docs/traces.md: "Bring your own routing").
    """
    from casmoe.importers import import_trace
    from casmoe.output import check_file_target, check_not_input
    from casmoe.presets import get_preset
    from casmoe.trace_io import save_trace

    check_file_target(out, "--out")
    check_not_input(out, sources, "--out")
    geometry = get_preset(model).geometry if model is not None else None
    tr = import_trace(
        sources, fmt, model=geometry, key=key, kind=kind, num_experts=num_experts, top_k=top_k, prefill=prefill,
        keep_logits=keep_logits,
    )
    save_trace(tr, out)
    gaps = sum(int((~r.computed).sum()) for r in tr.requests)
    dropped = tr.meta.get("engine_layers", tr.geometry.layers) - tr.geometry.layers
    typer.echo(
        f"wrote {out}: {len(tr.requests)} requests, {tr.tokens} tokens, {tr.geometry.describe()}, "
        f"{gaps} token-layers not computed"
        + (f"; {dropped} of the engine's {tr.meta['engine_layers']} layers had no routing (dense) and were dropped"
           if dropped else "")
        + ("; experts per layer taken as the largest id + 1 (give --num-experts or --model if the model has more)"
           if tr.meta.get("experts_inferred") else "")
    )


@trace_app.command("export")
def export(
    trace: Path = typer.Argument(..., help="Trace (.npz)."),
    out: Path = typer.Argument(..., help="Output long routing CSV (route_trace v1)."),
) -> None:
    """Write a trace as the long routing CSV (one row per routed expert; imports back with
    everything but router logits and spec)."""
    from casmoe.importers import write_route_csv
    from casmoe.output import check_file_target, check_not_input
    from casmoe.trace_io import load_trace

    check_file_target(out, "CSV")
    check_not_input(out, [trace], "CSV")
    tr = load_trace(trace)
    write_route_csv(tr, out, progress=True)
    typer.echo(f"wrote {out}: {len(tr.requests)} turns, {tr.tokens} tokens")


@trace_app.command("show")
def show(
    trace: Optional[Path] = typer.Argument(None, help=f"Trace (.npz); default: the shipped {DEFAULT_TRACE}."),
    text: bool = typer.Option(False, "--text", help="Print each request's prompt and what it said after it."),
    request: Optional[list[int]] = typer.Option(None, "--request", "-r", help="Only these request indices (repeatable)."),
    limit: int = typer.Option(20, min=0, help="Show at most this many requests (0: all)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per request (a list)."),
) -> None:
    """List a trace's requests (task, split, prompt and decode tokens) and, with --text, what each
    one said; ends with the distinct-4-gram ratio of the recorded outputs."""
    from casmoe.metrics.diversity import distinct_ngram_ratio
    from casmoe.trace_io import load_trace

    path = trace or shipped(DEFAULT_TRACE)
    tr = load_trace(path)
    splits = tr.meta.get("splits") or [None] * len(tr.requests)
    picked = request if request else range(len(tr.requests))
    bad = [i for i in picked if not 0 <= i < len(tr.requests)]
    if bad:
        raise CasmoeError(f"--request {bad[0]}: {path} has requests 0..{len(tr.requests) - 1}")
    picked = list(picked)[: limit or None]
    rows = [
        {
            "request": i, "task": tr.requests[i].task, "split": splits[i],
            "prefill": tr.requests[i].prefill, "decode": tr.requests[i].decode_tokens,
            **({"prompt": tr.requests[i].prompt, "output": tr.requests[i].output} if text else {}),
        }
        for i in picked
    ]
    outputs = [r.output_ids for r in tr.requests if r.output_ids is not None]
    d4 = distinct_ngram_ratio(outputs, 4) if outputs else None
    if as_json:
        typer.echo(json.dumps({"path": str(path), "distinct_4gram": d4, "requests": rows}, indent=2))
        return
    for row in rows:
        typer.echo(f"#{row['request']}  task={row['task'] or '-'}  split={row['split'] or '-'}  "
                   f"prefill={row['prefill']}  decode={row['decode']}")
        if text:
            typer.echo(f"  prompt: {row['prompt']!r}")
            typer.echo(f"  output: {row['output']!r}" if row["output"] is not None else "  output: (not recorded)")
    shown = f"{len(rows)} of {len(tr.requests)} requests"
    typer.echo(f"{shown}; distinct-4-gram ratio of outputs: " + (f"{d4:.3f}" if d4 is not None else "-"))


@trace_app.command("stats")
def stats(
    traces: Optional[list[str]] = typer.Argument(
        None, help="Traces: .npz, route .csv or .json (PATH#KEY picks one entry); default: the shipped default trace."
    ),
    layers: bool = typer.Option(False, "--layers", help="Also print each trace's per-layer table (--json and --csv always include it)."),
    replay_requests: int = typer.Option(
        0, min=0, help="Replay the hit rates on at most this many requests, spread evenly (0: all of them)."
    ),
    band: bool = typer.Option(True, help="Judge each trace against the band of the real traces of its "
                                          "shape in traces/real (16 experts: GRIN, Jamba; 128: Qwen3, gemma, gpt-oss)."),
    as_json: bool = typer.Option(False, "--json", help="Print everything (per layer too) as JSON."),
    as_csv: bool = typer.Option(False, "--csv", help="Print long rows (trace, layer, statistic, value, band) as CSV."),
) -> None:
    """Routing statistics that decide how much a cache can help, beside the real models' band.

    Per trace and layer: distinct experts of a request's first 32 decode tokens, exact-set reuse
    and its lift over random routing, share of the previous token's experts kept and its lift
    over the request's own mix shuffled and over random routing with the trace's popularity,
    the hottest expert's load, within-request popularity skew (Gini), LRU and Belady hit rates
    at k, 1.5k, 2k and 4k slots per layer, SRP at m = 16 (see casmoe.workload for the definitions).

    Example: casmoe trace stats traces/tiny-olmoe.npz traces/real/qwen.route.csv
    """
    import sys

    from casmoe import workload
    from casmoe.importers import read_specs
    from casmoe.report import print_table, write_csv_to

    loaded = read_specs(traces or [str(shipped(DEFAULT_TRACE))])
    results = []
    with progress(total=sum(tr.geometry.layers for _, tr in loaded), desc="replay", unit="layer", leave=False, quiet=as_json or as_csv) as bar:
        for name, tr in loaded:
            results.append(workload.measure(tr, name, replay_requests, progress=bar.update))
    bands = [workload.band_for(tr.geometry.experts) if band else None for _, tr in loaded]
    if as_json:
        shapes = {b.shape: b.to_dict() for b in bands if b is not None}
        traces = [{**s.to_dict(), "band": b.shape if b else None, "band_note": b.note if b else None}
                  for s, b in zip(results, bands)]
        typer.echo(json.dumps({"band": shapes or None, "traces": traces}, indent=2))
        return
    if as_csv:
        write_csv_to(sys.stdout, workload.long_records(results, bands))
        return
    rows = workload.comparison(results, bands)
    used = {b.shape: b for b in bands if b is not None}
    print_table(rows, list(rows[0]), title="routing statistics (model level)" + "".join(
        f"; band {shape}: {', '.join(b.sources)}" for shape, b in used.items()))
    for s, b in zip(results, bands):
        if b is not None and b.note:
            typer.echo(f"{s.name}: {b.note}")
    for s in results:
        if s.replayed_requests < s.requests:
            typer.echo(f"{s.name}: hit rates replayed on {s.replayed_requests} of {s.requests} requests (--replay-requests)")
    if layers:
        for s in results:
            recs = [{"layer": i, **{n: s.layers[n][i] for n in workload.STATS}} for i in range(len(s.layers[workload.STATS[0]]))]
            print_table(recs, ["layer", *workload.STATS], title=f"{s.name}: per layer")

"""`casmoe bench`, `casmoe calibrate`, `casmoe validate`: the real torch backend.

torch and transformers are imported inside the commands, so `casmoe --help` stays fast.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import typer

from casmoe.cache import MissMode
from casmoe.cli.app import ADAPTIVE_GATING, app, progress
from casmoe.errors import CasmoeError

FIDELITY_POLICIES = ("ondemand", "lru", "semoe", "casmoe[predictor=exact]")


class BenchInputError(CasmoeError, ValueError):
    """A model, prompt set or option the backend commands cannot use."""


def _link(threads: int, link_gbps: Optional[float], link_latency_us: float) -> Any:
    """Set torch's CPU threads (0: the cores not already busy) and build the emulated link."""
    if link_gbps is not None and not (math.isfinite(link_gbps) and link_gbps > 0):
        raise BenchInputError(f"--link-gbps must be a finite number > 0 (leave it out for no cap), got {link_gbps}")
    if not (math.isfinite(link_latency_us) and link_latency_us >= 0):
        raise BenchInputError(f"--link-latency-us must be a finite number >= 0, got {link_latency_us}")
    import torch

    from casmoe.backends.copier import EmulatedLink
    from casmoe.resources import default_threads

    torch.set_num_threads(threads if threads > 0 else default_threads())
    return EmulatedLink(None if link_gbps is None else link_gbps * 1e9, link_latency_us * 1e-6)


def _in_memory(model: str, threads: int, link_gbps: Optional[float], dtype: str) -> tuple[Any, Any]:
    """The whole model loaded in memory, its experts served from there (`validate` emulates a
    host-RAM-to-device link on the CPU: the store is host memory by design)."""
    from casmoe.backends.models import load_model
    from casmoe.backends.runtime import OffloadedModel

    link = _link(threads, link_gbps, 0.0)
    hf_model, tokenizer = load_model(model, dtype=dtype)
    return OffloadedModel(hf_model, link=link), tokenizer


def _prompts(tokenizer: Any, prompts: Optional[Path], count: int, max_tokens: int, split: str = "heldout") -> list[Any]:
    """Prompts from a file (JSONL corpus rows or one per line), else the shipped corpus's
    held-out split, spread evenly over it; each cut to `max_tokens` tokens."""
    from casmoe.backends.corpus import load_corpus, load_prompts, spread
    from casmoe.backends.runtime import Prompt

    rows = load_prompts(prompts) if prompts is not None else load_corpus(split=split)
    if not rows:
        raise BenchInputError(f"no prompts in {prompts or 'the shipped corpus'}")
    rows = spread(rows, count)
    out = []
    for r in rows:
        ids = tokenizer(r.text)["input_ids"][:max_tokens]
        if ids:
            out.append(Prompt(ids, r.text, r.task))
    if not out:
        raise BenchInputError("every prompt tokenized to nothing")
    return out


def _progress(total: int, desc: str) -> Any:
    return progress(total=total, desc=desc, unit="req", leave=False)


MODEL = typer.Option(..., "--model", help="A shipped tiny model (tiny-mixtral, tiny-olmoe) or a local model folder.")
PROMPTS = typer.Option(None, "--prompts", help="JSONL corpus rows or one prompt per line (default: held-out corpus).")
DEVICE = typer.Option(None, "--device", help="Device for a share of the layers (repeat to split: cpu, cuda:0, ...).")
THREADS = typer.Option(0, help="torch CPU threads (0: the cores not already busy, by the 1-minute load average).")
DTYPE = typer.Option(None, help="Run in this dtype (float32, bfloat16, float16); default: the checkpoint's.")


@app.command()
def bench(
    model: str = MODEL,
    policy: str = typer.Option("lru", help="Policy: NAME or NAME[key=value,...] (e.g. casmoe[predictor=noisy]) or pkg.mod:Class."),
    capacity: Optional[str] = typer.Option(
        None, help="Slots per MoE layer on each device (4) or expert memory (512MB); default: 2 x top_k."
    ),
    global_capacity: Optional[str] = typer.Option(None, help="One pool per device, shared by its layers: slots or memory."),
    host_cache: Optional[str] = typer.Option(
        None, "--host-cache", help="RAM tier between the checkpoint on disk and the devices: memory (40GB) or experts."
    ),
    host_policy: str = typer.Option("lru", help="Policy managing the RAM tier (any that does not read the future)."),
    direct_io: bool = typer.Option(False, "--direct-io", help="Read experts with O_DIRECT, past the page cache."),
    miss_mode: MissMode = typer.Option(
        MissMode.LOAD, help="load (stall, exact), substitute (lossy) or cpu (compute misses on the host)."
    ),
    batch: int = typer.Option(1, min=1, help="Requests decoded together (each prefills alone)."),
    verify: bool = typer.Option(
        False, "--verify", help="Also run the un-offloaded model (one layer's experts of memory per device); "
        "report |logit delta| and token agreement per request."
    ),
    prompts: Optional[Path] = PROMPTS,
    num_prompts: int = typer.Option(8, min=1, help="Prompts taken, spread over the file."),
    max_prompt_tokens: int = typer.Option(64, min=1, help="Prompts are cut to this many tokens."),
    max_new_tokens: int = typer.Option(32, min=1, help="Tokens generated per prompt (greedy)."),
    link_gbps: Optional[float] = typer.Option(None, help="CPU runs: emulate a host link of this many GB/s."),
    link_latency_us: float = typer.Option(0.0, min=0.0, help="CPU runs: fixed cost per emulated copy."),
    device: Optional[list[str]] = DEVICE,
    trace: Optional[Path] = typer.Option(None, help="Profile trace for policies that rank experts (static)."),
    ppl_texts: int = typer.Option(16, min=1, help="Held-out texts for perplexity (substitute mode, adaptive gating)."),
    threads: int = THREADS,
    dtype: Optional[str] = DTYPE,
    adaptive_gating: Optional[float] = ADAPTIVE_GATING,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON record."),
) -> None:
    """Generate with offloaded experts read from the checkpoint (optionally through a RAM tier):
    tokens/s, TTFT, stall time, hit rates; perplexity against the un-offloaded model in
    substitute mode and with --adaptive-gating (which also reports the token agreement with the
    exact model, as --verify does); with --verify, proof that the run matched the un-offloaded model."""
    from casmoe.backends.bench import bench as run_bench
    from casmoe.backends.bench import open_offloaded
    from casmoe.policies.spec import PolicySpec
    from casmoe.trace_io import load_trace

    spec = PolicySpec.parse(policy)
    cls = spec.cls
    link = _link(threads, link_gbps, link_latency_us)
    opened = open_offloaded(model, devices=device or [], dtype=dtype, link=link, capacity=capacity,
                            global_capacity=global_capacity, host_cache=host_cache, host_policy=host_policy,
                            direct_io=direct_io)
    om, cap = opened.om, opened.capacity
    reqs = _prompts(opened.tokenizer, prompts, num_prompts, max_prompt_tokens)
    profile = load_trace(trace) if trace is not None else None
    verify = verify or adaptive_gating is not None  # a lossy gate: how often it changes the exact model's tokens
    with _progress(len(reqs), f"{spec.label} @ {cap.describe()}") as bar:
        record = run_bench(opened, reqs, cls, dict(spec.options), miss_mode=miss_mode, max_new_tokens=max_new_tokens,
                           batch=batch, trace=profile, verify=verify, progress=bar.update, gating=adaptive_gating)
    record = {"model": model, "policy": spec.label, "link_gbps": link_gbps, **record}
    if miss_mode is MissMode.SUBSTITUTE or adaptive_gating is not None:
        texts = _prompts(opened.tokenizer, None, ppl_texts, 128)
        record["perplexity"] = om.offloaded_perplexity(texts, cls, cap, miss_mode=miss_mode, options=dict(spec.options),
                                                       gating=adaptive_gating)
        record["reference_perplexity"] = om.perplexity(texts)
    if as_json:
        typer.echo(json.dumps(record, indent=2))
        return
    from casmoe.report import print_table

    shown = {
        "tok/s": record["tokens_per_s"], "TTFT s": record["ttft_s"],
        "p50 ms": record["median_token_latency_s"] * 1e3, "stall s": record["stall_s"],
        "hit rate": record["cache_hit_rate"], "loads": record["cache_loads"],
    }
    if "ram_hit_rate" in record:
        shown["RAM hit rate"] = record["ram_hit_rate"]
    if "perplexity" in record:
        shown["ppl"] = record["perplexity"]
        shown["ref ppl"] = record["reference_perplexity"]
    if verify:
        shown["max |dlogit|"] = record["verify_max_abs_delta"]
        shown["token agreement"] = record["verify_token_agreement"]
    gated = "" if adaptive_gating is None else f", adaptive gating >= {adaptive_gating:g}"
    print_table([shown], list(shown), title=f"{model}: {spec.label} @ {cap.describe()}, {miss_mode.value}{gated}")


MEASURED_HELP = """Instead of measuring this machine: fit a software stack on runs you measured on your own box
(TOML [[row]] tables like casmoe/sim/trust/published/measurements.toml, or a CSV with columns id, rate and run options).
Each row: id = "lru4", rate = 5.1 (decode tok/s), run = { model = "mixtral-8x7b", hardware = "my-box.toml",
quant = "int4", policy = "lru", capacity = "4" } (casmoe simulate options; model and hardware required).
See examples/measured.toml."""


calibrate_app = typer.Typer(
    help="Fit what casmoe prices a run with on measurements: this machine running a model through the backend "
         "(`backend`: a hardware profile), or runs you measured yourself (`measured`: a software stack).",
    no_args_is_help=True,
)
app.add_typer(calibrate_app, name="calibrate")
validate_app = typer.Typer(
    help="Hold casmoe's predictions against real runs: the backend on this machine (`backend`), or published "
         "measurements of real systems (`published`).",
    no_args_is_help=True,
)
app.add_typer(validate_app, name="validate")


@calibrate_app.command("backend")
def calibrate_backend(
    model: str = typer.Option(..., "--model", help="A shipped tiny model (tiny-mixtral, tiny-olmoe) or a local model folder."),
    out: Path = typer.Option(Path("calibrated.toml"), help="The hardware profile to write."),
    name: str = typer.Option("calibrated", help="The profile's name inside the file."),
    prompts: Optional[Path] = PROMPTS,
    num_prompts: int = typer.Option(4, min=1, help="Prompts for the decode-step measurement."),
    max_new_tokens: int = typer.Option(16, min=2, help="Decode steps per prompt."),
    link_gbps: Optional[float] = typer.Option(None, help="CPU runs: emulate a host link of this many GB/s."),
    link_latency_us: float = typer.Option(0.0, min=0.0, help="CPU runs: fixed cost per emulated copy."),
    device: Optional[list[str]] = DEVICE,
    threads: int = THREADS,
    dtype: Optional[str] = DTYPE,
    as_json: bool = typer.Option(False, "--json", help="Print the measurements (or the calibration) as JSON."),
) -> None:
    """Measure this machine (compute, copy bandwidth and per-copy cost) running MODEL and write a
    hardware profile that `casmoe simulate --hardware FILE` reads."""
    from casmoe.output import check_file_target

    from casmoe.backends.bench import open_offloaded
    from casmoe.backends.calibrate import calibrate as measure

    check_file_target(out, "--out")
    opened = open_offloaded(model, devices=(device or [])[:1], dtype=dtype,
                            link=_link(threads, link_gbps, link_latency_us))
    om = opened.om
    reqs = _prompts(opened.tokenizer, prompts, num_prompts, 32)
    from casmoe.backends.copier import responsive_copies

    with responsive_copies():
        cal = measure(om, reqs, max_new_tokens=max_new_tokens)
    path = cal.profile(name).write(out)
    if as_json:
        typer.echo(json.dumps({"profile": str(path), **cal.to_dict()}, indent=2))
        return
    from casmoe.report import sig

    typer.echo(
        f"wrote {path}: decode step {sig(cal.step_s * 1e3)} ms, expert {sig(cal.expert_s * 1e6)} us, "
        f"copies {sig(cal.copy_bw / 1e9)} GB/s + {sig(cal.copy_latency * 1e6)} us, "
        f"layer overhead {sig(cal.layer_overhead * 1e6)} us"
    )


@calibrate_app.command("measured")
def calibrate_measured(
    measured: Path = typer.Argument(..., metavar="FILE", help=MEASURED_HELP),
    stack: Optional[str] = typer.Option(None, "--stack", help="The stack to calibrate, a shipped name or a TOML "
                                        "(default: the stack the rows name, else ideal)."),
    fit: Optional[str] = typer.Option(None, "--fit", help="The fields to fit, comma-separated (default: those the rows "
                                      "determine, of layer_us, copy_efficiency, host_efficiency; the command says "
                                      "which and why)."),
    out: Path = typer.Option(Path("calibrated-stack.toml"), help="The stack to write."),
    name: Optional[str] = typer.Option(None, help="The stack's name inside the file (default: the --out file's stem)."),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="For llama-bench output or a llama-server log: "
                                           "the box it ran on (a profile name or TOML; `casmoe hardware detect "
                                           "--out my-box.toml` writes this machine's)."),
    model: Optional[str] = typer.Option(None, "--model", help="For llama-bench output or a llama-server log: the "
                                        "model it ran (a GGUF or a preset), where the file names none or it is not here."),
    as_json: bool = typer.Option(False, "--json", help="Print the calibration as JSON."),
) -> None:
    """Fit a software stack on the runs you measured on your own box and write it for
    `casmoe simulate --stack FILE`: each fitted number with its standard error, each row checked
    by a refit without it. FILE is casmoe's [[row]] TOML or CSV, or what llama.cpp printed:
    llama-bench's output (-o json, jsonl, csv or md) or llama-server's timing lines."""
    from datetime import datetime, timezone

    from casmoe.output import check_file_target
    from casmoe.sim.questions.calibration import base_stack, calibrate as fit_measured, load_measured

    check_file_target(out, "--out")
    from casmoe.sim.questions.measured_files import Context

    context = None if hardware is None and model is None else Context(hardware or "", model, stack or "llama.cpp")
    rows = load_measured(measured, context)
    base = base_stack(rows, stack)
    command = (f"casmoe calibrate measured {measured}" + (f" --hardware {hardware}" if hardware else "")
               + (f" --model {model}" if model else "") + (f" --stack {stack}" if stack else "") + (f" --fit {fit}" if fit else ""))
    cal = fit_measured(rows, base, None if fit is None else fit.split(","), source=command,
                       when=datetime.now(timezone.utc).date().isoformat(), name=name or out.stem)
    path = cal.stack.write(out)
    if as_json:
        typer.echo(json.dumps({"stack_file": str(path), **cal.to_dict()}, indent=2))
        return
    from casmoe.report import print_table

    records = [c.to_dict() for c in cal.checks]
    columns = ["row", "policy", "capacity", "measured tok/s", "fitted tok/s", "ratio"]
    loo = any(r["left_out_tok_s"] is not None for r in records)
    if loo:
        columns += ["left-out tok/s", "left-out ratio"]
    print_table([{"row": r["id"], "policy": r["policy"], "capacity": r["capacity"], "measured tok/s": r["measured_tok_s"],
                  "fitted tok/s": r["fitted_tok_s"], "ratio": r["fitted_ratio"], "left-out tok/s": r["left_out_tok_s"],
                  "left-out ratio": r["left_out_ratio"]} for r in records], columns,
                title=f"{base.name} calibrated on {measured} (ratio = predicted / measured"
                + ("; left-out: refitted without that row, the honest check)" if loo else
                   "; no row to spare for a left-out check: measure more runs than fields)"))
    for c in cal.checks:
        if c.beyond_bound:
            typer.echo(f"warning: row {c.row.id} measured {c.row.rate:.3g} tok/s, faster than its configuration can run in "
                       f"casmoe's model ({c.bound:.3g} tok/s with no software cost): check its run (precision, box, cache "
                       "size); the fit cannot explain it")
    for c in cal.choices:
        if c.fitted:
            typer.echo(f"{c.field} = {cal.describe(c.field)}: {c.why}")
        else:
            typer.echo(f"{c.field} not fitted: {c.why}")
    median = cal.left_out_median_abs_log_ratio()
    if median is not None:
        typer.echo(f"left-out median |log ratio| {median:.3f} (x{math.exp(median):.2f})")
    typer.echo(f"wrote {path}: predict the policies and sizes you did not measure with "
               f"`casmoe simulate --stack {path}{_shared_flags(rows)} --policy ... --capacity ...`")


def _shared_flags(rows: list[Any]) -> str:
    """The simulate flags every measured row agrees on (its box, model, precision), for the hint."""
    first = rows[0].run
    same = {k: v for k, v in first.items() if not isinstance(v, bool) and all(r.run.get(k) == v for r in rows)
            and k not in ("policy", "capacity", "global_capacity", "stack")}
    return "".join(f" --{k.replace('_', '-')} {v}" for k, v in same.items())


@validate_app.command("backend")
def validate_backend(
    model: str = typer.Option(..., "--model", help="A shipped tiny model (tiny-mixtral, tiny-olmoe) or a local model folder."),
    policy: Optional[list[str]] = typer.Option(
        None, help=f"Policies to compare, NAME or NAME[key=value,...], repeatable (default: {', '.join(FIDELITY_POLICIES)})."
    ),
    miss_mode: Optional[list[str]] = typer.Option(
        None, help="Miss modes to compare each policy in, repeatable: load (default), cpu, substitute."
    ),
    capacity: Optional[str] = typer.Option(None, help="Slots per MoE layer (4) or expert memory (512MB); default: 2 x top_k."),
    prompts: Optional[Path] = PROMPTS,
    num_prompts: int = typer.Option(12, min=1, help="Prompts per run (the runs take them in rounds)."),
    max_prompt_tokens: int = typer.Option(24, min=1, help="Prompts are cut to this many tokens."),
    max_new_tokens: int = typer.Option(24, min=2, help="Tokens generated per prompt."),
    link_gbps: Optional[float] = typer.Option(
        None, help="Emulated link (default: one expert's copy costs one layer's decode compute)."
    ),
    profile_out: Optional[Path] = typer.Option(None, "--profile-out", help="Also write the calibrated profile here."),
    threads: int = typer.Option(1, help="torch CPU threads (1 keeps timings steady on a shared machine)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON records (median_error is a fraction)."),
) -> None:
    """Fidelity: run the backend on the CPU with an emulated link, replay its own trace in the
    simulator with a calibrated profile, same policy and capacity; report the error of the
    median per-token latency."""
    from casmoe.backends.calibrate import calibrate as measure
    from casmoe.backends.copier import responsive_copies
    from casmoe.backends.validate import balanced_link, validate as compare
    from casmoe.options import one_capacity, parse_miss_mode

    modes = [parse_miss_mode(m) for m in miss_mode or ["load"]]
    om, tokenizer = _in_memory(model, threads, link_gbps, "float32")
    reqs = _prompts(tokenizer, prompts, num_prompts, max_prompt_tokens)
    if link_gbps is None:
        om.link = balanced_link(om, reqs, max_new_tokens)
    with responsive_copies():
        cal = measure(om, reqs, max_new_tokens=max_new_tokens)
    if profile_out is not None:
        cal.profile("validate").write(profile_out)
    names = policy or list(FIDELITY_POLICIES)
    cap = one_capacity(capacity, None, om.geometry)
    with _progress(len(reqs), "validate") as bar:
        results, _ = compare(om, reqs, names, cap, max_new_tokens=max_new_tokens, calibration=cal,
                             progress=lambda _policy: bar.update(), miss_modes=modes)
    measured = {f"calibrated_{k}": v for k, v in cal.to_dict().items() if k not in ("link_bandwidth", "link_latency")}
    records = [{"model": model, "link_gbps": om.link.bandwidth / 1e9, **r.to_dict(), **measured} for r in results]
    if as_json:
        typer.echo(json.dumps(records, indent=2))
        return
    if records[0]["too_noisy"]:
        import os

        from casmoe.backends.validate import NOISE_LIMIT

        typer.echo(f"too noisy to judge the simulator: the backend's own latency for the same work moved "
                   f"{records[0]['noise_floor']:.1%} during the validation (limit {NOISE_LIMIT:.0%}: identical baseline "
                   f"requests {records[0]['baseline_spread']:.1%} apart, the first run repeated "
                   f"{records[0]['repeat_error']:.1%}); run it on a quieter machine (load average {os.getloadavg()[0]:.1f})")
        return
    from casmoe.report import print_table

    rows = [
        {"policy": r["policy"], "miss mode": r["miss_mode"], "capacity": r["capacity"],
         "backend p50 ms": r["backend_median"] * 1e3, "sim p50 ms": r["sim_median"] * 1e3, "error": r["median_error"],
         "per-token error": r["token_error"], "mean error": r["mean_error"], "TTFT error": r["ttft_error"], "error (one calibration)": r["median_error_upfront"],
         "stall s backend/sim": f"{r['backend_stall']:.3g} / {r['sim_stall']:.3g}",
         "compute s backend/sim": f"{r['backend_compute']:.3g} / {r['sim_compute']:.3g}", "hit rate": r["hit_rate"]}
        for r in records
    ]
    print_table(rows, list(rows[0]), title=f"simulator vs backend, {model}, link {om.link.bandwidth / 1e9:.3g} GB/s "
                f"(noise floor {records[0]['noise_floor']:.1%}: the backend's first run repeated "
                f"{records[0]['repeat_error']:.1%} apart, baselines {records[0]['baseline_spread']:.1%})")


@validate_app.command("published")
def validate_published(
    fit: bool = typer.Option(False, "--fit", help="Also write the constants fitted on every row (the stacks' fitted "
                             "fields, the shared defaults) and the error model every figure's interval comes from."),
    out: Optional[Path] = typer.Option(None, help="Write validation.json and validation.csv here."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary and every row as JSON."),
) -> None:
    """Hold the simulator against published measurements of real offloading systems
    (casmoe/sim/trust/published/measurements.toml): each source's rows on a box predicted by
    constants fitted on every other setup, the error model's interval checked leaving whole
    sources out."""
    from casmoe.output import check_dir_target
    from casmoe.report import print_table, write_csv, write_json
    from casmoe.sim.questions.validation import validate as against_published
    from casmoe.sim.questions.validation import write_fitted

    if out is not None:
        check_dir_target(out, "--out")
    bar = _progress_steps("validate published")
    result = against_published(progress=bar)
    records = [r.to_dict() for r in result.results]
    summary = result.summary()
    document = {"summary": summary, "rows": records}
    if out is not None:
        write_json(out / "validation.json", document)
        write_csv(out / "validation.csv", records)
    if fit:
        for path in write_fitted(result):
            typer.echo(f"wrote {path}")
    if as_json:
        typer.echo(json.dumps(document, indent=2))
        return
    scored = [r for r in records if r["role"] != "out of scope"]
    print_table([{"row": r["id"], "stack": r["stack"], "role": r["role"] + (" (disputed)" if r["disputed"] else ""),
                  "published tok/s": r["published_tok_s"], "predicted tok/s": r["predicted_tok_s"], "ratio": r["ratio"],
                  "interval": f"x/÷ {r['interval_factor']:.2f}" if r["interval_factor"] else "",
                  "in": {True: "yes", False: "no", None: ""}[r["inside_interval"]]}
                 for r in scored], ["row", "stack", "role", "published tok/s", "predicted tok/s", "ratio", "interval", "in"],
                title="casmoe against published measurements (ratio = predicted / published; each source's rows "
                      "predicted by constants fitted on the other sources)")
    typer.echo(validation_line(summary))


def validation_line(summary: dict[str, Any]) -> str:
    """The summary in words: what was predicted, how far it landed, how often the interval held."""
    rank = summary["rankings"]
    text = (f"{summary['predicted']} rows of {summary['sources']} sources predicted, each leaving its source out "
            f"({summary['out_of_scope']} rows out of scope, {len(summary['beyond_bound'])} beyond their configuration's "
            f"bound, {len(summary['disputed'])} disputed: see --out or --json for why); "
            f"median |log ratio| {summary['median_abs_log_ratio']:.3f} (x{math.exp(summary['median_abs_log_ratio']):.2f}), "
            f"worst x{math.exp(summary['max_abs_log_ratio']):.2f}, {summary['beyond_2x']} beyond 2x; same-source rankings "
            f"kept {rank['kept']} of {rank['pairs']} pairs")
    if summary.get("interval_coverage") is not None:
        text += (f"; the 80% interval held {100 * summary['interval_coverage']:.0f}% of rows left out, median width "
                 f"x/÷ {summary['interval_median_factor']:.2f}")
    return text


def _progress_steps(desc: str):
    """A line per step on a terminal (the validation's steps are few and long)."""
    import sys

    def say(message: str) -> None:
        if sys.stderr.isatty():
            print(f"{desc}: {message}", file=sys.stderr, flush=True)

    return say

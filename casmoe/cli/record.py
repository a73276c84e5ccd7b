"""`casmoe record` (routing traces from a real model) and `casmoe train-tiny` (the shipped
tiny MoE models). torch and transformers are imported inside the commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from casmoe.cli.app import app


@app.command()
def record(
    model: str = typer.Option(..., "--model", "-m",
                              help="Shipped model name (tiny-mixtral, tiny-olmoe), a model folder, "
                                   "or a hub id whose weights are cached locally."),
    prompts: Path = typer.Option(..., "--prompts", "-p",
                                 help="Corpus JSONL (text, continuation, task, split) or text, one "
                                      "prompt a line."),
    out: Path = typer.Option(..., "--out", "-o", help="Trace file to write (.npz)."),
    decode: str = typer.Option("teacher", help="How tokens after the prompt are chosen: teacher "
                               "(the corpus row's real continuation, one forward pass; needs a "
                               "corpus JSONL), sample (temperature / top-p / top-k, seeded; for "
                               "prompts alone), or greedy (argmax; small models loop). Every mode "
                               "stops at end-of-text."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", "-n",
                                       help="Most tokens per request after the prompt."),
    temperature: float = typer.Option(1.0, help="Sampling temperature (--decode sample)."),
    top_p: float = typer.Option(0.9, help="Nucleus mass kept (--decode sample; 1: off)."),
    top_k: int = typer.Option(0, help="Most likely tokens kept (--decode sample; 0: off)."),
    seed: int = typer.Option(0, help="Sampling seed; request i draws from generator (seed, i)."),
    count: int = typer.Option(0, help="Record this many prompts, spread evenly over the file (0: all)."),
    max_prompt_tokens: int = typer.Option(256, help="Cut prompts to this many tokens (teacher: "
                                                    "the cut tokens lead the continuation)."),
    dtype: Optional[str] = typer.Option(None, help="float32, bfloat16 or float16 (default: the "
                                                   "checkpoint's dtype)."),
    logits: bool = typer.Option(False, "--logits", help="Also store full router logits [T, L, E]."),
    spec: bool = typer.Option(True, "--spec/--no-spec",
                              help="Store what layer l+1's router picks from layer l's output."),
    fp16_weights: bool = typer.Option(False, "--fp16-weights",
                                      help="Round router weights to fp16 precision (smaller file)."),
    batch: int = typer.Option(8, help="Prompts run together (left-padded)."),
    checkpoint_every: int = typer.Option(32, help="Save finished prompts to OUT.partial.npz this often."),
    threads: int = typer.Option(0, help="torch CPU threads (0: torch's default)."),
) -> None:
    """Run prompts through a MoE model and record prefill and decode routing, and each
    request's output tokens, as a casmoe trace. Resumable: rerun the same command after an
    interruption (a rerun that changes a setting affecting the result is refused)."""
    import torch

    from casmoe.backends.corpus import load_prompts, spread
    from casmoe.backends.record import DecodeMode, RecordSettings
    from casmoe.backends.record import record as run_record
    from casmoe.backends.models import DTYPES
    from casmoe.errors import CasmoeError

    modes = [m.value for m in DecodeMode]
    if decode not in modes:
        raise CasmoeError(f"--decode must be one of {', '.join(modes)}, not {decode!r}")
    if dtype is not None and dtype not in DTYPES:
        raise CasmoeError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    from casmoe.output import check_file_target

    check_file_target(out, "--out")
    if threads > 0:
        torch.set_num_threads(threads)
    rows = spread(load_prompts(prompts), count)
    settings = RecordSettings(
        max_new_tokens=max_new_tokens, decode=DecodeMode(decode), temperature=temperature,
        top_p=top_p, top_k=top_k, seed=seed, max_prompt_tokens=max_prompt_tokens, batch=batch,
        dtype=dtype, logits=logits, spec=spec, fp16_weights=fp16_weights)
    trace = run_record(model, rows, out, settings, checkpoint_every=checkpoint_every)
    print(json.dumps({"out": str(out), "requests": len(trace.requests), "tokens": trace.tokens,
                      "geometry": trace.geometry.describe()}))


@app.command("train-tiny")
def train_tiny(
    name: str = typer.Argument(..., help="tiny-mixtral or tiny-olmoe."),
    out: Optional[Path] = typer.Option(None, "--out", "-o",
                                       help="Output folder (default: traces/models/NAME)."),
    steps: Optional[int] = typer.Option(None, help="Training steps (default: the shipped run's)."),
    threads: Optional[int] = typer.Option(None, help="torch CPU threads (default: 1, as shipped)."),
    corpus: Optional[Path] = typer.Option(None, help="Corpus JSONL (default: the shipped one)."),
    balance: Optional[str] = typer.Option(None, help="Over which tokens the load-balancing loss "
                                          "counts expert loads: sequence (each row), batch, or "
                                          "global (the last --balance-window batches; default: "
                                          "the shipped model's)."),
    balance_window: Optional[int] = typer.Option(None, min=1, help="Batches counted together by "
                                                 "--balance global (default 8)."),
    balance_coef: Optional[float] = typer.Option(None, min=0.0, help="Load-balancing loss "
                                                 "coefficient (default: the model's config)."),
    locality_coef: Optional[float] = typer.Option(None, min=0.0, help="Coefficient of the routing "
                                                  "drift term (total variation between consecutive "
                                                  "tokens' router distributions; default: the "
                                                  "shipped model's)."),
    concentration_coef: Optional[float] = typer.Option(None, min=0.0, help="Coefficient of the "
                                                       "request concentration term (normalised "
                                                       "entropy of each text's mean router "
                                                       "distribution; default: the shipped model's)."),
) -> None:
    """Train a shipped tiny MoE model from random init on the corpus (seeded; prints the
    held-out perplexity and writes it to OUT/train.json)."""
    from dataclasses import replace

    from casmoe.backends.train import TINY_MODELS, Balance, TrainSettings
    from casmoe.backends.train import reproduction, train_tiny as run_train
    from casmoe.errors import CasmoeError
    from casmoe.shipped import data_dir

    if name not in TINY_MODELS:
        raise CasmoeError(f"unknown tiny model {name!r}; choose from {', '.join(TINY_MODELS)}")
    settings = TrainSettings()
    if steps is not None:
        settings = replace(settings, steps=steps)
    if threads is not None:
        settings = replace(settings, threads=threads)
    if balance is not None:
        choices = [b.value for b in Balance]
        if balance not in choices:
            raise CasmoeError(f"--balance must be one of {', '.join(choices)}, not {balance!r}")
        settings = replace(settings, balance=Balance(balance))
    if balance_window is not None:
        settings = replace(settings, balance_window=balance_window)
    if balance_coef is not None:
        settings = replace(settings, balance_coef=balance_coef)
    if locality_coef is not None:
        settings = replace(settings, locality_coef=locality_coef)
    if concentration_coef is not None:
        settings = replace(settings, concentration_coef=concentration_coef)
    folder = out or data_dir() / "models" / name
    result = run_train(name, folder, settings, corpus=corpus)
    print(json.dumps(result.to_dict(), indent=2))
    typer.echo(reproduction(name, folder, data_dir() / "models" / name), err=True)

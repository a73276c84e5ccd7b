"""Time `casmoe trace stats` (casmoe.workload.measure) and `synth --like` (casmoe.synthetic_fit).

    python bench/bench_workload.py [--repeat 2] [--fit] [--fit-only] [--fit-seeds 0,1,2] [--top-k-check]

Prints, per shipped trace, CPU seconds of the statistics (best of --repeat), with the hit
rates replayed on all requests and on a sample of 100; with --fit, the time to
fit the generator to each real trace, to generate from it, and how far its synthetic's caching
statistics land from the real ones (worst of three generation seeds). CPU time of this process (`time.process_time`), so other jobs on a shared
machine inflate it less than wall time.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from casmoe.importers import import_trace
from casmoe.workload import REAL_TRACES, STATS, measure

TRACES = Path(__file__).resolve().parents[1] / "traces"
SAMPLE = 100


def cpu(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--fit", action="store_true", help="also time synth --like on the real traces")
    ap.add_argument("--fit-only", action="store_true", help="only the --fit part")
    ap.add_argument("--fit-seeds", default="0", help="comma-separated seeds of the fit (one line each)")
    ap.add_argument("--top-k-check", action="store_true",
                    help="only: fit Qwen3's first 4 ranks, extrapolate to 6 (synth --top-k), compare")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}")
    paths = sorted(TRACES.glob("*.npz")) + [TRACES / "real" / n for n in REAL_TRACES]
    for path in [] if args.fit_only or args.top_k_check else paths:
        tr = import_trace([path])
        full, f = cpu(lambda: measure(tr, path.stem), args.repeat)
        line = f"{path.relative_to(TRACES)}: {len(tr.requests)} requests, {tr.tokens} tokens; stats {full:.2f} s"
        if len(tr.requests) > SAMPLE:
            part, s = cpu(lambda: measure(tr, path.stem, SAMPLE), args.repeat)
            dev = max(abs(s.model[k] - f.model[k]) for k in s.model if "@" in k)
            line += f"; --replay-requests {SAMPLE}: {part:.2f} s, largest hit-rate change {dev:.4f}"
        print(line, flush=True)
    if args.fit or args.fit_only:
        fit_report(tuple(int(x) for x in args.fit_seeds.split(",")))
    if args.top_k_check:
        topk_report()
    print(f"load average {os.getloadavg()[0]:.1f}")


def fit_report(fit_seeds: tuple[int, ...], seeds: tuple[int, ...] = (0, 1, 2), requests: int = 8) -> None:
    """Per real trace and fit seed: fit time, generation time, and synthetic - real of every
    caching statistic for `requests` generated requests under each seed in `seeds` (worst seed
    shown)."""
    from casmoe.synthetic_fit import fit, sample

    keys = [k for k in STATS if k.startswith(("lru@", "belady@", "srp"))]
    for file, fit_seed in ((n, f) for n in REAL_TRACES for f in fit_seeds):
        name = file.split(".")[0]
        tr = import_trace([TRACES / "real" / file])
        secs, model = cpu(lambda: fit(tr, name, fit_seed), 1)
        real = measure(tr).model
        diffs, gen = [], 0.0
        for seed in seeds:
            g, syn = cpu(lambda: sample(model, requests, seed), 1)
            gen = max(gen, g)
            diffs.append([measure(syn).model[k] - real[k] for k in keys])
        worst = np.array(diffs)[np.abs(diffs).argmax(axis=0), range(len(keys))]
        d = model.decode
        print(f"fit {name} (seed {fit_seed}): {secs:.1f} s, generate {requests} requests {gen:.2f} s; decode drift {d.drift}, "
              f"persistence {d.persistence}; synthetic - real (worst of seeds {list(seeds)}): "
              + ", ".join(f"{k} {v:+.3f}" for k, v in zip(keys, worst))
              + f"; max |diff| {np.abs(worst).max():.4f}", flush=True)


def top_ranks(trace, k: int):
    """`trace` as if its router took only its `k` heaviest experts per token (weights renormalised)."""
    from casmoe.trace import Request, Trace

    reqs = []
    for r in trace.requests:
        order = np.argsort(-r.weights, axis=2, kind="stable")[:, :, :k]
        ids, w = np.take_along_axis(r.topk, order, axis=2), np.take_along_axis(r.weights, order, axis=2)
        with np.errstate(invalid="ignore", divide="ignore"):
            w = np.where(ids >= 0, w / w.sum(axis=2, keepdims=True), 0).astype(np.float32)
        reqs.append(Request(topk=ids, weights=w, prefill=r.prefill, prompt=r.prompt, task=r.task))
    return Trace(replace(trace.geometry, top_k=k), reqs, dict(trace.meta))


def topk_report(file: str = "qwen.route.csv", fit_k: int = 4, seeds: tuple[int, ...] = (0, 1, 2), requests: int = 8) -> None:
    """`synth --like --top-k` checked on a real trace: fit its first `fit_k` ranks, extrapolate
    to the trace's own k, and compare (worst generation seed) with the real routing and with a
    fit at that k."""
    from casmoe.synthetic_fit import fit, sample, with_top_k

    keys = [k for k in STATS if k.startswith(("lru@", "belady@", "srp"))] + ["kept_share", "gini", "lift_shuffled", "exact_reuse"]
    tr = import_trace([TRACES / "real" / file])
    k = tr.geometry.top_k
    real = measure(tr).model
    low = top_ranks(tr, fit_k)
    low_real = measure(low).model
    t_low, m_low = cpu(lambda: fit(low, f"{file}@top{fit_k}", 0), 1)
    t_k, m_k = cpu(lambda: fit(tr, file, 0), 1)
    rows = {"extrapolated": with_top_k(m_low, k), "fitted at k": m_k}
    worst = {}
    for label, model in rows.items():
        diffs = [[measure(sample(model, requests, seed)).model[s] - real[s] for s in keys] for seed in seeds]
        worst[label] = np.array(diffs)[np.abs(diffs).argmax(axis=0), range(len(keys))]
    fit_low = [[measure(sample(m_low, requests, seed)).model[s] - low_real[s] for s in keys] for seed in seeds]
    worst["at fit_k"] = np.array(fit_low)[np.abs(fit_low).argmax(axis=0), range(len(keys))]
    print(f"{file}: fit at top-{fit_k} {t_low:.1f} s, at top-{k} {t_k:.1f} s (CPU)")
    print(f"| statistic | real top-{fit_k} | synthetic top-{fit_k} - real | real top-{k} | extrapolated {fit_k}->{k} - real | fitted at {k} - real |")
    print("|---|---|---|---|---|---|")
    for i, s in enumerate(keys):
        print(f"| {s} | {low_real[s]:.3f} | {worst['at fit_k'][i]:+.3f} | {real[s]:.3f} | {worst['extrapolated'][i]:+.3f} | {worst['fitted at k'][i]:+.3f} |")


if __name__ == "__main__":
    main()

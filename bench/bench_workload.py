"""Time `casmoe trace stats` (casmoe.workload.measure) and `synth --like` (casmoe.synthetic_fit).

    python bench/bench_workload.py [--repeat 2] [--fit] [--fit-only] [--fit-seeds 0,1,2]

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
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}")
    paths = sorted(TRACES.glob("*.npz")) + [TRACES / "real" / n for n in REAL_TRACES]
    for path in [] if args.fit_only else paths:
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


if __name__ == "__main__":
    main()

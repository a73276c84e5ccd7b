"""llama.cpp on this box against casmoe's prediction of the same runs.

`bench_llamacpp.py` builds llama.cpp from source, writes GGUFs of MoE models at their real
widths (a few layers each) and runs llama-bench on them: `measured/*.json`, one file per
(model file, thread count), llama-bench's own `-o json` output with the load the box carried
during the run. This script predicts every test of those files with casmoe on a profile of this
box (`box.toml`: `casmoe hardware detect`, host bandwidth measured by the STREAM-like program
of `bench_llamacpp.py`), on the llama.cpp stack, and writes the comparison.

Fair by construction: the llama.cpp stack's fitted fields (the host kernels' share of the DRAM
bandwidth and of the FLOP peak, the per-layer cost) are fitted on the other models' runs and
the held-out model's runs are predicted (leave one model out); a model's own runs never reach
its prediction. The fit is `casmoe.sim.questions.validation.fit_stack`, the one that fits the
published table, on rows read by `casmoe calibrate measured`'s llama-bench reader.

The GGUF files (tens of GB) stay out of the repository: casmoe reads only their headers, so
`headers/` keeps each file's header bytes and size, and this script rebuilds each as a sparse
file of the same size (its tensor data reads as zeros; nothing reads it) before predicting.

    python bench/llamacpp/compare.py                 # every measured run, results/compare.{json,csv}
    python bench/llamacpp/compare.py --save-headers /work/llama/gguf   # after making new GGUFs
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MEASURED = HERE / "measured"
HEADERS = HERE / "headers"
RESULTS = HERE / "results"
BOX = HERE / "box.toml"
FIELDS = ("host_efficiency", "host_flops_efficiency", "layer_us")
"""The llama.cpp stack's fields fitted on the other models' runs (what a CPU-only run's time
depends on besides the hardware's numbers)."""
MAX_FOREIGN_CORES = 0.25
"""A run during which other processes used more than this many cores is left out: two-thread
ggml runs degrade far beyond the stolen share when a core is taken away mid-run."""


# ---- the GGUF headers -------------------------------------------------------------------------------


def save_headers(gguf_dir: Path) -> None:
    """Keep each measured run's GGUF as its header bytes and its size (`headers/`)."""
    from casmoe.presets.gguf_header import read_header

    HEADERS.mkdir(exist_ok=True)
    manifest = _manifest()
    for name in sorted({Path(t["model_filename"]).name for _, t in _tests()}):
        path = gguf_dir / name
        header = read_header(path)
        start = min(t.offset for t in header.tensors)  # the data section: nothing before it is tensor data
        with open(path, "rb") as fh:
            head = fh.read(start)
        (HEADERS / f"{name}.head").write_bytes(head)
        manifest[name] = {"size": path.stat().st_size, "head_sha256": hashlib.sha256(head).hexdigest()}
    (HEADERS / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def _manifest() -> dict[str, Any]:
    path = HEADERS / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {}


def materialize(folder: Path) -> dict[str, Path]:
    """Every kept header as a sparse file of its GGUF's size in `folder`: what casmoe reads."""
    out = {}
    for name, entry in _manifest().items():
        head = (HEADERS / f"{name}.head").read_bytes()
        if hashlib.sha256(head).hexdigest() != entry["head_sha256"]:
            raise SystemExit(f"headers/{name}.head does not match its manifest entry")
        target = folder / name
        with open(target, "wb") as fh:
            fh.write(head)
            fh.truncate(entry["size"])
        out[name] = target
    return out


# ---- the measured runs ------------------------------------------------------------------------------


def _tests() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(run document, llama-bench test) for every test of every measured file."""
    out = []
    for path in sorted(MEASURED.glob("*.json")):
        doc = json.loads(path.read_text())
        out += [(doc, t) for t in doc["llama_bench"]]
    return out


def model_of(filename: str) -> str:
    """The model a GGUF of `bench_llamacpp.py` holds: its name before the layer count."""
    stem = Path(filename).stem
    return stem[: stem.rindex("-", 0, stem.rindex("L-"))]


def measured_rows(files: dict[str, Path], box: Path, max_foreign: float = MAX_FOREIGN_CORES) -> tuple[list[Any], list[str]]:
    """The quiet runs' tests as published-schema rows (casmoe calibrate's llama-bench reader),
    and why the others were left out."""
    from casmoe.sim.questions.measured_files import Context, read
    from casmoe.sim.questions.validation import row_from_dict

    rows, dropped = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for k, (doc, test) in enumerate(_tests()):
            name = Path(test["model_filename"]).name
            label = f"{name} t{test['n_threads']} {'pp' if test['n_prompt'] else 'tg'}"
            foreign = doc.get("foreign_cores_during", 0.0)
            if foreign > max_foreign or doc.get("busy_at_start"):
                dropped.append(f"{label}: other processes used {foreign:.2f} cores during the run")
                continue
            one = Path(tmp) / f"{k}.json"
            one.write_text(json.dumps([{**test, "model_filename": str(files[name])}]))
            for raw in read(one, Context(str(box))).rows:
                raw["id"] = f"{Path(name).stem}-t{test['n_threads']}-{'pp' if test['n_prompt'] else 'tg'}"
                raw["model"], raw["kind"] = model_of(name), "measured here"
                rows.append(row_from_dict(raw, str(one)))
    return rows, dropped


# ---- leave one model out ----------------------------------------------------------------------------


def compare(rows: list[Any]) -> list[dict[str, Any]]:
    """Each model's runs predicted by the llama.cpp stack fitted on the other models' runs."""
    from casmoe.sim.cost.stack import load_shared, load_stack
    from casmoe.sim.questions.validation import fit_stack, predict

    shared, base = load_shared(), load_stack("llama.cpp")
    out = []
    for model in sorted({r.model for r in rows}):
        mine = [r for r in rows if r.model == model]
        others = {r.id: r for r in rows if r.model != model}
        if not others:
            raise SystemExit(f"{model}: no other model's quiet runs to fit the stack on (measure more)")
        start = replace(base, fitted_on={f: list(others) for f in FIELDS})
        fitted, _ = fit_stack(start, others, shared)
        stack = fitted.resolved(shared)
        for r in mine:
            predicted = predict(r, stack)
            out.append({"id": r.id, "model": model, "file": Path(r.run["model"]).name,
                        "threads": r.run.get("cpu_threads"), "test": "pp" if r.prefill else "tg",
                        "measured_tok_s": r.rate, "predicted_tok_s": predicted, "ratio": predicted / r.rate,
                        "fitted_on": len(others), **{f: getattr(stack, f) for f in FIELDS}})
        print(f"{model}: {len(mine)} runs predicted from {len(others)} runs of the other models "
              f"({', '.join(f'{f} {getattr(stack, f):.4g}' for f in FIELDS)})", file=sys.stderr)
    return out


def _errors(results: list[dict[str, Any]]) -> dict[str, Any]:
    logs = [abs(math.log(r["ratio"])) for r in results]
    return {"runs": len(results), "median_abs_log_ratio": statistics.median(logs),
            "median_ratio": statistics.median(r["ratio"] for r in results),
            "within_15_percent": sum(x <= math.log(1.15) for x in logs),
            "beyond_1_5x": [r["id"] for r in results if abs(math.log(r["ratio"])) > math.log(1.5)],
            "max_abs_log_ratio": max(logs)}


def summary(results: list[dict[str, Any]], dropped: list[str]) -> dict[str, Any]:
    """The errors over every run, and apart for decode (llama-bench's tg) and prefill (pp): the
    two stress different parts of the model (bytes streamed against FLOPs)."""
    by_test = {test: _errors(runs) for test in ("tg", "pp") if (runs := [r for r in results if r["test"] == test])}
    return {**_errors(results), "models": len({r["model"] for r in results}), "left_out_runs": dropped,
            "by_test": by_test}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save-headers", type=Path, metavar="GGUF_DIR",
                    help="keep the headers of the measured runs' GGUFs from this folder (after new GGUFs)")
    ap.add_argument("--box", type=Path, default=BOX, help="the box's profile (default: bench/llamacpp/box.toml)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where compare.json and compare.csv go")
    ap.add_argument("--max-foreign-cores", type=float, default=MAX_FOREIGN_CORES,
                    help="leave out runs during which other processes used more cores than this")
    args = ap.parse_args()
    if args.save_headers:
        save_headers(args.save_headers)
    with tempfile.TemporaryDirectory() as tmp:
        files = materialize(Path(tmp))
        rows, dropped = measured_rows(files, args.box, args.max_foreign_cores)
        if not rows:
            raise SystemExit(f"no quiet llama-bench run to compare in {MEASURED} ({len(dropped)} left out as busy); "
                             "run bench_llamacpp.py first")
        results = compare(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"summary": summary(results, dropped), "runs": results}
    (args.out / "compare.json").write_text(json.dumps(doc, indent=1) + "\n")
    with open(args.out / "compare.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)
    s = doc["summary"]
    print(f"{s['runs']} runs of {s['models']} models, each predicted with constants fitted on the other models: "
          f"median |log ratio| {s['median_abs_log_ratio']:.3f} (x{math.exp(s['median_abs_log_ratio']):.2f}), "
          f"{s['within_15_percent']} within 15%, {len(s['beyond_1_5x'])} beyond 1.5x; "
          f"{len(dropped)} runs left out (the box was busy)")


if __name__ == "__main__":
    main()

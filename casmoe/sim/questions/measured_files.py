"""What users already have, read as measured rows: llama-bench's output and llama-server's logs.

A user who ran llama.cpp on their own box holds its numbers in one of these forms, and
`casmoe calibrate measured FILE` reads each (the published table's `[[row]]` schema, which
`casmoe.sim.questions.calibration` fits on, is what they become):

- llama-bench's `-o json` (a list of tests), `-o jsonl` (one test a line), `-o csv` (a header
  line naming the fields) and `-o md` (its default table) — every format of
  tools/llama-bench/llama-bench.cpp's printers, the same fields in each: `n_threads`,
  `n_gpu_layers`, `n_cpu_moe`, `n_prompt`, `n_gen`, `n_depth`, `avg_ts`, the model file;
  the markdown table keeps only some of them (model type, backend, threads, test, t/s);
- llama-server's (and llama-cli's) timing lines: `prompt eval time = X ms / N tokens (...,
  R tokens per second)` and `eval time = X ms / N tokens (...)`, one pair per request.

A test becomes a row: `tg` (n_gen tokens) a decode rate, `pp` (n_prompt tokens) a prefill rate
at that prompt length, a test at a depth (`n_depth`) that many tokens of context; a test that
mixes both (`pg`) is left out, said in a note. What the files do not say is given: the box
(`--hardware`, a profile: `casmoe hardware detect` writes this machine's) and, where the file
names none or it is not at hand, the model (`--model`, a GGUF or a preset). Where the experts
ran follows from the flags the output records: no GPU in the box, or `-ngl 0`, computes every
part on the host; `--n-cpu-moe N` keeps the first N layers' experts there; otherwise every
expert is on the GPU. A run that keeps whole layers off the GPU (`-ngl` below the model's
layers) is not a placement casmoe prices, and is refused in one line.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from casmoe.errors import CasmoeError
from casmoe.presets.gguf import model_preset
from casmoe.sim.box.hardware import load_profile


class MeasuredFileError(CasmoeError, ValueError):
    """A file that is none of the formats read here, or that lacks what a row needs."""


@dataclass(frozen=True)
class Context:
    """What the rows' runs take that the files do not say: the box, the model (when the file
    names none, or it is not at hand), the stack."""

    hardware: str
    model: str | None = None
    stack: str = "llama.cpp"


@dataclass
class Read:
    """Rows in the published schema, and what was left out and why."""

    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)


SERVER_LINE = re.compile(r"(?P<what>prompt eval|eval) time\s*=\s*(?P<ms>[\d.]+)\s*ms\s*/\s*(?P<tokens>\d+)\s*(?:tokens|runs)")
MD_RATE = re.compile(r"^\s*(?P<rate>[\d.]+)\s*(?:±\s*(?P<sd>[\d.]+))?\s*$")
MD_TEST = re.compile(r"^(?P<kind>pp|tg|pg)(?P<n>\d+)(?:\s*@\s*d(?P<depth>\d+))?$")


def kind_of(text: str) -> str:
    """Which format a file's text is (`json`, `jsonl`, `csv`, `md`, `server`), or why none."""
    stripped = text.lstrip("\ufeff").lstrip()
    if re.match(r"\[\s*(\{|\])", stripped):  # a JSON list of tests (a TOML file starts `[[row]]` or `[table]`)
        return "json"
    if re.match(r"\{\s*\"", stripped):
        return "jsonl"
    if stripped.startswith("build_commit") or stripped.startswith('"build_commit"'):
        return "csv"
    if re.search(r"^\|\s*model\s*\|", stripped, re.M):
        return "md"
    if SERVER_LINE.search(text):
        return "server"
    return ""


def is_engine_output(path: Path) -> bool:
    """Whether `path` holds llama-bench output or llama-server timings (not casmoe's own rows)."""
    try:
        head = path.read_text(encoding="utf-8-sig", errors="replace")[:65536]
    except OSError:
        return False
    return bool(kind_of(head))


def read(path: Path, context: Context) -> Read:
    """`path`'s tests as measured rows (see the module docstring)."""
    text = path.read_text(encoding="utf-8-sig")
    kind = kind_of(text)
    if kind == "server":
        return _server(text, path, context)
    tests = {"json": _json, "jsonl": _jsonl, "csv": _csv, "md": _md}.get(kind)
    if tests is None:
        raise MeasuredFileError(f"{path}: neither casmoe's [[row]] tables nor llama-bench output (-o json, jsonl, csv, md) "
                                "nor llama-server timing lines")
    out = Read([])
    for k, test in enumerate(tests(text, path)):
        row = _row(test, k, path, context, out.notes)
        if row is not None:
            out.rows.append(row)
    if not out.rows:
        raise MeasuredFileError(f"{path}: no test casmoe can price ({'; '.join(out.notes) or 'none found'})")
    return out


# ---- llama-bench ------------------------------------------------------------------------------------


def _json(text: str, path: Path) -> list[dict[str, Any]]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MeasuredFileError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(doc, list) or not all(isinstance(t, dict) for t in doc):
        raise MeasuredFileError(f"{path}: llama-bench's -o json is a list of tests; this is not")
    return doc


def _jsonl(text: str, path: Path) -> list[dict[str, Any]]:
    tests = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                tests.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise MeasuredFileError(f"{path}: line {n} is not a JSON test ({exc.msg})") from None
    return tests


def _csv(text: str, path: Path) -> list[dict[str, Any]]:
    return [dict(r) for r in csv.DictReader(io.StringIO(text))]


def _md(text: str, path: Path) -> list[dict[str, Any]]:
    """The markdown table: its header names the columns (which vary with the flags given)."""
    lines = [line for line in text.splitlines() if line.strip().startswith("|")]
    if len(lines) < 3:
        raise MeasuredFileError(f"{path}: a llama-bench table needs a header, a rule and a test line")
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    header = cells[0]
    tests = []
    for n, row in enumerate(cells[2:], 3):
        d = dict(zip(header, row))
        m, r = MD_TEST.match(d.get("test", "")), MD_RATE.match(d.get("t/s", ""))
        if m is None or r is None:
            raise MeasuredFileError(f"{path}: table line {n}: a test such as pp512 or tg128 and a t/s such as "
                                    f"'12.3 ± 0.1' are needed (got {d.get('test')!r}, {d.get('t/s')!r})")
        count = int(m.group("n"))
        tests.append({"n_prompt": count if m.group("kind") == "pp" else 0, "n_gen": count if m.group("kind") == "tg" else 0,
                      "n_depth": int(m.group("depth") or 0), "avg_ts": float(r.group("rate")),
                      "n_threads": d.get("threads"), "n_gpu_layers": d.get("ngl"), "n_cpu_moe": d.get("n_cpu_moe"),
                      "model_type": d.get("model"), "mixed": m.group("kind") == "pg"})
    return tests


def _number(value: Any) -> int | None:
    if value in (None, ""):
        return None
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def _row(test: dict[str, Any], k: int, path: Path, context: Context, notes: list[str]) -> dict[str, Any] | None:
    prompt, gen, depth = (_number(test.get(n)) or 0 for n in ("n_prompt", "n_gen", "n_depth"))
    label = f"test {k + 1} ({'pp' if prompt else 'tg'}{prompt or gen}{f' @ d{depth}' if depth else ''})"
    if test.get("mixed") or (prompt and gen):
        notes.append(f"{label}: a prompt and generation together (pg) has no one rate to fit; left out")
        return None
    rate = float(test.get("avg_ts") or 0)
    if not rate > 0:
        raise MeasuredFileError(f"{path}: {label} has no tokens/s (avg_ts)")
    model = _model(test, path, context, label)
    run: dict[str, Any] = {"model": model, "hardware": context.hardware, "stack": context.stack}
    threads = _number(test.get("n_threads"))
    if threads:
        run["cpu_threads"] = threads
    run.update(_placement(test, model, context, label, path))
    if depth:
        run["context"] = depth + (prompt or gen)
    stem = Path(str(test.get("model_filename") or model)).stem
    row = {"id": f"{stem}-{k + 1}", "system": "llama.cpp", "source": str(path),
           "metric": "prefill_tok_s" if prompt else "decode_tok_s", "value": rate, "run": run}
    if prompt:
        row["prompt_tokens"] = prompt
    return row


def _model(test: dict[str, Any], path: Path, context: Context, label: str) -> str:
    """The model a test ran: `--model`, else the GGUF the output names when it is at hand."""
    if context.model:
        return context.model
    named = test.get("model_filename")
    if named and Path(named).is_file():
        return str(named)
    where = f"the file it names ({named}) is not here" if named else "the output names no file (-o md)"
    raise MeasuredFileError(f"{path}: {label}: {where}; give --model (the GGUF it ran, or a preset)")


def _placement(test: dict[str, Any], model: str, context: Context, label: str, path: Path) -> dict[str, Any]:
    """Where the experts ran, from the flags the test records (see the module docstring)."""
    box = load_profile(context.hardware)
    ngl, ncmoe = _number(test.get("n_gpu_layers")), _number(test.get("n_cpu_moe")) or 0
    layers, experts = _shape(model)
    if box.host_only or ngl == 0:
        if not box.host_only:
            raise MeasuredFileError(f"{path}: {label}: -ngl 0 on a box with a GPU keeps every layer on the host, the "
                                    "attention too: not a placement casmoe prices (give a profile without a GPU for a "
                                    "CPU-only run)")
        return {"policy": f"n-cpu-moe[n={layers}]", "global_capacity": "0"}
    if ngl is not None and 0 < ngl < layers:
        raise MeasuredFileError(f"{path}: {label}: -ngl {ngl} keeps whole layers off the GPU, attention included: not a "
                                "placement casmoe prices (--n-cpu-moe keeps only experts on the host)")
    held = max(layers - ncmoe, 0) * experts
    return {"policy": f"n-cpu-moe[n={ncmoe}]", "global_capacity": str(held)}


def _shape(model: str) -> tuple[int, int]:
    """MoE layers and experts of a GGUF or a preset."""
    g = model_preset(model).geometry
    return g.layers, g.experts


# ---- llama-server ------------------------------------------------------------------------------------


def _server(text: str, path: Path, context: Context) -> Read:
    """Each request's `prompt eval time` and `eval time` lines: its prefill and decode rates."""
    if context.model is None:
        raise MeasuredFileError(f"{path}: llama-server's log does not name its model in the timing lines; give --model")
    model = context.model
    placement = _placement({"n_gpu_layers": None, "n_cpu_moe": 0}, model, context, "the server", path)
    out = Read([])
    request = 0
    for m in SERVER_LINE.finditer(text):
        ms, tokens = float(m.group("ms")), int(m.group("tokens"))
        if not ms > 0 or not tokens:
            continue
        prefill = m.group("what") == "prompt eval"
        request += prefill
        run = {"model": model, "hardware": context.hardware, "stack": context.stack, **placement}
        row = {"id": f"request-{max(request, 1)}-{'prefill' if prefill else 'decode'}", "system": "llama.cpp",
               "source": str(path), "metric": "prefill_tok_s" if prefill else "decode_tok_s",
               "value": tokens / ms * 1e3, "run": run}
        if prefill:
            row["prompt_tokens"] = tokens
        out.rows.append(row)
    ids = [r["id"] for r in out.rows]
    for i, rid in enumerate(ids):  # a decode line without its prompt line, twice over: keep ids unique
        if ids.count(rid) > 1:
            out.rows[i]["id"] = f"{rid}-{i + 1}"
    out.notes.append("llama-server's lines say neither --n-cpu-moe nor -ngl: every expert is taken to be on the GPU "
                     "(on a box with one), else on the host")
    return out

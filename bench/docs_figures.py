"""Fill the figures the docs quote from the results files they come from.

No number in README.md, docs/*.md or bench/RESULTS.md that a command measured is typed by hand
where a results file holds it: the text marks the spot and names the file and the value,

    median |log ratio| <!-- figure: validation.summary.median_abs_log_ratio .3f -->0.225<!-- /figure -->

and this script writes the value between the markers. A figure names a results file by its key in
`SOURCES`, then a path into it: `.key` into an object, `[3]` an element of a list,
`[policy=lru,capacity_slots=4]` the one element of a list whose fields equal those values (compared
as text). After the path, separated by spaces, what is done to the value, left to right: `exp` (e to
the value: a median |log ratio| as a factor), `pct` (times 100), `len` (the length of a list), `sig`
(three significant digits, as casmoe prints figures), `count=VALUE` (how many elements of a list equal
VALUE), `with=KEY` (the elements of a list that have the field KEY), `where=KEY=VALUE` (the elements
whose field KEY is VALUE), `max=KEY` and `min=KEY` (the largest and smallest field KEY of a list), `distinct=KEY` (how many values
the field KEY takes in a list) and last, optionally, a Python format spec (`.3f`, `.0f`, `,`).

A block that a function writes (a table of the registry, the main job's headline) sits between

    <!-- generated: NAME -->
    ...
    <!-- /generated -->

with NAME a key of `GENERATED`.

    python bench/docs_figures.py           # check: one line per spot that disagrees with its file, exit 1
    python bench/docs_figures.py --write   # fill every spot from its file

Run `--write` after a results file is made again (`casmoe validate published --out
bench/published-validation`, `casmoe simulate --out bench/readme-figures/simulate --plots none`,
`python bench/time_suite.py`, ...). tests/project/test_docs.py fails while a spot disagrees with its file.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]

SOURCES = {
    "main": "bench/readme-figures/simulate/results.json",
    "plan": "bench/readme-figures/plan/plan.json",
    "validation": "bench/published-validation/validation.json",
    "validation_run": "bench/published-validation/run.json",
    "suite": "bench/results/suite.json",
    "planner_speed": "bench/planner-bench/speed-s5.json",
    "embedder": "bench/planner-bench/embedder.json",
    "backend_memory": "bench/backend-memory.json",
    "backend_validate_1": "bench/validate/s5-run1.json",
    "backend_validate_2": "bench/validate/s5-run2.json",
    "leaderboard": "bench/leaderboard/2026-12-07/leaderboard.md",
    "leaderboard_run": "bench/leaderboard/2026-12-07/run.json",
    "calibrate": "bench/results/calibrate-measured.json",
    "llamacpp": "bench/llamacpp/results/compare.json",
    "measurements": "casmoe/sim/trust/published/measurements.toml",
    "corpus": "traces/corpus/corpus.jsonl",
}
"""The results files a figure may name, by key; each is written by the command its section of
bench/RESULTS.md names."""

FIGURE = re.compile(r"<!-- figure: (?P<spec>[^>]*?) -->(?P<value>.*?)<!-- /figure -->", re.S)
GENERATED_BLOCK = re.compile(r"(?P<open><!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(?P<close><!-- /generated -->)",
                             re.S)


class FigureError(ValueError):
    """A figure that names no results file, or a path or step its file does not have."""


def documents(root: Path = ROOT) -> list[Path]:
    """The files whose marked spots this script fills."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "bench" / "RESULTS.md"]


def load_source(name: str, root: Path = ROOT) -> Any:
    if name not in SOURCES:
        raise FigureError(f"no results file named {name!r} (bench/docs_figures.py SOURCES: {', '.join(SOURCES)})")
    path = root / SOURCES[name]
    if not path.exists():
        raise FigureError(f"{SOURCES[name]} does not exist: make it with the command bench/RESULTS.md names for it")
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if path.suffix == ".md":
        return path.read_text(encoding="utf-8")
    if path.suffix == ".toml":
        import tomllib

        return tomllib.loads(path.read_text(encoding="utf-8"))
    return json.loads(path.read_text(encoding="utf-8"))


def _select(value: Any, selector: str, where: str) -> Any:
    if selector.lstrip("-").isdigit():
        return value[int(selector)]
    wanted = dict(part.split("=", 1) for part in selector.split(","))
    found = [v for v in value if all(str(v.get(k)) == w for k, w in wanted.items())]
    if len(found) != 1:
        raise FigureError(f"{where}: [{selector}] selects {len(found)} elements, not one")
    return found[0]


def lookup(path: str, sources: dict[str, Any]) -> Any:
    """The value at `path` (`source.key[selector].key`) in the results files, loaded once into
    `sources`."""
    name, *tokens = re.findall(r"\[[^\]]*\]|[^.\[\]]+", path)
    if name not in sources:
        sources[name] = load_source(name)
    value = sources[name]
    for token in tokens:
        try:
            value = _select(value, token[1:-1], path) if token.startswith("[") else value[token]
        except (KeyError, IndexError, TypeError) as exc:
            raise FigureError(f"{path}: no {token!r} ({exc.__class__.__name__})") from None
    return value


def _sig(x: float) -> str:
    from casmoe.report import sig

    return sig(float(x))


STEPS: dict[str, Callable[[Any], Any]] = {
    "exp": lambda v: math.exp(float(v)),
    "pct": lambda v: 100 * float(v),
    "len": len,
    "sig": _sig,
}


def figure(spec: str, sources: dict[str, Any]) -> str:
    """The text of one figure: its value, each step applied, formatted."""
    path, *steps = spec.split()
    value = lookup(path, sources)
    for step in steps:
        if step in STEPS:
            value = STEPS[step](value)
        elif step.startswith("count="):
            value = sum(str(v) == step[len("count="):] for v in value)
        elif step.startswith("with="):
            value = [v for v in value if step[len("with="):] in v]
        elif step.startswith("distinct="):
            value = len({str(v.get(step[len("distinct="):])) for v in value})
        elif step.startswith("where="):
            key, _, want = step[len("where="):].partition("=")
            value = [v for v in value if str(v.get(key)) == want]
        elif step.startswith(("max=", "min=")):
            key = step[4:]
            value = (max if step.startswith("max") else min)(float(v[key]) for v in value)
        elif re.fullmatch(r"[,_]?\.?\d*[,_]?[a-z%]?", step):
            value = format(float(value) if isinstance(value, str) else value, step)
        else:
            raise FigureError(f"{spec}: unknown step {step!r} (steps: {', '.join(STEPS)}, count=VALUE, with=KEY, "
                             "where=KEY=VALUE, max=KEY, min=KEY, distinct=KEY, a format spec)")
    return str(value)


# ---- generated blocks -------------------------------------------------------------------------


def _policies() -> str:
    """Every registered policy: its name, family, one-line summary and the runtime that prices it."""
    from casmoe.policies import POLICIES
    from casmoe.policies.family import family_of

    lines = ["| policy | family | what it does | its runtime's stack |", "|---|---|---|---|"]
    for name, cls in POLICIES.items():
        runtime = f"`{cls.runtime}`" if cls.runtime else "none named"
        lines.append(f"| `{name}` | {family_of(cls).value} | {cls.summary} | {runtime} |")
    return "\n".join(lines) + "\n"


def _headline() -> str:
    """The main job's answer per cache size, as `casmoe simulate` prints it, from its results file."""
    from casmoe.summary import headline

    records = load_source("main")
    return "```text\n" + "\n".join(headline(records)) + "\n```\n"


def _validation() -> str:
    """`casmoe validate published`'s closing line, from its results file."""
    from casmoe.cli.backend import validation_line

    return validation_line(load_source("validation")["summary"]) + "\n"


def _decode_table(section: str) -> str:
    """A leaderboard.md section's decode table, every row with both its outer pipes, as every
    Markdown reads it (the file's own separator row has a trailing pipe its rows lack)."""
    table = ("decode tok/s " + section.split("\ndecode tok/s ", 1)[1]).split("\n\n", 1)[0]
    return "\n".join("| " + " | ".join(cell.strip() for cell in line.strip().strip("|").split("|")) + " |"
                     for line in table.splitlines())


def _leaderboard_run() -> str:
    run = load_source("leaderboard_run")
    return (f"`{SOURCES['leaderboard']}`: `{run['command']}`, run on {run['date']} at commit {run['commit']} "
            f"({run['machine']})")


def _leaderboard() -> str:
    """The first workload's decode table of the leaderboard's own leaderboard.md, under a line
    saying which run made it (its run.json)."""
    section = load_source("leaderboard").split("\n### ")[0]
    heading = section.splitlines()[0].lstrip("# ")
    return f"{_leaderboard_run()}. {heading}.\n\n{_decode_table(section)}\n"


def _leaderboard_all() -> str:
    """Every workload's decode table of the leaderboard's leaderboard.md, each under its heading."""
    sections = load_source("leaderboard").lstrip("# ").split("\n### ")
    parts = [f"{_leaderboard_run()}.\n"]
    for section in sections:
        lines = section.splitlines()
        parts.append(f"{lines[0]}; {lines[2]}:\n\n{_decode_table(section)}\n")
    return "\n".join(parts)


def _main_table() -> str:
    """The main job's hit rate and decode tok/s per policy (oracles starred) and cache size."""
    from casmoe.report import policy_label, sig

    records = load_source("main")
    sizes = sorted({(r["capacity_gb"], r["capacity"]) for r in records})
    rows: dict[str, dict[str, str]] = {}
    for r in records:
        rows.setdefault(policy_label(r), {})[r["capacity"]] = f"{r['hit_rate']:.3f} / {sig(r['decode_tokens_per_s'])}"
    lines = ["| policy | " + " | ".join(f"{c} ({sig(gb)} GB)" for gb, c in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    lines += [f"| {label} | " + " | ".join(cells.get(c, "-") for _, c in sizes) + " |" for label, cells in rows.items()]
    return "\n".join(lines) + "\n"


def _validation_by_stack() -> str:
    """Per stack: rows predicted and the median |log ratio| (as a factor), from validate published's summary."""
    v = load_source("validation")
    scored = [r for r in v["rows"] if r["role"] == "predicted" and not r["disputed"] and r["ratio"] is not None]
    lines = ["| stack | rows predicted | median abs log ratio | as a factor |", "|---|---|---|---|"]
    for stack, med in v["summary"]["median_abs_log_ratio_by_stack"].items():
        n = sum(r["stack"] == stack for r in scored)
        lines.append(f"| `{stack}` | {n} | {med:.3f} | x{math.exp(med):.2f} |")
    return "\n".join(lines) + "\n"


def _validation_misses() -> str:
    """The predicted rows beyond 2x of their published figure, worst first."""
    from casmoe.report import sig

    v = load_source("validation")
    misses = sorted((r for r in v["rows"] if r["id"] in set(v["summary"]["beyond_2x_rows"])),
                    key=lambda r: -abs(math.log(r["ratio"])))
    lines = ["| row | stack | published tok/s | predicted tok/s | ratio | 80% interval |", "|---|---|---|---|---|---|"]
    for r in misses:
        interval = f"x/÷ {r['interval_factor']:.2f}" if r["interval_factor"] else ""
        lines.append(f"| `{r['id']}` | `{r['stack']}` | {sig(r['published_tok_s'])} | {sig(r['predicted_tok_s'])} | "
                     f"{sig(r['ratio'])} | {interval} |")
    return "\n".join(lines) + "\n"


def _stacks() -> str:
    """Every shipped stack: what it stands for and the published rows its fitted fields came from."""
    from casmoe.sim.cost.stack import load_stack, stack_paths

    lines = ["| stack | what it is | fitted on |", "|---|---|---|"]
    for name in sorted(stack_paths()):
        s = load_stack(name)
        fitted = "; ".join(f"`{f}`: {len(rows)} row{'s' * (len(rows) != 1)}" for f, rows in sorted(s.fitted_on.items())) or "nothing fitted"
        lines.append(f"| `{name}` | {s.description} | {fitted} |")
    return "\n".join(lines) + "\n"


def _suite_longest() -> str:
    """The default suite's longest tests at its last timing (bench/results/suite.json)."""
    longest = load_source("suite")["longest"][:6]
    return "\n".join(f"- {t['seconds']} s: `{t['test']}`" for t in longest)


GENERATED: dict[str, Callable[[], str]] = {
    "suite-longest": _suite_longest,
    "policies": _policies,
    "headline": _headline,
    "validation-line": _validation,
    "stacks": _stacks,
    "leaderboard-decode": _leaderboard,
    "leaderboard-all": _leaderboard_all,
    "main-table": _main_table,
    "validation-by-stack": _validation_by_stack,
    "validation-misses": _validation_misses,
}


# ---- filling and checking ---------------------------------------------------------------------


def block_text(name: str) -> str:
    """What stands between a generated block's markers: its function's text between blank lines,
    so Markdown reads it as a block of its own, apart from the comments."""
    if name not in GENERATED:
        raise FigureError(f"no generated block named {name!r} (bench/docs_figures.py GENERATED)")
    return "\n" + GENERATED[name]() + "\n"


def fill(text: str, sources: dict[str, Any]) -> str:
    """`text` with every marked spot holding what its results file or function says."""

    def one(m: re.Match) -> str:
        return f"<!-- figure: {m['spec']} -->{figure(m['spec'], sources)}<!-- /figure -->"

    def block(m: re.Match) -> str:
        return m["open"] + block_text(m["name"]) + m["close"]

    return GENERATED_BLOCK.sub(block, FIGURE.sub(one, text))


def stale_text(text: str, where: str, sources: dict[str, Any]) -> list[str]:
    """One line per marked spot of `text` that disagrees with its results file or function."""
    out = []
    for m in FIGURE.finditer(text):
        want = figure(m["spec"], sources)
        if m["value"] != want:
            out.append(f"{where}: figure {m['spec']!r} reads {m['value']!r}, its file says {want!r}")
    for m in GENERATED_BLOCK.finditer(text):
        if m["body"] != block_text(m["name"]):
            out.append(f"{where}: generated block {m['name']!r} differs from what it is made of")
    return out


def stale(path: Path, sources: dict[str, Any]) -> list[str]:
    """`stale_text` of a document."""
    return stale_text(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix(), sources)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="fill every marked spot from its results file")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    try:
        bad = _run(args.write)
    except FigureError as exc:
        print(f"docs_figures: {exc}", file=sys.stderr)
        return 2
    for line in bad:
        print(line)
    return 1 if bad else 0


def _run(write: bool) -> list[str]:
    sources: dict[str, Any] = {}
    bad: list[str] = []
    for path in documents():
        if write:
            text = path.read_text(encoding="utf-8")
            new = fill(text, sources)
            if new != text:
                path.write_text(new, encoding="utf-8")
                print(f"filled {path.relative_to(ROOT)}")
        else:
            bad += stale(path, sources)
    return bad


if __name__ == "__main__":
    sys.exit(main())

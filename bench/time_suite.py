"""Time the default test suite and write the result where the docs read it (bench/results/suite.json).

    python bench/time_suite.py                 # the whole default suite, as .ci/run runs it
    python bench/time_suite.py --out /tmp/s.json tests/project/test_docs.py   # a part of it, elsewhere

Runs `python -m pytest -m "not slow" -n auto -q -p no:cacheprovider [PATHS]` in the checkout, and
records the tests that passed, the longest of them (pytest's `--durations`, setup and call), the
wall seconds, the day, the commit, the machine's cores and its load average before and after (the
suite shares the machine with whatever else runs). Then `python bench/docs_figures.py --write`
puts the figures into the docs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "suite.json"
COMMAND = [sys.executable, "-m", "pytest", "-m", "not slow", "-n", "auto", "-q", "-p", "no:cacheprovider"]


def _commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


LONGEST = 25
"""How many of the longest tests the record keeps (bench/RESULTS.md names the first few)."""


def longest(output: str) -> list[dict[str, object]]:
    """The longest tests of pytest's `--durations` report, setup and call summed per test."""
    seconds: dict[str, float] = {}
    for m in re.finditer(r"^([\d.]+)s (?:setup|call|teardown) +(\S+)$", output, re.M):
        seconds[m.group(2)] = seconds.get(m.group(2), 0.0) + float(m.group(1))
    ranked = sorted(seconds.items(), key=lambda kv: -kv[1])[:LONGEST]
    return [{"test": test, "seconds": round(s, 1)} for test, s in ranked]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="test files or folders (default: pyproject's test paths)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where to write the JSON (default {OUT.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    start = time.monotonic()
    done = subprocess.run([*COMMAND, f"--durations={LONGEST}", *args.paths], cwd=ROOT, capture_output=True, text=True)
    seconds = time.monotonic() - start
    last = (done.stdout.strip().splitlines() or [""])[-1]
    passed = re.search(r"(\d+) passed", last)
    if done.returncode != 0 or passed is None:
        print(done.stdout[-3000:], done.stderr[-2000:], sep="\n", file=sys.stderr)
        print(f"the suite did not pass (exit {done.returncode}): nothing written", file=sys.stderr)
        return 1
    record = {
        "command": "python -m pytest -m \"not slow\" -n auto -q -p no:cacheprovider" + "".join(f" {p}" for p in args.paths),
        "tests": int(passed.group(1)),
        "seconds": round(seconds, 1),
        "minutes": round(seconds / 60, 1),
        "date": datetime.date.today().isoformat(),
        "commit": _commit(),
        "cores": os.cpu_count(),
        "load_before": round(load_before, 1),
        "load_after": round(os.getloadavg()[0], 1),
        "summary": last,
        "longest": longest(done.stdout),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"{record['tests']} tests passed in {record['seconds']} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Time competing implementations in one process, interleaved, and print their ratios.

The project machine is shared, so absolute seconds drift with other load by 2x within
minutes. Running each pair in the same process, alternating A, B, A, B, ... and keeping the
minimum of each, lets slow periods hit both alike: the ratio is what the scripts report.
Times are CPU seconds of this process (`time.process_time`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable


def interleaved(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, tuple[float, Any]]:
    """Each function's minimum CPU time over `repeat` rounds (one call each per round, in
    order) and its last result."""
    best: dict[str, float] = {name: float("inf") for name in fns}
    out: dict[str, Any] = {}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.process_time()
            out[name] = fn()
            best[name] = min(best[name], time.process_time() - t0)
    return {name: (best[name], out[name]) for name in fns}


def ratio_row(what: str, new: float, ref: float, ref_name: str, goal: float | None = None) -> str:
    """A markdown row: what, new time, reference time, new / reference, and the goal."""
    r = new / ref if ref else float("nan")
    verdict = "" if goal is None else (" (met)" if r <= goal else " (**missed**)")
    goal_txt = "-" if goal is None else f"<= {goal:g}x{verdict}"
    return f"| {what} | {new:.4f} s | {ref_name} {ref:.4f} s | {r:.3f}x | {goal_txt} |"


def load_average() -> str:
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def in_fresh_process(code: str, env: dict[str, str] | None = None) -> str:
    """Stdout of `python -c code` in a new process (for first-call and start-up costs)."""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env={**os.environ, **(env or {})})
    return out.stdout.strip()


def first_call_seconds(setup: str, call: str) -> tuple[float, float]:
    """Seconds of the first `call` in a new process (after `setup`): with an empty numba cache
    (the JIT compile) and again with the cache that run left (what every later process pays)."""
    code = f"import time\n{setup}\nt0 = time.perf_counter()\n{call}\nprint(time.perf_counter() - t0)"
    with tempfile.TemporaryDirectory() as cache:
        env = {"NUMBA_CACHE_DIR": cache}
        cold = float(in_fresh_process(code, env))
        warm = float(in_fresh_process(code, env))
    return cold, warm


def emit(record: Any, path: Path | None) -> None:
    """Print a bench's record as JSON, and write it to `path` when given."""
    text = json.dumps(record, indent=2)
    print(text)
    if path is not None:
        path.write_text(text)

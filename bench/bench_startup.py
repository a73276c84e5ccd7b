"""Start-up: `casmoe --help` and `casmoe trace info` against `python -c pass`, side by side.

Each command runs as a new process, the commands interleaved round by round, `--repeat`
rounds; the minimum CPU time (user + system of the child, from `resource`) and wall time of
each count. `casmoe` runs as `python -m casmoe` with this interpreter, so the console-script
shim (which adds the same few ms to every command) is left out of both sides.

`--before PYTHON` adds the same casmoe commands run by another interpreter, one whose
environment has another checkout of casmoe installed (e.g. a venv with `pip install --no-deps -e`
of `git archive c214424`, the code before the compiled kernels), so before and after are measured in one
interleaved run.

Run:  python bench/bench_startup.py [--repeat 15] [--before PYTHON]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time

from side_by_side import load_average

COMMANDS = {
    "python -c pass": ["-c", "pass"],
    "casmoe --help": ["-m", "casmoe", "--help"],
    "casmoe trace info": ["-m", "casmoe", "trace", "info"],
    "casmoe trace info --json": ["-m", "casmoe", "trace", "info", "--json"],
}


def run(args: list[str], python: str = sys.executable) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([python, *args], check=True, stdout=subprocess.DEVNULL, cwd=tempfile.gettempdir())  # not a checkout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--before", default=None, help="an interpreter with the code to compare with installed")
    args = ap.parse_args()
    commands = {name: (cmd, sys.executable) for name, cmd in COMMANDS.items()}
    if args.before is not None:
        for name, cmd in COMMANDS.items():
            if name.startswith("casmoe"):
                commands[f"{name} (before)"] = (cmd, args.before)
    best = {name: (float("inf"), float("inf")) for name in commands}
    for _ in range(args.repeat):
        for name, (cmd, python) in commands.items():
            cpu, wall = run(cmd, python)
            best[name] = (min(best[name][0], cpu), min(best[name][1], wall))
    base_cpu, base_wall = best["python -c pass"]
    print(f"load average {load_average()}, min of {args.repeat} interleaved rounds\n")
    print("| command | CPU s | wall s | CPU / python -c pass | wall / python -c pass |")
    print("|---|---|---|---|---|")
    for name, (cpu, wall) in best.items():
        print(f"| `{name}` | {cpu:.3f} | {wall:.3f} | {cpu / base_cpu:.1f}x | {wall / base_wall:.1f}x |")
    cpu, wall = best["casmoe --help"]
    print(f"\n`casmoe --help`: {cpu / base_cpu:.1f}x (CPU), {wall / base_wall:.1f}x (wall) of `python -c pass` (goal <= 5x)")


if __name__ == "__main__":
    main()

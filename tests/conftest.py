"""The suite runs the same on every host: nothing it asserts may depend on what this machine has
in its user cache, its environment or its locale.

Before any test module is imported (so subprocesses the tests start inherit it too):

- `CASMOE_CACHE` is a fresh folder of this session (shared by its pytest-xdist workers), removed
  at the end: the planner=auto cache and the embedder's ONNX export are built here, never read
  from (or written to) the user's `~/.cache/casmoe`, where a damaged or foreign entry would change what a test sees;
- casmoe's other switches are unset (`CASMOE_DEBUG` turns one-line errors into tracebacks,
  `CASMOE_NPZ_LIMIT` moves the archive-size limit, `CASMOE_EMBEDDER` the embedding backend,
  `CASMOE_DATA` the shipped data: tests that need one set it themselves), and so is
  `XDG_CACHE_HOME`; the hub is offline (`HF_HUB_OFFLINE=1`: no test downloads);
- `CASMOE_PLOTS=none`: a command draws no PNG that its test does not ask for (with `--plots`,
  or as `tests/cli/test_sim_cli.py` runs `casmoe` as a user does, with the default): drawing a
  plan's two pictures took about 1 s per plan, about 20 s of the walk over plan's options;
- text is UTF-8 in this process and its children (`PYTHONUTF8`, the C.UTF-8 locale where the
  host has it): rich draws its tables with ASCII boxes under a non-UTF-8 locale, and tests read
  the box characters.

Tests that depend on the machine otherwise fix what they read: memory (`available_memory`
patched), the umask, the working directory (absolute paths), timing (counted work instead of
seconds where a test is about the work, not the speed).

Before the first dot, one line says how many tests run and how long the default suite (`-m 'not
slow'` over pyproject's test paths) took on this machine the last time it ran whole (kept in
pytest's cache; until then, what bench/results/suite.json recorded, which `python bench/time_suite.py`
writes), so that minutes of dots read as progress, not as a hang.

The test modules sit in folders that mirror the package (`tests/sim/passes/` tests
`casmoe/sim/passes/`; `tests/project/` holds what checks the repository as a whole: docs, README,
layering, install); what they share is imported from `tests/support/`, never from another test
module or from this file.
"""

from __future__ import annotations

import datetime
import json
import locale
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

CLEARED = ("CASMOE_DEBUG", "CASMOE_NPZ_LIMIT", "CASMOE_EMBEDDER", "CASMOE_DATA", "XDG_CACHE_HOME")
_saved: dict[str, str | None] = {}
_cache: str | None = None


def _set(name: str, value: str | None) -> None:
    _saved.setdefault(name, os.environ.get(name))
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


SHARED = "CASMOE_TEST_SESSION_CACHE"
"""The session's cache folder, passed to pytest-xdist's workers (they inherit the controller's
environment): one planner fit and one embedder export per session, not one per worker. The
cache is built for processes that share it (a lock, and whole renames)."""


def pytest_configure(config) -> None:
    global _cache
    if hasattr(config, "workerinput") and os.environ.get(SHARED):
        _set("CASMOE_CACHE", os.environ[SHARED])  # the controller's, removed by the controller
    else:
        _cache = tempfile.mkdtemp(prefix="casmoe-test-cache-")
        _set("CASMOE_CACHE", _cache)
        _set(SHARED, _cache)
    for name in CLEARED:
        _set(name, None)
    _set("HF_HUB_OFFLINE", "1")
    _set("CASMOE_PLOTS", "none")
    _set("PYTHONUTF8", "1")
    for name in ("C.UTF-8", "C.utf8"):
        try:
            locale.setlocale(locale.LC_CTYPE, name)
        except locale.Error:
            continue
        _set("LC_ALL", name)
        break


def pytest_unconfigure(config) -> None:  # noqa: ARG001
    for name, value in _saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if _cache:
        shutil.rmtree(_cache, ignore_errors=True)


SUITE_KEY = "casmoe/default-suite"
SUITE_FILE = Path(__file__).resolve().parents[1] / "bench" / "results" / "suite.json"


def _recorded() -> str:
    """The default suite's last recorded timing, in words (bench/results/suite.json)."""
    try:
        s = json.loads(SUITE_FILE.read_text(encoding="utf-8"))
        return (f"{s['tests']} tests took {s['minutes']} min on {s['cores']} cores on {s['date']}, "
                "bench/results/suite.json")
    except (OSError, ValueError, KeyError):
        return "no timing recorded in bench/results/suite.json"

_started = time.monotonic()


def _whole_default_suite(config) -> bool:
    """This session runs the default suite whole: pyproject's test paths, `-m 'not slow'`, no -k."""
    return (config.args_source is config.ArgsSource.TESTPATHS and config.option.markexpr == "not slow"
            and not config.option.keyword)


def _first_line(config, n: int) -> None:
    """The line before the dots: how many tests run, and how long the default suite takes."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    cache = getattr(config, "cache", None)
    last = cache.get(SUITE_KEY, None) if cache is not None else None
    said = (f"took {last['seconds'] / 60:.1f} min for {last['tests']} tests here on {last['day']}" if last
            else f"has not run whole here yet ({_recorded()})")
    if reporter is not None:
        reporter.write_line(f"{n} test{'s' * (n != 1)} to run; the default suite (-m 'not slow') {said}")


def pytest_collection_finish(session) -> None:
    if not hasattr(session.config, "workerinput"):  # a pytest-xdist worker has no terminal: its controller says it
        _first_line(session.config, len(session.items))


_said: list[int] = []


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    """Under pytest-xdist (`-n`): the controller's first line, once the first worker has collected."""
    if not _said:
        _said.append(len(ids))
        _first_line(node.config, len(ids))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: one worker per core this process may use (its CPU affinity, and a container's
    cgroup CPU quota where one is set), not per core the host has: a worker past the quota only
    waits, with a copy of torch and numba (about 1 GB) in memory."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def pytest_sessionfinish(session, exitstatus) -> None:
    """Keep how long the whole default suite took, for the next session's first line."""
    cache = getattr(session.config, "cache", None)
    if cache is not None and _whole_default_suite(session.config) and exitstatus in (0, 1):
        cache.set(SUITE_KEY, {"seconds": round(time.monotonic() - _started), "tests": session.testscollected,
                              "day": datetime.date.today().isoformat()})

"""Every command in README.md runs as written, in README order, in a folder that holds what a
fresh clone holds (`traces/`, `examples/`). A command may use what earlier ones wrote (qwen.npz,
planner/), so each test first runs, once per session, the earlier commands of its kind: a test
passes alone (`-k`), in any order, or among the others alike.

Commands are read from the README's ```bash blocks, so a command added there is tested here
without editing this file. Fast commands (seconds) run in the default suite; anything not on
the FAST list runs with `-m slow`. Skipped: the install lines (CI runs them), commands that
name `/path/to/` your own checkpoint, `--device cuda` commands without a GPU, and training a
tiny model from scratch unless CASMOE_README_LONG=1. The ```python
blocks compile, and run when they need nothing slow.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

FAST = [  # a few seconds each on 2 busy cores; the others (10 s to hours) run with -m slow
    r"^casmoe trace info",
    r"^casmoe hardware list",
    r"^casmoe hardware detect",
    r"^casmoe trace import traces/real/",
    r"^casmoe trace import examples/moe-lrc/",
    r"^casmoe trace import examples/engine-dumps/",
    r"^casmoe popularity ",
    r"^casmoe replay --trace vllm\.npz",
    r"^casmoe trace export qwen\.npz",
    r"^casmoe lrc -t traces/real/moe_lrc_case_traces\.json",
]
HOURS = [r"^casmoe train-tiny"]  # too long even for -m slow unless asked for
SLOW_PYTHON = ("load_planner",)  # python blocks that need a fitted planner (a slow README command)


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def readme_commands() -> list[str]:
    """Each bash line of the README, continuations joined, trailing comments dropped."""
    commands = []
    for block in _blocks("bash"):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def _skip_reason(command: str) -> str | None:
    """Why a command does not run here, or None."""
    if command.startswith("python3 -m venv"):
        return "installs packages: the CI set-up runs it"
    if "/path/to/" in command:
        return "needs your own checkpoint"
    if ("--device cuda" in command or "gpu_check" in command) and not _cuda():
        return "needs a CUDA device"
    if any(re.search(p, command) for p in HOURS) and not os.environ.get("CASMOE_README_LONG"):
        return "takes about 30 min; CASMOE_README_LONG=1 runs it"
    return None


def _fast(command: str) -> bool:
    return any(re.search(p, command) for p in FAST)


def _param(i: int, command: str) -> pytest.param:
    marks = []
    if "--device cuda" in command or "gpu_check" in command:
        marks.append(pytest.mark.gpu)
    reason = _skip_reason(command)
    if reason is not None:
        marks.append(pytest.mark.skip(reason=reason))
    if not _fast(command):
        marks.append(pytest.mark.slow)
    return pytest.param(i, marks=marks, id=f"{i:02d} {command[:60]}")


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A folder laid out like a fresh clone, shared by the commands so that later ones see
    what earlier ones wrote (qwen.npz, planner/, me.toml, ...)."""
    root = tmp_path_factory.mktemp("clone")
    for name in ("traces", "examples"):
        (root / name).symlink_to(REPO / name)
    return root


@pytest.fixture(scope="module")
def ran() -> set[int]:
    """Indices of the README commands run in `clone` so far."""
    return set()


def _run_before(upto: int, fast_only: bool, clone: Path, ran: set[int], monkeypatch, capsys) -> None:
    """Every runnable command before `upto` not run yet (only the fast ones for a fast test:
    the fast commands use nothing the slow ones write)."""
    commands = readme_commands()
    for j in range(min(upto, len(commands))):
        if j not in ran and _skip_reason(commands[j]) is None and (_fast(commands[j]) or not fast_only):
            _run_command(commands[j], clone, monkeypatch, capsys)
            ran.add(j)


@pytest.mark.parametrize("i", [_param(i, c) for i, c in enumerate(readme_commands())])
def test_readme_command_runs(i, clone, ran, monkeypatch, capsys):
    command = readme_commands()[i]
    _run_before(i, _fast(command), clone, ran, monkeypatch, capsys)
    if i not in ran:
        _run_command(command, clone, monkeypatch, capsys)
        ran.add(i)


def _run_command(command: str, clone: Path, monkeypatch, capsys) -> None:
    from casmoe.cli import main

    monkeypatch.chdir(clone)
    monkeypatch.setenv("CASMOE_DATA", str(REPO / "traces"))
    monkeypatch.syspath_prepend(str(clone))
    for part in command.split(" && "):
        argv = shlex.split(part)
        if argv[0] != "casmoe":  # a script of the repository
            import subprocess

            done = subprocess.run(["bash", "-c", part], cwd=REPO, capture_output=True, text=True)
            assert done.returncode == 0, f"{part}: exit {done.returncode}: {done.stderr[-2000:]}"
            continue
        out = None
        if ">" in argv:  # `casmoe ... > file`: what the shell would write
            argv, out = argv[: argv.index(">")], argv[argv.index(">") + 1]
        monkeypatch.setattr(sys, "argv", argv)
        code = None
        try:
            main()
        except SystemExit as exc:
            code = exc.code
        printed, err = capsys.readouterr()
        assert code in (0, None), f"{part}: exit {code}: {err[-2000:]}"
        if out is not None:
            (clone / out).write_text(printed)


def _python_param(i: int, code: str) -> pytest.param:
    slow = any(name in code for name in SLOW_PYTHON)
    return pytest.param(i, marks=[pytest.mark.slow] if slow else [], id=f"python block {i}")


@pytest.mark.parametrize("i", [_python_param(i, c) for i, c in enumerate(_blocks("python"))])
def test_readme_python_runs(i, clone, ran, monkeypatch, capsys):
    """Each block runs after the ones before it (a block may use what they defined), in the
    clone folder where the commands wrote their outputs (the planner, for one)."""
    slow = any(name in _blocks("python")[i] for name in SLOW_PYTHON)
    _run_before(len(readme_commands()), not slow, clone, ran, monkeypatch, capsys)
    monkeypatch.chdir(clone)
    monkeypatch.syspath_prepend(str(clone))
    namespace: dict = {}
    for j, code in enumerate(_blocks("python")[: i + 1]):
        if j == i or not any(name in code for name in SLOW_PYTHON):
            exec(compile(code, f"README python block {j}", "exec"), namespace)  # noqa: S102
    for name, fn in list(namespace.items()):
        if name.startswith("test_") and callable(fn):
            fn()


def test_gitignore_covers_what_the_readme_commands_wrote(clone, ran, monkeypatch, capsys):
    """After the (fast) commands: everything they left in the checkout's root is ignored by
    .gitignore, so `git status` stays clean after the tour."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("needs git")
    _run_before(len(readme_commands()), True, clone, ran, monkeypatch, capsys)
    written = [p.name + ("/" if p.is_dir() else "") for p in clone.iterdir() if p.name not in ("traces", "examples")]
    for name in written:
        check = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", "-q", name])
        assert check.returncode == 0, f"{name} (written by a README command) is not in .gitignore"

"""Every command in README.md and the docs/ pages runs as written, in reading order (the README,
then the pages in mkdocs.yml's nav order), in a folder that holds what a fresh clone holds
(`traces/`, `examples/`). A command may use what earlier ones wrote (qwen.npz, planner/), so each
test first runs, once per session, the earlier commands of its kind: a test passes alone (`-k`),
in any order, or among the others alike. A command shown on two pages runs once.

Commands are read from the ```bash blocks, so a command added to a page is tested here without
editing this file. The README's two set-up lines run what follows their install steps (CI runs the
install, exactly as written: `test_readme_installs_and_tests_as_ci_does`): the main job,
`casmoe simulate`, runs as written in the default suite in `ELSEWHERE`'s test, which also reads its
answer and files (here it would run once more per worker); the test command is the suite itself. Fast commands
(seconds) run in the default suite; anything not on the FAST list runs with `-m slow`. Skipped:
commands that name `/path/to/` your own checkpoint, `--device cuda` commands without a GPU, and
training a tiny model from scratch unless CASMOE_README_LONG=1. The ```python blocks compile, and
run when they need nothing slow; a block runs after the blocks before it on its page.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest
from support.paths import REPO

README = REPO / "README.md"
CI = REPO / ".ci" / "run"

FAST = [  # a few seconds each on 2 busy cores; the others (10 s to hours) run with -m slow
    r"^casmoe simulate$",  # the main job (about half a minute): a user's first command
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
ELSEWHERE = {"casmoe simulate": "tests/cli/test_sim_cli.py::test_simulate_with_no_arguments"}
"""Commands another test runs exactly as written (and checks more closely): no fast command here
reads what they write."""
HOURS = [r"^casmoe train-tiny"]  # too long even for -m slow unless asked for
SLOW_PYTHON = ("load_planner",)  # python blocks that need a fitted planner (a slow command)
INSTALL = ("python3 -m venv", ". .venv/bin/activate", "pip install")
"""The steps of a set-up line that CI runs itself (.ci/run), in a fresh environment."""


def documents() -> list[Path]:
    """The README, then the site's pages in mkdocs.yml's nav order."""
    nav = re.findall(r":\s*([\w./-]+\.md)\s*$", (REPO / "mkdocs.yml").read_text(encoding="utf-8"), flags=re.M)
    return [README, *(REPO / "docs" / page for page in nav)]


def _blocks(kind: str, doc: Path) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S)


def _after_install(line: str) -> str:
    """A set-up line without its install steps: the command it runs in the installed environment."""
    parts = line.split(" && ")
    return " && ".join(p for p in parts if not p.startswith(INSTALL)) if parts[0].startswith(INSTALL) else line


def doc_commands() -> list[tuple[str, str]]:
    """(page, command) of every bash line, in reading order: continuations joined, trailing
    comments dropped, set-up lines without their install steps."""
    commands = []
    for doc in documents():
        for block in _blocks("bash", doc):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                line = re.sub(r"\s+#\s.*$", "", line).strip()
                if line and not line.startswith("#"):
                    commands.append((doc.relative_to(REPO).as_posix(), _after_install(line)))
    return commands


def readme_commands() -> list[str]:
    return [c for _, c in doc_commands()]


def _skip_reason(command: str) -> str | None:
    """Why a command does not run here, or None."""
    if command.startswith("python -m pytest"):
        return "the test suite itself: .ci/run runs it"
    if "/path/to/" in command:
        return "needs your own checkpoint"
    if ("--device cuda" in command or "gpu_check" in command) and not _cuda():
        return "needs a CUDA device"
    if any(re.search(p, command) for p in HOURS) and not os.environ.get("CASMOE_README_LONG"):
        return "takes a quarter of an hour or more; CASMOE_README_LONG=1 runs it"
    return None


def _fast(command: str) -> bool:
    return any(re.search(p, command) for p in FAST)


def _param(i: int, doc: str, command: str) -> pytest.param:
    marks = []
    if "--device cuda" in command or "gpu_check" in command:
        marks.append(pytest.mark.gpu)
    reason = _skip_reason(command) or (f"runs as written in {ELSEWHERE[command]}" if command in ELSEWHERE else None)
    if reason is not None:
        marks.append(pytest.mark.skip(reason=reason))
    if not _fast(command):
        marks.append(pytest.mark.slow)
    return pytest.param(i, marks=marks, id=f"{doc} {i:02d} {command[:60]}")


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
def ran() -> set[str]:
    """The commands run in `clone` so far (a command shown twice runs once)."""
    return set()


def _run_before(upto: int, fast_only: bool, clone: Path, ran: set[str], monkeypatch, capsys) -> None:
    """Every runnable command before `upto` not run yet (only the fast ones for a fast test:
    the fast commands use nothing the slow ones write)."""
    commands = readme_commands()
    for command in commands[:upto]:
        if (command not in ran and command not in ELSEWHERE and _skip_reason(command) is None
                and (_fast(command) or not fast_only)):
            _run_command(command, clone, monkeypatch, capsys)
            ran.add(command)


@pytest.mark.parametrize("i", [_param(i, doc, c) for i, (doc, c) in enumerate(doc_commands())])
def test_readme_command_runs(i, clone, ran, monkeypatch, capsys):
    command = readme_commands()[i]
    _run_before(i, _fast(command), clone, ran, monkeypatch, capsys)
    if command not in ran:
        _run_command(command, clone, monkeypatch, capsys)
        ran.add(command)


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


def test_commands_left_to_another_test_are_in_the_docs_and_that_test_exists():
    commands = {command for _, command in doc_commands()}
    for command, test in ELSEWHERE.items():
        path, name = test.split("::")
        assert command in commands, f"{command!r} is in no page any more: drop it from ELSEWHERE"
        assert re.search(rf"^def {name}\(", (REPO / path).read_text(encoding="utf-8"), re.M), test


def test_readme_installs_and_tests_as_ci_does():
    """The README's set-up lines install as .ci/run installs (the same pip lines, in order) and
    run the test command .ci/run runs; the main job is one of them."""
    setup = [line for block in _blocks("bash", README) for line in block.splitlines() if line.startswith("python3 -m venv")]
    assert len(setup) == 2, setup
    ci = CI.read_text(encoding="utf-8")
    ci_pip = [" ".join(a for a in shlex.split(line) if a != "-q") for line in ci.splitlines()
              if line.strip().startswith("pip install") and "docs" not in line]
    ci_test = next(line.strip() for line in ci.splitlines() if line.strip().startswith("python -m pytest -m \"not slow\""))
    for line in setup:
        pips = [" ".join(shlex.split(p)) for p in line.split(" && ") if p.startswith("pip install")]
        assert pips == ci_pip, (pips, ci_pip)
    assert [_after_install(line) for line in setup] == ["casmoe simulate", ci_test]


def _python_params() -> list[pytest.param]:
    out = []
    for d, doc in enumerate(documents()):
        for j, code in enumerate(_blocks("python", doc)):
            slow = any(name in code for name in SLOW_PYTHON)
            out.append(pytest.param(d, j, marks=[pytest.mark.slow] if slow else [],
                                    id=f"{doc.relative_to(REPO).as_posix()} python block {j}"))
    return out


@pytest.mark.parametrize(("d", "j"), _python_params())
def test_readme_python_runs(d, j, clone, ran, monkeypatch, capsys):
    """Each block runs after the ones before it on its page (a block may use what they defined),
    in the clone folder where the commands up to its page wrote their outputs (the planner, for one)."""
    doc = documents()[d]
    blocks = _blocks("python", doc)
    slow = any(name in blocks[j] for name in SLOW_PYTHON)
    upto = sum(1 for page, _ in doc_commands() if documents().index(REPO / page) <= d)
    _run_before(upto, not slow, clone, ran, monkeypatch, capsys)
    monkeypatch.chdir(clone)
    monkeypatch.syspath_prepend(str(clone))
    namespace: dict = {}
    for k, code in enumerate(blocks[: j + 1]):
        if k == j or not any(name in code for name in SLOW_PYTHON):
            exec(compile(code, f"{doc.name} python block {k}", "exec"), namespace)  # noqa: S102
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
        assert check.returncode == 0, f"{name} (written by a documented command) is not in .gitignore"

"""Driving the `casmoe` console entry point in-process, as a user would, and what a one-line error is."""

from __future__ import annotations

import sys
from pathlib import Path


def cli(argv: list[str], cwd: Path, monkeypatch, capsys) -> tuple[int, str, str]:
    """Run `casmoe ARGV` through the console entry point; (exit status, stdout, stderr)."""
    from casmoe.cli import main

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["casmoe", *argv])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(code: int, err: str) -> None:
    """Exit 2 and exactly one error line, the last thing printed (progress bars may precede it)."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert sum("error" in ln.lower() for ln in lines) == 1 and lines[-1].startswith("casmoe: error: "), err


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp"))

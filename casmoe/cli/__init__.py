"""`casmoe` command line. Each module registers its subcommands on `app`.

`main` is the one place that turns failures into messages: errors users can fix
(`CasmoeError`, and the command line's own usage errors: a misspelt flag, a value out of
range), operating-system errors (disk full, permission, a directory where a file is
meant) and faults raised inside a user's own policy module print one line and exit 2; SIGTERM
unwinds like Ctrl-C so that no temporary file is left behind. `CASMOE_DEBUG=1` shows the
traceback instead. A library's warning (numpy's "invalid value encountered", a deprecation)
is one `casmoe: warning: ...` line, once per message, never the multi-line form Python prints.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import traceback
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

import typer

from casmoe.cli import backend, catalog, hardware, leaderboard, lrc, plan, planner, popularity, record, replay, search, simulate, sweep, trace  # noqa: F401  (register commands)
from casmoe.cli.app import app, finite_floats
from casmoe.errors import CasmoeError

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The checkout holding casmoe/ (an installed copy lives in site-packages, which `_is_user_code`
rules out by itself)."""
_STDLIB = Path(os.__file__).resolve().parent

_OS_HINTS = {
    errno.ENOSPC: "free some space or write somewhere else",
    errno.EDQUOT: "free some space or write somewhere else",
    errno.EACCES: "check the permissions or write somewhere else",
    errno.EROFS: "the file system is read-only; write somewhere else",
    errno.EISDIR: "give a file name, not a folder",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
}


def _os_message(exc: OSError) -> str:
    what = exc.strerror or str(exc)
    where = f": {exc.filename}" if exc.filename else ""
    hint = _OS_HINTS.get(exc.errno or 0)
    return f"{what}{where}" + (f" ({hint})" if hint else "")


def _is_user_code(filename: str) -> bool:
    """Not casmoe, the standard library or an installed package: a user's own module."""
    if filename.startswith("<"):
        return False
    path = Path(filename).resolve()
    if "site-packages" in path.parts or "dist-packages" in path.parts or path.is_relative_to(_STDLIB):
        return False
    return not path.is_relative_to(_PACKAGE_ROOT / "casmoe")


def _user_frame(tb: TracebackType | None) -> str | None:
    """`file:line in function` of the innermost frame in a user's own code, or None when the
    fault is not theirs (then the traceback is casmoe's bug and is shown)."""
    found = None
    for frame, line in traceback.walk_tb(tb):
        if _is_user_code(frame.f_code.co_filename):
            found = f"{Path(frame.f_code.co_filename).name}:{line} in {frame.f_code.co_name}"
    return found


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds: finally blocks remove temporary files


def _warning_source(filename: str) -> str:
    """The package a warning came from ('numpy'), or '' for casmoe's own and a user's code."""
    parts = Path(filename).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts and parts.index(marker) + 1 < len(parts):
            return parts[parts.index(marker) + 1].removesuffix(".py")
    return ""


def _one_line_warnings() -> Any:
    """A `warnings.showwarning` printing `casmoe: warning: MESSAGE (from PACKAGE)` once per
    message: no source line, no file path, no second line."""
    shown: set[tuple[type, str]] = set()

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        text = " ".join(str(message).split()) or category.__name__
        if (category, text) in shown:
            return
        shown.add((category, text))
        source = _warning_source(filename)
        try:
            print(f"casmoe: warning: {text}" + (f" (from {source})" if source else ""), file=file or sys.stderr)
        except (OSError, ValueError):  # a closed or broken stderr: a warning is not worth a failure
            pass

    return show


_TRACKER = "ignore:resource_tracker:UserWarning"
"""multiprocessing's resource tracker, a process of its own, warns in two lines at exit about a
semaphore a finished worker pool left (nothing the user can act on); its -W options come from
this process's `sys.warnoptions`, so this filter reaches it where `showwarning` cannot."""


def main() -> None:
    previous = signal.signal(signal.SIGTERM, _terminate)
    shown = warnings.showwarning
    warnings.showwarning = _one_line_warnings()
    if _TRACKER not in sys.warnoptions:
        sys.warnoptions.append(_TRACKER)
    try:
        _run()
    finally:
        signal.signal(signal.SIGTERM, previous)  # in-process callers (tests) get theirs back
        warnings.showwarning = shown


RENAMED = {"profiles": ("hardware", "list"), "profile": ("popularity",)}
"""Old command names and the ones they became (one meaning per name: a hardware profile, a
popularity profile); the old ones still run, for one release, and say the new name."""
SPLIT = {"validate": ("--published", "published", "backend"), "calibrate": ("--measured", "measured", "backend")}
"""Commands that were two commands under one name, told apart by a flag: the flag's form is
now a subcommand of its own, the other form `backend`."""


def renamed(argv: list[str]) -> tuple[list[str], str | None]:
    """`argv` in today's command names, and a note saying the new name when it used an old one."""
    if not argv:
        return argv, None
    head, rest = argv[0], argv[1:]
    if head in RENAMED:
        old, now, new = head, " ".join(RENAMED[head]), [*RENAMED[head], *rest]
    elif head in SPLIT and rest and rest[0] not in ("backend", "published", "measured", "--help", "-h"):
        flag, mode, other = SPLIT[head]
        given = next((a for a in rest if a == flag or a.startswith(flag + "=")), None)
        if given is None:
            old, now, new = head, f"{head} {other}", [head, other, *rest]
        else:
            old, now = f"{head} {flag}", f"{head} {mode}"
            i = rest.index(given)
            value = [given.split("=", 1)[1]] if "=" in given else rest[i + 1:i + 2] if flag == "--measured" else []
            new = [head, mode, *value, *rest[:i], *rest[i + 1 + (flag == "--measured" and "=" not in given):]]
    else:
        return argv, None
    return new, f"note: `casmoe {old}` is now `casmoe {now}`; the old name works for one release"


def _run() -> None:
    debug = os.environ.get("CASMOE_DEBUG", "") not in ("", "0")
    argv, note = renamed(sys.argv[1:])
    if note:
        print(f"casmoe: {note}", file=sys.stderr)
    try:
        code = finite_floats(typer.main.get_command(app)).main(args=argv, prog_name="casmoe", standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)  # `--help` and typer.Exit return their status here
    except CasmoeError as exc:
        if debug:
            raise
        _fail(str(exc))
    except OSError as exc:
        if debug:
            raise
        _fail(_os_message(exc))
    except MemoryError:
        if debug:
            raise
        _fail("out of memory; use a smaller input (--requests, fewer policies or capacities) or a bigger machine")
    except Exception as exc:
        _command_line_fault(exc)  # exits when it is one
        where = _user_frame(exc.__traceback__)
        if debug or where is None:
            raise
        _fail(f"your code raised {type(exc).__name__}: {exc} (at {where}; CASMOE_DEBUG=1 shows the traceback)")


def _command_line_fault(exc: Exception) -> None:
    """Exit on click's own faults (click's, or the copy typer vendors: matched by class name):
    a usage error is one line like every other error, a bare group prints its help."""
    kinds = {c.__name__ for c in type(exc).__mro__}
    ctx = getattr(exc, "ctx", None)
    if "NoArgsIsHelpError" in kinds:  # `casmoe` or `casmoe trace` alone
        print(ctx.get_help() if ctx else exc.format_message(), file=sys.stderr)  # type: ignore[attr-defined]
        sys.exit(2)
    if "UsageError" in kinds:  # a misspelt flag, a value out of range, a missing argument
        _fail(f"{exc.format_message()} (see `{ctx.command_path if ctx else 'casmoe'} --help`)")  # type: ignore[attr-defined]
    if "Abort" in kinds:  # Ctrl-C, or the end of input at a prompt
        print("Aborted!", file=sys.stderr)
        sys.exit(1)


def _fail(message: str) -> None:
    print(f"casmoe: error: {message}", file=sys.stderr)
    sys.exit(2)

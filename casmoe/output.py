"""Where results go: output paths checked before any work starts, files written atomically.

Every file casmoe writes goes through `atomic_open` or `atomic_path`: the bytes go to a
temporary file beside the target (`.NAME.PID.RANDOM.tmp`), are flushed to disk, and replace the
target in one rename. A run that fails, is interrupted (Ctrl-C, SIGTERM) or runs out of disk
space leaves the old file (or none) and removes its temporary file; one killed outright
(SIGKILL) cannot clean up, so the next write to the same target removes temporary files whose
process is gone.
"""

from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterable, Iterator

from casmoe.errors import CasmoeError


class OutputError(CasmoeError, ValueError):
    """An output path that cannot be written (a directory where a file is meant, no parent, ...)."""


def check_file_target(path: str | os.PathLike[str], what: str = "output", create_parent: bool = False) -> Path:
    """Fail now, before any work, if `path` cannot become a file: it is a directory, or its
    folder does not exist (unless `create_parent`: then no part of the path may be a file)."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{what} {path} is a directory; give a file name, e.g. {path / 'out'}")
    if create_parent:
        check_dir_target(path.parent, what)
    elif not path.parent.is_dir():
        raise OutputError(f"{what} {path}: folder {path.parent} does not exist; create it first")
    return path


def check_dir_target(path: str | os.PathLike[str], what: str = "output folder") -> Path:
    """Fail now if `path` exists and is not a directory (it is created when missing)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{what} {path} is a file, not a folder; pass another path or remove it")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"{what} {path}: {parent} is a file, not a folder")
            break
    return path


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_orphans(path: Path) -> None:
    """Temporary files of earlier writes to `path` whose process no longer runs."""
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        parts = tmp.name[len(path.name) + 2 :].split(".")
        if parts and parts[0].isdigit() and int(parts[0]) != os.getpid() and not _pid_alive(int(parts[0])):
            tmp.unlink(missing_ok=True)


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside `path` for writers that want a file name (safetensors, hnswlib);
    it replaces `path` if the block succeeds and is removed whatever happens otherwise."""
    path = Path(path)
    check_file_target(path)
    _remove_orphans(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as exc:
        if exc.filename is None or Path(exc.filename) == tmp:  # name the file the user asked for
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", **kw) -> Iterator[IO]:
    """`open(path, mode)` whose result appears all at once (see the module docstring)."""
    if mode not in ("w", "wb"):
        raise ValueError("atomic_open writes whole files: mode 'w' or 'wb'")
    with atomic_path(path) as tmp:
        with open(tmp, mode, **kw) as fh:
            yield fh
            fh.flush()


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    with atomic_open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return Path(path)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_not_input(out: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]], what: str = "output") -> None:
    """Refuse an output path that is one of the inputs (a link to it, or an existing file inside
    an input folder, too): writing it would replace the data it is made from."""
    target = Path(out).resolve()
    for src in inputs:
        src = Path(src).resolve()
        if target == src or (src.is_dir() and target.exists() and target.is_relative_to(src)):
            raise OutputError(f"{what} {out} is also an input; write somewhere else")
        if target.exists() and src.exists() and os.path.samefile(target, src):
            raise OutputError(f"{what} {out} is the same file as the input {src}; write somewhere else")

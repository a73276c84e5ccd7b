"""Where results go: output paths checked before any work starts, files written atomically.

Every file casmoe writes goes through `atomic_open` or `atomic_path`: the bytes go to a
temporary file beside the target (`.NAME.PID.RANDOM.tmp`), are flushed to disk, and replace the
target in one rename. A run that fails, is interrupted (Ctrl-C, SIGTERM) or runs out of disk
space leaves the old file (or none) and removes its temporary file; one killed outright
(SIGKILL) cannot clean up, so the next write to the same target removes temporary files whose
process is gone.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterable, Iterator

from casmoe.errors import CasmoeError


NAME_MAX = 255
"""Bytes in one file name on every common file system (ext4, xfs, btrfs, APFS, NTFS)."""
_SUFFIX_BYTES = len(".4294967296.01234567.tmp")


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


def _tmp_prefix(path: Path) -> str:
    """`.NAME` for temporary names beside `path`, shortened (with a digest of the full name, so
    that two long names stay apart) when NAME is so long that the suffix would pass the file
    system's 255-byte limit: a legal name must not fail on its temporary file's name."""
    name = path.name
    if len(os.fsencode(name)) <= NAME_MAX - _SUFFIX_BYTES - 1:
        return f".{name}"
    digest = hashlib.blake2b(os.fsencode(name), digest_size=4).hexdigest()
    cut = name.encode("utf-8", "surrogateescape")[: NAME_MAX - _SUFFIX_BYTES - 1 - 9]
    return f".{cut.decode('utf-8', 'ignore')}~{digest}"


def temporary_sibling(path: Path) -> Path:
    """A fresh temporary name beside `path` (`.NAME.PID.RANDOM.tmp`), which `remove_orphans`
    recognises once its process is gone."""
    return path.with_name(f"{_tmp_prefix(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def remove_orphans(path: Path) -> None:
    """Temporary files (or folders) of earlier writes to `path` whose process no longer runs."""
    prefix = _tmp_prefix(path) + "."
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:  # not glob: a `[` or `*` in the user's file name is not a pattern
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid = name[len(prefix) :].split(".")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            tmp = path.parent / name
            if tmp.is_dir() and not tmp.is_symlink():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside `path` for writers that want a file name (safetensors, hnswlib);
    it replaces `path` if the block succeeds and is removed whatever happens otherwise."""
    path = Path(path)
    check_file_target(path)
    remove_orphans(path)
    tmp = temporary_sibling(path)
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

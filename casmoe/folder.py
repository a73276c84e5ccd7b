"""Folders of several files that are written all at once and checked when read back.

A planner is a folder of components (index, patterns, weights, fit data, settings). Written file
by file, a fit that is killed or runs out of disk leaves one fit's index beside another's
weights, and nothing on load can tell. Here a folder is a unit:

- `write_folder(path, kind)` yields an empty temporary folder beside `path`; the caller writes
  its components there under their final names (with ordinary writes: the folder as a whole is
  what is atomic). When the block succeeds, `manifest.json` (the kind, and every file's size and
  SHA-256) is added, everything is flushed to disk and the temporary folder takes `path`'s place
  by renames: a reader sees the old folder or the new one, never a mix. When the block fails
  (an error, Ctrl-C, a full disk), the temporary folder is removed and `path` is untouched.
- `read_folder(path, kind)` checks the manifest before any component is parsed: each listed file
  present with its size and hash, and no other file (hidden ones aside), else `FolderError`
  naming the file: a component copied in from another fit is refused. A loader asks the
  returned `Manifest` whether an optional component is there (`name in manifest`).

`path` is replaced only when it is missing, empty, or a folder of the same kind (its manifest
says so, or it holds the kind's legacy marker file): `check_folder_target` says so before any
work starts, and also tries a write beside it, so an unwritable `--out` fails before a long fit.

Folders written before manifests existed (no `manifest.json`) are read as `Manifest.legacy`,
which contains every file present: loaders still validate each component's content.

To add a component (say a trajectory stage), write its file inside the `write_folder` block and
read it after `read_folder`; the manifest covers it with no change here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from casmoe.errors import CasmoeError
from casmoe.output import check_dir_target, remove_orphans, temporary_sibling, write_text

MANIFEST = "manifest.json"
_CHUNK = 1 << 20


class FolderError(CasmoeError, ValueError):
    """A folder that is incomplete, mixed, damaged, or cannot be written where asked."""


@dataclass(frozen=True)
class Manifest:
    """The files of a folder with their sizes and digests (`None` for a legacy folder's)."""

    kind: str
    files: dict[str, tuple[int, str] | None]

    def __contains__(self, name: object) -> bool:
        return name in self.files

    @property
    def legacy(self) -> bool:
        return all(v is None for v in self.files.values())


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file's bytes, hex (read a MiB at a time)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _kind_of(path: Path, marker: str | None) -> str | None:
    """The kind a folder's manifest names, `"legacy"` for one with `marker` and no manifest."""
    try:
        doc = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        return str(doc.get("kind")) if isinstance(doc, dict) else None
    except FileNotFoundError:
        return "legacy" if marker and (path / marker).is_file() else None
    except (OSError, ValueError):
        return None


def check_folder_target(path: str | os.PathLike[str], kind: str, what: str = "--out", marker: str | None = None) -> Path:
    """Fail now, before any work, if `write_folder(path, kind)` would fail: `path` is a file, a
    folder of something else (it would be replaced), or its parent cannot be written."""
    check_dir_target(path, what)
    path = Path(path)
    if path.is_dir() and any(path.iterdir()):
        found = _kind_of(path, marker)
        if found not in (kind, "legacy"):
            raise FolderError(
                f"{what} {path} is a folder that is not a {kind} folder (writing would replace it); "
                "give a new or empty folder"
            )
    parent = next((p for p in path.parents if p.is_dir()), Path("."))
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".casmoe-write-test.", dir=parent))
    except OSError as exc:
        raise FolderError(f"{what} {path}: cannot write in {parent} ({exc.strerror or exc}); write somewhere else") from None
    return path


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def write_folder(path: str | os.PathLike[str], kind: str, marker: str | None = None) -> Iterator[Path]:
    """An empty temporary folder whose content replaces `path` all at once when the block
    succeeds (see the module docstring). Only plain files directly inside it are allowed."""
    shown, path = Path(path), Path(os.path.abspath(path))  # errors name the folder as the user wrote it
    check_folder_target(shown, kind, marker=marker)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(path)
    tmp = temporary_sibling(path)
    tmp.mkdir()
    old: Path | None = None
    try:
        yield tmp
        files = {}
        for f in sorted(tmp.iterdir()):
            if not f.is_file() or f.is_symlink():
                raise FolderError(f"{shown}: only plain files go in a {kind} folder, not {f.name}")
            with open(f, "rb+") as fh:
                os.fsync(fh.fileno())
            files[f.name] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}

        write_text(tmp / MANIFEST, json.dumps({"kind": kind, "files": files}, indent=2))
        _fsync_dir(tmp)
        if path.exists():
            old = temporary_sibling(path)
            os.rename(path, old)
        try:
            os.rename(tmp, path)
        except OSError:
            if old is not None:
                os.rename(old, path)
                old = None
            raise
        _fsync_dir(path.parent)
    except OSError as exc:  # name the folder the user asked for, not the temporary one
        inside = exc.filename is not None and Path(exc.filename).is_relative_to(tmp)
        if not inside:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(shown / Path(exc.filename).relative_to(tmp))) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def read_folder(path: str | os.PathLike[str], kind: str, what: str | None = None) -> Manifest:
    """Check `path` against its manifest (every listed file present, same size, same hash) and
    return it; `FolderError` naming the first file that differs. A folder with no manifest is
    returned as legacy (every file present, nothing to check)."""
    path = Path(path)
    what = what or f"{kind} folder"
    try:
        doc = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Manifest(kind, {f.name: None for f in path.iterdir() if f.is_file()})
    except (OSError, ValueError) as exc:
        raise FolderError(f"{path / MANIFEST}: unreadable manifest ({exc}); write the {what} again") from None
    if not isinstance(doc, dict) or doc.get("kind") != kind:
        found = doc.get("kind") if isinstance(doc, dict) else None
        raise FolderError(f"{path}: not a {kind} folder (its manifest names {found!r})")
    listed = doc.get("files")
    if not isinstance(listed, dict):
        raise FolderError(f"{path / MANIFEST}: no file list; write the {what} again")
    files: dict[str, tuple[int, str] | None] = {}
    for name, entry in listed.items():
        size, digest = (entry.get("bytes"), entry.get("sha256")) if isinstance(entry, dict) else (None, None)
        if not isinstance(size, int) or not isinstance(digest, str) or Path(name).name != name:
            raise FolderError(f"{path / MANIFEST}: bad entry for {name!r}; write the {what} again")
        f = path / name
        if not f.is_file():
            raise FolderError(f"{f}: missing (the manifest lists it); the {what} is incomplete, write it again")
        if f.stat().st_size != size:
            raise FolderError(
                f"{f}: {f.stat().st_size} bytes, the manifest says {size}: truncated or from another write; "
                f"write the {what} again"
            )
        if sha256_file(f) != digest:
            raise FolderError(f"{f}: content differs from the manifest (damaged or from another write); write the {what} again")
        files[name] = (size, digest)
    extra = sorted(f.name for f in path.iterdir() if f.name not in files and f.name != MANIFEST and not f.name.startswith("."))
    if extra:
        raise FolderError(f"{path / extra[0]}: not part of this {what} (its manifest does not list it); remove it")
    return Manifest(kind, files)

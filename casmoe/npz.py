"""Reading `.npz` archives that may be hostile: sizes checked before anything is inflated.

An `.npz` is a zip of `.npy` members. Deflate packs up to about 1000:1, so a 3 MB file can
declare gigabytes, and `np.load` finds out only after inflating them (or running out of
memory). The zip's central directory declares every member's size up front (`zipfile` never
inflates past a declared size), so the declared total is checked here first, against
`MAX_INFLATE` times the file's size with `MIN_LIMIT` as a floor: casmoe's own traces inflate
2-6x on the whole (at most 57x for one member: the shipped traces), so an archive beyond
these is a damaged or hostile file, refused before any work. `CASMOE_NPZ_LIMIT` (bytes, e.g.
`64e9`) raises the limit for a genuinely huge, well-compressing archive.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from typing import IO, Any

import numpy as np

from casmoe import filekind

MAX_INFLATE = 200
MIN_LIMIT = 2**30


def _limit(compressed: int) -> int:
    env = os.environ.get("CASMOE_NPZ_LIMIT", "").strip()
    if env:
        try:
            return int(float(env))
        except ValueError:
            pass
    return max(MIN_LIMIT, MAX_INFLATE * compressed)


def check_sizes(fh: IO[bytes], where: str, error: type[Exception]) -> None:
    """Refuse (raise `error`) an archive whose members declare more bytes than the limit."""
    fh.seek(0, io.SEEK_END)
    compressed = fh.tell()
    fh.seek(0)
    try:
        with zipfile.ZipFile(fh) as zf:
            declared = sum(info.file_size for info in zf.infolist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise error(f"{where}: not a readable .npz (zip) archive: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None
    finally:
        fh.seek(0)
    limit = _limit(compressed)
    if declared > limit:
        raise error(
            f"{where}: its arrays would inflate to {declared / 2**30:.1f} GiB from {compressed / 2**20:.1f} MiB "
            f"(over the {limit / 2**30:.1f} GiB limit: a damaged or hostile file?); set CASMOE_NPZ_LIMIT=BYTES "
            "to read it anyway"
        )


def members(path: str | os.PathLike[str], error: type[Exception], what: str = "a NumPy .npz archive",
            hint: str = "") -> set[str]:
    """The names of the archive's arrays, from its directory (nothing inflated); faults as
    `read_npz` names them."""
    where = str(path)
    filekind.require(path, filekind.NPZ, what, error, hint)
    try:
        with zipfile.ZipFile(path) as zf:
            return {name.removesuffix(".npy") for name in zf.namelist()}
    except FileNotFoundError:
        raise error(f"{where}: no such file") from None
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise error(f"{where}: not a readable .npz (zip) archive: {filekind.one_line(exc)}") from None


def read_npz(path: str | os.PathLike[str], error: type[Exception], what: str = "a NumPy .npz archive",
             hint: str = "") -> dict[str, np.ndarray]:
    """Every array of the archive at `path` (no pickle); any fault raises `error` naming it, a
    file of another kind named as what it is (`casmoe.filekind`), not `what`."""
    where = str(path)
    filekind.require(path, filekind.NPZ, what, error, hint)
    try:
        with open(path, "rb") as fh:
            check_sizes(fh, where, error)
            with np.load(fh, allow_pickle=False) as npz:
                return {name: npz[name] for name in npz.files}
    except error:
        raise
    except FileNotFoundError:
        raise error(f"{where}: no such file") from None
    except MemoryError as exc:
        raise error(f"{where}: out of memory reading it ({filekind.one_line(exc)}); check the sizes its arrays declare") from None
    except Exception as exc:  # zipfile, zlib, numpy's header parser: all say "damaged"
        raise error(f"{where}: damaged .npz archive ({type(exc).__name__}: {filekind.one_line(exc)})") from None


def require(
    arrays: dict[str, np.ndarray], name: str, shape: tuple[int | None, ...], kind: str, where: str,
    error: type[Exception],
) -> np.ndarray:
    """Member `name` of `arrays` (read from `where`), checked: present, of `shape` (None matches
    any length on that axis), of dtype kind `kind` ('f' float, 'i' integer) and, for floats,
    finite. A component read from disk is checked before anything computes with it, so a
    damaged or foreign file is one error naming it, never a traceback or a wrong answer later."""
    a = arrays.get(name)
    if a is None:
        raise error(f"{where}: no array {name!r} (files from another version or fit?); refit")
    ok = a.ndim == len(shape) and all(w is None or w == n for w, n in zip(shape, a.shape)) and a.dtype.kind == kind
    if not ok:
        want = "[" + ", ".join("N" if w is None else str(w) for w in shape) + "]"
        kinds = {"f": "float", "i": "integer"}
        raise error(f"{where}: {name!r} is {a.dtype} {list(a.shape)}, expected {kinds.get(kind, kind)} {want} for "
                    "this planner's geometry (files from different fits?); refit")
    if kind == "f" and not np.isfinite(a).all():
        raise error(f"{where}: {name!r} holds non-finite values; refit")
    return a


def format_meta(raw: np.ndarray | None, where: str, error: type[Exception], name: str, version: int) -> dict[str, Any]:
    """The JSON metadata a casmoe archive stores as a 1-D uint8 array, checked to declare the
    format `name` at `version` (traces, profiles); any fault raises `error` naming `where`."""
    if raw is None or raw.dtype != np.uint8 or raw.ndim != 1:
        raise error(f"{where}: not a {name} file (its metadata must be a 1-D uint8 array of JSON text)")
    try:
        meta = json.loads(raw.tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{where}: metadata is not valid JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != name:
        raise error(f"{where}: not a {name} file")
    if meta.get("version") != version:
        raise error(f"{where}: unknown {name} version {meta.get('version')!r} (this casmoe reads {version})")
    return meta

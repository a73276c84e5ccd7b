"""What a file really is, told from its first bytes: the one check every reader of a user's file
runs before parsing it.

A file's name says what the user meant; its bytes say what it is. Without this check a zip
archive named `.csv` fails deep in the CSV parser ("'utf-8' codec can't decode byte 0x84"), a
`torch.save` file given as a trace is "missing array 'meta'", and an empty file is whatever the
parser makes of nothing. `require(path, accepted, what, error)` sniffs the file and, when it is
not one of the `accepted` kinds, raises one line that says what it is and what was expected:

    x.csv is a zip archive, not a routing CSV

Kinds (`sniff`): `folder`, `missing`, `special` (a pipe or device: never read to look), `empty`; archives `npz` (a zip of `.npy` members),
`npz-pickle` (one of them pickled objects), `torch` (`torch.save`, zip or legacy), `zip`,
`damaged-zip` (a zip signature with no readable directory: its reader names the damage);
arrays `npy`, `npy-pickle`, `safetensors`; `pickle`; other binary formats (gzip, bz2, xz,
zstd, tar, HDF5, SQLite, PNG, JPEG, PDF, ELF); `json` (text opening with `{` or `[`), `text`
(UTF-8), `other-text` (text in another encoding) and `binary`.

`one_line(exc)` is the first line of a library's own exception text, for messages that quote it.
`reading(where)` wraps a reader: numpy's and pandas' warnings (a `RuntimeWarning: overflow
encountered in subtract` and the source line printed under it) stay silent, since what they
warn of is checked explicitly where it matters (ids in range, weights and counts finite), and a
`MemoryError` becomes one `ResourceError` naming the file.
"""

from __future__ import annotations

import ast
import io
import os
import stat
import warnings
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Collection, Iterator

from casmoe.resources import ResourceError

_SNIFF_BYTES = 1 << 16

DESCRIPTIONS = {
    "folder": "a folder",
    "special": "a pipe or device (save it to a file first)",
    "empty": "an empty file",
    "npz": "a NumPy .npz archive",
    "npz-pickle": "a NumPy .npz archive holding pickled Python objects (casmoe never unpickles)",
    "torch": "a torch.save file",
    "zip": "a zip archive",
    "damaged-zip": "a damaged zip archive",
    "npy": "a NumPy .npy array",
    "npy-pickle": "a NumPy .npy file of pickled Python objects (casmoe never unpickles)",
    "safetensors": "a safetensors file",
    "pickle": "a Python pickle (casmoe never unpickles)",
    "gzip": "a gzip archive",
    "bz2": "a bzip2 archive",
    "xz": "an xz archive",
    "zstd": "a zstd archive",
    "tar": "a tar archive",
    "hdf5": "an HDF5 file",
    "sqlite": "an SQLite database",
    "png": "a PNG image",
    "jpeg": "a JPEG image",
    "pdf": "a PDF document",
    "elf": "an executable",
    "json": "JSON text",
    "text": "text",
    "other-text": "text that is not UTF-8",
    "binary": "binary data",
}

TEXT = frozenset({"text", "json"})
"""What a reader of UTF-8 text takes (the JSON reader says itself where JSON breaks)."""
NPZ = frozenset({"npz", "damaged-zip"})
"""What an `.npz` reader takes (a damaged zip: the reader names the damage)."""
TORCH = frozenset({"torch", "damaged-zip"})

_MAGIC = (
    (b"\x1f\x8b", "gzip"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"\x89HDF\r\n\x1a\n", "hdf5"), (b"SQLite format 3\x00", "sqlite"), (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"), (b"%PDF", "pdf"), (b"\x7fELF", "elf"),
)
_TORCH_LEGACY = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
"""A legacy (non-zip) `torch.save`: pickle protocol 2 whose first object is torch's magic number."""


def describe(kind: str) -> str:
    return DESCRIPTIONS.get(kind, kind)


def sniff(path: str | os.PathLike[str]) -> str:
    """The kind of the file at `path` (see the module docstring); `missing` when there is none."""
    p = Path(path)
    if p.is_dir():
        return "folder"
    try:
        info = p.stat()
        if not stat.S_ISREG(info.st_mode):  # a pipe or a device: reading it to look would consume or block
            return "special"
        with open(p, "rb") as fh:
            head = fh.read(_SNIFF_BYTES)
    except FileNotFoundError:
        return "missing"
    except IsADirectoryError:
        return "folder"
    except OSError:
        return "missing" if not p.exists() else "binary"
    return _kind(head, info.st_size, lambda: zipfile.ZipFile(p))


def sniff_data(data: bytes) -> str:
    """The kind of a file's bytes already read (a file read once, as a pipe can only be)."""
    return _kind(data[:_SNIFF_BYTES], len(data), lambda: zipfile.ZipFile(io.BytesIO(data)))


def _kind(head: bytes, size: int, open_zip) -> str:
    if not head:
        return "empty"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08"):
        return _zip_kind(open_zip)
    if head.startswith(b"\x93NUMPY"):
        return "npy-pickle" if _npy_holds_objects(head) else "npy"
    if head.startswith(_TORCH_LEGACY):
        return "torch"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "pickle"
    if len(head) >= 10 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= size - 8:
        return "safetensors"  # an 8-byte little-endian header length, then a JSON object within the file
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    if len(head) > 262 and head[257:262] == b"ustar":
        return "tar"
    return _text_kind(head)


def require(path: str | os.PathLike[str], accepted: Collection[str], what: str, error: type[Exception],
            hint: str = "") -> str:
    """The kind of `path` if `accepted`, else `error` in one line: `PATH is KIND, not WHAT`
    (`PATH: no such file` when it is missing), then `; HINT` if given."""
    kind = sniff(path)
    if kind == "missing":
        raise error(f"{path}: no such file")
    if kind not in accepted:
        raise error(f"{path} is {describe(kind)}, not {what}" + (f"; {hint}" if hint else ""))
    return kind


@contextmanager
def reading(where: str) -> Iterator[None]:
    """Run a reader of `where` without library warnings, its `MemoryError` one line naming it."""
    import numpy as np

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            yield
        except ResourceError:
            raise
        except MemoryError as exc:
            raise ResourceError(f"{where}: out of memory while reading it ({one_line(exc)}); check the sizes it "
                                "declares (rows, tokens, shapes)") from None


def one_line(exc: BaseException, limit: int = 200) -> str:
    """The first non-empty line of an exception's text (libraries write paragraphs), shortened."""
    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    text = text or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _zip_kind(open_zip) -> str:
    try:
        with open_zip() as zf:
            names = zf.namelist()
            if any(n.rpartition("/")[2] == "data.pkl" for n in names):
                return "torch"
            if not names or not all(n.endswith(".npy") for n in names):
                return "zip"
            for name in names[:64]:  # a member's header says whether it is pickled objects
                with zf.open(name) as fh:
                    if _npy_holds_objects(fh.read(4096)):
                        return "npz-pickle"
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError):
        return "damaged-zip"
    except Exception:  # zlib.error and friends from a damaged member
        return "damaged-zip"
    return "npz"


def _npy_holds_objects(head: bytes) -> bool:
    """Whether an `.npy` header declares an object dtype (stored pickled)."""
    if not head.startswith(b"\x93NUMPY") or len(head) < 10:
        return False
    major = head[6]
    size, start = (int.from_bytes(head[8:10], "little"), 10) if major == 1 else (int.from_bytes(head[8:12], "little"), 12)
    try:
        header = ast.literal_eval(head[start : start + size].decode("latin-1"))
        descr = header["descr"]
    except (ValueError, SyntaxError, KeyError, TypeError, MemoryError, RecursionError):
        return False
    return "O" in str(descr)


def _text_kind(head: bytes) -> str:
    if b"\x00" in head:
        return "binary"
    body = head[3:] if head.startswith(b"\xef\xbb\xbf") else head
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start >= len(body) - 3 and len(head) == _SNIFF_BYTES:  # a character cut by the sniff's end
            text = body[: exc.start].decode("utf-8", errors="replace")
        else:
            controls = sum(b < 0x20 and b not in b"\t\n\r\f" or b == 0x7F for b in body)
            return "other-text" if controls <= len(body) // 100 else "binary"
    if sum(ch < " " and ch not in "\t\n\r\f" for ch in text) > len(text) // 100:
        return "binary"
    return "json" if text.lstrip()[:1] in ("{", "[") else "text"

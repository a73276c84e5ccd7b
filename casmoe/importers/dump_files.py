"""Reading what serving engines leave on disk: dump folders, JSON and JSONL records, routed
experts in the encodings vLLM and SGLang use, and the id, text and time fields beside them.
Every fault is a `TraceError` naming the file (and the record) and what is wrong."""

from __future__ import annotations

import base64
import binascii
import io
import json
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from casmoe.filekind import TEXT, one_line, require
from casmoe.folder import sha256_file
from casmoe.importers.checks import unique_pairs
from casmoe.trace import TraceError


def distinct_files(files: Sequence[Path], error: type[Exception] = TraceError, same_bytes: bool = True) -> list[Path]:
    """`files`, refusing one given twice: the same file under two spellings (or a folder and a
    file in it), or, with `same_bytes`, two files with the same bytes (a copy): every request or
    count in it would count twice. One line names both."""
    seen: dict[Path, Path] = {}
    for f in files:
        key = f.resolve()
        if key in seen:
            raise error(f"{f} is given twice ({seen[key]} and {f}): its requests would count twice; give it once")
        seen[key] = f
    if same_bytes:
        by_size: dict[int, list[Path]] = {}
        for f in files:
            by_size.setdefault(f.stat().st_size, []).append(f)
        for group in (g for g in by_size.values() if len(g) > 1):
            digests: dict[str, Path] = {}
            for f in group:
                d = sha256_file(f)
                if d in digests:
                    raise error(f"{f} has the same bytes as {digests[d]}: the same dump given twice would count its "
                                "requests twice; give it once")
                digests[d] = f
    return list(files)


def engine_files(sources: Sequence[str | Path], suffixes: tuple[str, ...], engine: str,
                 error: type[Exception] = TraceError) -> list[Path]:
    """The files of `sources`, a folder expanding to its files with `suffixes`, in name order;
    a file given twice (`distinct_files`) is refused."""
    files: list[Path] = []
    for src in map(Path, sources):
        if src.is_dir():
            found = sorted(p for p in src.iterdir() if p.suffix in suffixes)
            if not found:
                raise error(f"{src}: no {'/'.join(suffixes)} files of a {engine} dump in this folder")
            files += found
        elif not src.exists():
            raise error(f"{src}: no such file")
        else:
            files.append(src)
    if not files:
        raise error("no input given")
    return distinct_files(files, error)


def decode_array(value: Any, where: str) -> np.ndarray | None:
    """One routed-experts field in any of the encodings vLLM and SGLang use (see the module docstring)."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, list):
        try:
            arr = np.array(value)
        except ValueError:
            raise TraceError(f"{where}: routed experts are a ragged list; expected [tokens, layers, top_k]") from None
        if arr.size == 0:
            return arr.reshape(0, 0, 0).astype(np.int64)
        if not np.issubdtype(arr.dtype, np.integer):
            raise TraceError(f"{where}: routed experts must be integer ids, got {arr.dtype}")
        return arr
    if isinstance(value, dict) and "data" in value and "shape" in value:
        raw, shape = b64_bytes(value["data"], where), value["shape"]
        if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
            raise TraceError(f"{where}: 'shape' must be a list of sizes, got {shape!r}")
        count = int(np.prod(shape))
        dtype = value.get("dtype") or {2 * count: "int16", 4 * count: "int32"}.get(len(raw))
        if dtype not in ("int16", "int32", "int64", "uint8", "int8") or len(raw) != count * np.dtype(dtype).itemsize:
            raise TraceError(f"{where}: {len(raw)} bytes do not hold an integer array of shape {shape}")
        return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)
    if isinstance(value, str):
        raw = b64_bytes(value, where)
        if raw.startswith(b"\x93NUMPY"):
            try:
                return np.load(io.BytesIO(raw), allow_pickle=False)
            except ValueError as exc:
                raise TraceError(f"{where}: base64 .npy array cannot be read: {one_line(exc)}") from None
        raise TraceError(f"{where}: base64 routed experts without a shape; save them as a list or with 'shape'")
    raise TraceError(f"{where}: routed experts must be a list, an array or base64, got {type(value).__name__}")


def b64_bytes(text: Any, where: str) -> bytes:
    if not isinstance(text, str):
        raise TraceError(f"{where}: base64 data must be a string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise TraceError(f"{where}: routed experts are not valid base64") from None


def token_ids(value: Any, where: str, what: str) -> np.ndarray | None:
    return None if value is None else as_int_array(value, where, what, 1)


def as_int_array(value: Any, where: str, what: str, ndim: int) -> np.ndarray:
    """`value` as an integer array of `ndim` dimensions, or one line saying what it is instead."""
    try:
        arr = np.asarray(value) if isinstance(value, (list, np.ndarray)) else None
    except (ValueError, TypeError, OverflowError):  # ragged or mixed lists
        arr = None
    if arr is None or arr.ndim != ndim or (arr.size and not np.issubdtype(arr.dtype, np.integer)) or arr.dtype == bool:
        got = f"{arr.dtype} {arr.shape}" if arr is not None else type(value).__name__
        raise TraceError(f"{where}: {what} must be an integer array of {ndim} dimensions, got {got}")
    return arr.astype(np.int64)


def text_field(value: Any, where: str, what: str) -> str | None:
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind == "U":
        value = str(value)
    if value is not None and not isinstance(value, str):
        raise TraceError(f"{where}: {what} must be text")
    return value


def seconds(value: Any, where: str) -> float | None:
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise TraceError(f"{where}: arrival time must be a number of seconds, got {value!r}")
    return float(value)


def _parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=lambda pairs: unique_pairs(pairs, where))
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not valid JSON: {one_line(exc)}") from None
    except RecursionError:
        raise TraceError(f"{where}: JSON nested too deeply") from None


def json_records(path: Path) -> Iterator[tuple[str, Any]]:
    where = str(path)
    require(path, TEXT | {"other-text"}, "JSON or JSONL of engine responses", TraceError)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise TraceError(f"{where}: not readable: {one_line(exc)}") from None
    if path.suffix == ".jsonl":
        for i, line in enumerate(text.splitlines()):
            if line.strip():
                label = f"{where} line {i + 1}"
                yield label, _parse_json(line, label)
        return
    doc = _parse_json(text, where)
    if isinstance(doc, list):
        for i, d in enumerate(doc):
            yield f"{where} item {i}", d
    else:
        yield where, doc

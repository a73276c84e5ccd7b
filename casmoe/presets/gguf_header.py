"""The header of a GGUF file: its metadata and every tensor's name, type, shape and place.

What users run llama.cpp with is a GGUF file, and its header states the model exactly: the
architecture's hyperparameters as key/value pairs, then each tensor's name, ggml type, shape and
offset (the layout of ggml/docs/gguf.md; gguf-py's `gguf_reader.py` reads the same). casmoe
needs the header only, so this reads the header only: the tensor data is never touched, and a
60 GB file is read in a tenth of a second, most of it stepping over the tokenizer.

Why not `gguf.GGUFReader`: it builds a numpy view per array element, and a real file's
tokenizer holds some 150k tokens and as many merges (12 s for Qwen3's 152k, measured). Here
such long arrays are stepped over and only their length is kept (`SkippedArray`); everything
else (value types, ggml types and their block sizes, the key names) comes from gguf-py's
constants, and tests/presets/test_gguf.py checks this reader against `GGUFReader` on the files it writes.

A model split by `llama-gguf-split` (`NAME-00001-of-00003.gguf`) is read whole from any one of
its parts: the first holds the metadata, each part its share of the tensors.
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from casmoe.errors import CasmoeError

SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
"""A split set's file names: llama.cpp's `llama_split_path` ("%s-%05d-of-%05d.gguf", src/llama.cpp),
gguf-py's `SHARD_NAME_FORMAT`."""
LONG_ARRAY = 512
"""Arrays longer than this (the tokenizer's tokens, types, scores, merges) are skipped, not decoded;
per-layer arrays (`head_count_kv` of a model whose layers differ) are far shorter."""
_MAX_DIMS = 4  # GGML_MAX_DIMS (ggml/include/ggml.h)
_SCALAR = {"UINT8": "B", "INT8": "b", "UINT16": "H", "INT16": "h", "UINT32": "I", "INT32": "i", "FLOAT32": "f",
           "BOOL": "?", "UINT64": "Q", "INT64": "q", "FLOAT64": "d"}
"""struct formats of gguf-py's `GGUFValueType` scalars (GGUFReader.gguf_scalar_to_np holds the same widths)."""


class GGUFError(CasmoeError, ValueError):
    """A file that is not a GGUF casmoe can read: missing, not GGUF, truncated or inconsistent."""


@dataclass(frozen=True)
class SkippedArray:
    """A long array value that was stepped over (a tokenizer's vocabulary): its element type and length."""

    type: str
    length: int


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header states it. `shape` is in ggml order: `shape[0]` is the row
    length (the input width of a matrix, what a block type's blocks tile), the last dimension of
    a merged expert tensor is the expert. `n_bytes` is what the file stores for it, exactly."""

    name: str
    type: str
    shape: tuple[int, ...]
    n_bytes: int
    part: int = 0  # which file of a split set holds it
    offset: int = 0  # where its data starts in that file

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class GGUFHeader:
    """A GGUF model's header: `fields` (the metadata of the first part; long arrays skipped) and
    the tensors of every part, in file order."""

    path: str
    parts: tuple[str, ...]
    version: int
    fields: Mapping[str, Any]
    tensors: tuple[TensorInfo, ...]

    @property
    def architecture(self) -> str:
        value = self.fields.get("general.architecture")  # gguf.Keys.General.ARCHITECTURE
        if not isinstance(value, str) or not value:
            raise GGUFError(f"{self.path}: no general.architecture in the header")
        return value

    @cached_property
    def by_name(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


class _Cursor:
    """Reads GGUF values from a memory map at a moving offset, in the file's byte order."""

    def __init__(self, buf: Any, path: Path, order: str) -> None:
        import gguf

        self.buf, self.path, self.order, self.offset = buf, path, order, 0
        self.types = gguf.GGUFValueType
        self.formats = {self.types[name]: fmt for name, fmt in _SCALAR.items()}

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(self.order + fmt, self.buf, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("Q")
        end = self.offset + n
        if end > len(self.buf):
            raise struct.error("string runs past the end of the file")
        raw = self.buf[self.offset:end]
        self.offset = end
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: a string in the header is not UTF-8 (corrupt file?)") from None

    def value_type(self) -> Any:
        raw = self.scalar("I")
        try:
            return self.types(raw)
        except ValueError:
            raise GGUFError(f"{self.path}: unknown GGUF value type {raw} (corrupt file?)") from None

    def value(self, vtype: Any) -> Any:
        if vtype in self.formats:
            return self.scalar(self.formats[vtype])
        if vtype is self.types.STRING:
            return self.string()
        item = self.value_type()
        n = self.scalar("Q")
        if n > LONG_ARRAY:
            self.skip(item, n)
            return SkippedArray(item.name, n)
        if item in self.formats:
            fmt = f"{self.order}{n}{self.formats[item]}"
            values = struct.unpack_from(fmt, self.buf, self.offset)
            self.offset += struct.calcsize(fmt)
            return values
        return tuple(self.value(item) for _ in range(n))

    def skip(self, item: Any, n: int) -> None:
        if item in self.formats:
            self.offset += n * struct.calcsize(self.formats[item])
        elif item is self.types.STRING:
            unpack, order, buf, offset = struct.unpack_from, self.order + "Q", self.buf, self.offset
            for _ in range(n):  # each string is its u64 length and its bytes
                offset += 8 + unpack(order, buf, offset)[0]
            self.offset = offset
        else:
            for _ in range(n):
                self.value(item)
        if self.offset > len(self.buf):
            raise struct.error("array runs past the end of the file")


def _read_part(path: Path, part: int) -> tuple[int, dict[str, Any], list[TensorInfo]]:
    import gguf

    try:
        with open(path, "rb") as fh:
            buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except ValueError:  # mmap refuses an empty file
        raise GGUFError(f"{path}: empty file, not a GGUF model") from None
    except OSError as exc:
        raise GGUFError(f"{path}: cannot read ({exc.strerror or exc})") from None
    with buf:
        if len(buf) < 8 or struct.unpack_from("<I", buf, 0)[0] != gguf.GGUF_MAGIC:
            raise GGUFError(f"{path}: not a GGUF file (it does not start with the GGUF magic)")
        order = "<"
        version = struct.unpack_from("<I", buf, 4)[0]
        if version & 0xFFFF == 0:  # written on a big-endian machine (gguf_reader.py tests the same)
            order, version = ">", struct.unpack_from(">I", buf, 4)[0]
        if version not in (2, gguf.GGUF_VERSION):  # gguf_reader.py's READER_SUPPORTED_VERSIONS
            raise GGUFError(f"{path}: GGUF version {version} is not supported (2 or {gguf.GGUF_VERSION}; "
                            "re-convert the model with a current llama.cpp)")
        cur = _Cursor(buf, path, order)
        cur.offset = 8
        try:
            n_tensors, n_kv = cur.scalar("Q"), cur.scalar("Q")
            if n_tensors > 1 << 20 or n_kv > 1 << 20:
                raise GGUFError(f"{path}: implausible header ({n_tensors} tensors, {n_kv} keys): corrupt file")
            fields: dict[str, Any] = {}
            for _ in range(n_kv):
                key = cur.string()
                fields[key] = cur.value(cur.value_type())
            raw: list[tuple[str, tuple[int, ...], int, int]] = []
            for _ in range(n_tensors):
                name = cur.string()
                n_dims = cur.scalar("I")
                if not 1 <= n_dims <= _MAX_DIMS:
                    raise GGUFError(f"{path}: tensor {name} has {n_dims} dimensions (corrupt file?)")
                shape = tuple(cur.scalar("Q") for _ in range(n_dims))
                raw.append((name, shape, cur.scalar("I"), cur.scalar("Q")))
        except struct.error:
            raise GGUFError(f"{path}: truncated: the header ends before its last key or tensor") from None
        alignment = fields.get(gguf.Keys.General.ALIGNMENT, gguf.GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(f"{path}: general.alignment {alignment!r} is not a power of two")
        data = -(-cur.offset // alignment) * alignment
        tensors = []
        for name, shape, type_id, offset in raw:
            try:
                qtype = gguf.GGMLQuantizationType(type_id)
            except ValueError:
                raise GGUFError(f"{path}: tensor {name} has ggml type {type_id}, unknown to gguf "
                                f"{_version()} (a newer llama.cpp type? upgrade the gguf package)") from None
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            if shape[0] % block:
                raise GGUFError(f"{path}: tensor {name}: rows of {shape[0]} are not whole {qtype.name} blocks of "
                                f"{block} (corrupt file?)")
            info = TensorInfo(name, qtype.name, shape, math.prod(shape) // block * size, part, data + offset)
            if info.offset + info.n_bytes > len(buf):
                raise GGUFError(f"{path}: truncated: tensor {name} ends at byte {info.offset + info.n_bytes} but "
                                f"the file has {len(buf)} (an interrupted download or copy?)")
            tensors.append(info)
    return version, fields, tensors


def _version() -> str:
    try:
        return version("gguf")
    except PackageNotFoundError:
        return "(version unknown)"


def split_parts(path: str | Path) -> tuple[Path, ...]:
    """The files of the model `path` names: itself, or every part of its split set (from any part's
    name; a missing part is an error)."""
    path = Path(path)
    m = SPLIT_NAME.match(path.name)
    if not m:
        return (path,)
    count = int(m["count"])
    parts = tuple(path.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1))
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise GGUFError(f"{path}: part of a split set of {count}, but {', '.join(missing)} "
                        f"{'is' if len(missing) == 1 else 'are'} missing beside it")
    return parts


def read_header(path: str | Path) -> GGUFHeader:
    """The header of the GGUF model at `path` (one file, or any part of a split set: all parts are
    read). Raises `GGUFError` in one line for anything casmoe cannot read."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"{path}: no such file")
    parts = split_parts(path)
    keys = gguf.Keys.Split
    version, fields, tensors = _read_part(parts[0], 0)
    count = fields.get(keys.LLM_KV_SPLIT_COUNT)
    if count is None and len(parts) > 1:
        raise GGUFError(f"{parts[0]}: named as part 1 of {len(parts)} but its header has no split.count")
    if count is not None and count != len(parts):
        raise GGUFError(f"{parts[0]}: its header says split.count {count} but it is named as one of {len(parts)} "
                        "parts; keep llama-gguf-split's file names (NAME-00001-of-00003.gguf)")
    total = fields.get(keys.LLM_KV_SPLIT_TENSORS_COUNT, len(tensors))
    for i, part in enumerate(parts[1:], start=1):
        _, part_fields, part_tensors = _read_part(part, i)
        if part_fields.get(keys.LLM_KV_SPLIT_NO) != i:
            raise GGUFError(f"{part}: its header says split.no {part_fields.get(keys.LLM_KV_SPLIT_NO)}, not {i}")
        tensors += part_tensors
    if len(tensors) != total:
        raise GGUFError(f"{parts[0]}: the parts hold {len(tensors)} tensors, the header says {total}")
    if len({t.name for t in tensors}) != len(tensors):
        raise GGUFError(f"{parts[0]}: a tensor name appears twice (corrupt file?)")
    return GGUFHeader(str(parts[0]), tuple(str(p) for p in parts), version, fields, tuple(tensors))

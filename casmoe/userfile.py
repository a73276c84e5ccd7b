"""Reading the text files users write by hand: hardware profiles, sweep grids, prompt lists.

Editors on Windows save UTF-8 with a byte-order mark, which TOML and JSON parsers reject as
"Invalid statement at line 1" (and which would otherwise start the first prompt); files in
another encoding fail deep inside a parser. Every such file is read here: a BOM is dropped,
a file that is not UTF-8 is one error naming the file and the byte, and a file that is no text
at all (a zip, an image, a folder) is named as what it is (`casmoe.filekind`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from casmoe.filekind import describe, one_line, sniff_data

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def read_text(path: str | os.PathLike[str], what: str, error: type[Exception]) -> str:
    """The file's text (UTF-8, a leading BOM dropped); `error` naming the file otherwise."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{what} {path} not found") from None
    except IsADirectoryError:
        raise error(f"{path} is a folder, not a {what}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    kind = sniff_data(data) if b"\x00" in data[:1 << 16] or not data.isascii() else "text"
    if kind not in ("text", "json", "other-text"):  # a zip, an image, a pickle: named as what it is
        raise error(f"{path} is {describe(kind)}, not a {what}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: {what} is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None


def read_toml(path: str | os.PathLike[str], what: str, error: type[Exception]) -> dict[str, Any]:
    """The parsed TOML of a user's file (see `read_text`); `error` naming the file on bad TOML."""
    text = read_text(path, what, error)
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise error(f"{path}: not valid TOML: {one_line(exc)}") from None

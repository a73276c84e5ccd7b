"""The TOML tables shipped inside the package, read one way.

casmoe's numbers live as data beside the code (STYLE principle 14): precisions, model presets,
hardware profiles and the part catalog, stacks, links and prices, engines' flags, support and
memory rules, quality figures, the published measurements and boxes, the error model. Each is
read here: a missing or unparsable table is a broken install or a bad edit of the package, said
in one line naming the file, never a parser's traceback. A user's own files go through
`casmoe.userfile.read_toml`, which also forgives what editors write (a byte-order mark).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from casmoe.errors import CasmoeError


class TableError(CasmoeError, RuntimeError):
    """A shipped table that cannot be read: the install or an edit of the package is broken."""


def read_table(path: str | Path) -> dict[str, Any]:
    """The parsed TOML table shipped at `path`."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TableError(f"{path}: a table casmoe ships is missing (reinstall casmoe)") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TableError(f"{path}: not valid TOML ({exc}); undo the edit of this shipped table") from None

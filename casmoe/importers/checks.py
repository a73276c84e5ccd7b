"""Checks every importer applies to what a foreign file declares."""

from __future__ import annotations

import re
from typing import Any


def exact_int(value: Any, what: str, text: bool = False) -> int:
    """An integer written as one (16, or "16" in a `text` header), never a float, a boolean or a
    JSON string that happens to convert."""
    if text and isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"{what} must be an integer, got {value!r}")

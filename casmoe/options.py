"""The values of run options as users write them (`24GB`, `cpu`, `int4`), parsed into typed values.

The options themselves are declared in `casmoe.sim.run.options`; every command, sweep file and
the Python API parse their values with these functions, so `--capacity 24GB`, `--miss-mode cpu`
or `--quant int4` mean the same thing and fail with the same one-line message everywhere.
Policy specs (`lru`, `sch[m=4]`) are parsed by `casmoe.policies.spec`, beside the registry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from casmoe.cache import Capacity, MissMode
from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry, Quant
from casmoe.precision import Precision, PrecisionError, parse_precision


class OptionError(CasmoeError, ValueError):
    """An option value that does not parse (bad capacity, unknown miss mode or quant)."""


_UNITS = {
    "b": 1, "kb": 1e3, "kib": 2**10, "mb": 1e6, "mib": 2**20, "gb": 1e9, "gib": 2**30, "tb": 1e12, "tib": 2**40,
}
_CAPACITY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", re.IGNORECASE)


@dataclass(frozen=True)
class CapacitySpec:
    """A capacity as written: `4` (slots per layer) or `6GB` / `512MiB` (expert cache of all
    devices together), with `per_layer=False` for one pool shared by all layers. It resolves
    to slots once the bytes per expert are known."""

    text: str
    per_layer: bool = True

    def __post_init__(self) -> None:
        self._parts()  # a malformed capacity fails where it is written, before any work

    def _parts(self) -> tuple[float, str]:
        m = _CAPACITY.fullmatch(self.text)
        if not m:
            raise OptionError(f"bad capacity {self.text!r}; give slots (4), memory (24GB, 512MiB) or fit (the most the GPUs hold)")
        number, unit = float(m.group(1)), (m.group(2) or "").lower()
        if not unit and number != int(number):
            raise OptionError(f"capacity in slots must be a whole number, got {self.text!r}")
        return number, unit

    def resolve(self, expert_bytes: Sequence[int]) -> Capacity:
        """Slots for these bytes per expert (one entry per layer)."""
        number, unit = self._parts()
        if not unit:
            return Capacity(int(number), self.per_layer)
        per_slot = sum(expert_bytes) if self.per_layer else sum(expert_bytes) / max(1, len(expert_bytes))
        if per_slot <= 0:
            raise OptionError(
                f"capacity {self.text!r} is memory, but the expert size is unknown (the trace has no bytes per "
                "expert); give the capacity in slots, or a --model preset / --quant that prices experts"
            )
        return Capacity(int(number * _UNITS[unit] // per_slot), self.per_layer)

    @property
    def label(self) -> str:
        return self.text.strip() + ("" if self.per_layer else " global")


FIT = "fit"
"""A capacity written `fit`: the most the box holds (resolved where the box is known)."""


def capacity_text(text: str) -> CapacitySpec | None:
    """A capacity as written (slots, memory, or `fit`), checked: a malformed one is an `OptionError`."""
    return None if text.strip().lower() == FIT else CapacitySpec(text)


def one_capacity(capacity: str | None, global_capacity: str | None, geometry: Geometry) -> Capacity:
    """`--capacity` (per layer) or `--global-capacity` (one pool), which exclude each other;
    2 x top_k slots per layer when neither is given (room for the running layer and the next)."""
    if capacity is not None and global_capacity is not None:
        raise OptionError("give --capacity (slots per layer) or --global-capacity (one pool), not both")
    expert_bytes = geometry.bytes_per_layer()
    if global_capacity is not None:
        return CapacitySpec(str(global_capacity), per_layer=False).resolve(expert_bytes)
    return CapacitySpec(str(2 * geometry.top_k if capacity is None else capacity)).resolve(expert_bytes)


def parse_miss_mode(text: str | MissMode, what: str = "--miss-mode") -> MissMode:
    """`what` names the option in the message (`miss_modes` in a sweep file)."""
    if isinstance(text, MissMode):
        return text
    try:
        return MissMode(str(text).strip().lower())
    except ValueError:
        raise OptionError(f"unknown {what} {text!r}; one of {', '.join(m.value for m in MissMode)}") from None


def parse_quant(text: str | Precision | Quant | None, what: str = "--quant") -> Precision | None:
    """A precision by name (`bf16`, `q4_k_m`, `hqq2`, `mxfp4`, ...) or width (`4.5bpw`); `None`,
    "" or "trace" keeps the default (the trace's measured bytes per expert, else the checkpoint's)."""
    if text is None or isinstance(text, Precision):
        return text
    if isinstance(text, Quant):
        return text.precision
    if str(text).strip().lower() in ("", "trace"):
        return None
    try:
        return parse_precision(str(text).strip())
    except PrecisionError as exc:
        raise OptionError(f"unknown {what} {text!r}: {exc}") from None

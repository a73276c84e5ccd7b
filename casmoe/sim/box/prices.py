"""What a box costs: a price per GPU model, per GiB of host RAM and per host-link generation.

`casmoe search` ranks its answers by the box's price beside GPUs, memory and the metric, so
that a tie goes to the cheaper box. The numbers are data with a source each (STYLE principle
14): `casmoe/sim/box/prices.toml`, which a user's file of the same shape (`--prices FILE`) overrides entry
by entry:

    [gpu."NVIDIA GeForce RTX 4090"]        # the profile's `gpu` string
    usd = 1599                             # one card
    source = "where the number was read"

    [ram.ddr5]
    usd_per_gib = 7.03
    source = "..."

    [link.pcie5]
    usd = 134.99                           # the premium over the previous generation
    source = "..."

A box's price is its GPUs (`gpus` x the card), its host RAM (`host_ram_gib` x the per-GiB price
of the DDR generation its profile's sources name) and its host link (the premiums from PCIe 3.0
up to its generation, read from the profile's pinned-rate source or description). A part with
no price makes the whole price unknown, said so with the part, never guessed. A price whose
`kind` says it is a proxy (no page prices a PCIe generation as such), a street range or an old
figure is marked as such wherever it is shown.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from casmoe.errors import CasmoeError
from casmoe.userfile import read_toml

if TYPE_CHECKING:
    from casmoe.sim.box.hardware import HardwareProfile

PRICES_FILE = Path(__file__).with_name("prices.toml")
LINKS = ("pcie3", "pcie4", "pcie5")
"""Host-link generations in order; a box pays every premium from pcie3 up to its own."""
_NUMBER = {"gpu": "usd", "ram": "usd_per_gib", "link": "usd"}
"""Each table's number: a card, a GiB, a generation's premium over the previous one."""
_EXTRA = {"usd_high", "usd_over_pcie3", "kind", "date", "derivation", "alternatives", "proxy"}
"""Other keys an entry may carry (read by people; `kind` and `proxy` also mark the price)."""


class PriceError(CasmoeError, ValueError):
    """A prices file that is not of the shipped file's shape, or a number without a source."""


@dataclass(frozen=True)
class Price:
    """One sourced number (USD), what kind of price it is and where it came from."""

    usd: float
    source: str
    kind: str = ""
    where: str = ""  # the file and table it was read from, e.g. casmoe/sim/box/prices.toml [link.pcie4]
    proxy: bool = False
    date: str = ""

    @property
    def caveat(self) -> str:
        """'' for a plain price, else what a reader must know: a proxy, a street range, an old figure."""
        if self.proxy or self.kind.lower().startswith("proxy"):
            return "proxy"
        if "street" in self.kind.lower():
            return "street price, low end"
        if "old" in self.date.lower():
            return f"old price ({self.date.split(' ')[0]})"
        return ""


@dataclass(frozen=True)
class Part:
    """One part of a box's price: what (`2 x NVIDIA GeForce RTX 4090`), its USD (None: unknown)
    and why it is unknown, or the price it was made from."""

    what: str
    usd: float | None
    price: Price | None = None
    missing: str = ""


@dataclass(frozen=True)
class BoxPrice:
    """A box's price: the sum of its parts, or None when any part has no price."""

    parts: tuple[Part, ...]

    @property
    def usd(self) -> float | None:
        if any(p.usd is None for p in self.parts):
            return None
        return sum(p.usd for p in self.parts)  # type: ignore[misc]

    @property
    def known(self) -> bool:
        return self.usd is not None

    @property
    def caveats(self) -> list[Part]:
        """The parts priced by a proxy, a street range or an old figure."""
        return [p for p in self.parts if p.price is not None and p.price.caveat]

    def describe(self) -> str:
        """'$3,833', '$3,833 (proxy: link pcie4)' or 'unknown (no price for GPU ...)'."""
        if self.usd is None:
            return "unknown (" + "; ".join(p.missing for p in self.parts if p.usd is None) + ")"
        marks = [f"{p.price.caveat}: {p.what}" for p in self.caveats]  # type: ignore[union-attr]
        return f"${self.usd:,.0f}" + (f" ({'; '.join(marks)})" if marks else "")

    def breakdown(self) -> str:
        """Each part with its price: '1 x NVIDIA GeForce RTX 4090 $1,599 + 64 GiB DDR4 $400 + ...'."""
        return " + ".join(f"{p.what} {'unknown' if p.usd is None else f'${p.usd:,.0f}'}" for p in self.parts)


@dataclass(frozen=True)
class Prices:
    """Prices by table: `gpu` (by the profile's GPU name), `ram` (ddr4, ddr5: per GiB), `link`
    (pcie3.. : the premium over the previous generation); `files` read, in order."""

    gpu: dict[str, Price] = field(default_factory=dict)
    ram: dict[str, Price] = field(default_factory=dict)
    link: dict[str, Price] = field(default_factory=dict)
    files: tuple[str, ...] = ()

    def with_file(self, path: str | Path) -> Prices:
        """These prices with a user's file on top (entry by entry)."""
        raw = read_toml(path, "prices file", PriceError)
        new = parse(raw, str(path))
        return Prices({**self.gpu, **new.gpu}, {**self.ram, **new.ram}, {**self.link, **new.link},
                      (*self.files, str(path)))

    def box(self, hw: HardwareProfile) -> BoxPrice:
        """The price of `hw`'s GPUs, host RAM and host link (see the module docstring)."""
        return BoxPrice((self._gpu(hw), self._ram(hw), self._link(hw)))

    def _hint(self, table: str, key: str, number: str) -> str:
        return f"add [{table}.{_toml_key(key)}] {number} = ... and source = \"...\" to a --prices FILE"

    def _gpu(self, hw: HardwareProfile) -> Part:
        what = f"{hw.gpus} x {hw.gpu}"
        price = self.gpu.get(hw.gpu) or next((p for k, p in self.gpu.items() if k.lower() == hw.gpu.lower()), None)
        if price is None:
            return Part(what, None, missing=f"no price for GPU {hw.gpu!r}; {self._hint('gpu', hw.gpu, 'usd')}")
        return Part(what, hw.gpus * price.usd, price)

    def _ram(self, hw: HardwareProfile) -> Part:
        kind = ram_generation(hw)
        if hw.host_ram_gib <= 0:
            return Part("host RAM", None, missing=f"profile {hw.name!r} gives no host_ram_gib; give --host-ram GiB")
        what = f"{hw.host_ram_gib:g} GiB {kind.upper() if kind else 'RAM'}"
        if kind is None:
            return Part(what, None, missing=f"profile {hw.name!r} names no DDR generation (DDR4, DDR5) in its cpu or "
                                            "memory sources, so its RAM has no price; name it in the source of "
                                            "cpu_mem_bw_gbs")
        price = self.ram.get(kind)
        if price is None:
            return Part(what, None, missing=f"no price for {kind} RAM; {self._hint('ram', kind, 'usd_per_gib')}")
        return Part(what, hw.host_ram_gib * price.usd, price)

    def _link(self, hw: HardwareProfile) -> Part:
        gen = link_generation(hw)
        if gen is None:
            return Part("host link", None, missing=f"profile {hw.name!r} names no PCIe generation for its host link; "
                                                   "give --link pcie3|pcie4|pcie5")
        what = f"{gen} host link"
        steps = LINKS[1 : LINKS.index(gen) + 1]
        missing = [g for g in steps if g not in self.link]
        if missing:
            return Part(what, None, missing=f"no price for {missing[0]}; {self._hint('link', missing[0], 'usd')}")
        chosen = [self.link[g] for g in steps]
        worst = next((p for p in chosen if p.caveat), chosen[-1] if chosen else self.link.get(LINKS[0]))
        return Part(what, sum(p.usd for p in chosen), worst)


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else f'"{key}"'


def parse(raw: dict[str, Any], where: str) -> Prices:
    """Check a prices file's tables: each entry a table with its number (finite, >= 0) and a
    non-empty `source`; nothing else at the top."""
    unknown = sorted(set(raw) - set(_NUMBER))
    if unknown:
        raise PriceError(f"{where}: unknown table {unknown[0]!r}; a prices file has [gpu.\"NAME\"], [ram.ddr4|ddr5] "
                         "and [link.pcie3|pcie4|pcie5] entries, as casmoe/sim/box/prices.toml")
    tables: dict[str, dict[str, Price]] = {}
    for table, number in _NUMBER.items():
        entries = raw.get(table, {})
        if not isinstance(entries, dict):
            raise PriceError(f"{where}: {table} must be a table of entries ([{table}.NAME]), got {entries!r}")
        out: dict[str, Price] = {}
        for key, entry in entries.items():
            at = f"{where} [{table}.{_toml_key(key)}]"
            if not isinstance(entry, dict):
                raise PriceError(f"{at}: must be a table with {number} = ... and source = \"...\"")
            if table == "ram" and key not in ("ddr4", "ddr5"):
                raise PriceError(f"{at}: unknown RAM generation; use ram.ddr4 or ram.ddr5")
            if table == "link" and key not in LINKS:
                raise PriceError(f"{at}: unknown link generation; use one of {', '.join(LINKS)}")
            extra = sorted(set(entry) - {number, "source"} - _EXTRA)
            if extra:
                raise PriceError(f"{at}: unknown key {extra[0]!r}; an entry has {number}, source and optionally "
                                 f"{', '.join(sorted(_EXTRA))}")
            value = entry.get(number)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise PriceError(f"{at}: {number} must be a finite number >= 0 (USD), got {value!r}")
            source = entry.get("source")
            if not isinstance(source, str) or not source.strip():
                raise PriceError(f"{at}: no source for {number} = {value}; add source = \"where it was read\" (every "
                                 "number has a source, as in profiles)")
            kind, date, proxy = entry.get("kind", ""), entry.get("date", ""), entry.get("proxy", False)
            if not isinstance(kind, str) or not isinstance(date, str) or not isinstance(proxy, bool):
                raise PriceError(f"{at}: kind and date must be text, proxy true or false")
            out[key] = Price(float(value), source, kind, at, proxy, date)
        tables[table] = out
    return Prices(tables["gpu"], tables["ram"], tables["link"], (where,))


@lru_cache(maxsize=1)
def _shipped() -> Prices:
    return parse(read_toml(PRICES_FILE, "prices file", PriceError), "casmoe/sim/box/prices.toml")


def load_prices(user: str | Path | None = None) -> Prices:
    """The shipped prices, with a user's file (`--prices FILE`) on top (read anew each call)."""
    return _shipped() if user is None else _shipped().with_file(user)


def ram_generation(hw: HardwareProfile) -> str | None:
    """'ddr4' or 'ddr5' as the profile's memory sources (or its cpu) name it, else None."""
    for text in (hw.sources.get("cpu_mem_bw_gbs", ""), hw.sources.get("host_ram_gib", ""), hw.cpu, hw.description):
        found = re.search(r"DDR([45])", text, re.IGNORECASE)
        if found:
            return f"ddr{found.group(1)}"
    return None


def link_generation(hw: HardwareProfile) -> str | None:
    """The host link's PCIe generation: a `link=` variant's, else as the pinned rate's source or
    the description names it ('PCIe 4.0 x16'), else None."""
    source = hw.sources.get("h2d_pinned_gbs", "")
    variant = re.match(r"(pcie[345]) variant:", source)
    if variant:
        return variant.group(1)
    for text in (source, hw.description):
        found = re.search(r"PCIe\s*([345])(?:\.0)?\b", text, re.IGNORECASE)
        if found:
            return f"pcie{found.group(1)}"
    return None

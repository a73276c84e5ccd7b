"""`PolicySpec`: a policy named on a command line or in a sweep file, with its options.

`lru`, `sch[m=4]`, `casmoe[predictor=noisy,noise=0.5]`, `casmoe[planner=planner/]` or a
user's `pkg.mod:Class[key=value]`. Specs are hashable values (sweeps key results by them) and
build the cache they name with whatever the runtime knows (`trace`, `miss_mode`, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from casmoe.cache import ExpertCache
from casmoe.errors import CasmoeError


class PolicySpecError(CasmoeError, ValueError):
    """A policy spec that does not parse."""


def _value(text: str) -> Any:
    """Option values from the command line: bool, int, float, else string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@dataclass(frozen=True)
class PolicySpec:
    """A policy name (or `pkg.mod:Class`) with constructor options, e.g. `casmoe[predictor=noisy]`."""

    name: str
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        m = re.fullmatch(r"\s*([^\[\]\s]+)\s*(?:\[(.*)\])?\s*", text)
        if not m:
            raise PolicySpecError(f"bad policy {text!r}; write NAME or NAME[key=value,...], e.g. casmoe[predictor=noisy]")
        options = []
        for part in filter(None, (p.strip() for p in (m.group(2) or "").split(","))):
            key, eq, val = part.partition("=")
            if not eq or not key.strip():
                raise PolicySpecError(f"bad option {part!r} in policy {text!r}; write key=value")
            options.append((key.strip(), _value(val.strip())))
        return cls(m.group(1), tuple(sorted(options)))

    @property
    def label(self) -> str:
        if not self.options:
            return self.name
        return f"{self.name}[{','.join(f'{k}={v}' for k, v in self.options)}]"

    @property
    def cls(self) -> type[ExpertCache]:
        from casmoe.policies import get_policy

        return get_policy(self.name)

    def create(self, geometry, capacity, **runtime: Any) -> ExpertCache:
        """The cache this spec names; `runtime` carries `trace`, `miss_mode`, `expert_bytes`."""
        return self.cls.create(geometry, capacity, **runtime, **dict(self.options))


def default_policies(names: Iterable[str], planner: str | None = None) -> list[PolicySpec]:
    """Every named policy; `casmoe` with the fitted `planner` if given, else twice, with the
    exact and the noisy oracle predictors, which bracket what a real planner can reach."""
    out = []
    for name in names:
        if name == "casmoe" and planner is not None:
            out.append(PolicySpec("casmoe", (("planner", planner),)))
        elif name == "casmoe":
            out += [PolicySpec.parse("casmoe[predictor=exact]"), PolicySpec.parse("casmoe[predictor=noisy]")]
        else:
            out.append(PolicySpec(name))
    return out


def parse_policies(texts: Iterable[str] | None, registered: Iterable[str], planner: str | None = None) -> list[PolicySpec]:
    """The CLI's repeatable `--policy`: nothing or `all` means every registered policy."""
    texts = list(texts or [])
    if not texts or texts == ["all"]:
        return default_policies(registered, planner)
    specs = []
    for t in texts:
        spec = PolicySpec.parse(t)
        # a bare `casmoe` is the planner when one is given, else the two oracle brackets
        specs += default_policies(["casmoe"], planner) if spec == PolicySpec("casmoe") else [spec]
    for s in specs:
        s.cls  # noqa: B018  (an unknown name fails here, before any work)
    return specs

"""The policy registry: one name per built-in policy, and `package.module:Class` for users'."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from casmoe.cache import ExpertCache
from casmoe.errors import CasmoeError
from casmoe.policies.belady import Belady
from casmoe.policies.casmoe import CasMoE
from casmoe.policies.lfu import LFU
from casmoe.policies.lru import LRU
from casmoe.policies.ondemand import OnDemand
from casmoe.policies.sch import SCH
from casmoe.policies.semoe import SEMoE
from casmoe.policies.static import Static

POLICIES: dict[str, type[ExpertCache]] = {
    cls.name: cls for cls in (OnDemand, LRU, LFU, SEMoE, Static, Belady, SCH, CasMoE)
}


class PolicyNotFound(CasmoeError, LookupError):
    pass


def get_policy(spec: str) -> type[ExpertCache]:
    """A registered name (`lru`) or a user's class as `package.module:ClassName`."""
    if spec in POLICIES:
        return POLICIES[spec]
    if ":" not in spec:
        raise PolicyNotFound(
            f"unknown policy {spec!r}; built-in: {', '.join(POLICIES)}; or give your own as package.module:ClassName"
        )
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:  # like uvicorn's --app-dir: users' modules beside them import
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PolicyNotFound(f"cannot import {module_name!r} for policy {spec!r}: {exc}") from exc
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, ExpertCache)):
        raise PolicyNotFound(f"{spec!r} is not an ExpertCache subclass")
    return cls


@dataclass(frozen=True)
class PolicyChoice:
    """A policy to run, with its options, under a label for tables (`casmoe(noisy)`)."""

    label: str
    cls: type[ExpertCache]
    options: dict[str, Any] = field(default_factory=dict)

    def create(self, geometry, capacity, **runtime: Any) -> ExpertCache:
        return self.cls.create(geometry, capacity, **runtime, **self.options)


def choose_policies(
    spec: str,
    *,
    m: int = 16,
    planner: str | None = None,
    noise: float = 0.3,
    profile: Any = None,
) -> list[PolicyChoice]:
    """Turn the CLI's `--policy` (a name, a comma list, `all`, or `pkg.mod:Class`) into choices.

    `casmoe` runs with the fitted `planner` when one is given, else twice: with the exact
    (oracle) predictor and a noisy one, which bracket what a real planner can reach.
    """
    names = list(POLICIES) if spec == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    choices: list[PolicyChoice] = []
    for name in names:
        cls = get_policy(name)
        if cls is CasMoE:
            if planner is not None:
                choices.append(PolicyChoice("casmoe", cls, {"planner": planner}))
            else:
                choices.append(PolicyChoice("casmoe(exact)", cls, {"predictor": "exact"}))
                choices.append(PolicyChoice("casmoe(noisy)", cls, {"predictor": "noisy", "noise": noise}))
        elif cls is SCH:
            choices.append(PolicyChoice(f"sch(m={m})", cls, {"m": m}))
        elif cls is Static and profile is not None:
            choices.append(PolicyChoice("static", cls, {"profile": profile}))
        else:
            choices.append(PolicyChoice(cls.name or name, cls))
    return choices

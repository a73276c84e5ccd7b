"""`PolicySpec`: a policy named on a command line or in a sweep file, with its options.

`lru`, `sch[m=4]`, `casmoe[predictor=noisy,noise=0.5]`, `casmoe[planner=planner/]` or a
user's `pkg.mod:Class[key=value]`. Specs are hashable values (sweeps key results by them) and
build the cache they name with whatever the runtime knows (`trace`, `miss_mode`, ...).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Iterable

from casmoe.cache import ExpertCache
from casmoe.errors import CasmoeError
from casmoe.planner.cached import AUTO
from casmoe.policies.registry import POLICIES, get_policy


class PolicySpecError(CasmoeError, ValueError):
    """A policy spec that does not parse, or options its policy does not take."""


_RUNTIME_ARGS = {"self", "cls", "geometry", "capacity", "miss_mode", "expert_bytes", "trace"}
"""Constructor arguments the runtime fills in; the rest are the policy's options."""
_SIMPLE_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def _matches(value: Any, annotation: str) -> bool:
    """Whether `value` fits an annotation made of int, float, bool, str and None; True for
    annotations this check cannot read (the constructor then judges)."""
    parts = [p.strip() for p in annotation.split("|")]
    if not annotation or any(p not in _SIMPLE_TYPES and p != "None" for p in parts):
        return True
    if value is None:
        return "None" in parts
    kinds = tuple(k for p in parts if p in _SIMPLE_TYPES for k in _SIMPLE_TYPES[p])
    return isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))


def policy_options(cls: type[ExpertCache]) -> dict[str, str]:
    """Option name -> annotation (as written) that `cls.create` and the `__init__`s of its
    class chain accept, so that a misspelt or mistyped option fails before any work."""
    options: dict[str, str] = {}
    for klass in cls.__mro__:
        for attr in ("create", "__init__"):
            fn = klass.__dict__.get(attr)
            fn = getattr(fn, "__func__", fn)
            if fn is None or not callable(fn):
                continue
            for p in inspect.signature(fn).parameters.values():
                if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in _RUNTIME_ARGS:
                    ann = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
                    options.setdefault(p.name, "" if ann is p.empty else str(ann))
    return options


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
        options: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in (m.group(2) or "").split(","))):
            key, eq, val = (x.strip() for x in part.partition("="))
            if not eq or not key or not val:
                raise PolicySpecError(f"bad option {part!r} in policy {text!r}; write key=value")
            if key in options:  # one value would silently replace the other
                raise PolicySpecError(f"option {key} is given twice in policy {text!r} ({options[key]} and {val}); "
                                      "give it once")
            options[key] = _value(val)
        return cls(m.group(1), tuple(sorted(options.items())))

    @property
    def label(self) -> str:
        if not self.options:
            return self.name
        return f"{self.name}[{','.join(f'{k}={v}' for k, v in self.options)}]"

    @property
    def cls(self) -> type[ExpertCache]:
        return get_policy(self.name)

    @property
    def oracle(self) -> bool:
        """Reads the future (belady, sch, casmoe with its oracle predictors)."""
        return self.cls.reads_future(dict(self.options))

    def fitted_requests(self, trace: Any) -> set[int]:
        """Requests of `trace` that whatever this policy was fitted on saw (`casmoe.selection`)."""
        fit = self.check().fit
        return set() if fit is None else fit.fitted_requests(dict(self.options), trace)

    def bound(self, trace: Any) -> dict[str, Any]:
        """The options completed from `trace`, the whole trace of the run (`Fit.bind`)."""
        fit = self.check().fit
        return dict(self.options) if fit is None else fit.bind(dict(self.options), trace)

    def on_train(self, train: Any) -> PolicySpec | None:
        """This spec fitted on a train-half trace file (`Fit.on_train`); itself when it is
        fitted on nothing or is an oracle; None when it cannot be fitted on it."""
        fit = self.check().fit
        if fit is None or self.oracle:
            return self
        options = fit.on_train(dict(self.options), train)
        return None if options is None else PolicySpec(self.name, tuple(sorted(options.items())))

    def check(self) -> type[ExpertCache]:
        """The policy class, once its options are known to it and of the annotated type."""
        cls = self.cls
        accepted = policy_options(cls)
        for key, value in self.options:
            if key not in accepted:
                takes = ", ".join(f"{k} ({v})" if v else k for k, v in accepted.items()) or "no options"
                raise PolicySpecError(f"policy {self.name} has no option {key!r}; it takes {takes}")
            if not _matches(value, accepted[key]):
                raise PolicySpecError(f"policy {self.name}: option {key} must be {accepted[key]}, got {value!r}")
        return cls

    def create(self, geometry, capacity, *, source: Any = None, **runtime: Any) -> ExpertCache:
        """The cache this spec names; `runtime` carries `trace`, `miss_mode`, `expert_bytes`;
        `source`, the whole trace the run's requests were selected from, completes the options."""
        options = dict(self.options) if source is None else self.bound(source)
        return self.check().create(geometry, capacity, **runtime, **options)


def variants(name: str, planner: str | None = None) -> list[PolicySpec]:
    """What a bare policy name runs: one spec per variant the policy declares (CasMoE's
    planner and its oracle brackets); `planner` (a fitted folder) replaces `planner=auto`."""
    out = []
    for options in get_policy(name).variants:
        if planner is not None and options.get("planner") == AUTO:
            options = {**options, "planner": planner}
        out.append(PolicySpec(name, tuple(sorted(options.items()))))
    return out


def default_policies(names: Iterable[str], planner: str | None = None) -> list[PolicySpec]:
    """Every variant of every named policy (`variants`)."""
    return [spec for name in names for spec in variants(name, planner)]


def parse_policies(texts: Iterable[str | PolicySpec] | None, registered: Iterable[str], planner: str | None = None) -> list[PolicySpec]:
    """The CLI's repeatable `--policy`: nothing or `all` means every registered policy; a bare
    name runs its variants (`casmoe`: the planner and the two oracle brackets)."""
    texts = list(texts or [])
    if not texts or texts == ["all"]:
        return default_policies(registered, planner)
    specs = []
    for t in texts:
        spec = t if isinstance(t, PolicySpec) else PolicySpec.parse(t)
        specs += variants(spec.name, planner) if not spec.options and spec.name in POLICIES else [spec]
    for s in specs:
        s.check()  # an unknown name or option fails here, before any work
    return list(dict.fromkeys(specs))



def parse_policy(text: str) -> PolicySpec:
    """One `--policy` as written, its name known and its options ones it takes."""
    spec = PolicySpec.parse(text)
    if spec.name in POLICIES:  # a user's `pkg.mod:Class` is imported when the runs are built
        spec.check()
    return spec

"""Which requests of a trace a run scores: a split, tasks, a range, the first N; and the rule
that keeps fitted policies off the requests they were fitted on.

A policy that carries something fitted on a trace (a planner's fit, a static profile) declares
which of its requests it saw (`ExpertCache.fitted_requests`). Scoring it on those requests
reads the answers, like an oracle. So `split="auto"` (the default of replay, simulate and
sweep) scores every request unless a policy was fitted on some of them, and then only the
requests none of the policies saw (all of them, if none is left: a trace too short to hold any
out); an explicit `--split` is obeyed; a policy that saw some of the requests it is scored on
is starred beside the oracles.

The held-out rule is the planner's (`casmoe.planner.planner.heldout_split`): the trace's
`meta["splits"]` labels when it has them, else every fifth request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

from casmoe.errors import CasmoeError

if TYPE_CHECKING:
    from casmoe.policies.spec import PolicySpec
    from casmoe.trace import Trace

SPLITS = ("auto", "heldout", "train", "all")
HOLDOUT_EVERY = 5
"""Every fifth request is held out when the trace has no split labels (the planner's default)."""


class SelectionError(CasmoeError, ValueError):
    """A request selection that names nothing, or nothing a fair comparison may score."""


def split_indices(trace: Trace, split: str) -> list[int]:
    """Indices of the "train", "heldout" or "all" requests of `trace`."""
    from casmoe.planner.planner import heldout_split

    if split == "all":
        return list(range(len(trace.requests)))
    train, heldout = heldout_split(trace, HOLDOUT_EVERY)
    return heldout if split == "heldout" else train


@dataclass(frozen=True)
class Selection:
    """As the user wrote it: `split` (auto, heldout, train, all), `tasks` (empty: any), `span`
    ("a:b", Python slice bounds over request indices; "": all) and `limit` (the first N of what
    is left; 0: all)."""

    split: str = "auto"
    tasks: tuple[str, ...] = ()
    span: str = ""
    limit: int = 0

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise SelectionError(f"unknown --split {self.split!r}; one of {', '.join(SPLITS)}")
        if not isinstance(self.limit, int) or isinstance(self.limit, bool) or self.limit < 0:
            raise SelectionError(f"--requests must be a whole number >= 0 (0: all), got {self.limit!r}")
        self._bounds()

    @classmethod
    def of(cls, split: str | None = None, tasks: Iterable[str] | None = None, span: str | None = None,
           limit: int | None = 0) -> Selection:
        return cls((split or "auto").strip().lower(), tuple(tasks or ()), (span or "").strip(), limit or 0)

    def _bounds(self) -> tuple[int | None, int | None]:
        if not self.span:
            return None, None
        m = re.fullmatch(r"(-?\d*):(-?\d*)", self.span)
        if not m:
            raise SelectionError(f"bad --range {self.span!r}; write START:STOP (request indices, e.g. 0:100 or 100:)")
        return tuple(int(x) if x else None for x in m.groups())  # type: ignore[return-value]

    def resolve(self, trace: Trace, policies: Sequence[PolicySpec] = ()) -> Scored:
        """The requests to score and, in words, why; see the module docstring."""
        n = len(trace.requests)
        start, stop = self._bounds()
        pool = range(n)[slice(start, stop)]
        if self.tasks:
            known = {r.task for r in trace.requests}
            missing = [t for t in self.tasks if t not in known]
            if missing:
                names = ", ".join(sorted(str(t) for t in known if t is not None)) or "none"
                raise SelectionError(f"no request of task {missing[0]!r} in the trace (its tasks: {names})")
            wanted = set(self.tasks)
            pool = [i for i in pool if trace.requests[i].task in wanted]
        fitted = {spec.label: spec.fitted_requests(trace) for spec in policies}
        fitted = {label: seen for label, seen in fitted.items() if seen}
        split = self.split
        if split == "auto":
            seen = set().union(*fitted.values())
            chosen = [i for i in pool if i not in seen]
            why = f"the requests {', '.join(fitted)} never saw" if fitted else ""
            if fitted and not chosen:  # nothing unseen to score: score them all, the fitted starred
                chosen, why = list(pool), ""
        else:
            in_split = set(split_indices(trace, split))
            chosen = [i for i in pool if i in in_split]
            why = f"the {split} split" if split != "all" else ""
        if self.limit and len(chosen) > self.limit:
            chosen = chosen[: self.limit]
            why = f"the first {self.limit} of " + (why or "the trace")
        if not chosen:
            raise SelectionError(f"the selection (--split {split}{self._extra()}) leaves no request of the trace's {n}")
        starred = tuple(label for label, seen in fitted.items() if not seen.isdisjoint(chosen))
        return Scored(tuple(chosen), n, why, starred)

    def _extra(self) -> str:
        return (f", --task {','.join(self.tasks)}" if self.tasks else "") + (f", --range {self.span}" if self.span else "")


@dataclass(frozen=True)
class Scored:
    """The requests a run scores (indices into the trace), of `total`; `why` says how they were
    chosen ("" for all of them); `starred` lists policies fitted on some of them."""

    indices: tuple[int, ...]
    total: int
    why: str
    starred: tuple[str, ...] = ()

    @property
    def everything(self) -> bool:
        return len(self.indices) == self.total

    def describe(self) -> str:
        """'12 of 800 requests (the first 12 of the heldout split)', or '800 requests'."""
        if self.everything:
            return f"{self.total} requests"
        return f"{len(self.indices)} of {self.total} requests" + (f" ({self.why})" if self.why else "")

    def pick(self, trace: Trace) -> Trace:
        return trace if self.everything else trace.subset(self.indices)

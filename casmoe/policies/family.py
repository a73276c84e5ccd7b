"""The family of a policy, read off the class's own hooks and flags, and its line for a newcomer.

Twenty policies in one table or one plot read as a wall; four families read as a choice:

- **oracle**: reads the future (`needs_future`), or was fitted on the requests it is scored on
  (a record's `oracle`): a bound to compare with, not a deployment;
- **host compute**: may compute experts on the host (`computes_on_host`: a placement, a
  per-step CPU-or-copy choice, or the cpu miss mode of the run);
- **prefetcher**: loads experts before they are routed (overrides `prefetch_request` or
  `prefetch_layer`);
- **reactive cache**: loads a routed expert when it misses and evicts by a rule.

The baseline a method is held to is the best *plain* reactive cache: one fitted on nothing that
keeps what it loads (LRU, LFU, SpecMD's least-stale; not on-demand loading, which keeps nothing
and which nobody deploys, nor a profile-pinned cache).

Tables and plots know policies by label (`casmoe[predictor=exact]`); a label is looked up in
the registry, and a user's `package.module:Class` imported as the run imported it. A label
whose class cannot be found (a results file read elsewhere) is `OTHER`.
"""

from __future__ import annotations

import enum
from typing import Any

from casmoe.cache import ExpertCache, MissMode
from casmoe.policies.registry import PolicyNotFound, get_policy
from casmoe.policies.spec import PolicySpec, PolicySpecError


class Family(enum.Enum):
    """In the order tables list them and plots lay their panels out."""

    REACTIVE = "reactive caches"
    PREFETCH = "prefetchers"
    HOST = "host-compute placements"
    ORACLE = "oracles"
    OTHER = "other policies"

    @property
    def means(self) -> str:
        """What the family does, in a few words (table sections, panel titles)."""
        return _MEANS[self]


_MEANS = {
    Family.REACTIVE: "load a routed expert when it misses, evict by a rule",
    Family.PREFETCH: "also load experts before they are routed",
    Family.HOST: "the CPU computes the experts the GPUs do not hold",
    Family.ORACLE: "read the future or the scored requests: bounds, not deployable",
    Family.OTHER: "policies whose class this process cannot import",
}


def policy_class(label: str) -> type[ExpertCache] | None:
    """The class of a policy label (`casmoe[predictor=exact]*`, `pkg.mod:Mine`), or None."""
    try:
        return get_policy(PolicySpec.parse(label.rstrip("*")).name)
    except (PolicyNotFound, PolicySpecError):
        return None


def family_of(cls: type[ExpertCache], oracle: bool = False, miss_mode: MissMode = MissMode.LOAD) -> Family:
    """The family of a class as run: `oracle` when the run reads the future or the scored
    requests, `miss_mode` the run's (the cpu mode makes any policy compute on the host)."""
    if oracle or cls.needs_future:
        return Family.ORACLE
    if cls.computes_on_host(miss_mode):
        return Family.HOST
    if (cls.prefetch_request is not ExpertCache.prefetch_request
            or cls.prefetch_layer is not ExpertCache.prefetch_layer):
        return Family.PREFETCH
    return Family.REACTIVE


def record_family(record: dict[str, Any]) -> Family:
    """The family of a run's record (its `policy`, `oracle` and `miss_mode` fields)."""
    cls = policy_class(record["policy"])
    if cls is None:
        return Family.ORACLE if record.get("oracle") else Family.OTHER
    return family_of(cls, bool(record.get("oracle")), MissMode(record.get("miss_mode") or "load"))


def plain_cache(record: dict[str, Any]) -> bool:
    """A plain reactive cache (fitted on nothing, keeps what it loads): the baseline's kind."""
    cls = policy_class(record["policy"])
    return (cls is not None and record_family(record) is Family.REACTIVE and cls.fit is None
            and cls.keeps_experts)


def describe(label: str) -> str:
    """The label's line in a legend: its variant's note when an option has one
    (`casmoe[predictor=exact]`), else the class's summary, else ''."""
    cls = policy_class(label)
    if cls is None:
        return ""
    options = PolicySpec.parse(label.rstrip("*")).options
    for key, value in options:
        note = cls.variant_notes.get(f"{key}={value}") or cls.variant_notes.get(key)
        if note:
            return note
    return cls.summary

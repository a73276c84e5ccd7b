"""How a policy is fitted, declared by the policy: `fit = TraceFit("profile")`, `fit = PlannerFit()`.

A policy that carries something fitted on routing (static's and ktransformers' popularity
profiles, moe-infinity's seed collection, CasMoE's planner) must never be scored on the
requests it was fitted on: that reads the answers, like an oracle. Its `Fit` says three things:

- `fitted_requests(options, trace)`: which requests of `trace` what it was fitted on saw
  (`casmoe.selection` keeps them out of the scored ones, or stars the policy);
- `bind(options, trace)`: the options completed from the whole trace of a run, when none was
  given: fitted on its train split, never on the scored requests;
- `on_train(options, train)`: the options that fit it on a train-half trace file (the
  leaderboard's workloads).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from casmoe.cache import CacheConfigError
from casmoe.planner.cached import AUTO, cached_planner
from casmoe.planner.config import PlannerConfig
from casmoe.planner.fitdata import prompt_digests
from casmoe.planner.planner import fit_split, read_fit_data
from casmoe.profile import load_profile
from casmoe.selection import split_indices
from casmoe.trace import Trace, TraceError
from casmoe.trace_io import load_trace


class Fit:
    """A policy fitted on nothing (the base: every rule is the identity)."""

    option: str = ""

    def fitted_requests(self, options: dict[str, Any], trace: Trace) -> set[int]:
        return set()

    def bind(self, options: dict[str, Any], trace: Trace) -> dict[str, Any]:
        return options

    def on_train(self, options: dict[str, Any], train: Path) -> dict[str, Any] | None:
        """None: this variant cannot be fitted on `train` (then it is left out)."""
        return {**options, self.option: str(train)}


@dataclass(frozen=True)
class TraceFit(Fit):
    """Fitted on routing given as option `option`: a trace (object or file) or, where the
    policy takes one, a counts-only profile file (`casmoe popularity import`)."""

    option: str = "profile"

    def fitted_requests(self, options: dict[str, Any], trace: Trace) -> set[int]:
        """Without the option: the trace's train split (`bind` fits on it). With a trace: the
        requests of `trace` it holds (the same routing). With a counts-only profile: every
        request if it counts exactly this trace's routing (nothing finer can be told)."""
        given = options.get(self.option)
        if given is None:
            return set(split_indices(trace, "train"))
        source = as_trace(given)
        if source is not None:
            held = {_routing_digest(r) for r in source.requests}
            return {i for i, r in enumerate(trace.requests) if _routing_digest(r) in held}
        counts = profile_counts(given)
        if counts.shape == (trace.geometry.layers, trace.geometry.experts) and np.array_equal(counts, trace.popularity()):
            return set(range(len(trace.requests)))
        return set()

    def bind(self, options: dict[str, Any], trace: Trace) -> dict[str, Any]:
        """Nothing given: the trace's train split, never the scored requests."""
        if options.get(self.option) is not None:
            return options

        return {**options, self.option: trace.subset(split_indices(trace, "train"))}


class PlannerFit(Fit):
    """CasMoE's planner: `planner=DIR` a fitted folder (its stored fit data says which prompts
    it saw), `planner=auto` the one fitted on the run trace's train split (`casmoe.planner.cached`)."""

    option = "planner"

    def fitted_requests(self, options: dict[str, Any], trace: Trace) -> set[int]:
        folder = options.get("planner")
        if folder is None:
            return set()
        if folder == AUTO:
            return set(fit_split(trace, PlannerConfig()))

        fit = read_fit_data(folder)
        if fit is None:
            return set()
        seen = np.isin(prompt_digests([r.prompt for r in trace.requests]), fit.prompts)
        return {int(i) for i in np.flatnonzero(seen)}

    def bind(self, options: dict[str, Any], trace: Trace) -> dict[str, Any]:
        """`planner=auto`: the planner fitted on `trace`'s train split, from the user cache or
        fitted now."""
        if options.get("planner") != AUTO:
            return options
        fitted = cached_planner(trace)
        if fitted is None:
            raise CacheConfigError("casmoe[planner=auto] fits a planner on the trace's prompts, and this trace has none")
        return {**options, "planner": str(fitted.folder)}

    def on_train(self, options: dict[str, Any], train: Path) -> dict[str, Any] | None:
        """The planner variant fitted on the train trace (from the user cache, or now); the
        oracle predictors are fitted on nothing and stay as they are."""
        if "planner" not in options:
            return options

        fitted = cached_planner(load_trace(train))
        return None if fitted is None else {**options, "planner": str(fitted.folder)}


def profile_counts(profile: Trace | str | os.PathLike[str]) -> np.ndarray:
    """[L, E] routed counts of a profile: a Trace, a trace file or a `casmoe popularity import` file."""
    if isinstance(profile, Trace):
        return profile.popularity()
    if not isinstance(profile, (str, os.PathLike)):  # static[profile=0]: a number, not a file
        raise CacheConfigError(f"a profile must be a file (a profile or a trace), not {profile!r}")

    return load_profile(os.fspath(profile))


def as_trace(profile: Any) -> Trace | None:
    """The profile as a trace (a Trace or a trace file), or None for a counts-only profile file."""
    if isinstance(profile, Trace):
        return profile

    try:
        return load_trace(os.fspath(profile))
    except TraceError:
        return None


def _routing_digest(request: Any) -> bytes:
    """A request's routing and prompt length: equal requests of two files match."""
    return hashlib.blake2b(np.ascontiguousarray(request.topk).tobytes() + str(request.prefill).encode(),
                           digest_size=16).digest()

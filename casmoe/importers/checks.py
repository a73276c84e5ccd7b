"""Checks every importer applies to what a foreign file declares and what the user asserts.

A foreign file may be damaged or written by a tool with its own ideas; the user's flags
(`--num-experts`, `--top-k`, `--model`) are claims about the same data. Either disagreeing is
an error named in one line, never a silently wrong geometry.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from casmoe.geometry import Geometry
from casmoe.trace import Trace, TraceError


def exact_int(value: Any, what: str, text: bool = False) -> int:
    """An integer written as one (16, or "16" in a `text` header), never a float, a boolean or a
    JSON string that happens to convert."""
    if text and isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"{what} must be an integer, got {value!r}")


def positive_option(value: int | None, flag: str) -> None:
    """`--top-k 0` and friends: refused before any file is read."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise TraceError(f"{flag} must be an integer >= 1, got {value!r}")


def unique_pairs(pairs: list[tuple[str, Any]], where: str) -> dict[str, Any]:
    """A JSON object's members, refusing a key given twice (json's default keeps the last)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise TraceError(f"{where}: key {key!r} is given twice in one JSON object; keep one")
        out[key] = value
    return out


def agree(trace: Trace, where: str, *, num_experts: int | None = None, top_k: int | None = None,
          model: Geometry | None = None) -> Trace:
    """`trace` if its geometry agrees with what the user declared, else one line naming both.

    With `model` (a preset's geometry) the trace takes the model's sizes (bytes per expert,
    shared experts), which engine dumps do not carry. Where a reader inferred the expert count
    from the ids seen (`meta["experts_inferred"]`: the largest id + 1), that count is a lower
    bound, not a fact: an expert nobody was routed to is still the model's, so a claim of more
    experts is taken (the trace widened to it), and only a claim of fewer is refused."""
    g = trace.geometry
    said_e = num_experts if num_experts is not None else (model.experts if model is not None else None)
    if trace.meta.get("experts_inferred") and said_e is not None and said_e > g.experts:
        trace = Trace(replace(g, experts=said_e), trace.requests,
                      {**trace.meta, "experts_inferred": False, "experts_seen": g.experts})
        g = trace.geometry
    claims = [("--num-experts", num_experts, g.experts, "experts"), ("--top-k", top_k, g.top_k, "top_k")]
    if model is not None:
        claims += [("--model", model.layers, g.layers, "MoE layers"), ("--model", model.experts, g.experts, "experts"),
                   ("--model", model.top_k, g.top_k, "top_k")]
    for flag, said, found, what in claims:
        if said is not None and said != found:
            raise TraceError(f"{where}: {flag} says {what} = {said}, the data has {found}; fix the flag or the file")
    if not trace.requests:
        raise TraceError(f"{where}: no requests in the data; nothing to import")
    if model is not None and model != g:
        trace = Trace(replace(model, layer_expert_bytes=g.layer_expert_bytes or model.layer_expert_bytes),
                      trace.requests, trace.meta)
    return trace

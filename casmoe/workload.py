"""How realistic a trace's routing is: the statistics `casmoe trace stats` prints, and the band
that real models' routing spans.

Every conclusion about caching depends on the routing replayed, so a trace's realism is measured,
per MoE layer and model-wide, with the statistics the field uses:

- `distinct32` experts a request's first 32 decode tokens use at a layer (fewer tokens if the
  request decodes fewer), `distinct32_frac` = that / E, and `distinct32_norm` =
  (d - k) / (min(E, n k) - k): 0 when every token reuses the first token's experts, 1 when no
  expert repeats, so shapes compare;
- `exact_reuse`: share of consecutive decode-token pairs whose expert *set* at the layer is
  identical; `kept_share`: share of the previous token's k experts the next one uses again;
- locality against two baselines that keep everything but the order: `kept_shuffled`, the
  expected kept share if each request's decode tokens came in random order (closed form: a
  random pair of distinct tokens of the request shares sum_e c_e (c_e - 1) / (n (n - 1)) experts,
  c_e the request's count of expert e over its n tokens), and `kept_popularity`, the kept share of
  tokens routed independently with the trace's per-layer popularity (sum_e q_e^2 / k, q_e the
  share of decode tokens that route e: exact for any independent draw with those marginals);
  `lift_shuffled` and `lift_popularity` are kept_share over each. The real 128-expert routers'
  lifts are 1.41-1.58 and 1.27-1.54 (one request each, so their popularity baseline is the
  request's own mix drawn with replacement, which pairs a token with itself and reads lower
  than a shuffle): consecutive tokens reuse experts more than the request's own mix explains. `exact_random` is exact-set reuse between two random decode tokens of the trace at
  the layer (random routing drawn from the trace's own per-layer set popularity) and
  `exact_lift` = exact_reuse / exact_random: exact-set reuse against its own random baseline,
  which for 2 of 8 experts is at least 1/28 and for 6 of 128 near nothing;
- `hot_load`: the hottest expert's share of the whole trace's decode accesses at the layer over
  its fair share 1/E (1: perfectly balanced); model level the worst layer (global balance);
- popularity skew within a request (its decode tokens): `topk_share`, the share of accesses on
  the request's k hottest experts, and `gini`, the Gini coefficient of the E access counts;
  `trace_topk_share` / `trace_gini` are the same over the whole trace's decode tokens (they also
  grow with how differently requests route, so they have no band: the real traces are single
  requests);
- `lru@m` / `belady@m`: hit rates of the registered `lru` and `belady` policies replayed by
  `casmoe.replay` (as `casmoe replay` does: one cache for the whole trace, prefill one step) at
  round(m k) slots per layer, m in 1, 1.5, 2, 4;
- `srp16`: SRP at m = 16 over all tokens (`casmoe lrc --m 16`'s figure).

Model-level values average the per-layer ones, except the hit rates (pooled over layers: the
replay's own total), SRP (pooled histograms, as `casmoe lrc`), the lifts (model-level value
over model-level baseline) and `hot_load` (the worst layer). Token-layers a recording
engine skipped (`NOT_COMPUTED`) are left out of every statistic.

The realism band of each statistic is [min, max] over real traces of the trace's own shape
(`REFERENCES`, `band_for`): the three 128-expert traces shipped in `traces/real/`
(Qwen3-30B-A3B, gemma-4-26B-A4B, gpt-oss-120b) for many-expert models, the GRIN-MoE and
Jamba-Mini 16-expert masks for 8-32-expert models, computed from them here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Callable, Sequence

import numpy as np

from casmoe.cache import Capacity
from casmoe.compiled import COMPILE_WORTH
from casmoe.errors import CasmoeError
from casmoe.importers import read_specs
from casmoe.metrics.srp import segment_stats, srp_from_hist
from casmoe.metrics.tokens import TokenSelection, sequences
from casmoe.policies import get_policy
from casmoe.replay import replay
from casmoe.shipped import shipped
from casmoe.step_arrays import StepArrays
from casmoe.trace import Request, Trace, expert_counts

WINDOW = 32
"""Decode tokens whose distinct experts `distinct32` counts."""
SLOT_MULTIPLES = (1.0, 1.5, 2.0, 4.0)
"""Per-layer cache sizes of the replayed hit rates, in multiples of k."""
SRP_M = 16
REAL_TRACES = ("qwen.route.csv", "gemma.route.csv", "gptoss.route.csv")
"""The real traces under `traces/real/` whose spread defines the realism band."""


def _mult(m: float) -> str:
    return f"{m:g}k"


STATS: tuple[str, ...] = (
    "distinct32",
    "distinct32_frac",
    "distinct32_norm",
    "exact_reuse",
    "exact_random",
    "exact_lift",
    "kept_share",
    "kept_shuffled",
    "kept_popularity",
    "lift_shuffled",
    "lift_popularity",
    "hot_load",
    "topk_share",
    "gini",
    "trace_topk_share",
    "trace_gini",
    *(f"lru@{_mult(m)}" for m in SLOT_MULTIPLES),
    *(f"belady@{_mult(m)}" for m in SLOT_MULTIPLES),
    f"srp{SRP_M}",
)
NO_BAND = frozenset({"distinct32", "trace_topk_share", "trace_gini", "exact_random", "kept_shuffled",
                     "kept_popularity", "hot_load"})
"""Statistics that do not compare across shapes or request counts (or are baselines, or a
training property the single-request real traces cannot show): reported, never banded."""
RATIOS = {"exact_lift": ("exact_reuse", "exact_random"), "lift_shuffled": ("kept_share", "kept_shuffled"),
          "lift_popularity": ("kept_share", "kept_popularity")}
"""Each lift and its (value, baseline): per layer and model-wide the one over the other."""


class WorkloadError(CasmoeError, ValueError):
    """A trace these statistics cannot be measured on (no decode tokens, ...)."""


def slots_for(multiple: float, k: int) -> int:
    """Per-layer slots at `multiple` x k, rounded half up (1.5 x 1 = 2)."""
    return int(np.floor(multiple * k + 0.5))


def gini(counts: np.ndarray) -> np.ndarray:
    """Gini coefficient over the last axis (0: uniform, 1 - 1/E: one expert takes all; NaN if empty)."""
    x = np.sort(np.asarray(counts, dtype=np.float64), axis=-1)
    n = x.shape[-1]
    total = x.sum(axis=-1)
    ranks = np.arange(1, n + 1, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        g = 2.0 * (x * ranks).sum(axis=-1) / (n * total) - (n + 1.0) / n
    return np.where(total > 0, g, np.nan)


def topk_share(counts: np.ndarray, k: int) -> np.ndarray:
    """Share of the accesses (last axis) that fall on the k most used experts (NaN if empty)."""
    x = np.sort(np.asarray(counts, dtype=np.float64), axis=-1)
    total = x.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, x[..., -k:].sum(axis=-1) / total, np.nan)


@dataclass
class _Sums:
    """Running per-layer numerators and denominators over requests."""

    L: int
    num: dict[str, np.ndarray] = field(default_factory=dict)
    den: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, name: str, values: np.ndarray, weight: np.ndarray) -> None:
        """Add per-layer `values` (summed already) with their `weight` (count of items)."""
        self.num.setdefault(name, np.zeros(self.L))
        self.den.setdefault(name, np.zeros(self.L))
        self.num[name] += values
        self.den[name] += weight

    def mean(self, name: str) -> np.ndarray:
        num, den = self.num.get(name, np.zeros(self.L)), self.den.get(name, np.zeros(self.L))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, num / np.maximum(den, 1e-300), np.nan)


def token_stats(trace: Trace) -> dict[str, np.ndarray]:
    """Per-layer values [L] of every statistic that reads decode tokens only."""
    g = trace.geometry
    L, E, k = g.layers, g.experts, g.top_k
    sums = _Sums(L)
    total = np.zeros((L, E), dtype=np.int64)
    sets: list[np.ndarray] = []  # each request's sorted decode expert sets [T, L, k]
    for r in trace.requests:
        dec = r.topk[r.prefill :].astype(np.int64)  # [T, L, k]
        if len(dec) == 0:
            continue
        live = dec[:, :, 0] >= 0  # [T, L]
        counts = expert_counts(dec, E)  # [L, E]
        total += counts
        sets.append(np.sort(dec, axis=2))
        has = counts.sum(axis=1) > 0
        sums.add("topk_share", np.nan_to_num(topk_share(counts, k)), has)
        sums.add("gini", np.nan_to_num(gini(counts)), has)
        _window_stats(dec[:WINDOW], live[:WINDOW], E, k, sums)
        if len(dec) > 1:
            pair = live[1:] & live[:-1]  # [T-1, L]
            srt = np.sort(dec, axis=2)
            same = (srt[1:] == srt[:-1]).all(axis=2)
            kept = (dec[1:, :, :, None] == dec[:-1, :, None, :]).any(axis=3).sum(axis=2) / k
            sums.add("exact_reuse", (same & pair).sum(axis=0), pair.sum(axis=0))
            sums.add("kept_share", np.where(pair, kept, 0).sum(axis=0), pair.sum(axis=0))
            n = live.sum(axis=0).astype(np.float64)  # [L]
            with np.errstate(invalid="ignore", divide="ignore"):
                shuffled = (counts * (counts - 1.0)).sum(axis=1) / (k * n * (n - 1))  # [L]
            sums.add("kept_shuffled", np.where(n >= 2, shuffled, 0) * pair.sum(axis=0), pair.sum(axis=0))
    if not total.any():
        raise WorkloadError("the trace has no decode tokens: its routing statistics are undefined")
    out = {name: sums.mean(name) for name in ("distinct32", "distinct32_frac", "distinct32_norm", "exact_reuse", "kept_share", "kept_shuffled", "topk_share", "gini")}
    tokens = total.sum(axis=1) / k  # [L] live decode tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        q = total / tokens[:, None]  # [L, E] share of tokens routing each expert
        out["kept_popularity"] = np.where(tokens > 0, (q**2).sum(axis=1) / k, np.nan)
        out["hot_load"] = total.max(axis=1) * E / total.sum(axis=1)
    out["exact_random"] = set_collision(np.concatenate(sets))
    out["trace_topk_share"] = topk_share(total, k)
    out["trace_gini"] = gini(total)
    for name, (value, base) in RATIOS.items():
        with np.errstate(invalid="ignore", divide="ignore"):
            out[name] = out[value] / out[base]
    return out


def set_collision(sets: np.ndarray) -> np.ndarray:
    """Per layer [L], the chance that two distinct tokens of `sets[N, L, k]` (sorted expert ids,
    NOT_COMPUTED rows skipped) route the same set: sum_S n_S (n_S - 1) / (N (N - 1))."""
    out = np.full(sets.shape[1], np.nan)
    for layer in range(sets.shape[1]):
        rows = sets[:, layer]
        rows = rows[rows[:, 0] >= 0]  # NOT_COMPUTED is negative and sorts first
        N = len(rows)
        if N >= 2:
            n = np.unique(rows, axis=0, return_counts=True)[1].astype(np.float64)
            out[layer] = (n * (n - 1)).sum() / (N * (N - 1.0))
    return out


def _window_stats(win: np.ndarray, live: np.ndarray, E: int, k: int, sums: _Sums) -> None:
    """Distinct experts of one request's first decode tokens `win[n, L, k]`, per layer."""
    n_live = live.sum(axis=0)  # [L] computed tokens in the window
    distinct = (expert_counts(win, E) > 0).sum(axis=1).astype(np.float64)  # [L]
    ok = n_live >= 2  # one token always uses exactly k: nothing to normalise
    span = np.minimum(E, n_live * k) - k
    norm = np.divide(distinct - k, span, out=np.zeros_like(distinct), where=ok & (span > 0))
    sums.add("distinct32", np.where(ok, distinct, 0), ok)
    sums.add("distinct32_frac", np.where(ok, distinct / E, 0), ok)
    sums.add("distinct32_norm", np.where(ok, norm, 0), ok & (span > 0))


def _srp(trace: Trace) -> tuple[np.ndarray, float]:
    """SRP at m = SRP_M over all tokens: per layer [L] and model level."""
    [st] = segment_stats(sequences(trace, TokenSelection.ALL), trace.geometry.experts, [SRP_M])
    hist = st.hist.sum(axis=0)  # [L, m+1]
    return srp_from_hist(hist, SRP_M).srp, float(srp_from_hist(hist.sum(axis=0), SRP_M).srp)


def model_level(layers: dict[str, np.ndarray]) -> dict[str, float]:
    """Model-level values of per-layer statistics: the mean over layers, the lifts as the
    model-level value over the model-level baseline, `hot_load` the worst layer."""
    model = {n: float(np.nanmean(v)) if np.isfinite(v).any() else float("nan") for n, v in layers.items()}
    for lift, (value, base) in RATIOS.items():
        if lift in model:
            model[lift] = model[value] / model[base] if model[base] > 0 else float("nan")
    if "hot_load" in model:
        model["hot_load"] = float(np.nanmax(layers["hot_load"]))
    return model


def replay_sample(trace: Trace, limit: int) -> Trace:
    """At most `limit` requests spread evenly over the trace (all of them when `limit` <= 0)."""
    n = len(trace.requests)
    if limit <= 0 or n <= limit:
        return trace
    idx = np.unique(np.linspace(0, n - 1, limit).round().astype(int))
    return trace.subset(idx.tolist())


def layer_trace(trace: Trace, layer: int) -> Trace:
    """The routing of one MoE layer as a one-layer trace.

    With a cache of per-layer pools, LRU's and Belady's decisions in one layer's pool depend on
    that layer's accesses alone, so replaying each layer on its own gives the per-layer split of
    the full replay's counters (tests check the sums)."""
    g = trace.geometry.layer_slice(range(layer, layer + 1))
    reqs = [Request(topk=r.topk[:, layer : layer + 1], weights=r.weights[:, layer : layer + 1], prefill=r.prefill) for r in trace.requests]
    return Trace(g, reqs)


def hit_rates(
    trace: Trace, policies: Sequence[str] = ("lru", "belady"), progress: Callable[[int], object] | None = None
) -> dict[str, tuple[np.ndarray, float]]:
    """`policy@mk` -> (per-layer hit rates [L], pooled hit rate), replayed layer by layer."""
    g = trace.geometry
    L, k = g.layers, g.top_k
    compiled = trace.tokens * L * k >= COMPILE_WORTH  # decided on the whole trace, as `replay` would
    hits = {f"{p}@{_mult(m)}": np.zeros(L) for p in policies for m in SLOT_MULTIPLES}
    accesses = np.zeros(L)
    for layer in range(L):
        sub = layer_trace(trace, layer)
        steps = None if compiled else sub.steps()
        arrays = StepArrays.from_trace(sub) if compiled else None
        for p in policies:
            cls = get_policy(p)
            for m in SLOT_MULTIPLES:
                C = slots_for(m, k)
                if C > g.experts:
                    hits[f"{p}@{_mult(m)}"][layer] = np.nan
                    continue
                cache = cls.create(sub.geometry, Capacity(C), trace=sub)
                st = replay(sub, cache, steps=steps, arrays=arrays, compiled=compiled).stats
                hits[f"{p}@{_mult(m)}"][layer] = st.hits + st.late_hits
                accesses[layer] = st.accesses
        if progress is not None:
            progress(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {name: (h / accesses, float(h.sum() / accesses.sum())) for name, h in hits.items()}


@dataclass(frozen=True)
class WorkloadStats:
    """Every statistic of one trace, per layer (`layers[name]`: [L]) and model-wide (`model[name]`)."""

    name: str
    geometry_text: str
    requests: int
    tokens: int
    replayed_requests: int
    layers: dict[str, np.ndarray]
    model: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "trace": self.name,
            "geometry": self.geometry_text,
            "requests": self.requests,
            "tokens": self.tokens,
            "replayed_requests": self.replayed_requests,
            "model": {n: _num(v) for n, v in self.model.items()},
            "layers": {n: [_num(x) for x in v] for n, v in self.layers.items()},
        }


def _num(x: Any) -> float | None:
    x = float(x)
    return None if np.isnan(x) else x


def measure(
    trace: Trace, name: str = "trace", replay_requests: int = 0, progress: Callable[[int], object] | None = None
) -> WorkloadStats:
    """All statistics of `trace`; the hit rates replay at most `replay_requests` requests (0: all).

    `progress` is called once per replayed layer (`trace.geometry.layers` calls)."""
    layers = token_stats(trace)
    sample = replay_sample(trace, replay_requests)
    model = model_level(layers)
    for stat, (per_layer, pooled) in hit_rates(sample, progress=progress).items():
        layers[stat], model[stat] = per_layer, pooled
    layers[f"srp{SRP_M}"], model[f"srp{SRP_M}"] = _srp(trace)
    return WorkloadStats(
        name, trace.geometry.describe(), len(trace.requests), trace.tokens, len(sample.requests),
        {n: layers[n] for n in STATS}, {n: model[n] for n in STATS},
    )


# ---- the realism band ------------------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """Real traces that judge the traces of one range of shapes (expert counts)."""

    shape: str
    traces: tuple[str, ...]  # files under traces/real/, PATH or PATH#KEY
    experts: int  # the reference traces' own expert count
    max_experts: int  # judges traces with at most this many experts (the first that fits)


REFERENCES = (
    Reference("16 experts", ("moe_lrc_case_traces.json#grin", "moe_lrc_case_traces.json#jamba"), 16, 32),
    Reference("128 experts", REAL_TRACES, 128, 1 << 30),
)
"""The shapes real routing is known at. Few experts: GRIN-MoE layer 21 and Jamba-Mini layer 25
(16 experts, top-2; 64-token masks printed by moe-lrc, arXiv 2505.16056). Beside them, the
published figures for Mixtral-8x7B (8 experts, top-2; "Mixtral of Experts", arXiv 2401.04088,
section 5, Table 5 and Figure 10): on The Pile's validation subsets, consecutive tokens get the
same first-choice expert close to the random rate (1/8 = 12.5%) at layer 0 and clearly more
often at layers 15 and 31, and share one of their two experts more often than random 2-of-8
routing does (1 - C(6,2)/C(8,2) = 46.4%). The paper's per-domain percentages could not be
retrieved on this machine, so they enter no band: the Mixtral evidence is the direction (lift
above 1 at middle and late layers), the band's numbers are GRIN's and Jamba's. Many experts: the
three 128-expert traces of `traces/real/`. Nothing real is shipped at 32-64 experts (tiny-olmoe's
64): such traces are judged against the 128-expert band, and the band says so (`Band.note`)."""


@dataclass(frozen=True)
class Band:
    """Per statistic, the [low, high] that the real traces span (model-level values)."""

    low: dict[str, float]
    high: dict[str, float]
    sources: tuple[str, ...]
    shape: str = "128 experts"
    note: str = ""  # set when the judged trace's shape has no reference of its own

    def verdict(self, stat: str, value: float) -> str:
        """'in', 'below' or 'above' the band; 'n/a' for unbanded statistics or undefined values."""
        if stat in NO_BAND or stat not in self.low or np.isnan(value):
            return "n/a"
        if value < self.low[stat] - 1e-12:
            return "below"
        if value > self.high[stat] + 1e-12:
            return "above"
        return "in"

    def describe(self, stat: str) -> str:
        if stat in NO_BAND or stat not in self.low:
            return "-"
        return f"{self.low[stat]:.3f}-{self.high[stat]:.3f}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "sources": list(self.sources),
            "note": self.note,
            "low": {n: v for n, v in self.low.items() if n not in NO_BAND},
            "high": {n: v for n, v in self.high.items() if n not in NO_BAND},
        }


def band_from(stats: Sequence[WorkloadStats], shape: str = "128 experts") -> Band:
    """[min, max] over `stats` of every model-level statistic that is defined on all of them."""
    low, high = {}, {}
    for name in STATS:
        vals = [s.model[name] for s in stats]
        if name in NO_BAND or any(np.isnan(v) for v in vals):
            continue
        low[name], high[name] = min(vals), max(vals)
    return Band(low, high, tuple(s.name for s in stats), shape)


def real_stats(reference: Reference = REFERENCES[-1]) -> list[WorkloadStats]:
    """The statistics of a reference's real traces (computed once per process)."""
    return list(_real_stats(reference))


@lru_cache(maxsize=None)
def _real_stats(reference: Reference) -> tuple[WorkloadStats, ...]:
    specs = [str(shipped(f"real/{t.partition('#')[0]}")) + (f"#{t.partition('#')[2]}" if "#" in t else "")
             for t in reference.traces]
    return tuple(measure(tr, name.split(".")[0]) for name, tr in read_specs(specs))


def realism_band() -> Band:
    """The band of the shipped 128-expert real traces (`traces/real/`)."""
    return band_for(REFERENCES[-1].experts)


def band_for(experts: int) -> Band:
    """The band that judges a trace of `experts` experts: its shape's reference (`REFERENCES`),
    with a note when that reference's real traces have a different expert count."""
    ref = next(r for r in REFERENCES if experts <= r.max_experts)
    band = band_from(real_stats(ref), ref.shape)
    if experts != ref.experts:
        band = replace(band, note=f"no real trace of {experts} experts: judged against {ref.shape}")
    return band


def comparison(stats: Sequence[WorkloadStats], bands: Sequence[Band | None]) -> list[dict[str, Any]]:
    """Display rows, one per statistic: each band used (one column per shape), then per trace
    its model-level value and where it falls in its own shape's band ('0.850 above')."""
    shapes = {b.shape: b for b in bands if b is not None}
    rows = []
    for name in STATS:
        row: dict[str, Any] = {"statistic": name}
        for shape, band in shapes.items():
            row[f"band ({shape})"] = band.describe(name)
        for s, band in zip(stats, bands):
            v = s.model[name]
            cell = "-" if np.isnan(v) else f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
            verdict = band.verdict(name, v) if band is not None else "n/a"
            row[s.name] = cell if verdict == "n/a" else f"{cell} {verdict}"
        rows.append(row)
    return rows


def long_records(stats: Sequence[WorkloadStats], bands: Sequence[Band | None]) -> list[dict[str, Any]]:
    """Long rows (trace, layer or 'model', statistic, value, band, verdict) for CSV and pandas;
    each trace judged against its own shape's band."""
    rows = []
    for s, band in zip(stats, bands):
        for name in STATS:
            levels = [("model", s.model[name])] + [(str(i), v) for i, v in enumerate(s.layers[name])]
            for level, value in levels:
                row: dict[str, Any] = {"trace": s.name, "layer": level, "statistic": name, "value": _num(value)}
                if band is not None:
                    row["band_shape"] = band.shape
                    banded = name in band.low
                    row["band_low"] = band.low[name] if banded else None
                    row["band_high"] = band.high[name] if banded else None
                    row["verdict"] = band.verdict(name, value) if level == "model" else None
                rows.append(row)
    return rows

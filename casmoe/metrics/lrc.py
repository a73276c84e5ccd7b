"""Local routing consistency of one trace: SRP and SCH with bootstrap intervals, and baselines.

One call, `measure`, computes everything `casmoe lrc` reports for a trace: per segment length
m, SRP (model level and per layer), the SCH curve over every cache size (model level: one
cache over L x E experts; per layer: E experts), and optionally the replayed hit rates of
baseline policies at chosen `rho = C / active experts`. Intervals are basic bootstrap over
sequences (requests). See `casmoe.metrics.srp` and `casmoe.metrics.sch` for the definitions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from casmoe.geometry import Geometry
from casmoe.metrics.baselines import replay_hit_rate, token_trace
from casmoe.metrics.bootstrap import basic_interval, bootstrap_weights
from casmoe.metrics.sch import lookahead_hits
from casmoe.metrics.srp import segment_stats, srp_from_hist
from casmoe.metrics.tokens import MetricsError, TokenSelection, sequences
from casmoe.trace import Trace

DEFAULT_MS = (4, 16, 64, 256)
DEFAULT_RHOS = (1.0, 2.0, 4.0)
DEFAULT_BASELINES = ("lru", "lfu", "belady")


@dataclass(frozen=True)
class Estimate:
    """A statistic with its basic-bootstrap interval (arrays of any common shape)."""

    value: np.ndarray
    lower: np.ndarray
    upper: np.ndarray

    def at(self, index: Any) -> dict[str, float | None]:
        return {"value": _num(self.value[index]), "lower": _num(self.lower[index]), "upper": _num(self.upper[index])}


@dataclass(frozen=True)
class SRPLevel:
    """SRP for one m: model level (scalars) and per layer (`[L]`)."""

    m: int
    model: Estimate
    layers: Estimate
    model_tau: int
    model_preds_per_active: float
    activation_rate: float
    layer_tau: np.ndarray
    layer_preds_per_active: np.ndarray


@dataclass(frozen=True)
class SCHLevel:
    """SCH for one m: `model` curve `[L*E]` (index C-1) and per-layer curves `[L, E]`."""

    m: int
    model: Estimate
    layers: Estimate
    pooled_layers: Estimate  # [E]: per-layer caches of C slots each, hits pooled over layers


@dataclass
class LRCResult:
    name: str
    geometry: Geometry
    requests: int
    tokens: int
    token_selection: str
    srp: dict[int, SRPLevel]
    sch: dict[int, SCHLevel]
    baselines: dict[str, dict[str, dict[float, float]]] = field(default_factory=dict)
    """policy -> 'model' | 'layer' -> rho -> warm hit rate (replayed)."""

    def slots(self, rho: float, level: str) -> int:
        """Cache size C for `rho` at 'model' (of L x k active) or 'layer' (of k) level."""
        g = self.geometry
        active = g.active_experts if level == "model" else g.top_k
        return int(round(rho * active))

    def sch_at(self, m: int, rho: float, level: str, layer: int | None = None) -> dict[str, float] | None:
        """SCH at `rho` (None when C is outside 1..items)."""
        g = self.geometry
        C = self.slots(rho, level)
        items = g.total_experts if level == "model" else g.experts
        if not 1 <= C <= items:
            return None
        s = self.sch[m]
        if level == "model":
            return s.model.at(C - 1)
        if layer is None:
            return s.pooled_layers.at(C - 1)
        return s.layers.at((layer, C - 1))

    def records(self, rhos: Sequence[float] = DEFAULT_RHOS) -> list[dict[str, Any]]:
        """Flat rows: per m, the model level then each layer (SRP and SCH at each rho)."""
        rows: list[dict[str, Any]] = []
        for m, srp in self.srp.items():
            levels: list[tuple[str, int | None]] = [("model", None)] + [(f"layer {i}", i) for i in range(self.geometry.layers)]
            for label, layer in levels:
                est = srp.model if layer is None else srp.layers
                idx: Any = () if layer is None else layer
                row: dict[str, Any] = {"trace": self.name, "m": m, "level": label}
                row.update({f"srp{k if k != 'value' else ''}": v for k, v in _suffix(est.at(idx)).items()})
                row["tau"] = srp.model_tau if layer is None else int(srp.layer_tau[layer])
                row["preds_per_active"] = _num(srp.model_preds_per_active if layer is None else srp.layer_preds_per_active[layer])
                for rho in rhos:
                    v = self.sch_at(m, rho, "model" if layer is None else "layer", layer)
                    for k2, x in _suffix(v or {"value": None, "lower": None, "upper": None}).items():
                        row[f"sch{k2}@{rho:g}"] = x
                rows.append(row)
        return rows

    def baseline_records(self) -> list[dict[str, Any]]:
        rows = []
        for policy, levels in self.baselines.items():
            for level, by_rho in levels.items():
                for rho, rate in by_rho.items():
                    row = {"trace": self.name, "policy": policy, "level": level, "rho": rho, "slots": self.slots(rho, level), "hit_rate": rate}
                    for m in self.sch:
                        v = self.sch_at(m, rho, level)
                        row[f"sch_m{m}"] = None if v is None else v["value"]
                    rows.append(row)
        return rows

    def to_dict(self) -> dict[str, Any]:
        g = self.geometry
        return {
            "trace": self.name,
            "geometry": g.to_dict(),
            "requests": self.requests,
            "tokens": self.tokens,
            "token_selection": self.token_selection,
            "srp": {
                str(m): {
                    "model": s.model.at(()),
                    "model_tau": s.model_tau,
                    "model_preds_per_active": _num(s.model_preds_per_active),
                    "activation_rate": _num(s.activation_rate),
                    "layers": _lists(s.layers),
                    "layer_tau": s.layer_tau.tolist(),
                    "layer_preds_per_active": [_num(x) for x in s.layer_preds_per_active],
                }
                for m, s in self.srp.items()
            },
            "sch": {
                str(m): {
                    "model_rho": (np.arange(1, g.total_experts + 1) / g.active_experts).tolist(),
                    "model": _lists(s.model),
                    "layer_rho": (np.arange(1, g.experts + 1) / g.top_k).tolist(),
                    "layers": _lists(s.layers),
                    "pooled_layers": _lists(s.pooled_layers),
                }
                for m, s in self.sch.items()
            },
            "baselines": {p: {lv: {f"{r:g}": v for r, v in d.items()} for lv, d in levels.items()} for p, levels in self.baselines.items()},
        }


def _num(x: Any) -> float | None:
    """A float for JSON and tables; None where the statistic is undefined (NaN)."""
    x = float(x)
    return None if np.isnan(x) else x


def _suffix(d: dict[str, Any]) -> dict[str, Any]:
    return {("" if k == "value" else f"_{k}"): v for k, v in d.items()}


def _lists(e: Estimate) -> dict[str, Any]:
    return {name: np.where(np.isnan(a), None, a).tolist() for name, a in (("value", e.value), ("lower", e.lower), ("upper", e.upper))}


def work_units(trace: Trace, ms: Sequence[int], rhos: Sequence[float], baselines: Sequence[str], tokens: TokenSelection = TokenSelection.ALL) -> int:
    """How many progress ticks `measure` reports: tokens walked by SCH, requests replayed."""
    seqs = sequences(trace, tokens)
    g = trace.geometry
    lane_tokens = len(seqs) * (1 + g.layers) * max(len(s) for s in seqs)  # model-level and per-layer lanes
    return len(ms) * lane_tokens + 2 * len(baselines) * len(rhos) * len(seqs)


def measure(
    trace: Trace,
    ms: Sequence[int] = DEFAULT_MS,
    *,
    name: str = "trace",
    tokens: TokenSelection = TokenSelection.ALL,
    replicates: int = 1000,
    confidence: float = 0.95,
    rng: np.random.Generator | None = None,
    baselines: Sequence[str] = (),
    rhos: Sequence[float] = DEFAULT_RHOS,
    progress: Callable[[int], object] | None = None,
) -> LRCResult:
    """SRP and SCH of `trace` for each m, intervals over its requests, and baseline replays."""
    if replicates < 1:
        raise MetricsError("replicates must be >= 1")
    if not 0 < confidence < 1:
        raise MetricsError(f"confidence must lie in (0, 1), got {confidence}")
    ms = [int(m) for m in ms]
    if not ms or min(ms) < 1:
        raise MetricsError(f"segment lengths m must be >= 1 (got {ms})")
    rng = np.random.default_rng(0) if rng is None else rng
    g = trace.geometry
    L, E, k = g.layers, g.experts, g.top_k
    seqs = sequences(trace, tokens)
    S = len(seqs)
    W = bootstrap_weights(S, replicates, rng)  # [B, S]

    srp: dict[int, SRPLevel] = {}
    for st in segment_stats(seqs, E, ms):
        m, hist = st.m, st.hist  # [S, L, m+1]
        model = srp_from_hist(hist.sum(axis=(0, 1)), m)
        layers = srp_from_hist(hist.sum(axis=0), m)
        boot_model = srp_from_hist(np.einsum("bs,sc->bc", W, hist.sum(axis=1)), m).srp
        boot_layers = srp_from_hist(np.einsum("bs,slc->blc", W, hist), m).srp
        srp[m] = SRPLevel(
            m,
            Estimate(model.srp, *basic_interval(model.srp, boot_model, confidence)),
            Estimate(layers.srp, *basic_interval(layers.srp, boot_layers, confidence)),
            int(model.tau),
            float(model.preds_per_active),
            float(model.activation_rate),
            layers.tau,
            layers.preds_per_active,
        )

    Tmax = max(len(s) for s in seqs)
    model_lanes = np.full((S, Tmax, L * k), -1, dtype=np.int64)  # lane = sequence, items = L x E
    per_layer = np.full((S * L, Tmax, k), -1, dtype=np.int64)  # lane = (sequence, layer)
    offsets = (np.arange(L) * E)[None, :, None]
    for i, s in enumerate(seqs):
        model_lanes[i, : len(s)] = np.where(s >= 0, s + offsets, -1).reshape(len(s), L * k)
        per_layer[i * L : (i + 1) * L, : len(s)] = s.transpose(1, 0, 2)
    sch: dict[int, SCHLevel] = {}
    for m in ms:
        model = lookahead_hits(model_lanes, L * E, m, progress)
        model_hits, model_req = model.hits, model.requests
        lane = lookahead_hits(per_layer, E, m, progress)
        lh = lane.hits.reshape(S, L, E)
        lr = lane.requests.reshape(S, L)
        model_rate = model_hits.sum(0) / max(model_req.sum(), 1)
        boot_model = (W @ model_hits) / np.maximum(W @ model_req, 1)[:, None]
        layer_rate = lh.sum(0) / np.maximum(lr.sum(0), 1)[:, None]
        boot_layers = np.einsum("bs,sle->ble", W, lh) / np.maximum(W @ lr, 1)[:, :, None]
        pooled = lh.sum(axis=(0, 1)) / max(lr.sum(), 1)
        boot_pooled = (W @ lh.sum(axis=1)) / np.maximum(W @ lr.sum(axis=1), 1)[:, None]
        sch[m] = SCHLevel(
            m,
            Estimate(model_rate, *basic_interval(model_rate, boot_model, confidence)),
            Estimate(layer_rate, *basic_interval(layer_rate, boot_layers, confidence)),
            Estimate(pooled, *basic_interval(pooled, boot_pooled, confidence)),
        )

    result = LRCResult(name, g, S, sum(len(s) for s in seqs), tokens.value, srp, sch)
    if baselines:
        replay_trace = token_trace(trace, seqs)
        for policy in baselines:
            levels: dict[str, dict[float, float]] = {"model": {}, "layer": {}}
            for level in ("model", "layer"):
                for rho in rhos:
                    C = result.slots(rho, level)
                    if not k <= C <= (g.total_experts if level == "model" else E):
                        if progress is not None:
                            progress(S)
                        continue  # a cache below k slots cannot serve one token's layer
                    levels[level][rho] = replay_hit_rate(replay_trace, policy, C, level == "layer", progress)
            result.baselines[policy] = levels
    return result

"""`SimResult`: what one simulated run measured, as a frozen value with `to_dict()`."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Sequence

import numpy as np

from casmoe.cache import CacheStats


def percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """Percentiles of `values` (0.0 each for an empty sequence, so results stay numeric)."""
    if not len(values):
        return [0.0] * len(qs)
    return [float(v) for v in np.percentile(np.asarray(values, dtype=np.float64), qs)]


@dataclass(frozen=True)
class SimResult:
    """Timing and counts of one run. Times in seconds; `capacity_gb` is the expert cache of
    all devices together in GB (1e9 bytes); `stall_by_layer_s` indexes MoE layers."""

    policy: str
    capacity: str
    capacity_slots: int
    capacity_gb: float
    hardware: str
    model: str
    trace: str
    batch: int
    miss_mode: str
    devices: int
    quant: str
    requests: int
    prefill_tokens: int
    decode_tokens: int
    sim_time_s: float
    compute_s: float
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    token_latency_mean_s: float
    token_latency_p50_s: float
    token_latency_p90_s: float
    token_latency_p99_s: float
    decode_tokens_per_s: float
    stall_demand_s: float
    stall_late_s: float
    stall_by_layer_s: tuple[float, ...]
    link_bytes: int
    cancelled_loads: int
    link_utilisation: tuple[float, ...]
    stats: CacheStats
    # serving: the traffic, and latencies per request (`latency.py` defines them)
    traffic: str = "back-to-back"
    max_batch: int = 1
    ttft_p90_s: float = 0.0
    tpot_mean_s: float = 0.0
    tpot_p50_s: float = 0.0
    tpot_p90_s: float = 0.0
    tpot_p99_s: float = 0.0
    e2e_mean_s: float = 0.0
    e2e_p50_s: float = 0.0
    e2e_p90_s: float = 0.0
    e2e_p99_s: float = 0.0
    queue_wait_mean_s: float = 0.0
    queue_wait_p99_s: float = 0.0
    requests_per_s: float = 0.0
    throughput_tokens_per_s: float = 0.0
    mean_batch: float = 0.0  # decode tokens per decode step
    peak_batch: int = 0  # most requests running at once
    queue_mean: float = 0.0
    queue_max: int = 0
    queue_length: tuple[tuple[float, int], ...] = ()
    compute_utilisation: tuple[float, ...] = ()
    # timeliness: per MoE layer, and the perfect-prefetch bound (`timeliness.py`)
    late_by_layer: tuple[int, ...] = ()
    wasted_by_layer: tuple[int, ...] = ()
    stall_bound_s: float = 0.0
    stall_bound_by_layer_s: tuple[float, ...] = ()  # per layer, at most that layer's own stall (casmoe/sim/passes/timeliness.py)
    stall_bound_by_device_s: tuple[float, ...] = ()  # each device's link alone; the largest is stall_bound_s
    # tiers: the host RAM tier over storage (`tiers.py`); 0 when all experts sit in RAM
    host_cache_gb: float = 0.0
    host_hits: int = 0
    host_misses: int = 0
    storage_bytes: int = 0
    host_storage_reads: int = 0  # of host_misses, experts computed on the host that were read from storage first
    stall_storage_s: float = 0.0
    setup_s: float = 0.0  # the start-up fill's time on the links, before the clock started (`ExpertCache.fills_at_start`)
    setup_bytes: int = 0  # and its bytes, not in `link_bytes`
    future_runs: int = 1  # runs an oracle needed until the step sequence it was given repeated

    @property
    def stall_s(self) -> float:
        return self.stall_demand_s + self.stall_late_s

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "stats":
                d.update(v.to_dict())
            else:
                d[f.name] = [list(x) if isinstance(x, tuple) else x for x in v] if isinstance(v, tuple) else v
        d["stall_s"] = self.stall_s
        return d

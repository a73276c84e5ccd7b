"""Local routing consistency metrics (SRP, SCH) of routing traces, as defined by "Not All
Models Suit Expert Offloading" (arXiv 2505.16056, code ljcleo/moe-lrc).

`measure(trace, ms)` computes everything `casmoe lrc` reports; `srp` and `sch` hold the
definitions (see their docstrings), `baselines` the replayed policies on the same axis.
"""

from casmoe.metrics.lrc import LRCResult, measure
from casmoe.metrics.sch import lookahead_hits
from casmoe.metrics.srp import segment_stats, srp_from_hist
from casmoe.metrics.tokens import MetricsError, TokenSelection

__all__ = ["LRCResult", "MetricsError", "TokenSelection", "lookahead_hits", "measure", "segment_stats", "srp_from_hist"]

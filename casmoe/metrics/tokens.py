"""Which token routings the metrics read.

moe-lrc (arXiv 2505.16056) feeds fixed-length text samples through the model and reads every
token's routing, so the metrics default to all tokens of a request (prompt tokens one by one,
not the runtime's prefill union); `decode` keeps only the generated tokens. A request is a
sequence: windows and lookahead never cross requests. `NOT_COMPUTED` token-layers stay as -1
rows and each metric says how it skips them.
"""

from __future__ import annotations

import enum

import numpy as np

from casmoe.errors import CasmoeError
from casmoe.trace import NOT_COMPUTED, Trace


class TokenSelection(enum.Enum):
    ALL = "all"
    DECODE = "decode"


class MetricsError(CasmoeError, ValueError):
    """Metric parameters a trace cannot satisfy (m < 1, no tokens, ...)."""


def sequences(trace: Trace, tokens: TokenSelection = TokenSelection.ALL) -> list[np.ndarray]:
    """Per request, its routing `[T, L, k]` as int64 expert ids (-1 rows for gaps)."""
    out = []
    for r in trace.requests:
        topk = r.topk if tokens is TokenSelection.ALL else r.topk[r.prefill :]
        out.append(np.where(topk == NOT_COMPUTED, -1, topk).astype(np.int64))
    if not any(len(s) for s in out):
        raise MetricsError(f"the trace has no {tokens.value} tokens to measure")
    return out

"""Writers of the engines' routing dumps (SGLang's per_token recorder, vLLM's buffer rows) with
known ground truth, shared by the importer suites; the examples' own writers (examples/engine-dumps)
do the byte formats."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from support.paths import REPO

EXAMPLES = REPO / "examples" / "engine-dumps"

sys.path.insert(0, str(EXAMPLES))
from make_examples import REQUESTS, sglang_record, to_physical, write_sglang, write_trtllm  # noqa: E402, F401  (for the suites)

sys.path.remove(str(EXAMPLES))

L_ALL, DENSE, E, K = 4, 0, 6, 2  # an engine's 4 decoder layers; layer 0 is dense, 1-3 are MoE
MOE = [1, 2, 3]


def routing(rng: np.random.Generator, tokens: int) -> np.ndarray:
    """Logical expert ids [tokens, MoE layers, K], distinct per token-layer."""
    return np.argsort(rng.random((tokens, len(MOE), E)), axis=2)[:, :, :K]


# ---- SGLang per_token dumps --------------------------------------------------------------------

# physical experts 0..7: a permutation of the 6 logical experts plus replicas of logical 0 and 3
PHYS_TO_LOG = np.array([[2, 0, 5, 1, 3, 4, 0, 3]] * L_ALL)


@dataclass
class SgReq:
    """A ground-truth request: prompt length, decoded count, and logical routing of every token
    the engine computes (prompt tokens from `cached` on, then each fed-back generated token)."""

    prompt: int
    decoded: int
    cached: int = 0
    rows: np.ndarray = field(default=None)
    ids: np.ndarray = field(default=None)


def sglang_dump(passes, reqs, rng, path, rank=0):
    """Write what SGLang's _DetailAccumulator dumps for `passes` of `reqs` (see make_examples)."""
    records = []
    for fid, (mode, segments) in enumerate(passes):
        batch = []
        for r, start, n in segments:  # request, first position, tokens
            req = reqs[r]
            t = np.arange(start, start + n) - req.cached
            rows = np.full((n, L_ALL, K), -1)
            rows[:, MOE] = req.rows[t]
            batch.append((start, to_physical(rows, PHYS_TO_LOG, rng), req.ids[t]))
        records.append(sglang_record(fid, mode, batch, L_ALL, rank))
    write_sglang(path, records, PHYS_TO_LOG)


def sglang_workload(rng):
    """Five requests over seven passes: two equal prompts decoding in lockstep (position ties),
    a chunked prefill inside a mixed pass, a prefix-cache hit, a request already decoding when
    the recording started, and an idle pass."""
    reqs = [SgReq(5, 4), SgReq(5, 3), SgReq(6, 2), SgReq(4, 2, cached=2), SgReq(0, 3, cached=9)]
    for r in reqs:  # request 4's first fed-back token sits at position 9
        n = r.prompt - r.cached + r.decoded if r.prompt else r.decoded
        r.rows = routing(rng, n)
        r.ids = rng.integers(0, 1000, n)
    passes = [
        ("extend", [(0, 0, 5), (1, 0, 5)]),
        ("decode", [(0, 5, 1), (1, 5, 1), (4, 9, 1)]),
        ("mixed", [(2, 0, 4), (0, 6, 1), (1, 6, 1), (4, 10, 1)]),  # a chunk of request 2's prompt
        ("idle", []),
        ("extend", [(2, 4, 2), (3, 2, 2)]),  # the rest of request 2's prompt; request 3 after its cached prefix
        ("decode", [(0, 7, 1), (1, 7, 1), (2, 6, 1), (3, 4, 1), (4, 11, 1)]),
        ("decode", [(0, 8, 1), (2, 7, 1), (3, 5, 1)]),
    ]
    return reqs, passes


def vllm_rows(rng, tokens: int, dtype=np.int16) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's buffer rows [tokens, all layers, K]: zeros in the dense layer; and the MoE part."""
    moe = routing(rng, tokens)
    rows = np.zeros((tokens, L_ALL, K), dtype=dtype)
    rows[:, MOE] = moe
    return rows, moe

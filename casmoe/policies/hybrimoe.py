"""HybriMoE (Zhong et al., arXiv 2504.05897, DAC 2025): a per-layer GPU cache evicting by a
decayed routing score ("Minus Recent Score", MRS), and in decode a two-ended greedy that splits
a layer's routed experts between the GPU and the CPU.

Read from the released code, PKU-SEC-Lab/HybriMoE @ 508a85b9, ktransformers/operators/experts.py
(casmoe/engines/ALGORITHMS.md, section 2; the abstract names "(i) a dynamic intra-layer
scheduling strategy to balance workloads across CPU and GPU, (ii) an impact-driven inter-layer
prefetching algorithm, and (iii) a score-based caching algorithm"):

- (iii) MRS (`KScoreAwareCache`, experts.py:662-713; modeling_deepseek.py:408, 429): at every
  gate call of layer l, `S[l,e] = alpha * s_e + (1 - alpha) * S[l,e]` for the top-p experts P of
  the router's scores s (p = 2 top_k), `S[l,e] = (1 - alpha) * S[l,e]` for the others,
  `alpha = 0.5`; a full layer evicts `argmin S[l,e]` of its cached experts (experts.py:957-966);
- (i) decode only, one token (`HSS`, experts.py:1136-1182): the layer's activated experts,
  cached ones then uncached ones, each group by token count descending; the GPU takes from the
  head, the CPU from the tail, whichever queue ends sooner: `t_gpu = 0.5` flat
  (model_gpu_time, :1193-1197), `t_cpu = 1 * n` plus `0.79` for the CPU queue's first expert
  (model_cpu_time, :1184-1191; its comment: "deepseek 1 * token_num / mixtral 0.2 * token_num /
  qwen2 0.8 * token_num"), and an uncached GPU expert waits for its copy, `0.41791011235117914`
  each, serialised on one stream (model_move_time, :1199-1202). Prefill (and any step of more
  than one token) runs every activated expert on the GPU (experts.py:454-503);
- (ii) prefetch (experts.py:1057-1074): in decode, the `prefetch_size` uncached experts of layer
  l+1 with the highest S, while layer l runs (the README's example sets 0).

Modelled: all three, with these changes. The decision pass has the routed experts but not the
router's probabilities, so MRS scores each routed expert by its share of the step's tokens
(a decode token: 1), over the routed top-k rather than the top-2k, and from every token of a
step rather than its first. The greedy prices with the runtime's costs (`casmoe.costs`: the
simulator's compute model and link) where it gives some, the CPU's first-expert intercept then
being part of the host's own price (the simulator's per-expert hop); without (replay), or with
`published=true`, the code's constants above. A cached expert the greedy hands the CPU stays on
the GPU (a hit computes where it is resident). The prefetch reads the last routed step's token
count to tell decode. Options: `alpha`, `prefetch` (slots of layer l+1 per layer, 0 by
default), `split=false` (every miss loads: HybriMoE's cache alone), `published`.

Not modelled: the prefill's whole-layer streaming through a per-layer buffer and its loads of
layer l+2 (`reset_buffer`, experts.py:1105-1115): here prefill misses load through the cache;
the "impact" ranking of the paper's prefetch (the released code ranks by S).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence

import numpy as np

from casmoe.cache import CacheConfigError, ExpertCache, Routing
from casmoe.costs import PublishedCosts
from casmoe.geometry import ExpertId

PUBLISHED = PublishedCosts(copy_cost=0.41791011235117914, host_per_token=1.0, gpu_cost=0.5,
                           source="PKU-SEC-Lab/HybriMoE@508a85b9 ktransformers/operators/experts.py:1184-1202")
"""HybriMoE's released time models: a copy, the CPU per token (DeepSeek's), the GPU per expert."""
CPU_START = 0.79
"""The CPU queue's start-up, added to its first expert (experts.py:1184-1191), with `PUBLISHED` only."""


class HybriMoE(ExpertCache):
    name = "hybrimoe"
    summary = "a GPU cache by routing score; each step splits experts between CPU and GPU (HybriMoE)"
    runtime = "ktransformers"  # HybriMoE is built on KTransformers

    def __init__(self, *args, alpha: float = 0.5, prefetch: int = 0, split: bool = True, published: bool = False,
                 **kw) -> None:
        super().__init__(*args, **kw)
        if not 0 < alpha <= 1:
            raise CacheConfigError(f"hybrimoe: alpha must lie in (0, 1], got {alpha}")
        if not 0 <= prefetch <= self.geometry.experts:
            raise CacheConfigError(f"hybrimoe: prefetch must lie in [0, {self.geometry.experts}] experts, "
                                   f"got {prefetch}")
        self.alpha = alpha
        self.prefetch = prefetch
        self.split = split
        self.published = published
        g = self.geometry
        self._score = np.zeros((g.layers, g.experts))  # MRS, [L, E]
        self._decoding = False  # the last routed step had one token
        self.prefetches_per_layer = prefetch > 0

    # ---- (iii) the score-based cache --------------------------------------------------------

    def route(self, step, layer, experts, scores=None, counts=None, tokens=None):
        """MRS at the gate call (before the layer's loads): decay the layer, credit its routed."""
        E = self.geometry.experts
        row = self._score[layer]
        row *= 1.0 - self.alpha
        local = np.asarray(experts, dtype=np.int64) - layer * E
        share = np.ones(len(local)) if counts is None else np.asarray(counts, dtype=np.float64)
        n = 1 if tokens is None else tokens
        row[local] += self.alpha * share / n  # one order of operations whether or not counts are given
        self._decoding = n == 1
        return super().route(step, layer, experts, scores, counts, tokens)

    def victim(self, layer: int, candidates) -> ExpertId:
        score, E = self._score, self.geometry.experts
        return min(candidates, key=lambda e: (score[e // E, e % E], e))

    # ---- (ii) prefetch -----------------------------------------------------------------------

    def prefetch_layer(self, step: int, layer: int) -> Sequence[ExpertId]:
        """In decode, the `prefetch` uncached experts of the next layer with the highest score."""
        g = self.geometry
        if not self._decoding or layer + 1 >= g.layers:
            return ()
        row = self._score[layer + 1]
        base = (layer + 1) * g.experts
        out: list[ExpertId] = []
        for x in np.argsort(-row, kind="stable").tolist():
            if len(out) == self.prefetch or row[x] <= 0:
                break
            if not self.is_resident(base + x):
                out.append(base + x)
        return out

    # ---- (i) the intra-layer split -----------------------------------------------------------

    def host_misses(self, layer: int, misses: Sequence[ExpertId], routing: Routing) -> Collection[ExpertId]:
        """Decode (one token): the two-ended greedy over the layer's routed experts; the misses it
        hands the CPU run there. Any other step: every miss loads."""
        if not self.split or routing.tokens != 1:
            return ()
        published = self.published or self.costs is None
        costs = PUBLISHED if published else self.costs
        start = CPU_START if published else 0.0
        missing = set(misses)
        tokens = dict(zip(routing.experts, routing.counts))
        loaded = sorted((e for e in routing.experts if e not in missing), key=lambda e: -tokens[e])
        order = deque(loaded + sorted(misses, key=lambda e: -tokens[e]))  # stable: routing order among equals
        t_gpu = t_cpu = t_move = 0.0
        cpu: list[ExpertId] = []
        copy = costs.copy(layer)
        while order:
            g, c = order[0], order[-1]
            t_g = costs.gpu(layer, tokens[g])
            t_c = costs.host(layer, tokens[c]) + (0.0 if cpu else start)
            if g in missing and t_move + copy > t_gpu:  # the GPU waits for the copy
                t_g += t_move + copy - t_gpu
            if t_gpu + t_g <= t_cpu + t_c:
                if g in missing:
                    t_move += copy
                t_gpu += t_g
                order.popleft()
            else:
                t_cpu += t_c
                cpu.append(c)
                order.pop()
        return [e for e in cpu if e in missing]

"""Fiddler (Kamahori et al., arXiv 2402.07033, ICLR 2025): the experts a profile routes to most
stay on the GPU; per step, a missed expert is computed on the host when few enough tokens route
to it, else its weights are copied to the GPU for that step.

Read from the released code, efeslab/fiddler @ 227715bf, src/fiddler/mixtral.py
(casmoe/engines/ALGORITHMS.md, section 1; the arXiv text opens with "Fiddler determines the
optimal execution strategy using both the CPU and the GPU based on the number of input tokens
of each expert", Fig. 1 caption):

- initial placement (mixtral.py:60-70, 351-361): the first `n_expert_on_gpu` entries of a list
  of (layer, expert) pairs "in the order of popularity, determined based on profile", as many
  as the GPU memory holds; static afterwards;
- per MoE layer and step, prefill and decode alike (mixtral.py:551-645): with `n_e` the tokens
  routed to expert e, `cost_cpu = n_e * latency_cpu` and `cost_gpu = 0` if e is on the GPU,
  else `latency_gpu` (one weight copy); `latency_cpu = 7`, `latency_gpu = 70` (mixtral.py:38-39,
  "TODO: find this value based on device config"; their units are not stated, only the ratio
  matters). The search minimises the sum over the layer's experts, so it separates: an expert
  not on the GPU runs on the CPU iff `7 n_e < 70` (9 tokens or fewer); a tie copies it.
  A copied expert runs in one placeholder expert on the GPU and is not kept.

Modelled: the GPU set, ktransformers' frequency placement (`casmoe.policies.ktransformers`: the
capacity's slots less the staging slots, all layers ranked together), by default the popularity
of the trace's train split, never of the scored requests (as `static`); it is copied in when
the first request starts. Per step, a miss runs on the host iff its host time for its tokens
is below a copy plus its GPU time, with the prices the runtime attaches (`casmoe.costs`: the
simulator's compute model and link, or a calibrated profile in the backend); without any
(replay), or with `published=true`, the code's 7 per token against 70 per copy (GPU time 0),
which is `tokens=10`. A copy is a demand load into a staging slot (`stage`, top_k by default),
released when its layer is done, so nothing is cached: Fiddler's placeholder is overwritten by
the next copy. A step with more copies than free staging slots copies those with the most
tokens and runs the rest on the host (Fiddler copies them one after another through its one
placeholder; casmoe's layer waits for its copies together, so they need slots side by side).

Options: `tokens=N`, a fixed rule (host iff fewer than N tokens); `published=true`; `stage=S`;
`gpu_prefill=T` (`casmoe.policies.placement`); `profile=FILE`.

Not modelled: Fiddler runs a layer's GPU experts and CPU experts one after the other
(mixtral.py:602-645; the simulator prices host experts beside the GPU's or after them, as the
profile's `cpu_serial` says), its 0.95 memory fraction (here the capacity is the budget), and
beam search.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from casmoe.cache import CacheConfigError, Routing
from casmoe.costs import PublishedCosts
from casmoe.geometry import ExpertId, Geometry
from casmoe.policies.ktransformers import KTransformers

PUBLISHED = PublishedCosts(copy_cost=70.0, host_per_token=7.0, gpu_cost=0.0,
                           source="efeslab/fiddler@227715bf src/fiddler/mixtral.py:38-39 (latency_gpu, latency_cpu)")
"""Fiddler's released constants: a copy costs 70, the CPU 7 per token, a resident expert 0."""


class Fiddler(KTransformers):
    name = "fiddler"
    summary = "as ktransformers, but a host expert many tokens need is copied to the GPU (Fiddler)"
    runtime = None  # its own runtime, of which no stack is shipped

    def __init__(self, *args, tokens: int | None = None, published: bool = False, **kw) -> None:
        if tokens is not None and tokens < 1:
            raise CacheConfigError(f"fiddler: tokens is a count >= 1 (host iff fewer tokens), got {tokens}")
        self.tokens = tokens
        self.published = published
        super().__init__(*args, **kw)

    def default_stage(self, geometry: Geometry) -> int:
        return geometry.top_k

    def host_misses(self, layer: int, misses: Sequence[ExpertId], routing: Routing) -> Collection[ExpertId]:
        if self.gpu_prefill is not None and routing.tokens >= self.gpu_prefill:
            return super().host_misses(layer, misses, routing)
        tokens = dict(zip(routing.experts, routing.counts))
        copy = [e for e in misses if not self.cheaper_on_host(layer, tokens[e])]
        return self.copy_at_most(misses, copy, routing) if copy else misses

    def cheaper_on_host(self, layer: int, tokens: int) -> bool:
        """Fiddler's rule for one expert not on the GPU: the host's time for its tokens is below
        a copy plus the GPU's time (a tie copies)."""
        if self.tokens is not None:
            return tokens < self.tokens
        costs = PUBLISHED if self.published or self.costs is None else self.costs
        return costs.host(layer, tokens) < costs.copy(layer) + costs.gpu(layer, tokens)

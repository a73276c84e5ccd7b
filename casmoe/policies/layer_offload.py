"""Layer offload: the weights of the offloaded layers stream to the GPU on every pass, routing or not.

What runtimes that treat an MoE layer as a dense one do (Mixtral-Offloading §4.3: "naive
offloading that loads the entire MoE layer"; MoE-Infinity §3: DeepSpeed-Inference and
HuggingFace Accelerate "simply treat MoE layers as dense layers"): HF Accelerate's
`device_map="auto"` keeps as many layers on the GPU as fit and streams the others from host
memory every forward pass; DeepSpeed ZeRO-Inference streams every layer (`offload_param:
cpu`); vLLM's `--cpu-offload-gb` streams the parameters it offloaded, layer after layer
(casmoe/engines/README.md). None of them reads the routing: every expert of an offloaded layer
moves, every token.

Modelled: the experts of `n` layers are loaded whole before each pass through the layer
(prefetches issued as the layer starts, so its routed experts are waited for and the rest keep
the link busy after it), and leave again; every other layer's experts are on the GPUs for good
(filled when the first request starts). `n` defaults to the fewest streamed layers whose
complement, plus one layer of staging slots, fits the capacity (slots per layer x layers: the
memory every other policy gets); with fewer staging slots than a layer's experts, a streamed
layer's copies evict each other as they land (the link still carries every byte). Not modelled: a runtime that copies a layer before computing
any of it (the layer here waits for its routed experts only), and the dense weights of the
offloaded layers (they stay on the GPU).
"""

from __future__ import annotations

import heapq

from casmoe.cache import Capacity, CacheConfigError, ExpertCache, RequestStart
from casmoe.geometry import ExpertId, Geometry
from casmoe.policies.placement import budget_slots


class LayerOffload(ExpertCache):
    name = "layer-offload"
    summary = "streams whole layers' experts every token, routing or not (HF Accelerate, DeepSpeed)"
    runtime = "hf-accelerate"

    def __init__(self, geometry: Geometry, capacity: int | Capacity, *, n: int | None = None, **kw) -> None:
        L, E = geometry.layers, geometry.experts
        cap = capacity if isinstance(capacity, Capacity) else Capacity(capacity)
        budget = budget_slots(geometry, cap)
        fewest = L - min(L, max(0, budget - E) // E)
        n = fewest if n is None else n
        if not 0 <= n <= L:
            raise CacheConfigError(f"layer-offload: n must lie in [0, {L}] layers, got {n}")
        # streamed experts pass through top_k staging slots; a capacity below top_k gets them
        # from the cache as transient slots (`ExpertCache.loads_on_demand`)
        need = (L - n) * E + (min(geometry.top_k, max(budget, 1)) if n else 0)
        if need > budget:
            raise CacheConfigError(
                f"layer-offload[n={n}] keeps {L - n} layers x {E} experts on the GPUs plus staging slots for the "
                f"streamed ones, more than the {budget} slots of the capacity; give --global-capacity {need + E - geometry.top_k} "
                f"or more, or n >= {fewest}"
            )
        super().__init__(geometry, Capacity(budget, per_layer=False), **kw)
        self.n = n
        self._resident = [e for e in range(n * E, L * E)]
        self._streamed: set[ExpertId] = set()  # streamed experts holding a slot (a few layers' worth at most)
        # the same, per layer, as min-heaps with lazy deletion: the victim is read off the lowest
        # other layer's heap in O(log n), not found by a scan of every streamed expert (a
        # 128-expert model streams hundreds, once per copy)
        self._heaps: dict[int, list[ExpertId]] = {}

    def prefetch_request(self, request: RequestStart) -> list[ExpertId]:
        """The resident layers' experts, where not yet loaded (the first request's start-up fill)."""
        return [e for e in self._resident if not self.is_resident(e)]

    def prefetch_layer(self, step: int, layer: int) -> list[ExpertId]:
        """Every expert of an offloaded layer, as the layer starts."""
        if layer >= self.n:
            return []
        E = self.geometry.experts
        return list(range(layer * E, (layer + 1) * E))

    def on_insert(self, expert: ExpertId) -> None:
        if expert < self.n * self.geometry.experts:
            self._streamed.add(expert)
            layer = expert // self.geometry.experts
            heap = self._heaps.setdefault(layer, [])
            heapq.heappush(heap, expert)
            if len(heap) > 4 * self.geometry.experts:  # stale entries: rebuild from the live ones
                self._heaps[layer] = live = [e for e in set(heap) if e in self._streamed]
                heapq.heapify(live)

    def on_evict(self, expert: ExpertId) -> None:
        self._streamed.discard(expert)

    def victim(self, layer: int, candidates) -> ExpertId:
        """A streamed expert (one of another offloaded layer), never a resident layer's: read
        from the streamed residents, not the whole pool (which holds every resident layer)."""
        for other in sorted(self._heaps):
            if other == layer:
                continue
            heap = self._heaps[other]
            while heap and heap[0] not in self._streamed:
                heapq.heappop(heap)
            if not heap:
                del self._heaps[other]
                continue
            if heap[0] in candidates:
                return heap[0]  # the lowest streamed expert of the lowest other layer
            break  # a protected one: the scan below decides
        streamed = [e for e in self._streamed if e in candidates]
        if not streamed:
            raise CacheConfigError("layer-offload: no streamed expert to make room for; give a larger capacity")
        return min(streamed, key=lambda e: (e // self.geometry.experts == layer, e))

"""Fixed placements: a set of experts lives on the GPUs for good, every other expert on the host.

The deployments users run today on a box too small for the model (llama.cpp's `--n-cpu-moe`,
KTransformers' GPU expert mask) move no expert while serving: the experts on the GPUs stay,
the rest are computed where they live, on the host's CPU. A placement is that split. Its host
experts are the cache's `host_experts` (`casmoe.cache`): a routed host expert is computed on
the host as the cpu miss mode computes a miss (priced by the profile's host compute, beside the
GPU's experts or after them, `cpu_serial`), whatever the run's miss mode; nothing is evicted.

The GPU set fills one pool that holds the whole budget (the capacity's slots, all layers
together: a placement keeps more experts in some layers than in others), and is copied in when
the first request starts; a server loads it once at start-up, so the runtimes land that fill
before their clock starts and report it apart (`fills_at_start`, `setup_s`). Subclasses only say which experts go on the
GPUs (`choose_gpu`), and may decide per step which host experts to copy instead (`host_misses`).

**The GPU-prefill threshold** (`gpu_prefill=T`, an option of every placement): a step with at
least T tokens through a layer copies that layer's routed host experts to the GPU and computes
them there instead of on the host; a step with fewer computes them on the host. The two engines
that do it:

- llama.cpp's op offload (on by default; `casmoe/engines/llama.cpp.toml [op_offload]`:
  ggml-cuda.cu:5383 `GGML_OP_OFFLOAD_MIN_BATCH`, default 32 tokens; ggml-backend.cpp:1576-1660
  copies only the experts the ubatch uses, and nothing is kept between ubatches or layers);
- KTransformers' `--kt-gpu-prefill-token-threshold` (`casmoe/engines/ktransformers.toml`:
  kvcache-ai/sglang kt_ep_wrapper.py:2954-2958, `num_tokens >= threshold`, default 0 = off; it
  loads the whole layer into a temporary GPU layer, "one extra MoE layer of VRAM",
  kt-kernel/README.md:543-546).

Modelled: the copies are demand loads the layer waits for, made into staging slots that the
placement reserves out of the capacity (`stage`, by default one layer's experts, E, as
KTransformers' temporary layer; never more than the budget, none when it holds every expert)
and released when the layer is
done (`keeps`): the next step copies again, as both engines do. A step routing more host
experts than the free staging slots copies those with the most tokens and computes the rest on
the host. The threshold reads the step's tokens (a prefill's prompt, a batched decode's
requests). Not modelled: KTransformers copies every expert of the layer, not only the routed
ones (a prefill long enough to pass its usual thresholds routes nearly all of them), and its
`--kt-enable-dynamic-expert-update`; llama.cpp's ubatches (a prompt longer than `-ub` is one
step here).

It is an option of the placements rather than a policy of its own because it changes nothing
but where a placement's host experts run for a step, and both engines offer it as a flag of the
placement they already run (n-cpu-moe's layers, ktransformers' frequency mask, fiddler's too).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from casmoe.cache import Capacity, CacheConfigError, ExpertCache, PolicyError, RequestStart, Routing
from casmoe.geometry import ExpertId, Geometry


class Placement(ExpertCache):
    """The experts `choose_gpu` names stay on the GPUs; the rest run on the host, or are copied
    for one step when `host_misses` says so (`gpu_prefill` tokens or more, by default)."""

    loads_on_demand = False  # a miss is computed on the host: no slot needed, none at all for an all-host placement
    fills_at_start = True  # the GPU set is loaded at start-up, before any request

    @classmethod
    def held_on_gpus(cls, geometry: Geometry, capacity: Capacity) -> int:
        """The whole budget: the engines load a GPU-resident tensor into VRAM once and leave
        no host copy in use."""
        return budget_slots(geometry, capacity)

    def __init__(self, geometry: Geometry, capacity: int | Capacity, *, gpu_prefill: int | None = None,
                 stage: int | None = None, **kw) -> None:
        cap = capacity if isinstance(capacity, Capacity) else Capacity(capacity)
        budget = budget_slots(geometry, cap)
        if gpu_prefill is not None and gpu_prefill < 1:
            raise CacheConfigError(f"{self.name}: gpu_prefill is a token count >= 1 (leave it out for none), "
                                   f"got {gpu_prefill}")
        if stage is None:
            stage = self.default_stage(geometry) if gpu_prefill is None else geometry.experts
        if stage < 0:
            raise CacheConfigError(f"{self.name}: stage must be >= 0 slots, got {stage}")
        self.gpu_prefill = gpu_prefill
        self.stage = 0 if budget >= geometry.total_experts else min(stage, budget)
        """Slots kept free for the copies of one step (host experts copied to the GPU); none when
        the capacity holds every expert (then none is on the host)."""
        super().__init__(geometry, Capacity(budget, per_layer=False), **kw)
        self.gpu: tuple[ExpertId, ...] = tuple(sorted({int(e) for e in self.choose_gpu(budget - self.stage)}))
        if len(self.gpu) > budget - self.stage:
            raise CacheConfigError(f"{self.name}: {len(self.gpu)} experts on the GPUs, more than the "
                                   f"{budget - self.stage} slots of the capacity left beside {self.stage} "
                                   "staging slots")
        on_gpu = set(self.gpu)
        self._on_gpu = on_gpu
        self._copies: set[ExpertId] = set()  # resident host experts: copies for a step
        self.host_experts = frozenset(e for e in range(geometry.total_experts) if e not in on_gpu)
        self.decides_host = gpu_prefill is not None or type(self).host_misses is not Placement.host_misses

    def default_stage(self, geometry: Geometry) -> int:
        """Staging slots without a GPU-prefill threshold (none: a placement copies nothing)."""
        return 0

    def choose_gpu(self, slots: int) -> Iterable[ExpertId]:
        """The experts kept on the GPUs, at most `slots` of them."""
        raise NotImplementedError(f"{type(self).__name__} must choose its GPU experts")

    def prefetch_request(self, request: RequestStart) -> list[ExpertId]:
        """The GPU set, layer by layer, where not yet resident (the first request's start-up fill)."""
        return [e for e in self.gpu if not self.is_resident(e)]

    def host_misses(self, layer: int, misses: Sequence[ExpertId], routing: Routing) -> Collection[ExpertId]:
        """The host experts, unless the step has `gpu_prefill` tokens or more: then they are
        copied, as many as the staging slots hold (most tokens first)."""
        if self.gpu_prefill is not None and routing.tokens >= self.gpu_prefill:
            return self.copy_at_most(misses, misses, routing)
        return super().host_misses(layer, misses, routing)

    def copy_at_most(self, misses: Sequence[ExpertId], copy: Sequence[ExpertId],
                     routing: Routing) -> Collection[ExpertId]:
        """The misses left on the host when `copy` (some of them) are to be copied: those the
        free staging slots cannot hold this step, the fewest tokens first."""
        room = self.room()
        if len(copy) <= room:
            copied = set(copy)
        else:
            tokens = dict(zip(routing.experts, routing.counts))
            copied = set(sorted(copy, key=lambda e: -tokens[e])[:room])  # stable: routing order among equals
        return [e for e in misses if e not in copied]

    def room(self) -> int:
        """Slots a copy can take now: the free ones, and those of earlier copies this layer does
        not use (a copy is released when its layer is done; one fetched in the background for a
        substituted miss stays until a copy needs its slot)."""
        protected = self._protected
        return len(self._free[0]) + sum(1 for e in self._copies if e not in protected)

    def keeps(self, expert: ExpertId) -> bool:
        """A copied host expert is released when its layer is done; the GPU set stays."""
        return expert in self._on_gpu

    def on_insert(self, expert: ExpertId) -> None:
        if expert not in self._on_gpu:
            self._copies.add(expert)

    def on_evict(self, expert: ExpertId) -> None:
        self._copies.discard(expert)

    def can_evict(self, pool: int) -> bool:
        """Only a copy the running layer does not use can give up its slot."""
        protected = self._protected
        return any(e not in protected for e in self._copies)

    def victim(self, layer: int, candidates) -> ExpertId:
        """An earlier copy this layer does not use (the GPU set is never evicted)."""
        old = min((e for e in self._copies if e in candidates), default=None)
        if old is None:
            raise PolicyError(f"{self.name}: no slot to evict (the GPU set stays, and every copy is in use)")
        return old


def budget_slots(geometry: Geometry, capacity: Capacity) -> int:
    """Expert slots of the whole box: every layer's slots, or the global pool's."""
    return capacity.clamped(geometry).total(geometry)

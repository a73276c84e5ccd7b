"""`OffloadedModel`: a transformers MoE model whose experts live in a store, computed on slot
pools that ExpertCache policies manage (its `session` runs one policy over requests).

The model keeps its dense part (loaded once, on the devices); every MoE block's `experts`
module is replaced by `OffloadedExperts`, which hands each layer call to the `DeviceRuntime` of
the layer's device (cache events, copies, exact compute in rounds). Layers split over devices
with `geometry.split_layers`, the simulator's split; each device has its own cache (a geometry
of its layers only), slot pool and loader, and all share the store and the optional RAM tier.

Requests run through the shared decode loop (`generate.py`, driven by `session.py`): prefill alone, then decode in
groups of `batch`. Each pass's state travels in a `ForwardPass` (forward_pass.py) that the session
opens on the model before the pass and reads back after: which device runtimes compute, the step,
prefill or decode, and the routing the router hooks captured. Prefill is one step whose experts are the union of the prompt's tokens'
choices, ordered as `Trace.steps` orders them; a batched decode step routes the union of its
tokens' experts, in token order. So a replay of the trace recorded here, with the same batch,
makes the same decisions. Without a session (`reference`), every layer calls the model's own
experts function on one layer's `[E, ...]` tensors, its routed experts read from the store: the
un-offloaded model, one layer at a time (a reference pass reads what a cacheless run would).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from casmoe.backends.adapters import adapter_for
from casmoe.backends.copier import EmulatedLink
from casmoe.backends.device import DeviceRuntime
from casmoe.backends.expert_ops import plan_class
from casmoe.backends.experts import (
    MoEBlock,
    OffloadedExperts,
    SlotView,
    expert_param_names,
    experts_function,
    find_moe_blocks,
    model_geometry,
)
from casmoe.backends.forward_pass import ForwardPass, RouterHooks, router_pick
from casmoe.backends.hostcache import HostCache, HostTier
from casmoe.backends.session import RunResult, Session
from casmoe.backends.store import ExpertStore, TensorStore
from casmoe.cache import CacheConfigError, Capacity, ExpertCache, MissMode
from casmoe.costs import ExpertCosts
from casmoe.errors import CasmoeError
from casmoe.gating import gate_rows
from casmoe.geometry import split_layers
from casmoe.trace import Future, Trace, prefill_step


class BackendError(CasmoeError, ValueError):
    """A backend setting that cannot work (bad device list, a trace of another model, ...)."""


@dataclass(frozen=True)
class Prompt:
    """Token ids of one request, with the text and task it came from when known."""

    ids: list[int]
    text: str | None = None
    task: str | None = None


class OffloadedModel:
    """Wraps `model` (modified in place). `store` holds the experts (default: the model's own
    expert tensors, for a model built in memory; `models.open_model` gives a skeleton whose
    experts were never loaded, with a `CheckpointStore`)."""

    def __init__(self, model: Any, *, store: ExpertStore | None = None, devices: Sequence[str] = ("cpu",),
                 link: EmulatedLink | None = None) -> None:
        self.devices = [torch.device(d) for d in devices]
        if not self.devices:
            raise BackendError("give at least one device")
        adapter_for(model.config.model_type)  # an unsupported family: one line naming the supported ones
        self.model = model.eval()
        blocks = find_moe_blocks(model)
        self.geometry = model_geometry(model, blocks)
        self.link = link or EmulatedLink()
        names = expert_param_names(blocks[0].experts)
        self.store = store or TensorStore([{n: getattr(b.experts, n) for n in names} for b in blocks])
        self.experts_fn = experts_function(blocks[0].experts)
        self.plan_cls = plan_class(getattr(blocks[0].experts.config, "_experts_implementation", None))
        self.experts_template = blocks[0].experts  # attributes only (act_fn, config, flags)
        for n in names:
            setattr(self.experts_template, n, None)
        self.attrs = SlotView(self.experts_template, {}, num_experts=self.geometry.experts)
        self.chunks = split_layers(len(blocks), len(self.devices))
        self._device_of: list[int] = [d for d, r in enumerate(self.chunks) for _ in r]
        for i, b in enumerate(blocks):
            b.block.experts = OffloadedExperts(i, self)  # the model's own experts are dropped
            _decoder(model).layers[b.decoder_index].register_forward_pre_hook(self._make_before(i))
        self.blocks = [MoEBlock(b.decoder_index, b.block, b.block.experts, b.gate) for b in blocks]
        self.hooks = RouterHooks(model, self.blocks)  # fill the open ForwardPass with each layer's routing
        self._place_dense()
        self._reference: dict[torch.device, dict[str, torch.Tensor]] = {}  # per device: one layer's experts
        self.on_layer: Callable[[OffloadedModel, int], None] | None = None

    # ---- setup ---------------------------------------------------------------------------

    def _place_dense(self) -> None:
        """Everything but the experts goes on the devices: embeddings on the first, each decoder
        layer on its MoE layer's device, the final norm and head on the last. Inputs follow their
        module across devices through pre-hooks."""
        if all(d.type == "cpu" for d in self.devices):
            return
        model = self.model
        decoder = _decoder(model)
        first, last = self.devices[0], self.devices[-1]
        model.to(first)
        owner = {b.decoder_index: self.devices[self._device_of[i]] for i, b in enumerate(self.blocks)}
        current = first
        for i, layer in enumerate(decoder.layers):
            current = owner.get(i, current)
            layer.to(current)
            layer.register_forward_pre_hook(_move_inputs(current), with_kwargs=True)
        head = model.get_output_embeddings()
        if first != last and head.weight is model.get_input_embeddings().weight:
            head.weight = torch.nn.Parameter(head.weight.detach().clone())  # untie: embeddings stay on the first
        for module in (decoder.norm, head):
            module.to(last)
            module.register_forward_pre_hook(_move_inputs(last), with_kwargs=True)

    def _make_before(self, layer: int) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            p = self.hooks.current
            if p is not None and p.devices is not None:
                d = p.devices[self._device_of[layer]]
                local = layer - d.layers.start
                guess = getattr(d.cache, "guess", None)  # a speculative policy takes the live guess
                if guess is not None and local > 0:
                    p.guesses[layer] = router_pick(self.model, self.blocks[layer], self.hooks, args[0])
                    guess(local, p.guesses[layer])
                d.before_layer(p.step, local)

        return hook

    # ---- one pass ------------------------------------------------------------------------

    def open_pass(self, devices: Sequence[DeviceRuntime] | None, step: int, prefill: bool,
                  keep_scores: bool = False, gating: float | None = None) -> ForwardPass:
        """Start a pass: `devices` compute the experts (None: the reference), `gating` the
        adaptive gating threshold its routing goes through (None: exact); the router hooks fill
        the returned context, which `close_pass` hands back."""
        return self.hooks.open(ForwardPass(self.geometry.layers, devices, step, prefill, keep_scores=keep_scores,
                                           gating=gating))

    def close_pass(self) -> ForwardPass:
        return self.hooks.close()

    # ---- the per-layer path --------------------------------------------------------------

    def experts_forward(self, layer: int, hidden: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
        """`layer`'s experts for the router's choices: [T, H] -> [T, H]. The open pass's router
        hook has captured the choices (and gates them when the pass says so); outside a pass the
        layer computes as the reference."""
        p = self.hooks.current
        if p is not None and p.gating is not None:
            top_k_index, top_k_weights = self._gate(p, layer, top_k_index, top_k_weights)
        idx = top_k_index.cpu().numpy() if p is None else p.topk[layer]  # [T, k]
        if p is None or p.devices is None:  # the reference: the model's own function on its [E, ...] tensors
            tensors = self.store.layer_tensors(layer, hidden.device, sorted(set(idx[idx >= 0].tolist())),
                                               self._reference_buffer(hidden.device))
            return self.experts_fn(SlotView(self.experts_template, tensors), hidden, top_k_index, top_k_weights)
        d = p.devices[self._device_of[layer]]
        local = layer - d.layers.start
        E = self.geometry.experts
        counts: list[int] | None = None  # tokens routed to each expert, for a cache that decides where misses run
        if p.prefill:
            offsets = np.full((1, 1, 1), local * E, dtype=np.int64)
            step = prefill_step(idx[:, None, :], p.weights[layer][:, None, :], offsets, E)
            experts, counts = step.experts[0], step.counts[0]
        else:  # one token per request: the union in token order, as Trace.steps(batch) merges them
            flat = (idx.astype(np.int64) + local * E)[idx >= 0].tolist()
            experts = list(dict.fromkeys(flat))
            if len(flat) > len(experts):  # a batch whose tokens share experts (merge_steps' tallies)
                tally = dict.fromkeys(experts, 0)
                for e in flat:
                    tally[e] += 1
                counts = list(tally.values())
        plan = self.plan_cls(self.attrs, hidden, top_k_index, top_k_weights)
        out = d.layer(p.step, local, plan, experts, p.scores[layer], counts, int(idx.shape[0]))
        if self.on_layer is not None:
            self.on_layer(self, layer)
        return out

    @staticmethod
    def _gate(p: ForwardPass, layer: int, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Adaptive gating of the router's choices (`casmoe.gating.gate_rows`, as the simulator
        gates a trace): the pass's rows for the layer become the gated ones (a dropped slot
        `NOT_COMPUTED`, routed nowhere), and the experts function gets the kept expert again in a
        dropped slot at weight 0: the same [T, k] shape, the same sum, no expert that is not routed."""
        idx, weights = gate_rows(p.topk[layer], p.weights[layer], p.gating)
        p.topk[layer], p.weights[layer] = idx, weights
        filled = np.where(idx >= 0, idx, idx[:, :1])  # [T, k]: a dropped slot names the kept expert
        index = torch.as_tensor(filled, dtype=top_k_index.dtype).to(top_k_index.device)
        return index, torch.as_tensor(weights).to(device=top_k_weights.device, dtype=top_k_weights.dtype)

    def _reference_buffer(self, device: torch.device) -> dict[str, torch.Tensor] | None:
        """One layer's `[E, ...]` tensors on `device`, reused by every reference layer call
        (None: the store holds the model's own tensors and hands them out)."""
        if isinstance(self.store, TensorStore):
            return None
        buf = self._reference.get(device)
        if buf is None:
            buf = self._reference[device] = {n: t.zero_() for n, t in
                                             self.store.empty_rows(self.geometry.experts, device).items()}
        return buf

    # ---- runs ----------------------------------------------------------------------------

    def reference(self, prompts: Sequence[Prompt], max_new_tokens: int, keep_logits: bool = False,
                  batch: int = 1, follow: Sequence[Sequence[int]] | None = None, gating: float | None = None
                  ) -> RunResult:
        """The un-offloaded computation (each layer's experts straight from the store): ground
        truth. `follow` replays another run's tokens instead of choosing (`bench --verify`);
        `gating`, the un-offloaded model with adaptive gating (`casmoe.gating`)."""
        with Session(self, None, gating=gating) as s:
            s.serve(prompts, max_new_tokens, keep_logits, batch=batch, follow=follow)
            return s.result()

    def session(
        self,
        policy: type[ExpertCache],
        capacity: int | Capacity,
        prompts: Sequence[Prompt],
        *,
        max_new_tokens: int = 16,
        miss_mode: MissMode = MissMode.LOAD,
        options: dict[str, Any] | None = None,
        trace: Trace | None = None,
        link: EmulatedLink | None = None,
        host: HostCache | None = None,
        batch: int = 1,
        gating: float | None = None,
        costs: ExpertCosts | None = None,
    ) -> Session:
        """Caches, pools and loaders for `policy` at `capacity` per device (and the RAM tier
        `host`), ready to serve `prompts` in order (oracles and profile-ranked policies get
        `trace`, or else the routing of a reference run of the same prompts and `batch`:
        identical to this run's in load mode). `link` overrides the model's emulated link;
        `gating` runs adaptive gating at that threshold (`casmoe.gating`: lossy); `costs`, the
        prices a per-step CPU-or-copy policy weighs (`casmoe.costs`, by global layer: e.g.
        `casmoe.sim.passes.decide.machine_costs` of a calibrated profile; None: the policy's published ones)."""
        trace, caches = self._caches(policy, capacity, miss_mode, options or {}, trace, prompts, max_new_tokens,
                                     batch, gating)
        if costs is not None:
            for layers, cache in zip(self.chunks, caches):
                cache.attach_costs(costs.shifted(layers.start))
        g = self.geometry
        ram = None if host is None else HostTier(
            self.store, g, host.rows, host.policy, host.options, pin=any(d.type == "cuda" for d in self.devices))
        devs = [
            DeviceRuntime(device, layers, g.layer_slice(layers), cache, self.store, self.attrs, link or self.link, ram,
                          None if trace is None else trace.layer_slice(layers).requests)
            for device, layers, cache in zip(self.devices, self.chunks, caches)
        ]
        return Session(self, devs, ram, want_scores=miss_mode is MissMode.SUBSTITUTE, gating=gating)

    def run(self, prompts: Sequence[Prompt], policy: type[ExpertCache], capacity: int | Capacity, *,
            max_new_tokens: int = 16, keep_logits: bool = False, batch: int = 1, **kw: Any) -> RunResult:
        """Generate greedily from every prompt with offloaded experts (see `session`)."""
        with self.session(policy, capacity, prompts, max_new_tokens=max_new_tokens, batch=batch, **kw) as s:
            s.serve(prompts, max_new_tokens, keep_logits, batch=batch)
            return s.result()

    def perplexity(self, texts: Sequence[Prompt], session: Session | None = None) -> float:
        """Teacher-forced perplexity of `texts` (one prefill step each)."""
        texts = [p for p in texts if len(p.ids) >= 2]
        if not texts:
            raise BackendError("perplexity needs texts of at least two tokens")
        s = session or Session(self, None)
        nll, count = 0.0, 0
        for p in texts:
            logits = s.serve([p], 1, full=True)[0][0]  # [T, V]
            target = torch.tensor(p.ids[1:], device=logits.device)
            nll += float(torch.nn.functional.cross_entropy(logits[:-1].float(), target, reduction="sum"))
            count += len(p.ids) - 1
        return math.exp(nll / count)

    def offloaded_perplexity(self, texts: Sequence[Prompt], policy: type[ExpertCache], capacity: int | Capacity,
                             *, miss_mode: MissMode, options: dict[str, Any] | None = None,
                             gating: float | None = None) -> float:
        with self.session(policy, capacity, texts, max_new_tokens=1, miss_mode=miss_mode, options=options,
                          gating=gating) as s:
            return self.perplexity(texts, s)

    def _caches(self, policy: type[ExpertCache], capacity: int | Capacity, miss_mode: MissMode,
                options: dict[str, Any], trace: Trace | None, prompts: Sequence[Prompt], max_new_tokens: int,
                batch: int, gating: float | None = None) -> tuple[Trace | None, list[ExpertCache]]:
        """One cache per device, with the trace they were given (or that profiled them: a
        reference run of the prompts, gated as the run will be)."""
        g = self.geometry
        if trace is not None and (trace.geometry.layers, trace.geometry.experts, trace.geometry.top_k) != (
            g.layers, g.experts, g.top_k
        ):
            raise BackendError(
                f"trace geometry ({trace.geometry.describe()}) does not match the model ({g.describe()}); "
                "record a trace of this model (casmoe record) or pass none"
            )

        def build(tr: Trace | None) -> list[ExpertCache]:
            return [
                policy.create(g.layer_slice(r), capacity, miss_mode=miss_mode,
                              expert_bytes=g.layer_slice(r).layer_expert_bytes,
                              trace=None if tr is None else tr.layer_slice(r), **options)
                for r in self.chunks
            ]

        cap = ExpertCache(g.layer_slice(self.chunks[0]), capacity).capacity  # a bad capacity fails here, before any work
        if cap.slots < g.top_k:  # the simulator prices staging slots (Mixtral-Offloading's one resident expert); this pool has none
            flag = "--capacity" if cap.per_layer else "--global-capacity"
            raise CacheConfigError(
                f"capacity of {cap.describe()} slots is below the {g.top_k} experts a token routes to per layer: "
                f"the torch runtime computes a layer's experts from GPU slots, so use {flag} >= {g.top_k} "
                "(casmoe simulate prices fewer slots with transient staging)"
            )
        try:
            caches = build(trace)
        except CacheConfigError:
            if trace is not None:
                raise
            trace = self.reference(prompts, max_new_tokens, batch=batch, gating=gating).trace  # the policy wants a profile
            caches = build(trace)
        if trace is None and any(c.needs_future for c in caches):
            trace = self.reference(prompts, max_new_tokens, batch=batch, gating=gating).trace
            caches = build(trace)
        for r, cache in zip(self.chunks, caches):
            if cache.needs_future:
                cache.attach_future(Future(trace.layer_slice(r).steps(batch), cache.geometry))
        return trace, caches

    def check_residency(self) -> None:
        """Every device's slots hold what its cache says (raises AssertionError otherwise); during
        a pass (e.g. from `on_layer`)."""
        p = self.hooks.current
        for d in (p.devices if p is not None else None) or ():
            d.check_residency()


def _decoder(model: Any) -> Any:
    return getattr(model, "model", model)


def _move_inputs(device: torch.device) -> Callable[..., Any]:
    def to(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.to(device)
        if isinstance(x, tuple):
            return tuple(to(v) for v in x)
        return x

    def hook(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return tuple(to(a) for a in args), {k: to(v) for k, v in kwargs.items()}

    return hook

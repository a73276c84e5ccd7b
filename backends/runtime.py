"""`OffloadedModel`: runs a transformers MoE model with its experts offloaded, driven by an ExpertCache.

The same cache objects as `casmoe.replay` and the simulator decide residency, through the same
events in the same order: `begin_request`; per step and MoE layer `before_layer` (from a
pre-hook on the decoder layer, so prefetches overlap its attention) and `route` (from the
experts module, with the router's actual choices); `arrived` when a copy lands; `end_request`.
Prefill is one step whose experts are the union of the prompt tokens' choices, ordered exactly as
`Trace.steps` orders them, so a replay of the trace recorded here makes the same decisions.

Layers can be split over several devices (contiguous chunks); each device has its own cache
(a geometry of its layers only), slot pool and copier. Expert weights live in a `HostStore`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from casmoe.cache import Capacity, CacheConfigError, CacheStats, ExpertCache, Load, LoadReason, MissMode, RequestStart
from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry, split_layers
from casmoe.trace import Future, Request, Trace, prefill_step

from casmoe.backends.copier import CudaCopier, EmulatedLink, ThreadCopier, Ticket
from casmoe.backends.experts import (
    MoEBlock,
    OffloadedExperts,
    SlotView,
    expert_param_names,
    experts_function,
    find_moe_blocks,
    model_geometry,
)
from casmoe.backends.pool import SlotPool
from casmoe.backends.store import HostStore


class BackendError(CasmoeError, ValueError):
    """A backend setting that cannot work (unsupported miss mode, bad device list, ...)."""


@dataclass(frozen=True)
class Prompt:
    """Token ids of one request, with the text and task it came from when known."""

    ids: list[int]
    text: str | None = None
    task: str | None = None


@dataclass
class RequestTiming:
    prompt_tokens: int
    new_tokens: list[int]
    ttft: float  # seconds from request start to the first generated token
    token_latency: list[float]  # seconds per decode step
    stall: float  # seconds spent waiting for expert copies, the whole request
    token_stall: list[float] = field(default_factory=list)  # of which in each decode step


@dataclass
class RunResult:
    """What one run measured: timings per request, cache counters (summed over devices and per
    device), the routing trace it recorded, and optionally every step's output logits."""

    requests: list[RequestTiming]
    stats: CacheStats | None
    device_stats: list[CacheStats]
    trace: Trace
    logits: list[list[torch.Tensor]] = field(default_factory=list)
    wall: float = 0.0

    @property
    def generated(self) -> int:
        return sum(len(r.new_tokens) for r in self.requests)

    @property
    def stall(self) -> float:
        return sum(r.stall for r in self.requests)

    def to_dict(self) -> dict[str, Any]:
        lat = [x for r in self.requests for x in r.token_latency]
        d: dict[str, Any] = {
            "requests": len(self.requests),
            "generated_tokens": self.generated,
            "wall_s": self.wall,
            "tokens_per_s": self.generated / self.wall if self.wall else 0.0,
            "ttft_s": float(np.mean([r.ttft for r in self.requests])) if self.requests else 0.0,
            "median_token_latency_s": float(np.median(lat)) if lat else 0.0,
            "stall_s": self.stall,
        }
        if self.stats is not None:
            d.update({f"cache_{k}": v for k, v in self.stats.to_dict().items()})
        return d


class _Device:
    """One device's share of a run: its layers, cache, slot pool, copier and open copies."""

    def __init__(self, device: torch.device, layers: range, geometry: Geometry) -> None:
        self.device = device
        self.layers = layers
        self.geometry = geometry
        self.cache: ExpertCache | None = None
        self.pool: SlotPool | None = None
        self.copier: Any = None
        self.views: list[tuple[SlotView, int]] = []  # per local layer: the slots it can use, first slot
        self.requests: list[Request] | None = None  # known routing per request (oracles, profiles)
        self.tickets: dict[int, Ticket] = {}  # expert -> open copy
        self.slot_ticket: dict[int, Ticket] = {}


class OffloadedModel:
    """Wraps `model` (modified in place: its experts move to the host store)."""

    def __init__(
        self,
        model: Any,
        *,
        devices: Sequence[str] = ("cpu",),
        link: EmulatedLink | None = None,
        mmap_path: str | Path | None = None,
    ) -> None:
        self.model = model.eval()
        self.blocks: list[MoEBlock] = find_moe_blocks(model)
        self.geometry = model_geometry(model, self.blocks)
        self.link = link or EmulatedLink()
        names = expert_param_names(self.blocks[0].experts)
        self.devices = [torch.device(d) for d in devices]
        if not self.devices:
            raise BackendError("give at least one device")
        cuda = any(d.type == "cuda" for d in self.devices)
        if cuda and not torch.cuda.is_available():
            raise BackendError("a CUDA device was requested but torch sees no GPU")
        tensors = [{n: getattr(b.experts, n) for n in names} for b in self.blocks]
        store = HostStore.from_tensors(tensors, pin=cuda)
        if mmap_path is not None:
            store.save(mmap_path)
            store = HostStore.open_mmap(mmap_path)
        self.store = store
        self.experts_fn = experts_function(self.blocks[0].experts)
        self.experts_template = self.blocks[0].experts  # attributes only (act_fn, config, flags)
        for n in names:
            setattr(self.experts_template, n, None)
        self.chunks = split_layers(len(self.blocks), len(self.devices))
        self._device_of: list[int] = [d for d, r in enumerate(self.chunks) for _ in r]
        for i, b in enumerate(self.blocks):
            b.block.experts = OffloadedExperts(i, self.experts_fn, self)  # the model's own experts are dropped
            _decoder(self.model).layers[b.decoder_index].register_forward_pre_hook(self._make_before(i))
            b.gate.register_forward_hook(self._make_scores(i))
        self.blocks = [MoEBlock(b.decoder_index, b.block, b.block.experts, b.gate) for b in self.blocks]
        self._place_dense()
        self._run: list[_Device] | None = None  # None: reference mode (experts from the store)
        self._step = 0
        self._prefill = False
        self._stall = 0.0
        self._scores: list[np.ndarray | None] = [None] * len(self.blocks)
        self._rows: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(self.blocks)
        self._want_scores = False
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
            run = self._run
            if run is None:
                return
            d = run[self._device_of[layer]]
            if not d.cache.prefetches_per_layer:
                return  # route() releases the previous layer itself
            self._drain(d)
            for ld in d.cache.before_layer(self._step, layer - d.layers.start):
                self._issue(d, ld)

        return hook

    def _make_scores(self, layer: int) -> Callable[..., None]:
        def hook(module: Any, args: Any, out: Any) -> None:
            if self._want_scores:  # [T, E] router logits -> mean probability per expert
                self._scores[layer] = torch.softmax(out[0].float(), dim=-1).mean(0).cpu().numpy()

        return hook

    # ---- the per-layer path --------------------------------------------------------------

    def experts_forward(
        self, layer: int, fn: Callable[..., torch.Tensor], hidden: torch.Tensor, top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
    ) -> torch.Tensor:
        """Cache events for `layer`'s routing, waits for its copies, then transformers' experts
        function `fn` on the slot pool with expert indices mapped to slots. [T, H] -> [T, H]."""
        idx = top_k_index.cpu().numpy()  # [T, k]
        w = top_k_weights.float().cpu().numpy()  # [T, k]
        self._rows[layer] = (idx, w)
        run = self._run
        if run is None:
            dev = top_k_index.device
            tensors = {n: t.to(dev) for n, t in self.store.layers[layer].items()}
            return fn(SlotView(self.experts_template, tensors), hidden, top_k_index, top_k_weights)
        d = run[self._device_of[layer]]
        local = layer - d.layers.start
        E = self.geometry.experts
        base = local * E
        if self._prefill:
            offsets = np.full((1, 1, 1), base, dtype=np.int64)
            experts = prefill_step(idx[:, None, :], w[:, None, :], offsets, E).experts[0]
        else:
            experts = (idx[0].astype(np.int64) + base).tolist()
        cache = d.cache
        self._drain(d)
        acc = cache.route(self._step, local, experts, self._scores[layer])
        for e in acc.late:  # still-queued prefetches this layer needs go first, as in the simulator
            t = d.tickets.get(e)
            if t is not None:
                d.copier.promote(t)
        routed = set(experts)
        streamed = [ld for ld in acc.loads if ld.victim in routed]
        for ld in acc.loads:
            if ld.victim not in routed:
                self._issue(d, ld)
        for ld in acc.background:  # not waited for: the tokens after this one may hit it
            self._issue(d, ld)
        if streamed:
            out = self._stream(d, fn, hidden, top_k_index, top_k_weights, experts, local, streamed)
        else:
            self._wait(d, acc.late + acc.misses)
            view, first = d.views[local]
            lut = np.full(E, -1, dtype=np.int64)
            for e in experts:
                s = cache.slot(e)
                if s is not None:
                    lut[e - base] = s - first
            for missed, sub in acc.substitutes:
                lut[missed - base] = cache.slot(sub) - first
            slots = torch.from_numpy(lut).to(top_k_index.device)[top_k_index]
            out = fn(view, hidden, slots, top_k_weights)
        if self.on_layer is not None:
            self.on_layer(self, layer)
        return out

    def _wait(self, d: _Device, experts: Sequence[int]) -> None:
        """Block until the copies of `experts` land (the stall), then tell the cache."""
        if not experts:
            return
        t0 = time.perf_counter()
        for e in experts:
            t = d.tickets.pop(e, None)
            if t is not None:
                d.copier.wait(t)
                d.cache.arrived(e)
        self._stall += time.perf_counter() - t0

    def _stream(
        self, d: _Device, fn: Callable[..., torch.Tensor], hidden: torch.Tensor, top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor, experts: list[int], local: int, streamed: list[Load],
    ) -> torch.Tensor:
        """A layer that routes more experts than its pool holds (a long prefill): compute it in
        rounds over the experts resident at the time; a load that evicts one of this layer's own
        experts waits until that expert has been computed. Exact up to the order in which the
        rounds' partial sums are added (not bit-identical to the one-shot computation)."""
        pool = d.pool
        device = top_k_index.device
        view, first = d.views[local]
        base = local * self.geometry.experts
        done: set[int] = set()
        out = None
        while len(done) < len(experts):
            self._wait(d, [e for e in experts if e not in done and e in d.tickets])
            ready = [e for e in experts if e not in done and pool.slot_of(e) is not None]
            lut = np.zeros(self.geometry.experts, dtype=np.int64)
            use = np.zeros(self.geometry.experts, dtype=bool)
            for e in ready:
                lut[e - base] = pool.slot_of(e) - first
                use[e - base] = True
            sel = torch.from_numpy(use).to(device)[top_k_index]  # [T, k]
            slots = torch.from_numpy(lut).to(device)[top_k_index]
            part = fn(view, hidden, slots, top_k_weights * sel)
            out = part if out is None else out + part
            done.update(ready)
            for ld in [ld for ld in streamed if ld.victim in done]:
                streamed.remove(ld)
                self._issue(d, ld)
        return out

    def _issue(self, d: _Device, ld: Load) -> None:
        """Start the copy a cache `Load` asks for; cancel what it overwrites."""
        old = d.tickets.pop(ld.victim, None) if ld.victim != -1 else None
        if old is not None:
            old.cancelled = True
        prev = d.slot_ticket.get(ld.slot)
        if prev is not None:
            prev.cancelled = True  # a released slot reused before its previous copy ran
        layer, e = divmod(ld.expert, self.geometry.experts)
        g = d.layers.start + layer
        d.pool.assign(ld.slot, ld.expert)
        t = Ticket(
            ld.expert, ld.slot, ld.reason is LoadReason.DEMAND, self.store.expert(g, e), d.pool.row(ld.slot),
            self.store.expert_bytes(g),
        )
        d.tickets[ld.expert] = t
        d.slot_ticket[ld.slot] = t
        d.copier.submit(t)

    def _drain(self, d: _Device) -> None:
        """Tell the cache about copies that have landed."""
        done = d.copier.done
        for e, t in list(d.tickets.items()):
            if done(t):
                del d.tickets[e]
                d.cache.arrived(e)

    # ---- runs ----------------------------------------------------------------------------

    def reference(self, prompts: Sequence[Prompt], max_new_tokens: int, keep_logits: bool = False) -> RunResult:
        """The un-offloaded computation (experts straight from the store): ground truth."""
        with Session(self, None) as s:
            for p in prompts:
                s.request(p, max_new_tokens, keep_logits)
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
    ) -> Session:
        """Caches, pools and copiers for `policy` at `capacity` per device, ready to serve
        `prompts` in order (oracles and profile-ranked policies get `trace`, or else the
        routing of a reference run of the same prompts: identical to this run's in load mode).
        `link` overrides the model's emulated link for this session."""
        devs = self._prepare(policy, capacity, miss_mode, options or {}, trace, prompts, max_new_tokens, link or self.link)
        return Session(self, devs)

    def run(
        self,
        prompts: Sequence[Prompt],
        policy: type[ExpertCache],
        capacity: int | Capacity,
        *,
        max_new_tokens: int = 16,
        miss_mode: MissMode = MissMode.LOAD,
        options: dict[str, Any] | None = None,
        trace: Trace | None = None,
        keep_logits: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> RunResult:
        """Generate greedily from every prompt with offloaded experts (see `session`)."""
        with self.session(policy, capacity, prompts, max_new_tokens=max_new_tokens, miss_mode=miss_mode,
                          options=options, trace=trace) as s:
            for p in prompts:
                s.request(p, max_new_tokens, keep_logits)
                if progress is not None:
                    progress(1)
            return s.result()

    def perplexity(self, texts: Sequence[Prompt], devs: list[_Device] | None = None) -> float:
        """Teacher-forced perplexity of `texts` (one prefill step each)."""
        nll, count = 0.0, 0
        self._step = 0
        for i, p in enumerate(texts):
            if len(p.ids) < 2:
                continue
            logits = self._request(p, 0, devs, keep_logits=True, full=True, index=i)[1][0]  # [T, V]
            target = torch.tensor(p.ids[1:], device=logits.device)
            nll += float(torch.nn.functional.cross_entropy(logits[:-1].float(), target, reduction="sum"))
            count += len(p.ids) - 1
        if not count:
            raise BackendError("perplexity needs texts of at least two tokens")
        return math.exp(nll / count)

    def offloaded_perplexity(
        self, texts: Sequence[Prompt], policy: type[ExpertCache], capacity: int | Capacity, *,
        miss_mode: MissMode, options: dict[str, Any] | None = None,
    ) -> float:
        with self.session(policy, capacity, texts, max_new_tokens=1, miss_mode=miss_mode, options=options) as s:
            return self.perplexity(texts, s.devs)

    def _prepare(
        self, policy: type[ExpertCache], capacity: int | Capacity, miss_mode: MissMode, options: dict[str, Any],
        trace: Trace | None, prompts: Sequence[Prompt], max_new_tokens: int, link: EmulatedLink,
    ) -> list[_Device]:
        if miss_mode is MissMode.CPU:
            raise BackendError("the torch backend runs miss modes 'load' and 'substitute'; 'cpu' is simulator-only")
        g = self.geometry
        if trace is not None and (trace.geometry.layers, trace.geometry.experts, trace.geometry.top_k) != (
            g.layers, g.experts, g.top_k
        ):
            raise BackendError(
                f"trace geometry ({trace.geometry.describe()}) does not match the model ({g.describe()}); "
                "record a trace of this model (casmoe record) or pass none"
            )
        devs = []
        for device, layers in zip(self.devices, self.chunks):
            devs.append(_Device(device, layers, g.layer_slice(layers)))

        def build(tr: Trace | None) -> list[ExpertCache]:
            return [
                policy.create(
                    d.geometry, capacity, miss_mode=miss_mode, expert_bytes=d.geometry.layer_expert_bytes,
                    trace=None if tr is None else tr.layer_slice(d.layers), **options,
                )
                for d in devs
            ]

        ExpertCache(devs[0].geometry, capacity)  # a capacity below top-k fails here, before any work
        try:
            caches = build(trace)
        except CacheConfigError:
            if trace is not None:
                raise
            trace = self.reference(prompts, max_new_tokens).trace  # the policy wants a profile trace
            caches = build(trace)
        if trace is None and any(c.needs_future for c in caches):
            trace = self.reference(prompts, max_new_tokens).trace
            caches = build(trace)
        for d, cache in zip(devs, caches):
            d.cache = cache
            if cache.needs_future:
                cache.attach_future(Future(trace.layer_slice(d.layers).steps(), d.geometry))
            if trace is not None:
                d.requests = trace.layer_slice(d.layers).requests
            template = self.store.layers[d.layers.start]
            d.pool = SlotPool(template, cache.capacity.total(d.geometry), d.device)
            d.copier = CudaCopier(d.device) if d.device.type == "cuda" else ThreadCopier(link.bandwidth, link.latency)
            d.views = _layer_views(self.experts_template, d.pool, cache.capacity, d.geometry.layers)
        self._want_scores = miss_mode is MissMode.SUBSTITUTE
        return devs

    def _request(
        self, p: Prompt, max_new_tokens: int, devs: list[_Device] | None, keep_logits: bool,
        full: bool = False, index: int = 0,
    ) -> tuple[RequestTiming, list[torch.Tensor], Request]:
        """One request: prefill, then greedy decode steps; records its routing rows. The step
        counter `_step` carries on from the caller's previous request."""
        from transformers import DynamicCache

        model = self.model
        device = self.devices[0]
        sync = _synchronizer(self.devices)
        self._run = devs
        self._stall = 0.0
        rows_k: list[np.ndarray] = []
        rows_w: list[np.ndarray] = []
        out_logits: list[torch.Tensor] = []
        latencies: list[float] = []
        stalls: list[float] = []
        tokens: list[int] = []
        start = time.perf_counter()
        with torch.inference_mode():
            if devs is not None:
                for d in devs:
                    req = d.requests[index] if d.requests is not None else RequestStart(p.text, p.task, len(p.ids))
                    for ld in d.cache.begin_request(req):
                        self._issue(d, ld)
            past = DynamicCache(config=model.config)
            ids = torch.tensor([p.ids], device=device)
            for n in range(max(max_new_tokens, 1)):
                self._prefill = n == 0
                t = time.perf_counter()
                stalled = self._stall
                out = model(input_ids=ids, cache=past, use_cache=True, output_router_logits=False)
                sync()
                now = time.perf_counter()
                if n:
                    latencies.append(now - t)
                    stalls.append(self._stall - stalled)
                else:
                    ttft = now - start
                self._step += 1
                rows_k.append(np.stack([r[0] for r in self._rows], axis=1))  # [T, L, k]
                rows_w.append(np.stack([r[1] for r in self._rows], axis=1))
                step_logits = out.logits[0] if full else out.logits[0, -1]
                if keep_logits:
                    out_logits.append(step_logits.detach().clone())
                nxt = int(out.logits[0, -1].argmax())
                tokens.append(nxt)
                if n + 1 >= max_new_tokens:
                    break
                ids = torch.tensor([[nxt]], device=device)
            if devs is not None:
                for d in devs:
                    d.cache.end_request()
        topk = np.concatenate(rows_k).astype(np.int16)
        weights = np.concatenate(rows_w).astype(np.float32)
        req = Request(topk, weights, prefill=len(p.ids), prompt=p.text, task=p.task)
        return RequestTiming(len(p.ids), tokens, ttft, latencies, self._stall, stalls), out_logits, req

    # ---- checks --------------------------------------------------------------------------

    def check_residency(self) -> None:
        """Every arrived resident expert's slot holds exactly that expert's weights, and no slot
        or expert is claimed twice (raises AssertionError otherwise). For tests: slow."""
        for d in self._run or ():
            holder = d.pool.holder
            claimed = [h for h in holder if h != -1]
            assert len(claimed) == len(set(claimed)), f"an expert sits in two slots: {holder}"
            for e in d.cache.resident:
                if d.cache.in_flight(e):
                    continue
                s = d.cache.slot(e)
                assert holder[s] == e, f"slot {s} holds {holder[s]}, cache says {e}"
                layer, x = divmod(e, self.geometry.experts)
                want = self.store.expert(d.layers.start + layer, x)
                for name, t in d.pool.row(s).items():
                    assert torch.equal(t.cpu(), want[name]), f"slot {s} does not hold expert {e}'s {name}"


def _decoder(model: Any) -> Any:
    return getattr(model, "model", model)


class Session:
    """One policy's state across requests: per-device caches, pools and copiers, the step
    counter, and what was measured so far. Sessions may alternate requests: `validate` pairs a
    policy with an all-resident baseline so that both see the same machine load."""

    def __init__(self, om: OffloadedModel, devs: list[_Device] | None) -> None:
        self.om = om
        self.devs = devs
        self.step = 0
        self.timings: list[RequestTiming] = []
        self.requests: list[Request] = []
        self.logits: list[list[torch.Tensor]] = []
        self.wall = 0.0

    def request(self, p: Prompt, max_new_tokens: int, keep_logits: bool = False) -> RequestTiming:
        if max_new_tokens < 1:
            raise BackendError("max_new_tokens must be >= 1")
        om = self.om
        om._step = self.step
        t0 = time.perf_counter()
        try:
            timing, logits, req = om._request(p, max_new_tokens, self.devs, keep_logits, index=len(self.requests))
        finally:
            om._run = None
        self.wall += time.perf_counter() - t0
        self.step = om._step
        self.timings.append(timing)
        self.requests.append(req)
        if keep_logits:
            self.logits.append(logits)
        return timing

    def result(self) -> RunResult:
        stats = [d.cache.stats() for d in self.devs] if self.devs else []
        meta = {"source": "casmoe.backends", "model": type(self.om.model).__name__}
        trace = Trace(self.om.geometry, list(self.requests), meta)
        return RunResult(list(self.timings), CacheStats.total(stats) if stats else None, stats, trace, list(self.logits), self.wall)

    def close(self) -> None:
        for d in self.devs or ():
            d.copier.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _layer_views(template: Any, pool: SlotPool, capacity: Capacity, layers: int) -> list[tuple[SlotView, int]]:
    """What each layer's experts function computes on: with per-layer capacity, only that
    layer's slots (the cache numbers them layer * slots ...), so its cost does not grow with the
    device's layer count; with one shared pool, all of it."""
    if not capacity.per_layer:
        whole = SlotView(template, pool.tensors)
        return [(whole, 0)] * layers
    c = capacity.slots
    return [
        (SlotView(template, {n: t[i * c : (i + 1) * c] for n, t in pool.tensors.items()}), i * c)
        for i in range(layers)
    ]


def _synchronizer(devices: Sequence[torch.device]) -> Callable[[], None]:
    cuda = [d for d in devices if d.type == "cuda"]
    if not cuda:
        return lambda: None
    return lambda: [torch.cuda.synchronize(d) for d in cuda] and None


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

"""One policy's run over requests (`Session`), its side of the decode loop (`_Passes`: cache
events around requests, the step counter, timings, routing rows, logits), and what it measured
(`RequestTiming`, `RunResult`). `OffloadedModel.session` builds one; without device runtimes a
session runs the un-offloaded reference. Each pass opens a `ForwardPass` on the model (its
devices, step, prefill or decode) and reads the routing back from it when the pass is done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch

from casmoe.cache import CacheStats, RequestStart
from casmoe.trace import Request, Trace

from casmoe.backends.copier import Ticket
from casmoe.backends.generate import forced, generate_tokens

if TYPE_CHECKING:  # annotations only: runtime.py imports this module
    from casmoe.backends.device import DeviceRuntime
    from casmoe.backends.hostcache import HostTier
    from casmoe.backends.runtime import OffloadedModel, Prompt

@dataclass
class RequestTiming:
    prompt_tokens: int
    new_tokens: list[int]
    ttft: float  # seconds from the request's (group's) start to its first generated token
    token_latency: list[float]  # seconds per decode step (shared by a batch's requests)
    stall: float  # seconds waiting for expert copies: its prefill's and its share of decode steps'
    token_stall: list[float] = field(default_factory=list)  # of which in each decode step


@dataclass
class RunResult:
    """What one run measured: timings per request, cache counters (summed over devices and per
    device, and the RAM tier's), the routing trace it recorded, optionally every step's output
    logits, and where the time went."""

    requests: list[RequestTiming]
    stats: CacheStats | None
    device_stats: list[CacheStats]
    trace: Trace
    logits: list[list[torch.Tensor]] = field(default_factory=list)
    wall: float = 0.0
    host_stats: CacheStats | None = None  # the RAM tier
    read_s: float = 0.0  # seconds reading the store (disk)
    host_expert_s: float = 0.0  # seconds computing experts on the host (cpu miss mode)
    decide_s: float = 0.0  # seconds in the cache's own decisions (`DecideCost`), every device

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
            "store_read_s": self.read_s,
            "host_expert_s": self.host_expert_s,
            "decide_s": self.decide_s,
        }
        if self.stats is not None:
            d.update({f"cache_{k}": v for k, v in self.stats.to_dict().items()})
        if self.host_stats is not None:
            d.update({f"ram_{k}": v for k, v in self.host_stats.to_dict().items()})
        return d


class Session:
    """One policy's state across requests: per-device runtimes, the RAM tier, the step counter,
    and what was measured so far. Sessions may alternate requests: `validate` pairs a policy
    with an all-resident baseline so that both see the same machine load."""

    def __init__(self, om: OffloadedModel, devs: list[DeviceRuntime] | None, host: HostTier | None = None,
                 want_scores: bool = False, gating: float | None = None) -> None:
        self.om = om
        self.devs = devs
        self.host = host
        self.want_scores = want_scores  # the substitute miss mode reads the router's scores
        self.gating = gating  # adaptive gating's threshold (`casmoe.gating`), None: the exact routing
        self.step = 0
        self.timings: list[RequestTiming] = []
        self.requests: list[Request] = []
        self.logits: list[list[torch.Tensor]] = []
        self.wall = 0.0

    def request(self, p: Prompt, max_new_tokens: int, keep_logits: bool = False) -> RequestTiming:
        self.serve([p], max_new_tokens, keep_logits)
        return self.timings[-1]

    def serve(self, prompts: Sequence[Prompt], max_new_tokens: int, keep_logits: bool = False, *, batch: int = 1,
              full: bool = False, follow: Sequence[Sequence[int]] | None = None) -> list[list[torch.Tensor]]:
        """Generate for `prompts`, `batch` at a time; returns their kept logits (each step's last
        position, or every position of a prefill with `full`); `generate_tokens` checks the arguments."""
        om = self.om
        hooks = _Passes(self, prompts, keep_logits or full, full)
        t0 = time.perf_counter()
        try:
            tokens = generate_tokens(om.model, [p.ids for p in prompts], max_new_tokens, batch=batch,
                                     device=om.devices[0], hooks=hooks, **({} if follow is None else {"pick": forced(follow)}))
        finally:
            if om.hooks.current is not None:  # a pass cut short (an exception): later forwards are not part of it
                om.close_pass()
        self.wall += time.perf_counter() - t0
        self.timings += [replace(t, new_tokens=new) for t, new in zip(hooks.timings, tokens)]
        self.requests += hooks.requests
        if keep_logits:
            self.logits += hooks.logits
        return hooks.logits

    def result(self) -> RunResult:
        stats = [d.cache.stats() for d in self.devs] if self.devs else []
        meta = {"source": "casmoe.backends", "model": type(self.om.model).__name__}
        trace = Trace(self.om.geometry, list(self.requests), meta)
        devs = self.devs or []
        return RunResult(list(self.timings), CacheStats.total(stats) if stats else None, stats, trace,
                         list(self.logits), self.wall, None if self.host is None else self.host.stats(),
                         sum(d.loader.read_s for d in devs), sum(d.host_s for d in devs),
                         sum(sum(d.decisions.seconds) for d in devs))

    def close(self) -> None:
        for d in self.devs or ():
            d.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Passes:
    """The session's side of the decode loop (`generate.Hooks`): cache events around requests,
    the step counter, timings, routing rows and logits of every pass."""

    def __init__(self, session: Session, prompts: Sequence[Prompt], keep: bool, full: bool) -> None:
        self.s = session
        self.prompts = prompts
        self.keep, self.full = keep, full
        self.first = len(session.requests)  # index of prompts[0] among the session's requests
        self.sync = _synchronizer(session.om.devices)
        n = len(prompts)
        self.rows: list[list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]] = [[] for _ in range(n)]
        self.logits: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.tokens = [0] * n
        self.ttft = [0.0] * n
        self.stall = [0.0] * n
        self.latency: list[list[float]] = [[] for _ in range(n)]
        self.token_stall: list[list[float]] = [[] for _ in range(n)]
        self.group_start = 0.0
        self._in_group = False
        self._pass: tuple[bool, tuple[int, ...], float, float] | None = None

    def _stalled(self) -> float:
        return sum(d.stall for d in self.s.devs or ())

    def begin(self, r: int) -> None:
        if not self._in_group:  # the first request of a group: the group arrives now
            self.group_start = time.perf_counter()
            self._in_group = True
        p = self.prompts[r]
        if self.s.devs is not None:
            for d in self.s.devs:
                known = d.requests[self.first + r] if d.requests is not None else None
                d.begin_request(known if known is not None else RequestStart(p.text, p.task, len(p.ids)))
        if self.s.host is not None:  # the RAM tier's own request-start prefetches, through device 0's loader
            for row, layer, index in self.s.host.begin_request(RequestStart(p.text, p.task, len(p.ids))):
                self.s.devs[0].loader.submit(Ticket(-1, -1, False, {}, 0, layer, index, ram=row, fill=True))

    def before(self, prefill: bool, requests: tuple[int, ...]) -> None:
        self.s.om.open_pass(self.s.devs, self.s.step, prefill, keep_scores=self.s.want_scores, gating=self.s.gating)
        self._pass = (prefill, requests, time.perf_counter(), self._stalled())

    def after(self, logits: torch.Tensor) -> None:
        self.sync()
        p = self.s.om.close_pass()
        prefill, requests, t0, stalled = self._pass
        now = time.perf_counter()
        stall = self._stalled() - stalled
        self.s.step += 1
        k, w = p.routing()  # [tokens, L, k]
        spec = p.live_spec()  # a speculative policy's live guesses, else None
        if prefill:
            (r,) = requests
            self.rows[r].append((k, w, spec))
            self.ttft[r] = now - self.group_start
            self.stall[r] += stall
            if self.keep:
                self.logits[r].append((logits[0] if self.full else logits[0, -1]).detach().clone())
            return
        for b, r in enumerate(requests):
            self.rows[r].append((k[b : b + 1], w[b : b + 1], None if spec is None else spec[b : b + 1]))
            self.latency[r].append(now - t0)
            self.token_stall[r].append(stall)
            self.stall[r] += stall / len(requests)
            if self.keep:
                self.logits[r].append(logits[b, -1].detach().clone())

    def end(self, r: int) -> None:
        self._in_group = False
        if self.s.devs is not None:
            for d in self.s.devs:
                d.end_request()
        if self.s.host is not None:
            self.s.host.end_request()

    @property
    def requests(self) -> list[Request]:
        out = []
        for p, rows in zip(self.prompts, self.rows):
            topk = np.concatenate([k for k, _, _ in rows]).astype(np.int16)
            weights = np.concatenate([w for _, w, _ in rows]).astype(np.float32)
            guessed = all(g is not None for _, _, g in rows)  # the live guesses, as `spec`
            spec = np.concatenate([g for _, _, g in rows]).astype(np.int16) if guessed else None
            out.append(Request(topk, weights, prefill=len(p.ids), prompt=p.text, task=p.task, spec=spec))
        if any(r.spec is None for r in out):
            for r in out:
                r.spec = None
        return out

    @property
    def timings(self) -> list[RequestTiming]:
        return [RequestTiming(len(p.ids), [], self.ttft[i], self.latency[i], self.stall[i], self.token_stall[i])
                for i, p in enumerate(self.prompts)]


def _synchronizer(devices: Sequence[torch.device]) -> Callable[[], None]:
    cuda = [d for d in devices if d.type == "cuda"]
    if not cuda:
        return lambda: None
    return lambda: [torch.cuda.synchronize(d) for d in cuda] and None

"""Speculative expert loading: prefetch the experts the next router picks from the hidden state.

The signal of Mixtral-Offloading's speculative expert loading (Eliseev & Mazur 2023,
arXiv 2312.17238, code dvmazur/mixtral-offloading: "apply the next layer's gating function to
the previous layer's hidden states") and of Pre-gated MoE (Hwang et al. 2024, arXiv 2308.12066,
a router trained to pick layer l+1's experts at layer l). A trace recorded with
`casmoe record --spec` holds it as `spec[t, l]`: the experts layer l+1's router picks from the
output of layer l (through layer l+1's pre-MoE norm; casmoe/backends/record.py).

Modelled: when layer l-1 is done its output is known, so as layer l is about to run the policy
prefetches `spec[t, l-1]` (its first `experts` ids) for layer l; the copy overlaps layer l's
dense part (attention), the only compute between the signal and its use. Layer 0 has no guess
(its input is the next token's embedding). A live backend (casmoe/backends/runtime.py) computes the
same guess as the model runs, layer l's router on layer l-1's output, and hands it in (`guess`). A prefill step prefetches, per layer, the guesses of
its prompt tokens most often named first, up to the pool's slots. Residents are replaced in LRU
order, and a guessed resident counts as just used, so a guess never evicts another guess.

Deeper guesses (`ahead` > 1 prefetches layers l+1 .. l+ahead-1 too) are the spec guess chained
through the model's layer-to-layer transitions: counts of (expert at layer j, expert at layer
j+1) over the decode tokens served so far, learned online (no future is read); the `experts`
most co-routed with the previous depth's guess are fetched.

Both runtimes read the guesses from one table per request (`_guesses`, a CSR over the
request's (step, layer) visits), built when the request starts: the Python hook reads its row,
and the compiled twin (LRU's order with `TwinState.guess_rows`) gets the same table. Deeper
guesses (`ahead` > 1) learn as the request runs, so that form runs only in Python.

Not modelled: Mixtral-Offloading's mixed quantisation and its per-layer LRU of fixed size (the
slot count here is `--capacity`), Pre-gated MoE's retrained pre-gate (its accuracy differs from
this recorded signal), and guessing layer l+1 *while* layer l's experts run (that needs layer
l+1's router applied to layer l's input, which traces do not record).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from casmoe.cache import CacheConfigError, ExpertCache
from casmoe.geometry import ExpertId
from casmoe.policies.lru import LRU, least_recent
from casmoe.trace import Trace
from casmoe.twin import Guesses, Twin, TwinState, beyond_guesses


class Speculative(LRU):
    name = "speculative"
    summary = ("loads the experts the next router picks from this layer's output "
               "(Mixtral-Offloading, Pre-gated MoE)")

    def __init__(self, *args, spec: dict[int, np.ndarray] | None = None, experts: int | None = None,
                 ahead: int = 1, **kw) -> None:
        super().__init__(*args, **kw)
        g = self.geometry
        self.n = g.top_k if experts is None else experts
        if not 1 <= self.n <= g.top_k:
            raise CacheConfigError(f"speculative experts must lie in [1, {g.top_k}] (the router's top-k), got {self.n}")
        if ahead < 1:
            raise CacheConfigError(f"speculative ahead must be >= 1 layer, got {ahead}")
        self.ahead = ahead
        self._spec_of = spec or {}  # id(request) -> its spec [T, L, k]
        self._table: Guesses | None = None  # the running request's guesses (`_guesses`)
        self._prefill = 0
        self._first_step = -1
        self._active = False
        self._live: dict[int, np.ndarray] = {}  # layer -> [tokens, k] guess handed in by a live runtime
        self._pairs = np.zeros((max(g.layers - 1, 0), g.experts, g.experts)) if ahead > 1 else None
        self._routed_prev: tuple[int, list[int]] = (-1, [])  # (layer, local ids) of this decode step

    @classmethod
    def create(cls, geometry, capacity, *, trace: Trace | None = None, **kw: Any) -> ExpertCache:
        """The guesses come from `trace`'s recorded `spec`; without a trace (a live backend) the
        runtime hands them in through `guess`."""
        spec = None
        if trace is not None:
            if trace.requests and trace.requests[0].spec is None:
                raise CacheConfigError(
                    "speculative needs the trace's spec array (the next layer's guess); record it with `casmoe record --spec`"
                )
            spec = {id(r): r.spec for r in trace.requests}
        return cls(geometry, capacity, spec=spec, **kw)

    # ---- where the running request is -----------------------------------------------------

    def request_view(self, request):
        if self._active:
            raise CacheConfigError("speculative follows one request at a time (batch 1): each step must be one request's")
        self._active = True
        self._prefill = getattr(request, "prefill", 0)
        spec = self._spec_of.get(id(request))
        self._table = None if spec is None else self._guesses(spec)
        self._first_step = -1
        return super().request_view(request)

    def on_request_end(self) -> None:
        self._active = False
        self._table = None
        self._live.clear()

    # ---- the compiled twin ------------------------------------------------------------------

    def _twin_runs(self) -> bool:
        """Deeper guesses learn from the routing as it runs: Python only."""
        return self.ahead == 1

    def _twin_state(self) -> TwinState:
        g = self.geometry
        width = min(self.capacity.slots, g.experts)  # most a row guesses: a prefill's (`_ranked`)
        tokens = max((len(spec) for spec in self._spec_of.values()), default=0)  # a request's steps <= its tokens
        return TwinState(guess_rows=max(tokens * g.layers, 1), guess_ids=tokens * g.layers * self.n + g.layers * width,
                         guess_width=width)

    def _twin_guesses(self) -> Guesses | None:
        return self._table

    # LRU's order, with the request's guesses before each layer
    twin = Twin(least_recent, state=_twin_state, request_guesses=_twin_guesses, runs=_twin_runs)

    def guess(self, layer: int, rows: np.ndarray) -> None:
        """A live runtime's guess of `layer`'s experts: [tokens, k] local ids (best first per
        token), its router applied to the previous layer's output as the model runs: what
        `spec` records. It wins over the trace's `spec` for the layer about to run."""
        self._live[layer] = np.asarray(rows).reshape(-1, np.asarray(rows).shape[-1])

    # ---- the guesses ------------------------------------------------------------------------

    def _guesses(self, spec: np.ndarray) -> Guesses:
        """The running request's guess of every visit, from its `spec` [T, L, k]: row
        `j * L + layer` for its `j`-th step (the prefill, if any, then one per decode token);
        layer 0 guesses nothing (its input is the next token's embedding)."""
        L, n, P = self.geometry.layers, self.n, self._prefill
        dec = np.full((len(spec) - P, L, n), -1, np.int64)  # [decode tokens, L, n]: layer l's guess, layer l-1's spec
        dec[:, 1:] = spec[P:, :-1, :n]
        keep = dec >= 0
        lens, ids = keep.sum(axis=2).ravel(), dec[keep]  # one token's guess as given (`_ranked`)
        if P:
            first = [[]] + [self._ranked(spec[:P, layer - 1, :n]) for layer in range(1, L)]
            lens = np.concatenate([np.array([len(f) for f in first], np.int64), lens])
            ids = np.concatenate([np.array([e for f in first for e in f], np.int64), ids])
        ptr = np.zeros(len(lens) + 1, np.int64)
        np.cumsum(lens, out=ptr[1:])
        return Guesses(ptr, ids)

    def _spec_guess(self, step: int, layer: int) -> list[int]:
        """Local ids guessed for `layer` from layer-1's output, best first: a live runtime's,
        or the table's row for the running step (counted from the first step a guess is read at)."""
        if layer in self._live:
            return self._ranked(self._live.pop(layer)[:, : self.n])
        table = self._table
        if table is None or layer == 0:
            return []
        if self._first_step < 0:
            self._first_step = step
        row = (step - self._first_step) * self.geometry.layers + layer
        if row >= table.rows:
            raise beyond_guesses(self.name, step)
        return table.ids[table.ptr[row] : table.ptr[row + 1]].tolist()

    def _ranked(self, rows: np.ndarray) -> list[int]:
        """One token's guess as given; a prefill's, its tokens' guesses most often named first,
        up to the pool's slots."""
        if len(rows) == 1:
            return [int(e) for e in rows[0] if e >= 0]
        ids = rows[rows >= 0].astype(np.int64)
        if ids.size == 0:
            return []
        counts = np.bincount(ids, minlength=self.geometry.experts)
        order = np.argsort(-counts, kind="stable")
        return [int(e) for e in order[: self.capacity.slots] if counts[e] > 0]

    def prefetch_layer(self, step: int, layer: int) -> list[ExpertId]:
        g = self.geometry
        E = g.experts
        guess = self._spec_guess(step, layer)
        out = [layer * E + e for e in guess]
        if self._pairs is not None:
            for deeper in range(layer + 1, min(layer + self.ahead, g.layers)):
                if not guess:
                    break
                score = self._pairs[deeper - 1][guess].sum(axis=0)
                order = np.argsort(-score, kind="stable")[: self.n]
                guess = [int(e) for e in order if score[e] > 0]
                out += [deeper * E + e for e in guess]
        order_of = self._order_of
        for e in out:  # a guessed resident is wanted now: it must not make room for another guess
            if e in order_of[e]:
                order_of[e].move_to_end(e)
        return out

    def route(self, step, layer, experts, scores=None):
        if self._pairs is not None and len(experts) <= self.geometry.top_k:  # a decode token's layer
            E = self.geometry.experts
            local = [e - layer * E for e in experts]
            prev_layer, prev = self._routed_prev
            if prev_layer == layer - 1 and prev:
                self._pairs[layer - 1][np.ix_(prev, local)] += 1.0
            self._routed_prev = (layer, local)
        return super().route(step, layer, experts, scores)

"""One forward pass's context (`ForwardPass`) and the router hooks that fill it (`RouterHooks`).

Whoever drives the decode loop (a `Session` serving a policy, the recorder) opens a
`ForwardPass` on the model before each pass and reads it back after. Going in, it says which
device runtimes compute the experts (none: the un-offloaded reference), the step number, whether
the pass is a prefill, and what to keep. Coming back, it holds what every MoE layer's router
chose, exactly as the model applies it (ids and weights [tokens, k]), and what was asked for:
router logits, the router's mean expert probabilities (the substitute miss mode reads them),
each MoE layer's output hidden state (for the next layer's speculative guess), and the live
guesses a speculative policy took. Nothing else carries a pass's state.

`RouterHooks` are the forward hooks on every MoE block's router (and, when hidden states are
wanted, on its decoder layer) that write into the open pass: serving and recording capture
routing through the same hooks, once. `router_pick` is the one definition of the speculative
guess, for the recorder's `spec` and a speculative policy's live guess alike.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import torch

from casmoe.trace import NOT_COMPUTED

from casmoe.backends.experts import MoEBlock

if TYPE_CHECKING:  # annotations only
    from casmoe.backends.device import DeviceRuntime


@dataclass
class ForwardPass:
    """What one pass is told (`devices`, `step`, `prefill`, the `keep_*` flags) and what the
    router hooks leave in it, per MoE layer (`None` until the layer ran)."""

    layers: int
    devices: Sequence[DeviceRuntime] | None = None  # None: the reference (experts from the store)
    step: int = 0
    prefill: bool = False
    keep_scores: bool = False  # router probabilities, averaged over the pass's tokens [E]
    keep_logits: bool = False  # full router logits [tokens, E]
    keep_hidden: bool = False  # each MoE layer's decoder-layer output (needs RouterHooks(hidden=True))
    gating: float | None = None  # adaptive gating threshold (casmoe.gating); None: the exact routing
    topk: list[np.ndarray | None] = field(init=False)  # [tokens, k] expert ids
    weights: list[np.ndarray | None] = field(init=False)  # [tokens, k] float32 router weights
    logits: list[np.ndarray | None] = field(init=False)
    scores: list[np.ndarray | None] = field(init=False)
    hidden: list[torch.Tensor | None] = field(init=False)
    guesses: list[np.ndarray | None] = field(init=False)  # [tokens, k]: layer l's guess, made before it
    router_calls: int = 0

    def __post_init__(self) -> None:
        for name in ("topk", "weights", "logits", "scores", "hidden", "guesses"):
            setattr(self, name, [None] * self.layers)

    def routing(self) -> tuple[np.ndarray, np.ndarray]:
        """The pass's routing as a trace stores it: ids and weights [tokens, L, k]."""
        return np.stack(self.topk, axis=1), np.stack(self.weights, axis=1)

    def live_spec(self) -> np.ndarray | None:
        """[tokens, L, k] of the live guesses, as `spec` stores them (row l: layer l+1's guess;
        NOT_COMPUTED where none was made), or None when the policy took no guesses."""
        made = [(layer, g) for layer, g in enumerate(self.guesses) if g is not None]
        if not made:
            return None
        first = made[0][1]
        spec = np.full((len(first), self.layers, first.shape[1]), NOT_COMPUTED, dtype=np.int64)
        for layer, g in made:
            spec[:, layer - 1] = g
        return spec


class RouterHooks:
    """Forward hooks on every MoE block's router (and with `hidden`, its decoder layer) that
    fill the open `ForwardPass`; a router call outside a pass, or `paused`, is not recorded."""

    def __init__(self, model: Any, blocks: Sequence[MoEBlock], hidden: bool = False) -> None:
        self.current: ForwardPass | None = None
        self._paused = False
        decoder = getattr(model, "model", model).layers
        self._handles = [b.gate.register_forward_hook(self._on_router(i)) for i, b in enumerate(blocks)]
        if hidden:
            self._handles += [decoder[b.decoder_index].register_forward_hook(self._on_layer(i))
                              for i, b in enumerate(blocks)]

    def open(self, p: ForwardPass) -> ForwardPass:
        self.current = p
        return p

    def close(self) -> ForwardPass:
        p, self.current = self.current, None
        if p is None:
            raise RuntimeError("no forward pass is open")
        return p

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Router calls that are not the layer's routing (a speculative guess)."""
        was, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = was

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _on_router(self, layer: int) -> Any:
        def hook(module: Any, args: Any, out: Any) -> None:
            p = self.current
            if p is None or self._paused:
                return
            logits, weights, indices = out  # [T, E], [T, k], [T, k]: what the block hands its experts
            p.router_calls += 1
            p.topk[layer] = indices.cpu().numpy()
            p.weights[layer] = weights.detach().float().cpu().numpy()
            if p.keep_logits:
                p.logits[layer] = logits.detach().float().cpu().numpy()
            if p.keep_scores:  # [T, E] router logits -> mean probability per expert
                p.scores[layer] = torch.softmax(logits.float(), dim=-1).mean(0).cpu().numpy()

        return hook

    def _on_layer(self, layer: int) -> Any:
        def hook(module: Any, args: Any, out: Any) -> None:
            p = self.current
            if p is not None and p.keep_hidden:
                p.hidden[layer] = out[0] if isinstance(out, tuple) else out

        return hook


def router_pick(model: Any, block: MoEBlock, hooks: RouterHooks, hidden: torch.Tensor) -> np.ndarray:
    """[tokens, k]: the experts `block`'s router picks from `hidden` (an earlier layer's output)
    through its decoder layer's pre-MoE norm, the router's training input: the speculative guess.
    The call is not the layer's routing, so the hooks do not record it."""
    layer = getattr(model, "model", model).layers[block.decoder_index]
    norm = getattr(layer, "post_attention_layernorm", torch.nn.Identity())
    with hooks.paused(), torch.no_grad():
        picked = block.gate(norm(hidden.reshape(-1, hidden.shape[-1])))[2]
    return picked.cpu().numpy()

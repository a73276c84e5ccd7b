"""The decode loop: prefill and decode passes over a transformers causal LM, for every runtime
that generates (the offloaded model, its un-offloaded reference, `bench --verify`).

Requests run in groups with the simulator's batch semantics (`Trace.steps(batch)`): each request
of a group prefills alone (one pass over its prompt), then the group decodes together, one pass
per new token in which every request contributes its last token. Decoding together needs one KV
cache: the requests' own caches, left-padded to the longest and stacked, with an attention mask
that hides the padding and each row's own positions. A group of one is plain
`model(input_ids, cache)`, step after step.

`Hooks` let a runtime act around each pass (cache events, timing, routing rows, logits) without
owning the loop; `pick` chooses the next tokens (greedy by default; `forced` replays given ones).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import torch

from casmoe.errors import CasmoeError


class GenerateError(CasmoeError, ValueError):
    """A request or model the loop cannot run (empty prompt, unsupported cache layout, ...)."""


class Hooks(Protocol):
    def begin(self, request: int) -> None:
        """Request `request` (index into the prompts) is about to prefill."""

    def before(self, prefill: bool, requests: tuple[int, ...]) -> None:
        """A pass over `requests` (one prefill, or one decode token each) is about to run."""

    def after(self, logits: torch.Tensor) -> None:
        """The pass ran: its logits [B, T, V]."""

    def end(self, request: int) -> None:
        """Request `request` generated its last token."""


Pick = Callable[[torch.Tensor, tuple[int, ...], int], list[int]]
"""(last logits [B, V], requests, new-token number) -> the next token of each request."""


def greedy(logits: torch.Tensor, requests: tuple[int, ...], n: int) -> list[int]:
    return logits.argmax(-1).tolist()


def forced(tokens: Sequence[Sequence[int]]) -> Pick:
    """Replay given tokens (`tokens[request][n]`) instead of choosing: a reference run that
    follows another run's choices, pass for pass."""
    return lambda logits, requests, n: [tokens[r][n] for r in requests]


def generate_tokens(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, batch: int = 1,
             device: torch.device | str = "cpu", hooks: Hooks | None = None, pick: Pick = greedy,
             stop: Sequence[int] = ()) -> list[list[int]]:
    """Generate up to `max_new_tokens` tokens for every prompt, `batch` requests at a time;
    returns the new tokens per prompt. A request that produces a token in `stop` (end of text)
    is done and leaves its group, as in the simulator's batches. The last token needs no pass."""
    if max_new_tokens < 1 or batch < 1:
        raise GenerateError("max_new_tokens and batch must be >= 1")
    if any(not p for p in prompts):
        raise GenerateError("every prompt needs at least one token")
    out: list[list[int]] = []
    with torch.inference_mode():
        for start in range(0, len(prompts), batch):
            group = tuple(range(start, min(start + batch, len(prompts))))
            out += _group(model, prompts, group, max_new_tokens, torch.device(device), hooks, pick, set(stop))
    return out


def _group(model: Any, prompts: Sequence[Sequence[int]], group: tuple[int, ...], max_new_tokens: int,
           device: torch.device, hooks: Hooks | None, pick: Pick, stop: set[int]) -> list[list[int]]:
    from transformers import DynamicCache

    caches, tokens = [], {}
    for r in group:
        if hooks is not None:
            hooks.begin(r)
            hooks.before(True, (r,))
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=torch.tensor([list(prompts[r])], device=device), cache=cache, use_cache=True).logits
        if hooks is not None:
            hooks.after(logits)
        caches.append(cache)
        tokens[r] = pick(logits[:, -1], (r,), 0)
    live = group
    lengths = [len(prompts[r]) for r in group]
    cache, mask = (caches[0], None) if len(group) == 1 else _stack(caches, lengths, device)
    positions = torch.tensor(lengths, device=device)[:, None]  # [B, 1]
    for n in range(1, max_new_tokens):
        keep = [i for i, r in enumerate(live) if tokens[r][-1] not in stop]
        if len(keep) < len(live):
            if hooks is not None:
                for i, r in enumerate(live):
                    if i not in keep:
                        hooks.end(r)
            if not keep:
                return [tokens[r] for r in group]
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            mask, positions = mask[index], positions[index]
            live = tuple(live[i] for i in keep)
        if hooks is not None:
            hooks.before(False, live)
        ids = torch.tensor([tokens[r][-1:] for r in live], device=device)  # [B, 1]
        if mask is None:
            logits = model(input_ids=ids, cache=cache, use_cache=True).logits
        else:
            mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
            logits = model(input_ids=ids, cache=cache, use_cache=True, attention_mask=mask,
                           position_ids=positions).logits
            positions = positions + 1
        if hooks is not None:
            hooks.after(logits)
        for r, x in zip(live, pick(logits[:, -1], live, n)):
            tokens[r].append(x)
    if hooks is not None:
        for r in live:
            hooks.end(r)
    return [tokens[r] for r in group]


def step_logits(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, batch: int = 1,
                device: torch.device | str = "cpu") -> list[list[torch.Tensor]]:
    """Each request's last-position logits at every step, greedy: how a plain (un-offloaded)
    model decodes under the same schedule, the reference the offloaded runs are held to."""
    out: list[list[torch.Tensor]] = [[] for _ in prompts]

    class Keep:
        def begin(self, r: int) -> None:
            pass

        def before(self, prefill: bool, requests: tuple[int, ...]) -> None:
            self.requests = requests

        def after(self, logits: torch.Tensor) -> None:
            for b, r in enumerate(self.requests):
                out[r].append(logits[b, -1].clone())

        def end(self, r: int) -> None:
            pass

    generate_tokens(model, prompts, max_new_tokens, batch=batch, device=device, hooks=Keep())
    return out


def _stack(caches: list[Any], lengths: list[int], device: torch.device) -> tuple[Any, torch.Tensor]:
    """One cache for the group: each request's keys and values left-padded to the longest
    prompt and stacked along the batch; the mask [B, P] hides the padding."""
    longest = max(lengths)
    target = caches[0]
    for i, layer in enumerate(target.layers):
        if type(layer).__name__ != "DynamicLayer":
            raise GenerateError(f"decoding several requests together needs plain KV cache layers, not "
                                f"{type(layer).__name__} (sliding-window attention); use --batch 1")
        for name in ("keys", "values"):
            parts = [getattr(c.layers[i], name) for c in caches]
            padded = [torch.nn.functional.pad(p, (0, 0, longest - p.shape[-2], 0)) for p in parts]
            setattr(layer, name, torch.cat(padded, dim=0))
    mask = torch.tensor([[0] * (longest - n) + [1] * n for n in lengths], device=device)
    return target, mask

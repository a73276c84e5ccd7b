"""Train the shipped tiny MoE models from random init on the shipped corpus.

No checkpoint can be downloaded here, so casmoe makes its own: transformers' own Mixtral and
OLMoE classes at the routing shapes of Mixtral-8x7B (32 layers, 8 experts, top-2) and
OLMoE-1B-7B (16 layers, 64 experts, top-8), with narrow hidden sizes so that CPU training takes
minutes and the weights stay small. Router load-balancing loss is on, so routing is spread over
experts the way a real MoE's is. Everything is seeded: `casmoe train-tiny NAME` reproduces them.

The load-balancing loss is Switch Transformer's, E * sum_i f_i P_i, taken per MoE layer and
averaged over layers (`layer_balance_loss`), counting loads over the whole batch or per training
row (DeepSeek-V3's sequence-wise balance), as each model's recipe (`RECIPES`) says. Why not transformers'
own `load_balancing_loss_func`: it pools the router outputs of all layers, so it balances
expert *index* i over the whole stack, and each layer may keep one hot expert as long as
different layers pick different ones; the first tiny models trained with it sent 38% of a
layer's top-2 slots to one expert, and consecutive tokens of real text reused the same expert
pair 37% of the time. Balanced per layer over a batch, a layer may still route by topic (every
token of a text to the same experts); balanced per row, it must route by token. `--balance
global` counts the loads over the last `balance_window` batches (Qwen's global-batch balance,
arXiv 2501.11873) for models meant to keep a request on its experts; bench/RESULTS.md ("How the
training recipe was chosen") has what it did. `--locality-coef` adds a named, training-time-only term
(`routing_drift_loss`: the router probability mass that moves between consecutive tokens of a
text) for routing that keeps consecutive tokens on their experts, and `--concentration-coef` a
second (`request_concentration_loss`: how evenly a text spreads over a layer's experts) for
routing that keeps a request on few experts; `RECIPES` says which shipped
model uses it and bench/RESULTS.md measures it in the ablation. DeepSeek-V3's auxiliary-loss-free bias is not offered: it biases
the router's scores for selection only, which transformers' Mixtral and OLMoE routers cannot
hold, so such a model would not load in the classes the backend runs.
"""

from __future__ import annotations

import enum
import json
import math
import platform
import time
from collections import deque
from dataclasses import asdict, dataclass, replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from casmoe.backends.corpus import HELDOUT, TRAIN, CorpusEntry, load_corpus
from casmoe.errors import CasmoeError
from casmoe.folder import check_folder_target, write_folder
from casmoe.output import write_text

VOCAB_SIZE = 4096
EOS = "<|endoftext|>"
EOS_ID = 0  # the tokenizer's first special token; the config's bos/eos/pad id
MODEL_FOLDER = "casmoe-tiny-model"
"""The kind of folder `train_tiny` writes (casmoe/folder.py), with config.json as its legacy marker."""

# name -> (transformers config class name, config kwargs). Shapes: see the module docstring.
TINY_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny-mixtral": ("MixtralConfig", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=32, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
        router_aux_loss_coef=0.15)),
    "tiny-olmoe": ("OlmoeConfig", dict(
        hidden_size=64, intermediate_size=32, num_hidden_layers=16, num_attention_heads=4,
        num_key_value_heads=4, num_experts=64, num_experts_per_tok=8,
        router_aux_loss_coef=0.15)),
}


class Balance(str, enum.Enum):
    """Over which tokens a layer's load-balancing loss counts expert loads."""

    SEQUENCE = "sequence"  # each training row alone: balanced within a text
    BATCH = "batch"  # the whole batch (Switch Transformer's): a layer may route by topic
    GLOBAL = "global"  # the last `balance_window` batches together (Qwen's global-batch balance)


@dataclass(frozen=True)
class Recipe:
    """How a shipped tiny model was trained where its models differ (the load-balancing
    coefficient is the config's `router_aux_loss_coef`, in `TINY_MODELS`)."""

    steps: int
    balance: Balance
    locality_coef: float  # `routing_drift_loss`'s coefficient (0: not used)
    concentration_coef: float = 0.0  # `request_concentration_loss`'s coefficient (0: not used)


RECIPES: dict[str, Recipe] = {
    "tiny-mixtral": Recipe(steps=800, balance=Balance.BATCH, locality_coef=0.5),
    "tiny-olmoe": Recipe(steps=800, balance=Balance.BATCH, locality_coef=0.5),
}
"""Each shipped model's recipe, chosen by the ablation in bench/RESULTS.md ("How the training
recipe was chosen"): balance over the batch of 16 mixed-task rows rather than per row (per-row
balance forces every text onto all experts evenly), the routing-drift term for temporal
locality, and twice the steps of the first models, which buys back the drift term's perplexity.
The balance coefficient (`TINY_MODELS`' `router_aux_loss_coef`) is 0.15, not the 0.1 the models
shipped before had: the 0.1 recipe, which had reproduced tiny-mixtral byte for byte in one
session, gave other weights in the next (the same first loss, another final one; the old models'
environment was not recorded) and those let one expert take 2.62-2.64x its fair share of the
trace (over the 2.5x target); 0.15 keeps both models balanced (2.18 / 2.42) at little cost
(bench/RESULTS.md, "The shipped tiny models")."""


@dataclass(frozen=True)
class TrainSettings:
    """How a tiny model is trained; the defaults are what the shipped models used."""

    steps: int | None = None  # None: the model's own (`RECIPES`)
    batch: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    warmup: int = 20
    seed: int = 0
    threads: int = 1
    balance: Balance | None = None  # None: the model's own (`RECIPES`)
    balance_window: int = 8  # Balance.GLOBAL: batches whose expert loads count together
    balance_coef: float | None = None  # None: the model's config's `router_aux_loss_coef` (`TINY_MODELS`)
    locality_coef: float | None = None  # None: the model's own (`RECIPES`); see `routing_drift_loss`
    concentration_coef: float | None = None  # None: the model's own; see `request_concentration_loss`


@dataclass(frozen=True)
class TrainResult:
    """What a training run measured (also written as `train.json` beside the weights)."""

    name: str
    params: int
    train_tokens: int
    steps: int
    seconds: float
    first_loss: float
    final_loss: float
    heldout_loss: float
    heldout_perplexity: float
    weights_bytes: int
    settings: dict[str, Any]
    environment: dict[str, str]  # what the weights' arithmetic depended on (`training_environment`)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def training_environment() -> dict[str, str]:
    """What a training run's arithmetic depends on beyond its settings: the libraries' versions
    and the CPU kernels torch dispatches to. Why it is recorded: on one machine the same recipe
    and seed give the same weights byte for byte (tests/backends/test_train.py), but the shipped
    tiny-olmoe's recipe gave three different models on three days (held-out perplexity
    98.79, 99.89, 99.95; bench/RESULTS.md, "The shipped tiny models"): float rounding differs between library
    versions and between CPU kernels (AVX2, AVX-512), and 800 steps amplify it. So a claim that
    `casmoe train-tiny NAME` reproduces a shipped model holds where this environment matches the
    one its `train.json` records (`environment_differences`)."""
    import torch

    env = {lib: version(lib) for lib in ("torch", "transformers", "tokenizers", "numpy")}
    env["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    env["machine"] = platform.machine()
    return env


def environment_differences(recorded: dict[str, str] | None) -> list[str]:
    """How this environment differs from a recorded one ("transformers 5.24.0 here, 5.25.0
    recorded"); everything, when nothing was recorded."""
    here = training_environment()
    if not recorded:
        return ["the shipped model's train.json records no environment"]
    return [f"{key} {here.get(key)} here, {value} recorded" for key, value in recorded.items() if here.get(key) != value]



def reproduction(name: str, folder: Path | str, shipped: Path | str) -> str:
    """One line on whether the model `train-tiny NAME` wrote to `folder` is the shipped model
    in `shipped` byte for byte and, where it is not, which recorded part of the environment
    differs (`environment_differences`) or that the settings were not the recipe's."""
    folder, shipped = Path(folder), Path(shipped)
    if folder.resolve() == shipped.resolve():
        return f"wrote the shipped {name} model itself ({folder})"
    if not (shipped / "model.safetensors").is_file():
        return f"no shipped {name} model at {shipped} to compare with"
    if (folder / "model.safetensors").read_bytes() == (shipped / "model.safetensors").read_bytes():
        return f"the weights equal the shipped {name} model's byte for byte"
    mine = json.loads((folder / "train.json").read_text())
    theirs = json.loads((shipped / "train.json").read_text())
    if mine.get("settings") != theirs.get("settings"):
        return f"the weights differ from the shipped {name} model's: other settings than its recipe"
    why = environment_differences(theirs.get("environment"))
    return (f"the weights differ from the shipped {name} model's at the float level: "
            + ("; ".join(why) if why else "the same recorded environment (an unrecorded difference, e.g. the CPU)"))

def train_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE):
    """Byte-level BPE on the given texts, wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS,
                                   pad_token=EOS)


def model_config(name: str, vocab_size: int = VOCAB_SIZE):
    """The transformers config of a tiny model (random-init shape only)."""
    import transformers

    if name not in TINY_MODELS:
        raise CasmoeError(f"unknown tiny model {name!r}; choose from {', '.join(TINY_MODELS)}")
    cls_name, kwargs = TINY_MODELS[name]
    return getattr(transformers, cls_name)(
        vocab_size=vocab_size, max_position_embeddings=1024, tie_word_embeddings=True,
        output_router_logits=True, bos_token_id=EOS_ID, eos_token_id=EOS_ID, pad_token_id=EOS_ID, **kwargs)


def pack(tokenizer, prompts: list[CorpusEntry], seq_len: int):
    """One token stream (each text followed by EOS) cut into rows of seq_len: [N, seq_len]."""
    import torch

    ids: list[int] = []
    for p in prompts:
        ids += tokenizer(p.document)["input_ids"] + [tokenizer.eos_token_id]
    n = len(ids) // seq_len
    return torch.tensor(ids[: n * seq_len], dtype=torch.long).view(n, seq_len)


def mean_loss(model, rows, batch: int = 32) -> float:
    """Mean next-token cross-entropy (nats) over packed rows, without the router loss."""
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(rows), batch):
            x = rows[i:i + batch]
            logits = model(input_ids=x, output_router_logits=False).logits[:, :-1]
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1), reduction="sum")
            total += float(loss)
            count += x[:, 1:].numel()
    return total / count


def _lr_at(step: int, s: TrainSettings) -> float:
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    frac = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def expert_counts(router_logits, top_k: int):
    """Top-k assignments per MoE layer and expert of one batch: [L, E] (no gradient)."""
    import torch

    with torch.no_grad():
        return torch.stack([torch.zeros_like(z, dtype=torch.float32).scatter_(
            1, z.topk(top_k, dim=-1).indices, 1.0).sum(0) for z in router_logits])


def layer_balance_loss(router_logits, top_k: int, sequences: int = 1, loads=None):
    """Switch Transformer's load-balancing loss E * sum_i f_i P_i (f_i: share of the top-k
    assignments that go to expert i, summing to k; P_i: mean router probability of i), taken
    per MoE layer and per sequence (each layer's [sequences * T, E] logits are cut into
    `sequences` equal groups, DeepSeek-V3's sequence-wise balance) and averaged: k when every
    layer routes every sequence uniformly.

    `loads` ([L, E], each row summing to k) replaces the batch's own f with loads counted over
    more tokens than the batch holds: Qwen's global-batch balance ("Demons in the Detail",
    arXiv 2501.11873), where f comes from the whole global batch and P from the micro-batch, so
    a micro-batch of one domain may route all its tokens to that domain's experts as long as
    the global batch spreads them."""
    import torch

    losses = []
    for layer, z in enumerate(router_logits):  # one [sequences * T, E] per MoE layer
        probs = torch.softmax(z.float(), dim=-1).reshape(sequences, -1, z.shape[-1])  # [S, T, E]
        if loads is None:
            f = torch.zeros_like(probs).scatter_(2, probs.topk(top_k, dim=-1).indices, 1.0).mean(1)
        else:
            f = loads[layer][None]  # [1, E]
        losses.append(z.shape[-1] * (f * probs.mean(1)).sum(-1))  # [S]
    return torch.stack(losses).mean()


def routing_drift_loss(router_logits, rows) -> Any:
    """How far each token's router distribution moves from the previous token's: the total
    variation 1/2 * sum_e |p_t(e) - p_t-1(e)| (the router probability mass that must move, in
    [0, 1]), averaged over MoE layers and over the consecutive pairs of each row that lie in one
    document (a pair whose earlier token is EOS starts a new text and is not counted).

    Why a model is trained with it (`TrainSettings.locality_coef`, `--locality-coef`): a tiny
    model's router reads a residual stream dominated by the current token's embedding, so it
    routes by token, and consecutive tokens keep no more experts than the request's own mix in
    shuffled order would (bench/RESULTS.md, "How the training recipe was chosen"), where real MoEs repeat their experts over
    consecutive tokens well above that (Mixtral, arXiv 2401.04088 section 5; the local routing
    consistency of arXiv 2505.16056). The term rewards a router that follows the context, the
    temporal counterpart of the cross-layer coupling loss of arXiv 2602.14159 (which rewards
    adjacent *layers* for agreeing on experts). It is training-time only: the model stays a plain
    transformers Mixtral/OLMoE at inference, and its routing is whatever the router learned."""
    import torch

    batch, seq = rows.shape
    same_text = (rows[:, :-1] != EOS_ID).float()  # [B, T-1]: pair (t-1, t) inside one document
    drifts = []
    for z in router_logits:  # [B * T, E] per MoE layer
        p = torch.softmax(z.float(), dim=-1).view(batch, seq, -1)
        tv = 0.5 * (p[:, 1:] - p[:, :-1]).abs().sum(-1)  # [B, T-1]
        drifts.append((tv * same_text).sum() / same_text.sum().clamp(min=1.0))
    return torch.stack(drifts).mean()


def text_segments(rows) -> tuple[Any, Any]:
    """Each token's text in a batch of packed rows: ([B * T] segment ids, [B * T] token counts
    per id). A token after an EOS begins the next text; the EOS belongs to the text it ends (as
    `routing_drift_loss` counts pairs); ids never span two rows."""
    import torch

    batch, seq = rows.shape
    after_eos = torch.zeros_like(rows, dtype=torch.long)
    after_eos[:, 1:] = (rows[:, :-1] == EOS_ID).long()
    seg = (after_eos.cumsum(1) + torch.arange(batch, device=rows.device)[:, None] * seq).reshape(-1)
    return seg, torch.bincount(seg, minlength=batch * seq).float()


def request_concentration_loss(router_logits, rows) -> Any:
    """How evenly each text spreads over a layer's experts: the entropy of the text's mean
    router distribution over its tokens, divided by log E (1 when a text uses every expert
    alike, 0 when all its tokens route to one), weighted by the text's tokens and averaged over
    MoE layers.

    Why (`TrainSettings.concentration_coef`, `--concentration-coef`): real MoEs keep a request
    on a few of a layer's experts (within-request Gini 0.77-0.85 on the 128-expert real traces,
    bench/RESULTS.md, "The synthetic and real traces, judged by shape") while the whole stream stays balanced; with the batch-level
    balance loss (which raises the entropy of the batch's mixture) this term is the other half
    of the mutual information between text and expert, the objective Mod-Squad (Chen et al.,
    arXiv 2212.08066) maximises between tasks and experts. It is training-time only, like
    `routing_drift_loss`."""
    import torch

    seg, counts = text_segments(rows)
    used = counts > 0
    weight = counts[used] / counts[used].sum()
    spreads = []
    for z in router_logits:  # [B * T, E] per MoE layer
        p = torch.softmax(z.float(), dim=-1)
        mean = torch.zeros(len(counts), p.shape[-1], dtype=p.dtype).index_add_(0, seg, p)[used] / counts[used, None]
        entropy = -(mean * mean.clamp_min(1e-12).log()).sum(-1) / math.log(p.shape[-1])
        spreads.append((entropy * weight).sum())
    return torch.stack(spreads).mean()


def fit(model, rows, settings: TrainSettings, rng: np.random.Generator, progress: bool = False,
        desc: str = "train") -> list[float]:
    """AdamW with warmup and cosine decay on random batches of packed rows. The loss is the
    next-token cross-entropy plus `router_aux_loss_coef` times `layer_balance_loss` (when the
    config has `output_router_logits`). Returns the loss of every step."""
    import torch
    from tqdm import tqdm

    if settings.steps is None:
        raise CasmoeError("fit needs settings.steps (`resolved` fills in a shipped model's own)")

    coef = getattr(model.config, "router_aux_loss_coef", 0.0) if model.config.output_router_logits else 0.0
    if settings.balance_coef is not None and model.config.output_router_logits:
        coef = settings.balance_coef
    locality = settings.locality_coef or 0.0
    concentration = settings.concentration_coef or 0.0
    top_k = model.config.num_experts_per_tok
    window: deque = deque(maxlen=settings.balance_window)  # Balance.GLOBAL: recent [L, E] counts

    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.01,
                            betas=(0.9, 0.95))
    losses: list[float] = []
    model.train()
    bar = tqdm(range(settings.steps), desc=desc, disable=not progress)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, settings)
        x = rows[torch.from_numpy(rng.integers(0, len(rows), size=settings.batch))]
        out = model(input_ids=x, output_router_logits=bool(coef or locality or concentration))
        logits = out.logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                 x[:, 1:].reshape(-1))
        if coef and settings.balance is Balance.GLOBAL:
            window.append(expert_counts(out.router_logits, top_k))
            counts = torch.stack(tuple(window)).sum(0)  # [L, E] over the window's tokens
            loads = top_k * counts / counts.sum(-1, keepdim=True)
            loss = loss + coef * layer_balance_loss(out.router_logits, top_k, loads=loads)
        elif coef:
            loss = loss + coef * layer_balance_loss(out.router_logits, top_k,
                                                    sequences=len(x) if settings.balance is Balance.SEQUENCE else 1)
        if locality:
            loss = loss + locality * routing_drift_loss(out.router_logits, x)
        if concentration:
            loss = loss + concentration * request_concentration_loss(out.router_logits, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    return losses


def resolved(name: str, settings: TrainSettings) -> TrainSettings:
    """`settings` with every field left at None taken from model `name`'s recipe."""
    r = RECIPES[name]
    return replace(settings, steps=r.steps if settings.steps is None else settings.steps,
                   balance=settings.balance or r.balance,
                   balance_coef=(TINY_MODELS[name][1]["router_aux_loss_coef"] if settings.balance_coef is None
                                 else settings.balance_coef),
                   locality_coef=r.locality_coef if settings.locality_coef is None else settings.locality_coef,
                   concentration_coef=(r.concentration_coef if settings.concentration_coef is None
                                       else settings.concentration_coef))


def train_tiny(name: str, out_dir: Path | str, settings: TrainSettings = TrainSettings(),
               corpus: Path | str | None = None, progress: bool = True) -> TrainResult:
    """Train tiny model `name` and save it (fp16 safetensors, config, tokenizer) to out_dir."""
    import torch
    import transformers

    check_folder_target(out_dir, MODEL_FOLDER, "output folder", marker="config.json")  # before the training
    settings = resolved(name, settings)
    torch.manual_seed(settings.seed)
    torch.set_num_threads(settings.threads)
    rng = np.random.default_rng(settings.seed)
    train_prompts = load_corpus(corpus, split=TRAIN)
    held_prompts = load_corpus(corpus, split=HELDOUT)
    tokenizer = train_tokenizer([p.document for p in train_prompts])
    config = model_config(name, vocab_size=len(tokenizer))
    model_cls = getattr(transformers, TINY_MODELS[name][0].replace("Config", "ForCausalLM"))
    model = model_cls(config)
    model.set_experts_implementation("grouped_mm")  # the fast CPU path for training
    rows, held = pack(tokenizer, train_prompts, settings.seq_len), pack(tokenizer, held_prompts,
                                                                       settings.seq_len)
    start = time.perf_counter()
    losses = fit(model, rows, settings, rng, progress=progress, desc=f"train {name}")
    seconds = time.perf_counter() - start
    model.config.output_router_logits = False  # a training-time switch; inference needs no aux loss
    with write_folder(out_dir, MODEL_FOLDER, marker="config.json") as tmp:  # all at once: never half a model
        model.half().save_pretrained(tmp)  # fp16 keeps the shipped weights small
        tokenizer.save_pretrained(tmp)
        shipped = model_cls.from_pretrained(tmp, dtype=torch.float32).eval()
        held_loss = mean_loss(shipped, held)  # measured on the weights as shipped (fp16 -> fp32)
        result = TrainResult(
            name=name, params=sum(p.numel() for p in model.parameters()),
            train_tokens=int(rows.numel()), steps=settings.steps, seconds=round(seconds, 1),
            first_loss=round(losses[0], 4), final_loss=round(float(np.mean(losses[-20:])), 4),
            heldout_loss=round(held_loss, 4), heldout_perplexity=round(math.exp(held_loss), 2),
            weights_bytes=(tmp / "model.safetensors").stat().st_size, settings=asdict(settings),
            environment=training_environment())
        write_text(tmp / "train.json", json.dumps(result.to_dict(), indent=2) + "\n")
    return result

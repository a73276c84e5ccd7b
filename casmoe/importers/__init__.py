"""External routing formats -> `Trace` (one module per format), and `Trace` -> the long CSV.

Traces:
- `route_csv`: the long routing CSV (`route_trace v1`, or its minimal form), read and written;
- `lrc_arrays`: moe-lrc's per-layer arrays (expert ids, logits or int8 ranks);
- `json_routing`: plain JSON requests and moe-lrc's named case traces;
- `vllm`: vLLM's `routed_experts` / `prompt_routed_experts` (saved arrays or API responses);
- `sglang`: SGLang's per_token recorder dumps and `return_routed_experts` responses.

Popularity profiles (counts only, see `casmoe.profile`): `trtllm`, `ktransformers`, and
`sglang.read_sglang_counts`.

Shared: `checks` (what files and flags declare), `dump_files` (engine dump files and
encodings), `engine_trace` (engine requests -> trace over the MoE layers), `torch_file`
(`torch.load(weights_only=True)` only).

`import_trace` picks the reader (by `fmt`, or by suffix and content); `read_specs` reads the
`PATH` / `PATH#KEY` arguments of the commands that take traces of any format. Every fault
raises `TraceError` (`ProfileError` for profiles) naming the file and what is wrong.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any, Sequence

from casmoe.filekind import reading
from casmoe.geometry import Geometry
from casmoe.importers.checks import agree, positive_option
from casmoe.importers.dump_files import json_records
from casmoe.importers.json_routing import read_json
from casmoe.importers.ktransformers import read_ktransformers
from casmoe.importers.lrc_arrays import read_lrc_arrays
from casmoe.importers.route_csv import CSV_COLUMNS, MINIMAL_COLUMNS, read_route_csv, write_route_csv
from casmoe.importers.sglang import is_sglang_json, read_sglang, read_sglang_counts
from casmoe.importers.trtllm import read_trtllm
from casmoe.importers.vllm import is_vllm_json, read_vllm
from casmoe.profile import Profile, ProfileError
from casmoe.trace import Trace, TraceError
from casmoe.trace_io import load_trace

__all__ = ["CSV_COLUMNS", "FORMATS", "MINIMAL_COLUMNS", "PROFILE_FORMATS", "import_profile", "import_trace",
           "read_json", "read_lrc_arrays", "read_route_csv", "read_specs", "write_route_csv"]

FORMATS = ("auto", "csv", "json", "arrays", "npz", "vllm", "sglang")
PROFILE_FORMATS = ("trtllm", "ktransformers", "sglang-stat")


def detect_format(sources: Sequence[Path]) -> str:
    """The format of `sources` from suffixes and, where a suffix is shared, content."""
    first = sources[0]
    if first.is_dir():
        suffixes = {p.suffix for p in first.iterdir()}
        if ".pt" in suffixes:
            return "sglang"
        npz = sorted(p for p in first.iterdir() if p.suffix == ".npz")
        if npz:
            return "vllm" if _npz_kind(npz[0]) == "vllm" else "arrays"
        docs = sorted(p for p in first.iterdir() if p.suffix in (".json", ".jsonl"))
        if docs:
            return _json_kind(docs[0])
        if suffixes & {".npy", ".safetensors"}:
            return "arrays"
        raise TraceError(f"{first} is a folder without routing files (engine dumps .pt, .json, .jsonl, .npz; layer "
                         "arrays .npy, .npz, .safetensors); a route CSV or JSON file is imported by its own name")
    if first.suffix == ".pt":
        return "sglang"
    if first.suffix in (".npy", ".safetensors"):
        return "arrays"
    if first.suffix == ".npz":
        kind = _npz_kind(first)
        return "arrays" if kind == "arrays" and len(sources) > 1 else kind
    if first.suffix in (".json", ".jsonl"):
        return _json_kind(first)
    if len(sources) > 1:
        return "arrays"
    return "csv"


def _npz_kind(path: Path) -> str:
    """npz (a casmoe trace), vllm (routed_experts arrays) or arrays (moe-lrc layer file)."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n.removesuffix(".npy") for n in zf.namelist()]
    except (OSError, zipfile.BadZipFile):
        return "arrays"  # the arrays reader names the fault
    if "meta" in names and "topk" in names:
        return "npz"
    if any(n.rpartition("/")[2] in ("routed_experts", "prompt_routed_experts") for n in names):
        return "vllm"
    return "arrays"


def _json_kind(path: Path) -> str:
    if path.suffix == ".jsonl":
        try:
            _, doc = next(iter(json_records(path)))
        except StopIteration:
            raise TraceError(f"{path}: no records") from None
    else:
        try:
            doc = json.loads(path.read_text(encoding="utf-8-sig"))
        except FileNotFoundError:
            raise TraceError(f"{path}: no such file") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            return "json"  # the JSON reader names the fault
    if is_sglang_json(doc):
        return "sglang"
    return "vllm" if is_vllm_json(doc) else "json"


def import_trace(
    sources: Sequence[str | Path],
    fmt: str = "auto",
    *,
    model: Geometry | None = None,
    num_experts: int | None = None,
    top_k: int | None = None,
    **options: Any,
) -> Trace:
    """Read any supported source into one trace; `fmt='auto'` decides by suffix and content.

    `model` (a preset's geometry), `num_experts` and `top_k` are the user's claims about the
    data: a reader uses them where the data lacks them, and a trace that contradicts any of them
    is refused (see `checks.agree`), as is one without requests."""
    sources = [Path(s) for s in sources]
    if not sources:
        raise TraceError("no input given")
    positive_option(num_experts, "--num-experts")
    positive_option(top_k, "--top-k")
    if fmt == "auto":
        fmt = detect_format(sources)
    if fmt not in FORMATS:
        raise TraceError(f"unknown format {fmt!r} ({', '.join(FORMATS)})")
    many = fmt in ("arrays", "vllm", "sglang")
    if not many and len(sources) != 1:
        raise TraceError(f"format {fmt} takes one input file, got {len(sources)}")
    where = ", ".join(map(str, sources[:3])) + (" ..." if len(sources) > 3 else "")
    with reading(where):
        return _import(sources, fmt, where, model, num_experts, top_k, options)


def _import(sources: list[Path], fmt: str, where: str, model: Geometry | None, num_experts: int | None,
            top_k: int | None, options: dict[str, Any]) -> Trace:
    E = num_experts if num_experts is not None else (model.experts if model is not None else None)
    k = top_k if top_k is not None else (model.top_k if model is not None else None)
    if fmt == "csv":
        trace = read_route_csv(sources[0])
    elif fmt == "json":
        trace = read_json(sources[0], key=options.get("key"))
    elif fmt == "npz":
        trace = load_trace(sources[0])
    elif fmt == "vllm":
        trace = read_vllm(sources, num_experts=E)
    elif fmt == "sglang":
        trace = read_sglang(sources, top_k=k, num_experts=E)
    else:
        names = ("kind", "prefill", "keep_logits")
        opts = {n: options[n] for n in names if options.get(n) is not None}
        trace = read_lrc_arrays(sources, num_experts=E, top_k=k, **opts)
    return agree(trace, where, num_experts=num_experts, top_k=top_k, model=model)


def import_profile(sources: Sequence[str | Path], fmt: str, *, model: Geometry | None = None) -> Profile:
    """A counts-only engine dump -> a popularity profile over the MoE layers (`casmoe.profile`)."""
    sources = [Path(s) for s in sources]
    if not sources:
        raise ProfileError("no input given")
    with reading(", ".join(map(str, sources[:3])) + (" ..." if len(sources) > 3 else "")):
        return _import_profile(sources, fmt, model)


def _import_profile(sources: list[Path], fmt: str, model: Geometry | None) -> Profile:
    layers = model.layers if model is not None else None
    if fmt == "trtllm":
        profile = read_trtllm(sources, model_layers=layers)
    elif fmt == "ktransformers":
        profile = read_ktransformers(sources, model_layers=layers)
    elif fmt == "sglang-stat":
        profile = read_sglang_counts(sources, model_layers=layers)
    else:
        raise ProfileError(f"unknown profile format {fmt!r} ({', '.join(PROFILE_FORMATS)})")
    if model is not None and profile.experts != model.experts:
        raise ProfileError(f"{sources[0]}: the dump counts {profile.experts} experts per layer, --model has {model.experts}")
    return profile


def read_specs(specs: Sequence[str]) -> list[tuple[str, Trace]]:
    """Each `PATH` or `PATH#KEY` (one named entry of a JSON file), any format -> (label, Trace).

    A spec that names an existing file is that file, `#` and all (`run#1.npz`); otherwise the
    last `#` separates the key (`run#1.json#mixtral`). The label is the key, else the file's
    stem; repeated labels get their position appended."""
    loaded = []
    for spec in specs:
        path, key = (spec, "") if Path(spec).is_file() or "#" not in spec else spec.rsplit("#", 1)
        loaded.append((key or Path(path).stem, import_trace([path], key=key or None)))
    names = [name for name, _ in loaded]
    return [(f"{n}[{i}]" if names.count(n) > 1 else n, tr) for i, (n, (_, tr)) in enumerate(zip(names, loaded))]

"""vLLM's routed experts (`--enable-return-routed-experts`) -> `Trace`, one request per completion.

vLLM's capturer writes, per token and per decoder layer (MoE or not), the `num_experts_per_tok`
expert ids the router chose, in a zero-filled int32 buffer (a dense layer stays all zeros).
A completion carries `routed_experts` [generated tokens - 1, layers, k] (the last generated
token is never fed back, so it has no row) and its request `prompt_routed_experts`
[prompt tokens, layers, k]; older vLLM gave one `routed_experts` for the whole sequence
[prompt + generated - 1, layers, k], which is split at the prompt length here.

Accepted files (several files or a folder: one trace, in file-name order, or arrival order
when every request has an arrival time):

- `.npz` as a user saves one request: `prompt_routed_experts`, `routed_experts`, and optionally
  `prompt_token_ids`, `token_ids` (the generated ids), `prompt`, `text`, `arrival_time`; many
  requests in one file prefix each key with a name and a slash (`r0/routed_experts`, ...);
- `.json` (one object or a list) or `.jsonl` (one object per line) holding OpenAI-compatible
  responses of `vllm serve` (`prompt_routed_experts` beside `choices`, each choice with
  `routed_experts`, `token_ids`, `text` or `message.content`) or `LLM.generate` outputs saved
  as dicts (`prompt_routed_experts`, `prompt_token_ids`, `prompt`, `outputs[i].routed_experts`
  ...). Arrays are nested lists, base64 of an `.npy` file, or `{"data": base64, "shape": [...]}`
  (raw little-endian int16 or int32, told apart by the byte count, or `"dtype"`).

Each choice of a response is one request (they share the prompt's routing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from casmoe.importers.dump_files import decode_array, engine_files, json_records, seconds, text_field, token_ids
from casmoe.importers.engine_trace import EngineRequest, build_trace
from casmoe.npz import read_npz
from casmoe.trace import Trace, TraceError

SUFFIXES = (".npz", ".json", ".jsonl")


def _split(prompt: np.ndarray | None, routed: np.ndarray | None, n_prompt: int | None, n_out: int | None,
           where: str) -> tuple[np.ndarray, np.ndarray]:
    """(prompt rows, decode rows) from the split or the whole-sequence form, every length the
    record states checked against the rows: P prompt tokens have P rows, G generated tokens
    G - 1 (the last one is never fed back), and a whole-sequence array P + G - 1. What does not
    add up is refused with the numbers, never split somewhere else or read as all decode."""
    if routed is None and prompt is None:
        raise TraceError(f"{where}: no routed_experts (serve with --enable-return-routed-experts)")
    ref = routed if routed is not None and routed.size else prompt
    tail = ref.shape[1:] if ref is not None and ref.ndim == 3 else (0, 0)
    empty = np.zeros((0, *tail), dtype=np.int64)
    routed = empty if routed is None or not routed.size else routed
    fed = None if n_out is None else max(n_out - 1, 0)  # generated tokens fed back: each has a row
    out_said = f"{n_out} generated tokens make {fed} rows (the last one is never fed back)"
    if prompt is not None:
        prompt = empty if not prompt.size else prompt
        if n_prompt is not None and len(prompt) != n_prompt:
            raise TraceError(f"{where}: prompt_routed_experts has {len(prompt)} rows for {n_prompt} prompt tokens; "
                             "one row per prompt token")
        if fed is not None and len(routed) != fed:
            raise TraceError(f"{where}: routed_experts has {len(routed)} rows, but {out_said}")
        return prompt, routed
    rows = len(routed)  # older vLLM: one array for the whole sequence, split at the prompt length
    if n_prompt is not None and fed is not None:
        if rows == n_prompt + fed:
            return routed[:n_prompt], routed[n_prompt:]
        missing = "; the prompt's rows are missing (save prompt_routed_experts too)" if rows == fed and n_prompt else ""
        raise TraceError(f"{where}: routed_experts has {rows} rows, but {n_prompt} prompt tokens and {n_out} generated "
                         f"tokens make {n_prompt + fed} (the last generated one is never fed back){missing}")
    if n_prompt is not None:
        if rows < n_prompt:
            raise TraceError(f"{where}: routed_experts has {rows} rows, fewer than its {n_prompt} prompt tokens")
        return routed[:n_prompt], routed[n_prompt:]
    if fed is not None:
        if rows < fed:
            raise TraceError(f"{where}: routed_experts has {rows} rows, but {out_said}")
        return routed[: rows - fed], routed[rows - fed :]
    return empty, routed  # no length anywhere: every row is a generated token fed back


def _one_count(ids: np.ndarray | None, counted: int | None, ids_name: str, count_name: str, where: str) -> int | None:
    """A token count from the ids, else the usage count; both given, they must agree."""
    if ids is not None and counted is not None and len(ids) != counted:
        raise TraceError(f"{where}: {ids_name} holds {len(ids)} tokens but {count_name} says {counted}")
    return len(ids) if ids is not None else counted


def _completion(prompt_part: dict[str, Any], out: dict[str, Any], where: str, name: str | None,
                choices: int = 1, choice: int = 0) -> EngineRequest:
    """One completion (with its request's prompt part) -> EngineRequest."""
    prompt_ids = token_ids(prompt_part.get("prompt_token_ids"), where, "prompt_token_ids")
    out_ids = token_ids(out.get("token_ids", out.get("output_token_ids")), where, "token_ids")
    usage = prompt_part.get("usage") if isinstance(prompt_part.get("usage"), dict) else {}
    counted = {n: v for n, v in usage.items() if type(v) is int and v >= 0}  # token counts, when they are counts
    n_prompt = _one_count(prompt_ids, counted.get("prompt_tokens"), "prompt_token_ids", "usage.prompt_tokens", where)
    if choices > 1:  # usage counts the completion tokens of every choice together
        counted.pop("completion_tokens", None)
    n_out = _one_count(out_ids, counted.get("completion_tokens"), "token_ids", "usage.completion_tokens", where)
    rows_p, rows_d = _split(decode_array(prompt_part.get("prompt_routed_experts"), where),
                            decode_array(out.get("routed_experts"), where), n_prompt, n_out, where)
    message = out.get("message")
    text = out.get("text", message.get("content") if isinstance(message, dict) else None)
    metrics = prompt_part.get("metrics") if isinstance(prompt_part.get("metrics"), dict) else {}
    arrival = prompt_part.get("arrival_time", metrics.get("arrival_time", prompt_part.get("created")))
    engine_id = text_field(prompt_part.get("request_id", prompt_part.get("id")), where, "id")
    return EngineRequest(rows_p, rows_d, where, prompt=text_field(prompt_part.get("prompt"), where, "prompt"),
                         output=text_field(text, where, "text"), output_ids=out_ids, arrival=seconds(arrival, where),
                         name=name or engine_id,
                         request_id=None if engine_id is None else f"{engine_id}" + (f" choice {choice}" if choices > 1 else ""))


def _record(doc: Any, where: str) -> list[EngineRequest]:
    """A response / output object -> one EngineRequest per choice."""
    if not isinstance(doc, dict):
        raise TraceError(f"{where}: expected an object per request, got {type(doc).__name__}")
    outs = doc.get("choices", doc.get("outputs"))
    if outs is None:  # a flat record: the request and its one completion in one object
        return [_completion(doc, doc, where, None)]
    if not isinstance(outs, list) or not outs or not all(isinstance(o, dict) for o in outs):
        raise TraceError(f"{where}: 'choices'/'outputs' must be a non-empty list of objects")
    many = len(outs) > 1
    return [_completion(doc, o, f"{where} choice {i}" if many else where, None, len(outs), i) for i, o in enumerate(outs)]


def _npz_records(path: Path) -> list[EngineRequest]:
    where = str(path)
    arrays = read_npz(path, TraceError)  # declared sizes checked before anything is inflated
    groups: dict[str, dict[str, Any]] = {}
    for key, value in arrays.items():
        name, _, field = key.rpartition("/")
        groups.setdefault(name, {})[field] = value
    if not any("routed_experts" in g or "prompt_routed_experts" in g for g in groups.values()):
        raise TraceError(f"{where}: no 'routed_experts' array (keys: {', '.join(sorted(arrays)) or 'none'})")
    out = []
    for name, g in groups.items():
        label = f"{where} [{name}]" if name else where
        out.append(_completion(g, g, label, name or path.stem))
    return out


def is_vllm_json(doc: Any) -> bool:
    """Whether a parsed JSON object looks like vLLM output with routing (for format detection)."""
    if isinstance(doc, list) and doc:
        doc = doc[0]
    if not isinstance(doc, dict):
        return False
    outs = doc.get("choices", doc.get("outputs"))
    in_outs = isinstance(outs, list) and any(isinstance(o, dict) and "routed_experts" in o for o in outs)
    return "prompt_routed_experts" in doc or in_outs or ("routed_experts" in doc and "meta_info" not in doc)


def read_vllm(sources: Sequence[str | Path], *, num_experts: int | None = None) -> Trace:
    """vLLM dumps (files or folders, see the module docstring) -> one trace."""
    files = engine_files(sources, SUFFIXES, "vLLM")
    requests: list[EngineRequest] = []
    for f in files:
        if f.suffix == ".npz":
            requests += _npz_records(f)
        elif f.suffix in (".json", ".jsonl"):
            for label, doc in json_records(f):
                requests += _record(doc, label)
        else:
            raise TraceError(f"{f}: a vLLM dump is .npz, .json or .jsonl")
    if all(r.arrival is not None for r in requests):
        requests.sort(key=lambda r: r.arrival)
    where = ", ".join(map(str, files[:3])) + (" ..." if len(files) > 3 else "")
    return build_trace(requests, where, recorded_by=f"vLLM routed experts ({len(files)} files)", num_experts=num_experts)

"""Write the example dumps of this folder: tiny-mixtral's recorded routing (three requests of
traces/tiny-mixtral.npz) re-encoded in the formats serving engines write, as their source
defines them (see README.md). The writers are also the tests' fixture builders.

Run from the repository root: python examples/engine-dumps/make_examples.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parents[1] / "traces" / "tiny-mixtral.npz"
REQUESTS = (1, 2, 3)  # short ones: 6 + 13, 11 + 27 and 12 + 29 tokens
SGLANG_MODES = {"extend": 1, "decode": 2, "mixed": 3, "idle": 4}  # SGLang's ForwardMode values


def sglang_record(fid: int, mode: str, segments: Sequence[tuple[int, np.ndarray, np.ndarray]], layers: int,
                  rank: int = 0) -> dict[str, Any]:
    """One forward pass as SGLang's per_token gatherer collects it. `segments`: per sequence of
    the batch its first position, physical ids [tokens, layers, k] (-1 where not routed) and
    input token ids."""
    import torch

    topk = np.full((layers, sum(len(r) for _, r, _ in segments), 8), -1, dtype=np.int32)  # [L, T, 8]
    col = 0
    for _, rows, _ in segments:
        topk[:, col : col + len(rows), : rows.shape[2]] = rows.transpose(1, 0, 2)
        col += len(rows)
    return {
        "forward_pass_id": fid, "rank": rank, "gatherer_key": "primary",
        "input_ids": [int(i) for _, _, ids in segments for i in ids],
        "positions": [p for start, rows, _ in segments for p in range(start, start + len(rows))],
        "extend_seq_lens": [len(r) for _, r, _ in segments] if mode in ("extend", "mixed") else None,
        "forward_mode": SGLANG_MODES[mode], "topk_ids_of_layer": torch.tensor(topk), "misc_objects": [],
    }


def write_sglang(path: Path, records: list[dict[str, Any]], physical_to_logical: np.ndarray) -> None:
    """What `/dump_expert_distribution_record` saves in per_token mode."""
    import torch

    torch.save({"records": records, "last_physical_to_logical_map": torch.tensor(physical_to_logical)}, path)


def to_physical(rows: np.ndarray, physical_to_logical: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Logical ids [tokens, layers, k] -> one of each expert's physical copies (-1 stays -1)."""
    out = np.full(rows.shape, -1, dtype=np.int64)
    for (t, layer, j), logical in np.ndenumerate(rows):
        if logical >= 0:
            out[t, layer, j] = rng.choice(np.nonzero(physical_to_logical[layer] == logical)[0])
    return out


def write_trtllm(folder: Path, counts: dict[tuple[int, int], np.ndarray], experts: int, top_k: int, rank: int = 0) -> None:
    """TensorRT-LLM's expert statistics: meta_info.json and rank{r}.safetensors of
    `{iteration}_{layer}` bincounts."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(exist_ok=True)
    (folder / "meta_info.json").write_text(json.dumps({"num_experts": experts, "num_experts_per_token": top_k}))
    save_file({f"{i}_{layer}": torch.tensor(c, dtype=torch.int64) for (i, layer), c in counts.items()},
              str(folder / f"rank{rank}.safetensors"))


def main() -> None:
    import torch

    from casmoe.trace import expert_counts
    from casmoe.trace_io import load_trace

    trace = load_trace(SOURCE)
    reqs = [trace.requests[i] for i in REQUESTS]
    L, E, k = trace.geometry.layers, trace.geometry.experts, trace.geometry.top_k

    # vLLM: one .npz per request, as a user saves a completion's fields
    (HERE / "vllm").mkdir(exist_ok=True)
    for i, r in zip(REQUESTS, reqs):
        np.savez_compressed(
            HERE / "vllm" / f"request-{i}.npz", prompt_routed_experts=r.topk[: r.prefill].astype(np.int16),
            routed_experts=r.topk[r.prefill :].astype(np.int16), token_ids=r.output_ids.astype(np.int64),
            prompt=np.array(r.prompt), text=np.array(r.output),
        )

    # SGLang per_token: both prompts in one extend pass, then batched decode passes; physical
    # experts 8 and 9 are replicas of logical 0 and 1; the source has no prompt token ids (0 here)
    rng = np.random.default_rng(0)
    phys = np.concatenate([np.tile(np.arange(E), (L, 1)), np.tile([0, 1], (L, 1))], axis=1)  # 2 replicas
    records = [sglang_record(0, "extend", [(0, to_physical(r.topk[: r.prefill], phys, rng), np.zeros(r.prefill))
                                            for r in reqs[:2]], L)]
    for step in range(max(r.decode_tokens for r in reqs[:2])):
        batch = [(r.prefill + step, to_physical(r.topk[r.prefill + step : r.prefill + step + 1], phys, rng),
                  r.output_ids[step : step + 1]) for r in reqs[:2] if step < r.decode_tokens]
        records.append(sglang_record(1 + step, "decode", batch, L))
    (HERE / "sglang").mkdir(exist_ok=True)
    write_sglang(HERE / "sglang" / "expert_distribution_recorder_1764600000.0_0.pt", records, phys)

    # counts only: TensorRT-LLM (one iteration per request), SGLang stat, KTransformers
    per_request = [expert_counts(r.topk, E) for r in reqs]  # [L, E] each
    write_trtllm(HERE / "trtllm", {(100 + i, layer): c[layer] for i, c in enumerate(per_request) for layer in range(L)},
                 E, k)
    torch.save({"rank": 0, "logical_count": torch.tensor(np.stack(per_request), dtype=torch.int32),
                "average_utilization_rate_over_window": None}, HERE / "sglang-stat.pt")
    torch.save(torch.tensor(sum(per_request), dtype=torch.float32), HERE / "ktransformers-frequency.pt")

    # the minimal route CSV a user's own tool writes: one row per routed expert
    r = reqs[0]
    lines = [f"# n_layer={L} n_expert={E} n_expert_used={k}", "turn,phase,step,layer,expert"]
    lines += [f"0,{int(t >= r.prefill)},{t},{layer},{e}" for (t, layer, _), e in np.ndenumerate(r.topk)]
    (HERE / "my-engine.csv").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

"""Which experts stay on which GPU: routing-aware, per layer and per GPU, filled to the memory map.

The ranking is the `routed-placement` policy's own (`shares`, `order`, reached through the
registry: the policy is what the simulator runs, so the configuration printed is the one
simulated). It is computed on the trace's train split at the plan's concurrency, never on the
requests a plan is scored on. A placement fills GPUs in that order until the next unit fits
nowhere: a unit goes to the GPU that runs its layer's attention when it fits there, else to the
GPU with the most room left, so a small GPU beside a big one takes what it can hold and no GPU
is filled past its map (llama.cpp's `--n-cpu-moe` puts a layer's experts on its layer's GPU
whatever room that GPU has left: llama.cpp #15136). Units are what the engine can place:
whole layers for llama.cpp, vLLM and SGLang, (layer, expert) pairs for KTransformers and
casmoe's backend.

`first_layers` is llama.cpp's rule as written (`--n-cpu-moe N`: the first N layers' experts on
the host), the baseline a routing-aware choice is held to at equal memory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from casmoe.policies import get_policy
from casmoe.presets import ModelPreset
from casmoe.profile import Profile
from casmoe.selection import split_indices
from casmoe.sim.questions.deploy.memory import MemoryMap

ROUTED = "routed-placement"


@dataclass(frozen=True)
class Placement:
    """Experts on each GPU (flat ids `layer * E + expert`), the rule that chose them and the
    unit it placed, and the memory map with them in it."""

    rule: str  # "routed", "first" (llama.cpp's --n-cpu-moe), "all" (everything on the GPUs)
    unit: str  # "layer" or "expert"
    gpu: tuple[tuple[int, ...], ...]
    memory: MemoryMap
    experts_per_layer: int

    @property
    def count(self) -> int:
        return sum(len(g) for g in self.gpu)

    def gpu_layers(self) -> list[list[int]]:
        """Per GPU, the MoE layers whose experts are all on it."""
        E = self.experts_per_layer
        out = []
        for ids in self.gpu:
            per: dict[int, int] = {}
            for e in ids:
                per[e // E] = per.get(e // E, 0) + 1
            out.append(sorted(layer for layer, n in per.items() if n == E))
        return out

    def by_layer(self, layers: int) -> list[list[int]]:
        """Per GPU, how many experts of each of the `layers` MoE layers it holds (plan.json's
        `gpu_experts_by_layer`: which layers' experts live where, whatever the unit placed)."""
        E = self.experts_per_layer
        out = []
        for ids in self.gpu:
            counts = [0] * layers
            for e in ids:
                counts[e // E] += 1
            out.append(counts)
        return out

    def host_layers(self, layers: int) -> list[int]:
        """MoE layers with no expert on any GPU."""
        E = self.experts_per_layer
        on = {e // E for ids in self.gpu for e in ids}
        return [layer for layer in range(layers) if layer not in on]

    def per_layer_counts(self, layers: int) -> list[int]:
        counts = [0] * layers
        for ids in self.gpu:
            for e in ids:
                counts[e // self.experts_per_layer] += 1
        return counts

    def policy(self, layers: int, batch: int) -> str:
        """The policy spec the simulator runs for this placement (with `global_capacity` = count)."""
        if self.rule in ("first", "all", "host"):
            return f"n-cpu-moe[n={len(self.host_layers(layers))}]"
        options = ["unit=layer"] if self.unit == "layer" else []
        if batch > 1:
            options.append(f"batch={batch}")
        return ROUTED + (f"[{','.join(options)}]" if options else "")


def routed_order(shares: np.ndarray, unit: str) -> list[int]:
    """The routed-placement policy's keep-first order (layers or flat expert ids)."""
    return get_policy(ROUTED).order(shares, unit)  # type: ignore[attr-defined]


def train_shares(trace, batch: int) -> np.ndarray:
    """[L, E] step shares of the trace's train split served `batch` at a time (the policy's
    default profile: `TraceFit` binds the same split)."""
    return get_policy(ROUTED).shares(trace.subset(split_indices(trace, "train")), batch)  # type: ignore[attr-defined]


def place(base: MemoryMap, experts: int, order: Sequence[int], unit: str, rule: str = "routed") -> Placement:
    """Fill the GPUs of `base` in `order` (layers, or flat expert ids of `experts` per layer)
    until the next unit fits on no GPU; the rest stays on the host. An expert's bytes are the
    map's (`MemoryMap.gpu_expert_bytes`, `host_expert_bytes`: the machine's, or the file's)."""
    E = experts
    gpu_b, host_b = base.gpu_expert_bytes, base.host_expert_bytes
    L = len(gpu_b)
    room = base.expert_room()
    # the simulator charges a pool of whole experts at its GPU's average expert (`Machine.slot_bytes`): a
    # placement also holds no more experts than that accounting fits, so that it runs without overcommit
    mean = [sum(gpu_b[layer] for layer in gm.layers) / len(gm.layers) if gm.layers else 0.0 for gm in base.gpus]
    pool = list(room)
    owner = {layer: i for i, gm in enumerate(base.gpus) for layer in gm.layers}
    placed: list[list[int]] = [[] for _ in base.gpus]

    def fits(i: int, size: int, n: int) -> bool:
        return room[i] >= size and (len(placed[i]) + n) * mean[i] <= pool[i]

    for unit_id in order if base.gpus else ():
        layer = unit_id if unit == "layer" else unit_id // E
        n = E if unit == "layer" else 1
        size = gpu_b[layer] * n
        home = owner.get(layer, 0)
        target = home if fits(home, size, n) else max(range(len(room)), key=lambda i: (room[i], -i))
        if not fits(target, size, n):
            break
        room[target] -= size
        placed[target] += [layer * E + e for e in range(E)] if unit == "layer" else [unit_id]
    gpu = tuple(tuple(sorted(p)) for p in placed)
    on = {e for p in gpu for e in p}
    gpu_bytes = [sum(gpu_b[e // E] for e in p) for p in gpu]
    host_ids = [e for e in range(L * E) if e not in on]
    host_bytes = sum(host_b[e // E] for e in host_ids)
    memory = base.with_experts(gpu_bytes, [len(p) for p in gpu], host_bytes, len(host_ids))
    if not host_ids:
        rule = "all"
    return Placement(rule, unit, gpu, memory, E)


def first_layers(base: MemoryMap, experts: int) -> Placement:
    """llama.cpp's `--n-cpu-moe N` with the fewest N that fits: the last layers on the GPUs."""
    L = len(base.gpu_expert_bytes)
    return place(base, experts, list(range(L - 1, -1, -1)), "layer", rule="first")


def per_layer_cache(base: MemoryMap, experts: int, slots: int) -> Placement:
    """A cache of `slots` experts in every layer (casmoe's LRU): its map holds slots x layers
    experts on the GPUs (the first `slots` of each layer stand for whichever are resident)."""
    L = len(base.gpu_expert_bytes)
    order = [layer * experts + e for layer in range(L) for e in range(min(slots, experts))]
    pl = place(base, experts, order, "expert")
    return pl if pl.rule == "all" else replace(pl, rule="cache")


def write_kt_order(path, order: Sequence[int], preset: ModelPreset) -> None:
    """KTransformers' frequency statistics file (`--init-expert-location FILE.pt`) holding this
    placement's order: `{"logical_count": int64 [1, blocks, E]}`, every MoE expert a distinct
    count (the first of `order` the largest), dense blocks zero. kt-kernel keeps the largest
    `num_gpu_experts` of the flattened table (torch.topk: ties in no stated order), so distinct
    counts make its mask exactly the first experts of `order` (verified.toml,
    kt_frequency_file)."""
    import torch  # the engine reads a torch file; only writing one needs torch

    g = preset.geometry
    counts = torch.zeros((1, preset.blocks, g.experts), dtype=torch.int64)
    n = len(order)
    for rank, flat in enumerate(order):
        layer, expert = divmod(int(flat), g.experts)
        counts[0, preset.dense_layers + layer, expert] = n - rank
    torch.save({"logical_count": counts}, str(path))


def write_casmoe_profile(path, shares: np.ndarray, source: str) -> None:
    """A `casmoe popularity` file of the step shares (the routed-placement policy reads it as its
    `profile=` and ranks experts the same way)."""
    Profile(np.asarray(shares, dtype=np.float64), {"engine": "casmoe plan", "source": source,
                                                   "what": "share of decode steps using each expert"}).save(path)

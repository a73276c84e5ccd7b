"""transformers' experts functions, reproduced so that they can run in rounds over a slot pool.

An offloaded layer cannot always call transformers' experts function once: a long prefill may
route more experts than the layer has slots (it is computed in *rounds*, over the experts
resident at the time), a missed expert may be computed on the host (`cpu` miss mode), and slot
numbers are not expert numbers. Calling the function on a slot view with remapped indices, as
this backend once did, changes the arithmetic: the sort that groups token rows by expert puts
them in another order (`torch.sort` is not stable), a round's partial sums get rounded to the
output dtype and added in another order, and matmul results depend on the rows computed
together (in fp32 on the CPU, a row alone differs from the same row among others).

A *plan* reproduces one call of the reference function step for step, with the routing it was
given (original expert ids):

- the same permutation and the same groups of rows: each expert's rows are computed together,
  in the reference order, by the same kernel (`_grouped_linear`, `F.linear`, `_batched_linear`),
  whichever round or slot that expert is computed in;
- element-wise steps whose SIMD and scalar code paths may round differently (the gate's
  activation) run on a tensor of the reference's full shape, so every element takes the path it
  takes in the reference;
- the reduction over an expert's contributions (the weighted sum over top-k in fp32, or eager's
  `index_add_` in ascending expert order in the hidden dtype) runs once, at `finish`, exactly as
  the reference runs it.

So `finish()` equals the reference bit for bit, however the experts were split into rounds.
Plans exist for transformers' `grouped_mm` (the default), `batched_mm` and `eager`
implementations; others are refused with one line.
"""

from __future__ import annotations

from typing import Any

import torch

from casmoe.errors import CasmoeError


class UnsupportedExperts(CasmoeError, ValueError):
    """An experts implementation the offloaded runtime cannot reproduce exactly."""


Weights = dict[str, torch.Tensor]
"""Fused parameter name -> `[slots, ...]` tensor the slot numbers index."""


class ExpertPlan:
    """One call of an experts function, computed in rounds. Subclasses reproduce one
    implementation; `experts` lists the routed expert ids in ascending order."""

    def __init__(self, module: Any, hidden: torch.Tensor, top_k_index: torch.Tensor,
                 top_k_weights: torch.Tensor) -> None:
        self.m = module  # attributes of the experts module: act_fn, has_gate, _apply_gate, ...
        self.hidden = hidden  # [T, H]
        self.index = top_k_index  # [T, k]
        self.weights = top_k_weights  # [T, k]
        self.experts: list[int] = []

    def compute(self, experts: list[int], slots: list[int], weights: Weights) -> None:
        """Compute `experts` (routed ids) with the rows `weights[name][slot]`, slot by slot."""
        raise NotImplementedError

    def finish(self) -> torch.Tensor:
        """The layer's output [T, H], once every routed expert was computed."""
        raise NotImplementedError

    def _gated(self, x: torch.Tensor) -> torch.Tensor:
        return self.m._apply_gate(x) if self.m.has_gate else self.m.act_fn(x)

    def _up(self) -> str:
        return "gate_up_proj" if self.m.has_gate else "up_proj"


def _bias(weights: Weights, name: str, rows: torch.Tensor) -> torch.Tensor | None:
    b = weights.get(f"{name}_bias")
    return None if b is None else b[rows]


class GroupedPlan(ExpertPlan):
    """`grouped_mm_experts_forward`: rows sorted by expert, one grouped matmul per projection,
    the weighted top-k sum in the routing weights' dtype."""

    def __init__(self, module: Any, hidden: torch.Tensor, top_k_index: torch.Tensor,
                 top_k_weights: torch.Tensor) -> None:
        super().__init__(module, hidden, top_k_index, top_k_weights)
        k = top_k_index.size(-1)
        ids = top_k_index.reshape(-1)  # [S]
        ids_g, self.perm = torch.sort(ids)  # the reference's own (unstable) sort: same permutation
        self.hidden_g = hidden[self.perm // k]  # [S, H]
        self.weights_g = top_k_weights.reshape(-1)[self.perm]  # [S]
        counts = torch.bincount(ids_g, minlength=module.num_experts).tolist()
        self.rows: dict[int, tuple[int, int]] = {}
        start = 0
        for e, c in enumerate(counts):
            if c:
                self.rows[e] = (start, c)
                start += c
        self.experts = sorted(self.rows)
        self.up: torch.Tensor | None = None  # [S, 2I] up projections in reference order
        self.down: torch.Tensor | None = None  # [S, H]

    def compute(self, experts: list[int], slots: list[int], weights: Weights) -> None:
        device = self.hidden.device
        order = sorted(zip(slots, experts))  # grouped_mm wants rows grouped by ascending slot
        groups = next(iter(weights.values())).shape[0]
        per_slot = [0] * groups
        pos_list, slot_rows = [], []
        for s, e in order:
            a, c = self.rows[e]
            per_slot[s] += c
            pos_list.append(torch.arange(a, a + c))
            slot_rows += [s] * c
        pos = torch.cat(pos_list).to(device)
        srows = torch.tensor(slot_rows, device=device)
        offs = torch.cumsum(torch.tensor(per_slot), 0, dtype=torch.int32).to(device)
        linear = _grouped_linear()
        up = linear(self.hidden_g[pos], weights[self._up()], offs, bias=_bias(weights, self._up(), srows),
                    is_transposed=self.m.is_transposed)
        if self.up is None:
            self.up = torch.zeros((self.hidden_g.shape[0], up.shape[1]), dtype=up.dtype, device=device)
        self.up[pos] = up
        act = self._gated(self.up)[pos]  # the activation on the reference's full shape
        down = linear(act, weights["down_proj"], offs, bias=_bias(weights, "down_proj", srows),
                      is_transposed=self.m.is_transposed)
        if self.down is None:
            self.down = torch.zeros((self.hidden_g.shape[0], down.shape[1]), dtype=down.dtype, device=device)
        self.down[pos] = down

    def put(self, expert: int, rows: torch.Tensor) -> None:
        """Down-projected rows of `expert` computed elsewhere (on the host), reference order."""
        a, c = self.rows[expert]
        if self.down is None:
            self.down = torch.zeros((self.hidden_g.shape[0], rows.shape[1]), dtype=rows.dtype,
                                    device=self.hidden.device)
        self.down[a : a + c] = rows.to(self.down.device)

    def host_inputs(self, expert: int) -> torch.Tensor:
        a, c = self.rows[expert]
        return self.hidden_g[a : a + c]

    def finish(self) -> torch.Tensor:
        T, k = self.index.shape
        out = self.down
        if self.m.has_post_expert_norm:
            out = self.m.post_expert_norm(out)
        weighted = out * self.weights_g.unsqueeze(-1)  # [S, H]
        inv = torch.empty_like(self.perm)
        inv[self.perm] = torch.arange(self.perm.size(0), device=self.perm.device)
        weighted = weighted[inv]
        return weighted.view(T, k, -1).sum(dim=1).to(self.hidden.dtype)


class BatchedPlan(ExpertPlan):
    """`batched_mm_experts_forward`: one batched matrix-vector product per (token, top-k) row.
    A row's product depends on the batch it is computed in, so every round computes all rows
    (rows of experts not in the round use a stand-in slot and are discarded)."""

    def __init__(self, module: Any, hidden: torch.Tensor, top_k_index: torch.Tensor,
                 top_k_weights: torch.Tensor) -> None:
        super().__init__(module, hidden, top_k_index, top_k_weights)
        k = top_k_index.size(-1)
        self.ids = top_k_index.reshape(-1)  # [S]
        self.selected = hidden.repeat_interleave(k, dim=0)  # [S, H]
        self.experts = sorted(set(self.ids.tolist()))
        self.up: torch.Tensor | None = None
        self.down: torch.Tensor | None = None

    def compute(self, experts: list[int], slots: list[int], weights: Weights) -> None:
        from transformers.integrations.moe import _batched_linear

        device = self.hidden.device
        lut = torch.zeros(self.m.num_experts, dtype=torch.long)
        take = torch.zeros(self.m.num_experts, dtype=torch.bool)
        for e, s in zip(experts, slots):
            lut[e], take[e] = s, True
        srows = lut.to(device)[self.ids]  # [S]
        rows = take.to(device)[self.ids]  # [S]
        up = _batched_linear(self.selected, weights[self._up()][srows], bias=_bias(weights, self._up(), srows),
                             is_transposed=self.m.is_transposed)
        self.up = up if self.up is None else torch.where(rows[:, None], up, self.up)
        act = self._gated(self.up)
        down = _batched_linear(act, weights["down_proj"][srows], bias=_bias(weights, "down_proj", srows),
                               is_transposed=self.m.is_transposed)
        self.down = down if self.down is None else torch.where(rows[:, None], down, self.down)

    def put(self, expert: int, rows: torch.Tensor) -> None:
        mask = self.ids == expert
        if self.down is None:
            self.down = torch.zeros((self.ids.shape[0], rows.shape[1]), dtype=rows.dtype, device=self.hidden.device)
        self.down[mask] = rows.to(self.down.device)

    def host_inputs(self, expert: int) -> torch.Tensor:
        return self.selected[self.ids == expert]

    def finish(self) -> torch.Tensor:
        T, k = self.index.shape
        out = self.down
        if self.m.has_post_expert_norm:
            out = self.m.post_expert_norm(out)
        weighted = out * self.weights.reshape(-1).unsqueeze(-1)
        return weighted.view(T, k, -1).sum(dim=1).to(self.hidden.dtype)


class EagerPlan(ExpertPlan):
    """The experts classes' own loop: per hit expert (ascending), its tokens' rows through
    both projections, weighted, `index_add_` into a hidden-dtype output in expert order."""

    def __init__(self, module: Any, hidden: torch.Tensor, top_k_index: torch.Tensor,
                 top_k_weights: torch.Tensor) -> None:
        super().__init__(module, hidden, top_k_index, top_k_weights)
        E = module.num_experts
        mask = torch.nn.functional.one_hot(top_k_index, num_classes=E + 1).permute(2, 1, 0)  # [E+1, k, T]
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        self.experts = [int(e) for e in hit[:, 0].tolist() if e != E]
        self.where = {e: torch.where(mask[e]) for e in self.experts}  # (top_k_pos, token_idx)
        self.out: dict[int, torch.Tensor] = {}

    def compute(self, experts: list[int], slots: list[int], weights: Weights) -> None:
        F = torch.nn.functional
        for e, s in zip(experts, slots):
            pos, tok = self.where[e]
            gate, up = F.linear(self.hidden[tok], weights["gate_up_proj"][s]).chunk(2, dim=-1)
            h = F.linear(self.m.act_fn(gate) * up, weights["down_proj"][s])
            self.put(e, h)

    def put(self, expert: int, rows: torch.Tensor) -> None:
        pos, tok = self.where[expert]
        self.out[expert] = (rows.to(self.hidden.device) * self.weights[tok, pos, None]).to(self.hidden.dtype)

    def host_inputs(self, expert: int) -> torch.Tensor:
        return self.hidden[self.where[expert][1]]

    def finish(self) -> torch.Tensor:
        final = torch.zeros_like(self.hidden)
        for e in self.experts:
            final.index_add_(0, self.where[e][1], self.out[e])
        return final


PLANS: dict[str, type[ExpertPlan]] = {"grouped_mm": GroupedPlan, "batched_mm": BatchedPlan, "eager": EagerPlan}


def plan_class(implementation: str | None) -> type[ExpertPlan]:
    """The plan reproducing transformers' experts implementation `implementation`."""
    cls = PLANS.get(implementation or "eager")
    if cls is None:
        raise UnsupportedExperts(f"experts implementation {implementation!r} cannot be offloaded exactly; "
                                 f"load the model with one of: {', '.join(PLANS)}")
    return cls


def _grouped_linear() -> Any:
    from transformers.integrations.moe import _grouped_linear as linear

    return linear


def host_expert(module: Any, x: torch.Tensor, rows: dict[str, torch.Tensor]) -> torch.Tensor:
    """One expert on its own rows `x` [n, H] with its weights `rows` (name -> one row), as the
    eager loop computes it, unweighted: [n, H]. The `cpu` miss mode runs this on the host."""
    F = torch.nn.functional
    transposed = getattr(module, "is_transposed", False)

    def lin(a: torch.Tensor, w: torch.Tensor, name: str) -> torch.Tensor:
        out = a @ w if transposed else F.linear(a, w)
        b = rows.get(f"{name}_bias")
        return out if b is None else out + b

    if getattr(module, "has_gate", True):
        h = module._apply_gate(lin(x, rows["gate_up_proj"], "gate_up_proj"))
    else:
        h = module.act_fn(lin(x, rows["up_proj"], "up_proj"))
    return lin(h, rows["down_proj"], "down_proj")

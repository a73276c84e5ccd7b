"""The device slot pool: the fast tier, allocated once, never grown.

One tensor per expert parameter name, `[slots, ...]`, on the device. The cache assigns slot
numbers; the pool only remembers which expert each slot holds and refuses anything that would
break the two invariants the tests check: a slot holds at most one expert, and an expert sits
in at most one slot. Its memory is fixed at construction (`nbytes`).
"""

from __future__ import annotations

import torch

from casmoe.cache import PolicyError


class SlotPool:
    """`slots` preallocated expert-sized slots on `device`, one row of `layout` each
    (fused parameter name -> (row shape, dtype), as the store describes its experts)."""

    def __init__(self, layout: dict[str, tuple[tuple[int, ...], torch.dtype]], slots: int,
                 device: str | torch.device) -> None:
        self.device = torch.device(device)
        self.tensors = {
            name: torch.zeros((slots, *shape), dtype=dtype, device=self.device)
            for name, (shape, dtype) in layout.items()
        }
        self.holder = [-1] * slots
        self._slot_of: dict[int, int] = {}

    @property
    def slots(self) -> int:
        return len(self.holder)

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds on its device; constant for the pool's life."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def assign(self, slot: int, expert: int) -> None:
        """`slot` now (or soon, once its copy lands) holds `expert`; whoever held it is gone."""
        if not 0 <= slot < len(self.holder):
            raise PolicyError(f"slot {slot} outside the pool's {len(self.holder)} slots")
        other = self._slot_of.get(expert)
        if other is not None and other != slot:
            # the cache released the expert's old slot without a load (on-demand) and reloads it
            self.holder[other] = -1
        old = self.holder[slot]
        if old != -1 and old != expert:
            del self._slot_of[old]
        self.holder[slot] = expert
        self._slot_of[expert] = slot

    def slot_of(self, expert: int) -> int | None:
        return self._slot_of.get(expert)

    def row(self, slot: int) -> dict[str, torch.Tensor]:
        return {name: t[slot] for name, t in self.tensors.items()}

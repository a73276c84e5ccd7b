"""What a per-step placement weighs: copying an expert to the GPU, computing it on the host for
n tokens, computing it on the GPU for n tokens.

A cost-based policy (`fiddler`, `hybrimoe`) reads these prices, never a clock, so its
decisions are a function of the routing and the prices alone: runtimes given the same prices
make the same decisions (`casmoe.cache`). A runtime attaches its own
(`ExpertCache.attach_costs`): the simulator derives seconds from its compute model and link
(`casmoe.sim.passes.decide.ComputeCosts`), and the backend takes the same function of a calibrated
hardware profile (`casmoe calibrate`). Replay has no hardware: a policy then uses its source's
published constants (`PublishedCosts`), in that source's own units, where only their ratios
matter.
"""

from __future__ import annotations

from dataclasses import dataclass


class ExpertCosts:
    """Prices in one unit (seconds for a runtime's), by the cache's own layer numbers."""

    def copy(self, layer: int) -> float:
        """One expert of `layer` copied to the GPU."""
        raise NotImplementedError

    def host(self, layer: int, tokens: int) -> float:
        """One expert of `layer` computed on the host for `tokens` tokens (activations both ways)."""
        raise NotImplementedError

    def gpu(self, layer: int, tokens: int) -> float:
        """One resident expert of `layer` computed on the GPU for `tokens` tokens."""
        raise NotImplementedError

    def shifted(self, first: int) -> ExpertCosts:
        """The same prices for a cache whose layer 0 is layer `first` of these (one device's layers)."""
        return self if first == 0 else _Shifted(self, first)


@dataclass(frozen=True)
class PublishedCosts(ExpertCosts):
    """A source's constants, the same for every layer: a flat copy, a host cost linear in the
    tokens (plus a fixed part), a flat GPU cost."""

    copy_cost: float
    host_per_token: float
    gpu_cost: float = 0.0
    host_fixed: float = 0.0
    source: str = ""

    def copy(self, layer: int) -> float:
        return self.copy_cost

    def host(self, layer: int, tokens: int) -> float:
        return self.host_fixed + self.host_per_token * tokens

    def gpu(self, layer: int, tokens: int) -> float:
        return self.gpu_cost

    def shifted(self, first: int) -> ExpertCosts:
        return self


@dataclass(frozen=True)
class _Shifted(ExpertCosts):
    base: ExpertCosts
    first: int

    def copy(self, layer: int) -> float:
        return self.base.copy(self.first + layer)

    def host(self, layer: int, tokens: int) -> float:
        return self.base.host(self.first + layer, tokens)

    def gpu(self, layer: int, tokens: int) -> float:
        return self.base.gpu(self.first + layer, tokens)

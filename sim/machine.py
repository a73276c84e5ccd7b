"""`Machine`: what prices a token, the model at its precision on a box.

A run's timing depends on the model preset (its shapes), the precision its experts move at,
the hardware profile and how many of its GPUs the layers are split over, and whether copies
come from pinned memory. Those travel together as one value, so every driver (the offline
engine, the serving processes, calibration and validation) reads them from one place, and a
new part of the machine (a precision per part, a software stack, host threads) is a field here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry, Quant, split_layers
from casmoe.presets import ModelPreset, load_presets
from casmoe.sim.hardware import HardwareProfile

if TYPE_CHECKING:
    from casmoe.sim.compute import RooflineCompute
    from casmoe.trace import Trace


class SimConfigError(CasmoeError, ValueError):
    """A simulation that cannot be set up as asked (geometry mismatch, too many devices...)."""


@dataclass(frozen=True)
class Machine:
    """A model preset priced on `devices` GPUs of a hardware profile. `quant` None prices the
    experts at the trace's measured bytes (bf16 when it has none)."""

    preset: ModelPreset
    hardware: HardwareProfile
    devices: int = 1
    quant: Quant | None = None
    pinned: bool = True

    def check_geometry(self, trace: Geometry) -> None:
        """The trace's layers and experts must be the preset's; the error names presets that fit.

        `top_k` may differ: the trace says which experts run (an engine can force fewer than the
        model's native k, as the shared real Qwen trace does); the preset prices them."""
        g = self.preset.geometry
        if (trace.layers, trace.experts) == (g.layers, g.experts):
            return
        fits = presets_of_shape(trace)
        hint = (
            f"pass --model {' or --model '.join(fits)}"
            if fits
            else "add a preset with that shape to casmoe/presets/models.toml, or record a trace of this model"
        )
        raise SimConfigError(
            f"trace geometry ({trace.describe()}) does not match model preset {self.preset.name!r} ({g.describe()}); "
            f"{hint}"
        )

    def measured_bytes(self, trace: Geometry) -> bool:
        """Whether experts are priced at the trace's measured bytes: no precision forced, and
        the trace recorded from this model's width (the shipped tiny models route like Mixtral
        but are priced as the preset being simulated)."""
        return self.quant is None and bool(trace.layer_expert_bytes) and trace.hidden in (0, self.preset.geometry.hidden)

    def expert_bytes(self, trace: Trace) -> list[int]:
        """Bytes per expert per layer: the trace's measured ones (`measured_bytes`), else the
        preset's shape at the precision (bf16 unless forced)."""
        g = trace.geometry
        if self.measured_bytes(g):
            if min(g.layer_expert_bytes) <= 0:
                raise SimConfigError(
                    f"the trace records 0 bytes for the experts of layer {g.layer_expert_bytes.index(0)}; pass --quant "
                    f"(bf16, int8, ...) to price experts from the {self.preset.name} preset instead"
                )
            return list(g.layer_expert_bytes)
        return self.preset.geometry.bytes_per_layer(self.quant or Quant.BF16)

    def precision_label(self, trace: Geometry) -> str:
        """The experts' precision as a record names it: the forced one, `trace` (measured), or bf16."""
        return self.quant.value if self.quant else ("trace" if self.measured_bytes(trace) else Quant.BF16.value)

    def max_slots(self, expert_bytes: Sequence[int]) -> int:
        """Most slots per layer the GPUs hold next to the dense weights (capped at all experts)."""
        preset = self.preset
        g = preset.geometry
        head = 2 * preset.vocab * g.hidden * 2  # embedding + lm head, bf16
        best = g.experts
        for d, layers in enumerate(split_layers(g.layers, self.devices)):
            free = self.hardware.usable_bytes() - 2 * preset.dense_params_per_layer * len(layers)
            free -= head if d in (0, self.devices - 1) else 0
            per_slot = sum(expert_bytes[layer] for layer in layers)
            if per_slot > 0:  # experts of no known size (a shape without a width) take no memory
                best = min(best, max(0, int(free // per_slot)))
        return best

    def compute(self, expert_bytes: Sequence[int]) -> RooflineCompute:
        """The roofline times of this model's parts on this box."""
        from casmoe.sim.compute import RooflineCompute

        return RooflineCompute.build(self.hardware, self.preset, expert_bytes, self.pinned)

    def box(self) -> str:
        """'rtx4090x4 (4 GPUs)', or 'rtx4090x4, 2 of its 4 GPUs'."""
        hw = self.hardware
        if self.devices == hw.gpus:
            return f"{hw.name} ({hw.gpus} GPU{'s' * (hw.gpus > 1)})"
        return f"{hw.name}, {self.devices} of its {hw.gpus} GPU{'s' * (hw.gpus > 1)}"


def presets_of_shape(geometry: Geometry) -> list[str]:
    """Names of the presets with the layers and experts of `geometry`."""
    return [
        name
        for name, p in load_presets().items()
        if (p.geometry.layers, p.geometry.experts) == (geometry.layers, geometry.experts)
    ]

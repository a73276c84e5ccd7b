"""Will the run fit? Checked from the model's meta-device skeleton and the checkpoint's headers,
before any weight is read, so a bad setting costs a second instead of a model load: a device
that does not exist, a RAM tier larger than the machine's memory, a slot pool (plus the dense
share) larger than its device. Each is one line naming the number to change.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from casmoe.errors import CasmoeError
from casmoe.resources import available_memory

HEADROOM = 0.25 * 2**30
"""Bytes kept free on a device for activations, the KV cache and the allocator."""


class FitError(CasmoeError, ValueError):
    """A run that cannot fit the machine."""


def devices(names: Sequence[str]) -> list[torch.device]:
    """Parse and check `--device` values: a CUDA device must exist."""
    out = []
    for name in names or ["cpu"]:
        try:
            d = torch.device(name)
        except RuntimeError:
            raise FitError(f"--device {name!r} is not a device (cpu, cuda, cuda:N)") from None
        if d.type == "cuda":
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            index = 0 if d.index is None else d.index
            if index >= count:
                raise FitError(f"--device {name}: torch sees {count} CUDA device{'s' * (count != 1)}"
                               + (f" (cuda:0..cuda:{count - 1})" if count else ""))
            d = torch.device("cuda", index)
        elif d.type != "cpu":
            raise FitError(f"--device {name!r}: only cpu and cuda devices are supported")
        out.append(d)
    return out


def _free(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return available_memory()


def dense_bytes(model: Any, experts: Sequence[str]) -> int:
    """Bytes of a skeleton's tensors outside the experts modules (what loads once)."""
    skip = tuple(p + "." for p in experts)
    return sum(t.numel() * t.element_size() for n, t in [*model.named_parameters(), *model.named_buffers()]
               if not n.startswith(skip))


def check(devs: Sequence[torch.device], pool_bytes: Sequence[int], dense: Sequence[int], host_bytes: int) -> None:
    """Per device its slot pool and dense share must fit its free memory (less `HEADROOM`);
    the RAM tier must fit the host's available memory, together with everything the host
    itself holds (CPU devices' pools and dense shares)."""
    on_host = host_bytes
    gib = 2**30
    for d, pool, part in zip(devs, pool_bytes, dense):
        if d.type == "cpu":
            on_host += pool + part
            continue
        free = _free(d)
        if pool + part + HEADROOM > free:
            raise FitError(f"{d}: the slot pool ({pool / gib:.2f} GiB) and dense layers ({part / gib:.2f} GiB) "
                           f"do not fit its {free / gib:.2f} GiB free; lower --capacity")
    ram = available_memory()
    if host_bytes and on_host > ram:
        raise FitError(f"--host-cache of {host_bytes / gib:.2f} GiB (with {(on_host - host_bytes) / gib:.2f} GiB "
                       f"more on the host) exceeds the {ram / gib:.2f} GiB of RAM available; lower --host-cache")
    if on_host > ram:
        raise FitError(f"the slot pools and dense layers ({on_host / gib:.2f} GiB) exceed the {ram / gib:.2f} GiB "
                       "of RAM available; lower --capacity")

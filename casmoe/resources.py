"""What this machine can give a run: memory for a big allocation, CPU threads for torch.

Sizes that come from user input (a trace header, a geometry, a capacity) are checked here
before anything is allocated, so a typo like `n_layer=99999999999` is a one-line error in a
millisecond instead of a MemoryError after minutes of swapping.
"""

from __future__ import annotations

import os

from casmoe.errors import CasmoeError
from casmoe.report import sig


class ResourceError(CasmoeError, MemoryError):
    """An input whose declared size would not fit in this machine's memory."""


def available_memory() -> int:
    """Bytes the kernel says a new allocation can get without swapping (MemAvailable)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown: do not refuse


def check_allocation(nbytes: float, what: str) -> None:
    """Refuse `what` if it needs more than the memory available now."""
    free = available_memory()
    if nbytes > free:
        raise ResourceError(
            f"{what} needs {sig(nbytes / 2**30)} GiB but {sig(free / 2**30)} GiB are available; "
            "check the sizes it declares (layers, experts, tokens) or use a bigger machine"
        )


def default_threads() -> int:
    """torch CPU threads for a timed run: the cores this process may use that are not already
    busy (1-minute load average), at least 1. torch's default takes every core, which on a
    shared machine makes each thread wait for the others (measured: 0.4 instead of 8.2 tok/s)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    try:
        busy = round(os.getloadavg()[0])
    except OSError:
        busy = 0
    return max(1, cores - busy)

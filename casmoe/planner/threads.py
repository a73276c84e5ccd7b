"""Torch thread count for the planner's small models.

For models this small a second intra-op thread's synchronisation costs more than it saves,
and on a busy machine OpenMP spin-waiting makes it far worse (measured on the project's
2-core box under load: 0.15 s vs 3 s per EAP training step, 71 ms vs 446 ms per embedding).
"""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the enclosed torch work on one thread, restoring the caller's setting after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)

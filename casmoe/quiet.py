"""Library output casmoe silences inside its own loads: transformers' and huggingface_hub's
progress bars ("Loading weights: 100%|...") and their info-level logging, which a user who
ran `casmoe simulate` did not ask for. Nothing is imported until a load uses it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


@contextmanager
def quiet_loads() -> Iterator[None]:
    """Within the block, transformers and huggingface_hub draw no progress bar and log errors
    only; their earlier settings come back afterwards."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hub_bars = not are_progress_bars_disabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    disable_progress_bars()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if hub_bars:
            enable_progress_bars()
        if bars:
            hf_logging.enable_progress_bar()

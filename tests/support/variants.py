"""Every built-in policy with each option set the compiled-twin suites run it under."""

from __future__ import annotations

import dataclasses

from casmoe.policies import POLICIES
from casmoe.sim.box.hardware import HardwareProfile, load_profile

OPTIONS = {"casmoe": [{"predictor": "exact"}, {"predictor": "noisy", "noise": 0.5}], "sch": [{"m": 2}]}


VARIANTS = [(name, o) for name in POLICIES for o in OPTIONS.get(name, [{}])]


SLOW_LINK = dict(load_host_us=3.0, wake_us=2.0, resume_per_stall=0.1, copy_beside_us=4.0, decide_us=1.5,
                 decide_load_us=2.5)
"""The runtime costs the slow-link box sets beside its link, each non-zero so that every term is priced."""


def box(slow_link: bool, **more: float) -> HardwareProfile:
    """The seed box; with `slow_link`, its link 10^4 times slower and `SLOW_LINK`'s costs (and
    `more`) set: prefetches still in flight when used, so late hits, lazy commits, cancellations."""
    hw = load_profile("rtx4090x4")
    if slow_link:
        hw = dataclasses.replace(hw, h2d_pinned_gbs=hw.h2d_pinned_gbs / 1e4, **SLOW_LINK, **more)
    return hw

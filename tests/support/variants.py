"""Every built-in policy with each option set the compiled-twin suites run it under."""

from __future__ import annotations

from casmoe.policies import POLICIES

OPTIONS = {"casmoe": [{"predictor": "exact"}, {"predictor": "noisy", "noise": 0.5}], "sch": [{"m": 2}]}


VARIANTS = [(name, o) for name in POLICIES for o in OPTIONS.get(name, [{}])]

"""The hostile-input suites' hypothesis settings and a small synthetic trace to damage."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from casmoe.geometry import Geometry
from casmoe.synthetic import SynthConfig, generate
from casmoe.trace import Trace

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
                database=None)


G = Geometry(3, 6, 2, hidden=8, intermediate=4)


def small_trace(requests: int = 3, seed: int = 0) -> Trace:
    return generate(G, SynthConfig(requests=requests, prefill=(2, 4), decode=(3, 5), spec=True, seed=seed))

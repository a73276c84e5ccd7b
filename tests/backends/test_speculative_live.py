"""The backend computes `speculative`'s guess live, and it is the guess the recorder stores as `spec`."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from support.backend_models import one_thread, tiny  # noqa: E402,F401  (one_thread: autouse)

from casmoe.backends import record as rec  # noqa: E402
from casmoe.backends.runtime import OffloadedModel, Prompt  # noqa: E402
from casmoe.policies.speculative import Speculative  # noqa: E402


class Heard(Speculative):
    """Speculative that keeps every live guess handed to it, by (step, layer)."""

    def guess(self, layer, rows):
        self.heard = getattr(self, "heard", []) + [(layer, np.asarray(rows).copy())]
        super().guess(layer, rows)


@pytest.mark.parametrize("kind", ["mixtral", "olmoe"])
def test_live_guess_equals_the_recorded_spec(kind):
    prompt, steps = [3, 9, 27, 41, 50], 3
    recorded = tiny(kind)
    with rec.RoutingRecorder(recorded, spec=True) as recorder:
        [(rows, out)] = rec.generate_and_record(recorded, recorder, [prompt], max_new_tokens=steps)
    spec = rows["spec"]  # [T, L, k]: layer l+1's pick from layer l's output
    om = OffloadedModel(tiny(kind))
    with om.session(Heard, 2 * om.geometry.top_k, [Prompt(prompt)], max_new_tokens=steps) as s:
        s.serve([Prompt(prompt)], steps, False)
        cache = s.devs[0].cache
    L = om.geometry.layers
    heard = cache.heard
    assert len(heard) == steps * (L - 1)  # every step, every layer but the first
    T = len(prompt)
    for i, (layer, guess) in enumerate(heard):
        step = i // (L - 1)
        tokens = slice(0, T) if step == 0 else slice(T + step - 1, T + step)
        np.testing.assert_array_equal(guess, spec[tokens, layer - 1])
    assert cache.stats().prefetch_loads > 0

"""Today's batch-1 and static-batch results, unchanged to the last bit on every shipped trace.

The golden values were computed by the engine before the serving rewrite, and recomputed once
when the layer's timing model changed on purpose (see tests/support/sim_golden.py); every case re-runs
here through the current engine.
"""

from __future__ import annotations

import json

import pytest

from support.sim_golden import GOLDEN, TRACES, cases, run

STORED = json.loads(GOLDEN.read_text())


def _check(case) -> None:
    want = STORED[case.key()]
    got = run(case)
    diff = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    assert not diff, f"{case.key()}: {diff}"


@pytest.mark.parametrize("case", cases(traces=TRACES[:1]), ids=lambda c: c.key())
def test_first_requests_of_the_default_trace_unchanged(case):
    _check(case)


@pytest.mark.slow  # the same cases on the other shipped traces (about 30 s on 2 busy cores)
@pytest.mark.parametrize("case", cases(traces=TRACES[1:]), ids=lambda c: c.key())
def test_first_requests_of_every_other_shipped_trace_unchanged(case):
    _check(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", cases(full=True), ids=lambda c: c.key())
def test_whole_shipped_traces_unchanged(case):
    _check(case)

"""distinct-n over request outputs: closed-form cases."""

from __future__ import annotations

import pytest

from casmoe.metrics.diversity import distinct_ngram_ratio


def test_distinct_ngram_ratio_closed_forms() -> None:
    assert distinct_ngram_ratio([[1, 2, 3, 4, 5]], 4) == 1.0  # 2 four-grams, both new
    assert distinct_ngram_ratio([[7] * 9], 4) == pytest.approx(1 / 6)  # a loop: 6 copies of one
    assert distinct_ngram_ratio([[1, 2, 1, 2, 1, 2]], 2) == pytest.approx(2 / 5)
    assert distinct_ngram_ratio([[1, 2, 3, 4], [1, 2, 3, 4]], 4) == 0.5  # pooled over requests
    assert distinct_ngram_ratio([[1, 2], [3, 4]], 4) is None  # n-grams never cross requests
    assert distinct_ngram_ratio([], 4) is None
    with pytest.raises(ValueError):
        distinct_ngram_ratio([[1]], 0)

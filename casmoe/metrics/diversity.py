"""How varied recorded text is: the distinct-n ratio of the tokens requests produced.

A model stuck in a loop repeats its n-grams and, with them, its routing; the ratio is the
quality bar for the text behind a shipped trace (distinct-4-gram >= 0.8 in `sample` mode,
bench/RESULTS.md "Recording modes"). Definition (Li et al., 2016, "A Diversity-Promoting Objective Function for Neural
Conversation Models"): distinct n-grams over all n-grams, pooled over requests, with no n-gram
crossing from one request into the next; here over token ids.
"""

from __future__ import annotations

from typing import Iterable, Sequence


def distinct_ngram_ratio(sequences: Iterable[Sequence[int]], n: int = 4) -> float | None:
    """Distinct n-grams / n-grams over `sequences`; None when none is n tokens long."""
    if n < 1:
        raise ValueError("n must be >= 1")
    seen: set[tuple[int, ...]] = set()
    total = 0
    for seq in sequences:
        ids = [int(t) for t in seq]
        grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
        total += len(grams)
        seen.update(grams)
    return len(seen) / total if total else None

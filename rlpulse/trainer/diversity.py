"""Evaluation views of generated text: response diversity.

* distinct-n: unique n-grams over all n-grams across a set of responses (1.0: nothing
  repeats; low values: the policy says the same few things);
* repetition rate: within each response, the share of n-grams that repeat an earlier n-gram of
  the same response, pooled over responses.

Both are returned as ``(numerator, denominator)`` pairs, so they pool as fractions.

>>> distinct_n(["ab", "ab"], 1)
(2, 4)
>>> repetition(["aaa", "ab"], 1)
(2, 5)
"""

from __future__ import annotations

from collections.abc import Sequence


def _ngrams(text: str, n: int) -> list[str]:
    return [text[i : i + n] for i in range(len(text) - n + 1)]


def distinct_n(responses: Sequence[str], n: int) -> tuple[int, int]:
    """(unique n-grams, all n-grams) over all responses; tokens are characters."""
    grams = [g for r in responses for g in _ngrams(r, n)]
    return len(set(grams)), len(grams)


def repetition(responses: Sequence[str], n: int) -> tuple[int, int]:
    """(n-grams that repeat an earlier one in the same response, all n-grams)."""
    repeated = total = 0
    for response in responses:
        grams = _ngrams(response, n)
        repeated += len(grams) - len(set(grams))
        total += len(grams)
    return repeated, total

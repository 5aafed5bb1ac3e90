"""Statistics of timing samples: the distribution-free confidence interval of the median."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

CONFIDENCE = 0.95
"""The coverage of every confidence interval fusiontune reports."""


def median_ci(
    samples: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """A distribution-free confidence interval of the median, from order statistics.

    With ``n`` samples, the number below the true median is Binomial(n, 1/2); the interval
    ``[x_(j), x_(n-j+1)]`` covers the median with probability ``1 - 2 P(B <= j-1)``, and ``j``
    is the largest index that keeps that at least ``confidence``. Below 6 samples no such ``j``
    exists (at 95%) and the interval is the full range. The binomial tail is summed exactly
    (integer binomial coefficients), so no statistics package is imported.

    Args:
        samples: at least one sample.
        confidence: the coverage wanted, in (0, 1).

    Returns:
        (low, high).

    Raises:
        ValueError: no samples, or a confidence outside (0, 1).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"median_ci needs 0 < confidence < 1, got {confidence}")
    x = np.sort(np.asarray(samples, dtype=np.float64))
    n = len(x)
    if n == 0:
        raise ValueError("median_ci needs at least one sample")
    tail = (1.0 - confidence) / 2
    total = 1 << n
    below = 0  # sum of C(n, i) for i < j: 2^n P(B <= j-1)
    j = 0
    while j < n // 2:
        below += math.comb(n, j)
        if below / total > tail:  # P(B <= j) > tail: x_(j+1) would lose coverage
            break
        j += 1
    if j == 0:
        return float(x[0]), float(x[-1])
    return float(x[j - 1]), float(x[n - j])

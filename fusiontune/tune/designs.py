"""Two-level orthogonal arrays: the screening designs of ``--sampler fusion``."""

from __future__ import annotations

import math

import numpy as np


def two_level_design(k: int) -> np.ndarray:
    """A Plackett-Burman design for ``k`` two-level factors: N x k of +-1, balanced, orthogonal.

    N is the smallest size >= k + 1 among the Sylvester (4, 8, 16, 32, 64) and Paley (q + 1 for
    a prime q = 3 mod 4: 12, 20, 24, 44, 48, ...) Hadamard matrices; the factors are columns
    1..k of the normalised matrix (column 0, all +1, is the mean).
    """
    n = 4
    while True:
        # Paley sizes first: a Sylvester design is a regular fraction, where every pair's
        # product is exactly another column (a pair fully aliased with a main effect).
        if (_is_prime(n - 1) and (n - 1) % 4 == 3) or (n & (n - 1) == 0 and n > 2 * k):
            if n >= k + 1:
                break
        n += 4
    h = _sylvester(n) if n & (n - 1) == 0 else _paley(n - 1)
    h = h * h[:, :1]  # rows normalised: column 0 all +1
    return h[:, 1 : k + 1]


def _sylvester(n: int) -> np.ndarray:
    h = np.ones((1, 1))
    while len(h) < n:
        h = np.block([[h, h], [h, -h]])
    return h


def _paley(q: int) -> np.ndarray:
    residues = {(i * i) % q for i in range(1, q)}
    chi = np.array([0.0] + [1.0 if a in residues else -1.0 for a in range(1, q)])
    idx = np.arange(q)
    jac = chi[(idx[None, :] - idx[:, None]) % q]
    s = np.zeros((q + 1, q + 1))
    s[0, 1:] = 1.0
    s[1:, 0] = -1.0
    s[1:, 1:] = jac
    return s + np.eye(q + 1)


def _is_prime(m: int) -> bool:
    return m >= 2 and all(m % d for d in range(2, int(math.isqrt(m)) + 1))

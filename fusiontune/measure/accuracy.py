"""Accuracy metrics of a program's outputs against the float64 reference outputs.

Every metric is an error (0 is exact, larger is worse), so one bound ``error <= bound`` works for
any of them. Over several outputs, each metric is the worst across outputs.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fusiontune.errors import UserError

METRICS = ("max_abs", "max_rel", "rel_l2", "cosine")
"""Names a search space may bound, in the order reports list them."""


@dataclass(frozen=True)
class ErrorMetrics:
    """Errors of outputs ``a`` against reference ``b`` (worst over all outputs).

    Attributes:
        max_abs: ``max |a - b|``.
        max_rel: ``max |a - b| / max(|b|, floor)`` with ``floor = floor_frac * max |b|`` per
            output, so that elements of ``b`` near zero do not turn rounding into huge
            relative errors (with the default ``floor_frac = 1e-3`` an element counts relative to
            at least a thousandth of the output's largest magnitude).
        rel_l2: ``||a - b||_2 / ||b||_2``.
        cosine: cosine distance ``1 - <a, b> / (||a|| ||b||)``: 0 for parallel outputs, 1 for
            orthogonal ones, 2 for opposite ones; insensitive to a uniform scale error.
        finite: every output value (and every reference value) is finite. When False, every
            error above is ``inf``.
    """

    max_abs: float
    max_rel: float
    rel_l2: float
    cosine: float
    finite: bool

    @staticmethod
    def exact() -> ErrorMetrics:
        """All errors zero (a run identical to the reference)."""
        return ErrorMetrics(0.0, 0.0, 0.0, 0.0, True)

    @staticmethod
    def nonfinite() -> ErrorMetrics:
        """The record of a run that produced NaN or infinity."""
        return ErrorMetrics(math.inf, math.inf, math.inf, math.inf, False)


def compare(
    outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], floor_frac: float = 1e-3
) -> ErrorMetrics:
    """Compare every reference output with the output of the same name, in float64.

    Args:
        outputs: the outputs under test, by name (extra names are ignored).
        reference: the reference outputs, by name.
        floor_frac: the ``max_rel`` floor as a fraction of the output's largest reference
            magnitude (see :class:`ErrorMetrics`).

    Returns:
        The worst of each metric across outputs.

    Raises:
        KeyError: an output named in ``reference`` is missing.
        ValueError: an output's shape differs from its reference's.
    """
    worst = ErrorMetrics.exact()
    for name, ref in reference.items():
        if name not in outputs:
            raise KeyError(f"output {name!r} is missing (have {sorted(outputs)})")
        a = np.asarray(outputs[name], dtype=np.float64)
        b = np.asarray(ref, dtype=np.float64)
        if a.shape != b.shape:
            raise ValueError(f"output {name!r} has shape {a.shape}, reference {b.shape}")
        m = _compare_one(a.ravel(), b.ravel(), floor_frac)
        if not m.finite:
            return m
        worst = ErrorMetrics(
            max(worst.max_abs, m.max_abs),
            max(worst.max_rel, m.max_rel),
            max(worst.rel_l2, m.rel_l2),
            max(worst.cosine, m.cosine),
            True,
        )
    return worst


def _ratio(num: float, den: float) -> float:
    """``num / den`` where 0 / 0 is 0 (exact zero output) and x / 0 is inf."""
    if den > 0:
        return num / den
    return 0.0 if num == 0 else math.inf


def _compare_one(a: np.ndarray, b: np.ndarray, floor_frac: float) -> ErrorMetrics:
    if a.size == 0:
        return ErrorMetrics.exact()
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return ErrorMetrics.nonfinite()
    diff = np.abs(a - b)
    mag = np.abs(b)
    max_abs = float(diff.max())
    floor = floor_frac * float(mag.max())
    den = np.maximum(mag, floor)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(den > 0, diff / np.where(den > 0, den, 1.0), np.where(diff > 0, np.inf, 0.0))
    norm_a, norm_b = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if norm_a == 0 and norm_b == 0:
        cosine = 0.0
    elif norm_a == 0 or norm_b == 0:
        cosine = 1.0
    else:
        # Clipped: for near-identical vectors 1 - cos is rounding noise and may dip below 0.
        cosine = min(max(1.0 - float(np.dot(a, b)) / (norm_a * norm_b), 0.0), 2.0)
    return ErrorMetrics(
        max_abs=max_abs,
        max_rel=float(rel.max()),
        rel_l2=_ratio(float(np.linalg.norm(a - b)), norm_b),
        cosine=cosine,
        finite=True,
    )


def metric_value(metrics: ErrorMetrics, name: str) -> float:
    """The value of one metric by its name in :data:`METRICS`.

    Args:
        metrics: the errors of one run.
        name: one of :data:`METRICS`.

    Returns:
        The error.

    Raises:
        UserError: ``name`` is not a metric (the message names the closest ones).
    """
    if name not in METRICS:
        close = difflib.get_close_matches(name, METRICS, n=2, cutoff=0.3)
        hint = f"closest: {', '.join(close)}; " if close else ""
        raise UserError(f"unknown accuracy metric {name!r} ({hint}known: {', '.join(METRICS)})")
    return float(getattr(metrics, name))

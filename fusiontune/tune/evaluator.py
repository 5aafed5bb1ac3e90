"""The Evaluator protocol, and the in-process evaluator.

Every evaluator (local, Ray, external command, replay) answers a batch of requests with one
result per request, in order. A batch lets an evaluator compile in parallel and then measure one
at a time per machine (TVM's builder / runner split).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from fusiontune.measure import MeasureConfig
from fusiontune.tune.evaluate import evaluate_request
from fusiontune.tune.records import EvalRequest, EvalResult
from fusiontune.workloads import Workload


@runtime_checkable
class Evaluator(Protocol):
    """Measures configurations. ``evaluate`` never raises for a candidate's own failure."""

    def evaluate(self, requests: Sequence[EvalRequest]) -> list[EvalResult]:
        """One result per request, in request order."""
        ...

    def close(self) -> None:
        """Release workers and processes."""
        ...


class LocalEvaluator:
    """Evaluates in this process, one request after another (``--workers 0``, and tests)."""

    def __init__(self, workload: Workload, measure: MeasureConfig) -> None:
        self.workload = workload
        self.measure = measure

    def evaluate(self, requests: Sequence[EvalRequest]) -> list[EvalResult]:
        return [evaluate_request(self.workload, r, self.measure) for r in requests]

    def close(self) -> None:
        return None

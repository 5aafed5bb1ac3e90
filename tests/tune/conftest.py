"""Shared fixtures of the tuning tests: a real local Ray cluster, started once per module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """A local Ray instance with 2 CPUs and one measure slot, as ``fusiontune tune`` starts it.

    Evaluators created while it is up use it as is (and leave it running when closed); each
    actor takes one CPU, so close one 2-worker evaluator before starting the next.
    """
    ray = pytest.importorskip("ray")
    from fusiontune.tune.ray_evaluator import start_ray, stop_ray

    owned = start_ray(None, num_cpus=2)
    yield ray
    if owned:
        stop_ray()  # and the watchdog with it: nothing of this instance outlives the module

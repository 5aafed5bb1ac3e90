"""SearchSpace: what a ``search_spaces/*.toml`` file says a sweep is (the loader fills it in)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from fusiontune.measure import MeasureConfig


@dataclass(frozen=True)
class SearchSpace:
    """A validated search space.

    Attributes:
        path: the file it came from.
        name: the study name used by default (the file's stem unless set).
        workload: a built-in workload name.
        sizes: the workload's size parameters.
        searched: pass names whose on/off is a search dimension (``pass.<Name>``).
        fixed: pass name -> on/off for passes held fixed during the search.
        splits: ``"Pass.point"`` -> the values searched (``split.<Pass>.<point>``); a single value
            fixes it.
        metric: the error metric bounded (max_abs, max_rel, rel_l2, cosine).
        bound: the accuracy bound: a configuration is feasible when ``error <= bound``.
        measure: the measurement protocol.
        sampler: tpe | random | grid | nsga2.
        trials: the default trial budget.
        timeout_s: the default wall-time budget, seconds (None: no limit).
        seed: the sampler seed.
        top_k: how many configurations the confirmation stage measures again.
        workers: default number of Ray workers (0: in process).
        trial_timeout_s: a trial running longer than this fails.
    """

    path: str
    name: str
    workload: str
    sizes: Mapping[str, int]
    searched: tuple[str, ...]
    fixed: Mapping[str, bool]
    splits: Mapping[str, tuple[int, ...]]
    metric: str = "max_rel"
    bound: float = 1e-3
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    sampler: str = "tpe"
    trials: int = 40
    timeout_s: float | None = None
    seed: int = 0
    top_k: int = 5
    workers: int = 2
    trial_timeout_s: float = 300.0

"""The sampler name table: ``--sampler tpe | random | grid | nsga2 | fusion``.

Adding a sampler is one factory and one row in :data:`SAMPLERS`. Every factory gets the search
space, the seed, the trial budget and the constraint function (the accuracy bound), and says
whether the sampler took the constraint (optuna's ``constraints_func``); for the others the loop
stores the constraint on the trial itself, so every trial carries it the same way.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from fusiontune.errors import UserError
from fusiontune.workloads import space as _space
from fusiontune.workloads.space import MAX_GRID_SIZE, SearchSpace, distributions, grid_size

NSGA2_POPULATION = 16
ConstraintsFunc = Callable[[FrozenTrial], Sequence[float]]


@dataclass(frozen=True)
class SamplerChoice:
    """A built sampler, and whether it evaluates ``constraints_func`` itself."""

    sampler: optuna.samplers.BaseSampler
    takes_constraints: bool
    objectives: int = 1


class FreshTPESampler(optuna.samplers.TPESampler):
    """Multivariate TPE that does not propose a configuration the study already holds.

    In a small categorical space TPE's density of good points soon peaks on the best
    configurations found, and it proposes them again and again: each repeat costs a trial and
    teaches it nothing. Here a repeat is drawn again (a few times, the generator moves on), and
    if TPE insists, an unseen configuration is drawn uniformly instead, while any is left.
    """

    redraws = 4
    uniform_draws = 64

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, Any]
    ) -> dict[str, Any]:
        params = super().sample_relative(study, trial, search_space)
        if not params or set(params) != set(search_space):
            return params  # the random start-up trials, or a partial relative space
        seen = {
            _point(t.params) for t in study.get_trials(deepcopy=False) if t.number != trial.number
        }
        for _ in range(self.redraws):
            if _point(params) not in seen:
                return params
            params = super().sample_relative(study, trial, search_space)
        rng = self._rng.rng
        for _ in range(self.uniform_draws):
            if _point(params) not in seen:
                break
            params = {
                name: d.choices[rng.randint(len(d.choices))] for name, d in search_space.items()
            }
        return params


def _point(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))


def _tpe(
    space: SearchSpace, seed: int, n_trials: int, constraints: ConstraintsFunc
) -> SamplerChoice:
    # constant_liar: a batch asked before any of it is told must not pile onto one point.
    sampler = FreshTPESampler(
        seed=seed, multivariate=True, constant_liar=True, constraints_func=constraints
    )
    return SamplerChoice(sampler, True)


def _random(
    space: SearchSpace, seed: int, n_trials: int, constraints: ConstraintsFunc
) -> SamplerChoice:
    return SamplerChoice(optuna.samplers.RandomSampler(seed=seed), False)


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler whose ``after_trial`` does not call ``study.stop()``.

    ``study.stop()`` raises outside ``study.optimize``, so optuna's GridSampler breaks the
    ``tell`` of the last grid point in an ask/tell loop; the loop asks ``is_exhausted`` instead.
    """

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: Any, values: Any) -> None:
        return None


def _grid(
    space: SearchSpace, seed: int, n_trials: int, constraints: ConstraintsFunc
) -> SamplerChoice:
    size = grid_size(space)
    if size > MAX_GRID_SIZE:
        raise UserError(
            f"{space.path}: the grid has {size} points (more than {MAX_GRID_SIZE}); search fewer"
            " passes or split values, or use --sampler tpe"
        )
    dists: dict[str, Any] = distributions(space)  # all categorical
    grid = {name: list(d.choices) for name, d in dists.items()}
    return SamplerChoice(_AskTellGridSampler(grid, seed=seed), False)


def _nsga2(
    space: SearchSpace, seed: int, n_trials: int, constraints: ConstraintsFunc
) -> SamplerChoice:
    # optuna's default population (50) would make a 40-trial sweep pure random sampling. The size
    # must not depend on the budget: a resumed study keeps its generations.
    population = NSGA2_POPULATION
    sampler = optuna.samplers.NSGAIISampler(
        seed=seed, population_size=population, constraints_func=constraints
    )
    return SamplerChoice(sampler, True, objectives=2)


def _fusion(
    space: SearchSpace, seed: int, n_trials: int, constraints: ConstraintsFunc
) -> SamplerChoice:
    from fusiontune.tune.fusion_sampler import FusionSampler, space_culprits

    # The culprits of an earlier `fusiontune bisect` of this space are prior knowledge.
    sampler = FusionSampler.for_space(
        space, seed=seed, culprits=space_culprits(space), n_trials=n_trials
    )
    return SamplerChoice(sampler, False)


SAMPLERS: dict[str, Callable[[SearchSpace, int, int, ConstraintsFunc], SamplerChoice]] = {
    "tpe": _tpe,
    "random": _random,
    "grid": _grid,
    "nsga2": _nsga2,
    "fusion": _fusion,
}
# The space loader validates `search.sampler` against its own list (it must not import optuna);
# the two lists are one.
assert tuple(SAMPLERS) == _space.SAMPLERS, "the sampler table and space.SAMPLERS differ"


def make_sampler(
    name: str, space: SearchSpace, seed: int, n_trials: int, constraints: ConstraintsFunc
) -> SamplerChoice:
    """Build the sampler ``name`` for ``space``.

    Args:
        name: a key of :data:`SAMPLERS`.
        space: the search space.
        seed: the sampler seed.
        n_trials: the trial budget.
        constraints: trial -> ``(error - bound,)``; feasible when <= 0.

    Returns:
        The sampler, whether it took ``constraints``, and the number of objectives.

    Raises:
        UserError: an unknown name, or a grid over more than 10000 points.
    """
    factory = SAMPLERS.get(name)
    if factory is None:
        raise UserError(f"unknown sampler {name!r} (known: {', '.join(SAMPLERS)})")
    with warnings.catch_warnings():
        # constraints_func is deprecated in optuna 5 in favour of Trial.set_constraint, which
        # optuna 4 lacks; both store the same "constraints" system attr that samplers read.
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return factory(space, seed, n_trials, constraints)

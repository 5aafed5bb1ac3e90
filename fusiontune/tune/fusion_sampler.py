"""``--sampler fusion``: a model-based sampler made for fusion-switch spaces.

A trial on the real target (an ATC conversion and an inference run) takes minutes, so every trial
must teach something. TPE models the switches nearly independently and spends trials on repeats;
this sampler models what fusion spaces are made of:

1. **Initial design**, after the enqueued baselines (defaults, all-off, each inexact pass alone):
   a Plackett-Burman screening design over the dimensions that can change the program, about
   ``n_switches + 1`` runs (at most half the budget): every main effect is estimated from all
   of them, where one-at-a-time flips from the defaults (``design="oat"``) estimate each from
   two, which under 2% timing noise is as noisy as the effects themselves. The Paley sizes (12,
   20, 24) come first: their pairs are only partly aliased with main effects. A split point's
   runs cycle through its cut values; the column of a culprit (known, or seen to break the bound
   during the design) stays off.
2. **Thompson sampling** from :class:`~fusiontune.tune.surrogate.HorseshoeModel` of
   ``log(runtime)`` with main effects and pairwise interactions (BOCS's model: a horseshoe prior
   on the pairs, Gibbs-sampled; ``model="ard"`` is the cheaper evidence-fitted Gaussian prior of
   :class:`~fusiontune.tune.surrogate.BayesianLinearModel`): one posterior draw of the main
   effects per ask (the pairs at their posterior mean: ``pair_draw``), minimised over the space by enumeration when it has at most
   ``max_enumerate`` points, by local search with restarts otherwise. Every third ask
   (``greedy_every``) minimises the posterior mean instead of a draw: the best point the model
   knows of gets measured, not only its neighbours. The ask after it (``contrast_every``) is a
   step of best-arm identification: among the best fresh points, the one whose run most
   shrinks the uncertainty between the recommendation and its strongest challenger.
3. **Feasibility**: a second Bayesian linear model (main effects) of the accuracy margin
   ``clip(log(error / bound), -3, 3)``; failed trials (build failed, timeout) count as
   ``+3``. Prior knowledge enters as prior means: an inexact pass (the registry's
   ``exact = False``) is expected to raise the margin, a culprit a bisection named (``culprits``)
   to break the bound. A point is proposed only when its predicted P(feasible) is at least
   ``min_feasible``.
4. **No repeats**: a point any trial holds (measured, failed, or asked and not yet told: the
   pending points of a batch) is never proposed again, nor one that generates the same program:
   a pass that ran and matched nothing in every measured trial where it was on (the trials'
   fusion reports), each pass that matched anywhere having been off in one of them, is inert,
   and a split point of a pass that is off is irrelevant, so points are compared in that
   canonical form. (A pass that matched nothing only where its competitors were on is a
   suspect: it stays searchable, and the design gives it its spare columns.)

Noise: each runtime observation is weighted by its own spread (the 95% interval of its median,
or its IQR). The initial design is randomised per seed (run order, each column's sign).
Everything is rebuilt from ``study.trials`` on every ask: no hidden state, so storage, resume,
several drivers and Ray work as with any optuna sampler; a draw is seeded by
``(seed, trial.number)``, so a seed gives the same sweep.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial
from scipy.special import ndtr

from fusiontune.tune._history import MARGIN_CLIP, History
from fusiontune.tune.designs import two_level_design
from fusiontune.tune.surrogate import (
    BayesianLinearModel,
    Coding,
    HorseshoeModel,
    one_blas_thread,
)

if TYPE_CHECKING:
    from fusiontune.workloads.space import SearchSpace

RUNTIME_MODELS: dict[str, type[BayesianLinearModel]] = {
    "horseshoe": HorseshoeModel,
    "ard": BayesianLinearModel,
}
# Few passes break the bound: the feasibility model's main effects are sparse, each its own prior.
SPARSE_MAINS: dict[str, dict[str, bool]] = {
    "horseshoe": {"main_horseshoe": True},
    "ard": {"sparse_mains": True},
}
CONTRAST_POOL = 512  # a contrast run is chosen among this many best fresh points (posterior mean)
_DESIGN_STREAM = 0x5EED  # the design's random stream, apart from the asks' (seed, number)
CULPRIT_PRIOR = MARGIN_CLIP  # a culprit switched on moves the margin by 2x this: from -3 to +3
INEXACT_PRIOR = 1.0  # an inexact pass switched on: expected to raise the margin by 2


def bisect_culprits(path: str | Path) -> tuple[str, ...]:
    """The culprit passes a ``fusiontune bisect`` wrote to ``bisect.json``; () when there is none.

    Args:
        path: the ``bisect.json`` (``results/<name>/bisect.json``).

    Returns:
        The ``pass`` of every entry of its ``culprits`` list; () for a missing or unreadable file.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return tuple(str(c["pass"]) for c in data.get("culprits") or () if c.get("pass"))
    except (OSError, ValueError, TypeError, AttributeError, KeyError):
        return ()


class FusionSampler(BaseSampler):
    """Thompson sampling over a BLR surrogate with a feasibility model (module docstring).

    Args:
        search_space: the dimensions, ``distributions(space)``: categoricals (``pass.<Name>``
            "off"/"on", ``split.<Pass>.<point>`` ints).
        defaults: the defaults' parameters, the centre of the initial design; without them the
            design starts from the study's first complete trial.
        bound: the accuracy bound (the margin is ``log(error / bound)``); None: the constraint
            value itself is the margin.
        inexact: passes whose rewrite changes numerics (prior: likely to break the bound).
        culprits: passes a bisection found to break the bound (prior: they do).
        seed: the seed; each ask draws from ``(seed, trial.number)``.
        design: the initial design: ``screening`` (a two-level orthogonal array), ``oat`` (one
            switch at a time from the defaults) or ``none``.
        min_feasible: the least predicted P(feasible) of a proposed point.
        max_enumerate: minimise by enumeration up to this many points, by local search above.
        greedy_every: every this many trials, minimise the posterior mean instead of a draw
            (0: never). On the planted jobs (8 seeds of 4 jobs, 40 trials), every third trial
            greedy measured the optimum in 31 of 32 runs against 27 of 32 without.
        contrast_every: every this many trials, one after each greedy one, a contrast run
            (:meth:`_contrast`; 0: never).
        model_options: options of the runtime model (:class:`BayesianLinearModel` or
            :class:`HorseshoeModel`).
        feasibility_pairs: pairwise terms in the feasibility model (a pair of passes that
            breaks the bound only together).
        feasibility_model: ``"horseshoe"`` (a horseshoe on every main effect and pair, centred
            at the inexact and culprit priors) or ``"ard"`` (the evidence-fitted Gaussian
            model). On the planted pair24 job (two passes that each help and break the bound
            together), ARD gave the optimum P(feasible) 0.12 after 80 trials and no seed came
            within 2%; the horseshoe let all 6 seeds measured within 1% by 80 trials. Over 20
            seeds at 40 trials, within 1%: 97 of the 140 runs of the jobs up to 16 switches
            against ARD's 95; add20 10 of 20 (ARD 12), three24 0 (1), pair24 2 (0).
        max_design: at most this many design runs (:meth:`for_space`: half the budget).
        pair_draw: how much of the pairs' posterior spread a draw keeps (0: the pairs at their
            posterior mean, the main effects drawn; 1: a full Thompson draw). With more pairs
            than runs, full draws of hundreds of pair terms swamp the main effects and the
            search wanders: on the planted 16-switch job, 0 found the optimum in 5 of 6 seeds,
            1 in 1 of 6. Under the horseshoe (which shrinks the idle pairs itself), full draws
            were within 1% of the optimum at 40 trials in 45 of 80 runs (issue12, pair12,
            three16, noisy16; 20 seeds) against 41, but within 2% in 54 against 59 and within
            1% on pair12 in 3 against 6: not a clear gain, so 0 stays.
        model: the runtime model's prior on the pairs: ``horseshoe`` (BOCS's,
            :class:`HorseshoeModel`, Gibbs-sampled) or ``ard`` (:class:`BayesianLinearModel`,
            evidence-fitted Gaussian scales).
    """

    def __init__(
        self,
        search_space: Mapping[str, BaseDistribution],
        *,
        defaults: Mapping[str, Any] | None = None,
        bound: float | None = None,
        inexact: Sequence[str] = (),
        culprits: Sequence[str] = (),
        seed: int | None = None,
        design: str = "screening",
        min_feasible: float = 0.5,
        max_enumerate: int = 2**16,
        greedy_every: int = 3,
        contrast_every: int = 3,
        model_options: Mapping[str, Any] | None = None,
        feasibility_pairs: bool = True,
        max_design: int | None = None,
        pair_draw: float = 0.0,
        model: str = "horseshoe",
        feasibility_model: str = "horseshoe",
    ) -> None:
        for name, d in search_space.items():
            if not isinstance(d, CategoricalDistribution):
                raise ValueError(f"{name}: FusionSampler searches categorical dimensions only")
        self.dists = dict(search_space)
        self.coding = Coding(list(self.dists), self.dists)
        self.defaults = dict(defaults) if defaults is not None else None
        self.bound = bound
        self.inexact = tuple(inexact)
        self.culprits = tuple(culprits)
        self.seed = _fresh_seed() if seed is None else seed
        self.design = design
        self.min_feasible = min_feasible
        self.max_enumerate = max_enumerate
        self.greedy_every = greedy_every
        self.contrast_every = contrast_every
        self.model_options = dict(model_options or {})
        self.feasibility_pairs = feasibility_pairs
        self.feasibility_model = feasibility_model
        self.max_design = max_design
        self.pair_draw = pair_draw
        for what, name in (("model", model), ("feasibility_model", feasibility_model)):
            if name not in RUNTIME_MODELS:
                raise ValueError(f"{what} {name!r}: one of {', '.join(RUNTIME_MODELS)}")
        self.model = model
        names = self.coding.names
        self._off = np.array([_index(c, "off") for c in self.coding.choices])
        # split.<Pass>.<point> -> the dimension of pass.<Pass>, when the pass is searched
        self._owner = np.array(
            [
                names.index(f"pass.{n.split('.')[1]}")
                if n.startswith("split.") and f"pass.{n.split('.')[1]}" in names
                else -1
                for n in names
            ]
        )
        self._sizes = np.array([len(c) for c in self.coding.choices])
        self._grid: np.ndarray | None = None

    @classmethod
    def for_space(
        cls,
        space: SearchSpace,
        seed: int | None = None,
        culprits: Sequence[str] = (),
        n_trials: int | None = None,
        **kw: Any,
    ) -> FusionSampler:
        """The sampler of a search space: its dimensions, defaults, bound and inexact passes.

        Args:
            space: the search space.
            seed: the seed.
            culprits: passes a bisection found to break the bound.
            n_trials: the trial budget; the design takes at most half of it.
            **kw: further :class:`FusionSampler` arguments.
        """
        from fusiontune.workloads.space import baseline_params, distributions, inexact_searched

        options: dict[str, Any] = {"max_design": max(4, n_trials // 2)} if n_trials else {}
        options.update(kw)
        return cls(
            distributions(space),
            defaults=baseline_params(space)["defaults"],
            bound=space.bound,
            inexact=inexact_searched(space),
            culprits=culprits,
            seed=seed,
            **options,
        )

    # ---- optuna's sampler interface --------------------------------------------------------
    def reseed_rng(self) -> None:
        self.seed = _fresh_seed()

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return dict(self.dists)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space or trial.system_attrs.get("fixed_params"):
            return {}  # an enqueued trial: its parameters are fixed
        levels = self.propose(study.get_trials(deepcopy=False), trial.number)
        params = self._params(levels)
        return {k: v for k, v in params.items() if k in search_space}

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        rng = np.random.default_rng([self.seed, trial.number, len(trial.params)])
        return optuna.samplers.RandomSampler(seed=int(rng.integers(2**31))).sample_independent(
            study, trial, param_name, param_distribution
        )

    # ---- proposing -------------------------------------------------------------------------
    def propose(self, trials: Sequence[FrozenTrial], number: int) -> np.ndarray:
        """The level vector (an index into each dimension's choices) for trial ``number``."""
        with one_blas_thread():  # small matrices: threads only synchronise
            return self._propose(trials, number)

    def _propose(self, trials: Sequence[FrozenTrial], number: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, number])
        hist = History(self, [t for t in trials if t.number != number])
        design = self._design(hist)
        if design:
            return hist.canonical(design[0][None, :])[0]
        if len(hist.y) >= 2:
            greedy = self.greedy_every > 0 and number % self.greedy_every == 0
            contrast = self.contrast_every > 0 and number % self.contrast_every == 1
            choice = self._thompson(hist, rng, greedy, contrast)
            if choice is not None:
                return choice
        return self._random_fresh(hist, rng)

    def _design(self, hist: History) -> list[np.ndarray]:
        """The initial design's points that no trial holds yet (the first is proposed)."""
        active = [k for k in range(len(self._sizes)) if k not in hist.suspect]
        # A suspect (matched nothing wherever it was on) may only have lost its ops to other
        # passes: it takes the design's spare columns, which cost no runs.
        suspects = sorted(hist.suspect - hist.inert)
        if self.design == "screening" and active and suspects:
            size = len(two_level_design(len(active)))
            extra = len(suspects)
            while extra and len(two_level_design(len(active) + extra)) != size:
                extra -= 1
            active = sorted(active + suspects[:extra])
        culprit_dims = {self.coding.names.index(f"pass.{c}") for c in self._known_culprits()}
        culprit_dims |= hist.observed_culprits() | self._likely_culprits(hist)
        if self.design == "screening":
            rows = self._screening(hist, active, culprit_dims)
        elif self.design == "oat":
            rows = self._one_at_a_time(hist, active, culprit_dims)
        else:
            return []
        if self.max_design is not None:
            rows = rows[: self.max_design]
        if not rows or hist.sampled >= len(rows):
            return []
        return [p for p, fresh in zip(rows, hist.fresh(np.array(rows)), strict=True) if fresh]

    def _screening(
        self, hist: History, active: list[int], culprit_dims: set[int]
    ) -> list[np.ndarray]:
        """A two-level orthogonal array (Plackett-Burman), one column per active dimension: every
        main effect is estimated from all N runs, not from two. A split point's "+" runs cycle
        through its cut values; a culprit's column stays off (its runs would all break the
        bound, and its gain cannot be used anyway)."""
        if not active:
            return []
        design = two_level_design(len(active))
        # cut to the budget before the runs are shuffled: a fixed fraction of the array, the
        # same for every seed up to the signs (a random fraction of a Paley array lost 6 of 11
        # seeds within 1% on the planted 20-switch job, 24 runs cut to 20)
        design = self._randomised(design[: self.max_design])
        rows = [self._off.copy() for _ in design]
        for col, k in enumerate(active):
            if k in culprit_dims:
                continue
            high = np.flatnonzero(design[:, col] > 0)
            if self.coding.switches[k]:
                for r in high:
                    rows[r][k] = 1 - self._off[k]
            else:
                for i, r in enumerate(high):
                    rows[r][k] = 1 + i % (self._sizes[k] - 1)
        return rows

    def _randomised(self, design: np.ndarray) -> np.ndarray:
        """The design with its runs in a random order and each column's sign drawn: the same
        estimates (a column's sign and the run order change none), but no longer the same points
        for every seed (the normalised array's first run is all "+", every pass on: the defaults
        again). Seeded by ``seed`` alone, so every ask rebuilds the same design."""
        rng = np.random.default_rng([self.seed, _DESIGN_STREAM])
        signs = rng.choice([-1.0, 1.0], size=design.shape[1])
        return design[rng.permutation(len(design))] * signs

    def _one_at_a_time(
        self, hist: History, active: list[int], culprit_dims: set[int]
    ) -> list[np.ndarray]:
        """Each active dimension flipped once from the defaults (from all-off when the defaults
        break the bound and all-off holds it)."""
        centre = self._levels(self.defaults) if self.defaults is not None else hist.first
        if centre is None:
            return []
        if hist.infeasible(centre) and not hist.infeasible(self._off) and hist.knows(self._off):
            centre = self._off.copy()
        out = []
        for k in active:
            choices = self.coding.choices[k]
            point = centre.copy()
            if self._owner[k] >= 0 or not self.coding.switches[k]:  # a split point: cut once
                point[k] = len(choices) // 2 if len(choices) > 2 else 1
                if self._owner[k] >= 0:
                    point[self._owner[k]] = 1 - self._off[self._owner[k]]
            else:
                point[k] = 1 - centre[k]
                if k in culprit_dims and point[k] != self._off[k]:
                    continue  # it would only switch a known culprit on
            out.append(point)
        return out

    def _thompson(
        self, hist: History, rng: np.random.Generator, greedy: bool = False, contrast: bool = False
    ) -> np.ndarray | None:
        """Minimise a posterior draw of log runtime over the fresh points predicted feasible
        (``greedy``: the posterior mean; ``contrast``: :meth:`_contrast` among the best)."""
        runtime = self._runtime_model().fit(hist.X, hist.y, hist.noise)
        feas = self._feasibility(hist)

        def value(beta: np.ndarray, levels: np.ndarray) -> np.ndarray:
            c, b, q = runtime.quadratic(beta)
            x = self._features(levels)
            return c + x @ b + np.sum((x @ q) * x, axis=1)  # x_i^T q x_i, through BLAS

        def p_feasible(levels: np.ndarray) -> np.ndarray:
            if feas is None:
                return np.ones(len(levels))
            mean, sd = feas.predict(self._features(levels))
            spread = np.sqrt(sd**2 + feas.noise_sd**2)
            return ndtr(-mean / np.maximum(spread, 1e-12))

        beta = runtime.posterior_mean if greedy or contrast else runtime.sample_coefficients(rng)
        if self.pair_draw < 1.0:  # shrink the draw's pair part towards the posterior mean
            d = self.coding.n_features
            mean = runtime.posterior_mean
            beta[1 + d :] = mean[1 + d :] + self.pair_draw * (beta[1 + d :] - mean[1 + d :])

        def score(levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return value(beta, levels), p_feasible(levels)

        pool = self._enumerate(hist) if self._n_points() <= self.max_enumerate else None
        if pool is None:
            pool = self._local_search(hist, score, rng)
        pool = pool[hist.fresh(pool)]
        if not len(pool):
            return None
        p = p_feasible(pool)
        if not (p >= self.min_feasible).any():
            return pool[int(np.argmax(p))]  # nothing predicted feasible: the most likely one
        pool = pool[p >= self.min_feasible]
        if contrast:
            best = pool[np.argsort(value(beta, pool), kind="stable")[:CONTRAST_POOL]]
            choice = self._contrast(hist, runtime, best)
            if choice is not None:
                return choice
        return pool[int(np.argmin(value(beta, pool)))]

    def _contrast(
        self, hist: History, runtime: BayesianLinearModel, pool: np.ndarray
    ) -> np.ndarray | None:
        """The point of ``pool`` that best tells the recommendation from its strongest
        challenger: one step of best-arm identification in a linear model (Soare, Lazaric &
        Munos 2014's XY-allocation). The recommendation ``a`` is the measured feasible point of
        least posterior mean, the challenger ``b`` the point (measured, or in ``pool``) most
        likely to be faster; the chosen ``x`` shrinks the posterior variance of
        ``f(b) - f(a)`` most: ``(c' S phi(x))^2 / (noise + phi(x)' S phi(x))`` with ``c =
        phi(b) - phi(a)``. Near the optimum the noise hides differences of a percent from a
        single run of either point; a run chosen this way (typically ``a`` or ``b`` with one
        of the switches they differ in flipped) measures exactly the terms that decide them.
        None when there is no feasible measured point or no challenger."""
        ok = np.array([not hist.infeasible(lv) for lv in hist.levels], dtype=bool)
        if not ok.any() or not len(pool):
            return None
        measured, _ = runtime.predict(hist.X)
        a = int(np.flatnonzero(ok)[np.argmin(measured[ok])])
        phi_a = runtime.design(hist.X[a : a + 1])[0]
        rivals = np.vstack([hist.levels[ok], pool])
        phi = runtime.design(self._features(rivals))
        diff = phi - phi_a
        cov = runtime.posterior_cov
        var = np.sum((diff @ cov) * diff, axis=1)
        mu = diff @ runtime.posterior_mean
        p_better = np.where(var > 1e-18, ndtr(-mu / np.sqrt(np.maximum(var, 1e-18))), 0.0)
        if not (p_better > 0).any():
            return None
        c = diff[int(np.argmax(p_better))]
        phi_x = runtime.design(self._features(pool))
        own = hist.own_var()
        noise = runtime.misfit_var(own) + (float(np.mean(own)) if len(own) else 0.0)
        gain = (phi_x @ (cov @ c)) ** 2 / (max(noise, 1e-12) + np.sum((phi_x @ cov) * phi_x, axis=1))
        return pool[int(np.argmax(gain))]

    def predicted(self, trials: Sequence[FrozenTrial]) -> dict[int, float]:
        """The runtime model's posterior mean of log runtime at each measured trial.

        Fitted to every measured trial, it pools what the other trials say about each switch,
        so where one run's noise is as large as the differences between the best points, the
        posterior mean ranks them better than their own measurements do (the confirmation
        shortlists by both: :func:`fusiontune.tune.confirm.select_candidates`).

        Returns:
            trial number -> predicted log runtime; empty with fewer than 3 measured trials or
            a runtime that is not positive.
        """
        hist = History(self, trials)
        if len(hist.y) < 3 or not hist.log:
            return {}
        model = self._runtime_model().fit(hist.X, hist.y, hist.noise)
        mean, _ = model.predict(hist.X)
        # What the model cannot express (three-way terms, a pass's effect that depends on the
        # shapes it meets) is part of a point's runtime, not noise: a measured point's own
        # value gets the share of its residual that the misfit explains, against its own
        # measurement noise. Under pure noise (the misfit no larger than the runs' spread) this
        # is the posterior mean; under precise runs and a misfit, nearly the measurement.
        own = hist.own_var()
        if len(own):
            misfit = model.misfit_var(own)
            mean = mean + misfit / (misfit + own + 1e-300) * (hist.y - mean)
        return {n: float(m) for n, m in zip(hist.numbers, mean, strict=True)}

    def _runtime_model(self) -> BayesianLinearModel:
        return RUNTIME_MODELS[self.model](block=self.coding.block, **self.model_options)

    def _feasibility(self, hist: History) -> BayesianLinearModel | None:
        if not len(hist.z):
            return None
        prior = np.zeros(self.coding.n_features)
        for names, value in (
            (self.inexact, INEXACT_PRIOR),
            (self._known_culprits(), CULPRIT_PRIOR),
        ):
            for name in names:
                k = self.coding.names.index(f"pass.{name}")
                prior[self.coding.slices[k]] = value
        model = RUNTIME_MODELS[self.feasibility_model](
            interactions=self.feasibility_pairs,
            block=self.coding.block,
            prior_mean=prior,
            **SPARSE_MAINS[self.feasibility_model],
        )
        return model.fit(hist.Xz, hist.z)

    def _likely_culprits(self, hist: History) -> set[int]:
        """Switches the feasibility model says break the bound: switching one on raises
        ``log(error / bound)`` by more than 1 with 90% probability."""
        feas = self._feasibility(hist)
        if feas is None or len(hist.z) < 4:
            return set()
        out = set()
        for e in feas.effects(list(self.coding.labels), level=0.8):
            k = self.coding.names.index(e.terms[0]) if e.terms[0] in self.coding.names else -1
            if k >= 0 and self.coding.switches[k] and e.low > 1.0:
                out.add(k)
        return out

    def _known_culprits(self) -> list[str]:
        return [c for c in self.culprits if f"pass.{c}" in self.dists]

    # ---- the space -------------------------------------------------------------------------
    def _n_points(self) -> int:
        return math.prod(int(s) for s in self._sizes)

    def _enumerate(self, hist: History) -> np.ndarray:
        if self._grid is None:
            self._grid = np.indices(tuple(self._sizes)).reshape(len(self._sizes), -1).T
        grid = hist.canonical(self._grid)
        _, first = np.unique(self.codes(grid), return_index=True)
        return grid[np.sort(first)]

    def _local_search(self, hist: History, score: Any, rng: np.random.Generator) -> np.ndarray:
        """Steepest descent over one-dimension moves from the best points held and random
        starts; returns every point visited and the neighbours of where each descent ended."""
        starts = [hist.levels[i] for i in np.argsort(hist.y)[:5]] if len(hist.y) else []
        starts += [self._random(rng) for _ in range(10)]
        visited: list[np.ndarray] = []
        for start in starts:
            point = hist.canonical(start[None, :])[0]
            value, p = score(point[None, :])
            best = value[0] + (0.0 if p[0] >= self.min_feasible else 1e6)
            while True:
                near = self._neighbours(point, hist)
                visited.append(near)
                value, p = score(near)
                value = value + np.where(p >= self.min_feasible, 0.0, 1e6)
                i = int(np.argmin(value))
                if value[i] >= best:
                    break
                point, best = near[i], value[i]
        pool = np.vstack(visited)
        _, first = np.unique(self.codes(pool), return_index=True)
        return pool[np.sort(first)]

    def _neighbours(self, point: np.ndarray, hist: History) -> np.ndarray:
        rows = [point]
        for k, size in enumerate(self._sizes):
            for level in range(size):
                if level != point[k]:
                    row = point.copy()
                    row[k] = level
                    rows.append(row)
        return hist.canonical(np.array(rows))

    def _random(self, rng: np.random.Generator) -> np.ndarray:
        return np.array([rng.integers(s) for s in self._sizes])

    def _random_fresh(self, hist: History, rng: np.random.Generator) -> np.ndarray:
        """A random new program; once every program is held, a point whose parameters no trial
        holds (the loop answers it from the measurement of its program)."""
        raw = np.array([self._random(rng) for _ in range(256)])
        points = hist.canonical(raw)
        fresh = np.flatnonzero(hist.fresh(points))
        if len(fresh):
            return points[fresh[0]]
        if self._n_points() <= self.max_enumerate:  # the rest of the space, in order
            if self._grid is None:
                self._grid = np.indices(tuple(self._sizes)).reshape(len(self._sizes), -1).T
            raw = np.vstack([raw, self._grid])
        new = np.flatnonzero(~np.isin(self.codes(raw), hist.held_raw))
        return raw[new[0]] if len(new) else raw[0]

    def codes(self, levels: np.ndarray) -> np.ndarray:
        """One integer per level vector (mixed radix), or its bytes when the space is too large."""
        levels = np.asarray(levels, dtype=np.int64).reshape(-1, len(self._sizes))
        if self._n_points() < 2**62:
            radix = np.cumprod(np.concatenate([[1], self._sizes[:-1]])).astype(np.int64)
            return levels @ radix
        return np.array([row.tobytes() for row in levels], dtype=object)

    def _features(self, levels: np.ndarray) -> np.ndarray:
        x = -np.ones((len(levels), self.coding.n_features))
        for k, (sl, is_switch) in enumerate(
            zip(self.coding.slices, self.coding.switches, strict=True)
        ):
            if is_switch:
                on = 1 - self._off[k]
                x[:, sl.start] = np.where(levels[:, k] == on, 1.0, -1.0)
            else:
                for j in range(1, self._sizes[k]):
                    x[:, sl.start + j - 1] = np.where(levels[:, k] == j, 1.0, -1.0)
        return x

    def _levels(self, params: Mapping[str, Any]) -> np.ndarray | None:
        try:
            return np.array(
                [
                    c.index(params[n])
                    for n, c in zip(self.coding.names, self.coding.choices, strict=True)
                ]
            )
        except (KeyError, ValueError):
            return None

    def _params(self, levels: np.ndarray) -> dict[str, Any]:
        return {
            n: c[int(i)]
            for n, c, i in zip(self.coding.names, self.coding.choices, levels, strict=True)
        }


def _fresh_seed() -> int:
    return int(np.random.default_rng().integers(2**32))


def _index(choices: Sequence[Any], value: Any) -> int:
    """The level of ``value``; 0 when absent (a split point's first value, no cut, is its 'off')."""
    return choices.index(value) if value in choices else 0


def space_culprits(space: SearchSpace, results_root: str | Path = "results") -> tuple[str, ...]:
    """The culprits of ``results/<space name>/bisect.json`` (what ``fusiontune bisect SPACE``
    writes), when that file exists; ()."""
    return bisect_culprits(Path(results_root) / space.name / "bisect.json")

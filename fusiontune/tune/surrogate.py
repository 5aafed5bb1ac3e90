"""A surrogate of a fusion-switch space: Bayesian linear regression with pairwise interactions.

The model of BOCS (Baptista & Poloczek, 2018) for binary spaces, made cheap enough to refit on
every ask. A configuration is coded as a vector ``x`` of +-1 features (:func:`encode`); the
objective is modelled as

    f(x) = b0 + sum_i b_i x_i + sum_{i<j} b_ij x_i x_j + noise

with a sparsity prior on the coefficients: every ``b`` has its own Gaussian prior precision
``alpha``, set by maximising the evidence (MacKay's fixed point, the relevance vector machine's
"automatic relevance determination"), with a floor on the prior variance so that no coefficient
is ever declared exactly zero (a Student-t-like marginal prior; a pruned switch keeps some
uncertainty, so Thompson sampling can still try it). It costs a few n x n solves per iteration
(Woodbury when there are more coefficients than observations): for 24 switches (301
coefficients) and 80 observations a fit takes a few milliseconds.

Coding (:func:`encode`): a ``pass.<Name>`` switch is one feature, +1 on and -1 off. Any other
categorical dimension (a split point ``split.<Pass>.<point>``, whose first value is 0, no cut)
is one-hot over its values after the first, each indicator coded +1 when the dimension takes
that value and -1 otherwise (the first value is all -1). Pairs of indicators of the same
dimension are not interaction features (they are never both +1).

Effects (:meth:`BayesianLinearModel.effects`): fit on ``log(median runtime)``, a main effect
``2 * b_i`` is the change of log runtime when the switch goes from off to on, so
``exp(2 b_i) - 1`` is the relative change (a multiplicative share, the same at any runtime); the
report turns it into milliseconds at the defaults' runtime. A pair's effect ``2 * b_ij`` is how
much the first switch's on-effect grows (in log runtime) when the second switch is on, relative
to their average: the on-effect of switch i is ``2 (b_i + b_ij)`` with j on and ``2 (b_i - b_ij)``
with j off. Intervals are equal-tailed credible intervals of the Gaussian posterior.

This module needs numpy only (and the search space's dimension table for :func:`encode`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
from scipy.linalg import get_lapack_funcs

ON = "on"
OFF = "off"


# ---- coding --------------------------------------------------------------------------------------
def _choices_of(space_or_dists: Any) -> Mapping[str, Sequence[Any]]:
    """Each dimension's values, from a SearchSpace, optuna distributions, or a name -> values map."""
    if hasattr(space_or_dists, "searched") and hasattr(space_or_dists, "splits"):
        from fusiontune.workloads.space import dimension_choices

        return dimension_choices(space_or_dists)
    out: dict[str, Sequence[Any]] = {}
    for name, d in dict(space_or_dists).items():
        out[name] = tuple(d.choices) if hasattr(d, "choices") else tuple(d)
    return out


class Coding:
    """The +-1 coding of a space's dimensions (see the module docstring), both ways.

    Attributes:
        names: the dimensions, in order.
        choices: each dimension's values.
        labels: one label per feature: ``pass.X`` for a switch, ``split.P.point=4`` for an
            indicator.
        block: for each feature, the index of the dimension it codes.
        switches: for each dimension, whether it is an on/off switch (one feature, on = +1).
    """

    def __init__(self, names: Sequence[str], space_or_dists: Any) -> None:
        table = _choices_of(space_or_dists)
        self.names = tuple(names)
        self.choices = tuple(tuple(table[n]) for n in self.names)
        labels: list[str] = []
        block: list[int] = []
        self.slices: list[slice] = []
        self.switches: list[bool] = []
        for k, (name, values) in enumerate(zip(self.names, self.choices, strict=True)):
            start = len(labels)
            is_switch = set(values) == {ON, OFF}
            self.switches.append(is_switch)
            if is_switch:
                labels.append(name)
            elif len(values) == 2:
                labels.append(f"{name}={values[1]}")
            else:
                labels.extend(f"{name}={v}" for v in values[1:])
            block.extend([k] * (len(labels) - start))
            self.slices.append(slice(start, len(labels)))
        self.labels = tuple(labels)
        self.block = np.asarray(block, dtype=np.int64)

    @property
    def n_features(self) -> int:
        return len(self.labels)

    def encode(self, params: Mapping[str, Any]) -> np.ndarray:
        """The feature vector of one configuration (every dimension must be in ``params``)."""
        x = -np.ones(self.n_features)
        for name, values, sl, is_switch in zip(
            self.names, self.choices, self.slices, self.switches, strict=True
        ):
            value = params[name]
            if is_switch:
                x[sl.start] = 1.0 if value == ON else -1.0
            else:
                i = values.index(value)
                if i > 0:
                    x[sl.start + i - 1] = 1.0
        return x

    def encode_many(self, rows: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """One row per configuration."""
        return np.asarray([self.encode(r) for r in rows]).reshape(len(rows), self.n_features)

    def decode(self, x: np.ndarray) -> dict[str, Any]:
        """The configuration of a feature vector (an indicator block with no +1 is the first value)."""
        out: dict[str, Any] = {}
        for name, values, sl, is_switch in zip(
            self.names, self.choices, self.slices, self.switches, strict=True
        ):
            if is_switch:
                out[name] = ON if x[sl.start] > 0 else OFF
            else:
                hot = np.flatnonzero(x[sl] > 0)
                out[name] = values[int(hot[0]) + 1] if len(hot) else values[0]
        return out

    def key(self, x: np.ndarray) -> bytes:
        """A hashable identity of a feature vector (for sets of measured points)."""
        return np.packbits(np.asarray(x) > 0).tobytes()


def feature_names(names: Sequence[str], space_or_dists: Any) -> list[str]:
    """The label of each feature :func:`encode` produces for these dimensions.

    Args:
        names: the dimensions, e.g. ``param_names(space)``.
        space_or_dists: a ``SearchSpace``, ``distributions(space)``, or a name -> values map.

    Returns:
        ``pass.X`` for a switch, ``split.P.point=v`` for each non-first value of a categorical.
    """
    return list(Coding(names, space_or_dists).labels)


def encode(params: Mapping[str, Any], names: Sequence[str], space_or_dists: Any) -> np.ndarray:
    """The +-1 feature vector of a configuration (the module docstring gives the coding).

    Args:
        params: a trial's parameters (``pass.X`` -> "on"/"off", ``split.P.point`` -> int).
        names: the dimensions to code, in order.
        space_or_dists: a ``SearchSpace``, ``distributions(space)``, or a name -> values map.

    Returns:
        A float vector, one entry per :func:`feature_names` label.

    Raises:
        KeyError: a dimension missing from ``params``. ValueError: a value outside its dimension.
    """
    return Coding(names, space_or_dists).encode(params)


def pair_index(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (i, j), i < j, feature pairs that are interaction features (not of the same dimension)."""
    i, j = np.triu_indices(len(block), k=1)
    keep = block[i] != block[j]
    return i[keep], j[keep]


# ---- the model -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Effect:
    """One term of the model as an effect on the objective, with a credible interval.

    Attributes:
        terms: one feature label (a main effect) or two (a pairwise interaction).
        mean: ``2 * b``: the change of the objective when the switch goes from off to on (for a
            pair: how much the first's on-effect grows when the second is on; module docstring).
        low, high: the equal-tailed credible interval of that change.
    """

    terms: tuple[str, ...]
    mean: float
    low: float
    high: float


class BayesianLinearModel:
    """Bayesian linear regression on +-1 features, with optional pairwise interactions.

    Features: intercept, the ``d`` main effects, and (``interactions=True``) every product
    ``x_i x_j`` of features of different dimensions (``block``). Each coefficient has a
    Gaussian prior ``N(prior_mean, 1/alpha)``; with ``sparse=True`` each ``alpha`` is set by
    evidence maximisation (ARD), its prior variance kept above ``(min_prior_sd * scale)**2``
    where ``scale`` is the standard deviation of ``y`` (so a coefficient is shrunk, never
    removed); with ``sparse=False`` every ``alpha`` stays at ``1 / (prior_sd * scale)**2``.
    The noise is ``sigma**2 + noise_sd_i**2``: a fitted model misfit (at least
    ``min_noise_sd * scale``) plus each observation's own measurement noise when given.

    Args:
        interactions: include the pairwise products.
        block: the dimension of each feature (:attr:`Coding.block`); pairs within a block are
            left out. Default: each feature its own dimension.
        sparse: ARD (evidence-maximised per-coefficient precisions).
        prior_sd: the prior sd of main effects, in units of y's sd (the start value under ARD).
        interaction_prior_sd: the same for pairs.
        min_prior_sd: the floor of a coefficient's prior sd under ARD (units of y's sd).
        min_noise_sd: the floor of the misfit sd (units of y's sd).
        prior_mean: prior means of the main-effect coefficients, in the units of y (e.g. a known
            culprit's expected contribution); zero when None.
        iterations: at most this many evidence iterations.
        sparse_mains: ARD per main effect too (default: the main effects share one
            evidence-fitted scale, as most switches of a fusion space matter).
        pair_prior: ``ard`` (one precision per pair) or ``group`` (one for all pairs).
        pair_cap: a pair's prior sd is at most this times the main effects' (effect hierarchy:
            with fewer runs than pairs, pairs picked from hundreds would otherwise explain by
            chance what the main effects do); 0: no cap.
        anchor: strength ``c`` of a Gamma(1 + c, c / alpha0) hyperprior holding each precision
            near its start value where the data say nothing (0: plain evidence maximisation).
    """

    def __init__(
        self,
        interactions: bool = True,
        block: Sequence[int] | np.ndarray | None = None,
        sparse: bool = True,
        prior_sd: float = 1.0,
        interaction_prior_sd: float = 0.5,
        min_prior_sd: float = 0.03,
        min_noise_sd: float = 0.02,
        prior_mean: Sequence[float] | np.ndarray | None = None,
        iterations: int = 60,
        sparse_mains: bool = False,
        pair_prior: str = "ard",
        pair_cap: float = 0.5,
        anchor: float = 0.0,
    ) -> None:
        self.interactions = interactions
        self.block = None if block is None else np.asarray(block, dtype=np.int64)
        self.sparse = sparse
        self.prior_sd = prior_sd
        self.interaction_prior_sd = interaction_prior_sd
        self.min_prior_sd = min_prior_sd
        self.min_noise_sd = min_noise_sd
        self.prior_mean_main = None if prior_mean is None else np.asarray(prior_mean, float)
        self.iterations = iterations
        self.sparse_mains = sparse_mains
        self.pair_prior = pair_prior
        self.pair_cap = pair_cap
        self.anchor = anchor
        self.d = 0
        self._fitted = False

    # ---- features ----------------------------------------------------------------------------
    def _pairs(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        block = self.block if self.block is not None else np.arange(d)
        if len(block) != d:
            raise ValueError(f"block has {len(block)} entries for {d} features")
        if not self.interactions:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        return pair_index(block)

    def design(self, X: np.ndarray) -> np.ndarray:
        """The design matrix: intercept, main effects, then the pairs in :meth:`terms` order."""
        X = np.atleast_2d(np.asarray(X, dtype=float))
        pi, pj = self._pairs(X.shape[1]) if not self._fitted else (self._pi, self._pj)
        return np.hstack([np.ones((X.shape[0], 1)), X, X[:, pi] * X[:, pj]])

    def terms(self, names: Sequence[str]) -> list[tuple[str, ...]]:
        """The term of every coefficient after the intercept: ``(name,)`` or ``(name_i, name_j)``."""
        if len(names) != self.d:
            raise ValueError(f"{len(names)} names for {self.d} features")
        out: list[tuple[str, ...]] = [(n,) for n in names]
        out += [(names[i], names[j]) for i, j in zip(self._pi, self._pj, strict=True)]
        return out

    # ---- fitting -----------------------------------------------------------------------------
    def fit(
        self, X: np.ndarray, y: np.ndarray, noise_sd: np.ndarray | Sequence[float] | None = None
    ) -> BayesianLinearModel:
        """Fit the posterior (and, under ARD, the prior precisions and the misfit noise).

        Args:
            X: n x d features (+-1, from :class:`Coding`).
            y: n observations (e.g. log runtimes).
            noise_sd: each observation's own measurement sd in the units of y (e.g. from its
                confidence interval); None or NaN entries: none known.

        Returns:
            self.
        """
        with one_blas_thread():
            return self._fit(X, y, noise_sd)

    def _standardise(self, X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Check the data, set the pairs, and return the design matrix and standardised y (the
        prior scales are relative to y's spread: ``offset``, ``scale``)."""
        X = np.atleast_2d(np.asarray(X, dtype=float))
        y = np.asarray(y, dtype=float).ravel()
        n, d = X.shape
        if len(y) != n:
            raise ValueError(f"{n} rows of X, {len(y)} observations")
        self.d = d
        self._pi, self._pj = self._pairs(d)
        self._fitted = True
        self.offset = float(np.mean(y)) if n else 0.0
        spread = float(np.std(y)) if n > 1 else 0.0
        self.scale = spread if spread > 1e-12 else 1.0
        return self.design(X), (y - self.offset) / self.scale

    def _prior_z(self, p: int) -> np.ndarray:
        """The prior means of all ``p`` coefficients in standardised units (after
        :meth:`_standardise`): ``prior_mean`` on the main effects, 0 elsewhere."""
        mu0 = np.zeros(p)
        if self.prior_mean_main is not None:
            d = self.d
            if len(self.prior_mean_main) != d:
                raise ValueError(f"prior_mean has {len(self.prior_mean_main)} entries for {d}")
            mu0[1 : 1 + d] = self.prior_mean_main / self.scale
        return mu0

    def _fit(
        self, X: np.ndarray, y: np.ndarray, noise_sd: np.ndarray | Sequence[float] | None
    ) -> BayesianLinearModel:
        phi, z = self._standardise(X, y)
        (n, p), d = phi.shape, self.d
        s2 = np.zeros(n)
        if noise_sd is not None:
            s = np.asarray(noise_sd, dtype=float).ravel() / self.scale
            s2 = np.where(np.isfinite(s), s * s, 0.0)
        mu0 = self._prior_z(p)
        n_pairs = p - 1 - d
        # The pairs together start with as much prior variance as interaction_prior_sd**2 x d
        # (not per pair: hundreds of pairs would drown the main effects in every draw).
        pair_sd = self.interaction_prior_sd * (math.sqrt(d / n_pairs) if n_pairs > d else 1.0)
        alpha = np.concatenate(
            [[1e-6], np.full(d, self.prior_sd**-2), np.full(n_pairs, pair_sd**-2)]
        )
        # The floor of a pair's prior sd shrinks with the number of pairs, so that the pairs
        # together may hold no more prior variance than the main effects (else hundreds of
        # small pairs would blur every main effect).
        floor = np.full(p, self.min_prior_sd)
        floor[1 + d :] *= math.sqrt(d / n_pairs) if n_pairs > d else 1.0
        alpha_max = floor**-2
        alpha0 = alpha.copy()
        sigma2 = max(0.1, self.min_noise_sd**2)
        r0 = z - phi @ mu0
        for _ in range(self.iterations if n else 0):
            m, diag_s, _ = self._posterior(phi, r0, alpha, sigma2 + s2, full=False)
            gamma = np.clip(1.0 - alpha * diag_s, 1e-9, 1.0)
            new = alpha
            if self.sparse:
                # MacKay's update, with b = floor^2 / 2: alpha <= 1 / floor^2.
                # a Gamma(1 + c, c / alpha0) hyperprior anchors each alpha at its start value
                # alpha0 where the data say nothing (plain ARD would let an unidentified
                # coefficient's prior variance grow without bound when there are more
                # coefficients than runs, and its posterior draws swamp the rest)
                c = self.anchor
                dev = m - mu0
                new = (gamma + 2 * c) / (dev * dev + floor**2 + 2 * c / alpha0)
                if not self.sparse_mains:
                    # Main effects share one prior scale (most switches matter; a per-switch
                    # scale from a handful of runs would let pairs explain what mains do).
                    dev = m[1 : 1 + d] - mu0[1 : 1 + d]
                    new[1 : 1 + d] = np.sum(gamma[1 : 1 + d]) / (
                        np.sum(dev * dev) + d * floor[1] ** 2
                    )
                if self.pair_prior == "group" and n_pairs:
                    dev = m[1 + d :] - mu0[1 + d :]
                    new[1 + d :] = np.sum(gamma[1 + d :]) / (
                        np.sum(dev * dev) + n_pairs * floor[-1] ** 2
                    )
                if self.pair_cap and n_pairs and d:
                    # effect hierarchy: a pair's prior variance at most pair_cap**2 x the mains'
                    # mean prior variance (else, with fewer runs than pairs, a few pairs picked
                    # from hundreds explain by chance what the main effects do)
                    main_alpha = 1.0 / float(np.mean(1.0 / new[1 : 1 + d]))
                    new[1 + d :] = np.maximum(new[1 + d :], main_alpha / self.pair_cap**2)
                new[0] = 1e-6
                new = np.clip(new, 1e-6, alpha_max)
            resid = r0 - phi @ m
            dof = max(1.0, n - float(np.sum(gamma[1:])) - 1.0)
            new_sigma2 = max(self.min_noise_sd**2, float(np.sum(resid**2) - np.sum(s2)) / dof)
            done = (
                np.max(np.abs(np.log(new / alpha))) < 1e-3
                and abs(math.log(new_sigma2 / sigma2)) < 1e-3
            )
            alpha, sigma2 = new, new_sigma2
            if done:
                break
        m, _, cov = self._posterior(phi, r0, alpha, sigma2 + s2, full=True)
        self.alpha = alpha
        self.noise_var = sigma2  # standardised units
        self._phi, self._r0, self._v = phi, r0, sigma2 + s2
        assert cov is not None  # full=True
        self._mean_z = m + mu0
        self._cov_z: np.ndarray = cov
        self._mu0 = mu0
        self.posterior_mean = self._mean_z * self.scale
        self.posterior_mean[0] += self.offset
        self.posterior_cov = cov * self.scale**2
        return self

    @staticmethod
    def _posterior(
        phi: np.ndarray, r: np.ndarray, alpha: np.ndarray, v: np.ndarray, full: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Posterior mean, its diagonal covariance and (``full``) covariance of N(0, 1/alpha)
        weights given r = phi w + N(0, diag v)."""
        n, p = phi.shape
        if n == 0:
            return np.zeros(p), 1.0 / alpha, np.diag(1.0 / alpha) if full else None
        a_inv = 1.0 / alpha
        if n < p:  # Woodbury: an n x n system
            pa = phi * a_inv  # phi A^-1
            k = pa @ phi.T + np.diag(v)
            chol = np.linalg.cholesky(k + 1e-10 * np.eye(n))
            kinv_pa = _chol_solve(chol, pa)
            m = pa.T @ _chol_solve(chol, r)
            diag_s = a_inv - np.sum(pa * kinv_pa, axis=0)
            cov = np.diag(a_inv) - pa.T @ kinv_pa if full else None
        else:
            w = 1.0 / v
            prec = (phi.T * w) @ phi + np.diag(alpha)
            chol = np.linalg.cholesky(prec)
            m = _chol_solve(chol, phi.T @ (w * r))
            cov_full = _chol_solve(chol, np.eye(p))
            diag_s = np.diag(cov_full).copy()
            cov = cov_full if full else None
        return m, diag_s, cov

    # ---- using the posterior -----------------------------------------------------------------
    def sample_coefficients(self, rng: np.random.Generator) -> np.ndarray:
        """One draw of the coefficients from the posterior (for Thompson sampling), in y's units.

        Uses Bhattacharya et al.'s exact sampler (O(n^2 p)) when there are fewer observations
        than coefficients, a Cholesky of the covariance otherwise.
        """
        self._check()
        with one_blas_thread():
            return self._sample(rng)

    def _sample(self, rng: np.random.Generator) -> np.ndarray:
        phi, r, v = self._phi, self._r0, self._v
        n, p = phi.shape
        if 0 < n < p:
            z = _gaussian_draw(phi, r, 1.0 / self.alpha, v, rng)[0] + self._mu0
        else:
            chol = np.linalg.cholesky(self._cov_z + 1e-12 * np.eye(p))
            z = self._mean_z + chol @ rng.standard_normal(p)
        out = z * self.scale
        out[0] += self.offset
        return out

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and sd of the objective's mean at each row of ``X`` (no noise added)."""
        self._check()
        phi = self.design(X)
        mean = phi @ self.posterior_mean
        var = np.sum((phi @ self.posterior_cov) * phi, axis=1)  # diag(phi cov phi^T), BLAS
        return mean, np.sqrt(np.maximum(var, 0.0))

    @property
    def noise_sd(self) -> float:
        """The fitted misfit sd (beyond each observation's own noise), in y's units."""
        self._check()
        return math.sqrt(self.noise_var) * self.scale

    def misfit_var(self, own_var: np.ndarray) -> float:
        """The variance of what the model does not express, beyond the observations' own
        measurement variance ``own_var`` (y's units squared): here the fitted misfit itself."""
        self._check()
        return self.noise_sd**2

    def quadratic(self, beta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """``(c, b, Q)`` with ``f(x) = c + b @ x + x @ Q @ x`` for coefficients ``beta`` (Q upper
        triangular, zero diagonal): the form an acquisition optimiser evaluates quickly."""
        self._check()
        d = self.d
        q = np.zeros((d, d))
        q[self._pi, self._pj] = beta[1 + d :]
        return float(beta[0]), np.asarray(beta[1 : 1 + d]), q

    def effects(self, names: Sequence[str], level: float = 0.95) -> list[Effect]:
        """Main effects and pairwise interactions, ``2 * b`` with credible intervals.

        Args:
            names: one label per feature (:attr:`Coding.labels` / :func:`feature_names`).
            level: the interval's probability.

        Returns:
            One :class:`Effect` per coefficient except the intercept, largest ``|mean|`` first.
        """
        self._check()
        zq = NormalDist().inv_cdf(0.5 + level / 2)
        sd = np.sqrt(np.maximum(np.diag(self.posterior_cov)[1:], 0.0))
        mean = self.posterior_mean[1:]
        out = [
            Effect(t, float(2 * m), float(2 * (m - zq * s)), float(2 * (m + zq * s)))
            for t, m, s in zip(self.terms(names), mean, sd, strict=True)
        ]
        return sorted(out, key=lambda e: (-abs(e.mean), e.terms))

    def _check(self) -> None:
        if not self._fitted:
            raise RuntimeError("the model is not fitted: call fit(X, y) first")


class HorseshoeModel(BayesianLinearModel):
    """The same model with BOCS's prior: a horseshoe on the pairs, fitted by Gibbs sampling.

    Each pair coefficient ``b_ij ~ N(0, tau^2 lambda_ij^2)`` with half-Cauchy ``lambda_ij`` and
    ``tau`` (Carvalho, Polson & Scott 2010), sampled with Makalic & Schmidt's (2016) inverse-gamma
    auxiliary variables. A few large pairs keep their size while the hundreds of others are pulled
    to zero, which a Gaussian prior per pair cannot do: fitted by evidence (ARD), a pair picked by
    chance from hundreds borrows what a main effect does. The main effects share one Gaussian
    scale ``N(0, tau_m^2)`` (``tau_m`` half-Cauchy), or with ``main_horseshoe`` a horseshoe each.

    The noise is ``sigma^2 c_i``: ``c_i`` each observation's own variance ``noise_sd_i^2``
    relative to their mean (1 when none is known), ``sigma^2`` sampled (Jeffreys prior), at least
    ``min_noise_sd``. Intercept: a flat prior (a wide Gaussian). Sampling uses Bhattacharya et
    al.'s O(n^2 p) draw when there are fewer observations than coefficients, a Cholesky of the
    p x p precision otherwise.

    The chain is seeded by ``seed`` alone, so a fit is a function of its data (the sampler stays
    stateless). ``posterior_mean`` is the Rao-Blackwellised mean (the average of the conditional
    means), ``posterior_cov`` the draws' covariance, and :meth:`sample_coefficients` returns one
    of the kept draws: Thompson sampling as BOCS does it.

    On the saved 40-trial histories of 80 planted runs (``benchmarks/bench_samplers.py``'s
    issue12, pair12, three16, noisy16, 20 seeds each, collected by the ARD sampler), picking the
    measured point of least posterior mean came within 1% of the optimum in 38 of 80 (32 to 40
    over chain seeds) against 32 with ARD; least squares told the true terms got 53. Driving the
    sampler too, the horseshoe's pick was within 1% in 41 of those 80 runs.

    Args:
        interactions, block: as :class:`BayesianLinearModel`.
        iterations: Gibbs sweeps; the first ``burn`` are discarded.
        burn: discarded sweeps.
        keep: at most this many draws are kept for :meth:`sample_coefficients`.
        main_horseshoe: a horseshoe on each main effect instead of one shared Gaussian scale.
        min_noise_sd: the floor of sigma, in units of y's sd.
        seed: the chain's seed.
        **kw: ignored options of :class:`BayesianLinearModel` (so both take the same options).
    """

    def __init__(
        self,
        interactions: bool = True,
        block: Sequence[int] | np.ndarray | None = None,
        iterations: int = 800,
        burn: int = 300,
        keep: int = 100,
        main_horseshoe: bool = False,
        min_noise_sd: float = 0.02,
        seed: int = 0,
        prior_mean: Sequence[float] | np.ndarray | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(
            interactions=interactions,
            block=block,
            min_noise_sd=min_noise_sd,
            prior_mean=prior_mean,
        )
        self.iterations = iterations
        self.burn = min(burn, max(0, iterations - 1))
        self.keep = keep
        self.main_horseshoe = main_horseshoe
        self.seed = seed

    def _fit(
        self, X: np.ndarray, y: np.ndarray, noise_sd: np.ndarray | Sequence[float] | None
    ) -> BayesianLinearModel:
        phi, z = self._standardise(X, y)
        (n, p), d = phi.shape, self.d
        rel = np.ones(n)
        if noise_sd is not None and n:
            s = np.asarray(noise_sd, dtype=float).ravel()
            known = np.isfinite(s) & (s > 0)
            if known.any():
                s2 = np.where(known, s * s, np.mean(s[known] ** 2))
                rel = s2 / np.mean(s2)
        # The prior is centred at prior_mean (the main effects a caller knows, e.g. a culprit's):
        # the chain samples the departure from it, on the residual of the prior's prediction.
        mu0 = self._prior_z(p)
        z = z - phi @ mu0
        rng = np.random.default_rng(self.seed)
        pairs = np.arange(p) > d
        mains = ~pairs
        mains[0] = False
        lam2, nu = np.ones(p), np.ones(p)
        tau2, xi, tau2m, xim, sig2 = 1.0, 1.0, 1.0, 1.0, 0.25
        floor2 = self.min_noise_sd**2
        means, draws, sig2s = [], [], []
        stride = max(1, (self.iterations - self.burn) // max(1, self.keep))
        # Loop invariants hoisted: the chain runs hundreds of sweeps per fit, at sizes where
        # numpy's per-call overhead is most of a sweep's time.
        n_pairs, n_mains = int(pairs.sum()), int(mains.sum())
        shape_pairs, shape_mains = (n_pairs + 1) / 2, (n_mains + 1) / 2
        mains_local = 1 if not self.main_horseshoe else None
        for it in range(self.iterations if n else 0):
            prior_var = np.where(pairs, tau2 * lam2, tau2m * (lam2 if mains_local is None else 1))
            prior_var[0] = 100.0  # the intercept of standardised y: flat in effect
            beta, mean = _gaussian_draw(phi, z, prior_var, sig2 * rel, rng)
            resid = z - phi @ beta
            sig2 = max(floor2, 1.0 / rng.gamma(n / 2, 2.0 / float(np.sum(resid**2 / rel))))
            b2 = beta * beta
            lam2 = 1.0 / rng.gamma(1.0, 1.0 / (1.0 / nu + b2 / (2 * np.where(pairs, tau2, tau2m))))
            nu = 1.0 / rng.gamma(1.0, 1.0 / (1.0 + 1.0 / lam2))
            if n_pairs:
                rate = 1.0 / xi + float(np.sum(b2[pairs] / lam2[pairs])) / 2
                tau2 = 1.0 / rng.gamma(shape_pairs, 1.0 / rate)
                xi = 1.0 / rng.gamma(1.0, 1.0 / (1.0 + 1.0 / tau2))
            if n_mains:
                local = lam2[mains] if mains_local is None else 1.0
                rate = 1.0 / xim + float(np.sum(b2[mains] / local)) / 2
                tau2m = 1.0 / rng.gamma(shape_mains, 1.0 / rate)
                xim = 1.0 / rng.gamma(1.0, 1.0 / (1.0 + 1.0 / tau2m))
            if it >= self.burn:
                means.append(mean)
                sig2s.append(sig2)
                if (it - self.burn) % stride == 0:
                    draws.append(beta)
        if not means:  # no data: the prior
            means, draws = [np.zeros(p)], [np.zeros(p)]
        self._draws_z = np.array(draws) + mu0
        self._mean_z = np.mean(means, axis=0) + mu0
        self._cov_z = np.cov(self._draws_z.T).reshape(p, p) if len(draws) > 1 else np.eye(p)
        self.noise_var = sig2
        # sigma^2's posterior mean (standardised units), for misfit_var: one draw is too noisy
        self._sig2_mean = float(np.mean(sig2s)) if sig2s else sig2
        self.posterior_mean = self._mean_z * self.scale
        self.posterior_mean[0] += self.offset
        self.posterior_cov = self._cov_z * self.scale**2
        return self

    def misfit_var(self, own_var: np.ndarray) -> float:
        """The variance of what the model does not express, beyond the observations' own
        variance ``own_var`` (y's units squared). The horseshoe's noise is one scale for
        everything the terms leave (``sigma^2`` times each run's relative variance): the misfit
        is its posterior mean less the runs' mean own variance."""
        self._check()
        own = np.asarray(own_var, dtype=float)
        own = own[np.isfinite(own)]
        return max(0.0, self._sig2_mean * self.scale**2 - (float(np.mean(own)) if len(own) else 0.0))

    def _sample(self, rng: np.random.Generator) -> np.ndarray:
        out = self._draws_z[int(rng.integers(len(self._draws_z)))] * self.scale
        out[0] += self.offset
        return out

    def effects(self, names: Sequence[str], level: float = 0.95) -> list[Effect]:
        """As :meth:`BayesianLinearModel.effects`, the interval from the kept draws' quantiles.

        The horseshoe's posterior of a coefficient is not normal (a spike at zero and heavy
        tails), so mean +- z sd would be too wide for the pairs it shrinks and too narrow for the
        few it keeps. Ask for ``keep`` in the thousands when the tails matter.
        """
        self._check()
        draws = 2 * self._draws_z[:, 1:] * self.scale
        low, high = np.quantile(draws, [0.5 - level / 2, 0.5 + level / 2], axis=0)
        mean = 2 * self.posterior_mean[1:]
        out = [
            Effect(t, float(m), float(min(lo, m)), float(max(hi, m)))
            for t, m, lo, hi in zip(self.terms(names), mean, low, high, strict=True)
        ]
        return sorted(out, key=lambda e: (-abs(e.mean), e.terms))


def _gaussian_draw(
    phi: np.ndarray, z: np.ndarray, prior_var: np.ndarray, v: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """One draw and the mean of ``w | z`` for ``z = phi w + N(0, diag v)``, ``w ~ N(0, diag
    prior_var)``: Bhattacharya et al.'s n x n solve when n < p, a p x p Cholesky otherwise.
    Both models' Thompson draws with fewer observations than coefficients come from here."""
    n, p = phi.shape
    if n < p:
        pa = phi * prior_var
        chol = _cholesky(pa @ phi.T + np.diag(v) + 1e-10 * np.eye(n))
        u = rng.standard_normal(p) * np.sqrt(prior_var)
        delta = rng.standard_normal(n) * np.sqrt(v)
        solved = _chol_solve(chol, np.stack([z, z - phi @ u - delta], axis=1))
        return u + pa.T @ solved[:, 1], pa.T @ solved[:, 0]
    w = 1.0 / v
    chol = _cholesky((phi.T * w) @ phi + np.diag(1.0 / prior_var))
    mean = _chol_solve(chol, phi.T @ (w * z))
    draw = mean + _upper_solve(chol.T, rng.standard_normal(p))
    return draw, mean


_CONTROLLER: Any = None


def one_blas_thread() -> Any:
    """A context that runs BLAS on one thread: these matrices are small, and a multithreaded
    OpenBLAS on a loaded machine spends 100 times longer synchronising than computing."""
    global _CONTROLLER
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=1, user_api="blas")


def _chol_solve(chol: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Solve (L L^T) x = b with L lower triangular."""
    return _upper_solve(chol.T, _lower_solve(chol, b))


def _lower_solve(chol: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``solve_triangular(chol, b, lower=True)`` for a C-ordered ``chol``: the same LAPACK call
    (trtrs on the transpose), without scipy's argument checks, which cost more than the solve
    at these sizes (the Gibbs chains make two per draw)."""
    x, info = _trtrs(chol.T, b, lower=0, trans=1)
    if info:
        raise np.linalg.LinAlgError(f"singular triangular factor (trtrs info {info})")
    return x


def _upper_solve(upper_f: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``solve_triangular(upper_f, b, lower=False)`` for a Fortran-ordered ``upper_f`` (the
    transpose of a C-ordered lower factor): the same LAPACK call, unchecked."""
    x, info = _trtrs(upper_f, b, lower=0, trans=0)
    if info:
        raise np.linalg.LinAlgError(f"singular triangular factor (trtrs info {info})")
    return x


def _cholesky(a: np.ndarray) -> np.ndarray:
    """``np.linalg.cholesky(a)`` (C-ordered, lower) by LAPACK's potrf, unchecked."""
    low, info = _potrf(a, lower=1, clean=1)  # numpy's own call: a symmetric a in Fortran order
    if info:
        raise np.linalg.LinAlgError("Matrix is not positive definite")
    return np.ascontiguousarray(low)


_trtrs, _potrf = get_lapack_funcs(("trtrs", "potrf"), (np.zeros((1, 1)),))

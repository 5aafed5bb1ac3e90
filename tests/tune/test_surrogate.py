"""The surrogate of fusion-switch spaces: coding, planted effects recovered, calibrated intervals."""

from __future__ import annotations

import time

import numpy as np
import pytest

from fusiontune.tune.surrogate import (
    BayesianLinearModel,
    Coding,
    Effect,
    HorseshoeModel,
    encode,
    feature_names,
)

DIMS = {"pass.A": ("off", "on"), "pass.B": ("off", "on"), "split.A.rows": (0, 2, 4)}


def _planted(seed: int, n: int = 60, d: int = 12, noise: float = 0.01):
    """Additive main effects on 4 switches and one interaction, on log runtime."""
    rng = np.random.default_rng(seed)
    X = rng.choice([-1.0, 1.0], size=(n, d))
    beta = np.zeros(d)
    beta[:4] = [0.12, -0.08, 0.05, -0.03]
    pair = 0.04  # x0 * x2
    y = -6.0 + X @ beta + pair * X[:, 0] * X[:, 2] + rng.normal(0.0, noise, n)
    return X, y, beta, pair


def test_encode_codes_switches_plus_minus_one_and_split_values_one_hot() -> None:
    names = list(DIMS)
    assert feature_names(names, DIMS) == ["pass.A", "pass.B", "split.A.rows=2", "split.A.rows=4"]
    x = encode({"pass.A": "on", "pass.B": "off", "split.A.rows": 4}, names, DIMS)
    assert x.tolist() == [1.0, -1.0, -1.0, 1.0]
    x0 = encode({"pass.A": "off", "pass.B": "on", "split.A.rows": 0}, names, DIMS)
    assert x0.tolist() == [-1.0, 1.0, -1.0, -1.0]


def test_coding_decode_inverts_encode() -> None:
    coding = Coding(list(DIMS), DIMS)
    for params in (
        {"pass.A": "on", "pass.B": "off", "split.A.rows": 2},
        {"pass.A": "off", "pass.B": "on", "split.A.rows": 0},
    ):
        assert coding.decode(coding.encode(params)) == params


def test_model_leaves_out_pairs_within_one_dimension() -> None:
    coding = Coding(list(DIMS), DIMS)
    X = np.array(
        [
            coding.encode({"pass.A": a, "pass.B": b, "split.A.rows": s})
            for a in ("off", "on")
            for b in ("off", "on")
            for s in (0, 2, 4)
        ]
    )
    model = BayesianLinearModel(block=coding.block).fit(X, np.zeros(len(X)))
    pairs = [t for t in model.terms(coding.labels) if len(t) == 2]
    assert ("split.A.rows=2", "split.A.rows=4") not in pairs
    assert len(pairs) == 5


def test_model_recovers_planted_main_effects_and_interaction() -> None:
    X, y, beta, pair = _planted(0)
    names = [f"pass.P{i}" for i in range(X.shape[1])]
    effects = BayesianLinearModel().fit(X, y).effects(names)
    assert all(isinstance(e, Effect) for e in effects)
    top = {e.terms: e for e in effects[:5]}
    assert set(top) == {
        ("pass.P0",),
        ("pass.P1",),
        ("pass.P2",),
        ("pass.P3",),
        ("pass.P0", "pass.P2"),
    }
    for i in range(4):
        assert top[(f"pass.P{i}",)].mean == pytest.approx(2 * beta[i], abs=0.015)
    assert top[("pass.P0", "pass.P2")].mean == pytest.approx(2 * pair, abs=0.015)
    assert [abs(e.mean) for e in effects] == sorted((abs(e.mean) for e in effects), reverse=True)


def test_effect_intervals_cover_the_truth_in_most_seeds() -> None:
    covered = total = 0
    for seed in range(20):
        X, y, beta, pair = _planted(seed, n=40)
        names = [f"pass.P{i}" for i in range(X.shape[1])]
        truth = {(n,): 2 * b for n, b in zip(names, beta, strict=True)}
        truth[("pass.P0", "pass.P2")] = 2 * pair
        for e in BayesianLinearModel().fit(X, y).effects(names):
            if e.terms in truth:  # the planted terms; the zero ones are shrunk towards the truth
                total += 1
                covered += e.low <= truth[e.terms] <= e.high
    assert covered / total >= 0.85


def test_horseshoe_intervals_are_draw_quantiles_that_cover_the_truth() -> None:
    # The report's fit (fusiontune/report/_effects.py): its intervals are quantiles of the
    # draws, so a shrunk null pair's interval holds 0 and a kept term's interval its value.
    covered = total = nulls = null_zero = 0
    for seed in range(10):
        X, y, beta, pair = _planted(seed, n=40)
        names = [f"pass.P{i}" for i in range(X.shape[1])]
        truth = {(n,): 2 * b for n, b in zip(names, beta, strict=True)}
        truth[("pass.P0", "pass.P2")] = 2 * pair
        model = HorseshoeModel(iterations=1500, burn=300, keep=1200).fit(X, y)
        for e in model.effects(names):
            assert e.low <= e.mean <= e.high
            if e.terms in truth:
                total += 1
                covered += e.low <= truth[e.terms] <= e.high
            elif len(e.terms) == 2:
                nulls += 1
                null_zero += e.low <= 0.0 <= e.high
    assert covered / total >= 0.85, (covered, total)
    assert null_zero / nulls >= 0.95, (null_zero, nulls)


def test_horseshoe_is_centred_at_its_prior_mean() -> None:
    # Switch 5 is never on in the data (a culprit a bisection named, kept off): what the model
    # says of switching it on is the prior's, centred at prior_mean, not 0.
    X, y, _, _ = _planted(1, n=40, d=6)
    X[:, 5] = -1.0
    prior = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.3])
    plain = HorseshoeModel(interactions=False).fit(X, y)
    centred = HorseshoeModel(interactions=False, prior_mean=prior).fit(X, y)
    on = X[:1].copy()
    on[0, 5] = 1.0
    rise = {m: float(np.diff(m.predict(np.vstack([X[:1], on]))[0])[0]) for m in (plain, centred)}
    assert abs(rise[plain]) < 0.1 and rise[centred] == pytest.approx(0.6, abs=0.1)
    assert np.allclose(centred.predict(X)[0], plain.predict(X)[0], atol=0.01)  # the data alike
    with pytest.raises(ValueError, match="prior_mean has 2 entries for 6"):
        HorseshoeModel(prior_mean=[0.0, 0.1]).fit(X, y)


def test_predict_is_close_on_observed_points_and_uncertain_far_from_them() -> None:
    X, y, _, _ = _planted(1, n=30)
    model = BayesianLinearModel().fit(X, y)
    mean, sd = model.predict(X)
    assert np.max(np.abs(mean - y)) < 0.05
    assert np.all(sd > 0)
    assert model.noise_sd > 0


def test_sample_coefficients_scatter_around_the_posterior_mean() -> None:
    X, y, _, _ = _planted(2, n=20)  # fewer observations than coefficients: the fast sampler
    model = BayesianLinearModel().fit(X, y)
    rng = np.random.default_rng(0)
    draws = np.array([model.sample_coefficients(rng) for _ in range(2000)])
    sd = np.sqrt(np.diag(model.posterior_cov))
    assert np.all(np.abs(draws.mean(axis=0) - model.posterior_mean) < 5 * sd / np.sqrt(2000) + 1e-9)
    assert np.allclose(draws.std(axis=0), sd, rtol=0.15)


def test_quadratic_form_equals_the_model() -> None:
    X, y, _, _ = _planted(3, n=25)
    model = BayesianLinearModel().fit(X, y)
    beta = model.sample_coefficients(np.random.default_rng(1))
    c, b, q = model.quadratic(beta)
    x = X[0]
    assert c + b @ x + x @ q @ x == pytest.approx(float(model.design(X[:1])[0] @ beta))


def test_prior_mean_holds_where_data_says_nothing() -> None:
    X = np.array([[-1.0, -1.0], [-1.0, 1.0]])  # the first switch never on
    y = np.array([0.0, 0.1])
    model = BayesianLinearModel(interactions=False, sparse=False, prior_mean=[3.0, 0.0])
    model.fit(X, y)
    mean, _ = model.predict(np.array([[1.0, -1.0]]))
    assert mean[0] > 2.0


def test_fit_and_one_thompson_draw_are_fast_for_24_switches_and_80_observations() -> None:
    rng = np.random.default_rng(0)
    X = rng.choice([-1.0, 1.0], size=(80, 24))
    y = X[:, :3].sum(axis=1) * 0.1 + rng.normal(0, 0.01, 80)
    BayesianLinearModel().fit(X, y)  # warm-up: imports, thread pools
    times = []
    for _ in range(3):
        start = time.perf_counter()
        model = BayesianLinearModel().fit(X, y)
        model.quadratic(model.sample_coefficients(rng))
        times.append(time.perf_counter() - start)
    assert min(times) < 0.1


def _sparse_pairs(seed: int, n: int, d: int = 12, noise: float = 0.02):
    """Main effects on every switch and two large pairs among the 66, on log runtime."""
    rng = np.random.default_rng(seed)
    X = rng.choice([-1.0, 1.0], size=(n, d))
    beta = rng.uniform(0.005, 0.03, d) * rng.choice([-1.0, 1.0], d)
    y = -6.0 + X @ beta + 0.03 * X[:, 1] * X[:, 7] - 0.025 * X[:, 4] * X[:, 9]
    return X, y + rng.normal(0.0, noise, n), beta


@pytest.mark.parametrize("n", [40, 120])  # fewer observations than coefficients (79), and more
def test_horseshoe_keeps_the_planted_pairs_and_shrinks_the_rest(n: int) -> None:
    X, y, beta = _sparse_pairs(3, n)
    names = [f"pass.P{i}" for i in range(X.shape[1])]
    model = HorseshoeModel().fit(X, y)
    effects = {e.terms: e for e in model.effects(names)}
    assert effects[("pass.P1", "pass.P7")].mean == pytest.approx(0.06, abs=0.02)
    assert effects[("pass.P4", "pass.P9")].mean == pytest.approx(-0.05, abs=0.02)
    others = [abs(e.mean) for t, e in effects.items() if len(t) == 2 and t not in
              {("pass.P1", "pass.P7"), ("pass.P4", "pass.P9")}]  # fmt: skip
    assert max(others) < 0.02
    mains = np.array([effects[(nm,)].mean for nm in names]) / 2
    assert np.max(np.abs(mains - beta)) < 0.012


def test_horseshoe_predicts_the_whole_space_better_than_ard_when_few_pairs_matter() -> None:
    # 40 noisy runs of a 12-switch space with 2 real pairs of 66: the error of the posterior mean
    # over all 4096 points. Evidence-fitted Gaussian scales (ARD) let pairs picked by chance
    # absorb main effects; the horseshoe does not.
    grid = np.array([[1.0 if c >> i & 1 else -1.0 for i in range(12)] for c in range(4096)])
    error = {"horseshoe": 0.0, "ard": 0.0}
    for seed in range(8):
        X, y, beta = _sparse_pairs(seed, 40)
        truth = grid @ beta + 0.03 * grid[:, 1] * grid[:, 7] - 0.025 * grid[:, 4] * grid[:, 9]
        for name, model in (("horseshoe", HorseshoeModel()), ("ard", BayesianLinearModel())):
            mean, _ = model.fit(X, y).predict(grid)
            error[name] += float(np.mean((mean + 6.0 - truth) ** 2))
    assert error["horseshoe"] < 0.8 * error["ard"]


def test_horseshoe_is_a_function_of_its_data_and_draws_are_kept_draws() -> None:
    X, y, _ = _sparse_pairs(5, 30)
    a, b = HorseshoeModel().fit(X, y), HorseshoeModel().fit(X, y)
    assert np.array_equal(a.posterior_mean, b.posterior_mean)
    rng = np.random.default_rng(0)
    draws = np.array([a.sample_coefficients(rng) for _ in range(400)])
    assert np.allclose(draws.mean(axis=0), a.posterior_mean, atol=4 * np.sqrt(
        np.diag(a.posterior_cov).max() / 50))  # fmt: skip
    c, bl, q = a.quadratic(draws[0])
    assert c + bl @ X[0] + X[0] @ q @ X[0] == pytest.approx(float(a.design(X[:1])[0] @ draws[0]))
    assert HorseshoeModel(seed=1).fit(X, y).posterior_mean.tolist() != a.posterior_mean.tolist()

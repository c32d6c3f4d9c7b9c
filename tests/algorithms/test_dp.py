"""Tests for fedproto.algorithms.dp: FastLloyd/GLloyd/SuLloyd privacy calibration.

Numbers come from spec fastlloyd.md section 7.3 (oracles 12-18, 20) and 7.5 (oracle 27) and are
checked to the precision the spec prints them with. The spec's oracles use the exact
``1 / (N ln N)`` deltas; its printed deltas (1.3305e-3, 1.08574e-5) are those values rounded.
Independent references: Balle & Wang's Alg. 1 written out here, and Google's dp-accounting
library (exact Gaussian calibration and PLD accounting).
"""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal

import dp_accounting
import pytest
import scipy.optimize
import scipy.special
from dp_accounting import pld

from fedproto.algorithms import dp

# (N, d, k) of the paper's datasets (spec section 4.1 and the code's k per dataset).
IRIS = (150, 4, 3)
LSUN = (400, 2, 3)
S1 = (5000, 2, 15)
HOUSE = (1837, 3, 3)
ADULT = (48842, 6, 3)
BIRCH2 = (25000, 2, 100)
MNIST = (10000, 784, 10)

EPSILON_GRID = (0.1, 0.25, 0.5, 0.75, 1.0)


def assert_printed(value: float, printed: str) -> None:
    """``value`` rounds to ``printed`` at the precision ``printed`` is written with."""
    target = Decimal(printed)
    half_unit = Decimal(1).scaleb(target.as_tuple().exponent) / 2
    assert abs(Decimal(repr(float(value))) - target) <= half_unit, (value, printed)


def balle_wang_sigma(epsilon: float, delta: float) -> float:
    """Balle & Wang 2018, Alg. 1 (analytic Gaussian mechanism), as spec section 2.3 states it."""
    phi = scipy.special.ndtr
    delta0 = phi(0.0) - math.exp(epsilon) * phi(-math.sqrt(2.0 * epsilon))

    def b_plus(v: float) -> float:
        return phi(math.sqrt(epsilon * v)) - math.exp(epsilon) * phi(
            -math.sqrt(epsilon * (v + 2.0))
        )

    def b_minus(u: float) -> float:
        return phi(-math.sqrt(epsilon * u)) - math.exp(epsilon) * phi(
            -math.sqrt(epsilon * (u + 2.0))
        )

    if delta >= delta0:
        hi = 1.0
        while b_plus(hi) <= delta:
            hi *= 2.0
        v = scipy.optimize.brentq(lambda x: b_plus(x) - delta, 0.0, hi, xtol=1e-14, rtol=1e-15)
        a = math.sqrt(1.0 + v / 2.0) - math.sqrt(v / 2.0)
    else:
        hi = 1.0
        while b_minus(hi) > delta:
            hi *= 2.0
        u = scipy.optimize.brentq(lambda x: b_minus(x) - delta, 0.0, hi, xtol=1e-14, rtol=1e-15)
        a = math.sqrt(1.0 + u / 2.0) + math.sqrt(u / 2.0)
    return a / math.sqrt(2.0 * epsilon)


# ---------------------------------------------------------------------------------------------
# Oracle 12: sigma for sensitivity 1, and its properties


@pytest.mark.parametrize(
    ("epsilon", "delta", "printed"),
    [
        (1.0, 1e-5, "3.730632"),
        (0.1, 1e-5, "30.749566"),
        (0.5, 1e-5, "7.031827"),
        (1.0, dp.default_delta(150), "2.493321"),
        (0.1, dp.default_delta(150), "16.459449"),
        (1.0, dp.default_delta(10_000), "3.712117"),
    ],
)
def test_gaussian_sigma_oracle(epsilon, delta, printed):
    assert_printed(dp.gaussian_sigma(epsilon, delta), printed)


def test_oracle_deltas_are_the_printed_ones():
    assert_printed(dp.default_delta(150), "1.3305e-3")
    assert_printed(dp.default_delta(10_000), "1.08574e-5")


def test_classical_bound_is_larger():
    assert_printed(math.sqrt(2.0 * math.log(1.25 / 1e-5)) / 1.0, "4.845")
    for epsilon in (0.05, 0.1, 0.5, 0.99, 1.0):
        for delta in (1e-3, 1e-5, 1e-8):
            classical = math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon
            assert dp.gaussian_sigma(epsilon, delta) < classical


def test_gaussian_sigma_decreasing_in_epsilon_and_delta():
    epsilons = [0.01, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0]
    deltas = [1e-12, 1e-8, 1e-5, 1e-3, 0.1, 0.5]
    for delta in deltas:
        sigmas = [dp.gaussian_sigma(e, delta) for e in epsilons]
        assert all(a > b for a, b in zip(sigmas, sigmas[1:]))
    for epsilon in epsilons:
        sigmas = [dp.gaussian_sigma(epsilon, d) for d in deltas]
        assert all(a > b for a, b in zip(sigmas, sigmas[1:]))


@pytest.mark.parametrize("epsilon", [0.01, 0.1, 0.5, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("delta", [1e-12, 1e-6, 1e-5, 1.3305e-3, 0.2])
def test_gaussian_sigma_solves_the_gdp_equation(epsilon, delta):
    sigma = dp.gaussian_sigma(epsilon, delta)
    assert dp.gdp_delta(1.0 / sigma, epsilon) == pytest.approx(delta, rel=1e-9)


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("delta", [1e-8, 1e-5, 1.3305e-3, 0.05, 0.4])
def test_gaussian_sigma_matches_balle_wang_algorithm_1(epsilon, delta):
    # 0.4 is above Balle-Wang's delta0 for these epsilons, so both branches of Alg. 1 run.
    assert dp.gaussian_sigma(epsilon, delta) == pytest.approx(
        balle_wang_sigma(epsilon, delta), rel=1e-9
    )


@pytest.mark.parametrize("epsilon", [0.01, 0.1, 0.25, 1.0, 4.0])
@pytest.mark.parametrize("delta", [1e-10, 1e-5, 1.3305e-3, 0.3])
def test_gaussian_sigma_matches_dp_accounting(epsilon, delta):
    assert dp.gaussian_sigma(epsilon, delta) == pytest.approx(
        dp_accounting.get_sigma_gaussian(epsilon, delta), rel=1e-9
    )


def test_gdp_delta_matches_the_closed_form_and_stays_accurate_in_the_tail():
    phi = scipy.special.ndtr
    for mu in (0.05, 0.3, 1.0, 2.5):
        for epsilon in (0.0, 0.1, 1.0, 3.0):
            direct = phi(-epsilon / mu + mu / 2) - math.exp(epsilon) * phi(-epsilon / mu - mu / 2)
            assert dp.gdp_delta(mu, epsilon) == pytest.approx(direct, rel=1e-9, abs=1e-15)
    assert dp.gdp_delta(1.0, 0.0) == pytest.approx(2.0 * phi(0.5) - 1.0, rel=1e-12)


@pytest.mark.parametrize(("mu", "epsilon"), [(30.0, 800.0), (0.2, 7.0), (5.0, 60.0)])
def test_gdp_delta_in_the_tail_against_high_precision(mu, epsilon):
    # At (30, 800) the direct formula gives 0 * inf (e^800 overflows, Phi(-41.7) underflows).
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(60):
        m, e = mpmath.mpf(mu), mpmath.mpf(epsilon)
        exact = mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2)
        exact = float(exact)
    assert exact > 0.0
    assert dp.gdp_delta(mu, epsilon) == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize("mu", [0.01, 0.0607, 0.2828658, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("delta", [1e-12, 1e-5, 1.3305e-3, 0.1])
def test_spent_epsilon_inverts_gdp_delta(mu, delta):
    epsilon = dp.spent_epsilon(mu, delta)
    if epsilon == 0.0:
        assert dp.gdp_delta(mu, 0.0) <= delta
    else:
        assert dp.gdp_delta(mu, epsilon) == pytest.approx(delta, rel=1e-9)
        assert epsilon == pytest.approx(
            dp_accounting.get_epsilon_gaussian(1.0 / mu, delta), rel=1e-8
        )


def test_spent_epsilon_round_trips_gaussian_sigma():
    for epsilon in EPSILON_GRID:
        for delta in (1e-5, dp.default_delta(150)):
            sigma = dp.gaussian_sigma(epsilon, delta)
            assert dp.spent_epsilon(1.0 / sigma, delta) == pytest.approx(epsilon, rel=1e-9)


def test_spent_epsilon_is_zero_when_already_zero_epsilon_private():
    mu = 0.001
    assert dp.gdp_delta(mu, 0.0) < 0.01
    assert dp.spent_epsilon(mu, 0.01) == 0.0


# ---------------------------------------------------------------------------------------------
# Oracle 13: default delta


@pytest.mark.parametrize(
    ("n", "printed"), [(150, "1.3305e-3"), (10_000, "1.0857e-5"), (48_842, "1.8964e-6")]
)
def test_default_delta_oracle(n, printed):
    assert_printed(dp.default_delta(n), printed)
    assert dp.default_delta(n) == 1.0 / (n * math.log(n))


# ---------------------------------------------------------------------------------------------
# Oracle 14: budget splits


@pytest.mark.parametrize("d", [1, 2, 3, 4, 6, 13, 784])
@pytest.mark.parametrize("sigma", [0.5, 2.493321, 30.749566])
def test_fastlloyd_split(sigma, d):
    sigma_r, sigma_c = dp.fastlloyd_noise_split(sigma, d)
    assert 1 / sigma_r**2 + 1 / sigma_c**2 == pytest.approx(1 / sigma**2, rel=1e-12)
    assert sigma_c / sigma_r == pytest.approx((4 * d) ** 0.25, rel=1e-12)
    assert sigma_c == pytest.approx(sigma * math.sqrt(1 + math.sqrt(4 * d)), rel=1e-12)


@pytest.mark.parametrize("d", [1, 2, 4, 784])
@pytest.mark.parametrize("rho", [0.1, 0.225, 1.0])
def test_glloyd_split(d, rho):
    sigma = 3.5352
    sigma_s, sigma_c = dp.glloyd_noise_split(sigma, d, rho)
    assert 1 / sigma_s**2 + 1 / sigma_c**2 == pytest.approx(1 / sigma**2, rel=1e-12)
    assert sigma_c / sigma_s == pytest.approx(math.sqrt(math.sqrt(d) / (2 * rho)), rel=1e-12)


# ---------------------------------------------------------------------------------------------
# Oracles 15-16: radii and composition


@pytest.mark.parametrize(
    ("dataset", "printed"),
    [(IRIS, "1.2157"), (LSUN, "0.6532"), (S1, "0.2921"), (MNIST, "22.334"), (BIRCH2, "0.1131")],
)
def test_steady_radius_oracle(dataset, printed):
    _, d, k = dataset
    assert_printed(dp.steady_radius(k, d), printed)
    assert dp.radius_schedule("step", k, d, 3)[0] == pytest.approx(math.sqrt(d))


def test_radius_schedules():
    eta = dp.steady_radius(15, 2, 0.8, 2.0)
    assert eta == pytest.approx(0.8 * math.sqrt(2) * 2.0 / 15**0.5)
    assert dp.radius_schedule("step", 15, 2, 4, 0.8, 2.0) == pytest.approx(
        (math.sqrt(2) * 2.0, eta, eta, eta)
    )
    assert dp.radius_schedule("step", 15, 2, 1) == pytest.approx((math.sqrt(2),))
    assert dp.radius_schedule("constant", 15, 2, 3, 0.8, 2.0) == pytest.approx((eta,) * 3)
    assert dp.radius_schedule("none", 15, 2, 3, 0.8, 2.0) == pytest.approx(
        (2 * math.sqrt(2) * 2.0,) * 3
    )
    assert isinstance(dp.radius_schedule("step", 3, 4, 2), tuple)


def test_radius_schedule_never_exceeds_the_domain_diagonal():
    # k = 1 and alpha = 3 make eta = 3 sqrt(d) B, wider than the domain itself.
    assert dp.steady_radius(1, 4, alpha=3.0) == pytest.approx(6.0)
    for strategy in dp.STRATEGIES:
        radii = dp.radius_schedule(strategy, 1, 4, 5, alpha=3.0)
        assert max(radii) == pytest.approx(2 * math.sqrt(4))


def test_composition_oracle_s1():
    n, d, k = S1
    calibration = dp.calibrate_fastlloyd(1.0, n, k, d)
    assert calibration.iterations == 7
    assert_printed(calibration.radii[0], "1.41421")
    for radius in calibration.radii[1:]:
        assert_printed(radius, "0.29212")
    assert_printed(calibration.delta, "2.34819e-5")
    mu = dp.composed_mu(calibration.radii, calibration.std_sum, calibration.std_count)
    assert_printed(mu, "0.2828658")
    assert mu == pytest.approx(1.0 / calibration.sigma, rel=1e-12)
    assert mu == calibration.mu()
    assert_printed(dp.gdp_delta(mu, 1.0), "2.34819e-5")
    assert dp.gdp_delta(mu, 1.0) == pytest.approx(calibration.delta, rel=1e-9)
    # Spec section 2.12's worked example.
    assert_printed(calibration.sigma, "3.5352")
    assert_printed(mu, "0.28287")


def test_composed_mu_formula_and_per_iteration_counts():
    radii, std_sum = (2.0, 1.0), (4.0, 1.0)
    expected = math.sqrt((2 / 4) ** 2 + 1 + 2 * (1 / 5) ** 2)
    assert dp.composed_mu(radii, std_sum, 5.0) == pytest.approx(expected, rel=1e-14)
    assert dp.composed_mu(radii, std_sum, (5.0, 5.0)) == pytest.approx(expected, rel=1e-14)
    mixed = math.sqrt((2 / 4) ** 2 + 1 + (1 / 5) ** 2 + (1 / 2) ** 2)
    assert dp.composed_mu(radii, std_sum, [5.0, 2.0]) == pytest.approx(mixed, rel=1e-14)


@pytest.mark.parametrize("dataset", [IRIS, LSUN, S1, HOUSE, ADULT, BIRCH2, MNIST])
@pytest.mark.parametrize("epsilon", EPSILON_GRID)
def test_calibrations_compose_back_to_the_budget(dataset, epsilon):
    n, d, k = dataset
    for calibration in (
        dp.calibrate_fastlloyd(epsilon, n, k, d),
        dp.calibrate_fastlloyd(epsilon, n, k, d, strategy="constant"),
        dp.calibrate_glloyd(epsilon, n, k, d),
    ):
        assert calibration.mu() == pytest.approx(1.0 / calibration.sigma, rel=1e-12)
        assert dp.spent_epsilon(calibration.mu(), calibration.delta) == pytest.approx(
            epsilon, rel=1e-9
        )


@pytest.mark.parametrize(("epsilon", "dataset"), [(1.0, S1), (0.1, IRIS), (0.25, ADULT)])
def test_fastlloyd_composition_agrees_with_dp_accounting_pld(epsilon, dataset):
    # Every per-iteration release as its own Gaussian mechanism (sensitivity r_t for the sums,
    # 1 for the counts), composed numerically by the privacy-loss-distribution accountant.
    n, d, k = dataset
    calibration = dp.calibrate_fastlloyd(epsilon, n, k, d)
    events = []
    for radius, std in zip(calibration.radii, calibration.std_sum):
        events.append(dp_accounting.GaussianDpEvent(noise_multiplier=std / radius))
        events.append(dp_accounting.GaussianDpEvent(noise_multiplier=calibration.std_count))
    accountant = pld.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dp_accounting.ComposedDpEvent(events))
    assert accountant.get_epsilon(calibration.delta) == pytest.approx(epsilon, rel=1e-4)


def test_gaussian_sigma_agrees_with_pld_of_a_single_gaussian():
    epsilon, delta = 0.5, dp.default_delta(5000)
    distribution = pld.privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=dp.gaussian_sigma(epsilon, delta),
        sensitivity=1.0,
        value_discretization_interval=1e-4,
    )
    assert distribution.get_epsilon_for_delta(delta) == pytest.approx(epsilon, abs=1e-3)
    assert distribution.get_delta_for_epsilon(epsilon) == pytest.approx(delta, rel=1e-3)


def test_sulloyd_laplace_composition_agrees_with_dp_accounting_pld():
    # For composed Laplace mechanisms the privacy loss reaches its maximum (the basic-composition
    # total) with constant probability, so the PLD epsilon at a tiny delta is the total epsilon.
    for epsilon, (n, d, k) in ((1.0, IRIS), (0.25, ADULT), (0.75, S1)):
        params = dp.sulloyd_parameters(epsilon, n, k, d)
        one_iteration = dp_accounting.ComposedDpEvent(
            [
                dp_accounting.LaplaceDpEvent(noise_multiplier=params.scale_sum / d),
                dp_accounting.LaplaceDpEvent(noise_multiplier=params.scale_count),
            ]
        )
        accountant = pld.PLDAccountant(value_discretization_interval=1e-4)
        accountant.compose(dp_accounting.SelfComposedDpEvent(one_iteration, params.iterations))
        assert accountant.get_epsilon(1e-9) == pytest.approx(epsilon, abs=1e-3)


# ---------------------------------------------------------------------------------------------
# Oracle 17: iteration heuristics (FastLloyd / GLloyd / SuLloyd)


@pytest.mark.parametrize(
    ("dataset", "epsilon", "expected"),
    [
        (IRIS, 0.1, (2, 2, 2)),
        (IRIS, 1.0, (2, 2, 2)),
        (S1, 1.0, (7, 2, 2)),
        (S1, 0.75, (4, 2, 2)),
        (HOUSE, 1.0, (7, 3, 2)),
        (HOUSE, 0.75, (6, 2, 2)),
        (ADULT, 0.1, (7, 5, 2)),
        (ADULT, 0.25, (7, 7, 5)),
        (BIRCH2, 1.0, (3, 2, 2)),
    ]
    + [(MNIST, epsilon, (2, 2, 2)) for epsilon in EPSILON_GRID],
)
def test_iteration_heuristics_oracle(dataset, epsilon, expected):
    n, d, k = dataset
    sigma = dp.gaussian_sigma(epsilon, dp.default_delta(n))
    got = (
        dp.fastlloyd_iterations(n, k, d, sigma),
        dp.glloyd_iterations(n, k, d, sigma),
        dp.sulloyd_parameters(epsilon, n, k, d).iterations,
    )
    assert got == expected
    assert dp.calibrate_fastlloyd(epsilon, n, k, d).iterations == expected[0]
    assert dp.calibrate_glloyd(epsilon, n, k, d).iterations == expected[1]


def test_iteration_heuristics_clamp_and_truncate():
    # Noise-free limit: the raw count explodes and is clamped to 7; huge noise: clamped to 2.
    assert dp.fastlloyd_iterations(10**6, 2, 2, 1e-3) == 7
    assert dp.glloyd_iterations(10**6, 2, 2, 1e-3) == 7
    assert dp.fastlloyd_iterations(10, 50, 2, 1e3) == 2
    assert dp.glloyd_iterations(10, 50, 2, 1e3) == 2
    # Between the clamps the raw value is truncated, not rounded: pick sigma for T_raw = 4.9.
    n, k, d = 1000, 3, 2
    eta = dp.steady_radius(k, d)
    sigma = math.sqrt(4 * n * n * 0.004 / (4.9 * k**3 * eta**2 * (1 + math.sqrt(4 * d)) ** 2))
    assert dp.fastlloyd_iterations(n, k, d, sigma) == 4
    sigma = math.sqrt(0.004 * n * n / (4.9 * k**3 * d * (0.45 + math.sqrt(d)) ** 2))
    assert dp.glloyd_iterations(n, k, d, sigma) == 4


# ---------------------------------------------------------------------------------------------
# Oracle 18: per-coordinate noise


def test_fastlloyd_noise_std_oracle():
    n, d, k = IRIS
    iris = dp.calibrate_fastlloyd(1.0, n, k, d)
    assert iris.iterations == 2
    assert_printed(iris.std_sum[1], "4.7928")
    assert_printed(iris.std_count, "7.8846")
    n, d, k = S1
    s1 = dp.calibrate_fastlloyd(1.0, n, k, d)
    assert s1.iterations == 7
    assert_printed(s1.std_sum[0], "15.3894")
    for std in s1.std_sum[1:]:
        assert_printed(std, "3.1788")
    assert_printed(s1.std_count, "18.3012")
    root_t = math.sqrt(s1.iterations)
    for radius, std in zip(s1.radii, s1.std_sum):
        assert std == pytest.approx(s1.sigma_sum * root_t * radius, rel=1e-14)
    assert s1.std_count == pytest.approx(s1.sigma_count * root_t, rel=1e-14)


@pytest.mark.parametrize(
    ("dataset", "epsilon", "printed_sum", "printed_count"),
    [
        (IRIS, 1.0, "7.8053", "8.2275"),
        (IRIS, 0.1, "51.5262", "54.3134"),
        (MNIST, 1.0, "148.17", "41.742"),
    ],
)
def test_glloyd_noise_std_oracle(dataset, epsilon, printed_sum, printed_count):
    n, d, k = dataset
    calibration = dp.calibrate_glloyd(epsilon, n, k, d)
    assert calibration.iterations == 2
    assert calibration.radii == pytest.approx((math.sqrt(d),) * 2)
    for std in calibration.std_sum:
        assert_printed(std, printed_sum)
    assert_printed(calibration.std_count, printed_count)


def test_glloyd_scales_with_the_domain_bound():
    n, d, k = IRIS
    unit = dp.calibrate_glloyd(1.0, n, k, d)
    wide = dp.calibrate_glloyd(1.0, n, k, d, bound=3.0)
    assert wide.radii == pytest.approx(tuple(3.0 * r for r in unit.radii))
    assert wide.std_sum == pytest.approx(tuple(3.0 * s for s in unit.std_sum))
    assert wide.std_count == unit.std_count
    assert wide.mu() == pytest.approx(unit.mu(), rel=1e-12)


def test_sulloyd_oracle():
    n, d, k = IRIS
    iris = dp.sulloyd_parameters(1.0, n, k, d)
    assert iris.iterations == 2
    assert_printed(iris.eps_m, "8.485")
    assert_printed(iris.scale_sum, "9.8643")
    assert_printed(iris.scale_count, "10.5821")
    assert_printed(iris.eps_sum, "0.40550")
    assert_printed(iris.eps_count, "0.09450")
    assert iris.eps_sum + iris.eps_count == pytest.approx(0.5, rel=1e-14)
    assert iris.iterations * (iris.eps_sum + iris.eps_count) == pytest.approx(1.0, rel=1e-14)
    assert iris.scale_sum == pytest.approx(d / iris.eps_sum, rel=1e-14)
    assert iris.scale_count == pytest.approx(1 / iris.eps_count, rel=1e-14)
    n, d, k = S1
    s1 = dp.sulloyd_parameters(1.0, n, k, d)
    assert_printed(s1.scale_sum, "5.4797")
    assert_printed(s1.scale_count, "7.4064")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s1.iterations = 3  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# Oracle 20: zCDP view


def test_zcdp_oracle():
    n, d, k = S1
    calibration = dp.calibrate_fastlloyd(1.0, n, k, d)
    assert_printed(dp.zcdp_rho(calibration.sigma), "0.040007")
    assert dp.zcdp_rho(calibration.sigma) == pytest.approx(calibration.mu() ** 2 / 2, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# Calibration objects


def test_calibrate_fastlloyd_options():
    n, d, k = S1
    default = dp.calibrate_fastlloyd(1.0, n, k, d)
    assert default.delta == dp.default_delta(n)
    assert default.sigma == dp.gaussian_sigma(1.0, dp.default_delta(n))
    assert (default.sigma_sum, default.sigma_count) == dp.fastlloyd_noise_split(default.sigma, d)

    fixed = dp.calibrate_fastlloyd(1.0, n, k, d, delta=1e-5, iterations=3, strategy="constant")
    assert fixed.delta == 1e-5 and fixed.iterations == 3
    assert fixed.radii == dp.radius_schedule("constant", k, d, 3)
    assert len(fixed.std_sum) == 3
    assert fixed.mu() == pytest.approx(1 / dp.gaussian_sigma(1.0, 1e-5), rel=1e-12)

    none = dp.calibrate_fastlloyd(1.0, n, k, d, strategy="none", iterations=2)
    assert none.radii == pytest.approx((2 * math.sqrt(d),) * 2)
    assert none.mu() == pytest.approx(1 / none.sigma, rel=1e-12)

    wide = dp.calibrate_fastlloyd(1.0, n, k, d, bound=2.0)
    assert wide.iterations == default.iterations
    assert wide.std_sum == pytest.approx(tuple(2.0 * s for s in default.std_sum))


def test_gaussian_calibration_is_frozen_and_consistent():
    n, d, k = IRIS
    calibration = dp.calibrate_fastlloyd(1.0, n, k, d)
    with pytest.raises(dataclasses.FrozenInstanceError):
        calibration.sigma = 1.0  # type: ignore[misc]
    built = dp.GaussianCalibration(
        epsilon=1.0,
        delta=1e-5,
        sigma=2.0,
        sigma_sum=3.0,
        sigma_count=4.0,
        iterations=2,
        radii=[1.0, 0.5],
        std_sum=[3.0, 1.5],
        std_count=4.0,
    )
    assert built.radii == (1.0, 0.5) and built.std_sum == (3.0, 1.5)
    hash(built)
    with pytest.raises(ValueError, match="one entry per iteration"):
        dataclasses.replace(built, iterations=3)


# ---------------------------------------------------------------------------------------------
# Oracle 27: AUC


def test_auc_oracle():
    assert dp.auc_over_epsilons(EPSILON_GRID, [2.5] * 5) == pytest.approx(0.9 * 2.5, rel=1e-14)
    a, b = 0.7, -0.3
    linear = [a + b * e for e in EPSILON_GRID]
    assert dp.auc_over_epsilons(EPSILON_GRID, linear) == pytest.approx(
        0.9 * a + 0.495 * b, rel=1e-14
    )
    # Trapezoids, not the exact integral: a convex curve is overestimated.
    assert dp.auc_over_epsilons([0.0, 1.0], [0.0, 1.0]) == 0.5
    assert dp.auc_over_epsilons([0.0, 0.5, 1.0], [0.0, 0.25, 1.0]) == pytest.approx(0.375)


# ---------------------------------------------------------------------------------------------
# Bad arguments


@pytest.mark.parametrize(
    "call",
    [
        lambda: dp.gaussian_sigma(0.0, 1e-5),
        lambda: dp.gaussian_sigma(-1.0, 1e-5),
        lambda: dp.gaussian_sigma(math.nan, 1e-5),
        lambda: dp.gaussian_sigma(math.inf, 1e-5),
        lambda: dp.gaussian_sigma(1.0, 0.0),
        lambda: dp.gaussian_sigma(1.0, 1.0),
        lambda: dp.gaussian_sigma(1.0, -1e-5),
        lambda: dp.gaussian_sigma(1.0, math.nan),
        lambda: dp.gdp_delta(0.0, 1.0),
        lambda: dp.gdp_delta(1.0, -0.1),
        lambda: dp.spent_epsilon(-1.0, 1e-5),
        lambda: dp.spent_epsilon(1.0, 1.0),
        lambda: dp.default_delta(1),
        lambda: dp.default_delta(0),
        lambda: dp.default_delta(2.5),
        lambda: dp.default_delta(True),
        lambda: dp.zcdp_rho(0.0),
        lambda: dp.fastlloyd_noise_split(0.0, 2),
        lambda: dp.fastlloyd_noise_split(1.0, 0),
        lambda: dp.glloyd_noise_split(1.0, 2, rho=0.0),
        lambda: dp.glloyd_noise_split(1.0, 0),
        lambda: dp.steady_radius(0, 2),
        lambda: dp.steady_radius(3, 0),
        lambda: dp.steady_radius(3, 2, alpha=0.0),
        lambda: dp.steady_radius(3, 2, alpha=-0.8),
        lambda: dp.steady_radius(3, 2, bound=0.0),
        lambda: dp.radius_schedule("diagonal_then_frac", 3, 2, 2),
        lambda: dp.radius_schedule("step", 3, 2, 0),
        lambda: dp.fastlloyd_iterations(1, 3, 2, 1.0),
        lambda: dp.fastlloyd_iterations(100, 0, 2, 1.0),
        lambda: dp.fastlloyd_iterations(100, 3, 2, 0.0),
        lambda: dp.fastlloyd_iterations(100, 3, 2, 1.0, alpha=0.0),
        lambda: dp.glloyd_iterations(100, 3, 0, 1.0),
        lambda: dp.glloyd_iterations(100, 3, 2, 1.0, rho=-1.0),
        lambda: dp.sulloyd_parameters(0.0, 100, 3, 2),
        lambda: dp.sulloyd_parameters(1.0, 1, 3, 2),
        lambda: dp.sulloyd_parameters(1.0, 100, 0, 2),
        lambda: dp.sulloyd_parameters(1.0, 100, 3, 0),
        lambda: dp.calibrate_fastlloyd(0.0, 100, 3, 2),
        lambda: dp.calibrate_fastlloyd(1.0, 1, 3, 2),
        lambda: dp.calibrate_fastlloyd(1.0, 100, 0, 2),
        lambda: dp.calibrate_fastlloyd(1.0, 100, 3, 0),
        lambda: dp.calibrate_fastlloyd(1.0, 100, 3, 2, delta=1.0),
        lambda: dp.calibrate_fastlloyd(1.0, 100, 3, 2, alpha=0.0),
        lambda: dp.calibrate_fastlloyd(1.0, 100, 3, 2, strategy="Step"),
        lambda: dp.calibrate_fastlloyd(1.0, 100, 3, 2, bound=-1.0),
        lambda: dp.calibrate_fastlloyd(1.0, 100, 3, 2, iterations=0),
        lambda: dp.calibrate_glloyd(-1.0, 100, 3, 2),
        lambda: dp.calibrate_glloyd(1.0, 100, 3, 2, delta=0.0),
        lambda: dp.calibrate_glloyd(1.0, 100, 3, 2, rho=0.0),
        lambda: dp.calibrate_glloyd(1.0, 100, 3, 2, iterations=0),
        lambda: dp.composed_mu([], [], 1.0),
        lambda: dp.composed_mu([1.0, 1.0], [1.0], 1.0),
        lambda: dp.composed_mu([1.0], [0.0], 1.0),
        lambda: dp.composed_mu([-1.0], [1.0], 1.0),
        lambda: dp.composed_mu([1.0], [1.0], 0.0),
        lambda: dp.composed_mu([1.0, 1.0], [1.0, 1.0], [1.0]),
        lambda: dp.auc_over_epsilons([0.1], [1.0]),
        lambda: dp.auc_over_epsilons([0.1, 0.2], [1.0]),
        lambda: dp.auc_over_epsilons([0.2, 0.1], [1.0, 1.0]),
        lambda: dp.auc_over_epsilons([0.1, 0.1], [1.0, 1.0]),
        lambda: dp.auc_over_epsilons([0.1, 0.2], [1.0, math.nan]),
    ],
)
def test_bad_arguments_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_error_messages_name_the_argument():
    with pytest.raises(ValueError, match="epsilon"):
        dp.gaussian_sigma(0.0, 1e-5)
    with pytest.raises(ValueError, match=r"delta .*\(0, 1\)"):
        dp.gaussian_sigma(1.0, 2.0)
    with pytest.raises(ValueError, match="n must be an integer >= 2"):
        dp.default_delta(1)
    with pytest.raises(ValueError, match="unknown radius strategy 'frac_stay'"):
        dp.radius_schedule("frac_stay", 3, 2, 2)
    with pytest.raises(ValueError, match="alpha"):
        dp.steady_radius(3, 2, alpha=0.0)


# ---------------------------------------------------------------------------------------------
# The privacy ledger (issue 30): one layout for any sequence of Gaussian or Laplace releases


def _release(round_idx, name, mechanism, sensitivity, scale):
    return dp.Release(round_idx, name, (2,), mechanism, sensitivity, scale)


def test_ledger_of_gaussian_releases_composes_in_gdp():
    releases = [_release(1, "b", "gaussian", 1.0, 4.0), _release(0, "a", "gaussian", 2.0, 4.0),
                _release(1, "c", "gaussian", 0.0, 1.0)]  # sensitivity 0: reveals nothing
    ledger = dp.privacy_ledger(releases, 1e-5)
    assert [(r["round_idx"], r["name"]) for r in ledger["releases"]] == [(0, "a"), (1, "b"), (1, "c")]
    assert [r["gdp_mu"] for r in ledger["releases"]] == [0.5, 0.25, 0.0]
    assert ledger["releases"][2]["epsilon"] == 0.0
    assert ledger["gdp_mu"] == pytest.approx(math.sqrt(0.5**2 + 0.25**2), rel=1e-15)
    assert ledger["epsilon"] == pytest.approx(dp.spent_epsilon(ledger["gdp_mu"], 1e-5), rel=1e-15)
    assert [r["gdp_mu"] for r in ledger["per_round"]] == [0.5, 0.25]
    assert ledger["rounds"] == 2 and ledger["accountant"] == "gdp" and ledger["delta"] == 1e-5
    assert {r["sensitivity_norm"] for r in ledger["releases"]} == {"l2"}
    # the total matches dp_accounting's PLD for the same three Gaussian mechanisms
    accountant = pld.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(2.0),
                                                      dp_accounting.GaussianDpEvent(4.0)]))
    assert accountant.get_epsilon(1e-5) == pytest.approx(ledger["epsilon"], abs=2e-4)


def test_ledger_of_laplace_releases_adds_up_epsilons():
    ledger = dp.privacy_ledger([_release(0, "a", "laplace", 2.0, 4.0), _release(0, "b", "laplace", 1.0, 4.0),
                                _release(1, "a", "laplace", 2.0, 8.0)])
    assert [r["epsilon"] for r in ledger["per_round"]] == [0.75, 0.25]
    assert ledger["epsilon"] == 1.0 and ledger["delta"] == 0.0 and "gdp_mu" not in ledger
    assert ledger["accountant"] == "basic_composition"
    assert {r["sensitivity_norm"] for r in ledger["releases"]} == {"l1"}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: dp.privacy_ledger([]), "at least one release"),
        (lambda: dp.privacy_ledger([_release(0, "a", "gaussian", 1.0, 1.0)]), "needs the run's delta"),
        (lambda: dp.privacy_ledger([_release(0, "a", "gaussian", 1.0, 1.0)], 1.0), r"delta .*\(0, 1\)"),
        (lambda: dp.privacy_ledger([_release(0, "a", "laplace", 1.0, 1.0)], 1e-5), "pure epsilon-DP"),
        (lambda: dp.privacy_ledger([_release(0, "a", "laplace", 1.0, 1.0), _release(0, "b", "gaussian", 1.0, 1.0)],
                                   1e-5), "one mechanism"),
        (lambda: _release(0, "a", "exponential", 1.0, 1.0), "unknown mechanism 'exponential'"),
        (lambda: _release(0, "a", "gaussian", 1.0, 0.0), "noise_scale"),
        (lambda: _release(0, "a", "gaussian", -1.0, 1.0), "sensitivity"),
        (lambda: _release(-1, "a", "gaussian", 1.0, 1.0), "round_idx"),
    ],
)
def test_ledger_refuses_what_it_cannot_account(call, message):
    with pytest.raises(ValueError, match=message):
        call()

"""Privacy calibration for FastLloyd and its baselines (GLloyd, SuLloyd).

Pure Python/NumPy/SciPy: nothing here draws noise; it only turns a privacy budget into noise
scales, iteration counts and radius schedules, and turns noise scales back into a budget.

Privacy model. Every guarantee in this module is stated under **add/remove-one adjacency**: two
datasets are neighbours when one is the other with a single point added or removed. A mechanism
``M`` is *(epsilon, delta)-DP* when ``P[M(D) in S] <= e^epsilon P[M(D') in S] + delta`` for all
neighbours ``D, D'`` and all events ``S``. It is *mu-GDP* (Dong, Roth, Su 2019) when
distinguishing ``M(D)`` from ``M(D')`` is no easier than distinguishing ``N(0, 1)`` from
``N(mu, 1)``. The Gaussian mechanism with L2 sensitivity ``Delta`` and noise ``N(0, s^2 I)`` is
exactly ``(Delta / s)``-GDP, and mu-GDP is equivalent to (epsilon, delta(epsilon))-DP for every
``epsilon >= 0`` with ``delta(epsilon)`` given by :func:`gdp_delta` (Dong, Roth, Su 2019,
Corollary 2.13; the same curve as Balle & Wang 2018, Theorem 8).

FastLloyd's accounting (Diaa, Humphries, Kerschbaum; Secs. 2.3, 5.1, 5.5, App. A.2; spec
fastlloyd.md section 2.3):

1. ``delta = 1 / (N ln N)`` (:func:`default_delta`).
2. ``sigma`` = the smallest noise multiplier making the sensitivity-1 Gaussian mechanism
   (epsilon, delta)-DP, i.e. ``mu = 1 / sigma`` solves ``gdp_delta(mu, epsilon) = delta``
   (:func:`gaussian_sigma`; the analytic Gaussian mechanism of Balle & Wang 2018, Alg. 1).
3. The budget is split between the relative sums ``R`` and the counts ``C`` so that
   ``(1/sigma_R)^2 + (1/sigma_C)^2 = (1/sigma)^2`` (:func:`fastlloyd_noise_split`, Eq. 7).
4. Each of the ``T`` iterations adds noise with standard deviation ``sigma_R sqrt(T) eta_t`` to
   every coordinate of ``R`` (L2 sensitivity ``eta_t``, Thm 5.1) and ``sigma_C sqrt(T)`` to every
   count (sensitivity 1). Each point touches one cluster per iteration (parallel composition over
   clusters), and GDP composition gives ``sqrt(sum_t mu_t^2) = 1 / sigma`` in total
   (:func:`composed_mu`; Lemma A.1), which converts back to exactly (epsilon, delta)-DP.

GLloyd (App. B.1) is the same with absolute sums (L2 sensitivity ``sqrt(d) B``) and Su et al.'s
split; SuLloyd (Su et al. 2016) uses Laplace noise and basic composition
(:func:`sulloyd_parameters`). :func:`zcdp_rho` gives the zCDP view (spec section 2.12), which is
looser than the exact GDP conversion and is therefore never used to calibrate.

:func:`privacy_ledger` states what a run spends, release by release (the report's ``privacy``
field): the mechanism, the sensitivity and its norm, the noise scale, epsilon and delta per
release, per round and composed, with the accountant (GDP for Gaussian releases, basic
composition for Laplace ones).

Everything is computed in float64 (Python floats): the noise multipliers are solved to about
1e-12 relative, far below the printed precision of the paper's numbers.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedproto import memo

__all__ = [
    "GaussianCalibration",
    "Release",
    "SuLloydParameters",
    "auc_over_epsilons",
    "calibrate_fastlloyd",
    "calibrate_glloyd",
    "composed_mu",
    "default_delta",
    "fastlloyd_iterations",
    "fastlloyd_noise_split",
    "gaussian_sigma",
    "gdp_delta",
    "glloyd_iterations",
    "glloyd_noise_split",
    "privacy_ledger",
    "radius_schedule",
    "spent_epsilon",
    "steady_radius",
    "sulloyd_parameters",
    "zcdp_rho",
]

#: Radius strategies of spec section 2.5 (paper names "Step", "Constant", "No constraint").
STRATEGIES = ("step", "constant", "none")

#: Iteration counts are clamped to this range by every heuristic (spec sections 2.3.7, 3.2, 3.3).
MIN_ITERATIONS = 2
MAX_ITERATIONS = 7

#: Per-iteration MSE target of Su et al.'s heuristic, for data in [-1, 1]^d (Eq. 21).
_MSE_TARGET = 0.004

# Root-finding tolerances: brentq's rtol must be at least 4 machine epsilons.
_RTOL = 4.0 * np.finfo(float).eps
_XTOL = 1e-300
_MAX_BRACKET_STEPS = 2000


# --------------------------------------------------------------------------------------------
# Argument checks: configuration mistakes are ValueError (ARCHITECTURE.md section 8).


def _check_positive(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def _check_nonnegative(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def _check_epsilon(epsilon: float) -> float:
    return _check_positive("epsilon", epsilon)


def _check_delta(delta: float) -> float:
    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must lie in the open interval (0, 1), got {delta!r}")
    return delta


def _check_int(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown radius strategy {strategy!r}; expected one of {STRATEGIES}")
    return strategy


# --------------------------------------------------------------------------------------------
# GDP <-> (epsilon, delta)


def _log_gdp_delta(mu: float, epsilon: float) -> float:
    """``ln delta(epsilon)`` of a mu-GDP mechanism, computed in log space.

    Both terms of the difference are formed as logarithms (``log_ndtr``) so that neither the
    tiny normal tails nor the factor ``e^epsilon`` overflow or underflow, and the difference is
    taken with ``log1p(-exp(.))``. SciPy is imported here, not with the module: only a
    calibration needs it (about 0.3 s of every start-up otherwise).
    """
    import scipy.special

    log_first = scipy.special.log_ndtr(-epsilon / mu + mu / 2.0)
    log_second = epsilon + scipy.special.log_ndtr(-epsilon / mu - mu / 2.0)
    if log_second >= log_first:
        # The exact difference is positive; equality only happens when rounding ate it.
        return -math.inf
    return float(log_first + np.log1p(-np.exp(log_second - log_first)))


def gdp_delta(mu: float, epsilon: float) -> float:
    """The delta at which a mu-GDP mechanism is (epsilon, delta)-DP.

    A mechanism is mu-GDP under add/remove-one adjacency iff for every ``epsilon >= 0`` it is
    (epsilon, delta(epsilon))-DP under the same adjacency with::

        delta(epsilon) = Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2)

    (``Phi`` the standard normal CDF). For the Gaussian mechanism with L2 sensitivity ``Delta``
    and noise standard deviation ``s``, ``mu = Delta / s`` and this is the exact privacy curve.
    The computation is done in log space, so it stays accurate when delta is far below 1e-16.

    Args:
        mu: GDP parameter (dimensionless; sensitivity divided by noise standard deviation),
            finite and > 0.
        epsilon: (epsilon, delta)-DP epsilon (natural-log units), finite and >= 0.

    Returns:
        delta in [0, 1).

    Raises:
        ValueError: if ``mu`` is not a finite number > 0 or ``epsilon`` is not finite and >= 0.

    References:
        Dong, Roth, Su 2019, "Gaussian Differential Privacy", Corollary 2.13.
        Balle & Wang 2018, "Improving the Gaussian mechanism for differential privacy", Thm 8.
        FastLloyd (Diaa, Humphries, Kerschbaum), Sec. 2.3; spec fastlloyd.md section 2.3 item 2.
    """
    mu = _check_positive("mu", mu)
    epsilon = _check_nonnegative("epsilon", epsilon)
    return math.exp(_log_gdp_delta(mu, epsilon))


def _solve_increasing(func, start: float) -> float:
    """Root of a function increasing in ``x > 0``, solved in ``ln x`` with bracket expansion."""
    lo = hi = math.log(start)
    f_lo = f_hi = func(start)
    steps = 0
    while f_hi <= 0.0:
        lo, f_lo = hi, f_hi
        hi += math.log(2.0)
        f_hi = func(math.exp(hi))
        steps += 1
        if steps > _MAX_BRACKET_STEPS:
            raise ValueError("could not bracket the root (arguments numerically out of range)")
    while f_lo >= 0.0:
        hi, f_hi = lo, f_lo
        lo -= math.log(2.0)
        f_lo = func(math.exp(lo))
        steps += 1
        if steps > _MAX_BRACKET_STEPS:
            raise ValueError("could not bracket the root (arguments numerically out of range)")
    # Where rounding sends the curve to +-inf, move that end inward until it is representable.
    while not (math.isfinite(f_lo) and math.isfinite(f_hi)):
        mid = 0.5 * (lo + hi)
        f_mid = func(math.exp(mid))
        if f_mid == 0.0:
            return math.exp(mid)
        if f_mid < 0.0:
            lo, f_lo = mid, f_mid
        else:
            hi, f_hi = mid, f_mid
        steps += 1
        if steps > _MAX_BRACKET_STEPS:
            raise ValueError("privacy curve not representable in float64 for these arguments")
    import scipy.optimize  # here, not at import: only a calibration needs it

    log_root = scipy.optimize.brentq(
        lambda log_x: func(math.exp(log_x)), lo, hi, xtol=1e-15, rtol=_RTOL, maxiter=500
    )
    return math.exp(log_root)


def gaussian_sigma(epsilon: float, delta: float) -> float:
    """Smallest noise multiplier of an (epsilon, delta)-DP Gaussian mechanism.

    Returns the smallest ``sigma`` such that releasing ``f(D) + N(0, sigma^2 Delta^2 I)`` for a
    function of L2 sensitivity ``Delta`` is (epsilon, delta)-DP under add/remove-one adjacency.
    Equivalently ``sigma = 1 / mu`` with ``gdp_delta(mu, epsilon) == delta``; this is the analytic
    Gaussian mechanism (Balle & Wang 2018, Alg. 1), solved here by Brent's method on the GDP
    curve to about 1e-12 relative (e.g. ``(1, 1e-5) -> 3.730632``). The result is kept on disk
    (:mod:`fedproto.memo`, keyed by the arguments and SciPy's version), so a later call with the
    same arguments returns the same float without importing SciPy.

    Args:
        epsilon: target epsilon (natural-log units), finite and > 0.
        delta: target delta, in (0, 1).

    Returns:
        The noise multiplier sigma (noise standard deviation per unit of L2 sensitivity).

    Raises:
        ValueError: if ``epsilon <= 0`` or not finite, or ``delta`` is not in (0, 1).

    References:
        Balle & Wang 2018, Alg. 1 (analytic Gaussian mechanism).
        Dong, Roth, Su 2019, Corollary 2.13.
        FastLloyd Secs. 2.3, 5.1; spec fastlloyd.md section 2.3 item 2, oracle 7.3.12.
    """
    epsilon = _check_epsilon(epsilon)
    delta = _check_delta(delta)
    key = _solver_key(epsilon, delta)
    found = memo.lookup("gaussian_sigma", key)
    if isinstance(found, float):
        return found
    log_delta = math.log(delta)
    # gdp_delta grows with mu: more signal per unit of noise means a larger delta.
    mu = _solve_increasing(lambda m: _log_gdp_delta(m, epsilon) - log_delta, start=1.0)
    sigma = 1.0 / mu
    memo.store("gaussian_sigma", key, sigma)
    return sigma


def _solver_key(*args: float) -> list:
    """What a solved curve depends on: the arguments (exactly, as hex), the solver's tolerances
    and SciPy's version (its ``log_ndtr`` and ``brentq``), read without importing SciPy."""
    return [*(float.hex(a) for a in args), float.hex(_RTOL), _MAX_BRACKET_STEPS, _scipy_version()]


@functools.cache
def _scipy_version() -> str:
    """SciPy's installed version (``"unknown"`` without it), read once a process: each read scans
    every installed distribution (about 8 ms), and a run's ledger looks up dozens of curves."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("scipy")
    except PackageNotFoundError:
        return "unknown"


def spent_epsilon(mu: float, delta: float) -> float:
    """The epsilon at which a mu-GDP mechanism is (epsilon, delta)-DP.

    Inverts :func:`gdp_delta` in epsilon: the smallest ``epsilon >= 0`` with
    ``gdp_delta(mu, epsilon) <= delta``, for add/remove-one adjacency. Returns 0.0 when the
    mechanism is already (0, delta)-DP. Kept on disk like :func:`gaussian_sigma`.

    Args:
        mu: GDP parameter of the whole run (e.g. :meth:`GaussianCalibration.mu`), finite, > 0.
        delta: target delta, in (0, 1).

    Returns:
        epsilon >= 0 (natural-log units).

    Raises:
        ValueError: if ``mu`` is not a finite number > 0 or ``delta`` is not in (0, 1).

    References:
        Dong, Roth, Su 2019, Corollary 2.13.
        FastLloyd Sec. 2.3 and App. A.2 (the reported epsilon is the total over all iterations).
    """
    mu = _check_positive("mu", mu)
    delta = _check_delta(delta)
    key = _solver_key(mu, delta)
    found = memo.lookup("spent_epsilon", key)
    if isinstance(found, float):
        return found
    log_delta = math.log(delta)
    if _log_gdp_delta(mu, 0.0) <= log_delta:
        epsilon = 0.0
    else:
        # gdp_delta falls with epsilon, so solve the negated curve, which rises.
        epsilon = _solve_increasing(lambda e: log_delta - _log_gdp_delta(mu, e), start=1.0)
    memo.store("spent_epsilon", key, epsilon)
    return epsilon


def default_delta(n: int) -> float:
    """FastLloyd's default delta, ``1 / (n ln n)`` (natural logarithm).

    The delta of (epsilon, delta)-DP under add/remove-one adjacency, chosen below ``1/n`` as
    the paper does for every dataset.

    Args:
        n: total number of points N over all clients, >= 2.

    Returns:
        delta in (0, 1) (e.g. N = 150 -> 1.3305e-3).

    Raises:
        ValueError: if ``n`` is not an integer >= 2.

    References:
        FastLloyd Sec. 6.1 (experimental setup); spec fastlloyd.md sections 2.1 and 2.3 item 1,
        oracle 7.3.13.
    """
    n = _check_int("n", n, 2)
    return 1.0 / (n * math.log(n))


def zcdp_rho(sigma: float) -> float:
    """zCDP parameter of the Gaussian mechanism with noise multiplier ``sigma``.

    A Gaussian mechanism with noise standard deviation ``sigma * Delta`` for L2 sensitivity
    ``Delta`` is ``rho``-zCDP with ``rho = 1 / (2 sigma^2)`` (equivalently ``mu^2 / 2`` of its
    mu-GDP guarantee), under add/remove-one adjacency. Converting zCDP to (epsilon, delta) is
    looser than the exact GDP conversion, so this is a reporting view only.

    Args:
        sigma: noise multiplier (standard deviation per unit of L2 sensitivity), > 0.

    Returns:
        rho (nats), e.g. 0.040007 for S1 at epsilon = 1.

    Raises:
        ValueError: if ``sigma`` is not a finite number > 0.

    References:
        Bun & Steinke 2016, "Concentrated Differential Privacy", Proposition 1.6.
        Spec fastlloyd.md section 2.12, oracle 7.3.20.
    """
    sigma = _check_positive("sigma", sigma)
    return 1.0 / (2.0 * sigma * sigma)


# --------------------------------------------------------------------------------------------
# Budget splits, radii and iteration heuristics


def fastlloyd_noise_split(sigma: float, d: int) -> tuple[float, float]:
    """Split FastLloyd's noise multiplier between relative sums and counts.

    Minimising the approximate MSE of one centroid update (Eq. 17) subject to
    ``(1/sigma_R)^2 + (1/sigma_C)^2 = (1/sigma)^2`` (GDP composition of the two releases, Eq. 18)
    gives::

        sigma_R = sigma sqrt(1 + sqrt(4 d)) / (4 d)^(1/4)
        sigma_C = sigma sqrt(1 + sqrt(4 d))                 (so sigma_C / sigma_R = (4 d)^(1/4))

    Releasing R with multiplier ``sigma_R`` and C with ``sigma_C`` is then (1/sigma)-GDP, i.e.
    exactly as private as one sensitivity-1 Gaussian mechanism with multiplier ``sigma``.

    Args:
        sigma: total noise multiplier (from :func:`gaussian_sigma`), > 0.
        d: dimension of the data, >= 1.

    Returns:
        ``(sigma_R, sigma_C)``: noise multipliers of the relative sums (per unit of their L2
        sensitivity, the radius) and of the counts (sensitivity 1), before the ``sqrt(T)``
        split across iterations.

    Raises:
        ValueError: if ``sigma`` is not a finite number > 0 or ``d < 1``.

    References:
        FastLloyd Sec. 5.5, Eqs. 7, 17, 18; spec fastlloyd.md section 2.3 item 3, oracle 7.3.14.
    """
    sigma = _check_positive("sigma", sigma)
    d = _check_int("d", d, 1)
    root_4d = math.sqrt(4.0 * d)
    sigma_c = sigma * math.sqrt(1.0 + root_4d)
    sigma_r = sigma_c / math.sqrt(root_4d)
    return sigma_r, sigma_c


def glloyd_noise_split(sigma: float, d: int, rho: float = 0.225) -> tuple[float, float]:
    """Split GLloyd's noise multiplier between absolute sums and counts.

    Su et al.'s MSE model with Gaussian variances (Eq. 29) is minimised at
    ``sigma_C = sqrt(sqrt(d) / (2 rho)) sigma_S`` (Eq. 31); normalising to the GDP constraint
    ``(1/sigma_S)^2 + (1/sigma_C)^2 = (1/sigma)^2`` gives::

        sigma_S = sigma sqrt(2 rho + sqrt(d)) / d^(1/4)
        sigma_C = sigma sqrt(2 rho + sqrt(d)) / sqrt(2 rho)

    Args:
        sigma: total noise multiplier (from :func:`gaussian_sigma`), > 0.
        d: dimension of the data, >= 1.
        rho: Su et al.'s constant (dimensionless), > 0.

    Returns:
        ``(sigma_S, sigma_C)``: noise multipliers of the absolute sums (per unit of their L2
        sensitivity ``sqrt(d) B``) and of the counts, before the ``sqrt(T)`` split.

    Raises:
        ValueError: if ``sigma`` or ``rho`` is not a finite number > 0, or ``d < 1``.

    References:
        FastLloyd App. B.1, Eqs. 29-31; Su et al. 2016 (DPLloyd error model);
        spec fastlloyd.md section 3.3, oracle 7.3.14.
    """
    sigma = _check_positive("sigma", sigma)
    d = _check_int("d", d, 1)
    rho = _check_positive("rho", rho)
    scale = sigma * math.sqrt(2.0 * rho + math.sqrt(d))
    return scale / d**0.25, scale / math.sqrt(2.0 * rho)


def steady_radius(k: int, d: int, alpha: float = 0.8, bound: float = 1.0) -> float:
    """FastLloyd's steady-state radius ``eta = alpha sqrt(d) B / k^(1/d)``.

    Treating each of the k clusters as a hypercube of side ``2B / k^(1/d)``, its half-diagonal
    is ``sqrt(d) B / k^(1/d)``; ``eta`` is ``alpha`` times that. It bounds both how far a point
    may be from its centroid to be assigned and how far a centroid may move, and is the L2
    sensitivity of the relative sums (Thm 5.1).

    Args:
        k: number of clusters, >= 1.
        d: dimension, >= 1.
        alpha: radius scale (dimensionless), > 0; the paper's best value is 0.8.
        bound: half-width B of the data domain ``[-B, B]^d`` (data units), > 0.

    Returns:
        eta in data units (e.g. Iris, k = 3, d = 4: 1.2157). Not capped at the domain diagonal;
        :func:`radius_schedule` does that.

    Raises:
        ValueError: if ``k < 1``, ``d < 1``, or ``alpha``/``bound`` is not a finite number > 0.

    References:
        FastLloyd Sec. 5.6, Eq. 25; spec fastlloyd.md section 2.5, oracle 7.3.16.
    """
    k = _check_int("k", k, 1)
    d = _check_int("d", d, 1)
    alpha = _check_positive("alpha", alpha)
    bound = _check_positive("bound", bound)
    return alpha * math.sqrt(d) * bound / k ** (1.0 / d)


def radius_schedule(
    strategy: str,
    k: int,
    d: int,
    iterations: int,
    alpha: float = 0.8,
    bound: float = 1.0,
) -> tuple[float, ...]:
    """Per-iteration radius ``eta_t`` enforced by FastLloyd (and its L2 sum sensitivity).

    Strategies (the reference code's names in parentheses):

    * ``"step"`` (``diagonal_then_frac``, the FastLloyd default): ``sqrt(d) B`` (half the
      domain diagonal) at iteration 0, then ``eta`` (:func:`steady_radius`);
    * ``"constant"`` (``frac_stay``): ``eta`` at every iteration;
    * ``"none"`` (the baselines): the domain diagonal ``2 sqrt(d) B`` at every iteration, which
      never binds.

    Every radius is capped at the domain diagonal ``2 sqrt(d) B``: no two points of the domain
    are further apart, so a larger radius constrains nothing and must not inflate the noise
    (the reference code's ``min(2 sqrt(d), eta_t)`` sensitivity).

    Args:
        strategy: ``"step"``, ``"constant"`` or ``"none"``.
        k: number of clusters, >= 1.
        d: dimension, >= 1.
        iterations: number of Lloyd iterations T, >= 1.
        alpha: radius scale (dimensionless), > 0.
        bound: half-width B of the data domain ``[-B, B]^d`` (data units), > 0.

    Returns:
        A tuple of T radii in data units, one per iteration (``round_idx`` order).

    Raises:
        ValueError: for an unknown strategy, ``k < 1``, ``d < 1``, ``iterations < 1``, or
            ``alpha``/``bound`` not a finite number > 0.

    References:
        FastLloyd Sec. 5.6 and App. B (Fig. 5 ablation); spec fastlloyd.md section 2.5 and
        section 5 quirk 10, oracle 7.3.15-16.
    """
    strategy = _check_strategy(strategy)
    iterations = _check_int("iterations", iterations, 1)
    eta = steady_radius(k, d, alpha, bound)
    diagonal = 2.0 * math.sqrt(d) * bound
    eta = min(eta, diagonal)
    if strategy == "none":
        return (diagonal,) * iterations
    if strategy == "constant":
        return (eta,) * iterations
    return (math.sqrt(d) * bound,) + (eta,) * (iterations - 1)


def _clamp_iterations(raw: float) -> int:
    # int() truncates toward zero after the clamp, as the reference code does.
    return int(min(max(raw, MIN_ITERATIONS), MAX_ITERATIONS))


def fastlloyd_iterations(n: int, k: int, d: int, sigma: float, alpha: float = 0.8) -> int:
    """FastLloyd's iteration heuristic (Eq. 21).

    Picks the largest T whose per-iteration centroid MSE (Eq. 20) stays below 0.004, for data
    normalised to ``[-1, 1]^d`` (B = 1, as in the paper)::

        T_raw = 4 N^2 0.004 / (k^3 eta^2 sigma^2 (1 + sqrt(4 d))^2)
        T     = int(clamp(T_raw, 2, 7))

    with ``eta`` the steady-state radius (:func:`steady_radius`, B = 1), not the Step strategy's
    first-iteration radius.

    Args:
        n: total number of points N, >= 2.
        k: number of clusters, >= 1.
        d: dimension, >= 1.
        sigma: total noise multiplier (from :func:`gaussian_sigma`), > 0.
        alpha: radius scale, > 0.

    Returns:
        T in [2, 7].

    Raises:
        ValueError: if ``n < 2``, ``k < 1``, ``d < 1``, or ``sigma``/``alpha`` is not a finite
            number > 0.

    References:
        FastLloyd Sec. 5.5, Eqs. 20-21 (following Su et al. 2016); spec fastlloyd.md section 2.3
        item 7, oracle 7.3.17.
    """
    n = _check_int("n", n, 2)
    sigma = _check_positive("sigma", sigma)
    eta = steady_radius(k, d, alpha)
    t_raw = (4.0 * n * n * _MSE_TARGET) / (
        k**3 * eta * eta * sigma * sigma * (1.0 + math.sqrt(4.0 * d)) ** 2
    )
    return _clamp_iterations(t_raw)


def glloyd_iterations(n: int, k: int, d: int, sigma: float, rho: float = 0.225) -> int:
    """GLloyd's iteration heuristic (App. B.1, Eq. 33 without its stray T).

    ``T = int(clamp(0.004 N^2 / (k^3 d (2 rho + sqrt(d))^2 sigma^2), 2, 7))``, for data
    normalised to ``[-1, 1]^d``.

    Args:
        n: total number of points N, >= 2.
        k: number of clusters, >= 1.
        d: dimension, >= 1.
        sigma: total noise multiplier (from :func:`gaussian_sigma`), > 0.
        rho: Su et al.'s constant, > 0.

    Returns:
        T in [2, 7].

    Raises:
        ValueError: if ``n < 2``, ``k < 1``, ``d < 1``, or ``sigma``/``rho`` is not a finite
            number > 0.

    References:
        FastLloyd App. B.1, Eq. 33; Su et al. 2016; spec fastlloyd.md section 3.3,
        oracle 7.3.17.
    """
    n = _check_int("n", n, 2)
    k = _check_int("k", k, 1)
    d = _check_int("d", d, 1)
    sigma = _check_positive("sigma", sigma)
    rho = _check_positive("rho", rho)
    t_raw = (_MSE_TARGET * n * n) / (
        k**3 * d * (2.0 * rho + math.sqrt(d)) ** 2 * sigma * sigma
    )
    return _clamp_iterations(t_raw)


# --------------------------------------------------------------------------------------------
# SuLloyd (Laplace, pure epsilon-DP)


@dataclass(frozen=True)
class SuLloydParameters:
    """SuLloyd's iteration count, budget split and Laplace scales.

    Pure epsilon-DP under add/remove-one adjacency by basic composition:
    ``iterations * (eps_sum + eps_count) == epsilon``.

    Attributes:
        iterations: number of Lloyd iterations T, in [2, 7].
        eps_m: Su et al.'s per-iteration budget threshold (natural-log units);
            ``T = int(clamp(epsilon / eps_m, 2, 7))``.
        eps_sum: per-iteration epsilon of the sums release.
        eps_count: per-iteration epsilon of the counts release.
        scale_sum: Laplace scale b_S added to each of the k*d sum coordinates (data units);
            ``d / eps_sum`` (L1 sensitivity d of a sum of points in ``[-1, 1]^d``).
        scale_count: Laplace scale b_C added to each of the k counts (points); ``1 / eps_count``.
    """

    iterations: int
    eps_m: float
    eps_sum: float
    eps_count: float
    scale_sum: float
    scale_count: float


def sulloyd_parameters(
    epsilon: float, n: int, k: int, d: int, rho: float = 0.225, iterations: int | None = None
) -> SuLloydParameters:
    """SuLloyd's calibration: iterations, per-iteration budget split and Laplace scales.

    With ``c = cbrt(4 d rho^2)``::

        eps_m = sqrt(500 k^3 / N^2 (d + c)^3)
        T     = int(clamp(epsilon / eps_m, 2, 7))
        u     = epsilon / (T (d + c));   eps_S = d u;   eps_C = c u
        b_S   = d / eps_S = 1 / u;       b_C = 1 / eps_C

    Each iteration is (eps_S + eps_C) = epsilon/T -DP (Laplace mechanism, L1 sensitivities d
    for the absolute sums of points in ``[-1, 1]^d`` and 1 for the counts; parallel composition
    over clusters), so the T iterations are epsilon-DP under add/remove-one adjacency.

    Args:
        epsilon: total privacy budget over all iterations, finite and > 0.
        n: total number of points N, >= 2.
        k: number of clusters, >= 1.
        d: dimension, >= 1.
        rho: Su et al.'s constant, > 0.
        iterations: override the iteration heuristic (the budget is then split over these).

    Returns:
        A :class:`SuLloydParameters`.

    Raises:
        ValueError: if ``epsilon``/``rho`` is not a finite number > 0, ``n < 2``, ``k < 1`` or
            ``d < 1``.

    References:
        Su, Cao, Li, Bertino, Jha 2016, "Differentially private k-means clustering" (DPLloyd
        budget split and iteration heuristic); FastLloyd Sec. 6.1.2; spec fastlloyd.md
        section 3.2, oracles 7.3.17-18.
    """
    epsilon = _check_epsilon(epsilon)
    n = _check_int("n", n, 2)
    k = _check_int("k", k, 1)
    d = _check_int("d", d, 1)
    rho = _check_positive("rho", rho)
    c = (4.0 * d * rho * rho) ** (1.0 / 3.0)
    eps_m = math.sqrt(500.0 * k**3 / (n * n) * (d + c) ** 3)
    if iterations is None:
        iterations = _clamp_iterations(epsilon / eps_m)
    else:
        iterations = _check_int("iterations", iterations, 1)
    u = epsilon / (iterations * (d + c))
    eps_sum = d * u
    eps_count = c * u
    return SuLloydParameters(
        iterations=iterations,
        eps_m=eps_m,
        eps_sum=eps_sum,
        eps_count=eps_count,
        scale_sum=d / eps_sum,
        scale_count=1.0 / eps_count,
    )


# --------------------------------------------------------------------------------------------
# Gaussian calibrations (FastLloyd, GLloyd) and their composition


def composed_mu(
    radii: Sequence[float],
    std_sum: Sequence[float],
    std_count: float | Sequence[float],
) -> float:
    """GDP parameter of T iterations of Gaussian sum and count releases.

    Iteration t releases sums with L2 sensitivity ``radii[t]`` and per-coordinate noise
    standard deviation ``std_sum[t]`` (``(radii[t]/std_sum[t])``-GDP) and counts with
    sensitivity 1 and noise ``std_count`` (``(1/std_count)``-GDP); GDP composition gives::

        mu = sqrt(sum_t [(radii[t] / std_sum[t])^2 + (1 / std_count_t)^2])

    under add/remove-one adjacency (each point touches one cluster per iteration, so the k
    clusters compose in parallel).

    Args:
        radii: ``[T]`` L2 sensitivities of the sums per iteration (data units), each >= 0.
        std_sum: ``[T]`` per-coordinate noise standard deviations of the sums (data units),
            each > 0.
        std_count: per-count noise standard deviation (points), either one value used at every
            iteration or ``[T]`` values, each > 0.

    Returns:
        mu > 0 (dimensionless); feed it to :func:`spent_epsilon` or :func:`gdp_delta`.

    Raises:
        ValueError: if the sequences are empty or of different lengths, or a radius is negative
            or a standard deviation is not a finite number > 0.

    References:
        Dong, Roth, Su 2019, Corollary 3.3 (composition of Gaussian DP).
        FastLloyd Lemma A.1, Eq. 18; spec fastlloyd.md section 2.3 item 6, oracle 7.3.15.
    """
    radii = tuple(_check_nonnegative("radius", r) for r in radii)
    std_sum = tuple(_check_positive("std_sum", s) for s in std_sum)
    if not radii:
        raise ValueError("radii must hold at least one iteration")
    if len(std_sum) != len(radii):
        raise ValueError(
            f"radii and std_sum must have one entry per iteration, got {len(radii)} and "
            f"{len(std_sum)}"
        )
    if isinstance(std_count, numbers.Real):
        counts = (_check_positive("std_count", std_count),) * len(radii)
    else:
        counts = tuple(_check_positive("std_count", s) for s in std_count)
        if len(counts) != len(radii):
            raise ValueError(
                f"std_count must be one value or one per iteration ({len(radii)}), "
                f"got {len(counts)}"
            )
    total = math.fsum((r / s) ** 2 for r, s in zip(radii, std_sum))
    total += math.fsum(1.0 / (s * s) for s in counts)
    return math.sqrt(total)


@dataclass(frozen=True)
class GaussianCalibration:
    """Noise calibration of a Gaussian DP-Lloyd run (FastLloyd or GLloyd).

    The run as a whole is (epsilon, delta)-DP under add/remove-one adjacency, equivalently
    ``mu()``-GDP with ``mu() == 1 / sigma``.

    Attributes:
        epsilon: total privacy budget over all iterations (natural-log units).
        delta: delta of the (epsilon, delta)-DP guarantee.
        sigma: total noise multiplier (:func:`gaussian_sigma` of epsilon, delta).
        sigma_sum: noise multiplier of the sums (sigma_R for FastLloyd, sigma_S for GLloyd),
            before the ``sqrt(T)`` split.
        sigma_count: noise multiplier of the counts (sigma_C), before the ``sqrt(T)`` split.
        iterations: number of Lloyd iterations T.
        radii: ``[T]`` L2 sensitivity of the sums per iteration (data units): the enforced radius
            for FastLloyd, ``sqrt(d) B`` for GLloyd's absolute sums.
        std_sum: ``[T]`` per-coordinate noise standard deviation of the (relative) sums per
            iteration (data units), ``sigma_sum sqrt(T) radii[t]``.
        std_count: per-count noise standard deviation at every iteration (points),
            ``sigma_count sqrt(T)``.
    """

    epsilon: float
    delta: float
    sigma: float
    sigma_sum: float
    sigma_count: float
    iterations: int
    radii: tuple[float, ...]
    std_sum: tuple[float, ...]
    std_count: float

    def __post_init__(self) -> None:
        # Accept any sequences but store tuples, so the calibration stays hashable and frozen.
        object.__setattr__(self, "radii", tuple(float(r) for r in self.radii))
        object.__setattr__(self, "std_sum", tuple(float(s) for s in self.std_sum))
        if not (len(self.radii) == len(self.std_sum) == self.iterations):
            raise ValueError(
                f"radii ({len(self.radii)}) and std_sum ({len(self.std_sum)}) must have one "
                f"entry per iteration ({self.iterations})"
            )

    def mu(self) -> float:
        """GDP parameter of all iterations composed (== ``1 / sigma`` up to rounding).

        Returns:
            mu (dimensionless), see :func:`composed_mu`.

        References:
            FastLloyd Lemma A.1; Dong, Roth, Su 2019, Corollary 3.3.
        """
        return composed_mu(self.radii, self.std_sum, self.std_count)


def _resolve_budget(
    epsilon: float, n: int, k: int, d: int, delta: float | None
) -> tuple[float, int, float, float]:
    epsilon = _check_epsilon(epsilon)
    n = _check_int("n", n, 2)
    _check_int("k", k, 1)
    _check_int("d", d, 1)
    delta = default_delta(n) if delta is None else _check_delta(delta)
    return epsilon, n, delta, gaussian_sigma(epsilon, delta)


def calibrate_fastlloyd(
    epsilon: float,
    n: int,
    k: int,
    d: int,
    *,
    delta: float | None = None,
    alpha: float = 0.8,
    strategy: str = "step",
    bound: float = 1.0,
    iterations: int | None = None,
) -> GaussianCalibration:
    """FastLloyd's noise calibration for a total (epsilon, delta) budget.

    The whole run (T iterations of noisy relative sums and counts) is (epsilon, delta)-DP under
    add/remove-one adjacency. Per iteration t, each of the k*d relative-sum coordinates gets
    noise with standard deviation ``sigma_R sqrt(T) eta_t`` and each of the k counts
    ``sigma_C sqrt(T)``, where ``eta_t`` is the radius enforced at iteration t (the sums' L2
    sensitivity, Thm 5.1) from :func:`radius_schedule`.

    Args:
        epsilon: total privacy budget over all iterations, finite and > 0.
        n: total number of points N over all clients, >= 2.
        k: number of clusters, >= 1.
        d: dimension, >= 1.
        delta: delta in (0, 1); defaults to :func:`default_delta` of n.
        alpha: radius scale, > 0.
        strategy: radius strategy, ``"step"`` (default), ``"constant"`` or ``"none"`` (the
            domain diagonal; not a FastLloyd configuration, accepted for ablations).
        bound: half-width B of the data domain ``[-B, B]^d`` (data units), > 0.
        iterations: number of Lloyd iterations T >= 1; defaults to
            :func:`fastlloyd_iterations` (which assumes B = 1, as the paper does).

    Returns:
        A :class:`GaussianCalibration` with ``mu() == 1 / sigma``.

    Raises:
        ValueError: on ``epsilon <= 0``, ``delta`` not in (0, 1), ``n < 2``, ``k < 1``,
            ``d < 1``, ``alpha <= 0``, ``bound <= 0``, ``iterations < 1`` or an unknown strategy.

    References:
        FastLloyd Secs. 5.1, 5.5, 5.6, Eq. 7, Eq. 21, Thm 5.1, Lemma A.1; spec fastlloyd.md
        sections 2.3 and 2.5, oracles 7.3.15 and 7.3.18.
    """
    epsilon, n, delta, sigma = _resolve_budget(epsilon, n, k, d, delta)
    _check_strategy(strategy)
    alpha = _check_positive("alpha", alpha)
    if iterations is None:
        iterations = fastlloyd_iterations(n, k, d, sigma, alpha)
    iterations = _check_int("iterations", iterations, 1)
    sigma_r, sigma_c = fastlloyd_noise_split(sigma, d)
    radii = radius_schedule(strategy, k, d, iterations, alpha, bound)
    root_t = math.sqrt(iterations)
    return GaussianCalibration(
        epsilon=epsilon,
        delta=delta,
        sigma=sigma,
        sigma_sum=sigma_r,
        sigma_count=sigma_c,
        iterations=iterations,
        radii=radii,
        std_sum=tuple(sigma_r * root_t * r for r in radii),
        std_count=sigma_c * root_t,
    )


def calibrate_glloyd(
    epsilon: float,
    n: int,
    k: int,
    d: int,
    *,
    delta: float | None = None,
    rho: float = 0.225,
    bound: float = 1.0,
    iterations: int | None = None,
) -> GaussianCalibration:
    """GLloyd's noise calibration for a total (epsilon, delta) budget.

    GLloyd releases absolute sums (L2 sensitivity ``sqrt(d) B``) and counts (sensitivity 1)
    with Gaussian noise and no radius constraint; the whole run is (epsilon, delta)-DP under
    add/remove-one adjacency. Per iteration, each of the k*d sum coordinates gets noise with
    standard deviation ``sigma_S sqrt(T) sqrt(d) B`` and each count ``sigma_C sqrt(T)``.

    Args:
        epsilon: total privacy budget over all iterations, finite and > 0.
        n: total number of points N over all clients, >= 2.
        k: number of clusters, >= 1.
        d: dimension, >= 1.
        delta: delta in (0, 1); defaults to :func:`default_delta` of n.
        rho: Su et al.'s constant, > 0.
        bound: half-width B of the data domain ``[-B, B]^d`` (data units), > 0.
        iterations: number of Lloyd iterations T >= 1; defaults to :func:`glloyd_iterations`.

    Returns:
        A :class:`GaussianCalibration` with ``radii == (sqrt(d) B,) * T`` and
        ``mu() == 1 / sigma``.

    Raises:
        ValueError: on ``epsilon <= 0``, ``delta`` not in (0, 1), ``n < 2``, ``k < 1``,
            ``d < 1``, ``rho <= 0``, ``bound <= 0`` or ``iterations < 1``.

    References:
        FastLloyd App. B.1, Eqs. 29-33; spec fastlloyd.md section 3.3, oracles 7.3.17-18.
    """
    epsilon, n, delta, sigma = _resolve_budget(epsilon, n, k, d, delta)
    rho = _check_positive("rho", rho)
    bound = _check_positive("bound", bound)
    if iterations is None:
        iterations = glloyd_iterations(n, k, d, sigma, rho)
    iterations = _check_int("iterations", iterations, 1)
    sigma_s, sigma_c = glloyd_noise_split(sigma, d, rho)
    sensitivity = math.sqrt(d) * bound
    root_t = math.sqrt(iterations)
    return GaussianCalibration(
        epsilon=epsilon,
        delta=delta,
        sigma=sigma,
        sigma_sum=sigma_s,
        sigma_count=sigma_c,
        iterations=iterations,
        radii=(sensitivity,) * iterations,
        std_sum=(sigma_s * root_t * sensitivity,) * iterations,
        std_count=sigma_c * root_t,
    )


# --------------------------------------------------------------------------------------------
# The privacy ledger of a run (the report's ``privacy`` field)

#: Mechanisms :func:`privacy_ledger` accounts, with the norm of their sensitivity and the
#: accountant that composes them.
MECHANISMS = {"gaussian": ("l2", "gdp"), "laplace": ("l1", "basic_composition")}

_GDP_COMPOSITION = (
    "Gaussian DP: a Gaussian release with sensitivity s and noise standard deviation sigma is "
    "(s/sigma)-GDP; the releases compose to sqrt(sum of mu_i^2)-GDP (Dong, Roth, Su 2019, "
    "Corollary 3.3), converted to (epsilon, delta) by the exact GDP curve (Corollary 2.13). "
    "Each release's and each round's epsilon is its own guarantee at the run's delta; they do "
    "not add up to the total"
)
_BASIC_COMPOSITION = (
    "basic sequential composition of pure-DP Laplace releases: a release with L1 sensitivity s "
    "and noise scale b is (s/b)-DP, and the run is (sum of epsilon_i)-DP "
    "(Dwork & Roth 2014, Theorem 3.16)"
)


@dataclass(frozen=True)
class Release:
    """One noisy release of a run, as the privacy ledger records it.

    The sensitivity is that of the whole released array under add/remove-one adjacency, in the
    norm its mechanism needs (L2 for Gaussian, L1 for Laplace): for FastLloyd's ``[k, d]`` sums,
    one point changes one cluster's row, so the array's sensitivity is that row's (parallel
    composition over clusters).

    Attributes:
        round_idx: 0-based round (Lloyd iteration) of the release.
        name: what is released, a snake_case name such as ``"sums"`` or ``"counts"``.
        shape: shape of the released array; every coordinate gets its own noise draw.
        mechanism: ``"gaussian"`` or ``"laplace"`` (a key of :data:`MECHANISMS`).
        sensitivity: the array's sensitivity (units of the array: data units for sums, points
            for counts), finite and >= 0.
        noise_scale: per-coordinate noise in the array's units: the standard deviation for the
            Gaussian mechanism, the scale b (density ``exp(-|z|/b) / 2b``) for Laplace; > 0.

    Raises:
        ValueError: an unknown mechanism, a negative round, a negative or non-finite
            sensitivity or a noise scale that is not a finite number > 0.
    """

    round_idx: int
    name: str
    shape: tuple[int, ...]
    mechanism: str
    sensitivity: float
    noise_scale: float

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"unknown mechanism {self.mechanism!r}; expected one of {tuple(MECHANISMS)}")
        _check_int("round_idx", self.round_idx, 0)
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        object.__setattr__(self, "sensitivity", _check_nonnegative("sensitivity", self.sensitivity))
        object.__setattr__(self, "noise_scale", _check_positive("noise_scale", self.noise_scale))

    @property
    def sensitivity_norm(self) -> str:
        """``"l2"`` (Gaussian) or ``"l1"`` (Laplace): the norm :attr:`sensitivity` is measured in."""
        return MECHANISMS[self.mechanism][0]


def _gdp_epsilon(mu: float, delta: float) -> float:
    # A release with sensitivity 0 reveals nothing: 0-GDP, which spent_epsilon does not accept.
    return 0.0 if mu == 0.0 else spent_epsilon(mu, delta)


def privacy_ledger(releases: Sequence[Release], delta: float | None = None) -> dict[str, Any]:
    """The privacy ledger of a run: every noisy release and how they compose.

    Gaussian releases are accounted in Gaussian DP (accountant ``"gdp"``): release i is
    ``mu_i = sensitivity_i / noise_scale_i``-GDP, a round is ``sqrt(sum of its mu_i^2)``-GDP and
    the run ``sqrt(sum of all mu_i^2)``-GDP (exact for Gaussian mechanisms); each of these is
    stated as the epsilon at which it is (epsilon, delta)-DP at the run's ``delta``
    (:func:`spent_epsilon`), so the per-round epsilons do not add up to the total. Laplace
    releases are accounted by basic composition (accountant ``"basic_composition"``):
    ``epsilon_i = sensitivity_i / noise_scale_i``, summed per round and over the run, delta 0.

    Args:
        releases: every noisy release of the run, in any order, all of one mechanism.
        delta: the run's delta, in (0, 1); required for Gaussian releases, ``None`` or 0 for
            Laplace ones.

    Returns:
        A JSON-ready dict (snake_case keys, numbers as Python floats and ints)::

            {"definition": str, "accountant": "gdp" | "basic_composition",
             "composition": str, "epsilon": float, "delta": float, "rounds": int,
             "gdp_mu": float (Gaussian only),
             "releases": [{"round_idx", "name", "shape", "mechanism", "sensitivity",
                           "sensitivity_norm", "noise_scale", "epsilon", "delta",
                           "gdp_mu" (Gaussian only)}, ...],        # in (round_idx, input) order
             "per_round": [{"round_idx", "epsilon", "delta", "gdp_mu" (Gaussian only)}, ...]}

        ``epsilon`` is in natural-log units; the layout is the report schema's ``privacy``.

    Raises:
        ValueError: no release, releases of more than one mechanism, a Gaussian ledger without
            a delta in (0, 1), or a Laplace ledger with a non-zero delta.

    References:
        Dong, Roth, Su 2019, "Gaussian Differential Privacy", Corollaries 2.13 and 3.3.
        Dwork & Roth 2014, "The Algorithmic Foundations of Differential Privacy", Thm 3.16.
        FastLloyd Lemma A.1; spec fastlloyd.md sections 2.3 and 3.2.
    """
    releases = sorted(releases, key=lambda r: r.round_idx)  # stable: input order within a round
    if not releases:
        raise ValueError("a privacy ledger needs at least one release")
    mechanisms = {r.mechanism for r in releases}
    if len(mechanisms) != 1:
        raise ValueError(f"a privacy ledger composes releases of one mechanism, got {sorted(mechanisms)}")
    (mechanism,) = mechanisms
    norm, accountant = MECHANISMS[mechanism]
    rounds = sorted({r.round_idx for r in releases})
    entries = []
    if accountant == "gdp":
        if delta is None:
            raise ValueError("a Gaussian privacy ledger needs the run's delta")
        delta = _check_delta(delta)
        mus = [r.sensitivity / r.noise_scale for r in releases]
        round_mu = {
            t: math.sqrt(math.fsum(mu * mu for r, mu in zip(releases, mus) if r.round_idx == t)) for t in rounds
        }
        total_mu = math.sqrt(math.fsum(mu * mu for mu in mus))
        for release, mu in zip(releases, mus):
            entries.append({"epsilon": _gdp_epsilon(mu, delta), "delta": delta, "gdp_mu": mu})
        per_round = [
            {"round_idx": t, "epsilon": _gdp_epsilon(round_mu[t], delta), "delta": delta, "gdp_mu": round_mu[t]}
            for t in rounds
        ]
        total: dict[str, Any] = {"epsilon": _gdp_epsilon(total_mu, delta), "delta": delta, "gdp_mu": total_mu}
        definition = "(epsilon, delta)-DP under add/remove-one adjacency"
        composition = _GDP_COMPOSITION
    else:
        if delta not in (None, 0.0):
            raise ValueError(f"Laplace releases are pure epsilon-DP (delta 0), got delta {delta!r}")
        epsilons = [r.sensitivity / r.noise_scale for r in releases]
        entries = [{"epsilon": e, "delta": 0.0} for e in epsilons]
        per_round = [
            {"round_idx": t, "epsilon": math.fsum(e for r, e in zip(releases, epsilons) if r.round_idx == t),
             "delta": 0.0}
            for t in rounds
        ]
        total = {"epsilon": math.fsum(epsilons), "delta": 0.0}
        definition = "epsilon-DP (pure, delta = 0) under add/remove-one adjacency"
        composition = _BASIC_COMPOSITION
    return {
        "definition": definition,
        "accountant": accountant,
        "composition": composition,
        **total,
        "rounds": len(rounds),
        "releases": [
            {
                "round_idx": r.round_idx,
                "name": r.name,
                "shape": list(r.shape),
                "mechanism": r.mechanism,
                "sensitivity": r.sensitivity,
                "sensitivity_norm": norm,
                "noise_scale": r.noise_scale,
                **entry,
            }
            for r, entry in zip(releases, entries)
        ],
        "per_round": per_round,
    }


# --------------------------------------------------------------------------------------------
# Metrics


def auc_over_epsilons(epsilons: Sequence[float], values: Sequence[float]) -> float:
    """Area under a metric-versus-epsilon curve by the trapezoidal rule.

    ``AUC = sum_i (values[i] + values[i+1]) / 2 * (epsilons[i+1] - epsilons[i])``; over the
    paper's grid ``[0.1, 0.25, 0.5, 0.75, 1.0]`` a constant metric c gives ``0.9 c``.

    Args:
        epsilons: ``[E]`` privacy budgets, strictly increasing, finite, E >= 2.
        values: ``[E]`` metric values (e.g. NICV) at those budgets, finite.

    Returns:
        The area (metric units times epsilon).

    Raises:
        ValueError: if the sequences differ in length, hold fewer than two points, contain a
            non-finite value, or the epsilons are not strictly increasing.

    References:
        FastLloyd Sec. 6 (evaluation: AUC of NICV over the epsilon grid); spec fastlloyd.md
        section 4.2, oracle 7.5.27.
    """
    eps = np.asarray(epsilons, dtype=np.float64)
    vals = np.asarray(values, dtype=np.float64)
    if eps.ndim != 1 or vals.ndim != 1 or eps.shape != vals.shape:
        raise ValueError(
            f"epsilons and values must be 1-D and of equal length, got shapes {eps.shape} and "
            f"{vals.shape}"
        )
    if eps.size < 2:
        raise ValueError("need at least two (epsilon, value) points for an area")
    if not (np.all(np.isfinite(eps)) and np.all(np.isfinite(vals))):
        raise ValueError("epsilons and values must be finite")
    widths = np.diff(eps)
    if np.any(widths <= 0.0):
        raise ValueError("epsilons must be strictly increasing")
    return float(np.sum(widths * (vals[:-1] + vals[1:]) / 2.0))

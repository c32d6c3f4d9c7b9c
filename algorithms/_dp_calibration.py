"""Calibrations of the DP-Lloyd runs: budget splits, radii, iteration heuristics and noise scales.

Part of :mod:`fedproto.algorithms.dp` (which re-exports every public name here and states the
privacy model): FastLloyd's and GLloyd's splits of the noise multiplier between sums and counts,
FastLloyd's radius schedule (the relative sums' L2 sensitivity), Su et al.'s iteration heuristics,
SuLloyd's Laplace scales, and the Gaussian runs' calibrations (:func:`calibrate_fastlloyd`,
:func:`calibrate_glloyd`) with their GDP composition (:func:`composed_mu`). Every guarantee is
(epsilon, delta)-DP (pure epsilon-DP for SuLloyd) under add/remove-one adjacency.

References:
    FastLloyd (Diaa, Humphries, Kerschbaum) Secs. 5.1, 5.5, 5.6, App. A.2, App. B.1.
    Su, Cao, Li, Bertino, Jha 2016, "Differentially private k-means clustering".
    Spec fastlloyd.md sections 2.3, 2.5, 3.2 and 3.3.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from fedproto.algorithms._dp_gdp import (
    _check_delta,
    _check_epsilon,
    _check_int,
    _check_nonnegative,
    _check_positive,
    default_delta,
    gaussian_sigma,
)

__all__ = [
    "MAX_ITERATIONS",
    "MIN_ITERATIONS",
    "STRATEGIES",
    "GaussianCalibration",
    "SuLloydParameters",
    "calibrate_fastlloyd",
    "calibrate_glloyd",
    "composed_mu",
    "fastlloyd_iterations",
    "fastlloyd_noise_split",
    "glloyd_iterations",
    "glloyd_noise_split",
    "radius_schedule",
    "steady_radius",
    "sulloyd_parameters",
]

#: Radius strategies of spec section 2.5 (paper names "Step", "Constant", "No constraint").
STRATEGIES = ("step", "constant", "none")

#: Iteration counts are clamped to this range by every heuristic (spec sections 2.3.7, 3.2, 3.3).
MIN_ITERATIONS = 2
MAX_ITERATIONS = 7

#: Per-iteration MSE target of Su et al.'s heuristic, for data in [-1, 1]^d (Eq. 21).
_MSE_TARGET = 0.004


def _check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown radius strategy {strategy!r}; expected one of {STRATEGIES}")
    return strategy


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

    @classmethod
    def split_evenly(
        cls,
        epsilon: float,
        delta: float,
        sigma: float,
        sigma_sum: float,
        sigma_count: float,
        radii: Sequence[float],
    ) -> GaussianCalibration:
        """The calibration that spends a budget evenly over ``T = len(radii)`` iterations.

        Iteration t releases the ``[k, d]`` sums with L2 sensitivity ``radii[t]`` and
        per-coordinate noise standard deviation ``sigma_sum sqrt(T) radii[t]``, and the ``[k]``
        counts (sensitivity 1) with ``sigma_count sqrt(T)``; when ``(1/sigma_sum)^2 +
        (1/sigma_count)^2 = (1/sigma)^2`` (the split of :func:`fastlloyd_noise_split` or
        :func:`glloyd_noise_split`), the T iterations compose to exactly ``(1/sigma)``-GDP, i.e.
        (epsilon, delta)-DP under add/remove-one adjacency.

        Args:
            epsilon: the run's total epsilon (natural-log units).
            delta: the run's delta, in (0, 1).
            sigma: total noise multiplier, :func:`gaussian_sigma` of (epsilon, delta).
            sigma_sum: noise multiplier of the sums, before the ``sqrt(T)`` split.
            sigma_count: noise multiplier of the counts, before the ``sqrt(T)`` split.
            radii: ``[T]`` L2 sensitivities of the sums per iteration (data units), T >= 1.

        Returns:
            The calibration, with ``iterations == T``.

        References:
            FastLloyd Sec. 5.5 and Lemma A.1 (the sqrt(T) split over iterations); spec
            fastlloyd.md section 2.3 items 4-6.
        """
        radii = tuple(radii)
        root_t = math.sqrt(len(radii))
        std_sum = tuple(sigma_sum * root_t * r for r in radii)
        return cls(epsilon, delta, sigma, sigma_sum, sigma_count, len(radii), radii, std_sum, sigma_count * root_t)

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
    return GaussianCalibration.split_evenly(epsilon, delta, sigma, sigma_r, sigma_c, radii)


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
    return GaussianCalibration.split_evenly(epsilon, delta, sigma, sigma_s, sigma_c, (sensitivity,) * iterations)

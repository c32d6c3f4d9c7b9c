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

Where each part lives (this module only gathers the public names):

* :mod:`fedproto.algorithms._dp_gdp`: the GDP curve and its inverses (:func:`gdp_delta`,
  :func:`gaussian_sigma`, :func:`spent_epsilon`), :func:`default_delta`, :func:`zcdp_rho`;
* :mod:`fedproto.algorithms._dp_calibration`: budget splits, radius schedules, iteration
  heuristics, SuLloyd's Laplace scales and the Gaussian calibrations with their composition;
* :mod:`fedproto.algorithms._dp_ledger`: :class:`Release`, :func:`privacy_ledger` and
  :func:`auc_over_epsilons`.
"""

from __future__ import annotations

from fedproto.algorithms._dp_calibration import (
    MAX_ITERATIONS,  # noqa: F401 (a public constant, outside __all__ as before the split)
    MIN_ITERATIONS,  # noqa: F401
    STRATEGIES,  # noqa: F401
    GaussianCalibration,
    SuLloydParameters,
    calibrate_fastlloyd,
    calibrate_glloyd,
    composed_mu,
    fastlloyd_iterations,
    fastlloyd_noise_split,
    glloyd_iterations,
    glloyd_noise_split,
    radius_schedule,
    steady_radius,
    sulloyd_parameters,
)
from fedproto.algorithms._dp_gdp import default_delta, gaussian_sigma, gdp_delta, spent_epsilon, zcdp_rho
from fedproto.algorithms._dp_ledger import (
    MECHANISMS,  # noqa: F401 (a public constant, outside __all__ as before the split)
    Release,
    auc_over_epsilons,
    privacy_ledger,
)

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

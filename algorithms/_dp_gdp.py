"""Gaussian DP and (epsilon, delta): the exact privacy curve, its inverses and the argument checks.

Part of :mod:`fedproto.algorithms.dp` (which re-exports every public name here and states the
privacy model): :func:`gdp_delta` is the (epsilon, delta) curve of a mu-GDP mechanism under
add/remove-one adjacency; :func:`gaussian_sigma` and :func:`spent_epsilon` invert it (Brent's
method in log space, results kept on disk by :mod:`fedproto.memo`); :func:`default_delta` is
FastLloyd's ``1 / (N ln N)`` and :func:`zcdp_rho` the zCDP view of a Gaussian mechanism. The
``_check_*`` helpers turn configuration mistakes into ``ValueError`` for every part of ``dp``.

References:
    Dong, Roth, Su 2019, "Gaussian Differential Privacy", Corollary 2.13.
    Balle & Wang 2018, "Improving the Gaussian mechanism for differential privacy", Alg. 1, Thm 8.
    FastLloyd (Diaa, Humphries, Kerschbaum) Sec. 2.3; spec fastlloyd.md section 2.3.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
from collections.abc import Callable

import numpy as np

from fedproto import memo

__all__ = [
    "default_delta",
    "gaussian_sigma",
    "gdp_delta",
    "spent_epsilon",
    "zcdp_rho",
]

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
    log_delta = math.log(delta)
    # gdp_delta grows with mu: more signal per unit of noise means a larger delta.
    return _memoized(
        "gaussian_sigma",
        (epsilon, delta),
        lambda: 1.0 / _solve_increasing(lambda m: _log_gdp_delta(m, epsilon) - log_delta, start=1.0),
    )


def _memoized(name: str, args: tuple[float, ...], solve: Callable[[], float]) -> float:
    """``solve()``, kept on disk (:mod:`fedproto.memo`) under ``name`` and the key of ``args``.

    A float found under the key is returned without solving (so without importing SciPy);
    otherwise the solved float is stored, bit for bit, for the next call.

    Args:
        name: the memo's namespace, the public function's name (``"gaussian_sigma"``).
        args: the floats the solution depends on (see :func:`_solver_key`).
        solve: computes the float when it is not kept.

    Returns:
        The float, from disk or solved.
    """
    key = _solver_key(*args)
    found = memo.lookup(name, key)
    if isinstance(found, float):
        return found
    value = solve()
    memo.store(name, key, value)
    return value


def _solver_key(*args: float) -> list:
    """What a solved curve depends on: the arguments (exactly, as hex), the solver's tolerances
    and SciPy's version (its ``log_ndtr`` and ``brentq``), read without importing SciPy."""
    return [*(float.hex(a) for a in args), float.hex(_RTOL), _MAX_BRACKET_STEPS, _scipy_version()]


@functools.cache
def _scipy_version() -> str:
    """SciPy's installed version (``"unknown"`` without it), read once a process without importing
    SciPy: the ``version = "..."`` line of the package's ``version.py`` (0.3 ms), else the
    installed distribution's metadata (about 6-8 ms: it scans every installed distribution, and
    each party process of a deployment pays it in its first handler)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("scipy")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return "unknown"
    for location in spec.submodule_search_locations or ():
        found = _assigned_string(os.path.join(location, "version.py"), "version")
        if found is not None:
            return found
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("scipy")
    except PackageNotFoundError:
        return "unknown"


def _assigned_string(path: str, name: str) -> str | None:
    """The string constant of the first top-level ``NAME = "..."`` in the Python file at ``path``
    (``None`` where the file cannot be read or parsed or has none)."""
    import ast

    try:
        with open(path, encoding="utf-8") as file:
            tree = ast.parse(file.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return node.value.value
    return None


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
    log_delta = math.log(delta)

    def solve() -> float:
        if _log_gdp_delta(mu, 0.0) <= log_delta:
            return 0.0
        # gdp_delta falls with epsilon, so solve the negated curve, which rises.
        return _solve_increasing(lambda e: log_delta - _log_gdp_delta(mu, e), start=1.0)

    return _memoized("spent_epsilon", (mu, delta), solve)


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

"""The privacy ledger of a run (the report's ``privacy`` field) and the AUC metric over epsilons.

Part of :mod:`fedproto.algorithms.dp` (which re-exports every public name here and states the
privacy model): a :class:`Release` is one noisy release with its sensitivity and noise scale;
:func:`privacy_ledger` composes a run's releases, in Gaussian DP for Gaussian releases and by
basic composition for Laplace ones, under add/remove-one adjacency.

References:
    Dong, Roth, Su 2019, "Gaussian Differential Privacy", Corollaries 2.13 and 3.3.
    Dwork & Roth 2014, "The Algorithmic Foundations of Differential Privacy", Thm 3.16.
    FastLloyd Lemma A.1 and Sec. 6; spec fastlloyd.md sections 2.3, 3.2 and 4.2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedproto.algorithms._dp_gdp import (
    _check_delta,
    _check_int,
    _check_nonnegative,
    _check_positive,
    spent_epsilon,
)

__all__ = [
    "MECHANISMS",
    "Release",
    "auc_over_epsilons",
    "privacy_ledger",
]


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

"""Bounds the (k,z)-clustering plugins give the runtime: the largest frame a party may send, the
length of the radius grid and the rounds of a run.

Every party computes the same bounds from the run's options and the pooled data's sizes (not the
machines' split), so the transports can refuse an oversized frame before reading it
(`fedproto.framesize.max_frame_bytes`) and the progress bars and time limits know the rounds.
A bound is what an honest party may send; the observed frames are usually several times smaller.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedproto.algorithms.kzclustering import messages
from fedproto.algorithms.kzclustering.config import KzCenterConfig
from fedproto.algorithms.kzclustering.means import KzMeansConfig
from fedproto.framesize import max_frame_bytes

__all__ = [
    "GRID_CAP",
    "center_frame_limit",
    "center_rounds_bound",
    "grid_size_bound",
    "means_frame_limit",
    "setup_frame_limit",
]

#: Most values :func:`~fedproto.algorithms.kzclustering.solvers.radius_grid` builds (it refuses more).
GRID_CAP = 100_001


def _geometric_count_bound(lower: float, upper: float, eps: float) -> int:
    """Most values of ``solvers.radius_grid(l, u, eps)`` for any ``l >= lower`` and ``u <= upper``
    (``ceil(log(u / l) / log(1 + eps)) + 2``, one more for the rounding of the logarithms)."""
    if not (math.isfinite(lower) and lower > 0) or not math.isfinite(upper):
        return GRID_CAP
    if upper <= lower:
        return 1
    return min(GRID_CAP, math.ceil(math.log(upper / lower) / math.log1p(eps)) + 3)


def grid_size_bound(x: np.ndarray, eps: float, *, objective: str, radius_bounds: Any = None) -> int:
    """Most radius guesses ``T`` the coordinator's grid can hold for the points ``x``, however they
    are split over the machines (so every party computes the same bound without the machines'
    extents), in ``O(n d log n)``.

    The grid spans the machines' smallest nonzero distance to the anchor bound on the diameter
    (see the protocols' ``_build_grid``). Two distinct points differ in some coordinate by at least
    ``g``, the smallest nonzero gap between the sorted values of a column, so every machine's
    smallest nonzero distance is at least ``g / 2`` (halved for the rounding of the distance
    kernel); every anchor bound is at most ``6 R``, ``R`` the largest distance to the mean.

    Args:
        x: all points ``[n, d]`` float64.
        eps: the grid ratio ``1 + eps``.
        objective: ``"center"`` (grid ``[0, g/4, ...]`` up to half the diameter) or ``"means"``
            (``eps dmin / (2 (1+eps) n)`` up to twice the diameter).
        radius_bounds: ``(A, B)`` when the grid is ``A (1+eps)^t`` up to ``B`` (no extent round).

    Returns:
        An upper bound of the grid's length (at most 100,002: the grid builder refuses longer grids).
    """
    if radius_bounds is not None:
        lo, hi = radius_bounds
        return _geometric_count_bound(float(lo), float(hi), eps)
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    if n < 2:
        return 1
    # values near the float64 limits overflow to inf here, and an infinite reach gives the cap
    with np.errstate(over="ignore", invalid="ignore"):
        gaps = np.diff(np.sort(x, axis=0), axis=0)
        positive = gaps[gaps > 0]
        if positive.size == 0:
            return 1  # every point in one place: no nonzero distance, a one-value grid
        dmin = float(positive.min()) / 2.0
        reach = 6.0 * float(np.sqrt(np.max(np.sum((x - x.mean(axis=0)) ** 2, axis=1)))) * (1.0 + 1e-9)
    if objective == "center":
        return 1 + _geometric_count_bound(dmin / 4.0, reach / 2.0, eps)
    return _geometric_count_bound(eps * dmin / (2.0 * (1.0 + eps) * n), 2.0 * reach, eps)


def setup_frame_limit(d: int) -> int:
    """The largest frame of ``setup.data`` (``--normalize minmax``): one extent ``[2, d]``."""
    arrays = {"extent": (2, d)}
    return max(
        max_frame_bytes(messages.DataSummary, arrays=arrays), max_frame_bytes(messages.FederationSummary, arrays=arrays)
    )


def center_frame_limit(config: KzCenterConfig, x: np.ndarray, largest_machine: int, *, scale: bool = False) -> int:
    """The largest frame any party of a (k,z)-center run sends (bytes, envelope included).

    The grid, the counts (two per guess) and a fetch or probe round of every guess at once
    (``--probe-batch 0``) are ``T`` long (:func:`grid_size_bound`); a fetch reply holds, for each
    fetched guess, at most ``min(n_i, count bound)`` representatives ``[d]`` with their weights (a
    machine's count above the bound fails the count test, so that guess is never fetched), ``n_i``
    at most ``largest_machine``. How many a machine sends depends on its data, so this bound can
    exceed the observed frames several times; it is what an honest machine may send. ``scale``:
    the run has the ``setup.data`` phase of ``--normalize minmax`` (:func:`setup_frame_limit`).
    """
    d, k = x.shape[1], config.k
    t = grid_size_bound(x, config.eps, objective="center", radius_bounds=config.radius_bounds)
    asked = min(config.batch, t) if config.batch else t
    reps = min(largest_machine, config.max_reps)
    return max(
        max_frame_bytes(messages.LocalExtent, arrays={"anchor": (1, d)}),
        max_frame_bytes(messages.RadiusGrid, arrays={"radii": (t,)}),
        max_frame_bytes(messages.AggregatedCounts, arrays={"counts": (t,), "discarded": (t,)}),
        max_frame_bytes(messages.RadiusGuesses, arrays={"indices": (asked,)}),
        max_frame_bytes(
            messages.WeightedPoints,
            arrays={"indices": (asked,), "sizes": (asked,), "points": (asked * reps, d), "weights": (asked * reps,)},
        ),
        max_frame_bytes(messages.RadiusProbes, arrays={"radii": (asked,)}),
        max_frame_bytes(messages.ProbeCounts, arrays={"counts": (asked,), "discarded": (asked,)}),
        max_frame_bytes(messages.RadiusFetch),
        max_frame_bytes(messages.Representatives, arrays={"points": (reps, d), "weights": (reps,)}),
        max_frame_bytes(messages.FinalCentres, arrays={"centres": (k, d)}),
        max_frame_bytes(messages.OutlierCount),
        setup_frame_limit(d) if scale else 0,
    )


def center_rounds_bound(config: KzCenterConfig, grid_size: int) -> int:
    """Algorithm rounds of a (k,z)-center run when the first fetch succeeds (for progress bars and
    the run's time limit): the extent round (without radius bounds), then the counts (``linear``,
    ``binary``) or at most ``ceil(log_{b+1} T) + 1`` probe rounds (``probe``, b guesses per
    round), a fetch, and the answer."""
    extent = 0 if config.radius_bounds else 1
    if config.search != "probe":
        return extent + 3
    b = config.batch
    probes = 1 if b == 0 or grid_size <= 1 else math.ceil(math.log(grid_size) / math.log(b + 1)) + 1
    return extent + probes + 2


def means_frame_limit(config: KzMeansConfig, x: np.ndarray, *, scale: bool = False) -> int:
    """The largest frame any party of a (k,z)-median/means run sends (bytes, envelope included).

    The grid, costs and totals are ``T`` long (:func:`grid_size_bound`; 1 in ``bel`` mode); a
    machine's coresets hold, per guess, at most ``t`` samples (its share of the ``t`` samples
    per radius) and its at most ``k`` local centres ``[d]`` with their weights, ``t`` being
    ``--samples`` or the coordinator's ``max(10 k, n / (10 T))``. A machine's share of the
    samples depends on its data, and the bound on ``T`` on the smallest gap between coordinates,
    so this bound can exceed the observed frames several times; it is what an honest machine
    may send. ``scale``: the run has the ``setup.data`` phase (:func:`setup_frame_limit`).
    """
    (n, d), k = x.shape, config.k
    if config.mode == "bel":
        t = 1
    else:
        t = grid_size_bound(x, config.eps, objective="means", radius_bounds=config.radius_bounds)
    if config.samples is not None:
        rows = t * (config.samples + k)
    else:  # T' (max(10 k, n // (10 T')) + k) <= T (11 k) + n // 10 for the grid's true length T' <= T
        rows = t * 11 * k + n // 10
    return max(
        max_frame_bytes(messages.LocalExtent, arrays={"anchor": (1, d)}),
        max_frame_bytes(messages.RadiusGrid, arrays={"radii": (t,)}),
        max_frame_bytes(messages.LocalCosts, arrays={"costs": (t,)}),
        max_frame_bytes(messages.CostTotals, arrays={"totals": (t,)}),
        max_frame_bytes(messages.Coresets, arrays={"sizes": (t,), "points": (rows, d), "weights": (rows,)}),
        max_frame_bytes(messages.FinalCentres, arrays={"centres": (k, d)}),
        max_frame_bytes(messages.OutlierCount),
        setup_frame_limit(d) if scale else 0,
    )

"""Greedy covers (Guo & Li, Algorithm 1; Charikar et al.): the coordinator's side of (k,z)-center.

:func:`greedy_cover` and :func:`kzc` (the (2, 4) covers of Algorithm 1, and Charikar's (1, 3)),
the exact radius search over the covers' breakpoints (:func:`cover_breakpoints`,
:func:`smallest_cover_radius`), Gonzalez's :func:`farthest_first`, :func:`pad_centres` and the
(k,z)-center cost :func:`center_cost`. Conventions (closed balls, breakpoints rounded up,
integer weights, fractional budgets) as in :mod:`fedproto.algorithms.kzclustering.solvers`.

References:
    Guo & Li, NeurIPS 2018 (arXiv 1810.07852), Algorithm 1 and Section 2; spec kz-clustering.md
    2.3 and 2.5. Charikar, Khuller, Mount, Narasimhan, SODA 2001. Gonzalez, TCS 38, 1985.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from fedproto.algorithms.kzclustering import _kernels
from fedproto.algorithms.kzclustering.solvers_shared import _BLOCK_ROWS

__all__ = [
    "Cover",
    "center_cost",
    "cover_breakpoints",
    "farthest_first",
    "greedy_cover",
    "kzc",
    "pad_centres",
    "smallest_cover_radius",
]


# --- greedy covers (Algorithm 1 and Charikar et al.) --------------------------------------------


@dataclasses.dataclass(frozen=True)
class Cover:
    """The result of a greedy cover.

    Attributes:
        centres: indices of the chosen centres, int64 ``[c]``, ``c <= k`` (fewer when every point
            was covered early; see `pad_centres`).
        uncovered: total weight of the points left in U.
        covered: bool ``[n]``, the points removed from U.
        radius: the radius L' the cover was built with.
        ok: ``uncovered <= budget`` (the procedure's "yes").
    """

    centres: np.ndarray
    uncovered: float
    covered: np.ndarray
    radius: float
    ok: bool


def greedy_cover(
    dist: np.ndarray,
    weights: np.ndarray,
    k: int,
    budget: float,
    radius: float,
    *,
    grow: float,
    expand: float,
) -> Cover:
    """Charikar-style greedy: k times take the densest ``grow * r`` ball, remove the ``expand * r`` ball.

    p ranges over all points (not only the uncovered ones) and maximises the uncovered weight
    within ``grow * r``; ties go to the smallest index. The loop stops early when U is empty.

    Args:
        dist: pairwise distances ``[n, n]`` float64.
        weights: positive weights ``[n]`` (int64 multiplicities, or ones).
        k: number of centres, ``>= 1``.
        budget: outlier weight allowed to stay uncovered (may be fractional).
        radius: r, ``>= 0``.
        grow: densest-ball factor G (Charikar 1, kzc 2, MKCWM 5).
        expand: removal factor E (Charikar 3, kzc 4, MKCWM 11).

    Returns:
        The :class:`Cover`; ``ok`` iff the uncovered weight is ``<= budget``.

    References:
        Charikar et al. 2001; Guo & Li, Algorithm 1; Malkomes et al. 2015 (the (5, 11) variant).
    """
    dist = np.asarray(dist, dtype=np.float64)
    weights = np.asarray(weights)
    n = dist.shape[0]
    if k < 1:
        raise ValueError("k must be at least 1")
    if weights.shape != (n,):
        raise ValueError(f"weights must have shape [{n}], got {weights.shape}")
    inner_radius = grow * radius
    outer_radius = expand * radius
    # integer weights: blocks of rows through BLAS in float32 (float64 when the total weight
    # reaches 2^24), exact because every partial sum is an integer the type represents, and
    # without an n x n integer copy of the ball matrix; other weights: the plain products
    mass = float(np.abs(weights).sum()) if n else 0.0
    exact_blocks = weights.dtype.kind in "iub" and n and mass < 2.0**53
    inner = None if exact_blocks else dist <= inner_radius
    block_type = np.float32 if mass < 2.0**24 else np.float64  # every partial sum an exact integer

    def ball_weights(rows: np.ndarray) -> np.ndarray:
        """``sum_{i in rows} w_i [d(i, p) <= G r]`` for every p (the ball matrix is symmetric)."""
        if inner is not None:
            return weights[rows] @ inner[rows]
        total = np.zeros(n, dtype=np.float64)
        w = weights.astype(block_type)
        for r0 in range(0, rows.shape[0], _BLOCK_ROWS):
            block = rows[r0 : r0 + _BLOCK_ROWS]
            total += w[block] @ (dist[block] <= inner_radius).astype(block_type)
        return total.astype(weights.dtype)

    alive = np.ones(n, dtype=bool)
    score = ball_weights(np.arange(n)) if n else np.zeros(0, dtype=weights.dtype)
    centres: list[int] = []
    for _ in range(k):
        if not alive.any():
            break
        p = int(np.argmax(score))
        centres.append(p)
        removed = np.flatnonzero(alive & (dist[p] <= outer_radius))
        alive[removed] = False
        score = score - ball_weights(removed)
    uncovered = weights[alive].sum().item() if n else 0
    return Cover(
        centres=np.asarray(centres, dtype=np.int64),
        uncovered=uncovered,
        covered=~alive,
        radius=float(radius),
        ok=bool(uncovered <= budget),
    )


def kzc(dist: np.ndarray, weights: np.ndarray, k: int, budget: float, radius: float) -> Cover:
    """kzc(k, z', (Q, w'), L'): the coordinator's solver, radii ``2L'`` (densest) and ``4L'`` (removal).

    If some k centres from any superset of Q have weighted (k, z')-cost ``<= L'`` on (Q, w'), the
    result is ``ok`` (Theorem 2.1); if it is ``ok``, every covered point is within ``4L'`` of a
    centre and the uncovered weight is ``<= z'``.

    Args:
        dist: pairwise distances of Q ``[q, q]`` float64.
        weights: positive weights w' ``[q]``.
        k: number of centres.
        budget: z' (may be fractional).
        radius: L'.

    Returns:
        The :class:`Cover` (``ok`` is the procedure's "yes", not-``ok`` its "No").

    References:
        Guo & Li, Algorithm 1 and Theorem 2.1; spec section 2.1.
    """
    return greedy_cover(dist, weights, k, budget, radius, grow=2.0, expand=4.0)


def _round_up_quotients(values: np.ndarray, divisor: float) -> np.ndarray:
    """``values / divisor``, nudged up by one ulp where ``divisor * q < value`` in floating point."""
    q = values / divisor
    low = divisor * q < values
    q[low] = np.nextafter(q[low], np.inf)
    return q


def cover_breakpoints(dist: np.ndarray, *, grow: float, expand: float) -> np.ndarray:
    """Every radius at which a greedy cover with factors (G, E) can change its outcome.

    The cover compares each distance v with ``G r`` and ``E r``; its outcome is constant on the
    intervals between consecutive values of ``{0} + {v/G} + {v/E}`` (closed on the left), so
    searching these values is exact.

    Args:
        dist: pairwise distances ``[n, n]`` float64.
        grow: G.
        expand: E.

    Returns:
        Sorted unique radii, float64, starting with 0.
    """
    dist = np.asarray(dist, dtype=np.float64)
    values = np.unique(dist[np.triu_indices(dist.shape[0], k=1)]) if dist.shape[0] > 1 else np.zeros(0)
    values = values[values > 0]
    return np.unique(
        np.concatenate([[0.0], _round_up_quotients(values, grow), _round_up_quotients(values, expand)])
    )


def smallest_cover_radius(
    dist: np.ndarray,
    weights: np.ndarray,
    k: int,
    budget: float,
    *,
    grow: float,
    expand: float,
    upper: float | None = None,
) -> Cover | None:
    """Binary search for the smallest successful radius of a greedy cover, over its exact breakpoints.

    Success is not monotone in r for greedy covers, so the search keeps the invariant "lo fails,
    hi succeeds" (lo starts at a virtual failing sentinel below 0, hi at the largest candidate).
    The result hi is then at most the first breakpoint from which some k centres have cost ``<= r``
    (for kzc: ``hi <= L'*``, the best cost of any k centres from a superset of Q, because every
    ``r >= L'*`` succeeds by Theorem 2.1).

    Args:
        dist: pairwise distances ``[n, n]`` float64.
        weights: positive weights ``[n]``.
        k: number of centres.
        budget: outlier weight allowed.
        grow: G.
        expand: E.
        upper: only radii ``<= upper`` are tried, and ``upper`` itself is the first candidate; with
            ``None`` the largest candidate is ``max(dist) / G``, which always succeeds (its first
            ball holds every point).

    Returns:
        The :class:`Cover` at the found radius, or ``None`` if the top candidate fails.

    References:
        Spec section 2.5 (lo-fails/hi-passes search) and the coordinator refinement; Charikar et
        al. 2001 (exact radius search over pairwise distances).
    """
    dist = np.asarray(dist, dtype=np.float64)
    if upper is not None and not upper >= 0:
        raise ValueError(f"upper must be >= 0, got {upper}")

    def cover_at(r: float) -> Cover:
        return greedy_cover(dist, weights, k, budget, r, grow=grow, expand=expand)

    if dist.shape[0] <= _FULL_BREAKPOINTS:
        candidates = cover_breakpoints(dist, grow=grow, expand=expand)
        if upper is not None:
            candidates = np.append(candidates[candidates < upper], upper)
        best = cover_at(float(candidates[-1]))
        return _bisect_covers(candidates, -1, best, cover_at) if best.ok else None
    # large inputs: the same lo-fails/hi-succeeds search, first over a sample of the breakpoints,
    # then over every breakpoint between the two sampled ones it ends at (never all n^2 of them)
    if upper is None:
        vmax = max((float(dist[r0 : r0 + _BLOCK_ROWS].max()) for r0 in range(0, dist.shape[0], _BLOCK_ROWS)))
        top = float(max(_round_up_quotients(np.array([vmax]), grow)[0], _round_up_quotients(np.array([vmax]), expand)[0]))
    else:
        top = float(upper)
    best = cover_at(top)
    if not best.ok:
        return None
    sample = _breakpoints_between(dist, -math.inf, top, grow, expand, stride=max(1, dist.shape[0] // 256))
    if sample.shape[0] > _SAMPLE_BREAKPOINTS:
        sample = sample[np.linspace(0, sample.shape[0] - 1, _SAMPLE_BREAKPOINTS).astype(np.int64)]
    coarse = np.append(sample, top)
    lo, best, hi_value = _bisect_covers_with_bounds(coarse, -1, best, cover_at)
    lo_value = float(coarse[lo]) if lo >= 0 else -math.inf
    fine = np.append(_breakpoints_between(dist, lo_value, hi_value, grow, expand), hi_value)
    return _bisect_covers(fine, -1, best, cover_at)


_FULL_BREAKPOINTS = 2048
"""Up to this many points `smallest_cover_radius` lists every breakpoint (the plain search)."""
_SAMPLE_BREAKPOINTS = 1 << 15


def _bisect_covers_with_bounds(candidates, lo, best, cover_at):
    """lo-fails/hi-succeeds bisection over sorted ``candidates`` (the last one succeeds, with
    cover ``best``); returns ``(lo index, cover at hi, hi value)`` with ``hi = lo + 1``."""
    hi = candidates.shape[0] - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        cover = cover_at(float(candidates[mid]))
        if cover.ok:
            hi, best = mid, cover
        else:
            lo = mid
    return lo, best, float(candidates[hi])


def _bisect_covers(candidates, lo, best, cover_at) -> Cover:
    return _bisect_covers_with_bounds(candidates, lo, best, cover_at)[1]


def _breakpoints_between(dist, low, high, grow, expand, *, stride: int = 1) -> np.ndarray:
    """The breakpoints ``{0} + {v/G} + {v/E}`` (as in `cover_breakpoints`) strictly between ``low``
    and ``high``, sorted and unique, from the rows ``0, stride, 2 stride, ...`` of the upper
    triangle (``stride = 1``: all of them), scanned in blocks of rows."""
    n = dist.shape[0]
    found = [np.zeros(1)] if low < 0.0 < high else []
    rows = np.arange(0, n, stride)
    # distances whose quotients can fall in (low, high): a prefilter with room for the rounding
    v_low = max(low * min(grow, expand) * (1.0 - 1e-12), 0.0) if low > 0 else 0.0
    v_high = high * max(grow, expand) * (1.0 + 1e-12)
    for r0 in range(0, rows.shape[0], _BLOCK_ROWS):
        block = rows[r0 : r0 + _BLOCK_ROWS]
        part = dist[block]
        keep = (part > v_low) & (part < v_high) & (np.arange(n)[None, :] > block[:, None])  # upper triangle
        values = np.unique(part[keep])
        for factor in (grow, expand):
            q = _round_up_quotients(values, factor)
            found.append(q[(q > low) & (q < high)])
    return np.unique(np.concatenate(found)) if found else np.zeros(0)


# --- farthest-first and padding -----------------------------------------------------------------


def farthest_first(x: np.ndarray, count: int, *, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Gonzalez's farthest-first traversal.

    Start from point ``start``; repeatedly add the point farthest from the chosen ones (smallest
    index on ties). Stops early once every point is at distance 0 (fewer distinct points than
    ``count``).

    Args:
        x: points ``[n, d]`` float64, ``n >= 1``.
        count: how many points to choose, ``>= 1``.
        start: index of the first point.

    Returns:
        ``(indices, radii)``: int64 ``[c]`` and float64 ``[c]``, where ``radii[j]`` is the distance
        of the j-th chosen point to the earlier ones (``radii[0] = inf``), i.e. the covering radius
        of the first j centres; non-increasing after index 0.

    References:
        Gonzalez 1985 (2-approximation of k-center); spec section 4 items 1, 5, 6.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    if n == 0:
        raise ValueError("farthest_first needs at least one point")
    if count < 1:
        raise ValueError("count must be at least 1")
    chosen = [int(start)]
    radii = [math.inf]
    nearest = _kernels.pairwise_distances(x, x[start : start + 1])[:, 0]
    while len(chosen) < min(count, n):
        p = int(np.argmax(nearest))
        if nearest[p] <= 0:
            break
        chosen.append(p)
        radii.append(float(nearest[p]))
        nearest = np.minimum(nearest, _kernels.pairwise_distances(x, x[p : p + 1])[:, 0])
    return np.asarray(chosen, dtype=np.int64), np.asarray(radii, dtype=np.float64)


def pad_centres(x: np.ndarray, chosen: np.ndarray, k: int) -> np.ndarray:
    """Extend ``chosen`` to k indices by farthest-first over ``x`` (fewer if x has fewer distinct points).

    Args:
        x: points ``[n, d]``.
        chosen: indices already chosen, int64 ``[c]``.
        k: target size.

    Returns:
        int64 ``[min(k, ...)]`` starting with ``chosen``.

    References:
        Guo & Li, Algorithm 1 notes ("pad C' with arbitrary points"); spec 2.1 and section 4 item 2.
    """
    chosen = [int(c) for c in np.asarray(chosen, dtype=np.int64)]
    x = np.asarray(x, dtype=np.float64)
    if x.shape[0] == 0 or len(chosen) >= k:
        return np.asarray(chosen[:k] if len(chosen) > k else chosen, dtype=np.int64)
    if chosen:
        nearest = np.min(_kernels.pairwise_distances(x, x[chosen]), axis=1)
    else:
        chosen = [0]
        nearest = _kernels.pairwise_distances(x, x[:1])[:, 0]
    while len(chosen) < k:
        p = int(np.argmax(nearest))
        if nearest[p] <= 0:
            break
        chosen.append(p)
        nearest = np.minimum(nearest, _kernels.pairwise_distances(x, x[p : p + 1])[:, 0])
    return np.asarray(chosen, dtype=np.int64)


# --- costs ------------------------------------------------------------------------------------


def center_cost(dist: np.ndarray, z: float) -> float:
    """(k,z)-center cost of a centre set, given each point's distance to it.

    The ``(n - z)``-th smallest distance (0-based index ``n - z - 1`` after an ascending sort), i.e.
    the radius after dropping the z farthest points; 0 when ``z >= n``. A fractional z is floored.

    Args:
        dist: ``d(p, C)`` for every point ``[n]`` float64.
        z: number of outliers, ``>= 0``.

    Returns:
        The cost (``inf`` if a kept point has no centre).

    References:
        Spec section 1.1 and oracle 1.
    """
    dist = np.asarray(dist, dtype=np.float64).ravel()
    if z < 0:
        raise ValueError("z must be >= 0")
    keep = dist.shape[0] - int(math.floor(z))
    if keep <= 0:
        return 0.0
    return float(np.partition(dist, keep - 1)[keep - 1])



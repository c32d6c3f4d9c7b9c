"""Sequential solvers of (k,z)-center: aggregation, greedy covers, radius searches, costs.

Everything here is a pure function of arrays (NumPy, float64 distances, int64 weights), with
deterministic tie-breaks (the smallest index wins) and no randomness. The procedures are greedy
loops whose steps depend on each other; they keep per-point counts up to date incrementally (when
a set S of points is removed, subtract the rows of S of the ball adjacency), which costs O(n^2)
per call in total, instead of one O(n^2) matrix-vector product per step (see
:mod:`fedproto.algorithms.kzclustering._kernels` for the dense, jitted parts).

Conventions (spec kz-clustering.md, section 1.1):

* balls are closed: ``ball_S(p, r) = {q in S : d(p, q) <= r}``;
* radii are compared with *distances* (not squared distances), and every radius the searches try
  is a breakpoint ``v / g`` rounded up so that ``g * (v / g) >= v`` holds in floating point: the
  pair at distance ``v`` is then inside the ball at its own breakpoint, which keeps the exact
  searches exact;
* weights are positive integers (multiplicities); outlier budgets may be fractional.

References:
    Guo & Li, "Distributed k-Clustering for Data with Heavy Noise", NeurIPS 2018 (arXiv
    1810.07852), Algorithms 1 and 2, Section 2 and Appendix B.
    Charikar, Khuller, Mount, Narasimhan, "Algorithms for facility location problems with
    outliers", SODA 2001.
    Gonzalez, "Clustering to minimize the maximum intercluster distance", TCS 38, 1985.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from fedproto.algorithms.kzclustering import _kernels

__all__ = [
    "Aggregation",
    "Cover",
    "aggregate",
    "center_cost",
    "cover_breakpoints",
    "farthest_first",
    "greedy_cover",
    "kzc",
    "pad_centres",
    "radius_grid",
    "smallest_cover_radius",
]

CANDIDATES = ("all", "uncovered")
"""Where `aggregate` may take a representative from: all of Q (the paper) or only U."""


def radius_grid(lower: float, upper: float, eps: float) -> np.ndarray:
    """The geometric grid ``lower * (1+eps)^t``, ``t = 0, 1, ...``, up to the first value ``>= upper``.

    Each value is computed as a power (not a running product), so grids built by different parties
    from the same arguments are bit-identical.

    Args:
        lower: first value, ``> 0``.
        upper: the grid ends at the first value ``>= upper``.
        eps: ratio ``1 + eps`` between neighbours, ``eps > 0``.

    Returns:
        float64 ``[T]``, ``T >= 1``, strictly increasing.

    Raises:
        ValueError: a non-positive or non-finite ``lower``, ``eps <= 0``, or more than 100,000
            values (an aspect ratio beyond what any run can afford).

    References:
        Guo & Li, Section 2.2 and Appendix B; spec section 2.4.
    """
    if not (math.isfinite(lower) and lower > 0):
        raise ValueError(f"lower must be positive and finite, got {lower}")
    if not (math.isfinite(upper)):
        raise ValueError(f"upper must be finite, got {upper}")
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")
    if upper <= lower:
        return np.array([lower], dtype=np.float64)
    count = int(math.ceil(math.log(upper / lower) / math.log1p(eps))) + 1
    if count > 100_000:
        raise ValueError(f"a grid from {lower:g} to {upper:g} with ratio 1+{eps:g} has {count} values")
    values = lower * (1.0 + eps) ** np.arange(count + 1, dtype=np.float64)
    last = int(np.searchsorted(values, upper, side="left"))  # first index with value >= upper
    return values[: last + 1]


# --- aggregation (Algorithm 2) -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Aggregation:
    """The result of `aggregate` on one machine for one radius.

    Attributes:
        reps: indices of the representatives Q' in the machine's points, int64 ``[r]``, in the
            order they were chosen.
        weights: multiplicities w' (points absorbed by each representative), int64 ``[r]``, each
            ``>= 1``.
        owner: for each point, the position in ``reps`` of the representative that absorbed it,
            or -1 if it was discarded (it stayed in U), int64 ``[n]``.
        discarded: ``|U|``, the number of discarded points.
        overflow: the loop stopped because ``max_reps`` representatives were reached and another
            one qualified; ``reps`` is then a prefix and ``discarded`` an upper bound.
    """

    reps: np.ndarray
    weights: np.ndarray
    owner: np.ndarray
    discarded: int
    overflow: bool

    @property
    def count(self) -> int:
        """``|Q'|`` as the machine reports it: ``len(reps)``, plus one on overflow."""
        return int(self.reps.shape[0]) + int(self.overflow)


def aggregate(
    dist: np.ndarray,
    radius: float,
    threshold: float,
    *,
    max_reps: int | None = None,
    candidates: str = "all",
) -> Aggregation:
    """Aggregating(Q, L, y): absorb dense balls into weighted representatives.

    While some candidate p has ``|ball_U(p, 2L)| > y`` (strict, as in the pseudo-code), take the
    one with the largest such ball (smallest index on ties), give it weight
    ``|ball_U(p, 4L)|`` and remove that ball from U. The absorbed balls are disjoint, so
    ``sum(weights) + discarded == n``.

    Args:
        dist: pairwise distances of the machine's points ``[n, n]`` float64 (symmetric).
        radius: the guess L, ``>= 0``.
        threshold: y = eps z / (k m), ``>= 0``. With y = 0 every point is absorbed.
        max_reps: stop once this many representatives exist and another one qualifies (the
            coordinator would reject this L anyway, spec 2.2); ``None`` for no limit.
        candidates: ``"all"``: p ranges over all of Q (Algorithm 2); ``"uncovered"``: only over U
            (sound: Lemma 2.7 needs property 3 only for p in U; spec 2.2).

    Returns:
        The :class:`Aggregation`.

    Raises:
        ValueError: a negative radius or threshold, a non-square ``dist``, or an unknown
            ``candidates``.

    References:
        Guo & Li, Algorithm 2 (Section 2.1), Claim 2.2, Lemma 2.3; spec section 2.2.
    """
    dist = np.asarray(dist, dtype=np.float64)
    if dist.ndim != 2 or dist.shape[0] != dist.shape[1]:
        raise ValueError(f"dist must be a square matrix, got shape {dist.shape}")
    if not radius >= 0 or not threshold >= 0:
        raise ValueError(f"radius and threshold must be >= 0, got {radius} and {threshold}")
    if candidates not in CANDIDATES:
        raise ValueError(f"candidates must be one of {CANDIDATES}, got {candidates!r}")
    n = dist.shape[0]
    inner = dist <= 2.0 * radius
    outer_radius = 4.0 * radius
    alive = np.ones(n, dtype=bool)
    count = inner.sum(axis=0).astype(np.int64)  # |ball_U(p, 2L)| with U = Q
    owner = np.full(n, -1, dtype=np.int64)
    reps: list[int] = []
    weights: list[int] = []
    overflow = False
    only_uncovered = candidates == "uncovered"
    while n:
        score = np.where(alive, count, -1) if only_uncovered else count
        p = int(np.argmax(score))
        if not score[p] > threshold:
            break
        if max_reps is not None and len(reps) >= max_reps:
            overflow = True
            break
        absorbed = np.flatnonzero(alive & (dist[p] <= outer_radius))
        owner[absorbed] = len(reps)
        reps.append(p)
        weights.append(int(absorbed.shape[0]))
        alive[absorbed] = False
        count -= inner[absorbed].sum(axis=0)
    return Aggregation(
        reps=np.asarray(reps, dtype=np.int64),
        weights=np.asarray(weights, dtype=np.int64),
        owner=owner,
        discarded=int(alive.sum()),
        overflow=overflow,
    )


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
    inner = dist <= grow * radius
    outer_radius = expand * radius
    alive = np.ones(n, dtype=bool)
    score = weights @ inner if n else np.zeros(0, dtype=weights.dtype)  # symmetric: column sums
    centres: list[int] = []
    for _ in range(k):
        if not alive.any():
            break
        p = int(np.argmax(score))
        centres.append(p)
        removed = np.flatnonzero(alive & (dist[p] <= outer_radius))
        alive[removed] = False
        score = score - weights[removed] @ inner[removed]
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
    candidates = cover_breakpoints(dist, grow=grow, expand=expand)
    if upper is not None:
        if not upper >= 0:
            raise ValueError(f"upper must be >= 0, got {upper}")
        candidates = candidates[candidates < upper]
        candidates = np.append(candidates, upper)
    best = greedy_cover(dist, weights, k, budget, float(candidates[-1]), grow=grow, expand=expand)
    if not best.ok:
        return None
    lo, hi = -1, candidates.shape[0] - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        cover = greedy_cover(dist, weights, k, budget, float(candidates[mid]), grow=grow, expand=expand)
        if cover.ok:
            hi, best = mid, cover
        else:
            lo = mid
    return best


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


# --- (k,z)-median and (k,z)-means (Appendix C) ---------------------------------------------------


def trimmed_cost(dist: np.ndarray, z: float, power: int) -> float:
    """Fractional outlier cost ``cost_z(C)``: the greedy optimum of ``min sum_p w_p d^l`` over
    ``w in [0, 1]^n`` with ``sum w = n - z``.

    The ``n - ceil(z)`` closest points get weight 1, the next one ``ceil(z) - z``, the rest 0.

    Args:
        dist: ``d(p, C)`` ``[n]`` float64.
        z: outliers, ``0 <= z`` (``z >= n`` gives 0).
        power: l = 1 (median) or 2 (means).

    Returns:
        The cost.

    References:
        Guo & Li, Appendix C, Lemma C.1 (greedy form); spec section 3.2.
    """
    dist = np.sort(np.asarray(dist, dtype=np.float64).ravel())
    n = dist.shape[0]
    if z < 0:
        raise ValueError("z must be >= 0")
    if z >= n:
        return 0.0
    full = n - int(math.ceil(z))
    cost = float(np.sum(dist[:full] ** power))
    frac = math.ceil(z) - z
    if frac > 0 and full < n:
        cost += frac * float(dist[full] ** power)
    return cost


def sup_cost(dist: np.ndarray, z: float, power: int, radii: np.ndarray | None = None) -> tuple[float, float]:
    """``sup_L [ sum_p min(d_p, L)^l - z L^l ]`` and the L attaining it.

    With ``radii = None`` the sup runs over 0 and every distance (where it is attained, Lemma C.1);
    with a grid it is ``cost'_z`` of Lemma C.2.

    Args:
        dist: ``d(p, C)`` ``[n]`` float64.
        z: outliers (real).
        power: l.
        radii: the L values to try, or ``None``.

    Returns:
        ``(value, argmax L)``.

    References:
        Guo & Li, Lemmas C.1 and C.2; spec section 3.2, oracles 2 and 3.
    """
    dist = np.asarray(dist, dtype=np.float64).ravel()
    radii = np.unique(np.concatenate([[0.0], dist])) if radii is None else np.asarray(radii, dtype=np.float64)
    values = _kernels.truncated_cost_curve(dist, np.ones_like(dist), radii, power) - z * radii**power
    best = int(np.argmax(values))
    return float(values[best]), float(radii[best])


def weighted_sample(draws: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """Indices drawn with probability proportional to ``mass`` (inverse CDF of ``draws`` in [0, 1)).

    Points of zero mass are never drawn. ``mass`` must have a positive sum.
    """
    cumulative = np.cumsum(np.asarray(mass, dtype=np.float64))
    idx = np.searchsorted(cumulative, np.asarray(draws) * cumulative[-1], side="right")
    return np.minimum(idx, cumulative.shape[0] - 1)


def kmeanspp_seeding(draws: np.ndarray, x: np.ndarray, k: int, *, weights: np.ndarray | None = None,
                     power: int = 2) -> np.ndarray:
    """k-means++ (D^l) seeding; the first centre with probability proportional to the weight.

    Args:
        draws: ``k`` uniforms in [0, 1) (one per centre; from a ``jax.random`` key).
        x: points ``[n, d]``, ``n >= 1``.
        k: centres.
        weights: non-negative weights ``[n]`` (default ones; use |w| for signed coreset weights).
        power: the exponent of the sampling distance (2 = k-means++).

    Returns:
        int64 indices ``[<= k]`` (stops when every remaining point has zero mass).

    References:
        Arthur & Vassilvitskii, "k-means++", SODA 2007.
    """
    x = np.asarray(x, dtype=np.float64)
    w = np.ones(x.shape[0]) if weights is None else np.abs(np.asarray(weights, dtype=np.float64))
    if x.shape[0] == 0 or k < 1:
        return np.zeros(0, dtype=np.int64)
    if not w.sum() > 0:
        w = np.ones(x.shape[0])
    chosen = [int(weighted_sample(draws[:1], w)[0])]
    nearest = _kernels.pairwise_distances(x, x[chosen])[:, 0]
    for j in range(1, k):
        mass = w * nearest**power
        if not mass.sum() > 0:
            break
        p = int(weighted_sample(draws[j : j + 1], mass)[0])
        chosen.append(p)
        nearest = np.minimum(nearest, _kernels.pairwise_distances(x, x[p : p + 1])[:, 0])
    return np.asarray(chosen, dtype=np.int64)


def weighted_lloyd(x: np.ndarray, weights: np.ndarray, centres: np.ndarray, iterations: int, *,
                   tol: float = 0.0) -> np.ndarray:
    """Weighted Lloyd iterations; a cluster of non-positive total weight keeps its centre.

    Args:
        x: points ``[n, d]``.
        weights: real weights ``[n]`` (coreset weights may be negative).
        centres: initial centres ``[c, d]``.
        iterations: at most this many updates.
        tol: stop when no centre moves more than this.

    Returns:
        Centres ``[c, d]`` float64.
    """
    centres = np.array(centres, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if centres.shape[0] == 0 or x.shape[0] == 0:
        return centres
    for _ in range(iterations):
        _, labels = _kernels.nearest_centres(x, centres)
        mass = np.bincount(labels, weights=w, minlength=centres.shape[0])
        sums = np.zeros_like(centres)
        np.add.at(sums, labels, w[:, None] * x)
        new = np.where(mass[:, None] > 0, sums / np.where(mass > 0, mass, 1.0)[:, None], centres)
        moved = float(np.max(np.linalg.norm(new - centres, axis=1)))
        centres = new
        if moved <= tol:
            break
    return centres


def kmeans_minus_minus(draws: np.ndarray, x: np.ndarray, k: int, z: int, *, iterations: int = 300,
                       tol: float = 1e-3) -> np.ndarray:
    """k-means-- (Chawla & Gionis): Lloyd, leaving the z farthest points out of every update.

    Args:
        draws: ``>= x.shape[0]`` uniforms in [0, 1): the random initial centres are the k points
            with the smallest draws.
        x: points ``[n, d]``.
        k: centres.
        z: outliers left out per iteration (by count).
        iterations: at most 300 (spec section 4 item 8).
        tol: stop when every centre moves less than this.

    Returns:
        Centres ``[min(k, n), d]`` float64.

    References:
        Chawla & Gionis, "k-means--: A unified approach to clustering and outlier detection",
        SDM 2013; spec section 4 item 8.
    """
    x = np.asarray(x, dtype=np.float64)
    centres = x[np.argsort(np.asarray(draws)[: x.shape[0]], kind="stable")[:k]].copy()
    keep_count = max(x.shape[0] - int(z), 0)
    for _ in range(iterations):
        dist, labels = _kernels.nearest_centres(x, centres)
        keep = np.argsort(dist, kind="stable")[:keep_count]
        w = np.zeros(x.shape[0])
        w[keep] = 1.0
        new = weighted_lloyd(x, w, centres, 1)
        moved = float(np.max(np.linalg.norm(new - centres, axis=1))) if centres.size else 0.0
        centres = new
        if moved < tol:
            break
    return centres


def bel_coreset(draws: np.ndarray, x: np.ndarray, centres: np.ndarray, radius: float,
                power: int) -> tuple[np.ndarray, np.ndarray]:
    """One machine's part of a Balcan-Ehrlich-Liang coreset for the truncated cost ``min(d, L)^l``.

    Samples ``len(draws)`` points i.i.d. with probability ``m(p) / c``, ``m(p) = min(d(p, B), L)^l``,
    ``c = sum m``; a sample q gets weight ``c / (t m(q))``; each local centre b gets
    ``|P_b| - sum of the weights of the samples in P_b`` (may be negative). The weights sum to
    ``n_i`` exactly (up to rounding), and ``sum_q w_q f(q)`` is an unbiased estimate of
    ``sum_p f(p)`` for every f (BEL's importance sampling).

    Args:
        draws: ``[t]`` uniforms in [0, 1) (one per sample).
        x: local points ``[n_i, d]``.
        centres: the local solution B_i ``[c, d]`` (``c >= 1`` when ``n_i >= 1``).
        radius: the truncation L (``inf`` for plain BEL).
        power: l.

    Returns:
        ``(points, weights)``: ``[t' + c, d]`` (samples, then the centres; ``t' = 0`` when every
        point sits on a centre) and float64 ``[t' + c]``.

    References:
        Balcan, Ehrlich, Liang, "Distributed k-means and k-median clustering on general
        topologies", NIPS 2013 (Algorithm 1); Guo & Li, Appendix C.3; spec section 3.3, oracle 26.
    """
    x = np.asarray(x, dtype=np.float64)
    centres = np.asarray(centres, dtype=np.float64)
    if x.shape[0] == 0:
        return np.zeros((0, x.shape[1])), np.zeros(0)
    dist, labels = _kernels.nearest_centres(x, centres)
    mass = np.minimum(dist, radius) ** power
    total = float(mass.sum())
    counts = np.bincount(labels, minlength=centres.shape[0]).astype(np.float64)
    if draws.shape[0] == 0 or not total > 0:
        return centres.copy(), counts
    idx = weighted_sample(draws, mass)
    sample_w = total / (draws.shape[0] * mass[idx])
    centre_w = counts - np.bincount(labels[idx], weights=sample_w, minlength=centres.shape[0])
    return np.concatenate([x[idx], centres]), np.concatenate([sample_w, centre_w])


def minmax_scores(dist: np.ndarray, group: np.ndarray, weights: np.ndarray, radii: np.ndarray, power: int,
                  budget: float) -> np.ndarray:
    """``sum_{q in Q_L} w_q min(d(q, C), L)^l - budget L^l`` for every L (the coordinator's objective).

    Args:
        dist: ``d(q, C)`` for all coreset points ``[P]``.
        group: the index of each point's radius (client set) ``[P]`` int64.
        weights: coreset weights ``[P]``.
        radii: the radii ``[T]``.
        power: l.
        budget: the outlier budget (e.g. ``(1+eps) z``).

    Returns:
        float64 ``[T]``; the score of C is the maximum.
    """
    clipped = np.minimum(dist, radii[group]) ** power
    sums = np.bincount(group, weights=weights * clipped, minlength=radii.shape[0])
    return sums - budget * radii**power


def reverse_greedy(dist: np.ndarray, group: np.ndarray, weights: np.ndarray, radii: np.ndarray, k: int,
                   bound: float, power: int) -> np.ndarray | None:
    """Reverse greedy for min-max k-median over client sets (Anthony et al. 2010), as Guo & Li use it.

    Start with every facility open; N - k times, remove the facility v whose removal raises each
    client set's cost by at most ``B / 2`` (``delta_i(v) <= B/2`` for all i) and minimises
    ``sum_i u_i delta_i(v)``, then ``u_i *= (1 + 1/B)^{delta_i(v)}``. Client set i is the coreset
    of radius ``L_i`` with the truncated metric ``min(d, L_i)^l``.

    Nearest and second-nearest open facilities are kept per point, so a removal costs
    O(points it affects x N) and a whole run O(P N) amortised.

    Args:
        dist: distances from every coreset point to every facility ``[P, N]``.
        group: client set of each point ``[P]`` int64 (``0 .. T-1``).
        weights: coreset weights ``[P]`` (may be negative).
        radii: ``L_i`` per client set ``[T]``.
        k: facilities to keep, ``1 <= k <= N``.
        bound: B > 0.
        power: l.

    Returns:
        Indices of the k open facilities, or ``None`` if some step has no admissible facility
        (B too small).

    References:
        Anthony, Goyal, Gupta, Nagarajan, "A plant location guide for the unsure: approximation
        algorithms for min-max location problems", Math. OR 2010; Guo & Li, Appendix D.2; spec
        section 3.4 (the displayed objective's d(p, Q_i) is read as d(p, C)).
    """
    dist = np.asarray(dist, dtype=np.float64)
    n_points, n_fac = dist.shape
    if not 1 <= k <= n_fac:
        raise ValueError(f"need 1 <= k <= {n_fac} facilities, got k = {k}")
    if not bound > 0:
        raise ValueError("bound must be positive")
    open_ = np.ones(n_fac, dtype=bool)
    if n_fac == k:
        return np.arange(n_fac, dtype=np.int64)
    n_sets = radii.shape[0]
    point_radius = radii[group]
    rows = np.arange(n_points)
    two = np.argpartition(dist, 1, axis=1)[:, :2] if n_fac > 1 else np.zeros((n_points, 2), dtype=np.int64)
    swap = dist[rows, two[:, 0]] > dist[rows, two[:, 1]]
    first = np.where(swap, two[:, 1], two[:, 0])
    second = np.where(swap, two[:, 0], two[:, 1])
    u = np.ones(n_sets)
    for _ in range(n_fac - k):
        d1 = np.minimum(dist[rows, first], point_radius) ** power
        d2 = np.minimum(dist[rows, second], point_radius) ** power
        gain = weights * (d2 - d1)
        delta = np.bincount(group * n_fac + first, weights=gain, minlength=n_sets * n_fac).reshape(n_sets, n_fac)
        admissible = open_ & np.all(delta <= bound / 2, axis=0)
        if not admissible.any():
            return None
        score = np.where(admissible, u @ delta, np.inf)
        v = int(np.argmin(score))
        u = u * (1.0 + 1.0 / bound) ** delta[:, v]
        u /= u.max()
        open_[v] = False
        affected = np.flatnonzero((first == v) | (second == v))
        if affected.size:
            sub = np.where(open_[None, :], dist[affected], np.inf)
            if open_.sum() > 1:
                pair = np.argpartition(sub, 1, axis=1)[:, :2]
                flip = sub[np.arange(affected.size), pair[:, 0]] > sub[np.arange(affected.size), pair[:, 1]]
                first[affected] = np.where(flip, pair[:, 1], pair[:, 0])
                second[affected] = np.where(flip, pair[:, 0], pair[:, 1])
            else:
                only = int(np.flatnonzero(open_)[0])
                first[affected] = only
                second[affected] = only
    return np.flatnonzero(open_).astype(np.int64)


def polish_minmax(points: np.ndarray, group: np.ndarray, weights: np.ndarray, radii: np.ndarray,
                  centres: np.ndarray, budget: float, power: int, *, iterations: int = 20) -> tuple[np.ndarray, float]:
    """Descend the min-max objective with truncated Lloyd steps on the worst radius's coreset.

    Each step takes the radius L attaining ``max_L [cost_L(C) - budget L^l]``, moves every centre to
    the weighted mean of the coreset-L points nearer than L to it (the truncated cost of the others
    does not depend on C), and keeps the move only if the maximum decreases. Centres of the
    median/means problems may lie anywhere in R^D (spec 1.1), while reverse greedy picks them among
    coreset points; this is a design addition of this project, not in the paper.

    Args:
        points: pooled coreset points ``[P, d]``.
        group: radius index per point ``[P]``.
        weights: coreset weights ``[P]``.
        radii: the grid ``[T]`` (finite).
        centres: starting centres ``[c, d]``.
        budget: outlier budget of the score.
        power: l (the mean is the exact minimiser for l = 2; for l = 1 the step is a heuristic
            that is kept only when it helps).
        iterations: at most this many steps.

    Returns:
        ``(centres, score)``.
    """
    def score_of(c: np.ndarray) -> tuple[float, int]:
        dist, _ = _kernels.nearest_centres(points, c)
        scores = minmax_scores(dist, group, weights, radii, power, budget)
        j = int(np.argmax(scores))
        return float(scores[j]), j

    best, j = score_of(centres)
    centres = np.array(centres, dtype=np.float64)
    for _ in range(iterations):
        rows = group == j
        dist, labels = _kernels.nearest_centres(points[rows], centres)
        w = np.where(dist < radii[j], weights[rows], 0.0)
        moved = weighted_lloyd(points[rows], w, centres, 1) if centres.shape[0] else centres
        score, j_new = score_of(moved)
        if not score < best:
            break
        centres, best, j = moved, score, j_new
    return centres, best

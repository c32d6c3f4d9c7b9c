"""Sequential solvers of (k,z)-median and (k,z)-means (Guo & Li, Appendix C).

Trimmed and truncated costs (:func:`trimmed_cost`, :func:`sup_cost`, :func:`minmax_scores`),
k-means++ seeding, weighted Lloyd and k-means--, the BEL/truncated coreset of one radius
(:func:`bel_coreset`) and the coordinator's reverse greedy with its min-max polishing. ``power``
is the objective's exponent l: 1 for median, 2 for means; randomness comes in as uniform draws
(``jax.random`` keys are the protocol's business).

References:
    Guo & Li, NeurIPS 2018 (arXiv 1810.07852), Theorem 1.2, Lemmas C.1 and C.2, Appendix D.2;
    spec kz-clustering.md section 3 and section 4 items 7-9.
"""

from __future__ import annotations

import math

import numpy as np

from fedproto.algorithms.kzclustering import _kernels

__all__ = [
    "bel_coreset",
    "kmeans_minus_minus",
    "kmeanspp_seeding",
    "minmax_scores",
    "polish_minmax",
    "reverse_greedy",
    "sup_cost",
    "trimmed_cost",
    "weighted_lloyd",
    "weighted_sample",
]


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
                power: int, *, nearest: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
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
        nearest: ``_kernels.nearest_centres(x, centres)`` if the caller has it (a machine builds
            one coreset per radius from the same B_i); computed here otherwise.

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
    dist, labels = _kernels.nearest_centres(x, centres) if nearest is None else nearest
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


"""Coordinator-side polishing of (k,z)-center centres on the weighted representatives.

After kzc (and the refinement of spec 2.5) has chosen centres C among the representatives Q
(weights w, each standing for points within ``move = 4 L`` of it), the coordinator can look for
a better set at no communication cost. The quantity it can certify for any C is

    ``cert(C) = move + rho(C, b)``,  with ``rho(C, b)`` the smallest r such that the weight of
    the representatives farther than r from C is at most b,

because at most b weight of representatives (and the discarded points) lie beyond it, and every
other point is within ``move`` of its representative (spec 2.3, Claim 2.5); b is the outlier
weight kzc's certificate used (``z' = (1+eps) z - discarded``, or ``z - discarded``). The paper's
evaluation removes z points instead of ``(1+eps) z`` (spec 2.6, Appendix D.1); its estimate on the
representatives is ``rho(C, z - discarded)``.

`polish_centres` runs single-swap local search (steepest descent: each pass makes the best swap
of one centre for one representative) on that estimate and returns a set whose certificate stays
within a limit (the kzc certificate L_out), so the certified radius, and with it every guarantee
of the protocol, is kept. It searches from kzc's centres accepting only swaps within the limit,
and without that restriction from kzc's centres and from farthest-first traversals of the
representatives, keeping those end points that satisfy the limit; the best estimate wins (kzc's
centres on ties). Everything is deterministic.

Cost: a pass is ``O(k R C)`` for C candidate representatives (two matrix-vector tests per centre
position: which swaps improve the estimate and which keep the certificate) plus sorting the
improving columns; ``C = R`` up to 512 representatives, a farthest-first sample of 512 beyond
(``max_candidates``). Memory ``O(R^2)`` for the ``[R, R]`` distances the coordinator already holds
(R <= k m (1 + 1/eps)).

References:
    Guo & Li, NeurIPS 2018, Section 2.2 (the representatives and Claim 2.5) and Appendix D.1
    (the evaluated cost); Arya et al., "Local search heuristics for k-median and facility
    location problems", SIAM J. Comput. 33(3), 2004 (single-swap local search).
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Polished", "polish_centres", "trimmed_radius"]

# relative margin below which an estimate does not count as improved (float noise)
_IMPROVE = 1e-12


def trimmed_radius(dist: np.ndarray, weights: np.ndarray, budget: float) -> np.ndarray:
    """``rho`` per column: the smallest r such that the weight of rows with ``dist > r`` is ``<= budget``.

    Args:
        dist: ``[R, c]`` float64, the distance of each representative to each of c candidate
            centre sets.
        weights: ``[R]`` positive weights.
        budget: outlier weight allowed, ``>= 0``.

    Returns:
        float64 ``[c]`` (0 where the budget covers every row).
    """
    order = np.argsort(-dist, axis=0, kind="stable")
    ranked = np.take_along_axis(dist, order, axis=0)
    beyond = np.cumsum(weights[order], axis=0)
    over = beyond > budget
    first = np.argmax(over, axis=0)
    value = ranked[first, np.arange(dist.shape[1])]
    return np.where(over.any(axis=0), value, 0.0)


@dataclasses.dataclass(frozen=True)
class Polished:
    """The result of `polish_centres`.

    Attributes:
        centres: indices into the representatives, int64 ``[k']`` (``k' <= k``).
        estimate: ``rho(C, budget)`` of the result.
        certificate: ``move + rho(C, cert_budget)``, at most the given limit.
        improved: whether the result's estimate is below the start's.
    """

    centres: np.ndarray
    estimate: float
    certificate: float
    improved: bool


def _search(
    dist: np.ndarray,
    weights: np.ndarray,
    start: np.ndarray,
    budget: float,
    cert_budget: float,
    reach: float,
    max_passes: int,
    candidates: np.ndarray,
) -> tuple[np.ndarray, float]:
    """Steepest-descent single swaps from a feasible ``start`` to the ``candidates`` (indices of
    representatives); ``reach = limit - move``."""
    centres = [int(c) for c in start]
    n = dist.shape[0]
    pool = dist[:, candidates]  # [R, C]
    current = float(trimmed_radius(dist[:, centres].min(axis=1)[:, None], weights, budget)[0])
    for _ in range(max_passes):
        sub = dist[:, centres]
        order = np.argsort(sub, axis=1, kind="stable")
        nearest_at = order[:, 0]
        first = np.take_along_axis(sub, order[:, :1], axis=1)[:, 0]
        second = np.take_along_axis(sub, order[:, 1:2], axis=1)[:, 0] if len(centres) > 1 else np.full(n, np.inf)
        best = (current * (1.0 - _IMPROVE), -1, -1)
        open_candidates = ~np.isin(candidates, centres)  # a centre is no candidate for a swap
        for j in range(len(centres)):
            base = np.where(nearest_at == j, second, first)  # distance to the other centres
            swapped = np.minimum(base[:, None], pool)  # [R, C]: column c = centre j replaced by candidate c
            # improving columns: weight at or beyond the current estimate within the budget
            improving = weights @ (swapped >= current) <= budget
            # feasible columns: weight beyond the certificate's reach within its budget
            improving &= weights @ (swapped > reach) <= cert_budget
            improving &= open_candidates
            columns = np.flatnonzero(improving)
            if columns.size == 0:
                continue
            values = trimmed_radius(swapped[:, columns], weights, budget)
            pick = int(np.argmin(values))
            if values[pick] < best[0]:
                best = (float(values[pick]), j, int(candidates[columns[pick]]))
        if best[1] < 0:
            break
        current, j, c = best
        centres[j] = c
    return np.asarray(centres, dtype=np.int64), current


def polish_centres(
    dist: np.ndarray,
    weights: np.ndarray,
    start: np.ndarray,
    *,
    budget: float,
    cert_budget: float,
    move: float,
    limit: float,
    restarts: int = 3,
    max_passes: int = 100,
    max_candidates: int = 512,
) -> Polished:
    """Swap local search for k centres among the representatives, certificate kept within ``limit``.

    Args:
        dist: pairwise distances of the representatives ``[R, R]`` float64.
        weights: their weights ``[R]`` (positive).
        start: kzc's centres, indices into the representatives ``[k']`` (distinct); the search
            keeps their number.
        budget: the outlier weight of the estimate (``z - discarded``, floored at 0).
        cert_budget: the outlier weight of the certificate (``z' = (1+eps) z - discarded``, or
            ``z - discarded`` when kzc certified z outliers).
        move: how far a representative's points may lie from it (``4 L``; 0 for the bottom guess).
        limit: the certificate the result must keep (kzc's L_out; raised to ``start``'s own
            certificate if that is larger by a rounding).
        restarts: extra starts, farthest-first traversals from representatives 0, 1, ...
        max_passes: swaps per start at most.
        max_candidates: the most representatives a centre may be swapped for. With more
            representatives than this, the candidates are a farthest-first traversal of them
            continuing from ``start`` (spread over the data; the estimate and the certificate
            are still evaluated on every representative), and the searches from farthest-first
            starts are skipped: a pass costs ``O(k R max_candidates)`` instead of ``O(k R^2)``.

    Returns:
        The :class:`Polished` set with the smallest estimate found (``start``'s on ties).

    Raises:
        ValueError: shapes disagree, ``start`` is empty or ``max_candidates < 1``.

    References:
        Module docstring; Arya et al. 2004 (single-swap local search).
    """
    dist = np.asarray(dist, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    start = np.asarray(start, dtype=np.int64)
    n = dist.shape[0]
    if dist.shape != (n, n) or weights.shape != (n,):
        raise ValueError(f"dist must be [R, R] and weights [R], got {dist.shape} and {weights.shape}")

    def certificate(centres: np.ndarray) -> float:
        return move + float(trimmed_radius(dist[:, centres].min(axis=1)[:, None], weights, cert_budget)[0])

    def estimate(centres: np.ndarray) -> float:
        return float(trimmed_radius(dist[:, centres].min(axis=1)[:, None], weights, budget)[0])

    if start.size == 0:
        raise ValueError("the search needs at least one starting centre")
    if max_candidates < 1:
        raise ValueError(f"max_candidates must be at least 1, got {max_candidates}")
    start_estimate = estimate(start)
    if start.size >= n:  # every representative is a centre already
        return Polished(start, start_estimate, certificate(start), False)
    # kzc's certificate can exceed its L_out formula by a rounding (e.g. 4L + 20L against 24L)
    limit = max(limit, certificate(start))
    # the largest reach with move + reach <= limit in floating point, so that an accepted swap's
    # certificate never exceeds the limit by a rounding
    reach = limit - move
    while move + reach > limit:
        reach = float(np.nextafter(reach, -np.inf))
    # the search from kzc's centres within the limit, then free searches (from kzc's centres and
    # from farthest-first traversals) whose end point happens to satisfy it
    if n <= max_candidates:
        candidates = np.arange(n, dtype=np.int64)
    else:
        candidates = _farthest_first(dist, int(start[0]), max_candidates, given=start)
        restarts = 0
    results = [_search(dist, weights, start, budget, cert_budget, reach, max_passes, candidates)]
    starts = [start] + [_farthest_first(dist, r, start.size) for r in range(min(restarts, n))]
    for first in starts:
        if first.size != start.size:
            continue
        centres, value = _search(dist, weights, first, budget, cert_budget, np.inf, max_passes, candidates)
        if certificate(centres) <= limit:
            results.append((centres, value))
    best_centres, best_estimate = min(results, key=lambda item: item[1])  # the first on ties
    if not best_estimate < start_estimate * (1.0 - _IMPROVE):
        return Polished(start, start_estimate, certificate(start), False)
    return Polished(best_centres, best_estimate, certificate(best_centres), True)


def _farthest_first(dist: np.ndarray, first: int, count: int, *, given: np.ndarray | None = None) -> np.ndarray:
    """Gonzalez's traversal on a distance matrix from row ``first`` (stops early at distance 0), or
    continuing from the rows ``given`` (all of them chosen first)."""
    chosen = [first] if given is None else [int(g) for g in dict.fromkeys(given.tolist())]
    nearest = dist[chosen].min(axis=0)
    while len(chosen) < count:
        p = int(np.argmax(nearest))
        if nearest[p] <= 0:
            break
        chosen.append(p)
        nearest = np.minimum(nearest, dist[p])
    return np.asarray(chosen, dtype=np.int64)

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

import concurrent.futures
import dataclasses
import itertools
import math

import numpy as np
from scipy.spatial import cKDTree

from fedproto.algorithms.kzclustering import _kernels

__all__ = [
    "DEFAULT_SUB_MACHINE_POINTS",
    "Aggregation",
    "Cover",
    "Extent",
    "PointIndex",
    "SubMachines",
    "aggregate",
    "aggregate_points",
    "center_cost",
    "cover_breakpoints",
    "farthest_first",
    "greedy_cover",
    "kzc",
    "local_extent",
    "pad_centres",
    "radius_grid",
    "smallest_cover_radius",
    "split_sub_machines",
    "sub_machine_count",
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


def _check_aggregate_args(radius: float, threshold: float, candidates: str) -> None:
    if not radius >= 0 or not threshold >= 0:
        raise ValueError(f"radius and threshold must be >= 0, got {radius} and {threshold}")
    if candidates not in CANDIDATES:
        raise ValueError(f"candidates must be one of {CANDIDATES}, got {candidates!r}")


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
    _check_aggregate_args(radius, threshold, candidates)
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


# --- memory-lean aggregation: blocked distances, exact neighbour pairs, sub-machines -------------

DEFAULT_SUB_MACHINE_POINTS = 10_000
"""Largest sub-machine of the split (Guo & Li, Appendix B; the authors' code uses 10,000)."""

METHODS = ("auto", "pairs", "blocked")
"""How `aggregate_points` finds balls: k-d tree neighbour pairs, blocked distance rows, or a choice."""

_SLACK = 1e-9
"""Relative slack of k-d tree radius queries: the tree's own rounding may differ from the
canonical distance by a few ulps, so it is asked for a slightly larger ball and every candidate
is then tested with the canonical distance (`_kernels.pair_distances`)."""
_TINY = 1e-150
"""Absolute slack of the same queries: canonical distances below about 2e-162 underflow to 0."""
_BLOCK_ROWS = 256
_MAX_BATCH = 1024
_SAMPLE = 256
_CACHE_BYTES_PER_POINT = 2048
_PAIRS_SHARE = 1.0 / 20.0
"""The share of the ``n^2`` pairs below which ``auto`` lists neighbour pairs: a listed pair costs
about 70-80 ns (tree query, canonical distance, sort), a screened one about 1-2 ns
(`_kernels.ball_counts`); measured on 5,000 and 10,000 points of the scale benchmark's mixture."""
_MAX_PAIRS = 1 << 25
"""Most directed neighbour pairs the ``pairs`` method may hold (16 bytes each, about 512 MiB)."""


def _query_radius(radius: float) -> float:
    return radius * (1.0 + _SLACK) + _TINY


def split_sub_machines(
    points: np.ndarray, max_points: int = DEFAULT_SUB_MACHINE_POINTS, *, parts: int | None = None
) -> list[np.ndarray]:
    """Split one machine's points into ``t = max(1, ceil(n / max_points))`` (or ``parts``) sub-machines.

    Sub-machine j takes the points ``j, j + t, j + 2t, ...`` (a stride, not contiguous chunks: a
    machine whose points arrive sorted, e.g. by cluster, still gets sub-machines that look like
    the whole machine). Deterministic; sizes differ by at most one; every point is in exactly one
    part (unlike the authors' ``evenly_partition``, which drops trailing points when
    ``n mod t >= floor(n / t)``, spec section 6).

    Args:
        points: the machine's points ``[n, d]`` (only ``n`` is used).
        max_points: largest sub-machine, ``>= 1`` (ignored when ``parts`` is given).
        parts: the number of sub-machines ``t >= 1`` (`KzCenterConfig.sub_machines`, the same on
            every machine); parts beyond ``n`` are empty.

    Returns:
        ``t`` int64 index arrays into ``points``, each sorted, of sizes ``floor(n/t)`` or
        ``ceil(n/t)`` (one empty array when ``n = 0`` and ``parts`` is not given).

    Raises:
        ValueError: ``max_points < 1`` or ``parts < 1``.

    References:
        Guo & Li, Appendix B ("machine multiplication"); spec sections 2.7 and 6.
    """
    if max_points < 1:
        raise ValueError(f"max_points must be at least 1, got {max_points}")
    if parts is not None and parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    n = int(np.shape(points)[0])
    t = sub_machine_count(n, max_points) if parts is None else int(parts)
    return [np.arange(j, n, t, dtype=np.int64) for j in range(t)]


def sub_machine_count(n_points: int, max_points: int = DEFAULT_SUB_MACHINE_POINTS) -> int:
    """``t_i = max(1, ceil(n_i / max_points))``: the virtual machines that machine i stands for.

    A machine of at most ``max_points`` points (empty ones included) is one virtual machine, so
    without large machines ``m' = sum_i t_i = m`` and nothing changes.

    Raises:
        ValueError: a negative ``n_points`` or ``max_points < 1``.
    """
    if n_points < 0 or max_points < 1:
        raise ValueError(f"need n_points >= 0 and max_points >= 1, got {n_points} and {max_points}")
    return max(1, -(-int(n_points) // int(max_points)))


@dataclasses.dataclass(frozen=True)
class Extent:
    """What a machine reports in the extent round (spec 2.4, practical alternative).

    Attributes:
        n_points: ``n_i``.
        min_distance: the smallest positive pairwise distance, ``inf`` with fewer than two
            distinct points.
        anchor: index of the anchor point (always 0), -1 when there are no points.
        radius: the largest distance from the anchor (0 without points).
    """

    n_points: int
    min_distance: float
    anchor: int
    radius: float


def local_extent(points: np.ndarray, *, block_rows: int = _BLOCK_ROWS) -> Extent:
    """``n_i``, the smallest positive distance and the anchor's radius, without an ``[n, n]`` matrix.

    Equal to what the dense matrix gives (``min(D[D > 0])`` and ``max(D[0])``, canonical
    distances): the distances of 256 sampled points to their nearest other points (k-d tree)
    bound the answer from above, and every pair within that bound (plus slack) is listed by the
    tree and re-measured with the canonical distance; if all of them are duplicates the bound
    doubles. Up to 2,048 points, or if the listing would exceed 2^25 pairs or finds only pairs
    that underflow to 0, it scans blocks of ``block_rows`` distance rows instead (``O(n^2)``
    time, ``O(block_rows n)`` memory).

    Args:
        points: ``[n, d]`` float64.
        block_rows: rows per distance block of the scan.

    Returns:
        The :class:`Extent`.

    References:
        Spec section 2.4 ("practical alternative"); `KzMachine`'s extent message.
    """
    x = np.asarray(points, dtype=np.float64)
    n = x.shape[0]
    if n == 0:
        return Extent(0, math.inf, -1, 0.0)
    radius = float(_kernels.pairwise_distances(x[:1], x).max())
    if n <= 2048:
        return Extent(n, _scan_min_distance(x, block_rows), 0, radius)
    if radius == 0.0:
        return Extent(n, math.inf, 0, radius)  # every point is the anchor
    tree = cKDTree(x)
    # a sample's distances to its nearest other points bound the smallest one from above; every
    # pair within the bound is then listed and measured canonically (doubling the bound while the
    # listed pairs are all duplicates)
    sample = x[np.unique(np.linspace(0, n - 1, min(n, _SAMPLE)).astype(np.int64))]
    near, _ = tree.query(sample, k=min(n, 8))
    positive = near[near > 0]
    bound = float(positive.min()) if positive.size else radius
    while bound <= 2.0 * radius * (1.0 + _SLACK) + _TINY:
        # the sample's ball sizes estimate the pairs the listing would hold (a guard on memory)
        listed = tree.query_ball_point(sample, _query_radius(bound), return_length=True)
        if (float(np.mean(listed)) - 1.0) * n / 2.0 > _MAX_PAIRS:
            break
        pairs = tree.query_pairs(_query_radius(bound), output_type="ndarray")
        dist = _kernels.pair_distances(x, pairs[:, 0], pairs[:, 1])
        dist = dist[dist > 0]
        if dist.size and float(dist.min()) <= bound:
            return Extent(n, float(dist.min()), 0, radius)
        bound *= 2.0
    return Extent(n, _scan_min_distance(x, block_rows), 0, radius)


def _scan_min_distance(x: np.ndarray, block_rows: int) -> float:
    best = math.inf
    for r0 in range(0, x.shape[0], block_rows):
        dist = _kernels.pairwise_distances(x[r0 : r0 + block_rows], x)
        positive = dist[dist > 0]
        if positive.size:
            best = min(best, float(positive.min()))
    return best


def _top_candidates(score: np.ndarray, threshold: float, size: int) -> np.ndarray:
    """The first ``size`` candidates in the greedy's order (largest score, then smallest index)
    among those with ``score > threshold``."""
    if size <= 1 or score.shape[0] == 1:
        p = int(np.argmax(score))
        return np.array([p], dtype=np.int64) if score[p] > threshold else np.zeros(0, dtype=np.int64)
    eligible = score > threshold
    cand = np.flatnonzero(eligible)
    if cand.shape[0] > size:
        # scores are counts (small non-negative integers): the size-th largest from a histogram
        hist = np.bincount(score[cand])
        above = np.cumsum(hist[::-1])
        floor = hist.shape[0] - 1 - int(np.searchsorted(above, size))
        cand = np.flatnonzero(eligible & (score >= floor))
    return cand[np.argsort(-score[cand], kind="stable")[:size]]


def _independent_prefix(x: np.ndarray, chosen: np.ndarray, reach: float) -> int:
    """Length of the longest prefix of ``chosen`` whose points are pairwise farther than ``reach``
    (with a relative margin of 1e-6, so "farther" survives rounding)."""
    b = chosen.shape[0]
    if b <= 1:
        return b
    close = _kernels.pairwise_distances(x[chosen]) <= reach * (1.0 + 1e-6) + _TINY
    hit = np.tril(close, k=-1).any(axis=1)
    first = int(np.argmax(hit))
    return first if hit[first] else b


def _greedy(x, count, radius, threshold, max_reps, candidates, absorb, decrement, max_batch) -> Aggregation:
    """Algorithm 2's loop on maintained counts, several steps at a time when that changes nothing.

    ``count[p] = |ball_U(p, 2L)|`` is kept up to date by ``decrement(absorbed, alive)`` after
    every removal. The loop takes the best candidates in the greedy's order (largest count,
    smallest index) and accepts the longest prefix whose points are pairwise farther than 6L:
    removing ``ball_U(p_j, 4L)`` cannot change the count of a point farther than 6L from p_j (its
    2L ball misses that 4L ball), and no count grows, so each of them is still the argmax at its
    turn and the result equals the one-step-at-a-time loop of `aggregate` (equality is tested).
    ``absorb(chosen, alive)`` returns, for each newly absorbed point, the position in ``chosen``
    of the first representative whose 4L ball holds it (the sequential order of absorption).

    References:
        Guo & Li, Algorithm 2; spec section 2.2 (incremental counts).
    """
    n = count.shape[0]
    alive = np.ones(n, dtype=bool)
    owner = np.full(n, -1, dtype=np.int64)
    reps: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    n_reps = 0
    overflow = False
    only_uncovered = candidates == "uncovered"
    size = 1
    while n:
        score = np.where(alive, count, -1) if only_uncovered else count
        top = _top_candidates(score, threshold, size)
        if top.shape[0] == 0:
            break
        room = math.inf if max_reps is None else max_reps - n_reps
        if room <= 0:
            overflow = True
            break
        keep = _independent_prefix(x, top, 6.0 * radius)
        chosen = top[: int(min(keep, room))]
        pos, absorbed = absorb(chosen, alive)
        owner[absorbed] = n_reps + pos
        alive[absorbed] = False
        decrement(absorbed, alive)
        reps.append(chosen)
        weights.append(np.bincount(pos, minlength=chosen.shape[0]))
        n_reps += chosen.shape[0]
        if keep > room:  # the next candidate qualifies and is untouched: the cap is exceeded
            overflow = True
            break
        size = min(2 * size, max_batch) if keep == top.shape[0] else max(2, keep)
    return Aggregation(
        reps=np.concatenate(reps) if reps else np.zeros(0, dtype=np.int64),
        weights=np.concatenate(weights).astype(np.int64) if weights else np.zeros(0, dtype=np.int64),
        owner=owner,
        discarded=int(alive.sum()),
        overflow=overflow,
    )


def _first_owner(n: int, width: int, idx: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For points listed (possibly several times) with the positions of the balls holding them,
    the smallest position per point: ``(pos, points)``."""
    if width == 1:
        return pos, idx
    best = np.full(n, width, dtype=np.int64)
    np.minimum.at(best, idx, pos)
    absorbed = np.flatnonzero(best < width)
    return best[absorbed], absorbed


@dataclasses.dataclass(frozen=True)
class _PairCache:
    """Directed neighbour pairs within ``radius`` (canonical distance), as CSR with distances."""

    radius: float
    indptr: np.ndarray
    cols: np.ndarray
    dist: np.ndarray


class PointIndex:
    """One (sub-)machine's points, ready for aggregations at many radii without an ``[n, n]`` matrix.

    Two exact ways to run Algorithm 2 (`aggregate` on the dense matrix gives the same result,
    tested):

    * ``pairs``: a k-d tree (``scipy.spatial.cKDTree``) lists the pairs within 2L, each re-measured
      with the canonical distance; counts are the degrees and a removal subtracts the rows of
      the removed points. Time and memory O(pairs within 2L); the representatives' 4L balls come
      from tree queries. The pairs of the largest radius so far are kept (up to
      ``pair_cache_bytes``) and filtered for smaller radii, which a radius search asks for
      often.
    * ``blocked``: ball sizes by `_kernels.ball_counts` (a compiled screen in ``[64, n]`` tiles,
      the canonical distance for the pairs at the boundary) and the representatives' rows in
      blocks of ``block_rows``; O(n^2) time per radius, never an ``[n, n]`` matrix.

    ``auto`` takes ``pairs`` when a sample of ball sizes predicts at most ``n^2 / 20`` and at most
    2^25 directed pairs, ``blocked`` otherwise (and for up to 512 points).

    Args:
        points: ``[n, d]`` float64 (finite).
        method: ``"auto"``, ``"pairs"`` or ``"blocked"``.
        block_rows: rows per distance block (also the largest batch of representatives taken at
            once by the blocked method).
        pair_cache_bytes: the most bytes of neighbour pairs kept between calls (0: none).

    Raises:
        ValueError: an unknown ``method``, ``block_rows < 1`` or a negative cache size.

    References:
        Guo & Li, Algorithm 2; spec sections 2.2 and 2.8 ("for n_i > ~2e4 use blocked distance
        computation or the sub-machine split").
    """

    def __init__(
        self,
        points: np.ndarray,
        *,
        method: str = "auto",
        block_rows: int = _BLOCK_ROWS,
        pair_cache_bytes: int = 64 << 20,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if block_rows < 1 or pair_cache_bytes < 0:
            raise ValueError("block_rows must be >= 1 and pair_cache_bytes >= 0")
        self.points = np.ascontiguousarray(points, dtype=np.float64)
        if self.points.ndim != 2:
            raise ValueError(f"points must have shape [n, d], got {self.points.shape}")
        self.method = method
        self.block_rows = int(block_rows)
        self.pair_cache_bytes = int(pair_cache_bytes)
        self._tree: cKDTree | None = None
        self._columns: np.ndarray | None = None
        self._enclosing: float | None = None
        self._cache: _PairCache | None = None

    @property
    def n_points(self) -> int:
        return int(self.points.shape[0])

    @property
    def enclosing_radius(self) -> float:
        """The largest distance from the centre of the bounding box (so every pairwise distance is
        at most twice it, up to rounding); 0 without points."""
        if self._enclosing is None:
            x = self.points
            centre = (x.min(axis=0) + x.max(axis=0)) / 2.0 if x.shape[0] else np.zeros(x.shape[1])
            self._enclosing = float(_kernels.pairwise_distances(centre[None, :], x).max(initial=0.0))
        return self._enclosing

    @property
    def columns(self) -> np.ndarray:
        """The points stored by coordinate, ``[d, n]`` (for `_kernels.pair_distances_by_columns`)."""
        if self._columns is None:
            self._columns = np.ascontiguousarray(self.points.T)
        return self._columns

    @property
    def tree(self) -> cKDTree:
        """The k-d tree of the points (built on first use)."""
        if self._tree is None:
            self._tree = cKDTree(self.points)
        return self._tree

    def choose_method(self, radius: float) -> str:
        """The method ``auto`` uses at this radius (see the class docstring)."""
        n = self.n_points
        if self.method != "auto":
            return self.method
        if n <= 512:
            return "blocked"
        if self._cache is not None and self._cache.radius >= 2.0 * radius:
            return "pairs"
        sample = np.unique(np.linspace(0, n - 1, min(n, _SAMPLE)).astype(np.int64))
        sizes = self.tree.query_ball_point(self.points[sample], _query_radius(2.0 * radius), return_length=True)
        directed = (float(np.mean(sizes)) - 1.0) * n
        return "pairs" if directed <= min(n * n * _PAIRS_SHARE, _MAX_PAIRS) else "blocked"

    def aggregate(
        self, radius: float, threshold: float, *, max_reps: int | None = None, candidates: str = "all"
    ) -> Aggregation:
        """Aggregating(Q, L, y) on these points; the same result as `aggregate` on their matrix.

        Args:
            radius: the guess L, ``>= 0``.
            threshold: y, ``>= 0``.
            max_reps: the cap of `aggregate` (``None``: no cap).
            candidates: ``"all"`` or ``"uncovered"`` (see `aggregate`).

        Returns:
            The :class:`Aggregation` (indices into ``points``).

        Raises:
            ValueError: as `aggregate`.
        """
        _check_aggregate_args(radius, threshold, candidates)
        radius = float(radius)
        n = self.n_points
        if n == 0:
            return aggregate(np.zeros((0, 0)), radius, threshold, max_reps=max_reps, candidates=candidates)
        if 2.0 * self.enclosing_radius * (1.0 + _SLACK) + _TINY <= 2.0 * radius:
            # every 2L ball holds every point: point 0 has the largest ball (smallest index on the
            # tie), and its 4L ball absorbs everything; then no ball holds anything
            if not n > threshold:
                return Aggregation(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                                   np.full(n, -1, dtype=np.int64), n, False)
            if max_reps is not None and max_reps < 1:
                return Aggregation(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                                   np.full(n, -1, dtype=np.int64), n, True)
            return Aggregation(np.zeros(1, dtype=np.int64), np.array([n], dtype=np.int64),
                               np.zeros(n, dtype=np.int64), 0, False)
        if self.choose_method(radius) == "pairs":
            return self._aggregate_pairs(radius, threshold, max_reps, candidates)
        return self._aggregate_blocked(radius, threshold, max_reps, candidates)

    # -- the pairs method ---------------------------------------------------------------------------

    def _neighbours(self, inner: float) -> tuple[np.ndarray, np.ndarray]:
        """CSR ``(indptr [n+1], indices)`` of the pairs at canonical distance ``<= inner`` (no self-pairs)."""
        n = self.n_points
        cache = self._cache
        if cache is not None and cache.radius >= inner:
            keep = cache.dist <= inner
            kept = np.zeros(keep.shape[0] + 1, dtype=np.int64)
            np.cumsum(keep, out=kept[1:])
            return kept[cache.indptr], cache.cols[keep]
        pairs = self.tree.query_pairs(_query_radius(inner), output_type="ndarray")
        index_type = np.int32 if n < 1 << 31 else np.int64
        pairs = pairs.astype(index_type)
        dist = _kernels.pair_distances_by_columns(self.columns, pairs[:, 0], pairs[:, 1])
        keep = dist <= inner
        first, second, dist = pairs[keep, 0], pairs[keep, 1], dist[keep]
        rows = np.concatenate([first, second])
        # n <= 2^16: NumPy's stable sort of uint16 is a radix sort
        order = np.argsort(rows.astype(np.uint16) if n <= 1 << 16 else rows, kind="stable")
        cols = np.concatenate([second, first]).take(order)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
        if 12 * cols.shape[0] + indptr.nbytes <= self.pair_cache_bytes:
            self._cache = _PairCache(inner, indptr, cols, np.concatenate([dist, dist]).take(order))
        return indptr, cols

    def _aggregate_pairs(self, radius, threshold, max_reps, candidates) -> Aggregation:
        x, n = self.points, self.n_points
        inner, outer = 2.0 * radius, 4.0 * radius
        indptr, indices = self._neighbours(inner)
        count = np.diff(indptr) + 1  # |ball_Q(p, 2L)|, p itself included
        tree = self.tree

        def absorb(chosen: np.ndarray, alive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            balls = tree.query_ball_point(x[chosen], _query_radius(outer), return_sorted=False)
            sizes = np.fromiter(map(len, balls), dtype=np.int64, count=chosen.shape[0])
            idx = np.fromiter(itertools.chain.from_iterable(balls), dtype=np.int64, count=int(sizes.sum()))
            pos = np.repeat(np.arange(chosen.shape[0], dtype=np.int64), sizes)
            live = alive[idx]
            idx, pos = idx[live], pos[live]
            near = _kernels.pair_distances_by_columns(self.columns, chosen[pos], idx) <= outer
            return _first_owner(n, chosen.shape[0], idx[near], pos[near])

        def decrement(absorbed: np.ndarray, alive: np.ndarray) -> None:
            count[absorbed] -= 1
            starts = indptr[absorbed]
            sizes = indptr[absorbed + 1] - starts
            total = int(sizes.sum())
            if total:
                flat = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes) + np.arange(total)
                neighbours = indices[flat]
                if total > n // 4:
                    np.subtract(count, np.bincount(neighbours, minlength=n), out=count)
                else:
                    np.subtract.at(count, neighbours, 1)

        return _greedy(x, count, radius, threshold, max_reps, candidates, absorb, decrement, _MAX_BATCH)

    # -- the blocked method -------------------------------------------------------------------------

    def _aggregate_blocked(self, radius, threshold, max_reps, candidates) -> Aggregation:
        x, n, rows = self.points, self.n_points, self.block_rows
        inner, outer = 2.0 * radius, 4.0 * radius
        count = _kernels.ball_counts(x, inner)

        def absorb(chosen: np.ndarray, alive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            within = _kernels.pairwise_distances(x[chosen], x) <= outer
            within &= alive
            absorbed = np.flatnonzero(within.any(axis=0))
            return np.argmax(within[:, absorbed], axis=0).astype(np.int64), absorbed

        def decrement(absorbed: np.ndarray, alive: np.ndarray) -> None:
            # subtract the removed points' rows, or recount from the remaining ones if fewer
            remaining = np.flatnonzero(alive)
            source = absorbed if absorbed.shape[0] <= remaining.shape[0] else remaining
            # |ball(p, 2L) among source| for every p (the canonical distance is symmetric)
            total = _kernels.ball_counts(x, inner, x[source])
            if source is absorbed:
                np.subtract(count, total, out=count)
            else:
                count[:] = total

        return _greedy(x, count, radius, threshold, max_reps, candidates, absorb, decrement, rows)


def aggregate_points(
    points: np.ndarray,
    radius: float,
    threshold: float,
    *,
    max_reps: int | None = None,
    candidates: str = "all",
    method: str = "auto",
    block_rows: int = _BLOCK_ROWS,
) -> Aggregation:
    """`aggregate` from the points instead of a distance matrix: the same result, lean memory.

    Equal to ``aggregate(_kernels.pairwise_distances(points), radius, threshold, ...)``
    (representatives, weights, owners, discarded count, overflow), because both test balls with
    the same canonical distance; but the ``[n, n]`` matrix is never formed (see
    :class:`PointIndex` for the two methods and their costs). For several radii on the same
    points, keep a :class:`PointIndex`.

    Args:
        points: ``[n, d]`` float64.
        radius: the guess L, ``>= 0``.
        threshold: y, ``>= 0``.
        max_reps: the cap of `aggregate` (``None``: no cap).
        candidates: ``"all"`` or ``"uncovered"``.
        method: ``"auto"``, ``"pairs"`` or ``"blocked"``.
        block_rows: rows per distance block.

    Returns:
        The :class:`Aggregation`.

    Raises:
        ValueError: as `aggregate`, or an unknown ``method``.

    References:
        Guo & Li, Algorithm 2 (Section 2.1); spec sections 2.2 and 2.8.
    """
    index = PointIndex(points, method=method, block_rows=block_rows, pair_cache_bytes=0)
    return index.aggregate(radius, threshold, max_reps=max_reps, candidates=candidates)


class SubMachines:
    """A machine split into sub-machines, aggregated as ``t_i`` virtual machines (Appendix B).

    The machine's points are split by `split_sub_machines`; each part gets its own
    :class:`PointIndex`, and an aggregation at L is the concatenation of the parts'
    aggregations (representatives as indices into the machine's points, in part order). Every
    part uses the same threshold and the same overall cap, which the caller sets for the
    *virtual* machine count ``m' = sum_i t_i``: ``y = eps z / (k m')`` and
    ``max_reps = floor(k m' (1 + 1/eps))`` (the paper runs dist-kzc over the m' virtual
    machines). The guarantees of the split are those of Algorithm 2 on each part: the weights
    plus the discarded points are ``n_i``, and each point moves at most 4L, to a representative
    of its own part.

    The parts are aggregated in order and the machine stops once its representatives exceed
    ``max_reps`` (the coordinator rejects that L anyway); the parts left out count as discarded,
    so ``discarded`` is then an upper bound, as in `aggregate`. With ``workers > 1``, that many
    parts are aggregated at once in threads (the k-d tree and NumPy release the GIL); the result
    does not depend on ``workers``.

    Args:
        points: the machine's points ``[n_i, d]`` float64.
        max_points: largest part.
        parts: the number of parts instead (`KzCenterConfig.sub_machines`); ``None``: from
            ``max_points``.
        workers: parts aggregated in parallel, ``>= 1``.
        method: passed to every :class:`PointIndex`.
        pair_cache_bytes: neighbour-pair cache of the whole machine, shared evenly by the parts
            (default 2 KiB per point: the pairs of balls of about 80 points on average).

    Raises:
        ValueError: ``max_points < 1``, ``workers < 1`` or an invalid ``method``.

    References:
        Guo & Li, Appendix B; spec section 2.7 ("use sub-machines if n_i is large").
    """

    def __init__(
        self,
        points: np.ndarray,
        *,
        max_points: int = DEFAULT_SUB_MACHINE_POINTS,
        parts: int | None = None,
        workers: int = 1,
        method: str = "auto",
        pair_cache_bytes: int | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.points = np.ascontiguousarray(points, dtype=np.float64)
        self.parts = split_sub_machines(self.points, max_points, parts=parts)
        if pair_cache_bytes is None:
            pair_cache_bytes = _CACHE_BYTES_PER_POINT * self.points.shape[0]
        share = int(pair_cache_bytes) // len(self.parts)
        self.indexes = [PointIndex(self.points[p], method=method, pair_cache_bytes=share) for p in self.parts]
        self.workers = int(workers)

    @property
    def count(self) -> int:
        """``t_i``: the number of parts (virtual machines)."""
        return len(self.parts)

    def extent(self) -> Extent:
        """The machine's :class:`Extent` (over all its points, not per part)."""
        return local_extent(self.points)

    def aggregate(
        self, radius: float, threshold: float, *, max_reps: int | None = None, candidates: str = "all"
    ) -> Aggregation:
        """The machine's aggregation at L: every part's, concatenated (see the class docstring).

        Args:
            radius: L, ``>= 0``.
            threshold: y for the virtual machine count.
            max_reps: the overall cap for the virtual machine count (``None``: none).
            candidates: ``"all"`` or ``"uncovered"``.

        Returns:
            An :class:`Aggregation` over the machine's points; ``count`` exceeds ``max_reps`` iff
            the machine's representatives do.
        """
        _check_aggregate_args(radius, threshold, candidates)
        n = self.points.shape[0]
        owner = np.full(n, -1, dtype=np.int64)
        reps: list[np.ndarray] = []
        weights: list[np.ndarray] = []
        n_reps, discarded, overflow = 0, 0, False
        pending = list(range(self.count))

        def run(j: int) -> Aggregation:
            return self.indexes[j].aggregate(radius, threshold, max_reps=max_reps, candidates=candidates)

        pool = concurrent.futures.ThreadPoolExecutor(self.workers) if self.workers > 1 else None
        try:
            while pending and not overflow:
                wave, pending = pending[: self.workers], pending[self.workers :]
                # each part runs with the whole cap; a smaller remaining room only cuts its result short
                results = list(pool.map(run, wave)) if pool is not None else [run(j) for j in wave]
                for j, agg in zip(wave, results):
                    part = self.parts[j]
                    if overflow:
                        discarded += part.shape[0]
                        continue
                    room = None if max_reps is None else max_reps - n_reps
                    taken = agg.reps.shape[0] if room is None else min(agg.reps.shape[0], room)
                    cut = room is not None and (agg.reps.shape[0] > room or (agg.reps.shape[0] == room and agg.overflow))
                    local = agg.owner.copy()
                    local[local >= taken] = -1
                    owner[part] = np.where(local >= 0, local + n_reps, -1)
                    reps.append(part[agg.reps[:taken]])
                    weights.append(agg.weights[:taken])
                    discarded += int(np.count_nonzero(local < 0))
                    n_reps += taken
                    overflow = cut
        finally:
            if pool is not None:
                pool.shutdown()
        for j in pending:
            discarded += self.parts[j].shape[0]
        return Aggregation(
            reps=np.concatenate(reps) if reps else np.zeros(0, dtype=np.int64),
            weights=np.concatenate(weights).astype(np.int64) if weights else np.zeros(0, dtype=np.int64),
            owner=owner,
            discarded=discarded,
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

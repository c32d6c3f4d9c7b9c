"""Aggregation (Guo & Li, Algorithm 2): the machines' side of distributed (k,z)-center.

Dense :func:`aggregate` on a distance matrix, and its memory-lean equals: :class:`PointIndex`
(k-d tree neighbour pairs or blocks of distance rows, never the ``[n, n]`` matrix),
:func:`aggregate_points`, :func:`local_extent` (the extent round's numbers) and
:class:`SubMachines` (Appendix B: a machine split into t strided parts, each aggregated as one
machine). Conventions (closed balls, canonical distances, integer weights) as in
:mod:`fedproto.algorithms.kzclustering.solvers`.

References:
    Guo & Li, "Distributed k-Clustering for Data with Heavy Noise", NeurIPS 2018 (arXiv
    1810.07852), Algorithm 2, Section 2 and Appendix B; spec kz-clustering.md 2.2 and 2.7.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import math

import numpy as np
from scipy.spatial import cKDTree

from fedproto.algorithms.kzclustering import _kernels
from fedproto.algorithms.kzclustering.solvers_shared import _BLOCK_ROWS

__all__ = [
    "CANDIDATES",
    "DEFAULT_SUB_MACHINE_POINTS",
    "METHODS",
    "Aggregation",
    "Extent",
    "PointIndex",
    "SubMachines",
    "aggregate",
    "aggregate_points",
    "local_extent",
    "split_sub_machines",
    "sub_machine_count",
]

CANDIDATES = ("all", "uncovered")
"""Where `aggregate` may take a representative from: all of Q (the paper) or only U."""


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
        x, rows = self.points, self.block_rows
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


"""MUFC's server-side clustering and its evaluation losses.

After SCMA the server knows the aggregated count vector ``q`` (bin index -> number of client
points whose local centroid lies in that bin). It turns ``q`` into a point set, either the bin
centres weighted by ``q_j`` ("weighted") or ``q_j`` uniform samples inside each bin's cube
("uniform", the paper's experimental default), and runs full K-means++ (D^2 seeding + Lloyd,
best of ``n_init``) on it. The federated loss charges every client point to the server
centroid of its local centroid's server cluster (the induced assignment of Definition 3.1).

References:
    Pan, Sima, Prakash, Rana, Milenkovic. Machine Unlearning of Federated Clusters (ICLR 2023):
    Sec. 3 (eqs. 1-2, Definition 3.1), Algorithm 1 lines 5-7, App. H (uniform server data), App. I
    (weighted = replicated), App. L; spec mufc.md, sections 0, 1.1, 1.6 and 4.3.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import operator
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedproto.algorithms import kmeans
from fedproto.algorithms.mufc import _kernels
from fedproto.algorithms.mufc.quantize import Grid

__all__ = [
    "SERVER_MODES",
    "PaddedPoints",
    "federated_loss",
    "induced_labels",
    "kmeans_cost",
    "reference_loss",
    "server_points",
    "weighted_kmeans",
]

#: The two ways of turning the aggregated counts into server data (spec 1.6 step 2).
SERVER_MODES = ("weighted", "uniform")


def server_points(
    counts: Mapping[int, int],
    grid: Grid,
    mode: str,
    key: jax.Array,
    *,
    centre_cache: dict[int, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The server data set ``X_s`` built from the aggregated counts ``q``.

    Bins are visited in increasing index order. ``"weighted"``: one point per non-empty bin, its
    centre, with weight ``q_j`` (at most ``K L`` points). ``"uniform"``: ``q_j`` points drawn
    i.i.d. uniformly in the cube of side gamma centred on bin j's centre, each with weight 1
    (``n`` points); the draws come from ``key`` (unused in weighted mode), padded to
    `fedproto.algorithms.kmeans.capacity` rows so that similar totals share a compiled shape.

    Args:
        counts: ``{bin index: q_j}`` with indices in ``[1, grid.n_bins]`` and positive integer
            counts (the decoded SCMA sum).
        grid: the public grid.
        mode: ``"weighted"`` or ``"uniform"``.
        key: a `jax.random` key for the uniform samples.
        centre_cache: optional ``{bin index: centre [d]}`` that this call reads and extends, so
            a server re-clustering after each removal computes only the centres of new bins.

    Returns:
        ``(points, weights)``: ``[m, d]`` float64 and ``[m]`` float64 (integer-valued).
        An empty ``counts`` gives ``[0, d]`` and ``[0]``.

    Raises:
        ValueError: unknown mode, an index outside the grid, or a count that is not a positive
            integer.

    References:
        Pan et al. Algorithm 1 line 6, App. H and App. I; spec mufc.md 1.6 step 2.
    """
    if mode not in SERVER_MODES:
        raise ValueError(f"unknown server mode {mode!r}; choose one of {SERVER_MODES}")
    items = []
    for raw_j, raw_q in counts.items():
        if isinstance(raw_q, bool) or isinstance(raw_j, bool):
            raise ValueError("bin indices and counts must be integers, not bool")
        q = operator.index(raw_q)
        if q < 1:
            raise ValueError(f"bin {raw_j} has count {q}; counts must be positive")
        items.append((operator.index(raw_j), q))
    items.sort()
    if centre_cache is None:
        centres = grid.bin_centres([j for j, _ in items])
    else:
        missing = [j for j, _ in items if j not in centre_cache]
        if missing:
            centre_cache.update(zip(missing, grid.bin_centres(missing), strict=True))
        centres = np.array([centre_cache[j] for j, _ in items], dtype=np.float64).reshape(len(items), grid.d)
    q_arr = np.asarray([q for _, q in items], dtype=np.int64)
    if mode == "weighted":
        return centres, q_arr.astype(np.float64)
    total = int(q_arr.sum())
    if total == 0:
        return np.zeros((0, grid.d)), np.zeros(0)
    base = np.repeat(centres, q_arr, axis=0)
    cap = kmeans.capacity(total)
    jitter = np.asarray(jax.random.uniform(key, (cap, grid.d), jnp.float64, -0.5, 0.5))[:total]
    return base + grid.gamma * jitter, np.ones(total)


def _tolerance(points: np.ndarray, weights: np.ndarray, tol: float) -> float:
    # scikit-learn's rule: tol times the mean per-feature variance, here of the weighted data
    # (= the variance of the replicated multiset, so weighted and replicated runs stop alike).
    # Weighted means and variances as two matrix-vector products (half the time of elementwise
    # products and column sums, which this replaced: a re-clustering per removal computes it).
    total = weights.sum()
    dev = points - (weights @ points) / total
    return float(tol * np.mean((weights @ (dev * dev)) / total))


def weighted_kmeans(
    key: jax.Array,
    points: np.ndarray,
    weights: np.ndarray,
    k: int,
    *,
    n_init: int = 10,
    max_iter: int = 300,
    tol: float = 1e-4,
    min_rows: int = 0,
) -> tuple[np.ndarray, float]:
    """Weighted K-means++: plain weighted D^2 seeding + weighted Lloyd, best of ``n_init`` runs.

    Weights act as multiplicities: the first seed is drawn with probability ``w_j / sum w``,
    later ones with ``w_j d2(x_j, C) / sum w d2``, and Lloyd means are weighted, so the result
    has the distribution of plain K-means++ on the multiset with ``w_j`` copies of ``x_j``
    (App. I). Lloyd stops once the assignment is stable, the total squared centroid shift is at
    most ``tol`` times the mean per-feature (weighted) variance (scikit-learn's rule), or after
    ``max_iter`` iterations; empty clusters keep their centroid. Run r uses
    ``fold_in(key, r)``; the run with the lowest weighted cost wins (ties to the lowest r).

    Fewer than ``k`` distinct points (m' < k): seeding stops after m' seeds, every point sits
    on a centroid (cost 0), and the returned array still has ``k`` rows, the missing ones being
    copies of centroid 0 (they attract no points under the lowest-index tie rule).

    Args:
        key: a `jax.random` key.
        points: ``[m, d]`` float64, finite, ``m >= 1``.
        weights: ``[m]`` positive finite weights (float or int).
        k: number of centroids, ``k >= 1``.
        n_init: number of independent runs, ``>= 1`` (the authors' code: 10; 3 for FEMNIST).
        max_iter: maximum Lloyd iterations per run, ``>= 1`` (code: 300).
        tol: relative tolerance on the centroid shift, ``>= 0``.
        min_rows: pad to at least this many rows (a server that knows its largest point set,
            K * L bins, pads every round alike, so one compiled shape serves the whole run;
            padding rows have weight 0 and change nothing).

    Returns:
        ``(centroids, cost)``: ``[k, d]`` float64 and the weighted cost
        ``sum_j w_j min_i ||x_j - c_i||^2`` (Python float).

    Raises:
        ValueError: empty or non-finite points, weights of the wrong shape or not positive,
            ``k < 1``, ``n_init < 1``, ``max_iter < 1`` or ``tol < 0``.

    References:
        Pan et al. Algorithm 1 line 7, App. I; spec mufc.md 1.6 steps 2-3 and 5.2-5.3.
    """
    return PaddedPoints(points, min_rows=min_rows).weighted_kmeans(
        key, weights, k, n_init=n_init, max_iter=max_iter, tol=tol
    )


class PaddedPoints:
    """Points padded once for `weighted_kmeans` runs with changing weights.

    A server whose support did not change clusters the same bin centres with new counts every
    round: it keeps one :class:`PaddedPoints` (the padded array already on the device) and only
    passes the weights. ``PaddedPoints(points, min_rows=r).weighted_kmeans(key, weights, k, ...)``
    is ``weighted_kmeans(key, points, weights, k, ..., min_rows=r)`` (the same code).

    Skip rule: the object remembers its last seeding (the race of the key, the weights, every
    run's seed rows and what decided each pick, `_kernels.weighted_seeding_margins`). A later
    call with the same key and ``k`` whose weights are nowhere higher has the same seeds when
    every lowered row that some run picked still scores above the runner-up of the step that
    picked it (each pick is the argmax of scores that are monotone in the weights; a lowered row
    that no run picked keeps every pick). Seeding is then skipped and Lloyd starts from the
    remembered seeds: the result is the one a fresh object computes (a single-point removal
    lowers one bin by one, which keeps the seeds unless it takes a pick to its runner-up; then
    it costs Lloyd alone).

    Args:
        points: ``[m, d]`` float64, finite, ``m >= 1`` (copied).
        min_rows: pad to at least this many rows (see `weighted_kmeans`).

    Raises:
        ValueError: empty or non-finite points.

    References:
        Pan et al. Algorithm 1 line 7 and App. I; spec mufc.md 1.6 and 3.7 (exact unlearning).
    """

    def __init__(self, points: np.ndarray, *, min_rows: int = 0) -> None:
        pts = np.array(points, dtype=np.float64)
        if pts.ndim != 2 or pts.shape[0] < 1 or pts.shape[1] < 1:
            raise ValueError(f"points must be a non-empty [m, d] array, got shape {pts.shape}")
        if not np.all(np.isfinite(pts)):
            raise ValueError("points must be finite")
        pts.setflags(write=False)
        self.points = pts
        m = pts.shape[0]
        self.capacity = kmeans.capacity(max(m, operator.index(min_rows)))
        xp = np.zeros((self.capacity, pts.shape[1]))
        xp[:m] = pts
        self._xp = jnp.asarray(xp)
        self._valid = jnp.asarray(np.arange(self.capacity) < m)
        self._seeded: _Seeding | None = None  # the last seeding
        #: Seedings skipped by the rule above, and seedings computed (for tests and reports).
        self.seedings_skipped = self.seedings_run = 0

    def weighted_kmeans(
        self, key: jax.Array, weights: np.ndarray, k: int, *, n_init: int = 10, max_iter: int = 300, tol: float = 1e-4
    ) -> tuple[np.ndarray, float]:
        """`weighted_kmeans` of these points with ``weights`` (same arguments, same result)."""
        pts = self.points
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (pts.shape[0],):
            raise ValueError(f"weights must have shape [{pts.shape[0]}], got {w.shape}")
        if not (np.all(np.isfinite(w)) and np.all(w > 0)):
            raise ValueError("weights must be positive and finite")
        for name, value, low in (("k", k, 1), ("n_init", n_init, 1), ("max_iter", max_iter, 1)):
            if isinstance(value, bool) or operator.index(value) < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not (math.isfinite(tol) and tol >= 0):
            raise ValueError(f"tol must be non-negative, got {tol!r}")
        wp = np.zeros(self.capacity)
        wp[: pts.shape[0]] = w
        race = _seeding_race(key, operator.index(n_init), operator.index(k), self.capacity)
        rows = self._seeds(race, wp, operator.index(k))
        centroids, costs, _ = _kernels.weighted_lloyd_runs(
            self._xp, wp, self._valid, rows, _tolerance(pts, w, tol), operator.index(max_iter)
        )
        costs_h = np.asarray(costs)
        best = int(np.argmin(costs_h))
        return np.asarray(centroids)[best], float(costs_h[best])

    def _seeds(self, race: jax.Array, wp: np.ndarray, k: int) -> jax.Array:
        """Every run's seed rows for padded weights ``wp``: the remembered ones where the skip
        rule holds, else `_kernels.weighted_seeding_margins` (then remembered)."""
        if self._seeded is not None:
            last = self._seeded
            if last.race is race and not np.any(wp > last.weights) and last.picks_hold(wp):
                self.seedings_skipped += 1
                self._seeded = dataclasses.replace(last, weights=wp)
                return last.rows
        rows, factors, runner_up = _kernels.weighted_seeding_margins(race, self._xp, wp, self._valid, k)
        self.seedings_run += 1
        self._seeded = _Seeding(race, wp, rows, np.asarray(rows), np.asarray(factors), np.asarray(runner_up))
        return rows


#: Relative margin by which a lowered pick's recomputed score must beat its step's runner-up: far
#: above any rounding difference between the host's two float64 products and the kernel's.
_PICK_MARGIN = 2.0**-40


@dataclasses.dataclass(frozen=True)
class _Seeding:
    """`PaddedPoints`' last seeding: its race, the weights since (never higher than those it was
    computed with), the seed rows (device and host) and `_kernels.weighted_seeding_margins`'
    factors and runner-up scores."""

    race: jax.Array
    weights: np.ndarray
    rows: jax.Array
    rows_host: np.ndarray
    factors: np.ndarray
    runner_up: np.ndarray

    def picks_hold(self, wp: np.ndarray) -> bool:
        """Whether weights ``wp`` (nowhere higher than `weights`) keep every pick: each lowered
        row that some run picked still scores above its step's runner-up, by `_PICK_MARGIN`.

        Other rows' scores at a step can only have fallen (lower weights, the same earlier seeds
        by induction over the steps), so the runner-up remembered from the computed seeding
        bounds them; a lowered row that no run picked cannot overtake a pick either."""
        lowered = wp < self.weights
        if not lowered.any():
            return True
        picked = self.rows_host >= 0
        runs, steps = np.nonzero(picked & lowered[np.where(picked, self.rows_host, 0)])
        if not runs.size:
            return True
        rows = self.rows_host[runs, steps]
        race = np.asarray(self.race)[runs, steps, rows]  # a view of the device buffer on the CPU
        scores = (wp[rows] * self.factors[runs, steps]) * race
        return bool(np.all(scores > self.runner_up[runs, steps] * (1.0 + _PICK_MARGIN)))


#: Seeding races of recent keys: a server that re-clusters with one key (coupled randomness)
#: draws its race once per padded size instead of once per round.
_RACE_CACHE: collections.OrderedDict[tuple[bytes, int, int, int], jax.Array] = collections.OrderedDict()
_RACE_CACHE_SIZE = 8


#: The last key asked for, held (so its identity cannot be reused), with its race: a server
#: re-clustering with the same key object finds it without reading the key's bits back.
_LAST_RACE: list[tuple[jax.Array, int, int, int, jax.Array]] = []


def _seeding_race(key: jax.Array, n_init: int, k: int, cap: int) -> jax.Array:
    """`_kernels.seeding_race` of ``seeding_keys(key, n_init)``, cached by the key's bits (the
    same key gives the same array object, which `PaddedPoints`'s skip rule relies on)."""
    if _LAST_RACE:
        last_key, *shape, last = _LAST_RACE[0]
        if last_key is key and shape == [n_init, k, cap]:
            return last
    race = _race_by_bits(key, n_init, k, cap)
    _LAST_RACE[:] = [(key, n_init, k, cap, race)]
    return race


def _race_by_bits(key: jax.Array, n_init: int, k: int, cap: int) -> jax.Array:
    raw = jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    ident = (np.asarray(raw).tobytes() + str(key.dtype).encode(), n_init, k, cap)
    race = _RACE_CACHE.get(ident)
    if race is None:
        race = _kernels.seeding_race(kmeans.seeding_keys(key, n_init), k, cap)
        _RACE_CACHE[ident] = race
        while len(_RACE_CACHE) > _RACE_CACHE_SIZE:
            _RACE_CACHE.popitem(last=False)
    else:
        _RACE_CACHE.move_to_end(ident)
    return race


def induced_labels(local_centroids: np.ndarray, grid: Grid, centroids: np.ndarray) -> np.ndarray:
    """The server cluster of each local centroid: nearest server centroid to its bin centre.

    Args:
        local_centroids: ``[K_l, d]`` float64 local centroids of one client.
        grid: the public grid (the server only knows the bin, so the bin centre represents the
            local centroid).
        centroids: ``[K, d]`` float64 server centroids.

    Returns:
        ``[K_l]`` int64 server labels (ties to the lowest index).

    References:
        Pan et al. Definition 3.1; spec mufc.md 1.1 and 1.6 step 4.
    """
    reps = grid.bin_centres(grid.bin_indices(np.asarray(local_centroids, dtype=np.float64).reshape(-1, grid.d)))
    c = np.asarray(centroids, dtype=np.float64)
    sq = np.sum((reps[:, None, :] - c[None, :, :]) ** 2, axis=-1)
    return np.argmin(sq, axis=1).astype(np.int64)


def federated_loss(
    client_x: Sequence[np.ndarray],
    client_centroids: Sequence[np.ndarray],
    client_positions: Sequence[np.ndarray],
    grid: Grid,
    centroids: np.ndarray,
) -> float:
    """The federated objective ``phi_f(X; C_s)`` under the induced assignment (Definition 3.1).

    Each local centroid's bin centre takes the label of its nearest server centroid
    (`induced_labels`); every client point inherits the label of its local cluster and is charged
    its squared distance to that server centroid. So ``phi_f >= phi_c`` for the same centroids.
    (The authors' uniform-mode code labels each point by its own jittered sample instead; here
    the bin centre represents the local centroid in both server modes.)

    Args:
        client_x: per client, points ``[n_l, d]`` float64.
        client_centroids: per client, local centroids ``[K_l, d]`` float64.
        client_positions: per client, ``[n_l]`` ints, the local centroid of each point (as
            returned by `LocalSeeding.assignment`, aligned with ``client_x``).
        grid: the public grid.
        centroids: server centroids ``[K, d]`` float64.

    Returns:
        ``phi_f`` (Python float, squared data units).

    Raises:
        ValueError: sequences of different lengths or misaligned shapes.

    References:
        Pan et al. eq. 2 and Definition 3.1, App. L; spec mufc.md 1.1 and 4.3.
    """
    if not (len(client_x) == len(client_centroids) == len(client_positions)):
        raise ValueError("client_x, client_centroids and client_positions need one entry per client")
    c = np.asarray(centroids, dtype=np.float64)
    total = 0.0
    for x, local, pos in zip(client_x, client_centroids, client_positions, strict=True):
        x = np.asarray(x, dtype=np.float64)
        pos = np.asarray(pos)
        if x.ndim != 2 or pos.shape != (x.shape[0],):
            raise ValueError(f"positions {pos.shape} do not match points {x.shape}")
        if x.shape[0] == 0:
            continue
        local = np.asarray(local, dtype=np.float64)
        if pos.min() < 0 or pos.max() >= local.shape[0]:
            raise ValueError("a position does not name a local centroid")
        labels = induced_labels(local, grid, c)[pos]
        total += float(np.sum((x - c[labels]) ** 2))
    return total


def kmeans_cost(x: np.ndarray, centroids: np.ndarray) -> float:
    """The centralized objective ``phi_c(X; C) = sum_x min_c ||x - c||^2``.

    Args:
        x: ``[n, d]`` float64.
        centroids: ``[K, d]`` float64, ``K >= 1``.

    Returns:
        Python float (squared data units).

    References:
        Pan et al. eq. 1; spec mufc.md 0 and 1.1 (wraps `fedproto.algorithms.kmeans.kmeans_cost`).
    """
    return float(kmeans.kmeans_cost(np.asarray(x, dtype=np.float64), np.asarray(centroids, dtype=np.float64)))


def reference_loss(x: np.ndarray, k: int, seed: int, n_init: int = 10) -> float:
    """``phi_c*``, approximated as the authors do: scikit-learn ``KMeans`` inertia.

    Args:
        x: ``[n, d]`` float64.
        k: number of clusters.
        seed: ``random_state`` of scikit-learn's KMeans.
        n_init: number of restarts (scikit-learn's greedy k-means++ seeding, default settings
            otherwise).

    Returns:
        The best inertia (Python float).

    References:
        Pan et al. Sec. 6 (loss ratio ``phi_f / phi_c*``); spec mufc.md 4.3 and 5.5 item 9.
    """
    from sklearn.cluster import KMeans

    model = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit(np.asarray(x, dtype=np.float64))
    return float(model.inertia_)

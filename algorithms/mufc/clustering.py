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
    "checked_counts",
    "IncrementalKMeans",
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
    items = checked_counts(counts)
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


def checked_counts(counts: Mapping[int, int]) -> list[tuple[int, int]]:
    """The aggregated counts as ``(bin index, q_j)`` pairs in increasing bin order.

    Raises:
        ValueError: a bool index or count, or a count below 1.
        TypeError: an index or count that is not an integer.
    """
    items = []
    for raw_j, raw_q in counts.items():
        if isinstance(raw_q, bool) or isinstance(raw_j, bool):
            raise ValueError("bin indices and counts must be integers, not bool")
        q = operator.index(raw_q)
        if q < 1:
            raise ValueError(f"bin {raw_j} has count {q}; counts must be positive")
        items.append((operator.index(raw_j), q))
    items.sort()
    return items


def _tolerance(points: np.ndarray, weights: np.ndarray, tol: float) -> float:
    # scikit-learn's rule: tol times the mean per-feature variance, here of the weighted data
    # (= the variance of the replicated multiset, so weighted and replicated runs stop alike).
    # np.average's arithmetic (weighted column sums over the sum of the weights), without its
    # argument handling (a tenth of a millisecond per re-clustering).
    w = weights[:, None]
    total = w.sum(axis=0)
    mean = (points * w).sum(axis=0) / total
    var = ((points - mean) ** 2 * w).sum(axis=0) / total
    return float(tol * np.mean(var))


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

    Args:
        points: ``[m, d]`` float64, finite, ``m >= 1`` (copied).
        min_rows: pad to at least this many rows (see `weighted_kmeans`).

    Raises:
        ValueError: empty or non-finite points.
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

    def weighted_kmeans(
        self, key: jax.Array, weights: np.ndarray, k: int, *, n_init: int = 10, max_iter: int = 300, tol: float = 1e-4
    ) -> tuple[np.ndarray, float]:
        """`weighted_kmeans` of these points with ``weights`` (same arguments, same result)."""
        w = self._check_weights(weights)
        _check_run_options(k, n_init, max_iter, tol)
        race = _seeding_race(key, operator.index(n_init), operator.index(k), self.capacity)
        out = _kernels.weighted_kmeans_race(
            race, self._xp, self._padded_weights(w), self._valid, operator.index(k), _tolerance(self.points, w, tol),
            operator.index(max_iter),
        )
        centroids = np.asarray(out["centroids"])
        costs = _run_costs(self.points, w, centroids)
        best = int(np.argmin(costs))
        return centroids[best], float(costs[best])

    def _check_weights(self, weights: np.ndarray) -> np.ndarray:
        pts = self.points
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (pts.shape[0],):
            raise ValueError(f"weights must have shape [{pts.shape[0]}], got {w.shape}")
        if not (np.all(np.isfinite(w)) and np.all(w > 0)):
            raise ValueError("weights must be positive and finite")
        return w

    def _padded_weights(self, w: np.ndarray) -> np.ndarray:
        wp = np.zeros(self.capacity)
        wp[: self.points.shape[0]] = w
        return wp


def _check_run_options(k: int, n_init: int, max_iter: int, tol: float) -> None:
    for name, value, low in (("k", k, 1), ("n_init", n_init, 1), ("max_iter", max_iter, 1)):
        if isinstance(value, bool) or operator.index(value) < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if not (math.isfinite(tol) and tol >= 0):
        raise ValueError(f"tol must be non-negative, got {tol!r}")


def _column_distances(points: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """``[P, m]`` squared distances of every point to each of ``P`` centres (direct differences).

    The one expression every cost goes through, so a column computed alone equals the same
    column computed among all the others, bit for bit."""
    return ((points[None, :, :] - centres[:, None, :]) ** 2).sum(axis=2)


def _run_costs(points: np.ndarray, weights: np.ndarray, centroids: np.ndarray,
               cache: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """Each run's weighted cost ``sum_j w_j min_i ||x_j - c_i||^2``, ``[r]`` float64, computed on the
    host: the winner among the runs is the lowest cost (ties to the lowest run), whichever path
    produced the centroids. ``cache`` (``{"centroids", "distances"}``, read and updated) keeps the
    distance columns of centroids that did not change since the last call."""
    n_runs, k, d = centroids.shape
    flat = centroids.reshape(n_runs * k, d)
    if cache and cache["centroids"].shape == flat.shape:
        dist = cache["distances"]
        stale = np.flatnonzero(np.any(cache["centroids"] != flat, axis=1))
        if stale.size:
            dist[stale] = _column_distances(points, flat[stale])
    else:
        dist = _column_distances(points, flat)
    if cache is not None:
        cache["centroids"], cache["distances"] = flat.copy(), dist
    nearest = dist.reshape(n_runs, k, -1).min(axis=1)
    return (nearest * weights[None, :]).sum(axis=1)


class IncrementalKMeans:
    """`weighted_kmeans` of fixed points under changing weights, reusing the last full run when
    it can prove that a new run would return the same centroids (MUFC's server after removals).

    ``IncrementalKMeans(points, key, k, ...).fit(weights)`` returns exactly what
    ``PaddedPoints(points, min_rows=...)`` clustering with ``key`` returns through this class's
    full path, for every call, whatever came before: the model after a removal equals training
    on the remaining data. What changes is the time.

    A full run (`fedproto.algorithms.mufc._kernels.weighted_kmeans_race` with a trace) records
    every restart's seeds, its Lloyd assignments, sums and masses per iteration and certified
    half-margins per row. A later call whose weights are all positive and none above the recorded
    ones (a removal that emptied no bin) is *certified* instead of re-run when, for every restart:

    * **seeding**: each drawn seed still wins its step's race: its score scales with its weight
      (the distances do not change while the earlier seeds stay), every other score can only
      have fallen, so the seed stays iff ``best * w'/w`` stays above the recorded runner-up;
    * **Lloyd**: each iteration's assignment stays: with the recorded assignments the new sums
      and masses follow exactly (integer points and weights: sums of integers below 2^53 are
      exact in any order), hence the new centroids; if no centroid moved by more than a row's
      half-margin, the triangle inequality keeps the row's nearest centroid, rounding included
      (`_kernels.distance_error`); the few rows of smallest margin are re-checked directly;
    * **stopping**: each iteration's shift stays on the same side of the new tolerance (by a
      relative margin of 10^-9 against rounding).

    Then the new centroids are the recorded trajectory's, recomputed from the exact sums, and
    the winner is chosen by the same host costs as after a full run. Anything else (a weight
    that rose, a bin emptied, a margin too thin, more Lloyd iterations than the trace holds,
    points that are not integers) takes the full path, which records again.

    Args:
        points: ``[m, d]`` float64 (integer-valued for certification: MUFC's server passes its
            bins' lattice coordinates), finite, ``m >= 1``.
        key: the run key (`weighted_kmeans`'s). k, n_init, max_iter, tol: as `weighted_kmeans`.
        min_rows: pad to at least this many rows (see `weighted_kmeans`).
        n_watch: rows re-checked directly per iteration (the smallest half-margins).

    Attributes:
        full_runs: calls that ran every restart from its seeds. certified: calls answered by
            certification, of which ``continued`` re-ran some restarts from their first
            uncertified iteration.

    Raises:
        ValueError: as `weighted_kmeans` (bad points, options, or weights in `fit`).

    References:
        Pan et al. Algorithm 1 line 7 and Sec. 5 (exact unlearning: the model must equal
        retraining); Hamerly, Making k-means even faster (SDM 2010): distance bounds that keep
        an assignment; Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., Sec. 3.1
        (the rounding bound of an inner product).
    """

    def __init__(self, points: np.ndarray, key: jax.Array, k: int, *, n_init: int = 10, max_iter: int = 300,
                 tol: float = 1e-4, min_rows: int = 0, n_watch: int = 16) -> None:
        _check_run_options(k, n_init, max_iter, tol)
        self.padded = PaddedPoints(points, min_rows=min_rows)
        self.k, self.n_init, self.max_iter, self.tol = operator.index(k), operator.index(n_init), operator.index(max_iter), float(tol)
        self.n_watch = operator.index(n_watch)
        self._race = _seeding_race(key, self.n_init, self.k, self.padded.capacity)
        pts = self.padded.points
        self._integral = bool(np.all(pts == np.rint(pts)))
        self._norms = np.sqrt((pts * pts).sum(axis=1))
        self._largest = float(np.abs(pts).max())
        self._trace_len = min(32, self.max_iter)
        self._record: dict[str, np.ndarray] | None = None
        self._cost_cache: dict[str, np.ndarray] = {}
        self.full_runs = self.certified = self.continued = 0
        self._outcomes, self._untraced = 0xFF, 0  # the last eight certifications (1: certified)

    def fit(self, weights: np.ndarray) -> tuple[np.ndarray, float]:
        """The best of ``n_init`` weighted K-means++ runs with these weights.

        Args:
            weights: ``[m]`` positive finite weights.

        Returns:
            ``(centroids, cost)``: ``[k, d]`` float64 (read-only) and the weighted cost.

        Raises:
            ValueError: weights of the wrong shape, not positive or not finite.
        """
        w = self.padded._check_weights(weights)
        tol_abs = _tolerance(self.padded.points, w, self.tol)
        if self._record is not None:
            done = self._certify(w, tol_abs)
            self._outcomes = (self._outcomes << 1 | (done is not None)) & 0xFF
            if done is not None:
                self.certified += 1
                return done
        self.full_runs += 1
        return self._full(w, tol_abs)

    def _worth_tracing(self) -> bool:
        """Record a full run unless the last eight certifications nearly all failed (then one
        full run in eight records, to try again): the trace costs a quarter of a run or more."""
        if bin(self._outcomes).count("1") >= 2:
            return True
        self._untraced += 1
        return self._untraced % 8 == 0

    # ------------------------------------------------------------------------------ full path

    def _traceable(self, w: np.ndarray) -> bool:
        # integer points and weights, sums of |w x| and squared norms below 2^52: exact sums
        return (self._integral and bool(np.all(w == np.rint(w)))
                and float(w.sum()) * max(self._largest, 1.0) < 2.0**52
                and self.padded.points.shape[1] * self._largest**2 < 2.0**52)

    def _kernel(self, w: np.ndarray, tol_abs: float, trace_len: int, start: tuple | None = None,
                runs: int | None = None) -> dict[str, np.ndarray]:
        race = self._race if runs is None else self._race[:runs]  # (continuations draw nothing)
        return jax.device_get(_kernels.weighted_kmeans_race(
            race, self.padded._xp, self.padded._padded_weights(w), self.padded._valid, self.k, tol_abs,
            self.max_iter, trace_len=trace_len, start=start,
        ))

    def _full(self, w: np.ndarray, tol_abs: float) -> tuple[np.ndarray, float]:
        traced = self._traceable(w) and self._worth_tracing()
        out = self._kernel(w, tol_abs, self._trace_len if traced else 0)
        self._record = self._make_record(out, w) if traced else None
        return self._winner(np.asarray(out["centroids"]), w)

    def _winner(self, centroids: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, float]:
        costs = _run_costs(self.padded.points, w, centroids, self._cost_cache)
        best = int(np.argmin(costs))
        out = centroids[best].copy()
        out.setflags(write=False)
        return out, float(costs[best])

    def _make_record(self, out: dict, w: np.ndarray) -> dict[str, np.ndarray] | None:
        """The state certification works from, after a full run (``None``: do not certify).

        Per restart r and Lloyd iteration t (arrays ``[r, L, ...]``, valid for ``t < n_iter[r]``):
        the assignment, its rows' half-margins, the least of them, whether it repeated the
        previous assignment, the sums and masses under the current weights, and the centroids
        it was made with when recorded (``path_rec``: the margins are relative to them) and now
        (``path``)."""
        n_iter = np.asarray(out["n_iter"]).astype(np.int64)
        if int(n_iter.max()) > self._trace_len:  # record more iterations next time
            self._trace_len = min(2 * self._trace_len, self.max_iter)
            return None
        if self._trace_len < self.max_iter and int(n_iter.max()) > self._trace_len // 2:
            self._trace_len = min(2 * self._trace_len, self.max_iter)  # room for continuations
        if np.any(np.asarray(out["n_seeds"]) < self.k):
            return None
        m = self.padded.points.shape[0]
        rows = np.asarray(out["seed_rows"])
        sums = np.asarray(out["sums"])
        margins = np.ascontiguousarray(out["margins"][:, :, :m])
        rec = {
            "n_iter": n_iter, "rows": rows, "seed_weight": w[rows],
            "seed_best": np.asarray(out["seed_best"]), "seed_second": np.asarray(out["seed_second"]),
            "init": self.padded.points[rows], "labels": np.ascontiguousarray(out["labels"][:, :, :m]),
            "margins": margins, "h_min": margins.min(axis=2).astype(np.float64), "stable": np.array(out["stable"]),
            "sums": np.ascontiguousarray(sums[..., :-1]), "mass": np.ascontiguousarray(sums[..., -1]),
            "w": w.copy(), "w_seed": w.copy(),
        }
        path = _trajectory(rec["init"], rec["sums"], rec["mass"], n_iter)
        if not np.array_equal(path[np.arange(len(n_iter)), n_iter], np.asarray(out["centroids"])):
            return None  # the kernel's means are not the host's: never certify
        rec["path_rec"], rec["path"] = path, path
        return rec

    # ------------------------------------------------------------------------------ certified path

    def _certify(self, w: np.ndarray, tol_abs: float) -> tuple[np.ndarray, float] | None:
        """The full path's result for ``w`` without running it, or ``None`` if not provable."""
        rec = self._record
        assert rec is not None
        if not self._traceable(w):
            return None
        n_iter = rec["n_iter"]
        n_runs = len(n_iter)
        runs = np.arange(n_runs)
        change = np.flatnonzero(w != rec["w"])
        if change.size == 0:
            return self._winner(rec["path"][runs, n_iter], w)
        # seeding: each drawn seed keeps its step iff its score, which scales with its weight,
        # stays above the runner-up, whose score cannot have risen (1e-12: two roundings)
        if np.any(w[change] > rec["w_seed"][change]):
            return None
        if not np.all(rec["seed_best"] * (w[rec["rows"]] / rec["seed_weight"]) * (1.0 - 1e-12) > rec["seed_second"]):
            return None
        # Lloyd: the recorded assignments' sums and masses under the new weights (exact, so
        # updating the current ones equals recomputing them), hence the centroids
        span = int(n_iter.max())
        grid = np.arange(span)
        sums, mass = rec["sums"].copy(), rec["mass"].copy()
        pts = self.padded.points
        for j in change.tolist():
            gone = rec["w"][j] - w[j]
            a = rec["labels"][:, :span, j]
            sums[runs[:, None], grid[None, :], a] -= gone * pts[j]
            mass[runs[:, None], grid[None, :], a] -= gone
        path = rec["path"].copy()
        path[:, : span + 1] = _trajectory(rec["init"], sums[:, :span], mass[:, :span], n_iter)
        with np.errstate(invalid="ignore", over="ignore"):  # slots past a run's end hold leftovers
            first_bad = self._first_uncertified(rec, path, tol_abs, span)
        if np.all(first_bad < 0):
            rec.update(w=w.copy(), sums=sums, mass=mass, path=path)
            return self._winner(path[runs, n_iter], w)
        if np.count_nonzero(first_bad >= 0) > 2:  # re-running most restarts: as dear as a full run
            return None
        return self._continue(rec, w, tol_abs, sums, mass, path, first_bad)

    def _continue(self, rec: dict, w: np.ndarray, tol_abs: float, sums: np.ndarray, mass: np.ndarray,
                  path: np.ndarray, first_bad: np.ndarray) -> tuple[np.ndarray, float] | None:
        """Re-run the restarts whose trajectory may change from their first uncertified iteration
        (one or two: more cost as much as a full run), then certify that the
        re-run iterations are unambiguous: positive margins (any evaluation within the rounding
        bound assigns alike; iteration 0 assigns to integer seeds, exactly) and shifts clear of
        the tolerance."""
        n_runs, length = mass.shape[:2]
        m = self.padded.points.shape[0]
        which = np.flatnonzero(first_bad >= 0)
        labels, margins, h_min = rec["labels"].copy(), rec["margins"].copy(), rec["h_min"].copy()
        stable, path_rec, n_iter = rec["stable"].copy(), rec["path_rec"].copy(), rec["n_iter"].copy()
        for group in (which,):  # (at most two restarts)
            batch = group.size
            start_at = first_bad[group].astype(np.int32)
            prev = np.full((batch, self.padded.capacity), -1, np.int32)
            later = start_at >= 1
            prev[later, :m] = rec["labels"][group[later], start_at[later] - 1]
            # trace about twice the iterations the runs had left (an idle scan step costs too);
            # all the record holds if that was too few
            left = 2 * int((rec["n_iter"][group] - start_at).max()) + 4
            start = (path[group, start_at], prev, start_at, np.zeros(batch, bool))
            for trace_len in (min(next(size for size in (8, 16, 32, 64, 128, 256, 512) if size >= left), length),
                              length):
                out = self._kernel(w, tol_abs, trace_len, start=start, runs=batch)
                n_new = np.asarray(out["n_iter"]).astype(np.int64)
                if int((n_new - start_at).max()) <= trace_len:
                    break
            if int(n_new.max()) > length:
                return None
            new_sums = np.asarray(out["sums"])
            for b, r in enumerate(group.tolist()):
                lo, hi = int(start_at[b]), int(n_new[b])
                fresh = slice(0, hi - lo)
                labels[r, lo:hi] = out["labels"][b, fresh, :m]
                margins[r, lo:hi] = out["margins"][b, fresh, :m]
                h_min[r, lo:hi] = margins[r, lo:hi].min(axis=1)
                if np.any(h_min[r, max(lo, 1):hi] <= 0):
                    return None
                stable[r, lo:hi] = out["stable"][b, fresh]
                sums[r, lo:hi] = new_sums[b, fresh, :, :-1]
                mass[r, lo:hi] = new_sums[b, fresh, :, -1]
                n_iter[r] = hi
                path[r, lo:hi + 1] = _trajectory(path[r:r + 1, lo], sums[r:r + 1, lo:hi], mass[r:r + 1, lo:hi],
                                                 np.array([hi - lo]))[0]
                if not np.array_equal(path[r, hi], out["centroids"][b]):
                    return None
                path_rec[r, lo:] = path[r, lo:]
                with np.errstate(invalid="ignore", over="ignore"):
                    shift = ((path[r, lo + 1:hi + 1] - path[r, lo:hi]) ** 2).sum(axis=(1, 2))
                if np.any(np.abs(shift - tol_abs) <= 1e-9 * tol_abs):
                    return None
        rec.update(w=w.copy(), sums=sums, mass=mass, path=path, path_rec=path_rec, labels=labels,
                   margins=margins, h_min=h_min, n_iter=n_iter, stable=stable)
        self.continued += 1
        return self._winner(path[np.arange(n_runs), n_iter], w)

    def _first_uncertified(self, rec: dict, path: np.ndarray, tol_abs: float, span: int) -> np.ndarray:
        """Per run, the first iteration whose assignment or stopping decision is not certified to
        stay as recorded with the centroids ``path`` (-1: none)."""
        n_iter = rec["n_iter"]
        steps = np.arange(span)
        diff = path[:, :span] - rec["path_rec"][:, :span]
        drift = np.sqrt((diff * diff).sum(axis=3)).max(axis=2)
        moving = (steps[None, :] >= 1) & (steps[None, :] < n_iter[:, None]) & (drift > 0)
        bad = moving & (drift > 1.0)
        near = moving & ~bad & (drift > rec["h_min"][:, :span])
        if near.any():
            runs, slots = np.nonzero(near)
            keep = self._rows_keep(rec, path, runs, slots, drift[runs, slots])
            bad[runs[~keep], slots[~keep]] = True
        step = path[:, 1:span + 1] - path[:, :span]
        shift = (step * step).sum(axis=(2, 3))
        last = steps[None, :] == (n_iter[:, None] - 1)
        running = steps[None, :] < (n_iter[:, None] - 1)
        bad |= running & ~(shift > tol_abs * (1.0 + 1e-9))
        by_shift = last & ~rec["stable"][:, :span] & (n_iter[:, None] < self.max_iter)
        bad |= by_shift & ~(shift <= tol_abs * (1.0 - 1e-9))
        return np.where(bad.any(axis=1), bad.argmax(axis=1), -1)

    def _rows_keep(self, rec: dict, path: np.ndarray, runs: np.ndarray, slots: np.ndarray,
                   drift: np.ndarray) -> np.ndarray:
        """For each (run, iteration), whether every row whose half-margin is below the drift keeps
        its recorded nearest centroid: checked directly, with four rounding bounds to spare
        (the host's distances and the kernel's each within one)."""
        keep = np.ones(len(runs), dtype=bool)
        f_idx, rows = np.nonzero(rec["margins"][runs, slots] < drift[:, None])
        if not f_idx.size:
            return keep
        x = self.padded.points[rows]  # [P, d]
        c = path[runs[f_idx], slots[f_idx]]  # [P, k, d]
        dist = ((x[:, None, :] - c) ** 2).sum(axis=2)  # [P, k]
        labels = rec["labels"][runs[f_idx], slots[f_idx], rows]
        pick = np.arange(len(rows))
        own = dist[pick, labels]
        dist[pick, labels] = np.inf
        c_norm = np.sqrt((c * c).sum(axis=2)).max(axis=1)
        e = _kernels.distance_error(x.shape[1]) * (self._norms[rows] + c_norm + 1.0) ** 2
        np.logical_and.at(keep, f_idx, own + 4.0 * e < dist.min(axis=1))
        return keep


def _repeats(labels: np.ndarray) -> np.ndarray:
    """``[r, L]``: whether each iteration's assignment equals the previous one (False at 0)."""
    out = np.zeros(labels.shape[:2], dtype=bool)
    out[:, 1:] = np.all(labels[:, 1:] == labels[:, :-1], axis=2)
    return out


def _trajectory(init: np.ndarray, sums: np.ndarray, mass: np.ndarray, n_iter: np.ndarray) -> np.ndarray:
    """Lloyd's centroids per iteration from its sums and masses: ``[r, T + 1, k, d]`` with
    ``path[:, 0] = init`` and ``path[:, t + 1] = sums[:, t] * (1 / mass[:, t])`` (the previous
    centroid where the mass is 0), the kernel's arithmetic, for ``t < n_iter[r]`` (later slots
    hold whatever the leftover sums give)."""
    n_runs, span = mass.shape[:2]
    path = np.empty((n_runs, span + 1) + init.shape[1:])
    path[:, 0] = init
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        path[:, 1:] = sums * (1.0 / mass)[..., None]
    empty = (mass <= 0) & (np.arange(span)[None, :] < n_iter[:, None])[..., None]
    if empty.any():
        for t in range(span):
            gap = empty[:, t]
            path[:, t + 1][gap] = path[:, t][gap]
    return path


#: Seeding races ``exp(noise)`` of recent keys: a server that re-clusters with one key (coupled
#: randomness) draws its noise once per padded size instead of once per round.
_NOISE_CACHE: collections.OrderedDict[tuple[bytes, int, int, int], jax.Array] = collections.OrderedDict()
_NOISE_CACHE_SIZE = 8


#: The last key asked for, held (so its identity cannot be reused), with its noise: a server
#: re-clustering with the same key object finds it without reading the key's bits back.
_LAST_NOISE: list[tuple[jax.Array, int, int, int, jax.Array]] = []


def _seeding_race(key: jax.Array, n_init: int, k: int, cap: int) -> jax.Array:
    """``exp(_kernels.seeding_noise(seeding_keys(key, n_init)))``, cached by the key's bits."""
    if _LAST_NOISE:
        last_key, *shape, last = _LAST_NOISE[0]
        if last_key is key and shape == [n_init, k, cap]:
            return last
    noise = _noise_by_bits(key, n_init, k, cap)
    _LAST_NOISE[:] = [(key, n_init, k, cap, noise)]
    return noise


def _noise_by_bits(key: jax.Array, n_init: int, k: int, cap: int) -> jax.Array:
    raw = jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    ident = (np.asarray(raw).tobytes() + str(key.dtype).encode(), n_init, k, cap)
    noise = _NOISE_CACHE.get(ident)
    if noise is None:
        noise = jnp.exp(_kernels.seeding_noise(kmeans.seeding_keys(key, n_init), k, cap))
        _NOISE_CACHE[ident] = noise
        while len(_NOISE_CACHE) > _NOISE_CACHE_SIZE:
            _NOISE_CACHE.popitem(last=False)
    else:
        _NOISE_CACHE.move_to_end(ident)
    return noise


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

"""One MUFC client's local model: K-means++ seeds, cluster sizes, and exact unlearning.

A client runs plain K-means++ (D^2) seeding on its data, keeps the seeds as point ids in
selection order, assigns every point to its nearest seed (ties to the lowest position) and
reports the cluster sizes per grid bin (the count vector ``q^(l)`` that SCMA aggregates). A
removal request runs Algorithm 3: if no seed is removed the seeds stay (only the sizes of the
removed points' clusters drop, without any random draw); otherwise the seeds before the first
removed one are kept and the rest are re-drawn on the remaining data, which has exactly the
distribution of seeding from scratch (Lemma 5.1).

Randomness. Step s of the seeding draws with its own key ``key_s`` (initially
``fold_in(key, s)``), and each draw is a Gumbel-max over ``fold_in(key_s, point id)``
(`fedproto.algorithms.kmeans.kmeanspp_seeding`). Because a step's argmax does not change when a point
that it did not choose disappears, the model is at every moment **the seeding of the current
data with the current per-step keys**. A removal with ``key=None`` keeps the keys (coupled
randomness: the result equals ``LocalSeeding(x_remaining, ids_remaining, k, key)`` bit for bit,
the exact-replay property used for testing and for deterministic runs); a removal with a fresh
key replaces the keys of the re-drawn steps, which gives an independent draw for those steps
(distributional exactness, Lemma 5.1, for removal requests that do not depend on the keys).

This class is local state, not a protocol machine: no I/O, no clocks, no global randomness.

References:
    Pan, Sima, Prakash, Rana, Milenkovic. Machine Unlearning of Federated Clusters (ICLR 2023):
    Algorithm 1 lines 2-4, App. B (K-means++), Algorithm 3, Lemma 5.1, Theorem 5.4, App. M.3;
    spec mufc.md, sections 1.3, 3.2, 3.3, 3.4 and 3.7.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedproto.algorithms import kmeans
from fedproto.algorithms.mufc import _kernels
from fedproto.algorithms.mufc.quantize import Grid

__all__ = ["LocalSeeding", "RemovalOutcome"]

_ID_LIMIT = 2**32


@dataclasses.dataclass(frozen=True)
class RemovalOutcome:
    """What one removal request did at the client.

    Attributes:
        reseeded: True iff a seed was removed and positions ``first_position..k-1`` were re-drawn
            (Algorithm 3 step 3).
        first_position: 0-based position in the previous ``seeds`` of the first removed seed
            (Algorithm 3's ``t``, 1-based there), or ``None`` if no seed was removed.
        n_removed: number of points removed.
        distance_evaluations: point-to-centroid squared-distance evaluations over the remaining
            points that the request performed (the work counter of Theorem 5.4): 0 when no seed
            is hit in seeding-only mode (sizes come from the stored assignment), ``n' * K'`` for a
            re-seeding (each of the ``K'`` seeds, kept or new, is compared with all ``n'``
            remaining points once; the assignment comes from the same pass), plus
            ``n' * K' * (iterations + 1)`` for Lloyd in the complete-training variant.
        retrained: True iff the local centroids and sizes were recomputed from the remaining data
            (a re-seeding, or any removal when ``lloyd_iterations > 0``); False means only the
            sizes of the removed points' clusters were decremented.

    References:
        Pan et al. Algorithm 3, Lemma F.1 and Theorem 5.4; spec mufc.md 3.2 and 3.4, oracle 23.
    """

    reseeded: bool
    first_position: int | None
    n_removed: int
    distance_evaluations: int
    retrained: bool = False


def _check_key(key: object) -> jax.Array:
    if not isinstance(key, jax.Array):
        raise TypeError(f"key must be a jax.random key, got {type(key).__name__}")
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise TypeError(f"key must be a single key, got a key array of shape {key.shape}")
    elif key.dtype != jnp.uint32 or key.shape != (2,):
        raise TypeError("key must be a typed key (jax.random.key) or a raw uint32[2] key (PRNGKey)")
    return key


class LocalSeeding:
    """K-means++ seeding of one client's data, with exact unlearning (Algorithm 3).

    Args:
        x: the client's points ``[n_l, d]`` float64 (finite; in the shared box for quantization).
        ids: ``[n_l]`` stable integer point ids, unique, ``0 <= id < 2^32``; removal requests name
            points by id, and the random draws are keyed by id.
        k: number of seeds ``K >= 1`` (fewer are chosen if the data have fewer distinct points).
        key: the seeding key (`jax.random.key` or a raw ``PRNGKey``).
        lloyd_iterations: 0 (default) for the paper's seeding-only clients: the local centroids
            are the seed points. ``T > 0`` for the complete-client-training variant (App. M.3):
            after seeding, up to ``T`` Lloyd iterations (stopping early once the assignment is
            stable) turn the centroids into cluster means, and every removal retrains (the seeds
            by Algorithm 3, then Lloyd from them on the remaining data).

    Attributes:
        n: number of remaining points ``n_l``.
        k: the requested number of seeds.
        d: dimension.
        lloyd_iterations: as given.

    Raises:
        ValueError: empty data, wrong shapes, non-finite values, ids not unique or out of range,
            ``k < 1`` or ``lloyd_iterations < 0``.
        TypeError: ``key`` is not a single JAX key, or ids are not integers.

    References:
        Pan et al. ICLR 2023, Algorithm 1 lines 2-3, App. B, App. M.3; spec mufc.md 1.3 steps 1-2
        and 3.7.
    """

    def __init__(
        self, x: np.ndarray, ids: np.ndarray, k: int, key: jax.Array, *, lloyd_iterations: int = 0
    ) -> None:
        points = np.asarray(x, dtype=np.float64)
        if points.ndim != 2 or points.shape[0] < 1 or points.shape[1] < 1:
            raise ValueError(f"x must be a non-empty [n, d] array, got shape {points.shape}")
        if not np.all(np.isfinite(points)):
            raise ValueError("x must be finite")
        id_arr = np.asarray(ids)
        if id_arr.ndim != 1 or id_arr.shape[0] != points.shape[0]:
            raise ValueError(f"ids must have shape [{points.shape[0]}], got {id_arr.shape}")
        if id_arr.dtype.kind not in "iu":
            raise TypeError(f"ids must be integers, got dtype {id_arr.dtype}")
        if id_arr.size and (int(id_arr.min()) < 0 or int(id_arr.max()) >= _ID_LIMIT):
            raise ValueError("ids must lie in [0, 2^32)")
        if np.unique(id_arr).size != id_arr.size:
            raise ValueError("ids must be unique")
        if isinstance(k, bool) or operator.index(k) < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        if isinstance(lloyd_iterations, bool) or operator.index(lloyd_iterations) < 0:
            raise ValueError(f"lloyd_iterations must be a non-negative int, got {lloyd_iterations!r}")
        key = _check_key(key)

        self.k = operator.index(k)
        self.d = int(points.shape[1])
        self.lloyd_iterations = operator.index(lloyd_iterations)
        self.n = int(points.shape[0])
        self._xp, self._ip, valid = kmeans.pad_rows(points, id_arr.astype(np.uint32))
        self._x_host = np.asarray(self._xp)
        self._ids_host = np.zeros(self._x_host.shape[0], dtype=np.int64)
        self._ids_host[: self.n] = id_arr
        self._valid = np.asarray(valid).copy()
        self._row_of = {int(i): r for r, i in enumerate(id_arr.tolist())}
        self._step_keys = kmeans.seeding_keys(key, self.k)
        self._bins: tuple[Grid, np.ndarray, list[int]] | None = None  # `counts`' last grid, centroids, bins

        # Training is Algorithm 3's re-seeding from position 0 (no seeds yet), so training and
        # removals share one compiled kernel per padded shape.
        no_seeds = jnp.full((self.k,), -1, jnp.int32)
        rows, count, positions, _, _ = _kernels.unlearn_seeding(
            self._step_keys, self._xp, self._ip, valid, no_seeds, 0, self.k
        )
        rows_h, count_h, positions_h = np.asarray(rows), int(count), np.asarray(positions)
        centroids = self._x_host[rows_h[:count_h]]
        if self.lloyd_iterations:
            centroids, positions_h, _ = self._lloyd(rows_h, count_h, self._valid)
        self._commit(self._valid, rows_h, count_h, positions_h, centroids, self._step_keys)

    # ------------------------------------------------------------------ state

    def _lloyd(self, rows: np.ndarray, count: int, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        active = rows >= 0
        init = self._xp[jnp.asarray(np.where(active, rows, rows[0]))]
        centroids, positions, _, n_iter = _kernels.weighted_lloyd(
            self._xp, jnp.asarray(valid, jnp.float64), init, jnp.asarray(active), 0.0, self.lloyd_iterations
        )
        return np.asarray(centroids)[:count], np.asarray(positions), int(n_iter)

    def _commit(
        self,
        valid: np.ndarray,
        rows: np.ndarray,
        count: int,
        positions: np.ndarray,
        centroids: np.ndarray,
        step_keys: jax.Array,
    ) -> None:
        self._valid = valid
        self._rows = rows
        self._count = count
        # each seed's row -> its position (the lowest, were a row chosen twice): a removal finds
        # the first removed seed without array operations
        self._seed_position = {r: i for i, r in reversed(list(enumerate(rows[:count].tolist())))}
        self._positions = np.where(valid, positions, 0).astype(np.int64)
        self._step_keys = step_keys
        self.n = int(valid.sum())
        self.seeds: tuple[int, ...] = tuple(int(i) for i in self._ids_host[rows[:count]])
        self.centroids: np.ndarray = np.array(centroids, dtype=np.float64, copy=True)
        self.centroids.setflags(write=False)
        sizes = np.bincount(self._positions[valid], minlength=count)
        self.sizes: tuple[int, ...] = tuple(int(s) for s in sizes[:count])

    # ------------------------------------------------------------------ queries

    def assignment(self) -> tuple[np.ndarray, np.ndarray]:
        """The local clustering of the remaining points.

        Returns:
            ``(ids, positions)``: ``[n_l]`` int64 point ids (in the order the points were given)
            and ``[n_l]`` int64 positions into ``seeds``/``centroids`` of each point's nearest
            local centroid (ties to the lowest position).

        References:
            Pan et al. Algorithm 1 line 3 (local clustering); spec mufc.md 1.3 step 2.
        """
        return self._ids_host[self._valid].copy(), self._positions[self._valid].copy()

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """The remaining points: ``([n_l] int64 ids, [n_l, d] float64 x)`` in the given order."""
        return self._ids_host[self._valid].copy(), self._x_host[self._valid].copy()

    def counts(self, grid: Grid) -> dict[int, int]:
        """The client's count vector ``q^(l)`` as a sparse map ``{bin index: count}``.

        Each local centroid is quantized to its bin (`Grid.bin_indices`) and its cluster size is
        added to that bin; sizes are **added** when several centroids share a bin. Bins with a
        zero count (possible only for an empty Lloyd cluster) are left out. The values sum to
        ``n``.

        Args:
            grid: the public grid (its ``d`` must equal the data's).

        Returns:
            ``{j: q_j}`` with Python-int keys in ``[1, grid.n_bins]`` and positive int values.

        Raises:
            ValueError: the grid's dimension differs from the data's.

        References:
            Pan et al. Algorithm 1 lines 3-4; spec mufc.md 1.3 steps 3-4 and oracle 11.
        """
        if grid.d != self.d:
            raise ValueError(f"grid has d = {grid.d}, the data have d = {self.d}")
        cached = self._bins
        if cached is None or cached[0] is not grid or cached[1] is not self.centroids:
            # the centroids (read-only) change only with the seeds: a removal that moves no
            # seed reuses their bins
            cached = self._bins = (grid, self.centroids, grid.bin_indices(self.centroids))
        q: dict[int, int] = {}
        for j, size in zip(cached[2], self.sizes, strict=True):
            if size > 0:
                q[j] = q.get(j, 0) + size
        return q

    # ------------------------------------------------------------------ unlearning

    def remove(self, ids: Sequence[int], *, key: jax.Array | None = None) -> RemovalOutcome:
        """Unlearn a batch of points (Algorithm 3 and the client follow-up of spec 3.2).

        No removed seed: the seeds are unchanged, no random number is drawn (``key`` is not
        used) and each removed point's cluster shrinks by one. Otherwise, with ``t`` the first
        position holding a removed seed, seeds ``0..t-1`` are kept and positions ``t..k-1`` are
        re-drawn by D^2 sampling on the remaining points, which are then reassigned. With
        ``lloyd_iterations > 0`` every removal also reruns Lloyd from the (possibly unchanged)
        seeds on the remaining points.

        Args:
            ids: ids of the points to remove (one request; at least one id).
            key: ``None`` for coupled randomness: the re-drawn steps reuse their training keys,
                so the new model equals ``LocalSeeding(x_remaining, ids_remaining, k, key)`` of
                the original key exactly. A fresh key (same kind as the training key): the
                re-drawn steps use ``fold_in(key, s)`` instead, an independent draw whose
                distribution is that of seeding from scratch on the remaining data (Lemma 5.1).

        Returns:
            The `RemovalOutcome`.

        Raises:
            KeyError: an id that is unknown or already removed.
            ValueError: an empty request, an id repeated within the request, or a request that
                would leave no point.
            TypeError: a non-integer id, or a key that is not a single key of the training
                key's kind.

        A failed request changes nothing.

        References:
            Pan et al. ICLR 2023, Algorithm 3, Lemma 5.1, Lemma F.1, App. M.3 and M.5 (batch
            removal); spec mufc.md 3.2, 3.3, 3.6 and 3.7.
        """
        request: list[int] = []
        for raw in ids:
            if isinstance(raw, bool):
                raise TypeError("point ids must be integers, not bool")
            request.append(operator.index(raw))
        if not request:
            raise ValueError("a removal request must name at least one point")
        rows = []
        for i in request:
            row = self._row_of.get(i)
            if row is None or not self._valid[row]:
                raise KeyError(i)
            rows.append(row)
        if len(set(request)) != len(request):
            raise ValueError("a removal request names a point more than once")
        if self.n - len(request) < 1:
            raise ValueError(f"removing {len(request)} of {self.n} points would leave no data")
        fresh_keys = None
        if key is not None:
            key = _check_key(key)
            if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) != jax.dtypes.issubdtype(
                self._step_keys.dtype, jax.dtypes.prng_key
            ):
                raise TypeError("the removal key must be of the same kind (typed or raw) as the training key")

        hits = [self._seed_position[r] for r in rows if r in self._seed_position]
        first = min(hits) if hits else None  # the first removed seed's position (Algorithm 3's t)

        if first is None and not self.lloyd_iterations:
            # seeds, centroids and keys stay; the removed points leave their clusters (the state
            # `_commit` would compute from the same positions, updated in place of recounted; a
            # request names few points, so element by element beats array operations)
            valid, positions = self._valid.copy(), self._positions.copy()
            sizes = list(self.sizes)
            for row in rows:
                sizes[positions[row]] -= 1
                valid[row] = False
                positions[row] = 0
            self._valid, self._positions, self.sizes = valid, positions, tuple(sizes)
            self.n -= len(rows)
            return RemovalOutcome(False, None, len(request), 0, retrained=False)

        valid = self._valid.copy()
        valid[rows] = False
        n_new = self.n - len(rows)  # every removed row was valid (checked above)
        rows_h, count_h, positions_h = self._rows, self._count, self._positions
        step_keys = self._step_keys
        evaluations = 0
        if first is not None:
            if key is not None:
                fresh_keys = kmeans.seeding_keys(key, self.k)
            use = self._step_keys if fresh_keys is None else fresh_keys
            new_rows, new_count, positions, _, _ = _kernels.unlearn_seeding(
                use, self._xp, self._ip, jnp.asarray(valid), jnp.asarray(self._rows), self._count, self.k
            )
            rows_h, count_h, positions_h = np.asarray(new_rows), int(new_count), np.asarray(positions)
            if fresh_keys is not None:
                step_keys = jnp.concatenate([self._step_keys[:first], fresh_keys[first:]])
            evaluations += n_new * count_h
        centroids = self._x_host[rows_h[:count_h]]
        if self.lloyd_iterations:
            centroids, positions_h, n_iter = self._lloyd(rows_h, count_h, valid)
            evaluations += n_new * count_h * (n_iter + 1)
        self._commit(valid, rows_h, count_h, positions_h, centroids, step_keys)
        return RemovalOutcome(first is not None, first, len(request), evaluations, retrained=True)

"""Pure kernels of MUFC: exact unlearning of k-means++ seeds and weighted Lloyd / K-means++.

Every kernel is `jax.jit`-compiled at module level; ``k`` is static, everything else is traced.
Points travel padded to `fedproto.algorithms.kmeans.capacity` rows with a validity mask, so removals
(which only clear validity bits) and re-clustering after them reuse compiled shapes. Seeding is
the shared coupling-friendly Gumbel-max k-means++ of `fedproto.algorithms.kmeans` (draws keyed by
``(step key, point id)``), so re-running a step on data without a point that was never chosen
reproduces the step's draw exactly.

Dtypes: float64 throughout (``algorithms`` enables JAX's 64-bit mode): costs are sums of up to
~10^5 squared distances and the weighted-versus-replicated equivalence is checked to ~1e-12;
positions and rows are int32.

References:
    Pan, Sima, Prakash, Rana, Milenkovic. Machine Unlearning of Federated Clusters (ICLR 2023):
    Algorithm 1 (lines 2-3 client seeding, lines 6-7 server K-means++), Algorithm 3 and Lemma 5.1
    (unlearning), App. I (weighted = replicated), App. M.3 (complete client training);
    spec mufc.md, sections 1.3, 1.6, 3.2, 3.3 and 3.7.
    Lloyd. Least squares quantization in PCM. IEEE Trans. Inf. Theory 28(2), 1982.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fedproto.algorithms import kmeans

__all__ = ["first_removed_position", "unlearn_seeding", "weighted_kmeans_runs", "weighted_lloyd"]


@jax.jit
def first_removed_position(rows: jax.Array, count: jax.Array, valid: jax.Array) -> jax.Array:
    """The first seed position whose row is no longer valid (``count`` if there is none).

    Args:
        rows: ``[k]`` int32 seed rows in selection order (-1 after ``count``).
        count: int32 number of seeds.
        valid: ``[c]`` bool validity after the removal.

    Returns:
        int32 scalar ``t`` in ``[0, count]``: the 0-based position of Algorithm 3's first removed
        seed, or ``count`` when no seed was removed.

    References:
        Pan et al. Algorithm 3 line 2 (``t`` = smallest position with ``c_t`` in ``X_R``); spec
        mufc.md 3.2 step 2.
    """
    positions = jnp.arange(rows.shape[0])
    hit = (positions < count) & ~valid[jnp.clip(rows, 0, valid.shape[0] - 1)]
    return jnp.where(jnp.any(hit), jnp.argmax(hit), count).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("k",))
def unlearn_seeding(
    step_keys: jax.Array,
    x: jax.Array,
    ids: jax.Array,
    valid: jax.Array,
    rows: jax.Array,
    count: jax.Array,
    k: int,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """Algorithm 3: keep the seeds before the first removed one, re-draw the rest on ``X'``.

    With ``t`` = `first_removed_position`, the prefix ``rows[:t]`` is kept (its D^2 weights are
    rebuilt on the remaining rows) and positions ``t..k-1`` are drawn by D^2 sampling on the
    remaining rows with ``step_keys[t:]``; the keys of the kept positions are not used. Passing
    the stack used in training gives exactly the seeds of training from scratch on ``X'`` with
    that stack (no kept seed was removed, so no kept step's argmax changes); a stack drawn
    independently of everything gives an independent draw with the distribution of k-means++ on
    ``X'`` (Lemma 5.1). With ``count = 0`` (``rows`` all -1) nothing is kept: this is plain
    k-means++ seeding, i.e. training.

    Args:
        step_keys: ``[k]`` per-step keys (`fedproto.algorithms.kmeans.seeding_keys`).
        x: ``[c, d]`` float64 padded points.
        ids: ``[c]`` uint32 stable point ids.
        valid: ``[c]`` bool validity **after** the removal (at least one row valid).
        rows: ``[k]`` int32 seed rows of the model being unlearned (-1 after ``count``).
        count: int32 number of those seeds.
        k: number of seeds (static).

    Returns:
        ``(rows', count', positions, sq_dist, t)``: the new seed rows and count, each row's
        nearest seed position and squared distance (0 on invalid rows), and ``t`` (int32; equal
        to ``count`` when no seed was removed, in which case ``rows' = rows``: with ``count < k``
        every remaining row already has D^2 weight 0).

    References:
        Pan et al. ICLR 2023, Algorithm 3 and Lemma 5.1 (App. E); spec mufc.md 3.2 and 3.3.
    """
    t = first_removed_position(rows, count, valid)
    new_rows, new_count, positions, sq = kmeans.kmeanspp_seed_and_assign(
        step_keys, x, ids, valid, k, prefix=rows, start=t
    )
    return new_rows, new_count, positions, sq, t


@jax.jit
def weighted_lloyd(
    x: jax.Array,
    weights: jax.Array,
    init: jax.Array,
    active: jax.Array,
    tol_abs: float | jax.Array,
    max_iter: int | jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Weighted Lloyd iterations until the assignment is stable, the centroid shift is small, or
    ``max_iter`` iterations.

    One iteration assigns every row to its nearest active centroid (ties to the lowest index) and
    moves each active centroid to the weighted mean ``sum w x / sum w`` of its rows; a centroid
    with zero weight stays where it is. The loop stops after an iteration whose assignment equals
    the previous one (the means then no longer move), or whose total squared shift is at most
    ``tol_abs`` (scikit-learn's rule), or after ``max_iter`` iterations. Weights act as
    multiplicities: rows ``(x_j, w_j)`` give exactly the centroids of plain Lloyd on the
    multiset with ``w_j`` copies of ``x_j`` (up to the order of floating-point sums).

    Args:
        x: ``[c, d]`` float64 padded points.
        weights: ``[c]`` float64 non-negative weights (0 on padding and removed rows).
        init: ``[k, d]`` float64 initial centroids (finite on every row).
        active: ``[k]`` bool; inactive rows attract no points and are returned unchanged.
        tol_abs: absolute tolerance on the total squared centroid shift (``>= 0``; 0 stops only
            on a stable assignment or ``max_iter``).
        max_iter: maximum number of iterations (``>= 0``).

    Returns:
        ``(centroids, positions, cost, n_iter)``: ``[k, d]`` float64 centroids; ``[c]`` int32
        nearest active centroid of each row for the returned centroids; the weighted cost
        ``sum_j w_j min_i ||x_j - c_i||^2`` (float64); the number of iterations run (int32).

    References:
        Lloyd 1982; Pan et al. Algorithm 1 line 7 and App. I (weighted server data), App. M.3
        (Lloyd at the clients); spec mufc.md 1.6 steps 2-3 and 3.7.
    """
    f64 = jnp.float64
    x = jnp.asarray(x, f64)
    w = jnp.asarray(weights, f64)
    init = jnp.asarray(init, f64)
    k = init.shape[0]

    def effective(c):
        return jnp.where(active[:, None], c, jnp.inf)

    def assign(c):
        labels, _, sq = kmeans.assign_clusters(x, effective(c), jnp.inf)
        return labels, sq

    def update(c, labels):
        sums = jax.ops.segment_sum(w[:, None] * x, labels, num_segments=k)
        mass = jax.ops.segment_sum(w, labels, num_segments=k)
        keep = (mass > 0) & active
        means = sums / jnp.where(keep, mass, 1.0)[:, None]
        return jnp.where(keep[:, None], means, c)

    def cond(state):
        _, _, it, done = state
        return (~done) & (it < max_iter)

    def body(state):
        c, prev, it, _ = state
        labels, _ = assign(c)
        new = update(c, labels)
        shift = jnp.sum(jnp.where(active[:, None], (new - c) ** 2, 0.0))
        stable = jnp.all((labels == prev) | (w <= 0))
        return new, labels, it + 1, stable | (shift <= tol_abs)

    init_state = (init, jnp.full(x.shape[:1], -1, jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros((), bool))
    centroids, _, n_iter, _ = jax.lax.while_loop(cond, body, init_state)
    labels, sq = assign(centroids)
    return centroids, labels, jnp.sum(w * sq), n_iter


@functools.partial(jax.jit, static_argnames=("k",))
def weighted_kmeans_runs(
    keys: jax.Array,
    x: jax.Array,
    weights: jax.Array,
    valid: jax.Array,
    k: int,
    tol_abs: float | jax.Array,
    max_iter: int | jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Independent weighted K-means++ runs (D^2 seeding + weighted Lloyd), one per key.

    Each run seeds with weighted D^2 sampling (`fedproto.algorithms.kmeans.kmeanspp_seeding` with
    ``weights``; the Gumbel noise is keyed by row number) and runs `weighted_lloyd` from the
    seeds. If the weighted rows hold fewer than ``k`` distinct points, seeding stops after
    ``m < k`` seeds (every row then sits on a seed, cost 0); the missing centroids are filled
    with copies of centroid 0, which attract no points under the lowest-index tie rule.

    Args:
        keys: ``[r]`` stack of keys, one per run.
        x: ``[c, d]`` float64 padded points.
        weights: ``[c]`` float64 positive weights on valid rows (ignored elsewhere).
        valid: ``[c]`` bool, False on padding.
        k: number of centroids (static).
        tol_abs: absolute tolerance on the squared centroid shift (see `weighted_lloyd`).
        max_iter: maximum Lloyd iterations per run.

    Returns:
        ``(centroids, costs, n_seeds)``: ``[r, k, d]`` float64, ``[r]`` float64 weighted costs,
        ``[r]`` int32 number of seeds drawn per run.

    References:
        Pan et al. Algorithm 1 lines 6-7 and App. I; spec mufc.md 1.6 (weighted server mode,
        ``n_init`` restarts as in the authors' code, 5.2).
    """
    ids = jnp.arange(x.shape[0], dtype=jnp.uint32)
    w = jnp.where(valid, jnp.asarray(weights, jnp.float64), 0.0)

    def one(key):
        rows, count = kmeans.kmeanspp_seeding(key, x, ids, valid, k, weights=w)
        active = rows >= 0
        init = x[jnp.where(active, rows, rows[0])]
        centroids, _, cost, _ = weighted_lloyd(x, w, init, active, tol_abs, max_iter)
        centroids = jnp.where(active[:, None], centroids, centroids[0])
        return centroids, cost, count

    return jax.vmap(one)(keys)

"""Pure kernels of Q-k-means and DC-k-means: keyed seeding, quantised Lloyd steps, exact replay.

Every array kernel is `jax.jit`-compiled at module level; ``k`` is static, everything else is
traced. Points travel padded to a *capacity* (`capacity`) with a validity mask, so a deletion
stream, which shrinks n by one per request, reuses a handful of compiled shapes instead of
compiling one per n. Padded rows never count: they have zero D^2 weight, no cluster and no loss.

Randomness is coupling-friendly (spec 3.3): every categorical draw is a Gumbel-max over keys
folded with the **stable point id** (`gumbel_by_id`), so running on ``D`` without point i with
the same key draws exactly the same values for every other point. Per-row quantities (distances,
D^2 weights) are computed row by row, so they do not depend on which other rows are present.
`capacity`, `pad_rows`, `gumbel_by_id` and `kmeanspp_seeding` are the shared building blocks of
`fedproto.algorithms.kmeans`, re-exported here under the same names (called as ``kmeanspp_seeding(key, x,
ids, valid, k)`` they draw exactly as before).

Dtypes: float64 throughout (``algorithms`` enables JAX's x64 mode). Counts are float64 holding
exact integers. Lattice indices are int64.

References:
    Ginart, Guan, Valiant, Zou. Making AI Forget You: Data Deletion in Machine Learning (NeurIPS
    2019): Alg. 1/4 (Q-k-means), Alg. 5 (deletion), Alg. 7 (k-means++), App. B.1.2 (quantiser);
    spec deletion-kmeans.md, sections 1.2-1.5, 3.3 and 8.
    Arthur, Vassilvitskii. k-means++: the advantages of careful seeding. SODA 2007.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fedproto.algorithms import kmeans
from fedproto.algorithms.kmeans import capacity, gumbel_by_id, kmeanspp_seeding, pad_rows

__all__ = [
    "REASONS",
    "assign_masked",
    "balance_correction",
    "capacity",
    "gumbel_by_id",
    "kmeanspp_seeding",
    "lattice_points",
    "leaf_assignment",
    "lloyd_iterations",
    "pad_rows",
    "qkmeans_iteration",
    "quantize",
    "random_phases",
    "replay_removal",
]

#: Outcome codes of `replay_removal` (index -> reason); 0 means the deletion is certified.
REASONS = ("certified", "empty cluster", "lattice index changed", "near a lattice boundary",
           "stop decision changed", "stop decision within margin")


@jax.jit
def assign_masked(x: jax.Array, valid: jax.Array, centroids: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Nearest-centroid labels (ties to the lowest index) and the k-means loss of the valid rows.

    Args:
        x: ``[c, d]`` float64; valid: ``[c]`` bool; centroids: ``[k, d]`` float64.

    Returns:
        ``(labels [c] int32, sq_dist [c] float64 (0 on padding), loss float64 scalar)``; the loss
        is the sum ``sum_x min_j ||x - c_j||^2`` (spec 5.3).
    """
    labels, _, sq = kmeans.assign_clusters(x, centroids, jnp.inf)
    sq = jnp.where(valid, sq, 0.0)
    return labels, sq, jnp.sum(sq)


@jax.jit
def balance_correction(sums: jax.Array, counts: jax.Array, prev: jax.Array, mass_threshold: jax.Array) -> jax.Array:
    """Analog centroids with the gamma balance correction.

    ``c = S / m`` for ``m >= M``; ``c = (S + (M - m) cprev) / M`` for ``0 < m < M`` (the cluster is
    padded to mass M with its previous centroid); ``c = cprev`` for an empty cluster (option (ii)
    of App. B.1: the cluster is left where it was, which is also the limit of the correction).

    Args:
        sums: ``[..., k, d]`` per-cluster sums; counts: ``[..., k]`` per-cluster counts (float).
        prev: ``[..., k, d]`` previous (accepted) centroids.
        mass_threshold: scalar ``M = gamma n / k``.

    Returns:
        ``[..., k, d]`` float64.

    References:
        Ginart et al., Alg. 4 (App. B.1.1; division by M as in the authors' code); spec 1.3 c.
    """
    m = counts[..., None]
    safe_m = jnp.where(m > 0, m, 1.0)
    safe_mass = jnp.where(mass_threshold > 0, mass_threshold, 1.0)
    mean = sums / safe_m
    corrected = (sums + (mass_threshold - m) * prev) / safe_mass
    out = jnp.where(m < mass_threshold, corrected, mean)
    return jnp.where(m > 0, out, prev)


@jax.jit
def quantize(c: jax.Array, eps: jax.Array, theta: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Lattice indices ``a = round(c / eps - theta)`` and the distance to a rounding boundary.

    Args:
        c: ``[..., d]`` float64 points.
        eps: lattice granularity (scalar > 0).
        theta: ``[..., d]`` phase in ``[-1/2, 1/2]^d`` (broadcast against ``c``).

    Returns:
        ``(indices, slack)``: int64 indices of ``c``'s shape (round half to even, as NumPy), and
        float64 ``slack = 1/2 - |u - round(u)|`` with ``u = c / eps - theta``: how far, in lattice
        units, each coordinate is from flipping to the next lattice index.

    References:
        Ginart et al., App. B.1.2; spec 1.2.
    """
    u = c / eps - theta
    r = jnp.round(u)
    return r.astype(jnp.int64), 0.5 - jnp.abs(u - r)


@jax.jit
def lattice_points(indices: jax.Array, eps: jax.Array, theta: jax.Array) -> jax.Array:
    """The lattice vertices ``Q = eps * (theta + a)`` of integer indices ``a`` (float64)."""
    return eps * (theta + indices.astype(jnp.float64))


@functools.partial(jax.jit, static_argnames=("iterations", "d"))
def random_phases(key: jax.Array, iterations: int, d: int) -> jax.Array:
    """The lattice phases ``theta_tau ~ Unif[-1/2, 1/2]^d``, ``tau = 1..T``: ``[T, d]`` float64.

    Row ``tau - 1`` is drawn from ``fold_in(key, tau)``, so it does not depend on the data.
    """
    taus = jnp.arange(1, iterations + 1, dtype=jnp.uint32)
    draw = lambda t: jax.random.uniform(jax.random.fold_in(key, t), (d,), jnp.float64, -0.5, 0.5)  # noqa: E731
    return jax.vmap(draw)(taus)


@functools.partial(jax.jit, static_argnames=("k",))
def qkmeans_iteration(
    x: jax.Array,
    valid: jax.Array,
    labels: jax.Array,
    prev: jax.Array,
    theta: jax.Array,
    eps: jax.Array,
    mass_threshold: jax.Array,
    k: int,
) -> tuple[jax.Array, ...]:
    """One Q-k-means iteration: statistics of the current partition, correction, quantisation,
    reassignment.

    Args:
        x: ``[c, d]`` float64 padded points; valid: ``[c]`` bool.
        labels: ``[c]`` int32 partition ``pi_{tau-1}``.
        prev: ``[k, d]`` accepted centroids ``chat_{tau-1}``.
        theta: ``[d]`` this iteration's phase; eps: granularity; mass_threshold: ``M``.
        k: clusters (static).

    Returns:
        ``(sums [k, d], counts [k], indices [k, d] int64, centroids [k, d], labels [c] int32,
        loss)``: the statistics of ``pi_{tau-1}``, the lattice indices ``A_tau`` and vertices
        ``chat_tau``, the new partition ``pi_tau`` and its loss ``L_tau``.

    References:
        Ginart et al., Alg. 4 lines (means, correction, quantisation, reassignment); spec 1.3 b-e.
    """
    sums, counts = kmeans.cluster_statistics(x, labels, valid, k)
    analog = balance_correction(sums, counts, prev, mass_threshold)
    indices, _ = quantize(analog, eps, theta[None, :])
    centroids = lattice_points(indices, eps, theta[None, :])
    new_labels, _, loss = assign_masked(x, valid, centroids)
    return sums, counts, indices, centroids, new_labels, loss


@jax.jit
def replay_removal(
    p: jax.Array,
    prev: jax.Array,
    centroids: jax.Array,
    thetas: jax.Array,
    indices: jax.Array,
    sums: jax.Array,
    counts: jax.Array,
    losses: jax.Array,
    accepted: jax.Array,
    executed: jax.Array,
    eps: jax.Array,
    new_mass: jax.Array,
    lattice_margin: jax.Array,
    loss_margin: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Exact certification of one deletion: replay every executed iteration without point ``p``.

    For each executed iteration tau: p's cluster is its nearest **previous quantised** centroid
    (the partition ``pi_{tau-1}`` was defined by those); its statistics lose p exactly
    (``S - p``, ``m - 1``); every row is corrected again with the new threshold
    ``M' = gamma (n-1) / k`` and quantised with the stored phase. The deletion is certified only
    if every lattice index equals the stored one with every coordinate at least
    ``lattice_margin`` (lattice units) from a rounding boundary, no cluster becomes empty, and
    every stop/continue decision ``L'_tau < L'_{tau-1}`` (with p's loss removed) is the stored one
    and clear of ties by the relative ``loss_margin``. Being conservative only costs a retrain.

    Args:
        p: ``[d]`` the point to delete.
        prev: ``[T, k, d]`` ``chat_{tau-1}`` per iteration (row 0 the seeds).
        centroids: ``[T, k, d]`` ``chat_tau`` per iteration.
        thetas: ``[T, d]`` phases; indices: ``[T, k, d]`` int64 stored ``A_tau``.
        sums: ``[T, k, d]``; counts: ``[T, k]`` statistics of ``pi_{tau-1}``.
        losses: ``[T+1]`` ``L_0..L_T``; accepted: ``[T]`` bool stop decisions.
        executed: int scalar, iterations executed (entries beyond it are ignored).
        eps: granularity; new_mass: ``M'``; lattice_margin, loss_margin: the safety margins.

    Returns:
        ``(code, sums', counts', losses')``: ``code`` int32, an index into `REASONS` (0 =
        certified); the updated statistics and losses (meaningful when certified).

    References:
        Ginart et al., Alg. 5 with the exact perturbation; spec 1.5 (and 6.4 items 2-5 for what
        the paper's and the authors' check get wrong).
    """
    steps = prev.shape[0]
    live = jnp.arange(steps) < executed
    d_prev = jnp.sum((p[None, None, :] - prev) ** 2, axis=-1)  # [T, k]
    kappa = jnp.argmin(d_prev, axis=1)
    onehot = jax.nn.one_hot(kappa, prev.shape[1], dtype=jnp.float64)  # [T, k]
    new_sums = sums - onehot[:, :, None] * p[None, None, :]
    new_counts = counts - onehot
    empty = jnp.any(live & (jnp.sum(onehot * new_counts, axis=1) <= 0))
    analog = balance_correction(new_sums, new_counts, prev, new_mass)
    new_indices, slack = quantize(analog, eps, thetas[:, None, :])
    changed = jnp.any(live[:, None, None] & (new_indices != indices))
    near = jnp.any(live[:, None, None] & (slack < lattice_margin))
    d_cur = jnp.sum((p[None, None, :] - centroids) ** 2, axis=-1)
    lp = jnp.concatenate([jnp.min(d_prev[:1], axis=1), jnp.min(d_cur, axis=1)])  # p's loss at chat_0..chat_T
    new_losses = losses - lp
    before, after = new_losses[:-1], new_losses[1:]
    decision = after < before
    flipped = jnp.any(live & (decision != accepted))
    scale = jnp.maximum(jnp.abs(before), jnp.abs(after))
    tie = jnp.any(live & (jnp.abs(after - before) <= loss_margin * scale))
    code = jnp.select([empty, changed, near, flipped, tie], [1, 2, 3, 4, 5], 0).astype(jnp.int32)
    return code, new_sums, new_counts, new_losses


@functools.partial(jax.jit, static_argnames=("k", "iterations"))
def lloyd_iterations(x: jax.Array, valid: jax.Array, init: jax.Array, k: int, iterations: int) -> jax.Array:
    """A fixed number of plain Lloyd iterations on the valid rows (empty clusters stay put).

    Args:
        x: ``[c, d]`` float64; valid: ``[c]`` bool; init: ``[k, d]`` starting centroids.
        k: clusters (static); iterations: T (static, no early stop, as in the paper's DC nodes).

    Returns:
        ``[k, d]`` float64 centroids after T iterations.

    References:
        Ginart et al., Alg. 2 ("k-means++(D, k, T)" at every DC node); spec 2.1.
    """

    def step(_, c):
        labels, _, _ = kmeans.assign_clusters(x, c, jnp.inf)
        sums, counts = kmeans.cluster_statistics(x, labels, valid, k)
        nonempty = counts > 0
        means = sums / jnp.where(nonempty, counts, 1.0)[:, None]
        return jnp.where(nonempty[:, None], means, c)

    return jax.lax.fori_loop(0, iterations, step, init)


@jax.jit
def leaf_assignment(key: jax.Array, ids: jax.Array, n_leaves: jax.Array) -> jax.Array:
    """Keyed uniform leaf of each point: ``randint(fold_in(key, id), 0, n_leaves)``.

    Independent of the values and of the deletion requests, and a function of the id alone, so
    the leaves of ``D`` without point i are exactly the old leaves without i (spec 2.3, O-DC-1).

    Args:
        key: the leaf key; ids: ``[n]`` uint32 point ids; n_leaves: number of leaves (traced).

    Returns:
        ``[n]`` int32 leaf indices in ``[0, n_leaves)``.
    """
    draw = lambda i: jax.random.randint(jax.random.fold_in(key, i), (), 0, n_leaves, jnp.int32)  # noqa: E731
    return jax.vmap(draw)(ids)

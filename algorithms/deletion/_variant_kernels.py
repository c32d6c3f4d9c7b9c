"""Pure kernels of the two protocol variants: federated Q-k-means and weighted DC-k-means.

* Federated Q-k-means (spec deletion-kmeans.md 2.3, "Q-k-means as a protocol"): the party side of
  one keyed k-means++ step (`seeding_scores`), the party side of one Lloyd round
  (`local_statistics`), and the coordinator side of one Lloyd iteration (`quantized_step`).
  They are written so that a federated run computes, row by row, the *same* floating-point
  values as the centralised kernels of `fedproto.algorithms.deletion._kernels`: per-row distances
  ``sum((x - c)^2)`` and Gumbel noise keyed by the stable point id do not depend on which other
  rows are present, and ``min``/``argmax`` are exact, so the coordinator's choice of a seed is
  the centralised draw exactly. Only sums over points (cluster sums, losses) are added in a
  different order (party by party).
* Weighted DC-k-means (spec 2.3, "optional weighted variant"): weighted Lloyd iterations
  (`weighted_lloyd_iterations`) and the cluster masses of a node's output (`cluster_masses`);
  the seeding with probability proportional to ``w_j * D(x_j)^2`` is the shared
  `fedproto.algorithms.kmeans.kmeanspp_seeding` with ``weights``. With unit weights they reproduce the
  unweighted kernels bit for bit.

Every array kernel is `jax.jit`-compiled at module level with ``k`` (and the iteration count)
static. Points travel padded to `_kernels.capacity` rows with a validity mask (or, for the
weighted kernels, weight 0 on padding). Dtypes: float64 throughout; counts are float64 holding
exact integers.

References:
    The papers of `_kernels` (Ginart et al. 2019; Arthur and Vassilvitskii 2007): here Alg. 2
    (DC nodes), Alg. 4 (one Q-k-means iteration) and Alg. 7 (k-means++); spec deletion-kmeans.md
    sections 2.3, 3.3 and 8.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fedproto.algorithms import kmeans
from fedproto.algorithms.deletion import _kernels

__all__ = [
    "cluster_masses",
    "local_statistics",
    "quantized_step",
    "seeding_scores",
    "weighted_lloyd_iterations",
]


def _row_sq_dist(x: jax.Array, c: jax.Array) -> jax.Array:
    # The same expression as the centralised seeding kernel, so the per-row values agree bit for bit.
    diff = x - c[None, :]
    return jnp.sum(diff * diff, axis=-1)


@jax.jit
def seeding_scores(
    key: jax.Array,
    x: jax.Array,
    ids: jax.Array,
    valid: jax.Array,
    mind: jax.Array,
    centre: jax.Array,
    has_centre: jax.Array,
    step: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One party's side of one keyed k-means++ step: fold in the last centre, score every point.

    The score of point j at step s is ``log u_j + g_j`` with ``g_j = Gumbel(fold_in(fold_in(key,
    s), id_j))`` and ``u_j`` the squared distance to the nearest centre chosen so far (``u_j = 1``
    at step 0); points with ``u_j = 0`` score ``-inf``. The global ``argmax`` of the scores is an
    exact draw with probability ``u_j / sum u`` (Gumbel-max), and it is the maximum of the
    parties' local maxima, so a coordinator that compares one ``(score, id)`` per party picks
    exactly the point `_kernels.kmeanspp_seeding` picks on the pooled data with the same key.

    Args:
        key: the seeding key (``fold_in(run key, 1)``, as in `qkmeans.train_qkmeans`).
        x: ``[c, d]`` float64 padded points; ids: ``[c]`` uint32 stable ids; valid: ``[c]`` bool.
        mind: ``[c]`` float64 squared distance to the nearest chosen centre (``inf`` on valid
            rows and 0 on padding before the first centre).
        centre: ``[d]`` float64 the centre chosen at the previous step (ignored if not
            ``has_centre``).
        has_centre: bool scalar, False at step 0.
        step: int scalar, the step s.

    Returns:
        ``(mind', best_score, best_row)``: the updated distances ``[c]``, the largest score
        (float64, ``-inf`` when no valid point has positive weight) and its row (int32; the
        lowest row among equal scores, i.e. the lowest id since rows are sorted by id).

    References:
        Ginart et al., Alg. 7; spec 3.1 and 3.3 (Gumbel-max keyed by stable point ids).
    """
    ninf = jnp.asarray(-jnp.inf, jnp.float64)
    d2 = _row_sq_dist(x, centre)
    mind = jnp.where(has_centre & valid, jnp.minimum(mind, d2), mind)
    g = _kernels.gumbel_by_id(jax.random.fold_in(key, step), ids)
    weight = jnp.where(step == 0, valid.astype(jnp.float64), mind)
    score = jnp.where(weight > 0, jnp.log(jnp.where(weight > 0, weight, 1.0)) + g, ninf)
    j = jnp.argmax(score).astype(jnp.int32)
    return mind, score[j], j


@functools.partial(jax.jit, static_argnames=("k",))
def local_statistics(
    x: jax.Array, valid: jax.Array, centroids: jax.Array, k: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One party's side of one Q-k-means Lloyd round: statistics of its points' partition.

    Args:
        x: ``[c, d]`` float64 padded points; valid: ``[c]`` bool.
        centroids: ``[k, d]`` float64, the current centroids ``chat_j`` (the seeds for j = 0).
        k: clusters (static).

    Returns:
        ``(sums [k, d], counts [k], loss)``: per-cluster sums and counts of the nearest-centroid
        partition (ties to the lowest index) and its loss ``sum_x min_j ||x - c_j||^2``, float64.

    References:
        Ginart et al., Alg. 4 (means and loss); spec 2.3 ("each party assigns its points and
        replies STATS").
    """
    labels, _, loss = _kernels.assign_masked(x, valid, centroids)
    sums, counts = kmeans.cluster_statistics(x, labels, valid, k)
    return sums, counts, loss


@jax.jit
def quantized_step(
    sums: jax.Array, counts: jax.Array, prev: jax.Array, theta: jax.Array, eps: jax.Array, mass_threshold: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The coordinator's side of one Q-k-means iteration: correction and quantisation.

    Args:
        sums: ``[k, d]``; counts: ``[k]`` the summed statistics of the partition ``pi_{tau-1}``.
        prev: ``[k, d]`` the accepted centroids ``chat_{tau-1}``.
        theta: ``[d]`` the phase ``theta_tau``; eps: granularity; mass_threshold: ``M``.

    Returns:
        ``(indices [k, d] int64, centroids [k, d] float64)``: ``A_tau`` and ``chat_tau``.

    References:
        Ginart et al., Alg. 4 (balance correction, quantisation); spec 1.3 c-d.
    """
    analog = _kernels.balance_correction(sums, counts, prev, mass_threshold)
    indices, _ = _kernels.quantize(analog, eps, theta[None, :])
    return indices, _kernels.lattice_points(indices, eps, theta[None, :])


def _weighted_statistics(x: jax.Array, weights: jax.Array, centroids: jax.Array, k: int) -> tuple[jax.Array, ...]:
    labels, _, _ = kmeans.assign_clusters(x, centroids, jnp.inf)
    valid = weights > 0
    masked = jnp.where(valid[:, None], weights[:, None] * x, 0.0)
    sums = jax.ops.segment_sum(masked, labels, num_segments=k)
    masses = jax.ops.segment_sum(jnp.where(valid, weights, 0.0), labels, num_segments=k)
    return sums, masses


@functools.partial(jax.jit, static_argnames=("k", "iterations"))
def weighted_lloyd_iterations(
    x: jax.Array, weights: jax.Array, init: jax.Array, k: int, iterations: int
) -> jax.Array:
    """A fixed number of weighted Lloyd iterations: each centroid moves to the weighted mean
    ``sum w_j x_j / sum w_j`` of its points (an empty cluster stays put).

    Args:
        x: ``[c, d]`` float64; weights: ``[c]`` float64 (0 on padding); init: ``[k, d]``.
        k: clusters (static); iterations: T (static).

    Returns:
        ``[k, d]`` float64 centroids; with unit weights exactly `_kernels.lloyd_iterations`'.

    References:
        Ginart et al., Alg. 2 with mass-weighted internal nodes (spec 2.3, optional variant).
    """

    def step(_, c):
        sums, masses = _weighted_statistics(x, weights, c, k)
        nonempty = masses > 0
        means = sums / jnp.where(nonempty, masses, 1.0)[:, None]
        return jnp.where(nonempty[:, None], means, c)

    return jax.lax.fori_loop(0, iterations, step, init)


@functools.partial(jax.jit, static_argnames=("k",))
def cluster_masses(x: jax.Array, weights: jax.Array, centroids: jax.Array, k: int) -> jax.Array:
    """The mass of each output cluster: the summed weight of the points nearest to it.

    Args:
        x: ``[c, d]`` float64; weights: ``[c]`` float64 (1 per point at a leaf, 0 on padding).
        centroids: ``[k, d]`` the node's output; k: static.

    Returns:
        ``[k]`` float64 masses (exact integers at a leaf: the cluster sizes).
    """
    return _weighted_statistics(x, weights, centroids, k)[1]

"""Shared k-means kernels: assignment, cluster statistics, Lloyd steps, costs and DP noise.

Every function here is a pure `jax.jit` kernel compiled at module level: no hidden state, no
printing, no global randomness. Configuration that changes array shapes (``k``, ``shape``,
``dtype``) is a static argument; everything else is traced, so calling a kernel with a new radius
or noise scale does not recompile it.

Dtypes: the kernels compute in the floating dtype of their inputs (``jnp.result_type(x,
centroids)``, promoted to a float). Importing `algorithms` turns on JAX's 64-bit mode, and the
protocols pass float64 points and centroids: FastLloyd's fixed-point encoding resolves 2^-16 on
aggregates up to 2^15, which float32's 24-bit significand cannot hold (spec fastlloyd.md, section
6). Labels are int32; counts are floats of the points' dtype because DP noise is added to them.

Distances are computed as ``sum((x - c)^2)`` rather than ``|x|^2 - 2 x.c + |c|^2``: the expanded
form cancels catastrophically for points close to a centroid, which would move points across the
radius boundary and break exact ties. Under `jit` XLA fuses the broadcast into the reduction, so
the ``[n, k, d]`` difference tensor is not materialised.

References:
    Diaa, Humphries, Kerschbaum. FastLloyd: Federated, Accurate, Secure, and Tunable k-Means
    Clustering with Differential Privacy (arXiv 2405.02437), Algorithm 1 and Sec. 6.
    Lloyd. Least squares quantization in PCM. IEEE Trans. Inf. Theory 28(2), 1982.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

__all__ = [
    "assign_clusters",
    "cluster_statistics",
    "gaussian_noise",
    "kmeans_cost",
    "laplace_noise",
    "lloyd_step",
    "nicv",
    "relative_statistics",
]


def _float_dtype(*arrays: jax.Array) -> jnp.dtype:
    # A weakly typed Python float joins the promotion so integer inputs compute in the default
    # float (float64 under x64) while float32 inputs stay float32.
    return jnp.result_type(*arrays, float)


def _squared_distances(x: jax.Array, centroids: jax.Array) -> jax.Array:
    diff = x[:, None, :] - centroids[None, :, :]
    return jnp.sum(diff * diff, axis=-1)


@jax.jit
def assign_clusters(
    x: jax.Array, centroids: jax.Array, radius: float | jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Assign each point to its nearest centroid, dropping points outside the radius.

    The nearest centroid minimises the squared Euclidean distance; ties go to the lowest
    centroid index. A point is *assigned* iff its distance to that centroid is strictly smaller
    than ``radius`` (``||x - mu_j|| < eta``, the paper's Eq. 4 and Alg. 1 line 8; the authors'
    code uses ``<=``, spec item 5.9). A point exactly at distance ``radius`` is therefore left
    unassigned. The comparison is made on the distance itself (``sqrt(sq_dist) < radius``), not on
    ``sq_dist < radius**2``, so that rounding in ``radius**2`` cannot move the boundary.
    ``radius = jnp.inf`` disables the test (every point with a finite distance is assigned), which
    is the baselines' unconstrained assignment.

    Args:
        x: points, shape ``[n, d]``, float (float64 expected).
        centroids: centroids, shape ``[k, d]``, float (float64 expected), ``k >= 1``.
        radius: scalar radius ``eta_t >= 0`` (traced; ``jnp.inf`` for no constraint).

    Returns:
        ``(labels, assigned, sq_dist)``: ``labels`` int32 ``[n]``, the nearest centroid's index
        (defined for unassigned points too); ``assigned`` bool ``[n]``; ``sq_dist`` float ``[n]``,
        the squared distance to the nearest centroid.

    References:
        FastLloyd, Algorithm 1 lines 6-9 and Eq. 4 (spec fastlloyd.md, section 2.6).
    """
    dtype = _float_dtype(x, centroids)
    x = jnp.asarray(x, dtype)
    centroids = jnp.asarray(centroids, dtype)
    sq = _squared_distances(x, centroids)
    labels = jnp.argmin(sq, axis=1).astype(jnp.int32)  # argmin returns the first minimum
    sq_dist = jnp.take_along_axis(sq, labels[:, None], axis=1)[:, 0]
    assigned = jnp.sqrt(sq_dist) < radius
    return labels, assigned, sq_dist


@functools.partial(jax.jit, static_argnames=("k",))
def cluster_statistics(
    x: jax.Array, labels: jax.Array, assigned: jax.Array, k: int
) -> tuple[jax.Array, jax.Array]:
    """Per-cluster sums and counts of the assigned points.

    Args:
        x: points, shape ``[n, d]``, float (float64 expected).
        labels: cluster index of each point, int ``[n]`` with values in ``[0, k)``.
        assigned: bool ``[n]``; points with ``False`` contribute to no cluster.
        k: number of clusters (static).

    Returns:
        ``(sums, counts)``: ``sums`` ``[k, d]`` and ``counts`` ``[k]``, both in the points'
        float dtype. An empty cluster has sum 0 and count 0.

    References:
        FastLloyd, Algorithm 1 lines 11-13 with absolute sums (the baselines' ``S_ij``, spec
        section 2.7).
    """
    dtype = _float_dtype(x)
    x = jnp.asarray(x, dtype)
    # where() rather than multiplication: an unassigned point with a non-finite coordinate must
    # not turn a sum into NaN (0 * inf).
    masked = jnp.where(assigned[:, None], x, jnp.zeros((), dtype))
    sums = jax.ops.segment_sum(masked, labels, num_segments=k)
    counts = jax.ops.segment_sum(assigned.astype(dtype), labels, num_segments=k)
    return sums, counts


@jax.jit
def relative_statistics(
    x: jax.Array, centroids: jax.Array, radius: float | jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """FastLloyd's local update: relative sums and counts of the points within the radius.

    ``R_j = sum_{x assigned to j} (x - centroids_j)`` and ``C_j = |{x assigned to j}|``, with the
    assignment of `assign_clusters` (nearest centroid, strict ``< radius``). Summing the
    differences directly, rather than computing ``S_j - C_j * centroids_j``, avoids cancellation
    when the cluster is large.

    Args:
        x: points, shape ``[n, d]``, float (float64 expected).
        centroids: the public centroids of the previous iteration, shape ``[k, d]``.
        radius: scalar radius ``eta_t`` (traced; ``jnp.inf`` for no constraint).

    Returns:
        ``(relative_sums, counts, n_unassigned)``: ``relative_sums`` ``[k, d]`` and ``counts``
        ``[k]`` in the points' float dtype; ``n_unassigned`` an int32 scalar array, the number of
        points left out by the radius test.

    References:
        FastLloyd, Algorithm 1 lines 11-13 (relative sum ``Rbar_ij``, count ``Cbar_ij``) and
        Thm. 5.1 (the radius bounds the sensitivity of ``R_j`` by ``eta``).
    """
    dtype = _float_dtype(x, centroids)
    x = jnp.asarray(x, dtype)
    centroids = jnp.asarray(centroids, dtype)
    k = centroids.shape[0]
    labels, assigned, _ = assign_clusters(x, centroids, radius)
    diffs = jnp.where(assigned[:, None], x - centroids[labels], jnp.zeros((), dtype))
    relative_sums = jax.ops.segment_sum(diffs, labels, num_segments=k)
    counts = jax.ops.segment_sum(assigned.astype(dtype), labels, num_segments=k)
    n_unassigned = jnp.sum(~assigned, dtype=jnp.int32)
    return relative_sums, counts, n_unassigned


@jax.jit
def kmeans_cost(x: jax.Array, centroids: jax.Array) -> jax.Array:
    """The k-means objective (WCSS, inertia): sum of squared distances to the nearest centroid.

    Args:
        x: points, shape ``[n, d]``, float.
        centroids: centroids, shape ``[k, d]``, float, ``k >= 1``.

    Returns:
        Scalar in the points' float dtype (units: squared data units).

    References:
        FastLloyd, Eq. 1 (spec section 1.4).
    """
    dtype = _float_dtype(x, centroids)
    sq = _squared_distances(jnp.asarray(x, dtype), jnp.asarray(centroids, dtype))
    return jnp.sum(jnp.min(sq, axis=1))


@jax.jit
def nicv(x: jax.Array, centroids: jax.Array) -> jax.Array:
    """Normalised intra-cluster variance: `kmeans_cost` divided by the number of points.

    Equals scikit-learn's ``KMeans.inertia_ / n`` for the same centroids.

    Args:
        x: points, shape ``[n, d]``, float, ``n >= 1``.
        centroids: centroids, shape ``[k, d]``, float, ``k >= 1``.

    Returns:
        Scalar in the points' float dtype (units: squared data units per point).

    References:
        FastLloyd, Sec. 6.2.1 (NICV, the paper's main utility metric; spec section 7.5).
    """
    return kmeans_cost(x, centroids) / x.shape[0]


@jax.jit
def lloyd_step(x: jax.Array, centroids: jax.Array) -> jax.Array:
    """One plain (non-private, unconstrained) Lloyd iteration.

    Every point goes to its nearest centroid (ties to the lowest index); each centroid moves to
    the mean of its points. A centroid with no points keeps its previous position.

    Args:
        x: points, shape ``[n, d]``, float.
        centroids: current centroids, shape ``[k, d]``, float.

    Returns:
        New centroids, shape ``[k, d]``, in the common float dtype.

    References:
        Lloyd 1982; FastLloyd, Sec. 2.2.1 (Lloyd's algorithm; the non-private baseline of Sec. 6.1.2).
    """
    dtype = _float_dtype(x, centroids)
    x = jnp.asarray(x, dtype)
    centroids = jnp.asarray(centroids, dtype)
    labels, assigned, _ = assign_clusters(x, centroids, jnp.inf)
    sums, counts = cluster_statistics(x, labels, assigned, centroids.shape[0])
    nonempty = counts > 0
    means = sums / jnp.where(nonempty, counts, jnp.ones((), dtype))[:, None]
    return jnp.where(nonempty[:, None], means, centroids)


@functools.partial(jax.jit, static_argnames=("shape", "dtype"))
def gaussian_noise(
    key: jax.Array,
    shape: tuple[int, ...],
    std: float | jax.Array,
    dtype: jnp.dtype = jnp.float64,
) -> jax.Array:
    """I.i.d. Gaussian noise ``N(0, std^2)`` for the Gaussian mechanism.

    Sampled in float64 by default: the noise is quantised to the 2^-16 grid before it enters the
    ring, and the samples must be accurate well below that resolution at magnitudes up to 2^15.

    Args:
        key: a `jax.random` key (per round ``fold_in(key, round_idx)``; per party fold in its
            index).
        shape: output shape (static), e.g. ``(k, d)`` for sums or ``(k,)`` for counts.
        std: standard deviation, ``>= 0``: a scalar or an array broadcastable to ``shape``
            (traced). For FastLloyd ``sigma_R * sqrt(T) * eta_t`` on relative sums and
            ``sigma_C * sqrt(T)`` on counts.
        dtype: floating output dtype (static).

    Returns:
        Array of ``shape`` and ``dtype``.

    References:
        FastLloyd, Sec. 5.1 and Alg. 1 lines 15-16 (Gaussian noise on R and C; spec section
        2.3 item 5).
    """
    return (jnp.asarray(std, dtype) * jax.random.normal(key, shape, dtype)).astype(dtype)


@functools.partial(jax.jit, static_argnames=("shape", "dtype"))
def laplace_noise(
    key: jax.Array,
    shape: tuple[int, ...],
    scale: float | jax.Array,
    dtype: jnp.dtype = jnp.float64,
) -> jax.Array:
    """I.i.d. Laplace noise with density ``exp(-|z| / scale) / (2 scale)`` (variance ``2 scale^2``).

    Args:
        key: a `jax.random` key.
        shape: output shape (static).
        scale: Laplace scale ``b >= 0`` (scalar or broadcastable to ``shape``; traced). For
            SuLloyd ``b_S = d / eps_S`` on sums and ``b_C = 1 / eps_C`` on counts.
        dtype: floating output dtype (static).

    Returns:
        Array of ``shape`` and ``dtype``.

    References:
        Su et al., Differentially private k-means clustering, CODASPY 2016 (the SuLloyd baseline,
        FastLloyd Sec. 6.1.2; spec section 3.2).
    """
    return (jnp.asarray(scale, dtype) * jax.random.laplace(key, shape, dtype)).astype(dtype)

"""Shared k-means kernels: assignment, cluster statistics, Lloyd steps, costs, keyed k-means++
seeding and DP noise.

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

Seeding (`kmeanspp_seeding`) is plain D^2 sampling made *coupling-friendly*: every categorical
draw is a Gumbel-max over keys folded with **stable point ids** (`gumbel_by_id`), and per-row
quantities are computed row by row, so running on a data set without a point that was never
chosen, with the same keys, reproduces every draw exactly. Points travel padded to a
`capacity` with a validity mask (`pad_rows`), so a shrinking data set reuses a few compiled
shapes. Exact unlearning of k-means++ seeds (Ginart et al. 2019; Pan et al. 2023, Algorithm 3)
builds on both properties.

References:
    Diaa, Humphries, Kerschbaum. FastLloyd: Federated, Accurate, Secure, and Tunable k-Means
    Clustering with Differential Privacy (arXiv 2405.02437), Algorithm 1 and Sec. 6.
    Lloyd. Least squares quantization in PCM. IEEE Trans. Inf. Theory 28(2), 1982.
    Arthur, Vassilvitskii. k-means++: the advantages of careful seeding. SODA 2007.
    Ginart, Guan, Valiant, Zou. Making AI Forget You (NeurIPS 2019), Alg. 7; spec
    deletion-kmeans.md, section 3.3 (coupling-friendly Gumbel-max).
    Pan, Sima, Prakash, Rana, Milenkovic. Machine Unlearning of Federated Clusters (ICLR 2023),
    App. B, Algorithm 3, Lemma 5.1; spec mufc.md, sections 1.3, 1.6 and 3.2.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "assign_clusters",
    "capacity",
    "cluster_statistics",
    "gaussian_noise",
    "gumbel_by_id",
    "kmeans_cost",
    "kmeanspp_seed_and_assign",
    "kmeanspp_seeding",
    "laplace_noise",
    "lloyd_step",
    "local_statistics_host",
    "nicv",
    "pad_rows",
    "relative_statistics",
    "seeding_keys",
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


#: Largest ``n * k * d`` that :func:`local_statistics_host` is meant for: below it one NumPy
#: pass costs less than a JAX dispatch (about 25 us against 100 us for 10 points on this project's
#: CPU machines), above it the jitted kernels win.
HOST_ELEMENTS = 1 << 14


def local_statistics_host(
    x: np.ndarray, centroids: np.ndarray, radius: float, *, relative: bool
) -> tuple[np.ndarray, np.ndarray, int]:
    """A client's sums, counts and unassigned count with NumPy on the host, for small arrays.

    The same formulas as :func:`relative_statistics` (``relative=True``) and as
    :func:`assign_clusters` followed by :func:`cluster_statistics` (``relative=False``), in the
    same order of operations: squared distances summed over the features, the first nearest
    centroid, the strict radius test on the square root, sums accumulated point by point in index
    order. Without the dispatch of a jitted call, which dominates for a client of a few points
    (a simulation of 10^5 clients calls this 10^5 times a round). Callers use it when
    ``n * k * d <= HOST_ELEMENTS``.

    Args:
        x: points, float64 ``[n, d]`` (``n`` may be 0).
        centroids: float64 ``[k, d]``.
        radius: the radius ``eta_t`` (``math.inf`` for none).
        relative: sums of ``x - centroids_j`` (FastLloyd) rather than of ``x``.

    Returns:
        ``(sums, counts, n_unassigned)``: float64 ``[k, d]``, float64 ``[k]``, a Python int.

    References:
        FastLloyd, Algorithm 1 lines 6-13 (spec fastlloyd.md, sections 2.6-2.7).
    """
    k, d = centroids.shape
    diff = x[:, None, :] - centroids[None, :, :]
    sq = np.sum(diff * diff, axis=-1)
    sums = np.zeros((k, d))
    counts = np.zeros(k)
    if x.shape[0] == 0:
        return sums, counts, 0
    labels = np.argmin(sq, axis=1)
    assigned = np.sqrt(sq[np.arange(x.shape[0]), labels]) < radius
    rows = x - centroids[labels] if relative else x
    if not assigned.all():
        labels, rows = labels[assigned], rows[assigned]
    # bincount adds in index order, point by point, as the jitted segment sums do
    for j in range(d):
        sums[:, j] = np.bincount(labels, weights=rows[:, j], minlength=k)
    counts = np.bincount(labels, minlength=k).astype(np.float64)
    return sums, counts, int(x.shape[0] - labels.shape[0])


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


# ------------------------------------------------------------------ keyed k-means++ seeding


def capacity(n: int) -> int:
    """The padded row count used for ``n`` points: at least 64, at most 12.5% above ``n``.

    Sizes are ``m * 2^e`` with ``8 <= m <= 16``, so a stream of deletions meets about eight shapes
    per halving of n, and each compiled kernel is reused.

    Args:
        n: number of points, ``n >= 0``.

    Returns:
        The capacity ``c >= max(n, 64)``.
    """
    if n <= 64:
        return 64
    e = n.bit_length() - 4
    return -(-n // (1 << e)) * (1 << e)


def pad_rows(x: np.ndarray, ids: np.ndarray) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Pad points and ids to `capacity` rows.

    Args:
        x: points ``[n, d]`` float64.
        ids: stable point ids ``[n]``, non-negative integers below 2^32.

    Returns:
        ``(x_padded [c, d] float64, ids_padded [c] uint32, valid [c] bool)`` with
        ``c = capacity(n)``; padding rows are zero with id 0 and ``valid = False``.
    """
    n, d = x.shape
    cap = capacity(n)
    xp = np.zeros((cap, d), dtype=np.float64)
    xp[:n] = x
    ip = np.zeros(cap, dtype=np.uint32)
    ip[:n] = ids
    valid = np.zeros(cap, dtype=bool)
    valid[:n] = True
    return jnp.asarray(xp), jnp.asarray(ip), jnp.asarray(valid)


def _gumbel_one(key: jax.Array, point_id: jax.Array) -> jax.Array:
    return jax.random.gumbel(jax.random.fold_in(key, point_id), (), jnp.float64)


@jax.jit
def gumbel_by_id(key: jax.Array, ids: jax.Array) -> jax.Array:
    """Standard Gumbel noise keyed by point id: ``g_j = Gumbel(fold_in(key, ids[j]))``.

    Args:
        key: a `jax.random` key (one per categorical draw).
        ids: ``[n]`` uint32 stable point ids.

    Returns:
        ``[n]`` float64; entry j depends only on ``key`` and ``ids[j]``.

    References:
        Spec deletion-kmeans.md, section 3.3 (coupling-friendly Gumbel-max).
    """
    return jax.vmap(_gumbel_one, in_axes=(None, 0))(key, ids)


@functools.partial(jax.jit, static_argnames=("k",))
def seeding_keys(key: jax.Array, k: int) -> jax.Array:
    """The per-step keys of `kmeanspp_seeding`: ``[fold_in(key, s) for s in range(k)]``.

    Passing this stack instead of ``key`` gives bit-identical draws; replacing some of its
    entries gives fresh randomness for those steps only (re-seeding in exact unlearning).

    Args:
        key: a `jax.random` key (typed or raw ``uint32[2]``).
        k: number of seeding steps (static).

    Returns:
        ``[k]`` stack of keys of ``key``'s kind (``[k, 2]`` uint32 for raw keys).
    """
    return jax.vmap(lambda s: jax.random.fold_in(key, s))(jnp.arange(k, dtype=jnp.uint32))


def _is_key_stack(key: jax.Array) -> bool:
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key.ndim == 1
    return key.ndim == 2


def _row_sq_dist(x: jax.Array, c: jax.Array) -> jax.Array:
    diff = x - c[None, :]
    return jnp.sum(diff * diff, axis=-1)


def _seed_and_assign(
    key: jax.Array,
    x: jax.Array,
    ids: jax.Array,
    valid: jax.Array,
    k: int,
    weights: jax.Array | None,
    prefix: jax.Array | None,
    start: int | jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    f64 = jnp.float64
    ninf = jnp.asarray(-jnp.inf, f64)
    x = jnp.asarray(x, f64)
    w = valid.astype(f64) if weights is None else jnp.where(valid, jnp.asarray(weights, f64), 0.0)
    stacked = _is_key_stack(key)
    if prefix is None:
        prefix = jnp.full((k,), -1, jnp.int32)
    prefix = jnp.asarray(prefix, jnp.int32)

    def place(s, j, rows, mind, labels):
        # One pass over the rows both updates the D^2 weights and tracks the nearest seed; the
        # strict '<' keeps the lowest position on ties.
        rows = rows.at[s].set(j)
        d2 = _row_sq_dist(x, x[j])
        closer = valid & (d2 < mind)
        return rows, jnp.where(closer, d2, mind), jnp.where(closer, s, labels).astype(jnp.int32)

    def keep(s, carry):
        rows, mind, labels, count = carry
        rows, mind, labels = place(s, prefix[s], rows, mind, labels)
        return rows, mind, labels, count + 1

    def draw(s, carry):
        rows, mind, labels, count = carry
        step_key = key[s] if stacked else jax.random.fold_in(key, s)
        g = gumbel_by_id(step_key, ids)
        # Weights act as multiplicities: P(j) = w_j / sum w at step 0, w_j d2_j / sum w d2 after.
        weight = jnp.where(s == 0, w, jnp.where(w > 0, w * mind, 0.0))
        score = jnp.where(weight > 0, jnp.log(jnp.where(weight > 0, weight, 1.0)) + g, ninf)
        j = jnp.argmax(score).astype(jnp.int32)
        ok = score[j] > ninf
        new_rows, new_mind, new_labels = place(s, j, rows, mind, labels)
        rows = jnp.where(ok, new_rows, rows)
        mind = jnp.where(ok, new_mind, mind)
        labels = jnp.where(ok, new_labels, labels)
        return rows, mind, labels, count + ok.astype(jnp.int32)

    init = (
        jnp.full((k,), -1, jnp.int32),
        jnp.where(valid, jnp.inf, 0.0).astype(f64),
        jnp.zeros(valid.shape, jnp.int32),
        jnp.zeros((), jnp.int32),
    )
    carry = jax.lax.fori_loop(0, start, keep, init)
    rows, mind, labels, count = jax.lax.fori_loop(start, k, draw, carry)
    return rows, count, labels, jnp.where(valid, mind, 0.0)


@functools.partial(jax.jit, static_argnames=("k",))
def kmeanspp_seeding(
    key: jax.Array,
    x: jax.Array,
    ids: jax.Array,
    valid: jax.Array,
    k: int,
    *,
    weights: jax.Array | None = None,
    prefix: jax.Array | None = None,
    start: int | jax.Array = 0,
) -> tuple[jax.Array, jax.Array]:
    """Exact (weighted) k-means++ D^2 seeding by Gumbel-max over point ids.

    Step s draws ``argmax_j (log u_j + g_j)`` with ``g_j = Gumbel(fold_in(key_s, id_j))``, where
    ``key_s = fold_in(key, s)`` (or ``key[s]`` for a stack of per-step keys), ``u_j = w_j`` at
    step 0 and ``u_j = w_j * d2(x_j, chosen)`` afterwards; this is an exact draw with probability
    ``u_j / sum u``. Weights act as multiplicities (weighted seeding on ``(x_j, w_j)`` has the
    distribution of plain seeding on the multiset with ``w_j`` copies of ``x_j``). This is plain
    D^2 sampling, one draw per step, not scikit-learn's greedy variant. Seeding stops early (the
    remaining entries are -1) once every valid row has ``u_j = 0``, i.e. when there are fewer
    than ``k`` distinct (positively weighted) points.

    The first ``start`` steps are not drawn: they re-place ``prefix[:start]`` (already chosen
    rows, e.g. the seeds kept by Algorithm 3) and only rebuild the D^2 weights; drawing resumes
    at step ``start`` with ``key_start``. With the same keys, removing a row that was never chosen
    changes no draw (the argmax of every step is unchanged).

    Args:
        key: the seeding key, or a ``[k]`` stack of per-step keys (`seeding_keys`; a raw-key
            stack is ``[k, 2]`` uint32).
        x: points ``[c, d]`` float64 (padded, see `pad_rows`).
        ids: ``[c]`` uint32 stable point ids.
        valid: ``[c]`` bool, False on padding and removed rows.
        k: number of seeds (static).
        weights: optional ``[c]`` non-negative float64 multiplicities (default 1 on valid rows).
        prefix: optional ``[k]`` int32 rows already chosen (required when ``start > 0``; must be
            valid rows); entries from ``start`` on are ignored.
        start: number of prefix rows to keep, ``0 <= start <= k`` (traced).

    Returns:
        ``(rows, count)``: ``rows`` int32 ``[k]``, the chosen row of each step (-1 after
        ``count``); ``count`` int32, the number of seeds chosen.

    References:
        Arthur & Vassilvitskii 2007; Ginart et al. 2019, Alg. 7 and spec deletion-kmeans.md 3.1,
        3.3; Pan et al. ICLR 2023, App. B and Algorithm 3, spec mufc.md 1.3 step 1 and 1.6 step 2.
    """
    rows, count, _, _ = _seed_and_assign(key, x, ids, valid, k, weights, prefix, start)
    return rows, count


@functools.partial(jax.jit, static_argnames=("k",))
def kmeanspp_seed_and_assign(
    key: jax.Array,
    x: jax.Array,
    ids: jax.Array,
    valid: jax.Array,
    k: int,
    *,
    weights: jax.Array | None = None,
    prefix: jax.Array | None = None,
    start: int | jax.Array = 0,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """`kmeanspp_seeding` that also returns each row's nearest seed, from the same pass.

    Every seed's distances to all rows are evaluated once (to update the D^2 weights); keeping
    the position of the running minimum gives the nearest-seed assignment at no extra cost.
    Ties go to the lowest position (the earlier seed).

    Args:
        key, x, ids, valid, k, weights, prefix, start: as in `kmeanspp_seeding`.

    Returns:
        ``(rows, count, positions, sq_dist)``: ``rows`` int32 ``[k]`` and ``count`` int32 as in
        `kmeanspp_seeding`; ``positions`` int32 ``[c]``, the seed position (index into ``rows``)
        nearest to each row (0 on invalid rows); ``sq_dist`` float64 ``[c]``, the squared
        distance to that seed (0 on invalid rows).

    References:
        Pan et al. ICLR 2023, Sec. 4 / Algorithm 1 line 3 ("local clustering" = nearest seed,
        ties to the lowest index); spec mufc.md 1.3 step 2.
    """
    return _seed_and_assign(key, x, ids, valid, k, weights, prefix, start)


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

"""Pure kernels of MUFC: exact unlearning of k-means++ seeds and weighted Lloyd / K-means++.

Every kernel is `jax.jit`-compiled at module level; ``k`` is static, everything else is traced.
Points travel padded to `fedproto.algorithms.kmeans.capacity` rows with a validity mask, so removals
(which only clear validity bits) and re-clustering after them reuse compiled shapes. Seeding is
the shared coupling-friendly Gumbel-max k-means++ of `fedproto.algorithms.kmeans` (draws keyed by
``(step key, point id)``), so re-running a step on data without a point that was never chosen
reproduces the step's draw exactly.

Dtypes: float64 (``algorithms`` enables JAX's 64-bit mode): costs are sums of up to ~10^5
squared distances and the weighted-versus-replicated equivalence is checked to ~1e-12; the one
exception is the server's batched nearest-centroid search in Lloyd (`weighted_lloyd_runs`),
float32 products (the means, the seeding and the costs stay float64); positions and rows are
int32.

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

#: Full float32 products on every backend: on GPUs JAX's default precision may multiply float32 in
#: TF32 (10-bit mantissas), which moved MUFC's nearest-centroid search away from the CPU's on an
#: H200 (centroids up to 0.7 apart, the same best cost); with it the two agreed to 1e-14.
_EXACT_F32 = jax.lax.Precision.HIGHEST

__all__ = [
    "first_removed_position",
    "seeding_noise",
    "seeding_race",
    "unlearn_seeding",
    "weighted_kmeans_runs",
    "weighted_lloyd",
    "weighted_lloyd_runs",
    "weighted_seeding",
    "weighted_seeding_margins",
]


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


@functools.partial(jax.jit, static_argnames=("k", "capacity"))
def seeding_noise(keys: jax.Array, k: int, capacity: int) -> jax.Array:
    """The Gumbel noise of `weighted_kmeans_runs`: ``g[r, s, j] = Gumbel(fold_in(fold_in(keys[r], s), j))``.

    It depends only on the keys and the padded size, so a server that re-clusters with the same
    key (coupled randomness) draws it once and reuses it across rounds (`seeding_race`).

    Args:
        keys: ``[r]`` stack of run keys (`fedproto.algorithms.kmeans.seeding_keys`).
        k: seeding steps (static). capacity: padded rows ``c`` (static).

    Returns:
        ``[r, k, c]`` float64.
    """
    ids = jnp.arange(capacity, dtype=jnp.uint32)

    def run(key):
        return jax.vmap(lambda s: kmeans.gumbel_by_id(jax.random.fold_in(key, s), ids))(jnp.arange(k, dtype=jnp.uint32))

    return jax.vmap(run)(keys)


@functools.partial(jax.jit, static_argnames=("k", "capacity"))
def seeding_race(keys: jax.Array, k: int, capacity: int) -> jax.Array:
    """``exp`` of `seeding_noise`: the exponential-race form ``e^g`` that `weighted_seeding` reads.

    A server that re-clusters with one key draws it once (`seeding_noise` then one ``exp`` per
    entry, a tenth of a re-clustering on the CPU) and reuses it across rounds.

    Args:
        keys: ``[r]`` stack of run keys. k: seeding steps (static). capacity: padded rows ``c``
            (static).

    Returns:
        ``[r, k, c]`` float64, positive.
    """
    return jnp.exp(seeding_noise(keys, k, capacity))


def _weighted_seeding(
    race: jax.Array, x: jax.Array, weights: jax.Array, valid: jax.Array, k: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The body of `weighted_seeding` and `weighted_seeding_margins`: ``(rows, factors, runner_up)``."""
    f64 = jnp.float64
    x = jnp.asarray(x, f64)
    w = jnp.where(valid, jnp.asarray(weights, f64), 0.0)
    n_runs, n_rows = race.shape[0], x.shape[0]
    runs = jnp.arange(n_runs)

    def draw(s, carry):
        rows, factors, runner_up, mind = carry
        weight = jnp.where(s == 0, w[None, :], jnp.where(w > 0, w * mind, 0.0))
        score = weight * race[:, s, :]
        j = jnp.argmax(score, axis=1).astype(jnp.int32)
        ok = score[runs, j] > 0
        factor = jnp.where(s == 0, 1.0, mind[runs, j])
        second = jnp.max(score.at[runs, j].set(-jnp.inf), axis=1, initial=0.0)
        diff = x[None, :, :] - x[j][:, None, :]
        d2 = jnp.sum(diff * diff, axis=-1)
        closer = ok[:, None] & valid[None, :] & (d2 < mind)
        return (
            rows.at[:, s].set(jnp.where(ok, j, -1)),
            factors.at[:, s].set(jnp.where(ok, factor, 0.0)),
            runner_up.at[:, s].set(second),
            jnp.where(closer, d2, mind),
        )

    mind0 = jnp.broadcast_to(jnp.where(valid, jnp.inf, 0.0).astype(f64), (n_runs, n_rows))
    zeros = jnp.zeros((n_runs, k), f64)
    rows, factors, runner_up, _ = jax.lax.fori_loop(
        0, k, draw, (jnp.full((n_runs, k), -1, jnp.int32), zeros, zeros, mind0)
    )
    return rows, factors, runner_up


@functools.partial(jax.jit, static_argnames=("k",))
def weighted_seeding(race: jax.Array, x: jax.Array, weights: jax.Array, valid: jax.Array, k: int) -> jax.Array:
    """Weighted D^2 seeding of every run at once, from its race (`seeding_race`).

    Seeding is that of `fedproto.algorithms.kmeans.kmeanspp_seeding` with the same noise (D^2
    weights from direct squared differences in float64), drawn as the equivalent exponential
    race: step ``s`` of run ``r`` picks ``argmax_j score_j`` with ``score_j = w_j e^{g[r, s, j]}``
    at ``s = 0`` and ``(w_j D_j^2) e^{g[r, s, j]}`` after (``D_j`` the distance to the run's
    seeds so far; ties to the lowest row); a run stops seeding once every score is 0 (fewer than
    ``k`` distinct weighted rows). Scores are monotone in each ``w_j`` and ``D_j`` depends only
    on the seeds, so lowering the weight of rows that no run picked leaves every pick unchanged,
    and so does lowering a picked row whose new score still beats its step's runner-up
    (`weighted_seeding_margins`; the skip rule of
    `fedproto.algorithms.mufc.clustering.PaddedPoints`).

    Args:
        race: ``[r, k, c]`` float64 (`seeding_race`).
        x: ``[c, d]`` float64 padded points. weights: ``[c]`` float64 non-negative (ignored off
            ``valid``). valid: ``[c]`` bool. k: seeding steps (static).

    Returns:
        ``[r, k]`` int32 seed rows in pick order, ``-1`` after a run's last seed.

    References:
        Pan et al. Algorithm 1 line 7 and App. I (weighted D^2 sampling); Arthur and
        Vassilvitskii, SODA 2007 (k-means++); spec mufc.md 1.6.
    """
    return _weighted_seeding(race, x, weights, valid, k)[0]


@functools.partial(jax.jit, static_argnames=("k",))
def weighted_seeding_margins(
    race: jax.Array, x: jax.Array, weights: jax.Array, valid: jax.Array, k: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`weighted_seeding` with what decides each pick, to tell whether lower weights keep it.

    Step ``s`` of run ``r`` picked row ``j = rows[r, s]`` with score
    ``(w_j * factors[r, s]) * race[r, s, j]`` (in that order of float64 products), where
    ``factors[r, s]`` is 1 at ``s = 0`` and ``D_j^2`` after; ``runner_up[r, s]`` is the largest
    score of any other row at that step (0 if none). With weights that are nowhere higher, every
    other row's score at a step whose earlier picks are kept is at most ``runner_up[r, s]``, so
    the pick is kept while ``(w'_j * factors[r, s]) * race[r, s, j] > runner_up[r, s]``.

    Args:
        As `weighted_seeding`.

    Returns:
        ``(rows, factors, runner_up)``: ``[r, k]`` int32 (as `weighted_seeding`), ``[r, k]``
        float64 (0 where no seed was picked), ``[r, k]`` float64 non-negative.

    References:
        Pan et al. Algorithm 1 line 7 and App. I; spec mufc.md 1.6 and 3.7 (exact unlearning).
    """
    return _weighted_seeding(race, x, weights, valid, k)


@jax.jit
def weighted_lloyd_runs(
    x: jax.Array,
    weights: jax.Array,
    valid: jax.Array,
    rows: jax.Array,
    tol_abs: float | jax.Array,
    max_iter: int | jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Weighted Lloyd for a batch of runs from their seeds (`weighted_seeding`), with their costs.

    The runs advance together: one batched assignment per Lloyd iteration (nearest centroid by
    ``||c||^2 - 2 <x, c>`` as ``[r, c, k]`` products in float32 at full precision (no TF32 on
    GPUs), the bulk of the work; ties to the lowest index) and one one-hot product in float64 for
    the weighted means (exact sums, deterministic on every backend); each run freezes once its own stopping rule holds
    (`weighted_lloyd`'s: a stable assignment or a squared shift of at most ``tol_abs``), until
    every run has stopped or ``max_iter``. The batch shrinks as runs stop (all runs, then half of
    them, ... one: the running runs gathered first), so runs that stopped early are not computed
    on; each run's iterations are the same in any batch. Each run's cost is evaluated at the end
    with direct squared differences in float64.

    Args:
        x: ``[c, d]`` float64 padded points. weights: ``[c]`` float64 (ignored off ``valid``).
        valid: ``[c]`` bool. rows: ``[r, k]`` int32 seed rows (-1 after a run's last seed).
        tol_abs: absolute tolerance on a run's squared centroid shift. max_iter: the most Lloyd
            iterations.

    Returns:
        ``(centroids, costs, n_seeds)``: ``[r, k, d]`` float64 (a run's missing centroids are
        copies of its centroid 0), ``[r]`` float64 weighted costs, ``[r]`` int32.

    References:
        Lloyd 1982; Pan et al. Algorithm 1 line 7 and App. I; spec mufc.md 1.6.
    """
    f64, f32 = jnp.float64, jnp.float32
    x = jnp.asarray(x, f64)
    w = jnp.where(valid, jnp.asarray(weights, f64), 0.0)
    n_runs, k = rows.shape
    n_rows, d = x.shape
    active = rows >= 0
    count = jnp.sum(active, axis=1).astype(jnp.int32)
    init = x[jnp.where(active, rows, rows[:, :1])]

    x32 = x.astype(f32)
    wx1 = jnp.concatenate([w[:, None] * x, w[:, None]], axis=1)  # sums and masses in one product
    centres = jnp.arange(k)

    def lloyd(c, prev, done, it, on, limit):
        """Lloyd for a batch of runs (``on``: their seeded centroids) while more than ``limit``
        of them are running."""
        offset = jnp.where(on, 0.0, jnp.inf).astype(f32)  # inactive centroids attract nothing

        def assign(c):
            c32 = c.astype(f32)
            products = jnp.einsum("nd,rkd->rnk", x32, c32, precision=_EXACT_F32)
            score = jnp.sum(c32 * c32, axis=-1)[:, None, :] - 2.0 * products
            return jnp.argmin(score + offset[:, None, :], axis=2).astype(jnp.int32)

        def cond(state):
            _, _, it, done = state
            return (jnp.sum(~done) > limit) & (it < max_iter)

        def body(state):
            c, prev, it, done = state
            labels = assign(c)
            onehot = (labels[:, :, None] == centres).astype(f64)
            both = jnp.einsum("rnk,ne->rke", onehot, wx1)
            sums, mass = both[..., :d], both[..., d]
            keep = (mass > 0) & on
            new = jnp.where(keep[..., None], sums / jnp.where(keep, mass, 1.0)[..., None], c)
            shift = jnp.sum(jnp.where(on[..., None], (new - c) ** 2, 0.0), axis=(1, 2))
            stable = jnp.all((labels == prev) | (w <= 0)[None, :], axis=1)
            new = jnp.where(done[:, None, None], c, new)
            labels = jnp.where(done[:, None], prev, labels)
            return new, labels, it + 1, done | stable | (shift <= tol_abs)

        return jax.lax.while_loop(cond, body, (c, prev, it, done))

    # The runs advance together in a batch that shrinks as they stop (n_runs, then half, ... 1):
    # runs that stopped are no longer computed once few are left. Each run's iterations are the
    # same whichever batch computes them.
    centroids, prev = init, jnp.full((n_runs, n_rows), -1, jnp.int32)
    done, it = jnp.zeros(n_runs, bool), jnp.zeros((), jnp.int32)
    sizes = [n_runs]
    while sizes[-1] > 1:
        sizes.append((sizes[-1] + 1) // 2)
    for size, limit in zip(sizes, sizes[1:] + [0], strict=True):
        pick = jnp.argsort(done, stable=True)[:size]  # the running runs first
        c_b, prev_b, it, done_b = lloyd(centroids[pick], prev[pick], done[pick], it, active[pick], limit)
        centroids, prev, done = centroids.at[pick].set(c_b), prev.at[pick].set(prev_b), done.at[pick].set(done_b)
    # costs: each row charged its squared distance (direct differences) to its nearest centroid,
    # found with float64 products
    score = jnp.sum(centroids * centroids, axis=-1)[:, None, :] - 2.0 * jnp.einsum("nd,rkd->rnk", x, centroids)
    nearest = jnp.argmin(jnp.where(active[:, None, :], score, jnp.inf), axis=2)
    diff = x[None, :, :] - jnp.take_along_axis(centroids, nearest[..., None], axis=1)
    costs = jnp.sum(w[None, :] * jnp.sum(diff * diff, axis=-1), axis=1)
    centroids = jnp.where(active[..., None], centroids, centroids[:, :1, :])
    return centroids, costs, count


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
    ``weights``; the Gumbel noise is keyed by row number) and runs weighted Lloyd from the
    seeds (the rule of `weighted_lloyd`). If the weighted rows hold fewer than ``k`` distinct
    points, seeding stops after ``m < k`` seeds (every row then sits on a seed, cost 0); the
    missing centroids are filled with copies of centroid 0, which attract no points under the
    lowest-index tie rule: `weighted_seeding` of `seeding_race`, then `weighted_lloyd_runs`
    (the runs batched), in one call.

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
    rows = weighted_seeding(seeding_race(keys, k, x.shape[0]), x, weights, valid, k)
    return weighted_lloyd_runs(x, weights, valid, rows, tol_abs, max_iter)

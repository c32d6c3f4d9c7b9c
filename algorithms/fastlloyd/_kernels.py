"""FastLloyd-specific pure kernels: sphere-packing initialisation and centroid post-processing.

The array math (`clip_moves`, `fold`, `truncate`, `update_centroids`) is `jax.jit`-compiled at
module level with its configuration (``relative``, ``post``) static. `sphere_packing` is a
sequential rejection sampler that runs once per session before the first round, so it is plain
NumPy with a local, seeded `numpy.random.Generator` (never the global RNG); every client calls it
with the same seed and obtains identical centroids without communication.

All arrays are float64 in the protocols (``algorithms`` enables JAX's x64 mode); the jitted
kernels compute in their inputs' floating dtype.

References:
    Diaa, Humphries, Kerschbaum. FastLloyd (arXiv 2405.02437): Sec. 5.3.1 (initialisation),
    Alg. 1 lines 18-20 and Sec. 5.3.5 (post-processing); spec fastlloyd.md, sections 2.4 and 2.9.
    Su et al. Differentially private k-means clustering. CODASPY 2016 (sphere packing).
"""

from __future__ import annotations

import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np

from fedproto.algorithms import kmeans

__all__ = [
    "clip_moves", "fold", "round_noise", "sphere_packing", "truncate", "update_centroids", "update_centroids_host",
]

#: Sphere packing: uniforms drawn at a time, and how many candidates one NumPy pass screens at
#: first and at most (the run grows while candidates are refused and restarts after an acceptance).
_DRAW_BLOCK, _SCREEN_FIRST, _SCREEN_MOST = 256, 4, 256

POST_PROCESSING = ("fold", "truncate", "none")
"""Accepted values of `update_centroids`' ``post`` argument."""


def sphere_packing(
    k: int, d: int, seed: int, *, bound: float = 1.0, max_retries: int = 100
) -> tuple[np.ndarray, float]:
    """Data-independent initial centroids by sphere packing, halving variant.

    Starting from ``a = bound``: draw candidates uniformly from ``[-B + a, B - a]^d``; accept the
    first unconditionally and each later one iff its distance to every accepted centre is
    ``>= 2a`` (the retry counter resets on each acceptance); stop when ``k`` centres are accepted
    (return them) or after ``max_retries`` consecutive rejections, in which case ``a`` is halved
    and the packing restarts. One generator stream is shared by all attempts. This is the
    authors' code (which the paper's numbers come from); the paper's prose describes a binary
    search for the largest feasible ``a``. ``a = B`` always fails for ``k >= 2`` (the sampling box
    is the single point 0), so for ``k >= 2`` the returned radius is ``B * 2^-m`` with ``m >= 1``.

    The initialisation reads no data, so it costs no privacy budget.

    Args:
        k: number of centroids, ``>= 1``.
        d: dimension, ``>= 1``.
        seed: seed of the local `numpy.random.default_rng` generator; the same seed gives the same
            centroids on every client.
        bound: half-width ``B > 0`` of the domain ``[-B, B]^d``.
        max_retries: consecutive rejections tolerated before halving ``a`` (the paper: 100).

    Returns:
        ``(centroids, a)``: float64 ``[k, d]`` centroids inside ``[-B + a, B - a]^d`` with
        pairwise distances ``>= 2a``, and the radius ``a`` (a Python float).

    Raises:
        ValueError: invalid arguments, or ``a`` underflows (shrinks below ``B * 2^-52``, where the
            spacing constraint is meaningless in float64) before ``k`` centres fit, which happens
            for ``max_retries = 0`` (no candidate is ever drawn, as in the authors' loop) or an
            astronomically large ``k``.

    References:
        FastLloyd, Sec. 5.3.1 and Alg. 1 line 3; Su et al. 2016, Sec. 4; spec fastlloyd.md,
        section 2.4 ([CODE] procedure) and oracle 7.4.21.
    """
    k = operator.index(k)
    d = operator.index(d)
    max_retries = operator.index(max_retries)
    bound = float(bound)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if d < 1:
        raise ValueError(f"d must be >= 1, got {d}")
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    if not (np.isfinite(bound) and bound > 0):
        raise ValueError(f"bound must be a positive finite number, got {bound}")
    rng = np.random.default_rng(seed)
    min_radius = bound * np.finfo(np.float64).eps
    a = bound
    centres = np.empty((k, d), dtype=np.float64)
    # The authors' loop draws one candidate at a time. Here the uniforms come from the same stream
    # in blocks (``rng.random((n, d))`` is ``n`` calls of ``rng.random(d)``, value for value), and
    # a run of candidates is screened against the centres accepted so far in one NumPy pass:
    # each candidate's test, up to the first accepted one, is the one the loop would make, with
    # the same arithmetic, so the centres and the radius are the loop's bit for bit
    # (tests/algorithms/fastlloyd/test_kernels.py compares them with a transliteration).
    uniforms, used = np.empty((0, d)), 0
    while a >= min_radius:
        lo, width = -bound + a, 2.0 * bound - 2.0 * a
        accepted, retries, run = 0, 0, _SCREEN_FIRST
        while accepted < k and retries < max_retries:
            n = 1 if accepted == 0 else min(run, max_retries - retries)
            if used + n > len(uniforms):
                uniforms, used = np.concatenate([uniforms[used:], rng.random((max(n, _DRAW_BLOCK), d))]), 0
            candidates = uniforms[used:used + n] * width + lo
            if accepted == 0:
                centres[0] = candidates[0]
                accepted, used = 1, used + 1
                continue
            squared = np.sum((centres[None, :accepted] - candidates[:, None]) ** 2, axis=2)
            fits = np.flatnonzero(np.sqrt(np.min(squared, axis=1)) >= 2.0 * a)
            if fits.size == 0:
                retries, used, run = retries + n, used + n, min(4 * run, _SCREEN_MOST)
                continue
            first = int(fits[0])
            centres[accepted] = candidates[first]
            accepted, used, retries, run = accepted + 1, used + first + 1, 0, _SCREEN_FIRST
        if accepted == k:
            return centres, float(a)
        a /= 2.0
    raise ValueError(
        f"sphere packing failed: the radius underflowed below {float(min_radius)!r} before {k} centres "
        f"fitted in [-{bound}, {bound}]^{d} (max_retries={max_retries})"
    )


@jax.jit
def clip_moves(new: jax.Array, old: jax.Array, radius: float | jax.Array) -> jax.Array:
    """Radius clipping: limit each centroid's move to ``radius``, keeping its direction.

    For each row ``j`` with ``||new_j - old_j|| > radius`` the result is
    ``old_j + (new_j - old_j) * radius / ||new_j - old_j||`` (move norm equal to ``radius`` up to
    rounding); other rows, including zero moves, are returned unchanged (bit for bit). An
    infinite radius disables clipping.

    Args:
        new: proposed centroids, float ``[k, d]``.
        old: previous centroids ``mu~^(t-1)``, float ``[k, d]``.
        radius: scalar ``eta_t >= 0`` (traced).

    Returns:
        Clipped centroids, ``[k, d]``, in the inputs' float dtype.

    References:
        FastLloyd, Sec. 5.3.5 ("if the new centroid is more than eta away from the previous
        centroid, we truncate it to be eta away"); spec section 2.9 step 2, oracle 7.4.22.
    """
    dtype = jnp.result_type(new, old, float)
    new = jnp.asarray(new, dtype)
    old = jnp.asarray(old, dtype)
    move = new - old
    norm = jnp.sqrt(jnp.sum(move * move, axis=-1, keepdims=True))
    too_far = norm > radius
    scale = radius / jnp.where(too_far, norm, jnp.ones((), dtype))
    return jnp.where(too_far, old + move * scale, new)


@jax.jit
def fold(x: jax.Array, bound: float | jax.Array = 1.0) -> jax.Array:
    """Fold values into ``[-B, B]`` by reflecting across the boundaries (period ``4B``).

    ``u = (x + B) mod 4B``; ``u = 4B - u`` if ``u > 2B``; result ``u - B``. Values already in
    ``[-B, B]`` are returned unchanged (bit for bit, avoiding the rounding of ``(x + B) - B``).
    Examples for ``B = 1``: 1.5 -> 0.5, -1.2 -> -0.8, 2.0 -> 0.0, 3.5 -> -0.5, -3.0 -> 1.0.

    Args:
        x: values, any shape ``[...]``, float.
        bound: half-width ``B > 0`` (traced).

    Returns:
        Array of the same shape and float dtype, in ``[-B, B]``.

    References:
        FastLloyd, Sec. 5.3.5 and Alg. 1 line 20 (the prose's "mod 2B" is a typo; the authors'
        code, following diffprivlib, uses period 4B); spec section 2.9 step 3, oracle 7.4.23.
    """
    dtype = jnp.result_type(x, float)
    x = jnp.asarray(x, dtype)
    bound = jnp.asarray(bound, dtype)
    u = jnp.mod(x + bound, 4.0 * bound)
    u = jnp.where(u > 2.0 * bound, 4.0 * bound - u, u)
    folded = jnp.clip(u - bound, -bound, bound)  # guards against rounding just past the edge
    return jnp.where(jnp.abs(x) <= bound, x, folded)


@jax.jit
def truncate(x: jax.Array, bound: float | jax.Array = 1.0) -> jax.Array:
    """Truncate (clip) values to ``[-B, B]``.

    Args:
        x: values, any shape ``[...]``, float.
        bound: half-width ``B > 0`` (traced).

    Returns:
        Array of the same shape and float dtype.

    References:
        FastLloyd, Sec. 5.3.5 (the "naive" strategy) and App. B; spec section 2.9.
    """
    dtype = jnp.result_type(x, float)
    x = jnp.asarray(x, dtype)
    bound = jnp.asarray(bound, dtype)
    return jnp.clip(x, -bound, bound)


@functools.partial(jax.jit, static_argnames=("relative", "post"))
def update_centroids(
    sums: jax.Array,
    counts: jax.Array,
    previous: jax.Array,
    radius: float | jax.Array,
    *,
    relative: bool,
    post: str,
    bound: float | jax.Array = 1.0,
) -> jax.Array:
    """Turn the (noisy, unmasked) aggregate into the next public centroids.

    1. Divide: ``mu_hat_j = R~_j / C~_j + previous_j`` when ``relative`` (FastLloyd Eq. 10;
       without noise it equals ``S_j / C_j``, Eq. 11), or ``mu_hat_j = S~_j / C~_j`` for the
       baselines' absolute sums.
    2. A cluster whose noisy count is below 1 keeps ``previous_j``. Design decision (not in the
       paper, whose code divides by ``C~ + 1e-9``): a count near or below zero is noise, and
       dividing by it gives an arbitrary point; keeping the previous centroid is post-processing
       of the released ``(R~, C~)``, so the privacy guarantee is unaffected.
    3. If ``radius`` is finite, clip each move to ``radius`` (`clip_moves`).
    4. Domain post-processing: ``post = "fold"`` (`fold`), ``"truncate"`` (`truncate`) or
       ``"none"``.

    Args:
        sums: relative sums ``R~`` or absolute sums ``S~``, float ``[k, d]``.
        counts: counts ``C~``, float ``[k]``.
        previous: centroids of the previous iteration ``mu~^(t-1)``, float ``[k, d]``.
        radius: scalar ``eta_t`` (traced); ``jnp.inf`` disables clipping.
        relative: whether ``sums`` are relative to ``previous`` (static).
        post: ``"fold"``, ``"truncate"`` or ``"none"`` (static).
        bound: domain half-width ``B`` for folding/truncation (traced).

    Returns:
        New centroids ``mu~^(t)``, float ``[k, d]``.

    Raises:
        ValueError: ``post`` is not one of the accepted strings.

    References:
        FastLloyd, Alg. 1 lines 18-20, Eqs. 10-11, Sec. 5.3.5; spec section 2.9 (order:
        divide -> clip -> fold).
    """
    if post not in POST_PROCESSING:
        raise ValueError(f"post must be one of {POST_PROCESSING}, got {post!r}")
    dtype = jnp.result_type(sums, counts, previous, float)
    sums = jnp.asarray(sums, dtype)
    counts = jnp.asarray(counts, dtype)
    previous = jnp.asarray(previous, dtype)
    usable = counts >= 1.0
    means = sums / jnp.where(usable, counts, jnp.ones((), dtype))[:, None]
    if relative:
        means = means + previous
    centroids = jnp.where(usable[:, None], means, previous)
    centroids = clip_moves(centroids, previous, radius)  # a no-op for an infinite radius
    if post == "fold":
        centroids = fold(centroids, bound)
    elif post == "truncate":
        centroids = truncate(centroids, bound)
    return centroids


def update_centroids_host(
    sums: np.ndarray,
    counts: np.ndarray,
    previous: np.ndarray,
    radius: float,
    *,
    relative: bool,
    post: str,
    bound: float = 1.0,
) -> np.ndarray:
    """:func:`update_centroids` with NumPy on the host, for a few centroids.

    The same steps in the same order (divide, keep a centroid whose count is below 1, clip the
    move, fold or truncate), each an element-wise IEEE operation that NumPy and XLA round alike;
    without a jitted call's dispatch, which dominates at ``k (d+1)`` of a few dozen elements and
    is paid by every client of a simulation each round.

    Args:
        sums, counts, previous: float64 ``[k, d]``, ``[k]``, ``[k, d]``.
        radius: ``eta_t`` (``math.inf`` disables clipping).
        relative, post, bound: as for :func:`update_centroids`.

    Returns:
        float64 ``[k, d]``: the next centroids, read-only (the same array for equal inputs: a
        process that hosts many clients computes each round's update once).

    Raises:
        ValueError: ``post`` is not one of :data:`POST_PROCESSING`.

    References:
        FastLloyd, Alg. 1 lines 18-20, Eqs. 10-11, Sec. 5.3.5; spec section 2.9.
    """
    if post not in POST_PROCESSING:
        raise ValueError(f"post must be one of {POST_PROCESSING}, got {post!r}")
    # Every client of a run turns the same broadcast into the same centroids: a process hosting
    # many clients computes each update once (the inputs' bytes are the key; a pure function).
    key = (sums.tobytes(), counts.tobytes(), previous.tobytes(), sums.shape, float(radius), relative, post, float(bound))
    cached = _UPDATES.get(key)
    if cached is None:
        cached = _update_centroids_host(sums, counts, previous, radius, relative=relative, post=post, bound=bound)
        cached.flags.writeable = False
        if len(_UPDATES) >= _UPDATES_KEPT:
            _UPDATES.pop(next(iter(_UPDATES)))
        _UPDATES[key] = cached
    return cached


#: Recent host updates by their inputs' bytes (see update_centroids_host).
_UPDATES: dict[tuple, np.ndarray] = {}
_UPDATES_KEPT = 16


def _update_centroids_host(
    sums: np.ndarray, counts: np.ndarray, previous: np.ndarray, radius: float, *, relative: bool, post: str, bound: float
) -> np.ndarray:
    usable = counts >= 1.0
    if usable.all():
        centroids = sums / counts[:, None]
        if relative:
            centroids = centroids + previous
    else:
        means = sums / np.where(usable, counts, 1.0)[:, None]
        if relative:
            means = means + previous
        centroids = np.where(usable[:, None], means, previous)
    move = centroids - previous
    norm = np.sqrt(np.sum(move * move, axis=-1, keepdims=True))
    too_far = norm > radius
    if too_far.any():
        centroids = np.where(too_far, previous + move * (radius / np.where(too_far, norm, 1.0)), centroids)
    if post != "none" and float(np.max(np.abs(centroids))) <= bound:
        return centroids  # inside the domain: folding and truncation change nothing
    if post == "fold":
        u = np.mod(centroids + bound, 4.0 * bound)
        u = np.where(u > 2.0 * bound, 4.0 * bound - u, u)
        folded = np.clip(u - bound, -bound, bound)
        centroids = np.where(np.abs(centroids) <= bound, centroids, folded)
    elif post == "truncate":
        centroids = np.clip(centroids, -bound, bound)
    return centroids


@functools.partial(jax.jit, static_argnames=("k", "d", "mechanism"))
def round_noise(
    seed: int | jax.Array, round_idx: int | jax.Array, sum_scale: float | jax.Array, count_scale: float | jax.Array,
    *, k: int, d: int, mechanism: str,
) -> tuple[jax.Array, jax.Array]:
    """The server's noise of one iteration, drawn in one kernel.

    The key is ``fold_in(PRNGKey(seed), round_idx)``, split into the sums' key and the counts'
    key; each draw is `kmeans.gaussian_noise` or `kmeans.laplace_noise`. One compiled kernel, not
    five small ones (the key's creation, folding and splitting, and the two draws, each JAX
    compiles or loads from its cache on first use): about 0.2 s less of every run's start-up.

    Args:
        seed: the server's noise seed (an integer).
        round_idx: the iteration t.
        sum_scale: the sums' standard deviation (Gaussian) or scale (Laplace), ``>= 0``.
        count_scale: the counts' standard deviation or scale, ``>= 0``.
        k, d: clusters and dimensions (static).
        mechanism: ``"gaussian"`` or ``"laplace"`` (static).

    Returns:
        ``(sums, counts)``: float64 ``[k, d]`` and ``[k]``.

    Raises:
        ValueError: an unknown ``mechanism``.

    References:
        FastLloyd, Sec. 5.1 and Alg. 1 lines 15-16 (noise on R and C); spec fastlloyd.md,
        section 2.3 item 5 and 2.8 (the server samples the noise in the clear); Su et al.,
        CODASPY 2016 (Laplace, the SuLloyd baseline).
    """
    draws = {"gaussian": kmeans.gaussian_noise, "laplace": kmeans.laplace_noise}
    if mechanism not in draws:
        raise ValueError(f"mechanism must be 'gaussian' or 'laplace', got {mechanism!r}")
    key_sum, key_count = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), round_idx))
    draw = draws[mechanism]
    return draw(key_sum, (k, d), sum_scale), draw(key_count, (k,), count_scale)

"""Dense array kernels of (k,z)-clustering: distances, nearest centres, truncated costs.

These are the vectorised parts of the algorithms: `jax.jit`-compiled, pure functions of arrays,
float64 (importing `algorithms` turns on JAX's 64-bit mode; ball tests compare distances with
radii, and float32 would flip points at the ball boundary, spec section 2.8).

Shapes are padded to power-of-two row counts before they reach the compiled functions. A run has
one point set per machine, each of its own size, and a test suite has hundreds of tiny instances:
without padding every new size would compile again (about 0.1 s each). Padding rows are
discarded before returning, so the results are exactly those of the unpadded computation.

The sequential greedy procedures (aggregation, the Charikar-style covers, farthest-first,
reverse greedy) live in :mod:`fedproto.algorithms.kzclustering.solvers` as NumPy code: each step depends on
the previous one and touches only the points it removes, which costs O(n^2) in total with
incremental counts, whereas a jitted ``lax.while_loop`` would redo an O(n^2) matrix-vector
product per step.

Distances are computed as ``sqrt(sum((x - y)^2))`` (not the expanded ``|x|^2 - 2x.y + |y|^2``,
which cancels catastrophically for nearby points and breaks exact ties on integer fixtures);
under `jit` XLA fuses the broadcast into the reduction, so the ``[n, m, d]`` difference tensor is
not materialised.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "nearest_centres",
    "pairwise_distances",
    "truncated_cost_curve",
    "uniform_draws",
]

_MIN_BUCKET = 8


def _bucket(n: int) -> int:
    """The padded row count for ``n`` rows: the next power of two, at least 8."""
    return max(_MIN_BUCKET, 1 << max(0, int(n) - 1).bit_length())


def _pad_rows(x: np.ndarray, rows: int, fill_row: np.ndarray | None = None) -> np.ndarray:
    if x.shape[0] == rows:
        return x
    pad = np.zeros((rows - x.shape[0], x.shape[1]), dtype=x.dtype) if fill_row is None else np.broadcast_to(
        fill_row, (rows - x.shape[0], x.shape[1])
    )
    return np.concatenate([x, pad], axis=0)


@jax.jit
def _pairwise_distances(x: jax.Array, y: jax.Array) -> jax.Array:
    diff = x[:, None, :] - y[None, :, :]
    return jnp.sqrt(jnp.sum(diff * diff, axis=-1))


def pairwise_distances(x: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
    """Euclidean distances between the rows of ``x`` and of ``y``.

    Args:
        x: points ``[n, d]`` float64.
        y: points ``[m, d]`` float64 (default: ``x``).

    Returns:
        ``[n, m]`` float64 (a writable NumPy array). ``n`` or ``m`` may be 0.

    Raises:
        ValueError: the arrays are not 2-D or their widths differ.
    """
    x = np.asarray(x, dtype=np.float64)
    y = x if y is None else np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"need [n, d] and [m, d] arrays, got {x.shape} and {y.shape}")
    n, m = x.shape[0], y.shape[0]
    if n == 0 or m == 0:
        return np.zeros((n, m), dtype=np.float64)
    out = np.asarray(_pairwise_distances(_pad_rows(x, _bucket(n)), _pad_rows(y, _bucket(m))))
    return np.array(out[:n, :m], dtype=np.float64)  # cut in NumPy: a jax slice would compile per size


@jax.jit
def _nearest_centres(x: jax.Array, centres: jax.Array) -> tuple[jax.Array, jax.Array]:
    dist = _pairwise_distances(x, centres)
    return jnp.min(dist, axis=1), jnp.argmin(dist, axis=1).astype(jnp.int64)


def nearest_centres(x: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distance of each point to its nearest centre, and that centre's index.

    Ties go to the lowest centre index. With no centres every distance is ``inf`` and every index
    is -1 (an empty centre set serves no point: all of them are outliers).

    Args:
        x: points ``[n, d]`` float64.
        centres: centres ``[c, d]`` float64 (``c`` may be 0).

    Returns:
        ``(dist, labels)``: float64 ``[n]`` and int64 ``[n]``.

    References:
        Spec kz-clustering.md section 1.1: ``d(p, C) = min_{c in C} d(p, c)``.
    """
    x = np.asarray(x, dtype=np.float64)
    centres = np.asarray(centres, dtype=np.float64).reshape(-1, x.shape[1] if x.ndim == 2 else 0)
    n, c = x.shape[0], centres.shape[0]
    if c == 0:
        return np.full(n, np.inf), np.full(n, -1, dtype=np.int64)
    if n == 0:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    # padded centres repeat centre 0, so neither the minimum nor the first arg-minimum changes
    dist, labels = _nearest_centres(_pad_rows(x, _bucket(n)), _pad_rows(centres, _bucket(c), centres[0]))
    return np.array(np.asarray(dist)[:n], dtype=np.float64), np.array(np.asarray(labels)[:n], dtype=np.int64)


@functools.partial(jax.jit, static_argnames=("power",))
def _truncated_cost_curve(dist: jax.Array, weights: jax.Array, radii: jax.Array, power: int) -> jax.Array:
    clipped = jnp.minimum(dist[None, :], radii[:, None])
    return jnp.sum(weights[None, :] * clipped**power, axis=1)


def truncated_cost_curve(dist: np.ndarray, weights: np.ndarray, radii: np.ndarray, power: int) -> np.ndarray:
    """``sum_p w_p min(d_p, L)^l`` for every truncation radius ``L`` (the metric ``d_L``).

    Args:
        dist: distances ``d(p, C)`` ``[n]`` float64 (``inf`` allowed: truncated to ``L``).
        weights: weights ``[n]`` float64 (may be negative for coreset centres).
        radii: truncation radii ``[T]`` float64, ``>= 0``.
        power: ``l`` = 1 (median) or 2 (means).

    Returns:
        ``[T]`` float64.

    References:
        Guo & Li, Appendix C, Lemma C.1 (``d_L = min(d, L)``); spec section 3.2.
    """
    dist = np.asarray(dist, dtype=np.float64).ravel()
    weights = np.asarray(weights, dtype=np.float64).ravel()
    radii = np.asarray(radii, dtype=np.float64).ravel()
    if dist.shape != weights.shape:
        raise ValueError("dist and weights must have the same length")
    if power not in (1, 2):
        raise ValueError("power must be 1 (median) or 2 (means)")
    if radii.size == 0:
        return np.zeros(0)
    n = dist.shape[0]
    rows = _bucket(n)
    d = np.concatenate([dist, np.zeros(rows - n)])
    w = np.concatenate([weights, np.zeros(rows - n)])
    t = radii.shape[0]
    r = np.concatenate([radii, np.zeros(_bucket(t) - t)])
    return np.array(np.asarray(_truncated_cost_curve(d, w, r, power))[:t], dtype=np.float64)


@functools.partial(jax.jit, static_argnames=("count",))
def _uniform_draws(key: jax.Array, count: int) -> jax.Array:
    return jax.random.uniform(key, (count,), dtype=jnp.float64)


def uniform_draws(key: jax.Array, count: int) -> np.ndarray:
    """``count`` i.i.d. uniforms on [0, 1) from ``key`` (float64).

    The draw is made at the padded size (next power of two) and cut, so the kernel compiles once
    per size bucket; the first ``count`` values depend only on ``key`` and the bucket.

    Args:
        key: a ``jax.random`` key (per party: ``fold_in(key, party_index)``).
        count: how many values, ``>= 0``.

    Returns:
        float64 ``[count]``.
    """
    if count < 0:
        raise ValueError("count must be >= 0")
    if count == 0:
        return np.zeros(0)
    return np.array(np.asarray(_uniform_draws(key, _bucket(count)))[:count], dtype=np.float64)

"""Dense array kernels of (k,z)-clustering: distances, nearest centres, truncated costs.

The vectorised parts of the algorithms. Distances between point sets (and to the nearest centre)
are NumPy code with one fixed order of floating-point operations (below); the other kernels are
`jax.jit`-compiled pure functions of arrays. Everything is float64 (importing `algorithms` turns
on JAX's 64-bit mode): ball tests compare distances with radii, and float32 would flip points at
the ball boundary (spec section 2.8).

**The canonical distance.** ``d(p, q) = sqrt(s)`` with ``s = (p_0 - q_0)^2``, then
``s = s + (p_j - q_j)^2`` for ``j = 1 .. d-1`` in that order, each operation rounded to float64
(no fused multiply-add, no reassociation). `pairwise_distances` (whole matrices, tile by tile)
and `pair_distances` (chosen index pairs) apply exactly these operations, so they agree bit for
bit, whatever the shapes: a blocked or sparse computation of a ball ``d(p, q) <= r`` then makes
the same decisions as the dense matrix, ties at the boundary included. A `jax.jit` kernel cannot
promise this: XLA picks a summation order (and fuses multiply-adds) per vectorisation lane, and
the result of one entry changed with the shape of the call (measured: a third of the entries of
a 700 x 700 matrix in d = 5 differed in the last bit from a sequential sum, and a row block
differed from the same rows of the full matrix). The expanded form ``|x|^2 - 2x.y + |y|^2`` is
not used either: it cancels catastrophically for nearby points and breaks exact ties on
integer fixtures. Being symmetric (``(a-b)^2 == (b-a)^2`` exactly), ``d(p, q) == d(q, p)``.

Shapes of the jitted kernels are padded to power-of-two row counts before they reach the
compiled functions. A run has one point set per machine, each of its own size, and a test suite
has hundreds of tiny instances: without padding every new size would compile again (about 0.1 s
each). Padding rows are discarded before returning, so the results are exactly those of the
unpadded computation.

The sequential greedy procedures (aggregation, the Charikar-style covers, farthest-first,
reverse greedy) live in :mod:`fedproto.algorithms.kzclustering.solvers` as NumPy code: each step
depends on the previous one and touches only the points it removes.
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "ball_counts",
    "nearest_centres",
    "pair_distances",
    "pair_distances_by_columns",
    "pairwise_distances",
    "truncated_cost_curve",
    "uniform_draws",
]

_MIN_BUCKET = 8


def _bucket(n: int) -> int:
    """The padded row count for ``n`` rows: the next power of two, at least 8."""
    return max(_MIN_BUCKET, 1 << max(0, int(n) - 1).bit_length())


_TILE_COLS = 4096
_TILE_ENTRIES = 1 << 18
_PAIR_CHUNK = 1 << 15


def _as_points(x: np.ndarray, y: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.float64)
    y = x if y is None else np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"need [n, d] and [m, d] arrays, got {x.shape} and {y.shape}")
    return x, y


def pairwise_distances(x: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
    """Euclidean distances between the rows of ``x`` and of ``y`` (the canonical distance).

    Computed in tiles of 2^18 entries (at most 4096 columns; the temporaries stay in cache), with
    the fixed order of operations of the module docstring, so every entry equals `pair_distances`
    of the same two rows bit for bit. From 2^21 entries on, two threads share the tiles (the
    values do not depend on which thread computes them).

    Args:
        x: points ``[n, d]`` float64.
        y: points ``[m, d]`` float64 (default: ``x``).

    Returns:
        ``[n, m]`` float64 (a writable NumPy array). ``n`` or ``m`` may be 0.

    Raises:
        ValueError: the arrays are not 2-D or their widths differ.
    """
    x, y = _as_points(x, y)
    n, m = x.shape[0], y.shape[0]
    out = np.empty((n, m), dtype=np.float64)
    if n == 0 or m == 0:
        return out
    if x.shape[1] == 0:
        out.fill(0.0)
        return out
    yt = np.ascontiguousarray(y.T)
    cols = min(m, _TILE_COLS)
    rows = max(1, _TILE_ENTRIES // cols)  # narrow results (few centres) get tall tiles
    starts = list(range(0, n, rows))
    workers = _distance_workers() if n * m >= _PARALLEL_ENTRIES else 1
    if workers == 1:
        _distance_tiles(x, yt, out, starts, rows, cols)
    else:
        # tiles are independent and NumPy releases the GIL inside each operation; every entry is
        # computed by the same operations whichever thread runs it
        shares = [starts[w::workers] for w in range(workers)]
        list(_pool().map(lambda share: _distance_tiles(x, yt, out, share, rows, cols), shares))
    return out


_PARALLEL_ENTRIES = 1 << 21
_POOL: concurrent.futures.ThreadPoolExecutor | None = None


def _distance_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = concurrent.futures.ThreadPoolExecutor(_distance_workers(), thread_name_prefix="kz-distances")
    return _POOL


def _distance_tiles(x: np.ndarray, yt: np.ndarray, out: np.ndarray, starts: list[int], rows: int, cols: int) -> None:
    """Fill the row tiles of ``out`` that start at ``starts`` (the canonical distance)."""
    m = out.shape[1]
    tmp = np.empty((min(out.shape[0], rows), cols), dtype=np.float64)
    for r0 in starts:
        xb = x[r0 : r0 + rows]
        for c0 in range(0, m, cols):
            s = out[r0 : r0 + rows, c0 : c0 + cols]
            t = tmp[: s.shape[0], : s.shape[1]]
            np.subtract(xb[:, 0, None], yt[0, None, c0 : c0 + cols], out=s)
            np.multiply(s, s, out=s)
            for j in range(1, x.shape[1]):
                np.subtract(xb[:, j, None], yt[j, None, c0 : c0 + cols], out=t)
                np.multiply(t, t, out=t)
                np.add(s, t, out=s)
            np.sqrt(s, out=s)


def pair_distances(x: np.ndarray, rows: np.ndarray, cols: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
    """The canonical distances ``d(x[rows[e]], y[cols[e]])`` of chosen index pairs.

    The same operations as `pairwise_distances`, entry for entry, so the results are identical
    to the corresponding matrix entries (the blocked and sparse ball tests rely on it). Works in
    chunks of 2^15 pairs, so the temporaries stay in cache.

    Args:
        x: points ``[n, d]`` float64.
        rows: indices into ``x`` ``[P]`` (any integer dtype; broadcast against ``cols``).
        cols: indices into ``y`` ``[P]``.
        y: points ``[m, d]`` float64 (default: ``x``).

    Returns:
        float64 ``[P]``.

    Raises:
        ValueError: the arrays are not 2-D or their widths differ.
    """
    x, y = _as_points(x, y)
    xt = np.ascontiguousarray(x.T)
    return pair_distances_by_columns(xt, rows, cols, xt if y is x else np.ascontiguousarray(y.T))


def pair_distances_by_columns(
    xt: np.ndarray, rows: np.ndarray, cols: np.ndarray, yt: np.ndarray | None = None
) -> np.ndarray:
    """`pair_distances` for points stored by coordinate: ``xt`` is ``[d, n]`` (C-contiguous).

    For callers that measure many pair sets on the same points and keep the transposed copy.

    Args:
        xt: coordinates ``[d, n]`` float64, C-contiguous.
        rows: indices into the columns of ``xt`` ``[P]``.
        cols: indices into the columns of ``yt`` ``[P]``.
        yt: ``[d, m]`` (default: ``xt``).

    Returns:
        float64 ``[P]``, equal bit for bit to `pair_distances` of the untransposed points.
    """
    yt = xt if yt is None else yt
    rows, cols = np.broadcast_arrays(np.asarray(rows), np.asarray(cols))
    rows, cols = rows.ravel(), cols.ravel()
    out = np.empty(rows.shape[0], dtype=np.float64)
    if out.shape[0] == 0:
        return out
    if xt.shape[0] == 0:
        out.fill(0.0)
        return out
    t = np.empty(min(out.shape[0], _PAIR_CHUNK), dtype=np.float64)
    for e0 in range(0, out.shape[0], _PAIR_CHUNK):
        r, c = rows[e0 : e0 + _PAIR_CHUNK], cols[e0 : e0 + _PAIR_CHUNK]
        s = out[e0 : e0 + _PAIR_CHUNK]
        u = t[: s.shape[0]]
        np.subtract(xt[0].take(r), yt[0].take(c), out=s)
        np.multiply(s, s, out=s)
        for j in range(1, xt.shape[0]):
            np.subtract(xt[j].take(r), yt[j].take(c), out=u)
            np.multiply(u, u, out=u)
            np.add(s, u, out=s)
        np.sqrt(s, out=s)
    return out


# --- ball counts: a compiled screen, the canonical distance where it cannot decide ------------

_COUNT_BLOCK = 64
"""Rows of one block of the compiled count (a ``[64, m]`` tile of squared distances)."""
_COUNT_CHUNK = 1024
"""Rows per call of the compiled count (16 blocks; the one compiled row shape)."""
_COUNT_MIN_PAIRS = 1 << 18
"""Below this many pairs `ball_counts` uses the canonical NumPy distance directly (measured: the
compiled screen is 3-4 times faster from about 2^18 pairs on)."""
_COUNT_BAND = 1e-9
"""Relative half-width of the band of squared distances the compiled screen leaves undecided.

The screen sums the same non-negative squares in whatever order (and with whatever fused
multiply-adds) XLA picks, so its squared distance is within ``(d + 2) u`` (``u = 2^-53``)
relative error of the canonical sum; a square root rounded to nearest moves the boundary by
less than ``2u``. A pair whose screened square lies outside ``r^2 (1 -+ 1e-9)`` is therefore
decided as the canonical distance decides it, for any ``d`` below about 10^6."""
_COUNT_FLOOR = 1e-280
"""Squared radii below this (and the absolute slack of the band) go to the canonical distance:
squares of differences below about 1e-154 underflow."""


@jax.jit
def _screen_counts(xc: jax.Array, yt: jax.Array, lo: jax.Array, hi: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per row of ``xc`` ``[C, d]``: the columns of ``yt`` ``[d, m]`` with squared distance
    ``<= lo`` and those in ``(lo, hi]`` (int32 ``[C]`` each), a ``[64, m]`` tile at a time."""

    def block(xb: jax.Array) -> tuple[jax.Array, jax.Array]:
        s = (xb[:, 0, None] - yt[0, None, :]) ** 2
        for j in range(1, xb.shape[1]):
            s = s + (xb[:, j, None] - yt[j, None, :]) ** 2
        inside = jnp.sum(s <= lo, axis=1, dtype=jnp.int32)
        undecided = jnp.sum((s > lo) & (s <= hi), axis=1, dtype=jnp.int32)
        return inside, undecided

    inside, undecided = jax.lax.map(block, xc.reshape(-1, _COUNT_BLOCK, xc.shape[1]))
    return inside.reshape(-1), undecided.reshape(-1)


def _count_columns(m: int) -> int:
    """The padded column count of the compiled count: a multiple of an eighth of the next power
    of two (at least 256), so at most 12.5% padding and eight compiled shapes per octave."""
    step = max(256, 1 << max(0, int(m).bit_length() - 3))
    return -(-int(m) // step) * step


def ball_counts(x: np.ndarray, radius: float, y: np.ndarray | None = None) -> np.ndarray:
    """``|{q in y : d(p, q) <= radius}|`` for every row p of ``x``, by the canonical distance.

    Exactly ``np.count_nonzero(pairwise_distances(x, y) <= radius, axis=1)``, without the
    matrix and several times faster on large inputs: a compiled kernel (`jax.jit`, CPU or GPU)
    screens the squared distances, a ``[64, m]`` tile at a time, and decides every pair whose
    square is not within a relative 1e-9 of ``radius^2`` (the screen's rounding differs from the
    canonical order by far less, see ``_COUNT_BAND``); the rows with an undecided pair are
    counted again with the canonical distance. Small inputs (under 2^18 pairs), a zero or tiny
    radius and zero-width points use the canonical distance throughout.

    Args:
        x: points ``[n, d]`` float64, finite.
        radius: the ball radius, ``>= 0`` (same units as the points).
        y: points ``[m, d]`` float64, finite (default: ``x``).

    Returns:
        int64 ``[n]``, each in ``[0, m]``.

    Raises:
        ValueError: the arrays are not 2-D, their widths differ, or ``radius`` is negative or NaN.

    References:
        Guo & Li, Algorithm 2 (the ball sizes ``|ball_U(p, 2L)|``); spec section 2.8 (float64 ball
        tests).
    """
    x, y = _as_points(x, y)
    radius = float(radius)
    if not radius >= 0:
        raise ValueError(f"radius must be >= 0, got {radius}")
    n, m, d = x.shape[0], y.shape[0], x.shape[1]
    r2 = radius * radius
    if n * m < _COUNT_MIN_PAIRS or d == 0 or not _COUNT_FLOOR <= r2 < math.inf:
        return _canonical_counts(x, y, radius)
    cols = _count_columns(m)
    yt = np.full((d, cols), np.inf)
    yt[:, :m] = y.T  # padding columns are infinitely far: never inside, never undecided
    yt = jnp.asarray(yt)
    lo, hi = r2 * (1.0 - _COUNT_BAND), r2 * (1.0 + _COUNT_BAND) + _COUNT_FLOOR
    rows = -(-n // _COUNT_CHUNK) * _COUNT_CHUNK
    xp = np.zeros((rows, d))
    xp[:n] = x
    parts = [_screen_counts(xp[r0 : r0 + _COUNT_CHUNK], yt, lo, hi) for r0 in range(0, rows, _COUNT_CHUNK)]
    inside = np.concatenate([np.asarray(p[0]) for p in parts])[:n].astype(np.int64)
    undecided = np.flatnonzero(np.concatenate([np.asarray(p[1]) for p in parts])[:n])
    if undecided.shape[0]:
        inside[undecided] = _canonical_counts(x[undecided], y, radius)
    return inside


def _canonical_counts(x: np.ndarray, y: np.ndarray, radius: float) -> np.ndarray:
    """`ball_counts` by the canonical distance, a block of rows at a time."""
    out = np.empty(x.shape[0], dtype=np.int64)
    rows = max(1, _TILE_ENTRIES // max(1, min(y.shape[0], _TILE_COLS)))
    for r0 in range(0, x.shape[0], rows):
        out[r0 : r0 + rows] = np.count_nonzero(pairwise_distances(x[r0 : r0 + rows], y) <= radius, axis=1)
    return out


def nearest_centres(x: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distance of each point to its nearest centre, and that centre's index.

    The canonical distance (`pairwise_distances`, in blocks of rows), so a machine that labels
    its points against a radius the coordinator certified from the same distances makes the same
    decisions, ties included. Ties go to the lowest centre index. With no centres every distance is ``inf`` and every index
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
    dist = np.empty(n, dtype=np.float64)
    labels = np.empty(n, dtype=np.int64)
    rows = max(1, _NEAREST_ENTRIES // c)
    for r0 in range(0, n, rows):
        block = pairwise_distances(x[r0 : r0 + rows], centres)
        labels[r0 : r0 + rows] = np.argmin(block, axis=1)  # the first minimum: the lowest index
        dist[r0 : r0 + rows] = block[np.arange(block.shape[0]), labels[r0 : r0 + rows]]
    return dist, labels


_NEAREST_ENTRIES = 1 << 22


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

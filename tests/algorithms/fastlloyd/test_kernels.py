"""Tests for fedproto.algorithms.fastlloyd._kernels: sphere packing, radius clipping, folding, updates."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedproto.algorithms import kmeans
from fedproto.algorithms.fastlloyd import _kernels as kernels

# ------------------------------------------------------------------ sphere packing (oracle 21)


def ref_sphere_packing(k, d, seed, bound=1.0, max_retries=100):
    """Transliteration of the authors' loop (spec 2.4 [CODE]) with a default_rng stream."""
    rng = np.random.default_rng(seed)
    a = bound
    while a > 0:
        centres = []
        retry = 0
        while retry < max_retries:
            if len(centres) >= k:
                break
            cand = rng.random(d) * (2 * bound - 2 * a) + (-bound + a)
            if not centres:
                centres.append(cand)
                continue
            if math.sqrt(min(float(np.sum((c - cand) ** 2)) for c in centres)) >= 2 * a:
                centres.append(cand)
                retry = 0
            else:
                retry += 1
        if len(centres) >= k:
            return np.array(centres), a
        a /= 2
    return None


@pytest.mark.parametrize(("k", "d", "seed"), [(2, 2, 0), (3, 4, 1), (5, 2, 7), (15, 2, 1337), (10, 1, 3), (8, 16, 2), (100, 2, 5)])
def test_sphere_packing_properties_and_reference(k, d, seed):
    centres, a = kernels.sphere_packing(k, d, seed)
    assert centres.shape == (k, d) and centres.dtype == np.float64
    # a = 2^-m with m >= 1 (a = B never fits two centres)
    m = -math.log2(a)
    assert m >= 1 and m == int(m)
    assert np.all(centres >= -1 + a) and np.all(centres <= 1 - a)
    dists = np.sqrt(((centres[:, None, :] - centres[None, :, :]) ** 2).sum(-1))
    assert np.all(dists[~np.eye(k, dtype=bool)] >= 2 * a)
    ref_centres, ref_a = ref_sphere_packing(k, d, seed)
    assert a == ref_a
    np.testing.assert_array_equal(centres, ref_centres)


@pytest.mark.parametrize("max_retries", [1, 3, 17, 100])
@pytest.mark.parametrize("d", [1, 2, 9, 33])
def test_sphere_packing_screening_in_blocks_is_the_loop(d, max_retries):
    """The blocked draws and screening give the one-candidate-at-a-time loop's centres and radius,
    also where few retries make attempts fail and the radius halve several times."""
    for k in (2, 5, 40):
        for seed in range(3):
            centres, a = kernels.sphere_packing(k, d, seed, max_retries=max_retries)
            ref_centres, ref_a = ref_sphere_packing(k, d, seed, max_retries=max_retries)
            assert a == ref_a
            np.testing.assert_array_equal(centres, ref_centres)


def test_sphere_packing_is_deterministic_and_local():
    state = np.random.get_state()
    first = kernels.sphere_packing(6, 3, 42)
    np.random.seed(0)  # the global RNG must not matter ...
    second = kernels.sphere_packing(6, 3, 42)
    np.testing.assert_array_equal(first[0], second[0])
    assert first[1] == second[1]
    # ... and must not be touched
    np.random.set_state(state)
    kernels.sphere_packing(6, 3, 42)
    after = np.random.get_state()
    assert after[0] == state[0] and np.array_equal(after[1], state[1]) and after[2:] == state[2:]
    assert not np.array_equal(kernels.sphere_packing(6, 3, 43)[0], first[0])


def test_sphere_packing_single_centre_and_bound():
    centres, a = kernels.sphere_packing(1, 3, 0)
    assert a == 1.0 and centres.tolist() == [[0.0, 0.0, 0.0]]  # the sampling box is {0}
    centres, a = kernels.sphere_packing(4, 2, 9, bound=2.0)
    assert np.all(np.abs(centres) <= 2.0 - a)
    ref_centres, ref_a = ref_sphere_packing(4, 2, 9, bound=2.0)
    assert a == ref_a
    np.testing.assert_array_equal(centres, ref_centres)


def test_sphere_packing_errors():
    with pytest.raises(ValueError, match="underflow"):
        kernels.sphere_packing(3, 2, 0, max_retries=0)
    for kwargs in ({"k": 0, "d": 2}, {"k": 2, "d": 0}):
        with pytest.raises(ValueError):
            kernels.sphere_packing(seed=0, **kwargs)
    with pytest.raises(ValueError, match="bound"):
        kernels.sphere_packing(2, 2, 0, bound=0.0)
    with pytest.raises(ValueError, match="max_retries"):
        kernels.sphere_packing(2, 2, 0, max_retries=-1)


# ------------------------------------------------------------------ radius clipping (oracle 22)


@pytest.fixture(params=["jit", "eager"])
def jit_mode(request):
    if request.param == "eager":
        with jax.disable_jit():
            yield request.param
    else:
        yield request.param


def ref_clip(new, old, radius):
    out = new.copy()
    for j in range(len(new)):
        move = new[j] - old[j]
        norm = math.sqrt(float(np.sum(move**2)))
        if norm > radius:
            out[j] = old[j] + move * (radius / norm)
    return out


def test_clip_moves(jit_mode):
    rng = np.random.default_rng(0)
    old = rng.uniform(-1, 1, size=(6, 3))
    new = old + rng.normal(scale=0.5, size=(6, 3))
    new[0] = old[0]  # zero move
    eta = 0.4
    clipped = np.asarray(kernels.clip_moves(new, old, eta))
    np.testing.assert_allclose(clipped, ref_clip(new, old, eta), rtol=1e-14, atol=1e-15)
    move, orig = clipped - old, new - old
    norms, orig_norms = np.linalg.norm(move, axis=1), np.linalg.norm(orig, axis=1)
    assert np.any(orig_norms > eta) and np.any((orig_norms < eta) & (orig_norms > 0))
    np.testing.assert_allclose(norms, np.minimum(orig_norms, eta), rtol=1e-13, atol=1e-15)
    # direction preserved: the clipped move is a non-negative multiple of the original move
    nz = orig_norms > 0
    cos = np.sum(move[nz] * orig[nz], axis=1) / (norms[nz] * orig_norms[nz])
    np.testing.assert_allclose(cos, 1.0, rtol=1e-13)
    np.testing.assert_array_equal(clipped[0], old[0])
    np.testing.assert_array_equal(clipped[~(orig_norms > eta)], new[~(orig_norms > eta)])  # untouched rows bit for bit
    np.testing.assert_array_equal(np.asarray(kernels.clip_moves(new, old, jnp.inf)), new)
    np.testing.assert_array_equal(np.asarray(kernels.clip_moves(new, old, 0.0)), old)


# ------------------------------------------------------------------ folding (oracle 23)


def test_fold_oracle_values(jit_mode):
    x = np.array([0.3, 1.5, -1.2, 2.0, 3.5, -3.0, 1.0, -1.0, 5.0, -5.0])
    expected = [0.3, 0.5, -0.8, 0.0, -0.5, 1.0, 1.0, -1.0, 1.0, -1.0]  # period 4B: fold(5) = fold(1)
    np.testing.assert_allclose(np.asarray(kernels.fold(x)), expected, rtol=0, atol=1e-15)
    assert float(kernels.fold(0.3)) == 0.3  # identity inside the domain, bit for bit
    np.testing.assert_allclose(np.asarray(kernels.fold(x * 2.0, 2.0)), np.array(expected) * 2.0, atol=1e-15)
    np.testing.assert_array_equal(np.asarray(kernels.truncate(x)), np.clip(x, -1.0, 1.0))
    np.testing.assert_array_equal(np.asarray(kernels.truncate(x, 2.0)), np.clip(x, -2.0, 2.0))


def ref_fold(x, b=1.0):
    u = math.fmod(x + b, 4 * b)
    if u < 0:
        u += 4 * b
    if u > 2 * b:
        u = 4 * b - u
    return u - b


@settings(max_examples=200, deadline=None)
@given(x=st.floats(min_value=-1e6, max_value=1e6, allow_nan=False))
def test_fold_properties(x):
    y = float(kernels.fold(np.float64(x)))
    assert -1.0 <= y <= 1.0
    if -1.0 <= x <= 1.0:
        assert y == x
    assert abs(y - ref_fold(x)) <= 1e-9 * max(1.0, abs(x))
    # reflection across the boundary: fold(1 + t) == 1 - t for t in [0, 2]
    t = abs(x) % 2.0
    assert abs(float(kernels.fold(np.float64(1.0 + t))) - (1.0 - t)) <= 1e-12


# ------------------------------------------------------------------ update_centroids


def test_update_centroids_relative_equals_absolute_without_noise():
    """Eq. 10 == Eq. 11 without noise (oracle 8 through the post-processing kernel)."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, size=(30, 2))  # the shape test_kmeans compiles for, to share its cache
    prev = np.array([[-0.5, -0.5], [0.5, 0.5], [0.5, -0.5], [5.0, 5.0]])  # the last one is empty
    rel, counts, _ = kmeans.relative_statistics(x, prev, jnp.inf)
    labels, assigned, _ = kmeans.assign_clusters(x, prev, jnp.inf)
    sums, counts2 = kmeans.cluster_statistics(x, labels, assigned, 4)
    via_rel = kernels.update_centroids(rel, counts, prev, jnp.inf, relative=True, post="none")
    via_abs = kernels.update_centroids(sums, counts2, prev, jnp.inf, relative=False, post="none")
    np.testing.assert_allclose(np.asarray(via_rel), np.asarray(via_abs), rtol=0, atol=1e-13)
    np.testing.assert_allclose(np.asarray(via_abs), np.asarray(kmeans.lloyd_step(x, prev)), rtol=0, atol=1e-15)
    np.testing.assert_array_equal(np.asarray(via_rel)[3], prev[3])


def ref_update(sums, counts, prev, radius, relative, post, bound=1.0):
    out = prev.copy()
    for j in range(len(prev)):
        if counts[j] >= 1:
            out[j] = sums[j] / counts[j] + (prev[j] if relative else 0.0)
    out = ref_clip(out, prev, radius)
    if post == "fold":
        out = np.vectorize(lambda v: v if abs(v) <= bound else ref_fold(v, bound))(out)
    elif post == "truncate":
        out = np.clip(out, -bound, bound)
    return out


@pytest.mark.parametrize("post", ["fold", "truncate", "none"])
@pytest.mark.parametrize("relative", [True, False])
def test_update_centroids_matches_reference(relative, post):
    rng = np.random.default_rng(2)
    prev = rng.uniform(-0.9, 0.9, size=(6, 2))
    counts = np.array([10.0, 0.999, 0.0, -3.5, 1.0, 25.0])  # three below 1: keep previous
    sums = rng.normal(scale=8.0, size=(6, 2))  # noisy: moves and domain violations happen
    for radius in (0.3, math.inf):
        got = np.asarray(kernels.update_centroids(sums, counts, prev, radius, relative=relative, post=post))
        want = ref_update(sums, counts, prev, radius, relative, post)
        np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
        np.testing.assert_array_equal(got[1:4], ref_update(sums, counts, prev, radius, relative, post)[1:4])
        if post != "none":
            assert np.all(np.abs(got) <= 1.0)
    # order is divide -> clip -> fold: with radius 0.3 every move is at most 0.3 before folding
    clipped = np.asarray(kernels.update_centroids(sums, counts, prev, 0.3, relative=relative, post="none"))
    assert np.all(np.linalg.norm(clipped - prev, axis=1) <= 0.3 + 1e-12)


def test_update_centroids_eager_and_bound(jit_mode):
    prev = np.array([[0.0, 0.0], [1.5, -1.5]])
    sums = np.array([[3.0, 0.0], [0.0, 0.0]])
    counts = np.array([2.0, 5.0])
    got = np.asarray(kernels.update_centroids(sums, counts, prev, jnp.inf, relative=True, post="fold", bound=2.0))
    np.testing.assert_array_equal(got, [[1.5, 0.0], [1.5, -1.5]])
    got = np.asarray(kernels.update_centroids(sums, counts, prev, 1.0, relative=True, post="truncate"))
    np.testing.assert_array_equal(got, [[1.0, 0.0], [1.0, -1.0]])


def test_update_centroids_rejects_unknown_post():
    with pytest.raises(ValueError, match="post"):
        kernels.update_centroids(np.zeros((1, 1)), np.ones(1), np.zeros((1, 1)), 1.0, relative=True, post="wrap")

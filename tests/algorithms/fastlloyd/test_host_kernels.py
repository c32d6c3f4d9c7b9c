"""The NumPy host kernels a client of a few points uses compute what the jitted kernels compute
(the statistics bit for bit, the centroid update to a few units in the last place)."""

from __future__ import annotations

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedproto.algorithms import kmeans, secagg
from fedproto.algorithms.fastlloyd import _kernels


@pytest.mark.parametrize("relative", [True, False])
@pytest.mark.parametrize("seed", range(8))
def test_local_statistics_host_equals_the_jitted_kernels(relative, seed):
    rng = np.random.default_rng(seed)
    n, k, d = int(rng.integers(0, 40)), int(rng.integers(1, 8)), int(rng.integers(1, 4))
    x = rng.uniform(-1, 1, size=(n, d))
    c = rng.uniform(-1, 1, size=(k, d))
    radius = math.inf if seed % 3 == 0 else float(rng.uniform(0.1, 1.0))
    sums, counts, unassigned = kmeans.local_statistics_host(x, c, radius, relative=relative)
    if relative:
        want_sums, want_counts, want_un = kmeans.relative_statistics(x, jnp.asarray(c), radius)
    else:
        labels, assigned, _ = kmeans.assign_clusters(x, jnp.asarray(c), radius)
        want_sums, want_counts = kmeans.cluster_statistics(x, labels, assigned, k)
        want_un = n - int(np.sum(np.asarray(assigned)))
    if jax.default_backend() == "cpu":
        np.testing.assert_array_equal(sums, np.asarray(want_sums))  # XLA's CPU scatter adds in order
    else:  # a GPU's segment sums add in another order: a few units in the last place
        np.testing.assert_allclose(sums, np.asarray(want_sums), rtol=0, atol=8 * np.finfo(np.float64).eps * max(1, n))
    np.testing.assert_array_equal(counts, np.asarray(want_counts))
    assert unassigned == int(want_un)
    assert sums.dtype == counts.dtype == np.float64


@pytest.mark.parametrize("post", ["fold", "truncate", "none"])
@pytest.mark.parametrize("relative", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_update_centroids_host_equals_the_jitted_kernel(post, relative, seed):
    rng = np.random.default_rng(100 + seed)
    k, d = int(rng.integers(1, 8)), int(rng.integers(1, 4))
    previous = rng.uniform(-1, 1, size=(k, d))
    counts = rng.normal(3.0, 3.0, size=k)  # some below 1: those keep their previous centroid
    sums = rng.normal(0.0, 4.0, size=(k, d)) * np.abs(counts)[:, None]  # far moves: clipped, folded
    radius = math.inf if seed % 4 == 0 else float(rng.uniform(0.05, 1.0))
    got = _kernels.update_centroids_host(sums, counts, previous, radius, relative=relative, post=post, bound=1.0)
    want = _kernels.update_centroids(sums, counts, previous, radius, relative=relative, post=post, bound=1.0)
    # The same operations in the same order; XLA may fuse a multiply-add (one rounding instead of
    # two), so the two agree to a few units in the last place, not always bit for bit.
    np.testing.assert_allclose(got, np.asarray(want), rtol=4 * np.finfo(np.float64).eps, atol=4 * np.finfo(np.float64).eps)
    assert np.all(np.abs(got) <= 1.0) if post != "none" else True


def test_update_centroids_host_refuses_an_unknown_post_processing():
    with pytest.raises(ValueError, match="post must be one of"):
        _kernels.update_centroids_host(np.zeros((1, 1)), np.ones(1), np.zeros((1, 1)), 1.0, relative=True, post="wrap")


@pytest.mark.parametrize("ring_bits", [32, 64])
def test_encode_fixed_fast_path_equals_the_checked_path(ring_bits):
    """Values that take the unchecked path encode as the exact reference floor(v 2^q + 1/2) mod 2^w."""
    rng = np.random.default_rng(ring_bits)
    q = 16
    limit = secagg.headroom(q, ring_bits)
    values = np.concatenate([
        rng.uniform(-limit, limit, 200) * 0.999,
        (np.arange(-20, 20) + 0.5) / 2.0**q,  # exact halves: round half up
        np.nextafter((np.arange(-5, 5) + 0.5) / 2.0**q, -np.inf),
        [0.0, -0.0],
    ])
    got = secagg.encode_fixed(values, frac_bits=q, ring_bits=ring_bits)
    want = [math.floor(Fraction(v) * 2**q + Fraction(1, 2)) % 2**ring_bits for v in values.tolist()]  # exact
    assert got.tolist() == want
    assert got.dtype == secagg.ring_dtype(ring_bits)
    with pytest.raises(ValueError, match="non-finite"):
        secagg.encode_fixed(np.array([0.5, np.nan]), frac_bits=q, ring_bits=ring_bits)
    with pytest.raises(ValueError, match="overflow"):
        secagg.encode_fixed(np.array([limit]), frac_bits=q, ring_bits=ring_bits)

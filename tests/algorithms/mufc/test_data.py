"""Tests for MUFC's data sets and client splits (spec mufc.md 4.1, 4.5, 5.2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import threadpoolctl

from fedproto.algorithms.mufc.data import client_split, cluster_labels, file_clients, gaussian_mixture
from fedproto.data import find_data_file

CELLTYPE = find_data_file("celltype") or Path("celltype.npz")  # the FEDPROTO_DATA mirror (tests/conftest.py)


@pytest.fixture(autouse=True)
def _single_threaded_sklearn():
    # scikit-learn's KMeans on a few hundred points is fastest single-threaded; on a shared
    # machine its OpenMP threads otherwise oversubscribe the cores.
    with threadpoolctl.threadpool_limits(limits=1):
        yield


def _assert_partition(parts, n):
    assert all(p.dtype == np.int64 and len(p) > 0 for p in parts)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))


# ------------------------------------------------------------------ Gaussian set


def test_gaussian_mixture_shape_scaling_and_determinism():
    ds = gaussian_mixture(3, n_per=200, k=5, d=4)
    assert ds.name == "gaussian" and ds.paper_k == 5 and ds.x.shape == (1000, 4)
    np.testing.assert_array_equal(ds.x.min(axis=0), 0.0)
    np.testing.assert_array_equal(ds.x.max(axis=0), 1.0)
    np.testing.assert_array_equal(np.bincount(ds.y), [200] * 5)
    np.testing.assert_array_equal(gaussian_mixture(3, n_per=200, k=5, d=4).x, ds.x)
    assert not np.array_equal(gaussian_mixture(4, n_per=200, k=5, d=4).x, ds.x)
    paper = gaussian_mixture(0)
    assert paper.x.shape == (30000, 10) and paper.paper_k == 10


def test_gaussian_mixture_components_are_isotropic_with_the_given_variance():
    """Undo the min-max scaling (one span per column) and check the per-component covariance."""
    variance = 0.5
    ds = gaussian_mixture(7, n_per=4000, k=3, d=3, variance=variance)
    # within-component covariance of the scaled data is variance * diag(1 / span^2); the spans
    # are unknown but equal for all components, so compare components with each other and
    # check isotropy after rescaling each column by the pooled within-component std.
    resid = np.concatenate([ds.x[ds.y == c] - ds.x[ds.y == c].mean(0) for c in range(3)])
    pooled = resid.std(axis=0)
    for c in range(3):
        cov = np.cov((ds.x[ds.y == c] / pooled).T)
        # sample covariance of 4000 normal draws: entries within ~5 / sqrt(4000) of the truth
        np.testing.assert_allclose(cov, np.eye(3), atol=5 / np.sqrt(4000))
    # the spans: the range of 12000 draws of N(c, 0.5) is about 2 * 3.9 * sqrt(0.5) plus the
    # spread of the centres (< 1), so the scaled std lies in [sqrt(.5)/(7.8*sqrt(.5)+1), 1/7.8]
    std = np.sqrt(variance)
    assert np.all(pooled > std / (2 * 4.5 * std + 1)) and np.all(pooled < 1 / (2 * 3.5))


def test_gaussian_mixture_validation():
    with pytest.raises(ValueError):
        gaussian_mixture(0, n_per=0)
    with pytest.raises(ValueError):
        gaussian_mixture(0, variance=0.0)


# ------------------------------------------------------------------ client splits


def _blobs(seed=0, n=600, k=5):
    return gaussian_mixture(seed, n_per=n // k, k=k, d=3, variance=0.002).x


def test_iid_split_cuts_every_cluster_evenly():
    x = _blobs()
    labels = cluster_labels(x, 5, seed=1)
    for k_prime in (None, 5):
        parts = client_split(x, 7, k=5, k_prime=k_prime, seed=1)
        assert len(parts) == 7
        _assert_partition(parts, len(x))
        for c in range(5):
            size = int(np.sum(labels == c))
            per_client = [int(np.sum(labels[p] == c)) for p in parts]
            assert per_client[:-1] == [size // 7] * 6 and per_client[-1] == size - 6 * (size // 7)
    again = client_split(x, 7, k=5, k_prime=None, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


@pytest.mark.parametrize(("n_clients", "k_prime"), [(10, 1), (10, 2), (3, 2), (25, 3)])
def test_non_iid_split_respects_k_prime(n_clients, k_prime):
    x = _blobs(seed=n_clients)
    labels = cluster_labels(x, 5, seed=2)
    parts = client_split(x, n_clients, k=5, k_prime=k_prime, seed=2)
    assert len(parts) == n_clients
    _assert_partition(parts, len(x))
    spans = [len(np.unique(labels[p])) for p in parts]
    assert max(spans) <= k_prime, spans
    again = client_split(x, n_clients, k=5, k_prime=k_prime, seed=2)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = client_split(x, n_clients, k=5, k_prime=k_prime, seed=3)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_non_iid_split_stress_many_configurations():
    """The last client never spans more than k_prime clusters (the authors' code asserts it)."""
    rng = np.random.default_rng(0)
    x = _blobs(seed=9, n=300, k=6)
    for seed in range(8):
        k_prime = int(rng.integers(1, 6))
        n_clients = int(rng.integers(-(-6 // k_prime), 30))
        labels = cluster_labels(x, 6, seed)
        parts = client_split(x, n_clients, k=6, k_prime=k_prime, seed=seed)
        _assert_partition(parts, len(x))
        assert max(len(np.unique(labels[p])) for p in parts) <= k_prime


@pytest.mark.parametrize(
    ("n_clients", "k", "k_prime"),
    [(0, 3, None), (4, 3, 4), (4, 3, 0), (2, 5, 2), (700, 3, None), (300, 5, None)],
)
def test_impossible_splits_raise(n_clients, k, k_prime):
    with pytest.raises(ValueError):
        client_split(_blobs(), n_clients, k=k, k_prime=k_prime, seed=0)


# ------------------------------------------------------------------ shipped Celltype split


@pytest.mark.skipif(not CELLTYPE.is_file(), reason=f"{CELLTYPE} not available")
def test_celltype_file_clients_reproduce_the_shipped_split():
    with np.load(CELLTYPE) as archive:
        x = archive["X"]
        client_x = archive["client_X"]
    parts = file_clients(CELLTYPE, x)
    sizes = [len(p) for p in parts]
    assert len(parts) == 100 and sum(sizes) == 12009 == len(x)
    assert sizes[:64] == [120] * 64 and all(60 <= s <= 119 for s in sizes[64:99]) and sizes[99] == 1134
    _assert_partition(parts, len(x))
    np.testing.assert_array_equal(x[np.concatenate(parts)], client_x)
    # rows are matched, not positions: a shuffled x gives the matching shuffled indices
    perm = np.random.default_rng(0).permutation(len(x))
    shuffled = file_clients(CELLTYPE, x[perm])
    np.testing.assert_array_equal(perm[np.concatenate(shuffled)], np.concatenate(parts))


def test_file_clients_rejects_non_permutations(tmp_path):
    x = np.arange(12, dtype=float).reshape(6, 2)
    good = tmp_path / "good.npz"
    np.savez(good, client_X=x[::-1], client_sizes=np.array([2, 4]))
    parts = file_clients(good, x)
    assert [p.tolist() for p in parts] == [[5, 4], [3, 2, 1, 0]]
    dup = np.vstack([x[:5], x[:1]])
    bad = tmp_path / "bad.npz"
    np.savez(bad, client_X=x, client_sizes=np.array([6]))
    with pytest.raises(ValueError):
        file_clients(bad, dup)  # x has a duplicate row, client_X has the missing one
    shifted = tmp_path / "shifted.npz"
    np.savez(shifted, client_X=x + 1e-9, client_sizes=np.array([6]))
    with pytest.raises(ValueError):
        file_clients(shifted, x)
    sizes = tmp_path / "sizes.npz"
    np.savez(sizes, client_X=x, client_sizes=np.array([2, 3]))
    with pytest.raises(ValueError):
        file_clients(sizes, x)
    missing = tmp_path / "missing.npz"
    np.savez(missing, X=x)
    with pytest.raises(ValueError):
        file_clients(missing, x)
    # duplicate rows on both sides are matched in order
    both = tmp_path / "both.npz"
    np.savez(both, client_X=dup, client_sizes=np.array([3, 3]))
    assert np.concatenate(file_clients(both, dup)).tolist() == [0, 1, 2, 3, 4, 5]

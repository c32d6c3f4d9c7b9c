"""DC-k-means, centralised: tree, keyed leaves, node k-means, exact and local deletion.

Spec deletion-kmeans.md, oracles O-DC-1 .. O-DC-5 (section 7.2); O-DC-2's byte counts and O-DC-6
are in test_protocol.py. Nodes here hold at most 64 points in 3-D with k = 3, so every node shares
one padded shape and the kernels compile once.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest
import scipy.stats

from fedproto.algorithms import kmeans
from fedproto.algorithms.deletion import _kernels, _variant_kernels
from fedproto.algorithms.deletion._store import DeletionError
from fedproto.algorithms.deletion.dckmeans import (
    DCKMeans,
    DCKMeansConfig,
    Tree,
    assign_leaves,
    default_width,
    node_key,
    node_kmeans,
    node_output,
)
from fedproto.testing import load_file

helpers = load_file(Path(__file__).resolve().parents[2] / "_helpers.py", "tests_helpers")


def snapshot(dc: DCKMeans) -> dict:
    """Every node's dataset, centroids and version."""
    out = {}
    for node in range(dc.tree.n_nodes):
        pts, ids = dc.dataset_of(node)
        out[node] = (pts.copy(), ids.copy(), dc.centroids_of[node].copy(), dc.version[node])
    return out


def assert_same_tree(a: DCKMeans, b: DCKMeans) -> None:
    assert a.tree == b.tree
    for leaf_a, leaf_b in zip(a.leaves, b.leaves, strict=True):
        np.testing.assert_array_equal(leaf_a.ids, leaf_b.ids)
    for node in range(a.tree.n_nodes):
        np.testing.assert_array_equal(a.centroids_of[node], b.centroids_of[node])
    np.testing.assert_array_equal(a.centroids, b.centroids)


def remaining(dc: DCKMeans) -> tuple[np.ndarray, np.ndarray]:
    x = np.concatenate([s.x for s in dc.leaves])
    ids = np.concatenate([s.ids for s in dc.leaves])
    return x, ids


@pytest.mark.parametrize(("n", "w"), [(12_009, 16), (15_120, 16), (60_000, 32), (74_975, 32), (100_000, 32),
                                      (1_018_298, 64)])
def test_width_rule_matches_the_spec(n, w):
    assert default_width(n) == w


def test_tree_numbering():
    tree = Tree(3, 2)
    assert tree.n_leaves == 9 and tree.n_nodes == 13
    assert tree.children(0) == (1, 2, 3)
    assert tree.children(2) == (7, 8, 9)
    assert tree.path(4) == (8, 2, 0)
    assert tree.parent(0) is None and tree.parent(12) == 3
    assert tree.internal_nodes() == (1, 2, 3, 0)
    assert Tree(1, 1).path(0) == (1, 0)


def test_leaf_assignment_is_uniform_and_ignores_values(mixture):
    key = jax.random.PRNGKey(3)
    ids = np.arange(256) * 7 + 11  # the same padded shape as the 240-point fits below
    leaves = assign_leaves(key, ids, 16)
    counts = np.bincount(leaves, minlength=16)
    assert scipy.stats.chisquare(counts).pvalue > 1e-3
    np.testing.assert_array_equal(assign_leaves(key, ids[::-1], 16), leaves[::-1])
    # Permuted values under the same ids: same leaves, and each leaf holds the same ids.
    x = mixture(0, (60, 60, 60, 60))
    ids = np.arange(240)
    a = DCKMeans(DCKMeansConfig(k=3, width=4), seed=1).fit(x, ids)
    b = DCKMeans(DCKMeansConfig(k=3, width=4), seed=1).fit(x[np.random.default_rng(0).permutation(240)], ids)
    for la, lb in zip(a.leaves, b.leaves, strict=True):
        np.testing.assert_array_equal(la.ids, lb.ids)


def test_leaves_partition_the_data_and_the_root_sees_every_centroid(mixture):
    """O-DC-3."""
    x = mixture(1, (150, 150, 150))
    dc = DCKMeans(DCKMeansConfig(k=3, width=8), seed=2).fit(x)
    all_ids = np.concatenate([s.ids for s in dc.leaves])
    assert len(all_ids) == len(np.unique(all_ids)) == len(x)
    assert sum(s.n for s in dc.leaves) == dc.n == len(x)
    np.testing.assert_array_equal(np.sort(all_ids), np.arange(len(x)))
    root_points, root_ids = dc.dataset_of(0)
    assert root_points.shape == (8 * 3, 3)
    assert len(np.unique(root_ids)) == 24


def test_small_and_empty_leaves_output_their_distinct_points():
    x = np.array([[0.1, 0.1, 0.1], [0.1, 0.1, 0.1], [0.9, 0.9, 0.9], [0.5, 0.2, 0.1], [0.3, 0.3, 0.3],
                  [0.7, 0.1, 0.2]])
    leaves = np.array([0, 0, 0, 1, 1, 1])  # leaf 0: 2 distinct points; leaf 2 empty
    dc = DCKMeans(DCKMeansConfig(k=3, width=3), seed=0).fit(x, leaves=leaves)
    leaf0 = dc.centroids_of[dc.tree.leaf_node(0)]
    assert sorted(map(tuple, leaf0)) == [(0.1, 0.1, 0.1), (0.9, 0.9, 0.9)]
    assert dc.centroids_of[dc.tree.leaf_node(2)].shape == (0, 3)
    root_points, _ = dc.dataset_of(0)
    assert root_points.shape[0] == min(3, 2) + min(3, 3) + 0
    assert dc.centroids.shape == (3, 3)


def test_node_kmeans_is_kmeanspp_then_lloyd(mixture):
    x = mixture(2, (20, 20, 20))
    ids = np.arange(len(x))
    key = jax.random.PRNGKey(5)
    rows, _ = _kernels.kmeanspp_seeding(key, *_kernels.pad_rows(x, ids), 3)
    c = x[np.asarray(rows)]
    for _ in range(10):
        labels = ((x[:, None, :] - c[None]) ** 2).sum(-1).argmin(1)
        c = np.stack([x[labels == j].mean(0) if np.any(labels == j) else c[j] for j in range(3)])
    np.testing.assert_allclose(node_kmeans(key, x, ids, 3, 10), c, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("sizes", "width", "height", "n_deletions"), [((70, 70, 60), None, 1, 40),
                                                                      ((150, 150, 150), 3, 2, 25)])
def test_deletion_equals_retraining_after_every_request(mixture, sizes, width, height, n_deletions):
    """O-DC-1: same leaf sets, same centroids at every node, same root."""
    x = mixture(3, sizes)
    ids = np.arange(len(x)) * 2 + 5
    config = DCKMeansConfig(k=3, width=width, height=height)
    dc = DCKMeans(config, seed=4).fit(x, ids)
    for i in np.random.default_rng(0).choice(ids, size=n_deletions, replace=False):
        dc.delete(int(i))
        fresh = DCKMeans(config, key=dc.key).fit(*remaining(dc))
        assert_same_tree(dc, fresh)
    assert dc.n == len(x) - n_deletions


@pytest.mark.parametrize(("width", "height"), [(8, 1), (3, 2)])
def test_deletion_touches_only_the_leaf_to_root_path(mixture, width, height):
    """O-DC-2: h + 1 node runs; every other node's dataset, centroids and version unchanged."""
    x = mixture(4, (100, 100, 100))
    dc = DCKMeans(DCKMeansConfig(k=3, width=width, height=height), seed=1).fit(x)
    for i in np.random.default_rng(1).permutation(len(x))[:10]:
        before, runs = snapshot(dc), dc.node_runs
        leaf = dc.leaf_of(int(i))
        outcome = dc.delete(int(i))
        assert outcome.nodes == dc.tree.path(leaf) and len(outcome.nodes) == height + 1
        assert dc.node_runs - runs == height + 1
        after = snapshot(dc)
        for node in range(dc.tree.n_nodes):
            if node in outcome.nodes:
                assert after[node][3] == before[node][3] + 1
                continue
            for a, b in zip(after[node], before[node]):
                np.testing.assert_array_equal(a, b)


def test_one_leaf_equals_plain_kmeans(mixture):
    """O-DC-4: w = 1 returns the leaf's k-means++/Lloyd centroids (as a set)."""
    x = mixture(5, (20, 20, 20))
    ids = np.arange(len(x))
    dc = DCKMeans(DCKMeansConfig(k=3, width=1), seed=6).fit(x, ids)
    plain = node_kmeans(node_key(dc.key, 1), x, ids, 3, 10)
    np.testing.assert_array_equal(dc.centroids_of[1], plain)
    assert sorted(map(tuple, dc.centroids)) == sorted(map(tuple, plain))
    dc.delete(7)
    plain = node_kmeans(node_key(dc.key, 1), *remaining(dc), 3, 10)
    assert sorted(map(tuple, dc.centroids)) == sorted(map(tuple, plain))


def test_a_deletion_that_changes_w_retrains_the_tree(mixture):
    """O-DC-5: the rule's boundaries (w = 8 at n = 323, 4 at n = 322); a deletion across one
    rebuilds the tree (here with rho = 0.4: w = 4 at n = 14, 2 at n = 13)."""
    assert default_width(323) == 8 and default_width(322) == 4
    assert default_width(14, 0.4) == 4 and default_width(13, 0.4) == 2
    config = DCKMeansConfig(k=3, rho=0.4)
    x = mixture(6, (5, 5, 4))
    dc = DCKMeans(config, seed=0).fit(x)
    assert dc.tree.width == 4
    outcome = dc.delete(10)
    assert outcome.retrained and outcome.reason == "width changed"
    assert dc.tree.width == 2 and dc.retrained == 1
    assert_same_tree(dc, DCKMeans(config, key=dc.key).fit(*remaining(dc)))
    with pytest.raises(DeletionError, match="already deleted"):
        dc.delete(10)


def test_given_partition_keeps_its_leaves(mixture):
    x = mixture(7, (80, 80, 80))
    leaves = np.arange(len(x)) % 5
    dc = DCKMeans(DCKMeansConfig(k=3, width=5), seed=0).fit(x, leaves=leaves)
    for j, store in enumerate(dc.leaves):
        np.testing.assert_array_equal(store.ids, np.flatnonzero(leaves == j))
    outcome = dc.delete(12)
    assert outcome.nodes == (dc.tree.leaf_node(2), 0)
    with pytest.raises(ValueError, match="explicit width"):
        DCKMeans(DCKMeansConfig(k=3), seed=0).fit(x, leaves=leaves)
    with pytest.raises(ValueError, match="leaves must lie"):
        DCKMeans(DCKMeansConfig(k=3, width=2), seed=0).fit(x, leaves=leaves)


def test_bad_requests_raise_clear_errors(mixture):
    x = mixture(8, (5, 5))
    dc = DCKMeans(DCKMeansConfig(k=3, width=2), seed=0)
    with pytest.raises(DeletionError, match="before fit"):
        dc.delete(0)
    dc.fit(x)
    with pytest.raises(DeletionError, match="not in the data set"):
        dc.delete(99)
    for i in range(7):
        dc.delete(i)
    with pytest.raises(DeletionError, match="already deleted"):
        dc.delete(3)
    with pytest.raises(DeletionError, match="fewer than k"):
        dc.delete(8)
    assert dc.n == 3
    with pytest.raises(ValueError):
        DCKMeansConfig(k=2, height=2)


# --------------------------------------------------------------------------- weighted variant (spec 2.3)


def test_weighted_kernels_with_unit_weights_are_the_unweighted_ones(mixture):
    x = mixture(9, (20, 20, 20))
    ids = np.arange(len(x)) * 3
    key = jax.random.PRNGKey(12)
    xp, ip, valid = _kernels.pad_rows(x, ids)
    unit = valid.astype(np.float64)
    rows, count = _kernels.kmeanspp_seeding(key, xp, ip, valid, 3)
    wrows, wcount = kmeans.kmeanspp_seeding(key, xp, ip, valid, 3, weights=unit)
    np.testing.assert_array_equal(np.asarray(wrows), np.asarray(rows))
    assert int(wcount) == int(count) == 3
    init = xp[np.asarray(rows)]
    np.testing.assert_array_equal(
        np.asarray(_variant_kernels.weighted_lloyd_iterations(xp, unit, init, 3, 10)),
        np.asarray(_kernels.lloyd_iterations(xp, valid, init, 3, 10)),
    )
    # A leaf's weighted output is its unweighted output plus its cluster sizes.
    centroids, masses = node_output(key, x, ids, 3, 10)
    np.testing.assert_array_equal(centroids, node_kmeans(key, x, ids, 3, 10))
    labels = ((x[:, None, :] - centroids[None]) ** 2).sum(-1).argmin(1)
    np.testing.assert_array_equal(masses, np.bincount(labels, minlength=3))


def test_weighted_seeding_draws_follow_mass_times_d2():
    """The seeding of weighted internal nodes (the shared kernel with weights): P(j) = w_j u_j / sum."""
    pts = np.array([0.0, 1.0, 3.0, 6.0, 10.0])
    w = np.array([1.0, 4.0, 0.5, 2.0, 0.0])  # the last point has no mass: never drawn
    xp, ip, valid = _kernels.pad_rows(pts[:, None], np.arange(5))
    wp = np.zeros(xp.shape[0])
    wp[:5] = w
    keys = jax.random.split(jax.random.PRNGKey(13), 6000)
    rows, count = jax.vmap(lambda key: kmeans.kmeanspp_seeding(key, xp, ip, valid, 2, weights=wp))(keys)
    expected = np.zeros((5, 5))
    for j in range(5):
        p = w * (pts - pts[j]) ** 2
        expected[j] = len(keys) * w[j] / w.sum() * p / p.sum()
    helpers.assert_pair_draws_follow(rows, count, expected)


def test_weighted_lloyd_equals_lloyd_on_repeated_points(mixture):
    """A point of mass 3 moves the means as three coincident points do."""
    x = mixture(10, (10, 10, 10))
    w = np.random.default_rng(0).integers(1, 4, size=len(x)).astype(np.float64)
    rep = np.repeat(x, w.astype(int), axis=0)
    init = x[[0, 10, 20]]
    xp, _, _ = _kernels.pad_rows(x, np.arange(len(x)))
    wp = np.zeros(xp.shape[0])
    wp[: len(x)] = w
    rp, _, rvalid = _kernels.pad_rows(rep, np.arange(len(rep)))
    np.testing.assert_allclose(
        np.asarray(_variant_kernels.weighted_lloyd_iterations(xp, wp, init, 3, 10)),
        np.asarray(_kernels.lloyd_iterations(rp, rvalid, init, 3, 10)),
        rtol=1e-12, atol=1e-12,
    )


@pytest.mark.parametrize(("width", "height"), [(4, 1), (3, 2)])
def test_weighted_tree_conserves_mass_and_deletion_equals_retraining(mixture, width, height):
    """Masses: a leaf's sum to its size, a node's to its children's; O-DC-1 and O-DC-2 hold."""
    x = mixture(11, (20, 100, 100))
    config = DCKMeansConfig(k=3, width=width, height=height, weighted=True)
    dc = DCKMeans(config, seed=3).fit(x)
    unweighted = DCKMeans(dataclasses.replace(config, weighted=False), seed=3).fit(x)
    for leaf in range(dc.tree.n_leaves):
        node = dc.tree.leaf_node(leaf)
        assert dc.counts_of[node].sum() == dc.leaves[leaf].n
        np.testing.assert_array_equal(dc.centroids_of[node], unweighted.centroids_of[node])
    for node in dc.tree.internal_nodes():
        assert dc.counts_of[node].sum() == sum(dc.counts_of[c].sum() for c in dc.tree.children(node))
        np.testing.assert_array_equal(dc.weights_of(node), np.concatenate(
            [dc.counts_of[c] for c in dc.tree.children(node)]))
    assert dc.counts_of[0].sum() == len(x)
    assert not np.array_equal(dc.centroids, unweighted.centroids)  # the merge is weighted
    for i in np.random.default_rng(2).permutation(len(x))[:15]:
        before, runs = snapshot(dc), dc.node_runs
        outcome = dc.delete(int(i))
        assert dc.node_runs - runs == height + 1
        for node in set(range(dc.tree.n_nodes)) - set(outcome.nodes):
            np.testing.assert_array_equal(dc.centroids_of[node], before[node][2])
        fresh = DCKMeans(config, key=dc.key).fit(*remaining(dc))
        assert_same_tree(dc, fresh)
        for node in range(dc.tree.n_nodes):
            np.testing.assert_array_equal(dc.counts_of[node], fresh.counts_of[node])
    assert dc.counts_of[0].sum() == len(x) - 15
    with pytest.raises(ValueError, match="weighted variant"):
        unweighted.weights_of(0)
    with pytest.raises(ValueError, match="non-negative"):
        node_output(dc.key, x[:4], np.arange(4), 3, 10, weights=np.array([1.0, -1.0, 1.0, 1.0]))

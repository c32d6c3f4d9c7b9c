"""Tests for MUFC's server side: server data, weighted K-means++, phi_f and phi_c.

Oracles (spec mufc.md 6): 13 (weighted = replicated), 14 (phi_f >= phi_c), 15 (quality smoke
test, the full-size runs behind ``slow``), plus the uniform server mode (spec 1.6) and the
weighted Lloyd kernel against a slow NumPy reference. Shapes are padded to 64 rows wherever
possible so that the tests share compiled kernels.
"""

from __future__ import annotations

import collections
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from fedproto.algorithms import kmeans
from fedproto.algorithms.mufc import _kernels, clustering
from fedproto.algorithms.mufc.clustering import (
    federated_loss,
    induced_labels,
    kmeans_cost,
    reference_loss,
    server_points,
    weighted_kmeans,
)
from fedproto.algorithms.mufc.quantize import make_grid
from fedproto.algorithms.mufc.seeding import LocalSeeding
from fedproto.data import find_data_file


# ------------------------------------------------------------------ server data


def test_weighted_server_points_are_sorted_bin_centres():
    grid = make_grid(100, 3)
    counts = {900: 4, 17: 1, 1: 7, grid.n_bins: 2}
    pts, w = server_points(counts, grid, "weighted", jax.random.key(0))
    order = sorted(counts)
    np.testing.assert_array_equal(pts, grid.bin_centres(order))
    np.testing.assert_array_equal(w, [counts[j] for j in order])
    assert w.dtype == np.float64 and pts.dtype == np.float64
    again, _ = server_points(counts, grid, "weighted", jax.random.key(1))  # the key is unused
    np.testing.assert_array_equal(again, pts)


def test_uniform_server_points_fill_their_cubes_uniformly():
    grid = make_grid(100, 2)  # gamma = 0.1
    counts = {grid.n_bins: 1500, 1: 2000, 57: 3000}
    pts, w = server_points(counts, grid, "uniform", jax.random.key(3))
    assert pts.shape == (6500, 2) and np.all(w == 1.0)
    centres = np.repeat(grid.bin_centres(sorted(counts)), [counts[j] for j in sorted(counts)], axis=0)
    offset = (pts - centres) / grid.gamma
    assert np.all(np.abs(offset) <= 0.5)
    # every sample quantizes back to its own bin (the cube is the bin's cell)
    assert grid.bin_indices(pts) == [j for j in sorted(counts) for _ in range(counts[j])]
    for dim in range(2):
        assert scipy.stats.kstest(offset[:, dim] + 0.5, "uniform").pvalue > 1e-3
    same, _ = server_points(counts, grid, "uniform", jax.random.key(3))
    other, _ = server_points(counts, grid, "uniform", jax.random.key(4))
    np.testing.assert_array_equal(same, pts)
    assert not np.array_equal(other, pts)
    empty, empty_w = server_points({}, grid, "uniform", jax.random.key(0))
    assert empty.shape == (0, 2) and empty_w.shape == (0,)


@pytest.mark.parametrize(
    "counts", [{1: 0}, {1: -2}, {0: 3}, {10**9: 1}, {1: True}, {1: 2.5}], ids=str
)
def test_server_points_reject_bad_counts(counts):
    with pytest.raises((ValueError, TypeError)):
        server_points(counts, make_grid(100, 2), "weighted", jax.random.key(0))


def test_server_points_reject_unknown_mode():
    with pytest.raises(ValueError):
        server_points({1: 1}, make_grid(100, 2), "dense", jax.random.key(0))


# ------------------------------------------------------------------ weighted = replicated (oracle 13)

LOC = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
W_LOC = np.array([3.0, 1.0, 2.0, 4.0])
REPLICATED = np.repeat(np.arange(4), W_LOC.astype(int))  # location of each replicated row
N_DRAWS = 40_000
ROWS10 = 10  # both the weighted set (4 rows + padding) and the multiset (10 rows) use 10 rows


@jax.jit
def _seed_many(keys, x, ids, valid, weights):
    return jax.lax.map(lambda key: kmeans.kmeanspp_seeding(key, x, ids, valid, 3, weights=weights)[0], keys)


def exact_replicated(k: int) -> dict[tuple[int, ...], float]:
    """Exact ordered-location distribution of plain K-means++ on the replicated multiset."""
    x = LOC[REPLICATED]
    out: collections.Counter = collections.Counter()
    for tup in itertools.permutations(range(len(x)), k):
        p = 1.0 / len(x)
        for step in range(1, k):
            d2 = np.min(((x[:, None, :] - x[list(tup[:step])][None]) ** 2).sum(-1), axis=1)
            p *= d2[tup[step]] / d2.sum()
        out[tuple(int(REPLICATED[r]) for r in tup)] += p
    return {c: p for c, p in out.items() if p > 0}


def _fit(locations: np.ndarray, exact: dict) -> tuple[float, float]:
    counts = collections.Counter(map(tuple, locations.tolist()))
    assert set(counts) <= set(exact)
    cells = sorted(exact)
    obs = np.array([counts.get(c, 0) for c in cells], float)
    exp = np.array([exact[c] for c in cells]) * len(locations)
    assert exp.min() >= 5
    tv = 0.5 * np.abs(obs - exp).sum() / len(locations)
    return float(scipy.stats.chisquare(obs, exp).pvalue), float(tv)


def test_weighted_seeding_has_the_replicated_distribution():
    exact = exact_replicated(3)
    assert math.isclose(sum(exact.values()), 1.0, rel_tol=1e-12)
    tv_bound = math.sqrt(len(exact) / N_DRAWS)  # E[TV] <= sqrt(m / N) / 2
    keys = jax.random.split(jax.random.key(13), N_DRAWS)
    ids = jnp.arange(ROWS10, dtype=jnp.uint32)
    weighted_x = np.zeros((ROWS10, 2))
    weighted_x[:4] = LOC
    weighted_valid = np.arange(ROWS10) < 4
    weighted_w = np.zeros(ROWS10)
    weighted_w[:4] = W_LOC
    rows = np.asarray(_seed_many(keys, weighted_x, ids, weighted_valid, weighted_w))
    p, tv = _fit(rows, exact)
    assert p > 1e-3 and tv < tv_bound, (p, tv)
    # plain seeding on the replicated multiset (unit weights) has the same distribution
    rows = np.asarray(_seed_many(keys, LOC[REPLICATED], ids, np.ones(ROWS10, bool), np.ones(ROWS10)))
    p, tv = _fit(REPLICATED[rows], exact)
    assert p > 1e-3 and tv < tv_bound, (p, tv)
    # negative control: ignoring the weights is detected
    rows = np.asarray(_seed_many(keys, weighted_x, ids, weighted_valid, weighted_valid.astype(float)))
    counts = collections.Counter(map(tuple, rows.tolist()))
    tv = 0.5 * sum(abs(counts.get(c, 0) / N_DRAWS - exact.get(c, 0.0)) for c in set(exact) | set(counts))
    assert tv > 5 * tv_bound


def ref_weighted_lloyd(x, w, init, tol_abs, max_iter):
    """Slow NumPy weighted Lloyd with the kernel's stopping rule (all centroids active)."""
    c = init.copy()
    prev = None
    it = 0
    while it < max_iter:
        labels = np.array([min(range(len(c)), key=lambda i: (float(np.sum((p - c[i]) ** 2)), i)) for p in x])
        new = c.copy()
        for j in range(len(c)):
            mass = w[labels == j].sum()
            if mass > 0:
                new[j] = (w[labels == j, None] * x[labels == j]).sum(0) / mass
        shift = float(np.sum((new - c) ** 2))
        it += 1
        stable = prev is not None and np.array_equal(labels, prev)
        c, prev = new, labels
        if stable or shift <= tol_abs:
            break
    d2 = ((x[:, None] - c[None]) ** 2).sum(-1)
    return c, float(np.sum(w * d2.min(1))), it


def _pad(x, w, rows=64):
    xp = np.zeros((rows, x.shape[1]))
    xp[: len(x)] = x
    wp = np.zeros(rows)
    wp[: len(x)] = w
    return jnp.asarray(xp), jnp.asarray(wp)


def test_weighted_lloyd_equals_replicated_lloyd_and_slow_reference():
    rng = np.random.default_rng(14)
    x = rng.uniform(size=(30, 2))
    w = rng.integers(1, 3, size=30).astype(float)
    assert w.sum() <= 64
    init = x[[0, 1, 2, 3]]
    active = jnp.ones(4, bool)
    xp, wp = _pad(x, w)
    rep = np.repeat(x, w.astype(int), axis=0)
    rp, rwp = _pad(rep, np.ones(len(rep)))
    for tol_abs in (0.0, 1e-3):
        c_w, _, cost_w, it_w = _kernels.weighted_lloyd(xp, wp, init, active, tol_abs, 300)
        c_r, _, cost_r, it_r = _kernels.weighted_lloyd(rp, rwp, init, active, tol_abs, 300)
        np.testing.assert_allclose(np.asarray(c_w), np.asarray(c_r), rtol=0, atol=1e-13)
        assert int(it_w) == int(it_r) and math.isclose(float(cost_w), float(cost_r), rel_tol=1e-12)
        ref_c, ref_cost, ref_it = ref_weighted_lloyd(x, w, init, tol_abs, 300)
        np.testing.assert_allclose(np.asarray(c_w), ref_c, rtol=0, atol=1e-13)
        assert int(it_w) == ref_it and math.isclose(float(cost_w), ref_cost, rel_tol=1e-12)
    assert int(it_w) < 300 and ref_it > 1  # converged after real iterations
    # max_iter caps the loop; an inactive centroid attracts nothing and stays put
    _, _, _, one = _kernels.weighted_lloyd(xp, wp, init, active, 0.0, 1)
    assert int(one) == 1
    far = init.copy()
    far[3] = [9.0, 9.0]
    c_in, labels, _, _ = _kernels.weighted_lloyd(xp, wp, far, jnp.array([True, True, True, False]), 0.0, 300)
    assert np.asarray(c_in)[3].tolist() == [9.0, 9.0] and not np.any(np.asarray(labels)[:30] == 3)
    with jax.disable_jit():
        eager = _kernels.weighted_lloyd(xp, wp, init, active, 0.0, 300)
    np.testing.assert_allclose(np.asarray(eager[0]), np.asarray(c_w), rtol=0, atol=1e-13)


# ------------------------------------------------------------------ weighted K-means++


def _blobs(seed, n_per=8, k=4, spread=0.02):
    rng = np.random.default_rng(seed)
    centres = np.array([[0.15, 0.15], [0.85, 0.2], [0.2, 0.8], [0.8, 0.85]])[:k]
    x = np.concatenate([c + spread * rng.standard_normal((n_per, 2)) for c in centres])
    return np.clip(x, 0, 1), np.repeat(np.arange(k), n_per)


def test_weighted_kmeans_finds_the_weighted_optimum_and_equals_replicated():
    from sklearn.cluster import KMeans

    x, _ = _blobs(15)
    w = np.random.default_rng(15).integers(1, 3, size=len(x)).astype(float)
    rep = np.repeat(x, w.astype(int), axis=0)
    assert len(rep) <= 64  # weighted and replicated runs share one compiled shape
    key = jax.random.key(16)
    c, cost = weighted_kmeans(key, x, w, 4)
    assert c.shape == (4, 2) and c.dtype == np.float64
    sk = KMeans(4, n_init=10, random_state=0).fit(x, sample_weight=w)
    assert math.isclose(cost, sk.inertia_, rel_tol=1e-9)
    assert math.isclose(cost, float(np.sum(w * ((x[:, None] - c[None]) ** 2).sum(-1).min(1))), rel_tol=1e-12)
    c_rep, cost_rep = weighted_kmeans(jax.random.key(17), rep, np.ones(len(rep)), 4)
    assert math.isclose(cost, cost_rep, rel_tol=1e-9)
    np.testing.assert_allclose(np.array(sorted(map(tuple, c))), np.array(sorted(map(tuple, c_rep))), atol=1e-12)
    # best of n_init: the returned cost is the minimum over the individual runs
    xp, wp = _pad(x, w)
    valid = jnp.arange(64) < len(x)
    tol_abs = clustering._tolerance(x, w, 1e-4)
    _, costs, _ = _kernels.weighted_kmeans_runs(kmeans.seeding_keys(key, 10), xp, wp, valid, 4, tol_abs, 300)
    assert cost == float(np.min(np.asarray(costs)))


def test_padded_points_skip_rule_gives_the_fresh_result():
    """The seeding skip rule returns, after every weight change, exactly what a fresh object
    (which always seeds) returns. Raising a row always re-seeds and lowering a row that no run
    picked always skips; lowering a picked row skips only when the fresh seeding picks the same
    rows, and both outcomes occur."""
    x, _ = _blobs(21)
    rng = np.random.default_rng(21)
    w = rng.integers(5, 40, size=len(x)).astype(float)
    key = jax.random.key(22)
    race = clustering._seeding_race(key, 10, 4, 64)
    kept = clustering.PaddedPoints(x, min_rows=64)
    kept.weighted_kmeans(key, w, 4)
    outcomes = collections.Counter()
    for step in range(60):
        rows = kept._seeded.rows_host
        picked = np.unique(rows[rows >= 0])
        w = w.copy()
        if step % 10 == 9:  # raise one row: never skipped
            w[rng.integers(len(x))] += 3
            kind = "raise"
        elif step % 3 == 2 and np.any(w[picked] > 1):  # lower a picked row by 1 or by a lot
            j = int(rng.choice(picked[w[picked] > 1]))
            w[j] -= 1 if step % 2 else rng.integers(1, w[j])
            kind = "picked"
        else:
            j = int(rng.choice(np.setdiff1d(np.flatnonzero(w > 1), picked)))
            w[j] -= 1
            kind = "unpicked"
        before = kept.seedings_skipped
        got = kept.weighted_kmeans(key, w, 4)
        fresh = clustering.PaddedPoints(x, min_rows=64).weighted_kmeans(key, w, 4)
        np.testing.assert_array_equal(got[0], fresh[0])
        assert got[1] == fresh[1]
        skipped = kept.seedings_skipped - before == 1
        wp = np.zeros(64)
        wp[: len(x)] = w
        fresh_rows = np.asarray(_kernels.weighted_seeding(race, kept._xp, wp, kept._valid, 4))
        if skipped:  # a skip keeps seeds that a fresh seeding draws too
            np.testing.assert_array_equal(kept._seeded.rows_host, fresh_rows)
            np.testing.assert_array_equal(rows, fresh_rows)
        if kind != "picked":
            assert skipped == (kind == "unpicked")
        outcomes[kind, skipped] += 1
    assert outcomes["picked", True] > 0 and outcomes["picked", False] > 0, outcomes
    assert kept.seedings_run == 1 + outcomes["raise", False] + outcomes["picked", False]


def test_seeding_margins_are_the_picks_scores_and_their_runners_up():
    """`weighted_seeding_margins` picks the rows `weighted_seeding` does; each pick's factor is
    its D^2 to the run's earlier seeds (1 at the first step), and the runner-up is the largest
    score of the other rows, both recomputed here in NumPy; the pick scores at least that."""
    x, _ = _blobs(31)
    rng = np.random.default_rng(31)
    wp = np.zeros(64)
    wp[: len(x)] = rng.integers(1, 30, size=len(x))
    pad = clustering.PaddedPoints(x, min_rows=64)
    race = clustering._seeding_race(jax.random.key(32), 10, 4, 64)
    rows, factors, runner_up = map(np.asarray, _kernels.weighted_seeding_margins(race, pad._xp, wp, pad._valid, 4))
    np.testing.assert_array_equal(rows, np.asarray(_kernels.weighted_seeding(race, pad._xp, wp, pad._valid, 4)))
    xp, race_h = np.asarray(pad._xp), np.asarray(race)
    assert np.all(rows >= 0)
    for r, s in itertools.product(range(rows.shape[0]), range(4)):
        d2 = np.min([np.sum((xp - xp[j]) ** 2, axis=1) for j in rows[r, :s]], axis=0) if s else np.ones(64)
        scores = wp * d2 * race_h[r, s]
        j = rows[r, s]
        np.testing.assert_allclose(factors[r, s], d2[j], rtol=1e-12)
        np.testing.assert_allclose(runner_up[r, s], np.max(np.delete(scores, j)), rtol=1e-12)
        assert (wp[j] * factors[r, s]) * race_h[r, s, j] >= runner_up[r, s] > 0


def test_padded_points_skip_rule_is_needed_for_picked_rows():
    """Lowering a picked row can change the seeds: the rule must not skip it (not vacuous)."""
    x, _ = _blobs(23)
    w = np.full(len(x), 50.0)
    race = clustering._seeding_race(jax.random.key(24), 10, 4, 64)
    pad = clustering.PaddedPoints(x, min_rows=64)
    wp = np.zeros(64)
    wp[: len(x)] = w
    rows = np.asarray(pad._seeds(race, wp, 4))
    changed = 0
    for j in np.unique(rows[rows >= 0]):
        lowered = wp.copy()
        lowered[j] = 1.0
        again = np.asarray(_kernels.weighted_seeding(race, pad._xp, lowered, pad._valid, 4))
        changed += not np.array_equal(again, rows)
        np.testing.assert_array_equal(np.asarray(pad._seeds(race, lowered, 4)), again)
        pad._seeds(race, wp, 4)  # back to the original weights (a raise: re-seeds)
    assert changed > 0


def test_weighted_kmeans_with_fewer_distinct_points_than_k():
    x = np.array([[0.1, 0.1], [0.9, 0.9], [0.1, 0.1], [0.5, 0.2]])
    c, cost = weighted_kmeans(jax.random.key(0), x, np.array([1.0, 2.0, 3.0, 1.0]), 4)
    assert cost == 0.0 and c.shape == (4, 2)
    assert {tuple(r) for r in c[:3]} == {(0.1, 0.1), (0.9, 0.9), (0.5, 0.2)}
    np.testing.assert_array_equal(c[3], c[0])


@pytest.mark.parametrize(
    ("points", "weights", "kwargs"),
    [
        (np.zeros((0, 2)), np.zeros(0), {}),
        (np.zeros((3, 2)), np.ones(2), {}),
        (np.zeros((3, 2)), np.array([1.0, 0.0, 1.0]), {}),
        (np.array([[np.nan, 0.0]]), np.ones(1), {}),
        (np.zeros((3, 2)), np.ones(3), {"k": 0}),
        (np.zeros((3, 2)), np.ones(3), {"n_init": 0}),
        (np.zeros((3, 2)), np.ones(3), {"max_iter": 0}),
        (np.zeros((3, 2)), np.ones(3), {"tol": -1.0}),
    ],
)
def test_weighted_kmeans_validation(points, weights, kwargs):
    args = {"k": 2, **kwargs}
    k = args.pop("k")
    with pytest.raises(ValueError):
        weighted_kmeans(jax.random.key(0), points, weights, k, **args)


# ------------------------------------------------------------------ phi_f and phi_c


def ref_federated_loss(client_x, client_centroids, client_positions, grid, centroids):
    total = 0.0
    for x, local, pos in zip(client_x, client_centroids, client_positions, strict=True):
        reps = grid.bin_centres(grid.bin_indices(local))
        for p, j in zip(x, pos, strict=True):
            d = [float(np.sum((reps[j] - c) ** 2)) for c in centroids]
            label = min(range(len(d)), key=lambda i: (d[i], i))
            total += float(np.sum((p - centroids[label]) ** 2))
    return total


def _federation(seed, n_clients=3, n_per=10):
    """A small federated instance: 4 blobs, each client holding points from all of them."""
    x, _ = _blobs(seed, n_per=n_per, spread=0.05)
    rng = np.random.default_rng(seed)
    parts = np.array_split(rng.permutation(len(x)), n_clients)
    models = [LocalSeeding(x[p], p, 4, jax.random.fold_in(jax.random.key(seed), i)) for i, p in enumerate(parts)]
    return x, parts, models


def test_federated_loss_dominates_centralized_loss():
    """Oracle 14 (and the reference implementation of Definition 3.1), both server modes."""
    # The default gamma = 1/sqrt(40) is coarse next to the blobs, so the quantization term of
    # Theorem 4.1 (n d gamma^2 / 4) dominates; the quality check uses a fine grid.
    grids = {"default": make_grid(40, 2), "fine": make_grid(40, 2, gamma=0.005)}
    for seed in range(3):
        x, parts, models = _federation(seed)
        client_x = [x[p] for p in parts]
        positions = [m.assignment()[1] for m in models]
        for i, m in enumerate(models):
            np.testing.assert_array_equal(m.assignment()[0], parts[i])
        phi_star = reference_loss(x, 4, seed=0)
        for (name, grid), mode in itertools.product(grids.items(), ("weighted", "uniform")):
            q: collections.Counter = collections.Counter()
            for m in models:
                q.update(m.counts(grid))
            assert sum(q.values()) == len(x)
            pts, w = server_points(q, grid, mode, jax.random.key(seed))
            centroids, _ = weighted_kmeans(jax.random.key(seed + 50), pts, w, 4)
            phi_f = federated_loss(client_x, [m.centroids for m in models], positions, grid, centroids)
            phi_c = kmeans_cost(x, centroids)
            ref = ref_federated_loss(client_x, [m.centroids for m in models], positions, grid, centroids)
            assert math.isclose(phi_f, ref, rel_tol=1e-12)
            assert phi_f >= phi_c * (1 - 1e-12)
            assert phi_star <= phi_c * (1 + 1e-9)
            if name == "fine":  # quality smoke test (oracle 15) on well-separated blobs
                assert phi_f / phi_star < 1.5, (seed, mode, phi_f / phi_star)


def test_induced_assignment_can_cost_strictly_more():
    """App. L: a point charged to its local cluster's server centroid, not its nearest one."""
    grid = make_grid(4, 1, gamma=0.1)
    x = np.array([[0.0], [0.4]])
    model = LocalSeeding(x, np.array([0, 1]), 1, jax.random.key(0))  # one local cluster
    centroids = np.array([[0.0], [0.4]])
    phi_f = federated_loss([x], [model.centroids], [model.assignment()[1]], grid, centroids)
    assert kmeans_cost(x, centroids) == 0.0
    assert phi_f == pytest.approx(0.16, rel=1e-12)
    np.testing.assert_array_equal(induced_labels(model.centroids, grid, centroids), [0 if model.seeds == (0,) else 1])


def test_federated_loss_validation_and_kmeans_cost_reference():
    grid = make_grid(10, 2)
    x = np.random.default_rng(0).uniform(size=(7, 2))
    c = x[:3]
    expected = sum(min(float(np.sum((p - q) ** 2)) for q in c) for p in x)
    assert math.isclose(kmeans_cost(x, c), expected, rel_tol=1e-12)
    with pytest.raises(ValueError):
        federated_loss([x], [c], [], grid, c)
    with pytest.raises(ValueError):
        federated_loss([x], [c], [np.zeros(6, int)], grid, c)
    with pytest.raises(ValueError):
        federated_loss([x], [c], [np.full(7, 3)], grid, c)
    assert federated_loss([np.zeros((0, 2))], [c], [np.zeros(0, int)], grid, c) == 0.0


# ------------------------------------------------------------------ full-size runs (slow)


@pytest.mark.slow
def test_celltype_loss_ratio_is_near_the_paper():
    """Oracle 15 on the shipped Celltype split: the paper reports 1.14 +- 0.03 (Table 1)."""
    path = find_data_file("celltype")  # the FEDPROTO_DATA mirror (tests/conftest.py)
    if path is None:
        pytest.skip("celltype.npz is in no FEDPROTO_DATA directory")
    from fedproto.algorithms.mufc.data import file_clients

    with np.load(path) as archive:
        x = archive["X"]
        phi_star = float(archive["kmeans_loss"])
    parts = file_clients(path, x)
    grid = make_grid(len(x), x.shape[1])
    ratios = []
    for rep in range(3):
        key = jax.random.key(rep)
        models = [LocalSeeding(x[p], p, 4, jax.random.fold_in(key, i)) for i, p in enumerate(parts)]
        q: collections.Counter = collections.Counter()
        for m in models:
            q.update(m.counts(grid))
        pts, w = server_points(q, grid, "uniform", jax.random.fold_in(key, 10_000))
        centroids, _ = weighted_kmeans(jax.random.fold_in(key, 10_001), pts, w, 4)
        phi_f = federated_loss([x[p] for p in parts], [m.centroids for m in models],
                               [m.assignment()[1] for m in models], grid, centroids)
        ratios.append(phi_f / phi_star)
    assert 1.0 <= np.mean(ratios) < 1.35, ratios


@pytest.mark.slow
def test_gaussian_loss_ratio_is_moderate():
    """Oracle 15 on the paper's Gaussian set (n = 30000, K = 10, L = 100, i.i.d. split).

    The paper reports 1.25 +- 0.02; its data were scaled by the global maximum (spec 5.2), ours
    are min-max scaled per column, and with variance 0.5 the ten components overlap almost
    completely, so only the spec's broad range is asserted.
    """
    from fedproto.algorithms.mufc.data import client_split, gaussian_mixture

    ds = gaussian_mixture(0)
    parts = client_split(ds.x, 100, k=10, k_prime=None, seed=0)
    grid = make_grid(ds.n, ds.d)
    key = jax.random.key(0)
    models = [LocalSeeding(ds.x[p], p, 10, jax.random.fold_in(key, i)) for i, p in enumerate(parts)]
    q: collections.Counter = collections.Counter()
    for m in models:
        q.update(m.counts(grid))
    pts, w = server_points(q, grid, "weighted", key)
    centroids, _ = weighted_kmeans(jax.random.fold_in(key, 1), pts, w, 10)
    phi_f = federated_loss([ds.x[p] for p in parts], [m.centroids for m in models],
                           [m.assignment()[1] for m in models], grid, centroids)
    ratio = phi_f / reference_loss(ds.x, 10, seed=0)
    assert 1.0 <= ratio < 1.5, ratio

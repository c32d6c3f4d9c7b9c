"""Solvers and kernels of (k,z)-center against pure-Python references and brute force (spec section 7)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import fedproto.algorithms  # noqa: F401
from fedproto.algorithms.kzclustering import _kernels, solvers

# --- pure-Python references (slow, literal transcriptions of the pseudo-code) ---------------------


def reference_aggregate(x, radius, y, candidates="all"):
    """Algorithm 2 recomputing every ball from scratch."""
    n = len(x)
    dist = [[math.dist(x[i], x[j]) for j in range(n)] for i in range(n)]
    alive = set(range(n))
    reps, weights = [], []
    while True:
        pool = range(n) if candidates == "all" else sorted(alive)
        best, best_size = None, -1
        for p in pool:
            size = sum(1 for q in alive if dist[p][q] <= 2 * radius)
            if size > best_size:
                best, best_size = p, size
        if best is None or not best_size > y:
            break
        absorbed = {q for q in alive if dist[best][q] <= 4 * radius}
        reps.append(best)
        weights.append(len(absorbed))
        alive -= absorbed
    return reps, weights, len(alive)


def reference_cover(x, w, k, radius, grow, expand):
    n = len(x)
    dist = [[math.dist(x[i], x[j]) for j in range(n)] for i in range(n)]
    alive = set(range(n))
    centres = []
    for _ in range(k):
        if not alive:
            break
        best = max(range(n), key=lambda p: (sum(w[q] for q in alive if dist[p][q] <= grow * radius), -p))
        centres.append(best)
        alive -= {q for q in alive if dist[best][q] <= expand * radius}
    return centres, sum(w[q] for q in alive)


def integer_points(rng, n, d=2, span=6):
    return rng.integers(0, span, size=(n, d)).astype(np.float64)


# --- kernels ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "m", "d"), [(1, 1, 1), (5, 9, 3), (17, 8, 2), (0, 3, 2)])
def test_pairwise_distances_match_numpy(n, m, d):
    rng = np.random.default_rng(n * 31 + m)
    x, y = rng.normal(size=(n, d)), rng.normal(size=(m, d))
    expected = np.sqrt(((x[:, None, :] - y[None, :, :]) ** 2).sum(-1))
    got = _kernels.pairwise_distances(x, y)
    assert got.shape == (n, m) and got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-13)


def test_pairwise_distances_are_exact_on_integer_points():
    x = np.array([[0.0, 0.0], [3.0, 4.0], [6.0, 8.0]])
    np.testing.assert_array_equal(_kernels.pairwise_distances(x), [[0, 5, 10], [5, 0, 5], [10, 5, 0]])
    with pytest.raises(ValueError):
        _kernels.pairwise_distances(x, np.zeros((2, 3)))


def test_nearest_centres_ties_go_to_the_lowest_index_and_empty_sets_serve_nobody():
    x = np.array([[0.0], [1.0], [2.0], [5.0]])
    dist, labels = _kernels.nearest_centres(x, np.array([[1.0], [1.0], [3.0]]))
    np.testing.assert_array_equal(dist, [1, 0, 1, 2])
    np.testing.assert_array_equal(labels, [0, 0, 0, 2])
    dist, labels = _kernels.nearest_centres(x, np.zeros((0, 1)))
    assert np.all(np.isinf(dist)) and np.all(labels == -1)


def test_truncated_cost_curve_matches_numpy():
    rng = np.random.default_rng(3)
    dist = np.concatenate([rng.exponential(size=11), [np.inf]])
    w = rng.normal(size=12)
    radii = np.array([0.0, 0.3, 1.0, 4.0])
    for power in (1, 2):
        expected = [(w * np.minimum(dist, r) ** power).sum() for r in radii]
        np.testing.assert_allclose(_kernels.truncated_cost_curve(dist, w, radii, power), expected, rtol=1e-12)


# --- grid --------------------------------------------------------------------------------------------


def test_radius_grid_is_geometric_and_covers_the_upper_end():
    grid = solvers.radius_grid(0.5, 100.0, 0.1)
    assert grid[0] == 0.5 and grid[-1] >= 100.0 > grid[-2]
    np.testing.assert_allclose(grid[1:] / grid[:-1], 1.1)
    np.testing.assert_array_equal(grid, solvers.radius_grid(0.5, 100.0, 0.1))  # bit-identical
    np.testing.assert_array_equal(solvers.radius_grid(2.0, 1.0, 0.5), [2.0])
    for bad in [(0.0, 1.0, 0.1), (1.0, math.inf, 0.1), (1.0, 2.0, 0.0)]:
        with pytest.raises(ValueError):
            solvers.radius_grid(*bad)


# --- aggregating (oracles 4-8) ------------------------------------------------------------------------


@pytest.mark.parametrize("candidates", ["all", "uncovered"])
def test_aggregate_matches_the_pseudo_code_and_claim_2_2(candidates):
    rng = np.random.default_rng(7)
    for trial in range(40):
        n = int(rng.integers(1, 16))
        x = integer_points(rng, n) if trial % 2 else rng.normal(size=(n, 2))
        radius = float(rng.choice([0.0, 0.25, 0.5, 1.0, 2.5]))
        y = float(rng.choice([0.0, 0.5, 1.0, 2.0, 3.5]))
        dist = _kernels.pairwise_distances(x)
        agg = solvers.aggregate(dist, radius, y, candidates=candidates)
        reps, weights, discarded = reference_aggregate(x, radius, y, candidates)
        assert agg.reps.tolist() == reps and agg.weights.tolist() == weights and agg.discarded == discarded
        # oracle 4: weights and discarded points sum to n; absorbed sets are disjoint and within 4L
        assert int(agg.weights.sum()) + agg.discarded == n
        assert np.all(agg.weights >= 1)
        np.testing.assert_array_equal(np.bincount(agg.owner[agg.owner >= 0], minlength=len(reps)), agg.weights)
        absorbed = np.flatnonzero(agg.owner >= 0)
        assert np.all(dist[absorbed, agg.reps[agg.owner[absorbed]]] <= 4 * radius)
        assert agg.discarded == int(np.sum(agg.owner < 0))
        # oracle 5: no dense ball is left
        left = agg.owner < 0
        pool = np.arange(n) if candidates == "all" else np.flatnonzero(left)
        for p in pool:
            assert int(np.sum(left & (dist[p] <= 2 * radius))) <= y


def test_aggregate_at_radius_zero_keeps_the_frequent_locations():
    """Oracle 6: L = 0 gives the distinct locations with multiplicity > y, weighted by it."""
    x = np.array([[0.0], [1.0], [1.0], [2.0], [2.0], [2.0], [1.0], [3.0]])
    agg = solvers.aggregate(_kernels.pairwise_distances(x), 0.0, 1.5)
    assert sorted(zip(x[agg.reps, 0].tolist(), agg.weights.tolist())) == [(1.0, 3), (2.0, 3)]
    assert agg.discarded == 2


def test_aggregate_with_zero_threshold_absorbs_everything_and_terminates():
    """Oracle 7: z = 0 gives y = 0; the strict '>' rule terminates and discards nothing."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(30, 3))
    for radius in (0.0, 0.1, 10.0):
        agg = solvers.aggregate(_kernels.pairwise_distances(x), radius, 0.0)
        assert agg.discarded == 0 and int(agg.weights.sum()) == 30


def test_aggregate_respects_lemma_2_3():
    """Oracle 8: if some k centres leave z_hat points farther than L, then |Q'| <= k + z_hat / y."""
    rng = np.random.default_rng(11)
    for _ in range(25):
        n = int(rng.integers(4, 12))
        k = int(rng.integers(1, 3))
        x = integer_points(rng, n, span=8)
        radius = float(rng.choice([0.5, 1.0, 1.5]))
        y = float(rng.choice([0.5, 1.0, 2.0]))
        dist = _kernels.pairwise_distances(x)
        z_hat = min(
            int(np.sum(dist[:, list(c)].min(axis=1) > radius)) for c in itertools.combinations(range(n), k)
        )
        for candidates in ("all", "uncovered"):
            agg = solvers.aggregate(dist, radius, y, candidates=candidates)
            assert agg.reps.shape[0] <= k + z_hat / y


def test_aggregate_stops_at_max_reps():
    x = np.arange(10, dtype=np.float64)[:, None] * 10
    agg = solvers.aggregate(_kernels.pairwise_distances(x), 1.0, 0.0, max_reps=4)
    assert agg.overflow and agg.reps.shape[0] == 4 and agg.count == 5 and agg.discarded == 6
    exact = solvers.aggregate(_kernels.pairwise_distances(x), 1.0, 0.0, max_reps=10)
    assert not exact.overflow and exact.count == 10


def test_aggregate_rejects_bad_arguments():
    dist = np.zeros((2, 2))
    with pytest.raises(ValueError):
        solvers.aggregate(dist, -1.0, 0.0)
    with pytest.raises(ValueError):
        solvers.aggregate(dist, 1.0, 0.0, candidates="some")
    with pytest.raises(ValueError):
        solvers.aggregate(np.zeros((2, 3)), 1.0, 0.0)


# --- kzc and greedy covers (oracles 9, 10, 22, 23) -----------------------------------------------------


@pytest.mark.parametrize(("grow", "expand"), [(2.0, 4.0), (1.0, 3.0), (5.0, 11.0)])
def test_greedy_cover_matches_the_pseudo_code(grow, expand):
    rng = np.random.default_rng(int(grow * 10))
    for _ in range(30):
        n = int(rng.integers(1, 14))
        x = integer_points(rng, n)
        w = rng.integers(1, 4, size=n)
        k = int(rng.integers(1, 4))
        radius = float(rng.choice([0.0, 0.5, 1.0, 1.5]))
        cover = solvers.greedy_cover(_kernels.pairwise_distances(x), w, k, 2.0, radius, grow=grow, expand=expand)
        centres, uncovered = reference_cover(x, w, k, radius, grow, expand)
        assert cover.centres.tolist() == centres and cover.uncovered == uncovered
        assert cover.ok == (uncovered <= 2.0)


def test_kzc_output_is_valid_and_complete():
    """Oracles 9 and 10: a returned C' is a subset of Q with <= k points and <= z' weight beyond 4L';
    if some C* from a superset P has weighted cost <= L' with z', kzc does not say No."""
    rng = np.random.default_rng(5)
    checked_complete = 0
    for _ in range(60):
        n_p = int(rng.integers(3, 11))
        p = integer_points(rng, n_p, span=7)
        q_idx = np.sort(rng.choice(n_p, size=int(rng.integers(1, n_p + 1)), replace=False))
        q = p[q_idx]
        w = rng.integers(1, 4, size=q.shape[0])
        k = int(rng.integers(1, 3))
        budget = float(rng.choice([0.0, 1.0, 2.5, 4.0]))
        dist = _kernels.pairwise_distances(q)
        best = np.inf
        for subset in itertools.combinations(range(n_p), k):
            d = _kernels.pairwise_distances(q, p[list(subset)]).min(axis=1)
            order = np.argsort(-d)
            beyond, cost = 0.0, 0.0
            for i in order:
                if beyond + w[i] > budget:
                    cost = d[i]
                    break
                beyond += w[i]
            best = min(best, cost)
        for radius in (0.5, 1.0, 2.0, 3.0):
            cover = solvers.kzc(dist, w, k, budget, radius)
            if cover.ok:
                assert cover.centres.shape[0] <= k and np.all(cover.centres < q.shape[0])
                far = _kernels.pairwise_distances(q, q[cover.centres]).min(axis=1) > 4 * radius
                assert w[far].sum() <= budget
            if best <= radius:
                checked_complete += 1
                assert cover.ok
    assert checked_complete > 20


def _centres_cost(x, centres, z):
    return solvers.center_cost(_kernels.nearest_centres(x, x[centres])[0], z)


def test_exact_radius_searches_meet_their_ratios(kz):
    """Oracle 23: Charikar (1,3) with the exact search costs <= 3 OPT; kzc (2,4) <= 4 OPT (z outliers)."""
    rng = np.random.default_rng(23)
    for _ in range(20):
        n = int(rng.integers(4, 11))
        k = int(rng.integers(1, 4))
        z = int(rng.integers(0, n - 1))
        x = rng.normal(size=(n, 2)) if rng.random() < 0.5 else integer_points(rng, n)
        opt = kz.opt(x, k, z)
        dist = _kernels.pairwise_distances(x)
        ones = np.ones(n, dtype=np.int64)
        for (grow, expand), ratio in (((1.0, 3.0), 3), ((2.0, 4.0), 4)):
            cover = solvers.smallest_cover_radius(dist, ones, k, z, grow=grow, expand=expand)
            assert cover is not None and cover.ok
            assert cover.radius <= opt * (1 + 1e-12)  # every r >= OPT succeeds: hi <= OPT
            cost = _centres_cost(x, solvers.pad_centres(x, cover.centres, k), z)
            assert cost <= ratio * opt * (1 + 1e-12) + 1e-12


def test_smallest_cover_radius_with_an_upper_bound():
    x = np.array([[0.0], [1.0], [10.0], [11.0]])
    dist = _kernels.pairwise_distances(x)
    ones = np.ones(4, dtype=np.int64)
    cover = solvers.smallest_cover_radius(dist, ones, 2, 0, grow=2.0, expand=4.0, upper=5.0)
    assert cover is not None and cover.radius == 0.25  # 4 * 0.25 = 1 covers each pair
    assert solvers.smallest_cover_radius(dist, ones, 1, 0, grow=2.0, expand=4.0, upper=1.0) is None
    bp = solvers.cover_breakpoints(dist, grow=3.0, expand=11.0)
    assert bp[0] == 0 and np.all(np.diff(bp) > 0)
    for v in np.unique(dist[dist > 0]):  # the pair at distance v is inside the ball at v / g
        for g in (3.0, 11.0):
            assert bp[g * bp >= v].min() <= np.nextafter(v / g, np.inf)


def test_farthest_first_is_a_2_approximation_without_outliers(kz):
    """Oracle 22: Gonzalez's greedy costs <= 2 OPT for z = 0."""
    rng = np.random.default_rng(22)
    for _ in range(15):
        n = int(rng.integers(2, 11))
        k = int(rng.integers(1, 4))
        x = rng.normal(size=(n, 3))
        idx, radii = solvers.farthest_first(x, k, start=int(rng.integers(0, n)))
        assert np.all(np.diff(radii[1:]) <= 0)
        assert _centres_cost(x, idx, 0) <= 2 * kz.opt(x, k, 0) + 1e-12


def test_farthest_first_and_padding_stop_at_the_distinct_points():
    x = np.array([[0.0], [0.0], [1.0], [1.0]])
    idx, radii = solvers.farthest_first(x, 4)
    assert idx.tolist() == [0, 2] and radii.tolist() == [math.inf, 1.0]
    assert solvers.pad_centres(x, np.array([2]), 3).tolist() == [2, 0]
    assert solvers.pad_centres(x, np.zeros(0, dtype=np.int64), 1).tolist() == [0]
    assert solvers.pad_centres(np.zeros((0, 1)), np.zeros(0, dtype=np.int64), 3).tolist() == []


def test_center_cost_is_the_n_minus_z_th_distance():
    """Oracle 1: non-increasing in z, and 0 when z >= n - k for centres taken from P."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(12, 2))
    centres = np.array([0, 5, 7])
    dist = _kernels.nearest_centres(x, x[centres])[0]
    costs = [solvers.center_cost(dist, z) for z in range(13)]
    assert all(a >= b for a, b in zip(costs, costs[1:]))
    assert all(c == 0 for c in costs[12 - 3 :])
    assert costs[0] == dist.max() and solvers.center_cost(dist, 2.7) == costs[2]

"""Memory-lean (k,z)-center machine work: blocked and k-d tree aggregation, extents, sub-machines.

Every lean computation is checked for equality (not closeness) with the dense one it replaces:
the canonical distance is the same function of two points in both, so the ball tests agree, ties
at the boundary included (radii at exact breakpoints and integer fixtures are where a different
summation order would show).
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

import fedproto.algorithms  # noqa: F401
from fedproto.algorithms.kzclustering import _kernels, solvers, solvers_covers

# --- fixtures ----------------------------------------------------------------------------------------


def mixed_scales(rng, n, d):
    """Coordinates of very different magnitudes around an offset: where summation order matters."""
    return rng.normal(size=(n, d)) * rng.choice([1e-3, 1.0, 1e3], size=(n, d)) + rng.normal(size=(1, d)) * 100


def tie_heavy(rng, n, d=2, span=5):
    """Integer points on a small grid: many duplicates and many equal distances."""
    return rng.integers(0, span, size=(n, d)).astype(np.float64)


def clustered(rng, n, d=3):
    """Tight blobs and a wide scatter: dense balls, singletons and empty regions together."""
    half = n // 2
    centres = rng.normal(size=(4, d)) * 10
    return np.concatenate([centres[rng.integers(0, 4, size=half)] + rng.normal(size=(half, d)) * 0.3,
                           rng.normal(size=(n - half, d)) * 15])


def assert_same(got: solvers.Aggregation, want: solvers.Aggregation) -> None:
    assert got.reps.tolist() == want.reps.tolist()
    assert got.weights.tolist() == want.weights.tolist()
    np.testing.assert_array_equal(got.owner, want.owner)
    assert got.discarded == want.discarded and got.overflow == want.overflow
    assert got.reps.dtype == np.int64 and got.weights.dtype == np.int64 and got.owner.dtype == np.int64


def radii_for(rng, dist):
    """Plain radii plus breakpoints (half and quarter of actual distances: points exactly on a sphere)."""
    values = dist[np.triu_indices(dist.shape[0], k=1)] if dist.shape[0] > 1 else np.ones(1)
    return [0.0, 0.3, 1.0, float(rng.choice(values)) / 2, float(rng.choice(values)) / 4, float(values.max())]


# --- the canonical distance -----------------------------------------------------------------------------


@pytest.mark.parametrize("d", [1, 2, 3, 5, 9])
def test_pair_distances_equal_the_matrix_bit_for_bit(d):
    rng = np.random.default_rng(d)
    x = mixed_scales(rng, 300, d)
    full = _kernels.pairwise_distances(x)
    rows, cols = rng.integers(0, 300, size=5000), rng.integers(0, 300, size=5000)
    np.testing.assert_array_equal(_kernels.pair_distances(x, rows, cols), full[rows, cols])
    np.testing.assert_array_equal(_kernels.pair_distances_by_columns(np.ascontiguousarray(x.T), rows, cols),
                                  full[rows, cols])
    np.testing.assert_array_equal(_kernels.pairwise_distances(x[37:101], x[5:]), full[37:101, 5:])
    np.testing.assert_array_equal(full, full.T)
    # sequential left-to-right sum, no fused multiply-add: the definition in the module docstring
    s = (x[:, None, 0] - x[None, :, 0]) ** 2
    for j in range(1, d):
        s = s + (x[:, None, j] - x[None, :, j]) ** 2
    np.testing.assert_array_equal(full, np.sqrt(s))


def test_pair_distances_of_empty_and_other_sets():
    x, y = np.ones((3, 2)), np.array([[1.0, 4.0]])
    np.testing.assert_array_equal(_kernels.pair_distances(x, [0, 2], [0, 0], y), [3.0, 3.0])
    assert _kernels.pair_distances(x, np.zeros(0, dtype=int), np.zeros(0, dtype=int)).shape == (0,)
    with pytest.raises(ValueError):
        _kernels.pair_distances(x, [0], [0], np.zeros((1, 3)))


# --- aggregation without the matrix ---------------------------------------------------------------------


@pytest.mark.parametrize("method", ["pairs", "blocked"])
@pytest.mark.parametrize("candidates", ["all", "uncovered"])
def test_aggregate_points_equals_the_dense_aggregation(method, candidates):
    rng = np.random.default_rng(len(method) * 7 + len(candidates))
    for trial in range(36):
        n = int(rng.integers(2, 90))
        x = [tie_heavy(rng, n), clustered(rng, n), mixed_scales(rng, n, 2)][trial % 3]
        dist = _kernels.pairwise_distances(x)
        for radius in radii_for(rng, dist):
            for y in (0.0, 0.5, 1.0, 3.5):
                cap = None if trial % 2 else int(rng.integers(0, 8))
                want = solvers.aggregate(dist, radius, y, max_reps=cap, candidates=candidates)
                got = solvers.aggregate_points(x, radius, y, max_reps=cap, candidates=candidates, method=method,
                                               block_rows=int(rng.integers(1, 20)))
                assert_same(got, want)


@pytest.mark.parametrize("method", ["auto", "pairs", "blocked"])
def test_aggregate_points_on_empty_single_and_duplicate_inputs(method):
    empty = solvers.aggregate_points(np.zeros((0, 2)), 1.0, 0.0, method=method)
    assert empty.reps.shape == (0,) and empty.owner.shape == (0,) and empty.discarded == 0 and not empty.overflow
    for y, kept in ((0.0, 1), (1.0, 0)):
        single = solvers.aggregate_points(np.ones((1, 3)), 0.0, y, method=method)
        assert single.reps.tolist() == [0] * kept and single.discarded == 1 - kept
    copies = np.repeat(np.array([[0.0, 0.0], [5.0, 5.0]]), [4, 2], axis=0)
    for radius in (0.0, 1.0, 10.0):
        assert_same(solvers.aggregate_points(copies, radius, 1.5, method=method),
                    solvers.aggregate(_kernels.pairwise_distances(copies), radius, 1.5))
    with pytest.raises(ValueError):
        solvers.aggregate_points(copies, -1.0, 0.0, method=method)
    with pytest.raises(ValueError):
        solvers.aggregate_points(copies, 1.0, 0.0, candidates="some", method=method)


@pytest.mark.parametrize("method", ["pairs", "blocked"])
def test_radii_whose_balls_hold_everything_take_the_short_cut_and_agree(method):
    rng = np.random.default_rng(6)
    x = clustered(rng, 600)
    dist = _kernels.pairwise_distances(x)
    index = solvers.PointIndex(x, method=method)
    assert 2 * index.enclosing_radius >= dist.max()
    for radius in (index.enclosing_radius, 3 * index.enclosing_radius):
        for y, cap in ((0.5, None), (0.5, 0), (599.0, None), (600.0, None)):
            assert_same(index.aggregate(radius, y, max_reps=cap), solvers.aggregate(dist, radius, y, max_reps=cap))


def test_aggregate_points_rejects_an_unknown_method():
    with pytest.raises(ValueError):
        solvers.aggregate_points(np.zeros((2, 2)), 1.0, 0.0, method="dense")


def test_point_index_reuses_its_pairs_for_smaller_radii():
    """Radii going up and down through one index (the pair cache is filtered for smaller radii)."""
    rng = np.random.default_rng(4)
    x = clustered(rng, 700)
    dist = _kernels.pairwise_distances(x)
    index = solvers.PointIndex(x, method="pairs")
    for radius in (1.5, 0.2, 0.9, 1.5, 3.0, 0.05, 2.9, 0.0):
        for candidates in ("all", "uncovered"):
            assert_same(index.aggregate(radius, 0.5, candidates=candidates),
                        solvers.aggregate(dist, radius, 0.5, candidates=candidates))


def test_auto_method_follows_the_density_of_balls():
    rng = np.random.default_rng(2)
    assert solvers.PointIndex(rng.normal(size=(100, 2))).choose_method(1.0) == "blocked"  # small: no tree
    index = solvers.PointIndex(rng.normal(size=(2000, 3)))
    assert index.choose_method(0.01) == "pairs"  # balls of a point or two
    assert index.choose_method(100.0) == "blocked"  # every ball holds everything
    assert solvers.PointIndex(rng.normal(size=(2000, 3)), method="pairs").choose_method(100.0) == "pairs"


def test_blocked_aggregation_holds_only_blocks_of_distance_rows():
    """Memory, not time: the blocked method's peak is a few tiles and ``block_rows x n`` blocks, not ``n x n``."""
    rng = np.random.default_rng(8)
    n, block = 3000, 16
    x = clustered(rng, n, d=2)
    index = solvers.PointIndex(x, method="blocked", block_rows=block)
    index.aggregate(0.5, 0.5)  # warm-up: NumPy's first calls allocate caches of their own
    tracemalloc.start()
    try:
        agg = index.aggregate(0.5, 0.5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # ball counts hold tiles of 2^18 distances (2 MiB; the compiled screen keeps its [64, n] tiles
    # outside NumPy), the representatives' rows are block x n: a few of each and O(n) vectors,
    # against 8 n^2 = 72 MB for the matrix
    tile_bytes = 8 * (1 << 18)
    assert peak <= 3 * tile_bytes + 3 * 8 * block * n + 64 * n, (peak, tile_bytes)
    assert peak < 8 * n * n / 8
    assert int(agg.weights.sum()) + agg.discarded == n


# --- extent ---------------------------------------------------------------------------------------------


def dense_extent(x):
    dist = _kernels.pairwise_distances(x)
    positive = dist[dist > 0]
    return (float(positive.min()) if positive.size else math.inf), float(dist[0].max())


@pytest.mark.parametrize("n", [1, 2, 40, 2500])
def test_local_extent_equals_the_dense_one(n):
    rng = np.random.default_rng(n)
    for x in (tie_heavy(rng, n, d=3, span=40), mixed_scales(rng, n, 3), clustered(rng, n)):
        extent = solvers.local_extent(x)
        assert extent.n_points == n and extent.anchor == 0
        assert (extent.min_distance, extent.radius) == dense_extent(x)


def test_local_extent_of_empty_and_identical_points():
    assert solvers.local_extent(np.zeros((0, 2))) == solvers.Extent(0, math.inf, -1, 0.0)
    same = np.full((3000, 2), 7.0)  # past the scan size: the k-d tree path with one distinct point
    assert solvers.local_extent(same) == solvers.Extent(3000, math.inf, 0, 0.0)
    two = np.concatenate([same, [[7.0, 8.5]]])
    assert solvers.local_extent(two).min_distance == 1.5


# --- the sub-machine split ------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "max_points"), [(0, 5), (1, 5), (5, 5), (6, 5), (23, 5), (29, 10), (100, 7)])
def test_split_sub_machines_is_balanced_complete_and_deterministic(n, max_points):
    points = np.zeros((n, 2))
    parts = solvers.split_sub_machines(points, max_points)
    t = solvers.sub_machine_count(n, max_points)
    assert len(parts) == t == max(1, math.ceil(n / max_points))
    sizes = [p.shape[0] for p in parts]
    assert max(sizes) <= max(max_points, 0) and max(sizes) - min(sizes) <= 1
    flat = np.concatenate(parts)
    assert sorted(flat.tolist()) == list(range(n))  # no point dropped, none twice
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)
    assert all(np.array_equal(a, b) for a, b in zip(parts, solvers.split_sub_machines(points, max_points)))


def test_split_rejects_bad_sizes():
    with pytest.raises(ValueError):
        solvers.split_sub_machines(np.zeros((3, 2)), 0)
    with pytest.raises(ValueError):
        solvers.sub_machine_count(-1)


def per_part_reference(x, parts, radius, y, cap, candidates):
    """The split run literally: dense aggregation of each part in order, with the remaining cap."""
    owner = np.full(x.shape[0], -1, dtype=np.int64)
    reps, weights, discarded, overflow = [], [], 0, False
    for part in parts:
        if overflow:
            discarded += part.shape[0]
            continue
        room = None if cap is None else cap - len(reps)
        agg = solvers.aggregate(_kernels.pairwise_distances(x[part]), radius, y, max_reps=room, candidates=candidates)
        owner[part] = np.where(agg.owner >= 0, agg.owner + len(reps), -1)
        reps += part[agg.reps].tolist()
        weights += agg.weights.tolist()
        discarded += agg.discarded
        overflow = agg.overflow
    return reps, weights, owner, discarded, overflow


@pytest.mark.parametrize("workers", [1, 2])
def test_sub_machines_aggregate_each_part_and_keep_the_guarantees(workers):
    rng = np.random.default_rng(workers)
    for trial in range(12):
        n = int(rng.integers(1, 260))
        x = tie_heavy(rng, n, span=9) if trial % 2 else clustered(rng, n, d=2)
        max_points = int(rng.integers(1, 70))
        machine = solvers.SubMachines(x, max_points=max_points, workers=workers,
                                      method=("auto", "pairs", "blocked")[trial % 3])
        assert machine.count == solvers.sub_machine_count(n, max_points)
        for radius in (2.0, 0.0, 0.4, 1.0):
            for y in (0.0, 0.5, 2.0):
                cap = None if trial % 4 == 0 else int(rng.integers(0, 40))
                candidates = ("all", "uncovered")[trial % 2]
                agg = machine.aggregate(radius, y, max_reps=cap, candidates=candidates)
                reps, weights, owner, discarded, overflow = per_part_reference(
                    x, machine.parts, radius, y, cap, candidates)
                assert agg.reps.tolist() == reps and agg.weights.tolist() == weights
                np.testing.assert_array_equal(agg.owner, owner)
                assert (agg.discarded, agg.overflow) == (discarded, overflow)
                assert agg.count == len(reps) + int(overflow)
                if cap is not None and overflow:
                    assert agg.count == cap + 1  # the coordinator sees "more than the cap"
                # the split's guarantees: weights + discarded = n_i, each point moved <= 4L within its part
                assert int(agg.weights.sum()) + agg.discarded == n
                moved = np.flatnonzero(agg.owner >= 0)
                rep_of = agg.reps[agg.owner[moved]]
                assert np.all(_kernels.pair_distances(x, moved, rep_of) <= 4 * radius)
                part_of = np.empty(n, dtype=np.int64)
                for j, part in enumerate(machine.parts):
                    part_of[part] = j
                assert np.array_equal(part_of[moved], part_of[rep_of])


def test_sub_machines_of_a_small_machine_are_the_machine():
    rng = np.random.default_rng(3)
    x = clustered(rng, 150)
    machine = solvers.SubMachines(x, max_points=150)
    assert machine.count == 1
    assert_same(machine.aggregate(0.7, 1.0, max_reps=30),
                solvers.aggregate(_kernels.pairwise_distances(x), 0.7, 1.0, max_reps=30))
    assert machine.extent() == solvers.local_extent(x)
    with pytest.raises(ValueError):
        solvers.SubMachines(x, workers=0)


# --- the coordinator's covers on many representatives -----------------------------------------------


def full_search(dist, weights, k, budget, grow, expand, upper=None):
    """The plain search: every breakpoint listed, lo-fails/hi-succeeds bisection over all of them."""
    candidates = solvers.cover_breakpoints(dist, grow=grow, expand=expand)
    if upper is not None:
        candidates = np.append(candidates[candidates < upper], upper)
    covers = [solvers.greedy_cover(dist, weights, k, budget, float(r), grow=grow, expand=expand) for r in candidates]
    return candidates, [c.ok for c in covers]


@pytest.mark.parametrize(("grow", "expand"), [(2.0, 4.0), (1.0, 3.0)])
def test_sampled_breakpoint_search_ends_on_a_breakpoint_whose_predecessor_fails(grow, expand, monkeypatch):
    """The large-input search (forced here on small inputs, with tiny samples) keeps the invariant of
    the plain one: hi succeeds, hi is a breakpoint, and the breakpoint before it fails; where success
    is monotone over the breakpoints it finds the same radius."""
    monkeypatch.setattr(solvers_covers, "_FULL_BREAKPOINTS", 0)
    monkeypatch.setattr(solvers_covers, "_SAMPLE_BREAKPOINTS", 5)
    monkeypatch.setattr(solvers_covers, "_BLOCK_ROWS", 7)
    rng = np.random.default_rng(int(grow))
    for trial in range(30):
        n = int(rng.integers(2, 40))
        x = tie_heavy(rng, n, span=12) if trial % 2 else clustered(rng, n, d=2)
        weights = rng.integers(1, 4, size=n)
        dist = _kernels.pairwise_distances(x)
        k, budget = int(rng.integers(1, 4)), float(rng.integers(0, 6))
        upper = None if trial % 3 else float(rng.choice(dist.ravel())) / grow
        cover = solvers.smallest_cover_radius(dist, weights, k, budget, grow=grow, expand=expand, upper=upper)
        candidates, ok = full_search(dist, weights, k, budget, grow, expand, upper)
        if not ok[-1]:
            assert cover is None
            continue
        j = int(np.flatnonzero(candidates == cover.radius)[0])
        assert cover.ok and ok[j] and (j == 0 or not ok[j - 1])
        first = int(np.argmax(ok))
        if all(ok[first:]):  # monotone: the only transition
            assert j == first


def test_greedy_cover_counts_integer_weights_exactly_in_blocks(monkeypatch):
    """Integer weights go through blocks of float rows; the result equals the float-weight product path."""
    monkeypatch.setattr(solvers_covers, "_BLOCK_ROWS", 3)
    rng = np.random.default_rng(12)
    for _ in range(20):
        n = int(rng.integers(1, 30))
        x = tie_heavy(rng, n, span=6)
        dist = _kernels.pairwise_distances(x)
        weights = rng.integers(1, 1000, size=n)
        radius = float(rng.choice([0.0, 0.5, 1.0, 2.0]))
        blocked = solvers.greedy_cover(dist, weights, 3, 10.0, radius, grow=2.0, expand=4.0)
        plain = solvers.greedy_cover(dist, weights.astype(np.float64), 3, 10.0, radius, grow=2.0, expand=4.0)
        assert blocked.centres.tolist() == plain.centres.tolist()
        assert blocked.uncovered == plain.uncovered and isinstance(blocked.uncovered, int)
        np.testing.assert_array_equal(blocked.covered, plain.covered)


def test_bel_coreset_with_the_machines_nearest_centres_is_the_same_coreset():
    rng = np.random.default_rng(9)
    x = clustered(rng, 300)
    centres = x[:4]
    draws = rng.random(25)
    nearest = _kernels.nearest_centres(x, centres)
    for radius in (0.5, 3.0, math.inf):
        want = solvers.bel_coreset(draws, x, centres, radius, 2)
        got = solvers.bel_coreset(draws, x, centres, radius, 2, nearest=nearest)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


# --- ball counts: the compiled screen with the canonical distance at the boundary ---------------------


def canonical_counts(x, radius, y=None):
    return np.count_nonzero(_kernels.pairwise_distances(x, y) <= radius, axis=1)


@pytest.mark.parametrize("screen", [True, False])
def test_ball_counts_equal_the_canonical_matrix(screen, monkeypatch):
    """Exact equality, ties included: integer grids put many pairs exactly on the sphere, where
    the compiled screen leaves them to the canonical distance."""
    if screen:
        monkeypatch.setattr(_kernels, "_COUNT_MIN_PAIRS", 0)  # the compiled path on small inputs too
    rng = np.random.default_rng(41)
    for x in (tie_heavy(rng, 300, d=3, span=6), mixed_scales(rng, 257, 4), clustered(rng, 200, d=5)):
        y = x[rng.permutation(x.shape[0])[: x.shape[0] // 2 + 1]]
        for radius in radii_for(rng, _kernels.pairwise_distances(x[:40])) + [1.0, math.sqrt(2.0), 3.0]:
            np.testing.assert_array_equal(_kernels.ball_counts(x, radius), canonical_counts(x, radius))
            got = _kernels.ball_counts(x, radius, y)
            assert got.dtype == np.int64
            np.testing.assert_array_equal(got, canonical_counts(x, radius, y))


def test_ball_counts_decide_boundary_pairs_canonically(monkeypatch):
    """On a grid at radius sqrt(2) the screen cannot decide the diagonal neighbours: those rows are
    recounted, and the result still equals the matrix."""
    monkeypatch.setattr(_kernels, "_COUNT_MIN_PAIRS", 0)
    recounted = []
    original = _kernels._canonical_counts

    def spy(x, y, radius):
        recounted.append(x.shape[0])
        return original(x, y, radius)

    monkeypatch.setattr(_kernels, "_canonical_counts", spy)
    g = np.arange(12, dtype=np.float64)
    x = np.stack(np.meshgrid(g, g), axis=-1).reshape(-1, 2)
    got = _kernels.ball_counts(x, math.sqrt(2.0))
    assert recounted and 0 < recounted[0] <= x.shape[0]
    np.testing.assert_array_equal(got, canonical_counts(x, math.sqrt(2.0)))
    assert got.max() == 9 and got.min() == 4  # interior points: the 3 x 3 block; corners: 2 x 2


def test_ball_counts_of_large_inputs_and_bad_radii():
    rng = np.random.default_rng(5)
    x = clustered(rng, 2100, d=5)  # 4.4 M pairs: past the size where the screen takes over
    for radius in (0.0, 0.25, 4.0, 1e3):
        np.testing.assert_array_equal(_kernels.ball_counts(x, radius), canonical_counts(x, radius))
    assert _kernels.ball_counts(np.zeros((0, 2)), 1.0).shape == (0,)
    assert _kernels.ball_counts(x[:3], 1.0, np.zeros((0, 5))).tolist() == [0, 0, 0]
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError, match="radius"):
            _kernels.ball_counts(x[:3], bad)


def test_split_into_a_given_number_of_parts():
    x = np.zeros((10, 2))
    parts = solvers.split_sub_machines(x, parts=4)
    assert [p.tolist() for p in parts] == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    assert [p.shape[0] for p in solvers.split_sub_machines(x[:2], parts=3)] == [1, 1, 0]  # empty parts allowed
    assert solvers.SubMachines(x, parts=4).count == 4
    with pytest.raises(ValueError):
        solvers.split_sub_machines(x, parts=0)

"""Tests for fedproto.algorithms.kmeans against slow pure-Python/NumPy references, jitted and eager."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from fedproto.algorithms import kmeans
from fedproto.testing import load_file

helpers = load_file(Path(__file__).resolve().parents[1] / "_helpers.py", "tests_helpers")

# Shapes (n, k, d) cover the edge cases n=1 with more clusters than points (empty clusters),
# k=1 with d=1, and a general case. Every new shape costs a compilation (~0.1 s per kernel), so
# the list is short and most other tests reuse the general shape; eager (un-jitted) execution is
# checked once per kernel below, because op-by-op dispatch is slow.
GENERAL = (30, 4, 2)
SHAPES = [(1, 3, 2), (7, 1, 1), GENERAL]


def _data(n, k, d, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, d))
    c = rng.uniform(-1, 1, size=(k, d))
    return x, c


# ------------------------------------------------------------------ slow references


def ref_assign(x, c, radius):
    labels, assigned, sq = [], [], []
    for p in x:
        dists = [sum((float(a) - float(b)) ** 2 for a, b in zip(p, q, strict=True)) for q in c]
        j = min(range(len(c)), key=lambda i: (dists[i], i))
        labels.append(j)
        sq.append(dists[j])
        assigned.append(math.sqrt(dists[j]) < radius)
    return np.array(labels), np.array(assigned, dtype=bool), np.array(sq)


def ref_stats(x, labels, assigned, k):
    d = x.shape[1]
    sums, counts = np.zeros((k, d)), np.zeros(k)
    for p, j, a in zip(x, labels, assigned, strict=True):
        if a:
            sums[j] += p
            counts[j] += 1
    return sums, counts


def ref_relative(x, c, radius):
    labels, assigned, _ = ref_assign(x, c, radius)
    rel, counts = np.zeros_like(c), np.zeros(len(c))
    for p, j, a in zip(x, labels, assigned, strict=True):
        if a:
            rel[j] += p - c[j]
            counts[j] += 1
    return rel, counts, int((~assigned).sum())


def ref_lloyd(x, c):
    labels, assigned, _ = ref_assign(x, c, math.inf)
    sums, counts = ref_stats(x, labels, assigned, len(c))
    out = c.copy()
    for j in range(len(c)):
        if counts[j] > 0:
            out[j] = sums[j] / counts[j]
    return out


# ------------------------------------------------------------------ assignment


@pytest.mark.parametrize(("n", "k", "d"), SHAPES)
@pytest.mark.parametrize("radius", [0.6, math.inf])
def test_assign_clusters_matches_reference(n, k, d, radius):
    x, c = _data(n, k, d)
    labels, assigned, sq = kmeans.assign_clusters(x, c, radius)
    rl, ra, rs = ref_assign(x, c, radius)
    assert labels.dtype == jnp.int32 and labels.shape == (n,)
    assert assigned.dtype == jnp.bool_ and sq.dtype == jnp.float64
    np.testing.assert_array_equal(np.asarray(labels), rl)
    np.testing.assert_array_equal(np.asarray(assigned), ra)
    np.testing.assert_allclose(np.asarray(sq), rs, rtol=1e-13, atol=1e-15)
    if radius == math.inf:
        assert bool(jnp.all(assigned))


def test_assign_ties_go_to_lowest_index():
    # Duplicate centroids, and a point exactly halfway between two distinct centroids.
    c = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [-1.0, 0.0]])
    x = np.array([[0.0, 0.0], [0.0, 2.0], [-0.5, 0.5], [-2.0, 0.0]])
    labels, _, _ = kmeans.assign_clusters(x, c, jnp.inf)
    # (0,0) is at distance 1 from all four centroids -> 0; (0,2) -> 1 (not the duplicate 2);
    # (-0.5, 0.5) is equidistant from 1, 2 and 3 -> 1; (-2, 0) -> 3.
    np.testing.assert_array_equal(np.asarray(labels), [0, 1, 1, 3])


def test_radius_boundary_is_strict():
    """Oracle 24: exactly the points with nearest distance >= eta are dropped (strict '<')."""
    c = np.array([[0.0, 0.0], [10.0, 0.0]])
    eta = 0.5
    x = np.array(
        [
            [0.5, 0.0],  # exactly eta: dropped (the paper's '<'; the authors' code keeps it)
            [np.nextafter(0.5, 0.0), 0.0],  # just inside: kept
            [0.3, 0.4],  # distance exactly 0.5 on the grid: dropped
            [0.0, 0.25],  # kept
            [10.0, 0.75],  # beyond eta from its nearest centroid: dropped
            [0.0, 0.0],  # on its centroid: kept
        ]
    )
    labels, assigned, sq = kmeans.assign_clusters(x, c, eta)
    np.testing.assert_array_equal(np.asarray(assigned), [False, True, False, True, False, True])
    np.testing.assert_array_equal(np.asarray(labels), [0, 0, 0, 0, 1, 0])
    _, counts, n_unassigned = kmeans.relative_statistics(x, c, eta)
    assert int(n_unassigned) == 3
    np.testing.assert_array_equal(np.asarray(counts), [3.0, 0.0])
    # Radius zero drops everything, including the point sitting on its centroid.
    _, assigned0, _ = kmeans.assign_clusters(x, c, 0.0)
    assert not np.any(np.asarray(assigned0))


def test_float32_inputs_stay_float32():
    x, c = _data(5, 2, 2)
    _, _, sq = kmeans.assign_clusters(x.astype(np.float32), c.astype(np.float32), 1.0)
    assert sq.dtype == jnp.float32


# ------------------------------------------------------------------ statistics


@pytest.mark.parametrize(("n", "k", "d"), SHAPES)
def test_cluster_statistics_matches_reference(n, k, d):
    x, c = _data(n, k, d, seed=1)
    labels, assigned, _ = ref_assign(x, c, 0.8)
    sums, counts = kmeans.cluster_statistics(x, labels, assigned, k)
    rs, rc = ref_stats(x, labels, assigned, k)
    assert sums.shape == (k, d) and counts.shape == (k,)
    assert sums.dtype == jnp.float64 and counts.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(sums), rs, rtol=1e-13, atol=1e-14)
    np.testing.assert_array_equal(np.asarray(counts), rc)


def test_cluster_statistics_ignores_unassigned_nonfinite_points():
    x = np.array([[1.0], [np.inf], [np.nan], [3.0]])
    sums, counts = kmeans.cluster_statistics(x, np.array([0, 0, 1, 1]), np.array([True, False, False, True]), 3)
    np.testing.assert_array_equal(np.asarray(sums), [[1.0], [3.0], [0.0]])
    np.testing.assert_array_equal(np.asarray(counts), [1.0, 1.0, 0.0])


@pytest.mark.parametrize(("n", "k", "d"), SHAPES)
@pytest.mark.parametrize("radius", [0.7, math.inf])
def test_relative_statistics_matches_reference(n, k, d, radius):
    x, c = _data(n, k, d, seed=2)
    rel, counts, n_un = kmeans.relative_statistics(x, c, radius)
    rr, rc, rn = ref_relative(x, c, radius)
    np.testing.assert_allclose(np.asarray(rel), rr, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(np.asarray(counts), rc)
    assert n_un.dtype == jnp.int32 and int(n_un) == rn


def test_relative_update_identity():
    """Oracle 8 (Eq. 11): R/C + mu_prev == S/C for every non-empty cluster."""
    x, c = _data(*GENERAL, seed=3)
    for radius in (0.9, math.inf):
        rel, counts, _ = kmeans.relative_statistics(x, c, radius)
        labels, assigned, _ = kmeans.assign_clusters(x, c, radius)
        sums, counts2 = kmeans.cluster_statistics(x, labels, assigned, GENERAL[1])
        np.testing.assert_array_equal(np.asarray(counts), np.asarray(counts2))
        nonempty = np.asarray(counts) > 0
        assert nonempty.sum() >= 3  # the identity is checked on real clusters
        lhs = np.asarray(rel)[nonempty] / np.asarray(counts)[nonempty, None] + c[nonempty]
        rhs = np.asarray(sums)[nonempty] / np.asarray(counts)[nonempty, None]
        np.testing.assert_allclose(lhs, rhs, rtol=0, atol=1e-13)


@pytest.mark.parametrize("n_parties", [1, 2, 3, 8])
def test_local_relative_sums_add_up_to_the_union(n_parties):
    """Oracle 25: sum over clients of Rbar_ij == relative sum over the union (any split)."""
    x, c = _data(24, 4, 2, seed=4)
    # A random split into equal parts (24 is divisible by every M tested): random membership,
    # one compilation per M.
    parts = np.random.default_rng(n_parties).permutation(len(x)).reshape(n_parties, -1)
    rel_union, counts_union, un_union = kmeans.relative_statistics(x, c, 0.9)
    rel_sum, counts_sum, un_sum = np.zeros((4, 2)), np.zeros(4), 0
    for idx in parts:
        rel, counts, n_un = kmeans.relative_statistics(x[idx], c, 0.9)
        rel_sum += np.asarray(rel)
        counts_sum += np.asarray(counts)
        un_sum += int(n_un)
    np.testing.assert_allclose(rel_sum, np.asarray(rel_union), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(counts_sum, np.asarray(counts_union))
    assert un_sum == int(un_union)


# ------------------------------------------------------------------ cost, NICV, Lloyd


@pytest.mark.parametrize(("n", "k", "d"), SHAPES)
def test_cost_and_nicv_match_reference(n, k, d):
    x, c = _data(n, k, d, seed=5)
    _, _, sq = ref_assign(x, c, math.inf)
    np.testing.assert_allclose(float(kmeans.kmeans_cost(x, c)), sq.sum(), rtol=1e-13)
    np.testing.assert_allclose(float(kmeans.nicv(x, c)), sq.sum() / n, rtol=1e-13)


def test_nicv_is_zero_when_points_are_centroids():
    """Oracle 26, first half."""
    _, c = _data(1, GENERAL[1], GENERAL[2], seed=6)
    x = np.resize(c, (GENERAL[0], GENERAL[2]))  # every point is a copy of a centroid
    assert float(kmeans.nicv(x, c)) == 0.0
    assert float(kmeans.kmeans_cost(x, c)) == 0.0


def test_nicv_equals_sklearn_inertia_over_n():
    """Oracle 26, second half: NICV == sklearn's inertia_ / N for the same centroids."""
    from sklearn.cluster import KMeans

    x, _ = _data(*GENERAL, seed=7)
    km = KMeans(n_clusters=GENERAL[1], n_init=1, random_state=0).fit(x)
    np.testing.assert_allclose(float(kmeans.nicv(x, km.cluster_centers_)), km.inertia_ / len(x), rtol=1e-9)


@pytest.mark.parametrize(("n", "k", "d"), SHAPES)
def test_lloyd_step_matches_reference(n, k, d):
    x, c = _data(n, k, d, seed=8)
    new = kmeans.lloyd_step(x, c)
    np.testing.assert_allclose(np.asarray(new), ref_lloyd(x, c), rtol=1e-13, atol=1e-15)


def test_lloyd_step_keeps_empty_cluster_and_decreases_cost():
    x = np.array([[0.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
    c = np.array([[0.0, 0.2], [5.0, 4.0], [-9.0, -9.0]])
    new = np.asarray(kmeans.lloyd_step(x, c))
    np.testing.assert_array_equal(new, [[0.0, 0.5], [5.0, 5.0], [-9.0, -9.0]])
    xs, cs = _data(*GENERAL, seed=9)
    costs = [float(kmeans.kmeans_cost(xs, cs))]
    for _ in range(5):
        cs = kmeans.lloyd_step(xs, cs)
        costs.append(float(kmeans.kmeans_cost(xs, cs)))
    assert all(b <= a + 1e-12 for a, b in zip(costs, costs[1:], strict=False))
    assert costs[-1] < costs[0]


# ------------------------------------------------------------------ noise


def test_noise_shapes_dtypes_and_determinism():
    key = jax.random.key(3)
    g = kmeans.gaussian_noise(key, (4, 3), 2.0)
    assert g.shape == (4, 3) and g.dtype == jnp.float64
    np.testing.assert_array_equal(np.asarray(g), np.asarray(kmeans.gaussian_noise(key, (4, 3), 2.0)))
    other = kmeans.gaussian_noise(jax.random.fold_in(key, 1), (4, 3), 2.0)
    assert not np.array_equal(np.asarray(g), np.asarray(other))
    # std is traced and scales the same standard normal draw.
    np.testing.assert_allclose(np.asarray(kmeans.gaussian_noise(key, (4, 3), 6.0)), 3 * np.asarray(g), rtol=1e-15)
    assert not np.any(np.asarray(kmeans.gaussian_noise(key, (4, 3), 0.0)))
    lap = kmeans.laplace_noise(jax.random.PRNGKey(0), (4, 3), 1.5)  # raw uint32 keys work too
    assert lap.shape == (4, 3) and lap.dtype == jnp.float64
    assert kmeans.laplace_noise(key, (4, 3), 1.0, dtype=jnp.float32).dtype == jnp.float32


N_DRAWS = 200_000
Z = 6.0  # tolerance in standard errors; with fixed keys the test is deterministic anyway


def test_gaussian_noise_moments():
    std = 3.5
    g = np.asarray(kmeans.gaussian_noise(jax.random.key(11), (N_DRAWS,), std))
    assert abs(g.mean()) < Z * std / math.sqrt(N_DRAWS)
    # Var(sample variance) = 2 sigma^4 / (n - 1) for a normal sample.
    assert abs(g.var(ddof=1) - std**2) < Z * std**2 * math.sqrt(2 / (N_DRAWS - 1))
    assert scipy.stats.kstest(g / std, "norm").pvalue > 1e-4


def test_laplace_noise_moments():
    b = 2.0
    z = np.asarray(kmeans.laplace_noise(jax.random.key(12), (N_DRAWS,), b))
    var = 2 * b**2
    assert abs(z.mean()) < Z * math.sqrt(var / N_DRAWS)
    # Laplace: fourth central moment 24 b^4, so Var(sample variance) ~ (24 - 4) b^4 / n.
    assert abs(z.var(ddof=1) - var) < Z * math.sqrt(20 * b**4 / N_DRAWS)
    assert scipy.stats.kstest(z, "laplace", args=(0, b)).pvalue > 1e-4


# ------------------------------------------------------------------ eager == jitted


def _run_all_kernels(x, c, key):
    labels, assigned, sq = kmeans.assign_clusters(x, c, 0.7)
    return {
        "assign": (labels, assigned, sq),
        "stats": kmeans.cluster_statistics(x, labels, assigned, c.shape[0]),
        "relative": kmeans.relative_statistics(x, c, 0.7),
        "cost": kmeans.kmeans_cost(x, c),
        "nicv": kmeans.nicv(x, c),
        "lloyd": kmeans.lloyd_step(x, c),
        # laplace_noise is left out: un-jitted PRNG ops cost ~0.5 s each to dispatch op by op,
        # and the two noise kernels share their structure.
        "gauss": kmeans.gaussian_noise(key, (4, 3), 1.5),
    }


def test_eager_execution_matches_jit():
    """The kernels give the same results with jax.disable_jit() (with an empty cluster)."""
    x, c = _data(*GENERAL, seed=10)
    c[-1] = [50.0, 50.0]  # an empty cluster
    key = jax.random.key(5)
    jitted = _run_all_kernels(x, c, key)
    with jax.disable_jit():
        eager = _run_all_kernels(x, c, key)
    for name in jitted:
        for a, b in zip(jax.tree.leaves(jitted[name]), jax.tree.leaves(eager[name]), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-13, atol=1e-15, err_msg=name)
    # and the eager results equal the slow references too
    rl, ra, rs = ref_assign(x, c, 0.7)
    np.testing.assert_array_equal(np.asarray(eager["assign"][0]), rl)
    np.testing.assert_array_equal(np.asarray(eager["assign"][1]), ra)
    np.testing.assert_allclose(np.asarray(eager["lloyd"]), ref_lloyd(x, c), rtol=1e-13)
    assert np.asarray(eager["lloyd"])[-1].tolist() == [50.0, 50.0]


# ------------------------------------------------------------------ keyed k-means++ seeding


def ref_seeding(step_keys, x, ids, valid, k, weights, prefix, start):
    """Slow reference of weighted D^2 seeding with a kept prefix, drawing with the same keyed
    Gumbel noise: step s picks argmax_j log(u_j) + Gumbel(fold_in(step_keys[s], ids[j]))."""
    w = np.where(valid, weights, 0.0)
    mind = np.where(valid, np.inf, 0.0)
    rows = []
    for s in range(k):
        if s < start:
            j = int(prefix[s])
        else:
            u = w if s == 0 else np.where(w > 0, w * mind, 0.0)
            if not np.any(u > 0):
                break
            j = helpers.gumbel_max_pick(step_keys[s], ids, u)
        rows.append(j)
        mind = np.where(valid, np.minimum(mind, np.sum((x - x[j]) ** 2, axis=1)), 0.0)
    positions = np.array([min(range(len(rows)), key=lambda i: (float(np.sum((p - x[rows[i]]) ** 2)), i)) for p in x])
    return rows, positions, mind


def _seeding_case(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 5, size=(12, 2)) / 4.0  # exact squared distances, many ties
    ids = jnp.asarray(rng.choice(10_000, size=12, replace=False), jnp.uint32)
    valid = np.ones(12, bool)
    valid[[3, 7]] = False
    weights = rng.integers(1, 4, size=12).astype(np.float64)
    weights[5] = 0.0  # a zero-weight row is never chosen
    return x, ids, valid, weights


def test_seeding_matches_slow_reference_with_weights_and_prefix():
    k = 4
    for trial in range(3):
        x, ids, valid, weights = _seeding_case(trial)
        keys = kmeans.seeding_keys(jax.random.key(trial), k)
        start = trial  # 0: plain seeding; 1, 2: keep a prefix of earlier seeds
        prefix = np.array([0, 1, 2, 4], np.int32)
        rows, count, positions, sq = kmeans.kmeanspp_seed_and_assign(
            keys, x, ids, valid, k, weights=weights, prefix=prefix, start=start
        )
        ref_rows, ref_pos, ref_mind = ref_seeding(keys, x, np.asarray(ids), valid, k, weights, prefix, start)
        assert np.asarray(rows).tolist() == ref_rows + [-1] * (k - len(ref_rows))
        assert int(count) == len(ref_rows) and np.asarray(rows)[:start].tolist() == prefix[:start].tolist()
        assert 5 not in ref_rows[start:] and not any(r in (3, 7) for r in ref_rows)
        np.testing.assert_array_equal(np.asarray(positions)[valid], ref_pos[valid])
        np.testing.assert_array_equal(np.asarray(sq), ref_mind)
        plain = kmeans.kmeanspp_seeding(keys, x, ids, valid, k, weights=weights, prefix=prefix, start=start)
        np.testing.assert_array_equal(np.asarray(plain[0]), np.asarray(rows))


def test_seeding_key_stack_equals_single_key_and_coupling_by_id():
    x, ids, valid, _ = _seeding_case(5)
    k = 4
    key = jax.random.key(9)
    rows, count = kmeans.kmeanspp_seeding(key, x, ids, valid, k)
    stacked, _ = kmeans.kmeanspp_seeding(kmeans.seeding_keys(key, k), x, ids, valid, k)
    np.testing.assert_array_equal(np.asarray(rows), np.asarray(stacked))
    assert int(count) == k
    # Removing a row that was never chosen, and permuting the rows, changes no draw.
    chosen = set(np.asarray(rows).tolist())
    drop = next(r for r in range(12) if valid[r] and r not in chosen)
    less = valid.copy()
    less[drop] = False
    rows2, _ = kmeans.kmeanspp_seeding(key, x, ids, less, k)
    np.testing.assert_array_equal(np.asarray(rows2), np.asarray(rows))
    perm = np.random.default_rng(0).permutation(12)
    rows3, _ = kmeans.kmeanspp_seeding(key, x[perm], ids[perm], valid[perm], k)
    np.testing.assert_array_equal(np.asarray(ids)[perm][np.asarray(rows3)], np.asarray(ids)[np.asarray(rows)])


def test_seeding_stops_when_fewer_distinct_points_than_k():
    x = np.array([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    xp, ip, valid = kmeans.pad_rows(x, np.arange(4))
    rows, count = kmeans.kmeanspp_seeding(jax.random.key(0), xp, ip, valid, 3)
    assert int(count) == 2 and np.asarray(rows)[2] == -1
    assert {tuple(x[r]) for r in np.asarray(rows)[:2]} == {(0.0, 0.0), (1.0, 1.0)}
    assert kmeans.capacity(64) == 64 and kmeans.capacity(65) == 72 and kmeans.capacity(1134) == 1152
    assert all(n <= kmeans.capacity(n) <= max(64, 1.125 * n) for n in range(1, 3000, 7))

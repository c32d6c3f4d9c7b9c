"""SecAgg+ neighbourhoods and parameters: structure, uniformity, determinism, Bell et al.'s bounds.

The parameter checks recompute the binomial tails and the ring-disconnection bound here, from
their definitions (log-space scipy tails, ``math.lgamma``), and hold ``plus_parameters`` to them.
"""

from __future__ import annotations

import hashlib
import itertools
import math

import numpy as np
import pytest
from scipy import stats

from fedproto.algorithms.secagg_plus import graph
from fedproto.algorithms.secagg_plus.graph import complete_parameters, neighbourhoods, plus_parameters


def seed(tag: object) -> bytes:
    return hashlib.sha256(repr(tag).encode()).digest()


def check_regular_graph(rows, n, k):
    """Symmetric, ``k``-regular, sorted, in range and loop-free; returns the edge set."""
    assert len(rows) == n
    edges = set()
    for u, row in enumerate(rows):
        assert isinstance(row, tuple) and all(type(v) is int for v in row)
        assert list(row) == sorted(set(row)), "rows are sorted without repeats"
        assert len(row) == k
        assert u not in row
        assert all(0 <= v < n for v in row)
        edges.update((u, v) for v in row)
    assert all((v, u) in edges for u, v in edges), "the relation is symmetric"
    return edges


# ------------------------------------------------------------------------------ structure


@pytest.mark.parametrize(("n", "k"), [(4, 2), (5, 2), (9, 4), (10, 8), (31, 6), (200, 20), (1001, 50)])
def test_neighbourhoods_are_a_symmetric_k_regular_graph_without_loops(n, k):
    check_regular_graph(neighbourhoods(n, k, seed((n, k))), n, k)


@pytest.mark.parametrize(("n", "k"), [(40, 6), (100, 10), (257, 16)])
def test_neighbourhoods_are_a_relabelled_ring_lattice(n, k):
    # In the circulant graph on positions i +- 1..h, two neighbours at offsets a, b of a node
    # are adjacent iff |a - b| <= h: 3 * C(h, 2) adjacent pairs in every neighbourhood (n > 3k).
    # Relabelling preserves this count; a random k-regular graph would not have it.
    rows = neighbourhoods(n, k, seed(("ring", n)))
    adjacency = [set(row) for row in rows]
    h = k // 2
    for u in range(n):
        inner = sum(1 for a, b in itertools.combinations(rows[u], 2) if b in adjacency[a])
        assert inner == 3 * math.comb(h, 2)
    # ... and it is connected (a single ring).
    reached, frontier = {0}, [0]
    while frontier:
        u = frontier.pop()
        for v in adjacency[u] - reached:
            reached.add(v)
            frontier.append(v)
    assert len(reached) == n


@pytest.mark.parametrize(("n", "k"), [(1, 0), (1, 6), (2, 1), (2, 2), (3, 2), (6, 5), (7, 6), (7, 9), (8, 7)])
def test_degree_at_least_n_minus_1_gives_the_complete_graph(n, k):
    rows = neighbourhoods(n, k, seed(0))
    assert rows == tuple(tuple(v for v in range(n) if v != u) for u in range(n))


def test_large_graph_is_regular_and_symmetric():
    n, k = 10_000, 200
    rows = np.asarray(neighbourhoods(n, k, seed("large")))
    assert rows.shape == (n, k)
    assert np.all(np.diff(rows, axis=1) > 0)
    assert not np.any(rows == np.arange(n)[:, None])
    # Symmetry: the edge list equals its transpose.
    forward = np.sort(np.arange(n).repeat(k) * n + rows.ravel())
    backward = np.sort(rows.ravel() * n + np.arange(n).repeat(k))
    assert np.array_equal(forward, backward)


# ------------------------------------------------------------------------------ randomness


def test_same_seed_same_graph_different_seed_different_graph():
    first = neighbourhoods(50, 6, seed("a"))
    assert neighbourhoods(50, 6, seed("a")) == first
    assert neighbourhoods(50, 6, bytearray(seed("a"))) == first
    assert neighbourhoods(50, 6, seed("b")) != first
    assert neighbourhoods(50, 6, seed("a") + b"extra") != first
    # A larger degree on the same seed keeps the same ring: the graphs are nested.
    wider = neighbourhoods(50, 10, seed("a"))
    assert all(set(a) <= set(b) for a, b in zip(first, wider, strict=True))


def test_neighbour_set_is_a_uniform_subset():
    # Client 0 of 7 with k = 2: each of the C(6, 2) = 15 neighbour pairs has probability 1/15.
    draws = 3000
    cells = {pair: i for i, pair in enumerate(itertools.combinations(range(1, 7), 2))}
    counts = np.zeros(len(cells))
    for i in range(draws):
        counts[cells[neighbourhoods(7, 2, seed(("pairs", i)))[0]]] += 1
    # Fixed seeds; the critical value at 1e-6 keeps a uniform generator far from failing, while
    # a fixed or biased ring (e.g. identity permutation) gives a statistic in the thousands.
    assert stats.chisquare(counts).statistic < stats.chi2.isf(1e-6, len(cells) - 1)


def test_every_other_client_is_a_neighbour_equally_often():
    n, k, draws = 41, 6, 2000
    counts = np.zeros(n)
    for i in range(draws):
        for v in neighbourhoods(n, k, seed(("marginal", i)))[17]:
            counts[v] += 1
    assert counts[17] == 0
    others = np.delete(counts, 17)
    assert others.sum() == draws * k
    assert stats.chisquare(others).statistic < stats.chi2.isf(1e-6, n - 2)


def test_permutation_is_uniform():
    counts = {}
    draws = 2400
    for i in range(draws):
        perm = tuple(graph._random_permutation(4, seed(("perm", i))).tolist())
        counts[perm] = counts.get(perm, 0) + 1
    assert sorted(counts) == sorted(itertools.permutations(range(4)))
    assert stats.chisquare(list(counts.values())).statistic < stats.chi2.isf(1e-6, 23)


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((10, 3, bytes(32)), ValueError, "degree must be even and >= 2"),
        ((10, 0, bytes(32)), ValueError, "degree must be even and >= 2"),
        ((10, -2, bytes(32)), ValueError, "degree must be even and >= 2"),
        ((0, 2, bytes(32)), ValueError, "n_clients must be >= 1"),
        ((10, 4, bytes(31)), ValueError, "seed must be at least 32 bytes"),
        ((10, 4, "x" * 32), TypeError, "seed must be bytes"),
        ((10, 4.0, bytes(32)), TypeError, "degree must be an int"),
        ((10.0, 4, bytes(32)), TypeError, "n_clients must be an int"),
        ((10, True, bytes(32)), TypeError, "degree must be an int"),
    ],
)
def test_neighbourhoods_errors(args, error, match):
    with pytest.raises(error, match=match):
        neighbourhoods(*args)


# ------------------------------------------------------------------------------ parameters


def log_disconnection(n, k, bad_fraction):
    """Union bound on two runs of k/2 removed ring positions (hypergeometric), natural log."""
    bad = math.floor(bad_fraction * n + 1e-9)
    if k >= n - 1 or bad < k:
        return -math.inf
    log_pairs = math.log(n * (n - k - 1) / 2)
    return log_pairs + math.lgamma(bad + 1) + math.lgamma(n - k + 1) - math.lgamma(n + 1) - math.lgamma(bad - k + 1)


def conditions(n, k, t, sigma, gamma, delta):
    """(privacy, correctness, majority, connectivity) of Bell et al.'s bounds, recomputed."""
    log_eps = -sigma * math.log(2)
    privacy = math.log(n) + stats.binom.logsf(t - 1, k, gamma) <= log_eps
    correctness = math.log(n) + stats.binom.logcdf(t - 1, k, 1 - delta) <= log_eps
    return privacy, correctness, 2 * t > k, log_disconnection(n, k, gamma + delta) <= log_eps


def feasible(n, k, sigma, gamma, delta):
    """Whether some t in [1, k] meets all four conditions (the same tails, vectorised over t)."""
    log_eps = -sigma * math.log(2)
    if log_disconnection(n, k, gamma + delta) > log_eps:
        return False
    ts = np.arange(1, k + 1)
    privacy = math.log(n) + stats.binom.logsf(ts - 1, k, gamma) <= log_eps
    correctness = math.log(n) + stats.binom.logcdf(ts - 1, k, 1 - delta) <= log_eps
    return bool(np.any(privacy & correctness & (2 * ts > k)))


SETTINGS = [
    (100, 40.0, 0.2, 0.1),
    (1_000, 40.0, 0.2, 0.1),
    (10_000, 40.0, 0.2, 0.1),
    (100_000, 40.0, 0.2, 0.1),
    (5_000, 20.0, 0.05, 0.05),
    (5_000, 60.0, 0.1, 0.25),
    (300, 30.0, 0.0, 0.2),
]


@pytest.mark.parametrize(("n", "sigma", "gamma", "delta"), SETTINGS)
def test_plus_parameters_meet_their_bounds_and_are_minimal(n, sigma, gamma, delta):
    k, t = plus_parameters(n, failure_log2=sigma, corrupt_fraction=gamma, dropout_fraction=delta)
    assert 2 <= k <= n - 1 and (k % 2 == 0 or k == n - 1)
    assert all(conditions(n, k, t, sigma, gamma, delta))
    # t is the smallest valid threshold: t - 1 breaks privacy or the majority.
    privacy, _, majority, _ = conditions(n, k, t - 1, sigma, gamma, delta)
    assert not (privacy and majority)
    # k is the smallest valid even degree.
    assert not any(feasible(n, kk, sigma, gamma, delta) for kk in range(2, k, 2))


def test_plus_degree_grows_like_log_n():
    # Both tails decay as exp(-c k) with c fixed by (gamma, delta, t/k), so the smallest k is
    # (sigma ln 2 + ln n) / c up to the rounding of k and t to integers (a few units). Hence
    # k(n2) / k(n1) tracks L(n2) / L(n1) with L(n) = sigma ln 2 + ln n, far below n2 / n1.
    sigma = 40.0
    sizes = [1_000, 10_000, 100_000, 1_000_000]
    degrees = [plus_parameters(n, failure_log2=sigma)[0] for n in sizes]
    level = [sigma * math.log(2) + math.log(n) for n in sizes]
    for (k1, l1), (k2, l2) in itertools.pairwise(zip(degrees, level, strict=True)):
        assert k1 <= k2 <= math.ceil(k1 * l2 / l1) + 4
    assert degrees[-1] < 2 * degrees[0]  # 1000x the clients, under twice the degree


def test_plus_parameters_tighten_with_the_requirements():
    base = plus_parameters(10_000)
    assert plus_parameters(10_000, failure_log2=80.0)[0] >= base[0]
    assert plus_parameters(10_000, corrupt_fraction=0.3)[0] >= base[0]
    assert plus_parameters(10_000, dropout_fraction=0.2)[0] >= base[0]


def test_plus_parameters_refuse_too_few_clients():
    with pytest.raises(ValueError, match="no degree k <= n_clients - 1 = 49 .* use complete_parameters"):
        plus_parameters(50)
    assert not any(feasible(50, k, 40.0, 0.2, 0.1) for k in [*range(2, 49, 2), 49])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"n_clients": 1}, ValueError, "n_clients must be >= 2"),
        ({"n_clients": 100.0}, TypeError, "n_clients must be an int"),
        ({"failure_log2": 0.0}, ValueError, "failure_log2 must be a positive finite number"),
        ({"failure_log2": math.inf}, ValueError, "failure_log2 must be a positive finite number"),
        ({"failure_log2": "40"}, TypeError, "failure_log2 must be a float"),
        ({"corrupt_fraction": 1.0}, ValueError, r"corrupt_fraction must be in \[0, 1\)"),
        ({"dropout_fraction": -0.1}, ValueError, r"dropout_fraction must be in \[0, 1\)"),
        ({"corrupt_fraction": 0.6, "dropout_fraction": 0.4}, ValueError, "must be < 1"),
        ({"dropout_fraction": True}, TypeError, "dropout_fraction must be a float"),
    ],
)
def test_plus_parameters_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        plus_parameters(**({"n_clients": 1000} | kwargs))


@pytest.mark.parametrize("n", [3, 4, 7, 10, 11, 100, 1001])
def test_complete_parameters_majority_threshold(n):
    k, t = complete_parameters(n)
    assert (k, t) == (n - 1, n // 2 + 1)
    assert k / 2 < t <= k
    # Worst-case counts on the complete graph: corrupt clients below t, surviving others >= t.
    assert math.floor(0.2 * n + 1e-9) < t <= k - math.floor(0.1 * n + 1e-9)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((2,), {}, ValueError, "n_clients must be >= 3"),
        ((10,), {"corrupt_fraction": 0.6}, ValueError, "6 corrupt clients of 10 reach the threshold t = 6"),
        ((10,), {"dropout_fraction": 0.5}, ValueError, "only 4 other clients survive, below t = 6"),
        ((10,), {"corrupt_fraction": 1.5}, ValueError, r"corrupt_fraction must be in \[0, 1\)"),
        (("10",), {}, TypeError, "n_clients must be an int"),
    ],
)
def test_complete_parameters_errors(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        complete_parameters(*args, **kwargs)

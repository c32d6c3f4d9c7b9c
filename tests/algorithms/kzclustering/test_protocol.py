"""Distributed (k,z)-center end to end through the sync harness and the runtime (spec section 7)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import trio

import fedproto.algorithms  # noqa: F401
from fedproto.algorithms.kzclustering import _kernels, solvers
from fedproto.algorithms.kzclustering.config import KzCenterConfig
from fedproto.algorithms.kzclustering.messages import AggregatedCounts, WeightedPoints
from fedproto.algorithms.kzclustering.protocol import COORDINATOR, KzCoordinator, KzMachine, machine_name
from fedproto.codec import decode_frame, encode_frame
from fedproto.errors import InsufficientParticipants, LocalProtocolError, RemoteProtocolError
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.testing.harness import Harness
from fedproto.transports.memory import MemoryNetwork


def check_guarantees(kz, x, config, results, opt=None):
    """Oracles 11 and 13 on one run; returns the coordinator's result."""
    r = results[COORDINATOR]
    eps, z, k = config.eps, config.z, config.k
    dist, _ = _kernels.nearest_centres(x, r.centres)
    beyond = int(np.sum(dist > r.radius))
    assert beyond <= (1 + eps) * z + 1e-9
    assert r.outliers == beyond
    assert r.centres.shape[0] <= k
    # centres are input points
    assert np.all(_kernels.pairwise_distances(r.centres, x).min(axis=1) == 0)
    if opt is not None:
        if opt == 0:
            assert r.radius == 0
        else:
            assert r.radius <= 24 * (1 + eps) * opt * (1 + 1e-12)
            budget = math.floor((1 + eps) * z + 1e-9)
            assert solvers.center_cost(dist, budget) <= r.radius
    return r


def machine_outliers(results, config):
    return [results[machine_name(i)].outliers for i in range(config.n_machines)]


# --- guarantees against brute force -----------------------------------------------------------------


def fuzz(kz, rng, trials, search, *, split=False):
    """Random tiny instances (n <= 11, k <= 3, m <= 3, z <= 7) against brute force (with
    ``split``, every machine also splits into 2 or 3 sub-machines)."""
    for trial in range(trials):
        instance = kz.tiny(rng, trial)
        if instance is None:
            continue
        n, k, z, m, eps, x = instance
        parts = kz.parts(rng, n, m)
        sub_machines = int(rng.integers(2, 4)) if split else 1
        config = KzCenterConfig(
            k=k, z=z, eps=eps, n_machines=m, d=2, search=search, batch=int(rng.integers(0, 3)),
            candidates=str(rng.choice(["all", "uncovered"])), refine=bool(trial % 3), sub_machines=sub_machines,
        )
        results, _ = kz.run(x, parts, config)
        opt = kz.opt(x, k, z)
        r = check_guarantees(kz, x, config, results, opt)
        grid = r.grid
        for t in r.rejected:
            if t == 0 and grid[0] == 0:  # the bottom guess stands for [0, grid[1]): "No" means L* >= grid[1]
                assert grid.shape[0] == 1 or opt >= grid[1]
            else:
                assert grid[t] < opt
        if r.guess_index > 0 and opt <= grid[-1]:  # (the top guess, >= half the diameter, always passes)
            assert r.guess <= grid[grid >= opt].min()
        np.testing.assert_array_equal(np.concatenate(machine_outliers(results, config)).sum(), r.outliers)


SEEDS = {"linear": 1, "binary": 2, "probe": 3}


@pytest.mark.parametrize("search", ["linear", "binary", "probe"])
def test_random_tiny_instances_meet_the_bicriteria_guarantee(kz, search):
    """Oracles 11, 13 and 16: <= (1+eps)z points beyond L_out, L_out <= 24(1+eps) OPT, every
    rejected guess is below L*, and the accepted guess is at most the first grid value >= L*."""
    fuzz(kz, np.random.default_rng(100 * SEEDS[search]), 30, search)


@pytest.mark.parametrize("search", ["linear", "probe"])
def test_split_machines_meet_the_bicriteria_guarantee(kz, search):
    """The same oracles with every machine split into sub-machines (Appendix B: dist-kzc over the
    m' = m t virtual machines keeps every guarantee)."""
    fuzz(kz, np.random.default_rng(700 + SEEDS[search]), 30, search, split=True)


@pytest.mark.parametrize("search", ["probe", "linear", "binary"])
def test_a_split_machine_runs_as_its_parts_would(kz, search):
    """m machines with ``sub_machines = t`` reach the same guess, radius, centres and outliers as
    m t machines holding the strided parts (`solvers.split_sub_machines`), with the threshold and
    bounds of m t, in fewer messages; each machine answers once per request for all its parts."""
    rng = np.random.default_rng(31)
    for trial in range(3):
        x = kz.blobs(trial, per_blob=30, blobs=4, outliers=12)
        n, m, t = x.shape[0], 2, 3
        parts = kz.parts(rng, n, m)
        split = KzCenterConfig(k=4, z=12, eps=0.5, n_machines=m, d=2, sub_machines=t, search=search,
                               radius_bounds=(0.05, 500.0))
        flat = KzCenterConfig(k=4, z=12, eps=0.5, n_machines=m * t, d=2, search=search, radius_bounds=(0.05, 500.0))
        assert (split.virtual_machines, split.threshold, split.count_bound, split.max_reps) == (
            flat.virtual_machines, flat.threshold, flat.count_bound, flat.max_reps)
        pieces = [part[piece] for part in parts for piece in solvers.split_sub_machines(x[part], parts=t)]
        split_results, split_report = kz.run(x, parts, split)
        flat_results, flat_report = kz.run(x, pieces, flat)
        a, b = split_results[COORDINATOR], flat_results[COORDINATOR]
        assert (a.guess_index, a.radius, a.outliers, a.representatives) == (
            b.guess_index, b.radius, b.outliers, b.representatives)
        np.testing.assert_array_equal(a.centres, b.centres)
        assert split_report.messages < flat_report.messages
        check_guarantees(kz, x, split, split_results)


@pytest.mark.slow
@pytest.mark.parametrize("search", ["linear", "binary", "probe"])
def test_many_random_instances_meet_the_bicriteria_guarantee(kz, search):
    """The same oracles on 450 instances per search (the spec's reference check ran about 900)."""
    fuzz(kz, np.random.default_rng(1000 * SEEDS[search]), 450, search)


@pytest.mark.parametrize("count_test", ["tight", "paper"])
def test_every_guess_at_or_above_the_optimum_passes(kz, count_test):
    """Oracle 12: for every grid L >= L*, PASS2 holds (with the tight count bound too),
    weights + discarded = n, and kzc at 5L says yes; the coordinator's PASS2 of every guess it
    probed agrees."""
    rng = np.random.default_rng(12)
    checked = 0
    for _ in range(12):
        n = int(rng.integers(5, 12))
        k = int(rng.integers(1, 3))
        z = int(rng.integers(0, 4))
        m = int(rng.integers(1, 4))
        eps = float(rng.choice([0.1, 0.5, 1.0]))
        x = rng.normal(size=(n, 2))
        config = KzCenterConfig(k=k, z=z, eps=eps, n_machines=m, d=2, count_test=count_test)
        machines = kz.machines(x, kz.parts(rng, n, m), config)
        Harness(machines).run()
        r = machines[COORDINATOR].result()
        opt = kz.opt(x, k, z)
        for t, radius in enumerate(r.grid):
            points, weights, count, discarded = kz.fetched(machines, config, radius)
            assert int(weights.sum()) + discarded == n
            pass2 = count <= config.count_bound and discarded <= config.outlier_budget
            if r.probed[t]:
                assert r.pass2[t] == pass2
            if radius < opt:
                continue
            checked += 1
            assert pass2
            assert solvers.kzc(_kernels.pairwise_distances(points), weights, k, config.outlier_budget - discarded,
                               5 * radius).ok
    assert checked > 50


def test_m_equals_one_and_one_point_per_machine(kz):
    """Oracle 18: m = 1 is a centralised (24(1+eps), 1+eps) algorithm; m = n still satisfies 11-14."""
    rng = np.random.default_rng(18)
    for n in (6, 9):
        x = rng.normal(size=(n, 2))
        for m in (1, n):
            parts = [np.arange(n)] if m == 1 else [np.array([i]) for i in range(n)]
            config = KzCenterConfig(k=2, z=2, eps=0.5, n_machines=m, d=2)
            results, _ = kz.run(x, parts, config)
            check_guarantees(kz, x, config, results, kz.opt(x, 2, 2))


@pytest.mark.parametrize("layout", ["outliers-on-one-machine", "cluster-per-machine", "clusters-split"])
def test_adversarial_partitions(kz, layout):
    """Oracle 19: the guarantees hold for adversarial splits."""
    x = kz.blobs(19, per_blob=30, blobs=3, outliers=12)
    n, z, m = x.shape[0], 12, 3
    cluster = np.repeat(np.arange(4), [30, 30, 30, 12])  # 3 blobs, then the outliers
    if layout == "outliers-on-one-machine":
        parts = [np.flatnonzero(cluster == 3), np.flatnonzero((cluster < 3) & (np.arange(n) % 2 == 0)),
                 np.flatnonzero((cluster < 3) & (np.arange(n) % 2 == 1))]
    elif layout == "cluster-per-machine":
        parts = [np.flatnonzero((cluster == i) | ((cluster == 3) & (i == 0))) for i in range(3)]
    else:
        parts = [np.arange(i, n, m) for i in range(m)]
    config = KzCenterConfig(k=3, z=z, eps=0.5, n_machines=m, d=2)
    results, _ = kz.run(x, parts, config)
    r = check_guarantees(kz, x, config, results)
    # a lower bound on OPT: the exact Charikar (1,3) radius is <= OPT
    central = solvers.smallest_cover_radius(_kernels.pairwise_distances(x), np.ones(n, np.int64), 3, z,
                                            grow=1.0, expand=3.0)
    assert r.radius <= 24 * (1 + config.eps) * central.radius
    # the blobs are found: every blob point is an inlier
    assert np.all(_kernels.nearest_centres(x[:90], r.centres)[0] <= r.radius)


def test_trivial_regime_returns_valid_points(kz):
    """Oracle 20: n <= (1+eps) z works without error, even when every point is discarded."""
    rng = np.random.default_rng(20)
    x = rng.normal(size=(10, 2))
    for search in ("linear", "binary"):
        config = KzCenterConfig(k=3, z=9, eps=0.5, n_machines=2, d=2, search=search)
        results, _ = kz.run(x, [np.arange(5), np.arange(5, 10)], config)
        r = check_guarantees(kz, x, config, results)
        assert 1 <= r.centres.shape[0] <= 3


# --- communication and rounds -------------------------------------------------------------------------


def test_round3_payload_is_bounded_independently_of_z(kz):
    """Oracle 14: at most floor(k m (1 + 1/eps)) representatives per fetched guess for every z; the
    words stay bounded as z grows."""
    x = kz.blobs(14, per_blob=40, blobs=4, outliers=40)
    rng = np.random.default_rng(14)
    parts = kz.parts(rng, x.shape[0], 3)
    for z in (0, 5, 10, 20, 40):
        config = KzCenterConfig(k=4, z=z, eps=0.5, n_machines=3, d=2, search="linear")
        results, report = kz.run(x, parts, config)
        r = check_guarantees(kz, x, config, results)
        fetched = sum(len(f) for f in r.fetches)
        for t in {t for f in r.fetches for t in f}:
            assert r.count_ok[t]  # sum_i |P'_i(L_t)| <= k m (1 + 1/eps)
        assert r.representatives <= fetched * config.max_reps
        by_phase = r.words_by_phase()
        m, d, k = 3, 2, 4
        assert by_phase["points"] <= fetched * (config.max_reps * (d + 1) + 2 * m)
        assert by_phase["fetch"] == fetched * m
        assert by_phase["counts"] == m * (2 * r.grid.shape[0] + 1) and by_phase["grid"] == m * r.grid.shape[0]
        assert by_phase["extent"] == m * (d + 3) and by_phase["centres"] == m * (k * d + 1)
        assert by_phase["outliers"] == m


def test_golden_rounds_words_and_bytes():
    """Oracle 15 and the golden cost of a tiny fixed run: 7 phases (extent, grid, counts, fetch,
    points, centres, outliers), only coordinator <-> machine links, words per phase by formula."""
    x = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [9.0, 9.0], [9.0, 8.0], [8.0, 9.0], [40.0, 40.0]])
    parts = [np.array([0, 1, 3, 6]), np.array([2, 4, 5])]
    config = KzCenterConfig(k=2, z=1, eps=1.0, n_machines=2, d=2, search="linear")
    machines = {COORDINATOR: KzCoordinator(COORDINATOR, config=config, machines=["machine-0", "machine-1"])}
    for i in range(2):
        machines[machine_name(i)] = KzMachine(machine_name(i), config=config, points=x[parts[i]])
    harness = Harness(machines, session=5)
    results = harness.run()
    report = harness.meter.report(protocol="kzcenter", transport="harness", session=5, parties=list(machines))
    r = results[COORDINATOR]
    t_len = r.grid.shape[0]
    assert r.fetches == ((r.guess_index,),) and r.rejected == ()
    assert report.communication_rounds == 7 and report.algorithm_rounds == 4 and report.messages == 14
    assert all(COORDINATOR in (link.sender, link.receiver) for link in report.links)
    phases = [(link.round_idx, link.phase) for link in report.links]
    assert sorted(set(phases)) == [(0, "extent"), (0, "grid"), (1, "counts"), (1, "fetch"), (2, "centres"),
                                   (2, "points"), (3, "outliers")]
    reps = r.representatives
    assert r.words == {
        (0, "extent"): 2 * (2 + 3),
        (0, "grid"): 2 * t_len,
        (1, "counts"): 2 * (2 * t_len + 1),
        (1, "fetch"): 2 * 1,
        (2, "points"): 2 * 2 + reps * 3,
        (2, "centres"): 2 * (2 * 2 + 1),
        (3, "outliers"): 2,
    }
    # bytes: each frame is its message's encoding; fixed-size phases checked against encode_frame
    by_phase = report.bytes_by_phase()
    counts = AggregatedCounts(n_points=4, counts=np.zeros(t_len, np.int64), discarded=np.zeros(t_len, np.int64))
    assert by_phase["counts"] == 2 * len(encode_frame(counts, session=5, round_idx=1, phase="counts"))
    assert r.radius > 0 and np.all(results["machine-0"].outliers == [False, False, False, True])
    assert results["machine-1"].outliers.sum() == 0 and r.outliers == 1


def test_retries_cost_two_phases_each_and_bounds_mode_has_five(kz):
    """Oracle 15: 5 phases with known radius bounds when the first fetch succeeds, +2 per retry; the
    multi-candidate variant trades words for rounds and finds the same guess (linear search)."""
    x = NON_MONOTONE_X
    outcomes = {}
    for batch in (1, 4, 0):
        config = KzCenterConfig(k=1, z=2, eps=0.1, n_machines=2, d=2, radius_bounds=(0.05, 20.0), batch=batch,
                                search="linear", count_test="paper")
        results, report = kz.run(x, NON_MONOTONE_PARTS, config)
        r = check_guarantees(kz, x, config, results, kz.opt(x, 1, 2))
        assert report.communication_rounds == 5 + 2 * (len(r.fetches) - 1)
        outcomes[batch] = (r.guess_index, len(r.fetches), r.total_words)
    assert outcomes[1][0] == outcomes[4][0] == outcomes[0][0]
    assert outcomes[1][1] > outcomes[4][1] > outcomes[0][1] == 1
    assert outcomes[1][2] < outcomes[4][2] < outcomes[0][2]


# --- the GAP fixes (oracle 21) -------------------------------------------------------------------------


def test_discarded_count_rejects_tiny_guesses(kz):
    """GAP 1: with the count test alone tiny L passes (nothing is aggregated); PASS2 rejects it
    through the discarded count, and the run ends at a sensible radius."""
    x = kz.blobs(21, per_blob=60, blobs=5, outliers=60)
    # y = 2: lone points are not aggregated
    config = KzCenterConfig(k=5, z=60, eps=0.5, n_machines=3, d=2, search="linear")
    results, _ = kz.run(x, kz.parts(np.random.default_rng(21), x.shape[0], 3), config)
    r = check_guarantees(kz, x, config, results)
    count_only = np.flatnonzero(r.count_ok)
    trap = [t for t in count_only if not r.discard_ok[t]]
    assert trap and min(trap) == count_only.min() and count_only.min() < r.guess_index
    assert not np.any(r.pass2[trap])
    assert r.grid[min(trap)] < 0.01 * r.guess
    assert np.all(_kernels.nearest_centres(x[:300], r.centres)[0] <= r.radius)


# instance 392 of a random search: PASS2 + kzc passes at guess 16, fails at 17 and 18, passes from 19
NON_MONOTONE_X = np.array(
    [[7, 5], [1, 0], [4, 6], [0, 1], [4, 4], [6, 5], [2, 5], [7, 5], [7, 2], [2, 5], [4, 7], [1, 1], [2, 3],
     [7, 4], [4, 6]], dtype=np.float64,
)
NON_MONOTONE_PARTS = [np.array([0, 1, 4, 5, 9, 10, 12, 14]), np.array([2, 3, 6, 7, 8, 11, 13])]


@pytest.mark.parametrize(("search", "batch"), [("binary", 1), ("binary", 2), ("probe", 1), ("probe", 3), ("probe", 0)])
def test_bisecting_searches_are_safe_on_a_non_monotone_predicate(kz, search, batch):
    """GAP 2: the full predicate is not monotone here (the paper's count test); the lo-fails/hi-passes
    searches (binary over fetches, probe over count probes) still end at a passing guess right above
    a failing one, at most the first grid value >= L*; binary with O(log T) fetches."""
    config = KzCenterConfig(k=1, z=2, eps=0.1, n_machines=2, d=2, radius_bounds=(0.05, 20.0),
                            search=search, batch=batch, count_test="paper")
    machines = kz.machines(NON_MONOTONE_X, NON_MONOTONE_PARTS, config)
    Harness(machines).run()
    r = machines[COORDINATOR].result()
    predicate = kz.predicate(machines, config, r.grid)
    first = predicate.index(True)
    assert not all(predicate[first:])  # really non-monotone
    opt = kz.opt(NON_MONOTONE_X, 1, 2)
    assert predicate[r.guess_index] and r.guess <= r.grid[r.grid >= opt].min()
    assert r.guess_index == 0 or not predicate[r.guess_index - 1]
    if search == "binary":
        assert len(r.fetches) <= math.ceil(math.log2(r.grid.shape[0])) + 2
    check_guarantees(kz, NON_MONOTONE_X, config, {COORDINATOR: r}, opt)


# --- bad input -----------------------------------------------------------------------------------------


def test_configuration_errors():
    good = dict(k=2, z=1, eps=0.5, n_machines=2, d=2)
    for change in ({"eps": 0.0}, {"eps": 1.5}, {"eps": -0.1}, {"k": 0}, {"z": -1}, {"n_machines": 0}, {"sub_machines": 0},
                   {"batch": -1}, {"search": "ternary"}, {"candidates": "few"}, {"radius_bounds": (0.0, 1.0)},
                   {"radius_bounds": (2.0, 1.0)}):
        with pytest.raises(ValueError):
            KzCenterConfig(**{**good, **change})
    with pytest.raises(TypeError):
        KzCenterConfig(**{**good, "k": 2.0})
    config = KzCenterConfig(**good)
    assert KzCenterConfig(k=20, z=256, eps=0.1, n_machines=5, d=3).max_reps == 20 * 5 * 11
    split = KzCenterConfig(k=20, z=256, eps=0.1, n_machines=5, d=3, sub_machines=4)
    assert split.virtual_machines == 20 and split.max_reps == 20 * 20 * 11
    assert split.threshold == 0.1 * 256 / (20 * 20)
    with pytest.raises(ValueError, match="shape"):
        KzMachine("machine-0", config=config, points=np.zeros((3, 3)))
    with pytest.raises(ValueError, match="NaN"):
        KzMachine("machine-0", config=config, points=np.full((3, 2), np.nan))
    with pytest.raises(ValueError):
        KzCoordinator(COORDINATOR, config=config, machines=["machine-0"])
    with pytest.raises(ValueError):
        KzCoordinator(COORDINATOR, config=config, machines=["machine-0", "machine-0"])


@pytest.mark.parametrize(("k", "z", "match"), [(2, 7, "z = 7"), (8, 0, "k = 8"), (2, 9, "z = 9")])
def test_k_or_z_too_large_is_a_clear_error(kz, k, z, match):
    x = np.arange(7, dtype=np.float64)[:, None]
    config = KzCenterConfig(k=k, z=z, eps=0.5, n_machines=2, d=1)
    machines = kz.machines(x, [np.arange(3), np.arange(3, 7)], config)
    with pytest.raises(ValueError, match=match):
        Harness(machines).run()
    assert machines[COORDINATOR].failed


def test_machines_without_points_and_duplicate_points(kz):
    rng = np.random.default_rng(6)
    x = np.concatenate([np.repeat([[0.0, 0.0]], 6, axis=0), np.repeat([[5.0, 5.0]], 5, axis=0), [[30.0, 30.0]]])
    perm = rng.permutation(x.shape[0])
    parts = [perm[:6], np.zeros(0, dtype=np.int64), perm[6:], np.zeros(0, dtype=np.int64)]
    config = KzCenterConfig(k=2, z=1, eps=0.5, n_machines=4, d=2)
    results, _ = kz.run(x, parts, config)
    r = check_guarantees(kz, x, config, results, opt=0.0)
    assert r.radius == 0 and r.outliers == 1 and results["machine-1"].outliers.shape == (0,)
    # every point identical: one location, radius 0, no outliers
    same = np.ones((8, 3))
    config = KzCenterConfig(k=3, z=2, eps=1.0, n_machines=2, d=3)
    results, _ = kz.run(same, [np.arange(4), np.arange(4, 8)], config)
    r = check_guarantees(kz, same, config, results, opt=0.0)
    assert r.grid.tolist() == [0.0] and r.outliers == 0 and r.centres.shape == (1, 3)


def refused(machines, tamper, match):
    """Run ``machines`` in the harness with ``tamper`` on every frame; the RemoteProtocolError
    matching ``match`` that ends the run."""
    with pytest.raises(RemoteProtocolError, match=match) as info:
        Harness(machines, tamper=tamper).run()
    return info.value


def test_inconsistent_or_stray_messages_are_rejected(kz):
    x = kz.blobs(3, per_blob=10, blobs=2, outliers=2)
    config = KzCenterConfig(k=2, z=2, eps=0.5, n_machines=2, d=2, search="linear")
    parts = [np.arange(0, 22, 2), np.arange(1, 22, 2)]

    def shrink(frame):  # machine-1 claims fewer points than it has
        _, message = decode_frame(frame.data)
        if isinstance(message, AggregatedCounts) and frame.sender == "machine-1":
            forged = AggregatedCounts(n_points=message.n_points + 1, counts=message.counts,
                                      discarded=message.discarded)
            return encode_frame(forged, session=0, round_idx=1, phase="counts")
        return frame.data

    assert refused(kz.machines(x, parts, config), shrink, "reported 11 points, now 12").party == "machine-1"

    def heavier(frame):  # machine-1 inflates a weight: weights + discarded no longer sum to n_i
        _, message = decode_frame(frame.data)
        if isinstance(message, WeightedPoints) and frame.sender == "machine-1" and message.weights.size:
            weights = message.weights.copy()
            weights[0] += 1
            forged = WeightedPoints(indices=message.indices, sizes=message.sizes, points=message.points,
                                    weights=weights)
            return encode_frame(forged, session=0, round_idx=2, phase="points")
        return frame.data

    assert refused(kz.machines(x, parts, config), heavier, "does not match its counts").party == "machine-1"

    def wrong_guess(frame):
        _, message = decode_frame(frame.data)
        if isinstance(message, WeightedPoints) and frame.sender == "machine-0":
            forged = WeightedPoints(indices=message.indices + 1, sizes=message.sizes, points=message.points,
                                    weights=message.weights)
            return encode_frame(forged, session=0, round_idx=2, phase="points")
        return frame.data

    machines = kz.machines(x, parts, config)
    refused(machines, wrong_guess, "requested")

    coordinator = KzCoordinator(COORDINATOR, config=config, machines=["machine-0", "machine-1"])
    coordinator.start()
    with pytest.raises(RemoteProtocolError, match="not a machine"):
        coordinator.receive("mallory", machines["machine-0"]._extent())
    with pytest.raises(LocalProtocolError):
        coordinator.receive("machine-0", machines["machine-0"]._extent())


# --- runtime ------------------------------------------------------------------------------------------


async def test_memory_transport_run_equals_harness_run(kz):
    """Oracle 17 (memory part): same centres, radius and byte counts as the harness."""
    x = kz.blobs(17, per_blob=15, blobs=3, outliers=5)
    parts = kz.parts(np.random.default_rng(17), x.shape[0], 3)
    config = KzCenterConfig(k=3, z=5, eps=0.5, n_machines=3, d=2, search="binary", batch=2)
    expected, report = kz.run(x, parts, config, session=9)
    machines = kz.machines(x, parts, config)
    meter = Meter(trio.current_time)
    results = await run_parties(machines, MemoryNetwork(list(machines)),
                                config=RuntimeConfig(session=9), meter=meter)
    np.testing.assert_array_equal(results[COORDINATOR].centres, expected[COORDINATOR].centres)
    assert results[COORDINATOR].radius == expected[COORDINATOR].radius
    ours = meter.report(protocol="kzcenter", transport="memory", session=9, parties=list(machines))
    assert ours.links == report.links


async def test_silent_machine_makes_the_coordinator_fail_naming_it(kz, autojump_clock):
    x = kz.blobs(4, per_blob=10, blobs=2, outliers=2)
    config = KzCenterConfig(k=2, z=2, eps=0.5, n_machines=3, d=2)
    machines = kz.machines(x, [np.arange(0, 22, 3), np.arange(1, 22, 3), np.arange(2, 22, 3)], config)
    network = MemoryNetwork(list(machines))
    del machines["machine-2"]
    with pytest.raises(InsufficientParticipants) as info:
        await run_parties(machines, network, config=RuntimeConfig(session=0, deadline_s=10))
    assert info.value.missing == ("machine-2",)

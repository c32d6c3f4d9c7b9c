"""The default ``probe`` search of distributed (k,z)-center (issue 15): certified radius against brute
force, words equal to the stated formula on the wire, lazy machines, the tight count test, GAP 2
handling, inconsistent messages, and the coordinator's polishing."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np
import pytest
import trio

import fedproto.algorithms  # noqa: F401
from fedproto.algorithms.kzclustering import _kernels, solvers, solvers_aggregation
from fedproto.algorithms.kzclustering import polish as polish_module
from fedproto.algorithms.kzclustering.config import KzCenterConfig
from fedproto.algorithms.kzclustering.data import synthetic_dataset
from fedproto.algorithms.kzclustering.messages import (
    ProbeCounts,
    RadiusFetch,
    RadiusGrid,
    RadiusProbes,
    Representatives,
    message_words,
)
from fedproto.algorithms.kzclustering.polish import polish_centres, trimmed_radius
from fedproto.algorithms.kzclustering.protocol import COORDINATOR, KzMachine, machine_name
from fedproto.codec import decode_frame, encode_frame
from fedproto.data import partition
from fedproto.errors import RemoteProtocolError
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.testing.harness import Harness
from fedproto.transports.memory import MemoryNetwork


def wire_words(kz, x, parts, config, *, session=0):
    """Run through the harness, counting words from the frames themselves, per phase."""
    words: dict[str, int] = defaultdict(int)

    def count(frame):
        envelope, message = decode_frame(frame.data)
        words[envelope.phase] += message_words(message)
        return frame.data

    machines = kz.machines(x, parts, config)
    harness = Harness(machines, session=session, tamper=count)
    results = harness.run()
    report = harness.meter.report(protocol="kzcenter", transport="harness", session=session, parties=list(machines))
    return results, report, dict(words)


# --- the tight count test ------------------------------------------------------------------------------


def test_count_bound_keeps_the_lemmas_integer_rounding():
    """``tight``: k m + floor(z / (floor(y) + 1)), capped by the paper's k m (1 + 1/eps); discarded
    counts travel only from y = 1 on."""
    for z, eps, k, m in [(0, 0.1, 10, 5), (400, 0.1, 10, 5), (500, 0.1, 10, 5), (1234, 0.1, 10, 5), (30, 1.0, 2, 3),
                         (7, 0.5, 1, 1), (10_000, 0.1, 10, 5)]:
        config = KzCenterConfig(k=k, z=z, eps=eps, n_machines=m, d=2)
        y = eps * z / (k * m)
        assert config.count_bound == min(config.max_reps, k * m + z // (math.floor(y) + 1))
        assert config.count_bound <= config.max_reps
        assert config.sends_discarded == (y >= 1)
        assert KzCenterConfig(k=k, z=z, eps=eps, n_machines=m, d=2, count_test="paper").count_bound == config.max_reps
    assert KzCenterConfig(k=10, z=0, eps=0.1, n_machines=5, d=2).count_bound == 50  # k per machine
    assert KzCenterConfig(k=10, z=400, eps=0.1, n_machines=5, d=2).count_bound == 450  # y = 0.8: one outlier each
    assert KzCenterConfig(k=10, z=1000, eps=0.1, n_machines=5, d=2).count_bound == 50 + 333  # y = 2: three each
    with pytest.raises(ValueError, match="count_test"):
        KzCenterConfig(k=1, z=0, eps=0.5, n_machines=1, d=1, count_test="loose")
    with pytest.raises(TypeError, match="polish"):
        KzCenterConfig(k=1, z=0, eps=0.5, n_machines=1, d=1, polish=1)


# --- guarantees against brute force -----------------------------------------------------------------------


def test_probe_search_certifies_its_radius_against_brute_force(kz):
    """On random tiny instances: at most (1+eps)z points beyond L_out, L_out <= 24(1+eps) OPT, the
    ((1+eps)z-removed) radius of the centres at most L_out, every guess that failed a probe or kzc is below
    L*, and the accepted guess is at most the first grid value >= L*."""
    rng = np.random.default_rng(315)
    for trial in range(40):
        instance = kz.tiny(rng, trial)
        if instance is None:
            continue
        n, k, z, m, eps, x = instance
        bounds = (0.05, 40.0) if trial % 5 == 4 else None
        config = KzCenterConfig(k=k, z=z, eps=eps, n_machines=m, d=2, batch=int(rng.integers(0, 3)),
                                radius_bounds=bounds)
        results, _ = kz.run(x, kz.parts(rng, n, m), config)
        r = results[COORDINATOR]
        opt = kz.opt(x, k, z)
        dist, _ = _kernels.nearest_centres(x, r.centres)
        assert int(np.sum(dist > r.radius)) == r.outliers <= (1 + eps) * z + 1e-9
        if bounds is None:
            assert r.radius <= 24 * (1 + eps) * opt * (1 + 1e-12) if opt > 0 else r.radius == 0
        else:  # the first grid value >= L* is at least A
            assert r.radius <= 24 * (1 + eps) * max(opt, bounds[0]) * (1 + 1e-12)
        assert solvers.center_cost(dist, math.floor((1 + eps) * z + 1e-9)) <= r.radius
        bottom = bounds is None
        certified = set(r.rejected) | set(np.flatnonzero(r.probed & ~r.pass2).tolist())
        for t in certified:
            if bottom and t == 0:  # the bottom guess stands for [0, grid[1])
                assert r.grid.shape[0] == 1 or opt >= r.grid[1]
            else:
                assert r.grid[t] < opt
        if not (bottom and r.guess_index == 0) and opt <= r.grid[-1]:
            assert r.guess <= r.grid[r.grid >= opt].min()
        assert r.guess_index == 0 or r.guess_index - 1 in certified  # lo follows hi


def test_probe_search_recovers_from_kzc_rejections(kz):
    """GAP 2 in the probe search: kzc rejects the guess the count bisection ends at; the search goes
    on over the full predicate and ends at its first passing guess, right above a rejected one,
    with O(log T) fetches (not one per rejected guess)."""
    x = np.array([[4, 6], [2, 7], [2, 4], [7, 6], [4, 6], [3, 4], [6, 7], [3, 2]], dtype=np.float64)
    parts = [np.array([0, 1, 3, 4]), np.array([2, 5, 6, 7])]
    config = KzCenterConfig(k=2, z=3, eps=0.1, n_machines=2, d=2, radius_bounds=(0.05, 20.0))
    machines = kz.machines(x, parts, config)
    Harness(machines).run()
    r = machines[COORDINATOR].result()
    predicate = kz.predicate(machines, config, r.grid)
    first = predicate.index(True)
    assert first > 8 and all(r.pass2[t] for t in r.rejected)  # PASS2 let 9 guesses through
    assert r.guess_index == first and r.guess_index - 1 in r.rejected
    opt = kz.opt(x, 2, 3)
    assert r.guess <= r.grid[r.grid >= opt].min() and all(r.grid[t] < opt for t in r.rejected)
    assert len(r.fetches) <= math.ceil(math.log2(r.grid.shape[0])) + 2 < first


# --- words and rounds -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("bounds", "batch"), [(None, 1), (None, 2), ((0.05, 400.0), 1)])
def test_words_on_the_wire_equal_the_formula(kz, bounds, batch):
    """Per phase, the words decoded from the frames equal the module's formula: extent m(d+3),
    probe m P, counts m P (1 + [y >= 1]), fetch m F, points (d+1) R, centres m(kd+1), outliers m;
    the coordinator's own count agrees; with one fetch P <= ceil(log2 T) + 1 rounds' worth."""
    x = kz.blobs(15, per_blob=25, blobs=4, outliers=30)
    n, m, k, d = x.shape[0], 3, 2, 2
    parts = kz.parts(np.random.default_rng(15), n, m)
    seen_discarded = set()
    for z in (0, 4, 20, 30):
        config = KzCenterConfig(k=k, z=z, eps=0.5, n_machines=m, d=d, radius_bounds=bounds, batch=batch)
        results, report, words = wire_words(kz, x, parts, config)
        r = results[COORDINATOR]
        probes = sum(len(p) for p in r.probe_rounds)
        fetches = len(r.fetches)
        seen_discarded.add(config.sends_discarded)
        expected = {
            "probe": m * probes,
            "counts": m * probes * (2 if config.sends_discarded else 1),
            "fetch": m * fetches,
            "points": (d + 1) * r.representatives,
            "centres": m * (k * d + 1),
            "outliers": m,
        }
        if bounds is None:
            expected["extent"] = m * (d + 3)
        assert words == expected
        assert r.words_by_phase() == expected
        assert r.total_words == sum(expected.values())
        assert all(len(p) <= batch for p in r.probe_rounds)
        assert report.communication_rounds == (bounds is None) + 2 * len(r.probe_rounds) + 2 * fetches + 2
        assert all(COORDINATOR in (link.sender, link.receiver) for link in report.links)
        if not r.rejected:
            assert fetches == 1 and r.representatives <= config.count_bound
            if batch == 1:
                assert probes <= math.ceil(math.log2(r.grid.shape[0])) + 1
    assert seen_discarded == {False, True}


def test_words_at_z_zero_are_not_the_largest_on_the_mixture(kz):
    """Issue 15: on the spec's mixture (smaller here), the default's words at z = 0 are below its
    words at larger z, where the paper's count test with a linear search made z = 0 the most
    expensive case by far."""
    data = synthetic_dataset(600, 5, 5, 60, seed=0)
    x = data.x
    parts = partition(x.shape[0], 5, seed=0)

    def sweep(**options):
        words = []
        for z in (0, 15, 30, 60):
            config = KzCenterConfig(k=5, z=z, eps=0.1, n_machines=5, d=5, **options)
            results, _ = kz.run(x, parts, config)
            words.append(results[COORDINATOR].total_words)
        return words

    ours = sweep()
    assert ours[0] < max(ours) and ours[0] == min(ours)
    before = sweep(search="linear", count_test="paper", polish=False)
    assert before[0] == max(before) and before[0] > 10 * ours[0]


def test_golden_probe_run(kz):
    """A tiny fixed run: the extent, one probe per round, one fetch, the answer; words per round
    and phase by formula."""
    x = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [9.0, 9.0], [9.0, 8.0], [8.0, 9.0], [40.0, 40.0]])
    parts = [np.array([0, 1, 3, 6]), np.array([2, 4, 5])]
    config = KzCenterConfig(k=2, z=1, eps=1.0, n_machines=2, d=2)
    results, report = kz.run(x, parts, config, session=5)
    r = results[COORDINATOR]
    rounds = len(r.probe_rounds)
    assert r.fetches == ((r.guess_index,),) and r.rejected == () and all(len(p) == 1 for p in r.probe_rounds)
    assert report.communication_rounds == 1 + 2 * rounds + 4 and report.messages == 2 * report.communication_rounds
    expected = {(0, "extent"): 2 * 5}
    for j in range(rounds):
        expected[(j, "probe")] = 2
        expected[(j + 1, "counts")] = 2  # y = 0.5: no discarded counts
    expected[(rounds, "fetch")] = 2
    expected[(rounds + 1, "points")] = 3 * r.representatives
    expected[(rounds + 1, "centres")] = 2 * (2 * 2 + 1)
    expected[(rounds + 2, "outliers")] = 2
    assert r.words == expected
    assert r.radius > 0 and r.outliers == 1 and results["machine-0"].outliers.tolist() == [False, False, False, True]


# --- lazy machines --------------------------------------------------------------------------------------


def test_machines_aggregate_only_at_the_radii_asked(kz, monkeypatch):
    """Each machine aggregates once per radius the coordinator asks about, never for the whole
    grid; the grid searches ask about every guess."""
    calls = []
    original = solvers.aggregate

    def counting(dist, radius, *args, **kwargs):
        calls.append(dist.shape[0])
        return original(dist, radius, *args, **kwargs)

    monkeypatch.setattr(solvers_aggregation, "aggregate", counting)
    x = kz.blobs(16, per_blob=30, blobs=4, outliers=20)
    parts = kz.parts(np.random.default_rng(16), x.shape[0], 3)
    config = KzCenterConfig(k=4, z=20, eps=0.5, n_machines=3, d=2)
    machines = kz.machines(x, parts, config)
    Harness(machines).run()
    r = machines[COORDINATOR].result()
    probes = sum(len(p) for p in r.probe_rounds)
    assert probes < r.grid.shape[0] / 3
    for i in range(3):
        machine = machines[machine_name(i)]
        assert len(machine.aggregations()) == probes
    assert len(calls) <= 3 * probes
    calls.clear()
    grid_config = KzCenterConfig(k=4, z=20, eps=0.5, n_machines=3, d=2, search="linear")
    machines = kz.machines(x, parts, grid_config)
    Harness(machines).run()
    assert len(machines[machine_name(0)].aggregations()) == machines[COORDINATOR].result().grid.shape[0]


# --- inconsistent messages ----------------------------------------------------------------------------


def test_inconsistent_probe_messages_are_rejected(kz):
    x = kz.blobs(3, per_blob=10, blobs=2, outliers=2)
    config = KzCenterConfig(k=2, z=2, eps=0.5, n_machines=2, d=2)
    parts = [np.arange(0, 22, 2), np.arange(1, 22, 2)]

    def forge(kind, change):
        def tamper(frame):
            envelope, message = decode_frame(frame.data)
            if isinstance(message, kind) and frame.sender == "machine-1":
                return encode_frame(change(message), session=0, round_idx=envelope.round_idx, phase=envelope.phase)
            return frame.data

        return tamper

    cases = [
        (ProbeCounts, lambda msg: ProbeCounts(counts=np.append(msg.counts, 1), discarded=msg.discarded),
         "counts for"),
        (Representatives, lambda msg: Representatives(points=msg.points, weights=msg.weights + 1),
         "does not match its counts"),
        (Representatives, lambda msg: Representatives(points=msg.points[1:], weights=msg.weights[1:]),
         "does not match its counts"),
    ]
    for kind, change, match in cases:
        machines = kz.machines(x, parts, config)
        with pytest.raises(RemoteProtocolError, match=match) as info:
            Harness(machines, tamper=forge(kind, change)).run()
        assert info.value.party == "machine-1"

    machine = KzMachine("machine-0", config=config, points=x[parts[0]])
    machine.start()
    with pytest.raises(RemoteProtocolError, match="does not belong"):
        machine.receive(COORDINATOR, RadiusGrid(radii=np.array([0.0, 1.0])))
    machine = KzMachine("machine-0", config=config, points=x[parts[0]])
    machine.start()
    machine.receive(COORDINATOR, RadiusProbes(radii=np.array([1.0])))
    with pytest.raises(RemoteProtocolError, match="never probed"):
        machine.receive(COORDINATOR, RadiusFetch(radius=2.0))


# --- runtime --------------------------------------------------------------------------------------------


async def test_probe_search_over_the_memory_transport_equals_the_harness(kz):
    x = kz.blobs(17, per_blob=15, blobs=3, outliers=5)
    parts = kz.parts(np.random.default_rng(17), x.shape[0], 3)
    config = KzCenterConfig(k=3, z=5, eps=0.5, n_machines=3, d=2, batch=2)
    expected, report = kz.run(x, parts, config, session=9)
    machines = kz.machines(x, parts, config)
    meter = Meter(trio.current_time)
    results = await run_parties(machines, MemoryNetwork(list(machines)), config=RuntimeConfig(session=9), meter=meter)
    np.testing.assert_array_equal(results[COORDINATOR].centres, expected[COORDINATOR].centres)
    assert results[COORDINATOR].radius == expected[COORDINATOR].radius
    assert meter.report(protocol="kzcenter", transport="memory", session=9, parties=list(machines)).links == report.links


# --- polishing ------------------------------------------------------------------------------------------


def test_trimmed_radius_matches_its_definition():
    rng = np.random.default_rng(3)
    for _ in range(50):
        rows = int(rng.integers(1, 9))
        dist = rng.integers(0, 5, size=(rows, 4)).astype(np.float64)
        weights = rng.integers(1, 4, size=rows).astype(np.float64)
        budget = float(rng.integers(0, 6))
        got = trimmed_radius(dist, weights, budget)
        for c in range(4):
            feasible = [r for r in [0.0, *dist[:, c]] if weights[dist[:, c] > r].sum() <= budget]
            assert got[c] == min(feasible)


def test_polishing_keeps_the_certificate_and_improves_the_estimate():
    """Against brute force over every k-subset: the result never has a larger estimate than the
    start, never a certificate above the limit, and a single bad start is repaired."""
    rng = np.random.default_rng(4)
    for trial in range(30):
        r_count = int(rng.integers(5, 10))
        pts = rng.normal(size=(r_count, 2)) * 5
        dist = _kernels.pairwise_distances(pts)
        weights = rng.integers(1, 6, size=r_count).astype(np.float64)
        k = int(rng.integers(1, 4))
        budget = float(rng.integers(0, 4))
        start = rng.choice(r_count, size=k, replace=False)
        move = float(rng.uniform(0, 2))

        def cert(centres):
            return move + trimmed_radius(dist[:, list(centres)].min(axis=1)[:, None], weights, budget + 1)[0]

        def est(centres):
            return trimmed_radius(dist[:, list(centres)].min(axis=1)[:, None], weights, budget)[0]

        limit = cert(start) * (1 + trial % 3 * 0.2)
        result = polish_centres(dist, weights, start, budget=budget, cert_budget=budget + 1, move=move, limit=limit)
        assert result.certificate == pytest.approx(cert(result.centres)) and result.certificate <= limit * (1 + 1e-12)
        assert result.estimate == pytest.approx(est(result.centres)) and result.estimate <= est(start)
        assert result.improved == (result.estimate < est(start))
        best = min(est(c) for c in itertools.combinations(range(r_count), k) if cert(c) <= limit)
        assert best <= result.estimate
    # two tight pairs and one far point, k = 2: starting on the pair {0, 1} is repaired by one swap
    pts = np.array([[0.0, 0.0], [0.1, 0.0], [10.0, 0.0], [10.1, 0.0], [50.0, 0.0]])
    dist = _kernels.pairwise_distances(pts)
    ones = np.ones(5)
    result = polish_centres(dist, ones, np.array([0, 1]), budget=1.0, cert_budget=1.0, move=0.0, limit=100.0)
    assert result.improved and sorted(result.centres.tolist()) in ([0, 2], [0, 3], [1, 2], [1, 3])
    assert result.estimate == pytest.approx(0.1)
    # with 4 candidates: {0, 1} (the start), then farthest first 4 and 3; a swap for 3 repairs it
    result = polish_centres(dist, ones, np.array([0, 1]), budget=1.0, cert_budget=1.0, move=0.0, limit=100.0,
                            max_candidates=4)
    assert result.improved and sorted(result.centres.tolist()) in ([0, 3], [1, 3])
    # with 3 candidates (0, 1, 4) the best reachable set is {1, 4}: 3 is the outlier, 2 is 9.9 away
    result = polish_centres(dist, ones, np.array([0, 1]), budget=1.0, cert_budget=1.0, move=0.0, limit=100.0,
                            max_candidates=3)
    assert sorted(result.centres.tolist()) == [1, 4] and result.estimate == pytest.approx(9.9)
    with pytest.raises(ValueError, match="max_candidates"):
        polish_centres(dist, ones, np.array([0, 1]), budget=1.0, cert_budget=1.0, move=0.0, limit=100.0,
                       max_candidates=0)


def test_polishing_with_few_candidates_keeps_its_promises():
    """Many representatives, a candidate cap: the certificate stays within the limit, the estimate
    never grows, and every centre swapped in is among the farthest-first candidates."""
    rng = np.random.default_rng(9)
    for trial in range(6):
        pts = np.concatenate([rng.normal(size=(120, 2)) + rng.uniform(-30, 30, size=(1, 2)) for _ in range(5)])
        dist = _kernels.pairwise_distances(pts)
        weights = rng.integers(1, 4, size=pts.shape[0]).astype(np.float64)
        start = rng.choice(pts.shape[0], size=5, replace=False)
        budget = float(rng.integers(0, 20))

        def measure(centres, b):
            return trimmed_radius(dist[:, list(centres)].min(axis=1)[:, None], weights, b)[0]

        limit = measure(start, budget + 5) * 1.1
        result = polish_centres(dist, weights, start, budget=budget, cert_budget=budget + 5, move=0.0,
                                limit=limit, max_candidates=40)
        assert result.certificate <= limit and result.estimate <= measure(start, budget)
        assert result.estimate == pytest.approx(measure(result.centres, budget))
        candidates = set(np.asarray(polish_module._farthest_first(dist, int(start[0]), 40, given=start)).tolist())
        assert set(result.centres.tolist()) <= candidates

"""Federated Q-k-means (spec deletion-kmeans.md 2.3): a coordinator and parties holding the data.

Federated training equals centralised Q-k-means exactly (seeds, phases, lattice indices, stop
decisions; the stored sums up to summation order); after any deletion stream the model equals a
from-scratch run on the remaining data with the same key (O-Q-1 through the wire); the bytes of
every round equal the analytic formula plus a constant envelope per message (golden cost test);
illegal messages fail with clear errors. Data sets have 550-576 points in 3-D (or 60 in 2-D) so
that the kernels compile for few shapes.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import trio

from fedproto.algorithms.deletion.federated import COORDINATOR, QKMeansCoordinator, training_payload_bytes
from fedproto.algorithms.deletion.messages import (
    ClusterStatistics,
    IterationCentroids,
    ModelUpdate,
    PointRemoval,
    SeedPick,
    SeedPoint,
    SeedScore,
    SeedStep,
)
from fedproto.algorithms.deletion.protocol import QKMeansParties
from fedproto.algorithms.deletion.qkmeans import QKMeans, QKMeansConfig, removal_decision, train_qkmeans
from fedproto.codec import array_payload_bytes, decode_frame, encode_frame
from fedproto.errors import DecodeError, InsufficientParticipants, LocalProtocolError, RemoteProtocolError
from fedproto.messages import PhaseTimedOut
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.testing.harness import Harness
from fedproto.transports.memory import MemoryNetwork

SESSION = 9


def run_harness(federation):
    harness = Harness(federation.machines(), session=SESSION)
    results = harness.run()
    report = harness.meter.report(protocol="qkmeans", transport="harness", session=SESSION,
                                  parties=federation.roster)
    return results, report


def split(n: int, n_parties: int, seed: int = 0, empty: bool = False) -> list[np.ndarray]:
    """Uneven random split of ``range(n)``; with ``empty`` the last party holds nothing."""
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, n), size=n_parties - 1 - empty, replace=False))
    parts = np.split(rng.permutation(n), cuts)
    return [np.sort(p) for p in parts] + ([np.zeros(0, dtype=np.int64)] if empty else [])


def federation(x, ids, parts, config, seed, deletions=()):
    return QKMeansParties([(x[p], ids[p]) for p in parts], config, federated=True, key=jax.random.PRNGKey(seed),
                          deletions=deletions)


def assert_same_model(fed, central) -> None:
    """Exact equality of everything that defines the output; sums and losses up to order."""
    e = central.executed
    assert fed.executed == e and fed.n == central.n and fed.eps == central.eps
    np.testing.assert_array_equal(fed.seed_ids, central.seed_ids)
    np.testing.assert_array_equal(fed.seed_centroids, central.seed_centroids)
    np.testing.assert_array_equal(fed.thetas, central.thetas)
    np.testing.assert_array_equal(fed.accepted, central.accepted)
    np.testing.assert_array_equal(fed.indices, central.indices)
    np.testing.assert_array_equal(fed.counts, central.counts)
    np.testing.assert_allclose(fed.sums, central.sums, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(fed.losses, central.losses, rtol=1e-12, atol=0)
    assert fed.mass_threshold == central.mass_threshold
    np.testing.assert_array_equal(fed.centroids, central.centroids)


@pytest.mark.parametrize(
    ("eps", "gamma", "n_parties", "empty"),
    [(1 / 64, 0.2, 3, False), (1 / 256, 0.5, 4, True), (None, 0.0, 1, False), (1 / 16, 0.2, 5, False)],
)
def test_federated_training_equals_centralised_qkmeans(mixture, eps, gamma, n_parties, empty):
    x = mixture(60, (30, 180, 180, 180), sd=0.08)
    ids = np.arange(len(x)) * 5 + 3
    config = QKMeansConfig(k=4, eps=eps, gamma=gamma)
    fed = federation(x, ids, split(len(x), n_parties, seed=n_parties, empty=empty), config, seed=n_parties)
    results, _ = run_harness(fed)
    coordinator = results[COORDINATOR]
    central = train_qkmeans(x, ids, config, jax.random.PRNGKey(n_parties))
    assert_same_model(coordinator.model, central)
    assert coordinator.trainings == 1 and coordinator.history[0] is not None
    for party in fed.clients:
        np.testing.assert_array_equal(results[party].centroids, central.centroids)


def test_rounds_and_messages_of_one_training(mixture):
    """k seeding rounds (two exchanges each), executed + 1 Lloyd rounds, the model in the last."""
    x = mixture(61, (45, 175, 175, 175), sd=0.06)
    ids = np.arange(len(x))
    config = QKMeansConfig(k=4, eps=1 / 32)
    fed = federation(x, ids, split(len(x), 3), config, seed=1)
    results, report = run_harness(fed)
    executed = results[COORDINATOR].model.executed
    assert report.algorithm_rounds == 4 + executed + 1
    for r in range(4):
        phases = {(link.phase, link.tag) for link in report.links if link.round_idx == r}
        assert phases == {("seed", "del.qseed"), ("seed", "del.qscore"), ("seed-point", "del.qpick"),
                          ("seed-point", "del.qpoint")}
        assert sum(link.messages for link in report.links if link.round_idx == r) == 3 + 3 + 1 + 1
    last = 4 + executed
    assert {link.tag for link in report.links if link.round_idx == last} == {"del.qcent", "del.qstats", "del.model"}
    assert report.communication_rounds == 4 * 2 + (executed + 1) + 1


@pytest.mark.parametrize("eps", [1 / 32, 1 / 512])
def test_deletion_equals_retraining_after_every_request(mixture, eps):
    """O-Q-1 through the wire: certified and retrained deletions (seeds included) leave the model
    of a from-scratch centralised run on the remaining data with the same key, and the
    coordinator takes the centralised algorithm's decision every time."""
    x = mixture(62, (45, 175, 175, 175), sd=0.06)
    ids = np.arange(len(x)) + 100
    config = QKMeansConfig(k=4, eps=eps)
    key = jax.random.PRNGKey(7)
    seeds = train_qkmeans(x, ids, config, key).seed_ids
    rng = np.random.default_rng(8)
    others = [int(i) for i in rng.permutation(ids) if i not in seeds]
    stream = [others[0], int(seeds[0]), *others[1:5], int(seeds[2]), *others[5:9]]
    fed = federation(x, ids, split(len(x), 3, seed=2), config, seed=7, deletions=stream)
    results, report = run_harness(fed)
    coordinator = results[COORDINATOR]
    central = QKMeans(config, key=key).fit(x, ids)
    reasons = []
    for j, point_id in enumerate(stream, start=1):
        reasons.append(central.delete(point_id).reason)
        np.testing.assert_array_equal(coordinator.history[j], central.centroids)
    assert list(coordinator.reasons) == reasons
    assert coordinator.retrained >= 2 and coordinator.certified + coordinator.retrained == len(stream)
    if eps == 1 / 32:
        assert coordinator.certified >= 5  # a coarse lattice certifies most non-seed deletions
    assert coordinator.trainings == 1 + coordinator.retrained
    keep = ~np.isin(ids, stream)
    assert_same_model(coordinator.model, train_qkmeans(x[keep], ids[keep], config, key))
    # A from-scratch federated run on the remaining data gives the same model.
    fresh, _ = run_harness(federation(x[keep], ids[keep], split(int(keep.sum()), 2, seed=3), config, seed=7))
    np.testing.assert_array_equal(fresh[COORDINATOR].centroids, coordinator.centroids)
    for party in fed.clients:
        assert results[party].retrained == tuple(r != "certified" for r in reasons)
        assert set(results[party].removed) == {i for i in stream if fed.owners[i] == party}
    assert sum(results[p].points for p in fed.clients) == len(x) - len(stream)


def frame(message, round_idx: int, phase: str) -> int:
    return len(encode_frame(message, session=SESSION, round_idx=round_idx, phase=phase))


def test_bytes_per_round_match_the_analytic_formula(mixture):
    """Golden cost test. Payload (array bytes): seeding step s sends P 8d [s > 0] down, 8d for
    the chosen point; a Lloyd round P 8kd down and P 8(kd + k) up; the model P 8kd; a certified
    deletion 8d up. Every frame adds an envelope that depends only on its type (ids, rounds and
    steps stay below 128, so every integer is one msgpack byte)."""
    x = mixture(63, (15, 15, 15, 15), d=2)
    ids = np.arange(60)
    k, d, n_parties = 3, 2, 3
    config = QKMeansConfig(k=k, eps=1 / 16, iterations=4)
    key = jax.random.PRNGKey(4)
    first = train_qkmeans(x, ids, config, key)
    victim = next(int(i) for i in ids if removal_decision(first, x[i], int(i), config)[0] == "certified")
    stream = [victim, int(first.seed_ids[1])]  # a certified deletion, then a seed (a retrain)
    fed = federation(x, ids, split(60, n_parties, seed=5), config, seed=4, deletions=stream)
    results, report = run_harness(fed)
    coordinator = results[COORDINATOR]
    assert coordinator.reasons == ("certified", "seed")
    second = train_qkmeans(x[~np.isin(ids, stream)], ids[~np.isin(ids, stream)], config, key)

    # The envelope of each message type, and its array bytes.
    z, p = np.zeros, n_parties
    msgs = {
        "step0": SeedStep(step=0, centre=z((0, d))), "step": SeedStep(step=1, centre=z((1, d))),
        "score": SeedScore(step=1, point_id=5, score=-1.5), "pick": SeedPick(step=1, point_id=5),
        "point": SeedPoint(step=1, point_id=5, point=z(d)),
        "cent": IterationCentroids(iteration=1, centroids=z((k, d))),
        "stats": ClusterStatistics(iteration=1, loss=1.0, sums=z((k, d)), counts=z(k, dtype=np.int64)),
        "model": ModelUpdate(version=1, retrained=False, centroids=z((k, d))),
        "remove": PointRemoval(point_id=5, point=z(d)),
    }
    phases = {"step0": "seed", "step": "seed", "score": "seed", "pick": "seed-point", "point": "seed-point",
              "cent": "lloyd", "stats": "lloyd", "model": "model", "remove": "request"}
    size = {name: frame(m, 1, phases[name]) for name, m in msgs.items()}
    payload = {name: array_payload_bytes(m) for name, m in msgs.items()}
    assert payload == {"step0": 0, "step": 8 * d, "score": 0, "pick": 0, "point": 8 * d, "cent": 8 * k * d,
                       "stats": 8 * (k * d + k), "model": 8 * k * d, "remove": 8 * d}
    assert all(0 < size[name] - payload[name] < 64 for name in size)  # the envelope is small and constant

    def training(start: int, executed: int) -> dict[int, int]:
        out = {}
        for s in range(k):
            out[start + s] = p * size["step0" if s == 0 else "step"] + p * size["score"] + size["pick"] + size["point"]
        for j in range(executed + 1):
            out[start + k + j] = p * (size["cent"] + size["stats"])
        out[start + k + executed] += p * size["model"]
        return out

    expected = training(0, first.executed)
    r = k + first.executed + 1
    expected[r] = size["remove"] + p * size["model"]  # certified: the request and the (same) model
    expected[r + 1] = size["remove"]  # a seed: the request, then a full training
    expected.update(training(r + 2, second.executed))
    assert report.bytes_by_round() == expected
    # The same in array bytes: the training's frames minus their envelopes give the formula.
    name_of = {m.TAG: name for name, m in msgs.items() if name != "step0"}
    training_rounds = range(k + first.executed + 1)
    arrays = sum(
        link.payload_bytes - link.messages * (size[name_of[link.tag]] - payload[name_of[link.tag]])
        for link in report.links if link.round_idx in training_rounds and not (link.tag == "del.qseed"
                                                                                 and link.round_idx == 0)
    )
    analytic = training_payload_bytes(p, k, d, first.executed)
    assert arrays == analytic["seeding"] + analytic["lloyd"] + analytic["model"]


async def test_memory_transport_gives_the_harness_run(mixture):
    x = mixture(64, (45, 175, 175, 175), sd=0.06)
    ids = np.arange(len(x))
    config = QKMeansConfig(k=4, eps=1 / 64)
    stream = [3, 300, 450]
    expected, harness_report = run_harness(federation(x, ids, split(len(x), 3), config, seed=2, deletions=stream))
    fed = federation(x, ids, split(len(x), 3), config, seed=2, deletions=stream)
    network = MemoryNetwork(fed.roster)
    meter = Meter(trio.current_time)
    results = await run_parties(fed.machines(), network, config=RuntimeConfig(session=SESSION), meter=meter)
    report = meter.report(protocol="qkmeans", transport="memory", session=SESSION, parties=fed.roster)
    np.testing.assert_array_equal(results[COORDINATOR].centroids, expected[COORDINATOR].centroids)
    assert results[COORDINATOR].reasons == expected[COORDINATOR].reasons
    assert report.bytes_by_round() == harness_report.bytes_by_round()


# --------------------------------------------------------------------------- bad input


def started(fed, party):
    machine = fed.make_machine(party)
    machine.start()
    return machine


def test_messages_out_of_turn_fail_with_clear_errors(mixture):
    x = mixture(65, (20, 20, 20), d=2)
    ids = np.arange(60)
    config = QKMeansConfig(k=3, eps=1 / 16)
    fed = federation(x, ids, split(60, 3), config, seed=0, deletions=[1, 2])
    coord = started(fed, COORDINATOR)
    with pytest.raises(RemoteProtocolError, match="scored step 1, the current step is 0"):
        coord.receive("client-0", SeedScore(step=1, point_id=0, score=0.5), round_idx=0)
    assert coord.failed
    with pytest.raises(LocalProtocolError):
        coord.receive("client-0", SeedScore(step=0, point_id=0, score=0.5), round_idx=0)
    coord = started(fed, COORDINATOR)
    stranger = int(fed.parts[1][1][0])
    with pytest.raises(RemoteProtocolError, match="does not hold"):
        coord.receive("client-0", SeedScore(step=0, point_id=stranger, score=0.5), round_idx=0)
    coord = started(fed, COORDINATOR)
    with pytest.raises(RemoteProtocolError, match="not a party"):
        coord.receive("client-9", SeedScore(step=0, point_id=0, score=0.5), round_idx=0)
    coord = started(fed, COORDINATOR)
    with pytest.raises(RemoteProtocolError, match="unexpected PointRemoval"):
        coord.receive("client-0", PointRemoval(point_id=1, point=np.zeros(2)), round_idx=0)
    # Drive a real run until Lloyd round 1 is out, then replay a statistics message of round 0.
    machines = fed.machines()
    harness = Harness(machines, session=SESSION)
    harness.start()
    coord = machines[COORDINATOR]
    while not (coord.state.name == "LLOYD" and coord._iteration == 1):
        harness.deliver_one()
    stale = ClusterStatistics(iteration=0, loss=1.0, sums=np.zeros((3, 2)), counts=np.zeros(3, dtype=np.int64))
    with pytest.raises(RemoteProtocolError, match="statistics of round 0, expected 1"):
        coord.receive("client-0", stale, round_idx=coord.round_idx)
    party = started(fed, "client-0")
    with pytest.raises(RemoteProtocolError, match="not the coordinator"):
        party.receive("client-1", SeedStep(step=0, centre=np.zeros((0, 2))), round_idx=0)
    party = started(fed, "client-0")
    with pytest.raises(RemoteProtocolError, match="must start at step 0"):
        party.receive(COORDINATOR, SeedStep(step=1, centre=np.zeros((1, 2))), round_idx=0)
    party = started(fed, "client-0")
    party.receive(COORDINATOR, SeedStep(step=0, centre=np.zeros((0, 2))), round_idx=0)
    with pytest.raises(RemoteProtocolError, match="did not propose"):
        party.receive(COORDINATOR, SeedPick(step=0, point_id=int(fed.parts[1][1][0])), round_idx=0)
    party = started(fed, "client-0")
    with pytest.raises(RemoteProtocolError, match="dimension"):
        party.receive(COORDINATOR, SeedStep(step=0, centre=np.zeros((0, 3))), round_idx=0)


def serving_coordinator(fed):
    """A coordinator driven through training by the real parties, waiting for the first request."""
    machines = fed.machines()
    for name, m in machines.items():
        if name != COORDINATOR:
            m.requests = {}  # the parties stay silent after training: requests are injected by hand
    harness = Harness(machines, session=SESSION)
    harness.start()
    while harness.deliver_one() is not None:
        pass
    coord = machines[COORDINATOR]
    assert coord.state.name == "SERVING"
    return coord


def test_removal_requests_are_checked(mixture):
    x = mixture(66, (20, 20, 20), d=2)
    ids = np.arange(60)
    config = QKMeansConfig(k=3, eps=1 / 16)
    fed = federation(x, ids, split(60, 3), config, seed=0, deletions=[1, 2, 3])
    owner = fed.owners[1]
    other = next(c for c in fed.clients if c != owner)
    coord = serving_coordinator(fed)
    r = coord.round_idx
    with pytest.raises(RemoteProtocolError, match=f"which {owner} owns"):
        coord.receive(other, PointRemoval(point_id=1, point=x[1]), round_idx=r)
    coord = serving_coordinator(fed)
    with pytest.raises(RemoteProtocolError, match="not in the data set"):
        coord.receive(owner, PointRemoval(point_id=999, point=x[1]), round_idx=r)
    coord = serving_coordinator(fed)
    with pytest.raises(RemoteProtocolError, match="dimension"):
        coord.receive(owner, PointRemoval(point_id=1, point=np.zeros(3)), round_idx=r)
    coord = serving_coordinator(fed)
    seed = int(coord._model.seed_ids[0])
    with pytest.raises(RemoteProtocolError, match="differ from the seed"):
        coord.receive(fed.owners[seed], PointRemoval(point_id=seed, point=x[seed] + 0.5), round_idx=r)
    coord = serving_coordinator(fed)
    victim = next(i for i in range(60) if i not in coord._model.seed_ids)
    out = coord.receive(fed.owners[victim], PointRemoval(point_id=victim, point=x[victim]), round_idx=r)
    if out[0].message.__class__ is ModelUpdate:  # certified: the next request may follow
        with pytest.raises(RemoteProtocolError, match="already deleted"):
            coord.receive(fed.owners[victim], PointRemoval(point_id=victim, point=x[victim]), round_idx=r + 1)
    # A negative loss on the wire is refused at decoding, before any machine sees it.
    stats = ClusterStatistics(iteration=0, loss=1.0, sums=np.zeros((3, 2)), counts=np.zeros(3, dtype=np.int64))
    data = encode_frame(stats, session=SESSION, round_idx=0, phase="lloyd")
    one, minus_one = b"\xcb" + np.float64(1.0).byteswap().tobytes(), b"\xcb" + np.float64(-1.0).byteswap().tobytes()
    assert data.count(one) == 1
    with pytest.raises(DecodeError, match="non-negative"):
        decode_frame(data.replace(one, minus_one))


def test_statistics_that_do_not_add_up_are_refused(mixture):
    x = mixture(67, (20, 20, 20), d=2)
    fed = federation(x, np.arange(60), split(60, 2), QKMeansConfig(k=3, eps=1 / 16), seed=0)
    liar = fed.parts[0]
    fed.parts[0] = (liar[0][:-1], liar[1][:-1])  # client-0 hides a point the table lists
    with pytest.raises(RemoteProtocolError, match="report 59 points, the table lists 60"):
        run_harness(fed)


def test_a_silent_party_is_named(mixture):
    x = mixture(68, (20, 20, 20), d=2)
    fed = federation(x, np.arange(60), split(60, 3), QKMeansConfig(k=3, eps=1 / 16), seed=0)
    harness = Harness(fed.machines(), session=SESSION, tamper=lambda f: None if f.sender == "client-2" else f.data)
    harness.start()
    while harness.deliver_one() is not None:
        pass
    with pytest.raises(InsufficientParticipants, match="client-2"):
        harness.inject(COORDINATOR, PhaseTimedOut(0, "seed", 60.0))


def test_construction_refuses_bad_federations(mixture):
    x = mixture(69, (10, 10), d=2)
    config = QKMeansConfig(k=3, eps=0.1)
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="held by two"):
        QKMeansParties([(x[:5], np.arange(5)), (x[5:10], np.arange(5))], config, federated=True, key=key)
    with pytest.raises(ValueError, match="different dimensions"):
        QKMeansParties([(x[:5], np.arange(5)), (np.zeros((3, 3)), np.arange(5, 8))], config, federated=True,
                       key=key)
    with pytest.raises(ValueError, match="unknown point ids"):
        QKMeansParties([(x, np.arange(20))], config, federated=True, key=key, deletions=[20])
    with pytest.raises(ValueError, match="fewer than k"):
        QKMeansParties([(x, np.arange(20))], config, federated=True, key=key, deletions=list(range(18)))
    with pytest.raises(ValueError, match="at least one party"):
        QKMeansParties([], config, federated=True, key=key)
    with pytest.raises(ValueError, match="not a party"):
        QKMeansParties([(x, np.arange(20))], config, federated=True, key=key).make_machine("client-3")
    with pytest.raises(ValueError, match="outside the roster"):
        QKMeansCoordinator(COORDINATOR, parties=["a"], config=config, key=key, d=2, owners={0: "b"}, n_deletions=0)
    with pytest.raises(ValueError, match="fewer than k"):
        QKMeansCoordinator(COORDINATOR, parties=["a"], config=config, key=key, d=2, owners={0: "a"}, n_deletions=0)
    # Fewer than k distinct points: the coordinator fails like the centralised training.
    dup = np.repeat(x[:2], 10, axis=0)
    with pytest.raises(ValueError, match="distinct"):
        run_harness(QKMeansParties([(dup, np.arange(20))], config, federated=True, key=key))


def test_messages_validate_their_fields():
    with pytest.raises(ValueError):
        SeedStep(step=0, centre=np.zeros((1, 2)))
    with pytest.raises(ValueError):
        SeedScore(step=0, point_id=0, score=float("nan"))
    with pytest.raises(ValueError):
        SeedScore(step=0, point_id=0, score=float("inf"))
    with pytest.raises(ValueError):
        ClusterStatistics(iteration=0, loss=-1.0, sums=np.zeros((2, 2)), counts=np.zeros(2, dtype=np.int64))
    with pytest.raises(ValueError):
        ClusterStatistics(iteration=0, loss=1.0, sums=np.zeros((2, 2)), counts=-np.ones(2, dtype=np.int64))
    with pytest.raises(ValueError):
        PointRemoval(point_id=-1, point=np.zeros(2))
    with pytest.raises(ValueError):
        IterationCentroids(iteration=0, centroids=np.full((2, 2), np.nan))

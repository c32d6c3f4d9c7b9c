"""Deletion as a protocol: DC-k-means as a tree of parties, Q-k-means as server and clients.

Driven by the synchronous harness (real codec, exact metering) and over the memory transport.
Spec deletion-kmeans.md, section 2.3 and oracles O-DC-1, O-DC-2 (zero bytes off the path) and
O-DC-6 (cost accounting).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import trio

from fedproto.algorithms.deletion.dckmeans import DCKMeans, DCKMeansConfig
from fedproto.algorithms.deletion.messages import (
    ModelUpdate,
    NodeCentroids,
    PointUpload,
    RemovalRequest,
    WeightedNodeCentroids,
)
from fedproto.algorithms.deletion.protocol import DCTree, QKMeansParties
from fedproto.algorithms.deletion.qkmeans import QKMeans, QKMeansConfig
from fedproto.codec import array_payload_bytes, encode_frame
from fedproto.errors import InsufficientParticipants, LocalProtocolError, RemoteProtocolError
from fedproto.messages import PhaseTimedOut
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.testing.harness import Harness
from fedproto.transports.memory import MemoryNetwork


def run_harness(parties):
    harness = Harness(parties.machines(), session=5)
    results = harness.run()
    report = harness.meter.report(protocol="deletion", transport="harness", session=5, parties=parties.roster)
    return results, report


def centralised_after(tree: DCTree, x, ids, j: int) -> DCKMeans:
    """DCKMeans with the protocol's width, key and leaves, after the first j deletions."""
    config = DCKMeansConfig(k=tree.config.k, iterations=tree.config.iterations, width=tree.tree.width,
                            height=tree.tree.height)
    gone = set(tree.deletions[:j])
    keep = np.array([i not in gone for i in ids])
    return DCKMeans(config, key=tree.key).fit(x[keep], ids[keep], leaves=tree.leaf_of[keep])


@pytest.mark.parametrize(("width", "height"), [(None, 1), (3, 2)])
def test_dc_protocol_equals_the_centralised_algorithm(mixture, width, height):
    """O-DC-1 through the wire: after every deletion the root's model is DCKMeans's."""
    x = mixture(20, (70, 70, 60))  # every node holds at most 64 rows: one compiled shape
    ids = np.arange(len(x)) + 50
    deletions = np.random.default_rng(0).choice(ids, size=12, replace=False).tolist()
    tree = DCTree(x, ids, DCKMeansConfig(k=3, width=width, height=height), key=jax.random.PRNGKey(1),
                  deletions=deletions)
    results, _ = run_harness(tree)
    root = results["root"]
    assert root.deletions == tuple(deletions) and len(root.history) == 13
    for j in (0, 5, 12):
        np.testing.assert_array_equal(root.history[j], centralised_after(tree, x, ids, j).centroids)
    final = centralised_after(tree, x, ids, 12)
    for party in tree.roster[1:]:
        result = results[party]
        np.testing.assert_array_equal(result.centroids, final.centroids_of[result.node])
    removed = [i for p in tree.roster if p.startswith("leaf") for i in results[p].removed]
    assert sorted(removed) == sorted(deletions)


@pytest.mark.parametrize(("width", "height"), [(6, 1), (2, 2)])
def test_dc_deletions_touch_one_path_and_the_other_parties_send_zero_bytes(mixture, width, height):
    """O-DC-2: per deletion round, only the root and the leaf-to-root path send, h + 1 messages."""
    x = mixture(21, (70, 70, 60))
    deletions = np.random.default_rng(1).permutation(len(x))[:8].tolist()
    tree = DCTree(x, None, DCKMeansConfig(k=3, width=width, height=height), key=jax.random.PRNGKey(2),
                  deletions=deletions)
    _, report = run_harness(tree)
    m = len(deletions)
    assert report.algorithm_rounds == m + 2  # training, one per deletion, the final model
    for r, point_id in enumerate(deletions, start=1):
        leaf = tree.owners[point_id]
        path = {tree.party_of(node) for node in tree.tree.path(int(leaf.split("-")[1]))}
        links = [link for link in report.links if link.round_idx == r]
        senders = {link.sender for link in links}
        assert senders == path  # the root (request) and the path (uploads)
        assert sum(link.messages for link in links) == height + 1
        assert {link.phase for link in links if link.sender == "root"} == {"request"}
        silent = set(tree.roster) - path
        assert all(link.sender not in silent for link in links)
    per_party = report.bytes_by_link()
    for party in tree.roster:
        if party.startswith("leaf") and not any(tree.owners[i] == party for i in deletions):
            deletion_bytes = sum(
                link.payload_bytes for link in report.links if link.sender == party and 1 <= link.round_idx <= m
            )
            assert deletion_bytes == 0
    assert per_party  # the report has links


def frame_bytes(message, round_idx: int, phase: str) -> int:
    return len(encode_frame(message, session=5, round_idx=round_idx, phase=phase))


def test_dc_cost_accounting_matches_the_analytic_formula(mixture):
    """O-DC-6: messages per training = non-root nodes; upward bytes = w k d 8 plus framing; a
    deletion costs h k d 8 plus framing plus the request."""
    x = mixture(22, (100, 100, 100))
    k, d, w = 3, 3, 8
    deletions = [5, 150, 299]
    tree = DCTree(x, None, DCKMeansConfig(k=k, width=w), key=jax.random.PRNGKey(3), deletions=deletions)
    _, report = run_harness(tree)
    training = [link for link in report.links if link.round_idx == 0]
    assert sum(link.messages for link in training) == tree.tree.n_nodes - 1
    centroids = np.zeros((k, d))
    upload = NodeCentroids(node=8, version=1, centroids=centroids)
    assert array_payload_bytes(upload) == k * d * 8
    framing = frame_bytes(upload, 0, "local") - k * d * 8
    assert sum(link.payload_bytes for link in training) == w * (k * d * 8 + framing)
    for r, point_id in enumerate(deletions, start=1):
        request = frame_bytes(RemovalRequest(point_id=point_id), r, "request")
        update = frame_bytes(NodeCentroids(node=8, version=2, centroids=centroids), r, "local")
        total = sum(link.payload_bytes for link in report.links if link.round_idx == r)
        assert total == request + 1 * update
    final = frame_bytes(ModelUpdate(version=3, retrained=False, centroids=centroids), 4, "model")
    assert sum(link.payload_bytes for link in report.links if link.round_idx == 4) == w * final


def test_dc_over_the_memory_transport_matches_the_harness(mixture):
    x = mixture(23, (70, 70, 60))
    deletions = [3, 33, 133, 199]
    tree = DCTree(x, None, DCKMeansConfig(k=3, width=4), key=jax.random.PRNGKey(4), deletions=deletions)
    expected, harness_report = run_harness(tree)

    async def go():
        network = MemoryNetwork(tree.roster)
        meter = Meter(trio.current_time)
        results = await run_parties(tree.machines(), network, config=RuntimeConfig(session=5), meter=meter)
        return results, meter.report(protocol="dckmeans", transport="memory", session=5, parties=tree.roster)

    results, report = trio.run(go)
    np.testing.assert_array_equal(results["root"].centroids, expected["root"].centroids)
    assert report.payload_bytes == harness_report.payload_bytes
    assert report.bytes_by_round() == harness_report.bytes_by_round()


def test_dc_given_partition_puts_each_clients_points_in_its_leaf(mixture):
    x = mixture(24, (60, 60, 60))
    leaves = np.repeat(np.arange(4), 45)
    tree = DCTree(x, None, DCKMeansConfig(k=3, width=4), key=jax.random.PRNGKey(5), deletions=[0, 179],
                  leaves=leaves)
    assert tree.owners[0] == "leaf-0" and tree.owners[179] == "leaf-3"
    results, _ = run_harness(tree)
    assert results["leaf-0"].points == 44 and results["leaf-1"].points == 45
    np.testing.assert_array_equal(results["root"].centroids, centralised_after(tree, x, np.arange(180), 2).centroids)


def test_dc_bad_streams_are_refused_at_construction(mixture):
    x = mixture(25, (10, 10))
    config = DCKMeansConfig(k=3, width=2)
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="unknown point ids"):
        DCTree(x, None, config, key=key, deletions=[1, 99])
    with pytest.raises(ValueError, match="repeats"):
        DCTree(x, None, config, key=key, deletions=[1, 1])
    with pytest.raises(ValueError, match="fewer than k"):
        DCTree(x, None, config, key=key, deletions=list(range(18)))
    with pytest.raises(ValueError, match="not a party"):
        DCTree(x, None, config, key=key).make_machine("leaf-9")


def test_dc_illegal_messages_fail_with_clear_errors(mixture):
    x = mixture(26, (20, 20))
    tree = DCTree(x, None, DCKMeansConfig(k=3, width=2), key=jax.random.PRNGKey(0), deletions=[0])
    leaf = tree.make_machine("leaf-0")
    leaf.start()
    held = leaf._store.ids
    stranger = next(i for i in range(40) if i not in held)
    with pytest.raises(RemoteProtocolError, match="does not hold"):
        leaf.receive("root", RemovalRequest(point_id=stranger), round_idx=1)
    assert leaf.failed
    with pytest.raises(LocalProtocolError):
        leaf.receive("root", RemovalRequest(point_id=int(held[0])), round_idx=1)
    other = tree.make_machine("leaf-1")
    other.start()
    with pytest.raises(RemoteProtocolError, match="not the coordinator"):
        other.receive("leaf-0", RemovalRequest(point_id=int(other._store.ids[0])), round_idx=1)
    root = tree.make_machine("root")
    root.start()
    update = NodeCentroids(node=1, version=1, centroids=np.zeros((3, 3)))
    with pytest.raises(RemoteProtocolError, match="not a child"):
        root.receive("leaf-7", update, round_idx=0)
    root = tree.make_machine("root")
    root.start()
    with pytest.raises(RemoteProtocolError, match="node 1, it is node 2"):
        root.receive("leaf-1", update, round_idx=0)
    root = tree.make_machine("root")
    root.start()
    with pytest.raises(RemoteProtocolError, match="unexpected RemovalRequest"):
        root.receive("leaf-0", RemovalRequest(point_id=0), round_idx=0)


def test_dc_a_silent_leaf_is_named(mixture):
    x = mixture(27, (20, 20))
    tree = DCTree(x, None, DCKMeansConfig(k=3, width=2), key=jax.random.PRNGKey(0), deletions=[0])
    machines = tree.machines()
    harness = Harness(machines, session=5, tamper=lambda f: None if f.sender == "leaf-1" else f.data)
    harness.start()
    while harness.deliver_one() is not None:
        pass
    with pytest.raises(InsufficientParticipants, match="leaf-1"):
        harness.inject("root", PhaseTimedOut(0, "collect", 60.0))


def test_dc_idle_leaves_wait_through_the_stream(mixture):
    """A leaf off every path tolerates deadlines while the root works (patience = m + 2)."""
    x = mixture(28, (20, 20))
    tree = DCTree(x, None, DCKMeansConfig(k=3, width=2), key=jax.random.PRNGKey(0), deletions=[0, 1, 2])
    leaf = tree.make_machine("leaf-1")
    leaf.start()
    for _ in range(tree.patience - 1):
        assert leaf.handle(PhaseTimedOut(0, "local", 60.0)) == []
    with pytest.raises(InsufficientParticipants):
        leaf.handle(PhaseTimedOut(0, "local", 60.0))


# ------------------------------------------------------------------------------------------- Q


def q_parties(x, n_clients, deletions, eps=1 / 32, seed=0):
    parts = np.array_split(np.arange(len(x)), n_clients)
    return QKMeansParties([(x[p], p) for p in parts], QKMeansConfig(k=4, eps=eps), key=jax.random.PRNGKey(seed),
                          deletions=deletions)


def test_q_protocol_equals_the_centralised_algorithm(mixture):
    x = mixture(29, (45, 175, 175, 175), sd=0.06)
    deletions = np.random.default_rng(3).permutation(len(x))[:10].tolist()
    parties = q_parties(x, 3, deletions)
    results, report = run_harness(parties)
    qkm = QKMeans(parties.config, key=parties.key).fit(x)
    reasons = [qkm.delete(i).reason for i in deletions]
    server = results["server"]
    assert list(server.reasons) == reasons
    np.testing.assert_array_equal(server.centroids, qkm.centroids)
    for c in parties.clients:
        np.testing.assert_array_equal(results[c].centroids, qkm.centroids)
        assert results[c].retrained == tuple(r != "certified" for r in reasons)
    # Per deletion round: one request from the owner, one model to each client.
    for r, point_id in enumerate(deletions, start=1):
        links = [link for link in report.links if link.round_idx == r]
        owner = parties.clients[next(c for c, (_, ids) in enumerate(parties.parts) if point_id in ids)]
        assert {(link.sender, link.tag) for link in links} == {(owner, "del.remove"), ("server", "del.model")}
        assert sum(link.messages for link in links) == 1 + len(parties.clients)


async def test_q_over_the_memory_transport(mixture):
    x = mixture(30, (45, 175, 175, 175), sd=0.06)
    parties = q_parties(x, 2, [1, 2, 300])
    network = MemoryNetwork(parties.roster)
    results = await run_parties(parties.machines(), network, config=RuntimeConfig(session=5))
    expected, _ = run_harness(q_parties(x, 2, [1, 2, 300]))
    np.testing.assert_array_equal(results["server"].centroids, expected["server"].centroids)


def uploaded_server(parties):
    """A fresh, started q-k-means server that has every client's points (round 0 done)."""
    server = parties.make_machine("server")
    server.start()
    for c, (pts, ids) in zip(parties.clients, parties.parts):
        server.receive(c, PointUpload(ids=ids, points=pts), round_idx=0)
    return server


def test_q_requests_interleaved_with_training_or_for_others_points_fail(mixture):
    x = mixture(31, (45, 175, 175, 175), sd=0.06)
    parties = q_parties(x, 2, [3, 4])
    server = parties.make_machine("server")
    server.start()
    with pytest.raises(RemoteProtocolError, match="unexpected RemovalRequest from client-0 in state COLLECT"):
        server.receive("client-0", RemovalRequest(point_id=3), round_idx=0)
    server = uploaded_server(parties)
    with pytest.raises(RemoteProtocolError, match="client-0 owns"):
        server.receive("client-1", RemovalRequest(point_id=3), round_idx=1)
    server = uploaded_server(parties)
    server.receive("client-0", RemovalRequest(point_id=3), round_idx=1)
    with pytest.raises(RemoteProtocolError, match="already deleted"):
        server.receive("client-0", RemovalRequest(point_id=3), round_idx=2)
    with pytest.raises(ValueError, match="unknown point ids"):
        QKMeansParties([(x[:10], np.arange(10))], parties.config, key=parties.key, deletions=[11])
    with pytest.raises(ValueError, match="held by two"):
        QKMeansParties([(x[:10], np.arange(10)), (x[:10], np.arange(10))], parties.config, key=parties.key)


# ---------------------------------------------------------------------------------- weighted DC


def test_weighted_dc_protocol_equals_the_centralised_algorithm_and_costs_k8_more_per_message(mixture):
    """Spec 2.3's optional weighted variant: the root's model after every deletion is the weighted
    DCKMeans's; each upload carries k cluster masses, k * 8 payload bytes more, so the run costs
    exactly (uploads) x (k * 8 + the envelope of one more array field) more than the unweighted."""
    x = mixture(32, (70, 70, 60))
    k, d, w = 3, 3, 4
    deletions = [3, 33, 133, 199]
    trees, reports, results = {}, {}, {}
    for weighted in (False, True):
        trees[weighted] = DCTree(x, None, DCKMeansConfig(k=k, width=w, weighted=weighted), key=jax.random.PRNGKey(6),
                                 deletions=deletions)
        results[weighted], reports[weighted] = run_harness(trees[weighted])
    tree, root = trees[True], results[True]["root"]
    config = DCKMeansConfig(k=k, width=w, weighted=True)
    for j in range(len(deletions) + 1):
        keep = ~np.isin(np.arange(len(x)), deletions[:j])
        central = DCKMeans(config, key=tree.key).fit(x[keep], np.flatnonzero(keep), leaves=tree.leaf_of[keep])
        np.testing.assert_array_equal(root.history[j], central.centroids)
    np.testing.assert_array_equal(root.counts, central.counts_of[0])
    assert root.counts.sum() == len(x) - len(deletions)
    assert not np.array_equal(root.centroids, results[False]["root"].centroids)
    # Bytes: one message type swapped for the other, nothing else.
    def extra(kk: int) -> int:
        c = np.zeros((kk, d))
        weighted = WeightedNodeCentroids(node=2, version=1, centroids=c, counts=np.zeros(kk))
        plain = NodeCentroids(node=2, version=1, centroids=c)
        return frame_bytes(weighted, 1, "local") - frame_bytes(plain, 1, "local")
    envelope = extra(k) - k * 8
    assert 0 < envelope < 16 and all(extra(kk) - kk * 8 == envelope for kk in (1, 2, 5, 8))
    uploads = sum(link.messages for link in reports[True].links if link.tag == "del.wnode")
    assert uploads == w + len(deletions)  # training, then one per deletion (depth 1)
    assert {link.tag for link in reports[True].links} == {"del.wnode", "del.remove", "del.model"}
    assert reports[True].payload_bytes - reports[False].payload_bytes == uploads * (k * 8 + envelope)
    for r in range(len(deletions) + 2):
        by_round = (reports[True].bytes_by_round()[r] - reports[False].bytes_by_round()[r])
        assert by_round == sum(link.messages for link in reports[True].links
                               if link.round_idx == r and link.tag == "del.wnode") * (k * 8 + envelope)


def test_a_weighted_upload_to_an_unweighted_tree_is_refused(mixture):
    x = mixture(33, (20, 20))
    tree = DCTree(x, None, DCKMeansConfig(k=3, width=2), key=jax.random.PRNGKey(0))
    root = tree.make_machine("root")
    root.start()
    upload = WeightedNodeCentroids(node=1, version=1, centroids=np.zeros((3, 3)), counts=np.ones(3))
    with pytest.raises(RemoteProtocolError, match="to an unweighted tree"):
        root.receive("leaf-0", upload, round_idx=0)
    weighted = DCTree(x, None, DCKMeansConfig(k=3, width=2, weighted=True), key=jax.random.PRNGKey(0))
    root = weighted.make_machine("root")
    root.start()
    with pytest.raises(RemoteProtocolError, match="to a weighted tree"):
        root.receive("leaf-0", NodeCentroids(node=1, version=1, centroids=np.zeros((3, 3))), round_idx=0)
    with pytest.raises(ValueError, match="one entry per centroid"):
        WeightedNodeCentroids(node=1, version=1, centroids=np.zeros((3, 3)), counts=np.ones(2))

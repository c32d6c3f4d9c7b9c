"""MUFC as protocol machines: training, removal requests, exactness through the wire, cost, bad input.

Driven by the synchronous harness (real codec, exact metering) and over the memory transport.
Spec mufc.md 1.10, 2.3, 3.5 and oracles 11, 16 (in tests/test_transport_agreement.py), 21, 22.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from fedproto.algorithms import scma
from fedproto.algorithms.mufc.messages import AggregationRequest, MaskedSyndromes, ModelUpdate, PeerKeys, PublicKey, RemovalRequest
from fedproto.algorithms.mufc.protocol import SERVER, MUFCParties, ServerModel, make_config
from fedproto.algorithms.mufc.replay import replay
from fedproto.algorithms.mufc.seeding import LocalSeeding
from fedproto.codec import decode_frame, encode_frame
from fedproto.errors import DecodeError, InsufficientParticipants, LocalProtocolError, RemoteProtocolError
from fedproto.messages import PhaseTimedOut
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.testing.harness import Harness
from fedproto.transports.memory import MemoryNetwork

KEY = jax.random.PRNGKey(3)


def blobs(seed: int, sizes, d: int = 2, sd: float = 0.04) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.2, 0.8, size=(len(sizes), d))
    return np.clip(np.concatenate([rng.normal(c, sd, size=(s, d)) for c, s in zip(centres, sizes)]), 0, 1)


def federation(n_clients: int = 3, *, k: int = 3, sizes=(30, 30, 30), seed: int = 0, **options):
    """Points of a mixture dealt round-robin to the clients, ids = row numbers (+100)."""
    x = blobs(seed, sizes)
    ids = np.arange(len(x)) + 100
    rows = [np.arange(c, len(x), n_clients) for c in range(n_clients)]
    parts = [(x[r], ids[r]) for r in rows]
    config = make_config(len(x), x.shape[1], k, n_clients, n_init=3, **options)
    return x, ids, parts, config


def run_harness(parties: MUFCParties, **kwargs):
    harness = Harness(parties.machines(), session=9, **kwargs)
    results = harness.run()
    report = harness.meter.report(protocol="mufc", transport="harness", session=9, parties=parties.roster)
    return results, report


def remaining(parts, requests, upto=None):
    gone = {i for _, b in list(requests)[:upto] if b is not None for i in b}
    left = {c for c, b in list(requests)[:upto] if b is None}
    return [
        (x[~np.isin(ids, list(gone))], ids[~np.isin(ids, list(gone))]) for c, (x, ids) in enumerate(parts)
        if c not in left
    ]


def test_training_decodes_the_exact_counts_and_matches_the_replay():
    x, ids, parts, config = federation()
    parties = MUFCParties(parts, config, key=KEY, session=9)
    results, report = run_harness(parties)
    server = results[SERVER]
    assert server.totals == (len(x),)  # oracle 11: the decoded counts sum to n
    assert server.reclustered == (True,)
    expected = replay(parts, config, KEY, (), evaluate=False)
    np.testing.assert_array_equal(server.centroids, expected.centroids)
    for c in parties.clients:
        np.testing.assert_array_equal(results[c].centroids, server.centroids)
        assert results[c].version == 0
    # rounds: one algorithm round; the setup is metered apart
    assert report.algorithm_rounds == 1


def test_every_share_carries_exactly_T_field_elements():
    """Golden cost (oracle 8 through the wire): each share is T * width payload bytes plus one
    envelope, and one removal round costs 1 request + L opens + L shares + L model frames."""
    x, ids, parts, config = federation()
    requests = [(1, (int(parts[1][1][0]),))]
    parties = MUFCParties(parts, config, key=KEY, session=9, requests=requests)
    harness = Harness(parties.machines(), session=9)
    harness.run()
    frames = {}
    for (round_idx, phase, sender, receiver, tag), counter in harness.meter.sent.items():
        frames.setdefault((round_idx, tag), []).append(counter)
    width = scma.field_width(config.prime)
    share = MaskedSyndromes(attempt=0, width=width, values=tuple([config.prime - 1] * config.n_syndromes))
    share_bytes = len(encode_frame(share, session=9, round_idx=1, phase="aggregate"))
    assert share_bytes - config.n_syndromes * width < 64  # the envelope is small
    for round_idx in (0, 1):
        shares = frames[(round_idx, MaskedSyndromes.TAG)]
        assert len(shares) == 3
        assert all(c == (1, share_bytes) for c in shares)
    assert len(frames[(1, RemovalRequest.TAG)]) == 1
    assert len(frames[(1, AggregationRequest.TAG)]) == 3
    assert len(frames[(1, ModelUpdate.TAG)]) == 3
    assert (0, AggregationRequest.TAG) not in frames  # PeerKeys opens the training round


@pytest.mark.parametrize("batch", [1, 4])
def test_exact_unlearning_equals_retraining_after_every_request(batch):
    """Oracle 21 with coupled keys: after every removal request the server's model is the one a
    from-scratch run on the remaining data produces, whether or not a seed was hit."""
    x, ids, parts, config = federation()
    rng = np.random.default_rng(5)
    requests, used = [], set()
    for s in range(6):
        c = s % 3
        pool = [int(i) for i in parts[c][1] if int(i) not in used]
        chosen = tuple(int(i) for i in rng.choice(pool, size=batch, replace=False))
        used.update(chosen)
        requests.append((c, chosen))
    # make sure at least one request removes a seed: client 0's first seed
    seeds0 = MUFCParties(parts, config, key=KEY, session=9).make_machine("client-0")._local.seeds
    requests.append((0, (int(seeds0[0]),) if seeds0[0] not in used else requests[0][1][:0] or (int(seeds0[1]),)))
    parties = MUFCParties(parts, config, key=KEY, session=9, requests=requests)
    results, _ = run_harness(parties)
    server = results[SERVER]
    assert len(server.history) == len(requests) + 1
    assert all(server.reclustered)  # exact mode: q' != q after every removal
    for s in (1, 4, len(requests)):
        fresh = replay(remaining(parts, requests, s), config, KEY, (), evaluate=False)
        np.testing.assert_array_equal(server.history[s], fresh.centroids)
    assert server.totals[-1] == len(x) - sum(len(b) for _, b in requests)
    assert any(results["client-0"].reseeded)


def test_unaffected_clients_do_not_recompute():
    """Oracle 22: a client without requests keeps its seeds and count vector; its unmasked
    syndromes are unchanged, only the masks change between rounds."""
    x, ids, parts, config = federation()
    requests = [(0, (int(parts[0][1][3]),)), (0, (int(parts[0][1][5]),))]
    parties = MUFCParties(parts, config, key=KEY, session=9, requests=requests)
    machines = parties.machines()
    before = {c: (machines[c]._local.seeds, dict(machines[c]._counts)) for c in ("client-1", "client-2")}
    sent = {}

    def spy(frame):
        if frame.sender == "client-1":
            envelope, message = decode_frame(frame.data)
            if isinstance(message, MaskedSyndromes):
                sent[envelope.round_idx] = message.values
        return frame.data

    harness = Harness(machines, session=9, tamper=spy)
    harness.run()
    for c, (seeds, counts) in before.items():
        assert machines[c]._local.seeds == seeds and machines[c]._counts == counts
    assert len(sent) == 3 and len({v.tobytes() for v in sent.values()}) == 3  # fresh masks every round
    p = config.prime
    # the difference between rounds is mask only: client 1's unmasked syndromes are fixed
    syndromes = scma.rs_syndromes(before["client-1"][1], p, config.n_syndromes)
    assert machines["client-1"]._syndromes == syndromes


def test_literal_mode_keeps_the_model_when_no_seed_moves():
    x, ids, parts, config = federation(unlearning="literal")
    local = MUFCParties(parts, config, key=KEY, session=9).make_machine("client-0")._local
    non_seed = next(int(i) for i in parts[0][1] if int(i) not in local.seeds)
    parties = MUFCParties(parts, config, key=KEY, session=9, requests=[(0, (non_seed,)), (0, (int(local.seeds[0]),))])
    server = run_harness(parties)[0][SERVER]
    assert server.reclustered == (True, False, True)
    np.testing.assert_array_equal(server.history[0], server.history[1])
    # the literal server still counts the removed point: its total did not drop
    assert server.totals[1] == server.totals[0]


def test_lazy_mode_reclusters_only_when_the_support_changes():
    x, ids, parts, config = federation(unlearning="lazy")
    local = MUFCParties(parts, config, key=KEY, session=9).make_machine("client-0")._local
    non_seed = next(int(i) for i in parts[0][1] if int(i) not in local.seeds)
    parties = MUFCParties(parts, config, key=KEY, session=9, requests=[(0, (non_seed,))])
    server = run_harness(parties)[0][SERVER]
    assert server.reclustered == (True, False)
    assert server.totals == (len(x), len(x) - 1)  # counts are fresh, the model is not


def test_a_client_leaves_and_its_data_leave_with_it():
    """Multi-client removal: the leaving client computes nothing, the others re-aggregate."""
    x, ids, parts, config = federation()
    parties = MUFCParties(parts, config, key=KEY, session=9, requests=[(1, None)])
    results, _ = run_harness(parties)
    server = results[SERVER]
    assert server.active == (0, 2)
    assert server.totals == (len(x), len(x) - len(parts[1][1]))
    assert results["client-1"].left and results["client-1"].version == 0
    # the model is the server step on the other clients' unchanged count vectors
    machines = MUFCParties(parts, config, key=KEY, session=9).machines()
    counts = {}
    for c in ("client-0", "client-2"):
        for j, q in machines[c]._counts.items():
            counts[j] = counts.get(j, 0) + q
    assert sum(counts.values()) == server.totals[1]


def test_dropout_with_a_quorum_reopens_the_round_without_the_silent_client():
    x, ids, parts, config = federation(min_clients=2)
    parties = MUFCParties(parts, config, key=KEY, session=9, requests=[(0, (int(parts[0][1][2]),))])
    machines = parties.machines()

    def silence(frame):
        envelope, message = decode_frame(frame.data)
        if frame.sender == "client-2" and envelope.round_idx == 1:
            return None
        return frame.data

    harness = Harness(machines, session=9, tamper=silence)
    harness.start()
    while harness.deliver_one() is not None:
        pass
    assert machines[SERVER].pending() == ["client-2"]
    harness.inject(SERVER, PhaseTimedOut(round_idx=1, phase="aggregate", deadline_s=1.0))
    while harness.deliver_one() is not None:
        pass
    server = machines[SERVER].result()
    assert server.dropped == (2,) and server.active == (0, 1)
    assert server.totals[-1] == len(x) - 1 - len(parts[2][1])


def test_dropout_without_a_quorum_names_the_silent_client():
    x, ids, parts, config = federation()
    machines = MUFCParties(parts, config, key=KEY, session=9).machines()
    harness = Harness(machines, session=9, tamper=lambda f: None if f.sender == "client-1" and
                      isinstance(decode_frame(f.data)[1], MaskedSyndromes) else f.data)
    harness.start()
    while harness.deliver_one() is not None:
        pass
    with pytest.raises(InsufficientParticipants, match="client-1"):
        harness.inject(SERVER, PhaseTimedOut(round_idx=0, phase="aggregate", deadline_s=1.0))


async def test_a_silent_client_ends_the_run_with_a_clear_error(autojump_clock):
    x, ids, parts, config = federation()
    parties = MUFCParties(parts, config, key=KEY, session=9)
    machines = parties.machines()
    network = MemoryNetwork(list(parties.roster))
    del machines["client-2"]  # never starts: its key never arrives
    with pytest.raises(InsufficientParticipants, match="client-2"):
        await run_parties(machines, network, config=RuntimeConfig(session=9, deadline_s=5.0))


def _run_with_client0_element_3(change, error, match=None):
    """Run a federation in which client-0's shares carry ``change(element 3)``; the run must end
    with ``error`` and the server failed."""
    x, ids, parts, config = federation()
    machines = MUFCParties(parts, config, key=KEY, session=9).machines()

    def tamper(frame):
        envelope, message = decode_frame(frame.data)
        if frame.sender == "client-0" and isinstance(message, MaskedSyndromes):
            values = scma.unpack_elements(message.values)
            values[3] = change(values[3], config.prime)
            message = dataclasses.replace(message, values=tuple(values))
            return encode_frame(message, session=9, round_idx=envelope.round_idx, phase=envelope.phase)
        return frame.data

    harness = Harness(machines, session=9, tamper=tamper)
    with pytest.raises(error, match=match):
        harness.run()
    assert machines[SERVER].failed
    with pytest.raises(LocalProtocolError):
        machines[SERVER].result()


def test_a_corrupted_share_is_detected_never_decoded_into_a_wrong_model():
    _run_with_client0_element_3(lambda value, p: (value + 1) % p, scma.SyndromeDecodingError)


def test_a_request_during_a_running_round_is_served_after_it():
    """A removal request that reaches the server mid-aggregation is queued, never merged into
    the running round's shares."""
    x, ids, parts, config = federation()
    machines = MUFCParties(parts, config, key=KEY, session=9, requests=[(0, (int(parts[0][1][1]),))]).machines()
    server = machines[SERVER]
    keys = [machines[c].start()[0].message for c in ("client-0", "client-1", "client-2")]
    opened = []
    for c, message in zip(("client-0", "client-1", "client-2"), keys):
        server.start() if not server._started else None
        opened += server.receive(c, message, round_idx=0)
    peers = opened[0].message
    shares = [machines[c].receive(SERVER, peers, round_idx=0)[0].message for c in ("client-0", "client-1")]
    server.receive("client-0", shares[0], round_idx=0)
    assert server.receive("client-1", RemovalRequest(whole_client=False), round_idx=0) == []
    server.receive("client-1", shares[1], round_idx=0)
    share2 = machines["client-2"].receive(SERVER, peers, round_idx=0)[0].message
    out = server.receive("client-2", share2, round_idx=0)
    tags = [type(o.message).__name__ for o in out]
    assert tags == ["ModelUpdate", "AggregationRequest"]  # the queued request opens round 1
    assert server.round_idx == 1


def test_messages_for_another_round_or_from_strangers_are_refused():
    x, ids, parts, config = federation()
    machines = MUFCParties(parts, config, key=KEY, session=9).machines()
    server = machines[SERVER]
    server.start()
    key = machines["client-0"].start()[0].message
    with pytest.raises(RemoteProtocolError, match="not a client"):
        server.receive("mallory", key, round_idx=0)
    machines = MUFCParties(parts, config, key=KEY, session=9).machines()
    server = machines[SERVER]
    server.start()
    with pytest.raises(RemoteProtocolError, match="round"):
        server.receive("client-0", key, round_idx=3)


def test_bad_removal_streams_are_refused_before_the_run():
    x, ids, parts, config = federation()
    with pytest.raises(ValueError, match="does not hold"):
        MUFCParties(parts, config, key=KEY, session=9, requests=[(0, (int(parts[1][1][0]),))]).make_machine("client-0")
    with pytest.raises(ValueError, match="twice"):
        i = int(parts[0][1][0])
        MUFCParties(parts, config, key=KEY, session=9, requests=[(0, (i,)), (0, (i,))]).make_machine("client-0")
    with pytest.raises(ValueError, match="already left"):
        MUFCParties(parts, config, key=KEY, session=9, requests=[(0, None), (0, (int(parts[0][1][0]),))])
    with pytest.raises(ValueError, match="no client"):
        MUFCParties(parts, config, key=KEY, session=9, requests=[(0, None), (1, None), (2, None)])
    with pytest.raises(ValueError, match="unknown client"):
        MUFCParties(parts, config, key=KEY, session=9, requests=[(7, (1,))])
    with pytest.raises(ValueError, match="every point"):
        MUFCParties(parts, config, key=KEY, session=9, requests=[(0, tuple(int(i) for i in parts[0][1]))]).make_machine(
            "client-0")


def test_a_share_outside_the_field_is_refused_on_arrival_naming_its_sender():
    """The server range-checks each share as it arrives (its sum then skips the check): an
    element equal to p from client-0 ends the run with client-0 named, before any sum."""
    _run_with_client0_element_3(lambda value, p: p, RemoteProtocolError, "client-0 sent a value outside F_p")


def test_share_width_is_checked_on_the_wire():
    share = MaskedSyndromes(attempt=0, width=9, values=(1, 2, 3))
    frame = encode_frame(share, session=1, round_idx=0, phase="aggregate")
    decoded = decode_frame(frame)[1]
    assert (decoded.attempt, decoded.width) == (share.attempt, share.width)
    assert np.array_equal(decoded.values, share.values) and scma.unpack_elements(decoded.values) == [1, 2, 3]
    assert len(frame) > 27  # three elements of 9 bytes each, whatever their size
    forged = frame.replace(b"\x09", b"\x08", 1)
    with pytest.raises(DecodeError):
        decode_frame(forged)
    with pytest.raises(ValueError):
        MaskedSyndromes(attempt=0, width=1, values=(300,))
    for message in (PublicKey(public_key=bytes(32)), PeerKeys(keys=(bytes(32), bytes([1]) * 32)),
                    AggregationRequest(active=(0, 2), attempt=1), RemovalRequest(whole_client=True),
                    ModelUpdate(version=2, reclustered=False, centroids=np.zeros((2, 3)))):
        decoded = decode_frame(encode_frame(message, session=1, round_idx=2, phase="x"))[1]
        assert type(decoded) is type(message)
    with pytest.raises(ValueError):
        AggregationRequest(active=(2, 0), attempt=0)
    with pytest.raises(ValueError):
        PeerKeys(keys=(bytes(32), bytes(32)))


async def test_memory_transport_run_equals_the_harness(autojump_clock):
    x, ids, parts, config = federation()
    requests = [(2, (int(parts[2][1][4]),)), (0, None)]
    parties = MUFCParties(parts, config, key=KEY, session=9, requests=requests)
    expected, _ = run_harness(parties)
    network = MemoryNetwork(list(parties.roster))
    results = await run_parties(parties.machines(), network, config=RuntimeConfig(session=9))
    np.testing.assert_array_equal(results[SERVER].centroids, expected[SERVER].centroids)
    assert results[SERVER].totals == expected[SERVER].totals


def test_a_server_reusing_its_caches_clusters_like_a_fresh_one():
    """The server keeps its clustering key, the seeding noise and the bin centres between rounds
    (coupled randomness); after any sequence of rounds its model equals a fresh server's on the
    same counts, and counts equal to the current ones skip the clustering without changing it."""
    x, ids, parts, config = federation()
    model = ServerModel(config, jax.random.fold_in(KEY, 0))
    counts = {}
    for c, (xc, idc) in enumerate(parts):
        local = LocalSeeding(xc, idc, config.k_client, jax.random.fold_in(KEY, c + 1))
        for j, q in local.counts(config.grid).items():
            counts[j] = counts.get(j, 0) + q
    assert model.adopt(dict(counts), 0)
    rng = np.random.default_rng(2)
    for round_idx in range(1, 6):
        j = int(rng.choice(sorted(counts)))
        counts[j] -= 1
        if not counts[j]:
            del counts[j]
        assert model.adopt(dict(counts), round_idx)
        fresh = ServerModel(config, jax.random.fold_in(KEY, 0))
        fresh.adopt(dict(counts), 0)
        np.testing.assert_array_equal(model.centroids, fresh.centroids)
    before = model.centroids
    assert not model.adopt(dict(counts), 6)  # the same counts: no clustering, the same model
    assert model.centroids is before


def test_the_replay_breaks_each_removal_down():
    x, ids, parts, config = federation()
    requests = [(0, (int(parts[0][1][3]),)), (1, (int(parts[1][1][2]),)), (2, None)]
    run = replay(parts, config, KEY, requests, retrains=1, evaluate=False)
    for step in run.steps:
        assert step.server_s == pytest.approx(step.share_sum_s + step.decode_s + step.cluster_s)
        assert min(step.share_sum_s, step.decode_s, step.codec_s) > 0
        assert (step.cluster_s > 0) == step.reclustered
    assert run.steps[-1].client_s == 0.0 and run.steps[-1].whole_client


def test_a_mask_expanded_between_rounds_equals_the_one_computed_on_demand():
    x, ids, parts, config = federation()
    requests = [(0, (int(parts[0][1][3]),)), (0, (int(parts[0][1][5]),))]
    machines = MUFCParties(parts, config, key=KEY, session=9, requests=requests).machines()
    sent = {}

    def spy(frame):
        envelope, message = decode_frame(frame.data)
        if frame.sender == "client-1" and isinstance(message, MaskedSyndromes):
            sent[envelope.round_idx] = scma.unpack_elements(message.values)
        return frame.data

    Harness(machines, session=9, tamper=spy).run()
    client = machines["client-1"]
    for round_idx in (1, 2):  # removal rounds: client 1 had expanded these masks in advance
        mask = scma.pairwise_masks(1, client._pair_seeds, config.prime, config.n_syndromes, round_idx << 16)
        assert sent[round_idx] == scma.mask_syndromes(client._syndromes, mask, config.prime)

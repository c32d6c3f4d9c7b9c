"""SecAgg+ engines: exact sums under dropout at every stage, the threshold, masks, the server's view, bytes.

The recoverability oracle below is written from the protocol's definition (Bonawitz et al. Fig. 4
over a graph, Bell et al. Sec. 3), independently of the engine: with ``U1 ⊇ U2 ⊇ U3 ⊇ U4`` the
clients that completed each stage, the sum of ``U3``'s inputs is recoverable iff ``U1`` and ``U3``
have at least t clients, every client of ``U1`` has t neighbours in ``U1``, every client of ``U2``
has t neighbours in ``U2`` and in ``U3``, and every client of ``U2`` has t neighbours in ``U4``
(its self-mask seed or its masking key is revealed by them).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from scipy import stats

from fedproto.algorithms.secagg_plus import engine, shamir
from fedproto.algorithms.secagg_plus.engine import STAGES, Modulus, SecAggPlusConfig
from fedproto.algorithms.secagg_plus.messages import (
    CIPHERTEXT_BYTES,
    EncryptedShares,
    ForwardedShares,
    MaskedInput,
    UnmaskShares,
)
from fedproto.algorithms.secagg_plus.simulation import client_name, simulate
from fedproto.errors import InsufficientParticipants, RemoteProtocolError

MODULI = {
    "ring32": Modulus.ring(32),
    "ring64": Modulus.ring(64),
    "field31": Modulus.field(2**31 - 1),
    "field89": Modulus.field(2**89 - 1),  # above 2^63: Python-int vectors
}


def _config(n=12, length=7, modulus=MODULI["ring32"], degree=6, threshold=4, seed=1):
    return SecAggPlusConfig(n, length, modulus, degree, threshold, bytes([seed]) * 32)


def _inputs(config, seed=0):
    rng = np.random.default_rng(seed)
    size = config.modulus.size
    if size <= 2**63:
        return [config.modulus.vector(rng.integers(0, size, config.vector_length, dtype=np.uint64)) for _ in range(config.n_clients)]
    return [config.modulus.vector([int(rng.integers(0, 2**62)) * 2**27 % size for _ in range(config.vector_length)]) for _ in range(config.n_clients)]


def _expected_sum(config, inputs, members):
    total = config.modulus.zeros(config.vector_length)
    for i in members:
        total = config.modulus.add(total, inputs[i])
    return total


def _sets(config, dropouts):
    n = config.n_clients
    order = {stage: i for i, stage in enumerate(STAGES)}
    return [
        {i for i in range(n) if i not in dropouts or order[dropouts[i]] > s}
        for s in range(4)
    ]


def _recoverable(config, dropouts):
    u1, u2, u3, u4 = _sets(config, dropouts)
    t = config.threshold
    nb = config.neighbours

    def count(i, members):
        return sum(1 for v in nb[i] if v in members)

    return (
        len(u1) >= t
        and len(u3) >= t
        and all(count(u, u1) >= t for u in u1)
        and all(count(u, u2) >= t for u in u2)
        and all(count(u, u3) >= t for u in u2)
        and all(count(u, u4) >= t for u in u2)
    )


@pytest.mark.parametrize("name", sorted(MODULI))
def test_no_dropout_sum_is_exact(name):
    config = _config(modulus=MODULI[name])
    inputs = _inputs(config)
    result = simulate(config, inputs)
    assert np.array_equal(result.outcome.total, _expected_sum(config, inputs, range(config.n_clients)))
    assert result.outcome.survivors == tuple(client_name(i) for i in range(config.n_clients))
    assert result.outcome.dropouts == {}


def test_complete_graph_is_classic_secagg():
    config = engine.complete_config(7, 5, MODULI["ring64"])
    assert config.complete and config.degree == 6
    assert all(len(nb) == 6 for nb in config.neighbours)
    inputs = _inputs(config, 3)
    dropouts = {2: "masked-input", 5: "unmask"}
    result = simulate(config, inputs, dropouts=dropouts)
    survivors = [i for i in range(7) if i != 2]
    assert np.array_equal(result.outcome.total, _expected_sum(config, inputs, survivors))
    assert result.outcome.dropouts == {"client-2": "masked-input", "client-5": "unmask"}


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("name", ["ring32", "field31"])
def test_random_dropouts_at_every_stage_match_the_oracle(stage, name):
    """Random dropout sets at one stage, from none to many: exact sum iff the oracle says so."""
    config = _config(n=14, modulus=MODULI[name], degree=8, threshold=5)
    inputs = _inputs(config, 7)
    rng = random.Random(f"{stage}-{name}")
    outcomes = {True: 0, False: 0}
    for trial in range(16):
        size = rng.randint(0, 8)
        dropouts = dict.fromkeys(rng.sample(range(config.n_clients), size), stage)
        ok = _recoverable(config, dropouts)
        outcomes[ok] += 1
        if ok:
            result = simulate(config, inputs, dropouts=dropouts)
            u3 = _sets(config, dropouts)[2]
            assert np.array_equal(result.outcome.total, _expected_sum(config, inputs, sorted(u3))), (trial, dropouts)
            assert set(result.outcome.dropouts) == {client_name(i) for i in dropouts}
        else:
            with pytest.raises(InsufficientParticipants):
                simulate(config, inputs, dropouts=dropouts)
    assert outcomes[True] > 0


def _drop_neighbours(config, client, keep, stage):
    """Drop all but ``keep`` neighbours of ``client`` at ``stage``."""
    return dict.fromkeys(config.neighbours[client][keep:], stage)


@pytest.mark.parametrize("stage", STAGES)
def test_threshold_exactly_met_and_one_below(stage):
    """A client left with exactly t surviving neighbours still has its masks removed; t - 1 fails
    with an error naming it (for the unmask stage: the neighbours that did not reveal)."""
    config = _config(n=16, degree=8, threshold=5, seed=4)
    inputs = _inputs(config, 2)
    target = 0
    at = _drop_neighbours(config, target, config.threshold, stage)
    assert _recoverable(config, at)
    result = simulate(config, inputs, dropouts=at)
    survivors = sorted(_sets(config, at)[2])
    assert np.array_equal(result.outcome.total, _expected_sum(config, inputs, survivors))
    below = _drop_neighbours(config, target, config.threshold - 1, stage)
    assert not _recoverable(config, below)
    with pytest.raises(InsufficientParticipants) as caught:
        simulate(config, inputs, dropouts=below)
    message = str(caught.value)
    assert client_name(target) in message
    assert set(caught.value.missing) == {client_name(i) for i in below}


def test_dropped_input_is_not_in_the_sum_and_unmask_dropout_is():
    config = _config()
    inputs = _inputs(config, 9)
    result = simulate(config, inputs, dropouts={3: "masked-input", 8: "unmask"})
    members = [i for i in range(config.n_clients) if i != 3]
    assert np.array_equal(result.outcome.total, _expected_sum(config, inputs, members))
    assert client_name(8) in result.outcome.survivors and client_name(3) not in result.outcome.survivors


def test_server_never_holds_both_secrets_of_a_client():
    """For every client the server receives shares of its self-mask seed or of its masking key,
    never both, and fewer than t of whichever it did not need."""
    config = _config(n=16, degree=8, threshold=4)
    inputs = _inputs(config, 5)
    rng = random.Random(5)
    while True:  # a recoverable set with two masked-input drops, one unmask and one share-keys drop
        a, b, c, d = rng.sample(range(config.n_clients), 4)
        dropouts = {a: "masked-input", b: "masked-input", c: "unmask", d: "share-keys"}
        if _recoverable(config, dropouts):
            break
    result = simulate(config, inputs, dropouts=dropouts, keep_view=True)
    self_seen: dict[int, int] = {}
    key_seen: dict[int, int] = {}
    for _, message in result.server_view:
        if isinstance(message, UnmaskShares):
            for owner in message.self_owners.tolist():
                self_seen[owner] = self_seen.get(owner, 0) + 1
            for owner in message.key_owners.tolist():
                key_seen[owner] = key_seen.get(owner, 0) + 1
    assert not set(self_seen) & set(key_seen)
    assert set(key_seen) == {a, b}
    assert all(count >= config.threshold for count in self_seen.values())


def test_a_single_input_is_hidden_from_the_server():
    """Change one client's input and another's by the opposite amount (same sum, same entropy):
    the sum is identical, every other client's masked input is identical, and the changed
    client's masked input moves by exactly the change: what the server receives from a client is
    its input plus a mask that does not depend on the input (and whose seeds the server never
    holds both of, see the test above)."""
    config = _config(modulus=MODULI["ring32"])
    inputs = _inputs(config, 11)
    delta = config.modulus.vector(np.arange(1, config.vector_length + 1, dtype=np.uint64) * 977)
    changed = list(inputs)
    changed[0] = config.modulus.add(inputs[0], delta)
    changed[1] = config.modulus.sub(inputs[1], delta)
    a = simulate(config, inputs, keep_view=True)
    b = simulate(config, changed, keep_view=True)
    assert np.array_equal(a.outcome.total, b.outcome.total)

    def masked(sim, who):
        return next(m.masked for s, m in sim.server_view if s == who and isinstance(m, MaskedInput)).reshape(-1)

    # Every other client's masked input is identical; client 0's differs by exactly delta.
    for i in range(2, config.n_clients):
        assert np.array_equal(masked(a, client_name(i)), masked(b, client_name(i)))
    assert np.array_equal(masked(b, "client-0") - masked(a, "client-0"), delta)
    # And the masked value itself is far from the input (the mask is not zero).
    assert np.count_nonzero(masked(a, "client-0") == inputs[0]) <= 1


def test_masks_are_uniform_and_fresh_per_instance():
    """Masked inputs of an all-zero input, over many instances: chi-square on 16 bins of the top
    four bits (fixed seeds; the test's level is 1e-4), and no element repeats between instances."""
    config = _config(n=6, length=512, degree=4, threshold=3)
    zero = [config.modulus.zeros(config.vector_length) for _ in range(config.n_clients)]
    draws = []
    for instance in range(6):
        sim = simulate(config, zero, instance=f"round-{instance}".encode(), keep_view=True)
        draws.append(next(m.masked for s, m in sim.server_view if s == "client-0" and isinstance(m, MaskedInput)).reshape(-1))
    values = np.concatenate(draws)
    counts = np.bincount((values >> np.uint32(28)).astype(np.int64), minlength=16)
    p = stats.chisquare(counts).pvalue
    assert p > 1e-4, counts
    for a in range(len(draws)):
        for b in range(a + 1, len(draws)):
            # Two independent uniform 32-bit vectors of 512 elements share an element at a given
            # position with probability 512 / 2^32.
            assert np.count_nonzero(draws[a] == draws[b]) == 0


def test_per_neighbour_bytes_grow_exactly_as_the_formula():
    """Bytes a client sends and receives per stage: the difference between degrees k1 and k2 is
    exactly (k2 - k1) times the per-neighbour term of `stage_bytes`, and the rest is a frame
    envelope of under 96 bytes per frame."""
    n, length = 40, 30
    results = {}
    for k in (10, 20):
        config = SecAggPlusConfig(n, length, MODULI["ring32"], k, k // 2 + 1, bytes(32))
        sim = simulate(config, _inputs(config))
        results[k] = (config, sim)
    for stage in STAGES:
        for direction in ("sent", "received"):
            (c1, s1), (c2, s2) = results[10], results[20]
            measured1 = (s1.sent_bytes if direction == "sent" else s1.received_bytes)[stage]
            measured2 = (s2.sent_bytes if direction == "sent" else s2.received_bytes)[stage]
            formula1 = engine.stage_bytes(c1)[stage][direction]
            formula2 = engine.stage_bytes(c2)[stage][direction]
            assert np.all(measured1 == measured1[0]) and np.all(measured2 == measured2[0])
            assert int(measured2[0] - measured1[0]) == formula2 - formula1, (stage, direction)
            frames = 0 if formula1 == 0 and stage == "unmask" and direction == "received" else 1
            if stage == "masked-input" and direction == "received":
                frames = 1  # the unmask request, with an empty dropped list
            assert 0 <= measured1[0] - formula1 <= 96 * frames, (stage, direction)
    assert engine.stage_bytes(results[10][0])["share-keys"]["sent"] == 10 * (4 + CIPHERTEXT_BYTES)


def test_frame_limit_bounds_every_frame():
    config = _config(n=10, length=9, degree=4, threshold=3)
    sim = simulate(config, _inputs(config), dropouts={4: "masked-input"})
    largest = max(int(v.max()) for v in (*sim.sent_bytes.values(), *sim.received_bytes.values()))
    assert largest <= engine.frame_limit(config)


# --- refusals ----------------------------------------------------------------------------------------


def _server_at_share_keys(config):
    names = [client_name(i) for i in range(config.n_clients)]
    server = engine.SecAggPlusServer(config, names, round_idx=0, instance=b"x")
    clients = [engine.SecAggPlusClient(config, i, entropy=bytes([i + 1]) * 32, instance=b"x") for i in range(config.n_clients)]
    out = []
    for i, c in enumerate(clients):
        out += server.receive(names[i], c.advertise())
    return server, clients, {o.dest: o.message for o in out}


def test_client_refuses_neighbours_outside_its_graph():
    config = _config()
    _, clients, inbox = _server_at_share_keys(config)
    message = inbox["client-0"]
    stranger = next(v for v in range(1, config.n_clients) if v not in config.neighbours[0])
    forged = type(message)(
        neighbours=np.asarray(sorted([*message.neighbours.tolist()[1:], stranger]), dtype=np.uint32), keys=message.keys
    )
    with pytest.raises(RemoteProtocolError, match="not neighbours"):
        clients[0].share_keys("server", forged)


def test_server_refuses_shares_for_other_recipients_and_second_messages():
    config = _config()
    server, clients, inbox = _server_at_share_keys(config)
    shares = clients[0].share_keys("server", inbox["client-0"])
    wrong = EncryptedShares(recipients=shares.recipients[:-1], ciphertexts=shares.ciphertexts[:-1])
    with pytest.raises(RemoteProtocolError, match="other clients"):
        server.receive("client-0", wrong)


def test_server_refuses_a_repeated_or_foreign_message():
    config = _config()
    server, clients, inbox = _server_at_share_keys(config)
    shares = clients[0].share_keys("server", inbox["client-0"])
    server.receive("client-0", shares)
    with pytest.raises(RemoteProtocolError, match="second"):
        server.receive("client-0", shares)
    with pytest.raises(RemoteProtocolError, match="not a client"):
        server.receive("intruder", shares)


def test_tampered_ciphertext_does_not_open():
    config = _config(n=5, degree=4, threshold=3)
    names = [client_name(i) for i in range(5)]
    server = engine.SecAggPlusServer(config, names, round_idx=0, instance=b"y")
    clients = [engine.SecAggPlusClient(config, i, entropy=bytes([i + 7]) * 32, instance=b"y") for i in range(5)]
    out = []
    for i, c in enumerate(clients):
        out += server.receive(names[i], c.advertise())
    inbox = {o.dest: o.message for o in out}
    forwarded = []
    for i, c in enumerate(clients):
        forwarded += server.receive(names[i], c.share_keys("server", inbox[names[i]]))
    message = {o.dest: o.message for o in forwarded}["client-0"]
    ciphertexts = message.ciphertexts.copy()
    ciphertexts[0, 0] ^= 1
    with pytest.raises(RemoteProtocolError, match="do not open"):
        clients[0].receive_shares("server", ForwardedShares(senders=message.senders, ciphertexts=ciphertexts))


def test_late_message_from_a_dropped_client_is_ignored():
    config = _config()
    names = [client_name(i) for i in range(config.n_clients)]
    server = engine.SecAggPlusServer(config, names, round_idx=0, instance=b"z")
    clients = [engine.SecAggPlusClient(config, i, entropy=bytes([i + 1]) * 32, instance=b"z") for i in range(config.n_clients)]
    late = clients[0].advertise()
    for i in range(1, config.n_clients):
        server.receive(names[i], clients[i].advertise())
    out = server.drop(["client-0"])
    assert server.dropouts == {"client-0": "advertise-keys"} and out
    assert server.receive("client-0", late) == []


def test_config_refuses_bad_sizes():
    with pytest.raises(ValueError, match="degree"):
        SecAggPlusConfig(5, 3, MODULI["ring32"], 5, 2)
    with pytest.raises(ValueError, match="threshold"):
        SecAggPlusConfig(5, 3, MODULI["ring32"], 4, 5)
    with pytest.raises(ValueError, match="prime"):
        Modulus.field(2**31)


def test_modulus_wire_round_trip_and_range_check():
    for modulus in MODULI.values():
        vec = modulus.vector([0, 1, modulus.size - 1])
        assert np.array_equal(modulus.from_wire(modulus.to_wire(vec), 3), vec)
        with pytest.raises(ValueError):
            modulus.vector([modulus.size])
    field = MODULI["field31"]
    wire = field.to_wire(field.vector([1, 2]))
    bad = wire.copy()
    bad[0] = 0xFF  # 0xFFFFFFFF > p
    with pytest.raises(ValueError):
        field.from_wire(bad, 2)


def test_plus_parameters_fall_back_to_the_complete_graph_for_few_clients():
    config = engine.plus_config(10, 4, MODULI["ring32"])
    assert config.degree == 9 and config.complete
    assert shamir.SHARE_BYTES == 33


def test_each_survivor_hears_only_of_its_own_dropped_neighbours():
    """The unmask request lists a client's dropped neighbours, not every dropped client: its size
    is 4 bytes per dropped neighbour over a constant envelope, whatever n."""
    config = _config(n=30, degree=6, threshold=3, seed=9)
    dropped = {2: "masked-input", 17: "masked-input", 25: "masked-input"}
    assert _recoverable(config, dropped)
    sim = simulate(config, _inputs(config), dropouts=dropped)
    received = sim.received_bytes["masked-input"]
    survivors = [u for u in range(config.n_clients) if u not in dropped]
    rest = {int(received[u]) - 4 * len(set(config.neighbours[u]) & set(dropped)) for u in survivors}
    assert len(rest) == 1
    assert any(set(config.neighbours[u]) & set(dropped) for u in survivors)
    assert any(not set(config.neighbours[u]) & set(dropped) for u in survivors)

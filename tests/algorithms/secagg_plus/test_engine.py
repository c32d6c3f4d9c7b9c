"""SecAgg+ engines: exact sums under dropout at every stage and round, the threshold, masks, bytes.

The recoverability oracle below is written from the protocol's definition (docs/protocols/
secagg_plus.md), independently of the engine. In one aggregation, with ``U1`` the clients that
hold keys, ``U3`` those whose input arrived and ``U4`` those that answered the unmask request:
it fails unless ``U1`` and ``U3`` have t clients and every client of ``U1`` (``U3``) has t
neighbours in it; the sum of ``U3`` is unmasked when every client of ``U3`` has t neighbours in
``U4`` and no client of ``U3 \\ U4`` masked with a neighbour outside ``U3`` (that pair's key is
known to the two of them only); otherwise ``U4`` masks again (attempt 2) and its sum is unmasked
when ``U4`` has t clients, each with t neighbours in ``U4``.

What the server's view reveals across rounds is in ``test_server_view.py``.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from scipy import stats

from fedproto.algorithms.secagg_plus import engine, shamir
from fedproto.algorithms.secagg_plus.engine import STAGES, Modulus, SecAggPlusConfig
from fedproto.algorithms.secagg_plus.messages import KEY_BYTES, MaskedInput, Remask, UnmaskRequest, UnmaskShares
from fedproto.algorithms.secagg_plus.simulation import client_name, simulate
from fedproto.errors import InsufficientParticipants, LocalProtocolError, RemoteProtocolError

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


class Oracle:
    """The recoverability rule of the module docstring, round after round: which clients' inputs
    each round's sum holds (``None``: the run fails there) and how many attempts it takes."""

    def __init__(self, config):
        self.config = config
        self.t = config.threshold
        self.keys: set[int] = set()
        self.believed: dict[int, set[int]] = {}  # the neighbours each client masks with next

    def count(self, u, members):
        return sum(1 for v in self.config.neighbours[u] if v in members)

    def round(self, active, silent_at):
        """``active``: the clients of the round; ``silent_at[stage]``: those silent from that stage
        on. Returns ``(members of the sum, attempts, clients still in)`` or ``None``."""
        t = self.t
        if not self.keys:  # round 0 agrees the keys
            u1 = set(active) - silent_at.get(STAGES[0], set())
            if len(u1) < t or any(self.count(u, u1) < t for u in u1):
                return None
            self.keys = u1
            self.believed = {u: {v for v in self.config.neighbours[u] if v in u1} for u in u1}
        active = set(active) & self.keys
        u3 = active - silent_at.get(STAGES[0], set()) - silent_at.get(STAGES[1], set())
        u4 = u3 - silent_at.get(STAGES[2], set())
        if len(u3) < t or any(len(self.believed[u] & u3) < t for u in u3):
            return None
        stuck = any(self.believed[u] - u3 for u in u3 - u4)
        for u in u4:
            self.believed[u] &= u3
        if all(len(self.believed[u] & u4) >= t for u in u3) and not stuck:
            return u3, 1, u4
        if len(u4) < t or any(len(self.believed[u] & u4) < t for u in u4):
            return None
        for u in u4:
            self.believed[u] &= u4
        return u4, 2, u4


def _silent_at(dropouts, round_idx):
    """``{stage: clients silent from that stage of round_idx}`` for ``{client: (stage, round)}``."""
    out: dict[str, set[int]] = {}
    for client, (stage, when) in dropouts.items():
        if when < round_idx:
            first = STAGES[0]
        elif when == round_idx:
            first = stage
        else:
            continue
        for s in STAGES[STAGES.index(first):]:
            out.setdefault(s, set()).add(client)
    return out


def _predict(config, dropouts, rounds):
    oracle = Oracle(config)
    active = set(range(config.n_clients))
    plan = []
    for r in range(rounds):
        got = oracle.round(active, _silent_at(dropouts, r))
        if got is None:
            return plan, r  # fails in round r
        members, attempts, active = got
        plan.append((sorted(members), attempts))
    return plan, None


@pytest.mark.parametrize("name", sorted(MODULI))
def test_no_dropout_sum_is_exact_in_every_round(name):
    config = _config(modulus=MODULI[name])
    per_round = [_inputs(config, seed) for seed in range(3)]
    result = simulate(config, per_round, rounds=3)
    for r, outcome in enumerate(result.outcomes):
        assert np.array_equal(outcome.total, _expected_sum(config, per_round[r], range(config.n_clients)))
        assert outcome.survivors == tuple(client_name(i) for i in range(config.n_clients))
        assert outcome.dropouts == {} and outcome.attempts == 1


def test_complete_graph_is_classic_secagg():
    config = engine.complete_config(7, 5, MODULI["ring64"])
    assert config.complete and config.degree == 6
    assert all(len(nb) == 6 for nb in config.neighbours)
    inputs = _inputs(config, 3)
    result = simulate(config, inputs, dropouts={2: "masked-input"})
    survivors = [i for i in range(7) if i != 2]
    assert np.array_equal(result.outcome.total, _expected_sum(config, inputs, survivors))
    assert result.outcome.dropouts == {"client-2": "masked-input"}


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("name", ["ring32", "field31"])
def test_random_dropouts_at_every_stage_match_the_oracle(stage, name):
    """Random dropout sets at one stage of round 0, from none to many: the sum the oracle names,
    after the attempts it names, or an error where it says the sum is lost."""
    config = _config(n=14, modulus=MODULI[name], degree=8, threshold=5)
    inputs = _inputs(config, 7)
    rng = random.Random(f"{stage}-{name}")
    seen = {"ok": 0, "again": 0, "fail": 0}
    for trial in range(16):
        size = rng.randint(0, 8)
        dropouts = {i: (stage, 0) for i in rng.sample(range(config.n_clients), size)}
        plan, fails = _predict(config, dropouts, 1)
        if fails is None:
            (members, attempts), = plan
            seen["again" if attempts > 1 else "ok"] += 1
            result = simulate(config, inputs, dropouts=dropouts)
            assert np.array_equal(result.outcome.total, _expected_sum(config, inputs, members)), (trial, dropouts)
            assert result.outcome.attempts == attempts
            assert set(result.outcome.dropouts) == {client_name(i) for i in dropouts}
        else:
            seen["fail"] += 1
            with pytest.raises(InsufficientParticipants):
                simulate(config, inputs, dropouts=dropouts)
    assert seen["ok"] > 0 and seen["fail"] > 0


@pytest.mark.parametrize("seed", range(6))
def test_random_dropouts_across_rounds_match_the_oracle(seed):
    """Dropouts at random stages of random rounds of a four-round run, some rounds with clients
    silent at unmask next to clients without input (masked again): every round's sum is the
    oracle's, or the run fails in the round where the oracle says so."""
    config = _config(n=16, degree=8, threshold=4, seed=seed + 2)
    rounds = 4
    per_round = [_inputs(config, 100 * seed + r) for r in range(rounds)]
    rng = random.Random(seed)
    dropouts = {
        i: (rng.choice(engine.AGGREGATION_STAGES), rng.randrange(rounds))
        for i in rng.sample(range(config.n_clients), rng.randint(2, 5))
    }
    plan, fails = _predict(config, dropouts, rounds)
    if fails is not None:
        with pytest.raises(InsufficientParticipants):
            simulate(config, per_round, dropouts=dropouts, rounds=rounds)
        return
    result = simulate(config, per_round, dropouts=dropouts, rounds=rounds)
    for r, ((members, attempts), outcome) in enumerate(zip(plan, result.outcomes, strict=True)):
        assert np.array_equal(outcome.total, _expected_sum(config, per_round[r], members)), (r, dropouts)
        assert outcome.attempts == attempts


def test_a_silent_client_next_to_one_without_input_makes_the_others_mask_again():
    """Client a sent no input; its neighbour b sent one but is silent at unmask: the pair's mask key
    is known to a and b only, so the clients that answered mask their inputs again (fresh masks,
    attempt 1), and the sum holds their inputs, not b's. The server records b at unmask."""
    config = _config(n=12, degree=6, threshold=3, seed=3)
    a = 0
    b = config.neighbours[a][0]
    inputs = _inputs(config, 4)
    result = simulate(config, inputs, dropouts={a: "masked-input", b: "unmask"}, keep_view=True)
    members = [i for i in range(config.n_clients) if i not in (a, b)]
    assert result.outcome.attempts == 2
    assert np.array_equal(result.outcome.total, _expected_sum(config, inputs, members))
    assert result.outcome.dropouts == {client_name(a): "masked-input", client_name(b): "unmask"}
    # each remaining client sent two masked inputs of the same value under different masks
    for i in members:
        masked = [m.masked for _, _, s, m in result.server_view if s == client_name(i) and isinstance(m, MaskedInput)]
        assert len(masked) == 2 and not np.array_equal(masked[0], masked[1])


def test_a_client_silent_at_unmask_whose_masks_cancel_stays_in_the_sum():
    config = _config()
    inputs = _inputs(config, 9)
    quiet = next(u for u in range(4, config.n_clients) if 3 not in config.neighbours[u])
    result = simulate(config, inputs, dropouts={3: "masked-input", quiet: "unmask"})
    members = [i for i in range(config.n_clients) if i != 3]
    assert np.array_equal(result.outcome.total, _expected_sum(config, inputs, members))
    assert client_name(quiet) in result.outcome.survivors and result.outcome.attempts == 1


def _drop_neighbours(config, client, keep, stage):
    """Drop all but ``keep`` neighbours of ``client`` at ``stage`` of round 0."""
    return {v: (stage, 0) for v in config.neighbours[client][keep:]}


@pytest.mark.parametrize("stage", STAGES[:2])
def test_threshold_exactly_met_and_one_below(stage):
    """A client left with exactly t neighbours with keys (with input) is unmasked; t - 1 fails with
    an error naming it and the dropped clients."""
    config = _config(n=16, degree=8, threshold=5, seed=4)
    inputs = _inputs(config, 2)
    target = 0
    at = _drop_neighbours(config, target, config.threshold, stage)
    plan, fails = _predict(config, at, 1)
    assert fails is None
    result = simulate(config, inputs, dropouts=at)
    assert np.array_equal(result.outcome.total, _expected_sum(config, inputs, plan[0][0]))
    below = _drop_neighbours(config, target, config.threshold - 1, stage)
    assert _predict(config, below, 1)[1] == 0
    with pytest.raises(InsufficientParticipants) as caught:
        simulate(config, inputs, dropouts=below)
    assert client_name(target) in str(caught.value)
    assert set(caught.value.missing) == {client_name(i) for i in below}


def test_server_never_asks_for_both_secrets_of_a_pair():
    """In every aggregation each client reveals, per neighbour it masked with, the share of that
    neighbour's seed or the pair's mask key, never both: the requests partition its list."""
    config = _config(n=16, degree=8, threshold=4)
    names = [client_name(i) for i in range(config.n_clients)]
    server, clients = _keyed(config, b"p")
    out = []
    for i in range(2, config.n_clients):  # clients 0 and 1 send no input
        out += server.receive(names[i], clients[i].mask_input(_inputs(config)[i], round_idx=0))
    out += server.drop(names[:2])
    for o in out:
        i = names.index(o.dest)
        request = o.message
        assert isinstance(request, UnmaskRequest)
        masked_with = clients[i].neighbours
        reply = clients[i].unmask("server", request)
        alive, gone = clients[i].revealed
        assert sorted(alive + gone) == list(masked_with) and not set(alive) & set(gone)
        assert set(gone) == set(masked_with) & {0, 1} and reply.pair_keys.shape == (len(gone), KEY_BYTES)


def test_a_single_input_is_hidden_from_the_server():
    """Change one client's input and another's by the opposite amount (same sum, same entropy):
    the sum is identical, every other client's masked input is identical, and the changed
    client's masked input moves by exactly the change: what the server receives from a client is
    its input plus a mask that does not depend on the input."""
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
        return next(m.masked for _, _, s, m in sim.server_view if s == who and isinstance(m, MaskedInput)).reshape(-1)

    for i in range(2, config.n_clients):
        assert np.array_equal(masked(a, client_name(i)), masked(b, client_name(i)))
    assert np.array_equal(masked(b, "client-0") - masked(a, "client-0"), delta)
    assert np.count_nonzero(masked(a, "client-0") == inputs[0]) <= 1


def test_masks_are_uniform_and_fresh_per_round():
    """Masked inputs of an all-zero input, over six rounds of one set-up: chi-square on 16 bins of
    the top four bits (fixed seeds; the test's level is 1e-4), and no element repeats between
    rounds."""
    config = _config(n=6, length=512, degree=4, threshold=3)
    zero = [config.modulus.zeros(config.vector_length) for _ in range(config.n_clients)]
    sim = simulate(config, zero, rounds=6, keep_view=True)
    draws = [m.masked.reshape(-1) for _, _, s, m in sim.server_view if s == "client-0" and isinstance(m, MaskedInput)]
    assert len(draws) == 6
    values = np.concatenate(draws)
    counts = np.bincount((values >> np.uint32(28)).astype(np.int64), minlength=16)
    assert stats.chisquare(counts).pvalue > 1e-4, counts
    for a in range(len(draws)):
        for b in range(a + 1, len(draws)):
            # Two independent uniform 32-bit vectors of 512 elements share an element at a given
            # position with probability 512 / 2^32.
            assert np.count_nonzero(draws[a] == draws[b]) == 0


def test_ring_masks_are_the_chacha20_keystream():
    """A ring mask is the ChaCha20 keystream of its key (zero nonce, from block 1, as RFC 8439's
    AEAD encrypts), read as little-endian words: checked against a bare ChaCha20 cipher."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    key = bytes(range(32))
    for bits in (32, 64):
        modulus = Modulus.ring(bits)
        stream = Cipher(algorithms.ChaCha20(key, (1).to_bytes(4, "little") + bytes(12)), mode=None).encryptor()
        words = np.frombuffer(stream.update(bytes(11 * bits // 8)), dtype=f"<u{bits // 8}")
        assert np.array_equal(modulus.expand(key, 11), words.astype(modulus.dtype))


def test_per_neighbour_bytes_grow_exactly_as_the_formula():
    """Bytes a client sends and receives per stage: the difference between degrees k1 and k2 is
    exactly (k2 - k1) times the per-neighbour term of `stage_bytes`, and the rest is a frame
    envelope of under 96 bytes per frame; with D neighbours dropped the formula holds too."""
    n, length = 40, 30
    results = {}
    for k in (10, 20):
        config = SecAggPlusConfig(n, length, MODULI["ring32"], k, k // 2 + 1, bytes(32))
        results[k] = (config, simulate(config, _inputs(config)))
    for stage in STAGES:
        for direction in ("sent", "received"):
            (c1, s1), (c2, s2) = results[10], results[20]
            measured1 = (s1.sent_bytes if direction == "sent" else s1.received_bytes)[stage]
            measured2 = (s2.sent_bytes if direction == "sent" else s2.received_bytes)[stage]
            formula1 = engine.stage_bytes(c1)[stage][direction]
            formula2 = engine.stage_bytes(c2)[stage][direction]
            assert np.all(measured1 == measured1[0]) and np.all(measured2 == measured2[0])
            assert int(measured2[0] - measured1[0]) == formula2 - formula1, (stage, direction)
            frames = 0 if stage == "unmask" and direction == "received" else 1
            assert 0 <= measured1[0] - formula1 <= 96 * frames, (stage, direction)
    config, _ = results[10]
    dropped = {v: "masked-input" for v in config.neighbours[0][:2]}
    sim = simulate(config, _inputs(config), dropouts=dropped)
    base = engine.stage_bytes(config)
    with_two = engine.stage_bytes(config, dropped=2)
    for stage, direction, measured in (("masked-input", "received", sim.received_bytes), ("unmask", "sent", sim.sent_bytes)):
        before = getattr(results[10][1], f"{direction}_bytes")[stage][0]
        change = int(measured[stage][0] - before)
        assert change == with_two[stage][direction] - base[stage][direction], (stage, direction)


def test_frame_limit_bounds_every_frame():
    config = _config(n=10, length=9, degree=4, threshold=3)
    sim = simulate(config, _inputs(config), dropouts={4: "masked-input"})  # one frame per stage and client
    largest = max(int(v.max()) for v in (*sim.sent_bytes.values(), *sim.received_bytes.values()))
    assert largest <= engine.frame_limit(config)


def test_each_survivor_hears_only_of_its_own_neighbours():
    """The unmask request lists a client's dropped neighbours and forwards its other neighbours'
    shares: its size depends on the degree, not on n."""
    sizes = {}
    for n in (30, 120):
        config = _config(n=n, degree=6, threshold=3, seed=9)
        sim = simulate(config, _inputs(config))
        sizes[n] = set(sim.received_bytes["masked-input"].tolist())
    assert sizes[30] == sizes[120] and len(sizes[30]) == 1


# --- refusals ----------------------------------------------------------------------------------------


def _set_up(config, instance=b"x"):
    names = [client_name(i) for i in range(config.n_clients)]
    server = engine.SecAggPlusServer(config, names, round_idx=0, instance=instance)
    clients = [engine.SecAggPlusClient(config, i, entropy=bytes([i + 1]) * 32, instance=instance) for i in range(config.n_clients)]
    out = []
    for i, c in enumerate(clients):
        out += server.receive(names[i], c.advertise())
    return server, clients, {o.dest: o.message for o in out}


def _keyed(config, instance):
    """The server and the clients with the set-up done (every client holds its run keys)."""
    server, clients, inbox = _set_up(config, instance)
    for i, c in enumerate(clients):
        c.receive_keys("server", inbox[client_name(i)])
    return server, clients


def test_client_refuses_neighbours_outside_its_graph():
    config = _config()
    _, clients, inbox = _set_up(config)
    message = inbox["client-0"]
    stranger = next(v for v in range(1, config.n_clients) if v not in config.neighbours[0])
    forged = type(message)(
        neighbours=np.asarray(sorted([*message.neighbours.tolist()[1:], stranger]), dtype=np.uint32), keys=message.keys
    )
    with pytest.raises(RemoteProtocolError, match="not neighbours"):
        clients[0].receive_keys("server", forged)


def test_server_refuses_wrong_share_counts_repeats_and_strangers():
    config = _config()
    server, clients, inbox = _set_up(config)
    clients[0].receive_keys("server", inbox["client-0"])
    masked = clients[0].mask_input(_inputs(config)[0], round_idx=0)
    short = MaskedInput(masked=masked.masked, shares=masked.shares[:-1])
    with pytest.raises(RemoteProtocolError, match="encrypted shares"):
        server.receive("client-0", short)
    server.receive("client-0", masked)
    with pytest.raises(RemoteProtocolError, match="second"):
        server.receive("client-0", masked)
    with pytest.raises(RemoteProtocolError, match="not a client"):
        server.receive("intruder", masked)


def _at_unmask(config, instance):
    """Set up and mask round 0's inputs: the server, the clients and client-0's unmask request."""
    server, clients = _keyed(config, instance)
    out = []
    for i, c in enumerate(clients):
        out += server.receive(client_name(i), c.mask_input(_inputs(config)[i], round_idx=0))
    return server, clients, {o.dest: o.message for o in out}["client-0"]


def test_tampered_ciphertext_does_not_open():
    config = _config(n=5, degree=4, threshold=3)
    _, clients, request = _at_unmask(config, b"y")
    shares = request.shares.copy()
    shares[0, 0] ^= 1
    with pytest.raises(RemoteProtocolError, match="does not authenticate"):
        clients[0].unmask("server", UnmaskRequest(dropped=request.dropped, shares=shares))


def test_masks_are_never_reused():
    """A client refuses to mask twice for one (round, attempt) or to go back; the server refuses
    to begin a round that is not after the last, or before the running one has its sum; a remask
    must name the next attempt."""
    config = _config(n=5, degree=4, threshold=3)
    server, clients, inbox = _set_up(config, b"r")
    clients[0].receive_keys("server", inbox["client-0"])
    clients[0].mask_input(_inputs(config)[0], round_idx=3)
    with pytest.raises(LocalProtocolError, match="stage"):
        clients[0].mask_input(_inputs(config)[0], round_idx=4)
    clients[0].stage = engine.DONE  # as after its unmask shares
    for round_idx, attempt in ((3, 0), (2, 5)):
        with pytest.raises(LocalProtocolError, match="never reused"):
            clients[0].mask_input(_inputs(config)[0], round_idx=round_idx, attempt=attempt)
    with pytest.raises(RemoteProtocolError, match="remask"):
        clients[0].remask("server", Remask(attempt=2), _inputs(config)[0])
    with pytest.raises(LocalProtocolError, match="runs"):
        server.begin(1)
    sim = simulate(config, _inputs(config))
    assert sim.outcome.attempts == 1
    done = engine.SecAggPlusServer(config, [client_name(i) for i in range(5)], round_idx=2, instance=b"r")
    done.outcome = sim.outcome
    done.round_idx = 2
    with pytest.raises(LocalProtocolError, match="never reused"):
        done.begin(2)


def test_a_client_whose_input_a_round_lacked_is_absent_later():
    """Its neighbours left it out of their masks, so a later round named with it in ``active``
    goes on without it (absent, not a dropout) and sums the others exactly."""
    config = _config(n=10, degree=6, threshold=3)
    inputs = _inputs(config, 8)
    names = [client_name(i) for i in range(10)]
    server, clients = _keyed(config, b"b")

    def aggregate(r, senders):
        out = []
        for i in senders:
            out += server.receive(names[i], clients[i].mask_input(inputs[i], round_idx=r))
        out += server.drop([names[i] for i in range(10) if i not in senders and names[i] in server.pending()])
        for o in list(out):
            out += server.receive(o.dest, clients[names.index(o.dest)].unmask("server", o.message))
        return server.outcome

    first = aggregate(0, [i for i in range(10) if i != 4])
    assert first.dropouts == {client_name(4): "masked-input"}
    server.begin(1, names)  # client 4 named again
    assert client_name(4) not in server.pending()
    second = aggregate(1, [i for i in range(10) if i != 4])
    assert second.dropouts == {} and client_name(4) not in second.survivors
    assert np.array_equal(second.total, _expected_sum(config, inputs, [i for i in range(10) if i != 4]))


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


def test_a_withdrawn_client_is_absent_not_a_dropout():
    """A client that leaves before its masked input (MUFC's leaving client) is not a dropout; its
    neighbours reveal this round's pair keys with it and the sum holds the others."""
    config = _config(n=8, degree=6, threshold=3)
    inputs = _inputs(config, 1)
    names = [client_name(i) for i in range(8)]
    server, clients = _keyed(config, b"w")
    out = server.withdraw(["client-5"])
    for i in range(8):
        if i != 5:
            out += server.receive(names[i], clients[i].mask_input(inputs[i], round_idx=0))
    replies = []
    for o in out:
        replies += server.receive(o.dest, clients[names.index(o.dest)].unmask("server", o.message))
    assert server.outcome.dropouts == {} and client_name(5) not in server.outcome.survivors
    assert np.array_equal(server.outcome.total, _expected_sum(config, inputs, [i for i in range(8) if i != 5]))
    with pytest.raises(LocalProtocolError):
        server.withdraw(["client-1"])


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


def test_unmask_shares_refuse_mismatched_counts():
    config = _config(n=5, degree=4, threshold=3)
    server, clients, request = _at_unmask(config, b"u")
    reply = clients[0].unmask("server", request)
    wrong = UnmaskShares(shares=reply.shares[:-1], pair_keys=reply.pair_keys)
    with pytest.raises(RemoteProtocolError, match="shares and"):
        server.receive("client-0", wrong)

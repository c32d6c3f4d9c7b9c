"""What the server's view reveals across the rounds of one SecAgg+ set-up (issue 34, target 2).

The server sees every message it receives over a run: each client's masked inputs, the shares of
self-mask seeds and the pair mask keys the clients reveal. These tests compute, from that view,
everything the server can: a self-mask seed from any t of its shares, a pairwise mask from its
revealed key. An input is exposed when the server knows its seed and the keys of every pair it
was masked with. The run under test has several rounds after one set-up, a client dropping at the
masked input after its inputs were in earlier sums, a neighbour of it silent at unmask (the
others mask again) and a masked input that arrives late, after the server counted its sender as
dropped. No input of any client in any round is exposed, and removing every mask the server can
leaves a value that is not the input.

The control shows the check can fail: with one dropped client's long-term pair keys (what
Bonawitz et al.'s recovery of a dropped client's masking key would hand the server), its inputs
of the earlier rounds are exposed. That is why no long-term secret is ever revealed here.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedproto.algorithms import secagg
from fedproto.algorithms.secagg_plus import engine, shamir
from fedproto.algorithms.secagg_plus.engine import Modulus, SecAggPlusConfig
from fedproto.algorithms.secagg_plus.messages import MaskedInput, UnmaskShares
from fedproto.algorithms.secagg_plus.simulation import client_name, simulate
from fedproto.codec import encode_frame

ROUNDS = 5


def _inputs(config, rounds, seed=0):
    rng = np.random.default_rng(seed)
    return [
        [config.modulus.vector(rng.integers(0, 2**32, config.vector_length, dtype=np.uint64)) for _ in range(config.n_clients)]
        for _ in range(rounds)
    ]


def _secrets(sim, config, r, a, u):
    """Client u's self-mask seed, its shares and its pair mask keys in aggregation (r, a), from
    its own engine (the ground truth the server's view is compared with)."""
    client = sim.clients[u]
    neighbours = sim.masked_with[r, a, u]
    seed = secagg.derive_bytes(client._seed_key, engine._info(b"self-seed", r, a))
    shares = shamir.split_secret(seed, range(1, len(neighbours) + 1), config.threshold, client._share_entropy)
    keys = {v: engine._mask_key(client._pair[v][32:], r, a) for v in neighbours}
    return seed, shares, keys


def _analyse(sim, config, inputs, extra_keys=frozenset()):
    """Everything the server can compute from its view: which (round, attempt, client) inputs it
    exposes, and for each received input the value left after removing every mask it can."""
    shares_seen = {row.tobytes() for _, _, _, m in sim.server_view if isinstance(m, UnmaskShares) for row in m.shares}
    keys_seen = {row.tobytes() for _, _, _, m in sim.server_view if isinstance(m, UnmaskShares) for row in m.pair_keys}
    keys_seen |= set(extra_keys)
    modulus, length = config.modulus, config.vector_length
    exposed, residuals, seeds_known, keys_known = [], {}, set(), set()
    for r, a, sender, message in sim.server_view:
        if not isinstance(message, MaskedInput):
            continue
        u = int(sender.split("-")[1])
        seed, shares, keys = _secrets(sim, config, r, a, u)
        y = modulus.from_wire(message.masked, length)
        seed_known = sum(share in shares_seen for share in shares) >= config.threshold
        if seed_known:
            seeds_known.add((r, a, u))
            y = modulus.sub(y, modulus.expand(seed, length))
        unknown = 0
        for v, key in keys.items():
            if key in keys_seen:
                keys_known.add((r, a, u, v))
                mask = modulus.expand(key, length)
                y = modulus.sub(y, mask) if u < v else modulus.add(y, mask)
            else:
                unknown += 1
        if seed_known and unknown == 0:
            exposed.append((r, a, u))
        residuals[r, a, u] = (y, inputs[r][u])
    return exposed, residuals, seeds_known, keys_known


def _run(config, late=None):
    """The run of the module docstring; ``late``: (client, round) whose masked input reaches the
    server after it counted the client as dropped (appended to the view)."""
    a = 1
    b = config.neighbours[a][0]
    c = next(u for u in range(config.n_clients) if u not in (a, b))
    inputs = _inputs(config, ROUNDS)
    dropouts = {a: ("masked-input", 2), b: ("unmask", 2), c: ("unmask", 3)}
    sim = simulate(config, inputs, dropouts=dropouts, rounds=ROUNDS, keep_view=True)
    if late is not None:
        who, round_idx = late
        client = sim.clients[who]
        message = client.mask_input(inputs[round_idx][who], round_idx=round_idx)
        sim.masked_with[round_idx, 0, who] = client.neighbours
        sim.server_view.append((round_idx, 0, client_name(who), message))
    return sim, inputs, (a, b, c)


GRAPHS = {
    "plus": SecAggPlusConfig(14, 6, Modulus.ring(32), 6, 3, bytes([7]) * 32),
    "complete": engine.complete_config(10, 6, Modulus.ring(32)),
}


@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_no_single_input_is_exposed_in_any_round(graph):
    config = GRAPHS[graph]
    sim, inputs, (a, b, c) = _run(config, late=(1, 2))
    # the run is the one described: b's silence next to a made the others mask round 2 again
    assert [o.attempts for o in sim.outcomes] == [1, 1, 2, 1, 1]
    assert sim.outcomes[2].dropouts == {client_name(a): "masked-input", client_name(b): "unmask"}
    assert client_name(c) in sim.outcomes[3].survivors
    exposed, residuals, seeds_known, keys_known = _analyse(sim, config, inputs)
    # The view is read right: the server does learn what it must to unmask the sums ...
    for r, outcome in enumerate(sim.outcomes):
        final = outcome.attempts - 1
        for name in outcome.survivors:
            assert (r, final, int(name.split("-")[1])) in seeds_known
    # b's input of round 2, attempt 0: its seed is known (its neighbours revealed their shares
    # before b went silent), but its pair key with a is known to a and b only: still masked
    assert (2, 0, b) in seeds_known and (2, 0, b, a) not in keys_known and (2, 0, b) not in exposed
    # ... and no single input: each keeps a mask the server cannot remove.
    assert exposed == []
    for (r, attempt, u), (left, x) in residuals.items():
        assert np.count_nonzero(left == x) <= 1, (r, attempt, u)
    # The late input of a (round 2, after the server counted it as dropped) is among them.
    assert (2, 0, a) in residuals and (2, 0, a) not in seeds_known


def test_no_long_term_secret_appears_in_the_view():
    """No client's private key, seed key, share-encryption key or pair base key is in any byte the
    server receives."""
    config = GRAPHS["plus"]
    sim, _, _ = _run(config)
    wire = b"".join(encode_frame(m, session=0, round_idx=r, phase="x") for r, _, _, m in sim.server_view)
    for client in sim.clients:
        secrets = [client._private.private_bytes_raw(), client._seed_key, client._share_entropy]
        secrets += [key for pair in client._pair.values() for key in (pair[:32], pair[32:])]
        assert secrets and all(secret not in wire for secret in secrets)


def test_control_a_revealed_long_term_key_exposes_the_earlier_inputs():
    """Hand the server the pair keys of every round derived from dropped client a's long-term pair
    bases (what reconstructing its masking key would give): a's inputs of rounds 0 and 1, whose
    self masks were removed, are exposed."""
    config = GRAPHS["plus"]
    sim, inputs, (a, _, _) = _run(config)
    leaked = {
        engine._mask_key(pair[32:], r, attempt)
        for pair in sim.clients[a]._pair.values() for r in range(ROUNDS) for attempt in (0, 1)
    }
    exposed, residuals, _, _ = _analyse(sim, config, inputs, extra_keys=leaked)
    assert {(0, 0, a), (1, 0, a)} <= set(exposed)
    for key in ((0, 0, a), (1, 0, a)):
        left, x = residuals[key]
        assert np.array_equal(left, x)

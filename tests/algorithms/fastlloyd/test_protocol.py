"""FastLloyd end to end through the sync harness and the runtime (spec fastlloyd.md section 7.2)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import trio

from fedproto.algorithms import kmeans, secagg
from fedproto.algorithms.fastlloyd.config import FastLloydConfig, make_config
from fedproto.algorithms.fastlloyd.messages import MaskedUpdate, NoisyAggregate, SealedSeed
from fedproto.algorithms.fastlloyd.protocol import FastLloydClient, FastLloydServer, initial_centroids
from fedproto.codec import decode_frame, encode_frame
from fedproto.data import normalize, partition
from fedproto.errors import InsufficientParticipants, RemoteProtocolError
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.testing.harness import Harness
from fedproto.transports.memory import MemoryNetwork

RNG = np.random.default_rng(1234)
BLOBS = normalize(
    np.concatenate([RNG.normal(c, 0.3, size=(60, 3)) for c in ((0, 0, 0), (3, 3, 0), (0, 3, 3), (3, 0, 3))])
)


def build(config, x, n_clients, *, split_seed=0, noise_seed=0, entropy_seed=0, order=None, scheme="iid"):
    parts = partition(len(x), n_clients, scheme=scheme, seed=split_seed)
    clients = [f"client-{i}" for i in range(n_clients)]
    # every machine in the run's session (3): a server left at the default would be refused
    machines = {"server": FastLloydServer("server", config=config, clients=clients, noise_seed=noise_seed, session=3)}
    ent = np.random.default_rng(entropy_seed)
    for i, c in enumerate(clients):
        machines[c] = FastLloydClient(
            c, config=config, server="server", clients=clients, points=x[parts[i]], entropy=ent.bytes(32), session=3
        )
    if order is not None:
        machines = {p: machines[p] for p in order}
    return machines


def run(config, x, n_clients, **kw):
    machines = build(config, x, n_clients, **kw)
    harness = Harness(machines, session=3)
    results = harness.run()
    report = harness.meter.report(protocol="fastlloyd", transport="harness", session=3, parties=list(machines))
    return results, report


def centralised(x, init, iterations, radius=math.inf):
    """Reference: radius-constrained Lloyd's on the pooled data (pure NumPy)."""
    c = np.array(init, dtype=np.float64)
    for _ in range(iterations):
        d2 = ((x[:, None, :] - c[None, :, :]) ** 2).sum(-1)
        j = d2.argmin(1)
        keep = np.sqrt(d2[np.arange(len(x)), j]) < radius
        new = c.copy()
        for cl in range(len(c)):
            members = x[keep & (j == cl)]
            if len(members):
                new[cl] = members.mean(0)
        c = new
    return c


def noise_free(config: FastLloydConfig, **changes) -> FastLloydConfig:
    return dataclasses.replace(config, noise="none", **changes)


@pytest.mark.parametrize("n_clients", [1, 2, 3, 8])
def test_noise_off_absolute_equals_centralised_lloyd(n_clients):
    config = make_config("lloyd", n=len(BLOBS), k=4, d=3, iterations=6, init_seed=5)
    results, _ = run(config, BLOBS, n_clients)
    expected = centralised(BLOBS, initial_centroids(config), 6)
    got = results["client-0"].centroids
    # fixed point: each client rounds each sum coordinate by at most 2^-17
    assert np.max(np.abs(got - expected)) <= n_clients * 2.0**-17 + 1e-12


@pytest.mark.parametrize("n_clients", [2, 5])
def test_noise_off_relative_sums_without_radius_equal_centralised_lloyd(n_clients):
    base = make_config("fastlloyd", n=len(BLOBS), k=4, d=3, epsilon=1.0, iterations=5, init_seed=2)
    config = noise_free(base, radii=(math.inf,) * 5, clip=False, post="none")
    results, _ = run(config, BLOBS, n_clients)
    expected = centralised(BLOBS, initial_centroids(config), 5)
    np.testing.assert_allclose(results["client-0"].centroids, expected, atol=1e-3)


def test_noise_off_with_radius_equals_centralised_radius_constrained_lloyd():
    base = make_config("fastlloyd", n=len(BLOBS), k=4, d=3, epsilon=1.0, iterations=4, init_seed=7)
    config = noise_free(base, clip=False, post="none")
    results, _ = run(config, BLOBS, 3)
    c = initial_centroids(config)
    for t in range(4):
        c = centralised(BLOBS, c, 1, radius=config.radii[t])
    np.testing.assert_allclose(results["client-1"].centroids, c, atol=1e-3)
    assert results["client-1"].unassigned.shape == (4,)


def test_noise_off_is_invariant_to_split_and_client_order():
    config = noise_free(make_config("fastlloyd", n=len(BLOBS), k=4, d=3, epsilon=1.0, iterations=4))
    a, _ = run(config, BLOBS, 4, split_seed=0)
    b, _ = run(config, BLOBS, 4, split_seed=9, scheme="uneven")
    order = ["client-3", "client-1", "server", "client-0", "client-2"]
    c, _ = run(config, BLOBS, 4, split_seed=0, order=order)
    np.testing.assert_allclose(a["client-0"].centroids, b["client-0"].centroids, atol=1e-3)
    np.testing.assert_array_equal(a["client-0"].centroids, c["client-0"].centroids)


def test_same_seeds_same_centroids_and_entropy_does_not_matter():
    config = make_config("fastlloyd", n=len(BLOBS), k=4, d=3, epsilon=0.5)
    a, ra = run(config, BLOBS, 3, entropy_seed=1)
    b, rb = run(config, BLOBS, 3, entropy_seed=2)  # other keys and masks: they cancel exactly
    np.testing.assert_array_equal(a["client-0"].centroids, b["client-0"].centroids)
    assert ra.payload_bytes == rb.payload_bytes
    for c in ("client-1", "client-2"):
        np.testing.assert_array_equal(a[c].centroids, a["client-0"].centroids)
    other, _ = run(config, BLOBS, 3, noise_seed=1)
    assert not np.array_equal(other["client-0"].centroids, a["client-0"].centroids)


@pytest.mark.parametrize(("n_clients", "k", "d"), [(2, 2, 2), (3, 4, 3), (1, 3, 5)])
def test_golden_cost(n_clients, k, d):
    """Rounds = T; messages = 2 M T (+ setup); bytes per iteration = 2 M k (d+1) w/8 + envelopes."""
    x = normalize(RNG.normal(size=(90, d)))
    config = make_config("fastlloyd", n=90, k=k, d=d, epsilon=1.0, iterations=3, ring_bits=32)
    _, report = run(config, x, n_clients)
    t = config.iterations
    assert report.algorithm_rounds == t
    iteration_links = [link for link in report.links if not link.phase.startswith("setup")]
    assert sum(link.messages for link in iteration_links) == 2 * n_clients * t
    masked = np.zeros((k, d + 1), np.uint32)
    update_frame = len(encode_frame(MaskedUpdate(masked=masked), session=3, round_idx=0, phase="update"))
    aggregate_frame = len(encode_frame(NoisyAggregate(masked=masked), session=3, round_idx=0, phase="aggregate"))
    raw = k * (d + 1) * 4
    assert update_frame - raw <= 48 and aggregate_frame - raw <= 48
    for round_idx, nbytes in report.bytes_by_round().items():
        assert nbytes == n_clients * (update_frame + aggregate_frame)
        assert nbytes == config.payload_bytes_per_iteration(n_clients) + n_clients * (
            update_frame + aggregate_frame - 2 * raw
        )
    # setup: M public keys, one key roster, one sealed-seed bundle, M-1 relays
    setup = [link for link in report.links if link.phase.startswith("setup")]
    assert sum(link.messages for link in setup) == n_clients + 1 + 1 + (n_clients - 1)
    assert report.communication_rounds == 4 + 2 * t if n_clients > 1 else 3 + 2 * t


def test_ring_64_doubles_the_element_bytes():
    config32 = make_config("lloyd", n=len(BLOBS), k=4, d=3, iterations=2, ring_bits=32)
    config64 = dataclasses.replace(config32, ring_bits=64)
    r32, rep32 = run(config32, BLOBS, 2)
    r64, rep64 = run(config64, BLOBS, 2)
    np.testing.assert_allclose(r32["client-0"].centroids, r64["client-0"].centroids, atol=1e-4)
    per_round32 = rep32.bytes_by_round()[0]
    per_round64 = rep64.bytes_by_round()[0]
    assert per_round64 - per_round32 == config32.payload_bytes_per_iteration(2)


def test_ring_auto_switches_to_64_bits_when_aggregates_could_overflow():
    assert make_config("fastlloyd", n=1000, k=3, d=2, epsilon=1.0).ring_bits == 32
    assert make_config("fastlloyd", n=100_000, k=3, d=2, epsilon=1.0).ring_bits == 64
    with pytest.raises(ValueError, match="64-bit ring"):
        make_config("fastlloyd", n=100_000, k=3, d=2, epsilon=1.0, ring_bits=32)


def test_server_never_sees_unmasked_statistics():
    config = noise_free(make_config("fastlloyd", n=len(BLOBS), k=4, d=3, epsilon=1.0, iterations=2))
    machines = build(config, BLOBS, 2)
    seen = []

    def spy(frame):
        if frame.dest == "server":
            _, message = decode_frame(frame.data)
            if isinstance(message, MaskedUpdate):
                seen.append(message.masked)
        return frame.data

    Harness(machines, tamper=spy, session=3).run()
    assert len(seen) == 4
    # an unmasked update would have small encoded counts (< number of points) in column d
    for masked in seen:
        assert np.max(masked[:, -1]) > 10 * len(BLOBS)


def test_empirical_noise_std_matches_calibration():
    """Oracle 19: decoded server noise has mean ~0 and std within 1% (>= 1e5 draws)."""
    k, d, rounds = 50, 20, 100  # 1e5 sum coordinates, 5e3 counts
    config = FastLloydConfig(
        "glloyd", k, d, rounds, (math.inf,) * rounds, False, False, "none", "gaussian",
        (3.0,) * rounds, (7.0,) * rounds, ring_bits=64,
    )
    server = FastLloydServer("server", config=config, clients=["c"], noise_seed=11)
    sums, counts = [], []
    for t in range(rounds):
        server.round_idx = t
        noise = server._noise()
        sums.append(secagg.decode_fixed(noise[:, :d], frac_bits=16, ring_bits=64))
        counts.append(secagg.decode_fixed(noise[:, d], frac_bits=0, ring_bits=64))
    sums = np.concatenate(sums).ravel()
    counts = np.concatenate(counts)
    n = sums.size
    # std of the sample std is about sigma / sqrt(2n): 1% is > 4 standard errors at n = 1e5
    assert abs(sums.std() / 3.0 - 1) < 0.01
    assert abs(sums.mean()) < 5 * 3.0 / math.sqrt(n)
    # counts are rounded to integers: variance sigma^2 + 1/12
    assert abs(counts.std() / math.sqrt(49 + 1 / 12) - 1) < 5 / math.sqrt(2 * counts.size)


def tampering(message_cls, applies, forge):
    """A Harness ``tamper``: a frame carrying a ``message_cls`` for which ``applies(frame)`` holds
    is replaced by ``forge(message)`` (frame bytes); every other frame passes as it is."""

    def tamper(frame):
        _, message = decode_frame(frame.data)
        if isinstance(message, message_cls) and applies(frame):
            return forge(message)
        return frame.data

    return tamper


def test_wrong_shape_update_is_rejected_naming_the_client():
    config = make_config("fastlloyd", n=len(BLOBS), k=4, d=3, epsilon=1.0)
    machines = build(config, BLOBS, 2)

    bad = tampering(MaskedUpdate, lambda frame: frame.sender == "client-1", lambda message: encode_frame(
        MaskedUpdate(masked=np.zeros((4, 3), np.uint32)), session=3, round_idx=0, phase="update"))

    with pytest.raises(RemoteProtocolError) as info:
        Harness(machines, tamper=bad, session=3).run()
    assert info.value.party == "client-1" and "shape" in str(info.value)
    assert machines["server"].failed


def test_tampered_sealed_seed_is_detected():
    config = make_config("fastlloyd", n=len(BLOBS), k=4, d=3, epsilon=1.0)
    machines = build(config, BLOBS, 3)

    def flipped(message):
        sealed = bytes([message.sealed[0] ^ 1]) + message.sealed[1:]
        return encode_frame(SealedSeed(sender_key=message.sender_key, sealed=sealed), session=3, round_idx=0, phase="setup.relay")

    flip = tampering(SealedSeed, lambda frame: frame.dest == "client-2", flipped)

    with pytest.raises(RemoteProtocolError, match="does not open"):
        Harness(machines, tamper=flip, session=3).run()


def test_client_input_validation():
    config = make_config("fastlloyd", n=len(BLOBS), k=4, d=3, epsilon=1.0)
    kw = dict(config=config, server="server", clients=["a"], entropy=bytes(32))
    with pytest.raises(ValueError, match="shape"):
        FastLloydClient("a", points=np.zeros((3, 2)), **kw)
    with pytest.raises(ValueError, match="NaN"):
        FastLloydClient("a", points=np.full((3, 3), np.nan), **kw)
    with pytest.raises(ValueError, match="domain"):
        FastLloydClient("a", points=np.full((3, 3), 2.0), **kw)
    with pytest.raises(ValueError, match="entropy"):
        FastLloydClient("a", points=np.zeros((3, 3)), config=config, server="server", clients=["a"], entropy=b"short")
    with pytest.raises(ValueError, match="k = 9"):
        make_config("fastlloyd", n=8, k=9, d=3, epsilon=1.0)
    with pytest.raises(ValueError, match="positive epsilon"):
        make_config("glloyd", n=80, k=2, d=3, epsilon=0.0)


def test_client_with_no_points_still_participates():
    config = noise_free(make_config("lloyd", n=len(BLOBS), k=4, d=3, iterations=3))
    clients = ["client-0", "client-1"]
    machines = {
        "server": FastLloydServer("server", config=config, clients=clients),
        "client-0": FastLloydClient("client-0", config=config, server="server", clients=clients,
                                    points=BLOBS, entropy=bytes(32)),
        "client-1": FastLloydClient("client-1", config=config, server="server", clients=clients,
                                    points=np.zeros((0, 3)), entropy=bytes(range(32))),
    }
    results = Harness(machines).run()
    expected = centralised(BLOBS, initial_centroids(config), 3)
    assert np.max(np.abs(results["client-1"].centroids - expected)) <= 2 * 2.0**-17 + 1e-12


async def test_silent_client_makes_the_server_fail_naming_it(autojump_clock):
    config = make_config("fastlloyd", n=len(BLOBS), k=4, d=3, epsilon=1.0)
    machines = build(config, BLOBS, 3)
    network = MemoryNetwork(list(machines))
    del machines["client-2"]
    with pytest.raises(InsufficientParticipants) as info:
        await run_parties(machines, network, config=RuntimeConfig(session=3, deadline_s=20))
    assert info.value.missing == ("client-2",)


async def test_memory_transport_run_equals_harness_run():
    config = make_config("fastlloyd", n=len(BLOBS), k=4, d=3, epsilon=1.0)
    expected, report = run(config, BLOBS, 3)
    machines = build(config, BLOBS, 3)
    network = MemoryNetwork(list(machines))
    meter = Meter(trio.current_time)
    results = await run_parties(machines, network, config=RuntimeConfig(session=3), meter=meter)
    np.testing.assert_array_equal(results["client-0"].centroids, expected["client-0"].centroids)
    ours = meter.report(protocol="fastlloyd", transport="memory", session=3, parties=list(machines))
    assert ours.links == report.links


def test_fastlloyd_beats_nothing_and_stays_in_domain():
    """With a large budget FastLloyd's NICV approaches non-private Lloyd's on separated blobs."""
    config = make_config("fastlloyd", n=len(BLOBS), k=4, d=3, epsilon=50.0, iterations=7)
    results, _ = run(config, BLOBS, 2)
    c = results["client-0"].centroids
    assert np.all(np.abs(c) <= 1.0)
    lloyd = centralised(BLOBS, initial_centroids(config), 7)
    assert float(kmeans.nicv(BLOBS, c)) < 1.5 * float(kmeans.nicv(BLOBS, lloyd))

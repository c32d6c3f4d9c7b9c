"""A machine whose session is not the run's fails at once, naming it (issue 34, target 4).

The bug: a FastLloyd server built through the Python API without ``session`` (so session 0), its
clients with the run's session, ran over the memory transport and gave wrong centroids with no
error (with SecAgg+ the server derives another graph from its session than the clients). The
rule (:func:`fedproto.machine.check_sessions`): a machine that declares a session (its ``session``
attribute) must declare the run's (``RuntimeConfig.session``), checked by the runtime, the lean
engine and the harness before any frame; across processes each party's machine and endpoint are
checked against its own runtime, and a peer of another session has its frames refused, naming it.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import trio

from fedproto.algorithms.fastlloyd.config import FastLloydOptions
from fedproto.algorithms.fastlloyd.protocol import FastLloydClient, FastLloydServer
from fedproto.data import normalize, partition
from fedproto.errors import AgreementMismatch, InsufficientParticipants, SessionMismatch
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties, run_party
from fedproto.simulation import simulate
from fedproto.testing.harness import Harness
from fedproto.transports.memory import MemoryNetwork
from fedproto.transports.tcp import TcpAddress, TcpNetwork, TcpTransport

RNG = np.random.default_rng(34)
BLOBS = normalize(np.concatenate([RNG.normal(c, 0.4, size=(40, 2)) for c in ((0, 0), (4, 0), (0, 4))]))
SESSION = 41
CLIENTS = [f"client-{i}" for i in range(5)]
# SecAgg+ (the run): its graph is seeded with the session, so a session off by one
# changes the masks each party expects.
OPTIONS = FastLloydOptions(variant="lloyd", k=3, iterations=2, secagg="plus")


def _machines(server_session=SESSION, client_sessions=None):
    """The issue's machines; ``server_session=None`` builds the server without ``session``."""
    sessions = dict.fromkeys(CLIENTS, SESSION) | (client_sessions or {})
    kw = {} if server_session is None else {"session": server_session}
    machines = {"server": FastLloydServer("server", options=OPTIONS, clients=CLIENTS, noise_seed=5, **kw)}
    parts = partition(len(BLOBS), len(CLIENTS), scheme="iid", seed=0)
    for i, name in enumerate(CLIENTS):
        machines[name] = FastLloydClient(
            name, options=OPTIONS, server="server", clients=CLIENTS, points=BLOBS[parts[i]],
            entropy=bytes([i + 1]) * 32, session=sessions[name],
        )
    return machines


def _sent_frames(meter: Meter) -> int:
    return sum(count for count, _ in meter.sent.values())


# --- (a) the issue: a server built without a session ------------------------------------------


async def test_a_server_built_without_session_fails_at_once_naming_it_over_memory():
    machines = _machines(server_session=None)
    meter = Meter(trio.current_time)
    with pytest.raises(SessionMismatch) as info:
        await run_parties(machines, MemoryNetwork(list(machines)), config=RuntimeConfig(session=SESSION), meter=meter)
    error = info.value
    assert (error.party, error.parties, error.session, error.expected) == ("server", ("server",), 0, SESSION)
    assert str(error).startswith(
        "server's machine is session 0 (the default of a machine built without session=), but the run is session 41"
    ), error
    assert isinstance(error, AgreementMismatch) and isinstance(error, ValueError)
    assert _sent_frames(meter) == 0 and meter.rejected_frames == 0  # before any frame: no centroids
    assert not any(m.done for m in machines.values())


async def test_with_the_servers_session_given_the_same_run_completes_and_the_clients_agree():
    machines = _machines()
    results = await run_parties(machines, MemoryNetwork(list(machines)), config=RuntimeConfig(session=SESSION))
    centroids = [results[c].centroids for c in CLIENTS]
    assert all(np.array_equal(centroids[0], other) for other in centroids[1:])


def test_the_lean_engine_fails_the_same_way():
    machines = _machines(server_session=None)
    meter = Meter()
    with pytest.raises(SessionMismatch, match=r"^server's machine is session 0 .* the run is session 41") as info:
        simulate(machines, config=RuntimeConfig(session=SESSION), meter=meter)
    assert info.value.party == "server"
    assert _sent_frames(meter) == 0
    # the link-model path checks too
    from fedproto.netmodel import LinkModel

    with pytest.raises(SessionMismatch, match="server's machine"):
        simulate(_machines(server_session=None), config=RuntimeConfig(session=SESSION), network=LinkModel())


# --- (b, c) a client with another session than the rest ---------------------------------------


async def test_a_client_of_another_session_fails_naming_it_over_memory():
    machines = _machines(client_sessions={"client-3": SESSION + 1})
    with pytest.raises(SessionMismatch) as info:
        await run_parties(machines, MemoryNetwork(list(machines)), config=RuntimeConfig(session=SESSION))
    assert info.value.party == "client-3" and info.value.parties == ("client-3",)
    assert info.value.session == SESSION + 1
    assert str(info.value).startswith("client-3's machine is session 42, but the run is session 41"), info.value


async def test_a_client_of_another_session_fails_naming_it_over_tcp():
    machines = _machines(client_sessions={"client-3": SESSION + 1})
    network = TcpNetwork(insecure_shared_secret=True, session=SESSION)
    with trio.fail_after(30):
        with pytest.raises(SessionMismatch) as info:
            await run_parties(machines, network, config=RuntimeConfig(session=SESSION))
    assert info.value.party == "client-3"
    assert "client-3's machine is session 42, but the run is session 41" in str(info.value)


async def test_tcp_endpoints_of_another_session_than_the_runtime_fail_naming_them():
    """A TCP endpoint carries its own (handshake) session: run_parties refuses endpoints whose
    session is not the runtime's, before any task starts (built here, never opened)."""
    machines = _machines()
    roster = tuple(machines)
    addresses = {p: TcpAddress("127.0.0.1", 0) for p in roster}
    endpoints = {p: TcpTransport(p, roster, addresses, b"0123456789abcdef-run-secret", session=SESSION - 1)
                 for p in roster}
    with pytest.raises(SessionMismatch) as info:
        await run_parties(machines, endpoints, config=RuntimeConfig(session=SESSION))
    assert info.value.party == "server" and info.value.parties == roster
    said = str(info.value)
    assert "client-4's endpoints are session 40, but the run is session 41" in said, said
    assert "open every endpoint with the run's session" in said, said
    assert not any(m.done for m in machines.values())


async def test_run_party_checks_its_own_machine_and_endpoint():
    machines = _machines(client_sessions={"client-3": SESSION + 1})
    network = MemoryNetwork(list(machines))
    with pytest.raises(SessionMismatch, match="^client-3's machine is session 42, but the run is session 41"):
        await run_party(machines["client-3"], network.endpoint("client-3"), config=RuntimeConfig(session=SESSION))
    endpoint = network.endpoint("server")
    endpoint.session = SESSION + 2  # as an endpoint of a transport with a session of its own declares it
    with pytest.raises(SessionMismatch, match="^server's endpoint is session 43, but the run is session 41"):
        await run_party(machines["server"], endpoint, config=RuntimeConfig(session=SESSION))


def test_the_lean_engine_names_the_client():
    with pytest.raises(SessionMismatch, match=r"^client-3's machine is session 42, but the run is session 41"):
        simulate(_machines(client_sessions={"client-3": SESSION + 1}), config=RuntimeConfig(session=SESSION))


def test_machines_of_one_session_in_a_run_left_at_the_default_are_told_so():
    with pytest.raises(SessionMismatch) as info:
        simulate(_machines())  # RuntimeConfig() is session 0
    assert info.value.parties == ("server", *CLIENTS)
    assert "but the run is session 0 (RuntimeConfig.session): every machine is session 41" in str(info.value)


def test_the_harness_checks_too():
    with pytest.raises(SessionMismatch, match="server's machine is session 0"):
        Harness(_machines(server_session=None), session=SESSION)


def test_many_parties_are_named_up_to_ten_and_counted():
    many = [f"client-{i}" for i in range(13)]

    class Declares:
        def __init__(self, party, session):
            self.party, self.session = party, session

    from fedproto.machine import check_sessions

    with pytest.raises(SessionMismatch) as info:
        check_sessions({p: Declares(p, 7) for p in many} | {"server": Declares("server", 8)}, 8)
    assert "client-9 and 3 more's machines are session 7" in str(info.value)
    assert len(info.value.parties) == 13
    check_sessions({"x": Declares("x", 8), "y": object()}, 8)  # no session attribute: not checked


# --- across processes: each runtime checks its own machine; a peer's frames are refused --------


async def test_a_peer_whose_runtime_has_another_session_is_named_by_the_receiver(caplog, autojump_clock):
    """client-3's process is consistent (machine and runtime session 42), the others are session
    41: the server refuses client-3's frames, naming it and both sessions (frames of another
    session are refused, not fatal: a stale frame of an earlier run must not end this one), and
    at its deadline ends naming client-3 and the session its frames had."""
    machines = _machines(client_sessions={"client-3": SESSION + 1})
    network = MemoryNetwork(list(machines))
    meter = Meter(trio.current_time)
    ended: dict[str, BaseException | object] = {}

    async def one(party):
        session = SESSION + 1 if party == "client-3" else SESSION
        try:
            ended[party] = await run_party(
                machines[party], network.endpoint(party), config=RuntimeConfig(session=session, deadline_s=5),
                meter=meter,
            )
        except Exception as exc:  # noqa: BLE001 - what each party ended with is the point
            ended[party] = exc

    with caplog.at_level(logging.WARNING, logger="fedproto.runtime"):
        async with trio.open_nursery() as nursery:
            for party in machines:
                nursery.start_soon(one, party)
    server = ended["server"]
    assert isinstance(server, InsufficientParticipants) and server.missing == ("client-3",), server
    # the error says why client-3 was silent, not only that it was
    assert "client-3 sent frames of session 42, refused: this run is session 41" in str(server), server
    assert isinstance(server.__cause__, InsufficientParticipants)
    # the other clients hear it from the server, with the reason
    assert "client-3 sent frames of session 42" in str(ended["client-0"]), ended["client-0"]
    refused = [r for r in meter.rejected if r["cause"] == "frame of another session"]
    assert refused and {r["sender"] for r in refused if "session 42, this run is session 41" in r["reason"]} == {
        "client-3"
    }
    assert any(
        "server refused a frame from client-3: frame of session 42, this run is session 41" in r.getMessage()
        for r in caplog.records
    )
    assert all(isinstance(outcome, Exception) for outcome in ended.values()), ended  # no centroids anywhere

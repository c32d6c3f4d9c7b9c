"""Live TCP parties under faults (issue 14): malformed frames, a party that dies, a busy party, a flood.

Three parties over real loopback sockets in real time: an authenticated peer's malformed frames
are refused and the run completes; when a client's endpoint closes mid-run, every survivor fails
within one deadline naming it; answers that reach a coordinator's socket while its event loop is
blocked for longer than the deadline are read before the deadline counts (workers in another
thread, with their own event loop); a flood of refused connections makes a handful of log lines,
with the count; what a hub writes to a stranger it refuses is counted in ``refused_bytes``, and
its ``handshake_bytes`` stay those of a clean run.
"""

from __future__ import annotations

import logging
import socket
import time

import msgpack
import numpy as np
import trio

from fedproto.errors import InsufficientParticipants, PartyCrashed, RunAborted
from fedproto.messages import Message, array_field
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties, run_party
from fedproto.testing.toy import SumCoordinator, SumWorker
from fedproto.testing import DelegatingTransport, run_each_party
from fedproto.transports._framing import FRAMING_OVERHEAD_BYTES, FrameReader, send_frame
from fedproto.transports.tcp import (
    STAR_HANDSHAKE_VERSION,
    TcpTransport,
    open_tcp_network,
    roster_digest,
)

ROSTER = ("c", "w0", "w1")
SECRET = b"0123456789abcdef-hardening-secret"
TCP_LOGGER = "fedproto.transports.tcp"


def make(rounds=3, dim=3):
    machines = {"c": SumCoordinator("c", workers=["w0", "w1"], rounds=rounds, dim=dim)}
    for i, w in enumerate(("w0", "w1")):
        machines[w] = SumWorker(w, coordinator="c", values=np.arange(dim) + i)
    return machines


class Grid(Message, tag="test.tcp_hardening.grid"):
    """A message with a 2-D array, the shape of issue 14's decoder-crashing frame."""

    cells: np.ndarray = array_field("uint32", 2)


async def test_malformed_frames_from_an_authenticated_peer_are_refused_and_the_run_completes():
    machines = make()
    malformed = [
        np.random.default_rng(14).bytes(512),  # random bytes
        msgpack.packb({"v": 1, "t": Grid.TAG, "s": 0, "r": 0, "p": "x", "b": [["u4", [0, 2**63], b""]]}),
        b"",
        msgpack.packb({"v": 1, "t": "toy.contrib", "s": 0, "r": 0, "p": "answer", "b": [["f8", [4], b"\0"]]}),
    ]
    meter = Meter(trio.current_time)
    with trio.fail_after(60):
        async with open_tcp_network(ROSTER, SECRET) as endpoints:
            for frame in malformed:  # w1 is authenticated: its frames reach c's runtime
                await endpoints["w1"].send("c", frame)
            results = await run_parties(machines, endpoints, config=RuntimeConfig(deadline_s=20.0), meter=meter)
    total = sum(np.arange(3) + i for i in range(2))
    np.testing.assert_array_equal(results["c"], np.stack([total * (r + 1) for r in range(3)]))
    assert results["w0"] == results["w1"] == 3
    assert meter.rejected_frames == len(malformed)
    assert {r["sender"] for r in meter.rejected} == {"w1"}




async def _stranger_without_the_secret(address) -> None:
    """Dial the hub with a correct hello but a wrong proof, as one without the run's secret would."""
    stream = await trio.open_tcp_stream(address.host, address.port)
    try:
        hello = [STAR_HANDSHAKE_VERSION, 0, roster_digest(ROSTER), "w0", "c", b"n" * 32]
        await send_frame(stream, msgpack.packb(hello, use_bin_type=True))
        await FrameReader(stream).receive_frame(1024)  # the hub's challenge: its nonce and MAC
        await send_frame(stream, msgpack.packb([b"wrong proof".ljust(32), b"link-id!", 0], use_bin_type=True))
        try:
            while await stream.receive_some():  # until the hub closes it: refused
                pass
        except trio.BrokenResourceError:
            pass
    finally:
        await stream.aclose()


async def _toy_run_over_a_star(stranger: bool) -> tuple[dict[str, TcpTransport], Meter]:
    meter = Meter(trio.current_time)
    with trio.fail_after(60):
        async with open_tcp_network(ROSTER, SECRET, topology="star") as endpoints:
            if stranger:
                await _stranger_without_the_secret(endpoints["c"].addresses["c"])
            results = await run_parties(make(), endpoints, config=RuntimeConfig(deadline_s=20.0), meter=meter)
    assert results["w0"] == results["w1"] == 3
    for endpoint in endpoints.values():  # closed: their counts are final
        meter.record_connection_bytes(handshake_bytes=endpoint.handshake_bytes, refused_bytes=endpoint.refused_bytes)
    return endpoints, meter


async def test_what_a_hub_writes_to_a_refused_stranger_is_refused_bytes_not_handshake_bytes():
    clean, clean_meter = await _toy_run_over_a_star(stranger=False)
    attacked, attacked_meter = await _toy_run_over_a_star(stranger=True)
    # the hub wrote its challenge (a 32-byte nonce and a 32-byte MAC) before the wrong proof came
    challenge = FRAMING_OVERHEAD_BYTES + len(msgpack.packb([b"n" * 32, b"m" * 32], use_bin_type=True))
    assert attacked["c"].refused_bytes == challenge
    assert all(clean[p].refused_bytes == 0 for p in ROSTER)
    assert all(attacked[p].handshake_bytes == clean[p].handshake_bytes > 0 for p in ROSTER)
    report = attacked_meter.report(protocol="toy", transport="tcp", session=0, parties=ROSTER)
    clean_report = clean_meter.report(protocol="toy", transport="tcp", session=0, parties=ROSTER)
    assert (report.refused_bytes, report.handshake_bytes) == (challenge, clean_report.handshake_bytes)
    assert clean_report.refused_bytes == 0


class ClosesAfter(DelegatingTransport):
    """Closes its TCP endpoint when it tries to send frame ``n + 1``, as a killed process would."""

    def __init__(self, inner, n):
        super().__init__(inner)
        self.n, self.sent = n, 0
        self.closed_at: float | None = None

    async def send(self, dest, frame):
        if self.sent >= self.n:
            self.closed_at = trio.current_time()
            await self.inner.aclose()
            raise PartyCrashed(f"{self.party} closed its endpoint", party=self.party)
        self.sent += 1
        await self.inner.send(dest, frame)


async def test_a_client_closed_mid_run_is_named_by_every_survivor_within_one_deadline():
    deadline_s = 3.0
    machines = make()
    config = RuntimeConfig(deadline_s=deadline_s)
    with trio.fail_after(60):
        async with open_tcp_network(ROSTER, SECRET) as endpoints:
            dying = ClosesAfter(endpoints["w1"], n=1)  # answers round 0, dies answering round 1
            transports = {**endpoints, "w1": dying}

            outcomes = await run_each_party(machines, transports, config, order=ROSTER)
    assert isinstance(outcomes["w1"][1], PartyCrashed) and dying.closed_at is not None
    ended, error = outcomes["c"]
    assert isinstance(error, InsufficientParticipants) and error.missing == ("w1",), error
    assert ended - dying.closed_at < deadline_s + 1.5  # its deadline, then at most 1 s telling
    ended, error = outcomes["w0"]
    # w0 is told by c and names w1, instead of timing out after 2 deadlines blaming c
    assert isinstance(error, RunAborted), error
    assert error.culprits == ("w1",) and error.reporter == "c" and "w1" in str(error)
    assert ended - dying.closed_at < deadline_s + 1.0


async def test_a_flood_of_refused_connections_makes_a_handful_of_lines(caplog):
    caplog.set_level(logging.WARNING, logger=TCP_LOGGER)
    n_connections = 40
    with trio.fail_after(60):
        async with open_tcp_network(("alice", "bob"), SECRET) as endpoints:
            address = endpoints["alice"].addresses["alice"]
            for i in range(n_connections):
                stream = await trio.open_tcp_stream(address.host, address.port)
                await send_frame(stream, b"\xc1 not a hello %d" % i)
                try:
                    while await stream.receive_some():  # until alice closes it: refused
                        pass
                except trio.BrokenResourceError:
                    pass
                await stream.aclose()
            during = [r.getMessage() for r in caplog.records if r.name == TCP_LOGGER]
        after = [r.getMessage() for r in caplog.records if r.name == TCP_LOGGER]
    assert len(during) == 1 and "refused connection from 127.0.0.1" in during[0], during
    assert len(after) == 2, after  # closing alice writes the held-back count
    assert f"alice: refused {n_connections - 1} more (connection at the handshake) from 127.0.0.1" in after[1]
    assert "malformed hello" in after[1]


class BlocksOnFrame(DelegatingTransport):
    """Blocks the whole event loop for ``busy_s`` on its ``n``-th received frame (CPU-bound work)."""

    def __init__(self, inner, n, busy_s):
        super().__init__(inner)
        self.block_on, self.busy_s, self.received = n, busy_s, 0

    async def receive(self):
        frame = await self.inner.receive()
        self.received += 1
        if self.received == self.block_on:
            time.sleep(self.busy_s)  # no reader task runs meanwhile: frames pile up in the kernel
        return frame


def listening_socket():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


async def test_frames_in_the_kernel_while_the_loop_was_blocked_are_read_before_the_deadline():
    """Issue 14 part 6 over TCP: the workers run in another thread (their own event loop), so
    their answers reach the coordinator's socket while its event loop is blocked; once it is free,
    those answers are read, and nobody is blamed."""
    deadline_s = 2.0
    machines = make(rounds=3)
    sockets = {p: listening_socket() for p in ROSTER}
    addresses = {p: f"127.0.0.1:{s.getsockname()[1]}" for p, s in sockets.items()}
    config = RuntimeConfig(deadline_s=deadline_s)

    def endpoint(party):
        return TcpTransport(party, ROSTER, addresses, SECRET, listen_socket=sockets[party])

    async def workers():
        results = {}
        endpoints = {w: endpoint(w) for w in ("w0", "w1")}
        async with trio.open_nursery() as nursery:
            for e in endpoints.values():
                await nursery.start(e.serve)

            async def one(w):
                results[w] = await run_party(machines[w], endpoints[w], config=config)

            try:
                async with trio.open_nursery() as parties:
                    for w in endpoints:
                        parties.start_soon(one, w)
            finally:
                for e in endpoints.values():
                    await e.aclose()
        return results

    with trio.fail_after(60):
        coordinator = endpoint("c")
        async with trio.open_nursery() as nursery:
            await nursery.start(coordinator.serve)
            results = {}

            async def run_workers():
                results.update(await trio.to_thread.run_sync(trio.run, workers))

            nursery.start_soon(run_workers)
            # frame 3 is the first answer of round 1: connections are up, the other answer is
            # written to the socket while this loop is blocked for longer than the deadline
            # (1.25 deadlines: longer than the coordinator's deadline, well within the workers' 2)
            busy = BlocksOnFrame(coordinator, n=3, busy_s=1.25 * deadline_s)
            try:
                total = await run_party(machines["c"], busy, config=config)
            finally:
                await coordinator.aclose()  # also stops serving, so the nursery can end
    sums = sum(np.arange(3) + i for i in range(2))
    np.testing.assert_array_equal(total, np.stack([sums * (r + 1) for r in range(3)]))
    assert results == {"w0": 3, "w1": 3}


async def test_a_port_in_use_is_refused_with_the_os_reason():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        port = holder.getsockname()[1]
        addresses = {"c": f"127.0.0.1:{port}", "w0": "127.0.0.1:1", "w1": "127.0.0.1:2"}
        endpoint = TcpTransport("c", ROSTER, addresses, SECRET)
        try:
            await endpoint.serve()
        except Exception as exc:  # noqa: BLE001 - the assertion names what is expected
            text = str(exc)
        else:
            raise AssertionError("serve() bound a port that is in use")
        finally:
            await endpoint.aclose()
    finally:
        holder.close()
    assert f"c cannot listen on 127.0.0.1:{port}: Address already in use" in text

"""The TCP transport: framing, conformance, the authenticated handshake, dialling and closing."""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager

import msgpack
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from fedproto.errors import DecodeError, PeerUnreachable, TransportBroken, TransportClosed
from fedproto.testing.conformance import run_conformance
from fedproto.transports._framing import (
    FRAMING_OVERHEAD_BYTES,
    FrameReader,
    FrameTooLarge,
    receive_frame,
    send_frame,
)
from fedproto.transports.tcp import (
    HANDSHAKE_VERSION,
    TcpAddress,
    TcpNetwork,
    TcpTransport,
    handshake_mac,
    open_tcp_network,
    roster_digest,
)

ROSTER = ("alice", "bob", "carol")
SECRET = b"0123456789abcdef-run-secret"
LOGGER = "fedproto.transports.tcp"


# ------------------------------------------------------------------------------------ framing


class ScriptedStream(trio.abc.ReceiveStream):
    """Returns the scripted chunks (split further by max_bytes), then EOF or an error."""

    def __init__(self, chunks: Sequence[bytes], *, then: str = "eof") -> None:
        self.chunks = [bytes(c) for c in chunks if c]
        self.then = then
        self.reads = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        self.reads += 1
        if not self.chunks:
            if self.then == "eof":
                return b""
            if self.then == "broken":
                raise trio.BrokenResourceError("connection reset")
            raise AssertionError("the reader read past the length prefix")
        chunk = self.chunks[0]
        take = len(chunk) if max_bytes is None else min(len(chunk), max_bytes)
        if take == len(chunk):
            self.chunks.pop(0)
        else:
            self.chunks[0] = chunk[take:]
        return chunk[:take]

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


class RecordingStream(trio.abc.SendStream):
    def __init__(self) -> None:
        self.data = bytearray()
        self.calls = 0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        self.calls += 1
        self.data += data

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def wire(*frames: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(f)) + f for f in frames)


async def read_all(
    stream: trio.abc.ReceiveStream, *, buffered: bool, max_frame_bytes: int = 1 << 24
) -> list[bytes]:
    reader = FrameReader(stream)
    frames = []
    while True:
        try:
            if buffered:
                frames.append(await reader.receive_frame(max_frame_bytes))
            else:
                frames.append(await receive_frame(stream, max_frame_bytes))
        except trio.EndOfChannel:
            return frames


@settings(max_examples=60, deadline=None)
@given(
    frames=st.lists(st.binary(max_size=300), max_size=8),
    cuts=st.lists(st.integers(min_value=1, max_value=40), max_size=50),
    buffered=st.booleans(),
)
def test_framing_round_trips_under_any_chunking(frames: list[bytes], cuts: list[int], buffered: bool) -> None:
    async def main() -> None:
        out = RecordingStream()
        for frame in frames:
            await send_frame(out, frame)
        data = bytes(out.data)
        assert data == wire(*frames)
        chunks, at = [], 0
        for cut in cuts:
            chunks.append(data[at : at + cut])
            at += cut
        chunks.append(data[at:])
        assert await read_all(ScriptedStream(chunks), buffered=buffered) == frames

    trio.run(main)


@pytest.mark.parametrize("buffered", [True, False])
async def test_framing_one_byte_at_a_time_and_large_frames(buffered: bool) -> None:
    frames = [b"", b"a", bytes(range(256)) * 3, b""]
    data = wire(*frames)
    one_byte_chunks = [data[i : i + 1] for i in range(len(data))]
    assert await read_all(ScriptedStream(one_byte_chunks), buffered=buffered) == frames
    big = bytes(range(256)) * 20_000  # 5 MB: several reads per body
    assert await read_all(ScriptedStream([wire(big, b"tail")]), buffered=buffered) == [big, b"tail"]


async def test_buffered_reader_reads_many_small_frames_at_once() -> None:
    frames = [bytes([i]) * 10 for i in range(100)]
    stream = ScriptedStream([wire(*frames)])
    assert await read_all(stream, buffered=True) == frames
    assert stream.reads == 2  # one chunk with every frame, then EOF


async def test_send_frame_coalesces_small_frames_and_reports_overhead() -> None:
    out = RecordingStream()
    await send_frame(out, b"abc")
    assert out.calls == 1 and bytes(out.data) == b"\x00\x00\x00\x03abc"
    assert len(out.data) - 3 == FRAMING_OVERHEAD_BYTES
    # A 64 KiB frame, and up to 1 MiB, still goes out in one write (over TLS a separate prefix is
    # a record and a wake-up of its own); a larger one in two, without joining them.
    for length, calls in ((64 * 1024 + 100, 1), (1024 * 1024, 1), (1024 * 1024 + 1, 2)):
        out = RecordingStream()
        await send_frame(out, bytes(length))
        assert (out.calls, len(out.data)) == (calls, FRAMING_OVERHEAD_BYTES + length)


@pytest.mark.parametrize("buffered", [True, False])
@pytest.mark.parametrize("with_body_bytes", [False, True])
async def test_oversized_prefix_is_refused_before_the_body_is_read(
    buffered: bool, with_body_bytes: bool
) -> None:
    prefix = struct.pack(">I", 2_000_000_000)
    stream = ScriptedStream([prefix + (b"body" if with_body_bytes else b"")], then="explode")
    with pytest.raises(FrameTooLarge, match="2000000000 bytes exceeds the maximum of 1000") as info:
        if buffered:
            await FrameReader(stream).receive_frame(1000)
        else:
            await receive_frame(stream, 1000)
    assert isinstance(info.value, DecodeError)
    assert (info.value.length_bytes, info.value.max_frame_bytes) == (2_000_000_000, 1000)
    assert stream.reads == 1


@pytest.mark.parametrize("buffered", [True, False])
async def test_truncated_frames_are_broken(buffered: bool) -> None:
    for data, what in ((b"\x00\x00", "length prefix"), (wire(b"hello")[:-2], "frame")):
        with pytest.raises(TransportBroken, match=f"ended inside a {what}"):
            await read_all(ScriptedStream([data]), buffered=buffered)
    assert await read_all(ScriptedStream([wire(b"whole")]), buffered=buffered) == [b"whole"]
    with pytest.raises(TransportBroken) as info:
        await read_all(ScriptedStream([wire(b"x")[:3]], then="broken"), buffered=buffered)
    assert isinstance(info.value.__cause__, trio.BrokenResourceError)


async def test_send_frame_errors() -> None:
    class Huge:
        def __len__(self) -> int:
            return 2**32

    with pytest.raises(ValueError, match="cannot be framed"):
        await send_frame(RecordingStream(), Huge())  # type: ignore[arg-type]
    left, right = trio.testing.memory_stream_pair()
    await right.aclose()
    with pytest.raises(TransportBroken) as info:
        await send_frame(left, b"x")
    assert isinstance(info.value.__cause__, trio.BrokenResourceError)
    await left.aclose()
    with pytest.raises(TransportClosed):
        await send_frame(left, b"x")


async def test_cancelled_buffered_read_resumes_the_same_frame(autojump_clock: trio.testing.MockClock) -> None:
    left, right = trio.testing.memory_stream_pair()
    reader = FrameReader(right)
    data = wire(b"0123456789" * 1000)
    await left.send_all(data[:5000])
    with trio.move_on_after(1) as scope:
        await reader.receive_frame(1 << 20)
    assert scope.cancelled_caught
    await left.send_all(data[5000:])
    assert await reader.receive_frame(1 << 20) == b"0123456789" * 1000
    await left.aclose()
    await right.aclose()


# ---------------------------------------------------------------------------------- addresses


def test_tcp_address_parse() -> None:
    assert TcpAddress.parse("127.0.0.1:8000") == TcpAddress("127.0.0.1", 8000)
    assert TcpAddress.parse("[::1]:0") == TcpAddress("::1", 0)
    assert TcpAddress.parse(" node-3.example:65535 ") == TcpAddress("node-3.example", 65535)
    assert str(TcpAddress("::1", 9)) == "[::1]:9" and str(TcpAddress("h", 9)) == "h:9"
    for bad in ("nocolon", "host:", ":80", "h:65536", "::1:80", "h:-1", "h:8o", "[::1]80", "[::1"):
        with pytest.raises(ValueError, match="bad address"):
            TcpAddress.parse(bad)
    with pytest.raises(ValueError):
        TcpAddress("h", 70000)
    with pytest.raises(TypeError):
        TcpAddress("h", "80")  # type: ignore[arg-type]


def test_constructor_validates() -> None:
    addresses = {p: TcpAddress("127.0.0.1", 0) for p in ROSTER}
    TcpTransport("alice", ROSTER, {p: "127.0.0.1:0" for p in ROSTER}, SECRET)
    with pytest.raises(ValueError, match="at least 16 bytes"):
        TcpTransport("alice", ROSTER, addresses, b"short")
    with pytest.raises(TypeError, match="must be bytes"):
        TcpTransport("alice", ROSTER, addresses, "a string secret!!")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not in the roster"):
        TcpTransport("mallory", ROSTER, addresses, SECRET)
    with pytest.raises(ValueError, match="no address"):
        TcpTransport("alice", ROSTER, {"alice": addresses["alice"]}, SECRET)
    with pytest.raises(ValueError, match="outside the roster"):
        TcpTransport("alice", ROSTER, {**addresses, "mallory": addresses["alice"]}, SECRET)
    with pytest.raises(ValueError, match="unique"):
        TcpTransport("alice", ("alice", "alice"), addresses, SECRET)
    with pytest.raises(ValueError, match="session"):
        TcpTransport("alice", ROSTER, addresses, SECRET, session=2**64)
    with pytest.raises(ValueError, match="connect_timeout_s"):
        TcpTransport("alice", ROSTER, addresses, SECRET, connect_timeout_s=0)


# -------------------------------------------------------------------------------- conformance


async def test_conformance() -> None:
    async with open_tcp_network(ROSTER, SECRET) as endpoints:
        assert all(ep.framing_overhead_bytes == 4 for ep in endpoints.values())
        await run_conformance(endpoints)
        # Each party dialled 2 peers (hello + proof) and accepted 2 (challenge + ack).
        assert all(300 < ep.handshake_bytes < 1000 for ep in endpoints.values())


async def test_network_in_one_process_and_split_over_two() -> None:
    async with TcpNetwork().endpoints(ROSTER) as endpoints:
        assert all(ep.uses_tls for ep in endpoints.values())  # TLS unless asked otherwise
        await endpoints["alice"].send("carol", b"hi")
        assert await endpoints["carol"].receive() == ("alice", b"hi")
    async with TcpNetwork(insecure_shared_secret=True).endpoints(ROSTER) as endpoints:
        assert not any(ep.uses_tls for ep in endpoints.values())
        await endpoints["alice"].send("carol", b"hi")
        assert await endpoints["carol"].receive() == ("alice", b"hi")
    with reserved_ports(3) as ports:
        addresses = {p: TcpAddress("127.0.0.1", port) for p, port in zip(ROSTER, ports)}
    with pytest.raises(ValueError, match="insecure"):
        TcpNetwork(addresses, SECRET)
    first = TcpNetwork(addresses, SECRET, insecure_shared_secret=True)
    second = TcpNetwork(addresses, SECRET, insecure_shared_secret=True)
    async with (
        first.endpoints(ROSTER, ["alice"]) as mine,
        second.endpoints(ROSTER, ["bob", "carol"]) as theirs,
    ):
        await mine["alice"].send("bob", b"across")
        await theirs["carol"].send("alice", b"back")
        assert await theirs["bob"].receive() == ("alice", b"across")
        assert await mine["alice"].receive() == ("carol", b"back")
    with pytest.raises(ValueError, match="TLS kit"):
        TcpNetwork(addresses)
    with pytest.raises(ValueError, match="needs the run's secret"):
        TcpNetwork(addresses, insecure_shared_secret=True)
    with pytest.raises(ValueError, match="addresses"):
        async with TcpNetwork().endpoints(ROSTER, ["alice"]):
            pass


# --------------------------------------------------------------------------------- handshake


@contextmanager
def reserved_ports(n: int) -> Iterator[list[int]]:
    """Free loopback ports, bound but not listening (connecting to them is refused) until exit."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        yield [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


@asynccontextmanager
async def serving(party: str, **kwargs: object) -> AsyncIterator[TcpTransport]:
    """``party`` serving on a free port; the other parties' ports are filled in by the caller."""
    kwargs.setdefault("handshake_timeout_s", 1.0)
    kwargs.setdefault("connect_timeout_s", 2.0)
    addresses = {p: TcpAddress("127.0.0.1", 0) for p in ROSTER}
    ep = TcpTransport(party, ROSTER, addresses, SECRET, **kwargs)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(ep.serve)
        try:
            yield ep
        finally:
            await ep.aclose()


def introduce(*endpoints: TcpTransport) -> None:
    for ep in endpoints:
        for other in endpoints:
            ep.addresses[other.party] = other.addresses[other.party]


async def expect_closed_by_peer(stream: trio.SocketStream) -> None:
    """The peer closes: reading ends (EOF or reset) within a few seconds."""
    with trio.fail_after(5):
        while True:
            try:
                data = await stream.receive_some()
            except trio.BrokenResourceError:
                return
            if not data:
                return


async def assert_still_works(alice: TcpTransport) -> None:
    async with serving("bob") as bob:
        introduce(alice, bob)
        await bob.send("alice", b"still here")
        with trio.fail_after(5):
            assert await alice.receive() == ("bob", b"still here")


def hello(dialer: str = "bob", listener: str = "alice", **overrides: object) -> bytes:
    fields = dict(
        version=HANDSHAKE_VERSION, session=0, roster=roster_digest(ROSTER), dialer=dialer,
        listener=listener, nonce=b"n" * 32,
    )
    fields.update(overrides)
    return msgpack.packb(list(fields.values()), use_bin_type=True)


async def dial_raw(ep: TcpTransport) -> trio.SocketStream:
    address = ep.addresses[ep.party]
    return await trio.open_tcp_stream(address.host, address.port)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


async def refused_and_logged(stream, alice, caplog: pytest.LogCaptureFixture, logged: str) -> None:
    """The listener ``alice`` closed the raw ``stream`` on us, logged a warning containing
    ``logged``, and still serves an honest dialer."""
    await expect_closed_by_peer(stream)
    await stream.aclose()
    assert any(logged in m for m in warnings_of(caplog)), warnings_of(caplog)
    await assert_still_works(alice)


async def test_wrong_secret_is_refused_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with serving("alice") as alice:
        stream = await dial_raw(alice)
        reader = FrameReader(stream)
        await send_frame(stream, hello(nonce=b"d" * 32))
        listener_nonce, proof = msgpack.unpackb(await reader.receive_frame(1 << 14))
        # The listener proved itself with the real secret...
        assert proof == handshake_mac(
            SECRET, "listener", session=0, roster_hash=roster_digest(ROSTER), dialer="bob",
            listener="alice", dialer_nonce=b"d" * 32, listener_nonce=listener_nonce,
        )
        # ...but we answer with another one.
        forged = handshake_mac(
            b"not-the-run-secret!!", "dialer", session=0, roster_hash=roster_digest(ROSTER),
            dialer="bob", listener="alice", dialer_nonce=b"d" * 32, listener_nonce=listener_nonce,
        )
        await send_frame(stream, msgpack.packb([forged]))
        await refused_and_logged(stream, alice, caplog, "bad MAC from claimed party 'bob'")


async def test_transport_with_wrong_secret_cannot_connect(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with serving("alice") as alice:
        addresses = dict(alice.addresses)
        impostor = TcpTransport("bob", ROSTER, addresses, b"not-the-run-secret!!", connect_timeout_s=5)
        with trio.fail_after(2):  # refused at once, not retried until the connect timeout
            with pytest.raises(PeerUnreachable, match="failed to prove it is 'alice'"):
                await impostor.send("alice", b"let me in")
        await impostor.aclose()
        await assert_still_works(alice)
        assert any("closed during the handshake" in m for m in warnings_of(caplog))


@pytest.mark.parametrize(
    ("message", "logged"),
    [
        (hello(dialer="mallory"), "'mallory' is not in the roster"),
        (hello(session=7), "session 7"),
        (hello(roster=roster_digest(["bob", "alice"])), "different roster"),
        (hello(listener="carol"), "wanted party 'carol', this is 'alice'"),
        (hello(version="fedproto-tcp/0"), "unsupported handshake version"),
        (hello(nonce=b"short"), "malformed hello nonce"),
        (b"\xc1 garbage in a well-formed frame", "malformed hello"),
        (msgpack.packb({"not": "a list"}), "malformed hello"),
    ],
)
async def test_bad_hello_is_refused_and_logged(
    caplog: pytest.LogCaptureFixture, message: bytes, logged: str
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with serving("alice") as alice:
        stream = await dial_raw(alice)
        await send_frame(stream, message)
        await refused_and_logged(stream, alice, caplog, logged)


async def test_garbage_bytes_are_refused_before_being_buffered(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with serving("alice") as alice:
        stream = await dial_raw(alice)
        await stream.send_all(b"GET / HTTP/1.1\r\nHost: alice\r\n\r\n")  # "GET " = a 1.2 GB prefix
        await refused_and_logged(stream, alice, caplog, "oversized handshake message")


async def test_silent_client_times_out(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with serving("alice", handshake_timeout_s=0.3) as alice:
        stream = await dial_raw(alice)
        start = trio.current_time()
        await expect_closed_by_peer(stream)
        assert 0.25 < trio.current_time() - start < 3
        await stream.aclose()
        assert any("no handshake within 0.3 s" in m for m in warnings_of(caplog))
        await assert_still_works(alice)


async def test_dialling_the_wrong_party_fails_at_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with serving("alice") as alice, serving("carol") as carol:
        alice.addresses["bob"] = carol.addresses["carol"]  # a misconfigured address book
        with trio.fail_after(2):
            with pytest.raises(PeerUnreachable, match="handshake with bob"):
                await alice.send("bob", b"hello bob")
        assert any("wanted party 'bob', this is 'carol'" in m for m in warnings_of(caplog))


async def test_sender_is_the_authenticated_name() -> None:
    async with open_tcp_network(ROSTER, SECRET) as endpoints:
        await endpoints["bob"].send("alice", msgpack.packb({"sender": "carol"}))
        sender, _ = await endpoints["alice"].receive()
        assert sender == "bob"
        assert endpoints["bob"].handshake_bytes > 0 and endpoints["alice"].handshake_bytes > 0


async def test_oversized_frame_closes_only_that_connection(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with (
        serving("alice", max_frame_bytes=1000) as alice,
        serving("bob") as bob,
        serving("carol") as carol,
    ):
        introduce(alice, bob, carol)
        await bob.send("alice", b"x" * 1000)
        assert await alice.receive() == ("bob", b"x" * 1000)
        await bob.send("alice", b"x" * 1001)
        await carol.send("alice", b"from carol")
        with trio.fail_after(5):
            assert await alice.receive() == ("carol", b"from carol")
        assert any("closing the connection from bob" in m and "1001 bytes" in m for m in warnings_of(caplog))
        with pytest.raises(ValueError, match="exceeds the maximum"):
            await alice.send("bob", b"y" * 1001)
        # bob's writes may vanish until he notices the close; then he dials again.
        with trio.fail_after(10):
            while True:
                try:
                    await bob.send("alice", b"again")
                except PeerUnreachable:
                    continue
                with trio.move_on_after(0.05):
                    assert await alice.receive() == ("bob", b"again")
                    break


# ------------------------------------------------------------------------- dialling, closing


@pytest.mark.parametrize("order", [("carol", "bob", "alice"), ("bob", "alice", "carol")])
async def test_parties_may_start_in_any_order(order: tuple[str, ...]) -> None:
    with reserved_ports(3) as ports:
        addresses = {p: TcpAddress("127.0.0.1", port) for p, port in zip(ROSTER, ports)}
        endpoints = {p: TcpTransport(p, ROSTER, addresses, SECRET, connect_timeout_s=10) for p in ROSTER}
    received: dict[str, list[tuple[str, bytes]]] = {p: [] for p in ROSTER}

    async def party(name: str, task_status: trio.TaskStatus[None]) -> None:
        ep = endpoints[name]
        async with trio.open_nursery() as nursery:
            await nursery.start(ep.serve)
            task_status.started()

            async def talk(dest: str) -> None:
                for i in range(5):
                    await ep.send(dest, f"{name}->{dest} #{i}".encode())

            for dest in ROSTER:
                if dest != name:
                    nursery.start_soon(talk, dest)
            for _ in range(10):
                received[name].append(await ep.receive())
            # Stay up until everyone has everything, then stop serving.
            while not all(len(got) == 10 for got in received.values()):
                await trio.sleep(0.01)
            await ep.aclose()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for name in order:
                await nursery.start(party, name)
                await trio.sleep(0.2)  # the others' first dials to later parties are refused
    for name, got in received.items():
        for sender in ROSTER:
            if sender != name:
                expected = [f"{sender}->{name} #{i}".encode() for i in range(5)]
                assert [f for s, f in got if s == sender] == expected


async def test_unreachable_peer_after_connect_timeout() -> None:
    with reserved_ports(2) as (mine, nobody):
        addresses = {"alice": TcpAddress("127.0.0.1", mine), "bob": TcpAddress("127.0.0.1", nobody),
                     "carol": TcpAddress("127.0.0.1", nobody)}
        alice = TcpTransport("alice", ROSTER, addresses, SECRET, connect_timeout_s=0.5)
        start = trio.current_time()
        with pytest.raises(PeerUnreachable, match="within 0.5 s") as info:
            await alice.send("bob", b"anyone?")
        assert 0.5 <= trio.current_time() - start < 3
        assert isinstance(info.value.__cause__, OSError)
        assert info.value.party == "bob"
        with pytest.raises(PeerUnreachable, match="not in the roster"):
            await alice.send("mallory", b"x")
        await alice.aclose()


async def test_aclose_wakes_receivers_stops_serving_and_is_idempotent() -> None:
    async with trio.open_nursery() as nursery:
        async with serving("alice") as alice, serving("bob") as bob:
            introduce(alice, bob)
            await bob.send("alice", b"x")
            assert await alice.receive() == ("bob", b"x")
            port = alice.addresses["alice"].port
            outcome: list[BaseException] = []

            async def blocked_receive() -> None:
                try:
                    await alice.receive()
                except TransportClosed as exc:
                    outcome.append(exc)

            nursery.start_soon(blocked_receive)
            await trio.testing.wait_all_tasks_blocked()
            await alice.aclose()
            await alice.aclose()
            await trio.testing.wait_all_tasks_blocked()
            assert len(outcome) == 1
            with pytest.raises(TransportClosed):
                await alice.send("bob", b"y")
            with pytest.raises(TransportClosed):
                await alice.receive()
            with pytest.raises(TransportClosed):
                await alice.serve()
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.1", port)
            # bob's connection to alice is gone: his send fails or is lost, never hangs.
            with trio.fail_after(5):
                try:
                    await bob.send("alice", b"z")
                    await bob.send("alice", b"z" * 100_000)
                except PeerUnreachable:
                    pass


async def _fake_listener_handshake(stream: trio.SocketStream, name: str) -> FrameReader:
    """The listener's side of the handshake, by hand (a peer that then reads only on demand)."""
    reader = FrameReader(stream)
    hello_message = msgpack.unpackb(await reader.receive_frame(1 << 14))
    _, session, roster_hash, dialer, listener, dialer_nonce = hello_message
    assert listener == name
    context = dict(
        session=session, roster_hash=roster_hash, dialer=dialer, listener=name,
        dialer_nonce=dialer_nonce, listener_nonce=b"L" * 32,
    )
    await send_frame(stream, msgpack.packb([b"L" * 32, handshake_mac(SECRET, "listener", **context)]))
    (proof,) = msgpack.unpackb(await reader.receive_frame(1 << 14))
    assert proof == handshake_mac(SECRET, "dialer", **context)
    await send_frame(stream, msgpack.packb(["ok"]))
    return reader


async def test_cancelled_send_mid_frame_drops_the_connection() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    bob_port = listeners[0].socket.getsockname()[1]
    with reserved_ports(1) as (unused,):
        addresses = {"alice": TcpAddress("127.0.0.1", unused), "bob": TcpAddress("127.0.0.1", bob_port),
                     "carol": TcpAddress("127.0.0.1", unused)}
    alice = TcpTransport("alice", ROSTER, addresses, SECRET)
    accepted_send, accepted = trio.open_memory_channel[tuple[trio.SocketStream, FrameReader]](10)

    async def fake_bob(stream: trio.SocketStream) -> None:
        async with stream:
            await accepted_send.send((stream, await _fake_listener_handshake(stream, "bob")))
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, fake_bob, listeners)
        # bob does not read, so a 64 MiB frame fills the socket buffers and the send blocks. It is
        # cancelled 0.3 s after bob has the connection (not 0.3 s after it began: on a loaded
        # machine the send could be cancelled before it connected, and no second connection come).
        scope, sent = trio.CancelScope(), trio.Event()

        async def big_send() -> None:
            with scope:
                await alice.send("bob", b"\x01" * (64 * 1024 * 1024))
            sent.set()

        nursery.start_soon(big_send)
        with trio.fail_after(60):
            _, first = await accepted.receive()
        await trio.sleep(0.3)
        scope.cancel()
        await sent.wait()
        assert scope.cancelled_caught
        await alice.send("bob", b"after")  # on a fresh connection
        with trio.fail_after(60):
            _, second = await accepted.receive()
        with trio.fail_after(5):
            assert await second.receive_frame(1 << 27) == b"after"
            # The first connection holds part of the cancelled frame, then ends: nothing delivered.
            with pytest.raises(TransportBroken):
                await first.receive_frame(1 << 27)
        await alice.aclose()
        nursery.cancel_scope.cancel()


# ------------------------------------------------------------------------- pre-bound sockets


def _bound_listening_sockets(n: int) -> list[socket.socket]:
    return [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]


@pytest.mark.parametrize("security", ["tls", "insecure-shared-secret"])
async def test_network_from_roster_serves_on_inherited_listening_sockets(tmp_path, security: str) -> None:
    from fedproto.provision import provision
    from fedproto.roster import Roster

    socks = _bound_listening_sockets(len(ROSTER))
    addresses = {p: f"127.0.0.1:{s.getsockname()[1]}" for p, s in zip(ROSTER, socks)}
    if security == "tls":  # each party's own kit
        kits = provision(ROSTER, addresses, tmp_path / "kits", session=7, topology="mesh")  # every party listens
        rosters = {p: Roster.load(kits[p] / "roster.json") for p in ROSTER}
        options: dict[str, object] = {}
    else:
        rosters = dict.fromkeys(ROSTER, Roster.create(addresses, session=7, topology="mesh"))
        options = {"insecure_shared_secret": True}
    # Each process of a launched run adopts its own descriptor; here three networks share one process.
    fds = {p: s.detach() for p, s in zip(ROSTER, socks)}
    networks = {p: TcpNetwork.from_roster(rosters[p], listen_fds={p: fds[p]}, **options) for p in ROSTER}
    async with (
        networks["alice"].endpoints(local=["alice"]) as mine,
        networks["bob"].endpoints(local=["bob"]) as bobs,
        networks["carol"].endpoints(local=["carol"]) as carols,
    ):
        theirs = {**bobs, **carols}
        assert mine["alice"].session == theirs["bob"].session == 7
        assert mine["alice"].uses_tls == (security == "tls")
        # nobody re-bound anything: every endpoint listens on the port the roster names
        for endpoints in (mine, theirs):
            for party, endpoint in endpoints.items():
                assert endpoint._listeners[0].socket.getsockname()[1] == int(addresses[party].split(":")[1])
        await mine["alice"].send("carol", b"to carol")
        await theirs["bob"].send("alice", b"to alice")
        assert await theirs["carol"].receive() == ("alice", b"to carol")
        assert await mine["alice"].receive() == ("bob", b"to alice")
    # the endpoints own the adopted descriptors: closed with them
    for fd in fds.values():
        with pytest.raises(OSError):
            socket.socket(fileno=fd)
    # the other security mode is not taken silently
    other = {"insecure_shared_secret": True} if security == "tls" else {}
    with pytest.raises(ValueError, match="no secret" if security == "tls" else "no TLS material"):
        TcpNetwork.from_roster(rosters["alice"], **other)


async def test_a_bound_socket_that_is_not_listening_yet_is_listened_on() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    addresses = {"alice": f"127.0.0.1:{port}", "bob": "127.0.0.1:0", "carol": "127.0.0.1:0"}
    alice = TcpTransport("alice", ROSTER, addresses, SECRET, listen_socket=sock)
    bob = TcpTransport("bob", ROSTER, {**addresses, "bob": "127.0.0.1:0"}, SECRET)
    async with trio.open_nursery() as nursery:
        assert await nursery.start(alice.serve) == port
        await bob.send("alice", b"hello")
        with trio.fail_after(5):
            assert await alice.receive() == ("bob", b"hello")
        await alice.aclose()
        await bob.aclose()
    assert sock.fileno() == -1  # closed with its endpoint


def test_listen_socket_and_fds_are_checked() -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    try:
        port = sock.getsockname()[1]
        other = port + 1 if port < 65535 else port - 1
        addresses = {"alice": f"127.0.0.1:{other}", "bob": "127.0.0.1:1", "carol": "127.0.0.1:2"}
        with pytest.raises(ValueError, match=f"bound to port {port}"):
            TcpTransport("alice", ROSTER, addresses, SECRET, listen_socket=sock)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            with pytest.raises(ValueError, match="TCP socket"):
                TcpTransport("alice", ROSTER, {**addresses, "alice": "127.0.0.1:0"}, SECRET, listen_socket=udp)
        with pytest.raises(ValueError, match="addresses"):
            TcpNetwork(listen_fds={"alice": sock.fileno()})
        with pytest.raises(ValueError, match="without an address"):
            TcpNetwork(addresses, SECRET, insecure_shared_secret=True, listen_fds={"dave": sock.fileno()})
    finally:
        sock.close()
    assert TcpNetwork.max_frame_bytes_limit == 2**32 - 1

"""Resumption of the TCP star's links (issue 10, part 4): a broken connection is not the end of the run.

* frames streamed both ways, and between clients through the hub, while a proxy in front of the
  hub cuts the connections again and again (a reset at both ends, dropping what it holds; or at
  the client's end only, the hub's end left hanging in silence) arrive exactly once and in order,
  over TLS and over the shared-secret handshake; the hub replaces a returning client's old
  connection;
* a protocol run whose connections are cut mid-round gives the same result and the same payload
  bytes, per link, as an uncut run; an uncut run's resumption bytes are exactly the clients'
  goodbyes, a cut run's also its re-sent frames, and the re-dials' handshakes are handshake bytes;
* a client that does not come back is named by the hub at its phase deadline, and the client
  itself gives up naming the hub; a client whose hub lost its link state (a new hub process)
  fails saying so;
* an impostor cannot resume another party's link: a member's certificate claiming another name,
  or a certificate of another federation, is refused while the real client resumes and the run
  completes.
"""

from __future__ import annotations

import logging
import math
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest
import trio

from fedproto.errors import InsufficientParticipants, PeerUnreachable
from fedproto.metering import Meter, RunReport
from fedproto.provision import FederationCA
from fedproto.roster import TlsFiles
from fedproto.runtime import RuntimeConfig, run_party
from fedproto.testing import DelegatingTransport, load_file
from fedproto.testing.toy import SumCoordinator, SumWorker
from fedproto.transports._framing import CONTROL_FRAME_BYTES
from fedproto.transports._tcp_state import Link
from fedproto.transports.tcp import (
    STAR_TLS_HELLO_VERSION,
    TcpAddress,
    TcpTransport,
    roster_digest,
    throwaway_tls,
)

tcp_helpers = load_file(Path(__file__).resolve().parent / "_tcp_helpers.py", "tests_tcp_helpers")
ROSTER = ("c", "w0", "w1")
WORKERS = ROSTER[1:]
SECRET = b"0123456789abcdef-run-secret"
LOGGER = "fedproto.transports.tcp"
#: What TLS 1.3 adds to each record: 5-byte header, 1-byte inner content type, 16-byte AEAD tag.
RECORD_OVERHEAD_BYTES = 22


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def _reset(stream: trio.SocketStream) -> None:
    """Close with a TCP reset: what the kernel still holds for the stream, either way, is lost."""
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    stream.socket.close()


class CuttingProxy(tcp_helpers.LocalProxy):
    """A TCP proxy in front of the hub, for one client, that cuts its connections on command.

    ``cut()`` resets the client's end of every connection (the client sees a reset), and the
    hub's end too unless ``hub_end=False``: then the hub's end stays open and silent, as a
    connection whose path died does. ``hold = True`` makes it accept new connections without
    forwarding them (the client's handshakes time out), ``hold = False`` forwards them again.
    """

    def __init__(self, target: TcpAddress) -> None:
        super().__init__(target)
        self.hold = False
        self.cuts = 0  # connections cut
        self._pairs: dict[trio.SocketStream, tuple[trio.SocketStream, trio.CancelScope]] = {}
        self._hanging: list[trio.SocketStream] = []
        self._held: set[trio.SocketStream] = set()

    def _open_streams(self) -> list[trio.SocketStream]:
        return [*self._hanging, *self._held]

    async def _handle(self, down: trio.SocketStream) -> None:
        if self.hold:
            self._held.add(down)
            try:
                await trio.sleep_forever()
            finally:
                self._held.discard(down)
                down.socket.close()
        try:
            up = await trio.open_tcp_stream(self.target.host, self.target.port)
        except OSError:
            _reset(down)
            return
        with trio.CancelScope() as scope:
            self._pairs[down] = (up, scope)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, down, up, nursery.cancel_scope)
                    nursery.start_soon(self._pump, up, down, nursery.cancel_scope)
            finally:
                self._pairs.pop(down, None)
        down.socket.close()
        if up not in self._hanging:
            up.socket.close()

    @staticmethod
    async def _pump(source: trio.SocketStream, sink: trio.SocketStream, pair: trio.CancelScope) -> None:
        try:
            while data := await source.receive_some(65536):
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        pair.cancel()

    def cut(self, *, hub_end: bool = True) -> int:
        """Cut every connection now; returns how many."""
        pairs = list(self._pairs.items())
        for down, (up, scope) in pairs:
            if hub_end:
                _reset(up)
            else:
                self._hanging.append(up)  # open, and nobody reads or writes it any more
            _reset(down)
            scope.cancel()
        self.cuts += len(pairs)
        return len(pairs)

    def release_held(self) -> None:
        for stream in list(self._held):
            _reset(stream)


def _security(security: str | dict[str, TlsFiles], party: str) -> dict:
    if security == "insecure-shared-secret":
        return {"secret": SECRET}
    return {"tls": security[party]}


@asynccontextmanager
async def proxied_star(
    security: str | dict[str, TlsFiles] = "tls", roster: tuple[str, ...] = ROSTER, **kwargs
) -> AsyncIterator[tuple[dict[str, TcpTransport], dict[str, CuttingProxy]]]:
    """The star of ``roster`` in this process, each client reaching the hub through its own proxy.

    Yields once every client has dialled in. On a normal exit the clients leave and the hub
    lingers, as in a real run; in every case all endpoints and proxies are closed.
    """
    if security == "tls":
        with throwaway_tls(roster) as kits:
            async with proxied_star(kits, roster, **kwargs) as made:
                yield made
        return
    hub_name, *workers = roster
    hub = TcpTransport(
        hub_name, roster, {hub_name: "127.0.0.1:0"}, topology="star", **_security(security, hub_name), **kwargs
    )
    endpoints = {hub_name: hub}
    proxies: dict[str, CuttingProxy] = {}
    try:
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(hub.serve)
                for worker in workers:
                    proxies[worker] = CuttingProxy(hub.addresses[hub_name])
                    port = await nursery.start(proxies[worker].serve)
                    endpoints[worker] = TcpTransport(
                        worker, roster, {hub_name: f"127.0.0.1:{port}"}, topology="star",
                        **_security(security, worker), **kwargs,
                    )
                    await nursery.start(endpoints[worker].serve)
                with trio.fail_after(30):
                    while len(hub._clients) < len(workers):  # every client has dialled in
                        await trio.sleep(0.01)
                yield endpoints, proxies
                async with trio.open_nursery() as leaving:
                    for worker in workers:
                        leaving.start_soon(endpoints[worker].leave)
                for worker in workers:
                    await endpoints[worker].aclose()
                await hub.linger()
            finally:
                with trio.CancelScope(shield=True):
                    for endpoint in endpoints.values():
                        await endpoint.aclose()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


# --- frames across cut connections ----------------------------------------------------------------------------


FLOWS = [(a, b) for a in ROSTER for b in ROSTER if a != b]  # hub <-> clients, and client <-> client (relayed)


def _frame(flow: tuple[str, str], i: int) -> bytes:
    size = (i * 7919) % 6000  # 0 to 6 kB: several frames per TLS record or several records per frame
    return f"{flow[0]}>{flow[1]}#{i}|".encode() + bytes([i % 251]) * size


@pytest.mark.parametrize("security", ["tls", "insecure-shared-secret"])
@pytest.mark.parametrize("hub_end", [True, False], ids=["reset-both-ends", "hub-end-left-hanging"])
async def test_frames_cross_cut_connections_exactly_once_and_in_order(security: str, hub_end: bool) -> None:
    n = 400
    cuts = 4
    got: dict[tuple[str, str], list[bytes]] = {flow: [] for flow in FLOWS}
    progress = {"received": 0}
    moved = trio.Event()
    async with proxied_star(security) as (eps, proxies):

        async def send(flow: tuple[str, str]) -> None:
            for i in range(n):
                await eps[flow[0]].send(flow[1], _frame(flow, i))

        async def receive(party: str) -> None:
            for _ in range(n * (len(ROSTER) - 1)):
                sender, frame = await eps[party].receive()
                got[(sender, party)].append(frame)
                progress["received"] += 1
                if progress["received"] % 50 == 0:
                    moved.set()

        async def cut() -> None:
            total = n * len(FLOWS)
            for k in range(1, cuts + 1):
                while progress["received"] < k * total // (cuts + 1):
                    await moved.wait()
                for proxy in proxies.values():
                    proxy.cut(hub_end=hub_end)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for party in ROSTER:
                    nursery.start_soon(receive, party)
                nursery.start_soon(cut)
                for flow in FLOWS:
                    nursery.start_soon(send, flow)
        hub = eps["c"]
        assert set(hub._clients) == set(WORKERS)  # both back, each on one (new) connection
    for flow in FLOWS:
        assert got[flow] == [_frame(flow, i) for i in range(n)], f"frames of {flow} lost, duplicated or reordered"
    for worker in WORKERS:
        assert proxies[worker].cuts >= 1
        assert 1 <= eps[worker].resumptions <= proxies[worker].cuts
    assert hub.resumptions >= sum(eps[w].resumptions for w in WORKERS)
    resent = sum(ep.resent_frames for ep in eps.values())
    overhead = sum(ep.resumption_overhead_bytes for ep in eps.values())
    goodbyes = len(WORKERS) * (CONTROL_FRAME_BYTES + (RECORD_OVERHEAD_BYTES if security == "tls" else 0))
    assert overhead >= goodbyes + resent * 4  # every re-sent frame with its length prefix at least
    assert hub.relayed_frames == 2 * n  # each relayed frame counted once, however often it was re-sent


async def _cut_leaving_the_hubs_end_open(hub: TcpTransport, w0: TcpTransport, proxy: CuttingProxy) -> Link:
    """After one frame through it, cut w0's connection so that the hub's end stays open and silent
    and w0's re-dials are held; returns the hub's connection to w0 as it was."""
    await hub.send("w0", b"before")
    assert await w0.receive() == ("c", b"before")
    hanging = hub._clients["w0"]
    proxy.hold = True
    proxy.cut(hub_end=False)  # w0 sees a reset; the hub's end stays open, and nobody reads it
    return hanging


async def test_frames_written_into_a_dead_connection_are_written_again_and_cost_resumption_bytes() -> None:
    """The hub cannot tell that a connection died in silence: what it writes there is lost, and
    written again, exactly once each, when the client's re-dial replaces that connection."""
    frames = [b"lost %d " % i + b"." * (i * 300) for i in range(12)]
    async with proxied_star() as (eps, proxies):
        hub, w0 = eps["c"], eps["w0"]
        hanging = await _cut_leaving_the_hubs_end_open(hub, w0, proxies["w0"])
        with trio.fail_after(10):
            while w0._peers["c"].conn is not None:
                await trio.sleep(0.01)
        before = (hub.resumption_overhead_bytes, hub.tls_overhead_bytes)
        for frame in frames:  # into the dead connection: written, never delivered
            await hub.send("w0", frame)
        await w0.send("c", b"while cut")  # kept by w0 for its link's next connection
        assert hub._clients["w0"] is hanging and hub.resent_frames == 0
        tls_of_first_writes = hub.tls_overhead_bytes - before[1]
        assert tls_of_first_writes == RECORD_OVERHEAD_BYTES * len(frames)
        proxies["w0"].hold = False
        proxies["w0"].release_held()  # w0's next re-dial goes through
        with trio.fail_after(20):
            assert [await w0.receive() for _ in frames] == [("c", f) for f in frames]
            assert await hub.receive() == ("w0", b"while cut")
        assert hub._clients["w0"] is not hanging  # the returning client's connection replaced it
        assert (w0.resumptions, hub.resumptions, hub.resent_frames, w0.resent_frames) == (1, 1, len(frames), 0)
        # each frame written again costs its prefix, itself and its TLS record, as resumption bytes
        resent = sum(4 + len(f) + RECORD_OVERHEAD_BYTES for f in frames)
        assert hub.resumption_overhead_bytes - before[0] == resent
        assert hub.tls_overhead_bytes - before[1] == tls_of_first_writes
        assert w0.receive_nowait() is None and hub.receive_nowait() is None


async def test_a_send_cancelled_while_writing_its_own_frame_loses_nothing() -> None:
    """A send on an idle link writes its frame itself. When the connection stops taking bytes
    (its path died in silence) that write blocks, and the send's deadline cancels it mid-frame:
    the hub closes the connection, and every frame, the cancelled one included, arrives once
    and in order when the client's re-dial resumes the link."""
    frame = b"z" * 32_000
    async with proxied_star() as (eps, proxies):
        hub, w0 = eps["c"], eps["w0"]
        hanging = await _cut_leaving_the_hubs_end_open(hub, w0, proxies["w0"])
        sent, cancelled = 0, False
        with trio.fail_after(30):
            while not cancelled:
                with trio.move_on_after(1.0) as scope:
                    await hub.send("w0", b"%d " % sent + frame)
                sent += 1  # queued on the link, written or not
                cancelled = scope.cancelled_caught
        assert hub._clients.get("w0") is not hanging  # the hub closed the connection it was cut on
        proxies["w0"].hold = False
        proxies["w0"].release_held()
        with trio.fail_after(30):
            assert [await w0.receive() for _ in range(sent)] == [("c", b"%d " % i + frame) for i in range(sent)]
        assert hub.resent_frames >= 1 and w0.receive_nowait() is None


# --- a protocol run cut mid-round ---------------------------------------------------------------------------------


class CutAfter(DelegatingTransport):
    """Cuts every client's connection (through the proxies) right after the ``n``-th frame it sends."""

    def __init__(self, inner, proxies: dict[str, CuttingProxy], n: int) -> None:
        super().__init__(inner)
        self.proxies, self.n, self.sent = proxies, n, 0

    async def send(self, dest: str, frame: bytes) -> None:
        await self.inner.send(dest, frame)
        self.sent += 1
        if self.sent == self.n:
            for proxy in self.proxies.values():
                proxy.cut()


async def _toy_run(cut_after: int | None, security: str = "tls") -> tuple[np.ndarray, RunReport, dict]:
    rounds, dim = 4, 300
    machines = {"c": SumCoordinator("c", workers=WORKERS, rounds=rounds, dim=dim)}
    for i, w in enumerate(WORKERS):
        machines[w] = SumWorker(w, coordinator="c", values=np.arange(dim, dtype=float) * (i + 1))
    meter = Meter(trio.current_time)
    results: dict = {}
    async with proxied_star(security) as (eps, proxies):
        endpoints = dict(eps)
        if cut_after is not None:
            endpoints["c"] = CutAfter(eps["c"], proxies, cut_after)
        config = RuntimeConfig(deadline_s=20.0)

        async def party(name: str) -> None:
            results[name] = await run_party(machines[name], endpoints[name], config=config, meter=meter)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for name in ROSTER:
                    nursery.start_soon(party, name)
    counts = {p: (e.resumptions, e.resent_frames, e.resumption_overhead_bytes, e.handshake_bytes)
              for p, e in eps.items()}
    for endpoint in eps.values():
        meter.record_connection_bytes(
            handshake_bytes=endpoint.handshake_bytes, tls_overhead_bytes=endpoint.tls_overhead_bytes,
            relay_overhead_bytes=endpoint.relay_overhead_bytes,
            resumption_overhead_bytes=endpoint.resumption_overhead_bytes,
        )
    report = meter.report(protocol="toy", transport="tcp", session=0, parties=ROSTER)
    assert all(results[w] == rounds for w in WORKERS)
    return results["c"], report, counts


async def test_a_run_cut_mid_round_gives_the_same_result_and_payload_bytes() -> None:
    whole, whole_report, whole_counts = await _toy_run(None)
    # the hub's 4th frame is round 1's query to w1: the cut drops what is in flight, mid-round
    cut, cut_report, cut_counts = await _toy_run(cut_after=4)
    np.testing.assert_array_equal(cut, whole)
    assert cut_report.links == whole_report.links  # per link, round, phase and tag: no frame lost or doubled
    assert (cut_report.payload_bytes, cut_report.messages) == (whole_report.payload_bytes, whole_report.messages)
    assert cut_report.framing_overhead_bytes == whole_report.framing_overhead_bytes
    # uncut: nothing resumed, and the only resumption bytes are each client's goodbye (a 20-byte
    # control frame in one TLS record); no link carried 64 frames or 1 MiB, so no acknowledgement
    assert all(c[:2] == (0, 0) for c in whole_counts.values())
    goodbye = CONTROL_FRAME_BYTES + RECORD_OVERHEAD_BYTES
    assert {p: c[2] for p, c in whole_counts.items()} == {"c": 0, "w0": goodbye, "w1": goodbye}
    assert whole_report.resumption_overhead_bytes == 2 * goodbye
    assert whole_report.tls_overhead_bytes == RECORD_OVERHEAD_BYTES * whole_report.messages
    # cut: both clients re-dialled and resumed; the re-dials cost handshakes, re-sent frames cost
    # resumption bytes, and nothing else changed
    assert all(cut_counts[w][0] == 1 for w in WORKERS) and cut_counts["c"][0] == 2
    assert all(cut_counts[p][3] > whole_counts[p][3] for p in ROSTER)
    resent = sum(c[1] for c in cut_counts.values())
    assert cut_report.resumption_overhead_bytes >= 2 * goodbye + resent * (4 + RECORD_OVERHEAD_BYTES)
    assert cut_report.tls_overhead_bytes <= whole_report.tls_overhead_bytes


def _fastlloyd_plan():
    from fedproto import registry
    from fedproto.cli import build_parser
    from fedproto.data import load_dataset

    argv = ["run", "fastlloyd", "--data", "iris", "--clients", "2", "--seed", "3"]
    args = build_parser(argv).parse_args(argv)
    return registry.load_protocol("fastlloyd").plan(args, load_dataset(args.data))


async def _run_fastlloyd(plan, cut_after: int | None) -> tuple[dict, RunReport, dict]:
    meter = Meter(trio.current_time)
    config = RuntimeConfig(session=plan.session, deadline_s=30.0)
    results: dict = {}
    hub = plan.roster[0]
    if cut_after is None:
        from fedproto.transports.memory import MemoryNetwork

        async with MemoryNetwork(plan.roster).endpoints() as endpoints:
            with trio.fail_after(120):
                async with trio.open_nursery() as nursery:
                    for name in plan.roster:
                        nursery.start_soon(_one, plan, name, endpoints[name], config, meter, results)
        resumed = {}
    else:
        async with proxied_star(roster=plan.roster, session=plan.session) as (eps, proxies):
            endpoints = {**eps, hub: CutAfter(eps[hub], proxies, cut_after)}
            with trio.fail_after(120):
                async with trio.open_nursery() as nursery:
                    for name in plan.roster:
                        nursery.start_soon(_one, plan, name, endpoints[name], config, meter, results)
        resumed = {p: (e.resumptions, e.resent_frames) for p, e in eps.items()}
    report = meter.report(protocol="fastlloyd", transport="x", session=plan.session, parties=plan.roster)
    return {p: plan.result_to_json(p, r) for p, r in results.items()}, report, resumed


async def _one(plan, name, endpoint, config, meter, results) -> None:
    results[name] = await run_party(plan.make_machine(name), endpoint, config=config, meter=meter)


@pytest.mark.slow  # about 25 s: JAX compiles FastLloyd's kernels
async def test_fastlloyd_cut_mid_run_gives_the_memory_runs_result_and_payload_bytes() -> None:
    plan = _fastlloyd_plan()
    memory, memory_report, _ = await _run_fastlloyd(plan, None)
    # the server's 5th frame: past setup.data, inside the first Lloyd iterations
    cut, cut_report, resumed = await _run_fastlloyd(plan, cut_after=5)
    assert cut == memory
    assert cut_report.links == memory_report.links
    assert all(resumed[c][0] == 1 for c in plan.roster[1:]), resumed


# --- a client that does not come back -------------------------------------------------------------------------


async def test_a_client_that_does_not_come_back_is_named_by_the_hub_at_its_deadline(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    deadline_s = 1.0
    rounds, dim = 3, 4
    outcomes: dict[str, tuple[float, BaseException | None]] = {}
    # w1 gives up re-dialling (resume_timeout_s) before its own deadline for a silent hub (2 s)
    async with proxied_star(handshake_timeout_s=0.3, resume_timeout_s=1.2, linger_s=1.0) as (eps, proxies):
        machines = {"c": SumCoordinator("c", workers=WORKERS, rounds=rounds, dim=dim)}
        for i, w in enumerate(WORKERS):
            machines[w] = SumWorker(w, coordinator="c", values=np.arange(dim) + i)
        endpoints = dict(eps)
        endpoints["c"] = gone = CutAfter(eps["c"], {"w1": proxies["w1"]}, 3)  # round 1's first query
        started = trio.current_time()

        async def party(name: str) -> None:
            try:
                await run_party(machines[name], endpoints[name], config=RuntimeConfig(deadline_s=deadline_s))
                outcomes[name] = (trio.current_time(), None)
            except Exception as exc:
                outcomes[name] = (trio.current_time(), exc)

        proxies["w1"].hold = True  # w1's re-dials reach nothing: its handshakes time out
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for name in ROSTER:
                    nursery.start_soon(party, name)
        assert gone.sent >= 3
    hub_ended, hub_error = outcomes["c"]
    assert isinstance(hub_error, InsufficientParticipants), hub_error
    assert hub_error.party == "w1" and "silent: w1" in str(hub_error), hub_error
    # within the hub's deadline for a silent worker, from when w1 went away (the hub has no timer
    # of its own for a client's link: the runtime's deadline applies)
    assert hub_ended - started < deadline_s * SumCoordinator.DEADLINE_FACTOR + 3
    w1_ended, w1_error = outcomes["w1"]
    assert isinstance(w1_error, PeerUnreachable) and w1_error.party == "c", w1_error
    assert "w1 lost its connection to the hub c" in str(w1_error) and "could not resume it" in str(w1_error)
    assert w1_ended - started < 1.2 + 3  # it kept re-dialling for resume_timeout_s, then gave up
    assert eps["w1"].resumptions == 0
    # w0, told by the hub, ends naming w1 as the culprit
    assert "w1" in str(outcomes["w0"][1])
    assert any("lost the connection of w1" in m for m in (r.getMessage() for r in caplog.records)), caplog.text


async def test_a_client_whose_hub_lost_the_link_fails_saying_so() -> None:
    """A new hub process (here: another endpoint behind the same address) cannot resume the old one's links."""
    with throwaway_tls(ROSTER) as kits:
        async with proxied_star(kits, linger_s=1.0) as (eps, proxies):
            await eps["w0"].send("c", b"before")
            assert await eps["c"].receive() == ("w0", b"before")
            other_hub = TcpTransport("c", ROSTER, {"c": "127.0.0.1:0"}, topology="star", tls=kits["c"])
            async with trio.open_nursery() as nursery:
                await nursery.start(other_hub.serve)
                proxies["w0"].target = other_hub.addresses["c"]
                proxies["w0"].cut()
                with trio.fail_after(10), pytest.raises(PeerUnreachable) as caught:
                    await eps["w0"].receive()
                await other_hub.aclose()
            assert caught.value.party == "c"
            assert "the hub no longer knows the link of w0 (was it restarted?)" in str(caught.value), caught.value
            await eps["w0"].aclose()


# --- impostors ----------------------------------------------------------------------------------------------------


async def test_an_impostor_cannot_resume_another_partys_link(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    ca, other_ca = FederationCA.create(), FederationCA.create()
    kits = {}
    for party in ROSTER:
        (tmp_path / party).mkdir()
        kits[party] = ca.issue(party).write(tmp_path / party)
    (tmp_path / "other").mkdir()
    foreign_w1 = other_ca.issue("w1").write(tmp_path / "other")
    async with proxied_star(kits) as (eps, proxies):
        hub, w1 = eps["c"], eps["w1"]
        await w1.send("c", b"first")
        assert await hub.receive() == ("w1", b"first")
        await hub.send("w1", b"hello w1")
        assert await w1.receive() == ("c", b"hello w1")
        link = hub._peers["w1"]
        link_id, received = w1._peers["c"].link_id, w1._peers["c"].received
        assert link.link_id == link_id and received == 1
        # w1's connection is cut and its re-dials are held: its link waits at the hub
        proxies["w1"].hold = True
        proxies["w1"].cut()
        with trio.fail_after(10):
            while "w1" in hub._clients:
                await trio.sleep(0.01)
        await hub.send("w1", b"while away")  # kept for w1's return
        address = hub.addresses["c"]
        digest = roster_digest(ROSTER)
        # w0's own valid certificate, claiming w1's name, with w1's link id and count
        resume_as_w1 = [STAR_TLS_HELLO_VERSION, 0, digest, "w1", "c", link_id, received]
        assert not await tcp_helpers.rogue_hello(address, kits["w0"], "w0", resume_as_w1)
        # a certificate naming w1, from another federation's CA
        assert not await tcp_helpers.rogue_hello(address, foreign_w1, "w1", resume_as_w1)
        assert hub._peers["w1"] is link and link.conn is None and link.link_id == link_id  # untouched
        # the real w1 comes back and resumes: nothing lost, nothing doubled
        proxies["w1"].hold = False
        proxies["w1"].release_held()
        with trio.fail_after(20):
            assert await w1.receive() == ("c", b"while away")
            await w1.send("c", b"back")
            assert await hub.receive() == ("w1", b"back")
        assert w1.resumptions == 1 and hub.resumptions == 1
        assert hub.receive_nowait() is None and w1.receive_nowait() is None
    warnings = warnings_of(caplog)
    assert any("the certificate names 'w0' but the hello claims 'w1'" in w for w in warnings), warnings
    assert any("refused connection" in w and "TLS handshake failed" in w for w in warnings), warnings


def test_resumption_overhead_is_summed_by_merge_and_defaults_to_zero_in_older_reports() -> None:
    reports = []
    for party, overhead in (("c", 0), ("w0", 42), ("w1", 1042)):
        meter = Meter()
        meter.record_sent(0, "p", party, "x", "t", 10)
        meter.record_connection_bytes(resumption_overhead_bytes=overhead)
        reports.append(meter.report(protocol="p", transport="tcp", session=0, parties=ROSTER))
    merged = RunReport.merge(reports)
    assert (merged.resumption_overhead_bytes, merged.payload_bytes) == (1084, 30)
    old = merged.to_dict()
    del old["resumption_overhead_bytes"]  # a report written before resumption
    assert RunReport.from_dict(old).resumption_overhead_bytes == 0
    assert math.isfinite(merged.wall_time_s)

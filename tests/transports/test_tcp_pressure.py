"""The TCP star's hub under pressure (issue 33, items 3 to 5), over TLS.

* a flood of silent connections: pending handshakes are capped per host and in all, an accept
  out of descriptors (EMFILE) backs off without a traceback, and the refusal log is bounded in
  all, not only per host: 1,100 silent connections from 1,100 addresses against a hub limited to
  1,024 descriptors give no traceback, a bounded number of lines, and the honest run finishes;
* a second holder of a party's kit cannot evict the live party: its connection is refused while
  the link lives, and the run finishes with the right results;
* a failure notice goes ahead of the relayed frames queued for its receiver;
* a stopped hub (one that neither reads nor writes, as under SIGSTOP) is detected by its clients
  within one deadline, by the star's keep-alive, with an error naming the hub.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import trio

from fedproto.codec import encode_frame, has_tag
from fedproto.errors import PeerUnreachable
from fedproto.messages import AbortNotice
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.testing import DelegatingTransport, load_file, run_each_party
from fedproto.testing.toy import SumCoordinator, SumWorker
from fedproto.transports._admission import BoundedRefusalLog, PendingHandshakes, accept_forever
from fedproto.transports.tcp import TcpAddress, TcpTransport, _StarPeer, open_tcp_network, throwaway_tls

tcp_helpers = load_file(Path(__file__).resolve().parent / "_tcp_helpers.py", "tests_tcp_helpers")
ROSTER = ("c", "w0", "w1")
WORKERS = ROSTER[1:]
LOGGER = "fedproto.transports.tcp"


def toy_machines(rounds: int = 3, dim: int = 3) -> dict:
    machines = {"c": SumCoordinator("c", workers=list(WORKERS), rounds=rounds, dim=dim)}
    for i, w in enumerate(WORKERS):
        machines[w] = SumWorker(w, coordinator="c", values=np.arange(dim) + i)
    return machines


def expected_sums(rounds: int = 3, dim: int = 3) -> np.ndarray:
    total = sum(np.arange(dim) + i for i in range(2))
    return np.stack([total * (r + 1) for r in range(rounds)])


# --- item 3: the cap on pending handshakes, EMFILE, the bound on refusal lines ---------------------------------


def test_pending_handshakes_are_capped_per_host_and_the_oldest_makes_room_in_all() -> None:
    pending = PendingHandshakes(max_total=3, max_per_host=2)
    a1, _ = pending.admit("a", "a1")
    a2, _ = pending.admit("a", "a2")
    assert pending.admit("a", "a3") == (None, None)  # a is at its share: refused
    b1, evicted = pending.admit("b", "b1")
    assert evicted is None and len(pending) == 3
    b2, evicted = pending.admit("b", "b2")  # every slot taken: the oldest, a1, is closed
    assert evicted is a1 and a1.evicted and len(pending) == 3
    a3, evicted = pending.admit("a", "a3")  # a has one pending now: admitted, a2 makes room
    assert a3 is not None and evicted is a2
    for ticket in (a3, b1, b2, b2):  # release is idempotent
        ticket.release()
    assert len(pending) == 0 and pending.admit("a", "x")[0] is not None
    with pytest.raises(ValueError, match="max_pending_per_host"):
        PendingHandshakes(max_total=3, max_per_host=0)


def test_refusals_from_many_hosts_make_a_bounded_number_of_lines(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="bounded")
    now = [0.0]
    limiter = BoundedRefusalLog(logging.getLogger("bounded"), "c", interval_s=10.0, max_lines=20, clock=lambda: now[0])
    for i in range(1100):  # 1,100 addresses, one refusal each: one "first" line each without the bound
        limiter.log(f"10.0.{i // 250}.{i % 250}", "handshake", "c: refused connection from %s: silent", i)
        now[0] += 0.001
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 20
    now[0] += 10.0  # the next interval: the count held back comes first
    limiter.log("10.9.9.9", "handshake", "c: refused connection from %s: silent", "late")
    limiter.flush()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 22, lines
    assert lines[20].startswith("c: 1080 more refusals from 1080 hosts in the last 1"), lines[20]
    assert lines[21] == "c: refused connection from late: silent"


class _ExhaustedListener:
    """A listener whose accept fails with EMFILE ``failures`` times, then returns streams."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    async def accept(self):
        await trio.lowlevel.checkpoint()
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        await trio.sleep_forever()


async def test_an_accept_out_of_descriptors_backs_off_and_raises_nothing() -> None:
    listener, seen = _ExhaustedListener(failures=5), []
    started = trio.current_time()
    with trio.move_on_after(1):
        await accept_forever(listener, seen.append, lambda exc: seen.append(exc.errno))
    assert seen == [errno.EMFILE] * 5 and listener.failures == 0
    assert trio.current_time() - started >= 0.01 + 0.02 + 0.04 + 0.08 + 0.16  # backed off, no spinning


_HUB_SCRIPT = textwrap.dedent(
    """
    import json, logging, resource, sys
    import numpy as np, trio
    from fedproto.runtime import RuntimeConfig, run_parties
    from fedproto.testing.toy import SumCoordinator, SumWorker
    from fedproto.transports.tcp import TcpTransport, throwaway_tls

    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    options = json.loads(sys.argv[1])
    roster = ("c", "w0", "w1")

    async def main():
        with throwaway_tls(roster) as kits:
            hub = TcpTransport("c", roster, {"c": "127.0.0.1:0"}, topology="star", tls=kits["c"], **options)
            async with trio.open_nursery() as nursery:
                port = await nursery.start(hub.serve)
                print(port, flush=True)
                await trio.to_thread.run_sync(sys.stdin.readline)  # the flood is open
                clients = {
                    w: TcpTransport(w, roster, {"c": f"127.0.0.1:{port}"}, topology="star", tls=kits[w],
                                    connect_timeout_s=20)
                    for w in roster[1:]
                }
                for client in clients.values():
                    await nursery.start(client.serve)
                machines = {"c": SumCoordinator("c", workers=["w0", "w1"], rounds=3, dim=3)}
                for i, w in enumerate(roster[1:]):
                    machines[w] = SumWorker(w, coordinator="c", values=np.arange(3) + i)
                with trio.fail_after(40):
                    results = await run_parties(machines, {"c": hub, **clients}, config=RuntimeConfig(deadline_s=20))
                for endpoint in [*clients.values(), hub]:
                    await endpoint.aclose()
                nursery.cancel_scope.cancel()
        print(json.dumps({"sums": np.asarray(results["c"]).tolist(), "refused_bytes": hub.refused_bytes}), flush=True)

    trio.run(main)
    """
)

_FLOOD_SCRIPT = textwrap.dedent(
    """
    import resource, socket, sys
    port, n = int(sys.argv[1]), int(sys.argv[2])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, n + 256)), hard))
    conns = []
    for i in range(n):  # one silent connection from each of n loopback addresses
        s = socket.socket()
        s.bind((f"127.0.{1 + i // 250}.{2 + i % 250}", 0))
        s.connect(("127.0.0.1", port))
        conns.append(s)
    print(len(conns), flush=True)
    sys.stdin.readline()  # hold them until told
    """
)


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({}, id="capped"),
        # no cap that matters: the hub runs out of descriptors and must back off quietly
        pytest.param({"max_pending_handshakes": 5000, "max_pending_per_host": 5000, "handshake_timeout_s": 3.0},
                     id="out-of-descriptors"),
    ],
)
def test_a_flood_of_silent_connections_under_1024_descriptors_leaves_no_traceback(options) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    hub = subprocess.Popen(
        [sys.executable, "-c", _HUB_SCRIPT, json.dumps(options)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    flood = None
    try:
        port = int(hub.stdout.readline())
        n = 1100
        flood = subprocess.Popen(
            [sys.executable, "-c", _FLOOD_SCRIPT, str(port), str(n)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert int(flood.stdout.readline()) == n  # all of them connected (the kernel's backlog holds the rest)
        hub.stdin.write("go\n")
        hub.stdin.flush()
        out, err = hub.communicate(timeout=60)
    finally:
        for process in (hub, flood):
            if process is not None and process.poll() is None:
                process.kill()
                process.communicate()
    assert hub.returncode == 0, err[-3000:]
    result = json.loads(out.splitlines()[-1])
    np.testing.assert_array_equal(result["sums"], expected_sums())
    assert result["refused_bytes"] >= 0
    assert "Traceback" not in err, err[-3000:]
    lines = err.splitlines()
    # at most 20 lines per 10 s plus a summary each (the run takes a few seconds), and far fewer
    # than one per address
    assert len(lines) <= 2 * (20 + 1) + 2, "\n".join(lines[:50])
    assert any("more refusals from" in line for line in lines) or len(lines) < 20, "\n".join(lines)


# --- item 4: a copy of a kit cannot evict the live party; failure notices first ---------------------------------


async def test_a_second_copy_of_a_kit_is_refused_while_the_party_is_live(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    rounds = 6
    with throwaway_tls(ROSTER) as kits, trio.fail_after(60):
        async with open_tcp_network(ROSTER, tls=kits, topology="star") as endpoints:
            hub = endpoints["c"]
            copy = TcpTransport("w0", ROSTER, {"c": hub.addresses["c"]}, topology="star", tls=kits["w0"])
            copy_error: list[BaseException] = []

            async def second_copy() -> None:
                await trio.sleep(0.05)  # the run is under way, w0's link live
                async with trio.open_nursery() as nursery:
                    await nursery.start(copy.serve)
                    try:
                        await copy.send("c", b"I am w0 too")
                    except PeerUnreachable as exc:
                        copy_error.append(exc)
                    await copy.aclose()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(second_copy)
                results = await run_parties(
                    toy_machines(rounds), endpoints, config=RuntimeConfig(deadline_s=20.0)
                )
    np.testing.assert_array_equal(results["c"], expected_sums(rounds))
    assert results["w0"] == results["w1"] == rounds
    assert copy_error and copy_error[0].party == "c", copy_error
    assert "refused by the peer" in str(copy_error[0])
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any("'w0' dialled in with another link while its link lives" in m for m in messages), messages
    assert not any("newer connection" in m or "lost the connection of w0" in m for m in messages), messages
    assert hub.refused_bytes > 0 and endpoints["w0"].resumptions == 0


def test_an_urgent_frame_goes_ahead_of_the_frames_not_yet_begun() -> None:
    peer = _StarPeer("w1")
    for i in range(10):
        peer.queue(0, b"relayed %d" % i)
    peer.started = peer.written = peer.high_written = 3  # frames 0-2 are (being) written: their numbers hold
    waiting = [peer.queue(None, b"the hub's own")]  # number 10, its send waits for it
    peer.waiting.append(waiting)
    assert peer.queue(1, b"notice 1", urgent=True) == 3
    assert peer.queue(2, b"notice 2", urgent=True) == 4  # behind the first notice, ahead of the rest
    assert waiting == [12] and peer.sent == 13
    order = [peer.frame(n)[1] for n in range(peer.acked, peer.sent)]
    assert order[:6] == [b"relayed 0", b"relayed 1", b"relayed 2", b"notice 1", b"notice 2", b"relayed 3"]
    assert order[12] == b"the hub's own"
    assert peer.take_ack(3) and peer.frame(4) == (2, b"notice 2")  # numbering holds across acknowledgements


async def test_a_failure_notice_reaches_its_receiver_ahead_of_queued_relayed_frames() -> None:
    notice = encode_frame(AbortNotice(culprits=("w0",), reason="gave up"), session=0, round_idx=0, phase="abort")
    assert has_tag(notice, AbortNotice.TAG) and not has_tag(b"relayed", AbortNotice.TAG)
    n_frames = 5_000
    with throwaway_tls(ROSTER) as kits, trio.fail_after(60):
        hub = TcpTransport("c", ROSTER, {"c": "127.0.0.1:0"}, topology="star", tls=kits["c"])
        async with trio.open_nursery() as nursery:
            await nursery.start(hub.serve)
            address = {"c": hub.addresses["c"]}
            w0 = TcpTransport("w0", ROSTER, address, topology="star", tls=kits["w0"])
            w1 = TcpTransport("w1", ROSTER, address, topology="star", tls=kits["w1"])
            await nursery.start(w0.serve)
            for i in range(n_frames):  # w1 has not dialled in: they wait at the hub, in w1's queue
                await w0.send("w1", b"relayed %d" % i)
            await w0.send("w1", notice)
            while hub.relayed_frames == 0 and (hub._peers.get("w1") is None or hub._peers["w1"].sent < n_frames + 1):
                await trio.sleep(0.01)
            await nursery.start(w1.serve)
            assert await w1.receive() == ("w0", notice)
            assert await w1.receive() == ("w0", b"relayed 0")  # then the rest, in order
            for endpoint in (w0, w1, hub):
                await endpoint.aclose()
            nursery.cancel_scope.cancel()


# --- item 5: a stopped hub is detected within one deadline --------------------------------------------------------


class FreezingProxy(tcp_helpers.LocalProxy):
    """A TCP proxy in front of the hub that, once frozen, neither reads nor writes nor answers.

    What a client sees of a hub under SIGSTOP: its connections stay open (the kernel keeps them),
    and new ones are accepted by the kernel but never answered.
    """

    def __init__(self, target: TcpAddress) -> None:
        super().__init__(target)
        self.frozen = trio.Event()
        self._streams: list[trio.SocketStream] = []

    def _open_streams(self) -> list[trio.SocketStream]:
        return self._streams

    async def _handle(self, down: trio.SocketStream) -> None:
        self._streams.append(down)
        if self.frozen.is_set():
            await trio.sleep_forever()
        up = await trio.open_tcp_stream(self.target.host, self.target.port)
        self._streams.append(up)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, down, up)
            nursery.start_soon(self._pump, up, down)

    async def _pump(self, source: trio.SocketStream, sink: trio.SocketStream) -> None:
        try:
            while not self.frozen.is_set():
                data = None
                with trio.move_on_after(0.02):  # stop between reads once frozen
                    data = await source.receive_some(65536)
                if data is None:
                    continue
                if not data or self.frozen.is_set():
                    return
                # outside the timeout: a send cut short would drop the rest of a TLS record (a
                # loaded machine can take 20 ms to send), which the other end reads as "bad record mac"
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        await trio.sleep_forever()  # frozen: hold both ends open, in silence


class FreezesAfter(DelegatingTransport):
    """The hub's endpoint: after sending ``n`` frames, its proxies freeze (the hub is "stopped")."""

    def __init__(self, inner, proxies, n):
        super().__init__(inner)
        self.proxies, self.n, self.sent = proxies, n, 0
        self.frozen_at: float | None = None

    async def send(self, dest, frame):
        await self.inner.send(dest, frame)
        self.sent += 1
        if self.sent == self.n:
            self.frozen_at = trio.current_time()
            for proxy in self.proxies:
                proxy.frozen.set()


async def test_a_stopped_hub_is_detected_by_its_clients_within_one_deadline() -> None:
    deadline_s = 4.0
    options = dict(resume_timeout_s=deadline_s / 2, handshake_timeout_s=1.0, linger_s=0.5)
    with throwaway_tls(ROSTER) as kits, trio.fail_after(60):
        # the hub keeps its default keep-alive interval (5 s): it answers the clients' (0.25 s)
        hub = TcpTransport("c", ROSTER, {"c": "127.0.0.1:0"}, topology="star", tls=kits["c"], **options)
        options["keepalive_s"] = 0.25
        async with trio.open_nursery() as nursery:
            await nursery.start(hub.serve)
            endpoints: dict = {}
            proxies = []
            for w in WORKERS:
                proxies.append(FreezingProxy(hub.addresses["c"]))
                port = await nursery.start(proxies[-1].serve)
                endpoints[w] = TcpTransport(w, ROSTER, {"c": f"127.0.0.1:{port}"}, topology="star", tls=kits[w], **options)
                await nursery.start(endpoints[w].serve)
            stopped = endpoints["c"] = FreezesAfter(hub, proxies, n=4)  # after round 1's queries
            machines = toy_machines(rounds=5)

            outcomes = await run_each_party(machines, endpoints, RuntimeConfig(deadline_s=deadline_s),
                                            order=[*WORKERS, "c"])
            for endpoint in [*endpoints.values()]:
                await endpoint.aclose()
            nursery.cancel_scope.cancel()
    assert stopped.frozen_at is not None
    for w in WORKERS:
        ended, error = outcomes[w]
        assert isinstance(error, PeerUnreachable) and error.party == "c", error
        assert "heard nothing from c" in str(error), error
        # one deadline at most (they waited 2 x the deadline for a silent hub before)
        assert ended - stopped.frozen_at < deadline_s + 0.5, (w, ended - stopped.frozen_at)


async def test_an_idle_link_stays_up_on_keep_alives_the_hub_answers() -> None:
    """Keep-alives are ACK control frames: counted as resumption overhead, never delivered as frames."""
    with throwaway_tls(ROSTER) as kits, trio.fail_after(30):
        async with open_tcp_network(ROSTER, tls=kits, topology="star", keepalive_s=0.1, resume_timeout_s=1.0) as eps:
            for w in WORKERS:
                await eps[w].send("c", b"hello from " + w.encode())
            before = {p: eps[p].resumption_overhead_bytes for p in ROSTER}
            await trio.sleep(1.5)  # idle, longer than resume_timeout_s: only keep-alives are heard
            for w in WORKERS:
                assert eps[w]._hub_failure is None and eps[w].resumptions == 0
                assert eps[w].resumption_overhead_bytes - before[w] >= 5 * (20 + 22)  # ACKs in TLS records
            assert eps["c"].resumption_overhead_bytes > before["c"] and set(eps["c"]._clients) == set(WORKERS)
            assert sorted([await eps["c"].receive(), await eps["c"].receive()]) == [
                ("w0", b"hello from w0"), ("w1", b"hello from w1")
            ]
            assert eps["c"].receive_nowait() is None and eps["w0"].receive_nowait() is None
            await eps["w0"].send("w1", b"still here")
            assert await eps["w1"].receive() == ("w0", b"still here")


def test_the_caps_are_checked_when_an_endpoint_is_built() -> None:
    for bad in (dict(max_pending_handshakes=0), dict(max_pending_per_host=-1), dict(keepalive_s=0.0)):
        with pytest.raises(ValueError):
            TcpTransport("c", ROSTER, {"c": "127.0.0.1:0"}, topology="star", secret=b"0123456789abcdef-secret", **bad)


async def test_honest_clients_dialling_at_once_beyond_the_per_host_cap_all_get_in(caplog) -> None:
    """Forty clients on one host dial a hub that holds at most 4 of their handshakes (8 in all):
    the hub closes the others in their TLS handshake, without an alert, and each tries again
    until it is in (before, the first close ended the client: 'unexpected eof while reading')."""
    roster = ["c", *(f"w{i}" for i in range(40))]
    with throwaway_tls(roster) as kits, trio.fail_after(60):
        async with open_tcp_network(
            roster, tls=kits, topology="star", max_pending_per_host=4, max_pending_handshakes=8
        ) as eps:
            async with trio.open_nursery() as nursery:
                for w in roster[1:]:
                    nursery.start_soon(eps[w].send, "c", w.encode())
            got = sorted([(await eps["c"].receive()) for _ in roster[1:]])
    assert "handshakes from 127.0.0.1 are already pending" in caplog.text  # the cap did close some
    assert got == sorted((w, w.encode()) for w in roster[1:])


def test_the_default_caps_are_never_below_the_rosters_size() -> None:
    roster = ["c", *(f"w{i}" for i in range(600))]
    hub = TcpTransport("c", roster, {"c": "127.0.0.1:0"}, topology="star", secret=b"s" * 32)
    assert hub._pending.max_total == 601 and hub._pending.max_per_host == 601
    small = TcpTransport("c", ROSTER, {"c": "127.0.0.1:0"}, topology="star", secret=b"s" * 32)
    assert small._pending.max_total == 512 and small._pending.max_per_host == 128

"""The star's links, as either end carries them: the table of links and the reading and writing of each connection.

A star link (a client and the hub, :class:`~fedproto.transports._star_peer.StarPeer`) outlives its
connections; :class:`StarLinks` installs a connection on its link, carries it (one writer task
for acknowledgements, frames and the goodbye; one reader; at a client a watch on the hub's
silence) and uninstalls it when it ends, leaving the link to resume on the next one
(:mod:`fedproto.transports._star_hub`, :mod:`fedproto.transports._star_client`).

Keep-alive: a star connection on which a side wrote nothing for ``keepalive_s`` gets an ACK
control frame repeating its count (it acknowledges nothing new, so it fits the resumption
protocol and the wire format as they are), and the hub answers each ACK of a client with one of
its own unless it writes a frame first. A client that hears nothing on its connection for
:data:`KEEPALIVE_MISSES` of its own intervals (the hub is stopped, say by SIGSTOP, which leaves its
connections open and silent, or the path died) closes it and re-dials. TCP keepalive (about 25 s)
backs it up.

Failure notices first: a frame that is an :class:`~fedproto.messages.AbortNotice`
(:func:`fedproto.codec.has_tag`, from its first bytes) is queued on a star link ahead of the
frames whose writing has not begun, so a notice relayed to a client is not stuck behind a long
queue of relayed frames.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import trio

from fedproto.codec import has_tag
from fedproto.errors import AgreementMismatch, DecodeError, PeerUnreachable, TransportBroken, TransportClosed
from fedproto.messages import AbortNotice
from fedproto.transports._framing import (
    ACK_INDEX,
    BYE_INDEX,
    CONTROL_BYTES,
    CONTROL_FRAME_BYTES,
    FRAMING_OVERHEAD_BYTES,
    ROUTE_HEADER_BYTES,
    FrameTooLarge,
    control_count,
    send_control,
    send_frame,
    send_routed_frame,
)
from fedproto.transports._star_peer import StarPeer
from fedproto.transports._tcp_state import EndpointState, Link, log

#: A star client closes a connection on which it heard nothing from the hub for this many
#: keep-alive intervals (or ``resume_timeout_s``, if shorter), and re-dials.
KEEPALIVE_MISSES = 3
# TCP keepalive on star connections: a connection idle this long is probed, every interval, and
# declared dead after this many unanswered probes (about 25 s), so a link that died silently (a
# NAT that forgot it, a path that went down) is noticed and re-dialled.
_KEEPALIVE_IDLE_S = 10
_KEEPALIVE_INTERVAL_S = 5
_KEEPALIVE_PROBES = 3


def keep_alive(stream: trio.SocketStream) -> None:
    """TCP keepalive on a star connection, so one that died silently is noticed (about 25 s)."""
    try:
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (
            ("TCP_KEEPIDLE", _KEEPALIVE_IDLE_S),
            ("TCP_KEEPINTVL", _KEEPALIVE_INTERVAL_S),
            ("TCP_KEEPCNT", _KEEPALIVE_PROBES),
        ):
            if hasattr(socket, name):
                stream.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    except OSError as exc:  # not fatal: the link still works, it is just noticed later when it dies
        log.debug("cannot set TCP keepalive: %s", exc)


class StarLinks:
    """One star endpoint's links (at the hub one per client, at a client the one to the hub) and their connections.

    Args:
        state: the endpoint's shared state.
        relay: at the hub, ``relay(origin, dest, frame)`` queues a frame from one client for another.
    """

    def __init__(self, state: EndpointState, relay: Callable[[str, str, bytes], None] | None = None) -> None:
        self._state = state
        self._relay = relay
        self.peers: dict[str, StarPeer] = {}
        self.clients: dict[str, Link] = {}  # at the hub: each client's current connection

    # ------------------------------------------------------------------------------ the table

    def install(self, peer: StarPeer, link: Link) -> None:
        """Make ``link`` the connection of ``peer``'s link, resuming at ``link.resume_from``."""
        peer.take_ack(link.resume_from)
        peer.written = link.resume_from
        peer.heard_at = link.written_at = trio.current_time()  # the handshake just went both ways
        peer.conn = link
        peer.connected = True
        if self._state.is_hub:
            self.clients[peer.name] = link
        peer.poke()
        self._state.notify_links()

    def uninstall(self, peer: StarPeer, link: Link) -> None:
        if peer.conn is link:
            peer.conn = None
            peer.poke()
        if self.clients.get(peer.name) is link:
            del self.clients[peer.name]
            self._state.notify_links()

    def end_link(self, peer: StarPeer, reason: str) -> None:
        """A star link is over for good: close its connection and drop its frames."""
        if peer.ended is None:
            peer.ended = reason
        if peer.conn is not None:
            peer.conn.raw.socket.close()
            self.uninstall(peer, peer.conn)
        peer.outbox.clear()
        peer.acked = peer.written = peer.started = peer.high_written = peer.sent
        peer.poke()
        self._state.notify_links()

    def disagree(self, exc: AgreementMismatch) -> None:
        """End the links that a peer running something else ends (see :meth:`EndpointState.disagree`)."""
        state = self._state
        if state.is_hub and exc.party is not None:
            peer = self.peers.get(exc.party)
            if peer is None:
                peer = self.peers[exc.party] = StarPeer(exc.party)
            self.end_link(peer, exc.detail)
        elif state.is_star_client:
            peer = self.peers[state.hub]  # type: ignore[index]
            if peer.ended is None:
                peer.ended = exc.detail
            peer.poke()

    def close(self) -> None:
        """Close every connection (synchronously) and wake every task waiting on a link."""
        for link in [*self.clients.values(), *(p.conn for p in self.peers.values() if p.conn is not None)]:
            link.raw.socket.close()
        self.clients.clear()
        for peer in self.peers.values():
            peer.conn = None
            peer.poke()

    def link_ended(self, peer: StarPeer) -> PeerUnreachable | AgreementMismatch:
        """The error of a send on a star link that has ended for good."""
        state = self._state
        exc = state.disagreement
        if exc is not None and (not state.is_hub or exc.party == peer.name):
            return state.disagreement_error()
        if state.is_hub:
            return PeerUnreachable(
                f"the link of {peer.name} to the hub {state.party} has ended: {peer.ended}", party=peer.name
            )
        failure = state.hub_failure
        detail = failure.detail if failure is not None else f"the link to the hub {state.hub} has ended: {peer.ended}"
        return PeerUnreachable(detail, party=state.hub)

    async def send(self, peer: StarPeer, index: int | None, frame: bytes) -> None:
        """Queue a frame on ``peer``'s link (behind a route header naming ``index``), then wait until it is written.

        From the moment it is queued the frame belongs to the link: it is written on the link's
        connection, and written again on the next one if the peer had not received it when the
        connection broke, until the peer acknowledges it or the link ends for good. So ``send``
        returns once the frame is written, or at once while the link is between two connections.
        """
        self._state.check_open()
        link = peer.conn
        # The connection's writer is idle and nothing is queued before this frame: write it here,
        # as the writer would, without waking it. Handing the frame over and waiting for the
        # writer cost two scheduler passes and two wake-ups a frame (benchmarks/tcp_rate.py).
        direct = (
            link is not None and not link.writing and peer.ended is None and not peer.leaving
            and peer.written == peer.sent and not peer.ack_due() and not peer.echo_owed
        )
        number = peer.queue(index, frame, urgent=has_tag(frame, AbortNotice.TAG), poke=not direct)
        if direct and number == peer.written == peer.sent - 1:
            assert link is not None
            link.writing = True
            try:
                await self._write_next_frame(peer, link)
            except (TransportBroken, TransportClosed) as exc:
                self._write_failed(peer, link, exc)  # the frame stays queued for the next connection
            except BaseException:
                self._write_failed(peer, link, None)  # cancelled mid-frame: the stream cannot go on
                raise
            finally:
                link.writing = False
                if link.writer_waits or peer.waiting or peer.written < peer.sent or peer.leaving:
                    link.writer_waits = False
                    peer.poke()  # what queued or waited meanwhile goes on
            if peer.high_written > number:
                return
        elif direct:
            peer.poke()
        box = [number]
        peer.waiting.append(box)  # its number moves if an urgent frame is queued ahead of it
        try:
            while True:
                self._state.check_open()
                if peer.high_written > box[0]:
                    return
                if peer.ended is not None:
                    raise self.link_ended(peer)
                if peer.conn is None:
                    return  # kept for the resumption
                await peer.changed.wait()
        finally:
            peer.waiting.remove(box)

    # ------------------------------------------------------------------------ one connection

    async def carry(self, peer: StarPeer, link: Link, peer_address: str) -> tuple[str, bool]:
        """Read and write one connection of a star link until it ends.

        Returns why it ended, and whether the link is over for good (the peer left, or broke the
        link's rules) rather than waiting to resume.
        """
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write_link, peer, link)
            if self._state.is_star_client:
                nursery.start_soon(self._watch_hub, peer, link)
            ended = await self._read_link(peer, link, peer_address)
            nursery.cancel_scope.cancel()
        if link.silent_s is not None:
            return f"heard nothing from it for {link.silent_s:g} s (stopped, or the path is dead)", False
        return ended

    def settle(self, link: Link) -> None:
        """Count what TLS wrote on an ended star connection beyond the frames' accounts (e.g. alerts)."""
        if link.wire is not None:
            self._state.tls_overhead_bytes += link.wire.sent_bytes - link.counted
            link.counted = link.wire.sent_bytes

    async def _watch_hub(self, peer: StarPeer, link: Link) -> None:
        """At a star client: close the connection once the hub has been silent too long.

        The client writes at least a keep-alive every ``keepalive_s`` and the hub answers each
        (whatever its own ``keepalive_s``), so silence for :data:`KEEPALIVE_MISSES` of them means
        the hub is stopped or the path is dead: the client re-dials (and gives up once it has
        heard nothing for ``resume_timeout_s``).
        """
        silence_s = KEEPALIVE_MISSES * self._state.keepalive_s
        while peer.conn is link:
            await trio.sleep_until(peer.heard_at + silence_s)
            for _ in range(3):  # bytes that arrived while the loop was busy are read first
                await trio.lowlevel.checkpoint()
            if peer.conn is link and trio.current_time() >= peer.heard_at + silence_s:
                link.silent_s = silence_s
                link.raw.socket.close()  # its reader and writer end
                return

    async def _write_link(self, peer: StarPeer, link: Link) -> None:
        """The one writer of a star connection: acknowledgements, then queued frames, then a BYE.

        Frames go out in their numbers' order from ``peer.written`` (the resume point, on a new
        connection). A failed write closes the connection (its reader then ends); the frame stays
        queued for the next connection.
        """
        state = self._state
        try:
            while peer.conn is link:
                keepalive_at = link.written_at + state.keepalive_s
                if link.writing:  # a send writes its own frame (see send) and wakes this after it
                    link.writer_waits = True
                    await peer.changed.wait()  # (no keep-alive is due before that write ends)
                    continue
                link.writing = True
                try:
                    # An idle link's ACK is its keep-alive; the hub answers a client's with its own.
                    if peer.ack_due() or peer.echo_owed or trio.current_time() >= keepalive_at:
                        peer.echo_owed = False
                        count, owed_bytes = peer.received, peer.ack_owed_bytes
                        await self._write_control(link, ACK_INDEX, count)
                        peer.ack_sent = max(peer.ack_sent, count)
                        peer.ack_owed_bytes = max(0, peer.ack_owed_bytes - owed_bytes)
                        continue
                    if peer.written < peer.sent:
                        await self._write_next_frame(peer, link)
                        peer.poke()
                        continue
                    if peer.leaving and not peer.bye_written:
                        await self._write_control(link, BYE_INDEX, peer.received)
                        peer.ack_sent = peer.received
                        peer.bye_written = True
                        peer.poke()
                        return
                finally:
                    link.writing = False
                with trio.move_on_at(keepalive_at):
                    await peer.changed.wait()
        except (TransportBroken, TransportClosed) as exc:
            self._write_failed(peer, link, exc)

    def _write_failed(self, peer: StarPeer, link: Link, exc: Exception | None) -> None:
        """A write on a star connection failed (``exc``) or stopped mid-frame (``None``): close the
        connection (its reader ends too); its unwritten frames stay queued for the next one."""
        state = self._state
        if exc is not None and peer.conn is link and not state.closed:
            log.debug("%s: writing to %s failed: %s", state.party, peer.name, exc)
        link.raw.socket.close()
        self.uninstall(peer, link)

    async def _write_next_frame(self, peer: StarPeer, link: Link) -> None:
        """Write the link's frame number ``peer.written`` on ``link`` (the caller holds
        ``link.writing``) and move the link's counts on; a frame written before is a re-send. The
        caller wakes the link's waiters."""
        state = self._state
        number = peer.written
        index, frame = peer.frame(number)
        first = number >= peer.high_written
        relayed = state.is_hub and index is not None
        peer.started = max(peer.started, number + 1)
        peer.echo_owed = False  # the peer hears this frame
        await self._write_frame(link, index, frame, relayed=relayed, resend=not first)
        peer.high_written = max(peer.high_written, number + 1)
        if peer.conn is link and peer.written == number:
            peer.written = number + 1
        if first and relayed:
            state.relayed_frames += 1

    async def _write_frame(self, link: Link, index: int | None, frame: bytes, *, relayed: bool, resend: bool) -> None:
        """Write one frame on a star connection (its only writer) and count the bytes it cost.

        ``index`` is the roster position of a route header (``None``: the peer's own frame). This
        party's own frames add their route header to ``relay_overhead_bytes`` and the TLS records
        to ``tls_overhead_bytes``; a frame the hub relays (``relayed``) adds everything written to
        ``relay_overhead_bytes``, and a frame written again after a resumption (``resend``), or the
        part of one written before its connection broke, to ``resumption_overhead_bytes``.
        """
        state = self._state
        before = link.wire.sent_bytes if link.wire is not None else 0
        try:
            if index is None:
                await send_frame(link.channel, frame)
                plaintext = FRAMING_OVERHEAD_BYTES + len(frame)
            else:
                await send_routed_frame(link.channel, index, frame)
                plaintext = ROUTE_HEADER_BYTES + FRAMING_OVERHEAD_BYTES + len(frame)
        except BaseException:
            if link.wire is not None:  # a part written in vain: the frame is written again
                wasted = link.wire.sent_bytes - before
                link.counted += wasted
                state.resumption_overhead_bytes += wasted
            raise
        written = plaintext
        link.written_at = trio.current_time()
        if link.wire is not None:
            written = link.wire.sent_bytes - before
            link.counted += written
        if resend:
            state.resumption_overhead_bytes += written
            state.resent_frames += 1
        elif relayed:
            state.relay_overhead_bytes += written
        else:
            state.relay_overhead_bytes += plaintext - FRAMING_OVERHEAD_BYTES - len(frame)
            state.tls_overhead_bytes += written - plaintext

    async def _write_control(self, link: Link, index: int, count: int) -> None:
        """Write an ACK (or keep-alive) or BYE on a star connection; all it costs is resumption overhead."""
        before = link.wire.sent_bytes if link.wire is not None else 0
        try:
            await send_control(link.channel, index, count)
            link.written_at = trio.current_time()
        finally:
            if link.wire is not None:
                written = link.wire.sent_bytes - before
                link.counted += written
                self._state.resumption_overhead_bytes += written
        if link.wire is None:
            self._state.resumption_overhead_bytes += CONTROL_FRAME_BYTES

    def _violation(self, peer: StarPeer, peer_address: str, reason: str) -> tuple[str, bool]:
        log.warning("%s: closing the link of %s (%s): %s", self._state.party, peer.name, peer_address, reason)
        return reason, True

    async def _read_link(self, peer: StarPeer, link: Link, peer_address: str) -> tuple[str, bool]:
        """Read a star connection until it ends; returns what :meth:`carry` returns.

        At the hub, the client's own frames go to this endpoint's inbox and routed ones to the
        link of the party their header names. At a client, plain frames are the hub's and a
        routed frame is from the party its header names: the hub, which authenticated that
        party's connection, is trusted to name it. Control frames acknowledge this side's frames;
        a BYE ends the link. Once a newer connection of the link took over, nothing more is taken
        from this one, so every frame of the link counts (and is delivered) once.
        """
        state = self._state
        assert link.reader is not None
        limit = max(state.max_frame_bytes, CONTROL_BYTES)
        while True:
            try:
                index, frame = await link.reader.receive_routed_frame(limit)
            except trio.EndOfChannel:
                log.debug("%s: %s (%s) closed its connection", state.party, peer.name, peer_address)
                return f"{peer.name} closed the connection", False
            except FrameTooLarge as exc:
                return self._violation(peer, peer_address, str(exc))
            except TransportBroken as exc:
                return f"the connection broke ({exc.detail})", False
            except TransportClosed:
                return "the connection was closed", False
            if peer.conn is not link:
                return "a newer connection of the link took its place", False
            peer.heard_at = trio.current_time()
            if index in (ACK_INDEX, BYE_INDEX):
                if index == ACK_INDEX and state.is_hub:
                    peer.echo_owed = True  # a client's keep-alive is answered: it times the hub's silence
                    peer.poke()
                try:
                    count = control_count(frame)
                except DecodeError as exc:
                    return self._violation(peer, peer_address, str(exc))
                if not peer.take_ack(count):
                    return self._violation(
                        peer, peer_address, f"it acknowledged {count} frames, {peer.started} were written"
                    )
                if index == BYE_INDEX:
                    log.debug("%s: %s left, having received %d frames", state.party, peer.name, count)
                    return f"{peer.name} left", True
                continue
            if len(frame) > state.max_frame_bytes:
                return self._violation(peer, peer_address, str(FrameTooLarge(len(frame), state.max_frame_bytes)))
            if index is not None and index >= len(state.roster):
                return self._violation(
                    peer, peer_address, f"a route header named party #{index} of a roster of {len(state.roster)}"
                )
            peer.received += 1
            peer.ack_owed_bytes += len(frame)
            if peer.ack_due():
                peer.poke()
            if self._relay is not None and index is not None and state.roster[index] != state.party:
                self._relay(peer.name, state.roster[index], frame)
                continue
            sender = peer.name if state.is_hub or index is None else state.roster[index]
            try:
                state.inbox_send.send_nowait((sender, frame))
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return "the endpoint was closed", False

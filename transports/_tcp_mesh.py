"""The TCP mesh's links: one connection per ordered pair of parties, dialled on the first ``send``.

Frames from party A to party B travel on a connection that A dials to B's listener the first time
A sends to B; B only reads from it (:meth:`MeshLinks.read_frames`) and A only writes to it (after
the handshake), so each ordered pair has its own stream and per-pair order is TCP's order. A mesh
connection that breaks is dropped; the next ``send`` dials again (frames written into it that the
peer had not read are lost: the mesh does not resume).
"""

from __future__ import annotations

import trio

from fedproto.errors import PeerUnreachable, TransportBroken, TransportClosed
from fedproto.transports._framing import FRAMING_OVERHEAD_BYTES, FrameReader, FrameTooLarge, send_frame
from fedproto.transports._tcp_dial import Dialer
from fedproto.transports._tcp_state import EndpointState, Link, log


class MeshLinks:
    """A mesh party's outgoing connections (one per peer it sent to), and the reading of incoming ones."""

    def __init__(self, state: EndpointState, dialer: Dialer) -> None:
        self._state = state
        self._dialer = dialer
        self._send_locks: dict[str, trio.Lock] = {}
        self._outgoing: dict[str, Link] = {}

    def close(self) -> None:
        """Close every outgoing connection (synchronously)."""
        for link in self._outgoing.values():
            link.raw.socket.close()
        self._outgoing.clear()

    async def send(self, dest: str, frame: bytes) -> None:
        """Write ``frame`` on the connection to ``dest``, dialling it first if there is none.

        Raises:
            PeerUnreachable, TransportClosed: as :meth:`TcpTransport.send` says.
        """
        state = self._state
        lock = self._send_locks.get(dest)
        if lock is None:
            lock = self._send_locks[dest] = trio.Lock()
        # An uncontended lock is taken without a schedule point (send_frame has its own): a
        # cancelled send still ends here, before the lock, with nothing written.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            state.check_open()
            link = self._outgoing.get(dest)
            if link is None:
                link = self._outgoing[dest] = await self._dialer.dial(dest)
            wire_before = link.wire.sent_bytes if link.wire is not None else 0
            try:
                await send_frame(link.channel, frame)
            except TransportBroken as exc:
                self._drop(dest, link)
                state.check_open()
                raise PeerUnreachable(
                    f"the connection to {dest} broke", party=dest
                ) from (exc.__cause__ or exc)
            except TransportClosed:
                self._drop(dest, link)
                state.check_open()
                raise
            except BaseException:
                # Cancelled (or failed) mid-frame: the stream's state is unknown, so drop it.
                self._drop(dest, link)
                raise
            if link.wire is not None:
                written = link.wire.sent_bytes - wire_before
                state.tls_overhead_bytes += written - FRAMING_OVERHEAD_BYTES - len(frame)
        finally:
            lock.release()

    def _drop(self, dest: str, link: Link) -> None:
        if self._outgoing.get(dest) is link:
            del self._outgoing[dest]
        link.raw.socket.close()

    async def read_frames(self, stream: trio.abc.Stream, reader: FrameReader, peer: str, peer_address: str) -> None:
        """Put every frame of an accepted connection from ``peer`` in the inbox, until it ends."""
        state = self._state
        while True:
            try:
                frame = await reader.receive_frame(state.max_frame_bytes)
            except trio.EndOfChannel:
                log.debug("%s: %s (%s) closed its connection", state.party, peer, peer_address)
                return
            except FrameTooLarge as exc:
                log.warning(
                    "%s: closing the connection from %s (%s): %s", state.party, peer, peer_address, exc
                )
                return
            except TransportBroken as exc:
                if not state.closed:
                    log.warning(
                        "%s: the connection from %s (%s) broke: %s", state.party, peer, peer_address, exc
                    )
                return
            except TransportClosed:
                return
            try:
                state.inbox_send.send_nowait((peer, frame))
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return

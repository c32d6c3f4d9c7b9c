"""The star's hub: admits each client's connection to its link, relays frames between clients, lingers.

Only the hub, the roster's first party, listens. A frame from client A for client B comes to the
hub behind an 8-byte route header naming B (:mod:`fedproto.transports._framing`, "routed
frames"); the hub does not decode it: it queues the frame's bytes on B's link and writes them,
unchanged, on B's connection behind a route header naming A. **The hub is trusted to name
senders**: it authenticated every client's connection, so a routed frame is from the client whose
connection it came in on; a compromised hub could misattribute, drop or replay relayed frames, and
since TLS protects each hop, not the path, it holds relayed frames in the clear.

A client's connection resumes its link when it brings the link's id (its resume secret, 16 random
bytes only the client's process and the hub know); the hub closes the link's older connection and
ignores what still arrives on it, so the count of the client's frames it states is final. Another
link id for the same party is refused while the link lives, so a copy of a kit cannot evict the
live party. When its own run is over the hub keeps relaying (:meth:`StarHub.linger`) until its
clients have said goodbye.
"""

from __future__ import annotations

import hmac
from typing import Any

import trio

from fedproto.codec import has_tag
from fedproto.errors import PeerUnreachable
from fedproto.messages import AbortNotice
from fedproto.transports._star_link import StarLinks
from fedproto.transports._star_peer import StarPeer
from fedproto.transports._tcp_handshake import HandshakeFailed
from fedproto.transports._tcp_state import EndpointState, Link, log


class StarHub:
    """The hub's side of every star link."""

    def __init__(self, state: EndpointState) -> None:
        self._state = state
        self.links = StarLinks(state, relay=self.relay)

    async def send(self, dest: str, frame: bytes) -> None:
        """Queue ``frame`` on ``dest``'s link and wait until it is written (see :meth:`StarLinks.send`)."""
        await self.links.send(await self._client_peer(dest), None, frame)

    async def _client_peer(self, dest: str) -> StarPeer:
        """``dest``'s link, waiting up to ``connect_timeout_s`` for it to first dial in."""
        state = self._state
        deadline = trio.current_time() + state.connect_timeout_s
        while True:
            state.check_open()
            peer = self.links.peers.get(dest)
            if peer is not None and peer.ended is not None:
                raise self.links.link_ended(peer)
            if peer is not None and peer.connected:
                return peer
            changed = state.links_changed
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                raise PeerUnreachable(
                    f"{dest} is not connected to the hub {state.party} "
                    f"(waited {state.connect_timeout_s} s for it to dial in)",
                    party=dest,
                )
            with trio.move_on_after(remaining):
                await changed.wait()

    def relay(self, origin: str, dest: str, frame: bytes) -> None:
        """Queue a frame from client ``origin`` on the link of client ``dest``."""
        peers = self.links.peers
        peer = peers.get(dest)
        if peer is None:  # it has not dialled in yet: the frame waits for it on its link
            peer = peers[dest] = StarPeer(dest)
        if peer.ended is not None:
            log.debug(
                "%s: dropped a frame from %s for %s, whose link has ended (%s)",
                self._state.party, origin, dest, peer.ended,
            )
            return
        # A failure notice goes ahead of the relayed frames queued for dest, so that it is not
        # stuck behind them (its receiver would end at its deadline, naming nobody).
        peer.queue(self._state.index[origin], frame, urgent=has_tag(frame, AbortNotice.TAG))

    def admit(self, name: str, link_id: bytes, received: int) -> tuple[list[Any], tuple[StarPeer, int, int]]:
        """In the handshake: admit a client's connection to its link (new or resumed).

        ``name`` is the authenticated name (from the certificate), so a connection can only ever
        take over its own party's link. The link resumes when the client brings the same link id
        (16 random bytes that only the client's process and the hub know: the link's resume
        secret); any older connection of the link is closed at once and what it still brings is
        ignored, so the count of the client's frames received, sent back in the acknowledgement,
        is final. A connection with another link id (another holder of the party's kit, or a new
        process of it) is refused while the link lives: only a link that has ended (its client
        said goodbye, or broke the link's rules) is replaced by a new one.

        Returns:
            The acknowledgement ``["ok", resumed, received]`` and ``(link, generation, resume
            point)``: the connection carries the link if no newer one was admitted meanwhile,
            and the hub writes its own frames again from the resume point (the number of the
            hub's frames the client says it received).

        Raises:
            HandshakeFailed: the link has ended, the count does not fit it, or the connection
                brings another link id while the party's link lives.
        """
        state, peers = self._state, self.links.peers
        peer = peers.get(name)
        if peer is not None and peer.link_id is not None and not hmac.compare_digest(peer.link_id, link_id):
            if peer.ended is None:
                raise HandshakeFailed(
                    f"{name!r} dialled in with another link while its link lives "
                    f"(a second holder of its kit?): only the link's own process may resume it"
                )
            log.info(
                "%s: %s dialled in with a new link; its previous one had ended (%s)", state.party, name, peer.ended
            )
            del peers[name]
            peer = None
        if peer is None:
            peer = peers[name] = StarPeer(name)
        resumed = peer.link_id is not None
        if resumed:
            if peer.ended is not None:
                raise HandshakeFailed(f"{name!r} tried to resume its link, which has ended: {peer.ended}")
            if not peer.acked <= received <= peer.started:
                raise HandshakeFailed(
                    f"{name!r} resumes having received {received} frames, but the hub wrote {peer.started} "
                    f"and {peer.acked} were acknowledged"
                )
            old = peer.conn
            if old is not None:
                old.raw.socket.close()  # its reader and writer end; what it still brings is ignored
                self.links.uninstall(peer, old)
            state.resumptions += 1
            log.info(
                "%s: %s resumes its link: it has %d of the hub's %d frames, the hub %d of its",
                state.party, name, received, peer.sent, peer.received,
            )
        else:
            peer.link_id = link_id  # frames relayed to it before it dialled in stay queued
        peer.generation += 1
        return ["ok", resumed, peer.received], (peer, peer.generation, received if resumed else 0)

    async def serve_client(self, admitted: tuple[StarPeer, int, int], link: Link, peer_address: str) -> None:
        """Carry one connection of a client's link until it ends."""
        state, links = self._state, self.links
        peer, generation, resume_from = admitted
        if peer.generation != generation or peer.ended is not None or links.peers.get(peer.name) is not peer:
            return  # a newer connection of the same link was admitted meanwhile
        link.resume_from = resume_from
        links.install(peer, link)
        try:
            reason, final = await links.carry(peer, link, peer_address)
        finally:
            links.uninstall(peer, link)
            link.raw.socket.close()
            links.settle(link)
        if final:
            links.end_link(peer, reason)
        elif not state.closed and peer.conn is None and peer.ended is None:
            log.warning(
                "%s: lost the connection of %s (%s): %s; its link waits for it to dial in again",
                state.party, peer.name, peer_address, reason,
            )

    async def linger(self) -> None:
        """Keep relaying until every client has left (see :meth:`TcpTransport.linger`)."""
        state = self._state

        def expected() -> list[str]:
            return sorted(p.name for p in self.links.peers.values() if p.connected and p.ended is None)

        with trio.move_on_after(state.linger_s):
            while expected():
                await state.links_changed.wait()
        if expected():
            log.warning(
                "%s: closing the hub with %s still connected or expected back after %s s",
                state.party, ", ".join(expected()), state.linger_s,
            )

"""A star client: dials the hub, carries its one link over successive connections, resumes it, leaves.

A client dials out to the hub (so a client behind NAT or a firewall that admits no inbound
connection can take part) and keeps one connection that carries both directions and the frames
it exchanges with every other party through the hub. When the connection breaks (reset, closed,
or silent: see the keep-alive in :mod:`fedproto.transports._star_link`) the client re-dials with
backoff until it has heard nothing from the hub for ``resume_timeout_s``; its hello carries the
link's id and how many of the hub's frames it received, the hub answers how many of the client's
it has, and each side writes the rest again: no frame is lost or delivered twice. The client
gives up, with :class:`~fedproto.errors.PeerUnreachable` naming the hub, after
``resume_timeout_s`` of silence, at once when the hub's address refuses connections (the hub is
gone), when the hub refuses the handshake, or when the hub no longer knows the link (a new hub
process). :meth:`StarClient.leave` is its goodbye (a BYE control frame).
"""

from __future__ import annotations

import secrets
from typing import Any

import trio

from fedproto.errors import AgreementMismatch, PeerUnreachable, TransportClosed
from fedproto.transports._star_link import StarLinks, keep_alive
from fedproto.transports._star_peer import StarPeer
from fedproto.transports._tcp_dial import Dialer
from fedproto.transports._tcp_handshake import LINK_ID_BYTES, HandshakeFailed
from fedproto.transports._tcp_state import EndpointState, log


class StarClient:
    """A star client's side of its link to the hub."""

    def __init__(self, state: EndpointState) -> None:
        assert state.hub is not None
        self._state = state
        self.links = StarLinks(state)
        self.peer = self.links.peers[state.hub] = StarPeer(state.hub, link_id=secrets.token_bytes(LINK_ID_BYTES))

    def resume_request(self) -> list[Any]:
        """What the client tells the hub when it dials: its link's id and the frames it received."""
        return [self.peer.link_id, self.peer.received]

    def check_resumption(self, resumed: bool, received: int) -> int:
        """The hub's answer to :meth:`resume_request`; returns how many of the client's frames it has.

        Raises:
            HandshakeFailed: the hub no longer knows the link, or states a count that cannot be.
        """
        peer = self.peer
        if peer.connected and not resumed:
            raise HandshakeFailed(
                f"the hub no longer knows the link of {self._state.party} (was it restarted?): "
                f"the frames exchanged so far cannot be resumed"
            )
        if not peer.acked <= received <= peer.started:
            raise HandshakeFailed(
                f"the hub says it received {received} frames of {self._state.party}, "
                f"who wrote {peer.started} and had {peer.acked} acknowledged"
            )
        return received

    async def send(self, dest: str, frame: bytes) -> None:
        """Queue ``frame`` for ``dest`` (through the hub) and wait until it is written (see :meth:`StarLinks.send`)."""
        state = self._state
        peer = await self._ready()
        await self.links.send(peer, None if dest == state.hub else state.index[dest], frame)

    async def _ready(self) -> StarPeer:
        """The link to the hub, once :meth:`run` has first connected it."""
        state, peer = self._state, self.peer
        deadline = trio.current_time() + state.connect_timeout_s + state.handshake_timeout_s
        while True:
            state.check_open()
            state.check_agreed()
            if state.hub_failure is not None:
                raise PeerUnreachable(state.hub_failure.detail, party=state.hub) from state.hub_failure
            if peer.connected:
                return peer
            changed = state.links_changed
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                hint = "" if state.serving else " (in a star, serve() dials the hub: it is not running)"
                raise PeerUnreachable(f"{state.party} has no connection to the hub {state.hub}{hint}", party=state.hub)
            with trio.move_on_after(remaining):
                await changed.wait()

    async def run(self, dialer: Dialer) -> None:
        """The client's :meth:`TcpTransport.serve`: dial the hub, carry the link, re-dial it when it breaks."""
        state, peer, links = self._state, self.peer, self.links
        hub = state.hub
        assert hub is not None
        address = state.addresses[hub]
        redial = False
        while True:
            try:
                link = await dialer.dial(hub, heard_at=peer.heard_at if redial else None)
            except PeerUnreachable as exc:
                if redial:
                    detail = f"{state.party} lost its connection to the hub {hub} at {address} and could not resume it"
                else:
                    detail = f"{state.party} cannot reach the hub"
                self._lose_hub(PeerUnreachable(f"{detail}: {exc.detail}", party=hub))
                return
            except (TransportClosed, AgreementMismatch):  # a mismatch was recorded by EndpointState.disagree
                return
            keep_alive(link.raw)
            if redial:
                state.resumptions += 1
                log.info(
                    "%s: resumed its link to the hub %s: the hub has %d of its %d frames, it %d of the hub's",
                    state.party, hub, link.resume_from, peer.sent, peer.received,
                )
            links.install(peer, link)
            try:
                reason, final = await links.carry(peer, link, str(address))
            finally:
                links.uninstall(peer, link)
                link.raw.socket.close()
                links.settle(link)
            if state.closed or peer.bye_written:
                return
            lost = f"{state.party} lost its connection to the hub {hub} at {address}: {reason}"
            if final:
                self._lose_hub(PeerUnreachable(lost, party=hub))
                return
            log.warning("%s; re-dialling to resume the link", lost)
            redial = True

    def _lose_hub(self, failure: PeerUnreachable) -> None:
        """Record why the client has no hub for good; ``receive`` raises it once the inbox is empty."""
        state = self._state
        if state.closed:
            return
        log.info("%s", failure)  # raised by send and receive: the party's one error line says it
        state.hub_failure = failure
        peer = self.peer
        if peer.ended is None:
            peer.ended = failure.detail
        peer.poke()
        state.inbox_send.close()
        state.notify_links()

    async def leave(self) -> None:
        """The client's graceful end: what it still has for the hub, then a goodbye (:meth:`TcpTransport.leave`)."""
        state, peer = self._state, self.peer
        if state.closed or state.hub_failure is not None or not peer.connected:
            return
        peer.leaving = True
        peer.poke()
        with trio.move_on_after(state.resume_timeout_s):
            while not peer.bye_written and state.hub_failure is None and not state.closed:
                await peer.changed.wait()
        if not peer.bye_written and not state.closed:
            log.warning("%s: could not say goodbye to the hub %s", state.party, state.hub)

"""A listening TCP endpoint (a mesh party, or a star's hub): accept, admit within the caps, handshake, refuse.

Pending handshakes: a listener holds at most ``max_pending_handshakes`` connections whose
handshake has not finished (the oldest is closed to make room for a new one) and at most
``max_pending_per_host`` from one source host (beyond it a new one is closed at once); an accept
that runs out of descriptors (``EMFILE``) backs off with one rate-limited line, and refusal lines
are bounded in all (:mod:`fedproto.transports._admission`).

A connection that fails its handshake (a stranger, a forger, a wrong version, session, roster or
topology, malformed bytes, a handshake longer than ``handshake_timeout_s``) is closed and logged
as a WARNING on ``logging.getLogger("fedproto.transports.tcp")``, once per peer host and then as
counts; what the listener wrote to it is counted in ``refused_bytes``, apart from the run's links.
The endpoint keeps serving everyone else. An accepted connection goes to the mesh
(:meth:`~fedproto.transports._tcp_mesh.MeshLinks.read_frames`) or, at a hub, to the client's link
(:meth:`~fedproto.transports._star_hub.StarHub.serve_client`).
"""

from __future__ import annotations

import socket

import trio

from fedproto.errors import AgreementMismatch, TransportBroken, TransportClosed
from fedproto.transports import _admission
from fedproto.transports._framing import FrameReader, FrameTooLarge
from fedproto.transports._star_hub import StarHub
from fedproto.transports._star_link import keep_alive
from fedproto.transports._tcp_address import TcpAddress, peername
from fedproto.transports._tcp_handshake import HandshakeFailed, Handshakes, Written, tls_module
from fedproto.transports._tcp_mesh import MeshLinks
from fedproto.transports._tcp_state import EndpointState, Link, log


class Listener:
    """Accepts an endpoint's incoming connections and runs the listener's side of their handshakes.

    Args:
        state: the endpoint's shared state.
        handshakes: the endpoint's handshakes.
        mesh: the mesh's links (``None`` at a hub), which read an accepted connection's frames.
        hub: the hub's side of the star links (``None`` in a mesh), which carries a client's connection.
        max_pending_handshakes, max_pending_per_host: the caps (see :class:`TcpTransport`).
    """

    def __init__(
        self,
        state: EndpointState,
        handshakes: Handshakes,
        *,
        mesh: MeshLinks | None,
        hub: StarHub | None,
        max_pending_handshakes: int | None,
        max_pending_per_host: int | None,
    ) -> None:
        self._state = state
        self._handshakes = handshakes
        self._mesh = mesh
        self._hub = hub
        self.listeners: list[trio.SocketListener] = []
        self._incoming: set[trio.SocketStream] = set()
        # Refused connections are logged once per peer host, then as counts, and at most
        # DEFAULT_MAX_REFUSAL_LINES lines per 10 s in all (no log flood from many addresses).
        self.refusals = _admission.BoundedRefusalLog(log, state.party, clock=trio.current_time)
        # Connections whose handshake has not finished, capped (a flood of silent ones). By
        # default the caps are never below the roster's size, so every party of a run may dial
        # at once from one host (a local launch, or clients behind one NAT).
        if max_pending_handshakes is None:
            max_pending_handshakes = max(_admission.DEFAULT_MAX_PENDING_HANDSHAKES, len(state.roster))
        if max_pending_per_host is None:
            max_pending_per_host = max(_admission.DEFAULT_MAX_PENDING_PER_HOST, len(state.roster))
        self.pending = _admission.PendingHandshakes(max_pending_handshakes, max_pending_per_host)

    def close(self) -> None:
        """Close the listening sockets and every connection in or after its handshake (synchronously)."""
        for listener in self.listeners:
            listener.socket.close()
        if self._state.listen_socket is not None:
            self._state.listen_socket.close()  # ours even if serve never ran
        for stream in self._incoming:
            stream.socket.close()
        self.refusals.flush()

    async def serve(self, task_status: trio.TaskStatus[int | None]) -> None:
        """Listen on this party's address and accept peers until the endpoint closes (:meth:`TcpTransport.serve`)."""
        state = self._state
        address = state.addresses[state.party]
        try:
            if state.listen_socket is not None:
                listeners = [self._from_socket(state.listen_socket)]
            else:
                listeners = await trio.open_tcp_listeners(address.port, host=address.host)
        except OSError as exc:
            reason = exc.strerror or str(exc)  # the OS's own words: "Address already in use", ...
            raise TransportBroken(f"{state.party} cannot listen on {address}: {reason}", party=state.party) from exc
        if address.port == 0:
            # Port 0 binds each address family to a different free port; keep one.
            for extra in listeners[1:]:
                extra.socket.close()
            listeners = listeners[:1]
        self.listeners = listeners
        try:
            port = listeners[0].socket.getsockname()[1]
            state.addresses[state.party] = TcpAddress(address.host, port)
            with trio.CancelScope() as scope:
                state.serve_scope = scope
                if state.closed:
                    scope.cancel()
                task_status.started(port)
                log.debug("%s: listening on %s", state.party, state.addresses[state.party])
                async with trio.open_nursery() as nursery:
                    for listener in listeners:
                        nursery.start_soon(
                            _admission.accept_forever, listener, lambda s: self._accepted(s, nursery), self._exhausted
                        )
        finally:
            for listener in listeners:
                listener.socket.close()

    @staticmethod
    def _from_socket(sock: socket.socket) -> trio.SocketListener:
        """A trio listener on an already bound stdlib socket (listening on it if needed)."""
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            sock.listen()
        return trio.SocketListener(trio.socket.from_stdlib_socket(sock))

    def _accepted(self, stream: trio.SocketStream, nursery: trio.Nursery) -> None:
        """A new connection: admit it to its handshake within the caps, or close it at once."""
        peer_address = peername(stream)
        host = peer_address.rpartition(":")[0] or peer_address
        ticket, evicted = self.pending.admit(host, stream)
        if evicted is not None:
            evicted.stream.socket.close()  # its handshake ends; counted as refused there
        if ticket is None:
            stream.socket.close()
            self._refuse(peer_address, f"{self.pending.max_per_host} handshakes from {host} are already pending", 0)
            return
        nursery.start_soon(self._handle_connection, stream, ticket)

    def _exhausted(self, exc: OSError) -> None:
        """Accepting failed for lack of descriptors or buffers: one rate-limited line, no traceback."""
        if not self._state.closed:
            self.refusals.log(
                "this listener", "out of resources",
                "%s: cannot accept connections (%s, %d handshakes pending); backing off",
                self._state.party, exc.strerror or exc, len(self.pending),
            )

    async def _handle_connection(self, stream: trio.SocketStream, ticket: _admission.Ticket | None = None) -> None:
        state = self._state
        peer_address = peername(stream)
        self._incoming.add(stream)
        wire = None
        try:
            if state.closed:
                return
            if state.is_hub:
                keep_alive(stream)
            channel: trio.abc.Stream = stream
            if state.tls is not None:
                wire = tls_module().MeteredStream(stream)
                channel = trio.SSLStream(wire, state.tls.listener, server_side=True, https_compatible=True)
            reader = FrameReader(channel)
            written = Written()  # the shared-secret handshake's bytes (TLS ones are the wire's)

            def handshake_written() -> int:
                return wire.sent_bytes if wire is not None else written.nbytes

            try:
                with trio.fail_after(state.handshake_timeout_s):
                    if wire is None:
                        peer, admitted = await self._handshakes.listener_secret(stream, reader, written)
                    else:
                        peer, admitted = await self._handshakes.listener_tls(channel, reader)
            except trio.TooSlowError:
                self._refuse(peer_address, f"no handshake within {state.handshake_timeout_s} s", handshake_written())
                return
            except HandshakeFailed as exc:
                self._refuse(peer_address, str(exc), handshake_written())
                return
            except trio.EndOfChannel:
                self._refuse(peer_address, "connection closed during the handshake", handshake_written())
                return
            except FrameTooLarge as exc:
                self._refuse(peer_address, f"oversized handshake message ({exc})", handshake_written())
                return
            except TransportBroken as exc:
                reason = tls_module().failure_reason(exc) if wire is not None else exc
                self._refuse(peer_address, f"connection broke during the handshake ({reason})", handshake_written())
                return
            except TransportClosed:
                if ticket is not None and ticket.evicted:  # closed to make room under the cap
                    reason = f"{self.pending.max_total} handshakes pending, the most allowed: the oldest is closed"
                    self._refuse(peer_address, reason, handshake_written())
                else:
                    state.handshake_bytes += handshake_written()  # we closed it: not the peer's doing
                return
            except AgreementMismatch as exc:  # an authenticated party of the run: not a stranger
                state.handshake_bytes += handshake_written()
                state.disagree(exc)
                return
            finally:
                if ticket is not None:
                    ticket.release()
            state.handshake_bytes += handshake_written()
            log.debug("%s: accepted %s from %s", state.party, peer, peer_address)
            if admitted is not None:
                assert self._hub is not None
                link = Link(stream, channel, wire, reader, counted=wire.sent_bytes if wire is not None else 0)
                await self._hub.serve_client(admitted, link, peer_address)
                return
            assert self._mesh is not None
            ready_bytes = wire.sent_bytes if wire is not None else 0
            try:
                await self._mesh.read_frames(channel, reader, peer, peer_address)
            finally:
                if wire is not None:  # a listener writes nothing after the handshake, unless TLS must
                    state.tls_overhead_bytes += wire.sent_bytes - ready_bytes
        finally:
            if ticket is not None:
                ticket.release()
            self._incoming.discard(stream)
            stream.socket.close()

    def _refuse(self, peer_address: str, reason: str, nbytes: int) -> None:
        # What we wrote to a connection we refused is counted apart from the handshakes of the
        # run's own links, so that strangers cannot inflate what those cost.
        state = self._state
        state.refused_bytes += nbytes
        if not state.closed:
            host = peer_address.rpartition(":")[0] or peer_address  # every port of a host is one peer
            self.refusals.log(
                host, "connection at the handshake", "%s: refused connection from %s: %s",
                state.party, peer_address, reason,
            )

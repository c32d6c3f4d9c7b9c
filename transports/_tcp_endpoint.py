"""One party's TCP endpoint, :class:`TcpTransport`: a thin class that owns and wires the parts.

The parts, each in its own module, share one :class:`~fedproto.transports._tcp_state.EndpointState`:

* :mod:`~fedproto.transports._tcp_handshake`: both sides of the TLS and shared-secret handshakes;
* :mod:`~fedproto.transports._tcp_dial`: dialling a peer with backoff;
* :mod:`~fedproto.transports._tcp_listener`: accepting, admission within the caps, refusals;
* :mod:`~fedproto.transports._tcp_mesh`: the mesh's per-pair connections;
* :mod:`~fedproto.transports._star_hub`, :mod:`~fedproto.transports._star_client` and
  :mod:`~fedproto.transports._star_link`: the star's resumable links and the hub's relay.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence

import trio

from fedproto.agreement import Agreement
from fedproto.codec import DEFAULT_MAX_FRAME_BYTES
from fedproto.errors import PeerUnreachable
from fedproto.roster import TlsFiles
from fedproto.transport import Transport
from fedproto.transports._admission import BoundedRefusalLog, PendingHandshakes
from fedproto.transports._framing import FRAMING_OVERHEAD_BYTES
from fedproto.transports._star_client import StarClient
from fedproto.transports._star_hub import StarHub
from fedproto.transports._star_link import StarLinks
from fedproto.transports._star_peer import StarPeer
from fedproto.transports._tcp_address import TcpAddress
from fedproto.transports._tcp_dial import Dialer
from fedproto.transports._tcp_handshake import Handshakes
from fedproto.transports._tcp_listener import Listener
from fedproto.transports._tcp_mesh import MeshLinks
from fedproto.transports._tcp_state import (
    DEFAULT_KEEPALIVE_S,
    DEFAULT_LINGER_S,
    DEFAULT_RESUME_TIMEOUT_S,
    EndpointState,
    Link,
)


def _shared(name: str) -> property:
    """A read-only attribute of the endpoint that its shared state holds."""
    return property(lambda self: getattr(self._state, name), doc=f"See the class's ``{name}``.")


class TcpTransport(Transport):
    """One party's TCP endpoint (see :mod:`fedproto.transports.tcp` for the protocol).

    Run it with ``await nursery.start(endpoint.serve)``. In a mesh every endpoint listens there,
    ``send`` dials peers on demand and ``receive`` returns frames from every authenticated
    incoming connection. In a star the hub (the roster's first party) listens there and a client
    endpoint's ``serve`` dials the hub and carries the one connection that both directions, and
    the frames relayed for every other party, share, re-dialling and resuming it if it breaks; a
    star client ends gracefully with :meth:`leave` (its goodbye to the hub), then :meth:`aclose`
    (:func:`open_tcp_network` and :meth:`TcpNetwork.endpoints` do both). Frames received but
    not yet returned by ``receive`` are buffered without bound (so two parties that both send
    before they receive cannot deadlock); ``max_frame_bytes`` bounds each frame.

    Exactly one of ``tls`` (mutual TLS 1.3, the secure mode) and ``secret`` (the shared-secret
    handshake, insecure: see :mod:`fedproto.transports.tcp`) is given.

    Args:
        party: this endpoint's party name (must be in ``roster``).
        roster: every party of the run, in order (unique names; with ``tls``, each one DNS label:
            :func:`fedproto.provision.check_party_name`).
        addresses: the address of every roster party (``TcpAddress`` or ``"host:port"``); this
            party's own entry is where it listens (port 0: pick a free port when serving). In a
            star only the hub's is needed (the others' are not used).
        secret: the per-run shared secret, at least 16 bytes, for the shared-secret handshake.
        tls: this party's kit (:class:`~fedproto.roster.TlsFiles`: CA certificate, its own
            certificate naming ``party``, its key); read and checked here.
        session: the run's session id (0 to 2**64 - 1); peers with another session are refused.
        max_frame_bytes: longest frame sent or accepted (bytes, at most 2**32 - 1).
        connect_timeout_s: how long ``send`` keeps dialling an unreachable peer (seconds).
        handshake_timeout_s: longest handshake, on either side (seconds).
        listen_socket: a bound TCP socket to serve on instead of binding this party's address
            (e.g. one inherited from :func:`fedproto.launcher.launch_local`, which binds every
            party's port itself so the choice cannot race); listened on if it is not yet. The
            endpoint owns it from now on and closes it in :meth:`aclose`. Its port must equal
            this party's address's port unless that port is 0. A star client, which does not
            listen, closes it at once.
        topology: ``"mesh"`` (every party listens, each ordered pair has its own connection) or
            ``"star"`` (only the hub listens; see :mod:`fedproto.transports.tcp`).
        linger_s: how long a star's hub keeps relaying in :meth:`linger`, waiting for its clients
            to leave (seconds).
        resume_timeout_s: how long a star client goes on without hearing from the hub (no frame,
            no keep-alive, no handshake), re-dialling it, before it gives up (seconds). A client
            that hears nothing gives up within this bound, so a stopped hub is named within one
            phase deadline when it is at most the deadline (``fedproto party`` sets it to the
            deadline).
        agreement: what this party runs (:class:`fedproto.agreement.Agreement`: protocol,
            options that must match, roster, session), sent in every hello and compared with the
            peer's (see "Agreement" in :mod:`fedproto.transports._tcp_handshake`); ``None`` states none and agrees
            only with peers that state none.
        keepalive_s: a star connection on which this side wrote nothing for this long gets a
            keep-alive, a 20-byte ACK control frame (resumption overhead), which the hub answers;
            a client that hears nothing for :data:`KEEPALIVE_MISSES` intervals closes the
            connection and re-dials (seconds; ``fedproto party``: at most a quarter of the
            deadline).
        max_pending_handshakes: most connections a listener holds whose handshake has not
            finished (a new one beyond it closes the oldest; see
            :mod:`fedproto.transports._admission`); default
            ``max(DEFAULT_MAX_PENDING_HANDSHAKES, len(roster))`` (512).
        max_pending_per_host: most such connections from one source host (a new one beyond it
            is closed at once); default ``max(DEFAULT_MAX_PENDING_PER_HOST, len(roster))``
            (128). A TLS dialer whose handshake such a close cuts tries again, with backoff,
            within ``connect_timeout_s`` (``resume_timeout_s`` for a re-dial).

    Attributes:
        addresses: ``{party: TcpAddress}`` of the parties whose address is known; this party's
            entry holds the real port once serving.
        topology: ``"mesh"`` or ``"star"``.
        hub: the star's hub (the roster's first party), ``None`` in a mesh.
        uses_tls: whether links are mutual TLS (else the shared-secret handshake).
        handshake_bytes: bytes this endpoint wrote to sockets during handshakes (TLS records or
            the shared-secret messages, framing included), those of connections it refused
            excepted.
        refused_bytes: bytes this endpoint wrote, as a listener, to connections it refused
            during their handshake (a stranger's, a forger's, one that timed out or broke): its
            TLS records and alerts, or its shared-secret messages.
        tls_overhead_bytes: bytes this endpoint wrote to sockets after TLS handshakes beyond the
            plaintext it sent (length prefixes and frames): record headers, content types, AEAD
            tags. 0 without TLS.
        relay_overhead_bytes: what the star's relaying made this endpoint write: at a client, the
            route headers of its frames for other clients (8 bytes each); at the hub, the whole
            second hop of every relayed frame as written to the socket (route header, length
            prefix, frame, and TLS records around them). 0 in a mesh.
        relayed_frames: frames this hub forwarded from one client to another (0 elsewhere).
        resumption_overhead_bytes: what making the star's links resumable made this endpoint write
            to sockets: acknowledgements, keep-alives and goodbyes (20-byte control frames) and frames written
            again after a re-dial, each with its TLS records. The re-dials' handshakes are in
            ``handshake_bytes``. 0 in a mesh.
        resumptions: star connections that resumed a link after a break (at a client: its
            re-dials that the hub accepted; at the hub: the clients' re-dials it accepted).
        resent_frames: frames this endpoint wrote again after a resumption.

    Raises:
        ValueError: bad roster, party, addresses (a star without its hub's), secret length,
            session, topology, limits or caps (a star's frames are at most 2**32 - 2 bytes: the route
            marker takes the last length); both or neither of ``secret`` and ``tls``; TLS
            material that cannot be read, is not for ``party``, not signed by its CA, or expired.
        TypeError: the secret is not bytes, or ``agreement`` is not an ``Agreement``.
    """

    framing_overhead_bytes = FRAMING_OVERHEAD_BYTES

    party = _shared("party")
    roster = _shared("roster")
    addresses = _shared("addresses")
    topology = _shared("topology")
    hub = _shared("hub")
    session = _shared("session")
    agreement = _shared("agreement")
    max_frame_bytes = _shared("max_frame_bytes")
    connect_timeout_s = _shared("connect_timeout_s")
    handshake_timeout_s = _shared("handshake_timeout_s")
    linger_s = _shared("linger_s")
    resume_timeout_s = _shared("resume_timeout_s")
    keepalive_s = _shared("keepalive_s")
    handshake_bytes = _shared("handshake_bytes")
    refused_bytes = _shared("refused_bytes")
    tls_overhead_bytes = _shared("tls_overhead_bytes")
    relay_overhead_bytes = _shared("relay_overhead_bytes")
    relayed_frames = _shared("relayed_frames")
    resumption_overhead_bytes = _shared("resumption_overhead_bytes")
    resumptions = _shared("resumptions")
    resent_frames = _shared("resent_frames")

    def __init__(
        self,
        party: str,
        roster: Sequence[str],
        addresses: Mapping[str, TcpAddress | str],
        secret: bytes | None = None,
        *,
        tls: TlsFiles | None = None,
        session: int = 0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        connect_timeout_s: float = 30.0,
        handshake_timeout_s: float = 10.0,
        listen_socket: socket.socket | None = None,
        topology: str = "mesh",
        linger_s: float = DEFAULT_LINGER_S,
        resume_timeout_s: float = DEFAULT_RESUME_TIMEOUT_S,
        agreement: Agreement | None = None,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        max_pending_handshakes: int | None = None,
        max_pending_per_host: int | None = None,
    ) -> None:
        state = self._state = EndpointState(
            party, roster, addresses, secret, tls=tls, session=session, max_frame_bytes=max_frame_bytes,
            connect_timeout_s=connect_timeout_s, handshake_timeout_s=handshake_timeout_s,
            listen_socket=listen_socket, topology=topology, linger_s=linger_s,
            resume_timeout_s=resume_timeout_s, agreement=agreement, keepalive_s=keepalive_s,
        )
        self.uses_tls = state.tls is not None
        # One of: the hub's side of the star links, a star client's, or the mesh's links.
        self._hub: StarHub | None = StarHub(state) if state.is_hub else None
        self._client: StarClient | None = StarClient(state) if state.is_star_client else None
        star = self._hub or self._client
        self._star_links: StarLinks | None = star.links if star is not None else None
        state.star_links = self._star_links
        self._handshakes = Handshakes(state, star)
        self._dialer = Dialer(state, self._handshakes)
        self._mesh = MeshLinks(state, self._dialer) if state.hub is None else None
        self._listener = Listener(
            state, self._handshakes, mesh=self._mesh, hub=self._hub,
            max_pending_handshakes=max_pending_handshakes, max_pending_per_host=max_pending_per_host,
        )

    def __repr__(self) -> str:
        state = self._state
        closed = " closed" if state.closed else ""
        mode = "tls" if self.uses_tls else "shared secret"
        if state.is_star_client:
            where = f"dialling the hub {state.hub} at {state.addresses[state.hub]}"  # type: ignore[index]
        else:
            where = f"at {state.addresses[state.party]}" + (" (star hub)" if state.hub is not None else "")
        return f"<TcpTransport {state.party} {where} ({mode}){closed}>"

    @property
    def _is_star_client(self) -> bool:
        return self._state.is_star_client

    # The parts' state, for tests that look inside.
    @property
    def _peers(self) -> dict[str, StarPeer]:
        return self._star_links.peers if self._star_links is not None else {}

    @property
    def _clients(self) -> dict[str, Link]:
        return self._star_links.clients if self._star_links is not None else {}

    @property
    def _pending(self) -> PendingHandshakes:
        return self._listener.pending

    @property
    def _listeners(self) -> list[trio.SocketListener]:
        return self._listener.listeners

    @property
    def _refusals(self) -> BoundedRefusalLog:
        return self._listener.refusals

    @property
    def _hub_failure(self) -> PeerUnreachable | None:
        return self._state.hub_failure

    async def serve(self, *, task_status: trio.TaskStatus[int | None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on this party's address and accept peers until :meth:`aclose`; a star client
        instead dials the hub and carries that connection.

        Use ``port = await nursery.start(endpoint.serve)``: ``task_status.started`` reports the
        bound port (also stored in ``self.addresses[self.party]``) once the listener accepts. A
        star client reports ``None`` at once and dials the hub (retrying with backoff until
        ``connect_timeout_s``), then carries the link: reads and writes its connection, and
        re-dials and resumes it when it breaks (see :mod:`fedproto.transports._star_client`); if it
        cannot reach the hub at first, or cannot resume the link, ``send`` and ``receive`` raise
        :class:`~fedproto.errors.PeerUnreachable` naming the hub (``receive`` after the frames
        already received), and ``serve`` returns.

        Raises:
            TransportClosed: the endpoint is closed.
            TransportBroken: the address cannot be bound (``__cause__`` is the OSError).
            RuntimeError: ``serve`` is already running.
        """
        state = self._state
        state.check_open()
        if state.serving:
            raise RuntimeError(f"the endpoint of {state.party} is already serving")
        state.serving = True
        if self._client is not None:
            with trio.CancelScope() as scope:
                state.serve_scope = scope
                task_status.started(None)
                await self._client.run(self._dialer)
            return
        await self._listener.serve(task_status)

    async def send(self, dest: str, frame: bytes) -> None:
        """Send ``frame`` to ``dest``, dialling it first if needed (see :meth:`Transport.send`).

        Returns once the frame is handed to the operating system, not when ``dest`` has read it.
        In a mesh, a cancelled send either wrote the whole frame or closes the connection, so the
        receiver drops the partial frame. In a star, a client's frame for another client goes to
        the hub behind a route header (the hub forwards it); the hub waits up to
        ``connect_timeout_s`` for a client that has not dialled in yet; the frame belongs to the
        link as soon as ``send`` is called, is delivered once even if the connection breaks (it
        is written again after the resumption), and ``send`` returns at once while the link is
        between two connections.

        Raises:
            AgreementMismatch: ``dest`` (at a star client: the hub) runs another protocol, other
                options or another roster (see "Agreement" in :mod:`fedproto.transports._tcp_handshake`).
            PeerUnreachable: ``dest`` is not in the roster, cannot be dialled within
                ``connect_timeout_s``, failed the handshake, or the connection broke
                (``__cause__`` is the underlying error); in a star, the hub cannot be reached
                or the link could not be resumed (at a client), ``dest`` did not dial in, or
                its link has ended (at the hub).
            TransportClosed: this endpoint was closed.
            ValueError: the frame exceeds ``max_frame_bytes``.
        """
        state = self._state
        state.check_open()
        state.check_agreed(dest)
        if dest not in state.roster_set:
            raise PeerUnreachable(f"{dest!r} is not in the roster", party=dest)
        if len(frame) > state.max_frame_bytes:
            raise ValueError(f"frame of {len(frame)} bytes exceeds the maximum of {state.max_frame_bytes}")
        if self._mesh is not None:
            await self._mesh.send(dest, frame)
        elif dest == state.party:
            state.deliver(state.party, frame)
        else:
            await (self._hub or self._client).send(dest, frame)  # type: ignore[union-attr]

    async def receive(self) -> tuple[str, bytes]:
        """Wait for the next ``(sender, frame)`` from any authenticated peer.

        Cancelling it loses no frame.

        Raises:
            TransportClosed: this endpoint was closed (also while waiting).
            PeerUnreachable: a star client cannot reach the hub or could not resume its link
                (once every frame received before is returned).
            AgreementMismatch: a peer runs another protocol, other options or another roster
                (found in a handshake; frames not yet returned are dropped: the run is over).
        """
        state = self._state
        state.check_open()
        state.check_agreed()
        try:
            return await state.inbox_receive.receive()
        except (trio.ClosedResourceError, trio.EndOfChannel):
            raise state.inbox_ended() from None

    def receive_nowait(self) -> tuple[str, bytes] | None:
        """The next ``(sender, frame)`` already received, else ``None`` (never waits).

        Raises:
            TransportClosed: this endpoint was closed.
            PeerUnreachable, AgreementMismatch: as for :meth:`receive`.
        """
        state = self._state
        state.check_open()
        state.check_agreed()
        try:
            return state.inbox_receive.receive_nowait()
        except trio.WouldBlock:
            return None
        except (trio.ClosedResourceError, trio.EndOfChannel):
            raise state.inbox_ended() from None

    async def leave(self) -> None:
        """A star client's graceful end: write what it still has for the hub, then say goodbye.

        Its frames not yet written (on a link that is being resumed, say) are written first,
        then a BYE, which tells the hub that the link is over and that the client received the
        hub's frames up to then; the hub stops waiting for it (:meth:`linger`). Waits at most
        ``resume_timeout_s``. Returns at once for any other endpoint, a closed one, or one that
        lost the hub. The endpoint stays open (:meth:`aclose` it after).
        """
        if self._client is not None:
            await self._client.leave()

    async def linger(self) -> None:
        """At a star's hub, keep relaying until every client has left.

        The hub's own run may end while clients still exchange frames through it, or while a
        client whose connection broke has yet to come back for the hub's last frames; closing
        then would cut them off. Waits until every client that dialled in has said goodbye (see
        :meth:`leave`), at most ``linger_s``; clients still expected are logged. A client that
        ended without a goodbye (killed, or failed) is waited for the whole ``linger_s``. Returns
        at once for any other endpoint, or a closed one.
        """
        if self._hub is not None and not self._state.closed:
            await self._hub.linger()

    async def aclose(self) -> None:
        """Stop serving and close the listener and every connection; idempotent.

        Frames received but not yet returned by ``receive`` are discarded. Afterwards ``send``
        and ``receive`` raise :class:`~fedproto.errors.TransportClosed`.
        """
        state = self._state
        if not state.closed:
            state.closed = True
            # Everything is closed synchronously, so a cancelled aclose still releases it all.
            if state.serve_scope is not None:
                state.serve_scope.cancel()
            self._listener.close()
            self._dialer.close()
            if self._mesh is not None:
                self._mesh.close()
            if self._star_links is not None:
                self._star_links.close()
            state.links_changed.set()
            state.inbox_receive.close()
            state.inbox_send.close()
        await trio.lowlevel.checkpoint()

"""What every part of one TCP endpoint shares: its checked settings, byte counts, inbox and fate.

:class:`EndpointState` is made once per :class:`~fedproto.transports.tcp.TcpTransport` and handed
to each of its parts (the handshakes, the dialer, the listener, the mesh's links, the star's
links): the settings (checked here, once), the counts of bytes that are not frames, the inbox
that ``receive`` reads, whether the endpoint is closed, and why its run ended early (a peer that
runs something else, or, at a star client, a hub lost for good). :class:`Link` is one
authenticated connection, as the dialer and the listener hand it to the mesh or the star.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import socket
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import trio

from fedproto.agreement import Agreement, check as check_agreement
from fedproto.errors import AgreementMismatch, PeerUnreachable, TransportClosed, TransportError
from fedproto.metering import ConnectionBytes
from fedproto.roster import MIN_SECRET_BYTES, TOPOLOGIES, TlsFiles
from fedproto.transports._framing import MAX_ROUTED_STREAM_FRAME_BYTES, MAX_WIRE_FRAME_BYTES, FrameReader
from fedproto.transports._tcp_address import TcpAddress
from fedproto.transports._tcp_handshake import record_digest, roster_digest, tls_module

if TYPE_CHECKING:
    from fedproto.transports._star_link import StarLinks

#: The one logger of the TCP transport, whichever part writes.
log = logging.getLogger("fedproto.transports.tcp")

#: Longest a star's hub keeps relaying after its own run, waiting for its clients to leave (s).
DEFAULT_LINGER_S = 60.0
#: Longest a star client keeps re-dialling the hub after its connection broke (s): the runtime's
#: default phase deadline, so a client is back before its peers give up on it.
DEFAULT_RESUME_TIMEOUT_S = 60.0
#: A star connection on which this side wrote nothing for this long gets a keep-alive (an ACK
#: control frame repeating the count), so a healthy idle peer is heard at least this often (s).
DEFAULT_KEEPALIVE_S = 5.0


@dataclasses.dataclass(eq=False)
class Link:
    """One authenticated connection: a mesh dialer's outgoing one, or a star's (both ways).

    Attributes:
        raw: the TCP stream (closed synchronously, through its socket).
        channel: what frames are written to: ``raw`` itself, or TLS over it.
        wire: counts the bytes TLS writes to ``raw`` (``None`` without TLS).
        reader: the frame reader of ``channel`` that the handshake used (it may hold the first
            bytes that followed it).
        counted: bytes of ``wire`` already attributed to a count (handshake, TLS, relay, resumption).
        resume_from: a star client's connection: how many of the client's frames the hub had
            received when it accepted it (the hub's resumption point).
        written_at: when this side last wrote on it (a star connection's keep-alive is due
            ``keepalive_s`` later).
        silent_s: set when a star client closed it because the hub was silent this long.
        writing: a star connection's write is under way (its writer task's, or a ``send`` that
            writes its own frame: see :meth:`~fedproto.transports._star_link.StarLinks.send`).
        writer_waits: the connection's writer waits for such a ``send`` to end.
    """

    raw: trio.SocketStream
    channel: trio.abc.Stream
    wire: Any = None
    reader: FrameReader | None = None
    counted: int = 0
    resume_from: int = 0
    written_at: float = -math.inf
    silent_s: float | None = None
    writing: bool = False
    writer_waits: bool = False


class EndpointState(ConnectionBytes):
    """One endpoint's settings (checked), counts, inbox and fate; see :class:`TcpTransport` for the arguments.

    Its counts of bytes that are not frames are those of :class:`~fedproto.metering.ConnectionBytes`.

    Raises:
        ValueError, TypeError: as :class:`~fedproto.transports.tcp.TcpTransport` says.
    """

    def __init__(
        self,
        party: str,
        roster: Sequence[str],
        addresses: Mapping[str, TcpAddress | str],
        secret: bytes | None,
        *,
        tls: TlsFiles | None,
        session: int,
        max_frame_bytes: int,
        connect_timeout_s: float,
        handshake_timeout_s: float,
        listen_socket: socket.socket | None,
        topology: str,
        linger_s: float,
        resume_timeout_s: float,
        agreement: Agreement | None,
        keepalive_s: float,
    ) -> None:
        roster = tuple(roster)
        if not roster or len(set(roster)) != len(roster) or not all(isinstance(p, str) for p in roster):
            raise ValueError("the roster must be a non-empty sequence of unique party names (str)")
        if party not in roster:
            raise ValueError(f"party {party!r} is not in the roster {list(roster)}")
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology must be 'star' or 'mesh', got {topology!r}")
        hub = roster[0] if topology == "star" else None
        parsed = {
            name: addr if isinstance(addr, TcpAddress) else TcpAddress.parse(addr)
            for name, addr in addresses.items()
        }
        if hub is not None and hub not in parsed:
            raise ValueError(f"no address for the hub {hub!r} (the roster's first party: in a star it alone listens)")
        missing = [p for p in roster if p not in parsed] if hub is None else []
        if missing:
            raise ValueError(f"no address for parties {missing}")
        extra = sorted(set(parsed) - set(roster))
        if extra:
            raise ValueError(f"addresses given for parties outside the roster: {extra}")
        if (secret is None) == (tls is None):
            raise ValueError(
                "give either TLS material (tls=...) or the shared secret (secret=...), not both or neither"
            )
        if secret is not None:
            if not isinstance(secret, (bytes, bytearray)):
                raise TypeError(f"the secret must be bytes, got {type(secret).__name__}")
            if len(secret) < MIN_SECRET_BYTES:
                raise ValueError(f"the secret must be at least {MIN_SECRET_BYTES} bytes, got {len(secret)}")
        if isinstance(session, bool) or not isinstance(session, int) or not 0 <= session < 2**64:
            raise ValueError(f"session must be an int in 0..2**64-1, got {session!r}")
        if agreement is not None and not isinstance(agreement, Agreement):
            raise TypeError(f"agreement must be a fedproto.agreement.Agreement, got {type(agreement).__name__}")
        frame_limit = MAX_WIRE_FRAME_BYTES if hub is None else MAX_ROUTED_STREAM_FRAME_BYTES
        if not 0 < max_frame_bytes <= frame_limit:
            raise ValueError(f"max_frame_bytes must be in 1..{frame_limit} in a {topology}, got {max_frame_bytes}")
        timeouts = {
            "connect_timeout_s": connect_timeout_s,
            "handshake_timeout_s": handshake_timeout_s,
            "linger_s": linger_s,
            "resume_timeout_s": resume_timeout_s,
            "keepalive_s": keepalive_s,
        }
        for name, value in timeouts.items():
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        if listen_socket is not None:
            if listen_socket.type != socket.SOCK_STREAM or listen_socket.family not in (
                socket.AF_INET,
                socket.AF_INET6,
            ):
                raise ValueError(f"listen_socket must be a TCP socket, got {listen_socket!r}")
            bound_port = listen_socket.getsockname()[1]
            wanted_port = parsed[party].port if party in parsed else 0
            if wanted_port not in (0, bound_port):
                raise ValueError(
                    f"listen_socket is bound to port {bound_port}, but {party}'s address is {parsed[party]}"
                )
            if hub is not None and party != hub:
                # Only the hub listens: a socket handed to a client is closed, so a peer that
                # dials it is refused at once instead of waiting in its backlog.
                log.debug("%s: closing the listening socket it was given (in a star only the hub listens)", party)
                listen_socket.close()
                listen_socket = None
        self.tls = None
        if tls is not None:
            from fedproto.provision import check_party_name

            for name in roster:
                check_party_name(name)
            if not isinstance(tls, TlsFiles):
                raise TypeError(f"tls must be TlsFiles, got {type(tls).__name__}")
            self.tls = tls_module().load_contexts(tls, party)

        self.party = party
        self.roster = roster
        self.addresses: dict[str, TcpAddress] = {p: parsed[p] for p in roster if p in parsed}
        self.topology = topology
        self.hub = hub
        self.index = {p: i for i, p in enumerate(roster)}
        self.linger_s = float(linger_s)
        self.resume_timeout_s = float(resume_timeout_s)
        self.keepalive_s = float(keepalive_s)
        self.session = session
        self.agreement = agreement
        self.agreement_record = agreement.to_bytes() if agreement is not None else None
        self.agreement_hash = record_digest(self.agreement_record)
        self.max_frame_bytes = max_frame_bytes
        self.connect_timeout_s = float(connect_timeout_s)
        self.handshake_timeout_s = float(handshake_timeout_s)
        self.listen_socket = listen_socket
        self.secret = bytes(secret) if secret is not None else b""
        self.roster_set = frozenset(roster)
        self.roster_hash = roster_digest(roster)
        # Bytes that are not frames (see "Bytes" in the docs of fedproto.transports.tcp).
        super().__init__()
        self.relayed_frames = 0
        self.resumptions = 0
        self.resent_frames = 0
        self.inbox_send, self.inbox_receive = trio.open_memory_channel[tuple[str, bytes]](math.inf)
        self.serve_scope: trio.CancelScope | None = None
        self.serving = False
        self.closed = False
        self.disagreement: AgreementMismatch | None = None
        self.hub_failure: PeerUnreachable | None = None  # why a star client lost the hub for good
        self.links_changed = trio.Event()  # set and replaced whenever a star link comes or goes
        self.star_links: StarLinks | None = None  # the star's links (set by the endpoint in a star)

    @property
    def is_hub(self) -> bool:
        return self.hub == self.party

    @property
    def is_star_client(self) -> bool:
        return self.hub is not None and self.hub != self.party

    def check_open(self) -> None:
        if self.closed:
            raise TransportClosed(f"the endpoint of {self.party} is closed", party=self.party)

    def notify_links(self) -> None:
        self.links_changed.set()
        self.links_changed = trio.Event()

    def records(self) -> list[bytes]:
        """This party's agreement record as the last field of its hello (none without a record)."""
        return [] if self.agreement_record is None else [self.agreement_record]

    def compare(self, theirs: Agreement | None, other: str) -> None:
        """Raise :class:`~fedproto.errors.AgreementMismatch` unless ``other`` runs what we run."""
        check_agreement(self.agreement, theirs, this_party=self.party, other=other)

    def disagree(self, exc: AgreementMismatch) -> None:
        """An authenticated peer runs something else: this endpoint's run is over.

        ``receive`` raises the mismatch from now on, and so does ``send`` to that peer (at a star
        client: to anyone, since everything goes through the hub); the endpoint stays open for
        the failure notices the runtime sends its other peers.
        """
        if self.closed or self.disagreement is not None:
            return
        log.debug("%s: %s", self.party, exc.detail)
        self.disagreement = exc
        if self.star_links is not None:
            self.star_links.disagree(exc)
        self.inbox_send.close()
        self.notify_links()

    def disagreement_error(self) -> AgreementMismatch:
        exc = self.disagreement
        assert exc is not None
        return AgreementMismatch(exc.detail, party=exc.party)

    def check_agreed(self, dest: str | None = None) -> None:
        """Raise the mismatch that ended this endpoint's run, if it concerns ``dest`` (``None``: any)."""
        exc = self.disagreement
        if exc is not None and (dest is None or self.is_star_client or exc.party == dest):
            raise self.disagreement_error()

    def deliver(self, sender: str, frame: bytes) -> None:
        """Put a frame in the inbox; raises what ``receive`` would once the inbox is closed."""
        try:
            self.inbox_send.send_nowait((sender, frame))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise self.inbox_ended() from None

    def inbox_ended(self) -> TransportError | AgreementMismatch:
        """What ``receive`` raises once the inbox is closed and empty."""
        if self.disagreement is not None and not self.closed:
            return self.disagreement_error()
        failure = self.hub_failure
        if failure is None or self.closed:
            return TransportClosed(f"the endpoint of {self.party} is closed", party=self.party)
        return PeerUnreachable(failure.detail, party=self.hub)

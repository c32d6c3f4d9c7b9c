"""TCP transport: mutually authenticated trio streams carrying length-prefixed frames, as a star or a mesh.

Theory of operation
-------------------
Two topologies (``topology=``; ``fedproto party`` and ``fedproto run --transport tcp`` use the
star, the roster says which):

* **Star** (``"star"``): only the **hub**, the roster's first party (the coordinating one:
  ``server``, ``coordinator``, ``root``), listens. Every other party (a *client* here) dials out
  to it from :meth:`TcpTransport.serve` and keeps that one connection, which carries both
  directions, so a client behind NAT or a firewall that admits no inbound connection can take
  part, and the hub's host needs one inbound port. Frames between the hub and a client are plain
  length-prefixed frames. A frame from client A for client B goes to the hub behind an 8-byte
  route header naming B (:mod:`fedproto.transports._framing`, "routed frames"); the hub does not
  decode it: it queues the frame's bytes for B and writes them, unchanged, on B's connection
  behind a route header naming A. B takes the sender from that header. **The hub is trusted to
  name senders**: it authenticated every client's connection (by its TLS certificate), so a
  routed frame is from the client whose connection it came in on; a client cannot claim another
  name, but a compromised hub could misattribute, drop or replay relayed frames, and since TLS
  protects each hop, not the path, it holds relayed frames in the clear (a protocol that must hide
  them from the coordinator encrypts them end to end, as SecAgg does its shares). Per link order
  holds (one TCP stream per hop, one queue per destination). The hub waits up to
  ``connect_timeout_s`` for a client it sends to that has not dialled in yet; a frame relayed to a
  client that is not connected waits at the hub until it is. A client whose connection to the hub
  cannot be made within ``connect_timeout_s``, or ends, raises
  :class:`~fedproto.errors.PeerUnreachable` naming the hub from ``send``, and from ``receive``
  once the frames already received are returned: the run ends at once with that error. When its
  own run is over the hub keeps relaying (:meth:`TcpTransport.linger`, up to ``linger_s``) until
  its clients have closed their connections, so it never cuts off clients still exchanging frames
  through it.
* **Mesh** (``"mesh"``, the default of :class:`TcpTransport` itself; for a LAN): every party
  listens on its own address (:meth:`TcpTransport.serve`). Frames from party A to party B travel
  on a connection that A dials to B's listener the first time A sends to B; B only reads from it
  and A only writes to it (after the handshake), so each ordered pair has its own stream and
  per-pair order is TCP's order.

Dialling is retried with exponential backoff (20 ms doubling to 1 s) until ``connect_timeout_s``
has passed, so parties may start in any order; then :class:`~fedproto.errors.PeerUnreachable`.
A mesh connection that breaks is dropped; the next ``send`` dials again.

Mutual TLS 1.3 (the default)
----------------------------
Each party holds a kit from ``fedproto provision`` (:mod:`fedproto.provision`): the federation
CA's certificate, its own certificate (naming the party: SAN DNS name = party name) and its key.
Every connection is TLS 1.3 only (:mod:`fedproto.transports._tls`: ``ssl`` contexts under
:class:`trio.SSLStream`) with both certificates verified against the federation CA::

    dialer D                                               listener L
      TLS 1.3 handshake, server_hostname = L       <->     CertificateRequest: D must send one
      (D checks L's certificate names L)                   (L verifies it; D's name := its SAN)
      hello [version, session, H(roster), D, L]    ->
                                                   <-      ["ok"]

The version names the topology (:data:`TLS_HELLO_VERSION` for a mesh dialer,
:data:`STAR_TLS_HELLO_VERSION` for a star client), so a party started with the other topology is
refused with a message saying so, instead of waiting on a link that the other side reads or
writes differently.

D checks the listener's certificate against the CA and the name of the party it dialled before it
writes a byte of the hello, so an impostor listener learns nothing. L takes D's name from D's
verified certificate, never from the hello: the hello's claimed dialer must equal it. L refuses
(closes the connection and logs a WARNING on ``logging.getLogger("fedproto.transports.tcp")``,
once per peer host and then as counts) a client that is not TLS 1.3, presents no certificate or
one from another CA, expired, not yet valid, or naming a party outside the roster; a hello whose
claimed name differs from the certificate's; and a wrong version, session or roster, a
connection meant for another party, malformed bytes or a handshake longer than
``handshake_timeout_s``. The endpoint keeps serving everyone else. Neither side sends a TLS
``close_notify`` (endpoints close sockets at once, as the shared-secret mode does), so an EOF is
taken as the peer closing; the length prefixes still detect a stream cut inside a frame.

Shared-secret handshake (explicit choice, insecure)
---------------------------------------------------
Built with a ``secret`` instead of ``tls`` (``TcpNetwork(..., insecure_shared_secret=True)``,
``fedproto party --insecure-shared-secret``), every connection instead starts with an HMAC
challenge-response over one secret shared by the whole run (every message is a length-prefixed
msgpack array, at most 16 KiB)::

    dialer D                                            listener L
      hello [version, session, H(roster), D, L, nonce_D]  ->
                                       <-  [nonce_L, MAC(secret, "listener" | ctx)]
      [MAC(secret, "dialer" | ctx)]                       ->
                                       <-  ["ok"]

where ``ctx = (version, session, H(roster), D, L, nonce_D, nonce_L)``, ``MAC`` is HMAC-SHA256, ``H`` is
SHA-256 over the msgpack-encoded roster and both nonces are 32 fresh random bytes. L proves its
name first (so a dialer never reveals a MAC to an impostor listener), then D proves its own; each
MAC covers the other side's fresh nonce, so neither can be replayed, and the role label keeps one
side's MAC from being reflected as the other's. MACs are compared with :func:`hmac.compare_digest`.
Refusals are logged as above. This keeps out anyone without the secret, but any holder of the
secret can claim any party's name, and frames after the handshake are neither encrypted nor
MACed: use it for loopback experiments only.

In both modes the sender of every received frame is the authenticated name of its connection,
never anything in the frame. Frames above ``max_frame_bytes`` are refused from the length prefix,
before their body is read; the stream cannot be resynchronised, so that connection is closed and
logged.

Bytes: ``framing_overhead_bytes == 4`` per frame (the length prefix, inside TLS). Bytes that are
not frames are counted per endpoint, as bytes this endpoint wrote, so summing over the parties
counts every byte once: :attr:`TcpTransport.handshake_bytes` (the whole TLS handshake and the
hello or acknowledgement as written to the socket, or the shared-secret handshake's messages
with their prefixes), :attr:`TcpTransport.tls_overhead_bytes` (after the handshake, socket
bytes minus the plaintext prefixes and frames: TLS record headers, content types and AEAD tags,
22 bytes per record of up to 16 KiB; 0 in shared-secret mode) and
:attr:`TcpTransport.relay_overhead_bytes` (the star's relaying: the 8-byte route header of each
frame a client sends for another client, and the hub's whole second hop of it as written to the
socket, route header, prefix, frame and TLS records included). A relayed frame's own bytes stay
counted once, by the runtime, on its logical link (sender to receiver), exactly as in a mesh or
in memory; what a run sends on the wire is the sum of its payload, framing, handshake, TLS and
relay bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import ipaddress
import logging
import math
import secrets
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import msgpack
import trio

from fedproto._logging import RateLimitedLog
from fedproto.codec import DEFAULT_MAX_FRAME_BYTES
from fedproto.errors import PeerUnreachable, TransportBroken, TransportClosed, TransportError
from fedproto.roster import TlsFiles
from fedproto.transport import Network, Transport
from fedproto.transports._framing import (
    FRAMING_OVERHEAD_BYTES,
    MAX_ROUTED_STREAM_FRAME_BYTES,
    MAX_WIRE_FRAME_BYTES,
    ROUTE_HEADER_BYTES,
    FrameReader,
    FrameTooLarge,
    send_frame,
    send_routed_frame,
)

__all__ = [
    "DEFAULT_LINGER_S",
    "HANDSHAKE_VERSION",
    "STAR_HANDSHAKE_VERSION",
    "STAR_TLS_HELLO_VERSION",
    "TLS_HELLO_VERSION",
    "TOPOLOGIES",
    "MIN_SECRET_BYTES",
    "TcpAddress",
    "TcpNetwork",
    "TcpTransport",
    "handshake_mac",
    "open_tcp_network",
    "roster_digest",
    "throwaway_tls",
]

log = logging.getLogger("fedproto.transports.tcp")

#: Version string of the shared-secret handshake; a peer that speaks another version is refused.
HANDSHAKE_VERSION = "fedproto-tcp/1"
#: Version string of the hello sent inside TLS.
TLS_HELLO_VERSION = "fedproto-tls/1"
#: Version string of a star client's shared-secret handshake (the hub refuses a mesh dialer).
STAR_HANDSHAKE_VERSION = "fedproto-tcp-star/1"
#: Version string of the hello a star client sends inside TLS.
STAR_TLS_HELLO_VERSION = "fedproto-tls-star/1"
#: How parties connect: ``"star"`` (only the hub, the roster's first party, listens; the others
#: dial out to it and it relays their frames to each other) or ``"mesh"`` (every party listens
#: and dials every peer it sends to).
TOPOLOGIES = ("star", "mesh")
#: Longest a star's hub keeps relaying after its own run, waiting for its clients to leave (s).
DEFAULT_LINGER_S = 60.0
#: Shortest accepted per-run secret (bytes).
MIN_SECRET_BYTES = 16

_NONCE_BYTES = 32
_MAC_BYTES = 32
_HANDSHAKE_MAX_FRAME_BYTES = 16 * 1024
_FIRST_RETRY_S = 0.02
_MAX_RETRY_S = 1.0


@dataclasses.dataclass(frozen=True)
class TcpAddress:
    """Where a party listens.

    Attributes:
        host: host name or IP address (IPv6 without brackets).
        port: TCP port, 0 to 65535 (0 lets :meth:`TcpTransport.serve` pick a free port).

    Raises:
        ValueError: empty host or port out of range.
        TypeError: host is not a string or port is not an int.
    """

    host: str
    port: int

    def __post_init__(self) -> None:
        if not isinstance(self.host, str):
            raise TypeError(f"TcpAddress.host must be a str, got {type(self.host).__name__}")
        if not self.host:
            raise ValueError("TcpAddress.host must not be empty")
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise TypeError(f"TcpAddress.port must be an int, got {type(self.port).__name__}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"TcpAddress.port must be in 0..65535, got {self.port}")

    @classmethod
    def parse(cls, text: str) -> "TcpAddress":
        """Parse ``"host:port"`` (IPv6 as ``"[::1]:port"``).

        Raises:
            ValueError: the text is not ``host:port`` with a port in 0..65535.
        """
        text = text.strip()
        if text.startswith("["):
            host, sep, rest = text[1:].partition("]")
            if not sep or not rest.startswith(":"):
                raise ValueError(f"bad address {text!r}: expected '[ipv6]:port'")
            port_text = rest[1:]
        else:
            host, sep, port_text = text.rpartition(":")
            if not sep:
                raise ValueError(f"bad address {text!r}: expected 'host:port'")
            if ":" in host:
                raise ValueError(f"bad address {text!r}: write IPv6 addresses as '[ipv6]:port'")
        if not host:
            raise ValueError(f"bad address {text!r}: the host is empty")
        if not port_text.isdigit():
            raise ValueError(f"bad address {text!r}: the port must be a number")
        port = int(port_text)
        if port > 65535:
            raise ValueError(f"bad address {text!r}: the port must be in 0..65535")
        return cls(host, port)

    def __str__(self) -> str:
        try:
            is_v6 = ipaddress.ip_address(self.host).version == 6
        except ValueError:
            is_v6 = False
        return f"[{self.host}]:{self.port}" if is_v6 else f"{self.host}:{self.port}"


class _HandshakeFailed(Exception):
    """The peer failed the handshake (the message says why)."""


# What a failed dialer handshake raises (anything else propagates).
_DIAL_FAILURES = (_HandshakeFailed, trio.TooSlowError, trio.EndOfChannel, FrameTooLarge, TransportBroken)


@dataclasses.dataclass(eq=False)
class _Link:
    """One authenticated connection: a mesh dialer's outgoing one, or a star's (both ways).

    Attributes:
        raw: the TCP stream (closed synchronously, through its socket).
        channel: what frames are written to: ``raw`` itself, or TLS over it.
        wire: counts the bytes TLS writes to ``raw`` (``None`` without TLS).
        reader: the frame reader of ``channel`` that the handshake used (it may hold the first
            bytes that followed it).
        lock: serialises writers of a star link (a mesh link uses the endpoint's per-peer lock).
        counted: bytes of ``wire`` already attributed to a count (handshake, TLS, relay).
    """

    raw: trio.SocketStream
    channel: trio.abc.Stream
    wire: Any = None
    reader: FrameReader | None = None
    lock: trio.Lock = dataclasses.field(default_factory=trio.Lock)
    counted: int = 0


def _tls_module() -> Any:
    """:mod:`fedproto.transports._tls`, imported when TLS is first used (``ssl`` and X.509)."""
    from fedproto.transports import _tls

    return _tls


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack_list(data: bytes, length: int, what: str) -> list[Any]:
    try:
        obj = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise _HandshakeFailed(f"malformed {what} ({type(exc).__name__})") from exc
    if not isinstance(obj, list) or len(obj) != length:
        raise _HandshakeFailed(f"malformed {what} (expected an array of {length})")
    return obj


def _expect_bytes(value: Any, n: int, what: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != n:
        raise _HandshakeFailed(f"malformed {what} (expected {n} bytes)")
    return value


def roster_digest(roster: Sequence[str]) -> bytes:
    """SHA-256 of the msgpack-encoded roster (32 bytes), bound into every handshake MAC."""
    return hashlib.sha256(_pack(list(roster))).digest()


def handshake_mac(
    secret: bytes,
    role: str,
    *,
    session: int,
    roster_hash: bytes,
    dialer: str,
    listener: str,
    dialer_nonce: bytes,
    listener_nonce: bytes,
    version: str = HANDSHAKE_VERSION,
) -> bytes:
    """HMAC-SHA256 (32 bytes) by which ``role`` proves its name in one handshake.

    The MAC input is the msgpack encoding of every field, so no two distinct contexts encode to
    the same bytes.

    Args:
        secret: the per-run secret.
        role: ``"dialer"`` or ``"listener"`` (the side that proves itself).
        session: the run's session id.
        roster_hash: :func:`roster_digest` of the run's roster.
        dialer: the dialling party's name.
        listener: the listening party's name.
        dialer_nonce: the dialer's 32 fresh random bytes.
        listener_nonce: the listener's 32 fresh random bytes.
        version: the handshake's version string (:data:`HANDSHAKE_VERSION` in a mesh,
            :data:`STAR_HANDSHAKE_VERSION` from a star client), so the MACs bind the topology.
    """
    context = _pack([version, role, session, roster_hash, dialer, listener, dialer_nonce, listener_nonce])
    return hmac.new(secret, context, hashlib.sha256).digest()


def _peername(stream: trio.SocketStream) -> str:
    try:
        host, port, *_ = stream.socket.getpeername()
    except (OSError, ValueError, TypeError):
        return "<unknown peer>"
    return str(TcpAddress(str(host), int(port)))


class TcpTransport(Transport):
    """One party's TCP endpoint (see the module docstring for the protocol).

    Run it with ``await nursery.start(endpoint.serve)``. In a mesh every endpoint listens there,
    ``send`` dials peers on demand and ``receive`` returns frames from every authenticated
    incoming connection. In a star the hub (the roster's first party) listens there and a client
    endpoint's ``serve`` dials the hub and carries the one connection that both directions, and
    the frames relayed for every other party, share. Frames received but not yet returned by
    ``receive`` are buffered without bound (so two parties that both send before they receive
    cannot deadlock); ``max_frame_bytes`` bounds each frame.

    Exactly one of ``tls`` (mutual TLS 1.3, the secure mode) and ``secret`` (the shared-secret
    handshake, insecure: see the module docstring) is given.

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
            ``"star"`` (only the hub listens; see the module docstring).
        linger_s: how long a star's hub keeps relaying in :meth:`linger`, waiting for its clients
            to leave (seconds).

    Attributes:
        addresses: ``{party: TcpAddress}`` of the parties whose address is known; this party's
            entry holds the real port once serving.
        topology: ``"mesh"`` or ``"star"``.
        hub: the star's hub (the roster's first party), ``None`` in a mesh.
        uses_tls: whether links are mutual TLS (else the shared-secret handshake).
        handshake_bytes: bytes this endpoint wrote to sockets during handshakes (TLS records or
            the shared-secret messages, framing included), refused ones included.
        tls_overhead_bytes: bytes this endpoint wrote to sockets after TLS handshakes beyond the
            plaintext it sent (length prefixes and frames): record headers, content types, AEAD
            tags. 0 without TLS.
        relay_overhead_bytes: what the star's relaying made this endpoint write: at a client, the
            route headers of its frames for other clients (8 bytes each); at the hub, the whole
            second hop of every relayed frame as written to the socket (route header, length
            prefix, frame, and TLS records around them). 0 in a mesh.
        relayed_frames: frames this hub forwarded from one client to another (0 elsewhere).

    Raises:
        ValueError: bad roster, party, addresses (a star without its hub's), secret length,
            session, topology or limits (a star's frames are at most 2**32 - 2 bytes: the route
            marker takes the last length); both or neither of ``secret`` and ``tls``; TLS
            material that cannot be read, is not for ``party``, not signed by its CA, or expired.
        TypeError: the secret is not bytes.
    """

    framing_overhead_bytes = FRAMING_OVERHEAD_BYTES

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
        frame_limit = MAX_WIRE_FRAME_BYTES if hub is None else MAX_ROUTED_STREAM_FRAME_BYTES
        if not 0 < max_frame_bytes <= frame_limit:
            raise ValueError(f"max_frame_bytes must be in 1..{frame_limit} in a {topology}, got {max_frame_bytes}")
        timeouts = {
            "connect_timeout_s": connect_timeout_s,
            "handshake_timeout_s": handshake_timeout_s,
            "linger_s": linger_s,
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
        self._tls = None
        if tls is not None:
            from fedproto.provision import check_party_name

            for name in roster:
                check_party_name(name)
            if not isinstance(tls, TlsFiles):
                raise TypeError(f"tls must be TlsFiles, got {type(tls).__name__}")
            self._tls = _tls_module().load_contexts(tls, party)

        self.party = party
        self.roster = roster
        self.addresses: dict[str, TcpAddress] = {p: parsed[p] for p in roster if p in parsed}
        self.topology = topology
        self.hub = hub
        self.linger_s = float(linger_s)
        self.session = session
        self.max_frame_bytes = max_frame_bytes
        self.connect_timeout_s = float(connect_timeout_s)
        self.handshake_timeout_s = float(handshake_timeout_s)
        self.uses_tls = self._tls is not None
        self.handshake_bytes = 0
        self.tls_overhead_bytes = 0
        self.relay_overhead_bytes = 0
        self.relayed_frames = 0
        self._listen_socket = listen_socket
        self._secret = bytes(secret) if secret is not None else b""
        self._roster_set = frozenset(roster)
        self._roster_hash = roster_digest(roster)
        self._inbox_send, self._inbox_receive = trio.open_memory_channel[tuple[str, bytes]](math.inf)
        self._send_locks: dict[str, trio.Lock] = {}
        self._outgoing: dict[str, _Link] = {}
        self._dialling: set[trio.SocketStream] = set()
        self._incoming: set[trio.SocketStream] = set()
        self._listeners: list[trio.SocketListener] = []
        self._serve_scope: trio.CancelScope | None = None
        self._serving = False
        self._closed = False
        # The star: the hub's connection to each client, the frames waiting to be relayed to each
        # client (origin's roster index, frame), a client's connection to the hub and why it ended.
        self._index = {p: i for i, p in enumerate(roster)}
        self._clients: dict[str, _Link] = {}
        self._relay_queues: dict[str, tuple[Any, Any]] = {}
        self._hub_link: _Link | None = None
        self._hub_failure: PeerUnreachable | None = None
        self._links_changed = trio.Event()  # set and replaced whenever a star link comes or goes
        # Refused connections are logged once per peer host, then as counts (no log flood).
        self._refusals = RateLimitedLog(log, party, clock=trio.current_time)

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        mode = "tls" if self.uses_tls else "shared secret"
        if self._is_star_client:
            where = f"dialling the hub {self.hub} at {self.addresses[self.hub]}"
        else:
            where = f"at {self.addresses[self.party]}" + (" (star hub)" if self.hub is not None else "")
        return f"<TcpTransport {self.party} {where} ({mode}){state}>"

    @property
    def _is_hub(self) -> bool:
        return self.hub == self.party

    @property
    def _is_star_client(self) -> bool:
        return self.hub is not None and self.hub != self.party

    def _hello_version(self, *, tls: bool) -> str:
        if tls:
            return TLS_HELLO_VERSION if self.hub is None else STAR_TLS_HELLO_VERSION
        return HANDSHAKE_VERSION if self.hub is None else STAR_HANDSHAKE_VERSION

    def _check_hello_version(self, version: Any, who: str, *, tls: bool) -> None:
        """Refuse a hello of another version, saying so plainly when it is the other topology's."""
        if version == self._hello_version(tls=tls):
            return
        star = STAR_TLS_HELLO_VERSION if tls else STAR_HANDSHAKE_VERSION
        mesh = TLS_HELLO_VERSION if tls else HANDSHAKE_VERSION
        if version in (star, mesh):
            theirs = "a star client" if version == star else "a full-mesh party"
            mine = "the hub of a star" if self._is_hub else "a full-mesh party"
            raise _HandshakeFailed(f"{who} dials as {theirs}, this endpoint is {mine} (the topologies differ)")
        what = "hello" if tls else "handshake"
        raise _HandshakeFailed(f"unsupported {what} version {version!r}" + (f" from {who}" if tls else ""))

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosed(f"the endpoint of {self.party} is closed", party=self.party)

    def _notify_links(self) -> None:
        self._links_changed.set()
        self._links_changed = trio.Event()

    # ----------------------------------------------------------------------------------- serve

    async def serve(self, *, task_status: trio.TaskStatus[int | None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on this party's address and accept peers until :meth:`aclose`; a star client
        instead dials the hub and carries that connection.

        Use ``port = await nursery.start(endpoint.serve)``: ``task_status.started`` reports the
        bound port (also stored in ``self.addresses[self.party]``) once the listener accepts. A
        star client reports ``None`` at once and dials the hub (retrying with backoff until
        ``connect_timeout_s``), then reads the frames the hub sends until the connection ends;
        if it cannot reach the hub or loses it, ``send`` and ``receive`` raise
        :class:`~fedproto.errors.PeerUnreachable` naming the hub (``receive`` after the frames
        already received), and ``serve`` returns.

        Raises:
            TransportClosed: the endpoint is closed.
            TransportBroken: the address cannot be bound (``__cause__`` is the OSError).
            RuntimeError: ``serve`` is already running.
        """
        self._check_open()
        if self._serving:
            raise RuntimeError(f"the endpoint of {self.party} is already serving")
        self._serving = True
        if self._is_star_client:
            with trio.CancelScope() as scope:
                self._serve_scope = scope
                task_status.started(None)
                await self._run_hub_link()
            return
        address = self.addresses[self.party]
        try:
            if self._listen_socket is not None:
                listeners = [self._listener_from_socket(self._listen_socket)]
            else:
                listeners = await trio.open_tcp_listeners(address.port, host=address.host)
        except OSError as exc:
            reason = exc.strerror or str(exc)  # the OS's own words: "Address already in use", ...
            raise TransportBroken(f"{self.party} cannot listen on {address}: {reason}", party=self.party) from exc
        if address.port == 0:
            # Port 0 binds each address family to a different free port; keep one.
            for extra in listeners[1:]:
                extra.socket.close()
            listeners = listeners[:1]
        self._listeners = listeners
        try:
            port = listeners[0].socket.getsockname()[1]
            self.addresses[self.party] = TcpAddress(address.host, port)
            with trio.CancelScope() as scope:
                self._serve_scope = scope
                if self._closed:
                    scope.cancel()
                task_status.started(port)
                log.debug("%s: listening on %s", self.party, self.addresses[self.party])
                await trio.serve_listeners(self._handle_connection, listeners)
        finally:
            for listener in listeners:
                listener.socket.close()

    @staticmethod
    def _listener_from_socket(sock: socket.socket) -> trio.SocketListener:
        """A trio listener on an already bound stdlib socket (listening on it if needed)."""
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            sock.listen()
        return trio.SocketListener(trio.socket.from_stdlib_socket(sock))

    async def _handle_connection(self, stream: trio.SocketStream) -> None:
        peer_address = _peername(stream)
        self._incoming.add(stream)
        wire = None
        try:
            if self._closed:
                return
            channel: trio.abc.Stream = stream
            if self._tls is not None:
                wire = _tls_module().MeteredStream(stream)
                channel = trio.SSLStream(wire, self._tls.listener, server_side=True, https_compatible=True)
            reader = FrameReader(channel)
            try:
                with trio.fail_after(self.handshake_timeout_s):
                    if wire is None:
                        peer = await self._listener_handshake(stream, reader)
                    else:
                        peer = await self._listener_tls_handshake(channel, reader)
            except trio.TooSlowError:
                self._refuse(peer_address, f"no handshake within {self.handshake_timeout_s} s")
                return
            except _HandshakeFailed as exc:
                self._refuse(peer_address, str(exc))
                return
            except trio.EndOfChannel:
                self._refuse(peer_address, "connection closed during the handshake")
                return
            except FrameTooLarge as exc:
                self._refuse(peer_address, f"oversized handshake message ({exc})")
                return
            except TransportBroken as exc:
                reason = _tls_module().failure_reason(exc) if wire is not None else exc
                self._refuse(peer_address, f"connection broke during the handshake ({reason})")
                return
            except TransportClosed:
                return
            finally:
                if wire is not None:
                    self.handshake_bytes += wire.sent_bytes
            log.debug("%s: accepted %s from %s", self.party, peer, peer_address)
            if self._is_hub:
                await self._serve_star_client(peer, stream, channel, reader, wire, peer_address)
                return
            ready_bytes = wire.sent_bytes if wire is not None else 0
            try:
                await self._read_frames(channel, reader, peer, peer_address)
            finally:
                if wire is not None:  # a listener writes nothing after the handshake, unless TLS must
                    self.tls_overhead_bytes += wire.sent_bytes - ready_bytes
        finally:
            self._incoming.discard(stream)
            stream.socket.close()

    def _refuse(self, peer_address: str, reason: str) -> None:
        if not self._closed:
            host = peer_address.rpartition(":")[0] or peer_address  # every port of a host is one peer
            self._refusals.log(
                host, "connection at the handshake", "%s: refused connection from %s: %s",
                self.party, peer_address, reason,
            )

    async def _read_frames(
        self, stream: trio.abc.Stream, reader: FrameReader, peer: str, peer_address: str
    ) -> None:
        while True:
            try:
                frame = await reader.receive_frame(self.max_frame_bytes)
            except trio.EndOfChannel:
                log.debug("%s: %s (%s) closed its connection", self.party, peer, peer_address)
                return
            except FrameTooLarge as exc:
                log.warning(
                    "%s: closing the connection from %s (%s): %s", self.party, peer, peer_address, exc
                )
                return
            except TransportBroken as exc:
                if not self._closed:
                    log.warning(
                        "%s: the connection from %s (%s) broke: %s", self.party, peer, peer_address, exc
                    )
                return
            except TransportClosed:
                return
            try:
                self._inbox_send.send_nowait((peer, frame))
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return

    async def _send_handshake(self, stream: trio.SocketStream, message: list[Any]) -> None:
        data = _pack(message)
        await send_frame(stream, data)
        self.handshake_bytes += FRAMING_OVERHEAD_BYTES + len(data)

    async def _listener_handshake(self, stream: trio.SocketStream, reader: FrameReader) -> str:
        hello = _unpack_list(await reader.receive_frame(_HANDSHAKE_MAX_FRAME_BYTES), 6, "hello")
        version, session, roster_hash, dialer, listener, dialer_nonce = hello
        self._check_hello_version(version, f"claimed party {dialer!r}", tls=False)
        if not isinstance(dialer, str):
            raise _HandshakeFailed("malformed hello (party name is not a string)")
        if dialer not in self._roster_set:
            raise _HandshakeFailed(f"claimed party {dialer!r} is not in the roster")
        if session != self.session:
            raise _HandshakeFailed(f"{dialer!r} is in session {session!r}, this run is {self.session}")
        if roster_hash != self._roster_hash:
            raise _HandshakeFailed(f"{dialer!r} has a different roster")
        if listener != self.party:
            raise _HandshakeFailed(f"{dialer!r} wanted party {listener!r}, this is {self.party!r}")
        dialer_nonce = _expect_bytes(dialer_nonce, _NONCE_BYTES, "hello nonce")
        listener_nonce = secrets.token_bytes(_NONCE_BYTES)
        context = dict(
            session=self.session,
            roster_hash=self._roster_hash,
            dialer=dialer,
            listener=self.party,
            dialer_nonce=dialer_nonce,
            listener_nonce=listener_nonce,
            version=version,
        )
        await self._send_handshake(
            stream, [listener_nonce, handshake_mac(self._secret, "listener", **context)]
        )
        (proof,) = _unpack_list(await reader.receive_frame(_HANDSHAKE_MAX_FRAME_BYTES), 1, "proof")
        proof = _expect_bytes(proof, _MAC_BYTES, "proof")
        if not hmac.compare_digest(proof, handshake_mac(self._secret, "dialer", **context)):
            raise _HandshakeFailed(f"bad MAC from claimed party {dialer!r} (wrong secret?)")
        await self._send_handshake(stream, ["ok"])
        return dialer

    async def _listener_tls_handshake(self, channel: trio.SSLStream[Any], reader: FrameReader) -> str:
        """TLS 1.3 with the dialer's certificate required, then the hello; returns the dialer's name."""
        tls = _tls_module()
        try:
            await channel.do_handshake()
        except trio.BrokenResourceError as exc:
            raise _HandshakeFailed(f"TLS handshake failed ({tls.failure_reason(exc)})") from exc
        except trio.ClosedResourceError as exc:  # we closed the socket (aclose) mid-handshake
            raise TransportClosed("the connection was closed during the TLS handshake") from exc
        try:
            named = tls.peer_party(channel)
        except ValueError as exc:
            raise _HandshakeFailed(str(exc)) from None
        if named not in self._roster_set:
            raise _HandshakeFailed(f"certificate for {named!r}, who is not in the roster")
        hello = _unpack_list(await reader.receive_frame(_HANDSHAKE_MAX_FRAME_BYTES), 5, "hello")
        version, session, roster_hash, dialer, listener = hello
        self._check_hello_version(version, repr(named), tls=True)
        if dialer != named:
            raise _HandshakeFailed(f"the certificate names {named!r} but the hello claims {dialer!r}")
        if session != self.session:
            raise _HandshakeFailed(f"{named!r} is in session {session!r}, this run is {self.session}")
        if roster_hash != self._roster_hash:
            raise _HandshakeFailed(f"{named!r} has a different roster")
        if listener != self.party:
            raise _HandshakeFailed(f"{named!r} wanted party {listener!r}, this is {self.party!r}")
        await send_frame(channel, _pack(["ok"]))
        return named

    # ------------------------------------------------------------------------------------ send

    async def send(self, dest: str, frame: bytes) -> None:
        """Send ``frame`` to ``dest``, dialling it first if needed (see :meth:`Transport.send`).

        Returns once the frame is handed to the operating system, not when ``dest`` has read it.
        A cancelled send either wrote the whole frame or closes the connection, so the receiver
        drops the partial frame. In a star, a client's frame for another client goes to the hub
        behind a route header (the hub forwards it); the hub waits up to ``connect_timeout_s``
        for a client that has not dialled in yet.

        Raises:
            PeerUnreachable: ``dest`` is not in the roster, cannot be dialled within
                ``connect_timeout_s``, failed the handshake, or the connection broke
                (``__cause__`` is the underlying error); in a star, the hub cannot be reached
                or was lost (at a client), or ``dest`` did not dial in (at the hub).
            TransportClosed: this endpoint was closed.
            ValueError: the frame exceeds ``max_frame_bytes``.
        """
        self._check_open()
        if dest not in self._roster_set:
            raise PeerUnreachable(f"{dest!r} is not in the roster", party=dest)
        if len(frame) > self.max_frame_bytes:
            raise ValueError(f"frame of {len(frame)} bytes exceeds the maximum of {self.max_frame_bytes}")
        if self.hub is not None:
            await self._send_star(dest, frame)
            return
        lock = self._send_locks.get(dest)
        if lock is None:
            lock = self._send_locks[dest] = trio.Lock()
        async with lock:
            self._check_open()
            link = self._outgoing.get(dest)
            if link is None:
                link = await self._connect(dest)
            wire_before = link.wire.sent_bytes if link.wire is not None else 0
            try:
                await send_frame(link.channel, frame)
            except TransportBroken as exc:
                self._drop_outgoing(dest, link)
                self._check_open()
                raise PeerUnreachable(
                    f"the connection to {dest} broke", party=dest
                ) from (exc.__cause__ or exc)
            except TransportClosed:
                self._drop_outgoing(dest, link)
                self._check_open()
                raise
            except BaseException:
                # Cancelled (or failed) mid-frame: the stream's state is unknown, so drop it.
                self._drop_outgoing(dest, link)
                raise
            if link.wire is not None:
                written = link.wire.sent_bytes - wire_before
                self.tls_overhead_bytes += written - FRAMING_OVERHEAD_BYTES - len(frame)

    def _drop_outgoing(self, dest: str, link: _Link) -> None:
        if self._outgoing.get(dest) is link:
            del self._outgoing[dest]
        link.raw.socket.close()

    async def _connect(self, dest: str) -> _Link:
        link = await self._dial(dest)
        self._outgoing[dest] = link
        return link

    async def _dial(self, dest: str) -> _Link:
        """Dial ``dest`` (retrying until ``connect_timeout_s``) and run the dialer's handshake."""
        address = self.addresses[dest]
        if address.port == 0:
            raise PeerUnreachable(f"the address of {dest} is unknown (port 0)", party=dest)
        deadline = trio.current_time() + self.connect_timeout_s
        retry_s = _FIRST_RETRY_S
        last_error: OSError | None = None
        while True:
            self._check_open()
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                raise PeerUnreachable(
                    f"cannot connect to {dest} at {address} within {self.connect_timeout_s} s",
                    party=dest,
                ) from last_error
            stream: trio.SocketStream | None = None
            with trio.move_on_after(remaining):
                try:
                    stream = await trio.open_tcp_stream(address.host, address.port)
                except OSError as exc:
                    last_error = exc
            if stream is not None:
                break
            await trio.sleep(max(0.0, min(retry_s, deadline - trio.current_time())))
            retry_s = min(2 * retry_s, _MAX_RETRY_S)

        self._dialling.add(stream)
        link = _Link(stream, stream)
        try:
            try:
                with trio.fail_after(self.handshake_timeout_s):
                    if self._tls is None:
                        link.reader = FrameReader(stream)
                        await self._dialer_handshake(stream, dest, link.reader)
                    else:
                        link.wire = _tls_module().MeteredStream(stream)
                        link.channel = trio.SSLStream(
                            link.wire, self._tls.dialer, server_hostname=dest, https_compatible=True
                        )
                        link.reader = FrameReader(link.channel)
                        try:
                            await self._dialer_tls_handshake(link.channel, dest, link.reader)
                        finally:
                            self.handshake_bytes += link.wire.sent_bytes
                            link.counted = link.wire.sent_bytes
            except _DIAL_FAILURES as exc:
                self._check_open()
                credentials = "secret" if self._tls is None else "certificates"
                reason = {
                    trio.TooSlowError: f"no answer within {self.handshake_timeout_s} s",
                    trio.EndOfChannel: f"refused by the peer (check {credentials}, session, roster and topology)",
                }.get(type(exc), str(exc))
                raise PeerUnreachable(
                    f"handshake with {dest} at {address} failed: {reason}", party=dest
                ) from exc
            except TransportClosed:
                self._check_open()
                raise
            self._check_open()
        except BaseException:
            stream.socket.close()
            raise
        finally:
            self._dialling.discard(stream)
        log.debug("%s: connected to %s at %s", self.party, dest, address)
        return link

    async def _dialer_handshake(self, stream: trio.SocketStream, dest: str, reader: FrameReader) -> None:
        version = self._hello_version(tls=False)
        dialer_nonce = secrets.token_bytes(_NONCE_BYTES)
        await self._send_handshake(
            stream, [version, self.session, self._roster_hash, self.party, dest, dialer_nonce]
        )
        listener_nonce, proof = _unpack_list(
            await reader.receive_frame(_HANDSHAKE_MAX_FRAME_BYTES), 2, "challenge"
        )
        listener_nonce = _expect_bytes(listener_nonce, _NONCE_BYTES, "challenge nonce")
        proof = _expect_bytes(proof, _MAC_BYTES, "challenge proof")
        context = dict(
            session=self.session,
            roster_hash=self._roster_hash,
            dialer=self.party,
            listener=dest,
            dialer_nonce=dialer_nonce,
            listener_nonce=listener_nonce,
            version=version,
        )
        if not hmac.compare_digest(proof, handshake_mac(self._secret, "listener", **context)):
            raise _HandshakeFailed(f"the listener failed to prove it is {dest!r} (wrong secret?)")
        await self._send_handshake(stream, [handshake_mac(self._secret, "dialer", **context)])
        ack = _unpack_list(await reader.receive_frame(_HANDSHAKE_MAX_FRAME_BYTES), 1, "acknowledgement")
        if ack != ["ok"]:
            raise _HandshakeFailed("malformed acknowledgement")

    async def _dialer_tls_handshake(self, channel: trio.SSLStream[Any], dest: str, reader: FrameReader) -> None:
        """TLS 1.3 checking ``dest``'s certificate and name, then the hello and its acknowledgement."""
        tls = _tls_module()
        try:
            await channel.do_handshake()
        except trio.BrokenResourceError as exc:
            raise _HandshakeFailed(f"TLS handshake failed ({tls.failure_reason(exc)})") from exc
        except trio.ClosedResourceError as exc:  # we closed the socket (aclose) mid-handshake
            raise TransportClosed("the connection was closed during the TLS handshake") from exc
        # Only now, with the listener's certificate checked against dest's name, may we speak.
        hello = [self._hello_version(tls=True), self.session, self._roster_hash, self.party, dest]
        await send_frame(channel, _pack(hello))
        try:
            frame = await reader.receive_frame(_HANDSHAKE_MAX_FRAME_BYTES)
        except TransportBroken as exc:  # a TLS alert: the listener refused our certificate
            raise _HandshakeFailed(f"refused by the peer ({tls.failure_reason(exc)})") from exc
        if _unpack_list(frame, 1, "acknowledgement") != ["ok"]:
            raise _HandshakeFailed("malformed acknowledgement")

    # ------------------------------------------------------------------------------------ star

    async def _send_star(self, dest: str, frame: bytes) -> None:
        """``send`` in a star: on the hub's connection to ``dest``, or on a client's to the hub."""
        if dest == self.party:
            self._deliver(self.party, frame)
            return
        if self._is_hub:
            link, index, peer = await self._client_link(dest), None, dest
        else:
            link, peer = await self._hub_link_ready(), self.hub
            index = None if dest == self.hub else self._index[dest]
        async with link.lock:
            self._check_open()
            try:
                await self._write_star(link, index, frame, relayed=False)
            except (TransportBroken, TransportClosed) as exc:
                link.raw.socket.close()  # its reader ends and unregisters it
                self._check_open()
                raise PeerUnreachable(f"the connection to {peer} broke", party=peer) from (exc.__cause__ or exc)
            except BaseException:
                # Cancelled (or failed) mid-frame: the stream's state is unknown, so drop it.
                link.raw.socket.close()
                raise

    async def _write_star(self, link: _Link, index: int | None, frame: bytes, *, relayed: bool) -> None:
        """Write one frame on a star link (its lock held) and count the bytes it cost.

        ``index`` is the roster position of a route header (``None``: the peer's own frame). This
        party's own frames add their route header to ``relay_overhead_bytes`` and the TLS records
        to ``tls_overhead_bytes``; a frame the hub relays (``relayed``) adds everything written.
        """
        before = link.wire.sent_bytes if link.wire is not None else 0
        if index is None:
            await send_frame(link.channel, frame)
            plaintext = FRAMING_OVERHEAD_BYTES + len(frame)
        else:
            await send_routed_frame(link.channel, index, frame)
            plaintext = ROUTE_HEADER_BYTES + FRAMING_OVERHEAD_BYTES + len(frame)
        written = plaintext
        if link.wire is not None:
            written = link.wire.sent_bytes - before
            link.counted += written
        if relayed:
            self.relay_overhead_bytes += written
        else:
            self.relay_overhead_bytes += plaintext - FRAMING_OVERHEAD_BYTES - len(frame)
            self.tls_overhead_bytes += written - plaintext

    def _settle_link(self, link: _Link) -> None:
        """Count what TLS wrote on an ended star link beyond the frames' accounts (e.g. alerts)."""
        if link.wire is not None:
            self.tls_overhead_bytes += link.wire.sent_bytes - link.counted
            link.counted = link.wire.sent_bytes

    def _deliver(self, sender: str, frame: bytes) -> None:
        try:
            self._inbox_send.send_nowait((sender, frame))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise self._inbox_ended() from None

    def _inbox_ended(self) -> TransportError:
        """What ``receive`` raises once the inbox is closed and empty."""
        failure = self._hub_failure
        if failure is None or self._closed:
            return TransportClosed(f"the endpoint of {self.party} is closed", party=self.party)
        return PeerUnreachable(failure.detail, party=self.hub)

    def _relay_queue(self, dest: str) -> tuple[Any, Any]:
        """The (send, receive) channel of frames waiting at the hub to be relayed to ``dest``."""
        queue = self._relay_queues.get(dest)
        if queue is None:
            queue = self._relay_queues[dest] = trio.open_memory_channel[tuple[int, bytes]](math.inf)
        return queue

    async def _client_link(self, dest: str) -> _Link:
        """At the hub: ``dest``'s connection, waiting up to ``connect_timeout_s`` for it to dial in."""
        deadline = trio.current_time() + self.connect_timeout_s
        while True:
            self._check_open()
            link = self._clients.get(dest)
            if link is not None:
                return link
            changed = self._links_changed
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                raise PeerUnreachable(
                    f"{dest} is not connected to the hub {self.party} "
                    f"(waited {self.connect_timeout_s} s for it to dial in)",
                    party=dest,
                )
            with trio.move_on_after(remaining):
                await changed.wait()

    async def _hub_link_ready(self) -> _Link:
        """At a star client: the connection to the hub, once :meth:`serve` has made it."""
        deadline = trio.current_time() + self.connect_timeout_s + self.handshake_timeout_s
        while True:
            self._check_open()
            if self._hub_link is not None:
                return self._hub_link
            if self._hub_failure is not None:
                raise PeerUnreachable(self._hub_failure.detail, party=self.hub) from self._hub_failure
            changed = self._links_changed
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                hint = "" if self._serving else " (in a star, serve() dials the hub: it is not running)"
                raise PeerUnreachable(f"{self.party} has no connection to the hub {self.hub}{hint}", party=self.hub)
            with trio.move_on_after(remaining):
                await changed.wait()

    async def _run_hub_link(self) -> None:
        """A star client's :meth:`serve`: dial the hub, then read what it sends until the end."""
        hub = self.hub
        assert hub is not None
        address = self.addresses[hub]
        try:
            link = await self._dial(hub)
        except PeerUnreachable as exc:
            self._lose_hub(PeerUnreachable(f"{self.party} cannot reach the hub: {exc.detail}", party=hub))
            return
        except TransportClosed:
            return
        self._hub_link = link
        self._notify_links()
        try:
            reason = await self._read_star_frames(link, hub, str(address))
        finally:
            self._hub_link = None
            link.raw.socket.close()
            self._settle_link(link)
        lost = f"{self.party} lost its connection to the hub {hub} at {address}: {reason}"
        self._lose_hub(PeerUnreachable(lost, party=hub))

    def _lose_hub(self, failure: PeerUnreachable) -> None:
        """Record why a star client has no hub; ``receive`` raises it once the inbox is empty."""
        if self._closed:
            return
        log.warning("%s", failure)
        self._hub_failure = failure
        self._inbox_send.close()
        self._notify_links()

    async def _serve_star_client(
        self,
        peer: str,
        stream: trio.SocketStream,
        channel: trio.abc.Stream,
        reader: FrameReader,
        wire: Any,
        peer_address: str,
    ) -> None:
        """At the hub: carry one client's connection, its frames in and every frame for it out."""
        link = _Link(stream, channel, wire, reader, counted=wire.sent_bytes if wire is not None else 0)
        previous = self._clients.get(peer)
        if previous is not None:
            log.info("%s: %s connected again from %s; closing its previous connection", self.party, peer, peer_address)
            previous.raw.socket.close()
        self._clients[peer] = link
        self._notify_links()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._forward_relayed, peer, link)
                await self._read_star_frames(link, peer, peer_address)
                nursery.cancel_scope.cancel()
        finally:
            link.raw.socket.close()
            if self._clients.get(peer) is link:
                del self._clients[peer]
                self._notify_links()
            self._settle_link(link)

    async def _forward_relayed(self, dest: str, link: _Link) -> None:
        """At the hub: write the frames other clients sent for ``dest`` on ``dest``'s connection.

        The frames are not decoded: each goes out as it came in, behind a route header naming
        the client that sent it.
        """
        _, queue = self._relay_queue(dest)
        while True:
            try:
                origin, frame = await queue.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return
            async with link.lock:
                try:
                    await self._write_star(link, origin, frame, relayed=True)
                except (TransportBroken, TransportClosed) as exc:
                    if not self._closed:
                        log.warning(
                            "%s: a frame from %s for %s was lost: %s", self.party, self.roster[origin], dest, exc
                        )
                    link.raw.socket.close()
                    return
                except BaseException:
                    link.raw.socket.close()
                    raise
            self.relayed_frames += 1

    async def _read_star_frames(self, link: _Link, peer: str, peer_address: str) -> str:
        """Read a star link until it ends; returns why it ended.

        At the hub, the client's own frames go to this endpoint's inbox and routed ones to the
        relay queue of the party their header names. At a client, plain frames are the hub's and a
        routed frame is from the party its header names: the hub, which authenticated that
        party's connection, is trusted to name it.
        """
        assert link.reader is not None
        while True:
            try:
                index, frame = await link.reader.receive_routed_frame(self.max_frame_bytes)
            except trio.EndOfChannel:
                log.debug("%s: %s (%s) closed its connection", self.party, peer, peer_address)
                return f"{peer} closed the connection"
            except FrameTooLarge as exc:
                log.warning("%s: closing the connection of %s (%s): %s", self.party, peer, peer_address, exc)
                return str(exc)
            except TransportBroken as exc:
                if not self._closed:
                    log.warning("%s: the connection of %s (%s) broke: %s", self.party, peer, peer_address, exc)
                return f"the connection broke ({exc.detail})"
            except TransportClosed:
                return "the connection was closed"
            if index is not None and index >= len(self.roster):
                log.warning(
                    "%s: closing the connection of %s (%s): a route header names party #%d of a roster of %d",
                    self.party, peer, peer_address, index, len(self.roster),
                )
                return f"a route header named party #{index}, outside the roster"
            if self._is_hub and index is not None and self.roster[index] != self.party:
                try:
                    self._relay_queue(self.roster[index])[0].send_nowait((self._index[peer], frame))
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    return "the endpoint was closed"
                continue
            sender = peer if self._is_hub or index is None else self.roster[index]
            try:
                self._inbox_send.send_nowait((sender, frame))
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return "the endpoint was closed"

    async def linger(self) -> None:
        """At a star's hub, keep relaying until every client has closed its connection.

        The hub's own run may end while clients still exchange frames through it; closing then
        would cut them off. Waits at most ``linger_s``, then returns (clients still connected are
        logged). Returns at once for any other endpoint, or a closed one.
        """
        if not self._is_hub or self._closed:
            return
        with trio.move_on_after(self.linger_s):
            while self._clients:
                await self._links_changed.wait()
        if self._clients:
            log.warning(
                "%s: closing the hub with %s still connected after %s s",
                self.party, ", ".join(sorted(self._clients)), self.linger_s,
            )

    # --------------------------------------------------------------------------------- receive

    async def receive(self) -> tuple[str, bytes]:
        """Wait for the next ``(sender, frame)`` from any authenticated peer.

        Cancelling it loses no frame.

        Raises:
            TransportClosed: this endpoint was closed (also while waiting).
            PeerUnreachable: a star client cannot reach the hub or lost it (once every frame
                received before is returned).
        """
        self._check_open()
        try:
            return await self._inbox_receive.receive()
        except (trio.ClosedResourceError, trio.EndOfChannel):
            raise self._inbox_ended() from None

    def receive_nowait(self) -> tuple[str, bytes] | None:
        """The next ``(sender, frame)`` already received, else ``None`` (never waits).

        Raises:
            TransportClosed: this endpoint was closed.
            PeerUnreachable: as for :meth:`receive`.
        """
        self._check_open()
        try:
            return self._inbox_receive.receive_nowait()
        except trio.WouldBlock:
            return None
        except (trio.ClosedResourceError, trio.EndOfChannel):
            raise self._inbox_ended() from None

    async def aclose(self) -> None:
        """Stop serving and close the listener and every connection; idempotent.

        Frames received but not yet returned by ``receive`` are discarded. Afterwards ``send``
        and ``receive`` raise :class:`~fedproto.errors.TransportClosed`.
        """
        if not self._closed:
            self._closed = True
            # Everything is closed synchronously, so a cancelled aclose still releases it all.
            if self._serve_scope is not None:
                self._serve_scope.cancel()
            for listener in self._listeners:
                listener.socket.close()
            if self._listen_socket is not None:
                self._listen_socket.close()  # ours even if serve never ran
            star_links = [*self._clients.values(), *([self._hub_link] if self._hub_link is not None else [])]
            for stream in [
                *self._incoming,
                *self._dialling,
                *(link.raw for link in [*self._outgoing.values(), *star_links]),
            ]:
                stream.socket.close()
            self._outgoing.clear()
            self._clients.clear()
            for send_channel, receive_channel in self._relay_queues.values():
                send_channel.close()
                receive_channel.close()
            self._links_changed.set()
            self._inbox_receive.close()
            self._inbox_send.close()
            self._refusals.flush()
        await trio.lowlevel.checkpoint()


@asynccontextmanager
async def _serving_all(endpoints: Mapping[str, TcpTransport], *, share_addresses: bool = False) -> AsyncIterator[None]:
    """Serve every endpoint in an internal nursery; close them all on exit.

    Listening endpoints start first; with ``share_addresses`` their bound addresses are then
    given to every endpoint, before star clients start dialling. On a normal exit the star
    clients here are closed first, then a hub here lingers (:meth:`TcpTransport.linger`) for
    clients elsewhere. An error of the body comes out as itself, not wrapped in the nursery's
    exception group.
    """
    try:
        async with trio.open_nursery() as nursery:
            try:
                clients = [e for e in endpoints.values() if e._is_star_client]
                for endpoint in endpoints.values():
                    if not endpoint._is_star_client:
                        await nursery.start(endpoint.serve)
                if share_addresses:
                    bound = {p: e.addresses[p] for p, e in endpoints.items() if not e._is_star_client}
                    for endpoint in endpoints.values():
                        endpoint.addresses.update(bound)
                for endpoint in clients:
                    await nursery.start(endpoint.serve)
                yield
                for endpoint in clients:
                    await endpoint.aclose()
                for endpoint in endpoints.values():
                    await endpoint.linger()
            finally:
                # aclose never blocks, so shielding it cannot hang; it must not be skipped.
                with trio.CancelScope(shield=True):
                    for endpoint in endpoints.values():
                        await endpoint.aclose()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


@contextmanager
def throwaway_tls(parties: Sequence[str]) -> Iterator[dict[str, TlsFiles]]:
    """Kits of a throwaway federation (fresh CA, its key dropped), in a private temporary directory.

    For in-process networks and tests: build the endpoints inside the ``with`` (they read their
    kit when constructed); the files are removed on exit.

    Yields:
        ``{party: TlsFiles}``.

    Raises:
        ValueError: a party name that cannot be a certificate name.
    """
    from fedproto.provision import ephemeral_credentials

    credentials = ephemeral_credentials(parties)
    with tempfile.TemporaryDirectory(prefix="fedproto-tls-") as tmp:  # mode 0700
        files = {}
        for party, creds in credentials.items():
            kit = Path(tmp) / party
            kit.mkdir(mode=0o700)
            files[party] = creds.write(kit)
        yield files


@asynccontextmanager
async def open_tcp_network(
    roster: Sequence[str],
    secret: bytes | None = None,
    *,
    tls: Mapping[str, TlsFiles] | None = None,
    host: str = "127.0.0.1",
    topology: str = "mesh",
    **kwargs: Any,
) -> AsyncIterator[dict[str, TcpTransport]]:
    """All parties of ``roster`` in this process, each serving on a free port of ``host``.

    For tests, benchmarks and examples. Every endpoint knows every other's bound address on entry
    (in a star: the hub's, the only one; the clients have dialled it, or are dialling); all are
    closed (and their listeners stopped) on exit. Links are mutual TLS 1.3 unless a ``secret`` is
    given (the shared-secret handshake, insecure: see the module docstring).

    Args:
        roster: every party of the run.
        secret: a per-run secret (at least 16 bytes) for the shared-secret handshake, or ``None``.
        tls: ``{party: TlsFiles}`` for every party; ``None`` (and no secret): a throwaway
            federation made for this network (:func:`throwaway_tls`).
        host: the address every party listens on (loopback by default).
        topology: ``"mesh"`` (every party listens) or ``"star"`` (only the roster's first party
            does; the others dial out to it).
        **kwargs: passed to :class:`TcpTransport` (``session``, ``max_frame_bytes``, timeouts).

    Yields:
        ``{party: TcpTransport}`` in roster order.

    Raises:
        ValueError: both ``secret`` and ``tls``, or ``tls`` missing a party.
    """
    roster = tuple(roster)
    kwargs["topology"] = topology
    listening = roster[:1] if topology == "star" else roster
    addresses = {p: TcpAddress(host, 0) for p in listening}
    if secret is not None:
        if tls is not None:
            raise ValueError("give either TLS material (tls=...) or the shared secret, not both")
        endpoints = {p: TcpTransport(p, roster, addresses, secret, **kwargs) for p in roster}
    elif tls is not None:
        missing = [p for p in roster if p not in tls]
        if missing:
            raise ValueError(f"no TLS material for {missing}")
        endpoints = {p: TcpTransport(p, roster, addresses, tls=tls[p], **kwargs) for p in roster}
    else:
        with throwaway_tls(roster) as files:
            endpoints = {p: TcpTransport(p, roster, addresses, tls=files[p], **kwargs) for p in roster}
    async with _serving_all(endpoints, share_addresses=True):
        yield endpoints


class TcpNetwork(Network):
    """TCP endpoints for the CLI registry: mutual TLS 1.3 and a star by default.

    Without ``addresses`` every party runs in this process on loopback (:func:`open_tcp_network`:
    a throwaway federation's TLS kits unless ``tls`` gives them). With ``addresses``, this process
    hosts the ``local`` parties at their given addresses and reaches the others at theirs; each
    local party needs its TLS kit (``tls``). In the star (the default) only the hub, the roster's
    first party, needs an address: the others dial out to it and it relays their frames to each
    other; ``topology="mesh"`` has every party listen, for a LAN. The shared-secret handshake (insecure: any holder of
    the secret can claim any name, frames are not encrypted) is used only when asked for with
    ``insecure_shared_secret=True``.

    :meth:`from_roster` builds one from a :class:`~fedproto.roster.Roster` (the roster file of a
    multi-process run: ``fedproto provision`` writes one per party), optionally serving on
    listening sockets inherited from the launcher.

    Args:
        addresses: ``{party: TcpAddress | "host:port"}`` for every party (in a star, the hub's
            at least), or None.
        secret: the per-run secret, with ``insecure_shared_secret=True`` only (required then with
            ``addresses``; without them a random one is drawn when ``None``).
        tls: the kit of the local party (a :class:`~fedproto.roster.TlsFiles`, for every local
            party it is for: its certificate names one party) or ``{party: TlsFiles}``.
        insecure_shared_secret: use the shared-secret handshake instead of TLS.
        host: listening host when ``addresses`` is None.
        listen_fds: ``{party: file descriptor}`` of bound TCP sockets that local parties serve
            on instead of binding their address (see :func:`fedproto.launcher.launch_local`);
            each is adopted (and closed with its endpoint) the first time its endpoint opens.
        topology: ``"star"`` (the default) or ``"mesh"`` (see :class:`TcpTransport`).
        **kwargs: passed to :class:`TcpTransport`.

    Attributes:
        max_frame_bytes_limit: the largest ``max_frame_bytes`` the wire allows (the 4-byte length
            prefix), so a front end can check the option before starting anything.

    Raises:
        ValueError: ``listen_fds`` without ``addresses`` or for parties without an address; a
            secret without ``insecure_shared_secret=True``; ``insecure_shared_secret=True`` with
            ``tls``, or with ``addresses`` but no secret; ``addresses`` without ``tls`` (in TLS
            mode).
    """

    name = "tcp"
    description = (
        "parties in separate processes or hosts: TCP streams under mutual TLS 1.3 (one certificate per party), "
        "length-prefixed frames"
    )
    max_frame_bytes_limit = MAX_WIRE_FRAME_BYTES

    def __init__(
        self,
        addresses: Mapping[str, TcpAddress | str] | None = None,
        secret: bytes | None = None,
        *,
        tls: TlsFiles | Mapping[str, TlsFiles] | None = None,
        insecure_shared_secret: bool = False,
        host: str = "127.0.0.1",
        listen_fds: Mapping[str, int] | None = None,
        topology: str = "star",
        **kwargs: Any,
    ) -> None:
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology must be 'star' or 'mesh', got {topology!r}")
        listen_fds = dict(listen_fds or {})
        if listen_fds and addresses is None:
            raise ValueError("listen_fds need the addresses of every party")
        unknown = sorted(set(listen_fds) - set(addresses or {}))
        if unknown:
            raise ValueError(f"listen_fds for parties without an address: {unknown}")
        if insecure_shared_secret:
            if tls is not None:
                raise ValueError("insecure_shared_secret=True uses the shared secret instead of TLS: give one of them")
            if addresses is not None and secret is None:
                raise ValueError("a TCP network with explicit addresses needs the run's secret")
        elif secret is not None:
            raise ValueError(
                "the shared-secret handshake is insecure (any holder of the secret can claim any party's name, "
                "frames travel unencrypted): pass insecure_shared_secret=True to use it, or give TLS material"
            )
        elif addresses is not None and tls is None:
            raise ValueError(
                "a TCP network with explicit addresses needs each local party's TLS kit (tls=..., made by "
                "fedproto provision), or insecure_shared_secret=True and the run's secret"
            )
        self.addresses = addresses
        self.secret = secret
        self.tls = tls
        self.insecure_shared_secret = insecure_shared_secret
        self.host = host
        self.listen_fds = listen_fds
        self.topology = topology
        self.kwargs = kwargs

    @classmethod
    def from_roster(
        cls,
        roster: Any,
        *,
        listen_fds: Mapping[str, int] | None = None,
        insecure_shared_secret: bool = False,
        **kwargs: Any,
    ) -> "TcpNetwork":
        """The network of a roster: its addresses, topology, TLS kit (or secret) and session, if any.

        Args:
            roster: a :class:`fedproto.roster.Roster`.
            listen_fds: ``{party: fd}`` of inherited listening sockets (``--listen-fd``).
            insecure_shared_secret: use the roster's secret and the shared-secret handshake
                (``--insecure-shared-secret``) instead of its TLS kit.
            **kwargs: passed to :class:`TcpTransport` (``max_frame_bytes``, timeouts; ``session``
                when the roster fixes none).

        Raises:
            ValueError: one line: ``session`` given that differs from the roster's; a roster
                without TLS material (and no ``insecure_shared_secret``), or without a secret
                (with it).
        """
        if roster.session is not None:
            if kwargs.setdefault("session", roster.session) != roster.session:
                raise ValueError(f"the roster is for session {roster.session}, not {kwargs['session']}")
        if insecure_shared_secret:
            if roster.secret is None:
                raise ValueError("the roster has no secret for the shared-secret handshake (it has a TLS kit: use it)")
            network = cls(
                dict(roster.addresses), roster.secret, insecure_shared_secret=True, listen_fds=listen_fds,
                topology=roster.topology, **kwargs,
            )
        else:
            if roster.tls is None:
                raise ValueError(
                    "the roster has no TLS material (a 'tls' block: make kits with fedproto provision); to use its "
                    "shared secret instead, which is insecure, pass --insecure-shared-secret"
                )
            network = cls(
                dict(roster.addresses), tls=roster.tls, listen_fds=listen_fds, topology=roster.topology, **kwargs
            )
        network.roster = tuple(roster.parties)
        return network

    def _tls_of(self, party: str) -> TlsFiles:
        if isinstance(self.tls, TlsFiles):
            return self.tls
        assert self.tls is not None
        if party not in self.tls:
            raise ValueError(f"no TLS kit for {party}")
        return self.tls[party]

    @asynccontextmanager
    async def endpoints(
        self, roster: Sequence[str] | None = None, local: Sequence[str] | None = None
    ) -> AsyncIterator[dict[str, TcpTransport]]:
        """Serving endpoints of the ``local`` parties (all of them by default); closed on exit.

        Args:
            roster: every party of the run, in order (default: the roster this network was
                built from, see :meth:`from_roster`).
            local: the parties this process hosts (default: all).

        Raises:
            ValueError: no roster known, or only some parties are local but no addresses were
                given.
        """
        if roster is None:
            if self.roster is None:
                raise ValueError("this TCP network needs the run's roster")
            roster = self.roster
        roster = tuple(roster)
        local = roster if local is None else tuple(local)
        if self.addresses is None:
            if set(local) != set(roster):
                raise ValueError("hosting only some parties needs the addresses of all of them")
            if self.insecure_shared_secret:
                secret = self.secret if self.secret is not None else secrets.token_bytes(32)
                network = open_tcp_network(roster, secret, host=self.host, topology=self.topology, **self.kwargs)
            else:
                tls = None if self.tls is None else {p: self._tls_of(p) for p in roster}
                network = open_tcp_network(roster, tls=tls, host=self.host, topology=self.topology, **self.kwargs)
            async with network as endpoints:
                yield endpoints
            return
        endpoints = {}
        for p in local:
            fd = self.listen_fds.pop(p, None)
            listen_socket = None if fd is None else socket.socket(fileno=fd)
            try:
                if self.insecure_shared_secret:
                    assert self.secret is not None
                    security: dict[str, Any] = {"secret": self.secret}
                else:
                    security = {"tls": self._tls_of(p)}
                endpoints[p] = TcpTransport(
                    p, roster, self.addresses, listen_socket=listen_socket, topology=self.topology,
                    **security, **self.kwargs,
                )
            except BaseException:
                if listen_socket is not None:
                    listen_socket.close()
                with trio.CancelScope(shield=True):  # releases the sockets already adopted
                    for endpoint in endpoints.values():
                        await endpoint.aclose()
                raise
        async with _serving_all(endpoints):
            yield endpoints

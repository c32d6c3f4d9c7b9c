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
  client that is not connected waits at the hub until it is. A client whose first connection to
  the hub cannot be made within ``connect_timeout_s`` raises
  :class:`~fedproto.errors.PeerUnreachable` naming the hub from ``send``, and from ``receive``
  once the frames already received are returned. A connection that breaks is re-dialled and the
  link resumes (below). When its own run is over the hub keeps relaying
  (:meth:`TcpTransport.linger`, up to ``linger_s``) until its clients have said goodbye
  (:meth:`TcpTransport.leave`), so it never cuts off clients still exchanging frames through it,
  or coming back for its last frames.
* **Mesh** (``"mesh"``, the default of :class:`TcpTransport` itself; for a LAN): every party
  listens on its own address (:meth:`TcpTransport.serve`). Frames from party A to party B travel
  on a connection that A dials to B's listener the first time A sends to B; B only reads from it
  and A only writes to it (after the handshake), so each ordered pair has its own stream and
  per-pair order is TCP's order.

Dialling is retried with exponential backoff (20 ms doubling to 1 s) until ``connect_timeout_s``
has passed, so parties may start in any order; then :class:`~fedproto.errors.PeerUnreachable`.
A mesh connection that breaks is dropped; the next ``send`` dials again (frames written into it
that the peer had not read are lost: the mesh does not resume).

Resumption (the star)
---------------------
A star link (a client and the hub) outlives its connections. Each side numbers the frames it
sends on the link from 0 and keeps each one (``_StarPeer.outbox``) until the other side
acknowledges it. Numbers are not written on the wire: TCP keeps order within a connection, and a
new connection starts at a number both sides agree on. Acknowledgements are cumulative ("I have
received your first n frames") and ride in 20-byte control frames of the routed-frame layout
(:mod:`fedproto.transports._framing`, "link control"): an ACK once :data:`ACK_EVERY_FRAMES`
frames or :data:`ACK_EVERY_BYTES` bytes have arrived unacknowledged, which bounds what a sender
keeps, and a BYE when a client leaves for good (:meth:`TcpTransport.leave`, called when its
``endpoints()`` block ends normally).

When a client's connection breaks (reset, closed, or dead in silence: the star's keep-alive,
below, notices that within a few ``keepalive_s``, and TCP keepalive within about 25 s), the
client re-dials with the same backoff until it has heard nothing from the hub for
``resume_timeout_s``, and the handshake carries the resumption: the client's hello (its
proof, with the shared secret) adds the link's id, 16 random bytes it drew when its endpoint was
made, and how many of the hub's frames it has received; the hub's acknowledgement becomes
``["ok", resumed, received]``, how many of the client's frames the hub has. Each side then drops
what the other has and writes the rest again, then goes on with new frames: no frame is lost or
delivered twice. The hub takes the client's name from its certificate, as always, and finds the
link by that name, so a connection can only resume its own party's link; when a client comes back
the hub closes its older connection (which it may not have seen die) and ignores anything still
arriving on it, so the count it states is final. The link id is the link's resume secret (only
the client's process and the hub know it: it travels inside TLS): a connection with another link
id for the same party, another holder of the party's kit or a new process of it, is refused
while the link lives, so a copy of a kit cannot evict the live party (a link that has ended, by a
goodbye or a broken rule, may be replaced). While a client is away its frames and the hub's
wait; the runtime's phase deadline still applies to the silence, so a client that does not come
back ends the run with the usual error naming it. A client gives up, with
:class:`~fedproto.errors.PeerUnreachable` naming the hub, once it has heard nothing from the hub
for ``resume_timeout_s`` (re-dialling meanwhile), at once when the hub's address refuses
connections (nothing listens there: the hub is gone), when the hub refuses the handshake, or
when the hub no longer knows the link (a new hub process).

Keep-alive: a star connection on which a side wrote nothing for ``keepalive_s`` gets an ACK
control frame repeating its count (it acknowledges nothing new, so it fits the resumption
protocol and the wire format as they are), and the hub answers each ACK of a client with one of
its own unless it writes a frame first. A client that hears nothing on its connection for
:data:`KEEPALIVE_MISSES` of its own intervals (the hub is stopped, say by SIGSTOP, which leaves
its connections open and silent, or the path died) closes it and re-dials; a hub that does not
answer the re-dial's handshake leaves the client to give up at ``resume_timeout_s`` after it
last heard from it. Without this a client waited out its own phase deadline, which the
protocols make twice the coordinator's (``DEADLINE_FACTOR``), so that the coordinator names a
silent client first.

Failure notices first: a frame that is an :class:`~fedproto.messages.AbortNotice`
(:func:`fedproto.codec.has_tag`, from its first bytes) is queued on a star link ahead of the
frames whose writing has not begun, so a notice relayed to a client is not stuck behind a long
queue of relayed frames.

Pending handshakes: a listener holds at most ``max_pending_handshakes`` connections whose
handshake has not finished (the oldest is closed to make room for a new one) and at most
``max_pending_per_host`` from one source host (beyond it a new one is closed at once); an accept
that runs out of descriptors (``EMFILE``) backs off with one rate-limited line, and refusal lines
are bounded in all (:mod:`fedproto.transports._admission`). A
client's ``send`` returns once its frame is written, or at once while the link is between two
connections (the frame waits for the next one).

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

Agreement
---------
An endpoint built with an ``agreement`` (:class:`fedproto.agreement.Agreement`: the protocol,
the options that must match across parties, the roster and the session; ``fedproto party``
always gives one) sends its record as the last field of its hello, and the listener compares it
with its own before it looks at the session or the roster (which the options often determine),
so a party started with other options is named with the first option that differs. Records
that differ are not a stranger to keep out but a configuration error, so both ends stop:

* with TLS the listener answers ``["differ", its record]`` instead of ``["ok", ...]``;
* with the shared secret the listener's challenge carries its record, both MACs cover both
  records' SHA-256 (as sent), and each side decides only once the other has proved it holds
  the secret (the dialer after the challenge, the listener after the proof), so a stranger
  cannot end the run by sending a hello with other options.

Each side then raises :class:`~fedproto.errors.AgreementMismatch` (one line: ``client-1 runs
with --seed 4, this party (server) with --seed 3; every party must run the same options``):
the dialer from the ``send`` or the ``serve`` that dialled (a star client: from every later
``send`` and ``receive``), the listener from every later ``receive`` and from ``send`` to that
peer; the endpoint stays open for the failure notices the runtime sends its other peers. The
handshake's bytes, the records included, are in :attr:`TcpTransport.handshake_bytes`, never in
the run's payload. An endpoint without a record sends none and agrees only with peers that send
none.

In both modes the sender of every received frame is the authenticated name of its connection,
never anything in the frame. Frames above ``max_frame_bytes`` are refused from the length prefix,
before their body is read; the stream cannot be resynchronised, so that connection is closed and
logged.

Bytes: ``framing_overhead_bytes == 4`` per frame (the length prefix, inside TLS). Bytes that are
not frames are counted per endpoint, as bytes this endpoint wrote, so summing over the parties
counts every byte once: :attr:`TcpTransport.handshake_bytes` (the whole TLS handshake and the
hello or acknowledgement as written to the socket, or the shared-secret handshake's messages
with their prefixes; every re-dial's too; a listener's handshakes with connections it refused
are in :attr:`TcpTransport.refused_bytes` instead, so that strangers cannot inflate the links'
cost), :attr:`TcpTransport.tls_overhead_bytes` (after the
handshake, socket bytes minus the plaintext prefixes and frames: TLS record headers, content
types and AEAD tags, 22 bytes per record of up to 16 KiB; 0 in shared-secret mode),
:attr:`TcpTransport.relay_overhead_bytes` (the star's relaying: the 8-byte route header of each
frame a client sends for another client, and the hub's whole second hop of it as written to the
socket, route header, prefix, frame and TLS records included) and
:attr:`TcpTransport.resumption_overhead_bytes` (the star's resumption: ACK, keep-alive and BYE control
frames, and frames written again after a re-dial, or the part of one written before its
connection broke, each with its TLS records). A relayed or re-sent frame's own bytes stay
counted once, by the runtime, on its logical link (sender to receiver), exactly as in a mesh or
in memory; what a run sends on the wire is the sum of its payload, framing, handshake, TLS,
relay and resumption bytes.
"""

from __future__ import annotations

import collections
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

from fedproto.agreement import Agreement, check as check_agreement
from fedproto.codec import DEFAULT_MAX_FRAME_BYTES, has_tag
from fedproto.errors import AgreementMismatch, DecodeError, PeerUnreachable, TransportBroken, TransportClosed, TransportError
from fedproto.roster import TlsFiles
from fedproto.messages import AbortNotice
from fedproto.transport import Network, Transport
from fedproto.transports import _admission
from fedproto.transports._framing import (
    ACK_INDEX,
    BYE_INDEX,
    CONTROL_BYTES,
    CONTROL_FRAME_BYTES,
    FRAMING_OVERHEAD_BYTES,
    MAX_ROUTED_STREAM_FRAME_BYTES,
    MAX_WIRE_FRAME_BYTES,
    ROUTE_HEADER_BYTES,
    FrameReader,
    FrameTooLarge,
    control_count,
    send_control,
    send_frame,
    send_routed_frame,
)

__all__ = [
    "ACK_EVERY_BYTES",
    "ACK_EVERY_FRAMES",
    "DEFAULT_KEEPALIVE_S",
    "DEFAULT_LINGER_S",
    "DEFAULT_RESUME_TIMEOUT_S",
    "KEEPALIVE_MISSES",
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
#: Version 2: the client's proof carries the link's resumption fields.
STAR_HANDSHAKE_VERSION = "fedproto-tcp-star/2"
#: Version string of the hello a star client sends inside TLS (version 2: with the link's
#: resumption fields).
STAR_TLS_HELLO_VERSION = "fedproto-tls-star/2"
#: How parties connect: ``"star"`` (only the hub, the roster's first party, listens; the others
#: dial out to it and it relays their frames to each other) or ``"mesh"`` (every party listens
#: and dials every peer it sends to).
TOPOLOGIES = ("star", "mesh")
#: Longest a star's hub keeps relaying after its own run, waiting for its clients to leave (s).
DEFAULT_LINGER_S = 60.0
#: Longest a star client keeps re-dialling the hub after its connection broke (s): the runtime's
#: default phase deadline, so a client is back before its peers give up on it.
DEFAULT_RESUME_TIMEOUT_S = 60.0
#: A star connection on which this side wrote nothing for this long gets a keep-alive (an ACK
#: control frame repeating the count), so a healthy idle peer is heard at least this often (s).
DEFAULT_KEEPALIVE_S = 5.0
#: A star client closes a connection on which it heard nothing from the hub for this many
#: keep-alive intervals (or ``resume_timeout_s``, if shorter), and re-dials.
KEEPALIVE_MISSES = 3
#: A star endpoint acknowledges the frames of a link once this many are unacknowledged ...
ACK_EVERY_FRAMES = 64
#: ... or once they hold this many bytes, so a sender keeps a bounded tail of its frames.
ACK_EVERY_BYTES = 1 << 20
#: Shortest accepted per-run secret (bytes).
MIN_SECRET_BYTES = 16

_NONCE_BYTES = 32
_MAC_BYTES = 32
_HANDSHAKE_MAX_FRAME_BYTES = 16 * 1024
_FIRST_RETRY_S = 0.02
_MAX_RETRY_S = 1.0
_LINK_ID_BYTES = 16
# TCP keepalive on star connections: a connection idle this long is probed, every interval, and
# declared dead after this many unanswered probes (about 25 s), so a link that died silently (a
# NAT that forgot it, a path that went down) is noticed and re-dialled.
_KEEPALIVE_IDLE_S = 10
_KEEPALIVE_INTERVAL_S = 5
_KEEPALIVE_PROBES = 3


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


class _HandshakeCut(_HandshakeFailed):
    """The listener closed the connection in the TLS handshake without an alert: not a refusal
    of our certificate (that comes with one) but a connection it had no room for (its cap on
    pending handshakes), or one the network cut. The dialer tries again."""


# What a failed dialer handshake raises (anything else propagates).
_DIAL_FAILURES = (_HandshakeFailed, trio.TooSlowError, trio.EndOfChannel, FrameTooLarge, TransportBroken)


@dataclasses.dataclass(eq=False)
class _Written:
    """Bytes one shared-secret handshake wrote so far (kept when the handshake fails midway)."""

    nbytes: int = 0


@dataclasses.dataclass(eq=False)
class _Link:
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
    """

    raw: trio.SocketStream
    channel: trio.abc.Stream
    wire: Any = None
    reader: FrameReader | None = None
    counted: int = 0
    resume_from: int = 0
    written_at: float = -math.inf
    silent_s: float | None = None


@dataclasses.dataclass(eq=False)
class _StarPeer:
    """A star link (a client and the hub) as one side sees it, across the connections that carry it.

    Frames are numbered on the link from 0, in the order this side queues them; the number is not
    written on the wire: TCP keeps order within a connection, and a resumption starts at a number
    both sides agree on. A frame stays in ``outbox`` until the peer acknowledges it
    (cumulatively: "I have received your first n frames"), by an ACK control frame, a BYE, or the
    count it states when the link resumes; frames the peer had not received are then written
    again on the new connection.

    A failure notice (:class:`~fedproto.messages.AbortNotice`) is queued *urgent*: ahead of every
    frame whose writing has not begun (behind earlier urgent ones), so it does not wait behind a
    long queue of relayed frames. Frames never written have no number the peer knows yet, so
    renumbering them is safe; frames written at least in part keep their numbers.

    Attributes:
        name: the party at the other end.
        link_id: the client's random identifier of the link (16 bytes), ``None`` at the hub until
            the client first dials in.
        outbox: ``(route index or None, frame)`` of this side's frames ``acked .. sent - 1``.
        sent: frames queued on the link so far (the next frame's number).
        acked: frames the peer has acknowledged (the first number in ``outbox``).
        written: the next frame to write on the current connection.
        started: frames whose writing began at least once (the most the peer can have received).
        high_written: frames written whole at least once (one below it written again is a re-send).
        received: frames received from the peer.
        ack_sent: the count this side last acknowledged.
        ack_owed_bytes: bytes of frames received since that acknowledgement.
        conn: the current connection, ``None`` between connections.
        generation: counts the connections the hub admitted for this link (a newer one wins).
        connected: a connection was made at least once.
        leaving: a client's graceful end: write what is queued, then a BYE.
        bye_written: the BYE is written.
        ended: why the link is over for good (``None`` while it may resume).
        urgent_end: the number after the last urgent frame queued.
        waiting: the numbers of frames whose ``send`` waits for them to be written (one-item
            lists, moved along when an urgent frame is queued ahead of them).
        heard_at: when this side last heard from the peer (a frame, a control frame, or a
            finished handshake; ``trio.current_time()``).
        echo_owed: at the hub, a client's ACK (its keep-alive, say) awaits an answer: the hub
            writes an ACK of its own unless it writes a frame first.
        changed: set and replaced whenever something above changes.
    """

    name: str
    link_id: bytes | None = None
    outbox: collections.deque[tuple[int | None, bytes]] = dataclasses.field(default_factory=collections.deque)
    sent: int = 0
    acked: int = 0
    written: int = 0
    started: int = 0
    high_written: int = 0
    received: int = 0
    ack_sent: int = 0
    ack_owed_bytes: int = 0
    conn: _Link | None = None
    generation: int = 0
    connected: bool = False
    leaving: bool = False
    bye_written: bool = False
    ended: str | None = None
    urgent_end: int = 0
    waiting: list[list[int]] = dataclasses.field(default_factory=list)
    heard_at: float = -math.inf
    echo_owed: bool = False
    changed: trio.Event = dataclasses.field(default_factory=trio.Event)

    def poke(self) -> None:
        """Wake every task waiting on this link."""
        self.changed.set()
        self.changed = trio.Event()

    def queue(self, index: int | None, frame: bytes, *, urgent: bool = False) -> int:
        """Queue one frame (route index or ``None``); returns its number.

        An ``urgent`` frame goes ahead of the frames not yet begun, behind earlier urgent ones.
        """
        number = self.sent
        if urgent:
            number = max(self.started, self.urgent_end)
            self.urgent_end = number + 1
            for box in self.waiting:
                if box[0] >= number:
                    box[0] += 1
        self.outbox.insert(number - self.acked, (index, frame))
        self.sent += 1
        self.poke()
        return number

    def take_ack(self, count: int) -> bool:
        """The peer has received this side's first ``count`` frames; False if it cannot have."""
        if not self.acked <= count <= self.started:
            return count <= self.acked  # an old acknowledgement (a stale connection's) is harmless
        for _ in range(count - self.acked):
            self.outbox.popleft()
        self.acked = count
        self.written = max(self.written, count)
        self.poke()
        return True

    def frame(self, number: int) -> tuple[int | None, bytes]:
        """The queued frame with this number (``acked <= number < sent``)."""
        return self.outbox[number - self.acked]

    def ack_due(self) -> bool:
        owed = self.received - self.ack_sent
        return owed >= ACK_EVERY_FRAMES or (owed > 0 and self.ack_owed_bytes >= ACK_EVERY_BYTES)


def _tls_module() -> Any:
    """:mod:`fedproto.transports._tls`, imported when TLS is first used (``ssl`` and X.509)."""
    from fedproto.transports import _tls

    return _tls


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack_list(data: bytes, length: int | tuple[int, ...], what: str) -> list[Any]:
    lengths = (length,) if isinstance(length, int) else length
    try:
        obj = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise _HandshakeFailed(f"malformed {what} ({type(exc).__name__})") from exc
    if not isinstance(obj, list) or len(obj) not in lengths:
        raise _HandshakeFailed(f"malformed {what} (expected an array of {' or '.join(map(str, lengths))})")
    return obj


def _resume_fields(link_id: Any, received: Any, who: str) -> tuple[bytes, int]:
    """A star client's resumption fields, checked: its link's id and the frames it received."""
    link_id = _expect_bytes(link_id, _LINK_ID_BYTES, f"link id from {who}")
    if isinstance(received, bool) or not isinstance(received, int) or not 0 <= received < 2**64:
        raise _HandshakeFailed(f"malformed resumption count from {who}")
    return link_id, received


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and the members of exception groups among them."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        todo.extend(getattr(current, "exceptions", ()))


def _refused(exc: BaseException) -> bool:
    """Whether a failed connect was refused (nobody listens there any more)."""
    return any(isinstance(e, ConnectionRefusedError) for e in _causes(exc))


def _network_failure(exc: BaseException) -> bool:
    """Whether a failed handshake broke on the network (reset, timeout) rather than being refused."""
    return any(isinstance(e, (trio.TooSlowError, ConnectionError, TimeoutError)) for e in _causes(exc))


def _keep_alive(stream: trio.SocketStream) -> None:
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


def _expect_bytes(value: Any, n: int, what: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != n:
        raise _HandshakeFailed(f"malformed {what} (expected {n} bytes)")
    return value


def _record_digest(record: bytes | None) -> bytes:
    """SHA-256 of an encoded agreement record as sent, ``b""`` for none (bound into the MACs)."""
    return b"" if record is None else hashlib.sha256(record).digest()


def _peer_record(value: Any, who: str) -> Agreement | None:
    """A peer's agreement record from its hello (``None`` when it sent none)."""
    if value is None:
        return None
    if not isinstance(value, bytes):
        raise _HandshakeFailed(f"malformed agreement record from {who}")
    try:
        return Agreement.from_bytes(value)
    except ValueError as exc:
        raise _HandshakeFailed(f"malformed agreement record from {who}: {exc}") from None


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
    dialer_agreement: bytes = b"",
    listener_agreement: bytes = b"",
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
        dialer_agreement: SHA-256 of the dialer's agreement record
            (:meth:`fedproto.agreement.Agreement.digest`), ``b""`` when it states none.
        listener_agreement: the same for the listener.
    """
    fields = [version, role, session, roster_hash, dialer, listener, dialer_nonce, listener_nonce]
    if dialer_agreement or listener_agreement:  # parties without records keep the older context
        fields += [dialer_agreement, listener_agreement]
    context = _pack(fields)
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
    the frames relayed for every other party, share, re-dialling and resuming it if it breaks; a
    star client ends gracefully with :meth:`leave` (its goodbye to the hub), then :meth:`aclose`
    (:func:`open_tcp_network` and :meth:`TcpNetwork.endpoints` do both). Frames received but
    not yet returned by ``receive`` are buffered without bound (so two parties that both send
    before they receive cannot deadlock); ``max_frame_bytes`` bounds each frame.

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
        resume_timeout_s: how long a star client goes on without hearing from the hub (no frame,
            no keep-alive, no handshake), re-dialling it, before it gives up (seconds). A client
            that hears nothing gives up within this bound, so a stopped hub is named within one
            phase deadline when it is at most the deadline (``fedproto party`` sets it to the
            deadline).
        agreement: what this party runs (:class:`fedproto.agreement.Agreement`: protocol,
            options that must match, roster, session), sent in every hello and compared with the
            peer's (see "Agreement" in the module docstring); ``None`` states none and agrees
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
        self.resume_timeout_s = float(resume_timeout_s)
        self.keepalive_s = float(keepalive_s)
        self.session = session
        self.agreement = agreement
        self._agreement_record = agreement.to_bytes() if agreement is not None else None
        self._agreement_hash = _record_digest(self._agreement_record)
        self._disagreement: AgreementMismatch | None = None
        self.max_frame_bytes = max_frame_bytes
        self.connect_timeout_s = float(connect_timeout_s)
        self.handshake_timeout_s = float(handshake_timeout_s)
        self.uses_tls = self._tls is not None
        self.handshake_bytes = 0
        self.refused_bytes = 0
        self.tls_overhead_bytes = 0
        self.relay_overhead_bytes = 0
        self.relayed_frames = 0
        self.resumption_overhead_bytes = 0
        self.resumptions = 0
        self.resent_frames = 0
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
        # The star: each link's state (at the hub one per client, at a client the one to the hub),
        # the hub's current connection to each client, and why a client lost the hub for good.
        self._index = {p: i for i, p in enumerate(roster)}
        self._peers: dict[str, _StarPeer] = {}
        if hub is not None and party != hub:
            self._peers[hub] = _StarPeer(hub, link_id=secrets.token_bytes(_LINK_ID_BYTES))
        self._clients: dict[str, _Link] = {}
        self._hub_failure: PeerUnreachable | None = None
        self._links_changed = trio.Event()  # set and replaced whenever a star link comes or goes
        # Refused connections are logged once per peer host, then as counts, and at most
        # DEFAULT_MAX_REFUSAL_LINES lines per 10 s in all (no log flood from many addresses).
        self._refusals = _admission.BoundedRefusalLog(log, party, clock=trio.current_time)
        # Connections whose handshake has not finished, capped (a flood of silent ones). By
        # default the caps are never below the roster's size, so every party of a run may dial
        # at once from one host (a local launch, or clients behind one NAT).
        if max_pending_handshakes is None:
            max_pending_handshakes = max(_admission.DEFAULT_MAX_PENDING_HANDSHAKES, len(roster))
        if max_pending_per_host is None:
            max_pending_per_host = max(_admission.DEFAULT_MAX_PENDING_PER_HOST, len(roster))
        self._pending = _admission.PendingHandshakes(max_pending_handshakes, max_pending_per_host)

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

    def _records(self) -> list[bytes]:
        """This party's agreement record as the last field of its hello (none without a record)."""
        return [] if self._agreement_record is None else [self._agreement_record]

    def _compare(self, theirs: Agreement | None, other: str) -> None:
        """Raise :class:`~fedproto.errors.AgreementMismatch` unless ``other`` runs what we run."""
        check_agreement(self.agreement, theirs, this_party=self.party, other=other)

    def _disagree(self, exc: AgreementMismatch) -> None:
        """An authenticated peer runs something else: this endpoint's run is over.

        ``receive`` raises the mismatch from now on, and so does ``send`` to that peer (at a star
        client: to anyone, since everything goes through the hub); the endpoint stays open for
        the failure notices the runtime sends its other peers.
        """
        if self._closed or self._disagreement is not None:
            return
        log.debug("%s: %s", self.party, exc.detail)
        self._disagreement = exc
        if self._is_hub and exc.party is not None:
            peer = self._peers.get(exc.party)
            if peer is None:
                peer = self._peers[exc.party] = _StarPeer(exc.party)
            self._end_link(peer, exc.detail)
        elif self._is_star_client:
            peer = self._peers[self.hub]  # type: ignore[index]
            if peer.ended is None:
                peer.ended = exc.detail
            peer.poke()
        self._inbox_send.close()
        self._notify_links()

    def _disagreement_error(self) -> AgreementMismatch:
        exc = self._disagreement
        assert exc is not None
        return AgreementMismatch(exc.detail, party=exc.party)

    def _check_agreed(self, dest: str | None = None) -> None:
        """Raise the mismatch that ended this endpoint's run, if it concerns ``dest`` (``None``: any)."""
        exc = self._disagreement
        if exc is not None and (dest is None or self._is_star_client or exc.party == dest):
            raise self._disagreement_error()

    # ----------------------------------------------------------------------------------- serve

    async def serve(self, *, task_status: trio.TaskStatus[int | None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on this party's address and accept peers until :meth:`aclose`; a star client
        instead dials the hub and carries that connection.

        Use ``port = await nursery.start(endpoint.serve)``: ``task_status.started`` reports the
        bound port (also stored in ``self.addresses[self.party]``) once the listener accepts. A
        star client reports ``None`` at once and dials the hub (retrying with backoff until
        ``connect_timeout_s``), then carries the link: reads and writes its connection, and
        re-dials and resumes it when it breaks (see "Resumption" in the module docstring); if it
        cannot reach the hub at first, or cannot resume the link, ``send`` and ``receive`` raise
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
                async with trio.open_nursery() as nursery:
                    for listener in listeners:
                        nursery.start_soon(
                            _admission.accept_forever, listener, lambda s: self._accepted(s, nursery), self._exhausted
                        )
        finally:
            for listener in listeners:
                listener.socket.close()

    @staticmethod
    def _listener_from_socket(sock: socket.socket) -> trio.SocketListener:
        """A trio listener on an already bound stdlib socket (listening on it if needed)."""
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            sock.listen()
        return trio.SocketListener(trio.socket.from_stdlib_socket(sock))

    def _accepted(self, stream: trio.SocketStream, nursery: trio.Nursery) -> None:
        """A new connection: admit it to its handshake within the caps, or close it at once."""
        peer_address = _peername(stream)
        host = peer_address.rpartition(":")[0] or peer_address
        ticket, evicted = self._pending.admit(host, stream)
        if evicted is not None:
            evicted.stream.socket.close()  # its handshake ends; counted as refused there
        if ticket is None:
            stream.socket.close()
            self._refuse(
                peer_address, f"{self._pending.max_per_host} handshakes from {host} are already pending", 0
            )
            return
        nursery.start_soon(self._handle_connection, stream, ticket)

    def _exhausted(self, exc: OSError) -> None:
        """Accepting failed for lack of descriptors or buffers: one rate-limited line, no traceback."""
        if not self._closed:
            self._refusals.log(
                "this listener", "out of resources", "%s: cannot accept connections (%s, %d handshakes pending); backing off",
                self.party, exc.strerror or exc, len(self._pending),
            )

    async def _handle_connection(self, stream: trio.SocketStream, ticket: _admission.Ticket | None = None) -> None:
        peer_address = _peername(stream)
        self._incoming.add(stream)
        wire = None
        try:
            if self._closed:
                return
            if self._is_hub:
                _keep_alive(stream)
            channel: trio.abc.Stream = stream
            if self._tls is not None:
                wire = _tls_module().MeteredStream(stream)
                channel = trio.SSLStream(wire, self._tls.listener, server_side=True, https_compatible=True)
            reader = FrameReader(channel)
            written = _Written()  # the shared-secret handshake's bytes (TLS ones are the wire's)

            def handshake_written() -> int:
                return wire.sent_bytes if wire is not None else written.nbytes

            try:
                with trio.fail_after(self.handshake_timeout_s):
                    if wire is None:
                        peer, admitted = await self._listener_handshake(stream, reader, written)
                    else:
                        peer, admitted = await self._listener_tls_handshake(channel, reader)
            except trio.TooSlowError:
                self._refuse(peer_address, f"no handshake within {self.handshake_timeout_s} s", handshake_written())
                return
            except _HandshakeFailed as exc:
                self._refuse(peer_address, str(exc), handshake_written())
                return
            except trio.EndOfChannel:
                self._refuse(peer_address, "connection closed during the handshake", handshake_written())
                return
            except FrameTooLarge as exc:
                self._refuse(peer_address, f"oversized handshake message ({exc})", handshake_written())
                return
            except TransportBroken as exc:
                reason = _tls_module().failure_reason(exc) if wire is not None else exc
                self._refuse(peer_address, f"connection broke during the handshake ({reason})", handshake_written())
                return
            except TransportClosed:
                if ticket is not None and ticket.evicted:  # closed to make room under the cap
                    reason = f"{self._pending.max_total} handshakes pending, the most allowed: the oldest is closed"
                    self._refuse(peer_address, reason, handshake_written())
                else:
                    self.handshake_bytes += handshake_written()  # we closed it: not the peer's doing
                return
            except AgreementMismatch as exc:  # an authenticated party of the run: not a stranger
                self.handshake_bytes += handshake_written()
                self._disagree(exc)
                return
            finally:
                if ticket is not None:
                    ticket.release()
            self.handshake_bytes += handshake_written()
            log.debug("%s: accepted %s from %s", self.party, peer, peer_address)
            if admitted is not None:
                link = _Link(stream, channel, wire, reader, counted=wire.sent_bytes if wire is not None else 0)
                await self._serve_star_client(*admitted, link, peer_address)
                return
            ready_bytes = wire.sent_bytes if wire is not None else 0
            try:
                await self._read_frames(channel, reader, peer, peer_address)
            finally:
                if wire is not None:  # a listener writes nothing after the handshake, unless TLS must
                    self.tls_overhead_bytes += wire.sent_bytes - ready_bytes
        finally:
            if ticket is not None:
                ticket.release()
            self._incoming.discard(stream)
            stream.socket.close()

    def _refuse(self, peer_address: str, reason: str, nbytes: int) -> None:
        # What we wrote to a connection we refused is counted apart from the handshakes of the
        # run's own links, so that strangers cannot inflate what those cost.
        self.refused_bytes += nbytes
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

    async def _send_handshake(self, stream: trio.SocketStream, message: list[Any], written: _Written) -> None:
        data = _pack(message)
        await send_frame(stream, data)
        written.nbytes += FRAMING_OVERHEAD_BYTES + len(data)

    async def _listener_handshake(
        self, stream: trio.SocketStream, reader: FrameReader, written: _Written
    ) -> tuple[str, tuple[_StarPeer, int] | None]:
        hello = _unpack_list(await reader.receive_frame(_HANDSHAKE_MAX_FRAME_BYTES), (6, 7), "hello")
        version, session, roster_hash, dialer, listener, dialer_nonce = hello[:6]
        self._check_hello_version(version, f"claimed party {dialer!r}", tls=False)
        if not isinstance(dialer, str):
            raise _HandshakeFailed("malformed hello (party name is not a string)")
        if dialer not in self._roster_set:
            raise _HandshakeFailed(f"claimed party {dialer!r} is not in the roster")
        record = hello[6] if len(hello) == 7 else None
        theirs = _peer_record(record, repr(dialer))
        # Records that differ are a configuration error to report, once the dialer has proved it
        # holds the secret (a stranger must not end the run): the session and roster, which the
        # options often determine, are then not refused here, and the MACs cover the hello as sent.
        agreed = theirs == self.agreement
        if agreed and session != self.session:
            raise _HandshakeFailed(f"{dialer!r} is in session {session!r}, this run is {self.session}")
        if agreed and roster_hash != self._roster_hash:
            raise _HandshakeFailed(f"{dialer!r} has a different roster")
        if not isinstance(session, int) or not isinstance(roster_hash, bytes):
            raise _HandshakeFailed(f"malformed hello from claimed party {dialer!r}")
        if listener != self.party:
            raise _HandshakeFailed(f"{dialer!r} wanted party {listener!r}, this is {self.party!r}")
        dialer_nonce = _expect_bytes(dialer_nonce, _NONCE_BYTES, "hello nonce")
        listener_nonce = secrets.token_bytes(_NONCE_BYTES)
        context = dict(
            session=session,
            roster_hash=roster_hash,
            dialer=dialer,
            listener=self.party,
            dialer_nonce=dialer_nonce,
            listener_nonce=listener_nonce,
            version=version,
            dialer_agreement=_record_digest(record),
            listener_agreement=self._agreement_hash,
        )
        await self._send_handshake(
            stream, [listener_nonce, handshake_mac(self._secret, "listener", **context), *self._records()], written
        )
        # A star client's proof carries its link's resumption fields (see _admit_client).
        proof, *resume = _unpack_list(
            await reader.receive_frame(_HANDSHAKE_MAX_FRAME_BYTES), 3 if self._is_hub else 1, "proof"
        )
        proof = _expect_bytes(proof, _MAC_BYTES, "proof")
        if not hmac.compare_digest(proof, handshake_mac(self._secret, "dialer", **context)):
            raise _HandshakeFailed(f"bad MAC from claimed party {dialer!r} (wrong secret?)")
        self._compare(theirs, dialer)  # the dialer, which saw our record, ends too
        ack, admitted = ["ok"], None
        if self._is_hub:
            ack, admitted = self._admit_client(dialer, *_resume_fields(*resume, repr(dialer)))
        await self._send_handshake(stream, ack, written)
        return dialer, admitted

    async def _listener_tls_handshake(
        self, channel: trio.SSLStream[Any], reader: FrameReader
    ) -> tuple[str, tuple[_StarPeer, int] | None]:
        """TLS 1.3 with the dialer's certificate required, then the hello.

        Returns the dialer's name and, at a star's hub, the link it was admitted to (see
        :meth:`_admit_client`) with the admission's generation.
        """
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
        # A star client's hello has two more fields, its link's resumption fields (_admit_client);
        # then comes the dialer's agreement record, if it states one.
        hello = _unpack_list(await reader.receive_frame(_HANDSHAKE_MAX_FRAME_BYTES), (5, 6, 7, 8), "hello")
        version, session, roster_hash, dialer, listener = hello[:5]
        self._check_hello_version(version, repr(named), tls=True)
        if dialer != named:
            raise _HandshakeFailed(f"the certificate names {named!r} but the hello claims {dialer!r}")
        fields = 7 if self._is_hub else 5
        if self._is_hub and len(hello) < fields:
            raise _HandshakeFailed(f"malformed hello from {named!r} (no resumption fields)")
        if len(hello) > fields + 1:
            raise _HandshakeFailed(f"malformed hello from {named!r} (expected an array of {fields} or {fields + 1})")
        hello, record = hello[:fields], (hello[fields] if len(hello) > fields else None)
        try:
            self._compare(_peer_record(record, repr(named)), named)
        except AgreementMismatch:
            try:  # the dialer learns why, and ends too
                await send_frame(channel, _pack(["differ", *self._records()]))
            except TransportError:
                pass
            raise
        if session != self.session:
            raise _HandshakeFailed(f"{named!r} is in session {session!r}, this run is {self.session}")
        if roster_hash != self._roster_hash:
            raise _HandshakeFailed(f"{named!r} has a different roster")
        if listener != self.party:
            raise _HandshakeFailed(f"{named!r} wanted party {listener!r}, this is {self.party!r}")
        ack, admitted = ["ok"], None
        if self._is_hub:
            ack, admitted = self._admit_client(named, *_resume_fields(*hello[5:], repr(named)))
        await send_frame(channel, _pack(ack))
        return named, admitted

    # ------------------------------------------------------------------------------------ send

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
                options or another roster (see "Agreement" in the module docstring).
            PeerUnreachable: ``dest`` is not in the roster, cannot be dialled within
                ``connect_timeout_s``, failed the handshake, or the connection broke
                (``__cause__`` is the underlying error); in a star, the hub cannot be reached
                or the link could not be resumed (at a client), ``dest`` did not dial in, or
                its link has ended (at the hub).
            TransportClosed: this endpoint was closed.
            ValueError: the frame exceeds ``max_frame_bytes``.
        """
        self._check_open()
        self._check_agreed(dest)
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
        # An uncontended lock is taken without a schedule point (send_frame has its own): a
        # cancelled send still ends here, before the lock, with nothing written.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
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
        finally:
            lock.release()

    def _drop_outgoing(self, dest: str, link: _Link) -> None:
        if self._outgoing.get(dest) is link:
            del self._outgoing[dest]
        link.raw.socket.close()

    async def _connect(self, dest: str) -> _Link:
        link = await self._dial(dest)
        self._outgoing[dest] = link
        return link

    async def _dial(self, dest: str, *, redial: bool = False) -> _Link:
        """Dial ``dest`` and run the dialer's handshake, retrying with backoff.

        A first dial retries a failed connect until ``connect_timeout_s`` (the peer may not be up
        yet) and gives up when the handshake fails. A star client's re-dial after a break
        (``redial``) retries failures of the network, in connecting or in the handshake (reset,
        unreachable, timed out), until ``resume_timeout_s`` after it last heard from the hub
        (handshakes included), and gives up at once when the hub's address refuses the
        connection (nothing listens there: the hub is gone) or the hub refuses the handshake.

        Raises:
            PeerUnreachable: it gave up (``__cause__`` is the last failure).
            TransportClosed: this endpoint was closed.
        """
        address = self.addresses[dest]
        if address.port == 0:
            raise PeerUnreachable(f"the address of {dest} is unknown (port 0)", party=dest)
        if redial:
            timeout = self.resume_timeout_s
            deadline = self._peers[dest].heard_at + timeout
            gave_up = f"heard nothing from {dest} at {address} for {timeout:g} s"
        else:
            timeout = self.connect_timeout_s
            deadline = trio.current_time() + timeout
            gave_up = f"cannot connect to {dest} at {address} within {timeout} s"
        retry_s = _FIRST_RETRY_S
        last_error: BaseException | None = None
        while True:
            self._check_open()
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                if isinstance(last_error, _HandshakeCut):
                    gave_up += f"; it kept closing our connections in the handshake ({last_error})"
                raise PeerUnreachable(gave_up, party=dest) from last_error
            stream: trio.SocketStream | None = None
            with trio.move_on_after(remaining):
                try:
                    stream = await trio.open_tcp_stream(address.host, address.port)
                except OSError as exc:
                    if redial and _refused(exc):
                        raise PeerUnreachable(
                            f"{dest} at {address} refused the connection (nothing listens there any more)", party=dest
                        ) from exc
                    last_error = exc
            if stream is not None:
                try:
                    return await self._handshake_dialled(stream, dest, deadline if redial else math.inf)
                except _DIAL_FAILURES as exc:
                    self._check_open()
                    if not ((redial and _network_failure(exc)) or isinstance(exc, _HandshakeCut)):
                        credentials = "secret" if self._tls is None else "certificates"
                        refused = f"refused by the peer (check {credentials}, session, roster and topology)"
                        reason = {
                            trio.TooSlowError: f"no answer within {self.handshake_timeout_s} s",
                            trio.EndOfChannel: refused,
                        }.get(type(exc), str(exc))
                        raise PeerUnreachable(
                            f"handshake with {dest} at {address} failed: {reason}", party=dest
                        ) from exc
                    log.debug("%s: handshake with %s broke (%s); trying again", self.party, dest, exc)
                    last_error = exc
            await trio.sleep(max(0.0, min(retry_s, deadline - trio.current_time())))
            retry_s = min(2 * retry_s, _MAX_RETRY_S)

    async def _handshake_dialled(self, stream: trio.SocketStream, dest: str, deadline: float = math.inf) -> _Link:
        """The dialer's handshake on a fresh connection to ``dest``; closes it if that fails.

        It takes at most ``handshake_timeout_s``, and ends by ``deadline`` (``trio.current_time()``).

        Raises:
            One of ``_DIAL_FAILURES``: the handshake failed.
            TransportClosed: this endpoint was closed.
        """
        self._dialling.add(stream)
        link = _Link(stream, stream)
        try:
            try:
                with trio.fail_at(min(deadline, trio.current_time() + self.handshake_timeout_s)):
                    if self._tls is None:
                        link.reader = FrameReader(stream)
                        written = _Written()
                        try:
                            resume_from = await self._dialer_handshake(stream, dest, link.reader, written)
                        finally:
                            self.handshake_bytes += written.nbytes
                    else:
                        link.wire = _tls_module().MeteredStream(stream)
                        link.channel = trio.SSLStream(
                            link.wire, self._tls.dialer, server_hostname=dest, https_compatible=True
                        )
                        link.reader = FrameReader(link.channel)
                        try:
                            resume_from = await self._dialer_tls_handshake(link.channel, dest, link.reader)
                        finally:
                            self.handshake_bytes += link.wire.sent_bytes
                            link.counted = link.wire.sent_bytes
            except TransportClosed:
                self._check_open()
                raise
            except AgreementMismatch as exc:
                self._disagree(exc)
                raise
            self._check_open()
        except BaseException:
            stream.socket.close()
            raise
        finally:
            self._dialling.discard(stream)
        link.resume_from = resume_from or 0
        log.debug("%s: connected to %s at %s", self.party, dest, self.addresses[dest])
        return link

    def _resume_request(self) -> list[Any]:
        """What a star client tells the hub when it dials: its link's id and the frames it received."""
        if not self._is_star_client:
            return []
        peer = self._peers[self.hub]  # type: ignore[index]
        return [peer.link_id, peer.received]

    def _check_acknowledgement(self, frame: bytes, dest: str) -> int | None:
        """The listener's acknowledgement; at a star client, how many of its frames the hub has.

        The hub answers ``["ok", resumed, received]``: whether it knew the client's link, and how
        many of the client's frames it has received (the client writes again those after them).
        A listener whose agreement record differs answers ``["differ", its record]`` instead.

        Raises:
            AgreementMismatch: ``dest`` runs something else.
            _HandshakeFailed: a malformed acknowledgement.
        """
        reply = _unpack_list(frame, (1, 2, 3), "acknowledgement")
        if reply[0] == "differ" and len(reply) <= 2:
            self._compare(_peer_record(reply[1] if len(reply) == 2 else None, repr(dest)), dest)
            raise _HandshakeFailed(f"{dest} said our agreement records differ, but they agree")
        if not self._is_star_client:
            if reply != ["ok"]:
                raise _HandshakeFailed("malformed acknowledgement")
            return None
        if len(reply) != 3:
            raise _HandshakeFailed("malformed acknowledgement (expected an array of 3)")
        ok, resumed, received = reply
        if ok != "ok" or not isinstance(resumed, bool) or isinstance(received, bool) or not isinstance(received, int):
            raise _HandshakeFailed("malformed acknowledgement")
        peer = self._peers[self.hub]  # type: ignore[index]
        if peer.connected and not resumed:
            raise _HandshakeFailed(
                f"the hub no longer knows the link of {self.party} (was it restarted?): "
                f"the frames exchanged so far cannot be resumed"
            )
        if not peer.acked <= received <= peer.started:
            raise _HandshakeFailed(
                f"the hub says it received {received} frames of {self.party}, "
                f"who wrote {peer.started} and had {peer.acked} acknowledged"
            )
        return received

    async def _dialer_handshake(
        self, stream: trio.SocketStream, dest: str, reader: FrameReader, written: _Written
    ) -> int | None:
        version = self._hello_version(tls=False)
        dialer_nonce = secrets.token_bytes(_NONCE_BYTES)
        await self._send_handshake(
            stream,
            [version, self.session, self._roster_hash, self.party, dest, dialer_nonce, *self._records()],
            written,
        )
        challenge = _unpack_list(await reader.receive_frame(_HANDSHAKE_MAX_FRAME_BYTES), (2, 3), "challenge")
        listener_nonce, proof = challenge[:2]
        record = challenge[2] if len(challenge) == 3 else None
        theirs = _peer_record(record, repr(dest))
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
            dialer_agreement=self._agreement_hash,
            listener_agreement=_record_digest(record),
        )
        if not hmac.compare_digest(proof, handshake_mac(self._secret, "listener", **context)):
            raise _HandshakeFailed(f"the listener failed to prove it is {dest!r} (wrong secret?)")
        await self._send_handshake(
            stream, [handshake_mac(self._secret, "dialer", **context), *self._resume_request()], written
        )
        # Our proof lets the listener, too, trust our record and end; then we end.
        self._compare(theirs, dest)
        return self._check_acknowledgement(await reader.receive_frame(_HANDSHAKE_MAX_FRAME_BYTES), dest)

    async def _dialer_tls_handshake(
        self, channel: trio.SSLStream[Any], dest: str, reader: FrameReader
    ) -> int | None:
        """TLS 1.3 checking ``dest``'s certificate and name, then the hello and its acknowledgement.

        Returns what :meth:`_check_acknowledgement` returns.
        """
        tls = _tls_module()
        try:
            await channel.do_handshake()
        except trio.BrokenResourceError as exc:
            failure = _HandshakeCut if tls.cut_without_alert(exc) else _HandshakeFailed
            raise failure(f"TLS handshake failed ({tls.failure_reason(exc)})") from exc
        except trio.ClosedResourceError as exc:  # we closed the socket (aclose) mid-handshake
            raise TransportClosed("the connection was closed during the TLS handshake") from exc
        # Only now, with the listener's certificate checked against dest's name, may we speak.
        hello = [self._hello_version(tls=True), self.session, self._roster_hash, self.party, dest]
        await send_frame(channel, _pack([*hello, *self._resume_request(), *self._records()]))
        try:
            frame = await reader.receive_frame(_HANDSHAKE_MAX_FRAME_BYTES)
        except TransportBroken as exc:  # a TLS alert: the listener refused our certificate
            if _network_failure(exc):
                raise
            raise _HandshakeFailed(f"refused by the peer ({tls.failure_reason(exc)})") from exc
        return self._check_acknowledgement(frame, dest)

    # ------------------------------------------------------------------------------------ star

    async def _send_star(self, dest: str, frame: bytes) -> None:
        """``send`` in a star: queue the frame on its link, then wait until it is written.

        From the moment it is queued the frame belongs to the link: it is written on the link's
        connection, and written again on the next one if the peer had not received it when the
        connection broke, until the peer acknowledges it or the link ends for good. So ``send``
        returns once the frame is written, or at once while the link is between two connections.
        The hub waits up to ``connect_timeout_s`` for a client that has never dialled in, and a
        client as long for its first connection to the hub.
        """
        if dest == self.party:
            self._deliver(self.party, frame)
            return
        if self._is_hub:
            peer, index = await self._client_peer(dest), None
        else:
            peer = await self._hub_peer_ready()
            index = None if dest == self.hub else self._index[dest]
        box = [peer.queue(index, frame, urgent=has_tag(frame, AbortNotice.TAG))]
        peer.waiting.append(box)  # its number moves if an urgent frame is queued ahead of it
        try:
            while True:
                self._check_open()
                if peer.high_written > box[0]:
                    return
                if peer.ended is not None:
                    raise self._link_ended(peer)
                if peer.conn is None:
                    return  # kept for the resumption
                await peer.changed.wait()
        finally:
            peer.waiting.remove(box)

    def _link_ended(self, peer: _StarPeer) -> PeerUnreachable | AgreementMismatch:
        """The error of a send on a star link that has ended for good."""
        exc = self._disagreement
        if exc is not None and (not self._is_hub or exc.party == peer.name):
            return self._disagreement_error()
        if self._is_hub:
            return PeerUnreachable(
                f"the link of {peer.name} to the hub {self.party} has ended: {peer.ended}", party=peer.name
            )
        failure = self._hub_failure
        detail = failure.detail if failure is not None else f"the link to the hub {self.hub} has ended: {peer.ended}"
        return PeerUnreachable(detail, party=self.hub)

    async def _client_peer(self, dest: str) -> _StarPeer:
        """At the hub: ``dest``'s link, waiting up to ``connect_timeout_s`` for it to first dial in."""
        deadline = trio.current_time() + self.connect_timeout_s
        while True:
            self._check_open()
            peer = self._peers.get(dest)
            if peer is not None and peer.ended is not None:
                raise self._link_ended(peer)
            if peer is not None and peer.connected:
                return peer
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

    async def _hub_peer_ready(self) -> _StarPeer:
        """At a star client: the link to the hub, once :meth:`serve` has first connected it."""
        peer = self._peers[self.hub]  # type: ignore[index]
        deadline = trio.current_time() + self.connect_timeout_s + self.handshake_timeout_s
        while True:
            self._check_open()
            self._check_agreed()
            if self._hub_failure is not None:
                raise PeerUnreachable(self._hub_failure.detail, party=self.hub) from self._hub_failure
            if peer.connected:
                return peer
            changed = self._links_changed
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                hint = "" if self._serving else " (in a star, serve() dials the hub: it is not running)"
                raise PeerUnreachable(f"{self.party} has no connection to the hub {self.hub}{hint}", party=self.hub)
            with trio.move_on_after(remaining):
                await changed.wait()

    def _relay(self, origin: str, dest: str, frame: bytes) -> None:
        """At the hub: queue a frame from client ``origin`` on the link of client ``dest``."""
        peer = self._peers.get(dest)
        if peer is None:  # it has not dialled in yet: the frame waits for it on its link
            peer = self._peers[dest] = _StarPeer(dest)
        if peer.ended is not None:
            log.debug(
                "%s: dropped a frame from %s for %s, whose link has ended (%s)", self.party, origin, dest, peer.ended
            )
            return
        # A failure notice goes ahead of the relayed frames queued for dest, so that it is not
        # stuck behind them (its receiver would end at its deadline, naming nobody).
        peer.queue(self._index[origin], frame, urgent=has_tag(frame, AbortNotice.TAG))

    def _admit_client(
        self, name: str, link_id: bytes, received: int
    ) -> tuple[list[Any], tuple[_StarPeer, int, int]]:
        """At the hub, in the handshake: admit a client's connection to its link (new or resumed).

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
            _HandshakeFailed: the link has ended, the count does not fit it, or the connection
                brings another link id while the party's link lives.
        """
        peer = self._peers.get(name)
        if peer is not None and peer.link_id is not None and not hmac.compare_digest(peer.link_id, link_id):
            if peer.ended is None:
                raise _HandshakeFailed(
                    f"{name!r} dialled in with another link while its link lives "
                    f"(a second holder of its kit?): only the link's own process may resume it"
                )
            log.info("%s: %s dialled in with a new link; its previous one had ended (%s)", self.party, name, peer.ended)
            del self._peers[name]
            peer = None
        if peer is None:
            peer = self._peers[name] = _StarPeer(name)
        resumed = peer.link_id is not None
        if resumed:
            if peer.ended is not None:
                raise _HandshakeFailed(f"{name!r} tried to resume its link, which has ended: {peer.ended}")
            if not peer.acked <= received <= peer.started:
                raise _HandshakeFailed(
                    f"{name!r} resumes having received {received} frames, but the hub wrote {peer.started} "
                    f"and {peer.acked} were acknowledged"
                )
            old = peer.conn
            if old is not None:
                old.raw.socket.close()  # its reader and writer end; what it still brings is ignored
                self._uninstall(peer, old)
            self.resumptions += 1
            log.info(
                "%s: %s resumes its link: it has %d of the hub's %d frames, the hub %d of its",
                self.party, name, received, peer.sent, peer.received,
            )
        else:
            peer.link_id = link_id  # frames relayed to it before it dialled in stay queued
        peer.generation += 1
        return ["ok", resumed, peer.received], (peer, peer.generation, received if resumed else 0)

    def _end_link(self, peer: _StarPeer, reason: str) -> None:
        """A star link is over for good: close its connection and drop its frames."""
        if peer.ended is None:
            peer.ended = reason
        if peer.conn is not None:
            peer.conn.raw.socket.close()
            self._uninstall(peer, peer.conn)
        peer.outbox.clear()
        peer.acked = peer.written = peer.started = peer.high_written = peer.sent
        peer.poke()
        self._notify_links()

    def _install(self, peer: _StarPeer, link: _Link) -> None:
        """Make ``link`` the connection of ``peer``'s link, resuming at ``link.resume_from``."""
        peer.take_ack(link.resume_from)
        peer.written = link.resume_from
        peer.heard_at = link.written_at = trio.current_time()  # the handshake just went both ways
        peer.conn = link
        peer.connected = True
        if self._is_hub:
            self._clients[peer.name] = link
        peer.poke()
        self._notify_links()

    def _uninstall(self, peer: _StarPeer, link: _Link) -> None:
        if peer.conn is link:
            peer.conn = None
            peer.poke()
        if self._clients.get(peer.name) is link:
            del self._clients[peer.name]
            self._notify_links()

    async def _serve_star_client(
        self, peer: _StarPeer, generation: int, resume_from: int, link: _Link, peer_address: str
    ) -> None:
        """At the hub: carry one connection of a client's link until it ends."""
        if peer.generation != generation or peer.ended is not None or self._peers.get(peer.name) is not peer:
            return  # a newer connection of the same link was admitted meanwhile
        link.resume_from = resume_from
        self._install(peer, link)
        try:
            reason, final = await self._carry(peer, link, peer_address)
        finally:
            self._uninstall(peer, link)
            link.raw.socket.close()
            self._settle_link(link)
        if final:
            self._end_link(peer, reason)
        elif not self._closed and peer.conn is None and peer.ended is None:
            log.warning(
                "%s: lost the connection of %s (%s): %s; its link waits for it to dial in again",
                self.party, peer.name, peer_address, reason,
            )

    async def _run_hub_link(self) -> None:
        """A star client's :meth:`serve`: dial the hub, carry the link, re-dial it when it breaks."""
        hub = self.hub
        assert hub is not None
        peer = self._peers[hub]
        address = self.addresses[hub]
        redial = False
        while True:
            try:
                link = await self._dial(hub, redial=redial)
            except PeerUnreachable as exc:
                if redial:
                    detail = f"{self.party} lost its connection to the hub {hub} at {address} and could not resume it"
                else:
                    detail = f"{self.party} cannot reach the hub"
                self._lose_hub(PeerUnreachable(f"{detail}: {exc.detail}", party=hub))
                return
            except (TransportClosed, AgreementMismatch):  # a mismatch was recorded by _disagree
                return
            _keep_alive(link.raw)
            if redial:
                self.resumptions += 1
                log.info(
                    "%s: resumed its link to the hub %s: the hub has %d of its %d frames, it %d of the hub's",
                    self.party, hub, link.resume_from, peer.sent, peer.received,
                )
            self._install(peer, link)
            try:
                reason, final = await self._carry(peer, link, str(address))
            finally:
                self._uninstall(peer, link)
                link.raw.socket.close()
                self._settle_link(link)
            if self._closed or peer.bye_written:
                return
            lost = f"{self.party} lost its connection to the hub {hub} at {address}: {reason}"
            if final:
                self._lose_hub(PeerUnreachable(lost, party=hub))
                return
            log.warning("%s; re-dialling to resume the link", lost)
            redial = True

    def _lose_hub(self, failure: PeerUnreachable) -> None:
        """Record why a star client has no hub for good; ``receive`` raises it once the inbox is empty."""
        if self._closed:
            return
        log.info("%s", failure)  # raised by send and receive: the party's one error line says it
        self._hub_failure = failure
        peer = self._peers[self.hub]  # type: ignore[index]
        if peer.ended is None:
            peer.ended = failure.detail
        peer.poke()
        self._inbox_send.close()
        self._notify_links()

    async def _carry(self, peer: _StarPeer, link: _Link, peer_address: str) -> tuple[str, bool]:
        """Read and write one connection of a star link until it ends.

        Returns why it ended, and whether the link is over for good (the peer left, or broke the
        link's rules) rather than waiting to resume.
        """
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write_star_link, peer, link)
            if self._is_star_client:
                nursery.start_soon(self._watch_hub, peer, link)
            ended = await self._read_star_link(peer, link, peer_address)
            nursery.cancel_scope.cancel()
        if link.silent_s is not None:
            return f"heard nothing from it for {link.silent_s:g} s (stopped, or the path is dead)", False
        return ended

    async def _watch_hub(self, peer: _StarPeer, link: _Link) -> None:
        """At a star client: close the connection once the hub has been silent too long.

        The client writes at least a keep-alive every ``keepalive_s`` and the hub answers each
        (whatever its own ``keepalive_s``), so silence for :data:`KEEPALIVE_MISSES` of them means
        the hub is stopped or the path is dead: the client re-dials (and gives up once it has
        heard nothing for ``resume_timeout_s``).
        """
        silence_s = KEEPALIVE_MISSES * self.keepalive_s
        while peer.conn is link:
            await trio.sleep_until(peer.heard_at + silence_s)
            for _ in range(3):  # bytes that arrived while the loop was busy are read first
                await trio.lowlevel.checkpoint()
            if peer.conn is link and trio.current_time() >= peer.heard_at + silence_s:
                link.silent_s = silence_s
                link.raw.socket.close()  # its reader and writer end
                return

    async def _write_star_link(self, peer: _StarPeer, link: _Link) -> None:
        """The one writer of a star connection: acknowledgements, then queued frames, then a BYE.

        Frames go out in their numbers' order from ``peer.written`` (the resume point, on a new
        connection). A failed write closes the connection (its reader then ends); the frame stays
        queued for the next connection.
        """
        try:
            while peer.conn is link:
                keepalive_at = link.written_at + self.keepalive_s
                # An idle link's ACK is its keep-alive; the hub answers a client's with its own.
                if peer.ack_due() or peer.echo_owed or trio.current_time() >= keepalive_at:
                    peer.echo_owed = False
                    count, owed_bytes = peer.received, peer.ack_owed_bytes
                    await self._write_control(link, ACK_INDEX, count)
                    peer.ack_sent = max(peer.ack_sent, count)
                    peer.ack_owed_bytes = max(0, peer.ack_owed_bytes - owed_bytes)
                    continue
                if peer.written < peer.sent:
                    number = peer.written
                    index, frame = peer.frame(number)
                    first = number >= peer.high_written
                    relayed = self._is_hub and index is not None
                    peer.started = max(peer.started, number + 1)
                    peer.echo_owed = False  # the peer hears this frame
                    await self._write_star(link, index, frame, relayed=relayed, resend=not first)
                    peer.high_written = max(peer.high_written, number + 1)
                    if peer.conn is link and peer.written == number:
                        peer.written = number + 1
                    if first and relayed:
                        self.relayed_frames += 1
                    peer.poke()
                    continue
                if peer.leaving and not peer.bye_written:
                    await self._write_control(link, BYE_INDEX, peer.received)
                    peer.ack_sent = peer.received
                    peer.bye_written = True
                    peer.poke()
                    return
                with trio.move_on_at(keepalive_at):
                    await peer.changed.wait()
        except (TransportBroken, TransportClosed) as exc:
            if peer.conn is link and not self._closed:
                log.debug("%s: writing to %s failed: %s", self.party, peer.name, exc)
            link.raw.socket.close()  # its reader ends too
            self._uninstall(peer, link)

    async def _write_star(self, link: _Link, index: int | None, frame: bytes, *, relayed: bool, resend: bool) -> None:
        """Write one frame on a star connection (its only writer) and count the bytes it cost.

        ``index`` is the roster position of a route header (``None``: the peer's own frame). This
        party's own frames add their route header to ``relay_overhead_bytes`` and the TLS records
        to ``tls_overhead_bytes``; a frame the hub relays (``relayed``) adds everything written to
        ``relay_overhead_bytes``, and a frame written again after a resumption (``resend``), or the
        part of one written before its connection broke, to ``resumption_overhead_bytes``.
        """
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
                self.resumption_overhead_bytes += wasted
            raise
        written = plaintext
        link.written_at = trio.current_time()
        if link.wire is not None:
            written = link.wire.sent_bytes - before
            link.counted += written
        if resend:
            self.resumption_overhead_bytes += written
            self.resent_frames += 1
        elif relayed:
            self.relay_overhead_bytes += written
        else:
            self.relay_overhead_bytes += plaintext - FRAMING_OVERHEAD_BYTES - len(frame)
            self.tls_overhead_bytes += written - plaintext

    async def _write_control(self, link: _Link, index: int, count: int) -> None:
        """Write an ACK (or keep-alive) or BYE on a star connection; all it costs is resumption overhead."""
        before = link.wire.sent_bytes if link.wire is not None else 0
        try:
            await send_control(link.channel, index, count)
            link.written_at = trio.current_time()
        finally:
            if link.wire is not None:
                written = link.wire.sent_bytes - before
                link.counted += written
                self.resumption_overhead_bytes += written
        if link.wire is None:
            self.resumption_overhead_bytes += CONTROL_FRAME_BYTES

    def _settle_link(self, link: _Link) -> None:
        """Count what TLS wrote on an ended star connection beyond the frames' accounts (e.g. alerts)."""
        if link.wire is not None:
            self.tls_overhead_bytes += link.wire.sent_bytes - link.counted
            link.counted = link.wire.sent_bytes

    def _deliver(self, sender: str, frame: bytes) -> None:
        try:
            self._inbox_send.send_nowait((sender, frame))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise self._inbox_ended() from None

    def _inbox_ended(self) -> TransportError | AgreementMismatch:
        """What ``receive`` raises once the inbox is closed and empty."""
        if self._disagreement is not None and not self._closed:
            return self._disagreement_error()
        failure = self._hub_failure
        if failure is None or self._closed:
            return TransportClosed(f"the endpoint of {self.party} is closed", party=self.party)
        return PeerUnreachable(failure.detail, party=self.hub)

    def _violation(self, peer: _StarPeer, peer_address: str, reason: str) -> tuple[str, bool]:
        log.warning("%s: closing the link of %s (%s): %s", self.party, peer.name, peer_address, reason)
        return reason, True

    async def _read_star_link(self, peer: _StarPeer, link: _Link, peer_address: str) -> tuple[str, bool]:
        """Read a star connection until it ends; returns what :meth:`_carry` returns.

        At the hub, the client's own frames go to this endpoint's inbox and routed ones to the
        link of the party their header names. At a client, plain frames are the hub's and a
        routed frame is from the party its header names: the hub, which authenticated that
        party's connection, is trusted to name it. Control frames acknowledge this side's frames;
        a BYE ends the link. Once a newer connection of the link took over, nothing more is taken
        from this one, so every frame of the link counts (and is delivered) once.
        """
        assert link.reader is not None
        limit = max(self.max_frame_bytes, CONTROL_BYTES)
        while True:
            try:
                index, frame = await link.reader.receive_routed_frame(limit)
            except trio.EndOfChannel:
                log.debug("%s: %s (%s) closed its connection", self.party, peer.name, peer_address)
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
                if index == ACK_INDEX and self._is_hub:
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
                    log.debug("%s: %s left, having received %d frames", self.party, peer.name, count)
                    return f"{peer.name} left", True
                continue
            if len(frame) > self.max_frame_bytes:
                return self._violation(peer, peer_address, str(FrameTooLarge(len(frame), self.max_frame_bytes)))
            if index is not None and index >= len(self.roster):
                return self._violation(
                    peer, peer_address, f"a route header named party #{index} of a roster of {len(self.roster)}"
                )
            peer.received += 1
            peer.ack_owed_bytes += len(frame)
            if peer.ack_due():
                peer.poke()
            if self._is_hub and index is not None and self.roster[index] != self.party:
                self._relay(peer.name, self.roster[index], frame)
                continue
            sender = peer.name if self._is_hub or index is None else self.roster[index]
            try:
                self._inbox_send.send_nowait((sender, frame))
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return "the endpoint was closed", False

    async def leave(self) -> None:
        """A star client's graceful end: write what it still has for the hub, then say goodbye.

        Its frames not yet written (on a link that is being resumed, say) are written first,
        then a BYE, which tells the hub that the link is over and that the client received the
        hub's frames up to then; the hub stops waiting for it (:meth:`linger`). Waits at most
        ``resume_timeout_s``. Returns at once for any other endpoint, a closed one, or one that
        lost the hub. The endpoint stays open (:meth:`aclose` it after).
        """
        if not self._is_star_client or self._closed or self._hub_failure is not None:
            return
        peer = self._peers[self.hub]  # type: ignore[index]
        if not peer.connected:
            return
        peer.leaving = True
        peer.poke()
        with trio.move_on_after(self.resume_timeout_s):
            while not peer.bye_written and self._hub_failure is None and not self._closed:
                await peer.changed.wait()
        if not peer.bye_written and not self._closed:
            log.warning("%s: could not say goodbye to the hub %s", self.party, self.hub)

    async def linger(self) -> None:
        """At a star's hub, keep relaying until every client has left.

        The hub's own run may end while clients still exchange frames through it, or while a
        client whose connection broke has yet to come back for the hub's last frames; closing
        then would cut them off. Waits until every client that dialled in has said goodbye (see
        :meth:`leave`), at most ``linger_s``; clients still expected are logged. A client that
        ended without a goodbye (killed, or failed) is waited for the whole ``linger_s``. Returns
        at once for any other endpoint, or a closed one.
        """
        if not self._is_hub or self._closed:
            return

        def expected() -> list[str]:
            return sorted(p.name for p in self._peers.values() if p.connected and p.ended is None)

        with trio.move_on_after(self.linger_s):
            while expected():
                await self._links_changed.wait()
        if expected():
            log.warning(
                "%s: closing the hub with %s still connected or expected back after %s s",
                self.party, ", ".join(expected()), self.linger_s,
            )

    # --------------------------------------------------------------------------------- receive

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
        self._check_open()
        self._check_agreed()
        try:
            return await self._inbox_receive.receive()
        except (trio.ClosedResourceError, trio.EndOfChannel):
            raise self._inbox_ended() from None

    def receive_nowait(self) -> tuple[str, bytes] | None:
        """The next ``(sender, frame)`` already received, else ``None`` (never waits).

        Raises:
            TransportClosed: this endpoint was closed.
            PeerUnreachable, AgreementMismatch: as for :meth:`receive`.
        """
        self._check_open()
        self._check_agreed()
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
            star_links = [*self._clients.values(), *(p.conn for p in self._peers.values() if p.conn is not None)]
            for stream in [
                *self._incoming,
                *self._dialling,
                *(link.raw for link in [*self._outgoing.values(), *star_links]),
            ]:
                stream.socket.close()
            self._outgoing.clear()
            self._clients.clear()
            for peer in self._peers.values():
                peer.conn = None
                peer.poke()
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
    clients here say goodbye (:meth:`TcpTransport.leave`) and are closed first, then a hub here
    lingers (:meth:`TcpTransport.linger`) for clients elsewhere. An error of the body comes out as itself, not wrapped in the nursery's
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
                async with trio.open_nursery() as leaving:
                    for endpoint in clients:
                        leaving.start_soon(endpoint.leave)
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
        agreement: what the local parties run (:class:`fedproto.agreement.Agreement`), compared
            in every handshake (see :class:`TcpTransport`); ``None`` compares nothing.
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
        agreement: Agreement | None = None,
        **kwargs: Any,
    ) -> None:
        if agreement is not None:
            kwargs["agreement"] = agreement
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

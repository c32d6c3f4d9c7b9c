"""TCP transport: mutually authenticated trio streams carrying length-prefixed frames, as a star or a mesh.

Theory of operation
-------------------
Two topologies (``topology=``; ``fedproto party`` and ``fedproto run --transport tcp`` use the
star, the roster says which):

* **Star** (``"star"``): only the **hub**, the roster's first party (the coordinating one:
  ``server``, ``coordinator``, ``root``), listens. Every other party (a *client* here) dials out
  to it from :meth:`TcpTransport.serve` and keeps that one connection, which carries both
  directions; the hub relays frames between clients behind route headers, unchanged, and is
  trusted to name their senders. A star link outlives its connections: a connection that breaks
  is re-dialled and the link resumes, no frame lost or delivered twice; keep-alives notice a
  silent hub; failure notices jump the queue. When its own run is over the hub keeps relaying
  (:meth:`TcpTransport.linger`) until its clients have said goodbye (:meth:`TcpTransport.leave`).
* **Mesh** (``"mesh"``, the default of :class:`TcpTransport` itself; for a LAN): every party
  listens on its own address, and each ordered pair of parties has its own connection, dialled
  on the first ``send``.

Every connection starts with a handshake: mutual TLS 1.3 with one certificate per party (the
default), or an HMAC challenge-response over one shared secret (insecure, explicit choice),
either way comparing the parties' agreement records (protocol, options, roster, session). In both
modes the sender of every received frame is the authenticated name of its connection, never
anything in the frame. Frames above ``max_frame_bytes`` are refused from the length prefix,
before their body is read. Refused connections are logged as WARNINGs on
``logging.getLogger("fedproto.transports.tcp")`` (once per peer host, then as counts).

Where each part lives (this module only gathers the public names):

* :mod:`fedproto.transports._framing`: length-prefixed, routed and control frames;
* :mod:`fedproto.transports._tls`: TLS identity (contexts from a party's kit, peer names);
* :mod:`fedproto.transports._tcp_handshake`: both handshakes and the agreement exchange;
* :mod:`fedproto.transports._tcp_dial`, :mod:`fedproto.transports._tcp_listener` (with
  :mod:`fedproto.transports._admission`): making and accepting connections;
* :mod:`fedproto.transports._tcp_mesh`: the mesh's links;
* :mod:`fedproto.transports._star_peer`, :mod:`fedproto.transports._star_link`,
  :mod:`fedproto.transports._star_hub`, :mod:`fedproto.transports._star_client`: the star's
  resumable links, keep-alives and relay;
* :mod:`fedproto.transports._tcp_state` and :mod:`fedproto.transports._tcp_endpoint`: one
  endpoint's shared state, and :class:`TcpTransport`, which wires the parts;
* :mod:`fedproto.transports._tcp_network`: :class:`TcpNetwork`, :func:`open_tcp_network`.

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

from fedproto.transports._star_link import KEEPALIVE_MISSES
from fedproto.transports._star_peer import ACK_EVERY_BYTES, ACK_EVERY_FRAMES
from fedproto.transports._star_peer import StarPeer as _StarPeer  # noqa: F401 (its old name, which tests import)
from fedproto.transports._tcp_address import TcpAddress
from fedproto.transports._tcp_endpoint import TcpTransport
from fedproto.transports._tcp_handshake import (
    HANDSHAKE_VERSION,
    STAR_HANDSHAKE_VERSION,
    STAR_TLS_HELLO_VERSION,
    TLS_HELLO_VERSION,
    handshake_mac,
    roster_digest,
)
from fedproto.transports._tcp_network import TcpNetwork, open_tcp_network, throwaway_tls
from fedproto.transports._tcp_state import (
    DEFAULT_KEEPALIVE_S,
    DEFAULT_LINGER_S,
    DEFAULT_RESUME_TIMEOUT_S,
    MIN_SECRET_BYTES,
    TOPOLOGIES,
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

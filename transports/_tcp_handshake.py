"""The TCP transport's handshakes: who is at the other end of a new connection, and does it run what we run.

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
refused with a message saying so. D checks the listener's certificate against the CA and the name
of the party it dialled before it writes a byte of the hello, so an impostor listener learns
nothing. L takes D's name from D's verified certificate, never from the hello: the hello's claimed
dialer must equal it. A star client's hello adds its link's resumption fields (the link id and
how many of the hub's frames it received) and the hub answers ``["ok", resumed, received]``
(:mod:`fedproto.transports._star_hub`).

Shared-secret handshake (explicit choice, insecure)
---------------------------------------------------
Built with a ``secret`` instead of ``tls``, every connection instead starts with an HMAC
challenge-response over one secret shared by the whole run (every message is a length-prefixed
msgpack array, at most 16 KiB)::

    dialer D                                            listener L
      hello [version, session, H(roster), D, L, nonce_D]  ->
                                       <-  [nonce_L, MAC(secret, "listener" | ctx)]
      [MAC(secret, "dialer" | ctx)]                       ->
                                       <-  ["ok"]

where ``ctx = (version, session, H(roster), D, L, nonce_D, nonce_L)`` (:func:`handshake_mac`).
L proves its name first (so a dialer never reveals a MAC to an impostor listener), then D proves
its own; each MAC covers the other side's fresh nonce, so neither can be replayed, and the role
label keeps one side's MAC from being reflected as the other's. MACs are compared with
:func:`hmac.compare_digest`. Any holder of the secret can claim any party's name, and frames after
the handshake are neither encrypted nor MACed: use it for loopback experiments only.

Agreement
---------
An endpoint built with an ``agreement`` sends its record as the last field of its hello, and the
listener compares it with its own before it looks at the session or the roster, so a party
started with other options is named with the first option that differs. With TLS the listener
answers ``["differ", its record]``; with the shared secret the listener's challenge carries its
record, both MACs cover both records' SHA-256, and each side decides only once the other has
proved it holds the secret, so a stranger cannot end the run. Either side then raises
:class:`~fedproto.errors.AgreementMismatch`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import secrets
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import msgpack
import trio

from fedproto.agreement import Agreement
from fedproto.errors import AgreementMismatch, TransportBroken, TransportClosed, TransportError
from fedproto.transports._framing import FRAMING_OVERHEAD_BYTES, FrameReader, FrameTooLarge, send_frame

if TYPE_CHECKING:
    from fedproto.transports._tcp_state import EndpointState

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

NONCE_BYTES = 32
MAC_BYTES = 32
HANDSHAKE_MAX_FRAME_BYTES = 16 * 1024
LINK_ID_BYTES = 16


class HandshakeFailed(Exception):
    """The peer failed the handshake (the message says why)."""


class HandshakeCut(HandshakeFailed):
    """The listener closed the connection in the TLS handshake without an alert: not a refusal
    of our certificate (that comes with one) but a connection it had no room for (its cap on
    pending handshakes), or one the network cut. The dialer tries again."""


# What a failed dialer handshake raises (anything else propagates).
DIAL_FAILURES = (HandshakeFailed, trio.TooSlowError, trio.EndOfChannel, FrameTooLarge, TransportBroken)


@dataclasses.dataclass(eq=False)
class Written:
    """Bytes one shared-secret handshake wrote so far (kept when the handshake fails midway)."""

    nbytes: int = 0


def tls_module() -> Any:
    """:mod:`fedproto.transports._tls`, imported when TLS is first used (``ssl`` and X.509)."""
    from fedproto.transports import _tls

    return _tls


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack_list(data: bytes, length: int | tuple[int, ...], what: str) -> list[Any]:
    lengths = (length,) if isinstance(length, int) else length
    try:
        obj = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise HandshakeFailed(f"malformed {what} ({type(exc).__name__})") from exc
    if not isinstance(obj, list) or len(obj) not in lengths:
        raise HandshakeFailed(f"malformed {what} (expected an array of {' or '.join(map(str, lengths))})")
    return obj


def expect_bytes(value: Any, n: int, what: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != n:
        raise HandshakeFailed(f"malformed {what} (expected {n} bytes)")
    return value


def resume_fields(link_id: Any, received: Any, who: str) -> tuple[bytes, int]:
    """A star client's resumption fields, checked: its link's id and the frames it received."""
    link_id = expect_bytes(link_id, LINK_ID_BYTES, f"link id from {who}")
    if isinstance(received, bool) or not isinstance(received, int) or not 0 <= received < 2**64:
        raise HandshakeFailed(f"malformed resumption count from {who}")
    return link_id, received


def causes(exc: BaseException) -> Iterator[BaseException]:
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


def network_failure(exc: BaseException) -> bool:
    """Whether a failed handshake broke on the network (reset, timeout) rather than being refused."""
    return any(isinstance(e, (trio.TooSlowError, ConnectionError, TimeoutError)) for e in causes(exc))


def record_digest(record: bytes | None) -> bytes:
    """SHA-256 of an encoded agreement record as sent, ``b""`` for none (bound into the MACs)."""
    return b"" if record is None else hashlib.sha256(record).digest()


def peer_record(value: Any, who: str) -> Agreement | None:
    """A peer's agreement record from its hello (``None`` when it sent none)."""
    if value is None:
        return None
    if not isinstance(value, bytes):
        raise HandshakeFailed(f"malformed agreement record from {who}")
    try:
        return Agreement.from_bytes(value)
    except ValueError as exc:
        raise HandshakeFailed(f"malformed agreement record from {who}: {exc}") from None


def roster_digest(roster: Sequence[str]) -> bytes:
    """SHA-256 of the msgpack-encoded roster (32 bytes), bound into every handshake MAC."""
    return hashlib.sha256(pack(list(roster))).digest()


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
    context = pack(fields)
    return hmac.new(secret, context, hashlib.sha256).digest()


class Handshakes:
    """Both sides of both handshakes for one endpoint.

    Args:
        state: the endpoint's shared state.
        star: at a star's hub its :class:`~fedproto.transports._star_hub.StarHub` (which admits
            a client's connection to its link), at a star client its
            :class:`~fedproto.transports._star_client.StarClient` (which states and checks the
            link's resumption), ``None`` in a mesh.
    """

    def __init__(self, state: EndpointState, star: Any = None) -> None:
        self._state = state
        self._star = star

    def hello_version(self, *, tls: bool) -> str:
        if tls:
            return TLS_HELLO_VERSION if self._state.hub is None else STAR_TLS_HELLO_VERSION
        return HANDSHAKE_VERSION if self._state.hub is None else STAR_HANDSHAKE_VERSION

    def check_hello_version(self, version: Any, who: str, *, tls: bool) -> None:
        """Refuse a hello of another version, saying so plainly when it is the other topology's."""
        if version == self.hello_version(tls=tls):
            return
        star = STAR_TLS_HELLO_VERSION if tls else STAR_HANDSHAKE_VERSION
        mesh = TLS_HELLO_VERSION if tls else HANDSHAKE_VERSION
        if version in (star, mesh):
            theirs = "a star client" if version == star else "a full-mesh party"
            mine = "the hub of a star" if self._state.is_hub else "a full-mesh party"
            raise HandshakeFailed(f"{who} dials as {theirs}, this endpoint is {mine} (the topologies differ)")
        what = "hello" if tls else "handshake"
        raise HandshakeFailed(f"unsupported {what} version {version!r}" + (f" from {who}" if tls else ""))

    @staticmethod
    async def send(stream: trio.SocketStream, message: list[Any], written: Written) -> None:
        data = pack(message)
        await send_frame(stream, data)
        written.nbytes += FRAMING_OVERHEAD_BYTES + len(data)

    def _resume_request(self) -> list[Any]:
        return self._star.resume_request() if self._state.is_star_client else []

    # -------------------------------------------------------------------------------- listener

    async def listener_secret(
        self, stream: trio.SocketStream, reader: FrameReader, written: Written
    ) -> tuple[str, Any]:
        """The listener's shared-secret handshake; returns the dialer's name and, at a hub, its admission."""
        state = self._state
        hello = unpack_list(await reader.receive_frame(HANDSHAKE_MAX_FRAME_BYTES), (6, 7), "hello")
        version, session, roster_hash, dialer, listener, dialer_nonce = hello[:6]
        self.check_hello_version(version, f"claimed party {dialer!r}", tls=False)
        if not isinstance(dialer, str):
            raise HandshakeFailed("malformed hello (party name is not a string)")
        if dialer not in state.roster_set:
            raise HandshakeFailed(f"claimed party {dialer!r} is not in the roster")
        record = hello[6] if len(hello) == 7 else None
        theirs = peer_record(record, repr(dialer))
        # Records that differ are a configuration error to report, once the dialer has proved it
        # holds the secret (a stranger must not end the run): the session and roster, which the
        # options often determine, are then not refused here, and the MACs cover the hello as sent.
        agreed = theirs == state.agreement
        if agreed and session != state.session:
            raise HandshakeFailed(f"{dialer!r} is in session {session!r}, this run is {state.session}")
        if agreed and roster_hash != state.roster_hash:
            raise HandshakeFailed(f"{dialer!r} has a different roster")
        if not isinstance(session, int) or not isinstance(roster_hash, bytes):
            raise HandshakeFailed(f"malformed hello from claimed party {dialer!r}")
        if listener != state.party:
            raise HandshakeFailed(f"{dialer!r} wanted party {listener!r}, this is {state.party!r}")
        dialer_nonce = expect_bytes(dialer_nonce, NONCE_BYTES, "hello nonce")
        listener_nonce = secrets.token_bytes(NONCE_BYTES)
        context = dict(
            session=session,
            roster_hash=roster_hash,
            dialer=dialer,
            listener=state.party,
            dialer_nonce=dialer_nonce,
            listener_nonce=listener_nonce,
            version=version,
            dialer_agreement=record_digest(record),
            listener_agreement=state.agreement_hash,
        )
        await self.send(
            stream, [listener_nonce, handshake_mac(state.secret, "listener", **context), *state.records()], written
        )
        # A star client's proof carries its link's resumption fields (see StarHub.admit).
        proof, *resume = unpack_list(
            await reader.receive_frame(HANDSHAKE_MAX_FRAME_BYTES), 3 if state.is_hub else 1, "proof"
        )
        proof = expect_bytes(proof, MAC_BYTES, "proof")
        if not hmac.compare_digest(proof, handshake_mac(state.secret, "dialer", **context)):
            raise HandshakeFailed(f"bad MAC from claimed party {dialer!r} (wrong secret?)")
        state.compare(theirs, dialer)  # the dialer, which saw our record, ends too
        ack, admitted = ["ok"], None
        if state.is_hub:
            ack, admitted = self._star.admit(dialer, *resume_fields(*resume, repr(dialer)))
        await self.send(stream, ack, written)
        return dialer, admitted

    async def listener_tls(self, channel: trio.SSLStream[Any], reader: FrameReader) -> tuple[str, Any]:
        """TLS 1.3 with the dialer's certificate required, then the hello.

        Returns the dialer's name and, at a star's hub, the link it was admitted to (see
        :meth:`StarHub.admit`) with the admission's generation.
        """
        state = self._state
        tls = tls_module()
        try:
            await channel.do_handshake()
        except trio.BrokenResourceError as exc:
            raise HandshakeFailed(f"TLS handshake failed ({tls.failure_reason(exc)})") from exc
        except trio.ClosedResourceError as exc:  # we closed the socket (aclose) mid-handshake
            raise TransportClosed("the connection was closed during the TLS handshake") from exc
        try:
            named = tls.peer_party(channel)
        except ValueError as exc:
            raise HandshakeFailed(str(exc)) from None
        if named not in state.roster_set:
            raise HandshakeFailed(f"certificate for {named!r}, who is not in the roster")
        # A star client's hello has two more fields, its link's resumption fields (StarHub.admit);
        # then comes the dialer's agreement record, if it states one.
        hello = unpack_list(await reader.receive_frame(HANDSHAKE_MAX_FRAME_BYTES), (5, 6, 7, 8), "hello")
        version, session, roster_hash, dialer, listener = hello[:5]
        self.check_hello_version(version, repr(named), tls=True)
        if dialer != named:
            raise HandshakeFailed(f"the certificate names {named!r} but the hello claims {dialer!r}")
        fields = 7 if state.is_hub else 5
        if state.is_hub and len(hello) < fields:
            raise HandshakeFailed(f"malformed hello from {named!r} (no resumption fields)")
        if len(hello) > fields + 1:
            raise HandshakeFailed(f"malformed hello from {named!r} (expected an array of {fields} or {fields + 1})")
        hello, record = hello[:fields], (hello[fields] if len(hello) > fields else None)
        try:
            state.compare(peer_record(record, repr(named)), named)
        except AgreementMismatch:
            try:  # the dialer learns why, and ends too
                await send_frame(channel, pack(["differ", *state.records()]))
            except TransportError:
                pass
            raise
        if session != state.session:
            raise HandshakeFailed(f"{named!r} is in session {session!r}, this run is {state.session}")
        if roster_hash != state.roster_hash:
            raise HandshakeFailed(f"{named!r} has a different roster")
        if listener != state.party:
            raise HandshakeFailed(f"{named!r} wanted party {listener!r}, this is {state.party!r}")
        ack, admitted = ["ok"], None
        if state.is_hub:
            ack, admitted = self._star.admit(named, *resume_fields(*hello[5:], repr(named)))
        await send_frame(channel, pack(ack))
        return named, admitted

    # ---------------------------------------------------------------------------------- dialer

    def check_acknowledgement(self, frame: bytes, dest: str) -> int | None:
        """The listener's acknowledgement; at a star client, how many of its frames the hub has.

        The hub answers ``["ok", resumed, received]``: whether it knew the client's link, and how
        many of the client's frames it has received (the client writes again those after them).
        A listener whose agreement record differs answers ``["differ", its record]`` instead.

        Raises:
            AgreementMismatch: ``dest`` runs something else.
            HandshakeFailed: a malformed acknowledgement.
        """
        reply = unpack_list(frame, (1, 2, 3), "acknowledgement")
        if reply[0] == "differ" and len(reply) <= 2:
            self._state.compare(peer_record(reply[1] if len(reply) == 2 else None, repr(dest)), dest)
            raise HandshakeFailed(f"{dest} said our agreement records differ, but they agree")
        if not self._state.is_star_client:
            if reply != ["ok"]:
                raise HandshakeFailed("malformed acknowledgement")
            return None
        if len(reply) != 3:
            raise HandshakeFailed("malformed acknowledgement (expected an array of 3)")
        ok, resumed, received = reply
        if ok != "ok" or not isinstance(resumed, bool) or isinstance(received, bool) or not isinstance(received, int):
            raise HandshakeFailed("malformed acknowledgement")
        return self._star.check_resumption(resumed, received)

    async def dialer_secret(
        self, stream: trio.SocketStream, dest: str, reader: FrameReader, written: Written
    ) -> int | None:
        """The dialer's shared-secret handshake; returns what :meth:`check_acknowledgement` returns."""
        state = self._state
        version = self.hello_version(tls=False)
        dialer_nonce = secrets.token_bytes(NONCE_BYTES)
        await self.send(
            stream,
            [version, state.session, state.roster_hash, state.party, dest, dialer_nonce, *state.records()],
            written,
        )
        challenge = unpack_list(await reader.receive_frame(HANDSHAKE_MAX_FRAME_BYTES), (2, 3), "challenge")
        listener_nonce, proof = challenge[:2]
        record = challenge[2] if len(challenge) == 3 else None
        theirs = peer_record(record, repr(dest))
        listener_nonce = expect_bytes(listener_nonce, NONCE_BYTES, "challenge nonce")
        proof = expect_bytes(proof, MAC_BYTES, "challenge proof")
        context = dict(
            session=state.session,
            roster_hash=state.roster_hash,
            dialer=state.party,
            listener=dest,
            dialer_nonce=dialer_nonce,
            listener_nonce=listener_nonce,
            version=version,
            dialer_agreement=state.agreement_hash,
            listener_agreement=record_digest(record),
        )
        if not hmac.compare_digest(proof, handshake_mac(state.secret, "listener", **context)):
            raise HandshakeFailed(f"the listener failed to prove it is {dest!r} (wrong secret?)")
        await self.send(stream, [handshake_mac(state.secret, "dialer", **context), *self._resume_request()], written)
        # Our proof lets the listener, too, trust our record and end; then we end.
        state.compare(theirs, dest)
        return self.check_acknowledgement(await reader.receive_frame(HANDSHAKE_MAX_FRAME_BYTES), dest)

    async def dialer_tls(self, channel: trio.SSLStream[Any], dest: str, reader: FrameReader) -> int | None:
        """TLS 1.3 checking ``dest``'s certificate and name, then the hello and its acknowledgement.

        Returns what :meth:`check_acknowledgement` returns.
        """
        state = self._state
        tls = tls_module()
        try:
            await channel.do_handshake()
        except trio.BrokenResourceError as exc:
            failure = HandshakeCut if tls.cut_without_alert(exc) else HandshakeFailed
            raise failure(f"TLS handshake failed ({tls.failure_reason(exc)})") from exc
        except trio.ClosedResourceError as exc:  # we closed the socket (aclose) mid-handshake
            raise TransportClosed("the connection was closed during the TLS handshake") from exc
        # Only now, with the listener's certificate checked against dest's name, may we speak.
        hello = [self.hello_version(tls=True), state.session, state.roster_hash, state.party, dest]
        await send_frame(channel, pack([*hello, *self._resume_request(), *state.records()]))
        try:
            frame = await reader.receive_frame(HANDSHAKE_MAX_FRAME_BYTES)
        except TransportBroken as exc:  # a TLS alert: the listener refused our certificate
            if network_failure(exc):
                raise
            raise HandshakeFailed(f"refused by the peer ({tls.failure_reason(exc)})") from exc
        return self.check_acknowledgement(frame, dest)

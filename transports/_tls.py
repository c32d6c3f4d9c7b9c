"""Mutual TLS 1.3 for the TCP transport: contexts from a party's kit, peer names, wire byte counts.

:func:`load_contexts` builds the two :class:`ssl.SSLContext` of one party from its
:class:`~fedproto.roster.TlsFiles` (the listener's and the dialer's), after checking that the
certificate names that party, is signed by the kit's CA and is within its validity period.
Both contexts:

* accept TLS 1.3 only (``minimum_version = TLSv1_3``);
* trust the federation CA alone (no system store), with ``VERIFY_X509_STRICT``;
* require the peer's certificate (``CERT_REQUIRED``): the listener refuses a dialer without one
  (mutual authentication), and the dialer checks the listener's against the name of the party it
  dialled (``check_hostname``, ``server_hostname`` = that party name);
* present this party's certificate; the listener issues no session tickets (no resumption is
  used, and tickets would only add bytes).

:class:`MeteredStream` sits under :class:`trio.SSLStream` and counts the bytes TLS writes to the
socket, so the transport can report TLS record overhead apart from payload bytes.

References:
    RFC 8446 (TLS 1.3), sections 4.3.2 (CertificateRequest: the client certificate), 4.4.2
    (Certificate), 5.2 (record protection: 5-byte header, 1-byte inner content type and a 16-byte
    AEAD tag per record); RFC 6125 section 6 (checking a server's name against its certificate).
"""

from __future__ import annotations

import dataclasses
import datetime
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from fedproto.provision import certificate_party
from fedproto.roster import TlsFiles

__all__ = ["TlsContexts", "MeteredStream", "load_contexts", "peer_party", "failure_reason", "cut_without_alert"]


@dataclasses.dataclass(frozen=True)
class TlsContexts:
    """One party's TLS contexts.

    Attributes:
        party: the party the certificate names.
        listener: server-side context (requires and verifies the dialer's certificate).
        dialer: client-side context (verifies the listener's certificate and name).
        not_valid_after: when this party's certificate expires (UTC).
    """

    party: str
    listener: ssl.SSLContext
    dialer: ssl.SSLContext
    not_valid_after: datetime.datetime


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None


def _context(server_side: bool, files: TlsFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    if server_side:
        context.num_tickets = 0
    else:
        context.check_hostname = True
    context.load_verify_locations(cafile=str(files.ca))
    context.load_cert_chain(str(files.cert), str(files.key))
    return context


def load_contexts(files: TlsFiles, party: str, *, now: datetime.datetime | None = None) -> TlsContexts:
    """Check ``party``'s kit and build its listener and dialer contexts.

    Args:
        files: the party's CA certificate, certificate and key (PEM files).
        party: the party these files must be for.
        now: the time the certificate must be valid at (default: now, UTC).

    Raises:
        ValueError: one line: a file cannot be read or parsed, the certificate names another
            party, is not signed by the kit's CA, is expired or not yet valid, or the key does
            not match it.
    """
    ca_pem = _read(files.ca, "CA certificate")
    cert_pem = _read(files.cert, "certificate")
    try:
        named = certificate_party(cert_pem)
    except ValueError as exc:
        raise ValueError(f"the certificate {files.cert}: {exc}") from None
    if named != party:
        raise ValueError(f"the certificate {files.cert} is for {named!r}, not {party!r} (another party's kit?)")
    try:
        ca = x509.load_pem_x509_certificate(ca_pem)
    except ValueError as exc:
        raise ValueError(f"the CA certificate {files.ca} is not a PEM certificate ({exc})") from None
    certificate = x509.load_pem_x509_certificate(cert_pem)
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise ValueError(f"the certificate {files.cert} is not signed by the CA in {files.ca}") from None
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if now >= certificate.not_valid_after_utc:
        expired = certificate.not_valid_after_utc
        raise ValueError(f"the certificate {files.cert} expired on {expired:%Y-%m-%d %H:%M} UTC")
    if now < certificate.not_valid_before_utc:
        raise ValueError(
            f"the certificate {files.cert} is not valid before {certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
        )
    try:
        listener, dialer = _context(True, files), _context(False, files)
    except ssl.SSLError as exc:
        raise ValueError(f"cannot load the TLS key {files.key} with {files.cert}: {exc.reason or exc}") from None
    except OSError as exc:
        raise ValueError(f"cannot read the TLS key {files.key}: {exc.strerror or exc}") from None
    return TlsContexts(party, listener, dialer, certificate.not_valid_after_utc)


def peer_party(stream: trio.SSLStream[Any]) -> str:
    """The party named by the peer's verified certificate (its single SAN DNS name).

    Raises:
        ValueError: the peer presented no certificate or one that names no party or several.
    """
    certificate = stream.getpeercert()
    if not certificate:
        raise ValueError("the peer presented no certificate")
    names = [value for kind, value in certificate.get("subjectAltName", ()) if kind == "DNS"]
    if len(names) != 1:
        raise ValueError(f"the peer's certificate must name exactly one party, it names {names}")
    return names[0]


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then its cause (else its context), and so on: the chain a TLS failure comes in."""
    cause: BaseException | None = exc
    while cause is not None:
        yield cause
        cause = cause.__cause__ or cause.__context__


def cut_without_alert(exc: BaseException) -> bool:
    """Whether a TLS handshake ended because the peer closed the connection (an EOF or a reset,
    no TLS alert): a peer that refuses a certificate says so with an alert."""
    for cause in _chain(exc):
        if isinstance(cause, ssl.SSLCertVerificationError):
            return False
        if isinstance(cause, (ssl.SSLEOFError, ConnectionResetError)):
            return True
        if isinstance(cause, ssl.SSLError) and cause.reason == "UNEXPECTED_EOF_WHILE_READING":
            return True
    return False


def failure_reason(exc: BaseException) -> str:
    """A short reason for a failed TLS exchange, from the :class:`ssl.SSLError` in its causes."""
    for cause in _chain(exc):
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"certificate refused: {cause.verify_message}"
        if isinstance(cause, ssl.SSLError):
            return (cause.reason or str(cause)).replace("_", " ").lower()
    return str(exc) or type(exc).__name__


class MeteredStream(trio.abc.Stream):
    """A stream that passes everything to ``inner`` and counts the bytes written to it.

    Args:
        inner: the socket stream.

    Attributes:
        sent_bytes: bytes written to ``inner`` by completed ``send_all`` calls.
    """

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.sent_bytes = 0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)
        self.sent_bytes += len(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()

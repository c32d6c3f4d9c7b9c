"""Dialling a TCP peer: connect, retry with backoff, run the dialer's handshake, hand back a :class:`Link`.

Dialling is retried with exponential backoff (20 ms doubling to 1 s) until ``connect_timeout_s``
has passed, so parties may start in any order; then :class:`~fedproto.errors.PeerUnreachable`.
A star client's re-dial after a break retries failures of the network until ``resume_timeout_s``
after it last heard from the hub, and gives up at once when the hub's address refuses the
connection (nothing listens there: the hub is gone) or the hub refuses the handshake. A TLS
handshake that the listener cut without an alert (its cap on pending handshakes) is tried again.
"""

from __future__ import annotations

import math

import trio

from fedproto.errors import AgreementMismatch, PeerUnreachable, TransportClosed
from fedproto.transports._framing import FrameReader
from fedproto.transports._tcp_handshake import (
    DIAL_FAILURES,
    HandshakeCut,
    Handshakes,
    Written,
    causes,
    network_failure,
    tls_module,
)
from fedproto.transports._tcp_state import EndpointState, Link, log

_FIRST_RETRY_S = 0.02
_MAX_RETRY_S = 1.0


def refused(exc: BaseException) -> bool:
    """Whether a failed connect was refused (nobody listens there any more)."""
    return any(isinstance(e, ConnectionRefusedError) for e in causes(exc))


class Dialer:
    """Makes one endpoint's outgoing connections (a mesh party's to its peers, a star client's to the hub)."""

    def __init__(self, state: EndpointState, handshakes: Handshakes) -> None:
        self._state = state
        self._handshakes = handshakes
        self._dialling: set[trio.SocketStream] = set()

    def close(self) -> None:
        """Close every connection still in its handshake (synchronously)."""
        for stream in self._dialling:
            stream.socket.close()

    async def dial(self, dest: str, *, heard_at: float | None = None) -> Link:
        """Dial ``dest`` and run the dialer's handshake, retrying with backoff.

        A first dial retries a failed connect until ``connect_timeout_s`` (the peer may not be up
        yet) and gives up when the handshake fails. A star client's re-dial after a break (given
        ``heard_at``, when it last heard from the hub) retries failures of the network, in
        connecting or in the handshake (reset, unreachable, timed out), until ``resume_timeout_s``
        after ``heard_at`` (handshakes included), and gives up at once when the hub's address
        refuses the connection (nothing listens there: the hub is gone) or the hub refuses the
        handshake.

        Raises:
            PeerUnreachable: it gave up (``__cause__`` is the last failure).
            TransportClosed: this endpoint was closed.
        """
        state = self._state
        redial = heard_at is not None
        address = state.addresses[dest]
        if address.port == 0:
            raise PeerUnreachable(f"the address of {dest} is unknown (port 0)", party=dest)
        if heard_at is not None:
            timeout = state.resume_timeout_s
            deadline = heard_at + timeout
            gave_up = f"heard nothing from {dest} at {address} for {timeout:g} s"
        else:
            timeout = state.connect_timeout_s
            deadline = trio.current_time() + timeout
            gave_up = f"cannot connect to {dest} at {address} within {timeout} s"
        retry_s = _FIRST_RETRY_S
        last_error: BaseException | None = None
        while True:
            state.check_open()
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                if isinstance(last_error, HandshakeCut):
                    gave_up += f"; it kept closing our connections in the handshake ({last_error})"
                raise PeerUnreachable(gave_up, party=dest) from last_error
            stream: trio.SocketStream | None = None
            with trio.move_on_after(remaining):
                try:
                    stream = await trio.open_tcp_stream(address.host, address.port)
                except OSError as exc:
                    if redial and refused(exc):
                        raise PeerUnreachable(
                            f"{dest} at {address} refused the connection (nothing listens there any more)", party=dest
                        ) from exc
                    last_error = exc
            if stream is not None:
                try:
                    return await self._handshake(stream, dest, deadline if redial else math.inf)
                except DIAL_FAILURES as exc:
                    state.check_open()
                    if not ((redial and network_failure(exc)) or isinstance(exc, HandshakeCut)):
                        credentials = "secret" if state.tls is None else "certificates"
                        refusal = f"refused by the peer (check {credentials}, session, roster and topology)"
                        reason = {
                            trio.TooSlowError: f"no answer within {state.handshake_timeout_s} s",
                            trio.EndOfChannel: refusal,
                        }.get(type(exc), str(exc))
                        raise PeerUnreachable(
                            f"handshake with {dest} at {address} failed: {reason}", party=dest
                        ) from exc
                    log.debug("%s: handshake with %s broke (%s); trying again", state.party, dest, exc)
                    last_error = exc
            await trio.sleep(max(0.0, min(retry_s, deadline - trio.current_time())))
            retry_s = min(2 * retry_s, _MAX_RETRY_S)

    async def _handshake(self, stream: trio.SocketStream, dest: str, deadline: float = math.inf) -> Link:
        """The dialer's handshake on a fresh connection to ``dest``; closes it if that fails.

        It takes at most ``handshake_timeout_s``, and ends by ``deadline`` (``trio.current_time()``).

        Raises:
            One of ``DIAL_FAILURES``: the handshake failed.
            TransportClosed: this endpoint was closed.
        """
        state = self._state
        self._dialling.add(stream)
        link = Link(stream, stream)
        try:
            try:
                with trio.fail_at(min(deadline, trio.current_time() + state.handshake_timeout_s)):
                    if state.tls is None:
                        link.reader = FrameReader(stream)
                        written = Written()
                        try:
                            resume_from = await self._handshakes.dialer_secret(stream, dest, link.reader, written)
                        finally:
                            state.handshake_bytes += written.nbytes
                    else:
                        link.wire = tls_module().MeteredStream(stream)
                        link.channel = trio.SSLStream(
                            link.wire, state.tls.dialer, server_hostname=dest, https_compatible=True
                        )
                        link.reader = FrameReader(link.channel)
                        try:
                            resume_from = await self._handshakes.dialer_tls(link.channel, dest, link.reader)
                        finally:
                            state.handshake_bytes += link.wire.sent_bytes
                            link.counted = link.wire.sent_bytes
            except TransportClosed:
                state.check_open()
                raise
            except AgreementMismatch as exc:
                state.disagree(exc)
                raise
            state.check_open()
        except BaseException:
            stream.socket.close()
            raise
        finally:
            self._dialling.discard(stream)
        link.resume_from = resume_from or 0
        log.debug("%s: connected to %s at %s", state.party, dest, state.addresses[dest])
        return link

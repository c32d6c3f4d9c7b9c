"""Helpers shared by the TCP transport tests: a proxy base in front of a hub, and a rogue dialler.

Not a test file (pytest collects ``test_*.py`` only). Test files run under
``--import-mode=importlib`` and cannot import one another by name, so they load this one by path::

    from fedproto.testing import load_file

    tcp_helpers = load_file(Path(__file__).resolve().parent / "_tcp_helpers.py", "tests_tcp_helpers")

* :class:`LocalProxy`: the listening half of a TCP proxy that the tests put in front of a hub
  (what a subclass does with each connection, and which sockets it holds, is its own);
* :func:`rogue_hello`: dial a hub with a party's certificate, send one hello frame and wait for
  the hub to hang up.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgpack
import trio

from fedproto.roster import TlsFiles
from fedproto.transports._framing import send_frame
from fedproto.transports._tls import load_contexts
from fedproto.transports.tcp import TcpAddress

__all__ = ["LocalProxy", "rogue_hello"]


class LocalProxy:
    """Base of a TCP proxy in front of ``target`` (a hub's address), listening on 127.0.0.1.

    ``await nursery.start(proxy.serve)`` gives the proxy's port. A subclass handles each accepted
    connection in ``_handle(down)`` (``down``: the client's end) and lists in ``_open_streams()``
    the sockets it still holds, which :meth:`serve` closes when it stops (cancelled or failed), so
    that no test leaves a socket open behind it.

    Args:
        target: the address the proxy forwards to.
    """

    def __init__(self, target: TcpAddress) -> None:
        self.target = target

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen on an ephemeral port of 127.0.0.1 (given to ``task_status``) until cancelled."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        try:
            await trio.serve_listeners(self._handle, listeners)
        finally:
            for stream in self._open_streams():
                stream.socket.close()

    async def _handle(self, down: trio.SocketStream) -> None:
        raise NotImplementedError

    def _open_streams(self) -> Iterable[trio.SocketStream]:
        raise NotImplementedError


async def rogue_hello(address: TcpAddress, files: TlsFiles, party: str, hello: list) -> bool:
    """Dial the hub at ``address`` with ``party``'s certificate (the TLS files ``files``), send
    ``hello`` (msgpack-packed, in one frame) and read until the hub hangs up.

    Returns:
        Whether the hub sent anything before it hung up (``False``: refused, unanswered, by a
        close, a reset or a TLS alert).

    Raises:
        trio.TooSlowError: the handshake, the hello and the hang-up took more than 10 s (the hub
            kept the connection open).
    """
    contexts = load_contexts(files, party)
    stream = await trio.open_tcp_stream(address.host, address.port)
    channel = trio.SSLStream(stream, contexts.dialer, server_hostname="c", https_compatible=True)
    answered = False
    try:
        with trio.fail_after(10):
            await channel.do_handshake()
            await send_frame(channel, msgpack.packb(hello, use_bin_type=True))
            while await channel.receive_some():  # until the hub closes it
                answered = True
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # refused with a TLS alert or a reset
    finally:
        stream.socket.close()
    return answered

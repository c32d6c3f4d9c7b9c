"""A delaying TCP relay in user space: a link with a one-way latency (and optionally a bandwidth).

For the link-model check (issue 31, part 3) only, not part of fedproto: this kernel has no
``tc netem``, so a real link's delay is made by a proxy. :class:`DelayRelay` listens on one
address and, for each connection it accepts, dials the target address and forwards bytes both
ways; every chunk it reads is written on the other side ``latency_s`` after it was read (order
kept), and with ``bandwidth_bytes_per_s`` a chunk of ``n`` bytes also holds its direction of the
link for ``n / bandwidth`` seconds after the previous one, as a frame queued on a link does.

Threads, not an event loop: ``time.sleep`` waits to within tens of microseconds here, whereas a
Trio or asyncio timer wakes on the event loop's millisecond granularity (a 50 us Trio sleep lasts
about 1.2 ms on this machine), which would add most of a millisecond to every 1 ms hop.
Each direction of each connection has a reader thread (``recv`` -> queue, stamped with the time
read) and a writer thread (sleep to the due time, ``sendall``); an end of stream is forwarded as a
half-close (``shutdown(SHUT_WR)``) once the data before it is delivered.

Run as a process (the harness does this inside a network namespace)::

    python benchmarks/_delay_relay.py --listen 0.0.0.0:7000 --target 127.0.0.1:7001 --latency-s 0.025

It prints ``ready HOST:PORT`` once it listens and stops (every connection closed, every thread
joined) on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator

#: Bytes read at once from a socket.
CHUNK_BYTES = 65536
#: Seconds a thread waits to be joined when the relay stops.
JOIN_TIMEOUT_S = 5.0


def parse_address(text: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``.

    Raises:
        ValueError: not ``HOST:PORT`` with an integer port in 0..65535.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


class DelayRelay:
    """Forward TCP connections from ``listen`` to ``target``, each chunk ``latency_s`` late.

    Args:
        listen: ``(host, port)`` to listen on (port 0: any free port; see :attr:`address`).
        target: ``(host, port)`` dialled for each accepted connection.
        latency_s: one-way delay added to every chunk, both directions (seconds, >= 0).
        bandwidth_bytes_per_s: each direction's rate (bytes/s); ``None``: unlimited.

    Raises:
        ValueError: a negative latency or a bandwidth that is not positive.

    Use as a context manager (or call :meth:`start` and :meth:`stop`): on exit every socket is
    closed and every thread the relay started is joined.
    """

    def __init__(
        self, listen: tuple[str, int], target: tuple[str, int], latency_s: float,
        bandwidth_bytes_per_s: float | None = None,
    ) -> None:
        if latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        if bandwidth_bytes_per_s is not None and bandwidth_bytes_per_s <= 0:
            raise ValueError(f"bandwidth_bytes_per_s must be > 0, got {bandwidth_bytes_per_s}")
        self.target = target
        self.latency_s = latency_s
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self._listen = listen
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        #: Chunks forwarded and bytes forwarded, both directions (for the harness's checks).
        self.chunks = 0
        self.bytes = 0

    @property
    def address(self) -> tuple[str, int]:
        """The ``(host, port)`` the relay listens on."""
        if self._listener is None:
            raise RuntimeError("the relay is not started")
        return self._listener.getsockname()[:2]

    def start(self) -> DelayRelay:
        """Listen and accept in a thread. Returns ``self``."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(self._listen)
        listener.listen(128)
        self._listener = listener
        self._spawn(self._accept_loop)
        return self

    def stop(self) -> None:
        """Close the listener and every connection; join every thread."""
        self._stopping.set()
        with self._lock:
            sockets = list(self._sockets)
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
            self._listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes readers blocked in recv
            sock.close()
        while True:
            with self._lock:
                threads = [t for t in self._threads if t.is_alive()]
            if not threads:
                break
            for thread in threads:
                thread.join(JOIN_TIMEOUT_S)
                if thread.is_alive():
                    raise RuntimeError(f"relay thread {thread.name} did not end within {JOIN_TIMEOUT_S} s")

    def __enter__(self) -> DelayRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()  # the dialler sees its connection end and dials again
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._stopping.is_set():
                    client.close()
                    upstream.close()
                    return
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                chunks: queue.Queue = queue.Queue()
                self._spawn(self._read, source, chunks)
                self._spawn(self._write, sink, chunks)

    def _read(self, source: socket.socket, chunks: queue.Queue) -> None:
        while True:
            try:
                data = source.recv(CHUNK_BYTES)
            except OSError:
                data = b""
            chunks.put((time.monotonic() + self.latency_s, data))
            if not data:
                return

    def _write(self, sink: socket.socket, chunks: queue.Queue) -> None:
        free_at = 0.0  # when this direction of the link has sent the previous chunk
        while True:
            due, data = chunks.get()
            if data and self.bandwidth_bytes_per_s is not None:
                due = free_at = max(due, free_at) + len(data) / self.bandwidth_bytes_per_s
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(data)
            except OSError:
                return  # the other side is gone; its reader ends the other direction
            with self._lock:
                self.chunks += 1
                self.bytes += len(data)


@contextlib.contextmanager
def relay(
    listen: tuple[str, int], target: tuple[str, int], latency_s: float, bandwidth_bytes_per_s: float | None = None
) -> Iterator[DelayRelay]:
    """A started :class:`DelayRelay`, stopped on exit (on failure too)."""
    with DelayRelay(listen, target, latency_s, bandwidth_bytes_per_s) as running:
        yield running


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a delaying TCP relay (for the link-model check)")
    parser.add_argument("--listen", required=True, type=parse_address, metavar="HOST:PORT")
    parser.add_argument("--target", required=True, type=parse_address, metavar="HOST:PORT")
    parser.add_argument("--latency-s", required=True, type=float, help="one-way delay of every chunk (seconds)")
    parser.add_argument("--bandwidth-bytes-per-s", type=float, default=None, help="each direction's rate (bytes/s)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        running = DelayRelay(args.listen, args.target, args.latency_s, args.bandwidth_bytes_per_s).start()
    except (OSError, ValueError) as exc:
        print(f"_delay_relay: error: {exc}", file=sys.stderr)
        return 1
    try:
        host, port = running.address
        print(f"ready {host}:{port}", flush=True)
        stop.wait()
    finally:
        running.stop()
    print(f"forwarded {running.chunks} chunks, {running.bytes} bytes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

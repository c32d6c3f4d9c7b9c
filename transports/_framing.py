"""Length-prefixed framing over a trio byte stream.

Wire layout of one frame::

    +-------------------------------+------------------+
    | length: uint32, big-endian    | frame: length B  |
    +-------------------------------+------------------+

The length is checked against the receiver's maximum as soon as the 4-byte prefix is in, before
a single byte of the body is read, so a peer cannot make us buffer more than the maximum. A stream
that ends exactly between two frames ends cleanly (:class:`trio.EndOfChannel`); one that ends
inside a prefix or a body is broken (:class:`~fedproto.errors.TransportBroken`), since the bytes
already read cannot be resynchronised.

:func:`receive_frame` reads exactly what one frame needs (two or more ``receive_some`` calls per
frame). :class:`FrameReader` keeps a small buffer so a burst of small frames costs one
``receive_some`` for many frames; use it for a connection's whole lifetime, because the buffer
may hold the beginning of the next frame.

Routed frames
-------------
A stream shared by several logical links (the TCP star: one connection per client to the hub
carries the client's frames for every party, and the hub's frames from every party) marks a frame
that belongs to a party other than the stream's peer with an 8-byte route header::

    +-------------------------+------------------------+-----------------+------------------+
    | 0xFFFFFFFF: route marker| party index: uint32 BE | length: uint32  | frame: length B  |
    +-------------------------+------------------------+-----------------+------------------+

The party index is a position in the run's roster (the destination on the way to the relay, the
origin on the way from it). A frame without the header is the peer's own, exactly as above, so a
stream that carries only the peer's frames costs nothing extra; the price is that a plain frame
cannot be 2**32 - 1 bytes long (:data:`MAX_ROUTED_STREAM_FRAME_BYTES`).
:func:`send_routed_frame` writes one; :meth:`FrameReader.receive_routed_frame` reads either kind.

Link control
------------
The last two party indices, which no roster reaches, mark *control frames* of the link itself
rather than frames of a party (the TCP star uses them to make its links resumable, see
:mod:`fedproto.transports.tcp`): a route header naming :data:`ACK_INDEX` (``0xFFFFFFFF``) or
:data:`BYE_INDEX` (``0xFFFFFFFE``) followed by an 8-byte body, a count as uint64 big-endian::

    +-------------------------+------------------------+-----------------+-------------------+
    | 0xFFFFFFFF: route marker| ACK_INDEX or BYE_INDEX | length: 8       | count: uint64 BE  |
    +-------------------------+------------------------+-----------------+-------------------+

20 bytes in all (:data:`CONTROL_FRAME_BYTES`). :func:`send_control` writes one;
:meth:`FrameReader.receive_routed_frame` returns it as ``(index, body)`` like any routed frame and
:func:`control_count` reads the count back. What the counts mean is the link's business.
"""

from __future__ import annotations

import struct

import trio

from fedproto.errors import DecodeError, TransportBroken, TransportClosed

__all__ = [
    "ACK_INDEX",
    "BYE_INDEX",
    "CONTROL_BYTES",
    "CONTROL_FRAME_BYTES",
    "FRAMING_OVERHEAD_BYTES",
    "MAX_WIRE_FRAME_BYTES",
    "MAX_ROUTED_STREAM_FRAME_BYTES",
    "ROUTE_HEADER_BYTES",
    "ROUTE_MARKER",
    "FrameTooLarge",
    "FrameReader",
    "control_count",
    "send_control",
    "send_frame",
    "send_routed_frame",
    "receive_frame",
]

#: Bytes added to every frame on the wire (the length prefix).
FRAMING_OVERHEAD_BYTES = 4
#: Largest frame the 4-byte prefix can announce (bytes).
MAX_WIRE_FRAME_BYTES = 2**32 - 1
#: The length-prefix value that announces a route header instead of a frame.
ROUTE_MARKER = 2**32 - 1
#: Bytes of a route header (the marker and the party index), before the frame's own prefix.
ROUTE_HEADER_BYTES = 8
#: Largest frame on a stream that carries routed frames (the marker's value is taken).
MAX_ROUTED_STREAM_FRAME_BYTES = ROUTE_MARKER - 1

#: Route-header index of an acknowledgement (a control frame, see "Link control").
ACK_INDEX = 2**32 - 1
#: Route-header index of a goodbye (a control frame, see "Link control").
BYE_INDEX = 2**32 - 2
#: Body of a control frame: one count, uint64 big-endian.
CONTROL_BYTES = 8
#: Bytes of one control frame on the wire: route header, length prefix and count.
CONTROL_FRAME_BYTES = ROUTE_HEADER_BYTES + FRAMING_OVERHEAD_BYTES + CONTROL_BYTES

_PREFIX = struct.Struct(">I")
_ROUTE = struct.Struct(">III")  # marker, party index, frame length
_COUNT = struct.Struct(">Q")
# Up to this size the prefix and the frame go out in one send_all: one syscall (one TLS record
# more or less) instead of two, and the receiver is not woken for the prefix alone. The copy that
# joins them costs about 5 us per 64 KiB here, the separate prefix 100-200 us per 64 KiB round trip
# over TLS (benchmarks/tcp_rate.py, "tcp only"); above it the copy's memory is not worth it.
_COALESCE_BYTES = 1024 * 1024
# Size of one buffered read; large bodies are read in steps of up to _MAX_READ_BYTES.
_READ_CHUNK_BYTES = 64 * 1024
_MAX_READ_BYTES = 1024 * 1024


class FrameTooLarge(DecodeError):
    """A length prefix announced a frame longer than the receiver accepts.

    The body was not read; the stream cannot be resynchronised and should be closed.

    Attributes:
        length_bytes: the announced frame length.
        max_frame_bytes: the receiver's maximum.
    """

    def __init__(self, length_bytes: int, max_frame_bytes: int, **kwargs: object) -> None:
        self.length_bytes = length_bytes
        self.max_frame_bytes = max_frame_bytes
        super().__init__(
            f"announced frame of {length_bytes} bytes exceeds the maximum of {max_frame_bytes}",
            **kwargs,  # type: ignore[arg-type]
        )


async def send_frame(stream: trio.abc.SendStream, frame: bytes | bytearray | memoryview) -> None:
    """Write one length-prefixed frame to ``stream``.

    Args:
        stream: the stream to write to (the caller serialises writers: two concurrent calls on one
            stream would interleave bytes).
        frame: the frame's bytes (may be empty).

    Raises:
        ValueError: the frame is longer than :data:`MAX_WIRE_FRAME_BYTES`.
        TransportBroken: the stream failed (``__cause__`` is trio's error). The frame may have
            been partly written; the stream must then be closed.
        TransportClosed: the stream was closed by us.
    """
    length = len(frame)
    if length > MAX_WIRE_FRAME_BYTES:
        raise ValueError(f"frame of {length} bytes cannot be framed (maximum {MAX_WIRE_FRAME_BYTES})")
    await _write(stream, _PREFIX.pack(length), frame, "a frame")


async def send_routed_frame(
    stream: trio.abc.SendStream, party_index: int, frame: bytes | bytearray | memoryview
) -> None:
    """Write one frame behind a route header naming roster position ``party_index``.

    Args:
        stream: the stream to write to (writers serialised by the caller, as for
            :func:`send_frame`).
        party_index: the roster position the header names (0 to 2**32 - 1).
        frame: the frame's bytes (may be empty).

    Raises:
        ValueError: the frame is longer than :data:`MAX_ROUTED_STREAM_FRAME_BYTES`, or the index
            is out of range.
        TransportBroken: the stream failed (the frame may be partly written: close the stream).
        TransportClosed: the stream was closed by us.
    """
    length = len(frame)
    if length > MAX_ROUTED_STREAM_FRAME_BYTES:
        raise ValueError(f"frame of {length} bytes cannot be routed (maximum {MAX_ROUTED_STREAM_FRAME_BYTES})")
    if not 0 <= party_index < 2**32:
        raise ValueError(f"party index {party_index} does not fit a route header")
    await _write(stream, _ROUTE.pack(ROUTE_MARKER, party_index, length), frame, "a routed frame")


async def _write(
    stream: trio.abc.SendStream, header: bytes, frame: bytes | bytearray | memoryview, what: str
) -> None:
    """Write ``header`` and then ``frame``: in one write up to ``_COALESCE_BYTES`` of frame, else
    in two (no copy of a large frame).

    Raises:
        TransportBroken: the stream failed (``__cause__`` is trio's error); the message names
            ``what`` ("a frame") and its length.
        TransportClosed: the stream was closed by us.
    """
    length = len(frame)
    try:
        if length <= _COALESCE_BYTES:
            await stream.send_all(header + frame)
        else:
            await stream.send_all(header)
            await stream.send_all(frame)
    except trio.BrokenResourceError as exc:
        raise TransportBroken(f"stream broke while sending {what} of {length} bytes") from exc
    except trio.ClosedResourceError as exc:
        raise TransportClosed("stream was closed while sending a frame") from exc


async def send_control(stream: trio.abc.SendStream, index: int, count: int) -> None:
    """Write one control frame (see "Link control"): :data:`ACK_INDEX` or :data:`BYE_INDEX` and a count.

    Args:
        stream: the stream to write to (writers serialised by the caller, as for
            :func:`send_frame`).
        index: :data:`ACK_INDEX` or :data:`BYE_INDEX`.
        count: the count it carries, 0 to 2**64 - 1.

    Raises:
        ValueError: another index, or a count out of range.
        TransportBroken: the stream failed (the frame may be partly written: close the stream).
        TransportClosed: the stream was closed by us.
    """
    if index not in (ACK_INDEX, BYE_INDEX):
        raise ValueError(f"{index} is not a control index (ACK_INDEX or BYE_INDEX)")
    if not 0 <= count < 2**64:
        raise ValueError(f"count {count} does not fit a control frame")
    await send_routed_frame(stream, index, _COUNT.pack(count))


def control_count(body: bytes) -> int:
    """The count a control frame's body carries.

    Raises:
        DecodeError: the body is not 8 bytes.
    """
    if len(body) != CONTROL_BYTES:
        raise DecodeError(f"a control frame carries {CONTROL_BYTES} bytes, this one {len(body)}")
    return int(_COUNT.unpack(body)[0])


def _check_length(length: int, max_frame_bytes: int) -> None:
    if length > max_frame_bytes:
        raise FrameTooLarge(length, max_frame_bytes)


async def _receive_some(stream: trio.abc.ReceiveStream, max_bytes: int) -> bytes | bytearray:
    try:
        return await stream.receive_some(max_bytes)
    except trio.BrokenResourceError as exc:
        raise TransportBroken("stream broke while receiving a frame") from exc
    except trio.ClosedResourceError as exc:
        raise TransportClosed("stream was closed while receiving a frame") from exc


def _truncated(what: str, got: int, wanted: int) -> TransportBroken:
    return TransportBroken(f"stream ended inside a {what}: got {got} of {wanted} bytes")


async def receive_frame(stream: trio.abc.ReceiveStream, max_frame_bytes: int) -> bytes:
    """Read exactly one length-prefixed frame from ``stream`` (unbuffered).

    Reads never go past the end of the frame, so the stream can be handed to other code
    afterwards. For a long-lived connection prefer :class:`FrameReader`.

    Args:
        stream: the stream to read from.
        max_frame_bytes: longest frame accepted (bytes).

    Returns:
        The frame's bytes.

    Raises:
        trio.EndOfChannel: the stream ended cleanly before the first byte of a frame.
        FrameTooLarge: the prefix announced more than ``max_frame_bytes`` (the body is not read).
        TransportBroken: the stream failed or ended inside a frame.
        TransportClosed: the stream was closed by us.
    """
    prefix = await _read_exactly(stream, _PREFIX.size, "length prefix", at_boundary=True)
    (length,) = _PREFIX.unpack(prefix)
    _check_length(length, max_frame_bytes)
    if length == 0:
        return b""
    return await _read_exactly(stream, length, "frame body", at_boundary=False)


async def _read_exactly(
    stream: trio.abc.ReceiveStream, n: int, what: str, *, at_boundary: bool
) -> bytes:
    parts: list[bytes | bytearray] = []
    got = 0
    while got < n:
        chunk = await _receive_some(stream, min(n - got, _MAX_READ_BYTES))
        if not chunk:
            if at_boundary and got == 0:
                raise trio.EndOfChannel
            raise _truncated(what, got, n)
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class FrameReader:
    """Buffered reader of length-prefixed frames from one stream.

    Args:
        stream: the stream to read from; the reader owns its read side from now on.

    Example::

        reader = FrameReader(stream)
        while True:
            frame = await reader.receive_frame(max_frame_bytes=1 << 20)
    """

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self._start = 0  # bytes of _buffer already consumed (compacted lazily)

    @property
    def buffered_bytes(self) -> int:
        """Bytes read from the stream but not yet returned in a frame."""
        return len(self._buffer) - self._start

    async def _fill(self, n: int, what: str, *, at_boundary: bool) -> None:
        """Read until at least ``n`` unconsumed bytes are buffered."""
        while self.buffered_bytes < n:
            if self._start and self._start >= len(self._buffer) // 2:
                del self._buffer[: self._start]
                self._start = 0
            missing = n - self.buffered_bytes
            chunk = await _receive_some(
                self._stream, max(_READ_CHUNK_BYTES, min(missing, _MAX_READ_BYTES))
            )
            if not chunk:
                if at_boundary and self.buffered_bytes == 0:
                    raise trio.EndOfChannel
                raise _truncated(what, self.buffered_bytes, n)
            self._buffer += chunk

    def _take(self, n: int) -> bytes:
        data = bytes(self._buffer[self._start : self._start + n])
        self._start += n
        if self._start == len(self._buffer):
            self._buffer.clear()
            self._start = 0
        return data

    async def receive_frame(self, max_frame_bytes: int) -> bytes:
        """Read the next frame.

        Args:
            max_frame_bytes: longest frame accepted (bytes); may differ between calls (e.g. a
                small limit during a handshake).

        Returns:
            The frame's bytes.

        Raises:
            trio.EndOfChannel: the stream ended cleanly between two frames.
            FrameTooLarge: the prefix announced more than ``max_frame_bytes``; no further read is
                made for it (the reader is then unusable: close the stream).
            TransportBroken: the stream failed or ended inside a frame.
            TransportClosed: the stream was closed by us.
        """
        # (_fill is awaited only when the buffer is short: most small frames are in it already.)
        if len(self._buffer) - self._start < _PREFIX.size:
            await self._fill(_PREFIX.size, "length prefix", at_boundary=True)
        (length,) = _PREFIX.unpack_from(self._buffer, self._start)
        _check_length(length, max_frame_bytes)
        # The prefix stays in the buffer until the whole body is in: a cancelled call then leaves
        # the reader where it was, and the next call restarts this frame from its prefix.
        if len(self._buffer) - self._start < _PREFIX.size + length:
            await self._fill(_PREFIX.size + length, "frame", at_boundary=False)
        self._start += _PREFIX.size
        return self._take(length) if length else b""

    async def receive_routed_frame(self, max_frame_bytes: int) -> tuple[int | None, bytes]:
        """Read the next frame of a stream that carries routed frames (see the module docstring).

        Args:
            max_frame_bytes: longest frame accepted (bytes), routed or not.

        Returns:
            ``(party_index, frame)``: the roster position its route header names, or ``None``
            for a plain frame.

        Raises:
            trio.EndOfChannel: the stream ended cleanly between two frames.
            FrameTooLarge: a frame longer than ``max_frame_bytes`` was announced (the reader is
                then unusable: close the stream).
            TransportBroken: the stream failed or ended inside a header or frame.
            TransportClosed: the stream was closed by us.
        """
        await self._fill(_PREFIX.size, "length prefix", at_boundary=True)
        (length,) = _PREFIX.unpack_from(self._buffer, self._start)
        if length != ROUTE_MARKER:
            _check_length(length, max_frame_bytes)
            await self._fill(_PREFIX.size + length, "frame", at_boundary=False)
            self._start += _PREFIX.size
            return None, (self._take(length) if length else b"")
        # As in receive_frame, nothing is consumed until the whole routed frame is in.
        await self._fill(_ROUTE.size, "route header", at_boundary=False)
        _, party_index, length = _ROUTE.unpack_from(self._buffer, self._start)
        _check_length(length, max_frame_bytes)
        await self._fill(_ROUTE.size + length, "routed frame", at_boundary=False)
        self._start += _ROUTE.size
        return party_index, (self._take(length) if length else b"")

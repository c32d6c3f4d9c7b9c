"""The wire format: one msgpack map per frame, decoded with validation.

Frame layout (msgpack map with one-letter keys)::

    {"v": version, "t": tag, "s": session, "r": round_idx, "p": phase, "b": body}

``body`` is a msgpack array holding the message's fields in declaration order:

* arrays: ``[dtype, shape, raw]`` where ``dtype`` is numpy's code without the byte-order mark
  (``"u4"``, ``"f8"``, ...), ``shape`` a list of non-negative ints and ``raw`` the C-order
  little-endian bytes (``len(raw) == prod(shape) * itemsize`` is checked);
* big integers: ``[width, raw]``: ``len(raw) // width`` big-endian unsigned integers, each
  ``width`` bytes (msgpack's own ints stop at 64 bits);
* everything else: msgpack natives (tuples travel as arrays).

The envelope of a one-array message costs about 40 to 48 bytes beyond the array's raw bytes
(an ``.npy`` header alone is 128). Nothing is ever pickled.

Decoding is validation: anything msgpack rejects, an unknown version or tag, a missing or extra
field, a wrong type, dtype or number of dimensions, a byte length that does not match the shape,
or a message whose own ``__post_init__`` rejects the values raises :class:`DecodeError`. Frames
longer than ``max_frame_bytes`` are refused before they are parsed.

Decoding is total: whatever the bytes, :func:`decode_frame` returns a message or raises
:class:`DecodeError` naming the field; every msgpack, NumPy or Python exception on the way,
including whatever a message's ``__post_init__`` raises, becomes one. An array shape is bounded
before NumPy sees it: each dimension, and the product of the non-zero ones, is at most
``max_frame_bytes // itemsize`` (a zero-length dimension next to a dimension of ``2**63``
describes no data but is refused).

Decoding is bounded: a frame of ``B`` bytes is decoded in time linear in ``B``, and nothing is
built that the message class does not declare. A ``bytes`` frame of at most 16 KiB is first tried
in one pass that accepts only the canonical frame of a message whose fields are arrays, packed
big integers and plain scalars (or tuples of scalars), the common case, checked by the same
rules; msgpack's own limits (nothing longer than the frame) bound what that pass builds at about
100 bytes per frame byte, under 2 MiB, and whatever it does not accept goes to the paths below,
which decide (the small-frame path runs the same one-pass checks on what it unpacks first). A small frame (containers of at most 16 items, at
most 16 of them, strings of at most 32 bytes) is unpacked in one msgpack call whose limits cap
what it can build at ``B`` plus about 2 MiB. Any other frame is walked with msgpack's streaming
``Unpacker``: each object's type is read from its first byte before it is built, a container
where the field declares none is stepped over unbuilt, a container's length is bounded by the
bytes left, and what is built (strings, bytes, scalars, the tuples of plain fields) is charged
against a budget of ``2.5 B + 1 MiB``, long strings and bytes before they are built (a string at
5 bytes per UTF-8 byte, what CPython may hold while it builds one): with the
``Unpacker``'s own copy of the frame, at most ``3.5 B + 1 MiB`` in all. Plain fields are for
metadata; bulk data travels as arrays (views of their data bytes: one copy of the frame's) or as
big integers.
Big integers decode to the tuple of Python ``int`` their field declares, a pointer and an
``int`` object per value (28 to 44 bytes; none for 1-byte values, which are shared small ints),
that is 8 to 18 times their wire size for widths of 1 to 4 bytes, 5.5 times at 8 bytes and 2 to
4 times from 16 bytes up. Their width is checked against the field's declaration, and against the
width the message states when that field comes first, and their decoded size is held to the same
``2.5 B + 1 MiB`` from their count and width, before any integer is built: a frame of many narrow
integers is refused (the protocols' own syndrome frames, tens of thousands of wide field
elements, stay far inside it), and the run's frame limit, from each protocol's declared shapes,
bounds them further.

Encoding reuses one msgpack ``Packer`` per thread (``msgpack.packb`` allocates a fresh 256 KiB
buffer per call). It checks the same rules, so a malformed message fails in its sender (``TypeError`` naming
``TAG.field``) rather than in every receiver: a plain field must hold what its annotation says,
with the decoder's predicate (an ``int`` field refuses ``0.5``, ``True`` and ``numpy.int64``; a
``float`` field takes ints and floats, ``numpy.float64`` included since it is a ``float``).

The code: :mod:`fedproto._codec_encode` holds the constants, the field plans and the encoder;
:mod:`fedproto._codec_checks` the checks both decoding paths share; :mod:`fedproto._codec_fast`
the decoding that unpacks a frame in one msgpack call (the common frame, small frames); this
module the streaming path and :func:`decode_frame`, and it exports the public names of all.
"""

from __future__ import annotations

import sys
from typing import Any

import msgpack

from fedproto._codec_checks import _BYTES_BYTES, _CONTAINER_BYTES, _ENVELOPE_ERROR, _F_ARRAY, _F_BAD, _F_BIN
from fedproto._codec_checks import _F_EXT, _F_MAP, _F_STR, _FAMILY, _FAMILY_TYPES, _LENGTH_BYTES, _MAX_PLAIN_DEPTH
from fedproto._codec_checks import _PLAIN_ALLOWANCE_BYTES, _PLAIN_BYTES_PER_FRAME_BYTE, _POINTER_BYTES, _SCALARS
from fedproto._codec_checks import _STR_BYTES, _check_envelope, _decode_body, _Skipped
from fedproto._codec_encode import _ENVELOPE_KEYS, DEFAULT_MAX_FRAME_BYTES, WIRE_VERSION, Envelope
from fedproto._codec_encode import array_payload_bytes, encode_frame, has_tag
from fedproto._codec_fast import _FAST_FRAME_BYTES, _decode_fast, _decode_small
from fedproto.errors import DecodeError
from fedproto.messages import Message

__all__ = [
    "WIRE_VERSION",
    "DEFAULT_MAX_FRAME_BYTES",
    "Envelope",
    "encode_frame",
    "decode_frame",
    "array_payload_bytes",
    "has_tag",
]


# --- decoding: any frame, streamed --------------------------------------------------------------------


class _Reader:
    """A cursor over one frame: msgpack's streaming ``Unpacker`` plus a look at the next type byte.

    Nothing is built before its msgpack family (from its first byte) is known to be what the
    message class declares: a container found elsewhere is stepped over unbuilt (``skip``) and
    stands as a :class:`_Skipped`; containers are read through their headers, their lengths
    bounded by the bytes left (the ``Unpacker``'s limits let ``unpack`` build no container at
    all); what is built is charged to ``budget``. The ``Unpacker`` holds one copy of the bytes
    fed to it.
    """

    __slots__ = ("_view", "_base", "_end", "_unpacker", "budget", "where")

    def __init__(self, view: memoryview, budget: int) -> None:
        self._view = view
        self.budget = budget  # bytes that decoded values may still take
        self.where = "envelope"  # what is being decoded, for error messages
        self.restart(0, len(view))

    def restart(self, base: int, end: int) -> None:
        """Read the object at ``view[base:end]`` from now on."""
        size = max(end - base, 1)
        self._base = base
        self._end = end
        self._unpacker = msgpack.Unpacker(
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_buffer_size=size,
            max_str_len=size,
            max_bin_len=size,
            max_array_len=0,  # every container is read through its header: unpack() builds none
            max_map_len=0,
            max_ext_len=0,
        )
        self._unpacker.feed(self._view[base:end])

    def tell(self) -> int:
        """Offset of the next object in the frame."""
        return self._base + self._unpacker.tell()

    def peek(self) -> int:
        """The msgpack family of the next object."""
        pos = self._base + self._unpacker.tell()
        if pos >= self._end:
            raise DecodeError(f"{self.where}: frame is truncated")
        return _FAMILY[self._view[pos]]

    def charge(self, nbytes: int) -> None:
        """Count ``nbytes`` of decoded values against the frame's budget."""
        self.budget -= nbytes
        if self.budget < 0:
            raise DecodeError(
                f"{self.where}: decoded values would take more than {_PLAIN_BYTES_PER_FRAME_BYTE} bytes per "
                f"frame byte plus {_PLAIN_ALLOWANCE_BYTES} (send bulk data as arrays or big integers)"
            )

    def scalar(self) -> Any:
        """The next object if it is a scalar, else a :class:`_Skipped` (it is stepped over unbuilt).

        What it builds is charged to the budget: a string or bytes object of more than 255 bytes
        before it is built, any other scalar after. A string may take 5 bytes per UTF-8 byte while
        it is built (CPython decodes into 1-byte characters and widens the buffer to 4-byte ones
        when it meets one) and 4 afterwards.
        """
        pos = self._base + self._unpacker.tell()
        if pos >= self._end:
            raise DecodeError(f"{self.where}: frame is truncated")
        first = self._view[pos]
        family = _FAMILY[first]
        if family not in _SCALARS:
            self._unpacker.skip()
            return _Skipped(family)
        size = _LENGTH_BYTES.get(first)
        if size is None:
            value = self._unpacker.unpack()
            self.charge(_scalar_bytes(value))
            return value
        n = int.from_bytes(self._view[pos + 1 : pos + 1 + size], "big")
        estimate = _STR_BYTES + 5 * n if family == _F_STR else _BYTES_BYTES + n
        self.charge(estimate)
        value = self._unpacker.unpack()
        self.budget += estimate - sys.getsizeof(value)
        return value

    def _scalars(self, n: int) -> tuple[Any, ...]:
        """``n`` scalars (a tuple), as :meth:`scalar` reads them, unrolled for speed."""
        unpacker, view, base, end, family_of = self._unpacker, self._view, self._base, self._end, _FAMILY
        items: list[Any] = [None] * n
        for i in range(n):
            pos = base + unpacker.tell()
            if pos >= end:
                raise DecodeError(f"{self.where}: frame is truncated")
            first = view[pos]
            if family_of[first] not in _SCALARS or first in _LENGTH_BYTES:
                items[i] = self.scalar()  # a container to skip, or a string or bytes to charge first
                continue
            value = items[i] = unpacker.unpack()
            if not (value is None or value is True or value is False or (type(value) is int and -5 <= value <= 256)):
                self.budget -= sys.getsizeof(value)
                if self.budget < 0:
                    self.charge(0)
        return tuple(items)

    def array_header(self, what: str) -> int:
        """The length of the next object, which must be an array (else refuse the frame)."""
        if self.peek() != _F_ARRAY:
            raise DecodeError(f"{self.where}: {what}")
        n = self._unpacker.read_array_header()
        if n > self._end - self.tell():  # every item takes at least one byte
            raise DecodeError(f"{self.where}: an array of {n} items in {self._end - self.tell()} bytes")
        return n

    def map_header(self, what: str) -> int:
        """The number of pairs of the next object, which must be a map (else refuse the frame)."""
        if self.peek() != _F_MAP:
            raise DecodeError(f"{self.where}: {what}")
        n = self._unpacker.read_map_header()
        if 2 * n > self._end - self.tell():  # every key and value takes at least one byte
            raise DecodeError(f"{self.where}: a map of {n} pairs in {self._end - self.tell()} bytes")
        return n

    def skip(self) -> None:
        """Step over the next object without building it."""
        self._unpacker.skip()

    # The body source interface shared with _ListBody.

    def open_body(self, n_fields: int) -> None:
        if self.array_header(f"body must hold exactly {n_fields} fields") != n_fields:
            raise DecodeError(f"{self.where}: body must hold exactly {n_fields} fields")

    def array_parts(self, ndim: int) -> tuple[Any, Any, Any]:
        if self.array_header("an array must be [dtype, shape, bytes]") != 3:
            raise DecodeError(f"{self.where}: an array must be [dtype, shape, bytes]")
        code = self.scalar()
        if self.peek() != _F_ARRAY:
            return code, self.scalar(), self.scalar()
        n = self.array_header("")
        self.charge(_CONTAINER_BYTES + 2 * _POINTER_BYTES * n)  # a list grows by up to an eighth
        shape = [self.scalar() for _ in range(n)]
        return code, shape, self.scalar()

    def bigint_parts(self) -> tuple[Any, Any]:
        if self.array_header("big integers must be [width, bytes]") != 2:
            raise DecodeError(f"{self.where}: big integers must be [width, bytes]")
        return self.scalar(), self.scalar()

    def plain(self, shape: tuple[Any, ...], depth: int = 0) -> Any:
        """One value of a plain field of ``shape``; a container it does not declare is skipped."""
        kind = shape[0]
        if kind == "scalar":
            return self.scalar()
        family = self.peek()
        if kind == "seq":
            if family != _F_ARRAY:
                return self.scalar()
            n = self.array_header("")
            self.charge(_CONTAINER_BYTES + 2 * _POINTER_BYTES * n)  # a list of the items, then their tuple
            item = shape[1]
            if item[0] != "scalar":
                return tuple(self.plain(item, depth + 1) for _ in range(n))
            items = self._scalars(n)
            self.budget += _POINTER_BYTES * n  # the list is gone
            return items
        if kind == "union":
            options = [option for option in shape[1] if _admits(option, family)]
            if len(options) == 1:
                return self.plain(options[0], depth)
        return self._any(depth)

    def _any(self, depth: int) -> Any:
        """A value whose annotation the codec does not know: msgpack natives of bounded depth, each
        charged to the budget (arrays become lists, maps dicts with string or bytes keys)."""
        family = self.peek()
        if family in _SCALARS:
            return self.scalar()
        if family not in (_F_ARRAY, _F_MAP):
            raise DecodeError(f"{self.where}: {_FAMILY_TYPES[family]} is not part of the wire format")
        if depth >= _MAX_PLAIN_DEPTH:
            raise DecodeError(f"{self.where}: nested deeper than {_MAX_PLAIN_DEPTH} levels")
        if family == _F_ARRAY:
            n = self.array_header("")
            self.charge(_CONTAINER_BYTES + 2 * _POINTER_BYTES * n)  # a list grows by up to an eighth
            return [self._any(depth + 1) for _ in range(n)]
        n = self.map_header("")
        self.charge(_CONTAINER_BYTES + 4 * _POINTER_BYTES * n)
        result = {}
        for _ in range(n):
            if self.peek() not in (_F_STR, _F_BIN):
                raise DecodeError(f"{self.where}: map keys must be strings or bytes")
            key = self.scalar()
            result[key] = self._any(depth + 1)
        return result


def _admits(shape: tuple[Any, ...], family: int) -> bool:
    kind = shape[0]
    if kind == "scalar":
        return family in shape[1]
    if kind == "seq":
        return family == _F_ARRAY
    if kind == "union":
        return any(_admits(option, family) for option in shape[1])
    return family not in (_F_EXT, _F_BAD)


def _scalar_bytes(value: Any) -> int:
    """Bytes a decoded scalar takes (0 for the interpreter's shared small ints and singletons)."""
    if value is None or value is True or value is False or (type(value) is int and -5 <= value <= 256):
        return 0
    return sys.getsizeof(value)


def _decode_streaming(view: memoryview, max_frame_bytes: int) -> tuple[Envelope, Message]:
    reader = _Reader(view, int(_PLAIN_BYTES_PER_FRAME_BYTE * len(view)) + _PLAIN_ALLOWANCE_BYTES)
    try:
        if reader.map_header(_ENVELOPE_ERROR) != len(_ENVELOPE_KEYS):
            raise DecodeError(_ENVELOPE_ERROR)
        fields: dict[str, Any] = {}
        cls: type | None = None
        body_span: tuple[int, int] | None = None
        message: Message | None = None
        for _ in range(len(_ENVELOPE_KEYS)):
            reader.where = "envelope"
            key = reader.scalar()
            if key not in _ENVELOPE_KEYS or key in fields:
                raise DecodeError(_ENVELOPE_ERROR)
            if key != "b":
                fields[key] = reader.scalar()
                continue
            fields["b"] = None
            if len(fields) == len(_ENVELOPE_KEYS):  # v, t, s, r, p came first: decode the body in place
                cls = _check_envelope(*(fields[k] for k in "vtsrp"))
                message = _decode_body(reader, cls, fields["t"], max_frame_bytes, len(view))
            else:  # step over the body now, decode it once the envelope is known
                start = reader.tell()
                reader.skip()
                body_span = (start, reader.tell())
        reader.where = "envelope"
        if reader.tell() != len(view):
            raise DecodeError(f"{len(view) - reader.tell()} bytes of trailing data after the envelope")
        if cls is None:
            cls = _check_envelope(*(fields[k] for k in "vtsrp"))
        if body_span is not None:
            reader.restart(*body_span)
            message = _decode_body(reader, cls, fields["t"], max_frame_bytes, len(view))
        assert message is not None
        return Envelope(*(fields[k] for k in "vtsrp")), message
    except DecodeError:
        raise
    except msgpack.OutOfData as exc:
        raise DecodeError(f"{reader.where}: frame is truncated") from exc
    except Exception as exc:  # msgpack's own refusals (invalid bytes, bad UTF-8, nesting), and the like
        raise DecodeError(f"{reader.where}: not a valid frame: {type(exc).__name__}: {exc}") from exc


def decode_frame(frame: bytes, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> tuple[Envelope, Message]:
    """Decode and validate one frame.

    Decoding is total and bounded: whatever ``frame`` holds, the result is a message or
    :class:`DecodeError`, in time linear in ``len(frame)`` and with memory bounded by a small
    multiple of it (the module docstring gives the figures). Each object's type is checked
    against the message class's declared fields before a container is built, array shapes are
    bounded before NumPy sees them, and every exception of the decode path becomes a
    :class:`DecodeError`.

    Args:
        frame: the bytes of one frame.
        max_frame_bytes: frames longer than this are refused before parsing; so is an array
            dimension, or product of non-zero dimensions, beyond ``max_frame_bytes // itemsize``
            elements (even next to a zero-length dimension).

    Returns:
        ``(envelope, message)``.

    Raises:
        DecodeError: the frame is oversized, not msgpack, truncated or followed by extra bytes,
            has a bad envelope, an unknown version or tag, a body that does not match the
            message's fields, values the message's own validation refuses (whatever exception
            it raises), or plain values beyond the budget; the message names the field.
    """
    if type(frame) is bytes and len(frame) <= min(_FAST_FRAME_BYTES, max_frame_bytes):
        decoded = _decode_fast(frame, max_frame_bytes)
        if decoded is not None:
            return decoded
    if not isinstance(frame, bytes | bytearray | memoryview):
        raise DecodeError(f"a frame must be bytes, got {type(frame).__name__}")
    try:
        view = memoryview(frame).cast("B")
    except TypeError as exc:
        raise DecodeError(f"a frame must be contiguous bytes: {exc}") from exc
    if len(view) > max_frame_bytes:
        raise DecodeError(f"frame of {len(view)} bytes exceeds the maximum of {max_frame_bytes}")
    decoded = _decode_small(view, max_frame_bytes)
    return decoded if decoded is not None else _decode_streaming(view, max_frame_bytes)

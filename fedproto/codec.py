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
"""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
import types
import typing
from typing import Any

import msgpack
import numpy as np

from fedproto.errors import DecodeError
from fedproto.messages import WIRE_DTYPES, Message, message_class

__all__ = [
    "WIRE_VERSION",
    "DEFAULT_MAX_FRAME_BYTES",
    "Envelope",
    "encode_frame",
    "decode_frame",
    "array_payload_bytes",
    "has_tag",
]

#: Version of the frame layout; a frame with another version is refused.
WIRE_VERSION = 1
#: Default largest frame accepted (bytes).
DEFAULT_MAX_FRAME_BYTES = 256 * 1024 * 1024

_ENVELOPE_KEYS = frozenset("vtsrpb")
_DTYPE_CODES = {dt.str.lstrip("<|"): dt.newbyteorder("<") if dt.byteorder not in "|" else dt for dt in WIRE_DTYPES}
_CODE_OF = {dt: code for code, dt in _DTYPE_CODES.items()}
_U64 = 2**64


@dataclasses.dataclass(frozen=True, slots=True)
class Envelope:
    """The envelope of one frame.

    Attributes:
        version: wire version (:data:`WIRE_VERSION`).
        tag: the message's ``TAG``.
        session: the run's session id (an int in ``[0, 2**64)``).
        round_idx: 0-based round the message belongs to.
        phase: the protocol phase that produced the message.
    """

    version: int
    tag: str
    session: int
    round_idx: int
    phase: str


# --- per-class field plans -------------------------------------------------------------------------

_ARRAY, _BIGINTS, _PLAIN = 0, 1, 2


@dataclasses.dataclass(frozen=True, slots=True)
class _FieldPlan:
    name: str
    kind: int
    dtypes: frozenset[np.dtype] = frozenset()
    ndim: int | None = None
    width: int | None = None
    width_from: str | None = None  # big integers: the plain int field that states their width
    packed: bool = False  # big integers kept as a uint8 [count, width] array (the wire form)
    check: Any = None  # for plain fields: a callable returning True when the value is acceptable
    expected: str = ""  # for plain fields: the annotation, for error messages
    codes: Any = None  # for arrays: {dtype: wire code} of the allowed little-endian dtypes


_PLANS: dict[type, tuple[_FieldPlan, ...]] = {}


def _plain_checker(annotation: Any) -> Any:
    """A predicate for a plain field's decoded value, from its annotation (lenient for unknowns)."""
    if annotation is bool:
        return lambda v: isinstance(v, bool)
    if annotation is int:
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    if annotation is float:
        return lambda v: isinstance(v, float | int) and not isinstance(v, bool)
    if annotation is str:
        return lambda v: isinstance(v, str)
    if annotation is bytes:
        return lambda v: isinstance(v, bytes)
    origin = typing.get_origin(annotation)
    if origin is tuple:
        args = typing.get_args(annotation)
        inner = _plain_checker(args[0]) if args else (lambda v: True)
        return lambda v: isinstance(v, list | tuple) and all(inner(x) for x in v)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        checks = [_plain_checker(a) for a in typing.get_args(annotation)]
        return lambda v: any(c(v) for c in checks)
    if annotation is type(None):
        return lambda v: v is None
    return lambda v: True


def _annotation_name(annotation: Any) -> str:
    return annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")


def _plan(cls: type) -> tuple[_FieldPlan, ...]:
    plan = _PLANS.get(cls)
    if plan is not None:
        return plan
    hints = typing.get_type_hints(cls)
    items = []
    for f in dataclasses.fields(cls):
        kind = f.metadata.get("kind")
        if kind == "array":
            dtypes = f.metadata["dtypes"]
            codes = {dt: _CODE_OF[dt] for dt in dtypes if dt in _CODE_OF}
            items.append(_FieldPlan(f.name, _ARRAY, dtypes=dtypes, ndim=f.metadata["ndim"], codes=codes))
        elif kind == "bigints":
            items.append(
                _FieldPlan(
                    f.name, _BIGINTS, width=f.metadata["width"], width_from=f.metadata.get("width_from"),
                    packed=f.metadata.get("packed", False),
                )
            )
        else:
            annotation = hints.get(f.name, Any)
            items.append(
                _FieldPlan(f.name, _PLAIN, check=_plain_checker(annotation), expected=_annotation_name(annotation))
            )
    plan = tuple(items)
    _PLANS[cls] = plan
    return plan


# --- encoding --------------------------------------------------------------------------------------


def _encode_array(value: Any, spec: _FieldPlan, tag: str) -> list[Any]:
    arr = np.asarray(value)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    if arr.dtype not in spec.dtypes:
        raise TypeError(f"{tag}.{spec.name}: dtype {arr.dtype} is not one of {_names(spec.dtypes)}")
    if arr.ndim != spec.ndim:
        raise TypeError(f"{tag}.{spec.name}: expected {spec.ndim} dimensions, got {arr.ndim}")
    return [_CODE_OF[arr.dtype], list(arr.shape), arr.tobytes()]


def _names(dtypes: frozenset[np.dtype]) -> str:
    return ", ".join(sorted(str(dt) for dt in dtypes))


def _encode_bigints(values: Any, spec: _FieldPlan, tag: str, message: Any = None) -> list[Any]:
    stated = getattr(message, spec.width_from) if spec.width_from and message is not None else None
    if spec.packed:
        return _encode_packed(values, spec, tag, stated)
    ints = [int(v) for v in values]
    if any(v < 0 for v in ints):
        raise ValueError(f"{tag}.{spec.name}: big integers must be non-negative")
    needed = max((max(ints).bit_length() + 7) // 8 if ints else 1, 1)
    width = spec.width or stated or needed
    if needed > width:
        raise ValueError(f"{tag}.{spec.name}: a value needs {needed} bytes, the field allows {width}")
    return [width, b"".join(v.to_bytes(width, "big") for v in ints)]


def _encode_packed(values: Any, spec: _FieldPlan, tag: str, stated: Any) -> list[Any]:
    if not (isinstance(values, np.ndarray) and values.dtype == np.uint8 and values.ndim == 2):
        raise TypeError(f"{tag}.{spec.name}: a packed big-integer field takes a uint8 [count, width] array")
    width = values.shape[1]
    expected = spec.width or stated
    if width < 1 or (expected is not None and width != expected):
        raise ValueError(f"{tag}.{spec.name}: rows of {width} bytes, the field takes {expected or 'at least 1'}")
    return [width, values.tobytes()]


def encode_frame(message: Message, *, session: int, round_idx: int, phase: str) -> bytes:
    """Encode ``message`` with its envelope into one frame.

    Args:
        message: a registered message instance.
        session: the run's session id, ``0 <= session < 2**64``.
        round_idx: the 0-based round the message belongs to.
        phase: the phase that produced it.

    Returns:
        The frame (``bytes``).

    Raises:
        TypeError: a plain field's value does not match its annotation (the check decoding
            applies), an array field has the wrong dtype or number of dimensions, or the message
            is not a registered message; the message names ``TAG.field``.
        ValueError: a big integer is negative or wider than its field (or a packed field's rows
            are not of its width), or an integer in a plain field (or the session or round)
            lies outside ``-2**63 .. 2**64 - 1``, what msgpack carries (the message names the
            class, the field and the limit).
    """
    cls = type(message)
    tag = getattr(cls, "TAG", None)
    if tag is None or message_class(tag) is not cls:
        raise TypeError(f"{cls.__name__} is not a registered message")
    body = []
    for spec in _PLANS[cls] if cls in _PLANS else _plan(cls):
        value = getattr(message, spec.name)
        if spec.kind == _ARRAY:
            # The usual case inline: an ndarray of an allowed little-endian dtype and its ndim.
            code = spec.codes.get(value.dtype) if type(value) is np.ndarray and value.ndim == spec.ndim else None
            body.append(_encode_array(value, spec, tag) if code is None else [code, list(value.shape), value.tobytes()])
        elif spec.kind == _BIGINTS:
            body.append(_encode_bigints(value, spec, tag, message))
        else:
            if not spec.check(value):
                raise TypeError(
                    f"{tag}.{spec.name}: {_short_repr(value)} of type {type(value).__name__} is not a valid "
                    f"{spec.expected}"
                )
            body.append(value)
    frame = {"v": WIRE_VERSION, "t": tag, "s": session, "r": round_idx, "p": phase, "b": body}
    try:
        packer = _PACKERS.packer
    except AttributeError:
        packer = _PACKERS.packer = msgpack.Packer(use_bin_type=True)
    try:
        encoded = packer.pack(frame)
    except OverflowError:
        _PACKERS.packer = msgpack.Packer(use_bin_type=True)  # not one left mid-frame
        raise _overflow_error(cls, tag, body, session=session, round_idx=round_idx) from None
    if len(encoded) > _PACKER_KEPT_BYTES:
        _PACKERS.packer = msgpack.Packer(use_bin_type=True)  # let the buffer grown for this frame go
    return encoded


def has_tag(frame: bytes, tag: str) -> bool:
    """Whether ``frame`` is, by its first bytes, an :func:`encode_frame` frame of the message ``tag``.

    A look at the envelope's prefix (the map header, ``"v"``, the version, ``"t"`` and the tag,
    in the order :func:`encode_frame` writes them), without decoding: for a transport that treats
    some messages apart (a relay that forwards failure notices first). It proves nothing about
    the rest of the frame, which is still decoded, and refused if malformed, by its receiver.
    """
    prefix = _TAG_PREFIXES.get(tag)
    if prefix is None:
        envelope = msgpack.packb("v") + msgpack.packb(WIRE_VERSION) + msgpack.packb("t") + msgpack.packb(tag)
        prefix = _TAG_PREFIXES[tag] = b"\x86" + envelope  # a map of the six envelope keys
    return frame[: len(prefix)] == prefix


_TAG_PREFIXES: dict[str, bytes] = {}


#: One msgpack ``Packer`` per thread, reused: ``msgpack.packb`` makes a new one per call, which
#: allocates (and frees) a 256 KiB buffer each time, most of the cost of a small frame. A packer
#: keeps its buffer as large as the largest frame it packed, so it is replaced after a frame of
#: more than this many bytes.
_PACKER_KEPT_BYTES = 1 << 20
_PACKERS = threading.local()


#: The integers msgpack can carry natively (a plain ``int`` field's range): int64 and uint64.
PLAIN_INT_MIN, PLAIN_INT_MAX = -(2**63), 2**64 - 1


def _wide_int(value: Any) -> int | None:
    """The first integer in ``value`` (nested in lists, tuples and dicts) msgpack cannot carry."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if not PLAIN_INT_MIN <= value <= PLAIN_INT_MAX else None
    if isinstance(value, list | tuple):
        items: Any = value
    elif isinstance(value, dict):
        items = (*value.keys(), *value.values())
    else:
        return None
    for item in items:
        wide = _wide_int(item)
        if wide is not None:
            return wide
    return None


def _overflow_error(cls: type, tag: str, body: list[Any], **envelope: Any) -> ValueError:
    """The error for a frame msgpack refused with ``OverflowError``: which field, which limit."""
    names = [spec.name for spec in _PLANS[cls]]
    limit = "from -2**63 to 2**64 - 1, what msgpack carries"
    for where, value in (*zip(names, body), *envelope.items()):
        wide = _wide_int(value)
        if wide is None:
            continue
        shown = f"2**{wide.bit_length() - 1}" if wide > 0 and wide & (wide - 1) == 0 else _short_repr(wide)
        if where in envelope:
            return ValueError(f"{cls.__name__} ({tag}): the frame's {where} {shown} is out of range ({limit})")
        return ValueError(
            f"{cls.__name__}.{where} ({tag}): the integer {shown} does not fit a plain int field ({limit}); "
            f"declare integers wider than 64 bits with bigints_field"
        )
    return ValueError(f"{cls.__name__} ({tag}): an integer is out of range ({limit})")


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --- decoding --------------------------------------------------------------------------------------
#
# Two readers feed one set of checks. Small frames (every container short, few of them, short
# strings) are unpacked in one msgpack call whose limits bound what it can build; any other frame
# is walked with msgpack's streaming Unpacker, which looks at each object's first byte and builds
# only what the message class declares (containers elsewhere are skipped unbuilt), charging what
# it builds to a budget. Both hand the same parts to the same checks (_make_array, _make_bigints,
# _make_plain, _check_envelope, _build), so the two paths accept and refuse the same frames.

# msgpack type families, read from the first byte of an object (msgpack spec, "Formats").
_F_INT, _F_FLOAT, _F_BOOL, _F_NIL, _F_STR, _F_BIN, _F_ARRAY, _F_MAP, _F_EXT, _F_BAD = range(10)
# The Python type each family decodes to, for error messages.
_FAMILY_TYPES = ("int", "float", "bool", "NoneType", "str", "bytes", "list", "dict", "ExtType", "invalid byte")
_FAMILY_SPANS = (
    (0x00, 0x7F, _F_INT), (0x80, 0x8F, _F_MAP), (0x90, 0x9F, _F_ARRAY), (0xA0, 0xBF, _F_STR),
    (0xC0, 0xC0, _F_NIL), (0xC1, 0xC1, _F_BAD), (0xC2, 0xC3, _F_BOOL), (0xC4, 0xC6, _F_BIN),
    (0xC7, 0xC9, _F_EXT), (0xCA, 0xCB, _F_FLOAT), (0xCC, 0xD3, _F_INT), (0xD4, 0xD8, _F_EXT),
    (0xD9, 0xDB, _F_STR), (0xDC, 0xDD, _F_ARRAY), (0xDE, 0xDF, _F_MAP), (0xE0, 0xFF, _F_INT),
)  # fmt: skip
_FAMILY = bytes(family for first, last, family in _FAMILY_SPANS for _ in range(first, last + 1))
_SCALARS = frozenset({_F_INT, _F_FLOAT, _F_BOOL, _F_NIL, _F_STR, _F_BIN})

# The small-frame path: msgpack builds at most _SMALL_LISTS finished lists (plus the at most 1024
# unfinished ones its stack holds), none longer than _SMALL_ITEMS, no string longer than
# _SMALL_STR bytes and at most _SMALL_MAPS maps: under 2 MiB at worst beyond the frame's bytes.
_SMALL_ITEMS = 16
_SMALL_LISTS = 16
_SMALL_MAPS = 2
_SMALL_STR = 32

# The streaming path: what it builds (every scalar, string and bytes object, and the tuples of
# plain fields) may take this many bytes per frame byte plus this allowance; a frame whose values
# would take more is refused. The integers of a big-integer field are held to the same bound, on
# either path, from their count and width before any is built.
_PLAIN_BYTES_PER_FRAME_BYTE = 2.5
_PLAIN_ALLOWANCE_BYTES = 1 << 20
_MAX_PLAIN_DEPTH = 32  # nesting of a plain field whose annotation the codec does not know
_POINTER_BYTES = 8
_CONTAINER_BYTES = 64  # a tuple, list or dict header, rounded up
_STR_BYTES = 80  # a str header, rounded up
_BYTES_BYTES = 33  # a bytes header
# Length bytes after the first byte of bin16/32 and str16/32 (msgpack spec): the bytes and strings
# that may be long enough to charge before they are built (bin8 and str8 hold at most 255 bytes).
_LENGTH_BYTES = {0xC5: 2, 0xC6: 4, 0xDA: 2, 0xDB: 4}
_ENVELOPE_ERROR = "frame is not an envelope map with keys v, t, s, r, p, b"


class _NotSmall(Exception):
    """The small-frame path gives up on a frame; the streaming path decides."""


class _Skipped:
    """Stands for a value the streaming reader stepped over without building it (a container
    where a scalar belongs, or an extension); every check refuses it."""

    __slots__ = ("type_name",)

    def __init__(self, family: int) -> None:
        self.type_name = _FAMILY_TYPES[family]

    def __repr__(self) -> str:
        return f"<{self.type_name}>"


def _type_name(value: Any) -> str:
    return value.type_name if isinstance(value, _Skipped) else type(value).__name__


def _brief(value: Any) -> str:
    """A short repr of a decoded value for error messages (a long string is cut before its repr)."""
    if isinstance(value, str | bytes) and len(value) > 40:
        return repr(value[:37]) + "..."
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --- decoding: the checks both paths share -----------------------------------------------------------


def _check_envelope(version: Any, tag: Any, session: Any, round_idx: Any, phase: Any) -> type:
    """Validate the envelope's values; the message class of ``tag``."""
    if type(version) is not int or version != WIRE_VERSION:
        raise DecodeError(f"unsupported wire version {_brief(version)} (this side speaks {WIRE_VERSION})")
    if not isinstance(tag, str):
        raise DecodeError("tag must be a string")
    cls = message_class(tag)
    if cls is None:
        raise DecodeError(f"unknown message tag {_brief(tag)}")
    for name, value in (("session", session), ("round_idx", round_idx)):
        if type(value) is not int or value < 0:
            raise DecodeError(f"{tag}: envelope {name} must be a non-negative integer, got {_brief(value)}")
    if not isinstance(phase, str):
        raise DecodeError(f"{tag}: envelope phase must be a string")
    return cls


def _make_array(spec: _FieldPlan, where: str, code: Any, shape: Any, data: Any, max_bytes: int) -> np.ndarray:
    """An array field from its parts; the shape is bounded before NumPy sees it.

    Every dimension, and the product of the non-zero ones, must be at most ``max_bytes // itemsize``
    elements, ``max_bytes`` being the receiver's frame limit: a zero-length dimension next to a huge
    one describes no data, so the byte-length check alone would let it through to NumPy.
    """
    dtype = _DTYPE_CODES.get(code) if isinstance(code, str) else None
    if dtype is None:
        raise DecodeError(f"{where}: unknown dtype code {_brief(code)}")
    if dtype not in spec.dtypes:
        raise DecodeError(f"{where}: dtype {dtype} is not one of {_names(spec.dtypes)}")
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
        raise DecodeError(f"{where}: shape must be a list of non-negative integers")
    if len(shape) != spec.ndim:
        raise DecodeError(f"{where}: expected {spec.ndim} dimensions, got {len(shape)}")
    limit = max_bytes // dtype.itemsize
    elements = 1
    for size in shape:
        if size > limit:
            raise DecodeError(f"{where}: dimension {size} of shape {tuple(shape)} exceeds {limit} elements")
        elements *= size or 1
        if elements > limit:
            raise DecodeError(f"{where}: shape {tuple(shape)} describes more than {limit} elements")
    if not isinstance(data, bytes):
        raise DecodeError(f"{where}: array data must be bytes")
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise DecodeError(
            f"{where}: {len(data)} data bytes do not match shape {tuple(shape)} of {dtype} ({expected} bytes)"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _bigints_decoded_bytes(count: int, width: int) -> int:
    """Memory ``count`` decoded integers of ``width`` bytes take: a tuple pointer each, an ``int``
    object each (none for 1-byte values: shared small ints), and a native 8-byte scratch copy
    for widths 3 to 7."""
    int_bytes = 0 if width == 1 else sys.getsizeof(256**width - 1)
    scratch = 8 if 2 < width < 8 else 0
    return count * (_POINTER_BYTES + int_bytes + scratch)


def _make_bigints(
    spec: _FieldPlan, where: str, width: Any, data: Any, stated: Any, frame_bytes: int
) -> tuple[int, ...] | np.ndarray:
    """A big-integer field from its parts. The width is checked against the field's declaration,
    and against the width the message states when that field came first, and what the integers
    would take decoded is held to the frame's budget (``2.5 * frame_bytes + 1 MiB``), before any
    integer is built."""
    if type(width) is not int or width <= 0:
        raise DecodeError(f"{where}: width must be a positive integer")
    if spec.width is not None and width != spec.width:
        raise DecodeError(f"{where}: expected width {spec.width}, got {width}")
    if stated is not None and width != stated:
        raise DecodeError(f"{where}: big integers travel with width {width}, the message states {_brief(stated)}")
    if not isinstance(data, bytes) or len(data) % width:
        raise DecodeError(f"{where}: data length is not a multiple of width {width}")
    if spec.packed:  # a read-only view of the frame's bytes: no integer is built
        return np.frombuffer(data, dtype=np.uint8).reshape(-1, width)
    decoded = _bigints_decoded_bytes(len(data) // width, width)
    if decoded > _PLAIN_BYTES_PER_FRAME_BYTE * frame_bytes + _PLAIN_ALLOWANCE_BYTES:
        raise DecodeError(
            f"{where}: {len(data) // width:,} integers of {width} bytes would take {decoded:,} bytes decoded, "
            f"more than {_PLAIN_BYTES_PER_FRAME_BYTE:g} times the {frame_bytes:,}-byte frame"
        )
    return _uints_from_bytes(data, width)


def _uints_from_bytes(data: bytes, width: int) -> tuple[int, ...]:
    """Split ``data`` into big-endian unsigned integers of ``width`` bytes (no list in between)."""
    if width == 1:
        return tuple(data)
    if width in (2, 4, 8):
        return tuple(memoryview(np.frombuffer(data, dtype=f">u{width}").astype(f"=u{width}")))
    if width < 8:  # widen each element to a native 8-byte integer
        native = np.zeros(len(data) // width, dtype=np.uint64)
        limbs = native.view(np.uint8).reshape(-1, 8)
        digits = np.frombuffer(data, dtype=np.uint8).reshape(-1, width)
        if sys.byteorder == "little":
            limbs[:, :width] = digits[:, ::-1]
        else:
            limbs[:, 8 - width :] = digits
        return tuple(memoryview(native))
    return tuple(int.from_bytes(data[i : i + width], "big") for i in range(0, len(data), width))


def _make_plain(spec: _FieldPlan, shape: tuple[Any, ...], where: str, value: Any) -> Any:
    """A plain field's value, checked against its annotation; arrays become tuples where declared."""
    if not spec.check(value):
        raise DecodeError(f"{where}: value of type {_type_name(value)} is not a valid {spec.expected}")
    return _as_declared(value, shape)


def _as_declared(value: Any, shape: tuple[Any, ...]) -> Any:
    """``value`` with msgpack arrays as tuples: the field itself, and items declared as tuples."""
    if not isinstance(value, list | tuple):
        return value
    if shape[0] == "union":  # a union with one tuple type reads as that type
        seqs = [option for option in shape[1] if option[0] == "seq"]
        shape = seqs[0] if len(seqs) == 1 else _ANY_SHAPE
    if shape[0] == "seq" and shape[1][0] == "seq":
        return tuple(_as_declared(item, shape[1]) for item in value)
    return value if type(value) is tuple else tuple(value)


def _build(cls: type, tag: str, kwargs: dict[str, Any], widths: dict[str, int]) -> Message:
    for name, width in widths.items():
        if kwargs.get(name) != width:
            stated = _brief(kwargs.get(name))
            raise DecodeError(f"{tag}: big integers travel with width {width}, the message states {stated}")
    try:
        return cls(**kwargs)
    except Exception as exc:  # a message's own validation refuses the frame, whatever it raises
        raise DecodeError(f"{tag}: invalid field values: {type(exc).__name__}: {exc}") from exc


def _decode_body(source: Any, cls: type, tag: str, max_frame_bytes: int, frame_bytes: int) -> Message:
    """Decode the body from ``source`` (a :class:`_ListBody` or a :class:`_Reader`)."""
    plan = _plan(cls)
    shapes = _plain_shapes(cls)
    source.where = tag
    source.open_body(len(plan))
    max_bytes = min(max_frame_bytes, sys.maxsize)
    kwargs: dict[str, Any] = {}
    widths: dict[str, int] = {}
    for spec in plan:
        where = source.where = f"{tag}.{spec.name}"
        if spec.kind == _ARRAY:
            code, shape, data = source.array_parts(spec.ndim)
            kwargs[spec.name] = _make_array(spec, where, code, shape, data, max_bytes)
        elif spec.kind == _BIGINTS:
            width, data = source.bigint_parts()
            stated = kwargs.get(spec.width_from) if spec.width_from else None
            kwargs[spec.name] = _make_bigints(spec, where, width, data, stated, frame_bytes)
            if spec.width_from:
                widths[spec.width_from] = width
        else:
            shape = shapes[spec.name]
            kwargs[spec.name] = _make_plain(spec, shape, where, source.plain(shape))
    source.where = tag
    return _build(cls, tag, kwargs, widths)


# Plain-field shapes, compiled from annotations as _plain_checker reads them: ("scalar",
# families), ("seq", item shape), ("union", shapes), or ("any",) for types the codec does not know.
_ANY_SHAPE: tuple[Any, ...] = ("any",)
_SCALAR_FAMILIES: dict[Any, frozenset[int]] = {
    bool: frozenset({_F_BOOL}),
    int: frozenset({_F_INT}),
    float: frozenset({_F_INT, _F_FLOAT}),
    str: frozenset({_F_STR}),
    bytes: frozenset({_F_BIN}),
    type(None): frozenset({_F_NIL}),
}
_SHAPES: dict[type, dict[str, tuple[Any, ...]]] = {}


def _plain_shape(annotation: Any) -> tuple[Any, ...]:
    """What a plain field may hold on the wire, mirroring :func:`_plain_checker`."""
    families = _SCALAR_FAMILIES.get(annotation) if isinstance(annotation, type) else None
    if families is not None:
        return ("scalar", families)
    origin = typing.get_origin(annotation)
    if origin is tuple:
        args = typing.get_args(annotation)
        return ("seq", _plain_shape(args[0]) if args else _ANY_SHAPE)
    if origin in (typing.Union, types.UnionType):
        return ("union", tuple(_plain_shape(a) for a in typing.get_args(annotation)))
    return _ANY_SHAPE


def _plain_shapes(cls: type) -> dict[str, tuple[Any, ...]]:
    shapes = _SHAPES.get(cls)
    if shapes is None:
        hints = typing.get_type_hints(cls)
        shapes = {spec.name: _plain_shape(hints.get(spec.name, Any)) for spec in _plan(cls) if spec.kind == _PLAIN}
        _SHAPES[cls] = shapes
    return shapes


# --- decoding: small frames, unpacked at once ----------------------------------------------------------


class _ListBody:
    """The parts of a body msgpack has already unpacked (the small-frame path)."""

    __slots__ = ("_body", "_items", "where")

    def __init__(self, body: Any) -> None:
        self._body = body
        self.where = ""

    def open_body(self, n_fields: int) -> None:
        if not isinstance(self._body, list) or len(self._body) != n_fields:
            raise DecodeError(f"{self.where}: body must hold exactly {n_fields} fields")
        self._items = iter(self._body)

    def array_parts(self, ndim: int) -> list[Any]:
        raw = next(self._items)
        if not (isinstance(raw, list) and len(raw) == 3):
            raise DecodeError(f"{self.where}: an array must be [dtype, shape, bytes]")
        return raw

    def bigint_parts(self) -> list[Any]:
        raw = next(self._items)
        if not (isinstance(raw, list) and len(raw) == 2):
            raise DecodeError(f"{self.where}: big integers must be [width, bytes]")
        return raw

    def plain(self, shape: tuple[Any, ...]) -> Any:
        return next(self._items)


class _SmallLimits:
    """msgpack hooks that give up once a frame holds more containers than a small one does."""

    __slots__ = ("lists", "maps")

    def __init__(self) -> None:
        self.lists = 0
        self.maps = 0

    def list_hook(self, items: list[Any]) -> list[Any]:
        self.lists += 1
        if self.lists > _SMALL_LISTS:
            raise _NotSmall
        return items

    def object_hook(self, mapping: dict[Any, Any]) -> dict[Any, Any]:
        self.maps += 1
        if self.maps > _SMALL_MAPS:
            raise _NotSmall
        return mapping


def _refuse_ext(code: int, data: bytes) -> Any:
    raise _NotSmall


def _decode_small(view: memoryview, max_frame_bytes: int) -> tuple[Envelope, Message] | None:
    """Decode a small frame in one msgpack call; ``None`` when it is not small (or not msgpack)."""
    limits = _SmallLimits()
    try:
        obj = msgpack.unpackb(
            view,
            raw=False,
            strict_map_key=True,
            use_list=True,
            list_hook=limits.list_hook,
            object_hook=limits.object_hook,
            ext_hook=_refuse_ext,
            max_str_len=_SMALL_STR,
            max_bin_len=len(view),
            max_array_len=_SMALL_ITEMS,
            max_map_len=len(_ENVELOPE_KEYS),
            max_ext_len=0,
        )
    except Exception:  # too big for this path, or not msgpack: the streaming path decides and says why
        return None
    decoded = _canonical(obj, max_frame_bytes)  # the common case in one pass (same checks)
    if decoded is not None:
        return decoded
    if not isinstance(obj, dict) or obj.keys() != _ENVELOPE_KEYS:
        raise DecodeError(_ENVELOPE_ERROR)
    body = _ListBody(obj["b"])
    try:
        cls = _check_envelope(obj["v"], obj["t"], obj["s"], obj["r"], obj["p"])
        message = _decode_body(body, cls, obj["t"], max_frame_bytes, len(view))
    except DecodeError:
        raise
    except Exception as exc:  # NumPy and Python errors of the checks alike: the frame is refused
        raise DecodeError(f"{body.where or 'envelope'}: not a valid frame: {type(exc).__name__}: {exc}") from exc
    return Envelope(obj["v"], obj["t"], obj["s"], obj["r"], obj["p"]), message


# --- decoding: the common frame, checked in one pass ----------------------------------------------------
#
# Most frames are the canonical encoding of a message whose fields are arrays, packed big integers
# (a uint8 [count, width] view of the frame's bytes) and plain scalars (or tuples of scalars), tens
# of bytes to a few KiB long. A frame of at most _FAST_FRAME_BYTES is unpacked in one msgpack call
# with msgpack's own limits (no container, string or bytes longer than the frame; what it builds
# is then at most about 100 bytes per frame byte, under 2 MiB) and checked in one pass by the same
# rules as _check_envelope, _make_array, _make_bigints, _build and _make_plain.
# Anything unusual (a refusal included) declines the pass and goes to the general paths, which
# decide and word the error; so this pass changes no outcome, only its cost. It is used only for
# classes whose plain fields are scalars or tuples of scalars: a frame it accepts is one the
# small-frame path accepts with the same values, or, where that path hands a frame on (more
# lists, longer strings), the streaming path, whose budget (2.5 B + 1 MiB) such a frame of at
# most 16 KiB cannot exceed and whose depth limit concerns only nested plain values.

_FAST_FRAME_BYTES = 16 * 1024
_FAST_PLANS: dict[type, tuple[tuple[Any, ...], ...] | None] = {}
_N_ENVELOPE_KEYS = len(_ENVELOPE_KEYS)
_new_envelope = object.__new__
# An Envelope is frozen: its slots are written once through their descriptors (what its
# dataclass __init__ does through object.__setattr__, at half the cost).
_SET_VERSION, _SET_TAG, _SET_SESSION, _SET_ROUND, _SET_PHASE = (
    Envelope.__dict__[name].__set__ for name in ("version", "tag", "session", "round_idx", "phase")
)


def _envelope(version: int, tag: str, session: int, round_idx: int, phase: str) -> Envelope:
    """``Envelope(version, tag, session, round_idx, phase)``, built faster."""
    envelope = _new_envelope(Envelope)
    _SET_VERSION(envelope, version)
    _SET_TAG(envelope, tag)
    _SET_SESSION(envelope, session)
    _SET_ROUND(envelope, round_idx)
    _SET_PHASE(envelope, phase)
    return envelope


_FAST_PLAIN, _FAST_ARRAY, _FAST_PACKED = range(3)
_FAST_BUILDERS: dict[type, Any] = {}
_new_object = object.__new__


def _fast_builder(cls: type) -> Any:
    """``build(kwargs) -> cls(**kwargs)`` for a decoded frame's complete keyword arguments, faster
    where that is the same thing.

    For the usual message, a frozen dataclass whose ``__init__`` is the one ``dataclasses``
    generated (every field an ``__init__`` argument, no ``InitVar``), with an instance ``__dict__``
    and no ``__new__`` of its own, ``cls(**kwargs)`` with every field given writes each field
    into the instance's ``__dict__`` through ``object.__setattr__``, then calls
    ``__post_init__``: this does the same with one ``dict.update`` (a third of the cost). Any
    other class gets ``cls(**kwargs)`` itself.
    """
    builder = _FAST_BUILDERS.get(cls)
    if builder is not None:
        return builder
    params = getattr(cls, "__dataclass_params__", None)
    init = getattr(cls, "__init__", None)
    declared = getattr(cls, "__dataclass_fields__", {})
    fields = dataclasses.fields(cls) if params is not None else ()
    plain = (
        params is not None
        and params.frozen
        and getattr(getattr(init, "__code__", None), "co_filename", None) == "<string>"  # generated
        and len(declared) == len(fields)  # no InitVar or ClassVar pseudo-fields
        and all(f.init for f in fields)
        and "__slots__" not in cls.__dict__
        and cls.__new__ is object.__new__
    )
    if not plain:
        builder = _FAST_BUILDERS[cls] = lambda kwargs: cls(**kwargs)
        return builder
    post_init = getattr(cls, "__post_init__", None)

    def build(kwargs: dict[str, Any]) -> Any:
        message = _new_object(cls)
        message.__dict__.update(kwargs)
        if post_init is not None:
            post_init(message)
        return message

    builder = _FAST_BUILDERS[cls] = build
    return builder


def _fast_plan(cls: type) -> tuple[tuple[Any, ...], ...] | None:
    """``(name, kind, codes or check or declared width, ndim or shape or width field)`` per field
    of ``cls``, or ``None`` when its frames are left to the general paths (big integers decoded
    to ints, nested, union or unknown plain types)."""
    if cls in _FAST_PLANS:
        return _FAST_PLANS[cls]
    shapes = _plain_shapes(cls)
    fields: list[tuple[Any, ...]] = []
    for spec in _plan(cls):
        if spec.kind == _ARRAY:
            codes = {code: dt for code, dt in _DTYPE_CODES.items() if dt in spec.dtypes}
            fields.append((spec.name, _FAST_ARRAY, codes, spec.ndim))
            continue
        if spec.kind == _BIGINTS and spec.packed:
            fields.append((spec.name, _FAST_PACKED, spec.width, spec.width_from))
            continue
        if spec.kind != _PLAIN:
            fields = []
            break
        shape = shapes[spec.name]
        if shape[0] != "scalar" and not (shape[0] == "seq" and shape[1][0] == "scalar"):
            fields = []
            break
        fields.append((spec.name, _FAST_PLAIN, spec.check, shape))
    plan = tuple(fields) if fields else None
    _FAST_PLANS[cls] = plan
    return plan


def _decode_fast(frame: bytes, max_frame_bytes: int) -> tuple[Envelope, Message] | None:
    """The common frame (see above) decoded in one pass; ``None`` declines (the general paths decide)."""
    try:
        # msgpack's own limits (no container, string or bytes longer than the frame, maps with
        # string or bytes keys) and msgpack's own types (raw=False, lists); extensions become
        # ExtType values, which no check accepts.
        obj = msgpack.unpackb(frame)
    except Exception:  # not msgpack, trailing bytes, ...: the general paths decide
        return None
    return _canonical(obj, max_frame_bytes)


def _canonical(obj: Any, max_frame_bytes: int) -> tuple[Envelope, Message] | None:
    """The message of an unpacked frame ``obj`` when it is the canonical frame of a message of a
    fast-planned class and passes every check; ``None`` declines (the general checks decide)."""
    try:
        if type(obj) is not dict or len(obj) != _N_ENVELOPE_KEYS:
            return None
        version, tag, session, round_idx, phase, body = obj["v"], obj["t"], obj["s"], obj["r"], obj["p"], obj["b"]
        if not (
            type(version) is int and version == WIRE_VERSION and type(tag) is str
            and type(session) is int and session >= 0 and type(round_idx) is int and round_idx >= 0
            and type(phase) is str and type(body) is list
        ):
            return None
        cls = message_class(tag)
        plan = _FAST_PLANS[cls] if cls in _FAST_PLANS else _fast_plan(cls) if cls is not None else None
        if plan is None or len(body) != len(plan):
            return None
        max_bytes = min(max_frame_bytes, sys.maxsize)
        kwargs = {}
        widths = []
        for (name, kind, rule, form), value in zip(plan, body):
            if kind == _FAST_PLAIN:
                if not rule(value):
                    return None
                kwargs[name] = value if type(value) is not list else tuple(value)
                continue
            if kind == _FAST_PACKED:  # [width, bytes], as _make_bigints checks it
                if type(value) is not list or len(value) != 2:
                    return None
                width, data = value
                if type(width) is not int or width <= 0 or type(data) is not bytes or len(data) % width:
                    return None
                if rule is not None and width != rule:
                    return None
                if form is not None:
                    widths.append((form, width))  # checked once every field is read
                kwargs[name] = np.frombuffer(data, dtype=np.uint8).reshape(-1, width)  # a read-only view
                continue
            if type(value) is not list or len(value) != 3:
                return None
            code, shape, data = value
            dtype = rule.get(code) if type(code) is str else None
            if dtype is None or type(shape) is not list or len(shape) != form or type(data) is not bytes:
                return None
            limit = max_bytes // dtype.itemsize
            elements = 1
            for size in shape:
                if type(size) is not int or size < 0 or size > limit:
                    return None
                elements *= size or 1
            if elements > limit or len(data) != math.prod(shape) * dtype.itemsize:
                return None
            kwargs[name] = np.ndarray(shape, dtype, data)  # a read-only view of data, as np.frombuffer
        for form, width in widths:  # the width the message states (as _build checks it)
            if kwargs.get(form) != width:
                return None
        message = (_FAST_BUILDERS[cls] if cls in _FAST_BUILDERS else _fast_builder(cls))(kwargs)
    except Exception:  # a missing key, an unhashable code, a message's own refusal, ...: the general checks decide
        return None
    return _envelope(version, tag, session, round_idx, phase), message


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


def array_payload_bytes(message: Message) -> int:
    """Raw bytes of the message's array and big-integer fields (what the envelope wraps)."""
    total = 0
    for spec in _plan(type(message)):
        value = getattr(message, spec.name)
        if spec.kind == _ARRAY:
            total += np.asarray(value).nbytes
        elif spec.kind == _BIGINTS:
            total += len(_encode_bigints(value, spec, type(message).TAG, message)[1])
    return total

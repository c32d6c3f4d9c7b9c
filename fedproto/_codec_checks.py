"""Decoding's shared ground: the msgpack type families read from an object's first byte, the
limits on what a frame may build, and the checks both decoding paths apply to a frame's parts
(:func:`_check_envelope`, :func:`_make_array`, :func:`_make_bigints`, :func:`_make_plain`,
:func:`_build`, driven by :func:`_decode_body`). :mod:`fedproto.codec` describes the bounds.
"""

from __future__ import annotations

import math
import sys
import types
import typing
from typing import Any

import numpy as np

from fedproto._codec_encode import _ARRAY, _BIGINTS, _DTYPE_CODES, _PLAIN, WIRE_VERSION, _FieldPlan, _names, _plan
from fedproto.errors import DecodeError
from fedproto.messages import Message, message_class

__all__ = ["_check_envelope", "_decode_body", "_plain_shapes"]


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



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
"""

from __future__ import annotations

import dataclasses
import math
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
    check: Any = None  # for plain fields: a callable returning True when the value is acceptable


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


def _plan(cls: type) -> tuple[_FieldPlan, ...]:
    plan = _PLANS.get(cls)
    if plan is not None:
        return plan
    hints = typing.get_type_hints(cls)
    items = []
    for f in dataclasses.fields(cls):
        kind = f.metadata.get("kind")
        if kind == "array":
            items.append(_FieldPlan(f.name, _ARRAY, dtypes=f.metadata["dtypes"], ndim=f.metadata["ndim"]))
        elif kind == "bigints":
            items.append(
                _FieldPlan(f.name, _BIGINTS, width=f.metadata["width"], width_from=f.metadata.get("width_from"))
            )
        else:
            items.append(_FieldPlan(f.name, _PLAIN, check=_plain_checker(hints.get(f.name, Any))))
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
    ints = [int(v) for v in values]
    if any(v < 0 for v in ints):
        raise ValueError(f"{tag}.{spec.name}: big integers must be non-negative")
    needed = max((max(ints).bit_length() + 7) // 8 if ints else 1, 1)
    stated = getattr(message, spec.width_from) if spec.width_from and message is not None else None
    width = spec.width or stated or needed
    if needed > width:
        raise ValueError(f"{tag}.{spec.name}: a value needs {needed} bytes, the field allows {width}")
    return [width, b"".join(v.to_bytes(width, "big") for v in ints)]


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
        TypeError: an array field has the wrong dtype or number of dimensions, or the message is
            not a registered message.
        ValueError: a big integer is negative or wider than its field.
    """
    cls = type(message)
    tag = getattr(cls, "TAG", None)
    if tag is None or message_class(tag) is not cls:
        raise TypeError(f"{cls.__name__} is not a registered message")
    body = []
    for spec in _plan(cls):
        value = getattr(message, spec.name)
        if spec.kind == _ARRAY:
            body.append(_encode_array(value, spec, tag))
        elif spec.kind == _BIGINTS:
            body.append(_encode_bigints(value, spec, tag, message))
        else:
            body.append(value)
    return msgpack.packb(
        {"v": WIRE_VERSION, "t": tag, "s": session, "r": round_idx, "p": phase, "b": body},
        use_bin_type=True,
    )


# --- decoding --------------------------------------------------------------------------------------


def _decode_array(raw: Any, spec: _FieldPlan, tag: str) -> np.ndarray:
    if not (isinstance(raw, list) and len(raw) == 3):
        raise DecodeError(f"{tag}.{spec.name}: an array must be [dtype, shape, bytes]")
    code, shape, data = raw
    dtype = _DTYPE_CODES.get(code) if isinstance(code, str) else None
    if dtype is None:
        raise DecodeError(f"{tag}.{spec.name}: unknown dtype code {code!r}")
    if dtype not in spec.dtypes:
        raise DecodeError(f"{tag}.{spec.name}: dtype {dtype} is not one of {_names(spec.dtypes)}")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise DecodeError(f"{tag}.{spec.name}: shape must be a list of non-negative integers")
    if len(shape) != spec.ndim:
        raise DecodeError(f"{tag}.{spec.name}: expected {spec.ndim} dimensions, got {len(shape)}")
    if not isinstance(data, bytes):
        raise DecodeError(f"{tag}.{spec.name}: array data must be bytes")
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise DecodeError(
            f"{tag}.{spec.name}: {len(data)} data bytes do not match shape {tuple(shape)} of {dtype} "
            f"({expected} bytes)"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _decode_bigints(raw: Any, spec: _FieldPlan, tag: str) -> tuple[int, ...]:
    if not (isinstance(raw, list) and len(raw) == 2):
        raise DecodeError(f"{tag}.{spec.name}: big integers must be [width, bytes]")
    width, data = raw
    if not isinstance(width, int) or isinstance(width, bool) or width <= 0:
        raise DecodeError(f"{tag}.{spec.name}: width must be a positive integer")
    if spec.width is not None and width != spec.width:
        raise DecodeError(f"{tag}.{spec.name}: expected width {spec.width}, got {width}")
    if not isinstance(data, bytes) or len(data) % width:
        raise DecodeError(f"{tag}.{spec.name}: data length is not a multiple of width {width}")
    return tuple(int.from_bytes(data[i : i + width], "big") for i in range(0, len(data), width))


def decode_frame(frame: bytes, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> tuple[Envelope, Message]:
    """Decode and validate one frame.

    Args:
        frame: the bytes of one frame.
        max_frame_bytes: frames longer than this are refused before parsing.

    Returns:
        ``(envelope, message)``.

    Raises:
        DecodeError: the frame is oversized, not msgpack, has a bad envelope, an unknown version or
            tag, or a body that does not match the message's fields.
    """
    if not isinstance(frame, bytes | bytearray | memoryview):
        raise DecodeError(f"a frame must be bytes, got {type(frame).__name__}")
    if len(frame) > max_frame_bytes:
        raise DecodeError(f"frame of {len(frame)} bytes exceeds the maximum of {max_frame_bytes}")
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated exception types
        raise DecodeError(f"not a valid msgpack frame: {exc}") from exc
    if not isinstance(obj, dict) or obj.keys() != _ENVELOPE_KEYS:
        raise DecodeError("frame is not an envelope map with keys v, t, s, r, p, b")
    version, tag, session, round_idx, phase, body = (obj[k] for k in "vtsrpb")
    if version != WIRE_VERSION or isinstance(version, bool):
        raise DecodeError(f"unsupported wire version {version!r} (this side speaks {WIRE_VERSION})")
    if not isinstance(tag, str):
        raise DecodeError("tag must be a string")
    cls = message_class(tag)
    if cls is None:
        raise DecodeError(f"unknown message tag {tag!r}")
    for name, value in (("session", session), ("round_idx", round_idx)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise DecodeError(f"{tag}: envelope {name} must be a non-negative integer, got {value!r}")
    if not isinstance(phase, str):
        raise DecodeError(f"{tag}: envelope phase must be a string")
    plan = _plan(cls)
    if not isinstance(body, list) or len(body) != len(plan):
        raise DecodeError(f"{tag}: body must hold exactly {len(plan)} fields")
    kwargs: dict[str, Any] = {}
    widths: dict[str, int] = {}
    for spec, raw in zip(plan, body):
        if spec.kind == _ARRAY:
            kwargs[spec.name] = _decode_array(raw, spec, tag)
        elif spec.kind == _BIGINTS:
            kwargs[spec.name] = _decode_bigints(raw, spec, tag)
            if spec.width_from:
                widths[spec.width_from] = raw[0]
        else:
            if not spec.check(raw):
                raise DecodeError(f"{tag}.{spec.name}: value of type {type(raw).__name__} is not allowed")
            kwargs[spec.name] = tuple(raw) if isinstance(raw, list) else raw
    for name, width in widths.items():
        if kwargs.get(name) != width:
            raise DecodeError(f"{tag}: big integers travel with width {width}, the message states {kwargs.get(name)!r}")
    try:
        message = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"{tag}: invalid field values: {exc}") from exc
    return Envelope(version, tag, session, round_idx, phase), message


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

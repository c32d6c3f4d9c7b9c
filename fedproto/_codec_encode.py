"""The frame layout's constants, each message class's field plan, and the encoder: the
sending half of :mod:`fedproto.codec` (which describes the wire format and re-exports these).

A field plan (:func:`_plan`, one per message class, cached) says how each field travels: an
array (its allowed dtypes and number of dimensions), big integers (their width, or the field
that states it, and whether they are kept packed) or a plain msgpack value (the predicate its
annotation gives, which the decoder applies too).
"""

from __future__ import annotations

import dataclasses
import threading
import typing
from typing import Any

import msgpack
import numpy as np

from fedproto.messages import WIRE_DTYPES, Message, message_class

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "PLAIN_INT_MAX",
    "PLAIN_INT_MIN",
    "WIRE_VERSION",
    "Envelope",
    "array_payload_bytes",
    "encode_frame",
    "has_tag",
]

#: Version of the frame layout; a frame with another version is refused.
WIRE_VERSION = 1
#: Default largest frame accepted (bytes).
DEFAULT_MAX_FRAME_BYTES = 256 * 1024 * 1024

_ENVELOPE_KEYS = frozenset("vtsrpb")
_DTYPE_CODES = {dt.str.lstrip("<|"): dt.newbyteorder("<") if dt.byteorder not in "|" else dt for dt in WIRE_DTYPES}
_CODE_OF = {dt: code for code, dt in _DTYPE_CODES.items()}



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

"""Upper bounds of encoded frame sizes, from a message class's declared fields.

A receiver that knows the largest frame its peers can legitimately send can refuse anything
larger before reading it, instead of accepting up to the global default (256 MiB). A protocol
plugin states, for each message its parties send, the largest shapes its fields take in this run
(``k``, ``d``, the number of clients and points...), and :func:`max_frame_bytes` turns them into
bytes: the exact msgpack layout of :mod:`fedproto.codec` at those sizes, with every number that is
not stated at its widest encoding. The plugin's largest bound becomes the run's frame limit
(:attr:`fedproto.plugin.RunPlan.max_frame_bytes`).

The bound is monotone in every stated size (msgpack's headers and integers never shrink as values
grow), so a message whose arrays are at most the stated shapes, whose big integers are at most
the stated count and width, and whose plain values are no larger than the stated examples always
encodes to at most the bound. It exceeds the exact size only by the envelope's slack (session and
round at 9 bytes, a phase of :data:`MAX_PHASE_BYTES`) and 8 bytes per number that is smaller than
its widest encoding: a few dozen bytes beyond the data.

Example::

    from fedproto import max_frame_bytes

    limit = max(
        max_frame_bytes(MaskedUpdate, arrays={"masked": (k, d + 1)}, dtypes={"masked": "uint64"}),
        max_frame_bytes(PublicKeys, plain={"public_keys": (bytes(32),) * n_clients}),
    )
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from fedproto.messages import ABORT_REASON_MAX_CHARS, AbortNotice, Message
from fedproto.messages import message_class as _registered_class

__all__ = ["MAX_PHASE_BYTES", "max_frame_bytes", "abort_notice_frame_bytes"]

#: Longest phase name (UTF-8 bytes) the envelope bound allows for unless told otherwise.
MAX_PHASE_BYTES = 64

_WIDEST_NUMBER_BYTES = 9  # msgpack's uint64/int64/float64: one type byte and 8 data bytes
_NUMBER_TYPES = (int, float, bool, type(None))


# --- msgpack sizes (msgpack spec, "Formats") ----------------------------------------------------------


def _uint_bytes(value: int) -> int:
    """Encoded size of a non-negative int."""
    if value < 0x80:
        return 1
    if value < 0x100:
        return 2
    if value < 0x10000:
        return 3
    if value < 0x100000000:
        return 5
    return 9


def _str_bytes(length: int) -> int:
    """Encoded size of a str of ``length`` UTF-8 bytes."""
    header = 1 if length < 32 else 2 if length < 0x100 else 3 if length < 0x10000 else 5
    return header + length


def _bin_bytes(length: int) -> int:
    """Encoded size of a bytes object of ``length`` bytes."""
    header = 2 if length < 0x100 else 3 if length < 0x10000 else 5
    return header + length


def _container_header_bytes(count: int) -> int:
    """Encoded size of an array or map header of ``count`` items (or pairs)."""
    return 1 if count < 16 else 3 if count < 0x10000 else 5


def _value_bytes(value: Any, where: str) -> int:
    """Largest encoded size of a value shaped like ``value``: containers by their length, ``str``
    and ``bytes`` by theirs, every number at its widest encoding."""
    if isinstance(value, _NUMBER_TYPES) or isinstance(value, np.number | np.bool_):
        return _WIDEST_NUMBER_BYTES
    if isinstance(value, str):
        return _str_bytes(len(value.encode()))
    if isinstance(value, bytes | bytearray | memoryview):
        return _bin_bytes(memoryview(value).nbytes)
    if isinstance(value, list | tuple):
        return _container_header_bytes(len(value)) + sum(_value_bytes(v, where) for v in value)
    if isinstance(value, dict):
        return _container_header_bytes(len(value)) + sum(
            _value_bytes(k, where) + _value_bytes(v, where) for k, v in value.items()
        )
    raise TypeError(f"{where}: cannot bound the encoded size of a {type(value).__name__}")


def _is_numeric_annotation(annotation: Any) -> bool:
    """Whether every value of ``annotation`` is a number, bool or None (9 bytes at most)."""
    if annotation in _NUMBER_TYPES:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return all(_is_numeric_annotation(a) for a in typing.get_args(annotation))
    return False


def _envelope_bytes(tag: str, phase_bytes: int) -> int:
    """The envelope map around the body, with session and round at their widest."""
    keys = 6 * _str_bytes(1)  # "v", "t", "s", "r", "p", "b"
    return (
        _container_header_bytes(6)
        + keys
        + 1  # v: a positive fixint
        + _str_bytes(len(tag.encode()))
        + 2 * _WIDEST_NUMBER_BYTES  # s, r
        + _str_bytes(phase_bytes)
    )


def _array_bytes(field: dataclasses.Field, shape: Sequence[int], dtype: Any, where: str) -> int:
    declared: frozenset[np.dtype] = field.metadata["dtypes"]
    if dtype is None:
        itemsize = max(dt.itemsize for dt in declared)
    else:
        chosen = np.dtype(dtype)
        if chosen not in declared:
            raise ValueError(f"{where}: dtype {chosen} is not one the field declares")
        itemsize = chosen.itemsize
    shape = tuple(shape)
    if len(shape) != field.metadata["ndim"]:
        raise ValueError(f"{where}: the field has {field.metadata['ndim']} dimensions, got shape {shape}")
    if any(not isinstance(s, int | np.integer) or s < 0 for s in shape):
        raise ValueError(f"{where}: shape {shape} must hold non-negative integers")
    code_bytes = _str_bytes(2)  # numpy's dtype code without the byte-order mark: "u4", "f8", "b1"
    shape_bytes = _container_header_bytes(len(shape)) + sum(_uint_bytes(int(s)) for s in shape)
    return 1 + code_bytes + shape_bytes + _bin_bytes(math.prod(int(s) for s in shape) * itemsize)


def max_frame_bytes(
    message_class: type[Message],
    *,
    arrays: Mapping[str, Sequence[int]] | None = None,
    dtypes: Mapping[str, Any] | None = None,
    bigints: Mapping[str, tuple[int, int]] | None = None,
    plain: Mapping[str, Any] | None = None,
    phase_bytes: int = MAX_PHASE_BYTES,
) -> int:
    """Upper bound of the encoded size of one frame of ``message_class`` (envelope included).

    Every field is stated by its largest size in the run, except plain fields annotated ``int``,
    ``float``, ``bool`` (or unions of them and ``None``), which count at their widest (9 bytes).

    Args:
        message_class: a registered message class.
        arrays: array field -> its largest shape (each dimension an upper bound), e.g.
            ``{"centroids": (k, d)}``.
        dtypes: array field -> the dtype it travels as, where the field allows several (e.g.
            ``uint32`` or ``uint64``); default the widest the field declares.
        bigints: big-integer field -> ``(count, width_bytes)``: the most values and the widest
            width they travel with (a field declared with a fixed width must be stated with it).
        plain: plain field -> its largest value, as an example of its structure: containers count
            by their length, ``str`` and ``bytes`` by theirs (UTF-8 bytes for ``str``), and every
            number at its widest encoding, e.g. ``{"public_keys": (bytes(32),) * n_clients}``.
        phase_bytes: longest phase name of the protocol (UTF-8 bytes).

    Returns:
        Bytes that one frame of the class, at most the stated sizes, never exceeds.

    Raises:
        TypeError: ``message_class`` is not a registered message class, or a plain field whose
            annotation is not numeric is not stated.
        ValueError: a field is stated that the class does not have, a field is missing, a shape
            has the wrong number of dimensions or a negative size, a dtype the field does not
            declare, or a width other than the field's fixed width.
    """
    tag = getattr(message_class, "TAG", None)
    if not isinstance(tag, str) or _registered_class(tag) is not message_class:
        raise TypeError(f"{getattr(message_class, '__name__', message_class)!r} is not a registered message class")
    arrays, dtypes, bigints, plain = dict(arrays or {}), dict(dtypes or {}), dict(bigints or {}), dict(plain or {})
    if phase_bytes < 0:
        raise ValueError(f"phase_bytes must be non-negative, got {phase_bytes}")
    fields = dataclasses.fields(message_class)
    names = {f.name for f in fields}
    for stated, what in ((arrays, "arrays"), (dtypes, "dtypes"), (bigints, "bigints"), (plain, "plain")):
        unknown = sorted(set(stated) - names)
        if unknown:
            raise ValueError(f"{tag}: {what} names fields the message does not have: {', '.join(unknown)}")
    hints = typing.get_type_hints(message_class)
    body = _container_header_bytes(len(fields))
    for field in fields:
        where = f"{tag}.{field.name}"
        kind = field.metadata.get("kind")
        if kind == "array":
            if field.name not in arrays:
                raise ValueError(f"{where}: state the array's largest shape in arrays=")
            body += _array_bytes(field, arrays[field.name], dtypes.get(field.name), where)
        elif kind == "bigints":
            if field.name not in bigints:
                raise ValueError(f"{where}: state (count, width_bytes) of the big integers in bigints=")
            count, width = bigints[field.name]
            fixed = field.metadata.get("width")
            if fixed is not None and width != fixed:
                raise ValueError(f"{where}: the field's width is {fixed} bytes, got {width}")
            if count < 0 or width < 1:
                raise ValueError(f"{where}: count must be >= 0 and width >= 1, got ({count}, {width})")
            body += 1 + _uint_bytes(width) + _bin_bytes(count * width)
        elif field.name in plain:
            body += _value_bytes(plain[field.name], where)
        elif _is_numeric_annotation(hints.get(field.name)):
            body += _WIDEST_NUMBER_BYTES
        else:
            raise TypeError(f"{where}: state the field's largest value in plain= (its annotation is not numeric)")
    return _envelope_bytes(tag, phase_bytes) + body


def abort_notice_frame_bytes(parties: Iterable[str]) -> int:
    """Upper bound of the runtime's :class:`~fedproto.messages.AbortNotice` frame in a run of
    ``parties``: every party named as a culprit, the longest reason (1000 characters of up to
    4 UTF-8 bytes each) and the longest name as the origin of a passed-on notice. A run's frame
    limit must not be below it, or a failing party's notice would be refused by the survivors it
    is meant to tell."""
    names = tuple(parties)
    return max_frame_bytes(
        AbortNotice,
        plain={
            "culprits": names,
            "reason": "\U0010ffff" * ABORT_REASON_MAX_CHARS,
            "origin": max(names, key=lambda name: len(name.encode()), default=""),
        },
        phase_bytes=MAX_PHASE_BYTES,
    )

"""The two decoding paths that unpack a frame in one msgpack call: the canonical frame of the
common message checked in one pass (:func:`_decode_fast`), and a small frame unpacked under
tight msgpack limits then checked like any other (:func:`_decode_small`). Either declines a frame
it does not take (``None``) for :mod:`fedproto.codec`'s streaming path to decide.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import msgpack
import numpy as np

from fedproto._codec_checks import _ENVELOPE_ERROR, _SMALL_ITEMS, _SMALL_LISTS, _SMALL_MAPS, _SMALL_STR, _NotSmall
from fedproto._codec_checks import _check_envelope, _decode_body, _plain_shapes
from fedproto._codec_encode import _ARRAY, _BIGINTS, _DTYPE_CODES, _ENVELOPE_KEYS, _PLAIN, WIRE_VERSION, Envelope
from fedproto._codec_encode import _plan
from fedproto.errors import DecodeError
from fedproto.messages import Message, message_class

__all__ = ["_FAST_FRAME_BYTES", "_decode_fast", "_decode_small"]

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



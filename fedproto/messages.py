"""Messages, actions and runtime events.

A *message* is a subclass of :class:`Message` that names its wire tag,
``class Grid(Message, tag="kz.grid")``: the base class makes it a frozen, keyword-only dataclass,
sets its ``TAG`` and registers the tag; ``__post_init__`` validates the fields. Field types tell the codec how each
field travels (see :mod:`fedproto.codec`):

* ``numpy.ndarray`` fields declared with :func:`array_field` travel as dtype + shape + raw
  little-endian bytes; the declared dtype and number of dimensions are enforced on decode;
* ``tuple[int, ...]`` fields declared with :func:`bigints_field` hold integers of any size
  (prime-field elements) and travel as fixed-width big-endian bytes with the width stated;
  ``bigints_field(..., packed=True)`` keeps them in that wire form in memory, a ``uint8``
  array ``[count, width]`` (one big-endian integer per row), so vectorised field arithmetic
  (:mod:`fedproto.algorithms.scma`) never converts element by element;
* ``int``, ``float``, ``str``, ``bytes``, ``bool`` and tuples of them travel as msgpack natives.

*Actions* (:class:`Send`, :class:`Broadcast`) are what a protocol machine asks the runtime to do;
they carry the round and phase in which the message was produced. *Events*
(:class:`PhaseTimedOut`, :class:`PartyDropped`, :class:`SendFailed`) are what the runtime tells
a machine about time and I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar, dataclass_transform

import numpy as np

__all__ = [
    "Message",
    "array_field",
    "bigints_field",
    "message_class",
    "registered_tags",
    "AbortNotice",
    "Send",
    "Broadcast",
    "Outgoing",
    "Event",
    "PhaseTimedOut",
    "PartyDropped",
    "SendFailed",
]

_REGISTRY: dict[str, type["Message"]] = {}

#: dtypes that may travel on the wire (little-endian, fixed width).
WIRE_DTYPES = frozenset(
    np.dtype(name)
    for name in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float32",
        "float64",
    )
)


def array_field(dtype: str | tuple[str, ...], ndim: int) -> Any:
    """Declare an ``np.ndarray`` message field with allowed dtypes and a number of dimensions.

    Args:
        dtype: numpy dtype name, e.g. ``"uint32"``, or a tuple of allowed names; each must be one
            of the wire dtypes.
        ndim: number of dimensions the array must have.

    Raises:
        ValueError: a dtype cannot travel on the wire.
    """
    names = (dtype,) if isinstance(dtype, str) else tuple(dtype)
    dtypes = frozenset(np.dtype(name) for name in names)
    bad = [str(dt) for dt in dtypes if dt not in WIRE_DTYPES]
    if bad or not dtypes:
        raise ValueError(f"dtype(s) {bad or names} cannot travel on the wire")
    return dataclasses.field(metadata={"kind": "array", "dtypes": dtypes, "ndim": int(ndim)})


def bigints_field(width_bytes: int | None = None, *, width_from: str | None = None, packed: bool = False) -> Any:
    """Declare a field of non-negative integers of arbitrary size.

    Args:
        width_bytes: fixed width of each element on the wire; ``None`` uses the smallest width
            that holds the largest element of each message (the width travels with the data).
        width_from: name of a plain ``int`` field of the same message that states the width
            (e.g. the byte width of a prime field fixed at run time); the decoder refuses a frame
            whose data width differs from it.
        packed: the field's value is the wire form itself, a C-contiguous ``numpy.ndarray`` of
            dtype ``uint8`` and shape ``[count, width]`` whose rows are big-endian unsigned
            integers (decoded frames give a read-only view of the frame's bytes, no copy);
            otherwise a ``tuple[int, ...]``. The bytes on the wire are the same either way.
    """
    return dataclasses.field(
        metadata={"kind": "bigints", "width": width_bytes, "width_from": width_from, "packed": bool(packed)}
    )


@dataclass_transform(kw_only_default=True, frozen_default=True)
class Message:
    """Base class of every protocol message.

    A subclass names its wire tag (a short string such as ``"fl.masked"``, unique across the
    process) as a class keyword and declares its fields as annotations::

        class Probe(Message, tag="demo.probe"):
            radius: float
            centres: np.ndarray = array_field("float64", 2)

            def __post_init__(self) -> None:
                if self.radius < 0:
                    raise ValueError("radius must be >= 0")

    Every subclass becomes a frozen, keyword-only dataclass (do not add ``@dataclass`` yourself:
    applying it twice raises ``TypeError``); the tag is its ``TAG`` class variable and is
    registered for the codec. A subclass without a tag is an abstract base of shared fields, never
    sent itself. ``__post_init__`` validates the fields, raising ``ValueError``/``TypeError``.

    Raises:
        TypeError: the tag is not a non-empty string, or the class body sets ``TAG`` itself.
        ValueError: the tag is already registered by another class.
    """

    TAG: ClassVar[str]

    def __init_subclass__(cls, tag: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "TAG" in cls.__dict__:
            raise TypeError(f"{cls.__name__}: name the tag as a class keyword, class {cls.__name__}(Message, tag=...)")
        dataclasses.dataclass(frozen=True, kw_only=True)(cls)
        if tag is None:
            return
        if not isinstance(tag, str) or not tag:
            raise TypeError(f"{cls.__name__}: the message tag must be a non-empty string, got {tag!r}")
        previous = _REGISTRY.get(tag)
        if previous is not None and previous.__qualname__ != cls.__qualname__:
            raise ValueError(f"message tag {tag!r} is used by both {previous.__name__} and {cls.__name__}")
        cls.TAG = tag
        _REGISTRY[tag] = cls


def message_class(tag: str) -> type[Message] | None:
    """The message class registered under ``tag``, or ``None``."""
    return _REGISTRY.get(tag)


def registered_tags() -> dict[str, type[Message]]:
    """A copy of the tag registry."""
    return dict(_REGISTRY)


# --- core control messages -------------------------------------------------------------------------

#: Longest ``AbortNotice.reason`` (characters); the runtime shortens longer accounts to fit.
ABORT_REASON_MAX_CHARS = 1000


class AbortNotice(Message, tag="fedproto.aborted"):
    """Runtime -> its contacts: the sender gave up on the run, and says which parties failed.

    Sent by :func:`~fedproto.runtime.run_party` (never by a protocol machine) when its machine
    fails, so every survivor ends promptly; it never reaches a machine. A notice is evidence about
    its sender only (the transport authenticates who sent it): the receiver learns that the sender
    gave up, and reads ``culprits`` as the sender's claim, never as a fact (see the threat model in
    ``docs/concepts.md``). A party that receives one from a roster peer raises
    :class:`~fedproto.errors.RunAborted` naming that peer (or ``origin``) as the reporter, unless
    its machine carries on without that peer (a dropout-tolerant role, see
    :meth:`~fedproto.machine.ProtocolMachine.carries_on_without`): then the notice is that
    peer's dropout.

    Attributes:
        culprits: the parties the reporter blames (at least one; the reporter itself when it
            failed on its own).
        reason: the reporter's one-line account of its failure (at most 1000 characters).
        origin: ``""`` when the sender is the reporter; else the party the sender received the
            notice from, which it passes on (a relay repeats a claim, it never makes it its own).
            A receiver accepts it only if it names a roster party other than the sender and
            itself; otherwise the notice counts as the sender's own.
    """

    culprits: tuple[str, ...]
    reason: str
    origin: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.culprits, tuple) or not self.culprits:
            raise ValueError("AbortNotice.culprits must be a non-empty tuple of party names")
        if not all(isinstance(name, str) and name for name in self.culprits):
            raise ValueError("AbortNotice.culprits must hold non-empty party names")
        if not isinstance(self.reason, str) or len(self.reason) > ABORT_REASON_MAX_CHARS:
            raise ValueError(f"AbortNotice.reason must be a str of at most {ABORT_REASON_MAX_CHARS} characters")
        if not isinstance(self.origin, str):
            raise ValueError("AbortNotice.origin must be a party name, or '' when the sender reports")


# --- actions -------------------------------------------------------------------------------------


# Actions are made for every message a machine sends. Their __init__ writes the frozen slots
# through their descriptors (the dataclass __init__ goes through object.__setattr__, at about
# twice the cost); fields, repr, equality and hashing are the dataclass's.


@dataclasses.dataclass(frozen=True, slots=True)
class Send:
    """Send ``message`` to party ``dest``; stamped with the round and phase it belongs to."""

    dest: str
    message: Message
    round_idx: int
    phase: str

    def __init__(self, dest: str, message: Message, round_idx: int, phase: str) -> None:
        _SET_SEND_DEST(self, dest)
        _SET_SEND_MESSAGE(self, message)
        _SET_SEND_ROUND(self, round_idx)
        _SET_SEND_PHASE(self, phase)


@dataclasses.dataclass(frozen=True, slots=True)
class Broadcast:
    """Send the same ``message`` to every party of ``dests`` (one frame per destination)."""

    dests: tuple[str, ...]
    message: Message
    round_idx: int
    phase: str

    def __init__(self, dests: Sequence[str], message: Message, round_idx: int, phase: str) -> None:
        _SET_BROADCAST_DESTS(self, dests if isinstance(dests, tuple) else tuple(dests))
        _SET_BROADCAST_MESSAGE(self, message)
        _SET_BROADCAST_ROUND(self, round_idx)
        _SET_BROADCAST_PHASE(self, phase)


_SET_SEND_DEST, _SET_SEND_MESSAGE, _SET_SEND_ROUND, _SET_SEND_PHASE = (
    Send.__dict__[name].__set__ for name in ("dest", "message", "round_idx", "phase")
)
_SET_BROADCAST_DESTS, _SET_BROADCAST_MESSAGE, _SET_BROADCAST_ROUND, _SET_BROADCAST_PHASE = (
    Broadcast.__dict__[name].__set__ for name in ("dests", "message", "round_idx", "phase")
)


Outgoing = Send | Broadcast


# --- events ----------------------------------------------------------------------------------------


class Event:
    """Base class of runtime events fed to :meth:`ProtocolMachine.handle`."""


@dataclasses.dataclass(frozen=True, slots=True)
class PhaseTimedOut(Event):
    """The machine made no progress within its phase deadline."""

    round_idx: int
    phase: str
    deadline_s: float


@dataclasses.dataclass(frozen=True, slots=True)
class PartyDropped(Event):
    """The transport reports that ``party`` is gone."""

    party: str


@dataclasses.dataclass(frozen=True, slots=True)
class SendFailed(Event):
    """Sending to ``dest`` failed; ``error`` is the transport error."""

    dest: str
    error: BaseException


def as_tuple(values: Sequence[str]) -> tuple[str, ...]:
    """Return ``values`` as a tuple of strings (helper for roster arguments)."""
    return tuple(str(v) for v in values)

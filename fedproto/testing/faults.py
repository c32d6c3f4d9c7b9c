"""Fault injection: parameters for the in-memory transport, and a base for fault wrappers.

:class:`Faults` describes, for one :class:`~fedproto.transports.memory.MemoryNetwork`, which
frames to drop, duplicate or delay, and which parties crash: after how many frames
(``crash_after``), or at the first frame of a given phase and round (``crash_at``, a
:class:`CrashPoint` per party: "drop client-3 when it sends its masked input"). Every draw
comes from one seeded ``random.Random`` per ``(sender, receiver)`` link, so the faults on a link
repeat exactly for the same seed and traffic, whatever order Trio runs tasks in.

:class:`DelegatingTransport` wraps any endpoint and passes everything through; a test subclasses
it to change one thing (a send that hangs, a receive that stalls, an endpoint that closes
after ``n`` frames) over any transport.
"""

from __future__ import annotations

import dataclasses
import math

from fedproto.transport import Transport

__all__ = ["CrashPoint", "DelegatingTransport", "Faults"]


class DelegatingTransport(Transport):
    """An endpoint that passes every call to ``inner`` (subclass it to change one thing).

    Args:
        inner: the wrapped endpoint; ``party``, ``roster`` and ``framing_overhead_bytes`` are
            taken from it.
    """

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.party = inner.party
        self.roster = inner.roster
        self.framing_overhead_bytes = inner.framing_overhead_bytes

    async def send(self, dest: str, frame: bytes) -> None:
        await self.inner.send(dest, frame)

    async def receive(self) -> tuple[str, bytes]:
        return await self.inner.receive()

    def receive_nowait(self) -> tuple[str, bytes] | None:
        return self.inner.receive_nowait()

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclasses.dataclass(frozen=True)
class CrashPoint:
    """Where a party crashes: at the first frame it sends in ``phase`` (and round ``round_idx``).

    The phase and round are those of the frame's envelope (what the machine stamped on the
    :class:`~fedproto.messages.Send`, see :func:`~fedproto.codec.encode_frame`).

    Attributes:
        phase: the envelope phase, e.g. ``"masked-input"``.
        round_idx: the 0-based envelope round, or ``None`` for the first frame of ``phase`` in any
            round.

    Raises:
        ValueError: an empty phase, or a round that is not a non-negative int.
    """

    phase: str
    round_idx: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.phase, str) or not self.phase:
            raise ValueError(f"CrashPoint.phase must be a non-empty phase name, got {self.phase!r}")
        r = self.round_idx
        if r is not None and (not isinstance(r, int) or isinstance(r, bool) or r < 0):
            raise ValueError(f"CrashPoint.round_idx must be a non-negative int or None, got {r!r}")

    def matches(self, phase: str, round_idx: int) -> bool:
        """Whether a frame stamped ``(phase, round_idx)`` is the one to crash at."""
        return phase == self.phase and (self.round_idx is None or round_idx == self.round_idx)


@dataclasses.dataclass(frozen=True)
class Faults:
    """Seeded fault injection for the memory transport.

    Attributes:
        seed: seed of the fault RNG (faults repeat exactly for the same seed and traffic).
        drop: probability that a frame is silently lost.
        duplicate: probability that a frame is delivered twice.
        delay_s: maximum extra delay per frame, drawn uniformly from ``[0, delay_s]``. The sender
            sleeps through the delay (order kept) unless the network has a nursery
            (:meth:`~fedproto.transports.memory.MemoryNetwork.attach_nursery`); then delayed
            frames are delivered by background tasks and may overtake each other.
        crash_after: ``{party: n}``: the party crashes when it tries to send frame ``n + 1``
            (after ``n`` frames went out): that ``send`` and every later ``send`` or ``receive``
            of its endpoint raise :class:`~fedproto.errors.PartyCrashed`, and frames sent to it
            are lost. :func:`~fedproto.runtime.run_parties` then ends the party's task quietly,
            as a killed process would end, and its peers find out by its silence (or at once,
            with ``MemoryNetwork(..., report_drops=True)``: every other endpoint's next receive
            raises :class:`~fedproto.errors.PeerDropped`).
        crash_at: ``{party: CrashPoint(phase, round_idx)}`` (a ``(phase, round_idx)`` tuple is
            accepted and converted): the party crashes, exactly as with ``crash_after``, when it
            tries to send its first frame whose envelope phase is ``phase`` (and, unless
            ``round_idx`` is ``None``, whose envelope round is ``round_idx``); every frame it sent
            before is delivered, none after. A party may have both entries: the first to match
            crashes it. Only the frames of parties listed here are inspected (their envelope is
            read, the body is not decoded). A frame that is not a fedproto frame never matches.

    Raises:
        ValueError: a probability outside ``[0, 1]``, a negative or infinite delay, a negative
            ``crash_after`` count, or a ``crash_at`` entry that is not a party name mapped to a
            :class:`CrashPoint` or a ``(phase, round_idx)`` pair.
    """

    seed: int = 0
    drop: float = 0.0
    duplicate: float = 0.0
    delay_s: float = 0.0
    crash_after: dict[str, int] = dataclasses.field(default_factory=dict)
    crash_at: dict[str, CrashPoint] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("drop", "duplicate"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"Faults.{name} must be a probability, got {p}")
        if not (self.delay_s >= 0.0 and math.isfinite(self.delay_s)):
            raise ValueError("Faults.delay_s must be a finite non-negative number of seconds")
        for party, n in self.crash_after.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValueError(f"Faults.crash_after[{party!r}] must be a non-negative frame count, got {n!r}")
        object.__setattr__(self, "crash_at", _crash_points(self.crash_at))


def _crash_points(entries: object) -> dict[str, CrashPoint]:
    """``crash_at`` as ``{party: CrashPoint}``, tuples converted (a new dict: the caller's is kept)."""
    if not isinstance(entries, dict):
        raise ValueError(f"Faults.crash_at must be a dict {{party: CrashPoint}}, got {type(entries).__name__}")
    out: dict[str, CrashPoint] = {}
    for party, point in entries.items():
        if not isinstance(party, str) or not party:
            raise ValueError(f"Faults.crash_at keys must be party names, got {party!r}")
        if isinstance(point, tuple) and len(point) == 2:
            point = CrashPoint(*point)
        if not isinstance(point, CrashPoint):
            raise ValueError(
                f"Faults.crash_at[{party!r}] must be a CrashPoint or a (phase, round_idx) pair, got {point!r}"
            )
        out[party] = point
    return out

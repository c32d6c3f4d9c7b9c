"""Fault injection: parameters for the in-memory transport, and a base for fault wrappers.

:class:`Faults` describes, for one :class:`~fedproto.transports.memory.MemoryNetwork`, which
frames to drop, duplicate or delay, and which parties crash after how many frames. Every draw
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

__all__ = ["DelegatingTransport", "Faults"]


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
            as a killed process would end, and its peers find out by its silence.

    Raises:
        ValueError: a probability outside ``[0, 1]``, a negative or infinite delay, or a negative
            ``crash_after`` count.
    """

    seed: int = 0
    drop: float = 0.0
    duplicate: float = 0.0
    delay_s: float = 0.0
    crash_after: dict[str, int] = dataclasses.field(default_factory=dict)

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

"""The transport interface: move opaque frames between named parties.

A transport endpoint belongs to one party. It sends a frame (``bytes``) to another party of the
run's roster and receives ``(sender, frame)`` pairs, where ``sender`` is established by the
transport itself (authenticated where the transport can), never read from the frame body.

Contract (checked for every transport by :mod:`fedproto.testing.conformance`):

* frames from one sender to one receiver arrive in the order they were sent, unmodified;
* empty frames and frames up to the configured maximum are delivered;
* ``send`` to a party outside the roster raises :class:`~fedproto.errors.PeerUnreachable`;
* after ``aclose()``, ``send`` and ``receive`` raise :class:`~fedproto.errors.TransportClosed`;
  ``aclose()`` is idempotent;
* several tasks may call ``send`` concurrently; frames are never interleaved;
* cancelling a ``receive`` loses no frame; cancelling a ``send`` either delivers the whole frame
  or nothing.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

__all__ = ["Transport", "Network"]


class Transport(abc.ABC):
    """One party's endpoint (an async resource: use ``async with``).

    Attributes:
        party: this endpoint's party name.
        roster: every party of the run, in roster order (this party included).
        framing_overhead_bytes: bytes the transport adds to every frame on the wire (length
            prefixes and the like); payload bytes are metered by the runtime, not here.
    """

    party: str
    roster: tuple[str, ...]
    framing_overhead_bytes: int = 0

    @abc.abstractmethod
    async def send(self, dest: str, frame: bytes) -> None:
        """Deliver ``frame`` to party ``dest``.

        Raises:
            PeerUnreachable: ``dest`` is not in the roster or cannot be reached.
            TransportClosed: this endpoint was closed.
            TransportBroken: the underlying channel failed.
        """

    @abc.abstractmethod
    async def receive(self) -> tuple[str, bytes]:
        """Wait for the next frame from any peer and return ``(sender, frame)``.

        Raises:
            TransportClosed: this endpoint was closed.
            TransportBroken: the underlying channel failed.
        """

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release the endpoint; idempotent."""

    async def __aenter__(self) -> "Transport":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()


class Network(abc.ABC):
    """A factory of connected endpoints for one run (what the CLI registry names).

    ``endpoints(roster)`` is an async context manager that yields a ``dict`` from party name to
    :class:`Transport` for the parties hosted by this process (all of them for the memory
    transport; one for TCP or MPI), and closes them on exit.
    """

    name: str = "abstract"

    @abc.abstractmethod
    def endpoints(self, roster: Sequence[str], local: Sequence[str] | None = None) -> Any:
        """Async context manager yielding ``{party: Transport}`` for the ``local`` parties."""

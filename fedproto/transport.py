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
  or nothing;
* ``receive_nowait`` (optional) returns a frame already waiting, or ``None``, without waiting;
* ``receive`` and ``receive_nowait`` may (optional) raise :class:`~fedproto.errors.PeerDropped`
  once per peer the transport knows is gone for good, after the frames that peer sent before it
  left; the endpoint stays usable. The runtime turns it into a
  :class:`~fedproto.messages.PartyDropped` event. The memory transport raises it when built with
  ``report_drops=True``; TCP and MPI never do (they see only a peer's silence, which the runtime's
  deadlines catch).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
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
            PeerDropped: optional: a peer is gone for good (raised once per peer; the next call
                returns the next frame). Transports that cannot tell never raise it.
        """

    def receive_nowait(self) -> tuple[str, bytes] | None:
        """The next frame already delivered to this endpoint, without waiting, else ``None``.

        The runtime calls it when a phase deadline passes, so frames that arrived while the party
        was busy are read before the deadline counts as silence. It never blocks or yields to the
        event loop, and a frame it returns is not returned again by :meth:`receive`. The default
        returns ``None`` (a transport that cannot tell); transports whose frames wait in a local
        queue should override it.

        Raises:
            TransportClosed: this endpoint was closed.
            PeerDropped: optional, as for :meth:`receive`.
        """
        return None

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release the endpoint; idempotent."""

    async def __aenter__(self) -> "Transport":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()


class Network(abc.ABC):
    """A factory of connected endpoints for one run (what the CLI registry names).

    Every network, memory included, opens its endpoints the same way::

        async with network.endpoints(roster, local=["alice"]) as endpoints:
            transport = endpoints["alice"]

    :meth:`endpoints` is an async context manager yielding ``{party: Transport}`` for the ``local``
    parties hosted by this process (all of them for the memory transport and in-process TCP; one
    for TCP across processes or MPI), and closing them on exit.
    :func:`~fedproto.runtime.run_parties` also accepts a network and does this itself.

    Attributes:
        name: the network's registry name (``"memory"``, ``"tcp"``, ``"mpi"``).
        roster: the parties the network was built for, when it knows them (then ``endpoints()``
            needs no ``roster``); ``None`` when ``endpoints()`` must be told.
    """

    name: str = "abstract"
    roster: tuple[str, ...] | None = None

    @abc.abstractmethod
    def endpoints(
        self, roster: Sequence[str] | None = None, local: Sequence[str] | None = None
    ) -> AbstractAsyncContextManager[dict[str, Any]]:
        """Open the endpoints of the ``local`` parties.

        Args:
            roster: every party of the run, in order (default: :attr:`roster`).
            local: the parties this process hosts (default: every party of the roster).

        Returns:
            An async context manager yielding ``{party: Transport}`` for the ``local`` parties,
            which closes them on exit.

        Raises:
            ValueError: the roster is missing or disagrees with the network's, or ``local`` names
                parties this network cannot host here.
        """

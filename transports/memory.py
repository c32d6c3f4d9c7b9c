"""In-memory transport: one trio memory channel inbox per party, in one process.

Used for simulations and tests. Every frame is real encoded bytes (the runtime encodes before it
sends), so a simulation meters exactly the payload bytes a TCP or MPI run meters; this transport
adds no framing (``framing_overhead_bytes == 0``).

Optional fault injection (:class:`~fedproto.testing.Faults`, re-exported here), driven by one
seeded ``random.Random`` per ``(sender, receiver)`` link, so the faults on a link repeat whatever
order Trio runs tasks in: drop a frame, delay it with ``trio.sleep``, duplicate it, or crash a
party after it has sent N frames (its endpoint then raises
:class:`~fedproto.errors.PartyCrashed` and peers' sends to it are silently lost, as on a real
network).

``MemoryNetwork`` is a :class:`~fedproto.transport.Network`::

    async with MemoryNetwork(["server", "client-0"]).endpoints() as endpoints:
        ...  # {party: MemoryTransport}, closed on exit
"""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import trio

from fedproto.codec import DEFAULT_MAX_FRAME_BYTES
from fedproto.errors import PartyCrashed, PeerUnreachable, TransportClosed
from fedproto.testing.faults import Faults
from fedproto.transport import Network, Transport

__all__ = ["Faults", "MemoryNetwork", "MemoryTransport"]


class MemoryNetwork(Network):
    """A set of connected in-memory endpoints for one roster (all parties in this process).

    Args:
        roster: every party of the run (unique names).
        max_frame_bytes: frames longer than this are refused by ``send``.
        faults: optional fault injection.
        latency_s: a fixed delay every ``send`` sleeps before delivering (to model a network,
            e.g. FastLloyd's 0.25 ms per send, spec 4.3); order is kept.

    Raises:
        ValueError: the roster is empty or has duplicates.
    """

    name = "memory"
    description = "every party a task in this process (simulation and tests; every frame encoded and metered)"

    def __init__(
        self,
        roster: Sequence[str],
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        faults: Faults | None = None,
        latency_s: float = 0.0,
    ) -> None:
        if not (latency_s >= 0.0 and math.isfinite(latency_s)):
            raise ValueError("latency_s must be a finite non-negative number of seconds")
        roster = tuple(str(p) for p in roster)
        if not roster or len(set(roster)) != len(roster):
            raise ValueError("the roster must be a non-empty list of unique party names")
        self.roster = roster
        self.max_frame_bytes = max_frame_bytes
        self.faults = faults
        self.latency_s = latency_s
        self._rngs: dict[tuple[str, str], random.Random] = {}
        self._channels = {p: trio.open_memory_channel[tuple[str, bytes]](math.inf) for p in roster}
        self._endpoints: dict[str, MemoryTransport] = {}
        self._nursery: trio.Nursery | None = None

    def endpoint(self, party: str) -> "MemoryTransport":
        """The endpoint of ``party`` (created once).

        Raises:
            PeerUnreachable: ``party`` is not in the roster.
        """
        if party not in self._channels:
            raise PeerUnreachable(f"{party!r} is not in the roster", party=party)
        if party not in self._endpoints:
            self._endpoints[party] = MemoryTransport(self, party)
        return self._endpoints[party]

    @asynccontextmanager
    async def endpoints(
        self, roster: Sequence[str] | None = None, local: Sequence[str] | None = None
    ) -> AsyncIterator[dict[str, "MemoryTransport"]]:
        """The endpoints of the ``local`` parties, closed on exit (see :meth:`Network.endpoints`).

        Args:
            roster: the run's roster; if given it must equal the network's.
            local: the parties to open (default: every party of the roster, in roster order).

        Yields:
            ``{party: MemoryTransport}`` in the order of ``local``.

        Raises:
            ValueError: ``roster`` differs from the network's, or ``local`` names a party outside
                it.
        """
        if roster is not None and tuple(str(p) for p in roster) != self.roster:
            raise ValueError(f"this memory network's roster is {list(self.roster)}, not {list(roster)}")
        local = self.roster if local is None else tuple(local)
        outside = [p for p in local if p not in self._channels]
        if outside:
            raise ValueError(f"{outside} are not in this memory network's roster {list(self.roster)}")
        endpoints = {p: self.endpoint(p) for p in local}
        try:
            yield endpoints
        finally:
            with trio.CancelScope(shield=True):
                for endpoint in endpoints.values():
                    await endpoint.aclose()

    def attach_nursery(self, nursery: trio.Nursery) -> None:
        """Give the network a nursery for delayed deliveries (needed only with ``delay_s > 0``)."""
        self._nursery = nursery

    async def _deliver(self, sender: str, dest: str, frame: bytes) -> None:
        endpoint = self._endpoints.get(dest)
        if endpoint is not None and (endpoint._closed or endpoint._crashed):
            return  # like a real network: the frame is lost
        send_channel = self._channels[dest][0]
        try:
            send_channel.send_nowait((sender, frame))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return

    async def _route(self, sender: str, dest: str, frame: bytes) -> None:
        faults = self.faults
        if faults is None:
            await self._deliver(sender, dest, frame)
            return
        rng = self._rngs.get((sender, dest))
        if rng is None:
            rng = self._rngs[(sender, dest)] = random.Random(f"{faults.seed}|{sender}|{dest}")
        if faults.drop and rng.random() < faults.drop:
            return
        copies = 2 if faults.duplicate and rng.random() < faults.duplicate else 1
        for _ in range(copies):
            if faults.delay_s:
                delay = rng.uniform(0.0, faults.delay_s)
                if self._nursery is None:
                    await trio.sleep(delay)
                    await self._deliver(sender, dest, frame)
                else:
                    self._nursery.start_soon(self._delayed, delay, sender, dest, frame)
            else:
                await self._deliver(sender, dest, frame)

    async def _delayed(self, delay: float, sender: str, dest: str, frame: bytes) -> None:
        await trio.sleep(delay)
        await self._deliver(sender, dest, frame)


class MemoryTransport(Transport):
    """One party's in-memory endpoint (see :class:`MemoryNetwork`)."""

    framing_overhead_bytes = 0

    def __init__(self, network: MemoryNetwork, party: str) -> None:
        self.network = network
        self.party = party
        self.roster = network.roster
        self._receive_channel = network._channels[party][1]
        self._closed = False
        self._crashed = False
        self._sent = 0

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosed(f"the endpoint of {self.party} is closed", party=self.party)
        if self._crashed:
            raise PartyCrashed(f"{self.party} crashed (fault injection)", party=self.party)

    async def send(self, dest: str, frame: bytes) -> None:
        """Deliver ``frame`` to ``dest`` (see :meth:`Transport.send`).

        Raises:
            PeerUnreachable: ``dest`` is not in the roster.
            TransportClosed: this endpoint was closed.
            PartyCrashed: this party crashed (fault injection).
            ValueError: the frame exceeds ``max_frame_bytes``.
        """
        self._check_open()
        if dest not in self.network._channels:
            raise PeerUnreachable(f"{dest!r} is not in the roster", party=dest)
        frame = bytes(frame)
        if len(frame) > self.network.max_frame_bytes:
            raise ValueError(
                f"frame of {len(frame)} bytes exceeds the maximum of {self.network.max_frame_bytes}"
            )
        crash_after = self.network.faults.crash_after.get(self.party) if self.network.faults else None
        if crash_after is not None and self._sent >= crash_after:
            self._crashed = True
            self._check_open()
        self._sent += 1
        if self.network.latency_s:
            await trio.sleep(self.network.latency_s)
        else:
            await trio.lowlevel.checkpoint()
        await self.network._route(self.party, dest, frame)

    async def receive(self) -> tuple[str, bytes]:
        """Wait for the next ``(sender, frame)`` (see :meth:`Transport.receive`).

        Raises:
            TransportClosed: this endpoint was closed.
            PartyCrashed: this party crashed (fault injection).
        """
        self._check_open()
        try:
            return await self._receive_channel.receive()
        except trio.ClosedResourceError:
            raise TransportClosed(f"the endpoint of {self.party} is closed", party=self.party) from None

    def receive_nowait(self) -> tuple[str, bytes] | None:
        """The next ``(sender, frame)`` already in the inbox, else ``None``; never waits.

        Raises:
            TransportClosed: this endpoint was closed.
            PartyCrashed: this party crashed (fault injection).
        """
        self._check_open()
        try:
            return self._receive_channel.receive_nowait()
        except trio.WouldBlock:
            return None
        except trio.ClosedResourceError:
            raise TransportClosed(f"the endpoint of {self.party} is closed", party=self.party) from None

    async def aclose(self) -> None:
        """Close this endpoint; pending frames are discarded; idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._receive_channel.aclose()
        await trio.lowlevel.checkpoint()

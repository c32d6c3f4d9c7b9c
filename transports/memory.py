"""In-memory transport: one trio memory channel inbox per party, in one process.

Used for simulations and tests. Every frame is real encoded bytes (the runtime encodes before it
sends), so a simulation meters exactly the payload bytes a TCP or MPI run meters; this transport
adds no framing (``framing_overhead_bytes == 0``).

Optional fault injection (:class:`~fedproto.testing.Faults`, re-exported here), driven by one
seeded ``random.Random`` per ``(sender, receiver)`` link, so the faults on a link repeat whatever
order Trio runs tasks in: drop a frame, delay it with ``trio.sleep``, duplicate it, or crash a
party after it has sent N frames or at its first frame of a given phase and round (its endpoint
then raises :class:`~fedproto.errors.PartyCrashed` and peers' sends to it are silently lost, as on
a real network). With ``report_drops=True`` the network also tells every other party that a
crashed party is gone: their next ``receive`` raises :class:`~fedproto.errors.PeerDropped` (the
runtime turns it into a :class:`~fedproto.messages.PartyDropped` event), as a transport with
heartbeats or a membership service would; by default peers find out only by its silence.

``MemoryNetwork`` is a :class:`~fedproto.transport.Network`::

    async with MemoryNetwork(["server", "client-0"]).endpoints() as endpoints:
        ...  # {party: MemoryTransport}, closed on exit
"""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import msgpack
import trio

from fedproto.codec import DEFAULT_MAX_FRAME_BYTES, decode_frame
from fedproto.errors import DecodeError, PartyCrashed, PeerDropped, PeerUnreachable, TransportClosed
from fedproto.testing.faults import Faults
from fedproto.transport import Network, Transport

__all__ = ["Faults", "MemoryNetwork", "MemoryTransport"]

#: Bytes of a frame read first when looking for its envelope's phase and round (the envelope
#: comes before the body, see :func:`~fedproto.codec.encode_frame`); the whole frame is read only
#: when a long phase name does not fit.
_ENVELOPE_PEEK_BYTES = 256


class _Dropped:
    """What a crashed party leaves in the others' inboxes when drops are reported."""

    __slots__ = ()


_DROPPED = _Dropped()


def _envelope_phase_round(frame: bytes) -> tuple[str, int] | None:
    """The ``(phase, round_idx)`` of a frame's envelope, read without decoding the body.

    :func:`~fedproto.codec.encode_frame` writes the envelope's keys before the body, so this
    reads a few dozen bytes whatever the frame's size; a frame whose body comes first is decoded
    whole instead.

    Returns:
        ``None`` for bytes that are not a fedproto frame (a test's raw bytes, say).
    """
    for prefix in (frame[:_ENVELOPE_PEEK_BYTES], frame):
        fields: dict[str, object] = {}
        try:
            unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(prefix), 1))
            unpacker.feed(prefix)
            for _ in range(unpacker.read_map_header()):
                key = unpacker.unpack()
                if key == "b":  # the body: everything needed came before it, or it is not there
                    break
                fields[key] = unpacker.unpack()
        except msgpack.OutOfData:
            if len(prefix) < len(frame):
                continue
            return None
        except Exception:  # not msgpack, not a map, unhashable keys: not a fedproto frame
            return None
        phase, round_idx = fields.get("p"), fields.get("r")
        if isinstance(phase, str) and isinstance(round_idx, int) and not isinstance(round_idx, bool):
            return phase, round_idx
        if "p" in fields and "r" in fields:
            return None
        # The body came before the envelope (not how encode_frame writes it): decode it all.
        try:
            envelope, _ = decode_frame(frame)
        except DecodeError:
            return None
        return envelope.phase, envelope.round_idx
    return None


class MemoryNetwork(Network):
    """A set of connected in-memory endpoints for one roster (all parties in this process).

    Args:
        roster: every party of the run (unique names).
        max_frame_bytes: frames longer than this are refused by ``send``.
        faults: optional fault injection.
        latency_s: a fixed delay every ``send`` sleeps before delivering (to model a network,
            e.g. FastLloyd's 0.25 ms per send, spec 4.3); order is kept.
        report_drops: when a party crashes (``faults.crash_after`` or ``faults.crash_at``), tell
            every other open endpoint: its next ``receive`` (or ``receive_nowait``) raises
            :class:`~fedproto.errors.PeerDropped` naming the crashed party, once, after the frames
            that party sent before it crashed (except frames still held back by ``delay_s`` with
            a nursery attached, which may arrive after it). Off by default: peers then find out
            by its silence.

    Attributes:
        crashed: ``{party: (phase, round_idx)}`` of the parties that crashed so far, with the
            envelope phase and round of the frame they were sending (``None`` when that frame was
            not a fedproto frame), in the order they crashed.

    Raises:
        ValueError: the roster is empty or has duplicates, or ``faults.crash_at`` names a party
            outside it.
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
        report_drops: bool = False,
    ) -> None:
        if not (latency_s >= 0.0 and math.isfinite(latency_s)):
            raise ValueError("latency_s must be a finite non-negative number of seconds")
        roster = tuple(str(p) for p in roster)
        if not roster or len(set(roster)) != len(roster):
            raise ValueError("the roster must be a non-empty list of unique party names")
        outside = sorted(set(faults.crash_at) - set(roster)) if faults is not None else []
        if outside:
            raise ValueError(f"Faults.crash_at names {outside}, not in the roster {list(roster)}")
        self.roster = roster
        self.max_frame_bytes = max_frame_bytes
        self.faults = faults
        self.latency_s = latency_s
        self.report_drops = bool(report_drops)
        self.crashed: dict[str, tuple[str, int] | None] = {}
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

    def _crash(self, party: str, envelope: tuple[str, int] | None) -> None:
        """Record that ``party`` crashed and, with ``report_drops``, leave word in every other inbox."""
        self.crashed[party] = envelope
        if not self.report_drops:
            return
        for dest in self.roster:
            endpoint = self._endpoints.get(dest)
            if dest == party or (endpoint is not None and (endpoint._closed or endpoint._crashed)):
                continue
            try:
                self._channels[dest][0].send_nowait((party, _DROPPED))  # type: ignore[arg-type]
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                continue

    async def _deliver(self, sender: str, dest: str, frame: bytes) -> None:
        self._deliver_now(sender, dest, frame)

    def _deliver_now(self, sender: str, dest: str, frame: bytes) -> None:
        endpoint = self._endpoints.get(dest)
        if endpoint is not None and (endpoint._closed or endpoint._crashed):
            return  # like a real network: the frame is lost
        try:
            self._channels[dest][0].send_nowait((sender, frame))
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
        if self._closed or self._crashed:
            self._check_open()
        network = self.network
        if dest not in network._channels:
            raise PeerUnreachable(f"{dest!r} is not in the roster", party=dest)
        if type(frame) is not bytes:
            frame = bytes(frame)
        if len(frame) > network.max_frame_bytes:
            raise ValueError(f"frame of {len(frame)} bytes exceeds the maximum of {network.max_frame_bytes}")
        faults = network.faults
        if faults is None and not network.latency_s:
            # The usual case, as a trio memory channel sends: a cancelled send delivers nothing,
            # else the frame is delivered, then the task yields (a schedule point).
            await trio.lowlevel.checkpoint_if_cancelled()
            self._sent += 1
            network._deliver_now(self.party, dest, frame)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        if faults is not None:
            self._maybe_crash(faults, frame)
        self._sent += 1
        if network.latency_s:
            await trio.sleep(network.latency_s)
        else:
            await trio.lowlevel.checkpoint()
        await network._route(self.party, dest, frame)

    def _maybe_crash(self, faults: Faults, frame: bytes) -> None:
        """Crash this party if ``frame`` is where its fault injection says it stops."""
        crash_after = faults.crash_after.get(self.party)
        point = faults.crash_at.get(self.party)
        if crash_after is None and point is None:
            return
        # Only the frames of a party with a crash point are peeked at (envelope only, no body).
        envelope = _envelope_phase_round(frame) if point is not None else None
        if (crash_after is not None and self._sent >= crash_after) or (
            envelope is not None and point is not None and point.matches(*envelope)
        ):
            if point is None:
                envelope = _envelope_phase_round(frame)  # once, for the record
            self._crashed = True
            self.network._crash(self.party, envelope)
            self._check_open()

    def _item(self, item: tuple[str, bytes]) -> tuple[str, bytes]:
        sender, frame = item
        if frame is _DROPPED:
            raise PeerDropped(f"{sender} dropped out (fault injection)", party=sender)
        return item

    async def receive(self) -> tuple[str, bytes]:
        """Wait for the next ``(sender, frame)`` (see :meth:`Transport.receive`).

        Raises:
            TransportClosed: this endpoint was closed.
            PartyCrashed: this party crashed (fault injection).
            PeerDropped: a peer crashed and the network reports drops (``report_drops=True``);
                raised once per crashed peer, after the frames it sent before it crashed.
        """
        if self._closed or self._crashed:
            self._check_open()
        try:
            item = await self._receive_channel.receive()
        except trio.ClosedResourceError:
            raise TransportClosed(f"the endpoint of {self.party} is closed", party=self.party) from None
        if item[1] is _DROPPED:
            return self._item(item)
        return item

    def receive_nowait(self) -> tuple[str, bytes] | None:
        """The next ``(sender, frame)`` already in the inbox, else ``None``; never waits.

        Raises:
            TransportClosed: this endpoint was closed.
            PartyCrashed: this party crashed (fault injection).
            PeerDropped: as for :meth:`receive`.
        """
        self._check_open()
        try:
            item = self._receive_channel.receive_nowait()
        except trio.WouldBlock:
            return None
        except trio.ClosedResourceError:
            raise TransportClosed(f"the endpoint of {self.party} is closed", party=self.party) from None
        return self._item(item)

    async def aclose(self) -> None:
        """Close this endpoint; pending frames are discarded; idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._receive_channel.aclose()
        await trio.lowlevel.checkpoint()

"""A synchronous, I/O-free harness that drives protocol machines against each other.

Messages are routed through the real codec (encode, then decode and validate), delivered in FIFO
order, and metered exactly as the runtime would, so a unit test of a protocol sees the same
bytes a transport would carry, without Trio or sockets::

    harness = Harness({"server": server, "client-0": c0, "client-1": c1}, session=7)
    results = harness.run()
    harness.meter.report(...)

Tests can also step by hand (``deliver_one``), drop or tamper with queued frames, or inject
events.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import Any

from fedproto.codec import decode_frame, encode_frame
from fedproto.machine import ProtocolMachine, check_sessions
from fedproto.messages import Broadcast, Event, Outgoing
from fedproto.metering import Meter

__all__ = ["Harness", "Frame"]


class Frame(collections.namedtuple("Frame", "sender dest data")):
    """A queued frame: ``sender``, ``dest`` and the encoded ``data`` bytes."""


class Harness:
    """Drive machines synchronously.

    Args:
        machines: ``{party: machine}``; every machine's ``party`` must match its key.
        session: session id stamped on every frame; a machine that declares a session must
            declare this one (else :class:`~fedproto.errors.SessionMismatch`, as in the runtime).
        tamper: optional ``frame -> bytes | None`` applied to each frame before delivery
            (``None`` drops it).
    """

    def __init__(
        self,
        machines: Mapping[str, ProtocolMachine],
        *,
        session: int = 0,
        tamper: Callable[[Frame], bytes | None] | None = None,
    ) -> None:
        for party, machine in machines.items():
            if machine.party != party:
                raise ValueError(f"machine for {party!r} says it is {machine.party!r}")
        check_sessions(machines, session)
        self.machines = dict(machines)
        self.session = session
        self.tamper = tamper
        self.queue: collections.deque[Frame] = collections.deque()
        self.meter = Meter()
        self.delivered = 0

    def _enqueue(self, sender: str, outgoing: list[Outgoing]) -> None:
        for action in outgoing:
            data = encode_frame(action.message, session=self.session, round_idx=action.round_idx, phase=action.phase)
            dests = action.dests if isinstance(action, Broadcast) else (action.dest,)
            for dest in dests:
                self.meter.record_sent(action.round_idx, action.phase, sender, dest, type(action.message).TAG, len(data))
                self.queue.append(Frame(sender, dest, data))

    def start(self) -> None:
        """Call ``start()`` on every machine (in mapping order) and queue what they send."""
        for party, machine in self.machines.items():
            self._enqueue(party, machine.start())

    def deliver_one(self) -> Frame | None:
        """Deliver the oldest queued frame; return it (``None`` if the queue is empty).

        Raises:
            whatever the receiving machine raises (it is then in ``ERROR``).
        """
        if not self.queue:
            return None
        frame = self.queue.popleft()
        data = frame.data
        if self.tamper is not None:
            data = self.tamper(frame)
            if data is None:
                return frame
        envelope, message = decode_frame(data)
        machine = self.machines[frame.dest]
        self.delivered += 1
        self._enqueue(frame.dest, machine.receive(frame.sender, message, round_idx=envelope.round_idx))
        return frame

    def inject(self, party: str, event: Event) -> None:
        """Feed a runtime event to ``party``'s machine and queue what it sends."""
        self._enqueue(party, self.machines[party].handle(event))

    def run(self, *, max_frames: int = 10_000_000) -> dict[str, Any]:
        """Start (if needed) and deliver until every machine is done or the queue is empty.

        Returns:
            ``{party: result}`` of the machines that are done.

        Raises:
            RuntimeError: the queue emptied with machines not done (a deadlock), or
                ``max_frames`` was exceeded.
        """
        if not any(m._started for m in self.machines.values()):
            self.start()
        count = 0
        while self.queue:
            self.deliver_one()
            count += 1
            if count > max_frames:
                raise RuntimeError(f"more than {max_frames} frames: is the protocol looping?")
        waiting = [p for p, m in self.machines.items() if not m.done]
        if waiting:
            raise RuntimeError(f"no frames left but {waiting} are not done (deadlock)")
        return {p: m.result() for p, m in self.machines.items()}

"""One star link (a client and the hub) as one side sees it: its numbered frames, acknowledgements and state.

A star link outlives its connections. Each side numbers the frames it sends on the link from 0 and
keeps each one (:attr:`StarPeer.outbox`) until the other side acknowledges it. Numbers are not
written on the wire: TCP keeps order within a connection, and a new connection starts at a number
both sides agree on. Acknowledgements are cumulative ("I have received your first n frames") and
ride in 20-byte control frames of the routed-frame layout (:mod:`fedproto.transports._framing`,
"link control"): an ACK once :data:`ACK_EVERY_FRAMES` frames or :data:`ACK_EVERY_BYTES` bytes have
arrived unacknowledged, which bounds what a sender keeps, and a BYE when a client leaves for good.
"""

from __future__ import annotations

import collections
import dataclasses
import math

import trio

from fedproto.transports._tcp_state import Link

#: A star endpoint acknowledges the frames of a link once this many are unacknowledged ...
ACK_EVERY_FRAMES = 64
#: ... or once they hold this many bytes, so a sender keeps a bounded tail of its frames.
ACK_EVERY_BYTES = 1 << 20


@dataclasses.dataclass(eq=False)
class StarPeer:
    """A star link (a client and the hub) as one side sees it, across the connections that carry it.

    Frames are numbered on the link from 0, in the order this side queues them; the number is not
    written on the wire: TCP keeps order within a connection, and a resumption starts at a number
    both sides agree on. A frame stays in ``outbox`` until the peer acknowledges it
    (cumulatively: "I have received your first n frames"), by an ACK control frame, a BYE, or the
    count it states when the link resumes; frames the peer had not received are then written
    again on the new connection.

    A failure notice (:class:`~fedproto.messages.AbortNotice`) is queued *urgent*: ahead of every
    frame whose writing has not begun (behind earlier urgent ones), so it does not wait behind a
    long queue of relayed frames. Frames never written have no number the peer knows yet, so
    renumbering them is safe; frames written at least in part keep their numbers.

    Attributes:
        name: the party at the other end.
        link_id: the client's random identifier of the link (16 bytes), ``None`` at the hub until
            the client first dials in.
        outbox: ``(route index or None, frame)`` of this side's frames ``acked .. sent - 1``.
        sent: frames queued on the link so far (the next frame's number).
        acked: frames the peer has acknowledged (the first number in ``outbox``).
        written: the next frame to write on the current connection.
        started: frames whose writing began at least once (the most the peer can have received).
        high_written: frames written whole at least once (one below it written again is a re-send).
        received: frames received from the peer.
        ack_sent: the count this side last acknowledged.
        ack_owed_bytes: bytes of frames received since that acknowledgement.
        conn: the current connection, ``None`` between connections.
        generation: counts the connections the hub admitted for this link (a newer one wins).
        connected: a connection was made at least once.
        leaving: a client's graceful end: write what is queued, then a BYE.
        bye_written: the BYE is written.
        ended: why the link is over for good (``None`` while it may resume).
        urgent_end: the number after the last urgent frame queued.
        waiting: the numbers of frames whose ``send`` waits for them to be written (one-item
            lists, moved along when an urgent frame is queued ahead of them).
        heard_at: when this side last heard from the peer (a frame, a control frame, or a
            finished handshake; ``trio.current_time()``).
        echo_owed: at the hub, a client's ACK (its keep-alive, say) awaits an answer: the hub
            writes an ACK of its own unless it writes a frame first.
        changed: set and replaced whenever something above changes.
    """

    name: str
    link_id: bytes | None = None
    outbox: collections.deque[tuple[int | None, bytes]] = dataclasses.field(default_factory=collections.deque)
    sent: int = 0
    acked: int = 0
    written: int = 0
    started: int = 0
    high_written: int = 0
    received: int = 0
    ack_sent: int = 0
    ack_owed_bytes: int = 0
    conn: Link | None = None
    generation: int = 0
    connected: bool = False
    leaving: bool = False
    bye_written: bool = False
    ended: str | None = None
    urgent_end: int = 0
    waiting: list[list[int]] = dataclasses.field(default_factory=list)
    heard_at: float = -math.inf
    echo_owed: bool = False
    changed: trio.Event = dataclasses.field(default_factory=trio.Event)

    def poke(self) -> None:
        """Wake every task waiting on this link."""
        self.changed.set()
        self.changed = trio.Event()

    def queue(self, index: int | None, frame: bytes, *, urgent: bool = False, poke: bool = True) -> int:
        """Queue one frame (route index or ``None``); returns its number.

        An ``urgent`` frame goes ahead of the frames not yet begun, behind earlier urgent ones.
        ``poke=False``: wake nobody (the caller writes the frame itself, or pokes).
        """
        number = self.sent
        if urgent:
            number = max(self.started, self.urgent_end)
            self.urgent_end = number + 1
            for box in self.waiting:
                if box[0] >= number:
                    box[0] += 1
        self.outbox.insert(number - self.acked, (index, frame))
        self.sent += 1
        if poke:
            self.poke()
        return number

    def take_ack(self, count: int) -> bool:
        """The peer has received this side's first ``count`` frames; False if it cannot have."""
        if not self.acked <= count <= self.started:
            return count <= self.acked  # an old acknowledgement (a stale connection's) is harmless
        for _ in range(count - self.acked):
            self.outbox.popleft()
        self.acked = count
        self.written = max(self.written, count)
        self.poke()
        return True

    def frame(self, number: int) -> tuple[int | None, bytes]:
        """The queued frame with this number (``acked <= number < sent``)."""
        return self.outbox[number - self.acked]

    def ack_due(self) -> bool:
        owed = self.received - self.ack_sent
        return owed >= ACK_EVERY_FRAMES or (owed > 0 and self.ack_owed_bytes >= ACK_EVERY_BYTES)

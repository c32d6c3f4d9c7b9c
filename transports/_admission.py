"""What a listening TCP endpoint admits before a handshake: a cap on pending handshakes, a bounded refusal log.

Anyone who can reach a listener can open connections and say nothing; each costs the listener a
file descriptor and a task until its handshake times out. Three things keep a flood of them from
hurting the run:

* :class:`PendingHandshakes` caps the connections whose handshake has not finished, per source
  host (``max_per_host``: a host over its share has its new connection closed at once) and in
  all (``max_total``: when every slot is taken, the connection that has waited longest, the
  most likely to be a silent one, is closed to make room: an honest handshake takes
  milliseconds, so a burst of silent connections cannot lock honest parties out for the
  handshake timeout). The listener never holds more than ``max_total`` pending descriptors.
* :func:`accept_forever` is the accept loop: when the process is out of descriptors (``EMFILE``,
  ``ENFILE``) or kernel buffers (``ENOBUFS``, ``ENOMEM``) it calls back (one rate-limited line, no
  traceback) and backs off (10 ms doubling to 1 s) instead of spinning, until accepting works again.
* :class:`BoundedRefusalLog` bounds the refusal log in all: on top of
  :class:`~fedproto._logging.RateLimitedLog`'s one line per source host and cause, at most
  ``max_lines`` lines per ``interval_s`` whatever the number of hosts; the refusals held back
  beyond that become one summary line, ``"N more refusals from M hosts in the last T s"``.
"""

from __future__ import annotations

import collections
import errno
import logging
import time
from collections.abc import Callable
from typing import Any

import trio

from fedproto._logging import RateLimitedLog

__all__ = [
    "DEFAULT_MAX_PENDING_HANDSHAKES",
    "DEFAULT_MAX_PENDING_PER_HOST",
    "DEFAULT_MAX_REFUSAL_LINES",
    "BoundedRefusalLog",
    "PendingHandshakes",
    "Ticket",
    "accept_forever",
]

#: Most connections a listener holds whose handshake has not finished, in all.
DEFAULT_MAX_PENDING_HANDSHAKES = 512
#: Most of them from one source host (parties on one host, e.g. a local run, share it).
DEFAULT_MAX_PENDING_PER_HOST = 128
#: Most refusal lines a listener writes per interval (10 s), whatever the number of hosts.
DEFAULT_MAX_REFUSAL_LINES = 20

#: The accept errors that mean "out of resources for now": back off, do not fail.
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_FIRST_BACKOFF_S = 0.01
_MAX_BACKOFF_S = 1.0


class Ticket:
    """One connection's pending handshake (from :meth:`PendingHandshakes.admit`).

    Attributes:
        host: its source host.
        evicted: the connection was closed to make room for a newer one (its handshake then
            ends as closed by us: count it as a refusal).
    """

    __slots__ = ("host", "stream", "evicted", "_owner")

    def __init__(self, owner: "PendingHandshakes", host: str, stream: Any) -> None:
        self._owner = owner
        self.host = host
        self.stream = stream
        self.evicted = False

    def release(self) -> None:
        """The handshake is over (done, failed or evicted); idempotent."""
        self._owner._release(self)


class PendingHandshakes:
    """Caps the connections whose handshake has not finished, per source host and in all.

    Args:
        max_total: most pending connections in all (>= 1); the oldest makes room for a new one.
        max_per_host: most pending connections from one host (>= 1); beyond it, new ones are refused.

    Raises:
        ValueError: a cap below 1.
    """

    def __init__(self, max_total: int = DEFAULT_MAX_PENDING_HANDSHAKES, max_per_host: int = DEFAULT_MAX_PENDING_PER_HOST) -> None:
        for name, value in (("max_pending_handshakes", max_total), ("max_pending_per_host", max_per_host)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.max_total = max_total
        self.max_per_host = max_per_host
        self._pending: collections.OrderedDict[Ticket, None] = collections.OrderedDict()  # oldest first
        self._per_host: collections.Counter[str] = collections.Counter()

    def __len__(self) -> int:
        return len(self._pending)

    def admit(self, host: str, stream: Any) -> tuple[Ticket | None, Ticket | None]:
        """Admit a new connection from ``host`` to its handshake.

        Returns:
            ``(ticket, evicted)``: ``ticket`` is ``None`` when ``host`` is at its cap (close the
            connection); ``evicted`` is the oldest pending connection, released here to make
            room when every slot was taken (close its stream).
        """
        if self._per_host[host] >= self.max_per_host:
            return None, None
        evicted = None
        if len(self._pending) >= self.max_total:
            evicted = next(iter(self._pending))
            evicted.evicted = True
            evicted.release()
        ticket = Ticket(self, host, stream)
        self._pending[ticket] = None
        self._per_host[host] += 1
        return ticket, evicted

    def _release(self, ticket: Ticket) -> None:
        if self._pending.pop(ticket, 0) is None:
            self._per_host[ticket.host] -= 1
            if not self._per_host[ticket.host]:
                del self._per_host[ticket.host]


async def accept_forever(
    listener: trio.SocketListener,
    accepted: Callable[[trio.SocketStream], None],
    exhausted: Callable[[OSError], None],
) -> None:
    """Accept connections on ``listener`` for ever, handing each to ``accepted`` (synchronously).

    An accept that fails for lack of descriptors or buffers calls ``exhausted`` and backs off
    (10 ms doubling to 1 s, reset by the next success); trio's own ``serve_listeners`` logs a
    traceback each time instead.

    Returns when the listener is closed under a waiting accept: the endpoint's ``aclose`` cancels
    the serving scope and then closes the sockets at once, and trio wakes the accept with
    ``ClosedResourceError`` before the cancellation reaches it (seen when a run failed right
    after its endpoints opened: the error came out wrapped in a group with this one).

    Raises:
        OSError: any other accept failure.
    """
    backoff = _FIRST_BACKOFF_S
    while True:
        try:
            stream = await listener.accept()
        except trio.ClosedResourceError:
            return  # closed by its endpoint: serving is over
        except OSError as exc:
            if exc.errno not in _EXHAUSTED:
                raise
            exhausted(exc)
            await trio.sleep(backoff)
            backoff = min(2 * backoff, _MAX_BACKOFF_S)
            continue
        backoff = _FIRST_BACKOFF_S
        accepted(stream)


class _Gate:
    """The logger the per-host limiter writes to: every line goes through the bound in all."""

    def __init__(self, owner: "BoundedRefusalLog") -> None:
        self.owner = owner

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 (the logging API's name)
        return self.owner.logger.isEnabledFor(level)

    def log(self, level: int, message: str, *args: Any) -> None:
        self.owner._line(level, message, args)


class _PerHost(RateLimitedLog):
    """The per-``(host, cause)`` limiter, telling its owner which host a summary line is about."""

    def __init__(self, owner: "BoundedRefusalLog", **kwargs: Any) -> None:
        super().__init__(_Gate(owner), owner.subject, **kwargs)  # type: ignore[arg-type]
        self.owner = owner

    def _summarise(self, key: tuple[str, str], entry: Any, now: float) -> None:
        if not entry.suppressed:
            return
        current = self.owner._host, self.owner._events
        self.owner._host, self.owner._events = key[0], entry.suppressed
        try:
            super()._summarise(key, entry, now)
        finally:
            self.owner._host, self.owner._events = current


class BoundedRefusalLog:
    """Refusal lines per source host and cause, as :class:`~fedproto._logging.RateLimitedLog`, and a bound in all.

    Per ``(host, cause)`` the first refusal is logged in full, then a summary per interval; on
    top of that at most ``max_lines`` lines are written per ``interval_s``, however many hosts
    refuse: what is held back beyond that is counted, and written as one line,
    ``"<subject>: N more refusals from M hosts in the last T s"``, before the next line let
    through (or at :meth:`flush`). So a flood from many addresses costs at most
    ``max_lines + 1`` lines per interval.

    Args:
        logger: where lines go.
        subject: who refuses (a party name), leading every line of its own.
        interval_s: the interval of both bounds (seconds, > 0).
        max_lines: most lines per interval in all (>= 1).
        level: the logging level of every line.
        clock: the time source in seconds (``trio.current_time`` inside a Trio run).
        max_keys: most ``(host, cause)`` keys remembered at once (> 0).

    Raises:
        ValueError: ``max_lines``, ``interval_s`` or ``max_keys`` not positive.
    """

    def __init__(
        self,
        logger: logging.Logger,
        subject: str,
        *,
        interval_s: float = 10.0,
        max_lines: int = DEFAULT_MAX_REFUSAL_LINES,
        level: int = logging.WARNING,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 1024,
    ) -> None:
        if isinstance(max_lines, bool) or not isinstance(max_lines, int) or max_lines < 1:
            raise ValueError(f"max_lines must be a positive int, got {max_lines!r}")
        self.logger = logger
        self.subject = subject
        self.level = level
        self.clock = clock
        self.max_lines = max_lines
        self._per_host = _PerHost(self, interval_s=interval_s, level=level, clock=clock, max_keys=max_keys)
        self.interval_s = self._per_host.interval_s
        self._window_start: float | None = None  # the clock may need a Trio run: read it first when logging
        self._lines = 0  # lines written in the current window
        self._held = 0  # refusals held back since the last summary
        self._held_hosts: set[str] = set()
        self._held_since: float | None = None
        self._host = ""  # the host of the line being logged
        self._events = 1  # the refusals that line stands for

    def log(self, peer: str, cause: str, message: str, *args: Any) -> None:
        """Record one refusal of ``cause`` from ``peer`` (a host); ``message % args`` is its full line."""
        self._host, self._events = peer, 1
        self._per_host.log(peer, cause, message, *args)

    def flush(self) -> None:
        """Write the pending summaries (per host, within the bound), then the count held back."""
        self._per_host.flush()
        self._summary(self.clock())

    def _line(self, level: int, message: str, args: tuple[Any, ...]) -> None:
        now = self.clock()
        if self._window_start is None:
            self._window_start = now
        elif now - self._window_start >= self.interval_s:
            self._summary(now)
            self._window_start, self._lines = now, 0
        if self._lines < self.max_lines:
            self._lines += 1
            self.logger.log(level, message, *args)
            return
        if self._held_since is None:
            self._held_since = now
        self._held += self._events
        self._held_hosts.add(self._host)

    def _summary(self, now: float) -> None:
        if not self._held:
            return
        since = self._held_since if self._held_since is not None else now
        self.logger.log(
            self.level,
            "%s: %d more refusals from %d hosts in the last %.1f s",
            self.subject, self._held, len(self._held_hosts), max(0.0, now - since),
        )
        self._held, self._held_hosts, self._held_since = 0, set(), None

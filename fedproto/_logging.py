"""Rate-limited warnings for events a peer can repeat at will (refused frames, refused connections).

A hostile or broken peer can make a party refuse thousands of frames or connections a second;
one log line each would flood the log and cost more than the refusal itself. :class:`RateLimitedLog`
logs the first event of each ``(peer, cause)`` in full, then counts the repeats and writes at most
one summary line per ``interval_s`` for that key, with the count and the latest event::

    c: refused 999 more (undecodable frame) from w2 in the last 10.0 s; latest: c refused a frame ...

:meth:`RateLimitedLog.flush` writes the summaries still pending (call it when the party or
listener stops, so no count is lost). The number of keys is bounded: the oldest key is summarised
and forgotten when a new one would exceed ``max_keys``, so a peer cannot grow the table without
bound either. Callers pass a fixed set of causes (a category, not the error text), so every key
is one peer's one kind of fault.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = ["RateLimitedLog"]


class _Entry:
    __slots__ = ("since", "suppressed", "latest", "latest_args")

    def __init__(self, since: float) -> None:
        self.since = since  # when the last line for this key was written
        self.suppressed = 0
        self.latest = ""
        self.latest_args: tuple[Any, ...] = ()


class RateLimitedLog:
    """One full line per ``(peer, cause)``, then at most one summary line per interval.

    Args:
        logger: where lines go.
        subject: who refuses (a party name), leading every summary line.
        interval_s: shortest time between two lines of the same key (seconds, > 0).
        level: the logging level of every line.
        clock: the time source in seconds (``trio.current_time`` inside a Trio run, so a
            ``MockClock`` drives it in tests).
        max_keys: most ``(peer, cause)`` keys remembered at once (> 0).

    Raises:
        ValueError: ``interval_s`` or ``max_keys`` not positive.
    """

    def __init__(
        self,
        logger: logging.Logger,
        subject: str,
        *,
        interval_s: float = 10.0,
        level: int = logging.WARNING,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 1024,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        if max_keys < 1:
            raise ValueError(f"max_keys must be positive, got {max_keys}")
        self.logger = logger
        self.subject = subject
        self.interval_s = float(interval_s)
        self.level = level
        self.clock = clock
        self.max_keys = max_keys
        self._entries: collections.OrderedDict[tuple[str, str], _Entry] = collections.OrderedDict()

    def log(self, peer: str, cause: str, message: str, *args: Any) -> None:
        """Record one event of ``cause`` from ``peer``; ``message % args`` is its full line.

        The line is written if it is the first of its key or the key's interval has passed
        (then as a summary with the count, when repeats were held back); otherwise it is counted.
        Formatting is deferred, so a held-back event costs a dictionary lookup.
        """
        if not self.logger.isEnabledFor(self.level):
            return
        key = (peer, cause)
        now = self.clock()
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= self.max_keys:
                old_key, old_entry = self._entries.popitem(last=False)
                self._summarise(old_key, old_entry, now)
            self._entries[key] = _Entry(now)
            self.logger.log(self.level, message, *args)
            return
        if now - entry.since < self.interval_s:
            entry.suppressed += 1
            entry.latest, entry.latest_args = message, args
            return
        if entry.suppressed:
            entry.suppressed += 1
            entry.latest, entry.latest_args = message, args
            self._summarise(key, entry, now)
        else:
            self.logger.log(self.level, message, *args)
        entry.since = now

    def flush(self) -> None:
        """Write the summary of every key with held-back events, and forget all keys."""
        now = self.clock()
        while self._entries:
            key, entry = self._entries.popitem(last=False)
            self._summarise(key, entry, now)

    def _summarise(self, key: tuple[str, str], entry: _Entry, now: float) -> None:
        if not entry.suppressed:
            return
        peer, cause = key
        self.logger.log(
            self.level,
            "%s: refused %d more (%s) from %s in the last %.1f s; latest: %s",
            self.subject,
            entry.suppressed,
            cause,
            peer,
            max(0.0, now - entry.since),
            entry.latest % entry.latest_args if entry.latest_args else entry.latest,
        )
        entry.suppressed = 0

"""SIGINT and SIGTERM that end a process's run in order: its record first, then the exit the signal asks for.

A ``fedproto party`` that is stopped (by its operator, by the launcher of a TCP run, by a service
manager) must still leave its party report and its pending log counts. :class:`SignalGuard`
covers the whole life of the run in one process, in three stretches:

* **Outside the event loop** (building the machine and the endpoint, before ``trio.run``), its
  handler records the signal and raises :class:`Interrupted` where the program is, so the caller's
  ``except``/``finally`` blocks run.
* **Inside the event loop**, :meth:`SignalGuard.run` listens with
  :func:`trio.open_signal_receiver` and cancels the run's body: every ``finally`` of the body runs
  (the endpoints close, which flushes their rate-limited refusal logs and makes their byte counts
  final) and the body returns ``None``; the caller then sees :attr:`SignalGuard.signum`. A signal
  that arrives while the loop starts or stops is only recorded (raising inside Trio's own code
  could leave the loop in a bad state) and handled the same way.
* **While the record is written** (after :meth:`SignalGuard.hold`), signals are only recorded, so
  a second SIGTERM cannot cut the report file short.

Then :func:`exit_by_signal` ends the process as the signal would have: SIGTERM's default action is
restored and the signal raised again, so a parent still sees "killed by SIGTERM" (exit status -15
from :mod:`subprocess`); SIGINT gives 130, the status the CLI gives a ``KeyboardInterrupt``.

``fedproto run`` of an in-process or MPI run takes the other road, :func:`sigterm_interrupts`:
SIGTERM is passed on to SIGINT's handler, so Trio (or Python outside Trio) raises
``KeyboardInterrupt`` at a safe point and the run's caller writes the ``interrupted`` report from
the meter as it stands; :class:`Terminated` then carries the exit status 128 + SIGTERM.

Only the main thread can handle signals; in any other thread nothing is installed and signals
keep their usual effect.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TypeVar

import trio

__all__ = [
    "Interrupted",
    "SignalGuard",
    "Terminated",
    "exit_by_signal",
    "signal_name",
    "sigterm_interrupts",
    "write_json",
]

#: The signals that interrupt a run.
SIGNALS = (signal.SIGINT, signal.SIGTERM)

T = TypeVar("T")


def signal_name(signum: int) -> str:
    """``"SIGTERM"`` for ``signal.SIGTERM``, ``"signal 42"`` for a number without a name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Interrupted(Exception):
    """SIGINT or SIGTERM ended the run (the ``type`` of an interrupted run's report ``error``).

    Attributes:
        signum: the signal's number.
        signal_name: its name, ``"SIGINT"`` or ``"SIGTERM"``.
    """

    def __init__(self, signum: int, message: str | None = None) -> None:
        self.signum = signum
        self.signal_name = signal_name(signum)
        super().__init__(message or f"interrupted by {self.signal_name}")


class SignalGuard:
    """Context manager: SIGINT/SIGTERM end the run in order instead of killing the process.

    See the module docstring for the three stretches it covers.

    Attributes:
        received: the signals received while inside, in order.
        cancelled: whether a signal cancelled the body of :meth:`run`.
        installed: whether handlers were installed (main thread only).
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self.installed = False
        self.cancelled = False
        self._armed = True
        self._previous: dict[int, Any] = {}

    @property
    def signum(self) -> int | None:
        """The first signal received, or ``None``."""
        return self.received[0] if self.received else None

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
            self.installed = True
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for sig, old in self._previous.items():
            signal.signal(sig, old)
        self._previous = {}
        self.installed = False

    def hold(self) -> None:
        """From now on only record signals (the run is over; its record is being written)."""
        self._armed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if self._armed and len(self.received) == 1 and not trio.lowlevel.in_trio_run():
            self._armed = False
            raise Interrupted(signum)

    async def run(self, body: Callable[[], Awaitable[T]]) -> T | None:
        """Await ``body()`` inside ``trio.run``; a signal cancels it and this returns ``None``.

        The body's exceptions come out as themselves (not wrapped in an exception group).
        Without installed handlers (not the main thread) the body just runs.
        """
        if not self.installed:
            return await body()
        result: T | None = None
        error: Exception | None = None
        with trio.open_signal_receiver(*SIGNALS) as signals:
            async with trio.open_nursery() as nursery:
                scope = trio.CancelScope()

                async def watch() -> None:
                    async for signum in signals:
                        self.received.append(signum)
                        scope.cancel()
                        return

                if self.received:  # arrived while the loop was starting
                    scope.cancel()
                nursery.start_soon(watch)
                with scope:
                    try:
                        result = await body()
                    except Exception as exc:  # raised again below, outside the nursery (not in a group)
                        error = exc
                self.cancelled = scope.cancelled_caught
                nursery.cancel_scope.cancel()
        if error is not None:
            raise error
        return result


class Terminated(KeyboardInterrupt):
    """SIGTERM interrupted ``fedproto run`` (exit status 128 + SIGTERM, as a shell reports a
    process that SIGTERM killed)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def sigterm_interrupts(received: list[int]) -> Iterator[None]:
    """While inside, SIGTERM interrupts as SIGINT does and is appended to ``received``.

    The handler passes the signal on to SIGINT's handler, so inside ``trio.run`` Trio raises the
    ``KeyboardInterrupt`` where it is safe to (never inside its own bookkeeping), and outside it
    Python's default handler raises it at once. The previous handler is restored on the way out.
    Only the main thread can install handlers; elsewhere nothing is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        received.append(signum)
        interrupt = signal.getsignal(signal.SIGINT)
        if callable(interrupt):
            interrupt(signal.SIGINT, frame)
        else:  # SIGINT ignored (a background job): SIGTERM still ends the run
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def exit_by_signal(signum: int) -> int:
    """End the process as ``signum`` would have, after its record is written.

    SIGTERM: restore the default action and raise it again (the process ends "killed by
    SIGTERM"); this returns only off the main thread, with 128 + 15. SIGINT: returns 130.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    if signum == signal.SIGTERM and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)
    return 130 if signum == signal.SIGINT else 128 + signum


def write_json(path: str | os.PathLike[str], doc: Any) -> None:
    """Write ``doc`` as JSON to ``path`` whole or not at all (a temporary file beside it, then
    renamed over it), so a reader never finds a report cut short by a kill.

    Raises:
        OSError: the directory cannot be written.
    """
    target = Path(path)
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(doc, out)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise

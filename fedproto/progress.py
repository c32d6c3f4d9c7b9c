"""Progress of the long phases of a run (baselines, timed replays, retrains, protocol rounds).

Library code reports progress without knowing who, if anyone, is watching::

    from fedproto.progress import progress_task

    with progress_task("K-FED baseline", total=len(requests)) as advance:
        for request in requests:
            ...
            advance()

:func:`progress_task` is a no-op unless a front end installed a display for the current context
(:func:`progress_display` for a rich progress bar on stderr, as ``fedproto run`` does, or
:func:`use_display` for any object with rich's ``add_task``/``advance``/``remove_task``). The
display lives in a :class:`contextvars.ContextVar`, so Trio tasks started inside see it, while
plain threads (which start from an empty context) do not: report from the thread that installed
the display, or from a Trio task below it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["ProgressDisplay", "progress_task", "use_display", "progress_display", "current_display"]


class ProgressDisplay(Protocol):
    """What a display must offer (:class:`rich.progress.Progress` does)."""

    def add_task(self, description: str, *, total: float | None = ...) -> Any:
        """Show a new task; returns its id."""

    def advance(self, task_id: Any, advance: float = 1) -> None:
        """Add ``advance`` steps to a task."""

    def remove_task(self, task_id: Any) -> None:
        """Stop showing a task."""


_DISPLAY: contextvars.ContextVar[ProgressDisplay | None] = contextvars.ContextVar(
    "fedproto_progress_display", default=None
)


def current_display() -> ProgressDisplay | None:
    """The display installed for the current context, or ``None``."""
    return _DISPLAY.get()


def _no_progress(n: int = 1) -> None:
    """Accept and ignore progress (no display is installed)."""


@contextmanager
def progress_task(description: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
    """Show one task while the ``with`` block runs; yields ``advance(n=1)``.

    Args:
        description: what is being done, e.g. ``"K-FED baseline"``.
        total: steps the task takes (``advance`` counts them), or ``None`` when unknown (the
            display shows activity and elapsed time only).

    Yields:
        ``advance(n=1)``: record ``n`` more steps done. Without a display it does nothing.
    """
    display = _DISPLAY.get()
    if display is None:
        yield _no_progress
        return
    task_id = display.add_task(description, total=total)

    def advance(n: int = 1) -> None:
        display.advance(task_id, n)

    try:
        yield advance
    finally:
        display.remove_task(task_id)


@contextmanager
def use_display(display: ProgressDisplay | None) -> Iterator[ProgressDisplay | None]:
    """Install ``display`` for the current context while the ``with`` block runs.

    ``None`` switches progress off inside the block (e.g. an inner computation whose progress
    would only clutter its caller's).
    """
    token = _DISPLAY.set(display)
    try:
        yield display
    finally:
        _DISPLAY.reset(token)


@contextmanager
def progress_display(console: Console | None = None, *, enabled: bool = True) -> Iterator[ProgressDisplay | None]:
    """Show every :func:`progress_task` of the block as a rich progress bar.

    The bars are transient (they disappear when the block ends) and drawn on ``console``, by
    default a new console on stderr, so stdout keeps only results. On a console that is not a
    terminal nothing is drawn.

    Args:
        console: where to draw (default: ``rich.console.Console(stderr=True)``).
        enabled: ``False`` installs no display (``--quiet``): every task is a no-op.

    Yields:
        The :class:`rich.progress.Progress` installed, or ``None`` when disabled.
    """
    if not enabled:
        with use_display(None):
            yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    progress = Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console if console is not None else Console(stderr=True),
        transient=True,
    )
    with progress, use_display(progress):
        yield progress

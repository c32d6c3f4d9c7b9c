"""Progress reporting: a no-op without a display, one task per ``progress_task`` with one, seen by
Trio tasks below the code that installed it, and drawn by rich on a terminal."""

from __future__ import annotations

import io

import pytest
import trio
from rich.console import Console

from fedproto.progress import current_display, progress_display, progress_task, use_display


class RecordingDisplay:
    """Stands in for rich's Progress and records what it was asked to show."""

    def __init__(self) -> None:
        self.tasks: dict[int, dict] = {}
        self.open: set[int] = set()

    def add_task(self, description: str, *, total: float | None = None) -> int:
        task_id = len(self.tasks)
        self.tasks[task_id] = {"description": description, "total": total, "completed": 0}
        self.open.add(task_id)
        return task_id

    def advance(self, task_id: int, advance: float = 1) -> None:
        assert task_id in self.open, "advanced a task that was removed"
        self.tasks[task_id]["completed"] += advance

    def remove_task(self, task_id: int) -> None:
        self.open.remove(task_id)


def test_without_a_display_progress_is_a_no_op():
    assert current_display() is None
    with progress_task("nothing watches", total=3) as advance:
        advance()
        advance(2)


def test_tasks_are_shown_advanced_and_removed_even_on_error():
    display = RecordingDisplay()
    with use_display(display):
        assert current_display() is display
        with progress_task("baseline", total=4) as advance:
            for _ in range(3):
                advance()
            advance(1)
        with pytest.raises(RuntimeError), progress_task("retrain") as advance:
            advance()
            raise RuntimeError("boom")
        with use_display(None), progress_task("hidden") as advance:  # switched off inside
            advance()
    assert current_display() is None
    assert [t["description"] for t in display.tasks.values()] == ["baseline", "retrain"]
    assert display.tasks[0] == {"description": "baseline", "total": 4, "completed": 4}
    assert display.tasks[1] == {"description": "retrain", "total": None, "completed": 1}
    assert display.open == set()


def test_trio_tasks_below_the_display_report_to_it():
    display = RecordingDisplay()

    async def worker(i: int) -> None:
        with progress_task(f"party {i}", total=2) as advance:
            await trio.sleep(0)
            advance(2)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(worker, i)

    with use_display(display):
        trio.run(main)
    assert sorted(t["description"] for t in display.tasks.values()) == ["party 0", "party 1", "party 2"]
    assert all(t["completed"] == 2 for t in display.tasks.values())


def test_rich_display_draws_on_a_terminal_and_can_be_disabled():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with progress_display(console) as display:
        assert current_display() is display is not None
        with progress_task("K-FED baseline", total=5) as advance:
            advance(5)
            display.refresh()
    assert "K-FED baseline" in out.getvalue() and "5/5" in out.getvalue()
    assert current_display() is None
    with progress_display(console, enabled=False) as display:
        assert display is None and current_display() is None

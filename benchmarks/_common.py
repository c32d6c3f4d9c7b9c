"""Shared helpers of the benchmark scripts (not a benchmark itself).

What lives here:

* the options every script shares (``--quick``: a smoke-sized run of a few seconds; ``--json PATH``:
  also write the script's table(s) as a list of records) and the record writer behind ``--json``;
* machine facts (Python, NumPy, JAX, Trio, msgpack versions, CPU count, load average at start),
  printed once at the top of every script;
* a rich console that keeps tables on one line when the output is not a terminal;
* timing helpers (best-of-N, median) and ratio formatting with a target;
* ``--profile`` output: a cProfile's own time per message (or round trip) grouped by area (trio,
  runtime loop, transport, codec, meter, machines, system calls), the scheduler passes and socket
  calls per unit, and the top functions;
* FastLloyd-sized payload shapes (``uint32 [rows, cols]`` arrays of 24 B, 1 KiB and 64 KiB);
* two tiny sans-IO protocols used by the message-rate benchmarks: a request/response
  :class:`PingMachine`/:class:`PongMachine` pair, and a :class:`StreamSource`/:class:`StreamSink`
  pair that streams bursts of messages with one acknowledgement per burst. The requests are
  FastLloyd's own :class:`~fedproto.algorithms.fastlloyd.messages.MaskedUpdate`, the responses its
  :class:`~fedproto.algorithms.fastlloyd.messages.NoisyAggregate`, so the codec path is the real one.

The scripts are run from the repository root as ``python benchmarks/<name>.py``; the script's own
directory is then first on ``sys.path``, which is how they import this module.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from fedproto.algorithms.fastlloyd.messages import MaskedUpdate, NoisyAggregate
from fedproto.errors import RemoteProtocolError
from fedproto.machine import ProtocolMachine, machine_states
from fedproto.messages import Message, Outgoing

__all__ = [
    "CLOCKS",
    "PAYLOAD_SHAPES",
    "RECORD_KEY",
    "PingMachine",
    "PongMachine",
    "StreamAck",
    "StreamSink",
    "StreamSource",
    "add_common_arguments",
    "best_of",
    "fmt_bytes",
    "fmt_ratio",
    "machine_facts",
    "make_console",
    "median",
    "parse_args",
    "payload_array",
    "pingpong_codec_meter",
    "pingpong_encoded",
    "print_machine_facts",
    "print_profile",
    "profile_area",
    "record",
    "timed",
    "write_records",
]

#: FastLloyd-sized payloads: ``uint32 [rows, cols]``. 24 B is one update of k = 2, d = 2
#: (``[k, d+1]``); 1 KiB and 64 KiB are larger k or d.
PAYLOAD_SHAPES: dict[str, tuple[int, int]] = {
    "24 B": (2, 3),
    "1 KiB": (16, 16),
    "64 KiB": (1024, 16),
}


async def pingpong_encoded(a: Any, b: Any, array: np.ndarray, rounds: int, session: int) -> float:
    """Seconds for ``rounds`` request/response pairs between endpoints ``a`` and ``b`` carrying
    pre-encoded FastLloyd frames (the transport alone: no codec, meter or machine)."""
    import trio

    from fedproto.codec import encode_frame

    request = encode_frame(MaskedUpdate(masked=array), session=session, round_idx=0, phase="ping")
    response = encode_frame(NoisyAggregate(masked=array), session=session, round_idx=0, phase="pong")

    async def requester() -> None:
        for _ in range(rounds):
            await a.send(b.party, request)
            await a.receive()

    async def responder() -> None:
        for _ in range(rounds):
            await b.receive()
            await b.send(a.party, response)

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(responder)
        nursery.start_soon(requester)
    return time.perf_counter() - t0


async def pingpong_codec_meter(
    a: Any, b: Any, array: np.ndarray, rounds: int, session: int, *, check_shape: bool = False
) -> float:
    """Seconds for ``rounds`` request/response pairs on the runtime's per-message path, without
    machines or the runtime loop.

    ``encode_frame -> transport.send -> meter.record_sent`` on the sending side and
    ``transport.receive -> decode_frame`` on the receiving side, as ``_send_all`` and ``run_party``
    do: ``a`` sends a FastLloyd ``MaskedUpdate`` of ``array`` (phase ``ping``), ``b`` answers a
    ``NoisyAggregate`` of what it decoded (phase ``pong``). ``check_shape``: ``a`` also asserts the
    answer's shape (``AssertionError`` if it differs).
    """
    import trio

    from fedproto.codec import decode_frame, encode_frame
    from fedproto.metering import Meter

    meter = Meter(trio.current_time)

    async def requester() -> None:
        for i in range(rounds):
            frame = encode_frame(MaskedUpdate(masked=array), session=session, round_idx=i, phase="ping")
            await a.send("b", frame)
            meter.record_sent(i, "ping", "a", "b", MaskedUpdate.TAG, len(frame), a.framing_overhead_bytes)
            _, reply = await a.receive()
            _, message = decode_frame(reply)
            assert not check_shape or message.masked.shape == array.shape

    async def responder() -> None:
        for i in range(rounds):
            _, frame = await b.receive()
            _, message = decode_frame(frame)
            reply = encode_frame(NoisyAggregate(masked=message.masked), session=session, round_idx=i, phase="pong")
            await b.send("a", reply)
            meter.record_sent(i, "pong", "b", "a", NoisyAggregate.TAG, len(reply), b.framing_overhead_bytes)

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(responder)
        nursery.start_soon(requester)
    return time.perf_counter() - t0


def payload_array(shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    """A deterministic ``uint32`` array of ``shape`` (random ring elements, as masked updates are)."""
    return np.random.default_rng(seed).integers(0, 2**32, size=shape, dtype=np.uint32)


# --- facts, console, formatting ---------------------------------------------------------------------


def machine_facts() -> dict[str, str]:
    """Versions and CPU facts of this machine (what the numbers were measured on)."""
    import jax
    import msgpack
    import trio

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 0
    return {
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu count (os / usable)": f"{os.cpu_count()} / {usable}",
        "numpy": np.__version__,
        "jax": f"{jax.__version__} ({jax.default_backend()})",
        "trio": trio.__version__,
        "msgpack": ".".join(str(p) for p in msgpack.version),
        "load average (1/5/15 min)": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def make_console() -> Console:
    """A rich console; 160 columns wide when stdout is not a terminal, so tables do not wrap."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    return console


def print_machine_facts(console: Console, title: str, settings: dict[str, Any] | None = None) -> None:
    """Print the benchmark's title, the machine facts and the run's settings."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("", style="bold")
    table.add_column("")
    for name, value in machine_facts().items():
        table.add_row(name, value)
    for name, value in (settings or {}).items():
        table.add_row(name, str(value))
    console.print(table)


def fmt_ratio(ratio: float, target: float | None = None, *, at_least: bool = True) -> str:
    """``"0.62"``, with `` ok``/`` MISS`` against ``target`` (``>= target`` unless ``at_least=False``)."""
    text = f"{ratio:.2f}"
    if target is None:
        return text
    good = ratio >= target if at_least else ratio <= target
    return f"{text} {'ok' if good else 'MISS'}"


def fmt_bytes(n: float) -> str:
    """Thousands-separated integer bytes."""
    return f"{int(round(n)):,}"


# --- shared options and JSON records -----------------------------------------------------------------

#: A record key: a snake_case identifier with its unit in the name (``ms_per_iteration``,
#: ``payload_bytes``, ``total_s``).
RECORD_KEY = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")

#: The values a record holds.
Scalar = str | int | float | bool | None


#: What ``--clock`` chooses: ``{choice: (timer, how the machine facts name it)}``. ``wall`` reads
#: ``time.perf_counter``; ``cpu`` reads ``time.process_time``, this process's CPU time, which on a
#: machine shared with other work leaves out the time other processes held the CPU (for a script
#: whose measured paths all run in its one thread).
CLOCKS: dict[str, tuple[Callable[[], float], str]] = {
    "wall": (time.perf_counter, "wall (perf_counter)"),
    "cpu": (time.process_time, "process CPU time"),
}


def add_common_arguments(parser: argparse.ArgumentParser, *, quick: str, clock: bool = False) -> None:
    """Add ``--quick`` (help text ``quick``: what the small run does), ``--json PATH`` and, when
    ``clock``, ``--clock wall|cpu`` (default ``wall``; ``CLOCKS[args.clock]`` is the timer and
    its name)."""
    if clock:
        parser.add_argument(
            "--clock", choices=tuple(CLOCKS), default="wall",
            help="time with the wall clock (default) or this process's CPU time (for a machine shared with other work)",
        )
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument(
        "--json", metavar="PATH", type=Path, default=None,
        help="also write the table(s) here as a JSON array of records: one flat object per row, "
        "snake_case keys with units, the table's name under 'table'",
    )


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, then refuse (exit 2) a ``--json`` path whose directory does not
    exist, before anything is measured."""
    args = parser.parse_args(argv)
    path = getattr(args, "json", None)
    if path is not None and not path.resolve().parent.is_dir():
        parser.error(f"--json: the directory {path.resolve().parent} does not exist")
    return args


def _scalar(value: Any) -> Scalar:
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        value = float(value)
        return value if math.isfinite(value) else None
    raise TypeError(f"a record value must be a str, int, float, bool or None, not {type(value).__name__}")


def record(table: str, **fields: Any) -> dict[str, Scalar]:
    """One row of a table as a flat record: ``{"table": table, **fields}``.

    NumPy scalars become Python numbers; NaN and infinities become ``None`` (JSON has neither).

    Raises:
        ValueError: a key (or ``table``) is not a snake_case identifier.
        TypeError: a value is not a scalar (lists and dicts do not belong in a record).
    """
    out: dict[str, Scalar] = {"table": table}
    for key, value in fields.items():
        out[key] = _scalar(value)
    for key in (table, *out):
        if not RECORD_KEY.fullmatch(key):
            raise ValueError(f"record keys and table names are snake_case identifiers, got {key!r}")
    return out


def write_records(path: Path | None, records: Iterable[Mapping[str, Scalar]], console: Any = None) -> None:
    """Write ``records`` to ``path`` as a JSON array (nothing when ``path`` is ``None``).

    Raises:
        ValueError: a record key is not snake_case, or a record is not flat.
    """
    if path is None:
        return
    rows = [dict(r) for r in records]
    for row in rows:
        for key, value in row.items():
            if not RECORD_KEY.fullmatch(key):
                raise ValueError(f"record key {key!r} is not a snake_case identifier")
            _scalar(value)
    Path(path).write_text(json.dumps(rows, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    if console is not None:
        console.print(f"{len(rows)} records written to {path}", highlight=False)


# --- timing ----------------------------------------------------------------------------------------


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Run ``fn`` once after a full garbage collection; return ``(seconds, result)``."""
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def best_of(fn: Callable[[], float], repeats: int) -> float:
    """The smallest of ``repeats`` values returned by ``fn`` (each call returns its own seconds)."""
    values = []
    for _ in range(max(1, repeats)):
        gc.collect()
        values.append(fn())
    return min(values)


def median(values: Sequence[float]) -> float:
    """The median of ``values``."""
    return float(statistics.median(values))


# --- profiles ----------------------------------------------------------------------------------------

#: Where own time is spent, by the file a function lives in (first match wins), for ``--profile``.
PROFILE_AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("trio: scheduler, cancel scopes, sockets", ("trio/_core/", "trio/_socket", "trio/_highlevel_socket")),
    ("trio: channels, locks", ("trio/_channel", "trio/_sync", "trio/lowlevel")),
    ("runtime loop", ("fedproto/runtime.py",)),
    ("transport", ("transports/",)),
    ("codec", ("fedproto/codec.py",)),
    ("meter", ("fedproto/metering.py",)),
    ("protocol machines, messages", ("fedproto/machine.py", "fedproto/messages.py", "algorithms/")),
    ("benchmark loops and test machines", ("benchmarks/",)),
    ("msgpack", ("msgpack",)),
    ("numpy", ("numpy",)),
)
#: Built-ins counted apart: system calls (a scheduler pass is one ``epoll.poll``).
_SYSCALLS = {"<method 'poll' of 'select.epoll' objects>": "epoll", "<method 'recv' of '_socket.socket' objects>": "recv",
             "<method 'send' of '_socket.socket' objects>": "send"}  # fmt: skip


def profile_area(filename: str, name: str) -> str:
    """The :data:`PROFILE_AREAS` label of a profiled function (``pstats`` file name and name)."""
    if filename == "~":  # a built-in
        if name in _SYSCALLS:
            return "system calls (epoll, socket send and recv)"
        if "msgpack" in name:
            return "msgpack"
        if "numpy" in name:
            return "numpy"
        return "Python built-ins (len, isinstance, dict, ...)"
    for label, needles in PROFILE_AREAS:
        if any(n in filename for n in needles):
            return label
    return "other Python (contextlib, dataclasses, outcome, ...)"


def print_profile(console: Console, stats: Any, *, what: str, unit: str, count: int, table: str,
                  top: int = 25) -> list[dict[str, Scalar]]:
    """Print a cProfile (a ``pstats.Stats``) of ``count`` units (messages, round trips) of ``what``:
    own time per unit grouped by :data:`PROFILE_AREAS`, the system calls per unit (one ``epoll``
    poll per scheduler pass), then the ``top`` functions by own time.

    Returns:
        The area rows as records of table ``table`` (``area``, ``calls_per_<unit>``,
        ``own_us_per_<unit>``, ``own_percent``).
    """
    total = sum(row[2] for row in stats.stats.values()) or 1.0
    areas: dict[str, list[float]] = {}
    syscalls = dict.fromkeys(_SYSCALLS.values(), 0)
    for (filename, _, name), (_, ncalls, own, _, _) in stats.stats.items():
        entry = areas.setdefault(profile_area(filename, name), [0.0, 0])
        entry[0] += own
        entry[1] += ncalls
        if filename == "~" and name in _SYSCALLS:
            syscalls[_SYSCALLS[name]] += ncalls
    by_area = Table(
        title=f"cProfile of {what}, {count:,} {unit}s: own time by area (the profiler inflates all, most "
        "where calls are many and short)",
        title_justify="left",
    )
    for col in ("area", f"calls/{unit}", f"own us/{unit}", "own %"):
        by_area.add_column(col, justify="left" if col == "area" else "right")
    records = []
    for label, (own, ncalls) in sorted(areas.items(), key=lambda kv: -kv[1][0]):
        by_area.add_row(label, f"{ncalls / count:.1f}", f"{1e6 * own / count:.2f}", f"{100 * own / total:.1f}")
        records.append(record(
            table, area=label, **{f"calls_per_{unit.replace(' ', '_')}": ncalls / count,
                                  f"own_us_per_{unit.replace(' ', '_')}": 1e6 * own / count},
            own_percent=100 * own / total,
        ))
    console.print(by_area)
    console.print(
        f"per {unit}: {syscalls['epoll'] / count:.1f} scheduler passes (epoll polls), "
        f"{syscalls['recv'] / count:.1f} socket recv, {syscalls['send'] / count:.1f} socket send",
        highlight=False,
    )
    if top <= 0:
        return records
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]
    functions = Table(title=f"cProfile of {what}: top {top} functions by own time", title_justify="left")
    for col in ("function", "calls", "own s", "own %", "cumulative s", f"own us/{unit}"):
        functions.add_column(col, justify="left" if col == "function" else "right")
    for (filename, line, name), (_, ncalls, own, cumulative, _) in rows:
        short = filename.split("site-packages/")[-1].split(str(Path(__file__).resolve().parents[1]) + "/")[-1]
        functions.add_row(
            f"{name} ({short}:{line})", f"{ncalls:,}", f"{own:.3f}", f"{100 * own / total:.1f}",
            f"{cumulative:.3f}", f"{1e6 * own / count:.2f}",
        )
    console.print(functions)
    return records


# --- benchmark protocols -----------------------------------------------------------------------------


class StreamAck(Message, tag="bench.ack"):
    """Sink -> source: the burst of this round is in."""



_State = machine_states("_State", "RUNNING")


class PingMachine(ProtocolMachine):
    """Sends ``MaskedUpdate(payload)``, waits for the ``NoisyAggregate`` answer, ``rounds`` times.

    One round = one request and one response (2 messages). Its result is the number of rounds.
    """

    State = _State
    INITIAL_STATE = _State.RUNNING
    TRANSITIONS = {(_State.RUNNING, NoisyAggregate): ("_on_pong", _State.RUNNING)}

    def __init__(self, party: str, *, peer: str, payload: np.ndarray, rounds: int) -> None:
        super().__init__(party)
        if rounds < 1:
            raise ValueError("rounds must be >= 1")
        self.peer = peer
        self.payload = payload
        self.rounds = rounds

    def _start(self) -> list[Outgoing]:
        return [self.send(self.peer, MaskedUpdate(masked=self.payload), phase="ping")]

    def _on_pong(self, sender: str, message: NoisyAggregate) -> list[Outgoing]:
        if sender != self.peer:
            raise RemoteProtocolError(f"{sender} is not the peer", party=sender)
        self.round_idx += 1
        if self.round_idx == self.rounds:
            self._finish(self.round_idx)
            return []
        return [self.send(self.peer, MaskedUpdate(masked=self.payload), phase="ping")]


class PongMachine(ProtocolMachine):
    """Answers each ``MaskedUpdate`` with a ``NoisyAggregate`` of the same array, ``rounds`` times."""

    State = _State
    INITIAL_STATE = _State.RUNNING
    TRANSITIONS = {(_State.RUNNING, MaskedUpdate): ("_on_ping", _State.RUNNING)}

    def __init__(self, party: str, *, peer: str, rounds: int) -> None:
        super().__init__(party)
        self.peer = peer
        self.rounds = rounds

    def _on_ping(self, sender: str, message: MaskedUpdate) -> list[Outgoing]:
        if sender != self.peer:
            raise RemoteProtocolError(f"{sender} is not the peer", party=sender)
        out = self.send(self.peer, NoisyAggregate(masked=message.masked), phase="pong")
        self.round_idx += 1
        if self.round_idx == self.rounds:
            self._finish(self.round_idx)
        return [out]


class StreamSource(ProtocolMachine):
    """Streams ``messages`` ``MaskedUpdate`` s in bursts of ``burst``; waits for an ack per burst."""

    State = _State
    INITIAL_STATE = _State.RUNNING
    TRANSITIONS = {(_State.RUNNING, StreamAck): ("_on_ack", _State.RUNNING)}

    def __init__(self, party: str, *, peer: str, payload: np.ndarray, messages: int, burst: int) -> None:
        super().__init__(party)
        if messages < 1 or burst < 1 or messages % burst:
            raise ValueError("messages must be a positive multiple of burst")
        self.peer = peer
        self.payload = payload
        self.bursts = messages // burst
        self.burst = burst

    def _emit(self) -> list[Outgoing]:
        return [self.send(self.peer, MaskedUpdate(masked=self.payload), phase="stream") for _ in range(self.burst)]

    def _start(self) -> list[Outgoing]:
        return self._emit()

    def _on_ack(self, sender: str, message: StreamAck) -> list[Outgoing]:
        self.round_idx += 1
        if self.round_idx == self.bursts:
            self._finish(self.round_idx)
            return []
        return self._emit()


class StreamSink(ProtocolMachine):
    """Receives bursts of ``burst`` messages and acknowledges each burst."""

    State = _State
    INITIAL_STATE = _State.RUNNING
    TRANSITIONS = {(_State.RUNNING, MaskedUpdate): ("_on_update", _State.RUNNING)}

    def __init__(self, party: str, *, peer: str, messages: int, burst: int) -> None:
        super().__init__(party)
        self.peer = peer
        self.bursts = messages // burst
        self.burst = burst
        self.received = 0
        self.received_bytes = 0

    def _on_update(self, sender: str, message: MaskedUpdate) -> list[Outgoing]:
        self.received += 1
        self.received_bytes += message.masked.nbytes
        if self.received % self.burst:
            return []
        out = self.send(self.peer, StreamAck(), phase="ack")
        self.round_idx += 1
        if self.round_idx == self.bursts:
            self._finish(self.received)
        return [out]

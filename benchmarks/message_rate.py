"""In-memory message cost of fedproto's runtime, against a bare trio memory channel plus the codec.

What it measures
----------------
Messages per second between two parties in one process, for FastLloyd-sized payloads
(``uint32`` arrays of 24 B, 1 KiB and 64 KiB), in two traffic patterns:

* ``ping-pong``: request/response; the requester sends a ``MaskedUpdate``, the responder answers
  with a ``NoisyAggregate`` of the same array, ``--rounds`` times (2 messages per round);
* ``stream``: one-way bursts of ``--burst`` ``MaskedUpdate`` s, one small acknowledgement per
  burst (the acknowledgements are not counted as messages, in either measurement).

Each pattern runs through fedproto (:func:`fedproto.runtime.run_parties` driving two sans-IO
machines over :class:`fedproto.transports.memory.MemoryNetwork`: every message is encoded, sent, received,
decoded and validated, metered and fed to a protocol machine), and, in the same run, through the
baseline: **a bare trio memory channel** per direction moving ``bytes`` objects of the same raw
sizes, with the same two tasks and the same send/receive order. Every fedproto message is really
encoded and decoded, so the baseline of a message (issue 11, "the message path") is the bare
channel's cost per message **plus one** :func:`~fedproto.codec.encode_frame` **and one**
:func:`~fedproto.codec.decode_frame` of the same frame, the two codec calls timed alone in the same
run (best of ``--repeats`` loops of as many calls as the pattern has messages). The table gives the
microseconds per message of each part, fedproto's, and the cost ratio fedproto / baseline (target
from issue 29: <= 1.5 for ping-pong; the stream rows use the same baseline and are shown for
comparison), and both message rates. All timings are best of ``--repeats``, interleaved run by run.

A second table splits the per-message cost of ping-pong into stages, each measured on its own:
bare channel; ``MemoryTransport`` alone (pre-encoded frames); the runtime's send path without
machines (``encode_frame -> transport.send -> transport.receive -> decode_frame ->
meter.record_sent``); and the full runtime. ``--profile`` adds a cProfile run of the full runtime
(24 B ping-pong): own time per message grouped by where it is spent (trio's scheduler and channels,
the runtime loop, the transport, the codec, msgpack and NumPy, the meter, the protocol machines),
then the top functions.

A third table times metering alone: :meth:`~fedproto.metering.Meter.record_sent` of ping-pong's
frames as the runtime records them (two links, a new round every two messages), in
microseconds per message against issue 29's target of at most 1 us.

Run::

    python benchmarks/message_rate.py            # full run (about a minute)
    python benchmarks/message_rate.py --quick    # smoke test, a few seconds
    python benchmarks/message_rate.py --profile  # also print where the time goes
    python benchmarks/message_rate.py --quick --json rate.json   # the tables as JSON records
    python benchmarks/message_rate.py --clock cpu   # CPU time, on a machine shared with other work

``--json PATH`` writes one record per row: table ``message_rate`` (``pattern``, ``payload``,
``raw_bytes``, ``frame_bytes``, ``bare_us_per_msg``, ``encode_us``, ``decode_us``,
``baseline_us_per_msg``, ``fedproto_us_per_msg``, ``cost_ratio``, ``target_cost_ratio``,
``bare_msg_per_s``, ``fedproto_msg_per_s``) and table ``stage_cost`` (``payload``,
``bare_us_per_msg``, ``transport_us_per_msg``, ``send_path_us_per_msg``, ``runtime_us_per_msg``,
``baseline_us_per_msg``) and table ``meter_cost`` (``payload``, ``meter_us_per_msg``,
``target_meter_us``).
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import math
import pstats
import time

import numpy as np
import trio
from _common import (
    CLOCKS,
    PAYLOAD_SHAPES,
    PingMachine,
    PongMachine,
    StreamSink,
    StreamSource,
    add_common_arguments,
    fmt_ratio,
    make_console,
    parse_args,
    payload_array,
    pingpong_codec_meter,
    pingpong_encoded,
    print_machine_facts,
    print_profile,
    record,
    write_records,
)
from rich.table import Table

from fedproto.algorithms.fastlloyd.messages import MaskedUpdate, NoisyAggregate
from fedproto.codec import decode_frame, encode_frame
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.transports.memory import MemoryNetwork

#: Most a message through the full runtime may cost, in units of the baseline (bare channel + one
#: encode + one decode of the same frame), issue 29.
TARGET_COST_RATIO = 1.5
#: Most metering one message may cost (microseconds), issue 29.
TARGET_METER_US = 1.0
#: What timings read: ``time.perf_counter`` (wall, the default) or ``time.process_time`` (this
#: process's CPU time, ``--clock cpu``: every measured path runs in this one thread, so on a
#: machine shared with other work it leaves out the time other processes held the CPU).
_timer = time.perf_counter
SESSION = 0x5EED_0001
TITLE = "fedproto message cost over the memory transport vs a bare trio memory channel + encode + decode"


# --- baseline: bare trio memory channels -------------------------------------------------------------


async def bare_pingpong(payload: bytes, rounds: int) -> float:
    """Two tasks, one unbounded channel per direction, ``rounds`` request/response pairs."""
    to_b_send, to_b_recv = trio.open_memory_channel[bytes](math.inf)
    to_a_send, to_a_recv = trio.open_memory_channel[bytes](math.inf)

    async def requester() -> None:
        for _ in range(rounds):
            await to_b_send.send(payload)
            await to_a_recv.receive()

    async def responder() -> None:
        for _ in range(rounds):
            request = await to_b_recv.receive()
            await to_a_send.send(request)

    t0 = _timer()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(responder)
        nursery.start_soon(requester)
    return _timer() - t0


async def bare_stream(payload: bytes, messages: int, burst: int) -> float:
    """Two tasks: bursts of ``burst`` payloads one way, one empty ack per burst back."""
    data_send, data_recv = trio.open_memory_channel[bytes](math.inf)
    ack_send, ack_recv = trio.open_memory_channel[bytes](math.inf)

    async def source() -> None:
        for _ in range(messages // burst):
            for _ in range(burst):
                await data_send.send(payload)
            await ack_recv.receive()

    async def sink() -> None:
        for _ in range(messages // burst):
            for _ in range(burst):
                await data_recv.receive()
            await ack_send.send(b"")

    t0 = _timer()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sink)
        nursery.start_soon(source)
    return _timer() - t0


# --- fedproto ----------------------------------------------------------------------------------------


async def runtime_pingpong(array: np.ndarray, rounds: int, check: bool = True) -> float:
    """``run_parties`` with a :class:`PingMachine` and a :class:`PongMachine` over memory (then,
    untimed, unless ``check`` is false: every message was metered)."""
    machines = {
        "a": PingMachine("a", peer="b", payload=array, rounds=rounds),
        "b": PongMachine("b", peer="a", rounds=rounds),
    }
    network = MemoryNetwork(list(machines))
    meter = Meter(trio.current_time)
    t0 = _timer()
    results = await run_parties(machines, network, config=RuntimeConfig(session=SESSION), meter=meter)
    elapsed = _timer() - t0
    assert results == {"a": rounds, "b": rounds}
    assert not check or sum(link.messages for link in meter.report(
        protocol="ping", transport="memory", session=SESSION, parties=list(machines)
    ).links) == 2 * rounds
    return elapsed


async def runtime_stream(array: np.ndarray, messages: int, burst: int) -> float:
    """``run_parties`` with a :class:`StreamSource` and a :class:`StreamSink` over memory."""
    machines = {
        "a": StreamSource("a", peer="b", payload=array, messages=messages, burst=burst),
        "b": StreamSink("b", peer="a", messages=messages, burst=burst),
    }
    network = MemoryNetwork(list(machines))
    t0 = _timer()
    results = await run_parties(machines, network, config=RuntimeConfig(session=SESSION))
    elapsed = _timer() - t0
    assert results == {"a": messages // burst, "b": messages}
    return elapsed


async def transport_pingpong(array: np.ndarray, rounds: int) -> float:
    """``MemoryTransport`` alone: pre-encoded frames, no codec, meter or machine."""
    network = MemoryNetwork(["a", "b"])
    t0 = _timer()
    await pingpong_encoded(network.endpoint("a"), network.endpoint("b"), array, rounds, SESSION)
    return _timer() - t0


async def send_path_pingpong(array: np.ndarray, rounds: int) -> float:
    """The runtime's per-message path without machines or the runtime loop.

    ``encode_frame -> transport.send -> meter.record_sent`` on the sending side and
    ``transport.receive -> decode_frame`` on the receiving side, as ``_send_all`` and
    ``run_party`` do.
    """
    network = MemoryNetwork(["a", "b"])
    return await pingpong_codec_meter(network.endpoint("a"), network.endpoint("b"), array, rounds, SESSION)


# --- the codec alone ---------------------------------------------------------------------------------


def codec_encode(array: np.ndarray, calls: int) -> float:
    """Seconds for ``calls`` :func:`encode_frame` of one ``MaskedUpdate`` of ``array`` (built once)."""
    message = MaskedUpdate(masked=array)
    t0 = _timer()
    for _ in range(calls):
        encode_frame(message, session=SESSION, round_idx=0, phase="ping")
    return _timer() - t0


def codec_decode(array: np.ndarray, calls: int) -> float:
    """Seconds for ``calls`` :func:`decode_frame` of that message's frame (validation included)."""
    frame = encode_frame(MaskedUpdate(masked=array), session=SESSION, round_idx=0, phase="ping")
    t0 = _timer()
    for _ in range(calls):
        decode_frame(frame)
    return _timer() - t0


# --- the meter alone ---------------------------------------------------------------------------------


def meter_record(frame_bytes: int, calls: int) -> float:
    """Seconds for ``calls`` :meth:`Meter.record_sent` of ping-pong's frames, as the runtime
    records them: a ``MaskedUpdate`` and its ``NoisyAggregate`` answer per round, a new round
    (so a new key and a round start) every two messages."""
    meter = Meter(time.perf_counter)
    record = meter.record_sent
    ping, pong = MaskedUpdate.TAG, NoisyAggregate.TAG
    t0 = _timer()
    for i in range(calls // 2):
        record(i, "ping", "a", "b", ping, frame_bytes, 0)
        record(i, "pong", "b", "a", pong, frame_bytes, 0)
    elapsed = _timer() - t0
    assert sum(count for count, _ in meter.sent.values()) == 2 * (calls // 2)
    return elapsed


# --- driver ------------------------------------------------------------------------------------------


def interleaved_best(runs: dict[str, tuple], repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` seconds of each ``name -> (fn, *args)``, interleaved per repeat (a
    coroutine function runs in its own ``trio.run``, a plain function is called)."""
    best = {name: math.inf for name in runs}
    for _ in range(max(1, repeats)):
        for name, (fn, *args) in runs.items():
            seconds = trio.run(fn, *args) if inspect.iscoroutinefunction(fn) else fn(*args)
            best[name] = min(best[name], seconds)
    return best


def profile_runtime(console, rounds: int, top: int) -> list[dict]:
    """cProfile of the full runtime, 24 B ping-pong (see :func:`print_profile`); the area rows as
    records (table ``profile_area``)."""
    array = payload_array(PAYLOAD_SHAPES["24 B"])
    profiler = cProfile.Profile()
    profiler.enable()
    trio.run(runtime_pingpong, array, rounds, False)  # the run alone, as timed
    profiler.disable()
    return print_profile(
        console, pstats.Stats(profiler), what="the full runtime, 24 B ping-pong", unit="message",
        count=2 * rounds, table="profile_area", top=top,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10_000, help="ping-pong rounds per run (2 messages each)")
    parser.add_argument("--messages", type=int, default=20_000, help="stream messages per run")
    parser.add_argument("--burst", type=int, default=100, help="stream messages per acknowledgement")
    parser.add_argument("--repeats", type=int, default=5, help="runs per measurement (best is kept)")
    parser.add_argument("--payloads", nargs="+", choices=list(PAYLOAD_SHAPES), default=list(PAYLOAD_SHAPES))
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of the full runtime")
    parser.add_argument("--seed", type=int, default=0, help="seed of the payload arrays")
    add_common_arguments(parser, quick="tiny run for a smoke test (a few seconds)", clock=True)
    args = parse_args(parser, argv)
    global _timer
    _timer, clock = CLOCKS[args.clock]
    if args.quick:
        args.rounds, args.messages, args.burst, args.repeats = 100, 200, 100, 2
    if args.messages % args.burst:
        parser.error("--messages must be a multiple of --burst")

    console = make_console()
    print_machine_facts(
        console,
        TITLE,
        {
            "ping-pong rounds per run": f"{args.rounds:,} ({2 * args.rounds:,} messages)",
            "stream messages per run": f"{args.messages:,} in bursts of {args.burst}",
            "codec calls per timing": f"{2 * args.rounds:,} encode_frame, then as many decode_frame",
            "repeats (best kept)": args.repeats,
            "clock": clock,
            "target cost ratio (ping-pong)": f"<= {TARGET_COST_RATIO} x (bare channel + encode + decode)",
        },
    )

    rate = Table(
        title="Message rate (messages/s, best of repeats) and cost per message (us) against the baseline "
        "bare channel + one encode_frame + one decode_frame of the same frame",
        title_justify="left",
    )
    for col in (
        "pattern", "payload", "frame bytes", "bare channel us", "encode us", "decode us", "baseline us",
        "fedproto us", "cost ratio", "bare channel msg/s", "fedproto msg/s",
    ):
        rate.add_column(col, justify="left" if col in ("pattern", "payload") else "right")
    stages = Table(
        title="Ping-pong cost per message by stage (us/message, best of repeats; + = added by the stage)",
        title_justify="left",
    )
    for col in (
        "payload", "bare channel", "MemoryTransport", "+ codec & meter", "full runtime", "baseline",
        "runtime/baseline",
    ):
        stages.add_column(col, justify="left" if col == "payload" else "right")
    metering = Table(
        title="Metering alone: Meter.record_sent per message (us, best of repeats) against the target",
        title_justify="left",
    )
    for col in ("payload", "meter us", f"target (<= {TARGET_METER_US} us)"):
        metering.add_column(col, justify="left" if col == "payload" else "right")

    misses = []
    records = []
    for i, name in enumerate(args.payloads):
        array = payload_array(PAYLOAD_SHAPES[name], seed=args.seed + i)
        raw = array.tobytes()
        frame = len(encode_frame(MaskedUpdate(masked=array), session=SESSION, round_idx=0, phase="ping"))
        n_pp = 2 * args.rounds
        pp = interleaved_best(
            {
                "bare": (bare_pingpong, raw, args.rounds),
                "transport": (transport_pingpong, array, args.rounds),
                "path": (send_path_pingpong, array, args.rounds),
                "runtime": (runtime_pingpong, array, args.rounds),
                "encode": (codec_encode, array, n_pp),
                "decode": (codec_decode, array, n_pp),
                "meter": (meter_record, frame, n_pp),
            },
            args.repeats,
        )
        st = interleaved_best(
            {
                "bare": (bare_stream, raw, args.messages, args.burst),
                "runtime": (runtime_stream, array, args.messages, args.burst),
            },
            args.repeats,
        )
        encode_us = 1e6 * pp["encode"] / n_pp
        decode_us = 1e6 * pp["decode"] / n_pp
        for pattern, best, n in (("ping-pong", pp, n_pp), ("stream", st, args.messages)):
            bare_us = 1e6 * best["bare"] / n
            runtime_us = 1e6 * best["runtime"] / n
            baseline_us = bare_us + encode_us + decode_us
            ratio = runtime_us / baseline_us
            if pattern == "ping-pong" and ratio > TARGET_COST_RATIO:
                misses.append(f"{pattern} {name}: {ratio:.2f}")
            rate.add_row(
                pattern, name, f"{frame:,}", f"{bare_us:.2f}", f"{encode_us:.2f}", f"{decode_us:.2f}",
                f"{baseline_us:.2f}", f"{runtime_us:.2f}",
                fmt_ratio(ratio, TARGET_COST_RATIO, at_least=False) if pattern == "ping-pong" else f"{ratio:.2f}",
                f"{n / best['bare']:,.0f}", f"{n / best['runtime']:,.0f}",
            )
            records.append(record(
                "message_rate", pattern=pattern, payload=name, raw_bytes=len(raw), frame_bytes=frame,
                bare_us_per_msg=bare_us, encode_us=encode_us, decode_us=decode_us, baseline_us_per_msg=baseline_us,
                fedproto_us_per_msg=runtime_us, cost_ratio=ratio,
                target_cost_ratio=TARGET_COST_RATIO if pattern == "ping-pong" else None,
                bare_msg_per_s=n / best["bare"], fedproto_msg_per_s=n / best["runtime"],
            ))
        meter_us = 1e6 * pp["meter"] / n_pp
        if meter_us > TARGET_METER_US:
            misses.append(f"metering {name}: {meter_us:.2f} us")
        metering.add_row(name, f"{meter_us:.2f}", "met" if meter_us <= TARGET_METER_US else "MISS")
        records.append(record("meter_cost", payload=name, meter_us_per_msg=meter_us, target_meter_us=TARGET_METER_US))
        us = {k: 1e6 * pp[k] / n_pp for k in ("bare", "transport", "path", "runtime")}
        baseline_us = us["bare"] + encode_us + decode_us
        records.append(record(
            "stage_cost", payload=name, bare_us_per_msg=us["bare"], transport_us_per_msg=us["transport"],
            send_path_us_per_msg=us["path"], runtime_us_per_msg=us["runtime"], baseline_us_per_msg=baseline_us,
        ))
        stages.add_row(
            name,
            f"{us['bare']:.2f}",
            f"{us['transport']:.2f} (+{us['transport'] - us['bare']:.2f})",
            f"{us['path']:.2f} (+{us['path'] - us['transport']:.2f})",
            f"{us['runtime']:.2f} (+{us['runtime'] - us['path']:.2f})",
            f"{baseline_us:.2f}",
            f"{us['runtime'] / baseline_us:.2f}",
        )
    console.print(rate)
    console.print(stages)
    console.print(metering)
    if args.profile:
        records += profile_runtime(console, rounds=min(args.rounds, 5_000), top=25)
    if misses:
        console.print(
            f"Above the targets (cost ratio {TARGET_COST_RATIO}, metering {TARGET_METER_US} us): " + "; ".join(misses)
        )
    write_records(args.json, records, console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

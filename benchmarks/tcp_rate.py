"""TCP loopback request/response rate of fedproto, as a ratio of a bare trio TCP echo.

What it measures
----------------
Request/response round trips per second between two endpoints on 127.0.0.1, for FastLloyd-sized
payloads (``uint32`` arrays of 24 B, 1 KiB and 64 KiB), ``--rounds`` round trips per run:

* **bare echo** (the baseline): ``trio.open_tcp_listeners`` / ``trio.open_tcp_stream``, one
  connection, the same 4-byte big-endian length prefix, the client sends a payload of the raw
  array size and the server echoes it back; with TLS on (the default rows), the connection is
  a ``trio.SSLStream`` at both ends, with the same TLS 1.3 contexts fedproto's parties use
  (mutual authentication, certificates of a throwaway federation);
* **fedproto codec + TcpTransport**: two endpoints from :func:`fedproto.transports.tcp.open_tcp_network`
  (mutual TLS 1.3, as a deployment runs; the handshake is done before timing, by one warm-up
  frame each way), in each of ``--topologies``: ``mesh`` (a connection each way) and ``star`` (the
  hub and one client on one connection, with the star's resumable link: ``fedproto party``'s
  default); per round trip the
  requester encodes a ``MaskedUpdate``, sends it, meters it, receives the ``NoisyAggregate`` answer
  and decodes it; the responder decodes, encodes the answer, sends and meters it;
* **bare echo through an inbox** (a diagnostic column): the same echo, but each side's frames go
  from a reader task through an unbounded memory channel to the task that uses them, as
  ``TcpTransport`` passes a connection's frames to its party (2 scheduler passes more per round
  trip): the cost of that design alone;
* **TcpTransport alone** (a diagnostic column): pre-encoded frames through the two endpoints, no
  codec, meter or machine; it separates the transport's own cost from the codec's;
* **fedproto full runtime**: the same over :func:`fedproto.runtime.run_parties` with a ping and a
  pong protocol machine (adds the runtime loop, phase deadlines and the machines).

All of them run in the same process and the same trio run, interleaved repeat by repeat; the
table gives round trips/s (best of ``--repeats``) and the ratio fedproto/bare (target from issue
29: >= 0.6, TLS on: fedproto over mutual TLS against the bare echo over TLS). ``--handshakes tls
secret`` adds rows for the shared-secret handshake (no encryption) against the plain bare echo,
the comparison earlier versions of this benchmark printed.

A second table gives the **envelope overhead** of FastLloyd's messages: encoded frame length minus
the raw array bytes, for ``MaskedUpdate`` and ``NoisyAggregate`` of a few ``(k, d)``, beside the
header of an ``.npy`` file of the same array (``np.save`` to ``BytesIO`` minus raw bytes); target
<= 48 bytes. The session id and round stamped on the frames are stated (larger values take more
msgpack bytes).

Run::

    python benchmarks/tcp_rate.py            # full run (about a minute)
    python benchmarks/tcp_rate.py --quick    # smoke test, a few seconds
    python benchmarks/tcp_rate.py --quick --json tcp.json   # the tables as JSON records
    python benchmarks/tcp_rate.py --profile  # also: where a round trip's time goes, and why
    python benchmarks/tcp_rate.py --clock cpu   # CPU time, on a machine shared with other work
    python benchmarks/tcp_rate.py --topologies mesh   # the mesh rows only (the default: mesh and star)

``--profile`` adds a cProfile of the bare echo, of ``TcpTransport`` alone and of the full runtime
(24 B, ``--rounds`` round trips each, after the timed runs): own time per round trip grouped by
area (trio's scheduler and sockets, the transport, the codec, the runtime loop, the meter, the
machines, system calls), the scheduler passes and socket calls per round trip, and for the full
runtime the top functions (records of table ``profile_area``, one set per path).

``--json PATH`` writes one record per row: table ``tcp_round_trips`` (``topology``, ``handshake``, ``payload``,
``raw_bytes``,
``bare_rt_per_s``, ``codec_tcp_rt_per_s``, ``runtime_rt_per_s``, ``codec_tcp_ratio``,
``runtime_ratio``, ``target_ratio``, and the five ``*_us_per_rt``) and table ``envelope``
(``k``, ``d``, ``ring_bits``, ``raw_bytes``, ``masked_update_frame_bytes``,
``masked_update_envelope_bytes``, ``noisy_aggregate_frame_bytes``,
``noisy_aggregate_envelope_bytes``, ``npy_header_bytes``, ``target_envelope_bytes``).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import math
import pstats
import secrets
import struct
import time
from collections.abc import AsyncIterator

import numpy as np
import trio
from _common import (
    CLOCKS,
    PAYLOAD_SHAPES,
    PingMachine,
    PongMachine,
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
from fedproto.codec import encode_frame
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.transports._tls import TlsContexts, load_contexts
from fedproto.transports.tcp import open_tcp_network, throwaway_tls

#: Least full-runtime round-trip rate, as a fraction of the bare echo's, TLS on (issue 29).
TARGET_RATIO = 0.6
TARGET_ENVELOPE_BYTES = 48
#: Session and round stamped on the frames of the envelope table: the largest 32-bit session id
#: (what :func:`fedproto.data.session_id` can return) and a round below 128.
ENVELOPE_SESSION = 2**32 - 1
ENVELOPE_ROUND = 6
#: What timings read: ``time.perf_counter`` (wall, the default) or ``time.process_time`` (this
#: process's CPU time, ``--clock cpu``: every measured path runs in this one thread, so on a
#: machine shared with other work it leaves out the time other processes held the CPU; the
#: kernel's loopback work done in this process's system calls is counted, as system time).
_timer = time.perf_counter
SESSION = 0x5EED_0002
TITLE = "fedproto TCP loopback request/response rate vs a bare trio TCP echo"
_PREFIX = struct.Struct(">I")


# --- baseline: bare trio TCP echo with a 4-byte length prefix ---------------------------------------


class _BareReader:
    """Minimal buffered reader of length-prefixed frames."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def frame(self) -> bytes | None:
        while len(self.buffer) < 4:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                return None
            self.buffer += chunk
        (n,) = _PREFIX.unpack_from(self.buffer)
        while len(self.buffer) < 4 + n:
            chunk = await self.stream.receive_some(max(65536, 4 + n - len(self.buffer)))
            if not chunk:
                return None
            self.buffer += chunk
        data = bytes(self.buffer[4 : 4 + n])
        del self.buffer[: 4 + n]
        return data


class BareEcho:
    """A bare trio TCP echo server and one connected client; over TLS when given the two parties'
    contexts (``trio.SSLStream`` at both ends: the server with ``server``'s listener context, the
    client with ``client``'s dialer context, verifying the server's name).

    With ``through_inbox`` (a diagnostic), each side's frames go from a reader task through an
    unbounded memory channel to the task that uses them, as :class:`TcpTransport` passes a
    connection's frames to its party: the cost of that hop alone, all else bare.
    """

    def __init__(
        self, server: TlsContexts | None = None, client: TlsContexts | None = None, *, through_inbox: bool = False
    ) -> None:
        self.server, self.client = server, client
        self.through_inbox = through_inbox

    async def _handler(self, stream: trio.SocketStream) -> None:
        wrapped: trio.abc.Stream = stream
        if self.server is not None:
            wrapped = trio.SSLStream(stream, self.server.listener, server_side=True)
        reader = _BareReader(wrapped)
        async with wrapped, trio.open_nursery() as nursery:
            frames = _inbox(nursery, reader) if self.through_inbox else None
            try:
                while (frame := await (frames.receive() if frames else reader.frame())) is not None:
                    await wrapped.send_all(_PREFIX.pack(len(frame)) + frame)
            except (trio.BrokenResourceError, trio.EndOfChannel):
                pass  # the client went away (without a TLS goodbye)
            nursery.cancel_scope.cancel()

    async def open(self, nursery: trio.Nursery) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        await nursery.start(trio.serve_listeners, self._handler, listeners)
        stream: trio.abc.Stream = await trio.open_tcp_stream("127.0.0.1", port)
        if self.client is not None:
            stream = trio.SSLStream(stream, self.client.dialer, server_hostname=self.server.party)
        self.stream = stream
        self.reader = _BareReader(stream)
        self.inbox = _inbox(nursery, self.reader) if self.through_inbox else None
        await self.round_trips(b"warm-up", 1)

    async def close(self) -> None:
        if isinstance(self.stream, trio.SSLStream):
            await trio.aclose_forcefully(self.stream)
        else:
            await self.stream.aclose()

    async def round_trips(self, payload: bytes, rounds: int) -> float:
        frame = _PREFIX.pack(len(payload)) + payload
        receive = self.inbox.receive if self.inbox is not None else self.reader.frame
        t0 = _timer()
        for _ in range(rounds):
            await self.stream.send_all(frame)
            reply = await receive()
            assert reply is not None and len(reply) == len(payload)
        return _timer() - t0


def _inbox(nursery: trio.Nursery, reader: _BareReader) -> trio.MemoryReceiveChannel[bytes]:
    """The frames of ``reader``, read by a task of ``nursery`` and passed through a memory channel."""
    send, receive = trio.open_memory_channel[bytes](math.inf)

    async def pump() -> None:
        with send:
            try:
                while (frame := await reader.frame()) is not None:
                    send.send_nowait(frame)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return

    nursery.start_soon(pump)
    return receive


@contextlib.asynccontextmanager
async def echo_and_network(handshake: str, topology: str = "mesh") -> AsyncIterator[tuple[BareEcho, BareEcho, dict]]:
    """The bare echo, the bare echo through an inbox, and two fedproto endpoints ``a``, ``b`` in
    ``topology`` (``"mesh"``: a connection each way; ``"star"``: ``a`` the hub, ``b`` its client,
    one connection both ways, as ``fedproto party`` runs by default), handshakes done: for
    ``"tls"`` all over TLS 1.3 with the kits of one throwaway federation (``b`` serves the echoes,
    ``a`` dials them), for ``"secret"`` the plain echoes and the shared-secret handshake."""
    async with trio.open_nursery() as nursery:
        with contextlib.ExitStack() as files:
            if handshake == "tls":
                kits = files.enter_context(throwaway_tls(["a", "b"]))
                contexts = (load_contexts(kits["b"], "b"), load_contexts(kits["a"], "a"))
                network = open_tcp_network(["a", "b"], tls=kits, session=SESSION, topology=topology)
            else:
                contexts = (None, None)
                network = open_tcp_network(["a", "b"], secrets.token_bytes(32), session=SESSION, topology=topology)
            bare, hop = BareEcho(*contexts), BareEcho(*contexts, through_inbox=True)
            await bare.open(nursery)
            await hop.open(nursery)
            async with network as endpoints:
                # Handshake both directions before timing.
                await endpoints["a"].send("b", b"")
                await endpoints["b"].send("a", b"")
                await endpoints["a"].receive()
                await endpoints["b"].receive()
                yield bare, hop, endpoints
            await bare.close()
            await hop.close()
        nursery.cancel_scope.cancel()


# --- fedproto ----------------------------------------------------------------------------------------


async def transport_round_trips(endpoints: dict, array: np.ndarray, rounds: int) -> float:
    """TcpTransport alone: pre-encoded frames, no codec, meter or machine."""
    t0 = _timer()
    await pingpong_encoded(endpoints["a"], endpoints["b"], array, rounds, SESSION)
    return _timer() - t0


async def codec_transport_round_trips(endpoints: dict, array: np.ndarray, rounds: int) -> float:
    """Codec + TcpTransport + meter, no machines: the runtime's per-message path."""
    return await pingpong_codec_meter(endpoints["a"], endpoints["b"], array, rounds, SESSION, check_shape=True)


async def runtime_round_trips(endpoints: dict, array: np.ndarray, rounds: int) -> float:
    """``run_parties`` with a ping and a pong machine over the TCP endpoints."""
    machines = {
        "a": PingMachine("a", peer="b", payload=array, rounds=rounds),
        "b": PongMachine("b", peer="a", rounds=rounds),
    }
    t0 = _timer()
    results = await run_parties(machines, endpoints, config=RuntimeConfig(session=SESSION))
    elapsed = _timer() - t0
    assert results == {"a": rounds, "b": rounds}
    return elapsed


async def measure(
    handshakes: list[str], payload_names: list[str], rounds: int, repeats: int, seed: int,
    topologies: tuple[str, ...] = ("mesh",),
) -> dict[tuple[str, str, str], dict[str, float]]:
    """Best-of-``repeats`` seconds per (topology, handshake, payload) for the bare echo and the
    fedproto paths."""
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    for topology, handshake in ((t, h) for t in topologies for h in handshakes):
        async with echo_and_network(handshake, topology) as (bare, hop, endpoints):
            for i, name in enumerate(payload_names):
                array = payload_array(PAYLOAD_SHAPES[name], seed=seed + i)
                raw = array.tobytes()
                best = {"bare": math.inf, "hop": math.inf, "transport": math.inf, "codec": math.inf, "runtime": math.inf}
                for _ in range(max(1, repeats)):
                    best["bare"] = min(best["bare"], await bare.round_trips(raw, rounds))
                    best["hop"] = min(best["hop"], await hop.round_trips(raw, rounds))
                    best["transport"] = min(best["transport"], await transport_round_trips(endpoints, array, rounds))
                    best["codec"] = min(best["codec"], await codec_transport_round_trips(endpoints, array, rounds))
                    best["runtime"] = min(best["runtime"], await runtime_round_trips(endpoints, array, rounds))
                out[topology, handshake, name] = best
    return out


async def profile_paths(console, rounds: int) -> list[dict]:
    """cProfile of ``rounds`` 24 B round trips of each path, TLS on (see :func:`print_profile`)."""
    array = payload_array(PAYLOAD_SHAPES["24 B"])
    records = []
    async with echo_and_network("tls") as (bare, _, endpoints):
        paths = (
            ("bare TLS echo", "bare", lambda: bare.round_trips(array.tobytes(), rounds), 0),
            ("TcpTransport alone", "tcp only", lambda: transport_round_trips(endpoints, array, rounds), 0),
            ("the full runtime over TCP", "runtime", lambda: runtime_round_trips(endpoints, array, rounds), 25),
        )
        for what, name, run, top in paths:
            profiler = cProfile.Profile()
            profiler.enable()
            await run()
            profiler.disable()
            rows = print_profile(
                console, pstats.Stats(profiler), what=f"{what}, 24 B, TLS", unit="round trip", count=rounds,
                table="profile_area", top=top,
            )
            records += [{**row, "path": name} for row in rows]
    return records


# --- envelope overhead -------------------------------------------------------------------------------


def npy_header_bytes(array: np.ndarray) -> int:
    """Bytes an ``.npy`` file adds to ``array``'s raw bytes (``np.save`` to ``BytesIO``)."""
    buffer = io.BytesIO()
    np.save(buffer, array)
    return len(buffer.getvalue()) - array.nbytes


def envelope_bytes(message_cls: type, shape: tuple[int, int], dtype: str, *, session: int, round_idx: int,
                   phase: str) -> tuple[int, int]:
    """``(frame bytes, frame bytes - raw array bytes)`` of one message of ``shape`` and ``dtype``."""
    array = np.zeros(shape, dtype=dtype)
    frame = encode_frame(message_cls(masked=array), session=session, round_idx=round_idx, phase=phase)
    return len(frame), len(frame) - array.nbytes


def envelope_table(kds: list[tuple[int, int]]) -> tuple[Table, list[str], list[dict]]:
    """The envelope table, its misses of the target, and its rows as records."""
    table = Table(
        title=(
            f"Envelope overhead of FastLloyd frames (session {ENVELOPE_SESSION:#x}, round {ENVELOPE_ROUND}; "
            f"target <= {TARGET_ENVELOPE_BYTES} B) vs the .npy header of the same array"
        ),
        title_justify="left",
    )
    for col in (
        "k", "d", "ring bits", "raw bytes", "MaskedUpdate frame", "envelope", "NoisyAggregate frame", "envelope",
        ".npy header", "npy/envelope",
    ):
        table.add_column(col, justify="right")
    misses = []
    records = []
    for k, d in kds:
        for bits, dtype in ((32, "uint32"), (64, "uint64")):
            shape = (k, d + 1)
            up_frame, up_env = envelope_bytes(
                MaskedUpdate, shape, dtype, session=ENVELOPE_SESSION, round_idx=ENVELOPE_ROUND, phase="update"
            )
            agg_frame, agg_env = envelope_bytes(
                NoisyAggregate, shape, dtype, session=ENVELOPE_SESSION, round_idx=ENVELOPE_ROUND, phase="aggregate"
            )
            npy = npy_header_bytes(np.zeros(shape, dtype=dtype))
            for env, what in ((up_env, "MaskedUpdate"), (agg_env, "NoisyAggregate")):
                if env > TARGET_ENVELOPE_BYTES:
                    misses.append(f"{what} k={k} d={d} w={bits}: {env} B")
            table.add_row(
                str(k), str(d), str(bits), f"{k * (d + 1) * bits // 8:,}", f"{up_frame:,}",
                f"{up_env} {'ok' if up_env <= TARGET_ENVELOPE_BYTES else 'MISS'}", f"{agg_frame:,}",
                f"{agg_env} {'ok' if agg_env <= TARGET_ENVELOPE_BYTES else 'MISS'}", str(npy),
                f"{npy / max(up_env, agg_env):.1f}x",
            )
            records.append(record(
                "envelope", k=k, d=d, ring_bits=bits, raw_bytes=k * (d + 1) * bits // 8,
                masked_update_frame_bytes=up_frame, masked_update_envelope_bytes=up_env,
                noisy_aggregate_frame_bytes=agg_frame, noisy_aggregate_envelope_bytes=agg_env,
                npy_header_bytes=npy, target_envelope_bytes=TARGET_ENVELOPE_BYTES,
            ))
    return table, misses, records


# --- driver ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5_000, help="round trips per run")
    parser.add_argument("--repeats", type=int, default=5, help="runs per measurement (best is kept)")
    parser.add_argument("--payloads", nargs="+", choices=list(PAYLOAD_SHAPES), default=list(PAYLOAD_SHAPES))
    parser.add_argument("--seed", type=int, default=0, help="seed of the payload arrays")
    parser.add_argument("--profile", action="store_true", help="also profile where a round trip's time goes")
    parser.add_argument(
        "--handshakes", nargs="+", choices=("tls", "secret"), default=["tls"],
        help="tls: mutual TLS 1.3 on both sides (the target's rows); secret: also the shared-secret "
        "handshake against the plain echo",
    )
    parser.add_argument(
        "--topologies", nargs="+", choices=("mesh", "star"), default=["mesh", "star"],
        help="mesh: a connection each way; star: one connection both ways, the hub and a client "
        "(fedproto party's default)",
    )
    add_common_arguments(parser, quick="tiny run for a smoke test (a few seconds)", clock=True)
    args = parse_args(parser, argv)
    global _timer
    _timer, clock = CLOCKS[args.clock]
    if args.quick:
        args.rounds, args.repeats = 50, 2

    console = make_console()
    print_machine_facts(
        console,
        TITLE,
        {
            "round trips per run": f"{args.rounds:,}",
            "repeats (best kept)": args.repeats,
            "handshakes": ", ".join(args.handshakes),
            "topologies": ", ".join(args.topologies),
            "clock": clock,
            "target ratio (full runtime, TLS on)": f">= {TARGET_RATIO}",
        },
    )
    best = trio.run(measure, args.handshakes, args.payloads, args.rounds, args.repeats, args.seed,
                    tuple(args.topologies))

    table = Table(
        title="Round trips/s over TCP loopback (best of repeats; tls: fedproto over mutual TLS 1.3 vs the bare "
        "echo over TLS, secret: the shared-secret handshake vs the plain echo; codec+tcp = codec + TcpTransport "
        "+ meter, tcp only = pre-encoded frames, bare+inbox = the bare echo with each side's frames passed from a reader "
        "task through a memory channel, as TcpTransport passes them)",
        title_justify="left",
    )
    for col in (
        "topology", "handshake", "payload", "raw B", "bare rt/s", "codec+tcp rt/s", "ratio", "runtime rt/s", "ratio",
        "bare us/rt", "bare+inbox us/rt", "tcp only us/rt", "codec+tcp us/rt", "runtime us/rt",
    ):
        table.add_column(col, justify="left" if col in ("topology", "handshake", "payload") else "right")
    misses = []
    records = []
    for (topology, handshake, name), b in best.items():
        raw = int(np.prod(PAYLOAD_SHAPES[name])) * 4
        r_codec = b["bare"] / b["codec"]
        r_runtime = b["bare"] / b["runtime"]
        if handshake == "tls" and r_runtime < TARGET_RATIO:
            misses.append(f"full runtime {topology} {name}: {r_runtime:.2f}")
        table.add_row(
            topology, handshake, name, f"{raw:,}", f"{args.rounds / b['bare']:,.0f}",
            f"{args.rounds / b['codec']:,.0f}",
            f"{r_codec:.2f}", f"{args.rounds / b['runtime']:,.0f}",
            fmt_ratio(r_runtime, TARGET_RATIO) if handshake == "tls" else f"{r_runtime:.2f}",
            f"{1e6 * b['bare'] / args.rounds:.1f}", f"{1e6 * b['hop'] / args.rounds:.1f}",
            f"{1e6 * b['transport'] / args.rounds:.1f}",
            f"{1e6 * b['codec'] / args.rounds:.1f}",
            f"{1e6 * b['runtime'] / args.rounds:.1f}",
        )
        records.append(record(
            "tcp_round_trips", topology=topology, handshake=handshake, payload=name, raw_bytes=raw,
            bare_rt_per_s=args.rounds / b["bare"],
            codec_tcp_rt_per_s=args.rounds / b["codec"], runtime_rt_per_s=args.rounds / b["runtime"],
            codec_tcp_ratio=r_codec, runtime_ratio=r_runtime,
            target_ratio=TARGET_RATIO if handshake == "tls" else None,
            bare_us_per_rt=1e6 * b["bare"] / args.rounds, bare_inbox_us_per_rt=1e6 * b["hop"] / args.rounds,
            tcp_only_us_per_rt=1e6 * b["transport"] / args.rounds,
            codec_tcp_us_per_rt=1e6 * b["codec"] / args.rounds, runtime_us_per_rt=1e6 * b["runtime"] / args.rounds,
        ))
    console.print(table)

    envelopes, env_misses, env_records = envelope_table([(2, 2), (2, 5), (5, 2), (5, 5), (15, 2), (100, 2)])
    console.print(envelopes)
    if misses:
        console.print(f"Below the target ratio {TARGET_RATIO} (TLS on): " + "; ".join(misses))
    if env_misses:
        console.print(f"Envelope above {TARGET_ENVELOPE_BYTES} B: " + "; ".join(env_misses))
    if args.profile:
        records += trio.run(profile_paths, console, min(args.rounds, 2_000))
    write_records(args.json, records + env_records, console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

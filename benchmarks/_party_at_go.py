"""Start a ``fedproto party`` process warm, then wait for the harness's "go" before running it.

For the link-model check (issue 31, part 3), not part of fedproto. A party's report measures its
run from its own start; eleven processes importing JAX on a two-core machine come up seconds
apart, and the hub's report would then time the slowest import rather than the protocol. This
wrapper imports what the run needs (fedproto's command line, JAX, the protocol's plug-in), prints
``ready``, blocks until a line arrives on stdin, then runs ``fedproto ARGS`` in this process, so
the harness starts every party within milliseconds of the others.

After the run it prints one line on stderr, ``TRACE go=T start=T first_sent=T first_received=T
finish=T`` (wall-clock seconds since the epoch: "go" read, the meter's start, the first frame
sent and received, the meter's last finish), from which the harness tells how the measured
wall time splits (:attr:`_netns_star.TcpRun.traces`).

``--listen HOST:PORT`` (the hub): bind and listen there first and hand the socket to the party as
``--listen-fd``, so the hub listens on an address the roster does not name (the relay's target)
and dialled connections wait in its backlog until it serves.

Usage::

    python benchmarks/_party_at_go.py [--listen HOST:PORT] -- party PROTOCOL ... --party NAME ...
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("_party_at_go: error: expected [--listen HOST:PORT] -- FEDPROTO-ARGS", file=sys.stderr)
        return 2
    split = argv.index("--")
    own, args = argv[:split], argv[split + 1:]
    if own[:1] == ["--listen"] and len(own) == 2:
        host, _, port = own[1].rpartition(":")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, int(port)))
        listener.listen(128)
        listener.set_inheritable(True)
        args = [*args, "--listen-fd", str(listener.fileno())]
    elif own:
        print(f"_party_at_go: error: unknown options {own}", file=sys.stderr)
        return 2

    import jax  # noqa: F401  (the import the parties would otherwise make after "go")

    from fedproto import registry
    from fedproto.cli import main as fedproto_main

    registry.load_protocol(args[1])  # the protocol's plug-in, imported now
    registry.load_transport("tcp")
    trace = _trace_meter()
    print("ready", flush=True)
    if not sys.stdin.readline():
        return 3  # the harness went away before saying go
    trace["go"] = time.time()
    try:
        return fedproto_main(args)
    finally:
        print("TRACE " + " ".join(f"{k}={v!r}" for k, v in trace.items()), file=sys.stderr, flush=True)
        if FRAMES:
            print("FRAMES " + json.dumps(FRAMES), file=sys.stderr, flush=True)


#: With ``FEDPROTO_NETCHECK_FRAMES=1`` in the environment: every frame the meter counts, as
#: ``[wall-clock s, "sent" or "received", round, phase, sender, receiver, tag]``, and every
#: handler the machine runs (its ``start`` and each ``receive``), as ``[wall-clock s at its end,
#: "handler", round, tag or "start", wall seconds, process CPU seconds]``, printed as one
#: ``FRAMES [...]`` line on stderr after the run (for tracing where a run's time goes against the
#: prediction's phases; the process CPU counts every thread of the process, JAX's included).
FRAMES: list[list] = []


def _trace_meter() -> dict[str, float | None]:
    """Wrap :class:`fedproto.metering.Meter` to note (wall clock) its start, first frames and finish."""
    from fedproto import metering

    trace: dict[str, float | None] = dict.fromkeys(("go", "start", "first_sent", "first_received", "finish"))
    meter = metering.Meter

    def wrap(name: str, key: str, first: bool = True):
        original = getattr(meter, name)

        def wrapped(self, *a, **k):
            if not first or trace[key] is None:
                trace[key] = time.time()
            return original(self, *a, **k)

        setattr(meter, name, wrapped)

    if os.environ.get("FEDPROTO_NETCHECK_FRAMES") == "1":
        for name, kind in (("record_sent", "sent"), ("record_received", "received")):
            original = getattr(meter, name)

            def noted(self, round_idx, phase, sender, receiver, tag, *a, _original=original, _kind=kind, **k):
                FRAMES.append([time.time(), _kind, round_idx, phase, sender, receiver, tag])
                return _original(self, round_idx, phase, sender, receiver, tag, *a, **k)

            setattr(meter, name, noted)
        _time_handlers()
    wrap("start", "start")
    wrap("record_sent", "first_sent")
    wrap("record_received", "first_received")
    wrap("finish", "finish", first=False)
    return trace


def _time_handlers() -> None:
    """Wrap :class:`fedproto.machine.ProtocolMachine`'s ``start`` and ``receive`` to note each
    handler's wall and process CPU time in :data:`FRAMES`."""
    from fedproto.machine import ProtocolMachine

    for name in ("start", "receive"):
        original = getattr(ProtocolMachine, name)

        def timed(self, *a, _original=original, **k):
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return _original(self, *a, **k)
            finally:
                tag = getattr(a[1], "TAG", type(a[1]).__name__) if len(a) > 1 else "start"
                FRAMES.append([time.time(), "handler", self.round_idx, str(tag), time.perf_counter() - wall,
                               time.process_time() - cpu])

        setattr(ProtocolMachine, name, timed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Run the transport conformance suite over MPI, one party per rank.

Usage: ``mpiexec -n 3 python tests/transports/mpi_conformance_main.py``. Every rank awaits each
check of :data:`fedproto.testing.conformance.CHECKS` on its own endpoint inside ``trio.run``, then
the close semantics, once per receive mode (doorbell, the default on one host; reader thread;
polling from trio), then the MPI-only checks (oversized frames are dropped and logged, cancelled
receives lose nothing in every mode, doorbells wake a waiting receive without its recheck timer,
the ranks agree to fall back when one of them has no doorbell, the modes' requirements, a
closed doorbell no longer rings, path doorbells (where there is no abstract namespace) work and
leave no file, a roster that does not match the communicator is refused, ``receive_nowait``
takes waiting frames in every mode, and the runtime's expired deadline reads a frame that waited
while its party was busy). Each rank prints ``rank <r>: conformance ok``; any failure prints the traceback and
aborts the whole job with exit code 1.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
import traceback
import types
from typing import Any

import trio

import fedproto.transports.mpi as mpi_module
from fedproto.errors import TransportClosed
from fedproto.machine import ProtocolMachine, machine_states
from fedproto.messages import Message, Outgoing
from fedproto.runtime import RuntimeConfig, run_party
from fedproto.testing.conformance import CHECKS, check_close_semantics
from fedproto.transports.mpi import RECEIVE_MODES, MpiTransport

ROSTER = ("alice", "bob", "carol")
TIMEOUT_S = 120.0


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def _oversized_frames_are_dropped(rank: int) -> None:
    # Only bob (rank 1) has a small maximum; alice sends him an eager-sized and a rendezvous-sized
    # oversized frame, then a small one: he must get the small one and log two warnings.
    limit = 1024 if rank == 1 else 4 * 1024 * 1024
    ep = MpiTransport(ROSTER, max_frame_bytes=limit)
    records = _Records()
    logging.getLogger("fedproto.transports.mpi").addHandler(records)
    try:
        if rank == 0:
            await ep.send("bob", b"x" * 2048)
            await ep.send("bob", b"y" * (2 * 1024 * 1024))
            await ep.send("bob", b"after")
        elif rank == 1:
            try:
                await ep.send("alice", b"z" * 2048)
            except ValueError:
                pass
            else:
                raise AssertionError("an oversized send was not refused")
            sender, frame = await ep.receive()
            assert (sender, frame) == ("alice", b"after"), (sender, frame[:20], len(frame))
            dropped = [m for m in records.messages if "dropped a frame" in m]
            assert len(dropped) == 2, records.messages
    finally:
        logging.getLogger("fedproto.transports.mpi").removeHandler(records)
        await ep.aclose()


class _SlowRequest:
    """A receive request that reports "not yet" for its first few polls, like a long transfer."""

    def __init__(self, request: Any, slow_polls: int) -> None:
        self.request = request
        self.slow_polls = slow_polls

    def Test(self) -> bool:
        if self.slow_polls:
            self.slow_polls -= 1
            return False
        return self.request.Test()


class _SlowMessage:
    def __init__(self, message: Any) -> None:
        self.message = message

    def Irecv(self, buf: Any) -> _SlowRequest:
        return _SlowRequest(self.message.Irecv(buf), slow_polls=20)


class _SlowComm:
    """COMM_WORLD, except that every receive takes 20 polls to complete.

    On one host MPICH completes a matched receive within the first poll, so without this the
    cancellation of a receive between ``Imrecv`` and its completion would never be exercised.
    """

    def __init__(self, comm: Any) -> None:
        self.comm = comm

    def __getattr__(self, name: str) -> Any:
        return getattr(self.comm, name)

    def Dup(self) -> "_SlowComm":
        return _SlowComm(self.comm.Dup())

    def Improbe(self, *args: Any) -> _SlowMessage | None:
        message = self.comm.Improbe(*args)
        return None if message is None else _SlowMessage(message)


async def _large_frames_under_cancels(ep: MpiTransport, rank: int) -> tuple[int, int]:
    """Alice sends Bob ten large frames; Bob receives them under short timeouts and checks that
    every frame arrived once, in order. Bob's result: how many receives were cancelled, and how
    many of those with a matched receive in progress (the polled mode's state); (0, 0) elsewhere."""
    frames = [bytes([i]) * (i * 100_000) for i in range(10)]
    cancelled = mid_transfer = 0
    if rank == 0:
        for frame in frames:
            await ep.send("bob", frame)
    elif rank == 1:
        got: list[tuple[str, bytes]] = []
        timeouts = [1e-5, 1e-4, 3e-4, 1e-3]
        while len(got) < len(frames):
            with trio.move_on_after(timeouts[(len(got) + cancelled) % len(timeouts)]):
                got.append(await ep.receive())
                continue
            cancelled += 1
            mid_transfer += ep._pending_receive is not None
        assert got == [("alice", f) for f in frames], "a cancelled receive lost or altered a frame"
    return cancelled, mid_transfer


async def _receive_cancelled_mid_transfer(rank: int, mode: str) -> None:
    """A receive in the trio thread (``mode`` doorbell or poll): cancelled between its matched
    probe and the end of the transfer, it loses nothing."""
    from mpi4py import MPI

    ep = MpiTransport(ROSTER, comm=_SlowComm(MPI.COMM_WORLD), receive_mode=mode)
    try:
        _, mid_transfer = await _large_frames_under_cancels(ep, rank)
        if rank == 1:
            assert mid_transfer > 0, f"no {mode} receive was cancelled mid-transfer"
            _say(f"rank {rank}: {mid_transfer} {mode} receives cancelled mid-transfer, no frame lost")
    finally:
        await ep.aclose()


async def _threaded_receive_cancelled_often(rank: int) -> None:
    """The reader-thread receive, cancelled by short timeouts while large frames arrive: every
    frame arrives once, in order, and the reader thread ends at close."""
    ep = MpiTransport(ROSTER, receive_mode="thread")
    try:
        cancelled, _ = await _large_frames_under_cancels(ep, rank)
        if rank == 1:
            assert cancelled > 0, "no threaded receive was cancelled"
            _say(f"rank {rank}: {cancelled} threaded receives cancelled, no frame lost")
    finally:
        await ep.aclose()
    assert ep._reader is None or not ep._reader.is_alive(), "the reader thread outlived aclose"


async def _doorbells_wake_receives(rank: int) -> None:
    """With the doorbell receive's recheck timer set to a minute, a ping-pong of 20 round trips
    (alice with bob, and alice with carol) still ends in seconds: each waiting receive was woken by
    its doorbell. Alice sends to both peers in one pass, so their rings go out together."""
    recheck = mpi_module._DOORBELL_RECHECK_S
    mpi_module._DOORBELL_RECHECK_S = 60.0
    ep = MpiTransport(ROSTER)
    try:
        assert ep.receive_mode == "doorbell", ep.receive_mode
        with trio.fail_after(30):
            for i in range(20):
                if rank == 0:
                    await ep.send("bob", b"ping %d" % i)
                    await ep.send("carol", b"ping %d" % i)
                    answers = sorted([await ep.receive(), await ep.receive()])
                    assert answers == [("bob", b"pong %d" % i), ("carol", b"pong %d" % i)], answers
                else:
                    assert await ep.receive() == ("alice", b"ping %d" % i)
                    await ep.send("alice", b"pong %d" % i)
    finally:
        mpi_module._DOORBELL_RECHECK_S = recheck
        await ep.aclose()
    bells = ep._doorbells
    assert bells is not None and bells.sock.fileno() == -1, "the doorbell outlived aclose"
    # Ranks ring each other's closed doorbells in vain (and no file is left behind).
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        assert not mpi_module._ring(probe, bells.addresses[rank]), "a closed doorbell still rings"
    finally:
        probe.close()
    if not bells.addresses[rank].startswith("\0"):
        assert not os.path.exists(bells.addresses[rank]), "the doorbell's file outlived aclose"


async def _path_doorbells_work(rank: int) -> None:
    """Where Linux's abstract namespace is missing (as if on macOS), the doorbell is a socket file
    in a private temporary directory: frames are delivered and the directory is gone after close."""
    real_sys = mpi_module.sys
    mpi_module.sys = types.SimpleNamespace(platform="darwin")  # type: ignore[assignment]
    try:
        ep = MpiTransport(ROSTER)
    finally:
        mpi_module.sys = real_sys
    try:
        assert ep.receive_mode == "doorbell" and ep._doorbells is not None, ep.receive_mode
        path = ep._doorbells.addresses[rank]
        assert os.path.exists(path) and not path.startswith("\0"), path
        with trio.fail_after(30):
            await ep.send(ROSTER[(rank + 1) % 3], b"from %d" % rank)
            assert await ep.receive() == (ROSTER[(rank - 1) % 3], b"from %d" % ((rank - 1) % 3))
    finally:
        await ep.aclose()
    assert not os.path.exists(os.path.dirname(path)), "the doorbell's directory outlived aclose"


async def _receive_nowait_takes_waiting_frames(rank: int, mode: str) -> None:
    """``receive_nowait`` returns ``None`` with nothing waiting; then Bob takes Alice's frames
    (a small, an empty and a 2 MiB one) with it alone, in order, including frames it found still
    in transfer on earlier calls; a frame it took is not received again, and after close
    it raises :class:`TransportClosed`."""
    from mpi4py import MPI

    # In the trio-thread modes every transfer takes 20 polls (_SlowComm), so some calls find a
    # frame matched but still in transfer and must leave it for the next call.
    slow = mode != "thread"
    ep = MpiTransport(ROSTER, comm=_SlowComm(MPI.COMM_WORLD) if slow else None, receive_mode=mode)
    frames = [b"small", b"", bytes(range(256)) * 8192]
    try:
        with trio.fail_after(30):
            assert ep.receive_nowait() is None, "receive_nowait returned a frame nobody sent"
            ep._comm.Barrier()  # nobody sends before every rank has looked
            if rank == 0:
                for frame in frames:
                    await ep.send("bob", frame)
                await ep.send("bob", b"last")
            elif rank == 1:
                got: list[tuple[str, bytes]] = []
                empty_calls = 0
                while len(got) < len(frames):
                    item = ep.receive_nowait()
                    if item is None:
                        empty_calls += 1
                        await trio.sleep(0.001)  # let Alice send (receive_nowait never yields)
                        continue
                    got.append(item)
                assert got == [("alice", f) for f in frames], [(s, len(f)) for s, f in got]
                assert not slow or empty_calls >= 20 * len(frames), f"{empty_calls} calls found a transfer in progress"
                assert await ep.receive() == ("alice", b"last"), "a frame receive_nowait took came again"
                assert ep.receive_nowait() is None
                _say(f"rank {rank}: {mode}: receive_nowait took {len(got)} frames ({empty_calls} empty calls)")
    finally:
        await ep.aclose()
    try:
        ep.receive_nowait()
    except TransportClosed:
        pass
    else:
        raise AssertionError("receive_nowait on a closed endpoint did not raise TransportClosed")


class _Ping(Message, tag="test.mpi.ping"):
    n: int


_State = machine_states("_State", "COLLECT")


class _TwoPings(ProtocolMachine):
    """Alice: sends Bob two pings at start and is done."""

    State = _State
    INITIAL_STATE = _State.COLLECT
    TRANSITIONS: dict = {}

    def _start(self) -> list[Outgoing]:
        out = [self.send("bob", _Ping(n=0)), self.send("bob", _Ping(n=1))]
        self._finish(None)
        return out


class _BusyCollector(ProtocolMachine):
    """Bob: collects two pings; handling the first keeps him busy past his deadline (no progress)."""

    State = _State
    INITIAL_STATE = _State.COLLECT
    TRANSITIONS = {(_State.COLLECT, _Ping): ("_on_ping", _State.COLLECT)}

    def __init__(self, party: str, busy_s: float) -> None:
        super().__init__(party)
        self.busy_s = busy_s
        self.got: list[int] = []

    def pending(self) -> tuple[str, ...]:
        return ("alice",)

    def _on_ping(self, sender: str, message: _Ping) -> list[Outgoing]:
        self.got.append(message.n)
        if len(self.got) == 1:
            time.sleep(self.busy_s)  # the second ping arrives meanwhile
        else:
            self._finish(self.got)
        return []


class _Idle(ProtocolMachine):
    """Carol: done at once."""

    State = _State
    INITIAL_STATE = _State.COLLECT
    TRANSITIONS: dict = {}

    def _start(self) -> list[Outgoing]:
        self._finish(None)
        return []


async def _deadline_reads_waiting_frames(rank: int) -> None:
    """Through the runtime: Bob's deadline passes while he handles Alice's first ping, and her
    second has been waiting in MPI all along. The runtime reads it (``receive_nowait``) before it
    believes the deadline, so Bob finishes with both pings instead of failing with
    ``InsufficientParticipants`` naming Alice (what a transport without ``receive_nowait`` gives)."""
    deadline_s = 1.0
    machine = [_TwoPings("alice"), _BusyCollector("bob", busy_s=2 * deadline_s), _Idle("carol")][rank]
    ep = MpiTransport(ROSTER)
    try:
        with trio.fail_after(30):
            result = await run_party(machine, ep, config=RuntimeConfig(session=29, deadline_s=deadline_s))
    finally:
        await ep.aclose()
    if rank == 1:
        assert result == [0, 1], result
        _say(f"rank {rank}: the expired deadline read the waiting frame")


def _assert_refused(receive_mode: str, reason: str, what: str) -> None:
    """``MpiTransport(ROSTER, receive_mode=receive_mode)`` raises a ValueError saying ``reason``
    (AssertionError with ``what`` if it is accepted)."""
    try:
        MpiTransport(ROSTER, receive_mode=receive_mode)
    except ValueError as exc:
        assert reason in str(exc), exc
    else:
        raise AssertionError(what)


def _modes_fall_back_together(rank: int) -> None:
    """When one rank (carol) cannot bind a doorbell, no rank uses doorbells: the default is the
    reader thread everywhere, and asking for doorbells is refused on every rank."""
    real_socket = mpi_module.socket.socket

    def no_unix_datagrams(*args: Any, **kwargs: Any) -> Any:
        raise OSError("no Unix datagram sockets here (test)")

    if rank == 2:
        mpi_module.socket.socket = no_unix_datagrams  # type: ignore[misc]
    try:
        ep = MpiTransport(ROSTER)
        assert ep.receive_mode == "thread", (rank, ep.receive_mode)
        _assert_refused("doorbell", "every rank on this host", "receive_mode='doorbell' was accepted while a rank had no doorbell")
    finally:
        mpi_module.socket.socket = real_socket  # type: ignore[misc]


def _thread_mode_needs_thread_multiple() -> None:
    """As if MPI offered only MPI_THREAD_SERIALIZED: doorbells stay the default (they make every
    MPI call from the trio thread) and ``receive_mode="thread"`` is refused."""
    from mpi4py import MPI

    query = MPI.Query_thread
    MPI.Query_thread = lambda: MPI.THREAD_SERIALIZED
    try:
        assert MpiTransport(ROSTER).receive_mode == "doorbell"
        _assert_refused("thread", "MPI_THREAD_MULTIPLE", "receive_mode='thread' was accepted without MPI_THREAD_MULTIPLE")
    finally:
        MPI.Query_thread = query
    _assert_refused("spin", "receive_mode must be one of doorbell, thread, poll", "an unknown receive_mode was accepted")


def _roster_size_is_checked() -> None:
    try:
        MpiTransport((*ROSTER, "dave"))
    except ValueError as exc:
        assert "mpiexec -n 4" in str(exc), exc
    else:
        raise AssertionError("a 4-party roster on 3 ranks was accepted")


def _say(line: str) -> None:
    # One write per line, so lines of different ranks do not interleave mid-line.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _main(rank: int) -> None:
    with trio.fail_after(TIMEOUT_S):
        assert MpiTransport(ROSTER).receive_mode == "doorbell", "every rank is on this host"
        for mode in RECEIVE_MODES:
            ep = MpiTransport(ROSTER, receive_mode=mode)
            assert ep.party == ROSTER[rank] and ep.receive_mode == mode, (ep.party, rank, ep.receive_mode)
            for check in CHECKS:
                started = time.perf_counter()
                await check(ep)
                _say(f"rank {rank}: {mode}: {check.__name__} ok ({time.perf_counter() - started:.2f} s)")
            await check_close_semantics(ep)
        await _oversized_frames_are_dropped(rank)
        await _receive_cancelled_mid_transfer(rank, "poll")
        await _receive_cancelled_mid_transfer(rank, "doorbell")
        await _threaded_receive_cancelled_often(rank)
        await _doorbells_wake_receives(rank)
        await _path_doorbells_work(rank)
        for mode in RECEIVE_MODES:
            await _receive_nowait_takes_waiting_frames(rank, mode)
        await _deadline_reads_waiting_frames(rank)
        _modes_fall_back_together(rank)
        _thread_mode_needs_thread_multiple()
        _roster_size_is_checked()


def main() -> int:
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    try:
        trio.run(_main, rank)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
        return 1
    MPI.COMM_WORLD.Barrier()
    _say(f"rank {rank}: conformance ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""MPI transport: one party per rank, frames as MPI messages; a waiting receive is woken by a doorbell.

Theory of operation
-------------------
Launch the run with ``mpiexec -n <len(roster)>``; rank ``i`` hosts party ``roster[i]``. Each
endpoint works on its own duplicate of the communicator (``comm.Dup()``, collective: every rank
constructs its endpoint), so other MPI traffic in the program cannot match our messages, and sets
``MPI.ERRORS_RETURN`` on it so MPI errors surface as Python exceptions.

* ``send`` posts an ``Isend`` of the frame's bytes and returns; the bytes and the request are kept
  until MPI reports completion. Sends are not awaited to completion because two parties that
  both send large frames before receiving (a common round shape) would otherwise deadlock under
  MPI's rendezvous protocol; this matches the memory and TCP transports, whose ``send`` never
  waits for the peer to read. Outstanding sends are advanced on every later call into the
  endpoint and flushed by ``aclose``.
* MPI has no way to sleep until a message arrives: its blocking calls busy-poll. (A reader
  thread blocked in MPICH's ``Mprobe``, even with MPICH told to sleep between idle polls, was
  measured slower than the modes below: the trio thread's own ``Isend`` calls waited behind it
  for MPICH's lock; ``docs/transports.md``.) So how a waiting ``receive`` learns that a frame is
  there is chosen at construction (``receive_mode``):

  - ``"doorbell"`` (the default when every rank runs on this host): each endpoint also binds a
    Unix datagram socket, its *doorbell* (in Linux's abstract namespace, elsewhere in a private
    temporary directory), and the ranks exchange the addresses (``allgather``) and check that
    every ring arrives. A ring carries nothing: a stray datagram only makes a receiver look at
    MPI once more. After posting the ``Isend`` of a frame, ``send`` rings
    the receiver's doorbell with an empty datagram; the rings of one trio scheduling pass are
    sent together (``run_sync_soon``), or at once when this party starts waiting, so a party
    that sends to several peers is not preempted by the first peer it wakes. A ``receive``
    with nothing to take sleeps in ``trio.lowlevel.wait_readable`` on its own doorbell: no
    thread, no polling, and every MPI call is made by the trio thread (any MPI thread level
    does). Woken, it empties the doorbell and then matched-probes (``Improbe``, up to
    :data:`_PROBES_PER_WAKE` times: MPICH may need one progress poll before the message shows).
    A ring can go unnoticed only if MPI had not delivered the message when the doorbell was
    read; so a waiting receive also looks again every :data:`_DOORBELL_RECHECK_S`, and while
    its own sends are outstanding it keeps advancing them every millisecond and rings again
    when one completes.
  - ``"thread"`` (the default when a peer is on another host and MPI provides
    ``MPI_THREAD_MULTIPLE``, which mpi4py asks for and MPICH provides): a reader thread,
    started by the first ``receive``, polls a matched probe (``Improbe``), reads the frame
    length with ``Get_count``, ``Recv``s it and hands it to trio through an unbounded channel
    (``run_sync_soon`` on the run's token). Between idle polls the thread sleeps with
    ``time.sleep``, from 10 us doubling to 100 us after 64 bare polls. ``aclose`` stops the
    thread (it finishes the message in hand).
  - ``"poll"`` (otherwise): ``receive`` polls ``Improbe`` from trio, spaced by ``trio.sleep``:
    a few bare checkpoints, then backing off from 50 us to 1 ms (trio's ``epoll`` waits round
    up to whole milliseconds, so every sleep lasts about 1 ms).

  In every mode a cancelled ``receive`` loses nothing: a frame taken by the reader thread stays
  in the channel, and a matched receive in progress belongs to the endpoint, not to the
  ``receive`` call, so the next call finishes it.
* ``receive_nowait`` takes a frame MPI already holds without waiting or yielding: in the
  doorbell and poll modes the matched probes a woken receive makes and one test of the transfer
  (a frame still in transfer is left to the next call, or to ``receive``, which finishes it); in
  thread mode what the reader thread has delivered. The runtime calls it when a phase deadline
  passes, so a party that was busy reads the frames that waited meanwhile before its deadline
  counts as silence.
* MPI's non-overtaking rule (same source, communicator and tag) gives per-pair order; each frame
  is one message, so frames from concurrent senders never interleave. Empty frames are empty
  messages.
* A frame above ``max_frame_bytes`` cannot be refused by MPI, so it is received into an empty
  scratch buffer: MPI truncates it (``MPI_ERR_TRUNCATE``, nothing is stored), and it is dropped
  with a WARNING on ``logging.getLogger("fedproto.transports.mpi")``.

* Ranks started with different arguments (``mpiexec -n 1 ... : -n 2 ...``) would each run a
  consistent computation of their own. An endpoint made with an ``agreement``
  (:class:`fedproto.agreement.Agreement`) compares it with every other rank's in one collective
  when it is made (an ``Allgather`` of 32-byte digests), before any frame moves; when they
  differ (only then) the ranks gather the records themselves and every rank raises
  :class:`~fedproto.errors.AgreementMismatch` naming the first rank's party whose record differs
  from its own, and the first option that does.

Bytes: MPI messages carry their own envelope and doorbells carry nothing of the run, so
``framing_overhead_bytes == 0``. Measured with ``benchmarks/transport_rounds.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from fedproto.agreement import Agreement, check as check_agreement
from fedproto.codec import DEFAULT_MAX_FRAME_BYTES
from fedproto.errors import AgreementMismatch, PeerUnreachable, TransportBroken, TransportClosed
from fedproto.transport import Network, Transport

__all__ = ["MpiTransport", "MpiNetwork", "RECEIVE_MODES"]

log = logging.getLogger("fedproto.transports.mpi")

#: How a waiting receive learns that a frame arrived (see the module docstring).
RECEIVE_MODES = ("doorbell", "thread", "poll")
_TAG = 0  # the communicator is our own duplicate, so one tag suffices
_PROBES_PER_WAKE = 4  # matched probes after a doorbell rang before waiting again
_DOORBELL_RECHECK_S = 0.02  # a waiting doorbell receive probes again after this long
_READER_SPIN_POLLS = 64  # reader-thread polls before it starts sleeping
_READER_FIRST_SLEEP_S = 10e-6  # then time.sleep (microsecond resolution), doubling ...
_READER_MAX_SLEEP_S = 100e-6  # ... up to this: a frame waits at most about this long
_SPIN_POLLS = 8  # polls spaced by bare checkpoints before backing off
_FIRST_SLEEP_S = 50e-6
_MAX_SLEEP_S = 1e-3
# Sends MPI never completed before aclose gave up: their buffers must outlive the requests.
_ABANDONED: list[tuple[Any, bytes]] = []


def _import_mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(
            "the MPI transport needs mpi4py and an MPI library: pip install 'fedproto[mpi]' "
            "(mpi4py and mpich), then launch with mpiexec"
        ) from exc
    return MPI


class _Backoff:
    """Adaptive poll spacing: bare checkpoints first, then sleeps doubling up to 1 ms."""

    def __init__(self) -> None:
        self.polls = 0

    def reset(self) -> None:
        self.polls = 0

    async def wait(self) -> None:
        if self.polls < _SPIN_POLLS:
            await trio.sleep(0)
        else:
            # the exponent is capped: an idle rank polls for a long time and 2**n must stay a float
            await trio.sleep(min(_MAX_SLEEP_S, _FIRST_SLEEP_S * 2.0 ** min(self.polls - _SPIN_POLLS, 30)))
        self.polls += 1


@dataclasses.dataclass
class _PendingReceive:
    source: int
    length_bytes: int
    buffer: bytearray
    request: Any
    oversized: bool


@dataclasses.dataclass
class _PendingSend:
    request: Any
    data: bytes
    dest: int  # rank


class _Doorbells:
    """This rank's doorbell (a bound Unix datagram socket) and every rank's address.

    Built collectively by :meth:`open`; see the module docstring. On Linux the address is in the
    abstract namespace (nothing on disk); elsewhere it is a path in a private temporary directory,
    removed by :meth:`close`, or when the object is collected or the interpreter exits.
    """

    def __init__(self, sock: socket.socket, directory: str | None, addresses: list[str]) -> None:
        self.sock = sock
        self.addresses = addresses
        self._cleanup = weakref.finalize(self, _close_doorbell, sock, directory)

    @classmethod
    def open(cls, comm: Any, wanted: bool) -> _Doorbells | None:
        """Collective over ``comm``: every rank that ``wanted`` doorbells binds one, all exchange
        addresses and check they reach each other. Returns this rank's doorbells when every rank
        wanted them and every ring arrived (then all ranks get theirs), else ``None`` everywhere."""
        sock: socket.socket | None = None
        directory: str | None = None
        address: str | None = None
        if wanted:
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                if sys.platform == "linux":
                    address = "\0fedproto-mpi-" + secrets.token_hex(8)
                else:
                    directory = tempfile.mkdtemp(prefix="fedproto-mpi-")
                    address = os.path.join(directory, "bell")
                sock.bind(address)
                sock.setblocking(False)
            except (OSError, AttributeError) as exc:  # no AF_UNIX datagrams here (Windows)
                log.debug("no MPI doorbell: %s", exc)
                address = None
        addresses = comm.allgather(address)
        reached = all(a is not None for a in addresses) and all(_ring(sock, a) for a in addresses)
        everywhere = comm.allreduce(int(reached), op=_import_mpi().MIN) == 1
        if everywhere and sock is not None:
            bells = cls(sock, directory, addresses)
            bells.drain()  # the test rings
            return bells
        _close_doorbell(sock, directory)
        return None

    def drain(self) -> None:
        """Take every ring waiting on this doorbell."""
        try:
            while True:
                self.sock.recv(1)
        except (BlockingIOError, InterruptedError):
            pass

    def ring(self, rank: int) -> None:
        """Ring ``rank``'s doorbell (a full queue already holds rings; a closed one is ignored)."""
        _ring(self.sock, self.addresses[rank])

    def close(self) -> None:
        """Close the socket and remove its directory (idempotent)."""
        self._cleanup()


def _close_doorbell(sock: socket.socket | None, directory: str | None) -> None:
    if sock is not None:
        sock.close()
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def _ring(sock: socket.socket | None, address: str | None) -> bool:
    """Send one empty datagram to ``address``; whether it was delivered or the queue was full."""
    if sock is None or address is None:
        return False
    try:
        sock.sendto(b"", address)
    except BlockingIOError:
        return True  # the peer's queue is full of rings it has not read yet
    except OSError:
        return False  # gone (closed endpoint) or unreachable (another host's path)
    return True


def _compare_agreements(comm: Any, agreement: Agreement | None, roster: Sequence[str]) -> None:
    """One ``Allgather`` of the ranks' record digests; where they differ, name the difference.

    Raises:
        AgreementMismatch: at every rank, when any two ranks' records differ.
    """
    import numpy as np

    MPI = _import_mpi()
    size, rank = comm.Get_size(), comm.Get_rank()
    record = b"" if agreement is None else agreement.to_bytes()
    digest = bytes(32) if agreement is None else hashlib.sha256(record).digest()
    digests = np.empty((size, 32), dtype=np.uint8)
    comm.Allgather(np.frombuffer(digest, dtype=np.uint8), digests)
    if (digests == digests[0]).all():
        return
    # Only a run that is about to end pays for this: the records, to say what differs.
    sizes = np.empty(size, dtype=np.int64)
    comm.Allgather(np.array([len(record)], dtype=np.int64), sizes)
    displs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    gathered = np.empty(int(sizes.sum()), dtype=np.uint8)
    comm.Allgatherv(np.frombuffer(record, dtype=np.uint8), [gathered, sizes.tolist(), displs.tolist(), MPI.BYTE])
    other = next(r for r in range(size) if (digests[r] != digests[rank]).any())
    raw = gathered[displs[other] : displs[other] + sizes[other]].tobytes()
    try:
        theirs = Agreement.from_bytes(raw) if raw else None
    except ValueError as exc:
        raise AgreementMismatch(f"rank {other} sent a malformed agreement record: {exc}", party=roster[other]) from None
    check_agreement(agreement, theirs, this_party=roster[rank], other=roster[other])
    raise AgreementMismatch(f"{roster[other]}'s agreement record differs from this party's", party=roster[other])


class MpiTransport(Transport):
    """The endpoint of this rank's party (see the module docstring).

    Close it with :meth:`aclose` (`MpiNetwork.endpoints` does) before MPI is finalized: a reader
    thread keeps polling MPI until then, and the doorbell is closed then.

    Args:
        roster: every party of the run, rank order (``roster[i]`` runs on rank ``i``).
        comm: the communicator to duplicate (``MPI.COMM_WORLD`` by default); its size must equal
            ``len(roster)``. Construction is collective over it.
        max_frame_bytes: longest frame sent or accepted (bytes).
        close_timeout_s: how long ``aclose`` waits for outstanding sends to complete (seconds).
        receive_mode: how a waiting receive learns of a frame, one of :data:`RECEIVE_MODES`;
            ``None``: ``"doorbell"`` when every rank gets a doorbell that every other rank
            reaches (all on one host), else ``"thread"`` when MPI provides
            ``MPI_THREAD_MULTIPLE``, else ``"poll"``. Every rank must pass the same value.
        agreement: what this rank's party runs (:class:`fedproto.agreement.Agreement`),
            compared with every rank's here; ``None`` agrees only with ranks that pass none.

    Attributes:
        rank: this process's rank in ``comm``.
        receive_mode: the mode in use.

    Raises:
        ImportError: mpi4py (or its MPI library) is not installed.
        ValueError: the roster is empty or has duplicates, its length differs from the
            communicator's size, ``receive_mode`` is not one of :data:`RECEIVE_MODES`, or the
            mode asked for is not available (``"thread"`` without ``MPI_THREAD_MULTIPLE``,
            ``"doorbell"`` with a rank on another host or without Unix datagram sockets).
        AgreementMismatch: a rank runs another protocol, other options or another roster.
    """

    framing_overhead_bytes = 0

    def __init__(
        self,
        roster: Sequence[str],
        *,
        comm: Any = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        close_timeout_s: float = 10.0,
        receive_mode: str | None = None,
        agreement: Agreement | None = None,
    ) -> None:
        MPI = _import_mpi()
        roster = tuple(roster)
        if not roster or len(set(roster)) != len(roster) or not all(isinstance(p, str) for p in roster):
            raise ValueError("the roster must be a non-empty sequence of unique party names (str)")
        if not 0 < max_frame_bytes < 2**31:
            # MPI counts of MPI_BYTE are C ints in the classic (non-"large count") calls.
            raise ValueError(f"max_frame_bytes must be in 1..2**31-1, got {max_frame_bytes}")
        if not (close_timeout_s >= 0 and math.isfinite(close_timeout_s)):
            raise ValueError(
                f"close_timeout_s must be a non-negative number of seconds, got {close_timeout_s}"
            )
        if receive_mode is not None and receive_mode not in RECEIVE_MODES:
            raise ValueError(f"receive_mode must be one of {', '.join(RECEIVE_MODES)} or None, got {receive_mode!r}")
        base = MPI.COMM_WORLD if comm is None else comm
        size = base.Get_size()
        if size != len(roster):
            raise ValueError(
                f"the roster has {len(roster)} parties but the communicator has {size} ranks "
                f"(launch with mpiexec -n {len(roster)})"
            )
        self._MPI = MPI
        self._comm = base.Dup()
        self._comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.rank: int = self._comm.Get_rank()
        self.roster = roster
        self.party = roster[self.rank]
        try:
            _compare_agreements(self._comm, agreement, roster)
        except AgreementMismatch:
            self._comm.Free()
            raise
        self.max_frame_bytes = max_frame_bytes
        self.close_timeout_s = float(close_timeout_s)
        self._rank_of = {p: i for i, p in enumerate(roster)}
        self._pending_sends: list[_PendingSend] = []
        self._pending_receive: _PendingReceive | None = None
        self._receive_lock = trio.Lock()
        self._closed = False
        multiple = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
        if receive_mode == "thread" and not multiple:
            raise ValueError("receive_mode='thread' needs MPI_THREAD_MULTIPLE, which this MPI does not provide")
        # Collective: every rank takes part, whatever its mode.
        self._doorbells = _Doorbells.open(self._comm, wanted=receive_mode in (None, "doorbell"))
        if receive_mode == "doorbell" and self._doorbells is None:
            raise ValueError(
                "receive_mode='doorbell' needs every rank on this host, with Unix datagram sockets"
            )
        self.receive_mode: str = (
            "doorbell" if self._doorbells is not None else receive_mode or ("thread" if multiple else "poll")
        )
        self._unrung: set[int] = set()  # ranks sent a frame whose doorbell has not rung yet
        self._rings_scheduled = False
        self._reader: threading.Thread | None = None
        self._stop = threading.Event()
        self._inbox_in, self._inbox = trio.open_memory_channel[Any](math.inf)

    def __repr__(self) -> str:
        return f"<MpiTransport {self.party} (rank {self.rank}){' closed' if self._closed else ''}>"

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosed(f"the endpoint of {self.party} is closed", party=self.party)

    def _broken(self, what: str, exc: BaseException) -> TransportBroken:
        return TransportBroken(f"MPI failed to {what}: {exc}", party=self.party)

    def _progress_sends(self) -> None:
        if not self._pending_sends:
            return
        still: list[_PendingSend] = []
        try:
            for pending in self._pending_sends:
                if not pending.request.Test():
                    still.append(pending)
                elif self._doorbells is not None:
                    self._unrung.add(pending.dest)  # in case the frame reached MPI's queue only now
        except self._MPI.Exception as exc:
            raise self._broken("complete a send", exc) from exc
        self._pending_sends = still

    # -- doorbells --------------------------------------------------------------------------------

    def _ring_all(self) -> None:
        """Ring the doorbell of every rank sent a frame since the last rings."""
        self._rings_scheduled = False
        if self._doorbells is None or self._doorbells.sock.fileno() < 0:
            return
        while self._unrung:
            self._doorbells.ring(self._unrung.pop())

    def _schedule_rings(self) -> None:
        """Ring at the end of this trio scheduling pass (once for every frame sent in it)."""
        if not self._rings_scheduled:
            self._rings_scheduled = True
            trio.lowlevel.current_trio_token().run_sync_soon(self._ring_all)

    async def _wait_for_doorbell(self) -> None:
        """Sleep until this endpoint's doorbell rings, or the recheck (a millisecond while sends
        are outstanding) passes.

        Raises:
            TransportClosed: the endpoint was closed meanwhile.
        """
        assert self._doorbells is not None
        self._ring_all()
        with trio.move_on_after(_MAX_SLEEP_S if self._pending_sends else _DOORBELL_RECHECK_S):
            try:
                await trio.lowlevel.wait_readable(self._doorbells.sock)
            except trio.ClosedResourceError:
                raise TransportClosed(f"the endpoint of {self.party} is closed", party=self.party) from None

    # -- sending -----------------------------------------------------------------------------------

    async def send(self, dest: str, frame: bytes) -> None:
        """Post ``frame`` to ``dest`` (see :meth:`Transport.send`).

        Returns once MPI owns the message (it completes in the background and ``aclose``
        flushes it); in doorbell mode the receiver's doorbell rings at the end of this
        scheduling pass. A cancelled send posts nothing.

        Raises:
            PeerUnreachable: ``dest`` is not in the roster.
            TransportClosed: this endpoint was closed.
            TransportBroken: MPI reported an error.
            ValueError: the frame exceeds ``max_frame_bytes``.
        """
        self._check_open()
        rank = self._rank_of.get(dest)
        if rank is None:
            raise PeerUnreachable(f"{dest!r} is not in the roster", party=dest)
        data = bytes(frame)
        if len(data) > self.max_frame_bytes:
            raise ValueError(f"frame of {len(data)} bytes exceeds the maximum of {self.max_frame_bytes}")
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            request = self._comm.Isend([data, self._MPI.BYTE], dest=rank, tag=_TAG)
        except self._MPI.Exception as exc:
            raise self._broken(f"send to {dest}", exc) from exc
        self._pending_sends.append(_PendingSend(request, data, rank))
        if self._doorbells is not None:
            self._unrung.add(rank)
            self._schedule_rings()
        self._progress_sends()
        await trio.lowlevel.cancel_shielded_checkpoint()

    # -- receiving from trio (doorbell and poll modes) ----------------------------------------------

    def _start_receive(self) -> bool:
        """Match the next message, if any, and start receiving it."""
        MPI = self._MPI
        status = MPI.Status()
        try:
            message = self._comm.Improbe(MPI.ANY_SOURCE, _TAG, status)
            if message is None:
                return False
            length = status.Get_count(MPI.BYTE)
            oversized = length > self.max_frame_bytes
            buffer = bytearray(0 if oversized else length)
            request = message.Irecv([buffer, MPI.BYTE])
        except MPI.Exception as exc:
            raise self._broken("receive", exc) from exc
        self._pending_receive = _PendingReceive(status.Get_source(), length, buffer, request, oversized)
        return True

    def _finish_receive(self) -> bool:
        """Whether the matched receive in progress has completed (then it is cleared)."""
        pending = self._pending_receive
        assert pending is not None
        try:
            done = pending.request.Test()
        except self._MPI.Exception as exc:
            if not (pending.oversized and exc.Get_error_class() == self._MPI.ERR_TRUNCATE):
                self._pending_receive = None
                raise self._broken(f"receive from {self.roster[pending.source]}", exc) from exc
            done = True
        if done:
            self._pending_receive = None
        return done

    def _completed(self, pending: _PendingReceive) -> tuple[str, bytes] | None:
        """The ``(sender, frame)`` of a completed receive, or ``None`` for an oversized frame
        (dropped with a warning)."""
        sender = self.roster[pending.source]
        if not pending.oversized:
            return sender, bytes(pending.buffer)
        log.warning(
            "%s: dropped a frame of %d bytes from %s (maximum %d)",
            self.party, pending.length_bytes, sender, self.max_frame_bytes,
        )
        return None

    async def _receive_here(self) -> tuple[str, bytes]:
        """Receive in the trio thread: sleep on the doorbell, or poll with back-off."""
        backoff = _Backoff()
        doorbells = self._doorbells
        while True:
            self._check_open()
            if doorbells is not None:
                doorbells.drain()  # before probing: a ring after this wakes the next wait
            self._progress_sends()
            probes = _PROBES_PER_WAKE if doorbells is not None else 1
            if self._pending_receive is not None or any(self._start_receive() for _ in range(probes)):
                pending = self._pending_receive
                assert pending is not None
                if self._finish_receive():
                    item = self._completed(pending)
                    if item is not None:
                        return item
                    backoff.reset()
                    continue
                await backoff.wait()  # a transfer in progress: MPI needs polls to advance it
            elif doorbells is not None:
                await self._wait_for_doorbell()
            else:
                await backoff.wait()

    # -- receiving in a reader thread (thread mode) ----------------------------------------------

    def _start_reader(self) -> None:
        token = trio.lowlevel.current_trio_token()
        self._reader = threading.Thread(
            target=self._read, args=(token,), name=f"fedproto-mpi-{self.party}", daemon=True
        )
        self._reader.start()

    def _deliver(self, item: Any) -> None:
        """In the trio thread: queue what the reader received (nothing once the endpoint closed)."""
        try:
            self._inbox_in.send_nowait(item)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    def _read(self, token: trio.lowlevel.TrioToken) -> None:
        """The reader thread: matched probes and receives, sleeping between idle polls."""
        MPI = self._MPI
        idle = 0
        while not self._stop.is_set():
            status = MPI.Status()
            item: Any
            try:
                message = self._comm.Improbe(MPI.ANY_SOURCE, _TAG, status)
                if message is None:
                    idle += 1
                    if idle > _READER_SPIN_POLLS:
                        exponent = min(idle - _READER_SPIN_POLLS, 30)
                        time.sleep(min(_READER_MAX_SLEEP_S, _READER_FIRST_SLEEP_S * 2.0**exponent))
                    continue
                idle = 0
                source, length = status.Get_source(), status.Get_count(MPI.BYTE)
                oversized = length > self.max_frame_bytes
                buffer = bytearray(0 if oversized else length)
                try:
                    message.Recv([buffer, MPI.BYTE])
                except MPI.Exception as exc:
                    if not (oversized and exc.Get_error_class() == MPI.ERR_TRUNCATE):
                        raise
                item = (source, length, buffer, oversized)
            except MPI.Exception as exc:
                item = exc
            try:
                token.run_sync_soon(self._deliver, item)
            except trio.RunFinishedError:
                return
            if isinstance(item, BaseException):
                return

    def _delivered(self, item: Any) -> tuple[str, bytes] | None:
        """The ``(sender, frame)`` of what the reader thread delivered, or ``None`` for an
        oversized frame (dropped with a warning).

        Raises:
            TransportBroken: the reader thread met an MPI error.
        """
        if isinstance(item, BaseException):
            raise self._broken("receive", item) from item
        source, length, buffer, oversized = item
        sender = self.roster[source]
        if not oversized:
            return sender, bytes(buffer)
        log.warning(
            "%s: dropped a frame of %d bytes from %s (maximum %d)", self.party, length, sender, self.max_frame_bytes
        )
        return None

    async def _receive_threaded(self) -> tuple[str, bytes]:
        if self._reader is None:
            self._start_reader()
        while True:
            self._progress_sends()
            try:
                item = await self._inbox.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                raise TransportClosed(f"the endpoint of {self.party} is closed", party=self.party) from None
            frame = self._delivered(item)
            if frame is not None:
                return frame

    async def _stop_reader(self) -> None:
        """End the reader thread (it finishes the message in hand) and wait for it."""
        self._stop.set()
        reader = self._reader
        if reader is None:
            return
        with trio.move_on_after(self.close_timeout_s):
            await trio.to_thread.run_sync(reader.join, abandon_on_cancel=True)
        if reader.is_alive():
            log.warning("%s: the MPI reader thread did not stop within %g s", self.party, self.close_timeout_s)

    # -- the Transport interface ------------------------------------------------------------------

    async def receive(self) -> tuple[str, bytes]:
        """Wait for the next ``(sender, frame)`` (see :meth:`Transport.receive`).

        Cancelling it loses no frame. Oversized frames are dropped with a warning.

        Raises:
            TransportClosed: this endpoint was closed (also while waiting).
            TransportBroken: MPI reported an error.
        """
        self._check_open()
        async with self._receive_lock:
            if self.receive_mode == "thread":
                return await self._receive_threaded()
            return await self._receive_here()

    def receive_nowait(self) -> tuple[str, bytes] | None:
        """The next ``(sender, frame)`` MPI already holds for this endpoint, else ``None``; never
        waits or yields (see :meth:`Transport.receive_nowait`).

        The runtime calls it when a phase deadline passes, so frames that arrived while the party
        was busy are read before its silence counts. In the doorbell and poll modes it makes the
        matched probes a waking receive makes (``Improbe``, up to :data:`_PROBES_PER_WAKE`) and
        one ``Test`` of the transfer: a frame still in transfer (a large one under MPI's
        rendezvous protocol) is left to the next call, or to :meth:`receive`, which finishes it.
        In thread mode it takes what the reader thread has delivered (starting the thread if no
        :meth:`receive` has yet). The doorbell is not emptied, so a waiting :meth:`receive` in
        another task still wakes for what it rings for. Oversized frames are dropped with a
        warning, as :meth:`receive` drops them.

        Raises:
            TransportClosed: this endpoint was closed.
            TransportBroken: MPI reported an error.
        """
        self._check_open()
        if self.receive_mode == "thread":
            if self._reader is None:
                self._start_reader()
            self._progress_sends()
            while True:
                try:
                    item = self._inbox.receive_nowait()
                except trio.WouldBlock:
                    return None
                except (trio.EndOfChannel, trio.ClosedResourceError):
                    raise TransportClosed(f"the endpoint of {self.party} is closed", party=self.party) from None
                frame = self._delivered(item)
                if frame is not None:
                    return frame
        self._progress_sends()
        while True:
            if self._pending_receive is None and not any(self._start_receive() for _ in range(_PROBES_PER_WAKE)):
                return None
            pending = self._pending_receive
            assert pending is not None
            if not self._finish_receive():
                return None  # still in transfer: the next call, or receive(), finishes it
            frame = self._completed(pending)
            if frame is not None:
                return frame

    async def aclose(self) -> None:
        """Flush outstanding sends (up to ``close_timeout_s``), then close; idempotent.

        A matched receive in progress is completed and its frame discarded. MPI itself is not
        finalized. Afterwards ``send`` and ``receive`` raise
        :class:`~fedproto.errors.TransportClosed`.
        """
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        self._inbox_in.close()  # a receive waiting now ends with TransportClosed
        if self._doorbells is not None:
            self._ring_all()  # the frames of this pass
            trio.lowlevel.notify_closing(self._doorbells.sock)  # ... and so does one sleeping here
        try:
            with trio.move_on_after(self.close_timeout_s):
                backoff = _Backoff()
                while self._pending_sends or self._pending_receive is not None:
                    self._progress_sends()
                    if self._pending_receive is not None:
                        self._finish_receive()
                    await backoff.wait()
            await trio.lowlevel.checkpoint()
            await self._stop_reader()
        finally:
            if self._doorbells is not None:
                self._ring_all()  # sends completed while flushing
                self._doorbells.close()
            if self._pending_sends:
                log.warning(
                    "%s: closing with %d sends MPI has not completed (their peers are not "
                    "receiving)", self.party, len(self._pending_sends),
                )
                _ABANDONED.extend((p.request, p.data) for p in self._pending_sends)
                self._pending_sends = []
            if self._pending_receive is not None:
                _ABANDONED.append((self._pending_receive.request, self._pending_receive.buffer))
                self._pending_receive = None


class MpiNetwork(Network):
    """MPI endpoints for the CLI registry: this rank's party only.

    Args:
        comm: communicator (``MPI.COMM_WORLD`` by default).
        **kwargs: passed to :class:`MpiTransport`.
    """

    name = "mpi"
    description = "one party per MPI rank under mpiexec (mpi4py with MPICH: pip install 'fedproto[mpi]')"
    #: MPI counts are C ints: the largest frame one message can carry.
    max_frame_bytes_limit = 2**31 - 1

    def __init__(self, *, comm: Any = None, **kwargs: Any) -> None:
        self.comm = comm
        self.kwargs = kwargs

    @asynccontextmanager
    async def endpoints(
        self, roster: Sequence[str], local: Sequence[str] | None = None
    ) -> AsyncIterator[dict[str, MpiTransport]]:
        """``{party: endpoint}`` for this rank's party; flushed and closed on exit.

        Raises:
            ValueError: ``local`` names anything but this rank's party.
        """
        endpoint = MpiTransport(roster, comm=self.comm, **self.kwargs)
        try:
            if local is not None and tuple(local) != (endpoint.party,):
                raise ValueError(
                    f"under MPI rank {endpoint.rank} hosts exactly {endpoint.party!r}, not {list(local)}"
                )
            yield {endpoint.party: endpoint}
        finally:
            with trio.CancelScope(shield=True):
                await endpoint.aclose()

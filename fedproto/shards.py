"""One lean simulation spread over MPI ranks: where each party runs, and how the ranks meet.

:func:`fedproto.simulation.simulate` drives every machine of a run from one loop. Given
``shards=`` a :class:`Shards`, each MPI rank drives only the machines placed on it, with the same
loop, and the ranks meet in bulk-synchronous steps:

1. **Local work.** A rank delivers the frames in its queue, first in, first out, until none is
   left, or until it has made 1,024 deliveries since the last exchange
   (``fedproto.simulation._FLUSH_DELIVERIES``; a broadcast counts one per local receiver): the
   ranks then meet with work still queued, so what each sent reaches the others while they work
   on (a count, not a time: the order stays independent of timing). Every action is encoded once and metered per link at the sender, exactly as in one
   process; a frame for a party on this rank goes to the local queue, a frame for a party on
   another rank waits in that rank's outbox (a broadcast once per destination rank, with the
   receivers it has there).
2. **Exchange.** Every rank then takes part in one exchange: an ``Allgather`` of a few numbers
   (machines not done, bytes waiting to go, a failure, the earliest deadline, progress since the
   last deadline) and, when any rank has frames to send, one ``Alltoall`` of byte counts and one
   ``Alltoallv`` of the outboxes: one message per destination rank per step, never one per frame.
   Received frames join the queue in source-rank order, each source's in the order it sent them,
   so delivery order depends only on the placement, never on timing. Each frame is decoded at its
   receiving rank under the run's frame limit (once per rank for a broadcast).
3. **Time.** When no rank has anything in its queue or outbox, the virtual clock jumps to the
   earliest deadline over all ranks (the same number on every rank), and the machines due then
   get :class:`~fedproto.messages.PhaseTimedOut`: the lean engine's rule, agreed between ranks.
4. **The end.** When no machine is left anywhere, every rank's meter is gathered at rank 0 and
   added to its meter (per link, exactly), with each rank's peak resident memory and its seconds
   spent waiting in exchanges (:attr:`fedproto.metering.Meter.ranks`, the report's ``ranks``).

A failure on any rank (a machine's error, a frame it could not encode, a stalled run) is carried
by the next exchange: the rank that saw it raises it, every other rank raises
:class:`ShardFailed` with the same record (type, message, the reporting party, the culprits), and
the meters are still gathered, so rank 0 can write the failed run's report. No rank is left
waiting in a collective. When several ranks fail in the same step, the lowest rank's failure is
the run's.

Collectives are non-blocking (``Iallgather``, ``Ialltoallv``) and waited on by testing with short
sleeps between tests, so a rank that waits does not spin a core away from ranks still working (a
blocking MPICH collective busy-polls: with more ranks than cores that would halve the speed).

With one rank the loop is the lean engine's own: no frame ever leaves the process.

Example (under ``mpiexec -n 4 python script.py``)::

    shards = Shards(plan.roster)                 # MPI.COMM_WORLD, the default placement
    machines = {p: plan.make_machine(p) for p in shards.local}
    results = simulate(machines, shards=shards, config=config, meter=meter)
    # results: this rank's parties; meter (at rank 0): the whole run's links and bytes
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import resource
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

from fedproto.errors import FedProtoError
from fedproto.metering import MAX_REJECTED_KEPT, Meter, error_record

__all__ = ["Shards", "ShardFailed", "block_placement"]

# The status each rank contributes to an exchange (float64 entries).
_REMAINING, _OUT_BYTES, _FAILED, _EARLIEST, _PROGRESS, _QUEUED, _SIZE = range(7)


class ShardFailed(FedProtoError):
    """A sharded simulation ended because of a failure on another rank; its text is that failure's
    (the line the run in one process would print).

    Attributes:
        record: the failure as the rank that saw it recorded it, in the report's ``error`` form
            (:func:`fedproto.metering.error_record`: ``type``, ``message``, ``party``,
            ``culprits``, ``round_idx``, ``phase``, ``signal``).
        rank: the rank whose machine (or loop) failed.
    """

    def __init__(self, record: Mapping[str, Any], rank: int) -> None:
        self.record = dict(record)
        self.rank = rank
        # the failing rank's own words, so every rank prints the line one process would print
        Exception.__init__(self, self.record.get("message") or self.record.get("type") or "a rank failed")
        self.detail = str(self)
        self.party = self.record.get("party")
        self.round_idx = self.record.get("round_idx")
        self.state = None
        self.phase = self.record.get("phase")


def block_placement(roster: Sequence[str], size: int) -> dict[str, int]:
    """The default placement: the coordinator (``roster[0]``) on rank 0 and the clients
    (``roster[1:]``, M of them) in contiguous blocks, client ``j`` (0-based) on rank
    ``floor(((j + 1) R - 1) / M)`` for R ranks, so block sizes differ by at most one and rank 0's
    block, ``floor(M / R)`` clients beside the coordinator, is never the larger.

    Returns:
        ``{party: rank}`` for every party of ``roster``.

    Raises:
        ValueError: ``size`` is not positive, or ``roster`` is empty.
    """
    if size < 1:
        raise ValueError(f"a placement needs at least one rank, got {size}")
    if not roster:
        raise ValueError("a placement needs at least one party")
    return dict(zip(roster, _block_ranks(len(roster), size), strict=True))


def _block_ranks(parties: int, size: int) -> list[int]:
    """:func:`block_placement`'s rank for each roster position (position 0, the coordinator, on
    rank 0; client j, at position j + 1, on rank ``floor(((j + 1) R - 1) / M)``)."""
    if size < 1:
        raise ValueError(f"a placement needs at least one rank, got {size}")
    clients = parties - 1
    if clients <= 0:
        return [0] * parties
    j = np.arange(clients, dtype=np.int64)
    return [0, *(((j + 1) * size - 1) // clients).tolist()]


class Shards:
    """Where the parties of one sharded lean simulation run, and the exchange between ranks.

    Every rank of ``comm`` builds its ``Shards`` with the same roster and placement (checked: one
    ``Allgather`` of a digest), builds the machines of :attr:`local` and passes both to
    :func:`fedproto.simulation.simulate`.

    Args:
        roster: every party of the run, in roster order (the coordinator first).
        comm: an mpi4py intracommunicator (default ``MPI.COMM_WORLD``); it is duplicated
            (collective), so the simulation's messages never meet the caller's.
        placement: ``{party: rank}`` for every party of ``roster``; ``None`` for
            :func:`block_placement`.

    Attributes:
        roster: the parties, in roster order (tuple of str).
        rank, size: this rank and the number of ranks.
        local: this rank's parties, in roster order (tuple of str).

    Raises:
        ImportError: mpi4py (or its MPI library) is not installed.
        ValueError: the placement misses a party of the roster, names a party outside it or a
            rank outside ``[0, size)``; or the ranks were given different rosters or placements
            (every rank raises, naming the first rank that differs from rank 0).
    """

    def __init__(self, roster: Sequence[str], comm: Any = None, *, placement: Mapping[str, int] | None = None) -> None:
        try:
            from mpi4py import MPI
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "a sharded simulation needs mpi4py and an MPI library: pip install 'fedproto[mpi]', "
                "then start it with mpiexec -n <ranks>"
            ) from exc
        self._mpi = MPI
        base = comm if comm is not None else MPI.COMM_WORLD
        self.rank: int = base.Get_rank()
        self.size: int = base.Get_size()
        self.roster: tuple[str, ...] = tuple(roster)
        # party -> position in the roster; ranks[position] -> its rank (a list: 10^7 parties fit)
        self._index = dict(zip(self.roster, range(len(self.roster)), strict=True))
        if len(self._index) != len(self.roster):
            raise ValueError("the roster names a party twice")
        self._ranks = _block_ranks(len(self.roster), self.size) if placement is None else self._checked(placement)
        self.local: tuple[str, ...] = self.parties_of(self.rank)
        self._comm = base.Dup()
        self._comm.Set_errhandler(MPI.ERRORS_RETURN)
        self._check_same_everywhere()
        self._outbox: list[list[list[Any]]] = [[] for _ in range(self.size)]
        self._out_bytes = 0
        self.wait_s = 0.0  # seconds spent in exchanges (waiting for other ranks, moving frames)

    def __repr__(self) -> str:
        return f"Shards(rank {self.rank} of {self.size}, {len(self.local)} of {len(self.roster)} parties)"

    # -- placement ------------------------------------------------------------------------------------

    def rank_of(self, party: str) -> int:
        """The rank that hosts ``party``. Raises KeyError for a party outside the roster."""
        return self._ranks[self._index[party]]

    def __contains__(self, party: object) -> bool:
        return party in self._index

    def parties_of(self, rank: int) -> tuple[str, ...]:
        """The parties placed on ``rank``, in roster order."""
        roster = self.roster
        return tuple(roster[i] for i in np.flatnonzero(np.asarray(self._ranks, dtype=np.int64) == rank).tolist())

    def _checked(self, placement: Mapping[str, int]) -> list[int]:
        """``placement`` as a rank per roster position, checked (see the class's errors)."""
        missing = self._index.keys() - placement.keys()
        if missing:
            first = min(missing, key=self._index.__getitem__)
            raise ValueError(f"the placement gives no rank to {first!r} ({len(missing)} parties in all)")
        strangers = placement.keys() - self._index.keys()
        if strangers:
            raise ValueError(f"the placement names {sorted(strangers)[0]!r}, which is not in the roster")
        ranks = [placement[p] for p in self.roster]
        for rank in set(ranks):
            if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.size:
                party = self.roster[ranks.index(rank)]
                raise ValueError(f"the placement puts {party!r} on rank {rank!r}; the ranks are 0 to {self.size - 1}")
        return ranks

    def check_machines(self, machines: Mapping[str, Any]) -> None:
        """Raise ValueError unless ``machines`` holds exactly this rank's parties."""
        if set(machines) != set(self.local):
            extra = sorted(set(machines) - set(self.local))
            lacking = sorted(set(self.local) - set(machines))
            rank = self.rank_of(extra[0]) if extra and extra[0] in self._index else "?"
            what = f"{extra[0]!r} is placed on rank {rank}" if extra else (
                f"no machine for {lacking[0]!r}, placed on this rank"
            )
            raise ValueError(f"rank {self.rank} must drive exactly its {len(self.local)} parties: {what}")

    def _check_same_everywhere(self) -> None:
        digest = hashlib.sha256("\0".join(self.roster).encode())
        digest.update(np.asarray(self._ranks, dtype=np.int32).tobytes())
        mine = np.frombuffer(digest.digest(), dtype=np.uint8)
        every = np.empty((self.size, mine.size), dtype=np.uint8)
        self._comm.Allgather(mine, every)
        differs = [r for r in range(self.size) if not np.array_equal(every[r], every[0])]
        if differs:
            raise ValueError(
                f"rank {differs[0]} was given another roster or placement than rank 0 "
                f"({len(self.roster)} parties here): every rank must build Shards alike"
            )

    # -- the exchange ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Line the ranks up before the run's clock starts (a barrier)."""
        _wait(self._comm.Ibarrier())

    def post(self, sender: str, dests: tuple[str, ...], frame: bytes) -> tuple[str, ...]:
        """File ``frame`` from ``sender`` for every receiver of ``dests`` on another rank (one
        entry per destination rank) and return the receivers on this rank, in order."""
        index, ranks, me = self._index, self._ranks, self.rank
        if len(dests) == 1:
            rank = ranks[index[dests[0]]]
            if rank == me:
                return dests
            self._file(rank, sender, dests, frame)
            return ()
        by_rank: dict[int, list[str]] = {}
        for dest in dests:
            by_rank.setdefault(ranks[index[dest]], []).append(dest)
        local = by_rank.pop(me, ())
        for rank, group in by_rank.items():
            self._file(rank, sender, group, frame)
        return tuple(local)

    def has_outgoing(self) -> bool:
        """Whether frames wait in this rank's outboxes for the next exchange."""
        return self._out_bytes > 0 or any(self._outbox)

    def _file(self, rank: int, sender: str, dests: Sequence[str], frame: bytes) -> None:
        index = self._index
        self._outbox[rank].append([index[sender], [index[d] for d in dests], frame])
        self._out_bytes += len(frame)

    def exchange(
        self, remaining: int, earliest: float, progress: bool, failure: dict[str, Any] | None = None, queued: int = 0
    ) -> "_Step":
        """Meet every other rank: share the status, send the outboxes, receive this rank's frames.

        Args:
            remaining: this rank's machines not done.
            earliest: the earliest deadline of this rank's live machines (``inf`` when none).
            progress: whether a machine of this rank moved or sent since the last deadline step.
            failure: this rank's failure record (:func:`fedproto.metering.error_record`), if any.
            queued: frames still in this rank's local queue (an exchange called early, to ship
                the outboxes before the rest of the local work; counted as in flight, so no
                rank moves the clock on while another still has frames to deliver).

        Returns:
            The step's global view and the frames received, ``[(sender, dests, frame), ...]`` in
            source-rank order.

        Raises:
            ShardFailed: another rank failed (this rank's own failure is the caller's to raise).
        """
        began = time.perf_counter()
        mine = np.zeros(_SIZE, dtype=np.float64)
        mine[_REMAINING] = remaining
        mine[_OUT_BYTES] = self._out_bytes
        mine[_FAILED] = failure is not None
        mine[_EARLIEST] = earliest
        mine[_PROGRESS] = progress
        mine[_QUEUED] = queued
        every = np.empty((self.size, _SIZE), dtype=np.float64)
        _wait(self._comm.Iallgather(mine, every))
        failed = np.flatnonzero(every[:, _FAILED])
        if failed.size:
            self._drop_outbox()
            root = int(failed[0])
            record = self._broadcast_failure(root, failure if self.rank == root else None)
            self.wait_s += time.perf_counter() - began
            return _Step(0, 0, math.inf, False, [], (root, record))
        received: list[tuple[str, tuple[str, ...], bytes]] = []
        if every[:, _OUT_BYTES].any():
            received = self._move_frames()
        self.wait_s += time.perf_counter() - began
        return _Step(
            remaining=int(every[:, _REMAINING].sum()),
            in_flight=len(received) + int(np.count_nonzero(every[:, _OUT_BYTES])) + int(every[:, _QUEUED].sum()),
            earliest=float(every[:, _EARLIEST].min()),
            progress=bool(every[:, _PROGRESS].any()),
            frames=received,
            failure=None,
        )

    def _move_frames(self) -> list[tuple[str, tuple[str, ...], bytes]]:
        MPI = self._mpi
        blobs = [msgpack.packb(entries, use_bin_type=True) if entries else b"" for entries in self._outbox]
        self._drop_outbox()
        send_counts = np.array([len(b) for b in blobs], dtype=np.int64)
        recv_counts = np.empty(self.size, dtype=np.int64)
        _wait(self._comm.Ialltoall(send_counts, recv_counts))
        send = np.frombuffer(b"".join(blobs), dtype=np.uint8)
        recv = np.empty(int(recv_counts.sum()), dtype=np.uint8)
        send_displs = np.concatenate([[0], np.cumsum(send_counts)[:-1]]).astype(np.int64)
        recv_displs = np.concatenate([[0], np.cumsum(recv_counts)[:-1]]).astype(np.int64)
        _wait(self._comm.Ialltoallv(
            [send, send_counts, send_displs, MPI.BYTE], [recv, recv_counts, recv_displs, MPI.BYTE]
        ))
        roster = self.roster
        frames: list[tuple[str, tuple[str, ...], bytes]] = []
        view = memoryview(recv)
        for offset, count in zip(recv_displs.tolist(), recv_counts.tolist(), strict=True):
            if not count:
                continue
            for sender, dests, frame in msgpack.unpackb(view[offset : offset + count], use_list=False):
                frames.append((roster[sender], tuple(roster[d] for d in dests), frame))
        return frames

    def _drop_outbox(self) -> None:
        self._outbox = [[] for _ in range(self.size)]
        self._out_bytes = 0

    def _broadcast_failure(self, root: int, record: dict[str, Any] | None) -> dict[str, Any]:
        payload = msgpack.packb(record, use_bin_type=True) if record is not None else b""
        length = np.array([len(payload)], dtype=np.int64)
        _wait(self._comm.Ibcast(length, root=root))
        buffer = np.frombuffer(payload, dtype=np.uint8).copy() if self.rank == root else np.empty(int(length[0]), np.uint8)
        _wait(self._comm.Ibcast(buffer, root=root))
        return msgpack.unpackb(buffer.tobytes(), raw=False)

    def waiting(self, parties: Sequence[str], keep: int) -> tuple[int, list[str]]:
        """Every rank's ``parties`` (this rank's, in roster order), gathered at every rank
        (collective): their number over all ranks and the first ``keep`` of them in roster order."""
        MPI = self._mpi
        payload = msgpack.packb([len(parties), [self._index[p] for p in parties[:keep]]], use_bin_type=True)
        sizes = np.empty(self.size, dtype=np.int64)
        _wait(self._comm.Iallgather(np.array([len(payload)], dtype=np.int64), sizes))
        displs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        recv = np.empty(int(sizes.sum()), dtype=np.uint8)
        _wait(self._comm.Iallgatherv(np.frombuffer(payload, dtype=np.uint8), [recv, sizes, displs, MPI.BYTE]))
        count, indices = 0, []
        for offset, size in zip(displs.tolist(), sizes.tolist(), strict=True):
            n, first = msgpack.unpackb(recv[offset : offset + size].tobytes())
            count += n
            indices.extend(first)
        return count, [self.roster[i] for i in sorted(indices)[:keep]]

    # -- the end --------------------------------------------------------------------------------------

    def gather_meter(self, meter: Meter) -> None:
        """Add every rank's counts to rank 0's ``meter`` (collective) and set its :attr:`Meter.ranks`:
        per-link frames and bytes (sent and received; a grouping meter's groups), refusals, the start of each round (the
        earliest over ranks, on rank 0's clock: the ranks started together, see :meth:`start`),
        and per rank its parties, peak resident memory (MiB) and seconds spent in exchanges."""
        started = meter.started_s if meter.started_s is not None else 0.0
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if sys.platform == "darwin":  # pragma: no cover - bytes there
            peak_kib //= 1024
        mine = {
            "sent": [[*key, *c] for key, c in meter.sent.items()],
            "received": [[*key, *c] for key, c in meter.received.items()],
            "grouped": [[*key, *names] for key, names in meter.grouped.items()],
            "rejected": meter.rejected,
            "rejected_frames": meter.rejected_frames,
            "rejected_by_cause": [[s, c, n] for (s, c), n in meter.rejected_by_cause.items()],
            "round_offsets": [[r, t - started] for r, t in meter.round_started_s.items()],
            "rank": {"rank": self.rank, "parties": len(self.local), "peak_rss_mib": round(peak_kib / 1024, 1),
                     "exchange_s": round(self.wait_s, 6)},
        }
        gathered = self.gather(msgpack.packb(mine, use_bin_type=True))
        if gathered is None:
            return
        parts = [msgpack.unpackb(blob, raw=False) for blob in gathered]
        for part in parts[1:]:
            for table, entries in ((meter.sent, part["sent"]), (meter.received, part["received"])):
                for r, phase, sender, receiver, tag, count, nbytes in entries:
                    key = (r, phase, sender, receiver, tag)
                    counter = table.get(key)
                    table[key] = (count, nbytes) if counter is None else (counter[0] + count, counter[1] + nbytes)
            for r, phase, tag, nbytes, senders, receivers in part["grouped"]:
                group = meter.grouped.setdefault((r, phase, tag, nbytes), ([], []))
                group[0].extend(senders)
                group[1].extend(receivers)
            meter.rejected_frames += part["rejected_frames"]
            for sender, cause, n in part["rejected_by_cause"]:
                meter.rejected_by_cause[(sender, cause)] += n
            meter.rejected.extend(part["rejected"][: max(0, MAX_REJECTED_KEPT - len(meter.rejected))])
            for r, offset in part["round_offsets"]:
                when = started + offset
                meter.round_started_s[r] = min(meter.round_started_s.get(r, when), when)
        meter.ranks = [part["rank"] for part in parts]

    def gather(self, payload: bytes) -> list[bytes] | None:
        """Every rank's ``payload`` at rank 0 (collective): see :func:`gather_bytes`. The command
        line gathers the ranks' results with it."""
        return gather_bytes(self._comm, payload)

    def abort(self, code: int = 1) -> None:
        """End every rank of the job at once (``MPI_Abort``): for a rank that fails where the
        others cannot hear of it, before the run's first exchange."""
        self._comm.Abort(code)

    def failure_record(self, exc: BaseException, machines: Mapping[str, Any]) -> dict[str, Any]:
        """The record of this rank's failure ``exc`` (the party whose machine raised it, else the
        party a :class:`~fedproto.errors.FedProtoError` names)."""
        reporter = next((p for p, m in machines.items() if getattr(m, "error", None) is exc), None)
        if reporter is None and isinstance(exc, FedProtoError):
            reporter = exc.party
        return error_record(exc, reporter=reporter)


def gather_bytes(comm: Any, payload: bytes) -> list[bytes] | None:
    """Every rank's ``payload`` at rank 0 of ``comm``, in rank order (collective; ``None`` at the
    other ranks): raw buffers, nothing pickled, waited on without spinning a core (:func:`_wait`)."""
    from mpi4py import MPI

    size = comm.Get_size()
    sizes = np.empty(size, dtype=np.int64)
    _wait(comm.Iallgather(np.array([len(payload)], dtype=np.int64), sizes))
    displs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    send = np.frombuffer(payload, dtype=np.uint8)
    if comm.Get_rank() == 0:
        recv = np.empty(int(sizes.sum()), dtype=np.uint8)
        _wait(comm.Igatherv(send, [recv, sizes, displs, MPI.BYTE], root=0))
        return [recv[o : o + n].tobytes() for o, n in zip(displs.tolist(), sizes.tolist(), strict=True)]
    _wait(comm.Igatherv(send, None, root=0))
    return None


def _wait(request: Any) -> None:
    """Wait for a non-blocking collective: test it, sleeping a little between tests once it has
    not completed at once (MPICH progresses it inside ``Test``; its blocking collectives
    busy-poll, which with more ranks than cores takes the CPU from the ranks still working)."""
    tests = 0
    while not request.Test():
        tests += 1
        if tests > 64:
            time.sleep(0.00005 if tests < 2000 else 0.0005)


@dataclasses.dataclass(frozen=True, slots=True)
class _Step:
    """What one exchange told every rank: machines not done and frames in flight over all ranks,
    the earliest deadline, whether any rank moved at its last deadline step, this rank's frames
    received (``(sender, receivers, frame)`` in source-rank order), and a failure
    (``(rank, record)``) or ``None``."""

    remaining: int
    in_flight: int
    earliest: float
    progress: bool
    frames: list[tuple[str, tuple[str, ...], bytes]]
    failure: tuple[int, dict[str, Any]] | None

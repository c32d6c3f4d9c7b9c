"""The lean simulation engine: many parties in one process, one loop, no task per party.

:func:`fedproto.runtime.run_parties` gives every party its own Trio task and transport endpoint,
which is what a deployment runs and what the memory transport exercises. Its cost per party (a
task, channels, cancel scopes, a deadline per wait) is what limits a simulation to about 10^4
clients. :func:`simulate` drives the same sans-IO machines from one synchronous loop, so a process
can host 10^5 to 10^6 clients:

* **Every message is still encoded and metered.** Each action a machine returns is encoded with
  :func:`~fedproto.codec.encode_frame` (a broadcast once, as the runtime does), each delivery is
  counted with :meth:`~fedproto.metering.Meter.record_sent` under the same ``(round, phase, sender,
  receiver, tag)`` and the same frame bytes, and each frame is decoded with
  :func:`~fedproto.codec.decode_frame` under the run's frame limit before a machine sees it. So
  a run's report (links, bytes per round and phase, messages) equals the memory transport's.
* **A broadcast frame is decoded once** and the decoded message is handed to every receiver.
  Decoded arrays are read-only views of the frame (the codec builds them with
  ``numpy.frombuffer``) and messages are frozen, so no receiver can change another's copy.
* **Delivery order** is first in, first out over the whole process: deterministic, one valid
  order among those the runtime may produce.
* **Deadlines run on a virtual clock.** Handling takes no virtual time; the clock moves only when
  nothing is left to deliver and some machine is not done. It then jumps to the earliest phase
  deadline (``config.deadline_s`` times the machine's ``DEADLINE_FACTOR`` after that machine's
  last progress, exactly the runtime's rule), and the machines whose deadline it is get
  :class:`~fedproto.messages.PhaseTimedOut`. A coordinator therefore times out before the
  clients that wait on it, as in the runtime, and a silent party is reported without waiting
  in real time.
* **Broadcasts can be batched:** the receivers of a broadcast that are machines of one class get
  it through that class's :meth:`~fedproto.machine.ProtocolMachine.receive_batch` (by default one
  ``receive`` each), where a role may compute what its receivers share, or what vectorises
  across them, once (FastLloyd's clients: the next centroids and every client's statistics in one
  NumPy pass). ``batch=False`` turns it off, as does a link model with measured compute (each
  receiver's own handler is timed).
* **A link model** (``network=``, :mod:`fedproto.netmodel`) predicts the run's wall time between
  real sites: frames are then delivered in the order they would arrive over the modelled links
  (deterministic for a given compute trace), deadlines fire on the model's clock, and the
  prediction is left on the meter (:attr:`~fedproto.metering.Meter.prediction`). That loop is a
  separate function, so a run without a model runs the loop above unchanged.
* **Failures end the run at once:** the first machine that fails raises its error here (the
  runtime's abort notices are not sent: every party is in this process). A machine that sends to
  a party without a machine gets :class:`~fedproto.messages.SendFailed`, as a transport's
  unknown-peer error would give it.

Parties cannot be crashed here (fault injection needs transport endpoints: use the memory
transport with :class:`~fedproto.testing.faults.Faults`); a machine that stops answering is the
way to test silence.

Example::

    results = simulate({"server": server, **clients}, config=RuntimeConfig(session=7))
"""

from __future__ import annotations

import collections
import gc
import heapq
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from fedproto.codec import decode_frame
from fedproto.compilation import compile_seconds
from fedproto.errors import (
    DecodeError,
    FedProtoError,
    LocalProtocolError,
    TransportError,
)
from fedproto.machine import ProtocolMachine, check_sessions
from fedproto.messages import Broadcast, Outgoing, PhaseTimedOut, SendFailed
from fedproto.metering import Meter
from fedproto.netmodel import ComputeTrace, LinkModel, LinkSimulator, parse_compute
from fedproto.runtime import Observer, RuntimeConfig, _encode
from fedproto.shards import ShardFailed, Shards

__all__ = ["simulate", "SimulationStalled"]

log = logging.getLogger("fedproto.simulation")

#: Consecutive deadlines that pass with no frame sent and no machine moving before the run is
#: declared stalled.
_IDLE_DEADLINES = 3

#: With shards: a rank with frames still queued meets the other ranks at an exchange before its
#: next delivery once it has made this many deliveries since the last exchange (a broadcast
#: counts one per local receiver), rather than only when its queue is empty: what it sent reaches
#: the other ranks while it works on, and what they sent reaches it, so the ranks work side by
#: side instead of in turns (a count, never a time: the order of deliveries does not depend on
#: timing).
_FLUSH_DELIVERIES = 1024


#: The most receivers of a broadcast handed to one ``receive_batch`` call: a batch's messages
#: (one update and its arrays per receiver, about 0.4 KiB each for FastLloyd) exist together until
#: they are encoded, so a broadcast to 10^5 clients goes in slices of this many (same results: a
#: batch gives what each receive gives).
_BATCH_RECEIVERS = 4096


class SimulationStalled(FedProtoError):
    """Nothing is left to deliver, some machine is not done, and its deadlines pass without it
    sending anything, failing or moving: nothing can ever reach it (the runtime would wait for
    ever)."""


class _Frame:
    """One encoded action in flight: its frame, envelope fields and receivers.

    A broadcast is one entry whose receivers are delivered in order; its decoded message is kept
    after the first delivery and shared by the others.
    """

    __slots__ = ("sender", "dests", "frame", "decoded")

    def __init__(self, sender: str, dests: tuple[str, ...], frame: bytes) -> None:
        self.sender = sender
        self.dests = dests
        self.frame = frame
        self.decoded: Any = None


def simulate(
    machines: Mapping[str, ProtocolMachine],
    *,
    config: RuntimeConfig | None = None,
    meter: Meter | None = None,
    observer: Observer | None = None,
    batch: bool = True,
    pause_gc: bool = True,
    network: LinkModel | None = None,
    compute: str | float | ComputeTrace | None = "measured",
    shards: Shards | None = None,
) -> dict[str, Any]:
    """Run ``machines`` to completion in this thread and return their results.

    Args:
        machines: ``{party: machine}``, fresh (not started); each machine's ``party`` is its key.
            They are started in mapping order.
        config: the session stamped on every frame, the phase deadline (virtual seconds, see the
            module docstring), the frame limit, and whether received frames are counted too.
        meter: where frames are counted (a new one, timed with ``time.perf_counter``, if
            ``None``); its ``round_wall_s`` are wall seconds of this process.
        observer: called as ``observer(party, round_idx, state)`` after every step that changed a
            machine's round or state (for progress bars), as in the runtime.
        batch: hand a broadcast to consecutive receivers of one class through their class's
            :meth:`~fedproto.machine.ProtocolMachine.receive_batch` (one call for all of them);
            ``False`` calls each machine's ``receive`` (the results must be the same: a test of a
            role's batching). With ``network`` and measured compute broadcasts are never
            batched: each receiver's own ``receive`` is timed, as its own process would run it.
        pause_gc: pause Python's cyclic garbage collector during the run and restore it after,
            however the run ends. Machines, messages and frames are freed by reference counting;
            what the collector would do is scan the run's long-lived objects (10^5 to 10^6
            machines and their meter entries) again and again: measured with 50,000 FastLloyd
            clients, full collections took 16 to 37% of a round, found nothing to free, and
            pausing left the peak memory unchanged.
        network: a link model (:mod:`fedproto.netmodel`) whose prediction of the run's wall time
            is left in ``meter.prediction`` when the run completes (the report's ``prediction``);
            ``None`` (the default) models nothing and delivers first in, first out. Results,
            frames and bytes are the same either way.
        compute: with ``network``, each handler's compute time: ``"measured"`` (its
            ``time.perf_counter`` span here, each receiver of a broadcast handling it alone)
            or ``"fixed:SECONDS"`` / a number of seconds (repeatable predictions), or
            ``"trace:PATH"`` / a :class:`~fedproto.netmodel.ComputeTrace` (what each handler cost
            where an earlier run's parties ran; each receiver handling alone, as measured); see
            :func:`fedproto.netmodel.parse_compute`.
        shards: spread the run over MPI ranks (:class:`fedproto.shards.Shards`, every rank
            calling ``simulate`` with it): ``machines`` are then this rank's parties
            (``shards.local``), frames for other ranks travel in one exchange per step, deadlines
            are agreed between ranks, and at the end every rank's counts are added to rank 0's
            ``meter`` (with :attr:`~fedproto.metering.Meter.ranks`). Results, frames and bytes
            are those of the run in one process. ``None`` (the default): one process.

    Returns:
        ``{party: result}`` for every machine (with ``shards``: this rank's).

    Raises:
        SessionMismatch: a machine declares another session than ``config.session`` (names the
            parties; raised before any machine starts, see :func:`~fedproto.machine.check_sessions`;
            with ``shards``, the rank holding it raises it and the others ``ShardFailed`` with it
            at their first exchange).
        ValueError: a machine's ``party`` differs from its key, ``compute`` is malformed (or its
            trace unreadable), ``machines``
            are not exactly ``shards.local``, or ``shards`` and ``network`` are both given (the link
            model runs in one process).
        LocalProtocolError: a machine made a message that cannot be encoded (names the field).
        FedProtoError: the first failure of any machine (a peer broke the protocol, a deadline
            passed with parties silent, ...), raised as itself.
        SimulationStalled: machines wait with nothing in flight and no deadline can help.
        ShardFailed: with ``shards``, a failure on another rank (its record and rank attached);
            the rank that saw a failure raises it as itself.
    """
    compute_s = parse_compute(compute)
    if shards is not None and network is not None:
        raise ValueError("the link model runs in one process: a sharded simulation takes no network")
    config = config or RuntimeConfig()
    if shards is None:
        check_sessions(machines, config.session)  # before any machine starts
    paused = pause_gc and gc.isenabled()
    if paused:
        gc.disable()
    try:
        if network is not None:
            # measured or traced compute times each receiver's own handler: a batch's shared pass
            # is a simulation's shortcut that no party process of a deployment takes
            batch = batch and isinstance(compute_s, float)
            return _simulate_linked(machines, config, meter, observer, batch, network, compute_s)
        return _simulate(machines, config, meter, observer, batch, shards)
    finally:
        if paused:
            gc.enable()


def _simulate(
    machines: Mapping[str, ProtocolMachine],
    config: RuntimeConfig,
    meter: Meter | None,
    observer: Observer | None,
    batch: bool,
    shards: Shards | None = None,
) -> dict[str, Any]:
    meter = meter if meter is not None else Meter(time.perf_counter)
    _check_names(machines)
    if shards is not None:
        shards.check_machines(machines)
    queue: collections.deque[_Frame] = collections.deque()
    now = 0.0  # the virtual clock (seconds)
    progress: dict[str, tuple[int, Any]] = {}
    # Each machine's current deadline (virtual seconds). Progress overwrites it; the earliest is
    # looked for only when nothing is in flight (a scan, rare: it means some party is silent).
    deadline_of: dict[str, float] = {}
    session, max_frame = config.session, config.max_frame_bytes
    record_received = config.record_received
    # who may be sent to: this process's machines, or with shards every party of the roster
    known: Any = machines if shards is None else shards

    # Deadlines and progress take few distinct values (the clock moves only on a timeout): one
    # object per value, not one per party (a float and a tuple per party at 10^5 clients).
    values: dict[Any, Any] = {}

    def arm(party: str, machine: ProtocolMachine) -> None:
        when = now + config.deadline_s * machine.DEADLINE_FACTOR
        deadline_of[party] = values.setdefault(when, when)

    def enqueue(machine: ProtocolMachine, outgoing: list[Outgoing]) -> None:
        for _, frame, dests in _encode_and_meter(machine, outgoing, known, session, meter):
            if shards is not None:
                dests = shards.post(machine.party, dests, frame)  # the others go to their ranks
                if not dests:
                    continue
            queue.append(_Frame(machine.party, dests, frame))

    def stepped(party: str, machine: ProtocolMachine) -> None:
        _after_step(party, machine, progress, arm, observer, values)

    if shards is not None:
        shards.start()
    meter.start()
    try:
        if shards is not None:
            # Inside the run, so that the failure reaches every other rank at its first exchange
            # (they would otherwise wait for this one for ever).
            check_sessions(machines, session)
        for party, machine in machines.items():
            start = (machine.round_idx, machine.state)
            progress[party] = values.setdefault(start, start)
            arm(party, machine)
            enqueue(machine, machine.start())
            stepped(party, machine)
        remaining = sum(1 for m in machines.values() if not m.done)
        idle_deadlines = 0
        timed_out = moved = False  # whether the last step was a deadline's, and whether it moved anything
        delivered = 0  # with shards: deliveries since the last exchange
        stale, earliest_here = True, math.inf  # with shards: this rank's earliest deadline, when last found
        while True:
            early = (
                shards is not None and shards.size > 1 and bool(queue) and remaining > 0 and delivered > 0
                and delivered + len(queue[0].dests) > _FLUSH_DELIVERIES
            )
            if not queue or not remaining or early:
                if not remaining:
                    queue.clear()  # frames left for machines that are all done are read by nobody
                if shards is None:
                    if not remaining:
                        break
                    earliest = _earliest(deadline_of, machines)
                else:
                    # The clock can move at this step only if no rank has frames queued or waiting
                    # to go; the earliest deadline (a scan of this rank's machines) is then needed,
                    # and only if something was handled since it was last found.
                    stale = stale or delivered > 0
                    if queue or shards.has_outgoing():
                        mine = math.inf
                    else:
                        if stale:
                            earliest_here, stale = _earliest(deadline_of, machines), False
                        mine = earliest_here
                    step = shards.exchange(remaining, mine, moved, queued=len(queue))
                    delivered = 0
                    if step.failure is not None:
                        raise ShardFailed(step.failure[1], step.failure[0])
                    queue.extend(_Frame(sender, dests, frame) for sender, dests, frame in step.frames)
                    if timed_out:  # the deadline step's verdict, over every rank
                        idle_deadlines = 0 if (step.progress or step.in_flight) else idle_deadlines + 1
                        if idle_deadlines > _IDLE_DEADLINES:
                            raise _stalled(machines, f" after {_IDLE_DEADLINES} deadlines", shards)
                    timed_out = moved = False
                    if not step.remaining and not step.in_flight:
                        break
                    if step.in_flight:
                        continue
                    earliest = step.earliest
                if math.isinf(earliest):
                    raise _stalled(machines, "", shards)
                now = earliest
                due = _due(deadline_of, machines, now)
                moved = False
                for party in due:
                    machine = machines[party]
                    outgoing = machine.handle(PhaseTimedOut(machine.round_idx, machine.phase, config.deadline_s))
                    enqueue(machine, outgoing)
                    moved = (machine.round_idx, machine.state) != progress[party] or moved
                    stepped(party, machine)  # the observer hears of a step; a live machine is re-armed
                    if not machine.done:
                        arm(party, machine)
                remaining = sum(1 for m in machines.values() if not m.done)
                if shards is not None:
                    timed_out, moved = True, moved or bool(queue) or shards.has_outgoing()
                    stale = True
                    continue
                # Nothing can ever arrive for a machine that shrugs off its timeouts: after a few
                # deadlines without a frame or a step, say so instead of spinning for ever.
                idle_deadlines = 0 if (moved or queue) else idle_deadlines + 1
                if idle_deadlines > _IDLE_DEADLINES:
                    raise _stalled(machines, f" after {_IDLE_DEADLINES} deadlines")
                continue
            item = queue.popleft()
            decoded = item.decoded
            if decoded is None:
                try:
                    decoded = item.decoded = decode_frame(item.frame, max_frame_bytes=max_frame)
                except DecodeError as exc:
                    for dest in item.dests:
                        meter.record_rejected(item.sender, str(exc), "undecodable frame")
                    log.warning("a frame from %s was refused: %s", item.sender, exc)
                    continue
            envelope, message = decoded
            sender = item.sender
            delivered += len(item.dests)
            # A finished party's endpoint is read by nobody: frames to it are dropped.
            receivers = [dest for dest in item.dests if not machines[dest].done]
            if record_received:
                for dest in receivers:
                    meter.record_received(envelope.round_idx, envelope.phase, sender, dest, envelope.tag, len(item.frame))
            for lo, hi in _batches(receivers, machines) if batch else ((i, i + 1) for i in range(len(receivers))):
                if hi - lo == 1:
                    outgoing_lists = [machines[receivers[lo]].receive(sender, message, round_idx=envelope.round_idx)]
                else:
                    group = [machines[dest] for dest in receivers[lo:hi]]
                    outgoing_lists = type(group[0]).receive_batch(group, sender, message, round_idx=envelope.round_idx)
                    if len(outgoing_lists) != hi - lo:
                        raise ValueError(f"receive_batch gave {len(outgoing_lists)} lists for {hi - lo} machines")
                    del group
                for i in range(hi - lo):
                    dest = receivers[lo + i]
                    machine = machines[dest]
                    # each receiver's messages are dropped once encoded (a batch holds 10^5 of them)
                    outgoing, outgoing_lists[i] = outgoing_lists[i], None
                    enqueue(machine, outgoing)
                    del outgoing
                    stepped(dest, machine)
                    if machine.done:
                        remaining -= 1
    except Exception as exc:
        if shards is None or isinstance(exc, ShardFailed):
            if shards is not None:
                meter.finish()
                shards.gather_meter(meter)
            raise
        # Tell every other rank at the next exchange, so that none waits for ever, then gather.
        step = shards.exchange(0, math.inf, False, failure=shards.failure_record(exc, machines))
        meter.finish()
        shards.gather_meter(meter)
        if step.failure is not None and step.failure[0] != shards.rank:
            raise ShardFailed(step.failure[1], step.failure[0]) from exc  # a lower rank failed too
        raise
    meter.finish()
    if shards is not None:
        shards.gather_meter(meter)
    return {party: machine.result() for party, machine in machines.items()}


class _TimedFrame(_Frame):
    """A frame in flight through the link model; its decoding time is kept for every receiver."""

    __slots__ = ("decode_s",)

    def __init__(self, sender: str, dests: tuple[str, ...], frame: bytes) -> None:
        super().__init__(sender, dests, frame)
        self.decode_s = 0.0


def _simulate_linked(
    machines: Mapping[str, ProtocolMachine],
    config: RuntimeConfig,
    meter: Meter | None,
    observer: Observer | None,
    batch: bool,
    network: LinkModel,
    compute_s: float | ComputeTrace | None,
) -> dict[str, Any]:
    """:func:`_simulate` with frames moved through the link model (:mod:`fedproto.netmodel`).

    The same machines, frames and meter calls; what differs is the order of delivery (arrival
    time on the model's clock instead of first in, first out) and the clock deadlines run on.
    Each handler is timed: a frame's decoding (once per frame, charged to each of its receivers,
    as each would decode its own copy), the machine's ``receive`` (a batch's time split evenly
    among its receivers) and the encoding of what it sends.
    """
    meter = meter if meter is not None else Meter(time.perf_counter)
    _check_names(machines)
    sim = LinkSimulator(network, list(machines), compute_s)
    clock = time.perf_counter
    # each handler's compile seconds, for a model that charges every party its own compilation
    compiled = compile_seconds if network.compile == "per_party" and compute_s is None else (lambda: 0.0)
    order = {party: i for i, party in enumerate(machines)}
    progress: dict[str, tuple[int, Any]] = {}
    deadline_of: dict[str, float] = {}
    deadlines: list[tuple[float, int, str]] = []  # a heap; entries no longer in deadline_of are stale
    session, max_frame = config.session, config.max_frame_bytes
    record_received = config.record_received

    def arm(party: str, machine: ProtocolMachine) -> None:
        when = sim.clock[party] + config.deadline_s * machine.DEADLINE_FACTOR
        deadline_of[party] = when
        heapq.heappush(deadlines, (when, order[party], party))

    def encoded(machine: ProtocolMachine, outgoing: list[Outgoing]) -> list[tuple[Outgoing, _TimedFrame]]:
        return [
            (action, _TimedFrame(machine.party, known, frame))
            for action, frame, known in _encode_and_meter(machine, outgoing, machines, session, meter)
        ]

    def dispatch(handler: int, sends: list[tuple[Outgoing, _TimedFrame]]) -> None:
        for action, item in sends:
            for dest in item.dests:
                sim.send(handler, dest, len(item.frame), action.round_idx, action.phase, item)

    def stepped(party: str, machine: ProtocolMachine) -> None:
        _after_step(party, machine, progress, arm, observer)

    meter.start()
    for party, machine in machines.items():
        progress[party] = (machine.round_idx, machine.state)
        arm(party, machine)
        began, kernel_began = clock(), compiled()
        sends = encoded(machine, machine.start())
        kernel_s = compiled() - kernel_began
        handler = sim.handled(party, machine.round_idx, 0.0, clock() - began, frames_out=_deliveries(sends),
                              kernels=((type(machine).__name__, machine.round_idx, "start"), kernel_s, kernel_s),
                              cause="start")
        dispatch(handler, sends)
        stepped(party, machine)
    remaining = sum(1 for m in machines.values() if not m.done)
    idle_deadlines = 0
    while remaining:
        arrival = sim.next_time()
        while deadlines and (
            deadline_of.get(deadlines[0][2]) != deadlines[0][0] or machines[deadlines[0][2]].done
        ):
            heapq.heappop(deadlines)
        due_at = deadlines[0][0] if deadlines else math.inf
        if due_at < arrival:
            due = []
            while deadlines and deadlines[0][0] == due_at:
                _, _, party = heapq.heappop(deadlines)
                if deadline_of.get(party) == due_at and not machines[party].done:
                    del deadline_of[party]
                    due.append(party)
            moved = sent = False
            for party in due:
                machine = machines[party]
                round_idx = machine.round_idx
                began, kernel_began = clock(), compiled()
                outgoing = machine.handle(PhaseTimedOut(machine.round_idx, machine.phase, config.deadline_s))
                sends = encoded(machine, outgoing)
                kernel_s = compiled() - kernel_began
                kernels = ((type(machine).__name__, round_idx, "timeout"), kernel_s, kernel_s)
                dispatch(sim.handled(party, round_idx, due_at, clock() - began, frames_out=_deliveries(sends),
                                     kernels=kernels, cause="timeout"), sends)
                sent = sent or bool(sends)
                moved = (machine.round_idx, machine.state) != progress[party] or moved
                stepped(party, machine)
                if not machine.done and party not in deadline_of:
                    arm(party, machine)
            idle_deadlines = 0 if (moved or sent) else idle_deadlines + 1
            if idle_deadlines > _IDLE_DEADLINES:
                raise _stalled(machines, f" after {_IDLE_DEADLINES} deadlines")
            remaining = sum(1 for m in machines.values() if not m.done)
            continue
        if math.isinf(arrival):
            raise _stalled(machines, "")
        idle_deadlines = 0
        when, item, group = sim.next_arrivals()
        decoded = item.decoded
        if decoded is None:
            began = clock()
            try:
                decoded = item.decoded = decode_frame(item.frame, max_frame_bytes=max_frame)
            except DecodeError as exc:
                for _ in group:
                    meter.record_rejected(item.sender, str(exc), "undecodable frame")
                log.warning("a frame from %s was refused: %s", item.sender, exc)
                continue
            item.decode_s = clock() - began
        envelope, message = decoded
        sender = item.sender
        # A finished party's endpoint is read by nobody: frames to it are dropped.
        receivers = [(dest, machines[dest], delivery) for dest, delivery in group if not machines[dest].done]
        if record_received:
            for dest, _, _ in receivers:
                meter.record_received(envelope.round_idx, envelope.phase, sender, dest, envelope.tag, len(item.frame))
        runs = _same_class_runs(receivers) if batch else [[r] for r in receivers]  # type: ignore[arg-type]
        for run in runs:
            began, kernel_began = clock(), compiled()
            if len(run) == 1:
                outgoing_lists = [run[0][1].receive(sender, message, round_idx=envelope.round_idx)]
            else:
                outgoing_lists = type(run[0][1]).receive_batch(
                    [m for _, m, _ in run], sender, message, round_idx=envelope.round_idx
                )
            share = (clock() - began) / len(run)
            receive_kernel_s = compiled() - kernel_began
            for (dest, machine, delivery), outgoing in zip(run, outgoing_lists, strict=True):
                began, kernel_began = clock(), compiled()
                sends = encoded(machine, outgoing)
                spent = item.decode_s + share + clock() - began
                # the receive's and the encoding's compilation, all of it in ``spent``: compiled()
                # counts only with measured compute, where no broadcast is batched
                kernel_s = receive_kernel_s + compiled() - kernel_began
                kernels = ((type(machine).__name__, envelope.round_idx, envelope.tag), kernel_s, kernel_s)
                handler = sim.handled(dest, envelope.round_idx, when, spent, trigger=delivery,
                                      frames_out=_deliveries(sends), kernels=kernels, cause=envelope.tag)
                dispatch(handler, sends)
                stepped(dest, machine)
                if machine.done:
                    remaining -= 1
    meter.finish()
    meter.prediction = sim.prediction()
    return {party: machine.result() for party, machine in machines.items()}


def _check_names(machines: Mapping[str, ProtocolMachine]) -> None:
    for party, machine in machines.items():
        if machine.party != party:
            raise ValueError(f"machine for {party!r} says it is {machine.party!r}")


def _encode_and_meter(
    machine: ProtocolMachine,
    outgoing: list[Outgoing],
    machines: Mapping[str, ProtocolMachine],
    session: int,
    meter: Meter,
) -> Iterator[tuple[Outgoing, bytes, tuple[str, ...]]]:
    """Encode each of ``machine``'s actions once and meter it on every link it goes on, as the
    runtime does; yield ``(action, frame, receivers)`` for each action with a receiver in the
    simulation, in order. A receiver that is not is the machine's ``SendFailed`` (whose own
    actions follow in turn). Raises the machine's LocalProtocolError for a message it cannot send.

    ``outgoing`` (the list the machine returned, the engine's to keep) is consumed: each entry is
    cleared as it is encoded, so that a party's 10^5 messages (the server's seed relays) do not
    all live on beside their frames."""
    i = 0
    while i < len(outgoing):
        action, outgoing[i] = outgoing[i], None  # type: ignore[call-overload]
        i += 1
        frame = _encode(machine, action, session)
        dests = action.dests if isinstance(action, Broadcast) else (action.dest,)
        known = []
        tag = type(action.message).TAG
        size = len(frame)
        for dest in dests:
            if dest not in machines:
                error = TransportError(f"no party named {dest!r} in this simulation", party=dest)
                outgoing.extend(machine.handle(SendFailed(dest, error)))
                continue
            meter.record_sent(action.round_idx, action.phase, machine.party, dest, tag, size)
            known.append(dest)
        if known:
            yield action, frame, tuple(known)


def _deliveries(sends: list[tuple[Outgoing, _TimedFrame]]) -> int:
    """How many deliveries ``sends`` makes (a broadcast one per receiver: each goes over its own
    connection, at the link model's per-frame cost)."""
    return sum(len(item.dests) for _, item in sends)


def _after_step(
    party: str,
    machine: ProtocolMachine,
    progress: dict[str, tuple[int, Any]],
    arm: Callable[[str, ProtocolMachine], None],
    observer: Observer | None,
    values: dict[Any, Any] | None = None,
) -> None:
    """After ``machine`` handled something: raise its failure, or, when its round or state moved,
    note the move (one tuple per distinct value when ``values`` keeps them), re-arm its deadline
    (unless it is done) and tell the observer."""
    if machine.failed:
        raise machine.error if machine.error is not None else LocalProtocolError(f"{party} failed", party=party)
    now_progress = (machine.round_idx, machine.state)
    if now_progress != progress[party]:
        progress[party] = now_progress if values is None else values.setdefault(now_progress, now_progress)
        if not machine.done:
            arm(party, machine)
        if observer is not None:
            observer(party, machine.round_idx, machine.state.name)


def _stalled(machines: Mapping[str, ProtocolMachine], when: str, shards: Shards | None = None) -> SimulationStalled:
    """The error for machines left waiting with nothing in flight (the first ten named); with
    ``shards`` (collective: every rank stalls at the same step) the machines of every rank, so
    the message is the one-process run's."""
    waiting = [p for p, m in machines.items() if not m.done]
    count = len(waiting)
    if shards is not None:
        count, waiting = shards.waiting(waiting, keep=10)
    named = ", ".join(waiting[:10]) + (" ..." if count > 10 else "")
    return SimulationStalled(f"{count} machines wait with nothing in flight{when}: {named}")


def _batches(receivers: list[str], machines: Mapping[str, ProtocolMachine]) -> list[tuple[int, int]]:
    """``receivers`` cut into ``[lo, hi)`` spans of consecutive machines of one class, each at most
    :data:`_BATCH_RECEIVERS` long (delivery order kept)."""
    spans: list[tuple[int, int]] = []
    lo, kind = 0, None
    for i, dest in enumerate(receivers):
        this = type(machines[dest])
        if i > lo and (this is not kind or i - lo == _BATCH_RECEIVERS):
            spans.append((lo, i))
            lo = i
        kind = this
    if receivers:
        spans.append((lo, len(receivers)))
    return spans


def _same_class_runs(receivers: list[tuple[str, ProtocolMachine]]) -> list[list[tuple[str, ProtocolMachine]]]:
    """``receivers`` cut into runs of consecutive machines of one class (delivery order kept)."""
    runs: list[list[tuple[str, ProtocolMachine]]] = []
    for entry in receivers:
        if runs and type(runs[-1][-1][1]) is type(entry[1]):
            runs[-1].append(entry)
        else:
            runs.append([entry])
    return runs


def _earliest(deadline_of: dict[str, float], machines: Mapping[str, ProtocolMachine]) -> float:
    """The earliest deadline of a machine not done (``inf`` when none is armed)."""
    return min((when for party, when in deadline_of.items() if not machines[party].done), default=math.inf)


def _due(deadline_of: dict[str, float], machines: Mapping[str, ProtocolMachine], now: float) -> list[str]:
    """The machines not done whose deadline is ``now`` (party order); their deadlines are
    consumed (re-armed by the caller)."""
    due = [party for party in machines if deadline_of.get(party) == now and not machines[party].done]
    for party in due:
        del deadline_of[party]
    return due

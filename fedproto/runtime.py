"""The Trio runtime: drive sans-IO protocol machines over transport endpoints.

:func:`run_party` drives one machine over one endpoint: send what ``start()`` returns, then loop
receive -> decode -> meter -> ``machine.receive`` -> send, until the machine is done. Each wait
runs under a *phase deadline* that restarts whenever the machine makes progress (its round or
state changes); when it passes, a :class:`~fedproto.messages.PhaseTimedOut` event is fed to the
machine, which continues with a quorum or fails with an error naming the silent parties. So a
silent peer ends in a clear error, never a hang.

Deadlines count silence, not work: when a deadline passes, the frames that were already waiting
(delivered while the party was busy handling earlier input, see
:meth:`~fedproto.transport.Transport.receive_nowait`) are read first, and only if none of them
makes progress does the machine get its ``PhaseTimedOut``.

Frames that cannot be trusted are refused *before* they reach the machine and the run goes on:
undecodable or oversized frames (whatever the decoder raises: a frame that crashes the decoder is
the sender's fault, not the receiver's), frames of another session, frames from a party outside
the roster. They are counted in the report and logged with the sender's name (logger
``fedproto.runtime``), rate-limited: the first refusal of each (sender, cause), then at most one
summary line with the count per 10 s. A party that gives up on silent peers whose frames it
refused as another session's says so in its ``InsufficientParticipants`` (the peer, the session
its frames had and the run's). Before any frame, a machine or endpoint that declares another
session than the run's raises :class:`~fedproto.errors.SessionMismatch`
(:func:`~fedproto.machine.check_sessions`). A decoded message that breaks the protocol (wrong round, not
allowed in the current state) moves the machine to ``ERROR`` and the runtime raises the machine's
error.

Failures travel: when a party fails (its machine gave up on silent parties, a peer broke the
protocol, it could not send, ...), the runtime sends an :class:`~fedproto.messages.AbortNotice`
naming the culprits to every party it exchanged frames with during the run (best effort, all at
once, for at most 1 s, metered in phase ``"abort"``) before raising. A party that receives one
from a roster peer raises :class:`~fedproto.errors.RunAborted` and passes the notice on to its own
contacts other than the one it came from and its reporter. So every survivor ends at once instead
of waiting out its own deadline and blaming the wrong party: in a star, a coordinator tells every
client, and a client's failure reaches the other clients through the coordinator. Telling
contacts rather than the whole roster keeps the notices within the links the protocol already uses
(a full mesh of TCP connections is never dialled just to say goodbye), and linear in the number of
parties when many fail at once (every client of a dead coordinator). A crashed party and a party
whose own endpoint was closed send nothing.

A notice is evidence about its sender only: it proves that the sender gave up, nothing about the
culprits it names (any party with a valid kit can send one). So the receiver's ``RunAborted``
names the reporter as its ``party`` and states the culprits as the reporter's claim ("client-1
reports that client-0 failed: ..."); a passed-on notice keeps its reporter in ``origin`` and the
party that passed it on is named as such ("server says client-1 reports that ..."), never as the
accuser. A machine that carries on without the sender
(:meth:`~fedproto.machine.ProtocolMachine.carries_on_without`: the server of a dropout-tolerant
aggregation, for its clients) takes the notice as the sender's dropout instead: it gets
:class:`~fedproto.messages.PartyDropped` for the sender, whose part is over (its later notices are
ignored, it is not told of a later failure), and the run goes on. See the threat model in
``docs/concepts.md``.

Dropouts a transport reports: a transport that knows a peer is gone for good may raise
:class:`~fedproto.errors.PeerDropped` from ``receive`` (the memory transport does with
``report_drops=True``; TCP and MPI do not). The runtime feeds the machine a
:class:`~fedproto.messages.PartyDropped` event for a roster peer (a name outside the roster is
ignored), sends what it answers, and counts a change of round or state as progress, as it does
for a frame. The default machine fails at once if it was waiting for that party and otherwise
ignores it; a dropout-tolerant role (secure aggregation with dropout recovery) carries on without it.

:func:`run_parties` runs many machines in one process (one nursery, one task per party), over a
``{party: Transport}`` mapping or a :class:`~fedproto.transport.Network`; the first failure
cancels the others and is raised as itself (not wrapped in an exception group). A party crashed
by fault injection (:class:`~fedproto.errors.PartyCrashed`) is not a failure of the run: its task
ends quietly, as a killed process would, and the survivors find out by its silence.

A message the machine itself cannot encode (a wrong field type, say) fails the sending party at
once with :class:`~fedproto.errors.LocalProtocolError` naming the field, instead of reaching its
peers as a frame they would refuse.

All time comes from ``trio.current_time()``, so ``MockClock(autojump_threshold=0)`` makes
deadline tests instant.

Cost: a party's receives all wait in one cancel scope without a deadline; one watchdog task per
Trio run (a system task, started by the first party) cancels that scope when the party's deadline
passes while it waits, and a party busy past its deadline finds that out before it next waits.
Entering a cancel scope with a deadline around every receive (``trio.move_on_at``) cost more than
a message through a bare memory channel (``benchmarks/message_rate.py`` measures the path).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import trio

from fedproto._logging import RateLimitedLog
from fedproto.codec import DEFAULT_MAX_FRAME_BYTES, decode_frame, encode_frame
from fedproto.errors import (
    DecodeError,
    FedProtoError,
    InsufficientParticipants,
    LocalProtocolError,
    PartyCrashed,
    PeerDropped,
    RunAborted,
    TransportClosed,
    TransportError,
    describe,
)
from fedproto.machine import ProtocolMachine, check_sessions
from fedproto.messages import (
    ABORT_REASON_MAX_CHARS,
    AbortNotice,
    Broadcast,
    Outgoing,
    PartyDropped,
    PhaseTimedOut,
    Send,
    SendFailed,
)
from fedproto.metering import Meter
from fedproto.transport import Network, Transport

__all__ = ["RuntimeConfig", "run_party", "run_parties"]

log = logging.getLogger("fedproto.runtime")

#: ``observer(party, round_idx, state_name)``: called after every step that changed round or state.
Observer = Callable[[str, int, str], None]

#: The phase under which abort notices are metered.
ABORT_PHASE = "abort"
#: Longest time a failing party spends telling the others (seconds); a peer that cannot be reached
#: by then (often the culprit itself) is not told.
ABORT_NOTICE_TIMEOUT_S = 1.0
#: Shortest time between two log lines about the same (sender, cause) of refused frames (seconds).
REFUSAL_LOG_INTERVAL_S = 10.0
#: Culprits named in a RunAborted message (all of them are in its ``culprits`` attribute).
_CULPRITS_NAMED = 10
#: Scheduler passes given to a transport's reader tasks before the frames waiting at an expired
#: deadline are taken (each ready reader runs at least once in two).
_CATCH_UP_PASSES = 2


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """How the runtime drives machines.

    Attributes:
        session: the run's session id; frames of other sessions are refused. A machine that
            declares a session (its ``session`` attribute: FastLloyd, MUFC, SecAgg+), or an
            endpoint that does (TCP's), must declare this one: the runtime and the lean engine
            raise :class:`~fedproto.errors.SessionMismatch` naming the party before any frame
            otherwise (a machine built without ``session=`` is session 0).
        deadline_s: seconds a machine may wait without progress before ``PhaseTimedOut``.
        max_frame_bytes: frames above this are refused before decoding.
        record_received: also count received frames (for per-process reports).
    """

    session: int = 0
    deadline_s: float = 60.0
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    record_received: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.session < 2**64:
            raise ValueError("session must be in [0, 2**64)")
        if not self.deadline_s > 0:
            raise ValueError("deadline_s must be positive")
        if self.max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")


def _encode(machine: ProtocolMachine, action: Outgoing, session: int) -> bytes:
    """The frame of ``action``'s message.

    Raises:
        LocalProtocolError: the machine's own message cannot be encoded (it fails here, in the
            sender, rather than have its peers refuse the frame and time out waiting for it).
    """
    try:
        return encode_frame(action.message, session=session, round_idx=action.round_idx, phase=action.phase)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _unencodable(machine, action, exc) from exc


def _unencodable(machine: ProtocolMachine, action: Outgoing, exc: Exception) -> LocalProtocolError:
    """The error of a machine whose message ``action`` could not be encoded (``exc``)."""
    return LocalProtocolError(
        f"{machine.party} made a message it cannot send: {exc}",
        party=machine.party,
        round_idx=action.round_idx,
        state=machine.state.name,
        phase=action.phase,
    )


async def _send_all(
    machine: ProtocolMachine,
    transport: Transport,
    outgoing: list[Outgoing],
    config: RuntimeConfig,
    meter: Meter,
    contacts: set[str],
    spent: list[float] | None = None,
) -> None:
    """Encode and send ``outgoing`` (and what the machine answers to a failed send); with
    ``spent``, add the process CPU seconds of the encoding (and of those answers) to ``spent[0]``
    (a handler's compute for the report's ``compute_trace``, the transport's writes left out)."""
    pending = collections.deque(outgoing)
    session = config.session
    while pending:
        action = pending.popleft()
        began = time.process_time() if spent is not None else 0.0
        frame = _encode(machine, action, session)
        if spent is not None:
            spent[0] += time.process_time() - began
        dests = action.dests if isinstance(action, Broadcast) else (action.dest,)
        tag = type(action.message).TAG
        for dest in dests:
            try:
                await transport.send(dest, frame)
            except PartyCrashed:
                raise  # this party itself is gone: nothing left to tell its machine
            except TransportError as exc:
                began = time.process_time() if spent is not None else 0.0
                pending.extend(machine.handle(SendFailed(dest, exc)))
                if spent is not None:
                    spent[0] += time.process_time() - began
                continue
            meter.record_sent(
                action.round_idx, action.phase, machine.party, dest, tag, len(frame), transport.framing_overhead_bytes
            )
            contacts.add(dest)


async def run_party(
    machine: ProtocolMachine,
    transport: Transport,
    *,
    config: RuntimeConfig | None = None,
    meter: Meter | None = None,
    observer: Observer | None = None,
    known_parties: frozenset[str] | None = None,
) -> Any:
    """Drive ``machine`` over ``transport`` until it is done and return ``machine.result()``.

    If the machine fails, every party it exchanged frames with is sent an
    :class:`~fedproto.messages.AbortNotice` naming the culprits before the error is raised (see
    the module docstring).

    Args:
        machine: a fresh (not started) protocol machine.
        transport: the endpoint of ``machine.party``.
        config: runtime settings (session, deadline, frame limit).
        meter: where frames are counted (a new one if ``None``).
        observer: called as ``observer(party, round_idx, state)`` after each step that changed
            the round or state (for progress bars).
        known_parties: ``frozenset(transport.roster)``, when the caller already has it (many
            parties in one process share one set instead of building one each).

    Returns:
        The machine's result.

    Raises:
        SessionMismatch: the machine, or the endpoint, declares another session than
            ``config.session`` (before any frame is sent; see :func:`~fedproto.machine.check_sessions`).
        RemoteProtocolError: a peer broke the protocol (the machine is in ``ERROR``).
        InsufficientParticipants: a deadline passed with parties still silent, or the transport
            reported a peer gone (:class:`~fedproto.errors.PeerDropped`) whose input the machine
            was waiting for (the default policy; dropout-tolerant machines carry on).
        RunAborted: a roster peer gave up on the run (the error names it, or the reporter whose
            notice it passed on; the culprits are that reporter's claim) and the machine does not
            carry on without it (the machine is left as it was).
        LocalProtocolError: the machine produced a message that cannot be encoded (a field of the
            wrong type, names ``TAG.field``; the original ``TypeError``/``ValueError`` is
            ``__cause__``).
        PartyCrashed: this party was crashed by fault injection (its machine is left as it was).
        TransportError: the endpoint failed in a way the machine could not absorb.
    """
    config = config or RuntimeConfig()
    check_sessions({machine.party: machine}, config.session, endpoints={machine.party: transport})
    meter = meter if meter is not None else Meter(trio.current_time)
    meter.start()
    roster = known_parties if known_parties is not None else frozenset(transport.roster)
    refusals = RateLimitedLog(log, machine.party, interval_s=REFUSAL_LOG_INTERVAL_S, clock=trio.current_time)
    contacts: set[str] = set()  # the parties this one exchanged frames with: who hears of a failure
    foreign: dict[str, int] = {}  # roster peers whose frames of another session were refused: the last one's
    try:
        result = await _drive(machine, transport, config, meter, observer, roster, refusals, contacts, foreign)
    except Exception as exc:
        error = _with_foreign_sessions(exc, foreign, config.session)
        notice = _abort_notice(error, machine.party)
        if notice is not None:
            # A passed-on notice goes to every contact but the one it came from and its reporter;
            # the culprits are only the reporter's claim, so they are told too.
            if isinstance(error, RunAborted):
                told = {error.reporter, error.relayed_by or error.reporter}
            else:
                told = {machine.party}
            await _announce_failure(machine, transport, notice, sorted(contacts - told), config, meter)
        if error is not exc:
            raise error from exc
        raise
    finally:
        refusals.flush()
    meter.finish()
    return result


class _Wait:
    """One party's phase deadline, shared between its runtime loop and the watchdog.

    Attributes:
        deadline: when the party's current silence becomes a timeout (``trio.current_time()``).
        scope: the cancel scope its receives run in (``None`` once the party has ended).
        waiting: the party is inside ``transport.receive()``.
        armed: the watchdog holds an entry for this wait.
        cancelled: the watchdog cancelled ``scope`` (read without ``scope.cancel_called``, which
            asks the clock).
    """

    __slots__ = ("deadline", "scope", "waiting", "armed", "cancelled")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.scope: trio.CancelScope | None = None
        self.waiting = False
        self.armed = False
        self.cancelled = False


class _Watchdog:
    """Ends the waits of parties whose phase deadline passed while they wait: one Trio system
    task for every party of a Trio run.

    A party does not enter a cancel scope with a deadline around each receive (``move_on_at``):
    entering and leaving one costs more than a message through a bare memory channel. Its
    receives run in one cancel scope without a deadline instead, which it leaves only when a
    deadline passes, and the watchdog cancels that scope when the party's deadline has passed
    *while the party waits*; so the watchdog never interrupts a send or the party's own work,
    and a party that is busy when its deadline passes finds that out itself before its next
    wait. The watchdog's entries are lazy: a party's progress only moves ``_Wait.deadline``;
    when an entry comes due and the deadline has moved, the entry is put back at the new one.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Wait]] = []
        self._order = itertools.count()
        self._sleep: trio.CancelScope | None = None
        self._ended = 0  # entries of parties that have ended, still in the heap

    def release(self, wait: _Wait) -> None:
        """The party of ``wait`` has ended: its entry is dropped (at once when most are dropped)."""
        wait.scope = None
        if not wait.armed:
            return
        self._ended += 1
        heap = self._heap
        if self._ended > 64 and 2 * self._ended > len(heap):  # many parties ended: compact
            heap[:] = [entry for entry in heap if entry[2].scope is not None]
            heapq.heapify(heap)
            self._ended = 0

    def arm(self, wait: _Wait) -> None:
        """Watch ``wait`` until its deadline."""
        wait.armed = True
        heapq.heappush(self._heap, (wait.deadline, next(self._order), wait))
        sleep = self._sleep
        if sleep is not None and wait.deadline < sleep.deadline:
            sleep.deadline = wait.deadline

    async def run(self) -> None:
        heap = self._heap
        while True:
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as self._sleep:
                await trio.sleep_forever()
            self._sleep = None
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                wait = heapq.heappop(heap)[2]
                wait.armed = False
                if wait.scope is None:  # the party has ended
                    self._ended = max(self._ended - 1, 0)
                    continue
                if wait.deadline > now:  # it made progress since: watch its new deadline
                    self.arm(wait)
                elif wait.waiting:
                    wait.cancelled = True
                    wait.scope.cancel()
                # else it is busy past its deadline: it checks before it next waits (and re-arms)


_WATCHDOG: trio.lowlevel.RunVar[_Watchdog] = trio.lowlevel.RunVar("fedproto.runtime watchdog")


def _watchdog() -> _Watchdog:
    """The watchdog of the current Trio run, started on first use."""
    try:
        return _WATCHDOG.get()
    except LookupError:
        watchdog = _Watchdog()
        _WATCHDOG.set(watchdog)
        trio.lowlevel.spawn_system_task(watchdog.run, name="fedproto.runtime phase-deadline watchdog")
        return watchdog


async def _drive(
    machine: ProtocolMachine,
    transport: Transport,
    config: RuntimeConfig,
    meter: Meter,
    observer: Observer | None,
    roster: frozenset[str],
    refusals: RateLimitedLog,
    contacts: set[str],
    foreign: dict[str, int],
) -> Any:
    def refuse(sender: str, cause: str, reason: str) -> None:
        meter.record_rejected(sender, reason, cause)
        refusals.log(sender, cause, "%s refused a frame from %s: %s", machine.party, sender, reason)

    # Duck-typed endpoints (test doubles, wrappers) may lack the optional hook.
    receive_nowait: Callable[[], tuple[str, bytes] | None] | None = getattr(transport, "receive_nowait", None)
    party = machine.party
    # --compute-trace: each handler's process CPU (decoding, the machine, encoding), in the meter
    tracing = meter.compute_trace is not None
    cpu = time.process_time
    record_compute = meter.record_compute
    began = cpu() if tracing else 0.0
    outgoing = machine.start()
    spent = [cpu() - began] if tracing else None
    await _send_all(machine, transport, outgoing, config, meter, contacts, spent)
    if spent is not None:
        record_compute(party, machine.round_idx, "start", spent[0])
    patience = config.deadline_s * machine.DEADLINE_FACTOR
    progress = (machine.round_idx, machine.state)
    wait = _Wait(trio.current_time() + patience)
    watchdog = _watchdog()
    current_time = trio.lowlevel.current_clock().current_time  # trio.current_time(), one call less
    receive = transport.receive
    send = transport.send
    record_sent = meter.record_sent
    session = config.session
    max_frame_bytes = config.max_frame_bytes
    record_received = meter.record_received if config.record_received else None
    # Frames (and dropout reports) that were waiting when the deadline passed, read before the
    # deadline is believed.
    backlog: collections.deque[tuple[str, bytes] | PeerDropped] = collections.deque()
    drained = False  # the frames waiting at this deadline's expiry were taken into the backlog
    gone: set[str] = set()  # peers whose failure notice the machine took as their dropout

    def step_done() -> None:
        """After an input: a change of round or state is progress (restarts the deadline)."""
        nonlocal progress, drained
        now = (machine.round_idx, machine.state)
        if now != progress:
            progress = now
            wait.deadline = current_time() + patience
            drained = False
            if observer is not None:
                observer(party, machine.round_idx, machine.state.name)

    try:
        while not machine.done:
            expired = False
            # Receives wait in this scope, which only the watchdog cancels (when the deadline
            # passes during a wait); it is left, and a new one entered, only when it was.
            with trio.CancelScope() as scope:
                wait.scope = scope
                wait.cancelled = False
                while not machine.done:
                    item: tuple[str, bytes] | PeerDropped
                    if backlog:
                        item = backlog.popleft()
                    elif current_time() >= wait.deadline:
                        expired = True  # passed while this party was busy
                        break
                    else:
                        if not wait.armed:
                            watchdog.arm(wait)
                        wait.waiting = True
                        try:
                            item = await receive()
                        except PeerDropped as dropped:
                            item = dropped
                        finally:
                            wait.waiting = False
                        if wait.cancelled:  # the deadline passed as this arrived: read it first
                            backlog.appendleft(item)
                            break
                    if isinstance(item, PeerDropped):
                        if item.party in roster and item.party != party:
                            outgoing = machine.handle(PartyDropped(item.party))
                            await _send_all(machine, transport, outgoing, config, meter, contacts)
                            step_done()
                        continue
                    sender, frame = item
                    if sender not in roster:
                        refuse(sender, "sender not in the roster", "not in the roster")
                        continue
                    began = cpu() if tracing else 0.0
                    try:
                        envelope, message = decode_frame(frame, max_frame_bytes=max_frame_bytes)
                    except DecodeError as exc:
                        refuse(sender, "undecodable frame", str(exc))
                        continue
                    except Exception as exc:
                        # Whatever the decoder raises on a peer's bytes is the peer's fault: a frame
                        # must never crash its receiver.
                        log.debug("decoding a frame from %s raised %s", sender, type(exc).__name__, exc_info=True)
                        refuse(sender, "undecodable frame", f"the decoder failed with {type(exc).__name__}: {exc}")
                        continue
                    if envelope.session != session:
                        refuse(
                            sender,
                            "frame of another session",
                            f"frame of session {envelope.session}, this run is session {session}",
                        )
                        foreign[sender] = envelope.session
                        continue
                    if record_received is not None:
                        record_received(envelope.round_idx, envelope.phase, sender, party, envelope.tag, len(frame))
                    contacts.add(sender)
                    if type(message) is AbortNotice:
                        if sender in gone:
                            continue  # its part is over already
                        if not machine.carries_on_without(sender):
                            raise _run_aborted(machine, sender, message, roster)
                        # A dropout-tolerant machine: the sender's notice ends the sender's part.
                        log.info(
                            "%s: %s gave up (%s); carrying on without it", party, sender, _one_line(message.reason, 200)
                        )
                        gone.add(sender)
                        contacts.discard(sender)
                        outgoing = machine.handle(PartyDropped(sender))
                        await _send_all(machine, transport, outgoing, config, meter, contacts)
                        step_done()
                        continue
                    outgoing = machine.receive(sender, message, round_idx=envelope.round_idx)
                    if len(outgoing) == 1 and type(outgoing[0]) is Send:
                        # The usual answer, one message to one party: _send_all's work inline.
                        action = outgoing[0]
                        dest = action.dest
                        try:
                            out = encode_frame(
                                action.message, session=session, round_idx=action.round_idx, phase=action.phase
                            )
                        except (TypeError, ValueError, OverflowError) as exc:
                            raise _unencodable(machine, action, exc) from exc
                        if tracing:
                            record_compute(party, envelope.round_idx, envelope.tag, cpu() - began)
                        try:
                            await send(dest, out)
                        except PartyCrashed:
                            raise  # this party itself is gone: nothing left to tell its machine
                        except TransportError as exc:
                            outgoing = machine.handle(SendFailed(dest, exc))
                            await _send_all(machine, transport, outgoing, config, meter, contacts)
                        else:
                            record_sent(
                                action.round_idx, action.phase, party, dest, type(action.message).TAG, len(out),
                                transport.framing_overhead_bytes,
                            )
                            contacts.add(dest)
                    else:
                        spent = [cpu() - began] if tracing else None
                        if outgoing:
                            await _send_all(machine, transport, outgoing, config, meter, contacts, spent)
                        if spent is not None:
                            record_compute(party, envelope.round_idx, envelope.tag, spent[0])
                    if (machine.round_idx, machine.state) != progress:
                        step_done()
            if not (expired or scope.cancelled_caught):
                continue  # done, or a frame arrived as the deadline passed (it is in the backlog)
            if not drained:
                # The wait may have expired only because handling earlier input took longer
                # than the deadline: silence is a deadline with nothing waiting. First let
                # the event loop run, so frames the operating system already holds reach
                # the transport's queue (synchronous work kept its reader tasks from running),
                # then take what is waiting, without yielding, so a peer that keeps sending
                # cannot postpone the timeout for ever.
                drained = True
                if receive_nowait is not None:
                    for _ in range(_CATCH_UP_PASSES):
                        await trio.lowlevel.checkpoint()
                    while True:
                        try:
                            waiting = receive_nowait()
                        except PeerDropped as dropped:
                            backlog.append(dropped)
                            continue
                        if waiting is None:
                            break
                        backlog.append(waiting)
                if backlog:
                    continue
            timed_out_in = machine.round_idx
            began = cpu() if tracing else 0.0
            outgoing = machine.handle(PhaseTimedOut(machine.round_idx, machine.phase, patience))
            spent = [cpu() - began] if tracing else None
            await _send_all(machine, transport, outgoing, config, meter, contacts, spent)
            if spent is not None:
                record_compute(party, timed_out_in, "timeout", spent[0])
            progress = (machine.round_idx, machine.state)
            wait.deadline = current_time() + patience
            drained = False
    finally:
        watchdog.release(wait)
    return machine.result()


def _with_foreign_sessions(exc: Exception, foreign: dict[str, int], session: int) -> Exception:
    """``exc``, or for a party that gave up on silent peers some of whose frames it refused as
    another session's, the same error saying so (the cause, not only the silence; ``exc`` is its
    ``__cause__``). Such a peer's runtime runs another session (a misconfigured process): its
    frames are refused, not fatal, so that a stale frame of an earlier run cannot end this one."""
    if not isinstance(exc, InsufficientParticipants) or not foreign:
        return exc
    named = [p for p in exc.missing if p in foreign]
    if not named:
        return exc
    said = ", ".join(f"{p} sent frames of session {foreign[p]}" for p in named[:_CULPRITS_NAMED])
    if len(named) > _CULPRITS_NAMED:
        said += f" and {len(named) - _CULPRITS_NAMED} more did"
    error = InsufficientParticipants(
        f"{exc.detail}; {said}, refused: this run is session {session}",
        missing=exc.missing, party=exc.party, round_idx=exc.round_idx, state=exc.state, phase=exc.phase,
    )
    return error


def _one_line(text: str, limit: int = ABORT_REASON_MAX_CHARS) -> str:
    """``text`` on one line (whitespace runs collapsed), shortened to ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _abort_notice(exc: Exception, party: str) -> AbortNotice | None:
    """The notice a party failing with ``exc`` sends its contacts, or ``None`` if it sends none.

    A party told by a peer (``RunAborted``) passes the same notice on with its reporter as the
    ``origin`` (never as its own claim), so a failure reported to the coordinator of a star
    reaches every client through it, naming the party that reported it.
    """
    if isinstance(exc, RunAborted):
        return AbortNotice(culprits=exc.culprits, reason=exc.reason, origin=exc.reporter)
    if isinstance(exc, PartyCrashed) and exc.party == party:
        return None  # a crashed party is gone, as a killed process would be
    if isinstance(exc, TransportClosed):
        return None  # our own endpoint is closed: nothing can be sent
    return AbortNotice(culprits=_culprits(exc, party), reason=_one_line(describe(exc)))


def _culprits(exc: Exception, party: str) -> tuple[str, ...]:
    """The parties ``exc`` blames: the silent ones, the peer it is about, else ``party`` itself."""
    if isinstance(exc, InsufficientParticipants) and exc.missing:
        return exc.missing
    if isinstance(exc, FedProtoError) and exc.party:
        return (exc.party,)
    return (party,)


def _run_aborted(machine: ProtocolMachine, sender: str, notice: AbortNotice, roster: frozenset[str]) -> RunAborted:
    """The error of a party that ``sender``'s failure notice ends.

    The notice is evidence about its reporter only: the error names the reporter (the sender, or
    the ``origin`` the sender passes the notice on from) as its ``party`` and leads with it, and
    states the culprits as the reporter's claim. An origin that cannot be (outside the roster,
    the receiver itself) is not believed: the notice counts as the sender's own.
    """
    origin = notice.origin
    if origin == sender:
        origin = ""
    elif origin and (origin not in roster or origin == machine.party):
        log.warning(
            "%s: %s passed on a failure notice from %r, which cannot have sent one; taken as %s's own",
            machine.party, sender, _one_line(origin, 80), sender,
        )
        origin = ""
    reporter = origin or sender
    culprits = tuple(sorted(set(notice.culprits)))
    reason = _one_line(notice.reason)
    # Leads with the reporter, the one party the notice is evidence about (a launcher quotes the
    # first party to exit, often a survivor); the culprits are the reporter's claim.
    if culprits == (reporter,):
        claim = f"{reporter} failed and ended the run"
    else:
        named = ", ".join(culprits[:_CULPRITS_NAMED])
        if len(culprits) > _CULPRITS_NAMED:
            named += f" and {len(culprits) - _CULPRITS_NAMED} more"
        claim = f"{reporter} reports that {named} failed"
    message = f"{sender} says {claim}: {reason}" if origin else f"{claim}: {reason}"
    return RunAborted(
        message,
        culprits=culprits,
        reporter=reporter,
        reason=reason,
        relayed_by=sender if origin else "",
        party=reporter,
        **machine.error_context(),
    )


async def _announce_failure(
    machine: ProtocolMachine,
    transport: Transport,
    notice: AbortNotice,
    peers: list[str],
    config: RuntimeConfig,
    meter: Meter,
) -> None:
    """Send ``notice`` to ``peers`` (best effort, concurrently, at most ``ABORT_NOTICE_TIMEOUT_S``)."""
    if not peers:
        return
    round_idx = machine.round_idx
    frame = encode_frame(notice, session=config.session, round_idx=round_idx, phase=ABORT_PHASE)
    if notice.origin:
        log.info("%s passes %s's failure notice on to %d parties", machine.party, notice.origin, len(peers))
    else:
        log.info(
            "%s failed; telling %d parties that %s failed", machine.party, len(peers), ", ".join(notice.culprits)
        )

    async def tell(dest: str) -> None:
        try:
            await transport.send(dest, frame)
        except Exception as send_exc:  # best effort: the peer may well be the one that failed
            log.debug("%s could not tell %s: %s", machine.party, dest, describe(send_exc))
            return
        meter.record_sent(
            round_idx, ABORT_PHASE, machine.party, dest, AbortNotice.TAG, len(frame), transport.framing_overhead_bytes
        )

    # Shielded (for a bounded time) so a cancellation arriving meanwhile, e.g. run_parties
    # reacting to a peer that was just told, cannot lose this party's own error.
    with trio.CancelScope(shield=True), trio.move_on_after(min(ABORT_NOTICE_TIMEOUT_S, config.deadline_s)):
        async with trio.open_nursery() as nursery:
            for dest in peers:
                nursery.start_soon(tell, dest)


async def run_parties(
    machines: Mapping[str, ProtocolMachine],
    network_or_endpoints: Network | Mapping[str, Transport],
    *,
    config: RuntimeConfig | None = None,
    meter: Meter | None = None,
    observer: Observer | None = None,
) -> dict[str, Any]:
    """Run many machines in one process, one task per party, and return their results.

    Crash semantics: a party whose own endpoint raises :class:`~fedproto.errors.PartyCrashed`
    (memory transport, ``Faults(crash_after=...)``) is gone, as a killed process would be. Its task
    ends quietly, without a result; it is not the run's error and cancels nobody. The surviving
    coordinator then notices its silence at the phase deadline and either fails with
    :class:`~fedproto.errors.InsufficientParticipants` naming the crashed party (raised here), or
    carries on with a quorum, in which case the survivors' results are returned.

    Args:
        machines: ``{party: machine}``.
        network_or_endpoints: ``{party: transport}`` with an endpoint for every machine, or a
            :class:`~fedproto.transport.Network`: its endpoints for the machines' parties are
            opened here (with the network's own roster, or the machines' parties as the roster
            when the network has none) and closed when the run ends.
        config, meter, observer: as for :func:`run_party`; the meter is shared.

    Returns:
        ``{party: result}`` for every party that finished (a crashed party has no entry).

    Raises:
        SessionMismatch: a machine, or an endpoint, declares another session than
            ``config.session`` (names every such party; raised before any frame is sent).
        ValueError: a machine has no endpoint.
        TypeError: ``network_or_endpoints`` is neither a network nor a mapping.
        FedProtoError: the first failure of any party (the other parties are cancelled); a
            party's own failure is preferred to the :class:`~fedproto.errors.RunAborted` of a
            local peer it told.
    """
    config = config or RuntimeConfig()
    # Every machine at once, before any endpoint is opened or task started (each run_party checks
    # its own again, and _run_parties the endpoints' sessions once they are open).
    check_sessions(machines, config.session)
    if isinstance(network_or_endpoints, Network):
        network = network_or_endpoints
        roster = network.roster if network.roster is not None else tuple(machines)
        async with network.endpoints(roster, tuple(machines)) as endpoints:
            return await _run_parties(machines, endpoints, config=config, meter=meter, observer=observer)
    if not isinstance(network_or_endpoints, Mapping):
        raise TypeError(
            f"run_parties needs a Network or a {{party: Transport}} mapping, got "
            f"{type(network_or_endpoints).__name__} (pass the network itself, or the mapping that "
            f"'async with network.endpoints() as endpoints' yields)"
        )
    return await _run_parties(machines, network_or_endpoints, config=config, meter=meter, observer=observer)


async def _run_parties(
    machines: Mapping[str, ProtocolMachine],
    endpoints: Mapping[str, Transport],
    *,
    config: RuntimeConfig | None,
    meter: Meter | None,
    observer: Observer | None,
) -> dict[str, Any]:
    missing = set(machines) - set(endpoints)
    if missing:
        raise ValueError(f"no endpoint for {sorted(missing)}")
    config = config or RuntimeConfig()
    check_sessions({}, config.session, endpoints=endpoints)  # before any task sends a frame
    meter = meter if meter is not None else Meter(trio.current_time)
    results: dict[str, Any] = {}
    failures: list[BaseException] = []
    # Endpoints of one network share one roster object: build its set once, not once per party
    # (10,000 parties would otherwise hold 10,000 sets of 10,000 names).
    shared: dict[int, tuple[Any, frozenset[str]]] = {}

    def known_parties(roster: Any) -> frozenset[str]:
        entry = shared.get(id(roster))
        if entry is None or entry[0] is not roster:
            entry = shared[id(roster)] = (roster, frozenset(roster))
        return entry[1]

    async def one(party: str, cancel_scope: trio.CancelScope) -> None:
        known = known_parties(endpoints[party].roster)
        try:
            results[party] = await run_party(
                machines[party], endpoints[party], config=config, meter=meter, observer=observer,
                known_parties=known,
            )
        except trio.Cancelled:
            raise
        except PartyCrashed as exc:
            if exc.party != party:
                failures.append(exc)
                cancel_scope.cancel()
                return
            log.info("%s crashed (fault injection); its task ends without a result", party)
        except Exception as exc:
            failures.append(exc)
            cancel_scope.cancel()

    meter.start()
    async with trio.open_nursery() as nursery:
        for party in machines:
            nursery.start_soon(one, party, nursery.cancel_scope)
    meter.finish()
    if failures:
        # A party that failed on its own, not one that was merely told of that failure (the
        # notice may reach a local peer before the failing task has recorded its error).
        raise next((f for f in failures if not isinstance(f, RunAborted)), failures[0])
    return results

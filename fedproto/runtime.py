"""The Trio runtime: drive sans-IO protocol machines over transport endpoints.

:func:`run_party` drives one machine over one endpoint: send what ``start()`` returns, then loop
receive -> decode -> meter -> ``machine.receive`` -> send, until the machine is done. Each wait
runs under a *phase deadline* that restarts whenever the machine makes progress (its round or
state changes); when it passes, a :class:`~fedproto.messages.PhaseTimedOut` event is fed to the
machine, which continues with a quorum or fails with an error naming the silent parties. So a
silent peer ends in a clear error, never a hang.

Frames that cannot be trusted are refused *before* they reach the machine and the run goes on:
undecodable or oversized frames, frames of another session, frames from a party outside the
roster. They are logged (logger ``fedproto.runtime``) and counted in the report. A decoded
message that breaks the protocol (wrong round, not allowed in the current state) moves the
machine to ``ERROR`` and the runtime raises the machine's error.

:func:`run_parties` runs many machines in one process (one nursery, one task per party); the
first failure cancels the others and is raised as itself (not wrapped in an exception group).
All time comes from ``trio.current_time()``, so ``MockClock(autojump_threshold=0)`` makes
deadline tests instant.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

import trio

from fedproto.codec import DEFAULT_MAX_FRAME_BYTES, decode_frame, encode_frame
from fedproto.errors import DecodeError, TransportError
from fedproto.machine import ProtocolMachine
from fedproto.messages import Broadcast, Outgoing, PhaseTimedOut, SendFailed
from fedproto.metering import Meter
from fedproto.transport import Transport

__all__ = ["RuntimeConfig", "run_party", "run_parties"]

log = logging.getLogger("fedproto.runtime")

#: ``observer(party, round_idx, state_name)``: called after every step that changed round or state.
Observer = Callable[[str, int, str], None]


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """How the runtime drives machines.

    Attributes:
        session: the run's session id; frames of other sessions are refused.
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


async def _send_all(
    machine: ProtocolMachine,
    transport: Transport,
    outgoing: list[Outgoing],
    config: RuntimeConfig,
    meter: Meter,
) -> None:
    pending = list(outgoing)
    while pending:
        action = pending.pop(0)
        frame = encode_frame(action.message, session=config.session, round_idx=action.round_idx, phase=action.phase)
        dests = action.dests if isinstance(action, Broadcast) else (action.dest,)
        tag = type(action.message).TAG
        for dest in dests:
            try:
                await transport.send(dest, frame)
            except TransportError as exc:
                pending.extend(machine.handle(SendFailed(dest, exc)))
                continue
            meter.record_sent(
                action.round_idx, action.phase, machine.party, dest, tag, len(frame), transport.framing_overhead_bytes
            )


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
        RemoteProtocolError: a peer broke the protocol (the machine is in ``ERROR``).
        InsufficientParticipants: a deadline passed with parties still silent.
        TransportError: the endpoint failed in a way the machine could not absorb.
    """
    config = config or RuntimeConfig()
    meter = meter if meter is not None else Meter(trio.current_time)
    meter.start()
    roster = known_parties if known_parties is not None else frozenset(transport.roster)
    await _send_all(machine, transport, machine.start(), config, meter)
    patience = config.deadline_s * machine.DEADLINE_FACTOR
    progress = (machine.round_idx, machine.state)
    deadline = trio.current_time() + patience
    while not machine.done:
        with trio.move_on_at(deadline) as scope:
            sender, frame = await transport.receive()
        if scope.cancelled_caught:
            outgoing = machine.handle(PhaseTimedOut(machine.round_idx, machine.phase, patience))
            await _send_all(machine, transport, outgoing, config, meter)
            progress = (machine.round_idx, machine.state)
            deadline = trio.current_time() + patience
            continue
        if sender not in roster:
            meter.record_rejected(sender, "sender not in the roster")
            log.warning("%s refused a frame from %r: not in the roster", machine.party, sender)
            continue
        try:
            envelope, message = decode_frame(frame, max_frame_bytes=config.max_frame_bytes)
        except DecodeError as exc:
            meter.record_rejected(sender, str(exc))
            log.warning("%s refused a frame from %s: %s", machine.party, sender, exc)
            continue
        if envelope.session != config.session:
            reason = f"frame of session {envelope.session}, this run is session {config.session}"
            meter.record_rejected(sender, reason)
            log.warning("%s refused a frame from %s: %s", machine.party, sender, reason)
            continue
        if config.record_received:
            meter.record_received(envelope.round_idx, envelope.phase, sender, machine.party, envelope.tag, len(frame))
        outgoing = machine.receive(sender, message, round_idx=envelope.round_idx)
        await _send_all(machine, transport, outgoing, config, meter)
        now = (machine.round_idx, machine.state)
        if now != progress:
            progress = now
            deadline = trio.current_time() + patience
            if observer is not None:
                observer(machine.party, machine.round_idx, machine.state.name)
    meter.finish()
    return machine.result()


async def run_parties(
    machines: Mapping[str, ProtocolMachine],
    endpoints: Mapping[str, Transport],
    *,
    config: RuntimeConfig | None = None,
    meter: Meter | None = None,
    observer: Observer | None = None,
) -> dict[str, Any]:
    """Run many machines in one process, one task per party, and return their results.

    Args:
        machines: ``{party: machine}``.
        endpoints: ``{party: transport}`` with an endpoint for every machine.
        config, meter, observer: as for :func:`run_party`; the meter is shared.

    Returns:
        ``{party: result}``.

    Raises:
        ValueError: a machine has no endpoint.
        FedProtoError: the first failure of any party (the other parties are cancelled).
    """
    missing = set(machines) - set(endpoints)
    if missing:
        raise ValueError(f"no endpoint for {sorted(missing)}")
    config = config or RuntimeConfig()
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
        except Exception as exc:
            failures.append(exc)
            cancel_scope.cancel()

    meter.start()
    async with trio.open_nursery() as nursery:
        for party in machines:
            nursery.start_soon(one, party, nursery.cancel_scope)
    meter.finish()
    if failures:
        raise failures[0]
    return results

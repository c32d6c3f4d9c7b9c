"""The sans-IO protocol-machine base class.

Each role of a protocol (server, client, coordinator, tree node...) is a subclass of
:class:`ProtocolMachine` that never awaits, sleeps, reads a clock, touches a socket or draws from
global randomness. The subclass supplies:

* ``State``: an :class:`enum.Enum` with at least ``DONE`` and ``ERROR`` (:func:`machine_states`
  declares one in a line: ``CenterState = machine_states("CenterState", "COLLECT", "SERVING")``),
  and ``INITIAL_STATE``;
* ``TRANSITIONS``: one table ``{(state, message class): (handler name, next state)}``; a message
  that is not in the table for the current state is a protocol error;
* ``_start()``: the first messages; handlers ``handler(sender, message) -> list[Outgoing]``;
* optionally ``_advance()``: called after every input, it performs the state-triggered work
  ("all replies are in, now aggregate") and returns further messages; it changes state with
  :meth:`~ProtocolMachine.move_to` and finishes with ``_finish(result)``;
* ``pending()``: the parties whose input the machine is waiting for (used to name silent
  parties when a deadline passes);
* optionally ``_on_event(event)`` (a quorum rule: carry on without parties that went silent or
  were reported gone), ``_ignores(sender)`` (drop the late frames of parties it carried on
  without, before the round check) and ``carries_on_without(party)`` (when it would carry on
  without a party: the runtime then takes that party's failure notice as its dropout).

The base class owns the lookup, the round check, and the failure rule: any exception raised while
handling an input moves the machine to ``ERROR`` and every later call raises
:class:`~fedproto.errors.LocalProtocolError` chained to the original error. An error a subclass
raises names where the machine is with ``**self.error_context()`` (round, state, phase), and
``self.insufficient(message, missing)`` is the error of a machine that cannot go on without the
parties ``missing``.

A subclass is checked when it is defined, once it has ``State``, ``INITIAL_STATE`` and
``TRANSITIONS`` (abstract intermediate bases without them are skipped): ``State`` is an enum with
``DONE`` and ``ERROR``, ``INITIAL_STATE`` is one of its members, and every entry of
``TRANSITIONS`` maps ``(member, Message subclass)`` to ``(name of a method, member)``. A mistake
raises :class:`TypeError` naming the class, at import time rather than in the middle of a run.
"""

from __future__ import annotations

import enum
import sys
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from fedproto.errors import (
    InsufficientParticipants,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    SessionMismatch,
    describe,
)
from fedproto.messages import Broadcast, Event, Message, Outgoing, PartyDropped, PhaseTimedOut, Send, SendFailed

__all__ = ["ProtocolMachine", "check_sessions", "machine_states", "party_index"]


def machine_states(name: str, *members: str) -> type[enum.Enum]:
    """The states of one protocol role: an enum ``name`` with ``members`` in order, then ``DONE`` and ``ERROR``.

    ``machine_states("CenterState", "COLLECT", "SERVING")`` is the class
    ``CenterState(enum.Enum)`` with members ``COLLECT, SERVING, DONE, ERROR`` (values 1, 2, 3, 4),
    defined in the caller's module (so it pickles and prints as one written out there). Every
    role's states end in the two the base class owns: ``DONE`` (a result is ready) and ``ERROR``
    (an input failed; every later call raises).

    Args:
        name: the enum's name (the name it is assigned to).
        members: the role's own states, identifiers; the first need not be the initial one (that
            is the role's ``INITIAL_STATE``).

    Raises:
        ValueError: no member, a repeated one, ``DONE`` or ``ERROR`` among them, or a name that is
            not an identifier.
    """
    if not members:
        raise ValueError(f"{name}: a role has at least one state of its own besides DONE and ERROR")
    bad = [m for m in members if not (isinstance(m, str) and m.isidentifier())]
    if bad or not name.isidentifier():
        raise ValueError(f"{name}: state names must be identifiers, got {bad or name!r}")
    if len(set(members)) != len(members) or {"DONE", "ERROR"} & set(members):
        raise ValueError(f"{name}: repeated states, or DONE/ERROR given (they are added): {members}")
    module = sys._getframe(1).f_globals.get("__name__", __name__)
    return enum.Enum(name, [*members, "DONE", "ERROR"], module=module, qualname=name)


#: ``id(parties) -> (parties, index)`` of the last few party lists indexed (kept alive by the entry).
_INDEXES: dict[int, tuple[tuple[str, ...], Mapping[str, int]]] = {}
_INDEXES_KEPT = 8
#: Parties named in a SessionMismatch message per session (all of them are in its ``parties``).
_SESSION_PARTIES_NAMED = 10


def check_sessions(
    machines: Mapping[str, Any], session: int, *, endpoints: Mapping[str, Any] | None = None
) -> None:
    """Check that every machine (and endpoint) that declares a session declares the run's.

    A machine declares one with a ``session`` attribute (the protocols that compute with it:
    FastLloyd, MUFC, SecAgg+); a machine without one is not checked, nor is an endpoint without
    one (the memory transport's). The runtime, the lean engine and the harness call this before
    any frame is sent, so that a machine built with another session, or without one (its default,
    0) in a run of another session, fails at once instead of computing with the wrong session.

    Args:
        machines: ``{party: machine}``.
        session: the run's session (:attr:`fedproto.runtime.RuntimeConfig.session`).
        endpoints: ``{party: Transport}``, when the endpoints carry a session of their own (a TCP
            endpoint's handshake session).

    Raises:
        SessionMismatch: a machine or endpoint declares another session; the message names the
            parties (up to 10 per session), each session they declare and the run's.
    """
    differing: dict[tuple[str, int], list[str]] = {}
    agreeing = 0
    for kind, parts in (("machine", machines), ("endpoint", endpoints or {})):
        for party, part in parts.items():
            declared = getattr(part, "session", None)
            if declared is None or isinstance(declared, bool) or not isinstance(declared, int):
                continue
            if declared == session:
                agreeing += kind == "machine"
            else:
                differing.setdefault((kind, declared), []).append(party)
    if not differing:
        return
    clauses = []
    for (kind, declared), parties in differing.items():
        named = ", ".join(parties[:_SESSION_PARTIES_NAMED])
        if len(parties) > _SESSION_PARTIES_NAMED:
            named += f" and {len(parties) - _SESSION_PARTIES_NAMED} more"
        plural = len(parties) > 1
        clause = f"{named}'s {kind}{'s are' if plural else ' is'} session {declared}"
        if kind == "machine" and declared == 0:
            clause += " (the default of a machine built without session=)"
        clauses.append(clause)
    message = f"{'; '.join(clauses)}, but the run is session {session}"
    sessions = {declared for kind, declared in differing if kind == "machine"}
    if agreeing == 0 and len(sessions) == 1 and sum(len(p) for p in differing.values()) > 1:
        message += f" (RuntimeConfig.session): every machine is session {next(iter(sessions))}"
    elif sessions:
        message += " (RuntimeConfig.session): build every machine with the run's session"
    else:
        message += " (RuntimeConfig.session): open every endpoint with the run's session"
    (kind, declared), parties = next(iter(differing.items()))
    every = tuple(p for group in differing.values() for p in group)
    raise SessionMismatch(message, party=parties[0], parties=every, session=declared, expected=session)


def party_index(parties: tuple[str, ...]) -> Mapping[str, int]:
    """``{party: position}`` of ``parties`` (the first position of a repeated name), read-only.

    Machines of one run share their roster tuple; this builds its index once for all of them, so
    a million clients neither scan the roster (``tuple.index`` is O(n) per lookup) nor hold a
    million indexes. The last few tuples indexed are cached by identity.

    Args:
        parties: party names, a tuple (the same object for every machine of a run).

    Returns:
        A read-only mapping from name to position.
    """
    entry = _INDEXES.get(id(parties))
    if entry is None or entry[0] is not parties:
        index: dict[str, int] = {}
        for i, name in enumerate(parties):
            index.setdefault(name, i)
        if len(_INDEXES) >= _INDEXES_KEPT:
            _INDEXES.pop(next(iter(_INDEXES)))
        entry = _INDEXES[id(parties)] = (parties, types.MappingProxyType(index))
    return entry[1]


class ProtocolMachine:
    """Base class of every protocol role (sans-IO).

    Args:
        party: this machine's party name.

    Attributes:
        party: this machine's party name.
        round_idx: the current 0-based round.
        error: the error that moved the machine to ``ERROR``, else ``None``.
    """

    State: ClassVar[type[enum.Enum]]
    #: The runtime's phase deadline is multiplied by this. Roles that wait on a coordinator whose
    #: own phase includes a collect deadline use 2, so the coordinator's timeout (which names the
    #: silent party) fires first.
    DEADLINE_FACTOR: ClassVar[float] = 1.0
    INITIAL_STATE: ClassVar[enum.Enum]
    TRANSITIONS: ClassVar[dict[tuple[enum.Enum, type[Message]], tuple[str, enum.Enum]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if all(hasattr(cls, attr) for attr in ("State", "INITIAL_STATE", "TRANSITIONS")):
            _check_machine_class(cls)

    def __init__(self, party: str) -> None:
        if not isinstance(party, str) or not party:
            raise TypeError("party must be a non-empty string")
        self.party = party
        self.round_idx = 0
        self.error: BaseException | None = None
        self._state: enum.Enum = self.INITIAL_STATE
        self._started = False
        self._result: Any = None

    # -- public surface -------------------------------------------------------------------------

    @property
    def state(self) -> enum.Enum:
        """The current state (a member of ``State``)."""
        return self._state

    @property
    def done(self) -> bool:
        """True once the machine reached ``DONE``."""
        return self._state is self.State.DONE

    @property
    def failed(self) -> bool:
        """True once the machine reached ``ERROR``."""
        return self._state is self.State.ERROR

    @property
    def phase(self) -> str:
        """The current protocol phase (by default the state's name in lower case)."""
        return self._state.name.lower()

    def pending(self) -> Sequence[str]:
        """Parties whose input this machine is waiting for (override in coordinating roles)."""
        return ()

    def carries_on_without(self, party: str) -> bool:
        """True when this machine, now, would go on without ``party`` were it reported gone.

        The runtime asks this when ``party`` sends a failure notice
        (:class:`~fedproto.messages.AbortNotice`): if True, the notice ends ``party``'s part only
        and is fed to the machine as :class:`~fedproto.messages.PartyDropped` (a client of a
        dropout-tolerant aggregation that gives up is a dropout, so one client cannot end the
        run); if False, the run ends for this party with :class:`~fedproto.errors.RunAborted`
        naming ``party`` as the reporter. A role whose :meth:`_on_event` carries on without
        dropped parties overrides this to say when it does; the default is False.
        """
        return False

    def start(self) -> list[Outgoing]:
        """Return the first messages to send.

        Raises:
            LocalProtocolError: ``start`` was already called, or the machine failed.
        """
        self._check_usable()
        if self._started:
            raise LocalProtocolError("start() called twice", party=self.party, state=self._state.name)
        self._started = True
        return self._guarded(lambda: self._start() + self._advance())

    def receive(self, sender: str, message: Message, *, round_idx: int | None = None) -> list[Outgoing]:
        """React to ``message`` from ``sender``.

        Args:
            sender: the sending party, as established by the transport.
            message: the decoded message.
            round_idx: the round stamped on the frame's envelope; checked against ``round_idx``.

        Returns:
            The messages to send in response.

        Raises:
            RemoteProtocolError: the message is not allowed in the current state or round; the
                machine moves to ``ERROR``.
            LocalProtocolError: the machine has not been started or has already failed.
        """
        state_enum = self.State
        state = self._state
        if state is state_enum.ERROR or state is state_enum.DONE or not self._started:
            self._check_usable()
            raise LocalProtocolError("receive() before start()", party=self.party, state=state.name)
        # The step inline, guarded as _guarded guards (this runs once per message: no closure).
        try:
            if self._ignores(sender):
                return []
            entry = self.TRANSITIONS.get((self._state, type(message)))
            if entry is None:
                raise RemoteProtocolError(
                    f"unexpected {type(message).__name__} from {sender} in state {self._state.name}",
                    party=sender,
                    **self.error_context(),
                )
            if round_idx is not None and round_idx != self.round_idx:
                raise RemoteProtocolError(
                    f"{type(message).__name__} from {sender} is for round {round_idx}, "
                    f"this machine is in round {self.round_idx}",
                    party=sender,
                    **self.error_context(),
                )
            handler_name, next_state = entry
            before = self._state
            out = getattr(self, handler_name)(sender, message)
            if self._state is before:  # a handler may finish (DONE) on its own
                self._state = next_state
            return list(out) + self._advance()
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
                raise
            self.error = exc
            self._state = state_enum.ERROR
            raise

    def handle(self, event: Event) -> list[Outgoing]:
        """React to a runtime event.

        The default policy: a :class:`PhaseTimedOut` or :class:`PartyDropped` of a party we are
        waiting for fails with :class:`InsufficientParticipants` naming the missing parties; a
        :class:`SendFailed` fails with the transport error as cause. Roles with quorum rules
        override :meth:`_on_event`.

        Raises:
            InsufficientParticipants: a deadline passed, or a pending party dropped.
            LocalProtocolError: the machine has already failed.
        """
        self._check_usable()
        return self._guarded(lambda: self._on_event(event) + self._advance())

    @classmethod
    def receive_batch(
        cls, machines: Sequence["ProtocolMachine"], sender: str, message: Message, *, round_idx: int | None = None
    ) -> list[list[Outgoing]]:
        """Deliver one broadcast ``message`` to several machines of this class at once.

        A simulation engine that hosts many parties (:func:`fedproto.simulation.simulate`) calls
        this instead of :meth:`receive` once per receiver. The default does exactly that. A role
        may override it to compute what the receivers share, or what vectorises across them, in
        one pass, and then let each machine's :meth:`receive` use it: the override must leave
        every machine in the state, and return the messages, that one :meth:`receive` each would
        have. So a protocol author writes one role; batching is an optimisation of it, testable
        by running with and without it (``simulate(..., batch=False)``).

        Args:
            machines: receivers, all instances of this class, in delivery order.
            sender, message, round_idx: as for :meth:`receive`.

        Returns:
            One list of outgoing messages per machine, in order.

        Raises:
            Whatever :meth:`receive` raises for the first machine that fails (the machines before
            it have received the message; those after it have not).
        """
        return [machine.receive(sender, message, round_idx=round_idx) for machine in machines]

    def result(self) -> Any:
        """The protocol's output.

        Raises:
            LocalProtocolError: the machine is not done (chained to the failure if it failed).
        """
        if self._state is self.State.ERROR:
            raise LocalProtocolError(
                f"{self.party} failed: {describe(self.error)}", party=self.party, state="ERROR"
            ) from self.error
        if not self.done:
            raise LocalProtocolError(
                "result() before the protocol is done", party=self.party, state=self._state.name
            )
        return self._result

    # -- helpers for subclasses -----------------------------------------------------------------

    def move_to(self, state: enum.Enum) -> None:
        """Change state, from a handler or ``_advance`` (the transition table covers the rest).

        A handler that moves to a state other than the one it was called in overrides its table
        entry's next state for that input.

        Args:
            state: a member of ``State`` other than ``DONE`` and ``ERROR``.

        Raises:
            TypeError: ``state`` is not a member of ``State``.
            ValueError: ``state`` is ``DONE`` (finish with ``_finish(result)``, which records the
                result) or ``ERROR`` (raise an error instead: the base class moves to ``ERROR``).
            LocalProtocolError: the machine is already done or failed.
        """
        if not isinstance(state, self.State):
            raise TypeError(
                f"{type(self).__qualname__}.move_to: {state!r} is not a member of {self.State.__qualname__}"
            )
        if state is self.State.DONE:
            raise ValueError(f"{type(self).__qualname__}.move_to(DONE): finish with self._finish(result) instead")
        if state is self.State.ERROR:
            raise ValueError(
                f"{type(self).__qualname__}.move_to(ERROR): raise an error instead (the machine then moves to ERROR)"
            )
        if self._state is self.State.DONE or self._state is self.State.ERROR:
            raise LocalProtocolError(
                f"move_to({state.name}) after the machine reached {self._state.name}",
                party=self.party,
                state=self._state.name,
            )
        self._state = state

    def error_context(self) -> dict[str, Any]:
        """Where this machine is, as the keywords of a :class:`~fedproto.errors.FedProtoError`:
        ``{"round_idx": int, "state": str, "phase": str}`` (the state's name), for
        ``raise RemoteProtocolError(message, party=sender, **self.error_context())``."""
        return {"round_idx": self.round_idx, "state": self._state.name, "phase": self.phase}

    def insufficient(self, message: str, missing: Sequence[str]) -> InsufficientParticipants:
        """The :class:`~fedproto.errors.InsufficientParticipants` error of this machine, which
        cannot go on without the parties ``missing`` (its ``party`` when there is one only), with
        :meth:`error_context`: ``raise self.insufficient(message, missing)``."""
        return InsufficientParticipants(
            message, missing=tuple(missing), party=missing[0] if len(missing) == 1 else None, **self.error_context()
        )

    def send(self, dest: str, message: Message, *, phase: str | None = None) -> Send:
        """A :class:`Send` stamped with the current round and ``phase`` (default: :attr:`phase`)."""
        return Send(dest, message, self.round_idx, phase or self.phase)

    def broadcast(self, dests: Iterable[str], message: Message, *, phase: str | None = None) -> Broadcast:
        """A :class:`Broadcast` stamped with the current round and ``phase``."""
        return Broadcast(tuple(dests), message, self.round_idx, phase or self.phase)

    def _finish(self, result: Any) -> None:
        """Record the result and move to ``DONE``."""
        self._result = result
        self._state = self.State.DONE

    def _start(self) -> list[Outgoing]:
        return []

    def _ignores(self, sender: str) -> bool:
        """True to drop ``sender``'s messages unread, before the state and round checks.

        A role that carries on without parties it counted as dropped (a quorum rule) overrides
        this, so a dropped party's late frame, stamped with a round that has since passed, is
        not a protocol error. The default ignores no one.
        """
        return False

    def _advance(self) -> list[Outgoing]:
        return []

    def _on_event(self, event: Event) -> list[Outgoing]:
        if isinstance(event, PhaseTimedOut):
            missing = list(self.pending())
            raise self.insufficient(
                f"no progress within {event.deadline_s:g} s; still waiting for "
                f"{', '.join(missing) if missing else 'nothing'}",
                missing,
            )
        if isinstance(event, PartyDropped):
            if event.party in self.pending():
                raise self.insufficient(f"{event.party} dropped out while this machine waited for it", [event.party])
            return []
        if isinstance(event, SendFailed):
            raise ProtocolError(
                f"sending to {event.dest} failed: {describe(event.error)}", party=event.dest, **self.error_context()
            ) from event.error
        raise LocalProtocolError(f"unknown event {event!r}", party=self.party)

    # -- internals ------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._state is self.State.ERROR:
            raise LocalProtocolError(
                f"{self.party} is in ERROR after: {describe(self.error)}", party=self.party, state="ERROR"
            ) from self.error
        if self._state is self.State.DONE:
            raise LocalProtocolError("the protocol is already done", party=self.party, state="DONE")

    def _guarded(self, step: Any) -> list[Outgoing]:
        try:
            return step()
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
                raise
            self.error = exc
            self._state = self.State.ERROR
            raise


def _check_machine_class(cls: type[ProtocolMachine]) -> None:
    """Raise ``TypeError`` naming ``cls`` where its ``State``, ``INITIAL_STATE``, ``TRANSITIONS`` disagree."""
    name = cls.__qualname__
    state_enum = cls.State
    if not (isinstance(state_enum, type) and issubclass(state_enum, enum.Enum)):
        raise TypeError(f"{name}.State must be an enum.Enum subclass, got {state_enum!r}")
    absent = [member for member in ("DONE", "ERROR") if member not in state_enum.__members__]
    if absent:
        raise TypeError(f"{name}.State ({state_enum.__qualname__}) has no {' or '.join(absent)} member")
    if not isinstance(cls.INITIAL_STATE, state_enum):
        raise TypeError(f"{name}.INITIAL_STATE {cls.INITIAL_STATE!r} is not a member of {state_enum.__qualname__}")
    table = cls.TRANSITIONS
    if not isinstance(table, Mapping):
        raise TypeError(f"{name}.TRANSITIONS must be a dict, got {type(table).__name__}")
    for key, entry in table.items():
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(entry, tuple) and len(entry) == 2):
            raise TypeError(
                f"{name}.TRANSITIONS entries must be (state, message class): (handler name, next state), "
                f"got {key!r}: {entry!r}"
            )
        state, message_cls = key
        handler_name, next_state = entry
        if not isinstance(state, state_enum):
            raise TypeError(f"{name}.TRANSITIONS key state {state!r} is not a member of {state_enum.__qualname__}")
        if not (isinstance(message_cls, type) and issubclass(message_cls, Message)):
            raise TypeError(
                f"{name}.TRANSITIONS key {message_cls!r} (in state {state.name}) is not a Message subclass"
            )
        where = f"({state.name}, {message_cls.__name__})"
        if not (isinstance(handler_name, str) and callable(getattr(cls, handler_name, None))):
            raise TypeError(
                f"{name}.TRANSITIONS names handler {handler_name!r} for {where}, but {name} has no such method"
            )
        if not isinstance(next_state, state_enum):
            raise TypeError(
                f"{name}.TRANSITIONS next state {next_state!r} for {where} is not a member of {state_enum.__qualname__}"
            )

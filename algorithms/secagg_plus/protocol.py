"""Secure summation with SecAgg+ as a protocol: one vector per client per round, dropouts survived.

The smallest protocol built on the stage engines (:mod:`fedproto.algorithms.secagg_plus.engine`),
and the pattern the clustering protocols follow when they embed them:

* the keys are agreed once, in round 0 (stage ``advertise-keys``); round r (``r = 0 .. rounds-1``)
  is one aggregation: its two stages (``masked-input``, ``unmask``), then the server sends every
  client that sent its input the sum (:class:`SumResult`, phase ``result``), and each client
  sends its next masked input at once;
* a client that goes silent (the phase deadline passes, or the transport reports it gone) is
  dropped at the stage it did not complete; its input is in the round's sum only if it sent it
  before dropping, and it takes no part in later rounds;
* the server's result records, per round, the sum, the clients whose inputs it holds and who
  dropped at which stage.

Every client needs the same :class:`~fedproto.algorithms.secagg_plus.engine.SecAggPlusConfig`;
the set-up's instance bytes (the keys' context) are ``purpose || session || round of the set-up``.

A protocol machine embeds the engines by mixing in :class:`SecAggPlusClientRole` (a client's
replies) or :class:`SecAggPlusServerRole` (a server's stage messages, and the dropout rule
above: who is gone, who dropped at which stage); :class:`SumServer` and :class:`SumClient` add
only the delivery of the sum, FastLloyd's and MUFC's roles their own phases around it.

References:
    Bonawitz et al., ACM CCS 2017, Fig. 4; Bell et al., ACM CCS 2020, Sec. 3.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from fedproto.algorithms.secagg_plus.messages import STAGES, TO_CLIENT, TO_SERVER, NeighbourKeys, Remask, UnmaskRequest
from fedproto.errors import RemoteProtocolError
from fedproto.machine import ProtocolMachine, machine_states, party_index
from fedproto.messages import Event, Message, Outgoing, PartyDropped, PhaseTimedOut, array_field

if TYPE_CHECKING:
    from fedproto.algorithms.secagg_plus.engine import SecAggPlusClient, SecAggPlusConfig, SecAggPlusServer, SumOutcome

# The engine (with SCMA's field arithmetic and FLINT) is imported where an aggregation starts, not
# here: a protocol that mixes in SecAggPlusClientRole but runs without SecAgg+ never loads it.

__all__ = [
    "SecAggPlusClientRole",
    "SecAggPlusServerRole",
    "SumClient",
    "SumClientResult",
    "SumResult",
    "SumServer",
    "SumServerResult",
    "instance_bytes",
    "server_transitions",
]


def instance_bytes(session: int, round_idx: int, purpose: bytes = b"sum") -> bytes:
    """The public bytes naming a run's SecAgg+ set-up: ``purpose || session || round`` (the round
    of the set-up; the keys are derived from them, and each aggregation's masks from the keys and
    its own round)."""
    return bytes(purpose) + b"/" + session.to_bytes(8, "big") + round_idx.to_bytes(8, "big")


class SumResult(Message, tag="sa.sum"):
    """The round's sum, in the wire form of
    :meth:`~fedproto.algorithms.secagg_plus.engine.Modulus.to_wire`, and how many inputs it
    holds (server -> each client whose input is in it)."""

    total: np.ndarray = array_field(("uint8", "uint32", "uint64"), 2)
    n_inputs: int

    def __post_init__(self) -> None:
        if not isinstance(self.n_inputs, int) or isinstance(self.n_inputs, bool) or self.n_inputs < 1:
            raise ValueError("n_inputs must be a positive int")


@dataclasses.dataclass(frozen=True)
class SumServerResult:
    """What the server learned.

    Attributes:
        totals: per round, the sum ``[L]`` of the survivors' inputs (dtype of the algebra).
        survivors: per round, the clients whose inputs are in the sum.
        dropouts: ``{client: (round, stage)}``: when each dropped client dropped.
    """

    totals: tuple[np.ndarray, ...]
    survivors: tuple[tuple[str, ...], ...]
    dropouts: dict[str, tuple[int, str]]


@dataclasses.dataclass(frozen=True)
class SumClientResult:
    """A client's output: the sums of the rounds it completed, ``[rounds, L]``."""

    totals: tuple[np.ndarray, ...]


def server_transitions(state: enum.Enum, handler: str = "_on_stage") -> dict[tuple[enum.Enum, type[Message]], tuple[str, enum.Enum]]:
    """The ``TRANSITIONS`` entries of a server machine that runs SecAgg+ aggregations in ``state``.

    Each stage's client message (:data:`~fedproto.algorithms.secagg_plus.messages.TO_SERVER`) goes
    to ``handler`` (a method that hands it to the round's
    :class:`~fedproto.algorithms.secagg_plus.engine.SecAggPlusServer`), and the machine stays in
    ``state``. Spread them into the machine's table::

        TRANSITIONS = {..., **server_transitions(State.COLLECT)}
    """
    return {(state, message): (handler, state) for message in TO_SERVER}


SumServerState = machine_states("SumServerState", "AGGREGATING")


SumClientState = machine_states("SumClientState", "AGGREGATING")


class SecAggPlusClientRole:
    """The client side of embedded SecAgg+ aggregations, for a :class:`ProtocolMachine` subclass.

    Mix it into a client role (``class MyClient(SecAggPlusClientRole, ProtocolMachine)``), put
    :meth:`secagg_transitions` in its transition table for the states where it aggregates, call
    :meth:`_open_aggregation` when a round's aggregation starts and send what it returns, and
    implement :meth:`_secagg_input`: the vector this client contributes, asked for once per round
    when the masked input is due. The first call sets up the run's keys (``advertise-keys``); later
    rounds send their masked input at once. The role needs the machine's ``server`` (party name),
    ``session`` and ``round_idx``, and keeps the run's engine in ``_aggregation``; its
    :meth:`_check_server` serves the machine's own handlers too.
    """

    server: str
    _aggregation: SecAggPlusClient | None = None
    _secagg_values: object = None  # the running aggregation's input, kept in case it is masked again
    _HANDLERS = ("_on_neighbour_keys", "_on_unmask_request", "_on_remask")  # TO_CLIENT's, in order

    @classmethod
    def secagg_transitions(cls, state: enum.Enum) -> dict[tuple[enum.Enum, type[Message]], tuple[str, enum.Enum]]:
        """The role's ``TRANSITIONS`` entries for a state where the client aggregates: each
        server reply of :data:`~fedproto.algorithms.secagg_plus.messages.TO_CLIENT` to its
        handler, staying in ``state``. Spread them into the machine's table::

            TRANSITIONS = {..., **SecAggPlusClientRole.secagg_transitions(State.ITERATING)}
        """
        return {(state, message): (handler, state) for message, handler in zip(TO_CLIENT, cls._HANDLERS, strict=True)}

    def _open_aggregation(
        self, config: SecAggPlusConfig, index: int, *, entropy: bytes, purpose: bytes = b"sum"
    ) -> Outgoing:
        """Start this round's aggregation as client ``index``; return the message to send: the
        first time, the set-up's public key (the engine is named ``instance_bytes(session,
        round_idx, purpose)``, as the server role names its engine); later, the masked input."""
        if self._aggregation is None:
            from fedproto.algorithms.secagg_plus.engine import SecAggPlusClient

            instance = instance_bytes(self.session, self.round_idx, purpose)  # type: ignore[attr-defined]
            self._aggregation = SecAggPlusClient(config, index, entropy=entropy, instance=instance)
            return self.send(self.server, self._aggregation.advertise(), phase=STAGES[0])  # type: ignore[attr-defined]
        return self._send_masked_input(self._aggregation)

    def _send_masked_input(self, aggregation: SecAggPlusClient) -> Outgoing:
        self._secagg_values = self._secagg_input()
        masked = aggregation.mask_input(self._secagg_values, round_idx=self.round_idx)  # type: ignore[attr-defined]
        return self.send(self.server, masked, phase=STAGES[1])  # type: ignore[attr-defined]

    def _secagg_input(self) -> object:
        """The vector this client sums in the running aggregation (``[L]`` in the algebra)."""
        raise NotImplementedError

    def _check_server(self, sender: str) -> None:
        """Refuse a message that does not come from the machine's ``server``: a client of a star
        protocol hears from the server only, in its SecAgg+ stages and in its own phases alike.

        Raises:
            RemoteProtocolError: naming ``sender``, with the machine's round and state.
        """
        if sender != self.server:
            raise RemoteProtocolError(
                f"{sender} is not the server", party=sender, round_idx=self.round_idx, state=self._state.name  # type: ignore[attr-defined]
            )

    def _stage(self, sender: str) -> SecAggPlusClient:
        self._check_server(sender)
        if self._aggregation is None:
            raise RemoteProtocolError("a SecAgg+ message outside a SecAgg+ aggregation", party=sender)
        return self._aggregation

    def _on_neighbour_keys(self, sender: str, message: NeighbourKeys) -> list[Outgoing]:
        aggregation = self._stage(sender)
        aggregation.receive_keys(sender, message)
        return [self._send_masked_input(aggregation)]

    def _on_unmask_request(self, sender: str, message: UnmaskRequest) -> list[Outgoing]:
        shares = self._stage(sender).unmask(sender, message)
        return [self.send(self.server, shares, phase=STAGES[2])]  # type: ignore[attr-defined]

    def _on_remask(self, sender: str, message: Remask) -> list[Outgoing]:
        masked = self._stage(sender).remask(sender, message, self._secagg_values)
        return [self.send(self.server, masked, phase=STAGES[1])]  # type: ignore[attr-defined]


class SecAggPlusServerRole:
    """The server side of embedded SecAgg+ aggregations, for a :class:`ProtocolMachine` subclass.

    Mix it into a server role (``class MyServer(SecAggPlusServerRole, ProtocolMachine)``), put
    :func:`server_transitions` of :attr:`SECAGG_STATE` in its transition table, keep the running
    :class:`~fedproto.algorithms.secagg_plus.engine.SecAggPlusServer` in ``_aggregation`` (built
    with :meth:`_secagg_server`; ``None`` where the run does not aggregate with SecAgg+) and
    implement :meth:`_aggregated`: what the machine does with a round's sum. The role owns the
    dropout rule of Bell et al. (ACM CCS 2020, Sec. 3), the same for every protocol that embeds
    SecAgg+: while it aggregates, a client that goes silent past the phase deadline, or that the
    transport reports gone, is dropped from the running aggregation, counted in ``_gone`` (its
    late frames are ignored, and later rounds' aggregations start without it) and, once the sum
    is in, recorded in ``_dropouts`` as ``{client: (round_idx, stage)}``.

    The role needs the machine's ``clients`` (party names, in client-index order), ``session``
    (in the instance bytes), ``round_idx``, state and :meth:`pending`; the machine's constructor
    sets ``_gone = set()`` and ``_dropouts = {}``.
    """

    #: The state in which the machine aggregates with SecAgg+.
    SECAGG_STATE: ClassVar[enum.Enum]
    clients: tuple[str, ...]
    session: int
    _aggregation: SecAggPlusServer | None = None
    _gone: set[str]
    _dropouts: dict[str, tuple[int, str]]

    def _secagg_server(self, config: SecAggPlusConfig, purpose: bytes, active: Iterable[str]) -> SecAggPlusServer:
        """The run's SecAgg+ server engine, at this round's aggregation among ``active`` (the
        other clients left the federation earlier: absent, not dropouts). The first call creates
        it with the set-up, named ``instance_bytes(session, round_idx, purpose)``; later calls
        move it on to the machine's round (:meth:`SecAggPlusServer.begin`)."""
        from fedproto.algorithms.secagg_plus.engine import SecAggPlusServer

        engine = self._aggregation
        if engine is None:
            return SecAggPlusServer(
                config,
                self.clients,
                round_idx=self.round_idx,  # type: ignore[attr-defined]
                instance=instance_bytes(self.session, self.round_idx, purpose),  # type: ignore[attr-defined]
                active=active,
            )
        engine.begin(self.round_idx, active)  # type: ignore[attr-defined]
        return engine

    def _aggregating(self) -> bool:
        """True while a SecAgg+ aggregation runs."""
        return self._aggregation is not None and self._state is self.SECAGG_STATE  # type: ignore[attr-defined]

    def _ignores(self, sender: str) -> bool:
        return sender in self._gone

    def carries_on_without(self, party: str) -> bool:
        """While it aggregates with SecAgg+, a client's failure notice is that client's dropout."""
        return self._aggregating() and party in party_index(self.clients)

    def _may_drop(self, party: str) -> bool:
        """Whether a client reported gone drops from the running aggregation (else the report is
        ignored): any client not already gone."""
        return party in party_index(self.clients) and party not in self._gone

    def _on_event(self, event: Event) -> list[Outgoing]:
        if self._aggregating():
            if isinstance(event, PhaseTimedOut):
                silent = list(self.pending())  # type: ignore[attr-defined]
                if silent:
                    self._gone.update(silent)
                    return self._drop(silent)
            elif isinstance(event, PartyDropped):
                if self._may_drop(event.party):
                    self._gone.add(event.party)
                    return self._drop([event.party])
                return []
        return super()._on_event(event)  # type: ignore[misc]

    def _drop(self, parties: Sequence[str]) -> list[Outgoing]:
        """Drop ``parties`` (already counted in ``_gone``) from the running aggregation."""
        assert self._aggregation is not None
        return self._after_stage(self._aggregation.drop(parties))

    def _on_stage(self, sender: str, message: Message) -> list[Outgoing]:
        if self._aggregation is None:
            raise RemoteProtocolError(
                f"a SecAgg+ message from {sender} in a run without SecAgg+", party=sender, **self.error_context()  # type: ignore[attr-defined]
            )
        return self._after_stage(self._aggregation.receive(sender, message))

    def _after_stage(self, out: list[Outgoing]) -> list[Outgoing]:
        """``out``, and once the running aggregation has its sum: the clients that dropped in it
        recorded (gone, and in ``_dropouts``), then what :meth:`_aggregated` sends."""
        aggregation = self._aggregation
        assert aggregation is not None
        outcome = aggregation.outcome
        if outcome is None:
            return out
        for party, stage in outcome.dropouts.items():
            self._dropouts[party] = (self.round_idx, stage)  # type: ignore[attr-defined]
            self._gone.add(party)
        return out + self._aggregated(outcome)

    def _aggregated(self, outcome: SumOutcome) -> list[Outgoing]:
        """Take the running aggregation's sum (its dropouts already recorded); return what to send."""
        raise NotImplementedError

    def _still_in(self, outcome: SumOutcome) -> tuple[str, ...]:
        """The clients whose inputs are in ``outcome``'s sum and that are not gone, in client
        order: those to send the result to and to aggregate with next round. A client that
        dropped at the unmask stage is a survivor (its input is in the sum) but gone."""
        return tuple(c for c in outcome.survivors if c not in self._gone)


class SumServer(SecAggPlusServerRole, ProtocolMachine):
    """The summation server (sans-IO).

    Args:
        party: the server's party name.
        config: the public parameters (``config.n_clients == len(clients)``).
        clients: the client party names, in client-index order.
        rounds: aggregations to run (>= 1).
        session: the run's session id (in the instance bytes). It must be the run's,
            ``RuntimeConfig.session`` (default 0, which is a run's only when the run is session 0):
            the runtime, ``simulate`` and the harness raise
            :class:`~fedproto.errors.SessionMismatch` naming this party before any frame otherwise.

    Raises:
        ValueError: ``rounds < 1`` or a client list that does not fit ``config``.
    """

    State = SumServerState
    INITIAL_STATE = SumServerState.AGGREGATING
    SECAGG_STATE = SumServerState.AGGREGATING
    TRANSITIONS = server_transitions(SumServerState.AGGREGATING)

    def __init__(
        self, party: str, *, config: SecAggPlusConfig, clients: Sequence[str], rounds: int, session: int = 0
    ) -> None:
        super().__init__(party)
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        self.config = config
        self.clients = tuple(clients)
        self.rounds = rounds
        self.session = session
        self._gone: set[str] = set()
        self._totals: list[np.ndarray] = []
        self._survivors: list[tuple[str, ...]] = []
        self._dropouts: dict[str, tuple[int, str]] = {}
        self._active = self.clients
        self._aggregation = self._secagg_server(config, b"sum", self._active)

    @property
    def phase(self) -> str:
        return self._aggregation.stage if self._state is SumServerState.AGGREGATING else self._state.name.lower()

    def pending(self) -> Sequence[str]:
        return self._aggregation.pending() if self._state is SumServerState.AGGREGATING else ()

    def _aggregated(self, outcome: SumOutcome) -> list[Outgoing]:
        self._totals.append(outcome.total)
        self._survivors.append(outcome.survivors)
        modulus = self.config.modulus
        receivers = self._still_in(outcome)
        out = [
            self.broadcast(
                receivers,
                SumResult(total=modulus.to_wire(outcome.total), n_inputs=len(outcome.survivors)),
                phase="result",
            )
        ]
        self._active = receivers
        self.round_idx += 1
        if self.round_idx == self.rounds:
            self._finish(SumServerResult(tuple(self._totals), tuple(self._survivors), dict(self._dropouts)))
        else:
            self._aggregation = self._secagg_server(self.config, b"sum", self._active)
            out += self._aggregation.drop(self._gone)
        return out


class SumClient(SecAggPlusClientRole, ProtocolMachine):
    """A summation client (sans-IO).

    Args:
        party: this client's party name.
        config: the public parameters.
        server: the server's party name.
        clients: every client's party name, in client-index order (this one included).
        inputs: this client's input per round, ``[rounds, L]`` integers in the algebra.
        entropy: at least 32 secret random bytes (keys and masks of every round derive from it).
        session: the run's session id. It must be the run's, ``RuntimeConfig.session`` (default 0,
            which is a run's only when the run is session 0): the runtime, ``simulate`` and the
            harness raise :class:`~fedproto.errors.SessionMismatch` naming this party before any
            frame otherwise.

    Raises:
        ValueError: ``party`` not in ``clients``, inputs of the wrong shape or outside the
            algebra, or short entropy.
    """

    State = SumClientState
    DEADLINE_FACTOR = 2.0
    INITIAL_STATE = SumClientState.AGGREGATING
    TRANSITIONS = {
        **SecAggPlusClientRole.secagg_transitions(SumClientState.AGGREGATING),
        (SumClientState.AGGREGATING, SumResult): ("_on_result", SumClientState.AGGREGATING),
    }

    def __init__(
        self,
        party: str,
        *,
        config: SecAggPlusConfig,
        server: str,
        clients: Sequence[str],
        inputs: Sequence[object],
        entropy: bytes,
        session: int = 0,
    ) -> None:
        super().__init__(party)
        clients = tuple(clients)
        if party not in clients:
            raise ValueError(f"{party!r} is not in the client list")
        self.config = config
        self.server = server
        self.index = clients.index(party)
        self.session = session
        self._inputs = [config.modulus.vector(x, config.vector_length) for x in inputs]
        if not self._inputs:
            raise ValueError("inputs must hold at least one round")
        self._entropy = bytes(entropy)
        self._totals: list[np.ndarray] = []

    def _open(self) -> Outgoing:
        return self._open_aggregation(self.config, self.index, entropy=self._entropy)

    def _secagg_input(self) -> object:
        return self._inputs[self.round_idx]

    @property
    def phase(self) -> str:
        if self._state is SumClientState.AGGREGATING and self._aggregation is not None:
            return self._aggregation.stage
        return self._state.name.lower()

    def pending(self) -> Sequence[str]:
        return () if self.done or self.failed else (self.server,)

    def _start(self) -> list[Outgoing]:
        return [self._open()]

    def _on_result(self, sender: str, message: SumResult) -> list[Outgoing]:
        if self._stage(sender).stage != "done":
            raise RemoteProtocolError("a sum before this client revealed its shares", party=sender)
        try:
            total = self.config.modulus.from_wire(np.asarray(message.total), self.config.vector_length)
        except ValueError as exc:
            raise RemoteProtocolError(f"the sum: {exc}", party=sender) from None
        self._totals.append(total)
        self.round_idx += 1
        if self.round_idx == len(self._inputs):
            self._finish(SumClientResult(tuple(self._totals)))
            return []
        return [self._open()]

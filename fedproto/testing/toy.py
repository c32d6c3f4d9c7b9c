"""A minimal round-based protocol for tests and benchmarks: federated sum.

Roles: one :class:`SumCoordinator` and several :class:`SumWorker` s. Each round the coordinator
broadcasts :class:`Query` ``(round)``; every worker answers :class:`Contribution` with its vector
times ``round_idx + 1``; once all answers are in (or, after a deadline, at least
``min_responses``), the coordinator sums them and starts the next round. After ``rounds`` rounds
it broadcasts :class:`Finished` and returns the per-round sums. Small enough to read at a glance,
complete enough to exercise tables, round checks, quorums, deadlines and metering.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

import numpy as np

from fedproto.errors import InsufficientParticipants, RemoteProtocolError
from fedproto.machine import ProtocolMachine
from fedproto.messages import Event, Message, Outgoing, PhaseTimedOut, array_field

__all__ = ["Query", "Contribution", "Finished", "SumCoordinator", "SumWorker", "sum_machines", "expected_sums"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Query(Message):
    """Coordinator -> worker: please contribute to this round."""

    TAG = "toy.query"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Contribution(Message):
    """Worker -> coordinator: a float64 vector."""

    TAG = "toy.contrib"
    values: np.ndarray = array_field("float64", 1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Finished(Message):
    """Coordinator -> worker: the protocol is over."""

    TAG = "toy.done"


class CoordinatorState(enum.Enum):
    COLLECT = enum.auto()
    DONE = enum.auto()
    ERROR = enum.auto()


class WorkerState(enum.Enum):
    READY = enum.auto()
    DONE = enum.auto()
    ERROR = enum.auto()


class SumCoordinator(ProtocolMachine):
    """Sums the workers' vectors for ``rounds`` rounds.

    Args:
        party: the coordinator's name.
        workers: the workers' names.
        rounds: number of rounds.
        dim: length of the vectors.
        min_responses: quorum accepted after a deadline (default: every worker).
    """

    State = CoordinatorState
    INITIAL_STATE = CoordinatorState.COLLECT
    TRANSITIONS = {(CoordinatorState.COLLECT, Contribution): ("_on_contribution", CoordinatorState.COLLECT)}

    def __init__(self, party: str, *, workers: Sequence[str], rounds: int, dim: int, min_responses: int | None = None):
        super().__init__(party)
        self.workers = tuple(workers)
        if not self.workers or rounds < 1 or dim < 0:
            raise ValueError("need workers, rounds >= 1 and dim >= 0")
        self.rounds = rounds
        self.dim = dim
        self.min_responses = len(self.workers) if min_responses is None else min_responses
        if not 1 <= self.min_responses <= len(self.workers):
            raise ValueError("min_responses must be between 1 and the number of workers")
        self._active = list(self.workers)
        self._received: dict[str, np.ndarray] = {}
        self._sums: list[np.ndarray] = []

    def pending(self) -> Sequence[str]:
        return [w for w in self._active if w not in self._received] if self._state is CoordinatorState.COLLECT else []

    def _start(self) -> list[Outgoing]:
        return [self.broadcast(self._active, Query(), phase="query")]

    def _on_contribution(self, sender: str, message: Contribution) -> list[Outgoing]:
        if sender not in self._active:
            raise RemoteProtocolError(f"{sender} is not an active worker", party=sender, round_idx=self.round_idx)
        if sender in self._received:
            raise RemoteProtocolError(f"duplicate contribution from {sender}", party=sender, round_idx=self.round_idx)
        if message.values.shape != (self.dim,):
            raise RemoteProtocolError(f"contribution of shape {message.values.shape}", party=sender)
        self._received[sender] = message.values
        return []

    def _on_event(self, event: Event) -> list[Outgoing]:
        if isinstance(event, PhaseTimedOut) and len(self._received) >= self.min_responses:
            self._active = [w for w in self._active if w in self._received]  # drop the silent ones
            return []
        if isinstance(event, PhaseTimedOut):
            missing = list(self.pending())
            raise InsufficientParticipants(
                f"{len(self._received)} of {len(self._active)} workers answered, {self.min_responses} needed; "
                f"silent: {', '.join(missing)}",
                missing=missing,
                party=missing[0] if len(missing) == 1 else None,
                round_idx=self.round_idx,
                state=self._state.name,
                phase=self.phase,
            )
        return super()._on_event(event)

    def _advance(self) -> list[Outgoing]:
        if self._state is not CoordinatorState.COLLECT or set(self._received) != set(self._active):
            return []
        total = np.zeros(self.dim)
        for w in self._active:
            total = total + self._received[w]
        self._sums.append(total)
        self._received = {}
        self.round_idx += 1
        if self.round_idx == self.rounds:
            out = self.broadcast(self._active, Finished(), phase="finish")
            self._finish(np.stack(self._sums))
            return [out]
        return [self.broadcast(self._active, Query(), phase="query")]


class SumWorker(ProtocolMachine):
    """Answers every :class:`Query` with ``values * (round_idx + 1)``."""

    State = WorkerState
    DEADLINE_FACTOR = 2.0
    INITIAL_STATE = WorkerState.READY
    TRANSITIONS = {
        (WorkerState.READY, Query): ("_on_query", WorkerState.READY),
        (WorkerState.READY, Finished): ("_on_finished", WorkerState.DONE),
    }

    def __init__(self, party: str, *, coordinator: str, values: np.ndarray):
        super().__init__(party)
        self.coordinator = coordinator
        self.values = np.asarray(values, dtype=np.float64)

    def pending(self) -> Sequence[str]:
        return [self.coordinator] if self._state is WorkerState.READY else []

    def _on_query(self, sender: str, message: Query) -> list[Outgoing]:
        if sender != self.coordinator:
            raise RemoteProtocolError(f"{sender} is not the coordinator", party=sender)
        out = self.send(self.coordinator, Contribution(values=self.values * (self.round_idx + 1)), phase="answer")
        self.round_idx += 1
        return [out]

    def _on_finished(self, sender: str, message: Finished) -> list[Outgoing]:
        self._finish(self.round_idx)
        return []


def sum_machines(
    workers: Sequence[str] = ("w0", "w1"), *, rounds: int = 3, dim: int = 3, coordinator: str = "c", **kwargs: int
) -> dict[str, ProtocolMachine]:
    """A whole federation of the toy sum, coordinator first: worker ``i`` holds ``arange(dim) + i``.

    Args:
        workers: the workers' names, in order.
        rounds: the coordinator's number of rounds.
        dim: the length of the vectors.
        coordinator: the coordinator's name.
        **kwargs: passed on to :class:`SumCoordinator` (``min_responses``).

    Returns:
        ``{party: machine}``, not started; :func:`expected_sums` is what the coordinator returns.
    """
    machines: dict[str, ProtocolMachine] = {
        coordinator: SumCoordinator(coordinator, workers=list(workers), rounds=rounds, dim=dim, **kwargs)
    }
    for i, worker in enumerate(workers):
        machines[worker] = SumWorker(worker, coordinator=coordinator, values=np.arange(dim) + i)
    return machines


def expected_sums(n_workers: int = 2, *, rounds: int = 3, dim: int = 3) -> np.ndarray:
    """The coordinator's result of a complete :func:`sum_machines` run: ``[rounds, dim]`` float64.

    Round ``r`` (0-based) sums every worker's ``(arange(dim) + i) * (r + 1)``.
    """
    total = sum(np.arange(dim, dtype=np.float64) + i for i in range(n_workers))
    return np.stack([total * (r + 1) for r in range(rounds)])

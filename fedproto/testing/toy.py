"""A minimal round-based protocol for tests and benchmarks: federated sum.

Roles: one :class:`SumCoordinator` and several :class:`SumWorker` s. Each round the coordinator
broadcasts :class:`Query` ``(round)``; every worker answers :class:`Contribution` with its vector
times ``round_idx + 1``; once all answers are in (or, after a deadline, at least
``min_responses``), the coordinator sums them and starts the next round. After ``rounds`` rounds
it broadcasts :class:`Finished` and returns the per-round sums. Small enough to read at a glance,
complete enough to exercise tables, round checks, quorums, deadlines and metering.
:class:`SumPlugin` is the same protocol as a command-line plugin without data, to test the command
line, launchers and engines with (subclass it to make a party misbehave).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedproto.errors import RemoteProtocolError
from fedproto.machine import ProtocolMachine, machine_states
from fedproto.messages import Event, Message, Outgoing, PhaseTimedOut, array_field

__all__ = ["Query", "Contribution", "Finished", "SumCoordinator", "SumWorker", "SumPlugin", "sum_machines", "expected_sums"]


class Query(Message, tag="toy.query"):
    """Coordinator -> worker: please contribute to this round."""



class Contribution(Message, tag="toy.contrib"):
    """Worker -> coordinator: a float64 vector."""

    values: np.ndarray = array_field("float64", 1)


class Finished(Message, tag="toy.done"):
    """Coordinator -> worker: the protocol is over."""



CoordinatorState = machine_states("CoordinatorState", "COLLECT")


WorkerState = machine_states("WorkerState", "READY")


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
            raise self.insufficient(
                f"{len(self._received)} of {len(self._active)} workers answered, {self.min_responses} needed; "
                f"silent: {', '.join(missing)}",
                missing,
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


class SumPlugin:
    """The toy sum as a protocol plugin without data (``fedproto run FILE``, ``PROTOCOL = ...``).

    The roster is ``coordinator`` and ``worker-<i>`` for ``i < --clients``; worker ``i`` holds
    ``full(dim, i + 1.0)``; the coordinator sums for ``--rounds`` rounds. A subclass sets the
    class attributes and overrides the hooks it needs: :meth:`add_options` (its own options, in
    the plugin's group after ``--rounds``), :meth:`make_machine` (or :meth:`coordinator` and
    :meth:`worker`), :meth:`result_to_json`, :meth:`summarize` and :meth:`plan_fields` (more
    :class:`fedproto.plugin.RunPlan` fields: labels, phases, dropout stages).

    Attributes:
        name, description: the plugin's name and one-line description.
        rounds, rounds_help: the default and the help text of ``--rounds``.
        dim: the length of the vectors.
        session: the run's session (see :meth:`session_of`).
    """

    name = "toy-sum"
    description = "the toy federated sum of fedproto.testing.toy"
    needs_data = False
    rounds = 3
    rounds_help: str | None = None
    dim = 3
    session = 1

    def add_arguments(self, parser: Any) -> None:
        group = parser.add_argument_group(self.name)
        group.add_argument("--rounds", type=int, default=self.rounds, help=self.rounds_help)
        self.add_options(group)

    def add_options(self, group: Any) -> None:
        """Add the subclass's own options to the plugin's argument group (none here)."""

    def session_of(self, args: Any) -> int:
        """The run's session (default: :attr:`session`)."""
        return self.session

    def make_machine(self, args: Any, workers: tuple[str, ...], party: str) -> ProtocolMachine:
        """``party``'s machine: :meth:`coordinator` for ``coordinator``, else :meth:`worker`."""
        return self.coordinator(args, workers) if party == "coordinator" else self.worker(args, workers, party)

    def coordinator(self, args: Any, workers: tuple[str, ...]) -> ProtocolMachine:
        return SumCoordinator("coordinator", workers=workers, rounds=args.rounds, dim=self.dim)

    def worker(self, args: Any, workers: tuple[str, ...], party: str) -> ProtocolMachine:
        return SumWorker(party, coordinator="coordinator", values=self.values(workers, party))

    def values(self, workers: tuple[str, ...], party: str) -> np.ndarray:
        """Worker ``i``'s vector: ``full(dim, i + 1.0)``."""
        return np.full(self.dim, workers.index(party) + 1.0)

    def result_to_json(self, party: str, result: Any) -> Any:
        return {"result": np.asarray(result).tolist()}

    def summarize(self, args: Any, workers: tuple[str, ...], results: dict[str, Any]) -> dict[str, Any]:
        return {"last_sum": results["coordinator"]["result"][-1][0]}

    def plan_fields(self, args: Any) -> dict[str, Any]:
        """More :class:`fedproto.plugin.RunPlan` fields (none here)."""
        return {}

    def plan(self, args: Any, dataset: Any) -> Any:
        from fedproto.plugin import RunPlan

        workers = tuple(f"worker-{i}" for i in range(args.clients))
        return RunPlan(
            roster=("coordinator", *workers), session=self.session_of(args),
            make_machine=lambda party: self.make_machine(args, workers, party),
            result_to_json=self.result_to_json, summarize=lambda results: self.summarize(args, workers, results),
            role_of=lambda party: party.split("-")[0], iterations=args.rounds, **self.plan_fields(args),
        )

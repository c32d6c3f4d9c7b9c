"""What the roles of the deletion protocols share: the stream check, the remote error, the
serving party's patience, the coordinating party's side of the setup phase, and the
data-holding client of Q-k-means (curated or federated).

`fedproto.algorithms.deletion.roles` (DC-k-means, Q-k-means with a data curator) and
`fedproto.algorithms.deletion.federated` (federated Q-k-means) build their roles on these; the
theory of operation is in `fedproto.algorithms.deletion.protocol` and
`fedproto.algorithms.deletion.federated`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedproto.algorithms.deletion.local_data import SETUP_PHASE, DataCollector, LocalPoints, StreamTerms
from fedproto.algorithms.deletion.messages import DataAgreement, DataSummary, ModelUpdate
from fedproto.errors import RemoteProtocolError
from fedproto.machine import ProtocolMachine
from fedproto.messages import Event, Message, Outgoing, PhaseTimedOut

__all__ = ["FollowsRounds", "SetupHub", "StreamClient", "check_stream", "remote_error"]


def check_stream(deletions: Sequence[int], known: Mapping[int, Any] | set[int], n: int, k: int) -> tuple[int, ...]:
    """Validate a deletion stream against the ids held.

    Args:
        deletions: the point ids to delete, in order.
        known: the ids held (a set, or a mapping keyed by id).
        n: how many points are held; k: clusters (at least k points must remain).

    Returns:
        The stream as a tuple of ints.

    Raises:
        ValueError: an id is not held, an id repeats, or fewer than k points would remain.
    """
    stream = tuple(int(i) for i in deletions)
    unknown = [i for i in stream if i not in known]
    if unknown:
        raise ValueError(f"deletion requests for unknown point ids {unknown[:5]}")
    if len(set(stream)) != len(stream):
        raise ValueError("the deletion stream repeats a point id")
    if n - len(stream) < k:
        raise ValueError(f"{len(stream)} deletions would leave {n - len(stream)} points, fewer than k = {k}")
    return stream


def remote_error(message: str, sender: str, machine: ProtocolMachine) -> RemoteProtocolError:
    """The :class:`~fedproto.errors.RemoteProtocolError` for ``sender``'s bad input to
    ``machine``, naming ``machine``'s round and state."""
    return RemoteProtocolError(message, party=sender, round_idx=machine.round_idx, state=machine.state.name)


class FollowsRounds(ProtocolMachine):
    """A party that serves a stream: after training it follows the rounds of its inputs forward
    (rounds it is not part of pass it by), and it waits through ``patience`` phase deadlines
    without input before it gives up.

    Raises:
        ValueError: ``patience`` below 1.
    """

    SERVING_STATES: tuple[enum.Enum, ...] = ()

    def __init__(self, party: str, *, patience: int) -> None:
        super().__init__(party)
        if patience < 1:
            raise ValueError("patience must be at least 1")
        self.patience = patience
        self._idle = 0

    def receive(self, sender: str, message: Any, *, round_idx: int | None = None) -> list[Outgoing]:
        if round_idx is not None and self._state in self.SERVING_STATES and round_idx > self.round_idx:
            self.round_idx = round_idx
        self._idle = 0
        return super().receive(sender, message, round_idx=round_idx)

    def _on_event(self, event: Event) -> list[Outgoing]:
        if isinstance(event, PhaseTimedOut) and self._state in self.SERVING_STATES and not self.pending():
            self._idle += 1
            if self._idle < self.patience:
                return []
        return super()._on_event(event)


class SetupHub(ProtocolMachine):
    """A party that coordinates the setup phase ``setup.data`` (the DC-k-means root, the curated
    Q-k-means server, the federated coordinator) with the `local_data.DataCollector` it keeps in
    ``_setup`` (``None`` when the parties were given their data).

    Subclasses set ``_setup`` in ``__init__`` and route ``DataSummary`` in their ``SETUP`` state
    to :meth:`_on_summary`.
    """

    _setup: DataCollector | None

    def _on_summary(self, sender: str, message: DataSummary) -> list[Outgoing]:
        """Record a data-holding party's summary (`local_data.DataCollector.add`)."""
        assert self._setup is not None
        self._setup.add(sender, message, self)
        return []


class StreamClient(ProtocolMachine):
    """A data-holding client of Q-k-means, curated (`roles.QKMeansClient`) or federated
    (`federated.QKMeansParty`): it holds its points with their ids, or its raw local points until
    the setup phase ``setup.data`` agrees their scaling and ids (`local_data`); it asks the hub to
    delete its points at the stream positions that name them; and it follows the hub's models,
    version ``v`` after ``v`` deletions, and finishes with the last.

    Subclasses set :attr:`hub` (the server or coordinator), :attr:`n_deletions` and
    :attr:`ROLE` and :attr:`HUB_ROLE`, call :meth:`_hold` from ``__init__``, give ``State``
    ``SETUP`` and ``WAITING`` members and spread :meth:`stream_transitions` into their
    ``TRANSITIONS``; they implement :meth:`_take`, :meth:`_ready`, :meth:`_final` and
    :meth:`_request`.
    """

    #: This role and the hub's, in error texts (``"client"`` or ``"party"``; ``"server"`` or
    #: ``"coordinator"``).
    ROLE = "client"
    HUB_ROLE = "server"
    #: A client waits on its hub, whose collect deadline names the silent party: that one fires
    #: first.
    DEADLINE_FACTOR = 2.0
    hub: str
    n_deletions: int

    @staticmethod
    def stream_transitions(state: type[enum.Enum]) -> dict[tuple[enum.Enum, type[Message]], tuple[str, enum.Enum]]:
        """The ``TRANSITIONS`` entries every stream client has, for its state enum ``state``: the
        hub's ``DataAgreement`` ends the setup phase (``SETUP`` -> ``WAITING``), and a
        ``ModelUpdate`` while ``WAITING`` is followed (:meth:`_on_model`). Spread them into the
        machine's table::

            TRANSITIONS = {**StreamClient.stream_transitions(State), ...}
        """
        return {
            (state.SETUP, DataAgreement): ("_on_agreement", state.WAITING),  # type: ignore[attr-defined]
            (state.WAITING, ModelUpdate): ("_on_model", state.WAITING),  # type: ignore[attr-defined]
        }

    def _hold(
        self,
        points: np.ndarray | None,
        ids: np.ndarray | None,
        requests: Mapping[int, int] | None,
        local: LocalPoints | None,
        stream: StreamTerms | None,
    ) -> None:
        """Take ``points`` (``[n_i, d]`` float64), ``ids`` and ``requests`` (stream position ->
        id of one of these points), or keep ``local`` and ``stream`` for the setup phase (state
        ``SETUP``).

        Raises:
            ValueError: both or neither of ``points`` and ``local``; ``local`` with requests, or
                without the terms of a stream of ``n_deletions`` removals; and what :meth:`_take`
                raises.
        """
        role = self.ROLE
        if (points is None) == (local is None):
            raise ValueError(f"give a {role} either its points (and ids) or its raw local points, not both or neither")
        if local is not None and (stream is None or stream.removals != self.n_deletions or requests):
            raise ValueError(f"a {role} with raw local points draws its requests from the stream's terms")
        self._local, self._stream = local, stream
        if local is not None:
            self._state = self.State.SETUP  # type: ignore[attr-defined]
        else:
            self._take(points, ids, requests or {})  # type: ignore[arg-type]
        self._expected = 0
        self._retrained: list[bool] = []

    def _take_requests(self, held_ids: np.ndarray, requests: Mapping[int, int]) -> None:
        """Keep ``requests`` (stream position -> id), checked against the ids held.

        Raises:
            ValueError: a request for an id not held, or a position outside the stream.
        """
        self.requests = {int(pos): int(i) for pos, i in requests.items()}
        held = set(held_ids.tolist())
        if any(i not in held for i in self.requests.values()):
            raise ValueError(f"{self.party} can only request deletion of its own points")
        if any(not 0 <= pos < self.n_deletions for pos in self.requests):
            raise ValueError("request positions must lie in the stream")

    def _check_hub(self, sender: str) -> None:
        if sender != self.hub:
            raise remote_error(f"{sender} is not the {self.HUB_ROLE}", sender, self)

    def _start(self) -> list[Outgoing]:
        if self._local is not None:
            return [self.send(self.hub, self._local.summary(), phase=SETUP_PHASE)]
        return self._ready()

    def _on_agreement(self, sender: str, message: DataAgreement) -> list[Outgoing]:
        self._check_hub(sender)
        assert self._local is not None and self._stream is not None
        try:
            points, ids = self._local.agreed(message)
            requests = self._stream.requests(message.n_points, message.offset, self._local.n)
        except ValueError as exc:
            raise remote_error(f"{sender}'s data agreement does not fit {self.party}: {exc}", sender, self) from exc
        self._take(points, ids, requests)
        return self._ready()

    def _on_model(self, sender: str, message: ModelUpdate) -> list[Outgoing]:
        self._check_hub(sender)
        if message.version != self._expected:
            raise remote_error(f"model version {message.version}, expected {self._expected}", sender, self)
        if message.version:
            self._retrained.append(message.retrained)
        self._expected += 1
        if message.version == self.n_deletions:
            self._finish(self._final(message))
            return []
        self.round_idx += 1
        point_id = self.requests.get(message.version)
        if point_id is None:
            return []
        return [self._request(point_id)]

    def _take(self, points: np.ndarray, ids: np.ndarray, requests: Mapping[int, int]) -> None:
        """Hold ``points`` and ``ids`` (checked) and ``requests`` (:meth:`_take_requests`)."""
        raise NotImplementedError

    def _ready(self) -> list[Outgoing]:
        """What the client sends once it holds its points (at the start, or after the setup)."""
        raise NotImplementedError

    def _final(self, message: ModelUpdate) -> Any:
        """The client's result, given the final model."""
        raise NotImplementedError

    def _request(self, point_id: int) -> Outgoing:
        """The removal request of point ``point_id`` (held: the stream was checked)."""
        raise NotImplementedError

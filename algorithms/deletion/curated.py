"""Q-k-means as a protocol with a data curator: the server (:class:`QKMeansServer`) that holds
the uploaded points and its clients (:class:`QKMeansClient`) that own them and request deletions.

Theory of operation: `fedproto.algorithms.deletion.protocol` (Ginart et al. 2019, Alg. 4/5;
spec deletion-kmeans.md section 2.3). The federated variant, where the points stay at the
clients, is `fedproto.algorithms.deletion.federated`; the plan that builds either is
`fedproto.algorithms.deletion.protocol.QKMeansParties` (or ``LocalQKMeansParties``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from fedproto.algorithms.deletion._roles import ServingState, StreamClient, remote_error
from fedproto.algorithms.deletion._store import DeletionError, check_points
from fedproto.algorithms.deletion.local_data import SETUP_PHASE, DataCollector, LocalPoints, StreamTerms
from fedproto.algorithms.deletion.messages import (
    DataAgreement,
    DataSummary,
    ModelUpdate,
    PointUpload,
    RemovalRequest,
)
from fedproto.algorithms.deletion.qkmeans import QKMeans, QKMeansConfig
from fedproto.machine import ProtocolMachine
from fedproto.messages import Outgoing

__all__ = [
    "SERVER",
    "QClientState",
    "QKMeansClient",
    "QKMeansClientResult",
    "QKMeansServer",
    "QKMeansServerResult",
]

SERVER = "server"


@dataclasses.dataclass(frozen=True)
class QKMeansServerResult:
    """The server's output.

    Attributes:
        centroids: the final model ``[k, d]``.
        history: the model after training and after each deletion.
        reasons: per deletion, ``"certified"`` or why it retrained.
        certified, retrained: counts.
    """

    centroids: np.ndarray
    history: tuple[np.ndarray, ...]
    reasons: tuple[str, ...]
    certified: int
    retrained: int


@dataclasses.dataclass(frozen=True)
class QKMeansClientResult:
    """A client's output: the final model and, per deletion, whether it retrained."""

    centroids: np.ndarray
    version: int
    retrained: tuple[bool, ...]


class QClientState(enum.Enum):
    """States of a Q-k-means client."""

    SETUP = enum.auto()
    WAITING = enum.auto()
    DONE = enum.auto()
    ERROR = enum.auto()


class QKMeansServer(ProtocolMachine):
    """The Q-k-means curator: trains on the uploaded points, serves removal requests exactly.

    Args:
        party: the server's name; clients: every client, in order.
        config: hyper-parameters; key: the run's `jax.random` key.
        n_deletions: how many requests the stream holds (the run ends after the last).
        setup: the clients hold only their own data: the server first runs the setup phase
            ``setup.data`` with them (state ``SETUP``; `local_data`), and each upload must then
            hold the ids agreed there.

    Raises:
        ValueError: bad clients, a negative ``n_deletions``, or a ``setup`` for other parties.
    """

    State = ServingState
    INITIAL_STATE = ServingState.COLLECT
    TRANSITIONS = {
        (ServingState.SETUP, DataSummary): ("_on_summary", ServingState.SETUP),
        (ServingState.COLLECT, PointUpload): ("_on_upload", ServingState.COLLECT),
        (ServingState.SERVING, RemovalRequest): ("_on_removal", ServingState.SERVING),
    }

    def __init__(
        self,
        party: str,
        *,
        clients: Sequence[str],
        config: QKMeansConfig,
        key: jax.Array,
        n_deletions: int,
        setup: DataCollector | None = None,
    ) -> None:
        super().__init__(party)
        clients = tuple(clients)
        if not clients or len(set(clients)) != len(clients) or party in clients:
            raise ValueError("clients must be unique, non-empty and must not include the server")
        if n_deletions < 0:
            raise ValueError("n_deletions must be non-negative")
        if setup is not None and setup.parties != clients:
            raise ValueError("the setup phase must be run with the clients")
        self.clients, self.config, self.n_deletions = clients, config, n_deletions
        self._setup = setup
        self._expected_ids: dict[str, tuple[int, int]] = {}
        if setup is not None:
            self._state = ServingState.SETUP
        self._qkm = QKMeans(config, key=key)
        self._uploads: dict[str, PointUpload] = {}
        self._owner: dict[int, str] = {}
        self._history: list[np.ndarray] = []

    @property
    def phase(self) -> str:
        if self._state is ServingState.SETUP:
            return SETUP_PHASE
        return "upload" if self._state is ServingState.COLLECT else "model"

    def pending(self) -> Sequence[str]:
        if self._state is ServingState.SETUP:
            assert self._setup is not None
            return self._setup.pending()
        if self._state is ServingState.COLLECT:
            return [c for c in self.clients if c not in self._uploads]
        if self._state is ServingState.SERVING:
            return list(self.clients)
        return []

    def _on_summary(self, sender: str, message: DataSummary) -> list[Outgoing]:
        assert self._setup is not None
        self._setup.add(sender, message, self)
        return []

    def _on_upload(self, sender: str, message: PointUpload) -> list[Outgoing]:
        if sender not in self.clients:
            raise remote_error(f"{sender} is not a client of this run", sender, self)
        if sender in self._uploads:
            raise remote_error(f"second upload from {sender}", sender, self)
        if self._expected_ids:
            first, count = self._expected_ids[sender]
            if not np.array_equal(message.ids, np.arange(first, first + count)):
                raise remote_error(f"{sender} uploaded {message.ids.shape[0]} points that are not the {count} with ids "
                              f"{first} .. {first + count - 1} agreed in the setup phase", sender, self)
        if self._uploads and message.points.shape[1] != next(iter(self._uploads.values())).points.shape[1]:
            raise remote_error(f"{sender} uploaded points of another dimension", sender, self)
        clash = [int(i) for i in message.ids if int(i) in self._owner]
        if clash:
            raise remote_error(f"{sender} uploaded ids already held: {clash[:5]}", sender, self)
        self._owner.update((int(i), sender) for i in message.ids)
        self._uploads[sender] = message
        return []

    def _publish(self, retrained: bool) -> list[Outgoing]:
        centroids = self._qkm.centroids
        self._history.append(centroids)
        version = len(self._history) - 1
        out = [self.broadcast(self.clients, ModelUpdate(version=version, retrained=retrained, centroids=centroids))]
        if version == self.n_deletions:
            q = self._qkm
            self._finish(
                QKMeansServerResult(
                    centroids, tuple(self._history), tuple(o.reason for o in q.outcomes), q.certified, q.retrained
                )
            )
        else:
            self.round_idx += 1
        return out

    def _advance(self) -> list[Outgoing]:
        if self._state is ServingState.SETUP and self._setup is not None and self._setup.complete:
            agreed = self._setup.agree(self)
            if agreed.n - self.n_deletions < self.config.k:
                raise ValueError(
                    f"{self.n_deletions} deletions of {agreed.n} points would leave fewer than k = {self.config.k}"
                )
            self._expected_ids = {p: (o, c) for p, o, c in zip(agreed.parties, agreed.offsets, agreed.counts)}
            self.move_to(ServingState.COLLECT)
            return [self.send(p, m, phase=SETUP_PHASE) for p, m in agreed.agreements().items()]
        if self._state is ServingState.COLLECT and len(self._uploads) == len(self.clients):
            ups = [self._uploads[c] for c in self.clients]
            x = np.concatenate([u.points for u in ups])
            ids = np.concatenate([u.ids for u in ups])
            if x.shape[0] - self.n_deletions < self.config.k:
                raise ValueError(
                    f"{self.n_deletions} deletions of {x.shape[0]} points would leave fewer than k = {self.config.k}"
                )
            self._qkm.fit(x, ids)
            self.move_to(ServingState.SERVING)
            return self._publish(False)
        return []

    def _on_removal(self, sender: str, message: RemovalRequest) -> list[Outgoing]:
        owner = self._owner.get(message.point_id)
        if owner is not None and owner != sender:
            raise remote_error(f"{sender} asked to delete point {message.point_id}, which {owner} owns", sender, self)
        try:
            outcome = self._qkm.delete(message.point_id)
        except DeletionError as exc:
            raise remote_error(f"{sender}'s removal request cannot be served: {exc}", sender, self) from exc
        return self._publish(outcome.retrained)


class QKMeansClient(StreamClient):
    """A Q-k-means client: uploads its points, requests deletions of its own points in turn.

    Args:
        party: the client's name; server: the server's name.
        points: ``[n_i, d]`` float64; ids: their stable ids.
        requests: position in the global stream -> id of one of this client's points.
        n_deletions: length of the global stream.
        local: instead of ``points``, ``ids`` and ``requests``, the client's raw points: it first
            takes part in the setup phase ``setup.data`` (state ``SETUP``; `local_data`), which
            gives their scaling and ids, and draws its requests from ``stream``.
        stream: with ``local``: the terms of the deletion stream (``removals == n_deletions``).

    Raises:
        ValueError: a request for a point the client does not hold, a position outside the
            stream, or both or neither of ``points`` and ``local``.
    """

    State = QClientState
    INITIAL_STATE = QClientState.WAITING
    DEADLINE_FACTOR = 2.0
    TRANSITIONS = {
        (QClientState.SETUP, DataAgreement): ("_on_agreement", QClientState.WAITING),
        (QClientState.WAITING, ModelUpdate): ("_on_model", QClientState.WAITING),
    }

    def __init__(
        self,
        party: str,
        *,
        server: str,
        points: np.ndarray | None = None,
        ids: np.ndarray | None = None,
        requests: Mapping[int, int] | None = None,
        n_deletions: int,
        local: LocalPoints | None = None,
        stream: StreamTerms | None = None,
    ) -> None:
        super().__init__(party)
        self.server = self.hub = server
        self.n_deletions = n_deletions
        self._hold(points, ids, requests, local, stream)

    def _take(self, points: np.ndarray, ids: np.ndarray, requests: Mapping[int, int]) -> None:
        self._points, self._ids = check_points(points, ids)
        self._take_requests(self._ids, requests)

    @property
    def phase(self) -> str:
        if self._state is QClientState.SETUP:
            return SETUP_PHASE
        return "request" if self.round_idx else "upload"

    def pending(self) -> Sequence[str]:
        return [self.server] if self._state in (QClientState.SETUP, QClientState.WAITING) else []

    def _ready(self) -> list[Outgoing]:
        return [self.send(self.server, PointUpload(ids=self._ids, points=self._points), phase="upload")]

    def _final(self, message: ModelUpdate) -> QKMeansClientResult:
        return QKMeansClientResult(message.centroids, message.version, tuple(self._retrained))

    def _request(self, point_id: int) -> Outgoing:
        return self.send(self.server, RemovalRequest(point_id=point_id), phase="request")

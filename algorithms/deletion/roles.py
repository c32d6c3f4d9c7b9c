"""The parties' roles of `fedproto.algorithms.deletion.protocol`: DC-k-means as a tree of parties
(:class:`DCLeaf`, :class:`DCNode`) and Q-k-means with a data curator (:class:`QKMeansServer`,
:class:`QKMeansClient`).

Theory of operation: `fedproto.algorithms.deletion.protocol` (Ginart et al. 2019, Sec. 4.2 and
Alg. 2/4/5/6; spec deletion-kmeans.md section 2.3), which also holds the plans that build these
roles (`protocol.DCTree`, `protocol.LocalDCTree`, `protocol.QKMeansParties`,
`protocol.LocalQKMeansParties`) and re-exports them. The federated Q-k-means roles, where the
points stay at the clients, are in `fedproto.algorithms.deletion.federated`; what all the roles
share is in `_base`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from fedproto.algorithms.deletion._base import FollowsRounds, SetupHub, StreamClient, check_stream, remote_error
from fedproto.algorithms.deletion._store import DeletionError, PointStore, check_points
from fedproto.algorithms.deletion.dckmeans import Tree, node_key, node_kmeans, node_output, stack_children
from fedproto.algorithms.deletion.local_data import SETUP_PHASE, DataCollector, LocalPoints, StreamTerms
from fedproto.algorithms.deletion.messages import (
    DataAgreement,
    DataSummary,
    ModelUpdate,
    NodeCentroids,
    PointUpload,
    RemovalRequest,
    WeightedNodeCentroids,
)
from fedproto.algorithms.deletion.qkmeans import QKMeans, QKMeansConfig
from fedproto.machine import machine_states
from fedproto.messages import Outgoing
from fedproto.star import check_clients

__all__ = [
    "ROOT",
    "SERVER",
    "DCLeaf",
    "DCNode",
    "DCNodeResult",
    "DCRootResult",
    "LeafState",
    "QClientState",
    "QKMeansClient",
    "QKMeansClientResult",
    "QKMeansServer",
    "QKMeansServerResult",
    "ServingState",
    "root_route",
    "tree_party",
    "tree_roster",
]

ROOT = "root"
SERVER = "server"


#: States of a party that collects the training uploads, then serves the deletion stream (a DC-k-means
#: internal node or root, the curated Q-k-means server); ``SETUP`` is the setup phase ``setup.data``.
ServingState = machine_states("ServingState", "SETUP", "COLLECT", "SERVING")


# ----------------------------------------------------------------------------------------- DC


@dataclasses.dataclass(frozen=True)
class DCNodeResult:
    """A leaf's or internal node's output.

    Attributes:
        node: the node id; version: computations of the node.
        centroids: its last output ``[r, d]``.
        points: points held (leaves; -1 for internal nodes).
        removed: ids this leaf deleted, in order.
    """

    node: int
    version: int
    centroids: np.ndarray
    points: int
    removed: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class DCRootResult:
    """The root's output.

    Attributes:
        centroids: the final model ``[r, d]``.
        history: the model after training and after each deletion (``m + 1`` arrays).
        deletions: the deleted ids, in order.
        version: computations of the root.
        counts: the mass of each final centroid ``[r]`` (weighted variant), else ``None``.
    """

    centroids: np.ndarray
    history: tuple[np.ndarray, ...]
    deletions: tuple[int, ...]
    version: int
    counts: np.ndarray | None = None


LeafState = machine_states("LeafState", "SETUP", "SERVING")


class DCLeaf(FollowsRounds):
    """A DC-k-means leaf: holds its points, trains at start, serves removal requests.

    Args:
        party: this party's name.
        node: its node id in the tree; parent: the parent's party name; coordinator: the root.
        points: ``[n_j, d]`` float64 (may be empty); ids: their stable ids.
        k, iterations: the node computation; key: the run's `jax.random` key.
        patience: phase deadlines to wait without input while serving.
        weighted: also send the cluster masses (:class:`WeightedNodeCentroids`).
        local: instead of ``points`` and ``ids``, the leaf's raw points: it first takes part in
            the setup phase ``setup.data`` (`local_data`; state ``SETUP``), which gives their
            scaling and ids, then trains.

    Raises:
        ValueError: bad points or ids, or both or neither of ``points`` and ``local``.
    """

    State = LeafState
    INITIAL_STATE = LeafState.SERVING
    SERVING_STATES = (LeafState.SERVING,)
    DEADLINE_FACTOR = 2.0
    TRANSITIONS = {
        (LeafState.SETUP, DataAgreement): ("_on_agreement", LeafState.SERVING),
        (LeafState.SERVING, RemovalRequest): ("_on_removal", LeafState.SERVING),
        (LeafState.SERVING, ModelUpdate): ("_on_model", LeafState.DONE),
    }

    def __init__(
        self,
        party: str,
        *,
        node: int,
        parent: str,
        coordinator: str,
        points: np.ndarray | None = None,
        ids: np.ndarray | None = None,
        k: int,
        iterations: int,
        key: jax.Array,
        patience: int = 1,
        weighted: bool = False,
        local: LocalPoints | None = None,
    ) -> None:
        super().__init__(party, patience=patience)
        self.node, self.parent, self.coordinator = node, parent, coordinator
        self.k, self.iterations, self._key = k, iterations, node_key(key, node)
        self.weighted = weighted
        if (points is None) == (local is None):
            raise ValueError("give a leaf either its points (and ids) or its raw local points, not both or neither")
        self._local = local
        if local is not None:
            self._state = LeafState.SETUP
            self._store = PointStore(np.zeros((0, local.d)))
        else:
            self._store = PointStore(points, ids)  # type: ignore[arg-type]
        self._centroids = np.zeros((0, self._store.d))
        self._version = 0
        self._removed: list[int] = []

    @property
    def phase(self) -> str:
        return SETUP_PHASE if self._state is LeafState.SETUP else "local"

    def pending(self) -> Sequence[str]:
        return [self.coordinator] if self._state is LeafState.SETUP else []

    def _upload(self) -> Outgoing:
        store = self._store
        self._version += 1
        if self.weighted:
            self._centroids, counts = node_output(self._key, store.x, store.ids, self.k, self.iterations)
            message: NodeCentroids | WeightedNodeCentroids = WeightedNodeCentroids(
                node=self.node, version=self._version, centroids=self._centroids, counts=counts
            )
        else:
            self._centroids = node_kmeans(self._key, store.x, store.ids, self.k, self.iterations)
            message = NodeCentroids(node=self.node, version=self._version, centroids=self._centroids)
        return self.send(self.parent, message, phase="local")

    def _start(self) -> list[Outgoing]:
        if self._local is not None:
            return [self.send(self.coordinator, self._local.summary(), phase=SETUP_PHASE)]
        return [self._upload()]

    def _on_agreement(self, sender: str, message: DataAgreement) -> list[Outgoing]:
        if sender != self.coordinator:
            raise remote_error(f"{sender} is not the coordinator", sender, self)
        assert self._local is not None
        try:
            points, ids = self._local.agreed(message)
        except ValueError as exc:
            raise remote_error(f"{sender}'s data agreement does not fit {self.party}: {exc}", sender, self) from exc
        self._store = PointStore(points, ids)
        return [self._upload()]

    def _on_removal(self, sender: str, message: RemovalRequest) -> list[Outgoing]:
        if sender != self.coordinator:
            raise remote_error(f"{sender} is not the coordinator; only {self.coordinator} sends removal requests",
                          sender, self)
        try:
            row = self._store.row_of(message.point_id)
        except DeletionError as exc:
            raise remote_error(f"{sender} asked {self.party} to delete a point it does not hold: {exc}",
                          sender, self) from exc
        self._store.remove(row)
        self._removed.append(message.point_id)
        return [self._upload()]

    def _on_model(self, sender: str, message: ModelUpdate) -> list[Outgoing]:
        if sender != self.coordinator:
            raise remote_error(f"{sender} is not the coordinator", sender, self)
        self._finish(DCNodeResult(self.node, self._version, self._centroids, self._store.n, tuple(self._removed)))
        return []


class DCNode(FollowsRounds, SetupHub):
    """A DC-k-means internal node, or the root (``parent=None``), which also coordinates.

    Args:
        party: this party's name; node: its node id (0 for the root).
        children: ``(party, node id)`` of each child, in child order.
        parent: the parent's party name, or ``None`` for the root.
        coordinator: the root's party name (itself for the root).
        k, iterations: the node computation; key: the run's `jax.random` key.
        deletions: root only: the stream of point ids to delete, in order.
        owners: root only: point id -> the party name of the leaf holding it (every id).
        route: root only: leaf party -> the root's child whose subtree holds that leaf.
        parties: root only: every other party (told the final model).
        patience: phase deadlines to wait without input while serving.
        weighted: children send, and this node sends, :class:`WeightedNodeCentroids`; the node
            clusters its children's centroids weighted by their masses.
        setup: root only, instead of ``deletions`` and ``owners``: the leaves hold only their own
            data, and the root first runs the setup phase ``setup.data`` with them (state
            ``SETUP``; `local_data`), which gives n and the id table; it then draws ``stream``.
        stream: root with ``setup``: the terms of the deletion stream.

    Raises:
        ValueError: bad children, or (root) a deletion stream that does not fit the data.
    """

    State = ServingState
    INITIAL_STATE = ServingState.COLLECT
    SERVING_STATES = (ServingState.SERVING,)
    TRANSITIONS = {
        (ServingState.SETUP, DataSummary): ("_on_summary", ServingState.SETUP),
        (ServingState.COLLECT, NodeCentroids): ("_on_child", ServingState.COLLECT),
        (ServingState.COLLECT, WeightedNodeCentroids): ("_on_child", ServingState.COLLECT),
        (ServingState.SERVING, NodeCentroids): ("_on_child_update", ServingState.SERVING),
        (ServingState.SERVING, WeightedNodeCentroids): ("_on_child_update", ServingState.SERVING),
        (ServingState.SERVING, ModelUpdate): ("_on_model", ServingState.DONE),
    }

    def __init__(
        self,
        party: str,
        *,
        node: int,
        children: Sequence[tuple[str, int]],
        parent: str | None,
        coordinator: str,
        k: int,
        iterations: int,
        key: jax.Array,
        deletions: Sequence[int] = (),
        owners: Mapping[int, str] | None = None,
        route: Mapping[str, str] | None = None,
        parties: Sequence[str] = (),
        patience: int = 1,
        weighted: bool = False,
        setup: DataCollector | None = None,
        stream: StreamTerms | None = None,
    ) -> None:
        super().__init__(party, patience=patience)
        self.weighted = weighted
        self._counts: np.ndarray | None = None
        children = tuple((str(p), int(c)) for p, c in children)
        if not children or len({p for p, _ in children}) != len(children):
            raise ValueError("children must be non-empty and unique")
        self.node, self.children, self.parent, self.coordinator = node, children, parent, coordinator
        self.k, self.iterations, self._key = k, iterations, node_key(key, node)
        self._node_of = dict(children)
        self._latest: dict[str, tuple[int, np.ndarray, np.ndarray | None]] = {}
        self._centroids: np.ndarray | None = None
        self._version = 0
        self.is_root = parent is None
        owners = dict(owners or {})
        if not self.is_root and (deletions or owners or setup is not None):
            raise ValueError("only the root holds the deletion stream")
        if setup is not None and (deletions or owners or stream is None):
            raise ValueError("a root with the setup phase takes the stream's terms, not the stream and the id table")
        self._setup, self._stream = setup, stream
        self._route = dict(route or {})
        self._take_stream(deletions, owners)
        if setup is not None:
            self._state = ServingState.SETUP
        self.parties = tuple(parties)
        self._next = 0
        self._awaiting: str | None = None
        self._history: list[np.ndarray] = []
        self.DEADLINE_FACTOR = 1.0 if self.is_root else 2.0

    def _take_stream(self, deletions: Sequence[int], owners: dict[int, str]) -> None:
        self.deletions = check_stream(deletions, owners, len(owners), self.k) if self.is_root and deletions else ()
        self._owners = owners
        missing = {owners[i] for i in self.deletions} - set(self._route)
        if missing:
            raise ValueError(f"no route to leaves {sorted(missing)}")

    @property
    def phase(self) -> str:
        if self._state is ServingState.SETUP:
            return SETUP_PHASE
        if self.is_root:
            return "request" if self._state is ServingState.SERVING else "collect"
        return "merge"

    def pending(self) -> Sequence[str]:
        if self._state is ServingState.SETUP:
            assert self._setup is not None
            return self._setup.pending()
        if self._state is ServingState.COLLECT:
            return [p for p, _ in self.children if p not in self._latest]
        if self._state is ServingState.SERVING and self._awaiting is not None:
            return [self._awaiting]
        return []

    def _check_child(self, sender: str, message: NodeCentroids | WeightedNodeCentroids, version: int) -> None:
        if sender not in self._node_of:
            raise remote_error(f"{sender} is not a child of {self.party}", sender, self)
        if isinstance(message, WeightedNodeCentroids) != self.weighted:
            kind = "a weighted" if self.weighted else "an unweighted"
            raise remote_error(f"{sender} sent {type(message).__name__} to {kind} tree", sender, self)
        if message.node != self._node_of[sender]:
            raise remote_error(f"{sender} sent centroids of node {message.node}, it is node {self._node_of[sender]}",
                          sender, self)
        if message.version != version:
            raise remote_error(f"{sender} sent version {message.version} of node {message.node}, expected {version}",
                          sender, self)
        if message.centroids.shape[0] > self.k:
            raise remote_error(f"{sender} sent {message.centroids.shape[0]} centroids, more than k = {self.k}", sender, self)
        if self._latest and message.centroids.shape[1] != next(iter(self._latest.values()))[1].shape[1]:
            raise remote_error(f"{sender} sent centroids of another dimension", sender, self)

    def _recompute(self) -> None:
        points, ids = stack_children([self._latest[p][1] for p, _ in self.children], self.k)
        if self.weighted:
            weights = np.concatenate([self._latest[p][2] for p, _ in self.children])  # type: ignore[misc]
            self._centroids, self._counts = node_output(self._key, points, ids, self.k, self.iterations, weights)
        else:
            self._centroids = node_kmeans(self._key, points, ids, self.k, self.iterations)
        self._version += 1

    @staticmethod
    def _entry(
        version: int, message: NodeCentroids | WeightedNodeCentroids
    ) -> tuple[int, np.ndarray, np.ndarray | None]:
        return version, message.centroids, getattr(message, "counts", None)

    def _agree(self) -> list[Outgoing]:
        """The setup phase is complete: agree n, the ids and the extent, draw the stream."""
        assert self._setup is not None and self._stream is not None
        agreed = self._setup.agree(self)
        if agreed.n < self.k:
            raise ValueError(f"k = {self.k} is larger than the number of points n = {agreed.n}")
        self._take_stream(self._stream.stream(agreed.n), agreed.owners())
        self.move_to(ServingState.COLLECT)
        return [self.send(p, m, phase=SETUP_PHASE) for p, m in agreed.agreements().items()]

    def _on_child(self, sender: str, message: NodeCentroids | WeightedNodeCentroids) -> list[Outgoing]:
        if sender in self._latest:
            raise remote_error(f"second training upload from {sender}", sender, self)
        self._check_child(sender, message, 1)
        self._latest[sender] = self._entry(1, message)
        return []

    def _advance(self) -> list[Outgoing]:
        if self._state is ServingState.SETUP and self._setup is not None and self._setup.complete:
            return self._agree()
        if self._state is ServingState.COLLECT and len(self._latest) == len(self.children):
            self._recompute()
            self.move_to(ServingState.SERVING)
            return self._forward()
        return []

    def _forward(self) -> list[Outgoing]:
        if not self.is_root:
            assert self._centroids is not None
            update: NodeCentroids | WeightedNodeCentroids
            if self.weighted:
                update = WeightedNodeCentroids(node=self.node, version=self._version, centroids=self._centroids,
                                               counts=self._counts)
            else:
                update = NodeCentroids(node=self.node, version=self._version, centroids=self._centroids)
            return [self.send(self.parent, update, phase="merge")]  # type: ignore[arg-type]
        self._history.append(self._centroids)  # type: ignore[arg-type]
        self.round_idx += 1
        if self._next < len(self.deletions):
            point_id = self.deletions[self._next]
            self._next += 1
            leaf = self._owners[point_id]
            self._awaiting = self._route[leaf]
            return [self.send(leaf, RemovalRequest(point_id=point_id), phase="request")]
        assert self._centroids is not None
        final = ModelUpdate(version=len(self.deletions), retrained=False, centroids=self._centroids)
        self._finish(DCRootResult(self._centroids, tuple(self._history), self.deletions, self._version, self._counts))
        return [self.broadcast(self.parties, final, phase="model")] if self.parties else []

    def _on_child_update(self, sender: str, message: NodeCentroids | WeightedNodeCentroids) -> list[Outgoing]:
        if self.is_root and sender != self._awaiting:
            raise remote_error(f"unexpected update from {sender}: no deletion is in progress below it", sender, self)
        version = self._latest.get(sender, (0, None, None))[0] + 1
        self._check_child(sender, message, version)
        self._latest[sender] = self._entry(version, message)
        self._awaiting = None
        self._recompute()
        return self._forward()

    def _on_model(self, sender: str, message: ModelUpdate) -> list[Outgoing]:
        if self.is_root or sender != self.coordinator:
            raise remote_error(f"{sender} cannot send {self.party} a model", sender, self)
        assert self._centroids is not None
        self._finish(DCNodeResult(self.node, self._version, self._centroids, -1, ()))
        return []


def tree_party(tree: Tree, node: int) -> str:
    """The party name of ``tree``'s node ``node``: ``root``, ``node-<id>`` for an internal node,
    ``leaf-<j>`` for leaf j."""
    if node == 0:
        return ROOT
    level = tree.level_of(node)
    if level == tree.height:
        return f"leaf-{node - tree.offset(level)}"
    return f"node-{node}"


def root_route(tree: Tree) -> dict[str, str]:
    """Leaf party -> the root's child whose subtree holds that leaf."""
    route = {}
    for leaf in range(tree.n_leaves):
        path = tree.path(leaf)
        route[tree_party(tree, path[0])] = tree_party(tree, path[-2])
    return route


def tree_roster(tree: Tree) -> tuple[str, ...]:
    """Every party of ``tree`` in node order (the roster; index = node id): ``root``, the
    internal nodes, then the leaves."""
    return tuple(tree_party(tree, node) for node in range(tree.n_nodes))

# ------------------------------------------------------------------------------------------- Q


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


QClientState = machine_states("QClientState", "SETUP", "WAITING")


class QKMeansServer(SetupHub):
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
        clients = check_clients(party, clients)
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
    TRANSITIONS = StreamClient.stream_transitions(QClientState)

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

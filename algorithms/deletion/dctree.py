"""DC-k-means as a tree of parties: the leaves (:class:`DCLeaf`) and the internal nodes and root
(:class:`DCNode`), and the party names of a tree.

Theory of operation: `fedproto.algorithms.deletion.protocol` (Ginart et al. 2019, Sec. 4.2 and
Alg. 2/6; spec deletion-kmeans.md section 2.3). The plans that build these roles are
`fedproto.algorithms.deletion.protocol.DCTree` (the whole data set) and
`fedproto.algorithms.deletion.protocol.LocalDCTree` (each leaf its own data).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from fedproto.algorithms.deletion._roles import FollowsRounds, ServingState, check_stream, remote_error
from fedproto.algorithms.deletion._store import DeletionError, PointStore
from fedproto.algorithms.deletion.dckmeans import Tree, node_key, node_kmeans, node_output, stack_children
from fedproto.algorithms.deletion.local_data import SETUP_PHASE, DataCollector, LocalPoints, StreamTerms
from fedproto.algorithms.deletion.messages import (
    DataAgreement,
    DataSummary,
    ModelUpdate,
    NodeCentroids,
    RemovalRequest,
    WeightedNodeCentroids,
)
from fedproto.messages import Outgoing

__all__ = [
    "ROOT",
    "DCLeaf",
    "DCNode",
    "DCNodeResult",
    "DCRootResult",
    "LeafState",
    "root_route",
    "tree_party",
    "tree_roster",
]

ROOT = "root"


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


class LeafState(enum.Enum):
    """States of a DC leaf."""

    SETUP = enum.auto()
    SERVING = enum.auto()
    DONE = enum.auto()
    ERROR = enum.auto()


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


class DCNode(FollowsRounds):
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

    def _on_summary(self, sender: str, message: DataSummary) -> list[Outgoing]:
        assert self._setup is not None
        self._setup.add(sender, message, self)
        return []

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

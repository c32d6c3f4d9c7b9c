"""Deletion as a protocol: DC-k-means as a tree of parties, Q-k-means as a server and its clients.

Theory of operation (Ginart et al. 2019, Sec. 4.2 and Alg. 2/6; spec deletion-kmeans.md section
2.3, a design for this project: the paper describes no protocol).

**DC-k-means.** Roles: one :class:`DCLeaf` per leaf of the tree (a data-holding party: a client),
one :class:`DCNode` per internal node, and the root, a :class:`DCNode` without a parent that is
also the coordinator: it holds the public table point id -> leaf (ids, not values) and the stream
of deletion requests, given at construction.

* Round 0, training. Each leaf runs k-means++ and T Lloyd iterations on its points and sends
  :class:`NodeCentroids` to its parent (phase ``local``). An internal node waits until every
  child's centroids are in (state ``COLLECT``), clusters their union (unweighted) and sends its
  own :class:`NodeCentroids` upward (phase ``merge``). When the root has every child's centroids
  it computes the model.
* Round r = 1..m, deletion r. The root sends :class:`RemovalRequest` to the leaf holding the
  point (phase ``request``). That leaf removes the point, recomputes and sends its new centroids
  (version + 1) to its parent; each ancestor replaces that child's rows, recomputes and forwards;
  the root recomputes the model and sends the next request. Only the leaf-to-root path sends
  anything: h + 1 messages (the request and h uploads); every other party sends zero bytes, which
  the per-round metering shows.
* Round m + 1. The root sends the final model (:class:`ModelUpdate`) to every party, and all
  finish.

Parties off a deletion's path do not see its round, so after training a party follows the
rounds of its inputs forward (`_FollowsRounds`). A leaf holds no other party's points; exactness
(``root model == DCKMeans on the remaining data with the same key and leaves``) follows from
every party computing its node with `dckmeans.node_kmeans` and the node's own key. The tree is the
roster, so its width is fixed for a run: the width rule's retrain (App. C.2.2) is the centralised
class's (`dckmeans.DCKMeans`). In the weighted variant (``DCKMeansConfig(weighted=True)``) every
upload is a :class:`WeightedNodeCentroids`: the centroids plus their masses, ``k * 8`` payload
bytes more per message, and internal nodes cluster mass-weighted (`dckmeans.node_output`).

**Q-k-means.** Q-k-means is a centralised algorithm; as a protocol it is a data curator
(:class:`QKMeansServer`) and the clients whose points it holds (:class:`QKMeansClient`). Round 0:
every client sends its points (:class:`PointUpload`, phase ``upload``); the server trains and sends
every client the model (:class:`ModelUpdate`, phase ``model``). Round r: the client that owns the
r-th requested point sends :class:`RemovalRequest` (phase ``request``); the server deletes it
exactly (certified or retrained, `qkmeans.QKMeans.delete`) and sends every client the new model.
The federated variant of spec 2.3, where the points stay at the clients, is
`fedproto.algorithms.deletion.federated`.

**Each party's own data.** Built by :class:`LocalDCTree` or :class:`LocalQKMeansParties` (what
``fedproto run`` and ``fedproto party`` use), a leaf or client is given only its own raw points,
and the root or server holds no data and no id table: the run opens with the setup phase
``setup.data`` (round 0, state ``SETUP`` of every role; `local_data`): each data-holding party
sends its count, dimension and feature extent, the coordinating party agrees n, the ids and the
extent and answers each; the root (or each client) then draws the deletion stream from n and the
public terms. :class:`DCTree` and :class:`QKMeansParties` build the same protocols from pooled
data with given ids, without that phase.

Dropout and errors: no quorum, every party is needed. A silent party makes the party waiting for
it fail with :class:`~fedproto.errors.InsufficientParticipants` naming it. Parties that serve a
stream (a leaf waiting for requests that may never come) tolerate ``patience`` deadlines without
input, one per remaining round. A request for an unknown or already deleted id, or from a client
that does not own the point, is a :class:`~fedproto.errors.RemoteProtocolError`: the model is
never left silently stale. A deletion stream is checked when the coordinator is built (unknown
ids, repeats, fewer than k points left: ``ValueError``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from fedproto.algorithms.deletion._store import DeletionError, PointStore, check_points
from fedproto.algorithms.deletion.dckmeans import (
    DCKMeansConfig,
    Tree,
    assign_leaves,
    node_key,
    node_kmeans,
    node_output,
    stack_children,
)
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
from fedproto.errors import RemoteProtocolError
from fedproto.machine import ProtocolMachine
from fedproto.messages import Event, Outgoing, PhaseTimedOut

__all__ = [
    "DCLeaf",
    "DCNode",
    "DCNodeResult",
    "DCRootResult",
    "DCTree",
    "LocalDCTree",
    "LocalQKMeansParties",
    "QKMeansClient",
    "QKMeansClientResult",
    "QKMeansParties",
    "QKMeansServer",
    "QKMeansServerResult",
    "ROOT",
    "SERVER",
    "check_stream",
]

ROOT = "root"
SERVER = "server"


def check_stream(deletions: Sequence[int], known: Mapping[int, Any] | set[int], n: int, k: int) -> tuple[int, ...]:
    """Validate a deletion stream against the ids held.

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


def _remote(message: str, sender: str, machine: ProtocolMachine) -> RemoteProtocolError:
    return RemoteProtocolError(message, party=sender, round_idx=machine.round_idx, state=machine.state.name)


class _FollowsRounds(ProtocolMachine):
    """A party that serves a stream: after training it follows the rounds of its inputs forward
    (rounds it is not part of pass it by), and it waits through ``patience`` phase deadlines
    without input before it gives up."""

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


class LeafState(enum.Enum):
    """States of a DC leaf."""

    SETUP = enum.auto()
    SERVING = enum.auto()
    DONE = enum.auto()
    ERROR = enum.auto()


class NodeState(enum.Enum):
    """States of a DC internal node or root."""

    SETUP = enum.auto()
    COLLECT = enum.auto()
    SERVING = enum.auto()
    DONE = enum.auto()
    ERROR = enum.auto()


class DCLeaf(_FollowsRounds):
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
            raise _remote(f"{sender} is not the coordinator", sender, self)
        assert self._local is not None
        try:
            points, ids = self._local.agreed(message)
        except ValueError as exc:
            raise _remote(f"{sender}'s data agreement does not fit {self.party}: {exc}", sender, self) from exc
        self._store = PointStore(points, ids)
        return [self._upload()]

    def _on_removal(self, sender: str, message: RemovalRequest) -> list[Outgoing]:
        if sender != self.coordinator:
            raise _remote(f"{sender} is not the coordinator; only {self.coordinator} sends removal requests",
                          sender, self)
        try:
            row = self._store.row_of(message.point_id)
        except DeletionError as exc:
            raise _remote(f"{sender} asked {self.party} to delete a point it does not hold: {exc}",
                          sender, self) from exc
        self._store.remove(row)
        self._removed.append(message.point_id)
        return [self._upload()]

    def _on_model(self, sender: str, message: ModelUpdate) -> list[Outgoing]:
        if sender != self.coordinator:
            raise _remote(f"{sender} is not the coordinator", sender, self)
        self._finish(DCNodeResult(self.node, self._version, self._centroids, self._store.n, tuple(self._removed)))
        return []


class DCNode(_FollowsRounds):
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

    State = NodeState
    INITIAL_STATE = NodeState.COLLECT
    SERVING_STATES = (NodeState.SERVING,)
    TRANSITIONS = {
        (NodeState.SETUP, DataSummary): ("_on_summary", NodeState.SETUP),
        (NodeState.COLLECT, NodeCentroids): ("_on_child", NodeState.COLLECT),
        (NodeState.COLLECT, WeightedNodeCentroids): ("_on_child", NodeState.COLLECT),
        (NodeState.SERVING, NodeCentroids): ("_on_child_update", NodeState.SERVING),
        (NodeState.SERVING, WeightedNodeCentroids): ("_on_child_update", NodeState.SERVING),
        (NodeState.SERVING, ModelUpdate): ("_on_model", NodeState.DONE),
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
            self._state = NodeState.SETUP
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
        if self._state is NodeState.SETUP:
            return SETUP_PHASE
        if self.is_root:
            return "request" if self._state is NodeState.SERVING else "collect"
        return "merge"

    def pending(self) -> Sequence[str]:
        if self._state is NodeState.SETUP:
            assert self._setup is not None
            return self._setup.pending()
        if self._state is NodeState.COLLECT:
            return [p for p, _ in self.children if p not in self._latest]
        if self._state is NodeState.SERVING and self._awaiting is not None:
            return [self._awaiting]
        return []

    def _check_child(self, sender: str, message: NodeCentroids | WeightedNodeCentroids, version: int) -> None:
        if sender not in self._node_of:
            raise _remote(f"{sender} is not a child of {self.party}", sender, self)
        if isinstance(message, WeightedNodeCentroids) != self.weighted:
            kind = "a weighted" if self.weighted else "an unweighted"
            raise _remote(f"{sender} sent {type(message).__name__} to {kind} tree", sender, self)
        if message.node != self._node_of[sender]:
            raise _remote(f"{sender} sent centroids of node {message.node}, it is node {self._node_of[sender]}",
                          sender, self)
        if message.version != version:
            raise _remote(f"{sender} sent version {message.version} of node {message.node}, expected {version}",
                          sender, self)
        if message.centroids.shape[0] > self.k:
            raise _remote(f"{sender} sent {message.centroids.shape[0]} centroids, more than k = {self.k}", sender, self)
        if self._latest and message.centroids.shape[1] != next(iter(self._latest.values()))[1].shape[1]:
            raise _remote(f"{sender} sent centroids of another dimension", sender, self)

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
        self.move_to(NodeState.COLLECT)
        return [self.send(p, m, phase=SETUP_PHASE) for p, m in agreed.agreements().items()]

    def _on_child(self, sender: str, message: NodeCentroids | WeightedNodeCentroids) -> list[Outgoing]:
        if sender in self._latest:
            raise _remote(f"second training upload from {sender}", sender, self)
        self._check_child(sender, message, 1)
        self._latest[sender] = self._entry(1, message)
        return []

    def _advance(self) -> list[Outgoing]:
        if self._state is NodeState.SETUP and self._setup is not None and self._setup.complete:
            return self._agree()
        if self._state is NodeState.COLLECT and len(self._latest) == len(self.children):
            self._recompute()
            self.move_to(NodeState.SERVING)
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
            raise _remote(f"unexpected update from {sender}: no deletion is in progress below it", sender, self)
        version = self._latest.get(sender, (0, None, None))[0] + 1
        self._check_child(sender, message, version)
        self._latest[sender] = self._entry(version, message)
        self._awaiting = None
        self._recompute()
        return self._forward()

    def _on_model(self, sender: str, message: ModelUpdate) -> list[Outgoing]:
        if self.is_root or sender != self.coordinator:
            raise _remote(f"{sender} cannot send {self.party} a model", sender, self)
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


def _root_route(tree: Tree) -> dict[str, str]:
    """Leaf party -> the root's child whose subtree holds that leaf."""
    route = {}
    for leaf in range(tree.n_leaves):
        path = tree.path(leaf)
        route[tree_party(tree, path[0])] = tree_party(tree, path[-2])
    return route


class DCTree:
    """The parties of one DC-k-means run: names, tree, leaf data, and a machine factory.

    Parties: ``root``, ``node-<id>`` for internal nodes, ``leaf-<j>`` for leaf j.

    Args:
        x: ``[n, d]`` points; ids: stable ids (default ``0..n-1``).
        config: hyper-parameters; ``width=None`` applies the width rule to n once.
        key: the run's `jax.random` key.
        deletions: the stream of ids the root requests, in order.
        leaves: optional given leaf of each point (the data clients already hold).

    Raises:
        ValueError: bad data, leaves or deletion stream.
    """

    def __init__(
        self,
        x: np.ndarray,
        ids: np.ndarray | None,
        config: DCKMeansConfig,
        *,
        key: jax.Array,
        deletions: Sequence[int] = (),
        leaves: np.ndarray | None = None,
    ) -> None:
        x, ids = check_points(x, ids)
        n = x.shape[0]
        if n < config.k:
            raise ValueError(f"k = {config.k} is larger than the number of points n = {n}")
        self.config, self.key = config, key
        self.tree = Tree(config.resolve_width(n), config.height)
        if leaves is None:
            leaf_of = assign_leaves(key, ids, self.tree.n_leaves)
        else:
            leaf_of = np.asarray(leaves, dtype=np.int64)
            if leaf_of.shape != (n,) or (n and (leaf_of.min() < 0 or leaf_of.max() >= self.tree.n_leaves)):
                raise ValueError(f"leaves must be [{n}] integers in [0, {self.tree.n_leaves})")
        self.leaf_of = leaf_of
        self._x, self._ids = x, ids
        tree = self.tree
        self.owners = {int(i): self.party_of(tree.leaf_node(int(j))) for i, j in zip(ids, leaf_of)}
        self.deletions = check_stream(deletions, self.owners, n, config.k)
        self.roster = tuple(self.party_of(node) for node in range(tree.n_nodes))
        self.patience = len(self.deletions) + 2

    def party_of(self, node: int) -> str:
        """The party name of tree node ``node``."""
        return tree_party(self.tree, node)

    def role_of(self, party: str) -> str:
        """``root``, ``node`` or ``leaf``."""
        return party.split("-")[0]

    def make_machine(self, party: str) -> ProtocolMachine:
        """The machine of ``party`` (only this party's data is handed to it).

        Raises:
            ValueError: ``party`` is not in the roster.
        """
        if party not in self.roster:
            raise ValueError(f"{party!r} is not a party of this tree")
        tree, cfg = self.tree, self.config
        node = self.roster.index(party)
        parent = tree.parent(node)
        common = dict(k=cfg.k, iterations=cfg.iterations, key=self.key, patience=self.patience, weighted=cfg.weighted)
        if tree.level_of(node) == tree.height:
            leaf = node - tree.offset(tree.height)
            mask = self.leaf_of == leaf
            return DCLeaf(
                party, node=node, parent=self.party_of(parent), coordinator=ROOT,  # type: ignore[arg-type]
                points=self._x[mask], ids=self._ids[mask], **common,
            )
        children = [(self.party_of(c), c) for c in tree.children(node)]
        if parent is not None:
            return DCNode(party, node=node, children=children, parent=self.party_of(parent), coordinator=ROOT, **common)
        return DCNode(
            party, node=0, children=children, parent=None, coordinator=ROOT, deletions=self.deletions,
            owners=self.owners, route=_root_route(tree), parties=self.roster[1:], **common,
        )

    def machines(self) -> dict[str, ProtocolMachine]:
        """Every party's machine, in roster order."""
        return {p: self.make_machine(p) for p in self.roster}


class LocalDCTree:
    """The parties of one DC-k-means run whose leaves each hold only their own data.

    Every party's machine is built from public terms and, for a leaf, its own raw points only;
    the root learns n, the id table and the deletion stream in the setup phase ``setup.data``
    (`local_data`). The simulation (``fedproto run``) and a party process (``fedproto party``)
    build their machines with this same class, so their results and payload bytes are equal.

    Args:
        config: hyper-parameters with a fixed ``width`` (the tree is the roster).
        key: the run's `jax.random` key.
        stream: the terms of the deletion stream the root draws.
        scale: ``"minmax"`` or ``"none"`` (``--normalize``).

    Raises:
        ValueError: ``config.width`` is ``None``.
    """

    def __init__(self, config: DCKMeansConfig, *, key: jax.Array, stream: StreamTerms, scale: str) -> None:
        if config.width is None:
            raise ValueError("the tree's width must be fixed: it decides the roster")
        self.config, self.key, self.stream, self.scale = config, key, stream, scale
        self.tree = Tree(config.width, config.height)
        self.roster = tuple(tree_party(self.tree, node) for node in range(self.tree.n_nodes))
        self.leaves = self.roster[self.tree.offset(self.tree.height):]
        self.patience = stream.removals + 2

    @staticmethod
    def width_of(roster: Sequence[str], height: int, width: int | None = None) -> int:
        """The width of the tree of height ``height`` whose parties are ``roster`` (from its
        number of leaves); ``width``, when given, must agree.

        Raises:
            ValueError: ``roster`` is not the roster of a perfect tree of that height and width.
        """
        n_leaves = sum(1 for p in roster if p.startswith("leaf-"))
        found = round(n_leaves ** (1 / height)) if n_leaves and height >= 1 else 0
        if found < 1 or found**height != n_leaves or (width is not None and width != found):
            raise ValueError(f"the roster's {n_leaves} leaves are not the {width or 'w'}^{height} leaves of a "
                             f"DC-k-means tree of height {height} (--width, --height)")
        tree = Tree(found, height)
        if tuple(roster) != tuple(tree_party(tree, node) for node in range(tree.n_nodes)):
            raise ValueError(f"the roster ({', '.join(roster)}) is not a DC-k-means tree of width {found} and "
                             f"height {height}")
        return found

    def role_of(self, party: str) -> str:
        """``root``, ``node`` or ``leaf``."""
        return party.split("-")[0]

    def make_machine(self, party: str, raw: np.ndarray | None) -> ProtocolMachine:
        """The machine of ``party``, given its own raw points ``[n_j, d]`` (a leaf) or ``None``
        (the root and internal nodes hold no data).

        Raises:
            ValueError: ``party`` is not in the roster, a leaf without points, or points for a
                party that holds none.
        """
        if party not in self.roster:
            raise ValueError(f"{party!r} is not a party of this tree")
        tree, cfg = self.tree, self.config
        node = self.roster.index(party)
        parent = tree.parent(node)
        common = dict(k=cfg.k, iterations=cfg.iterations, key=self.key, patience=self.patience, weighted=cfg.weighted)
        if party in self.leaves:
            if raw is None:
                raise ValueError(f"{party} holds data: give it its own points")
            return DCLeaf(party, node=node, parent=tree_party(tree, parent), coordinator=ROOT,  # type: ignore[arg-type]
                          local=LocalPoints(raw, self.scale), **common)
        if raw is not None:
            raise ValueError(f"{party} holds no data in a DC-k-means tree (only the leaves do)")
        children = [(tree_party(tree, c), c) for c in tree.children(node)]
        if parent is not None:
            return DCNode(party, node=node, children=children, parent=tree_party(tree, parent), coordinator=ROOT,
                          **common)
        return DCNode(
            party, node=0, children=children, parent=None, coordinator=ROOT, route=_root_route(tree),
            parties=self.roster[1:], setup=DataCollector(self.leaves, self.scale), stream=self.stream, **common,
        )


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


class QServerState(enum.Enum):
    """States of the Q-k-means server."""

    SETUP = enum.auto()
    COLLECT = enum.auto()
    SERVING = enum.auto()
    DONE = enum.auto()
    ERROR = enum.auto()


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

    State = QServerState
    INITIAL_STATE = QServerState.COLLECT
    TRANSITIONS = {
        (QServerState.SETUP, DataSummary): ("_on_summary", QServerState.SETUP),
        (QServerState.COLLECT, PointUpload): ("_on_upload", QServerState.COLLECT),
        (QServerState.SERVING, RemovalRequest): ("_on_removal", QServerState.SERVING),
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
            self._state = QServerState.SETUP
        self._qkm = QKMeans(config, key=key)
        self._uploads: dict[str, PointUpload] = {}
        self._owner: dict[int, str] = {}
        self._history: list[np.ndarray] = []

    @property
    def phase(self) -> str:
        if self._state is QServerState.SETUP:
            return SETUP_PHASE
        return "upload" if self._state is QServerState.COLLECT else "model"

    def pending(self) -> Sequence[str]:
        if self._state is QServerState.SETUP:
            assert self._setup is not None
            return self._setup.pending()
        if self._state is QServerState.COLLECT:
            return [c for c in self.clients if c not in self._uploads]
        if self._state is QServerState.SERVING:
            return list(self.clients)
        return []

    def _on_summary(self, sender: str, message: DataSummary) -> list[Outgoing]:
        assert self._setup is not None
        self._setup.add(sender, message, self)
        return []

    def _on_upload(self, sender: str, message: PointUpload) -> list[Outgoing]:
        if sender not in self.clients:
            raise _remote(f"{sender} is not a client of this run", sender, self)
        if sender in self._uploads:
            raise _remote(f"second upload from {sender}", sender, self)
        if self._expected_ids:
            first, count = self._expected_ids[sender]
            if not np.array_equal(message.ids, np.arange(first, first + count)):
                raise _remote(f"{sender} uploaded {message.ids.shape[0]} points that are not the {count} with ids "
                              f"{first} .. {first + count - 1} agreed in the setup phase", sender, self)
        if self._uploads and message.points.shape[1] != next(iter(self._uploads.values())).points.shape[1]:
            raise _remote(f"{sender} uploaded points of another dimension", sender, self)
        clash = [int(i) for i in message.ids if int(i) in self._owner]
        if clash:
            raise _remote(f"{sender} uploaded ids already held: {clash[:5]}", sender, self)
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
        if self._state is QServerState.SETUP and self._setup is not None and self._setup.complete:
            agreed = self._setup.agree(self)
            if agreed.n - self.n_deletions < self.config.k:
                raise ValueError(
                    f"{self.n_deletions} deletions of {agreed.n} points would leave fewer than k = {self.config.k}"
                )
            self._expected_ids = {p: (o, c) for p, o, c in zip(agreed.parties, agreed.offsets, agreed.counts)}
            self.move_to(QServerState.COLLECT)
            return [self.send(p, m, phase=SETUP_PHASE) for p, m in agreed.agreements().items()]
        if self._state is QServerState.COLLECT and len(self._uploads) == len(self.clients):
            ups = [self._uploads[c] for c in self.clients]
            x = np.concatenate([u.points for u in ups])
            ids = np.concatenate([u.ids for u in ups])
            if x.shape[0] - self.n_deletions < self.config.k:
                raise ValueError(
                    f"{self.n_deletions} deletions of {x.shape[0]} points would leave fewer than k = {self.config.k}"
                )
            self._qkm.fit(x, ids)
            self.move_to(QServerState.SERVING)
            return self._publish(False)
        return []

    def _on_removal(self, sender: str, message: RemovalRequest) -> list[Outgoing]:
        owner = self._owner.get(message.point_id)
        if owner is not None and owner != sender:
            raise _remote(f"{sender} asked to delete point {message.point_id}, which {owner} owns", sender, self)
        try:
            outcome = self._qkm.delete(message.point_id)
        except DeletionError as exc:
            raise _remote(f"{sender}'s removal request cannot be served: {exc}", sender, self) from exc
        return self._publish(outcome.retrained)


class QKMeansClient(ProtocolMachine):
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
        self.server = server
        self.n_deletions = n_deletions
        if (points is None) == (local is None):
            raise ValueError("give a client either its points (and ids) or its raw local points, not both or neither")
        if local is not None and (stream is None or stream.removals != n_deletions or requests):
            raise ValueError("a client with raw local points draws its requests from the stream's terms")
        self._local, self._stream = local, stream
        if local is not None:
            self._state = QClientState.SETUP
        else:
            self._take(*check_points(points, ids), requests or {})  # type: ignore[arg-type]
        self._retrained: list[bool] = []
        self._expected = 0

    def _take(self, points: np.ndarray, ids: np.ndarray, requests: Mapping[int, int]) -> None:
        self._points, self._ids = points, ids
        held = set(self._ids.tolist())
        self.requests = {int(pos): int(i) for pos, i in requests.items()}
        if any(i not in held for i in self.requests.values()):
            raise ValueError(f"{self.party} can only request deletion of its own points")
        if any(not 0 <= pos < self.n_deletions for pos in self.requests):
            raise ValueError("request positions must lie in the stream")

    @property
    def phase(self) -> str:
        if self._state is QClientState.SETUP:
            return SETUP_PHASE
        return "request" if self.round_idx else "upload"

    def pending(self) -> Sequence[str]:
        return [self.server] if self._state in (QClientState.SETUP, QClientState.WAITING) else []

    def _upload(self) -> Outgoing:
        return self.send(self.server, PointUpload(ids=self._ids, points=self._points), phase="upload")

    def _start(self) -> list[Outgoing]:
        if self._local is not None:
            return [self.send(self.server, self._local.summary(), phase=SETUP_PHASE)]
        return [self._upload()]

    def _on_agreement(self, sender: str, message: DataAgreement) -> list[Outgoing]:
        if sender != self.server:
            raise _remote(f"{sender} is not the server", sender, self)
        assert self._local is not None and self._stream is not None
        try:
            points, ids = self._local.agreed(message)
            requests = self._stream.requests(message.n_points, message.offset, self._local.n)
        except ValueError as exc:
            raise _remote(f"{sender}'s data agreement does not fit {self.party}: {exc}", sender, self) from exc
        self._take(points, ids, requests)
        return [self._upload()]

    def _on_model(self, sender: str, message: ModelUpdate) -> list[Outgoing]:
        if sender != self.server:
            raise _remote(f"{sender} is not the server", sender, self)
        if message.version != self._expected:
            raise _remote(f"model version {message.version}, expected {self._expected}", sender, self)
        if message.version:
            self._retrained.append(message.retrained)
        self._expected += 1
        if message.version == self.n_deletions:
            self._finish(QKMeansClientResult(message.centroids, message.version, tuple(self._retrained)))
            return []
        self.round_idx += 1
        point_id = self.requests.get(message.version)
        if point_id is None:
            return []
        return [self.send(self.server, RemovalRequest(point_id=point_id), phase="request")]


class QKMeansParties:
    """The parties of one Q-k-means run: ``server`` and ``client-<i>``.

    Args:
        parts: each client's ``(points [n_i, d], ids [n_i])``.
        config: hyper-parameters; key: the run's `jax.random` key.
        deletions: the global stream of ids; each request is sent by the client owning the id.

    Raises:
        ValueError: overlapping ids, or a stream that does not fit the data.
    """

    def __init__(
        self,
        parts: Sequence[tuple[np.ndarray, np.ndarray]],
        config: QKMeansConfig,
        *,
        key: jax.Array,
        deletions: Sequence[int] = (),
    ) -> None:
        self.parts = [check_points(x, ids) for x, ids in parts]
        self.clients = tuple(f"client-{i}" for i in range(len(self.parts)))
        owner: dict[int, int] = {}
        for c, (_, ids) in enumerate(self.parts):
            for i in ids.tolist():
                if i in owner:
                    raise ValueError(f"point id {i} is held by two clients")
                owner[i] = c
        self.deletions = check_stream(deletions, owner, len(owner), config.k)
        self.requests: list[dict[int, int]] = [{} for _ in self.parts]
        for pos, i in enumerate(self.deletions):
            self.requests[owner[i]][pos] = i
        self.config, self.key = config, key
        self.roster = (SERVER, *self.clients)

    def role_of(self, party: str) -> str:
        """``server`` or ``client``."""
        return "server" if party == SERVER else "client"

    def make_machine(self, party: str) -> ProtocolMachine:
        """The machine of ``party``.

        Raises:
            ValueError: not a party of this run.
        """
        m = len(self.deletions)
        if party == SERVER:
            return QKMeansServer(SERVER, clients=self.clients, config=self.config, key=self.key, n_deletions=m)
        if party not in self.clients:
            raise ValueError(f"{party!r} is not a party of this run")
        c = self.clients.index(party)
        x, ids = self.parts[c]
        return QKMeansClient(party, server=SERVER, points=x, ids=ids, requests=self.requests[c], n_deletions=m)

    def machines(self) -> dict[str, ProtocolMachine]:
        """Every party's machine, in roster order."""
        return {p: self.make_machine(p) for p in self.roster}


class LocalQKMeansParties:
    """The parties of one curated Q-k-means run whose clients each hold only their own data:
    ``server`` and ``client-<i>``.

    Every machine is built from public terms and, for a client, its own raw points only; the
    setup phase ``setup.data`` (`local_data`) gives the clients their ids and scaling, and each
    client draws its own requests from the stream's terms. The simulation (``fedproto run``) and
    a party process (``fedproto party``) build their machines with this class.

    Args:
        n_clients: clients. config: hyper-parameters; key: the run's `jax.random` key.
        stream: the terms of the deletion stream. scale: ``"minmax"`` or ``"none"``.

    Raises:
        ValueError: fewer than one client.
    """

    def __init__(
        self, n_clients: int, config: QKMeansConfig, *, key: jax.Array, stream: StreamTerms, scale: str
    ) -> None:
        if n_clients < 1:
            raise ValueError("a run needs at least one client")
        self.clients = tuple(f"client-{i}" for i in range(n_clients))
        self.config, self.key, self.stream, self.scale = config, key, stream, scale
        self.roster = (SERVER, *self.clients)

    def role_of(self, party: str) -> str:
        """``server`` or ``client``."""
        return "server" if party == SERVER else "client"

    def make_machine(self, party: str, raw: np.ndarray | None) -> ProtocolMachine:
        """The machine of ``party``, given its own raw points ``[n_i, d]`` (a client) or ``None``
        (the server).

        Raises:
            ValueError: not a party of this run, a client without points, or points for the
                server.
        """
        m = self.stream.removals
        if party == SERVER:
            if raw is not None:
                raise ValueError("the server holds no data until the clients upload theirs")
            return QKMeansServer(SERVER, clients=self.clients, config=self.config, key=self.key, n_deletions=m,
                                 setup=DataCollector(self.clients, self.scale))
        if party not in self.clients:
            raise ValueError(f"{party!r} is not a party of this run")
        if raw is None:
            raise ValueError(f"{party} holds data: give it its own points")
        return QKMeansClient(party, server=SERVER, n_deletions=m, local=LocalPoints(raw, self.scale),
                             stream=self.stream)

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

Where the parts live: this module holds the theory of operation and the plans that build the
parties (:class:`DCTree`, :class:`LocalDCTree`, :class:`QKMeansParties`,
:class:`LocalQKMeansParties`, the last two curated or federated) and re-exports the roles; the
roles of DC-k-means and of curated Q-k-means are in `roles`, federated Q-k-means' in
`federated`, and what they all share (the stream check, the serving party's patience, the
Q-k-means client) in `_base`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from fedproto.algorithms.deletion import roles
from fedproto.algorithms.deletion._base import check_stream
from fedproto.algorithms.deletion._store import check_points
from fedproto.algorithms.deletion.dckmeans import DCKMeansConfig, Tree, assign_leaves
from fedproto.algorithms.deletion.federated import COORDINATOR, QKMeansCoordinator, QKMeansParty
from fedproto.algorithms.deletion.local_data import DataCollector, LocalPoints, StreamTerms
from fedproto.algorithms.deletion.qkmeans import QKMeansConfig
from fedproto.algorithms.deletion.roles import *  # the roles (DCLeaf, DCNode, QKMeansServer, ...): roles.__all__
from fedproto.machine import ProtocolMachine, party_index
from fedproto.star import StarParties, ids_owner

__all__ = [
    "DCTree",
    "LocalDCTree",
    "LocalQKMeansParties",
    "QKMeansParties",
    "check_stream",
]
# The roles as their module lists them, so that a new one needs one entry.
__all__ += roles.__all__


# ----------------------------------------------------------------------------------------- DC


class _TreePlan:
    """What both DC-k-means plans share: the tree is the roster (``root``, ``node-<id>`` for an
    internal node, ``leaf-<j>`` for leaf j, in node order), the role of a party, and the machine
    of each node given what the party holds.

    Args:
        tree: the run's tree. config: hyper-parameters; key: the run's `jax.random` key.
        patience: phase deadlines a serving party waits without input (deletions + 2).

    Attributes:
        roster: every party, index = node id. leaves: the leaves' names, in leaf order.
    """

    def __init__(self, tree: Tree, config: DCKMeansConfig, key: jax.Array, patience: int) -> None:
        self.tree, self.config, self.key, self.patience = tree, config, key, patience
        self.roster = tree_roster(tree)
        self._first_leaf = tree.offset(tree.height)
        self.leaves = self.roster[self._first_leaf:]
        self._node_of = party_index(self.roster)

    def party_of(self, node: int) -> str:
        """The party name of tree node ``node``."""
        return tree_party(self.tree, node)

    def role_of(self, party: str) -> str:
        """``root``, ``node`` or ``leaf``."""
        return party.split("-")[0]

    def _node(self, party: str) -> int:
        """The node id of ``party``.

        Raises:
            ValueError: ``party`` is not in the roster.
        """
        node = self._node_of.get(party)
        if node is None:
            raise ValueError(f"{party!r} is not a party of this tree")
        return node

    def _machine(self, node: int, held: Mapping[str, Any]) -> ProtocolMachine:
        """The machine of tree node ``node``, given ``held``: what the party holds beside the
        public terms (a leaf's points, the root's stream, as :class:`DCLeaf` and :class:`DCNode`
        take them; nothing for an internal node)."""
        tree, cfg, party = self.tree, self.config, self.roster[node]
        parent = tree.parent(node)
        common = {"k": cfg.k, "iterations": cfg.iterations, "key": self.key, "patience": self.patience,
                  "weighted": cfg.weighted}
        if node >= self._first_leaf:
            return DCLeaf(party, node=node, parent=self.party_of(parent), coordinator=ROOT,  # type: ignore[arg-type]
                          **held, **common)
        children = [(self.party_of(c), c) for c in tree.children(node)]
        if parent is not None:
            return DCNode(party, node=node, children=children, parent=self.party_of(parent), coordinator=ROOT,
                          **common)
        return DCNode(party, node=0, children=children, parent=None, coordinator=ROOT, route=root_route(tree),
                      parties=self.roster[1:], **held, **common)


class DCTree(_TreePlan):
    """The parties of one DC-k-means run on the whole data set: names, tree, leaf data, and a
    machine factory.

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
        tree = Tree(config.resolve_width(n), config.height)
        if leaves is None:
            leaf_of = assign_leaves(key, ids, tree.n_leaves)
        else:
            leaf_of = np.asarray(leaves, dtype=np.int64)
            if leaf_of.shape != (n,) or (n and (leaf_of.min() < 0 or leaf_of.max() >= tree.n_leaves)):
                raise ValueError(f"leaves must be [{n}] integers in [0, {tree.n_leaves})")
        self.leaf_of = leaf_of
        self._x, self._ids = x, ids
        self.owners = {int(i): tree_party(tree, tree.leaf_node(int(j))) for i, j in zip(ids, leaf_of)}
        self.deletions = check_stream(deletions, self.owners, n, config.k)
        super().__init__(tree, config, key, len(self.deletions) + 2)

    def make_machine(self, party: str) -> ProtocolMachine:
        """The machine of ``party`` (only this party's data is handed to it).

        Raises:
            ValueError: ``party`` is not in the roster.
        """
        node = self._node(party)
        held: dict[str, Any] = {}
        if node == 0:
            held = {"deletions": self.deletions, "owners": self.owners}
        elif node >= self._first_leaf:
            mask = self.leaf_of == node - self._first_leaf
            held = {"points": self._x[mask], "ids": self._ids[mask]}
        return self._machine(node, held)

    def machines(self) -> dict[str, ProtocolMachine]:
        """Every party's machine, in roster order."""
        return {p: self.make_machine(p) for p in self.roster}


class LocalDCTree(_TreePlan):
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
        super().__init__(Tree(config.width, config.height), config, key, stream.removals + 2)
        self.stream, self.scale = stream, scale

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
        if tuple(roster) != tree_roster(tree):
            raise ValueError(f"the roster ({', '.join(roster)}) is not a DC-k-means tree of width {found} and "
                             f"height {height}")
        return found

    def make_machine(self, party: str, raw: np.ndarray | None) -> ProtocolMachine:
        """The machine of ``party``, given its own raw points ``[n_j, d]`` (a leaf) or ``None``
        (the root and internal nodes hold no data).

        Raises:
            ValueError: ``party`` is not in the roster, a leaf without points, or points for a
                party that holds none.
        """
        node = self._node(party)
        held: dict[str, Any] = {}
        if node >= self._first_leaf:
            if raw is None:
                raise ValueError(f"{party} holds data: give it its own points")
            held = {"local": LocalPoints(raw, self.scale)}
        elif raw is not None:
            raise ValueError(f"{party} holds no data in a DC-k-means tree (only the leaves do)")
        elif node == 0:
            held = {"setup": DataCollector(self.leaves, self.scale), "stream": self.stream}
        return self._machine(node, held)

    def machine_factory(self, held: Mapping[str, np.ndarray]) -> Callable[[str], ProtocolMachine]:
        """``make_machine(party)`` for a :class:`~fedproto.plugin.RunPlan`: every party built from
        what it holds in ``held`` (``{leaf: rows [n_j, d]}``; a party absent there holds nothing),
        as `fedproto.star.StarParties.machine_factory`."""
        return lambda party: self.make_machine(party, held.get(party))


# ------------------------------------------------------------------------------------------- Q


class _QKMeansStar(StarParties):
    """What every Q-k-means plan shares: the hub by variant (the curating ``server``, or the
    federated ``coordinator`` without data) and ``client-<i>``, and the machine of each role
    given what the party holds.

    Args:
        n_clients: clients. config: hyper-parameters; key: the run's `jax.random` key.
        federated: the points stay at the clients (`federated`), else the server curates them
            (`roles`).

    Raises:
        ValueError: fewer than one client.
    """

    def __init__(self, n_clients: int, config: QKMeansConfig, key: jax.Array, *, federated: bool) -> None:
        if n_clients < 1:
            raise ValueError("a federation needs at least one party" if federated else "a run needs at least one client")
        super().__init__(n_clients, hub=COORDINATOR if federated else SERVER)
        self.config, self.key, self.federated = config, key, federated

    def _hub_with(self, n_deletions: int, **held: Any) -> ProtocolMachine:
        """The hub's machine; ``held``: what it holds beside the public terms (the federated
        coordinator's ``d`` and ``owners``, or either hub's ``setup``)."""
        if self.federated:
            return QKMeansCoordinator(self.hub, parties=self.clients, config=self.config, key=self.key,
                                      n_deletions=n_deletions, **held)
        return QKMeansServer(self.hub, clients=self.clients, config=self.config, key=self.key,
                             n_deletions=n_deletions, **held)

    def _client_with(self, party: str, n_deletions: int, **held: Any) -> ProtocolMachine:
        """The machine of client ``party``; ``held``: its points (``points``, ``ids`` and
        ``requests``, or ``local`` and ``stream``)."""
        if self.federated:
            return QKMeansParty(party, coordinator=self.hub, config=self.config, key=self.key,
                                n_deletions=n_deletions, **held)
        return QKMeansClient(party, server=self.hub, n_deletions=n_deletions, **held)


class QKMeansParties(_QKMeansStar):
    """The parties of one Q-k-means run on the whole data set: ``server`` (curated) or
    ``coordinator`` (``federated``), and ``client-<i>``.

    Args:
        parts: each client's ``(points [n_i, d], ids [n_i])`` (a federated part may be empty).
        config: hyper-parameters; key: the run's `jax.random` key.
        deletions: the global stream of ids; each request is sent by the client owning the id.
        federated: the points stay at the clients (`federated`), else the server curates them.

    Attributes:
        owners: point id -> the client holding it. deletions: the checked stream.

    Raises:
        ValueError: no parts, (federated) parts of different dimensions, ids held twice, or a
            stream that does not fit the data (unknown ids, repeats, fewer than k points left).
    """

    def __init__(
        self,
        parts: Sequence[tuple[np.ndarray, np.ndarray]],
        config: QKMeansConfig,
        *,
        key: jax.Array,
        deletions: Sequence[int] = (),
        federated: bool = False,
    ) -> None:
        super().__init__(len(parts), config, key, federated=federated)
        self.parts = [check_points(x, ids) for x, ids in parts]
        if federated:
            dims = {x.shape[1] for x, _ in self.parts}
            if len(dims) != 1:
                raise ValueError(f"the parties' points have different dimensions {sorted(dims)}")
            self.d = dims.pop()
        owner = ids_owner([ids for _, ids in self.parts])
        self.owners = {i: self.clients[c] for i, c in owner.items()}
        self.deletions = check_stream(deletions, owner, len(owner), config.k)
        self._requests: list[dict[int, int]] = [{} for _ in self.parts]
        for pos, i in enumerate(self.deletions):
            self._requests[owner[i]][pos] = i

    def hub_machine(self) -> ProtocolMachine:
        """The server (curated) or the coordinator with ``d`` and the id table (federated)."""
        held = {"d": self.d, "owners": self.owners} if self.federated else {}
        return self._hub_with(len(self.deletions), **held)

    def client_machine(self, index: int, party: str, data: Any) -> ProtocolMachine:
        """Client ``party`` with its part and the requests of its points."""
        x, ids = self.parts[index]
        return self._client_with(party, len(self.deletions), points=x, ids=ids, requests=self._requests[index])


class LocalQKMeansParties(_QKMeansStar):
    """The parties of one Q-k-means run whose clients each hold only their own data: ``server``
    (curated) or ``coordinator`` (``federated``), and ``client-<i>``.

    Every machine is built from public terms and, for a client, its own raw points only; the
    setup phase ``setup.data`` (`local_data`) gives the clients their ids and scaling (and the
    federated coordinator d, n and the id table), and each client draws its own requests from
    the stream's terms. The simulation (``fedproto run``) and a party process (``fedproto
    party``) build their machines with this class: :meth:`make_machine` takes the party and its
    raw points ``[n_i, d]`` (``None`` for the hub), :meth:`machine_factory` a ``{party: rows}``.

    Args:
        n_clients: clients. config: hyper-parameters; key: the run's `jax.random` key.
        stream: the terms of the deletion stream. scale: ``"minmax"`` or ``"none"``.
        federated: the points stay at the clients (`federated`), else the server curates them.

    Raises:
        ValueError: fewer than one client.
    """

    own_data = True

    def __init__(
        self, n_clients: int, config: QKMeansConfig, *, key: jax.Array, stream: StreamTerms, scale: str,
        federated: bool = False,
    ) -> None:
        super().__init__(n_clients, config, key, federated=federated)
        self.stream, self.scale = stream, scale

    def hub_machine(self) -> ProtocolMachine:
        """The hub, which first runs the setup phase with the clients."""
        return self._hub_with(self.stream.removals, setup=DataCollector(self.clients, self.scale))

    def client_machine(self, index: int, party: str, data: Any) -> ProtocolMachine:
        """Client ``party`` holding its raw points ``data`` ``[n_i, d]``."""
        return self._client_with(party, self.stream.removals, local=LocalPoints(data, self.scale), stream=self.stream)

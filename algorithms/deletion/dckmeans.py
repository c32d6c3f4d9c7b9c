"""DC-k-means (divide and conquer) with exact deletion.

Theory of operation (Ginart et al. 2019, Sec. 4.2, Alg. 2 and 6, App. B.2, C.2; spec
deletion-kmeans.md section 2):

The tree is a perfect w-ary tree of height h (the paper's experiments: h = 1, one root over w
leaves). Every point goes to a leaf drawn uniformly at random, here ``randint(fold_in(K_leaf,
id), 0, w^h)``: a function of the point's stable id and the key only, independent of the values
and of the deletion requests. Every node runs "k-means++(dataset, k, T)": k-means++ seeding
(Gumbel-max over ids, `_kernels.kmeanspp_seeding`) and T = 10 plain Lloyd iterations (fixed count,
no early stop), with its own key ``fold_in(K_node, node_id)``. A leaf's dataset is its points; an
internal node's dataset is the union of its children's centroids, unweighted (each centroid counts
once). The root's k centroids are the model.

Deletion (`DCKMeans.delete`): remove the point from its leaf, recompute that leaf and each of its
ancestors, bottom-up; nothing else is touched (h + 1 node runs). Because leaf membership is a
function of the id and each node's randomness is its own, the result *equals* training from
scratch on the remaining data with the same key (oracle O-DC-1).

Edge cases the paper leaves open (spec 2.1 [design]): a node with at most k distinct points
outputs those points (k-means++ runs out of D^2 mass), an empty leaf outputs nothing, and a parent
accepts a variable number of rows. Width: ``width=None`` follows the paper's rule
``w = 2^round(log2(n^0.3))``, re-evaluated after each deletion; a change retrains the whole tree
(App. C.2.2). A given partition (``fit(..., leaves=...)``: the data each client already holds)
fixes the leaves; exactness then holds given the partition, but the paper's size-biased runtime
analysis no longer applies (spec 2.3, federated reality check).

Weighted variant (``DCKMeansConfig(weighted=True)``; spec 2.3 "optional weighted variant", not in
the paper, whose default is unweighted): every node also outputs the mass of each of its
centroids (a leaf: how many of its points are nearest to it; above: the summed masses of the
child centroids nearest to it), and an internal node clusters its children's centroids weighted
by those masses: k-means++ draws with probability proportional to ``mass * D^2`` and Lloyd's
moves each centroid to the mass-weighted mean (`node_output`). Leaves compute exactly what they
compute unweighted. Deletion is unchanged (the leaf-to-root path), and so is exactness.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from fedproto.algorithms import kmeans
from fedproto.algorithms.deletion import _kernels, _variant_kernels
from fedproto.algorithms.deletion._store import DeletionError, DeletionOutcome, PointStore, check_points

__all__ = [
    "DCKMeans",
    "DCKMeansConfig",
    "Tree",
    "assign_leaves",
    "default_width",
    "node_key",
    "node_kmeans",
    "node_output",
    "stack_children",
]

#: ``fold_in`` constants that split a run's key (disjoint from Q-k-means' 1 and 2).
LEAF_STREAM = 3
NODE_STREAM = 4


def default_width(n: int, rho: float = 0.3) -> int:
    """The paper's number of leaves ``w = 2^round(log2(n^rho))``.

    References:
        Ginart et al., App. D.1.2; spec 5.1 and O-DC-5 (16 for n = 12,009; 32 for 60,000; 64 for
        1,018,298).
    """
    if n < 1:
        raise ValueError("n must be positive")
    return 2 ** round(rho * math.log2(n))


@dataclasses.dataclass(frozen=True)
class DCKMeansConfig:
    """Hyper-parameters of DC-k-means.

    Attributes:
        k: clusters, at every node.
        iterations: Lloyd iterations T at every node (paper: 10).
        width: branching factor w, or ``None`` for `default_width` (then h must be 1).
        height: tree height h (paper: 1); there are ``w^h`` leaves.
        rho: exponent of the width rule.
        weighted: internal nodes cluster their children's centroids weighted by cluster mass
            (spec 2.3's optional variant); ``False`` (default) is the paper's unweighted merge.
    """

    k: int
    iterations: int = 10
    width: int | None = None
    height: int = 1
    rho: float = 0.3
    weighted: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError("k must be a positive integer")
        if not isinstance(self.iterations, int) or self.iterations < 0:
            raise ValueError("iterations must be a non-negative integer")
        if self.width is not None and (not isinstance(self.width, int) or self.width < 1):
            raise ValueError("width must be a positive integer")
        if not isinstance(self.height, int) or self.height < 1:
            raise ValueError("height must be a positive integer")
        if self.width is None and self.height != 1:
            raise ValueError("the width rule is defined for height 1; give a width for taller trees")
        if not 0 < self.rho < 1:
            raise ValueError("rho must lie in (0, 1)")
        if not isinstance(self.weighted, bool):
            raise TypeError("weighted must be a bool")

    def resolve_width(self, n: int) -> int:
        """The branching factor used for ``n`` points."""
        return self.width if self.width is not None else default_width(n, self.rho)


@dataclasses.dataclass(frozen=True)
class Tree:
    """A perfect w-ary tree of height h, nodes numbered breadth-first (root 0).

    Attributes:
        width: branching factor w; height: h.
    """

    width: int
    height: int

    def offset(self, level: int) -> int:
        """Id of the first node of ``level`` (root level 0)."""
        return sum(self.width**j for j in range(level))

    @property
    def n_leaves(self) -> int:
        return self.width**self.height

    @property
    def n_nodes(self) -> int:
        return self.offset(self.height + 1)

    def level_of(self, node: int) -> int:
        level = 0
        while node >= self.offset(level + 1):
            level += 1
        return level

    def leaf_node(self, leaf: int) -> int:
        """Node id of leaf number ``leaf`` (``0 <= leaf < w^h``)."""
        return self.offset(self.height) + leaf

    def parent(self, node: int) -> int | None:
        """The parent's node id (``None`` for the root)."""
        level = self.level_of(node)
        if level == 0:
            return None
        return self.offset(level - 1) + (node - self.offset(level)) // self.width

    def children(self, node: int) -> tuple[int, ...]:
        """Children's node ids, in order (empty for a leaf)."""
        level = self.level_of(node)
        if level == self.height:
            return ()
        first = self.offset(level + 1) + (node - self.offset(level)) * self.width
        return tuple(range(first, first + self.width))

    def path(self, leaf: int) -> tuple[int, ...]:
        """Node ids from leaf number ``leaf`` up to the root."""
        out = [self.leaf_node(leaf)]
        while (p := self.parent(out[-1])) is not None:
            out.append(p)
        return tuple(out)

    def internal_nodes(self) -> tuple[int, ...]:
        """Internal nodes, deepest level first (the order of a bottom-up pass)."""
        return tuple(
            node
            for level in range(self.height - 1, -1, -1)
            for node in range(self.offset(level), self.offset(level + 1))
        )


def node_key(key: jax.Array, node: int) -> jax.Array:
    """The key of tree node ``node``: ``fold_in(fold_in(key, 4), node)``."""
    return jax.random.fold_in(jax.random.fold_in(key, NODE_STREAM), node)


def assign_leaves(key: jax.Array, ids: np.ndarray, n_leaves: int) -> np.ndarray:
    """Leaf number of each id, ``[n]`` int64 in ``[0, n_leaves)`` (keyed, value-independent)."""
    n = len(ids)
    # Padded to a power of two: the kernel is cheap, and a deletion stream then meets one shape.
    padded = np.zeros(max(64, 1 << (n - 1).bit_length()), dtype=np.uint32)
    padded[:n] = ids
    leaves = _kernels.leaf_assignment(jax.random.fold_in(key, LEAF_STREAM), jnp.asarray(padded), n_leaves)
    return np.asarray(leaves, dtype=np.int64)[:n]


def stack_children(centroids: list[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """An internal node's dataset: its children's centroids stacked in child order (unweighted),
    with slot ids ``position * k + row`` (stable while a child keeps its position).

    Args:
        centroids: each child's ``[r_c, d]`` output, in child order (``r_c <= k``).
        k: clusters.

    Returns:
        ``(points [sum r_c, d] float64, ids [sum r_c] int64)``.
    """
    slots = [position * k + np.arange(c.shape[0]) for position, c in enumerate(centroids)]
    return np.concatenate(centroids), np.concatenate(slots).astype(np.int64)


def node_kmeans(key: jax.Array, points: np.ndarray, ids: np.ndarray, k: int, iterations: int) -> np.ndarray:
    """One node's "k-means++(dataset, k, T)": keyed k-means++ seeding, then T Lloyd iterations.

    Args:
        key: the node's key.
        points: ``[m, d]`` float64, the node's dataset (rows in a fixed order).
        ids: ``[m]`` stable ids of the rows (point ids at a leaf, child slots above).
        k: clusters; iterations: T.

    Returns:
        ``[r, d]`` float64 centroids with ``r = min(k, distinct points)``: with at most k distinct
        points the node outputs those points, unchanged.

    References:
        Ginart et al., Alg. 2; spec 2.1.
    """
    points = np.asarray(points, dtype=np.float64)
    if points.shape[0] == 0:
        return np.zeros((0, points.shape[1]))
    xp, ip, valid = _kernels.pad_rows(points, ids)
    rows, count = _kernels.kmeanspp_seeding(key, xp, ip, valid, k)
    rows, count = np.asarray(rows), int(count)
    if count < k:
        return points[rows[:count]]
    return np.asarray(_kernels.lloyd_iterations(xp, valid, jnp.asarray(points[rows]), k, iterations))


def node_output(
    key: jax.Array,
    points: np.ndarray,
    ids: np.ndarray,
    k: int,
    iterations: int,
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One node's output in the weighted variant: centroids and the mass of each.

    A leaf (``weights=None``) computes `node_kmeans` on its points, unchanged, and counts the
    points nearest to each centroid. An internal node clusters its dataset (its children's
    centroids) weighted by ``weights`` (their masses): keyed k-means++ with probability
    proportional to ``mass * D^2`` (`fedproto.algorithms.kmeans.kmeanspp_seeding` with weights), then T weighted
    Lloyd iterations; with at most k distinct rows of positive mass it outputs those rows.

    Args:
        key: the node's key.
        points: ``[m, d]`` float64 dataset; ids: ``[m]`` stable ids (point ids or child slots).
        k: clusters; iterations: T.
        weights: ``[m]`` non-negative float64 masses, or ``None`` for a leaf (unit weights).

    Returns:
        ``(centroids [r, d] float64, masses [r] float64)`` with ``r <= k``; the masses sum to the
        total weight (the leaf's point count).

    Raises:
        ValueError: weights of the wrong shape, negative or not finite.

    References:
        Ginart et al., Alg. 2 (node computation) and Sec. 4.2 (mass weighting as an extension);
        spec 2.3.
    """
    points = np.asarray(points, dtype=np.float64)
    m, d = points.shape
    if weights is not None:
        weights = np.asarray(weights, dtype=np.float64)
        if weights.shape != (m,) or not np.all(np.isfinite(weights)) or np.any(weights < 0):
            raise ValueError(f"weights must be [{m}] finite non-negative masses")
    if m == 0:
        return np.zeros((0, d)), np.zeros(0)
    xp, ip, valid = _kernels.pad_rows(points, ids)
    wp = np.zeros(xp.shape[0])
    wp[:m] = 1.0 if weights is None else weights
    wj = jnp.asarray(wp)
    if weights is None:
        centroids = node_kmeans(key, points, ids, k, iterations)
    else:
        rows, count = kmeans.kmeanspp_seeding(key, xp, ip, valid, k, weights=wj)
        rows, count = np.asarray(rows), int(count)
        if count < k:
            centroids = points[rows[:count]]
        else:
            centroids = np.asarray(
                _variant_kernels.weighted_lloyd_iterations(xp, wj, jnp.asarray(points[rows]), k, iterations)
            )
    if centroids.shape[0] == 0:
        return centroids, np.zeros(0)
    masses = _variant_kernels.cluster_masses(xp, wj, jnp.asarray(centroids), centroids.shape[0])
    return centroids, np.asarray(masses)


class DCKMeans:
    """DC-k-means with exact deletion: train the tree once, then serve deletion requests.

    Args:
        config: hyper-parameters.
        seed: seed of the run's key (ignored when ``key`` is given).
        key: the run's `jax.random` key.

    Attributes:
        tree: the current `Tree`.
        leaves: one `PointStore` per leaf.
        centroids_of: node id -> its output centroids ``[r, d]``.
        counts_of: node id -> the mass of each output centroid ``[r]`` (weighted variant only).
        version: node id -> how many times the node was computed.
        node_runs: node computations since `fit` (training included).
        retrained: deletions that rebuilt the whole tree (width changes).
        outcomes: every `DeletionOutcome`, in order.
    """

    def __init__(self, config: DCKMeansConfig, *, seed: int = 0, key: jax.Array | None = None) -> None:
        self.config = config
        self.key = key if key is not None else jax.random.PRNGKey(seed)
        self.tree: Tree | None = None
        self.leaves: list[PointStore] = []
        self.centroids_of: dict[int, np.ndarray] = {}
        self.counts_of: dict[int, np.ndarray] = {}
        self.version: dict[int, int] = {}
        self.node_runs = 0
        self.retrained = 0
        self.outcomes: list[DeletionOutcome] = []
        self._leaf_of: dict[int, int] = {}
        self._given_leaves = False
        self._deleted: set[int] = set()
        self._node_keys: dict[int, jax.Array] = {}

    # -- training ---------------------------------------------------------------------------------

    def fit(self, x: np.ndarray, ids: np.ndarray | None = None, *, leaves: np.ndarray | None = None) -> "DCKMeans":
        """Build the tree on ``x`` and train every node.

        Args:
            x: ``[n, d]`` points; ids: ``[n]`` stable ids (default ``0..n-1``).
            leaves: optional ``[n]`` leaf number of each point (a given partition, e.g. the data
                each client holds), in ``[0, w^h)``; requires ``config.width``.

        Raises:
            ValueError: bad points, ids or leaves; k > n.
        """
        x, ids = check_points(x, ids)
        n = x.shape[0]
        if n < self.config.k:
            raise ValueError(f"k = {self.config.k} is larger than the number of points n = {n}")
        tree = Tree(self.config.resolve_width(n), self.config.height)
        if leaves is None:
            leaf_of = assign_leaves(self.key, ids, tree.n_leaves)
        else:
            if self.config.width is None:
                raise ValueError("a given partition needs an explicit width")
            leaf_of = np.asarray(leaves)
            if leaf_of.shape != (n,) or leaf_of.dtype.kind not in "iu":
                raise ValueError(f"leaves must be [{n}] integers")
            if n and (leaf_of.min() < 0 or leaf_of.max() >= tree.n_leaves):
                raise ValueError(f"leaves must lie in [0, {tree.n_leaves})")
        self._given_leaves = leaves is not None
        self._build(tree, x, ids, leaf_of.astype(np.int64))
        self.retrained = 0
        self.outcomes = []
        self._deleted = set()
        return self

    def _build(self, tree: Tree, x: np.ndarray, ids: np.ndarray, leaf_of: np.ndarray) -> None:
        self.tree = tree
        self.leaves = [PointStore(x[leaf_of == j], ids[leaf_of == j]) for j in range(tree.n_leaves)]
        self._leaf_of = dict(zip(ids.tolist(), leaf_of.tolist()))
        self.centroids_of, self.counts_of, self.version, self.node_runs = {}, {}, {}, 0
        for leaf in range(tree.n_leaves):
            self._compute(tree.leaf_node(leaf))
        for node in tree.internal_nodes():
            self._compute(node)

    def dataset_of(self, node: int) -> tuple[np.ndarray, np.ndarray]:
        """A node's dataset ``(points [m, d], ids [m])``: its points at a leaf; above, its
        children's centroids stacked in child order with slot ids ``position * k + row``."""
        assert self.tree is not None
        level = self.tree.level_of(node)
        if level == self.tree.height:
            store = self.leaves[node - self.tree.offset(level)]
            return store.x, store.ids
        return stack_children([self.centroids_of[child] for child in self.tree.children(node)], self.config.k)

    def weights_of(self, node: int) -> np.ndarray | None:
        """A node's row masses in the weighted variant (``None`` at a leaf: unit weights): its
        children's masses stacked in child order, like `dataset_of`.

        Raises:
            ValueError: the model is not weighted.
        """
        if not self.config.weighted:
            raise ValueError("weights exist only in the weighted variant")
        assert self.tree is not None
        if self.tree.level_of(node) == self.tree.height:
            return None
        return np.concatenate([self.counts_of[child] for child in self.tree.children(node)])

    def _compute(self, node: int) -> None:
        points, ids = self.dataset_of(node)
        if points.shape[0] == 0:
            points = np.zeros((0, self.d))
        if node not in self._node_keys:
            self._node_keys[node] = node_key(self.key, node)
        cfg = self.config
        if cfg.weighted:
            self.centroids_of[node], self.counts_of[node] = node_output(
                self._node_keys[node], points, ids, cfg.k, cfg.iterations, self.weights_of(node)
            )
        else:
            self.centroids_of[node] = node_kmeans(self._node_keys[node], points, ids, cfg.k, cfg.iterations)
        self.version[node] = self.version.get(node, 0) + 1
        self.node_runs += 1

    # -- views ------------------------------------------------------------------------------------

    @property
    def d(self) -> int:
        return self.leaves[0].d if self.leaves else 0

    @property
    def n(self) -> int:
        """Points held."""
        return sum(store.n for store in self.leaves)

    @property
    def centroids(self) -> np.ndarray:
        """The model: the root's centroids ``[<= k, d]``."""
        if self.tree is None:
            raise DeletionError("the model is not trained yet: call fit() first")
        return self.centroids_of[0]

    def leaf_of(self, point_id: int) -> int:
        """The leaf number holding ``point_id``.

        Raises:
            DeletionError: unknown or already deleted id.
        """
        if isinstance(point_id, bool) or not isinstance(point_id, int | np.integer):
            raise DeletionError(f"point id must be an integer, got {point_id!r}")
        leaf = self._leaf_of.get(int(point_id))
        if leaf is None:
            if int(point_id) in self._deleted:
                raise DeletionError(f"point {point_id} was already deleted", point_id=int(point_id))
            raise DeletionError(f"point {point_id} is not in the data set", point_id=int(point_id))
        return leaf

    # -- deletion ---------------------------------------------------------------------------------

    def delete(self, point_id: int) -> DeletionOutcome:
        """Delete one point exactly: recompute its leaf-to-root path (or, if w changes, the tree).

        Returns:
            The outcome; ``nodes`` lists the recomputed nodes (leaf first).

        Raises:
            DeletionError: not trained yet, unknown or already deleted id, or fewer than k points
                would remain; the model is then unchanged.

        References:
            Ginart et al., Alg. 6; spec 2.2.
        """
        if self.tree is None:
            raise DeletionError("delete() before fit(): there is no model to delete from", point_id=point_id)
        leaf = self.leaf_of(point_id)
        point_id = int(point_id)
        n = self.n
        if n - 1 < self.config.k:
            raise DeletionError(
                f"deleting point {point_id} would leave {n - 1} points, fewer than k = {self.config.k}",
                point_id=point_id,
            )
        store = self.leaves[leaf]
        row = store.row_of(point_id)
        if not self._given_leaves and self.config.resolve_width(n - 1) != self.tree.width:
            x = np.concatenate([s.x for s in self.leaves])
            ids = np.concatenate([s.ids for s in self.leaves])
            keep = ids != point_id
            x, ids = x[keep], ids[keep]
            order = np.argsort(ids, kind="stable")
            x, ids = x[order], ids[order]
            tree = Tree(self.config.resolve_width(n - 1), self.config.height)
            self._build(tree, x, ids, assign_leaves(self.key, ids, tree.n_leaves))
            self.retrained += 1
            outcome = DeletionOutcome(point_id, True, "width changed", tuple(range(tree.n_nodes)))
        else:
            store.remove(row)
            del self._leaf_of[point_id]
            path = self.tree.path(leaf)
            for node in path:
                self._compute(node)
            outcome = DeletionOutcome(point_id, False, "path", path)
        self._deleted.add(point_id)
        self.outcomes.append(outcome)
        return outcome

"""Wire messages of the deletion protocols (spec deletion-kmeans.md, section 2.3).

DC-k-means (a tree of parties):

* :class:`NodeCentroids` child -> parent: a node's output centroids ``float64 [r, d]``
  (``r <= k``), with the node id and how many times the node has been computed;
* :class:`RemovalRequest` root (coordinator) -> the leaf holding the point: delete ``point_id``;
* :class:`ModelUpdate` root -> every party, once at the end: the final model.

Weighted DC-k-means (``--weighted``): :class:`WeightedNodeCentroids` replaces
:class:`NodeCentroids`; it also carries the k cluster masses (``k * 8`` more payload bytes).

Q-k-means (a server holding the pooled data, clients owning their points):

* :class:`PointUpload` client -> server: the client's points and their stable ids;
* :class:`ModelUpdate` server -> every client: the model after training and after each deletion;
* :class:`RemovalRequest` client -> server: delete one of the client's own points.

Federated Q-k-means (a coordinator without data, parties holding their points; spec 2.3):

* :class:`SeedStep` coordinator -> every party: step s of k-means++ (with the centre chosen at
  step s - 1);
* :class:`SeedScore` party -> coordinator: the party's best Gumbel score at step s and its id;
* :class:`SeedPick` coordinator -> the winning party: send that point;
* :class:`SeedPoint` winning party -> coordinator: the point's coordinates;
* :class:`IterationCentroids` coordinator -> every party: the centroids of Lloyd round j;
* :class:`ClusterStatistics` party -> coordinator: per-cluster sums, counts and the local loss;
* :class:`PointRemoval` owning party -> coordinator: delete this point (id and coordinates);
* :class:`ModelUpdate` coordinator -> every party: the model after training and each deletion.

The setup phase ``setup.data`` of a run whose parties each hold only their own data (every
protocol above; `fedproto.algorithms.deletion.local_data`):

* :class:`DataSummary` data-holding party -> coordinator (the root, the server or the
  coordinator): how many points and features the party holds and, with min-max scaling, the
  per-feature minimum and maximum of its raw points;
* :class:`DataAgreement` coordinator -> each data-holding party: the federation's n, the first id
  of this party's points, and the federation's per-feature extent.
"""

from __future__ import annotations


import numpy as np

from fedproto.messages import Message, array_field

__all__ = [
    "ClusterStatistics",
    "DataAgreement",
    "DataSummary",
    "IterationCentroids",
    "ModelUpdate",
    "NodeCentroids",
    "PointRemoval",
    "PointUpload",
    "RemovalRequest",
    "SeedPick",
    "SeedPoint",
    "SeedScore",
    "SeedStep",
    "WeightedNodeCentroids",
]

_MAX_ID = 2**32


def _check_id(value: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX_ID:
        raise ValueError(f"{what} must be an integer in [0, 2^32)")


def _check_count(value: int, what: str, minimum: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}")


def _check_real(value: float, what: str) -> None:
    """``value`` is a Python float or int (not a bool); its range is the caller's check."""
    if isinstance(value, bool) or not isinstance(value, float | int):
        raise TypeError(f"{what} must be a float")


def _check_finite(array: np.ndarray, what: str) -> None:
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{what} contain NaN or infinite values")


def _check_counts(counts: np.ndarray, rows: int, per: str) -> None:
    """``counts`` holds one finite, non-negative entry per row (``[rows]``); ``per`` names a row."""
    if counts.shape != (rows,):
        raise ValueError(f"counts must have one entry per {per}")
    _check_finite(counts, "counts")
    if np.any(counts < 0):
        raise ValueError("counts must be non-negative")


def _check_point(point: np.ndarray) -> None:
    """``point`` holds d >= 1 finite coordinates."""
    if point.shape[0] < 1:
        raise ValueError("point must have d >= 1 coordinates")
    _check_finite(point, "point")


def _check_centroids(centroids: np.ndarray) -> None:
    if centroids.ndim != 2 or centroids.shape[1] < 1:
        raise ValueError(f"centroids must have shape [r, d] with d >= 1, got {centroids.shape}")
    _check_finite(centroids, "centroids")


class RemovalRequest(Message, tag="del.remove"):
    """Delete the point with stable id ``point_id``."""

    point_id: int

    def __post_init__(self) -> None:
        _check_id(self.point_id, "point_id")


class _NodeOutput(Message):
    """Base of the two uploads of DC-k-means (:class:`NodeCentroids`, :class:`WeightedNodeCentroids`):
    the ``centroids`` ``float64 [r, d]`` of node ``node`` at ``version`` (1 after training, +1 per
    recomputation). It has no tag: it is never sent itself.

    Raises:
        ValueError: ``node`` or ``version`` not an int >= 1 (the root, node 0, uploads nothing), or
            centroids that are not ``[r, d]`` with ``d >= 1`` or hold NaN or inf.
    """

    node: int
    version: int
    centroids: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        _check_count(self.node, "node", 1)  # the root (node 0) sends no NodeCentroids
        _check_count(self.version, "version", 1)
        _check_centroids(self.centroids)


class NodeCentroids(_NodeOutput, tag="del.node"):
    """A tree node's output: ``centroids`` ``float64 [r, d]`` of node ``node`` at ``version``
    (1 after training, +1 per recomputation)."""



class ModelUpdate(Message, tag="del.model"):
    """The model after ``version`` deletions: ``centroids`` ``float64 [r, d]``; ``retrained``
    says whether the last deletion retrained from scratch (False after training)."""

    version: int
    retrained: bool
    centroids: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        _check_count(self.version, "version")
        if not isinstance(self.retrained, bool):
            raise TypeError("retrained must be a bool")
        _check_centroids(self.centroids)


class PointUpload(Message, tag="del.upload"):
    """A client's points ``float64 [n_i, d]`` and their stable ids ``int64 [n_i]``."""

    ids: np.ndarray = array_field("int64", 1)
    points: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        if self.points.ndim != 2 or self.ids.shape != (self.points.shape[0],):
            raise ValueError("ids must have one entry per row of points")
        if self.ids.size and (self.ids.min() < 0 or self.ids.max() >= _MAX_ID):
            raise ValueError("ids must lie in [0, 2^32)")
        _check_finite(self.points, "points")


class WeightedNodeCentroids(_NodeOutput, tag="del.wnode"):
    """A tree node's output in the weighted variant: ``centroids`` ``float64 [r, d]`` and the mass
    of each (``counts`` ``float64 [r]``: points at a leaf, summed child masses above)."""

    counts: np.ndarray = array_field("float64", 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_counts(self.counts, self.centroids.shape[0], "centroid")


class SeedStep(Message, tag="del.qseed"):
    """Step ``step`` of keyed k-means++: first add ``centre`` (``float64 [1, d]``, the point
    chosen at step ``step - 1``; ``[0, d]`` at step 0) to the chosen centres, then score."""

    step: int
    centre: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        _check_count(self.step, "step")
        if self.centre.shape[0] != (1 if self.step else 0) or self.centre.shape[1] < 1:
            raise ValueError("centre must have shape [1, d] after step 0 and [0, d] at step 0")
        _check_finite(self.centre, "centre")


class _SeedMessage(Message):
    """Base of the three messages of keyed k-means++ about one point (:class:`SeedScore`,
    :class:`SeedPick`, :class:`SeedPoint`): step ``step`` and the point's id ``point_id``. It has
    no tag: it is never sent itself.

    Raises:
        ValueError: ``step`` not an int >= 0, or ``point_id`` not an int in ``[0, 2^32)``.
    """

    step: int
    point_id: int

    def __post_init__(self) -> None:
        _check_count(self.step, "step")
        _check_id(self.point_id, "point_id")


class SeedScore(_SeedMessage, tag="del.qscore"):
    """A party's best score ``log u_j + g_j`` at step ``step`` and the id of that point;
    ``score = -inf`` when the party has no point of positive weight (``point_id`` is then 0)."""

    score: float

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_real(self.score, "score")
        if self.score != self.score or self.score == float("inf"):
            raise ValueError("score must be finite or -inf")


class SeedPick(_SeedMessage, tag="del.qpick"):
    """The coordinator chose point ``point_id`` at step ``step``: its owner sends it."""



class SeedPoint(_SeedMessage, tag="del.qpoint"):
    """The chosen point of step ``step``: ``point`` ``float64 [d]``."""

    point: np.ndarray = array_field("float64", 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_point(self.point)


class IterationCentroids(Message, tag="del.qcent"):
    """The centroids ``chat_j`` of Lloyd round ``iteration`` (j = 0: the un-quantised seeds),
    ``float64 [k, d]``: assign your points to them and reply with :class:`ClusterStatistics`."""

    iteration: int
    centroids: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        _check_count(self.iteration, "iteration")
        _check_centroids(self.centroids)


class ClusterStatistics(Message, tag="del.qstats"):
    """A party's statistics of round ``iteration``: per-cluster ``sums`` ``float64 [k, d]``,
    ``counts`` ``int64 [k]`` and the local loss (sum of squared distances, float)."""

    iteration: int
    loss: float
    sums: np.ndarray = array_field("float64", 2)
    counts: np.ndarray = array_field("int64", 1)

    def __post_init__(self) -> None:
        _check_count(self.iteration, "iteration")
        _check_real(self.loss, "loss")
        if not (self.loss >= 0 and self.loss != float("inf")):
            raise ValueError("loss must be finite and non-negative")
        _check_counts(self.counts, self.sums.shape[0], "row of sums")
        _check_finite(self.sums, "sums")


class PointRemoval(Message, tag="del.qremove"):
    """Delete the sender's point ``point_id``; ``point`` ``float64 [d]`` are its coordinates,
    which the coordinator's exact replay subtracts from the stored sums (spec 1.5, 2.3)."""

    point_id: int
    point: np.ndarray = array_field("float64", 1)

    def __post_init__(self) -> None:
        _check_id(self.point_id, "point_id")
        _check_point(self.point)


def _check_extent(lo: np.ndarray, hi: np.ndarray, d: int | None) -> None:
    """``lo`` and ``hi`` are both ``[d]`` (any d when ``d`` is ``None``) or both ``[0]``."""
    if lo.shape != hi.shape or (d is not None and lo.shape not in ((0,), (d,))):
        raise ValueError(f"lo and hi must both have shape [d] (or [0]: no extent), got {lo.shape} and {hi.shape}")
    _check_finite(lo, "lo")
    _check_finite(hi, "hi")
    if np.any(lo > hi):
        raise ValueError("lo must not exceed hi")


class DataSummary(Message, tag="del.summary"):
    """A data-holding party's part of the setup phase ``setup.data``: it holds ``n_points`` raw
    points of ``n_features`` features; ``lo`` and ``hi`` (``float64 [d]``) are their per-feature
    minimum and maximum when the run scales the data (``--normalize minmax``) and the party holds
    a point, else ``[0]``."""

    n_points: int
    n_features: int
    lo: np.ndarray = array_field("float64", 1)
    hi: np.ndarray = array_field("float64", 1)

    def __post_init__(self) -> None:
        _check_count(self.n_points, "n_points")
        if self.n_points >= _MAX_ID:
            raise ValueError("n_points must be below 2^32 (point ids are 32-bit)")
        _check_count(self.n_features, "n_features", 1)
        _check_extent(self.lo, self.hi, self.n_features)


class DataAgreement(Message, tag="del.agreed"):
    """The coordinator's answer in the setup phase ``setup.data``, one per data-holding party:
    the federation holds ``n_points`` points; this party's points get the ids ``offset``,
    ``offset + 1``, ... in the order of its file; ``lo`` and ``hi`` (``float64 [d]``) are the
    federation's per-feature extent to scale by (``[0]`` when the run does not scale)."""

    n_points: int
    offset: int
    lo: np.ndarray = array_field("float64", 1)
    hi: np.ndarray = array_field("float64", 1)

    def __post_init__(self) -> None:
        _check_count(self.n_points, "n_points")
        if self.n_points > _MAX_ID:
            raise ValueError("n_points must be at most 2^32 (point ids are 32-bit)")
        _check_count(self.offset, "offset")
        if self.offset > self.n_points:
            raise ValueError("offset must not exceed n_points")
        _check_extent(self.lo, self.hi, None)

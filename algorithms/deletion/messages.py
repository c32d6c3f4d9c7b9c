"""Wire messages of the deletion protocols (spec deletion-kmeans.md, section 2.3).

DC-k-means (a tree of parties):

* :class:`NodeCentroids` child -> parent: a node's output centroids ``float64 [r, d]``
  (``r <= k``), with the node id and how many times the node has been computed;
* :class:`RemovalRequest` root (coordinator) -> the leaf holding the point: delete ``point_id``;
* :class:`ModelUpdate` root -> every party, once at the end: the final model.

Q-k-means (a server holding the pooled data, clients owning their points):

* :class:`PointUpload` client -> server: the client's points and their stable ids;
* :class:`ModelUpdate` server -> every client: the model after training and after each deletion;
* :class:`RemovalRequest` client -> server: delete one of the client's own points.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedproto.messages import Message, array_field

__all__ = ["ModelUpdate", "NodeCentroids", "PointUpload", "RemovalRequest"]

_MAX_ID = 2**32


def _check_id(value: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX_ID:
        raise ValueError(f"{what} must be an integer in [0, 2^32)")


def _check_centroids(centroids: np.ndarray) -> None:
    if centroids.ndim != 2 or centroids.shape[1] < 1:
        raise ValueError(f"centroids must have shape [r, d] with d >= 1, got {centroids.shape}")
    if not np.all(np.isfinite(centroids)):
        raise ValueError("centroids contain NaN or infinite values")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RemovalRequest(Message):
    """Delete the point with stable id ``point_id``."""

    TAG = "del.remove"
    point_id: int

    def __post_init__(self) -> None:
        _check_id(self.point_id, "point_id")


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeCentroids(Message):
    """A tree node's output: ``centroids`` ``float64 [r, d]`` of node ``node`` at ``version``
    (1 after training, +1 per recomputation)."""

    TAG = "del.node"
    node: int
    version: int
    centroids: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        if isinstance(self.node, bool) or not isinstance(self.node, int) or self.node < 1:
            raise ValueError("node must be a positive integer (the root sends no NodeCentroids)")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 1:
            raise ValueError("version must be a positive integer")
        _check_centroids(self.centroids)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelUpdate(Message):
    """The model after ``version`` deletions: ``centroids`` ``float64 [r, d]``; ``retrained``
    says whether the last deletion retrained from scratch (False after training)."""

    TAG = "del.model"
    version: int
    retrained: bool
    centroids: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 0:
            raise ValueError("version must be a non-negative integer")
        if not isinstance(self.retrained, bool):
            raise TypeError("retrained must be a bool")
        _check_centroids(self.centroids)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PointUpload(Message):
    """A client's points ``float64 [n_i, d]`` and their stable ids ``int64 [n_i]``."""

    TAG = "del.upload"
    ids: np.ndarray = array_field("int64", 1)
    points: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        if self.points.ndim != 2 or self.ids.shape != (self.points.shape[0],):
            raise ValueError("ids must have one entry per row of points")
        if self.ids.size and (self.ids.min() < 0 or self.ids.max() >= _MAX_ID):
            raise ValueError("ids must lie in [0, 2^32)")
        if not np.all(np.isfinite(self.points)):
            raise ValueError("points contain NaN or infinite values")

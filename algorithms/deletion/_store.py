"""Points with stable ids, the deletion error, and the record of one deletion.

Both algorithms key their randomness by stable point ids (spec 3.3), so the data they hold is a
table ``id -> point`` rather than a matrix whose row numbers shift. :class:`PointStore` keeps the
rows sorted by id (a from-scratch run on the remaining data sees them in the same order as the
incremental one), remembers which ids were deleted (so a repeated request is told apart from an
unknown id), and removes rows for real: no zeroed rows stay behind (spec 6.4 item 7, O-Q-7).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedproto.data import HoldsPoints

__all__ = ["DeletionError", "DeletionOutcome", "PointStore"]

_MAX_ID = 2**32


class DeletionError(ValueError):
    """A deletion request that cannot be served; the model is left exactly as it was.

    Raised for an unknown id, an id that was already deleted, a deletion that would leave fewer
    than k points, and a request made before the model was trained.

    Attributes:
        point_id: the requested id (``None`` if not applicable).
    """

    def __init__(self, message: str, *, point_id: int | None = None) -> None:
        super().__init__(message)
        self.point_id = point_id


@dataclasses.dataclass(frozen=True)
class DeletionOutcome:
    """What one deletion did.

    Attributes:
        point_id: the deleted id.
        retrained: True if the model was retrained from scratch, False if the deletion was
            certified (model unchanged, metadata updated).
        reason: why (``"certified"``, ``"seed"``, ``"lattice index changed"``, ...; for DC-k-means
            ``"path"`` or ``"width changed"``).
        nodes: the tree nodes recomputed (DC-k-means), leaf first; empty for Q-k-means.
    """

    point_id: int
    retrained: bool
    reason: str
    nodes: tuple[int, ...] = ()


def check_points(x: np.ndarray, ids: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Validate points and ids; return float64 points and int64 ids.

    Raises:
        ValueError: ``x`` is not 2-D, has NaN/inf; ids are not unique non-negative integers below
            2^32 or do not match the rows.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] < 1:
        raise ValueError(f"points must have shape [n, d] with d >= 1, got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("points contain NaN or infinite values")
    if ids is None:
        ids = np.arange(x.shape[0], dtype=np.int64)
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.shape[0] != x.shape[0]:
        raise ValueError(f"ids must have shape [{x.shape[0]}], got {ids.shape}")
    if ids.size and ids.dtype.kind not in "iu":
        raise ValueError(f"ids must be integers, got dtype {ids.dtype}")
    ids = ids.astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= _MAX_ID):
        raise ValueError("ids must lie in [0, 2^32)")
    if np.unique(ids).size != ids.size:
        raise ValueError("ids must be unique")
    return x, ids


class PointStore(HoldsPoints):
    """The current data set: points sorted by stable id.

    Args:
        x: points ``[n, d]``.
        ids: their ids ``[n]`` (default ``0..n-1``).

    Raises:
        ValueError: see `check_points`.
    """

    def __init__(self, x: np.ndarray, ids: np.ndarray | None = None) -> None:
        x, ids = check_points(x, ids)
        order = np.argsort(ids, kind="stable")
        self.x = x[order]
        self.ids = ids[order]
        self.deleted: set[int] = set()

    def __contains__(self, point_id: object) -> bool:
        try:
            self.row_of(int(point_id))  # type: ignore[arg-type]
        except (DeletionError, TypeError, ValueError):
            return False
        return True

    def row_of(self, point_id: int) -> int:
        """The row holding ``point_id``.

        Raises:
            DeletionError: the id was already deleted, or was never held.
        """
        if isinstance(point_id, bool) or not isinstance(point_id, int | np.integer):
            raise DeletionError(f"point id must be an integer, got {point_id!r}", point_id=None)
        point_id = int(point_id)
        row = int(np.searchsorted(self.ids, point_id))
        if row < self.n and int(self.ids[row]) == point_id:
            return row
        if point_id in self.deleted:
            raise DeletionError(f"point {point_id} was already deleted", point_id=point_id)
        raise DeletionError(f"point {point_id} is not in the data set", point_id=point_id)

    def remove(self, row: int) -> None:
        """Remove the point in ``row`` (the row is gone, not zeroed)."""
        self.deleted.add(int(self.ids[row]))
        self.x = np.delete(self.x, row, axis=0)
        self.ids = np.delete(self.ids, row)

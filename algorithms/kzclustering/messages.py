"""Wire messages of distributed (k,z)-clustering (spec kz-clustering.md, sections 2.5, 3.3 and 4).

Setup (phase ``setup.data``, only with ``--normalize minmax``; see
`fedproto.algorithms.kzclustering.setup`): :class:`DataSummary` machine -> coordinator, then
:class:`FederationSummary` coordinator -> machines.

Distributed (k,z)-center (`fedproto.algorithms.kzclustering.protocol`), in message order:

* :class:`LocalExtent` machine -> coordinator: ``n_i``, the machine's smallest nonzero distance,
  an anchor point and the radius around it (only when no radius bounds are configured; spec 2.4);
* the ``probe`` search (the default):

  - :class:`RadiusProbes` coordinator -> machines: the radii to aggregate at;
  - :class:`ProbeCounts` machine -> coordinator: ``|P'_i(L)|`` per probed radius, and ``|U_i(L)|``
    when the threshold y is at least 1 (below it nothing is ever discarded);
  - :class:`RadiusFetch` coordinator -> machines: the one radius whose data to send;
  - :class:`Representatives` machine -> coordinator: its representatives and weights;

* the ``linear`` and ``binary`` searches:

  - :class:`RadiusGrid` coordinator -> machines: the grid of radius guesses;
  - :class:`AggregatedCounts` machine -> coordinator: ``|P'_i(L)|`` and ``|U_i(L)|`` for every
    guess (Phase 1, with the discarded counts of the GAP 1 fix), plus ``n_i``;
  - :class:`RadiusGuesses` coordinator -> machines: which guesses to send the data of (Phase 2);
  - :class:`WeightedPoints` machine -> coordinator: the representatives and weights of those
    guesses (Phase 3);

* :class:`FinalCentres` coordinator -> machines: the centres and the certified radius L_out
  (Phase 5);
* :class:`OutlierCount` machine -> coordinator: how many local points lie beyond L_out (Phase 6).

The baselines (`fedproto.algorithms.kzclustering.baselines`) and the median/means protocol
(`fedproto.algorithms.kzclustering.means`) add :class:`LocalSummary`, :class:`CostCurve`,
:class:`OutlierBudget`, :class:`LocalCosts`, :class:`CostTotals` and :class:`Coresets`.

"Words" are scalars on the wire (array elements plus plain fields), the paper's unit of
communication (spec 1.2 and 5.3): see :func:`message_words`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from fedproto.messages import Message, array_field

__all__ = [
    "AggregatedCounts",
    "Coresets",
    "CostCurve",
    "CostTotals",
    "DataSummary",
    "FederationSummary",
    "FinalCentres",
    "LocalCosts",
    "LocalExtent",
    "LocalSummary",
    "OutlierBudget",
    "OutlierCount",
    "ProbeCounts",
    "RadiusFetch",
    "RadiusGrid",
    "RadiusGuesses",
    "RadiusProbes",
    "Representatives",
    "WeightedPoints",
    "message_words",
]


def message_words(message: Message) -> int:
    """Scalars a message carries: every array element, every tuple item, every plain field.

    Args:
        message: any message.

    Returns:
        The number of words (a point of R^d is d words; a weight or count is 1).
    """
    total = 0
    for field in dataclasses.fields(message):
        value = getattr(message, field.name)
        if isinstance(value, np.ndarray):
            total += int(value.size)
        elif isinstance(value, tuple | list):
            total += len(value)
        else:
            total += 1
    return total


def _check_points(points: np.ndarray, what: str) -> None:
    if points.ndim != 2 or points.shape[1] < 1:
        raise ValueError(f"{what} must have shape [n, d] with d >= 1, got {points.shape}")
    if not np.all(np.isfinite(points)):
        raise ValueError(f"{what} contain NaN or infinite values")


def _check_nonnegative(values: np.ndarray, what: str) -> None:
    if values.size and int(values.min()) < 0:
        raise ValueError(f"{what} must be >= 0")


def _check_count(value: int, what: str) -> None:
    """Refuse a negative scalar count (``n_points``, ``outliers``, ``samples``)."""
    if value < 0:
        raise ValueError(f"{what} must be >= 0")


def _check_radius(radius: float) -> None:
    """Refuse a scalar radius that is not finite and ``>= 0``."""
    if not (math.isfinite(radius) and radius >= 0):
        raise ValueError("radius must be finite and >= 0")


def _check_radii(radii: np.ndarray, what: str, empty: str) -> None:
    """Refuse radii ``[b]`` that are empty (the text ``empty``) or not finite, ``>= 0`` and
    strictly increasing (``what`` names them)."""
    if radii.shape[0] < 1:
        raise ValueError(empty)
    if not (np.all(np.isfinite(radii)) and np.all(radii >= 0) and np.all(np.diff(radii) > 0)):
        raise ValueError(f"{what} must be finite, >= 0 and strictly increasing")


def _check_weights(weights: np.ndarray) -> None:
    """Refuse integer weights below 1 (a representative stands for at least itself)."""
    if weights.size and int(weights.min()) < 1:
        raise ValueError("weights must be >= 1")


def _check_concatenated(sizes: np.ndarray, points: np.ndarray, weights: np.ndarray) -> None:
    """Refuse groups concatenated badly: ``sizes [b]`` must be ``>= 0`` and sum to the rows of
    ``points [sum(sizes), d]`` (finite, ``d >= 1``), with one weight per point."""
    _check_nonnegative(sizes, "sizes")
    if int(sizes.sum()) != points.shape[0] or points.shape[0] != weights.shape[0]:
        raise ValueError("sizes, points and weights do not agree")
    _check_points(points, "points")


def _check_finite_nonnegative(values: np.ndarray, what: str) -> None:
    """Refuse float values (``[T]`` costs or totals) that are not all finite and ``>= 0``."""
    if not (np.all(np.isfinite(values)) and np.all(values >= 0)):
        raise ValueError(f"{what} must be finite and >= 0")


def _check_feature_extent(extent: np.ndarray) -> None:
    if extent.shape[0] != 2 or extent.shape[1] < 1:
        raise ValueError(f"extent must have shape [2, d] with d >= 1, got {extent.shape}")
    if np.any(np.isnan(extent)):
        raise ValueError("extent holds NaN values")


class DataSummary(Message, tag="kz.data"):
    """Setup (``setup.data``, machine -> coordinator): the per-feature extent of the machine's raw
    points, float64 ``[2, d]``: row 0 the minimum, row 1 the maximum
    (`fedproto.data.feature_extent`); ``+inf`` and ``-inf`` for a machine without points (the
    identities of the minimum and the maximum)."""

    extent: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        _check_feature_extent(self.extent)
        lo, hi = self.extent
        empty = bool(np.all(lo == np.inf) and np.all(hi == -np.inf))
        if not empty and not (np.all(np.isfinite(self.extent)) and np.all(lo <= hi)):
            raise ValueError("extent must be finite with minimum <= maximum (or +inf and -inf for no points)")


class FederationSummary(Message, tag="kz.federation"):
    """Setup (``setup.data``, coordinator -> every machine): the federation's per-feature extent,
    float64 ``[2, d]`` (the element-wise minimum of the machines' minima and maximum of their
    maxima: the pooled data's extent), finite, by which every machine scales its raw points into
    ``[-1, 1]`` (`fedproto.data.normalize`)."""

    extent: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        _check_feature_extent(self.extent)
        if not (np.all(np.isfinite(self.extent)) and np.all(self.extent[0] <= self.extent[1])):
            raise ValueError("extent must be finite with minimum <= maximum")


class LocalExtent(Message, tag="kz.extent"):
    """A machine's extent: ``n_i``, its smallest nonzero pairwise distance (``inf`` if none), an
    anchor ``[a, d]`` (``a = 1``, or 0 for a machine without points) and the largest distance to
    the anchor."""

    n_points: int
    min_distance: float
    radius: float
    anchor: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        if self.n_points < 0 or self.anchor.shape[0] != min(self.n_points, 1):
            raise ValueError("n_points must be >= 0, with one anchor exactly when n_points > 0")
        if not (self.min_distance > 0):
            raise ValueError("min_distance must be positive (inf when there is no nonzero distance)")
        _check_radius(self.radius)
        if self.anchor.shape[0] > 1:
            raise ValueError(f"anchor must hold at most one point, got {self.anchor.shape[0]}")
        _check_points(self.anchor, "anchor")


class RadiusProbes(Message, tag="kz.probe"):
    """``probe`` search: the radii to aggregate at, float64 ``[b]``, ``b >= 1``, finite, ``>= 0``
    and strictly increasing."""

    radii: np.ndarray = array_field("float64", 1)

    def __post_init__(self) -> None:
        _check_radii(self.radii, "probe radii", empty="at least one radius must be probed")


class ProbeCounts(Message, tag="kz.probecounts"):
    """``probe`` search: per probed radius, ``|P'_i(L)|`` (int64 ``[b]``) and ``|U_i(L)|`` (int64
    ``[b]``, or ``[0]`` when the threshold y is below 1: then no point is ever discarded)."""

    counts: np.ndarray = array_field("int64", 1)
    discarded: np.ndarray = array_field("int64", 1)

    def __post_init__(self) -> None:
        if self.discarded.shape not in (self.counts.shape, (0,)):
            raise ValueError("discarded counts must match the counts, or be empty")
        _check_nonnegative(self.counts, "counts")
        _check_nonnegative(self.discarded, "discarded counts")


class RadiusFetch(Message, tag="kz.fetchradius"):
    """``probe`` search: the probed radius whose representatives to send (finite, ``>= 0``)."""

    radius: float

    def __post_init__(self) -> None:
        _check_radius(self.radius)


class Representatives(Message, tag="kz.representatives"):
    """``probe`` search: the representatives ``[r, d]`` float64 of the fetched radius and their
    weights ``[r]`` int64 (>= 1); r is the count the machine reported for that radius."""

    points: np.ndarray = array_field("float64", 2)
    weights: np.ndarray = array_field("int64", 1)

    def __post_init__(self) -> None:
        if self.points.shape[0] != self.weights.shape[0]:
            raise ValueError("one weight per representative")
        _check_points(self.points, "points")
        _check_weights(self.weights)


class RadiusGrid(Message, tag="kz.grid"):
    """The radius guesses ``[T]`` float64: non-decreasing, ``>= 0`` and finite."""

    radii: np.ndarray = array_field("float64", 1)

    def __post_init__(self) -> None:
        _check_radii(self.radii, "grid radii", empty="the grid is empty")


class AggregatedCounts(Message, tag="kz.counts"):
    """Phase 1: ``n_i`` and, per guess, ``|P'_i(L_t)|`` and ``|U_i(L_t)|`` (int64 ``[T]`` each)."""

    n_points: int
    counts: np.ndarray = array_field("int64", 1)
    discarded: np.ndarray = array_field("int64", 1)

    def __post_init__(self) -> None:
        _check_count(self.n_points, "n_points")
        if self.counts.shape != self.discarded.shape:
            raise ValueError("counts and discarded must have the same length")
        _check_nonnegative(self.counts, "counts")
        _check_nonnegative(self.discarded, "discarded counts")
        if self.discarded.size and int(self.discarded.max()) > self.n_points:
            raise ValueError("a discarded count exceeds n_points")


class RadiusGuesses(Message, tag="kz.fetch"):
    """Phase 2: grid indices whose data to send, int64 ``[b]``, strictly increasing, ``b >= 1``."""

    indices: np.ndarray = array_field("int64", 1)

    def __post_init__(self) -> None:
        if self.indices.shape[0] < 1:
            raise ValueError("at least one guess must be requested")
        _check_nonnegative(self.indices, "indices")
        if np.any(np.diff(self.indices) <= 0):
            raise ValueError("indices must be strictly increasing")


class WeightedPoints(Message, tag="kz.points"):
    """Phase 3: for each requested guess (``indices [b]``), ``sizes[j]`` representatives; their
    coordinates ``points [sum(sizes), d]`` float64 and weights ``[sum(sizes)]`` int64 (>= 1),
    concatenated in the order of ``indices``."""

    indices: np.ndarray = array_field("int64", 1)
    sizes: np.ndarray = array_field("int64", 1)
    points: np.ndarray = array_field("float64", 2)
    weights: np.ndarray = array_field("int64", 1)

    def __post_init__(self) -> None:
        if self.indices.shape != self.sizes.shape:
            raise ValueError("indices and sizes must have the same length")
        _check_nonnegative(self.indices, "indices")
        _check_concatenated(self.sizes, self.points, self.weights)
        _check_weights(self.weights)


class FinalCentres(Message, tag="kz.centres"):
    """Phase 5: the centres ``[c, d]`` float64 and the certified radius ``L_out`` (outliers are the
    points farther than it)."""

    radius: float
    centres: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        _check_radius(self.radius)
        _check_points(self.centres, "centres")


class OutlierCount(Message, tag="kz.outliers"):
    """Phase 6: the number of the machine's points labelled as outliers."""

    outliers: int

    def __post_init__(self) -> None:
        _check_count(self.outliers, "outliers")


# --- baselines ----------------------------------------------------------------------------------


class LocalSummary(Message, tag="kz.summary"):
    """A machine's summary for a baseline: points ``[s, d]`` float64 and weights ``[s]`` int64
    (>= 1), or ``[0]`` for unweighted samples (every weight 1, no words spent on them)."""

    points: np.ndarray = array_field("float64", 2)
    weights: np.ndarray = array_field("int64", 1)

    def __post_init__(self) -> None:
        _check_points(self.points, "points")
        if self.weights.shape not in ((self.points.shape[0],), (0,)):
            raise ValueError("one weight per point, or none for unweighted samples")
        _check_weights(self.weights)


class CostCurve(Message, tag="kz.curve"):
    """GLZ round 1: local covering radii ``f_i(q)`` at outlier counts ``q`` (int64 ``[s]``, strictly
    increasing) as float64 ``[s]`` (non-increasing)."""

    outliers: np.ndarray = array_field("int64", 1)
    radii: np.ndarray = array_field("float64", 1)

    def __post_init__(self) -> None:
        if self.outliers.shape != self.radii.shape:
            raise ValueError("one radius per outlier count")
        _check_nonnegative(self.outliers, "outlier counts")
        if np.any(np.diff(self.outliers) <= 0):
            raise ValueError("outlier counts must be strictly increasing")
        if not np.all(self.radii >= 0):
            raise ValueError("radii must be >= 0")


class OutlierBudget(Message, tag="kz.budget"):
    """GLZ: the local outlier budget ``t_i`` the coordinator assigns to a machine."""

    outliers: int

    def __post_init__(self) -> None:
        _check_count(self.outliers, "outliers")


# --- median / means ----------------------------------------------------------------------------


class LocalCosts(Message, tag="kz.costs"):
    """BEL phase 1: ``n_i`` and the local truncated costs ``c_i(L)`` float64 ``[T]`` (>= 0)."""

    n_points: int
    costs: np.ndarray = array_field("float64", 1)

    def __post_init__(self) -> None:
        _check_count(self.n_points, "n_points")
        _check_finite_nonnegative(self.costs, "costs")


class CostTotals(Message, tag="kz.totals"):
    """BEL phase 2: the totals ``T(L) = sum_i c_i(L)`` float64 ``[T]`` (>= 0) and the coreset size
    t (samples per radius over all machines)."""

    samples: int
    totals: np.ndarray = array_field("float64", 1)

    def __post_init__(self) -> None:
        _check_count(self.samples, "samples")
        _check_finite_nonnegative(self.totals, "totals")


class Coresets(Message, tag="kz.coresets"):
    """BEL phase 3: one weighted coreset per radius, concatenated: ``sizes [T]`` int64, points
    ``[sum(sizes), d]`` float64 and real weights ``[sum(sizes)]`` float64 (centre weights may be
    negative)."""

    sizes: np.ndarray = array_field("int64", 1)
    points: np.ndarray = array_field("float64", 2)
    weights: np.ndarray = array_field("float64", 1)

    def __post_init__(self) -> None:
        _check_concatenated(self.sizes, self.points, self.weights)
        if not np.all(np.isfinite(self.weights)):
            raise ValueError("weights must be finite")

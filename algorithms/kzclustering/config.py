"""Public parameters of a distributed (k,z)-center run (spec kz-clustering.md, sections 1-2).

Every party of a run is built from the same :class:`KzCenterConfig`: k, z, eps, the number of
machines m and the dimension are known to all (Guo & Li, Section 2.2: "known to all parties: n,
k, z, m, L, eps"; n itself is learnt from the machines' first messages). The search options, the
count test and the polishing are this project's design decisions (spec 2.5, GAPs 1 and 2; issue
15), documented with the protocol (`fedproto.algorithms.kzclustering.protocol`).
"""

from __future__ import annotations

import dataclasses
import math

__all__ = [
    "COUNT_TESTS",
    "SEARCHES",
    "KzCenterConfig",
    "KzInstance",
    "check_instance",
    "check_radius_bounds",
    "check_slack",
]

#: Radius searches: ``probe`` (the default: bisection with count probes, then one fetch),
#: ``linear`` and ``binary`` (counts of every guess first, then fetches).
SEARCHES = ("probe", "linear", "binary")

#: Round-2 count tests: ``tight`` (``k m + floor(z / (floor(y) + 1))``) or ``paper``
#: (``k m (1 + 1/eps)``).
COUNT_TESTS = ("tight", "paper")


def check_instance(n: int, k: int, z: int) -> None:
    """Refuse instances that are not (k,z)-clustering problems.

    Raises:
        ValueError: ``n < 1``, ``k < 1``, ``k > n``, ``z < 0`` or ``z >= n`` (every point could be an
            outlier: the optimum is the empty inlier set, and no algorithm is needed).
    """
    if n < 1:
        raise ValueError("there are no points")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if k > n:
        raise ValueError(f"k = {k} is larger than the number of points n = {n}")
    if z < 0:
        raise ValueError(f"z must be >= 0, got {z}")
    if z >= n:
        raise ValueError(f"z = {z} outliers leave no inliers among n = {n} points (need z < n)")


def check_slack(eps: float) -> None:
    """Refuse a bicriteria slack (the paper's eps) outside ``(0, 1]``.

    Raises:
        ValueError: ``eps`` is not a number in ``(0, 1]``.
    """
    if not (isinstance(eps, float | int) and 0 < eps <= 1):
        raise ValueError(f"eps must be in (0, 1], got {eps}")


def check_radius_bounds(bounds: tuple[float, float] | None) -> None:
    """Refuse radius bounds ``(A, B)`` (Guo & Li, Appendix B, "domain knowledge") that are not
    ``0 < A <= B < inf``; ``None`` (no bounds) is fine.

    Raises:
        ValueError: the bounds are out of order, not positive, or not finite.
    """
    if bounds is not None:
        lo, hi = bounds
        if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
            raise ValueError(f"radius_bounds must satisfy 0 < A <= B < inf, got {bounds}")


@dataclasses.dataclass(frozen=True)
class KzInstance:
    """What every party of a Guo & Li run knows of the instance (Section 2.2: "known to all
    parties: n, k, z, m, L, eps"; n is learnt from the machines' first messages): the first five
    fields, in this order, of :class:`KzCenterConfig` and
    `fedproto.algorithms.kzclustering.means.KzMeansConfig` (their ``repr``, which names the
    session, lists them first).

    Each protocol's configuration checks these fields itself (with its own error texts).

    Attributes:
        k: number of centres.
        z: number of outliers.
        eps: the bicriteria slack in ``(0, 1]``.
        n_machines: m, the number of data-holding machines.
        d: the points' number of features; ``None`` for a coordinator that learns it from the
            machines' first messages (a machine's configuration states it).
    """

    k: int
    z: int
    eps: float
    n_machines: int
    d: int | None


@dataclasses.dataclass(frozen=True)
class KzCenterConfig(KzInstance):
    """Parameters shared by the coordinator and every machine.

    Attributes:
        k: number of centres, ``>= 1``.
        z: number of outliers, ``>= 0``.
        eps: the bicriteria slack, ``0 < eps <= 1``: up to ``(1+eps) z`` outliers, threshold
            ``y = eps z / (k m)``, count test ``sum |P'_i| <= k m (1 + 1/eps)``.
        n_machines: m, ``>= 1``.
        d: number of features; ``None`` for a coordinator that learns it from the machines'
            first points (a run whose parties each hold only their own data: the coordinator
            holds none). A machine's configuration always states it.
        radius_bounds: a known interval ``[A, B]`` holding the optimal radius L* (Appendix B,
            "domain knowledge"); the grid is then ``A (1+eps)^t`` up to ``>= B`` and the extent
            round is skipped. ``None`` (default): machines first send their extent and the
            coordinator builds the grid (spec 2.4, "practical alternative").
        search: ``"probe"`` (default): lo-fails/hi-passes bisection over the grid in which the
            coordinator asks the machines for the counts of ``batch`` guesses per round (machines
            aggregate only for those), then fetches the points of the one guess the bisection
            ends at (more only after a kzc "No", spec 2.5 GAP 2); ``"linear"``: counts of every
            guess first, then fetch the smallest untried candidate that passes PASS2 and move up
            on "No"; ``"binary"``: counts of every guess first, then lo-fails/hi-passes over the
            grid with fetches.
        batch: guesses asked per round: 1 = one at a time; b > 1 = b evenly spaced probes
            (``probe``, ``binary``) or the next b candidates (``linear``), trading words for
            rounds; 0 = all at once (``probe``: the counts of every guess in one round;
            ``linear``/``binary``: every PASS2 candidate in one fetch, "all-parallel").
        candidates: ``"all"`` (Algorithm 2: representatives from all of P_i) or ``"uncovered"``.
        refine: after a successful fetch, search the smallest kzc radius L'' <= 5L on the fetched
            points and certify ``L_out = 4 L'' + 4 L`` (spec 2.5, coordinator refinement);
            ``False`` reports ``L_out = 24 L``.
        count_test: the Round-2 count bound (see :attr:`count_bound`): ``"tight"`` (default)
            or ``"paper"``.
        sub_machines: t, the virtual machines each machine stands for (Guo & Li, Appendix B;
            spec 2.7): each machine splits its points into t strided parts and aggregates each
            part as one machine, so dist-kzc runs over ``m' = m t`` virtual machines and the
            threshold, the count bound and the representative cap are those of m' (local work
            ``n_i^2 / t`` per guess instead of ``n_i^2``). ``1`` (default) is no split. Every
            party must use the same t; choose ``ceil(max_i n_i / 10,000)`` (the authors' part
            size) when machines hold more than about 10^4 points.
        polish: after kzc, improve the centres by swap local search on the representatives
            (`fedproto.algorithms.kzclustering.polish`), keeping the certificate L_out; only when
            ``z > 0`` (with z = 0 the evaluated cost is the single farthest point, which the
            representatives locate only to within 4L).

    Raises:
        ValueError: a parameter out of range.
    """

    radius_bounds: tuple[float, float] | None = None
    search: str = "probe"
    batch: int = 1
    candidates: str = "all"
    refine: bool = True
    count_test: str = "tight"
    polish: bool = True
    sub_machines: int = 1

    def __post_init__(self) -> None:
        for name in ("k", "z", "n_machines", "d", "batch", "sub_machines"):
            value = getattr(self, name)
            if name == "d" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if self.k < 1:
            raise ValueError(f"k must be at least 1, got {self.k}")
        if self.z < 0:
            raise ValueError(f"z must be >= 0, got {self.z}")
        check_slack(self.eps)
        if self.n_machines < 1:
            raise ValueError(f"the number of machines must be at least 1, got {self.n_machines}")
        if self.d is not None and self.d < 1:
            raise ValueError(f"d must be at least 1, got {self.d}")
        if self.sub_machines < 1:
            raise ValueError(f"sub_machines must be at least 1, got {self.sub_machines}")
        if self.batch < 0:
            raise ValueError(f"batch must be >= 0 (0 = all candidates at once), got {self.batch}")
        if self.search not in SEARCHES:
            raise ValueError(f"search must be one of {SEARCHES}, got {self.search!r}")
        if self.candidates not in ("all", "uncovered"):
            raise ValueError(f"candidates must be 'all' or 'uncovered', got {self.candidates!r}")
        if self.count_test not in COUNT_TESTS:
            raise ValueError(f"count_test must be one of {COUNT_TESTS}, got {self.count_test!r}")
        for name in ("refine", "polish"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        check_radius_bounds(self.radius_bounds)

    @property
    def virtual_machines(self) -> int:
        """``m' = m t``: the machines dist-kzc runs over (``m`` without a sub-machine split)."""
        return self.n_machines * self.sub_machines

    @property
    def threshold(self) -> float:
        """The aggregation threshold ``y = eps z / (k m')`` (Algorithm 3, Round 1; ``m'`` =
        :attr:`virtual_machines`)."""
        return self.eps * self.z / (self.k * self.virtual_machines)

    @property
    def max_reps(self) -> int:
        """``floor(k m' (1 + 1/eps))``: the largest total ``sum |P'_i|`` that passes Round 2.

        A relative tolerance of 1e-12 absorbs the rounding of ``1/eps`` (``eps = 0.1`` must give
        ``11 k m``, not ``11 k m - 1``).
        """
        return int(math.floor(self.k * self.virtual_machines * (1.0 + 1.0 / self.eps) * (1.0 + 1e-12)))

    @property
    def count_bound(self) -> int:
        """The largest total ``sum_i |P'_i|`` that passes the Round-2 count test.

        ``"paper"``: :attr:`max_reps` ``= k m (1 + 1/eps)`` (Lemma 2.6). ``"tight"``:
        ``min(max_reps, k m + floor(z / (floor(y) + 1)))`` (m read as the virtual machines m'
        throughout, each part of a split machine counting as one), the same lemma with the integer
        rounding kept: if L >= L*, fix optimal centres C* with at most z outliers, z_i of them on
        machine i. A representative whose ``2L`` ball (taken in U) holds an inlier q absorbs every
        remaining point of q's cluster (all within ``2L* + 2L <= 4L`` of it), so each cluster
        yields at most one such representative: at most k per machine. Any other representative's
        ball holds only outliers, more than y of them, i.e. at least ``floor(y) + 1``, all absorbed:
        at most ``z_i / (floor(y) + 1)`` per machine. Summed: ``k m + z / (floor(y) + 1)``. So a
        total above the bound still certifies L < L* (every L >= L* passes), and the bound is
        always at most the paper's (``floor(y) + 1 > y`` and ``z / y = k m / eps``). With
        ``z = 0`` it is ``k m``: at most k representatives per machine.

        References:
            Guo & Li, Lemmas 2.3 and 2.6; spec sections 2.2 and 2.3.
        """
        if self.count_test == "paper":
            return self.max_reps
        return min(self.max_reps, self.k * self.virtual_machines + self.z // (math.floor(self.threshold) + 1))

    @property
    def sends_discarded(self) -> bool:
        """Whether probe replies carry discarded counts: only when ``y >= 1``.

        With ``y < 1`` every remaining point's own ``2L`` ball holds it (more than y points), so
        aggregation absorbs every point and discards none (unless it stops at the ``max_reps``
        cap, which fails the count test anyway): the counts are all 0 and both sides know it.
        """
        return self.threshold >= 1.0

    @property
    def outlier_budget(self) -> float:
        """``(1 + eps) z``: the outliers the bicriteria guarantee allows."""
        return (1.0 + self.eps) * self.z

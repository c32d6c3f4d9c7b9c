"""Public parameters of a distributed (k,z)-center run (spec kz-clustering.md, sections 1-2).

Every party of a run is built from the same :class:`KzCenterConfig`: k, z, eps, the number of
machines m and the dimension are known to all (Guo & Li, Section 2.2: "known to all parties: n,
k, z, m, L, eps"; n itself is learnt from the machines' first messages). The search options are
this project's design decisions (spec 2.5, GAPs 1 and 2).
"""

from __future__ import annotations

import dataclasses
import math

__all__ = ["KzCenterConfig", "SEARCHES", "check_instance"]

SEARCHES = ("linear", "binary")


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


@dataclasses.dataclass(frozen=True)
class KzCenterConfig:
    """Parameters shared by the coordinator and every machine.

    Attributes:
        k: number of centres, ``>= 1``.
        z: number of outliers, ``>= 0``.
        eps: the bicriteria slack, ``0 < eps <= 1``: up to ``(1+eps) z`` outliers, threshold
            ``y = eps z / (k m)``, count test ``sum |P'_i| <= k m (1 + 1/eps)``.
        n_machines: m, ``>= 1``.
        d: number of features.
        radius_bounds: a known interval ``[A, B]`` holding the optimal radius L* (Appendix B,
            "domain knowledge"); the grid is then ``A (1+eps)^t`` up to ``>= B`` and the extent
            round is skipped. ``None`` (default): machines first send their extent and the
            coordinator builds the grid (spec 2.4, "practical alternative").
        search: ``"linear"``: fetch the smallest untried candidate that passes PASS2 and move up
            on "No" (spec 2.5, GAP 2 fix); ``"binary"``: lo-fails/hi-passes search over the grid.
        batch: candidates fetched per round: 1 = one at a time; b > 1 = the next b (linear) or b
            evenly spaced probes (binary), trading words for rounds; 0 = every PASS2 candidate in
            one round ("all-parallel", exactly one fetch).
        candidates: ``"all"`` (Algorithm 2: representatives from all of P_i) or ``"uncovered"``.
        refine: after a successful fetch, search the smallest kzc radius L'' <= 5L on the fetched
            points and certify ``L_out = 4 L'' + 4 L`` (spec 2.5, coordinator refinement);
            ``False`` reports ``L_out = 24 L``.

    Raises:
        ValueError: a parameter out of range.
    """

    k: int
    z: int
    eps: float
    n_machines: int
    d: int
    radius_bounds: tuple[float, float] | None = None
    search: str = "linear"
    batch: int = 1
    candidates: str = "all"
    refine: bool = True

    def __post_init__(self) -> None:
        for name in ("k", "z", "n_machines", "d", "batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if self.k < 1:
            raise ValueError(f"k must be at least 1, got {self.k}")
        if self.z < 0:
            raise ValueError(f"z must be >= 0, got {self.z}")
        if not (isinstance(self.eps, float | int) and 0 < self.eps <= 1):
            raise ValueError(f"eps must be in (0, 1], got {self.eps}")
        if self.n_machines < 1:
            raise ValueError(f"the number of machines must be at least 1, got {self.n_machines}")
        if self.d < 1:
            raise ValueError(f"d must be at least 1, got {self.d}")
        if self.batch < 0:
            raise ValueError(f"batch must be >= 0 (0 = all candidates at once), got {self.batch}")
        if self.search not in SEARCHES:
            raise ValueError(f"search must be one of {SEARCHES}, got {self.search!r}")
        if self.candidates not in ("all", "uncovered"):
            raise ValueError(f"candidates must be 'all' or 'uncovered', got {self.candidates!r}")
        if self.radius_bounds is not None:
            lo, hi = self.radius_bounds
            if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
                raise ValueError(f"radius_bounds must satisfy 0 < A <= B < inf, got {self.radius_bounds}")

    @property
    def threshold(self) -> float:
        """The aggregation threshold ``y = eps z / (k m)`` (Algorithm 3, Round 1)."""
        return self.eps * self.z / (self.k * self.n_machines)

    @property
    def max_reps(self) -> int:
        """``floor(k m (1 + 1/eps))``: the largest total ``sum |P'_i|`` that passes Round 2.

        A relative tolerance of 1e-12 absorbs the rounding of ``1/eps`` (``eps = 0.1`` must give
        ``11 k m``, not ``11 k m - 1``).
        """
        return int(math.floor(self.k * self.n_machines * (1.0 + 1.0 / self.eps) * (1.0 + 1e-12)))

    @property
    def outlier_budget(self) -> float:
        """``(1 + eps) z``: the outliers the bicriteria guarantee allows."""
        return (1.0 + self.eps) * self.z

"""The public quantization grid of MUFC: seeds -> bins -> 1-based flat bin indices, and back.

Every client rounds its seeds coordinate-wise to the nearest multiple of the public step gamma
(``a(y) = argmin_j |y - gamma j|``) and writes its cluster sizes into the bins that hold them;
the bins are numbered by a mixed-radix flattening with dimension 1 least significant, starting
at 1 because index 0 cannot be a Reed-Solomon evaluation point in SCMA. The server inverts the
map to bin centres. Indices are Python integers: ``B^d`` exceeds 64 bits already for d = 10 at
the paper's gamma.

The grid is fixed for the whole protocol run (gamma is not recomputed after removals), so it is
a frozen value object agreed at setup.

References:
    Pan, Sima, Prakash, Rana, Milenkovic. Machine Unlearning of Federated Clusters (ICLR 2023),
    Algorithm 1 line 3 and App. H (quantization); spec mufc.md, sections 1.2, 1.3 step 3 and 1.4.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Sequence

import numpy as np

__all__ = ["Grid", "make_grid"]

# Lattice coordinates are computed as float64 quotients y / gamma and rounded; beyond 2^52 the
# rounding is no longer exact, so the box must stay well inside that range.
_MAX_LATTICE = 2**52


@dataclasses.dataclass(frozen=True)
class Grid:
    """A uniform grid of step ``gamma`` over the shared box ``[lo, hi]^d``.

    Attributes:
        gamma: quantization step per coordinate (> 0, data units).
        lo: lower end of the shared box in every coordinate.
        hi: upper end of the shared box (> lo).
        d: dimension (>= 1).
        a_min: ``round(lo / gamma)``, the smallest lattice coordinate.
        a_max: ``round(hi / gamma)``, the largest lattice coordinate.
        per_dim: ``B = a_max - a_min + 1``, bins per dimension.
        n_bins: ``B^d`` (an arbitrary-precision Python int), the length of the count vector q.

    Raises:
        ValueError: on construction, if the fields are not consistent (``per_dim``, ``n_bins``,
            ``a_min`` or ``a_max`` not derived from the others as above), ``gamma`` is not
            positive and finite, ``lo >= hi``, ``d < 1``, or the box spans more than 2^52 steps.

    References:
        Spec mufc.md 1.2 (public parameters) and 1.4 (bin index mapping).
    """

    gamma: float
    lo: float
    hi: float
    d: int
    a_min: int
    a_max: int
    per_dim: int
    n_bins: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.gamma) and self.gamma > 0):
            raise ValueError(f"gamma must be positive and finite, got {self.gamma!r}")
        if not (math.isfinite(self.lo) and math.isfinite(self.hi) and self.lo < self.hi):
            raise ValueError(f"the box needs finite lo < hi, got [{self.lo!r}, {self.hi!r}]")
        if isinstance(self.d, bool) or not isinstance(self.d, int) or self.d < 1:
            raise ValueError(f"d must be a positive int, got {self.d!r}")
        if max(abs(self.lo), abs(self.hi)) / self.gamma >= _MAX_LATTICE:
            raise ValueError("the box spans too many grid steps for exact float64 rounding")
        a_min, a_max = _lattice_range(self.lo, self.hi, self.gamma)
        if (self.a_min, self.a_max) != (a_min, a_max):
            raise ValueError(f"a_min/a_max must be {a_min}/{a_max} for this box and gamma")
        if self.per_dim != a_max - a_min + 1:
            raise ValueError(f"per_dim must be a_max - a_min + 1 = {a_max - a_min + 1}")
        if self.n_bins != self.per_dim**self.d:
            raise ValueError("n_bins must be per_dim ** d")

    def bin_indices(self, points: np.ndarray) -> list[int]:
        """The 1-based flat bin index of each point.

        Each coordinate is rounded to the nearest multiple of gamma (``a = rint(y / gamma)``,
        half to even), clipped into ``[a_min, a_max]``; the digits ``u_t = a_t - a_min`` are
        flattened as ``j = 1 + sum_t u_t B^(t-1)`` (dimension 1 least significant). A point
        inside the box is never clipped, so ``|y - centre(j)| <= gamma / 2`` per coordinate.

        Args:
            points: ``[m, d]`` float (float64 expected), finite.

        Returns:
            ``m`` Python ints in ``[1, n_bins]``.

        Raises:
            ValueError: wrong shape or non-finite coordinates.

        References:
            Pan et al. App. H (``a(y)``); spec mufc.md 1.3 step 3 and 1.4.
        """
        pts = np.asarray(points, dtype=np.float64)
        if pts.ndim != 2 or pts.shape[1] != self.d:
            raise ValueError(f"points must have shape [m, {self.d}], got {pts.shape}")
        if not np.all(np.isfinite(pts)):
            raise ValueError("points must be finite")
        # Clip before converting: far-away points would overflow int64.
        a = np.clip(np.rint(pts / self.gamma), self.a_min, self.a_max).astype(np.int64)
        digits = (a - self.a_min).tolist()
        base = self.per_dim
        out = []
        for row in digits:
            j = 0
            for u in reversed(row):
                j = j * base + u
            out.append(j + 1)
        return out

    def bin_centres(self, indices: Sequence[int]) -> np.ndarray:
        """The centres ``gamma * (u_t + a_min)`` of the bins with the given 1-based indices.

        Args:
            indices: ``m`` integers in ``[1, n_bins]`` (Python or NumPy ints).

        Returns:
            ``[m, d]`` float64 (``[0, d]`` for no indices).

        Raises:
            ValueError: an index outside ``[1, n_bins]``.
            TypeError: an index that is not an integer.

        References:
            Spec mufc.md 1.4 (inverse map at the server) and 1.6 step 2.
        """
        out = np.empty((len(indices), self.d), dtype=np.float64)
        base = self.per_dim
        for row, raw in enumerate(indices):
            if isinstance(raw, bool):
                raise TypeError("bin indices must be integers, not bool")
            j = operator.index(raw)
            if not 1 <= j <= self.n_bins:
                raise ValueError(f"bin index {j} is outside [1, {self.n_bins}]")
            rest = j - 1
            for t in range(self.d):
                rest, u = divmod(rest, base)
                out[row, t] = self.gamma * float(u + self.a_min)
        return out


def _lattice_range(lo: float, hi: float, gamma: float) -> tuple[int, int]:
    return int(np.rint(lo / gamma)), int(np.rint(hi / gamma))


def make_grid(n: int, d: int, *, lo: float = 0.0, hi: float = 1.0, gamma: float | None = None) -> Grid:
    """The public grid for ``n`` points in ``[lo, hi]^d``.

    Args:
        n: total number of points at setup (``>= 1``); sets the default gamma.
        d: dimension (``>= 1``).
        lo: lower end of the shared box (default 0, the authors' code's [0, 1] data).
        hi: upper end of the shared box (default 1).
        gamma: quantization step; default ``1 / sqrt(n)`` (the paper's default,
            ``gamma = Theta(1/sqrt(n))`` keeps the quantization term of Theorem 4.1 at
            ``O(d log K)``).

    Returns:
        The `Grid` with ``a_min = round(lo / gamma)``, ``a_max = round(hi / gamma)``,
        ``B = a_max - a_min + 1`` and ``n_bins = B^d``.

    Raises:
        ValueError: ``n < 1``, ``d < 1``, a non-positive gamma, or ``lo >= hi``.

    References:
        Pan et al. Sec. 4.2 and Theorem 4.1; spec mufc.md 1.2 and 1.4.
    """
    if isinstance(n, bool) or operator.index(n) < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if isinstance(d, bool) or operator.index(d) < 1:
        raise ValueError(f"d must be a positive int, got {d!r}")
    step = 1.0 / math.sqrt(n) if gamma is None else float(gamma)
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(step) and step > 0):
        raise ValueError(f"gamma must be positive and finite, got {gamma!r}")
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"the box needs finite lo < hi, got [{lo!r}, {hi!r}]")
    if max(abs(lo), abs(hi)) / step >= _MAX_LATTICE:
        raise ValueError("the box spans too many grid steps for exact float64 rounding")
    a_min, a_max = _lattice_range(lo, hi, step)
    per_dim = a_max - a_min + 1
    d = operator.index(d)
    return Grid(gamma=step, lo=lo, hi=hi, d=d, a_min=a_min, a_max=a_max, per_dim=per_dim, n_bins=per_dim**d)

"""What the (k,z) solvers share: the geometric grid of radius guesses and the block size of
row-blocked distance scans.

:func:`radius_grid` is the grid of Guo & Li's (k,z)-center search (Section 2, spec
kz-clustering.md 2.4) and of the (k,z)-median/means coresets (Appendix C, spec 3.2); every party
builds it from the same arguments, bit for bit. ``_BLOCK_ROWS`` bounds the rows of the distance
blocks the aggregation and the covers scan at once (memory ``_BLOCK_ROWS x n`` float64).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["radius_grid"]

_BLOCK_ROWS = 256
"""Rows of one block of a row-blocked distance scan (aggregation, covers, breakpoints)."""


def radius_grid(lower: float, upper: float, eps: float) -> np.ndarray:
    """The geometric grid ``lower * (1+eps)^t``, ``t = 0, 1, ...``, up to the first value ``>= upper``.

    Each value is computed as a power (not a running product), so grids built by different parties
    from the same arguments are bit-identical.

    Args:
        lower: first value, ``> 0``.
        upper: the grid ends at the first value ``>= upper``.
        eps: ratio ``1 + eps`` between neighbours, ``eps > 0``.

    Returns:
        float64 ``[T]``, ``T >= 1``, strictly increasing.

    Raises:
        ValueError: a non-positive or non-finite ``lower``, ``eps <= 0``, or more than 100,000
            values (an aspect ratio beyond what any run can afford).

    References:
        Guo & Li, Section 2.2 and Appendix B; spec section 2.4.
    """
    if not (math.isfinite(lower) and lower > 0):
        raise ValueError(f"lower must be positive and finite, got {lower}")
    if not (math.isfinite(upper)):
        raise ValueError(f"upper must be finite, got {upper}")
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")
    if upper <= lower:
        return np.array([lower], dtype=np.float64)
    count = int(math.ceil(math.log(upper / lower) / math.log1p(eps))) + 1
    if count > 100_000:
        raise ValueError(f"a grid from {lower:g} to {upper:g} with ratio 1+{eps:g} has {count} values")
    values = lower * (1.0 + eps) ** np.arange(count + 1, dtype=np.float64)
    last = int(np.searchsorted(values, upper, side="left"))  # first index with value >= upper
    return values[: last + 1]


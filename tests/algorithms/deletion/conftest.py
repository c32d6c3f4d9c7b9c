"""Shared data for the deletion tests: small Gaussian mixtures in [0, 1]^d."""

from __future__ import annotations

import numpy as np
import pytest

#: Four well separated corners of the unit cube (d = 3).
CORNERS = ((0.2, 0.2, 0.2), (0.8, 0.8, 0.2), (0.2, 0.8, 0.8), (0.8, 0.2, 0.8))


def _mixture(seed: int, sizes, d: int = 3, sd: float = 0.05, centers=None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if centers is None:
        centers = rng.uniform(0.2, 0.8, size=(len(sizes), d))
    parts = [rng.normal(c, sd, size=(s, d)) for c, s in zip(np.asarray(centers, dtype=float), sizes)]
    return np.clip(np.concatenate(parts), 0.0, 1.0)


@pytest.fixture
def mixture():
    """``mixture(seed, sizes, d=3, sd=0.05, centers=None)``: a Gaussian mixture clipped to
    ``[0, 1]^d``, component by component (random centres in ``[0.2, 0.8]^d`` by default)."""
    return _mixture


@pytest.fixture
def corners():
    """`CORNERS` as an array ``[4, 3]``."""
    return np.asarray(CORNERS)

"""Tests for the MUFC quantization grid (spec mufc.md 1.3 step 3, 1.4; oracle 10)."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from fedproto.algorithms.mufc.quantize import Grid, make_grid

# ------------------------------------------------------------------ slow reference


def ref_index(point, gamma, a_min, a_max, per_dim):
    """Pure-Python spec 1.4: a = round(y / gamma) (half to even), clipped; 1 + sum u_t B^(t-1)."""
    j = 1
    for t, y in enumerate(point):
        a = min(max(round(float(y) / gamma), a_min), a_max)
        j += (a - a_min) * per_dim**t
    return j


# ------------------------------------------------------------------ construction


def test_default_gamma_and_spec_sizes():
    # Spec 2.7's derived table: Celltype (n = 12009, d = 10) has B = 111, Gaussian (n = 30000) B = 174.
    cell = make_grid(12009, 10)
    assert cell.gamma == 1 / math.sqrt(12009)
    assert (cell.a_min, cell.a_max, cell.per_dim) == (0, 110, 111)
    assert cell.n_bins == 111**10 and cell.n_bins > 2**64 and isinstance(cell.n_bins, int)
    assert make_grid(30000, 10).per_dim == 174
    # The paper's centred cube: B is about 1 / gamma (+1 for the two boundary half-cells).
    centred = make_grid(100, 3, lo=-0.5, hi=0.5)
    assert (centred.a_min, centred.a_max, centred.per_dim) == (-5, 5, 11)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 0, "d": 2},
        {"n": 10, "d": 0},
        {"n": 10, "d": 2, "gamma": 0.0},
        {"n": 10, "d": 2, "gamma": float("nan")},
        {"n": 10, "d": 2, "lo": 1.0, "hi": 1.0},
        {"n": 10, "d": 2, "gamma": 1e-300},
    ],
)
def test_make_grid_rejects_bad_parameters(kwargs):
    with pytest.raises(ValueError):
        make_grid(**kwargs)


def test_grid_rejects_inconsistent_fields():
    g = make_grid(16, 2)
    fields = {f: getattr(g, f) for f in ("gamma", "lo", "hi", "d", "a_min", "a_max", "per_dim", "n_bins")}
    assert Grid(**fields) == g
    for name, value in (("per_dim", g.per_dim + 1), ("n_bins", g.n_bins - 1), ("a_max", g.a_max + 1), ("d", 0)):
        with pytest.raises(ValueError):
            Grid(**{**fields, name: value})


# ------------------------------------------------------------------ index map


def test_worked_example_flattening():
    """Spec 2.6: d = 2, B = 2, j = 1 + u_1 + 2 u_2 (dimension 1 least significant)."""
    g = make_grid(4, 2, gamma=1.0)
    assert g.per_dim == 2 and g.n_bins == 4
    centres = g.bin_centres([1, 2, 3, 4])
    np.testing.assert_array_equal(centres, [[0, 0], [1, 0], [0, 1], [1, 1]])
    assert g.bin_indices(np.array([[0.1, 0.2], [0.9, 0.3], [0.2, 0.8], [0.7, 0.6]])) == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("n", "d", "lo", "hi", "gamma"),
    [(12009, 10, 0.0, 1.0, None), (50, 3, -0.5, 0.5, None), (7, 1, -2.0, 3.0, 0.3), (1000, 4, 0.0, 1.0, 0.07)],
)
def test_points_round_trip_to_their_bin_centres(n, d, lo, hi, gamma):
    """Oracle 10: |c - centre(bin(c))|_inf <= gamma/2, indices in [1, B^d], matches the reference."""
    g = make_grid(n, d, lo=lo, hi=hi, gamma=gamma)
    rng = np.random.default_rng(n + d)
    pts = rng.uniform(lo, hi, size=(400, d))
    pts[:3] = lo  # box corners and exact lattice points
    pts[3:6] = hi
    pts[6] = g.gamma * np.arange(g.a_min, g.a_min + d)
    idx = g.bin_indices(pts)
    assert all(type(j) is int and 1 <= j <= g.n_bins for j in idx)
    assert idx == [ref_index(p, g.gamma, g.a_min, g.a_max, g.per_dim) for p in pts]
    centres = g.bin_centres(idx)
    assert centres.shape == (400, d) and centres.dtype == np.float64
    # gamma/2 plus float64 rounding of y / gamma and gamma * a (a few ulps of the coordinates)
    slack = 8 * np.finfo(float).eps * max(abs(lo), abs(hi), 1.0)
    assert np.max(np.abs(pts - centres)) <= g.gamma / 2 + slack
    # the server recovers exactly the centre whose bin the client computed
    assert g.bin_indices(centres) == idx


def test_index_map_is_a_bijection_on_a_small_grid():
    g = make_grid(9, 3, gamma=1 / 3)  # B = 4, 64 bins
    assert g.per_dim == 4 and g.n_bins == 64
    centres = g.bin_centres(range(1, 65))
    assert len({tuple(c) for c in centres}) == 64
    assert g.bin_indices(centres) == list(range(1, 65))
    # every lattice point of the box is one of the centres
    lattice = {tuple(g.gamma * np.array(u, dtype=float)) for u in itertools.product(range(4), repeat=3)}
    assert lattice == {tuple(c) for c in centres}


def test_huge_indices_round_trip_beyond_64_bits():
    g = make_grid(12009, 10)
    rnd = random.Random(7)
    idx = [1, g.n_bins, 2**64, 2**64 + 1, *(rnd.randrange(1, g.n_bins + 1) for _ in range(200))]
    assert g.bin_indices(g.bin_centres(idx)) == idx
    # numpy integer indices are accepted too
    assert g.bin_indices(g.bin_centres(np.array([5, 17], dtype=np.int64))) == [5, 17]


def test_points_outside_the_box_are_clipped_to_the_boundary_bins():
    g = make_grid(4, 2, gamma=0.5)  # lattice 0, 0.5, 1 per dimension
    idx = g.bin_indices(np.array([[-3.0, 0.5], [7.0, 1.2], [0.26, -0.1]]))
    np.testing.assert_array_equal(g.bin_centres(idx), [[0.0, 0.5], [1.0, 1.0], [0.5, 0.0]])


def test_bad_indices_and_points_raise():
    g = make_grid(16, 2)
    for bad in (0, -1, g.n_bins + 1):
        with pytest.raises(ValueError):
            g.bin_centres([bad])
    with pytest.raises(TypeError):
        g.bin_centres([True])
    with pytest.raises(TypeError):
        g.bin_centres([1.5])
    with pytest.raises(ValueError):
        g.bin_indices(np.zeros((3, 3)))
    with pytest.raises(ValueError):
        g.bin_indices(np.array([[0.1, np.nan]]))
    assert g.bin_centres([]).shape == (0, 2)
    assert g.bin_indices(np.zeros((0, 2))) == []

"""`IncrementalKMeans`: a re-clustering answered by certification equals a full run, bit for bit.

The server's model after a removal must equal training on the remaining data (Pan et al., Sec. 5;
spec mufc.md 3.5). `IncrementalKMeans` skips the full K-means++ run when it can prove the result
(issue 13's skip rule); every test here holds the skipped path's centroids equal to a fresh
engine's full run on the same weights, over removal streams that exercise each path: certified
outright, restarts continued from their first uncertified iteration, and full runs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedproto.algorithms.mufc import _kernels
from fedproto.algorithms.mufc.clustering import IncrementalKMeans, PaddedPoints
from fedproto.algorithms.mufc.quantize import make_grid

KEY = jax.random.fold_in(jax.random.PRNGKey(11), 0)


def _lattice(seed: int, n_bins: int = 120, d: int = 3, k: int = 4, spread: float = 6.0):
    """Integer points (lattice coordinates) in ``k`` overlapping blobs, with integer weights."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-30, 30, size=(k, d))
    x = np.rint(centres[rng.integers(k, size=4 * n_bins)] + rng.normal(0, spread, size=(4 * n_bins, d)))
    x = np.unique(x, axis=0)[:n_bins]
    w = rng.integers(1, 30, size=len(x)).astype(np.float64)
    return x, w


def _fresh(x, w, k, **kwargs):
    return IncrementalKMeans(x, KEY, k, min_rows=len(x), **kwargs).fit(w)[0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_single_removals_give_the_centroids_of_a_full_run(seed):
    x, w = _lattice(seed)
    engine = IncrementalKMeans(x, KEY, 4, min_rows=len(x))
    engine.fit(w)
    rng = np.random.default_rng(100 + seed)
    for _ in range(40):
        j = rng.choice(np.flatnonzero(w > 1), p=w[w > 1] / w[w > 1].sum())
        w = w.copy()
        w[j] -= 1
        centroids, cost = engine.fit(w)
        np.testing.assert_array_equal(centroids, _fresh(x, w, 4))
        assert np.isclose(cost, float(np.sum(w * ((x[:, None] - centroids[None]) ** 2).sum(-1).min(1))), rtol=1e-12)
    # the skip rule was exercised, and so was the fallback of re-running some restarts
    assert engine.certified > 0
    assert engine.full_runs + engine.certified == 41


def test_continued_restarts_and_full_runs_also_match():
    """Heavy removals (a fifth of a bin's weight at once, several bins per call) move centroids
    far enough that restarts change their trajectories: continued or re-run, the result is
    still a full run's."""
    x, w = _lattice(5, n_bins=80)
    engine = IncrementalKMeans(x, KEY, 4, min_rows=len(x))
    engine.fit(w)
    rng = np.random.default_rng(7)
    for _ in range(25):
        w = w.copy()
        rows = rng.choice(len(w), size=3, replace=False)
        w[rows] = np.maximum(1, w[rows] - np.ceil(w[rows] / 5))
        np.testing.assert_array_equal(engine.fit(w)[0], _fresh(x, w, 4))
    assert engine.continued > 0


def test_a_weight_that_rises_is_answered_by_a_full_run():
    x, w = _lattice(3)
    engine = IncrementalKMeans(x, KEY, 4, min_rows=len(x))
    engine.fit(w)
    up = w.copy()
    up[0] += 5
    before = engine.full_runs
    np.testing.assert_array_equal(engine.fit(up)[0], _fresh(x, up, 4))
    assert engine.full_runs == before + 1
    # the same weights again: the same model, no run
    again = engine.fit(up)[0]
    np.testing.assert_array_equal(again, _fresh(x, up, 4))


def test_non_integer_points_are_never_certified_and_still_correct():
    x, w = _lattice(4)
    x = x + 0.25  # no longer integers: sums are not exact in every order
    engine = IncrementalKMeans(x, KEY, 4, min_rows=len(x))
    engine.fit(w)
    w = w.copy()
    w[np.argmax(w)] -= 1
    np.testing.assert_array_equal(engine.fit(w)[0], _fresh(x, w, 4))
    assert engine.certified == 0


def test_a_full_run_equals_padded_points_clustering():
    """The engine's full path is `weighted_kmeans` (same kernel, same winner rule)."""
    x, w = _lattice(6)
    c, cost = IncrementalKMeans(x, KEY, 4, min_rows=len(x)).fit(w)
    c2, cost2 = PaddedPoints(x, min_rows=len(x)).weighted_kmeans(KEY, w, 4)
    np.testing.assert_array_equal(c, c2)
    assert cost == cost2


def test_the_half_margin_certifies_every_row_against_moves_below_it():
    """Kernel trace: moving every centroid by less than a row's half-margin h never changes that
    row's nearest centroid (computed directly), the bound the certification rests on."""
    x, w = _lattice(8, n_bins=60)
    padded = PaddedPoints(x, min_rows=64)
    race = jnp.exp(_kernels.seeding_noise(jax.random.split(KEY, 3), 4, padded.capacity))
    wp = np.zeros(padded.capacity)
    wp[: len(w)] = w
    out = jax.device_get(_kernels.weighted_kmeans_race(race, padded._xp, wp, padded._valid, 4, 0.0, 50, trace_len=64))
    rng = np.random.default_rng(0)
    checked = 0
    for r in range(3):
        sums = out["sums"][r]
        centroids = x[out["seed_rows"][r]]
        for t in range(int(out["n_iter"][r])):
            labels = out["labels"][r, t, : len(x)]
            h = out["margins"][r, t, : len(x)].astype(np.float64)
            assert np.array_equal(labels, ((x[:, None] - centroids[None]) ** 2).sum(-1).argmin(1))
            for _ in range(5):
                step = rng.normal(size=centroids.shape)
                step /= np.linalg.norm(step, axis=1, keepdims=True)
                scale = np.clip(h.min(), 0, 1) * 0.999
                if scale <= 0:
                    continue
                moved = centroids + scale * step
                assert np.array_equal(((x[:, None] - moved[None]) ** 2).sum(-1).argmin(1), labels)
                checked += 1
            mass = sums[t, :, -1]
            centroids = np.where(mass[:, None] > 0, sums[t, :, :-1] * (1.0 / np.where(mass > 0, mass, 1))[:, None],
                                 centroids)
        np.testing.assert_array_equal(centroids, out["centroids"][r])
    assert checked > 0


def test_lattice_points_are_the_bin_centres_in_units_of_gamma():
    grid = make_grid(400, 3)
    bins = [1, 7, grid.n_bins, grid.n_bins // 2]
    lattice = grid.lattice_points(bins)
    assert lattice.dtype == np.int64 and lattice.shape == (4, 3)
    np.testing.assert_array_equal(grid.bin_centres(bins), grid.gamma * lattice.astype(np.float64))
    with pytest.raises(ValueError):
        grid.lattice_points([0])
    with pytest.raises(TypeError):
        grid.lattice_points([True])


def test_fit_refuses_bad_weights():
    x, w = _lattice(9)
    engine = IncrementalKMeans(x, KEY, 4)
    for bad in (w[:-1], np.where(np.arange(len(w)) == 0, 0.0, w), np.where(np.arange(len(w)) == 0, np.nan, w)):
        with pytest.raises(ValueError):
            engine.fit(bad)
    with pytest.raises(ValueError):
        IncrementalKMeans(x, KEY, 0)

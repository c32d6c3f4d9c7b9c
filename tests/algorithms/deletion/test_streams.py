"""Deletion streams: the stream, the timing bookkeeping (with a fake clock) and the metrics."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

from fedproto.algorithms.deletion import streams
from fedproto.algorithms.deletion.dckmeans import DCKMeansConfig
from fedproto.algorithms.deletion.qkmeans import QKMeansConfig, train_qkmeans


def ticking_clock():
    """A clock that advances one second per reading."""
    counter = itertools.count()
    return lambda: float(next(counter))


def test_deletion_stream_is_uniform_without_replacement():
    ids = np.arange(100) + 7
    stream = streams.deletion_stream(ids, 30, seed=1)
    assert len(set(stream.tolist())) == 30 and set(stream.tolist()) <= set(ids.tolist())
    np.testing.assert_array_equal(stream, streams.deletion_stream(ids, 30, seed=1))
    with pytest.raises(ValueError):
        streams.deletion_stream(ids, 101, seed=1)


def test_gaussian_mixture_follows_the_recipe():
    x, y = streams.gaussian_mixture(1000, 0, d=25, k=5)
    assert x.shape == (1000, 25) and np.bincount(y).tolist() == [200] * 5
    assert x.min() == 0.0 and x.max() == 1.0


@pytest.mark.parametrize("method", ["q", "dc"])
def test_time_stream_charges_training_and_each_deletion(mixture, method):
    x = mixture(50, (20, 20, 20))
    ids = np.arange(len(x))
    stream = streams.deletion_stream(ids, 5, seed=0)
    timing = streams.time_stream(
        method, x, ids, stream, q_config=QKMeansConfig(k=3, eps=1 / 16), dc_config=DCKMeansConfig(k=3, width=2),
        key=jax.random.PRNGKey(0), clock=ticking_clock(),
    )
    assert timing.train_s == 1.0 and timing.deletion_s == (1.0,) * 5
    assert timing.amortised_s == pytest.approx((1 + 5) / 5)
    np.testing.assert_array_equal(timing.cumulative_s, [1, 2, 3, 4, 5, 6])
    if method == "q":
        keep = ~np.isin(ids, stream)
        fresh = train_qkmeans(x[keep], ids[keep], QKMeansConfig(k=3, eps=1 / 16), jax.random.PRNGKey(0))
        np.testing.assert_array_equal(timing.final, fresh.centroids)
    else:
        assert timing.retrained == (False,) * 5


def test_time_baseline_retrains_and_estimates_the_untimed_deletions(mixture):
    x = mixture(51, (20, 20, 20))
    ids = np.arange(len(x))
    stream = streams.deletion_stream(ids, 6, seed=0)
    timing = streams.time_baseline(x, ids, stream, 3, key=jax.random.PRNGKey(0), retrains=2, clock=ticking_clock())
    assert timing.train_s == 1.0 and timing.deletion_s == (1.0,) * 6 and all(timing.retrained)
    keep = ~np.isin(ids, stream)
    np.testing.assert_array_equal(timing.final, streams.baseline_kmeans(x[keep], ids[keep], 3, jax.random.PRNGKey(0)))
    with pytest.raises(ValueError):
        streams.amortised_s(1.0, [])


def test_quality_metrics(mixture):
    x = mixture(52, (20, 20, 20), sd=0.01)
    y = np.repeat(np.arange(3), 20)
    centres = np.stack([x[y == j].mean(0) for j in range(3)])
    q = streams.quality(x, y, centres)
    assert q["nmi"] == pytest.approx(1.0)
    assert 0.9 < q["silhouette"] <= 1.0
    assert q["loss"] == pytest.approx(sum(((x[y == j] - centres[j]) ** 2).sum() for j in range(3)))
    one = streams.quality(x, None, centres[:1])
    assert np.isnan(one["silhouette"]) and np.isnan(one["nmi"])
    converged = streams.converged_kmeans(x, np.arange(60), 3, jax.random.PRNGKey(1))
    assert streams.quality(x, y, converged)["loss"] <= streams.quality(
        x, y, streams.baseline_kmeans(x, np.arange(60), 3, jax.random.PRNGKey(1), iterations=1))["loss"] + 1e-12

"""The server's removal round (`ServerModel`): its shortcuts give the model of a fresh server.

A removal that empties no bin and fills none keeps the server's points (only weights change), the
sums the model computed itself are not checked twice, and a one-bin change decodes without
Berlekamp-Massey: each test holds a shortcut's outcome equal to a fresh server's (spec mufc.md
1.6, 2.4, 3.5; issue 13's skip rules).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fedproto.algorithms import scma
from fedproto.algorithms.mufc.protocol import ServerModel, make_config
from fedproto.algorithms.mufc.seeding import LocalSeeding

KEY = jax.random.PRNGKey(4)


def _federation(seed: int = 0, n_clients: int = 4, n: int = 160, k: int = 3):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.2, 0.8, size=(k, 2))
    x = np.clip(np.concatenate([rng.normal(c, 0.05, size=(n // k, 2)) for c in centres]), 0, 1)
    ids = np.arange(len(x))
    rows = [np.arange(c, len(x), n_clients) for c in range(n_clients)]
    config = make_config(len(x), 2, k, n_clients, n_init=4)
    locals_ = [LocalSeeding(x[r], ids[r], k, jax.random.fold_in(KEY, c + 1)) for c, r in enumerate(rows)]
    return config, locals_


def _counts(config, locals_):
    total: dict[int, int] = {}
    for local in locals_:
        for j, q in local.counts(config.grid).items():
            total[j] = total.get(j, 0) + q
    return dict(sorted(total.items()))


def _fresh(config, counts):
    model = ServerModel(config, jax.random.fold_in(KEY, 0))
    model.adopt(dict(counts), 0)
    return model.centroids


def test_an_unchanged_support_reuses_the_points_and_clusters_like_a_fresh_server():
    config, locals_ = _federation()
    counts = _counts(config, locals_)
    model = ServerModel(config, jax.random.fold_in(KEY, 0))
    model.adopt(dict(counts), 0)
    points = model._points
    rng = np.random.default_rng(1)
    for round_idx in range(1, 7):
        j = int(rng.choice([b for b, q in counts.items() if q > 1]))
        counts[j] -= 1  # one count down, no bin emptied: the same support
        assert model.adopt(dict(counts), round_idx)
        assert model._points is points  # the shortcut was taken
        np.testing.assert_array_equal(model.centroids, _fresh(config, counts))
    # the same bins listed in another order: the points are rebuilt (sorted), the model the same
    shuffled = dict(reversed(list(counts.items())))
    shuffled[next(iter(shuffled))] -= 1
    assert model.adopt(shuffled, 7)
    np.testing.assert_array_equal(model.centroids, _fresh(config, shuffled))
    # a bin emptied: another support, fresh points
    j = min(counts, key=counts.get)
    counts.pop(j)
    assert model.adopt(dict(counts), 8)
    assert model._points is not points
    np.testing.assert_array_equal(model.centroids, _fresh(config, counts))


@pytest.mark.parametrize("bad", [0, True, 2.0])
def test_an_unchanged_support_still_refuses_counts_that_are_not_positive_integers(bad):
    config, locals_ = _federation(seed=2)
    counts = _counts(config, locals_)
    model = ServerModel(config, jax.random.fold_in(KEY, 0))
    model.adopt(dict(counts), 0)
    counts[next(j for j, q in counts.items() if q > 2)] = bad  # a real change (True == 1, 2.0 == 2)
    with pytest.raises((ValueError, TypeError)):
        model.adopt(dict(counts), 1)


def test_decoding_its_own_sums_equals_decoding_a_copy_and_foreign_sums_are_checked():
    """The sums `sum_shares` returned skip the element check in `decode`; a copy is checked and
    decodes the same, and a copy with an element outside F_p is refused."""
    config, locals_ = _federation(seed=3)
    p, t = config.prime, config.n_syndromes

    def shares(locs):
        return [scma.pack_elements(scma.rs_syndromes(loc.counts(config.grid), p, t), p) for loc in locs]

    own, other = (ServerModel(config, jax.random.fold_in(KEY, 0)) for _ in range(2))
    n = sum(loc.n for loc in locals_)
    for model in (own, other):
        model.decode(model.sum_shares(shares(locals_)), n_clients=len(locals_), max_total=n)
    # one point leaves client 0 (no seed among the candidates): one bin changes
    local = locals_[0]
    ids, _ = local.assignment()
    local.remove((next(int(i) for i in ids if int(i) not in local.seeds),))
    sums = own.sum_shares(shares(locals_))
    got = own.decode(sums, n_clients=len(locals_), max_total=n)
    assert got == other.decode(list(sums), n_clients=len(locals_), max_total=n) == _counts(config, locals_)
    bad = list(sums)
    bad[0] = p
    with pytest.raises(ValueError):
        other.decode(bad, n_clients=len(locals_), max_total=n)

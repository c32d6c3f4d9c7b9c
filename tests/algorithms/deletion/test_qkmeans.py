"""Q-k-means: quantiser, keyed seeding, training against a NumPy reference, and exact deletion.

Spec deletion-kmeans.md, oracles O-Q-1 .. O-Q-7 and O-Q-9 (section 7.1). Most data sets here have
550-576 points so that they share one padded shape (`_kernels.capacity`) and compile once.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from fedproto.algorithms.deletion import _kernels
from fedproto.algorithms.deletion._store import DeletionError
from fedproto.algorithms.deletion.qkmeans import (
    QKMeans,
    QKMeansConfig,
    certify_removal,
    default_epsilon,
    train_qkmeans,
)
from fedproto.testing import load_file

helpers = load_file(Path(__file__).resolve().parents[2] / "_helpers.py", "tests_helpers")


def same_model(a, b) -> bool:
    """Pathwise equality of two Q-k-means models: seeds, phases, lattice indices, decisions."""
    return (
        a.eps == b.eps
        and a.executed == b.executed
        and np.array_equal(a.seed_ids, b.seed_ids)
        and np.array_equal(a.thetas, b.thetas)
        and np.array_equal(a.accepted, b.accepted)
        and np.array_equal(a.indices[: a.executed], b.indices[: b.executed])
        and np.array_equal(a.centroids, b.centroids)
    )


def without(x, ids, i):
    keep = ids != i
    return x[keep], ids[keep]


# --------------------------------------------------------------------------- quantiser (O-Q-4)


def test_quantizer_error_idempotence_and_shift():
    rng = np.random.default_rng(0)
    eps = 0.125
    x = rng.uniform(-2, 2, size=(200, 5))
    theta = rng.uniform(-0.5, 0.5, size=5)
    a, slack = _kernels.quantize(x, eps, theta)
    q = np.asarray(_kernels.lattice_points(a, eps, theta))
    assert np.max(np.abs(q - x)) <= eps / 2 + 1e-15
    assert np.all((np.asarray(slack) >= 0) & (np.asarray(slack) <= 0.5))
    a2, _ = _kernels.quantize(q, eps, theta)
    np.testing.assert_array_equal(np.asarray(a2), np.asarray(a))  # Q(Q(x)) = Q(x), by index
    z = rng.integers(-5, 6, size=x.shape)
    a3, _ = _kernels.quantize(x + eps * z, eps, theta)
    np.testing.assert_array_equal(np.asarray(a3), np.asarray(a) + z)  # Q(x + eps z) = Q(x) + eps z


def test_quantizer_is_unbiased_over_random_phases():
    n, eps = 100_000, 0.25
    x = np.array([0.3141, 0.9, 0.5])
    thetas = jax.random.uniform(jax.random.PRNGKey(3), (n, 3), jnp.float64, -0.5, 0.5)
    a, _ = _kernels.quantize(jnp.asarray(x)[None, :], eps, thetas)
    err = np.asarray(_kernels.lattice_points(a, eps, thetas)) - x
    sigma = eps / math.sqrt(12 * n)
    assert np.all(np.abs(err.mean(axis=0)) < 4 * sigma)
    assert np.all(np.abs(err) <= eps / 2 + 1e-15)


def test_quantizer_instability_rate_matches_formula_and_lemma_bound():
    n, eps = 100_000, 0.25
    x = np.array([0.3, 0.7])
    delta = np.array([0.01, -0.03])
    thetas = jax.random.uniform(jax.random.PRNGKey(5), (n, 2), jnp.float64, -0.5, 0.5)
    a, _ = _kernels.quantize(jnp.asarray(x)[None, :], eps, thetas)
    b, _ = _kernels.quantize(jnp.asarray(x + delta)[None, :], eps, thetas)
    rate = float(np.mean(np.any(np.asarray(a) != np.asarray(b), axis=1)))
    exact = 1 - np.prod(1 - np.abs(delta) / eps)
    sigma = math.sqrt(exact * (1 - exact) / n)
    assert abs(rate - exact) < 5 * sigma
    assert rate < 2 * 2 * np.linalg.norm(delta) / eps  # Lemma C.2: 2 d ||delta|| / eps


@pytest.mark.parametrize(
    ("n", "k", "d", "exponent"),
    [(12_009, 4, 10, -5), (15_120, 7, 52, -4), (60_000, 10, 784, -2), (74_975, 5, 15, -5),
     (100_000, 5, 25, -5), (1_018_298, 11, 115, -5)],
)
def test_default_epsilon_matches_the_spec_table(n, k, d, exponent):
    assert default_epsilon(n, k, d) == 2.0**exponent


# --------------------------------------------------------------------------- k-means++ seeding


def test_kmeanspp_draws_follow_exact_d2_probabilities():
    pts = np.array([0.0, 1.0, 3.0, 6.0, 10.0])
    xp, ip, valid = _kernels.pad_rows(pts[:, None], np.arange(5))
    keys = jax.random.split(jax.random.PRNGKey(11), 6000)
    rows, count = jax.vmap(lambda key: _kernels.kmeanspp_seeding(key, xp, ip, valid, 2))(keys)
    expected = np.zeros((5, 5))
    for j in range(5):
        w = (pts - pts[j]) ** 2
        expected[j] = len(keys) / 5 * w / w.sum()
    helpers.assert_pair_draws_follow(rows, count, expected)


def test_seeding_is_coupled_by_point_id(mixture):
    x = mixture(1, (140, 140, 140, 140))
    ids = np.arange(len(x)) * 3 + 7
    key = jax.random.PRNGKey(2)
    xp, ip, valid = _kernels.pad_rows(x, ids)
    rows, _ = _kernels.kmeanspp_seeding(key, xp, ip, valid, 4)
    seeds = ids[np.asarray(rows)]
    # Same seeds without any non-seed point, and whatever the row order.
    for i in ids[:20]:
        if i in seeds:
            continue
        xr, ir = without(x, ids, i)
        r2, _ = _kernels.kmeanspp_seeding(key, *_kernels.pad_rows(xr, ir), 4)
        np.testing.assert_array_equal(ir[np.asarray(r2)], seeds)
    perm = np.random.default_rng(0).permutation(len(x))
    r3, _ = _kernels.kmeanspp_seeding(key, *_kernels.pad_rows(x[perm], ids[perm]), 4)
    np.testing.assert_array_equal(ids[perm][np.asarray(r3)], seeds)


def test_seeding_stops_when_points_run_out():
    x = np.array([[0.1], [0.1], [0.5], [0.5], [0.5]])
    rows, count = _kernels.kmeanspp_seeding(jax.random.PRNGKey(0), *_kernels.pad_rows(x, np.arange(5)), 3)
    assert int(count) == 2
    assert np.asarray(rows)[2] == -1
    assert sorted(x[np.asarray(rows)[:2], 0]) == [0.1, 0.5]
    with pytest.raises(ValueError, match="distinct"):
        train_qkmeans(x, np.arange(5), QKMeansConfig(k=3, eps=0.1), jax.random.PRNGKey(0))


# --------------------------------------------------------------------------- training (O-Q-5)


def reference_qkmeans(x, seeds, thetas, eps, gamma, k):
    """Alg. 4 in plain NumPy, one point at a time for the statistics (slow reference)."""
    n = len(x)
    mass = gamma * n / k

    def assign(c):
        d2 = ((x[:, None, :] - c[None]) ** 2).sum(-1)
        return d2.argmin(1), d2.min(1).sum()

    chat = seeds.copy()
    labels, best = assign(chat)
    out = {"indices": [], "sums": [], "counts": [], "losses": [best], "accepted": []}
    for theta in thetas:
        s, m = np.zeros_like(chat), np.zeros(k)
        for p, lab in zip(x, labels):
            s[lab] += p
            m[lab] += 1
        c = chat.copy()
        for j in range(k):
            if m[j] == 0:
                continue
            c[j] = (s[j] + (mass - m[j]) * chat[j]) / mass if m[j] < mass else s[j] / m[j]
        a = np.round(c / eps - theta).astype(np.int64)
        q = eps * (theta + a)
        new_labels, loss = assign(q)
        for name, value in (("indices", a), ("sums", s), ("counts", m), ("losses", loss)):
            out[name].append(value)
        out["accepted"].append(loss < best)
        if not loss < best:
            break
        chat, labels, best = q, new_labels, loss
    return out


@pytest.mark.parametrize(("eps", "gamma"), [(1 / 64, 0.2), (1 / 16, 0.5), (1 / 256, 0.0)])
def test_training_matches_the_numpy_reference(mixture, eps, gamma):
    x = mixture(2, (30, 180, 180, 180), sd=0.08)
    ids = np.arange(len(x))
    model = train_qkmeans(x, ids, QKMeansConfig(k=4, eps=eps, gamma=gamma), jax.random.PRNGKey(4))
    ref = reference_qkmeans(x, model.seed_centroids, model.thetas, eps, gamma, 4)
    e = model.executed
    assert e == len(ref["indices"])
    np.testing.assert_array_equal(model.indices[:e], np.stack(ref["indices"]))
    np.testing.assert_array_equal(model.counts[:e], np.stack(ref["counts"]))
    np.testing.assert_allclose(model.sums[:e], np.stack(ref["sums"]), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(model.losses[: e + 1], ref["losses"], rtol=1e-12)
    np.testing.assert_array_equal(model.accepted[:e], ref["accepted"])


@pytest.mark.parametrize("eps", [1 / 4, 1 / 64, 1 / 256])
def test_training_invariants(mixture, eps):
    x = mixture(3, (40, 170, 170, 170), sd=0.08)
    ids = np.arange(len(x))
    config = QKMeansConfig(k=4, eps=eps, iterations=10)
    for key in range(3):
        model = train_qkmeans(x, ids, config, jax.random.PRNGKey(key))
        e = model.executed
        assert 1 <= e <= config.iterations
        acc = model.accepted[:e]
        assert np.all(acc[:-1])  # only the last executed iteration may break
        assert not np.any(model.accepted[e:])
        for tau in range(1, e + 1):
            if acc[tau - 1]:
                assert model.losses[tau] < model.losses[tau - 1]
        assert model.loss <= model.losses[0]
        assert e == config.iterations or not acc[-1]
        np.testing.assert_array_equal(model.seed_centroids, x[model.seed_ids])
        # Stored statistics are those of pi_{tau-1}, recomputed here; counts sum to n.
        for tau in range(1, e + 1):
            c = model.quantized(tau - 1)
            labels = ((x[:, None, :] - c[None]) ** 2).sum(-1).argmin(1)
            sums = np.stack([x[labels == j].sum(0) for j in range(4)])
            np.testing.assert_allclose(model.sums[tau - 1], sums, atol=1e-10)
            np.testing.assert_array_equal(model.counts[tau - 1], np.bincount(labels, minlength=4))
            assert model.counts[tau - 1].sum() == len(x)
        assert model.mass_threshold == pytest.approx(0.2 * len(x) / 4)


def test_degenerate_limit_matches_plain_lloyd(mixture):
    """O-Q-6: gamma = 0 and eps = 1e-9 is Lloyd's from the same seeds, until it stops."""
    x = mixture(4, (140, 140, 140, 140), sd=0.1)
    model = train_qkmeans(x, np.arange(len(x)), QKMeansConfig(k=4, eps=1e-9, gamma=0.0), jax.random.PRNGKey(1))
    c = model.seed_centroids.copy()
    for _ in range(model.n_accepted):
        labels = ((x[:, None, :] - c[None]) ** 2).sum(-1).argmin(1)
        c = np.stack([x[labels == j].mean(0) for j in range(4)])
    assert model.n_accepted >= 2
    np.testing.assert_allclose(model.centroids, c, atol=2e-9)


# --------------------------------------------------------------------------- exact deletion


@pytest.mark.parametrize(
    ("eps", "n_deletions"),
    [(1 / 16, 50), (1 / 256, 50), pytest.param(1 / 64, 200, marks=pytest.mark.slow)],
)
def test_deletion_equals_retraining_after_every_request(mixture, eps, n_deletions):
    """O-Q-1: after each request of a random stream the model equals a coupled retrain.

    570 points and 50 deletions stay within one padded shape; the slow case crosses several.
    """
    x = mixture(5, (45, 175, 175, 175), sd=0.06)
    ids = np.arange(len(x)) + 1000
    qkm = QKMeans(QKMeansConfig(k=4, eps=eps), seed=7).fit(x, ids)
    stream = np.random.default_rng(8).choice(ids, size=n_deletions, replace=False)
    reasons = []
    for i in stream:
        outcome = qkm.delete(int(i))
        reasons.append(outcome.reason)
        fresh = train_qkmeans(qkm.store.x, qkm.store.ids, qkm.config, qkm.key)
        assert same_model(qkm.model, fresh), (i, outcome)
        assert int(i) not in qkm.store
    assert qkm.certified + qkm.retrained == n_deletions
    assert qkm.certified > 0 and qkm.retrained > 0  # both branches ran
    assert qkm.store.n == len(x) - n_deletions


def test_stacked_deletions_mix_certified_and_retrained(mixture):
    x = mixture(6, (40, 170, 170, 170), sd=0.06)
    ids = np.arange(len(x))
    qkm = QKMeans(QKMeansConfig(k=4, eps=1 / 32), seed=3).fit(x, ids)
    seeds = list(qkm.model.seed_ids)
    others = [i for i in range(len(x)) if i not in seeds]
    # certified-or-not, then a forced retrain (a seed), then more, then another seed
    plan = others[:3] + [seeds[0]] + others[3:6] + [int(qkm.model.seed_ids[0])]
    for i in plan:
        if i not in qkm.store:
            continue
        qkm.delete(i)
        fresh = train_qkmeans(qkm.store.x, qkm.store.ids, qkm.config, qkm.key)
        assert same_model(qkm.model, fresh)
    assert qkm.retrained >= 2


def certified_and_sound(model, x, ids, i, config):
    """Certify deleting i; if certified, check against a retrain with the same seeds and phases."""
    reason, _ = certify_removal(model, x[ids == i][0], config)
    if reason == "certified":
        xr, ir = without(x, ids, i)
        fresh = train_qkmeans(xr, ir, config, jax.random.PRNGKey(0), seed_ids=model.seed_ids, thetas=model.thetas)
        assert same_model(model, fresh), f"false approval of point {i}"
    return reason


@pytest.mark.parametrize("eps", [1 / 16, 1 / 128])
def test_certifier_never_approves_a_deletion_that_should_retrain(mixture, eps):
    """O-Q-2 on every non-seed point of a data set (retrains use injected seeds and phases)."""
    x = mixture(7, (40, 170, 170, 170), sd=0.08)
    ids = np.arange(len(x))
    config = QKMeansConfig(k=4, eps=eps)
    model = train_qkmeans(x, ids, config, jax.random.PRNGKey(9))
    reasons = [certified_and_sound(model, x, ids, i, config) for i in ids[::3] if i not in model.seed_ids]
    assert "certified" in reasons
    assert any(r != "certified" for r in reasons)


def test_certifier_on_a_cluster_of_two_that_becomes_one(corners):
    rng = np.random.default_rng(10)
    big = np.concatenate([rng.normal(c, 0.03, size=(180, 3)) for c in corners[:3]])
    pair = np.array([[0.9, 0.1, 0.9], [0.95, 0.12, 0.88]])
    x = np.clip(np.concatenate([big, pair]), 0, 1)
    ids = np.arange(len(x))
    seeds = np.array([0, 180, 360, 540])
    outcomes = {}
    for eps in (1 / 8, 1 / 1024):
        config = QKMeansConfig(k=4, eps=eps)
        thetas = np.asarray(_kernels.random_phases(jax.random.PRNGKey(1), 10, 3))
        model = train_qkmeans(x, ids, config, jax.random.PRNGKey(0), seed_ids=seeds, thetas=thetas)
        assert model.counts[0][3] == 2
        outcomes[eps] = certified_and_sound(model, x, ids, 541, config)
    assert outcomes[1 / 8] == "certified"
    assert outcomes[1 / 1024] != "certified"


def test_certifier_sees_a_change_of_M_in_another_cluster(mixture, corners):
    """A cluster just under M = gamma n / k moves when n drops, though p is elsewhere."""
    x = mixture(0, (26, 175, 175, 174), sd=0.03, centers=corners)
    ids = np.arange(len(x))
    config = QKMeansConfig(k=4, eps=1 / 1024)
    model = train_qkmeans(x, ids, config, jax.random.PRNGKey(0))
    i = 36
    reason = certified_and_sound(model, x, ids, i, config)
    assert reason == "lattice index changed"
    xr, ir = without(x, ids, i)
    fresh = train_qkmeans(xr, ir, config, jax.random.PRNGKey(0), seed_ids=model.seed_ids, thetas=model.thetas)
    tau = next(t for t in range(1, model.executed + 1) if np.any(fresh.indices[t - 1] != model.indices[t - 1]))
    changed = np.flatnonzero(np.any(fresh.indices[tau - 1] != model.indices[tau - 1], axis=1))
    kappa = int(np.argmin(((x[i] - model.quantized(tau - 1)) ** 2).sum(1)))
    assert kappa not in changed
    assert np.all(model.counts[tau - 1][changed] < model.mass_threshold)
    # A check that keeps M fixed (the paper's and the authors') would have approved it: a model
    # that claims one more point makes the replay use the old threshold.
    stale, _ = certify_removal(dataclasses.replace(model, n=model.n + 1), x[i], config)
    assert stale == "certified"


def test_certifier_sees_a_stop_decision_flip(mixture):
    x = mixture(0, (40, 170, 170, 170), sd=0.08)
    ids = np.arange(len(x))
    config = QKMeansConfig(k=4, eps=1 / 64)
    model = train_qkmeans(x, ids, config, jax.random.PRNGKey(0))
    assert certified_and_sound(model, x, ids, 95, config) == "stop decision changed"
    xr, ir = without(x, ids, 95)
    fresh = train_qkmeans(xr, ir, config, jax.random.PRNGKey(0), seed_ids=model.seed_ids, thetas=model.thetas)
    assert fresh.executed != model.executed
    np.testing.assert_array_equal(fresh.indices[: model.executed], model.indices[: model.executed])


def near_tie_model(x, ids, config):
    """A model whose second iteration's loss is within 1e-6 relative of the first's, found by
    bisecting the second phase between a decreasing and a non-decreasing choice."""
    base = train_qkmeans(x, ids, config, jax.random.PRNGKey(0))
    seeds, thetas = base.seed_ids, base.thetas.copy()
    rng = np.random.default_rng(0)

    def run(s, other):
        th = thetas.copy()
        th[1] = (1 - s) * thetas[1] + s * other
        m = train_qkmeans(x, ids, config, jax.random.PRNGKey(0), seed_ids=seeds, thetas=th)
        return m, m.losses[2] - m.losses[1]

    for _ in range(40):
        other = rng.uniform(-0.5, 0.5, size=x.shape[1])
        (_, g0), (_, g1) = run(0.0, other), run(1.0, other)
        if np.sign(g0) == np.sign(g1):
            continue
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            m, g = run(mid, other)
            if np.sign(g) == np.sign(g0):
                lo = mid
            else:
                hi = mid
            if abs(g) < 1e-6 * m.losses[1]:
                return m
    raise AssertionError("no near tie found")


def test_certifier_on_a_near_tie_of_the_stop_rule(mixture):
    x = mixture(11, (40, 170, 170, 170), sd=0.08)
    ids = np.arange(len(x))
    config = QKMeansConfig(k=4, eps=1 / 32)
    model = near_tie_model(x, ids, config)
    assert model.executed >= 2 and model.accepted[0]
    assert abs(model.losses[2] - model.losses[1]) < 1e-6 * model.losses[1]
    reasons = [certified_and_sound(model, x, ids, i, config) for i in ids[::3] if i not in model.seed_ids]
    assert {"stop decision changed", "stop decision within margin"} & set(reasons)


def test_deleting_any_seed_retrains(mixture):
    """O-Q-3, the first (uniform) seed included."""
    x = mixture(12, (140, 140, 140, 140))
    config = QKMeansConfig(k=4, eps=1.0)  # coarse: every non-seed deletion would be certified
    seeds = QKMeans(config, seed=5).fit(x).model.seed_ids
    for j, s in enumerate(seeds):
        qkm = QKMeans(config, seed=5).fit(x)
        outcome = qkm.delete(int(s))
        assert outcome.retrained and outcome.reason == "seed", j
        assert qkm.retrained == 1 and qkm.certified == 0
        assert same_model(qkm.model, train_qkmeans(qkm.store.x, qkm.store.ids, config, qkm.key))


def test_huge_eps_certifies_almost_every_deletion(mixture):
    """O-Q-6, second half."""
    x = mixture(13, (140, 140, 140, 140))
    qkm = QKMeans(QKMeansConfig(k=4, eps=10.0), seed=1).fit(x)
    stream = [i for i in np.random.default_rng(1).permutation(len(x))[:100] if i not in qkm.model.seed_ids]
    for i in stream:
        qkm.delete(int(i))
    assert qkm.certified >= 0.95 * len(stream)


def test_metadata_after_a_certified_deletion_equals_fresh_training(mixture):
    """O-Q-7."""
    x = mixture(14, (40, 170, 170, 170), sd=0.06)
    qkm = QKMeans(QKMeansConfig(k=4, eps=1 / 32), seed=2).fit(x)
    n_certified = 0
    for i in np.random.default_rng(2).permutation(len(x))[:30]:
        if qkm.delete(int(i)).retrained:
            continue
        n_certified += 1
        m, fresh = qkm.model, train_qkmeans(qkm.store.x, qkm.store.ids, qkm.config, qkm.key)
        e = m.executed
        np.testing.assert_allclose(m.sums[:e], fresh.sums[:e], rtol=0, atol=1e-9)
        np.testing.assert_array_equal(m.counts[:e], fresh.counts[:e])
        np.testing.assert_allclose(m.losses[: e + 1], fresh.losses[: e + 1], rtol=0, atol=1e-9)
        assert m.n == fresh.n == qkm.store.n
        assert m.mass_threshold == pytest.approx(fresh.mass_threshold, abs=1e-12)
        assert int(i) not in qkm.store and qkm.store.x.shape == (m.n, 3)
        assert not np.any(np.all(qkm.store.x == 0, axis=1))
    assert n_certified >= 10


@pytest.mark.slow
def test_epsilon_heuristic_change_retrains():
    """With eps=None, eps follows n; a deletion across a rounding boundary retrains."""
    # n / (k d^1.5) = 316.23 is the boundary for k = 2, d = 1: eps = 2^-6 at n = 633, 2^-5 at 632.
    assert default_epsilon(633, 2, 1) == 2.0**-6 and default_epsilon(632, 2, 1) == 2.0**-5
    rng = np.random.default_rng(15)
    x = np.clip(np.concatenate([rng.normal(0.25, 0.05, 316), rng.normal(0.75, 0.05, 317)]), 0, 1)[:, None]
    qkm = QKMeans(QKMeansConfig(k=2), seed=0).fit(x)
    victim = next(i for i in range(633) if i not in qkm.model.seed_ids)
    outcome = qkm.delete(victim)
    assert outcome.retrained and outcome.reason == "epsilon changed"
    assert qkm.model.eps == 2.0**-5
    assert same_model(qkm.model, train_qkmeans(qkm.store.x, qkm.store.ids, qkm.config, qkm.key))


@pytest.mark.slow
def test_stability_rate_beats_the_lemma_bound(corners):
    """O-Q-9: certified fraction among the first m >= 1 - 2 m T k d^1.5 / (eps gamma n) - m k / n."""
    rng = np.random.default_rng(16)
    x = np.clip(np.concatenate([rng.normal(c[:2], 0.05, size=(10_000, 2)) for c in corners[:2]]), 0, 1)
    n, m, k, t, d, gamma, eps = len(x), 5, 2, 10, 2, 0.2, 0.5
    bound = 1 - 2 * m * t * k * d**1.5 / (eps * gamma * n) - m * k / n
    certified = 0
    runs = 4
    for run in range(runs):
        qkm = QKMeans(QKMeansConfig(k=k, eps=eps), seed=run).fit(x)
        for i in np.random.default_rng(100 + run).permutation(n)[:m]:
            certified += not qkm.delete(int(i)).retrained
    assert bound > 0.5 and certified / (runs * m) >= bound


def test_retrain_rate_falls_as_eps_grows(corners):
    """O-Q-9, second half (spec 7.3: 3 / 17 / 79 lattice changes per 300 at eps = 1/16 .. 1/256)."""
    rng = np.random.default_rng(16)
    retrains = {}
    x4 = np.clip(np.concatenate([rng.normal(c, 0.05, size=(140, 3)) for c in corners]), 0, 1)
    stream = np.random.default_rng(17).permutation(len(x4))[:40]  # 560 -> 520 points: one shape
    for e in (1 / 16, 1 / 256):
        qkm = QKMeans(QKMeansConfig(k=4, eps=e), seed=4).fit(x4)
        for i in stream:
            qkm.delete(int(i))
        retrains[e] = qkm.retrained
    assert retrains[1 / 256] > retrains[1 / 16]


# --------------------------------------------------------------------------- fresh randomness (O-Q-8)


def test_fresh_retrains_draw_a_new_key_and_certified_deletions_keep_the_model(mixture):
    x = mixture(19, (140, 140, 140, 140))
    config = QKMeansConfig(k=4, eps=1 / 8)
    fresh = QKMeans(config, seed=3, retrain_keys="fresh").fit(x)
    coupled = QKMeans(config, seed=3).fit(x)
    stream = [int(i) for i in np.random.default_rng(4).permutation(len(x))[:3]]
    for i in [*stream, "seed", "seed"]:
        i = int(fresh.model.seed_ids[1]) if i == "seed" else i  # a seed of the current model
        before = fresh.model
        outcome = fresh.delete(i)
        coupled.delete(i)
        if not outcome.retrained:
            assert fresh.model.executed == before.executed
            np.testing.assert_array_equal(fresh.model.centroids, before.centroids)
    assert fresh.retrained >= 2 and fresh.outcomes[-1].reason == "seed"
    # The r-th retrain used fold_in(fold_in(key, 6), r): the model is a from-scratch run with it.
    key = jax.random.fold_in(jax.random.fold_in(fresh.key, 6), fresh.retrained)
    np.testing.assert_array_equal(fresh.model_key, key)
    assert same_model(fresh.model, train_qkmeans(fresh.store.x, fresh.store.ids, config, key))
    # ... and not the coupled one (which keeps the run's key and equals training with it).
    assert not np.array_equal(fresh.model.seed_ids, coupled.model.seed_ids)
    assert same_model(coupled.model, train_qkmeans(coupled.store.x, coupled.store.ids, config, coupled.key))
    with pytest.raises(ValueError, match="retrain_keys"):
        QKMeans(config, retrain_keys="new")


#: O-Q-8's tiny instances, n = 8, d = 1, k = 2: ``(points, config, victim, bin width)``.
#: "spec": the spec's suggestion with a coarse lattice; deleting x = 0.3 is certified about half of
#: the time. "edge": two groups of four and one quantised iteration; deleting x = 1.0 moves its
#: group's mean by half a lattice cell, which makes the bias of fresh retrains large.
O_Q_8 = {
    "spec": (np.array([[0.0], [0.05], [0.1], [0.15], [0.3], [0.35], [0.4], [1.0]]),
             QKMeansConfig(k=2, iterations=3, gamma=0.2, eps=0.25), 4, 0.125),
    "edge": (np.array([[0.0], [0.04], [0.08], [0.12], [0.88], [0.92], [0.96], [1.0]]),
             QKMeansConfig(k=2, iterations=1, gamma=0.2, eps=0.04), 7, 0.01),
}


def homogeneity_pvalue(a: list, b: list) -> float:
    """Chi-square test that two samples of categories come from one law (categories expected
    fewer than 5 times per sample are pooled, so the chi-square approximation holds)."""
    cats = sorted(set(a) | set(b))
    table = np.array([[a.count(c) for c in cats], [b.count(c) for c in cats]])
    small = table.sum(axis=0) / 2 < 5
    if small.any():
        table = np.column_stack([table[:, ~small], table[:, small].sum(axis=1)])
    return float(scipy.stats.chi2_contingency(table).pvalue)


def deletion_samples(instance: str, runs: int) -> dict[str, list]:
    """Histograms of the model, discretised (its sorted centroids on a grid; any function of the
    output has one law on both sides if the outputs do), over ``runs`` keys:

    * ``fresh``: R(D, A(D; K_r), i) with fresh-key retrains (the paper's deletion);
    * ``coupled``: the same deletion with retrains under K_r (this project's default);
    * ``scratch``: A(D_{-i}; K'_r) with independent keys K'_r;
    * ``kept``: A(D; K_r), the model before the deletion (a deletion that never retrains).
    """
    x, config, victim, width = O_Q_8[instance]
    ids = np.arange(len(x))
    keep = ids != victim
    out: dict[str, list] = {"fresh": [], "coupled": [], "scratch": [], "kept": [], "retrained": []}

    def grid(model) -> tuple[int, ...]:
        return tuple(np.floor(np.sort(model.centroids[:, 0]) / width).astype(int).tolist())

    for r in range(runs):
        fresh = QKMeans(config, key=jax.random.PRNGKey(r), retrain_keys="fresh").fit(x)
        coupled = copy.deepcopy(fresh)
        coupled.retrain_keys = "coupled"
        out["kept"].append(grid(fresh.model))
        out["retrained"].append(fresh.delete(victim).retrained)
        coupled.delete(victim)
        out["fresh"].append(grid(fresh.model))
        out["coupled"].append(grid(coupled.model))
        out["scratch"].append(grid(train_qkmeans(x[keep], ids[keep], config, jax.random.PRNGKey(10**6 + r))))
    return out


@pytest.mark.parametrize(("instance", "runs"), [("edge", 400), pytest.param("spec", 20_000, marks=pytest.mark.slow)])
def test_o_q_8_fresh_retrains_are_not_equal_in_distribution_to_retraining(instance, runs):
    """O-Q-8, chi-square at p = 0.001 with fixed keys. The coupled deletion passes; the paper's
    deletion with fresh-randomness retrains does **not**: its output is ``A(D_{-i}; K)`` on the
    certified event and a fresh ``A(D_{-i})`` otherwise, and the certified event is not independent
    of ``A(D_{-i}; K)`` (see the next two tests), so the mixture is biased. A deletion that never
    retrains (``kept``) is rejected too, so the test has power."""
    samples = deletion_samples(instance, runs)
    assert 0.25 * runs < sum(samples["retrained"]) < 0.75 * runs  # both branches are exercised
    assert homogeneity_pvalue(samples["coupled"], samples["scratch"]) > 1e-3
    assert homogeneity_pvalue(samples["fresh"], samples["scratch"]) < 1e-3
    assert homogeneity_pvalue(samples["kept"], samples["scratch"]) < 1e-3


def test_kmeanspp_without_i_is_not_kmeanspp_conditioned_on_missing_i():
    """Why O-Q-8 fails, seeding part (exact enumeration): the seed set of ``D_{-i}`` does not have
    the law of D's seed set conditioned on i not being drawn, because the D^2 normaliser of D
    contains i's weight, which depends on the first seed (spec 1.5 and 3.2 claim equality)."""
    x, _, victim, _ = O_Q_8["spec"]
    pts = x[:, 0]

    def seed_sets(rows: list[int]) -> dict[frozenset, float]:
        law: dict[frozenset, float] = {}
        for a in rows:
            weights = np.array([(pts[b] - pts[a]) ** 2 for b in rows])
            for b, w in zip(rows, weights):
                if w > 0:
                    law[frozenset((a, b))] = law.get(frozenset((a, b)), 0.0) + w / weights.sum() / len(rows)
        return law

    full = seed_sets(list(range(8)))
    kept = {s: p for s, p in full.items() if victim not in s}
    z = sum(kept.values())
    without = seed_sets([j for j in range(8) if j != victim])
    assert sum(without.values()) == pytest.approx(1.0) and set(without) == set(kept)
    total_variation = 0.5 * sum(abs(kept[s] / z - without[s]) for s in without)
    assert total_variation > 5e-3  # 0.0089 on this instance
    # The coupled (Gumbel-max by id) seeding is pathwise equal on that event, which is all O-Q-1 needs.
    xp, ip, valid = _kernels.pad_rows(x, np.arange(8))
    xr, ir, vr = _kernels.pad_rows(np.delete(x, victim, axis=0), np.delete(np.arange(8), victim))
    for r in range(50):
        rows, _ = _kernels.kmeanspp_seeding(jax.random.PRNGKey(r), xp, ip, valid, 2)
        if victim not in np.asarray(rows):
            r2, _ = _kernels.kmeanspp_seeding(jax.random.PRNGKey(r), xr, ir, vr, 2)
            np.testing.assert_array_equal(np.asarray(ir)[np.asarray(r2)], np.asarray(rows))


def test_stability_biases_the_lattice_phase():
    """Why O-Q-8 fails, quantisation part: with a uniform phase, ``Q(c) - c`` is uniform on
    ``[-eps/2, eps/2]``, but conditioned on the stable event ``Q(c) = Q(c + delta)`` it is uniform
    on ``[-eps/2 + delta, eps/2]`` (1-D, ``delta > 0``): its mean is ``delta / 2``, not 0. The
    certified branch keeps exactly these phases."""
    n, eps, delta, c = 100_000, 0.25, 0.1, 0.3141
    thetas = jax.random.uniform(jax.random.PRNGKey(5), (n, 1), jnp.float64, -0.5, 0.5)
    a, _ = _kernels.quantize(jnp.full((n, 1), c), eps, thetas)
    b, _ = _kernels.quantize(jnp.full((n, 1), c + delta), eps, thetas)
    stable = np.asarray(a == b)[:, 0]
    err = (np.asarray(_kernels.lattice_points(a, eps, thetas))[:, 0] - c)
    m = int(stable.sum())
    assert abs(m / n - (1 - delta / eps)) < 4 * math.sqrt(0.25 / n)
    sigma = (eps - delta) / math.sqrt(12 * m)
    assert abs(err[stable].mean() - delta / 2) < 4 * sigma
    assert abs(err.mean()) < 4 * eps / math.sqrt(12 * n)  # unconditionally unbiased (O-Q-4)
    assert err[stable].min() >= -eps / 2 + delta - 1e-12


# --------------------------------------------------------------------------- bad input


def test_bad_requests_raise_clear_errors_and_leave_the_model_alone(mixture):
    x = mixture(18, (140, 140, 140, 140))
    qkm = QKMeans(QKMeansConfig(k=4, eps=1 / 16), seed=0)
    with pytest.raises(DeletionError, match="before fit"):
        qkm.delete(0)
    with pytest.raises(DeletionError, match="not trained"):
        qkm.centroids  # noqa: B018
    qkm.fit(x)
    before = qkm.model
    with pytest.raises(DeletionError, match="not in the data set"):
        qkm.delete(10_000)
    with pytest.raises(DeletionError, match="integer"):
        qkm.delete("3")  # type: ignore[arg-type]
    qkm.delete(3)
    after = qkm.model
    with pytest.raises(DeletionError, match="already deleted"):
        qkm.delete(3)
    assert qkm.model is after and before is not None
    assert qkm.store.n == len(x) - 1


def test_deleting_below_k_points_is_refused():
    x = np.array([[0.0], [0.3], [0.6], [1.0]])
    qkm = QKMeans(QKMeansConfig(k=3, eps=0.5), seed=0).fit(x)
    qkm.delete(int(next(i for i in range(4) if i not in qkm.model.seed_ids)))
    with pytest.raises(DeletionError, match="fewer than k"):
        qkm.delete(int(qkm.store.ids[0]))
    assert qkm.store.n == 3


def test_config_and_training_validation():
    with pytest.raises(ValueError):
        QKMeansConfig(k=0)
    with pytest.raises(ValueError):
        QKMeansConfig(k=2, gamma=1.0)
    with pytest.raises(ValueError):
        QKMeansConfig(k=2, eps=-1.0)
    with pytest.raises(ValueError, match="larger than"):
        QKMeans(QKMeansConfig(k=5, eps=0.1)).fit(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="unique"):
        QKMeans(QKMeansConfig(k=1, eps=0.1)).fit(np.zeros((3, 2)), ids=[1, 1, 2])
    with pytest.raises(ValueError, match="NaN"):
        QKMeans(QKMeansConfig(k=1, eps=0.1)).fit(np.array([[np.nan, 0.0]]))

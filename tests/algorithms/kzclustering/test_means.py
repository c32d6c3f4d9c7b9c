"""(k,z)-median / (k,z)-means (Appendix C): reformulation, BEL coresets, reverse greedy, the protocol
(spec section 3 and oracles 2, 3, 26-28)."""

from __future__ import annotations

import argparse
import math

import jax
import numpy as np
import pytest
import trio

import fedproto.algorithms  # noqa: F401
from fedproto.algorithms.kzclustering import _kernels, solvers
from fedproto.algorithms.kzclustering.cli import KZMEANS, KZMEDIAN, run_means
from fedproto.algorithms.kzclustering.data import inject_outliers, synthetic_dataset
from fedproto.algorithms.kzclustering.means import (
    KzMeansConfig,
    KzMeansCoordinator,
    KzMeansMachine,
    centralised_kmeans,
    centralised_kmeans_minus_minus,
)
from fedproto.algorithms.kzclustering.messages import Coresets
from fedproto.algorithms.kzclustering.protocol import COORDINATOR, machine_name
from fedproto import cli as core_cli
from fedproto.codec import decode_frame, encode_frame
from fedproto.data import load_dataset
from fedproto.errors import RemoteProtocolError
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.testing.harness import Harness
from fedproto.transports.memory import MemoryNetwork

# --- reformulation (oracles 2 and 3) ----------------------------------------------------------------


@pytest.mark.parametrize("power", [1, 2])
def test_lemma_c1_sup_equals_the_fractional_greedy_cost(power):
    rng = np.random.default_rng(power)
    for _ in range(150):
        n = int(rng.integers(1, 12))
        dist = rng.integers(0, 5, size=n).astype(np.float64) if rng.random() < 0.5 else rng.exponential(size=n)
        z = float(rng.uniform(0, n)) if rng.random() < 0.5 else float(rng.integers(0, n))
        value, argmax = solvers.sup_cost(dist, z, power)
        assert value == pytest.approx(solvers.trimmed_cost(dist, z, power), rel=1e-12, abs=1e-12)
        l_bar = np.sort(dist)[n - math.floor(z) - 1]  # the (n - floor z)-th smallest
        at_l_bar = float(np.sum(np.minimum(dist, l_bar) ** power) - z * l_bar**power)
        assert at_l_bar == pytest.approx(value, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("power", [1, 2])
def test_lemma_c2_grid_sup_brackets_the_cost(power):
    rng = np.random.default_rng(10 + power)
    eps = 0.3
    for _ in range(100):
        n = int(rng.integers(2, 15))
        dist = rng.exponential(size=n) * rng.choice([0.01, 1, 100])
        z = float(rng.uniform(0, n / 2))
        positive = dist[dist > 0]
        lo = eps * positive.min() / (2 * (1 + eps) * n)
        grid = np.concatenate([[0.0], solvers.radius_grid(lo, 2 * dist.max(), eps)])
        grid_sup, _ = solvers.sup_cost(dist, z, power, radii=grid)
        assert grid_sup <= solvers.trimmed_cost(dist, z, power) * (1 + 1e-12) + 1e-12
        assert solvers.trimmed_cost(dist, (1 + eps) ** power * z, power) <= (1 + eps) ** power * grid_sup + 1e-9


# --- BEL coresets (oracle 26) -----------------------------------------------------------------------


def test_bel_coreset_weights_sum_to_n_and_estimate_without_bias():
    rng = np.random.default_rng(26)
    x = np.concatenate([rng.normal(0, 1, size=(40, 2)), rng.normal(8, 1, size=(30, 2)), [[40.0, 40.0]]])
    centres = np.array([[0.0, 0.0], [8.0, 8.0]])
    probe = np.array([[1.0, -1.0], [6.0, 9.0], [20.0, 0.0]])  # a fixed C
    radius, power = 5.0, 2
    truth = float(np.sum(np.minimum(_kernels.nearest_centres(x, probe)[0], radius) ** power))
    estimates = []
    for seed in range(300):
        draws = _kernels.uniform_draws(jax.random.PRNGKey(seed), 12)
        pts, w = solvers.bel_coreset(draws, x, centres, radius, power)
        assert pts.shape == (14, 2) and abs(w.sum() - x.shape[0]) < 1e-9
        d = np.minimum(_kernels.nearest_centres(pts, probe)[0], radius) ** power
        estimates.append(float(np.sum(w * d)))
    estimates = np.asarray(estimates)
    assert abs(estimates.mean() - truth) <= 5 * estimates.std() / math.sqrt(len(estimates))
    # every point on its centre: no samples, the centres carry all the weight
    pts, w = solvers.bel_coreset(np.array([0.5]), centres, centres, radius, power)
    assert pts.shape == (2, 2) and w.tolist() == [1.0, 1.0]


# --- reverse greedy (oracle 27) ---------------------------------------------------------------------


def reference_reverse_greedy(dist, group, w, radii, k, bound, power):
    n_fac = dist.shape[1]
    open_ = list(range(n_fac))
    u = np.ones(radii.shape[0])

    def set_cost(facs, i):
        rows = group == i
        return float(np.sum(w[rows] * np.minimum(dist[rows][:, facs].min(axis=1), radii[i]) ** power))

    while len(open_) > k:
        best, best_score, best_delta = None, math.inf, None
        for v in open_:
            rest = [f for f in open_ if f != v]
            delta = np.array([set_cost(rest, i) - set_cost(open_, i) for i in range(radii.shape[0])])
            if np.all(delta <= bound / 2 + 1e-9):
                score = float(u @ delta)
                if score < best_score - 1e-9:
                    best, best_score, best_delta = v, score, delta
        if best is None:
            return None
        open_.remove(best)
        u = u * (1 + 1 / bound) ** best_delta
        u /= u.max()
    return sorted(open_)


def test_reverse_greedy_matches_the_reference_and_fails_only_for_small_bounds():
    rng = np.random.default_rng(27)
    for _ in range(12):
        p, n_fac, t = int(rng.integers(4, 12)), int(rng.integers(3, 7)), int(rng.integers(1, 4))
        k = int(rng.integers(1, n_fac))
        dist = rng.exponential(size=(p, n_fac))
        group = rng.integers(0, t, size=p)
        w = rng.uniform(0.5, 2, size=p)
        radii = np.sort(rng.uniform(0.5, 3, size=t))
        for bound in (0.01, 1.0, 1e6):
            got = solvers.reverse_greedy(dist, group, w, radii, k, bound, 2)
            expected = reference_reverse_greedy(dist, group, w, radii, k, bound, 2)
            assert (got is None) == (expected is None)
            if got is not None:
                assert got.tolist() == expected and got.shape == (k,)
        assert solvers.reverse_greedy(dist, group, w, radii, k, 1e12, 2).shape == (k,)


# --- the protocol ---------------------------------------------------------------------------------------


def build(x, parts, config):
    names = [machine_name(i) for i in range(config.n_machines)]
    machines = {COORDINATOR: KzMeansCoordinator(COORDINATOR, config=config, machines=names)}
    for i, name in enumerate(names):
        machines[name] = KzMeansMachine(name, config=config, points=x[parts[i]], index=i)
    return machines


def run(x, parts, config):
    machines = build(x, parts, config)
    harness = Harness(machines)
    results = harness.run()
    return results, harness.meter.report(protocol="kzmeans", transport="harness", session=0, parties=list(machines))


GMM = synthetic_dataset(600, 3, 3, 30, factor=60.0, dist_factor=100.0, seed=3)
GMM_PARTS = [np.arange(i, GMM.n, 3) for i in range(3)]


def test_golden_phases_and_words():
    config = KzMeansConfig(k=3, z=30, eps=0.3, n_machines=3, d=3, samples=60)
    results, report = run(GMM.x, GMM_PARTS, config)
    r = results[COORDINATOR]
    t_len, m, d, k = r.grid.shape[0], 3, 3, 3
    assert report.communication_rounds == 7 and report.algorithm_rounds == 4
    by_phase = r.words_by_phase()
    assert by_phase["extent"] == m * (d + 3) and by_phase["grid"] == m * t_len
    assert by_phase["costs"] == m * (t_len + 1) and by_phase["totals"] == m * (t_len + 1)
    assert by_phase["coresets"] == r.coreset_points * (d + 1) + m * t_len
    assert r.coreset_points <= t_len * (60 + m + m * k)  # rounding adds at most one sample per machine
    assert by_phase["centres"] == m * (k * d + 1) and by_phase["outliers"] == m
    assert sum(results[f"machine-{i}"].outliers.sum() for i in range(3)) == r.outliers
    bounded = KzMeansConfig(k=3, z=30, eps=0.3, n_machines=3, d=3, radius_bounds=(1.0, 500.0))
    assert run(GMM.x, GMM_PARTS, bounded)[1].communication_rounds == 5
    bel = KzMeansConfig(k=3, z=30, eps=0.3, n_machines=3, d=3, mode="bel")
    results, report = run(GMM.x, GMM_PARTS, bel)
    assert report.communication_rounds == 5 and results[COORDINATOR].grid.tolist() == [math.inf]


def test_communication_does_not_depend_on_z():
    words = set()
    for z in (0, 10, 30):
        config = KzMeansConfig(k=3, z=z, eps=0.3, n_machines=3, d=3, samples=40)
        words.add(run(GMM.x, GMM_PARTS, config)[0][COORDINATOR].total_words)
    assert max(words) - min(words) <= 3 * 3 * 4  # only rounding of per-machine sample counts moves


def balanced_blobs():
    """Three well-separated blobs of 200 points and 30 outliers injected by the recipe."""
    rng = np.random.default_rng(28)
    centres = np.array([[0.0, 0.0, 0.0], [15.0, 0.0, 0.0], [0.0, 15.0, 0.0]])
    base = np.concatenate([rng.normal(c, 1.5, size=(200, 3)) for c in centres])
    x, _ = inject_outliers(base, 30, dist_factor=100.0, seed=28)
    return x, [np.arange(i, x.shape[0], 3) for i in range(3)]


def test_means_on_gaussian_mixture_with_far_outliers():
    """Oracle 28: the (1+eps)z-trimmed cost is within a small factor of k-means--'s z-trimmed cost and
    clearly below plain k-means and BEL (evaluated with z removed)."""
    x, parts = balanced_blobs()
    z = 30
    ours = run(x, parts, KzMeansConfig(k=3, z=z, eps=0.3, n_machines=3, d=3))[0][COORDINATOR].centres

    def trimmed(centres, budget):
        return solvers.trimmed_cost(_kernels.nearest_centres(x, centres)[0], budget, 2)

    cost = trimmed(ours, 1.3 * z)
    reference = trimmed(centralised_kmeans_minus_minus(x, 3, z), z)
    plain = trimmed(centralised_kmeans(x, 3), z)
    bel = trimmed(run_means(KzMeansConfig(k=3, z=z, eps=0.3, n_machines=3, d=3, mode="bel"), x, parts).centres, z)
    assert cost <= 1.2 * reference
    assert cost < 0.5 * plain and cost < 0.5 * bel


def test_median_variant_finds_the_clusters():
    x, parts = balanced_blobs()
    r = run(x, parts, KzMeansConfig(k=3, z=30, eps=0.3, n_machines=3, d=3, power=1))[0][COORDINATOR]
    cost = solvers.trimmed_cost(_kernels.nearest_centres(x, r.centres)[0], 39, 1)
    reference = solvers.trimmed_cost(_kernels.nearest_centres(x, centralised_kmeans_minus_minus(x, 3, 30))[0], 30, 1)
    assert cost <= 1.2 * reference


def test_bad_input_and_empty_machines():
    for change in ({"eps": 0.0}, {"eps": 2.0}, {"power": 3}, {"mode": "fast"}, {"k": 0}, {"facilities": 1},
                   {"radius_bounds": (0.0, 1.0)}):
        with pytest.raises(ValueError):
            KzMeansConfig(**{**dict(k=2, z=1, eps=0.3, n_machines=1, d=2), **change})
    x = GMM.x[:60]
    with pytest.raises(ValueError, match="z = 60"):
        run(x, [np.arange(60)], KzMeansConfig(k=2, z=60, eps=0.3, n_machines=1, d=3))
    parts = [np.arange(60), np.zeros(0, dtype=np.int64)]
    results, _ = run(x, parts, KzMeansConfig(k=2, z=3, eps=0.3, n_machines=2, d=3))
    assert results[COORDINATOR].centres.shape == (2, 3) and results["machine-1"].outliers.shape == (0,)


def test_forged_coreset_weights_are_rejected():
    config = KzMeansConfig(k=2, z=5, eps=0.3, n_machines=2, d=3)
    x = GMM.x[:100]

    def inflate(frame):
        _, message = decode_frame(frame.data)
        if isinstance(message, Coresets) and frame.sender == "machine-0":
            forged = Coresets(sizes=message.sizes, points=message.points, weights=message.weights * 2)
            return encode_frame(forged, session=0, round_idx=2, phase="coresets")
        return frame.data

    with pytest.raises(RemoteProtocolError, match="weights sum"):
        Harness(build(x, [np.arange(50), np.arange(50, 100)], config), tamper=inflate).run()


async def test_memory_transport_and_cli_plans():
    parser = argparse.ArgumentParser()
    core_cli._common_arguments(parser, party=False)
    KZMEANS.add_arguments(parser)
    args = parser.parse_args(["--data", "wine", "--machines", "2", "--k", "3", "--inject-outliers", "8",
                              "--compare", "all"])
    plan = KZMEANS.plan(args, load_dataset("wine"))
    machines = {p: plan.make_machine(p) for p in plan.roster}
    meter = Meter(trio.current_time)
    results = await run_parties(machines, MemoryNetwork(list(plan.roster)),
                                config=RuntimeConfig(session=plan.session), meter=meter)
    summary = plan.summarize({p: plan.result_to_json(p, r) for p, r in results.items()})
    assert summary["n_points"] == 186 and summary["z"] == 8 and summary["n_clients"] == 2
    baselines = {"cost_z_removed_kmeans", "cost_z_removed_kmeans_minus_minus", "cost_z_removed_bel"}
    assert baselines <= set(summary) and all(summary[key] > 0 for key in baselines)
    assert summary["words_total_bel"] > 0
    assert summary["cost_budget_removed"] <= summary["cost_z_removed"]
    assert meter.report(protocol="kzmeans", transport="memory", session=plan.session,
                        parties=plan.roster).communication_rounds == 7
    median_parser = argparse.ArgumentParser()
    core_cli._common_arguments(median_parser, party=False)
    KZMEDIAN.add_arguments(median_parser)
    with pytest.raises(ValueError, match="unknown baseline"):
        KZMEDIAN.plan(median_parser.parse_args(["--data", "wine", "--k", "3", "--compare", "lloyd"]),
                      load_dataset("wine"))

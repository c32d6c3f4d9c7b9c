"""Baselines of distributed (k,z)-center (spec section 4 and oracles 14, 22-25)."""

from __future__ import annotations

import numpy as np
import pytest

import fedproto.algorithms  # noqa: F401
from fedproto.algorithms.kzclustering import _kernels, solvers
from fedproto.algorithms.kzclustering.baselines import (
    METHODS,
    BaselineConfig,
    BaselineCoordinator,
    BaselineMachine,
    centralised_kzc,
    charikar,
    glz_budgets,
    glz_curve,
    greedy,
)
from fedproto.algorithms.kzclustering.config import KzCenterConfig
from fedproto.algorithms.kzclustering.protocol import COORDINATOR, machine_name
from fedproto.errors import RemoteProtocolError
from fedproto.testing.harness import Harness


def run_baseline(x, parts, config):
    names = [machine_name(i) for i in range(config.n_machines)]
    machines = {COORDINATOR: BaselineCoordinator(COORDINATOR, config=config, machines=names)}
    for i, name in enumerate(names):
        machines[name] = BaselineMachine(name, config=config, points=x[parts[i]], index=i)
    harness = Harness(machines)
    results = harness.run()
    report = harness.meter.report(protocol=config.method, transport="harness", session=0, parties=list(machines))
    return results[COORDINATOR], report


def cost(x, centres, z):
    return solvers.center_cost(_kernels.nearest_centres(x, centres)[0], z)


def test_centralised_greedy_and_charikar_meet_their_ratios(kz):
    """Oracles 22 and 23 through the public baseline functions."""
    rng = np.random.default_rng(2)
    for _ in range(10):
        n = int(rng.integers(5, 11))
        k = int(rng.integers(1, 4))
        z = int(rng.integers(0, 3))
        x = rng.normal(size=(n, 2))
        assert cost(x, x[greedy(x, k, start=int(rng.integers(n)))], 0) <= 2 * kz.opt(x, k, 0) + 1e-12
        opt = kz.opt(x, k, z)
        idx, radius = charikar(x, k, z)
        assert idx.shape[0] == k and radius <= opt + 1e-12 and cost(x, x[idx], z) <= 3 * opt + 1e-12
        assert cost(x, x[centralised_kzc(x, k, z)], z) <= 4 * opt + 1e-12


def test_mkcwm_ratio_and_exact_communication(kz):
    """Oracle 24: cost <= 13 OPT with z outliers; communication exactly m (k+z) weighted points."""
    rng = np.random.default_rng(24)
    for _ in range(8):
        n = int(rng.integers(8, 13))
        k, z, m = int(rng.integers(1, 3)), int(rng.integers(0, 3)), 2
        x = rng.normal(size=(n, 2))
        parts = [np.arange(0, n, 2), np.arange(1, n, 2)]
        config = BaselineConfig("mkcwm", k=k, z=z, n_machines=m, d=2)
        result, report = run_baseline(x, parts, config)
        assert cost(x, result.centres, z) <= 13 * kz.opt(x, k, z) + 1e-12
        assert result.points_received == m * (k + z)
        assert result.words == {(0, "summary"): m * (k + z) * (2 + 1)}
        assert report.communication_rounds == 1


@pytest.mark.parametrize("method", ["random-random", "random-kzc"])
def test_random_baselines_send_exactly_m_k_plus_z_points(kz, method):
    """Oracle 25: m (k+z) d words when n_i >= k+z; fewer when a machine is small."""
    x = kz.blobs(25, per_blob=20, blobs=3, outliers=6)
    parts = [np.arange(0, 66, 3), np.arange(1, 66, 3), np.arange(2, 66, 3)]
    config = BaselineConfig(method, k=3, z=6, n_machines=3, d=2, seed=4)
    result, _ = run_baseline(x, parts, config)
    assert result.total_words == 3 * (3 + 6) * 2 and result.points_received == 27
    assert result.centres.shape == (3, 2)
    again, _ = run_baseline(x, parts, config)
    np.testing.assert_array_equal(again.centres, result.centres)  # same seed, same sample
    other, _ = run_baseline(x, parts, BaselineConfig(method, k=3, z=6, n_machines=3, d=2, seed=5))
    assert not np.array_equal(other.centres, result.centres)
    small, _ = run_baseline(x, [np.arange(4), np.arange(4, 66)], BaselineConfig(method, k=3, z=6, n_machines=2, d=2))
    assert small.points_received == 4 + 9


def test_glz_curve_and_budgets():
    x = np.array([[0.0], [1.0], [3.0], [7.0], [15.0], [31.0]])
    qs, radii, order = glz_curve(x, 1, 4)
    assert qs.tolist() == [1, 2, 4] and np.all(np.diff(radii) <= 0)
    # farthest-first from 0: 31 (r=inf), 15 (r=15? no: 16 from 31, 15 from 0 -> 15), ...
    assert order[:2].tolist() == [0, 5] and radii[0] == 15.0
    assert glz_curve(x, 1, 0)[0].shape == (0,)
    curves = [(np.array([1, 2, 4]), np.array([9.0, 5.0, 1.0])), (np.array([1, 2, 4]), np.array([8.0, 7.0, 6.0]))]
    # need sum >= 4: tau = 7 gives 1 + 2 = 3, tau = 6 gives 1 + 4 (t_i jumps along the sampled q)
    assert glz_budgets(curves, 2, rho=2.0) == [1, 4]
    assert glz_budgets(curves, 1, rho=2.0) == [1, 1]
    assert glz_budgets(curves, 0) == [0, 0]
    assert sum(glz_budgets(curves, 50)) == 8  # cannot reach 100: everything is used


def test_communication_grows_with_z_for_baselines_but_not_for_dist_kzc(kz):
    """Oracle 14 (contrast): with n, k, m, eps fixed, random-*/MKCWM/GLZ-z words grow as m d (k+z);
    dist-kzc's stay bounded by its z-free formula."""
    x = kz.blobs(30, per_blob=50, blobs=3, outliers=30)
    n = x.shape[0]
    parts = [np.arange(i, n, 3) for i in range(3)]
    words = {method: [] for method in (*METHODS, "dist-kzc")}
    for z in (2, 10, 30):
        for method in METHODS:
            result, _ = run_baseline(x, parts, BaselineConfig(method, k=3, z=z, n_machines=3, d=2))
            words[method].append(result.total_words)
            assert result.centres.shape[0] <= 3
        config = KzCenterConfig(k=3, z=z, eps=0.5, n_machines=3, d=2)
        results, _ = kz.run(x, parts, config)
        words["dist-kzc"].append(results[COORDINATOR].total_words)
    for method in ("random-random", "random-kzc", "mkcwm", "glz-z"):
        assert words[method][0] < words[method][1] < words[method][2]
    assert words["random-random"] == [3 * (3 + z) * 2 for z in (2, 10, 30)]
    ours = max(words["dist-kzc"]) - min(words["dist-kzc"])
    assert ours < words["mkcwm"][-1] - words["mkcwm"][0] and ours < words["random-kzc"][-1] - words["random-kzc"][0]
    assert max(words["glz"]) - min(words["glz"]) <= 3 * 2 * 4  # only the curve grows (log z)


def test_baselines_find_well_separated_blobs(kz):
    x = kz.blobs(31, per_blob=40, blobs=3, outliers=9)
    parts = [np.arange(i, x.shape[0], 3) for i in range(3)]
    for method in ("random-kzc", "mkcwm", "glz", "glz-z"):
        result, _ = run_baseline(x, parts, BaselineConfig(method, k=3, z=9, n_machines=3, d=2))
        assert cost(x, result.centres, 9) < 5.0, method  # blobs have std 0.5; outliers are ~100 away
        if method == "glz":
            assert sum(result.budgets) >= 18


def test_baseline_input_errors():
    with pytest.raises(ValueError):
        BaselineConfig("nearest", k=1, z=0, n_machines=1, d=1)
    with pytest.raises(ValueError):
        BaselineConfig("mkcwm", k=0, z=0, n_machines=1, d=1)
    config = BaselineConfig("glz", k=1, z=1, n_machines=1, d=1)
    with pytest.raises(ValueError):
        BaselineMachine("machine-0", config=config, points=np.zeros((2, 2)), index=0)
    coordinator = BaselineCoordinator(COORDINATOR, config=config, machines=["machine-0"])
    coordinator.start()
    machine = BaselineMachine("machine-0", config=config, points=np.zeros((2, 1)), index=0)
    curve = machine.start()[0].message
    with pytest.raises(RemoteProtocolError):
        coordinator.receive("mallory", curve)


def test_machines_without_points_take_part():
    x = np.arange(12, dtype=np.float64)[:, None]
    for method in METHODS:
        result, _ = run_baseline(x, [np.arange(12), np.zeros(0, dtype=np.int64)],
                                 BaselineConfig(method, k=2, z=1, n_machines=2, d=1))
        assert 1 <= result.centres.shape[0] <= 2

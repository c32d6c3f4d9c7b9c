"""Brute-force oracles and run helpers shared by the (k,z)-clustering tests."""

from __future__ import annotations

import itertools
import math
import types

import numpy as np
import pytest

import fedproto.algorithms  # noqa: F401  (turns on JAX's 64-bit mode)
from fedproto.algorithms.kzclustering import _kernels, solvers
from fedproto.algorithms.kzclustering.config import KzCenterConfig
from fedproto.algorithms.kzclustering.protocol import COORDINATOR, KzCoordinator, KzMachine, machine_name
from fedproto.testing.harness import Harness


def brute_force_opt(x: np.ndarray, k: int, z: int, *, centres_from: np.ndarray | None = None,
                    weights: np.ndarray | None = None) -> float:
    """min over k-subsets C of ``centres_from`` (default: x) of the (weighted) (k,z)-center cost."""
    pool = x if centres_from is None else centres_from
    dist = _kernels.pairwise_distances(x, pool)
    best = math.inf
    for subset in itertools.combinations(range(pool.shape[0]), min(k, pool.shape[0])):
        d = dist[:, list(subset)].min(axis=1)
        best = min(best, weighted_center_cost(d, z, weights))
    return best


def weighted_center_cost(dist: np.ndarray, z: float, weights: np.ndarray | None = None) -> float:
    """Smallest r such that the weight farther than r is <= z (weights default to 1)."""
    w = np.ones(dist.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64)
    order = np.argsort(dist)[::-1]
    beyond = 0.0
    for idx in order:  # drop the farthest points while the budget allows
        if beyond + w[idx] > z + 1e-9:
            return float(dist[idx])
        beyond += w[idx]
    return 0.0


def make_machines(x: np.ndarray, parts: list[np.ndarray], config: KzCenterConfig) -> dict:
    names = [machine_name(i) for i in range(config.n_machines)]
    machines = {COORDINATOR: KzCoordinator(COORDINATOR, config=config, machines=names)}
    for i, name in enumerate(names):
        machines[name] = KzMachine(name, config=config, points=x[parts[i]])
    return machines


def run_kzcenter(x: np.ndarray, parts: list[np.ndarray], config: KzCenterConfig, *, session: int = 0):
    machines = make_machines(x, parts, config)
    harness = Harness(machines, session=session)
    results = harness.run()
    report = harness.meter.report(protocol="kzcenter", transport="harness", session=session, parties=list(machines))
    return results, report


def random_parts(rng: np.random.Generator, n: int, m: int) -> list[np.ndarray]:
    labels = rng.integers(0, m, size=n)
    return [np.flatnonzero(labels == i) for i in range(m)]


def tiny_instance(rng: np.random.Generator, trial: int) -> tuple[int, int, int, int, float, np.ndarray] | None:
    """A random tiny (k,z)-center instance for the brute-force checks, or None when it drew k > n.

    Returns:
        ``(n, k, z, m, eps, x)``: 3 <= n <= 11 points, k <= 3 centres, z <= min(7, n - 1)
        outliers, m <= 3 machines, eps in {0.1, 0.5, 1}, and ``x`` float64 ``[n, 2]``: small
        integers (many ties) on odd trials, Gaussian of scale 10 on even ones.
    """
    n = int(rng.integers(3, 12))
    k = int(rng.integers(1, 4))
    z = int(rng.integers(0, min(7, n - 1) + 1))
    if k > n:
        return None
    m = int(rng.integers(1, 4))
    eps = float(rng.choice([0.1, 0.5, 1.0]))
    x = rng.integers(0, 6, size=(n, 2)).astype(np.float64) if trial % 2 else rng.normal(size=(n, 2)) * 10
    return n, k, z, m, eps, x


def blobs_with_outliers(seed: int = 0, *, per_blob: int = 40, blobs: int = 5, outliers: int = 20, d: int = 2):
    """Well-separated Gaussian blobs plus far uniform outliers (the spec's GAP 1 fixture, small)."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-20, 20, size=(blobs, d))
    x = np.concatenate([rng.normal(c, 0.5, size=(per_blob, d)) for c in centres])
    far = rng.uniform(-200, 200, size=(outliers, d))
    return np.concatenate([x, far])


def fetched_data(machines: dict, config: KzCenterConfig, radius: float):
    """The representatives, weights, count and discarded count the machines hold for a radius."""
    points, weights, count, discarded = [], [], 0, 0
    for i in range(config.n_machines):
        machine = machines[machine_name(i)]
        agg = machine.aggregation(radius)
        points.append(machine.points[agg.reps])
        weights.append(agg.weights)
        count += agg.count
        discarded += agg.discarded
    return np.concatenate(points), np.concatenate(weights), count, discarded


def full_predicate(machines: dict, config: KzCenterConfig, grid: np.ndarray) -> list[bool]:
    """PASS2 and kzc at 5L, from the machines' own aggregations, for every grid value."""
    out = []
    for radius in grid:
        points, weights, count, discarded = fetched_data(machines, config, radius)
        ok = count <= config.count_bound and discarded <= config.outlier_budget
        out.append(ok and solvers.kzc(_kernels.pairwise_distances(points), weights, config.k,
                                      config.outlier_budget - discarded, 5 * radius).ok)
    return out


@pytest.fixture
def kz():
    """The helpers above, as a namespace (test modules are imported in importlib mode)."""
    return types.SimpleNamespace(
        opt=brute_force_opt,
        cost=weighted_center_cost,
        machines=make_machines,
        run=run_kzcenter,
        parts=random_parts,
        tiny=tiny_instance,
        blobs=blobs_with_outliers,
        solvers=solvers,
        kernels=_kernels,
        fetched=fetched_data,
        predicate=full_predicate,
    )

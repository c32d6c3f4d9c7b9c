"""What the (k,z)-clustering plugins report: the parties' results as JSON, the run's summary with
its baselines, and the plot of the centres.

The result keys are listed in `fedproto.algorithms.kzclustering.cli`. One :func:`summarize`
serves kzcenter and kzmedian/kzmeans: the run's sizes, the keys of the objective, the words per
phase, the baselines of ``--compare``, and the centres last. Baselines
are run here: the centralised ones on the pooled data, the distributed ones (and BEL) through the
synchronous harness, so their words are counted as the protocol's are.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fedproto.algorithms.kzclustering import _kernels, baselines, solvers
from fedproto.algorithms.kzclustering.config import KzCenterConfig
from fedproto.algorithms.kzclustering.means import (
    KzMeansConfig,
    KzMeansCoordinator,
    KzMeansMachine,
    MeansResult,
    centralised_kmeans,
    centralised_kmeans_minus_minus,
)
from fedproto.algorithms.kzclustering.parties import COORDINATOR, KzParties, MachineResult, machine_name
from fedproto.algorithms.kzclustering.protocol import CoordinatorResult
from fedproto.machine import ProtocolMachine
from fedproto.progress import progress_task
from fedproto.testing.harness import Harness

__all__ = [
    "CENTRALISED",
    "MEANS_BASELINES",
    "baseline_labels",
    "center_result_to_json",
    "means_result_to_json",
    "method_key",
    "parse_compare",
    "plot_centres",
    "run_baseline",
    "run_means",
    "summarize",
]

#: The centralised k-center baselines of ``kzcenter --compare`` (the distributed ones are
#: :data:`~fedproto.algorithms.kzclustering.baselines.METHODS`).
CENTRALISED = ("greedy", "charikar", "kzc")
#: The baselines of ``kzmedian/kzmeans --compare``.
MEANS_BASELINES = ("kmeans", "kmeans--", "bel")


def method_key(method: str) -> str:
    """A baseline's name as a result-key suffix (``"random-kzc"`` -> ``"random_kzc"``,
    ``"kmeans--"`` -> ``"kmeans_minus_minus"``)."""
    return method.replace("--", "_minus_minus").replace("-", "_")


def parse_compare(text: str, choices: Sequence[str]) -> list[str]:
    """``--compare``: ``none`` (or empty), ``all`` (every one of ``choices``) or a comma list.

    Raises:
        ValueError: a name that is not one of ``choices``.
    """
    if text in ("", "none"):
        return []
    names = list(choices) if text == "all" else [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in choices]
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; choose from {', '.join(choices)}")
    return names


def baseline_labels(methods: list[str], quantities: Mapping[str, str]) -> dict[str, str]:
    """Labels of the baseline keys: ``{quantity: label}`` for each method."""
    return {f"{q}_{method_key(m)}": f"{m}: {label}" for m in methods for q, label in quantities.items()}


def _run_star(
    x: np.ndarray,
    parts: list[np.ndarray],
    coordinator_of: Callable[[tuple[str, ...]], ProtocolMachine],
    machine_of: Callable[[int, str, np.ndarray], ProtocolMachine],
) -> Any:
    """The coordinator's result of a run of ``coordinator_of(names)`` and one
    ``machine_of(i, name, x[parts[i]])`` per part, through the synchronous harness."""
    names = tuple(machine_name(i) for i in range(len(parts)))
    parties = KzParties(names, scale=False, coordinator_of=lambda d: coordinator_of(names), machine_of=machine_of)
    return Harness(parties.machines({name: x[p] for name, p in zip(names, parts)})).run()[COORDINATOR]


def run_baseline(
    method: str, x: np.ndarray, parts: list[np.ndarray], k: int, z: int, seed: int
) -> baselines.BaselineResult:
    """Run a distributed baseline through the synchronous harness (same codec, same metering)."""
    config = baselines.BaselineConfig(method, k=k, z=z, n_machines=len(parts), d=x.shape[1], seed=seed)
    return _run_star(
        x, parts,
        lambda names: baselines.BaselineCoordinator(COORDINATOR, config=config, machines=names),
        lambda i, name, points: baselines.BaselineMachine(name, config=config, points=points, index=i),
    )


def run_means(config: KzMeansConfig, x: np.ndarray, parts: list[np.ndarray]) -> MeansResult:
    """Run the median/means protocol (or BEL) through the synchronous harness."""
    return _run_star(
        x, parts,
        lambda names: KzMeansCoordinator(COORDINATOR, config=config, machines=names),
        lambda i, name, points: KzMeansMachine(name, config=config, points=points, index=i),
    )


def _machine_to_json(party: str, result: Any) -> dict[str, Any]:
    """A machine's result as JSON-ready data (every protocol of the family)."""
    if isinstance(result, MachineResult):
        return {"outliers": int(result.outliers.sum()), "n_points": int(result.outliers.shape[0])}
    raise TypeError(f"unexpected result of {party}: {type(result).__name__}")


def center_result_to_json(party: str, result: Any) -> dict[str, Any]:
    """A party's result as JSON-ready data."""
    if isinstance(result, CoordinatorResult):
        return {
            "centres": result.centres.tolist(),
            "radius": result.radius,
            "guess": result.guess,
            "guess_index": result.guess_index,
            "kzc_radius": result.kzc_radius,
            "z_prime": result.z_prime,
            "discarded": result.discarded,
            "n_points": result.n,
            "grid_size": int(result.grid.shape[0]),
            "probed": result.probed.astype(int).tolist(),
            "pass2": result.pass2.astype(int).tolist(),
            "probe_rounds": [list(p) for p in result.probe_rounds],
            "fetches": [list(f) for f in result.fetches],
            "rejected": list(result.rejected),
            "polished": bool(result.polished),
            "outliers": result.outliers,
            "representatives": result.representatives,
            "words_by_phase": result.words_by_phase(),
            "total_words": result.total_words,
        }
    return _machine_to_json(party, result)


def means_result_to_json(party: str, result: Any) -> dict[str, Any]:
    """A party's result as JSON-ready data."""
    if isinstance(result, MeansResult):
        return {
            "centres": result.centres.tolist(),
            "threshold": result.threshold,
            "score": result.score,
            "bound": result.bound,
            "n_points": result.n,
            "grid_size": int(result.grid.shape[0]),
            "samples": result.samples,
            "coreset_points": result.coreset_points,
            "outliers": result.outliers,
            "words_by_phase": result.words_by_phase(),
            "total_words": result.total_words,
        }
    return _machine_to_json(party, result)


def _compare_center(methods: list[str], x: np.ndarray, parts: list[np.ndarray], k: int, z: int,
                    seed: int) -> dict[str, Any]:
    """Radius (z removed) of each baseline, and the words of the distributed ones."""
    out: dict[str, Any] = {}
    d = x.shape[1]
    for method in methods:
        key = method_key(method)
        with progress_task(f"baseline {method}", total=None):
            if method == "greedy":
                centres = x[baselines.greedy(x, k, start=seed % x.shape[0])]
            elif method == "charikar":
                centres = x[baselines.charikar(x, k, z)[0]]
            elif method == "kzc":
                centres = x[baselines.centralised_kzc(x, k, z)]
            else:
                result = run_baseline(method, x, parts, k, z, seed)
                centres = result.centres
                out[f"words_total_{key}"] = int(result.total_words)
                out[f"words_points_{key}"] = int(result.points_received * d)
            dist, _ = _kernels.nearest_centres(x, centres)
        out[f"radius_z_removed_{key}"] = float(solvers.center_cost(dist, z))
    return out


def _center_keys(coordinator: Mapping[str, Any], config: KzCenterConfig, dist: np.ndarray) -> dict[str, Any]:
    """The kzcenter keys: costs (paper style and guarantee style), the certificate and the search."""
    budget = math.floor(config.outlier_budget + 1e-9)
    return {
        "sub_machines": int(config.sub_machines),
        "search": config.search,
        "probe_batch": int(config.batch),
        "radius_z_removed": float(solvers.center_cost(dist, config.z)),
        "radius_budget_removed": float(solvers.center_cost(dist, budget)),
        "radius": float(coordinator["radius"]),
        "n_outliers": int(coordinator["outliers"]),
        "outlier_budget": float(config.outlier_budget),
        "accepted_guess": float(coordinator["guess"]),
        "grid_size": int(coordinator["grid_size"]),
        "probe_rounds": len(coordinator["probe_rounds"]),
        "probes": sum(len(p) for p in coordinator["probe_rounds"]),
        "fetch_rounds": len(coordinator["fetches"]),
        "rejected_guesses": len(coordinator["rejected"]),
        "polished": bool(coordinator["polished"]),
        "words_total": int(coordinator["total_words"]),
        "words_points": int(coordinator["representatives"] * config.d),
    }


def _compare_means(methods: list[str], config: KzMeansConfig, x: np.ndarray, parts: list[np.ndarray],
                   seed: int) -> dict[str, Any]:
    """Cost (z removed) of each baseline, and the words of BEL."""
    out: dict[str, Any] = {}
    for method in methods:
        key = method_key(method)
        with progress_task(f"baseline {method}", total=None):
            if method == "kmeans":
                other = centralised_kmeans(x, config.k, seed=seed)
            elif method == "kmeans--":
                other = centralised_kmeans_minus_minus(x, config.k, config.z, seed=seed)
            else:
                bel = dataclasses.replace(config, mode="bel", radius_bounds=None)
                result = run_means(bel, x, parts)
                other = result.centres
                out[f"words_total_{key}"] = int(result.total_words)
            out[f"cost_z_removed_{key}"] = float(
                solvers.trimmed_cost(_kernels.nearest_centres(x, other)[0], config.z, config.power)
            )
    return out


def _means_keys(coordinator: Mapping[str, Any], config: KzMeansConfig, dist: np.ndarray) -> dict[str, Any]:
    """The kzmedian/kzmeans keys: trimmed costs (with (1+slack)z and z removed), the threshold and
    the coresets."""
    power = config.power
    return {
        "mode": config.mode,
        "cost_budget_removed": float(solvers.trimmed_cost(dist, (1 + config.eps) * config.z, power)),
        "cost_z_removed": float(solvers.trimmed_cost(dist, config.z, power)),
        "outlier_threshold": float(coordinator["threshold"]),
        "n_outliers": int(coordinator["outliers"]),
        "grid_size": int(coordinator["grid_size"]),
        "coreset_samples": int(coordinator["samples"]),
        "words_total": int(coordinator["total_words"]),
        "words_points": int(coordinator["coreset_points"] * (config.d + 1)),
    }


def summarize(
    coordinator: Mapping[str, Any],
    config: KzCenterConfig | KzMeansConfig,
    x: np.ndarray,
    name: str,
    parts: list[np.ndarray],
    compare: list[str],
    seed: int,
) -> dict[str, Any]:
    """The summary of a run, in report order: sizes, the objective's keys (kzcenter for a
    :class:`KzCenterConfig`, kzmedian/kzmeans for a :class:`KzMeansConfig`), words per phase, the
    baselines of ``compare`` (computed here), and the centres last.

    Args:
        coordinator: the coordinator's result JSON (:func:`center_result_to_json`,
            :func:`means_result_to_json`).
        config: the run's parameters, with ``d``.
        x: the pooled data ``[n, d]``, as the run saw it.
        name: the data set's name.
        parts: the machines' parts (indices into ``x``), for the distributed baselines.
        compare: the baselines (:func:`parse_compare`).
        seed: the run's seed (the baselines' randomness).

    Returns:
        The result keys of `fedproto.algorithms.kzclustering.cli`.
    """
    centres = np.asarray(coordinator["centres"], dtype=np.float64).reshape(-1, x.shape[1])
    dist, _ = _kernels.nearest_centres(x, centres)
    summary: dict[str, Any] = {
        "data_set": name,
        "n_points": int(x.shape[0]),
        "d": int(x.shape[1]),
        "k": int(config.k),
        "z": int(config.z),
        "slack": float(config.eps),
        "n_clients": int(config.n_machines),
    }
    if isinstance(config, KzCenterConfig):
        summary.update(_center_keys(coordinator, config, dist))
    else:
        summary.update(_means_keys(coordinator, config, dist))
    for phase, words in coordinator["words_by_phase"].items():
        summary[f"words_phase_{phase}"] = int(words)
    if isinstance(config, KzCenterConfig):
        summary.update(_compare_center(compare, x, parts, config.k, config.z, seed))
    else:
        summary.update(_compare_means(compare, config, x, parts, seed))
    summary["centres"] = centres.tolist()
    return summary


def plot_centres(ax, x: np.ndarray, summary: Mapping[str, Any], *, title: str = "(k,z)-center") -> None:
    """Points (first two principal components), outliers in red, centres as black crosses.

    Args:
        ax: the matplotlib axes to draw on.
        x: the data ``[n, d]``, as the run saw it.
        summary: the run's result keys (``centres``, and ``radius`` or ``outlier_threshold``).
        title: the protocol's objective, e.g. ``"(k,z)-center"`` or ``"(k,z)-means"``; a run in
            BEL mode (``summary["mode"] == "bel"``) says so.
    """
    centres = np.asarray(summary["centres"], dtype=np.float64).reshape(-1, x.shape[1])
    threshold_key = "radius" if "radius" in summary else "outlier_threshold"
    radius = summary.get(threshold_key, math.inf)
    dist, _ = _kernels.nearest_centres(x, centres)
    if x.shape[1] > 2:
        from sklearn.decomposition import PCA

        pca = PCA(n_components=2, random_state=0).fit(x)
        px, pc = pca.transform(x), pca.transform(centres) if centres.size else np.zeros((0, 2))
    else:
        pad = (lambda a: np.pad(a, ((0, 0), (0, 2 - a.shape[1]))))  # noqa: E731
        px, pc = pad(x), pad(centres)
    far = dist > radius
    beyond = "radius" if threshold_key == "radius" else "threshold"
    ax.scatter(px[~far, 0], px[~far, 1], s=5, alpha=0.5, label=f"inliers ({int((~far).sum()):,})")
    ax.scatter(px[far, 0], px[far, 1], s=8, color="red", label=f"outliers beyond the {beyond} ({int(far.sum()):,})")
    ax.scatter(pc[:, 0], pc[:, 1], marker="x", color="black", s=60, label=f"centres ({len(centres)})")
    if summary.get("mode") == "bel":
        title += " (BEL baseline)"
    ax.set_title(title + (" (first two principal components)" if x.shape[1] > 2 else ""))
    legend = ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize="small", frameon=False)
    for handle in legend.legend_handles:
        handle.set_sizes([30])  # legend markers of one readable size, whatever the points' size

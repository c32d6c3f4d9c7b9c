"""The (k,z)-clustering plugins for the ``fedproto`` command line (entry points ``kzcenter``,
``kzmedian``, ``kzmeans``).

``fedproto run kzcenter --data digits --machines 5 --k 20 --z 256 --eps 0.1 --inject-outliers 256``
loads the data (raw features; ``--normalize`` for min-max scaling), optionally replaces it by the
synthetic Gaussian mixture (``--synthetic N``) and injects outliers by the spec's recipe, splits it
over the machines (``--machines``, which overrides the core's ``--clients``: Guo & Li call the
data holders machines), runs Guo & Li's protocol and prints the radius with z and with (1+eps)z
outliers removed, the certified radius and how many points lie beyond it, the words per phase,
and the baselines chosen with ``--compare`` (centralised ones computed here, distributed ones run
through the synchronous harness so their words are counted the same way).

``kzmedian`` / ``kzmeans`` run the Appendix C protocol (:mod:`fedproto.algorithms.kzclustering.means`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedproto.algorithms.kzclustering import _kernels, solvers
from fedproto.algorithms.kzclustering.baselines import (
    METHODS,
    BaselineConfig,
    BaselineCoordinator,
    BaselineMachine,
    BaselineResult,
    centralised_kzc,
    charikar,
    greedy,
)
from fedproto.algorithms.kzclustering.config import SEARCHES, KzCenterConfig, check_instance
from fedproto.algorithms.kzclustering.data import synthetic_dataset, with_outliers
from fedproto.algorithms.kzclustering.means import (
    KzMeansConfig,
    KzMeansCoordinator,
    KzMeansMachine,
    MeansResult,
    centralised_kmeans,
    centralised_kmeans_minus_minus,
)
from fedproto.algorithms.kzclustering.protocol import (
    COORDINATOR,
    CoordinatorResult,
    KzCoordinator,
    KzMachine,
    MachineResult,
    machine_name,
)
from fedproto.data import Dataset, normalize, partition, session_id
from fedproto.plugin import RunPlan
from fedproto.testing.harness import Harness

__all__ = ["KZCENTER", "KZMEANS", "KZMEDIAN", "KzCenterPlugin", "KzMeansPlugin", "prepare_data", "run_baseline"]

CENTRALISED = ("greedy", "charikar", "kzc")
CENTER_PHASES = ("extent", "grid", "counts", "fetch", "points", "centres", "outliers")


def add_data_arguments(group: argparse._ArgumentGroup) -> None:
    """Options shared by the three plugins: machines, synthetic data, outlier injection."""
    group.add_argument("--machines", type=int, default=None, help="number of machines m (overrides --clients)")
    group.add_argument("--synthetic", type=int, default=None, metavar="N",
                       help="use the synthetic Gaussian mixture of N points instead of --data")
    group.add_argument("--synthetic-d", type=int, default=5, help="dimension of the synthetic set (default 5)")
    group.add_argument("--synthetic-components", type=int, default=4, help="its components (default 4)")
    group.add_argument("--inject-outliers", type=int, default=0, metavar="Z",
                       help="append Z outliers by the spec's recipe (default 0)")
    group.add_argument("--dist-factor", type=float, default=50.0, help="outlier noise variance factor (default 50)")
    group.add_argument("--normalize", action="store_true", help="min-max normalise features to [-1, 1] first")


def prepare_data(args: argparse.Namespace, dataset: Dataset) -> tuple[Dataset, int]:
    """The data set the run uses and the number of machines.

    Raises:
        ValueError: bad sizes (no machines, negative outlier count, a bad synthetic shape).
    """
    machines = args.machines if args.machines is not None else args.clients
    if machines < 1:
        raise ValueError("--machines must be at least 1")
    if args.inject_outliers < 0:
        raise ValueError("--inject-outliers must be >= 0")
    if args.synthetic is not None:
        dataset = synthetic_dataset(
            args.synthetic, args.synthetic_d, args.synthetic_components, 0, seed=args.seed
        )
    if args.normalize:
        dataset = Dataset(dataset.name, normalize(dataset.x), dataset.y, dataset.paper_k)
    dataset = with_outliers(dataset, args.inject_outliers, dist_factor=args.dist_factor, seed=args.seed + 7)
    return dataset, machines


def run_baseline(method: str, x: np.ndarray, parts: list[np.ndarray], k: int, z: int, seed: int) -> BaselineResult:
    """Run a distributed baseline through the synchronous harness (same codec, same metering)."""
    config = BaselineConfig(method, k=k, z=z, n_machines=len(parts), d=x.shape[1], seed=seed)
    names = [machine_name(i) for i in range(len(parts))]
    machines: dict[str, Any] = {COORDINATOR: BaselineCoordinator(COORDINATOR, config=config, machines=names)}
    for i, name in enumerate(names):
        machines[name] = BaselineMachine(name, config=config, points=x[parts[i]], index=i)
    return Harness(machines).run()[COORDINATOR]


def _compare(methods: list[str], x: np.ndarray, parts: list[np.ndarray], k: int, z: int, seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    d = x.shape[1]
    for method in methods:
        if method == "greedy":
            centres = x[greedy(x, k, start=seed % x.shape[0])]
            words = None
        elif method == "charikar":
            centres = x[charikar(x, k, z)[0]]
            words = None
        elif method == "kzc":
            centres = x[centralised_kzc(x, k, z)]
            words = None
        else:
            result = run_baseline(method, x, parts, k, z, seed)
            centres, words = result.centres, (result.total_words, result.points_received * d)
        dist, _ = _kernels.nearest_centres(x, centres)
        out[f"{method}: radius (z removed)"] = solvers.center_cost(dist, z)
        if words is not None:
            out[f"{method}: words (all / paper)"] = f"{words[0]} / {words[1]}"
    return out


def _parse_compare(text: str) -> list[str]:
    if text in ("", "none"):
        return []
    names = list(CENTRALISED + METHODS) if text == "all" else [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in CENTRALISED + METHODS]
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; choose from {', '.join(CENTRALISED + METHODS)}")
    return names


class KzCenterPlugin:
    """Guo & Li's distributed (k,z)-center as a ``fedproto`` protocol plugin."""

    name = "kzcenter"
    description = "distributed (k,z)-center with (1+eps)z outliers (Guo & Li, NeurIPS 2018)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("kzcenter")
        group.add_argument("--k", type=int, default=20, help="centres (default 20)")
        group.add_argument("--z", type=int, default=None, help="outliers (default: --inject-outliers)")
        group.add_argument("--eps", type=float, default=0.1, help="bicriteria slack in (0, 1] (default 0.1)")
        group.add_argument("--search", choices=SEARCHES, default="linear", help="search over the radius grid")
        group.add_argument("--batch", type=int, default=1, help="guesses fetched per round (0 = all at once)")
        group.add_argument("--candidates", choices=("all", "uncovered"), default="all",
                           help="aggregation centres from all points (paper) or uncovered ones")
        group.add_argument("--no-refine", action="store_true", help="certify 24 L instead of refining kzc's radius")
        group.add_argument("--radius-bounds", type=float, nargs=2, default=None, metavar=("A", "B"),
                           help="known interval for the optimal radius (skips the extent round)")
        group.add_argument("--compare", default="greedy",
                           help="baselines for the summary: none, all, or a comma list of "
                                f"{', '.join(CENTRALISED + METHODS)} (default greedy)")
        add_data_arguments(group)

    def plan(self, args: argparse.Namespace, dataset: Dataset) -> RunPlan:
        dataset, m = prepare_data(args, dataset)
        x = dataset.x
        n, d = x.shape
        z = args.z if args.z is not None else args.inject_outliers
        check_instance(n, args.k, z)
        compare = _parse_compare(args.compare)
        config = KzCenterConfig(
            k=args.k, z=z, eps=args.eps, n_machines=m, d=d,
            radius_bounds=tuple(args.radius_bounds) if args.radius_bounds else None,
            search=args.search, batch=args.batch, candidates=args.candidates, refine=not args.no_refine,
        )
        parts = partition(n, m, scheme=args.partition, seed=args.seed, labels=dataset.y)
        names = tuple(machine_name(i) for i in range(m))
        session = session_id("kzcenter", dataset.name, n, d, config, args.seed, args.partition)

        def make_machine(party: str):
            if party == COORDINATOR:
                return KzCoordinator(COORDINATOR, config=config, machines=names)
            return KzMachine(party, config=config, points=x[parts[names.index(party)]])

        def summarize(results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
            return summarize_center(results[COORDINATOR], config, x, dataset.name, parts, compare, args.seed)

        return RunPlan(
            roster=(COORDINATOR, *names),
            session=session,
            make_machine=make_machine,
            result_to_json=center_result_to_json,
            summarize=summarize,
            role_of=lambda p: "coordinator" if p == COORDINATOR else "machine",
            iterations=3 if config.radius_bounds else 4,
            phases=CENTER_PHASES,
            plot_results=lambda ax, summary: plot_centres(ax, x, summary),
            analytic={
                "max representatives per guess k m (1+1/eps)": config.max_reps,
                "Round-3 words bound per guess k m (1+1/eps)(d+1)": config.max_reps * (d + 1),
                "threshold y = eps z / (k m)": config.threshold,
            },
        )


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
            "n": result.n,
            "grid_size": int(result.grid.shape[0]),
            "pass2": result.pass2.astype(int).tolist(),
            "fetches": [list(f) for f in result.fetches],
            "rejected": list(result.rejected),
            "outliers": result.outliers,
            "representatives": result.representatives,
            "words_by_phase": result.words_by_phase(),
            "total_words": result.total_words,
        }
    if isinstance(result, MachineResult):
        return {"outliers": int(result.outliers.sum()), "n_points": int(result.outliers.shape[0])}
    raise TypeError(f"unexpected result of {party}: {type(result).__name__}")


def summarize_center(
    coordinator: Mapping[str, Any],
    config: KzCenterConfig,
    x: np.ndarray,
    name: str,
    parts: list[np.ndarray],
    compare: list[str],
    seed: int,
) -> dict[str, Any]:
    """Costs (paper style and guarantee style), the certificate, words, and the baselines."""
    centres = np.asarray(coordinator["centres"], dtype=np.float64).reshape(-1, x.shape[1])
    dist, _ = _kernels.nearest_centres(x, centres)
    budget = math.floor(config.outlier_budget + 1e-9)
    summary: dict[str, Any] = {
        "data set": name,
        "n": int(x.shape[0]),
        "d": int(x.shape[1]),
        "k": config.k,
        "z": config.z,
        "eps": config.eps,
        "machines": config.n_machines,
        "search": f"{config.search}, batch {config.batch or 'all'}",
        "radius (z outliers removed)": solvers.center_cost(dist, config.z),
        "radius ((1+eps)z outliers removed)": solvers.center_cost(dist, budget),
        "certified radius L_out": coordinator["radius"],
        "points beyond L_out": coordinator["outliers"],
        "allowed (1+eps)z": config.outlier_budget,
        "accepted guess L": coordinator["guess"],
        "grid size": coordinator["grid_size"],
        "fetch rounds": len(coordinator["fetches"]),
        "rejected guesses": len(coordinator["rejected"]),
        "words (all messages)": coordinator["total_words"],
        "words (paper: Round-3 points x d)": coordinator["representatives"] * config.d,
    }
    for phase, words in coordinator["words_by_phase"].items():
        summary[f"words: {phase}"] = words
    summary.update(_compare(compare, x, parts, config.k, config.z, seed))
    summary["centres"] = centres.tolist()
    return summary


def plot_centres(ax, x: np.ndarray, summary: Mapping[str, Any]) -> None:
    """Points (first two principal components), outliers in red, centres as black crosses."""
    centres = np.asarray(summary["centres"], dtype=np.float64).reshape(-1, x.shape[1])
    radius = summary.get("certified radius L_out", summary.get("outlier threshold", math.inf))
    dist, _ = _kernels.nearest_centres(x, centres)
    if x.shape[1] > 2:
        from sklearn.decomposition import PCA

        pca = PCA(n_components=2, random_state=0).fit(x)
        px, pc = pca.transform(x), pca.transform(centres) if centres.size else np.zeros((0, 2))
    else:
        pad = (lambda a: np.pad(a, ((0, 0), (0, 2 - a.shape[1]))))  # noqa: E731
        px, pc = pad(x), pad(centres)
    far = dist > radius
    ax.scatter(px[~far, 0], px[~far, 1], s=5, alpha=0.5, label="inliers")
    ax.scatter(px[far, 0], px[far, 1], s=8, color="red", label="outliers")
    ax.scatter(pc[:, 0], pc[:, 1], marker="x", color="black", s=60, label="centres")
    ax.set_title("(k,z)-center" + (" (PCA)" if x.shape[1] > 2 else ""))
    ax.legend(fontsize="small")


KZCENTER = KzCenterPlugin()

MEANS_BASELINES = ("kmeans", "kmeans--", "bel")
MEANS_PHASES = ("extent", "grid", "costs", "totals", "coresets", "centres", "outliers")


def run_means(config: KzMeansConfig, x: np.ndarray, parts: list[np.ndarray]) -> MeansResult:
    """Run the median/means protocol (or BEL) through the synchronous harness."""
    names = [machine_name(i) for i in range(len(parts))]
    machines: dict[str, Any] = {COORDINATOR: KzMeansCoordinator(COORDINATOR, config=config, machines=names)}
    for i, name in enumerate(names):
        machines[name] = KzMeansMachine(name, config=config, points=x[parts[i]], index=i)
    return Harness(machines).run()[COORDINATOR]


class KzMeansPlugin:
    """Guo & Li's distributed (k,z)-median or (k,z)-means (Appendix C) as a ``fedproto`` plugin.

    Args:
        power: 1 (median) or 2 (means).
    """

    def __init__(self, power: int) -> None:
        self.power = power
        self.name = "kzmedian" if power == 1 else "kzmeans"
        objective = "median" if power == 1 else "means"
        self.description = f"distributed (k,z)-{objective} with truncated-cost coresets (Guo & Li, Appendix C)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(self.name)
        group.add_argument("--k", type=int, default=10, help="centres (default 10)")
        group.add_argument("--z", type=int, default=None, help="outliers (default: --inject-outliers)")
        group.add_argument("--eps", type=float, default=0.3, help="grid ratio and outlier slack (default 0.3)")
        group.add_argument("--samples", type=int, default=None,
                           help="coreset samples per radius (default max(10k, n/(10T)))")
        group.add_argument("--facilities", type=int, default=None, help="reverse-greedy facilities (default 8k)")
        group.add_argument("--radius-bounds", type=float, nargs=2, default=None, metavar=("A", "B"),
                           help="grid range (skips the extent round)")
        group.add_argument("--no-polish", action="store_true", help="keep reverse greedy's centres as they are")
        group.add_argument("--mode", choices=("truncated", "bel"), default="truncated",
                           help="Guo & Li (truncated) or the BEL baseline as the main run")
        group.add_argument("--compare", default="kmeans--",
                           help="baselines for the summary: none, all, or a comma list of "
                           f"{', '.join(MEANS_BASELINES)}")
        add_data_arguments(group)

    def plan(self, args: argparse.Namespace, dataset: Dataset) -> RunPlan:
        dataset, m = prepare_data(args, dataset)
        x = dataset.x
        n, d = x.shape
        z = args.z if args.z is not None else args.inject_outliers
        check_instance(n, args.k, z)
        if args.compare in ("", "none"):
            compare: list[str] = []
        elif args.compare == "all":
            compare = list(MEANS_BASELINES)
        else:
            compare = [t.strip() for t in args.compare.split(",") if t.strip()]
            unknown = [t for t in compare if t not in MEANS_BASELINES]
            if unknown:
                raise ValueError(f"unknown baseline(s) {unknown}; choose from {', '.join(MEANS_BASELINES)}")
        config = KzMeansConfig(
            k=args.k, z=z, eps=args.eps, n_machines=m, d=d, power=self.power, mode=args.mode,
            samples=args.samples, facilities=args.facilities,
            radius_bounds=tuple(args.radius_bounds) if args.radius_bounds else None,
            polish=not args.no_polish, seed=args.seed,
        )
        parts = partition(n, m, scheme=args.partition, seed=args.seed, labels=dataset.y)
        names = tuple(machine_name(i) for i in range(m))
        session = session_id(self.name, dataset.name, n, d, config, args.partition)

        def make_machine(party: str):
            if party == COORDINATOR:
                return KzMeansCoordinator(COORDINATOR, config=config, machines=names)
            i = names.index(party)
            return KzMeansMachine(party, config=config, points=x[parts[i]], index=i)

        def summarize(results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
            return summarize_means(results[COORDINATOR], config, x, dataset.name, parts, compare, args.seed)

        skipped = config.mode == "bel" or config.radius_bounds is not None
        return RunPlan(
            roster=(COORDINATOR, *names),
            session=session,
            make_machine=make_machine,
            result_to_json=means_result_to_json,
            summarize=summarize,
            role_of=lambda p: "coordinator" if p == COORDINATOR else "machine",
            iterations=3 if skipped else 4,
            phases=MEANS_PHASES,
            plot_results=lambda ax, summary: plot_centres(ax, x, summary),
            analytic={"objective exponent l": self.power, "outlier budget of the score": config.outlier_budget},
        )


def means_result_to_json(party: str, result: Any) -> dict[str, Any]:
    """A party's result as JSON-ready data."""
    if isinstance(result, MeansResult):
        return {
            "centres": result.centres.tolist(),
            "threshold": result.threshold,
            "score": result.score,
            "bound": result.bound,
            "n": result.n,
            "grid_size": int(result.grid.shape[0]),
            "samples": result.samples,
            "coreset_points": result.coreset_points,
            "outliers": result.outliers,
            "words_by_phase": result.words_by_phase(),
            "total_words": result.total_words,
        }
    if isinstance(result, MachineResult):
        return {"outliers": int(result.outliers.sum()), "n_points": int(result.outliers.shape[0])}
    raise TypeError(f"unexpected result of {party}: {type(result).__name__}")


def summarize_means(
    coordinator: Mapping[str, Any],
    config: KzMeansConfig,
    x: np.ndarray,
    name: str,
    parts: list[np.ndarray],
    compare: list[str],
    seed: int,
) -> dict[str, Any]:
    """Trimmed costs of the run (with (1+eps)z and z removed), its words, and the baselines' costs."""
    power = config.power
    centres = np.asarray(coordinator["centres"], dtype=np.float64).reshape(-1, x.shape[1])
    dist, _ = _kernels.nearest_centres(x, centres)
    summary: dict[str, Any] = {
        "data set": name,
        "n": int(x.shape[0]),
        "d": int(x.shape[1]),
        "k": config.k,
        "z": config.z,
        "eps": config.eps,
        "machines": config.n_machines,
        "mode": config.mode,
        "cost ((1+eps)z removed)": solvers.trimmed_cost(dist, (1 + config.eps) * config.z, power),
        "cost (z removed)": solvers.trimmed_cost(dist, config.z, power),
        "outlier threshold": coordinator["threshold"],
        "points beyond the threshold": coordinator["outliers"],
        "grid size": coordinator["grid_size"],
        "coreset samples per radius": coordinator["samples"],
        "words (all messages)": coordinator["total_words"],
        "words (paper: coreset points x (d+1))": coordinator["coreset_points"] * (config.d + 1),
    }
    for phase, words in coordinator["words_by_phase"].items():
        summary[f"words: {phase}"] = words
    for method in compare:
        if method == "kmeans":
            other = centralised_kmeans(x, config.k, seed=seed)
        elif method == "kmeans--":
            other = centralised_kmeans_minus_minus(x, config.k, config.z, seed=seed)
        else:
            bel = dataclasses.replace(config, mode="bel", radius_bounds=None)
            result = run_means(bel, x, parts)
            other = result.centres
            summary["bel: words"] = result.total_words
        summary[f"{method}: cost (z removed)"] = solvers.trimmed_cost(
            _kernels.nearest_centres(x, other)[0], config.z, power
        )
    summary["centres"] = centres.tolist()
    return summary


KZMEDIAN = KzMeansPlugin(1)
KZMEANS = KzMeansPlugin(2)

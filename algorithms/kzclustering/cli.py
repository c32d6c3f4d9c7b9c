"""The (k,z)-clustering plugins for the ``fedproto`` command line (entry points ``kzcenter``,
``kzmedian``, ``kzmeans``).

``fedproto run kzcenter --data digits --machines 5 --k 20 --z 256 --slack 0.1 --inject-outliers 256``
loads the data (raw features; ``--normalize`` or ``--normalize minmax`` for min-max scaling to
[-1, 1]), optionally replaces it by the synthetic Gaussian mixture (``--synthetic N``) and injects
outliers by the spec's recipe, splits it over the machines (``--machines`` is Guo & Li's word for
the core's ``--clients``, same option), runs Guo & Li's protocol and prints the radius with z and
with (1+slack)z outliers removed, the certified radius and how many points lie beyond it, the
words per phase, and the baselines chosen with ``--compare`` (centralised ones computed here,
distributed ones run through the synchronous harness so their words are counted the same way).
The slack is the paper's epsilon (bicriteria: at most (1+slack)z outliers); it is not a privacy
budget.

``kzmedian`` / ``kzmeans`` run the Appendix C protocol (:mod:`fedproto.algorithms.kzclustering.means`).

Each party holds only its own data (issue 10). ``split`` cuts the data set (with the synthetic
mixture and the injected outliers, never scaled) into the machines' raw parts, and every party is
built from its own part and the public options only (``make_party``), in the simulation
(``plan`` = ``split`` + that builder + the pooled summaries and baselines) as in a process per
party (``plan_party``, ``fedproto party --data FILE``): equal results and payload bytes by
construction. The coordinator holds no data and learns n, the n_i and d inside the protocol;
``--normalize minmax`` adds the setup phase ``setup.data`` that agrees the federation's
per-feature extent (:mod:`fedproto.algorithms.kzclustering.setup`). ``--sub-machines auto``
depends on the largest machine: ``plan`` resolves it from the split, ``resolved_options`` passes
the value to the TCP launcher's parties, and a party on its own needs ``--sub-machines T``.

Result keys of the report (``results``; the plans' ``labels`` give the table labels). Words are
scalars sent in either direction (a point of R^d is d words, a weight or count 1).

=================================  ================================================================
``data_set``                       name of the data set
``n_points``, ``d``, ``k``, ``z``  points (outliers included), features, centres, outliers allowed
``slack``                          bicriteria slack (the paper's epsilon)
``n_clients``                      machines m
``radius``                         (kzcenter) certified radius L_out: at most (1+slack)z points
                                   lie beyond it
``outlier_threshold``              (kzmedian/kzmeans) distance beyond which points are outliers
``n_outliers``                     points beyond ``radius`` / ``outlier_threshold``
``outlier_budget``                 (kzcenter) (1+slack)z
``radius_z_removed``               (kzcenter) radius of the centres with the z farthest points
                                   removed; ``radius_budget_removed`` with floor((1+slack)z)
``cost_z_removed``                 (kzmedian/kzmeans) sum of distances (median) or squared
                                   distances (means) with the z farthest removed;
                                   ``cost_budget_removed`` with (1+slack)z removed
``words_total``                    words of all messages
``words_points``                   the paper's count: words of the points uploaded (Round-3
                                   representatives x d; coreset points x (d+1))
``words_<phase>``                  words per protocol phase
``<quantity>_<method>``            the same quantity for a baseline of ``--compare``
                                   (``radius_z_removed_charikar``, ``words_total_mkcwm``,
                                   ``cost_z_removed_kmeans_minus_minus``, ...)
``centres``                        the centres ``[k, d]``
=================================  ================================================================
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
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
from fedproto.algorithms.kzclustering.config import COUNT_TESTS, SEARCHES, KzCenterConfig, check_instance
from fedproto.algorithms.kzclustering.data import synthetic_dataset, with_outliers
from fedproto.algorithms.kzclustering.messages import (
    AggregatedCounts,
    Coresets,
    CostTotals,
    DataSummary,
    FederationSummary,
    FinalCentres,
    LocalCosts,
    LocalExtent,
    OutlierCount,
    ProbeCounts,
    RadiusFetch,
    RadiusGrid,
    RadiusGuesses,
    RadiusProbes,
    Representatives,
    WeightedPoints,
)
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
from fedproto.algorithms.kzclustering.setup import SETUP_PHASE, DataSetupCoordinator, DataSetupMachine
from fedproto.data import Dataset, normalize, partition, session_id
from fedproto.framesize import max_frame_bytes
from fedproto.plugin import RunPlan
from fedproto.progress import progress_task
from fedproto.testing.harness import Harness

__all__ = [
    "KZCENTER",
    "KZMEANS",
    "KZMEDIAN",
    "KzCenterPlugin",
    "KzMeansPlugin",
    "center_frame_limit",
    "center_rounds_bound",
    "cut_data",
    "generate_data",
    "grid_size_bound",
    "make_party",
    "means_frame_limit",
    "prepare_data",
    "run_baseline",
    "setup_frame_limit",
]

CENTRALISED = ("greedy", "charikar", "kzc")
CENTER_PHASES = ("extent", "grid", "probe", "counts", "fetch", "points", "centres", "outliers")
NORMALIZATIONS = ("minmax", "none")

#: Readable labels of the result and analytic keys shared by the three plugins.
LABELS: dict[str, str] = {
    "data_set": "data set",
    "n_points": "points n",
    "n_clients": "machines m",
    "sub_machines": "sub-machines per machine T (m' = m T)",
    "slack": "slack (paper's eps)",
    "probe_batch": "guesses asked per round (0 = all)",
    "probe_rounds": "probe rounds",
    "probes": "guesses probed",
    "radius": "certified radius L_out",
    "n_outliers": "points beyond the outlier radius",
    "outlier_budget": "allowed (1+slack)z",
    "radius_z_removed": "radius (z outliers removed)",
    "radius_budget_removed": "radius ((1+slack)z outliers removed)",
    "accepted_guess": "accepted guess L",
    "grid_size": "grid size",
    "fetch_rounds": "fetch rounds",
    "rejected_guesses": "rejected guesses",
    "words_total": "words (all messages)",
    "outlier_threshold": "outlier threshold",
    "cost_z_removed": "cost (z removed)",
    "cost_budget_removed": "cost ((1+slack)z removed)",
    "coreset_samples": "coreset samples per radius",
    "max_representatives_per_guess": "max representatives per guess (the count test's bound)",
    "round3_words_bound_per_guess": "Round-3 words bound per guess (count bound x (d+1))",
    "count_threshold": "threshold y = slack z / (k m'), m' = m T",
    "objective_power": "objective exponent l",
    "score_outlier_budget": "outlier budget of the score",
}


def method_key(method: str) -> str:
    """A baseline's name as a result-key suffix (``"random-kzc"`` -> ``"random_kzc"``,
    ``"kmeans--"`` -> ``"kmeans_minus_minus"``)."""
    return method.replace("--", "_minus_minus").replace("-", "_")


def _add_alias(group: argparse._ArgumentGroup, old: str, dest: str, **kwargs: Any) -> None:
    """An old spelling of an option, kept working but hidden from ``--help``."""
    group.add_argument(old, dest=dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)


def add_data_arguments(group: argparse._ArgumentGroup) -> None:
    """Options shared by the three plugins: machines, synthetic data, outlier injection, scaling."""
    group.add_argument("--machines", dest="clients", type=int, default=argparse.SUPPRESS, metavar="M",
                       help="number of machines m (Guo & Li's word for --clients; same option)")
    group.add_argument("--synthetic", type=int, default=None, metavar="N",
                       help="use the synthetic Gaussian mixture of N points instead of --data")
    group.add_argument("--synthetic-d", type=int, default=5, help="dimension of the synthetic set (default 5)")
    group.add_argument("--synthetic-components", type=int, default=4, help="its components (default 4)")
    group.add_argument("--inject-outliers", type=int, default=0, metavar="Z",
                       help="append Z outliers by the spec's recipe (default 0)")
    group.add_argument("--dist-factor", type=float, default=50.0, help="outlier noise variance factor (default 50)")
    group.add_argument("--normalize", choices=NORMALIZATIONS, nargs="?", const="minmax", default="none",
                       help="minmax: scale every feature to [-1, 1] first (bare --normalize means minmax); "
                       "none: raw features (default)")


def add_slack_argument(group: argparse._ArgumentGroup, default: float, help: str) -> None:
    """``--slack`` (the paper's eps; ``--eps`` is its hidden old spelling)."""
    group.add_argument("--slack", type=float, default=default, help=help)
    _add_alias(group, "--eps", "slack", type=float)


def _check_run_options(args: argparse.Namespace) -> None:
    """Refuse a slack outside (0, 1] or a negative outlier count (every mode)."""
    if not 0 < args.slack <= 1:
        raise ValueError(f"--slack must be in (0, 1], got {args.slack}")
    if args.inject_outliers < 0:
        raise ValueError("--inject-outliers must be >= 0")


def generate_data(args: argparse.Namespace, dataset: Dataset) -> Dataset:
    """The data set of the run before any scaling: ``dataset`` or the synthetic mixture
    (``--synthetic``), with the ``--inject-outliers`` outliers appended by the spec's recipe. This
    is what :meth:`KzCenterPlugin.split` cuts into the machines' raw parts.

    Raises:
        ValueError: a negative outlier count, a bad synthetic shape, or a slack outside (0, 1].
    """
    _check_run_options(args)
    if args.synthetic is not None:
        dataset = synthetic_dataset(
            args.synthetic, args.synthetic_d, args.synthetic_components, 0, seed=args.seed
        )
    return with_outliers(dataset, args.inject_outliers, dist_factor=args.dist_factor, seed=args.seed + 7)


def prepare_data(args: argparse.Namespace, dataset: Dataset) -> tuple[Dataset, int]:
    """The data set as the run sees it, pooled, and the number of machines.

    :func:`generate_data`, then with ``--normalize minmax`` every feature scaled to ``[-1, 1]``
    by the whole set's per-feature extent: row for row what the machines compute, each scaling
    its own raw part by the extent the federation agrees in the setup phase
    (`fedproto.algorithms.kzclustering.setup`). Outliers are injected before the scaling (they
    are part of the data the machines hold), so the extent includes them.

    Raises:
        ValueError: bad sizes (no machines, negative outlier count, a bad synthetic shape) or a
            slack outside (0, 1].
    """
    machines = args.clients
    if machines < 1:
        raise ValueError(f"--clients/--machines must be at least 1, got {machines}")
    dataset = generate_data(args, dataset)
    if args.normalize == "minmax":
        dataset = Dataset(dataset.name, normalize(dataset.x), dataset.y, dataset.paper_k)
    return dataset, machines


def cut_data(args: argparse.Namespace, dataset: Dataset) -> tuple[Dataset, list[np.ndarray]]:
    """:func:`generate_data` and the machines' parts (indices into it, ``--partition`` and
    ``--seed`` as the run cuts them).

    Raises:
        ValueError: as :func:`prepare_data`, or a partition that cannot be made.
    """
    machines = args.clients
    if machines < 1:
        raise ValueError(f"--clients/--machines must be at least 1, got {machines}")
    raw = generate_data(args, dataset)
    return raw, partition(raw.n, machines, scheme=args.partition, seed=args.seed, labels=raw.y)


def split_parts(raw: Dataset, parts: list[np.ndarray]) -> dict[str, Dataset]:
    """``{machine-i: its raw points}`` (with their labels, the data set's name and paper k)."""
    return {
        machine_name(i): Dataset(raw.name, raw.x[p], None if raw.y is None else raw.y[p], raw.paper_k)
        for i, p in enumerate(parts)
    }


def machines_of(roster: tuple[str, ...], args: argparse.Namespace) -> tuple[str, ...]:
    """The data-holding parties of a roster (every party but the coordinator, in roster order).

    Raises:
        ValueError: the roster has no coordinator or no machine, or ``--machines`` disagrees with it.
    """
    if COORDINATOR not in roster:
        raise ValueError(f"the roster has no {COORDINATOR}")
    names = tuple(p for p in roster if p != COORDINATOR)
    if not names:
        raise ValueError("the roster has no machine")
    given = getattr(args, "clients", None)
    if given is not None and given != len(names):
        raise ValueError(f"--machines {given} but the roster names {len(names)} machines")
    return names


def party_points(party: str, data: Dataset | None) -> np.ndarray | None:
    """A party's own raw points as a machine uses them (``None`` for the coordinator).

    Raises:
        ValueError: the coordinator was given data, a machine none, or points that are not a
            finite ``[n_i, d]`` array.
    """
    if party == COORDINATOR:
        if data is not None:
            raise ValueError(f"the {COORDINATOR} holds no data: start it without --data")
        return None
    if data is None:
        raise ValueError(f"{party} holds data: give its own file with --data FILE (fedproto split writes them)")
    x = np.asarray(data.x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] < 1:
        raise ValueError(f"{party}'s data must be a [n, d] array with d >= 1, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{party}'s data holds NaN or infinite values")
    return x


def make_party(
    party: str,
    points: np.ndarray | None,
    *,
    machines: tuple[str, ...],
    scale: bool,
    coordinator_of: Any,
    machine_of: Any,
) -> Any:
    """The machine of ``party`` built from its own points only (the builder shared by the
    simulation and a run of one process per party).

    Args:
        party: the coordinator or a machine.
        points: the machine's raw points ``[n_i, d]`` (``None`` for the coordinator).
        machines: every machine's name, in machine order.
        scale: ``--normalize minmax``: the parties first agree the federation's per-feature
            extent in ``setup.data`` and each machine scales its points by it.
        coordinator_of: ``(d or None) -> coordinator`` (``None``: it learns d from the machines).
        machine_of: ``(party, points) -> machine``.
    """
    if party == COORDINATOR:
        if scale:
            return DataSetupCoordinator(COORDINATOR, machines=machines, build=coordinator_of)
        return coordinator_of(None)
    if party not in machines:
        raise ValueError(f"{party} is not a party of this run ({COORDINATOR}, {', '.join(machines)})")
    if scale:
        return DataSetupMachine(party, points=points, build=lambda x: machine_of(party, x), coordinator=COORDINATOR)
    return machine_of(party, points)


def _own_party_only(party: str, make: Any) -> Any:
    """``make_machine`` of a party's own plan: only that party's machine can be built."""

    def make_machine(name: str) -> Any:
        if name != party:
            raise ValueError(f"this process holds only {party}'s data; it cannot build {name}")
        return make(name)

    return make_machine


#: Most values :func:`~fedproto.algorithms.kzclustering.solvers.radius_grid` builds (it refuses more).
_GRID_CAP = 100_001


def _geometric_count_bound(lower: float, upper: float, eps: float) -> int:
    """Most values of ``solvers.radius_grid(l, u, eps)`` for any ``l >= lower`` and ``u <= upper``
    (``ceil(log(u / l) / log(1 + eps)) + 2``, one more for the rounding of the logarithms)."""
    if not (math.isfinite(lower) and lower > 0) or not math.isfinite(upper):
        return _GRID_CAP
    if upper <= lower:
        return 1
    return min(_GRID_CAP, math.ceil(math.log(upper / lower) / math.log1p(eps)) + 3)


def grid_size_bound(x: np.ndarray, eps: float, *, objective: str, radius_bounds: Any = None) -> int:
    """Most radius guesses ``T`` the coordinator's grid can hold for the points ``x``, however they
    are split over the machines (so every party computes the same bound without the machines'
    extents), in ``O(n d log n)``.

    The grid spans the machines' smallest nonzero distance to the anchor bound on the diameter
    (see the protocols' ``_build_grid``). Two distinct points differ in some coordinate by at least
    ``g``, the smallest nonzero gap between the sorted values of a column, so every machine's
    smallest nonzero distance is at least ``g / 2`` (halved for the rounding of the distance
    kernel); every anchor bound is at most ``6 R``, ``R`` the largest distance to the mean.

    Args:
        x: all points ``[n, d]`` float64.
        eps: the grid ratio ``1 + eps``.
        objective: ``"center"`` (grid ``[0, g/4, ...]`` up to half the diameter) or ``"means"``
            (``eps dmin / (2 (1+eps) n)`` up to twice the diameter).
        radius_bounds: ``(A, B)`` when the grid is ``A (1+eps)^t`` up to ``B`` (no extent round).

    Returns:
        An upper bound of the grid's length (at most 100,002: the grid builder refuses longer grids).
    """
    if radius_bounds is not None:
        lo, hi = radius_bounds
        return _geometric_count_bound(float(lo), float(hi), eps)
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    if n < 2:
        return 1
    # values near the float64 limits overflow to inf here, and an infinite reach gives the cap
    with np.errstate(over="ignore", invalid="ignore"):
        gaps = np.diff(np.sort(x, axis=0), axis=0)
        positive = gaps[gaps > 0]
        if positive.size == 0:
            return 1  # every point in one place: no nonzero distance, a one-value grid
        dmin = float(positive.min()) / 2.0
        reach = 6.0 * float(np.sqrt(np.max(np.sum((x - x.mean(axis=0)) ** 2, axis=1)))) * (1.0 + 1e-9)
    if objective == "center":
        return 1 + _geometric_count_bound(dmin / 4.0, reach / 2.0, eps)
    return _geometric_count_bound(eps * dmin / (2.0 * (1.0 + eps) * n), 2.0 * reach, eps)


def setup_frame_limit(d: int) -> int:
    """The largest frame of ``setup.data`` (``--normalize minmax``): one extent ``[2, d]``."""
    arrays = {"extent": (2, d)}
    return max(max_frame_bytes(DataSummary, arrays=arrays), max_frame_bytes(FederationSummary, arrays=arrays))


def center_frame_limit(config: KzCenterConfig, x: np.ndarray, largest_machine: int, *, scale: bool = False) -> int:
    """The largest frame any party of a (k,z)-center run sends (bytes, envelope included).

    The grid, the counts (two per guess) and a fetch or probe round of every guess at once
    (``--probe-batch 0``) are ``T`` long (:func:`grid_size_bound`); a fetch reply holds, for each
    fetched guess, at most ``min(n_i, count bound)`` representatives ``[d]`` with their weights (a
    machine's count above the bound fails the count test, so that guess is never fetched), ``n_i``
    at most ``largest_machine``. How many a machine sends depends on its data, so this bound can
    exceed the observed frames several times; it is what an honest machine may send. ``scale``:
    the run has the ``setup.data`` phase of ``--normalize minmax`` (:func:`setup_frame_limit`).
    """
    d, k = x.shape[1], config.k
    t = grid_size_bound(x, config.eps, objective="center", radius_bounds=config.radius_bounds)
    asked = min(config.batch, t) if config.batch else t
    reps = min(largest_machine, config.max_reps)
    return max(
        max_frame_bytes(LocalExtent, arrays={"anchor": (1, d)}),
        max_frame_bytes(RadiusGrid, arrays={"radii": (t,)}),
        max_frame_bytes(AggregatedCounts, arrays={"counts": (t,), "discarded": (t,)}),
        max_frame_bytes(RadiusGuesses, arrays={"indices": (asked,)}),
        max_frame_bytes(
            WeightedPoints,
            arrays={"indices": (asked,), "sizes": (asked,), "points": (asked * reps, d), "weights": (asked * reps,)},
        ),
        max_frame_bytes(RadiusProbes, arrays={"radii": (asked,)}),
        max_frame_bytes(ProbeCounts, arrays={"counts": (asked,), "discarded": (asked,)}),
        max_frame_bytes(RadiusFetch),
        max_frame_bytes(Representatives, arrays={"points": (reps, d), "weights": (reps,)}),
        max_frame_bytes(FinalCentres, arrays={"centres": (k, d)}),
        max_frame_bytes(OutlierCount),
        setup_frame_limit(d) if scale else 0,
    )


def center_rounds_bound(config: KzCenterConfig, grid_size: int) -> int:
    """Algorithm rounds of a (k,z)-center run when the first fetch succeeds (for progress bars and
    the run's time limit): the extent round (without radius bounds), then the counts (``linear``,
    ``binary``) or at most ``ceil(log_{b+1} T) + 1`` probe rounds (``probe``, b guesses per
    round), a fetch, and the answer."""
    extent = 0 if config.radius_bounds else 1
    if config.search != "probe":
        return extent + 3
    b = config.batch
    probes = 1 if b == 0 or grid_size <= 1 else math.ceil(math.log(grid_size) / math.log(b + 1)) + 1
    return extent + probes + 2


def means_frame_limit(config: KzMeansConfig, x: np.ndarray, *, scale: bool = False) -> int:
    """The largest frame any party of a (k,z)-median/means run sends (bytes, envelope included).

    The grid, costs and totals are ``T`` long (:func:`grid_size_bound`; 1 in ``bel`` mode); a
    machine's coresets hold, per guess, at most ``t`` samples (its share of the ``t`` samples
    per radius) and its at most ``k`` local centres ``[d]`` with their weights, ``t`` being
    ``--samples`` or the coordinator's ``max(10 k, n / (10 T))``. A machine's share of the
    samples depends on its data, and the bound on ``T`` on the smallest gap between coordinates,
    so this bound can exceed the observed frames several times; it is what an honest machine
    may send. ``scale``: the run has the ``setup.data`` phase (:func:`setup_frame_limit`).
    """
    (n, d), k = x.shape, config.k
    if config.mode == "bel":
        t = 1
    else:
        t = grid_size_bound(x, config.eps, objective="means", radius_bounds=config.radius_bounds)
    if config.samples is not None:
        rows = t * (config.samples + k)
    else:  # T' (max(10 k, n // (10 T')) + k) <= T (11 k) + n // 10 for the grid's true length T' <= T
        rows = t * 11 * k + n // 10
    return max(
        max_frame_bytes(LocalExtent, arrays={"anchor": (1, d)}),
        max_frame_bytes(RadiusGrid, arrays={"radii": (t,)}),
        max_frame_bytes(LocalCosts, arrays={"costs": (t,)}),
        max_frame_bytes(CostTotals, arrays={"totals": (t,)}),
        max_frame_bytes(Coresets, arrays={"sizes": (t,), "points": (rows, d), "weights": (rows,)}),
        max_frame_bytes(FinalCentres, arrays={"centres": (k, d)}),
        max_frame_bytes(OutlierCount),
        setup_frame_limit(d) if scale else 0,
    )


def run_baseline(method: str, x: np.ndarray, parts: list[np.ndarray], k: int, z: int, seed: int) -> BaselineResult:
    """Run a distributed baseline through the synchronous harness (same codec, same metering)."""
    config = BaselineConfig(method, k=k, z=z, n_machines=len(parts), d=x.shape[1], seed=seed)
    names = [machine_name(i) for i in range(len(parts))]
    machines: dict[str, Any] = {COORDINATOR: BaselineCoordinator(COORDINATOR, config=config, machines=names)}
    for i, name in enumerate(names):
        machines[name] = BaselineMachine(name, config=config, points=x[parts[i]], index=i)
    return Harness(machines).run()[COORDINATOR]


def _compare(methods: list[str], x: np.ndarray, parts: list[np.ndarray], k: int, z: int, seed: int) -> dict[str, Any]:
    """Radius (z removed) of each baseline, and the words of the distributed ones."""
    out: dict[str, Any] = {}
    d = x.shape[1]
    for method in methods:
        key = method_key(method)
        with progress_task(f"baseline {method}", total=None):
            if method == "greedy":
                centres = x[greedy(x, k, start=seed % x.shape[0])]
            elif method == "charikar":
                centres = x[charikar(x, k, z)[0]]
            elif method == "kzc":
                centres = x[centralised_kzc(x, k, z)]
            else:
                result = run_baseline(method, x, parts, k, z, seed)
                centres = result.centres
                out[f"words_total_{key}"] = int(result.total_words)
                out[f"words_points_{key}"] = int(result.points_received * d)
            dist, _ = _kernels.nearest_centres(x, centres)
        out[f"radius_z_removed_{key}"] = float(solvers.center_cost(dist, z))
    return out


def _baseline_labels(methods: list[str], quantities: Mapping[str, str]) -> dict[str, str]:
    """Labels of the baseline keys: ``{quantity: label}`` for each method."""
    return {f"{q}_{method_key(m)}": f"{m}: {label}" for m in methods for q, label in quantities.items()}


def _sub_machines(text: str) -> str | int:
    """``--sub-machines``: ``auto`` or a positive integer."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a positive integer, got {text!r}")
    return value


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
    description = "distributed (k,z)-center with (1+slack)z outliers (Guo & Li, NeurIPS 2018)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("kzcenter")
        group.add_argument("--k", type=int, default=20, help="centres (default 20)")
        group.add_argument("--z", type=int, default=None, help="outliers (default: --inject-outliers)")
        add_slack_argument(group, 0.1, "bicriteria slack in (0, 1]: at most (1+slack)z outliers (the paper's "
                           "eps; default 0.1)")
        group.add_argument("--search", choices=SEARCHES, default="probe",
                           help="search over the radius grid: probe (counts of a few guesses per round, then one "
                                "fetch; default), linear or binary (counts of every guess first)")
        group.add_argument("--probe-batch", type=int, default=1,
                           help="radius guesses asked per round (0 = all at once; default 1)")
        _add_alias(group, "--batch", "probe_batch", type=int)
        group.add_argument("--count-test", choices=COUNT_TESTS, default="tight",
                           help="Round-2 count bound: tight, k m + z/(floor(y)+1) (default), or the paper's "
                                "k m (1+1/slack)")
        group.add_argument("--candidates", choices=("all", "uncovered"), default="all",
                           help="aggregation centres from all points (paper) or uncovered ones")
        group.add_argument("--no-refine", action="store_true", help="certify 24 L instead of refining kzc's radius")
        group.add_argument("--no-polish", action="store_true",
                           help="keep kzc's centres (no swap local search on the representatives)")
        group.add_argument("--radius-bounds", type=float, nargs=2, default=None, metavar=("A", "B"),
                           help="known interval for the optimal radius (skips the extent round)")
        group.add_argument("--sub-machines", type=_sub_machines, default="auto", metavar="T",
                           help="split every machine into T parts, each aggregated as one machine (Appendix "
                                "B; m' = m T); auto: ceil(largest machine / 10000) (default)")
        group.add_argument("--compare", default="greedy",
                           help="baselines for the summary: none, all, or a comma list of "
                                f"{', '.join(CENTRALISED + METHODS)} (default greedy)")
        add_data_arguments(group)

    def _config(self, args: argparse.Namespace, m: int, sub_machines: int) -> KzCenterConfig:
        """The public parameters every party shares (``d = None``: each party fills in its own)."""
        if args.probe_batch < 0:
            raise ValueError(f"--probe-batch must be >= 0 (0 = all at once), got {args.probe_batch}")
        _check_run_options(args)
        return KzCenterConfig(
            k=args.k, z=args.z if args.z is not None else args.inject_outliers, eps=args.slack, n_machines=m, d=None,
            radius_bounds=tuple(args.radius_bounds) if args.radius_bounds else None,
            search=args.search, batch=args.probe_batch, candidates=args.candidates, refine=not args.no_refine,
            count_test=args.count_test, polish=not args.no_polish, sub_machines=sub_machines,
        )

    def _builder(self, args: argparse.Namespace, config: KzCenterConfig, names: tuple[str, ...]) -> Any:
        """``(party, its raw points or None) -> machine``: every party built from its own data only."""
        workers = min(2, os.cpu_count() or 1)

        def coordinator_of(d: int | None) -> KzCoordinator:
            return KzCoordinator(COORDINATOR, config=dataclasses.replace(config, d=d), machines=names)

        def machine_of(party: str, points: np.ndarray) -> KzMachine:
            own = dataclasses.replace(config, d=int(points.shape[1]))
            return KzMachine(party, config=own, points=points, workers=workers)

        def build(party: str, points: np.ndarray | None) -> Any:
            return make_party(party, points, machines=names, scale=args.normalize == "minmax",
                              coordinator_of=coordinator_of, machine_of=machine_of)

        return build

    def _phases(self, args: argparse.Namespace) -> tuple[str, ...]:
        return (SETUP_PHASE, *CENTER_PHASES) if args.normalize == "minmax" else CENTER_PHASES

    def split(self, args: argparse.Namespace, dataset: Dataset) -> dict[str, Dataset]:
        """Each machine's raw part (``machine-0`` ...), as :meth:`plan` cuts the data: the data
        set or the synthetic mixture with the injected outliers, never scaled (``--normalize``
        happens inside the run, from the extent the machines agree in ``setup.data``)."""
        return split_parts(*cut_data(args, dataset))

    def resolved_options(self, args: argparse.Namespace, dataset: Dataset) -> list[str]:
        """``["--sub-machines", T]`` when ``--sub-machines auto`` (T follows from the largest
        machine, which a party holding only its own data cannot know); else ``[]``."""
        if args.sub_machines != "auto":
            return []
        _, parts = cut_data(args, dataset)
        return ["--sub-machines", str(solvers.sub_machine_count(max((len(p) for p in parts), default=0)))]

    def plan(self, args: argparse.Namespace, dataset: Dataset) -> RunPlan:
        raw, parts = cut_data(args, dataset)
        m = len(parts)
        x = normalize(raw.x) if args.normalize == "minmax" else raw.x  # the pooled view, for summaries
        n, d = x.shape
        z = args.z if args.z is not None else args.inject_outliers
        check_instance(n, args.k, z)
        compare = _parse_compare(args.compare)
        largest = max((len(p) for p in parts), default=0)
        t = solvers.sub_machine_count(largest) if args.sub_machines == "auto" else args.sub_machines
        base = self._config(args, m, t)
        config = dataclasses.replace(base, d=d)  # as every machine states it
        names = tuple(machine_name(i) for i in range(m))
        session = session_id("kzcenter", raw.name, n, d, config, args.seed, args.partition)
        build = self._builder(args, base, names)
        own = {name: part.x for name, part in split_parts(raw, parts).items()}

        def summarize(results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
            return summarize_center(results[COORDINATOR], config, x, raw.name, parts, compare, args.seed)

        return RunPlan(
            roster=(COORDINATOR, *names),
            session=session,
            make_machine=lambda party: build(party, own.get(party)),
            result_to_json=center_result_to_json,
            summarize=summarize,
            role_of=_role_of,
            iterations=center_rounds_bound(
                config, grid_size_bound(x, config.eps, objective="center", radius_bounds=config.radius_bounds)
            ),
            phases=self._phases(args),
            plot_results=lambda ax, summary: plot_centres(ax, x, summary),
            analytic={
                "max_representatives_per_guess": config.count_bound,
                "round3_words_bound_per_guess": config.count_bound * (d + 1),
                "count_threshold": config.threshold,
            },
            labels=self._labels(compare),
            max_frame_bytes=center_frame_limit(config, x, largest, scale=args.normalize == "minmax"),
        )

    def plan_party(
        self, args: argparse.Namespace, party: str, roster: tuple[str, ...], session: int, data: Dataset | None
    ) -> RunPlan:
        """The plan of one party holding only ``data`` (``None`` for the coordinator).

        m is the roster's number of machines; d, n and the n_i are learnt inside the protocol,
        the feature extent of ``--normalize minmax`` in ``setup.data``. The frame limit is the
        command line's ``--max-frame-bytes`` (the plan's own bound needs the whole data set).

        Raises:
            ValueError: ``--sub-machines auto`` (the largest machine decides it: give every party
                the same T), the coordinator given data or a machine none, bad options.
        """
        names = machines_of(roster, args)
        if args.sub_machines == "auto":
            raise ValueError(
                "--sub-machines auto needs the largest machine's size, which a party holding only its own data does "
                "not know: give every party the same --sub-machines T (1 when no machine holds more than 10,000 "
                "points; fedproto run --transport tcp passes the value it resolved)"
            )
        config = self._config(args, len(names), args.sub_machines)
        build = self._builder(args, config, names)
        points = party_points(party, data)
        return RunPlan(
            roster=tuple(roster),
            session=session,
            make_machine=_own_party_only(party, lambda name: build(name, points)),
            result_to_json=center_result_to_json,
            summarize=lambda results: {},
            role_of=_role_of,
            iterations=center_rounds_bound(config, _GRID_CAP + 1),
            phases=self._phases(args),
            labels=self._labels([]),
        )

    def _labels(self, compare: list[str]) -> dict[str, str]:
        return {
            **LABELS,
            "words_points": "words (paper: Round-3 points x d)",
            **{f"words_phase_{phase}": f"words: {phase}" for phase in CENTER_PHASES},
            **_baseline_labels(compare, {"radius_z_removed": "radius (z removed)",
                                         "words_total": "words (all messages)",
                                         "words_points": "words (paper: points x d)"}),
        }


def _role_of(party: str) -> str:
    return "coordinator" if party == COORDINATOR else "machine"


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
    """Costs (paper style and guarantee style), the certificate, words, and the baselines.

    Returns:
        The kzcenter result keys of the module docstring.
    """
    centres = np.asarray(coordinator["centres"], dtype=np.float64).reshape(-1, x.shape[1])
    dist, _ = _kernels.nearest_centres(x, centres)
    budget = math.floor(config.outlier_budget + 1e-9)
    summary: dict[str, Any] = {
        "data_set": name,
        "n_points": int(x.shape[0]),
        "d": int(x.shape[1]),
        "k": int(config.k),
        "z": int(config.z),
        "slack": float(config.eps),
        "n_clients": int(config.n_machines),
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
    for phase, words in coordinator["words_by_phase"].items():
        summary[f"words_phase_{phase}"] = int(words)
    summary.update(_compare(compare, x, parts, config.k, config.z, seed))
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
        add_slack_argument(group, 0.3, "grid ratio and outlier slack in (0, 1] (the paper's eps; default 0.3)")
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

    def _config(self, args: argparse.Namespace, m: int) -> KzMeansConfig:
        """The public parameters every party shares (``d = None``: each party fills in its own)."""
        _check_run_options(args)
        return KzMeansConfig(
            k=args.k, z=args.z if args.z is not None else args.inject_outliers, eps=args.slack, n_machines=m, d=None,
            power=self.power, mode=args.mode, samples=args.samples, facilities=args.facilities,
            radius_bounds=tuple(args.radius_bounds) if args.radius_bounds else None,
            polish=not args.no_polish, seed=args.seed,
        )

    def _builder(self, args: argparse.Namespace, config: KzMeansConfig, names: tuple[str, ...]) -> Any:
        """``(party, its raw points or None) -> machine``: every party built from its own data only."""

        def coordinator_of(d: int | None) -> KzMeansCoordinator:
            return KzMeansCoordinator(COORDINATOR, config=dataclasses.replace(config, d=d), machines=names)

        def machine_of(party: str, points: np.ndarray) -> KzMeansMachine:
            own = dataclasses.replace(config, d=int(points.shape[1]))
            return KzMeansMachine(party, config=own, points=points, index=names.index(party))

        def build(party: str, points: np.ndarray | None) -> Any:
            return make_party(party, points, machines=names, scale=args.normalize == "minmax",
                              coordinator_of=coordinator_of, machine_of=machine_of)

        return build

    def _phases(self, args: argparse.Namespace) -> tuple[str, ...]:
        return (SETUP_PHASE, *MEANS_PHASES) if args.normalize == "minmax" else MEANS_PHASES

    def _iterations(self, config: KzMeansConfig) -> int:
        return 3 if config.mode == "bel" or config.radius_bounds is not None else 4

    def split(self, args: argparse.Namespace, dataset: Dataset) -> dict[str, Dataset]:
        """Each machine's raw part (``machine-0`` ...), as :meth:`plan` cuts the data (see
        :meth:`KzCenterPlugin.split`)."""
        return split_parts(*cut_data(args, dataset))

    def resolved_options(self, args: argparse.Namespace, dataset: Dataset) -> list[str]:
        """``[]``: no option's default depends on the whole data set (n, d and the coreset size
        are learnt inside the protocol, the extent of ``--normalize minmax`` in ``setup.data``)."""
        return []

    def plan(self, args: argparse.Namespace, dataset: Dataset) -> RunPlan:
        raw, parts = cut_data(args, dataset)
        m = len(parts)
        x = normalize(raw.x) if args.normalize == "minmax" else raw.x  # the pooled view, for summaries
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
        base = self._config(args, m)
        config = dataclasses.replace(base, d=d)  # as every machine states it
        names = tuple(machine_name(i) for i in range(m))
        session = session_id(self.name, raw.name, n, d, config, args.partition)
        build = self._builder(args, base, names)
        own = {name: part.x for name, part in split_parts(raw, parts).items()}

        def summarize(results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
            return summarize_means(results[COORDINATOR], config, x, raw.name, parts, compare, args.seed)

        return RunPlan(
            roster=(COORDINATOR, *names),
            session=session,
            make_machine=lambda party: build(party, own.get(party)),
            result_to_json=means_result_to_json,
            summarize=summarize,
            role_of=_role_of,
            iterations=self._iterations(config),
            phases=self._phases(args),
            plot_results=lambda ax, summary: plot_centres(
                ax, x, summary, title="(k,z)-median" if self.power == 1 else "(k,z)-means"
            ),
            analytic={"objective_power": self.power, "score_outlier_budget": config.outlier_budget},
            labels=self._labels(compare),
            max_frame_bytes=means_frame_limit(config, x, scale=args.normalize == "minmax"),
        )

    def plan_party(
        self, args: argparse.Namespace, party: str, roster: tuple[str, ...], session: int, data: Dataset | None
    ) -> RunPlan:
        """The plan of one party holding only ``data`` (``None`` for the coordinator); see
        :meth:`KzCenterPlugin.plan_party`.

        Raises:
            ValueError: the coordinator given data or a machine none, or bad options.
        """
        names = machines_of(roster, args)
        config = self._config(args, len(names))
        build = self._builder(args, config, names)
        points = party_points(party, data)
        return RunPlan(
            roster=tuple(roster),
            session=session,
            make_machine=_own_party_only(party, lambda name: build(name, points)),
            result_to_json=means_result_to_json,
            summarize=lambda results: {},
            role_of=_role_of,
            iterations=self._iterations(config),
            phases=self._phases(args),
            labels=self._labels([]),
        )

    def _labels(self, compare: list[str]) -> dict[str, str]:
        return {
            **LABELS,
            "words_points": "words (paper: coreset points x (d+1))",
            **{f"words_phase_{phase}": f"words: {phase}" for phase in MEANS_PHASES},
            **_baseline_labels(compare, {"cost_z_removed": "cost (z removed)", "words_total": "words"}),
        }


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
    """Trimmed costs of the run (with (1+slack)z and z removed), its words, and the baselines' costs.

    Returns:
        The kzmedian/kzmeans result keys of the module docstring.
    """
    power = config.power
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
    for phase, words in coordinator["words_by_phase"].items():
        summary[f"words_phase_{phase}"] = int(words)
    for method in compare:
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
                summary[f"words_total_{key}"] = int(result.total_words)
            summary[f"cost_z_removed_{key}"] = float(
                solvers.trimmed_cost(_kernels.nearest_centres(x, other)[0], config.z, power)
            )
    summary["centres"] = centres.tolist()
    return summary


KZMEDIAN = KzMeansPlugin(1)
KZMEANS = KzMeansPlugin(2)

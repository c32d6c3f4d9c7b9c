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
built from its own part and the public options only
(:class:`~fedproto.algorithms.kzclustering.parties.KzParties`), in the simulation (``plan`` =
``split`` + that builder + the pooled summaries and baselines) as in a process per party
(``plan_party``, ``fedproto party --data FILE``): equal results and payload bytes by
construction. The summaries, the parties' result JSON and the plot are in
:mod:`fedproto.algorithms.kzclustering.summaries`; the frame, grid and round bounds in
:mod:`fedproto.algorithms.kzclustering.limits`. The coordinator holds no data and learns n, the n_i and d inside the protocol;
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
import os
from typing import Any

import numpy as np

from fedproto.algorithms.kzclustering import solvers
from fedproto.algorithms.kzclustering.baselines import METHODS
from fedproto.algorithms.kzclustering.config import COUNT_TESTS, SEARCHES, KzCenterConfig, check_instance
from fedproto.algorithms.kzclustering.data import synthetic_dataset, with_outliers
from fedproto.algorithms.kzclustering.limits import (
    GRID_CAP,
    center_frame_limit,
    center_rounds_bound,
    grid_size_bound,
    means_frame_limit,
    setup_frame_limit,
)
from fedproto.algorithms.kzclustering.means import KzMeansConfig, KzMeansCoordinator, KzMeansMachine
from fedproto.algorithms.kzclustering.parties import COORDINATOR, KzParties, machine_name
from fedproto.algorithms.kzclustering.protocol import KzCoordinator, KzMachine
from fedproto.algorithms.kzclustering.setup import SETUP_PHASE
from fedproto.algorithms.kzclustering.summaries import (
    CENTRALISED,
    MEANS_BASELINES,
    baseline_labels,
    center_result_to_json,
    means_result_to_json,
    method_key,
    parse_compare,
    plot_centres,
    run_baseline,
    run_means,
    summarize,
)
from fedproto.data import Dataset, normalize, partition, session_id
from fedproto.plugin import RunPlan

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
    "method_key",
    "prepare_data",
    "run_baseline",
    "run_means",
    "setup_frame_limit",
]

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
    simulation and a run of one process per party; :class:`~fedproto.algorithms.kzclustering.parties.KzParties`).

    Args:
        party: the coordinator or a machine.
        points: the machine's raw points ``[n_i, d]`` (``None`` for the coordinator).
        machines: every machine's name, in machine order.
        scale: ``--normalize minmax``: the parties first agree the federation's per-feature
            extent in ``setup.data`` and each machine scales its points by it.
        coordinator_of: ``(d or None) -> coordinator`` (``None``: it learns d from the machines).
        machine_of: ``(party, points) -> machine``.

    Raises:
        ValueError: ``party`` is not a party of this run, data given to the coordinator, or a
            machine without its points.
    """
    parties = KzParties(machines, scale=scale, coordinator_of=coordinator_of,
                        machine_of=lambda index, name, x: machine_of(name, x))
    return parties.make_machine(party, points)


def _own_party_only(party: str, make: Any) -> Any:
    """``make_machine`` of a party's own plan: only that party's machine can be built."""

    def make_machine(name: str) -> Any:
        if name != party:
            raise ValueError(f"this process holds only {party}'s data; it cannot build {name}")
        return make(name)

    return make_machine


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


class _KzPlugin:
    """What the kzcenter and kzmedian/kzmeans plugins do alike: cut the data into the machines'
    raw parts, build every party from its own part only (:class:`KzParties`, behind ``setup.data``
    with ``--normalize minmax``), and plan a simulated run or one party's process.

    Subclasses give ``name``, ``PHASES``, ``result_to_json``, ``_config``, ``_coordinator`` and
    ``_machine``.
    """

    name: str
    PHASES: tuple[str, ...]

    def _coordinator(self, config: Any, names: tuple[str, ...]) -> Any:
        raise NotImplementedError

    def _machine(self, index: int, party: str, config: Any, points: np.ndarray) -> Any:
        raise NotImplementedError

    def _parties(self, args: argparse.Namespace, config: Any, names: tuple[str, ...]) -> KzParties:
        """Every party built from its own data only: the coordinator learns d (its configuration
        says ``None``), a machine states its points' d."""
        return KzParties(
            names,
            scale=args.normalize == "minmax",
            coordinator_of=lambda d: self._coordinator(dataclasses.replace(config, d=d), names),
            machine_of=lambda index, party, points: self._machine(
                index, party, dataclasses.replace(config, d=int(points.shape[1])), points
            ),
        )

    def _phases(self, args: argparse.Namespace) -> tuple[str, ...]:
        return (SETUP_PHASE, *self.PHASES) if args.normalize == "minmax" else self.PHASES

    def split(self, args: argparse.Namespace, dataset: Dataset) -> dict[str, Dataset]:
        """Each machine's raw part (``machine-0`` ...), as :meth:`plan` cuts the data: the data
        set or the synthetic mixture with the injected outliers, never scaled (``--normalize``
        happens inside the run, from the extent the machines agree in ``setup.data``)."""
        return split_parts(*cut_data(args, dataset))

    def _pooled(self, args: argparse.Namespace, dataset: Dataset) -> tuple[Dataset, list[np.ndarray], np.ndarray]:
        """The raw data, the machines' parts and the pooled view the summaries use (scaled as
        the machines scale it).

        Raises:
            ValueError: bad sizes or options, or not a (k,z) instance (`config.check_instance`).
        """
        raw, parts = cut_data(args, dataset)
        x = normalize(raw.x) if args.normalize == "minmax" else raw.x
        check_instance(x.shape[0], args.k, args.z if args.z is not None else args.inject_outliers)
        return raw, parts, x

    def _simulation(self, args: argparse.Namespace, raw: Dataset, parts: list[np.ndarray], x: np.ndarray,
                    base: Any, compare: list[str], **plan: Any) -> RunPlan:
        """The plan of the whole run in one process: every machine holds its raw part, and the
        summary is computed on the pooled view ``x`` with the baselines ``compare``.

        Args:
            base: the shared parameters with ``d = None`` (each party fills in its own).
            plan: the rest of the :class:`RunPlan` (session, iterations, ...).
        """
        parties = self._parties(args, base, tuple(machine_name(i) for i in range(len(parts))))
        own = {name: part.x for name, part in split_parts(raw, parts).items()}
        config = dataclasses.replace(base, d=x.shape[1])  # as every machine states it
        return RunPlan(
            roster=parties.roster,
            make_machine=parties.machine_factory(own),
            result_to_json=self.result_to_json,
            summarize=lambda results: summarize(results[COORDINATOR], config, x, raw.name, parts, compare, args.seed),
            role_of=parties.role_of,
            phases=self._phases(args),
            labels=self._labels(compare),
            **plan,
        )

    def _party_plan(self, args: argparse.Namespace, party: str, roster: tuple[str, ...], session: int,
                    data: Dataset | None, config: Any, iterations: int) -> RunPlan:
        """The plan of one party holding only ``data`` (``None`` for the coordinator).

        Raises:
            ValueError: the coordinator given data or a machine none.
        """
        parties = self._parties(args, config, machines_of(roster, args))
        points = party_points(party, data)
        return RunPlan(
            roster=tuple(roster),
            session=session,
            make_machine=_own_party_only(party, lambda name: parties.make_machine(name, points)),
            result_to_json=self.result_to_json,
            summarize=lambda results: {},
            role_of=parties.role_of,
            iterations=iterations,
            phases=self._phases(args),
            labels=self._labels([]),
        )

    def _labels(self, compare: list[str]) -> dict[str, str]:
        raise NotImplementedError


class KzCenterPlugin(_KzPlugin):
    """Guo & Li's distributed (k,z)-center as a ``fedproto`` protocol plugin."""

    name = "kzcenter"
    description = "distributed (k,z)-center with (1+slack)z outliers (Guo & Li, NeurIPS 2018)"
    PHASES = CENTER_PHASES
    result_to_json = staticmethod(center_result_to_json)

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

    def _coordinator(self, config: KzCenterConfig, names: tuple[str, ...]) -> KzCoordinator:
        return KzCoordinator(COORDINATOR, config=config, machines=names)

    def _machine(self, index: int, party: str, config: KzCenterConfig, points: np.ndarray) -> KzMachine:
        return KzMachine(party, config=config, points=points, workers=min(2, os.cpu_count() or 1))

    def resolved_options(self, args: argparse.Namespace, dataset: Dataset) -> list[str]:
        """``["--sub-machines", T]`` when ``--sub-machines auto`` (T follows from the largest
        machine, which a party holding only its own data cannot know); else ``[]``."""
        if args.sub_machines != "auto":
            return []
        _, parts = cut_data(args, dataset)
        return ["--sub-machines", str(solvers.sub_machine_count(max((len(p) for p in parts), default=0)))]

    def plan(self, args: argparse.Namespace, dataset: Dataset) -> RunPlan:
        raw, parts, x = self._pooled(args, dataset)
        n, d = x.shape
        compare = parse_compare(args.compare, CENTRALISED + METHODS)
        largest = max((len(p) for p in parts), default=0)
        t = solvers.sub_machine_count(largest) if args.sub_machines == "auto" else args.sub_machines
        base = self._config(args, len(parts), t)
        config = dataclasses.replace(base, d=d)  # as every machine states it
        return self._simulation(
            args, raw, parts, x, base, compare,
            session=session_id("kzcenter", raw.name, n, d, config, args.seed, args.partition),
            iterations=center_rounds_bound(
                config, grid_size_bound(x, config.eps, objective="center", radius_bounds=config.radius_bounds)
            ),
            plot_results=lambda ax, summary: plot_centres(ax, x, summary),
            analytic={
                "max_representatives_per_guess": config.count_bound,
                "round3_words_bound_per_guess": config.count_bound * (d + 1),
                "count_threshold": config.threshold,
            },
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
        return self._party_plan(args, party, roster, session, data, config, center_rounds_bound(config, GRID_CAP + 1))

    def _labels(self, compare: list[str]) -> dict[str, str]:
        return {
            **LABELS,
            "words_points": "words (paper: Round-3 points x d)",
            **{f"words_phase_{phase}": f"words: {phase}" for phase in CENTER_PHASES},
            **baseline_labels(compare, {"radius_z_removed": "radius (z removed)",
                                        "words_total": "words (all messages)",
                                        "words_points": "words (paper: points x d)"}),
        }


KZCENTER = KzCenterPlugin()

MEANS_PHASES = ("extent", "grid", "costs", "totals", "coresets", "centres", "outliers")


class KzMeansPlugin(_KzPlugin):
    """Guo & Li's distributed (k,z)-median or (k,z)-means (Appendix C) as a ``fedproto`` plugin.

    Args:
        power: 1 (median) or 2 (means).
    """

    PHASES = MEANS_PHASES
    result_to_json = staticmethod(means_result_to_json)

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

    def _coordinator(self, config: KzMeansConfig, names: tuple[str, ...]) -> KzMeansCoordinator:
        return KzMeansCoordinator(COORDINATOR, config=config, machines=names)

    def _machine(self, index: int, party: str, config: KzMeansConfig, points: np.ndarray) -> KzMeansMachine:
        return KzMeansMachine(party, config=config, points=points, index=index)

    def _iterations(self, config: KzMeansConfig) -> int:
        return 3 if config.mode == "bel" or config.radius_bounds is not None else 4

    def resolved_options(self, args: argparse.Namespace, dataset: Dataset) -> list[str]:
        """``[]``: no option's default depends on the whole data set (n, d and the coreset size
        are learnt inside the protocol, the extent of ``--normalize minmax`` in ``setup.data``)."""
        return []

    def plan(self, args: argparse.Namespace, dataset: Dataset) -> RunPlan:
        raw, parts, x = self._pooled(args, dataset)
        n, d = x.shape
        compare = parse_compare(args.compare, MEANS_BASELINES)
        base = self._config(args, len(parts))
        config = dataclasses.replace(base, d=d)  # as every machine states it
        return self._simulation(
            args, raw, parts, x, base, compare,
            session=session_id(self.name, raw.name, n, d, config, args.partition),
            iterations=self._iterations(config),
            plot_results=lambda ax, summary: plot_centres(
                ax, x, summary, title="(k,z)-median" if self.power == 1 else "(k,z)-means"
            ),
            analytic={"objective_power": self.power, "score_outlier_budget": config.outlier_budget},
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
        config = self._config(args, len(machines_of(roster, args)))
        return self._party_plan(args, party, roster, session, data, config, self._iterations(config))

    def _labels(self, compare: list[str]) -> dict[str, str]:
        return {
            **LABELS,
            "words_points": "words (paper: coreset points x (d+1))",
            **{f"words_phase_{phase}": f"words: {phase}" for phase in MEANS_PHASES},
            **baseline_labels(compare, {"cost_z_removed": "cost (z removed)", "words_total": "words"}),
        }


KZMEDIAN = KzMeansPlugin(1)
KZMEANS = KzMeansPlugin(2)

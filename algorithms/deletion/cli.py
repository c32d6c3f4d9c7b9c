"""The ``qkmeans`` and ``dckmeans`` plugins of the ``fedproto`` command line.

``fedproto run dckmeans --data celltype --removals 1000 --seed 0`` builds the
DC tree as parties (the root coordinates the stream, leaves hold the data), runs training and the
deletion stream over the chosen transport, and prints the run report (bytes per round show the
zero bytes of parties off each deletion's path) with a summary: whether the final model equals
training from scratch on the remaining data with the same key, loss / silhouette / NMI beside
plain k-means++, and the amortised time per deletion against retraining, from a timed centralised
replay of the same stream (the plot's third panel is the cumulative time over the stream).

``fedproto run qkmeans ...`` runs Q-k-means as a server (the data curator, which holds the
pooled points: Q-k-means is a centralised algorithm) and ``--clients`` clients that own the points
and send the removal requests; the model goes to every client after each deletion. With
``--federated`` the points stay at the clients: a coordinator runs keyed k-means++ (two exchanges
per seed) and one round per Lloyd iteration on the clients' statistics, and decides each deletion
exactly (`fedproto.algorithms.deletion.federated`); the summary checks that the result equals the
centralised Q-k-means on the same stream.

``fedproto run dckmeans --weighted ...`` runs the weighted variant: nodes also send their cluster
masses, internal nodes cluster mass-weighted.

Each data-holding party (a client, a leaf) may hold only its own file: ``split`` gives each its
raw rows (``fedproto split``), ``plan_party`` builds one party from its own file and the public
options (``fedproto party --data FILE``; ``--removals`` required, ``--k`` from the file), and
``resolved_options`` spells out ``--k``, ``--removals`` (and ``--width``) for the TCP launcher's
parties. Every run opens with the setup phase ``setup.data``
(`fedproto.algorithms.deletion.local_data`: counts, dimension and feature extents up, n, each
party's first id and the federation's extent down); ``plan`` is ``split`` plus the same builders
plus the baselines on the pooled data, so the two give equal results and payload bytes.

Both plugins generate the paper's synthetic Gaussian set by name: ``--data gaussian`` (5 x 20,000
points in 25 dimensions) or ``--data gaussian-small`` (5 x 2,000), drawn with ``--seed``.

Data are min-max scaled to ``[0, 1]^d`` (``--normalize minmax``, the default and the paper's
preprocessing; a bare ``--normalize`` means the same; Celltype is already scaled, so it is
unchanged); ``--normalize none`` keeps the values. The points' ids are ``0 .. n-1`` party by
party in roster order; the deletion stream is ``--removals`` of them drawn uniformly without
replacement with ``--seed + 1`` (default: min(1000, n/10)); the model key is ``PRNGKey(--seed)``. Q-k-means takes ``--lattice-step`` (the paper's epsilon, the granularity of
its lattice) and ``--balance`` (the paper's gamma); ``--retrains`` k-means retrainings are timed
for the baseline.

The summary (the report's ``results``; both plugins build it in
`fedproto.algorithms.deletion.summary`) has snake_case keys with units in their names
(``loss_ratio``, ``removal_ms_mean``, ``amortised_ms``, ``retrain_ms``, ``speedup_over_retrain``,
...; the plan's ``labels`` give readable labels); the paper's Tables 1-4 figures for the data set
go under ``paper`` (:func:`paper_figures`). The checks, baselines and timed replays after the
protocol report their progress through :func:`fedproto.progress.progress_task`.

Old option spellings stay accepted, hidden from ``--help``: ``--deletions`` (``--removals``),
``--scale`` (``--normalize``), ``--baseline-retrains`` (``--retrains``), and for qkmeans ``--eps``
(``--lattice-step``) and ``--gamma`` (``--balance``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedproto.algorithms.deletion import streams
from fedproto.algorithms.deletion.dckmeans import DCKMeans, DCKMeansConfig, Tree, assign_leaves
from fedproto.algorithms.deletion.local_data import (
    SETUP_PHASE,
    StreamTerms,
    pooled_order,
    scale_points,
    setup_payload_bytes,
)
from fedproto.algorithms.deletion.protocol import (
    SERVER,
    DCNodeResult,
    DCRootResult,
    LocalDCTree,
    LocalQKMeansParties,
    QKMeansClientResult,
    QKMeansServerResult,
    tree_party,
)
from fedproto.algorithms.deletion.messages import (
    ClusterStatistics,
    DataAgreement,
    DataSummary,
    IterationCentroids,
    ModelUpdate,
    NodeCentroids,
    PointRemoval,
    PointUpload,
    RemovalRequest,
    SeedPick,
    SeedPoint,
    SeedScore,
    SeedStep,
    WeightedNodeCentroids,
)
from fedproto.algorithms.deletion.federated import (
    COORDINATOR,
    FederatedPartyResult,
    FederatedQKMeansResult,
    training_payload_bytes,
)
from fedproto.algorithms.deletion.qkmeans import QKMeans, QKMeansConfig, default_epsilon, train_qkmeans
from fedproto.algorithms.deletion.summary import (
    HEADLINE,
    paper_figures,
    plot_cumulative,
    remaining,
    stream_summary,
    summary_labels,
    timed_rows,
)
from fedproto.data import Dataset, find_data_file, partition, session_id
from fedproto.framesize import max_frame_bytes
from fedproto.plugin import RunPlan
from fedproto.progress import progress_task

__all__ = [
    "DCKMEANS",
    "HEADLINE",
    "QKMEANS",
    "DCKMeansPlugin",
    "QKMeansPlugin",
    "dckmeans_frame_limit",
    "paper_figures",
    "qkmeans_frame_limit",
    "summary_labels",
]

def prepare(dataset: Dataset, scale: str) -> np.ndarray:
    """The points the algorithms see: min-max scaled to ``[0, 1]^d`` (``"minmax"``) or unchanged
    (``"none"``) (`local_data.scale_points` with the data set's own extent).

    Raises:
        ValueError: another ``scale``.
    """
    return scale_points(dataset.x, scale)


def _setup_frame_limit(d: int) -> int:
    """The largest frame of the setup phase ``setup.data``: a summary or an agreement, each with
    two ``float64 [d]`` arrays."""
    extent = {"lo": (d,), "hi": (d,)}
    return max(max_frame_bytes(DataSummary, arrays=extent), max_frame_bytes(DataAgreement, arrays=extent))


def qkmeans_frame_limit(k: int, d: int, largest_client: int, *, federated: bool) -> int:
    """The largest frame any party of a Q-k-means run sends (bytes, envelope included).

    Curated: a client uploads its ``n_c`` points (``int64 [n_c]`` ids and ``float64 [n_c, d]``;
    ``largest_client`` is the largest ``n_c``) and the server sends ``[k, d]`` models. Federated:
    seeding exchanges one centre or point ``[d]`` and scalars, a Lloyd round the ``[k, d]``
    centroids and the ``[k, d]`` sums with ``[k]`` counts, a deletion the point ``[d]``.
    """
    model = {"centroids": (k, d)}
    bounds = [max_frame_bytes(ModelUpdate, arrays=model), max_frame_bytes(RemovalRequest), _setup_frame_limit(d)]
    if federated:
        bounds += [
            max_frame_bytes(SeedStep, arrays={"centre": (1, d)}),
            max_frame_bytes(SeedScore),
            max_frame_bytes(SeedPick),
            max_frame_bytes(SeedPoint, arrays={"point": (d,)}),
            max_frame_bytes(IterationCentroids, arrays=model),
            max_frame_bytes(ClusterStatistics, arrays={"sums": (k, d), "counts": (k,)}),
            max_frame_bytes(PointRemoval, arrays={"point": (d,)}),
        ]
    else:
        bounds.append(max_frame_bytes(PointUpload, arrays={"ids": (largest_client,), "points": (largest_client, d)}))
    return max(bounds)


def dckmeans_frame_limit(k: int, d: int, *, weighted: bool) -> int:
    """The largest frame any party of a DC-k-means run sends (bytes, envelope included): a node's
    at most ``k`` centroids ``float64 [k, d]`` (with their masses ``[k]`` when weighted), the
    root's requests and its ``[k, d]`` model."""
    bounds = [
        max_frame_bytes(NodeCentroids, arrays={"centroids": (k, d)}),
        max_frame_bytes(RemovalRequest),
        max_frame_bytes(ModelUpdate, arrays={"centroids": (k, d)}),
        _setup_frame_limit(d),
    ]
    if weighted:
        bounds.append(max_frame_bytes(WeightedNodeCentroids, arrays={"centroids": (k, d), "counts": (k,)}))
    return max(bounds)


def file_partition(path: str, x: np.ndarray) -> np.ndarray:
    """The leaf of each row of ``x`` from an ``.npz`` with ``client_X`` and ``client_sizes`` (the
    data each client already holds, e.g. Celltype's 100 clients).

    Raises:
        ValueError: the file has no client split, or its rows are not a permutation of ``x``.
    """
    try:
        with np.load(path, allow_pickle=False) as archive:
            client_x, sizes = archive["client_X"], archive["client_sizes"]
    except (OSError, KeyError, ValueError) as exc:
        raise ValueError(f"--leaves file needs an .npz with client_X and client_sizes: {exc}") from None
    if client_x.shape != x.shape or int(np.sum(sizes)) != x.shape[0]:
        raise ValueError("client_X does not hold the same points as X")
    row_of = {row.tobytes(): r for r, row in enumerate(np.ascontiguousarray(x, dtype=np.float64))}
    leaves = np.full(x.shape[0], -1, dtype=np.int64)
    owners = np.repeat(np.arange(len(sizes)), sizes)
    for row, owner in zip(np.ascontiguousarray(client_x, dtype=np.float64), owners):
        r = row_of.get(row.tobytes())
        if r is None or leaves[r] != -1:
            raise ValueError("client_X is not a permutation of X's rows")
        leaves[r] = owner
    return leaves


def _common_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--k", type=int, default=None, help="clusters (default: the paper's k for the data set)")
    group.add_argument("--removals", type=int, default=None,
                       help="deletion requests (default min(1000, n/10))")
    group.add_argument("--deletions", dest="removals", type=int, help=argparse.SUPPRESS)
    group.add_argument("--iterations", type=int, default=10, help="Lloyd iterations T (default 10)")
    group.add_argument("--normalize", choices=("minmax", "none"), nargs="?", const="minmax", default="minmax",
                       help="preprocessing: min-max scaling into [0, 1]^d (default; also a bare --normalize) or none")
    group.add_argument("--scale", dest="normalize", choices=("minmax", "none"), help=argparse.SUPPRESS)
    group.add_argument("--no-timing", action="store_true", help="skip the timed centralised replay of the stream")
    group.add_argument("--retrains", type=int, default=3, help="retrains timed for the k-means baseline (default 3)")
    group.add_argument("--baseline-retrains", dest="retrains", type=int, help=argparse.SUPPRESS)


def _check_common(args: argparse.Namespace) -> None:
    if args.iterations < 1:
        raise ValueError("--iterations must be at least 1")
    if args.retrains < 1:
        raise ValueError("--retrains must be at least 1")
    if args.removals is not None and args.removals < 0:
        raise ValueError("--removals must be non-negative")
    if args.k is not None and args.k < 1:
        raise ValueError("--k must be at least 1")


def _whole_terms(args: argparse.Namespace, dataset: Dataset) -> tuple[int, int]:
    """``(k, removals)`` of a run on the whole ``dataset``, checked against its n.

    Raises:
        ValueError: bad options, k above n, or a stream that would leave fewer than k points.
    """
    _check_common(args)
    k = args.k if args.k is not None else (dataset.paper_k or 3)
    if k < 1:
        raise ValueError("--k must be at least 1")
    n = dataset.n
    if k > n:
        raise ValueError(f"k = {k} is larger than the number of points ({n})")
    m = args.removals if args.removals is not None else min(1000, n // 10)
    if n - m < k:
        raise ValueError(f"--removals {m} would leave {n - m} points, fewer than k = {k}")
    return k, m


def _party_terms(args: argparse.Namespace, party: str, data: Dataset | None, holds_data: bool) -> tuple[int, int]:
    """``(k, removals)`` of a party that holds only ``data`` (``None``: no data).

    ``--k`` defaults to the paper's k its file records; ``--removals`` (whose default depends on
    the whole federation's n) must be given.

    Raises:
        ValueError: bad options, a missing ``--k`` or ``--removals``, data for a party that holds
            none, or none for a party that holds some.
    """
    _check_common(args)
    if holds_data and data is None:
        raise ValueError(f"{party} holds data: give it its own file with --data")
    if not holds_data and data is not None:
        raise ValueError(f"{party} holds no data in this protocol: start it without --data")
    k = args.k if args.k is not None else (data.paper_k if data is not None else None)
    if k is None:
        raise ValueError("--k is required when a party holds only its own data (and its file records no k)")
    if args.removals is None:
        raise ValueError("--removals is required when a party holds only its own data (its default depends on "
                         "the whole federation's n)")
    return k, args.removals


def _part(dataset: Dataset, rows: np.ndarray) -> Dataset:
    """The raw rows ``rows`` of ``dataset`` (labels too), as one party's data set."""
    y = dataset.y[rows] if dataset.y is not None else None
    return Dataset(dataset.name, np.asarray(dataset.x, dtype=np.float64)[rows], y, dataset.paper_k)


def _pooled(parts: list[Dataset], scale: str) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """The simulation's view of the whole federation, for its checks and baselines: the parts'
    points pooled in the order of the ids the setup phase gives (`local_data.pooled_order`) and
    scaled as the parties scale them, their labels (``None`` if a part has none) and their ids."""
    raw, ids = pooled_order([p.x for p in parts])
    y = None if any(p.y is None for p in parts) else np.concatenate([np.asarray(p.y) for p in parts])
    return scale_points(raw, scale), y, ids


def _q_result_to_json(party: str, result: Any) -> dict[str, Any]:
    if isinstance(result, QKMeansServerResult | FederatedQKMeansResult):
        out = {"centroids": result.centroids.tolist(), "reasons": list(result.reasons),
               "certified": result.certified, "retrained": result.retrained}
        if isinstance(result, FederatedQKMeansResult):
            out["trainings"] = result.trainings
            out["iterations_executed"] = result.model.executed
        return out
    if isinstance(result, QKMeansClientResult | FederatedPartyResult):
        return {"centroids": result.centroids.tolist(), "version": result.version}
    raise TypeError(f"unexpected result of {party}: {type(result).__name__}")


def _dc_result_to_json(party: str, result: Any) -> dict[str, Any]:
    if isinstance(result, DCRootResult):
        return {"centroids": result.centroids.tolist(), "version": result.version,
                "deletions": list(result.deletions)}
    if isinstance(result, DCNodeResult):
        return {"node": result.node, "version": result.version, "points": result.points,
                "removed": list(result.removed)}
    raise TypeError(f"unexpected result of {party}: {type(result).__name__}")


def _no_summary(results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    return {}


def _setup_analytic(n_parties: int, d: int, scale: str) -> dict[str, int]:
    return {"analytic setup bytes (P·32d with min-max scaling, 0 with --normalize none; plus framing)":
            setup_payload_bytes(n_parties, d, scale)}


class _DeletionPlugin:
    """What the ``qkmeans`` and ``dckmeans`` plugins share: the generated data sets, the common
    options, and the :class:`~fedproto.plugin.RunPlan` of a run (subclasses give
    :meth:`_variant` and their own options in :meth:`_add_variant_arguments`)."""

    name = ""
    generated_datasets = streams.GENERATED_DATASETS

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(self.name)
        _common_arguments(group)
        self._add_variant_arguments(group)

    def _add_variant_arguments(self, group: argparse._ArgumentGroup) -> None:
        raise NotImplementedError

    def _variant(self, parties: Any, d: int | None, largest_client: int) -> tuple[str, dict[str, Any]]:
        """The method's name and its :class:`~fedproto.plugin.RunPlan` terms (``result_to_json``,
        ``iterations``, ``phases``, ``max_frame_bytes``; no frame limit when ``d`` is ``None``)."""
        raise NotImplementedError

    def _run_plan(self, parties: Any, *, d: int | None, largest_client: int = 0, **run: Any) -> RunPlan:
        """The plan of ``parties`` (a Q-k-means star or a DC-k-means tree); ``run``: ``session``,
        ``make_machine``, ``summarize`` and ``analytic``."""
        method, variant = self._variant(parties, d, largest_client)
        return RunPlan(roster=parties.roster, role_of=parties.role_of, plot_results=plot_cumulative,
                       labels=summary_labels(method), **variant, **run)


def _held(parts: Mapping[str, Dataset]) -> dict[str, np.ndarray]:
    """``{party: its raw rows [n_i, d]}`` of the data-holding parties."""
    return {party: part.x for party, part in parts.items()}


class QKMeansPlugin(_DeletionPlugin):
    """Q-k-means with deletion requests as a ``fedproto`` protocol plugin (curated or federated).

    Each client may hold only its own data (:meth:`split`, :meth:`plan_party`): the setup phase
    ``setup.data`` (`local_data`) agrees n, the ids and the scaling, and each client draws its
    own deletion requests from ``--removals`` and ``--seed``.
    """

    name = "qkmeans"
    description = "Q-k-means (quantised Lloyd's) with exact deletion: clients request deletions of their points"

    def _add_variant_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--lattice-step", type=float, default=None,
                           help="lattice granularity, the paper's epsilon (default: the paper's rule for n, k, d)")
        group.add_argument("--eps", dest="lattice_step", type=float, help=argparse.SUPPRESS)
        group.add_argument("--balance", type=float, default=0.2,
                           help="balance parameter in [0, 1), the paper's gamma (default 0.2)")
        group.add_argument("--gamma", dest="balance", type=float, help=argparse.SUPPRESS)
        group.add_argument(
            "--federated",
            action="store_true",
            help="keep the points at the clients: a coordinator runs keyed k-means++ and one round per Lloyd "
            "iteration on their statistics (spec 2.3); default: the server curates the uploaded points",
        )

    @staticmethod
    def _config(args: argparse.Namespace, k: int) -> QKMeansConfig:
        if args.lattice_step is not None and not (math.isfinite(args.lattice_step) and args.lattice_step > 0):
            raise ValueError(f"--lattice-step must be positive, got {args.lattice_step}")
        if not 0 <= args.balance < 1:
            raise ValueError(f"--balance must lie in [0, 1), got {args.balance}")
        return QKMeansConfig(k=k, iterations=args.iterations, gamma=args.balance, eps=args.lattice_step)

    @staticmethod
    def _parties(args: argparse.Namespace, n_clients: int, config: QKMeansConfig, m: int) -> LocalQKMeansParties:
        return LocalQKMeansParties(n_clients, config, key=jax.random.PRNGKey(args.seed),
                                   stream=StreamTerms(m, args.seed + 1), scale=args.normalize,
                                   federated=bool(getattr(args, "federated", False)))

    def split(self, args: argparse.Namespace, dataset: Dataset) -> dict[str, Dataset]:
        """Each client's raw points (``client-<i>``, in roster order): the ``--clients`` /
        ``--partition`` / ``--seed`` split of ``fedproto run``.

        Raises:
            ValueError: fewer than one client, or a split the data does not allow.
        """
        if args.clients < 1:
            raise ValueError("--clients must be at least 1")
        parts = partition(dataset.n, args.clients, scheme=args.partition, seed=args.seed, labels=dataset.y)
        return {f"client-{i}": _part(dataset, rows) for i, rows in enumerate(parts)}

    def resolved_options(self, args: argparse.Namespace, dataset: Dataset) -> list[str]:
        """``--k`` and ``--removals`` as the whole data set resolves them (their defaults depend on
        it), for parties that hold only their own files."""
        k, m = _whole_terms(args, dataset)
        return ["--k", str(k), "--removals", str(m)]

    def _variant(
        self, parties: LocalQKMeansParties, d: int | None, largest_client: int
    ) -> tuple[str, dict[str, Any]]:
        config, m, federated = parties.config, parties.stream.removals, parties.federated
        if federated:
            phases: tuple[str, ...] = (SETUP_PHASE, "seed", "seed-point", "lloyd", "model", "request")
            iterations = config.k + config.iterations + 1 + m
        else:
            phases = (SETUP_PHASE, "upload", "request", "model")
            iterations = m + 1
        frame = None if d is None else qkmeans_frame_limit(config.k, d, largest_client, federated=federated)
        method = "Q-k-means (federated)" if federated else "Q-k-means"
        return method, {"result_to_json": _q_result_to_json, "iterations": iterations, "phases": phases,
                        "max_frame_bytes": frame}

    def plan(self, args: argparse.Namespace, dataset: Dataset) -> RunPlan:
        k, m = _whole_terms(args, dataset)
        config = self._config(args, k)
        parts = self.split(args, dataset)
        parties = self._parties(args, len(parts), config, m)
        key = jax.random.PRNGKey(args.seed)
        x, y, ids = _pooled(list(parts.values()), args.normalize)
        n, d = x.shape
        stream = parties.stream.stream(n)
        federated = parties.federated
        session = session_id("qkmeans", dataset.name, n, d, k, args.clients, args.seed, m, args.lattice_step,
                             *(("federated",) if federated else ()))
        method, _ = self._variant(parties, None, 0)

        def summarize(results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
            head_result = results[parties.hub]
            centroids = np.asarray(head_result["centroids"])
            keep = remaining(n, stream)
            with progress_task("Q-k-means retrained on the remaining data (exactness check)"):
                fresh = train_qkmeans(x[keep], ids[keep], config, key).centroids
            variant: dict[str, Any] = {
                "n_clients": args.clients,
                "lattice_step": config.resolve_eps(int(keep.sum()), d), "balance": config.gamma,
                "iterations": config.iterations, "n_certified_removals": head_result["certified"],
                "n_retrained_removals": head_result["retrained"],
                "model_equals_retrain": bool(np.array_equal(centroids, fresh)),
                "clients_agree": all(
                    np.array_equal(np.asarray(results[c]["centroids"]), centroids)
                    for c in parties.clients
                    if c in results
                ),
            }
            if federated:
                with progress_task("centralised Q-k-means on the stream", total=m) as advance:
                    central = QKMeans(config, key=key).fit(x, ids)
                    reasons = []
                    for i in stream:
                        reasons.append(central.delete(i).reason)
                        advance()
                variant["n_trainings"] = head_result["trainings"]
                variant["federated_equals_centralised"] = bool(
                    np.array_equal(centroids, central.centroids) and reasons == list(head_result["reasons"])
                )
            timed = None if args.no_timing or not stream else lambda: timed_rows(
                "q", x, ids, stream, k, key, args.retrains, iterations=config.iterations, q_config=config)
            return stream_summary(variant, data_set=dataset.name, method=method, x=x, y=y, stream=stream,
                                   centroids=centroids, key=key, k=k, timed=timed)

        clients = len(parts)
        analytic: dict[str, Any] = {
            "default lattice step for n (2^round(-log10(n/(k d^1.5)) - 3))": default_epsilon(n, k, d),
            **_setup_analytic(clients, d, args.normalize),
        }
        if federated:
            payload = training_payload_bytes(clients, k, d, 0)
            analytic.update({
                "analytic seeding bytes per training (P·8d·(k-1) + 8d·k, plus framing)": payload["seeding"],
                "analytic bytes per Lloyd round (P·8·(2kd + k), plus framing)": payload["lloyd per round"],
                "analytic bytes per certified deletion (8d + P·8kd, plus framing)": 8 * d + payload["model"],
            })
        else:
            analytic["analytic model bytes per deletion (M·k·d·8, plus framing)"] = clients * k * d * 8
        return self._run_plan(parties, session=session, make_machine=parties.machine_factory(_held(parts)),
                              summarize=summarize, d=d, largest_client=max(p.n for p in parts.values()),
                              analytic=analytic)

    def plan_party(
        self, args: argparse.Namespace, party: str, roster: tuple[str, ...], session: int, data: Dataset | None
    ) -> RunPlan:
        """The plan of ``party`` holding only ``data`` (``None``: the server or coordinator).

        ``--k`` defaults to the k the file records; ``--removals`` must be given. The roster's
        first party is the ``server`` (curated) or the ``coordinator`` (``--federated``).

        Raises:
            ValueError: a roster of another shape or variant, bad options, or data where none is
                held (or none where some is).
        """
        federated = bool(getattr(args, "federated", False))
        head = COORDINATOR if federated else SERVER
        clients = tuple(f"client-{i}" for i in range(len(roster) - 1))
        if tuple(roster) != (head, *clients):
            other = SERVER if federated else COORDINATOR
            hint = f" (a roster led by {other!r} is a {'curated' if federated else '--federated'} run)" \
                if roster and roster[0] == other else ""
            raise ValueError(f"the roster ({', '.join(roster)}) is not {head} and client-0 ... of a "
                             f"{'federated ' if federated else ''}Q-k-means run{hint}")
        k, m = _party_terms(args, party, data, party != head)
        parties = self._parties(args, len(clients), self._config(args, k), m)
        return self._run_plan(parties, session=session, make_machine=parties.machine_factory(_own(party, data)),
                              summarize=_no_summary, d=data.d if data is not None else None,
                              largest_client=data.n if data is not None else 0, analytic={})


def _own(party: str, data: Dataset | None) -> dict[str, np.ndarray]:
    """``{party: its raw rows}`` of a party process holding ``data`` (empty: it holds none)."""
    return {} if data is None else {party: data.x}


class DCKMeansPlugin(_DeletionPlugin):
    """DC-k-means as a tree of parties, with deletion requests, as a ``fedproto`` plugin.

    Each leaf may hold only its own data (:meth:`split`, :meth:`plan_party`): the setup phase
    ``setup.data`` (`local_data`) gives the root n, the id table and the deletion stream, and the
    leaves their ids and scaling.
    """

    name = "dckmeans"
    description = "DC-k-means as a tree of parties: a deletion recomputes only its leaf-to-root path"

    def _add_variant_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--width", type=int, default=None, help="branching factor w (default 2^round(log2 n^0.3))")
        group.add_argument("--height", type=int, default=1, help="tree height h (default 1)")
        group.add_argument(
            "--leaves",
            choices=("random", "partition", "file"),
            default="random",
            help="random: keyed uniform leaf per point (paper); partition: the --clients/--partition split; "
            "file: the client split stored in the .npz (client_X, client_sizes)",
        )
        group.add_argument(
            "--weighted",
            action="store_true",
            help="nodes also send their cluster masses (k·8 bytes more per message) and internal nodes cluster "
            "mass-weighted (spec 2.3's optional variant; default: the paper's unweighted merge)",
        )

    @staticmethod
    def _leaf_of(args: argparse.Namespace, dataset: Dataset, k: int) -> tuple[np.ndarray, int]:
        """The leaf of each point of ``dataset`` and the tree's width (``--leaves``)."""
        n = dataset.n
        if args.height < 1:
            raise ValueError("--height must be at least 1")
        if args.width is not None and args.width < 1:
            raise ValueError("--width must be at least 1")
        if args.leaves == "partition":
            if args.height != 1:
                raise ValueError("--leaves partition needs --height 1")
            parts = partition(n, args.clients, scheme=args.partition, seed=args.seed, labels=dataset.y)
            leaf_of = np.empty(n, dtype=np.int64)
            for j, rows in enumerate(parts):
                leaf_of[rows] = j
            return leaf_of, args.clients
        if args.leaves == "file":
            if args.height != 1:
                raise ValueError("--leaves file needs --height 1")
            path = Path(args.data) if Path(args.data).is_file() else find_data_file(args.data)  # celltype by name
            if path is None or path.suffix != ".npz":
                raise ValueError("--leaves file needs an .npz data file with client_X and client_sizes")
            leaf_of = file_partition(str(path), dataset.x)  # matched on the raw values
            return leaf_of, int(leaf_of.max()) + 1
        if args.width is None and args.height != 1:
            raise ValueError("--height above 1 needs --width")
        width = DCKMeansConfig(k=k, width=args.width, height=args.height).resolve_width(n)
        return assign_leaves(jax.random.PRNGKey(args.seed), np.arange(n, dtype=np.int64), width**args.height), width

    def _split(self, args: argparse.Namespace, dataset: Dataset, k: int) -> tuple[dict[str, Dataset], int]:
        leaf_of, width = self._leaf_of(args, dataset, k)
        tree = Tree(width, args.height)
        first = tree.offset(args.height)
        return {
            tree_party(tree, first + j): _part(dataset, np.flatnonzero(leaf_of == j)) for j in range(tree.n_leaves)
        }, width

    def split(self, args: argparse.Namespace, dataset: Dataset) -> dict[str, Dataset]:
        """Each leaf's raw points (``leaf-<j>``, in roster order): the ``--leaves`` assignment of
        ``fedproto run`` (keyed by the points' rows in the data set, ``--seed``; or the
        ``--clients`` / ``--partition`` split; or the file's client split).

        Raises:
            ValueError: options the data do not allow.
        """
        k, _ = _whole_terms(args, dataset)
        return self._split(args, dataset, k)[0]

    def resolved_options(self, args: argparse.Namespace, dataset: Dataset) -> list[str]:
        """``--k``, ``--removals`` and ``--width`` as the whole data set resolves them (their
        defaults depend on it), for parties that hold only their own files."""
        k, m = _whole_terms(args, dataset)
        _, width = self._leaf_of(args, dataset, k)
        return ["--k", str(k), "--removals", str(m), "--width", str(width)]

    @staticmethod
    def _tree(args: argparse.Namespace, k: int, m: int, width: int) -> LocalDCTree:
        config = DCKMeansConfig(k=k, iterations=args.iterations, width=width, height=args.height,
                                weighted=bool(getattr(args, "weighted", False)))
        return LocalDCTree(config, key=jax.random.PRNGKey(args.seed), stream=StreamTerms(m, args.seed + 1),
                           scale=args.normalize)

    def _variant(self, tree: LocalDCTree, d: int | None, largest_client: int) -> tuple[str, dict[str, Any]]:
        cfg = tree.config
        frame = None if d is None else dckmeans_frame_limit(cfg.k, d, weighted=cfg.weighted)
        method = "DC-k-means (weighted)" if cfg.weighted else "DC-k-means"
        return method, {"result_to_json": _dc_result_to_json, "iterations": tree.stream.removals + 2,
                        "phases": (SETUP_PHASE, "local", "merge", "request", "model"), "max_frame_bytes": frame}

    def plan(self, args: argparse.Namespace, dataset: Dataset) -> RunPlan:
        k, m = _whole_terms(args, dataset)
        parts, width = self._split(args, dataset, k)
        tree = self._tree(args, k, m, width)
        key, cfg = tree.key, tree.config
        x, y, ids = _pooled(list(parts.values()), args.normalize)
        n, d = x.shape
        sizes = np.asarray([p.n for p in parts.values()])
        leaf_of = np.repeat(np.arange(len(sizes)), sizes)
        stream = tree.stream.stream(n)
        w, h, weighted = cfg.width, cfg.height, cfg.weighted
        assert w is not None
        session = session_id("dckmeans", dataset.name, n, d, k, w, h, args.leaves, args.seed, m,
                             *(("weighted",) if weighted else ()))
        method, _ = self._variant(tree, None, 0)

        def summarize(results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
            root = results["root"]
            centroids = np.asarray(root["centroids"])
            keep = remaining(n, stream)
            with progress_task("DC-k-means retrained on the remaining data (exactness check)"):
                fresh = DCKMeans(cfg, key=key).fit(x[keep], ids[keep], leaves=leaf_of[keep])
            variant: dict[str, Any] = {
                "width": w, "height": h,
                "leaves": args.leaves, "leaf_size_min": int(sizes.min()), "leaf_size_mean": float(sizes.mean()),
                "leaf_size_max": int(sizes.max()), "iterations": cfg.iterations,
                "node_recomputations_per_removal": h + 1,
                "root_computations": root["version"],
                "model_equals_retrain": bool(np.array_equal(centroids, fresh.centroids)),
            }
            timed = None if args.no_timing or not stream else lambda: timed_rows(
                "dc", x, ids, stream, k, key, args.retrains, iterations=cfg.iterations,
                widths=(w,) if h == 1 else (), dc_config=cfg, leaves=leaf_of)
            return stream_summary(variant, data_set=dataset.name, method=method, x=x, y=y, stream=stream,
                                   centroids=centroids, key=key, k=k, timed=timed)

        analytic = {
            **_setup_analytic(len(parts), d, args.normalize),
            "analytic training upload bytes (w^h·k·(d + weighted)·8 at the leaves, plus framing)":
                w**h * k * (d + weighted) * 8,
            "analytic upward bytes per deletion (h·k·(d + weighted)·8, plus framing and the request)":
                h * k * (d + weighted) * 8,
        }
        return self._run_plan(tree, session=session, make_machine=tree.machine_factory(_held(parts)),
                              summarize=summarize, d=d, analytic=analytic)

    def plan_party(
        self, args: argparse.Namespace, party: str, roster: tuple[str, ...], session: int, data: Dataset | None
    ) -> RunPlan:
        """The plan of ``party`` holding only ``data`` (``None``: the root and internal nodes).

        The tree's width comes from the roster's leaves and ``--height`` (``--width``, when
        given, must agree); ``--k`` defaults to the k the file records; ``--removals`` must be
        given. ``--leaves`` does not apply: the split is the files'.

        Raises:
            ValueError: a roster that is no tree of that height, bad options, or data where none
                is held (or none where some is).
        """
        if args.height < 1:
            raise ValueError("--height must be at least 1")
        width = LocalDCTree.width_of(roster, args.height, args.width)
        k, m = _party_terms(args, party, data, party.startswith("leaf-"))
        tree = self._tree(args, k, m, width)
        return self._run_plan(tree, session=session, make_machine=tree.machine_factory(_own(party, data)),
                              summarize=_no_summary, d=data.d if data is not None else None, analytic={})


QKMEANS = QKMeansPlugin()
DCKMEANS = DCKMeansPlugin()

"""The ``qkmeans`` and ``dckmeans`` plugins of the ``fedproto`` command line.

``fedproto run dckmeans --data ../shared/data/celltype.npz --deletions 1000 --seed 0`` builds the
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

Both plugins generate the paper's synthetic Gaussian set by name: ``--data gaussian`` (5 x 20,000
points in 25 dimensions) or ``--data gaussian-small`` (5 x 2,000), drawn with ``--seed``.

Data are min-max scaled to ``[0, 1]^d`` (``--scale minmax``, the paper's preprocessing; Celltype
is already scaled, so it is unchanged); ``--scale none`` keeps the values. The deletion stream is
``--deletions`` ids drawn uniformly without replacement with ``--seed + 1`` (default: min(1000,
n/10)); the model key is ``PRNGKey(--seed)``.
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
from fedproto.algorithms.deletion.dckmeans import DCKMeans, DCKMeansConfig
from fedproto.algorithms.deletion.protocol import (
    DCNodeResult,
    DCRootResult,
    DCTree,
    QKMeansClientResult,
    QKMeansParties,
    QKMeansServerResult,
)
from fedproto.algorithms.deletion.federated import (
    COORDINATOR,
    FederatedPartyResult,
    FederatedQKMeansResult,
    QKMeansFederation,
    training_payload_bytes,
)
from fedproto.algorithms.deletion.qkmeans import QKMeans, QKMeansConfig, default_epsilon, train_qkmeans
from fedproto.data import Dataset, normalize, partition, session_id
from fedproto.plugin import RunPlan

__all__ = ["DCKMEANS", "QKMEANS", "DCKMeansPlugin", "QKMeansPlugin"]

def prepare(dataset: Dataset, scale: str) -> np.ndarray:
    """The points the algorithms see: min-max scaled to ``[0, 1]^d`` or unchanged."""
    if scale == "none":
        return np.asarray(dataset.x, dtype=np.float64)
    if scale != "minmax":
        raise ValueError(f"unknown --scale {scale!r}")
    return normalize(dataset.x, 0.5) + 0.5


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
    group.add_argument("--deletions", type=int, default=None, help="deletion requests (default min(1000, n/10))")
    group.add_argument("--iterations", type=int, default=10, help="Lloyd iterations T (default 10)")
    group.add_argument("--scale", choices=("minmax", "none"), default="minmax", help="preprocessing (default minmax)")
    group.add_argument("--no-timing", action="store_true", help="skip the timed centralised replay of the stream")
    group.add_argument(
        "--baseline-retrains", type=int, default=3, help="retrains timed for the k-means baseline (default 3)"
    )


def _setup(args: argparse.Namespace, dataset: Dataset) -> tuple[np.ndarray, np.ndarray, int, tuple[int, ...]]:
    k = args.k if args.k is not None else (dataset.paper_k or 3)
    if k < 1:
        raise ValueError("--k must be at least 1")
    if args.iterations < 1:
        raise ValueError("--iterations must be at least 1")
    if args.baseline_retrains < 1:
        raise ValueError("--baseline-retrains must be at least 1")
    x = prepare(dataset, args.scale)
    n = x.shape[0]
    if k > n:
        raise ValueError(f"k = {k} is larger than the number of points ({n})")
    m = args.deletions if args.deletions is not None else min(1000, n // 10)
    if m < 0:
        raise ValueError("--deletions must be non-negative")
    if n - m < k:
        raise ValueError(f"--deletions {m} would leave {n - m} points, fewer than k = {k}")
    ids = np.arange(n, dtype=np.int64)
    stream = tuple(int(i) for i in streams.deletion_stream(ids, m, args.seed + 1))
    return x, ids, k, stream


def _quality_rows(
    label: str, x: np.ndarray, y: np.ndarray | None, keep: np.ndarray, centroids: np.ndarray, key: jax.Array, k: int
) -> dict[str, Any]:
    ids = np.flatnonzero(keep)
    xr, yr = x[keep], (y[keep] if y is not None else None)
    mine = streams.quality(xr, yr, centroids)
    base = streams.quality(xr, yr, streams.converged_kmeans(xr, ids, k, key))
    return {
        f"loss ({label}, after the stream)": mine["loss"],
        "loss (k-means++ and Lloyd's to convergence)": base["loss"],
        "loss ratio": mine["loss"] / base["loss"] if base["loss"] > 0 else math.inf,
        f"silhouette ({label})": mine["silhouette"],
        "silhouette (k-means++)": base["silhouette"],
        f"NMI ({label}, arithmetic)": mine["nmi"],
        "NMI (k-means++, arithmetic)": base["nmi"],
    }


def _timing_rows(
    timing: streams.StreamTiming, baseline: streams.StreamTiming, dataset: str, paper_column: int
) -> dict[str, Any]:
    rows: dict[str, Any] = {
        f"train s ({timing.method}, centralised replay)": timing.train_s,
        f"amortised s per deletion ({timing.method})": timing.amortised_s,
        "amortised s per deletion (k-means, retrain each time)": baseline.amortised_s,
        "speedup over retraining": baseline.amortised_s / timing.amortised_s,
        "cumulative time s": timing.cumulative_s.tolist(),
        "baseline cumulative time s": baseline.cumulative_s.tolist(),
    }
    paper = streams.PAPER_TABLES.get(dataset)
    if paper is not None:
        rows["paper speedup (Table 4)"] = paper["amortised s"][0] / paper["amortised s"][paper_column]
    return rows


def plot_cumulative(ax: Any, summary: Mapping[str, Any]) -> None:
    """Cumulative time over the deletion stream: the method against retraining from scratch."""
    mine, base = summary.get("cumulative time s"), summary.get("baseline cumulative time s")
    if not mine:
        ax.text(0.5, 0.5, "no timing (--no-timing)", ha="center", va="center")
        ax.set_axis_off()
        return
    ax.plot(range(len(mine)), mine, label=str(summary.get("method", "method")))
    ax.plot(range(len(base)), base, label="k-means (retrain)")
    ax.set_yscale("log")
    ax.set_xlabel("deletions served")
    ax.set_ylabel("cumulative time s (train + deletions)")
    ax.set_title("cumulative time over the stream")
    ax.legend(fontsize="small")


class QKMeansPlugin:
    """Q-k-means with deletion requests as a ``fedproto`` protocol plugin (curated or federated)."""

    name = "qkmeans"
    description = "Q-k-means (quantised Lloyd's) with exact deletion: clients request deletions of their points"
    generated_datasets = streams.GENERATED_DATASETS

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("qkmeans")
        _common_arguments(group)
        group.add_argument("--eps", type=float, default=None, help="lattice granularity (default: the paper's rule)")
        group.add_argument("--gamma", type=float, default=0.2, help="balance parameter (default 0.2)")
        group.add_argument(
            "--federated",
            action="store_true",
            help="keep the points at the clients: a coordinator runs keyed k-means++ and one round per Lloyd "
            "iteration on their statistics (spec 2.3); default: the server curates the uploaded points",
        )

    def plan(self, args: argparse.Namespace, dataset: Dataset) -> RunPlan:
        x, ids, k, stream = _setup(args, dataset)
        if args.clients < 1:
            raise ValueError("--clients must be at least 1")
        config = QKMeansConfig(k=k, iterations=args.iterations, gamma=args.gamma, eps=args.eps)
        key = jax.random.PRNGKey(args.seed)
        parts = partition(len(x), args.clients, scheme=args.partition, seed=args.seed, labels=dataset.y)
        split = [(x[p], ids[p]) for p in parts]
        federated = bool(getattr(args, "federated", False))
        parties: QKMeansParties | QKMeansFederation
        if federated:
            parties = QKMeansFederation(split, config, key=key, deletions=stream)
            head = COORDINATOR
        else:
            parties = QKMeansParties(split, config, key=key, deletions=stream)
            head = "server"
        n, d = x.shape
        session = session_id("qkmeans", dataset.name, n, d, k, args.clients, args.seed, len(stream), args.eps,
                             *(("federated",) if federated else ()))

        def result_to_json(party: str, result: Any) -> dict[str, Any]:
            if isinstance(result, QKMeansServerResult | FederatedQKMeansResult):
                out = {"centroids": result.centroids.tolist(), "reasons": list(result.reasons),
                       "certified": result.certified, "retrained": result.retrained}
                if isinstance(result, FederatedQKMeansResult):
                    out["trainings"] = result.trainings
                    out["iterations executed"] = result.model.executed
                return out
            if isinstance(result, QKMeansClientResult | FederatedPartyResult):
                return {"centroids": result.centroids.tolist(), "version": result.version}
            raise TypeError(f"unexpected result of {party}: {type(result).__name__}")

        def summarize(results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
            head_result = results[head]
            centroids = np.asarray(head_result["centroids"])
            keep = np.ones(n, dtype=bool)
            keep[list(stream)] = False
            fresh = train_qkmeans(x[keep], ids[keep], config, key).centroids
            eps = config.resolve_eps(int(keep.sum()), d)
            summary: dict[str, Any] = {
                "data set": dataset.name, "method": "Q-k-means (federated)" if federated else "Q-k-means",
                "N": n, "d": d, "k": k, "clients": args.clients,
                "deletions": len(stream), "eps (after the stream)": eps, "gamma": config.gamma,
                "iterations T": config.iterations, "certified deletions": head_result["certified"],
                "retrained deletions": head_result["retrained"],
                "model equals training on the remaining data (same key)": bool(np.array_equal(centroids, fresh)),
                "clients agree on the model": all(
                    np.array_equal(np.asarray(results[c]["centroids"]), centroids)
                    for c in parties.clients
                    if c in results
                ),
            }
            if federated:
                central = QKMeans(config, key=key).fit(x, ids)
                reasons = [central.delete(i).reason for i in stream]
                summary["federated trainings (1 + retrains)"] = head_result["trainings"]
                summary["federated equals centralised Q-k-means on the stream (same key)"] = bool(
                    np.array_equal(centroids, central.centroids) and reasons == list(head_result["reasons"])
                )
            summary.update(_quality_rows("Q-k-means", x, dataset.y, keep, centroids, key, k))
            if not args.no_timing and stream:
                streams.warm_up(x, k, len(stream), method="q", iterations=config.iterations)
                timing = streams.time_stream("q", x, ids, stream, q_config=config, key=key)
                baseline = streams.time_baseline(x, ids, stream, k, key=key, retrains=args.baseline_retrains)
                summary.update(_timing_rows(timing, baseline, dataset.name, 1))
            summary["centroids"] = centroids.tolist()
            return summary

        m, clients = len(stream), args.clients
        analytic: dict[str, Any] = {"default eps for n (2^round(-log10(n/(k d^1.5)) - 3))": default_epsilon(n, k, d)}
        if federated:
            payload = training_payload_bytes(clients, k, d, 0)
            analytic.update({
                "analytic seeding bytes per training (P·8d·(k-1) + 8d·k, plus framing)": payload["seeding"],
                "analytic bytes per Lloyd round (P·8·(2kd + k), plus framing)": payload["lloyd per round"],
                "analytic bytes per certified deletion (8d + P·8kd, plus framing)": 8 * d + payload["model"],
            })
            phases: tuple[str, ...] = ("seed", "seed-point", "lloyd", "model", "request")
            iterations = k + config.iterations + 1 + m
        else:
            analytic["analytic model bytes per deletion (M·k·d·8, plus framing)"] = clients * k * d * 8
            phases = ("upload", "request", "model")
            iterations = m + 1
        return RunPlan(
            roster=parties.roster,
            session=session,
            make_machine=parties.make_machine,
            result_to_json=result_to_json,
            summarize=summarize,
            role_of=parties.role_of,
            iterations=iterations,
            phases=phases,
            plot_results=plot_cumulative,
            analytic=analytic,
        )


class DCKMeansPlugin:
    """DC-k-means as a tree of parties, with deletion requests, as a ``fedproto`` plugin."""

    name = "dckmeans"
    description = "DC-k-means as a tree of parties: a deletion recomputes only its leaf-to-root path"
    generated_datasets = streams.GENERATED_DATASETS

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("dckmeans")
        _common_arguments(group)
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

    def plan(self, args: argparse.Namespace, dataset: Dataset) -> RunPlan:
        x, ids, k, stream = _setup(args, dataset)
        n, d = x.shape
        width = args.width
        leaves = None
        if args.leaves == "partition":
            if args.height != 1:
                raise ValueError("--leaves partition needs --height 1")
            parts = partition(n, args.clients, scheme=args.partition, seed=args.seed, labels=dataset.y)
            leaves = np.empty(n, dtype=np.int64)
            for j, p in enumerate(parts):
                leaves[p] = j
            width = args.clients
        elif args.leaves == "file":
            if args.height != 1:
                raise ValueError("--leaves file needs --height 1")
            if not Path(args.data).suffix == ".npz":
                raise ValueError("--leaves file needs an .npz data file with client_X and client_sizes")
            leaves = file_partition(args.data, dataset.x)  # matched on the raw values
            width = int(leaves.max()) + 1
        if width is None and args.height != 1:
            raise ValueError("--height above 1 needs --width")
        weighted = bool(getattr(args, "weighted", False))
        config = DCKMeansConfig(k=k, iterations=args.iterations, width=width, height=args.height, weighted=weighted)
        key = jax.random.PRNGKey(args.seed)
        tree = DCTree(x, ids, config, key=key, deletions=stream, leaves=leaves)
        w, h = tree.tree.width, tree.tree.height
        fixed = DCKMeansConfig(k=k, iterations=args.iterations, width=w, height=h, weighted=weighted)
        session = session_id("dckmeans", dataset.name, n, d, k, w, h, args.leaves, args.seed, len(stream),
                             *(("weighted",) if weighted else ()))

        def result_to_json(party: str, result: Any) -> dict[str, Any]:
            if isinstance(result, DCRootResult):
                return {"centroids": result.centroids.tolist(), "version": result.version,
                        "deletions": list(result.deletions)}
            if isinstance(result, DCNodeResult):
                return {"node": result.node, "version": result.version, "points": result.points,
                        "removed": list(result.removed)}
            raise TypeError(f"unexpected result of {party}: {type(result).__name__}")

        def summarize(results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
            root = results["root"]
            centroids = np.asarray(root["centroids"])
            keep = np.ones(n, dtype=bool)
            keep[list(stream)] = False
            fresh = DCKMeans(fixed, key=key).fit(x[keep], ids[keep], leaves=tree.leaf_of[keep])
            sizes = np.bincount(tree.leaf_of, minlength=tree.tree.n_leaves)
            summary: dict[str, Any] = {
                "data set": dataset.name, "method": "DC-k-means (weighted)" if weighted else "DC-k-means",
                "N": n, "d": d, "k": k,
                "deletions": len(stream), "width w": w, "height h": h, "leaves": args.leaves,
                "leaf sizes (min / mean / max)": f"{sizes.min()} / {sizes.mean():.1f} / {sizes.max()}",
                "iterations T": config.iterations,
                "node recomputations per deletion": h + 1,
                "root computations": root["version"],
                "model equals training on the remaining data (same key)": bool(
                    np.array_equal(centroids, fresh.centroids)
                ),
            }
            summary.update(_quality_rows("DC-k-means", x, dataset.y, keep, centroids, key, k))
            if not args.no_timing and stream:
                streams.warm_up(x, k, len(stream), method="dc", iterations=config.iterations,
                                widths=(w,) if h == 1 else ())
                timing = streams.time_stream("dc", x, ids, stream, dc_config=fixed, key=key, leaves=tree.leaf_of)
                baseline = streams.time_baseline(x, ids, stream, k, key=key, retrains=args.baseline_retrains)
                summary.update(_timing_rows(timing, baseline, dataset.name, 2))
            summary["centroids"] = centroids.tolist()
            return summary

        m = len(stream)
        return RunPlan(
            roster=tree.roster,
            session=session,
            make_machine=tree.make_machine,
            result_to_json=result_to_json,
            summarize=summarize,
            role_of=tree.role_of,
            iterations=m + 2,
            phases=("local", "merge", "request", "model"),
            plot_results=plot_cumulative,
            analytic={
                "analytic training upload bytes (w^h·k·(d + weighted)·8 at the leaves, plus framing)":
                    w**h * k * (d + weighted) * 8,
                "analytic upward bytes per deletion (h·k·(d + weighted)·8, plus framing and the request)":
                    h * k * (d + weighted) * 8,
            },
        )


QKMEANS = QKMeansPlugin()
DCKMEANS = DCKMeansPlugin()

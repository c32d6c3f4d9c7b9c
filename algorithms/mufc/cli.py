"""The ``mufc`` plugin of the ``fedproto`` command line.

``fedproto run mufc --data celltype --clients 100 --removals 100 --seed 0`` loads the data (a
bundled scikit-learn set, a file, ``celltype`` from the data directory with its own 100-client
split, or the paper's synthetic ``gaussian`` set generated from ``--seed``), scales every column
into ``[0, 1]`` (Celltype already is), splits it over the clients, runs MUFC training (K-means++
seeding at the clients, SCMA, K-means++ at the server) and ``--removals`` removal requests of
``--points-per-removal`` random points each (then ``--leave`` whole clients leaving), and prints:

* the loss ratio phi_f / phi_c* (induced assignment, Definition 3.1; phi_c* from scikit-learn's
  KMeans with 10 restarts on the remaining data) beside the paper's Table 1 and beside K-FED and
  DC-KM over the same clients;
* whether the final model equals training from scratch on the remaining data with the same key;
* the time of each removal against complete retraining, from a timed centralised replay of the
  same computations (the plot's extra panel: cumulative time and loss ratio over the stream);
* the run report: bytes per round, per phase, per link; the analytic syndrome bytes per client
  per aggregation, T * ceil(bitlength(p) / 8) with T = 2KL, beside the measured ones.

The summary's keys (the report's ``results``) are snake_case with units in their names
(``loss_ratio``, ``removal_ms_mean``, ``retrain_ms``, ``speedup_over_retrain``, ...; :data:`LABELS`
gives the readable label of each); the paper's figures go under ``paper`` (:func:`paper_figures`).
The baselines, the exactness check and the timed replay after the protocol report their progress
through :func:`fedproto.progress.progress_task`.

Splits (``--partition``, with this plugin's own schemes): ``file`` (the ``client_X``/
``client_sizes`` split stored in an ``.npz``, Celltype's non-i.i.d. split; the default when the
file has one), ``iid`` or ``noniid`` (the authors' split, each client holding at most
``--k-prime`` clusters; default when no file split).

``--secagg plus`` (or ``complete``) aggregates every round with SecAgg+
(:mod:`fedproto.algorithms.secagg_plus`) instead of SCMA's pairwise masks: a client that drops
at any stage (``--dropout client-3@masked-input``, memory transport) leaves the federation and the
round completes with the survivors; the summary adds ``secagg``, ``secagg_degree``,
``secagg_threshold`` and ``dropouts``. The default ``scma`` reproduces the paper.

Old option spellings stay accepted, hidden from ``--help``: ``--split`` (``--partition``),
``--remove`` (``--removals``),
``--batch`` (``--points-per-removal``), ``--gamma`` (``--quantization-step``) and ``--max-iter``
(``--max-iterations``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedproto.algorithms.mufc import baselines
from fedproto.algorithms.mufc.clustering import federated_loss, kmeans_cost, reference_loss
from fedproto.algorithms.mufc.data import client_split, file_clients, gaussian_mixture
from fedproto.algorithms.mufc.messages import (
    AggregationRequest,
    MaskedSyndromes,
    ModelUpdate,
    PeerKeys,
    PublicKey,
    RemovalRequest,
)
from fedproto.algorithms.mufc.protocol import (
    MODES,
    SECAGG_CHOICES,
    SERVER,
    MUFCClientResult,
    MUFCConfig,
    MUFCParties,
    MUFCServerResult,
    make_config,
    secagg_plus_config,
)
from fedproto.algorithms.mufc.replay import replay, warm_up_requests
from fedproto.algorithms.secagg_plus import engine as secagg_plus
from fedproto.data import Dataset, find_data_file, session_id
from fedproto.framesize import max_frame_bytes
from fedproto.plugin import RunPlan
from fedproto.progress import progress_task

__all__ = [
    "HEADLINE",
    "LABELS",
    "PAPER_TABLE1",
    "PROTOCOL",
    "MUFCPlugin",
    "frame_limit",
    "paper_figures",
    "removal_stream",
    "unit_box",
]

#: Table 1 of the paper (loss ratio, mean and std over 5 runs) and the speed-up row.
PAPER_TABLE1 = {
    "celltype": {"MUFC": (1.14, 0.03), "K-FED": (1.72, 0.24), "DC-KM": (1.46, 0.01), "speedup no re-seed": 1535},
    "gaussian": {"MUFC": (1.25, 0.02), "K-FED": (1.25, 0.01), "DC-KM": (1.02, 0.00), "speedup no re-seed": 2074},
}
#: The paper's average unlearning speed-up over complete retraining for random removals (Sec. 6).
PAPER_MEAN_SPEEDUP = 84.0

#: Readable label of each summary key (and of each key of :func:`paper_figures`) for the tables.
LABELS: dict[str, str] = {
    "data_set": "data set",
    "n_points": "N (points)",
    "k": "K",
    "k_client": "seeds per client",
    "n_clients": "clients",
    "quantization_step": "quantization step gamma",
    "bins_per_dim": "bins per dimension B",
    "n_bins_log10": "log10 of the bin count B^d",
    "prime_bits": "prime p bits",
    "n_syndromes": "syndromes per client T = 2KL",
    "n_removals": "removal requests",
    "points_per_removal": "points per removal request",
    "n_clients_left": "clients that left",
    "n_clients_dropped": "clients that dropped out",
    "n_points_removed": "points removed",
    "n_reseeds": "requests that re-seeded",
    "n_reclusterings": "server re-clusterings",
    "n_points_decoded": "decoded point count (final)",
    "phi_f": "phi_f (induced, Def. 3.1)",
    "phi_c": "phi_c (nearest centroid)",
    "phi_c_star": "phi_c* (scikit-learn KMeans, 10 restarts)",
    "loss_ratio": "loss ratio phi_f / phi_c*",
    "clients_agree": "clients agree on the model",
    "model_equals_retrain": "model equals training on the remaining data (same keys)",
    "model_equals_retrain_skipped": "model check skipped because",
    "loss_ratio_kfed": "K-FED loss ratio",
    "loss_ratio_dckm": "DC-KM loss ratio",
    "train_ms": "training ms (slowest client + server, replay)",
    "removal_ms_mean": "mean ms per removal (replay)",
    "removal_ms_std": "std of ms per removal (replay)",
    "client_ms_mean": "  of which the requesting client (Algorithm 3, syndromes), ms",
    "share_sum_ms_mean": "  of which the server's share sum, ms",
    "decode_ms_mean": "  of which the server's syndrome decoding, ms",
    "cluster_ms_mean": "  of which the server's K-means++, ms",
    "codec_ms_mean": "codec per removal (share and model frames; apart), ms",
    "mask_ms_per_round": "a client's mask expansion per round (between rounds; apart), ms",
    "retrain_ms": "complete retraining ms (replay, median)",
    "speedup_over_retrain": "unlearning speed-up over complete retraining",
    "replay_matches_protocol": "replay matches the protocol's model",
    "loss_ratio_mean": "loss ratio phi_f / phi_c*, mean (Table 1)",
    "loss_ratio_std": "loss ratio phi_f / phi_c*, std (Table 1)",
    "loss_ratio_kfed_mean": "K-FED loss ratio, mean (Table 1)",
    "loss_ratio_kfed_std": "K-FED loss ratio, std (Table 1)",
    "loss_ratio_dckm_mean": "DC-KM loss ratio, mean (Table 1)",
    "loss_ratio_dckm_std": "DC-KM loss ratio, std (Table 1)",
    "speedup_over_retrain_no_reseed": "speed-up of a removal without re-seeding (Table 1)",
    "secagg": "secure aggregation",
    "secagg_degree": "SecAgg+ neighbours k",
    "secagg_threshold": "SecAgg+ threshold t",
    "dropouts": "dropouts (party@stage:round, as the server saw them)",
}


def paper_figures(data_set: str, *, timed: bool) -> dict[str, float]:
    """The paper's figures for a run on ``data_set``, keyed like the measured summary keys.

    Args:
        data_set: the data set's name (Table 1 has ``celltype`` and ``gaussian``).
        timed: the run measured removal times, so the paper's mean speed-up over complete
            retraining (Sec. 6, 84x) belongs beside the measured one.

    Returns:
        ``loss_ratio_mean``/``_std`` and the K-FED and DC-KM ones (Table 1, 5 runs),
        ``speedup_over_retrain_no_reseed`` (Table 1) and ``speedup_over_retrain`` (Sec. 6);
        empty when none applies.

    References:
        Pan et al., "Machine Unlearning of Federated Clusters", ICLR 2023, Table 1 and Sec. 6.
    """
    out: dict[str, float] = {}
    table = PAPER_TABLE1.get(data_set)
    if table is not None:
        for key, column in (("loss_ratio", "MUFC"), ("loss_ratio_kfed", "K-FED"), ("loss_ratio_dckm", "DC-KM")):
            out[f"{key}_mean"], out[f"{key}_std"] = (float(v) for v in table[column])
        out["speedup_over_retrain_no_reseed"] = float(table["speedup no re-seed"])
    if timed:
        out["speedup_over_retrain"] = PAPER_MEAN_SPEEDUP
    return out


#: Summary keys printed first (the terminal table shows its first rows unless ``--full``).
HEADLINE = ("data_set", "n_points", "d", "k", "n_clients", "n_removals", "loss_ratio", "loss_ratio_kfed",
            "loss_ratio_dckm", "model_equals_retrain", "clients_agree", "removal_ms_mean", "retrain_ms",
            "speedup_over_retrain")


def frame_limit(config: MUFCConfig, d: int) -> int:
    """The largest frame any party of a MUFC run sends (bytes, envelope included).

    Setup sends 32-byte keys (all ``L`` of them to every client); an aggregation opens with the
    list of active clients (at most ``L``) and each share holds ``T = 2KL`` field elements of
    ``ceil(bitlength(p) / 8)`` bytes; the model is ``[K, d]`` float64.
    """
    key = bytes(32)
    return max(
        max_frame_bytes(PublicKey, plain={"public_key": key}),
        max_frame_bytes(PeerKeys, plain={"keys": (key,) * config.n_clients}),
        max_frame_bytes(AggregationRequest, plain={"active": (0,) * config.n_clients}),
        max_frame_bytes(MaskedSyndromes, bigints={"values": (config.n_syndromes, config.width)}),
        max_frame_bytes(RemovalRequest),
        max_frame_bytes(ModelUpdate, arrays={"centroids": (config.k, d)}),
    )


def _headline_first(summary: Mapping[str, Any], headline: tuple[str, ...]) -> dict[str, Any]:
    """``summary`` with the keys of ``headline`` first, in that order, then the others as they were."""
    return {**{key: summary[key] for key in headline if key in summary}, **summary}


def _number(value: float) -> float | None:
    """``value`` as a float, or ``None`` where it is not finite (JSON has no NaN or infinity)."""
    value = float(value)
    return value if math.isfinite(value) else None


def _ratio(loss: float, reference: float) -> float | None:
    """``loss / reference``, or ``None`` where the reference is not positive."""
    return _number(loss / reference) if reference > 0 else None


def unit_box(x: np.ndarray) -> np.ndarray:
    """Scale every column into ``[0, 1]`` (min-max; constant columns map to 0); data already in
    the unit box are returned unchanged, so Celltype keeps its values."""
    x = np.asarray(x, dtype=np.float64)
    if x.size and x.min() >= 0.0 and x.max() <= 1.0:
        return x
    lo, hi = x.min(axis=0), x.max(axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)
    return np.clip((x - lo) / span, 0.0, 1.0)


def removal_stream(
    sizes: list[int], ids: list[np.ndarray], n_requests: int, batch: int, leave: int, k: int, seed: int
) -> list[tuple[int, tuple[int, ...] | None]]:
    """Random removals: ``n_requests`` batches of ``batch`` points drawn uniformly from the
    remaining points of clients that keep more than ``k`` points, then ``leave`` random clients
    leave.

    Raises:
        ValueError: the data cannot serve the stream.
    """
    if n_requests < 0 or batch < 1 or leave < 0:
        raise ValueError("--removals and --leave must be non-negative, --points-per-removal at least 1")
    rng = np.random.default_rng(seed)
    remaining = [list(map(int, i)) for i in ids]
    stream: list[tuple[int, tuple[int, ...] | None]] = []
    for _ in range(n_requests):
        eligible = [c for c, r in enumerate(remaining) if len(r) - batch >= max(k, 1)]
        if not eligible:
            raise ValueError(f"no client can serve another removal of {batch} points and keep {k}")
        weights = np.array([len(remaining[c]) for c in eligible], dtype=np.float64)
        c = int(rng.choice(eligible, p=weights / weights.sum()))
        picks = rng.choice(len(remaining[c]), size=batch, replace=False)
        chosen = tuple(remaining[c][p] for p in sorted(picks.tolist()))
        remaining[c] = [i for j, i in enumerate(remaining[c]) if j not in set(picks.tolist())]
        stream.append((c, chosen))
    if leave >= len(sizes):
        raise ValueError(f"--leave {leave} would remove every one of the {len(sizes)} clients")
    for c in rng.choice(len(sizes), size=leave, replace=False).tolist():
        stream.append((int(c), None))
    return stream


def _file_split(data: str, raw: np.ndarray) -> list[np.ndarray] | None:
    path = Path(data) if Path(data).is_file() else find_data_file(data)
    if path is None or path.suffix != ".npz":
        return None
    with np.load(path, allow_pickle=False) as archive:
        if "client_X" not in archive or "client_sizes" not in archive:
            return None
    return file_clients(path, raw)


def plot_stream(ax: Any, summary: Mapping[str, Any]) -> None:
    """Cumulative removal time against complete retraining, and the loss ratio, over the stream.

    Times go on a log axis when they span more than two decades; the loss ratio on a second
    axis at the right; removal requests (a count) get integer ticks; one legend sits below the axes.
    """
    from matplotlib.ticker import MaxNLocator

    mine, base = summary.get("cumulative_removal_s"), summary.get("cumulative_retrain_s")
    if not mine:
        ax.text(0.5, 0.5, "no removal timing (--no-timing or no requests)", ha="center", va="center")
        ax.set_axis_off()
        return
    steps = range(1, len(mine) + 1)
    handles = ax.plot(steps, mine, marker=".", label="MUFC unlearning (cumulative s)")
    handles += ax.plot(steps, base, marker=".", label="complete retraining (cumulative s)")
    times = [t for t in (*mine, *base) if t > 0]
    log = len(times) >= 2 and max(times) > 100 * min(times)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel("cumulative time s" + (" (log scale)" if log else ""))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("removal requests served")
    ax.set_title("removals: cumulative time and loss ratio")
    ratios = summary.get("loss_ratio_per_removal")
    if ratios:
        twin = ax.twinx()
        handles += twin.plot(steps, ratios, color="tab:green", linestyle=":", label="loss ratio (right axis)")
        twin.set_ylabel("loss ratio phi_f / phi_c*")
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize="small",
              frameon=False)


class MUFCPlugin:
    """MUFC (secure federated clustering with exact unlearning) as a ``fedproto`` plugin."""

    name = "mufc"
    description = "MUFC: one-shot secure federated K-means++ (SCMA) with exact federated unlearning"
    generated_datasets = {
        "gaussian": lambda seed: gaussian_mixture(seed),
        # a tenth of the paper's set, named apart so that Table 1's figures are not set beside it
        "gaussian-small": lambda seed: dataclasses.replace(gaussian_mixture(seed, n_per=300), name="gaussian-small"),
    }

    #: ``--partition`` schemes: ``auto`` (the file's split if it has one, else ``noniid``), ``file``
    #: (an ``.npz``'s ``client_X``/``client_sizes``, Celltype's), ``iid``, ``noniid`` (the authors'
    #: split: each client holds at most ``--k-prime`` clusters).
    partitions = ("auto", "file", "iid", "noniid")
    default_partition = "auto"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("mufc")
        group.add_argument("--k", type=int, default=None, help="clusters K (default: the paper's K for the data)")
        group.add_argument("--k-client", type=int, default=None, help="seeds per client (default K)")
        # --partition (a common option, with this plugin's schemes) was --split
        group.add_argument("--split", dest="partition", choices=self.partitions, default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS)
        group.add_argument("--k-prime", type=int, default=None,
                           help="clusters per client in the noniid split (default ceil(sqrt(K)))")
        group.add_argument("--quantization-step", type=float, default=None,
                           help="quantization step gamma of the bins (default 1/sqrt(n))")
        group.add_argument("--gamma", dest="quantization_step", type=float, help=argparse.SUPPRESS)
        group.add_argument("--server-mode", choices=("weighted", "uniform"), default="weighted",
                           help="server data: weighted bin centres (default) or uniform samples in the bins")
        group.add_argument("--unlearning", choices=MODES, default="exact",
                           help="exact (default), literal (the paper's wording) or lazy (the authors' code)")
        group.add_argument("--removals", type=int, default=10, help="removal requests (default 10)")
        group.add_argument("--remove", dest="removals", type=int, help=argparse.SUPPRESS)
        group.add_argument("--points-per-removal", type=int, default=1, help="points per removal request (default 1)")
        group.add_argument("--batch", dest="points_per_removal", type=int, help=argparse.SUPPRESS)
        group.add_argument("--leave", type=int, default=0, help="clients that leave after the removals (default 0)")
        group.add_argument("--n-init", type=int, default=10, help="K-means++ restarts at the server (default 10)")
        group.add_argument("--max-iterations", type=int, default=300,
                           help="Lloyd iterations cap at the server (default 300)")
        group.add_argument("--max-iter", dest="max_iterations", type=int, help=argparse.SUPPRESS)
        group.add_argument("--client-lloyd", type=int, default=0,
                           help="Lloyd iterations at the clients (App. M.3 complete client training; default 0)")
        group.add_argument("--fresh-randomness", action="store_true",
                           help="re-seed and re-cluster with fresh keys per round (exact in distribution)")
        group.add_argument("--min-clients", type=int, default=None,
                           help="go on without clients silent past the deadline while this many remain "
                           "(default: all with scma; with plus/complete, what SecAgg+ can recover)")
        group.add_argument("--secagg", choices=SECAGG_CHOICES, default="scma",
                           help="secure aggregation: scma (the paper's pairwise masks, default), plus "
                           "(SecAgg+: survives dropouts at every stage) or complete (classic SecAgg)")
        group.add_argument("--no-timing", action="store_true", help="skip the timed replay of the stream")
        group.add_argument("--no-baselines", action="store_true", help="skip K-FED and DC-KM")
        group.add_argument("--retrains", type=int, default=3, help="complete retrainings timed (default 3)")

    def plan(self, args: argparse.Namespace, dataset: Dataset) -> RunPlan:
        k = args.k if args.k is not None else (dataset.paper_k or 3)
        if k < 1:
            raise ValueError("--k must be at least 1")
        x = unit_box(dataset.x)
        n, d = x.shape
        if k > n:
            raise ValueError(f"K = {k} is larger than the number of points ({n})")
        split = args.partition
        rows = _file_split(args.data, dataset.x) if split in ("auto", "file") else None
        if split == "file" and rows is None:
            raise ValueError("--partition file needs an .npz data file with client_X and client_sizes")
        if rows is None:
            if args.clients < 1:
                raise ValueError("--clients must be at least 1")
            if args.clients > n:
                raise ValueError(f"--clients {args.clients} is more than the {n} points")
            split = "iid" if split == "iid" else "noniid"
            k_prime = args.k_prime if args.k_prime is not None else math.ceil(math.sqrt(k))
            if k_prime < 1:
                raise ValueError("--k-prime must be at least 1")
            rows = client_split(x, args.clients, k=k, k_prime=None if split == "iid" else k_prime, seed=args.seed)
        else:
            split = "file"
        n_clients = len(rows)
        ids = np.arange(n, dtype=np.int64)
        parts = [(x[r], ids[r]) for r in rows]
        step = args.quantization_step
        if step is not None and not (math.isfinite(step) and step > 0):
            raise ValueError(f"--quantization-step must be positive and finite, got {step}")
        if args.max_iterations < 1:
            raise ValueError("--max-iterations must be at least 1")
        options = dict(server_mode=args.server_mode, unlearning=args.unlearning, n_init=args.n_init,
                       max_iter=args.max_iterations, lloyd_iterations=args.client_lloyd,
                       fresh_randomness=args.fresh_randomness, min_clients=args.min_clients)
        config = make_config(n, d, k, n_clients, k_client=args.k_client, gamma=step, **options)
        if args.retrains < 1:
            raise ValueError("--retrains must be at least 1")
        stream = removal_stream([len(r) for r in rows], [ids[r] for r in rows], args.removals,
                                args.points_per_removal, args.leave, config.k_client, args.seed + 1)
        key = jax.random.PRNGKey(args.seed)
        session = session_id("mufc", dataset.name, n, d, k, n_clients, split, args.seed, len(stream),
                             args.points_per_removal, args.unlearning, args.server_mode, config.k_client, step)
        choice = getattr(args, "secagg", "scma")
        plus = secagg_plus_config(config, choice, session=session)
        parties = MUFCParties(parts, config, key=key, requests=stream, seed=args.seed, secagg_plus=plus,
                              session=session)

        def result_to_json(party: str, result: Any) -> dict[str, Any]:
            if isinstance(result, MUFCServerResult):
                return {
                    "centroids": result.centroids.tolist(),
                    "history": [h.tolist() for h in result.history],
                    "reclustered": list(result.reclustered),
                    "totals": list(result.totals),
                    "support_sizes": list(result.support_sizes),
                    "active": list(result.active),
                    "dropped": list(result.dropped),
                    # the --dropout spelling, PARTY@STAGE:ROUND (short names: the report schema's string_array)
                    "dropouts": [f"{party}@{stage}:{r}" for party, (r, stage) in sorted(result.dropouts.items())],
                }
            if isinstance(result, MUFCClientResult):
                return {
                    "centroids": None if result.centroids is None else result.centroids.tolist(),
                    "version": result.version,
                    "ids": result.ids.tolist(),
                    "positions": result.positions.tolist(),
                    "local_centroids": result.local_centroids.tolist(),
                    "seeds": list(result.seeds),
                    "reseeded": list(result.reseeded),
                    "left": result.left,
                }
            raise TypeError(f"unexpected result of {party}: {type(result).__name__}")

        def summarize(results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
            server = results[SERVER]
            centroids = np.asarray(server["centroids"])
            present = [c for c in range(n_clients) if parties.clients[c] in results
                       and not results[parties.clients[c]]["left"] and c in server["active"]]
            xs_ids = [np.asarray(results[parties.clients[c]]["ids"], dtype=np.int64) for c in present]
            xs = [x[i] for i in xs_ids]
            cents = [np.asarray(results[parties.clients[c]]["local_centroids"]).reshape(-1, d) for c in present]
            poss = [np.asarray(results[parties.clients[c]]["positions"], dtype=np.int64) for c in present]
            remaining = np.concatenate(xs)
            phi_f = float(federated_loss(xs, cents, poss, config.grid, centroids))
            phi_c = float(kmeans_cost(remaining, centroids))
            with progress_task("phi_c*: scikit-learn KMeans on the remaining data"):
                phi_star = float(reference_loss(remaining, k, args.seed))
            reseeds = sum(sum(results[c]["reseeded"]) for c in parties.clients if c in results)
            dropouts = server.get("dropouts", [])
            left = [c for c, name in enumerate(parties.clients) if name in results and results[name]["left"]]
            # removed by requests: the present clients' removed points and the leaving clients' data
            # (a client that dropped out is not counted: its data left the model with it)
            removed = sum(len(parties.parts[c][1]) - len(i) for c, i in zip(present, xs_ids))
            removed += sum(len(parties.parts[c][1]) for c in left)
            summary: dict[str, Any] = {
                "data_set": dataset.name, "n_points": n, "d": d, "k": k, "k_client": config.k_client,
                "n_clients": n_clients, "partition": split, "quantization_step": config.grid.gamma,
                "bins_per_dim": config.grid.per_dim, "n_bins_log10": math.log10(config.grid.n_bins),
                "prime_bits": config.prime.bit_length(), "n_syndromes": config.n_syndromes,
                "unlearning_mode": config.unlearning, "server_mode": config.server_mode,
                "n_removals": len(stream) - args.leave, "points_per_removal": args.points_per_removal,
                "n_clients_left": args.leave, "n_points_removed": removed,
                "n_clients_dropped": len(dropouts),
                "n_reseeds": reseeds,
                "n_reclusterings": sum(server["reclustered"]),
                "n_points_decoded": server["totals"][-1],
                "phi_f": phi_f, "phi_c": phi_c, "phi_c_star": phi_star,
                "loss_ratio": _ratio(phi_f, phi_star),
                "clients_agree": all(
                    np.array_equal(np.asarray(results[parties.clients[c]]["centroids"]), centroids) for c in present
                ),
                "secagg": choice,
            }
            if plus is not None:
                summary["secagg_degree"] = plus.degree
                summary["secagg_threshold"] = plus.threshold
            summary["dropouts"] = dropouts
            if config.unlearning == "exact" and not config.fresh_randomness:
                # Same public parameters (gamma and p stay fixed over a run), same keys, the
                # remaining points only: the protocol's model must be the same array.
                if len(present) == n_clients:
                    kept = [(x[parties.parts[c][1][np.isin(parties.parts[c][1], xs_ids[i])]],
                             parties.parts[c][1][np.isin(parties.parts[c][1], xs_ids[i])])
                            for i, c in enumerate(present)]
                    with progress_task("MUFC retrained on the remaining data (exactness check)"):
                        fresh = replay(kept, config, key, (), evaluate=False, retrains=1)
                    summary["model_equals_retrain"] = bool(np.array_equal(fresh.centroids, centroids))
                else:
                    summary["model_equals_retrain"] = None
                    summary["model_equals_retrain_skipped"] = (
                        f"clients {'dropped out' if dropouts else 'left'}: "
                        "the client count is part of the public parameters")
            if not args.no_baselines:
                with progress_task("K-FED baseline"):
                    kfed = baselines.kfed(args.seed, xs, k, config.k_client)
                    summary["loss_ratio_kfed"] = _ratio(baselines.induced_loss(
                        xs, kfed.local_positions, kfed.local_labels, kfed.centroids), phi_star)
                with progress_task("DC-KM baseline"):
                    dc = baselines.ClientDCKMeans(args.seed, xs, [np.arange(len(s)) for s in xs], k)
                    summary["loss_ratio_dckm"] = _ratio(baselines.induced_loss(
                        xs, dc.local_positions, dc.local_labels, dc.centroids), phi_star)
            timed = not args.no_timing and bool(stream)
            if timed:
                with progress_task("compiling the replay's kernels (not timed)"):
                    replay(parts, config, key, warm_up_requests(parts, config, key), retrains=1, evaluate=False)
                with progress_task("timed replay of the removal stream", total=len(stream)) as advance:
                    run = replay(parts, config, key, stream, retrains=args.retrains, progress=lambda _: advance())
                with progress_task("phi_c*: scikit-learn KMeans on all the data"):
                    base = reference_loss(x, k, args.seed)
                times_ms = 1e3 * np.array([s.total_s for s in run.steps])
                summary.update({
                    "train_ms": 1e3 * (run.train_client_s + run.train_server_s),
                    "removal_ms_mean": float(times_ms.mean()),
                    "removal_ms_std": float(times_ms.std()),
                    **{f"{part}_ms_mean": 1e3 * float(np.mean([getattr(s, f"{part}_s") for s in run.steps]))
                       for part in ("client", "share_sum", "decode", "cluster", "codec")},
                    "mask_ms_per_round": 1e3 * run.mask_s,
                    "retrain_ms": 1e3 * run.retrain_s,
                    "speedup_over_retrain": _number(run.speedup),
                    # the replay serves the stream without dropouts: no comparison after one
                    "replay_matches_protocol": None if dropouts else bool(np.array_equal(run.centroids, centroids)),
                    "cumulative_removal_s": np.cumsum(times_ms / 1e3).tolist(),
                    "cumulative_retrain_s": (run.retrain_s * np.arange(1, len(times_ms) + 1)).tolist(),
                    "loss_ratio_per_removal": [_ratio(s.loss, base) for s in run.steps],
                })
            paper = paper_figures(dataset.name, timed=timed)
            if paper:
                summary["paper"] = paper
            summary["centroids"] = centroids.tolist()
            return _headline_first(summary, HEADLINE)

        analytic = {
            "analytic_syndrome_bytes_per_client": config.syndrome_bytes(),
            # B^d can exceed a float's range only beyond 10^308 bins; the count stays exact
            "dense_aggregation_bytes_per_client": config.grid.n_bins * config.width,
        }
        if plus is None:
            phases: tuple[str, ...] = ("setup", "aggregate", "removal", "model")
            limit = frame_limit(config, d)
        else:
            phases = ("removal", *secagg_plus.STAGES, "model")
            limit = max(frame_limit(config, d), secagg_plus.frame_limit(plus))
            analytic["analytic_secagg_bytes_per_client_per_aggregation"] = sum(
                v["sent"] + v["received"] for v in secagg_plus.stage_bytes(plus).values())

        return RunPlan(
            roster=parties.roster,
            session=session,
            make_machine=parties.make_machine,
            result_to_json=result_to_json,
            summarize=summarize,
            role_of=parties.role_of,
            iterations=len(stream) + 1,
            phases=phases,
            plot_results=plot_stream,
            labels={
                **LABELS,
                "analytic_syndrome_bytes_per_client": "analytic syndrome payload per client per aggregation "
                "(T·ceil(log2 p / 8) bytes)",
                "dense_aggregation_bytes_per_client": "dense secure aggregation of the B^d count vector "
                "would send (bytes per client)",
                "analytic_secagg_bytes_per_client_per_aggregation": "analytic SecAgg+ data bytes per client per "
                "aggregation (sent and received, no dropout)",
            },
            analytic=analytic,
            max_frame_bytes=limit,
            dropout_stages=secagg_plus.STAGES if plus is not None else (),
            dropout_unsupported="" if plus is not None else (
                "mufc survives dropouts at a stage only with --secagg plus or complete"),
        )


PROTOCOL = MUFCPlugin()

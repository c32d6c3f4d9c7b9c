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

Each party can hold only its own data: :meth:`MUFCPlugin.split` gives each client its raw rows
(``fedproto split mufc``), :meth:`MUFCPlugin.plan_party` builds one party from its own file
(``fedproto party mufc --data FILE``), and the parties agree n, the extent, the grid and the
removal stream in the ``setup.data`` phase (:mod:`fedproto.algorithms.mufc.setup`).
:meth:`MUFCPlugin.plan`, the simulation, builds every machine the same way from the same parts
and adds what needs the pooled data: the summary, the baselines, the exactness check and the
timed replay.

Old option spellings stay accepted, hidden from ``--help``: ``--split`` (``--partition``),
``--remove`` (``--removals``),
``--batch`` (``--points-per-removal``), ``--gamma`` (``--quantization-step``) and ``--max-iter``
(``--max-iterations``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedproto.algorithms.mufc import baselines, messages
from fedproto.algorithms.mufc.clustering import federated_loss, kmeans_cost, reference_loss
from fedproto.algorithms.mufc.data import Federation, client_split, file_clients, gaussian_mixture, unit_box
from fedproto.algorithms.mufc.protocol import (
    MODES,
    SECAGG_CHOICES,
    SERVER,
    MUFCClientResult,
    MUFCConfig,
    MUFCServerResult,
)
from fedproto.algorithms.mufc.replay import replay, warm_up_requests
from fedproto.algorithms.mufc.setup import DataSetup, LocalDataParties, removal_stream, setup_data_bytes
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

    ``setup.data`` sends a ``[2, d]`` float64 extent up and every client's count (``[L]`` int64)
    with the federation's extent down; setup sends 32-byte keys (all ``L`` of them to every
    client); an aggregation opens with the list of active clients (at most ``L``) and each share
    holds ``T = 2KL`` field elements of ``ceil(bitlength(p) / 8)`` bytes; the model is ``[K, d]``
    float64.
    """
    key = bytes(32)
    return max(
        max_frame_bytes(messages.DataSummary, arrays={"extent": (2, d)}),
        max_frame_bytes(messages.FederationSummary, arrays={"client_points": (config.n_clients,), "extent": (2, d)}),
        max_frame_bytes(messages.PublicKey, plain={"public_key": key}),
        max_frame_bytes(messages.PeerKeys, plain={"keys": (key,) * config.n_clients}),
        max_frame_bytes(messages.AggregationRequest, plain={"active": (0,) * config.n_clients}),
        max_frame_bytes(messages.MaskedSyndromes, bigints={"values": (config.n_syndromes, config.width)}),
        max_frame_bytes(messages.RemovalRequest),
        max_frame_bytes(messages.ModelUpdate, arrays={"centroids": (config.k, d)}),
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


def _phases(secagg: str) -> tuple[str, ...]:
    """The run's phases in message order (``setup.data`` first)."""
    if secagg == "scma":
        return ("setup.data", "setup", "aggregate", "removal", "model")
    return ("setup.data", "removal", *secagg_plus.STAGES, "model")


def _run_plan(parties: LocalDataParties, make_machine: Callable[[str], Any], **plan: Any) -> RunPlan:
    """The :class:`~fedproto.plugin.RunPlan` of a MUFC run (the simulation's, or one party's).

    What both kinds of plan share comes from ``parties`` (roster, session, roles, the iterations
    and phases of its setup's removal stream and aggregation, the dropout stages); ``plan`` adds
    the rest (``summarize``, ``labels``, ...).
    """
    setup = parties.setup
    plus = setup.secagg != "scma"
    return RunPlan(
        roster=parties.roster,
        session=parties.session,
        make_machine=make_machine,
        result_to_json=result_to_json,
        role_of=parties.role_of,
        iterations=setup.n_requests + 1,
        phases=_phases(setup.secagg),
        dropout_stages=secagg_plus.AGGREGATION_STAGES if plus else (),
        dropout_unsupported="" if plus else "mufc survives dropouts at a stage only with --secagg plus or complete",
        **plan,
    )


def _client_parts(dataset: Dataset, rows: list[np.ndarray]) -> dict[str, Dataset]:
    """``{"client-<c>": the raw rows rows[c] of dataset}`` (the split's files)."""
    return {
        f"client-{c}": Dataset(dataset.name, dataset.x[r], None if dataset.y is None else dataset.y[r],
                               dataset.paper_k)
        for c, r in enumerate(rows)
    }


def result_to_json(party: str, result: Any) -> dict[str, Any]:
    """A party's result as JSON-ready data (the server's model history, a client's local state)."""
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

    def _cut(self, args: argparse.Namespace, dataset: Dataset, k: int) -> tuple[list[np.ndarray], str]:
        """The clients' rows of ``dataset`` (one int64 index array per client, client order) and the
        partition's name: the file's split, or the authors' ``iid``/``noniid`` split of the data
        scaled into the unit box.

        Raises:
            ValueError: a partition the data cannot serve, or options out of range.
        """
        n = dataset.n
        split = args.partition
        rows = _file_split(args.data, dataset.x) if split in ("auto", "file") else None
        if split == "file" and rows is None:
            raise ValueError("--partition file needs an .npz data file with client_X and client_sizes")
        if rows is not None:
            return rows, "file"
        if args.clients < 1:
            raise ValueError("--clients must be at least 1")
        if args.clients > n:
            raise ValueError(f"--clients {args.clients} is more than the {n} points")
        split = "iid" if split == "iid" else "noniid"
        k_prime = args.k_prime if args.k_prime is not None else math.ceil(math.sqrt(k))
        if k_prime < 1:
            raise ValueError("--k-prime must be at least 1")
        x = unit_box(dataset.x)
        return client_split(x, args.clients, k=k, k_prime=None if split == "iid" else k_prime, seed=args.seed), split

    @staticmethod
    def _k(args: argparse.Namespace, paper_k: int | None) -> int:
        k = args.k if args.k is not None else (paper_k or 3)
        if k < 1:
            raise ValueError("--k must be at least 1")
        return k

    @staticmethod
    def _setup(args: argparse.Namespace, k: int, n_clients: int) -> DataSetup:
        """The run's public options (:class:`~fedproto.algorithms.mufc.setup.DataSetup`)."""
        step = args.quantization_step
        if step is not None and not (math.isfinite(step) and step > 0):
            raise ValueError(f"--quantization-step must be positive and finite, got {step}")
        if args.max_iterations < 1:
            raise ValueError("--max-iterations must be at least 1")
        return DataSetup(
            n_clients=n_clients, k=k, k_client=args.k_client, gamma=step, secagg=getattr(args, "secagg", "scma"),
            removals=args.removals, points_per_removal=args.points_per_removal, leave=args.leave,
            stream_seed=args.seed + 1, server_mode=args.server_mode, unlearning=args.unlearning,
            n_init=args.n_init, max_iter=args.max_iterations, lloyd_iterations=args.client_lloyd,
            fresh_randomness=args.fresh_randomness, min_clients=args.min_clients,
        )

    def split(self, args: argparse.Namespace, dataset: Dataset) -> dict[str, Dataset]:
        """Each client's raw rows, as the run that :meth:`plan` describes cuts them.

        Returns:
            ``{"client-<c>": Dataset(name, x [n_c, d] raw float64, y or None, paper_k)}`` in
            client order (the server holds no data).

        Raises:
            ValueError: as :meth:`plan` for the data, K and the partition.
        """
        k = self._k(args, dataset.paper_k)
        if k > dataset.n:
            raise ValueError(f"K = {k} is larger than the number of points ({dataset.n})")
        rows, _ = self._cut(args, dataset, k)
        return _client_parts(dataset, rows)

    def resolved_options(self, args: argparse.Namespace, dataset: Dataset) -> list[str]:
        """``["--k", K]``: K's default is the data set's paper K, which the server has no file to read."""
        return ["--k", str(self._k(args, dataset.paper_k))]

    def plan_party(
        self, args: argparse.Namespace, party: str, roster: tuple[str, ...], session: int, data: Dataset | None
    ) -> RunPlan:
        """The plan of one party holding only ``data`` (a client's raw rows; ``None`` for the server).

        The clients are the roster's parties other than ``server``, in roster order. The run's
        n, grid, prime, the point ids and the removal stream are agreed in ``setup.data``
        (:mod:`fedproto.algorithms.mufc.setup`). ``--k`` defaults to the file's paper K (else 3)
        at a client and is required at the server. The frame limit is left to
        ``--max-frame-bytes`` (the shapes depend on n and d, which no party knows before the run).

        Raises:
            ValueError: no ``server`` in the roster, a server given data or a client given none,
                ``--k`` missing at the server, or an option out of range.
        """
        if SERVER not in roster:
            raise ValueError(f"a MUFC roster needs a party named {SERVER!r}; this one has {', '.join(roster)}")
        clients = tuple(p for p in roster if p != SERVER)
        if party == SERVER:
            if data is not None:
                raise ValueError("the MUFC server holds no data: start it without --data")
            if args.k is None:
                raise ValueError("--k is required when a party holds only its own data (the server has no file)")
            k = self._k(args, None)
        else:
            if data is None:
                raise ValueError(f"{party} is a MUFC client: give it its own data with --data FILE")
            k = self._k(args, data.paper_k)
        setup = self._setup(args, k, len(clients))
        parties = LocalDataParties(setup, key=jax.random.PRNGKey(args.seed), seed=args.seed, session=session,
                                   clients=clients)
        build = parties.machine_factory({party: None if data is None else data.x})

        def make_machine(name: str) -> Any:
            if name != party:
                raise ValueError(f"this process holds only {party}'s data, not {name}'s")
            return build(name)

        return _run_plan(parties, make_machine, summarize=lambda results: {}, labels=LABELS)

    def plan(self, args: argparse.Namespace, dataset: Dataset) -> RunPlan:
        """The simulation: :meth:`split`'s parts, every machine built from its own part as in
        :meth:`plan_party` (``setup.data`` included), and the summaries on the pooled data."""
        k = self._k(args, dataset.paper_k)
        n, d = dataset.x.shape
        if k > n:
            raise ValueError(f"K = {k} is larger than the number of points ({n})")
        rows, split = self._cut(args, dataset, k)
        own = _client_parts(dataset, rows)  # the split: each client's raw rows
        raw = list(own.values())
        n_clients = len(raw)
        setup = self._setup(args, k, n_clients)
        if args.retrains < 1:
            raise ValueError("--retrains must be at least 1")
        step = setup.gamma
        k_client = setup.k_client if setup.k_client is not None else k
        session = session_id("mufc", dataset.name, n, d, k, n_clients, split, args.seed, setup.n_requests,
                             args.points_per_removal, args.unlearning, args.server_mode, k_client, step)
        key = jax.random.PRNGKey(args.seed)
        # What setup.data agrees, computed here for the summaries (the machines agree it themselves).
        agreement = setup.configure(Federation.of([part.x for part in raw]), session)
        federation, config, plus, stream = agreement.federation, agreement.config, agreement.secagg_plus, agreement.stream
        parts = [(federation.scale(part.x), federation.ids(c)) for c, part in enumerate(raw)]
        x = np.concatenate([xc for xc, _ in parts])  # the pooled scaled points, row = point id
        parties = LocalDataParties(setup, key=key, seed=args.seed, session=session, clients=tuple(own))
        choice = setup.secagg

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
            removed = sum(len(parts[c][1]) - len(i) for c, i in zip(present, xs_ids, strict=True))
            removed += sum(len(parts[c][1]) for c in left)
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
                    kept = [(x[parts[c][1][np.isin(parts[c][1], xs_ids[i])]],
                             parts[c][1][np.isin(parts[c][1], xs_ids[i])])
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
                    base = reference_loss(unit_box(dataset.x), k, args.seed)
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
            # setup.data: the extent up, every count and the federation's extent down (no envelopes)
            "analytic_setup_data_bytes_per_client": sum(setup_data_bytes(n_clients, d).values()),
        }
        limit = frame_limit(config, d)
        if plus is not None:
            limit = max(limit, secagg_plus.frame_limit(plus))
            setup_bytes, aggregation_bytes = secagg_plus.setup_and_aggregation_bytes(plus)
            analytic["analytic_secagg_bytes_per_client_per_aggregation"] = aggregation_bytes
            analytic["analytic_secagg_setup_bytes_per_client"] = setup_bytes

        # every client from its own raw rows only, the server from the public options only
        make_machine = parties.machine_factory({name: part.x for name, part in own.items()})
        return _run_plan(
            parties,
            make_machine,
            summarize=summarize,
            plot_results=plot_stream,
            labels={
                **LABELS,
                "analytic_syndrome_bytes_per_client": "analytic syndrome payload per client per aggregation "
                "(T·ceil(log2 p / 8) bytes)",
                "dense_aggregation_bytes_per_client": "dense secure aggregation of the B^d count vector "
                "would send (bytes per client)",
                "analytic_secagg_bytes_per_client_per_aggregation": "analytic SecAgg+ data bytes per client per "
                "aggregation (sent and received, no dropout)",
                "analytic_secagg_setup_bytes_per_client": "analytic SecAgg+ key set-up bytes per client (once, "
                "in round 0)",
                "analytic_setup_data_bytes_per_client": "analytic setup.data bytes per client (16 d up, "
                "8 L + 16 d down; envelopes apart)",
            },
            analytic=analytic,
            max_frame_bytes=limit,
        )


PROTOCOL = MUFCPlugin()

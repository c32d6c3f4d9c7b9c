"""The ``mufc`` plugin of the ``fedproto`` command line.

``fedproto run mufc --data celltype --clients 100 --remove 100 --seed 0`` loads the data (a
bundled scikit-learn set, a file, ``celltype`` from the data directory with its own 100-client
split, or the paper's synthetic ``gaussian`` set generated from ``--seed``), scales every column
into ``[0, 1]`` (Celltype already is), splits it over the clients, runs MUFC training (K-means++
seeding at the clients, SCMA, K-means++ at the server) and ``--remove`` removal requests of
``--batch`` random points each (then ``--leave`` whole clients leaving), and prints:

* the loss ratio phi_f / phi_c* (induced assignment, Definition 3.1; phi_c* from scikit-learn's
  KMeans with 10 restarts on the remaining data) beside the paper's Table 1 and beside K-FED and
  DC-KM over the same clients;
* whether the final model equals training from scratch on the remaining data with the same key;
* the time of each removal against complete retraining, from a timed centralised replay of the
  same computations (the plot's extra panel: cumulative time and loss ratio over the stream);
* the run report: bytes per round, per phase, per link; the analytic syndrome bytes per client
  per aggregation, T * ceil(bitlength(p) / 8) with T = 2KL, beside the measured ones.

Splits (``--split``): ``file`` (the ``client_X``/``client_sizes`` split stored in an ``.npz``,
Celltype's non-i.i.d. split; the default when the file has one), ``iid`` or ``noniid`` (the
authors' split, each client holding at most ``--k-prime`` clusters; default when no file split).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedproto.algorithms.mufc import baselines
from fedproto.algorithms.mufc.clustering import federated_loss, kmeans_cost, reference_loss
from fedproto.algorithms.mufc.data import client_split, file_clients, gaussian_mixture
from fedproto.algorithms.mufc.protocol import MODES, SERVER, MUFCClientResult, MUFCParties, MUFCServerResult, make_config
from fedproto.algorithms.mufc.replay import replay
from fedproto.data import Dataset, find_data_file, session_id
from fedproto.plugin import RunPlan

__all__ = ["PAPER_TABLE1", "PROTOCOL", "MUFCPlugin", "removal_stream", "unit_box"]

#: Table 1 of the paper (loss ratio, mean and std over 5 runs) and the speed-up row.
PAPER_TABLE1 = {
    "celltype": {"MUFC": (1.14, 0.03), "K-FED": (1.72, 0.24), "DC-KM": (1.46, 0.01), "speedup no re-seed": 1535},
    "gaussian": {"MUFC": (1.25, 0.02), "K-FED": (1.25, 0.01), "DC-KM": (1.02, 0.00), "speedup no re-seed": 2074},
}
#: The paper's average unlearning speed-up over complete retraining for random removals (Sec. 6).
PAPER_MEAN_SPEEDUP = 84.0


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
        raise ValueError("--remove and --leave must be non-negative, --batch at least 1")
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
    """Cumulative removal time against complete retraining, and the loss ratio, over the stream."""
    mine, base = summary.get("cumulative removal time s"), summary.get("cumulative retraining time s")
    if not mine:
        ax.text(0.5, 0.5, "no removal timing (--no-timing or no requests)", ha="center", va="center")
        ax.set_axis_off()
        return
    steps = range(1, len(mine) + 1)
    ax.plot(steps, mine, label="MUFC unlearning")
    ax.plot(steps, base, label="complete retraining")
    ax.set_yscale("log")
    ax.set_xlabel("removal requests served")
    ax.set_ylabel("cumulative time s")
    ax.set_title("removals: cumulative time and loss ratio")
    ratios = summary.get("loss ratio per step")
    if ratios:
        twin = ax.twinx()
        twin.plot(steps, ratios, color="tab:green", linestyle=":", label="loss ratio")
        twin.set_ylabel("loss ratio phi_f / phi_c*")
        twin.legend(loc="lower right", fontsize="small")
    ax.legend(loc="upper left", fontsize="small")


class MUFCPlugin:
    """MUFC (secure federated clustering with exact unlearning) as a ``fedproto`` plugin."""

    name = "mufc"
    description = "MUFC: one-shot secure federated K-means++ (SCMA) with exact federated unlearning"
    generated_datasets = {
        "gaussian": lambda seed: gaussian_mixture(seed),
        "gaussian-small": lambda seed: gaussian_mixture(seed, n_per=300),
    }

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("mufc")
        group.add_argument("--k", type=int, default=None, help="clusters K (default: the paper's K for the data)")
        group.add_argument("--k-client", type=int, default=None, help="seeds per client (default K)")
        group.add_argument("--split", choices=("auto", "file", "iid", "noniid"), default="auto",
                           help="client split (default: the file's split if it has one, else noniid)")
        group.add_argument("--k-prime", type=int, default=None,
                           help="clusters per client in the noniid split (default ceil(sqrt(K)))")
        group.add_argument("--gamma", type=float, default=None, help="quantization step (default 1/sqrt(n))")
        group.add_argument("--server-mode", choices=("weighted", "uniform"), default="weighted",
                           help="server data: weighted bin centres (default) or uniform samples in the bins")
        group.add_argument("--unlearning", choices=MODES, default="exact",
                           help="exact (default), literal (the paper's wording) or lazy (the authors' code)")
        group.add_argument("--remove", type=int, default=10, help="removal requests (default 10)")
        group.add_argument("--batch", type=int, default=1, help="points per removal request (default 1)")
        group.add_argument("--leave", type=int, default=0, help="clients that leave after the removals (default 0)")
        group.add_argument("--n-init", type=int, default=10, help="K-means++ restarts at the server (default 10)")
        group.add_argument("--max-iter", type=int, default=300, help="Lloyd iterations cap at the server")
        group.add_argument("--client-lloyd", type=int, default=0,
                           help="Lloyd iterations at the clients (App. M.3 complete client training; default 0)")
        group.add_argument("--fresh-randomness", action="store_true",
                           help="re-seed and re-cluster with fresh keys per round (exact in distribution)")
        group.add_argument("--min-clients", type=int, default=None,
                           help="go on without clients silent past the deadline while this many remain")
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
        split = args.split
        rows = _file_split(args.data, dataset.x) if split in ("auto", "file") else None
        if split == "file" and rows is None:
            raise ValueError("--split file needs an .npz data file with client_X and client_sizes")
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
        options = dict(server_mode=args.server_mode, unlearning=args.unlearning, n_init=args.n_init,
                       max_iter=args.max_iter, lloyd_iterations=args.client_lloyd,
                       fresh_randomness=args.fresh_randomness, min_clients=args.min_clients)
        config = make_config(n, d, k, n_clients, k_client=args.k_client, gamma=args.gamma, **options)
        if args.retrains < 1:
            raise ValueError("--retrains must be at least 1")
        stream = removal_stream([len(r) for r in rows], [ids[r] for r in rows], args.remove, args.batch,
                                args.leave, config.k_client, args.seed + 1)
        key = jax.random.PRNGKey(args.seed)
        parties = MUFCParties(parts, config, key=key, requests=stream, seed=args.seed)
        session = session_id("mufc", dataset.name, n, d, k, n_clients, split, args.seed, len(stream),
                             args.batch, args.unlearning, args.server_mode, config.k_client, args.gamma)

        def result_to_json(party: str, result: Any) -> dict[str, Any]:
            if isinstance(result, MUFCServerResult):
                return {
                    "centroids": result.centroids.tolist(),
                    "history": [h.tolist() for h in result.history],
                    "reclustered": list(result.reclustered),
                    "totals": list(result.totals),
                    "support sizes": list(result.support_sizes),
                    "active": list(result.active),
                    "dropped": list(result.dropped),
                }
            if isinstance(result, MUFCClientResult):
                return {
                    "centroids": None if result.centroids is None else result.centroids.tolist(),
                    "version": result.version,
                    "ids": result.ids.tolist(),
                    "positions": result.positions.tolist(),
                    "local centroids": result.local_centroids.tolist(),
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
            cents = [np.asarray(results[parties.clients[c]]["local centroids"]).reshape(-1, d) for c in present]
            poss = [np.asarray(results[parties.clients[c]]["positions"], dtype=np.int64) for c in present]
            remaining = np.concatenate(xs)
            phi_f = float(federated_loss(xs, cents, poss, config.grid, centroids))
            phi_c = float(kmeans_cost(remaining, centroids))
            phi_star = float(reference_loss(remaining, k, args.seed))
            reseeds = sum(sum(results[c]["reseeded"]) for c in parties.clients if c in results)
            summary: dict[str, Any] = {
                "data set": dataset.name, "N": n, "d": d, "K": k, "seeds per client": config.k_client,
                "clients": n_clients, "split": split, "gamma": config.grid.gamma,
                "bins per dimension B": config.grid.per_dim, "bins B^d": str(config.grid.n_bins),
                "prime p bits": config.prime.bit_length(), "syndromes per client T = 2KL": config.n_syndromes,
                "unlearning mode": config.unlearning, "server mode": config.server_mode,
                "removal requests": len(stream), "points removed": n - remaining.shape[0],
                "requests that re-seeded": reseeds,
                "server re-clusterings": sum(server["reclustered"]),
                "decoded point count (final)": server["totals"][-1],
                "phi_f (induced, Def. 3.1)": phi_f, "phi_c (nearest centroid)": phi_c,
                "phi_c* (scikit-learn KMeans, 10 restarts)": phi_star,
                "loss ratio phi_f / phi_c*": phi_f / phi_star if phi_star > 0 else math.inf,
                "clients agree on the model": all(
                    np.array_equal(np.asarray(results[parties.clients[c]]["centroids"]), centroids) for c in present
                ),
            }
            paper = PAPER_TABLE1.get(dataset.name)
            if paper is not None:
                summary["paper loss ratio MUFC (Table 1)"] = f"{paper['MUFC'][0]} ± {paper['MUFC'][1]}"
            if config.unlearning == "exact" and not config.fresh_randomness:
                # Same public parameters (gamma and p stay fixed over a run), same keys, the
                # remaining points only: the protocol's model must be the same array.
                if len(present) == n_clients:
                    kept = [(x[parties.parts[c][1][np.isin(parties.parts[c][1], xs_ids[i])]],
                             parties.parts[c][1][np.isin(parties.parts[c][1], xs_ids[i])])
                            for i, c in enumerate(present)]
                    fresh = replay(kept, config, key, (), evaluate=False, retrains=1)
                    same: Any = bool(np.array_equal(fresh.centroids, centroids))
                else:
                    same = "n/a (clients left: the client count is part of the public parameters)"
                summary["model equals training on the remaining data (same keys)"] = same
            if not args.no_baselines:
                seeds_x = xs
                kfed = baselines.kfed(args.seed, seeds_x, k, config.k_client)
                summary["K-FED loss ratio"] = baselines.induced_loss(
                    seeds_x, kfed.local_positions, kfed.local_labels, kfed.centroids) / phi_star
                dc = baselines.ClientDCKMeans(args.seed, seeds_x, [np.arange(len(s)) for s in seeds_x], k)
                summary["DC-KM loss ratio"] = baselines.induced_loss(
                    seeds_x, dc.local_positions, dc.local_labels, dc.centroids) / phi_star
                if paper is not None:
                    summary["paper loss ratio K-FED / DC-KM (Table 1)"] = (
                        f"{paper['K-FED'][0]} ± {paper['K-FED'][1]} / {paper['DC-KM'][0]} ± {paper['DC-KM'][1]}")
            if not args.no_timing and stream:
                timed = replay(parts, config, key, stream, retrains=args.retrains)
                base = reference_loss(x, k, args.seed)
                times = [s.total_s for s in timed.steps]
                summary.update({
                    "training s (slowest client + server, replay)": timed.train_client_s + timed.train_server_s,
                    "mean s per removal (replay)": timed.mean_removal_s,
                    "complete retraining s (replay, median)": timed.retrain_s,
                    "unlearning speed-up over complete retraining": timed.speedup,
                    "paper: mean speed-up over retraining (Sec. 6)": PAPER_MEAN_SPEEDUP,
                    "replay matches the protocol's model": bool(np.array_equal(timed.centroids, centroids)),
                    "cumulative removal time s": np.cumsum(times).tolist(),
                    "cumulative retraining time s": (timed.retrain_s * np.arange(1, len(times) + 1)).tolist(),
                    "loss ratio per step": [s.loss / base for s in timed.steps],
                })
            summary["centroids"] = centroids.tolist()
            return summary

        return RunPlan(
            roster=parties.roster,
            session=session,
            make_machine=parties.make_machine,
            result_to_json=result_to_json,
            summarize=summarize,
            role_of=parties.role_of,
            iterations=len(stream) + 1,
            phases=("setup", "aggregate", "removal", "model"),
            plot_results=plot_stream,
            analytic={
                "analytic syndrome payload per client per aggregation (T·ceil(log2 p / 8) bytes)":
                    config.syndrome_bytes(),
                "dense secure aggregation of the B^d count vector would send (bytes per client)":
                    f"{config.grid.n_bins * config.width:.3e}",
            },
        )


PROTOCOL = MUFCPlugin()

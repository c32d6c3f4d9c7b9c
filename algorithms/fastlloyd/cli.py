"""The FastLloyd plugin for the ``fedproto`` command line (entry point ``fastlloyd``).

``fedproto run fastlloyd --data wine --clients 4 --epsilon 1 --seed 0`` splits the normalised data
over the clients, runs the chosen variant (FastLloyd by default; ``--variant`` picks the Lloyd,
GLloyd or SuLloyd baseline) and prints NICV beside non-private Lloyd's (same initialisation and
iterations, computed centrally) and scikit-learn's k-means++, with the privacy spent.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from fedproto.algorithms import dp, kmeans
from fedproto.algorithms.fastlloyd.config import VARIANTS, FastLloydConfig, make_config
from fedproto.algorithms.fastlloyd.protocol import (
    FastLloydClient,
    FastLloydResult,
    FastLloydServer,
    ServerSummary,
    initial_centroids,
)
from fedproto.data import Dataset, normalize, partition, session_id
from fedproto.plugin import RunPlan

__all__ = ["PROTOCOL", "FastLloydPlugin", "privacy_spent", "centralised_lloyd"]

SERVER = "server"


def client_name(i: int) -> str:
    """Party name of client ``i``."""
    return f"client-{i}"


def privacy_spent(config: FastLloydConfig) -> dict[str, Any]:
    """The privacy a configuration spends, recomputed from its noise scales.

    Gaussian variants: compose the per-iteration releases in GDP (sums with sensitivity = the
    iteration's radius for relative sums, sqrt(d) B for absolute sums; counts with sensitivity 1)
    and convert to epsilon at the configured delta. SuLloyd: basic composition of the Laplace
    releases (L1 sensitivities d B and 1). Non-private: infinite.
    """
    if config.noise == "none":
        return {"epsilon_spent": math.inf, "delta": None}
    t = config.iterations
    if config.noise == "laplace":
        eps = sum(config.d * config.bound / s for s in config.noise_sum) + sum(1 / s for s in config.noise_count)
        return {"epsilon_spent": eps, "delta": 0.0, "iterations": t}
    if config.relative:
        sens = [min(r, 2 * math.sqrt(config.d) * config.bound) for r in config.radii]
    else:
        sens = [math.sqrt(config.d) * config.bound] * t
    mu = dp.composed_mu(sens, config.noise_sum, config.noise_count)
    assert config.delta is not None
    return {
        "epsilon_spent": dp.spent_epsilon(mu, config.delta),
        "delta": config.delta,
        "gdp_mu": mu,
        "iterations": t,
    }


def centralised_lloyd(x: np.ndarray, init: np.ndarray, iterations: int) -> np.ndarray:
    """Plain Lloyd's on the pooled data from ``init`` (the non-private reference), ``[k, d]``."""
    centroids = jnp.asarray(init)
    xs = jnp.asarray(x)
    for _ in range(iterations):
        centroids = kmeans.lloyd_step(xs, centroids)
    return np.asarray(centroids)


class FastLloydPlugin:
    """FastLloyd and its baselines as a ``fedproto`` protocol plugin."""

    name = "fastlloyd"
    description = "differentially private federated k-means with masked secure aggregation (FastLloyd)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("fastlloyd")
        group.add_argument("--variant", choices=VARIANTS, default="fastlloyd", help="protocol or baseline")
        group.add_argument("--k", type=int, default=None, help="clusters (default: the paper's k for the data set)")
        group.add_argument("--epsilon", type=float, default=1.0, help="total privacy budget (default 1)")
        group.add_argument("--delta", type=float, default=None, help="default 1/(N ln N)")
        group.add_argument("--alpha", type=float, default=0.8, help="radius scale (default 0.8)")
        group.add_argument("--iterations", type=int, default=None, help="override the iteration heuristic")
        group.add_argument("--ring-bits", default="auto", choices=("auto", "32", "64"), help="ring Z_2^w")
        group.add_argument("--no-noise", action="store_true", help="calibrate but add no noise (testing)")
        group.add_argument(
            "--fresh-noise",
            action="store_true",
            help="draw the server's noise key from the OS instead of --seed (deployments; not repeatable)",
        )

    def plan(self, args: argparse.Namespace, dataset: Dataset) -> RunPlan:
        k = args.k if args.k is not None else (dataset.paper_k or 3)
        if k < 1:
            raise ValueError("--k must be at least 1")
        if k > dataset.n:
            raise ValueError(f"k = {k} is larger than the number of points ({dataset.n})")
        if args.clients < 1:
            raise ValueError("--clients must be at least 1")
        if args.epsilon is not None and not args.epsilon > 0:
            raise ValueError("--epsilon must be positive")
        if args.alpha is not None and not args.alpha > 0:
            raise ValueError("--alpha must be positive")
        if args.iterations is not None and args.iterations < 1:
            raise ValueError("--iterations must be at least 1")
        x = normalize(dataset.x)
        n, d = x.shape
        ring = args.ring_bits if args.ring_bits == "auto" else int(args.ring_bits)
        config = make_config(
            args.variant,
            n=n,
            k=k,
            d=d,
            epsilon=None if args.variant == "lloyd" else args.epsilon,
            delta=args.delta,
            alpha=args.alpha,
            iterations=args.iterations,
            ring_bits=ring,
            init_seed=args.seed,
            noise=not args.no_noise,
        )
        parts = partition(n, args.clients, scheme=args.partition, seed=args.seed, labels=dataset.y)
        clients = tuple(client_name(i) for i in range(args.clients))
        roster = (SERVER, *clients)
        session = session_id("fastlloyd", dataset.name, n, d, k, args.clients, args.seed, args.variant, args.epsilon)
        noise_seed = int.from_bytes(os.urandom(8), "big") if args.fresh_noise else args.seed

        def make_machine(party: str):
            if party == SERVER:
                return FastLloydServer(SERVER, config=config, clients=clients, noise_seed=noise_seed)
            i = clients.index(party)
            return FastLloydClient(
                party,
                config=config,
                server=SERVER,
                clients=clients,
                points=x[parts[i]],
                entropy=os.urandom(32),
                session=session,
            )

        def result_to_json(party: str, result: Any) -> dict[str, Any]:
            if isinstance(result, FastLloydResult):
                return {
                    "centroids": result.centroids.tolist(),
                    "unassigned": result.unassigned.tolist(),
                    "noisy_counts": result.noisy_counts.tolist(),
                }
            if isinstance(result, ServerSummary):
                return {"iterations": result.iterations}
            raise TypeError(f"unexpected result of {party}: {type(result).__name__}")

        def summarize(results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
            return self.summarize(results, config=config, x=x, dataset=dataset, clients=clients, seed=args.seed)

        return RunPlan(
            roster=roster,
            session=session,
            make_machine=make_machine,
            result_to_json=result_to_json,
            summarize=summarize,
            role_of=lambda p: "server" if p == SERVER else "client",
            iterations=config.iterations,
            phases=("setup.keys", "setup.roster", "setup.seal", "setup.relay", "update", "aggregate"),
            plot_results=lambda ax, summary: plot_clusters(ax, x, summary),
            analytic={
                "ring element bytes": config.element_bytes,
                "analytic payload bytes per iteration (2·M·k·(d+1)·w/8)": config.payload_bytes_per_iteration(
                    len(clients)
                ),
            },
        )

    def summarize(
        self,
        results: Mapping[str, dict[str, Any]],
        *,
        config: FastLloydConfig,
        x: np.ndarray,
        dataset: Dataset,
        clients: tuple[str, ...],
        seed: int,
    ) -> dict[str, Any]:
        """NICV of the run beside non-private Lloyd's and scikit-learn's, and the privacy spent."""
        from sklearn.cluster import KMeans

        centroid_sets = [np.asarray(results[c]["centroids"]) for c in clients if c in results]
        if not centroid_sets:
            raise ValueError("no client result to summarise")
        centroids = centroid_sets[0]
        agree = all(np.array_equal(centroids, other) for other in centroid_sets[1:])
        init = initial_centroids(config)
        lloyd = centralised_lloyd(x, init, 7)
        reference = KMeans(n_clusters=config.k, n_init=10, random_state=seed).fit(x)
        nicv = float(kmeans.nicv(jnp.asarray(x), jnp.asarray(centroids)))
        nicv_lloyd = float(kmeans.nicv(jnp.asarray(x), jnp.asarray(lloyd)))
        nicv_sklearn = float(reference.inertia_ / x.shape[0])
        spent = privacy_spent(config)
        summary: dict[str, Any] = {
            "data set": dataset.name,
            "N": int(x.shape[0]),
            "d": int(x.shape[1]),
            "k": config.k,
            "clients": len(clients),
            "variant": config.variant,
            f"NICV ({config.variant})": nicv,
            "NICV (non-private Lloyd, same init, 7 iterations)": nicv_lloyd,
            "NICV (scikit-learn k-means++)": nicv_sklearn,
            "NICV ratio to scikit-learn": nicv / nicv_sklearn if nicv_sklearn > 0 else math.inf,
            "iterations T": config.iterations,
            "epsilon (target)": config.epsilon if config.epsilon is not None else math.inf,
            "delta": config.delta if config.delta is not None else 0.0,
            "epsilon spent": spent["epsilon_spent"],
            "ring bits": config.ring_bits,
            "clients agree on centroids": agree,
            "centroids": centroids.tolist(),
            "reference centroids": reference.cluster_centers_.tolist(),
        }
        return summary


def plot_clusters(ax, x: np.ndarray, summary: Mapping[str, Any]) -> None:
    """Draw the points (first two principal components) coloured by nearest centroid, with the
    run's centroids (black crosses) and scikit-learn's (red circles)."""
    from sklearn.decomposition import PCA

    centroids = np.asarray(summary["centroids"])
    reference = np.asarray(summary["reference centroids"])
    if x.shape[1] > 2:
        pca = PCA(n_components=2, random_state=0).fit(x)
        project = pca.transform
    else:
        project = lambda a: a  # noqa: E731
    labels = np.asarray(kmeans.assign_clusters(jnp.asarray(x), jnp.asarray(centroids), jnp.inf)[0])
    px = project(x)
    ax.scatter(px[:, 0], px[:, 1] if px.shape[1] > 1 else np.zeros(len(px)), c=labels, s=6, cmap="tab10", alpha=0.5)
    pc, pr = project(centroids), project(reference)
    ax.scatter(pr[:, 0], pr[:, 1] if pr.shape[1] > 1 else np.zeros(len(pr)), marker="o", facecolors="none",
               edgecolors="red", s=80, label="scikit-learn")
    ax.scatter(pc[:, 0], pc[:, 1] if pc.shape[1] > 1 else np.zeros(len(pc)), marker="x", color="black", s=60,
               label=str(summary.get("variant", "run")))
    ax.set_title("clusters" + (" (PCA)" if x.shape[1] > 2 else ""))
    ax.legend(fontsize="small")


PROTOCOL = FastLloydPlugin()

"""The FastLloyd plugin for the ``fedproto`` command line (entry point ``fastlloyd``).

``fedproto run fastlloyd --data wine --clients 4 --epsilon 1 --seed 0`` splits the normalised data
over the clients, runs the chosen variant (FastLloyd by default; ``--variant`` picks the Lloyd,
GLloyd or SuLloyd baseline) and prints NICV beside non-private Lloyd's (same initialisation,
computed centrally) and scikit-learn's k-means++, with the privacy spent.

Result keys of the report (``results``; :data:`LABELS` gives the table labels):

================================  =================================================================
``data_set``                      name of the data set
``n_points``, ``d``, ``k``        points, features, clusters
``n_clients``                     data-holding clients
``variant``                       ``fastlloyd``, ``lloyd``, ``glloyd`` or ``sulloyd``
``nicv``                          normalised intra-cluster variance of the run's centroids
                                  (mean squared distance to the nearest centroid, on the data
                                  scaled to [-1, 1])
``nicv_lloyd``                    NICV of non-private Lloyd's from the same initialisation,
                                  :data:`LLOYD_REFERENCE_ITERATIONS` iterations, pooled data
``nicv_sklearn``                  NICV of scikit-learn's k-means++ (10 restarts)
``nicv_ratio_to_sklearn``         ``nicv / nicv_sklearn`` (``null`` when ``nicv_sklearn`` is 0)
``iterations``                    Lloyd iterations T of the run
``epsilon``                       target privacy budget (``null``: non-private variant)
``delta``                         target delta (``0``: pure DP; ``null``: non-private)
``epsilon_spent``                 epsilon recomputed from the noise scales at ``delta``
                                  (``null``: non-private)
``gdp_mu``                        composed GDP parameter mu (Gaussian variants only)
``ring_bits``                     ring Z_2^w of the secure aggregation (w, bits)
``clients_agree``                 every client ended with the same centroids
``centroids``                     the run's centroids ``[k, d]``
``sklearn_centroids``             scikit-learn's centroids ``[k, d]``
``secagg``                        the secure aggregation: ``msa`` (the paper's), ``plus``
                                  (SecAgg+) or ``complete`` (classic SecAgg)
``secagg_degree``                 SecAgg+ only: neighbours per client k
``secagg_threshold``              SecAgg+ only: shares that recover a secret t
``dropouts``                      SecAgg+ only: who dropped when, as the server saw it, one
                                  ``PARTY@STAGE:ROUND`` each (the syntax of ``--dropout``)
``survivors_final``               SecAgg+ only: clients whose updates the last aggregate holds
================================  =================================================================

``--secagg plus`` (or ``complete``) aggregates each iteration with SecAgg+
(:mod:`fedproto.algorithms.secagg_plus`) on top of the paper's shared-seed masks, so the run goes on
when clients drop after setup (``--dropout client-3@masked-input`` injects such a drop on the
memory transport); the default ``msa`` reproduces the paper.
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
from fedproto.algorithms.fastlloyd.messages import (
    MaskedUpdate,
    NoisyAggregate,
    PublicKey,
    PublicKeys,
    SealedSeed,
    SealedSeeds,
)
from fedproto.algorithms.secagg import ring_dtype
from fedproto.algorithms.secagg_plus import engine as secagg_plus
from fedproto.data import Dataset, normalize, partition, session_id
from fedproto.framesize import max_frame_bytes
from fedproto.plugin import RunPlan
from fedproto.progress import progress_task

__all__ = ["LABELS", "PROTOCOL", "FastLloydPlugin", "privacy_spent", "centralised_lloyd", "frame_limit"]

SERVER = "server"

#: Iterations of the non-private Lloyd reference (``nicv_lloyd``).
LLOYD_REFERENCE_ITERATIONS = 7

#: Readable labels of the result and analytic keys, for the terminal tables.
LABELS: dict[str, str] = {
    "data_set": "data set",
    "n_points": "points N",
    "n_clients": "clients",
    "nicv_lloyd": f"NICV (non-private Lloyd, same init, {LLOYD_REFERENCE_ITERATIONS} iterations)",
    "nicv_sklearn": "NICV (scikit-learn k-means++)",
    "nicv_ratio_to_sklearn": "NICV ratio to scikit-learn",
    "iterations": "iterations T",
    "epsilon": "epsilon (target)",
    "epsilon_spent": "epsilon spent",
    "gdp_mu": "GDP mu (composed)",
    "ring_bits": "ring bits w",
    "clients_agree": "clients agree on centroids",
    "ring_element_bytes": "ring element bytes",
    "analytic_payload_bytes_per_iteration": "analytic payload bytes per iteration (2·M·k·(d+1)·w/8)",
    "analytic_secagg_bytes_per_client_per_iteration": "analytic SecAgg+ data bytes per client per iteration",
    "secagg": "secure aggregation",
    "secagg_degree": "SecAgg+ neighbours k",
    "secagg_threshold": "SecAgg+ threshold t",
    "survivors_final": "clients in the last aggregate",
}

#: ``--secagg`` choices: the paper's masked secure aggregation, SecAgg+ on a sparse graph, or
#: classic SecAgg (complete graph).
SECAGG_CHOICES = ("msa", "plus", "complete")


def secagg_config(choice: str, config: FastLloydConfig, n_clients: int, session: int):
    """The SecAgg+ parameters of a run, or ``None`` for the paper's MSA.

    The graph seed is public: SHA-256 of the session id, which every party knows.
    """
    if choice == "msa":
        return None
    import hashlib

    seed = hashlib.sha256(b"fedproto/fastlloyd/secagg-graph" + session.to_bytes(8, "big")).digest()
    modulus = secagg_plus.Modulus.ring(config.ring_bits)
    length = config.k * (config.d + 1)
    if n_clients < 2:
        raise ValueError("--secagg plus needs at least 2 clients")
    if choice == "complete":
        return secagg_plus.complete_config(n_clients, length, modulus, graph_seed=seed)
    return secagg_plus.plus_config(n_clients, length, modulus, graph_seed=seed)


def client_name(i: int) -> str:
    """Party name of client ``i``."""
    return f"client-{i}"


def privacy_spent(config: FastLloydConfig) -> dict[str, Any]:
    """The privacy a configuration spends, recomputed from its noise scales.

    Gaussian variants: compose the per-iteration releases in GDP (sums with sensitivity = the
    iteration's radius for relative sums, sqrt(d) B for absolute sums; counts with sensitivity 1)
    and convert to epsilon at the configured delta. SuLloyd: basic composition of the Laplace
    releases (L1 sensitivities d B and 1). Non-private: no guarantee, ``epsilon_spent`` is
    ``None`` (JSON ``null``; infinity is not valid JSON).

    Returns:
        ``{"epsilon_spent": float | None, "delta": float | None, "iterations": int}`` and, for
        the Gaussian variants, ``"gdp_mu"``.
    """
    if config.noise == "none":
        return {"epsilon_spent": None, "delta": None, "iterations": config.iterations}
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


def frame_limit(config: FastLloydConfig, n_clients: int) -> int:
    """The largest frame any party of a FastLloyd run sends (bytes, envelope included).

    Setup sends 32-byte keys (every client's to client 0) and 48-byte sealed seeds (client 0's
    for the other ``M - 1`` clients); each iteration sends ``[k, d+1]`` ring elements of
    ``w / 8`` bytes each way.
    """
    key, sealed = bytes(32), bytes(48)
    ring = {"masked": (config.k, config.d + 1)}
    dtype = {"masked": ring_dtype(config.ring_bits)}
    return max(
        max_frame_bytes(PublicKey, plain={"public_key": key}),
        max_frame_bytes(PublicKeys, plain={"public_keys": (key,) * n_clients}),
        max_frame_bytes(SealedSeeds, plain={"sealed": (sealed,) * max(n_clients - 1, 0)}),
        max_frame_bytes(SealedSeed, plain={"sender_key": key, "sealed": sealed}),
        max_frame_bytes(MaskedUpdate, arrays=ring, dtypes=dtype),
        max_frame_bytes(NoisyAggregate, arrays=ring, dtypes=dtype),
    )


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
        group.add_argument(
            "--secagg", choices=SECAGG_CHOICES, default="msa",
            help="secure aggregation: msa (the paper's, default), plus (SecAgg+: survives dropouts) or "
            "complete (classic SecAgg)",
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
        choice = getattr(args, "secagg", "msa")
        plus = secagg_config(choice, config, len(clients), session)

        def make_machine(party: str):
            if party == SERVER:
                return FastLloydServer(
                    SERVER, config=config, clients=clients, noise_seed=noise_seed, session=session, secagg_plus=plus
                )
            i = clients.index(party)
            return FastLloydClient(
                party,
                config=config,
                server=SERVER,
                clients=clients,
                points=x[parts[i]],
                entropy=os.urandom(32),
                session=session,
                secagg_plus=plus,
            )

        def result_to_json(party: str, result: Any) -> dict[str, Any]:
            if isinstance(result, FastLloydResult):
                return {
                    "centroids": result.centroids.tolist(),
                    "unassigned": result.unassigned.tolist(),
                    "noisy_counts": result.noisy_counts.tolist(),
                }
            if isinstance(result, ServerSummary):
                out: dict[str, Any] = {"iterations": result.iterations}
                if plus is not None:
                    out["survivors"] = [list(s) for s in result.survivors]
                    out["dropouts"] = [f"{p}@{stage}:{r}" for p, (r, stage) in sorted(result.dropouts.items())]
                return out
            raise TypeError(f"unexpected result of {party}: {type(result).__name__}")

        def summarize(results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
            summary = self.summarize(results, config=config, x=x, dataset=dataset, clients=clients, seed=args.seed)
            summary["secagg"] = choice
            if plus is not None:
                server = results.get(SERVER, {})
                summary["secagg_degree"] = plus.degree
                summary["secagg_threshold"] = plus.threshold
                summary["dropouts"] = server.get("dropouts", [])
                summary["survivors_final"] = (server.get("survivors") or [[]])[-1]
            return summary

        if plus is None:
            phases = ("setup.keys", "setup.roster", "setup.seal", "setup.relay", "update", "aggregate")
            analytic = {
                "ring_element_bytes": config.element_bytes,
                "analytic_payload_bytes_per_iteration": config.payload_bytes_per_iteration(len(clients)),
            }
            limit = frame_limit(config, len(clients))
        else:
            phases = ("setup.keys", "setup.roster", "setup.seal", "setup.relay", *secagg_plus.STAGES, "aggregate")
            per_client = secagg_plus.stage_bytes(plus)
            analytic = {
                "ring_element_bytes": config.element_bytes,
                "analytic_secagg_bytes_per_client_per_iteration": sum(
                    v["sent"] + v["received"] for v in per_client.values()
                ),
            }
            limit = max(frame_limit(config, len(clients)), secagg_plus.frame_limit(plus))

        return RunPlan(
            roster=roster,
            session=session,
            make_machine=make_machine,
            result_to_json=result_to_json,
            summarize=summarize,
            role_of=lambda p: "server" if p == SERVER else "client",
            iterations=config.iterations,
            phases=phases,
            plot_results=lambda ax, summary: plot_clusters(ax, x, summary),
            analytic=analytic,
            labels={**LABELS, "nicv": f"NICV ({config.variant})"},
            max_frame_bytes=limit,
            dropout_stages=secagg_plus.STAGES if plus is not None else (),
            dropout_unsupported="" if plus is not None else "fastlloyd survives dropouts only with --secagg plus or complete",
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
        """NICV of the run beside non-private Lloyd's and scikit-learn's, and the privacy spent.

        Returns:
            The result keys listed in the module docstring (snake_case, numbers as numbers).

        Raises:
            ValueError: no client result to summarise.
        """
        from sklearn.cluster import KMeans

        centroid_sets = [np.asarray(results[c]["centroids"]) for c in clients if c in results]
        if not centroid_sets:
            raise ValueError("no client result to summarise")
        centroids = centroid_sets[0]
        agree = all(np.array_equal(centroids, other) for other in centroid_sets[1:])
        with progress_task("references: non-private Lloyd, scikit-learn k-means++", total=2) as advance:
            lloyd = centralised_lloyd(x, initial_centroids(config), LLOYD_REFERENCE_ITERATIONS)
            advance()
            reference = KMeans(n_clusters=config.k, n_init=10, random_state=seed).fit(x)
            advance()
        xs = jnp.asarray(x)
        nicv = float(kmeans.nicv(xs, jnp.asarray(centroids)))
        nicv_lloyd = float(kmeans.nicv(xs, jnp.asarray(lloyd)))
        nicv_sklearn = float(reference.inertia_ / x.shape[0])
        spent = privacy_spent(config)
        summary: dict[str, Any] = {
            "data_set": dataset.name,
            "n_points": int(x.shape[0]),
            "d": int(x.shape[1]),
            "k": int(config.k),
            "n_clients": len(clients),
            "variant": config.variant,
            "nicv": nicv,
            "nicv_lloyd": nicv_lloyd,
            "nicv_sklearn": nicv_sklearn,
            "nicv_ratio_to_sklearn": nicv / nicv_sklearn if nicv_sklearn > 0 else None,
            "iterations": int(config.iterations),
            "epsilon": config.epsilon,
            "delta": config.delta if config.delta is not None else (None if config.epsilon is None else 0.0),
            "epsilon_spent": spent["epsilon_spent"],
        }
        if "gdp_mu" in spent:
            summary["gdp_mu"] = float(spent["gdp_mu"])
        summary.update({
            "ring_bits": int(config.ring_bits),
            "clients_agree": agree,
            "centroids": centroids.tolist(),
            "sklearn_centroids": reference.cluster_centers_.tolist(),
        })
        return summary


def plot_clusters(ax, x: np.ndarray, summary: Mapping[str, Any]) -> None:
    """Draw the points (first two principal components) coloured by nearest centroid, with the
    run's centroids (black crosses) and scikit-learn's (red circles)."""
    from sklearn.decomposition import PCA

    centroids = np.asarray(summary["centroids"])
    reference = np.asarray(summary["sklearn_centroids"])
    if x.shape[1] > 2:
        pca = PCA(n_components=2, random_state=0).fit(x)
        project = pca.transform
    else:
        project = lambda a: a  # noqa: E731
    import matplotlib

    labels = np.asarray(kmeans.assign_clusters(jnp.asarray(x), jnp.asarray(centroids), jnp.inf)[0])
    # One colour per cluster: tab10 up to 10 clusters, tab20 up to 20 (beyond that colours repeat).
    palette = matplotlib.colormaps["tab10" if len(centroids) <= 10 else "tab20"]
    px = project(x)
    ax.scatter(px[:, 0], px[:, 1] if px.shape[1] > 1 else np.zeros(len(px)), c=palette(labels % palette.N), s=6,
               alpha=0.5)
    pc, pr = project(centroids), project(reference)
    ax.scatter(pr[:, 0], pr[:, 1] if pr.shape[1] > 1 else np.zeros(len(pr)), marker="o", facecolors="none",
               edgecolors="black", linewidths=1.2, s=90, label="scikit-learn centroids")
    ax.scatter(pc[:, 0], pc[:, 1] if pc.shape[1] > 1 else np.zeros(len(pc)), marker="x", color="black", s=60,
               label=f"{summary.get('variant', 'run')} centroids")
    ax.set_title("clusters" + (" (first two principal components)" if x.shape[1] > 2 else ""))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize="small", frameon=False)


PROTOCOL = FastLloydPlugin()

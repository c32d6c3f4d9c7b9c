"""The FastLloyd plugin for the ``fedproto`` command line (entry point ``fastlloyd``).

``fedproto run fastlloyd --data wine --clients 4 --epsilon 1 --seed 0`` splits the raw data over
the clients (:meth:`FastLloydPlugin.split`), runs the chosen variant (FastLloyd by default;
``--variant`` picks the Lloyd, GLloyd or SuLloyd baseline) and prints NICV beside non-private
Lloyd's (same initialisation, computed centrally) and scikit-learn's k-means++, with the privacy
spent.

Each client is built from its own raw rows and the public options only; the parties agree N and
the feature extent in the setup phase ``setup.data`` and each client normalises its rows by that
extent (:mod:`fedproto.algorithms.fastlloyd.protocol`). So ``plan`` (every party in one process)
and ``plan_party`` (``fedproto party fastlloyd --data FILE``, one party per process, its file
from ``fedproto split``) build the same machines, and give the same results and payload bytes.

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

The report's ``privacy`` field holds the run's privacy ledger (:func:`privacy_ledger`: each
iteration's sums and counts release with its mechanism, sensitivity and noise scale, and epsilon
and delta per release, per iteration and composed); ``lloyd`` and ``--no-noise`` runs have none.

A party's own result (``fedproto party ... --party-report``): a client's ``centroids`` ``[k, d]``,
``unassigned`` ``[T]`` (its points outside the radius per iteration) and ``noisy_counts``
``[T, k]``; the server's ``iterations``, ``n_points`` (N) and ``d`` agreed in ``setup.data``, and
with SecAgg+ its ``survivors`` per iteration and ``dropouts``.

``--secagg plus`` (or ``complete``) aggregates each iteration with SecAgg+
(:mod:`fedproto.algorithms.secagg_plus`) on top of the paper's shared-seed masks, so the run goes on
when clients drop after setup (``--dropout client-3@masked-input`` injects such a drop on the
memory transport); the default ``msa`` reproduces the paper.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from fedproto.algorithms import dp, kmeans
from fedproto.algorithms.fastlloyd.config import SECAGG_CHOICES, VARIANTS, FastLloydConfig, FastLloydOptions
from fedproto.algorithms.fastlloyd.messages import frame_bound
from fedproto.algorithms.fastlloyd.protocol import FastLloydParties, FastLloydResult, ServerSummary, initial_centroids
from fedproto.algorithms.fastlloyd.reference import sklearn_reference
from fedproto.algorithms.fastlloyd.shared import secagg_config, secagg_plus_config
from fedproto.algorithms.secagg_plus.messages import AGGREGATION_STAGES as SECAGG_PLUS_ROUND_STAGES
from fedproto.algorithms.secagg_plus.messages import STAGES as SECAGG_PLUS_STAGES
from fedproto.data import Dataset, normalize, partition, session_id
from fedproto.plugin import RunPlan
from fedproto.star import client_names
from fedproto.progress import progress_task

if TYPE_CHECKING:
    from fedproto.algorithms.secagg_plus.engine import SecAggPlusConfig

# SecAgg+'s engine (SCMA's arithmetic, FLINT) loads only in a run with --secagg plus or complete.

__all__ = [
    "LABELS",
    "PROTOCOL",
    "FastLloydPlugin",
    "privacy_ledger",
    "privacy_spent",
    "centralised_lloyd",
    "frame_limit",
    "setup_data_bytes",
]

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
    "analytic_setup_data_bytes": "analytic setup.data bytes (2·M·2d·8, counts and envelopes apart)",
    "analytic_secagg_bytes_per_client_per_iteration": "analytic SecAgg+ data bytes per client per iteration",
    "analytic_secagg_setup_bytes_per_client": "analytic SecAgg+ key set-up bytes per client (once per run)",
    "secagg": "secure aggregation",
    "secagg_degree": "SecAgg+ neighbours k",
    "secagg_threshold": "SecAgg+ threshold t",
    "survivors_final": "clients in the last aggregate",
}

def privacy_ledger(config: FastLloydConfig) -> dict[str, Any]:
    """The privacy ledger of a run at ``config`` (the report's ``privacy`` field).

    Built from the releases the server's noise kernel draws (:meth:`FastLloydConfig.privacy_releases`:
    per iteration, the ``[k, d]`` sums and the ``[k]`` counts with their sensitivities and noise
    scales) by :func:`fedproto.algorithms.dp.privacy_ledger`: GDP accounting for FastLloyd and
    GLloyd, basic composition of Laplace releases for SuLloyd.

    Returns:
        The ledger dict (layout in :func:`fedproto.algorithms.dp.privacy_ledger` and
        docs/report.md), or ``{}`` when the run adds no noise (``lloyd``, ``--no-noise``).
    """
    releases = config.privacy_releases()
    if not releases:
        return {}
    return dp.privacy_ledger(releases, config.delta)


def privacy_spent(config: FastLloydConfig) -> dict[str, Any]:
    """The privacy a configuration spends, recomputed from its noise scales.

    The composed total of :func:`privacy_ledger`: Gaussian variants compose the per-iteration
    releases in GDP (sums with sensitivity = the iteration's radius for relative sums, sqrt(d) B
    for absolute sums; counts with sensitivity 1) and convert to epsilon at the configured
    delta; SuLloyd composes its Laplace releases (L1 sensitivities d B and 1) by basic
    composition. Non-private: no guarantee, ``epsilon_spent`` is ``None`` (JSON ``null``;
    infinity is not valid JSON).

    Returns:
        ``{"epsilon_spent": float | None, "delta": float | None, "iterations": int}`` and, for
        the Gaussian variants, ``"gdp_mu"``.
    """
    ledger = privacy_ledger(config)
    if not ledger:
        return {"epsilon_spent": None, "delta": None, "iterations": config.iterations}
    spent = {"epsilon_spent": ledger["epsilon"], "delta": ledger["delta"], "iterations": config.iterations}
    if "gdp_mu" in ledger:
        spent["gdp_mu"] = ledger["gdp_mu"]
    return spent


def setup_data_bytes(n_clients: int, d: int) -> int:
    """The data bytes of the ``setup.data`` phase: ``2 M · 2d · 8 = 32 M d``.

    Each of the M clients uploads its per-feature minimum and maximum (``float64 [2, d]``) and
    receives the federation's; the counts n_i and N (msgpack integers, 1 to 9 bytes each) and
    the envelopes come on top, one per frame (2M frames).
    """
    return 32 * n_clients * d


def frame_limit(config: FastLloydConfig, n_clients: int, secagg_plus: SecAggPlusConfig | None = None) -> int:
    """The largest frame any party of a FastLloyd run sends (bytes, envelope included).

    ``setup.data`` sends ``float64 [2, d]`` extents and a count each way; the key setup sends
    32-byte keys (every client's to client 0) and 48-byte sealed seeds (client 0's for the other
    ``M - 1`` clients); each iteration sends ``[k, d+1]`` ring elements of ``w / 8`` bytes each
    way, or with SecAgg+ (``secagg_plus``) its stages' messages.
    """
    return frame_bound(config.k, config.d, config.ring_bits, n_clients, secagg_plus)


def centralised_lloyd(x: np.ndarray, init: np.ndarray, iterations: int) -> np.ndarray:
    """Plain Lloyd's on the pooled data from ``init`` (the non-private reference), ``[k, d]``."""
    # device_put, not jnp.asarray: outside a trace asarray compiles a copy kernel per shape
    centroids = jax.device_put(init)
    xs = jax.device_put(x)
    for _ in range(iterations):
        centroids = kmeans.lloyd_step(xs, centroids)
    return np.asarray(centroids)


_NO_DROPOUT = "fastlloyd survives dropouts only with --secagg plus or complete"


def _default_k(dataset: Dataset) -> int:
    """``--k``'s default: the papers' k for the data set, else 3."""
    return dataset.paper_k or 3


def _options(args: argparse.Namespace, k: int) -> FastLloydOptions:
    """The run's public options from the command line (``--seed`` seeds the initialisation).

    Raises:
        ValueError: an option out of range, named by its flag.
    """
    if k < 1:
        raise ValueError("--k must be at least 1")
    if args.epsilon is not None and not args.epsilon > 0:
        raise ValueError("--epsilon must be positive")
    if args.alpha is not None and not args.alpha > 0:
        raise ValueError("--alpha must be positive")
    if args.iterations is not None and args.iterations < 1:
        raise ValueError("--iterations must be at least 1")
    return FastLloydOptions(
        variant=args.variant,
        k=k,
        epsilon=None if args.variant == "lloyd" else args.epsilon,
        delta=args.delta,
        alpha=args.alpha,
        iterations=args.iterations,
        ring_bits=args.ring_bits if args.ring_bits == "auto" else int(args.ring_bits),
        init_seed=args.seed,
        noise=not args.no_noise,
        secagg=getattr(args, "secagg", "msa"),
    )


def _noise_seed(args: argparse.Namespace) -> int:
    return int.from_bytes(os.urandom(8), "big") if args.fresh_noise else args.seed


def _phases(options: FastLloydOptions) -> tuple[str, ...]:
    setup = ("setup.data", "setup.keys", "setup.roster", "setup.seal", "setup.relay")
    if options.secagg == "msa":
        return (*setup, "update", "aggregate")
    return (*setup, *SECAGG_PLUS_STAGES, "aggregate")


def _result_to_json(with_secagg_plus: bool):
    """``(party, result) -> dict``: a client's centroids, unassigned points and noisy counts per
    iteration; the server's iterations, N and d, and with SecAgg+ its survivors and dropouts."""

    def result_to_json(party: str, result: Any) -> dict[str, Any]:
        if isinstance(result, FastLloydResult):
            return {
                "centroids": result.centroids.tolist(),
                "unassigned": result.unassigned.tolist(),
                "noisy_counts": result.noisy_counts.tolist(),
            }
        if isinstance(result, ServerSummary):
            out: dict[str, Any] = {"iterations": result.iterations, "n_points": result.n_points, "d": result.d}
            if with_secagg_plus:
                out["survivors"] = [list(s) for s in result.survivors]
                out["dropouts"] = [f"{p}@{stage}:{r}" for p, (r, stage) in sorted(result.dropouts.items())]
            return out
        raise TypeError(f"unexpected result of {party}: {type(result).__name__}")

    return result_to_json


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

    def split(self, args: argparse.Namespace, dataset: Dataset) -> dict[str, Dataset]:
        """Each client's raw (not normalised) rows, as the run ``plan(args, dataset)`` splits them.

        Args:
            args: the run's options (``--clients``, ``--partition``, ``--seed``).
            dataset: the whole data set, raw.

        Returns:
            ``{client-i: Dataset(dataset.name, x [n_i, d] float64, y [n_i] int64 or None,
            dataset.paper_k)}`` in client order (:func:`fedproto.data.partition`; the server
            holds no data).

        Raises:
            ValueError: ``--clients`` below 1, or a partition that does not fit the data.
        """
        if args.clients < 1:
            raise ValueError("--clients must be at least 1")
        parts = partition(dataset.n, args.clients, scheme=args.partition, seed=args.seed, labels=dataset.y)
        return {
            party: Dataset(dataset.name, dataset.x[idx], None if dataset.y is None else dataset.y[idx], dataset.paper_k)
            for party, idx in zip(client_names(len(parts)), parts, strict=True)
        }

    def resolved_options(self, args: argparse.Namespace, dataset: Dataset) -> list[str]:
        """``["--k", K]`` when ``--k`` defaults to the data set's paper k (else ``[]``): the only
        option whose default comes from the whole data set (N-dependent defaults, delta, the
        iterations and the ring, are agreed in ``setup.data``)."""
        return [] if args.k is not None else ["--k", str(_default_k(dataset))]

    def plan(self, args: argparse.Namespace, dataset: Dataset) -> RunPlan:
        """The whole run in one process: :meth:`split`, the machines :meth:`plan_party` builds,
        and the summaries on the pooled data (NICV, non-private Lloyd, scikit-learn)."""
        k = args.k if args.k is not None else _default_k(dataset)
        if k > dataset.n:
            raise ValueError(f"k = {k} is larger than the number of points ({dataset.n})")
        options = _options(args, k)
        parts = self.split(args, dataset)
        clients = tuple(parts)
        n, d = dataset.n, dataset.d
        session = session_id("fastlloyd", dataset.name, n, d, k, args.clients, args.seed, args.variant, args.epsilon)
        # What every party derives in setup.data, computed here for the summary, the analytic
        # costs and the frame limit (and to refuse options that do not fit before any work).
        config = options.config(n, d)
        plus = secagg_config(options.secagg, config, len(clients), session)
        parties = FastLloydParties(options, clients=clients, session=session, noise_seed=_noise_seed(args))

        x = normalize(dataset.x)  # the pooled data, for the references only

        def summarize(results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
            summary = self.summarize(results, config=config, x=x, dataset=dataset, clients=clients, seed=args.seed,
                                     reference_cache=not getattr(args, "no_compile_cache", False))
            summary["secagg"] = options.secagg
            ledger = privacy_ledger(config)
            if ledger:
                summary["privacy"] = ledger  # the CLI moves it to the report's privacy ledger
            if plus is not None:
                server = results.get(SERVER, {})
                summary["secagg_degree"] = plus.degree
                summary["secagg_threshold"] = plus.threshold
                summary["dropouts"] = server.get("dropouts", [])
                summary["survivors_final"] = (server.get("survivors") or [[]])[-1]
            return summary

        analytic: dict[str, Any] = {
            "ring_element_bytes": config.element_bytes,
            "analytic_setup_data_bytes": setup_data_bytes(len(clients), d),
        }
        if plus is None:
            analytic["analytic_payload_bytes_per_iteration"] = config.payload_bytes_per_iteration(len(clients))
        else:
            from fedproto.algorithms.secagg_plus import engine as secagg_plus  # only a SecAgg+ run loads it

            setup_bytes, iteration_bytes = secagg_plus.setup_and_aggregation_bytes(plus)
            analytic["analytic_secagg_bytes_per_client_per_iteration"] = iteration_bytes
            analytic["analytic_secagg_setup_bytes_per_client"] = setup_bytes
        return RunPlan(
            roster=parties.roster,
            session=session,
            make_machine=parties.machine_factory({c: parts[c].x for c in clients}),
            result_to_json=_result_to_json(plus is not None),
            summarize=summarize,
            role_of=parties.role_of,
            iterations=config.iterations,
            phases=_phases(options),
            plot_results=lambda ax, summary: plot_clusters(ax, x, summary),
            analytic=analytic,
            labels={**LABELS, "nicv": f"NICV, normalised intra-cluster variance ({config.variant})"},
            max_frame_bytes=frame_limit(config, len(clients), plus),
            dropout_stages=SECAGG_PLUS_ROUND_STAGES if plus is not None else (),
            dropout_unsupported="" if plus is not None else _NO_DROPOUT,
        )

    def plan_party(
        self,
        args: argparse.Namespace,
        party: str,
        roster: tuple[str, ...],
        session: int,
        data: Dataset | None,
    ) -> RunPlan:
        """The plan of one party holding only ``data`` (``fedproto party fastlloyd --data FILE``).

        The machine is the one :meth:`plan` builds for ``party``: the server from the public
        options alone, a client from its own raw rows; N, the extent the data are normalised
        by, and every N-dependent parameter are agreed in ``setup.data``.

        Args:
            args: the run's options (``--clients`` is ignored: the roster says who the clients
                are).
            party: this process's party.
            roster: ``("server", client, ...)``, the roster file's parties in order.
            session: the session id (the roster's).
            data: this client's rows, raw (e.g. ``fedproto split``'s file); the server's is
                ignored (it holds no data).

        Returns:
            A plan whose ``make_machine`` builds ``party``'s machine, ``summarize`` returns
            ``{}``, and ``iterations`` is ``--iterations`` or 0 (T depends on N, agreed later).
            A client's frame limit covers both ring widths ``--ring-bits auto`` may pick; the
            server, which learns d only in ``setup.data``, states none.

        Raises:
            ValueError: ``party`` or ``server`` not in the roster, no client, a client without
                data, ``--k`` missing where the file records no paper k, bad options.
        """
        roster = tuple(roster)
        if not roster or roster[0] != SERVER:
            raise ValueError(f"the roster of a fastlloyd run starts with {SERVER!r}, got {list(roster[:3])}")
        if party not in roster:
            raise ValueError(f"{party!r} is not in the roster {list(roster)}")
        clients = roster[1:]
        if not clients:
            raise ValueError("the roster has no client")
        if party != SERVER and data is None:
            raise ValueError(f"{party} is a client: give it its own data with --data FILE (see fedproto split)")
        if args.k is not None:
            k = args.k
        elif data is not None and data.paper_k is not None:
            k = data.paper_k
        else:
            raise ValueError("--k is required when a party holds only its own data")
        options = _options(args, k)
        plus_possible = options.secagg != "msa"
        if plus_possible and len(clients) < 2:
            raise ValueError("--secagg plus needs at least 2 clients")
        points = data.x if (party != SERVER and data is not None) else None
        parties = FastLloydParties(options, clients=clients, session=session, noise_seed=_noise_seed(args))
        limit = None
        if points is not None:
            d = points.shape[1]
            widths = (32, 64) if options.ring_bits == "auto" else (int(options.ring_bits),)
            limit = max(
                frame_bound(
                    k, d, w, len(clients),
                    secagg_plus_config(options.secagg, ring_bits=w, length=k * (d + 1), n_clients=len(clients),
                                       session=session),
                )
                for w in widths
            )
        return RunPlan(
            roster=roster,
            session=session,
            make_machine=parties.machine_factory({party: points}),
            result_to_json=_result_to_json(plus_possible),
            summarize=lambda results: {},
            role_of=parties.role_of,
            iterations=args.iterations or 0,
            phases=_phases(options),
            labels=LABELS,
            max_frame_bytes=limit,
            dropout_stages=SECAGG_PLUS_ROUND_STAGES if plus_possible else (),
            dropout_unsupported="" if plus_possible else _NO_DROPOUT,
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
        reference_cache: bool = True,
    ) -> dict[str, Any]:
        """NICV of the run beside non-private Lloyd's and scikit-learn's, and the privacy spent.

        scikit-learn's fit is read from the cache of an earlier run when there is one
        (:func:`fedproto.algorithms.fastlloyd.reference.sklearn_reference`; ``reference_cache``
        ``False``, as under ``--no-compile-cache``, fits afresh).

        Returns:
            The result keys listed in the module docstring (snake_case, numbers as numbers).

        Raises:
            ValueError: no client result to summarise.
        """
        centroid_sets = [np.asarray(results[c]["centroids"]) for c in clients if c in results]
        if not centroid_sets:
            raise ValueError("no client result to summarise")
        centroids = centroid_sets[0]
        agree = all(np.array_equal(centroids, other) for other in centroid_sets[1:])
        with progress_task("references: non-private Lloyd, scikit-learn k-means++", total=2) as advance:
            lloyd = centralised_lloyd(x, initial_centroids(config), LLOYD_REFERENCE_ITERATIONS)
            advance()
            reference = sklearn_reference(x, config.k, seed, cache=reference_cache)
            advance()
        xs = jax.device_put(x)
        nicv = float(kmeans.nicv(xs, jax.device_put(centroids)))
        nicv_lloyd = float(kmeans.nicv(xs, jax.device_put(lloyd)))
        nicv_sklearn = float(reference.inertia / x.shape[0])
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
            "sklearn_centroids": reference.centroids.tolist(),
        })
        return summary


def plot_clusters(ax, x: np.ndarray, summary: Mapping[str, Any]) -> None:
    """Draw the points (first two principal components) coloured by nearest centroid, with the
    run's centroids (black crosses) and scikit-learn's (black circles), a legend, and a note
    under it saying whether the run's centroids carry DP noise (so a cross far from every point
    reads as the noise it is, not as a cluster)."""
    from matplotlib.lines import Line2D
    from sklearn.decomposition import PCA

    centroids = np.asarray(summary["centroids"])
    reference = np.asarray(summary["sklearn_centroids"])
    if x.shape[1] > 2:
        pca = PCA(n_components=2, random_state=0).fit(x)
        project = pca.transform
    else:
        project = lambda a: a  # noqa: E731
    import matplotlib

    labels = np.asarray(kmeans.assign_clusters(jax.device_put(x), jax.device_put(centroids), np.inf)[0])
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
    variant = summary.get("variant", "run")
    points = Line2D([], [], linestyle="none", marker="o", markersize=6, markerfacecolor=palette(0),
                    markeredgecolor=palette(1), label=f"points, coloured by nearest {variant} centroid")
    handles, _ = ax.get_legend_handles_labels()
    spent = summary.get("epsilon_spent")
    if spent is not None:
        note = (f"The {variant} centroids carry DP noise (epsilon = {spent:.3g} over the run):\n"
                f"a cross far from every point is that noise, not a cluster.")
    else:
        note = f"{variant} added no DP noise: its centroids are those of its Lloyd iterations."
    # the note heads the legend, so the constrained layout keeps both inside the figure
    legend = ax.legend(handles=[points, *handles], loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=1,
                       fontsize="small", title=note, title_fontsize="small", frameon=False)
    legend.get_title().set_multialignment("center")


PROTOCOL = FastLloydPlugin()

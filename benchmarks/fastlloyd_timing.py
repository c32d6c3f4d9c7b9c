"""FastLloyd per-iteration time and bytes on TimeSynth-shaped data, beside the paper's Table 3.

What it measures
----------------
For N in {10k, 100k}, k in {2, 5}, d in {2, 5}, M = 2 clients and epsilon = 0.1 (the paper's
timing setting, spec fastlloyd.md 4.3-4.4), one FastLloyd run per repeat over the memory transport
in one process (:func:`fedproto.runtime.run_parties`; every frame is encoded, decoded and
metered), with ``make_config("fastlloyd", ..., ring_bits="auto")``: the 32-bit ring when the public
aggregate bound fits, else 64 bits (the table says which).

Data: synthetic stand-ins for the paper's TimeSynth sets (R ``clusterGeneration``,
``sepVal = 0.70``, equal cluster sizes N/k). Without R we draw k equal-size isotropic Gaussian
clusters (unit std) whose centres are scaled so that the *nearest* pair of centres is
``22.2`` stds apart: for two isotropic Gaussians the separation index of clusterGeneration,
``J = (L2 - U1) / (U2 - L1)`` with 2.5%/97.5% quantiles on the line through the centres, is
``(D - 3.92) / (D + 3.92)``, which is 0.70 at ``D = 22.2``. This is an approximation (the R
generator also draws random covariances); timing depends on N, k, d and T, not on the clusters'
shapes. The points are min-max normalised to [-1, 1] with :func:`fedproto.data.normalize`.

Columns:

* ``ms/iter``: per-iteration time = the sum of the report's ``round_wall_s`` / T (first update
  frame of iteration 0 to the end of the run; it excludes key agreement and machine
  construction, except that iteration 0 starts when client 0 sends its first update, which is
  while the server still relays the sealed seed to client 1); median of ``--repeats`` runs after one
  warm-up run (JAX compiles the kernels for each shape);
* ``run/T ms``: the paper's method, the whole ``run_parties`` wall time (key agreement included)
  / T, median;
* ``paper ms``: Table 3's FastLloyd mean (Apple M2 Max, Open MPI, 0.25 ms simulated latency per
  iteration); ``ratio`` = ours / paper (ms/iter);
* ``bytes/iter``: payload bytes per iteration measured by the meter (encoded frames, envelopes
  included); ``analytic`` = ``config.payload_bytes_per_iteration(M)`` = ``2 M k (d+1) w/8``;
  ``envelope`` = measured - analytic (one msgpack envelope per frame, 2M frames per iteration);
  ``paper bytes`` = 32 k (d+1) (the paper's code sent 8-byte elements);
* ``central ms`` and ``fed/central``: the baseline measured in the same run, one centralised
  Lloyd iteration on the pooled data (:func:`fedproto.algorithms.kmeans.lloyd_step`, jitted, warmed up,
  median of 20 calls), and our ms/iter divided by it.

``--latency-ms X`` makes every send sleep X ms (``MemoryNetwork(latency_s=...)``);
``--paper-latency`` sets 0.25 ms per send, like the paper's "0.25 ms per send".

Run::

    python benchmarks/fastlloyd_timing.py                   # full grid, no latency (about a minute)
    python benchmarks/fastlloyd_timing.py --paper-latency   # 0.25 ms per send
    python benchmarks/fastlloyd_timing.py --quick           # smoke test, a few seconds
    python benchmarks/fastlloyd_timing.py --json t3.json    # also the table as JSON records

``--json PATH`` writes one record per row (table ``fastlloyd_timing``): ``n_points``, ``k``, ``d``,
``ring_bits``, ``iterations``, ``ms_per_iteration``, ``run_ms_per_iteration``,
``paper_ms_per_iteration`` (``null`` off Table 3's grid), ``bytes_per_iteration``,
``analytic_bytes_per_iteration``, ``envelope_bytes_per_iteration``, ``paper_bytes_per_iteration``,
``central_ms_per_iteration``, ``latency_ms_per_send``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import time
from typing import Any

import jax
import numpy as np
import trio
from _common import add_common_arguments, make_console, median, parse_args, print_machine_facts, record, write_records
from rich.progress import Progress
from rich.table import Table

from fedproto.algorithms import kmeans
from fedproto.algorithms.fastlloyd.config import FastLloydConfig, make_config
from fedproto.algorithms.fastlloyd.protocol import FastLloydClient, FastLloydServer, initial_centroids
from fedproto.data import normalize, partition
from fedproto.metering import Meter, RunReport, is_setup_phase
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.transports.memory import MemoryNetwork

TITLE = "FastLloyd per-iteration time and bytes (memory transport) vs the paper's Table 3"
EPSILON = 0.1
N_CLIENTS = 2
SESSION = 0x7153_0001
#: Distance between the nearest pair of cluster centres, in cluster stds, for sepVal 0.70.
SEPARATION_STDS = 3.92 * (1 + 0.70) / (1 - 0.70)
#: Table 3 (spec fastlloyd.md 4.4): (N, k, d) -> (FastLloyd ms per iteration, bytes per iteration).
PAPER_TABLE3: dict[tuple[int, int, int], tuple[float, int]] = {
    (10_000, 2, 2): (3.03, 192),
    (10_000, 2, 5): (3.24, 384),
    (10_000, 5, 2): (4.32, 480),
    (10_000, 5, 5): (4.95, 960),
    (100_000, 2, 2): (12.57, 192),
    (100_000, 2, 5): (13.17, 384),
    (100_000, 5, 2): (22.05, 480),
    (100_000, 5, 5): (22.56, 960),
}


def timesynth(n: int, k: int, d: int, seed: int = 0) -> np.ndarray:
    """TimeSynth-like data: k equal-size Gaussian clusters, nearest centres 22.2 stds apart.

    An approximation of R clusterGeneration with ``sepVal = 0.70`` and equal cluster sizes (see
    the module docstring).

    Args:
        n: number of points N; k: clusters; d: features.
        seed: seed of a local ``numpy.random.Generator``.

    Returns:
        ``[n, d]`` float64, min-max normalised to ``[-1, 1]`` per feature, rows shuffled.
    """
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.0, 1.0, size=(k, d))
    if k > 1:
        gaps = np.linalg.norm(centres[:, None, :] - centres[None, :, :], axis=-1)
        nearest = gaps[np.triu_indices(k, 1)].min()
        centres *= SEPARATION_STDS / nearest
    sizes = np.full(k, n // k)
    sizes[: n % k] += 1
    x = np.concatenate([rng.normal(centres[j], 1.0, size=(sizes[j], d)) for j in range(k)])
    return normalize(x[rng.permutation(n)])


def build_parties(
    x: np.ndarray, config: FastLloydConfig, n_clients: int, *, seed: int = 0, session: int = SESSION
) -> dict[str, Any]:
    """The server and ``n_clients`` clients of one run (iid split, entropy and noise from ``seed``)."""
    parts = partition(len(x), n_clients, scheme="iid", seed=seed)
    clients = [f"client-{i}" for i in range(n_clients)]
    machines: dict[str, Any] = {
        "server": FastLloydServer("server", config=config, clients=clients, noise_seed=seed, session=session)
    }
    entropy = np.random.default_rng(seed)
    for i, name in enumerate(clients):
        machines[name] = FastLloydClient(
            name, config=config, server="server", clients=clients, points=x[parts[i]],
            entropy=entropy.bytes(32), session=session,
        )
    return machines


async def run_once(
    x: np.ndarray,
    config: FastLloydConfig,
    n_clients: int = N_CLIENTS,
    *,
    latency_s: float = 0.0,
    seed: int = 0,
    session: int = SESSION,
) -> RunReport:
    """One FastLloyd run over the memory transport; the run's report (results included).

    Returns:
        The meter's report; ``results["centroids"]`` holds client 0's final centroids.
    """
    machines = build_parties(x, config, n_clients, seed=seed, session=session)
    network = MemoryNetwork(list(machines), latency_s=latency_s)
    meter = Meter(trio.current_time)
    results = await run_parties(machines, network, config=RuntimeConfig(session=session), meter=meter)
    return meter.report(
        protocol="fastlloyd", transport="memory", session=session, parties=list(machines),
        results={"centroids": results["client-0"].centroids},
    )


def iteration_bytes(report: RunReport) -> dict[int, int]:
    """Payload bytes of each iteration (non-setup frames, envelopes included): ``{round_idx: bytes}``.

    This is the benchmark's byte measurement; ``tests/test_benchmark_bytes.py`` holds it to the
    analytic payload plus the envelopes.
    """
    return report.bytes_by_round(setup=False)


def iteration_messages(report: RunReport) -> dict[int, int]:
    """Frames of each iteration (non-setup): ``{round_idx: messages}``."""
    out: dict[int, int] = {}
    for link in report.links:
        if not is_setup_phase(link.phase):
            out[link.round_idx] = out.get(link.round_idx, 0) + link.messages
    return out


@dataclasses.dataclass(frozen=True)
class Row:
    """One (N, k, d) of the table."""

    n: int
    k: int
    d: int
    ring_bits: int
    iterations: int
    ms_per_iteration: float
    run_ms_per_iteration: float
    bytes_per_iteration: float
    analytic_bytes: int
    central_ms: float


def centralised_ms(x: np.ndarray, config: FastLloydConfig, calls: int = 20) -> float:
    """Median ms of one jitted centralised Lloyd iteration on the pooled data (after warm-up)."""
    xj = jax.numpy.asarray(x)
    c = jax.numpy.asarray(initial_centroids(config))
    kmeans.lloyd_step(xj, c).block_until_ready()  # compile for this shape
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        kmeans.lloyd_step(xj, c).block_until_ready()
        times.append(time.perf_counter() - t0)
    return 1e3 * median(times)


def measure(n: int, k: int, d: int, *, repeats: int, latency_s: float, seed: int, ring_bits: int | str) -> Row:
    """Warm up once, then ``repeats`` timed runs of one (N, k, d); the medians."""
    x = timesynth(n, k, d, seed=seed)
    config = make_config("fastlloyd", n=n, k=k, d=d, epsilon=EPSILON, ring_bits=ring_bits, init_seed=seed)
    t = config.iterations
    trio.run(functools.partial(run_once, x, config, N_CLIENTS, latency_s=latency_s, seed=seed))  # warm-up: JIT compiles
    per_iter, run_per_iter, per_iter_bytes = [], [], []
    for r in range(repeats):
        report = trio.run(
            functools.partial(run_once, x, config, N_CLIENTS, latency_s=latency_s, seed=seed + 1 + r)
        )
        assert len(report.round_wall_s) == t and report.algorithm_rounds == t
        per_iter.append(1e3 * sum(report.round_wall_s) / t)
        run_per_iter.append(1e3 * report.wall_time_s / t)
        by_round = iteration_bytes(report)
        per_iter_bytes.append(sum(by_round.values()) / len(by_round))
    return Row(
        n, k, d, config.ring_bits, t, median(per_iter), median(run_per_iter), median(per_iter_bytes),
        config.payload_bytes_per_iteration(N_CLIENTS), centralised_ms(x, config),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="N values")
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 5], help="k values")
    parser.add_argument("--ds", type=int, nargs="+", default=[2, 5], help="d values")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per configuration (median kept)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="sleep per send (ms)")
    parser.add_argument("--paper-latency", action="store_true", help="0.25 ms per send, like the paper")
    parser.add_argument("--ring-bits", default="auto", choices=["auto", "32", "64"], help="ring width")
    parser.add_argument("--seed", type=int, default=0, help="seed of data, split, entropy and noise")
    add_common_arguments(parser, quick="tiny run for a smoke test (a few seconds)")
    args = parse_args(parser, argv)
    if args.paper_latency:
        args.latency_ms = 0.25
    if args.quick:
        args.sizes, args.ks, args.ds, args.repeats = [2_000], [2], [2], 2
    ring_bits: int | str = args.ring_bits if args.ring_bits == "auto" else int(args.ring_bits)

    console = make_console()
    print_machine_facts(
        console,
        TITLE,
        {
            "clients M": N_CLIENTS,
            "epsilon": EPSILON,
            "latency per send": f"{args.latency_ms} ms",
            "ring": args.ring_bits,
            "repeats (median kept, after 1 warm-up)": args.repeats,
            "ms/iter": "sum(report.round_wall_s) / T (setup excluded)",
        },
    )
    grid = list(itertools.product(args.sizes, args.ks, args.ds))
    rows = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("FastLloyd runs", total=len(grid))
        for n, k, d in grid:
            progress.update(task, description=f"N={n:,} k={k} d={d}")
            rows.append(
                measure(n, k, d, repeats=args.repeats, latency_s=args.latency_ms / 1e3, seed=args.seed,
                        ring_bits=ring_bits)
            )
            progress.advance(task)

    table = Table(
        title=f"FastLloyd, M = {N_CLIENTS}, epsilon = {EPSILON}, latency {args.latency_ms} ms/send "
        f"(paper: Table 3, M2 Max + Open MPI, 0.25 ms/iteration)",
        title_justify="left",
    )
    for col in (
        "N", "k", "d", "ring bits", "T", "ms/iter", "run/T ms", "paper ms", "ratio", "bytes/iter", "analytic",
        "envelope", "paper bytes", "central ms", "fed/central",
    ):
        table.add_column(col, justify="right")
    records = []
    for row in rows:
        paper_ms, paper_bytes = PAPER_TABLE3.get((row.n, row.k, row.d), (None, 32 * row.k * (row.d + 1)))
        records.append(record(
            "fastlloyd_timing", n_points=row.n, k=row.k, d=row.d, ring_bits=row.ring_bits,
            iterations=row.iterations, ms_per_iteration=row.ms_per_iteration,
            run_ms_per_iteration=row.run_ms_per_iteration, paper_ms_per_iteration=paper_ms,
            bytes_per_iteration=row.bytes_per_iteration, analytic_bytes_per_iteration=row.analytic_bytes,
            envelope_bytes_per_iteration=row.bytes_per_iteration - row.analytic_bytes,
            paper_bytes_per_iteration=paper_bytes, central_ms_per_iteration=row.central_ms,
            latency_ms_per_send=args.latency_ms,
        ))
        table.add_row(
            f"{row.n:,}", str(row.k), str(row.d), str(row.ring_bits), str(row.iterations),
            f"{row.ms_per_iteration:.2f}", f"{row.run_ms_per_iteration:.2f}",
            "-" if paper_ms is None else f"{paper_ms:.2f}",
            "-" if paper_ms is None else f"{row.ms_per_iteration / paper_ms:.2f}",
            f"{row.bytes_per_iteration:,.0f}", f"{row.analytic_bytes:,}",
            f"{row.bytes_per_iteration - row.analytic_bytes:,.0f}", f"{paper_bytes:,}", f"{row.central_ms:.3f}",
            f"{row.ms_per_iteration / row.central_ms:.1f}",
        )
    console.print(table)
    console.print(
        "Bytes count M uploads + M downloads per iteration, as the paper's code does: paper 16 M k (d+1) "
        "(8-byte elements) = 32 k (d+1) for M = 2; ours 2 M k (d+1) w/8 = 8 M k (d+1) with the 32-bit ring, "
        "16 M k (d+1) with the 64-bit ring, plus one msgpack envelope per frame (the envelope column)."
    )
    write_records(args.json, records, console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

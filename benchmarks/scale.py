"""One FastLloyd iteration with many in-memory clients in one process: time, memory and bytes.

What it measures
----------------
``--clients`` FastLloyd clients (default 10,000) and one server in one process, over the memory
transport (:func:`fedproto.runtime.run_parties`, one trio task per party), each client holding
``--points`` points (default 10) of a synthetic mixture (k = 5, d = 2, normalised to [-1, 1]),
``make_config("fastlloyd", ..., epsilon=1.0, iterations=1)`` (one Lloyd iteration, ring chosen by
``"auto"``). Phases, timed separately:

* ``build``: data, config and construction of every machine (each client derives its X25519 key
  pair and the public initial centroids);
* ``keyed``: key agreement inside the run (M public keys, the key roster to client 0, M-1 sealed
  seeds, M-1 relays): from the start of the run until the last client holds the mask seed;
* ``iteration``: the report's ``round_wall_s`` (from client 0's first update frame to the end of
  the run). The run is pipelined: a client sends its update as soon as it holds the seed, so the
  two windows overlap (client 0 updates right after sealing, long before the last relay);
* ``run``: the whole ``run_parties`` call.

Memory: ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (the process's peak resident set) after each
configuration, and with ``--tracemalloc`` the tracemalloc peak of the Python heap during the run
(tracemalloc slows allocation down, so times are then not comparable).

Baseline, measured in the same process first (after an untimed 2-client warm-up run, which
compiles the JAX kernels for the per-client shapes): the same with
``--baseline-clients`` clients (default 100); the ``per-client`` ratios divide the big run's
per-client time by the baseline's (1.0 = linear scaling).

Run::

    python benchmarks/scale.py                     # 10,000 clients (a few minutes)
    python benchmarks/scale.py --clients 2000      # smaller
    python benchmarks/scale.py --quick             # smoke test: 200 vs 50 clients
    python benchmarks/scale.py --profile           # also cProfile the big run's run_parties
    python benchmarks/scale.py --quick --json s.json   # the tables as JSON records

``--json PATH`` writes one record per row: table ``scale_runs`` (``n_clients``, ``ring_bits``,
``build_s``, ``keyed_s``, ``iteration_s``, ``run_s``, ``run_ms_per_client``, ``messages``,
``setup_bytes``, ``iteration_bytes``, ``analytic_iteration_bytes``, ``peak_rss_mib``,
``tracemalloc_peak_mib``) and table ``scale_per_client`` (``phase``, ``baseline_clients``,
``baseline_ms_per_client``, ``clients``, ``ms_per_client``, ``ratio``).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import pstats
import resource
import time
import tracemalloc

import numpy as np
import trio
from _common import add_common_arguments, make_console, parse_args, print_machine_facts, record, write_records
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedproto.algorithms.fastlloyd.config import make_config
from fedproto.algorithms.fastlloyd.protocol import FastLloydClient, FastLloydServer
from fedproto.data import normalize
from fedproto.metering import Meter, RunReport
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.transports.memory import MemoryNetwork

TITLE = "FastLloyd scale: one iteration with many in-memory clients in one process"
K, D = 5, 2
EPSILON = 1.0
SESSION = 0x5CA1_E001


@dataclasses.dataclass(frozen=True)
class ScaleResult:
    """Measurements of one configuration."""

    clients: int
    points: int
    ring_bits: int
    build_s: float
    run_s: float
    keyed_s: float
    iteration_s: float
    maxrss_mib: float
    tracemalloc_peak_mib: float | None
    report: RunReport


def mixture(n: int, seed: int) -> np.ndarray:
    """``[n, 2]`` points of 5 Gaussian clusters, normalised to [-1, 1]."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-5, 5, size=(K, D))
    labels = rng.integers(0, K, size=n)
    return normalize(centres[labels] + rng.normal(size=(n, D)))


def maxrss_mib() -> float:
    """Peak resident set size of this process so far (MiB; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build(n_clients: int, points: int, seed: int, progress: Progress | None) -> tuple[dict, object]:
    """Config and machines of one run (clients own ``points`` consecutive points each)."""
    n = n_clients * points
    x = mixture(n, seed)
    config = make_config("fastlloyd", n=n, k=K, d=D, epsilon=EPSILON, iterations=1, init_seed=seed)
    clients = [f"client-{i}" for i in range(n_clients)]
    entropy = np.random.default_rng(seed)
    machines: dict = {"server": FastLloydServer("server", config=config, clients=clients, noise_seed=seed)}
    task = progress.add_task(f"build {n_clients:,} clients", total=n_clients) if progress else None
    for i, name in enumerate(clients):
        machines[name] = FastLloydClient(
            name, config=config, server="server", clients=clients, points=x[i * points : (i + 1) * points],
            entropy=entropy.bytes(32), session=SESSION,
        )
        if progress is not None and (i + 1) % 100 == 0:
            progress.update(task, completed=i + 1)
    if progress is not None:
        progress.update(task, completed=n_clients)
    return machines, config


async def run(machines: dict, progress: Progress | None) -> tuple[RunReport, float]:
    """``run_parties`` over a memory network.

    Returns:
        The report and the seconds from the start of the run until the last client held the mask
        seed (the end of key agreement).
    """
    n_clients = len(machines) - 1
    network = MemoryNetwork(list(machines))
    meter = Meter(trio.current_time)
    keyed_task = progress.add_task(f"setup: clients with the mask seed ({n_clients:,})", total=n_clients) if progress else None
    done_task = progress.add_task(f"iteration: clients done ({n_clients:,})", total=n_clients) if progress else None
    keyed = {"count": 0, "at": 0.0}

    def observer(party: str, round_idx: int, state: str) -> None:
        if party == "server":
            return
        if state == "ITERATING" and round_idx == 0:
            keyed["count"] += 1
            if keyed["count"] == n_clients:
                keyed["at"] = trio.current_time()
            if progress is not None:
                progress.advance(keyed_task)
        elif state == "DONE" and progress is not None:
            progress.advance(done_task)

    start = trio.current_time()
    results = await run_parties(
        machines, network, config=RuntimeConfig(session=SESSION, deadline_s=3600.0), meter=meter,
        observer=observer,
    )
    assert len(results) == len(machines) and keyed["count"] == n_clients
    report = meter.report(protocol="fastlloyd", transport="memory", session=SESSION, parties=list(machines))
    return report, keyed["at"] - start


def measure(n_clients: int, points: int, seed: int, *, progress: Progress | None, use_tracemalloc: bool,
            profile: bool = False) -> tuple[ScaleResult, cProfile.Profile | None]:
    """Build and run one configuration; its times, memory and report."""
    gc.collect()
    t0 = time.perf_counter()
    machines, config = build(n_clients, points, seed, progress)
    build_s = time.perf_counter() - t0
    gc.collect()
    if use_tracemalloc:
        tracemalloc.start()
    profiler = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    report, keyed_s = trio.run(run, machines, progress)
    if profiler is not None:
        profiler.disable()
    run_s = time.perf_counter() - t0
    peak = None
    if use_tracemalloc:
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    iteration_s = sum(report.round_wall_s)
    result = ScaleResult(
        n_clients, points, config.ring_bits, build_s, run_s, keyed_s, iteration_s,
        maxrss_mib(), peak, report,
    )
    return result, profiler


def print_profile(console, profiler: cProfile.Profile, top: int, title: str) -> None:
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][3])[:top]
    table = Table(title=title, title_justify="left")
    for col in ("function", "calls", "own s", "cumulative s"):
        table.add_column(col, justify="left" if col == "function" else "right")
    for (filename, line, name), (_, ncalls, own, cumulative, _) in rows:
        short = filename.split("site-packages/")[-1].split("/work/main/")[-1]
        table.add_row(f"{name} ({short}:{line})", f"{ncalls:,}", f"{own:.2f}", f"{cumulative:.2f}")
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=10_000, help="clients of the big run")
    parser.add_argument("--baseline-clients", type=int, default=100, help="clients of the baseline run")
    parser.add_argument("--points", type=int, default=10, help="points per client")
    parser.add_argument("--seed", type=int, default=0, help="seed of data, entropy and noise")
    parser.add_argument("--tracemalloc", action="store_true", help="also measure the tracemalloc peak (slower)")
    parser.add_argument("--profile", action="store_true", help="cProfile the big run (slower) and print the top")
    add_common_arguments(parser, quick="tiny run for a smoke test (a few seconds)")
    args = parse_args(parser, argv)
    if args.quick:
        args.clients, args.baseline_clients = 200, 50

    console = make_console()
    print_machine_facts(
        console,
        TITLE,
        {
            "clients (baseline)": f"{args.clients:,} ({args.baseline_clients:,})",
            "points per client": args.points,
            "k, d, epsilon, iterations": f"{K}, {D}, {EPSILON}, 1",
            "peak RSS before the runs": f"{maxrss_mib():,.0f} MiB",
        },
    )
    results = []
    profiler = None
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    )
    with progress:
        # Untimed warm-up with the same per-client shapes: JAX compiles the kernels here.
        measure(2, args.points, args.seed, progress=None, use_tracemalloc=False)
        for n_clients, prof in ((args.baseline_clients, False), (args.clients, args.profile)):
            result, p = measure(
                n_clients, args.points, args.seed, progress=progress, use_tracemalloc=args.tracemalloc, profile=prof
            )
            results.append(result)
            profiler = p or profiler

    base, big = results
    table = Table(title="One FastLloyd iteration, all parties in one process (memory transport)", title_justify="left")
    for col in (
        "clients", "ring bits", "build s", "keyed s", "iteration s", "run s", "run ms/client", "messages",
        "setup bytes", "iteration bytes", "analytic iter bytes", "peak RSS MiB",
    ) + (("tracemalloc peak MiB",) if args.tracemalloc else ()):
        table.add_column(col, justify="right")
    records = []
    for r in results:
        rep = r.report
        by_round = rep.bytes_by_round()
        config_bytes = 2 * r.clients * K * (D + 1) * r.ring_bits // 8
        row = [
            f"{r.clients:,}", str(r.ring_bits), f"{r.build_s:.2f}", f"{r.keyed_s:.2f}", f"{r.iteration_s:.2f}",
            f"{r.run_s:.2f}", f"{1e3 * r.run_s / r.clients:.3f}", f"{rep.messages:,}", f"{rep.setup_bytes:,}",
            f"{sum(by_round.values()):,}", f"{config_bytes:,}", f"{r.maxrss_mib:,.0f}",
        ]
        if args.tracemalloc:
            row.append(f"{r.tracemalloc_peak_mib:,.1f}")
        table.add_row(*row)
        records.append(record(
            "scale_runs", n_clients=r.clients, ring_bits=r.ring_bits, build_s=r.build_s, keyed_s=r.keyed_s,
            iteration_s=r.iteration_s, run_s=r.run_s, run_ms_per_client=1e3 * r.run_s / r.clients,
            messages=rep.messages, setup_bytes=rep.setup_bytes, iteration_bytes=sum(by_round.values()),
            analytic_iteration_bytes=config_bytes, peak_rss_mib=r.maxrss_mib,
            tracemalloc_peak_mib=r.tracemalloc_peak_mib if args.tracemalloc else None,
        ))
    console.print(table)

    ratios = Table(
        title=f"Per-client time, {big.clients:,} clients / {base.clients:,} clients (1.00 = linear scaling)",
        title_justify="left",
    )
    for col in ("phase", f"{base.clients:,} clients ms/client", f"{big.clients:,} clients ms/client", "ratio"):
        ratios.add_column(col, justify="left" if col == "phase" else "right")
    for phase in ("build_s", "keyed_s", "iteration_s", "run_s"):
        a = 1e3 * getattr(base, phase) / base.clients
        b = 1e3 * getattr(big, phase) / big.clients
        ratios.add_row(phase.removesuffix("_s"), f"{a:.3f}", f"{b:.3f}", f"{b / a:.2f}")
        records.append(record(
            "scale_per_client", phase=phase.removesuffix("_s"), baseline_clients=base.clients,
            baseline_ms_per_client=a, clients=big.clients, ms_per_client=b, ratio=b / a,
        ))
    console.print(ratios)
    if base.ring_bits != big.ring_bits:
        console.print(
            f"Note: make_config(ring_bits='auto') chose a {base.ring_bits}-bit ring for {base.clients * base.points:,} "
            f"points and a {big.ring_bits}-bit ring for {big.clients * big.points:,} points (the public aggregate bound "
            "grows with N), so the big run's update and aggregate arrays are twice as wide."
        )
    if profiler is not None:
        print_profile(console, profiler, 30, f"cProfile of run_parties with {big.clients:,} clients (by cumulative time)")
    write_records(args.json, records, console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

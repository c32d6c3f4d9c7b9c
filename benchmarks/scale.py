"""FastLloyd with many in-memory clients in one process: time per round, memory per client, bytes.

What it measures
----------------
``--clients`` FastLloyd clients (default 100,000) and one server in one process, each client
holding ``--points`` points (default 10) of a synthetic mixture (k = 5, d = 2, normalised to
[-1, 1]), ``make_config("fastlloyd", ..., epsilon=1.0, iterations=2, ring_bits=64)``. Every
message is encoded, metered and decoded. Two engines:

* ``lean`` (default): :func:`fedproto.simulation.simulate`, one loop driving every machine;
* ``tasks``: :func:`fedproto.runtime.run_parties` over :class:`~fedproto.transports.memory.MemoryNetwork`,
  one trio task per party (``--engine tasks``; about 10^4 clients is its practical limit).

Each configuration runs in a **fresh process** (this script started again with ``--child``), so
its peak resident set (``ru_maxrss``) is its own. Phases:

* ``build``: data, config and every machine (each client derives its X25519 key pair);
* ``rest of the run``: the run without round 1: build excluded, key agreement
  (M public keys, the key roster to client 0, M-1 sealed seeds, M-1 relays), round 0, which is
  pipelined with it (a client sends its update as soon as it holds the seed), and the clients'
  unmasking of the last aggregate;
* ``round 1``: from the server's broadcast of round 0's aggregate to its broadcast of round 1's:
  one whole steady Lloyd round with setup excluded (M clients unmask, update the centroids,
  compute and mask their statistics; the server decodes and sums them and adds noise);
* ``run``: the whole run.

Memory: the child's peak RSS, and per client ``(peak RSS - peak RSS of a 2-client child) / M``.
The meter groups links (:class:`~fedproto.metering.Meter` with ``group_links``: exact totals, one
record for the links of a frame kind that share one end); ``--per-link-meter`` keeps one counter
per link instead. The memory table (``scale_memory``) shows the memory per client above the floor
at ``--memory-clients`` (default 10^3, 10^4, 10^5; each in a fresh process, the runs above
reused) beside issue 34's target (:data:`TARGET_KIB_PER_CLIENT`) and the masked round's time.
Bytes: the report's round-1 bytes beside the analytic ``2 M k (d+1) w/8`` plus one envelope per
frame (``tests/algorithms/fastlloyd`` holds them equal at 1,000 clients).

Baseline, measured in the same invocation: ``--baseline-clients`` clients (default 1,000) with
the same engine; the per-client ratios divide the big run's per-client time and memory by the
baseline's (1.00 = linear). Targets (issue 11): round 1 under 10 s and peak RSS under 4 GiB at
100,000 clients, memory per client within 1.3x of 1,000 clients'; 1,000,000 clients complete.
Issue 34: at most 2 KiB per client above the floor at 100,000 clients.

Run::

    python benchmarks/scale.py                          # 100,000 clients against 1,000
    python benchmarks/scale.py --clients 1000000        # a million (a few minutes, ~10 GiB)
    python benchmarks/scale.py --engine tasks --clients 10000   # one trio task per party
    python benchmarks/scale.py --quick                  # smoke test: 1,000 vs 100 clients
    python benchmarks/scale.py --profile                # also cProfile the big run
    python benchmarks/scale.py --quick --json s.json    # the tables as JSON records

``--json PATH`` writes one record per row: table ``scale_runs`` (``engine``, ``n_clients``,
``ring_bits``, ``build_s``, ``rest_s``, ``round_s``, ``run_s``, ``round_ms_per_client``,
``messages``, ``setup_bytes``, ``round_bytes``, ``analytic_round_bytes``, ``peak_rss_mib``,
``rss_kib_per_client``), table ``scale_memory`` (``n_clients``, ``peak_rss_mib``, ``floor_mib``,
``kib_per_client``, ``target_kib_per_client``, ``ratio_to_target``, ``round_s``,
``round_ms_per_client``, ``grouped_meter``) and table ``scale_per_client`` (``quantity``, ``baseline_clients``,
``baseline``, ``clients``, ``value``, ``ratio``) and, unless ``--tasks-clients 0``, table
``scale_engines`` (``quantity``, ``clients``, ``lean``, ``tasks``, ``ratio``): both engines at
``--tasks-clients`` clients (default 10,000), each in a fresh process; and unless
``--plus-clients`` is given empty, table ``scale_secagg_plus`` (``n_clients``, ``degree``,
``rounds_timed``, ``plus_round_s``, ``masked_round_s``, ``plus_round_ms_per_client``, ``masked_round_ms_per_client``,
``plus_over_masked``, ``plus_over_first``, ``plus_round_bytes``, ``plus_max_message_bytes``,
``plus_peak_rss_mib``): FastLloyd with SecAgg+ (``--secagg plus``) over a random graph of fixed
degree ``--plus-degree`` (default 8, threshold ``k // 2 + 1``) at each of ``--plus-clients``
(default 10^3, 10^4 and 10^5; ``--quick``: 100 and 200), beside the masked round (the paper's
MSA) at the same N, each in a fresh process. SecAgg+ agrees its keys once, in round 0, so every
round timed is a round after the set-up: the median of the steady rounds 1, 2, ... of a run of
:func:`plus_iterations` iterations (11 at 10^3 clients, 3 at 10^4, 1 at 10^5: a round at 10^3
lasts under a second, and one such round varied by about 20% between runs), for SecAgg+ and for
the masked round alike. Issue 34's targets: the SecAgg+ round per client
flat within 1.3x from 10^3 to 10^5 clients (``plus_over_first``), every message ``O(k)`` bytes
(``plus_max_message_bytes``), and the round after the set-up at most 20x the masked round
(``plus_over_masked``). The 10^5-client SecAgg+ run takes about five minutes.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import math
import pstats
import resource
import subprocess
import sys
import time

import numpy as np
import trio
from _common import add_common_arguments, make_console, parse_args, print_machine_facts, record, write_records
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedproto.algorithms.fastlloyd.config import make_config
from fedproto.algorithms.fastlloyd.protocol import FastLloydClient, FastLloydServer
from fedproto.data import normalize
from fedproto.metering import Meter, RunReport
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.simulation import simulate
from fedproto.transports.memory import MemoryNetwork

TITLE = "FastLloyd scale: many in-memory clients in one process"
K, D = 5, 2
EPSILON = 1.0
ITERATIONS = 2
RING_BITS = 64
SESSION = 0x5CA1_E001
#: Clients of the child whose peak RSS is the memory floor (interpreter, JAX, compiled kernels).
FLOOR_CLIENTS = 2
#: Issue 34's target: memory per simulated client above the floor at 100,000 clients (KiB).
TARGET_KIB_PER_CLIENT = 2.0


def mixture(n: int, seed: int) -> np.ndarray:
    """``[n, 2]`` points of 5 Gaussian clusters, normalised to [-1, 1]."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-5, 5, size=(K, D))
    labels = rng.integers(0, K, size=n)
    return normalize(centres[labels] + rng.normal(size=(n, D)))


def maxrss_mib() -> float:
    """Peak resident set size of this process so far (MiB; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def plus_iterations(n_clients: int) -> int:
    """Lloyd iterations of the SecAgg+ table's runs at ``n_clients``: below 10^5 clients one round
    lasts a second or less, so the median of several steady rounds is taken (2 + 20,000 / N of
    them, at most 12 iterations: 12 at 10^3, 4 at 10^4, 2 at 10^5)."""
    return min(12, 2 + 20_000 // n_clients)


def plus_config(n_clients: int, degree: int):
    """SecAgg+ over a random ``degree``-regular graph (threshold ``degree // 2 + 1``) for the
    run's ``k (d+1)`` elements of ``Z_2^64``: a fixed degree, so a client's work and bytes should
    not depend on ``n_clients``."""
    from fedproto.algorithms.secagg_plus.config import Modulus, SecAggPlusConfig

    graph_seed = SESSION.to_bytes(32, "big")
    return SecAggPlusConfig(n_clients, K * (D + 1), Modulus.ring(RING_BITS), degree, degree // 2 + 1, graph_seed)


def build(n_clients: int, points: int, seed: int, plus_degree: int | None = None, iterations: int = ITERATIONS) -> dict:
    """Every machine of one run of ``iterations`` Lloyd iterations (clients own ``points``
    consecutive points each; one shared roster tuple); with ``plus_degree``, each iteration is a
    SecAgg+ aggregation over a graph of that degree (:func:`plus_config`)."""
    n = n_clients * points
    x = mixture(n, seed)
    config = make_config(
        "fastlloyd", n=n, k=K, d=D, epsilon=EPSILON, iterations=iterations, init_seed=seed, ring_bits=RING_BITS
    )
    plus = plus_config(n_clients, min(plus_degree, n_clients - 1)) if plus_degree else None
    clients = tuple(f"client-{i}" for i in range(n_clients))
    entropy = np.random.default_rng(seed).bytes(32 * n_clients)
    machines: dict = {
        "server": FastLloydServer(
            "server", config=config, clients=clients, noise_seed=seed, session=SESSION, secagg_plus=plus
        )
    }
    for i, name in enumerate(clients):
        machines[name] = FastLloydClient(
            name, config=config, server="server", clients=clients, points=x[i * points : (i + 1) * points],
            entropy=entropy[32 * i : 32 * (i + 1)], session=SESSION, secagg_plus=plus,
        )
    return machines


def run_once(
    machines: dict, engine: str, progress: Progress | None = None, group_links: bool = True
) -> tuple[RunReport, float]:
    """One run with ``engine``: its report and the median seconds of its steady rounds (1 to the
    last; with the default two iterations, round 1 alone).

    A round runs from the server's broadcast of the previous round's aggregate to its broadcast
    of this one (each moves the server's round index on): every client unmasks the aggregate,
    updates its centroids, computes, masks and sends its statistics, the server decodes and sums
    them and adds its noise. (The clients' unmasking of the last aggregate is the next round's
    first step, so it is left out.)
    """
    config = RuntimeConfig(session=SESSION, deadline_s=3600.0)
    clock = time.perf_counter
    broadcast_at: dict[int, float] = {}
    n_clients = len(machines) - 1
    task = progress.add_task(f"{n_clients:,} clients: round 0 done", total=n_clients) if progress else None

    def observer(party: str, round_idx: int, state: str) -> None:
        if party == "server":
            broadcast_at.setdefault(round_idx, clock())
        elif progress is not None and round_idx == 1:
            progress.advance(task)

    if engine == "lean":
        meter = Meter(clock, group_links=group_links)
        simulate(machines, config=config, meter=meter, observer=observer)
    else:
        async def go() -> Meter:
            meter = Meter(clock, group_links=group_links)
            await run_parties(machines, MemoryNetwork(list(machines)), config=config, meter=meter, observer=observer)
            return meter
        meter = trio.run(go)
    report = meter.report(protocol="fastlloyd", transport="memory", session=SESSION, parties=list(machines))
    iterations = machines["server"].config.iterations
    steady = [broadcast_at.get(r + 1, math.nan) - broadcast_at.get(r, math.nan) for r in range(1, iterations)]
    return report, float(np.median(steady))


def child(
    n_clients: int, points: int, seed: int, engine: str, profile: bool, plus_degree: int | None = None,
    group_links: bool = True, iterations: int = ITERATIONS,
) -> dict:
    """Measure one configuration in this (fresh) process; the figures as a dict."""
    run_once(build(max(2, min(n_clients, 3)), points, seed, plus_degree), engine)  # compiles the kernels, untimed
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True,
    )
    gc.collect()
    t0 = time.perf_counter()
    machines = build(n_clients, points, seed, plus_degree, iterations)
    build_s = time.perf_counter() - t0
    gc.collect()
    gc.freeze()  # the machines live to the end: the collector need not scan them again and again
    profiler = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    with progress:
        report, round_s = run_once(machines, engine, progress, group_links)
    if profiler is not None:
        profiler.disable()
    run_s = time.perf_counter() - t0
    by_round = report.bytes_by_round()
    out = {
        "engine": engine, "clients": n_clients, "ring_bits": RING_BITS, "build_s": build_s,
        "rest_s": run_s - round_s, "round_s": round_s, "run_s": run_s,
        "messages": report.messages, "setup_bytes": report.setup_bytes, "round_bytes": by_round.get(1, 0),
        "iterations": iterations,
        "peak_rss_mib": maxrss_mib(), "grouped_meter": group_links,
        # The largest message of the steady round (payload bytes): O(k) with SecAgg+.
        "round_max_message_bytes": max(
            (link.payload_bytes // link.messages for link in report.links if link.round_idx == 1 and link.messages),
            default=0,
        ),
    }
    if profiler is not None:
        stats = pstats.Stats(profiler)
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][3])[:30]
        out["profile"] = [
            [f"{name} ({filename.split('site-packages/')[-1].split('/work/main/')[-1]}:{line})", ncalls, own, cumulative]
            for (filename, line, name), (_, ncalls, own, cumulative, _) in rows
        ]
    return out


def measure(
    n_clients: int, args: argparse.Namespace, profile: bool = False, engine: str | None = None,
    plus_degree: int | None = None, iterations: int = ITERATIONS,
) -> dict:
    """Run one configuration in a fresh Python process (its own peak RSS) and return its figures."""
    command = [
        sys.executable, __file__, "--child", str(n_clients), "--points", str(args.points), "--seed", str(args.seed),
        "--engine", engine or args.engine,
    ] + (["--profile"] if profile else []) + (["--per-link-meter"] if args.per_link_meter else []) + (
        ["--child-plus-degree", str(plus_degree)] if plus_degree else []
    ) + ["--child-iterations", str(iterations)]
    # The child's progress goes to its stderr, which is ours; its figures come back on stdout.
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the {n_clients:,}-client run failed (exit {done.returncode}); its error is above")
    return json.loads(done.stdout.strip().splitlines()[-1])


def analytic_round_bytes(clients: int, envelope_up: int, envelope_down: int) -> int:
    """``2 M k (d+1) w/8`` data bytes plus one envelope per frame (M up, M down)."""
    return 2 * clients * K * (D + 1) * RING_BITS // 8 + clients * (envelope_up + envelope_down)


def envelopes() -> tuple[int, int]:
    """Frame bytes beyond the array data of one update and one aggregate (measured on one frame each)."""
    from fedproto.algorithms.fastlloyd.messages import MaskedUpdate, NoisyAggregate
    from fedproto.codec import encode_frame

    data = np.zeros((K, D + 1), dtype=np.uint64)
    up = len(encode_frame(MaskedUpdate(masked=data), session=SESSION, round_idx=ITERATIONS - 1, phase="update"))
    down = len(encode_frame(NoisyAggregate(masked=data), session=SESSION, round_idx=ITERATIONS - 1, phase="aggregate"))
    return up - data.nbytes, down - data.nbytes


def plus_table(console: Console, runs: list[tuple[dict, dict]], degree: int) -> list[dict]:
    """Print (and return as records) SecAgg+'s steady round beside the masked round of the same N:
    per-client ms of each, their ratio, and per-client ms against the smallest N's (1.00: flat)."""
    table = Table(
        title=f"SecAgg+ (degree {degree}) beside the masked round: lean engine, one steady round (round 1, after "
        "SecAgg+'s key set-up in round 0), per client",
        title_justify="left",
    )
    for col in (
        "clients", "degree", "rounds timed", "plus ms/client", "masked ms/client", "plus / masked",
        "plus ms/client vs first N", "plus round bytes/client", "largest message bytes", "plus peak RSS MiB",
    ):
        table.add_column(col, justify="right")
    records = []
    first = None
    for plus, masked in runs:
        n = plus["clients"]
        plus_ms, masked_ms = 1e3 * plus["round_s"] / n, 1e3 * masked["round_s"] / n
        first = plus_ms if first is None else first
        k = min(degree, n - 1)
        table.add_row(
            f"{n:,}", str(k), str(plus["iterations"] - 1), f"{plus_ms:.3f}", f"{masked_ms:.4f}",
            f"{plus_ms / masked_ms:.1f}", f"{plus_ms / first:.2f}",
            f"{plus['round_bytes'] / n:,.0f}", f"{plus['round_max_message_bytes']:,}", f"{plus['peak_rss_mib']:,.0f}",
        )
        records.append(record(
            "scale_secagg_plus", n_clients=n, degree=k, rounds_timed=plus["iterations"] - 1,
            plus_round_s=plus["round_s"], masked_round_s=masked["round_s"],
            plus_round_ms_per_client=plus_ms, masked_round_ms_per_client=masked_ms, plus_over_masked=plus_ms / masked_ms,
            plus_over_first=plus_ms / first, plus_round_bytes=plus["round_bytes"],
            plus_max_message_bytes=plus["round_max_message_bytes"], plus_peak_rss_mib=plus["peak_rss_mib"],
        ))
    console.print(table)
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100_000, help="clients of the big run")
    parser.add_argument("--baseline-clients", type=int, default=1_000, help="clients of the baseline run")
    parser.add_argument("--points", type=int, default=10, help="points per client")
    parser.add_argument("--seed", type=int, default=0, help="seed of data, entropy and noise")
    parser.add_argument("--engine", choices=("lean", "tasks"), default="lean", help="lean: fedproto.simulation; tasks: one trio task per party")
    parser.add_argument("--profile", action="store_true", help="cProfile the big run (slower) and print the top")
    parser.add_argument(
        "--tasks-clients", type=int, default=10_000,
        help="also run this many clients with the other engine (one trio task per party), for the engines' ratio; 0: no",
    )
    parser.add_argument(
        "--memory-clients", default="1000,10000,100000",
        help="comma-separated client counts of the memory table (each in a fresh process; runs above reused)",
    )
    parser.add_argument(
        "--per-link-meter", action="store_true", help="one meter counter per link (default: grouped links, exact totals)"
    )
    parser.add_argument(
        "--plus-clients", type=int, nargs="*", default=[1_000, 10_000, 100_000], metavar="N",
        help="SecAgg+ (--secagg plus) at a fixed degree beside the masked round at these client counts; none: skip",
    )
    parser.add_argument("--plus-degree", type=int, default=8, help="SecAgg+ neighbours per client k (fixed in N)")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-plus-degree", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-iterations", type=int, default=ITERATIONS, help=argparse.SUPPRESS)
    add_common_arguments(parser, quick="smoke test: 1,000 against 100 clients")
    args = parse_args(parser, argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.points, args.seed, args.engine, args.profile, args.child_plus_degree,
                               not args.per_link_meter, args.child_iterations)))
        return 0
    if args.quick:
        args.clients, args.baseline_clients, args.tasks_clients = 1_000, 100, 200
        args.memory_clients = "100,1000"
        args.plus_clients = [100, 200]
    memory_clients = [int(n) for n in args.memory_clients.split(",") if n.strip()]

    console = make_console()
    print_machine_facts(
        console,
        TITLE,
        {
            "clients (baseline)": f"{args.clients:,} ({args.baseline_clients:,})",
            "engine": args.engine,
            "points per client": args.points,
            "k, d, epsilon, iterations, ring": f"{K}, {D}, {EPSILON}, {ITERATIONS}, Z_2^{RING_BITS}",
            "each configuration": "in a fresh process (its own peak RSS)",
            "meter": "one counter per link" if args.per_link_meter else "grouped links (exact totals)",
        },
    )
    console.print(f"{FLOOR_CLIENTS} clients (the memory floor) ...")
    floor = measure(FLOOR_CLIENTS, args)
    results = []
    for n_clients, prof in ((args.baseline_clients, False), (args.clients, args.profile)):
        console.print(f"{n_clients:,} clients ({args.engine} engine) in a fresh process ...")
        results.append(measure(n_clients, args, prof))
    by_clients = {r["clients"]: r for r in results}
    for n_clients in memory_clients:
        if n_clients not in by_clients:
            console.print(f"{n_clients:,} clients ({args.engine} engine, memory table) in a fresh process ...")
            by_clients[n_clients] = measure(n_clients, args)
    other = None
    if args.tasks_clients > 0 and args.engine == "lean":
        console.print(f"{args.tasks_clients:,} clients, each engine, in fresh processes ...")
        other = (measure(args.tasks_clients, args, engine="lean"), measure(args.tasks_clients, args, engine="tasks"))
    plus_runs = []
    for n_clients in args.plus_clients or []:
        console.print(f"{n_clients:,} clients, SecAgg+ at degree {args.plus_degree} and the masked round, in fresh processes ...")
        iterations = plus_iterations(n_clients)
        plus = measure(n_clients, args, engine="lean", plus_degree=args.plus_degree, iterations=iterations)
        # the masked round at this N, over as many rounds: the lean run above where it is the same
        # configuration
        masked = by_clients.get(n_clients) if args.engine == "lean" and iterations == ITERATIONS else None
        plus_runs.append((plus, masked or measure(n_clients, args, engine="lean", iterations=iterations)))
    up, down = envelopes()

    table = Table(title="FastLloyd, all parties in one process: one steady round (round 1) and the whole run", title_justify="left")
    for col in (
        "engine", "clients", "build s", "rest of the run s", "round 1 s", "run s", "round ms/client", "messages",
        "setup bytes", "round bytes", "analytic round bytes", "peak RSS MiB", "KiB/client",
    ):
        table.add_column(col, justify="right")
    records = []
    for r in results:
        analytic = analytic_round_bytes(r["clients"], up, down)
        per_client_kib = 1024 * (r["peak_rss_mib"] - floor["peak_rss_mib"]) / r["clients"]
        r["kib_per_client"] = per_client_kib
        table.add_row(
            r["engine"], f"{r['clients']:,}", f"{r['build_s']:.2f}", f"{r['rest_s']:.2f}", f"{r['round_s']:.2f}",
            f"{r['run_s']:.2f}", f"{1e3 * r['round_s'] / r['clients']:.4f}", f"{r['messages']:,}", f"{r['setup_bytes']:,}",
            f"{r['round_bytes']:,}", f"{analytic:,}", f"{r['peak_rss_mib']:,.0f}", f"{per_client_kib:.2f}",
        )
        records.append(record(
            "scale_runs", engine=r["engine"], n_clients=r["clients"], ring_bits=r["ring_bits"], build_s=r["build_s"],
            rest_s=r["rest_s"], round_s=r["round_s"], run_s=r["run_s"],
            round_ms_per_client=1e3 * r["round_s"] / r["clients"], messages=r["messages"], setup_bytes=r["setup_bytes"],
            round_bytes=r["round_bytes"], analytic_round_bytes=analytic, peak_rss_mib=r["peak_rss_mib"],
            rss_kib_per_client=per_client_kib,
        ))
    console.print(table)
    console.print(f"memory floor: a {FLOOR_CLIENTS}-client run peaks at {floor['peak_rss_mib']:,.0f} MiB (interpreter, JAX, kernels)")

    memory = Table(
        title=f"Memory per client above the {FLOOR_CLIENTS}-client floor, beside issue 34's target "
        f"({TARGET_KIB_PER_CLIENT:g} KiB at 100,000 clients), and the masked round ({args.engine} engine)",
        title_justify="left",
    )
    for col in (
        "clients", "peak RSS MiB", "floor MiB", "KiB/client", "target KiB/client", "KiB/client / target",
        "round 1 s", "round ms/client",
    ):
        memory.add_column(col, justify="right")
    for n_clients in memory_clients:
        r = by_clients[n_clients]
        kib = 1024 * (r["peak_rss_mib"] - floor["peak_rss_mib"]) / n_clients
        memory.add_row(
            f"{n_clients:,}", f"{r['peak_rss_mib']:,.0f}", f"{floor['peak_rss_mib']:,.0f}", f"{kib:.2f}",
            f"{TARGET_KIB_PER_CLIENT:.2f}", f"{kib / TARGET_KIB_PER_CLIENT:.2f}", f"{r['round_s']:.2f}",
            f"{1e3 * r['round_s'] / n_clients:.4f}",
        )
        records.append(record(
            "scale_memory", n_clients=n_clients, peak_rss_mib=r["peak_rss_mib"], floor_mib=floor["peak_rss_mib"],
            kib_per_client=kib, target_kib_per_client=TARGET_KIB_PER_CLIENT,
            ratio_to_target=kib / TARGET_KIB_PER_CLIENT, round_s=r["round_s"],
            round_ms_per_client=1e3 * r["round_s"] / n_clients, grouped_meter=r.get("grouped_meter", True),
        ))
    console.print(memory)

    base, big = results
    ratios = Table(
        title=f"Per client, {big['clients']:,} clients / {base['clients']:,} clients (1.00 = linear scaling)",
        title_justify="left",
    )
    for col in ("quantity", f"{base['clients']:,} clients", f"{big['clients']:,} clients", "ratio"):
        ratios.add_column(col, justify="left" if col == "quantity" else "right")
    quantities = [
        ("build ms/client", lambda r: 1e3 * r["build_s"] / r["clients"]),
        ("rest of the run ms/client", lambda r: 1e3 * r["rest_s"] / r["clients"]),
        ("round 1 ms/client", lambda r: 1e3 * r["round_s"] / r["clients"]),
        ("run ms/client", lambda r: 1e3 * r["run_s"] / r["clients"]),
        ("peak RSS KiB/client", lambda r: r["kib_per_client"]),
    ]
    for name, value in quantities:
        a, b = value(base), value(big)
        ratios.add_row(name, f"{a:.4f}", f"{b:.4f}", f"{b / a:.2f}" if a > 0 else "-")
        records.append(record(
            "scale_per_client", quantity=name, baseline_clients=base["clients"], baseline=a, clients=big["clients"],
            value=b, ratio=b / a if a > 0 else None,
        ))
    console.print(ratios)
    if "profile" in big:
        prof = Table(title=f"cProfile of the {big['clients']:,}-client run (by cumulative time)", title_justify="left")
        for col in ("function", "calls", "own s", "cumulative s"):
            prof.add_column(col, justify="left" if col == "function" else "right")
        for name, calls, own, cumulative in big["profile"]:
            prof.add_row(name, f"{calls:,}", f"{own:.2f}", f"{cumulative:.2f}")
        console.print(prof)
    if other is not None:
        lean, tasks = other
        engines = Table(
            title=f"The two engines at {lean['clients']:,} clients (same run, same bytes): tasks / lean",
            title_justify="left",
        )
        for col in ("quantity", "lean", "tasks (trio task per party)", "tasks / lean"):
            engines.add_column(col, justify="left" if col == "quantity" else "right")
        for name, key, scale_by in (
            ("round 1 s", "round_s", 1.0), ("run s", "run_s", 1.0), ("peak RSS MiB", "peak_rss_mib", 1.0),
        ):
            a, b = lean[key] * scale_by, tasks[key] * scale_by
            engines.add_row(name, f"{a:,.2f}", f"{b:,.2f}", f"{b / a:.2f}")
            records.append(record(
                "scale_engines", quantity=name, clients=lean["clients"], lean=a, tasks=b, ratio=b / a,
            ))
        if lean["round_bytes"] != tasks["round_bytes"] or lean["setup_bytes"] != tasks["setup_bytes"]:
            console.print("[red]the two engines metered different bytes[/red]")
        console.print(engines)
    if plus_runs:
        records += plus_table(console, plus_runs, args.plus_degree)
    write_records(args.json, records, console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

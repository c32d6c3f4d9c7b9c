"""Steady FastLloyd round time per transport: memory, TCP and MPI side by side, in one run.

What it measures
----------------
For each data set, FastLloyd with M = 2 clients (3 parties: ``server``, ``client-0``,
``client-1``; epsilon = 0.1, iid split, ``ring_bits="auto"``) runs over each transport:

* ``memory``: :class:`~fedproto.transports.memory.MemoryNetwork`, every party in this process;
* ``tcp``: :func:`~fedproto.transports.tcp.open_tcp_network` on loopback, every party in this
  process (HMAC handshake, length-prefixed frames; the handshake is setup, not a round);
* ``mpi``: :class:`~fedproto.transports.mpi.MpiTransport`, one party per rank: this script starts
  ``mpiexec -n 3`` on itself (``--mpi-worker``), every rank runs its party, and the server's rank
  writes its rounds back; the column is left out, with the reason, when mpi4py or mpiexec is
  missing. Two columns: the default receiving (a reader thread handing frames to trio) and, as
  the baseline, ``threaded=False`` (polling from trio with back-off sleeps, what the transport
  did before), in the same ``mpiexec`` job.

TLS is not a transport of fedproto yet, so it has no column.

Every run has a fixed ``--iterations`` T (default 12; FastLloyd's heuristic gives LSun only 2).
The figure is the *steady round*: the report's ``round_wall_s`` (one entry per algorithm round,
first frame of a round to the first frame of the next, setup excluded) without the first round
(JAX compilation for a new shape, first-round skew between parties) and the last (it ends when
the metered parties finish, not at a next round), pooled over ``--repeats`` runs after one
warm-up run, median kept, in ms. Over memory and TCP the meter sees every party; over MPI it is
the server's own meter (its clock, its frames), which sees the same round-to-round period.

Data: LSun (k = 3) and S1 (k = 15) from ``shared/data`` (``FEDPROTO_DATA`` or a ``shared/data``
above the working directory; a missing file is skipped with a note), and a 100k-point
TimeSynth-like set (k = 5, d = 2, :func:`fastlloyd_timing.timesynth`), all min-max normalised.

Run::

    python benchmarks/transport_rounds.py                # the three data sets (about a minute)
    python benchmarks/transport_rounds.py --quick        # LSun only, one run per transport
    python benchmarks/transport_rounds.py --json r.json  # also the table as JSON records

``--json PATH`` writes one record per data set (table ``transport_rounds``): ``data_set``,
``n_points``, ``k``, ``d``, ``iterations``, ``steady_rounds`` (rounds pooled per transport),
``memory_round_ms``, ``tcp_round_ms``, ``mpi_round_ms`` and ``mpi_polled_round_ms`` (``null``
without MPI), ``tcp_over_memory``, ``mpi_over_memory`` and ``mpi_polled_over_memory`` (``null``
without MPI).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import trio
from _common import add_common_arguments, make_console, median, parse_args, print_machine_facts, record, write_records
from fastlloyd_timing import EPSILON, N_CLIENTS, SESSION, build_parties, timesynth
from rich.table import Table

from fedproto.algorithms.fastlloyd.config import make_config
from fedproto.data import find_data_file, load_dataset, normalize
from fedproto.metering import Meter, RunReport
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.transports.memory import MemoryNetwork
from fedproto.transports.tcp import open_tcp_network

TITLE = "Steady FastLloyd round (ms) per transport, M = 2 clients"
#: data set -> k (LSun and S1 as in the papers; the TimeSynth-like set as in fastlloyd_timing).
DATA_SETS: dict[str, int] = {"lsun": 3, "s1": 15, "timesynth_100k": 5}
TIMESYNTH_N, TIMESYNTH_D = 100_000, 2
MPI_TIMEOUT_S = 600


def load(name: str, seed: int) -> np.ndarray | None:
    """The normalised points of data set ``name`` (``[n, d]`` float64), or None if its file is missing."""
    if name == "timesynth_100k":
        return timesynth(TIMESYNTH_N, DATA_SETS[name], TIMESYNTH_D, seed=seed)
    if find_data_file(name) is None:
        return None
    return normalize(load_dataset(name).x)


def fastlloyd_config(name: str, x: np.ndarray, iterations: int, seed: int) -> Any:
    """FastLloyd's public parameters for data set ``name`` with a fixed number of iterations."""
    return make_config("fastlloyd", n=len(x), k=DATA_SETS[name], d=x.shape[1], epsilon=EPSILON,
                       iterations=iterations, ring_bits="auto", init_seed=seed)


def steady_rounds_ms(report: RunReport) -> list[float]:
    """The run's round times without the first and the last round, in ms."""
    return [1e3 * s for s in report.round_wall_s[1:-1]]


async def run_in_process(x: np.ndarray, config: Any, transport: str, seed: int) -> RunReport:
    """One FastLloyd run with every party in this process over ``transport`` (memory or tcp)."""
    machines = build_parties(x, config, N_CLIENTS, seed=seed, session=SESSION)
    meter = Meter(trio.current_time)
    runtime = RuntimeConfig(session=SESSION)
    if transport == "memory":
        await run_parties(machines, MemoryNetwork(list(machines)), config=runtime, meter=meter)
    else:
        async with open_tcp_network(list(machines), os.urandom(32), session=SESSION) as endpoints:
            await run_parties(machines, endpoints, config=runtime, meter=meter)
    return meter.report(protocol="fastlloyd", transport=transport, session=SESSION, parties=list(machines))


async def run_mpi_rank(x: np.ndarray, config: Any, seed: int, threaded: bool) -> RunReport:
    """This rank's party of one FastLloyd run over MPI (``threaded``: the reader-thread receive,
    else the polled one); its own meter's report."""
    from fedproto.runtime import run_party
    from fedproto.transports.mpi import MpiNetwork

    machines = build_parties(x, config, N_CLIENTS, seed=seed, session=SESSION)
    meter = Meter(trio.current_time)
    async with MpiNetwork(threaded=threaded).endpoints(list(machines)) as endpoints:
        (party, endpoint), = endpoints.items()
        await run_party(machines[party], endpoint, config=RuntimeConfig(session=SESSION), meter=meter)
    return meter.report(protocol="fastlloyd", transport="mpi", session=SESSION, parties=list(machines))


def measure(name: str, x: np.ndarray, transport: str, args: argparse.Namespace) -> list[float]:
    """Steady round times (ms) pooled over ``args.repeats`` runs of one transport in this process."""
    config = fastlloyd_config(name, x, args.iterations, args.seed)
    seed, repeats, warmup = args.seed, args.repeats, not args.quick
    rounds: list[float] = []
    for r in range(-1 if warmup else 0, repeats):
        report = trio.run(functools.partial(run_in_process, x, config, transport, seed + 1 + max(r, 0)))
        if r >= 0:
            rounds += steady_rounds_ms(report)
    return rounds


def mpi_worker(args: argparse.Namespace) -> int:
    """Under ``mpiexec -n 3``: every rank runs its party; rank 0 (the server) writes its rounds."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    out: dict[str, dict[str, list[float]]] = {}
    for name in args.data_sets:
        x = load(name, args.seed)
        if x is None:
            continue
        config = fastlloyd_config(name, x, args.iterations, args.seed)
        out[name] = {}
        for mode in ("threaded", "polled"):
            rounds: list[float] = []
            for r in range(-1 if not args.quick else 0, args.repeats):
                world.Barrier()  # every rank starts the run together
                report = trio.run(functools.partial(run_mpi_rank, x, config, args.seed + 1 + max(r, 0),
                                                    mode == "threaded"))
                if r >= 0:
                    rounds += steady_rounds_ms(report)
            out[name][mode] = rounds
    if world.Get_rank() == 0:
        Path(args.mpi_worker).write_text(json.dumps(out))
    world.Barrier()
    return 0


def mpiexec() -> str | None:
    """``mpiexec`` next to this interpreter (MPICH from PyPI) or on PATH."""
    search = [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    return shutil.which("mpiexec", path=os.pathsep.join(search))


def measure_mpi(args: argparse.Namespace) -> tuple[dict[str, dict[str, list[float]]], str | None]:
    """Steady round times (ms) per data set and receive mode (``threaded``, ``polled``) from
    ``mpiexec -n 3`` on this script, or why not."""
    launcher = mpiexec()
    if importlib.util.find_spec("mpi4py") is None or launcher is None:
        return {}, "MPI column left out: mpi4py or mpiexec is missing (pip install 'fedproto[mpi]')"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mpi_rounds.json"
        command = [launcher, "-n", str(N_CLIENTS + 1), sys.executable, str(Path(__file__).resolve()),
                   "--mpi-worker", str(path), "--repeats", str(args.repeats), "--seed", str(args.seed),
                   "--iterations", str(args.iterations),
                   "--data-sets", *args.data_sets, *(["--quick"] if args.quick else [])]
        done = subprocess.run(command, capture_output=True, text=True, timeout=MPI_TIMEOUT_S)
        if done.returncode != 0 or not path.exists():
            raise RuntimeError(f"mpiexec failed with exit code {done.returncode}:\n{done.stderr[-4000:]}")
        return json.loads(path.read_text()), None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-sets", nargs="+", default=list(DATA_SETS), choices=list(DATA_SETS),
                        help="data sets to run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per transport (after one warm-up)")
    parser.add_argument("--iterations", type=int, default=12, help="FastLloyd iterations T per run (>= 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of data, split, entropy and noise")
    parser.add_argument("--mpi-worker", metavar="PATH", default=None, help=argparse.SUPPRESS)
    add_common_arguments(parser, quick="LSun only, one run per transport and no warm-up (a smoke test)")
    args = parse_args(parser, argv)
    if args.quick:
        args.data_sets, args.repeats, args.iterations = ["lsun"], 1, 4
    if args.iterations < 3:
        parser.error("--iterations must be at least 3 (the first and last rounds are not steady)")
    if args.mpi_worker is not None:
        return mpi_worker(args)

    console = make_console()
    print_machine_facts(console, TITLE, {
        "clients M": N_CLIENTS, "epsilon": EPSILON, "repeats (after 1 warm-up)": args.repeats,
        "iterations T": args.iterations,
        "round ms": "median of report.round_wall_s without the first and last rounds, pooled over repeats",
    })
    data: dict[str, np.ndarray] = {}
    for name in args.data_sets:
        x = load(name, args.seed)
        if x is None:
            console.print(f"{name}: data file not found (shared/data or FEDPROTO_DATA); skipped")
        else:
            data[name] = x
    args.data_sets = list(data)
    local = {
        (name, transport): measure(name, x, transport, args)
        for name, x in data.items() for transport in ("memory", "tcp")
    }
    mpi, why_not = measure_mpi(args)

    table = Table(title=TITLE, title_justify="left")
    for col in ("data set", "N", "k", "d", "rounds", "memory ms", "TCP ms", "MPI ms", "MPI polled ms",
                "TCP/memory", "MPI/memory", "MPI polled/memory"):
        table.add_column(col, justify="right")
    records = []
    for name, x in data.items():
        memory_ms, tcp_ms = median(local[name, "memory"]), median(local[name, "tcp"])
        mpi_ms = median(mpi[name]["threaded"]) if mpi.get(name) else None
        polled_ms = median(mpi[name]["polled"]) if mpi.get(name) else None
        records.append(record(
            "transport_rounds", data_set=name, n_points=len(x), k=DATA_SETS[name], d=x.shape[1],
            iterations=args.iterations, steady_rounds=len(local[name, "memory"]), memory_round_ms=memory_ms,
            tcp_round_ms=tcp_ms, mpi_round_ms=mpi_ms, mpi_polled_round_ms=polled_ms,
            tcp_over_memory=tcp_ms / memory_ms, mpi_over_memory=None if mpi_ms is None else mpi_ms / memory_ms,
            mpi_polled_over_memory=None if polled_ms is None else polled_ms / memory_ms,
        ))
        table.add_row(
            name, f"{len(x):,}", str(DATA_SETS[name]), str(x.shape[1]), str(len(local[name, "memory"])),
            f"{memory_ms:.2f}", f"{tcp_ms:.2f}", "-" if mpi_ms is None else f"{mpi_ms:.2f}",
            "-" if polled_ms is None else f"{polled_ms:.2f}",
            f"{tcp_ms / memory_ms:.2f}", "-" if mpi_ms is None else f"{mpi_ms / memory_ms:.2f}",
            "-" if polled_ms is None else f"{polled_ms / memory_ms:.2f}",
        )
    console.print(table)
    console.print("TLS: no TLS transport exists yet, so no column.")
    if why_not:
        console.print(why_not)
    write_records(args.json, records, console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

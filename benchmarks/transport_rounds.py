"""Steady FastLloyd round time per transport: memory, TCP (shared secret, TLS) and MPI side by side.

What it measures
----------------
For each data set, FastLloyd with M = 2 clients (3 parties: ``server``, ``client-0``,
``client-1``; epsilon = 0.1, iid split, ``ring_bits="auto"``) runs over each transport:

* ``memory``: :class:`~fedproto.transports.memory.MemoryNetwork`, every party in one process;
* ``tcp_secret`` and ``tcp_tls``: :func:`~fedproto.transports.tcp.open_tcp_network` on loopback
  with every party in one process, in the star topology (the server is the hub; what ``fedproto
  run --transport tcp`` uses): links with the insecure shared-secret handshake (HMAC, plaintext
  frames), and links with mutual TLS 1.3 (the default; a throwaway federation's certificates).
  The handshakes are setup, not rounds;
* ``mpi``: :class:`~fedproto.transports.mpi.MpiTransport`, one party per rank, receiving as it
  does by default on one host (``receive_mode="doorbell"``: a waiting receive sleeps on a Unix
  datagram socket that the sender rings after its ``Isend``);
* ``mpi_thread``, the baseline of the MPI column: the same with ``receive_mode="thread"`` (a
  reader thread polls ``Improbe`` with 10-100 us sleeps and hands frames to trio; the default
  before doorbells, and still the one when ranks span hosts).

When mpi4py and ``mpiexec`` are there, the script starts ``mpiexec -n 3`` on itself
(``--mpi-worker``) and *every* transport is measured inside that job, interleaved: for each data
set, one warm-up run per transport, then ``--repeats`` rounds of one run per transport, in an
order rotated each time, so that a change of the machine's load hits every column alike. Rank 0
runs the memory and TCP runs alone (ranks 1 and 2 wait in a barrier polled every 5 ms) and is
the server of the MPI runs, writing its rounds back. Without MPI the memory and TCP runs happen in
this process and the MPI columns are left out, with the reason.

Every run has a fixed ``--iterations`` T (default 12; FastLloyd's heuristic gives LSun only 2).
The figure is the *steady round*: the report's ``round_wall_s`` (one entry per algorithm round,
first frame of a round to the first frame of the next, setup excluded) without the first round
(JAX compilation for a new shape, first-round skew between parties) and the last (it ends when
the metered parties finish, not at a next round), pooled over the repeats, median kept, in ms.
Over memory and TCP the meter sees every party; over MPI it is the server's own meter (its clock,
its frames), which sees the same round-to-round period. The load average is printed at the start
and the end: the CPU may be shared.

Data: LSun (k = 3) and S1 (k = 15) by name (found in a ``FEDPROTO_DATA`` directory, e.g.
``FEDPROTO_DATA=../shared/data``, or fetched by ``fedproto data fetch lsun s1``; a missing set is
skipped with a note), and a 100k-point
TimeSynth-like set (k = 5, d = 2, :func:`fastlloyd_timing.timesynth`), all min-max normalised.

Run::

    python benchmarks/transport_rounds.py                # the three data sets (a few minutes)
    python benchmarks/transport_rounds.py --quick        # LSun only, one run per transport
    python benchmarks/transport_rounds.py --json r.json  # also the table as JSON records

``--json PATH`` writes one record per data set (table ``transport_rounds``): ``data_set``,
``n_points``, ``k``, ``d``, ``iterations``, ``steady_rounds`` (rounds pooled per transport),
``memory_round_ms``, ``tcp_secret_round_ms``, ``tcp_tls_round_ms``, ``mpi_round_ms`` and
``mpi_thread_round_ms`` (``null`` without MPI), ``tcp_secret_over_memory``,
``tcp_tls_over_memory``, ``mpi_over_memory`` and ``mpi_thread_over_memory`` (``null`` without
MPI; the target is ``mpi_over_memory <= 1.5``), ``load_average_start`` and ``load_average_end``
(the 1-minute load average before and after the whole measurement).
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
import time
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
#: transports run with every party in this process, and over MPI (one party per rank).
IN_PROCESS = ("memory", "tcp_secret", "tcp_tls")
OVER_MPI = ("mpi", "mpi_thread")
#: column headings
LABELS = {"memory": "memory", "tcp_secret": "TCP secret", "tcp_tls": "TCP TLS", "mpi": "MPI", "mpi_thread": "MPI thread"}
#: the MPI target: the steady round over MPI at most this many times the memory transport's
MPI_TARGET = 1.5
MPI_TIMEOUT_S = 1800
BARRIER_POLL_S = 5e-3


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
    """One FastLloyd run with every party in this process over ``transport`` (one of ``IN_PROCESS``)."""
    machines = build_parties(x, config, N_CLIENTS, seed=seed, session=SESSION)
    meter = Meter(trio.current_time)
    runtime = RuntimeConfig(session=SESSION)
    roster = list(machines)  # the server first: the star's hub
    if transport == "memory":
        await run_parties(machines, MemoryNetwork(roster), config=runtime, meter=meter)
    else:
        secret = os.urandom(32) if transport == "tcp_secret" else None
        async with open_tcp_network(roster, secret, session=SESSION, topology="star") as endpoints:
            await run_parties(machines, endpoints, config=runtime, meter=meter)
    return meter.report(protocol="fastlloyd", transport=transport, session=SESSION, parties=roster)


async def run_mpi_rank(x: np.ndarray, config: Any, seed: int, transport: str) -> RunReport:
    """This rank's party of one FastLloyd run over MPI (``transport``: one of ``OVER_MPI``); its
    own meter's report."""
    from fedproto.runtime import run_party
    from fedproto.transports.mpi import MpiNetwork

    machines = build_parties(x, config, N_CLIENTS, seed=seed, session=SESSION)
    meter = Meter(trio.current_time)
    network = MpiNetwork(receive_mode="doorbell" if transport == "mpi" else "thread")
    async with network.endpoints(list(machines)) as endpoints:
        (party, endpoint), = endpoints.items()
        await run_party(machines[party], endpoint, config=RuntimeConfig(session=SESSION), meter=meter)
    return meter.report(protocol="fastlloyd", transport="mpi", session=SESSION, parties=list(machines))


def measure(data: dict[str, np.ndarray], args: argparse.Namespace, world: Any = None) -> dict[str, dict[str, list[float]]]:
    """Steady round times (ms) per data set and transport, the transports interleaved.

    Args:
        data: the points of each data set.
        world: ``MPI.COMM_WORLD`` under ``mpiexec`` (the MPI transports too; rank 0 runs the
            in-process ones alone), or ``None`` (the in-process transports only).
    """
    transports = IN_PROCESS + (OVER_MPI if world is not None else ())
    rank = 0 if world is None else world.Get_rank()
    out: dict[str, dict[str, list[float]]] = {}
    for name, x in data.items():
        config = fastlloyd_config(name, x, args.iterations, args.seed)
        rounds: dict[str, list[float]] = {t: [] for t in transports}
        for r in range(0 if args.quick else -1, args.repeats):  # r = -1: one warm-up run each
            shift = max(r, 0) % len(transports)
            for transport in transports[shift:] + transports[:shift]:
                seed = args.seed + 1 + max(r, 0)
                if world is not None:
                    sleeping_barrier(world)  # every rank starts the run together
                if transport in OVER_MPI:
                    report = trio.run(functools.partial(run_mpi_rank, x, config, seed, transport))
                elif rank == 0:
                    report = trio.run(functools.partial(run_in_process, x, config, transport, seed))
                else:
                    continue
                if r >= 0:
                    rounds[transport] += steady_rounds_ms(report)
        out[name] = rounds
    return out


def sleeping_barrier(world: Any) -> None:
    """A barrier whose waiting ranks sleep (MPI's own ``Barrier`` may busy-poll a core)."""
    request = world.Ibarrier()
    while not request.Test():
        time.sleep(BARRIER_POLL_S)


def mpi_worker(args: argparse.Namespace) -> int:
    """Under ``mpiexec -n 3``: every transport, interleaved; rank 0 writes the rounds."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    data = {name: x for name in args.data_sets if (x := load(name, args.seed)) is not None}
    out = measure(data, args, world)
    if world.Get_rank() == 0:
        Path(args.mpi_worker).write_text(json.dumps(out))
    sleeping_barrier(world)
    return 0


def mpiexec() -> str | None:
    """``mpiexec`` next to this interpreter (MPICH from PyPI) or on PATH."""
    search = [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    return shutil.which("mpiexec", path=os.pathsep.join(search))


def measure_with_mpi(args: argparse.Namespace) -> tuple[dict[str, dict[str, list[float]]] | None, str | None]:
    """Every transport's steady round times (ms) per data set from ``mpiexec -n 3`` on this script,
    or ``(None, why not)`` when mpi4py or mpiexec is missing."""
    launcher = mpiexec()
    if importlib.util.find_spec("mpi4py") is None or launcher is None:
        return None, "MPI columns left out: mpi4py or mpiexec is missing (pip install 'fedproto[mpi]')"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rounds.json"
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
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per transport (after one warm-up)")
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
    load_start = os.getloadavg()[0]
    print_machine_facts(console, TITLE, {
        "clients M": N_CLIENTS, "epsilon": EPSILON, "repeats (after 1 warm-up)": args.repeats,
        "iterations T": args.iterations,
        "round ms": "median of report.round_wall_s without the first and last rounds, pooled over repeats",
        "TCP": "loopback, every party in one process, star topology (the server is the hub); "
               "TCP secret = shared-secret handshake (HMAC), plaintext frames (insecure); TCP TLS = mutual TLS 1.3",
        "MPI": "mpiexec -n 3, one party per rank; MPI = receive_mode 'doorbell' (the default on one host); "
               "MPI thread = receive_mode 'thread' (reader thread polling Improbe with 10-100 us sleeps)",
        "schedule": "transports interleaved run by run (order rotated each repeat)",
    })
    data: dict[str, np.ndarray] = {}
    for name in args.data_sets:
        x = load(name, args.seed)
        if x is None:
            console.print(f"{name}: not in FEDPROTO_DATA nor fetched (fedproto data fetch {name}); skipped")
        else:
            data[name] = x
    args.data_sets = list(data)
    rounds, why_not = measure_with_mpi(args)
    if rounds is None:
        rounds = measure(data, args)
    load_end = os.getloadavg()[0]

    transports = [t for t in (*IN_PROCESS, *OVER_MPI) if all(t in rounds[name] for name in data)]
    table = Table(title=TITLE, title_justify="left")
    for col in ("data set", "N", "k", "rounds", *(f"{LABELS[t]} ms" for t in transports),
                *(f"{LABELS[t]}/mem" for t in transports if t != "memory")):
        table.add_column(col, justify="right")
    records = []
    for name, x in data.items():
        ms = {t: median(rounds[name][t]) for t in transports}
        over = {t: ms[t] / ms["memory"] for t in transports if t != "memory"}
        records.append(record(
            "transport_rounds", data_set=name, n_points=len(x), k=DATA_SETS[name], d=x.shape[1],
            iterations=args.iterations, steady_rounds=len(rounds[name]["memory"]),
            **{f"{t}_round_ms": ms.get(t) for t in (*IN_PROCESS, *OVER_MPI)},
            **{f"{t}_over_memory": over.get(t) for t in (*IN_PROCESS, *OVER_MPI) if t != "memory"},
            load_average_start=load_start, load_average_end=load_end,
        ))
        table.add_row(
            name, f"{len(x):,}", str(DATA_SETS[name]), str(len(rounds[name]["memory"])),
            *(f"{ms[t]:.2f}" for t in transports),
            *(f"{over[t]:.2f}" + (" ok" if over[t] <= MPI_TARGET else " MISS") * (t == "mpi") for t in over),
        )
    console.print(table)
    console.print(f"MPI target: MPI/memory <= {MPI_TARGET}. Load average (1 min): {load_start:.2f} at the "
                  f"start, {load_end:.2f} at the end, on {os.cpu_count()} CPUs.", highlight=False)
    if why_not:
        console.print(why_not)
    write_records(args.json, records, console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

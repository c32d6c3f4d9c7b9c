"""FastLloyd over MPI ranks: strong and weak scaling of the sharded lean engine.

What it measures
----------------
The run of ``scale.py`` (FastLloyd, 10 points per client of a synthetic mixture, k = 5, d = 2,
``epsilon=1.0``, ``iterations=2``, ring Z_2^64, every frame encoded, metered and decoded), spread
over R MPI ranks by :class:`fedproto.shards.Shards` (the default block placement: the server and
the first block of clients on rank 0) and :func:`fedproto.simulation.simulate` (``shards=``).
Launch it under ``mpiexec``; R goes up to the job's size::

    mpiexec -n 2 python benchmarks/scale_out.py                   # 100,000 clients, R = 1, 2
    mpiexec -n 2 python benchmarks/scale_out.py --repeats 2       # each configuration twice
    mpiexec -n 2 python benchmarks/scale_out.py --profile 2       # cProfile every rank at R = 2
    mpiexec -n 16 python benchmarks/scale_out.py --clients 1000000 --ranks 4,8,16 --weak-clients 0
    mpiexec -n 16 python benchmarks/scale_out.py --round-only --clients 10000000 --ranks 16 --weak-clients 0
    python benchmarks/scale_out.py --quick                        # without mpiexec: R = 1 only
    mpiexec -n 2 python benchmarks/scale_out.py --quick --json s.json

Every rank builds only its own parties' machines (``Shards(roster, comm).local``): each client's
points and entropy are derived from its index (blocks of :data:`CHUNK` clients drawn from a
generator seeded by ``(seed, block)``, each block normalised to [-1, 1] on its own), so any rank
builds any client and the run's data do not depend on R. All configurations run in the same
invocation: for R ranks ``COMM_WORLD`` is split into a sub-communicator of its first R ranks; the
other ranks wait in a non-blocking barrier tested with short sleeps (they spin no core). Per
configuration (``--ranks``: the rank counts, by default 1, 2, 4, ... and the job's size):

* **strong scaling**: ``--clients`` clients (default 100,000) at every R;
* **weak scaling**: ``--weak-clients`` clients per rank (default 50,000; 0: none); a
  configuration that strong scaling already ran (same clients, same R) is measured once.

``--rank0-weight W`` places the clients in contiguous blocks with rank 0's ``W`` times another
rank's (rank 0 also hosts the coordinator, whose work is serial): a placement of one's own, as
``Shards(placement=)`` and ``fedproto run --placement`` allow; results and bytes are the same.

Figures (rank 0's clock, ranks lined up by barriers):

* ``build``: the ``Shards`` and this rank's machines (each client derives its X25519 key
  pair), the slowest rank's; ``run``: ``simulate`` to its end (the meters gathered);
  ``run + build``: both, the whole run build included;
* ``round 1``: the server's broadcast of round 0's aggregate to its broadcast of round 1's, as
  ``scale.py`` defines it (an observer of the server, on rank 0);
* ``speed-up``: the R = 1 run's seconds over this run's (strong, same repeat); for weak scaling the
  throughput ratio, clients per second at R over clients per second at R = 1 (ideal: R in both).
  Without R = 1 among ``--ranks`` (10^6 clients at R = 1 take about 16 minutes) the smallest R
  measured is the baseline (ideal: R over it);
* ``serial s`` and ``serial %``: work only one party can do, timed around those machines' calls
  without changing them: the coordinator's handlers (its ``receive``/``handle``), the engine's
  decoding of every frame for it and its encoding and metering of every frame it sends, and
  client 0's handling of the key roster (it seals the shared seed for every other client); the
  share is of the run's seconds;
* ``exchange %``: the seconds each rank spent in the exchanges between ranks
  (:attr:`fedproto.shards.Shards.wait_s`, the report's ``ranks``: waiting for the slowest rank and
  moving frames), mean and maximum over ranks, as a share of the run;
* ``peak RSS``: per rank, its peak resident set during this configuration. The configurations
  share processes, and ``ru_maxrss`` only grows, so before each one the kernel's high-water mark
  is reset to the current RSS (``/proc/self/clear_refs``, Linux 4.0 on) and read back from
  ``VmHWM`` after it; the RSS at the start (what earlier configurations left: the interpreter,
  JAX, compiled kernels, allocator caches) is printed beside it. Where the reset is refused the
  peak is the process's since it started (said in the output). Fresh processes per configuration
  (``mpiexec`` started again by rank 0) were not chosen: a nested ``mpiexec`` inside an MPI job
  inherits its process-manager environment, and a job per configuration pays MPI start-up and
  JAX's import every time;
* bytes: the report's round-1 bytes beside the analytic ``2 M k (d+1) w/8`` plus one envelope per
  frame (as ``scale.py``); results: a digest of client 0's final centroids, the same at every R.

``--round-only``: no key agreement. Every client installs one shared mask seed (a benchmark
constant) and sends its round-0 update at once; the server starts collecting: two rounds, the
second a steady round as above, for client counts whose set-up (M - 1 seeds sealed by client 0
alone, M - 1 relayed by the server) would dominate. Each client still derives its X25519 key pair
when it is built (about 0.1-0.2 ms). Round bytes are unchanged, setup bytes are 0, and the
centroids are those of the full run (the masks cancel in the sum whatever the seed).

``--json PATH`` writes one record per row: table ``scale_out_runs`` (``scaling``, ``repeat``,
``ranks``, ``n_clients``, ``clients_per_rank``, ``build_s``, ``run_s``, ``run_with_build_s``,
``round_s``, ``speed_up``, ``speed_up_with_build``, ``serial_s``, ``coordinator_s``,
``seal_s``, ``serial_percent``, ``exchange_percent_mean``, ``exchange_percent_max``,
``peak_rss_mib_max``, ``peak_rss_mib_rank0``, ``start_rss_mib_max``, ``round_bytes``,
``analytic_round_bytes``, ``setup_bytes``, ``messages``, ``result_digest``, ``rank0_weight``) and table
``scale_out_ranks`` (``scaling``, ``repeat``, ``ranks``, ``n_clients``, ``rank``, ``parties``,
``build_s``, ``exchange_s``, ``exchange_percent``, ``peak_rss_mib``, ``start_rss_mib``, ``coordinator_s``,
``seal_s``); with
``--profile``, table ``scale_out_profile`` (``rank``, ``function``, ``calls``, ``own_s``,
``cumulative_s``).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import io
import math
import pstats
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import add_common_arguments, make_console, parse_args, print_machine_facts, record, write_records
from rich.table import Table
from scale import D, EPSILON, ITERATIONS, K, RING_BITS, SESSION, analytic_round_bytes, envelopes

import fedproto.simulation as simulation_module
from fedproto.algorithms.fastlloyd.config import make_config
from fedproto.algorithms.fastlloyd.messages import MaskedUpdate, PublicKey, PublicKeys, SealedSeeds
from fedproto.algorithms.fastlloyd.protocol import ClientState, FastLloydClient, FastLloydServer, ServerState
from fedproto.data import normalize
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig
from fedproto.simulation import simulate

TITLE = "FastLloyd over MPI ranks: strong and weak scaling of the sharded lean engine"
#: Clients per block of generated data: a client's points and entropy come from its block's generator.
CHUNK = 1024
#: The mask seed every client installs with ``--round-only`` (no key agreement).
ROUND_ONLY_SEED = hashlib.sha256(b"fedproto/benchmarks/scale_out/round-only").digest()
#: Frames whose message type only the coordinator receives (decoded for it, at its rank).
TO_SERVER = (PublicKey, SealedSeeds, MaskedUpdate)


# --- data and machines ----------------------------------------------------------------------------


def client_data(first: int, last: int, points: int, seed: int) -> tuple[np.ndarray, bytes]:
    """Points ``[(last - first) * points, 2]`` and entropy (32 bytes per client) of clients
    ``first .. last - 1``: the same for a client whichever rank builds it (its block's generator)."""
    centres = np.random.default_rng(seed).uniform(-5, 5, size=(K, D))
    xs, entropy = [], []
    for block in range(first // CHUNK, (last - 1) // CHUNK + 1 if last > first else first // CHUNK):
        rng = np.random.default_rng([seed, block])
        labels = rng.integers(0, K, size=CHUNK * points)
        x = normalize(centres[labels] + rng.normal(size=(CHUNK * points, D)))
        e = rng.bytes(32 * CHUNK)
        lo, hi = max(first, block * CHUNK) - block * CHUNK, min(last, (block + 1) * CHUNK) - block * CHUNK
        xs.append(x[lo * points : hi * points])
        entropy.append(e[32 * lo : 32 * hi])
    return (np.concatenate(xs) if xs else np.zeros((0, D))), b"".join(entropy)


class RoundOnlyClient(FastLloydClient):
    """A FastLloyd client with no key agreement: it installs :data:`ROUND_ONLY_SEED` and sends its
    round-0 update at start (``--round-only``)."""

    def _start(self):  # noqa: ANN202 - the base class's
        self._install_seed(ROUND_ONLY_SEED)
        self.move_to(ClientState.ITERATING)
        return [self._update()]


class RoundOnlyServer(FastLloydServer):
    """A FastLloyd server that collects round 0's updates at once (``--round-only``)."""

    def _start(self):  # noqa: ANN202 - the base class's
        self.move_to(ServerState.COLLECT)
        return []


def build(local: tuple[str, ...], n_clients: int, points: int, seed: int, round_only: bool) -> dict:
    """This rank's machines (``local``: parties in roster order, the server ``"server"``, client
    ``i`` ``"client-i"``; one shared client tuple)."""
    config = make_config(
        "fastlloyd", n=n_clients * points, k=K, d=D, epsilon=EPSILON, iterations=ITERATIONS, init_seed=seed,
        ring_bits=RING_BITS,
    )
    clients = tuple(f"client-{i}" for i in range(n_clients))
    server_cls, client_cls = (RoundOnlyServer, RoundOnlyClient) if round_only else (FastLloydServer, FastLloydClient)
    machines: dict = {}
    indices = [int(p.split("-", 1)[1]) for p in local if p != "server"]
    if "server" in local:
        machines["server"] = server_cls("server", config=config, clients=clients, noise_seed=seed, session=SESSION)
    if indices:
        first, last = indices[0], indices[-1] + 1
        assert indices == list(range(first, last)), "a rank's clients form one block"
        x, entropy = client_data(first, last, points, seed)
        for j, i in enumerate(range(first, last)):
            machines[clients[i]] = client_cls(
                clients[i], config=config, server="server", clients=clients, points=x[j * points : (j + 1) * points],
                entropy=entropy[32 * j : 32 * (j + 1)], session=SESSION,
            )
    return machines


# --- timing of the serial work ----------------------------------------------------------------------


class SerialClock:
    """Seconds of work only one party can do, timed around the calls (results unchanged): the
    coordinator's ``receive``/``handle``, the engine's decoding of frames for it and encoding
    and metering of frames from it, client 0's handling of the key roster (sealing)."""

    def __init__(self) -> None:
        self.coordinator_s = 0.0
        self.seal_s = 0.0
        self._saved: dict[str, Any] = {}

    def install(self, machines: dict) -> None:
        clock = time.perf_counter
        server = machines.get("server")
        if server is not None:
            for name in ("receive", "handle"):
                setattr(server, name, self._timed(getattr(server, name), "coordinator_s"))
        first = machines.get("client-0")
        if first is not None:
            receive = first.receive

            def timed_receive(sender, message, **kwargs):  # noqa: ANN001, ANN202
                if type(message) is not PublicKeys:
                    return receive(sender, message, **kwargs)
                t0 = clock()
                try:
                    return receive(sender, message, **kwargs)
                finally:
                    self.seal_s += clock() - t0

            first.receive = timed_receive
        decode, encode = simulation_module.decode_frame, simulation_module._encode_and_meter
        self._saved = {"decode_frame": decode, "_encode_and_meter": encode}

        def timed_decode(frame, **kwargs):  # noqa: ANN001, ANN202
            t0 = clock()
            out = decode(frame, **kwargs)
            if isinstance(out[1], TO_SERVER):
                self.coordinator_s += clock() - t0
            return out

        def timed_encode(machine, *args):  # noqa: ANN001, ANN202
            if machine is not server:
                return encode(machine, *args)
            t0 = clock()
            try:
                return encode(machine, *args)
            finally:
                self.coordinator_s += clock() - t0

        simulation_module.decode_frame = timed_decode
        simulation_module._encode_and_meter = timed_encode

    def _timed(self, method: Any, counter: str) -> Any:
        clock = time.perf_counter

        def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            t0 = clock()
            try:
                return method(*args, **kwargs)
            finally:
                setattr(self, counter, getattr(self, counter) + clock() - t0)

        return timed

    def uninstall(self) -> None:
        for name, value in self._saved.items():
            setattr(simulation_module, name, value)
        self._saved = {}


# --- memory -------------------------------------------------------------------------------------------


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS to its current RSS (Linux >= 4.0); False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_mib() -> float:
    """Current resident set (MiB); the peak where ``/proc`` is missing."""
    kib = _status_kib("VmRSS")
    return (kib if kib is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024


def peak_rss_mib() -> float:
    """Peak resident set since the last :func:`reset_peak_rss` (MiB; ``ru_maxrss`` where no ``/proc``)."""
    kib = _status_kib("VmHWM")
    return (kib if kib is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024


# --- MPI helpers --------------------------------------------------------------------------------------


def quiet_barrier(comm: Any) -> None:
    """A barrier that does not spin a core: ``Ibarrier`` tested with short sleeps."""
    if comm is None or comm.Get_size() == 1:
        return
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.001)


def world() -> Any:
    """``MPI.COMM_WORLD``, or ``None`` without mpi4py (then R = 1 runs without shards)."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD


# --- one configuration ----------------------------------------------------------------------------------


def measure(comm: Any, n_clients: int, args: argparse.Namespace, profile: bool) -> dict | None:
    """Run one configuration on every rank of ``comm`` (R = its size); rank 0's figures, else None."""
    from fedproto.shards import Shards

    rank = comm.Get_rank() if comm is not None else 0
    gc.collect()
    reset = reset_peak_rss()
    start_rss = rss_mib()
    quiet_barrier(comm)
    t0 = time.perf_counter()
    roster = ("server", *(f"client-{i}" for i in range(n_clients)))
    placement = weighted_placement(roster, comm.Get_size(), args.rank0_weight) if comm is not None else None
    shards = Shards(roster, comm, placement=placement) if comm is not None else None
    local = shards.local if shards is not None else roster
    machines = build(local, n_clients, args.points, args.seed, args.round_only)
    built = time.perf_counter()
    gc.collect()
    gc.freeze()  # the machines live to the end: the collector need not scan them again
    quiet_barrier(comm)
    t1 = time.perf_counter()
    serial = SerialClock()
    serial.install(machines)
    broadcast_at: dict[int, float] = {}

    def observer(party: str, round_idx: int, state: str) -> None:
        if party == "server":
            broadcast_at.setdefault(round_idx, time.perf_counter())

    meter = Meter(time.perf_counter)
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    try:
        results = simulate(
            machines, config=RuntimeConfig(session=SESSION, deadline_s=3600.0), meter=meter, observer=observer,
            shards=shards,
        )
    finally:
        if profiler is not None:
            profiler.disable()
        serial.uninstall()
    t2 = time.perf_counter()
    mine = {
        "rank": rank, "parties": len(machines), "build_s": built - t0, "run_s": t2 - t1,
        "exchange_s": shards.wait_s if shards is not None else 0.0, "peak_rss_mib": peak_rss_mib(),
        "start_rss_mib": start_rss, "coordinator_s": serial.coordinator_s, "seal_s": serial.seal_s,
        "profile": _profile_rows(profiler, args.profile_top) if profiler is not None else None,
    }
    if profiler is not None and args.profile_dir is not None:
        profiler.dump_stats(str(args.profile_dir / f"scale_out_r{comm.Get_size() if comm else 1}_rank{rank}.prof"))
    out = None
    if rank == 0:
        report = meter.report(protocol="fastlloyd", transport="memory", session=SESSION, parties=list(roster))
        centroids = results["client-0"].centroids
        out = {
            "clients": n_clients, "build_s": t1 - t0, "run_s": t2 - t1, "round_s": broadcast_at.get(ITERATIONS, math.nan)
            - broadcast_at.get(ITERATIONS - 1, math.nan), "messages": report.messages, "setup_bytes": report.setup_bytes,
            "round_bytes": report.bytes_by_round().get(ITERATIONS - 1, 0), "peak_reset": reset,
            "digest": hashlib.sha256(np.ascontiguousarray(centroids).tobytes()).hexdigest()[:12],
        }
    gathered = comm.gather(mine, root=0) if comm is not None else [mine]
    gc.unfreeze()
    del machines, results, meter
    gc.collect()
    if out is not None:
        out["ranks"] = gathered
    return out


def _profile_rows(profiler: cProfile.Profile, top: int) -> list[list[Any]]:
    stats = pstats.Stats(profiler, stream=io.StringIO())
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [
        [f"{name} ({filename.split('site-packages/')[-1].rsplit('/work/', 1)[-1]}:{line})", ncalls, own, cumulative]
        for (filename, line, name), (_, ncalls, own, cumulative, _) in rows
    ]


def weighted_placement(roster: tuple[str, ...], size: int, rank0_weight: float) -> dict[str, int] | None:
    """The coordinator on rank 0 and the clients in contiguous blocks, rank 0's block
    ``rank0_weight`` times the others' (it also does the coordinator's work); ``None`` (the default
    block placement) for weight 1."""
    if rank0_weight == 1.0 or size == 1:
        return None
    clients = roster[1:]
    total = rank0_weight + size - 1
    bounds = [round(len(clients) * (rank0_weight + r) / total) for r in range(size)]  # end of rank r's block
    placement, rank = {roster[0]: 0}, 0
    for j, party in enumerate(clients):
        while j >= bounds[rank]:
            rank += 1
        placement[party] = rank
    return placement


def run_configuration(comm_world: Any, ranks: int, n_clients: int, args: argparse.Namespace, profile: bool) -> dict | None:
    """Run one configuration on the first ``ranks`` ranks of ``comm_world``; the others wait."""
    if comm_world is None:
        return measure(None, n_clients, args, profile)
    from mpi4py import MPI

    rank = comm_world.Get_rank()
    sub = comm_world.Split(0 if rank < ranks else MPI.UNDEFINED, rank)
    out = None
    try:
        if rank < ranks:
            out = measure(sub, n_clients, args, profile)
    finally:
        if sub != MPI.COMM_NULL:
            sub.Free()
    quiet_barrier(comm_world)
    return out


# --- main ---------------------------------------------------------------------------------------------------


def rank_counts(size: int, chosen: str | None) -> list[int]:
    """The rank counts to measure: ``chosen`` ("4,8,16"), else 1, 2, 4, ... and ``size``."""
    if chosen:
        counts = sorted({int(c) for c in chosen.split(",")})
        bad = [c for c in counts if not 1 <= c <= size]
        if bad:
            raise SystemExit(f"--ranks {bad[0]}: this job has {size} rank(s) (start it with mpiexec -n {bad[0]} or more)")
        return counts
    counts, r = [], 1
    while r <= size:
        counts.append(r)
        r *= 2
    return counts + ([size] if counts[-1] != size else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100_000, help="clients of the strong-scaling runs")
    parser.add_argument("--weak-clients", type=int, default=50_000, help="clients per rank of the weak-scaling runs (0: none)")
    parser.add_argument("--ranks", default=None, help="rank counts to measure, e.g. 4,8,16 (default: 1, 2, 4, ... and the job's size)")
    parser.add_argument("--repeats", type=int, default=1, help="measure every configuration this many times, interleaved")
    parser.add_argument("--round-only", action="store_true", help="no key agreement: a shared seed installed at start")
    parser.add_argument("--rank0-weight", type=float, default=1.0,
                        help="rank 0's block of clients relative to another rank's (it also hosts the coordinator); "
                        "1: the default block placement")
    parser.add_argument("--points", type=int, default=10, help="points per client")
    parser.add_argument("--seed", type=int, default=0, help="seed of data, entropy and noise")
    parser.add_argument("--profile", type=int, nargs="?", const=2, default=None, metavar="R",
                        help="cProfile every rank of the strong-scaling run at R ranks (default 2) and print each rank's top")
    parser.add_argument("--profile-top", type=int, default=20, help="functions per rank in the profile table")
    parser.add_argument("--profile-dir", type=Path, default=None, help="also dump each profiled rank's pstats file here")
    add_common_arguments(parser, quick="smoke test: 1,000 clients (strong) and 500 per rank (weak)")
    args = parse_args(parser, argv)
    if args.quick:
        args.clients, args.weak_clients = 1_000, 500
    comm = world()
    size = comm.Get_size() if comm is not None else 1
    rank = comm.Get_rank() if comm is not None else 0
    counts = rank_counts(size, args.ranks)
    console = make_console() if rank == 0 else None
    if console is not None:
        print_machine_facts(console, TITLE, {
            "ranks (job size)": f"{', '.join(map(str, counts))} ({size}{'' if comm is not None else ', no mpi4py'})",
            "clients, strong (weak: per rank)": f"{args.clients:,} ({args.weak_clients:,})",
            "set-up": "none (--round-only: one shared seed)" if args.round_only else "key agreement (X25519, sealed seed)",
            "points per client": args.points,
            "k, d, epsilon, iterations, ring": f"{K}, {D}, {EPSILON}, {ITERATIONS}, Z_2^{RING_BITS}",
            "repeats": args.repeats,
            "placement": "block (default)" if args.rank0_weight == 1.0 else f"rank 0's block x{args.rank0_weight} of the others'",
            "each configuration": "the first R ranks (COMM_WORLD split); peak RSS reset before each",
        })

    # untimed warm-up on every rank: compiles what the clients' shapes need
    simulate(build(("server", "client-0", "client-1"), 2, args.points, args.seed, args.round_only),
             config=RuntimeConfig(session=SESSION, deadline_s=3600.0))
    plan: list[tuple[str, int, int, int]] = []  # (scaling, repeat, ranks, clients)
    for repeat in range(args.repeats):
        plan += [("strong", repeat, r, args.clients) for r in counts]
        if args.weak_clients > 0:
            plan += [("weak", repeat, r, args.weak_clients * r) for r in counts]
    done: dict[tuple[int, int, int], dict | None] = {}
    rows: list[tuple[str, int, int, dict]] = []
    for scaling, repeat, ranks, clients in plan:
        key = (repeat, ranks, clients)
        if key not in done:
            if console is not None:
                console.print(f"{scaling} scaling, repeat {repeat + 1}: {clients:,} clients on {ranks} rank(s) ...")
            if args.profile_dir is not None and rank == 0:
                args.profile_dir.mkdir(parents=True, exist_ok=True)
            profile = scaling == "strong" and args.profile == ranks and repeat == 0
            done[key] = run_configuration(comm, ranks, clients, args, profile)
        if rank == 0:
            rows.append((scaling, repeat, ranks, done[key]))
    if console is not None:
        report(console, rows, args)
    return 0


def report(console: Any, rows: list[tuple[str, int, int, dict]], args: argparse.Namespace) -> None:
    """Print the tables and write the records (rank 0)."""
    up, down = envelopes()
    smallest = min(ranks for _, _, ranks, _ in rows)
    base: dict[tuple[str, int], dict] = {(s, rep): r for s, rep, ranks, r in rows if ranks == smallest}
    table = Table(
        title="FastLloyd over R ranks: whole run and one steady round (round 1); "
        f"speed-up against R = {smallest} of the same repeat",
        title_justify="left",
    )
    for col in (
        "scaling", "rep", "R", "clients", "build s", "run s", "run+build s", "round 1 s", "speed-up", "speed-up +build",
        "serial s", "serial %", "exchange % mean / max", "peak RSS MiB max (start)",
    ):
        table.add_column(col, justify="right")
    bytes_table = Table(title="Bytes (the report's, all ranks) and results", title_justify="left")
    for col in ("scaling", "rep", "R", "clients", "messages", "setup bytes", "round 1 bytes", "analytic round bytes",
                "ratio", "client 0's centroids (digest)"):
        bytes_table.add_column(col, justify="right")
    records, rank_records = [], []
    for scaling, repeat, ranks, r in rows:
        b = base.get((scaling, repeat))
        whole, whole_b = r["run_s"], r["run_s"] + r["build_s"]
        if b is None:
            speed = speed_b = math.nan
        elif scaling == "strong":
            speed, speed_b = b["run_s"] / whole, (b["run_s"] + b["build_s"]) / whole_b
        else:  # throughput: clients per second at R over clients per second at 1
            speed = (r["clients"] / whole) / (b["clients"] / b["run_s"])
            speed_b = (r["clients"] / whole_b) / (b["clients"] / (b["run_s"] + b["build_s"]))
        per_rank = r["ranks"]
        coordinator = sum(p["coordinator_s"] for p in per_rank)
        seal = sum(p["seal_s"] for p in per_rank)
        serial = coordinator + seal
        exchange = [100 * p["exchange_s"] / p["run_s"] for p in per_rank]
        peak = max(p["peak_rss_mib"] for p in per_rank)
        start = max(p["start_rss_mib"] for p in per_rank)
        analytic = analytic_round_bytes(r["clients"], up, down)
        table.add_row(
            scaling, str(repeat + 1), str(ranks), f"{r['clients']:,}", f"{r['build_s']:.2f}", f"{whole:.2f}",
            f"{whole_b:.2f}", f"{r['round_s']:.2f}", f"{speed:.2f}", f"{speed_b:.2f}", f"{serial:.2f}",
            f"{100 * serial / whole:.1f}", f"{np.mean(exchange):.1f} / {max(exchange):.1f}", f"{peak:,.0f} ({start:,.0f})",
        )
        bytes_table.add_row(
            scaling, str(repeat + 1), str(ranks), f"{r['clients']:,}", f"{r['messages']:,}", f"{r['setup_bytes']:,}",
            f"{r['round_bytes']:,}", f"{analytic:,}", f"{r['round_bytes'] / analytic:.3f}", r["digest"],
        )
        records.append(record(
            "scale_out_runs", scaling=scaling, repeat=repeat + 1, ranks=ranks, n_clients=r["clients"],
            clients_per_rank=r["clients"] / ranks, build_s=r["build_s"], run_s=whole, run_with_build_s=whole_b,
            round_s=r["round_s"], speed_up=speed, speed_up_with_build=speed_b, serial_s=serial, coordinator_s=coordinator,
            seal_s=seal, serial_percent=100 * serial / whole, exchange_percent_mean=float(np.mean(exchange)),
            exchange_percent_max=max(exchange), peak_rss_mib_max=peak, peak_rss_mib_rank0=per_rank[0]["peak_rss_mib"],
            start_rss_mib_max=start, round_bytes=r["round_bytes"], analytic_round_bytes=analytic,
            setup_bytes=r["setup_bytes"], messages=r["messages"], result_digest=r["digest"], rank0_weight=args.rank0_weight,
        ))
        for p in per_rank:
            rank_records.append(record(
                "scale_out_ranks", scaling=scaling, repeat=repeat + 1, ranks=ranks, n_clients=r["clients"], rank=p["rank"],
                parties=p["parties"], build_s=p["build_s"], exchange_s=p["exchange_s"],
                exchange_percent=100 * p["exchange_s"] / p["run_s"], peak_rss_mib=p["peak_rss_mib"],
                start_rss_mib=p["start_rss_mib"], coordinator_s=p["coordinator_s"], seal_s=p["seal_s"],
            ))
    console.print(table)
    console.print(bytes_table)
    digests = {(r["clients"], r["digest"]) for _, _, _, r in rows}
    same = len(digests) == len({c for c, _ in digests})
    console.print(
        f"results: client 0's final centroids {'identical at every R' if same else 'DIFFER between rank counts'} "
        "(digest per client count); serial: the coordinator's handlers, decode and encode, and client 0's sealing"
    )
    if not all(r["peak_reset"] for _, _, _, r in rows):
        console.print("peak RSS: the kernel refused the reset (/proc/self/clear_refs): peaks are since process start")

    ranks_table = Table(title="Per rank: parties, build, exchanges (share of the run), peak RSS", title_justify="left")
    for col in ("scaling", "rep", "R", "clients", "rank", "parties", "build s", "exchange s", "exchange %",
                "peak RSS MiB", "start RSS MiB"):
        ranks_table.add_column(col, justify="right")
    for rec in rank_records:
        ranks_table.add_row(
            rec["scaling"], str(rec["repeat"]), str(rec["ranks"]), f"{rec['n_clients']:,}", str(rec["rank"]),
            f"{rec['parties']:,}", f"{rec['build_s']:.2f}", f"{rec['exchange_s']:.2f}", f"{rec['exchange_percent']:.1f}",
            f"{rec['peak_rss_mib']:,.0f}", f"{rec['start_rss_mib']:,.0f}",
        )
    console.print(ranks_table)

    profile_records = []
    for scaling, repeat, ranks, r in rows:
        if scaling != "strong" or ranks != args.profile or repeat != 0:
            continue
        for p in r["ranks"]:
            if not p["profile"]:
                continue
            prof = Table(title=f"cProfile, rank {p['rank']} of {ranks} ({r['clients']:,} clients), by own time",
                         title_justify="left")
            for col in ("function", "calls", "own s", "cumulative s"):
                prof.add_column(col, justify="left" if col == "function" else "right")
            for name, calls, own, cumulative in p["profile"]:
                prof.add_row(name, f"{calls:,}", f"{own:.2f}", f"{cumulative:.2f}")
                profile_records.append(record(
                    "scale_out_profile", rank=p["rank"], function=name, calls=calls, own_s=own, cumulative_s=cumulative,
                ))
            console.print(prof)
    write_records(args.json, records + rank_records + profile_records, console)


if __name__ == "__main__":
    raise SystemExit(main())

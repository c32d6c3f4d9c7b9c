"""Distributed (k,z)-clustering at scale: dist-kzc up to 10^6 points, (k,z)-means/median up to 10^5.

What it measures
----------------
**dist-kzc** for n = 10^3, 3.10^3, 10^4, 3.10^4, 10^5, 3.10^5, 10^6 (stopping at the first n that
does not finish within ``--budget-s``, default 120 s): the spec's synthetic Gaussian mixture
(d = 5, k components) with z = 1% of n outliers injected by the spec's recipe (n points in all),
split at random over m = 5 machines, and Guo & Li's dist-kzc (k = 20, z = n/100, eps = 0.1) with
the protocol's default search, run by ``run_parties`` over a
:class:`~fedproto.transports.memory.MemoryNetwork` with a :class:`Meter` (every frame goes through
the real codec). No radius bounds: the machines first send their extents.

The sub-machine split (spec 2.7, Guo & Li Appendix B): every machine splits its points into
``t = ceil(max_i n_i / 5,000)`` strided parts (`KzCenterConfig.sub_machines`; 40 per machine at
10^6) and dist-kzc runs over the ``m' = 5 t`` virtual machines: the threshold
``y = eps z / (k m')``, the count bound and the cap are those of m', and each machine answers every
request once for all its parts (the sums of their counts, one message per phase). Each part
aggregates without an ``n_i x n_i`` matrix (`solvers.PointIndex`: k-d tree neighbour pairs, or
the compiled ball-count screen of `_kernels.ball_counts` over the part's points), ``--workers``
parts of a machine at a time. 5,000 points per part rather than the authors' 10,000: machine work
per guess is ``n_i x part size``, so halving the parts halved the aggregation time at 10^6, while
the representatives (about ``k m' + z``, since ``y < 1`` keeps every outlier) grow little.

Per n, the main table gives m', the grid size, probe rounds and fetches, rounds, words, payload bytes,
the total run time (``run_parties`` only; data generation excluded), the peak resident memory
of the run's process (``ru_maxrss`` from ``os.wait4`` on the subprocess: it includes the data,
about 48 bytes a point, and the interpreter with NumPy, SciPy and JAX, about 0.3 GiB), and
where the time goes, timed inside the run: machine extents (`solvers.local_extent`), machine
aggregations (`solvers.SubMachines.aggregate`), the rest of the machine handlers, the
coordinator's solver (``KzCoordinator._solve``: kzc, refinement, polishing), the rest of the
coordinator, and the runtime/codec (everything else).

Baselines measured in the same run, on the same data, where they finish in the budget: the
centralised kzc (the paper's (2, 4) solver with the exact radius search on the pooled data) and
Gonzalez's greedy (farthest-first, outliers ignored); time ratios ours/centralised and radius
ratios (radius after removing z points, the paper's objective).

**(k,z)-means and (k,z)-median** (``KzMeansMachine``/``KzMeansCoordinator``, k = 20, z = n/100,
eps = 0.1, 5 machines, the same data) for n = 10^3, 10^4, 10^5: time, peak memory, words, and the
cost with z and with (1+eps) z outliers removed (sum of distances, squared for means), beside
the centralised k-means-- on the pooled data (Chawla & Gionis; its centres scored the same way).

A figure (``--plot``, default ``kz_scale.png`` in the temporary directory) shows, against n on
log-log axes, the run time (whole run, machine work, coordinator solver, and centralised kzc
where it ran) and the peak resident memory, with the 120 s and 8 GiB budgets as lines.

Every run is a subprocess of this script, killed when it exceeds the budget (the clock starts
once its data is built), so a run that is too slow or too big cannot hang the benchmark. The
centralised kzc holds an ``n x n`` distance matrix; a size whose matrix would not fit in the
available RAM is not started.

Run::

    python benchmarks/kz_scale.py                 # everything (a few minutes)
    python benchmarks/kz_scale.py --quick         # dist-kzc at n = 10^3 only, budget 30 s (a smoke test)
    python benchmarks/kz_scale.py --json kz.json  # also the tables as JSON records
    python benchmarks/kz_scale.py --plot kz.png   # the figure (time and peak memory against n) there
    python benchmarks/kz_scale.py --no-polish     # dist-kzc with KzCenterConfig(polish=False)
    python benchmarks/kz_scale.py --sub-machine-points 10000  # the authors' part size (fewer, larger parts)

``--json PATH`` writes one record per row: table ``kz_scale`` (``n_points``, ``n_machines``,
``virtual_machines``, ``z``, ``grid_size``, ``probe_rounds``, ``fetches``, ``communication_rounds``,
``words_total``, ``payload_bytes``, ``total_s``, ``peak_rss_bytes``, ``radius``, ``error``: why a
size did not finish, else ``null``), table ``kz_scale_time_split`` (``n_points``, ``total_s`` and
one ``*_s`` per part: ``machine_extent_s``, ``machine_aggregate_s``, ``machine_other_s``,
``coordinator_solver_s``, ``coordinator_other_s``, ``runtime_codec_s``), table
``kz_scale_rounds`` (``n_points``, ``round_idx``, ``round_wall_s``), table ``kz_scale_baselines``
(``n_points``, ``method``: ``kzc`` or ``greedy``, ``total_s``,
``peak_rss_bytes``, ``radius``, ``dist_kzc_total_s``, ``dist_kzc_radius``, ``time_ratio``,
``radius_ratio``, ``error``), table ``kz_scale_means`` (not with ``--quick``) (``n_points``, ``objective``: ``means``
or ``median``, ``total_s``, ``peak_rss_bytes``, ``words_total``, ``cost_z``,
``cost_1eps_z``, ``baseline_cost_z``, ``cost_ratio``, ``baseline_s``, ``error``) and, when the
profile runs, table ``kz_scale_profile`` (``function``, ``calls``, ``tottime_s``, ``cumtime_s``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SIZES = (1_000, 3_000, 10_000, 30_000, 100_000, 300_000, 1_000_000)
MEANS_SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (1_000,)
SUB_MACHINE_POINTS = 5_000
TIME_KEYS = ("machine extent", "machine aggregate", "machine other", "coordinator solver",
             "coordinator other", "runtime + codec")
#: The record key of each part of :data:`TIME_KEYS`.
TIME_RECORD_KEYS = {key: key.replace(" + ", "_").replace(" ", "_") + "_s" for key in TIME_KEYS}


# --- worker side (one run per subprocess) ---------------------------------------------------------


def _dataset(n: int, k: int, d: int, seed: int):
    from fedproto.algorithms.kzclustering.data import synthetic_dataset

    z = n // 100
    return synthetic_dataset(n - z, d, k, z, seed=seed).x, z


def _radius(x, centres, z: int) -> float:
    from fedproto.algorithms.kzclustering import _kernels, solvers

    return float(solvers.center_cost(_kernels.nearest_centres(x, centres)[0], z))


def _instrument(timers: dict[str, float]) -> None:
    """Time the machines' and the coordinator's handlers and the solver functions they call."""
    from fedproto.algorithms.kzclustering import solvers
    from fedproto.algorithms.kzclustering.protocol import KzCoordinator, KzMachine

    role: list[str | None] = [None]

    def wrap_handler(cls, name: str, key: str) -> None:
        orig = getattr(cls, name)

        def wrapper(self, *args, **kwargs):
            if role[0] is not None:  # nested (e.g. _advance inside a handler): counted by the outer one
                return orig(self, *args, **kwargs)
            role[0] = key
            t0 = time.perf_counter()
            try:
                return orig(self, *args, **kwargs)
            finally:
                timers[key] = timers.get(key, 0.0) + time.perf_counter() - t0
                role[0] = None

        setattr(cls, name, wrapper)

    def wrap_timed(owner, name: str, label: str, *, prefix: bool = True) -> None:
        orig = getattr(owner, name)

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                key = f"{role[0]}:{label}" if prefix else label
                timers[key] = timers.get(key, 0.0) + time.perf_counter() - t0

        setattr(owner, name, wrapper)

    for name in ("_start", "_on_grid", "_on_probes", "_on_fetch", "_on_guesses", "_on_centres"):
        if hasattr(KzMachine, name):
            wrap_handler(KzMachine, name, "machine")
    for name in ("_start", "_advance", "_on_extent", "_on_counts", "_on_probe_counts", "_on_points",
                 "_on_representatives", "_on_outlier_count"):
        if hasattr(KzCoordinator, name):
            wrap_handler(KzCoordinator, name, "coordinator")
    wrap_timed(solvers, "local_extent", "extent")
    wrap_timed(solvers.SubMachines, "aggregate", "aggregate")
    wrap_timed(KzCoordinator, "_solve", "coordinator:solve", prefix=False)


def _worker_dist(args) -> dict:
    import cProfile
    import io
    import pstats

    import trio

    import fedproto.algorithms  # noqa: F401
    from fedproto.algorithms.kzclustering import solvers
    from fedproto.algorithms.kzclustering.config import KzCenterConfig
    from fedproto.algorithms.kzclustering.protocol import COORDINATOR, KzCoordinator, KzMachine, machine_name
    from fedproto.data import partition
    from fedproto.metering import Meter
    from fedproto.runtime import RuntimeConfig, run_parties
    from fedproto.transports.memory import MemoryNetwork

    x, z = _dataset(args.n, args.k, args.d, args.seed)
    n = x.shape[0]
    parts = partition(n, args.machines, seed=args.seed)
    t = max(solvers.sub_machine_count(len(p), args.sub_machine_points) for p in parts)
    options = {} if args.search is None else {"search": args.search}
    config = KzCenterConfig(k=args.k, z=z, eps=args.eps, n_machines=args.machines, d=args.d,
                            polish=not args.no_polish, sub_machines=t, **options)
    names = [machine_name(i) for i in range(args.machines)]
    machines = {COORDINATOR: KzCoordinator(COORDINATOR, config=config, machines=names)}
    for name, part in zip(names, parts):
        machines[name] = KzMachine(name, config=config, points=x[part], workers=args.workers)
    timers: dict[str, float] = {}
    if not args.profile:  # the profiled run shows the real functions, not the timing wrappers
        _instrument(timers)
    network = MemoryNetwork(list(machines))

    async def go():
        meter = Meter(trio.current_time)
        results = await run_parties(
            machines, network, config=RuntimeConfig(session=1, deadline_s=3600.0), meter=meter
        )
        return results, meter.report(protocol="dist-kzc", transport="memory", session=1, parties=list(machines))

    print("READY", flush=True)
    profiler = cProfile.Profile() if args.profile else None
    t0 = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    results, report = trio.run(go)
    if profiler is not None:
        profiler.disable()
    total = time.perf_counter() - t0
    result = results[COORDINATOR]
    machine = timers.get("machine", 0.0)
    coordinator = timers.get("coordinator", 0.0)
    extent_s = timers.get("machine:extent", 0.0)
    agg_s = timers.get("machine:aggregate", 0.0)
    solve_s = timers.get("coordinator:solve", 0.0)
    out = {
        "n": n, "z": z, "rounds": report.communication_rounds, "words": result.total_words,
        "bytes": report.payload_bytes, "total_s": total, "round_wall_s": list(report.round_wall_s),
        "virtual": config.virtual_machines,
        "grid": int(len(result.grid)), "fetches": len(result.fetches),
        "probes": sum(1 for (_, phase) in result.words if phase == "probe"),
        "radius": _radius(x, result.centres, z),
        "split": {} if args.profile else {
            "machine extent": extent_s,
            "machine aggregate": agg_s,
            "machine other": machine - extent_s - agg_s,
            "coordinator solver": solve_s,
            "coordinator other": coordinator - solve_s,
            "runtime + codec": total - machine - coordinator,
        },
    }
    if profiler is not None:
        stream = io.StringIO()
        stats = pstats.Stats(profiler, stream=stream)
        stats.sort_stats("cumulative")
        rows = []
        for func in stats.fcn_list[:60]:  # type: ignore[attr-defined]
            cc, nc, tt, ct, _ = stats.stats[func]  # type: ignore[attr-defined]
            filename, line, fname = func
            rows.append({"calls": nc, "tottime": tt, "cumtime": ct,
                         "function": f"{Path(filename).name}:{line}({fname})" if line else fname})
        out["profile"] = rows
    return out


def _worker_central(args) -> dict:
    import fedproto.algorithms  # noqa: F401
    from fedproto.algorithms.kzclustering.baselines import centralised_kzc, greedy

    x, z = _dataset(args.n, args.k, args.d, args.seed)
    print("READY", flush=True)
    t0 = time.perf_counter()
    idx = centralised_kzc(x, args.k, z) if args.worker == "kzc" else greedy(x, args.k)
    total = time.perf_counter() - t0
    return {"n": x.shape[0], "z": z, "total_s": total, "radius": _radius(x, x[idx], z)}


def _worker_means(args) -> dict:
    import trio

    import fedproto.algorithms  # noqa: F401
    from fedproto.algorithms.kzclustering import _kernels, solvers
    from fedproto.algorithms.kzclustering.means import (
        KzMeansConfig,
        KzMeansCoordinator,
        KzMeansMachine,
        centralised_kmeans_minus_minus,
    )
    from fedproto.algorithms.kzclustering.protocol import COORDINATOR, machine_name
    from fedproto.data import partition
    from fedproto.metering import Meter
    from fedproto.runtime import RuntimeConfig, run_parties
    from fedproto.transports.memory import MemoryNetwork

    power = 2 if args.worker == "means" else 1
    x, z = _dataset(args.n, args.k, args.d, args.seed)
    n = x.shape[0]
    parts = partition(n, args.machines, seed=args.seed)
    config = KzMeansConfig(k=args.k, z=z, eps=args.eps, n_machines=args.machines, d=args.d, power=power,
                           seed=args.seed)
    names = [machine_name(i) for i in range(args.machines)]
    machines = {COORDINATOR: KzMeansCoordinator(COORDINATOR, config=config, machines=names)}
    for i, name in enumerate(names):
        machines[name] = KzMeansMachine(name, config=config, points=x[parts[i]], index=i)
    network = MemoryNetwork(list(machines))

    async def go():
        return await run_parties(machines, network, config=RuntimeConfig(session=1, deadline_s=3600.0),
                                 meter=Meter(trio.current_time))

    print("READY", flush=True)
    t0 = time.perf_counter()
    results = trio.run(go)
    total = time.perf_counter() - t0
    result = results[COORDINATOR]

    def cost(centres, outliers):
        return solvers.trimmed_cost(_kernels.nearest_centres(x, centres)[0], outliers, power)

    t1 = time.perf_counter()
    baseline = centralised_kmeans_minus_minus(x, args.k, z, seed=args.seed)
    baseline_s = time.perf_counter() - t1
    return {"n": n, "z": z, "total_s": total, "words": result.total_words,
            "cost_z": cost(result.centres, z), "cost_1eps_z": cost(result.centres, (1 + args.eps) * z),
            "baseline_cost_z": cost(baseline, z), "baseline_s": baseline_s}


def worker(args) -> None:
    if args.worker == "dist":
        out = _worker_dist(args)
    elif args.worker in ("means", "median"):
        out = _worker_means(args)
    else:
        out = _worker_central(args)
    print("RESULT " + json.dumps(out), flush=True)


# --- driver side ---------------------------------------------------------------------------------


def memory_needed(kind: str, n: int) -> float:
    """Rough peak bytes of one run, where a dense matrix decides it (else 0)."""
    if kind == "kzc":
        # the n x n float64 matrix plus blocks of rows (the exact radius search lists breakpoints
        # only between two sampled ones beyond 2,048 points)
        return 10.0 * n**2
    return 0.0


def available_memory() -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return math.inf


def run_worker(kind: str, n: int, args, budget: float, *, profile: bool = False) -> dict:
    """Run one measurement in a subprocess; ``{"error": ...}`` if it did not finish in the budget.

    The result gains ``peak_rss_bytes``: the subprocess's ``ru_maxrss`` (``os.wait4``), also when it
    was killed.
    """
    need = memory_needed(kind, n)
    have = available_memory()
    if need > 0.8 * have:
        return {"error": f"not started: needs ~{need / 2**30:.0f} GiB RAM ({have / 2**30:.0f} GiB available)"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--n", str(n), "--k", str(args.k),
           "--d", str(args.d), "--eps", str(args.eps), "--machines", str(args.machines), "--seed", str(args.seed)]
    if profile:
        cmd.append("--profile")
    cmd += ["--sub-machine-points", str(args.sub_machine_points), "--workers", str(args.workers)]
    if args.no_polish:
        cmd.append("--no-polish")
    if args.search is not None:
        cmd += ["--search", args.search]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    lines: queue.Queue[str | None] = queue.Queue()
    errors: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def pump_err() -> None:
        assert proc.stderr is not None
        errors.extend(proc.stderr)

    threading.Thread(target=pump, daemon=True).start()
    threading.Thread(target=pump_err, daemon=True).start()
    deadline = time.monotonic() + max(120.0, budget)  # setup: imports and data generation
    started = False
    out: dict
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                out = {"error": f"did not finish in {budget:g} s" if started else "setup did not finish"}
                break
            if line is None:
                out = {"error": "worker exited early: " + "".join(errors)[-300:].strip()}
                break
            if line.startswith("READY"):
                started = True
                deadline = time.monotonic() + budget
            elif line.startswith("RESULT "):
                out = json.loads(line[len("RESULT "):])
                if out["total_s"] > budget:
                    out["error"] = f"did not finish in {budget:g} s"
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        _, _, usage = os.wait4(proc.pid, 0)
        proc.returncode = proc.returncode if proc.returncode is not None else -9
    out["peak_rss_bytes"] = int(usage.ru_maxrss) * 1024  # kilobytes on Linux
    return out


def _gib(n_bytes: float | None) -> str:
    return "-" if n_bytes is None else f"{n_bytes / 2**30:.2f}"


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import add_common_arguments, make_console, parse_args, print_machine_facts, record, write_records
    from rich.table import Table

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, quick="dist-kzc at n = 1,000 only, a 30 s budget, no means/median rows, no "
                                       "profile (a smoke test)")
    parser.add_argument("--budget-s", type=float, default=None, help="per-run budget in seconds (default 120; 30 with --quick)")
    parser.add_argument("--max-n", type=int, default=None, help="largest n to try (default 10^6)")
    parser.add_argument("--k", type=int, default=20, help="centres, and components of the mixture (default 20)")
    parser.add_argument("--d", type=int, default=5, help="features (default 5)")
    parser.add_argument("--eps", type=float, default=0.1, help="eps (default 0.1)")
    parser.add_argument("--machines", type=int, default=5, help="machines m (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile run")
    parser.add_argument("--no-means", action="store_true", help="skip the (k,z)-means/median rows")
    parser.add_argument("--no-polish", action="store_true",
                        help="dist-kzc without the coordinator's polishing (KzCenterConfig(polish=False))")
    parser.add_argument("--sub-machine-points", type=int, default=SUB_MACHINE_POINTS,
                        help=f"largest sub-machine of the split (default {SUB_MACHINE_POINTS:,}; the authors' is 10,000)")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                        help="threads per machine aggregating its sub-machines (default: up to 2)")
    parser.add_argument("--plot", default=str(Path(tempfile.gettempdir()) / "kz_scale.png"),
                        help="write the time and memory figure here (PNG; default: the temporary directory)")
    parser.add_argument("--search", choices=("probe", "linear", "binary"), default=None,
                        help="dist-kzc radius search (default: the protocol's default)")
    parser.add_argument("--worker", choices=("dist", "kzc", "greedy", "means", "median"), help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    if "--worker" in sys.argv:
        worker(parser.parse_args())
        return
    args = parse_args(parser)

    budget = args.budget_s if args.budget_s is not None else (30.0 if args.quick else 120.0)
    sizes = [n for n in (QUICK_SIZES if args.quick else SIZES) if args.max_n is None or n <= args.max_n]
    means_sizes = [n for n in (QUICK_SIZES if args.quick else MEANS_SIZES) if args.max_n is None or n <= args.max_n]
    console = make_console()
    print_machine_facts(console, "distributed (k,z)-clustering at scale", {
        "data": f"synthetic Gaussian mixture (d = {args.d}, {args.k} components) + z = 1% of n injected outliers",
        "sizes n (dist-kzc)": ", ".join(f"{n:,}" for n in sizes),
        "sizes n (means, median)": "none" if args.no_means or args.quick else ", ".join(f"{n:,}" for n in means_sizes),
        "machines m": args.machines, "k": args.k, "eps": args.eps,
        "sub-machines": f"t = ceil(max n_i / {args.sub_machine_points:,}) per machine (KzCenterConfig.sub_machines), "
                        f"aggregated by {args.workers} thread(s) per machine",
        "protocol": f"dist-kzc, extent round (no radius bounds), search {args.search or 'default'}, refinement, "
                    f"polishing {'off' if args.no_polish else 'on'}",
        "transport": "run_parties + MemoryNetwork + Meter (real codec)",
        "budget per run": f"{budget:g} s (subprocess killed beyond it)",
        "RAM available": f"{available_memory() / 2**30:.1f} GiB",
    })

    ours: list[dict] = []
    central: dict[str, dict[int, dict]] = {"kzc": {}, "greedy": {}}
    stopped: dict[str, bool] = {"kzc": False, "greedy": False}
    for n in sizes:
        console.print(f"n = {n:,}: dist-kzc ...", highlight=False)
        row = run_worker("dist", n, args, budget)
        row.setdefault("n", n)
        ours.append(row)
        for kind in ("kzc", "greedy"):
            if stopped[kind]:
                central[kind][n] = {"n": n, "error": "not run (a smaller n did not finish)"}
                continue
            console.print(f"n = {n:,}: centralised {kind} ...", highlight=False)
            res = run_worker(kind, n, args, budget)
            central[kind][n] = res
            stopped[kind] = "error" in res
        if "error" in row:
            break

    table = Table(title="dist-kzc over the memory transport: time per round as n grows "
                        "(5 machines split into m' virtual machines)", title_justify="left")
    for col in ("n", "m'", "z", "|grid|", "probe rounds", "fetches", "rounds", "words", "payload bytes", "total s",
                "peak RSS GiB", "radius"):
        table.add_column(col, justify="right")
    records = []
    for row in ours:
        if "total_s" not in row:
            table.add_row(f"{row['n']:,}", *["-"] * 8, row["error"], _gib(row.get("peak_rss_bytes")), "-")
            records.append(record("kz_scale", n_points=row["n"], n_machines=args.machines,
                                  peak_rss_bytes=row.get("peak_rss_bytes"), error=row["error"]))
            continue
        records.append(record(
            "kz_scale", n_points=row["n"], n_machines=args.machines, virtual_machines=row["virtual"], z=row["z"],
            grid_size=row["grid"], probe_rounds=row["probes"], fetches=row["fetches"],
            communication_rounds=row["rounds"], words_total=row["words"], payload_bytes=row["bytes"],
            total_s=row["total_s"], peak_rss_bytes=row["peak_rss_bytes"], radius=row["radius"],
            error=row.get("error"),
        ))
        table.add_row(
            f"{row['n']:,}", str(row["virtual"]), f"{row['z']:,}", str(row["grid"]), str(row["probes"]),
            str(row["fetches"]), str(row["rounds"]), f"{row['words']:,}", f"{row['bytes']:,}",
            f"{row['total_s']:.2f}" + (" (over budget)" if "error" in row else ""), _gib(row["peak_rss_bytes"]),
            f"{row['radius']:.3f}",
        )
    console.print(table)

    where = Table(title="where the time goes: seconds (share of the run) per part, timed inside the run",
                  title_justify="left")
    where.add_column("n", justify="right")
    where.add_column("total s", justify="right")
    for key in TIME_KEYS:
        where.add_column(key, justify="right")
    for row in ours:
        if "total_s" in row:
            split = row["split"]
            where.add_row(f"{row['n']:,}", f"{row['total_s']:.2f}",
                          *[f"{split[key]:.2f} ({100 * split[key] / row['total_s']:.0f}%)" for key in TIME_KEYS])
            records.append(record("kz_scale_time_split", n_points=row["n"], total_s=row["total_s"],
                                  **{TIME_RECORD_KEYS[key]: split[key] for key in TIME_KEYS}))
    console.print(where)

    rounds = Table(title="round wall times (s) from the report's round_wall_s", title_justify="left")
    rounds.add_column("n", justify="right")
    rounds.add_column("round_wall_s")
    for row in ours:
        if "total_s" in row:
            rounds.add_row(f"{row['n']:,}", "  ".join(f"{w:.3f}" for w in row["round_wall_s"]))
            records += [record("kz_scale_rounds", n_points=row["n"], round_idx=i, round_wall_s=w)
                        for i, w in enumerate(row["round_wall_s"])]
    console.print(rounds)

    base = Table(title="baselines in the same run: centralised kzc and greedy on the same data", title_justify="left")
    for col in ("n", "dist-kzc s", "kzc s", "kzc peak GiB", "dist-kzc / kzc time", "greedy s",
                "radius dist-kzc", "radius kzc", "ours / kzc radius", "radius greedy", "ours / greedy radius"):
        base.add_column(col, justify="right")
    for row in ours:
        n = row["n"]
        mine = row if "total_s" in row and "error" not in row else None
        cells = {"n": f"{n:,}", "ours_s": f"{mine['total_s']:.2f}" if mine else row.get("error", "-"),
                 "ours_r": f"{mine['radius']:.3f}" if mine else "-"}
        for kind in ("kzc", "greedy"):
            res = central[kind].get(n, {"error": "not run"})
            ok = "error" not in res
            records.append(record(
                "kz_scale_baselines", n_points=n, method=kind, total_s=res["total_s"] if ok else None,
                peak_rss_bytes=res.get("peak_rss_bytes"), radius=res["radius"] if ok else None,
                dist_kzc_total_s=mine["total_s"] if mine else None, dist_kzc_radius=mine["radius"] if mine else None,
                time_ratio=mine["total_s"] / res["total_s"] if mine and ok else None,
                radius_ratio=mine["radius"] / res["radius"] if mine and ok and res["radius"] > 0 else None,
                error=None if ok else res["error"],
            ))
            cells[f"{kind}_s"] = f"{res['total_s']:.2f}" if ok else res["error"]
            cells[f"{kind}_peak"] = _gib(res.get("peak_rss_bytes")) if ok else "-"
            cells[f"{kind}_tr"] = f"{mine['total_s'] / res['total_s']:.2f}" if mine and ok else "-"
            cells[f"{kind}_r"] = f"{res['radius']:.3f}" if ok else "-"
            cells[f"{kind}_rr"] = f"{mine['radius'] / res['radius']:.2f}" if mine and ok and res["radius"] > 0 else "-"
        base.add_row(cells["n"], cells["ours_s"], cells["kzc_s"], cells["kzc_peak"], cells["kzc_tr"],
                     cells["greedy_s"], cells["ours_r"], cells["kzc_r"], cells["kzc_rr"], cells["greedy_r"],
                     cells["greedy_rr"])
    console.print(base)

    if not args.no_means and not args.quick:
        means_table = Table(title="(k,z)-means and (k,z)-median over 5 machines, beside centralised k-means--",
                            title_justify="left")
        for col in ("n", "objective", "total s", "peak RSS GiB", "words", "cost (z out)", "cost ((1+eps)z out)",
                    "k-means-- cost (z out)", "ours / k-means--", "k-means-- s"):
            means_table.add_column(col, justify="right")
        for objective in ("means", "median"):
            for n in means_sizes:
                console.print(f"n = {n:,}: (k,z)-{objective} ...", highlight=False)
                res = run_worker(objective, n, args, budget)
                ok = "error" not in res
                ratio = res["cost_z"] / res["baseline_cost_z"] if ok and res["baseline_cost_z"] > 0 else None
                records.append(record(
                    "kz_scale_means", n_points=n, objective=objective, total_s=res.get("total_s"),
                    peak_rss_bytes=res.get("peak_rss_bytes"), words_total=res.get("words"),
                    cost_z=res.get("cost_z"), cost_1eps_z=res.get("cost_1eps_z"),
                    baseline_cost_z=res.get("baseline_cost_z"), cost_ratio=ratio, baseline_s=res.get("baseline_s"),
                    error=None if ok else res["error"],
                ))
                if ok:
                    means_table.add_row(f"{n:,}", objective, f"{res['total_s']:.2f}", _gib(res["peak_rss_bytes"]),
                                        f"{res['words']:,}", f"{res['cost_z']:.4g}", f"{res['cost_1eps_z']:.4g}",
                                        f"{res['baseline_cost_z']:.4g}", f"{ratio:.3f}" if ratio else "-",
                                        f"{res['baseline_s']:.2f}")
                else:
                    means_table.add_row(f"{n:,}", objective, res["error"], _gib(res.get("peak_rss_bytes")),
                                        *["-"] * 6)
        console.print(means_table)

    finished = [row for row in ours if "total_s" in row and "error" not in row]
    if finished:
        largest = finished[-1]
        console.print(f"largest n that finished within {budget:g} s: {largest['n']:,} "
                      f"({largest['total_s']:.2f} s, peak {_gib(largest['peak_rss_bytes'])} GiB, "
                      f"{largest['rounds']} rounds)", highlight=False)
    else:
        console.print(f"no n finished within {budget:g} s", highlight=False)
    if finished and not args.no_profile and not args.quick:
        largest = finished[-1]
        prof = run_worker("dist", largest["n"], args, 3 * budget, profile=True)
        if "error" in prof:
            console.print(f"profiled run: {prof['error']}", highlight=False)
        else:
            ptable = Table(title=f"cProfile of the dist-kzc run at n = {largest['n']:,}: top 12 by cumulative time "
                                 f"(profiled run {prof['total_s']:.2f} s; frames spanning the whole run, i.e. the "
                                 "trio/run_parties scaffolding, left out)", title_justify="left")
            for col in ("function", "calls", "tottime s", "cumtime s"):
                ptable.add_column(col, justify="right" if col != "function" else "left")
            shown = [item for item in prof["profile"] if item["cumtime"] < 0.98 * prof["total_s"]][:12]
            for item in shown:
                ptable.add_row(item["function"], f"{item['calls']:,}", f"{item['tottime']:.2f}", f"{item['cumtime']:.2f}")
                records.append(record("kz_scale_profile", function=item["function"], calls=item["calls"],
                                      tottime_s=item["tottime"], cumtime_s=item["cumtime"]))
            console.print(ptable)
    if args.plot:
        plot_scale(args.plot, ours, central["kzc"], budget, console)
    write_records(args.json, records, console)


def plot_scale(path: str, ours: list[dict], kzc: dict[int, dict], budget: float, console) -> None:
    """Two log-log panels against n: run time (dist-kzc split into machine and coordinator work,
    centralised kzc where it ran) and peak resident memory, with the issue's budget lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    done = [row for row in ours if "total_s" in row]
    if not done:
        console.print("no run finished: no plot")
        return
    n = [row["n"] for row in done]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6), layout="constrained")
    left.plot(n, [row["total_s"] for row in done], marker="o", label="dist-kzc, whole run")
    machine = [row["split"]["machine extent"] + row["split"]["machine aggregate"] for row in done]
    left.plot(n, machine, marker=".", linestyle="--", label="machines: extents + aggregation")
    left.plot(n, [row["split"]["coordinator solver"] for row in done], marker=".", linestyle=":",
              label="coordinator: kzc, refinement, polishing")
    central = [(m, kzc[m]["total_s"]) for m in n if m in kzc and "total_s" in kzc[m]]
    if central:
        left.plot(*zip(*central), marker="s", label="centralised kzc (n x n matrix)")
    left.axhline(budget, color="grey", linewidth=0.8, linestyle="-.", label=f"budget {budget:g} s")
    left.set(xscale="log", yscale="log", xlabel="points n", ylabel="seconds",
             title="time (5 machines, k = 20, z = n/100, eps = 0.1)")
    left.legend(fontsize=8)
    right.plot(n, [row["peak_rss_bytes"] / 2**30 for row in done], marker="o", label="dist-kzc (one process)")
    central_mem = [(m, kzc[m]["peak_rss_bytes"] / 2**30) for m in n
                   if m in kzc and "total_s" in kzc[m] and kzc[m].get("peak_rss_bytes")]
    if central_mem:
        right.plot(*zip(*central_mem), marker="s", label="centralised kzc")
    right.axhline(8.0, color="grey", linewidth=0.8, linestyle="-.", label="budget 8 GiB")
    right.set(xscale="log", yscale="log", xlabel="points n", ylabel="GiB", title="peak resident memory")
    right.legend(fontsize=8)
    def minor(value: float, _: object) -> str:  # label 2 and 5 between the powers of ten
        lead = round(value / 10 ** math.floor(math.log10(value))) if value > 0 else 0
        return f"{value:g}" if lead in (2, 5) else ""

    for axis in (left.yaxis, right.yaxis):
        axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        axis.set_minor_formatter(matplotlib.ticker.FuncFormatter(minor))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    console.print(f"plot written to {path}")


if __name__ == "__main__":
    main()

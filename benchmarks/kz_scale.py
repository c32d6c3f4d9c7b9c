"""Distributed (k,z)-center at scale: time per round of dist-kzc as n grows over m = 5 machines.

What it measures
----------------
For n = 10^3, 3.10^3, 10^4, 3.10^4, 10^5, 3.10^5, 10^6 (stopping at the first n that does not
finish within ``--budget-s``, default 60 s): the spec's synthetic Gaussian mixture (d = 5, k
components) with z = 1% of n outliers injected by the spec's recipe (so n points in total), split
at random over m = 5 machines, and Guo & Li's dist-kzc (k = 20, z = n/100, eps = 0.1) run by
``run_parties`` over a :class:`~fedproto.transports.memory.MemoryNetwork` with a :class:`Meter` (every
frame goes through the real codec).

Setting: no domain knowledge of the optimal radius (``radius_bounds=None``: the machines first
send their extent and the coordinator builds the grid, spec 2.4's practical alternative) and the
**binary** search over the grid (``search="binary"``, ``batch=1``: O(log |grid|) fetches instead
of walking up the grid), with the coordinator's refinement on (the protocol's default).

Per n, the main table gives: message phases (rounds), words, payload bytes, the total run time
(``run_parties`` only; data generation excluded), the mean time per round (from the report's
``round_wall_s``), and where the time goes, measured by timing the handlers and solver functions
during the run: machine-side distance matrices (``_kernels.pairwise_distances``, JAX, compile
included), machine-side aggregation (``solvers.aggregate``, one per grid guess), the rest of the
machine handlers (extent, outlier labels), the coordinator's solver (``KzCoordinator._solve``:
kzc + refinement), the rest of the coordinator, and the runtime/codec (everything else).

Baselines measured in the same run, on the same data, for the sizes where they finish in the
budget: the centralised kzc (the paper's (2, 4) solver with the exact radius search on the pooled
data) and Gonzalez's greedy (farthest-first, outliers ignored), with time ratios ours/centralised
and the radius ratio ours/centralised (radius after removing z points, the paper's objective).
A cProfile of the largest n that finished (a separate, profiled run) lists the top 10 functions by
cumulative time.

Every run is a subprocess of this script, killed when it exceeds the budget (the clock starts
once its data is built), so a run that is too slow or too big cannot hang the benchmark. A size
whose dense distance matrices would not fit in the available RAM (the protocol keeps one
``n_i x n_i`` float64 matrix per machine, spec 2.7) is not started and counts as not finishing.

Run::

    python benchmarks/kz_scale.py                 # n up to 10^6, budget 60 s per run
    python benchmarks/kz_scale.py --quick         # n = 10^3 only, budget 20 s, no cProfile run (a smoke test)
    python benchmarks/kz_scale.py --json kz.json  # also the tables as JSON records

``--json PATH`` writes one record per row: table ``kz_scale`` (``n_points``, ``n_points_per_machine``,
``z``, ``grid_size``, ``fetches``, ``communication_rounds``, ``words_total``, ``payload_bytes``,
``total_s``, ``round_s_mean``, ``round_s_max``, ``error``: why a size did not finish, else
``null``), table ``kz_scale_time_split`` (``n_points``, ``total_s`` and one ``*_s`` per part:
``machine_distances_s``, ``machine_aggregate_s``, ``machine_other_s``, ``coordinator_solver_s``,
``coordinator_other_s``, ``runtime_codec_s``), table ``kz_scale_rounds`` (``n_points``,
``round_idx``, ``round_wall_s``), table ``kz_scale_baselines`` (``n_points``,
``method``: ``kzc`` or ``greedy``, ``total_s``, ``radius``, ``dist_kzc_total_s``,
``dist_kzc_radius``, ``time_ratio``, ``radius_ratio``, ``error``) and, when the profile runs, table
``kz_scale_profile`` (``function``, ``calls``, ``tottime_s``, ``cumtime_s``).
"""

from __future__ import annotations

import argparse
import json
import math
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

SIZES = (1_000, 3_000, 10_000, 30_000, 100_000, 300_000, 1_000_000)
QUICK_SIZES = (1_000,)
TIME_KEYS = ("machine distances", "machine aggregate", "machine other", "coordinator solver",
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
    from fedproto.algorithms.kzclustering import _kernels, solvers
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

    def wrap_function(owner, name: str, label: str) -> None:
        orig = getattr(owner, name)

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                key = f"{role[0]}:{label}"
                timers[key] = timers.get(key, 0.0) + time.perf_counter() - t0

        setattr(owner, name, wrapper)

    for name in ("_start", "_on_grid", "_on_guesses", "_on_centres"):
        wrap_handler(KzMachine, name, "machine")
    for name in ("_start", "_advance", "_on_extent", "_on_counts", "_on_points", "_on_outlier_count"):
        wrap_handler(KzCoordinator, name, "coordinator")
    wrap_function(_kernels, "pairwise_distances", "distances")
    wrap_function(solvers, "aggregate", "aggregate")
    # _solve is a method called inside the coordinator's handlers: time it as a function of the class
    orig_solve = KzCoordinator._solve

    def solve(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return orig_solve(self, *args, **kwargs)
        finally:
            timers["coordinator:solve"] = timers.get("coordinator:solve", 0.0) + time.perf_counter() - t0

    KzCoordinator._solve = solve


def _worker_dist(args) -> dict:
    import cProfile
    import io
    import pstats

    import trio

    import fedproto.algorithms  # noqa: F401
    from fedproto.algorithms.kzclustering.config import KzCenterConfig
    from fedproto.algorithms.kzclustering.protocol import COORDINATOR, KzCoordinator, KzMachine, machine_name
    from fedproto.data import partition
    from fedproto.metering import Meter
    from fedproto.runtime import RuntimeConfig, run_parties
    from fedproto.transports.memory import MemoryNetwork

    x, z = _dataset(args.n, args.k, args.d, args.seed)
    n = x.shape[0]
    parts = partition(n, args.machines, seed=args.seed)
    config = KzCenterConfig(k=args.k, z=z, eps=args.eps, n_machines=args.machines, d=args.d, search="binary")
    names = [machine_name(i) for i in range(args.machines)]
    machines = {COORDINATOR: KzCoordinator(COORDINATOR, config=config, machines=names)}
    for i, name in enumerate(names):
        machines[name] = KzMachine(name, config=config, points=x[parts[i]])
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
    dist_s = timers.get("machine:distances", 0.0)
    agg_s = timers.get("machine:aggregate", 0.0)
    solve_s = timers.get("coordinator:solve", 0.0)
    out = {
        "n": n, "z": z, "rounds": report.communication_rounds, "words": result.total_words,
        "bytes": report.payload_bytes, "total_s": total, "round_wall_s": list(report.round_wall_s),
        "n_i": max(len(p) for p in parts), "grid": int(len(result.grid)), "fetches": len(result.fetches),
        "radius": _radius(x, result.centres, z),
        "split": {} if args.profile else {
            "machine distances": dist_s,
            "machine aggregate": agg_s,
            "machine other": machine - dist_s - agg_s,
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


def worker(args) -> None:
    out = _worker_dist(args) if args.worker == "dist" else _worker_central(args)
    print("RESULT " + json.dumps(out), flush=True)


# --- driver side ---------------------------------------------------------------------------------


def _bucket(n: int) -> int:
    return max(8, 1 << max(0, n - 1).bit_length())


def memory_needed(kind: str, n: int, machines: int) -> float:
    """Rough peak bytes of one run (dense matrices only; see the module docstring)."""
    if kind == "dist":
        n_i = math.ceil(n / machines)
        # every machine keeps its n_i^2 float64 matrix; the one being built also has JAX's padded
        # buffer and the copy, and the extent's ``dist[dist > 0]`` mask and values
        return 8.0 * machines * n_i**2 + 8.0 * _bucket(n_i) ** 2 + 17.0 * n_i**2
    if kind == "kzc":
        # n^2 float64 matrix, padded JAX buffer, upper-triangle indices and values (+ sorted copies),
        # the bool ball matrix and its int64 cast in ``weights @ inner``
        return 45.0 * n**2 + 8.0 * _bucket(n) ** 2
    return 200.0 * n  # greedy: O(n d)


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
    """Run one measurement in a subprocess; ``{"error": ...}`` if it did not finish in the budget."""
    need = memory_needed(kind, n, args.machines)
    have = available_memory()
    if need > 0.8 * have:
        return {"error": f"not started: needs ~{need / 2**30:.0f} GiB RAM ({have / 2**30:.0f} GiB available)"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--n", str(n), "--k", str(args.k),
           "--d", str(args.d), "--eps", str(args.eps), "--machines", str(args.machines), "--seed", str(args.seed)]
    if profile:
        cmd.append("--profile")
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
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return {"error": f"did not finish in {budget:g} s" if started else "setup did not finish"}
            if line is None:
                proc.wait()
                return {"error": f"worker exited with code {proc.returncode}: {''.join(errors)[-300:].strip()}"}
            if line.startswith("READY"):
                started = True
                deadline = time.monotonic() + budget
            elif line.startswith("RESULT "):
                out = json.loads(line[len("RESULT "):])
                if out["total_s"] > budget:
                    out["error"] = f"did not finish in {budget:g} s"
                return out
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="n = 1,000 only, a 20 s budget, no profile (smoke test)")
    parser.add_argument("--json", metavar="PATH", type=Path, default=None,
                        help="also write the tables here as a JSON array of records (see the module docstring)")
    parser.add_argument("--budget-s", type=float, default=None, help="per-run budget in seconds (default 60; 20 with --quick)")
    parser.add_argument("--max-n", type=int, default=None, help="largest n to try (default 10^6)")
    parser.add_argument("--k", type=int, default=20, help="centres, and components of the mixture (default 20)")
    parser.add_argument("--d", type=int, default=5, help="features (default 5)")
    parser.add_argument("--eps", type=float, default=0.1, help="eps (default 0.1)")
    parser.add_argument("--machines", type=int, default=5, help="machines m (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile run")
    parser.add_argument("--worker", choices=("dist", "kzc", "greedy"), help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    if "--worker" in sys.argv:
        args = parser.parse_args()
        worker(args)
        return

    from _common import make_console, parse_args, print_machine_facts, record, write_records
    from rich.table import Table

    args = parse_args(parser)

    budget = args.budget_s if args.budget_s is not None else (20.0 if args.quick else 60.0)
    sizes = [n for n in (QUICK_SIZES if args.quick else SIZES) if args.max_n is None or n <= args.max_n]
    console = make_console()
    print_machine_facts(console, "distributed (k,z)-center: time per round as n grows", {
        "data": f"synthetic Gaussian mixture (d = {args.d}, {args.k} components) + z = 1% of n injected outliers",
        "sizes n": ", ".join(f"{n:,}" for n in sizes),
        "machines m": args.machines, "k": args.k, "eps": args.eps,
        "protocol": "dist-kzc, extent round (no radius bounds), binary search, batch 1, refinement",
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

    table = Table(title="dist-kzc over the memory transport: time per round as n grows", title_justify="left")
    for col in ("n", "n_i", "z", "|grid|", "fetches", "rounds", "words", "payload bytes", "total s", "s/round (mean)",
                "max round s"):
        table.add_column(col, justify="right")
    records = []
    for row in ours:
        if "error" in row:
            table.add_row(f"{row['n']:,}", *["-"] * 7, row["error"], "-", "-")
            records.append(record("kz_scale", n_points=row["n"], error=row["error"]))
            continue
        walls = row["round_wall_s"]
        records.append(record(
            "kz_scale", n_points=row["n"], n_points_per_machine=row["n_i"], z=row["z"], grid_size=row["grid"],
            fetches=row["fetches"], communication_rounds=row["rounds"], words_total=row["words"],
            payload_bytes=row["bytes"], total_s=row["total_s"], round_s_mean=sum(walls) / max(len(walls), 1),
            round_s_max=max(walls, default=0.0), error=None,
        ))
        table.add_row(
            f"{row['n']:,}", f"{row['n_i']:,}", f"{row['z']:,}", str(row["grid"]), str(row["fetches"]),
            str(row["rounds"]), f"{row['words']:,}",
            f"{row['bytes']:,}", f"{row['total_s']:.2f}", f"{sum(walls) / max(len(walls), 1):.3f}",
            f"{max(walls, default=0.0):.3f}",
        )
    console.print(table)

    where = Table(title="where the time goes: seconds (share of the run) per part, timed inside the run",
                  title_justify="left")
    where.add_column("n", justify="right")
    where.add_column("total s", justify="right")
    for key in TIME_KEYS:
        where.add_column(key, justify="right")
    for row in ours:
        if "error" not in row:
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
        if "error" not in row:
            rounds.add_row(f"{row['n']:,}", "  ".join(f"{w:.3f}" for w in row["round_wall_s"]))
            records += [record("kz_scale_rounds", n_points=row["n"], round_idx=i, round_wall_s=w)
                        for i, w in enumerate(row["round_wall_s"])]
    console.print(rounds)

    base = Table(title="baselines in the same run: centralised kzc and greedy on the same data", title_justify="left")
    for col in ("n", "dist-kzc s", "kzc s", "dist-kzc / kzc time", "greedy s", "dist-kzc / greedy time",
                "radius dist-kzc", "radius kzc", "ours / kzc radius", "radius greedy", "ours / greedy radius"):
        base.add_column(col, justify="right")
    for row in ours:
        n = row["n"]
        mine = row if "error" not in row else None
        cells = [f"{n:,}", f"{mine['total_s']:.2f}" if mine else row["error"]]
        radius_cells = [f"{mine['radius']:.3f}" if mine else "-"]
        for kind in ("kzc", "greedy"):
            res = central[kind].get(n, {"error": "not run"})
            ok = "error" not in res
            records.append(record(
                "kz_scale_baselines", n_points=n, method=kind, total_s=res["total_s"] if ok else None,
                radius=res["radius"] if ok else None, dist_kzc_total_s=mine["total_s"] if mine else None,
                dist_kzc_radius=mine["radius"] if mine else None,
                time_ratio=mine["total_s"] / res["total_s"] if mine and ok else None,
                radius_ratio=mine["radius"] / res["radius"] if mine and ok and res["radius"] > 0 else None,
                error=None if ok else res["error"],
            ))
            if "error" in res:
                cells += [res["error"], "-"]
                radius_cells += ["-", "-"]
            else:
                cells += [f"{res['total_s']:.2f}", f"{mine['total_s'] / res['total_s']:.2f}" if mine else "-"]
                radius_cells += [f"{res['radius']:.3f}",
                                 f"{mine['radius'] / res['radius']:.2f}" if mine and res["radius"] > 0 else "-"]
        base.add_row(*cells[:2], cells[2], cells[3], cells[4], cells[5], radius_cells[0], radius_cells[1],
                     radius_cells[2], radius_cells[3], radius_cells[4])
    console.print(base)

    finished = [row for row in ours if "error" not in row]
    if finished:
        largest = finished[-1]
        console.print(f"largest n that finished within {budget:g} s: {largest['n']:,} "
                      f"({largest['total_s']:.2f} s, {largest['rounds']} rounds)", highlight=False)
    else:
        console.print(f"no n finished within {budget:g} s", highlight=False)
    if finished and not args.no_profile and not args.quick:
        largest = finished[-1]
        prof = run_worker("dist", largest["n"], args, 3 * budget, profile=True)
        if "error" in prof:
            console.print(f"profiled run: {prof['error']}", highlight=False)
        else:
            ptable = Table(title=f"cProfile of the dist-kzc run at n = {largest['n']:,}: top 10 by cumulative time "
                                 f"(profiled run {prof['total_s']:.2f} s; frames spanning the whole run, i.e. the "
                                 "trio/run_parties scaffolding, left out)", title_justify="left")
            for col in ("function", "calls", "tottime s", "cumtime s"):
                ptable.add_column(col, justify="right" if col != "function" else "left")
            shown = [item for item in prof["profile"] if item["cumtime"] < 0.98 * prof["total_s"]][:10]
            for item in shown:
                ptable.add_row(item["function"], f"{item['calls']:,}", f"{item['tottime']:.2f}", f"{item['cumtime']:.2f}")
                records.append(record("kz_scale_profile", function=item["function"], calls=item["calls"],
                                      tottime_s=item["tottime"], cumtime_s=item["cumtime"]))
            console.print(ptable)
    write_records(args.json, records, console)


if __name__ == "__main__":
    main()

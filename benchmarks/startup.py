"""Start-up of ``fedproto run``: a cold first run against a second run that finds its kernels cached.

What it measures
----------------
``fedproto run fastlloyd --data DATA --clients 2 --quiet --report R`` as a fresh process, three
ways, each in a new temporary ``XDG_CACHE_HOME``:

* **cold**: an empty compile cache (the first run on a machine);
* **warm**: the same command again, finding the kernels the cold run cached
  (`fedproto.compilation.enable_compile_cache`);
* **no cache**: ``--no-compile-cache``, the baseline (what every run cost before the cache).

Per run: the process's whole wall time (interpreter start to exit, measured by this script), the
time from process start to the first frame of round 0 (``to first round``: imports, data,
plan, machine construction and key agreement; recorded by a small driver that wraps the
command line's meter), the report's ``compile_s`` (tracing, lowering and compiling JAX kernels
during the run) and ``wall_time_s`` (the run itself). Ratios are cold / warm (how many times
sooner the warm run gets there). ``--repeats R`` takes the median of R cold/warm pairs, each
pair in its own cache directory.

The data default is the paper's s1 (5,000 points, d = 2, k = 15) where ``--data s1`` finds it (a
``FEDPROTO_DATA`` directory or the cache of ``fedproto data fetch s1``), or the bundled iris when
it is absent and with ``--quick``.

Run::

    python benchmarks/startup.py                    # s1, 3 repeats (about a minute)
    python benchmarks/startup.py --quick            # iris, one repeat
    python benchmarks/startup.py --json start.json  # also the table as JSON records

Issue 29's two start-up targets, each against its baseline measured in the same repeat
(interleaved, so a loaded machine slows both alike):

* **floor**: the warm run's process time over that of ``python -c "import jax, numpy, trio"``
  (target at most 1.5);
* **tcp / memory**: the tutorial's 3-party secure sum, ``fedproto run docs/tutorial/secure_sum.py
  --transport tcp``, over the same run in memory (target at most 2). The TCP parties are forked
  from a copy of the launcher (:mod:`fedproto._fork_server`); the same run with
  ``FEDPROTO_FORK_SERVER=0`` (every party a fresh interpreter, as before the fork server) is
  printed beside it.

Each target is printed as wall time and as CPU time (user + system, children included), each
over its baseline's.

Every process finds Python's bytecode cached, as on a user's machine from its second run on: the
children get ``PYTHONPYCACHEPREFIX`` in this script's temporary directory (and no
``PYTHONDONTWRITEBYTECODE``, which CI's environment sets), filled by untimed runs of the floor and
the tutorial before the first repeat (and by the cold run). Without it every run compiled
fedproto's and the protocol's modules from source (about 0.5 s of CPU for fastlloyd), and the
floor, whose modules were installed with their bytecode, did not.

``--targets`` measures only these (one cold run fills the cache, then per repeat the warm run,
the floor and the three tutorial runs, interleaved): about 25 s instead of a minute.

``--json PATH`` writes one record per row (table ``startup``): ``data_set``, ``mode`` (``cold``,
``warm``, ``no_cache``), ``process_s``, ``to_first_round_s``, ``compile_s``, ``run_s``,
``repeats``, and for ``warm`` the ratios ``to_first_round_ratio``, ``compile_ratio`` and
``process_ratio`` (cold / warm); and one record per target (table ``startup_targets``):
``target`` (``floor``, ``tcp_over_memory``, and ``fresh_tcp_over_memory`` with no limit),
``process_s``, ``baseline_s``, ``ratio`` (wall time), ``cpu_s``, ``baseline_cpu_s``,
``cpu_ratio`` (user + system CPU time of the process and every process it waited for: what a
shared machine's load disturbs least), ``limit``, ``repeats``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import add_common_arguments, make_console, parse_args, print_machine_facts, record, write_records
from fedproto.data import find_data_file
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]

# Runs the command line with the meter's first round-0 frame time-stamped (wall clock), printed
# on stderr as "FIRST_ROUND <seconds since the epoch>".
DRIVER = """
import sys, time
from fedproto import metering
original = metering.Meter.record_sent
seen = []
def record_sent(self, round_idx, phase, *args, **kwargs):
    if not seen and not metering.is_setup_phase(phase):
        seen.append(time.time())
        print(f"FIRST_ROUND {seen[0]!r}", file=sys.stderr, flush=True)
    return original(self, round_idx, phase, *args, **kwargs)
metering.Meter.record_sent = record_sent
from fedproto.cli import main
sys.exit(main())  # as the console script calls it: this process is the command line
"""


def child_environment(cache_home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A measured process's environment: its own ``XDG_CACHE_HOME``, and Python's bytecode kept
    under :data:`PYCACHE` (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "XDG_CACHE_HOME": str(cache_home), "PYTHONPYCACHEPREFIX": str(PYCACHE), **(extra or {})}


#: Where the measured processes keep their bytecode (set in :func:`main`, in its temporary directory).
PYCACHE = Path(tempfile.gettempdir()) / "fedproto-startup-pycache"


def run_once(data: str, cache_home: Path, report: Path, *, cache: bool) -> dict[str, float]:
    """One ``fedproto run`` in a fresh process; its timings."""
    argv = ["run", "fastlloyd", "--data", data, "--clients", "2", "--quiet", "--no-plot", "--report", str(report)]
    if not cache:
        argv.append("--no-compile-cache")
    env = child_environment(cache_home)
    cpu0 = children_cpu_seconds()
    t0 = time.time()
    done = subprocess.run([sys.executable, "-c", DRIVER, *argv], env=env, capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    process_s = time.time() - t0
    cpu_s = children_cpu_seconds() - cpu0
    if done.returncode != 0:
        raise SystemExit(f"fedproto run failed: {done.stderr.strip().splitlines()[-1:]}")
    first = [float(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("FIRST_ROUND ")]
    doc = json.loads(report.read_text())
    return {"process_s": process_s, "to_first_round_s": first[0] - t0, "compile_s": doc["compile_s"],
            "run_s": doc["wall_time_s"], "cpu_s": cpu_s}


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's waited-for children so far (and of theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


#: The floor a ``fedproto run`` is compared with: the imports every run needs.
FLOOR = [sys.executable, "-c", "import jax, numpy, trio"]
#: The tutorial's secure sum (3 parties by default).
TUTORIAL = ROOT / "docs" / "tutorial" / "secure_sum.py"


def process_seconds(
    argv: list[str], cache_home: Path, extra_env: dict[str, str] | None = None
) -> tuple[float, float]:
    """Wall time of ``argv`` as a fresh process (interpreter start to exit), and the CPU time
    (user + system) of it and every process it waited for."""
    env = child_environment(cache_home, extra_env)
    cpu0 = children_cpu_seconds()
    t0 = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT, timeout=600)
    seconds = time.time() - t0, children_cpu_seconds() - cpu0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} failed: {done.stderr.strip().splitlines()[-1:]}")
    return seconds


def tutorial_seconds(transport: str, cache_home: Path, *, fork_server: bool = True) -> tuple[float, float]:
    """``fedproto run docs/tutorial/secure_sum.py --transport TRANSPORT --no-plot``, in seconds
    (``fork_server=False``: with ``FEDPROTO_FORK_SERVER=0``, every TCP party a fresh interpreter)."""
    return process_seconds([sys.executable, "-m", "fedproto", "run", str(TUTORIAL), "--transport", transport,
                            "--no-plot", "--quiet"], cache_home, {} if fork_server else {"FEDPROTO_FORK_SERVER": "0"})


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_arguments(parser, quick="iris, one repeat")
    parser.add_argument("--data", default=None, help="data set (default: s1 where found, else iris)")
    parser.add_argument("--repeats", type=int, default=None, help="cold/warm pairs, median kept (default 3; 1 quick)")
    parser.add_argument("--targets", action="store_true",
                        help="only issue 29's two targets (one cold run, then warm runs; no --no-compile-cache runs)")
    args = parse_args(parser, argv)
    # A path, not the name: each run has its own XDG_CACHE_HOME, where a fetched s1 is not.
    s1 = None if args.quick else find_data_file("s1")
    data = args.data or ("iris" if s1 is None else str(s1))
    repeats = args.repeats or (1 if args.quick else 3)
    console = make_console()
    print_machine_facts(console, "fedproto run start-up: cold compile cache, warm, and no cache", {
        "command": f"fedproto run fastlloyd --data {data} --clients 2 --quiet",
        "repeats": repeats,
    })
    modes: dict[str, list[dict[str, float]]] = {"cold": [], "warm": [], "no_cache": []}
    floor: list[tuple[float, float]] = []  # (wall, cpu) seconds
    tutorial: dict[str, list[tuple[float, float]]] = {"memory": [], "tcp": [], "tcp_fresh": []}
    global PYCACHE
    with tempfile.TemporaryDirectory(prefix="fedproto-startup-") as tmp:
        PYCACHE = Path(tmp) / "pycache"
        process_seconds(FLOOR, Path(tmp) / "warm-up")  # untimed: bytecode of what every run imports
        tutorial_seconds("memory", Path(tmp) / "warm-up")
        for r in range(repeats):
            home = Path(tmp) / ("pair-0" if args.targets else f"pair-{r}")
            if not args.targets or r == 0:
                modes["cold"].append(run_once(data, home, Path(tmp) / f"cold-{r}.json", cache=True))
            modes["warm"].append(run_once(data, home, Path(tmp) / f"warm-{r}.json", cache=True))
            if not args.targets:
                modes["no_cache"].append(run_once(data, Path(tmp) / f"off-{r}", Path(tmp) / f"off-{r}.json",
                                                  cache=False))
            floor.append(process_seconds(FLOOR, home))
            tutorial["memory"].append(tutorial_seconds("memory", home))
            tutorial["tcp"].append(tutorial_seconds("tcp", home))
            tutorial["tcp_fresh"].append(tutorial_seconds("tcp", home, fork_server=False))
            console.print(f"repeat {r + 1}/{repeats} done", highlight=False)
    med = {mode: median_of(runs) for mode, runs in modes.items() if runs}
    name = Path(data).stem if os.sep in data else data
    table = Table(title=f"Start-up of fedproto run fastlloyd on {name} (seconds, median of {repeats}); "
                        "ratio = cold / warm", title_justify="left")
    for col in ("mode", "process s", "to first round s", "compile s", "run s"):
        table.add_column(col, justify="right" if col != "mode" else "left")
    records = []
    for mode in [m for m in ("cold", "warm", "no_cache") if m in med]:
        m = med[mode]
        table.add_row(mode.replace("_", " "), f"{m['process_s']:.2f}", f"{m['to_first_round_s']:.2f}",
                      f"{m['compile_s']:.3f}", f"{m['run_s']:.3f}")
        extra = {}
        if mode == "warm":
            cold = med["cold"]
            extra = {key.replace("_s", "_ratio"): cold[key] / m[key] if m[key] > 0 else None
                     for key in ("to_first_round_s", "compile_s", "process_s")}
        records.append(record("startup", data_set=name, mode=mode, repeats=repeats, **m, **extra))
    cold, warm = med["cold"], med["warm"]
    table.add_row("ratio", f"{cold['process_s'] / warm['process_s']:.2f}",
                  f"{cold['to_first_round_s'] / warm['to_first_round_s']:.2f}",
                  f"{cold['compile_s'] / warm['compile_s']:.2f}" if warm["compile_s"] > 0 else "-",
                  f"{cold['run_s'] / warm['run_s']:.2f}")
    console.print(table)
    targets = Table(title=f"Issue 29 start-up targets (seconds of process time, median of {repeats}; "
                          "baseline measured in the same repeats)", title_justify="left")
    for col in ("target", "command s", "baseline s", "ratio", "cpu s", "baseline cpu s", "cpu ratio", "limit"):
        targets.add_column(col, justify="right" if col != "target" else "left")

    def wall_cpu(runs: list[tuple[float, float]]) -> tuple[float, float]:
        return statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)

    warm = (med["warm"]["process_s"], med["warm"]["cpu_s"])
    rows = {
        "floor": ("warm run / import jax, numpy, trio", warm, wall_cpu(floor), 1.5),
        "tcp_over_memory": ("tutorial secure sum: tcp / memory", wall_cpu(tutorial["tcp"]),
                            wall_cpu(tutorial["memory"]), 2.0),
        "fresh_tcp_over_memory": ("(tcp, every party a fresh interpreter) / memory", wall_cpu(tutorial["tcp_fresh"]),
                                  wall_cpu(tutorial["memory"]), None),
    }
    for key, (label, (seconds, cpu), (baseline, baseline_cpu), limit) in rows.items():
        ratio, cpu_ratio = seconds / baseline, cpu / baseline_cpu
        targets.add_row(label, f"{seconds:.2f}", f"{baseline:.2f}", f"{ratio:.2f}", f"{cpu:.2f}", f"{baseline_cpu:.2f}",
                        f"{cpu_ratio:.2f}", "-" if limit is None else f"{limit:.1f}")
        records.append(record("startup_targets", target=key, process_s=seconds, baseline_s=baseline, ratio=ratio,
                              cpu_s=cpu, baseline_cpu_s=baseline_cpu, cpu_ratio=cpu_ratio, limit=limit,
                              repeats=repeats))
    console.print(targets)
    write_records(args.json, records, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())

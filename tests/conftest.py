"""Session-wide test set-up: compiled JAX kernels are cached in one temporary directory, and the
papers' data sets come from the offline mirror.

``fedproto run`` keeps compiled kernels and fetched data sets in the user's cache directory
(``$XDG_CACHE_HOME``); the tests run the command line in this process and in subprocesses, so they
point that variable at a directory of their own, removed at the end, and never touch the user's
cache. Data sets by name (``--data s1``) are read from ``FEDPROTO_DATA``: the project's
``../shared/data`` beside the checkout unless the variable is already set (a worktree elsewhere
sets it to the mirror). Set here at import, so subprocesses inherit both; no test touches the
network.

OpenMP runs one thread per process (``OMP_NUM_THREADS=1`` unless already set; OpenBLAS reads it
too): the suite runs two xdist workers on two cores, each starting party processes, and
scikit-learn's KMeans (MUFC's split and baselines, the reference optima) otherwise starts a thread
per core in every process, whose OpenMP threads spin-wait on the oversubscribed cores. Under load
that spinning was a third of a run's CPU (the MUFC command-line test: 47 s of CPU, 34 s with one
thread). Results do not depend on it: every check compares runs of this suite with each other or
within tolerances (scikit-learn's threaded sums differ in the last bit at most, and
tests/algorithms/mufc/test_data.py and FastLloyd's reference optimum already pin one thread).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# One cache for the whole run: the xdist workers inherit the controller's directory (made when it
# imported this file, before it started them), so a kernel compiled by one is loaded by the other,
# as in a one-process run; only the process that made the directory removes it.
_SHARED = "FEDPROTO_TEST_CACHE_HOME"
_OWNER = _SHARED not in os.environ
if _OWNER:
    os.environ[_SHARED] = tempfile.mkdtemp(prefix="fedproto-test-cache-")
_CACHE_HOME = os.environ[_SHARED]
os.environ["XDG_CACHE_HOME"] = _CACHE_HOME
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("FEDPROTO_DATA", str(Path(__file__).resolve().parents[1].parent / "shared" / "data"))


#: Test files that each keep one worker busy for 15-75 s (they start processes: mpiexec, a Python
#: per party, the benchmark scripts) while holding few tests, heaviest first. pytest-xdist's
#: ``loadfile`` hands whole files to the workers in collection order (``--no-loadscope-reorder``
#: in pyproject.toml: its default order, most tests first, would leave these for the end, where
#: one worker runs a long file alone while the other waits). Only a schedule: a file missing here
#: runs after them, in pytest's own order, and a one-process run (``-n 0``) is unaffected but for
#: the order.
HEAVY_FIRST = (
    "test_benchmarks_smoke.py",
    "test_transport_agreement.py",
    "test_examples.py",
    "test_sharded_identity.py",
    "algorithms/mufc/test_clustering.py",
    "algorithms/deletion/test_federated.py",
    "algorithms/mufc/test_seeding.py",
    "algorithms/deletion/test_qkmeans.py",
    "algorithms/mufc/test_cli.py",
    "test_cli.py",
    "test_report_schema.py",
    "transports/test_tcp_pressure.py",
    "fedproto/test_compilation.py",
    "test_startup_imports.py",
    "test_tcp_failed_runs.py",
    "test_frame_limits.py",
)


def pytest_collection_modifyitems(config, items):
    """Put the files of :data:`HEAVY_FIRST` first, in its order (a stable sort: the tests of a
    file keep their order, and so do the other files)."""
    tests = Path(__file__).resolve().parent
    rank = {name: position for position, name in enumerate(HEAVY_FIRST)}

    def position(item) -> int:
        try:
            return rank.get(Path(item.path).resolve().relative_to(tests).as_posix(), len(rank))
        except ValueError:  # a test outside tests/ (a path given on the command line)
            return len(rank)

    items.sort(key=position)


def pytest_unconfigure(config):
    if _OWNER:
        shutil.rmtree(_CACHE_HOME, ignore_errors=True)

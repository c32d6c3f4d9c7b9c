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


def pytest_unconfigure(config):
    if _OWNER:
        shutil.rmtree(_CACHE_HOME, ignore_errors=True)

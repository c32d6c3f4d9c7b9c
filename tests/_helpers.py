"""Helpers shared by several test files: subprocesses, process trees, TCP ports, option parsing.

Not a test file (pytest collects ``test_*.py`` only). Test files run under
``--import-mode=importlib`` and cannot import one another by name, so they load this one by path::

    from fedproto.testing import load_file

    helpers = load_file(Path(__file__).resolve().parents[1] / "_helpers.py", "tests_helpers")

Everything here that starts a process bounds it by a timeout and kills it (its whole process
group where it has one) on the way out, whatever happens.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from fedproto.compilation import default_cache_dir

# re-exported: its home is fedproto.testing.local_data
from fedproto.testing.local_data import run_party_processes

__all__ = [
    "FEDPROTO",
    "alive",
    "assert_pair_draws_follow",
    "compile_cache_env",
    "fedproto_ok",
    "free_port",
    "gumbel_max_pick",
    "kill_all",
    "kill_group",
    "leaf_processes",
    "module_file",
    "plugin_args",
    "process_tree",
    "reap",
    "run_party_processes",
    "wait_dead",
    "wait_while_running",
    "warnings_of",
]

#: ``fedproto`` run by this interpreter (``python -m fedproto``).
FEDPROTO = [sys.executable, "-m", "fedproto"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bound, read and released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fedproto_ok(argv: Sequence[str], cwd: Path, *, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """Run ``fedproto ARGV`` in a subprocess (no stdin) and assert it exits 0.

    Returns:
        The completed process, its output captured as text.

    Raises:
        AssertionError: a non-zero exit, with the end of its stderr.
        subprocess.TimeoutExpired: it ran past ``timeout_s`` seconds.
    """
    done = subprocess.run([*FEDPROTO, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def compile_cache_env() -> dict[str, str]:
    """This process's environment with JAX's persistent compilation cache turned on for a child
    process, in the tests' shared cache (``$XDG_CACHE_HOME/fedproto/jax``, made by conftest.py).

    For scripts that do not turn the cache on themselves (the examples, the benchmarks): a
    kernel another test's process compiled with the same shapes is loaded, not compiled again.
    The same three variables :func:`fedproto.compilation.enable_compile_cache` sets before JAX
    is imported (every kernel cached, however quick its compilation); results are the same.
    """
    directory = default_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(directory),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group that ``proc`` leads (started with ``start_new_session=True``), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def kill_all(procs: Iterable[subprocess.Popen]) -> None:
    """SIGKILL every process of ``procs`` that still runs, and reap it."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def reap(proc: subprocess.Popen) -> None:
    """Kill ``proc`` if it still runs, reap it and close its stderr pipe."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    proc.stderr.close()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is neither a zombie nor dead (``/proc/PID/stat``)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def process_tree(pid: int) -> dict[int, list[int]]:
    """``{process: its children}`` of every live process below ``pid`` (from /proc; zombies are
    not counted)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat_fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if stat_fields[0] not in ("Z", "X"):
                parents[int(entry.name)] = int(stat_fields[1])
    tree: dict[int, list[int]] = {}
    todo = [pid]
    while todo:
        below = [child for child, parent in parents.items() if parent == todo[-1]]
        tree[todo.pop()] = below
        todo += below
    del tree[pid]
    return tree


def leaf_processes(pid: int) -> list[int]:
    """The parties below the launcher ``pid``: its descendants without children of their own (a
    fork server's children are the parties; without one, the launcher's are)."""
    return [p for p, below in process_tree(pid).items() if not below]


def wait_dead(pids: Sequence[int], timeout_s: float) -> list[int]:
    """The pids still alive after up to ``timeout_s`` seconds (polled every 50 ms)."""
    limit = time.monotonic() + timeout_s
    while time.monotonic() < limit:
        if not any(alive(pid) for pid in pids):
            return []
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def plugin_args(plugin: Any, argv: Sequence[str], **defaults: Any) -> argparse.Namespace:
    """Parse ``argv`` with the plugin's options plus the core ones a ``fedproto run`` adds
    (``--data``, ``--clients``, ``--seed``, ``--partition``, ``--deadline``; see
    ``fedproto.cli._common_arguments``), with these tests' defaults: ``blobs``, 2 clients, seed 0,
    ``iid``, 60 s; ``defaults`` overrides them by destination name."""
    values = {"data": "blobs", "clients": 2, "seed": 0, "partition": "iid", "deadline": 60.0, **defaults}
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=values["data"])
    parser.add_argument("--clients", type=int, default=values["clients"])
    parser.add_argument("--seed", type=int, default=values["seed"])
    parser.add_argument("--partition", default=values["partition"])
    parser.add_argument("--deadline", type=float, default=values["deadline"])
    plugin.add_arguments(parser)
    return parser.parse_args(argv)


def module_file(tmp_path_factory: pytest.TempPathFactory, folder: str, name: str, text: str) -> Path:
    """Write ``text`` (a protocol plugin's source, say) to ``name`` in a new temporary folder."""
    path = tmp_path_factory.mktemp(folder) / name
    path.write_text(text)
    return path


def assert_pair_draws_follow(rows: Any, count: Any, expected: Any) -> None:
    """Check seeding draws of two rows each against the expected count of every ordered pair.

    Args:
        rows: int ``[trials, 2]``, the two rows each trial drew.
        count: int ``[trials]``, how many rows each trial drew (all must be 2).
        expected: float ``[n, n]``, the expected number of trials drawing row i then row j.

    Raises:
        AssertionError: a trial drew another number of rows, a pair of zero probability was
            drawn (a chosen row drawn again, say), or a chi-square test rejects at p <= 1e-3.
    """
    import numpy as np
    import scipy.stats

    rows = np.asarray(rows)
    assert np.all(np.asarray(count) == 2)
    observed = np.zeros(np.shape(expected))
    np.add.at(observed, (rows[:, 0], rows[:, 1]), 1)
    mask = expected > 0
    assert observed[~mask].sum() == 0  # a chosen point is never drawn again
    assert scipy.stats.chisquare(observed[mask], expected[mask]).pvalue > 1e-3


@functools.cache
def _keyed_gumbel() -> Any:
    """One keyed Gumbel variate, jitted on its own (JAX loads on first use, not with this file)."""
    import jax
    import jax.numpy as jnp

    return jax.jit(lambda key, point_id: jax.random.gumbel(jax.random.fold_in(key, point_id), (), jnp.float64))


def gumbel_max_pick(step_key: Any, ids: Any, weight: Any) -> int:
    """One keyed D^2 draw, slowly, point by point: the slow references of the seeding kernels
    (weighted k-means++ in ``fedproto.algorithms.kmeans``, MUFC's Algorithm 3) draw with it.

    Picks ``argmax_r log(weight[r]) + Gumbel(fold_in(step_key, ids[r]))`` over the rows of
    positive weight (the Gumbel-max trick: row r with probability ``weight[r] / sum(weight)``);
    a point's noise depends on its id only, not on its row.

    Args:
        step_key: the step's JAX PRNG key.
        ids: int ``[n]``, the points' ids.
        weight: float64 ``[n]``, ``>= 0``, at least one positive (the caller stops first when
            none is).

    Returns:
        The row drawn (ties to the lowest row, as ``np.argmax``).
    """
    import math

    import numpy as np

    gumbel = _keyed_gumbel()
    score = np.full(len(ids), -np.inf)
    for r in np.flatnonzero(weight > 0):
        g = float(gumbel(step_key, int(ids[r])))
        score[r] = math.log(weight[r]) + g
    return int(np.argmax(score))


def warnings_of(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    """The messages of the WARNING records that ``logger`` logged."""
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno == logging.WARNING]


def wait_while_running(proc: subprocess.Popen, done: Any, failure: str, *, timeout_s: float = 60) -> None:
    """Poll ``done()`` every 50 ms until it is true, failing if ``proc`` ends first (with its
    stderr) or after ``timeout_s`` seconds (with ``failure``)."""
    limit = time.monotonic() + timeout_s
    while not done():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < limit, failure
        time.sleep(0.05)

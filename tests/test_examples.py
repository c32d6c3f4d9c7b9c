"""Every example script runs on tiny arguments, and the three transports print the same run.

Each example is started as a user would start it (a subprocess, the MPI one under ``mpiexec``),
in its own process group so that a hung run and every process it started are killed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ARGS = ["--data", "iris", "--clients", "2", "--epsilon", "1", "--seed", "0"]
K_IRIS, D_IRIS = 3, 4
TIMEOUT_S = 180


def _mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run ``cmd`` with a timeout; kill its whole process group whatever happens."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(cmd)} did not finish within {TIMEOUT_S} s")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _centroids(stdout: str) -> list[list[float]]:
    """The rows printed as ``  c<j>: v v v ...``, in order."""
    rows = []
    for match in re.finditer(r"^\s*c(\d+):((?:\s+[-+]?\d+\.\d+)+)\s*$", stdout, flags=re.MULTILINE):
        assert int(match.group(1)) == len(rows), stdout
        rows.append([float(v) for v in match.group(2).split()])
    return rows


def _total_bytes(stdout: str) -> int:
    match = re.search(r"^total payload bytes: (\d+) in (\d+) messages", stdout, flags=re.MULTILINE)
    assert match, stdout
    return int(match.group(1))


def _check_centroids(stdout: str) -> list[list[float]]:
    rows = _centroids(stdout)
    assert len(rows) == K_IRIS, stdout
    assert all(len(row) == D_IRIS for row in rows), stdout
    # normalised data live in [-1, 1]^d and FastLloyd folds centroids back into the domain
    assert all(-1.0 <= v <= 1.0 for row in rows for v in row), stdout
    assert len({tuple(row) for row in rows}) == K_IRIS, "centroids collapsed"
    return rows


@pytest.fixture(scope="module")
def memory_run(tmp_path_factory) -> subprocess.CompletedProcess:
    done = _run([sys.executable, str(EXAMPLES / "fastlloyd_memory.py"), *ARGS], tmp_path_factory.mktemp("memory"))
    assert done.returncode == 0, done.stderr
    return done


def test_memory_example(memory_run):
    out = memory_run.stdout
    _check_centroids(out)
    nicv = float(re.search(r"^NICV: (\S+)$", out, flags=re.MULTILINE).group(1))
    # iris normalised to [-1, 1]: the variance around one centre is ~0.6, k-means++ reaches ~0.19
    assert 0.1 < nicv < 0.6, out
    rounds = [int(b) for b in re.findall(r"^round \d+ bytes: (\d+)$", out, flags=re.MULTILINE)]
    setup = int(re.search(r"^setup bytes: (\d+)$", out, flags=re.MULTILINE).group(1))
    assert rounds and all(b > 0 for b in rounds) and len(set(rounds)) == 1, out
    assert setup + sum(rounds) == _total_bytes(out)


def test_tcp_example(tmp_path, memory_run):
    done = _run([sys.executable, str(EXAMPLES / "fastlloyd_tcp.py"), *ARGS], tmp_path)
    assert done.returncode == 0, done.stderr
    # same seed, same arguments: the same centroids and the same payload bytes as in memory
    assert _check_centroids(done.stdout) == _centroids(memory_run.stdout)
    assert _total_bytes(done.stdout) == _total_bytes(memory_run.stdout)
    messages = int(re.search(r"in (\d+) messages", done.stdout).group(1))
    assert f"+ {4 * messages} bytes of TCP length prefixes" in done.stdout


@pytest.mark.mpi
def test_mpi_example(tmp_path, memory_run):
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("mpiexec not found (pip install 'fedproto[mpi]')")
    done = _run([mpiexec, "-n", "3", sys.executable, str(EXAMPLES / "fastlloyd_mpi.py"), *ARGS], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("centroids:") == 1, "only rank 1 prints"
    assert _check_centroids(done.stdout) == _centroids(memory_run.stdout)
    assert _total_bytes(done.stdout) == _total_bytes(memory_run.stdout)

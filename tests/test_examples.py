"""Every example script runs on tiny arguments, and the three transports print the same run.

Each example is started as a user would start it (a subprocess, the MPI one under ``mpiexec``),
in its own process group so that a hung run and every process it started are killed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedproto.testing import load_file

helpers = load_file(Path(__file__).with_name("_helpers.py"), "tests_helpers")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ARGS = ["--data", "iris", "--clients", "2", "--epsilon", "1", "--seed", "0"]
K_IRIS, D_IRIS = 3, 4
TIMEOUT_S = 180


def _mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run ``cmd`` with a timeout; kill its whole process group whatever happens.

    JAX's compile cache is on for it (the tests' shared one): the examples run the same kernels
    several times here (memory, TCP parties, MPI ranks, the old option spelling), compiled once.
    """
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, start_new_session=True, env=helpers.compile_cache_env(),
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(cmd)} did not finish within {TIMEOUT_S} s")
    finally:
        helpers.kill_group(proc)
        proc.communicate()  # closes its pipes (left open, a later test's gc would warn)
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


# --------------------------------------------------------------------------- deletion (DC-k-means)

DELETION_ARGS = ["--data", "iris", "--removals", "5", "--seed", "0"]


def _deletion_lines(stdout: str) -> list[tuple[int, int, int, int]]:
    """``(root bytes, owner bytes, other leaves, their bytes)`` of each ``deletion r:`` line."""
    pattern = (r"^deletion \d+: point \d+ at leaf-\d+: root sent (\d+) bytes, leaf-\d+ sent (\d+) bytes, "
               r"the other (\d+) leaves sent (\d+) bytes$")
    return [tuple(int(g) for g in m.groups()) for m in re.finditer(pattern, stdout, flags=re.MULTILINE)]


@pytest.fixture(scope="module")
def deletion_memory_run(tmp_path_factory) -> subprocess.CompletedProcess:
    done = _run([sys.executable, str(EXAMPLES / "deletion_memory.py"), *DELETION_ARGS],
                tmp_path_factory.mktemp("deletion-memory"))
    assert done.returncode == 0, done.stderr
    return done


def test_deletion_memory_example(deletion_memory_run):
    """DC-k-means: a deletion costs the request and one upload; the untouched leaves send 0 bytes."""
    out = deletion_memory_run.stdout
    rows = _centroids(out)
    assert len(rows) == K_IRIS and all(len(row) == D_IRIS for row in rows), out
    assert all(0.0 <= v <= 1.0 for row in rows for v in row), out  # min-max scaled to [0, 1]
    lines = _deletion_lines(out)
    assert len(lines) == 5, out
    assert all(root > 0 and owner > 0 and others == 3 and silent == 0 for root, owner, others, silent in lines), out
    rounds = [int(b) for b in re.findall(r"^round \d+ bytes: (\d+)$", out, flags=re.MULTILINE)]
    assert len(rounds) == 5 + 2 and sum(rounds) == _total_bytes(out), out
    assert all(rounds[r] == lines[r - 1][0] + lines[r - 1][1] for r in range(1, 6)), out
    assert "equals DC-k-means trained on the remaining data with the same key: True" in out


def test_deletion_examples_keep_the_old_option_spelling():
    """``--deletions`` stays a hidden alias of ``--removals`` in both deletion examples' parser (the
    one both build their options with): the same options, and ``--help`` names only the new one."""
    common = load_file(EXAMPLES / "_common.py", "examples_common", sibling_imports=True)
    for script in ("deletion_memory.py", "deletion_tcp.py"):
        assert "deletion_options(" in (EXAMPLES / script).read_text(), script
    parser = common.deletion_options("deletion")
    old = [arg if arg != "--removals" else "--deletions" for arg in DELETION_ARGS]
    assert parser.parse_args(old) == parser.parse_args(DELETION_ARGS)
    assert parser.parse_args(old).removals == 5
    assert "--removals" in parser.format_help() and "--deletions" not in parser.format_help()


def test_deletion_tcp_example(tmp_path, deletion_memory_run):
    done = _run([sys.executable, str(EXAMPLES / "deletion_tcp.py"), *DELETION_ARGS], tmp_path)
    assert done.returncode == 0, done.stderr
    # same seed, same arguments: the same model, the same bytes per deletion and in total
    assert _centroids(done.stdout) == _centroids(deletion_memory_run.stdout)
    assert _deletion_lines(done.stdout) == _deletion_lines(deletion_memory_run.stdout)
    assert _total_bytes(done.stdout) == _total_bytes(deletion_memory_run.stdout)
    messages = int(re.search(r"in (\d+) messages", done.stdout).group(1))
    assert f"+ {4 * messages} bytes of TCP length prefixes" in done.stdout


def test_mufc_memory_example(tmp_path):
    """The MUFC example unlearns exactly and every client's share is T field elements."""
    done = _run([sys.executable, str(EXAMPLES / "mufc_memory.py"), "--data", "iris", "--clients", "3",
                 "--removals", "3", "--seed", "1"], tmp_path)
    out = done.stdout
    assert "equals retraining on the remaining data with the same keys: True" in out, out
    assert "decoded point counts per version: [150, 149, 148, 147]" in out, out
    assert "round 3 removal" in out and "round 4" not in out

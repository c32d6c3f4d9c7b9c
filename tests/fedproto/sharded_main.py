"""Run many sharded lean runs in one MPI job (tests/test_sharded_identity.py starts it).

    mpiexec -n R python tests/fedproto/sharded_main.py CASES.json OUT

``CASES.json`` maps a case name to a ``fedproto run`` command line (``["fastlloyd", "--data",
"iris", ...]``, without ``run``). Every rank calls :func:`fedproto.cli.main` for each case in turn,
with ``--engine lean --quiet --no-plot --report OUT/NAME.json`` added, so JAX and the imports are
paid once per rank, not once per case. Rank 0 writes the reports (the CLI's own rule); every rank
writes ``OUT/NAME.rank<r>.json``: its exit code, its seconds, and what the CLI printed.

The tests load this file for its helpers too (:func:`run_mpiexec`: a job in its own process group,
killed at the end whatever happens, with no process left behind).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def mpiexec() -> str:
    """The ``mpiexec`` to start jobs with (the registry's MPICH installs it next to the interpreter)."""
    return shutil.which("mpiexec", path=_search_path()) or "mpiexec"


def _search_path() -> str:
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def _group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (zombies apart)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def run_mpiexec(command: list[str], timeout_s: float, meanwhile: Any = None) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in its own session and process group (calling ``meanwhile()`` here while it
    runs); kill the group at the end, whatever happens. Fails the test on a timeout, or when a
    process of the group outlives ``mpiexec``."""
    import pytest

    # the outputs go to files: nothing reads pipes while meanwhile() runs
    with tempfile.TemporaryFile("w+") as out_file, tempfile.TemporaryFile("w+") as err_file:
        proc = subprocess.Popen(
            command, stdout=out_file, stderr=err_file, stdin=subprocess.DEVNULL, text=True, start_new_session=True,
        )
        began = time.monotonic()

        def outputs() -> tuple[str, str]:
            out_file.seek(0), err_file.seek(0)
            return out_file.read(), err_file.read()

        try:
            if meanwhile is not None:
                meanwhile()
            proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - began)))
            out, err = outputs()
            stray = _group_members(proc.pid)
            assert not stray, f"processes {stray} outlived mpiexec\n{out}\n{err}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            out, err = outputs()
            pytest.fail(f"{' '.join(command)} did not finish within {timeout_s} s\n{out}\n{err}")
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def skip_without_mpi() -> None:
    """Skip the calling test where mpi4py or mpiexec is missing."""
    import pytest

    if importlib.util.find_spec("mpi4py") is None or shutil.which("mpiexec", path=_search_path()) is None:
        pytest.skip("needs mpi4py and mpiexec (pip install 'fedproto[mpi]')")


def main(cases_path: str, out_dir: str) -> int:
    from mpi4py import MPI

    from fedproto.cli import main as fedproto_main

    rank = MPI.COMM_WORLD.Get_rank()
    out = Path(out_dir)
    cases = json.loads(Path(cases_path).read_text())
    worst = 0
    for name, argv in cases.items():
        stdout, stderr = io.StringIO(), io.StringIO()
        MPI.COMM_WORLD.Barrier()  # each case starts together on every rank
        began = time.perf_counter()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = fedproto_main(
                ["run", *argv, "--engine", "lean", "--quiet", "--no-plot", "--report", str(out / f"{name}.json")]
            )
        took_s = time.perf_counter() - began
        record = {"rank": rank, "code": code, "took_s": took_s, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}
        (out / f"{name}.rank{rank}.json").write_text(json.dumps(record))
        worst = max(worst, code)
    return worst


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

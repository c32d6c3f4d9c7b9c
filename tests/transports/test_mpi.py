"""The MPI transport: the conformance suite under ``mpiexec -n 3``, and its lazy import."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("mpi_conformance_main.py")
TIMEOUT_S = 120


def _mpiexec() -> str | None:
    # The registry's MPICH installs mpiexec next to the interpreter of the environment.
    search = [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    return shutil.which("mpiexec", path=os.pathsep.join(search))


def _skip_reason() -> str | None:
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install 'fedproto[mpi]')"
    if _mpiexec() is None:
        return "mpiexec is not on PATH nor next to the interpreter (pip install mpich)"
    return None


def _run(command: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in its own session; on timeout end the launcher and every rank it started."""
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()  # mpiexec forwards it to the ranks
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"{' '.join(command)} did not finish within {timeout_s} s\n{out}\n{err}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


@pytest.mark.mpi
def test_conformance_under_mpiexec() -> None:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    result = _run([_mpiexec() or "mpiexec", "-n", "3", sys.executable, str(SCRIPT)], TIMEOUT_S)
    report = f"exit code {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert result.returncode == 0, report
    assert sorted(re.findall(r"rank (\d+): conformance ok", result.stdout)) == ["0", "1", "2"], report


def test_import_without_mpi4py_fails_only_when_used() -> None:
    code = (
        "import sys\n"
        "sys.modules['mpi4py'] = None\n"
        "import fedproto.transports.mpi as m\n"
        "try:\n"
        "    m.MpiTransport(['a'])\n"
        "except ImportError as exc:\n"
        "    print('ImportError:', exc)\n"
    )
    result = _run([sys.executable, "-c", code], 60)
    assert result.returncode == 0, result.stderr
    assert "ImportError: the MPI transport needs mpi4py" in result.stdout
    assert "pip install 'fedproto[mpi]'" in result.stdout

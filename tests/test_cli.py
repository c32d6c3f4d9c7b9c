"""The ``fedproto`` command line end to end.

Runs that cross process boundaries (the reference runs, TCP, MPI, a silent party, the exit codes
a user sees) start ``python -m fedproto`` as a user does; cheap checks (variants, bad input) call
the same ``fedproto.cli.main`` in this process so JAX starts once for them.

* ``run fastlloyd`` over memory prints NICV, the privacy spent and the bytes, writes a JSON report
  that :meth:`RunReport.from_json` reads back, and a plot;
* the same seed gives the same centroids and the same per-link payload bytes over memory, TCP
  (every party its own process) and MPI (``mpiexec``);
* every variant runs;
* bad input gives one line on stderr, no traceback and a non-zero exit;
* a party that never starts makes the server fail within a bounded time, naming it.

Every subprocess runs in its own process group with a timeout; the group is killed in ``finally``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fedproto.metering import RunReport

FEDPROTO = [sys.executable, "-m", "fedproto"]
IRIS_2 = ["--data", "iris", "--clients", "2", "--seed", "0"]
TIMEOUT_S = 180


def _mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def _start(cmd: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, start_new_session=True,
    )


def _finish(proc: subprocess.Popen, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Wait for ``proc``; kill its whole process group (it may have started others) in any case."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(proc.args)} did not finish within {timeout} s")
    finally:
        _kill(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _run(cmd: list[str], cwd: Path, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    return _finish(_start(cmd, cwd), timeout)


def _run_many(cmds: dict[str, list[str]], cwd: Path) -> dict[str, subprocess.CompletedProcess]:
    """Run independent commands concurrently (each pays the interpreter and JAX start-up)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(_run, cmd, cwd) for name, cmd in cmds.items()}
        return {name: future.result() for name, future in futures.items()}


def _ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    return done


def _one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    return _single_line(done.stderr)


def _single_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    # mpiexec may forward two ranks' lines without the newline between them
    assert lines[0].count("fedproto:") == 1, stderr
    return lines[0]


def _links(report: RunReport) -> dict[tuple, tuple[int, int]]:
    return {
        (link.round_idx, link.phase, link.sender, link.receiver, link.tag): (link.messages, link.payload_bytes)
        for link in report.links
    }


# --- runs over memory ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def memory_runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """``run fastlloyd`` on iris (2 clients, the cross-transport reference) and wine (4), with reports."""
    tmp = tmp_path_factory.mktemp("memory")
    cmds = {
        "iris": [*FEDPROTO, "run", "fastlloyd", *IRIS_2, "--report", str(tmp / "iris.json")],
        "wine": [*FEDPROTO, "run", "fastlloyd", "--data", "wine", "--clients", "4", "--epsilon", "1",
                 "--seed", "0", "--report", str(tmp / "wine.json")],
    }
    done = _run_many(cmds, tmp)
    return {name: (_ok(d), tmp / f"{name}.json") for name, d in done.items()}


@pytest.mark.parametrize("name, n, d, k, clients", [("iris", 150, 4, 3, 2), ("wine", 178, 13, 3, 4)])
def test_run_prints_nicv_privacy_and_bytes_and_writes_report_and_plot(memory_runs, name, n, d, k, clients):
    done, path = memory_runs[name]
    for words in ("NICV", "epsilon spent", "payload bytes", "report written to", "plot written to"):
        assert words in done.stdout, done.stdout
    report = RunReport.from_json(path.read_text())
    assert report.protocol == "fastlloyd" and report.transport == "memory"
    assert report.parties == ("server", *(f"client-{i}" for i in range(clients)))
    results = report.results
    assert (results["N"], results["d"], results["k"]) == (n, d, k)
    assert len(results["centroids"]) == k and all(len(row) == d for row in results["centroids"])
    assert results["clients agree on centroids"] is True
    assert math.isfinite(results["NICV (fastlloyd)"]) and results["NICV (fastlloyd)"] > 0
    assert results["epsilon spent"] <= results["epsilon (target)"] * (1 + 1e-9)
    # bytes: totals agree with the links; every iteration carries M uploads and M downloads
    assert report.payload_bytes == sum(link.payload_bytes for link in report.links) > 0
    assert report.algorithm_rounds == results["iterations T"]
    upload = [link for link in report.links if link.phase == "update"]
    assert len(upload) == clients * report.algorithm_rounds
    assert report.framing_overhead_bytes == 0
    plot = path.with_suffix(".png")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the same run over memory, TCP and MPI --------------------------------------------------------


def _reference(memory_runs) -> RunReport:
    return RunReport.from_json(memory_runs["iris"][1].read_text())


def test_same_seed_same_centroids_and_bytes_over_tcp_processes(tmp_path, memory_runs):
    reference = _reference(memory_runs)
    out = tmp_path / "tcp.json"
    _ok(_run([*FEDPROTO, "run", "fastlloyd", *IRIS_2, "--transport", "tcp", "--report", str(out)], tmp_path))
    report = RunReport.from_json(out.read_text())
    assert report.transport == "tcp"
    assert report.results["centroids"] == reference.results["centroids"]
    assert _links(report) == _links(reference)
    assert report.payload_bytes == reference.payload_bytes
    assert report.framing_overhead_bytes == 4 * report.messages  # one length prefix per frame


@pytest.mark.mpi
def test_same_seed_same_centroids_and_bytes_over_mpi(tmp_path, memory_runs):
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("mpiexec not found (pip install 'fedproto[mpi]')")
    reference = _reference(memory_runs)
    out = tmp_path / "mpi.json"
    cmd = [mpiexec, "-n", "3", *FEDPROTO, "run", "fastlloyd", *IRIS_2, "--transport", "mpi", "--report", str(out)]
    _ok(_run(cmd, tmp_path))
    report = RunReport.from_json(out.read_text())
    assert report.transport == "mpi"
    assert report.results["centroids"] == reference.results["centroids"]
    assert _links(report) == _links(reference)
    assert report.framing_overhead_bytes == 0


# --- variants -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["lloyd", "glloyd", "sulloyd", "fastlloyd"])
def test_every_variant_runs(tmp_path, capsys, variant):
    # in this process (the same main() that `python -m fedproto` calls): JAX starts once for all
    from fedproto.cli import main

    out = tmp_path / "report.json"
    assert main(["run", "fastlloyd", "--variant", variant, *IRIS_2, "--quiet", "--report", str(out)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    results = RunReport.from_json(out.read_text()).results
    assert results["variant"] == variant
    assert len(results["centroids"]) == 3
    assert math.isfinite(results[f"NICV ({variant})"])
    if variant == "lloyd":
        assert results["epsilon spent"] == math.inf  # non-private
    else:
        assert results["epsilon spent"] <= 1 + 1e-9


# --- bad input --------------------------------------------------------------------------------------------


def _bad_inputs(tmp: Path) -> dict[str, list[str]]:
    (tmp / "nan.txt").write_text("1 2\n3 nan\n5 6\n7 8\n")
    (tmp / "ragged.txt").write_text("1 2\n3 4 5\n6 7\n")
    (tmp / "garbage.txt").write_bytes(bytes(range(128, 256)) * 4)  # not text: cannot be decoded
    run = [*FEDPROTO, "run", "fastlloyd"]
    return {
        "unknown flag": [*run, "--no-such-flag"],
        "unknown protocol": [*FEDPROTO, "run", "no-such-protocol"],
        "bad data name": [*run, "--data", "no_such_data_set"],
        "missing file": [*run, "--data", str(tmp / "missing.txt")],
        "unreadable file": [*run, "--data", str(tmp / "garbage.txt")],
        "NaN in file": [*run, "--data", str(tmp / "nan.txt"), "--k", "2"],
        "ragged rows": [*run, "--data", str(tmp / "ragged.txt"), "--k", "2"],
        "k > n": [*run, "--data", "iris", "--k", "151"],
        "zero clients": [*run, "--clients", "0"],
        "negative epsilon": [*run, "--epsilon=-1"],
        "unknown transport": [*run, "--transport", "nonsense"],
        "party without roster": [*FEDPROTO, "party", "fastlloyd", "--party", "server", "--roster",
                                 str(tmp / "no-roster.json")],
    }


#: bad input -> words its one-line message must contain
BAD_INPUT_MESSAGES = {
    "unknown flag": "--no-such-flag",
    "unknown protocol": "no-such-protocol",
    "bad data name": "no_such_data_set",
    "missing file": "missing.txt",
    "unreadable file": "garbage.txt",
    "NaN in file": "NaN",
    "ragged rows": "columns",
    "k > n": "150",
    "zero clients": "--clients",
    "negative epsilon": "epsilon",
    "unknown transport": "nonsense",
    "party without roster": "no-roster.json",
}


@pytest.mark.parametrize("case", list(BAD_INPUT_MESSAGES))
def test_bad_input_is_one_line_without_traceback(tmp_path, capfd, case):
    # in this process: an uncaught exception (the traceback a user would see) fails the test
    from fedproto.cli import main

    argv = _bad_inputs(tmp_path)[case][len(FEDPROTO):]
    assert main(argv) != 0
    line = _single_line(capfd.readouterr().err)
    assert line.startswith("fedproto: "), line
    assert BAD_INPUT_MESSAGES[case] in line, line


def test_bad_input_from_the_real_command_is_one_line(tmp_path):
    # the same as a user sees it: interpreter start-up, JAX import, exit code
    cmds = _bad_inputs(tmp_path)
    done = _run_many({case: cmds[case] for case in ("unknown flag", "NaN in file")}, tmp_path)
    assert done["unknown flag"].returncode == 2  # usage error
    assert done["NaN in file"].returncode == 1  # run error
    for case, result in done.items():
        assert BAD_INPUT_MESSAGES[case] in _one_line_error(result)


def test_constant_column_maps_to_zero_and_runs(tmp_path, capsys):
    from fedproto.cli import main

    rows = [f"{i % 7} 5.0 {(i * 3) % 11}" for i in range(40)]  # the middle feature is constant
    (tmp_path / "const.txt").write_text("\n".join(rows) + "\n")
    out = tmp_path / "const.json"
    argv = ["run", "fastlloyd", "--data", str(tmp_path / "const.txt"), "--k", "2", "--variant", "lloyd",
            "--quiet", "--report", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    centroids = RunReport.from_json(out.read_text()).results["centroids"]
    # non-private Lloyd: a centroid with points is their mean, and every point is 0 in that feature
    assert len(centroids) == 2
    assert all(abs(row[1]) < 1e-3 for row in centroids)


@pytest.mark.mpi
def test_mpi_with_the_wrong_number_of_ranks_is_one_line(tmp_path):
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("mpiexec not found (pip install 'fedproto[mpi]')")
    cmd = [mpiexec, "-n", "2", *FEDPROTO, "run", "fastlloyd", *IRIS_2, "--transport", "mpi", "--quiet"]
    line = _one_line_error(_run(cmd, tmp_path))
    assert "mpiexec -n 3" in line, line


# --- a silent party ------------------------------------------------------------------------------------------


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _session(argv: list[str]) -> int:
    """The session id the CLI derives from these ``party`` arguments (what the roster must state)."""
    from fedproto import registry
    from fedproto.cli import build_parser
    from fedproto.data import load_dataset

    args = build_parser().parse_args(argv)
    return registry.load_protocol(args.protocol).plan(args, load_dataset(args.data)).session


def test_silent_client_over_tcp_fails_the_server_naming_it(tmp_path):
    roster = ["server", "client-0", "client-1"]
    roster_file = tmp_path / "roster.json"
    base = ["party", "fastlloyd", *IRIS_2, "--deadline", "2"]
    session = _session([*base, "--party", "server", "--roster", str(roster_file)])
    roster_file.write_text(json.dumps({
        "session": session,
        "secret": os.urandom(32).hex(),
        "parties": [{"name": p, "address": f"127.0.0.1:{port}"} for p, port in zip(roster, _free_ports(3))],
    }))
    started = time.monotonic()
    procs = {p: _start([*FEDPROTO, *base, "--party", p, "--roster", str(roster_file)], tmp_path)
             for p in ("server", "client-0")}  # client-1 never starts
    try:
        server = _finish(procs["server"], timeout=60)
        elapsed = time.monotonic() - started
        client = _finish(procs["client-0"], timeout=60)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                _kill(proc)
    line = _one_line_error(server)
    assert "client-1" in line, line
    assert elapsed < 40, f"the server took {elapsed:.1f} s to give up"
    _one_line_error(client)  # the waiting client gives up too, it does not hang

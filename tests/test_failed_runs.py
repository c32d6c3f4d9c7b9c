"""A run that fails or is interrupted still writes its report (issue 30).

The protocol is a file written into the test's directory: the toy federated sum of
:mod:`fedproto.testing.toy`, whose last worker can be told to answer round 1's query with a
``Query`` of its own (a message the coordinator's table does not expect) or not at all. Then:

* over memory, with both engines (in this process) and over MPI (``mpiexec``), the report
  validates against the schema with ``status: failed``, the coordinator as the reporting party,
  that worker as the culprit, round 0 metered as in the completed run, and fewer payload bytes
  than the completed run; the command exits 1 with its one error line, then says where the report
  went;
* a worker silent in round 1 makes the lean engine's report name it as the culprit of an
  ``InsufficientParticipants`` (the lean engine's deadlines are virtual: no waiting);
* SIGINT and SIGTERM to ``fedproto run`` (a subprocess, signalled once its coordinator has
  started round 1 of a run far too long to finish) write an ``interrupted`` report naming the
  signal and exit 130 and 143.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from fedproto.metering import RunReport, report_schema
from fedproto.testing import load_file

helpers = load_file(Path(__file__).with_name("_helpers.py"), "tests_helpers")
TIMEOUT_S = 120

#: The toy sum as a ``fedproto run`` protocol file. ``--bad-round R`` makes the last worker answer
#: round R's query with a Query (the coordinator fails with a RemoteProtocolError naming it);
#: ``--silent-round R`` makes it answer nothing (the coordinator fails at its deadline with
#: InsufficientParticipants); ``--announce`` has the coordinator print one line when round 1
#: starts, which the signal tests wait for (a test fixture: real machines do no I/O).
PROTOCOL = '''
from fedproto.testing.toy import Query, SumCoordinator, SumPlugin, SumWorker


class Misbehaving(SumWorker):
    def __init__(self, party, *, bad_round, silent_round, **kwargs):
        super().__init__(party, **kwargs)
        self.bad_round = bad_round
        self.silent_round = silent_round

    def _on_query(self, sender, message):
        if self.round_idx == self.silent_round:
            return []
        if self.round_idx == self.bad_round:
            out = self.send(self.coordinator, Query(), phase="answer")
            self.round_idx += 1
            return [out]
        return super()._on_query(sender, message)


class Announcing(SumCoordinator):
    def _advance(self):
        out = super()._advance()
        if self.round_idx == 1 and not getattr(self, "announced", False):
            self.announced = True
            print("round 1 started", flush=True)
        return out


class FailingToy(SumPlugin):
    name = "failing-toy"
    description = "the toy federated sum, with a worker that can break the protocol or fall silent"
    rounds = 5
    session = 31

    def add_options(self, group):
        group.add_argument("--bad-round", type=int, default=None)
        group.add_argument("--silent-round", type=int, default=None)
        group.add_argument("--announce", action="store_true")

    def coordinator(self, args, workers):
        cls = Announcing if args.announce else SumCoordinator
        return cls("coordinator", workers=workers, rounds=args.rounds, dim=3)

    def worker(self, args, workers, party):
        if party != workers[-1]:
            return super().worker(args, workers, party)
        return Misbehaving(party, bad_round=args.bad_round, silent_round=args.silent_round,
                           coordinator="coordinator", values=self.values(workers, party))


PROTOCOL = FailingToy()
'''

CULPRIT = "worker-1"


@pytest.fixture(scope="module")
def protocol_file(tmp_path_factory) -> Path:
    return helpers.module_file(tmp_path_factory, "protocol", "failing_toy.py", PROTOCOL)


def _validated(path: Path) -> RunReport:
    """The report at ``path``, after checking its JSON against the report schema."""
    doc = json.loads(path.read_text())
    jsonschema.validate(doc, report_schema())
    return RunReport.from_dict(doc)


def _run_in_process(argv: list[str], capsys) -> tuple[int, str, str]:
    from fedproto.cli import main

    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def completed(protocol_file, tmp_path_factory) -> RunReport:
    """The same run as the failing ones, with every worker behaving."""
    from fedproto.cli import main

    out = tmp_path_factory.mktemp("completed") / "run.json"
    saved = list(sys.path)
    try:
        assert main(["run", str(protocol_file), "--quiet", "--no-plot", "--report", str(out)]) == 0
    finally:
        sys.path[:] = saved  # loading a file puts its folder on the path
    report = _validated(out)
    assert report.status == "completed" and report.results == {"last_sum": 5 * 3.0}
    return report


def _check_failed(report: RunReport, completed: RunReport, *, error_type: str) -> None:
    assert report.status == "failed"
    assert report.error["type"] == error_type
    assert report.error["party"] == "coordinator"
    assert report.error["culprits"] == [CULPRIT]
    assert report.error["round_idx"] == 1 and report.error["signal"] is None
    assert report.results == {}
    # metered up to the failure: round 0 whole, nothing after round 1
    assert report.bytes_by_round()[0] == completed.bytes_by_round()[0] > 0
    assert max(link.round_idx for link in report.links) == 1
    assert 0 < report.payload_bytes < completed.payload_bytes
    assert report.options["bad_round"] == 1 or report.options["silent_round"] == 1
    assert report.command[:2] == ("fedproto", "run")
    assert report.started_at is not None and report.finished_at is not None


@pytest.mark.parametrize("engine", ["tasks", "lean"])
def test_a_run_that_breaks_the_protocol_in_memory_writes_a_failed_report(
    engine, protocol_file, completed, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = tmp_path / "failed.json"
    argv = ["run", str(protocol_file), "--engine", engine, "--bad-round", "1", "--quiet", "--report", str(out)]
    code, stdout, stderr = _run_in_process(argv, capsys)
    assert code == 1
    assert stderr.startswith("fedproto: error: unexpected Query from worker-1") and stderr.count("\n") == 1, stderr
    assert stdout.strip() == f"report written to {out}"
    assert not out.with_suffix(".png").exists()  # a failed run's report comes without a plot
    report = _validated(out)
    _check_failed(report, completed, error_type="RemoteProtocolError")
    assert report.transport == "memory"
    if engine == "tasks":  # the coordinator told the other worker before it gave up
        assert report.bytes_by_phase()["abort"] > 0
    else:  # every party is in the lean loop: nobody needs telling
        assert "abort" not in report.bytes_by_phase()


def test_a_silent_worker_is_the_culprit_of_the_lean_engines_failed_report(
    protocol_file, completed, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = tmp_path / "silent.json"
    argv = ["run", str(protocol_file), "--engine", "lean", "--silent-round", "1", "--quiet", "--report", str(out)]
    code, stdout, stderr = _run_in_process(argv, capsys)
    assert code == 1, stderr
    assert "silent: worker-1" in stderr
    _check_failed(_validated(out), completed, error_type="InsufficientParticipants")


def test_a_run_without_report_fails_as_before(protocol_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = _run_in_process(["run", str(protocol_file), "--bad-round", "1", "--quiet"], capsys)
    assert code == 1 and stdout == "" and stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


# --- processes -----------------------------------------------------------------------------------------


def _start(cmd: list[str], cwd: Path) -> subprocess.Popen:
    # A child inherits an ignored SIGINT (as a shell's background job has it, and then so has a
    # suite started with `&`) but not a Python handler: with one in place while it starts, the
    # child's SIGINT is the default, as in a terminal.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(
            cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
            start_new_session=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)


_kill = helpers.kill_group  # the process group (mpiexec's ranks, a run left running), whatever the outcome


def _mpiexec() -> str | None:
    # The registry's MPICH installs mpiexec next to the interpreter of the environment.
    search = [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    return shutil.which("mpiexec", path=os.pathsep.join(search))


@pytest.mark.mpi
def test_a_run_that_breaks_the_protocol_over_mpi_writes_a_failed_report(protocol_file, completed, tmp_path):
    mpiexec = _mpiexec()
    if importlib.util.find_spec("mpi4py") is None or mpiexec is None:
        pytest.skip("needs mpi4py and mpiexec (pip install 'fedproto[mpi]')")
    out = tmp_path / "mpi.json"
    cmd = [mpiexec, "-n", "3", sys.executable, "-m", "fedproto", "run", str(protocol_file), "--transport", "mpi",
           "--bad-round", "1", "--quiet", "--report", str(out)]
    proc = _start(cmd, tmp_path)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    finally:
        _kill(proc)
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr, stderr
    assert "fedproto: error: party coordinator failed: unexpected Query from worker-1" in stderr
    assert f"report written to {out}" in stdout + stderr  # mpiexec may join the two streams' lines
    report = _validated(out)
    _check_failed(report, completed, error_type="RemoteProtocolError")
    assert report.transport == "mpi"


@pytest.mark.parametrize(("signum", "code", "line"), [
    (signal.SIGINT, 130, "fedproto: interrupted"),
    (signal.SIGTERM, 128 + signal.SIGTERM, "fedproto: interrupted by SIGTERM"),
])
def test_a_signal_to_an_in_process_run_writes_an_interrupted_report(signum, code, line, protocol_file, tmp_path):
    out = tmp_path / "interrupted.json"
    cmd = [sys.executable, "-m", "fedproto", "run", str(protocol_file), "--rounds", str(10**9), "--announce",
           "--quiet", "--report", str(out)]
    proc = _start(cmd, tmp_path)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT_S)
        assert ready, "the run did not start round 1"
        assert proc.stdout.readline() == "round 1 started\n", proc.communicate()
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    finally:
        _kill(proc)
    assert proc.returncode == code, stderr
    assert stderr.strip() == line
    assert stdout.strip() == f"report written to {out}"
    report = _validated(out)
    assert report.status == "interrupted"
    assert report.error["signal"] == signal.Signals(signum).name
    assert report.error["type"] == "Interrupted" and report.error["party"] is None
    assert report.results == {}
    assert report.bytes_by_round()[0] > 0  # round 0 was metered before the signal came
    assert report.options["rounds"] == 10**9 and report.finished_at is not None


@pytest.mark.mpi
def test_a_signal_to_an_mpi_run_writes_an_interrupted_report_merged_from_every_rank(protocol_file, tmp_path):
    mpiexec = _mpiexec()
    if importlib.util.find_spec("mpi4py") is None or mpiexec is None:
        pytest.skip("needs mpi4py and mpiexec (pip install 'fedproto[mpi]')")
    out = tmp_path / "mpi-interrupted.json"
    cmd = [mpiexec, "-n", "3", sys.executable, "-m", "fedproto", "run", str(protocol_file), "--transport", "mpi",
           "--rounds", str(10**9), "--announce", "--quiet", "--report", str(out)]
    proc = _start(cmd, tmp_path)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT_S)
        assert ready, "the run did not start round 1"
        assert proc.stdout.readline() == "round 1 started\n", proc.communicate()
        proc.send_signal(signal.SIGTERM)  # mpiexec passes it on to every rank
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    finally:
        _kill(proc)
    assert proc.returncode != 0, stderr
    assert "Traceback" not in stderr, stderr
    assert "fedproto: interrupted by SIGTERM" in stderr
    assert f"report written to {out}" in stdout + stderr
    report = _validated(out)
    assert report.status == "interrupted" and report.transport == "mpi"
    assert report.error["signal"] == "SIGTERM" and report.error["type"] == "Interrupted"
    # every rank's share is there: the coordinator's queries and each worker's answers
    senders = {link.sender for link in report.links}
    assert senders == {"coordinator", "worker-0", "worker-1"}, senders

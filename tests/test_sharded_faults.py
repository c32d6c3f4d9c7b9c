"""Faults in a sharded lean run end every rank cleanly (issue 28, part 3).

The protocol is a file written into the test's directory: the toy federated sum of
:mod:`fedproto.testing.toy` with 4 workers, one of which (``--culprit``, on rank 1 of 3 under
the default placement) misbehaves in round 1 (``--fault``):

* ``break``: it sends a Query to ``--target`` instead of answering: the coordinator (rank 0) or
  worker-3 (rank 2) fails with a RemoteProtocolError naming it. Every rank ends with exit code 1
  within one ``--deadline`` of wall time; rank 0 prints one error line, the others nothing; the
  report is ``failed`` with the one-rank run's error record (the party that saw it, the culprit)
  and one ``ranks`` entry per rank;
* ``silent`` (it never answers: the coordinator's deadline names it) and ``stall`` (every machine
  shrugs off its deadlines: SimulationStalled) end every rank with the one-rank run's error;
* ``exit`` / ``kill`` (its rank calls ``os._exit(9)`` / gets SIGKILL): ``mpiexec`` ends the job
  with a non-zero exit code within a bounded time, and no process of the job is left.

The first three run as one 3-rank job of tests/fedproto/sharded_main.py (each rank records its
exit code, seconds and output per case); the rank deaths are ``mpiexec -n 3 fedproto run``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fedproto.shards import block_placement
from fedproto.testing import load_file

DRIVER = Path(__file__).parent / "fedproto" / "sharded_main.py"
driver = load_file(DRIVER, "sharded_main")  # its helpers: mpiexec(), run_mpiexec(), skip_without_mpi()
helpers = load_file(Path(__file__).with_name("_helpers.py"), "tests_helpers")

RANKS = 3
DEADLINE_S = 20.0
TIMEOUT_S = 180
ROSTER = ["coordinator", *(f"worker-{i}" for i in range(4))]
PLACEMENT = block_placement(ROSTER, RANKS)
CULPRIT = next(p for p in ROSTER[1:] if PLACEMENT[p] == 1)
PEER = next(p for p in ROSTER[1:] if PLACEMENT[p] == 2)

PROTOCOL = '''
import os
import signal

from fedproto.messages import PhaseTimedOut
from fedproto.testing.toy import Query, SumCoordinator, SumPlugin, SumWorker


class Faulty(SumWorker):
    """A worker that, in round ``fault_round``, does what ``fault`` says instead of answering."""

    def __init__(self, party, *, fault, fault_round, target, **kwargs):
        super().__init__(party, **kwargs)
        self.fault, self.fault_round, self.target = fault, fault_round, target

    def _on_query(self, sender, message):
        if self.round_idx != self.fault_round or self.fault is None:
            return super()._on_query(sender, message)
        if self.fault == "break":  # a Query to the target: not in its table (coordinator) or not from the coordinator (worker)
            out = self.send(self.target, Query(), phase="answer")
            self.round_idx += 1
            return [out]
        if self.fault == "exit":
            os._exit(9)
        if self.fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        return []  # "silent" and "stall": never answer


class Shrugging:
    """Mixed in first: a machine that ignores its deadlines (the run can only stall)."""

    def _on_event(self, event):
        if isinstance(event, PhaseTimedOut):
            return []
        return super()._on_event(event)


class ShruggingCoordinator(Shrugging, SumCoordinator):
    pass


class ShruggingWorker(Shrugging, SumWorker):
    pass


class ShruggingFaulty(Shrugging, Faulty):
    pass


class FaultyToy(SumPlugin):
    name = "faulty-toy"
    description = "the toy federated sum with one worker that breaks the protocol, dies or falls silent"
    rounds = 4
    session = 28

    def add_options(self, group):
        group.add_argument("--fault", choices=["break", "build", "exit", "kill", "silent", "stall"], default=None)
        group.add_argument("--fault-round", type=int, default=1)
        group.add_argument("--culprit", default=None)
        group.add_argument("--target", default="coordinator")

    def make_machine(self, args, workers, party):
        culprit = args.culprit or workers[-1]
        stall = args.fault == "stall"
        if party == "coordinator":
            return (ShruggingCoordinator if stall else SumCoordinator)(party, workers=workers, rounds=args.rounds, dim=3)
        values = self.values(workers, party)
        if party == culprit and args.fault == "build":
            raise ValueError(f"{party} cannot be built")
        if party == culprit:
            return (ShruggingFaulty if stall else Faulty)(
                party, fault=args.fault, fault_round=args.fault_round, target=args.target,
                coordinator="coordinator", values=values)
        return (ShruggingWorker if stall else SumWorker)(party, coordinator="coordinator", values=values)


PROTOCOL = FaultyToy()
'''

COMMON = ["--clients", "4", "--culprit", CULPRIT, "--deadline", str(DEADLINE_S)]
#: case -> its options: the faults that the ranks survive to report
CASES: dict[str, list[str]] = {
    "break-at-coordinator": ["--fault", "break"],
    "break-at-peer": ["--fault", "break", "--target", PEER],
    "silent": ["--fault", "silent"],
    "stall": ["--fault", "stall"],
}
ERROR_TYPES = {"break-at-coordinator": "RemoteProtocolError", "break-at-peer": "RemoteProtocolError",
               "silent": "InsufficientParticipants", "stall": "SimulationStalled"}


@pytest.fixture(scope="module")
def protocol_file(tmp_path_factory) -> Path:
    return helpers.module_file(tmp_path_factory, "protocol", "faulty_toy.py", PROTOCOL)


@pytest.fixture(scope="module")
def one_rank(protocol_file, tmp_path_factory) -> dict[str, tuple[int, dict]]:
    """case -> (exit code, report) of the lean engine in this process."""
    from fedproto.cli import main

    folder = tmp_path_factory.mktemp("one-rank")
    saved = list(sys.path)
    runs = {}
    try:
        for case, options in CASES.items():
            path = folder / f"{case}.json"
            code = main(["run", str(protocol_file), *COMMON, *options, "--engine", "lean", "--quiet", "--no-plot",
                         "--report", str(path)])
            runs[case] = code, json.loads(path.read_text())
    finally:
        sys.path[:] = saved  # loading a file puts its folder on the path
    return runs


@pytest.fixture(scope="module")
def three_ranks(protocol_file, tmp_path_factory) -> dict[str, dict[str, Any]]:
    """case -> {"report": ..., "ranks": [per-rank record]} of one 3-rank job running every case."""
    driver.skip_without_mpi()
    folder = tmp_path_factory.mktemp("three-ranks")
    cases = {case: [str(protocol_file), *COMMON, *options] for case, options in CASES.items()}
    (folder / "cases.json").write_text(json.dumps(cases))
    result = driver.run_mpiexec(
        [driver.mpiexec(), "-n", str(RANKS), sys.executable, str(DRIVER), str(folder / "cases.json"), str(folder)],
        TIMEOUT_S,
    )
    assert result.returncode == 1, f"exit code {result.returncode}\n{result.stdout}\n{result.stderr}"
    return {
        case: {
            "report": json.loads((folder / f"{case}.json").read_text()),
            "ranks": [json.loads((folder / f"{case}.rank{r}.json").read_text()) for r in range(RANKS)],
        }
        for case in cases
    }


def test_the_culprit_is_on_rank_1_and_the_peer_on_rank_2():
    assert (PLACEMENT[CULPRIT], PLACEMENT[PEER], PLACEMENT["coordinator"]) == (1, 2, 0)


@pytest.mark.mpi
@pytest.mark.parametrize("case", list(CASES))
def test_a_fault_ends_every_rank_with_the_one_rank_runs_error(case, three_ranks, one_rank):
    code, alone = one_rank[case]
    run = three_ranks[case]
    report, ranks = run["report"], run["ranks"]
    assert code == 1 and alone["status"] == "failed" and alone["error"]["type"] == ERROR_TYPES[case]
    # every rank ends with exit code 1, in under one deadline of wall time
    assert [r["code"] for r in ranks] == [1] * RANKS
    assert all(r["took_s"] < DEADLINE_S for r in ranks), [r["took_s"] for r in ranks]
    # rank 0 prints one error line (and where the report went); the others print nothing
    lines = [line for line in ranks[0]["stderr"].splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fedproto: error: "), ranks[0]["stderr"]
    assert "Traceback" not in ranks[0]["stderr"] + ranks[0]["stdout"]
    assert all(r["stdout"] == r["stderr"] == "" for r in ranks[1:]), ranks[1:]
    # the report: failed, the one-rank run's error record, every rank's entry and the metered links
    assert report["status"] == "failed" and report["results"] == {}
    assert report["error"] == alone["error"]
    assert [r["rank"] for r in report["ranks"]] == list(range(RANKS))
    assert [r["parties"] for r in report["ranks"]] == [2, 1, 2]
    assert report["links"] and report["payload_bytes"] > 0
    if case.startswith("break"):
        assert report["error"]["culprits"] == [CULPRIT] and CULPRIT in lines[0]
        assert report["error"]["party"] == ("coordinator" if case == "break-at-coordinator" else PEER)
    if case == "silent":
        assert report["error"]["culprits"] == [CULPRIT] and f"silent: {CULPRIT}" in lines[0]
    if case == "stall":
        assert report["error"]["message"].startswith("5 machines wait with nothing in flight after 3 deadlines")
        assert alone["error"]["message"] in lines[0]


@pytest.mark.mpi
@pytest.mark.parametrize("fault", ["exit", "kill"])
def test_a_rank_that_dies_ends_the_job(fault, protocol_file, tmp_path):
    """mpiexec ends the job: a non-zero exit code, soon, no process of the job left (run_mpiexec
    checks the job's process group once mpiexec is gone), no traceback. What MPICH's hydra prints
    is its own: nothing for an exit code, its "BAD TERMINATION" banner for a signal."""
    driver.skip_without_mpi()
    command = [driver.mpiexec(), "-n", str(RANKS), sys.executable, "-m", "fedproto", "run", str(protocol_file),
               *COMMON, "--fault", fault, "--engine", "lean", "--quiet", "--no-plot", "--report", str(tmp_path / "r.json")]
    began = time.monotonic()
    result = driver.run_mpiexec(command, TIMEOUT_S)
    took_s = time.monotonic() - began
    assert result.returncode != 0, result
    assert took_s < 60, took_s
    assert "Traceback" not in result.stdout + result.stderr, result
    if fault == "kill":
        assert "BAD TERMINATION" in result.stdout + result.stderr
    assert not (tmp_path / "r.json").exists()  # the job ended before anything was gathered


@pytest.mark.mpi
def test_a_rank_that_fails_before_the_run_ends_the_job_in_one_line(protocol_file, tmp_path):
    """The culprit's machine cannot be built on rank 1, before the ranks first meet: that rank says
    so in one line naming it and aborts the job (MPI_Abort: MPICH adds its own line); no rank is
    left waiting for it."""
    driver.skip_without_mpi()
    command = [driver.mpiexec(), "-n", str(RANKS), sys.executable, "-m", "fedproto", "run", str(protocol_file),
               *COMMON, "--fault", "build", "--engine", "lean", "--quiet", "--no-plot"]
    began = time.monotonic()
    result = driver.run_mpiexec(command, TIMEOUT_S)
    assert result.returncode != 0, result  # hydra's code: the aborting rank's, or the signal that ended the others
    assert time.monotonic() - began < 60
    ours = [line for line in result.stderr.splitlines() if line.startswith("fedproto: error")]
    assert ours == [f"fedproto: error: rank 1: {CULPRIT} cannot be built"], result.stderr
    assert "Traceback" not in result.stdout + result.stderr, result

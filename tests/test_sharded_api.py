"""The sharded lean engine's Python API and its command-line usage errors (issue 28).

* :func:`fedproto.shards.block_placement`: the coordinator on rank 0, the clients in contiguous
  blocks whose sizes differ by at most one, rank 0's never the larger;
* :class:`fedproto.shards.Shards` (this process is a 1-rank ``COMM_WORLD``) refuses a placement
  that misses a party, names a stranger or a rank out of range, and ``check_machines`` refuses
  machines that are not this rank's; ``simulate(..., shards=Shards(roster))`` is ``simulate``
  (results, per-link counts) and sets one ``meter.ranks`` entry; under ``mpiexec -n 2`` ranks
  given different rosters fail with a ValueError naming the rank;
* ``fedproto run``: ``--placement`` outside mpiexec, ``--network`` in a sharded run and a
  missing placement file are one usage-error line (exit 2). The check reads the launcher's
  environment before MPI starts, so ``PMI_SIZE=2`` fakes a 2-rank job.
"""

from __future__ import annotations

import collections
import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from fedproto.metering import Meter
from fedproto.shards import block_placement
from fedproto.simulation import simulate
from fedproto.testing.toy import SumCoordinator, SumWorker

DRIVER = Path(__file__).parent / "fedproto" / "sharded_main.py"
_spec = importlib.util.spec_from_file_location("sharded_main", DRIVER)
driver = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(driver)  # its helpers: mpiexec(), run_mpiexec(), skip_without_mpi()

ROSTER = ("coordinator", *(f"worker-{i}" for i in range(5)))


@pytest.fixture
def Shards():
    """fedproto.shards.Shards, where this process can load an MPI library."""
    try:
        from mpi4py import MPI  # noqa: F401
    except (ImportError, RuntimeError) as exc:  # mpi4py absent, or its libmpi not found
        pytest.skip(f"needs mpi4py and its MPI library: {exc}")
    from fedproto.shards import Shards

    return Shards


# --- block_placement ------------------------------------------------------------------------------


@pytest.mark.parametrize("clients", [1, 2, 3, 5, 6, 7, 16, 33])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 16])
def test_block_placement_is_contiguous_balanced_and_spares_rank_0(clients, size):
    roster = ["server", *(f"client-{j}" for j in range(clients))]
    placement = block_placement(roster, size)
    assert list(placement) == roster and placement["server"] == 0
    ranks = [placement[p] for p in roster[1:]]
    assert ranks == sorted(ranks) and all(0 <= r < size for r in ranks)  # contiguous blocks, in order
    counts = collections.Counter(ranks)
    sizes = [counts.get(r, 0) for r in range(size)]
    assert max(sizes) - min(sizes) <= 1
    assert sizes[0] == min(sizes) == clients // size  # rank 0, which holds the coordinator, never more


def test_block_placement_refuses_no_rank_and_no_party():
    with pytest.raises(ValueError, match="at least one rank, got 0"):
        block_placement(ROSTER, 0)
    with pytest.raises(ValueError, match="at least one party"):
        block_placement([], 2)


# --- Shards in one process ------------------------------------------------------------------------


def test_one_process_is_one_rank_holding_every_party(Shards):
    shards = Shards(ROSTER)
    assert (shards.rank, shards.size, shards.local) == (0, 1, ROSTER)
    assert shards.parties_of(0) == ROSTER and shards.rank_of("worker-4") == 0 and "worker-4" in shards


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"worker-2": None}, "the placement gives no rank to 'worker-2'"),
        ({"stranger": 0}, "the placement names 'stranger', which is not in the roster"),
        ({"worker-1": 1}, "the placement puts 'worker-1' on rank 1; the ranks are 0 to 0"),
        ({"worker-1": -1}, "the placement puts 'worker-1' on rank -1"),
        ({"worker-1": True}, "the placement puts 'worker-1' on rank True"),
    ],
)
def test_shards_refuse_a_placement_that_does_not_fit(change, message, Shards):
    placement = {p: 0 for p in ROSTER}
    for party, rank in change.items():
        if rank is None:
            del placement[party]
        else:
            placement[party] = rank
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Shards(ROSTER, placement=placement)


def test_shards_refuse_a_roster_that_names_a_party_twice(Shards):
    with pytest.raises(ValueError, match="names a party twice"):
        Shards([*ROSTER, "worker-0"])


def _machines(parties=ROSTER) -> dict:
    workers = ROSTER[1:]
    return {
        p: SumCoordinator(p, workers=workers, rounds=3, dim=2) if p == "coordinator"
        else SumWorker(p, coordinator="coordinator", values=np.full(2, workers.index(p) + 1.0))
        for p in parties
    }


def test_check_machines_refuses_machines_that_are_not_this_ranks(Shards):
    shards = Shards(ROSTER)
    shards.check_machines(_machines())
    with pytest.raises(ValueError, match="rank 0 must drive exactly its 6 parties: no machine for 'worker-4'"):
        shards.check_machines(_machines(ROSTER[:-1]))
    extra = {**_machines(), "worker-9": SumWorker("worker-9", coordinator="coordinator", values=np.ones(2))}
    with pytest.raises(ValueError, match="'worker-9' is placed on rank \\?"):
        shards.check_machines(extra)
    with pytest.raises(ValueError, match="must drive exactly"):  # simulate checks before it starts
        simulate(_machines(ROSTER[:-1]), shards=shards)


def test_simulate_with_one_rank_of_shards_is_simulate(Shards):
    plain_meter, sharded_meter = Meter(), Meter()
    plain = simulate(_machines(), meter=plain_meter)
    sharded = simulate(_machines(), meter=sharded_meter, shards=Shards(ROSTER))
    assert plain.keys() == sharded.keys() and plain_meter.sent and plain_meter.ranks == []
    for party in ROSTER:
        np.testing.assert_array_equal(np.asarray(plain[party]), np.asarray(sharded[party]))
    assert dict(plain_meter.sent) == dict(sharded_meter.sent)
    [rank] = sharded_meter.ranks
    assert rank["rank"] == 0 and rank["parties"] == len(ROSTER) and rank["peak_rss_mib"] > 0


def test_simulate_refuses_shards_with_a_link_model(Shards):
    from fedproto.netmodel import LinkModel

    with pytest.raises(ValueError, match="a sharded simulation takes no network"):
        simulate(_machines(), shards=Shards(ROSTER), network=LinkModel.preset("lan"))


def test_a_sharded_simulation_refuses_a_machine_of_another_session_naming_it(Shards):
    from fedproto.errors import SessionMismatch
    from fedproto.runtime import RuntimeConfig

    machines = _machines()
    for party, machine in machines.items():
        machine.session = 8 if party == "worker-3" else 7  # as a protocol's machine declares it
    meter = Meter()
    with pytest.raises(SessionMismatch, match=r"^worker-3's machine is session 8, but the run is session 7"):
        simulate(machines, meter=meter, shards=Shards(ROSTER), config=RuntimeConfig(session=7))
    assert not meter.sent


# --- Shards under mpiexec -------------------------------------------------------------------------

MISMATCH = """
import sys
from mpi4py import MPI
from fedproto.shards import Shards

rank = MPI.COMM_WORLD.Get_rank()
roster = ["coordinator", "worker-0", "worker-1"] + (["worker-2"] if rank == 1 else [])
try:
    Shards(roster)
except ValueError as exc:
    print(f"rank {rank}: ValueError: {exc}", flush=True)
else:
    print(f"rank {rank}: accepted", flush=True)
"""


@pytest.mark.mpi
def test_ranks_given_different_rosters_fail_naming_the_rank(tmp_path):
    driver.skip_without_mpi()
    script = tmp_path / "mismatch.py"
    script.write_text(MISMATCH)
    result = driver.run_mpiexec([driver.mpiexec(), "-n", "2", sys.executable, str(script)], 120)
    assert result.returncode == 0, result
    # the two ranks share one stdout, so their lines may come out joined: find each one's
    said = re.findall(r"rank (\d): (ValueError: rank 1 was given another roster or placement than rank 0|accepted)",
                      result.stdout)
    assert sorted(said) == [("0", said[0][1]), ("1", said[0][1])] and said[0][1].startswith("ValueError"), result.stdout


SESSIONS = """
import sys
import numpy as np
from mpi4py import MPI
from fedproto.errors import SessionMismatch
from fedproto.runtime import RuntimeConfig
from fedproto.shards import ShardFailed, Shards
from fedproto.simulation import simulate
from fedproto.testing.toy import SumCoordinator, SumWorker

roster = ["coordinator", "worker-0", "worker-1", "worker-2"]
shards = Shards(roster)
machines = {}
for p in shards.local:
    machines[p] = (SumCoordinator(p, workers=roster[1:], rounds=2, dim=2) if p == "coordinator"
                   else SumWorker(p, coordinator="coordinator", values=np.ones(2)))
    machines[p].session = 8 if p == "worker-2" else 7
try:
    simulate(machines, shards=shards, config=RuntimeConfig(session=7))
except SessionMismatch as exc:
    print(f"rank {shards.rank}: SessionMismatch: {exc}", flush=True)
except ShardFailed as exc:
    print(f"rank {shards.rank}: ShardFailed: {exc}", flush=True)
else:
    print(f"rank {shards.rank}: completed", flush=True)
"""


@pytest.mark.mpi
def test_a_rank_holding_a_machine_of_another_session_fails_every_rank_naming_it(tmp_path):
    driver.skip_without_mpi()
    script = tmp_path / "sessions.py"
    script.write_text(SESSIONS)
    result = driver.run_mpiexec([driver.mpiexec(), "-n", "2", sys.executable, str(script)], 120)
    assert result.returncode == 0, result
    # worker-2 is on rank 1 (block placement): it names the party, rank 0 hears of it at once
    assert re.search(r"rank 1: SessionMismatch: worker-2's machine is session 8, but the run is session 7",
                     result.stdout), result.stdout
    assert re.search(r"rank 0: ShardFailed: .*worker-2's machine is session 8", result.stdout), result.stdout


# --- the command line -----------------------------------------------------------------------------


def _usage_error(argv: list[str], capsys) -> str:
    from fedproto.cli import main

    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    return lines[0]


@pytest.fixture
def launcher_env(monkeypatch):
    """``ranks(n)``: the environment as ``mpiexec -n n`` sets it (MPICH's PMI_SIZE), nothing else."""
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(name, raising=False)

    def ranks(n: int) -> None:
        monkeypatch.setenv("PMI_SIZE", str(n))

    return ranks


BASE = ["run", "fastlloyd", "--data", "iris", "--clients", "3", "--engine", "lean"]


def test_placement_without_mpiexec_is_a_usage_error(launcher_env, capsys):
    line = _usage_error([*BASE, "--placement", "coordinator-alone"], capsys)
    assert "argument --placement: applies to --engine lean under mpiexec -n R with R > 1" in line
    launcher_env(1)  # mpiexec -n 1 is one process too
    assert "argument --placement: applies to" in _usage_error([*BASE, "--placement", "blocks"], capsys)
    launcher_env(2)  # the tasks engine is never sharded
    line = _usage_error([*BASE[:-2], "--engine", "tasks", "--placement", "blocks"], capsys)
    assert "argument --placement: applies to" in line


def test_a_link_model_in_a_sharded_run_is_a_usage_error(launcher_env, capsys):
    launcher_env(2)
    line = _usage_error([*BASE, "--network", "wan"], capsys)
    assert "argument --network: the link model runs in one process, not over MPI ranks" in line


def test_a_missing_placement_file_is_a_usage_error(launcher_env, capsys, tmp_path):
    launcher_env(2)
    missing = tmp_path / "nowhere.json"
    line = _usage_error([*BASE, "--placement", str(missing)], capsys)
    assert f"argument --placement: no placement file {missing}" in line

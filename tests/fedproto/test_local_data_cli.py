"""The core of "each party holds only its own data": ``fedproto split``, ``fedproto party --data
FILE`` and the TCP launcher giving each party process only its own part, with a toy plugin (the
protocol families test their own plugins in ``tests/algorithms/*/test_local_data.py``)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedproto.data import load_dataset, partition
from fedproto.report import RunReport
from fedproto.testing import load_file

helpers = load_file(Path(__file__).resolve().parents[1] / "_helpers.py", "tests_helpers")
FEDPROTO = [sys.executable, "-m", "fedproto"]

#: Each worker holds its own points and answers with their column sums; the coordinator holds no
#: data. The last round's sum is rounds x the pooled data's column sums, whoever holds which rows.
TOY_LOCAL = '''
import numpy as np

from fedproto.data import Dataset, partition
from fedproto.plugin import RunPlan
from fedproto.testing.toy import SumCoordinator, SumWorker


class ToyLocal:
    name = "toylocal"
    description = "federated column sums of each worker's own points"

    def add_arguments(self, parser):
        group = parser.add_argument_group("toylocal")
        group.add_argument("--rounds", type=int, default=2, help="rounds")
        group.add_argument("--dim", type=int, default=None, help="features (spelt out for the parties)")

    def split(self, args, dataset):
        parts = partition(dataset.n, args.clients, scheme=args.partition, seed=args.seed, labels=dataset.y)
        return {
            f"worker-{i}": Dataset(dataset.name, dataset.x[idx], None if dataset.y is None else dataset.y[idx],
                                   dataset.paper_k)
            for i, idx in enumerate(parts)
        }

    def resolved_options(self, args, dataset):
        return ["--dim", str(dataset.d)]

    def _plan(self, args, roster, session, data_of, dim):
        workers = roster[1:]

        def make_machine(party):
            if party == "coordinator":
                return SumCoordinator(party, workers=workers, rounds=args.rounds, dim=dim)
            x = data_of(party).x
            if x.shape[1] != dim:
                raise ValueError(f"{party}'s data has {x.shape[1]} features, the run has {dim}")
            return SumWorker(party, coordinator="coordinator", values=x.sum(axis=0))

        def result_to_json(party, result):
            return {"sums": np.asarray(result).tolist()} if party == "coordinator" else {"rounds": int(result)}

        return RunPlan(
            roster=tuple(roster), session=session, make_machine=make_machine, result_to_json=result_to_json,
            summarize=lambda results: {"final_sum": results["coordinator"]["sums"][-1]},
            role_of=lambda p: p.split("-")[0], iterations=args.rounds,
        )

    def plan(self, args, dataset):
        parts = self.split(args, dataset)
        roster = ("coordinator", *parts)
        return self._plan(args, roster, 777 + args.seed, parts.__getitem__, dataset.d)

    def plan_party(self, args, party, roster, session, data):
        if party != "coordinator" and data is None:
            raise ValueError(f"{party} holds data: give it --data FILE")
        if args.dim is None:
            raise ValueError("--dim is required when a party holds only its own data")
        return self._plan(args, roster, session, lambda p: data, args.dim)


PROTOCOL = ToyLocal()
'''


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    return helpers.module_file(tmp_path_factory, "plugin", "toy_local.py", TOY_LOCAL)


def _run(argv, cwd, timeout=120):
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_split_writes_the_runs_split_one_file_per_party(tmp_path, toy):
    out = tmp_path / "parts"
    done = _run([*FEDPROTO, "split", str(toy), "--data", "iris", "--clients", "3", "--seed", "4", "--out", str(out)],
                tmp_path)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "split.json").read_text())
    assert manifest["resolved_options"] == ["--dim", "4"]
    assert manifest["data_set"] == "iris" and manifest["parties"] == ["coordinator", "worker-0", "worker-1", "worker-2"]
    assert [f["party"] for f in manifest["files"]] == ["worker-0", "worker-1", "worker-2"]
    assert sorted(p.name for p in out.iterdir()) == ["split.json", "worker-0.npz", "worker-1.npz", "worker-2.npz"]
    whole = load_dataset("iris")
    parts = partition(whole.n, 3, seed=4)
    for i, idx in enumerate(parts):
        mine = load_dataset(str(out / f"worker-{i}.npz"))
        assert (mine.name, mine.paper_k) == ("iris", 3)  # the file remembers its data set
        np.testing.assert_array_equal(mine.x, whole.x[idx])
        np.testing.assert_array_equal(mine.y, whole.y[idx])
        assert manifest["files"][i]["n_points"] == len(idx)
    assert "coordinator holds no data (start it without --data)" in done.stdout


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--out", "{existing}"], "not an empty directory"),
        (["--out", "{tmp}/no/such/dir"], "does not exist"),
    ],
)
def test_split_checks_its_output_before_any_work(tmp_path, toy, argv, message):
    existing = tmp_path / "full"
    existing.mkdir()
    (existing / "keep.txt").write_text("x")
    argv = [a.format(existing=existing, tmp=tmp_path) for a in argv]
    done = _run([*FEDPROTO, "split", str(toy), "--data", "iris", *argv], tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert (existing / "keep.txt").read_text() == "x"  # nothing lost


def test_split_of_a_protocol_without_per_party_data_is_refused(tmp_path):
    (tmp_path / "plain.py").write_text(
        "class P:\n    name = 'plain'\n    description = 'no split'\n    def plan(self, args, dataset):\n"
        "        raise AssertionError\nPROTOCOL = P()\n"
    )
    done = _run([*FEDPROTO, "split", str(tmp_path / "plain.py"), "--data", "iris", "--out", str(tmp_path / "o")],
                tmp_path)
    assert done.returncode == 2 and "per-party files" in done.stderr
    assert not (tmp_path / "o").exists()


def _expected_sum(rounds: int) -> list[float]:
    return (rounds * load_dataset("iris").x.sum(axis=0)).tolist()


def test_provisioned_parties_each_on_their_own_file_over_tls(tmp_path, toy):
    parts = tmp_path / "parts"
    assert _run([*FEDPROTO, "split", str(toy), "--data", "iris", "--clients", "2", "--out", str(parts)],
                tmp_path).returncode == 0
    kits = tmp_path / "kits"
    port = _free_port()
    done = _run([*FEDPROTO, "provision", "--parties", "coordinator,worker-0,worker-1", "--hub",
                 f"127.0.0.1:{port}", "--out", str(kits)], tmp_path)
    assert done.returncode == 0, done.stderr
    procs = {}
    try:
        for party in ("coordinator", "worker-0", "worker-1"):
            data = [] if party == "coordinator" else ["--data", str(parts / f"{party}.npz")]
            procs[party] = subprocess.Popen(
                [*FEDPROTO, "party", str(toy), "--party", party, "--roster", str(kits / party / "roster.json"),
                 "--rounds", "3", "--dim", "4", *data, "--party-report", str(tmp_path / f"{party}.json"),
                 "--deadline", "30"],
                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
        for party, proc in procs.items():
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"{party}: {err}"
    finally:
        helpers.kill_all(procs.values())
    doc = json.loads((tmp_path / "coordinator.json").read_text())
    np.testing.assert_allclose(doc["result"]["sums"][-1], _expected_sum(3), rtol=1e-12)


def test_a_party_whose_data_does_not_fit_fails_with_one_line(tmp_path, toy):
    parts = tmp_path / "parts"
    assert _run([*FEDPROTO, "split", str(toy), "--data", "iris", "--clients", "2", "--out", str(parts)],
                tmp_path).returncode == 0
    kits = tmp_path / "kits"
    assert _run([*FEDPROTO, "provision", "--parties", "coordinator,worker-0,worker-1", "--hub",
                 f"127.0.0.1:{_free_port()}", "--out", str(kits)], tmp_path).returncode == 0
    done = _run([*FEDPROTO, "party", str(toy), "--party", "worker-0", "--roster", str(kits / "worker-0" / "roster.json"),
                 "--dim", "5", "--data", str(parts / "worker-0.npz")], tmp_path)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "worker-0's data has 4 features, the run has 5" in lines[0], done.stderr
    done = _run([*FEDPROTO, "party", str(toy), "--party", "worker-9", "--roster", str(kits / "worker-0" / "roster.json"),
                 "--dim", "4"], tmp_path)
    assert done.returncode == 1 and "is the kit of worker-0" in done.stderr  # refused before any work


def test_the_tcp_launcher_gives_each_party_only_its_own_part(tmp_path, toy):
    report = tmp_path / "tcp.json"
    done = _run([*FEDPROTO, "run", str(toy), "--data", "iris", "--clients", "2", "--rounds", "2", "--transport", "tcp",
                 "--report", str(report), "--no-plot", "--quiet"], tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr
    tcp = RunReport.from_json(report.read_text())
    memory_path = tmp_path / "memory.json"
    done = _run([*FEDPROTO, "run", str(toy), "--data", "iris", "--clients", "2", "--rounds", "2",
                 "--report", str(memory_path), "--no-plot", "--quiet"], tmp_path)
    assert done.returncode == 0, done.stderr
    memory = RunReport.from_json(memory_path.read_text())
    np.testing.assert_allclose(tcp.results["final_sum"], _expected_sum(2), rtol=1e-12)
    assert tcp.results == memory.results
    assert tcp.payload_bytes == memory.payload_bytes


def test_run_per_party_checks_a_plugin_in_process(tmp_path, toy, monkeypatch):
    from fedproto.testing import run_per_party

    monkeypatch.setattr(sys, "path", list(sys.path))  # loading a file puts its folder on the path
    run = run_per_party(str(toy), ["--data", "iris", "--clients", "3", "--rounds", "2"], tmp_path)
    assert run.roster == ("coordinator", "worker-0", "worker-1", "worker-2")
    assert sorted(run.files) == ["worker-0", "worker-1", "worker-2"]
    assert run.per_party_results == run.simulation_results
    np.testing.assert_allclose(run.simulation_results["coordinator"]["sums"][-1], _expected_sum(2), rtol=1e-12)
    assert run.per_party_links == run.simulation_links and run.simulation_links
    assert run.per_party_report.payload_bytes == run.simulation_report.payload_bytes


def test_run_per_party_finds_a_party_that_does_not_hold_to_the_contract(tmp_path, toy, monkeypatch):
    """A plugin whose parties compute from something else than their own part is caught."""
    from fedproto.testing import run_per_party

    broken = tmp_path / "broken_local.py"
    broken.write_text(
        toy.read_text().replace("values=x.sum(axis=0)", "values=x.sum(axis=0) + (0 if data_of is not None and "
                                "getattr(data_of, '__self__', None) is not None else 1)")
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    run = run_per_party(str(broken), ["--data", "iris", "--clients", "2"], tmp_path)
    assert run.per_party_results != run.simulation_results

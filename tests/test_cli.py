"""The ``fedproto`` command line end to end.

Runs that cross process boundaries (the reference runs, TCP, MPI, a silent party, the exit codes
a user sees) start ``python -m fedproto`` as a user does; cheap checks (variants, bad input) call
the same ``fedproto.cli.main`` in this process so JAX starts once for them.

* ``run fastlloyd`` over memory prints NICV, the privacy spent and the bytes, writes a JSON report
  that :meth:`RunReport.from_json` reads back, and a plot;
* the same seed gives the same centroids and the same per-link payload bytes over memory, TCP
  (every party its own process) and MPI (``mpiexec``);
* every variant runs;
* bad input gives one line on stderr, no traceback and a non-zero exit; a usage error (an unknown
  protocol, option or command, with "did you mean"; a bad option value; a report or plot path
  that cannot be written) exits 2 before any protocol work; ``--version``; the MPI install hint;
* a party that never starts makes the server fail within a bounded time, naming it;
* a protocol from a plain file (or ``module:ATTR``), without data, runs over memory and TCP, its
  report holding the options, the command, the timestamps and the paper's figures apart;
* the CLI works from a directory holding its own ``algorithms``/``transports`` packages;
* plugins load lazily, a broken one is listed as such; progress goes through
  :mod:`fedproto.progress`; SIGTERM to a TCP run stops every party and removes its files.

Every subprocess runs in its own process group with a timeout; the group is killed in ``finally``.
"""

from __future__ import annotations

import datetime
import math
import os
import re
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
from fedproto.testing import load_file

helpers = load_file(Path(__file__).with_name("_helpers.py"), "tests_helpers")
_alive, _children, _process_tree = helpers.alive, helpers.leaf_processes, helpers.process_tree
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


_kill = helpers.kill_group


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


def _shadowing_directory(path: Path) -> Path:
    """A working directory holding its own ``algorithms`` and ``transports`` packages, as a user's
    project might (``python -m`` puts the working directory first on ``sys.path``)."""
    (path / "algorithms").mkdir(parents=True, exist_ok=True)
    (path / "algorithms" / "__init__.py").write_text("")
    (path / "algorithms" / "kmeans.py").write_text("def lloyd():\n    return 'the user\'s own k-means'\n")
    (path / "transports").mkdir(exist_ok=True)
    (path / "transports" / "__init__.py").write_text("raise ImportError('the user\'s own transports package')\n")
    return path


def _links(report: RunReport) -> dict[tuple, tuple[int, int]]:
    return {
        (link.round_idx, link.phase, link.sender, link.receiver, link.tag): (link.messages, link.payload_bytes)
        for link in report.links
    }


# --- runs over memory ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def memory_runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """``run fastlloyd`` on iris (2 clients, the cross-transport reference) and wine (4), with reports,
    from a working directory with its own ``algorithms`` and ``transports`` packages."""
    tmp = _shadowing_directory(tmp_path_factory.mktemp("memory"))
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
    for words in ("NICV, normalised intra-cluster variance (fastlloyd)", "epsilon spent", "payload bytes",
                  "report written to", "plot written to"):
        assert words in done.stdout, done.stdout
    report = RunReport.from_json(path.read_text())
    assert report.protocol == "fastlloyd" and report.transport == "memory"
    assert report.parties == ("server", *(f"client-{i}" for i in range(clients)))
    results = report.results
    assert (results["n_points"], results["d"], results["k"], results["n_clients"]) == (n, d, k, clients)
    assert len(results["centroids"]) == k and all(len(row) == d for row in results["centroids"])
    assert results["clients_agree"] is True
    assert math.isfinite(results["nicv"]) and results["nicv"] > 0
    assert results["epsilon_spent"] <= results["epsilon"] * (1 + 1e-9)
    # bytes: totals agree with the links; every iteration carries M uploads and M downloads
    assert report.payload_bytes == sum(link.payload_bytes for link in report.links) > 0
    assert report.algorithm_rounds == results["iterations"]
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
    cwd = _shadowing_directory(tmp_path)  # the parties start there too
    _ok(_run([*FEDPROTO, "run", "fastlloyd", *IRIS_2, "--transport", "tcp", "--no-plot", "--report", str(out)], cwd))
    report = RunReport.from_json(out.read_text())
    assert report.transport == "tcp"
    assert report.results["centroids"] == reference.results["centroids"]
    assert _links(report) == _links(reference)
    assert report.payload_bytes == reference.payload_bytes
    assert report.framing_overhead_bytes == 4 * report.messages  # one length prefix per frame
    # mutual TLS by default: every frame here (with its prefix) fits one TLS 1.3 record, which
    # adds a 5-byte header, a 1-byte content type and a 16-byte AEAD tag (RFC 8446 section 5.2)
    assert report.tls_overhead_bytes == 22 * report.messages
    assert report.handshake_bytes > 0


@pytest.mark.mpi
def test_same_seed_same_centroids_and_bytes_over_mpi(tmp_path, memory_runs):
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("mpiexec not found (pip install 'fedproto[mpi]')")
    reference = _reference(memory_runs)
    out = tmp_path / "mpi.json"
    cmd = [mpiexec, "-n", "3", *FEDPROTO, "run", "fastlloyd", *IRIS_2, "--transport", "mpi", "--no-plot",
           "--report", str(out)]
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
    assert main(["run", "fastlloyd", "--variant", variant, *IRIS_2, "--quiet", "--no-plot", "--report", str(out)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    results = RunReport.from_json(out.read_text()).results
    assert results["variant"] == variant
    assert len(results["centroids"]) == 3
    assert math.isfinite(results["nicv"])
    if variant == "lloyd":
        assert results["epsilon"] is None and results["epsilon_spent"] is None  # non-private
    else:
        assert results["epsilon_spent"] <= 1 + 1e-9


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
            "--quiet", "--no-plot", "--report", str(out)]
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


def test_silent_client_over_tcp_fails_the_server_naming_it(tmp_path):
    from fedproto.provision import provision

    roster = ["server", "client-0", "client-1"]
    # each party holds its own data (here all of iris: the test is about the silent party); the
    # roster states no session, so every party derives the same one from the roster and --seed
    base = ["party", "fastlloyd", "--data", "iris", "--seed", "0", "--deadline", "2"]
    addresses = {p: f"127.0.0.1:{port}" for p, port in zip(roster, _free_ports(3))}
    kits = provision(roster, addresses, tmp_path / "kits")
    started = time.monotonic()
    procs = {p: _start([*FEDPROTO, *base, "--party", p, "--roster", str(kits[p] / "roster.json")], tmp_path)
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


# --- the command-line language: version, usage errors, did you mean ------------------------------------------


def test_version(capsys):
    from fedproto import __version__
    from fedproto.cli import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"fedproto {__version__}"


@pytest.fixture
def fastlloyd_plan_spy(monkeypatch) -> list:
    """Record every call of the fastlloyd plugin's ``plan`` (the start of protocol work)."""
    from fedproto import registry

    plugin = registry.load_protocol("fastlloyd")
    calls: list = []

    def spy(args, dataset):
        calls.append(args)
        raise AssertionError("plan() ran before the usage error")

    monkeypatch.setattr(plugin, "plan", spy)
    return calls


def _usage_cases(tmp: Path) -> dict[str, tuple[list[str], list[str]]]:
    """case -> (argv, words its one-line message must hold)."""
    run = ["run", "fastlloyd", "--data", "iris"]
    return {
        "report in a missing directory": (
            [*run, "--report", str(tmp / "no" / "such" / "r.json")], ["--report", "does not exist"]),
        "report is a directory": ([*run, "--report", str(tmp)], ["--report", "is a directory"]),
        "plot in a missing directory": ([*run, "--plot", str(tmp / "nowhere" / "p.png")], ["--plot", "does not exist"]),
        "plot format": ([*run, "--plot", str(tmp / "p.docx")], ["--plot", "unknown plot format '.docx'"]),
        "plot and no plot": ([*run, "--plot", str(tmp / "p.png"), "--no-plot"], ["--no-plot", "--plot"]),
        "deadline inf": ([*run, "--deadline", "inf"], ["--deadline", "finite", "inf"]),
        "deadline nan": ([*run, "--deadline", "nan"], ["--deadline"]),
        "deadline 0": ([*run, "--deadline", "0"], ["--deadline", "> 0"]),
        "negative seed": ([*run, "--seed", "-1"], ["--seed", "at least 0"]),
        "zero clients": ([*run, "--clients", "0"], ["--clients", "at least 1"]),
        "zero frame bytes": ([*run, "--max-frame-bytes", "0"], ["--max-frame-bytes", "at least 1"]),
        "frame above the TCP prefix": (
            [*run, "--transport", "tcp", "--max-frame-bytes", str(2**32)], ["--max-frame-bytes", "4,294,967,295"]),
        "unknown transport": ([*run, "--transport", "tpc"], ["--transport", "'tpc'", "did you mean 'tcp'"]),
        "misspelt protocol": (["run", "fastloyd"], ["unknown protocol 'fastloyd'", "did you mean 'fastlloyd'"]),
        "misspelt option": ([*run, "--epsilom", "1"], ["unknown option --epsilom", "did you mean --epsilon"]),
        "misspelt choice": ([*run, "--partition", "idd"], ["--partition", "invalid choice", "did you mean iid"]),
        "misspelt command": (["rnu", "fastlloyd"], ["unknown command 'rnu'", "did you mean run"]),
        "abbreviated option": ([*run, "--epsil", "1"], ["unknown option --epsil", "--epsilon"]),
        "misspelt option, only the close one": (
            [*run, "--clinets", "3"], ["unknown option --clinets; did you mean --clients? (see"]),
        "missing protocol file": (["run", str(tmp / "nope.py")], ["no protocol file", "nope.py"]),
    }


@pytest.mark.parametrize("case", list(_usage_cases(Path("/tmp"))))
def test_usage_errors_exit_2_with_one_line_before_any_work(tmp_path, capfd, fastlloyd_plan_spy, case):
    from fedproto.cli import main

    argv, words = _usage_cases(tmp_path)[case]
    before = sorted(tmp_path.rglob("*"))
    assert main(argv) == 2
    line = _single_line(capfd.readouterr().err)
    assert line.startswith("fedproto: usage error: ") and line.endswith("--help)"), line
    for word in words:
        assert word in line, line
    assert fastlloyd_plan_spy == []  # no protocol work started
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


def test_did_you_mean_offers_only_the_close_names():
    from fedproto import registry
    from fedproto.cli import _subparser, build_parser

    options = list(_subparser(build_parser(["run", "fastlloyd"]), "run", "fastlloyd")._option_string_actions)
    assert registry.suggest("--clinets", options) == ["--clients"]  # not --deadline or --quiet
    assert registry.suggest("--trasport", options) == ["--transport"]  # not --report
    assert registry.suggest("--iter", options) == ["--iterations"]  # a prefix (no abbreviations)
    assert registry.suggest("--machines", options) == []  # a kz option: nothing of fastlloyd's is close
    assert registry.suggest("kzmean", registry.protocol_names()) == ["kzmeans", "kzmedian"]  # as close


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into any directory")
def test_report_into_an_unwritable_directory_is_a_usage_error(tmp_path, capfd, fastlloyd_plan_spy):
    from fedproto.cli import main

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert main(["run", "fastlloyd", "--report", str(locked / "r.json")]) == 2
    assert "not writable" in _single_line(capfd.readouterr().err)
    assert fastlloyd_plan_spy == []


def test_report_into_a_missing_directory_fails_within_seconds_from_the_real_command(tmp_path):
    started = time.monotonic()
    done = _run([*FEDPROTO, "run", "fastlloyd", "--data", "iris", "--report", "/no/such/dir/r.json"], tmp_path)
    elapsed = time.monotonic() - started
    assert done.returncode == 2
    assert "/no/such/dir" in _one_line_error(done)
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert list(tmp_path.iterdir()) == []


def test_missing_mpi_install_gives_the_pip_hint(monkeypatch, capfd, fastlloyd_plan_spy):
    from fedproto.cli import main

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # makes `import mpi4py` fail as if not installed
    assert main(["run", "fastlloyd", "--transport", "mpi"]) == 1
    line = _single_line(capfd.readouterr().err)
    assert "pip install 'fedproto[mpi]'" in line, line
    assert fastlloyd_plan_spy == []


# --- a user's own protocol, without packaging -----------------------------------------------------------------

#: A protocol without data in a plain file: the toy federated sum of fedproto.testing. The coordinator
#: sums vectors of i + 1 from worker i for --rounds rounds, each round's contribution times the round
#: number, so the last round's sum of any coordinate is rounds * n (n + 1) / 2 for n workers.
TOY_PLUGIN = '''
import time

import numpy as np

from fedproto.plugin import RunPlan
from fedproto.testing.toy import SumCoordinator, SumWorker

DIM = 3


class ToySum:
    name = "toysum"
    description = "federated sum of fixed vectors (a protocol without data)"
    needs_data = False

    def add_arguments(self, parser):
        group = parser.add_argument_group("toysum")
        group.add_argument("--rounds", type=int, default=2, help="rounds of summing")
        group.add_argument("--iterations", dest="rounds", type=int, help=__import__("argparse").SUPPRESS)
        group.add_argument("--hold-s", type=float, default=0.0, help="seconds each party waits before starting")

    def plan(self, args, dataset):
        assert dataset is None and not hasattr(args, "data") and not hasattr(args, "partition")
        workers = tuple(f"worker-{i}" for i in range(args.clients))

        def make_machine(party):
            time.sleep(args.hold_s)
            if party == "coordinator":
                return SumCoordinator(party, workers=workers, rounds=args.rounds, dim=DIM)
            return SumWorker(party, coordinator="coordinator", values=np.full(DIM, workers.index(party) + 1.0))

        def result_to_json(party, result):
            return {"sums": np.asarray(result).tolist()} if party == "coordinator" else {"rounds": int(result)}

        def summarize(results):
            n = len(workers)
            return {"final_sum": results["coordinator"]["sums"][-1][0], "n_clients": n,
                    "paper": {"final_sum": args.rounds * n * (n + 1) / 2}}

        return RunPlan(
            roster=("coordinator", *workers), session=4242 + args.seed, make_machine=make_machine,
            result_to_json=result_to_json, summarize=summarize, role_of=lambda p: p.split("-")[0],
            iterations=args.rounds, labels={"final_sum": "sum of the last round"},
        )


PROTOCOL = ToySum()
OTHER = PROTOCOL
'''


@pytest.fixture(scope="module")
def toy_plugin(tmp_path_factory) -> Path:
    return helpers.module_file(tmp_path_factory, "plugin", "toy_sum.py", TOY_PLUGIN)


def _check_toy_report(path: Path, *, transport: str, rounds: int, clients: int) -> RunReport:
    report = RunReport.from_json(path.read_text())
    assert (report.protocol, report.transport) == ("toysum", transport)
    expected = rounds * clients * (clients + 1) / 2
    assert report.results == {"final_sum": expected, "n_clients": clients}
    assert report.paper == {"final_sum": expected}  # moved out of the results
    assert report.algorithm_rounds == rounds + 1  # the closing Finished broadcast has a round of its own
    assert report.options["clients"] == clients and report.options["rounds"] == rounds
    assert report.options["seed"] == 0 and "data" not in report.options
    assert report.command[:2] == ("fedproto", "run")
    started = datetime.datetime.fromisoformat(report.started_at)
    finished = datetime.datetime.fromisoformat(report.finished_at)
    assert started.utcoffset() == datetime.timedelta(0) and started <= finished
    return report


def test_help_shows_the_defaults_a_plugin_sets(tmp_path, capsys, monkeypatch):
    from fedproto.cli import main

    monkeypatch.setattr(sys, "path", list(sys.path))  # loading a file puts its folder on the path
    path = tmp_path / "toy_defaults.py"
    path.write_text(TOY_PLUGIN.replace(
        '        group = parser.add_argument_group("toysum")\n',
        '        group = parser.add_argument_group("toysum")\n'
        '        parser.set_defaults(clients=5, seed=7, deadline=12.5)\n',
    ))
    assert main(["run", str(path), "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the help lines
    for words in ("number of clients (default 5)", "noise (default 7)", "wait for a party (default 12.5)"):
        assert words in shown, shown
    assert main(["run", "kzcenter", "--help"]) == 0  # the command line's own defaults otherwise
    shown = " ".join(capsys.readouterr().out.split())
    assert "number of clients (default 2)" in shown and "wait for a party (default 60)" in shown, shown


def test_a_protocol_from_a_file_runs_over_memory(tmp_path, capsys, monkeypatch, toy_plugin):
    from fedproto.cli import main

    monkeypatch.setattr(sys, "path", list(sys.path))  # loading a file puts its folder on the path
    out = tmp_path / "toy.json"
    argv = ["run", str(toy_plugin), "--clients", "3", "--rounds", "4", "--report", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    stdout = capsys.readouterr().out
    assert "sum of the last round" in stdout  # the plan's label, not the key
    report = _check_toy_report(out, transport="memory", rounds=4, clients=3)
    assert report.command == ("fedproto", *argv)
    # FILE:ATTR, a module:ATTR from the working directory, and a hidden alias (same destination)
    monkeypatch.chdir(toy_plugin.parent)
    for spec in (f"{toy_plugin}:OTHER", "toy_sum:PROTOCOL"):
        argv = ["run", spec, "--iterations", "2", "--clients", "2", "--quiet", "--no-plot", "--report", str(out)]
        assert main(argv) == 0
        _check_toy_report(out, transport="memory", rounds=2, clients=2)
    capsys.readouterr()
    assert main(["run", str(toy_plugin), "--iteration", "2"]) == 2
    line = _single_line(capsys.readouterr().err)
    assert "unknown option --iteration; did you mean --rounds?" in line, line
    assert main(["run", f"{toy_plugin}:NOPE"]) == 1
    assert "no attribute 'NOPE'" in _single_line(capsys.readouterr().err)
    assert main(["run", "toy_sum:NOPE"]) == 1
    assert "no attribute 'NOPE'" in _single_line(capsys.readouterr().err)
    assert main(["run", "no_such_module_here:PROTOCOL"]) == 2
    assert "unknown protocol 'no_such_module_here:PROTOCOL'" in _single_line(capsys.readouterr().err)


def test_from_a_directory_with_its_own_packages_list_and_a_file_protocol_over_tcp(tmp_path, toy_plugin):
    cwd = _shadowing_directory(tmp_path)
    (cwd / "mine").mkdir()
    relative = Path("mine") / "toy_sum.py"  # the parties are given its absolute path
    (cwd / relative).write_text(toy_plugin.read_text())
    out = tmp_path / "toy_tcp.json"
    done = _run_many({
        "list": [*FEDPROTO, "list"],
        "tcp": [*FEDPROTO, "run", str(relative), "--transport", "tcp", "--clients", "2", "--rounds", "3",
                "--no-plot", "--report", str(out)],
        # fails in the parties' processes only (the launcher never builds a machine)
        "party fails": [*FEDPROTO, "run", str(relative), "--transport", "tcp", "--hold-s", "-1"],
    }, cwd)
    line = _one_line_error(done["party fails"])
    assert re.fullmatch(r"fedproto: error: party \S+ failed: sleep length must be non-negative", line), line
    assert done["party fails"].returncode == 1
    listing = _ok(done["list"]).stdout.splitlines()
    for name in ("fastlloyd", "mufc", "kzcenter", "qkmeans", "dckmeans", "memory", "tcp"):
        line = next((ln for ln in listing if ln.split()[:1] == [name]), None)
        assert line is not None and len(line.split()) > 2, listing  # a name and a description
    _ok(done["tcp"])
    report = _check_toy_report(out, transport="tcp", rounds=3, clients=2)
    assert report.framing_overhead_bytes == 4 * report.messages


# --- plugins load lazily; a broken one is listed, not fatal ------------------------------------------------


class _EntryPoint:
    def __init__(self, name: str, load) -> None:
        self.name = name
        self.load = load


def test_a_broken_plugin_is_listed_and_breaks_nothing_else(monkeypatch, capsys):
    from fedproto import registry
    from fedproto.cli import build_parser, main

    real = registry._group
    loaded: list[str] = []

    def broken():
        loaded.append("broken")
        raise ModuleNotFoundError("No module named 'sklearn_nightly'", name="sklearn_nightly")

    def group(name):
        entries = dict(real(name))
        if name == registry.PROTOCOL_GROUP:
            entries["broken"] = _EntryPoint("broken", broken)
        return entries

    monkeypatch.setattr(registry, "_group", group)
    parser = build_parser(["run", "fastlloyd", "--data", "iris"])
    assert loaded == []  # only the named protocol is imported
    assert parser.parse_args(["run", "fastlloyd", "--k", "2"]).k == 2
    assert main(["list"]) == 0
    out = capsys.readouterr().out.splitlines()
    broken_line = next(ln for ln in out if ln.split()[:1] == ["broken"])
    assert broken_line.split()[1] == "(broken)" and "No module named 'sklearn_nightly'" in broken_line, out
    assert any(ln.split()[:1] == ["fastlloyd"] and "k-means" in ln for ln in out), out
    assert main(["run", "broken"]) == 1
    assert "cannot load protocol 'broken': ModuleNotFoundError" in _single_line(capsys.readouterr().err)


# --- the launcher stops every party when it is stopped ---------------------------------------------------


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_sigterm_to_a_tcp_run_stops_every_party_and_removes_its_files(tmp_path, toy_plugin):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    cmd = [*FEDPROTO, "run", str(toy_plugin), "--transport", "tcp", "--clients", "2", "--hold-s", "60"]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        start_new_session=True, env={**os.environ, "TMPDIR": str(scratch)},
    )
    try:
        limit = time.monotonic() + 120
        while len(parties := _children(proc.pid)) < 3:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < limit, "the parties did not start"
            time.sleep(0.05)
        processes = list(_process_tree(proc.pid))  # the parties, and a fork server if any
        assert any(p.name.startswith("fedproto-") for p in scratch.iterdir())  # the run's private files
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert time.monotonic() - stopped < 5 + 2
    finally:
        _kill(proc)
    assert proc.returncode == 128 + signal.SIGTERM
    assert _single_line(err) == "fedproto: interrupted by SIGTERM; every party was stopped"
    assert [pid for pid in parties if _alive(pid)] == []
    assert [pid for pid in processes if _alive(pid)] == []
    assert list(scratch.iterdir()) == []  # the roster and the parties' reports are gone


def test_the_run_shows_its_rounds_through_the_progress_display(tmp_path, capsys, monkeypatch, toy_plugin):
    import contextlib

    from fedproto import _cli_run, cli
    from fedproto.progress import use_display

    installed: list = []

    class Recording:
        def __init__(self) -> None:
            self.tasks: dict[int, list] = {}

        def add_task(self, description, *, total=None):
            self.tasks[len(self.tasks)] = [description, total, 0]
            return len(self.tasks) - 1

        def advance(self, task_id, advance=1):
            self.tasks[task_id][2] += advance

        def remove_task(self, task_id):
            pass

    @contextlib.contextmanager
    def recording_display(console=None, *, enabled=True):
        display = Recording() if enabled else None
        installed.append(display)
        with use_display(display):
            yield display

    monkeypatch.setattr(_cli_run, "progress_display", recording_display)  # where `fedproto run` uses it
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert cli.main(["run", str(toy_plugin), "--rounds", "5"]) == 0
    assert installed[0].tasks == {0: ["toysum rounds", 5, 5]}
    assert cli.main(["run", str(toy_plugin), "--rounds", "5", "--quiet"]) == 0
    assert installed[1] is None  # --quiet: no progress at all
    capsys.readouterr()

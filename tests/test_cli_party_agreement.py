"""``fedproto party`` processes compare what they run before any protocol work (issue 33, item 2).

The bug: with a roster that states a session (``fedproto provision --session 12345``), a server
and client-0 started with ``--seed 3`` and client-1 with ``--seed 4`` all exited 0, the clients
holding different centroids.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fedproto.testing import load_file

helpers = load_file(Path(__file__).with_name("_helpers.py"), "tests_helpers")

FEDPROTO = [sys.executable, "-m", "fedproto"]
PARTIES = ("server", "client-0", "client-1")
TIMEOUT_S = 180


def _federation(tmp_path: Path, *extra: str) -> socket.socket:
    """Kits for PARTIES (TLS, a star on loopback) and each client's own part of iris; returns the
    hub's bound listening socket (handed to the server, so the port cannot race)."""
    hub = socket.create_server(("127.0.0.1", 0))
    for argv in (
        ["provision", "--parties", ",".join(PARTIES), "--hub", f"127.0.0.1:{hub.getsockname()[1]}",
         "--out", str(tmp_path / "fed"), *extra],
        ["split", "fastlloyd", "--data", "iris", "--clients", "2", "--seed", "3", "--out", str(tmp_path / "parts")],
    ):
        done = subprocess.run([*FEDPROTO, *argv], capture_output=True, text=True, timeout=TIMEOUT_S)
        assert done.returncode == 0, done.stderr
    return hub


def _run_parties(
    tmp_path: Path, hub: socket.socket, seeds: dict[str, int], deadline_s: float = 60,
    extra: dict[str, list[str]] | None = None,
) -> dict[str, tuple[int, str, str]]:
    """Start every party as its own process (``extra``: more options of some); ``{party: (exit
    code, stdout, stderr)}``."""
    procs: dict[str, subprocess.Popen] = {}
    try:
        for party in PARTIES:
            own = [] if party == "server" else ["--data", str(tmp_path / "parts" / f"{party}.npz")]
            listen = ["--listen-fd", str(hub.fileno())] if party == "server" else []
            procs[party] = subprocess.Popen(
                [*FEDPROTO, "party", "fastlloyd", "--party", party, "--roster",
                 str(tmp_path / "fed" / party / "roster.json"), *own, *listen, "--k", "3", "--epsilon", "1",
                 "--seed", str(seeds[party]), "--deadline", str(deadline_s), "--device", "cpu",
                 *(extra or {}).get(party, [])],
                pass_fds=(hub.fileno(),) if party == "server" else (),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
            )
        hub.close()  # the server holds its own copy
        return {p: (proc.wait(timeout=TIMEOUT_S), *proc.communicate(timeout=TIMEOUT_S)) for p, proc in procs.items()}
    finally:
        hub.close()
        helpers.kill_all(procs.values())


def test_a_client_started_with_another_seed_ends_every_party_naming_seed_and_the_client(tmp_path: Path) -> None:
    hub = _federation(tmp_path, "--session", "12345")
    outcomes = _run_parties(tmp_path, hub, {"server": 3, "client-0": 3, "client-1": 4}, deadline_s=15)
    for party, (code, out, err) in outcomes.items():
        lines = err.strip().splitlines()
        assert code == 1, f"{party} exited {code}: {err[-2000:]}"
        assert "Traceback" not in err, f"{party}: {err[-2000:]}"
        assert out == "", f"{party} printed a result: {out}"
        if party == "client-0" and "hub" in lines[-1]:
            # client-0 joined (or dialled) before the hub refused client-1 and ended the run,
            # and had not yet exchanged a frame with it, so nobody told it why: it may log the
            # connection's loss as it re-dials, and its one error line names the hub it lost.
            assert [line for line in lines if line.startswith("fedproto:")] == lines[-1:], err
            continue
        assert len(lines) == 1, f"{party}: {err}"
        assert "--seed" in lines[0] and "client-1" in lines[0], f"{party}: {lines[0]}"
    assert "client-1 runs with --seed 4, this party (server) with --seed 3" in outcomes["server"][2]
    assert "server runs with --seed 3, this party (client-1) with --seed 4" in outcomes["client-1"][2]


@pytest.mark.slow
def test_the_same_roster_and_equal_options_still_run_and_agree(tmp_path: Path) -> None:
    hub = _federation(tmp_path, "--session", "12345")
    outcomes = _run_parties(tmp_path, hub, {"server": 3, "client-0": 3, "client-1": 3})
    results = {}
    for party, (code, out, err) in outcomes.items():
        assert code == 0, f"{party}: {err[-2000:]}"
        results[party] = json.loads(out.strip().splitlines()[-1])["result"]
    assert results["client-0"]["centroids"] == results["client-1"]["centroids"]


@pytest.mark.slow
def test_parties_tracing_their_compute_or_not_agree_and_their_reports_predict_the_run(tmp_path: Path) -> None:
    """--compute-trace is each party's own (docs/deployment.md, "Predicting the same federation
    over other links"): a run where two of three parties trace completes, and a directory of
    their party reports replays it on the lean engine."""
    hub = _federation(tmp_path)
    reports = tmp_path / "reports"
    reports.mkdir()
    extra = {p: ["--party-report", str(reports / f"{p}.json"), *(["--compute-trace"] if p != "client-1" else [])]
             for p in PARTIES}
    outcomes = _run_parties(tmp_path, hub, dict.fromkeys(PARTIES, 3), extra=extra)
    for party, (code, _, err) in outcomes.items():
        assert code == 0, f"{party}: {err[-2000:]}"
    lean = ["run", "fastlloyd", "--data", "iris", "--clients", "2", "--seed", "3", "--k", "3", "--epsilon", "1",
            "--engine", "lean", "--network", "lan", "--no-plot", "--quiet", "--report", str(tmp_path / "lean.json")]
    # a party report without a trace in the directory: one usage line naming it
    done = subprocess.run([*FEDPROTO, *lean, "--compute", f"trace:{reports}"], capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert done.returncode == 2 and "client-1.json: the report has no compute_trace" in done.stderr, done.stderr
    # the two traced parties' reports: their handlers traced, client-1's measured and counted
    (reports / "client-1.json").rename(tmp_path / "client-1.json")
    done = subprocess.run([*FEDPROTO, *lean, "--compute", f"trace:{reports}"], capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "lean.json").read_text())
    to_client_1 = sum(link["messages"] for link in doc["links"] if link["receiver"] == "client-1")
    assert doc["prediction"]["untraced_handlers"] == 1 + to_client_1  # its start and one handler a frame
    assert doc["prediction"]["unused_trace_figures"] == 0
    for party in ("server", "client-0"):  # each party's report traces that party alone
        assert list(json.loads((reports / f"{party}.json").read_text())["report"]["compute_trace"]) == [party]


def test_a_party_whose_roster_states_another_session_ends_every_party_naming_the_session_and_it(tmp_path: Path) -> None:
    """Issue 34, target 4, across processes: client-1's roster (a stale copy) says session 54321,
    the others' 12345. Its own machine and runtime agree (both are its roster's session), so the
    difference shows between processes: the handshake compares sessions and every party ends in
    one line naming client-1's session, the run's, and client-1 (or, on client-1, the hub)."""
    hub = _federation(tmp_path, "--session", "12345")
    stale = tmp_path / "fed" / "client-1" / "roster.json"
    doc = json.loads(stale.read_text())
    assert doc["session"] == 12345
    stale.write_text(json.dumps({**doc, "session": 54321}))
    outcomes = _run_parties(tmp_path, hub, dict.fromkeys(PARTIES, 3), deadline_s=15)
    for party, (code, out, err) in outcomes.items():
        lines = err.strip().splitlines()
        assert code == 1, f"{party} exited {code}: {err[-2000:]}"
        assert "Traceback" not in err and out == "", f"{party}: {err[-2000:]}"
        if party == "client-0" and "hub" in lines[-1]:
            # as above: client-0 lost the hub before anyone told it why
            assert [line for line in lines if line.startswith("fedproto:")] == lines[-1:], err
            continue
        assert len(lines) == 1, f"{party}: {err}"
        assert "session 54321" in lines[0] and "session 12345" in lines[0] and "client-1" in lines[0], lines[0]
    assert "client-1 runs session 54321, this party (server) session 12345" in outcomes["server"][2]
    assert "server runs session 12345, this party (client-1) session 54321" in outcomes["client-1"][2]

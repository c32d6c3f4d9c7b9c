"""The roster file and the process launcher.

* a roster survives save/load, is written mode 0600, and every malformed file gives one line that
  names the file;
* ``launch_local`` hands each party a listening socket bound to the port its roster names, reads
  large outputs without deadlocking, stops every party when one fails or the time is up, and on
  SIGTERM (in this process, through the handlers it installs while launching) or when the
  launcher is killed outright leaves no party alive and no temporary directory behind.

The parties here are tiny ``python -c`` scripts, so these tests take a few seconds.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedproto.launcher import LaunchError, LaunchInterrupted, PartyOutcome, launch_local
from fedproto.roster import Roster
from fedproto.testing import load_file

helpers = load_file(Path(__file__).with_name("_helpers.py"), "tests_helpers")
_alive, _wait_dead = helpers.alive, helpers.wait_dead
PARTIES = ("server", "client-0", "client-1")
SECRET = bytes(range(32))


def _python(code: str, *args: object) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code), *(str(a) for a in args)]


# --- the roster ----------------------------------------------------------------------------------


def test_roster_round_trips_through_a_private_file(tmp_path):
    roster = Roster(PARTIES, {p: f"127.0.0.1:{7000 + i}" for i, p in enumerate(PARTIES)}, SECRET, session=2**64 - 1)
    path = roster.save(tmp_path / "roster.json")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Roster.load(path) == roster
    doc = json.loads(path.read_text())
    assert doc == {
        "session": 2**64 - 1,
        "secret": SECRET.hex(),
        "parties": [{"name": p, "address": f"127.0.0.1:{7000 + i}"} for i, p in enumerate(PARTIES)],
    }
    assert SECRET.hex() not in repr(roster)  # the secret stays out of logs and tracebacks
    # an existing file readable by others is narrowed to its owner
    path.chmod(0o644)
    Roster.create({"a": "[::1]:1", "b": "example.org:2"}).save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    fresh = Roster.load(path)
    assert fresh.session is None and len(fresh.secret) == 32 and fresh.parties == ("a", "b")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"parties": ()}, "no parties"),
        ({"parties": ("a", "a")}, "unique; repeated: a"),
        ({"parties": ("a", " ")}, "non-empty"),
        ({"addresses": {"a": "h:1"}, "topology": "mesh"}, "no address for b"),
        ({"addresses": {"b": "h:2"}}, "no address for the hub a"),  # a star needs its hub's address
        ({"topology": "ring"}, "topology must be 'star' or 'mesh'"),
        ({"addresses": {"a": "h:1", "b": "h:2", "c": "h:3"}}, "outside the roster: c"),
        ({"addresses": {"a": "h:1", "b": "h"}}, "host:port"),
        ({"addresses": {"a": "h:1", "b": "h:65536"}}, "host:port"),
        ({"addresses": {"a": "h:1", "b": "::1:5"}}, "host:port"),
        ({"secret": b"short"}, "at least 16 bytes"),
        ({"secret": None}, "neither TLS material nor a secret"),
        ({"session": -1}, "session"),
        ({"session": 2**64}, "session"),
        ({"session": True}, "session"),
    ],
)
def test_roster_validation(kwargs, match):
    fields = {"parties": ("a", "b"), "addresses": {"a": "h:1", "b": "h:2"}, "secret": SECRET, "session": None}
    fields.update(kwargs)
    if "parties" in kwargs and "addresses" not in kwargs:
        fields["addresses"] = {p: "h:1" for p in kwargs["parties"]}
    with pytest.raises(ValueError, match=match):
        Roster(**fields)


GOOD = {"session": 3, "secret": SECRET.hex(), "parties": [{"name": "a", "address": "h:1"}]}

#: file content -> words the one-line error must hold (besides the file name)
BAD_ROSTERS = {
    "": "not JSON",
    "{": "not JSON",
    "[]": "expected a JSON object",
    json.dumps({"session": 1, "secret": SECRET.hex(), "addresses": {"a": "h:1"}}): "unknown keys 'addresses'",
    json.dumps({"secret": SECRET.hex()}): "no 'parties'",
    json.dumps({**GOOD, "parties": {"a": "h:1"}}): "'parties' must be a list",
    json.dumps({**GOOD, "parties": [{"name": "a"}]}): "parties[0]",
    json.dumps({**GOOD, "parties": [{"name": 1, "address": "h:1"}]}): "parties[0]: the name",
    json.dumps({**GOOD, "parties": [{"name": "a", "address": 7}]}): "address of 'a'",
    json.dumps({k: v for k, v in GOOD.items() if k != "secret"}): "no 'secret'",
    json.dumps({**GOOD, "secret": "zz"}): "hex",
    json.dumps({**GOOD, "secret": "00ff"}): "at least 16 bytes",
    json.dumps({**GOOD, "session": "3"}): "session",
    json.dumps({**GOOD, "tls": "kit"}): "'tls' must be an object of exactly 'ca', 'cert' and 'key'",
    json.dumps({**GOOD, "tls": {"ca": "ca.pem", "cert": "a.pem"}}): "'tls' must be an object",
    json.dumps({**GOOD, "tls": {"ca": "ca.pem", "cert": "a.pem", "key": ""}}): "'tls' must be an object",
}


@pytest.mark.parametrize("content", list(BAD_ROSTERS))
def test_roster_load_errors_are_one_line_naming_the_file(tmp_path, content):
    path = tmp_path / "roster.json"
    path.write_text(content)
    with pytest.raises(ValueError) as caught:
        Roster.load(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and BAD_ROSTERS[content] in message, message
    assert "KeyError" not in message and "Traceback" not in message


def test_a_roster_with_tls_material_needs_no_secret_and_its_paths_follow_the_file(tmp_path):
    from fedproto.roster import TlsFiles

    kit = tmp_path / "kit"
    kit.mkdir()
    roster = Roster(("a", "b"), {"a": "h:1", "b": "h:2"}, tls=TlsFiles("ca.pem", "a.pem", "/abs/a.key"))
    path = roster.save(kit / "roster.json")
    doc = json.loads(path.read_text())
    assert "secret" not in doc and doc["tls"] == {"ca": "ca.pem", "cert": "a.pem", "key": "/abs/a.key"}
    loaded = Roster.load(path)
    assert loaded.secret is None
    # relative paths are the roster file's directory's; absolute ones stay
    assert loaded.tls == TlsFiles(kit / "ca.pem", kit / "a.pem", "/abs/a.key")
    assert Roster.from_dict(doc).tls == TlsFiles("ca.pem", "a.pem", "/abs/a.key")
    both = Roster(("a", "b"), {"a": "h:1", "b": "h:2"}, SECRET, tls=TlsFiles("c", "d", "e"))
    assert Roster.from_dict(both.to_dict()) == both


def test_roster_load_of_a_missing_or_binary_file(tmp_path):
    with pytest.raises(ValueError, match=r"cannot read roster .*missing\.json: No such file"):
        Roster.load(tmp_path / "missing.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="not UTF-8"):
        Roster.load(tmp_path / "bin.json")


def test_roster_check_matches():
    roster = Roster(("a", "b"), {"a": "h:1", "b": "h:2"}, SECRET, session=5)
    roster.check_matches(("a", "b"), 5)
    with pytest.raises(ValueError, match=r"lists \['a', 'b'\], this run needs \['b', 'a'\]"):
        roster.check_matches(("b", "a"), 5)
    with pytest.raises(ValueError, match="session 5, these arguments make session 6"):
        roster.check_matches(("a", "b"), 6)
    Roster(("a", "b"), {"a": "h:1", "b": "h:2"}, SECRET).check_matches(("a", "b"), 6)  # no session fixed


# --- launch_local ------------------------------------------------------------------------------------

#: A party that checks the socket it inherited against the roster and prints what it saw.
CHECK_SOCKET = """
    import json, os, socket, stat, sys
    party, roster_path, fd = sys.argv[1], sys.argv[2], int(sys.argv[3])
    doc = json.load(open(roster_path))
    port = int(dict((p["name"], p["address"]) for p in doc["parties"])[party].rsplit(":", 1)[1])
    sock = socket.socket(fileno=fd)
    listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    mode = stat.S_IMODE(os.stat(roster_path).st_mode)
    kit = os.path.dirname(roster_path)
    print(json.dumps({"party": party, "port": port, "bound": sock.getsockname()[1], "listening": listening,
                      "mode": mode, "session": doc.get("session"), "secret": doc.get("secret"),
                      "tls": doc.get("tls"), "roster_dir": kit, "kit": sorted(os.listdir(kit)),
                      "key_mode": stat.S_IMODE(os.stat(os.path.join(kit, party + ".key")).st_mode)
                      if doc.get("tls") else None}))
    sys.stdout.write("x" * (1 << 20))  # a megabyte on each pipe: the launcher must keep reading
    sys.stderr.write("y" * (1 << 20))
"""


@pytest.mark.parametrize("tls", [True, False])
def test_every_party_gets_a_listening_socket_on_its_roster_port(tls):
    outcomes = launch_local(
        PARTIES, lambda party, roster, fd: _python(CHECK_SOCKET, party, roster, fd), timeout_s=60, session=9, tls=tls
    )
    assert list(outcomes) == list(PARTIES)
    seen = {}
    for party, outcome in outcomes.items():
        assert isinstance(outcome, PartyOutcome) and outcome.ok, outcome.stderr[-500:]
        line, _, rest = outcome.stdout.partition("\n")
        assert rest == "x" * (1 << 20) and outcome.stderr == "y" * (1 << 20)
        seen[party] = json.loads(line)
    for party, info in seen.items():
        assert info["party"] == party
        assert info["bound"] == info["port"] and info["listening"]
        assert info["mode"] == 0o600 and info["session"] == 9
        if tls:  # each party its own kit, holding its own key only, and no secret
            assert info["secret"] is None
            assert info["tls"] == {"ca": "ca.pem", "cert": f"{party}.pem", "key": f"{party}.key"}
            assert info["kit"] == sorted(["ca.pem", f"{party}.pem", f"{party}.key", "roster.json"])
            assert info["key_mode"] == 0o600
        else:
            assert info["tls"] is None and len(bytes.fromhex(info["secret"])) == 32
    assert len({info["port"] for info in seen.values()}) == len(PARTIES)
    roster_dirs = {info["roster_dir"] for info in seen.values()}
    assert len(roster_dirs) == len(PARTIES)  # each party its own directory, whatever it holds
    assert not any(Path(d).exists() for d in roster_dirs)  # removed afterwards


def test_first_failure_stops_the_others():
    def command(party, roster, fd):
        if party == "client-0":
            return _python("import sys, time; time.sleep(0.3); sys.exit('client-0: the data is bad')")
        return _python("import time; time.sleep(60)")

    started = time.monotonic()
    with pytest.raises(LaunchError) as caught:
        launch_local(PARTIES, command, timeout_s=60)
    assert time.monotonic() - started < 15
    error = caught.value
    assert str(error) == "party client-0 failed: client-0: the data is bad"
    assert error.party == "client-0" and not error.timed_out
    outcomes = error.outcomes
    assert outcomes["client-0"].returncode == 1 and not outcomes["client-0"].stopped
    for party in ("server", "client-1"):
        assert outcomes[party].stopped and outcomes[party].returncode == -signal.SIGTERM
    # without check, the same outcomes come back
    outcomes = launch_local(PARTIES, command, timeout_s=60, check=False)
    assert not outcomes["client-0"].ok and outcomes["server"].stopped


def test_timeout_stops_everyone_and_names_who_was_running():
    def command(party, roster, fd):
        code = "import time; time.sleep(60)" if party != "server" else "pass"
        return _python(code)

    started = time.monotonic()
    with pytest.raises(LaunchError, match=r"did not finish within 1 s \(still running: client-0, client-1\)") as caught:
        launch_local(PARTIES, command, timeout_s=1)
    assert time.monotonic() - started < 1 + 5 + 2
    assert caught.value.timed_out and caught.value.outcomes["server"].ok


def test_a_party_deaf_to_sigterm_is_killed_within_five_seconds():
    deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"

    def command(party, roster, fd):
        return _python(deaf if party == "server" else "import time; time.sleep(0.5); raise SystemExit(2)")

    started = time.monotonic()
    with pytest.raises(LaunchError, match="exit status 2"):
        launch_local(PARTIES, command, timeout_s=60)
    assert time.monotonic() - started < 0.5 + 5 + 2


def test_bad_arguments():
    with pytest.raises(ValueError, match="unique"):
        launch_local(("a", "a"), lambda *a: ["true"], timeout_s=1)
    with pytest.raises(ValueError, match="timeout_s"):
        launch_local(("a",), lambda *a: ["true"], timeout_s=float("inf"))
    with pytest.raises(OSError):
        launch_local(("a", "b"), lambda *a: ["/no/such/program"], timeout_s=5)


def test_sigterm_while_launching_stops_every_party_and_restores_the_handler():
    before = signal.getsignal(signal.SIGTERM)
    pids: list[int] = []
    roster_dirs: list[Path] = []

    def command(party, roster, fd):
        roster_dirs.append(roster.parent)
        return _python("import time; time.sleep(60)")

    def started(by_party):
        pids.extend(by_party.values())
        os.kill(os.getpid(), signal.SIGTERM)  # as if a user or a scheduler stopped the launcher

    begun = time.monotonic()
    with pytest.raises(LaunchInterrupted, match="interrupted by SIGTERM; every party was stopped") as caught:
        launch_local(PARTIES, command, timeout_s=60, on_started=started)
    assert time.monotonic() - begun < 5 + 2
    assert caught.value.signum == signal.SIGTERM
    assert len(pids) == len(PARTIES) and _wait_dead(pids, 1) == []
    assert roster_dirs and not roster_dirs[0].exists()
    assert signal.getsignal(signal.SIGTERM) is before


LAUNCHER = """
    import json, sys
    from fedproto.launcher import launch_local

    def command(party, roster, fd):
        return [sys.executable, "-c", "import time; time.sleep(60)"]

    def started(by_party):
        with open(sys.argv[1] + ".tmp", "w") as f:
            json.dump(list(by_party.values()), f)
        import os
        os.rename(sys.argv[1] + ".tmp", sys.argv[1])

    launch_local(["a", "b", "c"], command, timeout_s=120, on_started=started)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_parties_die_with_a_launcher_killed_outright(tmp_path):
    pid_file = tmp_path / "pids.json"
    launcher = subprocess.Popen(  # its own TMPDIR: the files it leaves are this test's only
        _python(LAUNCHER, pid_file), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    try:
        helpers.wait_while_running(launcher, pid_file.exists, "the launcher did not start its parties")
        pids = json.loads(pid_file.read_text())
        assert all(_alive(pid) for pid in pids)
        launcher.kill()  # SIGKILL: no handler, no cleanup code runs
        launcher.wait()
        assert _wait_dead(pids, 5) == []
    finally:
        helpers.reap(launcher)

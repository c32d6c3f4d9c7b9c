"""What a launch leaves on disk, however the launcher ends (issue 33, item 6).

* The launcher never writes the throwaway federation's CA key: no file anywhere under the launch's
  temporary directory holds a private key whose public key is the CA certificate's.
* Everything it writes (kits, rosters, ``fedproto run``'s data parts) lies in private directories
  (0700) of private files (0600), and each launched party removes its own kit, data part included,
  once it has loaded it (:func:`fedproto.launcher.discard_launched_kit`), so a launcher killed
  outright (SIGKILL: no cleanup code runs) after its parties started leaves nothing behind but
  empty private directories, and its parties die with it.
* The next launch removes the leftovers of dead launchers of the same user and leaves a live
  launcher's files alone.

Every test runs under its own temporary directory (``TMPDIR`` for subprocesses, ``tempfile.tempdir``
in this process), so tests never see each other's files.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from fedproto.launcher import launch_local
from fedproto.testing import load_file

helpers = load_file(Path(__file__).with_name("_helpers.py"), "tests_helpers")
_alive, _wait_dead, _children, _process_tree = helpers.alive, helpers.wait_dead, helpers.leaf_processes, helpers.process_tree
PARTIES = ("server", "client-0", "client-1")
FEDPROTO = [sys.executable, "-m", "fedproto"]
linux_only = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="parent-death signal and process start times need Linux /proc"
)


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> Path:
    """This test's own temporary directory, for this process and for its subprocesses."""
    path = tmp_path / "scratch"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    monkeypatch.setenv("TMPDIR", str(path))
    return path


def _tree(root: Path) -> tuple[list[Path], list[Path]]:
    """(directories, files) under ``root``, ``root`` itself excluded."""
    dirs, files = [], []
    for entry in sorted(root.rglob("*")):
        (dirs if entry.is_dir() and not entry.is_symlink() else files).append(entry)
    return dirs, files


def _ca_keys(root: Path, ca_certificates: list[bytes]) -> list[Path]:
    """Files under ``root`` named ``ca.key`` or holding a PEM private key of one of the CAs."""
    ca_publics = [
        x509.load_pem_x509_certificate(pem).public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        for pem in ca_certificates
    ]
    found = []
    for path in _tree(root)[1]:
        data = path.read_bytes()
        if path.name == "ca.key":
            found.append(path)
            continue
        if b"PRIVATE KEY-----" not in data:
            continue
        key = serialization.load_pem_private_key(data, password=None)
        public = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        if public in ca_publics:
            found.append(path)
    return found


def _ca_certificates(root: Path) -> list[bytes]:
    return [p.read_bytes() for p in root.rglob("ca.pem")]


def _modes(root: Path) -> dict[str, int]:
    """``{path: mode}`` of everything under ``root`` that is not private (0700 dirs, 0600 files)."""
    dirs, files = _tree(root)
    wrong = {str(d): stat.S_IMODE(d.lstat().st_mode) for d in [root, *dirs] if stat.S_IMODE(d.lstat().st_mode) != 0o700}
    wrong.update({str(f): stat.S_IMODE(f.lstat().st_mode) for f in files if stat.S_IMODE(f.lstat().st_mode) != 0o600})
    return wrong


def _python(code: str, *args: object) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code), *(str(a) for a in args)]


# --- while the parties run, everything is private and no CA key is anywhere -----------------------------------


@pytest.mark.parametrize("tls", [True, False])
def test_the_launch_writes_private_files_and_no_ca_key(scratch, tls):
    seen: dict = {}

    def started(by_party):
        launches = list(scratch.iterdir())
        seen["launches"] = launches
        seen["wrong_modes"] = {}
        for launch in launches:
            seen["wrong_modes"].update(_modes(launch))
        certificates = _ca_certificates(scratch)
        seen["ca_certificates"] = certificates
        seen["ca_keys"] = _ca_keys(scratch, certificates)
        seen["files"] = sorted(str(p.relative_to(scratch)) for p in _tree(scratch)[1])

    launch_local(PARTIES, lambda party, roster, fd: _python("pass"), timeout_s=60, on_started=started, tls=tls)
    assert len(seen["launches"]) == 1 and seen["launches"][0].name.startswith("fedproto-launch-")
    assert seen["wrong_modes"] == {}
    assert seen["ca_keys"] == []
    if tls:
        assert len(seen["ca_certificates"]) == len(PARTIES)  # one kit per party, and the CA key in none
        assert not any("ca.key" in f or f.endswith("/ca/ca.pem") for f in seen["files"]), seen["files"]
    assert list(scratch.iterdir()) == []  # removed at the end


# --- SIGKILL of the launcher -----------------------------------------------------------------------------------

#: A party that loads its kit as a real one does (TLS contexts through ``ssl``), gives it up as a
#: launched party should, says so in a file outside the launch and waits.
LOADING_PARTY = """
    import sys, time
    from pathlib import Path
    from fedproto.roster import Roster
    from fedproto.transports._tls import load_contexts
    party, roster_path, ready = sys.argv[1], sys.argv[2], sys.argv[3]
    roster = Roster.load(roster_path)
    load_contexts(roster.tls, party)
    try:
        from fedproto.launcher import discard_launched_kit
    except ImportError:  # before issue 33: nothing to call
        pass
    else:
        assert discard_launched_kit(roster_path)
    Path(ready).write_text("loaded")
    time.sleep(120)
"""

#: A launcher in its own process: writes its parties' pids to argv[1] once they started.
LAUNCHER = """
    import json, os, sys, textwrap
    from fedproto.launcher import launch_local
    pid_file, ready_dir, party_code = sys.argv[1], sys.argv[2], sys.argv[3]

    def command(party, roster, fd):
        return [sys.executable, "-c", party_code, party, str(roster), os.path.join(ready_dir, party)]

    def started(by_party):
        with open(pid_file + ".tmp", "w") as f:
            json.dump(list(by_party.values()), f)
        os.rename(pid_file + ".tmp", pid_file)

    launch_local(["server", "client-0", "client-1"], command, timeout_s=300, on_started=started)
"""


def _start_launcher(tmp_path: Path, name: str, party_code: str) -> tuple[subprocess.Popen, list[int], Path]:
    """A launcher subprocess whose parties run ``party_code``; returns it, its parties' pids and
    the directory where the parties say they are ready."""
    ready = tmp_path / f"{name}-ready"
    ready.mkdir()
    pid_file = tmp_path / f"{name}-pids.json"
    launcher = subprocess.Popen(
        _python(LAUNCHER, pid_file, ready, textwrap.dedent(party_code)),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    limit = time.monotonic() + 60
    while not pid_file.exists():
        assert launcher.poll() is None, launcher.stderr.read().decode()
        assert time.monotonic() < limit, "the launcher did not start its parties"
        time.sleep(0.05)
    return launcher, json.loads(pid_file.read_text()), ready


def _wait_ready(launcher: subprocess.Popen, ready: Path, timeout_s: float = 60) -> None:
    helpers.wait_while_running(launcher, lambda: len(list(ready.iterdir())) >= len(PARTIES),
                               "the parties did not load their kits", timeout_s=timeout_s)


@linux_only
def test_a_launcher_killed_outright_after_its_parties_loaded_leaves_nothing(scratch, tmp_path):
    launcher, pids, ready = _start_launcher(tmp_path, "a", LOADING_PARTY)
    try:
        _wait_ready(launcher, ready)
        assert all(_alive(pid) for pid in pids)
        certificates = _ca_certificates(scratch)  # any kit still there (none, once loaded)
        launcher.kill()  # SIGKILL: no handler, no cleanup code runs
        launcher.wait()
        assert _wait_dead(pids, 5) == []
    finally:
        helpers.reap(launcher)
    assert _ca_keys(scratch, certificates) == []
    launches = list(scratch.iterdir())
    assert [p.name.startswith("fedproto-launch-") for p in launches] == [True]
    assert _tree(launches[0]) == ([], [])  # nothing at all inside the launch's directory
    assert _modes(launches[0]) == {}


#: The kits stay while this party lives: it never gives its kit up (a user's own script might not).
KEEPING_PARTY = """
    import sys, time
    from pathlib import Path
    Path(sys.argv[3]).write_text("started")
    time.sleep(120)
"""


@linux_only
def test_a_killed_launcher_whose_parties_kept_their_kits_leaves_only_private_files_without_the_ca_key(
    scratch, tmp_path
):
    launcher, pids, ready = _start_launcher(tmp_path, "a", KEEPING_PARTY)
    try:
        _wait_ready(launcher, ready)
        launcher.kill()
        launcher.wait()
        assert _wait_dead(pids, 5) == []
    finally:
        helpers.reap(launcher)
    certificates = _ca_certificates(scratch)
    assert len(certificates) == len(PARTIES)  # the kits are there ...
    assert _ca_keys(scratch, certificates) == []  # ... but not the CA's key
    launches = list(scratch.iterdir())
    assert len(launches) == 1 and _modes(launches[0]) == {}  # and only the user can read them


@linux_only
def test_the_next_launch_sweeps_a_dead_launchers_leftovers_and_leaves_a_live_ones_alone(scratch, tmp_path):
    live, live_pids, live_ready = _start_launcher(tmp_path, "live", KEEPING_PARTY)
    try:
        dead, dead_pids, dead_ready = _start_launcher(tmp_path, "dead", KEEPING_PARTY)
        try:
            _wait_ready(live, live_ready)
            _wait_ready(dead, dead_ready)
            dead.kill()
            dead.wait()
            assert _wait_dead(dead_pids, 5) == []
        finally:
            helpers.reap(dead)
        before = {p.name: _tree(p)[1] for p in scratch.iterdir()}
        assert len(before) == 2 and all(files for files in before.values())
        live_dir = [n for n in before if n.startswith(f"fedproto-launch-{live.pid}-")]
        assert len(live_dir) == 1, sorted(before)

        launch_local(PARTIES, lambda party, roster, fd: _python("pass"), timeout_s=60)

        assert sorted(p.name for p in scratch.iterdir()) == live_dir  # the dead one's went
        assert _tree(scratch / live_dir[0])[1] == before[live_dir[0]]  # the live one's all there
        assert all(_alive(pid) for pid in live_pids)
    finally:
        helpers.reap(live)
    assert _wait_dead(live_pids, 5) == []


# --- the command line ------------------------------------------------------------------------------------------


@linux_only
def test_sigkill_of_a_tcp_run_leaves_no_kit_no_ca_key_and_no_data_part(tmp_path, scratch):
    """``fedproto run fastlloyd --data s1 --transport tcp``: the parties give up their kits and data
    parts once loaded; the run is then SIGKILLed and nothing of it is left on disk."""
    cmd = [*FEDPROTO, "run", "fastlloyd", "--data", "s1", "--clients", "2", "--transport", "tcp",
           "--iterations", "400", "--no-plot"]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    parties: list[int] = []
    kits_seen: set[Path] = set()
    parts_seen: set[Path] = set()
    wrong_modes: dict[str, int] = {}
    try:
        limit = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"the run ended before the test could kill it: {proc.stderr.read().decode()}"
            assert time.monotonic() < limit, f"the parties did not all start and load their kits: {sorted(kits_seen)}"
            parties = _children(proc.pid)
            kits = set(scratch.glob("fedproto-launch-*/*/roster.json"))
            kits_seen |= kits
            parts_seen |= set(scratch.glob("fedproto-launch-*/*/data.npz"))  # each client's, beside its kit
            for launch in scratch.iterdir():
                with contextlib.suppress(FileNotFoundError):  # a party may remove its kit meanwhile
                    wrong_modes.update(_modes(launch))
            if len(parties) == len(PARTIES) and len(kits_seen) == len(PARTIES) and not kits:
                break  # every party runs and has loaded (and given up) its kit and data part
            time.sleep(0.01)
        certificates = _ca_certificates(scratch)  # none left by now
        processes = list(_process_tree(proc.pid))  # the parties, and a fork server if any
        proc.kill()  # SIGKILL: no handler, no cleanup code runs
        proc.wait()
        assert _wait_dead(processes, 5) == []
    finally:
        helpers.reap(proc)
    assert len(parts_seen) == len(PARTIES) - 1 and wrong_modes == {}  # private while they were there
    assert _ca_keys(scratch, certificates) == []
    launches = list(scratch.iterdir())
    assert launches and all(p.name.startswith("fedproto-launch-") for p in launches)
    for launch in launches:  # the launcher's (kits, data parts) and the run's (party reports)
        assert _tree(launch) == ([], []), _tree(launch)
        assert _modes(launch) == {}


# --- the pieces ------------------------------------------------------------------------------------------------


def _kit(root: Path) -> Path:
    kit = root / "kit"
    kit.mkdir()
    (kit / "roster.json").write_text("{}")
    return kit


def test_a_party_discards_only_the_kit_its_launcher_marked(tmp_path, monkeypatch):
    from fedproto.launcher import KIT_ENV, discard_launched_kit

    own = _kit(tmp_path)
    monkeypatch.delenv(KIT_ENV, raising=False)
    assert not discard_launched_kit(own / "roster.json") and own.exists()  # run by its operator: kept
    monkeypatch.setenv(KIT_ENV, str(tmp_path))  # a variable naming another directory: kept
    assert not discard_launched_kit(own / "roster.json") and own.exists()
    monkeypatch.setenv(KIT_ENV, str(tmp_path / "gone"))
    assert not discard_launched_kit(own / "roster.json") and own.exists()
    monkeypatch.setenv(KIT_ENV, str(own))
    assert discard_launched_kit(own / "roster.json") and not own.exists()
    assert KIT_ENV not in os.environ  # once: not passed on to what the party starts


@linux_only
def test_the_sweep_judges_each_directory_by_its_launcher(tmp_path):
    from fedproto import _launch_dir

    here = _launch_dir._this_launcher()
    pid, start, namespace = (int(x) for x in here.split("-"))
    finished = subprocess.Popen(["true"])
    finished.wait()
    names = {
        "mine": f"fedproto-launch-{here}-abc",  # this process: alive
        "dead": f"fedproto-launch-{finished.pid}-{start}-{namespace}-abc",  # its process is gone
        "reused": f"fedproto-launch-{pid}-{start + 1}-{namespace}-abc",  # the id now names another process
        "elsewhere": f"fedproto-launch-{finished.pid}-{start}-{namespace + 1}-abc",  # another PID namespace
        "other": f"fedproto-tls-{finished.pid}-{start}-{namespace}-abc",  # not a launch directory
    }
    for name in names.values():
        (tmp_path / name).mkdir(mode=0o700)
        (tmp_path / name / "roster.json").write_text("{}")
    target = tmp_path / "target"
    target.mkdir()
    (target / "kept.txt").write_text("not a launch's")
    (tmp_path / f"fedproto-launch-{finished.pid}-{start}-{namespace}-link").symlink_to(target)

    removed = _launch_dir.sweep(tmp_path)

    assert sorted(p.name for p in removed) == sorted([names["dead"], names["reused"]])
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([names["mine"], names["elsewhere"], names["other"], "target",
                           f"fedproto-launch-{finished.pid}-{start}-{namespace}-link"])
    assert (target / "kept.txt").exists()

"""The fork server (fedproto._fork_server): parties forked from a process that has imported fedproto
are started, fed, reported and stopped as fresh processes are, and none outlives its launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedproto._fork_server import ForkServer
from fedproto.launcher import LaunchError, launch_local
from fedproto.testing import load_file

helpers = load_file(Path(__file__).with_name("_helpers.py"), "tests_helpers")
_alive, _wait_dead = helpers.alive, helpers.wait_dead

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open"), reason="fork server is Linux only"
)

#: A party module: reports what it was given, then does what its first argument says.
PARTY = """\
import json, os, socket, sys, time
import numpy as np
mode, party = sys.argv[1], sys.argv[2]
listen_fd = int(sys.argv[3]) if len(sys.argv) > 3 else None
if listen_fd is not None:  # the inherited listening socket works under the number the command names
    with socket.socket(fileno=listen_fd) as s:
        listening = s.getsockname()[1]
        s.detach()
else:
    listening = None
print(json.dumps({
    "party": party, "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "argv": sys.argv,
    "kit": os.environ.get("FEDPROTO_LAUNCH_KIT"), "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
    "listening": listening, "random": int(np.random.randint(2**62)), "name": __name__,
}), flush=True)
print(f"{party} on stderr", file=sys.stderr)
if mode == "exit3":
    sys.exit(3)
if mode == "raise":
    raise RuntimeError(f"{party} broke")
if mode == "sleep":
    time.sleep(600)
"""


@pytest.fixture
def party_dir(tmp_path):
    (tmp_path / "fork_party.py").write_text(PARTY)
    return tmp_path


@pytest.fixture
def server(party_dir):
    forks = ForkServer.start(cwd=party_dir)
    assert forks is not None
    try:
        yield forks
    finally:
        forks.close()


def _report(outcome) -> dict:
    return json.loads(outcome.stdout.splitlines()[0])


def test_forked_parties_get_their_own_streams_environment_socket_and_exit_status(party_dir, server):
    outcomes = launch_local(
        ["a", "b", "c"], lambda party, roster, fd: [sys.executable, "-m", "fork_party", "ok", party, str(fd)],
        timeout_s=60, cwd=party_dir, fork_server=server,
    )
    reports = {p: _report(o) for p, o in outcomes.items()}
    for party, report in reports.items():
        assert report["ppid"] == server.pid  # forked by the server, not a fresh interpreter
        assert report["name"] == "__main__" and report["argv"][1:3] == ["ok", party]
        assert report["cwd"] == str(party_dir)
        assert Path(report["kit"]).name.startswith("kit-")  # its own kit directory
        assert report["listening"] > 0 and {0, 1, 2, int(report["argv"][3])} < set(report["fds"])
        assert len(report["fds"]) == 5  # and the one listing /proc/self/fd: nothing else leaked
        assert outcomes[party].stderr.startswith(f"{party} on stderr")
    assert len({r["kit"] for r in reports.values()}) == 3
    assert len({r["random"] for r in reports.values()}) == 3  # NumPy's generator reseeded in each
    for mode, status, last in [("exit3", 3, "a on stderr"), ("raise", 1, "RuntimeError: a broke")]:
        outcome = launch_local(
            ["a"], lambda party, roster, fd: [sys.executable, "-m", "fork_party", mode, party],
            timeout_s=60, cwd=party_dir, fork_server=server, tls=False, check=False,
        )["a"]
        assert (outcome.returncode, outcome.last_line(), outcome.stopped) == (status, last, False)


def test_a_command_the_server_cannot_run_starts_a_fresh_process(party_dir, server):
    commands = {
        "a": [sys.executable, "-m", "fork_party", "ok", "a"],
        "b": [sys.executable, str(party_dir / "fork_party.py"), "ok", "b"],  # a script: not forked
    }
    outcomes = launch_local(
        ["a", "b"], lambda party, roster, fd: commands[party],
        timeout_s=60, cwd=party_dir, fork_server=server, tls=False,
    )
    reports = {p: _report(o) for p, o in outcomes.items()}
    assert reports["a"]["ppid"] == server.pid
    assert reports["b"]["ppid"] == os.getpid()
    assert not server.can_fork([sys.executable, "-m", "fork_party"], {**os.environ, "PYTHONPATH": "/elsewhere"})
    assert not server.can_fork([sys.executable, "-m", "fork_party"], dict(os.environ), cwd="/")


def test_the_timeout_stops_forked_parties_deaf_or_not(party_dir, server):
    started = time.monotonic()
    with pytest.raises(LaunchError, match="did not finish within 2 s") as caught:
        launch_local(
            ["a", "b"], lambda party, roster, fd: [sys.executable, "-m", "fork_party", "sleep", party],
            timeout_s=2, cwd=party_dir, fork_server=server, tls=False,
        )
    assert time.monotonic() - started < 2 + 5 + 5
    assert {p: (o.returncode, o.stopped) for p, o in caught.value.outcomes.items()} == {
        "a": (-signal.SIGTERM, True), "b": (-signal.SIGTERM, True),
    }


def test_closing_the_server_kills_what_it_still_runs(party_dir):
    forks = ForkServer.start(cwd=party_dir)
    child = forks.spawn([sys.executable, "-m", "fork_party", "sleep", "a"], env=dict(os.environ), cwd=party_dir)
    assert json.loads(child.stdout.readline())["ppid"] == forks.pid
    assert child.poll() is None
    forks.close()
    assert child.returncode == -signal.SIGKILL
    assert not _alive(child.pid) and not _alive(forks.pid)
    child.stdout.close()
    child.stderr.close()


# --- no process outlives the launcher ---------------------------------------------------------------------

#: A launcher with a fork server (``zygote``: this very process forked) and two sleeping parties;
#: writes every pid (the server's first) to argv[1] once all run.
LAUNCHER = """\
import json, os, sys
from fedproto._fork_server import ForkServer
from fedproto.launcher import launch_local

pid_file, zygote = sys.argv[1], sys.argv[2] == "zygote"
forks = ForkServer.start(zygote=zygote)
assert forks is not None and forks.can_fork([sys.executable, "-m", "fork_party"], os.environ)

def started(pids):
    with open(pid_file + ".tmp", "w") as f:
        json.dump([forks.pid, *pids.values()], f)
    os.rename(pid_file + ".tmp", pid_file)

launch_local(["a", "b"], lambda party, roster, fd: [sys.executable, "-m", "fork_party", "sleep", party],
             timeout_s=120, on_started=started, fork_server=forks, tls=False)
"""


@pytest.mark.parametrize("kind", ["zygote", "fresh"])
def test_nothing_outlives_a_launcher_killed_outright(party_dir, kind):
    pid_file = party_dir / "pids.json"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(pid_file), kind], cwd=party_dir, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, env={**os.environ, "TMPDIR": str(party_dir)},
    )
    pids: list[int] = []
    try:
        helpers.wait_while_running(launcher, pid_file.exists, "the launcher did not start its parties")
        pids = json.loads(pid_file.read_text())
        assert len(pids) == 3 and all(_alive(pid) for pid in pids)
        assert _parent(pids[0]) == launcher.pid and {_parent(p) for p in pids[1:]} == {pids[0]}
        server_is_a_copy = _cmdline(pids[0]) == _cmdline(launcher.pid)  # forked, not a fresh interpreter
        assert server_is_a_copy == (kind == "zygote")
        launcher.kill()  # SIGKILL: no handler, no cleanup code runs
        launcher.wait()
        assert _wait_dead(pids, 5) == []
    finally:
        helpers.reap(launcher)
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


#: A party module that says whether it found JAX imported, then runs a kernel.
JAX_PARTY = """\
import sys
imported = "jax" in sys.modules
import jax.numpy as jnp
print(imported, int(jnp.arange(4).sum()), flush=True)
"""


def _zygote_script(before: str) -> str:
    return textwrap.dedent(f"""\
        import json, os, sys
        import jax
        {before}
        from fedproto._fork_server import ForkServer
        with ForkServer.start(zygote=True) as forks:
            env = dict(os.environ)
            other = {{**env, "JAX_ENABLE_X64": "1"}}  # read by JAX at its import: not for this server
            command = [sys.executable, "-m", "jax_party"]
            facts = {{"forks": forks.can_fork(command, env), "forks_other_jax_env": forks.can_fork(command, other)}}
            # (read once it has answered: a fresh server starts behind a parent-death shim)
            cmdline = open(f"/proc/{{forks.pid}}/cmdline", "rb").read().split(b"\\0")
            facts["server"] = cmdline[1:3] == [b"-m", b"fedproto._fork_server"]
            print(json.dumps(facts))
            if forks.can_fork(command, env):
                child = forks.spawn(command, env=env)
                assert child.wait(60) == 0
                print(child.stdout.read().decode().strip())
    """)


def test_a_zygote_holds_jax_imported_and_its_children_skip_the_import(party_dir):
    """JAX imported but no backend started (as ``fedproto run`` is once it has parsed its options):
    the launcher forks itself, and a child finds JAX imported and runs a kernel."""
    (party_dir / "jax_party.py").write_text(JAX_PARTY)
    done = subprocess.run([sys.executable, "-c", _zygote_script("")], cwd=party_dir, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    facts, child = done.stdout.strip().splitlines()
    assert json.loads(facts) == {"server": False, "forks": True, "forks_other_jax_env": False}
    assert child == "True 6"


def test_a_zygote_is_refused_once_jax_has_started_a_backend(party_dir):
    """After a device query (JAX's thread pools run): a fresh interpreter serves instead, without
    JAX, so it forks commands whatever their ``JAX_*`` variables."""
    (party_dir / "jax_party.py").write_text(JAX_PARTY)
    done = subprocess.run([sys.executable, "-c", _zygote_script("jax.devices()")], cwd=party_dir,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    facts, child = done.stdout.strip().splitlines()
    assert json.loads(facts) == {"server": True, "forks": True, "forks_other_jax_env": True}
    assert child == "False 6"


def test_a_server_that_starts_a_jax_backend_while_importing_forks_nothing(party_dir):
    (party_dir / "starts_jax.py").write_text("import jax\njax.devices()\n")
    with ForkServer.start(preload=["starts_jax"], cwd=party_dir, env={**os.environ, "PYTHONPATH": str(party_dir)}) as forks:
        assert not forks.can_fork([sys.executable, "-m", "fork_party"], os.environ, party_dir)


def test_the_cli_forks_its_tcp_parties_from_a_zygote(tmp_path):
    """``fedproto run --transport tcp`` as a process: its parties are forked by a copy of itself
    (so the launcher and the server are parent and child), and give the run's result."""
    tutorial = Path(__file__).resolve().parents[1] / "docs" / "tutorial" / "secure_sum.py"
    report = tmp_path / "run.json"
    done = subprocess.run(
        [sys.executable, "-m", "fedproto", "-v", "run", str(tutorial), "--transport", "tcp", "--no-plot", "--quiet",
         "--report", str(report)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(report.read_text())["status"] == "completed"
    lines = [line for line in done.stderr.splitlines() if line.startswith("[server]")]
    assert lines and len(lines) == len(set(lines))  # its log lines once: no handler copied from the launcher


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])

"""Start every party of a run as its own OS process on loopback, and stop them all.

:func:`launch_local` is what ``fedproto run ... --transport tcp`` and the TCP examples use, and
what a user's own script can use::

    from fedproto.launcher import launch_local

    outcomes = launch_local(
        ["server", "client-0", "client-1"],
        lambda party, roster_path, listen_fd: [
            sys.executable, "my_party.py", "--party", party,
            "--roster", str(roster_path), "--listen-fd", str(listen_fd),
        ],
        timeout_s=120,
    )
    print(outcomes["server"].stdout)

Theory of operation:

* **No port race.** The launcher binds one listening TCP socket per party on 127.0.0.1 port 0
  (the kernel picks a free port and the socket keeps it), writes those addresses into the roster,
  and hands each socket to its party's process (``pass_fds``; the child is told the descriptor's
  number). The child listens on the inherited socket (``TcpNetwork.from_roster(roster,
  listen_fds={party: fd})``), so no port is ever released and re-bound. Connections that arrive
  before the child accepts wait in the socket's backlog.
* **Star or mesh.** With ``topology="star"`` only the hub (the first party) gets a socket and an
  address in the roster; the other parties are started with ``listen_fd=None`` and dial out to
  the hub. The default, ``"mesh"``, gives every party both (and so keeps ``listen_fd`` an int for
  commands written before the star existed).
* **Roster and TLS kits.** By default (``tls=True``) the launcher makes a throwaway federation
  in memory (:func:`fedproto.provision.ephemeral_credentials`: a fresh CA that signs one key and
  certificate per party, valid for the launch's timeout and a day, and whose own key is then
  dropped, never written anywhere) and writes one kit per party (:func:`fedproto.provision.write_kit`:
  the CA certificate, the party's certificate and key, and a ``roster.json`` naming them and the
  addresses), so the parties run mutual TLS 1.3 with no setup by the user. (The kits all belong
  to the launcher's user, so on this one host the separation of keys is by convention.) With
  ``tls=False`` each party's ``roster.json`` holds the same fresh 32-byte secret instead (the
  shared-secret handshake, for ``--insecure-shared-secret`` parties).
* **Files.** Everything the launcher writes lies in one private launch directory (mode 0700,
  every file 0600) in the temporary directory, named after the launcher's process id and start
  time, with one directory per party (``roster_path``'s directory) holding only that party's
  files. Each child is told its own directory in ``FEDPROTO_LAUNCH_KIT`` and removes it once it
  has loaded it (:func:`discard_launched_kit`; ``fedproto party`` does so when its endpoint is
  open), so once every party has started the launch directory is empty. Everything is removed
  when the launch ends; a launcher killed outright leaves at most an empty directory, or, if a
  party had not yet loaded its kit, files only its user can read, and the next launch removes
  what dead launchers left (see :mod:`fedproto._launch_dir`: a live launcher's files are never
  touched).
* **Waiting.** Every child's stdout and stderr are read by threads (no pipe can fill up and
  block a child). The launcher polls the children every 20 ms; the first one that exits with a
  non-zero status, or the timeout, stops all others.
* **Stopping.** Children get SIGTERM, and SIGKILL if they are still alive 2 s later, so all are
  gone within 5 s. While launching (and only then; the previous handlers are restored after),
  SIGINT and SIGTERM to the launcher stop every child the same way, remove the temporary
  directory and raise :class:`LaunchInterrupted`.
* **Orphans.** On Linux every child first asks the kernel for SIGKILL when the launcher dies
  (``prctl(PR_SET_PDEATHSIG)``, made by a few lines of isolated Python that then ``exec`` the
  party's command in the same process; a ``preexec_fn`` would run Python between fork and exec
  in a launcher that JAX has made multithreaded), so even a launcher killed with SIGKILL leaves
  no party behind. The request is tied to the thread that started the child: call
  :func:`launch_local` from a thread that outlives the launch (normally the main thread). On
  other systems this guarantee is absent; the handlers above still cover ordinary termination.
* **Forked parties.** With ``fork_server`` (a :class:`fedproto._fork_server.ForkServer`, which
  ``fedproto run`` starts before it loads data or makes keys), a party whose command is
  ``python -m MODULE ...`` is forked by that server instead of started as a fresh interpreter
  that imports everything again; the server reports its exit status and signals it on request,
  it dies with the server, and the server with the launcher. Everything above holds as is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from fedproto._fork_server import ForkServer
from fedproto._launch_dir import KIT_ENV, discard_launched_kit, launch_directory
from fedproto.errors import FedProtoError
from fedproto.roster import Roster

__all__ = [
    "KIT_ENV", "PartyOutcome", "LaunchError", "LaunchInterrupted", "discard_launched_kit", "launch_directory",
    "launch_local",
]

#: Seconds between SIGTERM and SIGKILL when stopping children.
TERMINATE_GRACE_S = 2.0
_POLL_S = 0.02
_READER_JOIN_S = 2.0


@dataclasses.dataclass(frozen=True)
class PartyOutcome:
    """How one party's process ended.

    Attributes:
        party: the party's name.
        returncode: the process's exit status (negative: killed by that signal).
        stdout: everything it wrote to stdout (text, undecodable bytes replaced).
        stderr: everything it wrote to stderr.
        stopped: the launcher stopped it (another party failed, the timeout passed, or the launcher
            was interrupted) rather than it ending by itself.
    """

    party: str
    returncode: int
    stdout: str
    stderr: str
    stopped: bool = False

    @property
    def ok(self) -> bool:
        """Whether it ended by itself with status 0."""
        return self.returncode == 0 and not self.stopped

    def last_line(self) -> str:
        """The last non-empty line of stderr (an error's one-line message), else the status."""
        lines = [line.strip() for line in self.stderr.splitlines() if line.strip()]
        if lines:
            return lines[-1]
        if self.returncode < 0:
            try:
                return f"killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"killed by signal {-self.returncode}"
        return f"exit status {self.returncode}"


class LaunchError(FedProtoError):
    """A launched party failed or the run did not finish in time.

    Attributes:
        party: the first party that failed, or ``None`` (timeout).
        outcomes: ``{party: PartyOutcome}`` of every party, in roster order.
        timed_out: the timeout passed.
    """

    def __init__(self, message: str, *, outcomes: Mapping[str, PartyOutcome], party: str | None = None,
                 timed_out: bool = False) -> None:
        super().__init__(message)
        self.party = party  # not in the message's suffix: the message already names it
        self.outcomes = dict(outcomes)
        self.timed_out = timed_out


class LaunchInterrupted(Exception):
    """SIGINT or SIGTERM reached the launcher; every party was stopped.

    Args:
        signum: the signal received.
        note: added to the message (e.g. ``"; report written to run.json"``).

    Attributes:
        signum: the signal received.
    """

    def __init__(self, signum: int, *, note: str = "") -> None:
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}; every party was stopped{note}")


# --- children die with the launcher ---------------------------------------------------------------


#: Runs first in every child on Linux: ask the kernel for SIGKILL when the launcher dies, make
#: sure it has not died already, then become the party's own program (same process, same pid).
_PDEATHSIG_SHIM = """\
import ctypes, os, signal, sys
if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
os.execvp(sys.argv[2], sys.argv[2:])
"""


def _with_parent_death_signal(argv: list[str]) -> list[str]:
    """``argv`` started through :data:`_PDEATHSIG_SHIM` where Linux offers ``PR_SET_PDEATHSIG``.

    The request is made in the child, after it started, by a tiny isolated interpreter that then
    ``exec``s ``argv``: no Python code runs between fork and exec in this (possibly
    multithreaded: JAX, rich) process, which a ``preexec_fn`` would need.
    """
    if not sys.platform.startswith("linux") or not sys.executable:
        return argv
    return [sys.executable, "-I", "-S", "-c", _PDEATHSIG_SHIM, str(os.getpid()), *argv]


def _check_program(argv: list[str], env: Mapping[str, str] | None, cwd: Any) -> None:
    """Raise FileNotFoundError here, as :class:`subprocess.Popen` would, when ``argv[0]`` cannot
    be run (the shim would otherwise report it from inside the child)."""
    if not argv:
        raise ValueError("the command of a party is empty")
    program = argv[0]
    if os.sep in program and cwd is not None and not os.path.isabs(program):
        program = os.path.join(cwd, program)
    if shutil.which(program, path=(env if env is not None else os.environ).get("PATH")) is None:
        raise FileNotFoundError(errno.ENOENT, "no such program", argv[0])


# --- reading a child's output ---------------------------------------------------------------------


class _Reader(threading.Thread):
    """Reads one pipe to its end (so the child never blocks on a full pipe)."""

    def __init__(self, stream: Any, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._stream = stream
        self._chunks: list[bytes] = []

    def run(self) -> None:
        try:
            for chunk in iter(lambda: self._stream.read1(65536), b""):
                self._chunks.append(chunk)
        except (OSError, ValueError):
            pass  # the pipe was closed under us while stopping

    def text(self) -> str:
        return b"".join(self._chunks).decode("utf-8", errors="replace")


@dataclasses.dataclass
class _Child:
    party: str
    process: Any  # a subprocess.Popen, or a fedproto._fork_server.ForkedProcess
    readers: tuple[_Reader, _Reader]
    stopped: bool = False


# --- signals ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _catch_signals(received: list[int]) -> Iterator[None]:
    """While inside, SIGINT/SIGTERM are recorded in ``received`` instead of acting.

    Only the main thread can install handlers; elsewhere nothing is installed (the signals keep
    their usual effect).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# --- the launcher -----------------------------------------------------------------------------------


def launch_local(
    parties: Sequence[str],
    command: Callable[[str, Path, int | None], Sequence[str]],
    *,
    timeout_s: float,
    session: int | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    check: bool = True,
    on_started: Callable[[Mapping[str, int]], None] | None = None,
    tls: bool = True,
    topology: str = "mesh",
    fork_server: ForkServer | None = None,
) -> dict[str, PartyOutcome]:
    """Run every party as its own process on loopback, each listening on a socket bound for it.

    See the module docstring for how ports, the roster, waiting and stopping work.

    Args:
        parties: every party, in roster order (unique names).
        command: ``(party, roster_path, listen_fd) -> argv`` of one party's process; the child
            inherits the listening socket as descriptor ``listen_fd`` and should serve on it
            (``TcpNetwork.from_roster(Roster.load(roster_path), listen_fds={party: listen_fd})``);
            in a star, ``listen_fd`` is ``None`` for every party but the hub. ``roster_path`` is
            that party's own kit's roster; its directory (mode 0700) is the party's alone, and
            a file the caller puts there for the party (mode 0600, e.g. its data part) goes
            with the kit. The child should call :func:`discard_launched_kit` with
            ``roster_path`` once it has loaded its kit (``fedproto party`` does).
        timeout_s: seconds the whole run may take (finite, > 0); then every party is stopped.
        session: written into the roster (``None``: the roster fixes no session).
        env: variables added to this process's environment for the children (and
            ``FEDPROTO_LAUNCH_KIT``, naming each child's own kit directory).
        cwd: working directory of the children (default: this process's).
        check: raise :class:`LaunchError` when a party fails or the timeout passes (``False``:
            return the outcomes anyway).
        on_started: called with ``{party: pid}`` once every process has started.
        tls: a throwaway TLS kit per party (default; the CA's key is never written);
            ``False``: each party's roster holds the same fresh shared secret instead.
        topology: ``"mesh"`` (every party listens) or ``"star"`` (only the first party does),
            written into the roster.
        fork_server: forks every party whose command it can run (``[sys.executable, "-m",
            MODULE, ...]``: :meth:`fedproto._fork_server.ForkServer.can_fork`) instead of
            starting a fresh interpreter; the caller starts and closes it. Everything else
            (the kits, the outcomes, stopping, the parent-death signal) is as without it.

    Returns:
        ``{party: PartyOutcome}`` in roster order.

    Raises:
        LaunchError: (``check=True``) a party exited with a non-zero status (the first one to do
            so is named, with the last line of its stderr) or the timeout passed.
        LaunchInterrupted: SIGINT or SIGTERM arrived while launching (main thread only).
        ValueError: no parties, duplicate names, a timeout that is not a positive number, or an
            unknown topology; with ``tls``, fewer than two parties or a name that cannot be a
            certificate name.
        OSError: a process could not be started (every started one is stopped first), or the
            launch directory could not be made or written.
    """
    parties = tuple(parties)
    if not parties or len(set(parties)) != len(parties):
        raise ValueError(f"launch_local needs unique party names, got {list(parties)}")
    if not (isinstance(timeout_s, int | float) and 0 < timeout_s < float("inf")):
        raise ValueError(f"timeout_s must be a positive finite number of seconds, got {timeout_s!r}")
    if topology not in ("star", "mesh"):
        raise ValueError(f"topology must be 'star' or 'mesh', got {topology!r}")
    listening = parties[:1] if topology == "star" else parties
    base_env = {**os.environ, **(env or {})}
    received: list[int] = []
    children: dict[str, _Child] = {}
    listeners: dict[str, socket.socket] = {}
    started = time.monotonic()
    timed_out = False
    first_failure: str | None = None
    with _catch_signals(received), launch_directory() as tmp:
        try:
            for party in listening:
                listeners[party] = socket.create_server(("127.0.0.1", 0), backlog=128)
            addresses = {p: f"127.0.0.1:{s.getsockname()[1]}" for p, s in listeners.items()}
            roster_paths = _write_kits(parties, addresses, tmp, timeout_s, session, topology, tls)
            for party in parties:
                if received:
                    break
                fd = listeners[party].fileno() if party in listeners else None
                argv = [str(a) for a in command(party, roster_paths[party], fd)]
                child_env = {**base_env, KIT_ENV: str(roster_paths[party].parent)}
                process: Any
                if fork_server is not None and fork_server.can_fork(argv, child_env, cwd):
                    process = fork_server.spawn(argv, env=child_env, cwd=cwd, listen_fd=fd)
                else:
                    _check_program(argv, child_env, cwd)
                    process = subprocess.Popen(
                        _with_parent_death_signal(argv),
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        pass_fds=() if fd is None else (fd,),
                        env=child_env,
                        cwd=cwd,
                    )
                # The child holds its own copy; ours would keep accepting into the backlog after
                # the child died, so a peer would wait for a handshake instead of being refused.
                if fd is not None:
                    listeners.pop(party).close()
                readers = (
                    _Reader(process.stdout, f"fedproto-launch-{party}-stdout"),
                    _Reader(process.stderr, f"fedproto-launch-{party}-stderr"),
                )
                for reader in readers:
                    reader.start()
                children[party] = _Child(party, process, readers)
            if on_started is not None and not received:
                on_started({p: c.process.pid for p, c in children.items()})
            deadline = started + timeout_s
            while not received:
                running = [c for c in children.values() if c.process.poll() is None]
                failed = [c for c in children.values() if c.process.returncode not in (None, 0)]
                if failed:
                    first_failure = failed[0].party
                    break
                if not running:
                    break
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
                if fork_server is not None:
                    fork_server.pump(_POLL_S)  # returns as soon as a forked party ends
                else:
                    time.sleep(_POLL_S)
        finally:
            for listener in listeners.values():
                listener.close()
            _stop(children.values())
            for child in children.values():
                for reader in child.readers:
                    reader.join(_READER_JOIN_S)
                for pipe in (child.process.stdout, child.process.stderr):
                    if pipe is not None:
                        pipe.close()
    if received:
        raise LaunchInterrupted(received[0])
    outcomes = {
        party: PartyOutcome(
            party,
            child.process.returncode,
            child.readers[0].text(),
            child.readers[1].text(),
            child.stopped,
        )
        for party, child in children.items()
    }
    if check:
        if first_failure is not None:
            outcome = outcomes[first_failure]
            message = outcome.last_line().removeprefix("fedproto: error: ").removeprefix("fedproto: ")
            raise LaunchError(f"party {first_failure} failed: {message}", outcomes=outcomes, party=first_failure)
        if timed_out:
            late = [p for p, o in outcomes.items() if o.stopped]
            raise LaunchError(
                f"the run did not finish within {timeout_s:g} s (still running: {', '.join(late)})",
                outcomes=outcomes,
                timed_out=True,
            )
    return outcomes


def _write_kits(
    parties: tuple[str, ...], addresses: Mapping[str, str], directory: Path, timeout_s: float,
    session: int | None, topology: str, tls: bool,
) -> dict[str, Path]:
    """Write one kit per party into ``directory/kit-<i>/`` (mode 0700, files 0600) and return
    ``{party: its roster's path}``: a throwaway federation's TLS files (the CA key is never
    written), or with ``tls=False`` a roster holding one fresh secret.

    Raises:
        ValueError: with ``tls``, fewer than two parties or a name that cannot be a certificate name.
    """
    kits = {p: directory / f"kit-{i}" for i, p in enumerate(parties)}
    if tls:
        from fedproto.provision import ephemeral_credentials, write_kit

        if len(parties) < 2:
            raise ValueError(f"a federation needs at least two parties, got {list(parties)}")
        valid_days = math.ceil(timeout_s / 86400) + 1  # outlives the launch: links may be re-dialled
        credentials = ephemeral_credentials(parties, valid_days=valid_days)  # the CA key stays here
        return {
            p: write_kit(
                kits[p], credentials[p], parties, addresses, session=session, topology=topology,
                certificate_mode=0o600,
            )
            for p in parties
        }
    roster = Roster.create(addresses, session=session, parties=parties, topology=topology)
    for kit in kits.values():
        kit.mkdir(mode=0o700)
    return {p: roster.save(kit / "roster.json") for p, kit in kits.items()}


def _stop(children: Any) -> None:
    """SIGTERM every child still running, SIGKILL the ones alive after the grace period, reap all."""
    running = [c for c in children if c.process.poll() is None]
    for child in running:
        child.stopped = True
        with contextlib.suppress(ProcessLookupError):
            child.process.terminate()
    limit = time.monotonic() + TERMINATE_GRACE_S
    for child in running:
        try:
            child.process.wait(timeout=max(limit - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                child.process.kill()
    for child in running:
        child.process.wait()

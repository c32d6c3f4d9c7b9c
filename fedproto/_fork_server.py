"""Start ``python -m MODULE`` parties by forking one process that has already imported fedproto.

A fresh interpreter that imports fedproto, NumPy, trio and cryptography costs about half a
second of CPU; a TCP run on one machine started one per party (:mod:`fedproto.launcher`). A
:class:`ForkServer` pays it once: a server process imports them, then forks one child per party,
and each child runs its command (``runpy``, as ``python -m MODULE`` would) with its own
environment, working directory, standard streams and listening socket.

Theory of operation:

* **The server.** :meth:`ForkServer.start` forks the calling process itself when that is safe
  (``zygote=True``: the caller is single-threaded and JAX has started no backend; ``fedproto
  run`` does so right after parsing its command line, before it loads data, makes keys or shows
  progress), else starts a fresh interpreter (``python -m fedproto._fork_server``). Either way
  the server then imports ``preload``, closes every descriptor but its control socket and serves
  requests over that socket (``SOCK_SEQPACKET``, JSON, descriptors passed with ``SCM_RIGHTS``).
  It is single-threaded: it forks only from its own main thread.
* **JAX.** Importing JAX starts no thread; its backend (the CPU or GPU client, with its thread
  pools) starts at the first device query or kernel, and only then does JAX install its own
  warning against ``os.fork``. So a server may hold JAX imported, and a zygote copies it from a
  launcher that imported the protocol to parse its options: its children then skip importing
  JAX and the protocol (about 1 s of CPU each). A server in which a backend has started forks
  nothing (:func:`_jax_started`), and a zygote is not taken from such a caller.
* **A child.** Forked by the server, it asks the kernel for SIGKILL when the server dies
  (``PR_SET_PDEATHSIG``), gets the signal handlers a fresh interpreter has, its stdin from
  ``/dev/null``, stdout and stderr on the pipes the launcher made, the listening socket on the
  descriptor number its command names, every other descriptor closed, its environment, working
  directory and ``sys.argv``; NumPy's global generator is reseeded (Python's ``random`` is by
  itself at a fork). It runs the module as ``__main__`` and exits as an interpreter would: its
  ``SystemExit`` status, 1 with a traceback for an error, killed by SIGINT for an uncaught
  ``KeyboardInterrupt``; non-daemon threads are joined and ``atexit`` functions run first.
* **Exit statuses and signals.** Only the server can wait for its children: it reports each
  one's exit status (as :attr:`subprocess.Popen.returncode`: negative for a signal) to the
  launcher, and signals one only on the launcher's request and only while it has not reaped it,
  so a reused process id is never signalled.
* **No process left behind.** The server asks for SIGKILL when its own parent dies (a forked
  server itself; a fresh one through the launcher's parent-death shim), and every child when the
  server dies; so a launcher killed outright takes the server, and the server its children.
  When the launcher closes the socket (:meth:`ForkServer.close`, or its exit) the server kills
  the children still running, waits for them and exits. Linux only (``PR_SET_PDEATHSIG``,
  ``pidfd_open``): elsewhere :meth:`ForkServer.start` returns ``None`` and parties are started
  as fresh processes.
* **What is forked.** Only a command ``[sys.executable, "-m", MODULE, ...]`` whose ``PYTHON*``
  environment variables are the server's (they shape an interpreter before any code runs):
  :meth:`ForkServer.can_fork`. Anything else is for ``subprocess``.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ForkServer", "ForkedProcess", "DEFAULT_PRELOAD"]

#: What a server imports before forking: everything a ``fedproto party`` over TCP needs but the
#: protocol and JAX (a zygote has those already where its launcher had imported them).
DEFAULT_PRELOAD = (
    "fedproto.cli", "fedproto.transports.tcp", "fedproto.transports._tls", "fedproto.provision", "fedproto.roster",
    "msgpack", "numpy", "numpy.random", "trio", "ssl", "encodings.idna", "cryptography.x509",
    "cryptography.hazmat.backends.openssl.backend", "cryptography.hazmat.primitives.asymmetric.ec",
)
_MAX_MESSAGE = 1 << 20
_PR_SET_PDEATHSIG = 1


def _interpreter_environment(env: Mapping[str, str], prefixes: Sequence[str]) -> dict[str, str]:
    """The variables of ``env`` that shape what a child inherits before its command runs:
    ``PYTHON*`` (the interpreter) and, in a server that has imported JAX, ``JAX_*`` (read into
    JAX's configuration at its import)."""
    return {k: v for k, v in env.items() if k.startswith(tuple(prefixes))}


def _jax_started() -> bool:
    """Whether JAX has started a backend in this process (from then on its threads make a fork
    unsafe). A JAX whose backend state cannot be read counts as started."""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except Exception:  # another JAX, or not JAX at all: assume the worst
        return True


def _parent_death_signal(parent: int) -> None:
    """SIGKILL this process when ``parent`` dies; exit at once if it already has."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        os._exit(70)
    if os.getppid() != parent:
        os._exit(70)


def _keep_only(keep: Mapping[int, int]) -> None:
    """Make the descriptors ``{target: source}`` and close every other one but 0, 1 and 2."""
    import fcntl

    above = max([*keep, *keep.values()]) + 1  # out of each other's way, then into place
    moved = {target: fcntl.fcntl(source, fcntl.F_DUPFD, above) for target, source in keep.items()}
    for target, source in moved.items():
        os.dup2(source, target)
    top = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536
    for fd in [int(name) for name in os.listdir("/proc/self/fd")] if os.path.isdir("/proc/self/fd") else range(top):
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


# --- the server -------------------------------------------------------------------------------------


def _serve(control: int, preload: Sequence[str]) -> None:
    """The server's loop (never returns): import ``preload``, then fork on request."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher handles a terminal's Ctrl-C
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    _keep_only({0: devnull, 1: devnull, 2: devnull, control: control})
    sock = socket.socket(fileno=control)
    error = None
    try:
        for name in preload:
            __import__(name)
    except BaseException as exc:  # reported to the launcher, which then starts fresh processes
        error = f"cannot import {name}: {exc}"
    if error is None and _jax_started():
        error = "JAX has started a backend (a fork after it is unsafe)"
    if error is None and threading.active_count() > 1:
        error = "a thread is running (a fork copies only the forking one)"
    children: dict[int, tuple[int, int]] = {}  # pidfd -> (request id, pid)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)

    def send(message: dict[str, Any]) -> None:
        sock.send(json.dumps(message).encode())

    try:
        prefixes = ["PYTHON", "JAX_"] if "jax" in sys.modules else ["PYTHON"]
        send({"ready": error is None, "error": error, "pid": os.getpid(), "cwd": os.getcwd(),
              "prefixes": prefixes, "environment": _interpreter_environment(os.environ, prefixes)})
        while error is None:
            for fd, _ in poller.poll():
                if fd != sock.fileno():
                    ident, pid = children.pop(fd)
                    poller.unregister(fd)
                    os.close(fd)
                    _, status = os.waitpid(pid, 0)
                    send({"exited": ident, "returncode": os.waitstatus_to_exitcode(status)})
                    continue
                data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 8)
                if not data:
                    return  # the launcher is done (or gone)
                request = json.loads(data)
                if "signal" in request:
                    live = [pid for ident, pid in children.values() if ident == request["signal"]]
                    for pid in live:
                        os.kill(pid, request["signum"])
                    continue
                sys.stdout.flush()
                pid = os.fork()
                if pid == 0:
                    sock.close()
                    _child(request, fds)  # never returns
                for fd_ in fds:
                    os.close(fd_)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (request["spawn"], pid)
                poller.register(pidfd, select.POLLIN)
                send({"started": request["spawn"], "pid": pid})
    except OSError:
        pass  # the launcher is gone: end everything below
    finally:
        for ident, pid in children.values():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for ident, pid in children.values():
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
        os._exit(0)


def _child(request: Mapping[str, Any], fds: Sequence[int]) -> None:
    """A forked party: become ``python -m MODULE ARGS`` in this process, then exit (never returns)."""
    code = 1
    try:
        _parent_death_signal(request["server"])
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        stdin = os.open(os.devnull, os.O_RDONLY)
        keep = {0: stdin, 1: fds[0], 2: fds[1]}
        if request["listen_fd"] is not None:
            keep[request["listen_fd"]] = fds[2]
        _keep_only(keep)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        if sys.path and not sys.flags.isolated:
            sys.path[0] = request["cwd"]  # as ``python -m`` puts it there
        numpy_random = sys.modules.get("numpy.random")
        if numpy_random is not None:
            numpy_random.seed()  # fresh entropy, as a fresh interpreter's generator would have
        code = _run_module(request["module"], request["args"])
        threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads, as at exit
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _run_module(module: str, args: Sequence[str]) -> int:
    """Run ``module`` as ``__main__`` with ``args``; the status an interpreter would exit with."""
    import runpy
    import traceback

    sys.argv = [module, *args]  # runpy puts the module's file in sys.argv[0]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


# --- the launcher's side ----------------------------------------------------------------------------


class ForkedProcess:
    """A child of a :class:`ForkServer`, with the part of :class:`subprocess.Popen` a launcher uses.

    Attributes:
        pid: its process id.
        returncode: its exit status once the server reported it (negative: killed by that
            signal), else ``None``.
        stdout: the read end of its stdout pipe (binary).
        stderr: the read end of its stderr pipe (binary).
    """

    def __init__(self, server: ForkServer, ident: int, pid: int, stdout: Any, stderr: Any) -> None:
        self._server = server
        self._ident = ident
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """Its exit status, or ``None`` while it runs (never blocks)."""
        if self.returncode is None:
            self._server.pump(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to end; its exit status.

        Raises:
            subprocess.TimeoutExpired: ``timeout`` seconds passed first.
        """
        import time

        limit = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if limit is None else limit - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"party {self.pid}", timeout or 0)
            self._server.pump(left)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """Signal it (through the server, and only while it is not reaped)."""
        if self.returncode is None:
            self._server.signal(self._ident, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """A process that forks ``python -m MODULE`` parties from its already imported modules.

    Use :meth:`start` (``None`` where fork servers are not supported) and close it when done
    (a context manager); see the module docstring.
    """

    def __init__(self, sock: socket.socket, process: Any) -> None:
        self._sock = sock
        self._process = process  # a Popen, or the pid of a forked server
        self._hello: dict[str, Any] | None = None
        #: The server's process id.
        self.pid: int = process if isinstance(process, int) else process.pid
        self._children: dict[int, ForkedProcess] = {}
        self._next = 0
        self._closed = False
        self._gone = False
        self._pending: dict[int, int] = {}  # request id -> pid, between its start and spawn's return

    @classmethod
    def start(cls, preload: Sequence[str] = DEFAULT_PRELOAD, *, zygote: bool = False,
              env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None) -> ForkServer | None:
        """Start a server that has imported ``preload``, or return ``None`` where none can run.

        Args:
            preload: modules the server imports before forking (none that starts a JAX
                backend or a thread: the server then forks nothing).
            zygote: fork this very process when it is safe (single-threaded, no JAX backend
                started), instead of starting a fresh interpreter; call it from the main thread
                before any secret or data is loaded, as everything in memory is copied.
            env: the fresh interpreter's environment (default: this process's).
            cwd: the fresh interpreter's working directory (default: this process's).

        Returns:
            The server (it imports ``preload`` meanwhile; one that fails to then forks nothing:
            :meth:`can_fork` is false), or ``None``: not Linux or no ``pidfd_open``.

        Raises:
            OSError: the server could not be started.
        """
        if not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open") or not sys.executable:
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            if zygote and threading.active_count() == 1 and not _jax_started():
                process: Any = _fork_zygote(ours, theirs, preload)
            else:
                from fedproto.launcher import _with_parent_death_signal

                argv = [sys.executable, "-m", "fedproto._fork_server", str(theirs.fileno()), *preload]
                process = subprocess.Popen(
                    _with_parent_death_signal(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), env=env, cwd=cwd,
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return cls(ours, process)

    def _ready(self) -> bool:
        """Whether the server has imported its preload and serves (waits for its first word, which
        comes after the imports: :meth:`start` does not wait, so they overlap the caller's work)."""
        if self._hello is None:
            try:
                self._hello = json.loads(self._sock.recv(_MAX_MESSAGE) or b"{}")
            except (OSError, ValueError):
                self._hello = {}
            if not self._hello.get("ready"):
                self._gone = True  # it has ended: fresh processes from now on
        return not self._gone

    def can_fork(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | os.PathLike[str] | None = None) -> bool:
        """Whether ``argv`` run with ``env`` in ``cwd`` is a command this server forks: ``python -m``
        with the server's interpreter, ``PYTHON*`` variables (and ``JAX_*`` where the server has
        imported JAX) and working directory."""
        if self._closed or len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m" or not self._ready():
            return False
        assert self._hello is not None
        return (
            _interpreter_environment(env, self._hello["prefixes"]) == self._hello["environment"]
            and os.path.realpath(cwd if cwd is not None else os.getcwd()) == os.path.realpath(self._hello["cwd"])
        )

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | os.PathLike[str] | None = None,
              listen_fd: int | None = None) -> ForkedProcess:
        """Fork ``argv`` (``[sys.executable, "-m", MODULE, *args]``: :meth:`can_fork`).

        Args:
            argv: the command.
            env: its whole environment.
            cwd: its working directory (default: this process's).
            listen_fd: a descriptor of this process the child gets under the same number.

        Raises:
            OSError: the server has ended.
        """
        if not self.can_fork(argv, env, cwd):
            raise ValueError(f"the fork server cannot run {list(argv)[:3]}")
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ident = self._next = self._next + 1
        request = {
            "spawn": ident, "server": self.pid, "module": argv[2], "args": list(argv[3:]), "env": dict(env),
            "cwd": os.fspath(cwd if cwd is not None else os.getcwd()), "listen_fd": listen_fd,
        }
        fds = [out_w, err_w] + ([] if listen_fd is None else [listen_fd])
        try:
            socket.send_fds(self._sock, [json.dumps(request).encode()], fds)
            while ident not in self._pending:
                if self._gone:
                    raise OSError(f"the fork server ended before it started {argv[2]}")
                self.pump(None)
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        child = ForkedProcess(self, ident, self._pending.pop(ident), open(out_r, "rb"), open(err_r, "rb"))
        self._children[ident] = child
        return child

    def signal(self, ident: int, signum: int) -> None:
        """Ask the server to send ``signum`` to its child ``ident`` if it has not reaped it."""
        if self._gone:
            return
        with contextlib.suppress(OSError):  # the server ended: so did its children
            self._sock.send(json.dumps({"signal": ident, "signum": int(signum)}).encode())

    def pump(self, timeout: float | None) -> None:
        """Take the server's reports, waiting up to ``timeout`` seconds (``None``: until one) for
        the first. Once the server has ended, every child it had is gone (reported killed)."""
        if self._gone:
            return
        ready, _, _ = select.select([self._sock], [], [], timeout)
        while ready:
            try:
                data = self._sock.recv(_MAX_MESSAGE, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._server_gone()
                return
            message = json.loads(data)
            if "started" in message:
                self._pending[message["started"]] = message["pid"]
            elif "exited" in message and message["exited"] in self._children:
                self._children[message["exited"]].returncode = message["returncode"]

    def _server_gone(self) -> None:
        self._gone = True
        for child in self._children.values():
            if child.returncode is None:
                child.returncode = -signal.SIGKILL  # died with the server (its parent-death signal)

    def close(self) -> None:
        """End the server: it kills the children still running, waits for them and exits."""
        if self._closed:
            return
        self._closed = True
        self._gone = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        if isinstance(self._process, int):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self._process, 0)
        else:
            self._process.wait()
        self._server_gone()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fork_zygote(ours: socket.socket, theirs: socket.socket, preload: Sequence[str]) -> int:
    """Fork this process into a server (the child never returns); the server's pid."""
    parent = os.getpid()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        try:
            _parent_death_signal(parent)
            ours.close()
            _serve(theirs.fileno(), preload)
        finally:
            os._exit(70)
    return pid


if __name__ == "__main__":  # python -m fedproto._fork_server CONTROL_FD PRELOAD...
    _serve(int(sys.argv[1]), sys.argv[2:])

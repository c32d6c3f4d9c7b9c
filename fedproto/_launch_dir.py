"""Where a launch keeps its throwaway files, and how they go away even when its launcher is killed.

A launch (:func:`fedproto.launcher.launch_local`, ``fedproto run ... --transport tcp``) writes a
few files its parties need only to start: each party's TLS kit and roster, and with ``fedproto
run`` each client's data part. Three things keep them from outliving the launch where others
could read them:

* **A private directory.** :func:`launch_directory` makes a fresh directory of mode 0700 in the
  temporary directory (:func:`tempfile.gettempdir`, so ``TMPDIR``), named
  ``fedproto-launch-<pid>-<start>-<pidns>-<random>``: the launcher's process id, its start time
  as the kernel records it (``/proc/<pid>/stat`` field 22, clock ticks since boot), and its PID
  namespace (the inode of ``/proc/self/ns/pid``); on systems without ``/proc`` both are 0. Files
  are written into it mode 0600, and the directory is removed when the launch ends.
* **Parties give their kit up once loaded.** The launcher puts each party's files in one
  directory of their own, ``<launch>/<party>/``, and tells the party so in its environment:
  ``FEDPROTO_LAUNCH_KIT=<launch>/<party>`` (:data:`KIT_ENV`). A launched party calls
  :func:`discard_launched_kit` with its roster's path once it has loaded everything there (its
  data, and its TLS material: the ``ssl`` contexts are built from files, then kept in memory);
  ``fedproto party`` does so as soon as its endpoint is open. The directory is removed only when
  the variable names exactly the directory of that roster, so a party run by its operator, whose
  kit is its own, never loses it. Once every party has started and loaded, the launch's directory
  is empty: a launcher killed with SIGKILL then leaves nothing readable behind (its parties die
  with it, see :mod:`fedproto.launcher`).
* **The next launch sweeps.** :func:`launch_directory` first removes the directories of dead
  launchers of the same user (:func:`sweep`): a directory whose name has this PID namespace and
  whose launcher is gone (no such process, a zombie, or a process with that id but another start
  time: the id was reused). A live launcher's directory is never touched, nor one of another
  user, nor one made in another PID namespace (its process cannot be seen from here).

The CA key of a throwaway federation is never written at all: the launcher signs the parties'
certificates in memory (:func:`fedproto.provision.ephemeral_credentials`) and drops the key.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["KIT_ENV", "PREFIX", "discard_launched_kit", "launch_directory", "private_file", "sweep"]

#: Environment variable naming a launched party's own kit directory (set by the launcher only).
KIT_ENV = "FEDPROTO_LAUNCH_KIT"
#: Start of the name of every launch directory.
PREFIX = "fedproto-launch-"

_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-(\d+)-(\d+)-[^/]+")
_log = logging.getLogger("fedproto.launcher")


def _start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot; 0 without ``/proc``), or
    ``None`` when there is no live process of that id (a zombie is not live)."""
    if not _has_proc():
        return 0 if _exists(pid) else None
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no such process, or it ended while we read
        return None
    fields = text.rpartition(")")[2].split()  # the name, in parentheses, may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of proc(5): fields[0] is field 3


def _has_proc() -> bool:
    return os.path.exists("/proc/self/stat")


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _this_launcher() -> str:
    """``<pid>-<start>-<pidns>`` of this process."""
    pid = os.getpid()
    return f"{pid}-{_start_time(pid) or 0}-{_pid_namespace()}"


def _launcher_gone(pid: int, start: int) -> bool:
    live_start = _start_time(pid)
    if live_start is None:
        return True
    return start != 0 and live_start != start  # start 0: no start time known, the id is enough


def sweep(directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove the launch directories of dead launchers of this user from ``directory``.

    Best effort: what cannot be listed or removed is left (and logged at debug level).

    Args:
        directory: where to look (default: :func:`tempfile.gettempdir`).

    Returns:
        The directories removed.
    """
    root = Path(directory if directory is not None else tempfile.gettempdir())
    namespace = _pid_namespace()
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError as exc:
        _log.debug("cannot list %s for leftovers of dead launchers: %s", root, exc)
        return removed
    for entry in entries:
        match = _NAME.fullmatch(entry.name)
        if match is None:
            continue
        pid, start, entry_namespace = (int(g) for g in match.groups())
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or entry_namespace != namespace:
            continue
        if not _launcher_gone(pid, start):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if os.path.lexists(entry.path):
            _log.debug("cannot remove %s, left by a dead launcher", entry.path)
        else:
            _log.debug("removed %s, left by a dead launcher (pid %d)", entry.path, pid)
            removed.append(Path(entry.path))
    return removed


@contextlib.contextmanager
def launch_directory() -> Iterator[Path]:
    """A fresh private directory (mode 0700) named after this launcher; removed on exit.

    Dead launchers' directories are swept first (:func:`sweep`).

    Yields:
        The directory's path (absolute).

    Raises:
        OSError: the directory cannot be made.
    """
    sweep()
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{_this_launcher()}-")).absolute()  # mode 0700
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def private_file(path: str | os.PathLike[str]) -> Path:
    """Make the new, empty file ``path`` with mode 0600 (to be written then by its name).

    Raises:
        FileExistsError: it exists already.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.fchmod(fd, 0o600)  # whatever the umask
    os.close(fd)
    return Path(path)


def discard_launched_kit(roster_path: str | os.PathLike[str]) -> bool:
    """Remove this party's throwaway kit, if a launcher made it: the directory of ``roster_path``
    when :data:`KIT_ENV` names exactly that directory; otherwise nothing is touched.

    Call it in a launched party once everything in its kit is loaded (the roster, the TLS
    contexts, which :class:`~fedproto.transports.tcp.TcpTransport` builds when made, and any file
    the launcher put beside them, such as its data part). Whatever cannot be removed is left (and
    logged); the launcher removes it when the launch ends.

    Args:
        roster_path: the party's roster file (``--roster``).

    Returns:
        Whether the kit was this process's launched kit and is gone now.
    """
    marked = os.environ.get(KIT_ENV)
    if not marked:
        return False
    kit = Path(roster_path).absolute().parent
    try:
        if not kit.samefile(marked):
            return False
    except OSError:
        return False  # gone already, or not there at all
    del os.environ[KIT_ENV]  # once; and not inherited by whatever this party starts
    shutil.rmtree(kit, ignore_errors=True)
    if os.path.lexists(kit):
        _log.warning("cannot remove the launched kit %s; the launcher removes it when the run ends", kit)
        return False
    return True

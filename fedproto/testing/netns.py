"""A star of Linux network namespaces standing for hosts, for multi-host tests and benchmarks.

One namespace per party: the hub's (the first party's), and one per client, each client joined
to the hub's namespace by its own veth pair (its own /24, ``SUBNET.format(i)``: the hub's end
``.1``, the client's ``.2``; the client's default route goes through it). Nothing else connects
the namespaces, so every frame between a client and the hub crosses its veth.

Used by ``tests/transports/test_netns.py`` (a TLS star federation across hosts) and
``benchmarks/_netns_star.py`` (the link model's check through a delaying relay). Needs root and
iproute2 (``ip netns``); :class:`NetnsUnavailable` says why not otherwise. Every namespace (with
its veth ends) and every process started through :meth:`StarNamespaces.start` is removed on the
way out of :func:`star_namespaces`, on failure too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["NetnsUnavailable", "StarNamespaces", "kill_process", "netns_unavailable_reason", "star_namespaces"]


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no ``ip``, permission denied)."""


def _run(argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=False, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def netns_unavailable_reason() -> str | None:
    """Why namespaces cannot be made here, or ``None`` when they probably can (root and ``ip``)."""
    if os.geteuid() != 0:
        return f"network namespaces need root; this runs as uid {os.geteuid()}"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to make network namespaces"
    return None


def kill_process(proc: subprocess.Popen) -> None:
    """Kill ``proc``'s process group (it was started in a new session), reap it, close its pipes."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


@dataclasses.dataclass
class StarNamespaces:
    """The namespaces of a star.

    Attributes:
        parties: the parties, the hub first.
        namespace: each party's namespace name.
        device: each client's end of its veth pair, in its namespace.
        processes: what :meth:`start` started (killed on the way out of :func:`star_namespaces`).
    """

    parties: tuple[str, ...]
    namespace: dict[str, str]
    device: dict[str, str] = dataclasses.field(default_factory=dict)
    processes: list[subprocess.Popen] = dataclasses.field(default_factory=list)

    def start(
        self, party: str, argv: Sequence[str], cwd: Path, *, stdin: Any = subprocess.DEVNULL, stderr: Any = subprocess.PIPE
    ) -> subprocess.Popen:
        """Run ``argv`` in ``party``'s namespace, in its own process group; stdout is a pipe (text)."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.namespace[party], *argv], cwd=cwd, stdin=stdin,
            stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True,
        )
        self.processes.append(proc)
        return proc

    def ip(self, party: str, *args: str) -> None:
        """``ip -n NAMESPACE ARGS`` in ``party``'s namespace.

        Raises:
            RuntimeError: the command failed (its message holds ``ip``'s error output).
        """
        done = _run(["ip", "-n", self.namespace[party], *args])
        if done.returncode != 0:
            raise RuntimeError(f"ip -n {self.namespace[party]} {' '.join(args)}: {done.stderr.strip()}")


@contextlib.contextmanager
def star_namespaces(parties: Sequence[str], *, subnet: str, prefix: str) -> Iterator[StarNamespaces]:
    """One namespace per party, each client linked to the hub's (``parties[0]``) by a veth pair.

    Args:
        parties: the party names, the hub first.
        subnet: client i's link is ``subnet.format(i) + ".0/24"`` (e.g. ``"10.213.{}"``).
        prefix: the start of the namespace and device names (two letters: a device name, with a
            per-process tag, must stay under 16 characters).

    Raises:
        NetnsUnavailable: not root, no ``ip``, or the kernel refused a namespace or a veth pair.
        RuntimeError: a later ``ip`` command failed, or a namespace was left behind on the way out.
    """
    reason = netns_unavailable_reason()
    if reason is not None:
        raise NetnsUnavailable(reason)
    tag = f"{prefix}{os.getpid() % 10000}{secrets.token_hex(2)}"
    star = StarNamespaces(tuple(parties), {party: f"{tag}-{i}" for i, party in enumerate(parties)})
    made: list[str] = []
    try:
        for party, name in star.namespace.items():
            done = _run(["ip", "netns", "add", name])
            if done.returncode != 0:
                raise NetnsUnavailable(f"cannot make network namespaces here: ip netns add: {done.stderr.strip()}")
            made.append(name)
            star.ip(party, "link", "set", "lo", "up")
        hub = parties[0]
        for i, client in enumerate(parties[1:]):
            hub_end, client_end = f"{tag}h{i}", f"{tag}c{i}"
            done = _run(["ip", "link", "add", hub_end, "netns", star.namespace[hub], "type", "veth", "peer", "name",
                         client_end, "netns", star.namespace[client]])
            if done.returncode != 0:
                raise NetnsUnavailable(f"cannot make veth pairs here: ip link add: {done.stderr.strip()}")
            net = subnet.format(i)
            star.ip(hub, "addr", "add", f"{net}.1/24", "dev", hub_end)
            star.ip(hub, "link", "set", hub_end, "up")
            star.ip(client, "addr", "add", f"{net}.2/24", "dev", client_end)
            star.ip(client, "link", "set", client_end, "up")
            star.ip(client, "route", "add", "default", "via", f"{net}.1")  # to the hub's address on link 0
            star.device[client] = client_end
        yield star
    finally:
        for proc in star.processes:
            kill_process(proc)
        for name in reversed(made):  # its veth ends go with it
            _run(["ip", "netns", "del", name])
        left = _run(["ip", "netns", "list"]).stdout
        leftover = [name for name in made if name in left]
        if leftover:
            raise RuntimeError(f"namespaces left behind: {leftover}")

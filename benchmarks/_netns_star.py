"""A real TCP star federation whose every client-hub link goes through a delaying relay.

For the link-model check (issue 31, part 3), not part of fedproto. One Linux network namespace
per host: the hub's, and one per client, each client joined to the hub's namespace by its own
veth pair (its own /24, its default route through it), as in ``tests/transports/test_netns.py``.
In the hub's namespace a :mod:`_delay_relay` process listens on the roster's hub address
(``10.214.0.1:7000``) and forwards every connection to the hub, which listens on
``127.0.0.1:7000`` (``fedproto party --listen-fd``, see :mod:`_party_at_go`). Every frame
between a client and the hub therefore crosses a veth and waits ``latency_s`` in the relay, once
each way; a frame from one client to another crosses two such links through the hub.

:func:`run_tcp_star` splits the data (``fedproto split``), provisions TLS kits (``fedproto
provision``), starts the relay, then every party warm (:mod:`_party_at_go`) and, once all are
ready, lets them go together; it merges the parties' reports (``--party-report``) into the run's
report, whose ``wall_time_s`` is the measured wall time (the longest party's run).

The namespaces are :func:`fedproto.testing.netns.star_namespaces`'s. Needs root and iproute2;
:class:`NetnsUnavailable` says why not otherwise. Every namespace (with its veth ends) and every
process started here is removed on the way out, on failure too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedproto.metering import RunReport
from fedproto.testing.netns import (
    NetnsUnavailable,
    netns_unavailable_reason,
    star_namespaces,
)

# NetnsUnavailable and netns_unavailable_reason are fedproto.testing.netns's, named here too for
# the benchmark that runs this one (network_model.py).
__all__ = ["NetnsUnavailable", "TcpRun", "netns_unavailable_reason", "run_tcp_star"]

BENCHMARKS = Path(__file__).resolve().parent
FEDPROTO = [sys.executable, "-m", "fedproto"]
#: Client i's link is 10.214.i.0/24: the hub's end .1, the client's .2.
SUBNET = "10.214.{}"
#: The roster's hub address (the relay listens there) and where the hub itself listens.
#: The hub's port is the roster's (the transport checks that a handed-over socket's port is the
#: roster's); only its host differs: loopback, which the clients' namespaces cannot reach.
RELAY_PORT = 7000
HUB_ADDRESS = f"{SUBNET.format(0)}.1:{RELAY_PORT}"
HUB_INNER = ("127.0.0.1", RELAY_PORT)


def _run(argv: Sequence[str], timeout: float = 60, **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          **kwargs)


@dataclasses.dataclass(frozen=True)
class TcpRun:
    """One measured star run.

    Attributes:
        report: the parties' reports merged (``RunReport.merge``, transport ``tcp``), with every
            party's ``compute_trace`` (the parties run with ``--compute-trace``).
        parties: each party's own report.
        results: each party's result.
        relay_bytes: bytes the relay forwarded, both directions, all links (0 without one).
        traces: per party, wall-clock seconds since "go" of its meter's ``start``, its
            ``first_sent`` and ``first_received`` frame and its ``finish`` (from
            :mod:`_party_at_go`'s ``TRACE`` line; ``None`` where it did not happen).
        frames: per party, every frame its meter counted, ``[seconds since "go", "sent" or
            "received", round, phase, sender, receiver, tag]``, and every handler it ran,
            ``[seconds since "go" at its end, "handler", round, tag or "start", wall s, CPU s]``
            (only when the parties ran with ``FEDPROTO_NETCHECK_FRAMES=1``; empty otherwise).
    """

    report: RunReport
    parties: dict[str, RunReport]
    results: dict[str, Any]
    relay_bytes: int
    traces: dict[str, dict[str, float | None]]
    frames: dict[str, list[list[Any]]] = dataclasses.field(default_factory=dict)

    @property
    def wall_time_s(self) -> float:
        """The measured wall time: the merged report's (the longest party run), seconds."""
        return self.report.wall_time_s


def _fedproto(argv: Sequence[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = _run([*FEDPROTO, *argv], timeout=600, cwd=cwd, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"fedproto {' '.join(argv[:2])}: {done.stderr.strip()[-2000:]}")
    return done


def provision_kits(parties: Sequence[str], kits: Path, cwd: Path, env: dict[str, str] | None = None) -> None:
    """TLS kits of a throwaway federation (``fedproto provision``, the hub at :data:`HUB_ADDRESS`)
    under ``kits``; the CA's key is removed (the parties need their own kits only).

    Raises:
        RuntimeError: provisioning failed (its error output is in the message).
    """
    _fedproto(["provision", "--parties", ",".join(parties), "--hub", HUB_ADDRESS, "--out", str(kits)], cwd,
              dict(os.environ) if env is None else env)
    shutil.rmtree(kits / "ca")


def start_relay(hosts: Any, hub: str, latency_s: float, workdir: Path, *, stderr: Any = subprocess.PIPE,
                bandwidth_bytes_per_s: float | None = None) -> subprocess.Popen:
    """A :mod:`_delay_relay` in the hub's namespace, from :data:`HUB_ADDRESS` (the roster's) to
    :data:`HUB_INNER` (where the hub listens), once it says it is ready.

    Raises:
        RuntimeError: the relay did not start (its error output is in the message when piped).
    """
    bandwidth = [] if bandwidth_bytes_per_s is None else ["--bandwidth-bytes-per-s", repr(bandwidth_bytes_per_s)]
    relay = hosts.start(hub, [
        sys.executable, str(BENCHMARKS / "_delay_relay.py"), "--listen", HUB_ADDRESS,
        "--target", f"{HUB_INNER[0]}:{HUB_INNER[1]}", "--latency-s", repr(latency_s), *bandwidth,
    ], workdir, stdin=subprocess.PIPE, stderr=stderr)
    if not relay.stdout.readline().startswith("ready"):
        said = relay.stderr.read()[-2000:] if relay.stderr is not None else "see its log"
        raise RuntimeError(f"the relay did not start: {said}")
    return relay


def _wait_ready(procs: dict[str, subprocess.Popen], timeout_s: float) -> None:
    """Wait for every process's ``ready`` line (or raise naming the first that ended or lagged)."""
    waiting = dict(procs)
    with selectors.DefaultSelector() as selector:
        for party, proc in procs.items():
            selector.register(proc.stdout, selectors.EVENT_READ, party)
        deadline = time.monotonic() + timeout_s
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"parties not ready within {timeout_s} s: {sorted(waiting)}")
            for key, _ in selector.select(left):
                party = key.data
                line = key.fileobj.readline()
                if line.strip() != "ready":
                    raise RuntimeError(f"{party} ended before it was ready (exit {procs[party].wait()}): {line!r}")
                selector.unregister(key.fileobj)
                del waiting[party]


def run_tcp_star(
    protocol: str, *, data: str, clients: int, options: Sequence[str], latency_s: float | None, workdir: Path,
    split_options: Sequence[str] = (), bandwidth_bytes_per_s: float | None = None, timeout_s: float = 600,
) -> TcpRun:
    """Run ``protocol`` as a TLS star over delayed links, one process per party, and measure it.

    Args:
        protocol: a protocol name (``fastlloyd``, ``mufc``).
        data: the data set (a registered name; ``FEDPROTO_DATA`` is passed on).
        clients: number of clients (plus the hub).
        options: protocol options given to every party and to ``fedproto split`` (e.g. ``--seed 0``).
        split_options: options of ``fedproto split`` alone (how the data is cut: ``--partition iid``).
        latency_s: one-way latency of every client-hub link (seconds); ``None``: no relay, the hub
            listens on the roster's address itself (the veths alone: a profile of the relay's cost).
        workdir: an empty directory for the split, the kits, the party reports and logs.
        bandwidth_bytes_per_s: each link direction's rate (``None``: unlimited).
        timeout_s: how long the parties may take, from "go".

    Raises:
        NetnsUnavailable: namespaces cannot be made here.
        RuntimeError: a step failed (its message names it, with the party's error output).
    """
    env = dict(os.environ)
    parts, kits = workdir / "parts", workdir / "kits"
    _fedproto(["split", protocol, "--data", data, "--clients", str(clients), *split_options, *options,
               "--out", str(parts)], workdir, env)
    split = json.loads((parts / "split.json").read_text())
    parties: list[str] = split["parties"]
    hub = parties[0]
    provision_kits(parties, kits, workdir, env)
    logs: list[Any] = []
    try:
        with star_namespaces(parties, subnet=SUBNET, prefix="nc") as hosts:
            relay = None
            hub_listens = HUB_ADDRESS
            if latency_s is not None:
                hub_listens = f"{HUB_INNER[0]}:{HUB_INNER[1]}"
                relay_log = open(workdir / "relay.err", "w")  # noqa: SIM115 (closed below)
                logs.append(relay_log)
                try:
                    relay = start_relay(hosts, hub, latency_s, workdir, stderr=relay_log,
                                        bandwidth_bytes_per_s=bandwidth_bytes_per_s)
                except RuntimeError:
                    relay_log.flush()
                    raise RuntimeError("the relay did not start: "
                                       f"{(workdir / 'relay.err').read_text()[-2000:]}") from None
            procs: dict[str, subprocess.Popen] = {}
            for party in parties:
                own = [*split["resolved_options"]] if party == hub else ["--data", str(parts / f"{party}.npz")]
                listen = ["--listen", hub_listens] if party == hub else []
                err = open(workdir / f"{party}.err", "w")  # noqa: SIM115 (closed below)
                logs.append(err)
                procs[party] = hosts.start(party, [
                    sys.executable, str(BENCHMARKS / "_party_at_go.py"), *listen, "--",
                    "party", protocol, *options, *own, "--party", party, "--roster", str(kits / party / "roster.json"),
                    "--party-report", str(workdir / f"{party}.json"), "--deadline", "60", "--compute-trace",
                ], workdir, stdin=subprocess.PIPE, stderr=err)
            _wait_ready(procs, timeout_s=300)
            for proc in procs.values():  # go: all within a few milliseconds
                proc.stdin.write("go\n")
                proc.stdin.flush()
            deadline = time.monotonic() + timeout_s
            for party, proc in procs.items():
                try:
                    code = proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
                except subprocess.TimeoutExpired:
                    raise RuntimeError(f"{party} did not finish within {timeout_s} s") from None
                if code != 0:
                    raise RuntimeError(f"{party} exited {code}: {(workdir / f'{party}.err').read_text()[-2000:]}")
            relay_bytes = 0
            if relay is not None:
                relay.send_signal(signal.SIGTERM)
                out, _ = relay.communicate(timeout=30)
                forwarded = [line for line in out.splitlines() if line.startswith("forwarded")]
                relay_bytes = int(forwarded[-1].split()[3]) if forwarded else 0
    finally:
        for log in logs:
            log.close()
    docs = {p: json.loads((workdir / f"{p}.json").read_text()) for p in parties}
    reports = {p: RunReport.from_dict(doc["report"]) for p, doc in docs.items()}
    merged = RunReport.merge(list(reports.values()), transport="tcp")
    traces = {p: _trace((workdir / f"{p}.err").read_text()) for p in parties}
    go = min(t["go"] for t in traces.values() if t.get("go") is not None)
    since_go = {p: {k: None if v is None else v - go for k, v in t.items()} for p, t in traces.items()}
    frames = {p: [[t - go, *rest] for t, *rest in _frames((workdir / f"{p}.err").read_text())] for p in parties}
    return TcpRun(merged, reports, {p: doc["result"] for p, doc in docs.items()}, relay_bytes, since_go, frames)


def _trace(stderr: str) -> dict[str, float | None]:
    """The ``TRACE k=v ...`` line of a party's stderr as ``{k: seconds or None}``."""
    line = next((x for x in reversed(stderr.splitlines()) if x.startswith("TRACE ")), "TRACE")
    return {k: None if v == "None" else float(v) for k, v in (item.split("=") for item in line.split()[1:])}


def _frames(stderr: str) -> list[list[Any]]:
    """The ``FRAMES [...]`` line of a party's stderr (empty without one)."""
    line = next((x for x in reversed(stderr.splitlines()) if x.startswith("FRAMES ")), None)
    return [] if line is None else json.loads(line[len("FRAMES "):])

"""Several hosts in the test suite (issue 10, part 5): a TLS star federation across network namespaces.

Three Linux network namespaces stand for three hosts: the hub's, and one per client, each client
joined to the hub's namespace by its own veth pair (its own /24; the client's default route goes
through it). The hub listens on its first link's address; nothing else connects the namespaces,
so every frame crosses a veth, and only the hub accepts connections.

* a provisioned TLS FastLloyd federation (``fedproto split``, ``fedproto provision``, then
  ``ip netns exec NS python -m fedproto party fastlloyd ...``, each client on its own data file)
  gives the memory run's centroids and, link by link, its payload bytes (slow: three processes
  start JAX);
* taking one client's link down mid-run (``ip link set DEV down`` in its namespace, never brought
  back) ends the server within its deadline with an error naming that client, and the other
  client names it too (slow);
* quick, in the default run: the tutorial's secure sum (no JAX) across the same namespaces.

Needs root and iproute2 (``ip netns``); where the test cannot make namespaces (not root, no
``ip``, permission denied) it is skipped with that reason. Every namespace (and with it its veth
ends) and every process the test starts is removed in the fixture's teardown, on failure too.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedproto.metering import RunReport
from fedproto.testing import load_file
from fedproto.testing.netns import NetnsUnavailable, StarNamespaces, star_namespaces

FEDPROTO = [sys.executable, "-m", "fedproto"]
SECURE_SUM = Path(__file__).resolve().parents[2] / "docs" / "tutorial" / "secure_sum.py"
PARTIES = ("server", "client-0", "client-1")
HUB_PORT = 7000
#: The subnet of client i's link is 10.213.i.0/24: the hub's end is .1, the client's .2.
SUBNET = "10.213.{}"


@dataclasses.dataclass
class Hosts:
    """Namespaces standing for hosts (``star``: the namespaces, the client links' devices) and the hub's address."""

    star: StarNamespaces
    hub_address: str

    def start(self, party: str, argv: list[str], cwd: Path) -> subprocess.Popen:
        """Run ``argv`` in ``party``'s namespace (its own process group; killed at teardown)."""
        return self.star.start(party, argv, cwd)

    def ip(self, party: str, *args: str) -> None:
        self.star.ip(party, *args)

    @property
    def device(self) -> dict[str, str]:
        return self.star.device

    def received_by_hub(self) -> dict[str, int]:
        """Bytes the hub has received on each established connection to its port, by peer host."""
        done = subprocess.run(
            ["ip", "netns", "exec", self.star.namespace["server"], "ss", "-Htni", "state", "established",
             f"( sport = :{HUB_PORT} )"], check=False, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )
        received: dict[str, int] = {}
        peer = None
        for line in done.stdout.splitlines():
            if line and not line[0].isspace():  # "Recv-Q Send-Q local:port peer:port"
                peer = line.split()[-1].rpartition(":")[0]
                received[peer] = 0
            elif peer is not None:  # the socket's details: "... bytes_received:N ..."
                found = re.search(r"bytes_received:(\d+)", line)
                received[peer] = int(found.group(1)) if found else 0
        return received


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    try:
        with star_namespaces(PARTIES, subnet=SUBNET, prefix="fp") as star:
            yield Hosts(star, f"{SUBNET.format(0)}.1:{HUB_PORT}")
    except NetnsUnavailable as exc:  # not root, no `ip`, or the kernel refused
        pytest.skip(str(exc))


def _cli(argv: list[str], capsys) -> None:
    """``fedproto ARGV`` in this process (the same ``main`` as the command)."""
    from fedproto.cli import main

    code = main(argv)
    assert code == 0, capsys.readouterr().err[-3000:]


def _provision(tmp_path: Path, hosts: Hosts, capsys, *extra: str) -> Path:
    kits = tmp_path / "kits"
    _cli(["provision", "--parties", ",".join(PARTIES), "--hub", hosts.hub_address, "--out", str(kits), *extra], capsys)
    return kits


def _links(report: RunReport) -> dict[tuple, tuple[int, int]]:
    return {
        (link.round_idx, link.phase, link.sender, link.receiver, link.tag): (link.messages, link.payload_bytes)
        for link in report.links
    }


def _wait(procs: dict[str, subprocess.Popen], timeout: float) -> dict[str, tuple[int, str]]:
    outputs = {party: proc.communicate(timeout=timeout) for party, proc in procs.items()}
    return {party: (procs[party].returncode, outputs[party][1]) for party in procs}


def _last_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def test_the_tutorial_secure_sum_runs_across_three_namespaces(hosts: Hosts, tmp_path: Path, capsys) -> None:
    kits = _provision(tmp_path, hosts, capsys)
    procs = {
        party: hosts.start(party, [*FEDPROTO, "party", str(SECURE_SUM), "--party", party, "--roster",
                                   str(kits / party / "roster.json"), "--party-report", str(tmp_path / f"{party}.json"),
                                   "--deadline", "30"], tmp_path)
        for party in PARTIES
    }
    ended = _wait(procs, timeout=120)
    for party, (code, err) in ended.items():
        assert code == 0, f"{party}: {err[-2000:]}"
    docs = {p: json.loads((tmp_path / f"{p}.json").read_text()) for p in PARTIES}
    tutorial = load_file(SECURE_SUM, "secure_sum_for_netns_test")
    expected = sum(tutorial.client_values(0, i, 8) for i in range(2))  # --seed 0, --d 8, --clients 2
    assert docs["server"]["result"]["sum"] == expected.tolist()
    reports = [RunReport.from_dict(doc["report"]) for doc in docs.values()]
    merged = RunReport.merge(reports)
    assert merged.handshake_bytes > 0 and merged.tls_overhead_bytes == 22 * merged.messages  # TLS, one record each
    assert merged.relay_overhead_bytes == 0


FASTLLOYD = ["--data", "iris", "--clients", "2", "--seed", "5"]


def _fastlloyd_parties(hosts: Hosts, tmp_path: Path, kits: Path, options: list[str]) -> dict[str, subprocess.Popen]:
    """One ``fedproto party fastlloyd`` process per party, each in its namespace on its own data file."""
    procs = {}
    for party in PARTIES:
        # a client's --k comes from its file (iris's paper k); the server holds no data and is told
        own = ["--k", "3"] if party == "server" else ["--data", str(tmp_path / "parts" / f"{party}.npz")]
        procs[party] = hosts.start(party, [
            *FEDPROTO, "party", "fastlloyd", *options, *own, "--party", party,
            "--roster", str(kits / party / "roster.json"), "--party-report", str(tmp_path / f"{party}.json"),
        ], tmp_path)
    return procs


@pytest.mark.slow  # three processes start JAX: about a minute
def test_a_fastlloyd_federation_across_namespaces_equals_the_memory_run(hosts: Hosts, tmp_path: Path, capsys) -> None:
    options = [*FASTLLOYD, "--iterations", "4"]
    _cli(["run", "fastlloyd", *options, "--quiet", "--report", str(tmp_path / "memory.json")], capsys)
    memory = RunReport.from_json((tmp_path / "memory.json").read_text())
    _cli(["split", "fastlloyd", *options, "--out", str(tmp_path / "parts")], capsys)
    # the memory run's session in the kits' rosters: the frames' envelopes carry it
    kits = _provision(tmp_path, hosts, capsys, "--session", str(memory.session))
    procs = _fastlloyd_parties(hosts, tmp_path, kits, ["--iterations", "4", "--seed", "5", "--deadline", "60"])
    ended = _wait(procs, timeout=300)
    for party, (code, err) in ended.items():
        assert code == 0, f"{party}: {err[-3000:]}"
    docs = {party: json.loads((tmp_path / f"{party}.json").read_text()) for party in PARTIES}
    for party in PARTIES[1:]:
        assert docs[party]["result"]["centroids"] == memory.results["centroids"], party
    tcp = RunReport.merge([RunReport.from_dict(doc["report"]) for doc in docs.values()], transport="tcp")
    assert _links(tcp) == _links(memory)
    assert (tcp.payload_bytes, tcp.messages) == (memory.payload_bytes, memory.messages)
    # an uncut run: nothing re-sent, each client's goodbye the only resumption bytes (20 + a TLS record)
    assert tcp.resumption_overhead_bytes == 2 * (20 + 22)


@pytest.mark.slow  # three processes start JAX, then the server waits out its deadline
def test_a_client_whose_link_goes_down_mid_run_is_named_within_the_deadline(
    hosts: Hosts, tmp_path: Path, capsys
) -> None:
    deadline_s = 5.0
    iterations = "500"  # client-1 sends the server one frame of about 130 wire bytes per iteration
    options = [*FASTLLOYD, "--iterations", iterations]
    _cli(["split", "fastlloyd", *options, "--out", str(tmp_path / "parts")], capsys)
    kits = _provision(tmp_path, hosts, capsys)
    procs = _fastlloyd_parties(hosts, tmp_path, kits, ["--iterations", iterations, "--seed", "5",
                                                        "--deadline", str(deadline_s)])
    client_1 = f"{SUBNET.format(1)}.2"
    # into the Lloyd iterations: past client-1's TLS handshake (about 1.5 kB) and its setup
    # frames (about 0.3 kB), about 15 iterations in, far from the run's end (about 67 kB)
    into_the_iterations = 4000
    started = time.monotonic()
    while hosts.received_by_hub().get(client_1, 0) < into_the_iterations:
        assert time.monotonic() - started < 180, f"client-1 did not get going: {hosts.received_by_hub()}"
        assert all(proc.poll() is None for proc in procs.values()), "a party ended before the cut"
        time.sleep(0.02)
    assert procs["server"].poll() is None, "the run ended before the link could be taken down"
    hosts.ip("client-1", "link", "set", hosts.device["client-1"], "down")
    down = time.monotonic()
    _, server_err = procs["server"].communicate(timeout=120)
    server_ended = time.monotonic()
    assert procs["server"].returncode != 0, f"the server finished despite client-1's link: {server_err[-2000:]}"
    line = _last_line(server_err)
    print(f"server, {server_ended - down:.1f} s after the link went down: {line}")
    assert "client-1" in line and "client-0" not in line.replace("client-1", ""), line
    # the server's deadline for a silent client (FastLloyd's server waits 1 x --deadline), plus
    # the time the processes take to notice, abort and exit on a loaded machine
    assert server_ended - down < deadline_s + 20, f"the server took {server_ended - down:.1f} s"
    _, client_err = procs["client-0"].communicate(timeout=60)
    assert procs["client-0"].returncode != 0 and "client-1" in _last_line(client_err), client_err[-2000:]

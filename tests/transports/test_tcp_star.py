"""The TCP star (issue 10, part 2): only the hub listens; clients dial out; the hub relays.

* the conformance suite passes over the star (TLS and shared secret), client-to-client frames
  included;
* a frame from one client to another is relayed by the hub without being given to the hub's
  party, arrives with its sender's name and its exact bytes, and costs exactly the route headers
  and the second hop in ``relay_overhead_bytes`` (TLS records counted by RFC 8446);
* a protocol with client-to-client frames (DC-k-means as a tree of height 2: leaves send to inner
  nodes) gives the same results and the same per-link payload bytes over memory, the mesh and the
  star, and only the star reports relay bytes;
* parties whose roster gives them no address run a provisioned TLS federation, each from its
  own kit, in one process and as separate ``fedproto party`` processes;
* a client presenting a certificate for another name, or for a name the hello does not claim, or
  dialling as a mesh party, is refused and logged while the run completes;
* a client whose hub goes away, or never answers, ends with an error naming the hub within the
  deadline; a hub whose own run is over keeps relaying until its clients have left.
"""

from __future__ import annotations

import json
import logging
import math
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import trio

from fedproto.errors import PeerUnreachable
from fedproto.metering import Meter, RunReport
from fedproto.provision import FederationCA, provision
from fedproto.roster import Roster, TlsFiles
from fedproto.runtime import RuntimeConfig, run_parties, run_party
from fedproto.testing import load_file
from fedproto.testing.conformance import run_conformance
from fedproto.testing.toy import SumWorker, expected_sums
from fedproto.testing.toy import sum_machines as toy_machines
from fedproto.transports._framing import FRAMING_OVERHEAD_BYTES, ROUTE_HEADER_BYTES, send_frame
from fedproto.transports.tcp import (
    STAR_TLS_HELLO_VERSION,
    TLS_HELLO_VERSION,
    TcpNetwork,
    TcpTransport,
    open_tcp_network,
    roster_digest,
)

ROSTER = ("c", "w0", "w1")
SECRET = b"0123456789abcdef-run-secret"
helpers = load_file(Path(__file__).resolve().parents[1] / "_helpers.py", "tests_helpers")
tcp_helpers = load_file(Path(__file__).resolve().parent / "_tcp_helpers.py", "tests_tcp_helpers")
LOGGER = "fedproto.transports.tcp"
#: What TLS 1.3 adds to each record: 5-byte header, 1-byte inner content type, 16-byte AEAD tag.
RECORD_OVERHEAD_BYTES = 22
RECORD_PLAINTEXT_BYTES = 16384
FEDPROTO = [sys.executable, "-m", "fedproto"]
SECURE_SUM = Path(__file__).resolve().parents[2] / "docs" / "tutorial" / "secure_sum.py"


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return helpers.warnings_of(caplog, LOGGER)


def tls_records(plaintext_bytes: int) -> int:
    return max(1, math.ceil(plaintext_bytes / RECORD_PLAINTEXT_BYTES))


# --- routed frames on the wire ---------------------------------------------------------------------------


class _Chunks(trio.abc.ReceiveStream):
    """Returns ``data`` ``size`` bytes at a time, then EOF."""

    def __init__(self, data: bytes, size: int) -> None:
        self.data, self.size = data, size

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        take = min(self.size, max_bytes or self.size)
        chunk, self.data = self.data[:take], self.data[take:]
        return chunk

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


class _Recording(trio.abc.SendStream):
    def __init__(self) -> None:
        self.data = bytearray()

    async def send_all(self, data) -> None:
        await trio.lowlevel.checkpoint()
        self.data += data

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


@pytest.mark.parametrize("chunk", [1, 7, 1 << 16])
async def test_routed_and_plain_frames_share_a_stream_under_any_chunking(chunk: int) -> None:
    from fedproto.transports._framing import FrameReader, FrameTooLarge, send_routed_frame

    frames = [(None, b"plain"), (2, b"routed to #2"), (None, b""), (0, b""), (2**32 - 1, b"x" * 70_000)]
    wire = _Recording()
    for index, frame in frames:
        await (send_frame(wire, frame) if index is None else send_routed_frame(wire, index, frame))
    assert len(wire.data) == sum(4 + len(f) + (0 if i is None else ROUTE_HEADER_BYTES) for i, f in frames)
    reader = FrameReader(_Chunks(bytes(wire.data), chunk))
    assert [await reader.receive_routed_frame(1 << 20) for _ in frames] == frames
    with pytest.raises(trio.EndOfChannel):
        await reader.receive_routed_frame(1 << 20)
    # a routed frame's own length is checked against the limit before its body is read
    with pytest.raises(FrameTooLarge):
        await FrameReader(_Chunks(bytes(wire.data[-70_012:-69_000]), chunk)).receive_routed_frame(1000)
    with pytest.raises(ValueError, match="does not fit a route header"):
        await send_routed_frame(wire, 2**32, b"")


async def test_a_stream_cut_inside_a_route_header_is_broken() -> None:
    from fedproto.errors import TransportBroken
    from fedproto.transports._framing import FrameReader, send_routed_frame

    wire = _Recording()
    await send_routed_frame(wire, 1, b"abc")
    for cut in range(1, len(wire.data)):
        with pytest.raises(TransportBroken, match="stream ended inside"):
            await FrameReader(_Chunks(bytes(wire.data[:cut]), 3)).receive_routed_frame(100)


def test_relay_bytes_are_summed_by_merge_and_default_to_zero_in_older_reports() -> None:
    reports = []
    for party, relay in (("a", 8), ("s", 185)):
        meter = Meter()
        meter.record_sent(0, "p", party, "x", "t", 10)
        meter.record_connection_bytes(handshake_bytes=1, relay_overhead_bytes=relay)
        reports.append(meter.report(protocol="p", transport="tcp", session=0, parties=("s", "a")))
    assert [r.relay_overhead_bytes for r in reports] == [8, 185]
    merged = RunReport.merge(reports)
    assert (merged.relay_overhead_bytes, merged.payload_bytes) == (193, 20)
    old = merged.to_dict()
    del old["relay_overhead_bytes"]  # a report written before the star
    assert RunReport.from_dict(old).relay_overhead_bytes == 0


# --- the transport ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("security", ["tls", "insecure-shared-secret"])
async def test_conformance_over_the_star(security: str) -> None:
    secret = SECRET if security != "tls" else None
    async with open_tcp_network(("hub", "a", "b", "c"), secret, topology="star") as endpoints:
        assert [ep.hub for ep in endpoints.values()] == ["hub"] * 4
        assert list(endpoints["hub"].addresses) == ["hub"]  # nobody else has an address
        await run_conformance(endpoints)
        # the checks send between clients too: the hub relayed those frames
        assert endpoints["hub"].relayed_frames > 0
        assert all(endpoints[p].relay_overhead_bytes > 0 for p in ("a", "b", "c"))


@pytest.mark.parametrize("size", [0, 300, 40_000])
async def test_a_client_to_client_frame_is_relayed_unread_with_its_sender_and_exact_bytes(size: int) -> None:
    frame = bytes(range(256)) * (size // 256) + b"\xc1" * (size % 256)  # not msgpack: the hub never decodes
    async with open_tcp_network(ROSTER, topology="star") as eps:
        hub, w0, w1 = eps["c"], eps["w0"], eps["w1"]
        await w0.send("c", b"to the hub")  # the links exist, so no handshake byte is counted below
        assert await hub.receive() == ("w0", b"to the hub")
        before = {p: (e.relay_overhead_bytes, e.tls_overhead_bytes) for p, e in eps.items()}
        await w0.send("w1", frame)
        with trio.fail_after(10):
            assert await w1.receive() == ("w0", frame)
            while hub.relayed_frames < 1:  # the hub counts once its write has returned
                await trio.sleep(0.01)
        assert hub.receive_nowait() is None  # relayed past the hub's party, not delivered to it
        assert hub.relayed_frames == 1
        first_hop = ROUTE_HEADER_BYTES + FRAMING_OVERHEAD_BYTES + size
        second_hop = first_hop + RECORD_OVERHEAD_BYTES * tls_records(first_hop)
        assert w0.relay_overhead_bytes - before["w0"][0] == ROUTE_HEADER_BYTES
        assert w0.tls_overhead_bytes - before["w0"][1] == RECORD_OVERHEAD_BYTES * tls_records(first_hop)
        assert hub.relay_overhead_bytes - before["c"][0] == second_hop
        assert hub.tls_overhead_bytes == before["c"][1]  # the second hop is all relay overhead
        assert (w1.relay_overhead_bytes, w1.tls_overhead_bytes) == before["w1"]
        # the hub's own frames to a client carry no route header
        await hub.send("w1", frame)
        assert await w1.receive() == ("c", frame)
        assert hub.relay_overhead_bytes - before["c"][0] == second_hop


def _tree_plan(height: int = 2):
    from fedproto import registry
    from fedproto.cli import build_parser
    from fedproto.data import load_dataset

    argv = ["run", "dckmeans", "--data", "iris", "--deletions", "4", "--no-timing", "--height", str(height),
            "--width", "2"]
    args = build_parser(argv).parse_args(argv)
    return registry.load_protocol("dckmeans").plan(args, load_dataset(args.data))


async def _run_plan(plan, network) -> tuple[dict, RunReport, dict]:
    config = RuntimeConfig(session=plan.session, deadline_s=30.0)
    meter = Meter(trio.current_time)
    async with network.endpoints(plan.roster) as endpoints:
        machines = {p: plan.make_machine(p) for p in plan.roster}
        results = await run_parties(machines, endpoints, config=config, meter=meter)
    for endpoint in endpoints.values():
        meter.record_connection_bytes(relay_overhead_bytes=getattr(endpoint, "relay_overhead_bytes", 0))
    report = meter.report(protocol="dckmeans", transport="x", session=plan.session, parties=plan.roster)
    hub = endpoints[plan.roster[0]]
    relayed = {"relayed": getattr(hub, "relayed_frames", 0)}
    return {p: plan.result_to_json(p, r) for p, r in results.items()}, report, relayed


async def test_a_protocol_with_client_to_client_frames_agrees_over_memory_mesh_and_star() -> None:
    from fedproto.transports.memory import MemoryNetwork

    plan = _tree_plan()
    hub = plan.roster[0]
    runs = {
        "memory": await _run_plan(plan, MemoryNetwork(plan.roster)),
        "mesh": await _run_plan(plan, TcpNetwork(topology="mesh", session=plan.session)),
        "star": await _run_plan(plan, TcpNetwork(session=plan.session)),  # the star is TcpNetwork's default
    }
    relayed_links = [link for link in runs["memory"][1].links if hub not in (link.sender, link.receiver)]
    assert relayed_links, "the tree of height 2 must have leaf-to-node frames"
    assert all(link.payload_bytes / link.messages < 16_000 for link in relayed_links)  # one TLS record each
    for name, (results, report, _) in runs.items():
        assert results == runs["memory"][0], f"results over {name} differ from memory"
        assert report.links == runs["memory"][1].links, f"per-link payload bytes over {name} differ from memory"
    assert runs["mesh"][1].relay_overhead_bytes == 0 and runs["mesh"][2]["relayed"] == 0
    star = runs["star"][1]
    assert runs["star"][2]["relayed"] == sum(link.messages for link in relayed_links)
    # per relayed frame: the sender's route header, the hub's header, prefix and frame, TLS records
    plaintext = sum(link.messages * (ROUTE_HEADER_BYTES + FRAMING_OVERHEAD_BYTES) + link.payload_bytes
                    for link in relayed_links)
    records = sum(link.messages for link in relayed_links)  # every tree frame fits one TLS record
    assert star.relay_overhead_bytes == ROUTE_HEADER_BYTES * records + plaintext + RECORD_OVERHEAD_BYTES * records


async def test_a_client_that_cannot_reach_the_hub_fails_naming_it() -> None:
    with socket.socket() as reserved:  # bound, not listening: dialling it is refused
        reserved.bind(("127.0.0.1", 0))
        port = reserved.getsockname()[1]
        client = TcpTransport("w0", ROSTER, {"c": f"127.0.0.1:{port}"}, SECRET, topology="star",
                              connect_timeout_s=0.5)
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            assert await nursery.start(client.serve) is None  # a star client listens nowhere
            with pytest.raises(PeerUnreachable, match="w0 cannot reach the hub: cannot connect to c at") as caught:
                await client.receive()
            assert caught.value.party == "c"
            with pytest.raises(PeerUnreachable, match="cannot reach the hub"):
                await client.send("w1", b"x")
            await client.aclose()
        assert trio.current_time() - started < 5


async def test_the_hub_going_away_ends_clients_with_an_error_naming_it() -> None:
    deadline_s = 20.0
    outcomes: dict[str, tuple[float, BaseException]] = {}
    async with open_tcp_network(ROSTER, topology="star") as eps:
        hub = eps["c"]
        with trio.fail_after(10):
            while len(hub._clients) < 2:  # both clients have dialled in
                await trio.sleep(0.01)

        async def client(party: str, index: int) -> None:
            worker = SumWorker(party, coordinator="c", values=np.arange(3) + index)
            try:
                await run_party(worker, eps[party], config=RuntimeConfig(deadline_s=deadline_s))
            except Exception as exc:
                outcomes[party] = (trio.current_time(), exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(client, "w0", 0)
            nursery.start_soon(client, "w1", 1)
            await hub.send("w0", b"not a frame")  # refused by w0's runtime; the run goes on
            await trio.sleep(0.2)
            gone = trio.current_time()
            await hub.aclose()
    for party in ("w0", "w1"):
        ended, error = outcomes[party]
        assert isinstance(error, PeerUnreachable) and error.party == "c", error
        assert f"{party} lost its connection to the hub c" in str(error), error
        assert ended - gone < deadline_s / 4  # at once, not after a deadline of silence


async def test_a_hub_whose_run_is_over_keeps_relaying_until_its_clients_leave() -> None:
    """The hub's process may finish first; clients still exchanging frames through it must not be cut off."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        hub_port = probe.getsockname()[1]
    addresses = {"c": f"127.0.0.1:{hub_port}"}
    hub_side = TcpNetwork(addresses, SECRET, insecure_shared_secret=True)
    client_side = TcpNetwork(addresses, SECRET, insecure_shared_secret=True)
    hub_done = trio.Event()
    hub_closed_at: list[float] = []

    async def run_hub() -> None:
        async with hub_side.endpoints(ROSTER, ["c"]) as mine:
            hub = mine["c"]
            with trio.fail_after(10):
                while len(hub._clients) < 2:
                    await trio.sleep(0.01)
            hub_done.set()  # "the hub's own run is over": leaving the block lingers for the clients
        hub_closed_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_hub)
        async with client_side.endpoints(ROSTER, ["w0", "w1"]) as theirs:
            await hub_done.wait()
            await trio.sleep(0.3)
            for i in range(20):
                await theirs["w0"].send("w1", b"late %d" % i)
            with trio.fail_after(10):
                assert [await theirs["w1"].receive() for _ in range(20)] == [("w0", b"late %d" % i) for i in range(20)]
            assert not hub_closed_at  # still there, relaying
            left = trio.current_time()
    assert hub_closed_at and hub_closed_at[0] - left < 5  # and gone soon after the clients left


# --- TLS: who may join the star ----------------------------------------------------------------------------


@pytest.fixture
def federation(tmp_path: Path) -> tuple[FederationCA, dict[str, TlsFiles]]:
    ca = FederationCA.create()
    kits = {}
    for party in ROSTER:
        (tmp_path / "kits" / party).mkdir(parents=True)
        kits[party] = ca.issue(party).write(tmp_path / "kits" / party)
    return ca, kits


async def test_a_client_claiming_another_name_is_refused_while_the_star_run_completes(
    federation, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    ca, kits = federation
    meter = Meter(trio.current_time)
    with trio.fail_after(60):
        async with open_tcp_network(ROSTER, tls=kits, topology="star") as endpoints:
            hub = endpoints["c"]
            digest = roster_digest(ROSTER)
            # w0's own valid certificate, claiming to be w1 (to receive w1's frames, or speak for it)
            await tcp_helpers.rogue_hello(hub.addresses["c"], kits["w0"], "w0", [STAR_TLS_HELLO_VERSION, 0, digest, "w1", "c"])
            # w0's certificate dialling as a mesh party
            await tcp_helpers.rogue_hello(hub.addresses["c"], kits["w0"], "w0", [TLS_HELLO_VERSION, 0, digest, "w0", "c"])
            results = await run_parties(
                toy_machines(), endpoints, config=RuntimeConfig(deadline_s=20.0), meter=meter
            )
            assert set(hub._clients) <= {"w0", "w1"}
    np.testing.assert_array_equal(results["c"], expected_sums())
    assert results["w0"] == results["w1"] == 3 and meter.rejected_frames == 0
    warnings = warnings_of(caplog)
    assert any("the certificate names 'w0' but the hello claims 'w1'" in w for w in warnings), warnings
    assert any("dials as a full-mesh party, this endpoint is the hub of a star" in w for w in warnings), warnings


async def test_a_star_client_dialling_a_mesh_party_is_told_the_topologies_differ(caplog) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with open_tcp_network(ROSTER, SECRET) as mesh:  # c listens as a mesh party
        client = TcpTransport("w0", ROSTER, {"c": mesh["c"].addresses["c"]}, SECRET, topology="star")
        async with trio.open_nursery() as nursery:
            await nursery.start(client.serve)
            with pytest.raises(PeerUnreachable, match="refused by the peer .*topology"):
                with trio.fail_after(10):
                    await client.receive()
            await client.aclose()
    assert any("dials as a star client, this endpoint is a full-mesh party" in w for w in warnings_of(caplog))


# --- rosters and kits without client addresses --------------------------------------------------------------


def test_the_topology_options_of_the_command_line(capsys) -> None:
    from fedproto.cli import main

    assert main(["run", "fastlloyd", "--data", "iris", "--topology", "mesh"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "argument --topology: applies to --transport tcp, not memory" in err, err


def test_a_star_roster_needs_only_the_hubs_address(tmp_path: Path) -> None:
    roster = Roster(ROSTER, {"c": "10.0.0.1:7000"}, SECRET)
    assert roster.topology == "star" and roster.hub == "c"
    doc = roster.to_dict()
    assert doc["parties"] == [{"name": "c", "address": "10.0.0.1:7000"}, {"name": "w0"}, {"name": "w1"}]
    assert "topology" not in doc  # the default
    assert Roster.load(roster.save(tmp_path / "r.json")) == roster
    mesh = Roster(ROSTER, {p: f"h:{i + 1}" for i, p in enumerate(ROSTER)}, SECRET, topology="mesh")
    assert Roster.from_dict(mesh.to_dict()) == mesh and mesh.to_dict()["topology"] == "mesh"
    for bad, words in [
        ({**doc, "topology": "mesh"}, "parties[1] (w0) needs an 'address': in a mesh every party listens"),
        ({**doc, "parties": doc["parties"][1:]}, "parties[0] (w0) needs an 'address': the first party is the"),
        ({**doc, "topology": "ring"}, "topology must be"),
    ]:
        with pytest.raises(ValueError, match=re.escape(words)):
            Roster.from_dict(bad)


async def test_a_provisioned_star_whose_clients_have_no_address_runs_from_its_kits(tmp_path: Path) -> None:
    hub_socket = socket.create_server(("127.0.0.1", 0))
    kits = provision(ROSTER, {"c": f"127.0.0.1:{hub_socket.getsockname()[1]}"}, tmp_path / "fed", session=3)
    rosters = {p: Roster.load(kits[p] / "roster.json") for p in ROSTER}
    assert all(r.addresses == {"c": rosters["c"].addresses["c"]} for r in rosters.values())
    networks = {p: TcpNetwork.from_roster(rosters[p], listen_fds={"c": hub_socket.detach()} if p == "c" else None)
                for p in ROSTER}
    machines = toy_machines()
    meter = Meter(trio.current_time)
    results: dict = {}

    async def party(name: str) -> None:
        async with networks[name].endpoints(local=[name]) as mine:
            assert mine[name].topology == "star" and mine[name].uses_tls
            assert (mine[name]._listeners == []) == (name != "c")  # only the hub listens
            results[name] = await run_party(machines[name], mine[name], config=RuntimeConfig(session=3), meter=meter)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for name in ROSTER:
                nursery.start_soon(party, name)
    np.testing.assert_array_equal(results["c"], expected_sums())


def test_fedproto_party_processes_whose_clients_have_no_address(tmp_path: Path) -> None:
    """The deployment path of the star: provision with --hub only, start the hub, clients dial out."""
    parties = ("server", "client-0", "client-1")
    hub_socket = socket.create_server(("127.0.0.1", 0))
    procs: dict[str, subprocess.Popen] = {}
    try:
        done = subprocess.run(
            [*FEDPROTO, "provision", "--parties", ",".join(parties), "--hub",
             f"127.0.0.1:{hub_socket.getsockname()[1]}", "--out", str(tmp_path / "fed")],
            capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "client-0 dials out to the hub server" in done.stdout
        for party in parties:
            doc = json.loads((tmp_path / "fed" / party / "roster.json").read_text())
            assert [("address" in entry) for entry in doc["parties"]] == [True, False, False]
            listen = ["--listen-fd", str(hub_socket.fileno())] if party == "server" else []
            procs[party] = subprocess.Popen(
                [*FEDPROTO, "party", str(SECURE_SUM), "--party", party, "--roster",
                 str(tmp_path / "fed" / party / "roster.json"), *listen,
                 "--party-report", str(tmp_path / f"{party}.json"), "--deadline", "30"],
                pass_fds=(hub_socket.fileno(),) if party == "server" else (),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
        hub_socket.close()  # the hub holds its own copy
        for party, proc in procs.items():
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"{party}: {err[-2000:]}"
    finally:
        hub_socket.close()
        helpers.kill_all(procs.values())
    docs = {p: json.loads((tmp_path / f"{p}.json").read_text()) for p in parties}
    reports = [RunReport.from_dict(doc["report"]) for doc in docs.values()]
    for report in reports:  # no client-to-client frames in this protocol: nothing relayed
        assert report.relay_overhead_bytes == 0 and report.tls_overhead_bytes == RECORD_OVERHEAD_BYTES * report.messages
    tutorial = load_file(SECURE_SUM, "secure_sum_for_star_test")
    expected = sum(tutorial.client_values(0, i, 8) for i in range(2))  # --seed 0, --d 8, --clients 2
    assert docs["server"]["result"]["sum"] == expected.tolist()


@pytest.mark.slow
def test_fedproto_run_over_tcp_star_and_mesh_agree_with_memory_and_report_relay_bytes(tmp_path: Path) -> None:
    argv = ["run", "dckmeans", "--data", "iris", "--deletions", "4", "--no-timing", "--height", "2", "--width", "2",
            "--quiet"]
    runs = {"memory": [], "star": ["--transport", "tcp"], "mesh": ["--transport", "tcp", "--topology", "mesh"]}
    reports = {}
    for name, extra in runs.items():
        out = tmp_path / f"{name}.json"
        done = subprocess.run([*FEDPROTO, *argv, *extra, "--report", str(out)], capture_output=True, text=True,
                              timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr[-2000:]
        reports[name] = json.loads(out.read_text())
    for name, report in reports.items():
        assert report["links"] == reports["memory"]["links"], f"per-link payload bytes over {name} differ"
        assert report["results"]["centroids"] == reports["memory"]["results"]["centroids"]
    assert reports["star"]["relay_overhead_bytes"] > 0 and reports["mesh"]["relay_overhead_bytes"] == 0
    assert reports["star"]["tls_overhead_bytes"] == RECORD_OVERHEAD_BYTES * reports["star"]["messages"]


async def test_concurrent_sends_on_one_star_link_arrive_whole_and_in_each_senders_order() -> None:
    # A send whose link's writer is idle writes its frame itself; others queue for the writer
    # meanwhile. Four tasks sending at once must neither write two frames at a time (trio refuses
    # concurrent writes) nor lose or reorder one.
    async with open_tcp_network(ROSTER, SECRET, topology="star") as eps:
        hub, client = eps["c"], eps["w0"]

        async def sender(task: int) -> None:
            for i in range(50):
                await hub.send("w0", b"%d:%d:" % (task, i) + b"x" * (i * 97 % 3000))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for task in range(4):
                    nursery.start_soon(sender, task)
            got = [await client.receive() for _ in range(200)]
        assert {sender for sender, _ in got} == {"c"}
        per_task: dict[int, list[int]] = {}
        for _, frame in got:
            task, i, _ = frame.split(b":", 2)
            per_task.setdefault(int(task), []).append(int(i))
        assert per_task == {task: list(range(50)) for task in range(4)}
        assert client.receive_nowait() is None


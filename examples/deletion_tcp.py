"""DC-k-means with deletion requests, every party as its own OS process, talking TCP on loopback.

The deployment version of ``deletion_memory.py``: a roster file (every party's address and the
run's shared secret) is the only thing the parties share. This script writes one, then starts
itself once per party (``--party NAME --roster FILE``); each party process derives the same public
tree and leaf table from the arguments, builds only its own machine (a leaf gets only its own
points), serves its ``TcpTransport`` (HMAC handshake, length-prefixed frames) and runs it with
``run_party``. The launcher waits for all of them (with a timeout, killing leftovers), merges their
reports and prints the centroids and the exact payload bytes: the same as the in-memory example's
for the same arguments, with the same zero bytes from the leaves off each deletion's path.

Run (from the repository root, in the project's environment)::

    python examples/deletion_tcp.py --data iris --deletions 5 --seed 0
"""

from __future__ import annotations

import argparse
import json
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
import trio

from fedproto.algorithms.deletion import streams
from fedproto.algorithms.deletion.dckmeans import DCKMeansConfig
from fedproto.algorithms.deletion.protocol import ROOT, DCTree
from fedproto.data import load_dataset, normalize
from fedproto.metering import Meter, RunReport
from fedproto.runtime import RuntimeConfig, run_party
from fedproto.transports.tcp import TcpNetwork

TIMEOUT_S = 150


def build_tree(args: argparse.Namespace) -> tuple[DCTree, str]:
    """The run's public tree; every process derives the same one from the same arguments."""
    dataset = load_dataset(args.data)
    x = normalize(dataset.x, 0.5) + 0.5
    ids = np.arange(x.shape[0])
    stream = [int(i) for i in streams.deletion_stream(ids, args.deletions, args.seed + 1)]
    config = DCKMeansConfig(k=dataset.paper_k or 3)
    return DCTree(x, ids, config, key=jax.random.PRNGKey(args.seed), deletions=stream), dataset.name


def run_one_party(args: argparse.Namespace) -> None:
    """Party mode: serve this party's endpoint, run its machine, write its result and report."""
    roster_doc = json.loads(Path(args.roster).read_text())
    roster, session = list(roster_doc["addresses"]), roster_doc["session"]
    tree, _ = build_tree(args)
    machine = tree.make_machine(args.party)
    network = TcpNetwork(roster_doc["addresses"], bytes.fromhex(roster_doc["secret"]), session=session)
    meter = Meter(trio.current_time)

    async def run():
        async with network.endpoints(roster, [args.party]) as endpoints:
            return await run_party(machine, endpoints[args.party], config=RuntimeConfig(session=session), meter=meter)

    result = trio.run(run)
    report = meter.report(protocol="dckmeans", transport="tcp", session=session, parties=roster)
    centroids = result.centroids.tolist() if args.party == ROOT else None
    Path(args.out).write_text(json.dumps({"centroids": centroids, "report": report.to_dict()}))


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (all held open until each is chosen)."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def launch(args: argparse.Namespace) -> None:
    """Launcher mode: write the roster, start one process per party, collect their outputs."""
    tree, name = build_tree(args)
    roster = list(tree.roster)
    common = ["--data", args.data, "--deletions", str(args.deletions), "--seed", str(args.seed)]
    with tempfile.TemporaryDirectory() as tmp:
        roster_file = Path(tmp, "roster.json")
        roster_file.write_text(json.dumps({
            "session": 1,
            "secret": secrets.token_hex(32),
            "addresses": {p: f"127.0.0.1:{port}" for p, port in zip(roster, free_ports(len(roster)))},
        }))
        procs, logs = {}, []
        try:
            for p in roster:
                cmd = [sys.executable, __file__, *common, "--party", p, "--roster", str(roster_file),
                       "--out", str(Path(tmp, f"{p}.json"))]
                logs.append(Path(tmp, f"{p}.err").open("w"))
                procs[p] = subprocess.Popen(cmd, stderr=logs[-1])
            deadline = time.monotonic() + TIMEOUT_S
            for p, proc in procs.items():
                if proc.wait(timeout=max(deadline - time.monotonic(), 0.1)) != 0:
                    sys.exit(f"party {p} failed: {Path(tmp, f'{p}.err').read_text().strip()[-500:]}")
        except subprocess.TimeoutExpired:
            sys.exit(f"the run did not finish within {TIMEOUT_S} s")
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for log in logs:
                log.close()
        outputs = {p: json.loads(Path(tmp, f"{p}.json").read_text()) for p in roster}

    # Each process counted the frames it sent; together they count every frame once.
    report = RunReport.merge([RunReport.from_dict(o["report"]) for o in outputs.values()])
    print(f"DC-k-means over TCP on {name}: {len(roster)} processes (a root and {len(roster) - 1} leaves), "
          f"{len(tree.deletions)} deletions")
    print("centroids:")
    for j, row in enumerate(outputs[ROOT]["centroids"]):
        print(f"  c{j}: " + " ".join(f"{v:+.6f}" for v in row))
    sent = {}
    for link in report.links:
        sent[(link.round_idx, link.sender)] = sent.get((link.round_idx, link.sender), 0) + link.payload_bytes
    leaves = roster[1:]
    for r, point_id in enumerate(tree.deletions, start=1):
        owner = tree.owners[point_id]
        others = sum(sent.get((r, leaf), 0) for leaf in leaves if leaf != owner)
        print(f"deletion {r}: point {point_id} at {owner}: root sent {sent.get((r, ROOT), 0)} bytes, "
              f"{owner} sent {sent.get((r, owner), 0)} bytes, the other {len(leaves) - 1} leaves sent {others} bytes")
    for round_idx, nbytes in report.bytes_by_round().items():
        print(f"round {round_idx} bytes: {nbytes}")
    print(f"total payload bytes: {report.payload_bytes} in {report.messages} messages "
          f"(+ {report.framing_overhead_bytes} bytes of TCP length prefixes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="iris")
    parser.add_argument("--deletions", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--party", help=argparse.SUPPRESS)  # party mode (started by the launcher)
    parser.add_argument("--roster", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.party:
        run_one_party(args)
    else:
        launch(args)


if __name__ == "__main__":
    main()

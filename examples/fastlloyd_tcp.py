"""FastLloyd with every party as its own OS process, talking TCP on loopback.

Shows how a real deployment is wired: a roster file (every party's address and the run's shared
secret) is the only thing the parties share. This script writes one, then starts itself once per
party (``--party NAME --roster FILE``); each party process builds only its own machine, serves
its ``TcpTransport`` (HMAC handshake, length-prefixed frames) and runs it with ``run_party``.
The launcher waits for all of them (with a timeout, killing leftovers), merges their reports
and prints the centroids and the exact payload bytes, the same as the in-memory example's for
the same arguments.

Run (from the repository root, in the project's environment)::

    python examples/fastlloyd_tcp.py --data iris --clients 2 --epsilon 1 --seed 0

On several hosts, give each party its host's address in the roster and start
``python examples/fastlloyd_tcp.py --party NAME --roster roster.json --out NAME.json`` there.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from fedproto.algorithms.fastlloyd.config import make_config
from fedproto.algorithms.fastlloyd.protocol import FastLloydClient, FastLloydServer
from fedproto.data import load_dataset, normalize, partition
from fedproto.metering import Meter, RunReport
from fedproto.runtime import RuntimeConfig, run_party
from fedproto.transports.tcp import TcpNetwork

TIMEOUT_S = 120


def build_machine(args: argparse.Namespace, party: str, session: int):
    """The machine of one party; every process derives the same public config and split."""
    dataset = load_dataset(args.data)
    x = normalize(dataset.x)
    n, d = x.shape
    config = make_config("fastlloyd", n=n, k=dataset.paper_k or 3, d=d, epsilon=args.epsilon, init_seed=args.seed)
    clients = [f"client-{i}" for i in range(args.clients)]
    if party == "server":
        return FastLloydServer("server", config=config, clients=clients, noise_seed=args.seed)
    points = x[partition(n, args.clients, seed=args.seed)[clients.index(party)]]
    return FastLloydClient(party, config=config, server="server", clients=clients, points=points,
                           entropy=os.urandom(32), session=session)


def run_one_party(args: argparse.Namespace) -> None:
    """Party mode: serve this party's endpoint, run its machine, write its result and report."""
    roster_doc = json.loads(Path(args.roster).read_text())
    roster, session = list(roster_doc["addresses"]), roster_doc["session"]
    machine = build_machine(args, args.party, session)
    network = TcpNetwork(roster_doc["addresses"], bytes.fromhex(roster_doc["secret"]), session=session)
    meter = Meter(trio.current_time)

    async def run():
        async with network.endpoints(roster, [args.party]) as endpoints:
            return await run_party(machine, endpoints[args.party], config=RuntimeConfig(session=session), meter=meter)

    result = trio.run(run)
    report = meter.report(protocol="fastlloyd", transport="tcp", session=session, parties=roster)
    centroids = result.centroids.tolist() if args.party != "server" else None
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
    roster = ["server", *(f"client-{i}" for i in range(args.clients))]
    common = ["--data", args.data, "--clients", str(args.clients), "--epsilon", str(args.epsilon),
              "--seed", str(args.seed)]
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
    print(f"FastLloyd over TCP: {len(roster)} processes ({args.clients} clients), data {args.data}")
    print("centroids:")
    for j, row in enumerate(outputs["client-0"]["centroids"]):
        print(f"  c{j}: " + " ".join(f"{v:+.6f}" for v in row))
    print(f"setup bytes: {report.setup_bytes}")
    for round_idx, nbytes in report.bytes_by_round().items():
        print(f"round {round_idx} bytes: {nbytes}")
    print(f"total payload bytes: {report.payload_bytes} in {report.messages} messages "
          f"(+ {report.framing_overhead_bytes} bytes of TCP length prefixes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="iris")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--epsilon", type=float, default=1.0)
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

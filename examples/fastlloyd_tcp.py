"""FastLloyd with every party as its own OS process, talking TCP on loopback.

Shows how a real deployment is wired: each party gets a kit (its own TLS key and certificate
from the run's federation CA, and a roster file with every party's address and the run's
session; see :class:`fedproto.Roster`). :func:`fedproto.launch_local` binds one listening socket
per party on loopback, provisions a throwaway kit per party and starts this script once per
party (``--party NAME --roster KIT/roster.json --listen-fd FD``); each party process builds only
its own machine, serves its ``TcpTransport`` (mutual TLS 1.3, length-prefixed frames) on the
socket it inherited and runs it with ``run_party``. The launcher
waits for all of them (with a timeout, stopping the others when one fails), then this script
merges their reports and prints the centroids and the exact payload bytes, the same as the
in-memory example's for the same arguments.

Run (from the repository root, in the project's environment)::

    python examples/fastlloyd_tcp.py --data iris --clients 2 --epsilon 1 --seed 0

On several hosts, provision the federation with each party's host address (``fedproto provision
--parties ... --address NAME=HOST:PORT ... --session SESSION --out federation``), copy each host
its party's kit and start ``python examples/fastlloyd_tcp.py --party NAME --roster
federation/NAME/roster.json --out NAME.json`` there (without ``--listen-fd`` a party binds the
address the roster gives it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import trio

from fedproto import Roster, launch_local
from fedproto.algorithms.fastlloyd.config import make_config
from fedproto.algorithms.fastlloyd.protocol import FastLloydClient, FastLloydServer
from fedproto.data import load_dataset, normalize, partition
from fedproto.launcher import LaunchError, discard_launched_kit, launch_directory
from fedproto.metering import Meter, RunReport
from fedproto.runtime import RuntimeConfig, run_party
from fedproto.transports.tcp import TcpNetwork

TIMEOUT_S = 120
SESSION = 1


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
    roster_file = Roster.load(args.roster)
    roster, session = roster_file.parties, roster_file.session if roster_file.session is not None else SESSION
    machine = build_machine(args, args.party, session)
    listen_fds = {args.party: args.listen_fd} if args.listen_fd is not None else None
    network = TcpNetwork.from_roster(roster_file, listen_fds=listen_fds, session=session)
    meter = Meter(trio.current_time)

    async def run():
        async with network.endpoints(roster, [args.party]) as endpoints:
            discard_launched_kit(args.roster)  # loaded: a kit launch_local made goes (yours stays)
            return await run_party(machine, endpoints[args.party], config=RuntimeConfig(session=session), meter=meter)

    result = trio.run(run)
    report = meter.report(protocol="fastlloyd", transport="tcp", session=session, parties=roster)
    centroids = result.centroids.tolist() if args.party != "server" else None
    Path(args.out).write_text(json.dumps({"centroids": centroids, "report": report.to_dict()}))


def launch(args: argparse.Namespace) -> None:
    """Launcher mode: start one process per party (each on a socket bound for it), collect their outputs."""
    roster = ["server", *(f"client-{i}" for i in range(args.clients))]
    common = ["--data", args.data, "--clients", str(args.clients), "--epsilon", str(args.epsilon),
              "--seed", str(args.seed)]
    with launch_directory() as tmp:  # private; a later launch removes it if this one is killed

        def party_command(party: str, roster_file: Path, listen_fd: int) -> list[str]:
            return [sys.executable, __file__, *common, "--party", party, "--roster", str(roster_file),
                    "--listen-fd", str(listen_fd), "--out", str(Path(tmp, f"{party}.json"))]

        try:
            launch_local(roster, party_command, timeout_s=TIMEOUT_S, session=SESSION)
        except LaunchError as exc:  # a party failed or the run timed out: one line, no traceback
            sys.exit(f"fastlloyd_tcp: {exc}")
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
    parser.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.party:
        run_one_party(args)
    else:
        launch(args)


if __name__ == "__main__":
    main()

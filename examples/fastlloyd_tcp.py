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

The two modes' plumbing (party options, a party's run from its kit, the launch) is in
``examples/_common.py``, shared with ``deletion_tcp.py``; this file holds what is FastLloyd's.

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
from pathlib import Path

from _common import fastlloyd_options, launch_parties, print_centroids, print_round_bytes, run_modes, run_party_from_kit

from fedproto.algorithms.fastlloyd.config import make_config
from fedproto.algorithms.fastlloyd.protocol import FastLloydClient, FastLloydServer
from fedproto.data import load_dataset, normalize, partition

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
        return FastLloydServer("server", config=config, clients=clients, noise_seed=args.seed, session=session)
    points = x[partition(n, args.clients, seed=args.seed)[clients.index(party)]]
    return FastLloydClient(party, config=config, server="server", clients=clients, points=points,
                           entropy=os.urandom(32), session=session)


def run_one_party(args: argparse.Namespace) -> None:
    """Party mode: serve this party's endpoint, run its machine, write its result and report."""
    result, report = run_party_from_kit(args, lambda session: build_machine(args, args.party, session),
                                        protocol="fastlloyd", session=SESSION)
    centroids = result.centroids.tolist() if args.party != "server" else None
    Path(args.out).write_text(json.dumps({"centroids": centroids, "report": report.to_dict()}))


def launch(args: argparse.Namespace) -> None:
    """Launcher mode: start one process per party (each on a socket bound for it), collect their outputs."""
    roster = ["server", *(f"client-{i}" for i in range(args.clients))]
    common = ["--data", args.data, "--clients", str(args.clients), "--epsilon", str(args.epsilon),
              "--seed", str(args.seed)]
    outputs, report = launch_parties(__file__, roster, common, name="fastlloyd_tcp", session=SESSION,
                                     timeout_s=TIMEOUT_S)
    print(f"FastLloyd over TCP: {len(roster)} processes ({args.clients} clients), data {args.data}")
    print_centroids(outputs["client-0"]["centroids"])
    print(f"setup bytes: {report.setup_bytes}")
    print_round_bytes(report, tcp=True)


def main() -> None:
    run_modes(fastlloyd_options(__doc__.splitlines()[0]), run_one_party, launch)


if __name__ == "__main__":
    main()

"""DC-k-means with deletion requests, every party as its own OS process, talking TCP on loopback.

The deployment version of ``deletion_memory.py``: each party gets a kit (its own TLS key and
certificate, and a roster file with every party's address and the run's session; see
:class:`fedproto.Roster`). :func:`fedproto.launch_local` binds one listening socket per party on
loopback, provisions a throwaway kit per party and starts this script once per party
(``--party NAME --roster KIT/roster.json --listen-fd FD``); each party process derives the same
public tree and leaf table from the arguments, builds only its own machine (a leaf gets only its
own points), serves its ``TcpTransport`` (mutual TLS 1.3, length-prefixed frames) on the socket it
inherited and runs it with ``run_party``. The launcher waits for all of
them (with a timeout, stopping the others when one fails); this script then merges their reports
and prints the centroids and the exact payload bytes: the same as the in-memory example's for the
same arguments, with the same zero bytes from the leaves off each deletion's path.

The two modes' plumbing (party options, a party's run from its kit, the launch) is in
``examples/_common.py``, shared with ``fastlloyd_tcp.py``; this file holds what is DC-k-means'.

Run (from the repository root, in the project's environment)::

    python examples/deletion_tcp.py --data iris --removals 5 --seed 0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import numpy as np
from _common import deletion_options, launch_parties, print_centroids, print_deletion_bytes, print_round_bytes, run_modes, run_party_from_kit

from fedproto.algorithms.deletion import streams
from fedproto.algorithms.deletion.dckmeans import DCKMeansConfig
from fedproto.algorithms.deletion.protocol import ROOT, DCTree
from fedproto.data import load_dataset, normalize

TIMEOUT_S = 150
SESSION = 1


def build_tree(args: argparse.Namespace) -> tuple[DCTree, str]:
    """The run's public tree; every process derives the same one from the same arguments."""
    dataset = load_dataset(args.data)
    x = normalize(dataset.x, 0.5) + 0.5
    ids = np.arange(x.shape[0])
    stream = [int(i) for i in streams.deletion_stream(ids, args.removals, args.seed + 1)]
    config = DCKMeansConfig(k=dataset.paper_k or 3)
    return DCTree(x, ids, config, key=jax.random.PRNGKey(args.seed), deletions=stream), dataset.name


def run_one_party(args: argparse.Namespace) -> None:
    """Party mode: serve this party's endpoint, run its machine, write its result and report."""
    result, report = run_party_from_kit(args, lambda session: build_tree(args)[0].make_machine(args.party),
                                        protocol="dckmeans", session=SESSION)
    centroids = result.centroids.tolist() if args.party == ROOT else None
    Path(args.out).write_text(json.dumps({"centroids": centroids, "report": report.to_dict()}))


def launch(args: argparse.Namespace) -> None:
    """Launcher mode: start one process per party (each on a socket bound for it), collect their outputs."""
    tree, name = build_tree(args)
    roster = list(tree.roster)
    common = ["--data", args.data, "--removals", str(args.removals), "--seed", str(args.seed)]
    outputs, report = launch_parties(__file__, roster, common, name="deletion_tcp", session=SESSION,
                                     timeout_s=TIMEOUT_S)
    print(f"DC-k-means over TCP on {name}: {len(roster)} processes (a root and {len(roster) - 1} leaves), "
          f"{len(tree.deletions)} deletions")
    print_centroids(outputs[ROOT]["centroids"])
    print_deletion_bytes(report, tree.deletions, tree.owners, ROOT, roster[1:])
    print_round_bytes(report, tcp=True)


def main() -> None:
    run_modes(deletion_options(__doc__.splitlines()[0]), run_one_party, launch)


if __name__ == "__main__":
    main()

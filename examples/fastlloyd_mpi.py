"""FastLloyd under MPI: one party per rank (rank 0 the server, rank i+1 client i).

Shows that a protocol machine does not care how bytes move: each rank builds only its own party
(the same public config and data split as every other rank, derived from the arguments) and
drives it with ``run_party`` over the MPI transport (``MpiNetwork``: frames are MPI messages,
polled without blocking trio). Rank 1 (client 0) prints the centroids, the same as the
in-memory and TCP examples' for the same arguments, and the payload bytes of the whole run.

Run with M clients on M+1 ranks (from the repository root, in the project's environment)::

    mpiexec -n 3 python examples/fastlloyd_mpi.py --data iris --clients 2 --epsilon 1 --seed 0
"""

from __future__ import annotations

import os
import sys

import numpy as np
import trio
from mpi4py import MPI

from _common import fastlloyd_options

from fedproto.algorithms.fastlloyd.config import make_config
from fedproto.algorithms.fastlloyd.protocol import FastLloydClient, FastLloydServer
from fedproto.data import load_dataset, normalize, partition
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_party
from fedproto.transports.mpi import MpiNetwork


def main() -> None:
    args = fastlloyd_options(__doc__.splitlines()[0]).parse_args()

    comm = MPI.COMM_WORLD
    if comm.Get_size() != args.clients + 1:
        if comm.Get_rank() == 0:
            print(f"start {args.clients} clients with mpiexec -n {args.clients + 1}", file=sys.stderr)
        sys.exit(2)
    clients = [f"client-{i}" for i in range(args.clients)]
    roster = ["server", *clients]
    party = roster[comm.Get_rank()]

    dataset = load_dataset(args.data)
    x = normalize(dataset.x)
    n, d = x.shape
    k = dataset.paper_k or 3
    config = make_config("fastlloyd", n=n, k=k, d=d, epsilon=args.epsilon, init_seed=args.seed)
    session = 1
    if party == "server":
        machine = FastLloydServer("server", config=config, clients=clients, noise_seed=args.seed, session=session)
    else:
        points = x[partition(n, args.clients, seed=args.seed)[clients.index(party)]]
        machine = FastLloydClient(party, config=config, server="server", clients=clients, points=points,
                                  entropy=os.urandom(32), session=session)
    meter = Meter(trio.current_time)

    async def run():
        async with MpiNetwork().endpoints(roster) as endpoints:
            return await run_party(machine, endpoints[party], config=RuntimeConfig(session=session), meter=meter)

    result = trio.run(run)
    report = meter.report(protocol="fastlloyd", transport="mpi", session=session, parties=roster)
    # Each rank counted the frames it sent; the sum over ranks is the run's payload.
    total = np.zeros(2, dtype=np.int64)
    comm.Allreduce(np.array([report.payload_bytes, report.messages], dtype=np.int64), total)

    if party == "client-0":
        print(f"FastLloyd over MPI: {comm.Get_size()} ranks ({args.clients} clients), data {dataset.name}, k={k}")
        print("centroids:")
        for j, row in enumerate(result.centroids):
            print(f"  c{j}: " + " ".join(f"{v:+.6f}" for v in row))
        print(f"total payload bytes: {total[0]} in {total[1]} messages")


if __name__ == "__main__":
    main()

"""FastLloyd with every party in this process, over the in-memory transport.

Shows the library API end to end: calibrate a run (``make_config``), normalise and split a data
set over M clients, build one sans-IO machine per party (a ``FastLloydServer`` and M
``FastLloydClient`` s), drive them all with ``run_parties`` over a ``MemoryNetwork``, then read
the centroids, their NICV (normalised intra-cluster variance), and the exact payload bytes per
round from the metered report. The memory transport encodes every message, so these are the bytes
a TCP or MPI run sends.

Run (from the repository root, in the project's environment)::

    python examples/fastlloyd_memory.py --data iris --clients 2 --epsilon 1 --seed 0

``--data`` is a bundled name (iris, wine, breast_cancer, digits) or a data file; k is the
paper's k for the data set (3 when unknown).
"""

from __future__ import annotations

import os

import jax.numpy as jnp
import trio

from _common import fastlloyd_options

from fedproto.algorithms import kmeans
from fedproto.algorithms.fastlloyd.config import make_config
from fedproto.algorithms.fastlloyd.protocol import FastLloydClient, FastLloydServer
from fedproto.data import load_dataset, normalize, partition
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.transports.memory import MemoryNetwork


def main() -> None:
    args = fastlloyd_options(__doc__.splitlines()[0]).parse_args()

    dataset = load_dataset(args.data)
    x = normalize(dataset.x)  # every feature to [-1, 1]
    n, d = x.shape
    k = dataset.paper_k or 3
    config = make_config("fastlloyd", n=n, k=k, d=d, epsilon=args.epsilon, init_seed=args.seed)
    parts = partition(n, args.clients, seed=args.seed)

    clients = [f"client-{i}" for i in range(args.clients)]
    roster = ["server", *clients]
    session = 1
    server = FastLloydServer("server", config=config, clients=clients, noise_seed=args.seed, session=session)
    machines = {"server": server}
    for name, idx in zip(clients, parts):
        machines[name] = FastLloydClient(
            name, config=config, server="server", clients=clients, points=x[idx],
            entropy=os.urandom(32),  # the client's key-agreement secret: never from the seed
            session=session,
        )

    network = MemoryNetwork(roster)
    meter = Meter(trio.current_time)

    async def run():
        return await run_parties(machines, network, config=RuntimeConfig(session=session), meter=meter)

    results = trio.run(run)
    report = meter.report(protocol="fastlloyd", transport="memory", session=session, parties=roster)

    centroids = results["client-0"].centroids  # every client holds the same centroids
    print(f"FastLloyd on {dataset.name}: N={n}, d={d}, k={k}, {args.clients} clients, epsilon={args.epsilon}")
    print("centroids:")
    for j, row in enumerate(centroids):
        print(f"  c{j}: " + " ".join(f"{v:+.6f}" for v in row))
    print(f"NICV: {float(kmeans.nicv(jnp.asarray(x), jnp.asarray(centroids))):.6f}")
    print(f"setup bytes: {report.setup_bytes}")
    for round_idx, nbytes in report.bytes_by_round().items():
        print(f"round {round_idx} bytes: {nbytes}")
    print(f"total payload bytes: {report.payload_bytes} in {report.messages} messages")


if __name__ == "__main__":
    main()

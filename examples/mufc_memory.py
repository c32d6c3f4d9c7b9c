"""MUFC with every party in this process, over the in-memory transport.

Shows the library API end to end: fix the public parameters (``make_config``: the grid with
gamma = 1/sqrt(n), the prime p > max(n, B^d), T = 2KL syndromes), split a data set over L clients,
build the server and client machines (``MUFCParties``) with a stream of removal requests, drive
them with ``run_parties`` over a ``MemoryNetwork``, then check exact unlearning (the final model
equals a from-scratch run on the remaining data with the same keys) and read the exact bytes of
each round from the metered report: every client's upload is T field elements, whatever it holds.

Run (from the repository root, in the project's environment)::

    python examples/mufc_memory.py --data iris --clients 3 --removals 4 --seed 0
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import jax
import numpy as np
import trio

from fedproto.algorithms.mufc.cli import unit_box
from fedproto.algorithms.mufc.data import client_split
from fedproto.algorithms.mufc.protocol import SERVER, MUFCParties, make_config
from fedproto.algorithms.mufc.replay import replay
from fedproto.data import load_dataset
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.transports.memory import MemoryNetwork


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="iris")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--removals", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    dataset = load_dataset(args.data)
    x = unit_box(dataset.x)  # the public box is [0, 1]^d
    n, d = x.shape
    k = dataset.paper_k or 3
    rows = client_split(x, args.clients, k=k, k_prime=None, seed=args.seed)
    ids = np.arange(n)
    parts = [(x[r], ids[r]) for r in rows]
    config = make_config(n, d, k, args.clients)
    rng = np.random.default_rng(args.seed)
    requests = []  # one random point of a random client per request
    for _ in range(args.removals):
        c = int(rng.integers(args.clients))
        taken = {i for cc, b in requests if cc == c for i in b}
        requests.append((c, (int(rng.choice([i for i in parts[c][1] if int(i) not in taken])),)))
    key = jax.random.PRNGKey(args.seed)
    parties = MUFCParties(parts, config, key=key, requests=requests, seed=args.seed, session=1)

    async def go():
        meter = Meter(trio.current_time)
        network = MemoryNetwork(list(parties.roster))
        results = await run_parties(parties.machines(), network, config=RuntimeConfig(session=1),
                                    meter=meter)
        return results, meter.report(protocol="mufc", transport="memory", session=1, parties=parties.roster)

    results, report = trio.run(go)
    server = results[SERVER]
    gone = {i for _, b in requests for i in b}
    kept = [(xx[~np.isin(ii, list(gone))], ii[~np.isin(ii, list(gone))]) for xx, ii in parts]
    fresh = replay(kept, config, key, (), evaluate=False)
    print(f"{args.data}: n = {n}, d = {d}, K = {k}, L = {args.clients}, grid B = {config.grid.per_dim}, "
          f"p has {config.prime.bit_length()} bits, T = {config.n_syndromes}")
    print(f"decoded point counts per version: {list(server.totals)}")
    print(f"re-seeding requests: {sum(sum(results[c].reseeded) for c in parties.clients)} of {len(requests)}")
    print("final centroids:\n", np.array2string(server.centroids, precision=4))
    print(f"equals retraining on the remaining data with the same keys: "
          f"{np.array_equal(server.centroids, fresh.centroids)}")
    per_round = defaultdict(int)
    for link in report.links:
        per_round[(link.round_idx, link.phase)] += link.payload_bytes
    print(f"share payload per client: {config.syndrome_bytes()} B of field elements + envelope")
    for (round_idx, phase), nbytes in sorted(per_round.items()):
        print(f"  round {round_idx} {phase:9s} {nbytes:8d} B")


if __name__ == "__main__":
    main()

"""DC-k-means with deletion requests, every party in this process, over the in-memory transport.

Shows the deletion protocol end to end: min-max scale a data set to [0, 1]^d (the paper's
preprocessing), build the DC-k-means tree as parties (``DCTree``: a root that coordinates the
deletion stream, one leaf party per leaf holding its points), drive every machine with
``run_parties`` over a ``MemoryNetwork``, and read the exact bytes of every round from the metered
report. Training is round 0; deletion r is round r: the root sends the removal request to the leaf
holding the point, that leaf recomputes and sends its new centroids, the root recomputes the
model. The other leaves send nothing, and the report shows 0 bytes for them. Finally the model is
compared with a from-scratch DC-k-means on the remaining data with the same key (they are equal).

Run (from the repository root, in the project's environment)::

    python examples/deletion_memory.py --data iris --removals 5 --seed 0

``--data`` is a bundled name (iris, wine, breast_cancer, digits) or a data file; k is the paper's
k for the data set (3 when unknown); the width follows the paper's rule ``2^round(log2 n^0.3)``.
``--weighted`` runs the weighted variant (leaves also send their cluster masses).
"""

from __future__ import annotations


import jax
import numpy as np
import trio

from _common import deletion_options, print_centroids, print_deletion_bytes, print_round_bytes

from fedproto.algorithms.deletion import streams
from fedproto.algorithms.deletion.dckmeans import DCKMeans, DCKMeansConfig
from fedproto.algorithms.deletion.protocol import ROOT, DCTree
from fedproto.data import load_dataset, normalize
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.transports.memory import MemoryNetwork


def main() -> None:
    parser = deletion_options(__doc__.splitlines()[0])
    parser.add_argument("--weighted", action="store_true")
    args = parser.parse_args()

    dataset = load_dataset(args.data)
    x = normalize(dataset.x, 0.5) + 0.5  # every feature to [0, 1]
    n, d = x.shape
    k = dataset.paper_k or 3
    ids = np.arange(n)
    stream = [int(i) for i in streams.deletion_stream(ids, args.removals, args.seed + 1)]
    key = jax.random.PRNGKey(args.seed)
    tree = DCTree(x, ids, DCKMeansConfig(k=k, weighted=args.weighted), key=key, deletions=stream)
    session = 1

    network = MemoryNetwork(tree.roster)
    meter = Meter(trio.current_time)

    async def run():
        return await run_parties(tree.machines(), network, config=RuntimeConfig(session=session), meter=meter)

    results = trio.run(run)
    report = meter.report(protocol="dckmeans", transport="memory", session=session, parties=tree.roster)

    centroids = results[ROOT].centroids
    w = tree.tree.width
    kind = "weighted " if args.weighted else ""
    print(f"{kind}DC-k-means on {dataset.name}: N={n}, d={d}, k={k}, w={w} leaves, {len(stream)} deletions")
    print_centroids(centroids)
    print_deletion_bytes(report, stream, tree.owners, ROOT, [p for p in tree.roster if p != ROOT])
    print_round_bytes(report)
    keep = ~np.isin(ids, stream)
    fresh = DCKMeans(DCKMeansConfig(k=k, width=w, weighted=args.weighted), key=key)
    fresh.fit(x[keep], ids[keep], leaves=tree.leaf_of[keep])
    print(f"equals DC-k-means trained on the remaining data with the same key: "
          f"{bool(np.array_equal(centroids, fresh.centroids))}")


if __name__ == "__main__":
    main()

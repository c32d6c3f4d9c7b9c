"""SecAgg+: secure aggregation that survives clients dropping at any stage.

Pairwise masks from keys agreed once per run (X25519) plus a fresh self mask per aggregation,
its seed Shamir-shared among a sparse random neighbourhood (Bell et al., CCS 2020) or among all
clients (classic SecAgg, Bonawitz et al., CCS 2017): the server removes the self masks with t
surviving neighbours' shares, and the pairwise masks of clients that drop with the round's pair
keys their neighbours reveal. Sums over the ring ``Z_{2^w}`` or a prime field.

* :mod:`~fedproto.algorithms.secagg_plus.config`: the public parameters (the algebra, the graph);
* :mod:`~fedproto.algorithms.secagg_plus.engine`: the client and server stage engines that
  protocol machines embed (it re-exports the parameters);
* :mod:`~fedproto.algorithms.secagg_plus.protocol`: a summation protocol built on them, and the
  client and server roles other protocols mix in to embed them;
* :mod:`~fedproto.algorithms.secagg_plus.shamir` and :mod:`~fedproto.algorithms.secagg_plus.graph`:
  Shamir sharing and the neighbourhood graph with its parameters;
* :mod:`~fedproto.algorithms.secagg_plus.messages`: the wire messages and their sizes.
"""


from typing import TYPE_CHECKING

from fedproto._lazy import lazy_exports

if TYPE_CHECKING:
    from fedproto.algorithms.secagg_plus.config import Modulus, SecAggPlusConfig, complete_config, plus_config
    from fedproto.algorithms.secagg_plus.engine import SecAggPlusClient, SecAggPlusServer, SumOutcome
    from fedproto.algorithms.secagg_plus.messages import STAGES, stage_bytes
    from fedproto.algorithms.secagg_plus.protocol import SumClient, SumResult, SumServer, instance_bytes

# The public names load on first use (PEP 562), each from the module defining it, so importing one
# submodule (the messages, or the protocol's client role) does not load the engine with FLINT.
_LAZY = {
    **dict.fromkeys(("Modulus", "SecAggPlusConfig", "complete_config", "plus_config"), ".config"),
    **dict.fromkeys(("SecAggPlusClient", "SecAggPlusServer", "SumOutcome"), ".engine"),
    **dict.fromkeys(("STAGES", "stage_bytes"), ".messages"),
    **dict.fromkeys(("SumClient", "SumResult", "SumServer", "instance_bytes"), ".protocol"),
}

__getattr__, __dir__ = lazy_exports(globals(), _LAZY)


__all__ = [
    "STAGES",
    "Modulus",
    "SecAggPlusClient",
    "SecAggPlusConfig",
    "SecAggPlusServer",
    "SumClient",
    "SumOutcome",
    "SumResult",
    "SumServer",
    "complete_config",
    "instance_bytes",
    "plus_config",
    "stage_bytes",
]

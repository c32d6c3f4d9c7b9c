"""SecAgg+: secure aggregation that survives clients dropping at any stage.

Pairwise masks from X25519 key agreement plus a self mask, with both seeds Shamir-shared among a
sparse random neighbourhood (Bell et al., CCS 2020) or among all clients (classic SecAgg,
Bonawitz et al., CCS 2017), so the server removes the masks of clients that drop from t
surviving neighbours. Sums over the ring ``Z_{2^w}`` or a prime field.

* :mod:`~fedproto.algorithms.secagg_plus.engine`: the configuration and the client and server
  stage engines that protocol machines embed;
* :mod:`~fedproto.algorithms.secagg_plus.protocol`: a summation protocol built on them;
* :mod:`~fedproto.algorithms.secagg_plus.shamir` and :mod:`~fedproto.algorithms.secagg_plus.graph`:
  Shamir sharing and the neighbourhood graph with its parameters;
* :mod:`~fedproto.algorithms.secagg_plus.messages`: the wire messages.
"""


import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedproto.algorithms.secagg_plus.engine import (
        STAGES,
        Modulus,
        SecAggPlusClient,
        SecAggPlusConfig,
        SecAggPlusServer,
        SumOutcome,
        complete_config,
        plus_config,
        stage_bytes,
    )
    from fedproto.algorithms.secagg_plus.protocol import SumClient, SumResult, SumServer, instance_bytes

# The public names load on first use (PEP 562), so importing one submodule (the messages, or the
# protocol's client role) does not load the engine with SCMA and FLINT.
_LAZY = {
    **dict.fromkeys(
        ("STAGES", "Modulus", "SecAggPlusClient", "SecAggPlusConfig", "SecAggPlusServer", "SumOutcome",
         "complete_config", "plus_config", "stage_bytes"),
        "engine",
    ),
    **dict.fromkeys(("SumClient", "SumResult", "SumServer", "instance_bytes"), "protocol"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


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

"""fedproto: round-based distributed and federated protocols.

The core holds messages and their codec, the sans-IO protocol-machine base, the Trio runtime,
metering and reports, data loading and the CLI. It imports neither ``fedproto.algorithms`` nor
``fedproto.transports`` (the CLI's registry finds them through entry points).

Everything a protocol author needs is importable from here (machines, messages, fields, events,
errors, the runtime and the report); the networks live in :mod:`fedproto.transports` and the test
helpers (harness, fault injection, conformance suite) in :mod:`fedproto.testing`.
"""

import importlib.metadata
from typing import TYPE_CHECKING

from fedproto import errors, messages
from fedproto._lazy import lazy_exports
from fedproto.codec import Envelope, decode_frame, encode_frame
from fedproto.errors import *  # the whole hierarchy: fedproto.errors.__all__
from fedproto.machine import ProtocolMachine, machine_states, party_index
from fedproto.messages import *  # messages, fields, actions, events: fedproto.messages.__all__
from fedproto.metering import LinkRecord, Meter, RunReport
from fedproto.runtime import RuntimeConfig, run_parties, run_party
from fedproto.transport import Network, Transport

if TYPE_CHECKING:
    from fedproto.framesize import max_frame_bytes
    from fedproto.launcher import launch_local
    from fedproto.roster import Roster, TlsFiles
    from fedproto.shards import ShardFailed, Shards
    from fedproto.simulation import SimulationStalled, simulate
    from fedproto.star import StarParties, check_clients, client_names, ids_owner

# Names a run does not need load on first use (PEP 562): ``from fedproto import launch_local``
# works as before, but ``fedproto run`` in memory does not import the launcher or the simulator.
_LAZY = {
    "max_frame_bytes": "fedproto.framesize",
    "launch_local": "fedproto.launcher",
    "Roster": "fedproto.roster",
    "TlsFiles": "fedproto.roster",
    "SimulationStalled": "fedproto.simulation",
    "simulate": "fedproto.simulation",
    "Shards": "fedproto.shards",
    "ShardFailed": "fedproto.shards",
    "StarParties": "fedproto.star",
    "check_clients": "fedproto.star",
    "client_names": "fedproto.star",
    "ids_owner": "fedproto.star",
}

__getattr__, __dir__ = lazy_exports(globals(), _LAZY)

try:
    __version__: str = importlib.metadata.version("fedproto")
except importlib.metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "ProtocolMachine",
    # runtime, transports, wire, metering
    "run_party",
    "run_parties",
    "simulate",
    "SimulationStalled",
    "Shards",
    "ShardFailed",
    "machine_states",
    "party_index",
    "StarParties",
    "check_clients",
    "client_names",
    "ids_owner",
    "RuntimeConfig",
    "Transport",
    "Network",
    "Envelope",
    "encode_frame",
    "decode_frame",
    "max_frame_bytes",
    "Meter",
    "RunReport",
    "LinkRecord",
    "Roster",
    "TlsFiles",
    "launch_local",
    "__version__",
]
# Messages and errors as their modules list them, so that a new one needs one entry.
__all__ += messages.__all__
__all__ += errors.__all__

"""fedproto: round-based distributed and federated protocols.

The core holds messages and their codec, the sans-IO protocol-machine base, the Trio runtime,
metering and reports, data loading and the CLI. It imports neither ``algorithms`` nor
``transports`` (the CLI's registry finds them through entry points).
"""

from fedproto.errors import (
    DecodeError,
    FedProtoError,
    InsufficientParticipants,
    LocalProtocolError,
    PeerUnreachable,
    ProtocolError,
    RemoteProtocolError,
    TransportBroken,
    TransportClosed,
    TransportError,
)
from fedproto.machine import ProtocolMachine
from fedproto.messages import (
    Broadcast,
    Message,
    PartyDropped,
    PhaseTimedOut,
    Send,
    SendFailed,
    array_field,
    bigints_field,
)
from fedproto.transport import Transport

__version__ = "0.1.0"

__all__ = [
    "Broadcast",
    "DecodeError",
    "FedProtoError",
    "InsufficientParticipants",
    "LocalProtocolError",
    "Message",
    "PartyDropped",
    "PeerUnreachable",
    "PhaseTimedOut",
    "ProtocolError",
    "ProtocolMachine",
    "RemoteProtocolError",
    "Send",
    "SendFailed",
    "Transport",
    "TransportBroken",
    "TransportClosed",
    "TransportError",
    "array_field",
    "bigints_field",
]

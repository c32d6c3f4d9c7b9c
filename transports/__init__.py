"""The networks that move frames between parties, all behind one :class:`Network` interface.

* memory: :class:`MemoryNetwork` / :class:`MemoryTransport`, every party in one process, with
  optional seeded fault injection (:class:`Faults`);
* tcp: :class:`TcpNetwork` / :class:`TcpTransport` (:class:`TcpAddress`, and
  :func:`open_tcp_network` for every party on loopback in one process);
* mpi: :class:`MpiNetwork` / :class:`MpiTransport`, one party per rank under ``mpiexec``.

Every name but the two interfaces loads on first use, so ``import fedproto.transports`` imports no
network (and works without mpi4py installed).

Every network opens endpoints the same way::

    async with network.endpoints(roster, local) as endpoints:  # {party: Transport}
        ...
"""

from typing import TYPE_CHECKING

from fedproto._lazy import lazy_exports

from fedproto.transport import Network, Transport

if TYPE_CHECKING:
    from fedproto.testing.faults import Faults
    from fedproto.transports.memory import MemoryNetwork, MemoryTransport
    from fedproto.transports.mpi import MpiNetwork, MpiTransport
    from fedproto.transports.tcp import TcpAddress, TcpNetwork, TcpTransport, open_tcp_network

__all__ = [
    "Network",
    "Transport",
    "MemoryNetwork",
    "MemoryTransport",
    "Faults",
    "TcpNetwork",
    "TcpTransport",
    "TcpAddress",
    "open_tcp_network",
    "MpiNetwork",
    "MpiTransport",
]

# Every network loads on first use (PEP 562): a run in memory does not import TCP (or its TLS
# kit), nor the test helpers, and ``import fedproto.transports`` works without mpi4py.
_LAZY = {
    "Faults": "fedproto.testing.faults",
    "MemoryNetwork": "fedproto.transports.memory",
    "MemoryTransport": "fedproto.transports.memory",
    "TcpNetwork": "fedproto.transports.tcp",
    "TcpTransport": "fedproto.transports.tcp",
    "TcpAddress": "fedproto.transports.tcp",
    "open_tcp_network": "fedproto.transports.tcp",
    "MpiNetwork": "fedproto.transports.mpi",
    "MpiTransport": "fedproto.transports.mpi",
}

__getattr__, __dir__ = lazy_exports(globals(), _LAZY)

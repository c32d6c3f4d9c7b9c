# --8<-- [start:header]
"""Secure sum: a server learns the sum of two clients' vectors, and nothing else.

The protocol of the fedproto tutorial (docs/tutorial.md), complete and runnable:

    python docs/tutorial/secure_sum.py                                   # one run in memory
    fedproto run docs/tutorial/secure_sum.py --transport memory          # through the CLI
    fedproto run docs/tutorial/secure_sum.py --transport tcp             # one OS process per party

Roles: one server and the clients (the tutorial uses two). Each client holds a private vector
of ``d`` int64 values. Every pair of clients ``(a, b)``, ``a`` before ``b`` in the list of
clients, derives the same mask ``m_ab`` (``d`` uint64 values from ChaCha20, keyed through HKDF
from a secret the clients share); ``a`` adds it, ``b`` subtracts it, in the ring Z_2^64 (numpy's
uint64 arithmetic wraps around, and int64 values map to it by two's complement). Summed over
all clients the masks cancel, so the server's sum of the masked vectors is the sum of the
private vectors, while one masked vector alone looks uniformly random to the server.

One round (``round_idx`` 0), two phases::

    client -> server     MaskedInput(values = x + masks)        phase "upload"
    server -> client     Total(values = sum of masked vectors)  phase "result"

States: client READY -> WAITING -> DONE; server COLLECT -> DONE. Dropout: the masks cancel only
when every client's vector is in, so the server has no quorum; a client silent past the deadline
makes the server fail with ``InsufficientParticipants`` naming it.

A toy: the clients' shared secret is given at construction. A real protocol agrees on it in a
setup phase (e.g. X25519 key agreement between each pair of clients, relayed by the server, as
fedproto's MUFC does) and survives dropouts by secret-sharing the mask seeds (Bonawitz et al.,
"Practical Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017).
"""

import argparse
import functools
import hashlib
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import trio
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedproto import (
    Message,
    Meter,
    Outgoing,
    ProtocolMachine,
    RemoteProtocolError,
    RunReport,
    StarParties,
    array_field,
    client_names,
    encode_frame,
    machine_states,
    run_parties,
)
from fedproto.plugin import RunPlan
from fedproto.transports import MemoryNetwork

SERVER = "server"
CLIENTS = ("client-0", "client-1")
ROSTER = (SERVER, *CLIENTS)
# --8<-- [end:header]


# --8<-- [start:messages]
class MaskedInput(Message, tag="tutorial.masked"):
    """Client -> server: the client's vector plus its pairwise masks, in Z_2^64.

    Attributes:
        values: ``[d]`` uint64.
    """

    values: np.ndarray = array_field("uint64", ndim=1)

    def __post_init__(self) -> None:
        if not isinstance(self.values, np.ndarray) or self.values.dtype != np.uint64:
            raise TypeError("MaskedInput.values must be a uint64 array")


class Total(Message, tag="tutorial.total"):
    """Server -> client: the sum of all masked vectors (the masks have cancelled).

    Attributes:
        values: ``[d]`` uint64; read as int64 it is the sum of the clients' vectors.
    """

    values: np.ndarray = array_field("uint64", ndim=1)

    def __post_init__(self) -> None:
        if not isinstance(self.values, np.ndarray) or self.values.dtype != np.uint64:
            raise TypeError("Total.values must be a uint64 array")
# --8<-- [end:messages]


# --8<-- [start:masks]
def pair_mask(secret: bytes, first: str, second: str, d: int) -> np.ndarray:
    """The mask of the client pair ``(first, second)``: ``[d]`` uint64 from a keyed ChaCha20.

    HKDF-SHA256 turns the shared secret and the pair's names into a 256-bit key; ChaCha20's
    keystream under that key is the mask. Each key serves one mask only, so a zero nonce is safe.
    """
    info = f"fedproto tutorial secure-sum mask|{first}|{second}".encode()
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)
    keystream = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor().update(bytes(8 * d))
    return np.frombuffer(keystream, dtype="<u8").astype(np.uint64)
# --8<-- [end:masks]


# --8<-- [start:client]
ClientState = machine_states("ClientState", "READY", "WAITING")


class SumClient(ProtocolMachine):
    """A client: sends its masked vector, then waits for the total.

    Args:
        party: this client's name.
        server: the server's name.
        clients: every client, in the same order at every party (it decides who adds a mask and
            who subtracts it).
        values: ``[d]`` integers, the private input.
        secret: the secret all clients share (at least 16 bytes; never sent).

    Raises:
        ValueError: the client list, the values or the secret do not fit.
    """

    State = ClientState
    INITIAL_STATE = ClientState.READY
    # The server's deadline names the silent client; ours fires later, so the server's comes first.
    DEADLINE_FACTOR = 2.0
    TRANSITIONS = {
        (ClientState.WAITING, Total): ("_on_total", ClientState.DONE),
    }

    def __init__(
        self, party: str, *, server: str, clients: Sequence[str], values: np.ndarray, secret: bytes
    ) -> None:
        super().__init__(party)
        self.server = server
        self.clients = tuple(clients)
        if party not in self.clients or len(self.clients) < 2:
            raise ValueError(f"{party!r} must be one of at least two clients, got {self.clients}")
        self.values = np.asarray(values, dtype=np.int64)
        if self.values.ndim != 1:
            raise ValueError(f"values must be a vector, got shape {self.values.shape}")
        if len(secret) < 16:
            raise ValueError("the shared secret must be at least 16 bytes")
        self.secret = bytes(secret)

    def pending(self) -> Sequence[str]:
        return [self.server] if self.state is ClientState.WAITING else []

    def _start(self) -> list[Outgoing]:
        d = len(self.values)
        masked = self.values.astype(np.uint64)  # two's complement: int64 -> Z_2^64
        me = self.clients.index(self.party)
        for other_idx, other in enumerate(self.clients):
            if other_idx < me:
                masked -= pair_mask(self.secret, other, self.party, d)
            elif other_idx > me:
                masked += pair_mask(self.secret, self.party, other, d)
        self.move_to(ClientState.WAITING)
        return [self.send(self.server, MaskedInput(values=masked), phase="upload")]

    def _on_total(self, sender: str, message: Total) -> list[Outgoing]:
        if sender != self.server:
            raise RemoteProtocolError(f"{sender} is not the server", party=sender, round_idx=self.round_idx)
        if message.values.shape != self.values.shape:
            raise RemoteProtocolError(f"a total of shape {message.values.shape}", party=sender)
        self._finish(message.values.view(np.int64))
        return []
# --8<-- [end:client]


# --8<-- [start:server]
ServerState = machine_states("ServerState", "COLLECT")


class SumServer(ProtocolMachine):
    """The server: adds the masked vectors once every client's is in, and sends the total back.

    Args:
        party: the server's name.
        clients: the clients' names.
        d: the length of every vector.

    Raises:
        ValueError: fewer than two clients, or ``d < 1``.
    """

    State = ServerState
    INITIAL_STATE = ServerState.COLLECT
    TRANSITIONS = {
        (ServerState.COLLECT, MaskedInput): ("_on_masked_input", ServerState.COLLECT),
    }

    def __init__(self, party: str, *, clients: Sequence[str], d: int) -> None:
        super().__init__(party)
        self.clients = tuple(clients)
        if len(self.clients) < 2 or d < 1:
            raise ValueError("need at least two clients and d >= 1")
        self.d = d
        self._received: dict[str, np.ndarray] = {}

    def pending(self) -> Sequence[str]:
        if self.state is not ServerState.COLLECT:
            return []
        return [c for c in self.clients if c not in self._received]

    def _on_masked_input(self, sender: str, message: MaskedInput) -> list[Outgoing]:
        if sender not in self.clients:
            raise RemoteProtocolError(f"{sender} is not a client", party=sender, round_idx=self.round_idx)
        if sender in self._received:
            raise RemoteProtocolError(f"a second input from {sender}", party=sender, round_idx=self.round_idx)
        if message.values.shape != (self.d,):
            raise RemoteProtocolError(f"an input of shape {message.values.shape}", party=sender)
        self._received[sender] = message.values
        return []

    def _advance(self) -> list[Outgoing]:
        # Called after every input: aggregate once nobody is pending.
        if self.state is not ServerState.COLLECT or self.pending():
            return []
        total = np.zeros(self.d, dtype=np.uint64)
        for client in self.clients:
            total += self._received[client]  # wraps around: arithmetic in Z_2^64
        reply = self.broadcast(self.clients, Total(values=total), phase="result")
        self._finish(total.view(np.int64))
        return [reply]
# --8<-- [end:server]


# --8<-- [start:memory]
class SecureSumParties(StarParties):
    """The parties of one run: the server (the hub) and one client per entry of ``values``
    (``{client: [d] integers}``), with the secret the clients share.

    ``StarParties`` gives the roster (the server first), ``role_of``, ``make_machine(party)`` with
    its check of the party's name, and ``machines()``; we say only what each machine is.
    """

    def __init__(self, values: Mapping[str, np.ndarray], secret: bytes) -> None:
        super().__init__(hub=SERVER, clients=tuple(values))
        self.values, self.secret = values, secret
        self.d = len(next(iter(values.values())))

    def hub_machine(self) -> ProtocolMachine:
        return SumServer(self.hub, clients=self.clients, d=self.d)

    def client_machine(self, index: int, party: str, data: None) -> ProtocolMachine:
        return SumClient(party, server=self.hub, clients=self.clients, values=self.values[party], secret=self.secret)


def make_machines(values: Mapping[str, np.ndarray], secret: bytes) -> dict[str, ProtocolMachine]:
    """Every party's machine, in roster order (the server first)."""
    return SecureSumParties(values, secret).machines()


def run_in_memory(values: Mapping[str, np.ndarray], secret: bytes) -> tuple[dict[str, Any], RunReport]:
    """Run every party in this process over the memory transport; return results and report."""
    machines = make_machines(values, secret)
    roster = tuple(machines)
    meter = Meter(trio.current_time)
    results = trio.run(functools.partial(run_parties, meter=meter), machines, MemoryNetwork(roster))
    report = meter.report(protocol="secure-sum", transport="memory", session=0, parties=roster)
    return results, report


def main() -> None:
    values = {"client-0": np.array([1, 2, 3, 4]), "client-1": np.array([10, -20, 30, -40])}
    secret = b"a secret only the two clients know"
    results, report = run_in_memory(values, secret)
    print("sum at the server:", results[SERVER])
    for (sender, receiver), n_bytes in report.bytes_by_link().items():
        print(f"{sender} -> {receiver}: {n_bytes} bytes")
# --8<-- [end:memory]


# --8<-- [start:plugin]
def client_values(seed: int, client_idx: int, d: int) -> np.ndarray:
    """Client ``client_idx``'s private vector in the CLI demo: ``[d]`` int64 in [-1000, 1000)."""
    return np.random.default_rng([seed, client_idx]).integers(-1000, 1000, size=d, dtype=np.int64)


def link_bytes(d: int, session: int, clients: Sequence[str] = CLIENTS) -> dict[tuple[str, str], int]:
    """The exact payload bytes on every link of one run: one frame each way per client."""
    zeros = np.zeros(d, dtype=np.uint64)  # a frame's size does not depend on the values
    upload = len(encode_frame(MaskedInput(values=zeros), session=session, round_idx=0, phase="upload"))
    result = len(encode_frame(Total(values=zeros), session=session, round_idx=0, phase="result"))
    links = {(client, SERVER): upload for client in clients}
    links.update({(SERVER, client): result for client in clients})
    return dict(sorted(links.items()))


class SecureSumPlugin:
    """The secure sum as a ``fedproto run`` protocol (no data set: each client's vector comes
    from ``--seed``; ``--clients`` sets how many clients there are)."""

    name = "secure-sum"
    description = "secure sum of the clients' vectors with pairwise masks (the fedproto tutorial)"
    needs_data = False

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("secure-sum")
        group.add_argument("--d", type=int, default=8, help="length of each client's vector (default 8)")

    def plan(self, args: argparse.Namespace, dataset: None) -> RunPlan:
        if args.d < 1 or args.clients < 2:
            raise ValueError("a secure sum needs --d of at least 1 and at least two --clients")
        clients = client_names(args.clients)
        inputs = {client: client_values(args.seed, i, args.d) for i, client in enumerate(clients)}
        # Demo only: every process derives the secret from --seed, the server's included.
        secret = hashlib.sha256(f"fedproto tutorial secret {args.seed}".encode()).digest()
        session = zlib.crc32(f"secure-sum|{args.clients}|{args.d}|{args.seed}".encode())
        expected = sum(inputs.values())

        def summarize(results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
            total = results[SERVER]["sum"]
            return {"n_clients": len(clients), "d": args.d, "sum": total, "sum_correct": total == expected.tolist()}

        upload_bytes = link_bytes(args.d, session, clients)[(clients[0], SERVER)]
        parties = SecureSumParties(inputs, secret)
        return RunPlan(
            roster=parties.roster,
            session=session,
            make_machine=parties.make_machine,
            result_to_json=lambda party, result: {"sum": result.tolist()},
            summarize=summarize,
            role_of=parties.role_of,
            iterations=1,
            phases=("upload", "result"),
            analytic={"analytic_upload_bytes": upload_bytes},
            labels={
                "sum_correct": "sum correct",
                "analytic_upload_bytes": "analytic bytes per upload (8·d + envelope)",
            },
        )


PROTOCOL = SecureSumPlugin()

if __name__ == "__main__":
    main()
# --8<-- [end:plugin]

"""One SecAgg+ aggregation driven in a loop, without a runtime: for tests, benchmarks and quick
experiments with dropouts.

:func:`simulate` plays the server and every client engine in one process, stage by stage, encodes
every message as the runtime would (:func:`fedproto.codec.encode_frame`, so the byte counts are
the frames' exact sizes), and makes the chosen clients drop at the chosen stages: a client that
drops at stage S sends nothing from S on, and the server learns it when the other messages of S
are in (as it would at the phase deadline).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from fedproto.algorithms.secagg import derive_bytes
from fedproto.algorithms.secagg_plus.engine import (
    STAGES,
    SecAggPlusClient,
    SecAggPlusConfig,
    SecAggPlusServer,
    SumOutcome,
)
from fedproto.codec import encode_frame
from fedproto.messages import Broadcast, Message, Outgoing

__all__ = ["Simulation", "client_name", "simulate"]


def client_name(index: int) -> str:
    """The party name of client ``index`` in a simulation: ``client-<index>``."""
    return f"client-{index}"


@dataclasses.dataclass
class Simulation:
    """What one simulated aggregation did.

    Attributes:
        outcome: the server's :class:`~fedproto.algorithms.secagg_plus.engine.SumOutcome`.
        sent_bytes: ``{stage: [n]}`` frame bytes each client sent in the stage (int64).
        received_bytes: ``{stage: [n]}`` frame bytes each client received in the stage.
        server_s: ``{stage: seconds}`` the server spent handling the stage's messages
            (measured with ``time.perf_counter``; 0 unless ``timed``).
        client_s: ``{stage: seconds}`` all clients together spent in the stage.
        server_view: every message the server received, ``[(sender, message)]`` in order.
    """

    outcome: SumOutcome
    sent_bytes: dict[str, np.ndarray]
    received_bytes: dict[str, np.ndarray]
    server_s: dict[str, float]
    client_s: dict[str, float]
    server_view: list[tuple[str, Message]]


def simulate(
    config: SecAggPlusConfig,
    inputs: Sequence[object],
    *,
    dropouts: Mapping[int, str] | None = None,
    entropy: Callable[[int], bytes] | None = None,
    instance: bytes = b"simulation",
    timed: bool = False,
    keep_view: bool = False,
) -> Simulation:
    """Run one aggregation of ``inputs`` with ``dropouts``.

    Args:
        config: the public parameters.
        inputs: ``[n, L]``: client ``i``'s vector (elements of ``config.modulus``).
        dropouts: ``{client index: stage}``: the stage (one of :data:`STAGES`) whose message the
            client does not send.
        entropy: ``i -> bytes``: client ``i``'s secret entropy (default: HKDF of a fixed key and
            ``i``, so runs repeat).
        instance: the aggregation's instance bytes.
        timed: measure the server's and the clients' seconds per stage.
        keep_view: keep every message the server received (``server_view``).

    Returns:
        A :class:`Simulation`.

    Raises:
        InsufficientParticipants: the dropouts leave the sum unrecoverable (from the server).
        ValueError: an unknown stage or client index, or inputs of the wrong shape.
    """
    n = config.n_clients
    if len(inputs) != n:
        raise ValueError(f"inputs must hold one vector per client ({n}), got {len(inputs)}")
    dropouts = dict(dropouts or {})
    for index, stage in dropouts.items():
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
        if not 0 <= index < n:
            raise ValueError(f"dropout client index {index} outside [0, {n})")
    if entropy is None:
        base = bytes(32)

        def entropy(i: int) -> bytes:
            return derive_bytes(base, b"fedproto/secagg-plus/simulation" + i.to_bytes(8, "big"))

    names = [client_name(i) for i in range(n)]
    index_of = {name: i for i, name in enumerate(names)}
    server = SecAggPlusServer(config, names, round_idx=0, instance=instance)
    clients = [SecAggPlusClient(config, i, entropy=entropy(i), instance=instance) for i in range(n)]
    sent = {stage: np.zeros(n, dtype=np.int64) for stage in STAGES}
    received = {stage: np.zeros(n, dtype=np.int64) for stage in STAGES}
    server_s = dict.fromkeys(STAGES, 0.0)
    client_s = dict.fromkeys(STAGES, 0.0)
    view: list[tuple[str, Message]] = []
    clock = time.perf_counter if timed else (lambda: 0.0)

    def size(message: Message, stage: str) -> int:
        return len(encode_frame(message, session=0, round_idx=0, phase=stage))

    def deliver(out: list[Outgoing]) -> dict[int, Message]:
        inbox: dict[int, Message] = {}
        for action in out:
            dests = action.dests if isinstance(action, Broadcast) else (action.dest,)
            nbytes = size(action.message, action.phase)
            for dest in dests:
                i = index_of[dest]
                inbox[i] = action.message
                received[action.phase][i] += nbytes
        return inbox

    def to_server(stage: str, messages: dict[int, Message]) -> dict[int, Message]:
        out: list[Outgoing] = []
        start = clock()
        for i in sorted(messages):
            if keep_view:
                view.append((names[i], messages[i]))
            out += server.receive(names[i], messages[i])
        silent = [names[i] for i, s in dropouts.items() if s == stage]
        if silent:
            out += server.drop(silent)
        server_s[stage] += clock() - start
        return deliver(out)

    def alive(stage: str) -> Callable[[int], bool]:
        order = STAGES.index(stage)
        return lambda i: i not in dropouts or STAGES.index(dropouts[i]) > order

    def from_clients(stage: str, indices: Sequence[int], make: Callable[[int], Message]) -> dict[int, Message]:
        messages: dict[int, Message] = {}
        start = clock()
        for i in indices:
            if alive(stage)(i):
                messages[i] = make(i)
                sent[stage][i] += size(messages[i], stage)
        client_s[stage] += clock() - start
        return messages

    inbox = to_server(STAGES[0], from_clients(STAGES[0], range(n), lambda i: clients[i].advertise()))
    inbox = to_server(
        STAGES[1], from_clients(STAGES[1], sorted(inbox), lambda i: clients[i].share_keys("server", inbox[i]))
    )

    def masked(i: int) -> Message:
        clients[i].receive_shares("server", inbox[i])
        return clients[i].mask_input(inputs[i])

    inbox = to_server(STAGES[2], from_clients(STAGES[2], sorted(inbox), masked))
    to_server(STAGES[3], from_clients(STAGES[3], sorted(inbox), lambda i: clients[i].unmask("server", inbox[i])))
    assert server.outcome is not None
    return Simulation(server.outcome, sent, received, server_s, client_s, view)

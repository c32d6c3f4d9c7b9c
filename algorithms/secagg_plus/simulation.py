"""SecAgg+ aggregations driven in a loop, without a runtime: for tests, benchmarks and quick
experiments with dropouts.

:func:`simulate` plays the server and every client engine in one process, stage by stage: the
set-up, then one aggregation per round. It encodes every message as the runtime would
(:func:`fedproto.codec.encode_frame`, so the byte counts are the frames' exact sizes), and makes
the chosen clients drop at the chosen stages: a client that drops at stage S of round r sends
nothing from there on, and the server learns it when the other messages of S are in (as it would
at the phase deadline).
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
from fedproto.algorithms.secagg_plus.messages import Remask
from fedproto.codec import encode_frame
from fedproto.messages import Broadcast, Message, Outgoing

__all__ = ["Simulation", "client_name", "simulate"]


def client_name(index: int) -> str:
    """The party name of client ``index`` in a simulation: ``client-<index>``."""
    return f"client-{index}"


@dataclasses.dataclass
class Simulation:
    """What the simulated aggregations did.

    Attributes:
        outcomes: the server's :class:`~fedproto.algorithms.secagg_plus.engine.SumOutcome` of
            each round.
        sent_bytes: ``{stage: [n]}`` frame bytes each client sent in the stage, all rounds (int64).
        received_bytes: ``{stage: [n]}`` frame bytes each client received in the stage.
        server_s: per round, ``{stage: seconds}`` the server spent handling the stage's messages
            (``time.perf_counter``; 0 unless ``timed``). The set-up is round 0's ``advertise-keys``.
        client_s: per round, ``{stage: seconds}`` all clients together spent in the stage (the
            set-up's include the key agreements, :meth:`SecAggPlusClient.receive_keys`).
        server_view: every message the server received, ``[(round, attempt, sender, message)]``
            in order (with ``keep_view``).
        masked_with: ``{(round, attempt, client): neighbours}``, the neighbours each client masked
            its input with (public: the server tracks the same lists; with ``keep_view``).
        clients: the client engines, which hold every client's secrets (for tests of what the
            server's view reveals).
    """

    outcomes: list[SumOutcome]
    sent_bytes: dict[str, np.ndarray]
    received_bytes: dict[str, np.ndarray]
    server_s: list[dict[str, float]]
    client_s: list[dict[str, float]]
    server_view: list[tuple[int, int, str, Message]]
    masked_with: dict[tuple[int, int, int], tuple[int, ...]]
    clients: list[SecAggPlusClient]

    @property
    def outcome(self) -> SumOutcome:
        """The last round's outcome."""
        return self.outcomes[-1]


def _stage_of(value: str | tuple[str, int]) -> tuple[str, int]:
    stage, round_idx = (value, 0) if isinstance(value, str) else value
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
    if not isinstance(round_idx, int) or round_idx < 0:
        raise ValueError(f"a dropout's round must be an int >= 0, got {round_idx!r}")
    return stage, round_idx


def simulate(
    config: SecAggPlusConfig,
    inputs: Sequence[object],
    *,
    dropouts: Mapping[int, str | tuple[str, int]] | None = None,
    rounds: int = 1,
    entropy: Callable[[int], bytes] | None = None,
    instance: bytes = b"simulation",
    timed: bool = False,
    keep_view: bool = False,
) -> Simulation:
    """Run the set-up and ``rounds`` aggregations of ``inputs`` with ``dropouts``.

    Args:
        config: the public parameters.
        inputs: ``[n, L]``: client ``i``'s vector (elements of ``config.modulus``), summed in
            every round; or ``[rounds, n, L]``, one set per round.
        dropouts: ``{client index: stage}`` (round 0) or ``{client index: (stage, round)}``: the
            stage (one of :data:`STAGES`) of the round whose message the client does not send;
            it sends nothing after it.
        rounds: aggregations after the one set-up (>= 1).
        entropy: ``i -> bytes``: client ``i``'s secret entropy (default: HKDF of a fixed key and
            ``i``, so runs repeat).
        instance: the set-up's instance bytes.
        timed: measure the server's and the clients' seconds per stage.
        keep_view: keep every message the server received (``server_view``).

    Returns:
        A :class:`Simulation`.

    Raises:
        InsufficientParticipants: the dropouts leave a sum unrecoverable (from the server).
        ValueError: an unknown stage or client index, or inputs of the wrong shape.
    """
    n = config.n_clients
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    per_round = [inputs] * rounds if len(inputs) == n else list(inputs)
    if len(per_round) != rounds or any(len(x) != n for x in per_round):
        raise ValueError(f"inputs must hold one vector per client ({n}), or {rounds} such sets")
    drops = {i: _stage_of(s) for i, s in (dropouts or {}).items()}
    for index in drops:
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
    server_s: list[dict[str, float]] = []
    client_s: list[dict[str, float]] = []
    view: list[tuple[int, int, str, Message]] = []
    masked_with: dict[tuple[int, int, int], tuple[int, ...]] = {}
    clock = time.perf_counter if timed else (lambda: 0.0)
    round_idx = 0

    def size(message: Message, stage: str) -> int:
        return len(encode_frame(message, session=0, round_idx=round_idx, phase=stage))

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

    def silent(i: int, stage: str) -> bool:
        """Client i sends nothing at ``stage`` of this round (it dropped there or before)."""
        if i not in drops:
            return False
        at, when = drops[i]
        return (when, STAGES.index(at)) <= (round_idx, STAGES.index(stage))

    def exchange(stage: str, makers: dict[int, Callable[[], Message]]) -> dict[int, Message]:
        messages: dict[int, Message] = {}
        start = clock()
        for i in sorted(makers):
            if not silent(i, stage):
                messages[i] = makers[i]()
                sent[stage][i] += size(messages[i], stage)
        client_s[-1][stage] += clock() - start
        out: list[Outgoing] = []
        start = clock()
        for i in sorted(messages):
            if keep_view:
                view.append((round_idx, server.attempt, names[i], messages[i]))
                if stage == STAGES[1]:
                    masked_with[round_idx, server.attempt, i] = clients[i].neighbours
            out += server.receive(names[i], messages[i])
        gone = [names[i] for i in makers if i not in messages]
        if gone:
            out += server.drop(gone)
        server_s[-1][stage] += clock() - start
        return deliver(out)

    outcomes: list[SumOutcome] = []
    values = per_round[0]
    for round_idx in range(rounds):
        server_s.append(dict.fromkeys(STAGES, 0.0))
        client_s.append(dict.fromkeys(STAGES, 0.0))
        values = per_round[round_idx]
        if round_idx == 0:
            inbox = exchange(STAGES[0], {i: clients[i].advertise for i in range(n)})
            masking = sorted(inbox)
            start = clock()
            for i in masking:  # the key agreements: the set-up's client work
                clients[i].receive_keys("server", inbox[i])  # type: ignore[arg-type]
            client_s[-1][STAGES[0]] += clock() - start
        else:
            server.begin(round_idx, [c for c in outcomes[-1].survivors if c not in outcomes[-1].dropouts])
            masking = sorted(index_of[c] for c in server.pending())

        def mask(i: int, r: int = round_idx, x: Sequence[object] = values) -> Callable[[], Message]:
            return lambda: clients[i].mask_input(x[i], round_idx=r)

        inbox = exchange(STAGES[1], {i: mask(i) for i in masking})
        while server.outcome is None:
            inbox = exchange(STAGES[2], {i: (lambda i=i: clients[i].unmask("server", inbox[i])) for i in sorted(inbox)})
            if server.outcome is None:  # masked again: every client told to
                assert all(isinstance(m, Remask) for m in inbox.values())
                inbox = exchange(
                    STAGES[1],
                    {i: (lambda i=i: clients[i].remask("server", inbox[i], values[i])) for i in sorted(inbox)},  # type: ignore[arg-type]
                )
        outcomes.append(server.outcome)
    return Simulation(outcomes, sent, received, server_s, client_s, view, masked_with, clients)

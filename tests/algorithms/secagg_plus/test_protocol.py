"""The SecAgg+ summation protocol through the runtime: several rounds, dropouts detected by the
transport or by the phase deadline, late frames of dropped clients ignored."""

from __future__ import annotations

import numpy as np
import pytest
import trio
import trio.testing

from fedproto.algorithms.secagg_plus import Modulus, SecAggPlusConfig, SumClient, SumServer
from fedproto.errors import InsufficientParticipants
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.testing import DelegatingTransport, Faults
from fedproto.transports.memory import MemoryNetwork

N, LENGTH, ROUNDS = 8, 5, 3


def _config(modulus=Modulus.ring(32)):
    return SecAggPlusConfig(N, LENGTH, modulus, 6, 4, bytes(range(32)))


def _inputs(modulus):
    rng = np.random.default_rng(3)
    return {i: [rng.integers(0, min(modulus.size, 2**62), LENGTH, dtype=np.uint64) for _ in range(ROUNDS)] for i in range(N)}


def _machines(config, inputs):
    names = [f"client-{i}" for i in range(N)]
    machines = {"server": SumServer("server", config=config, clients=names, rounds=ROUNDS, session=5)}
    for i, name in enumerate(names):
        machines[name] = SumClient(
            name, config=config, server="server", clients=names, inputs=inputs[i], entropy=bytes([i + 1]) * 32, session=5
        )
    return machines


def _expected(config, inputs, members, round_idx):
    total = config.modulus.zeros(LENGTH)
    for i in members:
        total = config.modulus.add(total, config.modulus.vector(inputs[i][round_idx]))
    return total


@pytest.mark.parametrize("modulus", [Modulus.ring(64), Modulus.field(2**61 - 1)], ids=["ring64", "field61"])
def test_rounds_with_dropouts_reported_by_the_transport(modulus):
    config = _config(modulus)
    inputs = _inputs(modulus)
    machines = _machines(config, inputs)
    faults = Faults(crash_at={"client-2": ("masked-input", 1), "client-5": ("unmask", 0)})
    network = MemoryNetwork(list(machines), faults=faults, report_drops=True)

    async def go():
        return await run_parties(machines, network, config=RuntimeConfig(session=5, deadline_s=30), meter=Meter(trio.current_time))

    results = trio.run(go)
    server = results["server"]
    everyone = range(N)
    round_members = [
        [i for i in everyone],  # round 0: client-5 dropped at unmask, its input is in
        [i for i in everyone if i not in (2, 5)],
        [i for i in everyone if i not in (2, 5)],
    ]
    for r in range(ROUNDS):
        assert np.array_equal(server.totals[r], _expected(config, inputs, round_members[r], r)), r
        assert server.survivors[r] == tuple(f"client-{i}" for i in round_members[r])
    assert server.dropouts == {"client-5": (0, "unmask"), "client-2": (1, "masked-input")}
    for i in everyone:
        name = f"client-{i}"
        if i in (2, 5):
            assert name not in results
        else:
            assert all(np.array_equal(a, b) for a, b in zip(results[name].totals, server.totals))


class _Silent(DelegatingTransport):
    """Sends nothing from its ``mute``-th frame on, but stays connected (a hung process)."""

    def __init__(self, inner, mute):
        super().__init__(inner)
        self.sent = 0
        self.mute = mute

    async def send(self, dest, frame):
        self.sent += 1
        if self.sent > self.mute:
            return
        await self.inner.send(dest, frame)


def test_a_silent_client_is_dropped_at_the_deadline():
    """Without drop reports, a client that goes quiet (here after its first frame, its key, in
    round 0) is dropped when the server's phase deadline passes; the others go on."""
    config = _config()
    inputs = _inputs(config.modulus)
    machines = _machines(config, inputs)
    network = MemoryNetwork(list(machines))
    clock = trio.testing.MockClock(autojump_threshold=0)

    async def go():
        transports = {p: network.endpoint(p) for p in machines}
        transports["client-6"] = _Silent(transports["client-6"], mute=1)
        async with trio.open_nursery() as nursery:
            results = {}

            async def one(party):
                from fedproto.runtime import run_party

                try:
                    results[party] = await run_party(
                        machines[party], transports[party], config=RuntimeConfig(session=5, deadline_s=10), meter=Meter(trio.current_time)
                    )
                except InsufficientParticipants:
                    results[party] = None  # the silent client's own machine waits for a server that moved on

            for party in machines:
                nursery.start_soon(one, party)
        return results

    results = trio.run(go, clock=clock)
    server = results["server"]
    assert server.dropouts == {"client-6": (0, "masked-input")}
    assert np.array_equal(server.totals[1], _expected(config, inputs, [i for i in range(N) if i != 6], 1))


def test_below_the_threshold_the_run_fails_naming_the_dropped():
    config = _config()
    machines = _machines(config, _inputs(config.modulus))
    # t = 4 of 6 neighbours: dropping five clients at masked-input leaves three survivors.
    faults = Faults(crash_at={f"client-{i}": ("masked-input", 0) for i in (0, 1, 2, 3, 4)})
    network = MemoryNetwork(list(machines), faults=faults, report_drops=True)

    async def go():
        return await run_parties(machines, network, config=RuntimeConfig(session=5, deadline_s=30), meter=Meter(trio.current_time))

    with pytest.raises(InsufficientParticipants) as caught:
        trio.run(go)
    assert set(caught.value.missing) == {f"client-{i}" for i in (0, 1, 2, 3, 4)}

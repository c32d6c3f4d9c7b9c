"""The runtime's phase deadlines as one watchdog per Trio run sees them.

A party's receives wait in one cancel scope; the watchdog (a system task) cancels it when the
party's deadline passes during a wait. Checked here: a silent peer is still found at exactly one
deadline, in runs that follow each other in one Trio run (one watchdog serves them all); the
watchdog forgets ended parties (its heap does not grow with the parties of runs that are over);
a party busy past its deadline finds out at its next wait, without the watchdog.
"""

from __future__ import annotations

import numpy as np
import pytest
import trio

from fedproto import runtime
from fedproto.errors import InsufficientParticipants
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.testing.harness import Harness
from fedproto.testing.toy import SumCoordinator, SumWorker
from fedproto.transports.memory import MemoryNetwork


def make(n_workers, rounds=2, dim=3):
    workers = [f"w{i}" for i in range(n_workers)]
    machines = {"c": SumCoordinator("c", workers=workers, rounds=rounds, dim=dim)}
    for i, w in enumerate(workers):
        machines[w] = SumWorker(w, coordinator="c", values=np.arange(dim) + i)
    return machines


async def test_one_watchdog_serves_runs_that_follow_each_other(autojump_clock):
    for deadline_s in (5.0, 30.0, 5.0):
        machines = make(3)
        del machines["w1"]  # silent
        start = trio.current_time()
        with pytest.raises(InsufficientParticipants) as info:
            await run_parties(machines, MemoryNetwork([*machines, "w1"]), config=RuntimeConfig(deadline_s=deadline_s))
        assert info.value.missing == ("w1",)
        assert trio.current_time() - start == pytest.approx(deadline_s)
        # and a complete run right after it waits out no deadline
        start = trio.current_time()
        results = await run_parties(make(3), MemoryNetwork(list(make(3))), config=RuntimeConfig(deadline_s=deadline_s))
        np.testing.assert_array_equal(results["c"], Harness(make(3)).run()["c"])
        assert trio.current_time() == start


async def test_the_watchdog_forgets_the_parties_of_runs_that_are_over():
    for _ in range(3):
        machines = make(300, rounds=1)
        await run_parties(machines, MemoryNetwork(list(machines)), config=RuntimeConfig(deadline_s=600.0))
    watchdog = runtime._watchdog()
    live = [entry for entry in watchdog._heap if entry[2].scope is not None]
    assert not live
    assert len(watchdog._heap) < 301  # 903 parties waited; their entries were dropped as they ended


class BusyTransport:
    """Delegates to a memory endpoint; its first ``receive`` works (without yielding) for longer
    than the deadline after the frame arrived, as a party busy with one frame would."""

    def __init__(self, inner, busy_s):
        self.inner, self.busy_s, self.first = inner, busy_s, True
        self.roster, self.framing_overhead_bytes = inner.roster, inner.framing_overhead_bytes

    async def send(self, dest, frame):
        await self.inner.send(dest, frame)

    async def receive(self):
        item = await self.inner.receive()
        if self.first:
            self.first = False
            clock = trio.lowlevel.current_clock()
            clock.jump(self.busy_s)  # time passes while this party works; nobody else runs
        return item

    def receive_nowait(self):
        return self.inner.receive_nowait()


async def test_a_party_busy_past_its_deadline_times_out_at_its_next_wait(mock_clock):
    machines = make(2, rounds=2)
    del machines["w1"]  # silent: the coordinator's first round can never finish
    network = MemoryNetwork([*machines, "w1"])
    async with network.endpoints(local=list(machines)) as endpoints:
        wrapped = {**endpoints, "c": BusyTransport(endpoints["c"], busy_s=50.0)}
        start = trio.current_time()
        with pytest.raises(InsufficientParticipants) as info:
            await run_parties(machines, wrapped, config=RuntimeConfig(deadline_s=10.0))
    assert info.value.missing == ("w1",)
    # w0's answer took the coordinator 50 s (5 deadlines): no progress, so it gives up at its
    # next wait, at once, rather than a deadline later
    assert trio.current_time() - start == pytest.approx(50.0)

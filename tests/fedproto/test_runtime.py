"""The Trio runtime over the memory transport: results, metering, deadlines, refused frames."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import trio

from fedproto.codec import encode_frame
from fedproto.errors import InsufficientParticipants, RemoteProtocolError
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties, run_party
from fedproto.testing.harness import Harness
from fedproto.testing.toy import Contribution, SumCoordinator, SumWorker
from fedproto.transports.memory import Faults, MemoryNetwork


def make(n_workers=3, rounds=3, dim=4, **kw):
    workers = [f"w{i}" for i in range(n_workers)]
    machines = {"c": SumCoordinator("c", workers=workers, rounds=rounds, dim=dim, **kw)}
    for i, w in enumerate(workers):
        machines[w] = SumWorker(w, coordinator="c", values=np.arange(dim) + i)
    return machines


async def test_memory_run_matches_harness_results_and_bytes():
    expected = Harness(make(), session=11).run()
    harness = Harness(make(), session=11)
    harness.run()
    machines = make()
    network = MemoryNetwork(list(machines))
    meter = Meter(trio.current_time)
    results = await run_parties(machines, network.endpoints(), config=RuntimeConfig(session=11), meter=meter)
    np.testing.assert_array_equal(results["c"], expected["c"])
    ours = meter.report(protocol="toy", transport="memory", session=11, parties=list(machines))
    theirs = harness.meter.report(protocol="toy", transport="none", session=11, parties=list(machines))
    assert ours.links == theirs.links
    assert ours.algorithm_rounds == 4  # 3 query/answer rounds + the finish broadcast in round 3
    assert ours.messages == 3 * 6 + 3
    assert ours.framing_overhead_bytes == 0


async def test_silent_worker_hits_the_deadline_and_is_named(autojump_clock):
    machines = make()
    network = MemoryNetwork(list(machines))
    endpoints = network.endpoints()
    del machines["w1"]  # w1 never runs: it is silent
    start = trio.current_time()
    with pytest.raises(InsufficientParticipants) as info:
        await run_parties(machines, endpoints, config=RuntimeConfig(deadline_s=30.0))
    assert info.value.missing == ("w1",)
    assert "w1" in str(info.value)
    assert trio.current_time() - start == pytest.approx(30.0)


async def test_quorum_after_deadline_continues_without_the_silent_worker(autojump_clock):
    machines = make(min_responses=2)
    network = MemoryNetwork(list(machines))
    endpoints = network.endpoints()
    silent = machines.pop("w2")
    assert silent is not None
    results = {}

    async def coordinator_and_two_workers():
        results.update(
            await run_parties(
                {p: m for p, m in machines.items()}, endpoints, config=RuntimeConfig(deadline_s=5.0)
            )
        )

    await coordinator_and_two_workers()
    # rounds: sum of (arange(4)+i) * (r+1) over workers 0 and 1
    expected = np.stack([(np.arange(4) * 2 + 1) * (r + 1) for r in range(3)])
    np.testing.assert_array_equal(results["c"], expected)


async def test_silent_coordinator_fails_every_worker_naming_it(autojump_clock):
    network = MemoryNetwork(["c", "w0"])
    worker = SumWorker("w0", coordinator="c", values=np.zeros(2))
    with pytest.raises(InsufficientParticipants) as info:
        await run_party(worker, network.endpoint("w0"), config=RuntimeConfig(deadline_s=10.0))
    assert info.value.missing == ("c",)


async def test_garbage_and_foreign_session_frames_are_refused_and_the_run_goes_on(caplog):
    machines = make(rounds=1)
    network = MemoryNetwork(list(machines))
    endpoints = network.endpoints()
    attacker = network.endpoint("w2")
    # before the run: frames that must be refused by the coordinator without harming it
    await attacker.send("c", b"\xc1not msgpack")
    await attacker.send("c", b"")
    await attacker.send(
        "c", encode_frame(Contribution(values=np.zeros(4)), session=999, round_idx=0, phase="answer")
    )
    meter = Meter(trio.current_time)
    with caplog.at_level(logging.WARNING, logger="fedproto.runtime"):
        results = await run_parties(machines, endpoints, config=RuntimeConfig(session=5), meter=meter)
    assert results["c"].shape == (1, 4)
    assert len(meter.rejected) == 3
    assert "session 999" in meter.rejected[2]["reason"]
    assert sum("refused a frame" in r.message for r in caplog.records) == 3


async def test_oversized_frame_is_refused_by_the_runtime():
    machines = make(rounds=1, dim=1000)
    network = MemoryNetwork(list(machines))
    meter = Meter(trio.current_time)
    with pytest.raises(InsufficientParticipants):
        with trio.fail_after(5):
            await run_parties(
                machines, network.endpoints(), config=RuntimeConfig(deadline_s=0.5, max_frame_bytes=200), meter=meter
            )
    assert meter.rejected and "exceeds the maximum" in meter.rejected[0]["reason"]


async def test_protocol_violation_raises_the_remote_error_not_a_group():
    machines = make(rounds=2)
    network = MemoryNetwork(list(machines))
    endpoints = network.endpoints()
    rogue = network.endpoint("w0")
    await rogue.send("c", encode_frame(Contribution(values=np.zeros(4)), session=0, round_idx=7, phase="answer"))
    with pytest.raises(RemoteProtocolError, match="round 7"):
        await run_parties(machines, endpoints)


async def test_unknown_sender_is_refused():
    class Spoofing:
        def __init__(self, inner):
            self.inner, self.party, self.roster = inner, inner.party, inner.roster
            self.framing_overhead_bytes = 0
            self.first = True

        async def send(self, dest, frame):
            await self.inner.send(dest, frame)

        async def receive(self):
            sender, frame = await self.inner.receive()
            if self.first:
                self.first = False
                return "mallory", frame
            return sender, frame

    network = MemoryNetwork(["c", "w0"])
    coordinator = SumCoordinator("c", workers=["w0"], rounds=1, dim=1)
    worker = SumWorker("w0", coordinator="c", values=np.ones(1))
    meter = Meter(trio.current_time)
    with pytest.raises(InsufficientParticipants):
        await run_parties(
            {"c": coordinator, "w0": worker},
            {"c": Spoofing(network.endpoint("c")), "w0": network.endpoint("w0")},
            config=RuntimeConfig(deadline_s=0.2),
            meter=meter,
        )
    assert meter.rejected[0]["sender"] == "mallory"


async def test_crashed_worker_is_detected_by_deadline(autojump_clock):
    machines = make(rounds=3)
    network = MemoryNetwork(list(machines), faults=Faults(crash_after={"w0": 1}))
    with pytest.raises(Exception) as info:
        await run_parties(machines, network.endpoints(), config=RuntimeConfig(deadline_s=10.0))
    # w0 crashes on its second send (a transport error) or the coordinator times out naming it
    assert "w0" in str(info.value)


def test_runtime_config_validation():
    with pytest.raises(ValueError):
        RuntimeConfig(deadline_s=0)
    with pytest.raises(ValueError):
        RuntimeConfig(session=-1)
    with pytest.raises(ValueError):
        RuntimeConfig(max_frame_bytes=0)

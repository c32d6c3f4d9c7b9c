"""The Trio runtime over the memory transport: results, metering, deadlines, refused frames."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import trio

from fedproto.codec import encode_frame
from fedproto.errors import InsufficientParticipants, LocalProtocolError, PartyCrashed, RemoteProtocolError
from fedproto.machine import ProtocolMachine, machine_states
from fedproto.messages import Message
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties, run_party
from fedproto.testing.harness import Harness
from fedproto.testing.toy import Contribution, Query, SumCoordinator, SumWorker
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
    results = await run_parties(machines, network, config=RuntimeConfig(session=11), meter=meter)
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
    del machines["w1"]  # w1 never runs: it is silent
    start = trio.current_time()
    with pytest.raises(InsufficientParticipants) as info:
        await run_parties(machines, network, config=RuntimeConfig(deadline_s=30.0))
    assert info.value.missing == ("w1",)
    assert "w1" in str(info.value)
    assert trio.current_time() - start == pytest.approx(30.0)


async def test_quorum_after_deadline_continues_without_the_silent_worker(autojump_clock):
    machines = make(min_responses=2)
    network = MemoryNetwork(list(machines))
    silent = machines.pop("w2")
    assert silent is not None
    results = {}

    async def coordinator_and_two_workers():
        results.update(
            await run_parties(
                {p: m for p, m in machines.items()}, network, config=RuntimeConfig(deadline_s=5.0)
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
    attacker = network.endpoint("w2")
    # before the run: frames that must be refused by the coordinator without harming it
    await attacker.send("c", b"\xc1not msgpack")
    await attacker.send("c", b"")
    await attacker.send(
        "c", encode_frame(Contribution(values=np.zeros(4)), session=999, round_idx=0, phase="answer")
    )
    meter = Meter(trio.current_time)
    with caplog.at_level(logging.WARNING, logger="fedproto.runtime"):
        results = await run_parties(machines, network, config=RuntimeConfig(session=5), meter=meter)
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
                machines, network, config=RuntimeConfig(deadline_s=0.5, max_frame_bytes=200), meter=meter
            )
    assert meter.rejected and "exceeds the maximum" in meter.rejected[0]["reason"]


async def test_protocol_violation_raises_the_remote_error_not_a_group():
    machines = make(rounds=2)
    network = MemoryNetwork(list(machines))
    rogue = network.endpoint("w0")
    await rogue.send("c", encode_frame(Contribution(values=np.zeros(4)), session=0, round_idx=7, phase="answer"))
    with pytest.raises(RemoteProtocolError, match="round 7"):
        await run_parties(machines, network)


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


async def test_crashed_worker_ends_quietly_and_the_coordinator_names_it(autojump_clock):
    machines = make(rounds=3)
    network = MemoryNetwork(list(machines), faults=Faults(crash_after={"w0": 1}))
    start = trio.current_time()
    with pytest.raises(InsufficientParticipants) as info:
        await run_parties(machines, network, config=RuntimeConfig(deadline_s=10.0))
    # w0 answered round 0 and crashed sending its round-1 answer; the coordinator, still waiting
    # for it a deadline later, is the one that fails, naming w0 and nobody else.
    error = info.value
    assert error.missing == ("w0",) and error.party == "w0"
    assert error.round_idx == 1 and error.state == "COLLECT"
    assert str(error).count("party=") == 1 and "party=w0" in str(error)
    assert trio.current_time() - start == pytest.approx(10.0)
    assert machines["c"].failed and not machines["w0"].failed  # the crashed machine just stopped


async def test_crash_with_a_quorum_returns_the_survivors_results(autojump_clock):
    machines = make(rounds=3, min_responses=2)
    network = MemoryNetwork(list(machines), faults=Faults(crash_after={"w2": 1}))
    results = await run_parties(machines, network, config=RuntimeConfig(deadline_s=10.0))
    assert set(results) == {"c", "w0", "w1"}  # the crashed party has no result
    # round 0 has all three workers (arange(4) + i); rounds 1 and 2 only w0 and w1, times (r + 1)
    expected = np.stack([3 * np.arange(4) + 3, 2 * (2 * np.arange(4) + 1), 3 * (2 * np.arange(4) + 1)])
    np.testing.assert_array_equal(results["c"], expected)
    assert results["w0"] == results["w1"] == 3


async def test_crashed_coordinator_is_named_by_the_workers(autojump_clock):
    machines = make(rounds=2)
    network = MemoryNetwork(list(machines), faults=Faults(crash_after={"c": 1}))  # one query out
    with pytest.raises(InsufficientParticipants) as info:
        await run_parties(machines, network, config=RuntimeConfig(deadline_s=10.0))
    assert info.value.missing == ("c",)
    assert str(info.value).count("party=") == 1


async def test_run_party_alone_reports_its_own_crash():
    network = MemoryNetwork(["c", "w0"], faults=Faults(crash_after={"w0": 0}))
    worker = SumWorker("w0", coordinator="c", values=np.zeros(2))
    await network.endpoint("c").send("w0", encode_frame(Query(), session=0, round_idx=0, phase="query"))
    with pytest.raises(PartyCrashed) as info:
        await run_party(worker, network.endpoint("w0"))
    assert info.value.party == "w0"


async def test_run_parties_over_a_network_opens_and_closes_the_endpoints():
    machines = make(rounds=1)
    network = MemoryNetwork(list(machines))
    results = await run_parties(machines, network)
    assert results["c"].shape == (1, 4)
    assert all(network.endpoint(p)._closed for p in machines)


async def test_run_parties_refuses_what_is_neither_a_network_nor_a_mapping():
    machines = make(rounds=1)
    network = MemoryNetwork(list(machines))
    with pytest.raises(TypeError, match="Network or a"):
        await run_parties(machines, network.endpoints())


# A machine whose message breaks its own field types: the sender fails at once, naming the field.


class _Count(Message, tag="test.runtime.count"):
    count: int


_BadState = machine_states("_BadState", "WAIT")


class _SendsHalfACount(ProtocolMachine):
    State = _BadState
    INITIAL_STATE = _BadState.WAIT
    TRANSITIONS = {(_BadState.WAIT, _Count): ("_on_count", _BadState.DONE)}

    def __init__(self, party, *, peer, count):
        super().__init__(party)
        self.peer, self.count = peer, count

    def _start(self):
        return [self.send(self.peer, _Count(count=self.count))]

    def _on_count(self, sender, message):
        self._finish(message.count)
        return []


async def test_a_wrongly_typed_field_fails_the_sender_at_once(autojump_clock):
    machines = {"a": _SendsHalfACount("a", peer="b", count=0.5), "b": _SendsHalfACount("b", peer="a", count=2)}
    start = trio.current_time()
    with pytest.raises(LocalProtocolError, match=r"test\.runtime\.count\.count: 0\.5 of type float") as info:
        await run_parties(machines, MemoryNetwork(list(machines)), config=RuntimeConfig(deadline_s=60.0))
    assert trio.current_time() == start  # no peer waited out a deadline
    assert info.value.party == "a" and isinstance(info.value.__cause__, TypeError)
    assert str(info.value).count("party=") == 1
    # the same machines with a well-typed count finish
    fine = {"a": _SendsHalfACount("a", peer="b", count=1), "b": _SendsHalfACount("b", peer="a", count=2)}
    assert await run_parties(fine, MemoryNetwork(list(fine))) == {"a": 2, "b": 1}


def test_runtime_config_validation():
    with pytest.raises(ValueError):
        RuntimeConfig(deadline_s=0)
    with pytest.raises(ValueError):
        RuntimeConfig(session=-1)
    with pytest.raises(ValueError):
        RuntimeConfig(max_frame_bytes=0)

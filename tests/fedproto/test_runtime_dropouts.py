"""The runtime turns a transport's drop reports (``PeerDropped``) into ``PartyDropped`` events.

Over the memory transport with ``Faults(crash_at=...)`` and ``report_drops=True``:

* a dropout-tolerant coordinator hears of the dropout at once, carries on with the survivors and
  finishes without waiting out a deadline; every other party hears of it exactly once;
* the default policy fails at once, naming the dropped party, where without reports the same
  crash is found only a deadline later;
* a report about a party outside the roster, or about the party itself, is ignored;
* a report waiting in the queue when a deadline passes is read (``receive_nowait``) before the
  deadline is believed, like a frame.
"""

from __future__ import annotations

import numpy as np
import pytest
import trio

from fedproto.errors import InsufficientParticipants, PeerDropped
from fedproto.messages import Event, Outgoing, PartyDropped
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.testing import CrashPoint, DelegatingTransport
from fedproto.testing.toy import SumCoordinator, SumWorker
from fedproto.transports.memory import Faults, MemoryNetwork

DIM = 4
DEADLINE_S = 10.0


class RecordsDrops:
    """Mixed in first: the machine keeps, in ``dropped``, every party it was told dropped out."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.dropped: list[str] = []

    def _on_event(self, event: Event) -> list[Outgoing]:
        if isinstance(event, PartyDropped):
            self.dropped.append(event.party)
        return super()._on_event(event)


class TolerantCoordinator(RecordsDrops, SumCoordinator):
    """Sums the survivors: a dropped worker leaves the round (and the run) at once."""

    def _on_event(self, event: Event) -> list[Outgoing]:
        if isinstance(event, PartyDropped):
            self.dropped.append(event.party)
            if event.party in self._active:
                self._active.remove(event.party)
                self._received.pop(event.party, None)
            return []
        return super()._on_event(event)


class RecordingWorker(RecordsDrops, SumWorker):
    pass


def make(coordinator_cls=TolerantCoordinator, n_workers=3, rounds=3):
    workers = [f"w{i}" for i in range(n_workers)]
    machines = {"c": coordinator_cls("c", workers=workers, rounds=rounds, dim=DIM)}
    for i, w in enumerate(workers):
        machines[w] = RecordingWorker(w, coordinator="c", values=np.arange(DIM) + i)
    return machines


def expected_sums(n_workers: int, rounds: int, dropped: str, from_round: int) -> np.ndarray:
    sums = []
    for r in range(rounds):
        live = [i for i in range(n_workers) if not (f"w{i}" == dropped and r >= from_round)]
        sums.append(sum((np.arange(DIM) + i) * (r + 1) for i in live))
    return np.stack(sums).astype(float)


async def test_a_reported_dropout_reaches_every_machine_once_and_the_run_goes_on(autojump_clock):
    machines = make()
    network = MemoryNetwork(list(machines), faults=Faults(crash_at={"w1": CrashPoint("answer", 1)}), report_drops=True)
    rounds_seen: list[int] = []
    start = trio.current_time()
    results = await run_parties(
        machines, network, config=RuntimeConfig(deadline_s=DEADLINE_S),
        observer=lambda party, round_idx, state: rounds_seen.append(round_idx) if party == "c" else None,
    )
    assert trio.current_time() - start < DEADLINE_S  # told at once, not found by silence
    assert set(results) == {"c", "w0", "w2"}
    np.testing.assert_array_equal(results["c"], expected_sums(3, 3, "w1", 1))
    assert machines["c"].dropped == ["w1"]
    assert machines["w0"].dropped == ["w1"] and machines["w2"].dropped == ["w1"]
    assert machines["w1"].dropped == []  # the crashed party hears nothing of its own crash
    assert rounds_seen == [1, 2, 3]


async def test_a_drop_that_completes_the_round_is_progress(autojump_clock):
    # w1 is the last one the coordinator waits for: the drop alone moves it to the next round.
    machines = make(n_workers=2, rounds=2)
    network = MemoryNetwork(list(machines), faults=Faults(crash_at={"w1": ("answer", 0)}), report_drops=True)
    rounds_seen: list[int] = []
    results = await run_parties(
        machines, network, config=RuntimeConfig(deadline_s=DEADLINE_S),
        observer=lambda party, round_idx, state: rounds_seen.append(round_idx) if party == "c" else None,
    )
    np.testing.assert_array_equal(results["c"], expected_sums(2, 2, "w1", 0))
    assert trio.current_time() < DEADLINE_S and rounds_seen == [1, 2]


@pytest.mark.parametrize("report_drops", [True, False])
async def test_the_default_policy_fails_at_once_naming_the_dropped_party(autojump_clock, report_drops):
    machines = make(coordinator_cls=SumCoordinator)
    network = MemoryNetwork(
        list(machines), faults=Faults(crash_at={"w1": ("answer", 1)}), report_drops=report_drops
    )
    start = trio.current_time()
    with pytest.raises(InsufficientParticipants) as info:
        await run_parties(machines, network, config=RuntimeConfig(deadline_s=DEADLINE_S))
    assert info.value.missing == ("w1",) and info.value.round_idx == 1
    elapsed = trio.current_time() - start
    if report_drops:
        assert elapsed < DEADLINE_S and "dropped out" in str(info.value)
    else:  # the default transport reports nothing: the crash is found by its silence
        assert elapsed == pytest.approx(DEADLINE_S) and "silent: w1" in str(info.value)


class Reports(DelegatingTransport):
    """Raises a PeerDropped for each of ``parties`` from its first receives, then passes through."""

    def __init__(self, inner, parties) -> None:
        super().__init__(inner)
        self.reports = list(parties)

    async def receive(self):
        if self.reports:
            await trio.lowlevel.checkpoint()
            raise PeerDropped("gone", party=self.reports.pop(0))
        return await self.inner.receive()


async def test_reports_about_strangers_or_oneself_are_ignored(autojump_clock):
    machines = make(rounds=2)
    # w2 crashes before it answers, silently; the wrapper is the transport that reports it
    network = MemoryNetwork(list(machines), faults=Faults(crash_after={"w2": 0}))
    async with network.endpoints() as endpoints:
        wrapped = {**endpoints, "c": Reports(endpoints["c"], ["mallory", "c", "w2"])}
        results = await run_parties(machines, wrapped, config=RuntimeConfig(deadline_s=DEADLINE_S))
    assert machines["c"].dropped == ["w2"]  # only the roster peer's report reached the machine
    assert set(results) == {"c", "w0", "w1"}
    np.testing.assert_array_equal(results["c"], expected_sums(3, 2, "w2", 0))
    assert trio.current_time() < DEADLINE_S


class Stalls(DelegatingTransport):
    """``receive`` never returns: everything is read by ``receive_nowait`` when a deadline passes."""

    async def receive(self):
        await trio.sleep_forever()


async def test_a_report_waiting_at_a_deadline_is_read_before_the_deadline_counts(autojump_clock):
    machines = make(n_workers=2, rounds=2)
    network = MemoryNetwork(list(machines), faults=Faults(crash_at={"w1": ("answer", 1)}), report_drops=True)
    async with network.endpoints() as endpoints:
        wrapped = {**endpoints, "c": Stalls(endpoints["c"])}
        results = await run_parties(machines, wrapped, config=RuntimeConfig(deadline_s=DEADLINE_S))
    # every round waited one deadline, and the waiting answers and report were taken each time
    np.testing.assert_array_equal(results["c"], expected_sums(2, 2, "w1", 1))
    assert machines["c"].dropped == ["w1"]
    assert trio.current_time() == pytest.approx(2 * DEADLINE_S)

"""The lean simulation engine: the runtime's results and bytes, virtual deadlines, clear failures."""

from __future__ import annotations

import numpy as np
import pytest
import trio

from fedproto.algorithms.fastlloyd.config import make_config
from fedproto.algorithms.fastlloyd.messages import MaskedUpdate, NoisyAggregate
from fedproto.algorithms.fastlloyd.protocol import FastLloydClient, FastLloydServer
from fedproto.codec import encode_frame
from fedproto.data import normalize
from fedproto.errors import InsufficientParticipants
from fedproto.machine import party_index
from fedproto.messages import SendFailed
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.simulation import SimulationStalled, simulate
from fedproto.testing.toy import Query, SumCoordinator, SumWorker, sum_machines
from fedproto.transports.memory import MemoryNetwork

SESSION = 77


def toy(n: int, rounds: int = 3, **kwargs) -> dict:
    """The toy sum: a coordinator ``coord`` and ``n`` workers ``w<i>`` holding ``arange(3) + i``."""
    return sum_machines([f"w{i}" for i in range(n)], rounds=rounds, dim=3, coordinator="coord", **kwargs)


def fastlloyd(n_clients: int, points: int = 10, iterations: int = 2, seed: int = 3) -> dict:
    rng = np.random.default_rng(seed)
    x = normalize(rng.normal(size=(n_clients * points, 2)) + rng.integers(0, 4, size=(n_clients * points, 1)) * 3)
    config = make_config("fastlloyd", n=len(x), k=4, d=2, epsilon=1.0, iterations=iterations, init_seed=seed, ring_bits=64)
    clients = tuple(f"client-{i}" for i in range(n_clients))
    machines: dict = {"server": FastLloydServer("server", config=config, clients=clients, noise_seed=seed, session=SESSION)}
    entropy = rng.bytes(32 * n_clients)
    for i, name in enumerate(clients):
        machines[name] = FastLloydClient(
            name, config=config, server="server", clients=clients, points=x[i * points : (i + 1) * points],
            entropy=entropy[32 * i : 32 * (i + 1)], session=SESSION,
        )
    return machines


def run_tasks(machines: dict) -> tuple[dict, Meter]:
    async def go():
        meter = Meter(trio.current_time)
        results = await run_parties(machines, MemoryNetwork(list(machines)), config=RuntimeConfig(session=SESSION), meter=meter)
        return results, meter

    return trio.run(go)


def test_toy_protocol_same_results_and_links_as_the_runtime():
    meter = Meter()
    ours = simulate(toy(7), config=RuntimeConfig(session=SESSION), meter=meter)
    theirs, their_meter = run_tasks(toy(7))
    assert ours.keys() == theirs.keys()
    np.testing.assert_array_equal(ours["coord"], theirs["coord"])
    assert dict(meter.sent) == dict(their_meter.sent)
    np.testing.assert_array_equal(ours["coord"][2], 3 * sum(np.arange(3.0) + i for i in range(7)))


def test_fastlloyd_same_centroids_and_bytes_as_the_runtime():
    meter = Meter()
    ours = simulate(fastlloyd(40), config=RuntimeConfig(session=SESSION), meter=meter)
    theirs, their_meter = run_tasks(fastlloyd(40))
    for party, result in ours.items():
        if party != "server":
            np.testing.assert_array_equal(result.centroids, theirs[party].centroids)
    assert dict(meter.sent) == dict(their_meter.sent)


def test_round_bytes_equal_the_analytic_formula_at_1000_clients():
    """Every frame is encoded and metered: 2 M k (d+1) w/8 data bytes plus one envelope per frame."""
    machines = fastlloyd(1000, points=3, iterations=2)
    meter = Meter()
    simulate(machines, config=RuntimeConfig(session=SESSION), meter=meter)
    report = meter.report(protocol="fastlloyd", transport="memory", session=SESSION, parties=list(machines))
    k, d1 = 4, 3
    data = np.zeros((k, d1), dtype=np.uint64)
    up = len(encode_frame(MaskedUpdate(masked=data), session=SESSION, round_idx=1, phase="update"))
    down = len(encode_frame(NoisyAggregate(masked=data), session=SESSION, round_idx=1, phase="aggregate"))
    assert report.bytes_by_round()[1] == 1000 * (up + down)
    assert report.bytes_by_round()[1] - 1000 * (up + down - 2 * data.nbytes) == 2 * 1000 * k * d1 * 64 // 8
    links = [link for link in report.links if link.round_idx == 1]
    assert len(links) == 2000 and all(link.messages == 1 for link in links)


def test_broadcast_is_decoded_once_and_read_only():
    seen = []

    class Recording(SumWorker):
        def _on_query(self, sender, message):
            seen.append(message)
            return super()._on_query(sender, message)

    machines = toy(2)
    machines = {"coord": machines["coord"], **{w: Recording(w, coordinator="coord", values=np.ones(3)) for w in ("w0", "w1")}}
    simulate(machines)
    assert len(seen) == 6 and seen[0] is seen[1]  # one decoded Query per broadcast
    assert all(isinstance(m, Query) for m in seen)


def test_shared_broadcast_arrays_are_read_only():
    """What makes sharing one decoded message safe: the codec's arrays cannot be written."""
    from fedproto.codec import decode_frame

    for shape in ((5, 3), (400, 300)):
        frame = encode_frame(NoisyAggregate(masked=np.ones(shape, dtype=np.uint64)), session=1, round_idx=0, phase="aggregate")
        _, message = decode_frame(frame)
        with pytest.raises(ValueError, match="read-only"):
            message.masked[0, 0] = 7


class Silent(SumWorker):
    """Never answers."""

    def _on_query(self, sender, message):
        return []


def test_silent_party_is_named_on_the_virtual_deadline_without_waiting():
    machines = toy(4)
    machines["w2"] = Silent("w2", coordinator="coord", values=np.ones(3))
    with pytest.raises(InsufficientParticipants) as err:
        simulate(machines, config=RuntimeConfig(deadline_s=3600.0))  # an hour, virtually
    assert err.value.missing == ("w2",)  # the coordinator (factor 1) times out before the workers (2)


def test_quorum_after_the_deadline_goes_on_without_the_silent_party():
    machines = toy(4, rounds=2, min_responses=3)
    machines["w1"] = Silent("w1", coordinator="coord", values=np.ones(3))
    with pytest.raises(InsufficientParticipants) as err:
        # The coordinator finishes with the three others; silent w1, dropped, then times out
        # waiting for it, as it would under the runtime.
        simulate(machines)
    assert err.value.party == "coord"
    assert machines["coord"].done
    np.testing.assert_array_equal(machines["coord"].result()[0], sum(np.arange(3.0) + i for i in (0, 2, 3)))


class Patient(SumWorker):
    """Never answers and shrugs off its timeouts."""

    def _on_query(self, sender, message):
        return []

    def _on_event(self, event):
        return []


def test_a_machine_that_ignores_its_timeouts_is_reported_stalled_not_spun_for_ever():
    machines = toy(2, rounds=1, min_responses=1)
    machines["w1"] = Patient("w1", coordinator="coord", values=np.ones(3))
    with pytest.raises(SimulationStalled, match="w1"):
        simulate(machines)
    assert machines["coord"].done


def test_sending_to_an_unknown_party_is_a_send_failure_for_the_machine():
    events = []

    class Lost(SumCoordinator):
        def _start(self):
            return [self.send("nobody", Query(), phase="query"), *super()._start()]

        def _on_event(self, event):
            if isinstance(event, SendFailed):
                events.append(event)
                return []
            return super()._on_event(event)

    workers = ("w0",)
    machines = {"coord": Lost("coord", workers=workers, rounds=1, dim=3), "w0": SumWorker("w0", coordinator="coord", values=np.ones(3))}
    results = simulate(machines)
    assert [e.dest for e in events] == ["nobody"]
    np.testing.assert_array_equal(results["coord"][0], np.ones(3))


def test_oversized_frame_is_refused_and_counted():
    machines = toy(1, rounds=1)
    machines["w0"] = SumWorker("w0", coordinator="coord", values=np.ones(4000))
    machines["coord"] = SumCoordinator("coord", workers=("w0",), rounds=1, dim=4000)
    meter = Meter()
    with pytest.raises(InsufficientParticipants):
        simulate(machines, config=RuntimeConfig(max_frame_bytes=1000), meter=meter)
    assert meter.rejected_frames == 1 and meter.rejected[0]["sender"] == "w0"


def test_observer_sees_every_state_change():
    seen = []
    simulate(toy(3, rounds=2), observer=lambda party, round_idx, state: seen.append((party, round_idx, state)))
    assert ("coord", 2, "DONE") in seen
    assert {p for p, _, s in seen if s == "DONE"} == {"coord", "w0", "w1", "w2"}


def test_machine_whose_name_differs_from_its_key_is_refused():
    machines = toy(1)
    with pytest.raises(ValueError, match="says it is"):
        simulate({"other": machines["coord"], "w0": machines["w0"]})


def test_party_index_is_shared_and_keeps_the_first_position():
    parties = ("a", "b", "a", "c")
    index = party_index(parties)
    assert dict(index) == {"a": 0, "b": 1, "c": 3}
    assert party_index(parties) is index
    with pytest.raises(TypeError):
        index["d"] = 4  # read-only


def assert_same_fastlloyd_runs(meter_a: Meter, results_a: dict, meter_b: Meter, results_b: dict) -> None:
    """Two FastLloyd runs sent the same frames of the same sizes, and every client ended with the
    same centroids, history and unassigned counts."""
    assert dict(meter_a.sent) == dict(meter_b.sent)
    for party, result in results_b.items():
        if party != "server":
            np.testing.assert_array_equal(results_a[party].centroids, result.centroids)
            np.testing.assert_array_equal(results_a[party].history, result.history)
            np.testing.assert_array_equal(results_a[party].unassigned, result.unassigned)


@pytest.mark.parametrize("points", [0, 1, 7])
def test_batched_broadcasts_give_what_one_receive_each_gives(points):
    """FastLloyd's receive_batch (its clients' statistics in one pass) changes no byte and no result."""
    batched_meter, plain_meter = Meter(), Meter()
    machines = fastlloyd(30, points=points or 1, iterations=3)
    if points == 0:  # some clients without points: empty statistics in the batch
        for name in ("client-3", "client-4"):
            machines[name]._points = machines[name]._points[:0]
    batched = simulate(machines, config=RuntimeConfig(session=SESSION), meter=batched_meter)
    plain_machines = fastlloyd(30, points=points or 1, iterations=3)
    if points == 0:
        for name in ("client-3", "client-4"):
            plain_machines[name]._points = plain_machines[name]._points[:0]
    plain = simulate(plain_machines, config=RuntimeConfig(session=SESSION), meter=plain_meter, batch=False)
    assert_same_fastlloyd_runs(batched_meter, batched, plain_meter, plain)


def test_batched_statistics_are_used_and_equal_each_clients_own():
    from fedproto.algorithms.fastlloyd import protocol

    machines = fastlloyd(12, points=5, iterations=3)
    used = []
    original = protocol.FastLloydClient._masked_statistics

    def spy(self):
        used.append(self._prepared is not None)
        return original(self)

    protocol.FastLloydClient._masked_statistics = spy
    try:
        simulate(machines, config=RuntimeConfig(session=SESSION))
    finally:
        protocol.FastLloydClient._masked_statistics = original
    # round 0 per client (after its seed), rounds 1 and 2 prepared for all 12 in one pass
    assert used.count(True) == 24 and used.count(False) == 12


def test_the_collector_is_paused_during_the_run_and_restored_however_it_ends():
    import gc

    seen = []
    simulate(toy(2), observer=lambda *_: seen.append(gc.isenabled()))
    assert seen and not any(seen) and gc.isenabled()
    machines = toy(2)
    machines["w1"] = Silent("w1", coordinator="coord", values=np.ones(3))
    with pytest.raises(InsufficientParticipants):
        simulate(machines)
    assert gc.isenabled()
    seen.clear()
    simulate(toy(2), pause_gc=False, observer=lambda *_: seen.append(gc.isenabled()))
    assert all(seen)


def test_a_broadcast_in_slices_of_receivers_gives_what_one_batch_gives(monkeypatch):
    """A broadcast goes to at most _BATCH_RECEIVERS receivers per receive_batch (memory); slices
    of 7 (the last one short) change no frame, no byte and no result."""
    from fedproto import simulation

    calls: list[int] = []
    receive_batch = FastLloydClient.receive_batch.__func__

    def counting(cls, machines, sender, message, *, round_idx=None):
        calls.append(len(machines))
        return receive_batch(cls, machines, sender, message, round_idx=round_idx)

    whole_meter, sliced_meter = Meter(), Meter()
    whole = simulate(fastlloyd(30, iterations=3), config=RuntimeConfig(session=SESSION), meter=whole_meter)
    monkeypatch.setattr(simulation, "_BATCH_RECEIVERS", 7)
    monkeypatch.setattr(FastLloydClient, "receive_batch", classmethod(counting))
    sliced = simulate(fastlloyd(30, iterations=3), config=RuntimeConfig(session=SESSION), meter=sliced_meter)
    assert calls and max(calls) == 7 and 30 % 7 in calls
    assert_same_fastlloyd_runs(sliced_meter, sliced, whole_meter, whole)


def test_a_link_model_with_measured_compute_times_each_receivers_own_handler(monkeypatch):
    """With a link model and measured compute no broadcast is batched (each receiver's own
    ``receive`` is what its own process would run and time); with fixed compute batching stays;
    either way the run is the one without a model."""
    from fedproto.netmodel import LinkModel

    calls: list[int] = []
    receive_batch = FastLloydClient.receive_batch.__func__

    def counting(cls, machines, sender, message, *, round_idx=None):
        calls.append(len(machines))
        return receive_batch(cls, machines, sender, message, round_idx=round_idx)

    monkeypatch.setattr(FastLloydClient, "receive_batch", classmethod(counting))
    plain_meter, measured_meter, fixed_meter = Meter(), Meter(), Meter()
    plain = simulate(fastlloyd(6, iterations=3), config=RuntimeConfig(session=SESSION), meter=plain_meter)
    assert calls and max(calls) == 6
    calls.clear()
    model = LinkModel.preset("lan")
    measured = simulate(fastlloyd(6, iterations=3), config=RuntimeConfig(session=SESSION), meter=measured_meter,
                        network=model, compute="measured")
    assert calls == []
    assert_same_fastlloyd_runs(measured_meter, measured, plain_meter, plain)
    fixed = simulate(fastlloyd(6, iterations=3), config=RuntimeConfig(session=SESSION), meter=fixed_meter,
                     network=model, compute="fixed:0.001")
    assert calls and max(calls) == 6
    assert_same_fastlloyd_runs(fixed_meter, fixed, plain_meter, plain)

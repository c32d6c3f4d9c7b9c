"""The link model (fedproto.netmodel): hand-computed arrivals, the star's two hops, ties, model files,
and the lean engine driven through it (same results and bytes; deadlines on the model's clock)."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from fedproto.messages import PhaseTimedOut
from fedproto.metering import Meter, RunReport, report_schema
from fedproto.netmodel import Link, LinkModel, LinkSimulator, parse_compute, plot_timeline
from fedproto.runtime import RuntimeConfig
from fedproto.simulation import simulate
from fedproto.testing.toy import SumCoordinator, SumWorker

SESSION = 31


def toy(n: int, rounds: int = 2, **kwargs) -> dict:
    workers = tuple(f"w{i}" for i in range(n))
    machines = {"coord": SumCoordinator("coord", workers=workers, rounds=rounds, dim=3, **kwargs)}
    for i, w in enumerate(workers):
        machines[w] = SumWorker(w, coordinator="coord", values=np.arange(3.0) + i)
    return machines


def model(latency_s: float, bandwidth: float | None = None, topology: str = "star") -> LinkModel:
    return LinkModel(topology=topology, default=Link(latency_s, bandwidth))


# --- the event model, by hand ----------------------------------------------------------------------------


def test_frames_queue_on_their_link_and_take_bytes_over_bandwidth():
    # a -> b: 10 ms, 1000 B/s. 100 B then 300 B sent at 0: the first is on the wire 0..0.1 and
    # arrives at 0.11; the second waits for the link, is on it 0.1..0.4 and arrives at 0.41.
    sim = LinkSimulator(model(0.01, 1000.0, "mesh"), ["s", "a", "b"], compute_s=0.0)
    first, second = object(), object()
    h = sim.handled("a", 0, 0.0, 0.0)
    sim.send(h, "b", 100, 0, "p", first)
    sim.send(h, "b", 300, 0, "p", second)
    assert sim.next_time() == pytest.approx(0.11)
    when, frame, group = sim.next_arrivals()
    assert (when, frame, group) == (pytest.approx(0.11), first, [("b", 0)])
    # b is busy 0.11..0.16 (a measured 50 ms handler): the second frame, at 0.41, finds it free
    sim.compute_s = None
    sim.handled("b", 0, when, 0.05, trigger=0)
    assert sim.clock["b"] == pytest.approx(0.16)
    assert sim.next_time() == pytest.approx(0.41)
    when, frame, _ = sim.next_arrivals()
    assert frame is second
    sim.handled("b", 0, when, 0.05, trigger=1)
    assert sim.clock["b"] == pytest.approx(0.46)


def test_a_frame_arriving_while_its_party_is_busy_waits_for_the_party():
    sim = LinkSimulator(model(0.01, None, "mesh"), ["s", "a"], compute_s=None)
    sim.handled("a", 0, 0.0, 0.5)  # busy until 0.5
    h = sim.handled("s", 0, 0.0, 0.0)
    sim.send(h, "a", 10, 0, "p", "f")
    assert sim.next_time() == pytest.approx(0.01)
    when, _, group = sim.next_arrivals()
    handler = sim.handled("a", 0, when, 0.25, trigger=group[0][1])
    assert sim.h_start[handler] == 0.5 and sim.clock["a"] == 0.75


def test_the_star_sends_frames_between_clients_over_two_links_queueing_on_both():
    # hub -> b carries the hub's own 1000 B frame 0..1.0 (1000 B/s); a's 100 B frame to b crosses
    # a -> hub (0..0.1, arrives 0.11), then waits for hub -> b until 1.0, is on it until 1.1 and
    # arrives at 1.11: two latencies, two transmissions, one wait.
    sim = LinkSimulator(model(0.01, 1000.0), ["hub", "a", "b"], compute_s=0.0)
    own, relayed = object(), object()
    sim.send(sim.handled("hub", 0, 0.0, 0.0), "b", 1000, 0, "p", own)
    sim.send(sim.handled("a", 0, 0.0, 0.0), "b", 100, 0, "p", relayed)
    arrivals = []
    while sim.next_time() != float("inf"):
        when, frame, _ = sim.next_arrivals()
        arrivals.append((frame, when))
    assert arrivals == [(own, pytest.approx(1.01)), (relayed, pytest.approx(1.11))]
    assert sim.d_hops == [1, 2]
    # in a mesh the same frame goes straight: 0.1 on the wire, 0.11
    mesh = LinkSimulator(model(0.01, 1000.0, "mesh"), ["hub", "a", "b"], compute_s=0.0)
    mesh.send(mesh.handled("a", 0, 0.0, 0.0), "b", 100, 0, "p", relayed)
    assert mesh.next_time() == pytest.approx(0.11) and mesh.d_hops == [1]


def test_ties_are_delivered_in_the_order_frames_entered_their_last_link_and_a_broadcast_arrives_together():
    sim = LinkSimulator(model(0.02, None, "mesh"), ["s", "a", "b", "c"], compute_s=0.0)
    from_c, from_a, broadcast = object(), object(), object()
    sim.send(sim.handled("c", 0, 0.0, 0.0), "s", 5, 0, "p", from_c)
    sim.send(sim.handled("a", 0, 0.0, 0.0), "s", 5, 0, "p", from_a)
    hub = sim.handled("s", 0, 0.0, 0.0)
    for dest in ("a", "b", "c"):
        sim.send(hub, dest, 5, 0, "q", broadcast)
    order = []
    while sim.next_time() != float("inf"):
        when, frame, group = sim.next_arrivals()
        order.append((frame, [dest for dest, _ in group]))
    assert order == [(from_c, ["s"]), (from_a, ["s"]), (broadcast, ["a", "b", "c"])]


def test_the_critical_path_walks_back_through_frames_and_the_partys_previous_handler():
    # s starts (1 ms), broadcasts to a and b (10 ms); each answers after 1 ms; s handles a's then
    # b's answer (1 ms each, the second waiting for the first): 1 + 10 + 1 + 10 + 1 + 1 ms.
    sim = LinkSimulator(model(0.01), ["s", "a", "b"], compute_s=0.001)
    start = sim.handled("s", 0, 0.0, 0.0)
    for dest in ("a", "b"):
        sim.send(start, dest, 8, 0, "query", "q")
    while sim.next_time() != float("inf"):
        when, _, group = sim.next_arrivals()
        for dest, delivery in group:
            handler = sim.handled(dest, 0, when, 0.0, trigger=delivery)
            if dest != "s":
                sim.send(handler, "s", 8, 0, "answer", dest)
    p = sim.prediction()
    assert p["wall_time_s"] == pytest.approx(0.024)
    assert p["latency_hops"] == 2 and p["network_s"] == pytest.approx(0.02) and p["compute_s"] == pytest.approx(0.004)
    assert p["network_share"] + p["compute_share"] == pytest.approx(1.0)
    assert p["rounds"] == [
        {"round_idx": 0, "wall_time_s": pytest.approx(0.024), "network_s": pytest.approx(0.02),
         "compute_s": pytest.approx(0.004), "timeout_wait_s": 0.0, "critical_party": "s", "latency_hops": 2}
    ]
    assert [(x["phase"], x["start_s"], x["end_s"]) for x in p["phases"]] == [
        ("query", pytest.approx(0.001), pytest.approx(0.012)), ("answer", pytest.approx(0.012), pytest.approx(0.024))
    ]
    # every party's row spans the run: its compute plus its waiting
    for rows in p["timeline"].values():
        assert sum(r["compute_s"] + r["wait_s"] for r in rows) == pytest.approx(0.024)


# --- models and their files --------------------------------------------------------------------------


def test_link_resolution_default_then_party_entries_slower_wins_then_the_link_entry():
    m = LinkModel.from_mapping({
        "topology": "mesh",
        "default": {"latency_s": 0.01, "bandwidth_bytes_per_s": 1e6},
        "parties": {"a": {"latency_s": 0.05}, "b": {"latency_s": 0.02, "bandwidth_bytes_per_s": 1e3}},
        "links": {"a->b": {"bandwidth_bytes_per_s": None}},
    })
    assert m.link("s", "c") == Link(0.01, 1e6)
    assert m.link("s", "a") == m.link("a", "s") == Link(0.05, 1e6)
    assert m.link("b", "a") == Link(0.05, 1e3)  # both ends have entries: the slower value each
    assert m.link("a", "b") == Link(0.05, None)  # the link's own entry overrides
    assert m.to_dict()["links"] == {"a->b": {"bandwidth_bytes_per_s": None}}


def test_presets_and_files(tmp_path):
    assert LinkModel.parse("none") is None
    assert LinkModel.preset("lan").default == Link(0.000125, 125e6)
    assert LinkModel.preset("wan").default == Link(0.025, 125e6)
    assert LinkModel.preset("cross-region").default == Link(0.075, 12.5e6)
    toml = tmp_path / "net.toml"
    toml.write_text('topology = "mesh"\n[default]\nlatency_s = 0.003\n[links."server->client-0"]\nlatency_s = 0.5\n')
    m = LinkModel.parse(str(toml))
    assert (m.topology, m.link("server", "client-0"), m.link("client-0", "server")) == ("mesh", Link(0.5), Link(0.003))
    path = tmp_path / "net.json"
    path.write_text(json.dumps({"parties": {"client-3": {"bandwidth_bytes_per_s": 10}}}))
    assert LinkModel.load(path).link("server", "client-3") == Link(0.0, 10.0)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"default": {"latency_s": -0.1}}, "default.latency_s: must be >= 0"),
        ({"links": {"a->b": {"bandwidth_bytes_per_s": 0}}}, "links.a->b.bandwidth_bytes_per_s: must be > 0"),
        ({"parties": {"a": {"latency": 1}}}, "parties.a: unknown key 'latency'"),
        ({"links": {"a-b": {}}}, "links.a-b: a link is named SENDER->RECEIVER"),
        ({"topology": "ring"}, "topology must be star or mesh"),
        ({"speed": 1}, "unknown key 'speed'"),
        ({"default": {"latency_s": "fast"}}, "default.latency_s: expected a finite number"),
    ],
)
def test_a_malformed_model_names_the_key(data, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        LinkModel.from_mapping(data, name="t")


def test_unknown_presets_and_unreadable_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="neither a preset"):
        LinkModel.parse("moon")
    with pytest.raises(ValueError, match="cannot read the network model"):
        LinkModel.parse(str(tmp_path))  # a directory
    bad = tmp_path / "bad.toml"
    bad.write_text("[default\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        LinkModel.parse(str(bad))


@pytest.mark.parametrize(("spec", "seconds"), [("measured", None), (None, None), ("fixed:0.001", 0.001), (0.5, 0.5)])
def test_compute_specs(spec, seconds):
    assert parse_compute(spec) == seconds


@pytest.mark.parametrize("spec", ["fixed:", "fixed:-1", "fixed:nan", "cpu", "fixed:1s"])
def test_bad_compute_specs_are_refused(spec):
    with pytest.raises(ValueError, match="compute"):
        parse_compute(spec)


# --- the lean engine through the model ---------------------------------------------------------------


def test_the_model_changes_neither_results_nor_bytes_and_predicts_the_hand_computed_time():
    plain, linked = Meter(), Meter()
    ours = simulate(toy(3), config=RuntimeConfig(session=SESSION), meter=plain)
    theirs = simulate(toy(3), config=RuntimeConfig(session=SESSION), meter=linked, network=model(0.025), compute="fixed:0.001")
    np.testing.assert_array_equal(ours["coord"], theirs["coord"])
    assert dict(plain.sent) == dict(linked.sent)
    assert plain.prediction == {} and "prediction" not in plain.report(protocol="toy", transport="memory", session=SESSION, parties=()).to_dict()
    # the path: coord starts; per round a query out (1 hop), a worker's handler, the answers
    # back (1 hop) and the coordinator's three handlers one after another; then Finished (1 hop)
    # and a worker's handler: 5 hops, 1 + (1 + 3) + (1 + 3) + 1 = 10 handlers of 1 ms
    p = linked.prediction
    assert p["latency_hops"] == 5
    assert p["wall_time_s"] == pytest.approx(5 * 0.025 + 0.010)
    assert p["compute_s"] == pytest.approx(0.010) and p["timeout_wait_s"] == 0.0
    assert sum(r["wall_time_s"] for r in p["rounds"]) == pytest.approx(p["wall_time_s"])
    report = linked.report(protocol="toy", transport="memory", session=SESSION, parties=())
    assert report.prediction == p
    jsonschema.validate(report.to_dict(), report_schema())
    assert RunReport.from_json(report.to_json()).prediction == p
    without = plain.report(protocol="toy", transport="memory", session=SESSION, parties=())
    assert RunReport.merge([without, report]).prediction == p  # the first non-empty one


def test_fixed_compute_gives_bit_for_bit_equal_predictions_and_batching_changes_nothing():
    runs = []
    for batch in (True, True, False):
        meter = Meter()
        simulate(toy(5), config=RuntimeConfig(session=SESSION), meter=meter, network=LinkModel.preset("wan"),
                 compute="fixed:0.002", batch=batch)
        runs.append(meter.prediction)
    assert runs[0] == runs[1] == runs[2]


class Quitter(SumWorker):
    """Never answers; quits when its deadline passes."""

    def _on_query(self, sender, message):
        return []

    def _on_event(self, event):
        if isinstance(event, PhaseTimedOut):
            self._finish(None)
            return []
        return super()._on_event(event)


def test_deadlines_fire_on_the_models_clock():
    machines = toy(3, rounds=1, min_responses=2)
    machines["w1"] = Quitter("w1", coordinator="coord", values=np.ones(3))
    meter = Meter()
    deadline = 1.0
    results = simulate(machines, config=RuntimeConfig(session=SESSION, deadline_s=deadline), meter=meter,
                       network=model(0.01), compute="fixed:0.001")
    np.testing.assert_array_equal(results["coord"][0], (np.arange(3.0) + 0) + (np.arange(3.0) + 2))
    p = meter.prediction
    # the coordinator times out at its deadline and finishes the round; the quitter's deadline
    # (its factor times longer) ends the run
    finish = next(x for x in p["phases"] if x["phase"] == "finish")
    assert finish["start_s"] == pytest.approx(deadline * machines["coord"].DEADLINE_FACTOR + 0.001)
    assert p["wall_time_s"] == pytest.approx(deadline * machines["w1"].DEADLINE_FACTOR + 0.001)
    assert p["timeout_wait_s"] > 0
    assert p["network_s"] + p["compute_s"] + p["timeout_wait_s"] == pytest.approx(p["wall_time_s"])


def test_the_timeline_keeps_the_busiest_parties_and_summarises_the_rest(tmp_path):
    meter = Meter()
    simulate(toy(20, rounds=1), config=RuntimeConfig(session=SESSION), meter=meter, network=model(0.01),
             compute="fixed:0.001")
    timeline = meter.prediction["timeline"]
    assert list(timeline)[0] == "coord" and "summary" in timeline and len(timeline) == 7
    assert timeline["summary"][0]["parties"] == 21 - 6
    png = plot_timeline(meter.prediction, tmp_path / "t.png", title="toy")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no prediction"):
        plot_timeline({}, tmp_path / "u.png")

"""The link model (fedproto.netmodel): hand-computed arrivals, the star's two hops, ties, model files,
and the lean engine driven through it (same results and bytes; deadlines on the model's clock)."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import trio

from fedproto.messages import PhaseTimedOut
from fedproto.metering import Meter, RunReport, report_schema
from fedproto.netmodel import ComputeTrace, Link, LinkModel, LinkSimulator, parse_compute, plot_timeline
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.simulation import simulate
from fedproto.transports.memory import MemoryNetwork
from fedproto.testing.toy import SumWorker, sum_machines

SESSION = 31


def toy(n: int, rounds: int = 2, **kwargs) -> dict:
    """The toy sum: a coordinator ``coord`` and ``n`` workers ``w<i>`` holding ``arange(3) + i``."""
    return sum_machines([f"w{i}" for i in range(n)], rounds=rounds, dim=3, coordinator="coord", **kwargs)


def model(latency_s: float, bandwidth: float | None = None, topology: str = "star") -> LinkModel:
    return LinkModel(topology=topology, default=Link(latency_s, bandwidth))


def _arrivals(sim, *, handle=False):
    """Every frame in flight as ``(frame, arrival time)``, in delivery order; with ``handle``, each
    receiver handles each frame as it arrives (no compute, nothing sent)."""
    arrivals = []
    while sim.next_time() != float("inf"):
        when, frame, group = sim.next_arrivals()
        arrivals.append((frame, when))
        if handle:
            for dest, delivery in group:
                sim.handled(dest, 0, when, 0.0, trigger=delivery)
    return arrivals


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
    assert _arrivals(sim) == [(own, pytest.approx(1.01)), (relayed, pytest.approx(1.11))]
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


def _answer_round(sim, senders=("a", "b"), work=0.05):
    """s (no compute) sends to each of ``senders``; each works ``work`` s and answers; s takes the
    answers (no compute). Returns the prediction."""
    start = sim.handled("s", 0, 0.0, 0.0)
    for dest in senders:
        sim.send(start, dest, 8, 0, "query", "q")
    while sim.next_time() != float("inf"):
        when, _, group = sim.next_arrivals()
        for dest, delivery in group:
            handler = sim.handled(dest, 0, when, 0.0 if dest == "s" else work, trigger=delivery,
                                  frames_out=0 if dest == "s" else 1)
            if dest != "s":
                sim.send(handler, "s", 8, 0, "answer", dest)
    return sim.prediction()


def test_parties_on_a_host_with_one_core_take_turns_and_the_path_goes_through_the_core():
    # mesh, 10 ms: a and b get the query at 0.01. Own hosts (the default): both work 0.01..0.06,
    # answers arrive at 0.07. On one core: a works 0.01..0.06, b waits for the core and works
    # 0.06..0.11, its answer arrives at 0.12. The path: s's start, the query (10 ms), a's 50 ms,
    # b's 50 ms (it waited for a's core), b's answer (10 ms).
    two_hosts = _answer_round(LinkSimulator(model(0.01, None, "mesh"), ["s", "a", "b"]))
    assert two_hosts["wall_time_s"] == pytest.approx(0.07)
    shared = LinkModel.from_mapping({"topology": "mesh", "default": {"latency_s": 0.01},
                                     "hosts": {"vm": {"cores": 1, "parties": ["a", "b"]}}})
    sim = LinkSimulator(shared, ["s", "a", "b"])
    p = _answer_round(sim)
    assert p["wall_time_s"] == pytest.approx(0.12)
    assert (p["network_s"], p["compute_s"], p["timeout_wait_s"]) == (pytest.approx(0.02), pytest.approx(0.10), 0.0)
    assert p["latency_hops"] == 2 and p["rounds"][0]["critical_party"] == "s"
    starts = [(sim.h_party[h], sim.h_start[h]) for h in (1, 2)]
    assert starts == [("a", pytest.approx(0.01)), ("b", pytest.approx(0.06))]
    # two cores on that host: no waiting, as with a host each
    wide = LinkModel.from_mapping({"topology": "mesh", "default": {"latency_s": 0.01},
                                   "hosts": {"vm": {"cores": 2, "parties": "*"}}})
    assert _answer_round(LinkSimulator(wide, ["s", "a", "b"]))["wall_time_s"] == pytest.approx(0.07)


def test_a_frame_costs_its_sender_and_its_receiver_the_per_frame_seconds():
    # mesh, 10 ms, 2 ms a frame. s starts (sends 2: 4 ms), a and b get the query at 0.014 and work
    # 50 ms + 2 ms (received) + 2 ms (their answer) until 0.068; the answers arrive at 0.078; s
    # takes them one after the other, 2 ms each (received): 0.080, then 0.082.
    costly = LinkModel.from_mapping({"topology": "mesh", "default": {"latency_s": 0.01}, "per_frame_s": 0.002})
    sim = LinkSimulator(costly, ["s", "a", "b"])
    start = sim.handled("s", 0, 0.0, 0.0, frames_out=2)
    assert sim.clock["s"] == pytest.approx(0.004)
    for dest in ("a", "b"):
        sim.send(start, dest, 8, 0, "query", "q")
    while sim.next_time() != float("inf"):
        when, _, group = sim.next_arrivals()
        for dest, delivery in group:
            handler = sim.handled(dest, 0, when, 0.0 if dest == "s" else 0.05, trigger=delivery,
                                  frames_out=0 if dest == "s" else 1)
            if dest != "s":
                sim.send(handler, "s", 8, 0, "answer", dest)
    p = sim.prediction()
    assert p["wall_time_s"] == pytest.approx(0.082)
    assert p["network_s"] == pytest.approx(0.02) and p["compute_s"] == pytest.approx(0.062)


def test_no_frame_leaves_a_link_before_its_connection_set_up_trips():
    # star, 10 ms, connect_trips 3: a's frame to the hub, sent at 0, leaves at 0.03 and arrives
    # at 0.04; a frame a sends to b at 0.1 crosses a -> hub (set up long ago: 0.11) and hub -> b
    # (0.12). Without set-up trips the first frame arrives at 0.01.
    slow = LinkModel.from_mapping({"default": {"latency_s": 0.01}, "connect_trips": 3})
    sim = LinkSimulator(slow, ["hub", "a", "b"], compute_s=0.0)
    sim.send(sim.handled("a", 0, 0.0, 0.0), "hub", 8, 0, "p", "first")
    sim.send(sim.handled("a", 0, 0.1, 0.0), "b", 8, 0, "p", "late")
    assert _arrivals(sim) == [("first", pytest.approx(0.04)), ("late", pytest.approx(0.12))]
    # with a bandwidth the transmission starts after the set-up: 100 B at 1000 B/s, 0.03..0.13, 0.14
    sim = LinkSimulator(LinkModel.from_mapping({"default": {"latency_s": 0.01, "bandwidth_bytes_per_s": 1000},
                                                "connect_trips": 3}), ["hub", "a"], compute_s=0.0)
    sim.send(sim.handled("a", 0, 0.0, 0.0), "hub", 100, 0, "p", "f")
    assert sim.next_time() == pytest.approx(0.14)
    # the critical path counts the set-up as network time: all of the 0.14 s run
    sim.handled("hub", 0, sim.next_arrivals()[0], 0.0, trigger=0)
    assert sim.prediction()["network_s"] == pytest.approx(0.14)
    assert LinkModel().connect_trips == 0 and LinkModel.preset("wan").connect_trips == 0
    assert LinkModel.from_mapping({"connect_trips": 6}).to_dict()["connect_trips"] == 6


def test_each_connection_costs_both_ends_its_set_up_cpu_before_it_carries_a_frame():
    # star of a hub and two clients, each on its own machine, 1 ms links, 10 ms of set-up per end:
    # a and b set up at 0..0.01; the hub sets up a's connection at 0..0.01, then b's at
    # 0.01..0.02. a's link is ready at 0.01, b's at 0.02.
    model = LinkModel.from_mapping({"default": {"latency_s": 0.001}, "connect_s": 0.01})
    assert model.to_dict()["connect_s"] == 0.01 and LinkModel().connect_s == 0.0
    sim = LinkSimulator(model, ["hub", "a", "b"], compute_s=0.0)
    assert (sim.clock["hub"], sim.clock["a"], sim.clock["b"]) == (pytest.approx(0.02), pytest.approx(0.01),
                                                                  pytest.approx(0.01))
    # each client sends its first frame at once (its start, no compute), at 0.01: a's leaves then
    # and arrives at 0.011, b's waits for the hub's side of its connection, leaves at 0.02
    sim.send(sim.handled("a", 0, 0.0, 0.0), "hub", 8, 0, "p", "from a")
    sim.send(sim.handled("b", 0, 0.0, 0.0), "hub", 8, 0, "p", "from b")
    assert _arrivals(sim, handle=True) == [("from a", pytest.approx(0.011)), ("from b", pytest.approx(0.021))]
    # on one host of 2 cores the three parties' set-ups take turns: the hub's two and b's end at
    # 0.02, the clients' starts wait for a core, and both frames leave at 0.02
    shared = LinkModel.from_mapping({"default": {"latency_s": 0.001}, "connect_s": 0.01,
                                     "hosts": {"vm": {"cores": 2, "parties": "*"}}})
    crowded = LinkSimulator(shared, ["hub", "a", "b"], compute_s=0.0)
    assert crowded.clock == {"hub": pytest.approx(0.02), "a": pytest.approx(0.01), "b": pytest.approx(0.02)}
    crowded.send(crowded.handled("a", 0, 0.0, 0.0), "hub", 8, 0, "p", "from a")
    assert crowded.next_time() == pytest.approx(0.021)
    p = sim.prediction()
    assert p["wall_time_s"] == pytest.approx(0.021)
    # the hub's two set-ups are compute on its critical path, the last frame's wait and hop network
    assert p["compute_s"] + p["network_s"] == pytest.approx(0.021)
    # a mesh of three sets up all three pairs: each party runs two set-ups, on its own core
    mesh = LinkSimulator(LinkModel.from_mapping({"topology": "mesh", "connect_s": 0.01}), ["x", "y", "z"])
    assert all(mesh.clock[p] == pytest.approx(0.02) for p in "xyz")
    # none by default
    assert LinkSimulator(LinkModel.preset("wan"), ["hub", "a"]).clock == {"hub": 0.0, "a": 0.0}


def test_the_hub_forwards_a_frame_between_clients_at_twice_the_per_frame_cost_on_its_own_clock():
    # star, 10 ms, 2 ms a frame: a's start sends to b (2 ms); the frame reaches the hub at 0.012,
    # the hub forwards it 0.012..0.016 (receive and send), it reaches b at 0.026, b takes it
    # (2 ms): 0.028. The path: 2 hops (20 ms), a's 2 ms, the hub's 4 ms, b's 2 ms.
    costly = LinkModel.from_mapping({"default": {"latency_s": 0.01}, "per_frame_s": 0.002})
    sim = LinkSimulator(costly, ["hub", "a", "b"], compute_s=0.0)
    sim.send(sim.handled("a", 0, 0.0, 0.0, frames_out=1), "b", 8, 0, "p", "f")
    assert sim.next_time() == pytest.approx(0.026)
    assert sim.clock["hub"] == pytest.approx(0.016)
    when, _, group = sim.next_arrivals()
    sim.handled("b", 0, when, 0.0, trigger=group[0][1])
    p = sim.prediction()
    assert p["wall_time_s"] == pytest.approx(0.028)
    assert (p["network_s"], p["compute_s"], p["latency_hops"]) == (pytest.approx(0.02), pytest.approx(0.008), 2)
    assert p["timeline"]["hub"][0]["compute_s"] == pytest.approx(0.004)


def test_per_party_compilation_charges_each_partys_first_handler_of_a_kernel_what_the_lean_process_paid():
    per_party = LinkModel.from_mapping({"topology": "mesh", "compile": "per_party"})
    sim = LinkSimulator(per_party, ["s", "a", "b", "c"])
    query = ("Worker", 0, "query")
    # a compiled the kernel (0.2 s of its 0.3 s); b ran it compiled (0.1 s) but its own process
    # would have compiled it: 0.1 + 0.2; a's second handler of the key pays nothing more
    assert sim.clock["a"] == 0.0
    sim.handled("a", 0, 0.0, 0.3, kernels=(query, 0.2, 0.2))
    sim.handled("b", 0, 0.0, 0.1, kernels=(query, 0.0, 0.0))
    sim.handled("a", 0, 0.0, 0.1, kernels=(query, 0.0, 0.0))
    assert (sim.clock["a"], sim.clock["b"]) == (pytest.approx(0.4), pytest.approx(0.3))
    # a batch compiled 0.4 s of another key, of which c's measured time holds its share 0.1
    sim.handled("c", 0, 0.0, 0.15, kernels=(("Worker", 0, "update"), 0.4, 0.1))
    assert sim.clock["c"] == pytest.approx(0.45)
    # compiled once (the default), or fixed compute: nothing added
    once = LinkSimulator(LinkModel(topology="mesh"), ["s", "b"])
    once.handled("b", 0, 0.0, 0.1, kernels=(query, 0.2, 0.0))
    fixed = LinkSimulator(per_party, ["s", "b"], compute_s=0.001)
    fixed.handled("b", 0, 0.0, 0.1, kernels=(query, 0.2, 0.0))
    assert (once.clock["b"], fixed.clock["b"]) == (pytest.approx(0.1), 0.001)


def test_a_processs_first_kernel_is_charged_once_per_party_on_its_first_compiling_handler():
    model = LinkModel.from_mapping({"topology": "mesh", "compile": "per_party", "first_kernel_s": 0.05})
    assert model.to_dict()["first_kernel_s"] == 0.05 and LinkModel().first_kernel_s == 0.0
    sim = LinkSimulator(model, ["s", "a", "b"])
    query, plain = ("Worker", 0, "query"), ("Worker", 0, "hello")
    # a handler of a key no process compiles anything for: no first kernel
    sim.handled("a", 0, 0.0, 0.01, kernels=(plain, 0.0, 0.0))
    assert sim.clock["a"] == pytest.approx(0.01)
    # a compiles (0.2 s of its 0.3 s) and pays its first kernel: 0.01 + 0.3 + 0.05
    sim.handled("a", 0, 0.0, 0.3, kernels=(query, 0.2, 0.2))
    assert sim.clock["a"] == pytest.approx(0.36)
    # b runs the key compiled in the lean process: the compile (0.2) and its own first kernel
    sim.handled("b", 0, 0.0, 0.1, kernels=(query, 0.0, 0.0))
    assert sim.clock["b"] == pytest.approx(0.35)
    # once per party: another kernel of a and b pays its compile only
    other = ("Worker", 1, "query")
    sim.handled("a", 1, 0.0, 0.2, kernels=(other, 0.1, 0.1))
    sim.handled("b", 1, 0.0, 0.1, kernels=(other, 0.0, 0.0))
    assert (sim.clock["a"], sim.clock["b"]) == (pytest.approx(0.56), pytest.approx(0.55))
    # compiled once, or fixed compute: not charged
    once = LinkSimulator(LinkModel.from_mapping({"topology": "mesh", "first_kernel_s": 0.05}), ["s", "b"])
    once.handled("b", 0, 0.0, 0.1, kernels=(query, 0.2, 0.2))
    fixed = LinkSimulator(model, ["s", "b"], compute_s=0.001)
    fixed.handled("b", 0, 0.0, 0.1, kernels=(query, 0.2, 0.2))
    assert (once.clock["b"], fixed.clock["b"]) == (pytest.approx(0.1), 0.001)


def test_a_compute_trace_charges_each_handler_its_partys_figure_for_the_round_and_trigger_in_order():
    trace = ComputeTrace({"a": [[0, "start", 0.1], [0, "query", 0.2], [1, "query", 0.4], [0, "query", 0.3]]})
    model = LinkModel.from_mapping({"topology": "mesh", "compile": "per_party", "first_kernel_s": 0.05,
                                    "per_frame_s": 0.001})
    sim = LinkSimulator(model, ["s", "a"], compute_s=trace)
    query = ("Worker", 0, "query")
    # the measured 9 s is replaced; a first handler that compiled adds neither the lean process's
    # compile nor a first kernel (the trace holds the party process's own); frames still cost
    sim.handled("a", 0, 0.0, 9.0, kernels=(("Worker", 0, "start"), 0.5, 0.5), cause="start")
    assert sim.clock["a"] == pytest.approx(0.1)
    sim.handled("a", 0, 0.0, 9.0, trigger=-1, frames_out=1, kernels=(query, 0.5, 0.0), cause="query")
    assert sim.clock["a"] == pytest.approx(0.1 + 0.2 + 0.001)
    # the second (round 0, query) takes the second such figure, whatever came between them
    sim.handled("a", 0, 0.0, 9.0, cause="query")
    assert sim.clock["a"] == pytest.approx(0.601)
    # none left for a third one, nor for a trigger the trace never saw: measured, and counted
    sim.handled("a", 0, 0.0, 0.01, cause="query")
    sim.handled("a", 1, 0.0, 0.02, cause="update")
    assert sim.clock["a"] == pytest.approx(0.631)
    sim.handled("a", 1, 0.0, 9.0, cause="query")
    assert sim.clock["a"] == pytest.approx(1.031)
    assert sim.prediction()["untraced_handlers"] == 2
    assert sim.prediction()["unused_trace_figures"] == 0  # every figure was taken
    # figures of handlers a run does not have stay unused, and are counted
    fewer = LinkSimulator(model, ["s", "a"], compute_s=ComputeTrace({"a": [[0, "start", 0.1], [0, "query", 0.2]]}))
    fewer.handled("a", 0, 0.0, 9.0, cause="start")
    assert (fewer.prediction()["untraced_handlers"], fewer.prediction()["unused_trace_figures"]) == (0, 1)
    fixed = LinkSimulator(model, ["s", "a"], compute_s=0.001)
    fixed.handled("a", 0, 0.0, 9.0, cause="start")
    assert "untraced_handlers" not in fixed.prediction()


@pytest.mark.parametrize(("entry", "message"), [
    ([-1, "start", 0.1], "round_idx"), ([True, "start", 0.1], "round_idx"), ([0, "", 0.1], "trigger"),
    ([0, "start", -0.1], "seconds"), ([0, "start", float("nan")], "seconds"), ([0, "start"], "expected"),
    ("0 start 0.1", "expected"),
])
def test_a_malformed_trace_entry_names_the_party_and_the_entry(entry, message):
    with pytest.raises(ValueError, match=rf"b\[1\]: {message}"):
        ComputeTrace({"b": [[0, "start", 0.0], entry]})


def _traced_toy(n: int) -> tuple[dict, Meter]:
    """The toy sum run by the runtime (a task per party, in memory) with its handlers traced."""
    async def go():
        meter = Meter(trio.current_time, trace_compute=True)
        machines = toy(n)
        results = await run_parties(machines, MemoryNetwork(list(machines)), config=RuntimeConfig(session=SESSION),
                                    meter=meter)
        return results, meter

    return trio.run(go)


def test_the_runtime_traces_every_handler_and_the_lean_engine_finds_a_figure_for_each():
    results, meter = _traced_toy(3)
    trace = meter.compute_trace
    assert set(trace) == {"coord", "w0", "w1", "w2"}
    for party, handlers in trace.items():
        assert handlers[0][:2] == (0, "start")
        assert all(seconds >= 0 for _, _, seconds in handlers)
        # one handler per frame the party received, each named by the frame's round and tag
        sent_to = sorted((r, tag) for (r, _, _, dest, tag), (frames, _) in meter.sent.items() if dest == party
                         for _ in range(frames))
        assert sorted((r, tag) for r, tag, _ in handlers[1:]) == sent_to
    # untraced: off by default, and nothing in the report then
    assert Meter().compute_trace is None
    # the lean engine finds every handler in the trace (the same keys), and the results are the same
    replay = Meter()
    replayed = ComputeTrace(trace)
    again = simulate(toy(3), config=RuntimeConfig(session=SESSION), meter=replay, network=model(0.01),
                     compute=replayed)
    np.testing.assert_array_equal(again["coord"], results["coord"])
    assert replay.prediction["untraced_handlers"] == replay.prediction["unused_trace_figures"] == 0
    assert dict(replay.sent) == dict(meter.sent)
    # a prediction is the same for the same compute trace (the trace itself is read-only)
    twice = Meter()
    simulate(toy(3), config=RuntimeConfig(session=SESSION), meter=twice, network=model(0.01), compute=replayed)
    assert twice.prediction == replay.prediction


def test_a_trace_of_equal_figures_predicts_exactly_what_fixed_compute_predicts():
    _, meter = _traced_toy(4)
    flat = ComputeTrace({p: [[r, tag, 0.001] for r, tag, _ in h] for p, h in meter.compute_trace.items()})
    traced, fixed = Meter(), Meter()
    wan = LinkModel.preset("wan")
    simulate(toy(4), config=RuntimeConfig(session=SESSION), meter=traced, network=wan, compute=flat)
    simulate(toy(4), config=RuntimeConfig(session=SESSION), meter=fixed, network=wan, compute="fixed:0.001")
    assert traced.prediction.pop("untraced_handlers") == 0
    assert traced.prediction.pop("unused_trace_figures") == 0
    assert traced.prediction == fixed.prediction


def test_the_report_keeps_the_trace_merges_it_per_party_and_the_schema_describes_it(tmp_path):
    _, meter = _traced_toy(2)
    report = meter.report(protocol="toy", transport="memory", session=SESSION, parties=("coord", "w0", "w1"))
    doc = report.to_dict()
    jsonschema.validate(doc, report_schema())
    assert doc["compute_trace"]["w0"][0] == [0, "start", pytest.approx(meter.compute_trace["w0"][0][2])]
    assert RunReport.from_json(report.to_json()).compute_trace == doc["compute_trace"]
    assert "compute_trace" not in Meter().report(protocol="toy", transport="memory", session=0, parties=()).to_dict()
    # a process's report per party (as fedproto party writes them), merged: every party's trace
    parts = [RunReport.from_dict({**doc, "compute_trace": {p: doc["compute_trace"][p]}}) for p in ("coord", "w0", "w1")]
    assert RunReport.merge(parts).compute_trace == doc["compute_trace"]


def test_traces_load_from_a_report_or_a_directory_of_party_reports_and_bad_ones_are_refused(tmp_path):
    _, meter = _traced_toy(2)
    doc = meter.report(protocol="toy", transport="memory", session=SESSION, parties=("coord", "w0", "w1")).to_dict()
    whole = tmp_path / "run.json"
    whole.write_text(json.dumps(doc))
    assert parse_compute(f"trace:{whole}").handlers == sum(len(h) for h in doc["compute_trace"].values())
    parties = tmp_path / "parties"
    parties.mkdir()
    for p in ("coord", "w0", "w1"):
        party_doc = {"party": p, "result": None, "report": {**doc, "compute_trace": {p: doc["compute_trace"][p]}}}
        (parties / f"{p}.json").write_text(json.dumps(party_doc))
    (parties / "split.json").write_text(json.dumps({"parties": ["coord", "w0", "w1"]}))  # not a report: skipped
    loaded = ComputeTrace.load(parties)
    assert loaded.handlers == parse_compute(f"trace:{whole}").handlers
    assert loaded.figure("w1", 0, "start", 0) == doc["compute_trace"]["w1"][0][2]
    assert loaded.figure("w1", 0, "start", 1) is None and loaded.figure("w9", 0, "start", 0) is None
    (parties / "again.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="traced in two reports"):
        ComputeTrace.load(parties)
    untraced = tmp_path / "untraced.json"
    untraced.write_text(json.dumps({k: v for k, v in doc.items() if k != "compute_trace"}))
    with pytest.raises(ValueError, match="no compute_trace.*--compute-trace"):
        parse_compute(f"trace:{untraced}")
    (tmp_path / "garbage.json").write_bytes(b"\xff{")
    with pytest.raises(ValueError, match="not a JSON run report"):
        parse_compute(f"trace:{tmp_path / 'garbage.json'}")
    with pytest.raises(ValueError, match="cannot read the compute trace"):
        parse_compute(f"trace:{tmp_path / 'missing.json'}")
    with pytest.raises(ValueError, match="needs the path"):
        parse_compute("trace:")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no run report with a compute_trace"):
        ComputeTrace.load(empty)


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
        ({"hosts": {"vm": {"cores": 0}}}, "hosts.vm.cores: expected a whole number >= 1"),
        ({"hosts": {"vm": {"cores": 1.5}}}, "hosts.vm.cores: expected a whole number >= 1"),
        ({"hosts": {"x": {"parties": ["a"]}, "y": {"parties": ["b", "a"]}}}, "hosts.y.parties: a is already on host x"),
        ({"hosts": {"x": {}, "y": {"parties": "*"}}}, "hosts.y.parties: only one host may take the rest"),
        ({"hosts": {"x": {"parties": "a"}}}, "hosts.x.parties: expected a list of party names"),
        ({"hosts": {"x": {"ram": 4}}}, "hosts.x: unknown key 'ram'"),
        ({"per_frame_s": -0.001}, "per_frame_s: expected a finite number of seconds >= 0"),
        ({"first_kernel_s": -1}, "first_kernel_s: expected a finite number of seconds >= 0"),
        ({"first_kernel_s": "0.1"}, "first_kernel_s: expected a finite number of seconds >= 0"),
        ({"connect_s": -0.5}, "connect_s: expected a finite number of seconds >= 0"),
        ({"compile": "twice"}, "compile must be once or per_party"),
        ({"connect_trips": -1}, "connect_trips: expected a whole number >= 0"),
        ({"connect_trips": 2.5}, "connect_trips: expected a whole number >= 0"),
        ({"connect_trips": True}, "connect_trips: expected a whole number >= 0"),
    ],
)
def test_a_malformed_model_names_the_key(data, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        LinkModel.from_mapping(data, name="t")


def test_hosts_place_named_parties_the_star_takes_the_rest_and_others_have_their_own():
    m = LinkModel.from_mapping({"hosts": {"site": {"cores": 4, "parties": ["server"]},
                                          "vm": {"cores": 2, "parties": "*"}}, "per_frame_s": 0.0001})
    assert m.placement(["server", "c0", "c1"]) == {"server": ("host:site", 4), "c0": ("host:vm", 2),
                                                  "c1": ("host:vm", 2)}
    assert LinkModel.from_mapping({"hosts": {"site": {"parties": ["server"]}}}).placement(["server", "c0"]) == {
        "server": ("host:site", 1), "c0": ("party:c0", 1)}
    assert m.to_dict()["hosts"] == {"site": {"cores": 4, "parties": ["server"]}, "vm": {"cores": 2, "parties": "*"}}
    assert m.to_dict()["per_frame_s"] == 0.0001 and m.to_dict()["compile"] == "once"
    for name in ("lan", "wan", "cross-region"):  # presets: a host each, no per-frame cost
        assert (LinkModel.preset(name).hosts, LinkModel.preset(name).per_frame_s) == ({}, 0.0)


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


def test_the_engine_on_one_core_without_latency_predicts_every_handler_one_after_another():
    # every party on one single-core host, links without latency or bandwidth limit: nothing
    # overlaps, so the wall time is the sum of all handlers (1 ms each, plus 0.5 ms a frame end)
    plain, linked = Meter(), Meter()
    spread = simulate(toy(3), config=RuntimeConfig(session=SESSION), meter=plain, network=model(0.0),
                      compute="fixed:0.001")
    one_core = LinkModel.from_mapping({"hosts": {"box": {"cores": 1, "parties": "*"}}, "per_frame_s": 0.0005})
    ours = simulate(toy(3), config=RuntimeConfig(session=SESSION), meter=linked, network=one_core,
                    compute="fixed:0.001")
    np.testing.assert_array_equal(ours["coord"], spread["coord"])
    assert dict(plain.sent) == dict(linked.sent)
    p = linked.prediction
    handlers_compute = sum(row["compute_s"] for rows in p["timeline"].values() for row in rows)
    assert p["wall_time_s"] == pytest.approx(handlers_compute)
    assert p["wall_time_s"] > plain.prediction["wall_time_s"]
    assert sum(r["wall_time_s"] for r in p["rounds"]) == pytest.approx(p["wall_time_s"])


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

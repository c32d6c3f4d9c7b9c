"""A meter with ``group_links``: exact totals, grouped records for one-ended links, every link on
request, a valid report."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np

from fedproto.algorithms.fastlloyd.messages import MaskedUpdate
from fedproto.metering import ANY_PARTY, LinkRecord, Meter, RunReport, report_schema
from fedproto.runtime import RuntimeConfig
from fedproto.simulation import simulate
from fedproto.testing import load_file

M = 12
#: FastLloyd machines of one run, built as the lean engine's tests build them (its run's session).
_simulation = load_file(Path(__file__).with_name("test_simulation.py"), "tests_fedproto_simulation")
fastlloyd, SESSION = _simulation.fastlloyd, _simulation.SESSION


def _run(group_links: bool) -> tuple[dict, Meter, RunReport]:
    machines = fastlloyd(M)
    meter = Meter(group_links=group_links)
    results = simulate(machines, config=RuntimeConfig(session=SESSION), meter=meter)
    report = meter.report(protocol="fastlloyd", transport="memory", session=SESSION, parties=list(machines))
    return results, meter, report


def test_grouped_links_keep_every_total_and_every_result_and_expand_to_the_same_links():
    plain_results, _, plain = _run(False)
    results, meter, grouped = _run(True)
    assert meter.sent == {}  # every frame went to the groups
    for party, result in plain_results.items():
        if party != "server":
            np.testing.assert_array_equal(results[party].centroids, result.centroids)
            np.testing.assert_array_equal(results[party].history, result.history)
            np.testing.assert_array_equal(results[party].noisy_counts, result.noisy_counts)
    for name in ("payload_bytes", "setup_bytes", "messages", "algorithm_rounds", "communication_rounds"):
        assert getattr(grouped, name) == getattr(plain, name), name
    assert grouped.bytes_by_round() == plain.bytes_by_round()
    assert grouped.bytes_by_round(setup=True) == plain.bytes_by_round(setup=True)
    assert grouped.bytes_by_phase() == plain.bytes_by_phase()
    assert len(grouped.links) < len(plain.links) // 4
    # per-link detail on request: the plain meter's records exactly
    assert meter.link_records(grouped=False) == plain.links
    expanded = meter.report(
        protocol="fastlloyd", transport="memory", session=SESSION, parties=plain.parties, expand_links=True
    )
    assert expanded.links == plain.links


def test_uploads_and_broadcasts_become_one_record_each_with_their_party_count():
    _, _, report = _run(True)
    updates = [link for link in report.links if link.tag == MaskedUpdate.TAG]
    assert {(link.round_idx, link.sender, link.receiver, link.parties, link.messages) for link in updates} == {
        (0, ANY_PARTY, "server", M, M), (1, ANY_PARTY, "server", M, M)
    }
    broadcasts = [link for link in report.links if link.sender == "server" and link.receiver == ANY_PARTY]
    assert {(link.tag, link.round_idx, link.parties, link.messages) for link in broadcasts} == {
        ("fl.agg", 0, M, M), ("fl.agg", 1, M, M), ("fl.seed", 0, M - 1, M - 1)  # client 0 draws the seed
    }
    # a frame kind with one party at each end keeps both names (the key roster to client 0)
    assert any(link.receiver == "client-0" and link.parties == 1 for link in report.links)


def test_a_grouped_report_validates_and_round_trips_and_a_plain_one_has_no_party_counts():
    _, _, plain = _run(False)
    _, _, grouped = _run(True)
    schema = report_schema()
    for report in (plain, grouped):
        data = json.loads(report.to_json())
        jsonschema.validate(data, schema)
        assert RunReport.from_json(report.to_json()).links == report.links
    assert all("parties" not in link for link in json.loads(plain.to_json())["links"])
    assert any(link.get("parties") == M for link in json.loads(grouped.to_json())["links"])


def test_frames_with_no_common_end_are_kept_per_link_and_the_received_ones_are_added_once():
    meter = Meter(group_links=True)
    for s, d in (("a", "b"), ("b", "c"), ("a", "b")):
        meter.record_sent(0, "gossip", s, d, "t", 10)
    meter.record_received(0, "gossip", "a", "b", "t", 10)  # also sent: counted once
    meter.record_received(0, "gossip", "x", "b", "t", 7)  # only received
    assert meter.link_records() == (
        LinkRecord(0, "gossip", "a", "b", "t", 2, 20),
        LinkRecord(0, "gossip", "b", "c", "t", 1, 10),
    )
    assert meter.link_records(include_received=True)[-1] == LinkRecord(0, "gossip", "x", "b", "t", 1, 7)
    assert len(meter.link_records(include_received=True)) == 3


def test_merging_grouped_reports_adds_their_party_counts_and_keeps_links_of_one_party():
    reports = []
    for clients in (("c1", "c2"), ("c3", "c4", "c5")):
        meter = Meter(group_links=True)
        for c in clients:
            meter.record_sent(0, "update", c, "server", "u", 100)
        meter.record_sent(0, "note", "server", clients[0], "n", 5)
        reports.append(meter.report(protocol="p", transport="memory", session=1, parties=["server", *clients]))
    merged = RunReport.merge(reports)
    assert merged.links == (
        LinkRecord(0, "note", "server", "c1", "n", 1, 5),
        LinkRecord(0, "note", "server", "c3", "n", 1, 5),
        LinkRecord(0, "update", ANY_PARTY, "server", "u", 5, 500, parties=5),
    )


def test_link_records_leave_the_meters_counters_as_they_were():
    # a link counted both in ``sent`` (as a sharded run's merge adds other ranks' counts) and in
    # the groups: each call of link_records adds the two, and neither call changes the meter
    meter = Meter(group_links=True)
    meter.record_sent(1, "round", "client-0", "server", "fl.update", 100)
    meter.sent[(1, "round", "client-0", "server", "fl.update")] = (2, 200)
    first = meter.link_records()
    assert meter.link_records() == first
    assert [(r.messages, r.payload_bytes) for r in first] == [(3, 300)]
    assert meter.sent == {(1, "round", "client-0", "server", "fl.update"): (2, 200)}


def test_a_meters_counters_are_left_out_of_the_cyclic_collectors_walks():
    # every counter and key is a tuple of ints and strings: untracked once the collector has seen
    # it, so a long run's counters never lengthen a full collection
    import gc

    meter = Meter()
    for r in range(50):
        meter.record_sent(r, "round", "client-0", "server", "fl.update", 100)
        meter.record_sent(r, "round", "client-0", "server", "fl.update", 100)
        meter.record_received(r, "round", "server", "client-0", "fl.agg", 80)
    gc.collect()
    for table in (meter.sent, meter.received):
        assert len(table) == 50
        assert not any(gc.is_tracked(key) or gc.is_tracked(counter) for key, counter in table.items())
    assert meter.sent[(7, "round", "client-0", "server", "fl.update")] == (2, 200)

"""Metering counters, the run report's views, JSON round trip, merge, rendering and plots."""

from __future__ import annotations

import io

import numpy as np
from rich.console import Console

from fedproto.metering import Meter, RunReport
from fedproto.report import plot_report, render_report
from fedproto.testing.harness import Harness
from fedproto.testing.toy import SumCoordinator, SumWorker


def toy_report():
    workers = ["w0", "w1"]
    machines = {"c": SumCoordinator("c", workers=workers, rounds=2, dim=3)}
    machines.update({w: SumWorker(w, coordinator="c", values=np.ones(3)) for w in workers})
    harness = Harness(machines)
    harness.run()
    return harness.meter.report(protocol="toy", transport="harness", session=0, parties=list(machines))


def test_totals_and_views_agree():
    report = toy_report()
    assert report.messages == sum(link.messages for link in report.links) == 2 * 4 + 2
    assert report.payload_bytes == sum(report.bytes_by_link().values()) == sum(report.bytes_by_round().values())
    roles = report.bytes_by_role(lambda p: "coordinator" if p == "c" else "worker")
    assert roles["coordinator"]["sent_bytes"] + roles["worker"]["sent_bytes"] == report.payload_bytes
    assert roles["worker"]["parties"] == 2
    assert report.algorithm_rounds == 3 and report.communication_rounds == 5
    assert set(report.bytes_by_phase()) == {"query", "answer", "finish"}


def test_setup_phases_are_counted_apart():
    meter = Meter()
    meter.record_sent(0, "setup.keys", "a", "b", "t", 10)
    meter.record_sent(0, "update", "a", "b", "t", 30)
    meter.record_sent(1, "update", "a", "b", "t", 30)
    report = meter.report(protocol="p", transport="t", session=1, parties=["a", "b"])
    assert report.setup_bytes == 10 and report.payload_bytes == 70
    assert report.algorithm_rounds == 2 and report.communication_rounds == 3
    assert report.bytes_by_round() == {0: 30, 1: 30}


def test_json_round_trip_and_merge():
    report = toy_report()
    again = RunReport.from_json(report.to_json())
    assert again == report
    halves = []
    for keep in ({"c"}, {"w0", "w1"}):
        meter = Meter()
        for link in report.links:
            if link.sender in keep:
                for _ in range(link.messages):
                    meter.record_sent(link.round_idx, link.phase, link.sender, link.receiver, link.tag,
                                      link.payload_bytes // link.messages)
        halves.append(meter.report(protocol="toy", transport="harness", session=0, parties=report.parties))
    merged = RunReport.merge(halves)
    assert merged.links == report.links and merged.payload_bytes == report.payload_bytes


def test_connection_bytes_stay_apart_from_payload_and_merge_by_sum():
    reports = []
    for party, handshake, tls in (("a", 2900, 44), ("s", 2950, 22)):
        meter = Meter()
        meter.record_sent(0, "update", party, "a" if party == "s" else "s", "t", 100)
        meter.record_connection_bytes(handshake_bytes=handshake, tls_overhead_bytes=tls)
        reports.append(meter.report(protocol="p", transport="tcp", session=0, parties=["a", "s"]))
    assert (reports[0].handshake_bytes, reports[0].tls_overhead_bytes, reports[0].payload_bytes) == (2900, 44, 100)
    merged = RunReport.merge(reports)
    assert (merged.handshake_bytes, merged.tls_overhead_bytes, merged.payload_bytes) == (5850, 66, 200)
    assert RunReport.from_json(merged.to_json()) == merged
    old = merged.to_dict()
    del old["handshake_bytes"], old["tls_overhead_bytes"]  # a report written before these fields
    assert RunReport.from_dict(old).tls_overhead_bytes == 0


def test_refused_bytes_stay_apart_from_handshakes_and_show_only_when_some_were_written():
    reports = []
    for party, refused in (("a", 0), ("s", 1234)):
        meter = Meter()
        meter.record_sent(0, "update", party, "a" if party == "s" else "s", "t", 100)
        meter.record_connection_bytes(handshake_bytes=2900, refused_bytes=refused)
        reports.append(meter.report(protocol="p", transport="tcp", session=0, parties=["a", "s"]))
    assert (reports[1].handshake_bytes, reports[1].refused_bytes) == (2900, 1234)
    merged = RunReport.merge(reports)
    assert (merged.handshake_bytes, merged.refused_bytes) == (5800, 1234)
    assert RunReport.from_json(merged.to_json()) == merged
    shown = {}
    for name, report in (("clean", reports[0]), ("attacked", merged)):
        out = io.StringIO()
        render_report(Console(file=out, width=120), report, lambda p: p[0])
        shown[name] = out.getvalue()
    assert "refused" not in shown["clean"]
    assert "bytes to refused connections" in shown["attacked"] and "1,234" in shown["attacked"]


def test_received_frames_fill_in_for_a_single_process():
    meter = Meter()
    meter.record_sent(0, "update", "a", "s", "t", 5)
    meter.record_received(0, "aggregate", "s", "a", "t", 7)
    alone = meter.report(protocol="p", transport="t", session=0, parties=["a", "s"], include_received=True)
    assert alone.payload_bytes == 12
    assert meter.report(protocol="p", transport="t", session=0, parties=["a", "s"]).payload_bytes == 5


def test_render_and_plot(tmp_path):
    report = toy_report()
    out = io.StringIO()
    render_report(Console(file=out, width=120), report, lambda p: p[0], phases=("query", "answer", "finish"))
    text = out.getvalue()
    assert "Bytes per round" in text and "Bytes per link" in text and f"{report.payload_bytes:,}" in text
    path = plot_report(report, tmp_path / "r.png", extra=lambda ax: ax.plot([0, 1], [0, 1]))
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"

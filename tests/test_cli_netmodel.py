"""``fedproto run --engine lean --network ... --compute ...``: the link model from the command line.

* FastLloyd on s1 over the WAN preset writes the prediction into the report and draws the timeline;
  fixed compute gives equal predictions; WAN minus LAN is the critical path's latency hops times
  the latency difference;
* every protocol family gives the same results, links and bytes with the model as without;
* bad options are one usage-error line.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from fedproto.metering import report_schema
from fedproto.netmodel import LinkModel

#: Small runs of every protocol family (as in tests/test_report_schema.py), FastLloyd with secure
#: aggregation's "plus" variant too (its setup sends frames between clients: the star's two hops).
FAMILIES: dict[str, list[str]] = {
    "fastlloyd": ["fastlloyd", "--data", "iris", "--clients", "2", "--epsilon", "1"],
    "fastlloyd-secagg-plus": ["fastlloyd", "--data", "iris", "--clients", "3", "--epsilon", "1", "--secagg", "plus"],
    "mufc": ["mufc", "--data", "iris", "--clients", "3", "--removals", "1", "--points-per-removal", "1", "--leave", "1",
             "--no-timing", "--no-baselines", "--n-init", "1"],
    "qkmeans": ["qkmeans", "--data", "iris", "--clients", "2", "--removals", "10", "--no-timing"],
    "dckmeans": ["dckmeans", "--data", "iris", "--removals", "10", "--no-timing"],
    "kzcenter": ["kzcenter", "--data", "iris", "--clients", "3", "--k", "3", "--z", "5", "--slack", "0.5"],
    "kzmedian": ["kzmedian", "--data", "iris", "--clients", "2", "--k", "3", "--inject-outliers", "5"],
    "kzmeans": ["kzmeans", "--data", "iris", "--clients", "2", "--k", "3", "--inject-outliers", "5"],
}

#: Report fields that differ between any two runs (clocks, and the command line itself).
RUN_SPECIFIC = {"wall_time_s", "round_wall_s", "compile_s", "started_at", "finished_at", "command", "options", "prediction"}


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    from fedproto.cli import main

    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def s1_data():
    """s1 from the FEDPROTO_DATA mirror (tests/conftest.py)."""
    from fedproto.data import find_data_file

    assert find_data_file("s1") is not None, "s1 is not in FEDPROTO_DATA"


def _s1(tmp_path: Path, capsys, name: str, *extra: str) -> dict:
    path = tmp_path / f"{name}.json"
    code, out, err = _run(
        ["run", "fastlloyd", "--data", "s1", "--seed", "1", "--engine", "lean", "--quiet", "--report", str(path), *extra],
        capsys,
    )
    assert code == 0, err
    return {"doc": json.loads(path.read_text()), "out": out, "path": path}


def test_fastlloyd_on_s1_over_the_wan_predicts_its_time_and_draws_the_timeline(tmp_path, capsys, s1_data, monkeypatch):
    # the console wraps at 80 columns without a terminal; a wider one keeps the timeline's path on
    # one line however long tmp_path is (pytest-xdist adds a folder per worker)
    monkeypatch.setenv("COLUMNS", "200")
    run = _s1(tmp_path, capsys, "wan", "--network", "wan")
    doc, out = run["doc"], run["out"]
    jsonschema.validate(doc, report_schema())
    p = doc["prediction"]
    assert p["wall_time_s"] > 0 and 0 < p["network_share"] <= 1 and p["latency_hops"] > 0
    assert p["network_s"] + p["compute_s"] + p["timeout_wait_s"] == pytest.approx(p["wall_time_s"])
    assert len(p["rounds"]) == doc["algorithm_rounds"] and all(r["critical_party"] for r in p["rounds"])
    assert {(x["round_idx"], x["phase"]) for x in p["phases"]} == {(l["round_idx"], l["phase"]) for l in doc["links"]}
    assert "server" in p["timeline"]
    # the resolved link parameters are among the options
    assert doc["options"]["network_model"]["default"] == {"latency_s": 0.025, "bandwidth_bytes_per_s": 125e6}
    assert doc["options"]["network"] == "wan" and doc["options"]["compute"] is None
    assert "Predicted time (link model)" in out
    timeline = run["path"].with_suffix(".timeline.png")
    assert timeline.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "timeline written to" in out and timeline.name in out


def test_fixed_compute_repeats_and_wan_minus_lan_is_latency_hops_times_the_latency_difference(tmp_path, capsys, s1_data):
    fixed = ("--compute", "fixed:0.001", "--no-plot")
    first = _s1(tmp_path, capsys, "wan-1", "--network", "wan", *fixed)["doc"]["prediction"]
    second = _s1(tmp_path, capsys, "wan-2", "--network", "wan", *fixed)["doc"]["prediction"]
    assert first == second
    lan = _s1(tmp_path, capsys, "lan", "--network", "lan", *fixed)["doc"]["prediction"]
    # lan and wan differ only in latency (same bandwidth, same fixed compute)
    difference = LinkModel.preset("wan").default.latency_s - LinkModel.preset("lan").default.latency_s
    assert first["latency_hops"] == lan["latency_hops"]
    expected = first["latency_hops"] * difference
    assert first["wall_time_s"] - lan["wall_time_s"] == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_model_changes_no_result_link_or_byte(family, tmp_path, capsys):
    docs = {}
    for network in ("none", "wan"):
        path = tmp_path / f"{network}.json"
        extra = [] if network == "none" else ["--network", "wan", "--compute", "fixed:0.001"]
        argv = ["run", *FAMILIES[family], "--seed", "2", "--engine", "lean", "--quiet", "--no-plot", "--report", str(path)]
        code, _, err = _run(argv + extra, capsys)
        assert code == 0, err
        docs[network] = json.loads(path.read_text())
    plain, linked = docs["none"], docs["wan"]
    assert "prediction" not in plain and "network_model" not in plain["options"]
    assert linked["prediction"]["wall_time_s"] > 0
    for field in set(plain) | set(linked):
        if field not in RUN_SPECIFIC:
            assert plain.get(field) == linked.get(field), f"{family}: {field} differs with the model"


@pytest.mark.parametrize("transport", ["memory", "tcp"])
def test_a_run_traced_where_its_parties_ran_is_predicted_from_that_trace(transport, tmp_path, capsys):
    # the parties' runtime notes every handler (over TCP each party process its own, merged)
    traced = tmp_path / "traced.json"
    argv = ["run", "fastlloyd", "--data", "iris", "--clients", "3", "--epsilon", "1", "--seed", "3"]
    code, _, err = _run([*argv, "--transport", transport, "--compute-trace", "--quiet", "--no-plot",
                         "--report", str(traced)], capsys)
    assert code == 0, err
    doc = json.loads(traced.read_text())
    jsonschema.validate(doc, report_schema())
    assert sorted(doc["compute_trace"]) == sorted(doc["parties"])
    assert all(h[0][1] == "start" for h in doc["compute_trace"].values())
    # the lean engine replays the same run with each handler charged its traced CPU seconds
    predicted = tmp_path / "predicted.json"
    code, out, err = _run([*argv, "--engine", "lean", "--network", "wan", "--compute", f"trace:{traced}", "--quiet",
                           "--no-plot", "--report", str(predicted)], capsys)
    assert code == 0, err
    lean = json.loads(predicted.read_text())
    jsonschema.validate(lean, report_schema())
    p = lean["prediction"]
    assert p["untraced_handlers"] == p["unused_trace_figures"] == 0
    assert "handlers not in the trace" not in out
    assert lean["options"]["compute"] == f"trace:{traced}" and "compute_trace" not in lean
    traced_s = sum(s for h in doc["compute_trace"].values() for _, _, s in h)
    assert 0 < p["compute_s"] <= traced_s + 1e-9  # the critical path's share of the traced compute
    assert lean["links"] == doc["links"]  # the same frames either way
    if transport == "memory":
        # a trace of another run (one client fewer): what it lacks and what it has to spare, said
        code, out, err = _run(["run", "fastlloyd", "--data", "iris", "--clients", "2", "--epsilon", "1", "--seed", "3",
                               "--engine", "lean", "--network", "wan", "--compute", f"trace:{traced}", "--no-plot",
                               "--report", str(predicted)], capsys)
        assert code == 0, err
        other = json.loads(predicted.read_text())["prediction"]
        assert other["unused_trace_figures"] > 0
        assert "trace figures unused" in out and "handlers not in the trace" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--network", "wan"], "argument --network: the link model runs on --engine lean only"),
        (["--engine", "lean", "--network", "moon"], "argument --network: 'moon' is neither a preset"),
        (["--engine", "lean", "--compute", "fixed:0.1"], "argument --compute: applies with --network"),
        (["--engine", "lean", "--network", "lan", "--compute", "fixed:-1"], "argument --compute: compute seconds must be"),
        (["--engine", "lean", "--network", "{tmp}/neg.json"], "default.latency_s: must be >= 0"),
        (["--engine", "lean", "--network", "{tmp}/bw.toml"], "links.server->client-0.bandwidth_bytes_per_s: must be > 0"),
        (["--engine", "lean", "--network", "{tmp}/broken.json"], "not valid JSON"),
        (["--engine", "lean", "--network", "lan", "--compute", "trace:{tmp}/none.json"],
         "argument --compute: cannot read the compute trace"),
        (["--engine", "lean", "--network", "lan", "--compute", "trace:{tmp}/neg.json"],
         "the report has no compute_trace (run the parties with --compute-trace)"),
        (["--engine", "lean", "--compute-trace"], "argument --compute-trace: the lean engine runs no party's runtime"),
    ],
)
def test_bad_network_options_are_one_usage_error_line(extra, message, tmp_path, capsys):
    (tmp_path / "neg.json").write_text('{"default": {"latency_s": -1}}')
    (tmp_path / "bw.toml").write_text('[links."server->client-0"]\nbandwidth_bytes_per_s = 0\n')
    (tmp_path / "broken.json").write_text('{"default": ')
    extra = [e.replace("{tmp}", str(tmp_path)) for e in extra]
    code, _, err = _run(["run", "fastlloyd", "--data", "iris", "--clients", "2", *extra], capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], err

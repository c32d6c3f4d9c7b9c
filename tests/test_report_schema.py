"""The run report's JSON Schema (fedproto/report.schema.json) and every protocol's report against it.

* the schema is a valid draft 2020-12 schema, ships as package data and rejects what issue 9
  forbids (keys that are not snake_case identifiers, numbers formatted as strings);
* :class:`RunReport`'s new fields (schema version, fedproto version, options, command,
  timestamps, paper figures) survive JSON, old reports still load, merging keeps them;
* every installed protocol run through ``fedproto.cli.main(... --report PATH)`` on tiny arguments
  writes a report that validates, holds the seed among its options, the command line, parseable
  UTC timestamps, and snake_case result keys with numbers as numbers.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import re
from pathlib import Path

import jsonschema
import pytest

from fedproto.metering import REPORT_SCHEMA_VERSION, LinkRecord, Meter, RunReport, report_schema

KEY = re.compile(r"[a-z][a-z0-9_]*")
SEED = 7

#: protocol -> tiny arguments (memory transport, iris, a few seconds each); canonical option names.
PROTOCOL_ARGS: dict[str, list[str]] = {
    "fastlloyd": ["--data", "iris", "--clients", "2", "--epsilon", "1"],
    "kzcenter": ["--data", "iris", "--clients", "3", "--k", "3", "--z", "5", "--slack", "0.5",
                 "--compare", "charikar,mkcwm"],
    "kzmedian": ["--data", "iris", "--clients", "2", "--k", "3", "--inject-outliers", "5", "--compare", "kmeans--"],
    "kzmeans": ["--data", "iris", "--clients", "2", "--k", "3", "--inject-outliers", "5", "--compare", "kmeans"],
    "qkmeans": ["--data", "iris", "--clients", "2", "--removals", "10", "--no-timing"],
    "dckmeans": ["--data", "iris", "--removals", "10", "--no-timing"],
    "mufc": ["--data", "iris", "--clients", "3", "--removals", "3", "--points-per-removal", "2", "--leave", "1",
             "--no-timing", "--no-baselines", "--n-init", "2"],
}


def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(report_schema())


def _errors(doc: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in _validator().iter_errors(doc)]


def _strict_json(text: str) -> dict:
    """Parse as RFC 8259 JSON: NaN and Infinity, which json.dumps writes by default, are refused."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not valid JSON")

    return json.loads(text, parse_constant=refuse)


def _small_report(**changes) -> RunReport:
    meter = Meter()
    meter.record_sent(0, "setup.keys", "server", "client-0", "PublicKey", 40)
    meter.record_sent(1, "update", "client-0", "server", "MaskedUpdate", 120)
    report = meter.report(
        protocol="toy", transport="memory", session=3, parties=["server", "client-0"],
        results={"n_points": 10, "nicv": 0.25, "data_set": "iris", "centroids": [[0.0, 1.0], [2.0, 3.0]],
                 "clients_agree": True, "epsilon_spent": None, "by_phase": {"update_bytes": 120}},
    )
    return dataclasses.replace(report, **changes)


# --- the schema itself -------------------------------------------------------------------------------


def test_the_schema_is_valid_draft_2020_12_and_ships_with_the_package():
    schema = report_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["schema_version"]["const"] == REPORT_SCHEMA_VERSION
    # every field of the report, and nothing else, is described; all but the optional ones required
    fields = {f.name for f in dataclasses.fields(RunReport)}
    assert set(schema["properties"]) == fields
    assert set(schema["required"]) == fields - {"faults", "error", "privacy", "prediction", "ranks", "compute_trace"}
    link_fields = {f.name for f in dataclasses.fields(LinkRecord)}
    assert set(schema["$defs"]["link"]["properties"]) == link_fields
    assert set(schema["$defs"]["link"]["required"]) == link_fields - {"parties"}
    import importlib.resources

    assert importlib.resources.files("fedproto").joinpath("report.schema.json").is_file()
    report_schema()["title"] = "changed"
    assert report_schema()["title"] != "changed"  # each call returns a fresh copy


def test_a_report_with_the_new_fields_validates_and_round_trips():
    started = RunReport.timestamp(datetime.datetime(2024, 5, 1, 12, 0, 0, 500, tzinfo=datetime.timezone.utc))
    report = _small_report(
        options={"seed": 3, "clients": 1, "radius_bounds": [0.5, 2.0], "report": None, "quiet": True},
        command=("run", "toy", "--seed", "3"),
        started_at=started,
        finished_at=RunReport.timestamp(),
        paper={"nicv": 0.3, "loss_ratio_mean": 1.02},
    )
    text = report.to_json()
    doc = _strict_json(text)
    assert _errors(doc) == []
    assert doc["schema_version"] == REPORT_SCHEMA_VERSION and doc["command"] == ["run", "toy", "--seed", "3"]
    assert doc["fedproto_version"] and doc["started_at"] == "2024-05-01T12:00:00.000500+00:00"
    assert RunReport.from_json(text) == report


def test_an_old_report_without_the_new_fields_still_loads():
    doc = _small_report().to_dict()
    for name in ("schema_version", "fedproto_version", "options", "command", "started_at", "finished_at", "paper"):
        del doc[name]
    report = RunReport.from_dict(doc)
    assert report.schema_version == REPORT_SCHEMA_VERSION and report.options == {} and report.command == ()
    assert report.started_at is None and report.paper == {}
    with pytest.raises(ValueError, match="schema_version 99"):
        RunReport.from_dict({**_small_report().to_dict(), "schema_version": 99})


def test_a_version_1_report_loads_as_a_completed_run():
    doc = _small_report().to_dict()
    for name in ("status", "refused_bytes"):
        del doc[name]
    doc["schema_version"] = 1
    report = RunReport.from_dict(doc)
    assert report.status == "completed" and report.error is None and report.refused_bytes == 0
    assert report.schema_version == REPORT_SCHEMA_VERSION and _errors(report.to_dict()) == []


def test_a_failed_report_needs_its_error_and_a_completed_one_has_none():
    error = {"type": "RunAborted", "message": "client-1 stopped answering", "party": "server",
             "culprits": ["client-1"], "round_idx": 2, "phase": "update", "signal": None}
    failed = _small_report(status="failed", error=error)
    assert _errors(failed.to_dict()) == [] and RunReport.from_json(failed.to_json()) == failed
    doc = failed.to_dict()
    del doc["error"]
    assert _errors(doc), "a failed report without its error validated"
    with pytest.raises(ValueError, match="failed run's report has no error"):
        _small_report(status="failed")
    with pytest.raises(ValueError, match="completed run's report has an error"):
        _small_report(error=error)
    with pytest.raises(ValueError, match="status must be one of"):
        _small_report(status="crashed", error=error)
    merged = RunReport.merge([_small_report(), failed, _small_report(status="interrupted", error={**error, "signal": "SIGTERM"})])
    assert merged.status == "failed" and merged.error == error


def _ledger(mechanism: str = "gaussian") -> dict:
    from fedproto.algorithms import dp

    releases = [dp.Release(t, name, shape, mechanism, sensitivity, 4.0)
                for t in range(2) for name, shape, sensitivity in (("sums", (3, 2), 1.5), ("counts", (3,), 1.0))]
    return dp.privacy_ledger(releases, 1e-5 if mechanism == "gaussian" else None)


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_a_report_with_a_privacy_ledger_validates_round_trips_and_merges(mechanism):
    report = _small_report(privacy=_ledger(mechanism))
    doc = _strict_json(report.to_json())
    assert _errors(doc) == [] and doc["privacy"] == report.privacy
    assert RunReport.from_json(report.to_json()) == report
    assert "privacy" not in _small_report().to_dict()  # a run without noise has no ledger
    assert RunReport.merge([_small_report(), report]).privacy == report.privacy


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda p: p.pop("accountant"), "a ledger without its accountant"),
        (lambda p: p.pop("gdp_mu"), "a GDP ledger without its mu"),
        (lambda p: p.update(accountant="rdp"), "an accountant the layout does not know"),
        (lambda p: p.update(epsilon="1.0"), "a number as text"),
        (lambda p: p.update(delta=1.0), "a delta of 1"),
        (lambda p: p.update(extra=1), "an undescribed key"),
        (lambda p: p["releases"][0].pop("noise_scale"), "a release without its noise scale"),
        (lambda p: p["releases"][0].update(noise_scale=0.0), "a release without noise"),
        (lambda p: p["releases"][0].update(sensitivity_norm="linf"), "a norm no mechanism uses"),
        (lambda p: p["releases"][0].update(name="Sums"), "a release name that is not snake_case"),
        (lambda p: p["per_round"][0].pop("delta"), "a round without its delta"),
    ],
)
def test_the_schema_rejects_a_malformed_ledger(change, why):
    doc = _small_report(privacy=_ledger()).to_dict()
    change(doc["privacy"])
    assert _errors(doc), f"the schema accepted {why}"


@pytest.mark.parametrize(
    ("path", "value", "why"),
    [
        (("results", "N"), 150, "not snake_case"),
        (("results", "NICV (fastlloyd)"), 0.5, "not an identifier"),
        (("results", "loss_ratio"), "1.25 ± 0.01 / 1.02 ± 0.0", "a number formatted as a string"),
        (("results", "by_phase", "Update Bytes"), 1, "a nested key that is not snake_case"),
        (("results", "centroids"), [[0.0, "x"]], "a non-number inside an array"),
        (("results", "labels"), ["a", 1], "an array mixing names and numbers"),
        (("results", "dropouts"), [{"party": "client-1"}], "an array of objects"),
        (("results", "parties"), ["line one\nline two"], "a multi-line name in an array"),
        (("results", "note"), "line one\nline two", "a multi-line string"),
        (("paper", "Loss ratio"), 1.0, "a paper key that is not snake_case"),
        (("options", "Seed"), 0, "an option key that is not snake_case"),
        (("started_at",), "yesterday", "a timestamp that is not ISO-8601 UTC"),
        (("started_at",), "2024-05-01T12:00:00+02:00", "a timestamp not in UTC"),
        (("schema_version",), 1, "another layout version"),
        (("status",), "finished", "a status that is not one of the three"),
        (("error",), {"type": "X", "message": "m", "party": None, "culprits": [], "round_idx": None,
                      "phase": None, "signal": None}, "an error in a completed run's report"),
        (("payload_bytes",), -1, "negative bytes"),
        (("unknown_field",), 1, "a field the report does not have"),
    ],
)
def test_the_schema_rejects(path, value, why):
    doc = _small_report(started_at=RunReport.timestamp()).to_dict()
    assert _errors(doc) == []
    target = doc
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    assert _errors(doc), f"the schema accepted {why}"


def test_merge_keeps_the_first_options_and_the_widest_time_span():
    first = _small_report(options={"seed": 1}, command=("run", "toy"), paper={"nicv": 0.3},
                          started_at="2024-05-01T12:00:02+00:00", finished_at="2024-05-01T12:00:09+00:00")
    second = _small_report(options={"seed": 2}, command=("party", "toy"),
                           started_at="2024-05-01T12:00:01.500000+00:00", finished_at="2024-05-01T12:00:10+00:00")
    third = _small_report(started_at=None, finished_at=None)
    merged = RunReport.merge([first, second, third], transport="tcp")
    assert merged.options == {"seed": 1} and merged.command == ("run", "toy") and merged.paper == {"nicv": 0.3}
    assert merged.started_at == "2024-05-01T12:00:01.500000+00:00"
    assert merged.finished_at == "2024-05-01T12:00:10+00:00"
    assert merged.payload_bytes == 3 * first.payload_bytes and merged.transport == "tcp"
    assert _errors(_strict_json(merged.to_json())) == []


# --- every protocol's report ---------------------------------------------------------------------------


def _leaves(value, path=()):
    """``(path, leaf)`` for every non-container value of a results tree (arrays count as leaves)."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _leaves(child, (*path, key))
    else:
        yield path, value


def _is_number_text(text: str) -> bool:
    try:
        float(text.split()[0])
    except (ValueError, IndexError):
        return False
    return True


@pytest.mark.parametrize("protocol", sorted(PROTOCOL_ARGS))
def test_every_protocol_writes_a_report_that_validates(protocol, tmp_path, capsys):
    from fedproto.cli import main

    path = tmp_path / f"{protocol}.json"
    argv = ["run", protocol, *PROTOCOL_ARGS[protocol], "--seed", str(SEED), "--quiet", "--report", str(path)]
    before = datetime.datetime.now(datetime.timezone.utc)
    code = main(argv)
    after = datetime.datetime.now(datetime.timezone.utc)
    err = capsys.readouterr().err
    assert code == 0, err

    doc = _strict_json(Path(path).read_text())
    assert _errors(doc) == [], f"{protocol}: the report does not fit the schema"
    # only a protocol that adds noise keeps a privacy ledger (of the installed ones, FastLloyd)
    assert ("privacy" in doc) == (protocol == "fastlloyd"), f"{protocol}: privacy ledger"
    assert doc["protocol"] == protocol and doc["transport"] == "memory"
    assert doc["schema_version"] == REPORT_SCHEMA_VERSION
    # the options of the run, seed included, and the command line that started it
    assert doc["options"]["seed"] == SEED
    assert doc["options"].get("transport", "memory") == "memory"
    assert doc["command"][-len(argv):] == argv
    # timestamps: ISO-8601 UTC, in order, within the call
    started = datetime.datetime.fromisoformat(doc["started_at"])
    finished = datetime.datetime.fromisoformat(doc["finished_at"])
    assert started.utcoffset() == finished.utcoffset() == datetime.timedelta(0)
    slack = datetime.timedelta(seconds=1)  # clock granularity
    assert before - slack <= started <= finished <= after + slack
    # results: snake_case keys all the way down, numbers as numbers
    results = doc["results"]
    assert results, f"{protocol}: empty results"
    for path_, leaf in _leaves(results):
        assert all(KEY.fullmatch(part) for part in path_), f"{protocol}: result key {'/'.join(path_)}"
        if isinstance(leaf, str):
            assert not _is_number_text(leaf), f"{protocol}: {'/'.join(path_)} = {leaf!r} is a number as text"
        if isinstance(leaf, float):
            assert math.isfinite(leaf)
    for key in ("n_points", "d", "k"):
        if key in results:
            assert isinstance(results[key], int) and results[key] > 0
    assert results.get("data_set", "iris").startswith("iris")  # (k,z) names injected outliers: "iris+5"
    for path_, _ in _leaves(doc["paper"]):
        assert all(KEY.fullmatch(part) for part in path_), f"{protocol}: paper key {'/'.join(path_)}"
    # the report loads back into a RunReport
    report = RunReport.from_dict(doc)
    assert report.options["seed"] == SEED and report.payload_bytes > 0

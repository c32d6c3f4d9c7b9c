"""``fedproto run --dropout PARTY@STAGE[:ROUND]`` and ``--dropout-rate R`` (memory transport).

* a run with dropouts completes with the survivors' result, and its report records who was told
  to drop out, where, and whether it did (``faults``, valid against the schema); a run without
  none has no ``faults`` entry;
* the rate draw is a pure function of ``--seed``: the same seed gives the same dropouts, a higher
  rate keeps every dropout of a lower one, stages and rounds come from the plan, the number of
  dropouts is binomial;
* every mistake is one usage-error line (exit 2): bad syntax, a party outside the roster, the
  coordinating party, an unknown stage, a rate outside [0, 1), TCP or MPI, a party given twice,
  a protocol that declares no dropout stage (its own reason shown);
* the report's ``faults`` field round-trips through JSON and merging.

The protocol is a file plugin: the toy federated sum of :mod:`fedproto.testing` with a
coordinator that carries on without a worker reported dropped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import jsonschema
import pytest

from fedproto.metering import Meter, RunReport, report_schema
from fedproto.plugin import RunPlan
from fedproto.testing import load_file

helpers = load_file(Path(__file__).with_name("_helpers.py"), "tests_helpers")

#: A protocol without data whose coordinator survives dropouts at the workers' "answer" phase
#: (``--strict`` plans declare none). Worker i contributes (i + 1) * (round_idx + 1) per coordinate.
DROPSUM_PLUGIN = '''
import numpy as np

from fedproto.messages import PartyDropped
from fedproto.testing.toy import SumCoordinator, SumPlugin


class Tolerant(SumCoordinator):
    def _on_event(self, event):
        if isinstance(event, PartyDropped):
            if event.party in self._active:
                self._active.remove(event.party)
                self._received.pop(event.party, None)
            return []
        return super()._on_event(event)


class DropSum(SumPlugin):
    name = "dropsum"
    description = "federated sum that carries on without workers that drop out"
    rounds = 3
    rounds_help = "rounds of summing"
    dim = 2
    session = 99

    def add_options(self, group):
        group.add_argument("--strict", action="store_true", help="declare no dropout stage")

    def coordinator(self, args, workers):
        return Tolerant("coordinator", workers=workers, rounds=args.rounds, dim=self.dim)

    def result_to_json(self, party, result):
        return {"sums": np.asarray(result).tolist()} if party == "coordinator" else {"rounds": int(result)}

    def summarize(self, args, workers, results):
        return {"final_sum": results["coordinator"]["sums"][-1][0],
                "n_survivors": sum(w in results for w in workers)}

    def plan_fields(self, args):
        return {
            "phases": ("query", "answer", "finish"),
            "dropout_stages": () if args.strict else ("answer",),
            "dropout_unsupported": "dropsum supports dropout only without --strict" if args.strict else "",
        }


PROTOCOL = DropSum()
'''


@pytest.fixture(scope="module")
def dropsum(tmp_path_factory) -> Path:
    return helpers.module_file(tmp_path_factory, "plugin", "dropsum.py", DROPSUM_PLUGIN)


@pytest.fixture(autouse=True)
def _keep_sys_path(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # loading a file puts its folder on the path


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    from fedproto.cli import main

    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _report(path: Path) -> dict:
    doc = json.loads(path.read_text())
    jsonschema.validate(doc, report_schema())
    return doc


# --- runs ----------------------------------------------------------------------------------------------


def test_explicit_dropouts_run_to_the_survivors_result_and_are_reported(dropsum, tmp_path, capsys):
    out = tmp_path / "run.json"
    argv = ["run", str(dropsum), "--clients", "4", "--rounds", "3", "--quiet", "--no-plot", "--report", str(out),
            "--dropout", "worker-1@answer:1", "--dropout", "worker-3@answer", "--dropout", "worker-0@answer:7"]
    code, stdout, err = _run(argv, capsys)
    assert code == 0, err
    doc = _report(out)
    assert doc["faults"] == {"dropouts": [
        {"party": "worker-0", "stage": "answer", "round_idx": 7, "crashed": False},  # round 7 never comes
        {"party": "worker-1", "stage": "answer", "round_idx": 1, "crashed": True},
        {"party": "worker-3", "stage": "answer", "round_idx": None, "crashed": True},
    ]}
    # the last round (round_idx 2) sums workers 0 and 2 only: (1 + 3) * 3
    assert doc["results"] == {"final_sum": 12.0, "n_survivors": 2}
    assert doc["options"]["dropout"] == ["worker-1@answer:1", "worker-3@answer", "worker-0@answer:7"]
    # the dropped workers sent nothing from their stage on: worker-3 no answer at all, worker-1 one
    answers = {}
    for link in doc["links"]:
        if link["phase"] == "answer":
            answers[link["sender"]] = answers.get(link["sender"], 0) + link["messages"]
    assert answers == {"worker-0": 3, "worker-1": 1, "worker-2": 3}
    assert "Dropouts injected" in stdout and "not reached" in stdout
    assert RunReport.from_json(out.read_text()).faults == doc["faults"]


def test_a_run_without_dropouts_has_no_faults_entry(dropsum, tmp_path, capsys):
    out = tmp_path / "plain.json"
    argv = ["run", str(dropsum), "--clients", "2", "--quiet", "--no-plot", "--report", str(out)]
    code, stdout, err = _run(argv, capsys)
    assert code == 0, err
    doc = _report(out)
    assert "faults" not in doc and doc["results"]["n_survivors"] == 2
    assert doc["options"]["dropout"] is None and doc["options"]["dropout_rate"] is None
    assert "Dropouts injected" not in stdout


def test_a_dropout_rate_run_is_the_same_for_the_same_seed(dropsum, tmp_path, capsys):
    docs = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.json"
        argv = ["run", str(dropsum), "--clients", "8", "--rounds", "2", "--quiet", "--no-plot", "--report", str(out),
                "--dropout-rate", "0.5", "--seed", "11"]
        code, _, err = _run(argv, capsys)
        assert code == 0, err
        docs.append(_report(out))
    assert docs[0]["faults"] == docs[1]["faults"] and docs[0]["results"] == docs[1]["results"]
    dropouts = docs[0]["faults"]["dropouts"]
    assert dropouts, "seed 11 at rate 0.5 drops somebody out of 8"
    assert docs[0]["results"]["n_survivors"] == 8 - sum(d["crashed"] for d in dropouts)
    assert docs[0]["links"] == docs[1]["links"]


# --- the draw ------------------------------------------------------------------------------------------


def _plan(n_clients: int, *, iterations: int = 5, stages=("b", "c")) -> RunPlan:
    return RunPlan(
        roster=("server", *(f"client-{i}" for i in range(n_clients))), session=1, make_machine=lambda p: None,
        result_to_json=lambda p, r: {}, summarize=lambda r: {}, role_of=lambda p: p, iterations=iterations,
        phases=("a", "b", "c", "d"), dropout_stages=stages,
    )


def _draw(plan: RunPlan, rate: float, seed: int, dropout=None):
    from fedproto.cli import _dropouts

    args = argparse.Namespace(dropout=dropout, dropout_rate=rate, seed=seed, protocol="p", protocol_name="p")
    return _dropouts(plan, args)


def test_the_rate_draw_is_a_function_of_the_seed_and_nested_across_rates():
    plan = _plan(400)
    low, high = _draw(plan, 0.2, seed=5), _draw(plan, 0.6, seed=5)
    assert low == _draw(plan, 0.2, seed=5)
    assert low != _draw(plan, 0.2, seed=6)
    assert set(low) <= set(high)  # the same parties, stages and rounds: a higher rate only adds
    assert _draw(plan, 0.0, seed=5) == []
    for dropouts, rate in ((low, 0.2), (high, 0.6)):
        # binomial(400, rate): within 5 standard deviations of the mean
        sd = (400 * rate * (1 - rate)) ** 0.5
        assert abs(len(dropouts) - 400 * rate) < 5 * sd
        assert {d.stage for d in dropouts} == {"b", "c"}  # only the plan's dropout stages, both drawn
        assert {d.round_idx for d in dropouts} == set(range(5))
        assert "server" not in {d.party for d in dropouts}
        parties = [d.party for d in dropouts]
        assert parties == sorted(parties, key=lambda p: int(p.split("-")[1]))  # roster order


def test_an_explicit_dropout_wins_over_the_draw_for_its_party():
    from fedproto.cli import _Dropout

    plan = _plan(50)
    drawn = _draw(plan, 0.9, seed=1)
    party = drawn[0].party
    mine = _Dropout(party, "a", 0)
    both = _draw(plan, 0.9, seed=1, dropout=[mine])
    assert mine in both and [d for d in both if d.party != party] == [d for d in drawn if d.party != party]


def test_run_plan_checks_its_dropout_stages():
    with pytest.raises(ValueError, match=r"dropout_stages \['e'\] are not among the plan's phases"):
        _plan(2, stages=("b", "e"))
    with pytest.raises(ValueError, match="non-empty phase names"):
        _plan(2, stages="b")
    assert _plan(2, stages=("c", "b", "c")).dropout_stages == ("c", "b")


# --- usage errors ----------------------------------------------------------------------------------------


def _usage_cases() -> dict[str, tuple[list[str], list[str]]]:
    """case -> (options after the protocol, words its one line must hold)."""
    return {
        "no @": (["--dropout", "worker-1"], ["--dropout", "PARTY@STAGE", "'worker-1'"]),
        "no stage": (["--dropout", "worker-1@"], ["--dropout", "PARTY@STAGE"]),
        "no party": (["--dropout", "@answer"], ["--dropout", "PARTY@STAGE"]),
        "two @": (["--dropout", "worker-1@answer@2"], ["--dropout", "PARTY@STAGE"]),
        "bad round": (["--dropout", "worker-1@answer:x"], ["--dropout", "ROUND", "'x'"]),
        "negative round": (["--dropout", "worker-1@answer:-1"], ["--dropout", "ROUND", "'-1'"]),
        "empty round": (["--dropout", "worker-1@answer:"], ["--dropout", "ROUND"]),
        "unknown party": (["--dropout", "worker-7@answer"], ["--dropout", "'worker-7' is not a party",
                                                            "did you mean", "worker-0, worker-1, worker-2"]),
        "coordinator": (["--dropout", "coordinator@answer"], ["--dropout", "coordinator is the coordinating party"]),
        "unknown stage": (["--dropout", "worker-1@anwser"],
                          ["'anwser' is not a phase of dropsum", "did you mean answer", "survives dropouts at answer"]),
        "twice": (["--dropout", "worker-1@answer", "--dropout", "worker-1@query"],
                  ["worker-1 is given more than once"]),
        "rate 1": (["--dropout-rate", "1"], ["--dropout-rate", "below 1", "got 1"]),
        "rate negative": (["--dropout-rate", "-0.1"], ["--dropout-rate", "at least 0"]),
        "rate nan": (["--dropout-rate", "nan"], ["--dropout-rate", "below 1"]),
        "rate text": (["--dropout-rate", "half"], ["--dropout-rate", "expected a probability", "'half'"]),
        "tcp": (["--dropout", "worker-1@answer", "--transport", "tcp"],
                ["--dropout", "only on --transport memory, not tcp"]),
        "mpi": (["--dropout-rate", "0.1", "--transport", "mpi"],
                ["--dropout-rate", "only on --transport memory, not mpi"]),
        "unsupported": (["--strict", "--dropout-rate", "0.1"],
                        ["--dropout-rate", "dropsum supports dropout only without --strict"]),
    }


@pytest.mark.parametrize("case", list(_usage_cases()))
def test_dropout_mistakes_are_one_usage_error_line(dropsum, tmp_path, capsys, case):
    options, words = _usage_cases()[case]
    out = tmp_path / "r.json"
    code, stdout, err = _run(["run", str(dropsum), "--clients", "3", "--report", str(out), *options], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedproto: usage error: ") and lines[0].endswith("--help)"), err
    for word in words:
        assert word in lines[0], lines[0]
    assert not out.exists()


def test_a_protocol_without_dropout_stages_gets_a_generic_line():
    from fedproto.cli import UsageError, _Dropout

    plan = _plan(3, stages=())
    with pytest.raises(UsageError, match="argument --dropout: p declares no stage at which a party may drop out"):
        _draw(plan, None, seed=0, dropout=[_Dropout("client-0", "b")])


# --- the report field ------------------------------------------------------------------------------------


def test_the_faults_field_round_trips_validates_and_survives_merging():
    meter = Meter()
    meter.record_sent(0, "answer", "worker-0", "coordinator", "toy.contrib", 40)
    report = meter.report(protocol="toy", transport="memory", session=1, parties=["coordinator", "worker-0"])
    faults = {"dropouts": [{"party": "worker-0", "stage": "answer", "round_idx": None, "crashed": True}]}
    with_faults = dataclasses.replace(report, faults=faults)
    doc = with_faults.to_dict()
    jsonschema.validate(doc, report_schema())
    assert RunReport.from_json(with_faults.to_json()) == with_faults
    assert "faults" not in report.to_dict() and RunReport.from_dict(report.to_dict()).faults == {}
    assert RunReport.merge([report, with_faults]).faults == faults
    bad = json.loads(json.dumps(doc))
    bad["faults"]["dropouts"][0]["round_idx"] = -1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, report_schema())

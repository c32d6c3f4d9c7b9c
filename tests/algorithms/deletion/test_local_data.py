"""Each party holds only its own data (issue 10 part 1): qkmeans and dckmeans.

``split`` + one ``plan_party`` per party, each given only its own file loaded back, run over the
memory transport, give the results and the payload bytes (per link) of the simulation's
``plan``; the setup phase ``setup.data`` costs what the docs say; a party whose file has another
number of features is refused, named; and the whole thing through the command line, one
``fedproto party`` process per party over TLS.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from fedproto.algorithms.deletion import local_data
from fedproto.algorithms.deletion.cli import DCKMEANS, QKMEANS, prepare
from fedproto.algorithms.deletion.local_data import SETUP_PHASE, setup_payload_bytes
from fedproto.algorithms.deletion.messages import DataAgreement, DataSummary
from fedproto.cli import build_parser
from fedproto.codec import encode_frame
from fedproto.data import Dataset, load_dataset, save_dataset
from fedproto.errors import InsufficientParticipants, RemoteProtocolError
from fedproto.messages import PhaseTimedOut
from fedproto.testing import load_file, run_in_memory, run_over_tcp, run_plan_in_memory
from fedproto.testing.harness import Harness

helpers = load_file(Path(__file__).resolve().parents[2] / "_helpers.py", "tests_helpers")


whole_args = helpers.plugin_args  # ``fedproto run`` options: the plugin's plus the core's


def party_args(plugin, argv, data):
    """``fedproto party`` options of a party holding only its own file: no --clients or
    --partition, and --data is the party's file (or None)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline", type=float, default=60.0)
    plugin.add_arguments(parser)
    args = parser.parse_args(argv)
    args.data = data
    return args


def run_machines(roster, make_machine, session):
    """Run every party's machine over the memory transport: ``({party: result}, report)``."""
    return run_in_memory({p: make_machine(p) for p in roster}, session, roster=roster)


def run_plan(plan):
    return run_plan_in_memory(plan)


def links(report):
    return sorted((link.round_idx, link.phase, link.sender, link.receiver, link.tag, link.messages,
                   link.payload_bytes) for link in report.links)


def blobs(mixture, sizes=(60, 50, 70)):
    x = mixture(11, sizes)
    return Dataset("blobs", x * 7 - 2, np.repeat(np.arange(len(sizes)), sizes), None)


def per_party_run(plugin, argv, dataset, tmp_path, plan):
    """Split into files, load each back, and run every party built by ``plan_party`` from its own
    file only (plus the resolved options), in one process over memory."""
    parts = plugin.split(whole_args(plugin, argv), dataset)
    assert list(parts) == [p for p in plan.roster if p in parts]  # roster order
    files = {p: save_dataset(tmp_path / f"{p}.npz", part) for p, part in parts.items()}
    resolved = plugin.resolved_options(whole_args(plugin, argv), dataset)
    own = [t for t in argv if t not in ("--clients",)]  # the party command line has no --clients
    if "--clients" in argv:
        del own[argv.index("--clients")]  # and its value
    plans = {}
    for party in plan.roster:
        data = load_dataset(str(files[party])) if party in files else None
        args = party_args(plugin, [*own, *resolved], str(files[party]) if party in files else None)
        plans[party] = plugin.plan_party(args, party, plan.roster, plan.session, data)
        assert plans[party].roster == plan.roster and plans[party].session == plan.session
        assert plans[party].phases[0] == SETUP_PHASE
    results, report = run_machines(plan.roster, lambda p: plans[p].make_machine(p), plan.session)
    return {p: plans[p].result_to_json(p, r) for p, r in results.items()}, report, parts


CASES = {
    "dckmeans": (DCKMEANS, ["--k", "3", "--removals", "5", "--no-timing"]),
    "dckmeans-tall-weighted": (DCKMEANS, ["--k", "3", "--removals", "4", "--no-timing", "--width", "2",
                                          "--height", "2", "--weighted"]),
    "dckmeans-partition": (DCKMEANS, ["--k", "3", "--removals", "4", "--no-timing", "--leaves", "partition",
                                      "--clients", "3", "--normalize", "none"]),
    "qkmeans": (QKMEANS, ["--k", "3", "--removals", "6", "--clients", "3", "--no-timing"]),
    "qkmeans-federated": (QKMEANS, ["--k", "3", "--removals", "4", "--clients", "2", "--no-timing",
                                    "--federated", "--lattice-step", "0.0625"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_parties_on_their_own_files_equal_the_simulation(mixture, tmp_path, case):
    plugin, argv = CASES[case]
    dataset = blobs(mixture)
    plan = plugin.plan(whole_args(plugin, argv), dataset)
    expected, report = run_plan(plan)
    got, party_report, parts = per_party_run(plugin, argv, dataset, tmp_path, plan)
    assert got == expected
    assert links(party_report) == links(report)
    assert party_report.payload_bytes == report.payload_bytes
    summary = plan.summarize(expected)
    assert summary["model_equals_retrain"] is True
    if "federated_equals_centralised" in summary:
        assert summary["federated_equals_centralised"] is True
    # the split is the data: every raw row once, and the simulation's points are their scaling
    pooled = np.concatenate([p.x for p in parts.values()])
    assert sorted(map(tuple, pooled)) == sorted(map(tuple, dataset.x))
    assert sum(p.n for p in parts.values()) == summary["n_points"] == dataset.n
    # the setup phase comes first and happens once, in round 0
    setup = [link for link in report.links if link.phase == SETUP_PHASE]
    assert {link.round_idx for link in setup} == {0}
    assert sum(link.messages for link in setup) == 2 * len(parts)


def test_the_deletions_are_drawn_by_each_party_from_n_and_the_seed(mixture):
    """The stream is the simulation's (uniform over the pooled ids) and each client's requests
    are exactly its share of it."""
    terms = local_data.StreamTerms(removals=7, seed=4)
    stream = terms.stream(30)
    assert len(set(stream)) == 7 and all(0 <= i < 30 for i in stream)
    shares = [terms.requests(30, offset, count) for offset, count in ((0, 10), (10, 5), (15, 15))]
    merged = {pos: i for share in shares for pos, i in share.items()}
    assert [merged[pos] for pos in range(7)] == list(stream)
    assert terms.stream(30) != local_data.StreamTerms(removals=7, seed=5).stream(30)


def test_scaling_by_the_agreed_extent_is_the_pooled_scaling(mixture):
    dataset = blobs(mixture)
    whole = prepare(dataset, "minmax")
    lo, hi = dataset.x.min(axis=0), dataset.x.max(axis=0)
    for rows in (slice(0, 40), slice(40, 180)):
        np.testing.assert_array_equal(local_data.scale_points(dataset.x[rows], "minmax", (lo, hi)), whole[rows])


@pytest.mark.parametrize(("scale", "n_features"), [("minmax", 3), ("none", 3), ("minmax", 5)])
def test_setup_bytes_are_the_formula_plus_envelopes(mixture, scale, n_features):
    """P summaries up and P agreements down: 32 P d payload array bytes with min-max scaling, 0
    without, plus one envelope per frame (computed from zero arrays of the same shape)."""
    x = mixture(3, (40, 50, 45), d=n_features)
    dataset = Dataset("blobs", x, None, None)
    argv = ["--k", "3", "--removals", "3", "--no-timing", "--clients", "4", "--normalize", scale]
    plan = QKMEANS.plan(whole_args(QKMEANS, argv), dataset)
    _, report = run_plan(plan)
    parts = QKMEANS.split(whole_args(QKMEANS, argv), dataset)
    setup = [link for link in report.links if link.phase == SETUP_PHASE]
    measured = sum(link.payload_bytes for link in setup)
    d, n = n_features, dataset.n
    shape = (d,) if scale == "minmax" else (0,)
    zeros = np.zeros(shape)
    envelopes, offset = 0, 0
    for part in parts.values():
        for message in (DataSummary(n_points=part.n, n_features=d, lo=zeros, hi=zeros),
                        DataAgreement(n_points=n, offset=offset, lo=zeros, hi=zeros)):
            frame = encode_frame(message, session=plan.session, round_idx=0, phase=SETUP_PHASE)
            envelope = len(frame) - 2 * zeros.nbytes
            assert envelope <= 96
            envelopes += envelope
        offset += part.n
    formula = setup_payload_bytes(len(parts), d, scale)
    assert formula == (32 * 4 * d if scale == "minmax" else 0)
    assert measured == formula + envelopes
    key = "analytic setup bytes (P·32d with min-max scaling, 0 with --normalize none; plus framing)"
    assert plan.analytic[key] == formula
    # each client sends one summary to the server and gets one agreement back
    assert sorted((link.sender, link.receiver, link.tag) for link in setup) == sorted(
        [(c, "server", "del.summary") for c in parts] + [("server", c, "del.agreed") for c in parts]
    )


@pytest.mark.parametrize("case", ["dckmeans", "qkmeans", "qkmeans-federated"])
def test_a_party_with_another_number_of_features_is_refused_by_name(mixture, case):
    plugin, argv = CASES[case]
    dataset = blobs(mixture)
    plan = plugin.plan(whole_args(plugin, argv), dataset)
    parts = plugin.split(whole_args(plugin, argv), dataset)
    odd = list(parts)[1]
    resolved = plugin.resolved_options(whole_args(plugin, argv), dataset)
    own = [t for t in argv if t != "--clients"]
    if "--clients" in argv:
        del own[argv.index("--clients")]
    machines = {}
    for party in plan.roster:
        data = parts.get(party)
        if party == odd:
            data = Dataset(data.name, np.hstack([data.x, data.x[:, :1]]), data.y, data.paper_k)
        args = party_args(plugin, [*own, *resolved], "file.npz" if data is not None else None)
        machines[party] = plugin.plan_party(args, party, plan.roster, plan.session, data).make_machine(party)
    with pytest.raises(RemoteProtocolError, match=f"{odd}'s data has 4 features, .* 3") as caught:
        Harness(machines, session=plan.session).run()
    assert caught.value.party == odd and caught.value.phase == SETUP_PHASE


@pytest.mark.parametrize("case", ["dckmeans", "qkmeans", "qkmeans-federated"])
def test_a_party_silent_in_the_setup_phase_is_named_at_the_deadline(mixture, case):
    plugin, argv = CASES[case]
    plan = plugin.plan(whole_args(plugin, argv), blobs(mixture))
    head, silent = plan.roster[0], plan.roster[2]
    machines = {p: plan.make_machine(p) for p in plan.roster}
    harness = Harness(machines, session=plan.session, tamper=lambda f: None if f.sender == silent else f.data)
    harness.start()
    while harness.deliver_one() is not None:
        pass
    assert machines[head].phase == SETUP_PHASE and list(machines[head].pending()) == [silent]
    with pytest.raises(InsufficientParticipants, match=silent) as caught:
        harness.inject(head, PhaseTimedOut(0, SETUP_PHASE, 60.0))
    assert caught.value.missing == (silent,)
    # a data-holding party waiting for the agreement names the coordinating party
    waiting = machines[plan.roster[1]]
    assert waiting.phase == SETUP_PHASE
    with pytest.raises(InsufficientParticipants, match=head):
        waiting.handle(PhaseTimedOut(0, SETUP_PHASE, 120.0))


def test_party_plans_refuse_what_they_cannot_run(mixture):
    dataset = blobs(mixture)
    argv = ["--k", "3", "--removals", "5"]
    plan = DCKMEANS.plan(whole_args(DCKMEANS, argv), dataset)
    part = DCKMEANS.split(whole_args(DCKMEANS, argv), dataset)["leaf-0"]
    roster, session = plan.roster, plan.session
    with pytest.raises(ValueError, match="--removals is required"):
        DCKMEANS.plan_party(party_args(DCKMEANS, ["--k", "3"], "f"), "leaf-0", roster, session, part)
    with pytest.raises(ValueError, match="--k is required"):
        DCKMEANS.plan_party(party_args(DCKMEANS, ["--removals", "5"], None), "root", roster, session, None)
    # a file that records the paper's k gives --k
    recorded = Dataset(part.name, part.x, part.y, 3)
    assert DCKMEANS.plan_party(party_args(DCKMEANS, ["--removals", "5"], "f"), "leaf-0", roster, session, recorded)
    with pytest.raises(ValueError, match="leaf-0 holds data"):
        DCKMEANS.plan_party(party_args(DCKMEANS, argv, None), "leaf-0", roster, session, None)
    with pytest.raises(ValueError, match="root holds no data"):
        DCKMEANS.plan_party(party_args(DCKMEANS, argv, "f"), "root", roster, session, part)
    with pytest.raises(ValueError, match="not the 3\\^1 leaves"):
        DCKMEANS.plan_party(party_args(DCKMEANS, [*argv, "--width", "3"], "f"), "leaf-0", roster, session, part)
    q_roster = ("server", "client-0", "client-1")
    with pytest.raises(ValueError, match="curated"):
        QKMEANS.plan_party(party_args(QKMEANS, [*argv, "--federated"], None), "coordinator", q_roster, session, None)
    assert DCKMEANS.resolved_options(whole_args(DCKMEANS, argv), dataset) == [
        "--k", "3", "--removals", "5", "--width", str(len(roster) - 1)]
    assert QKMEANS.resolved_options(whole_args(QKMEANS, ["--removals", "2"]), dataset) == [
        "--k", "3", "--removals", "2"]


# -------------------------------------------------------------------- the command line, over TCP


@pytest.mark.slow
def test_dckmeans_parties_in_their_own_processes_over_tls_equal_the_memory_run(tmp_path):
    """fedproto split, fedproto provision, one fedproto party process per party with its own
    --data file: the model and the deletions the parties report, and the payload bytes of every
    link, equal the memory run's."""
    options = ["--data", "iris", "--removals", "6", "--no-timing", "--seed", "3"]
    argv = ["run", "dckmeans", *options]
    leaves = len(DCKMEANS.split(build_parser(argv).parse_args(argv), load_dataset("iris")))
    # the parties hold only their files: what the whole set decided is spelled out
    # (DCKMEANS.resolved_options: --k, --removals, --width)
    party_options = ["--removals", "6", "--no-timing", "--seed", "3", "--k", "3", "--width", str(leaves)]
    run = run_over_tcp("dckmeans", options, party_options, tmp_path, run_only=["--transport", "memory"],
                       timeout_s=240)
    memory = json.loads((tmp_path / "memory.json").read_text())
    roster = run.manifest["parties"]
    files = {entry["party"]: entry["file"] for entry in run.manifest["files"]}
    assert roster[0] == "root" and set(files) == set(roster[1:])
    reports = run.docs
    root = reports["root"]["result"]
    assert root["centroids"] == memory["results"]["centroids"]
    assert len(root["deletions"]) == memory["results"]["n_removals"] == 6
    removed = [i for p in files for i in reports[p]["result"]["removed"]]
    assert sorted(removed) == sorted(root["deletions"])
    sent = {}
    for party, doc in reports.items():
        for link in doc["report"]["links"]:
            if link["sender"] == party:
                key = (link["round_idx"], link["phase"], link["sender"], link["receiver"], link["tag"])
                sent[key] = (link["messages"], link["payload_bytes"])
    expected = {(link["round_idx"], link["phase"], link["sender"], link["receiver"], link["tag"]):
                (link["messages"], link["payload_bytes"]) for link in memory["links"]}
    assert sent == expected
    assert any(key[1] == SETUP_PHASE for key in sent)

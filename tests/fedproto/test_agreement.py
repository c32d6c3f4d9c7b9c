"""fedproto.agreement: the record parties compare, its digest and where two records differ."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fedproto.agreement import PARTY_LOCAL_OPTIONS, Agreement, Difference, check, diff, mismatch_message
from fedproto.errors import AgreementMismatch

PARTIES = ("server", "client-0", "client-1")


def record(**options: object) -> Agreement:
    base = {"seed": 3, "k": 3, "epsilon": 1.0, "party": "server", "roster": "a.json", "device": "cpu"}
    return Agreement.of_options("fastlloyd", {**base, **options}, PARTIES, topology="star", session=12345)


def test_party_local_options_are_left_out_and_options_are_spelt_as_typed() -> None:
    mine = record(party="server", roster="/srv/roster.json", device="gpu", deadline=60.0, party_report="x.json",
                  compute_trace=True)
    theirs = record(party="client-1", roster="kit/roster.json", device="cpu", deadline=600.0, compute_trace=False)
    assert diff(mine, theirs) is None and mine.digest() == theirs.digest()
    assert set(mine.options) == {"--seed", "--k", "--epsilon"}
    assert {"party", "roster", "deadline", "device", "insecure_shared_secret"} <= PARTY_LOCAL_OPTIONS
    spelt = Agreement.of_options("x", {"removals": 4}, PARTIES, spelling={"removals": "--deletions"})
    assert list(spelt.options) == ["--deletions"]


def test_diff_names_the_first_differing_option_with_both_values() -> None:
    assert diff(record(seed=3), record(seed=4)) == Difference("--seed", 3, 4)
    # options in name order: --epsilon before --seed
    assert diff(record(seed=3, epsilon=1.0), record(seed=4, epsilon=2.0)).name == "--epsilon"
    assert diff(record(), record(variant="fast")) == Difference("--variant", None, "fast", "mine")
    assert diff(record(), record()) is None
    assert record(epsilon=1).options == record(epsilon=1.0).options  # 1 == 1.0 once parsed


@pytest.mark.parametrize(
    ("theirs", "name"),
    [
        (Agreement("kzmeans", {"--seed": 3, "--k": 3, "--epsilon": 1.0}, PARTIES, "star", 12345), "protocol"),
        (Agreement("fastlloyd", {"--seed": 3, "--k": 3, "--epsilon": 1.0}, PARTIES[::-1], "star", 12345), "parties"),
        (Agreement("fastlloyd", {"--seed": 3, "--k": 3, "--epsilon": 1.0}, PARTIES, "mesh", 12345), "topology"),
        (Agreement("fastlloyd", {"--seed": 3, "--k": 3, "--epsilon": 1.0}, PARTIES, "star", 7), "session"),
        (None, "record"),
    ],
)
def test_protocol_roster_topology_session_and_a_missing_record_differ_too(theirs: Agreement | None, name: str) -> None:
    mine = record()
    assert diff(mine, theirs).name == name
    assert diff(theirs, mine).name == name
    assert (mine.digest() != theirs.digest()) if theirs is not None else True


def test_the_error_line_names_the_option_the_values_and_both_parties() -> None:
    line = mismatch_message(diff(record(seed=3), record(seed=4)), this_party="server", other="client-1")
    assert line == "client-1 runs with --seed 4, this party (server) with --seed 3; every party must run the same options"
    flag = mismatch_message(diff(record(no_timing=True), record(no_timing=False)), this_party="a", other="b")
    assert flag.startswith("b runs without --no-timing, this party (a) with --no-timing;")
    with pytest.raises(AgreementMismatch) as caught:
        check(record(seed=3), record(seed=4), this_party="server", other="client-1")
    assert caught.value.party == "client-1" and "\n" not in str(caught.value)
    check(record(), record(), this_party="server", other="client-1")  # agreeing: no error


def test_the_encoding_round_trips_and_refuses_garbage() -> None:
    mine = record(data=Path("/x/y.npz"), dropout=("a", "b"), namespace=argparse.Namespace(z=1))
    assert Agreement.from_bytes(mine.to_bytes()) == mine
    assert mine.options["--data"] == "/x/y.npz" and mine.options["--dropout"] == ["a", "b"]
    for garbage in (b"", b"[]", b"{}", b"\xff", b'{"protocol":1,"options":{},"parties":[],"topology":null,"session":null}',
                    b"{" + b" " * 9000 + b"}"):
        with pytest.raises(ValueError):
            Agreement.from_bytes(garbage)

"""The protocol-machine base: table lookup, round checks, ERROR state, result(), class checks, move_to."""

from __future__ import annotations

import enum
import pickle

import numpy as np
import pytest

from fedproto.errors import (
    InsufficientParticipants,
    LocalProtocolError,
    PeerUnreachable,
    ProtocolError,
    RemoteProtocolError,
    TransportBroken,
)
from fedproto.machine import ProtocolMachine, machine_states
from fedproto.messages import PartyDropped, PhaseTimedOut, SendFailed
from fedproto.testing.harness import Harness
from fedproto.testing.toy import Contribution, Finished, Query, SumCoordinator, SumWorker


def make(n_workers=3, rounds=2, dim=2, **kw):
    workers = [f"w{i}" for i in range(n_workers)]
    machines = {"c": SumCoordinator("c", workers=workers, rounds=rounds, dim=dim, **kw)}
    for i, w in enumerate(workers):
        machines[w] = SumWorker(w, coordinator="c", values=np.full(dim, float(i + 1)))
    return machines


def started_coordinator():
    """The coordinator of :func:`make`, started (its round-0 query sent)."""
    machine = make()["c"]
    machine.start()
    return machine


def test_harness_runs_toy_protocol_to_completion():
    machines = make()
    results = Harness(machines).run()
    # round r: sum over workers of (i+1) * (r+1) = 6 (r+1)
    np.testing.assert_array_equal(results["c"], [[6.0, 6.0], [12.0, 12.0]])
    assert all(machines[w].done for w in ("w0", "w1", "w2"))


def test_result_before_done_is_local_error():
    machine = make()["c"]
    with pytest.raises(LocalProtocolError, match="before the protocol is done"):
        machine.result()


def test_receive_before_start_and_double_start():
    machine = make()["w0"]
    with pytest.raises(LocalProtocolError, match="before start"):
        machine.receive("c", Query())
    machine.start()
    with pytest.raises(LocalProtocolError, match="twice"):
        machine.start()


def test_unexpected_message_moves_to_error_and_later_calls_raise():
    machine = make()["w0"]
    machine.start()
    with pytest.raises(RemoteProtocolError, match="unexpected Contribution"):
        machine.receive("c", Contribution(values=np.zeros(2)))
    assert machine.failed and machine.state.name == "ERROR"
    with pytest.raises(LocalProtocolError, match="ERROR"):
        machine.receive("c", Query())
    with pytest.raises(LocalProtocolError) as info:
        machine.result()
    assert isinstance(info.value.__cause__, RemoteProtocolError)


def test_wrong_round_is_remote_error_naming_party_and_round():
    machine = started_coordinator()
    with pytest.raises(RemoteProtocolError) as info:
        machine.receive("w1", Contribution(values=np.zeros(2)), round_idx=5)
    assert info.value.party == "w1" and info.value.round_idx == 0
    assert "round 5" in str(info.value)
    assert machine.failed


def test_handler_validation_errors_name_the_peer():
    machine = started_coordinator()
    with pytest.raises(RemoteProtocolError, match="not an active worker"):
        machine.receive("intruder", Contribution(values=np.zeros(2)), round_idx=0)


def test_duplicate_contribution_is_an_error():
    machine = started_coordinator()
    machine.receive("w0", Contribution(values=np.zeros(2)), round_idx=0)
    with pytest.raises(RemoteProtocolError, match="duplicate"):
        machine.receive("w0", Contribution(values=np.zeros(2)), round_idx=0)


def test_timeout_without_quorum_names_silent_parties():
    machine = started_coordinator()
    machine.receive("w0", Contribution(values=np.zeros(2)), round_idx=0)
    with pytest.raises(InsufficientParticipants) as info:
        machine.handle(PhaseTimedOut(0, "collect", 5.0))
    assert info.value.missing == ("w1", "w2")
    assert "w1, w2" in str(info.value)


def test_timeout_with_quorum_continues_without_the_silent_party():
    machines = make(min_responses=2)
    coordinator = machines["c"]
    out = coordinator.start()
    assert len(out) == 1 and out[0].dests == ("w0", "w1", "w2")
    coordinator.receive("w0", Contribution(values=np.ones(2)), round_idx=0)
    coordinator.receive("w1", Contribution(values=np.ones(2)), round_idx=0)
    out = coordinator.handle(PhaseTimedOut(0, "collect", 5.0))
    assert coordinator.round_idx == 1
    assert out[0].dests == ("w0", "w1")


def test_default_event_policy():
    machine = make()["w0"]
    machine.start()
    assert machine.handle(PartyDropped("someone-else")) == []
    with pytest.raises(InsufficientParticipants, match="dropped out"):
        machine.handle(PartyDropped("c"))
    other = make()["w1"]
    other.start()
    with pytest.raises(Exception, match="sending to c failed"):
        other.handle(SendFailed("c", PeerUnreachable("gone")))


def test_stamped_actions_carry_round_and_phase():
    machines = make(rounds=1)
    harness = Harness(machines)
    harness.start()
    frame = harness.queue[0]
    assert frame.sender == "c"
    harness.run()
    phases = {(link.round_idx, link.phase, link.tag) for link in harness.meter.report(
        protocol="toy", transport="none", session=0, parties=list(machines)).links}
    assert phases == {(0, "query", "toy.query"), (0, "answer", "toy.contrib"), (1, "finish", "toy.done")}


def test_tampered_frame_is_a_decode_error_in_the_harness():
    from fedproto.errors import DecodeError

    harness = Harness(make(), tamper=lambda f: f.data[:-1])
    harness.start()
    with pytest.raises(DecodeError):
        harness.deliver_one()


def test_deadlock_detected():
    machines = make(rounds=1)
    harness = Harness(machines, tamper=lambda f: None if f.dest == "c" else f.data)
    with pytest.raises(RuntimeError, match="deadlock"):
        harness.run()


def test_finished_accepted_only_in_table():
    worker = make()["w2"]
    worker.start()
    worker.receive("c", Finished())
    assert worker.done
    with pytest.raises(LocalProtocolError, match="already done"):
        worker.receive("c", Query())


def test_errors_quoting_errors_name_each_party_once():
    machine = started_coordinator()
    with pytest.raises(RemoteProtocolError):
        machine.receive("w1", Contribution(values=np.zeros(2)), round_idx=5)
    with pytest.raises(LocalProtocolError) as info:
        machine.result()
    text = str(info.value)
    assert text.count("party=") == 1 and "party=c" in text and "round 5" in text
    assert info.value.__cause__.party == "w1"  # the quoted error keeps its own attributes
    worker = make()["w0"]
    worker.start()
    with pytest.raises(ProtocolError) as info:
        worker.handle(SendFailed("c", TransportBroken("link lost", party="w0")))
    assert str(info.value).count("party=") == 1 and "party=c" in str(info.value)


# ---------------------------------------------------------------- checks at class definition


_S = machine_states("_S", "IDLE", "BUSY", "REST")


class _NoDone(enum.Enum):
    IDLE = enum.auto()
    ERROR = enum.auto()


def test_machine_states_appends_done_and_error_and_lives_in_the_callers_module():
    assert [m.name for m in _S] == ["IDLE", "BUSY", "REST", "DONE", "ERROR"]
    assert [m.value for m in _S] == [1, 2, 3, 4, 5]
    assert issubclass(_S, enum.Enum) and _S.__module__ == __name__ and _S.__qualname__ == "_S"
    assert pickle.loads(pickle.dumps(_S.REST)) is _S.REST


@pytest.mark.parametrize(
    ("members", "match"),
    [((), "at least one state"), (("A", "A"), "repeated"), (("A", "DONE"), "DONE/ERROR"), (("not a name",), "identifiers")],
)
def test_machine_states_refuses_what_is_not_a_list_of_new_state_names(members, match):
    with pytest.raises(ValueError, match=match):
        machine_states("Bad", *members)


def _define(name: str, **attrs):
    """Define a ProtocolMachine subclass ``name`` with ``attrs`` (and a ``_on_query`` handler)."""
    namespace = {"_on_query": lambda self, sender, message: [], **attrs}
    return type(name, (ProtocolMachine,), namespace)


GOOD = dict(State=_S, INITIAL_STATE=_S.IDLE, TRANSITIONS={(_S.IDLE, Query): ("_on_query", _S.BUSY)})


def test_a_well_formed_machine_defines_and_abstract_bases_are_skipped():
    assert _define("Good", **GOOD).INITIAL_STATE is _S.IDLE
    base = type("Base", (ProtocolMachine,), {"helper": lambda self: None})  # no table yet: not checked
    concrete = type("Concrete", (base,), {"_on_query": lambda self, s, m: [], **GOOD})
    assert issubclass(concrete, base)


@pytest.mark.parametrize(
    ("attrs", "match"),
    [
        (dict(TRANSITIONS={(_S.IDLE, Query): ("_on_missing", _S.BUSY)}), r"Bad\.TRANSITIONS names handler '_on_miss"),
        (dict(TRANSITIONS={(_S.IDLE, Query): ("DEADLINE_FACTOR", _S.BUSY)}), "no such method"),  # not callable
        (dict(State=_NoDone, INITIAL_STATE=_NoDone.IDLE, TRANSITIONS={}), r"Bad\.State \(_NoDone\) has no DONE member"),
        (dict(INITIAL_STATE=_NoDone.IDLE), r"Bad\.INITIAL_STATE .* is not a member of _S"),
        (dict(INITIAL_STATE="IDLE"), "INITIAL_STATE 'IDLE' is not a member"),
        (dict(TRANSITIONS={(_NoDone.IDLE, Query): ("_on_query", _S.BUSY)}), "key state .* is not a member"),
        (dict(TRANSITIONS={(_S.IDLE, Query): ("_on_query", "BUSY")}), "next state 'BUSY' for \\(IDLE, Query\\)"),
        (dict(TRANSITIONS={(_S.IDLE, dict): ("_on_query", _S.BUSY)}), "is not a Message subclass"),
        (dict(TRANSITIONS={(_S.IDLE, Query): "_on_query"}), "entries must be"),
        (dict(State=int), "must be an enum.Enum subclass"),
    ],
)
def test_a_malformed_machine_fails_at_definition(attrs, match):
    with pytest.raises(TypeError, match=match):
        _define("Bad", **{**GOOD, **attrs})


def test_move_to_changes_state_and_refuses_what_is_not_a_plain_member():
    machine = _define("Mover", **GOOD)("p")
    machine.move_to(_S.BUSY)
    assert machine.state is _S.BUSY and machine.phase == "busy"
    with pytest.raises(TypeError, match="not a member of _S"):
        machine.move_to(_NoDone.IDLE)
    with pytest.raises(TypeError, match="not a member"):
        machine.move_to("IDLE")
    with pytest.raises(ValueError, match=r"_finish\(result\)"):
        machine.move_to(_S.DONE)
    with pytest.raises(ValueError, match="raise an error instead"):
        machine.move_to(_S.ERROR)
    assert machine.state is _S.BUSY
    machine._finish(None)
    with pytest.raises(LocalProtocolError, match="after the machine reached DONE"):
        machine.move_to(_S.IDLE)


def test_a_handler_that_moves_overrides_its_table_entry():
    def on_query(self, sender, message):
        self.move_to(_S.REST)
        return []

    machine = _define("Stayer", **{**GOOD, "_on_query": on_query})("p")
    machine.start()
    machine.receive("c", Query(), round_idx=0)
    assert machine.state is _S.REST  # not BUSY, the table's next state

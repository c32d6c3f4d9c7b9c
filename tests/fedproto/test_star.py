"""fedproto.StarParties: the shared roster, roles and party checks of a star protocol."""

from __future__ import annotations

import numpy as np
import pytest

import fedproto
from fedproto.star import StarParties, check_clients, client_names, ids_owner


class _Recorder(StarParties):
    """Builds tuples instead of machines, so the tests see what the base class passed on."""

    def hub_machine(self):
        return ("hub", self.hub)

    def client_machine(self, index, party, data):
        return ("client", index, party, data)


class _Local(_Recorder):
    own_data = True


def test_roster_roles_and_index():
    parties = _Recorder(3, hub="coordinator")
    assert parties.roster == ("coordinator", "client-0", "client-1", "client-2")
    assert parties.role_of("coordinator") == "coordinator"
    assert parties.role_of("client-2") == "client"
    assert parties.client_index("client-1") == 1
    assert parties.machines() == {
        "coordinator": ("hub", "coordinator"),
        "client-0": ("client", 0, "client-0", None),
        "client-1": ("client", 1, "client-1", None),
        "client-2": ("client", 2, "client-2", None),
    }


def test_named_clients_keep_their_order():
    parties = _Recorder(hub="server", clients=["b", "a"])
    assert parties.roster == ("server", "b", "a")
    assert parties.make_machine("a") == ("client", 1, "a", None)


@pytest.mark.parametrize("bad", [dict(n_clients=0), dict(clients=[]), dict(clients=["x", "x"]),
                                 dict(clients=["server", "x"])])
def test_bad_rosters_are_refused(bad):
    with pytest.raises(ValueError):
        _Recorder(**bad)


def test_unknown_party_and_misplaced_data_are_refused():
    whole = _Recorder(2)
    with pytest.raises(ValueError, match="'client-9' is not a party of this run"):
        whole.make_machine("client-9")
    with pytest.raises(ValueError, match="holds the data"):
        whole.make_machine("client-0", np.zeros((1, 2)))
    local = _Local(2)
    with pytest.raises(ValueError, match="client-1 holds data"):
        local.make_machine("client-1")
    with pytest.raises(ValueError, match="the server holds no data"):
        local.make_machine("server", np.zeros((1, 2)))


def test_machine_factory_hands_each_party_only_its_own_rows():
    local = _Local(2)
    rows = {"client-0": np.ones((2, 3)), "client-1": np.zeros((1, 3))}
    build = local.machine_factory(rows)
    assert build("server") == ("hub", "server")
    kind, index, party, data = build("client-1")
    assert (kind, index, party) == ("client", 1, "client-1") and data is rows["client-1"]
    assert set(local.machines(rows)) == set(local.roster)


def test_ids_owner_maps_and_rejects_repeats():
    assert ids_owner([np.array([3, 1]), [2]]) == {3: 0, 1: 0, 2: 1}
    with pytest.raises(ValueError, match="point id 2 is held by two clients"):
        ids_owner([[2], [2]])
    with pytest.raises(ValueError, match="held twice by client 0"):
        ids_owner([[5, 5]])


def test_client_names_and_public_exports():
    assert client_names(2) == ("client-0", "client-1")
    with pytest.raises(ValueError):
        client_names(0)
    assert fedproto.StarParties is StarParties and "StarParties" in fedproto.__all__


@pytest.mark.parametrize(
    ("clients", "match"),
    [
        ([], "no machines: a run needs at least one"),
        (["m-0", "m-1", "m-0", "m-1"], "the machines must be distinct parties: 'm-0' is named twice"),
        (["m-0", "hub"], "the machines must not include the hub 'hub'"),
    ],
)
def test_check_clients_names_what_is_wrong_with_a_star(clients, match):
    with pytest.raises(ValueError, match=match):
        check_clients("hub", clients, noun="machines")


def test_check_clients_keeps_the_order_and_every_plan_and_hub_uses_it():
    assert check_clients("server", iter(["b", "a"])) == ("b", "a")
    with pytest.raises(ValueError, match="must not include the hub 'client-0'"):
        _Recorder(2, hub="client-0")  # generated names are checked too

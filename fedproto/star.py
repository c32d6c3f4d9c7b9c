"""The parties of a star protocol: one hub (``server``, ``coordinator``) and clients ``client-<i>``.

Most federated protocols have this shape, and every plan of one says the same things: the roster
(the hub first, then the clients in client order), the role of each party, which party holds
which data, the machine each party runs, and the checks around them (an unknown party, data
handed to the hub, a client without its data). :class:`StarParties` says them once. A protocol
author writes the two methods that differ, :meth:`StarParties.hub_machine` and
:meth:`StarParties.client_machine`::

    class SecureSumParties(StarParties):
        def __init__(self, values):
            super().__init__(len(values))
            self.values = values

        def hub_machine(self):
            return SumServer(self.hub, clients=self.clients)

        def client_machine(self, index, party, data):
            return SumClient(party, server=self.hub, value=self.values[index])

    parties = SecureSumParties([3, 1, 4])
    report = trio.run(run_parties, parties.machines(), network)

Two kinds of plan share it:

* a plan that holds the **whole data set** (a simulation): it keeps every client's part itself,
  and :meth:`~StarParties.make_machine` takes the party alone (``own_data = False``, the default);
* a plan whose clients **each hold only their own data** (parties on separate machines, or a
  simulation built exactly as they are): :meth:`~StarParties.make_machine` takes the party and the
  data it holds, a client's own raw rows and ``None`` for the hub (``own_data = True``), and
  :meth:`~StarParties.machine_factory` turns ``{party: rows}`` into the ``make_machine`` of a
  :class:`fedproto.plugin.RunPlan`.

:func:`check_clients` is the one check of a star's membership, for plans and hub machines alike;
:func:`ids_owner` checks that point ids are held by one client each (the removal-request
protocols name points by id).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from fedproto.machine import ProtocolMachine, party_index

__all__ = ["StarParties", "check_clients", "client_names", "ids_owner"]


def client_names(n_clients: int) -> tuple[str, ...]:
    """``("client-0", ..., "client-{n_clients - 1}")``: the clients of a star, in client order.

    Raises:
        ValueError: ``n_clients`` is not a positive int.
    """
    if isinstance(n_clients, bool) or not isinstance(n_clients, int) or n_clients < 1:
        raise ValueError(f"a run needs at least one client, got {n_clients!r}")
    return tuple(f"client-{i}" for i in range(n_clients))


def ids_owner(ids_by_client: Sequence[Any]) -> dict[int, int]:
    """Point id -> index of the client that holds it.

    Args:
        ids_by_client: per client, its point ids (any 1-D integer sequence or array).

    Raises:
        ValueError: an id held twice (by two clients, or twice by one), naming the id.
    """
    owner: dict[int, int] = {}
    for c, ids in enumerate(ids_by_client):
        for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
            if i in owner:
                raise ValueError(f"point id {i} is held by two clients" if owner[i] != c
                                 else f"point id {i} is held twice by client {c}")
            owner[i] = c
    return owner


def check_clients(hub: str, clients: Iterable[str], *, noun: str = "clients") -> tuple[str, ...]:
    """``clients`` as a tuple, checked to be the clients of a star around ``hub``: at least one,
    none named twice, the hub not among them.

    Args:
        hub: the hub's party name (a hub machine passes its own ``party``).
        clients: the clients' names, in client order.
        noun: what the protocol calls its clients in the error (``"clients"``, ``"parties"``,
            ``"machines"``).

    Returns:
        The names, in the order given.

    Raises:
        ValueError: no name, a name given twice (the first such is named), or ``hub`` among them.
    """
    names = tuple(clients)
    if not names:
        raise ValueError(f"no {noun}: a run needs at least one")
    if len(set(names)) != len(names):
        twice = next(name for name, count in collections.Counter(names).items() if count > 1)
        raise ValueError(f"the {noun} must be distinct parties: {twice!r} is named twice")
    if hub in names:
        raise ValueError(f"the {noun} must not include the hub {hub!r}")
    return names


class StarParties:
    """The roster, roles and machines of a star: the hub first, then the clients.

    Subclasses implement :meth:`hub_machine` and :meth:`client_machine`; everything else (the
    roster, :meth:`role_of`, the party checks, :meth:`machines`) is here.

    Args:
        n_clients: how many clients, named ``client-0`` ... (ignored when ``clients`` is given).
        hub: the hub's party name (``"server"``, ``"coordinator"``); its role has the same name.
        clients: the clients' names in client order, when they are not ``client-<i>`` (a roster
            file's names).

    Attributes:
        hub: the hub's name. clients: the clients' names, in client order.
        roster: ``(hub, *clients)``: every party in roster order (index = MPI rank).
        own_data: class attribute; ``True`` when each client's machine is built from the data
            handed to :meth:`make_machine` (the client's own rows), ``False`` when the plan holds
            the data itself.

    Raises:
        ValueError: no clients, repeated names, or the hub among the clients.
    """

    own_data: bool = False
    client_role: str = "client"

    def __init__(self, n_clients: int = 0, *, hub: str = "server", clients: Sequence[str] | None = None) -> None:
        names = check_clients(hub, client_names(n_clients) if clients is None else clients)
        self.hub = hub
        self.clients = names
        self.roster = (hub, *names)
        self._index = party_index(names)

    def role_of(self, party: str) -> str:
        """The hub's name for the hub (``server``, ``coordinator``), else ``client``."""
        return self.hub if party == self.hub else self.client_role

    def client_index(self, party: str) -> int:
        """The client order of ``party`` (0 for ``client-0``).

        Raises:
            ValueError: ``party`` is not a client of this run.
        """
        c = self._index.get(party)
        if c is None:
            raise ValueError(f"{party!r} is not a party of this run")
        return c

    def make_machine(self, party: str, data: Any = None) -> ProtocolMachine:
        """The machine of ``party``.

        Args:
            party: a party of the roster.
            data: with ``own_data``, what the party holds: a client's own raw rows (``[n_i, d]``
                float64), ``None`` for the hub; otherwise nothing (the plan holds the data).

        Raises:
            ValueError: ``party`` is not in the roster, data handed to the hub (or to anyone when
                the plan holds the data), or a client without its data; and whatever the
                subclass raises for data that does not fit.
        """
        if party == self.hub:
            if data is not None:
                raise ValueError(f"the {self.hub} holds no data" if self.own_data
                                 else f"this plan holds the data: build {party} without any")
            return self.hub_machine()
        c = self.client_index(party)
        if self.own_data and data is None:
            raise ValueError(f"{party} holds data: give it its own points")
        if not self.own_data and data is not None:
            raise ValueError(f"this plan holds the data: build {party} without any")
        return self.client_machine(c, party, data)

    def machine_factory(self, held: Mapping[str, Any]) -> Callable[[str], ProtocolMachine]:
        """``make_machine(party)`` for a :class:`~fedproto.plugin.RunPlan`: every party built from
        what it holds in ``held`` (``{party: rows}``; a party absent there holds nothing)."""
        return lambda party: self.make_machine(party, held.get(party))

    def machines(self, held: Mapping[str, Any] | None = None) -> dict[str, ProtocolMachine]:
        """Every party's machine, in roster order (``held`` as for :meth:`machine_factory`)."""
        build = self.machine_factory(held or {})
        return {party: build(party) for party in self.roster}

    def hub_machine(self) -> ProtocolMachine:
        """The hub's machine (subclasses implement it)."""
        raise NotImplementedError(f"{type(self).__name__} must implement hub_machine()")

    def client_machine(self, index: int, party: str, data: Any) -> ProtocolMachine:
        """The machine of client ``party`` (client order ``index``), holding ``data`` (``None``
        unless ``own_data``); subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__} must implement client_machine()")

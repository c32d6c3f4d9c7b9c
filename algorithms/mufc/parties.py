"""The plan of a MUFC simulation that holds the whole data set: :class:`MUFCParties`.

It builds the server and every client from the clients' scaled points and ids, the public
parameters and the removal stream (a run whose clients each hold only their raw rows is built by
:class:`~fedproto.algorithms.mufc.setup.LocalDataParties` instead). Rounds, phases and messages:
:mod:`fedproto.algorithms.mufc.protocol`.

References:
    Pan, Sima, Prakash, Rana, Milenkovic, "Machine Unlearning of Federated Clusters", ICLR 2023,
    Algorithms 1 and 4; spec mufc.md 1.10.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from fedproto.algorithms.mufc.client import MUFCClient, client_key_entropy
from fedproto.algorithms.mufc.config import SERVER, MUFCConfig, check_secagg_plus
from fedproto.algorithms.mufc.server import MUFCServer
from fedproto.algorithms.secagg_plus.engine import SecAggPlusConfig
from fedproto.star import StarParties, ids_owner

__all__ = ["MUFCParties"]


class MUFCParties(StarParties):
    """The parties of one MUFC run: ``server`` and ``client-<c>``.

    Args:
        parts: each client's ``(points [n_l, d], ids [n_l])``; ids unique across clients.
        config: the public parameters (``config.n_clients == len(parts)``).
        key: the run's `jax.random` key (server: ``fold_in(key, 0)``; client c: ``fold_in(key, c + 1)``).
        requests: the global removal stream, in order: ``(client index, ids)`` to remove a batch of
            that client's points, ``(client index, None)`` for the client to leave.
        seed: derives every client's X25519 key-pair entropy (simulation; see :class:`MUFCClient`).
        secagg_plus: aggregate with SecAgg+ under these parameters (:func:`secagg_plus_config`);
            ``None`` (default) is the paper's SCMA.
        session: the run's session id (names each SecAgg+ instance; unused with SCMA). Every machine
            holds it, so it must be the run's (``RuntimeConfig.session``), SCMA or not.

    Raises:
        ValueError: overlapping ids (:func:`fedproto.star.ids_owner`), a request that does not fit
            the data, a client count that does not match the config, a stream that would leave no
            client, or a ``secagg_plus`` that does not fit the run.
    """

    def __init__(
        self,
        parts: Sequence[tuple[np.ndarray, np.ndarray]],
        config: MUFCConfig,
        *,
        key: jax.Array,
        requests: Sequence[tuple[int, Sequence[int] | None]] = (),
        seed: int = 0,
        secagg_plus: SecAggPlusConfig | None = None,
        session: int = 0,
    ) -> None:
        if len(parts) != config.n_clients:
            raise ValueError(f"{len(parts)} clients' data for a config of {config.n_clients} clients")
        check_secagg_plus(config, secagg_plus)
        super().__init__(config.n_clients, hub=SERVER)
        self.secagg_plus, self.session = secagg_plus, session
        self.parts = [(np.asarray(x, np.float64), np.asarray(ids, np.int64)) for x, ids in parts]
        ids_owner([ids for _, ids in self.parts])
        self.config, self.key, self.seed = config, key, seed
        self.requests = tuple((int(c), None if b is None else tuple(int(i) for i in b)) for c, b in requests)
        self.per_client: list[dict[int, tuple[int, ...] | None]] = [{} for _ in self.parts]
        leaving = set()
        for pos, (c, batch) in enumerate(self.requests, start=1):
            if not 0 <= c < config.n_clients:
                raise ValueError(f"removal request {pos} names unknown client {c}")
            if c in leaving:
                raise ValueError(f"removal request {pos}: client {c} has already left")
            if batch is None:
                leaving.add(c)
            self.per_client[c][pos] = batch
        if len(leaving) >= config.n_clients:
            raise ValueError("the removal stream would leave no client in the federation")
        self.n_points = sum(x.shape[0] for x, _ in self.parts)

    def key_entropy(self, c: int) -> bytes:
        """Client c's key-pair entropy, derived from the run seed (simulation; :func:`client_key_entropy`)."""
        return client_key_entropy(self.seed, c)

    def hub_machine(self) -> MUFCServer:
        """The server, built with the public parameters and the public total n."""
        return MUFCServer(
            SERVER,
            clients=self.clients,
            config=self.config,
            key=jax.random.fold_in(self.key, 0),
            n_requests=len(self.requests),
            n_points=self.n_points,
            session=self.session,
            secagg_plus=self.secagg_plus,
        )

    def client_machine(self, index: int, party: str, data: Any) -> MUFCClient:
        """Client ``index`` with its part of the data and its requests (``data``: always ``None``,
        the plan holds the parts).

        Raises:
            ValueError: the client's requests do not fit its data.
        """
        x, ids = self.parts[index]
        return MUFCClient(
            party,
            server=SERVER,
            index=index,
            config=self.config,
            x=x,
            ids=ids,
            key=jax.random.fold_in(self.key, index + 1),
            requests=self.per_client[index],
            n_requests=len(self.requests),
            key_entropy=self.key_entropy(index),
            session=self.session,
            secagg_plus=self.secagg_plus,
        )

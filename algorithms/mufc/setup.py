"""MUFC when each party holds only its own data: the ``setup.data`` phase and the parties' builder.

A client holds only its raw rows; the server holds no data. Before training they agree, in the
metered phase ``setup.data`` (round 0, the first phase of the run), the public quantities that
the pooled data would otherwise give:

1. each client sends the server a :class:`~fedproto.algorithms.mufc.messages.DataSummary`: its
   number of points n_l and the per-feature minimum and maximum of its raw points;
2. the server checks that every client has the same number of features d (a client with another
   d is named in the error), combines the extents (element-wise minimum of the minima, maximum
   of the maxima: the pooled data's extent, bit for bit) and sends every client one
   :class:`~fedproto.algorithms.mufc.messages.FederationSummary`: every client's n_l and the
   federation's extent.

From these and the public options (:class:`DataSetup`) every party computes the same
:class:`Agreement` (:meth:`DataSetup.configure`):

* n = sum of the n_l, so the grid's default step gamma = 1/sqrt(n), B^d, the prime p and
  T = 2K'L: the :class:`~fedproto.algorithms.mufc.protocol.MUFCConfig` the pooled run builds;
* each client scales its raw rows into ``[0, 1]`` by the federation's extent
  (:func:`~fedproto.algorithms.mufc.data.unit_box`), the rows the pooled data scaled at once give;
* the point ids: client l's rows are ``offset_l, ..., offset_l + n_l - 1`` with ``offset_l`` the
  sum of the earlier clients' n_l (client-major row numbers of the pooled data);
* the removal stream (:func:`removal_stream`): it draws the requesting clients by their remaining
  sizes, so it needs every n_l, and nothing else of the data: each client takes its own
  requests from it.

Payload of the phase (data bytes; each frame adds its envelope of about 45 to 60 bytes):
``16 d`` (the extent) plus the count (msgpack int, 1 to 9 bytes) per client upload, and
``8 L + 16 d`` per client download (:func:`setup_data_bytes`). What it reveals: the server learns
every client's n_l and per-feature minimum and maximum; every client learns every n_l and the
federation's extent (the pooled minimum and maximum per feature), nothing about another client's
points beyond its count.

:class:`LocalDataParties` builds every party's machine from its own data and the public options
only; the simulation (``fedproto run mufc``) and the per-party processes (``fedproto party mufc
--data FILE``) build the same machines with it, so their results and payload bytes are equal by
construction.

References:
    Pan, Sima, Prakash, Rana, Milenkovic. Machine Unlearning of Federated Clusters (ICLR 2023),
    Sec. 4.2 (the public grid of step gamma = Theta(1/sqrt(n))) and Sec. 6 (data scaled into the
    unit box); spec mufc.md 1.2 (public parameters); fedproto issue 10 part 1 (each party holds
    only its own data).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np

from fedproto.algorithms.mufc.data import Federation
from fedproto.algorithms.mufc.client import MUFCClient, client_key_entropy
from fedproto.algorithms.mufc.config import (
    SECAGG_CHOICES,
    SERVER,
    MUFCConfig,
    MUFCOptions,
    make_config,
    secagg_plus_config,
)
from fedproto.algorithms.mufc.server import MUFCServer
from fedproto.algorithms.secagg_plus.engine import SecAggPlusConfig
from fedproto.star import StarParties, client_names

__all__ = [
    "Agreement",
    "DataSetup",
    "Federation",
    "LocalDataParties",
    "removal_stream",
    "setup_data_bytes",
]


def removal_stream(
    sizes: Sequence[int], ids: Sequence[np.ndarray], n_requests: int, batch: int, leave: int, k: int, seed: int
) -> list[tuple[int, tuple[int, ...] | None]]:
    """Random removals: ``n_requests`` batches of ``batch`` points drawn uniformly from the
    remaining points of clients that keep more than ``k`` points, then ``leave`` random clients
    leave.

    The draw depends on the clients' sizes and ``seed`` only (a batch's ids are those at the drawn
    positions of ``ids``), so every party that knows the sizes computes the same stream.

    Args:
        sizes: each client's number of points. ids: each client's point ids ``[n_l]``.
        n_requests: removal requests; batch: points per request; leave: clients that leave after
            them; k: points a client must keep; seed: the stream's seed.

    Returns:
        ``(client index, ids)`` per request, then ``(client index, None)`` per leaving client.

    Raises:
        ValueError: the data cannot serve the stream.
    """
    if n_requests < 0 or batch < 1 or leave < 0:
        raise ValueError("--removals and --leave must be non-negative, --points-per-removal at least 1")
    rng = np.random.default_rng(seed)
    remaining = [list(map(int, i)) for i in ids]
    stream: list[tuple[int, tuple[int, ...] | None]] = []
    for _ in range(n_requests):
        eligible = [c for c, r in enumerate(remaining) if len(r) - batch >= max(k, 1)]
        if not eligible:
            raise ValueError(f"no client can serve another removal of {batch} points and keep {k}")
        weights = np.array([len(remaining[c]) for c in eligible], dtype=np.float64)
        c = int(rng.choice(eligible, p=weights / weights.sum()))
        picks = rng.choice(len(remaining[c]), size=batch, replace=False)
        chosen = tuple(remaining[c][p] for p in sorted(picks.tolist()))
        picked = set(picks.tolist())
        remaining[c] = [i for j, i in enumerate(remaining[c]) if j not in picked]
        stream.append((c, chosen))
    if leave >= len(sizes):
        raise ValueError(f"--leave {leave} would remove every one of the {len(sizes)} clients")
    for c in rng.choice(len(sizes), size=leave, replace=False).tolist():
        stream.append((int(c), None))
    return stream


@dataclasses.dataclass(frozen=True)
class Agreement:
    """What every party derives from the :class:`Federation` and the public options.

    Attributes:
        federation: the agreed public quantities of the data.
        config: the run's public parameters (n, the grid, p, T).
        secagg_plus: the SecAgg+ parameters, or ``None`` for SCMA.
        stream: the removal stream, ``(client index, ids or None)`` per request.
    """

    federation: Federation
    config: MUFCConfig
    secagg_plus: SecAggPlusConfig | None
    stream: tuple[tuple[int, tuple[int, ...] | None], ...]

    def requests_of(self, c: int) -> dict[int, tuple[int, ...] | None]:
        """Client ``c``'s requests: position in the stream (1-based) -> ids, or ``None`` to leave."""
        return {pos: batch for pos, (owner, batch) in enumerate(self.stream, start=1) if owner == c}


@dataclasses.dataclass(frozen=True)
class DataSetup(MUFCOptions):
    """The public options of a MUFC run, fixed before the data are known.

    Every quantity that depends on the data (n, d, the extent, the sizes) is agreed in
    ``setup.data``; :meth:`configure` turns both into the run's :class:`Agreement`.

    Attributes:
        n_clients: L (the data-holding parties of the roster).
        k: clusters K at the server. k_client: seeds per client (``None``: K).
        gamma: the quantization step (``None``: 1/sqrt(n)).
        secagg: ``scma``, ``plus`` or ``complete``.
        removals, points_per_removal, leave, stream_seed: the removal stream (:func:`removal_stream`).
        server_mode, unlearning, n_init, max_iter, lloyd_iterations, fresh_randomness,
            min_clients: the run's :class:`~fedproto.algorithms.mufc.config.MUFCOptions`
            (keyword-only), passed on to :class:`~fedproto.algorithms.mufc.config.MUFCConfig`.

    Raises:
        ValueError: an option out of range (checked again, with the data, by :meth:`configure`).
    """

    n_clients: int
    k: int
    k_client: int | None = None
    gamma: float | None = None
    secagg: str = "scma"
    removals: int = 0
    points_per_removal: int = 1
    leave: int = 0
    stream_seed: int = 1

    def __post_init__(self) -> None:
        if self.n_clients < 1:
            raise ValueError("a MUFC run needs at least one client")
        if self.k < 1:
            raise ValueError("--k must be at least 1")
        if self.gamma is not None and not (math.isfinite(self.gamma) and self.gamma > 0):
            raise ValueError(f"--quantization-step must be positive and finite, got {self.gamma}")
        if self.removals < 0 or self.points_per_removal < 1 or self.leave < 0:
            raise ValueError("--removals and --leave must be non-negative, --points-per-removal at least 1")
        if self.secagg not in SECAGG_CHOICES:
            raise ValueError(f"secure aggregation must be one of {SECAGG_CHOICES}, got {self.secagg!r}")
        if self.secagg != "scma" and self.n_clients < 2:
            raise ValueError(f"SecAgg+ needs at least 2 clients, the run has {self.n_clients}")

    @property
    def n_requests(self) -> int:
        """Requests the run serves: the removals, then the clients that leave."""
        return self.removals + self.leave

    def configure(self, federation: Federation, session: int) -> Agreement:
        """The run's :class:`Agreement` (every party computes the same one).

        Args:
            federation: the quantities agreed in ``setup.data``.
            session: the run's session id (the SecAgg+ graph's public seed).

        Raises:
            ValueError: the federation does not have ``n_clients`` clients, K exceeds n, a
                parameter out of range, or the data cannot serve the removal stream.
        """
        if len(federation.client_points) != self.n_clients:
            raise ValueError(f"{len(federation.client_points)} clients' counts for a run of {self.n_clients} clients")
        n = federation.n
        if self.k > n:
            raise ValueError(f"K = {self.k} is larger than the number of points ({n})")
        config = make_config(n, federation.d, self.k, self.n_clients, k_client=self.k_client, gamma=self.gamma,
                             **self.options())
        plus = secagg_plus_config(config, self.secagg, session=session)
        stream = removal_stream(
            federation.client_points, [federation.ids(c) for c in range(self.n_clients)], self.removals,
            self.points_per_removal, self.leave, config.k_client, self.stream_seed,
        )
        return Agreement(federation, config, plus, tuple(stream))


def setup_data_bytes(n_clients: int, d: int) -> dict[str, int]:
    """The data bytes of ``setup.data`` per client, envelopes and the count's integer apart.

    Returns:
        ``{"up": 16 d, "down": 8 L + 16 d}``: a client's extent (``float64 [2, d]``) to the
        server; every client's count (``int64 [L]``) and the federation's extent to each client.
    """
    return {"up": 16 * d, "down": 8 * n_clients + 16 * d}


class LocalDataParties(StarParties):
    """The parties of a MUFC run in which each client holds only its own raw data.

    Every client machine is built from its own raw ``[n_l, d]`` rows and the public options; the
    server from the public options only. They agree the rest in ``setup.data`` (module
    docstring). The simulation and the per-party processes build their machines here
    (:meth:`~fedproto.star.StarParties.make_machine` takes a party and the rows it holds,
    :meth:`~fedproto.star.StarParties.machine_factory` the ``make_machine`` of a run plan).

    Args:
        setup: the public options (``setup.n_clients`` clients).
        key: the run's `jax.random` key (server: ``fold_in(key, 0)``; client c: ``fold_in(key, c + 1)``).
        seed: derives each client's X25519 key-pair entropy
            (:func:`~fedproto.algorithms.mufc.protocol.client_key_entropy`).
        session: the run's session id.
        clients: the clients' names in client order (default ``client-0`` ...).

    Raises:
        ValueError: ``clients`` does not name ``setup.n_clients`` distinct parties other than
            the server.
    """

    own_data = True

    def __init__(
        self, setup: DataSetup, *, key: jax.Array, seed: int, session: int, clients: Sequence[str] | None = None
    ) -> None:
        names = client_names(setup.n_clients) if clients is None else tuple(clients)
        if len(names) != setup.n_clients:
            raise ValueError(f"a MUFC run needs {setup.n_clients} clients besides {SERVER!r}, got {len(names)}")
        super().__init__(hub=SERVER, clients=names)  # ValueError: a name twice, or the server among them
        self.setup, self.key, self.seed, self.session = setup, key, seed, session

    def hub_machine(self) -> MUFCServer:
        """The server, from the public options only."""
        return MUFCServer(SERVER, clients=self.clients, key=jax.random.fold_in(self.key, 0),
                          n_requests=self.setup.n_requests, session=self.session, setup=self.setup)

    def client_machine(self, index: int, party: str, data: np.ndarray) -> MUFCClient:
        """Client ``index`` holding ``data``, its raw ``[n_l, d]`` points.

        Raises:
            ValueError: points that are not a finite ``[n_l, d]`` array with ``n_l, d >= 1``.
        """
        setup = self.setup
        return MUFCClient(party, server=SERVER, index=index, x=data, key=jax.random.fold_in(self.key, index + 1),
                          n_requests=setup.n_requests, key_entropy=client_key_entropy(self.seed, index),
                          session=self.session, setup=setup)

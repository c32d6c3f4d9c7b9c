"""The MUFC server: relays public keys, sums and decodes the clients' syndromes, clusters, serves removals.

:class:`ServerModel` is the server's computation without I/O (decode each round's sum, re-cluster
when the unlearning mode asks for it), shared with the timed replay
(:mod:`fedproto.algorithms.mufc.replay`); :class:`MUFCServer` is the machine around it: the
``setup.data`` and ``setup`` phases, one aggregation per round (SCMA shares, or a SecAgg+
instance), the removal requests and the dropouts. Rounds, phases and messages:
:mod:`fedproto.algorithms.mufc.protocol`.

References:
    Pan, Sima, Prakash, Rana, Milenkovic, "Machine Unlearning of Federated Clusters", ICLR 2023,
    Algorithm 1 (lines 5-7) and Algorithm 4; spec mufc.md 2 and 3.5; Bell et al., ACM CCS 2020,
    Sec. 3 (SecAgg+ dropouts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import jax
import numpy as np

from fedproto.algorithms import scma
from fedproto.algorithms.mufc import messages
from fedproto.algorithms.mufc.clustering import PaddedPoints, server_points
from fedproto.algorithms.mufc.config import SECAGG_PURPOSE, MUFCConfig, check_secagg_plus, remote_error
from fedproto.algorithms.mufc.data import Federation
from fedproto.algorithms.secagg_plus.engine import STAGES, SecAggPlusConfig, SecAggPlusServer, SumOutcome
from fedproto.algorithms.secagg_plus.protocol import SecAggPlusServerRole, server_transitions
from fedproto.data import agree_feature_count
from fedproto.errors import RemoteProtocolError
from fedproto.machine import ProtocolMachine, machine_states
from fedproto.messages import Event, Outgoing, PhaseTimedOut
from fedproto.star import check_clients

if TYPE_CHECKING:
    from fedproto.algorithms.mufc.setup import DataSetup

__all__ = [
    "MUFCServer",
    "MUFCServerResult",
    "ServerModel",
    "ServerState",
]


class ServerModel:
    """The server's computation, without I/O: decode each round's sum, re-cluster when the mode
    asks for it (Algorithm 1 lines 5-7, Algorithm 4). Shared by :class:`MUFCServer` and the
    timed replay (:mod:`fedproto.algorithms.mufc.replay`), so both compute exactly the same model.

    Args:
        config: the public parameters; key: the server's `jax.random` key.

    Attributes:
        counts: the last decoded ``{bin index: count}`` (``None`` before the first round).
        centroids: the current model ``[k, d]`` float64 (``None`` before the first round).
    """

    def __init__(self, config: MUFCConfig, key: jax.Array) -> None:
        self.config, self.key = config, key
        self.counts: dict[int, int] | None = None
        self.centroids: np.ndarray | None = None
        self._sums: Sequence[int] = []  # last round's sums: a PackedSums (immutable) or a list copy
        self._summed: scma.PackedSums | None = None
        self._decoded: dict[int, int] | None = None
        self._centres: dict[int, np.ndarray] = {}
        self._support: list[int] | None = None  # the bins of the cached weighted server points
        self._points: PaddedPoints | None = None
        self._round_keys: tuple[jax.Array, jax.Array] | None = None

    def sum_shares(self, shares: Sequence[np.ndarray] | np.ndarray, *, checked: bool = False) -> scma.PackedSums:
        """The sum of the active clients' packed shares over F_p (the masks cancel).

        Args:
            shares: per active client, the ``uint8 [T, width]`` wire form of its
                :class:`MaskedSyndromes` values (or one ``[L, T, width]`` stack).
            checked: each share was range-checked on arrival (`MUFCServer` does, to name the
                sender of a bad one); the sum does not check again (`scma.sum_packed`).

        Returns:
            ``[T]`` field elements in ``[0, p)`` as `fedproto.algorithms.scma.PackedSums` (a
            ``Sequence[int]``): `decode` given it and the previous round's tests a one-bin change
            on packed integers, without a Python int per element.

        Raises:
            ValueError, TypeError: a share of the wrong shape or type, or outside F_p.
        """
        self._summed = scma.sum_packed(shares, self.config.prime, self.config.n_syndromes, checked=checked)
        return self._summed

    def decode(self, sums: Sequence[int], *, n_clients: int, max_total: int, fresh: bool = False) -> dict[int, int]:
        """Decode the count vector from this round's sums (``fresh``: from scratch, otherwise the
        change since the last round, at most 2K non-zeros; same result).

        Args:
            sums: `sum_shares` of this round (or a SecAgg+ sum). n_clients: clients whose shares
                it holds (the support bound is ``K * n_clients``). max_total: the most points it
                may count.

        Raises:
            SyndromeDecodingError: the sum fails a validity check.
            ValueError: ``sums`` are not ``T`` field elements.
        """
        cfg = self.config
        bounds = dict(max_support=cfg.k_client * n_clients, max_index=cfg.grid.n_bins, max_total=max_total)
        # this model's own sum_shares result is known to be T field elements, the previous sums
        # passed decoding, and the counts adopted are the ones decoded then (keys ascending)
        own = sums is self._summed and self.counts is self._decoded
        if self.counts is None or fresh:
            counts = scma.decode_syndromes(sums, cfg.prime, **bounds)
        else:
            counts = scma.decode_update(sums, self._sums, self.counts, cfg.prime, change_hint=2 * cfg.k_client,
                                        validated=own, **bounds)
        # kept for the next round's decode_update: PackedSums are immutable; a list is copied
        self._sums = sums if isinstance(sums, scma.PackedSums) else list(sums)
        self._decoded = counts
        return counts

    def _keys(self, round_idx: int) -> tuple[jax.Array, jax.Array]:
        """(clustering key, server-points key) of a round; one pair for the run under coupled randomness."""
        if self.config.fresh_randomness:
            key = jax.random.fold_in(self.key, round_idx)
            return key, jax.random.fold_in(key, 1)
        if self._round_keys is None:
            key = jax.random.fold_in(self.key, 0)
            self._round_keys = (key, jax.random.fold_in(key, 1))
        return self._round_keys

    def needs_clustering(self, counts: Mapping[int, int], *, force: bool = False) -> bool:
        """Whether adopting ``counts`` re-runs K-means++ (the mode's rule; always the first time).

        ``exact``/``literal``: iff the counts differ from the current ones (equal counts give the
        same server data, so the same model under coupled randomness); ``lazy``: iff the support
        (the set of non-empty bins) differs, the authors' policy.
        """
        if self.counts is None or force:
            return True
        if self.config.unlearning == "lazy":
            return counts.keys() != self.counts.keys()
        return counts != self.counts

    def _server_data(self, counts: Mapping[int, int], points_key: jax.Array) -> tuple[PaddedPoints, np.ndarray]:
        """`server_points` of ``counts``, padded; in weighted mode the padded points of an
        unchanged support (the same bins, in the same ascending order: a removal that emptied no
        bin and filled none) are reused, only the weights are read."""
        cfg = self.config
        if cfg.server_mode == "weighted" and self._support is not None and len(counts) == len(self._support):
            if list(counts) == self._support and set(map(type, counts.values())) == {int}:
                weights = np.fromiter(counts.values(), dtype=np.int64, count=len(counts))
                if weights.min() >= 1:
                    return self._points, weights.astype(np.float64)
        points, weights = server_points(counts, cfg.grid, cfg.server_mode, points_key, centre_cache=self._centres)
        bound = cfg.k_client * cfg.n_clients if cfg.server_mode == "weighted" else 0  # at most K L bins
        padded = PaddedPoints(points, min_rows=bound)
        if cfg.server_mode == "weighted":
            self._support, self._points = sorted(counts), padded
        return padded, weights

    def adopt(self, counts: dict[int, int], round_idx: int, *, force: bool = False) -> bool:
        """Take ``counts`` as the current aggregate; re-cluster if the mode asks (or ``force``).

        Returns:
            Whether K-means++ ran.
        """
        cfg = self.config
        recluster = self.needs_clustering(counts, force=force)
        if recluster:
            key, points_key = self._keys(round_idx)
            points, weights = self._server_data(counts, points_key)
            centroids, _ = points.weighted_kmeans(key, weights, cfg.k, n_init=cfg.n_init, max_iter=cfg.max_iter)
            self.centroids = np.asarray(centroids)
        self.counts = counts
        return recluster



@dataclasses.dataclass(frozen=True)
class MUFCServerResult:
    """The server's output.

    Attributes:
        centroids: the final model ``[k, d]`` float64.
        history: the model after training and after each removal request.
        counts: the final decoded count vector ``{bin index: count}``.
        totals: sum of the decoded counts per version (n, then n minus the removed points).
        support_sizes: non-zero bins per version.
        reclustered: per version, whether the server re-ran K-means++.
        active: the clients active at the end (indices).
        dropped: clients dropped (silent past a deadline, or reported gone), in order (indices).
        dropouts: ``{party: (round_idx, stage)}`` for each dropped client: the round and the
            stage it did not complete (``aggregate`` with SCMA; a SecAgg+ stage otherwise).
    """

    centroids: np.ndarray
    history: tuple[np.ndarray, ...]
    counts: dict[int, int]
    totals: tuple[int, ...]
    support_sizes: tuple[int, ...]
    reclustered: tuple[bool, ...]
    active: tuple[int, ...]
    dropped: tuple[int, ...]
    dropouts: dict[str, tuple[int, str]] = dataclasses.field(default_factory=dict)


ServerState = machine_states("ServerState", "DATA", "KEYS", "AGGREGATE", "SERVING")


class MUFCServer(SecAggPlusServerRole, ProtocolMachine):
    """The MUFC server: relays public keys, decodes the aggregate, clusters, serves removals.

    Args:
        party: the server's name; clients: every client's name, in client-index order.
        config: the public parameters; key: the server's `jax.random` key.
        n_requests: the removal requests the run serves (it ends after the last).
        n_points: the public total n (checked against the first decoded sum).
        session: the run's session id (names each SecAgg+ instance; unused with SCMA). It must be
            the run's, ``RuntimeConfig.session`` (default 0, which is a run's only when the run is
            session 0): the runtime, ``simulate`` and the harness raise
            :class:`~fedproto.errors.SessionMismatch` naming this party before any frame otherwise.
        secagg_plus: aggregate with SecAgg+ under these parameters (the clients' must be the
            same; see :mod:`fedproto.algorithms.mufc.protocol`); ``None`` (default) is the paper's SCMA.
        setup: instead of ``config``, ``n_points`` and ``secagg_plus``: the public options of a
            run whose clients each hold only their own data
            (:class:`~fedproto.algorithms.mufc.setup.DataSetup`); the server agrees the rest with
            them in ``setup.data`` (``n_requests`` must be ``setup.n_requests``).

    Attributes:
        federation: the :class:`~fedproto.algorithms.mufc.data.Federation` agreed in
            ``setup.data`` (``None`` for a server built with ``config``, or before the phase ends).

    Raises:
        ValueError: neither or both of ``config`` and ``setup``, clients do not match
            ``config.n_clients`` (``setup.n_clients``) or repeat, negative counts, or a
            ``secagg_plus`` that does not fit the run.
    """

    State = ServerState
    INITIAL_STATE = ServerState.KEYS
    SECAGG_STATE = ServerState.AGGREGATE
    TRANSITIONS = {
        (ServerState.DATA, messages.DataSummary): ("_on_data_summary", ServerState.DATA),
        (ServerState.KEYS, messages.PublicKey): ("_on_key", ServerState.KEYS),
        (ServerState.AGGREGATE, messages.MaskedSyndromes): ("_on_share", ServerState.AGGREGATE),
        (ServerState.AGGREGATE, messages.RemovalRequest): ("_on_early_request", ServerState.AGGREGATE),
        **server_transitions(ServerState.AGGREGATE),
        (ServerState.SERVING, messages.RemovalRequest): ("_on_request", ServerState.SERVING),
    }

    def __init__(
        self,
        party: str,
        *,
        clients: Sequence[str],
        config: MUFCConfig | None = None,
        key: jax.Array,
        n_requests: int,
        n_points: int | None = None,
        session: int = 0,
        secagg_plus: SecAggPlusConfig | None = None,
        setup: DataSetup | None = None,
    ) -> None:
        super().__init__(party)
        clients = check_clients(party, clients)
        if (config is None) == (setup is None):
            raise ValueError("give the server either config (and n_points) or setup")
        n_clients = config.n_clients if config is not None else setup.n_clients  # type: ignore[union-attr]
        if len(clients) != n_clients:
            raise ValueError(f"{len(clients)} clients named, the configuration says {n_clients}")
        if n_requests < 0 or (config is not None and (n_points is None or n_points < 1)):
            raise ValueError("n_requests must be non-negative and n_points positive")
        if setup is not None and (n_points is not None or secagg_plus is not None or n_requests != setup.n_requests):
            raise ValueError("with setup, n_points and secagg_plus are agreed in setup.data and n_requests is "
                             "setup.n_requests")
        self.clients, self.key = clients, key
        self.n_requests = n_requests
        self.session, self.secagg_plus = session, None
        self._setup = setup
        self._summaries: dict[str, messages.DataSummary] = {}
        self.federation: Federation | None = None
        self._index = {name: i for i, name in enumerate(clients)}
        self._keys: dict[str, bytes] = {}
        self._active: tuple[int, ...] = tuple(range(len(clients)))
        self._dropped: list[int] = []
        self._dropouts: dict[str, tuple[int, str]] = {}
        self._attempt = 0
        self._shares: dict[int, tuple[int, ...]] = {}
        self._queued: list[tuple[str, messages.RemovalRequest]] = []
        self._history: list[np.ndarray] = []
        self._totals: list[int] = []
        self._supports: list[int] = []
        self._reclustered: list[bool] = []
        # SecAgg+ only: the run's engine, the clients counted as gone (dropped; their late frames
        # are ignored), the clients leaving in this round and the requests of this round.
        self._aggregation: SecAggPlusServer | None = None
        self._gone: set[str] = set()
        self._leaving: set[str] = set()
        self._round_requests = 0
        if config is not None:
            self._configure(config, n_points, secagg_plus)  # type: ignore[arg-type]
        else:
            self.move_to(ServerState.DATA)  # agree n, the grid and p with the clients first

    def _configure(self, config: MUFCConfig, n_points: int, secagg_plus: SecAggPlusConfig | None) -> None:
        """Take the run's public parameters (at construction, or at the end of ``setup.data``)."""
        check_secagg_plus(config, secagg_plus)
        self.config, self.n_points, self.secagg_plus = config, n_points, secagg_plus
        self._model = ServerModel(config, self.key)
        if secagg_plus is not None:
            self.move_to(ServerState.AGGREGATE)  # no SCMA key setup: SecAgg+ agrees its own keys in round 0
            self._aggregation = self._new_aggregation()

    @property
    def phase(self) -> str:
        if self._aggregation is not None and self._state is ServerState.AGGREGATE:
            return self._aggregation.stage
        return {ServerState.DATA: "setup.data", ServerState.KEYS: "setup", ServerState.AGGREGATE: "aggregate"}.get(
            self._state, "removal")

    @property
    def active(self) -> tuple[int, ...]:
        """Indices of the clients currently in the federation."""
        return self._active

    def pending(self) -> Sequence[str]:
        if self._state is ServerState.DATA:
            return [c for c in self.clients if c not in self._summaries]
        if self._state is ServerState.KEYS:
            return [c for c in self.clients if c not in self._keys]
        if self._state is ServerState.AGGREGATE:
            if self._aggregation is not None:
                return self._aggregation.pending()
            return [self.clients[c] for c in self._active if c not in self._shares]
        if self._state is ServerState.SERVING:
            return [self.clients[c] for c in self._active]
        return []

    def _client_index(self, sender: str) -> int:
        c = self._index.get(sender)
        if c is None:
            raise remote_error(f"{sender} is not a client of this run", sender, self)
        return c

    def _on_data_summary(self, sender: str, message: messages.DataSummary) -> list[Outgoing]:
        """``setup.data``: collect every client's count and extent; once all are in, check that
        the clients agree on d, agree the run's parameters and send every client every count and
        the federation's extent (then the run goes on as if built with them)."""
        self._client_index(sender)
        if sender in self._summaries:
            raise remote_error(f"second data summary from {sender}", sender, self)
        self._summaries[sender] = message
        if len(self._summaries) < len(self.clients):
            return []
        summaries = [self._summaries[c] for c in self.clients]
        dims = [int(summary.extent.shape[1]) for summary in summaries]
        d, positions = agree_feature_count(dims)
        odd = [self.clients[i] for i in positions]
        if odd:
            described = ", ".join(f"{c} has {dims[self._index[c]]}" for c in odd)
            raise RemoteProtocolError(
                f"the clients' points do not have the same number of features: {described}, the other clients "
                f"{d}", party=odd[0] if len(odd) == 1 else None, **self.error_context())
        federation = Federation.combine([s.n_points for s in summaries], [s.extent for s in summaries])
        assert self._setup is not None
        agreement = self._setup.configure(federation, self.session)
        self.federation, self._summaries = federation, {}
        summary = messages.FederationSummary(client_points=np.asarray(federation.client_points, dtype=np.int64),
                                             extent=federation.extent)
        out = [self.broadcast(self.clients, summary, phase="setup.data")]
        self.move_to(ServerState.KEYS)
        self._configure(agreement.config, federation.n, agreement.secagg_plus)
        return out

    def _on_key(self, sender: str, message: messages.PublicKey) -> list[Outgoing]:
        self._client_index(sender)
        if sender in self._keys:
            raise remote_error(f"second public key from {sender}", sender, self)
        self._keys[sender] = message.public_key
        if len(self._keys) < len(self.clients):
            return []
        keys = tuple(self._keys[c] for c in self.clients)
        if len(set(keys)) != len(keys):
            raise remote_error("two clients announced the same public key", sender, self)
        self.move_to(ServerState.AGGREGATE)
        return [self.broadcast(self.clients, messages.PeerKeys(keys=keys), phase="setup")]

    def _on_share(self, sender: str, message: messages.MaskedSyndromes) -> list[Outgoing]:
        c = self._client_index(sender)
        if self._aggregation is not None:
            raise remote_error(f"an SCMA share from {sender} in a SecAgg+ run", sender, self)
        if c in self._dropped:
            return []  # a late share of a client dropped after the deadline: refused, round goes on
        if c not in self._active:
            raise remote_error(f"{sender} is not active in this aggregation", sender, self)
        if message.attempt != self._attempt:
            raise remote_error(f"{sender}'s share is for attempt {message.attempt}, not {self._attempt}", sender, self)
        if c in self._shares:
            raise remote_error(f"second share from {sender} in this aggregation", sender, self)
        cfg = self.config
        if message.width != cfg.width or len(message.values) != cfg.n_syndromes:
            raise remote_error(
                f"{sender} sent {len(message.values)} elements of {message.width} bytes; "
                f"expected {cfg.n_syndromes} of {cfg.width}",
                sender,
                self,
            )
        try:
            scma.check_packed("values", message.values, cfg.prime, cfg.n_syndromes)
        except ValueError:
            raise remote_error(f"{sender} sent a value outside F_p", sender, self) from None
        self._shares[c] = message.values
        return []

    def _on_early_request(self, sender: str, message: messages.RemovalRequest) -> list[Outgoing]:
        if self._aggregation is not None:
            return self._on_secagg_request(sender, message)
        # A request that arrives while an aggregation runs is served after it (never merged
        # into the running round, whose shares were computed before the removal).
        self._client_index(sender)
        self._queued.append((sender, message))
        return []

    def _advance(self) -> list[Outgoing]:
        out: list[Outgoing] = []
        while True:
            if self._state is ServerState.AGGREGATE and self._shares and len(self._shares) == len(self._active):
                out += self._aggregate()
            elif self._state is ServerState.SERVING and self._queued:
                out += self._on_request(*self._queued.pop(0))
            else:
                return out

    def _aggregate(self) -> list[Outgoing]:
        """SCMA: sum the active clients' shares (the masks cancel) and adopt the sum."""
        # every share passed scma.check_packed in _on_share
        sums = self._model.sum_shares([self._shares[c] for c in self._active], checked=True)
        self._shares = {}
        self._attempt = 0
        return self._adopt(sums, self._active)

    def _adopt(self, sums: Sequence[int], contributors: tuple[int, ...]) -> list[Outgoing]:
        """Decode the sum of ``contributors``' syndromes, re-cluster if the mode asks, send the
        model to the contributors still in the federation, and finish or move on."""
        previous = self._totals[-1] if self._totals else self.n_points
        counts = self._model.decode(sums, n_clients=len(contributors), max_total=previous)
        total = sum(counts.values())
        everyone = len(contributors) == len(self.clients)
        if total > previous or (not self._totals and everyone and total != self.n_points):
            raise RemoteProtocolError(
                f"decoded {total} points, expected {'at most ' if self._totals else ''}{previous}",
                round_idx=self.round_idx,
                state=self._state.name,
            )
        if total == 0:
            raise RemoteProtocolError("no points remain in the federation", round_idx=self.round_idx)
        recluster = self._model.adopt(counts, self.round_idx)
        self._history.append(self._model.centroids)
        self._totals.append(total)
        self._supports.append(len(counts))
        self._reclustered.append(recluster)
        # A client that dropped at SecAgg+'s unmask stage has its input in this sum but is gone.
        self._active = tuple(c for c in contributors if self.clients[c] not in self._gone)
        version = len(self._history) - 1
        dests = [self.clients[c] for c in self._active]
        model = messages.ModelUpdate(version=version, reclustered=recluster, centroids=self._history[-1])
        out: list[Outgoing] = [self.broadcast(dests, model, phase="model")]
        if version == self.n_requests:
            if self._queued:
                raise remote_error("more removal requests than the run serves", self._queued[0][0], self)
            self._aggregation = None
            self._finish(
                MUFCServerResult(
                    self._history[-1],
                    tuple(self._history),
                    dict(counts),
                    tuple(self._totals),
                    tuple(self._supports),
                    tuple(self._reclustered),
                    self._active,
                    tuple(self._dropped),
                    dict(self._dropouts),
                )
            )
            return out
        self.round_idx += 1
        if self.secagg_plus is not None:
            # Every client still in the federation sends its masked input for the next round as
            # soon as it has this model: the next aggregation opens now.
            self._leaving, self._round_requests = set(), 0
            self._aggregation = self._new_aggregation()
            return out
        self.move_to(ServerState.SERVING)
        return out

    def _on_request(self, sender: str, message: messages.RemovalRequest) -> list[Outgoing]:
        c = self._client_index(sender)
        if c not in self._active:
            raise remote_error(f"{sender} has left the federation and cannot request removals", sender, self)
        if message.whole_client:
            if len(self._active) == 1:
                raise remote_error(f"{sender} is the last client; the federation would be empty", sender, self)
            self._active = tuple(i for i in self._active if i != c)
        self.move_to(ServerState.AGGREGATE)
        return [self._open()]

    def _open(self) -> Outgoing:
        dests = [self.clients[c] for c in self._active]
        request = messages.AggregationRequest(active=self._active, attempt=self._attempt)
        return self.broadcast(dests, request, phase="aggregate")

    # -- SecAgg+ ---------------------------------------------------------------------------------

    def _new_aggregation(self) -> SecAggPlusServer:
        assert self.secagg_plus is not None
        active = [self.clients[c] for c in self._active if self.clients[c] not in self._leaving]
        return self._secagg_server(self.secagg_plus, SECAGG_PURPOSE, active)

    def _on_secagg_request(self, sender: str, message: messages.RemovalRequest) -> list[Outgoing]:
        """A removal request under SecAgg+: the round is already open; a leaving client is taken
        out of it (absent, not a dropout), a partial removal needs nothing from the server."""
        aggregation = self._aggregation
        assert aggregation is not None
        c = self._client_index(sender)
        if c not in self._active or sender in self._leaving:
            raise remote_error(f"{sender} has left the federation and cannot request removals", sender, self)
        if self.round_idx == 0:
            raise remote_error(f"a removal request from {sender} during training", sender, self)
        self._round_requests += 1
        if self._round_requests > 1:
            raise remote_error(f"a second removal request in round {self.round_idx}", sender, self)
        if not message.whole_client:
            return []
        if aggregation.stage != STAGES[1] or aggregation.attempt or sender not in aggregation.pending():
            raise remote_error(f"{sender} asks to leave after joining the aggregation of round {self.round_idx}",
                          sender, self)
        if len(self._remaining()) == 1:
            raise remote_error(f"{sender} is the last client; the federation would be empty", sender, self)
        self._leaving.add(sender)
        self._check_quorum()
        # absent, not a dropout: the error messages and the dropout record must not name it
        return self._after_stage(aggregation.withdraw([sender]))

    def _remaining(self) -> list[int]:
        """The clients of the running aggregation that are neither gone nor leaving."""
        return [c for c in self._active if self.clients[c] not in self._gone and self.clients[c] not in self._leaving]

    def _quorum(self) -> int:
        cfg = self.config
        if cfg.min_clients is not None:
            return cfg.min_clients
        return 1 if self.secagg_plus is not None else cfg.n_clients

    def _check_quorum(self) -> None:
        """Raise where fewer clients than the quorum remain in the running aggregation."""
        remaining, quorum = len(self._remaining()), self._quorum()
        if remaining >= quorum:
            return
        missing = sorted(self.clients[c] for c in self._active if self.clients[c] in self._gone)
        raise self.insufficient(f"{remaining} clients remain in round {self.round_idx}, fewer than the quorum of "
                                f"{quorum}; dropped: {', '.join(missing) if missing else 'none'}", missing)

    def _may_drop(self, party: str) -> bool:
        """A client reported gone drops from the round if it is still in it (not gone, not leaving)."""
        return super()._may_drop(party) and party not in self._leaving and self._index[party] in self._active

    def _drop(self, parties: Sequence[str]) -> list[Outgoing]:
        self._check_quorum()  # before the engine, so the error names the quorum and the dropped
        return super()._drop(parties)

    def _aggregated(self, outcome: SumOutcome) -> list[Outgoing]:
        """The round's SecAgg+ sum: decode and adopt it (:meth:`_adopt`)."""
        self._dropped.extend(self._index[party] for party in outcome.dropouts)
        contributors = tuple(self._index[p] for p in outcome.survivors)
        return self._adopt([int(v) for v in outcome.total], contributors)

    def _on_event(self, event: Event) -> list[Outgoing]:
        # SCMA: retry the aggregation without the silent clients while the quorum holds; SecAgg+'s
        # dropouts are the role's (SecAggPlusServerRole._on_event)
        if self._aggregation is None and isinstance(event, PhaseTimedOut) and self._state is ServerState.AGGREGATE:
            missing = [c for c in self._active if c not in self._shares]
            remaining = len(self._active) - len(missing)
            if missing and remaining >= max(self.config.quorum, 1):
                self._dropped.extend(missing)
                self._dropouts.update({self.clients[c]: (self.round_idx, "aggregate") for c in missing})
                self._active = tuple(c for c in self._active if c not in missing)
                self._shares = {}
                self._attempt += 1
                return [self._open()]
        return super()._on_event(event)

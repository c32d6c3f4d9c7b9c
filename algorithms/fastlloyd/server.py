"""The FastLloyd server role: it agrees the federation's quantities, relays the mask-seed setup,
and sums the clients' masked updates with its DP noise each Lloyd iteration.

The protocol (setup, iterations, SecAgg+, dropout) is described in
:mod:`fedproto.algorithms.fastlloyd.protocol`, which re-exports these names.

References:
    Diaa, Humphries, Kerschbaum, "FastLloyd", Sec. 5, Alg. 1 (lines 14-17) and Fig. 1.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Container, Sequence
from typing import TYPE_CHECKING

import numpy as np

from fedproto.algorithms import secagg
from fedproto.algorithms.fastlloyd import _kernels
from fedproto.algorithms.fastlloyd.config import FastLloydConfig, FastLloydOptions
from fedproto.algorithms.fastlloyd.messages import (
    DataSummary,
    FederationSummary,
    MaskedUpdate,
    NoisyAggregate,
    PublicKey,
    PublicKeys,
    SealedSeed,
    SealedSeeds,
    SurvivorAggregate,
)
from fedproto.algorithms.fastlloyd.shared import SECAGG_PURPOSE, check_ring_values, check_secagg_plus, one_of, secagg_config
from fedproto.algorithms.secagg_plus.protocol import SecAggPlusServerRole, server_transitions
from fedproto.data import agree_feature_count
from fedproto.errors import RemoteProtocolError
from fedproto.machine import ProtocolMachine, machine_states, party_index
from fedproto.messages import Outgoing
from fedproto.star import check_clients

if TYPE_CHECKING:
    from fedproto.algorithms.secagg_plus.engine import SecAggPlusConfig, SecAggPlusServer, SumOutcome

__all__ = ["FastLloydServer", "ServerState", "ServerSummary"]


@dataclasses.dataclass(frozen=True)
class ServerSummary:
    """The server's output: what it did, nothing it learned (it sees only masked values).

    Attributes:
        iterations: iterations aggregated.
        noise_sum: per-iteration noise std/scale per sum coordinate.
        noise_count: per-iteration noise std/scale per count.
        survivors: with SecAgg+, per iteration the clients whose updates the aggregate holds;
            else empty.
        dropouts: with SecAgg+, ``{client: (iteration, stage)}`` for each client that dropped.
        n_points: the federation's total number of points N agreed in ``setup.data``; ``None``
            when the server was built from a ready config (no ``setup.data``).
        d: the number of features.
    """

    iterations: int
    noise_sum: tuple[float, ...]
    noise_count: tuple[float, ...]
    survivors: tuple[tuple[str, ...], ...] = ()
    dropouts: dict[str, tuple[int, str]] = dataclasses.field(default_factory=dict)
    n_points: int | None = None
    d: int | None = None


ServerState = machine_states("ServerState", "SETUP_DATA", "SETUP_KEYS", "SETUP_SEAL", "COLLECT")


class FastLloydServer(SecAggPlusServerRole, ProtocolMachine):
    """The FastLloyd server (sans-IO): agrees the federation's quantities, relays the seed setup,
    aggregates and adds noise.

    Give exactly one of ``config`` and ``options`` (see :mod:`fedproto.algorithms.fastlloyd.protocol`).

    Args:
        party: the server's party name.
        config: the run's public parameters, when known in advance (no ``setup.data``).
        options: the run's public options: the server holds no data, collects each client's
            count and extent in ``setup.data``, checks that every client has the same number of
            features, and derives :attr:`config` from the options at the total N.
        clients: every client's party name, in client order.
        noise_seed: seed of the server's noise key (``jax.random``; folded with the round index),
            an integer that fits in 64 signed bits.
        session: the run's session id (names each SecAgg+ aggregation, and seeds its graph). It must
            be the run's, ``RuntimeConfig.session`` (default 0, which is a run's only when the run
            is session 0): the runtime, ``simulate`` and the harness raise
            :class:`~fedproto.errors.SessionMismatch` naming this party before any frame otherwise.
        secagg_plus: with ``config``: aggregate with SecAgg+ under these parameters (the
            clients' must be the same); ``None`` (default) is the paper's MSA. With ``options``
            leave it out (``options.secagg`` chooses).

    Attributes:
        config: the run's public parameters (``None`` until ``setup.data`` is done when built
            from ``options``).
        secagg_plus: the SecAgg+ parameters, ``None`` for MSA (and until ``setup.data``).
        n_points: the federation's N agreed in ``setup.data`` (``None`` with ``config``).

    Raises:
        ValueError: not exactly one of ``config`` and ``options``; no clients, duplicate names,
            the server among the clients; a ``secagg_plus`` that does not fit the run or is
            given with ``options``; a ``noise_seed`` beyond 64 signed bits (``TypeError`` for one
            that is not an integer). In ``setup.data`` (the machine fails):
            :class:`~fedproto.errors.RemoteProtocolError` naming the clients whose number of
            features differs from the others' (the most common, ties going to the earliest
            client), ``ValueError`` when the clients hold no point or the options do not fit N
            (e.g. ``k > N``).
    """

    State = ServerState
    INITIAL_STATE = ServerState.SETUP_DATA
    SECAGG_STATE = ServerState.COLLECT
    TRANSITIONS = {
        (ServerState.SETUP_DATA, DataSummary): ("_on_data_summary", ServerState.SETUP_DATA),
        (ServerState.SETUP_KEYS, PublicKey): ("_on_public_key", ServerState.SETUP_KEYS),
        (ServerState.SETUP_SEAL, SealedSeeds): ("_on_sealed_seeds", ServerState.COLLECT),
        (ServerState.COLLECT, MaskedUpdate): ("_on_update", ServerState.COLLECT),
        **server_transitions(ServerState.COLLECT),
    }

    def __init__(
        self,
        party: str,
        *,
        config: FastLloydConfig | None = None,
        options: FastLloydOptions | None = None,
        clients: Sequence[str],
        noise_seed: int = 0,
        session: int = 0,
        secagg_plus: SecAggPlusConfig | None = None,
    ) -> None:
        super().__init__(party)
        clients = check_clients(party, clients)
        one_of(config, options, secagg_plus)
        if config is not None:
            check_secagg_plus(config, secagg_plus, len(clients))
        self.config: FastLloydConfig | None = config
        self.options = options
        self.clients = clients
        self._client_index = party_index(clients)
        self.session = session
        self.secagg_plus: SecAggPlusConfig | None = secagg_plus
        self.n_points: int | None = None
        self._summaries: dict[str, DataSummary] = {}
        self._noise_seed = operator.index(noise_seed)
        if not -(1 << 63) <= self._noise_seed < 1 << 63:
            raise ValueError(f"noise_seed must fit in 64 signed bits, got {noise_seed}")
        self._keys: dict[str, bytes] = {}
        # This round's updates: who sent one, and their sum so far (added as they arrive, each
        # wrapping mod 2^w, so the sum is the same in any order; not kept one per client).
        self._updates: set[str] = set()
        self._total: np.ndarray | None = None
        self._aggregation: SecAggPlusServer | None = None
        self._active = clients
        self._gone: set[str] = set()
        self._survivors: list[tuple[str, ...]] = []
        self._dropouts: dict[str, tuple[int, str]] = {}

    @property
    def phase(self) -> str:
        if self._aggregation is not None and self._state is ServerState.COLLECT:
            return self._aggregation.stage
        return {
            ServerState.SETUP_DATA: "setup.data",
            ServerState.SETUP_KEYS: "setup.keys",
            ServerState.SETUP_SEAL: "setup.seal",
        }.get(self._state, "aggregate")

    def pending(self) -> Sequence[str]:
        if self._state is ServerState.SETUP_DATA:
            return [c for c in self.clients if c not in self._summaries]
        if self._state is ServerState.SETUP_KEYS:
            return [c for c in self.clients if c not in self._keys]
        if self._state is ServerState.SETUP_SEAL:
            return [self.clients[0]]
        if self._state is ServerState.COLLECT:
            if self._aggregation is not None:
                return self._aggregation.pending()
            return [c for c in self.clients if c not in self._updates]
        return []

    def _open_aggregation(self) -> list[Outgoing]:
        assert self.secagg_plus is not None
        self._aggregation = self._secagg_server(self.secagg_plus, SECAGG_PURPOSE, self._active)
        return self._aggregation.drop(self._gone)

    def _aggregated(self, outcome: SumOutcome) -> list[Outgoing]:
        """The iteration's SecAgg+ sum: add the noise, send it with the clients outside it to those still in."""
        self._survivors.append(outcome.survivors)
        cfg = self.config
        total = outcome.total.reshape(cfg.shape) + self._noise()  # wraps mod 2^w
        index = self._client_index
        # Name the clients outside the sum (those gone in earlier iterations and this one's
        # dropouts), not the survivors: O(D) bytes to each client rather than O(n) (issue 34).
        outside = np.ones(len(self.clients), dtype=bool)
        outside[np.fromiter((index[c] for c in outcome.survivors), dtype=np.int64, count=len(outcome.survivors))] = False
        dropped = np.flatnonzero(outside).astype(np.uint32)
        receivers = self._still_in(outcome)
        out = [self.broadcast(receivers, SurvivorAggregate(masked=total, dropped=dropped), phase="aggregate")]
        self._active = receivers
        self.round_idx += 1
        if self.round_idx == cfg.iterations:
            self._aggregation = None
            self._finish(self._summary())
            return out
        return out + self._open_aggregation()

    def _summary(self) -> ServerSummary:
        cfg = self.config
        return ServerSummary(
            cfg.iterations, cfg.noise_sum, cfg.noise_count, tuple(self._survivors), dict(self._dropouts),
            n_points=self.n_points, d=cfg.d,
        )

    def _check_client(self, sender: str, seen: Container[str]) -> None:
        if sender not in self._client_index:
            raise RemoteProtocolError(f"{sender} is not a client of this run", party=sender, round_idx=self.round_idx)
        if sender in seen:
            raise RemoteProtocolError(
                f"second {self.phase} message from {sender} in round {self.round_idx}",
                party=sender,
                round_idx=self.round_idx,
                phase=self.phase,
            )

    def _start(self) -> list[Outgoing]:
        if self.config is not None:
            self.move_to(ServerState.SETUP_KEYS)  # the config is known: no setup.data
        return []

    def _on_data_summary(self, sender: str, message: DataSummary) -> list[Outgoing]:
        self._check_client(sender, self._summaries)
        self._summaries[sender] = message
        return []

    def _agree_data(self) -> list[Outgoing]:
        """``setup.data``, every summary in: check d, total N and the extent, derive the config."""
        options = self.options
        assert options is not None
        widths = {c: int(self._summaries[c].extent.shape[1]) for c in self.clients}
        d, positions = agree_feature_count(list(widths.values()))
        odd = [self.clients[i] for i in positions]
        if odd:
            named = ", ".join(f"{c} ({widths[c]})" for c in odd[:8]) + (f" and {len(odd) - 8} more" if len(odd) > 8 else "")
            raise RemoteProtocolError(
                f"{named} {'holds' if len(odd) == 1 else 'hold'} data with a different number of features than "
                f"the other clients ({d}): every client's data must have the same features",
                party=odd[0], round_idx=0, phase="setup.data",
            )
        summaries = [self._summaries[c] for c in self.clients]
        n_points = sum(s.n_points for s in summaries)
        if n_points == 0:
            raise ValueError("the clients hold no point at all")
        extent = np.stack([
            np.min([s.extent[0] for s in summaries], axis=0),
            np.max([s.extent[1] for s in summaries], axis=0),
        ])
        config = options.config(n_points, d)  # ValueError (k > N, ring) fails the run here
        plus = secagg_config(options.secagg, config, len(self.clients), self.session)
        check_secagg_plus(config, plus, len(self.clients))
        self.config, self.secagg_plus, self.n_points = config, plus, n_points
        self._summaries = {}
        self.move_to(ServerState.SETUP_KEYS)
        return [self.broadcast(self.clients, FederationSummary(n_points=n_points, extent=extent), phase="setup.data")]

    def _on_public_key(self, sender: str, message: PublicKey) -> list[Outgoing]:
        self._check_client(sender, self._keys)
        self._keys[sender] = message.public_key
        return []

    def _on_sealed_seeds(self, sender: str, message: SealedSeeds) -> list[Outgoing]:
        if sender != self.clients[0]:
            raise RemoteProtocolError(f"{sender} is not client 0", party=sender)
        if len(message.sealed) != len(self.clients) - 1:
            raise RemoteProtocolError(
                f"{len(message.sealed)} sealed seeds for {len(self.clients) - 1} clients", party=sender
            )
        sender_key = self._keys[self.clients[0]]
        out = [
            self.send(client, SealedSeed(sender_key=sender_key, sealed=sealed), phase="setup.relay")
            for client, sealed in zip(self.clients[1:], message.sealed)
        ]
        if self.secagg_plus is not None:
            out += self._open_aggregation()
        return out

    def _on_update(self, sender: str, message: MaskedUpdate) -> list[Outgoing]:
        if self.secagg_plus is not None:
            raise RemoteProtocolError(f"an MSA update from {sender} in a SecAgg+ run", party=sender, round_idx=self.round_idx)
        self._check_client(sender, self._updates)
        check_ring_values(self.config, message.masked, "update", sender, self.round_idx)
        self._updates.add(sender)
        if self._total is None:
            self._total = np.zeros(self.config.shape, dtype=secagg.ring_dtype(self.config.ring_bits))
        self._total += message.masked  # wraps mod 2^w
        return []

    def _advance(self) -> list[Outgoing]:
        if self._state is ServerState.SETUP_DATA and self.options is not None and len(self._summaries) == len(self.clients):
            return self._agree_data()
        if self._state is ServerState.SETUP_KEYS and len(self._keys) == len(self.clients):
            keys = tuple(self._keys[c] for c in self.clients)
            out = self.send(self.clients[0], PublicKeys(public_keys=keys), phase="setup.roster")
            self._keys = {self.clients[0]: keys[0]}  # what the relay of the sealed seeds needs
            self.move_to(ServerState.SETUP_SEAL)
            return [out]
        if self._state is ServerState.COLLECT and self.secagg_plus is None and len(self._updates) == len(self.clients):
            return [self._aggregate()]
        return []

    def _noise(self) -> np.ndarray:
        cfg = self.config
        t = self.round_idx
        if cfg.noise not in ("gaussian", "laplace"):
            return np.zeros(cfg.shape, dtype=secagg.ring_dtype(cfg.ring_bits))
        noise_sum, noise_count = _kernels.round_noise(
            self._noise_seed, t, cfg.noise_sum[t], cfg.noise_count[t], k=cfg.k, d=cfg.d, mechanism=cfg.noise
        )
        q_sum = secagg.quantize_noise(np.asarray(noise_sum), frac_bits=cfg.frac_bits, ring_bits=cfg.ring_bits)
        q_count = secagg.quantize_noise(np.asarray(noise_count), frac_bits=cfg.count_frac_bits, ring_bits=cfg.ring_bits)
        return np.concatenate([q_sum, q_count[:, None]], axis=1)

    def _aggregate(self) -> Outgoing:
        cfg = self.config
        total = self._total
        assert total is not None  # every client sent its update
        total += self._noise()
        out = self.broadcast(self.clients, NoisyAggregate(masked=total), phase="aggregate")
        self._updates, self._total = set(), None
        self.round_idx += 1
        if self.round_idx == cfg.iterations:
            self._finish(self._summary())
        return out

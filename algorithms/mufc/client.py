"""The MUFC client: local seeding, masked syndromes, its own removal requests.

A :class:`MUFCClient` runs K-means++ seeding on its points
(:class:`~fedproto.algorithms.mufc.seeding.LocalSeeding`), writes each local cluster's size into
the grid bin of its seed (the sparse count vector q^(l)) and uploads the power-sum syndromes of
q^(l) over F_p, masked with SCMA's pairwise masks or as the input of a SecAgg+ instance. A removal
request it holds re-seeds only from the first removed seed on (Algorithm 3) and refreshes its
syndromes from the bins whose count changed (:func:`refresh_syndromes`). Rounds, phases and
messages: :mod:`fedproto.algorithms.mufc.protocol`.

References:
    Pan, Sima, Prakash, Rana, Milenkovic, "Machine Unlearning of Federated Clusters", ICLR 2023,
    Algorithms 1 (lines 1-4), 3 and 4; spec mufc.md 2 and 3.5.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import jax
import numpy as np

from fedproto.algorithms import scma
from fedproto.algorithms.mufc import messages
from fedproto.algorithms.mufc.config import SECAGG_PURPOSE, MUFCConfig, check_secagg_plus, remote_error
from fedproto.algorithms.mufc.data import Federation
from fedproto.algorithms.mufc.seeding import LocalSeeding
from fedproto.algorithms.secagg import derive_bytes, x25519_keypair
from fedproto.algorithms.secagg_plus.engine import STAGES, SecAggPlusClient, SecAggPlusConfig
from fedproto.algorithms.secagg_plus.protocol import SecAggPlusClientRole
from fedproto.data import feature_extent
from fedproto.machine import ProtocolMachine, machine_states
from fedproto.messages import Outgoing

if TYPE_CHECKING:
    from fedproto.algorithms.mufc.setup import DataSetup

__all__ = [
    "ClientState",
    "MUFCClient",
    "MUFCClientResult",
    "bin_powers_ahead",
    "client_key_entropy",
    "refresh_syndromes",
]

#: Attempts per round are folded into the mask stream id below this many bits.
_ATTEMPT_BITS = 16
_SECAGG_ENTROPY = b"fedproto/mufc/secagg-plus/entropy"


def client_key_entropy(seed: int, c: int) -> bytes:
    """Client ``c``'s X25519 key-pair entropy, 32 bytes derived from the run seed (a simulation's
    and a test's, so that runs repeat; a deployment would draw ``os.urandom(32)``)."""
    material = hashlib.sha256(b"fedproto/mufc/run-seed" + seed.to_bytes(8, "big", signed=True)).digest()
    return derive_bytes(material, b"fedproto/mufc/x25519/client %d" % c)


def _mask_stream(round_idx: int, attempt: int) -> int:
    """The mask stream id of one aggregation attempt (masks are never reused across attempts)."""
    if not 0 <= attempt < 1 << _ATTEMPT_BITS:
        raise ValueError("too many attempts in one round")
    return (round_idx << _ATTEMPT_BITS) | attempt


def refresh_syndromes(
    local: LocalSeeding,
    counts: Mapping[int, int],
    syndromes: Sequence[int],
    config: MUFCConfig,
    powers: Mapping[int, Sequence[int]] | None = None,
) -> tuple[dict[int, int], list[int]]:
    """A client's count vector and syndromes after an unlearning step, updated from the old ones.

    Only the bins whose count changed (one after a removal that moved no seed, at most ``2K``
    otherwise) enter `fedproto.algorithms.scma.update_syndromes`; the result equals
    ``rs_syndromes(local.counts(grid))``. ``syndromes`` must be the client's own (from
    `~fedproto.algorithms.scma.rs_syndromes` or an earlier call): they are not checked again.
    ``powers`` (`bin_powers_ahead`, computed between rounds) make a one-bin change one addition
    per syndrome.

    Returns:
        ``(q', S')``: the new ``{bin index: count}`` and ``[T]`` syndromes.
    """
    new = local.counts(config.grid)
    change = {j: new.get(j, 0) - counts.get(j, 0) for j in new.keys() | counts.keys()}
    change = {j: c for j, c in change.items() if c}
    return new, scma.update_syndromes(syndromes, change, config.prime, validated=True, powers=powers)


def bin_powers_ahead(
    counts: Mapping[int, int], config: MUFCConfig, powers: Mapping[int, list[int]] | None = None
) -> dict[int, list[int]]:
    """The powers ``[j^0 .. j^(T-1)] mod p`` of a client's bins (the bins of its seeds), reusing
    those in ``powers``: a client computes them after training and after a re-seeding, between
    rounds, so that its next removal that moves no seed costs one addition per syndrome
    (`refresh_syndromes`). ``K * T`` field elements.
    """
    old = powers or {}
    return {j: old[j] if j in old else scma.bin_powers(j, config.prime, config.n_syndromes) for j in counts}


@dataclasses.dataclass(frozen=True)
class MUFCClientResult:
    """A client's output.

    Attributes:
        centroids: the server's last model the client received ``[k, d]``.
        version: its version.
        ids: the client's remaining point ids ``[n_l]``.
        positions: each remaining point's local cluster (position in ``seeds``) ``[n_l]``.
        local_centroids: the client's local centroids ``[r, d]`` (r <= K).
        seeds: the seed ids in selection order.
        reseeded: per own removal request, whether Algorithm 3 re-seeded.
        left: the client left the federation (whole-client removal).
    """

    centroids: np.ndarray | None
    version: int
    ids: np.ndarray
    positions: np.ndarray
    local_centroids: np.ndarray
    seeds: tuple[int, ...]
    reseeded: tuple[bool, ...]
    left: bool


ClientState = machine_states("ClientState", "DATA", "KEYS", "SERVING")


class MUFCClient(SecAggPlusClientRole, ProtocolMachine):
    """A MUFC client: seeds locally, uploads masked syndromes, serves its own removal requests.

    Args:
        party: the client's name; server: the server's name.
        index: the client's index (0-based, its position in the public client order).
        config: the public parameters.
        x: the client's points ``[n_l, d]`` float64 inside the grid's box; ids: stable ids ``[n_l]``.
        key: the client's `jax.random` key.
        requests: position in the global request stream -> the ids this client removes at that
            position (a batch), or ``None`` to leave the federation.
        n_requests: length of the global stream.
        key_entropy: 32+ bytes for the X25519 key pair (a simulation passes bytes derived from
            the run seed so runs repeat; deployments pass ``os.urandom(32)``); with SecAgg+, the
            keys of its set-up and the seeds and shares of every aggregation are derived from it.
        session: the run's session id (names each SecAgg+ instance; unused with SCMA). It must be
            the run's, ``RuntimeConfig.session`` (default 0, which is a run's only when the run is
            session 0): the runtime, ``simulate`` and the harness raise
            :class:`~fedproto.errors.SessionMismatch` naming this party before any frame otherwise.
        secagg_plus: aggregate with SecAgg+ under these parameters (the server's; see
            :mod:`fedproto.algorithms.mufc.protocol`); ``None`` (default) is the paper's SCMA.
        setup: instead of ``config``, ``ids``, ``requests`` and ``secagg_plus``: the public
            options of a run whose clients each hold only their own data
            (:class:`~fedproto.algorithms.mufc.setup.DataSetup`); ``x`` is then the client's raw
            points, which it scales by the extent agreed in ``setup.data``, where it also learns
            its ids and its requests (``n_requests`` must be ``setup.n_requests``).

    Attributes:
        federation: the :class:`~fedproto.algorithms.mufc.data.Federation` agreed in
            ``setup.data`` (``None`` for a client built with ``config``, or before the phase ends).

    Raises:
        ValueError: neither or both of ``config`` and ``setup``, a request for a point the client
            does not hold, a repeated id, a position outside the stream, a request after leaving,
            a stream that empties the client, non-finite points, or a ``secagg_plus`` that does
            not fit the run.
    """

    State = ClientState
    INITIAL_STATE = ClientState.KEYS
    DEADLINE_FACTOR = 2.0
    TRANSITIONS = {
        (ClientState.DATA, messages.FederationSummary): ("_on_federation", ClientState.KEYS),
        (ClientState.KEYS, messages.PeerKeys): ("_on_peer_keys", ClientState.SERVING),
        (ClientState.SERVING, messages.ModelUpdate): ("_on_model", ClientState.SERVING),
        (ClientState.SERVING, messages.AggregationRequest): ("_on_open", ClientState.SERVING),
        **SecAggPlusClientRole.secagg_transitions(ClientState.SERVING),
    }

    def __init__(
        self,
        party: str,
        *,
        server: str,
        index: int,
        config: MUFCConfig | None = None,
        x: np.ndarray,
        ids: np.ndarray | None = None,
        key: jax.Array,
        requests: Mapping[int, Sequence[int] | None] | None = None,
        n_requests: int = 0,
        key_entropy: bytes,
        session: int = 0,
        secagg_plus: SecAggPlusConfig | None = None,
        setup: DataSetup | None = None,
    ) -> None:
        super().__init__(party)
        if (config is None) == (setup is None):
            raise ValueError("give the client either config (with ids) or setup (raw points only)")
        n_clients = config.n_clients if config is not None else setup.n_clients  # type: ignore[union-attr]
        if not 0 <= index < n_clients:
            raise ValueError("index must lie in [0, n_clients)")
        x = np.asarray(x, dtype=np.float64)
        self.server, self.index, self.key = server, index, key
        self.n_requests = n_requests
        self._private, self._public = x25519_keypair(key_entropy)
        self._secagg_entropy = derive_bytes(key_entropy, _SECAGG_ENTROPY)
        self._pair_seeds: dict[int, bytes] = {}
        self._reseeded: list[bool] = []
        self._centroids: np.ndarray | None = None
        self._version = -1
        self._left = False
        self._next_mask: tuple[tuple[tuple[int, ...], int], list[int]] | None = None
        self.session, self.secagg_plus = session, None
        self._aggregation: SecAggPlusClient | None = None
        self._setup, self._raw = setup, None
        self.federation: Federation | None = None
        if config is not None:
            self._configure(config, x, ids, requests or {}, secagg_plus)
            if secagg_plus is not None:
                self.move_to(ClientState.SERVING)  # no SCMA key setup: SecAgg+ agrees its own keys in round 0
            return
        assert setup is not None
        if ids is not None or requests is not None or secagg_plus is not None or n_requests != setup.n_requests:
            raise ValueError("with setup, ids, requests and secagg_plus are agreed in setup.data and n_requests is "
                             "setup.n_requests")
        if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1 or not np.all(np.isfinite(x)):
            raise ValueError(f"{party}'s points must be a finite [n_l, d] array with n_l, d >= 1, got shape {x.shape}")
        self._raw = x
        self.move_to(ClientState.DATA)  # agree n, the extent and the grid with the others first

    def _configure(
        self,
        config: MUFCConfig,
        x: np.ndarray,
        ids: np.ndarray | None,
        requests: Mapping[int, Sequence[int] | None],
        secagg_plus: SecAggPlusConfig | None,
    ) -> None:
        """Take the run's public parameters and this client's scaled points, ids and requests
        (at construction, or at the end of ``setup.data``); seed locally and compute q^(l)."""
        check_secagg_plus(config, secagg_plus)
        ids = np.asarray(ids, dtype=np.int64)
        if x.ndim != 2 or x.shape[1] != config.grid.d or ids.shape != (x.shape[0],) or x.shape[0] < 1:
            raise ValueError("x must be [n_l, d] with d the grid's dimension, ids one per row, n_l >= 1")
        self.config, self.secagg_plus = config, secagg_plus
        self.requests = self._check_requests(requests, set(ids.tolist()), self.n_requests)
        self._local = LocalSeeding(x, ids, config.k_client, self.key, lloyd_iterations=config.lloyd_iterations)
        self._counts = self._local.counts(config.grid)
        self._syndromes = scma.rs_syndromes(self._counts, config.prime, config.n_syndromes)
        self._powers = bin_powers_ahead(self._counts, config)
        self._active: tuple[int, ...] = tuple(range(config.n_clients))

    @staticmethod
    def _check_requests(
        requests: Mapping[int, Sequence[int] | None], held: set[int], n_requests: int
    ) -> dict[int, tuple[int, ...] | None]:
        out: dict[int, tuple[int, ...] | None] = {}
        seen: set[int] = set()
        leave_at = None
        for pos in sorted(requests):
            if not 1 <= pos <= n_requests:
                raise ValueError(f"request position {pos} is outside the stream 1..{n_requests}")
            if leave_at is not None:
                raise ValueError(f"a request at position {pos} after leaving at position {leave_at}")
            batch = requests[pos]
            if batch is None:
                leave_at, out[pos] = pos, None
                continue
            batch = tuple(int(i) for i in batch)
            if not batch:
                raise ValueError(f"the request at position {pos} removes nothing")
            unknown = [i for i in batch if i not in held]
            if unknown:
                raise ValueError(f"removal of point ids this client does not hold: {unknown[:5]}")
            repeated = [i for i in batch if i in seen] or ([batch[0]] if len(set(batch)) != len(batch) else [])
            if repeated:
                raise ValueError(f"point id {repeated[0]} is removed twice")
            seen.update(batch)
            out[pos] = batch
        if leave_at is None and len(seen) >= len(held):
            raise ValueError("the requests would remove every point of the client (ask to leave instead)")
        return out

    @property
    def phase(self) -> str:
        if self._state is ClientState.DATA:
            return "setup.data"
        if self._state is ClientState.KEYS:
            return "setup"
        if self.secagg_plus is None:
            return "aggregate"
        aggregation = self._aggregation
        return aggregation.stage if aggregation is not None and aggregation.stage in STAGES else "model"

    def pending(self) -> Sequence[str]:
        return [self.server] if self._state in (ClientState.DATA, ClientState.KEYS, ClientState.SERVING) else []

    @property
    def public_key(self) -> bytes:
        """This client's X25519 public key."""
        return self._public

    def _start(self) -> list[Outgoing]:
        if self._state is ClientState.DATA:
            assert self._raw is not None
            extent = np.stack(feature_extent(self._raw))
            summary = messages.DataSummary(n_points=int(self._raw.shape[0]), extent=extent)
            return [self.send(self.server, summary, phase="setup.data")]
        return self._open_training()

    def _open_training(self) -> list[Outgoing]:
        """The first messages once the parameters are known: SCMA's key, or SecAgg+'s set-up."""
        if self.secagg_plus is not None:
            return [self._advertise()]
        return [self.send(self.server, messages.PublicKey(public_key=self._public), phase="setup")]

    def _on_federation(self, sender: str, message: messages.FederationSummary) -> list[Outgoing]:
        """``setup.data``: take the federation's counts and extent, derive the run's parameters,
        this client's scaled points, ids and requests, and open training."""
        self._check_server(sender)
        raw, setup = self._raw, self._setup
        assert raw is not None and setup is not None
        points, extent = message.client_points, message.extent
        if len(points) != setup.n_clients or int(points[self.index]) != raw.shape[0] or extent.shape[1] != raw.shape[1]:
            raise remote_error(f"the federation's summary does not hold this client's {raw.shape[0]} points of "
                          f"{raw.shape[1]} features at index {self.index} of {setup.n_clients}", sender, self)
        lo, hi = feature_extent(raw)
        if np.any(extent[0] > lo) or np.any(extent[1] < hi):
            raise remote_error("the federation's extent does not contain this client's points", sender, self)
        federation = Federation(tuple(int(n) for n in points), extent)
        agreement = setup.configure(federation, self.session)
        self.federation, self._raw = federation, None
        self._configure(agreement.config, federation.scale(raw), federation.ids(self.index),
                        agreement.requests_of(self.index), agreement.secagg_plus)
        if agreement.secagg_plus is not None:
            self.move_to(ClientState.SERVING)  # no SCMA key setup: SecAgg+ agrees its own keys in round 0
        return self._open_training()

    def _on_peer_keys(self, sender: str, message: messages.PeerKeys) -> list[Outgoing]:
        self._check_server(sender)
        if len(message.keys) != self.config.n_clients or message.keys[self.index] != self._public:
            raise remote_error("the key list does not hold this client's key at its index", sender, self)
        context = hashlib.sha256(b"".join(message.keys)).digest()
        self._pair_seeds = {
            m: scma.pairwise_seed(self._private, self._public, peer, context)
            for m, peer in enumerate(message.keys)
            if m != self.index
        }
        return [self._share(tuple(range(self.config.n_clients)), 0)]

    def _mask(self, active: tuple[int, ...], stream: int) -> list[int]:
        """This client's zero-sum mask for one aggregation attempt among ``active``."""
        cached = self._next_mask
        if cached is not None and cached[0] == (active, stream):
            return cached[1]
        seeds = {m: self._pair_seeds[m] for m in active if m != self.index}
        return scma.pairwise_masks(self.index, seeds, self.config.prime, self.config.n_syndromes, stream)

    def _share(self, active: tuple[int, ...], attempt: int) -> Outgoing:
        cfg = self.config
        self._active = active
        mask = self._mask(active, _mask_stream(self.round_idx, attempt))
        self._next_mask = None
        values = scma.pack_elements(scma.mask_syndromes(self._syndromes, mask, cfg.prime), cfg.prime)
        share = messages.MaskedSyndromes(attempt=attempt, width=cfg.width, values=values)
        return self.send(self.server, share, phase="aggregate")

    def _on_open(self, sender: str, message: messages.AggregationRequest) -> list[Outgoing]:
        self._check_server(sender)
        if self.secagg_plus is not None:
            raise remote_error("an SCMA aggregation request in a SecAgg+ run", sender, self)
        if self.index not in message.active:
            raise remote_error("an aggregation this client is not part of", sender, self)
        if any(c >= self.config.n_clients for c in message.active):
            raise remote_error("an aggregation over unknown clients", sender, self)
        return [self._share(message.active, message.attempt)]

    def _on_model(self, sender: str, message: messages.ModelUpdate) -> list[Outgoing]:
        self._check_server(sender)
        if message.version != self.round_idx or message.version <= self._version:
            raise remote_error(f"model version {message.version} in round {self.round_idx}", sender, self)
        plus = self.secagg_plus is not None
        if plus and (self._aggregation is None or self._aggregation.stage != "done"):
            raise remote_error("a model before this client revealed its shares", sender, self)
        self._version, self._centroids = message.version, message.centroids
        if message.version == self.n_requests:
            self._finish(self._outcome())
            return []
        self.round_idx += 1
        if plus and self.requests.get(self.round_idx, ()) is not None:
            # the next round opens now: remove first (the input is taken at masked-input), then
            # send this round's masked input
            out = []
            if self.round_idx in self.requests:
                self._remove(self.requests[self.round_idx])
                out.append(self.send(self.server, messages.RemovalRequest(whole_client=False), phase="removal"))
            return out + [self._advertise()]
        if self.round_idx not in self.requests:
            # between rounds: expand the next round's mask now (the masks do not depend on the
            # data, only on the active set and the round), off the next aggregation's path
            stream = _mask_stream(self.round_idx, 0)
            if len(self._active) > 1:
                self._next_mask = ((self._active, stream), self._mask(self._active, stream))
            return []
        batch = self.requests[self.round_idx]
        if batch is None:
            self._left = True
            out = [self.send(self.server, messages.RemovalRequest(whole_client=True), phase="removal")]
            self._finish(self._outcome())
            return out
        self._remove(batch)
        return [self.send(self.server, messages.RemovalRequest(whole_client=False), phase="removal")]

    # -- SecAgg+ ---------------------------------------------------------------------------------

    def _advertise(self) -> Outgoing:
        """Open this round's SecAgg+ aggregation: round 0 sends the set-up's key, a later round
        its masked input."""
        assert self.secagg_plus is not None
        return self._open_aggregation(
            self.secagg_plus, self.index, entropy=self._secagg_entropy, purpose=SECAGG_PURPOSE
        )

    def _secagg_input(self) -> object:
        # the input is the unmasked syndromes: SecAgg+ adds the masks
        return self._syndromes

    def _remove(self, batch: tuple[int, ...]) -> None:
        cfg = self.config
        key = None
        if cfg.fresh_randomness:
            key = jax.random.fold_in(jax.random.fold_in(self.key, 1 << 20), self.round_idx)
        outcome = self._local.remove(batch, key=key)
        self._reseeded.append(outcome.reseeded)
        if cfg.unlearning == "literal" and not outcome.reseeded:
            return  # the paper's wording: q^(l) is refreshed only when the client re-seeds
        self._counts, self._syndromes = refresh_syndromes(self._local, self._counts, self._syndromes, cfg,
                                                          self._powers)
        if self._counts.keys() != self._powers.keys():  # new seeds: their bins' powers, for later removals
            self._powers = bin_powers_ahead(self._counts, cfg, self._powers)

    def _outcome(self) -> MUFCClientResult:
        ids, positions = self._local.assignment()
        return MUFCClientResult(
            self._centroids,
            self._version,
            np.asarray(ids),
            np.asarray(positions),
            np.asarray(self._local.centroids),
            tuple(self._local.seeds),
            tuple(self._reseeded),
            self._left,
        )

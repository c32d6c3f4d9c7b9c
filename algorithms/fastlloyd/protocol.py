"""FastLloyd: federated differentially private k-means with masked secure aggregation.

Theory of operation (Diaa, Humphries, Kerschbaum, "FastLloyd", Sec. 5, Alg. 1 and Fig. 1;
spec fastlloyd.md sections 2.4-2.10).

Roles: one :class:`FastLloydServer` (semi-honest: it aggregates and adds the DP noise, and sees
only masked values) and M :class:`FastLloydClient` s (each holds a horizontal slice of the data).

A machine is built in one of two ways:

* from the run's :class:`~fedproto.algorithms.fastlloyd.config.FastLloydOptions` (``options=``):
  each client holds only its own *raw* points, and the server holds nothing. The parties first
  agree the federation's public quantities (phase ``setup.data``, round 0, metered as setup):
  each client sends its count n_i and per-feature minimum and maximum (:class:`DataSummary`);
  the server checks that every client has the same number of features d, and broadcasts the
  total N and the element-wise minimum of the minima and maximum of the maxima
  (:class:`FederationSummary`). That extent is the pooled data's, so each client's
  ``normalize(x_i, extent=...)`` gives exactly its rows of the pooled data normalised at once
  (:func:`fedproto.data.normalize`, FastLloyd Sec. 6.1). Every party then derives the same
  :class:`~fedproto.algorithms.fastlloyd.config.FastLloydConfig` from the options at N and d
  (``options.config(N, d)``: the default delta ``1/(N ln N)``, the iteration heuristic, the
  ring) and, with SecAgg+, the same SecAgg+ parameters (:func:`secagg_plus_config`). This is
  how ``fedproto run fastlloyd`` builds every run, in one process or one per party.
* from a ready :class:`~fedproto.algorithms.fastlloyd.config.FastLloydConfig` (``config=``):
  the public parameters are known in advance and each client's points are already normalised
  to ``[-B, B]^d``; there is no ``setup.data`` phase (the benchmarks and examples build runs
  this way).

Setup of the mask seed (phases ``setup.keys`` to ``setup.relay``, round 0, metered as setup):
the clients need a mask seed the server never learns. Every client sends its X25519 public key (:class:`PublicKey`); the server sends all
keys to client 0 (:class:`PublicKeys`); client 0 draws the seed and seals it for each other client
under a ChaCha20-Poly1305 key derived (HKDF) from their X25519 shared secret
(:class:`SealedSeeds`); the server relays each sealed seed (:class:`SealedSeed`). A semi-honest
server relays faithfully; it cannot open the seeds.

One Lloyd iteration t (round ``t``, 0-based), state-triggered:

1. client i (phase ``update``): assign each local point to its nearest public centroid, keeping
   it only if the distance is below the iteration's radius ``eta_t`` (Alg. 1 lines 6-9); compute
   per-cluster relative sums ``R_ij = sum (x - mu_j)`` (or absolute sums for the baselines) and
   counts (lines 11-13); encode in fixed point (q = 16, round-half-up) in Z_{2^w}; add the mask
   r_i; send :class:`MaskedUpdate`.
2. server (phase ``aggregate``), once every client's update is in: sum them mod 2^w, add
   quantised noise ``round(2^q * N(0, std_t^2))`` per entry (Gaussian for FastLloyd/GLloyd,
   Laplace for SuLloyd, none for Lloyd), broadcast :class:`NoisyAggregate`, move to round t+1.
3. client i: subtract the total mask, decode, divide, shift by the previous centroid, clip the move
   to ``eta_t`` and fold into the domain (lines 18-20); the result is the next public centroids.

After T iterations every client holds the same centroids; the server holds none (it never sees
an unmasked value). Messages per iteration: M uploads and M downloads of ``k (d+1)`` ring
elements each, so the payload is ``2 M k (d+1) w/8`` bytes plus one envelope per frame.

Dropout: FastLloyd has no dropout recovery (spec 1.2): the masks of all M clients are needed. A
client that stays silent past the phase deadline makes the server fail with
:class:`~fedproto.errors.InsufficientParticipants` naming it; a silent server makes each client
fail naming the server.

With SecAgg+ (``secagg_plus=`` a :class:`~fedproto.algorithms.secagg_plus.SecAggPlusConfig`,
``fedproto run fastlloyd --secagg plus``) each iteration is one SecAgg+ aggregation
(:mod:`fedproto.algorithms.secagg_plus.engine`: phases ``advertise-keys``, ``share-keys``,
``masked-input``, ``unmask``) of the same masked updates, and clients may drop at any stage of any
iteration after setup:

* the update a client sends in ``masked-input`` is its fixed-point statistics plus its shared-seed
  mask ``r_i`` (as above) plus the SecAgg+ masks; SecAgg+ gives the server the sum over the
  survivors ``S`` of ``enc_i + r_i``, still hidden by ``sum_{i in S} r_i``, which only clients can
  compute. The server adds its noise as above and sends :class:`SurvivorAggregate` (phase
  ``aggregate``) naming ``S``; each client subtracts ``sum_{i in S} r_i`` and decodes. So the
  server still never sees an unmasked value, and a client colluding with it (who knows every
  ``r_i``) still sees only sums: an individual update stays hidden by the SecAgg+ masks.
* a client dropped in iteration t takes no part in later iterations; the next centroids come from
  the survivors' statistics with the noise of the full budget.
* privacy of the survivors' data: each iteration's release is the same Gaussian (or Laplace)
  mechanism on the data of the clients in ``S``, with the sensitivity and noise of the paper's
  analysis (a point's change moves one client's statistics by the same bounded amount), and a
  point enters at most T releases, so the composed (epsilon, delta) is the paper's. Dropout is
  taken to be independent of the data (a crash, a lost link).
* setup (``setup.data`` and the shared seed) still needs every client: a dropout before the first
  iteration ends the run with the error above.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import numpy as np

from fedproto.algorithms import kmeans, secagg
from fedproto.algorithms.fastlloyd import _kernels
from fedproto.algorithms.fastlloyd.config import SECAGG_CHOICES, FastLloydConfig, FastLloydOptions
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
from fedproto.algorithms.secagg_plus.messages import (
    AdvertiseKeys,
    EncryptedShares,
    ForwardedShares,
    MaskedInput,
    NeighbourKeys,
    UnmaskRequest,
    UnmaskShares,
)
from fedproto.algorithms.secagg_plus.protocol import SecAggPlusClientRole, instance_bytes
from fedproto.data import feature_extent, normalize
from fedproto.errors import RemoteProtocolError
from fedproto.machine import ProtocolMachine, party_index
from fedproto.messages import Event, Message, Outgoing, PartyDropped, PhaseTimedOut

if TYPE_CHECKING:
    from fedproto.algorithms.secagg_plus.engine import SecAggPlusConfig, SecAggPlusServer

# SecAgg+'s engine (SCMA's arithmetic, FLINT) is imported only by a run that asks for it
# (--secagg plus or complete): in secagg_plus_config and where the server opens an aggregation.

__all__ = [
    "FastLloydClient",
    "FastLloydServer",
    "FastLloydResult",
    "ServerSummary",
    "initial_centroids",
    "secagg_plus_config",
]

_SEED_CONTEXT = b"fedproto/fastlloyd/mask-seed"
_MASK_LABEL = b"fedproto/fastlloyd/mask"
_SECAGG_PURPOSE = b"fedproto/fastlloyd/secagg-plus"


def secagg_plus_config(
    choice: str, *, ring_bits: int, length: int, n_clients: int, session: int
) -> SecAggPlusConfig | None:
    """The SecAgg+ parameters of a run, or ``None`` for the paper's MSA.

    Every party derives them from public values only: the graph seed is SHA-256 of the session
    id, the vectors are ``length = k (d+1)`` elements of ``Z_{2^w}``.

    Args:
        choice: ``"msa"``, ``"plus"`` (Bell et al.'s sparse graph) or ``"complete"`` (classic
            SecAgg), one of :data:`~fedproto.algorithms.fastlloyd.config.SECAGG_CHOICES`.
        ring_bits: the run's ring width w (32 or 64).
        length: elements per client vector, ``k (d+1)``.
        n_clients: number of clients M.
        session: the run's session id.

    Raises:
        ValueError: an unknown choice, or SecAgg+ with fewer than 2 clients.
    """
    if choice not in SECAGG_CHOICES:
        raise ValueError(f"unknown secure aggregation {choice!r}; choose one of {SECAGG_CHOICES}")
    if choice == "msa":
        return None
    if n_clients < 2:
        raise ValueError("--secagg plus needs at least 2 clients")
    from fedproto.algorithms.secagg_plus import engine as secagg_plus_engine

    seed = hashlib.sha256(b"fedproto/fastlloyd/secagg-graph" + session.to_bytes(8, "big")).digest()
    modulus = secagg_plus_engine.Modulus.ring(ring_bits)
    if choice == "complete":
        return secagg_plus_engine.complete_config(n_clients, length, modulus, graph_seed=seed)
    return secagg_plus_engine.plus_config(n_clients, length, modulus, graph_seed=seed)


def _secagg_plus_for(options: FastLloydOptions, config: FastLloydConfig, n_clients: int, session: int):
    return secagg_plus_config(
        options.secagg, ring_bits=config.ring_bits, length=config.k * (config.d + 1), n_clients=n_clients,
        session=session,
    )


def _one_of(config: FastLloydConfig | None, options: FastLloydOptions | None, secagg_plus) -> None:
    if (config is None) == (options is None):
        raise ValueError("give exactly one of config (normalised points) and options (raw points, setup.data)")
    if options is not None and secagg_plus is not None:
        raise ValueError("with options the SecAgg+ parameters follow from options.secagg after setup; leave secagg_plus out")


def check_secagg_plus(config: FastLloydConfig, secagg_plus: SecAggPlusConfig | None, n_clients: int) -> None:
    """Refuse a SecAgg+ configuration that does not fit the run: ``n_clients`` clients, vectors
    of ``k (d+1)`` elements of ``Z_{2^w}``.

    Raises:
        ValueError: the sizes or the ring differ.
    """
    if secagg_plus is None:
        return
    k, d1 = config.shape
    if secagg_plus.modulus.ring_bits != config.ring_bits:
        raise ValueError(f"SecAgg+ sums in {secagg_plus.modulus.describe()}, the run's ring is Z_2^{config.ring_bits}")
    if secagg_plus.vector_length != k * d1 or secagg_plus.n_clients != n_clients:
        raise ValueError(
            f"SecAgg+ is configured for {secagg_plus.n_clients} clients and vectors of {secagg_plus.vector_length}; "
            f"the run has {n_clients} clients and k (d+1) = {k * d1}"
        )


def initial_centroids(config: FastLloydConfig) -> np.ndarray:
    """The public initial centroids ``[k, d]`` float64 (read-only): sphere packing from
    ``config.init_seed``. Computed once per ``(k, d, seed, B)`` and shared by every party of a
    process (it is deterministic, and 10,000 clients would otherwise repeat it).

    References:
        FastLloyd Sec. 5.3.1 (after Su et al.); spec 2.4, halving variant.
    """
    return _sphere_packed(config.k, config.d, config.init_seed, config.bound)


@functools.lru_cache(maxsize=32)
def _sphere_packed(k: int, d: int, seed: int, bound: float) -> np.ndarray:
    centers, _ = _kernels.sphere_packing(k, d, seed, bound=bound)
    centers = np.array(centers, dtype=np.float64)
    centers.setflags(write=False)
    return centers


def _seal_context(session: int, client_idx: int) -> bytes:
    return _SEED_CONTEXT + session.to_bytes(8, "big") + client_idx.to_bytes(4, "big")


@dataclasses.dataclass(frozen=True)
class FastLloydResult:
    """A client's output.

    Attributes:
        centroids: final centroids ``[k, d]`` float64.
        history: centroids after each iteration, ``[T+1, k, d]`` (index 0 = initialisation).
        unassigned: this client's points left out by the radius test, per iteration ``[T]``.
        noisy_counts: the decoded noisy global counts per iteration ``[T, k]``.
    """

    centroids: np.ndarray
    history: np.ndarray
    unassigned: np.ndarray
    noisy_counts: np.ndarray


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


def _check_ring_values(config: FastLloydConfig, values: np.ndarray, what: str, sender: str, round_idx: int) -> None:
    """Refuse a peer's ring array whose shape or element width does not match the run's."""
    expected = secagg.ring_dtype(config.ring_bits)
    if values.shape != config.shape or values.dtype != expected:
        raise RemoteProtocolError(
            f"{what} of shape {values.shape} and dtype {values.dtype}, expected {config.shape} {expected}",
            party=sender,
            round_idx=round_idx,
        )


def _encode_update(config: FastLloydConfig, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    enc_sums = secagg.encode_fixed(sums, frac_bits=config.frac_bits, ring_bits=config.ring_bits)
    enc_counts = secagg.encode_fixed(counts, frac_bits=config.count_frac_bits, ring_bits=config.ring_bits)
    return np.concatenate([enc_sums, enc_counts[:, None]], axis=1)


class ClientState(enum.Enum):
    """States of a FastLloyd client."""

    SETUP_DATA = enum.auto()
    SETUP = enum.auto()
    ITERATING = enum.auto()
    DONE = enum.auto()
    ERROR = enum.auto()


class ServerState(enum.Enum):
    """States of the FastLloyd server."""

    SETUP_DATA = enum.auto()
    SETUP_KEYS = enum.auto()
    SETUP_SEAL = enum.auto()
    COLLECT = enum.auto()
    DONE = enum.auto()
    ERROR = enum.auto()


class FastLloydClient(SecAggPlusClientRole, ProtocolMachine):
    """A FastLloyd client (sans-IO).

    Give exactly one of ``config`` and ``options`` (see the module docstring).

    Args:
        party: this client's party name.
        config: the run's public parameters, when known in advance: ``points`` are then already
            normalised and the run starts with the key setup.
        options: the run's public options: ``points`` are this client's raw rows, and the run
            starts with ``setup.data``, after which :attr:`config` is set.
        server: the server's party name.
        clients: every client's party name, in client order (this one included).
        points: this client's points ``[n_i, d]`` float64 (``n_i`` may be 0): in ``[-B, B]^d``
            with ``config``, raw (any finite values) with ``options``.
        entropy: at least 32 secret random bytes: this client's X25519 key (and, for client 0,
            the mask seed) are derived from it. Same entropy, same keys: runs are repeatable.
        session: the run's session id (bound into the seed-sealing context and, with SecAgg+,
            the graph seed).
        secagg_plus: with ``config``: aggregate each iteration with SecAgg+ (dropout-tolerant;
            see the module docstring) under these parameters; ``None`` (default) is the paper's
            MSA. With ``options`` leave it out: ``options.secagg`` chooses, and the parameters
            follow after ``setup.data`` (:func:`secagg_plus_config`).

    Attributes:
        config: the run's public parameters (``None`` until ``setup.data`` is done when built
            from ``options``).
        secagg_plus: the SecAgg+ parameters, ``None`` for MSA (and until ``setup.data``).
        n_points: the federation's N agreed in ``setup.data`` (``None`` with ``config``).

    Raises:
        ValueError: not exactly one of ``config`` and ``options``; ``points`` is not 2-D, has
            no feature, has a number of features other than ``config.d``, holds NaN/inf or (with
            ``config``) leaves the domain; ``party`` is not in ``clients``; ``entropy`` is shorter
            than 32 bytes; ``secagg_plus`` does not fit the run or is given with ``options``.
            In ``setup.data`` (the machine fails): :class:`~fedproto.errors.RemoteProtocolError`
            when the server's summary has another number of features or does not cover this
            client's points, ``ValueError`` when the options do not fit N (e.g. ``k > N``).
    """

    State = ClientState
    DEADLINE_FACTOR = 2.0
    INITIAL_STATE = ClientState.SETUP_DATA
    TRANSITIONS = {
        (ClientState.SETUP_DATA, FederationSummary): ("_on_federation", ClientState.SETUP),
        (ClientState.SETUP, PublicKeys): ("_on_public_keys", ClientState.ITERATING),
        (ClientState.SETUP, SealedSeed): ("_on_sealed_seed", ClientState.ITERATING),
        (ClientState.ITERATING, NoisyAggregate): ("_on_aggregate", ClientState.ITERATING),
        (ClientState.ITERATING, NeighbourKeys): ("_on_neighbour_keys", ClientState.ITERATING),
        (ClientState.ITERATING, ForwardedShares): ("_on_forwarded_shares", ClientState.ITERATING),
        (ClientState.ITERATING, UnmaskRequest): ("_on_unmask_request", ClientState.ITERATING),
        (ClientState.ITERATING, SurvivorAggregate): ("_on_survivor_aggregate", ClientState.ITERATING),
    }

    def __init__(
        self,
        party: str,
        *,
        config: FastLloydConfig | None = None,
        options: FastLloydOptions | None = None,
        server: str,
        clients: Sequence[str],
        points: np.ndarray,
        entropy: bytes,
        session: int = 0,
        secagg_plus: SecAggPlusConfig | None = None,
    ) -> None:
        super().__init__(party)
        clients = tuple(clients)  # the caller's tuple itself: pass one tuple to every client
        index = party_index(clients)
        if party not in index:
            raise ValueError(f"{party!r} is not in the client list")
        _one_of(config, options, secagg_plus)
        points = np.asarray(points, dtype=np.float64)
        if points.ndim != 2 or points.shape[1] < 1:
            raise ValueError(f"points must have shape [n_i, d] with d >= 1, got {points.shape}")
        if not np.all(np.isfinite(points)):
            raise ValueError("points contain NaN or infinite values")
        if len(entropy) < 32:
            raise ValueError("entropy must be at least 32 bytes")
        self.options = options
        self.server = server
        self.clients = clients
        self.client_idx = index[party]
        self.session = session
        self._entropy = bytes(entropy)
        self._private_key, self._public_key = secagg.x25519_keypair(self._entropy)
        self._masks: secagg.MaskGenerator | None = None
        # Computed by receive_batch for the aggregate of round t: (t, the aggregate's array, noisy
        # counts, next centroids, encoded statistics [k, d+1] of round t+1, unassigned points).
        self._prepared: tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int] | None = None
        self._unassigned: list[int] = []
        self._noisy_counts: list[np.ndarray] = []
        self.config: FastLloydConfig | None = None
        self.secagg_plus: SecAggPlusConfig | None = None
        self.n_points: int | None = None
        self._raw: np.ndarray | None = None
        if config is not None:
            self._configure(config, secagg_plus, points)
        else:
            self._raw = points

    def _configure(self, config: FastLloydConfig, secagg_plus: SecAggPlusConfig | None, points: np.ndarray) -> None:
        """Take the run's public parameters and this client's normalised points."""
        check_secagg_plus(config, secagg_plus, len(self.clients))
        if points.shape[1] != config.d:
            raise ValueError(f"points must have shape [n_i, {config.d}], got {points.shape}")
        if points.size and np.max(np.abs(points)) > config.bound:
            raise ValueError(f"points leave the domain [-{config.bound}, {config.bound}]^d; normalise first")
        self.config = config
        self.secagg_plus = secagg_plus
        host = points.size * config.k <= kmeans.HOST_ELEMENTS
        # A few points stay on the host (NumPy, kmeans.local_statistics_host); more go to the device once.
        self._points = points if host else jax.numpy.asarray(points)
        self._centroids = np.asarray(initial_centroids(config), dtype=np.float64)
        self._history = [self._centroids]

    @property
    def phase(self) -> str:
        if self._state is ClientState.SETUP_DATA:
            return "setup.data"
        if self._state is ClientState.SETUP:
            return "setup.keys"
        if self._aggregation is not None:
            return self._aggregation.stage
        return "update"

    def pending(self) -> Sequence[str]:
        # a client only ever waits for the server
        return () if self.done or self.failed else (self.server,)

    def _start(self) -> list[Outgoing]:
        if self._raw is not None:
            raw = self._raw
            if raw.shape[0]:
                lo, hi = feature_extent(raw)
            else:  # the extent of no points: the identities of min and max
                lo, hi = np.full(raw.shape[1], np.inf), np.full(raw.shape[1], -np.inf)
            summary = DataSummary(n_points=int(raw.shape[0]), extent=np.stack([lo, hi]))
            return [self.send(self.server, summary, phase="setup.data")]
        self.move_to(ClientState.SETUP)
        return [self._send_key()]

    def _send_key(self) -> Outgoing:
        return self.send(self.server, PublicKey(public_key=self._public_key), phase="setup.keys")

    def _on_federation(self, sender: str, message: FederationSummary) -> list[Outgoing]:
        """``setup.data``: normalise by the federation's extent, derive the config, send the key."""
        self._check_from_server(sender)
        raw, options = self._raw, self.options
        assert raw is not None and options is not None
        n_i, d = raw.shape
        lo, hi = message.extent
        if message.extent.shape[1] != d:
            raise RemoteProtocolError(
                f"the federation's extent has {message.extent.shape[1]} features, this client's data {d}",
                party=sender, round_idx=0, phase="setup.data",
            )
        if message.n_points < n_i or (n_i and (np.any(raw.min(axis=0) < lo) or np.any(raw.max(axis=0) > hi))):
            raise RemoteProtocolError(
                f"the federation's summary (N = {message.n_points} and its extent) does not cover this client's "
                f"{n_i} points", party=sender, round_idx=0, phase="setup.data",
            )
        config = options.config(message.n_points, d)
        plus = _secagg_plus_for(options, config, len(self.clients), self.session)
        self._configure(config, plus, normalize(raw, options.bound, extent=(lo, hi)))
        self.n_points = message.n_points
        self._raw = None
        return [self._send_key()]

    def _install_seed(self, seed: bytes) -> None:
        self._masks = secagg.MaskGenerator(
            seed, len(self.clients), self.config.shape, ring_bits=self.config.ring_bits, label=_MASK_LABEL
        )

    @classmethod
    def receive_batch(
        cls, machines: Sequence[ProtocolMachine], sender: str, message: Message, *, round_idx: int | None = None
    ) -> list[list[Outgoing]]:
        """One aggregate to many clients of a simulation: their next statistics in one NumPy pass.

        Before each client's own :meth:`receive`, the clients that will compute their next
        update on the host from the same next centroids (the same config, round, total mask and
        previous centroids give the same centroids: one array from ``update_centroids_host``)
        get their statistics computed together: the points of all of them in one array, one
        nearest-centroid pass, per-client sums and counts by ``bincount`` over
        ``client * k + label`` (point by point in index order, as each client's own pass adds
        them, so bit for bit the same), one fixed-point encoding. Each client's ``receive`` then
        adds only its own mask. Anything that does not fit (another message, a client in another
        state, a device client, an encoding error) takes the per-client path, which checks and
        raises as usual.
        """
        if type(message) is NoisyAggregate and len(machines) > 1:
            _prepare_statistics(machines, sender, message.masked)
        return super().receive_batch(machines, sender, message, round_idx=round_idx)

    def _check_from_server(self, sender: str) -> None:
        if sender != self.server:
            raise RemoteProtocolError(
                f"{sender} is not the server", party=sender, round_idx=self.round_idx, state=self._state.name
            )

    def _on_public_keys(self, sender: str, message: PublicKeys) -> list[Outgoing]:
        self._check_from_server(sender)
        if self.client_idx != 0:
            raise RemoteProtocolError("only client 0 receives the key roster", party=sender, round_idx=0)
        if len(message.public_keys) != len(self.clients):
            raise RemoteProtocolError(
                f"key roster has {len(message.public_keys)} keys for {len(self.clients)} clients", party=sender
            )
        if message.public_keys[0] != self._public_key:
            raise RemoteProtocolError("the key roster does not hold this client's key", party=sender)
        seed = secagg.derive_bytes(self._entropy, b"fedproto/fastlloyd/seed", 32)
        sealed = tuple(
            secagg.seal_seed(self._private_key, key, seed, _seal_context(self.session, i))
            for i, key in enumerate(message.public_keys)
            if i != 0
        )
        self._install_seed(seed)
        return [self.send(self.server, SealedSeeds(sealed=sealed), phase="setup.seal"), self._update()]

    def _on_sealed_seed(self, sender: str, message: SealedSeed) -> list[Outgoing]:
        self._check_from_server(sender)
        if self.client_idx == 0:
            raise RemoteProtocolError("client 0 draws the seed; it cannot receive one", party=sender)
        try:
            seed = secagg.open_seed(
                self._private_key, message.sender_key, message.sealed, _seal_context(self.session, self.client_idx)
            )
        except ValueError as exc:
            raise RemoteProtocolError(f"the sealed mask seed does not open: {exc}", party=sender) from exc
        self._install_seed(seed)
        return [self._update()]

    def _update(self) -> Outgoing:
        if self.secagg_plus is not None:
            # The iteration opens a SecAgg+ aggregation; the update goes out in its masked-input stage.
            return self._open_aggregation(
                self.secagg_plus,
                self.client_idx,
                entropy=self._entropy,
                instance=instance_bytes(self.session, self.round_idx, _SECAGG_PURPOSE),
            )
        return self.send(self.server, MaskedUpdate(masked=self._masked_statistics()), phase="update")

    def _masked_statistics(self) -> np.ndarray:
        """This iteration's encoded statistics plus the shared-seed mask ``r_i``, ``[k, d+1]``."""
        cfg = self.config
        t = self.round_idx
        radius = cfg.radii[t]
        prepared, self._prepared = self._prepared, None
        if prepared is not None and prepared[4] is not None and prepared[0] + 1 == t and prepared[3] is self._centroids:
            # Computed with the other receivers of the aggregate in one pass (receive_batch).
            self._unassigned.append(prepared[5])
            assert self._masks is not None
            return prepared[4] + self._masks.party_mask(self.client_idx, t)  # wraps mod 2^w
        if isinstance(self._points, np.ndarray):
            # A few points: NumPy on the host, the same formulas without a jitted call's dispatch.
            sums, counts, unassigned = kmeans.local_statistics_host(
                self._points, self._centroids, float(radius), relative=cfg.relative
            )
            self._unassigned.append(unassigned)
            encoded = _encode_update(cfg, sums, counts)
            assert self._masks is not None
            return encoded + self._masks.party_mask(self.client_idx, t)  # wraps mod 2^w
        centroids = jax.numpy.asarray(self._centroids)
        if cfg.relative:
            sums, counts, unassigned = kmeans.relative_statistics(self._points, centroids, radius)
        else:
            labels, assigned, _ = kmeans.assign_clusters(self._points, centroids, radius)
            sums, counts = kmeans.cluster_statistics(self._points, labels, assigned, cfg.k)
            unassigned = int(self._points.shape[0] - int(np.sum(np.asarray(assigned))))
        self._unassigned.append(int(unassigned))
        encoded = _encode_update(cfg, np.asarray(sums, dtype=np.float64), np.asarray(counts, dtype=np.float64))
        assert self._masks is not None
        return encoded + self._masks.party_mask(self.client_idx, t)  # wraps mod 2^w

    def _secagg_input(self) -> np.ndarray:
        return self._masked_statistics().reshape(-1)

    def _on_survivor_aggregate(self, sender: str, message: SurvivorAggregate) -> list[Outgoing]:
        aggregation = self._stage(sender)
        if aggregation.stage != "done":
            raise RemoteProtocolError("an aggregate before this client revealed its shares", party=sender)
        survivors = [int(i) for i in message.survivors]
        if survivors[-1] >= len(self.clients) or self.client_idx not in survivors:
            raise RemoteProtocolError(f"the survivor list {survivors[:8]} is not valid for this client", party=sender)
        assert self._masks is not None
        # sum_{i in S} r_i = r - sum_{i not in S} r_i: one expansion per dropped client.
        mask = self._masks.total_mask(self.round_idx)
        kept = set(survivors)
        for i in range(len(self.clients)):
            if i not in kept:
                mask = mask - self._masks.party_mask(i, self.round_idx)
        self._aggregation = None
        return self._unmask_aggregate(sender, message.masked, mask)

    def _on_aggregate(self, sender: str, message: NoisyAggregate) -> list[Outgoing]:
        self._check_from_server(sender)
        if self.secagg_plus is not None:
            raise RemoteProtocolError("an MSA aggregate in a SecAgg+ run", party=sender, round_idx=self.round_idx)
        assert self._masks is not None
        return self._unmask_aggregate(sender, message.masked, self._masks.total_mask(self.round_idx))

    def _next_centroids(self, masked: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The noisy counts ``[k]`` and the next centroids ``[k, d]`` from an aggregate and its mask."""
        cfg = self.config
        unmasked = masked - mask
        sums = secagg.decode_fixed(unmasked[:, : cfg.d], frac_bits=cfg.frac_bits, ring_bits=cfg.ring_bits)
        counts = secagg.decode_fixed(unmasked[:, cfg.d], frac_bits=cfg.count_frac_bits, ring_bits=cfg.ring_bits)
        radius = cfg.radii[self.round_idx] if cfg.clip else math.inf
        update = _kernels.update_centroids_host if cfg.k * cfg.d <= kmeans.HOST_ELEMENTS else _kernels.update_centroids
        new = update(sums, counts, self._centroids, radius, relative=cfg.relative, post=cfg.post, bound=cfg.bound)
        return counts, np.asarray(new, dtype=np.float64)

    def _unmask_aggregate(self, sender: str, masked: np.ndarray, mask: np.ndarray) -> list[Outgoing]:
        cfg = self.config
        _check_ring_values(cfg, masked, "aggregate", sender, self.round_idx)
        prepared = self._prepared
        if prepared is not None and prepared[0] == self.round_idx and prepared[1] is masked:
            counts, self._centroids = prepared[2], prepared[3]  # receive_batch unmasked this aggregate
        else:
            self._prepared = None
            counts, self._centroids = self._next_centroids(masked, mask)
        self._noisy_counts.append(counts)
        self._history.append(self._centroids)
        self.round_idx += 1
        if self.round_idx == cfg.iterations:
            self._finish(
                FastLloydResult(
                    centroids=self._centroids,
                    history=np.stack(self._history),
                    unassigned=np.asarray(self._unassigned, dtype=np.int64),
                    noisy_counts=np.stack(self._noisy_counts),
                )
            )
            return []
        return [self._update()]


def _prepare_statistics(machines: Sequence[ProtocolMachine], sender: str, masked: np.ndarray) -> None:
    """Stash the next round's encoded statistics in every client that can use them (see
    :meth:`FastLloydClient.receive_batch`); leave the others alone."""
    first = machines[0]
    if not isinstance(first, FastLloydClient) or first.config is None:
        return
    cfg, t = first.config, first.round_idx
    if t + 1 >= cfg.iterations or masked.shape != cfg.shape or masked.dtype != secagg.ring_dtype(cfg.ring_bits):
        return  # the last aggregate needs no statistics; a malformed one is refused per client
    groups: dict[int, tuple[np.ndarray, list[FastLloydClient]]] = {}
    for m in machines:
        if (
            not isinstance(m, FastLloydClient) or m.config is not cfg or m.state is not ClientState.ITERATING
            or m.round_idx != t or m.secagg_plus is not None or m._masks is None or sender != m.server
            or not isinstance(m._points, np.ndarray)
        ):
            continue
        counts, centroids = m._next_centroids(masked, m._masks.total_mask(t))
        m._prepared = (t, masked, counts, centroids, None, 0)
        groups.setdefault(id(centroids), (centroids, []))[1].append(m)
    for centroids, group in groups.values():
        if len(group) < 2:
            continue  # centroids no other client shares (the device path makes new arrays): per client
        sizes = np.fromiter((m._points.shape[0] for m in group), dtype=np.int64, count=len(group))
        points = np.concatenate([m._points for m in group])
        sums, counts, assigned = _batched_statistics(points, sizes, centroids, float(cfg.radii[t + 1]), cfg.relative)
        try:
            encoded = np.concatenate(
                [
                    secagg.encode_fixed(sums, frac_bits=cfg.frac_bits, ring_bits=cfg.ring_bits),
                    secagg.encode_fixed(counts, frac_bits=cfg.count_frac_bits, ring_bits=cfg.ring_bits)[..., None],
                ],
                axis=2,
            )
        except ValueError:
            continue  # an overflow: each client raises its own error on its own path
        unassigned = (sizes - assigned).tolist()
        for i, m in enumerate(group):
            prepared = m._prepared
            assert prepared is not None
            m._prepared = (t, masked, prepared[2], centroids, encoded[i], unassigned[i])


def _batched_statistics(
    points: np.ndarray, sizes: np.ndarray, centroids: np.ndarray, radius: float, relative: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`kmeans.local_statistics_host` of many clients at once.

    Args:
        points: every client's points, concatenated in client order, float64 ``[N, d]``.
        sizes: points per client, int64 ``[G]`` (summing to N).
        centroids: float64 ``[k, d]``.
        radius: the round's radius.
        relative: relative sums (FastLloyd) or absolute ones.

    Returns:
        ``(sums [G, k, d], counts [G, k], assigned [G])`` float64, float64, int64: each client's
        values bit for bit as its own call computes them.
    """
    k, d = centroids.shape
    groups = sizes.shape[0]
    diff = points[:, None, :] - centroids[None, :, :]
    sq = np.sum(diff * diff, axis=-1)
    labels = np.argmin(sq, axis=1)
    assigned = np.sqrt(sq[np.arange(points.shape[0]), labels]) < radius
    rows = points - centroids[labels] if relative else points
    owner = np.repeat(np.arange(groups), sizes)
    bins = (owner * k + labels)[assigned]
    rows = rows[assigned]
    sums = np.empty((groups * k, d))
    for j in range(d):
        sums[:, j] = np.bincount(bins, weights=rows[:, j], minlength=groups * k)
    counts = np.bincount(bins, minlength=groups * k).astype(np.float64)
    per_client = np.bincount(owner[assigned], minlength=groups)
    return sums.reshape(groups, k, d), counts.reshape(groups, k), per_client


class FastLloydServer(ProtocolMachine):
    """The FastLloyd server (sans-IO): agrees the federation's quantities, relays the seed setup,
    aggregates and adds noise.

    Give exactly one of ``config`` and ``options`` (see the module docstring).

    Args:
        party: the server's party name.
        config: the run's public parameters, when known in advance (no ``setup.data``).
        options: the run's public options: the server holds no data, collects each client's
            count and extent in ``setup.data``, checks that every client has the same number of
            features, and derives :attr:`config` from the options at the total N.
        clients: every client's party name, in client order.
        noise_seed: seed of the server's noise key (``jax.random``; folded with the round index).
        session: the run's session id (names each SecAgg+ aggregation, and seeds its graph).
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
            given with ``options``. In ``setup.data`` (the machine fails):
            :class:`~fedproto.errors.RemoteProtocolError` naming the clients whose number of
            features differs from the others' (the most common, ties going to the earliest
            client), ``ValueError`` when the clients hold no point or the options do not fit N
            (e.g. ``k > N``).
    """

    State = ServerState
    INITIAL_STATE = ServerState.SETUP_DATA
    TRANSITIONS = {
        (ServerState.SETUP_DATA, DataSummary): ("_on_data_summary", ServerState.SETUP_DATA),
        (ServerState.SETUP_KEYS, PublicKey): ("_on_public_key", ServerState.SETUP_KEYS),
        (ServerState.SETUP_SEAL, SealedSeeds): ("_on_sealed_seeds", ServerState.COLLECT),
        (ServerState.COLLECT, MaskedUpdate): ("_on_update", ServerState.COLLECT),
        (ServerState.COLLECT, AdvertiseKeys): ("_on_stage", ServerState.COLLECT),
        (ServerState.COLLECT, EncryptedShares): ("_on_stage", ServerState.COLLECT),
        (ServerState.COLLECT, MaskedInput): ("_on_stage", ServerState.COLLECT),
        (ServerState.COLLECT, UnmaskShares): ("_on_stage", ServerState.COLLECT),
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
        clients = tuple(clients)
        if not clients or len(set(clients)) != len(clients) or party in clients:
            raise ValueError("clients must be unique, non-empty and must not include the server")
        _one_of(config, options, secagg_plus)
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
        self._key = jax.random.PRNGKey(noise_seed)
        self._keys: dict[str, bytes] = {}
        self._updates: dict[str, np.ndarray] = {}
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

    def _ignores(self, sender: str) -> bool:
        return sender in self._gone

    def _open_aggregation(self) -> list[Outgoing]:
        assert self.secagg_plus is not None
        from fedproto.algorithms.secagg_plus.engine import SecAggPlusServer

        self._aggregation = SecAggPlusServer(
            self.secagg_plus,
            self.clients,
            round_idx=self.round_idx,
            instance=instance_bytes(self.session, self.round_idx, _SECAGG_PURPOSE),
            active=self._active,
        )
        return self._aggregation.drop(self._gone)

    def _on_stage(self, sender: str, message) -> list[Outgoing]:
        if self._aggregation is None:
            raise RemoteProtocolError(
                f"a SecAgg+ message from {sender} in a run without SecAgg+", party=sender, round_idx=self.round_idx
            )
        return self._after_stage(self._aggregation.receive(sender, message))

    def carries_on_without(self, party: str) -> bool:
        """With SecAgg+, while it collects, a client's failure notice is that client's dropout."""
        return self._aggregation is not None and self._state is ServerState.COLLECT and party in self._client_index

    def _on_event(self, event: Event) -> list[Outgoing]:
        if self._aggregation is not None and self._state is ServerState.COLLECT:
            if isinstance(event, PhaseTimedOut):
                silent = list(self.pending())
                self._gone.update(silent)
                return self._after_stage(self._aggregation.drop(silent))
            if isinstance(event, PartyDropped) and event.party in self._client_index:
                self._gone.add(event.party)
                return self._after_stage(self._aggregation.drop([event.party]))
        return super()._on_event(event)

    def _after_stage(self, out: list[Outgoing]) -> list[Outgoing]:
        aggregation = self._aggregation
        assert aggregation is not None
        outcome = aggregation.outcome
        if outcome is None:
            return out
        for party, stage in outcome.dropouts.items():
            self._dropouts[party] = (self.round_idx, stage)
            self._gone.add(party)
        self._survivors.append(outcome.survivors)
        cfg = self.config
        total = outcome.total.reshape(cfg.shape) + self._noise()  # wraps mod 2^w
        index = self._client_index
        survivors = np.asarray([index[c] for c in outcome.survivors], dtype=np.uint32)
        receivers = tuple(c for c in outcome.survivors if c not in self._gone)
        out.append(self.broadcast(receivers, SurvivorAggregate(masked=total, survivors=survivors), phase="aggregate"))
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

    def _check_client(self, sender: str, seen: dict) -> None:
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
        tally = Counter(widths.values())
        # the most common width; ties go to the width of the earliest client holding one of them
        d = max(tally, key=lambda w: (tally[w], -min(i for i, c in enumerate(self.clients) if widths[c] == w)))
        odd = [c for c in self.clients if widths[c] != d]
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
        plus = _secagg_plus_for(options, config, len(self.clients), self.session)
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
        _check_ring_values(self.config, message.masked, "update", sender, self.round_idx)
        self._updates[sender] = message.masked
        return []

    def _advance(self) -> list[Outgoing]:
        if self._state is ServerState.SETUP_DATA and self.options is not None and len(self._summaries) == len(self.clients):
            return self._agree_data()
        if self._state is ServerState.SETUP_KEYS and len(self._keys) == len(self.clients):
            keys = tuple(self._keys[c] for c in self.clients)
            out = self.send(self.clients[0], PublicKeys(public_keys=keys), phase="setup.roster")
            self.move_to(ServerState.SETUP_SEAL)
            return [out]
        if self._state is ServerState.COLLECT and self.secagg_plus is None and len(self._updates) == len(self.clients):
            return [self._aggregate()]
        return []

    def _noise(self) -> np.ndarray:
        cfg = self.config
        t = self.round_idx
        key_sum, key_count = jax.random.split(jax.random.fold_in(self._key, t))
        k, d = cfg.k, cfg.d
        if cfg.noise == "gaussian":
            noise_sum = kmeans.gaussian_noise(key_sum, (k, d), cfg.noise_sum[t])
            noise_count = kmeans.gaussian_noise(key_count, (k,), cfg.noise_count[t])
        elif cfg.noise == "laplace":
            noise_sum = kmeans.laplace_noise(key_sum, (k, d), cfg.noise_sum[t])
            noise_count = kmeans.laplace_noise(key_count, (k,), cfg.noise_count[t])
        else:
            return np.zeros(cfg.shape, dtype=secagg.ring_dtype(cfg.ring_bits))
        q_sum = secagg.quantize_noise(np.asarray(noise_sum), frac_bits=cfg.frac_bits, ring_bits=cfg.ring_bits)
        q_count = secagg.quantize_noise(np.asarray(noise_count), frac_bits=cfg.count_frac_bits, ring_bits=cfg.ring_bits)
        return np.concatenate([q_sum, q_count[:, None]], axis=1)

    def _aggregate(self) -> Outgoing:
        cfg = self.config
        dtype = secagg.ring_dtype(cfg.ring_bits)
        total = np.zeros(cfg.shape, dtype=dtype)
        for client in self.clients:
            total += self._updates[client]  # wraps mod 2^w
        total += self._noise()
        out = self.broadcast(self.clients, NoisyAggregate(masked=total), phase="aggregate")
        self._updates = {}
        self.round_idx += 1
        if self.round_idx == cfg.iterations:
            self._finish(self._summary())
        return out

"""MUFC as protocol machines: one-shot secure federated clustering and federated unlearning.

Theory of operation (Pan et al., ICLR 2023, Algorithms 1, 2 and 4; spec mufc.md 1.10, 2, 3.5):

Roles: one :class:`MUFCServer` and ``L`` :class:`MUFCClient` machines (``client-0`` ...). All
public parameters (K, the grid, the prime p, T = 2KL, the modes) are in :class:`MUFCConfig`,
which every party is built with.

Round 0, phase ``setup.data`` (only for machines built with ``setup=``, a
:class:`~fedproto.algorithms.mufc.setup.DataSetup`: each client holds only its raw rows, the
server no data; :mod:`fedproto.algorithms.mufc.setup`): each client sends its count and per-feature
extent (:class:`DataSummary`); the server checks that the clients agree on d, combines them and
sends every client every count and the federation's extent (:class:`FederationSummary`). Every
party then computes the same :class:`MUFCConfig` (n, the grid, p, T), each client scales its rows
into the unit box by the federation's extent, numbers them and takes its removal requests from the
public stream. Machines built with ``config=`` (data already scaled, ids and requests given) skip it.

Round 0, phase ``setup``: each client sends its X25519 :class:`PublicKey`; the server sends every
client :class:`PeerKeys` (all keys). Each pair of clients now shares a mask seed the server does
not know (Diffie-Hellman + HKDF, :func:`fedproto.algorithms.scma.pairwise_seed`).

Round 0, phase ``aggregate`` (Algorithm 1): each client has run K-means++ seeding on its data
(:class:`~fedproto.algorithms.mufc.seeding.LocalSeeding`), assigned its points to the nearest seed and
written each cluster's size into the grid bin of its seed (the sparse count vector q^(l), at most
K non-zeros); it sends the ``T`` power-sum syndromes of q^(l) over F_p plus its zero-sum pairwise
mask (:class:`MaskedSyndromes`, ``T * ceil(bitlength(p) / 8)`` payload bytes). The server sums
the shares (the masks cancel), decodes q = sum_l q^(l) exactly (Berlekamp-Massey, roots,
Forney; :func:`fedproto.algorithms.scma.decode_syndromes`), builds the weighted bin centres (or uniform
samples inside the bins) and runs K-means++ with Lloyd's iterations. Phase ``model``: the server
sends the centroids to every active client (:class:`ModelUpdate`, version 0).

Removal request ``s`` (round ``s``, Algorithm 4): the client holding the points runs Algorithm 3
(re-seeds only from the first removed seed onward) and sends a :class:`RemovalRequest` (phase
``removal``; no data), or leaves the federation (``whole_client``: no computation, it simply stops
contributing). The server opens round ``s`` among the remaining clients
(:class:`AggregationRequest`); every active client uploads its syndromes with fresh masks
(unaffected clients resend their cached q^(l), so their unmasked syndromes are unchanged); the
server decodes q' and re-clusters iff the mode asks for it, then sends version ``s``. A client
without a request expands its mask for the next round as soon as it has the model (masks depend
only on the active set and the round), so its share costs one addition when the round opens.

Unlearning modes (spec 3.5): ``exact`` (default: the requesting client always refreshes q^(l),
so q' != q and the server always re-clusters; the pipeline's output is distributed exactly as a
retrain on the remaining data), ``literal`` (the paper's wording: q^(l) is refreshed only when the
client re-seeds; the server keeps C_s when q' = q, so its model may still count removed points) and
``lazy`` (the authors' code: the server re-clusters only when the support of q changes, i.e. when
a seed moved). Only ``exact`` is exact.

Randomness: client ``c`` seeds with ``fold_in(key, c + 1)``, the server clusters with
``fold_in(key, 0)``. By default removals reuse these keys (coupled randomness: the model after any
removal stream equals a from-scratch run on the remaining data with the same key, which is
checkable exactly); ``fresh_randomness`` draws the re-seeded positions and the server's run from
keys folded with the round, which is exact in distribution (Lemma 5.1).

Dropout: a client silent past the phase deadline during an aggregation is named in an
:class:`~fedproto.errors.InsufficientParticipants` error, unless ``min_clients`` allows going on:
then the server drops the silent clients and re-opens the round among the others with fresh masks
(``attempt`` + 1); the dropped clients' data are no longer in the model (their late shares are
refused). Pairwise masks cannot be unmasked without every active share (no Shamir recovery, spec
2.3), which is why the round is re-run rather than completed. A share that fails decoding (a
corrupted or overloaded share) ends the run with :class:`~fedproto.algorithms.scma.SyndromeDecodingError`;
a wrong sum is never returned.

With SecAgg+ (``secagg_plus=`` a :class:`~fedproto.algorithms.secagg_plus.engine.SecAggPlusConfig`
over ``F_p`` with vectors of ``T`` elements, :func:`secagg_plus_config`; ``fedproto run mufc
--secagg plus`` or ``complete``), every aggregation, training (round 0) and each removal round,
is one SecAgg+ instance among the active clients (:mod:`fedproto.algorithms.secagg_plus.engine`;
phases ``advertise-keys``, ``share-keys``, ``masked-input``, ``unmask``), and the setup above is
not run (SecAgg+ draws fresh keys for every instance):

* each client's input is its *unmasked* syndromes (SecAgg+ adds the masks); the server obtains the
  syndrome sum of the survivors, exactly what SCMA reveals for the same clients, and decodes and
  clusters it as above, then sends :class:`ModelUpdate` to the survivors;
* a client advertises its keys for round ``s`` as soon as it has the model of round ``s - 1`` (the
  requesting client after its :class:`RemovalRequest`; a leaving client sends its request and
  nothing else), so the server opens round ``s`` at once and needs no :class:`AggregationRequest`;
  a request only names a leaving client (it is then absent from the instance, not a dropout);
* dropout: a client silent past the deadline, or reported gone by the transport, at any stage
  is dropped (:meth:`SecAggPlusServer.drop`); the round completes with the survivors (no
  re-opening, no extra round) whenever SecAgg+ can still remove the masks (t surviving
  neighbours), else :class:`~fedproto.errors.InsufficientParticipants` names the parties. A
  dropped client leaves the federation: its data leave the model from the next aggregation on
  (one that dropped at ``unmask`` had its input in that round's sum already) and its late frames
  are ignored. ``min_clients`` is kept as a quorum on the clients still in the federation;
  unset, it means no quorum beyond SecAgg+'s own threshold. The server's result records
  ``{party: (round_idx, stage)}``.

References:
    Bell, Bonawitz, Gascon, Lepoint, Raykova, "Secure Single-Server Aggregation with
    (Poly)Logarithmic Overhead", ACM CCS 2020, Sec. 3; Bonawitz et al., ACM CCS 2017, Fig. 4.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from fedproto.algorithms import scma
from fedproto.algorithms.mufc.clustering import PaddedPoints, server_points
from fedproto.algorithms.mufc.data import Federation
from fedproto.algorithms.mufc.messages import (
    AggregationRequest,
    DataSummary,
    FederationSummary,
    MaskedSyndromes,
    ModelUpdate,
    PeerKeys,
    PublicKey,
    RemovalRequest,
)
from fedproto.algorithms.mufc.quantize import Grid, make_grid
from fedproto.algorithms.mufc.seeding import LocalSeeding
from fedproto.algorithms.secagg import derive_bytes, x25519_keypair
from fedproto.data import feature_extent
from fedproto.algorithms.secagg_plus.engine import (
    STAGES,
    Modulus,
    SecAggPlusClient,
    SecAggPlusConfig,
    SecAggPlusServer,
    complete_config,
    plus_config,
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
from fedproto.errors import InsufficientParticipants, RemoteProtocolError
from fedproto.machine import ProtocolMachine, party_index
from fedproto.messages import Event, Message, Outgoing, PartyDropped, PhaseTimedOut

if TYPE_CHECKING:
    from fedproto.algorithms.mufc.setup import DataSetup

__all__ = [
    "MODES",
    "SERVER",
    "MUFCClient",
    "MUFCClientResult",
    "MUFCConfig",
    "MUFCParties",
    "MUFCServer",
    "MUFCServerResult",
    "ServerModel",
    "SECAGG_CHOICES",
    "bin_powers_ahead",
    "check_secagg_plus",
    "client_key_entropy",
    "make_config",
    "refresh_syndromes",
    "secagg_plus_config",
]

SERVER = "server"
MODES = ("exact", "literal", "lazy")
SERVER_MODES = ("weighted", "uniform")
#: Attempts per round are folded into the mask stream id below this many bits.
_ATTEMPT_BITS = 16
#: ``--secagg`` choices: the paper's SCMA pairwise masking, SecAgg+ on a sparse random graph, or
#: classic SecAgg (the complete graph).
SECAGG_CHOICES = ("scma", "plus", "complete")
_SECAGG_PURPOSE = b"fedproto/mufc/secagg-plus"
_SECAGG_GRAPH = b"fedproto/mufc/secagg-graph"
_SECAGG_ENTROPY = b"fedproto/mufc/secagg-plus/entropy"


@dataclasses.dataclass(frozen=True)
class MUFCConfig:
    """The public parameters of one MUFC run (agreed before it starts; spec 1.2).

    Attributes:
        k: clusters at the server (K).
        k_client: seeds per client (the paper's K; the authors' ``k_prime`` in non-i.i.d. runs).
        n_clients: L, the clients at the start.
        grid: the quantization grid (gamma, box, bins per dimension B, B^d bins).
        prime: p > max(n, B^d), the field of the syndromes.
        n_syndromes: T = 2 * k_client * L.
        server_mode: ``weighted`` (bin centres with weights) or ``uniform`` (samples in the bins).
        unlearning: ``exact``, ``literal`` or ``lazy`` (see the module docstring).
        n_init: K-means++ restarts at the server (best weighted cost wins).
        max_iter: Lloyd iterations cap at the server.
        lloyd_iterations: Lloyd iterations at the clients after seeding (0 = MUFC; > 0 = the
            "complete client training" variant of App. M.3, where every removal retrains).
        fresh_randomness: re-seeding and re-clustering draw fresh keys per round.
        min_clients: fewest clients an aggregation may go on with after dropouts (default: all
            with SCMA; with SecAgg+, no quorum beyond what SecAgg+ itself can recover).
    """

    k: int
    k_client: int
    n_clients: int
    grid: Grid
    prime: int
    n_syndromes: int
    server_mode: str = "weighted"
    unlearning: str = "exact"
    n_init: int = 10
    max_iter: int = 300
    lloyd_iterations: int = 0
    fresh_randomness: bool = False
    min_clients: int | None = None

    def __post_init__(self) -> None:
        if self.k < 1 or self.k_client < 1 or self.n_clients < 1:
            raise ValueError("k, k_client and n_clients must be at least 1")
        if self.n_syndromes != 2 * self.k_client * self.n_clients:
            raise ValueError("n_syndromes must be 2 * k_client * n_clients")
        if self.server_mode not in SERVER_MODES:
            raise ValueError(f"server_mode must be one of {SERVER_MODES}")
        if self.unlearning not in MODES:
            raise ValueError(f"unlearning must be one of {MODES}")
        if self.prime <= self.grid.n_bins:
            raise ValueError("the prime must exceed the number of bins B^d")
        if self.n_init < 1 or self.max_iter < 1 or self.lloyd_iterations < 0:
            raise ValueError("n_init and max_iter must be positive, lloyd_iterations non-negative")
        if self.min_clients is not None and not 1 <= self.min_clients <= self.n_clients:
            raise ValueError("min_clients must lie in [1, n_clients]")

    @property
    def width(self) -> int:
        """Bytes per field element on the wire, ceil(bitlength(p) / 8)."""
        return scma.field_width(self.prime)

    @property
    def quorum(self) -> int:
        """Fewest clients an aggregation may finish with."""
        return self.n_clients if self.min_clients is None else self.min_clients

    def syndrome_bytes(self) -> int:
        """Analytic payload of one :class:`MaskedSyndromes`: ``T * width`` bytes (spec 1.10)."""
        return self.n_syndromes * self.width


def make_config(
    n: int,
    d: int,
    k: int,
    n_clients: int,
    *,
    k_client: int | None = None,
    gamma: float | None = None,
    lo: float = 0.0,
    hi: float = 1.0,
    **options: Any,
) -> MUFCConfig:
    """The public parameters for ``n`` points in ``[lo, hi]^d`` over ``n_clients`` clients.

    gamma defaults to 1/sqrt(n) (spec 1.2) and p to the smallest prime above max(n, B^d).

    Raises:
        ValueError: a parameter out of range.
    """
    if n < 1 or d < 1:
        raise ValueError("n and d must be positive")
    grid = make_grid(n, d, lo=lo, hi=hi, gamma=gamma)
    kc = k if k_client is None else k_client
    return MUFCConfig(
        k=k,
        k_client=kc,
        n_clients=n_clients,
        grid=grid,
        prime=scma.field_prime(n, grid.n_bins),
        n_syndromes=2 * kc * n_clients,
        **options,
    )


def _remote(message: str, sender: str, machine: ProtocolMachine) -> RemoteProtocolError:
    return RemoteProtocolError(message, party=sender, round_idx=machine.round_idx, state=machine.state.name)


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


def secagg_plus_config(config: MUFCConfig, kind: str = "plus", *, session: int = 0) -> SecAggPlusConfig | None:
    """The SecAgg+ parameters of a MUFC run: ``L`` clients, vectors of ``T`` elements of ``F_p``.

    Args:
        config: the run's public parameters.
        kind: ``scma`` (no SecAgg+: returns ``None``), ``plus`` (a random k-regular graph with
            Bell et al.'s (k, t); the complete graph where L is too small for their bounds) or
            ``complete`` (classic SecAgg).
        session: the run's session id; the graph seed is public, SHA-256 of a label and it.

    Raises:
        ValueError: an unknown ``kind``, or fewer than 2 clients.

    References:
        Bell et al., ACM CCS 2020, Sec. 3-4; Bonawitz et al., ACM CCS 2017, Sec. 4.
    """
    if kind not in SECAGG_CHOICES:
        raise ValueError(f"secure aggregation must be one of {SECAGG_CHOICES}, got {kind!r}")
    if kind == "scma":
        return None
    if config.n_clients < 2:
        raise ValueError(f"SecAgg+ needs at least 2 clients, the run has {config.n_clients}")
    seed = hashlib.sha256(_SECAGG_GRAPH + session.to_bytes(8, "big")).digest()
    build = plus_config if kind == "plus" else complete_config
    return build(config.n_clients, config.n_syndromes, Modulus.field(config.prime), graph_seed=seed)


def check_secagg_plus(config: MUFCConfig, secagg_plus: SecAggPlusConfig | None) -> None:
    """Refuse SecAgg+ parameters that do not fit the run (``None`` always fits).

    Raises:
        TypeError: not a :class:`SecAggPlusConfig`.
        ValueError: another field than ``F_p``, another vector length than ``T`` or another
            client count than ``L``.
    """
    if secagg_plus is None:
        return
    if not isinstance(secagg_plus, SecAggPlusConfig):
        raise TypeError(f"secagg_plus must be a SecAggPlusConfig or None, got {type(secagg_plus).__name__}")
    if secagg_plus.modulus.prime != config.prime:
        raise ValueError(f"SecAgg+ sums in {secagg_plus.modulus.describe()}, the syndromes live in F_{config.prime}")
    if secagg_plus.vector_length != config.n_syndromes or secagg_plus.n_clients != config.n_clients:
        raise ValueError(
            f"SecAgg+ is configured for {secagg_plus.n_clients} clients and vectors of {secagg_plus.vector_length}; "
            f"the run has L = {config.n_clients} clients and T = {config.n_syndromes} syndromes"
        )


# ------------------------------------------------------------------------------------- server


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


class ServerState(enum.Enum):
    """States of the MUFC server."""

    DATA = enum.auto()
    KEYS = enum.auto()
    AGGREGATE = enum.auto()
    SERVING = enum.auto()
    DONE = enum.auto()
    ERROR = enum.auto()


class MUFCServer(ProtocolMachine):
    """The MUFC server: relays public keys, decodes the aggregate, clusters, serves removals.

    Args:
        party: the server's name; clients: every client's name, in client-index order.
        config: the public parameters; key: the server's `jax.random` key.
        n_requests: the removal requests the run serves (it ends after the last).
        n_points: the public total n (checked against the first decoded sum).
        session: the run's session id (names each SecAgg+ instance; unused with SCMA).
        secagg_plus: aggregate with SecAgg+ under these parameters (the clients' must be the
            same; see the module docstring); ``None`` (default) is the paper's SCMA.
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
    TRANSITIONS = {
        (ServerState.DATA, DataSummary): ("_on_data_summary", ServerState.DATA),
        (ServerState.KEYS, PublicKey): ("_on_key", ServerState.KEYS),
        (ServerState.AGGREGATE, MaskedSyndromes): ("_on_share", ServerState.AGGREGATE),
        (ServerState.AGGREGATE, RemovalRequest): ("_on_early_request", ServerState.AGGREGATE),
        (ServerState.AGGREGATE, AdvertiseKeys): ("_on_stage", ServerState.AGGREGATE),
        (ServerState.AGGREGATE, EncryptedShares): ("_on_stage", ServerState.AGGREGATE),
        (ServerState.AGGREGATE, MaskedInput): ("_on_stage", ServerState.AGGREGATE),
        (ServerState.AGGREGATE, UnmaskShares): ("_on_stage", ServerState.AGGREGATE),
        (ServerState.SERVING, RemovalRequest): ("_on_request", ServerState.SERVING),
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
        clients = tuple(clients)
        if (config is None) == (setup is None):
            raise ValueError("give the server either config (and n_points) or setup")
        n_clients = config.n_clients if config is not None else setup.n_clients  # type: ignore[union-attr]
        if len(clients) != n_clients or len(set(clients)) != len(clients) or party in clients:
            raise ValueError("clients must be config.n_clients unique names, not including the server")
        if n_requests < 0 or (config is not None and (n_points is None or n_points < 1)):
            raise ValueError("n_requests must be non-negative and n_points positive")
        if setup is not None and (n_points is not None or secagg_plus is not None or n_requests != setup.n_requests):
            raise ValueError("with setup, n_points and secagg_plus are agreed in setup.data and n_requests is "
                             "setup.n_requests")
        self.clients, self.key = clients, key
        self.n_requests = n_requests
        self.session, self.secagg_plus = session, None
        self._setup = setup
        self._summaries: dict[str, DataSummary] = {}
        self.federation: Federation | None = None
        self._index = {name: i for i, name in enumerate(clients)}
        self._keys: dict[str, bytes] = {}
        self._active: tuple[int, ...] = tuple(range(len(clients)))
        self._dropped: list[int] = []
        self._dropouts: dict[str, tuple[int, str]] = {}
        self._attempt = 0
        self._shares: dict[int, tuple[int, ...]] = {}
        self._queued: list[tuple[str, RemovalRequest]] = []
        self._history: list[np.ndarray] = []
        self._totals: list[int] = []
        self._supports: list[int] = []
        self._reclustered: list[bool] = []
        # SecAgg+ only: the running instance, the clients counted as gone (dropped; their late
        # frames are ignored), the clients leaving in this round, the requests of this round, and
        # the keys advertised in this round (to re-open the instance without a leaving client).
        self._aggregation: SecAggPlusServer | None = None
        self._gone: set[str] = set()
        self._leaving: set[str] = set()
        self._round_requests = 0
        self._advertised: list[tuple[str, AdvertiseKeys]] = []
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
            self.move_to(ServerState.AGGREGATE)  # no key setup: SecAgg+ keys are fresh per instance
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

    def _ignores(self, sender: str) -> bool:
        return sender in self._gone

    def _client_index(self, sender: str) -> int:
        c = self._index.get(sender)
        if c is None:
            raise _remote(f"{sender} is not a client of this run", sender, self)
        return c

    def _on_data_summary(self, sender: str, message: DataSummary) -> list[Outgoing]:
        """``setup.data``: collect every client's count and extent; once all are in, check that
        the clients agree on d, agree the run's parameters and send every client every count and
        the federation's extent (then the run goes on as if built with them)."""
        self._client_index(sender)
        if sender in self._summaries:
            raise _remote(f"second data summary from {sender}", sender, self)
        self._summaries[sender] = message
        if len(self._summaries) < len(self.clients):
            return []
        summaries = [self._summaries[c] for c in self.clients]
        dims = [int(summary.extent.shape[1]) for summary in summaries]
        d = max(dims, key=lambda v: (dims.count(v), -dims.index(v)))  # the most clients' d (ties: the first's)
        odd = [c for c, v in zip(self.clients, dims, strict=True) if v != d]
        if odd:
            described = ", ".join(f"{c} has {dims[self._index[c]]}" for c in odd)
            raise RemoteProtocolError(
                f"the clients' points do not have the same number of features: {described}, the other clients "
                f"{d}", party=odd[0] if len(odd) == 1 else None, round_idx=self.round_idx, state=self._state.name,
                phase=self.phase)
        federation = Federation.combine([s.n_points for s in summaries], [s.extent for s in summaries])
        assert self._setup is not None
        agreement = self._setup.configure(federation, self.session)
        self.federation, self._summaries = federation, {}
        summary = FederationSummary(client_points=np.asarray(federation.client_points, dtype=np.int64),
                                    extent=federation.extent)
        out = [self.broadcast(self.clients, summary, phase="setup.data")]
        self.move_to(ServerState.KEYS)
        self._configure(agreement.config, federation.n, agreement.secagg_plus)
        return out

    def _on_key(self, sender: str, message: PublicKey) -> list[Outgoing]:
        self._client_index(sender)
        if sender in self._keys:
            raise _remote(f"second public key from {sender}", sender, self)
        self._keys[sender] = message.public_key
        if len(self._keys) < len(self.clients):
            return []
        keys = tuple(self._keys[c] for c in self.clients)
        if len(set(keys)) != len(keys):
            raise _remote("two clients announced the same public key", sender, self)
        self.move_to(ServerState.AGGREGATE)
        return [self.broadcast(self.clients, PeerKeys(keys=keys), phase="setup")]

    def _on_share(self, sender: str, message: MaskedSyndromes) -> list[Outgoing]:
        c = self._client_index(sender)
        if self._aggregation is not None:
            raise _remote(f"an SCMA share from {sender} in a SecAgg+ run", sender, self)
        if c in self._dropped:
            return []  # a late share of a client dropped after the deadline: refused, round goes on
        if c not in self._active:
            raise _remote(f"{sender} is not active in this aggregation", sender, self)
        if message.attempt != self._attempt:
            raise _remote(f"{sender}'s share is for attempt {message.attempt}, not {self._attempt}", sender, self)
        if c in self._shares:
            raise _remote(f"second share from {sender} in this aggregation", sender, self)
        cfg = self.config
        if message.width != cfg.width or len(message.values) != cfg.n_syndromes:
            raise _remote(
                f"{sender} sent {len(message.values)} elements of {message.width} bytes; "
                f"expected {cfg.n_syndromes} of {cfg.width}",
                sender,
                self,
            )
        try:
            scma.check_packed("values", message.values, cfg.prime, cfg.n_syndromes)
        except ValueError:
            raise _remote(f"{sender} sent a value outside F_p", sender, self) from None
        self._shares[c] = message.values
        return []

    def _on_early_request(self, sender: str, message: RemovalRequest) -> list[Outgoing]:
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
        out: list[Outgoing] = [
            self.broadcast(
                dests, ModelUpdate(version=version, reclustered=recluster, centroids=self._history[-1]), phase="model"
            )
        ]
        if version == self.n_requests:
            if self._queued:
                raise _remote("more removal requests than the run serves", self._queued[0][0], self)
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
            # Every client still in the federation advertises its keys for the next round as
            # soon as it has this model: the next instance opens now.
            self._leaving, self._round_requests, self._advertised = set(), 0, []
            self._aggregation = self._new_aggregation()
            return out
        self.move_to(ServerState.SERVING)
        return out

    def _on_request(self, sender: str, message: RemovalRequest) -> list[Outgoing]:
        c = self._client_index(sender)
        if c not in self._active:
            raise _remote(f"{sender} has left the federation and cannot request removals", sender, self)
        if message.whole_client:
            if len(self._active) == 1:
                raise _remote(f"{sender} is the last client; the federation would be empty", sender, self)
            self._active = tuple(i for i in self._active if i != c)
        self.move_to(ServerState.AGGREGATE)
        return [self._open()]

    def _open(self) -> Outgoing:
        dests = [self.clients[c] for c in self._active]
        return self.broadcast(dests, AggregationRequest(active=self._active, attempt=self._attempt), phase="aggregate")

    # -- SecAgg+ ---------------------------------------------------------------------------------

    def _new_aggregation(self) -> SecAggPlusServer:
        assert self.secagg_plus is not None
        return SecAggPlusServer(
            self.secagg_plus,
            self.clients,
            round_idx=self.round_idx,
            instance=instance_bytes(self.session, self.round_idx, _SECAGG_PURPOSE),
            active=[self.clients[c] for c in self._active if self.clients[c] not in self._leaving],
        )

    def _on_stage(self, sender: str, message: Message) -> list[Outgoing]:
        if self._aggregation is None:
            raise _remote(f"a SecAgg+ message from {sender} in a run without SecAgg+", sender, self)
        out = self._aggregation.receive(sender, message)
        if isinstance(message, AdvertiseKeys):
            self._advertised.append((sender, message))
        return self._after_stage(out)

    def _on_secagg_request(self, sender: str, message: RemovalRequest) -> list[Outgoing]:
        """A removal request under SecAgg+: the round is already open; a leaving client is taken
        out of it (absent, not a dropout), a partial removal needs nothing from the server."""
        aggregation = self._aggregation
        assert aggregation is not None
        c = self._client_index(sender)
        if c not in self._active or sender in self._leaving:
            raise _remote(f"{sender} has left the federation and cannot request removals", sender, self)
        if self.round_idx == 0:
            raise _remote(f"a removal request from {sender} during training", sender, self)
        self._round_requests += 1
        if self._round_requests > 1:
            raise _remote(f"a second removal request in round {self.round_idx}", sender, self)
        if not message.whole_client:
            return []
        if aggregation.stage != STAGES[0] or sender not in aggregation.pending():
            raise _remote(f"{sender} asks to leave after joining the aggregation of round {self.round_idx}",
                          sender, self)
        if len(self._remaining()) == 1:
            raise _remote(f"{sender} is the last client; the federation would be empty", sender, self)
        self._leaving.add(sender)
        self._check_quorum()
        # Re-open the instance without the leaving client (absent, not a dropout: the error
        # messages and the dropout record must not name it) and replay the keys already in; the
        # first stage cannot have completed, since it waited for the leaving client.
        self._aggregation = self._new_aggregation()
        out = self._aggregation.drop(sorted(self._gone))
        for party, keys in self._advertised:
            out += self._aggregation.receive(party, keys)
        return self._after_stage(out)

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
        raise InsufficientParticipants(
            f"{remaining} clients remain in round {self.round_idx}, fewer than the quorum of {quorum}; "
            f"dropped: {', '.join(missing) if missing else 'none'}",
            missing=missing,
            party=missing[0] if len(missing) == 1 else None,
            round_idx=self.round_idx,
            state=self._state.name,
            phase=self.phase,
        )

    def _drop(self, parties: Sequence[str]) -> list[Outgoing]:
        assert self._aggregation is not None
        self._gone.update(parties)
        self._check_quorum()
        return self._after_stage(self._aggregation.drop(parties))

    def _after_stage(self, out: list[Outgoing]) -> list[Outgoing]:
        aggregation = self._aggregation
        assert aggregation is not None
        outcome = aggregation.outcome
        if outcome is None:
            return out
        for party, stage in outcome.dropouts.items():
            self._gone.add(party)
            self._dropouts[party] = (self.round_idx, stage)
            self._dropped.append(self._index[party])
        contributors = tuple(self._index[p] for p in outcome.survivors)
        return out + self._adopt([int(v) for v in outcome.total], contributors)

    def carries_on_without(self, party: str) -> bool:
        """With SecAgg+, while it aggregates, a client's failure notice is that client's dropout."""
        return self._aggregation is not None and self._state is ServerState.AGGREGATE and party in self._index

    def _on_event(self, event: Event) -> list[Outgoing]:
        if self._aggregation is not None and self._state is ServerState.AGGREGATE:
            if isinstance(event, PhaseTimedOut):
                silent = list(self.pending())
                if silent:
                    return self._drop(silent)
            elif isinstance(event, PartyDropped):
                party = event.party
                if party in self._index and party not in self._gone and party not in self._leaving and (
                    self._index[party] in self._active
                ):
                    return self._drop([party])
                return []
        elif isinstance(event, PhaseTimedOut) and self._state is ServerState.AGGREGATE:
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


# ------------------------------------------------------------------------------------- client


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


class ClientState(enum.Enum):
    """States of a MUFC client."""

    DATA = enum.auto()
    KEYS = enum.auto()
    SERVING = enum.auto()
    DONE = enum.auto()
    ERROR = enum.auto()


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
            keys, seeds and shares of every instance are derived from it.
        session: the run's session id (names each SecAgg+ instance; unused with SCMA).
        secagg_plus: aggregate with SecAgg+ under these parameters (the server's; see the
            module docstring); ``None`` (default) is the paper's SCMA.
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
        (ClientState.DATA, FederationSummary): ("_on_federation", ClientState.KEYS),
        (ClientState.KEYS, PeerKeys): ("_on_peer_keys", ClientState.SERVING),
        (ClientState.SERVING, ModelUpdate): ("_on_model", ClientState.SERVING),
        (ClientState.SERVING, AggregationRequest): ("_on_open", ClientState.SERVING),
        (ClientState.SERVING, NeighbourKeys): ("_on_neighbour_keys", ClientState.SERVING),
        (ClientState.SERVING, ForwardedShares): ("_on_forwarded_shares", ClientState.SERVING),
        (ClientState.SERVING, UnmaskRequest): ("_on_unmask_request", ClientState.SERVING),
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
                self.move_to(ClientState.SERVING)  # no key setup: SecAgg+ keys are fresh per instance
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
            summary = DataSummary(n_points=int(self._raw.shape[0]), extent=np.stack(feature_extent(self._raw)))
            return [self.send(self.server, summary, phase="setup.data")]
        return self._open_training()

    def _open_training(self) -> list[Outgoing]:
        """The first messages once the parameters are known: SCMA's key, or SecAgg+'s first stage."""
        if self.secagg_plus is not None:
            return [self._advertise()]
        return [self.send(self.server, PublicKey(public_key=self._public), phase="setup")]

    def _on_federation(self, sender: str, message: FederationSummary) -> list[Outgoing]:
        """``setup.data``: take the federation's counts and extent, derive the run's parameters,
        this client's scaled points, ids and requests, and open training."""
        self._check_server(sender)
        raw, setup = self._raw, self._setup
        assert raw is not None and setup is not None
        points, extent = message.client_points, message.extent
        if len(points) != setup.n_clients or int(points[self.index]) != raw.shape[0] or extent.shape[1] != raw.shape[1]:
            raise _remote(f"the federation's summary does not hold this client's {raw.shape[0]} points of "
                          f"{raw.shape[1]} features at index {self.index} of {setup.n_clients}", sender, self)
        lo, hi = feature_extent(raw)
        if np.any(extent[0] > lo) or np.any(extent[1] < hi):
            raise _remote("the federation's extent does not contain this client's points", sender, self)
        federation = Federation(tuple(int(n) for n in points), extent)
        agreement = setup.configure(federation, self.session)
        self.federation, self._raw = federation, None
        self._configure(agreement.config, federation.scale(raw), federation.ids(self.index),
                        agreement.requests_of(self.index), agreement.secagg_plus)
        if agreement.secagg_plus is not None:
            self.move_to(ClientState.SERVING)  # no key setup: SecAgg+ keys are fresh per instance
        return self._open_training()

    def _check_server(self, sender: str) -> None:
        if sender != self.server:
            raise _remote(f"{sender} is not the server", sender, self)

    def _on_peer_keys(self, sender: str, message: PeerKeys) -> list[Outgoing]:
        self._check_server(sender)
        if len(message.keys) != self.config.n_clients or message.keys[self.index] != self._public:
            raise _remote("the key list does not hold this client's key at its index", sender, self)
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
        share = MaskedSyndromes(attempt=attempt, width=cfg.width, values=values)
        return self.send(self.server, share, phase="aggregate")

    def _on_open(self, sender: str, message: AggregationRequest) -> list[Outgoing]:
        self._check_server(sender)
        if self.secagg_plus is not None:
            raise _remote("an SCMA aggregation request in a SecAgg+ run", sender, self)
        if self.index not in message.active:
            raise _remote("an aggregation this client is not part of", sender, self)
        if any(c >= self.config.n_clients for c in message.active):
            raise _remote("an aggregation over unknown clients", sender, self)
        return [self._share(message.active, message.attempt)]

    def _on_model(self, sender: str, message: ModelUpdate) -> list[Outgoing]:
        self._check_server(sender)
        if message.version != self.round_idx or message.version <= self._version:
            raise _remote(f"model version {message.version} in round {self.round_idx}", sender, self)
        plus = self.secagg_plus is not None
        if plus and (self._aggregation is None or self._aggregation.stage != "done"):
            raise _remote("a model before this client revealed its shares", sender, self)
        self._version, self._centroids = message.version, message.centroids
        self._aggregation = None
        if message.version == self.n_requests:
            self._finish(self._outcome())
            return []
        self.round_idx += 1
        if plus and self.requests.get(self.round_idx, ()) is not None:
            # the next round opens now: remove first (the input is taken at masked-input), then
            # advertise this round's keys
            out = []
            if self.round_idx in self.requests:
                self._remove(self.requests[self.round_idx])
                out.append(self.send(self.server, RemovalRequest(whole_client=False), phase="removal"))
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
            out = [self.send(self.server, RemovalRequest(whole_client=True), phase="removal")]
            self._finish(self._outcome())
            return out
        self._remove(batch)
        return [self.send(self.server, RemovalRequest(whole_client=False), phase="removal")]

    # -- SecAgg+ ---------------------------------------------------------------------------------

    def _advertise(self) -> Outgoing:
        """Open this round's SecAgg+ instance and send its keys (stage 1)."""
        assert self.secagg_plus is not None
        return self._open_aggregation(
            self.secagg_plus,
            self.index,
            entropy=self._secagg_entropy,
            instance=instance_bytes(self.session, self.round_idx, _SECAGG_PURPOSE),
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


# ------------------------------------------------------------------------------------ parties


class MUFCParties:
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
        session: the run's session id (names each SecAgg+ instance; unused with SCMA).

    Raises:
        ValueError: overlapping ids, a request that does not fit the data, a client count that
            does not match the config, a stream that would leave no client, or a
            ``secagg_plus`` that does not fit the run.
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
        self.secagg_plus, self.session = secagg_plus, session
        self.parts = [(np.asarray(x, np.float64), np.asarray(ids, np.int64)) for x, ids in parts]
        seen: set[int] = set()
        for _, ids in self.parts:
            if seen.intersection(ids.tolist()) or len(set(ids.tolist())) != len(ids):
                raise ValueError("point ids must be unique across clients")
            seen.update(ids.tolist())
        self.config, self.key, self.seed = config, key, seed
        self.clients = tuple(f"client-{c}" for c in range(config.n_clients))
        self.roster = (SERVER, *self.clients)
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

    def role_of(self, party: str) -> str:
        """``server`` or ``client``."""
        return "server" if party == SERVER else "client"

    def key_entropy(self, c: int) -> bytes:
        """Client c's key-pair entropy, derived from the run seed (simulation; :func:`client_key_entropy`)."""
        return client_key_entropy(self.seed, c)

    def make_machine(self, party: str) -> ProtocolMachine:
        """The machine of ``party``.

        Raises:
            ValueError: not a party of this run, or the client's requests do not fit its data.
        """
        m = len(self.requests)
        if party == SERVER:
            return MUFCServer(
                SERVER,
                clients=self.clients,
                config=self.config,
                key=jax.random.fold_in(self.key, 0),
                n_requests=m,
                n_points=self.n_points,
                session=self.session,
                secagg_plus=self.secagg_plus,
            )
        c = party_index(self.clients).get(party)  # (one index for the run: no roster scan per party)
        if c is None:
            raise ValueError(f"{party!r} is not a party of this run")
        x, ids = self.parts[c]
        return MUFCClient(
            party,
            server=SERVER,
            index=c,
            config=self.config,
            x=x,
            ids=ids,
            key=jax.random.fold_in(self.key, c + 1),
            requests=self.per_client[c],
            n_requests=m,
            key_entropy=self.key_entropy(c),
            session=self.session,
            secagg_plus=self.secagg_plus,
        )

    def machines(self) -> dict[str, ProtocolMachine]:
        """Every party's machine, in roster order."""
        return {p: self.make_machine(p) for p in self.roster}

"""The FastLloyd client role: its data's statistics each Lloyd iteration, masked, and the next
centroids from the server's noisy aggregate.

The protocol (setup, iterations, SecAgg+, dropout) is described in
:mod:`fedproto.algorithms.fastlloyd.protocol`, which re-exports these names.

References:
    Diaa, Humphries, Kerschbaum, "FastLloyd", Sec. 5, Alg. 1 (lines 6-13, 18-20).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import numpy as np

from fedproto.algorithms import kmeans, secagg
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
from fedproto.algorithms.fastlloyd.shared import (
    SECAGG_PURPOSE,
    check_ring_values,
    check_secagg_plus,
    initial_centroids,
    one_of,
    secagg_config,
)
from fedproto.algorithms.secagg_plus.protocol import SecAggPlusClientRole
from fedproto.data import feature_extent, normalize
from fedproto.errors import RemoteProtocolError
from fedproto.machine import ProtocolMachine, machine_states, party_index
from fedproto.messages import Message, Outgoing

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from fedproto.algorithms.secagg_plus.engine import SecAggPlusConfig

__all__ = ["ClientState", "FastLloydClient", "FastLloydResult"]

_SEED_CONTEXT = b"fedproto/fastlloyd/mask-seed"
_MASK_LABEL = b"fedproto/fastlloyd/mask"


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


def _encode_update(config: FastLloydConfig, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    enc_sums = secagg.encode_fixed(sums, frac_bits=config.frac_bits, ring_bits=config.ring_bits)
    enc_counts = secagg.encode_fixed(counts, frac_bits=config.count_frac_bits, ring_bits=config.ring_bits)
    return np.concatenate([enc_sums, enc_counts[:, None]], axis=1)


ClientState = machine_states("ClientState", "SETUP_DATA", "SETUP", "ITERATING")


class FastLloydClient(SecAggPlusClientRole, ProtocolMachine):
    """A FastLloyd client (sans-IO).

    Give exactly one of ``config`` and ``options`` (see :mod:`fedproto.algorithms.fastlloyd.protocol`).

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
        session: the run's session id (bound into the seed-sealing context and, with SecAgg+, the
            graph seed). It must be the run's, ``RuntimeConfig.session`` (default 0, which is a
            run's only when the run is session 0): the runtime, ``simulate`` and the harness raise
            :class:`~fedproto.errors.SessionMismatch` naming this party before any frame otherwise.
        secagg_plus: with ``config``: aggregate each iteration with SecAgg+ (dropout-tolerant;
            see :mod:`fedproto.algorithms.fastlloyd.protocol`) under these parameters; ``None``
            (default) is the paper's MSA. With ``options`` leave it out: ``options.secagg``
            chooses, and the parameters follow after ``setup.data``
            (:func:`~fedproto.algorithms.fastlloyd.shared.secagg_plus_config`).

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
        **SecAggPlusClientRole.secagg_transitions(ClientState.ITERATING),
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
        one_of(config, options, secagg_plus)
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
        # The X25519 key pair is derived from the entropy when it is used (three times a run at
        # most) rather than kept: a key object holds about 430 bytes of OpenSSL memory, which a
        # simulation hosting 10^5 clients would pay for each of them for the whole run.
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
        self._points = points if host else jax.device_put(points)  # (jnp.asarray would compile a copy kernel)
        self._centroids = np.asarray(initial_centroids(config), dtype=np.float64)
        self._history = [self._centroids]

    @property
    def phase(self) -> str:
        if self._state is ClientState.SETUP_DATA:
            return "setup.data"
        if self._state is ClientState.SETUP:
            return "setup.keys"
        if self._aggregation is not None:
            # after its unmask shares, a client waits for the iteration's aggregate
            return "aggregate" if self._aggregation.stage == "done" else self._aggregation.stage
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
        return self.send(self.server, PublicKey(public_key=self._key_pair()[1]), phase="setup.keys")

    def _key_pair(self) -> tuple[X25519PrivateKey, bytes]:
        """This client's X25519 ``(private key, raw public key)``, derived from its entropy."""
        return secagg.x25519_keypair(self._entropy)

    def _on_federation(self, sender: str, message: FederationSummary) -> list[Outgoing]:
        """``setup.data``: normalise by the federation's extent, derive the config, send the key."""
        self._check_server(sender)
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
        plus = secagg_config(options.secagg, config, len(self.clients), self.session)
        self._configure(config, plus, normalize(raw, options.bound, extent=(lo, hi)))
        self.n_points = message.n_points
        self._raw = None
        return [self._send_key()]

    def _install_seed(self, seed: bytes) -> None:
        self._masks = _mask_generator(seed, len(self.clients), self.config.shape, self.config.ring_bits)

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

    def _on_public_keys(self, sender: str, message: PublicKeys) -> list[Outgoing]:
        self._check_server(sender)
        if self.client_idx != 0:
            raise RemoteProtocolError("only client 0 receives the key roster", party=sender, round_idx=0)
        if len(message.public_keys) != len(self.clients):
            raise RemoteProtocolError(
                f"key roster has {len(message.public_keys)} keys for {len(self.clients)} clients", party=sender
            )
        private_key, public_key = self._key_pair()
        if message.public_keys[0] != public_key:
            raise RemoteProtocolError("the key roster does not hold this client's key", party=sender)
        seed = secagg.derive_bytes(self._entropy, b"fedproto/fastlloyd/seed", 32)
        receivers = range(1, len(message.public_keys))
        sealed = tuple(secagg.seal_seed_for_each(
            private_key, message.public_keys[1:], seed, [_seal_context(self.session, i) for i in receivers]
        ))
        self._install_seed(seed)
        return [self.send(self.server, SealedSeeds(sealed=sealed), phase="setup.seal"), self._update()]

    def _on_sealed_seed(self, sender: str, message: SealedSeed) -> list[Outgoing]:
        self._check_server(sender)
        if self.client_idx == 0:
            raise RemoteProtocolError("client 0 draws the seed; it cannot receive one", party=sender)
        try:
            seed = secagg.open_seed(
                self._key_pair()[0], message.sender_key, message.sealed, _seal_context(self.session, self.client_idx)
            )
        except ValueError as exc:
            raise RemoteProtocolError(f"the sealed mask seed does not open: {exc}", party=sender) from exc
        self._install_seed(seed)
        return [self._update()]

    def _update(self) -> Outgoing:
        if self.secagg_plus is not None:
            # The iteration opens a SecAgg+ aggregation; the update goes out in its masked-input stage.
            return self._open_aggregation(
                self.secagg_plus, self.client_idx, entropy=self._entropy, purpose=SECAGG_PURPOSE
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
        centroids = jax.device_put(self._centroids)
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
        dropped = message.dropped
        n = len(self.clients)
        if (dropped.size and int(dropped[-1]) >= n) or dropped.size >= n:
            raise RemoteProtocolError(f"the dropped list {dropped[:8].tolist()} is not valid for this client", party=sender)
        at = int(np.searchsorted(dropped, self.client_idx))
        if at < dropped.size and int(dropped[at]) == self.client_idx:
            raise RemoteProtocolError("the aggregate names this client as dropped", party=sender)
        # What this client revealed must agree: the neighbours whose self-mask seed shares it
        # revealed are in the sum, those whose pair mask keys it revealed are not (O(k log D)).
        alive, gone = aggregation.revealed
        neighbours = np.asarray(alive + gone, dtype=np.uint32)
        at = np.minimum(np.searchsorted(dropped, neighbours), max(dropped.size - 1, 0))
        listed = dropped[at] == neighbours if dropped.size else np.zeros(neighbours.size, dtype=bool)
        if listed[: len(alive)].any() or not listed[len(alive) :].all():
            raise RemoteProtocolError(
                "the aggregate's dropped list does not match the neighbours this client revealed shares of", party=sender
            )
        assert self._masks is not None
        mask = self._survivor_mask(dropped.tolist())
        return self._unmask_aggregate(sender, message.masked, mask)

    def _survivor_mask(self, dropped: list[int]) -> np.ndarray:
        """``sum_{i in S} r_i`` this iteration, ``[k, d+1]`` in the ring, for the survivors ``S``:
        all clients but ``dropped`` (increasing indices).

        Every ``r_i`` and the total ``r`` cost two PRG expansions
        (:class:`~fedproto.algorithms.secagg.MaskGenerator`), so ``r - sum_{i in D} r_i`` costs
        ``O(D)``: flat in the number of clients (issue 34), whichever clients dropped.
        """
        assert self._masks is not None
        t = self.round_idx
        mask = self._masks.total_mask(t)
        for i in dropped:
            mask = mask - self._masks.party_mask(i, t)  # wraps mod 2^w
        return mask

    def _on_aggregate(self, sender: str, message: NoisyAggregate) -> list[Outgoing]:
        self._check_server(sender)
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
        check_ring_values(cfg, masked, "aggregate", sender, self.round_idx)
        prepared = self._prepared
        if prepared is not None and prepared[0] == self.round_idx and prepared[1] is masked:
            counts, self._centroids = prepared[2], prepared[3]  # receive_batch unmasked this aggregate
        else:
            self._prepared = None
            counts, self._centroids = self._next_centroids(masked, mask)
        self._noisy_counts.append(_shared(counts))
        self._history.append(self._centroids)
        self.round_idx += 1
        if self.round_idx == cfg.iterations:
            self._finish(
                FastLloydResult(
                    centroids=self._centroids,
                    history=_shared(np.stack(self._history)),
                    unassigned=_shared(np.asarray(self._unassigned, dtype=np.int64)),
                    noisy_counts=_shared(np.stack(self._noisy_counts)),
                )
            )
            # what the result holds now; a simulation keeps every machine to the end of the run
            self._history = self._noisy_counts = self._unassigned = ()  # type: ignore[assignment]
            return []
        return [self._update()]


#: Arrays equal in every client of a run, kept once per process (see :func:`_shared`).
_SHARED: dict[tuple, np.ndarray] = {}
_SHARED_KEPT = 256
#: Mask generators by ``(seed, n_parties, shape, ring_bits)`` (see :func:`_mask_generator`).
_GENERATORS: dict[tuple, secagg.MaskGenerator] = {}
_GENERATORS_KEPT = 16


def _shared(array: np.ndarray) -> np.ndarray:
    """``array``'s values as a read-only array shared with every equal one this process made.

    Every client of a run decodes the same noisy counts and ends with the same centroid history
    (most with the same unassigned counts too): a process that hosts 10^5 clients keeps each such
    array once instead of once per client (the values, dtype and shape are the key; a few hundred
    bytes per client). Read-only, as the centroids from the host update already are.
    """
    key = (array.dtype.str, array.shape, array.tobytes())
    cached = _SHARED.get(key)
    if cached is None:
        cached = array
        cached.flags.writeable = False
        if len(_SHARED) >= _SHARED_KEPT:
            _SHARED.pop(next(iter(_SHARED)))
        _SHARED[key] = cached
    return cached


def _mask_generator(seed: bytes, n_parties: int, shape: tuple[int, ...], ring_bits: int) -> secagg.MaskGenerator:
    """The MSA mask generator of a seed, one per process: every client of a run opens the same
    seed, and a generator is a pure function of its arguments (its lazily derived HKDF key too),
    so the clients a process hosts share one instead of holding a copy each."""
    key = (seed, n_parties, shape, ring_bits)
    generator = _GENERATORS.get(key)
    if generator is None:
        generator = secagg.MaskGenerator(seed, n_parties, shape, ring_bits=ring_bits, label=_MASK_LABEL)
        if len(_GENERATORS) >= _GENERATORS_KEPT:
            _GENERATORS.pop(next(iter(_GENERATORS)))
        _GENERATORS[key] = generator
    return generator


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

"""SecAgg+ engines: dropout-tolerant secure aggregation that protocol machines embed.

A run's clients agree their keys **once** (the set-up) and then sum one vector per client in each
*aggregation* (one per round), over a ring ``Z_{2^w}`` (``w`` = 32 or 64, FastLloyd's fixed point)
or a prime field ``F_p`` (MUFC's syndromes). Each stage (:data:`STAGES`) is one request and one
reply through the server:

0. ``advertise-keys`` (set-up, once per run): client u sends one X25519 public key; the server
   sends every client the keys of its neighbours that advertised (``U1``). Client u agrees, with
   each neighbour v, the X25519 secret of the pair and derives from it (HKDF-SHA256, bound to the
   run and the pair) two keys it keeps for the run: ``e_uv``, which encrypts shares between u and
   v, and ``m_uv``, from which the pair's mask keys are drawn.
1. ``masked-input`` (every aggregation ``(r, a)``: round r, attempt a): client u draws a fresh
   self-mask seed ``b_u^{r,a}``, Shamir-shares it among the neighbours it masks with (threshold
   t), and sends ``y_u = x_u + PRG(b_u^{r,a}) + sum_v sign(u, v) PRG(k_uv^{r,a})``, where
   ``k_uv^{r,a} = PRF_{m_uv}(r, a)`` (keyed BLAKE2b) and
   ``sign = +1`` if ``u < v`` else ``-1`` (the masks of two senders cancel), together with each
   neighbour's share encrypted under ``e_uv`` (ChaCha20-Poly1305, the nonce and associated data
   binding ``(r, a)`` and the direction). The server tells each client which of its neighbours sent
   nothing (``D``) and forwards it the ciphertexts of the others.
2. ``unmask``: client u reveals, for each neighbour v that sent its input, its share of
   ``b_v^{r,a}``, and for each that did not, ``k_uv^{r,a}``; never both for one neighbour. The
   server rebuilds each sender's self-mask seed from t shares, removes the self masks and the
   pairwise masks that dropped clients left in their neighbours' inputs, and has
   ``sum_{u in U3} x_u`` exactly.

**Why the set-up can be reused.** No long-lived secret is ever revealed: the server learns only
per-aggregation values (``b_u^{r,a}`` of a client whose input arrived, ``k_uv^{r,a}`` of a pair
with one side missing), and the PRF keeps every other aggregation's masks pseudorandom. Revealing
a client's masking *key* (Bonawitz et al.'s recovery of a dropped client) would instead expose
every earlier input of that client whose self mask was removed. A client that dropped may
therefore take part again later under the same keys. ``docs/protocols/secagg_plus.md`` gives the
argument in full.

**Dropouts.** A client silent in a stage (the embedding machine calls
:meth:`SecAggPlusServer.drop` when its deadline passes or the transport reports the party gone)
is out of that aggregation. A client silent at ``unmask`` is still in the sum when its pairwise
masks all cancel; if one of its neighbours also missed the masked input, the pair's mask key is
known to those two clients only, so the server asks the clients that answered to mask the same
inputs again (:class:`~fedproto.algorithms.secagg_plus.messages.Remask`, attempt ``a + 1``,
fresh seeds and mask keys) without the silent ones. Too few clients left for the threshold raises
:class:`~fedproto.errors.InsufficientParticipants` naming them. A wrong sum is never returned.

Threat model: semi-honest (honest-but-curious) server and clients; the server relays faithfully.
Fewer than t colluding neighbours learn nothing about a self-mask seed. An active server could
claim that an online client dropped, to learn its pair keys after receiving its input: Bonawitz et
al.'s consistency checks and signatures (their actively secure variant) are not implemented here.

Engines are sans-IO objects, not machines: a :class:`~fedproto.machine.ProtocolMachine` keeps one
per run, routes the stage messages to it and sends what it returns
(:mod:`fedproto.algorithms.secagg_plus.protocol` is the smallest such machine pair).

References:
    Bonawitz, Ivanov, Kreuter, Marcedone, McMahan, Patel, Ramage, Segal, Seth. "Practical Secure
    Aggregation for Privacy-Preserving Machine Learning". ACM CCS 2017, Sec. 4, Fig. 4.
    Bell, Bonawitz, Gascón, Lepoint, Raykova. "Secure Single-Server Aggregation with
    (Poly)Logarithmic Overhead". ACM CCS 2020, Sec. 3 (Algorithm 2: the protocol over a
    sparse random graph).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import struct
from collections.abc import Iterable, Sequence

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from fedproto.algorithms import secagg
from fedproto.algorithms.secagg_plus import shamir
from fedproto.algorithms.secagg_plus.config import Modulus, SecAggPlusConfig, _check_int, complete_config, plus_config
from fedproto.algorithms.secagg_plus.messages import (
    AGGREGATION_STAGES,
    CIPHERTEXT_BYTES,
    KEY_BYTES,
    STAGES,
    AdvertiseKeys,
    MaskedInput,
    NeighbourKeys,
    Remask,
    UnmaskRequest,
    UnmaskShares,
    frame_limit,
    setup_and_aggregation_bytes,
    stage_bytes,
)
from fedproto.errors import InsufficientParticipants, LocalProtocolError, RemoteProtocolError
from fedproto.messages import Broadcast, Message, Outgoing, Send

__all__ = [
    "AGGREGATION_STAGES",
    "STAGES",
    "Modulus",
    "SecAggPlusClient",
    "SecAggPlusConfig",
    "SecAggPlusServer",
    "SumOutcome",
    "complete_config",
    "frame_limit",
    "plus_config",
    "setup_and_aggregation_bytes",
    "stage_bytes",
]

# The public parameters (Modulus, SecAggPlusConfig, plus_config, complete_config) live in
# secagg_plus.config; the stages and the wire sizes (stage_bytes, frame_limit, ...) with the messages,
# which import without FLINT. All are re-exported here.

_LABEL = b"fedproto/secagg-plus/v2"
_MASK_KEY_PERSON = b"fp/sa+/mask-key"  # BLAKE2b personalisation (at most 16 bytes)
#: After the unmask stage: the aggregation's sum is known (client: its shares are sent).
DONE = "done"
_MAX_ATTEMPT = 2**16 - 1


def _info(*fields: bytes | int) -> bytes:
    """An HKDF ``info``: the label and length-prefixed fields (ints as 8-byte big-endian)."""
    parts = [_LABEL]
    for field in fields:
        data = field.to_bytes(8, "big") if isinstance(field, int) else bytes(field)
        parts.append(struct.pack(">I", len(data)) + data)
    return b"".join(parts)


# --------------------------------------------------------------------------------------------
# Keys and masks
# --------------------------------------------------------------------------------------------


def _pair_keys(private: X25519PrivateKey, peer_public: bytes, instance: bytes, u: int, v: int) -> bytes:
    """``e_uv || m_uv``: the run's share-encryption key and mask base key of a pair (32 bytes each;
    kept as bytes, not as cipher objects, which cost a few KiB each in OpenSSL).

    Raises:
        ValueError: an invalid X25519 public key (a low-order point or a malformed key).
    """
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as exc:
        raise ValueError(f"invalid X25519 public key: {exc}") from exc
    lo, hi = (u, v) if u < v else (v, u)
    return secagg.derive_bytes(shared, _info(b"pair", instance, lo, hi), 2 * KEY_BYTES)


def _mask_key(base: bytes, round_idx: int, attempt: int) -> bytes:
    """``k_uv^{r,a}``: keyed BLAKE2b (RFC 7693's MAC mode, a PRF) of ``(r, a)`` under the pair's
    base key ``m_uv``: one aggregation's key tells nothing of another's, nor of ``m_uv``."""
    message = struct.pack(">QQ", round_idx, attempt)
    return hashlib.blake2b(message, key=base, digest_size=KEY_BYTES, person=_MASK_KEY_PERSON).digest()


def _share_nonce(round_idx: int, attempt: int, sender: int, receiver: int) -> bytes:
    # one ciphertext per (pair key, aggregation, direction): the 96-bit nonce never repeats
    return struct.pack(">QHH", round_idx, attempt, 0 if sender < receiver else 1)


def _share_context(instance: bytes, round_idx: int, attempt: int) -> bytes:
    """The associated data of an aggregation's encrypted shares, less the ``sender || receiver``
    (8-byte big-endian each) appended per ciphertext."""
    return _info(b"share", instance, round_idx, attempt)


@dataclasses.dataclass(frozen=True)
class SumOutcome:
    """What the server learns from one aggregation.

    Attributes:
        total: ``sum_{u in survivors} x_u`` in the algebra, ``[L]``.
        survivors: the clients whose inputs are in ``total`` (``U3``), in client order.
        dropouts: ``{client: stage}`` for each client that dropped, with the stage it did not
            complete (a client that dropped at ``unmask`` is a survivor when its input could be
            kept in the sum).
        attempts: how many times the inputs were masked (1 unless a :class:`Remask` was needed).
    """

    total: np.ndarray
    survivors: tuple[str, ...]
    dropouts: dict[str, str]
    attempts: int = 1


# --------------------------------------------------------------------------------------------
# Client
# --------------------------------------------------------------------------------------------


class SecAggPlusClient:
    """One client's side of a run's aggregations (sans-IO; Bonawitz et al. Fig. 4, "User").

    Set-up, once: :meth:`advertise`, then :meth:`receive_keys` with the server's
    :class:`NeighbourKeys`. Then, for each aggregation: :meth:`mask_input` with the round's input,
    and :meth:`unmask` with the :class:`UnmaskRequest`; on a :class:`Remask`, :meth:`remask` with
    the same input. Each returns the message to send to the server (``receive_keys`` nothing).

    Args:
        config: the public parameters.
        index: this client's index in ``[0, n_clients)``.
        entropy: at least 32 secret random bytes; every key, seed and share coefficient of the run
            is derived from it and ``instance`` (HKDF), so the engine is a pure function of its
            arguments.
        instance: public bytes naming the run's set-up (session, purpose): keys are fresh for
            every instance.

    Attributes:
        stage: ``advertise-keys`` until the keys are in, ``masked-input`` until the first input
            is masked, ``unmask`` while an unmask request is awaited, then :data:`DONE`.
        revealed: after :meth:`unmask`: the neighbours whose self-mask seed shares this client
            revealed (their inputs are in the sum) and those whose pair keys it revealed (not in
            it).

    Raises:
        ValueError: ``index`` out of range or ``entropy`` shorter than 32 bytes.
    """

    def __init__(self, config: SecAggPlusConfig, index: int, *, entropy: bytes, instance: bytes) -> None:
        index = _check_int("index", index, 0)
        if index >= config.n_clients:
            raise ValueError(f"index must be below n_clients = {config.n_clients}, got {index}")
        if not isinstance(entropy, bytes) or len(entropy) < 32:
            raise ValueError("entropy must be at least 32 bytes")
        self.config = config
        self.index = index
        self.instance = bytes(instance)
        derive = functools.partial(secagg.derive_bytes, entropy)
        self._private = X25519PrivateKey.from_private_bytes(derive(_info(b"key", self.instance, index)))
        self._seed_key = derive(_info(b"self-seed", self.instance, index))
        self._share_entropy = derive(_info(b"share-coefficients", self.instance, index))
        self.stage = STAGES[0]
        self._advertised = False
        self._pair: dict[int, bytes] = {}  # neighbour -> e_uv || m_uv
        self._neighbours: list[int] = []  # the neighbours the next input is masked with, increasing
        self._last: tuple[int, int] = (-1, 0)  # (round, attempt) of the last masked input
        self._masked_with: list[int] = []
        self.revealed: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())

    @property
    def neighbours(self) -> tuple[int, ...]:
        """The neighbours the next input will be masked with (those with keys, less those the
        server has reported without input), increasing."""
        return tuple(self._neighbours)

    def advertise(self) -> AdvertiseKeys:
        """Set-up: this client's public key."""
        if self.stage != STAGES[0] or self._advertised:
            raise LocalProtocolError(f"advertise() at stage {self.stage}")
        self._advertised = True
        return AdvertiseKeys(public_key=self._private.public_key().public_bytes_raw())

    def receive_keys(self, sender: str, message: NeighbourKeys) -> None:
        """Set-up: agree the run's keys with each neighbour that advertised.

        Raises:
            RemoteProtocolError: a listed client is not a neighbour, a key is invalid, or the list
                is shorter than t (the client's seeds could not be recovered).
        """
        if self.stage != STAGES[0] or not self._advertised:
            raise RemoteProtocolError(f"neighbour keys while this client's aggregation is at {self.stage}", party=sender)
        cfg = self.config
        mine = set(cfg.neighbours[self.index])
        neighbours = [int(v) for v in message.neighbours]
        strangers = [v for v in neighbours if v not in mine]
        if strangers:
            raise RemoteProtocolError(f"the server lists clients {strangers[:5]} that are not neighbours", party=sender)
        if len(neighbours) < cfg.threshold:
            raise RemoteProtocolError(
                f"only {len(neighbours)} neighbours advertised keys; sharing needs t = {cfg.threshold}", party=sender
            )
        keys = np.asarray(message.keys, dtype=np.uint8)
        for row, v in enumerate(neighbours):
            try:
                self._pair[v] = _pair_keys(self._private, keys[row].tobytes(), self.instance, self.index, v)
            except ValueError as exc:
                raise RemoteProtocolError(f"client {v}'s public key: {exc}", party=sender) from None
        self._neighbours = neighbours
        self.stage = STAGES[1]

    def mask_input(self, values: object, *, round_idx: int, attempt: int = 0) -> MaskedInput:
        """``y_u = x_u + PRG(b_u^{r,a}) + sum_v sign(u, v) PRG(k_uv^{r,a})``, and the shares of
        ``b_u^{r,a}`` encrypted for the neighbours.

        Args:
            values: ``[L]`` integers in ``[0, size)`` of the algebra (ring elements: the
                fixed-point encoding; field elements).
            round_idx: the aggregation's round ``r`` (>= 0).
            attempt: ``a``, 0 unless the server asked to mask again (:meth:`remask`).

        Raises:
            ValueError: wrong length or an element outside the algebra.
            LocalProtocolError: before the set-up completed, while an unmask request is awaited,
                or for an ``(r, a)`` not after the last one masked: masks are never reused.
            InsufficientParticipants: fewer than t neighbours left to share the seed with.
        """
        if self.stage not in (STAGES[1], DONE):
            raise LocalProtocolError(f"mask_input() at stage {self.stage}")
        round_idx = _check_int("round_idx", round_idx, 0)
        attempt = _check_int("attempt", attempt, 0)
        if attempt > _MAX_ATTEMPT:
            raise ValueError(f"attempt must be at most {_MAX_ATTEMPT}, got {attempt}")
        if (round_idx, attempt) <= self._last:
            raise LocalProtocolError(
                f"round {round_idx} attempt {attempt} is not after round {self._last[0]} attempt {self._last[1]}: "
                "masks are never reused"
            )
        cfg = self.config
        neighbours = self._neighbours
        if len(neighbours) < cfg.threshold:
            raise InsufficientParticipants(
                f"client {self.index} has {len(neighbours)} neighbours left; sharing its seed needs t = {cfg.threshold}"
            )
        modulus, length = cfg.modulus, cfg.vector_length
        x = modulus.vector(values, length)
        seed = secagg.derive_bytes(self._seed_key, _info(b"self-seed", round_idx, attempt))
        u = self.index
        pair = self._pair
        plus = [seed, *(_mask_key(pair[v][KEY_BYTES:], round_idx, attempt) for v in neighbours if u < v)]
        minus = [_mask_key(pair[v][KEY_BYTES:], round_idx, attempt) for v in neighbours if v < u]
        y = modulus.add(x, modulus.expand_sum(plus, minus, length))
        # A neighbour's evaluation point is 1 + its rank in this list (the server tracks the list).
        shares = shamir.split_secret(seed, range(1, len(neighbours) + 1), cfg.threshold, self._share_entropy)
        context = _share_context(self.instance, round_idx, attempt)
        sealed = b"".join(
            ChaCha20Poly1305(pair[v][:KEY_BYTES]).encrypt(
                _share_nonce(round_idx, attempt, u, v), share, context + struct.pack(">QQ", u, v)
            )
            for v, share in zip(neighbours, shares, strict=True)
        )
        self._last = (round_idx, attempt)
        self._masked_with = list(neighbours)
        self.stage = STAGES[2]
        rows = np.frombuffer(sealed, dtype=np.uint8).reshape(len(neighbours), CIPHERTEXT_BYTES)
        return MaskedInput(masked=modulus.to_wire(y), shares=rows)

    def unmask(self, sender: str, message: UnmaskRequest) -> UnmaskShares:
        """For each neighbour it masked with: the share of its self-mask seed if it sent its input,
        else this aggregation's pair key with it (it is in ``message.dropped``). The neighbours
        without input are left out of later aggregations' masks.

        Raises:
            RemoteProtocolError: a dropped client that is not a neighbour, this client listed as
                dropped, the wrong number of ciphertexts, or one that does not authenticate.
            InsufficientParticipants: fewer than t - 1 of its neighbours sent their input (with
                itself, fewer than t: Bonawitz et al.'s abort rule; revealing the pair keys would
                leave its own input with too few masks).
        """
        if self.stage != STAGES[2]:
            raise RemoteProtocolError(f"an unmask request while this client's aggregation is at {self.stage}", party=sender)
        dropped = [int(v) for v in message.dropped]
        if self.index in dropped:
            raise RemoteProtocolError("the server lists this client, which sent its input, as dropped", party=sender)
        masked_with = self._masked_with
        gone = set(dropped)
        if len(gone) != len(dropped) or not gone <= set(masked_with):
            raise RemoteProtocolError("the dropped list names clients this client did not mask with", party=sender)
        alive = [v for v in masked_with if v not in gone]
        if len(alive) + 1 < self.config.threshold:
            raise InsufficientParticipants(
                f"only {len(alive)} neighbours of client {self.index} sent their input; revealing needs "
                f"t - 1 = {self.config.threshold - 1}",
                missing=[str(v) for v in dropped],
                party=sender,
            )
        if message.shares.shape[0] != len(alive):
            raise RemoteProtocolError(
                f"{message.shares.shape[0]} forwarded shares for {len(alive)} neighbours with input", party=sender
            )
        round_idx, attempt = self._last
        u = self.index
        context = _share_context(self.instance, round_idx, attempt)
        sealed = message.shares.tobytes()
        opened = []
        for row, v in enumerate(alive):
            try:
                opened.append(
                    ChaCha20Poly1305(self._pair[v][:KEY_BYTES]).decrypt(
                        _share_nonce(round_idx, attempt, v, u),
                        sealed[row * CIPHERTEXT_BYTES : (row + 1) * CIPHERTEXT_BYTES],
                        context + struct.pack(">QQ", v, u),
                    )
                )
            except InvalidTag:
                raise RemoteProtocolError(f"the share of client {v} does not authenticate", party=sender) from None
        shares = np.frombuffer(b"".join(opened), dtype=np.uint8).reshape(len(alive), shamir.SHARE_BYTES)
        revealed = b"".join(_mask_key(self._pair[v][KEY_BYTES:], round_idx, attempt) for v in dropped)
        keys = np.frombuffer(revealed, dtype=np.uint8).reshape(len(dropped), KEY_BYTES)
        self._neighbours = [v for v in self._neighbours if v not in gone]
        self.revealed = (tuple(alive), tuple(dropped))
        self.stage = DONE
        return UnmaskShares(shares=shares, pair_keys=keys)

    def remask(self, sender: str, message: Remask, values: object) -> MaskedInput:
        """Mask the same ``values`` again for the attempt the server names (fresh seed and keys).

        Raises:
            RemoteProtocolError: not after this client's unmask shares, or not the next attempt.
        """
        if self.stage != DONE or message.attempt != self._last[1] + 1:
            raise RemoteProtocolError(
                f"a remask for attempt {message.attempt} at stage {self.stage} after attempt {self._last[1]}", party=sender
            )
        return self.mask_input(values, round_idx=self._last[0], attempt=message.attempt)


# --------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------


class SecAggPlusServer:
    """The server's side of a run's aggregations (sans-IO; Bonawitz et al. Fig. 4, "Server").

    The engine starts with the set-up and the first aggregation; once :attr:`outcome` holds its
    sum, :meth:`begin` starts the next. Feed it each stage message with :meth:`receive` and the
    clients that go silent with :meth:`drop`; both return the messages to send (as
    :class:`~fedproto.messages.Send` / :class:`~fedproto.messages.Broadcast` stamped with the
    round and the stage).

    Args:
        config: the public parameters.
        clients: the party name of each client index, ``[n_clients]``.
        round_idx: the round of the first aggregation (its messages are stamped with it).
        instance: the public bytes naming the run's set-up, as the clients were given them.
        active: the clients expected to take part (default all); the others left the federation
            earlier and count as absent, not as dropouts.

    Raises:
        ValueError: ``clients`` has the wrong length or repeats a name; an active client is not
            in ``clients``.
    """

    def __init__(
        self,
        config: SecAggPlusConfig,
        clients: Sequence[str],
        *,
        round_idx: int,
        instance: bytes,
        active: Iterable[str] | None = None,
    ) -> None:
        clients = tuple(clients)
        if len(clients) != config.n_clients or len(set(clients)) != len(clients):
            raise ValueError(f"clients must be {config.n_clients} distinct names, got {len(clients)}")
        self.config = config
        self.clients = clients
        self.instance = bytes(instance)
        self._index = {name: i for i, name in enumerate(clients)}
        self._keys: dict[int, bytes] = {}  # set-up: the public keys that arrived
        # After the set-up: each client's neighbours that it masks its next input with, as the
        # client tracks them (those with keys, less those reported to it without input).
        self._neighbours: dict[int, np.ndarray] = {}
        # Clients whose input some aggregation lacked: their neighbours have left them out of
        # their masks since, so they take no part in later aggregations of the run.
        self._out: set[int] = set()
        self.round_idx = -1
        self.outcome: SumOutcome | None = None
        self._start(round_idx, self._active_indices(active))
        self.stage = STAGES[0]

    # -- state ----------------------------------------------------------------------------------

    def _active_indices(self, active: Iterable[str] | None) -> set[int]:
        if active is None:
            return set(range(len(self.clients)))
        active = list(active)
        unknown = [a for a in active if a not in self._index]
        if unknown:
            raise ValueError(f"active clients not in the client list: {unknown}")
        return {self._index[a] for a in active}

    def _start(self, round_idx: int, active: set[int]) -> None:
        self.round_idx = round_idx
        self.attempt = 0
        self.stage = STAGES[1]
        self.dropouts: dict[str, str] = {}
        self.outcome = None
        self._active = active
        self._dropped: set[int] = set()  # dropped in this aggregation (any attempt)
        self._gone: set[int] = set()
        self._gone_unmarked = False  # a gone client may be waited for at the current stage
        self._reset_attempt(active)

    def _reset_attempt(self, expected: set[int]) -> None:
        self._inputs: dict[int, np.ndarray] = {}
        self._sealed: dict[int, np.ndarray] = {}  # sender -> its ciphertexts, one per neighbour it masked with
        self._reveals: dict[int, UnmaskShares] = {}
        self._requested: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # survivor -> (senders, dropped) asked of it
        # The clients the current stage still waits for, kept as messages arrive (O(1) each).
        self._waiting: set[int] = set(expected)

    def begin(self, round_idx: int, active: Iterable[str] | None = None) -> None:
        """Start the next aggregation; its clients send their masked inputs unasked. Clients known
        to be gone are then passed to :meth:`drop`, which completes the stage if no one is left.

        Args:
            round_idx: its round, after the last one.
            active: the clients expected (default all). A client that never completed the set-up,
                or whose input an earlier aggregation of the run lacked (its neighbours have left
                it out of their masks since), cannot take part and is absent.

        Raises:
            LocalProtocolError: the running aggregation has no sum yet, or ``round_idx`` is not
                after its round.
            ValueError: an active client not in ``clients``.
        """
        if self.outcome is None:
            raise LocalProtocolError(f"begin() while round {self.round_idx}'s aggregation runs")
        if round_idx <= self.round_idx:
            raise LocalProtocolError(f"round {round_idx} is not after round {self.round_idx}: masks are never reused")
        self._start(round_idx, (self._active_indices(active) & self._neighbours.keys()) - self._out)

    @property
    def done(self) -> bool:
        """True once the running aggregation's sum is known."""
        return self.outcome is not None

    def _received(self) -> dict[int, object]:
        return {STAGES[0]: self._keys, STAGES[1]: self._inputs, STAGES[2]: self._reveals}.get(self.stage, {})  # type: ignore[return-value]

    def pending(self) -> list[str]:
        """The clients the current stage still waits for, in client order."""
        return [self.clients[i] for i in sorted(self._waiting)]

    def is_dropped(self, party: str) -> bool:
        """True for a client that dropped in this aggregation (its late messages are to be ignored)."""
        index = self._index.get(party)
        return index is not None and index in self._dropped

    # -- input ----------------------------------------------------------------------------------

    def receive(self, sender: str, message: Message) -> list[Outgoing]:
        """Take one stage message; return what to send once the stage completes.

        A message from a client that already dropped in this aggregation is ignored.

        Raises:
            RemoteProtocolError: a sender that is not an expected client of this stage, a second
                message, a message of another stage, or contents that do not fit what the server
                sent (the number of ciphertexts, shares or keys).
            InsufficientParticipants: completing the stage shows the sum cannot be recovered.
        """
        index = self._index.get(sender)
        if index is not None and index in self._dropped:
            return []
        expected_type = {STAGES[0]: AdvertiseKeys, STAGES[1]: MaskedInput, STAGES[2]: UnmaskShares}.get(self.stage)
        if type(message) is not expected_type:
            raise RemoteProtocolError(
                f"unexpected {type(message).__name__} from {sender} at stage {self.stage}",
                party=sender,
                round_idx=self.round_idx,
                phase=self.stage,
            )
        store = self._received()
        if index is not None and index in store:
            raise RemoteProtocolError(
                f"second {self.stage} message from {sender}", party=sender, round_idx=self.round_idx, phase=self.stage
            )
        if index is None or index not in self._waiting:
            raise RemoteProtocolError(
                f"{sender} is not a client of stage {self.stage} of this aggregation",
                party=sender,
                round_idx=self.round_idx,
                phase=self.stage,
            )
        store[index] = self._check(index, sender, message)
        self._waiting.discard(index)
        return self._advance()

    def _check(self, index: int, sender: str, message: Message) -> object:
        """Check a stage message against what this server sent; return what to keep of it."""

        def refuse(what: str) -> RemoteProtocolError:
            return RemoteProtocolError(f"{sender}: {what}", party=sender, round_idx=self.round_idx, phase=self.stage)

        if isinstance(message, AdvertiseKeys):
            return message.public_key
        if isinstance(message, MaskedInput):
            expected = self._neighbours[index].size
            if message.shares.shape[0] != expected:
                raise refuse(f"{message.shares.shape[0]} encrypted shares for {expected} neighbours")
            try:
                masked = self.config.modulus.from_wire(np.asarray(message.masked), self.config.vector_length)
            except ValueError as exc:
                raise refuse(f"masked input: {exc}") from None
            self._sealed[index] = message.shares
            return masked
        assert isinstance(message, UnmaskShares)
        senders, dropped = self._requested[index]
        if message.shares.shape[0] != senders.size or message.pair_keys.shape[0] != dropped.size:
            raise refuse(
                f"{message.shares.shape[0]} shares and {message.pair_keys.shape[0]} pair keys for a request of "
                f"{senders.size} and {dropped.size}"
            )
        return message

    def drop(self, parties: Iterable[str]) -> list[Outgoing]:
        """Count ``parties`` as gone: each drops at the first stage that waits for it (now, if
        the current stage does), then complete the stage if no one else is pending. Names that
        are not clients of this aggregation are ignored.

        Raises:
            InsufficientParticipants: the sum can no longer be recovered.
        """
        for party in parties:
            index = self._index.get(party)
            if index is not None:
                self._gone.add(index)
                self._gone_unmarked = True
        return self._advance()

    def withdraw(self, parties: Iterable[str]) -> list[Outgoing]:
        """Take ``parties`` out of the running aggregation as absent, not as dropouts: they leave
        the federation before sending their masked input (their neighbours reveal this
        aggregation's pair keys with them, as for any neighbour without input).

        Raises:
            LocalProtocolError: not at the first attempt's masked-input stage, or a party that
                already sent its input or is not expected.
            InsufficientParticipants: the sum can no longer be recovered.
        """
        for party in parties:
            index = self._index.get(party)
            if self.stage != STAGES[1] or self.attempt or index is None or index not in self._waiting:
                raise LocalProtocolError(f"{party} cannot leave round {self.round_idx}'s aggregation at stage {self.stage}")
            self._waiting.discard(index)
            self._active.discard(index)
        return self._advance()

    def _mark_gone(self) -> None:
        # Only after a drop or a new stage can a gone client be waited for: scanning ``_gone`` on
        # every message would cost O(gone) per client (issue 34).
        if not self._gone_unmarked:
            return
        self._gone_unmarked = False
        for index in sorted(i for i in self._gone if i in self._waiting):
            self._waiting.discard(index)
            self._dropped.add(index)
            self.dropouts[self.clients[index]] = self.stage

    # -- stages ---------------------------------------------------------------------------------

    def _advance(self) -> list[Outgoing]:
        out: list[Outgoing] = []
        while True:
            if self.outcome is not None:
                return out
            self._mark_gone()
            if self._waiting:
                return out
            if self.stage == STAGES[0]:
                out += self._close_advertise()
                self._waiting = set(self._neighbours) - self._dropped
            elif self.stage == STAGES[1]:
                out += self._close_masked_input()
                self._waiting = set(self._inputs)
            else:
                out += self._close_unmask()
            self._gone_unmarked = bool(self._gone)

    def _fail(self, what: str, owners: Iterable[int]) -> InsufficientParticipants:
        owners = sorted(set(owners))
        silent_names = sorted(self.clients[i] for i in self._dropped)
        names = [self.clients[i] for i in owners]
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        absent = len(self.clients) - len(self._active)
        return InsufficientParticipants(
            f"secure aggregation cannot recover the sum: {what}"
            + (f" (clients {shown})" if names else "")
            + f", t = {self.config.threshold}; dropped: {', '.join(silent_names) if silent_names else 'none'}"
            + (f"; {absent} of the {len(self.clients)} clients are not in this aggregation" if absent else ""),
            missing=silent_names,
            party=names[0] if len(names) == 1 else None,
            round_idx=self.round_idx,
            phase=self.stage,
        )

    def _close_advertise(self) -> list[Outgoing]:
        cfg = self.config
        present = set(self._keys)
        if len(present) < cfg.threshold:
            raise self._fail(f"only {len(present)} clients advertised keys", ())
        short = []
        for u in sorted(present):
            nb = np.asarray([v for v in cfg.neighbours[u] if v in present], dtype=np.uint32)
            if nb.size < cfg.threshold:
                short.append(u)
            self._neighbours[u] = nb
        if short:
            raise self._fail("fewer than t neighbours advertised keys", short)
        out: list[Outgoing] = []
        for u in sorted(present):
            nb = self._neighbours[u]
            keys = np.frombuffer(b"".join(self._keys[v] for v in nb.tolist()), dtype=np.uint8).reshape(nb.size, KEY_BYTES)
            out.append(Send(self.clients[u], NeighbourKeys(neighbours=nb, keys=keys), self.round_idx, STAGES[0]))
        self._keys = {}  # the clients hold them; the server needs only the neighbour lists
        self.stage = STAGES[1]
        return out

    def _close_masked_input(self) -> list[Outgoing]:
        cfg = self.config
        senders_all = sorted(self._inputs)
        if len(senders_all) < cfg.threshold:
            raise self._fail(f"only {len(senders_all)} clients sent their input", ())
        sent = np.zeros(len(self.clients), dtype=bool)
        sent[senders_all] = True
        self._out.update(u for u in self._neighbours if not sent[u])
        # Each sender's seed is shared among the neighbours it masked with: t of them must have
        # sent their input too (only they are asked to reveal).
        requested: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        short = []
        for u in senders_all:
            nb = self._neighbours[u]
            with_input = sent[nb]
            requested[u] = (nb[with_input], nb[~with_input])
            if requested[u][0].size < cfg.threshold:
                short.append(u)
        if short:
            raise self._fail("fewer than t neighbours sent their input", short)
        # Forward each ciphertext to its holder: v's row j is for v's j-th neighbour. All rows at
        # once: keep those whose holder sent its input, order them by holder, then by sender (the
        # order each holder expects), and cut them into one block per holder.
        holders = np.concatenate([self._neighbours[v] for v in senders_all]).astype(np.int64)
        owners = np.repeat(np.asarray(senders_all, dtype=np.int64), [self._neighbours[v].size for v in senders_all])
        sealed = np.concatenate([self._sealed[v] for v in senders_all])
        keep = sent[holders]
        holders, owners, sealed = holders[keep], owners[keep], sealed[keep]
        order = np.lexsort((owners, holders))
        blocks = np.split(sealed[order], np.cumsum(np.bincount(holders, minlength=len(self.clients)))[:-1])
        self._requested = requested
        self.stage = STAGES[2]
        return [
            Send(self.clients[u], UnmaskRequest(dropped=requested[u][1], shares=blocks[u]), self.round_idx, STAGES[1])
            for u in senders_all
        ]

    def _close_unmask(self) -> list[Outgoing]:
        cfg = self.config
        survivors = sorted(self._inputs)
        answered = set(self._reveals)
        held = self._held_shares(survivors, sorted(answered))
        short = [u for u in survivors if len(held[u]) < cfg.threshold]
        # A survivor silent here whose neighbour sent no input leaves that pair's mask in the
        # sum: only the two of them know its key.
        stuck = [u for u in survivors if u not in answered and self._requested[u][1].size]
        if short or stuck:
            return self._mask_again(sorted(set(short) | set(stuck)))
        modulus, length = cfg.modulus, cfg.vector_length
        seeds = shamir.combine_many([held[u] for u in survivors], cfg.threshold)
        total = modulus.zeros(length)
        for u in survivors:
            total = modulus.add(total, self._inputs[u])
        # y_w carries +PRG(k_wv) when w < v, -PRG(k_wv) otherwise: take out what remains.
        added, taken = list(seeds), []
        for w in sorted(answered):
            keys = self._reveals[w].pair_keys
            for row, v in enumerate(self._requested[w][1].tolist()):
                (added if w < v else taken).append(keys[row].tobytes())
        total = modulus.sub(total, modulus.expand_sum(added, taken, length))
        self._forget_dropped(answered)
        self.stage = DONE
        self.outcome = SumOutcome(
            total=total,
            survivors=tuple(self.clients[u] for u in survivors),
            dropouts=dict(self.dropouts),
            attempts=self.attempt + 1,
        )
        return []

    def _held_shares(self, survivors: list[int], answered: list[int]) -> dict[int, dict[int, bytes]]:
        """``{owner: {evaluation point: share}}`` of each survivor's self-mask seed, from the
        holders that answered. Holder w's point for owner v is 1 + w's rank in the list v masked
        with, found for all pairs by one search in the concatenated lists (keys ``v n + w``)."""
        held: dict[int, dict[int, bytes]] = {u: {} for u in survivors}
        if not answered:
            return held
        n = len(self.clients)
        owners = np.concatenate([self._requested[w][0] for w in answered]).astype(np.int64)
        counts = [self._requested[w][0].size for w in answered]
        holders = np.repeat(np.asarray(answered, dtype=np.int64), counts)
        shares = np.concatenate([self._reveals[w].shares for w in answered])
        lists = [self._neighbours[v].astype(np.int64) + v * n for v in survivors]
        starts = np.zeros(n, dtype=np.int64)
        starts[survivors] = np.cumsum([0, *(len(a) for a in lists[:-1])])
        points = np.searchsorted(np.concatenate(lists), owners * n + holders) - starts[owners] + 1
        for owner, point, share in zip(owners.tolist(), points.tolist(), shares, strict=True):
            held[owner][point] = share.tobytes()
        return held

    def _forget_dropped(self, answered: Iterable[int]) -> None:
        """Each client that answered the unmask request leaves its neighbours without input out of
        later masks (:meth:`SecAggPlusClient.unmask`): track the same lists."""
        for w in answered:
            self._neighbours[w] = self._requested[w][0]

    def _mask_again(self, blocking: list[int]) -> list[Outgoing]:
        """The sum cannot be unmasked (``blocking``: survivors whose seed lacks t shares or whose
        pair mask is stuck): the clients that answered mask their inputs again, without the others."""
        answered = sorted(self._reveals)
        silent = [u for u in sorted(self._inputs) if u not in self._reveals]
        if len(answered) < self.config.threshold or self.attempt >= _MAX_ATTEMPT:
            raise self._fail("too few clients answered the unmask request to mask again", blocking)
        for u in silent:
            self._dropped.add(u)
            self.dropouts[self.clients[u]] = STAGES[2]
        self._forget_dropped(answered)
        self.attempt += 1
        self.stage = STAGES[1]
        self._reset_attempt(set())  # _advance waits for the clients that answered
        dests = tuple(self.clients[u] for u in answered)
        self._waiting = set(answered)
        return [Broadcast(dests, Remask(attempt=self.attempt), self.round_idx, STAGES[2])]

"""SecAgg+ stage engines: dropout-tolerant secure aggregation that protocol machines embed.

One *aggregation* (an instance) sums one vector per client over a ring ``Z_{2^w}`` (``w`` = 32
or 64, FastLloyd's fixed point) or a prime field ``F_p`` (MUFC's syndromes), in four stages
(:data:`STAGES`), each one request and one reply through the server:

1. ``advertise-keys``: client u draws two X25519 key pairs, ``(c_u^PK, c_u^SK)`` to encrypt
   shares and ``(s_u^PK, s_u^SK)`` to agree pairwise mask seeds, and sends both public keys. The
   server sends every client the keys of its neighbours that advertised (set ``U1``).
2. ``share-keys``: client u draws a self-mask seed ``b_u``, Shamir-shares ``b_u`` and
   ``s_u^SK`` among its neighbours in ``U1`` with threshold t, and encrypts each neighbour's two
   shares with ChaCha20-Poly1305 under a key agreed from ``c_u^SK`` and the neighbour's
   ``c_v^PK`` (HKDF; the indices and the aggregation are bound as associated data). The server
   forwards each client the ciphertexts addressed to it, from the clients that sent theirs
   (``U2``).
3. ``masked-input``: client u sends ``y_u = x_u + PRG(b_u) + sum_{v in N(u) & U2} sign(u, v)
   PRG(s_{u,v})``, with ``s_{u,v}`` = HKDF of the X25519 agreement of ``s_u^SK`` and
   ``s_v^PK``, ``sign = +1`` if ``u < v`` else ``-1``, so the pairwise masks of two senders
   cancel. The server tells each client which of its neighbours in ``U2`` sent nothing (``D = U2 \\ U3``).
4. ``unmask``: client u in ``U3`` sends, for each neighbour v in ``U2``, its share of ``s_v^SK``
   if ``v`` is in ``D`` and its share of ``b_v`` otherwise; never both for the same v. With t
   shares of each, the server removes the self masks of ``U3`` and the pairwise masks that
   dropped clients left in their neighbours' inputs, and obtains ``sum_{u in U3} x_u``
   exactly.

The neighbourhood graph is public: a random ``k``-regular graph drawn from a public seed
(:func:`~fedproto.algorithms.secagg_plus.graph.neighbourhoods`), or the complete graph, which
is classic SecAgg. A client checks that the server's neighbour list is part of its own
neighbourhood. Masks are ChaCha20 keystreams keyed by HKDF-SHA256 (the ring: keystream words
read little-endian; the field: rejection sampling, exactly uniform), never a statistical
generator.

Dropout: a client that is silent in a stage (the embedding machine calls
:meth:`SecAggPlusServer.drop` when its deadline passes or the transport reports the party gone)
is left out of that stage's set and of every later one. The sum of ``U3``'s inputs is recovered
whenever every client of ``U3`` and of ``D`` has at least t neighbours in the set that answers
the unmask request; otherwise :class:`~fedproto.errors.InsufficientParticipants` names the
clients whose masks cannot be removed. A wrong sum is never returned.

Threat model: semi-honest (honest-but-curious) server and clients; the server relays faithfully.
What the server holds: the public keys, ciphertexts it cannot open, the masked inputs, and for
each client either t shares of its self-mask seed (it sent its input) or t shares of its
masking key (it did not), never both, so it learns only the sum of ``U3``'s inputs. An active
server could claim an online client dropped to learn its masking key after receiving its input:
Bonawitz et al.'s consistency checks and signatures (their actively secure variant) are not
implemented here.

Engines are sans-IO objects, not machines: a :class:`~fedproto.machine.ProtocolMachine` creates
one per aggregation, routes the stage messages to it and sends what it returns
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
import struct
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from fedproto.algorithms import secagg
from fedproto.algorithms.secagg_plus import shamir
from fedproto.algorithms.secagg_plus.config import Modulus, SecAggPlusConfig, _check_int, complete_config, plus_config
from fedproto.algorithms.secagg_plus.messages import (
    CIPHERTEXT_BYTES,
    KEY_BYTES,
    STAGES,
    AdvertiseKeys,
    EncryptedShares,
    ForwardedShares,
    MaskedInput,
    NeighbourKeys,
    UnmaskRequest,
    UnmaskShares,
    frame_limit,
    stage_bytes,
)
from fedproto.errors import InsufficientParticipants, LocalProtocolError, RemoteProtocolError
from fedproto.messages import Broadcast, Message, Outgoing, Send

__all__ = [
    "STAGES",
    "Modulus",
    "SecAggPlusClient",
    "SecAggPlusConfig",
    "SecAggPlusServer",
    "SumOutcome",
    "complete_config",
    "frame_limit",
    "plus_config",
    "stage_bytes",
]

# The public parameters (Modulus, SecAggPlusConfig, plus_config, complete_config) live in
# secagg_plus.config; STAGES and the wire sizes (stage_bytes, frame_limit) with the messages,
# which import without FLINT. All are re-exported here.

_LABEL = b"fedproto/secagg-plus/v1"


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


def _private_key(raw: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(raw)


def _public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes_raw()


def _agree(private: X25519PrivateKey, peer_public: bytes) -> bytes:
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as exc:  # a low-order point or a malformed key
        raise ValueError(f"invalid X25519 public key: {exc}") from exc


def _pair_key(shared: bytes, instance: bytes, u: int, v: int) -> bytes:
    lo, hi = (u, v) if u < v else (v, u)
    return secagg.derive_bytes(shared, _info(b"pair-mask", instance, lo, hi))


def _self_key(seed: bytes, instance: bytes, u: int) -> bytes:
    return secagg.derive_bytes(seed, _info(b"self-mask", instance, u))


def _share_context(instance: bytes, sender: int, receiver: int) -> bytes:
    return _info(b"share", instance, sender, receiver)


@dataclasses.dataclass(frozen=True)
class SumOutcome:
    """What the server learns from one aggregation.

    Attributes:
        total: ``sum_{u in survivors} x_u`` in the algebra, ``[L]``.
        survivors: the clients whose inputs are in ``total`` (``U3``), in client order.
        dropouts: ``{client: stage}`` for each client that dropped, with the stage it did not
            complete (a client that dropped at ``unmask`` is a survivor: its input is in).
    """

    total: np.ndarray
    survivors: tuple[str, ...]
    dropouts: dict[str, str]


# --------------------------------------------------------------------------------------------
# Client
# --------------------------------------------------------------------------------------------


class SecAggPlusClient:
    """One client's side of one aggregation (sans-IO; Bonawitz et al. Fig. 4, "User").

    Call, in order: :meth:`advertise` (stage 1), :meth:`share_keys` with the server's
    :class:`NeighbourKeys` (stage 2), :meth:`receive_shares` with the
    :class:`ForwardedShares` and then :meth:`mask_input` with the input (stage 3), and
    :meth:`unmask` with the :class:`UnmaskRequest` (stage 4). Each returns the message to send
    to the server (``receive_shares`` returns nothing).

    Args:
        config: the public parameters.
        index: this client's index in ``[0, n_clients)``.
        entropy: at least 32 secret random bytes; every key, seed and share coefficient of this
            aggregation is derived from it and ``instance`` (HKDF), so the engine is a pure
            function of its arguments.
        instance: public bytes naming this aggregation (session, round, purpose): keys and masks
            are fresh for every instance.

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
        self._encryption_key = _private_key(derive(_info(b"encryption-key", self.instance, index)))
        self._encryption_public = _public_bytes(self._encryption_key)
        self._masking_raw = derive(_info(b"masking-key", self.instance, index))
        self._masking_key = _private_key(self._masking_raw)
        self._encryption_shared: dict[int, bytes] = {}  # neighbour -> X25519(c_u, c_v), agreed once
        self._self_seed = derive(_info(b"self-seed", self.instance, index))
        self._share_entropy = derive(_info(b"share-coefficients", self.instance, index))
        self.stage = STAGES[0]
        self._neighbour_keys: dict[int, tuple[bytes, bytes]] = {}
        self._received: dict[int, tuple[bytes, bytes]] = {}  # sender -> (share of b_v, share of s_v^SK)
        #: After :meth:`unmask`: the neighbours whose self-mask seed shares this client revealed
        #: (their inputs are in the sum) and those whose masking key shares it revealed (not in it).
        self.revealed: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())

    def _expect(self, stage: str, sender: str) -> None:
        if self.stage != stage:
            raise RemoteProtocolError(
                f"a {stage} message from {sender} while this client's aggregation is at {self.stage}", party=sender
            )

    def advertise(self) -> AdvertiseKeys:
        """Stage 1: the two public keys."""
        if self.stage != STAGES[0]:
            raise LocalProtocolError(f"advertise() at stage {self.stage}")
        self.stage = STAGES[1]
        return AdvertiseKeys(encryption_key=self._encryption_public, masking_key=_public_bytes(self._masking_key))

    def share_keys(self, sender: str, message: NeighbourKeys) -> EncryptedShares:
        """Stage 2: Shamir-share ``b_u`` and ``s_u^SK`` among the neighbours and encrypt.

        Raises:
            RemoteProtocolError: a listed client is not a neighbour, or the list is shorter than
                t (the client's secrets could not be recovered, so it does not take part).
        """
        self._expect(STAGES[1], sender)
        cfg = self.config
        mine = cfg._neighbour_sets[self.index]
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
            raw = keys[row].tobytes()
            self._neighbour_keys[v] = (raw[:KEY_BYTES], raw[KEY_BYTES:])
        # A neighbour's evaluation point is 1 + its rank in the sorted neighbour list the server
        # sent (the server knows the list): small, dense points make reconstruction cheap.
        xs = list(range(1, len(neighbours) + 1))
        b_shares = shamir.split_secret(self._self_seed, xs, cfg.threshold, self._share_entropy + b"b")
        s_shares = shamir.split_secret(self._masking_raw, xs, cfg.threshold, self._share_entropy + b"s")
        ciphertexts = np.empty((len(neighbours), CIPHERTEXT_BYTES), dtype=np.uint8)
        for row, v in enumerate(neighbours):
            peer = self._neighbour_keys[v][0]
            try:
                shared = secagg.x25519_shared(self._encryption_key, peer)
            except ValueError as exc:
                raise RemoteProtocolError(f"client {v}'s encryption key: {exc}", party=sender) from None
            self._encryption_shared[v] = shared
            sealed = secagg.seal_with_shared(
                shared, self._encryption_public, peer, b_shares[row] + s_shares[row], _share_context(self.instance, self.index, v)
            )
            ciphertexts[row] = np.frombuffer(sealed, dtype=np.uint8)
        self.stage = STAGES[2]
        return EncryptedShares(recipients=np.asarray(neighbours, dtype=np.uint32), ciphertexts=ciphertexts)

    def receive_shares(self, sender: str, message: ForwardedShares) -> None:
        """Stage 2, second half: open the shares the neighbours sent.

        Raises:
            RemoteProtocolError: a sender that is not a neighbour with keys, or a ciphertext
                that does not authenticate.
        """
        self._expect(STAGES[2], sender)
        if self._received:
            raise RemoteProtocolError("a second set of forwarded shares", party=sender)
        s = shamir.SHARE_BYTES
        for row, v in enumerate(int(v) for v in message.senders):
            keys = self._neighbour_keys.get(v)
            if keys is None:
                raise RemoteProtocolError(f"forwarded shares from client {v}, which is not a neighbour with keys", party=sender)
            try:
                plain = secagg.open_with_shared(
                    self._encryption_shared[v],
                    keys[0],
                    self._encryption_public,
                    np.asarray(message.ciphertexts[row], dtype=np.uint8).tobytes(),
                    _share_context(self.instance, v, self.index),
                )
            except ValueError as exc:
                raise RemoteProtocolError(f"the shares of client {v} do not open: {exc}", party=sender) from exc
            self._received[v] = (plain[:s], plain[s:])
        if len(self._received) < self.config.threshold:
            raise RemoteProtocolError(
                f"only {len(self._received)} neighbours shared keys; t = {self.config.threshold}", party=sender
            )

    def mask_input(self, values: object) -> MaskedInput:
        """Stage 3: ``y_u = x_u + PRG(b_u) + sum_v sign(u, v) PRG(s_{u,v})``.

        Args:
            values: ``[L]`` integers in ``[0, size)`` of the algebra (ring elements: the
                fixed-point encoding; field elements).

        Raises:
            ValueError: wrong length or an element outside the algebra.
            LocalProtocolError: called before the shares arrived.
        """
        if self.stage != STAGES[2] or not self._received:
            raise LocalProtocolError("mask_input() before the neighbours' shares arrived")
        cfg = self.config
        modulus, length = cfg.modulus, cfg.vector_length
        y = modulus.add(modulus.vector(values, length), modulus.expand(_self_key(self._self_seed, self.instance, self.index), length))
        for v in sorted(self._received):
            shared = _agree(self._masking_key, self._neighbour_keys[v][1])
            mask = modulus.expand(_pair_key(shared, self.instance, self.index, v), length)
            y = modulus.add(y, mask) if self.index < v else modulus.sub(y, mask)
        self.stage = STAGES[3]
        return MaskedInput(masked=modulus.to_wire(y))

    def unmask(self, sender: str, message: UnmaskRequest) -> UnmaskShares:
        """Stage 4: for each neighbour that shared keys, the share of ``s_v^SK`` if it dropped
        (it is in ``message.dropped``), else the share of ``b_v``.

        Raises:
            RemoteProtocolError: this client is listed as dropped, or fewer than t - 1 of its
                neighbours survived (with itself, fewer than t: Bonawitz et al.'s abort rule).
        """
        self._expect(STAGES[3], sender)
        dropped = {int(v) for v in message.dropped}
        if self.index in dropped:
            raise RemoteProtocolError("the server lists this client, which sent its input, as dropped", party=sender)
        alive = [v for v in sorted(self._received) if v not in dropped]
        gone = [v for v in sorted(self._received) if v in dropped]
        if len(alive) + 1 < self.config.threshold:
            raise InsufficientParticipants(
                f"only {len(alive)} neighbours of client {self.index} sent their input; revealing shares needs "
                f"t - 1 = {self.config.threshold - 1}",
                missing=[str(v) for v in gone],
                party=sender,
            )
        self.stage = "done"
        self.revealed = (tuple(alive), tuple(gone))

        def rows(owners: list[int], part: int) -> np.ndarray:
            out = np.empty((len(owners), shamir.SHARE_BYTES), dtype=np.uint8)
            for row, v in enumerate(owners):
                out[row] = np.frombuffer(self._received[v][part], dtype=np.uint8)
            return out

        return UnmaskShares(
            self_owners=np.asarray(alive, dtype=np.uint32),
            self_shares=rows(alive, 0),
            key_owners=np.asarray(gone, dtype=np.uint32),
            key_shares=rows(gone, 1),
        )


# --------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------


class SecAggPlusServer:
    """The server's side of one aggregation (sans-IO; Bonawitz et al. Fig. 4, "Server").

    Feed it each stage message with :meth:`receive` and the clients that go silent with
    :meth:`drop`; both return the messages to send (as :class:`~fedproto.messages.Send` /
    :class:`~fedproto.messages.Broadcast` stamped with ``round_idx`` and the stage). When the
    last stage completes, :attr:`outcome` holds the sum.

    Args:
        config: the public parameters.
        clients: the party name of each client index, ``[n_clients]``.
        round_idx: the round the aggregation's messages are stamped with.
        instance: the public bytes naming this aggregation, as the clients were given them.
        active: the clients expected to take part (default all); the others left the federation
            earlier and count as absent, not as dropouts of this aggregation.

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
        self.round_idx = round_idx
        self.instance = bytes(instance)
        self._index = {name: i for i, name in enumerate(clients)}
        if active is None:
            self._active = set(range(len(clients)))
        else:
            unknown = [a for a in active if a not in self._index]
            if unknown:
                raise ValueError(f"active clients not in the client list: {unknown}")
            self._active = {self._index[a] for a in active}
        self.stage = STAGES[0]
        self.dropouts: dict[str, str] = {}
        self.outcome: SumOutcome | None = None
        self._keys: dict[int, tuple[bytes, bytes]] = {}
        self._shared: dict[int, EncryptedShares] = {}
        self._inputs: dict[int, np.ndarray] = {}
        self._reveals: dict[int, UnmaskShares] = {}
        self._dropped: set[int] = set()
        self._gone: set[int] = set()
        self._gone_unmarked = False  # a gone client may be waited for at the current stage
        self._neighbours_of: dict[int, np.ndarray] = {}
        self._forwarded_from: dict[int, np.ndarray] = {}
        self._unmask_dropped: np.ndarray = np.zeros(0, dtype=np.uint32)
        self._requested: dict[int, np.ndarray] = {}  # survivor -> its dropped neighbours, when any dropped
        # The clients the current stage still waits for, kept as messages arrive (O(1) each).
        self._waiting: set[int] = set(self._active)

    # -- state ----------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """True once the sum is known."""
        return self.outcome is not None

    def _expected(self) -> Mapping[int, object] | set[int]:
        """The clients of the current stage (a set or a dict keyed by client; membership only)."""
        return {
            STAGES[0]: self._active,
            STAGES[1]: self._keys,
            STAGES[2]: self._shared,
            STAGES[3]: self._inputs,
        }.get(self.stage, set())

    def _received(self) -> Mapping[int, object]:
        return {STAGES[0]: self._keys, STAGES[1]: self._shared, STAGES[2]: self._inputs, STAGES[3]: self._reveals}.get(
            self.stage, {}
        )

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
                message, a message of another stage, or contents that do not match what the
                server sent (the forwarded neighbour lists).
            InsufficientParticipants: completing the stage shows the sum cannot be recovered.
        """
        index = self._index.get(sender)
        if index is not None and index in self._dropped:
            return []
        expected_type = {
            STAGES[0]: AdvertiseKeys,
            STAGES[1]: EncryptedShares,
            STAGES[2]: MaskedInput,
            STAGES[3]: UnmaskShares,
        }.get(self.stage)
        if type(message) is not expected_type:
            raise RemoteProtocolError(
                f"unexpected {type(message).__name__} from {sender} at stage {self.stage}",
                party=sender,
                round_idx=self.round_idx,
                phase=self.stage,
            )
        if index is None or index not in self._expected():
            raise RemoteProtocolError(
                f"{sender} is not a client of stage {self.stage} of this aggregation",
                party=sender,
                round_idx=self.round_idx,
                phase=self.stage,
            )
        store = self._received()
        if index in store:
            raise RemoteProtocolError(
                f"second {self.stage} message from {sender}", party=sender, round_idx=self.round_idx, phase=self.stage
            )
        store[index] = self._check(index, sender, message)  # type: ignore[index]
        self._waiting.discard(index)
        return self._advance()

    def _check(self, index: int, sender: str, message: Message) -> object:
        """Check a stage message against what this server sent; return what to keep of it."""

        def refuse(what: str) -> RemoteProtocolError:
            return RemoteProtocolError(f"{sender}: {what}", party=sender, round_idx=self.round_idx, phase=self.stage)

        if isinstance(message, AdvertiseKeys):
            return (message.encryption_key, message.masking_key)
        if isinstance(message, EncryptedShares):
            if not np.array_equal(message.recipients, self._neighbours_of[index]):
                raise refuse("encrypted shares for other clients than its neighbours with keys")
        elif isinstance(message, MaskedInput):
            try:
                return self.config.modulus.from_wire(np.asarray(message.masked), self.config.vector_length)
            except ValueError as exc:
                raise refuse(f"masked input: {exc}") from None
        elif isinstance(message, UnmaskShares):
            holders = self._forwarded_from[index]
            gone = self._requested.get(index, self._unmask_dropped[:0])  # what its request named
            alive = np.setdiff1d(holders, gone)
            if not (np.array_equal(message.self_owners, alive) and np.array_equal(message.key_owners, gone)):
                raise refuse("unmask shares that do not match its neighbours and the dropped list")
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
            stage = self.stage
            if stage == STAGES[0]:
                out += self._close_advertise()
                self._waiting = set(self._keys)
                self._gone_unmarked = bool(self._gone)
            elif stage == STAGES[1]:
                out += self._close_share_keys()
                self._waiting = set(self._shared)
                self._gone_unmarked = bool(self._gone)
            elif stage == STAGES[2]:
                out += self._close_masked_input()
                self._waiting = set(self._inputs)
                self._gone_unmarked = bool(self._gone)
            else:
                self._close_unmask()

    def _fail(self, what: str, owners: Iterable[int], silent: Iterable[int]) -> InsufficientParticipants:
        owners = sorted(set(owners))
        silent_names = sorted({self.clients[i] for i in silent})
        names = [self.clients[i] for i in owners]
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        absent = len(self.clients) - len(self._active)
        return InsufficientParticipants(
            f"secure aggregation cannot recover the sum: {what}"
            + (f" (clients {shown})" if names else "")
            + f", t = {self.config.threshold}; dropped: {', '.join(silent_names) if silent_names else 'none'}"
            + (f"; {absent} of the {len(self.clients)} clients left in earlier rounds" if absent else ""),
            missing=silent_names,
            party=names[0] if len(names) == 1 else None,
            round_idx=self.round_idx,
            phase=self.stage,
        )

    def _close_advertise(self) -> list[Outgoing]:
        cfg = self.config
        present = set(self._keys)
        if len(present) < cfg.threshold:
            raise self._fail(f"only {len(present)} clients advertised keys", (), self._dropped)
        short = []
        out: list[Outgoing] = []
        for u in sorted(present):
            nb = np.asarray([v for v in cfg.neighbours[u] if v in present], dtype=np.uint32)
            if nb.size < cfg.threshold:
                short.append(u)
            self._neighbours_of[u] = nb
        if short:
            raise self._fail("fewer than t neighbours advertised keys", short, self._dropped)
        for u in sorted(present):
            nb = self._neighbours_of[u]
            keys = np.empty((nb.size, 2 * KEY_BYTES), dtype=np.uint8)
            for row, v in enumerate(nb.tolist()):
                keys[row] = np.frombuffer(self._keys[v][0] + self._keys[v][1], dtype=np.uint8)
            out.append(Send(self.clients[u], NeighbourKeys(neighbours=nb, keys=keys), self.round_idx, STAGES[0]))
        self.stage = STAGES[1]
        return out

    def _close_share_keys(self) -> list[Outgoing]:
        cfg = self.config
        senders = set(self._shared)
        inbox: dict[int, list[tuple[int, np.ndarray]]] = {v: [] for v in senders}
        for u in sorted(senders):
            message = self._shared[u]
            for row, v in enumerate(message.recipients.tolist()):
                if v in inbox:
                    inbox[v].append((u, message.ciphertexts[row]))
        short = [v for v in sorted(senders) if len(inbox[v]) < cfg.threshold]
        if short:
            raise self._fail("fewer than t neighbours shared keys", short, self._dropped)
        out: list[Outgoing] = []
        for v in sorted(senders):
            rows = inbox[v]  # already in increasing sender order
            from_ = np.asarray([u for u, _ in rows], dtype=np.uint32)
            self._forwarded_from[v] = from_
            ciphertexts = np.stack([c for _, c in rows]).astype(np.uint8, copy=False)
            out.append(
                Send(self.clients[v], ForwardedShares(senders=from_, ciphertexts=ciphertexts), self.round_idx, STAGES[1])
            )
        self.stage = STAGES[2]
        return out

    def _close_masked_input(self) -> list[Outgoing]:
        cfg = self.config
        survivors = set(self._inputs)
        gone = sorted(set(self._shared) - survivors)
        if len(survivors) < cfg.threshold:
            raise self._fail(f"only {len(survivors)} clients sent their input", (), self._dropped)
        # Every survivor's self-mask seed and every dropped client's masking key needs t holders
        # among the survivors (the only clients asked to reveal).
        short = [
            u
            for u in sorted(survivors) + gone
            if sum(1 for w in self._forwarded_from[u].tolist() if w in survivors) < cfg.threshold
        ]
        if short:
            raise self._fail("fewer than t neighbours sent their input", short, self._dropped)
        self._unmask_dropped = np.asarray(gone, dtype=np.uint32)
        self.stage = STAGES[3]
        if not gone:
            dests = tuple(self.clients[u] for u in sorted(survivors))
            return [Broadcast(dests, UnmaskRequest(dropped=self._unmask_dropped), self.round_idx, STAGES[2])]
        # Each survivor hears only of its own neighbours that dropped: O(k) bytes and O(k) work
        # per survivor, not O(n) (a set lookup per neighbour, not an intersection with all).
        gone_set = set(gone)
        out: list[Outgoing] = []
        for u in sorted(survivors):
            mine = np.asarray([w for w in self._forwarded_from[u].tolist() if w in gone_set], dtype=np.uint32)
            self._requested[u] = mine
            out.append(Send(self.clients[u], UnmaskRequest(dropped=mine), self.round_idx, STAGES[2]))
        return out

    def _close_unmask(self) -> None:
        cfg = self.config
        modulus, length = cfg.modulus, cfg.vector_length
        survivors = sorted(self._inputs)
        gone = self._unmask_dropped.tolist()
        # owner -> (holders, share rows) of its self-mask seed (survivors) or masking key (dropped)
        held: dict[int, tuple[list[int], list[np.ndarray]]] = {u: ([], []) for u in (*survivors, *gone)}
        for w, message in self._reveals.items():
            for owners, shares in ((message.self_owners, message.self_shares), (message.key_owners, message.key_shares)):
                for row, u in enumerate(owners.tolist()):
                    held[u][0].append(w)
                    held[u][1].append(shares[row])
        short = [u for u, (holders, _) in held.items() if len(holders) < cfg.threshold]
        if short:
            raise self._fail("fewer than t neighbours revealed shares", short, self._dropped)

        def points(u: int) -> dict[int, bytes]:
            # The client shared with x = 1 + the holder's rank in its neighbour list; the t
            # smallest points are the ones reconstruction uses.
            holders, rows = held[u]
            xs = np.searchsorted(self._neighbours_of[u], np.asarray(holders, dtype=np.uint32)) + 1
            first = np.argsort(xs, kind="stable")[: cfg.threshold]
            return {int(xs[i]): rows[i].tobytes() for i in first.tolist()}

        seeds = shamir.combine_many([points(u) for u in survivors], cfg.threshold)
        keys = shamir.combine_many([points(v) for v in gone], cfg.threshold)
        total = modulus.zeros(length)
        for u in survivors:
            total = modulus.add(total, self._inputs[u])
        for u, seed in zip(survivors, seeds):
            total = modulus.sub(total, modulus.expand(_self_key(seed, self.instance, u), length))
        survivor_set = set(survivors)
        for v, raw in zip(gone, keys):
            private = _private_key(raw)
            for u in cfg.neighbours[v]:
                if u not in survivor_set:
                    continue
                shared = _agree(private, self._keys[u][1])
                mask = modulus.expand(_pair_key(shared, self.instance, u, v), length)
                # y_u carries +mask when u < v, -mask otherwise: take it out.
                total = modulus.sub(total, mask) if u < v else modulus.add(total, mask)
        self.stage = "done"
        self.outcome = SumOutcome(
            total=total, survivors=tuple(self.clients[u] for u in survivors), dropouts=dict(self.dropouts)
        )

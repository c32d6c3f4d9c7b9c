"""SecAgg+'s wire messages: four stages, one request and one reply each.

Clients are named on the wire by their 0-based index in the aggregation's client list (a
``uint32``), so a message's size depends on the neighbourhood, not on party names.

* ``advertise-keys``: :class:`AdvertiseKeys` client -> server (two X25519 public keys);
  :class:`NeighbourKeys` server -> client (the keys of its neighbours that advertised).
* ``share-keys``: :class:`EncryptedShares` client -> server (one AEAD ciphertext per neighbour,
  holding a Shamir share of the client's self-mask seed and one of its masking key);
  :class:`ForwardedShares` server -> client (the ciphertexts addressed to it).
* ``masked-input``: :class:`MaskedInput` client -> server (the input plus its masks);
  :class:`UnmaskRequest` server -> every client that sent one (its neighbours that did not).
* ``unmask``: :class:`UnmaskShares` client -> server (for each neighbour, either the share of its
  self-mask seed, if it sent its input, or the share of its masking key, if it did not; never
  both).

References:
    Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning",
    ACM CCS 2017, Fig. 4 (rounds 0-3). Bell et al., "Secure Single-Server Aggregation with
    (Poly)Logarithmic Overhead", ACM CCS 2020, Sec. 3 (the same rounds over a sparse graph).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from fedproto.messages import Message, array_field

if TYPE_CHECKING:
    from fedproto.algorithms.secagg_plus.config import SecAggPlusConfig

__all__ = [
    "CIPHERTEXT_BYTES",
    "KEY_BYTES",
    "SHARE_BYTES",
    "STAGES",
    "TO_CLIENT",
    "TO_SERVER",
    "AdvertiseKeys",
    "EncryptedShares",
    "ForwardedShares",
    "MaskedInput",
    "NeighbourKeys",
    "UnmaskRequest",
    "UnmaskShares",
    "frame_limit",
    "stage_bytes",
]

STAGES = ("advertise-keys", "share-keys", "masked-input", "unmask")
"""The four stages, in order; each is also the metering phase of its messages."""

SHARE_BYTES = 33
"""Length of one Shamir share on the wire: a field element ``< p < 2^257``, big-endian (``p`` is
:data:`~fedproto.algorithms.secagg_plus.shamir.SHARE_PRIME`). Defined here, not in ``shamir``, so
the messages import without FLINT."""

KEY_BYTES = 32
"""Bytes of one raw X25519 public key."""
CIPHERTEXT_BYTES = 2 * SHARE_BYTES + 16
"""Bytes of one encrypted share pair: two Shamir shares and the 16-byte Poly1305 tag."""


def _check_indices(values: np.ndarray, what: str) -> None:
    if values.ndim != 1:
        raise ValueError(f"{what} must be a 1-D uint32 array, got shape {values.shape}")
    if values.size > 1 and not bool(np.all(values[1:] > values[:-1])):
        raise ValueError(f"{what} must be strictly increasing client indices")


def _check_rows(values: np.ndarray, rows: int, width: int, what: str) -> None:
    if values.shape != (rows, width):
        raise ValueError(f"{what} must have shape [{rows}, {width}], got {list(values.shape)}")


class AdvertiseKeys(Message, tag="sa.adv"):
    """A client's two fresh X25519 public keys for one aggregation (32 bytes each).

    ``encryption_key`` agrees the keys that encrypt shares between neighbours; ``masking_key``
    agrees the pairwise mask seeds. They are separate because a dropped client's masking key is
    revealed to the server, which must not open the shares sent to it.
    """

    encryption_key: bytes
    masking_key: bytes

    def __post_init__(self) -> None:
        for name in ("encryption_key", "masking_key"):
            value = getattr(self, name)
            if not isinstance(value, bytes) or len(value) != KEY_BYTES:
                raise ValueError(f"{name} must be {KEY_BYTES} raw bytes")


class NeighbourKeys(Message, tag="sa.nbr"):
    """The neighbours of the receiving client that advertised keys, and their keys.

    ``neighbours`` ``uint32 [m]`` increasing client indices; ``keys`` ``uint8 [m, 64]``: each
    neighbour's encryption key then masking key.
    """

    neighbours: np.ndarray = array_field("uint32", 1)
    keys: np.ndarray = array_field("uint8", 2)

    def __post_init__(self) -> None:
        _check_indices(self.neighbours, "neighbours")
        _check_rows(self.keys, self.neighbours.size, 2 * KEY_BYTES, "keys")


class EncryptedShares(Message, tag="sa.enc"):
    """One ciphertext per neighbour (``uint8 [m, CIPHERTEXT_BYTES]``), for ``recipients``
    (``uint32 [m]``, increasing)."""

    recipients: np.ndarray = array_field("uint32", 1)
    ciphertexts: np.ndarray = array_field("uint8", 2)

    def __post_init__(self) -> None:
        _check_indices(self.recipients, "recipients")
        _check_rows(self.ciphertexts, self.recipients.size, CIPHERTEXT_BYTES, "ciphertexts")


class ForwardedShares(Message, tag="sa.fwd"):
    """The ciphertexts addressed to the receiving client (``uint8 [m, CIPHERTEXT_BYTES]``), from
    ``senders`` (``uint32 [m]``, increasing): exactly its neighbours that shared keys."""

    senders: np.ndarray = array_field("uint32", 1)
    ciphertexts: np.ndarray = array_field("uint8", 2)

    def __post_init__(self) -> None:
        _check_indices(self.senders, "senders")
        _check_rows(self.ciphertexts, self.senders.size, CIPHERTEXT_BYTES, "ciphertexts")


class MaskedInput(Message, tag="sa.in"):
    """The client's input plus its self mask and pairwise masks, ``[L, 1]`` ``uint32``/``uint64``
    (the ring ``Z_2^32``/``Z_2^64``) or ``[L, width]`` ``uint8`` (a prime field, big-endian
    rows of ``width = ceil(bitlength(p) / 8)`` bytes)."""

    masked: np.ndarray = array_field(("uint8", "uint32", "uint64"), 2)

    def __post_init__(self) -> None:
        if self.masked.shape[0] < 1 or self.masked.shape[1] < 1:
            raise ValueError(f"masked must have shape [L, width] with L, width >= 1, got {list(self.masked.shape)}")
        if self.masked.dtype != np.uint8 and self.masked.shape[1] != 1:
            raise ValueError(f"a ring vector travels as [L, 1], got {list(self.masked.shape)}")


class UnmaskRequest(Message, tag="sa.req"):
    """The receiving client's neighbours (``uint32 [m]``, increasing) that shared keys but sent no
    masked input: their masking keys are to be revealed, every other neighbour's self-mask seed.
    Only the receiver's own neighbours are listed, so the message is ``O(k)`` bytes whatever the
    number of clients."""

    dropped: np.ndarray = array_field("uint32", 1)

    def __post_init__(self) -> None:
        _check_indices(self.dropped, "dropped")


class UnmaskShares(Message, tag="sa.shr"):
    """A client's shares for the server: of the self-mask seeds of ``self_owners`` (``uint32
    [a]``, ``self_shares`` ``uint8 [a, SHARE_BYTES]``) and of the masking keys of ``key_owners``
    (``uint32 [b]``, ``key_shares`` ``uint8 [b, SHARE_BYTES]``). The two owner lists are
    disjoint."""

    self_owners: np.ndarray = array_field("uint32", 1)
    self_shares: np.ndarray = array_field("uint8", 2)
    key_owners: np.ndarray = array_field("uint32", 1)
    key_shares: np.ndarray = array_field("uint8", 2)

    def __post_init__(self) -> None:
        _check_indices(self.self_owners, "self_owners")
        _check_indices(self.key_owners, "key_owners")
        _check_rows(self.self_shares, self.self_owners.size, SHARE_BYTES, "self_shares")
        _check_rows(self.key_shares, self.key_owners.size, SHARE_BYTES, "key_shares")
        if np.intersect1d(self.self_owners, self.key_owners).size:
            raise ValueError("a client's self-mask seed and masking key shares cannot both be revealed")


TO_SERVER: tuple[type[Message], ...] = (AdvertiseKeys, EncryptedShares, MaskedInput, UnmaskShares)
"""The client -> server message of each stage, in :data:`STAGES` order: what a server machine
routes to its :class:`~fedproto.algorithms.secagg_plus.engine.SecAggPlusServer`."""
TO_CLIENT: tuple[type[Message], ...] = (NeighbourKeys, ForwardedShares, UnmaskRequest)
"""The server -> client replies of the first three stages, in :data:`STAGES` order (the last
stage's reply is the embedding protocol's own result message)."""


def stage_bytes(config: SecAggPlusConfig, *, dropped: int = 0) -> dict[str, dict[str, int]]:
    """Data bytes one client sends and receives per stage when no one drops (or ``dropped`` of its
    neighbours drop at the masked input): the analytic cost, without envelopes.

    Per client (``k`` = degree, ``L`` = vector length, ``w`` = element bytes, ``s`` =
    :data:`~fedproto.algorithms.secagg_plus.SHARE_BYTES`, ``c`` = ciphertext bytes
    ``2 s + 16``, indices 4 bytes):

    * ``advertise-keys``: sent ``64``; received ``k (4 + 64)``;
    * ``share-keys``: sent ``k (4 + c)``; received ``k (4 + c)``;
    * ``masked-input``: sent ``L w``; received ``4 D`` (its neighbours that dropped, ``D``);
    * ``unmask``: sent ``k (4 + s)``; received nothing.

    So a client's bytes grow as ``k``: ``O(log n)`` for SecAgg+, ``n - 1`` for the complete graph.

    Returns:
        ``{stage: {"sent": bytes, "received": bytes}}``.

    References:
        Bell et al., ACM CCS 2020, Table 1 (client communication ``O(log n + L)``).
    """
    k, s = config.degree, SHARE_BYTES
    w = config.modulus.width
    return {
        "advertise-keys": {"sent": 2 * KEY_BYTES, "received": k * (4 + 2 * KEY_BYTES)},
        "share-keys": {"sent": k * (4 + CIPHERTEXT_BYTES), "received": k * (4 + CIPHERTEXT_BYTES)},
        "masked-input": {"sent": config.vector_length * w, "received": 4 * dropped},
        "unmask": {"sent": k * (4 + s), "received": 0},
    }


def frame_limit(config: SecAggPlusConfig, *, phase_bytes: int = 16) -> int:
    """The largest frame (bytes, envelope included) any party of an aggregation sends: the
    stage messages at ``k`` neighbours (the unmask request names only the receiver's dropped
    neighbours, at most ``k``), and an input of ``L`` elements (:func:`fedproto.framesize.max_frame_bytes`)."""
    from fedproto.framesize import max_frame_bytes

    k, length = config.degree, config.vector_length
    modulus = config.modulus
    wire = (length, 1) if modulus.ring_bits is not None else (length, modulus.width)
    wire_dtype = modulus.dtype if modulus.ring_bits is not None else np.dtype(np.uint8)
    ct = (k, CIPHERTEXT_BYTES)
    share = (k, SHARE_BYTES)
    bound = functools.partial(max_frame_bytes, phase_bytes=phase_bytes)
    return max(
        bound(AdvertiseKeys, plain={"encryption_key": bytes(KEY_BYTES), "masking_key": bytes(KEY_BYTES)}),
        bound(NeighbourKeys, arrays={"neighbours": (k,), "keys": (k, 2 * KEY_BYTES)}),
        bound(EncryptedShares, arrays={"recipients": (k,), "ciphertexts": ct}),
        bound(ForwardedShares, arrays={"senders": (k,), "ciphertexts": ct}),
        bound(MaskedInput, arrays={"masked": wire}, dtypes={"masked": wire_dtype}),
        bound(UnmaskRequest, arrays={"dropped": (k,)}),
        bound(
            UnmaskShares,
            arrays={"self_owners": (k,), "self_shares": share, "key_owners": (k,), "key_shares": share},
        ),
    )

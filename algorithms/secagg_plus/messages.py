"""SecAgg+'s wire messages: a set-up stage once per run, then two stages per aggregation.

Clients are named on the wire by their 0-based index in the aggregation's client list (a
``uint32``), so a message's size depends on the neighbourhood, not on party names. Where a list of
clients is implied (the receiver's neighbours, which both sides track), it is not sent.

* ``advertise-keys`` (set-up, once per run): :class:`AdvertiseKeys` client -> server (one X25519
  public key); :class:`NeighbourKeys` server -> client (the keys of its neighbours that advertised).
* ``masked-input`` (every aggregation): :class:`MaskedInput` client -> server (the input plus its
  masks, and one AEAD ciphertext per neighbour holding a Shamir share of this aggregation's
  self-mask seed); :class:`UnmaskRequest` server -> every client that sent one (its neighbours
  that did not, and the ciphertexts its other neighbours addressed to it).
* ``unmask`` (every aggregation): :class:`UnmaskShares` client -> server (for each neighbour,
  either the share of its self-mask seed, if it sent its input, or this aggregation's pairwise
  mask key with it, if it did not; never both); :class:`Remask` server -> client only when a
  client that went silent here leaves a mask that cannot be removed: the aggregation is masked
  again, with fresh masks, among the clients that answered.

References:
    Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning",
    ACM CCS 2017, Fig. 4 (rounds 0-3). Bell et al., "Secure Single-Server Aggregation with
    (Poly)Logarithmic Overhead", ACM CCS 2020, Sec. 3 (the same rounds over a sparse graph).
    ``docs/protocols/secagg_plus.md`` says what changes when the set-up is reused, and why it is
    safe.
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
    "AGGREGATION_STAGES",
    "STAGES",
    "TO_CLIENT",
    "TO_SERVER",
    "AdvertiseKeys",
    "MaskedInput",
    "NeighbourKeys",
    "Remask",
    "UnmaskRequest",
    "UnmaskShares",
    "frame_limit",
    "setup_and_aggregation_bytes",
    "stage_bytes",
]

STAGES = ("advertise-keys", "masked-input", "unmask")
"""The stages, in order; each is also the metering phase of its messages. The first is the run's
set-up; every aggregation runs the other two."""
AGGREGATION_STAGES = STAGES[1:]
"""The stages every aggregation runs (the first, the set-up, runs once per run): where a client can
drop in any round."""

SHARE_BYTES = 33
"""Length of one Shamir share on the wire: a field element ``< p < 2^257``, big-endian (``p`` is
:data:`~fedproto.algorithms.secagg_plus.shamir.SHARE_PRIME`). Defined here, not in ``shamir``, so
the messages import without FLINT."""

KEY_BYTES = 32
"""Bytes of one raw X25519 public key, and of one pairwise mask key."""
CIPHERTEXT_BYTES = SHARE_BYTES + 16
"""Bytes of one encrypted share: a Shamir share and the 16-byte Poly1305 tag."""


def _check_indices(values: np.ndarray, what: str) -> None:
    if values.ndim != 1:
        raise ValueError(f"{what} must be a 1-D uint32 array, got shape {values.shape}")
    if values.size > 1 and not bool(np.all(values[1:] > values[:-1])):
        raise ValueError(f"{what} must be strictly increasing client indices")


def _check_width(values: np.ndarray, width: int, what: str) -> None:
    if values.ndim != 2 or values.shape[1] != width:
        raise ValueError(f"{what} must have shape [m, {width}], got {list(values.shape)}")


class AdvertiseKeys(Message, tag="sa.adv"):
    """A client's X25519 public key for the run (32 raw bytes). Every key between it and a
    neighbour (the pairwise mask keys and the key that encrypts shares) is agreed from it once."""

    public_key: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.public_key, bytes) or len(self.public_key) != KEY_BYTES:
            raise ValueError(f"public_key must be {KEY_BYTES} raw bytes")


class NeighbourKeys(Message, tag="sa.nbr"):
    """The neighbours of the receiving client that advertised keys, and their keys.

    ``neighbours`` ``uint32 [m]`` increasing client indices; ``keys`` ``uint8 [m, 32]``.
    """

    neighbours: np.ndarray = array_field("uint32", 1)
    keys: np.ndarray = array_field("uint8", 2)

    def __post_init__(self) -> None:
        _check_indices(self.neighbours, "neighbours")
        _check_width(self.keys, KEY_BYTES, "keys")
        if self.keys.shape[0] != self.neighbours.size:
            raise ValueError(f"keys must have one row per neighbour ({self.neighbours.size}), got {self.keys.shape[0]}")


class MaskedInput(Message, tag="sa.in"):
    """The client's input plus its self mask and pairwise masks, and its encrypted shares.

    ``masked``: ``[L, 1]`` ``uint32``/``uint64`` (the ring ``Z_2^32``/``Z_2^64``) or ``[L, width]``
    ``uint8`` (a prime field, big-endian rows of ``width = ceil(bitlength(p) / 8)`` bytes).
    ``shares``: ``uint8 [m, CIPHERTEXT_BYTES]``, one ciphertext per neighbour the client masks
    with, in increasing neighbour order (the server tracks that list: it is not sent).
    """

    masked: np.ndarray = array_field(("uint8", "uint32", "uint64"), 2)
    shares: np.ndarray = array_field("uint8", 2)

    def __post_init__(self) -> None:
        if self.masked.shape[0] < 1 or self.masked.shape[1] < 1:
            raise ValueError(f"masked must have shape [L, width] with L, width >= 1, got {list(self.masked.shape)}")
        if self.masked.dtype != np.uint8 and self.masked.shape[1] != 1:
            raise ValueError(f"a ring vector travels as [L, 1], got {list(self.masked.shape)}")
        _check_width(self.shares, CIPHERTEXT_BYTES, "shares")


class UnmaskRequest(Message, tag="sa.req"):
    """What the server asks of a client that sent its input.

    ``dropped``: ``uint32 [D]`` increasing, the client's neighbours that sent no input in this
    aggregation (their pairwise mask keys are to be revealed). ``shares``: ``uint8 [m - D,
    CIPHERTEXT_BYTES]``, the ciphertexts its other neighbours addressed to it, in increasing
    neighbour order (their self-mask seed shares are to be revealed). Only the receiver's own
    neighbours appear, so the message is ``O(k)`` bytes whatever the number of clients.
    """

    dropped: np.ndarray = array_field("uint32", 1)
    shares: np.ndarray = array_field("uint8", 2)

    def __post_init__(self) -> None:
        _check_indices(self.dropped, "dropped")
        _check_width(self.shares, CIPHERTEXT_BYTES, "shares")


class UnmaskShares(Message, tag="sa.shr"):
    """A client's answer, in the order of its :class:`UnmaskRequest`: ``shares`` ``uint8 [m - D,
    SHARE_BYTES]``, the self-mask seed shares of the neighbours that sent their input, and
    ``pair_keys`` ``uint8 [D, KEY_BYTES]``, this aggregation's pairwise mask key with each
    neighbour that did not. A neighbour is in one list or the other, never both."""

    shares: np.ndarray = array_field("uint8", 2)
    pair_keys: np.ndarray = array_field("uint8", 2)

    def __post_init__(self) -> None:
        _check_width(self.shares, SHARE_BYTES, "shares")
        _check_width(self.pair_keys, KEY_BYTES, "pair_keys")


class Remask(Message, tag="sa.rem"):
    """Mask the same input again, for attempt ``attempt`` (>= 1) of this aggregation: a client that
    sent its input went silent at ``unmask`` and left a mask that cannot be removed. Sent only to
    the clients that answered the unmask request; fresh keys and masks are derived for the attempt.
    """

    attempt: int

    def __post_init__(self) -> None:
        if not isinstance(self.attempt, int) or isinstance(self.attempt, bool) or not 1 <= self.attempt < 2**16:
            raise ValueError(f"attempt must be an int in [1, 65536), got {self.attempt!r}")


TO_SERVER: tuple[type[Message], ...] = (AdvertiseKeys, MaskedInput, UnmaskShares)
"""The client -> server message of each stage, in :data:`STAGES` order: what a server machine
routes to its :class:`~fedproto.algorithms.secagg_plus.engine.SecAggPlusServer`."""
TO_CLIENT: tuple[type[Message], ...] = (NeighbourKeys, UnmaskRequest, Remask)
"""The server -> client replies of each stage, in :data:`STAGES` order (the unmask stage's usual
reply is the embedding protocol's own result message; :class:`Remask` is the exception)."""


def stage_bytes(config: SecAggPlusConfig, *, dropped: int = 0) -> dict[str, dict[str, int]]:
    """Data bytes one client sends and receives per stage when no one drops (or ``dropped`` of its
    neighbours drop at the masked input): the analytic cost, without envelopes.

    Per client (``k`` = degree, ``L`` = vector length, ``w`` = element bytes, ``s`` =
    :data:`SHARE_BYTES`, ``c`` = ciphertext bytes ``s + 16``, ``D`` = ``dropped``, indices 4 bytes):

    * ``advertise-keys`` (once per run): sent ``32``; received ``k (4 + 32)``;
    * ``masked-input``: sent ``L w + k c``; received ``4 D + (k - D) c``;
    * ``unmask``: sent ``(k - D) s + 32 D``; received nothing (the protocol's result follows).

    So a client's bytes grow as ``k``: ``O(log n)`` for SecAgg+, ``n - 1`` for the complete graph.

    Returns:
        ``{stage: {"sent": bytes, "received": bytes}}``.

    References:
        Bell et al., ACM CCS 2020, Table 1 (client communication ``O(log n + L)``).
    """
    k, s, c, d = config.degree, SHARE_BYTES, CIPHERTEXT_BYTES, dropped
    w = config.modulus.width
    return {
        "advertise-keys": {"sent": KEY_BYTES, "received": k * (4 + KEY_BYTES)},
        "masked-input": {"sent": config.vector_length * w + k * c, "received": 4 * d + (k - d) * c},
        "unmask": {"sent": (k - d) * s + KEY_BYTES * d, "received": 0},
    }


def setup_and_aggregation_bytes(config: SecAggPlusConfig) -> tuple[int, int]:
    """``(set-up, per aggregation)``: the data bytes one client sends and receives in the run's
    set-up, and in each aggregation after it, when no one drops (:func:`stage_bytes` summed)."""
    per_stage = stage_bytes(config)
    setup = sum(per_stage[STAGES[0]].values())
    return setup, sum(sum(per_stage[stage].values()) for stage in AGGREGATION_STAGES)


def frame_limit(config: SecAggPlusConfig, *, phase_bytes: int = 16) -> int:
    """The largest frame (bytes, envelope included) any party of an aggregation sends: the
    stage messages at ``k`` neighbours (the unmask request names only the receiver's neighbours,
    at most ``k``), and an input of ``L`` elements (:func:`fedproto.framesize.max_frame_bytes`)."""
    from fedproto.framesize import max_frame_bytes

    k, length = config.degree, config.vector_length
    modulus = config.modulus
    wire = (length, 1) if modulus.ring_bits is not None else (length, modulus.width)
    wire_dtype = modulus.dtype if modulus.ring_bits is not None else np.dtype(np.uint8)
    ct = (k, CIPHERTEXT_BYTES)
    bound = functools.partial(max_frame_bytes, phase_bytes=phase_bytes)
    return max(
        bound(AdvertiseKeys, plain={"public_key": bytes(KEY_BYTES)}),
        bound(NeighbourKeys, arrays={"neighbours": (k,), "keys": (k, KEY_BYTES)}),
        bound(MaskedInput, arrays={"masked": wire, "shares": ct}, dtypes={"masked": wire_dtype}),
        # every neighbour listed as dropped and every ciphertext forwarded: a bound on both
        bound(UnmaskRequest, arrays={"dropped": (k,), "shares": ct}),
        bound(UnmaskShares, arrays={"shares": (k, SHARE_BYTES), "pair_keys": (k, KEY_BYTES)}),
        bound(Remask),
    )

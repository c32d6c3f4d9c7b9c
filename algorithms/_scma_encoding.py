"""SCMA's client side: power-sum syndromes of a count vector, their updates, and the zero-sum masks.

Part of :mod:`fedproto.algorithms.scma` (which re-exports every public name here and describes the
protocol): `rs_syndromes` encodes a client's counts as ``T`` Reed-Solomon syndromes (FLINT power
series), `bin_powers` and `update_syndromes` change them bin by bin, `mask_syndromes` adds a mask;
`dealer_masks` (a trusted dealer, for tests), `pairwise_seed` (X25519 + HKDF-SHA256) and
`pairwise_masks` (a ChaCha20 stream per pair and round, Bonawitz et al.) make masks that sum to
zero over the clients.

References:
    Pan, Sima, Prakash, Rana, Milenkovic. Machine Unlearning of Federated Clusters. ICLR 2023,
    Sec. 4.1 and Algorithm 2 (SCMA).
    Bonawitz et al. Practical Secure Aggregation for Privacy-Preserving Machine Learning. ACM CCS
    2017 (pairwise masks from key agreement).
    Spec ``mufc.md`` sections 2.2 (encoding) and 2.3 (masks).
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Mapping, Sequence

import flint
import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from fedproto.algorithms._scma_field import (
    _check_count,
    _check_elements,
    _check_modulus,
    _coefficients,
    _column_sums,
    _int_bytes,
    _powers,
    _prime_ctx,
    field_width,
    uniform_elements,
)
from fedproto.algorithms.secagg import _chacha20_stream, _check_int, _length_prefixed, derive_bytes

__all__ = [
    "bin_powers",
    "dealer_masks",
    "mask_syndromes",
    "pairwise_masks",
    "pairwise_seed",
    "rs_syndromes",
    "update_syndromes",
]

_PAIR_SEED_BYTES = 32
_PAIR_SEED_INFO = b"fedproto/scma/pair-seed/v1"
_PAIR_MASK_INFO = b"fedproto/scma/pair-mask/v1"
_DEALER_INFO = b"fedproto/scma/dealer-mask/v1"


# --------------------------------------------------------------------------------------------
# Client encoding
# --------------------------------------------------------------------------------------------


def _check_counts(counts: object, p: int) -> list[tuple[int, int]]:
    if not isinstance(counts, Mapping):
        raise TypeError(f"counts must be a mapping {{index: count}}, got {type(counts).__name__}")
    items = []
    for j, q in counts.items():
        j = _check_int("bin index", j)
        q = _check_int(f"count of bin {j}", q)
        if not 1 <= j < p:
            raise ValueError(f"bin index {j} is outside [1, p - 1] with p = {p}")
        if not 0 <= q < p:
            raise ValueError(f"count {q} of bin {j} is outside [0, p - 1] with p = {p}")
        if q:
            items.append((j, q))
    return items


def _syndrome_series(ctx: flint.fmpz_mod_poly_ctx, items: list[tuple[int, int]], length: int):
    """``sum_j q_j / (1 - j x) mod x^length``: the generating function of the syndromes.

    ``sum_i S_{i+1} x^i = sum_j q_j sum_i (j x)^i = sum_j q_j / (1 - j x)``; the fractions are
    added pairwise in a balanced tree, then one power-series division gives the coefficients.
    """
    level = [(ctx([q]), ctx([1, -j])) for j, q in items]
    while len(level) > 1:
        pairs = [
            (n1 * d2 + n2 * d1, d1 * d2)
            for (n1, d1), (n2, d2) in zip(level[0::2], level[1::2], strict=False)
        ]
        level = pairs + ([level[-1]] if len(level) % 2 else [])
    numerator, denominator = level[0]
    return numerator.mul_low(denominator.inverse_series_trunc(length), length)


def rs_syndromes(counts: Mapping[int, int], p: int, n_syndromes: int) -> list[int]:
    """A client's unmasked syndromes ``S_i = sum_j q_j * j^(i-1) mod p`` for ``i = 1..T``.

    Computed as the power series ``sum_j q_j / (1 - j x)`` truncated at ``x^T`` (FLINT), i.e.
    ``O(M(T) + M(K) log K)`` field operations instead of the paper's ``O(K T)`` direct sum; the
    result is identical. ``S_1`` is the plain count total.

    Args:
        counts: sparse count vector ``{j: q_j}``; indices are 1-based ints in ``[1, p - 1]``,
            counts ints in ``[0, p - 1]`` (zero counts are ignored).
        p: the field size (a prime, normally `field_prime`).
        n_syndromes: ``T = 2KL`` (>= 1).

    Returns:
        list ``[S_1, ..., S_T]`` of ``T`` ints in ``[0, p)``.

    Raises:
        ValueError: an index outside ``[1, p - 1]``, a count outside ``[0, p - 1]``, ``T < 1`` or
            ``p < 2`` / not prime.
        TypeError: ``counts`` is not a mapping or holds non-integers.

    References:
        Pan et al. Algorithm 2, client lines (``S_i^(l)``); spec mufc.md 2.2.
    """
    ctx = _prime_ctx(p)
    n_syndromes = _check_count("n_syndromes", n_syndromes, 1)
    items = _check_counts(counts, p)
    if not items:
        return [0] * n_syndromes
    return _coefficients(_syndrome_series(ctx, items, n_syndromes), n_syndromes)


def bin_powers(j: int, p: int, n_syndromes: int) -> list[int]:
    """``[j^0, j^1, ..., j^(T-1)] mod p``: the syndromes of one point in bin ``j``.

    A client computes them for its seeds' bins between rounds, so that a removal that moves no
    seed updates its syndromes with one addition per term (`update_syndromes`'s ``powers``).

    Raises:
        ValueError: ``j`` outside ``[1, p - 1]`` or ``T < 1``.
    """
    p = _check_modulus(p)
    j = _check_int("bin index", j)
    n_syndromes = _check_count("n_syndromes", n_syndromes, 1)
    if not 1 <= j < p:
        raise ValueError(f"bin index {j} is outside [1, p - 1]")
    out = []
    append = out.append
    x = 1 % p
    for _ in range(n_syndromes):
        append(x)
        x = x * j % p
    return out


def update_syndromes(
    syndromes: Sequence[int],
    change: Mapping[int, int],
    p: int,
    *,
    validated: bool = False,
    powers: Mapping[int, Sequence[int]] | None = None,
) -> list[int]:
    """The syndromes of ``q + change`` from those of ``q``: ``S_i + sum_j c_j j^(i-1) mod p``.

    Syndromes are linear in ``q``, so after a removal (one count down, or a few seeds moved:
    at most ``2K`` changed bins) a client updates its ``T`` syndromes with one vector of powers
    per changed bin instead of recomputing them from the whole count vector; the result equals
    `rs_syndromes` of the new counts.

    Args:
        syndromes: ``[T]`` field elements, the syndromes of ``q``.
        change: ``{j: c_j}`` signed count changes (indices in ``[1, p - 1]``; zeros ignored).
        p: the field size (a prime).
        validated: the caller vouches that ``syndromes`` is a list of field elements (a client's
            own syndromes), so they are not checked again.
        powers: optional ``{j: bin_powers(j, p, T)}`` computed ahead (a client's seeds' bins):
            a change of one listed bin adds ``c`` times its powers (one pass, no products of
            powers); the result is the same.

    Returns:
        ``[T]`` ints in ``[0, p)``.

    Raises:
        ValueError: an element outside ``[0, p)`` or an index outside ``[1, p - 1]``.
        TypeError: non-integer elements, indices or changes.

    References:
        Pan et al. Algorithm 2, client lines, and Sec. 5.3 (linearity); spec mufc.md 2.2, 3.5.
    """
    p = _check_modulus(p)
    values = syndromes if validated else _check_elements("syndromes", syndromes, p)
    if not isinstance(change, Mapping):
        raise TypeError(f"change must be a mapping {{bin index: count change}}, got {type(change).__name__}")
    items = []
    for raw_j, raw_c in change.items():
        j, c = _check_int("bin index", raw_j), _check_int("count change", raw_c)
        if not 1 <= j < p:
            raise ValueError(f"bin index {j} is outside [1, p - 1]")
        if c % p:
            items.append((j, c % p))
    if not items:
        return list(values)
    if len(items) == 1 and powers is not None and items[0][0] in powers:  # powers computed ahead
        (j, c), = items
        vector = powers[j]
        if len(vector) != len(values):
            raise ValueError(f"the powers of bin {j} have {len(vector)} terms, the syndromes {len(values)}")
        if c == p - 1:  # one point removed
            return [(s - v) % p for s, v in zip(values, vector)]
        return [(s + c * v) % p for s, v in zip(values, vector)]
    if len(items) == 1:  # one bin (a removal that moved no seed): a running power, one pass
        (j, c), = items
        out = []
        append = out.append
        for s in values:
            append((s + c) % p)
            c = c * j % p
        return out
    if len(items) <= _POWERS_MAX_BINS:  # one vector of powers per bin
        arr = np.asarray(values, dtype=object)
        for j, c in items:
            arr = (arr + c * _powers(j, arr.shape[0], p)) % p
        return arr.tolist()
    # many bins (a re-seed): the power series of the change, as `rs_syndromes`
    delta = _coefficients(_syndrome_series(_prime_ctx(p), sorted(items), len(values)), len(values))
    return ((np.asarray(values, dtype=object) + np.asarray(delta, dtype=object)) % p).tolist()


#: Changed bins up to which `update_syndromes` adds one vector of powers per bin; above, one
#: FLINT power series of the whole change is cheaper.
_POWERS_MAX_BINS = 2


def mask_syndromes(syndromes: Sequence[int], mask: Sequence[int], p: int) -> list[int]:
    """A client's message: ``(S_i + z_i) mod p`` elementwise.

    Args:
        syndromes: ``[T]`` field elements (`rs_syndromes`).
        mask: ``[T]`` field elements (`pairwise_masks` or `dealer_masks`).
        p: the field size.

    Returns:
        ``[T]`` ints in ``[0, p)``.

    Raises:
        ValueError: different lengths or an element outside ``[0, p)``.
        TypeError: non-integer elements.

    References:
        Pan et al. Algorithm 2 (``S_i^(l) = ... + z_i^(l)``); spec mufc.md 2.2.
    """
    p = _check_modulus(p)
    syndromes = _check_elements("syndromes", syndromes, p)
    mask = _check_elements("mask", mask, p, len(syndromes))
    return [(s + z) % p for s, z in zip(syndromes, mask, strict=True)]


# --------------------------------------------------------------------------------------------
# Masks
# --------------------------------------------------------------------------------------------


def dealer_masks(n_parties: int, p: int, n_syndromes: int, seed: bytes) -> list[list[int]]:
    """Zero-sum masks from a trusted dealer (tests and simulations).

    ``z^(1..L-1)`` are independent uniform vectors on ``F_p^T`` (ChaCha20 under
    ``HKDF(seed, party, L, T, p)``) and ``z^(L) = -sum_{l<L} z^(l) mod p``, so every ``L - 1`` of
    them are jointly uniform and all ``L`` sum to zero in every position. One party gets the zero
    mask (no privacy without a second party). Put the round in ``seed`` for fresh masks.

    Args:
        n_parties: ``L`` (>= 1).
        p: field size (>= 2).
        n_syndromes: ``T`` (>= 1).
        seed: at least 32 bytes of secret entropy.

    Returns:
        ``[L][T]`` nested list of ints in ``[0, p)``; columns sum to 0 mod ``p``.

    Raises:
        ValueError: a short seed or out-of-range sizes.
        TypeError: wrong argument types.

    References:
        Spec mufc.md 2.3 ("Dealer mode (tests)").
    """
    n_parties = _check_count("n_parties", n_parties, 1)
    p = _check_modulus(p)
    n_syndromes = _check_count("n_syndromes", n_syndromes, 1)
    masks = []
    for party in range(n_parties - 1):
        info = _DEALER_INFO + _length_prefixed(
            _int_bytes(p), struct.pack(">QQQ", n_parties, n_syndromes, party)
        )
        masks.append(uniform_elements(derive_bytes(seed, info), p, n_syndromes))
    last = [0] * n_syndromes
    for mask in masks:
        last = list(map(operator.add, last, mask))
    masks.append([(-v) % p for v in last])
    return masks


def pairwise_seed(private_key: X25519PrivateKey, own_public: bytes, peer_public: bytes, context: bytes) -> bytes:
    """The 32-byte mask seed a pair of clients shares: X25519 agreement, then HKDF-SHA256.

    ``HKDF(X25519(own, peer), info = label || lo || hi || context)`` where ``lo, hi`` are the two
    raw public keys in sorted order, so both ends derive the same seed, and different pairs or
    contexts (put the session/run id there) give independent seeds.

    Args:
        private_key: this client's X25519 private key (`fedproto.algorithms.secagg.x25519_keypair`).
        own_public: this client's raw 32-byte public key (must match ``private_key``).
        peer_public: the peer's raw 32-byte public key (must differ from ``own_public``).
        context: public bytes both ends agree on (session id, purpose).

    Returns:
        32 bytes.

    Raises:
        ValueError: ``own_public`` does not belong to ``private_key``, the two keys are equal, or
            ``peer_public`` is malformed or a low-order point.
        TypeError: wrong argument types.

    References:
        Bonawitz et al. CCS 2017, Sec. 4 (pairwise seeds from Diffie-Hellman); RFC 7748, RFC 5869;
        spec mufc.md 2.3 ("Pairwise mode") and 1.10 step 2.
    """
    if not isinstance(private_key, X25519PrivateKey):
        raise TypeError(f"private_key must be an X25519PrivateKey, got {type(private_key).__name__}")
    for name, value in (("own_public", own_public), ("peer_public", peer_public), ("context", context)):
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"{name} must be bytes, got {type(value).__name__}")
    own, peer = bytes(own_public), bytes(peer_public)
    if private_key.public_key().public_bytes_raw() != own:
        raise ValueError("own_public is not the public key of private_key")
    if own == peer:
        raise ValueError("peer_public equals own_public: a client has no pair seed with itself")
    try:
        shared = private_key.exchange(X25519PublicKey.from_public_bytes(peer))
    except ValueError as exc:
        raise ValueError(f"invalid X25519 peer public key: {exc}") from exc
    lo, hi = sorted((own, peer))
    return derive_bytes(shared, _PAIR_SEED_INFO + _length_prefixed(lo, hi, bytes(context)), _PAIR_SEED_BYTES)


#: Extra bytes per pair-mask element: each element is a (width + 8)-byte word reduced mod p, so it
#: is uniform on F_p up to a statistical distance below 2^-64.
_WIDE_EXTRA = 8


def _pair_words(seed: bytes, p: int, n_syndromes: int, round_idx: int, word: int) -> bytes:
    """The pair's keystream for one round: ``T`` big-endian words of ``word`` bytes."""
    info = _PAIR_MASK_INFO + _length_prefixed(_int_bytes(p), struct.pack(">Q", n_syndromes), _int_bytes(round_idx))
    return _chacha20_stream(derive_bytes(seed, info), n_syndromes * word)


def _pair_vector(seed: bytes, p: int, n_syndromes: int, round_idx: int) -> list[int]:
    """The pair vector ``r`` (``[T]`` elements of F_p) one pair seed gives for one round."""
    word = field_width(p) + _WIDE_EXTRA
    stream = _pair_words(seed, p, n_syndromes, round_idx, word)
    return [int.from_bytes(stream[i : i + word], "big") % p for i in range(0, len(stream), word)]


def _stream_sums(streams: list[bytes], n_syndromes: int, word: int) -> np.ndarray:
    """Element-wise integer sums of several streams of ``T`` big-endian words (object ``[T]``)."""
    if not streams:
        return np.zeros(n_syndromes, dtype=object)
    stack = np.frombuffer(b"".join(streams), dtype=np.uint8).reshape(len(streams), n_syndromes, word)
    return _column_sums(stack)


def pairwise_masks(party: int, pair_seeds: Mapping[int, bytes], p: int, n_syndromes: int, round_idx: int) -> list[int]:
    """Party ``party``'s zero-sum mask for one aggregation round (Bonawitz-style).

    ``z = sum_{m > party} r_{party,m} - sum_{m < party} r_{m,party} (mod p)``, where the pair
    vector ``r`` (the same at both ends) is a ChaCha20 keystream under
    ``HKDF(pair seed, info = label || p || T || round_idx)`` cut into ``T`` words of
    ``field_width(p) + 8`` bytes, each reduced mod p (uniform on F_p up to a statistical distance
    below ``2^-64`` per element; faster than rejection sampling because the words of all peers
    are summed column by column in NumPy, not one big-integer addition per element and peer).
    Summed over a set of parties that each list all the others in ``pair_seeds``, every ``r``
    appears once with ``+`` and once with ``-``: the masks cancel. Each mask alone (indeed any
    ``L - 1`` of them) is uniform. Masks are fresh per ``round_idx``; never reuse one (two
    messages masked alike reveal their difference).

    Args:
        party: this party's integer index (the ordering only decides the signs).
        pair_seeds: ``{peer index: 32-byte seed}`` for every OTHER party of the active set
            (`pairwise_seed`).
        p: field size (>= 2).
        n_syndromes: ``T`` (>= 1).
        round_idx: aggregation round / stream id (>= 0, any size).

    Returns:
        ``[T]`` ints in ``[0, p)``.

    Raises:
        ValueError: no peers, ``party`` among its own peers, a seed shorter than 32 bytes,
            ``round_idx < 0`` or bad sizes.
        TypeError: wrong argument types.

    References:
        Bonawitz et al. CCS 2017, Sec. 3 (pairwise masking); Pan et al. Sec. 4.1 (zero-sum keys
        from secure aggregation); spec mufc.md 2.3.
    """
    party = _check_int("party", party)
    p = _check_modulus(p)
    n_syndromes = _check_count("n_syndromes", n_syndromes, 1)
    round_idx = _check_count("round_idx", round_idx, 0)
    if not isinstance(pair_seeds, Mapping):
        raise TypeError(f"pair_seeds must be a mapping {{peer: seed}}, got {type(pair_seeds).__name__}")
    if not pair_seeds:
        raise ValueError("pair_seeds is empty: a zero-sum mask needs at least one other active party")
    word = field_width(p) + _WIDE_EXTRA
    plus: list[bytes] = []
    minus: list[bytes] = []
    for peer in sorted(_check_int("peer index", m) for m in pair_seeds):
        if peer == party:
            raise ValueError(f"party {party} cannot hold a pair seed with itself")
        stream = _pair_words(pair_seeds[peer], p, n_syndromes, round_idx, word)
        (plus if peer > party else minus).append(stream)
    return ((_stream_sums(plus, n_syndromes, word) - _stream_sums(minus, n_syndromes, word)) % p).tolist()

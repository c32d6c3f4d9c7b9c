"""SCMA: secure compressed multiset aggregation over a prime field (MUFC, Algorithm 2).

Each of ``L`` clients holds a sparse count vector ``q^(l)`` over the bins ``1..B^d`` (at most ``K``
non-zeros). Instead of the length-``B^d`` vector it sends ``T = 2KL`` power-sum syndromes

    S_i^(l) = sum_j q_j^(l) * j^(i-1) + z_i^(l)   (mod p),   i = 1..T,

where the masks ``z^(l)`` are uniform on ``F_p^T`` and sum to zero over the clients. The server
adds the messages (the masks cancel), reads the sum ``S`` as the Reed-Solomon syndromes of the
aggregate ``q = sum_l q^(l)`` (at most ``KL`` non-zeros) and decodes it exactly:

1. Berlekamp-Massey gives the error-locator ``g(x) = prod_{j: q_j != 0} (1 - j x)``
   (`error_locator`; FLINT's ``fmpz_mod_poly_minpoly``);
2. its reciprocal ``h(x) = x^m g(1/x) = prod (x - j)`` has the support as its roots
   (`field_roots`; FLINT's ``fmpz_mod_poly_roots``, Cantor-Zassenhaus splitting);
3. the counts follow from a Forney-style formula with one multipoint evaluation instead of an
   ``O(m^2)`` Vandermonde solve (`decode_syndromes`);
4. validity checks (degree, distinct roots, index and count ranges, integer total, re-encoding of
   all ``T`` syndromes) turn an overloaded, corrupted or wrongly masked input into
   `SyndromeDecodingError` instead of a wrong sum.

Masks (spec 2.3): Bonawitz-style pairwise masks (`pairwise_seed` with X25519 + HKDF-SHA256,
`pairwise_masks` with a ChaCha20 stream per pair and round) or, for tests, a trusted dealer
(`dealer_masks`). Field elements are drawn by rejection sampling of ``bitlength(p)``-bit integers,
so they are exactly uniform on ``F_p``. All arithmetic is exact: Python integers and python-flint
(``fmpz_mod_poly``); nothing here touches JAX or NumPy's generators.

Costs (spec 2.7): a client's encoding is ``O(M(T) + M(K) log K)`` field operations with FLINT's
power series (the paper's direct sum is ``O(K T)``); a message is ``T * field_width(p)`` bytes;
the server's decoding is dominated by root finding, ``O(M(m) log m log p)`` expected.

References:
    Pan, Sima, Prakash, Rana, Milenkovic. Machine Unlearning of Federated Clusters. ICLR 2023,
    Sec. 4.1 and Algorithm 2 (SCMA), App. C (complexity), App. J (uniqueness and privacy).
    Bonawitz et al. Practical Secure Aggregation for Privacy-Preserving Machine Learning. ACM CCS
    2017 (pairwise masks from key agreement).
    Spec ``mufc.md`` sections 1.10 and 2 (2.1 field, 2.2 encoding, 2.3 masks, 2.4 decoding, 2.6
    worked example) and oracles 1-9.
"""

from __future__ import annotations

import functools
import itertools
import operator
import struct
from collections.abc import Iterable, Mapping, Sequence

import flint
import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from fedproto.algorithms.secagg import _chacha20_stream, _check_int, _length_prefixed, derive_bytes
from fedproto.errors import RemoteProtocolError

__all__ = [
    "PROVEN_PRIME_BITS",
    "PackedSums",
    "SyndromeDecodingError",
    "aggregate_packed",
    "aggregate_syndromes",
    "bin_powers",
    "check_packed",
    "dealer_masks",
    "decode_syndromes",
    "error_locator",
    "field_prime",
    "field_roots",
    "field_width",
    "mask_syndromes",
    "pack_elements",
    "pairwise_masks",
    "pairwise_seed",
    "rs_syndromes",
    "sum_packed",
    "uniform_elements",
    "unpack_elements",
    "update_syndromes",
]

PROVEN_PRIME_BITS = 512
"""`field_prime` proves primality (``fmpz.is_prime``) up to this many bits; above, BPSW only."""

_PAIR_SEED_BYTES = 32
_PAIR_SEED_INFO = b"fedproto/scma/pair-seed/v1"
_PAIR_MASK_INFO = b"fedproto/scma/pair-mask/v1"
_DEALER_INFO = b"fedproto/scma/dealer-mask/v1"
_UNIFORM_INFO = b"fedproto/scma/uniform/v1"
# Odd primes below 2^16 for sieving candidates in `field_prime` before the (costly) BPSW test.
_SIEVE_LIMIT = 1 << 16
_SIEVE_WINDOW = 4096
_UINT8 = np.dtype(np.uint8)
_DTYPE_OF, _SHAPE_OF = operator.attrgetter("dtype"), operator.attrgetter("shape")
_BIG_U32 = np.dtype(">u4")


class SyndromeDecodingError(RemoteProtocolError):
    """The aggregated syndromes failed SCMA's validity checks.

    Raised by `decode_syndromes` when the sum cannot be the syndrome vector of a count vector with
    at most ``max_support`` non-zeros in ``[1, max_index]``: a client exceeded its ``K`` bound (the
    total support overloads ``T/2``), a share was corrupted, or the masks do not cancel (a client
    used another active set or round). The decoder never returns a wrong sum instead.

    References:
        Spec mufc.md 2.4 ("Validity checks the decoder must perform").
    """


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def _check_modulus(p: object) -> int:
    p = _check_int("p", p)
    if p < 2:
        raise ValueError(f"p must be a prime >= 2, got {p}")
    return p


def _check_count(name: str, value: object, minimum: int) -> int:
    value = _check_int(name, value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _as_ints(name: str, values: object) -> list[int]:
    if isinstance(values, str | bytes | bytearray | memoryview | Mapping):
        raise TypeError(f"{name} must be a sequence of ints, got {type(values).__name__}")
    try:
        out = list(values)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"{name} must be a sequence of ints, got {type(values).__name__}") from None
    if set(map(type, out)) - {int}:
        # The slow path only runs for non-int elements (NumPy integers are accepted, bools and
        # floats are not).
        out = [_check_int(f"{name}[{i}]", v) for i, v in enumerate(out)]
    return out


def _check_elements(name: str, values: object, p: int, length: int | None = None) -> list[int]:
    """``values`` as a list of field elements in ``[0, p)`` (of ``length`` when given)."""
    out = _as_ints(name, values)
    if length is not None and len(out) != length:
        raise ValueError(f"{name} must have {length} elements, got {len(out)}")
    if out and (min(out) < 0 or max(out) >= p):
        i = next(i for i, v in enumerate(out) if not 0 <= v < p)
        raise ValueError(f"{name}[{i}] = {out[i]} is not a field element in [0, p) with p = {p}")
    return out


@functools.lru_cache(maxsize=32)
def _poly_ctx(p: int) -> flint.fmpz_mod_poly_ctx:
    # Building the context tests primality (BPSW in FLINT), about 0.1 s for a 5000-bit p; cache it.
    ctx = flint.fmpz_mod_poly_ctx(p)
    if not ctx.is_prime():
        raise ValueError(f"p = {p} is not prime; SCMA decoding needs a prime field")
    return ctx


def _prime_ctx(p: object) -> flint.fmpz_mod_poly_ctx:
    return _poly_ctx(_check_modulus(p))


def _int_bytes(value: int) -> bytes:
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


# --------------------------------------------------------------------------------------------
# Packed field elements: the wire form, uint8 [T, width] big-endian rows
# --------------------------------------------------------------------------------------------


def pack_elements(values: Sequence[int], p: int) -> np.ndarray:
    """Field elements in their wire form: one ``field_width(p)``-byte big-endian row each.

    Args:
        values: ``[T]`` ints in ``[0, p)``.
        p: the field size.

    Returns:
        ``uint8`` array ``[T, field_width(p)]`` (C-contiguous): what a packed `bigints_field`
        carries (:class:`~fedproto.algorithms.mufc.messages.MaskedSyndromes`).

    Raises:
        ValueError: an element outside ``[0, p)``. TypeError: non-integer elements.

    References:
        Spec mufc.md 1.10 (``T * width`` payload bytes).
    """
    p = _check_modulus(p)
    values = _check_elements("values", values, p)
    width = field_width(p)
    raw = b"".join(v.to_bytes(width, "big") for v in values)
    return np.frombuffer(raw, dtype=np.uint8).reshape(len(values), width)


def unpack_elements(packed: np.ndarray) -> list[int]:
    """The ints of packed big-endian rows (`pack_elements`'s inverse), ``[T]``."""
    packed = np.asarray(packed, dtype=np.uint8)
    if packed.ndim != 2:
        raise ValueError(f"packed elements must be a [T, width] array, got shape {packed.shape}")
    return _column_sums(packed[None]).tolist()


def check_packed(name: str, packed: object, p: int, length: int | None = None) -> np.ndarray:
    """``packed`` as ``uint8 [T, field_width(p)]`` rows that are all field elements (vectorised).

    Returns:
        The array (unchanged when it already has the dtype).

    Raises:
        TypeError: not a ``uint8`` array. ValueError: wrong shape, or a row ``>= p`` (its
        position is named).
    """
    _check_packed_shape(name, packed, field_width(p), length)
    _check_below(name, packed, p)
    return packed


def _check_packed_shape(name: str, packed: object, width: int, length: int | None) -> None:
    """TypeError unless ``packed`` is a ``uint8`` array; ValueError unless it is ``[length, width]``."""
    if not (isinstance(packed, np.ndarray) and packed.dtype == np.uint8):
        raise TypeError(f"{name} must be a uint8 array of packed field elements")
    if packed.ndim != 2 or packed.shape[1] != width or (length is not None and packed.shape[0] != length):
        want = f"[{'T' if length is None else length}, {width}]"
        raise ValueError(f"{name} must have shape {want}, got {list(packed.shape)}")


def _check_below(name: str, rows: np.ndarray, p: int) -> None:
    """Raise ValueError naming the first of the big-endian ``rows`` ``[m, width]`` that is ``>= p``.

    Rows are compared with ``p - 1`` on their leading bytes read as one big-endian integer (one
    maximum when every row is below); only rows that tie there are compared byte by byte. Rows of
    four bytes or more are led by four bytes (a strided ``>u4`` view, measured 10-20% cheaper to
    scan than eight for MUFC's 9- and 10-byte rows): the first of ``p - 1``'s is non-zero, so a
    uniform field element ties with probability below ``2^-24``; narrower rows are led by all
    their bytes (no tie to resolve).
    """
    if not rows.shape[0]:
        return
    width = rows.shape[1]
    top = np.frombuffer((p - 1).to_bytes(width, "big"), dtype=np.uint8)
    lead = 4 if width >= 4 else width
    rows = np.ascontiguousarray(rows)
    if lead == 4:  # the leading four bytes of every row, without a copy
        head = rows[:, :4].view(_BIG_U32)[:, 0]
        limit = int.from_bytes(top[:4].tobytes(), "big")
    else:
        head = rows[:, 0].astype(np.uint64)
        for b in range(1, lead):
            head = (head << np.uint64(8)) | rows[:, b]
        limit = int.from_bytes(top[:lead].tobytes(), "big")
    if head.max() < limit:  # every row's leading bytes are below p - 1's (one pass, no mask)
        return
    bad = head > limit
    tied = np.flatnonzero(head == limit)
    if tied.size and width > lead:
        sub, rest = rows[tied, lead:], top[lead:]
        differs = sub != rest
        first = differs.argmax(axis=1)
        pick = np.arange(tied.size)
        bad[tied[differs[pick, first] & (sub[pick, first] > rest[first])]] = True
    if bad.any():
        i = int(np.argmax(bad))
        value = int.from_bytes(rows[i].tobytes(), "big")
        raise ValueError(f"{name}[{i}] = {value} is not a field element in [0, p) with p = {p}")


def _column_sums(words: np.ndarray) -> np.ndarray:
    """Exact integer sums ``sum_s words[s, i]`` of big-endian words, ``[S, T, w]`` uint8 -> object ``[T]``.

    Digits are summed per byte column in 16-, 32- or 64-bit integers; four columns make one
    32-bit-aligned group (below ``S * 2^32``), and the ``ceil(w / 4)`` groups of each element are
    joined as Python ints: a handful of vectorised operations for the whole stack instead of
    ``S * T`` big-integer additions. For up to 257 words of up to 16 bytes (MUFC's shares) the
    groups come from one float64 product of the digit sums (every value an integer below
    ``2^42``, so exact).
    """
    n_rows, width = words.shape[1], words.shape[2]
    n_groups = -(-width // 4)
    if words.shape[0] <= 257 and n_groups <= 4:
        digits = _digit_sums(words)
        exact = (digits.astype(np.float64) @ _byte_places(width)[:n_groups].T).astype(np.int64)  # [T, G], little-endian
        total = exact[:, n_groups - 1].astype(object)
        for g in range(n_groups - 2, -1, -1):
            total = (total << 32) + exact[:, g].astype(object)
        return total
    # the narrowest accumulator that cannot overflow: 255 * S must fit
    wide = np.uint16 if words.shape[0] <= 257 else np.uint32 if words.shape[0] <= 16_843_009 else np.uint64
    digits = np.add.reduce(words, axis=0, dtype=wide).astype(np.uint64)
    pad = -width % 4
    if pad:
        digits = np.concatenate([np.zeros((n_rows, pad), np.uint64), digits], axis=1)
    digits = digits.reshape(n_rows, -1, 4)
    groups = (digits[..., 0] << 24) + (digits[..., 1] << 16) + (digits[..., 2] << 8) + digits[..., 3]
    total = groups[:, 0].astype(object)
    for g in range(1, groups.shape[1]):
        total = (total << 32) + groups[:, g].astype(object)
    return total


def _digit_sums(words: np.ndarray) -> np.ndarray:
    """``sum_s words[s]``, ``[S, T, w]`` uint8 (``S <= 257``) -> ``[T, w]`` uint16, exact (below
    ``257 * 255 < 2^16``). Reduced over the flattened ``[S, T * w]`` view: NumPy's casting
    reduction runs about a third faster on two axes than on three (measured; same sums). SWAR
    sums (even and odd bytes masked into 16-bit lanes of ``uint64`` or ``uint16`` words, two
    reductions) were measured 15-45% slower for MUFC's stacks: each mask or shift is a pass."""
    n_words, n_rows, width = words.shape
    return np.add.reduce(words.reshape(n_words, n_rows * width), axis=0, dtype=np.uint16).reshape(n_rows, width)


@functools.lru_cache(maxsize=32)
def _byte_places(width: int) -> np.ndarray:
    """Place values of the bytes of a ``width``-byte big-endian word, ``[G + 1, width]`` float64
    (read-only): row ``g < G`` weighs each byte within 32-bit group ``g`` (little-endian groups),
    the last row weighs each byte within the whole word."""
    n_groups = -(-width // 4)
    place = np.zeros((n_groups + 1, width))
    for b in range(width):
        pos = width - 1 - b  # byte position from the least significant end
        place[pos // 4, b] = float(1 << (8 * (pos % 4)))
        place[n_groups, b] = float(1 << (8 * pos))
    place.setflags(write=False)
    return place


# `_column_sums_mod` weighs the digits by (1 - 2^-45) / p for the quotient: below s / p by more
# than the float product's rounding, so its floor never exceeds floor(s / p)
_QUOTIENT_SHRINK = 1.0 - 2.0**-45


@functools.lru_cache(maxsize=32)
def _mod_tables(p: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For `_column_sums_mod`: the ``[G + 1, width]`` float64 weights (`_byte_places`' rows
    ``g < G``, then the place values within the word times ``(1 - 2^-45) / p``), and the ``[G, 1]``
    32-bit limbs of ``p`` as int64 and as float64 (all read-only)."""
    n_groups = -(-width // 4)
    weights = _byte_places(width).copy()
    weights[n_groups] *= _QUOTIENT_SHRINK / float(p)
    limbs = np.array([[(p >> (32 * g)) & 0xFFFFFFFF] for g in range(n_groups)], dtype=np.int64)
    limbs_float = limbs.astype(np.float64)
    for table in (weights, limbs, limbs_float):
        table.setflags(write=False)
    return weights, limbs, limbs_float


def _carry(limbs: np.ndarray) -> None:
    """Normalise signed 32-bit limbs ``[G, T]`` int64 in place: every limb but the last into
    ``[0, 2^32)``, the carries (floor division, so signs propagate) into the next one. Written
    through ``out=`` (``limbs[g] += ...`` would copy each row back onto itself)."""
    for g in range(limbs.shape[0] - 1):
        low, high = limbs[g], limbs[g + 1]
        np.add(high, low >> 32, out=high)
        np.bitwise_and(low, 0xFFFFFFFF, out=low)


def _column_sums_mod(words: np.ndarray, p: int) -> np.ndarray | None:
    """``sum_s words[s, i] mod p`` as 32-bit limbs, ``[S, T, w]`` uint8 words below ``p`` ->
    ``[G, T]`` int64 (limb ``g`` holds bits ``32g .. 32g + 31``), or ``None`` outside
    ``S <= 257``, ``w <= 16`` (then the caller reduces `_column_sums`' Python ints).

    As `_column_sums`, the byte digits are summed in 16 bits and grouped by one float64 product,
    exact integers below ``2^41``; the product's last row weighs them by their place values times
    ``(1 - 2^-45) / p``, giving ``x = s (1 - 2^-45) / p`` to a relative ``2^-48`` (at most 18
    roundings of ``2^-53`` for 16 bytes): below ``s / p`` and above ``s / p - 2^-36`` (``s / p <
    258``), so ``q = floor(x)`` is ``floor(s / p)`` or one less (never negative). ``s - q p`` is
    then formed limb by limb (in float64, exact below ``2^41``) and ``p`` is subtracted once where
    it is still ``>= p``: only tried when some ``x`` lies within ``2^-30`` below an integer (about
    one uniform sum in ``2^30``; ``q = floor(s / p) - 1`` puts ``x`` within ``2^-36``). Exact, no
    Python integer per element; the weights fold the division by ``p`` into the product.
    """
    n_words, width = words.shape[0], words.shape[2]
    if n_words > 257 or width > 16:
        return None
    weights, p_limbs, p_limbs_float = _mod_tables(p, width)
    n_groups = p_limbs.shape[0]
    digits = _digit_sums(words)  # [T, w], below 2^16
    mixed = weights @ digits.T.astype(np.float64)  # [G + 1, T]: the groups of s, then x
    quotient = np.floor(mixed[n_groups])
    limbs = (mixed[:n_groups] - quotient * p_limbs_float).astype(np.int64)  # s - q p in [0, 2p)
    _carry(limbs)
    if not (mixed[n_groups] - quotient).max() > 1.0 - 2.0**-30:  # every q = floor(s / p): every s - q p < p
        return limbs
    reduced = limbs - p_limbs
    _carry(reduced)
    return np.where(reduced[-1] < 0, limbs, reduced)


def _limbs_to_ints(limbs: np.ndarray) -> list[int]:
    """The Python ints of nonnegative 32-bit limbs ``[G, T]`` (`_column_sums_mod`), any ``G``.

    Up to 64 bits one ``uint64`` array's ``tolist``; wider, each element's ``4G`` little-endian
    bytes read by ``int.from_bytes`` (one C-level map; measured 10-20% faster than shifting and
    or-ing object arrays for ``G = 3``).
    """
    if limbs.shape[0] <= 2:
        wide = limbs.astype(np.uint64)
        return (wide[0] if wide.shape[0] == 1 else wide[0] | (wide[1] << np.uint64(32))).tolist()
    rows = np.ascontiguousarray(limbs.T, dtype="<u4")  # [T, G]: each row one element's bytes
    return list(map(int.from_bytes, rows.view(f"V{rows.shape[1] * 4}").ravel().tolist(), itertools.repeat("little")))


def _ints_to_limbs(values: Sequence[int], n_groups: int) -> np.ndarray:
    """``[T]`` nonnegative ints below ``2^(32 G)`` as 32-bit limbs ``[G, T]`` int64 (`_limbs_to_ints`' inverse)."""
    raw = b"".join(v.to_bytes(4 * n_groups, "little") for v in values)
    return np.frombuffer(raw, "<u4").reshape(len(values), n_groups).T.astype(np.int64)


class PackedSums(Sequence):
    """Aggregated syndromes ``S_1..S_T`` in ``F_p`` kept as 32-bit limbs (`sum_packed`'s result).

    The server's round sum without ``T`` Python ints: `decode_update` given this round's and the
    previous round's `PackedSums` tests a one-bin change on packed integers straight from the
    limbs, and the ints are made only when a caller reads them (indexing, iteration, `tolist`:
    made once, then cached). A ``Sequence[int]`` of ``T`` field elements, so any function taking
    sums accepts it. Immutable (the limbs are read-only); build it with `sum_packed`.

    Attributes:
        p: the field size.
        limbs: ``[G, T]`` int64, read-only: limb ``g`` of ``S_i`` holds its bits ``32g .. 32g + 31``
            (``G = ceil(field_width(p) / 4)``); every ``S_i < p``.
    """

    __slots__ = ("_ints", "_kronecker", "limbs", "p")

    def __init__(self, p: int, limbs: np.ndarray, ints: list[int] | None = None) -> None:
        limbs.setflags(write=False)
        self.p, self.limbs = p, limbs
        self._ints = ints  # the values as Python ints, made on first use (never handed out)
        self._kronecker: tuple[int, flint.fmpz] | None = None  # (slot bytes, packed integer): `_kronecker_sums`

    def __len__(self) -> int:
        return self.limbs.shape[1]

    def __getitem__(self, index):  # type: ignore[override]
        return self._values()[index]

    def __iter__(self):
        return iter(self._values())

    def __repr__(self) -> str:
        return f"PackedSums(p={self.p}, T={len(self)})"

    def __eq__(self, other: object) -> bool:
        """Equal to a `PackedSums` over the same field with the same values (compare a list with
        `tolist`)."""
        if not isinstance(other, PackedSums):
            return NotImplemented
        return self.p == other.p and self.limbs.shape == other.limbs.shape and bool((self.limbs == other.limbs).all())

    __hash__ = None  # type: ignore[assignment]

    def tolist(self) -> list[int]:
        """The ``[T]`` sums as a new list of Python ints in ``[0, p)``."""
        return list(self._values())

    def _values(self) -> list[int]:
        if self._ints is None:
            self._ints = _limbs_to_ints(self.limbs)
        return self._ints

    def _first(self, count: int) -> list[int]:
        """The first ``count`` sums as ints, without making the other ``T - count``."""
        if self._ints is not None:
            return self._ints[:count]
        return _limbs_to_ints(self.limbs[:, :count])


def _powers(base: int, count: int, p: int) -> np.ndarray:
    """``[base^0, ..., base^(count-1)] mod p`` as an object array, by doubling (``log count`` steps)."""
    out = np.empty(count, dtype=object)
    out[0] = 1 % p
    filled, step = 1, base % p
    while filled < count:
        n = min(filled, count - filled)
        out[filled : filled + n] = out[:n] * step % p
        filled, step = filled + n, step * step % p
    return out


# --------------------------------------------------------------------------------------------
# Field
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _sieve_primes() -> tuple[int, ...]:
    flags = bytearray([1]) * _SIEVE_LIMIT
    flags[0:2] = b"\x00\x00"
    for q in range(2, int(_SIEVE_LIMIT**0.5) + 1):
        if flags[q]:
            flags[q * q :: q] = bytes(len(range(q * q, _SIEVE_LIMIT, q)))
    return tuple(q for q in range(3, _SIEVE_LIMIT) if flags[q])


def _is_prime(candidate: int) -> bool:
    value = flint.fmpz(candidate)
    if not value.is_probable_prime():
        return False
    # BPSW has no known counterexample and is a proof below 2^64; above that, prove it while a
    # proof is cheap (about 0.2 s at 512 bits, minutes at 5000 bits).
    return candidate.bit_length() > PROVEN_PRIME_BITS or bool(value.is_prime())


def field_prime(n: int, n_bins: int) -> int:
    """The SCMA field size: the smallest prime ``p > max(n, n_bins)`` (strict).

    Strictness makes every bin index ``1..n_bins`` a distinct non-zero residue and every aggregated
    count (at most ``n``) recoverable as an integer. Candidates are sieved by the odd primes below
    2^16 and tested with FLINT's BPSW test (``fmpz.is_probable_prime``; below 2^64 FLINT's
    deterministic ``fmpz.is_prime`` is used directly); up to
    `PROVEN_PRIME_BITS` bits the winner is also proven prime (``fmpz.is_prime``). Above that the
    result is a BPSW probable prime (no composite passing BPSW is known). Cost: about ``ln p / 2``
    candidates after sieving, e.g. milliseconds for 70 bits and 10-30 s for 5000 bits.

    Args:
        n: total number of data points (>= 0).
        n_bins: number of bins ``B^d`` (>= 0); any size.

    Returns:
        ``p`` as a Python int, ``p > max(n, n_bins)``, ``p >= 2``.

    Raises:
        ValueError: a negative argument.
        TypeError: a non-integer argument.

    References:
        Pan et al. Algorithm 2 (``p >= max{n, B^d}``); spec mufc.md 2.1 (strict) and oracle 7.
    """
    n = _check_count("n", n, 0)
    n_bins = _check_count("n_bins", n_bins, 0)
    start = max(n, n_bins) + 1
    if start <= 2:
        return 2
    if start.bit_length() <= 64:
        # FLINT's test is deterministic and takes microseconds here; no sieve needed.
        candidate = start
        while not flint.fmpz(candidate).is_prime():
            candidate += 1
        return candidate
    primes = _sieve_primes()
    while True:
        window = bytearray([1]) * _SIEVE_WINDOW
        first_even = start & 1
        window[first_even::2] = bytes(len(range(first_even, _SIEVE_WINDOW, 2)))
        for q in primes:  # every q < 2^16 < start, so q itself is never in the window
            first = (-start) % q
            window[first::q] = bytes(len(range(first, _SIEVE_WINDOW, q)))
        for offset in range(_SIEVE_WINDOW):
            if window[offset] and _is_prime(start + offset):
                return start + offset
        start += _SIEVE_WINDOW


def field_width(p: int) -> int:
    """Bytes per field element on the wire: ``ceil(bitlength(p) / 8)``.

    Args:
        p: the field size (>= 2).

    Returns:
        The width ``w``; a message of ``T`` syndromes is ``T * w`` payload bytes (fixed-width
        big-endian unsigned integers).

    Raises:
        ValueError: ``p < 2``.
        TypeError: ``p`` is not an int.

    References:
        Pan et al. App. C (``2KL ceil(log2 p)`` bits per client); spec mufc.md 1.10 and oracle 8.
    """
    return (_check_modulus(p).bit_length() + 7) // 8


def uniform_elements(key: bytes, p: int, count: int) -> list[int]:
    """``count`` independent uniform elements of ``F_p`` expanded from a 32-byte key.

    ChaCha20 keystream (zero nonce; every key must be used for one stream only) cut into
    ``field_width(p)``-byte big-endian words, each reduced to its low ``bitlength(p)`` bits and
    accepted if below ``p`` (rejection sampling: exactly uniform, acceptance probability
    ``p / 2^bitlength(p) > 1/2``). The output is a prefix-stable function of the key: asking for
    more elements extends the list without changing the first ones.

    Args:
        key: 32-byte ChaCha20 key (derived with HKDF from a seed and its context).
        p: field size (>= 2).
        count: number of elements (>= 0).

    Returns:
        list of ``count`` ints in ``[0, p)``.

    Raises:
        ValueError: a key of the wrong length, ``p < 2`` or ``count < 0``.
        TypeError: wrong argument types.

    References:
        Spec mufc.md 2.3 ("rejection-sample bitlength(p)-bit integers until < p"); RFC 8439.
    """
    if not isinstance(key, bytes | bytearray | memoryview):
        raise TypeError(f"key must be bytes, got {type(key).__name__}")
    if len(key) != 32:
        raise ValueError(f"key must be 32 bytes, got {len(key)}")
    p = _check_modulus(p)
    count = _check_count("count", count, 0)
    bits = p.bit_length()
    width = (bits + 7) // 8
    top = (1 << bits) - 1
    from_bytes = int.from_bytes
    out: list[int] = []
    draws = 2 * count + 16
    stream = b""
    pos = 0
    while len(out) < count:
        if pos + width > len(stream):
            # The keystream is deterministic, so a longer one starts with the same bytes.
            stream = _chacha20_stream(bytes(key), draws * width)
            draws *= 2
        end = len(stream) - width
        while pos <= end and len(out) < count:
            value = from_bytes(stream[pos : pos + width], "big") & top
            pos += width
            if value < p:
                out.append(value)
    return out


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


def _coefficients(poly: flint.fmpz_mod_poly, length: int) -> list[int]:
    """The first ``length`` coefficients of ``poly`` (ascending) as Python ints, zero-padded.

    Read one by one: python-flint's ``coeffs()`` makes an ``fmpz_mod`` per coefficient, about
    eight times slower for MUFC's 800 syndromes (1.9 ms against 0.15 ms, measured)."""
    coeffs = list(map(int, map(poly.__getitem__, range(min(poly.length(), length)))))
    return coeffs + [0] * (length - len(coeffs))


def _field_poly(ctx: flint.fmpz_mod_poly_ctx, values: Sequence[int]) -> flint.fmpz_mod_poly:
    """The polynomial with ascending coefficients ``values`` (any ints, reduced mod p) over the
    field of ``ctx``. Built through an integer ``fmpz_poly``: building it from the list directly
    makes an ``fmpz_mod`` per element, five times slower for 800 elements (measured)."""
    return ctx(flint.fmpz_poly(values))


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


# --------------------------------------------------------------------------------------------
# Server: aggregation and decoding
# --------------------------------------------------------------------------------------------


def aggregate_syndromes(messages: Iterable[Sequence[int]], p: int, n_syndromes: int) -> list[int]:
    """The server's sum of the clients' masked syndromes, ``S_i = sum_l S_i^(l) mod p``.

    Args:
        messages: one ``[T]`` sequence of field elements per client (at least one).
        p: field size (>= 2).
        n_syndromes: ``T``; every message must have exactly this length.

    Returns:
        ``[T]`` ints in ``[0, p)``.

    Raises:
        ValueError: no messages, a message of the wrong length or an element outside ``[0, p)``
            (the message's position is named).
        TypeError: non-integer elements.

    References:
        Pan et al. Algorithm 2, server line 1; spec mufc.md 2.4 step 1.
    """
    p = _check_modulus(p)
    n_syndromes = _check_count("n_syndromes", n_syndromes, 1)
    checked = [_check_elements(f"messages[{index}]", message, p, n_syndromes) for index, message in enumerate(messages)]
    if not checked:
        raise ValueError("no messages to aggregate")
    return [sum(column) % p for column in zip(*checked)]


def aggregate_packed(shares: Sequence[np.ndarray] | np.ndarray, p: int, n_syndromes: int) -> list[int]:
    """`aggregate_syndromes` on packed shares: ``S_i = sum_l S_i^(l) mod p``, vectorised.

    `sum_packed` as a list of Python ints. `decode_update` given such lists takes the Python-int
    path (the same result); a server that keeps `sum_packed`'s `PackedSums` instead skips the
    ``T`` ints and gets the one-bin test on packed integers.

    Args:
        shares: ``L >= 1`` arrays ``uint8 [T, field_width(p)]``, or one ``[L, T, width]`` stack.
        p: field size (>= 2).
        n_syndromes: ``T``.

    Returns:
        ``[T]`` ints in ``[0, p)``.

    Raises:
        ValueError, TypeError: as `sum_packed`.

    References:
        Pan et al. Algorithm 2, server line 1; spec mufc.md 2.4 step 1.
    """
    return sum_packed(shares, p, n_syndromes).tolist()


def sum_packed(
    shares: Sequence[np.ndarray] | np.ndarray, p: int, n_syndromes: int, *, checked: bool = False
) -> PackedSums:
    """The sum of packed shares over ``F_p``, ``S_i = sum_l S_i^(l) mod p``, as a `PackedSums`.

    Each share is the wire form of a message (`pack_elements`, a packed `bigints_field`), so the
    server sums the frames' bytes directly: the shares joined in one copy, one range check, one
    digit sum over the stack, then (up to 257 shares of up to 16 bytes per element) the reduction
    mod p in 32-bit limbs (`_column_sums_mod`), instead of ``L * T`` big-integer additions
    (measured by ``benchmarks/mufc_unlearning.py``). No Python int is made per element: pass the
    result to `decode_update` as it is (this round's and the previous round's), or read it as a
    sequence of ints (made on first use).

    Args:
        shares: ``L >= 1`` arrays ``uint8 [T, field_width(p)]``, or one ``[L, T, width]`` stack.
        p: field size (>= 2).
        n_syndromes: ``T``.
        checked: every share already passed `check_packed` (a server that checks each share as
            it arrives, to name its sender): the range check is not repeated. Shapes and types
            are still checked; an element outside ``[0, p)`` would only change the residue.

    Returns:
        A `PackedSums` of ``T`` elements of ``[0, p)``.

    Raises:
        ValueError: no shares, a share of the wrong shape, or (unless ``checked``) an element
            outside ``[0, p)`` (the share's position is named). TypeError: a share that is not a
            ``uint8`` array.

    References:
        Pan et al. Algorithm 2, server line 1; spec mufc.md 2.4 step 1.
    """
    p = _check_modulus(p)
    n_syndromes = _check_count("n_syndromes", n_syndromes, 1)
    width = field_width(p)
    if not (isinstance(shares, np.ndarray) and shares.ndim == 3):
        shares = list(shares)
        shape = (n_syndromes, width)
        n_shares = len(shares)  # one C-level pass per attribute: measured 11-17% faster than a generator
        if not (
            list(map(type, shares)).count(np.ndarray) == n_shares
            and list(map(_DTYPE_OF, shares)).count(_UINT8) == n_shares
            and list(map(_SHAPE_OF, shares)).count(shape) == n_shares
        ):
            for index, share in enumerate(shares):  # name the first share that does not fit
                _check_packed_shape(f"shares[{index}]", share, width, n_syndromes)
        try:  # one copy of the bytes (read-only), when every share is C-contiguous
            shares = np.frombuffer(b"".join(shares), np.uint8).reshape(len(shares), n_syndromes, width)
        except TypeError:  # bytes.join takes C-contiguous buffers only
            shares = np.stack(shares)
    elif shares.dtype != np.uint8 or shares.shape[1:] != (n_syndromes, width):
        raise ValueError(f"shares must be a uint8 [L, {n_syndromes}, {width}] stack, got {shares.dtype} {list(shares.shape)}")
    if shares.shape[0] == 0:
        raise ValueError("no shares to aggregate")
    if not checked:
        try:
            _check_below("shares", shares.reshape(-1, width), p)
        except ValueError:
            for index in range(shares.shape[0]):  # name the share
                check_packed(f"shares[{index}]", shares[index], p, n_syndromes)
            raise
    limbs = _column_sums_mod(shares, p)
    if limbs is None:
        ints = (_column_sums(shares) % p).tolist()
        return PackedSums(p, _ints_to_limbs(ints, -(-width // 4)), ints)
    return PackedSums(p, limbs)


def _locator(ctx: flint.fmpz_mod_poly_ctx, sums: list[int]):
    """``h``: FLINT's minimal polynomial of the sequence (monic, ``h(x) = x^L g(1/x)``)."""
    # fmpz_mod_poly_minpoly returns the monic *characteristic* polynomial of the shortest linear
    # recurrence: sum_k h_k s_{i+k} = 0 for every window of deg(h) + 1 terms. Writing L = deg h and
    # g_k = h_{L-k} turns this into s_n = -sum_{k>=1} g_k s_{n-k} (n >= L), i.e. g is the
    # Berlekamp-Massey connection polynomial with g(0) = 1: for SCMA g(x) = prod (1 - j x) and
    # h(x) = prod (x - j), so the roots of h are the bin indices themselves.
    return ctx.minpoly(sums)


def error_locator(sums: Sequence[int], p: int) -> list[int]:
    """The Berlekamp-Massey connection polynomial ``g`` of a sequence over ``F_p``.

    For SCMA syndromes of a count vector with ``m <= T/2`` non-zeros this is the error-locator
    ``g(x) = prod_{j: q_j != 0} (1 - j x)``. In general it is the shortest linear recurrence
    ``s_n = -sum_{k=1..L} g_k s_{n-k}`` (``n >= L``) of the sequence, with ``L`` its linear
    complexity (unique when ``2L <= T``).

    Args:
        sums: ``[T]`` field elements ``s_0..s_{T-1}`` (``s_k = S_{k+1}``).
        p: a prime.

    Returns:
        ``[L + 1]`` coefficients ``g_0..g_L`` (ascending, ``g_0 = 1``; ``g_L = 0`` when the
        recurrence needs fewer than ``L`` taps); ``[1]`` for an all-zero sequence.

    Raises:
        ValueError: ``p`` not prime, an empty sequence or elements outside ``[0, p)``.
        TypeError: non-integer elements.

    References:
        Pan et al. Algorithm 2, server line 2 (Berlekamp-Massey); Massey, IEEE Trans. Inf. Theory
        15(1), 1969; spec mufc.md 2.4 step 2.
    """
    ctx = _prime_ctx(p)
    sums = _check_elements("sums", sums, p)
    if not sums:
        raise ValueError("sums must not be empty")
    h = _locator(ctx, sums)
    return list(reversed(_coefficients(h, h.degree() + 1)))


def field_roots(coeffs: Sequence[int], p: int) -> list[int]:
    """The distinct roots in ``F_p`` of a polynomial (FLINT: Cantor-Zassenhaus splitting).

    Args:
        coeffs: ascending coefficients ``[c_0, ..., c_n]``, field elements, not all zero.
        p: a prime.

    Returns:
        sorted list of the distinct roots (ints in ``[0, p)``); multiplicities are dropped.

    Raises:
        ValueError: the zero polynomial, ``p`` not prime, or elements outside ``[0, p)``.
        TypeError: non-integer elements.

    References:
        Pan et al. Algorithm 2, server line 3 (factorization); spec mufc.md 2.4 step 3.
    """
    ctx = _prime_ctx(p)
    poly = _field_poly(ctx, _check_elements("coeffs", coeffs, p))
    if poly.is_zero():
        raise ValueError("the zero polynomial has every element of F_p as a root")
    return sorted(int(r) for r in poly.roots(multiplicities=False))


def decode_syndromes(
    sums: Sequence[int],
    p: int,
    *,
    max_support: int,
    max_index: int,
    max_total: int | None = None,
    signed: bool = False,
    support_hint: int | None = None,
) -> dict[int, int]:
    """Exact decoding of the aggregated count vector from its ``T`` syndromes (server side).

    Steps (``m`` = number of non-zeros):

    1. ``h = minpoly(S)`` (Berlekamp-Massey / half-gcd in FLINT), ``g(x) = x^m h(1/x)``;
    2. the roots of ``h`` are the support ``j_1..j_m`` (all must be distinct and non-zero);
    3. counts by Forney: with ``Omega = S(x) g(x) mod x^m`` (``S(x) = sum_{i<m} s_i x^i``),
       ``q_k = -j_k Omega(1/j_k) / g'(1/j_k)``. In the reciprocal variable this is
       ``q_k = P(j_k) / h'(j_k)`` with ``P(y) = y^(m-1) Omega(1/y)``, which needs no inverses of
       the ``j_k``; both sides are evaluated at all roots at once (multipoint evaluation).
    4. checks, each failure raising `SyndromeDecodingError`: ``m <= max_support`` and
       ``2m <= T``; ``h(0) != 0`` and ``h`` has ``m`` distinct roots; every index in
       ``[1, max_index]``; every count in ``[1, p - 1]``; the integer total of the counts equals
       ``S_1`` (no wrap-around: true whenever the real total is below ``p``, which
       `field_prime`'s ``p > n`` guarantees) and is at most ``max_total`` when given;
       re-encoding the result reproduces all ``T`` syndromes.

    Cost: BM ``O(M(T) log T)``, roots ``O(M(m) log m log p)`` expected, the rest ``O(M(T))``.
    Measured with ``benchmarks/scma.py`` (2 shared cores, python-flint 0.9): 1.3 s for
    ``m = 1,000`` and 12 s for ``m = 10,000`` (``T = 20,000``) with a 68-bit ``p``; 10 s for
    ``m = 1,000`` with a 314-bit ``p``; 0.25 s for ``m = 2`` and 4.4 s for ``m = 8`` with a
    5048-bit ``p``. Root finding dominates (BM is under 5%); its cost grows with ``log p`` times
    the cost of a product of degree-``m`` polynomials over ``F_p``.

    Args:
        sums: ``[T]`` aggregated syndromes (`aggregate_syndromes`), ints in ``[0, p)``.
        p: the prime field size (`field_prime`).
        max_support: the largest admissible number of non-zeros (``K * L``; >= 0).
        max_index: the largest bin index (``B^d``); ``1 <= max_index < p``.
        max_total: optional bound on the total count (``n``); every count and their sum must not
            exceed it. Pass it (MUFC: the current ``n``): when ``max_index`` is close to ``p``,
            as with ``p = nextprime(B^d)``, the index check is weak, and it is this bound that
            makes accepting an invalid input negligible (a spurious count is ``<= n`` with
            probability about ``n / p``); without either, a full-support forgery with tiny ``T``
            passes with probability roughly ``1 / (m!)^2``.
        signed: decode a vector of signed counts (a difference ``q' - q``): residues above
            ``p / 2`` are returned as negative integers, and ``max_total`` bounds the sum of their
            absolute values.
        support_hint: the expected number of non-zeros, when far below ``T / 2``: Berlekamp-Massey
            then runs on the first ``2 * support_hint`` syndromes only, and the re-encoding check
            over all ``T`` decides; if the hint was too small, decoding starts again on all
            ``T`` terms (the result never depends on the hint, only the time).

    Returns:
        ``{j: q_j}`` with the non-zero counts only, keys ascending; ``{}`` for all-zero sums.

    Raises:
        SyndromeDecodingError: the sums fail a validity check (overload, corrupted share, masks
            that do not cancel); the message names the check.
        ValueError: empty ``sums``, an element outside ``[0, p)``, ``p`` not prime,
            ``max_index`` outside ``[1, p - 1]``, a negative ``max_support`` or ``max_total``.
        TypeError: non-integer arguments.

    References:
        Pan et al. Algorithm 2, server lines 2-4, and App. J (uniqueness with ``T = 2KL``);
        Forney, IEEE Trans. Inf. Theory 11(4), 1965 (error values); spec mufc.md 2.4 and 2.5.
    """
    ctx = _prime_ctx(p)
    sums = _check_elements("sums", sums, p)
    n_syndromes = len(sums)
    if n_syndromes == 0:
        raise ValueError("sums must not be empty")
    max_support = _check_count("max_support", max_support, 0)
    max_index = _check_int("max_index", max_index)
    if not 1 <= max_index < p:
        raise ValueError(f"max_index must be in [1, p - 1] so that indices are distinct residues, got {max_index}")
    if max_total is not None:
        max_total = _check_count("max_total", max_total, 0)
    if not any(sums):
        return {}
    if support_hint is not None and 0 <= 2 * _check_count("support_hint", support_hint, 0) < n_syndromes:
        try:
            return _decode(ctx, sums, p, max_support, max_index, max_total, signed, 2 * support_hint)
        except SyndromeDecodingError:
            pass  # the hint was too small (or the input is invalid): decide on all T terms
    return _decode(ctx, sums, p, max_support, max_index, max_total, signed, n_syndromes)


def _decode(
    ctx: flint.fmpz_mod_poly_ctx,
    sums: list[int],
    p: int,
    max_support: int,
    max_index: int,
    max_total: int | None,
    signed: bool,
    locator_terms: int,
) -> dict[int, int]:
    """`decode_syndromes` after its argument checks, with BM on the first ``locator_terms``."""
    n_syndromes = len(sums)
    h = _locator(ctx, sums[:locator_terms])
    m = h.degree()
    if 2 * m >= locator_terms and locator_terms < n_syndromes:
        raise SyndromeDecodingError("syndrome decoding failed: the locator needs more terms than the hint gave")
    if m > max_support:
        raise SyndromeDecodingError(
            f"syndrome decoding failed: the aggregate needs at least {m} non-zero bins, more than "
            f"max_support = {max_support} (a client exceeded its K bound, a share is corrupted or "
            f"the masks do not cancel)"
        )
    if 2 * m > n_syndromes:
        raise SyndromeDecodingError(
            f"syndrome decoding failed: {n_syndromes} syndromes determine at most "
            f"{n_syndromes // 2} non-zero bins, the locator has degree {m}"
        )
    if int(h.constant_coefficient()) == 0:
        raise SyndromeDecodingError("syndrome decoding failed: the error locator has a root at 0 (bin index 0)")
    roots = h.roots(multiplicities=False)
    if len(roots) != m:
        raise SyndromeDecodingError(
            f"syndrome decoding failed: the error locator of degree {m} has {len(roots)} distinct "
            f"roots in F_p instead of {m} (not a valid sum of K-sparse count vectors)"
        )
    indices = [int(r) for r in roots]
    bad = [j for j in indices if j > max_index]
    if bad:
        raise SyndromeDecodingError(
            f"syndrome decoding failed: decoded bin index {min(bad)} exceeds max_index = {max_index}"
        )

    # Forney in reciprocal form: Omega = S g mod x^m with g = reverse(h); P = reverse_{m-1}(Omega).
    g = _field_poly(ctx, _coefficients(h, m + 1)[::-1])
    omega = _coefficients(_field_poly(ctx, sums[:m]).mul_low(g, m), m)
    numerators = _field_poly(ctx, omega[::-1]).multipoint_evaluate(roots)
    derivatives = h.derivative().multipoint_evaluate(roots)
    counts = []
    for j, num, den in zip(indices, numerators, derivatives, strict=True):
        if int(den) == 0:  # impossible for distinct roots; guards a FLINT contract violation
            raise SyndromeDecodingError(f"syndrome decoding failed: repeated root {j}")
        value = int(num / den)
        counts.append(value - p if signed and value > p // 2 else value)
    if 0 in counts:
        raise SyndromeDecodingError("syndrome decoding failed: a decoded count is 0 mod p")
    total = sum(counts)
    if signed:
        magnitude = sum(abs(c) for c in counts)
        if max_total is not None and magnitude > max_total:
            raise SyndromeDecodingError(
                f"syndrome decoding failed: the decoded changes add up to {magnitude} > max_total = {max_total}"
            )
    elif total != sums[0]:
        raise SyndromeDecodingError(
            f"syndrome decoding failed: the decoded counts add up to {total}, not to S_1 = {sums[0]} "
            f"(the total wrapped around p)"
        )
    if not signed and max_total is not None and total > max_total:
        raise SyndromeDecodingError(
            f"syndrome decoding failed: the decoded counts add up to {total} > max_total = {max_total}"
        )
    # Re-encoding check over all T syndromes. g = prod_k (1 - j_k x) with distinct non-zero j_k
    # and deg Omega < m, so partial fractions give Omega / g = sum_k c_k / (1 - j_k x) with c_k
    # exactly the Forney values above; the right side is the generating function of the
    # syndromes of {j_k: c_k}. Hence the decoded q re-encodes to S_1..S_T iff
    # S(x) == Omega / g mod x^T iff S(x) g(x) == Omega mod x^T, and since the low m coefficients
    # of S g are Omega by definition, iff S(x) g(x) mod x^T has degree < m. One product of
    # length T instead of m * T power sums.
    if not _reproduces(ctx, sums, g, m, p):
        raise SyndromeDecodingError(
            "syndrome decoding failed: the decoded counts do not reproduce all syndromes"
        )
    return dict(sorted(zip(indices, counts, strict=True)))


#: Up to this locator degree the re-encoding check runs as the linear recurrence on NumPy object
#: arrays (a few vectorised operations, no FLINT conversion of the T sums); above it, as one FLINT
#: product, whose conversion cost no longer dominates.
_RECURRENCE_CHECK_MAX = 4


def _reproduces(ctx: flint.fmpz_mod_poly_ctx, sums: list[int], g: flint.fmpz_mod_poly, m: int, p: int) -> bool:
    """Whether ``S(x) g(x) mod x^T`` has degree ``< m``, i.e. the recurrence ``sum_k g_k s_{n-k} = 0``
    holds for every ``n`` in ``[m, T)``."""
    n_syndromes = len(sums)
    if m > _RECURRENCE_CHECK_MAX:
        return _field_poly(ctx, sums).mul_low(g, n_syndromes).degree() < m
    if n_syndromes <= m:
        return True
    seq = np.asarray(sums, dtype=object)
    acc = seq[m:].copy()  # g_0 = 1
    for k, coefficient in enumerate(_coefficients(g, m + 1)[1:], start=1):
        if coefficient:
            acc = acc + coefficient * seq[m - k : n_syndromes - k]
    return not (acc % p).any()


def _single_change(difference: np.ndarray, p: int, max_index: int) -> dict[int, int] | None:
    """The change ``{j: c}`` (signed) if the syndromes ``difference`` (an object array of ``T >= 2``
    field elements, not all zero) are those of a single bin, else ``None``.

    A removal that moves no seed changes one bin of one client: ``d_i = c j^i``. Then
    ``j = d_1 / d_0`` and every ``d_{i+1} = j d_i`` is checked, all ``T`` terms, so the result is
    the one `decode_syndromes` returns on ``difference`` (with ``T >= 2`` the decoding of at most
    ``T / 2`` bins is unique, App. J), without Berlekamp-Massey, root finding and Forney.
    """
    if difference.shape[0] < 2:
        return None
    d0 = int(difference[0])
    if not d0:
        return None
    j = int(difference[1]) * pow(d0, -1, p) % p
    if not 1 <= j <= max_index:
        return None
    if not (difference[:-1] * j % p == difference[1:]).all():
        return None
    return {j: d0 - p if d0 > p // 2 else d0}


def _slot_bytes(p: int, n_groups: int) -> int:
    """Bytes per slot of `_packed_single_change`: ``2^(8B) >= 4p^2 > 2p^2 + 2p``, at least the
    ``4G`` bytes of the limbs."""
    return 4 * max(-(-(2 * p.bit_length() + 2) // 32), n_groups)  # whole 32-bit limbs


@functools.lru_cache(maxsize=8)
def _slots(p: int, n_terms: int, slot: int) -> tuple[flint.fmpz, flint.fmpz, flint.fmpz, flint.fmpz]:
    """Constants of `_packed_change` for ``n_terms >= 2`` slots of ``slot`` bytes
    (``W = 8 slot`` bits): ``p * sum_{i<T} 2^(Wi)``, ``2p * sum_{i<T-1} 2^(Wi)``, the mask
    ``2^(W(T-1)) - 1`` of the first ``T - 1`` slots, and the mask of the bits at or above
    ``W - bitlength(p)`` in each of them."""
    ones = int.from_bytes((b"\x01" + bytes(slot - 1)) * n_terms, "little")
    low = (1 << (8 * slot * (n_terms - 1))) - 1
    free = 8 * slot - p.bit_length()
    high = (((1 << (8 * slot)) - (1 << free)) * ones) & low
    return flint.fmpz(p * ones), flint.fmpz(2 * p * (ones & low)), flint.fmpz(low), flint.fmpz(high)


def _kronecker_sums(sums: PackedSums, slot: int) -> flint.fmpz:
    """``sum_i S_i 2^(8 slot i)`` of a `PackedSums` (`_slot_bytes`): one integer holds all ``T``
    values (Kronecker substitution; injective, as every ``S_i < p < 2^(8 slot)``), straight from
    the limbs, as a GMP integer (python-flint's ``fmpz``: `_packed_change` works on it); made
    once per object, so a round's sums are packed once, as the new sums, and reused as the
    previous ones next round."""
    cached = sums._kronecker
    if cached is None or cached[0] != slot:
        limbs = sums.limbs
        rows = np.zeros((limbs.shape[1], slot // 4), "<u4")
        rows[:, : limbs.shape[0]] = limbs.T
        cached = sums._kronecker = (slot, flint.fmpz(int.from_bytes(rows, "little")))
    return cached[1]


def _packed_single_change(
    sums: Sequence[int], previous_sums: Sequence[int], p: int, max_index: int
) -> dict[int, int] | bool | None:
    """`_single_change` of ``sums - previous_sums`` on packed integers, when both are `PackedSums`
    over ``F_p`` (`sum_packed`) with limbs of one shape: ``True`` if they are equal (no change),
    ``{j: c}`` for a single changed bin, ``False`` if the difference is not one bin, ``None``
    otherwise (lists or tuples: the caller computes the difference in Python ints). See
    `_packed_change`."""
    if not (_is_packed(sums, p) and _is_packed(previous_sums, p)) or sums.limbs.shape != previous_sums.limbs.shape:
        return None
    return _packed_change(sums, previous_sums, max_index)


def _packed_change(new: PackedSums, old: PackedSums, max_index: int) -> dict[int, int] | bool:
    """`_single_change` of ``new - old`` (two `PackedSums` over the same ``F_p``, same shape) on
    packed integers: ``True`` if they are equal, ``{j: c}`` for a single changed bin, else ``False``.

    With ``u_i = s_i + p - s'_i`` (``0 < u_i < 2p``, ``u_i = d_i mod p``) in slots of
    ``W = 8B >= 2 bitlength(p) + 2`` bits, ``E = j U_low - (U >> W) + 2p * ones`` holds
    ``e_i = j u_i - u_{i+1} + 2p`` in ``(0, 2^W)`` in slot ``i < T - 1``, so its base-``2^W``
    digits are the ``e_i``; ``d_{i+1} = j d_i`` for every ``i`` iff ``p`` divides every
    ``e_i`` iff ``p`` divides ``E`` and every digit of ``E / p`` is below ``2^(W - bitlength(p))``
    (then ``p k_i < 2^W``, no carry, and the digits of ``p * (E / p)`` are ``p k_i = e_i``; valid
    quotients are below ``2p + 2 <= 2^(W - bitlength(p))``). The same checks as
    `_single_change`, in a few big-integer operations instead of ``3T`` modular ones, and no
    Python int per element: equality, ``s_0`` and ``s_1`` are read off the packed integers
    (`_kronecker_sums`, made from the limbs).
    """
    p = new.p
    slot = _slot_bytes(p, new.limbs.shape[0])
    packed_new, packed_old = _kronecker_sums(new, slot), _kronecker_sums(old, slot)
    if packed_new == packed_old:
        return True
    n_terms = len(new)
    if n_terms < 2:
        return False
    bits, digit = 8 * slot, (1 << 8 * slot) - 1  # s_0 and s_1 are the two lowest slots
    d0 = int(((packed_new & digit) - (packed_old & digit)) % p)
    if not d0:
        return False
    d1 = int((((packed_new >> bits) & digit) - ((packed_old >> bits) & digit)) % p)
    j = d1 * pow(d0, -1, p) % p
    if not 1 <= j <= max_index:
        return False
    p_ones, offsets, low, high = _slots(p, n_terms, slot)
    # in GMP (python-flint's fmpz): Python's division takes several times longer on T slots
    u = packed_new + p_ones - packed_old
    quotient, rest = divmod(j * (u & low) - (u >> (8 * slot)) + offsets, p)
    if rest or quotient & high:
        return False
    return {j: d0 - p if d0 > p // 2 else d0}


def decode_update(
    sums: Sequence[int],
    previous_sums: Sequence[int],
    previous_counts: Mapping[int, int],
    p: int,
    *,
    max_support: int,
    max_index: int,
    max_total: int | None = None,
    change_hint: int | None = None,
    validated: bool = False,
) -> dict[int, int]:
    """Decode a round's count vector q' from its sums, knowing the previous round's sums and q.

    Syndromes are linear, so ``S' - S`` are the syndromes of ``q' - q``. After a removal request
    only the requesting client's count vector changed (at most ``2K`` non-zeros: its old seeds'
    bins lose, its new ones gain; a departing client's at most ``K``), so decoding the difference
    finds roots of a degree-``2K`` polynomial instead of a degree-``KL`` one (root finding
    dominates decoding). The server learns nothing new: ``q' - q`` follows from ``q`` and ``q'``.

    Validity: ``q' = q + (q' - q)`` must have positive integer counts, at most ``max_support``
    non-zeros, indices in ``[1, max_index]`` and a total of at most ``max_total``; such a ``q'``
    reproduces all ``T`` sums and, with ``T = 2KL`` and support ``<= KL``, is the unique vector
    that does (App. J), the same guarantee `decode_syndromes` gives. When the difference does not
    decode or ``q'`` fails a check, ``sums`` are decoded from scratch, which raises on invalid
    input: the fast path never changes the result, only the time. When ``sums`` and
    ``previous_sums`` are both `PackedSums` over ``F_p`` (`sum_packed`), the one-bin test runs on
    packed integers (`_packed_change`; no Python int per element), otherwise (lists, e.g.
    `aggregate_packed`'s or a SecAgg+ sum) on Python ints (`_single_change`): the same result.

    Args:
        sums: this round's ``[T]`` aggregated syndromes (a list, or `sum_packed`'s `PackedSums`).
        previous_sums: the previous round's ``[T]`` aggregated syndromes (likewise).
        previous_counts: the previous round's decoded ``{j: q_j}``.
        p, max_support, max_index, max_total: as for `decode_syndromes`.
        change_hint: expected non-zeros of the difference (e.g. ``2K``); speeds up BM.
        validated: the caller vouches that ``sums`` and ``previous_sums`` are lists of ``T``
            field elements (a server's own `aggregate_packed` results, or sums checked the
            previous round) and that ``previous_counts`` is the previous round's result (keys
            ascending, counts positive), so none of them is checked again.

    Returns:
        ``{j: q'_j}``, non-zero counts only, keys ascending.

    Raises:
        SyndromeDecodingError, ValueError, TypeError: as `decode_syndromes` on ``sums``.

    References:
        Pan et al. Algorithm 2 (server) and Sec. 5.3 (the server learns q' - q); spec 2.4, 3.5.
    """
    p = _check_modulus(p)
    # a PackedSums over F_p holds field elements by construction; anything else is a list
    sums = sums if _is_packed(sums, p) else sums if validated else _check_elements("sums", sums, p)
    if not _is_packed(previous_sums, p) and not validated:
        previous_sums = _check_elements("previous_sums", previous_sums, p, len(sums))
    elif len(previous_sums) != len(sums):
        raise ValueError(f"previous_sums must have {len(sums)} elements, got {len(previous_sums)}")
    return _decode_update(sums, previous_sums, previous_counts, p, max_support=max_support, max_index=max_index,
                          max_total=max_total, change_hint=change_hint, trusted_counts=validated)


def _is_packed(sums: object, p: int) -> bool:
    return isinstance(sums, PackedSums) and sums.p == p


def _ints_of(sums: list[int] | PackedSums) -> list[int]:
    """The sums as a list of Python ints (a `PackedSums`' cached list: not to be changed)."""
    return sums._values() if isinstance(sums, PackedSums) else sums


def _decode_update(
    sums: list[int] | PackedSums,
    previous_sums: list[int] | PackedSums,
    previous_counts: Mapping[int, int],
    p: int,
    *,
    max_support: int,
    max_index: int,
    max_total: int | None,
    change_hint: int | None,
    trusted_counts: bool = False,
) -> dict[int, int]:
    """`decode_update` on sums already known to be ``[T]`` field elements (a server's own
    `aggregate_packed` or `sum_packed` results): the same result, without checking them again (nor
    ``previous_counts`` with ``trusted_counts``: a previous result, keys ascending). Python ints
    of a `PackedSums` are made only when the one-bin test on packed integers does not decide."""
    packed = _packed_single_change(sums, previous_sums, p, max_index)
    first = sums._first(1)[0] if isinstance(sums, PackedSums) else sums[0]
    if packed is None or packed is False:  # the difference is taken on Python ints
        sums, previous_sums = _ints_of(sums), _ints_of(previous_sums)
    full = dict(max_support=max_support, max_index=max_index, max_total=max_total)
    if packed is True:  # equal sums
        change: dict[int, int] = {}
    elif isinstance(packed, dict):  # one bin, checked on packed integers
        change = packed
    else:
        difference = [(a - b) % p for a, b in zip(sums, previous_sums, strict=True)]
        if not any(difference):
            change = {}
        else:
            # packed is False: the packed check found that the difference is not one bin
            single = None if packed is False else _single_change(np.asarray(difference, dtype=object), p, max_index)
            try:
                change = single if single is not None else decode_syndromes(
                    difference, p, max_support=len(sums) // 2, max_index=max_index, signed=True,
                    support_hint=change_hint,
                )
            except SyndromeDecodingError:
                return decode_syndromes(sums, p, **full)
    # q' = q + change; q was valid, so only the changed bins need checking (and the key order,
    # ascending, only changes when a bin appears)
    counts = dict(previous_counts)
    resort = False
    if not trusted_counts:
        keys = list(counts)
        resort = any(a >= b for a, b in zip(keys, keys[1:]))  # q's keys not ascending: sort at the end
        span = keys if resort else keys[:1] + keys[-1:]  # ascending keys: the ends bound them all
        if any(c <= 0 for c in counts.values()) or any(not 1 <= j <= max_index for j in span):
            return decode_syndromes(sums, p, **full)
    total = sum(counts.values())
    for j, c in change.items():
        new = counts.get(j, 0) + c
        resort |= j not in counts  # a new bin breaks the order
        if new < 0 or not 1 <= j <= max_index:
            return decode_syndromes(sums, p, **full)
        if new:
            counts[j] = new
        else:
            counts.pop(j, None)
        total += c
    if resort:
        counts = dict(sorted(counts.items()))
    if len(counts) > max_support or (max_total is not None and total > max_total) or total % p != first:
        return decode_syndromes(sums, p, **full)
    return counts

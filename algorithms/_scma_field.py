"""SCMA's prime field: choosing the prime, exact uniform elements, and packed elements on the wire.

Part of :mod:`fedproto.algorithms.scma` (which re-exports every public name here and describes the
protocol): `field_prime` picks the prime ``p`` (spec mufc.md 2.1), `field_width` its byte width,
`uniform_elements` draws exactly uniform elements by rejection sampling; `pack_elements`,
`unpack_elements` and `check_packed` convert ``[T]`` field elements to and from the wire form
(uint8 ``[T, width]`` big-endian rows), and `PackedSums` holds column sums of packed rows as
limbs. The ``_check_*`` helpers, FLINT contexts and polynomial helpers serve every part of SCMA.

References:
    Pan, Sima, Prakash, Rana, Milenkovic. Machine Unlearning of Federated Clusters. ICLR 2023,
    Sec. 4.1 and Algorithm 2 (SCMA).
    Spec ``mufc.md`` sections 2.1 (field) and 2.7 (costs).
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Mapping, Sequence

import flint
import numpy as np

from fedproto.algorithms.secagg import _chacha20_stream, _check_int
from fedproto.errors import RemoteProtocolError

__all__ = [
    "PROVEN_PRIME_BITS",
    "PackedSums",
    "SyndromeDecodingError",
    "check_packed",
    "field_prime",
    "field_width",
    "pack_elements",
    "uniform_elements",
    "unpack_elements",
]

PROVEN_PRIME_BITS = 512
"""`field_prime` proves primality (``fmpz.is_prime``) up to this many bits; above, BPSW only."""

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

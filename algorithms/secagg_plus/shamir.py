"""Shamir secret sharing of 32-byte secrets over the prime field ``F_p``, ``p = 2^256 + 297``.

SecAgg+ hides each client's self-mask seed ``b_u`` of an aggregation in ``t``-out-of-``k`` Shamir
shares held by its neighbours, so the server can rebuild it from any ``t`` surviving neighbours
while ``t - 1`` of them learn nothing. (Bonawitz et al. share the client's masking key ``s_u^SK``
the same way; fedproto's SecAgg+ never does, see :mod:`fedproto.algorithms.secagg_plus.engine`.)

Sharing (`split_secret`): the 32-byte secret is read big-endian as an integer ``s < 2^256 < p``;
the polynomial ``f(x) = s + c_1 x + ... + c_{t-1} x^{t-1}`` has coefficients drawn uniformly from
``F_p``, and the share for evaluation point ``x`` is ``f(x)``, sent as `SHARE_BYTES` = 33
big-endian bytes. Any ``t`` shares determine ``f`` and so ``s = f(0)``; for any ``t - 1`` shares
and any candidate secret there is exactly one polynomial of degree ``< t`` through them, so the
shares are independent of ``s`` (perfect secrecy).

Randomness: the coefficients are the only randomness and they come from the caller's
``entropy`` alone: ``key = HKDF-SHA256(entropy, info = label || t || secret)``, expanded by a
ChaCha20 keystream cut into 33-byte words, each reduced to 257 bits and kept if below ``p``
(rejection sampling: exactly uniform; `fedproto.algorithms.scma.uniform_elements`). The same
arguments give the same shares, so protocol machines stay pure functions of their inputs. Binding
the secret into the key means that reusing one ``entropy`` for two different secrets still gives
independent polynomials (the shares of ``s - s'`` do not leak through equal coefficients); the
entropy itself must stay private to its owner.

Reconstruction (`combine_shares`, `combine_many`): ``s = sum_i y_i w_i`` with the Lagrange weights
at zero ``w_i = prod_{j != i} x_j / (x_j - x_i)`` over the ``t`` smallest evaluation points given.
`combine_many` groups secrets by their point set, so each distinct set's weights are computed once,
and computes the weights without per-weight modular inversions:

* dense sets (at most ``t`` points of the interval ``[lo, hi]`` missing, e.g. ranks ``1..k``
  with some dropouts, or client indices on the complete graph):
  ``w_i = (P / x_i) * (-1)^(x_i - lo) * Q_i / ((x_i - lo)! (hi - x_i)!)`` with
  ``P = prod_j x_j`` and ``Q_i = prod_{c in [lo, hi] \\ S} (c - x_i)`` over the ``m`` missing
  points, from factorial tables: ``O(t m)`` small-integer products plus ``O(t)`` field products;
* sparse sets of small integers (e.g. client indices): ``w_i = (-1)^(t-1) P / E_i`` with
  ``E_i = x_i prod_{j != i} (x_i - x_j)`` formed exactly in NumPy (``int64`` products of several
  differences at a time, then Python integers), and all ``E_i`` of all sets inverted together
  with Montgomery's trick (one modular inversion and three products per weight): ``O(t^2)``
  small-integer products per set, the bulk of them in C;
* anything else (points too large for ``int64``): the same formula with field arithmetic.

Integrity: a share outside ``[0, p)`` or of the wrong length is rejected, and so is a
reconstruction that is ``>= 2^256`` (not a 32-byte secret). Because ``p - 2^256 = 297``, that last
check catches a random inconsistency only with probability ``297 / p``: it guards against
decoding garbage into bytes, not against tampering. The shares' integrity comes from the AEAD
that carries them between clients (semi-honest model).

References:
    Shamir. How to Share a Secret. Communications of the ACM 22(11), 1979.
    Bonawitz et al. Practical Secure Aggregation for Privacy-Preserving Machine Learning. ACM CCS
    2017, Sec. 3 (SS.share / SS.recon of ``b_u`` and ``s_u^SK``) and Sec. 4 (Fig. 4, rounds 1
    and 4).
    Bell, Bonawitz, Gascon, Lepoint, Raykova. Secure Single-Server Aggregation with
    (Poly)Logarithmic Overhead. ACM CCS 2020, Sec. 3 (shares among the ``k`` graph neighbours).
    Montgomery. Speeding the Pollard and Elliptic Curve Methods of Factorization. Math. Comp. 48,
    1987, Sec. 10.3.1 (simultaneous inversion).
    RFC 5869 (HKDF), RFC 8439 (ChaCha20).
"""

from __future__ import annotations

import functools
import math
import operator
import struct
from collections.abc import Mapping, Sequence

import flint
import numpy as np

from fedproto.algorithms.scma import uniform_elements
from fedproto.algorithms.secagg_plus.messages import SHARE_BYTES
from fedproto.algorithms.secagg import _check_int, derive_bytes

__all__ = [
    "SECRET_BYTES",
    "SHARE_BYTES",
    "SHARE_PRIME",
    "combine_many",
    "combine_shares",
    "split_secret",
]

SHARE_PRIME = 115792089237316195423570985008687907853269984665640564039457584007913129640233
"""The field size ``p = 2^256 + 297``: the smallest prime above ``2^256`` (so every 32-byte
secret is a field element). Proven prime by FLINT's ``fmpz.is_prime`` in the tests."""

SECRET_BYTES = 32
"""Length of a secret in bytes (read big-endian as an integer ``< 2^256``)."""

# SHARE_BYTES (33, the length of one share on the wire) is defined with the messages, which
# import without FLINT; re-exported here.

_SECRET_LIMIT = 1 << (8 * SECRET_BYTES)
_PRIME_BYTES = SHARE_PRIME.to_bytes(SHARE_BYTES, "big")
_COEFFICIENT_INFO = b"fedproto/secagg_plus/shamir/coefficients/v1"
# Below this many field operations (threshold times points) Horner's rule in Python is fastest;
# up to _MATRIX_WORK a FLINT product with the points' cached Vandermonde matrix (0.41 ms against
# 1.04 ms for FLINT's multipoint evaluation at t = 54 and 92 points, SecAgg+'s k at 1,000
# clients); above it (the complete graph's t ~ n/2 over n points) the multipoint evaluation.
_MULTIPOINT_WORK = 300
_MATRIX_WORK = 1 << 15
# NumPy work arrays for the sparse weights stay below this many int64 entries (64 MiB).
_CHUNK_ENTRIES = 1 << 23


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def _check_bytes(name: str, value: object) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"{name} must be bytes, got {type(value).__name__}")
    return bytes(value)


def _check_threshold(threshold: object) -> int:
    threshold = _check_int("threshold", threshold)
    if threshold < 1:
        raise ValueError(f"threshold must be >= 1, got {threshold}")
    return threshold


def _check_points(xs: object, p: int) -> Sequence[int]:
    if isinstance(xs, range) and xs.step == 1 and 1 <= xs.start and xs.stop <= p:
        return xs  # distinct points in [1, p) by construction (SecAgg+'s ranks 1..m)
    if isinstance(xs, str | bytes | bytearray | memoryview) or not isinstance(xs, Sequence):
        raise TypeError(f"xs must be a sequence of ints, got {type(xs).__name__}")
    points = [_check_int(f"xs[{i}]", x) for i, x in enumerate(xs)]
    seen: set[int] = set()
    for i, x in enumerate(points):
        if not 1 <= x < p:
            raise ValueError(f"xs[{i}] = {x} is not an evaluation point in [1, p) (x = 0 would reveal the secret)")
        if x in seen:
            raise ValueError(f"xs contains the evaluation point {x} twice; points must be distinct")
        seen.add(x)
    return points


# --------------------------------------------------------------------------------------------
# Sharing
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _poly_ctx(p: int) -> flint.fmpz_mod_poly_ctx:
    return flint.fmpz_mod_poly_ctx(p)


def _coefficients(secret: int, threshold: int, entropy: bytes, p: int) -> list[int]:
    """``[s, c_1, ..., c_{t-1}]``: the secret, then ``t - 1`` uniform elements of ``F_p``."""
    width = (p.bit_length() + 7) // 8
    info = _COEFFICIENT_INFO + struct.pack(">I", threshold) + secret.to_bytes(width, "big")
    return [secret, *uniform_elements(derive_bytes(entropy, info), p, threshold - 1)]


@functools.lru_cache(maxsize=16)
def _vandermonde(xs: tuple[int, ...], degree: int, p: int) -> flint.fmpz_mat:
    """``[x^j mod p]`` for the points ``xs`` and ``j < degree``, as an exact integer matrix."""
    return flint.fmpz_mat([[pow(x, j, p) for j in range(degree)] for x in xs])


def _evaluate(coefficients: list[int], xs: Sequence[int], p: int) -> list[int]:
    """``f(x) mod p`` for each ``x``, ``f = sum_j coefficients[j] x^j``."""
    work = len(coefficients) * len(xs)
    if work < _MULTIPOINT_WORK:
        reversed_coefficients = coefficients[::-1]
        out = []
        for x in xs:
            acc = 0
            for c in reversed_coefficients:
                acc = acc * x + c  # exact: at most t (257 + bitlength(x)) bits, reduced once
            out.append(acc % p)
        return out
    if work <= _MATRIX_WORK:
        column = flint.fmpz_mat(len(coefficients), 1, coefficients)
        return [int(v) % p for v in (_vandermonde(tuple(xs), len(coefficients), p) * column).entries()]
    return [int(v) for v in _poly_ctx(p)(coefficients).multipoint_evaluate(list(xs))]


def split_secret(secret: bytes, xs: Sequence[int], threshold: int, entropy: bytes) -> list[bytes]:
    """Shamir-share a 32-byte secret: one share per evaluation point, any ``threshold`` recover it.

    Args:
        secret: `SECRET_BYTES` = 32 bytes, read big-endian as an integer ``s < 2^256 < p``.
        xs: ``[m]`` distinct ints in ``[1, SHARE_PRIME)``, the holders' evaluation points (e.g.
            a holder's client index + 1).
        threshold: ``t``, ``1 <= t <= m``: any ``t`` shares reconstruct ``s``, any ``t - 1`` are
            independent of it (``t = 1`` makes every share equal to the secret).
        entropy: at least 32 private bytes; the ``t - 1`` random coefficients are derived from it
            (HKDF-SHA256 bound to ``t`` and the secret, ChaCha20 keystream, rejection sampling),
            so equal arguments give equal shares.

    Returns:
        ``[m]`` list of `SHARE_BYTES` = 33-byte big-endian field elements ``f(x) mod p``, in
        the order of ``xs``.

    Raises:
        TypeError: ``secret`` or ``entropy`` is not bytes, ``xs`` is not a sequence of ints,
            ``threshold`` is not an int.
        ValueError: ``secret`` is not 32 bytes, ``entropy`` is shorter than 32 bytes, an
            evaluation point is outside ``[1, p)`` or repeated, or ``threshold`` is outside
            ``[1, m]``.

    References:
        Shamir 1979 (the scheme); Bonawitz et al., CCS 2017, Sec. 3 (``SS.share``).
    """
    secret = _check_bytes("secret", secret)
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"secret must be {SECRET_BYTES} bytes, got {len(secret)}")
    entropy = _check_bytes("entropy", entropy)
    if len(entropy) < 32:
        raise ValueError(f"entropy must be at least 32 bytes, got {len(entropy)}")
    points = _check_points(xs, SHARE_PRIME)
    threshold = _check_threshold(threshold)
    if threshold > len(points):
        raise ValueError(f"threshold {threshold} exceeds the number of shares {len(points)}")
    coefficients = _coefficients(int.from_bytes(secret, "big"), threshold, entropy, SHARE_PRIME)
    return [y.to_bytes(SHARE_BYTES, "big") for y in _evaluate(coefficients, points, SHARE_PRIME)]


# --------------------------------------------------------------------------------------------
# Lagrange weights at zero
# --------------------------------------------------------------------------------------------


def _batch_inverse(values: Sequence[int], p: int) -> list[int]:
    """Inverses of non-zero field elements with one modular inversion (Montgomery's trick)."""
    prefix = [1] * len(values)
    acc = 1
    for i, v in enumerate(values):
        prefix[i] = acc
        acc = acc * v % p
    inverse = pow(acc, -1, p)
    out = [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        out[i] = prefix[i] * inverse % p
        inverse = inverse * values[i] % p
    return out


@functools.lru_cache(maxsize=8)
def _inverse_factorials(size: int, p: int) -> tuple[int, ...]:
    """``(0!^-1, 1!^-1, ..., (size-1)!^-1) mod p`` for ``1 <= size < p``."""
    factorial = 1
    for i in range(2, size):
        factorial = factorial * i % p
    out = [1] * size
    inverse = pow(factorial, -1, p)
    for i in range(size - 1, 0, -1):
        out[i] = inverse
        inverse = inverse * i % p
    return tuple(out)


def _exact_row_products(factors: np.ndarray, bits: int) -> list[int]:
    """Exact products along the rows of an ``int64 [R, L]`` array with ``|entries| < 2^bits``.

    ``63 // bits`` entries at a time multiply without overflow in ``int64``; the products of
    those words are formed by Python integers (exact, unbounded), in C via NumPy's object reduce.
    """
    rows, length = factors.shape
    if length == 0:
        return [1] * rows
    per_word = max(1, 63 // bits)
    pad = -length % per_word
    if pad:
        factors = np.concatenate([factors, np.ones((rows, pad), dtype=np.int64)], axis=1)
    words = factors.reshape(rows, -1, per_word).prod(axis=2, dtype=np.int64)
    if words.shape[1] == 1:
        return words[:, 0].tolist()
    return np.multiply.reduce(words.astype(object), axis=1).tolist()


def _missing_points(points: tuple[int, ...]) -> int:
    return points[-1] - points[0] + 1 - len(points)


def _is_dense(points: tuple[int, ...]) -> bool:
    # Per weight the dense formula costs about (missing points) small products and the sparse
    # one about t, plus a batched inversion; so dense wins whenever fewer than t points miss.
    return _missing_points(points) <= len(points)


class _Weights:
    """The Lagrange weights at zero of one point set, as ``w_i = scale * factors[i] mod p``."""

    __slots__ = ("factors", "scale")

    def __init__(self, scale: int, factors: list[int]) -> None:
        self.scale = scale
        self.factors = factors

    def combine(self, values: list[int], p: int) -> int:
        return self.scale * (sum(map(operator.mul, values, self.factors)) % p) % p


def _dense_weights(point_sets: list[tuple[int, ...]], p: int) -> list[_Weights]:
    """Weights of sets that fill most of their interval ``[lo, hi]`` (see the module docstring).

    ``w_i = P * A(x_i) * Q_i`` with ``P = prod_j x_j``, the table
    ``A(x) = (-1)^(x - lo) x^-1 ((x - lo)! (hi - x)!)^-1`` (one per ``(lo, hi)``, shared by all
    sets with that interval) and ``Q_i = prod_{c missing} (c - x_i)`` (exact small integers).
    """
    max_span = max(s[-1] - s[0] + 1 for s in point_sets)
    inverse_factorial = _inverse_factorials(1 << max_span.bit_length(), p)
    by_lo: dict[int, list[int]] = {}
    tables: dict[tuple[int, int], list[int]] = {}
    out = []
    t = len(point_sets[0])
    sets_per_chunk = max(1, _CHUNK_ENTRIES // (t * (t + 1)))
    for start in range(0, len(point_sets), sets_per_chunk):
        chunk = point_sets[start : start + sets_per_chunk]
        missing = []
        for s in chunk:
            present = set(s)
            missing.append([c - s[0] for c in range(s[0], s[-1] + 1) if c not in present])
        width = max(map(len, missing))
        # Offsets from lo keep the arrays small whatever the points' size.
        offsets = np.asarray([[x - s[0] for x in s] for s in chunk], dtype=np.int64)
        gaps = np.zeros((len(chunk), width), dtype=np.int64)
        for row, m in enumerate(missing):
            gaps[row, : len(m)] = m
        factors = gaps[:, None, :] - offsets[:, :, None]
        padding = np.arange(width)[None, :] >= np.asarray([len(m) for m in missing])[:, None]
        factors[np.broadcast_to(padding[:, None, :], factors.shape)] = 1
        span_bits = max(1, max(s[-1] - s[0] for s in chunk).bit_length())
        q_values = _exact_row_products(factors.reshape(len(chunk) * t, width), span_bits)
        for k, (s, rows) in enumerate(zip(chunk, offsets.tolist(), strict=True)):
            lo, hi = s[0], s[-1]
            table = tables.get((lo, hi))
            if table is None:
                lows = by_lo.get(lo)
                if lows is None or len(lows) <= hi - lo:
                    inverses = _batch_inverse(range(lo, min(lo + max_span, p)), p)
                    lows = by_lo[lo] = [
                        (p - v if v and d & 1 else v)
                        for d, v in enumerate(inv * f % p for inv, f in zip(inverses, inverse_factorial, strict=False))
                    ]
                table = tables[(lo, hi)] = [lows[d] * inverse_factorial[hi - lo - d] % p for d in range(hi - lo + 1)]
            picked = map(table.__getitem__, rows)
            out.append(_Weights(math.prod(s) % p, list(map(operator.mul, picked, q_values[k * t : (k + 1) * t]))))
    return out


def _sparse_weights(point_sets: list[tuple[int, ...]], p: int) -> list[_Weights]:
    """Weights of arbitrary sets of equal size ``t``: ``w_i = (-1)^(t-1) P / E_i`` (batched inversion).

    ``E_i = x_i prod_{j != i} (x_i - x_j)``: exact NumPy/Python-integer products when the points
    are below ``2^62``, field arithmetic otherwise.
    """
    t = len(point_sets[0])
    largest = max(s[-1] for s in point_sets)
    denominators: list[int] = []
    if largest < 1 << 62:
        bits = largest.bit_length()  # |x_i - x_j| < x_max and x_i <= x_max
        sets_per_chunk = max(1, _CHUNK_ENTRIES // (t * t))
        diagonal = np.arange(t)
        for start in range(0, len(point_sets), sets_per_chunk):
            chunk = np.asarray(point_sets[start : start + sets_per_chunk], dtype=np.int64)
            factors = chunk[:, :, None] - chunk[:, None, :]
            factors[:, diagonal, diagonal] = chunk
            exact = _exact_row_products(factors.reshape(-1, t), bits)
            denominators.extend(e % p for e in exact)
    else:
        for s in point_sets:
            for i, x in enumerate(s):
                e = x
                for j, xj in enumerate(s):
                    if j != i:
                        e = e * (x - xj) % p
                denominators.append(e)
    inverses = _batch_inverse(denominators, p)
    sign = -1 if t % 2 == 0 else 1
    return [
        _Weights(sign * math.prod(s) % p, inverses[k * t : (k + 1) * t]) for k, s in enumerate(point_sets)
    ]


def _lagrange_weights(point_sets: list[tuple[int, ...]], p: int) -> dict[tuple[int, ...], _Weights]:
    """``{S: weights}`` with ``w_i = prod_{j != i} x_j / (x_j - x_i) mod p`` for sorted, distinct sets ``S``."""
    weights: dict[tuple[int, ...], _Weights] = {}
    groups: dict[tuple[bool, int], list[tuple[int, ...]]] = {}
    for s in point_sets:
        groups.setdefault((_is_dense(s), len(s)), []).append(s)
    for (dense, _), sets in groups.items():
        computed = _dense_weights(sets, p) if dense else _sparse_weights(sets, p)
        weights.update(zip(sets, computed, strict=True))
    return weights


# --------------------------------------------------------------------------------------------
# Reconstruction
# --------------------------------------------------------------------------------------------


def _selected_shares(shares: object, threshold: int, where: str) -> tuple[tuple[int, ...], list[int]]:
    """Validate ``{x: share}`` and return the ``t`` smallest points with their values.

    Every point is checked (they are sorted); only the ``t`` shares used are checked for type,
    length and range, so the cost does not grow with unused shares.
    """
    if not isinstance(shares, Mapping):
        raise TypeError(f"{where}shares must be a mapping {{x: share bytes}}, got {type(shares).__name__}")
    if len(shares) < threshold:
        raise ValueError(f"{where}{len(shares)} shares given, but the threshold is {threshold}")
    keys = list(shares)
    # Whole-item checks run in C; the scans below only run to name the offending entry.
    if set(map(type, keys)) != {int}:
        keys = [x if type(x) is int else _check_int(f"{where}evaluation point", x) for x in keys]
    if min(keys) < 1 or max(keys) >= SHARE_PRIME:
        x = next(x for x in keys if not 1 <= x < SHARE_PRIME)
        raise ValueError(f"{where}evaluation point {x} is not in [1, p)")
    keys.sort()
    points = tuple(keys[:threshold])
    values = list(map(shares.__getitem__, points))
    if set(map(type, values)) != {bytes}:
        for x, share in zip(points, values, strict=True):
            if not isinstance(share, bytes | bytearray | memoryview):
                raise TypeError(f"{where}the share for x = {x} must be bytes, got {type(share).__name__}")
        values = [bytes(v) for v in values]
    if set(map(len, values)) != {SHARE_BYTES}:
        x, share = next((x, v) for x, v in zip(points, values, strict=True) if len(v) != SHARE_BYTES)
        raise ValueError(f"{where}the share for x = {x} is {len(share)} bytes, expected {SHARE_BYTES}")
    # Fixed-width big-endian: byte order is numeric order.
    if max(values) >= _PRIME_BYTES:
        x = next(x for x, v in zip(points, values, strict=True) if v >= _PRIME_BYTES)
        raise ValueError(f"{where}the share for x = {x} is not a field element (>= p)")
    return points, list(map(int.from_bytes, values))


def _reconstruct(selected: list[tuple[tuple[int, ...], list[int]]], where: list[str]) -> list[bytes]:
    weights = _lagrange_weights(list(dict.fromkeys(points for points, _ in selected)), SHARE_PRIME)
    out = []
    for label, (points, values) in zip(where, selected, strict=True):
        secret = weights[points].combine(values, SHARE_PRIME)
        if secret >= _SECRET_LIMIT:
            raise ValueError(f"{label}inconsistent shares: the reconstruction is >= 2^256, not a 32-byte secret")
        out.append(secret.to_bytes(SECRET_BYTES, "big"))
    return out


def combine_many(items: Sequence[Mapping[int, bytes]], threshold: int) -> list[bytes]:
    """Reconstruct many secrets at once (the SecAgg+ server's unmasking step).

    Each secret uses the ``t`` smallest evaluation points among its shares. Secrets whose
    points coincide share one set of Lagrange weights; the weights of all distinct point sets
    are computed together (see the module docstring: factorial tables for dense sets, exact
    NumPy products and one batched inversion for sparse ones).

    Args:
        items: ``[N]`` mappings ``{x: share}``, ``x`` an int in ``[1, p)``, ``share``
            `SHARE_BYTES` bytes as made by `split_secret`; each holds at least ``threshold``
            shares, of which those at the ``threshold`` smallest points are used (only those
            are checked beyond their point).
        threshold: ``t >= 1``, the threshold the secrets were shared with.

    Returns:
        ``[N]`` list of `SECRET_BYTES`-byte secrets, in the order of ``items``.

    Raises:
        TypeError: ``items`` is not a sequence of mappings, a point is not an int, a share is
            not bytes, or ``threshold`` is not an int.
        ValueError: ``threshold < 1``; an item has fewer than ``threshold`` shares, a point
            outside ``[1, p)``, a share of the wrong length or ``>= p``; or a reconstruction is
            ``>= 2^256`` (inconsistent shares). Messages name the item as ``items[i]``.

    References:
        Shamir 1979; Bonawitz et al., CCS 2017, Sec. 4 (Fig. 4, round 4: the server's
        ``SS.recon``); Montgomery 1987 (simultaneous inversion).
    """
    if isinstance(items, Mapping) or not isinstance(items, Sequence):
        raise TypeError(f"items must be a sequence of share mappings, got {type(items).__name__}")
    threshold = _check_threshold(threshold)
    where = [f"items[{i}]: " for i in range(len(items))]
    return _reconstruct([_selected_shares(shares, threshold, w) for w, shares in zip(where, items, strict=True)], where)


def combine_shares(shares: Mapping[int, bytes], threshold: int) -> bytes:
    """Reconstruct one secret from at least ``threshold`` of its shares.

    Args:
        shares: ``{x: share}``, ``x`` an int in ``[1, p)``, ``share`` `SHARE_BYTES` bytes; at
            least ``threshold`` entries, of which the ``threshold`` smallest ``x`` are used (and
            checked; the others' shares are not read).
        threshold: ``t >= 1``, the threshold the secret was shared with.

    Returns:
        the `SECRET_BYTES`-byte secret.

    Raises:
        TypeError: ``shares`` is not a mapping, a point is not an int or a share not bytes.
        ValueError: fewer than ``threshold`` shares, a point outside ``[1, p)``, a share of the
            wrong length or ``>= p``, ``threshold < 1``, or a reconstruction ``>= 2^256``
            (inconsistent shares).

    References:
        Shamir 1979; Bonawitz et al., CCS 2017, Sec. 3 (``SS.recon``).
    """
    threshold = _check_threshold(threshold)
    return _reconstruct([_selected_shares(shares, threshold, "")], [""])[0]

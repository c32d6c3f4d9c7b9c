"""Secure-aggregation building blocks: fixed-point ring encoding, one-time-pad masks, seed sealing.

FastLloyd's Masked Secure Aggregation (MSA) sums the clients' statistics in the ring
``Z_{2^w}`` (``w = 32`` in the paper's evaluation, ``w = 64`` optional): every client encodes its
vector in fixed point with ``q`` fractional bits, adds its mask ``r_i`` and sends the result to
the server; the server adds the masked vectors and its quantised DP noise and broadcasts the
still-masked aggregate; each client subtracts the total mask ``r = sum_i r_i`` and decodes.

Everything here uses NumPy's exact unsigned integer types (``uint32``/``uint64`` wrap around
modulo ``2^w``) and the `cryptography` package, never JAX and never a statistical generator:
ring arithmetic must be exact and masks must be unpredictable.

Rounding is round-half-up, ``round(x) = floor(x + 1/2)``, for both the clients' values and the
server's noise. It is shift-equivariant (``round(V + z) == V + round(z)`` for an integer ``V``),
which is what makes quantising the noise equal to quantising the noisy value (FastLloyd App. A.3),
so the quantised release is post-processing of the Gaussian mechanism. The authors' code
truncates toward zero, which is not shift-equivariant (spec fastlloyd.md, section 2.11).

References:
    Diaa, Humphries, Kerschbaum. FastLloyd (arXiv 2405.02437), Sec. 5.3.4 and Fig. 1 (MSA),
    App. A.3 (quantised noise).
    Bonawitz et al. Practical Secure Aggregation for Privacy-Preserving Machine Learning.
    ACM CCS 2017 (masking with PRG-expanded seeds; key agreement for seed distribution).
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Sequence

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand

__all__ = [
    "MaskGenerator",
    "decode_fixed",
    "derive_bytes",
    "encode_fixed",
    "headroom",
    "open_seed",
    "open_with_shared",
    "quantize_noise",
    "ring_dtype",
    "seal_seed",
    "seal_seed_for_each",
    "seal_with_shared",
    "x25519_keypair",
    "x25519_shared",
]

SEED_BYTES = 32
"""Length of a mask seed in bytes (a 256-bit ChaCha20 key's worth of entropy)."""

_RING_DTYPES = {32: np.dtype(np.uint32), 64: np.dtype(np.uint64)}
_SIGNED_DTYPES = {32: np.dtype(np.int32), 64: np.dtype(np.int64)}
_SEAL_TAG_BYTES = 16
_SEAL_NONCE = bytes(12)  # every sealing key is used once (see seal_seed), so a fixed nonce is safe
_SEAL_INFO = b"fedproto/secagg/seal-seed/v1\x00"
_X25519_INFO = b"fedproto/secagg/x25519-private-key/v1"


# --------------------------------------------------------------------------------------------
# Ring and fixed-point encoding
# --------------------------------------------------------------------------------------------


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None


def ring_dtype(ring_bits: int) -> np.dtype:
    """The unsigned integer dtype that implements the ring ``Z_{2^ring_bits}``.

    Args:
        ring_bits: ring width ``w``; 32 or 64.

    Returns:
        ``np.dtype(np.uint32)`` for 32, ``np.dtype(np.uint64)`` for 64. NumPy's unsigned array
        arithmetic wraps modulo ``2^w``, which is exactly the ring's addition.

    Raises:
        ValueError: ``ring_bits`` is not 32 or 64.
        TypeError: ``ring_bits`` is not an int.

    References:
        FastLloyd, Sec. 5.3.4 (``Z_{2^32}`` in the evaluation, ``Z_{2^64}`` as an option).
    """
    ring_bits = _check_int("ring_bits", ring_bits)
    try:
        return _RING_DTYPES[ring_bits]
    except KeyError:
        raise ValueError(f"ring_bits must be 32 or 64, got {ring_bits}") from None


def _check_fixed(frac_bits: int, ring_bits: int) -> tuple[int, int]:
    ring_dtype(ring_bits)
    frac_bits = _check_int("frac_bits", frac_bits)
    if not 0 <= frac_bits <= ring_bits - 1:
        raise ValueError(f"frac_bits must be in [0, {ring_bits - 1}] for a {ring_bits}-bit ring, got {frac_bits}")
    return frac_bits, ring_bits


def headroom(frac_bits: int = 16, ring_bits: int = 32) -> float:
    """The largest magnitude (exclusive) that a fixed-point aggregate may have.

    Signed values occupy ``[-2^(w-1), 2^(w-1))`` in two's complement, so after scaling by
    ``2^q`` a value must satisfy ``|v| < 2^(w-1-q)``: 32768 for ``q = 16, w = 32``. The bound
    applies to every *aggregate* coordinate (the sum over parties plus noise), not only to each
    party's input: a sum that leaves this range wraps around and decodes to garbage.

    Args:
        frac_bits: fractional bits ``q``.
        ring_bits: ring width ``w`` (32 or 64).

    Returns:
        ``2.0 ** (ring_bits - 1 - frac_bits)``.

    Raises:
        ValueError: ``ring_bits`` not in {32, 64} or ``frac_bits`` outside ``[0, w - 1]``.

    References:
        FastLloyd, Sec. 5.3.4 (footnote on the choice of ``q``); spec fastlloyd.md, section 6
        (overflow guard).
    """
    frac_bits, ring_bits = _check_fixed(frac_bits, ring_bits)
    return 2.0 ** (ring_bits - 1 - frac_bits)


def _as_finite_float64(values: object, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        bad = arr[~np.isfinite(arr)]
        raise ValueError(f"cannot encode non-finite {what}: found {float(bad.ravel()[0])!r} ({bad.size} entries)")
    return arr


def _round_half_up(scaled: np.ndarray) -> np.ndarray:
    """``floor(s + 1/2)`` computed exactly in float64.

    ``np.floor(s + 0.5)`` is wrong for ``s`` just below one half (``0.49999999999999994 + 0.5``
    rounds to 1.0), so the fractional part is compared instead: ``s - floor(s)`` is exact (Sterbenz)
    whenever the comparison with 1/2 could go either way.
    """
    floor = np.floor(scaled)
    return floor + (scaled - floor >= 0.5)


def _to_ring(rounded: np.ndarray, ring_bits: int) -> np.ndarray:
    """Reduce integer-valued float64 entries modulo ``2^w`` exactly."""
    dtype = ring_dtype(ring_bits)
    rounded = np.asarray(rounded, dtype=np.float64)
    out = np.empty(rounded.shape, dtype=dtype)
    # float64 -> int64 is exact for |x| < 2^63. Larger magnitudes (only possible for absurd
    # noise) take the exact Python-int path.
    small = np.abs(rounded) < 2.0**63
    ints = np.where(small, rounded, 0.0).astype(np.int64)
    if ring_bits == 32:
        out[...] = (ints & 0xFFFFFFFF).astype(np.uint32)
    else:
        out[...] = ints.astype(np.uint64)  # two's complement bit pattern == value mod 2^64
    if not small.all():
        modulus = 1 << ring_bits
        flat_out, flat_in = out.reshape(-1), rounded.reshape(-1)
        for i in np.flatnonzero(~small):
            flat_out[i] = int(flat_in[i]) % modulus
    return out


#: ``(frac_bits, ring_bits) -> (2^q, headroom, ring dtype)`` for encode_fixed's unchecked path.
_FIXED_FAST = {
    (q, w): (2.0**q, 2.0 ** (w - 1 - q), np.dtype(np.uint32 if w == 32 else np.uint64))
    for w in (32, 64)
    for q in range(w - 1)
}


def encode_fixed(values: object, *, frac_bits: int = 16, ring_bits: int = 32) -> np.ndarray:
    """Encode real values as fixed-point ring elements: ``floor(v * 2^q + 1/2) mod 2^w``.

    The scaling by ``2^q`` is exact in float64 and the rounding is computed exactly (see
    `_round_half_up`); reduction modulo ``2^w`` happens last, on an exact int64 value, so
    nothing wraps early. Negative values map to the upper half of the ring (two's complement).

    Args:
        values: array-like of real values, any shape ``[...]`` (converted to float64). Values
            already on the ``2^-q`` grid are encoded exactly.
        frac_bits: fractional bits ``q`` (the paper uses 16).
        ring_bits: ring width ``w``, 32 or 64.

    Returns:
        ``uint32`` (``w = 32``) or ``uint64`` (``w = 64``) array of the input's shape.

    Raises:
        ValueError: a value is NaN or infinite; or the overflow guard fires: some
            ``|v| >= 2^(w-1-q)`` (`headroom`), or a value just below the headroom rounds up to
            ``2^(w-1)``. The message names the largest ``|value|``.

    References:
        FastLloyd, Sec. 5.3.4 and Fig. 1 (``v~_i = round(v_i * 2^q)``); spec fastlloyd.md,
        section 6 (overflow guard) and oracle 7.1.6.
    """
    fast = _FIXED_FAST.get((frac_bits, ring_bits)) if type(frac_bits) is int and type(ring_bits) is int else None
    if fast is not None and type(values) is np.ndarray and values.dtype == np.float64 and values.size:
        # Common case first (a client's few statistics, every round): finite values below the
        # headroom; NaN fails the comparison and takes the checked path below, as do large values.
        scale, limit, dtype = fast
        if float(np.max(np.abs(values))) < limit:
            scaled = values * scale
            floor = np.floor(scaled)
            rounded = floor + (scaled - floor >= 0.5)
            if float(np.max(rounded)) < limit * scale:  # below 2^(w-1): exact in int64
                return rounded.astype(np.int64).astype(dtype)
    frac_bits, ring_bits = _check_fixed(frac_bits, ring_bits)
    arr = _as_finite_float64(values, "value")
    limit = headroom(frac_bits, ring_bits)
    if arr.size:
        largest = float(np.max(np.abs(arr)))
        if largest >= limit:
            raise ValueError(
                f"fixed-point overflow: largest |value| is {largest!r}, which is >= the headroom "
                f"2^{ring_bits - 1 - frac_bits} = {limit!r} of a {ring_bits}-bit ring with "
                f"{frac_bits} fractional bits; use a wider ring or fewer frac_bits"
            )
    rounded = _round_half_up(arr * 2.0**frac_bits)
    if arr.size and np.max(rounded) >= 2.0 ** (ring_bits - 1):
        raise ValueError(
            f"fixed-point overflow: largest |value| is {largest!r}, which rounds to "
            f"2^{ring_bits - 1} / 2^{frac_bits}, outside the signed range of a {ring_bits}-bit ring"
        )
    return _to_ring(rounded, ring_bits)


def decode_fixed(ring_values: object, *, frac_bits: int = 16, ring_bits: int = 32) -> np.ndarray:
    """Decode ring elements as signed fixed-point values: two's complement, divided by ``2^q``.

    Args:
        ring_values: integer array-like, any shape ``[...]``: ring elements in ``[0, 2^w)``,
            normally of dtype `ring_dtype` ``(ring_bits)``.
        frac_bits: fractional bits ``q``.
        ring_bits: ring width ``w``, 32 or 64.

    Returns:
        float64 array of the same shape, in ``[-2^(w-1-q), 2^(w-1-q))``. Exact for ``w = 32``; for
        ``w = 64`` exact while ``|signed value| <= 2^53``.

    Raises:
        TypeError: the input is not an integer array.
        ValueError: an integer of another dtype lies outside ``[0, 2^w)``.

    References:
        FastLloyd, Sec. 5.3.4 ("Client Unmasks Data").
    """
    fast = _FIXED_FAST.get((frac_bits, ring_bits)) if type(frac_bits) is int and type(ring_bits) is int else None
    if fast is not None and type(ring_values) is np.ndarray and ring_values.dtype == fast[2]:
        # Common case first: ring elements of the ring's own dtype (every client, every round).
        return ring_values.view(_SIGNED_DTYPES[ring_bits]).astype(np.float64) / fast[0]
    frac_bits, ring_bits = _check_fixed(frac_bits, ring_bits)
    dtype = ring_dtype(ring_bits)
    arr = np.asarray(ring_values)
    if arr.dtype.kind not in "ui":
        raise TypeError(f"ring values must be an integer array, got dtype {arr.dtype}")
    if arr.dtype != dtype:
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= 1 << ring_bits):
            raise ValueError(f"ring values must lie in [0, 2^{ring_bits}), got dtype {arr.dtype} values outside")
        arr = arr.astype(dtype)
    signed = arr.view(_SIGNED_DTYPES[ring_bits])
    return np.asarray(signed.astype(np.float64) / 2.0**frac_bits)


def quantize_noise(noise: object, *, frac_bits: int = 16, ring_bits: int = 32) -> np.ndarray:
    """The server's noise in the ring: ``floor(g * 2^q + 1/2) mod 2^w``.

    The same rounding as `encode_fixed`, without the headroom guard: the server does not know
    the aggregate, and a noise sample beyond the headroom simply wraps like any ring element
    (the clients' decoded result is then wrong, which a sane noise scale makes negligible). Huge
    samples are still reduced exactly.

    Args:
        noise: real noise samples ``gamma``, any shape ``[...]`` (converted to float64).
        frac_bits: fractional bits ``q``.
        ring_bits: ring width ``w``, 32 or 64.

    Returns:
        ``uint32``/``uint64`` array of the input's shape.

    Raises:
        ValueError: a sample is NaN or infinite (or becomes infinite when scaled by ``2^q``).

    References:
        FastLloyd, Fig. 1 (``gamma~ = round(gamma * 2^q)``) and App. A.3 (with shift-equivariant
        rounding, ``enc(v) + gamma~ == round(2^q (v + gamma))``: quantisation is post-processing).
    """
    frac_bits, ring_bits = _check_fixed(frac_bits, ring_bits)
    arr = _as_finite_float64(noise, "noise")
    with np.errstate(over="ignore"):  # reported below as a non-finite scaled sample
        scaled = arr * 2.0**frac_bits
    scaled = _as_finite_float64(scaled, "scaled noise")
    return _to_ring(_round_half_up(scaled), ring_bits)


# --------------------------------------------------------------------------------------------
# Masks
# --------------------------------------------------------------------------------------------


def _hkdf(secret: bytes, info: bytes, length: int = 32) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)


def derive_bytes(secret: bytes, info: bytes, length: int = 32) -> bytes:
    """Derive ``length`` pseudorandom bytes from a secret with HKDF-SHA256 (no salt).

    Used to draw a party's secrets (e.g. the shared mask seed) deterministically from the entropy
    it was constructed with, so a protocol machine stays a pure function of its arguments.
    Different ``info`` strings give independent outputs from the same secret.

    Args:
        secret: input keying material, at least 32 bytes (256 bits of entropy).
        info: context/purpose label, e.g. ``b"fedproto/fastlloyd/seed"``.
        length: output length in bytes, ``1 <= length <= 8160``.

    Returns:
        ``length`` bytes.

    Raises:
        ValueError: ``secret`` is shorter than 32 bytes or ``length`` is out of range.
        TypeError: ``secret`` or ``info`` is not bytes.

    References:
        RFC 5869 (HKDF).
    """
    for name, value in (("secret", secret), ("info", info)):
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"{name} must be bytes, got {type(value).__name__}")
    if len(secret) < 32:
        raise ValueError(f"secret must be at least 32 bytes, got {len(secret)}")
    length = _check_int("length", length)
    if not 1 <= length <= 255 * 32:
        raise ValueError(f"length must be in [1, {255 * 32}], got {length}")
    return _hkdf(bytes(secret), bytes(info), length)


def _chacha20_stream(key: bytes, n_bytes: int) -> bytes:
    # A zero nonce is safe: every key is derived for exactly one (label, stream, round, party,
    # shape, ring) tuple and used for one keystream.
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    return encryptor.update(bytes(n_bytes)) + encryptor.finalize()


def _length_prefixed(*fields: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(f)) + f for f in fields)


#: How many chain values ``g_j`` (and how many totals) a :class:`MaskGenerator` keeps: enough for
#: the clients of a process taking turns in index order, for two streams, to share each ``g_{i+1}``.
_CHAIN_KEPT = 8


def _keep(cache: dict, key: tuple, value: np.ndarray) -> np.ndarray:
    """Store ``value`` in a :class:`MaskGenerator` cache, dropping its oldest entry when it holds
    :data:`_CHAIN_KEPT`; return ``value``."""
    if len(cache) >= _CHAIN_KEPT:
        del cache[next(iter(cache))]
    cache[key] = value
    return value


class MaskGenerator:
    """One-time-pad masks for FastLloyd's MSA, expanded from a seed shared by all clients.

    For round ``t`` and stream ``s`` (e.g. ``"R"`` for relative sums, ``"C"`` for counts) the
    masks are:

    * ``g_j = PRG(HKDF(seed, info(label, s, "chain", t, j)))`` for ``j = 0, ..., M``;
    * ``r_i = g_i - g_{i+1}  (mod 2^w)`` for parties ``i = 0, ..., M - 1``;
    * the total ``r = sum_i r_i = g_0 - g_M`` (the sum telescopes).

    ``PRG`` is the ChaCha20 keystream (32-byte key from HKDF-SHA256, zero nonce) read as
    little-endian ``uint32``/``uint64``. The HKDF ``info`` is an unambiguous length-prefixed
    encoding of the label, the stream name, the kind, and (as fixed-width integers) the ring
    width, the number of parties, the shape, the round and the index ``j``, so no two distinct
    requests share a key. Every mask and the total cost two expansions, whatever ``M``: no
    client's work grows with the number of clients, and neither does removing the masks of
    ``D`` dropped clients from the total (``2 D`` expansions). Distribution: for any fixed
    ``g_0`` the map ``(g_1, ..., g_M) -> (r_0, ..., r_{M-1})`` is a bijection (triangular), so
    with the ``g_j`` independent and uniform (as PRG outputs) the ``M`` masks are independent and
    uniform and ``r`` is their sum: exactly the paper's "sample M masks and sum them".

    An instance keeps the last few ``g_j`` it expanded (:data:`_CHAIN_KEPT`) and each round's
    total. A process that hosts many clients of a run shares one generator among them
    (FastLloyd's clients do), so consecutive clients ``i`` and ``i + 1`` share ``g_{i+1}``: one
    expansion per client, as a client of its own would pay for half its mask.

    Security (FastLloyd Sec. 5.3.4, Thm. 5.2; spec fastlloyd.md, section 2.8): every client
    knows the seed and can compute *every* mask; the server never receives the seed. The server
    sees ``enc(v_i) + r_i`` from each client and computes ``enc(v) + r + gamma~``; each ``r_i`` is
    a fresh one-time pad on ``Z_{2^w}``, so every masked message the server sees is
    (computationally, under the PRG) uniform and independent of the inputs, and so is the masked
    aggregate, because ``r`` is uniform. This relies on FastLloyd's trust model: semi-honest
    parties, and clients that do not collude with the server (a client that shared the seed
    with the server would unmask everything). Unlike Bonawitz et al.'s pairwise masks, these
    masks do not cancel at the server; the clients remove ``r`` after the broadcast, so the server
    learns neither inputs nor outputs. Masks must never be reused: a new ``round_idx`` or
    ``stream`` gives independent masks, and reuse would reveal differences of inputs.

    Determinism: the masks are a pure function of the constructor arguments and
    ``(party_idx, round_idx, stream)``; two instances built from the same arguments (e.g. in
    different client processes) return identical arrays.

    Args:
        seed: the clients' shared secret, exactly 32 bytes (e.g. from `open_seed`).
        n_parties: number of clients ``M >= 1``.
        shape: shape of each mask, e.g. ``(k, d)`` or ``(k * (d + 1),)``.
        ring_bits: ring width ``w``, 32 or 64.
        label: domain-separation label (bytes); different protocols should use different labels.

    Raises:
        ValueError: the seed is not 32 bytes, ``n_parties < 1``, a dimension is negative, or
            ``ring_bits`` is not 32 or 64.
        TypeError: an argument has the wrong type.

    References:
        FastLloyd, Sec. 5.3.4 and Fig. 1 (lines "{r_1..r_M} = PRNG(seed, t)", "r = sum r_i").
        Bonawitz et al., CCS 2017, Sec. 4 (PRG-expanded masks; one-time pads in ``Z_R``).
        RFC 5869 (HKDF); RFC 8439 (ChaCha20).
    """

    def __init__(
        self,
        seed: bytes,
        n_parties: int,
        shape: tuple[int, ...],
        *,
        ring_bits: int = 32,
        label: bytes = b"fedproto-mask",
    ) -> None:
        if not isinstance(seed, bytes | bytearray | memoryview):
            raise TypeError(f"seed must be bytes, got {type(seed).__name__}")
        seed = bytes(seed)
        if len(seed) != SEED_BYTES:
            raise ValueError(f"seed must be exactly {SEED_BYTES} bytes, got {len(seed)}")
        n_parties = _check_int("n_parties", n_parties)
        if n_parties < 1:
            raise ValueError(f"n_parties must be >= 1, got {n_parties}")
        if isinstance(shape, int):
            shape = (shape,)
        shape = tuple(_check_int("shape entry", s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"shape entries must be >= 0, got {shape}")
        self._dtype = ring_dtype(ring_bits)
        if not isinstance(label, bytes):
            raise TypeError(f"label must be bytes, got {type(label).__name__}")
        self._seed = seed
        self._prk: bytes | None = None  # HKDF-Extract of the seed, computed on first use
        self._n_parties = n_parties
        self._shape = shape
        self._ring_bits = ring_bits
        self._label = label
        self._size = int(np.prod(shape, dtype=np.int64))
        # (round, stream, j) -> g_j and (round, stream) -> total: the latest few, oldest first
        self._chain: dict[tuple[int, str, int], np.ndarray] = {}
        self._totals: dict[tuple[int, str], np.ndarray] = {}

    @property
    def n_parties(self) -> int:
        """Number of clients ``M``."""
        return self._n_parties

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of every mask."""
        return self._shape

    @property
    def ring_bits(self) -> int:
        """Ring width ``w``."""
        return self._ring_bits

    @property
    def dtype(self) -> np.dtype:
        """``uint32`` or ``uint64``."""
        return self._dtype

    def __repr__(self) -> str:  # never show the seed
        return (
            f"MaskGenerator(n_parties={self._n_parties}, shape={self._shape}, "
            f"ring_bits={self._ring_bits}, label={self._label!r})"
        )

    def _expand(self, kind: bytes, round_idx: int, party_idx: int, stream: str) -> np.ndarray:
        info = _length_prefixed(self._label, stream.encode("utf-8"), kind) + struct.pack(
            f">BQQQ{len(self._shape)}QQ",
            self._ring_bits,
            self._n_parties,
            round_idx,
            party_idx,
            *self._shape,
            len(self._shape),
        )
        if self._prk is None:
            # HKDF = Expand(Extract(seed)); the extract step depends on the seed alone (RFC 5869).
            extract = hmac.HMAC(bytes(hashes.SHA256.digest_size), hashes.SHA256())
            extract.update(self._seed)
            self._prk = extract.finalize()
        key = HKDFExpand(algorithm=hashes.SHA256(), length=32, info=info).derive(self._prk)
        raw = _chacha20_stream(key, self._size * self._dtype.itemsize)
        words = np.frombuffer(raw, dtype=self._dtype.newbyteorder("<"))
        return words.astype(self._dtype).reshape(self._shape)

    def _check_round(self, round_idx: int, stream: str) -> int:
        if type(round_idx) is int and 0 <= round_idx < 1 << 64 and type(stream) is str:
            return round_idx
        round_idx = _check_int("round_idx", round_idx)
        if not 0 <= round_idx < 1 << 64:
            raise ValueError(f"round_idx must be in [0, 2^64), got {round_idx}")
        if not isinstance(stream, str):
            raise TypeError(f"stream must be a str, got {type(stream).__name__}")
        return round_idx

    def _chain_value(self, round_idx: int, stream: str, j: int) -> np.ndarray:
        """``g_j`` of ``(round_idx, stream)``, from the instance's latest few or expanded (read-only)."""
        key = (round_idx, stream, j)
        value = self._chain.get(key)
        if value is None:
            value = _keep(self._chain, key, self._expand(b"chain", round_idx, j, stream))
        return value

    def total_mask(self, round_idx: int, stream: str = "") -> np.ndarray:
        """The total mask ``r = sum_i r_i = g_0 - g_M (mod 2^w)`` that the clients subtract after
        the broadcast.

        Args:
            round_idx: 0-based round (Lloyd iteration) index.
            stream: which MSA invocation of the round, e.g. ``"R"`` or ``"C"``.

        Returns:
            A new array of `shape` and `dtype` (``uint32``/``uint64``). Cost: two PRG expansions,
            the first time an instance is asked for a round and stream; a copy after that (every
            client a process hosts asks for the same total).

        Raises:
            ValueError: ``round_idx`` negative or ``>= 2^64``.
            TypeError: wrong argument types.
        """
        round_idx = self._check_round(round_idx, stream)
        key = (round_idx, stream)
        total = self._totals.get(key)
        if total is None:
            # g_0 and g_M are the first and the last client's chain values too: shared with them
            first = self._chain_value(round_idx, stream, 0)
            last = self._chain_value(round_idx, stream, self._n_parties)
            total = _keep(self._totals, key, np.subtract(first, last, out=np.empty_like(first)))
        return total.copy()

    def party_mask(self, party_idx: int, round_idx: int, stream: str = "") -> np.ndarray:
        """The mask ``r_i = g_i - g_{i+1} (mod 2^w)`` that party ``party_idx`` adds to its encoded
        vector.

        Args:
            party_idx: 0-based client index in ``[0, n_parties)``.
            round_idx: 0-based round (Lloyd iteration) index.
            stream: which MSA invocation of the round, e.g. ``"R"`` or ``"C"``.

        Returns:
            A new array of `shape` and `dtype`. Cost: two PRG expansions, or one when this
            instance expanded ``g_i`` for party ``i - 1`` just before (clients taking turns in
            index order on one shared generator).

        Raises:
            ValueError: ``party_idx`` outside ``[0, n_parties)`` or a bad ``round_idx``.
            TypeError: wrong argument types.
        """
        party_idx = _check_int("party_idx", party_idx)
        if not 0 <= party_idx < self._n_parties:
            raise ValueError(f"party_idx must be in [0, {self._n_parties}), got {party_idx}")
        round_idx = self._check_round(round_idx, stream)
        first = self._chain_value(round_idx, stream, party_idx)
        return np.subtract(first, self._chain_value(round_idx, stream, party_idx + 1), out=np.empty_like(first))


# --------------------------------------------------------------------------------------------
# Seed distribution: X25519 + ChaCha20-Poly1305
# --------------------------------------------------------------------------------------------


def x25519_keypair(entropy: bytes) -> tuple[X25519PrivateKey, bytes]:
    """A deterministic X25519 key pair derived from caller-supplied entropy.

    The private scalar is HKDF-SHA256 of ``entropy`` (so biased or structured entropy, e.g. a
    seeded generator's bytes in tests, is still mixed), clamped by X25519 itself. Deterministic,
    so a protocol machine stays a pure function of its constructor arguments.

    Args:
        entropy: at least 32 bytes of secret entropy (e.g. ``os.urandom(32)`` in production).

    Returns:
        ``(private_key, public_key_bytes)``: the private key object and the 32-byte raw public
        key to publish.

    Raises:
        ValueError: fewer than 32 bytes of entropy.
        TypeError: ``entropy`` is not bytes.

    References:
        RFC 7748 (X25519); Bonawitz et al., CCS 2017, Sec. 4 (Diffie-Hellman key agreement for
        the masking seeds); FastLloyd Sec. 3 (the shared seed "can be set up via DH").
    """
    if not isinstance(entropy, bytes | bytearray | memoryview):
        raise TypeError(f"entropy must be bytes, got {type(entropy).__name__}")
    entropy = bytes(entropy)
    if len(entropy) < 32:
        raise ValueError(f"entropy must be at least 32 bytes, got {len(entropy)}")
    private_key = X25519PrivateKey.from_private_bytes(_hkdf(entropy, _X25519_INFO))
    return private_key, private_key.public_key().public_bytes_raw()


def _key_from_shared(shared: bytes, sender: bytes, receiver: bytes, context: bytes) -> bytes:
    if not isinstance(context, bytes):
        raise TypeError(f"context must be bytes, got {type(context).__name__}")
    # Both public keys, in sender -> receiver order, make the key direction-specific: A sealing
    # to B and B sealing to A under the same context use different keys.
    info = _SEAL_INFO + _length_prefixed(sender, receiver, context)
    return _hkdf(shared, info)


def x25519_shared(private_key: X25519PrivateKey, peer_public: bytes) -> bytes:
    """The X25519 shared secret of ``private_key`` and a peer's raw 32-byte public key.

    A party that seals to and opens from the same peer agrees once and passes the secret to
    `seal_with_shared` / `open_with_shared` (SecAgg+ clients do, per neighbour).

    Raises:
        ValueError: an invalid peer public key (wrong length or a low-order point).

    References:
        RFC 7748 (X25519).
    """
    try:
        return private_key.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
    except ValueError as exc:
        raise ValueError(f"invalid X25519 peer public key: {exc}") from exc


def _sealing_key(private_key: X25519PrivateKey, peer_public: bytes, sender: bytes, receiver: bytes, context: bytes) -> bytes:
    if not isinstance(context, bytes):
        raise TypeError(f"context must be bytes, got {type(context).__name__}")
    return _key_from_shared(x25519_shared(private_key, peer_public), sender, receiver, context)


def seal_with_shared(shared: bytes, sender_public: bytes, receiver_public: bytes, seed: bytes, context: bytes) -> bytes:
    """`seal_seed` from an X25519 shared secret already agreed (`x25519_shared`): the same key
    derivation and AEAD, so `open_seed` and `open_with_shared` open it.

    Args:
        shared: the 32-byte X25519 shared secret of sender and receiver.
        sender_public, receiver_public: both raw public keys (they bind the direction).
        seed: the secret to send (non-empty). context: as in `seal_seed`.

    Returns:
        ``ciphertext || tag``: ``len(seed) + 16`` bytes.

    Raises:
        ValueError: an empty seed. TypeError: wrong argument types.
    """
    if not isinstance(seed, bytes | bytearray | memoryview):
        raise TypeError(f"seed must be bytes, got {type(seed).__name__}")
    if len(seed) == 0:
        raise ValueError("seed must not be empty")
    key = _key_from_shared(bytes(shared), bytes(sender_public), bytes(receiver_public), context)
    return ChaCha20Poly1305(key).encrypt(_SEAL_NONCE, bytes(seed), context)


def open_with_shared(shared: bytes, sender_public: bytes, receiver_public: bytes, sealed: bytes, context: bytes) -> bytes:
    """`open_seed` from an X25519 shared secret already agreed (`x25519_shared`).

    Raises:
        ValueError: "sealed seed failed authentication" (tampering, a wrong key, sender or
            context, or too few bytes). TypeError: wrong argument types.
    """
    if not isinstance(sealed, bytes | bytearray | memoryview):
        raise TypeError(f"sealed must be bytes, got {type(sealed).__name__}")
    sealed = bytes(sealed)
    key = _key_from_shared(bytes(shared), bytes(sender_public), bytes(receiver_public), context)
    return _open_sealed(key, sealed, context)


def seal_seed(private_key: X25519PrivateKey, peer_public: bytes, seed: bytes, context: bytes) -> bytes:
    """Encrypt and authenticate a seed for one peer (ChaCha20-Poly1305 under an X25519 key).

    The key is HKDF-SHA256 of the X25519 shared secret with ``info`` binding the sender's and the
    receiver's public keys and ``context``; ``context`` is also the AEAD's associated data. The
    nonce is fixed, so each ``(sender, receiver, context)`` must seal only one seed: put the
    session id and the purpose in ``context``.

    Args:
        private_key: the sender's X25519 private key.
        peer_public: the receiver's raw 32-byte public key.
        seed: the secret to send (non-empty; a 32-byte mask seed gives a 48-byte result).
        context: public context bytes both sides agree on (session, purpose, round).

    Returns:
        ``ciphertext || tag``: ``len(seed) + 16`` bytes.

    Raises:
        ValueError: an invalid peer public key (wrong length or a low-order point) or an empty
            seed.
        TypeError: wrong argument types.

    References:
        RFC 7748 (X25519), RFC 5869 (HKDF), RFC 8439 (ChaCha20-Poly1305); Bonawitz et al., CCS
        2017, Sec. 4 (authenticated encryption of shares between clients).
    """
    return seal_seed_for_each(private_key, [peer_public], seed, [context])[0]


def seal_seed_for_each(
    private_key: X25519PrivateKey, peer_publics: Sequence[bytes], seed: bytes, contexts: Sequence[bytes]
) -> list[bytes]:
    """`seal_seed` of one seed for many receivers: ``[seal_seed(private_key, peer_publics[i],
    seed, contexts[i]) for i ...]``, the same bytes, with the sender's own public key and the
    argument checks done once (a sender that seals for 10^5 receivers spends its time in the
    X25519 agreements, about 43 us each, not in the glue around them).

    Args:
        private_key: the sender's X25519 private key.
        peer_publics: the receivers' raw 32-byte public keys.
        seed: the secret to send (non-empty).
        contexts: one context per receiver (bytes), as in `seal_seed`.

    Returns:
        One ``ciphertext || tag`` (``len(seed) + 16`` bytes) per receiver, in order.

    Raises:
        ValueError: an invalid peer public key (wrong length or a low-order point), an empty
            seed, or as many contexts as keys not given.
        TypeError: wrong argument types.

    References:
        RFC 7748 (X25519), RFC 5869 (HKDF), RFC 8439 (ChaCha20-Poly1305).
    """
    if not isinstance(seed, bytes | bytearray | memoryview):
        raise TypeError(f"seed must be bytes, got {type(seed).__name__}")
    seed = bytes(seed)
    if len(seed) == 0:
        raise ValueError("seed must not be empty")
    if len(peer_publics) != len(contexts):
        raise ValueError(f"{len(peer_publics)} public keys but {len(contexts)} contexts")
    own_public = private_key.public_key().public_bytes_raw()
    sealed = []
    for peer_public, context in zip(peer_publics, contexts, strict=True):
        if not isinstance(context, bytes):  # before the agreement, as _key_from_shared checks it
            raise TypeError(f"context must be bytes, got {type(context).__name__}")
        key = _key_from_shared(x25519_shared(private_key, peer_public), own_public, bytes(peer_public), context)
        sealed.append(ChaCha20Poly1305(key).encrypt(_SEAL_NONCE, seed, context))
    return sealed


def open_seed(private_key: X25519PrivateKey, peer_public: bytes, sealed: bytes, context: bytes) -> bytes:
    """Decrypt and verify a seed sealed by `seal_seed`.

    Args:
        private_key: the receiver's X25519 private key.
        peer_public: the sender's raw 32-byte public key.
        sealed: the bytes `seal_seed` returned.
        context: the same context bytes the sender used.

    Returns:
        The seed.

    Raises:
        ValueError: "sealed seed failed authentication" when the key, the sender, the context or
            the data do not match (tampering, a wrong key) or ``sealed`` is too short to hold a
            tag and a seed; "invalid X25519 peer public key" for a malformed public key.
        TypeError: wrong argument types.

    References:
        RFC 8439 (ChaCha20-Poly1305).
    """
    if not isinstance(sealed, bytes | bytearray | memoryview):
        raise TypeError(f"sealed must be bytes, got {type(sealed).__name__}")
    sealed = bytes(sealed)
    own_public = private_key.public_key().public_bytes_raw()
    key = _sealing_key(private_key, peer_public, bytes(peer_public), own_public, context)
    return _open_sealed(key, sealed, context)


def _open_sealed(key: bytes, sealed: bytes, context: bytes) -> bytes:
    """The seed in ``sealed`` (``ciphertext || tag``) under the 32-byte ChaCha20-Poly1305 ``key``
    and associated data ``context``, for `open_seed` and `open_with_shared` once they hold the key.

    Raises:
        ValueError: "sealed seed failed authentication": ``sealed`` no longer than the tag, or the
            tag does not verify (a wrong key, sender or context, or tampered data).
    """
    if len(sealed) <= _SEAL_TAG_BYTES:
        raise ValueError(
            f"sealed seed failed authentication: {len(sealed)} bytes is too short "
            f"(need more than the {_SEAL_TAG_BYTES}-byte tag)"
        )
    try:
        return ChaCha20Poly1305(key).decrypt(_SEAL_NONCE, sealed, context)
    except InvalidTag:
        raise ValueError(
            "sealed seed failed authentication (wrong key, wrong sender, wrong context or tampered data)"
        ) from None


"""Tests for fedproto.algorithms.secagg: fixed point in Z_2^w, masks, noise quantisation, seed sealing."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.stats
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fedproto.algorithms import secagg
from fedproto.algorithms.secagg import MaskGenerator, decode_fixed, encode_fixed, quantize_noise

RINGS = [32, 64]
Q = 16


def ref_round_to_ring(value: float, frac_bits: int, ring_bits: int) -> int:
    """floor(v * 2^q + 1/2) mod 2^w with exact rational arithmetic."""
    return math.floor(Fraction(value) * 2**frac_bits + Fraction(1, 2)) % 2**ring_bits


def grid_values(rng, shape, magnitude, frac_bits=Q):
    """Random values on the 2^-q grid with |v| <= magnitude."""
    ints = rng.integers(-magnitude * 2**frac_bits, magnitude * 2**frac_bits, size=shape, endpoint=True)
    return ints.astype(np.float64) / 2**frac_bits


def seeds(n, tag=0):
    rng = np.random.default_rng(1000 + tag)
    return [rng.bytes(32) for _ in range(n)]


# ------------------------------------------------------------------ ring parameters


def test_headroom_and_ring_dtype():
    assert secagg.headroom() == 32768.0
    assert secagg.headroom(16, 64) == 2.0**47
    assert secagg.headroom(0, 32) == 2.0**31
    assert secagg.ring_dtype(32) == np.uint32
    assert secagg.ring_dtype(64) == np.uint64
    for bad in (16, 31, 128):
        with pytest.raises(ValueError, match="32 or 64"):
            secagg.ring_dtype(bad)
    with pytest.raises(ValueError, match="frac_bits"):
        secagg.headroom(32, 32)
    with pytest.raises(ValueError, match="frac_bits"):
        encode_fixed([1.0], frac_bits=-1)


# ------------------------------------------------------------------ encoding (oracles 4 and 6)


@pytest.mark.parametrize("ring_bits", RINGS)
def test_negative_values_round_trip(ring_bits):
    """Oracle 4: enc(-0.5) decodes to -0.5; negatives live in the upper half of the ring."""
    enc = encode_fixed(-0.5, ring_bits=ring_bits)
    assert enc.dtype == secagg.ring_dtype(ring_bits) and enc.shape == ()
    assert int(enc) == 2**ring_bits - 2**15
    assert decode_fixed(enc, ring_bits=ring_bits) == -0.5
    assert decode_fixed(encode_fixed([-1.0, 0.0, 1.0], ring_bits=ring_bits), ring_bits=ring_bits).tolist() == [-1.0, 0.0, 1.0]


@settings(max_examples=300, deadline=None)
@given(value=st.floats(min_value=-32767.99, max_value=32767.99, allow_nan=False), ring_bits=st.sampled_from(RINGS))
@example(value=0.49999999999999994 / 2**16, ring_bits=32)  # floor(s + 0.5) in float64 gets this wrong
@example(value=-0.5 / 2**16, ring_bits=32)  # an exact tie rounds up (toward +inf)
@example(value=1.5 / 2**16, ring_bits=64)
def test_encode_matches_exact_rounding_and_round_trips(value, ring_bits):
    """encode == floor(v 2^q + 1/2) mod 2^w exactly; decode(encode(v)) within 2^-(q+1) (oracle 4)."""
    enc = encode_fixed(value, ring_bits=ring_bits)
    assert int(enc) == ref_round_to_ring(value, Q, ring_bits)
    assert abs(float(decode_fixed(enc, ring_bits=ring_bits)) - value) <= 2.0 ** -(Q + 1)


@settings(max_examples=100, deadline=None)
@given(value=st.floats(min_value=-(2.0**47) + 1, max_value=2.0**47 - 1, allow_nan=False))
def test_encode_ring64_large_magnitudes(value):
    assert int(encode_fixed(value, ring_bits=64)) == ref_round_to_ring(value, Q, 64)


def test_grid_values_round_trip_exactly():
    rng = np.random.default_rng(0)
    for ring_bits, mag in ((32, 30000), (64, 2**40)):
        v = grid_values(rng, (50, 3), mag)
        enc = encode_fixed(v, ring_bits=ring_bits)
        assert enc.shape == v.shape
        np.testing.assert_array_equal(decode_fixed(enc, ring_bits=ring_bits), v)


def test_decode_accepts_non_contiguous_views():
    rng = np.random.default_rng(3)
    v = grid_values(rng, (4, 3), 100)
    enc = encode_fixed(v)
    np.testing.assert_array_equal(decode_fixed(enc[:, :2]), v[:, :2])
    np.testing.assert_array_equal(decode_fixed(enc[:, 2]), v[:, 2])
    np.testing.assert_array_equal(decode_fixed(enc.T), v.T)


def test_decode_two_complement_and_dtypes():
    assert decode_fixed(np.array([2**31], dtype=np.uint32)).tolist() == [-32768.0]
    assert decode_fixed(np.array([2**31 - 1], dtype=np.uint32)).tolist() == [32768.0 - 2.0**-16]
    assert decode_fixed(np.array([2**63], dtype=np.uint64), ring_bits=64).tolist() == [-(2.0**47)]
    # other integer dtypes are accepted when their values are ring elements
    assert decode_fixed(np.array([65536], dtype=np.int64)).tolist() == [1.0]
    with pytest.raises(ValueError, match="lie in"):
        decode_fixed(np.array([2**32], dtype=np.uint64))
    with pytest.raises(TypeError, match="integer"):
        decode_fixed(np.array([1.0]))


@pytest.mark.parametrize("ring_bits", RINGS)
def test_overflow_guard(ring_bits):
    """Oracle 6: the guard fires for |value| >= 2^(w-1-q) and names the largest |value|."""
    h = secagg.headroom(Q, ring_bits)
    for bad in ([h], [-h], [1.0, -2 * h, 3.0]):
        with pytest.raises(ValueError, match="overflow") as info:
            encode_fixed(bad, ring_bits=ring_bits)
        assert repr(float(np.max(np.abs(bad)))) in str(info.value)
    # just inside the headroom encodes, on both sides (2^-16 is below float64's spacing at 2^47)
    inside = h - max(2.0**-Q, float(np.spacing(h)))
    enc = encode_fixed([-inside, inside], ring_bits=ring_bits)
    assert decode_fixed(enc, ring_bits=ring_bits).tolist() == [-inside, inside]
    # the most negative ring value decodes to -headroom
    assert decode_fixed(np.array([2 ** (ring_bits - 1)], dtype=secagg.ring_dtype(ring_bits)), ring_bits=ring_bits).tolist() == [-h]


def test_overflow_guard_catches_values_rounding_onto_the_edge():
    # 2^15 - 2^-18 < headroom, but rounds to 2^31 / 2^16, which would wrap to -32768.
    with pytest.raises(ValueError, match="rounds to"):
        encode_fixed([2.0**15 - 2.0**-18])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_rejected(bad):
    with pytest.raises(ValueError, match="non-finite"):
        encode_fixed([0.0, bad])
    with pytest.raises(ValueError, match="non-finite"):
        quantize_noise([bad])


def test_empty_input():
    assert encode_fixed(np.zeros((0, 3))).shape == (0, 3)
    assert quantize_noise([]).shape == (0,)


# ------------------------------------------------------------------ noise quantisation, A.3 (oracle 5)


@settings(max_examples=200, deadline=None)
@given(g=st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300), ring_bits=st.sampled_from(RINGS))
def test_quantize_noise_exact_without_headroom_guard(g, ring_bits):
    assert int(quantize_noise(g, ring_bits=ring_bits)) == ref_round_to_ring(g, Q, ring_bits)


def test_quantize_noise_rejects_overflow_to_infinity():
    with pytest.raises(ValueError, match="non-finite"):
        quantize_noise([1.7e308])


def _round_pairs(n=20_000):
    rng = np.random.default_rng(5)
    big = rng.integers(-(2**29), 2**29, size=n).astype(np.float64)
    # z on a 2^-20 grid, including exact ties (x.5) so that the rounding rule matters
    z = rng.integers(-(2**24), 2**24, size=n).astype(np.float64) / 2**20
    z[:200] = rng.integers(-8, 8, size=200) + 0.5
    return big, z  # big + z is exact in float64 (at most 50 significant bits)


@pytest.mark.parametrize("ring_bits", RINGS)
def test_round_half_up_is_shift_equivariant(ring_bits):
    """Oracle 5 / App. A.3: round(V + z) == V + round(z) for integer V, so enc(v) + noise~ == enc~(v + noise)."""
    big, z = _round_pairs()
    lhs = quantize_noise(big + z, frac_bits=0, ring_bits=ring_bits)
    rhs = encode_fixed(big, frac_bits=0, ring_bits=ring_bits) + quantize_noise(z, frac_bits=0, ring_bits=ring_bits)
    np.testing.assert_array_equal(lhs, rhs)
    # The same statement at q = 16: v on the 2^-16 grid, noise on a finer grid.
    rng = np.random.default_rng(6)
    v = grid_values(rng, 5000, 1000)
    gamma = rng.integers(-(2**30), 2**30, size=5000) / 2.0**24
    np.testing.assert_array_equal(
        quantize_noise(v + gamma, ring_bits=ring_bits),
        encode_fixed(v, ring_bits=ring_bits) + quantize_noise(gamma, ring_bits=ring_bits),
    )


def test_truncation_toward_zero_is_not_shift_equivariant():
    """Oracle 5, second half: the authors' truncation breaks the A.3 argument for some pairs."""
    big, z = _round_pairs()
    mismatches = np.trunc(big + z) != big + np.trunc(z)
    assert mismatches.any()
    assert np.trunc(1.0 + -0.5) != 1.0 + np.trunc(-0.5)  # the simplest counterexample


# ------------------------------------------------------------------ masks


def test_mask_generator_validation():
    with pytest.raises(ValueError, match="32 bytes"):
        MaskGenerator(bytes(31), 2, (3,))
    with pytest.raises(ValueError, match="32 bytes"):
        MaskGenerator(bytes(33), 2, (3,))
    with pytest.raises(TypeError):
        MaskGenerator("x" * 32, 2, (3,))
    with pytest.raises(ValueError, match="n_parties"):
        MaskGenerator(bytes(32), 0, (3,))
    with pytest.raises(ValueError, match="32 or 64"):
        MaskGenerator(bytes(32), 2, (3,), ring_bits=16)
    gen = MaskGenerator(bytes(32), 2, (3,))
    with pytest.raises(ValueError, match="party_idx"):
        gen.party_mask(2, 0)
    with pytest.raises(ValueError, match="party_idx"):
        gen.party_mask(-1, 0)
    with pytest.raises(ValueError, match="round_idx"):
        gen.total_mask(-1)
    assert "seed" not in repr(gen) and bytes(32).hex() not in repr(gen)


@pytest.mark.parametrize("ring_bits", RINGS)
@pytest.mark.parametrize("n_parties", [1, 2, 3, 8])
def test_party_masks_sum_to_total(ring_bits, n_parties):
    gen = MaskGenerator(seeds(1)[0], n_parties, (4, 3), ring_bits=ring_bits)
    for round_idx, stream in ((0, "R"), (5, "C")):
        masks = [gen.party_mask(i, round_idx, stream) for i in range(n_parties)]
        total = gen.total_mask(round_idx, stream)
        assert total.dtype == secagg.ring_dtype(ring_bits) and total.shape == (4, 3)
        assert all(m.dtype == total.dtype and m.shape == (4, 3) for m in masks)
        np.testing.assert_array_equal(np.add.reduce(np.stack(masks), axis=0, dtype=total.dtype), total)


def test_masks_are_identical_across_instances_and_fresh_per_use():
    """Oracle 2: same (seed, t, stream) -> same masks everywhere; any change -> different masks."""
    seed, other_seed = seeds(2)
    a = MaskGenerator(seed, 3, (16,))
    b = MaskGenerator(seed, 3, (16,))
    for i in range(3):
        np.testing.assert_array_equal(a.party_mask(i, 4, "R"), b.party_mask(i, 4, "R"))
    np.testing.assert_array_equal(a.total_mask(4, "R"), b.total_mask(4, "R"))
    reference = a.party_mask(0, 4, "R")
    variants = [
        a.party_mask(1, 4, "R"),
        a.party_mask(2, 4, "R"),
        a.party_mask(0, 5, "R"),
        a.party_mask(0, 4, "C"),
        a.party_mask(0, 4, ""),
        a.total_mask(4, "R"),
        MaskGenerator(other_seed, 3, (16,)).party_mask(0, 4, "R"),
        MaskGenerator(seed, 3, (16,), label=b"other").party_mask(0, 4, "R"),
        MaskGenerator(seed, 4, (16,)).party_mask(0, 4, "R"),
        MaskGenerator(seed, 3, (16,), ring_bits=64).party_mask(0, 4, "R").view(np.uint32)[:16],
        MaskGenerator(seed, 3, (17,)).party_mask(0, 4, "R")[:16],  # no keystream prefix sharing
    ]
    for v in variants:
        assert not np.array_equal(reference, v)
        # fresh masks agree in about 16 / 2^32 coordinates; require almost all to differ
        assert np.sum(reference == v) <= 1
    # label and stream are encoded unambiguously (no plain concatenation): (b"L", "ab") != (b"La", "b")
    shifted = MaskGenerator(seed, 3, (16,), label=b"fedproto-maska")
    assert not np.array_equal(a.total_mask(1, "ab"), shifted.total_mask(1, "b"))
    assert not np.array_equal(a.party_mask(0, 1, "ab"), shifted.party_mask(0, 1, "b"))


def test_mask_shapes():
    scalar = MaskGenerator(bytes(32), 2, ())
    m = scalar.party_mask(1, 0)
    assert isinstance(m, np.ndarray) and m.shape == () and m.dtype == np.uint32
    assert int(scalar.party_mask(0, 0) + m) % 2**32 == int(scalar.total_mask(0))
    assert MaskGenerator(bytes(32), 2, (0, 5)).party_mask(1, 0).shape == (0, 5)
    assert MaskGenerator(bytes(32), 2, 7).shape == (7,)


@pytest.mark.parametrize("ring_bits", RINGS)
@pytest.mark.parametrize("n_parties", [1, 2, 3, 8])
@pytest.mark.parametrize("with_noise", [False, True])
def test_unmask_identity(ring_bits, n_parties, with_noise):
    """Oracle 1: decode(sum_i (enc(v_i) + r_i) + noise~ - r) == sum_i v_i + noise~, bitwise."""
    rng = np.random.default_rng(n_parties + ring_bits)
    shape = (5, 3)
    dtype = secagg.ring_dtype(ring_bits)
    values = [grid_values(rng, shape, 1000) for _ in range(n_parties)]
    for seed in seeds(3, tag=n_parties):
        gen = MaskGenerator(seed, n_parties, shape, ring_bits=ring_bits)
        messages = [encode_fixed(v, ring_bits=ring_bits) + gen.party_mask(i, 2, "R") for i, v in enumerate(values)]
        aggregate = np.add.reduce(np.stack(messages), axis=0, dtype=dtype)
        noise = rng.normal(0.0, 50.0, size=shape) if with_noise else np.zeros(shape)
        noise_q = quantize_noise(noise, ring_bits=ring_bits)
        broadcast = aggregate + noise_q
        # each client holds its own MaskGenerator instance built from the same seed
        client = MaskGenerator(seed, n_parties, shape, ring_bits=ring_bits)
        unmasked = broadcast - client.total_mask(2, "R")
        assert unmasked.dtype == dtype
        exact = np.add.reduce(np.stack([encode_fixed(v, ring_bits=ring_bits) for v in values]), axis=0, dtype=dtype) + noise_q
        np.testing.assert_array_equal(unmasked, exact)
        plain_sum = np.sum(values, axis=0)  # exact: grid values, small magnitudes
        expected = plain_sum + decode_fixed(noise_q, ring_bits=ring_bits)
        np.testing.assert_array_equal(decode_fixed(unmasked, ring_bits=ring_bits), expected)
        if not with_noise:
            np.testing.assert_array_equal(unmasked, encode_fixed(plain_sum, ring_bits=ring_bits))
        else:
            assert np.all(np.abs(decode_fixed(noise_q, ring_bits=ring_bits) - noise) <= 2.0 ** -(Q + 1))


def _chi2_threshold(bins, p=1e-6):
    # The samples are fixed (seeded), so the test is deterministic; p only sets how large a
    # deviation from uniformity would have to be to fail it.
    return scipy.stats.chi2.ppf(1 - p, df=bins - 1)


def _uniformity_stat(words, ring_bits, bits=4):
    """Chi-square statistics for the top and the bottom `bits` bits of ring elements."""
    words = np.asarray(words, dtype=np.uint64)
    bins = 2**bits
    out = []
    for part in (words >> np.uint64(ring_bits - bits), words & np.uint64(bins - 1)):
        counts = np.bincount(part.astype(np.int64).ravel(), minlength=bins)
        expected = counts.sum() / bins
        out.append(float(np.sum((counts - expected) ** 2) / expected))
    return out


@pytest.mark.parametrize("ring_bits", RINGS)
def test_server_view_is_uniform(ring_bits):
    """Oracle 3: for fixed inputs and random seeds each masked coordinate, and the masked
    aggregate, is uniform on Z_2^w (chi-square on top and bottom 4 bits)."""
    n_seeds, n_parties, shape = 800, 3, (4,)
    fixed_inputs = [encode_fixed(np.array([0.0, 1.0, -1.0, 1234.5]), ring_bits=ring_bits)] * n_parties
    dtype = secagg.ring_dtype(ring_bits)
    first, last, aggregates = [], [], []
    for seed in seeds(n_seeds, tag=ring_bits):
        gen = MaskGenerator(seed, n_parties, shape, ring_bits=ring_bits)
        msgs = [fixed_inputs[i] + gen.party_mask(i, 0, "R") for i in range(n_parties)]
        first.append(msgs[0])
        last.append(msgs[-1])  # the derived mask r_{M-1} = r - sum r_i must be uniform too
        aggregates.append(np.add.reduce(np.stack(msgs), axis=0, dtype=dtype))
    threshold = _chi2_threshold(16)
    for samples in (first, last, aggregates):
        samples = np.stack(samples)
        for coord in range(shape[0]):
            for stat in _uniformity_stat(samples[:, coord], ring_bits):
                assert stat < threshold
    # Sanity check that the statistic has power: unmasked inputs are far from uniform.
    assert max(_uniformity_stat(np.repeat(fixed_inputs[0][None], n_seeds, 0)[:, 3], ring_bits)) > threshold


def test_single_generator_stream_is_uniform():
    """One long mask (a fixed seed): the ChaCha20 words are uniform over 256 bins."""
    words = MaskGenerator(seeds(1, tag=7)[0], 2, (100_000,)).party_mask(1, 0)
    for part in (words >> np.uint32(24), words & np.uint32(255)):
        counts = np.bincount(part.astype(np.int64), minlength=256)
        stat = np.sum((counts - counts.sum() / 256) ** 2) / (counts.sum() / 256)
        assert stat < _chi2_threshold(256)


# ------------------------------------------------------------------ seed sealing


def _parties():
    a, a_pub = secagg.x25519_keypair(b"alice" * 8)
    b, b_pub = secagg.x25519_keypair(b"bob" * 11)
    return a, a_pub, b, b_pub


def test_derive_bytes():
    secret = bytes(range(32))
    out = secagg.derive_bytes(secret, b"purpose-a")
    assert len(out) == 32 and out == secagg.derive_bytes(secret, b"purpose-a")
    assert out != secagg.derive_bytes(secret, b"purpose-b")
    assert out != secagg.derive_bytes(bytes(range(1, 33)), b"purpose-a")
    assert len(secagg.derive_bytes(secret, b"x", 100)) == 100
    with pytest.raises(ValueError, match="length"):
        secagg.derive_bytes(secret, b"x", 0)
    with pytest.raises(ValueError, match="32 bytes"):
        secagg.derive_bytes(bytes(31), b"x")
    with pytest.raises(TypeError):
        secagg.derive_bytes("s" * 32, b"x")


def test_keypair_is_deterministic():
    a1, pub1 = secagg.x25519_keypair(bytes(range(32)))
    _, pub2 = secagg.x25519_keypair(bytes(range(32)))
    _, pub3 = secagg.x25519_keypair(bytes(range(1, 33)))
    assert pub1 == pub2 and pub1 != pub3 and len(pub1) == 32
    assert a1.public_key().public_bytes_raw() == pub1
    with pytest.raises(ValueError, match="32 bytes"):
        secagg.x25519_keypair(bytes(31))


def test_seal_open_round_trip():
    a, a_pub, b, b_pub = _parties()
    seed = seeds(1, tag=9)[0]
    sealed = secagg.seal_seed(a, b_pub, seed, b"session-1/mask-seed")
    assert len(sealed) == 48
    assert secagg.open_seed(b, a_pub, sealed, b"session-1/mask-seed") == seed
    # deterministic (no hidden randomness), and bound to the context
    assert secagg.seal_seed(a, b_pub, seed, b"session-1/mask-seed") == sealed
    assert secagg.seal_seed(a, b_pub, seed, b"session-2/mask-seed") != sealed
    # direction-specific keys: B sealing the same seed to A gives a different ciphertext
    assert secagg.seal_seed(b, a_pub, seed, b"session-1/mask-seed") != sealed
    # MaskGenerator accepts the opened seed
    MaskGenerator(secagg.open_seed(b, a_pub, sealed, b"session-1/mask-seed"), 2, (3,))


def test_sealing_for_each_receiver_gives_the_bytes_of_one_seal_per_receiver():
    a, a_pub, _, _ = _parties()
    seed = seeds(1, tag=11)[0]
    receivers = [secagg.x25519_keypair(bytes([i]) * 32) for i in range(1, 5)]
    publics = [pub for _, pub in receivers]
    contexts = [b"session-1/" + bytes([i]) for i in range(4)]
    sealed = secagg.seal_seed_for_each(a, publics, seed, contexts)
    assert sealed == [secagg.seal_seed(a, pub, seed, ctx) for pub, ctx in zip(publics, contexts)]
    assert [secagg.open_seed(key, a_pub, s, ctx) for (key, _), s, ctx in zip(receivers, sealed, contexts)] == [seed] * 4
    assert secagg.seal_seed_for_each(a, [], seed, []) == []
    with pytest.raises(ValueError, match="public key"):
        secagg.seal_seed_for_each(a, [publics[0], bytes(32)], seed, contexts[:2])  # a low-order point
    with pytest.raises(ValueError, match="2 public keys but 1 contexts"):
        secagg.seal_seed_for_each(a, publics[:2], seed, contexts[:1])
    with pytest.raises(ValueError, match="empty"):
        secagg.seal_seed_for_each(a, publics, b"", contexts)
    with pytest.raises(TypeError, match="context"):
        secagg.seal_seed_for_each(a, publics[:1], seed, ["text"])


def test_open_rejects_tampering_wrong_keys_and_bad_lengths():
    a, a_pub, b, b_pub = _parties()
    c, c_pub = secagg.x25519_keypair(b"carol" * 8)
    seed = seeds(1, tag=10)[0]
    ctx = b"ctx"
    sealed = secagg.seal_seed(a, b_pub, seed, ctx)
    bad_inputs = []
    for pos in range(len(sealed)):
        for bit in (0x01, 0x80):
            tampered = bytearray(sealed)
            tampered[pos] ^= bit
            bad_inputs.append((b, a_pub, bytes(tampered), ctx))
    bad_inputs += [
        (b, a_pub, sealed, b"ctx2"),  # wrong context
        (c, a_pub, sealed, ctx),  # wrong receiver
        (b, c_pub, sealed, ctx),  # wrong claimed sender
        (a, b_pub, sealed, ctx),  # the sender cannot open its own message as if it came from B
        (b, a_pub, sealed[:-1], ctx),  # truncated
        (b, a_pub, sealed + b"\x00", ctx),  # extended
        (b, a_pub, sealed[:16], ctx),  # tag only
        (b, a_pub, b"", ctx),
    ]
    for args in bad_inputs:
        with pytest.raises(ValueError, match="failed authentication"):
            secagg.open_seed(*args)
    with pytest.raises(ValueError, match="public key"):
        secagg.open_seed(b, a_pub[:31], sealed, ctx)
    with pytest.raises(ValueError, match="public key"):
        secagg.seal_seed(a, bytes(32), seed, ctx)  # the all-zero (low-order) point


def test_mask_expansion_is_hkdf_then_chacha20_with_the_extract_step_computed_once():
    """The generator keeps HKDF-Extract(seed) and expands each chain value g_j per RFC 5869 HKDF;
    r_i = g_i - g_{i+1} and r = g_0 - g_M, computed here from bare HKDF and ChaCha20 calls."""
    import struct

    seed = bytes(range(32))
    generator = secagg.MaskGenerator(seed, 5, (3, 4), ring_bits=64)

    def g(round_idx: int, j: int) -> np.ndarray:
        info = secagg._length_prefixed(b"fedproto-mask", b"", b"chain") + struct.pack(
            ">BQQQ2QQ", 64, 5, round_idx, j, 3, 4, 2
        )
        raw = secagg._chacha20_stream(secagg._hkdf(seed, info), 12 * 8)
        return np.frombuffer(raw, "<u8").reshape(3, 4)

    for party, round_idx in ((2, 7), (0, 0), (4, 1), (3, 1)):
        expected = g(round_idx, party) - g(round_idx, party + 1)
        np.testing.assert_array_equal(generator.party_mask(party, round_idx), expected)
    np.testing.assert_array_equal(generator.total_mask(7), g(7, 0) - g(7, 5))


@pytest.mark.parametrize("n_parties", [2, 1000, 10**9])
def test_no_mask_costs_more_expansions_with_more_clients(monkeypatch, n_parties):
    """Every party's mask, the last's included, and the total cost at most two PRG expansions on
    a fresh generator, however many clients there are; clients taking turns in index order on one
    generator (a process hosting many) pay one each; the masks still sum to the total."""
    expansions = []
    real = MaskGenerator._expand
    monkeypatch.setattr(MaskGenerator, "_expand", lambda self, *args: expansions.append(args) or real(self, *args))
    seed = bytes(range(1, 33))
    for party in (0, n_parties - 1, n_parties // 2):
        expansions.clear()
        MaskGenerator(seed, n_parties, (2, 3)).party_mask(party, 4)
        assert len(expansions) == 2
    expansions.clear()
    total = MaskGenerator(seed, n_parties, (2, 3)).total_mask(4)
    assert len(expansions) == 2
    shared = MaskGenerator(seed, n_parties, (2, 3))
    first = max(0, n_parties - 6)
    expansions.clear()
    masks = [shared.party_mask(i, 4) for i in range(first, n_parties)]
    assert len(expansions) == len(masks) + 1
    if n_parties == 2:
        np.testing.assert_array_equal(masks[0] + masks[1], total)
    # any run of consecutive masks telescopes: r_a + ... + r_{M-1} = g_a - g_M = total - (g_0 - g_a)
    head = total - np.add.reduce(np.stack(masks), axis=0, dtype=np.uint32)
    np.testing.assert_array_equal(head, shared._chain_value(4, "", 0) - shared._chain_value(4, "", first))

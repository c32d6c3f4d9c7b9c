"""Tests for fedproto.algorithms.scma: field choice, encoding, masks, Berlekamp-Massey, roots, decoding.

Oracles 1-9 of spec mufc.md section 6. Reference implementations written here (naive power sums,
a textbook Berlekamp-Massey, brute-force roots and primes) are independent of the module's FLINT
code paths.
"""

from __future__ import annotations

import math
import random

import flint
import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from fedproto.algorithms import _scma_decoding, _scma_encoding, _scma_field, scma
from fedproto.algorithms.scma import SyndromeDecodingError
from fedproto.algorithms.secagg import x25519_keypair
from fedproto.errors import RemoteProtocolError

# ------------------------------------------------------------------ independent references


def ref_syndromes(counts, p, n_syndromes):
    """S_i = sum_j q_j j^(i-1) mod p, straight from the definition."""
    return [sum(q * pow(j, i, p) for j, q in counts.items()) % p for i in range(n_syndromes)]


def ref_berlekamp_massey(seq, p):
    """Textbook Berlekamp-Massey over F_p: ``(C, L)`` with C padded/truncated to L + 1 coefficients."""
    c, b = [1], [1]
    length, shift, last = 0, 1, 1
    for n, s in enumerate(seq):
        d = s
        for i in range(1, length + 1):
            if i < len(c):
                d += c[i] * seq[n - i]
        d %= p
        if d == 0:
            shift += 1
            continue
        coef = d * pow(last, -1, p) % p
        old = list(c)
        c = c + [0] * max(0, len(b) + shift - len(c))
        for i, bi in enumerate(b):
            c[i + shift] = (c[i + shift] - coef * bi) % p
        if 2 * length <= n:
            length, b, last, shift = n + 1 - length, old, d, 1
        else:
            shift += 1
    assert all(v == 0 for v in c[length + 1 :])
    return (c + [0] * (length + 1))[: length + 1], length


def generates(conn, seq, p):
    """Whether s_n = -sum_{k>=1} C_k s_{n-k} holds for all n >= L = len(conn) - 1."""
    taps = len(conn) - 1
    return all(sum(conn[k] * seq[n - k] for k in range(taps + 1)) % p == 0 for n in range(taps, len(seq)))


def poly_eval(coeffs, x, p):
    acc = 0
    for c in reversed(coeffs):
        acc = (acc * x + c) % p
    return acc


def is_prime_trial(n):
    if n < 2:
        return False
    return all(n % d for d in range(2, math.isqrt(n) + 1))


def add_counts(vectors):
    total = {}
    for vec in vectors:
        for j, q in vec.items():
            total[j] = total.get(j, 0) + q
    return {j: q for j, q in sorted(total.items()) if q}


def keys(n_parties, tag=0):
    return [x25519_keypair(bytes([tag, i]) * 16) for i in range(n_parties)]


def pair_seeds(keypairs, party, active, context=b"run-1"):
    private, public = keypairs[party]
    return {m: scma.pairwise_seed(private, public, keypairs[m][1], context) for m in active if m != party}


def run_scma(vectors, p, n_syndromes, *, masks):
    """Encode, mask, aggregate: the server's sums."""
    messages = [
        scma.mask_syndromes(scma.rs_syndromes(q, p, n_syndromes), z, p) for q, z in zip(vectors, masks, strict=True)
    ]
    return messages, scma.aggregate_syndromes(messages, p, n_syndromes)


def pairwise_for_all(n_parties, p, n_syndromes, round_idx, tag=0):
    kp = keys(n_parties, tag)
    active = range(n_parties)
    return [scma.pairwise_masks(l, pair_seeds(kp, l, active), p, n_syndromes, round_idx) for l in active]


# ------------------------------------------------------------------ oracle 1: worked example


def test_worked_example_of_spec_2_6_reproduces_every_number():
    p, n_syndromes = scma.field_prime(12, 4), 8
    assert p == 13
    q1, q2 = {1: 5, 3: 2}, {3: 3, 4: 2}
    s1, s2 = scma.rs_syndromes(q1, p, n_syndromes), scma.rs_syndromes(q2, p, n_syndromes)
    assert s1 == [7, 11, 10, 7, 11, 10, 7, 11]
    assert s2 == [5, 4, 7, 1, 1, 8, 5, 4]
    z1 = [3, 7, 1, 12, 5, 9, 0, 4]
    z2 = [10, 6, 12, 1, 8, 4, 0, 9]
    assert [(a + b) % p for a, b in zip(z1, z2)] == [0] * 8
    m1, m2 = scma.mask_syndromes(s1, z1, p), scma.mask_syndromes(s2, z2, p)
    assert m1 == [10, 5, 11, 6, 3, 6, 7, 2]
    assert m2 == [2, 10, 6, 2, 9, 12, 5, 0]
    sums = scma.aggregate_syndromes([m1, m2], p, n_syndromes)
    assert sums == [12, 2, 4, 8, 12, 5, 12, 2]
    g = scma.error_locator(sums, p)
    assert g == [1, 5, 6, 1]  # 1 + 5x + 6x^2 + x^3 = (1 - x)(1 - 3x)(1 - 4x) mod 13
    roots = scma.field_roots(g, p)
    assert roots == [1, 9, 10]
    assert sorted(pow(r, -1, p) for r in roots) == [1, 3, 4]
    assert scma.decode_syndromes(sums, p, max_support=4, max_index=4, max_total=12) == {1: 5, 3: 5, 4: 2}
    assert list(scma.decode_syndromes(sums, p, max_support=4, max_index=4)) == [1, 3, 4]  # keys ascending


# ------------------------------------------------------------------ encoding against the definition


def test_rs_syndromes_match_the_definition_including_huge_indices_and_counts():
    rng = random.Random(7)
    for bits in (5, 20, 70, 200):
        p = scma.field_prime(0, 1 << bits)
        for _ in range(15):
            k = rng.randrange(0, 12)
            counts = {rng.randrange(1, p): rng.randrange(0, p) for _ in range(k)}
            n_syndromes = rng.randrange(1, 40)
            assert scma.rs_syndromes(counts, p, n_syndromes) == ref_syndromes(counts, p, n_syndromes)
    assert scma.rs_syndromes({}, 13, 5) == [0] * 5
    assert scma.rs_syndromes({5: 0}, 13, 3) == [0, 0, 0]  # zero counts are ignored
    assert scma.rs_syndromes({np.int64(3): np.int64(2)}, 13, 2) == [2, 6]  # NumPy ints are ints


@pytest.mark.parametrize(
    ("counts", "match"),
    [({0: 1}, "bin index 0"), ({13: 1}, "bin index 13"), ({-1: 1}, "bin index -1"),
     ({2: -1}, "count -1"), ({2: 13}, "count 13")],
)
def test_rs_syndromes_rejects_bad_counts(counts, match):
    with pytest.raises(ValueError, match=match):
        scma.rs_syndromes(counts, 13, 4)


def test_bad_types_and_sizes_are_rejected():
    with pytest.raises(TypeError):
        scma.rs_syndromes([(1, 2)], 13, 4)
    with pytest.raises(TypeError):
        scma.rs_syndromes({1.0: 2}, 13, 4)
    with pytest.raises(TypeError):
        scma.rs_syndromes({True: 2}, 13, 4)
    with pytest.raises(ValueError, match="n_syndromes"):
        scma.rs_syndromes({1: 1}, 13, 0)
    with pytest.raises(ValueError, match="not prime"):
        scma.rs_syndromes({1: 1}, 15, 4)
    with pytest.raises(ValueError, match="p must be"):
        scma.field_width(1)
    with pytest.raises(TypeError):
        scma.mask_syndromes([1, 2.0], [0, 0], 13)
    with pytest.raises(TypeError):
        scma.decode_syndromes(b"\x01\x02", 13, max_support=1, max_index=4)


# ------------------------------------------------------------------ masking and aggregation checks


def test_mask_and_aggregate_check_lengths_and_ranges():
    p = 13
    assert scma.mask_syndromes([12, 0], [1, 5], p) == [0, 5]
    with pytest.raises(ValueError, match="mask must have 2"):
        scma.mask_syndromes([1, 2], [1], p)
    with pytest.raises(ValueError, match=r"syndromes\[1\] = 13"):
        scma.mask_syndromes([1, 13], [1, 1], p)
    with pytest.raises(ValueError, match=r"mask\[0\] = -1"):
        scma.mask_syndromes([1, 1], [-1, 1], p)
    assert scma.aggregate_syndromes([[12, 1], [1, 12], [5, 5]], p, 2) == [5, 5]
    assert scma.aggregate_syndromes(iter([[3, 4]]), p, 2) == [3, 4]
    with pytest.raises(ValueError, match=r"messages\[1\] must have 2"):
        scma.aggregate_syndromes([[1, 2], [1, 2, 3]], p, 2)
    with pytest.raises(ValueError, match=r"messages\[0\]\[1\] = 13"):
        scma.aggregate_syndromes([[1, 13]], p, 2)
    with pytest.raises(ValueError, match="no messages"):
        scma.aggregate_syndromes([], p, 2)
    with pytest.raises(TypeError):
        scma.aggregate_syndromes([[1, True]], p, 2)


# ------------------------------------------------------------------ oracle 2: random round trips


CONFIGS = [
    # (K, L, n_bins, n): small field, 2^64 < B^d, counts beyond 2^64, a 400-bit field
    (2, 2, 4, 12),
    (3, 4, 16**3, 1000),
    (4, 5, 16**20, 2**70),
    (5, 3, 2**400, 2**90),
]


def random_vectors(rng, k, n_parties, n_bins, n, pool=None):
    """Each client gets 0..K non-zeros (from ``pool`` when given, so clients share bins)."""
    vectors = []
    for _ in range(n_parties):
        nnz = rng.randrange(0, k + 1)
        bins = [rng.choice(pool) if pool else rng.randrange(1, n_bins + 1) for _ in range(nnz)]
        vectors.append({j: rng.randrange(1, max(2, n // (k * n_parties))) for j in bins})
    return vectors


@pytest.mark.parametrize(("k", "n_parties", "n_bins", "n"), CONFIGS, ids=["p13", "p2^12", "Bd2^80", "Bd2^400"])
def test_random_round_trips_decode_the_exact_sum(k, n_parties, n_bins, n):
    rng = random.Random(k * 1000 + n_parties)
    p = scma.field_prime(n, n_bins)
    n_syndromes = 2 * k * n_parties
    for trial in range(25):
        pool = [rng.randrange(1, n_bins + 1) for _ in range(3)] if trial % 2 else None
        vectors = random_vectors(rng, k, n_parties, n_bins, n, pool)
        if trial % 3 == 0:
            masks = pairwise_for_all(n_parties, p, n_syndromes, trial, tag=k)
        else:
            masks = scma.dealer_masks(n_parties, p, n_syndromes, rng.randbytes(32))
        _, sums = run_scma(vectors, p, n_syndromes, masks=masks)
        expected = add_counts(vectors)
        got = scma.decode_syndromes(sums, p, max_support=k * n_parties, max_index=n_bins, max_total=n)
        assert got == expected
        assert all(type(j) is int and type(q) is int for j, q in got.items())


def test_all_zero_and_full_support_and_shared_bins():
    rng = random.Random(3)
    k, n_parties, n_bins = 3, 4, 2**80
    p = scma.field_prime(2**66, n_bins)
    n_syndromes = 2 * k * n_parties
    # all clients empty: sums are masks only, which cancel -> g = 1, empty support
    zeros = [{} for _ in range(n_parties)]
    masks = scma.dealer_masks(n_parties, p, n_syndromes, b"z" * 32)
    messages, sums = run_scma(zeros, p, n_syndromes, masks=masks)
    assert any(any(m) for m in messages) and sums == [0] * n_syndromes
    assert scma.error_locator(sums, p) == [1]
    assert scma.decode_syndromes(sums, p, max_support=k * n_parties, max_index=n_bins) == {}
    # full support: KL distinct bins, counts beyond 2^64
    bins = list({rng.randrange(1, n_bins + 1) for _ in range(k * n_parties)})
    assert len(bins) == k * n_parties
    full = [{j: rng.randrange(2**64, 2**65) for j in bins[l * k : (l + 1) * k]} for l in range(n_parties)]
    _, sums = run_scma(full, p, n_syndromes, masks=pairwise_for_all(n_parties, p, n_syndromes, 0))
    assert scma.decode_syndromes(sums, p, max_support=k * n_parties, max_index=n_bins) == add_counts(full)
    # every client uses the same K bins: counts add up
    same = [{5: 1 + l, n_bins: 10, 7: 2**64} for l in range(n_parties)]
    _, sums = run_scma(same, p, n_syndromes, masks=pairwise_for_all(n_parties, p, n_syndromes, 1))
    assert scma.decode_syndromes(sums, p, max_support=k * n_parties, max_index=n_bins) == {
        5: 10, 7: 4 * 2**64, n_bins: 40
    }


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.integers(1, 10_000), st.integers(1, 50), max_size=8),
    st.integers(0, 4),
)
def test_decode_inverts_encoding_hypothesis(counts, extra):
    p = scma.field_prime(10_000, 10_000)
    n_syndromes = 2 * len(counts) + extra
    if n_syndromes == 0:
        n_syndromes = 1
    sums = scma.rs_syndromes(counts, p, n_syndromes)
    assert scma.decode_syndromes(sums, p, max_support=len(counts), max_index=10_000) == dict(sorted(counts.items()))


def test_medium_support_decodes_with_a_celltype_sized_field():
    rng = random.Random(11)
    n_bins = 111**10
    p = scma.field_prime(12009, n_bins)
    assert p.bit_length() == 68
    counts = {rng.randrange(1, n_bins + 1): rng.randrange(1, 40) for _ in range(300)}
    sums = scma.rs_syndromes(counts, p, 2 * len(counts))
    assert scma.decode_syndromes(sums, p, max_support=len(counts), max_index=n_bins) == dict(sorted(counts.items()))


def test_small_support_decodes_with_a_4423_bit_field():
    p = 2**4423 - 1  # a Mersenne prime: no 30 s prime search in the fast suite
    vectors = [{3**2000: 7}, {3**2000: 1, 2**4000 + 1: 11}]
    _, sums = run_scma(vectors, p, 4, masks=scma.dealer_masks(2, p, 4, b"x" * 32))
    assert scma.decode_syndromes(sums, p, max_support=2, max_index=2**4422) == {3**2000: 8, 2**4000 + 1: 11}


@pytest.mark.slow
def test_ten_thousand_nonzeros_with_a_69_bit_field():
    rng = random.Random(5)
    n_bins = 111**10
    p = scma.field_prime(12009, n_bins)
    counts = {}
    while len(counts) < 10_000:
        counts[rng.randrange(1, n_bins + 1)] = rng.randrange(1, 100)
    sums = scma.rs_syndromes(counts, p, 20_000)
    assert scma.decode_syndromes(sums, p, max_support=10_000, max_index=n_bins) == dict(sorted(counts.items()))


@pytest.mark.slow
def test_tmi_sized_field_small_support():
    p = scma.field_prime(0, 35**984)
    assert p.bit_length() == 5048 and flint.fmpz(p).is_probable_prime()
    rng = random.Random(8)
    counts = {rng.randrange(1, 35**984 + 1): rng.randrange(1, 1000) for _ in range(8)}
    sums = scma.rs_syndromes(counts, p, 80)
    assert scma.decode_syndromes(sums, p, max_support=40, max_index=35**984) == dict(sorted(counts.items()))


# ------------------------------------------------------------------ oracle 3: mask invariance, negative control


def test_decoded_sum_does_not_depend_on_the_masks():
    rng = random.Random(21)
    k, n_parties, n_bins = 3, 4, 10**6
    p = scma.field_prime(5000, n_bins)
    n_syndromes = 2 * k * n_parties
    vectors = random_vectors(rng, k, n_parties, n_bins, 5000)
    runs = [
        run_scma(vectors, p, n_syndromes, masks=scma.dealer_masks(n_parties, p, n_syndromes, b"a" * 32)),
        run_scma(vectors, p, n_syndromes, masks=scma.dealer_masks(n_parties, p, n_syndromes, b"b" * 32)),
        run_scma(vectors, p, n_syndromes, masks=pairwise_for_all(n_parties, p, n_syndromes, 0)),
        run_scma(vectors, p, n_syndromes, masks=pairwise_for_all(n_parties, p, n_syndromes, 1)),
    ]
    for i, (messages, _) in enumerate(runs):
        for other, _ in runs[i + 1 :]:
            assert all(a != b for a, b in zip(messages, other))  # every client's message changed
    assert len({tuple(sums) for _, sums in runs}) == 1
    decoded = [scma.decode_syndromes(s, p, max_support=k * n_parties, max_index=n_bins) for _, s in runs]
    assert all(d == add_counts(vectors) for d in decoded)


def test_perturbed_or_mismatched_masks_make_decoding_fail():
    rng = random.Random(31)
    k, n_parties, n_bins = 2, 3, 2**62
    p = scma.field_prime(2**40, n_bins)
    assert p.bit_length() >= 62
    n_syndromes = 2 * k * n_parties
    kp = keys(n_parties, tag=9)
    active = list(range(n_parties))
    for trial in range(40):
        vectors = random_vectors(rng, k, n_parties, n_bins, 2**40)
        if trial == 0:  # full support: the case where BM alone cannot tell (degree T/2)
            vectors = [{rng.randrange(1, n_bins): rng.randrange(1, 1000) for _ in range(k)} for _ in active]
        masks = [scma.pairwise_masks(l, pair_seeds(kp, l, active), p, n_syndromes, trial) for l in active]
        _, sums = run_scma(vectors, p, n_syndromes, masks=masks)
        assert scma.decode_syndromes(sums, p, max_support=k * n_parties, max_index=n_bins) == add_counts(vectors)
        # one client's mask perturbed in one position, without the compensating change
        bad = [list(z) for z in masks]
        bad[trial % n_parties][rng.randrange(n_syndromes)] = rng.randrange(p)
        if bad != masks:
            _, sums = run_scma(vectors, p, n_syndromes, masks=bad)
            with pytest.raises(SyndromeDecodingError, match="syndrome decoding failed"):
                scma.decode_syndromes(sums, p, max_support=k * n_parties, max_index=n_bins, max_total=2**40)
        # one client uses the wrong round, another drops a peer from its active set
        wrong = list(masks)
        if trial % 2:
            wrong[0] = scma.pairwise_masks(0, pair_seeds(kp, 0, active), p, n_syndromes, trial + 1)
        else:
            wrong[1] = scma.pairwise_masks(1, pair_seeds(kp, 1, [0, 1]), p, n_syndromes, trial)
        _, sums = run_scma(vectors, p, n_syndromes, masks=wrong)
        with pytest.raises(SyndromeDecodingError):
            scma.decode_syndromes(sums, p, max_support=k * n_parties, max_index=n_bins, max_total=2**40)
    # a missing client's message: the others' masks do not cancel
    masks = [scma.pairwise_masks(l, pair_seeds(kp, l, active), p, n_syndromes, 99) for l in active]
    messages, _ = run_scma(random_vectors(rng, k, n_parties, n_bins, 2**40), p, n_syndromes, masks=masks)
    with pytest.raises(SyndromeDecodingError):
        scma.decode_syndromes(
            scma.aggregate_syndromes(messages[:-1], p, n_syndromes), p, max_support=k * n_parties, max_index=n_bins
        )
    assert issubclass(SyndromeDecodingError, RemoteProtocolError)


# ------------------------------------------------------------------ oracle 4: zero-sum pairwise masks


def test_pairwise_masks_sum_to_zero_on_every_active_set_and_are_fresh_per_round():
    p = scma.field_prime(10**6, 2**100)
    n_syndromes = 16
    kp = keys(6, tag=4)
    for active in ([0, 1, 2, 3, 4, 5], [0, 2, 3], [1, 5], [4, 0, 5, 3]):
        by_round = []
        for round_idx in (0, 1, 2**70):
            masks = [scma.pairwise_masks(l, pair_seeds(kp, l, active), p, n_syndromes, round_idx) for l in active]
            assert [sum(col) % p for col in zip(*masks)] == [0] * n_syndromes
            assert all(len(z) == n_syndromes and all(0 <= v < p for v in z) for z in masks)
            assert all(len(set(z)) == n_syndromes for z in masks)  # 100-bit values: no repeats
            by_round.append(masks)
        for i in range(len(active)):  # no entry is reused across rounds
            assert not set(by_round[0][i]) & set(by_round[1][i])
            assert not set(by_round[1][i]) & set(by_round[2][i])
    # determinism, and a different field size or T gives an unrelated mask
    seeds = pair_seeds(kp, 2, range(6))
    z = scma.pairwise_masks(2, seeds, p, n_syndromes, 3)
    assert z == scma.pairwise_masks(2, dict(reversed(list(seeds.items()))), p, n_syndromes, 3)
    assert scma.pairwise_masks(2, seeds, p, n_syndromes + 1, 3)[:4] != z[:4]
    assert scma.pairwise_masks(2, seeds, scma.field_prime(0, 2**101), n_syndromes, 3)[:4] != z[:4]


def test_pairwise_masks_reject_bad_arguments():
    seeds = {1: b"s" * 32}
    with pytest.raises(ValueError, match="at least one other"):
        scma.pairwise_masks(0, {}, 13, 4, 0)
    with pytest.raises(ValueError, match="itself"):
        scma.pairwise_masks(1, seeds, 13, 4, 0)
    with pytest.raises(ValueError, match="round_idx"):
        scma.pairwise_masks(0, seeds, 13, 4, -1)
    with pytest.raises(ValueError, match="32 bytes"):
        scma.pairwise_masks(0, {1: b"short"}, 13, 4, 0)


def test_dealer_masks_sum_to_zero_and_depend_on_the_seed():
    p = scma.field_prime(0, 2**80)
    masks = scma.dealer_masks(5, p, 12, b"d" * 32)
    assert len(masks) == 5 and all(len(z) == 12 for z in masks)
    assert [sum(col) % p for col in zip(*masks)] == [0] * 12
    assert masks == scma.dealer_masks(5, p, 12, b"d" * 32)
    other = scma.dealer_masks(5, p, 12, b"e" * 32)
    assert all(a != b for a, b in zip(masks, other))
    assert scma.dealer_masks(1, p, 3, b"d" * 32) == [[0, 0, 0]]
    with pytest.raises(ValueError, match="at least 32"):
        scma.dealer_masks(2, p, 3, b"short")


def test_pairwise_seed_is_symmetric_and_distinct_per_pair_and_context():
    kp = keys(4, tag=1)
    seeds = {}
    for a in range(4):
        for b in range(4):
            if a != b:
                seeds[a, b] = scma.pairwise_seed(kp[a][0], kp[a][1], kp[b][1], b"session-7")
    for (a, b), seed in seeds.items():
        assert len(seed) == 32
        assert seed == seeds[b, a]
    assert len(set(seeds.values())) == 6  # one per unordered pair
    assert scma.pairwise_seed(kp[0][0], kp[0][1], kp[1][1], b"session-8") != seeds[0, 1]
    with pytest.raises(ValueError, match="not the public key"):
        scma.pairwise_seed(kp[0][0], kp[1][1], kp[2][1], b"")
    with pytest.raises(ValueError, match="itself"):
        scma.pairwise_seed(kp[0][0], kp[0][1], kp[0][1], b"")
    with pytest.raises(ValueError, match="invalid X25519"):
        scma.pairwise_seed(kp[0][0], kp[0][1], bytes(32), b"")  # a low-order point
    with pytest.raises(TypeError):
        scma.pairwise_seed(b"not a key", kp[0][1], kp[1][1], b"")


# ------------------------------------------------------------------ oracle 5: privacy smoke test


def _histogram(messages, p):
    cells = np.zeros(p * p, dtype=np.int64)
    for a, b in messages:
        cells[a * p + b] += 1
    return cells


def test_a_masked_message_is_uniform_and_independent_of_the_counts():
    """L = 2, p = 7, T = 2: client 0's message over 3,500 rounds, for two different q^(0)."""
    p, n_syndromes, rounds = 7, 2, 3500
    kp = keys(2, tag=5)
    seeds = pair_seeds(kp, 0, [0, 1])
    histograms = []
    for q, offset in (({1: 3}, 0), ({2: 1, 5: 6}, rounds)):
        syndromes = scma.rs_syndromes(q, p, n_syndromes)
        messages = [
            scma.mask_syndromes(syndromes, scma.pairwise_masks(0, seeds, p, n_syndromes, offset + r), p)
            for r in range(rounds)
        ]
        histograms.append(_histogram(messages, p))
    critical = scipy.stats.chi2.ppf(0.999, p * p - 1)
    for hist in histograms:
        assert scipy.stats.chisquare(hist).statistic < critical
    table = np.stack(histograms)
    assert scipy.stats.chi2_contingency(table).statistic < scipy.stats.chi2.ppf(0.999, p * p - 1)
    # the test has power: reusing one mask (round 0) for every message is far from uniform, and
    # so are unmasked syndromes
    reused = [scma.mask_syndromes(syndromes, scma.pairwise_masks(0, seeds, p, n_syndromes, 0), p)] * rounds
    assert scipy.stats.chisquare(_histogram(reused, p)).statistic > critical


def test_uniform_elements_are_uniform_and_prefix_stable():
    key = bytes(range(32))
    p = 17  # 5 bits: 15 of 32 draws are rejected
    draws = scma.uniform_elements(key, p, 17_000)
    hist = np.bincount(draws, minlength=p)
    assert scipy.stats.chisquare(hist).statistic < scipy.stats.chi2.ppf(0.999, p - 1)
    big = 2**89 + 1  # acceptance just above 1/2: exercises the keystream extension
    long = scma.uniform_elements(key, big, 3000)
    for count in (0, 1, 10, 1000, 2999):
        assert scma.uniform_elements(key, big, count) == long[:count]
    assert all(0 <= v < big for v in long) and max(long) > big // 2
    with pytest.raises(ValueError, match="32 bytes"):
        scma.uniform_elements(b"k", p, 3)


# ------------------------------------------------------------------ oracle 6: overload detection


def test_overload_beyond_max_support_raises():
    """Support 5..15 > KL = 4 with T = 8, p > 2^62.

    In MUFC either the bin range (``B^d << p``) or the count range (``n << p``) is tiny compared
    with p; each alone makes a false acceptance negligible, so both are exercised separately.
    """
    rng = random.Random(41)
    k, n_parties, n_bins = 2, 2, 2**40
    p = scma.field_prime(2**62, n_bins)
    n_syndromes = 2 * k * n_parties
    for trial in range(40):
        support = rng.randrange(k * n_parties + 1, 4 * k * n_parties)
        total = {rng.randrange(1, n_bins): rng.randrange(1, 1000) for _ in range(support)}
        items = list(total.items())
        # split across the clients: some client holds more than K non-zeros
        vectors = [dict(items[: len(items) // 2]), dict(items[len(items) // 2 :])]
        masks = scma.dealer_masks(n_parties, p, n_syndromes, rng.randbytes(32))
        _, sums = run_scma(vectors, p, n_syndromes, masks=masks)
        with pytest.raises(SyndromeDecodingError):  # small bin range, no count bound
            scma.decode_syndromes(sums, p, max_support=k * n_parties, max_index=n_bins)
        with pytest.raises(SyndromeDecodingError):  # bin range = the whole field, counts <= n
            scma.decode_syndromes(sums, p, max_support=k * n_parties, max_index=p - 1, max_total=2**20)
    # a client above K whose excess is absorbed (total support still <= KL) decodes exactly
    vectors = [{1: 1, 2: 2, 3: 3}, {3: 4}]
    _, sums = run_scma(vectors, p, n_syndromes, masks=scma.dealer_masks(2, p, n_syndromes, b"o" * 32))
    assert scma.decode_syndromes(sums, p, max_support=4, max_index=n_bins) == {1: 1, 2: 2, 3: 7}


def test_each_validity_check_fires():
    p = scma.field_prime(1000, 1000)
    sums = scma.rs_syndromes({10: 4, 900: 6}, p, 8)
    assert scma.decode_syndromes(sums, p, max_support=4, max_index=1000) == {10: 4, 900: 6}
    with pytest.raises(SyndromeDecodingError, match="more than max_support = 1"):
        scma.decode_syndromes(sums, p, max_support=1, max_index=1000)
    with pytest.raises(SyndromeDecodingError, match="exceeds max_index = 899"):
        scma.decode_syndromes(sums, p, max_support=4, max_index=899)
    with pytest.raises(SyndromeDecodingError, match="max_total = 9"):
        scma.decode_syndromes(sums, p, max_support=4, max_index=1000, max_total=9)
    # 3 syndromes of a 2-sparse vector: degree 2 > T/2
    with pytest.raises(SyndromeDecodingError, match="at most 1 non-zero"):
        scma.decode_syndromes(sums[:3], p, max_support=4, max_index=1000)
    # an impulse at position 0 is a "bin 0" term: the locator gets the root 0
    impulse = [(s + (i == 0)) % p for i, s in enumerate(sums)]
    with pytest.raises(SyndromeDecodingError, match="root at 0"):
        scma.decode_syndromes(impulse, p, max_support=4, max_index=1000)
    # a locator without roots in F_p: x^2 - a for a non-residue a (syndromes of the LFSR)
    non_residue = next(a for a in range(2, p) if pow(a, (p - 1) // 2, p) == p - 1)
    seq = [1, 0]
    while len(seq) < 8:
        seq.append(non_residue * seq[-2] % p)
    assert scma.error_locator(seq, p) == [1, 0, p - non_residue]
    with pytest.raises(SyndromeDecodingError, match="distinct roots"):
        scma.decode_syndromes(seq, p, max_support=4, max_index=p - 1)
    # a double root: s_n = n * r^n has the locator (1 - r x)^2
    seq = [n * pow(5, n, p) % p for n in range(8)]
    with pytest.raises(SyndromeDecodingError, match="distinct roots"):
        scma.decode_syndromes(seq, p, max_support=4, max_index=p - 1)
    # counts that wrap around p: q = {1: p - 1, 2: 2} has S_1 = 1 but integer total p + 1
    wrap = scma.rs_syndromes({1: p - 1, 2: 2}, p, 4)
    with pytest.raises(SyndromeDecodingError, match="wrapped around"):
        scma.decode_syndromes(wrap, p, max_support=2, max_index=2)


def test_reencoding_check_catches_a_locator_that_does_not_generate_all_syndromes(monkeypatch):
    """The last safety net: BM's output always generates the sums, so fake a locator that does not.

    The sums are those of {10: 4, 900: 6} with the last syndrome changed; the fake locator is the
    true one, so roots, Forney counts and the total all look right and only re-encoding differs.
    """
    p = scma.field_prime(1000, 1000)
    good = scma.rs_syndromes({10: 4, 900: 6}, p, 8)
    bad = good[:-1] + [(good[-1] + 1) % p]
    ctx = flint.fmpz_mod_poly_ctx(p)
    true_locator = ctx.minpoly(good)
    assert [int(c) for c in true_locator.coeffs()] == [9000 % p, (-910) % p, 1]
    monkeypatch.setattr(_scma_decoding, "_locator", lambda _ctx, _sums: true_locator)
    assert scma.decode_syndromes(good, p, max_support=4, max_index=1000) == {10: 4, 900: 6}
    with pytest.raises(SyndromeDecodingError, match="do not reproduce all syndromes"):
        scma.decode_syndromes(bad, p, max_support=4, max_index=1000)


def test_decode_rejects_bad_configuration():
    p = 13
    with pytest.raises(ValueError, match="max_index"):
        scma.decode_syndromes([1, 1], p, max_support=1, max_index=13)
    with pytest.raises(ValueError, match="max_index"):
        scma.decode_syndromes([1, 1], p, max_support=1, max_index=0)
    with pytest.raises(ValueError, match="max_support"):
        scma.decode_syndromes([1, 1], p, max_support=-1, max_index=4)
    with pytest.raises(ValueError, match="empty"):
        scma.decode_syndromes([], p, max_support=1, max_index=4)
    with pytest.raises(ValueError, match=r"sums\[1\] = 13"):
        scma.decode_syndromes([1, 13], p, max_support=1, max_index=4)
    with pytest.raises(ValueError, match="not prime"):
        scma.decode_syndromes([1, 1], 15, max_support=1, max_index=4)


# ------------------------------------------------------------------ oracle 7: prime choice


def test_field_prime_is_the_smallest_prime_strictly_above_the_maximum():
    assert [scma.field_prime(n, 0) for n in range(8)] == [2, 2, 3, 5, 5, 7, 7, 11]
    for n in range(0, 400, 7):
        for n_bins in (0, 1, 4, 97, 211, 390):
            p = scma.field_prime(n, n_bins)
            bound = max(n, n_bins)
            assert p > bound and is_prime_trial(p)
            assert not any(is_prime_trial(c) for c in range(bound + 1, p))
    assert scma.field_prime(12, 4) == 13 and scma.field_prime(13, 4) == 17  # strict: 13 -> 17
    assert scma.field_prime(0, 2**127 - 2) == 2**127 - 1  # Mersenne prime
    assert scma.field_prime(2**127 - 1, 0) > 2**127 - 1
    assert scma.field_prime(2**521 - 2, 7) == 2**521 - 1  # above PROVEN_PRIME_BITS: BPSW path


@pytest.mark.parametrize(
    "bound", [2**64 - 60, 2**64, 111**10, 45**57, 2**600 + 12345], ids=["2^64-60", "2^64", "111^10", "45^57", "2^600"]
)
def test_field_prime_large_bounds_against_flint(bound):
    p = scma.field_prime(bound, 3)
    assert p > bound
    assert flint.fmpz(p).is_probable_prime()
    if p.bit_length() <= scma.PROVEN_PRIME_BITS:
        assert flint.fmpz(p).is_prime()
    assert not any(flint.fmpz(c).is_probable_prime() for c in range(bound + 1, p))


def test_field_prime_rejects_bad_arguments():
    with pytest.raises(ValueError, match="n must be >= 0"):
        scma.field_prime(-1, 4)
    with pytest.raises(TypeError):
        scma.field_prime(4.0, 4)


# ------------------------------------------------------------------ oracle 8: message size


def test_message_size_grows_linearly_in_d_and_in_k_and_l():
    n, b = 12009, 111
    widths = {}
    for d in (1, 2, 5, 10, 20, 40):
        p = scma.field_prime(n, b**d)
        widths[d] = scma.field_width(p)
        assert widths[d] == math.ceil(p.bit_length() / 8)
        assert p.bit_length() == max(n, b**d).bit_length() or p.bit_length() == max(n, b**d).bit_length() + 1
        # within one byte of the information content d log2(B) / 8 (d = 1: n dominates)
        assert widths[d] * 8 - 8 < max(d * math.log2(b), math.log2(n)) + 1 <= widths[d] * 8 + 1
    assert widths[1] == 2 and widths[10] == 9
    slope = (widths[40] - widths[20]) / 20
    assert abs(slope - math.log2(b) / 8) < 0.06  # linear in d, i.e. logarithmic in B^d
    # T = 2KL elements per message: bytes are linear in K and in L
    w = widths[10]
    for k, n_parties in ((1, 1), (4, 100), (8, 100), (4, 200)):
        assert 2 * k * n_parties * w == (2 * k * n_parties) * w
    # every element of a masked message fits in w bytes, and p - 1 needs all of them
    p = scma.field_prime(n, b**10)
    msg = scma.mask_syndromes(scma.rs_syndromes({7: 3}, p, 8), scma.dealer_masks(2, p, 8, b"w" * 32)[0], p)
    assert len(b"".join(v.to_bytes(w, "big") for v in msg)) == 8 * w
    assert (p - 1).bit_length() > 8 * (w - 1)
    assert [scma.field_width(v) for v in (2, 255, 256, 257, 2**64 + 13)] == [1, 1, 2, 2, 9]


# ------------------------------------------------------------------ oracle 9: BM and roots cross-checks


def test_error_locator_matches_an_independent_berlekamp_massey():
    rng = random.Random(51)
    compared = unique = 0
    for p in (13, 101, 2**61 - 1, scma.field_prime(0, 2**70)):
        for trial in range(40):
            n = rng.randrange(1, 24)
            kind = trial % 4
            if kind == 0:  # arbitrary sequences
                seq = [rng.randrange(p) for _ in range(n)]
            elif kind == 1:  # syndromes of sparse vectors (SCMA's case)
                counts = {rng.randrange(1, p): rng.randrange(1, p) for _ in range(rng.randrange(0, 6))}
                seq = ref_syndromes(counts, p, n)
            elif kind == 2:  # mostly zeros with a late impulse
                seq = [0] * n
                seq[rng.randrange(n)] = rng.randrange(1, p)
            else:  # an LFSR with a random connection polynomial (possibly short taps)
                taps = [rng.randrange(p) for _ in range(rng.randrange(1, 5))]
                seq = [rng.randrange(p) for _ in range(len(taps))]
                while len(seq) < n + len(taps):
                    seq.append(sum(t * seq[-1 - i] for i, t in enumerate(taps)) % p)
                seq = seq[:n]
            ours = scma.error_locator(seq, p)
            ref, length = ref_berlekamp_massey(seq, p)
            assert len(ours) == length + 1 and ours[0] == 1
            assert generates(ours, seq, p)
            compared += 1
            if 2 * length <= n:  # the shortest LFSR is unique
                assert ours == ref
                unique += 1
    assert unique > 80 and compared == 160


def test_field_roots_match_brute_force():
    rng = random.Random(61)
    p = 31
    for trial in range(150):
        if trial % 3 == 0:  # products of linear factors, with repeats and the root 0
            coeffs = [1]
            for _ in range(rng.randrange(1, 7)):
                r = rng.randrange(p)
                coeffs = [(a - r * b) % p for a, b in zip([0] + coeffs, coeffs + [0])]
            coeffs = [c * rng.randrange(1, p) % p for c in coeffs]
        else:
            coeffs = [rng.randrange(p) for _ in range(rng.randrange(1, 9))]
            if not any(coeffs):
                coeffs[0] = 1
        expected = [x for x in range(p) if poly_eval(coeffs, x, p) == 0]
        assert scma.field_roots(coeffs, p) == expected
    assert scma.field_roots([5], p) == []
    with pytest.raises(ValueError, match="zero polynomial"):
        scma.field_roots([0, 0], p)


# ---------------------------------------------------------------------------------- unlearning
P69 = scma.field_prime(12009, 111**10)


def _random_counts(rng: random.Random, m: int, bins: int, top: int = 50) -> dict[int, int]:
    return {rng.randrange(1, bins + 1): rng.randrange(1, top) for _ in range(m)}


@pytest.mark.parametrize("hint", [None, 1, 8, 400])
def test_signed_decoding_of_a_difference_with_any_hint(hint):
    rng = random.Random(7)
    before = _random_counts(rng, 40, 111**10)
    after = dict(before)
    gone = sorted(after)[:3]
    for j in gone:
        del after[j]
    after[sorted(after)[0]] += 5
    new = _random_counts(rng, 2, 111**10)
    after.update(new)
    diff = {j: after.get(j, 0) - before.get(j, 0) for j in set(before) | set(after)}
    diff = {j: c for j, c in sorted(diff.items()) if c}
    t = 200
    d = [(a - b) % P69 for a, b in zip(scma.rs_syndromes(after, P69, t), scma.rs_syndromes(before, P69, t))]
    decoded = scma.decode_syndromes(d, P69, max_support=t // 2, max_index=111**10, signed=True, support_hint=hint)
    assert decoded == diff and any(c < 0 for c in decoded.values())


def test_decode_update_equals_decoding_from_scratch_and_falls_back_when_misled():
    rng = random.Random(11)
    t, bins = 160, 111**10
    before = _random_counts(rng, 60, bins)
    previous = scma.rs_syndromes(before, P69, t)
    for trial in range(20):
        after = {j: c for j, c in before.items() if rng.random() > 0.05}
        if trial % 2:
            after.update(_random_counts(rng, 3, bins))
        sums = scma.rs_syndromes(after, P69, t)
        kwargs = dict(max_support=t // 2, max_index=bins, max_total=10**6)
        assert scma.decode_update(sums, previous, before, P69, change_hint=8, **kwargs) == after
        # wrong previous counts: the fast path's result fails its checks or its syndromes, and
        # the full decode still gives the truth
        misled = dict(before)
        misled[next(iter(misled))] += 1
        assert scma.decode_update(sums, previous, misled, P69, **kwargs) == after


def test_decode_update_raises_on_a_corrupted_round():
    rng = random.Random(3)
    t, bins = 80, 111**10
    before = _random_counts(rng, 30, bins)
    previous = scma.rs_syndromes(before, P69, t)
    after = dict(before)
    after.pop(next(iter(after)))
    sums = scma.rs_syndromes(after, P69, t)
    sums[5] = (sums[5] + 1) % P69
    with pytest.raises(SyndromeDecodingError):
        scma.decode_update(sums, previous, before, P69, max_support=t // 2, max_index=bins, max_total=10**6)


def test_packed_pair_masks_equal_the_element_by_element_definition():
    """The packed big-integer sum gives exactly sum_{m > l} r_lm - sum_{m < l} r_ml mod p."""
    seeds = {m: bytes([m]) * 32 for m in (0, 2, 3, 5)}
    for p in (13, P69, scma.field_prime(10, 2**300)):
        mask = scma.pairwise_masks(1, seeds, p, 17, 4)
        vectors = {m: _scma_encoding._pair_vector(s, p, 17, 4) for m, s in seeds.items()}
        expected = [
            (sum(vectors[m][i] for m in seeds if m > 1) - sum(vectors[m][i] for m in seeds if m < 1)) % p
            for i in range(17)
        ]
        assert mask == expected


# ------------------------------------------------------------------ packed elements (the wire form)


@pytest.mark.parametrize("p", [13, 257, P69, scma.field_prime(10, 2**300)])
def test_pack_unpack_round_trip_and_the_packed_range_check(p):
    rng = random.Random(p % 1000)
    width = scma.field_width(p)
    values = [0, 1, p - 1, p // 2] + [rng.randrange(p) for _ in range(60)]
    packed = scma.pack_elements(values, p)
    assert packed.dtype == np.uint8 and packed.shape == (len(values), width)
    assert packed.tobytes() == b"".join(v.to_bytes(width, "big") for v in values)
    assert scma.unpack_elements(packed) == values
    assert scma.check_packed("x", packed, p, len(values)) is packed
    # rows >= p are refused and named, also when they tie with p - 1 on the leading bytes
    for bad in (p, p + 1, 256**width - 1, (p - 1) | 1 if (p - 1) | 1 >= p else p):
        rows = np.array(packed)
        rows[7] = np.frombuffer(bad.to_bytes(width, "big"), np.uint8)
        with pytest.raises(ValueError, match=r"x\[7\] = "):
            scma.check_packed("x", rows, p)
    with pytest.raises(TypeError):
        scma.check_packed("x", values, p)
    with pytest.raises(ValueError, match="shape"):
        scma.check_packed("x", packed[:, :-1] if width > 1 else packed.reshape(1, -1), p)
    with pytest.raises(ValueError, match="shape"):
        scma.check_packed("x", packed, p, len(values) + 1)


@pytest.mark.parametrize("p", [13, P69, scma.field_prime(10, 2**300)])
def test_aggregate_packed_equals_the_integer_sum(p):
    rng = random.Random(5)
    for n_parties in (1, 2, 7, 300):
        shares = [[rng.randrange(p) for _ in range(11)] for _ in range(n_parties)]
        expected = scma.aggregate_syndromes(shares, p, 11)
        packed = [scma.pack_elements(s, p) for s in shares]
        assert scma.aggregate_packed(packed, p, 11) == expected
        assert scma.aggregate_packed(np.stack(packed), p, 11) == expected
    top = [scma.pack_elements([p - 1] * 11, p)] * 300  # the largest column sums: no carry is lost
    assert scma.aggregate_packed(top, p, 11) == [300 * (p - 1) % p] * 11


def test_aggregate_packed_refuses_bad_shares_and_names_them():
    p = P69
    good = scma.pack_elements(list(range(5)), p)
    with pytest.raises(ValueError, match="no shares"):
        scma.aggregate_packed([], p, 5)
    with pytest.raises(ValueError, match=r"shares\[1\] must have shape"):
        scma.aggregate_packed([good, good[:4]], p, 5)
    with pytest.raises(TypeError, match=r"shares\[0\]"):
        scma.aggregate_packed([list(range(5))], p, 5)
    bad = np.array(good)
    bad[2] = 255
    with pytest.raises(ValueError, match=r"shares\[1\]\[2\] = "):
        scma.aggregate_packed([good, bad, good], p, 5)


def test_update_syndromes_equals_recomputing_them():
    rng = random.Random(11)
    assert scma.update_syndromes(scma.rs_syndromes({3: 2}, 13, 5), {3: -2, 5: 1}, 13) == scma.rs_syndromes({5: 1}, 13, 5)
    for p, t in ((P69, 40), (scma.field_prime(100, 10**6), 33)):
        bins = min(p - 1, 10**6)
        before = _random_counts(rng, 12, bins)
        after = dict(before)
        # a count down, a bin emptied, a bin appearing, a count up (a re-seed moves several bins)
        first, second = list(before)[:2]
        after[first] -= 1
        after.pop(second)
        new_bin = next(j for j in range(1, bins + 1) if j not in before)
        after[new_bin] = 3
        change = {j: after.get(j, 0) - before.get(j, 0) for j in set(before) | set(after)}
        updated = scma.update_syndromes(scma.rs_syndromes(before, p, t), change, p)
        assert updated == scma.rs_syndromes({j: c % p for j, c in after.items() if c % p}, p, t)
    with pytest.raises(ValueError, match="outside"):
        scma.update_syndromes([0, 0], {0: 1}, 13)
    with pytest.raises(TypeError):
        scma.update_syndromes([0, 0], [(1, 1)], 13)


@pytest.mark.parametrize("support", [1, 4, 5, 9])
def test_reencoding_check_agrees_on_both_paths(support):
    """Degrees up to _RECURRENCE_CHECK_MAX are checked as a recurrence on NumPy, above as a FLINT
    product: both accept the true sums and refuse one changed syndrome past the locator's terms."""
    rng = random.Random(support)
    counts = _random_counts(rng, support, 10**9)
    good = scma.rs_syndromes(counts, P69, 4 * support + 6)
    kwargs = dict(max_support=support, max_index=10**9)
    assert scma.decode_syndromes(good, P69, **kwargs) == dict(sorted(counts.items()))
    assert scma.decode_syndromes(good, P69, support_hint=support, **kwargs) == dict(sorted(counts.items()))
    for position in (2 * support, len(good) - 1):
        bad = list(good)
        bad[position] = (bad[position] + 1) % P69
        with pytest.raises(SyndromeDecodingError):
            scma.decode_syndromes(bad, P69, support_hint=support, **kwargs)


# ------------------------------------------------------------------ removal fast paths


def _difference(after, before, p, t):
    new, old = scma.rs_syndromes(after, p, t), scma.rs_syndromes(before, p, t)
    return [(a - b) % p for a, b in zip(new, old, strict=True)]


def test_a_single_bin_change_decodes_like_the_general_decoder():
    """The shortcut for one changed bin (`_single_change`: j = d_1 / d_0, then every term checked)
    returns exactly what Berlekamp-Massey, roots and Forney return, for a count down, a bin
    emptied, a count up and a new bin; two changed bins, or one syndrome off, are not taken for
    one bin."""
    rng = random.Random(5)
    t, bins = 120, 111**10
    before = _random_counts(rng, 40, bins)
    j0, j1 = sorted(before)[:2]
    new_bin = next(j for j in range(1, bins + 1) if j not in before)
    cases = [{**before, j0: before[j0] - 1} if before[j0] > 1 else {**before, j0: before[j0] + 1},
             {k: v for k, v in before.items() if k != j0},
             {**before, j1: before[j1] + 7},
             {**before, new_bin: 3}]
    for after in cases:
        diff = _difference(after, before, P69, t)
        general = scma.decode_syndromes(diff, P69, max_support=t // 2, max_index=bins, signed=True)
        assert len(general) == 1
        assert _scma_decoding._single_change(np.asarray(diff, dtype=object), P69, bins) == general
        kwargs = dict(max_support=t // 2, max_index=bins, max_total=10**6)
        sums, previous = scma.rs_syndromes(after, P69, t), scma.rs_syndromes(before, P69, t)
        assert scma.decode_update(sums, previous, before, P69, **kwargs) == dict(sorted(after.items()))
        assert scma.decode_update(sums, previous, before, P69, validated=True, **kwargs) == dict(sorted(after.items()))
    two = {**before, j0: before[j0] + 1, j1: before[j1] + 1}
    assert _scma_decoding._single_change(np.asarray(_difference(two, before, P69, t), dtype=object), P69, bins) is None
    off = _difference(cases[2], before, P69, t)
    off[-1] = (off[-1] + 1) % P69
    assert _scma_decoding._single_change(np.asarray(off, dtype=object), P69, bins) is None
    # an index beyond the grid is not a bin: the shortcut declines
    assert _scma_decoding._single_change(np.asarray(_difference({5: 1}, {}, P69, t), dtype=object), P69, 4) is None
    # a difference of T = 1 term cannot name its bin
    assert _scma_decoding._single_change(np.asarray([3], dtype=object), P69, bins) is None


def test_decode_update_with_one_syndrome_off_still_raises_and_checks_lengths():
    rng = random.Random(9)
    t, bins = 64, 111**10
    before = _random_counts(rng, 20, bins)
    j0 = min(before)
    after = {**before, j0: before[j0] + 1}
    sums, previous = scma.rs_syndromes(after, P69, t), scma.rs_syndromes(before, P69, t)
    sums[-1] = (sums[-1] + 1) % P69
    kwargs = dict(max_support=t // 2, max_index=bins, max_total=10**6)
    for validated in (False, True):
        with pytest.raises(SyndromeDecodingError):
            scma.decode_update(sums, previous, before, P69, validated=validated, **kwargs)
    with pytest.raises(ValueError, match="previous_sums"):
        scma.decode_update(sums, previous[:-1], before, P69, validated=True, **kwargs)


def test_a_single_bin_update_equals_recomputing_the_syndromes():
    """The one-bin update (a removal that moved no seed: a running power, one pass) gives
    `rs_syndromes` of the new counts, checked or not, and leaves its input alone."""
    rng = random.Random(13)
    for p, t in ((13, 7), (P69, 50), (scma.field_prime(100, 10**6), 33)):
        bins = min(p - 1, 10**6)
        before = _random_counts(rng, 6, bins, top=min(p - 1, 50))
        old = scma.rs_syndromes(before, p, t)
        kept = list(old)
        for j, c in ((min(before), -1), (max(before), 2), (next(j for j in range(1, bins + 1) if j not in before), 1)):
            after = {**before, j: (before.get(j, 0) + c) % p}
            expected = scma.rs_syndromes({k: v for k, v in after.items() if v}, p, t)
            assert scma.update_syndromes(old, {j: c}, p) == expected
            assert scma.update_syndromes(old, {j: c}, p, validated=True) == expected
        assert old == kept
        assert scma.update_syndromes(old, {min(before): p}, p) == old  # a change of p is no change


def test_powers_computed_ahead_give_the_same_update():
    """`bin_powers` is the syndrome vector of one point in bin j; an update with a bin's powers
    computed ahead (a removal, a count up, any change) equals the one computed on the spot, and
    powers of another length are refused."""
    rng = random.Random(17)
    for p, t in ((13, 6), (P69, 45)):
        bins = min(p - 1, 10**6)
        assert scma.bin_powers(3, p, t) == ref_syndromes({3: 1}, p, t)
        before = _random_counts(rng, 5, bins, top=min(p - 1, 50))
        old = scma.rs_syndromes(before, p, t)
        ahead = {j: scma.bin_powers(j, p, t) for j in before}
        for j in before:
            for c in (-1, p - 1, 2, -before[j]):
                assert scma.update_syndromes(old, {j: c}, p, powers=ahead) == scma.update_syndromes(old, {j: c}, p)
        with pytest.raises(ValueError, match="terms"):
            j = next(iter(before))
            scma.update_syndromes(old, {j: -1}, p, powers={j: ahead[j][:-1]})
    with pytest.raises(ValueError, match="outside"):
        scma.bin_powers(0, 13, 4)


@pytest.mark.parametrize("depth", [1, 100, 257, 258])
def test_column_sums_are_exact_on_both_paths(depth):
    """Up to 257 words of up to 16 bytes are summed through one float64 product (exact below
    2^53), the rest through integer groups: both give the integer sums, all-ones bytes included."""
    rng = np.random.default_rng(depth)
    for width in (1, 4, 5, 9, 16, 17, 33):
        words = rng.integers(0, 256, (depth, 6, width), dtype=np.uint8)
        words[:, 0] = 255
        expected = [sum(int.from_bytes(words[s, i].tobytes(), "big") for s in range(depth)) for i in range(6)]
        assert _scma_field._column_sums(words).tolist() == expected


def _prime_below(bits):
    candidate = (1 << bits) - 1
    while not flint.fmpz(candidate).is_prime():
        candidate -= 2
    return candidate


@pytest.mark.parametrize("bits", [7, 31, 32, 33, 63, 64, 65, 69, 96, 97, 127, 128])
def test_aggregate_packed_reduces_exactly_at_limb_boundaries(bits):
    """The limb reduction (`_column_sums_mod`: a float quotient, then one conditional subtraction)
    equals the integer sum mod p for primes just below 2^bits, sums that are multiples of p or one
    off, all-(p - 1) stacks of 257, and shares that are not C-contiguous."""
    rng = random.Random(bits)
    p = _prime_below(bits)
    for depth in (1, 2, 257):
        for case in range(3):
            if case == 0:
                shares = [[p - 1 - rng.randrange(2) for _ in range(9)] for _ in range(depth)]
            else:
                shares = [[rng.randrange(p) for _ in range(9)] for _ in range(depth - 1)]
                shares.append([(-sum(s[i] for s in shares) + rng.choice([0, 1, -1])) % p for i in range(9)])
            packed = [scma.pack_elements(s, p) for s in shares]
            expected = [sum(s[i] for s in shares) % p for i in range(9)]
            assert scma.aggregate_packed(packed, p, 9) == expected
            assert scma.aggregate_packed([np.asfortranarray(s) for s in packed], p, 9) == expected


@pytest.mark.parametrize("width", range(1, 17))
def test_sum_packed_equals_the_python_int_sum_for_every_width(width):
    """`sum_packed` (range check, digit sums, float quotient, limb carries) equals ``sum(values)
    % p`` in Python ints for every element width 1..16, with a prime that fills the top byte and
    one that leaves five of its bits empty, for 1, 2, 100 and 257 shares: random elements with
    ``p - 1`` among them, all-``(p - 1)`` stacks, and sums that land on a multiple of ``p`` or one
    off (where the float quotient is one short and ``p`` is subtracted once more)."""
    rng = random.Random(width)
    t = 6
    for p in (_prime_below(8 * width), _prime_below(8 * width - 5)):
        assert scma.field_width(p) == width
        for depth in (1, 2, 100, 257):
            cases = [[[p - 1] * t for _ in range(depth)]]
            for target in (None, 0, 1, p - 1):
                shares = [[rng.choice((p - 1, rng.randrange(p))) for _ in range(t)] for _ in range(depth)]
                if target is not None:  # the last share sets each column's sum to target mod p
                    shares[-1] = [(target - sum(s[i] for s in shares[:-1])) % p for i in range(t)]
                cases.append(shares)
            for shares in cases:
                expected = [sum(column) % p for column in zip(*shares)]
                sums = scma.sum_packed([scma.pack_elements(s, p) for s in shares], p, t)
                assert sums.tolist() == expected
                assert ((sums.limbs >= 0) & (sums.limbs < 2**32)).all()


def _aggregate(vectors, p):
    return scma.sum_packed([scma.pack_elements(v, p) for v in vectors], p, len(vectors[0]))


@pytest.mark.parametrize("p", [13, P69, _prime_below(64), _prime_below(127), scma.field_prime(10, 2**300)])
def test_the_packed_single_change_decides_like_the_object_array_one(p):
    """`sum_packed` results are compared on packed integers (`_packed_single_change`): the same
    decision as `_single_change` (one bin, several, one term off, an index beyond the grid);
    lists (`aggregate_packed`'s too) are left to the Python-int path."""
    rng = random.Random(p % 1000)
    t = 12
    bins = min(p - 1, 10**6)
    for trial in range(12):
        previous = [rng.randrange(p) for _ in range(t)]
        j, c = rng.randrange(1, bins + 1), rng.choice([1, -1, 3])
        diff = [c * pow(j, i, p) % p for i in range(t)]
        if trial % 3 == 1:
            diff = [(a + pow(j % bins + 1, i, p)) % p for i, a in enumerate(diff)]  # two bins
        elif trial % 3 == 2:
            diff[rng.randrange(2, t)] += 1  # one term off
        new = [(a + b) % p for a, b in zip(previous, diff, strict=True)]
        sums, before = _aggregate([new], p), _aggregate([previous], p)
        for max_index in (bins, 1):
            decided = _scma_decoding._packed_single_change(sums, before, p, max_index)
            single = _scma_decoding._single_change(np.asarray([x % p for x in diff], dtype=object), p, max_index)
            assert decided == (single if single is not None else False)
    assert _scma_decoding._packed_single_change(sums, _aggregate([new], p), p, bins) is True
    listed = scma.aggregate_packed([scma.pack_elements(new, p)], p, t)
    assert listed == sums.tolist()
    assert _scma_decoding._packed_single_change(listed, before, p, bins) is None  # a list: no packed test
    assert _scma_decoding._packed_single_change(sums, before.tolist(), p, bins) is None
    assert _scma_decoding._packed_single_change(sums, before, p + 2, bins) is None  # another field


def test_the_packed_check_needs_every_quotient_digit():
    """A difference that is one bin except for one term, built so that p divides the packed
    integer as a whole (j = 2^-W mod p carries the error into the next slot): only the digit
    bound of the quotient tells it from a single bin, as `_single_change` does."""
    p, t = P69, 6
    slot = _scma_decoding._slot_bytes(p, -(-scma.field_width(p) // 4))
    j = pow(2, -8 * slot, p)
    diff = [5 * pow(j, i, p) % p for i in range(t)]
    diff[2] = (diff[2] - 7) % p
    previous = [random.Random(1).randrange(p) for _ in range(t)]
    sums = _aggregate([[(a + b) % p for a, b in zip(previous, diff, strict=True)]], p)
    before = _aggregate([previous], p)
    assert _scma_decoding._single_change(np.asarray(diff, dtype=object), p, p - 1) is None
    assert _scma_decoding._packed_single_change(sums, before, p, p - 1) is False


def _five_clients(seed: int) -> tuple[int, int, list[dict[int, int]], dict[int, int], dict]:
    """``(T, bins, five clients' counts (3 bins each), their total, decode bounds)`` for the
    packed-sums decoding tests."""
    rng = random.Random(seed)
    t, bins = 40, 111**10
    clients = [_random_counts(rng, 3, bins) for _ in range(5)]
    total = {}
    for counts in clients:
        for j, q in counts.items():
            total[j] = total.get(j, 0) + q
    kwargs = dict(max_support=20, max_index=bins, max_total=10**6, change_hint=6)
    return t, bins, clients, total, kwargs


def test_decode_update_is_the_same_with_lists_and_with_packed_sums():
    """`decode_update` on `sum_packed`'s `PackedSums` (the packed one-bin test) and on
    `aggregate_packed`'s lists or tuples (the Python-int path) gives the same counts."""
    t, bins, clients, total, kwargs = _five_clients(23)
    before_shares = [scma.pack_elements(scma.rs_syndromes(c, P69, t), P69) for c in clients]
    before, before_list = scma.sum_packed(before_shares, P69, t), scma.aggregate_packed(before_shares, P69, t)
    first = next(iter(clients[0]))
    for change in ({first: -1}, {first: 2}, {first: 1, 17: 1}, {}):
        moved = [dict(c) for c in clients]
        for j, c in change.items():
            moved[0][j] = moved[0].get(j, 0) + c
        shares = [scma.pack_elements(scma.rs_syndromes(c, P69, t), P69) for c in moved]
        sums, sums_list = scma.sum_packed(shares, P69, t), scma.aggregate_packed(shares, P69, t)
        decided = _scma_decoding._packed_single_change(sums, before, P69, bins)
        assert decided == ({first: change[first]} if len(change) == 1 else (change == {} or False))
        assert _scma_decoding._packed_single_change(sums_list, before_list, P69, bins) is None
        fast = scma.decode_update(sums, before, dict(sorted(total.items())), P69, validated=True, **kwargs)
        listed = scma.decode_update(sums_list, before_list, dict(sorted(total.items())), P69, validated=True, **kwargs)
        plain = scma.decode_update(tuple(sums), tuple(before), dict(sorted(total.items())), P69, **kwargs)
        assert fast == listed == plain == scma.decode_syndromes(sums_list, P69, max_support=20, max_index=bins)


@pytest.mark.parametrize("p", [13, P69, _prime_below(127), scma.field_prime(10, 2**300)])
def test_sum_packed_is_the_integer_sum_as_a_sequence(p):
    """`sum_packed` (limbs, ints made on demand) holds the integer sum mod p, for 1, 257 (the
    largest digit sums) and 300 shares (the Python-int path), all-(p - 1) and non-contiguous
    shares; `aggregate_packed` is its list."""
    rng = random.Random(p % 997)
    t = 7
    for n_parties in (1, 257, 300):
        for top in (False, True):
            shares = [[p - 1 if top else rng.randrange(p) for _ in range(t)] for _ in range(n_parties)]
            expected = [sum(s[i] for s in shares) % p for i in range(t)]
            packed = [scma.pack_elements(s, p) for s in shares]
            sums = scma.sum_packed(packed, p, t)
            assert isinstance(sums, scma.PackedSums) and sums.p == p and len(sums) == t
            assert sums.tolist() == list(sums) == expected and sums[t - 1] == expected[-1]
            assert _scma_field._limbs_to_ints(sums.limbs) == expected  # the limbs themselves, any width
            again = scma.sum_packed([np.asfortranarray(s) for s in packed], p, t)
            assert again.tolist() == expected and again == sums
            assert scma.aggregate_packed(packed, p, t) == expected
    assert sums != scma.sum_packed([scma.pack_elements([1] * t, p)] * 2, p, t)  # -300 != 2 mod p
    with pytest.raises(ValueError, match="no shares"):
        scma.sum_packed([], p, t)
    with pytest.raises(TypeError, match=r"shares\[0\]"):
        scma.sum_packed([np.zeros((t, scma.field_width(p)), np.uint16)], p, t)


@pytest.mark.parametrize("p", [13, P69])
def test_sum_packed_of_checked_shares_skips_only_the_range_check(p):
    """``checked=True`` (shares the caller range-checked) gives the same sum; it still refuses
    shares of the wrong shape or type, and an element >= p no longer raises (it is summed as
    the integer it is, mod p)."""
    rng = random.Random(p)
    t = 5
    packed = [scma.pack_elements([rng.randrange(p) for _ in range(t)], p) for _ in range(4)]
    assert scma.sum_packed(packed, p, t, checked=True) == scma.sum_packed(packed, p, t)
    bad = np.array(packed[0])
    bad[2] = np.frombuffer(p.to_bytes(scma.field_width(p), "big"), np.uint8)  # the element p
    with pytest.raises(ValueError, match=r"shares\[0\]\[2\]"):
        scma.sum_packed([bad, *packed[1:]], p, t)
    got = scma.sum_packed([bad, *packed[1:]], p, t, checked=True)
    others = [scma.unpack_elements(s) for s in packed[1:]]
    assert got[2] == sum(column[2] for column in others) % p  # p itself adds 0 mod p
    with pytest.raises(ValueError, match="shape"):
        scma.sum_packed([packed[0][:-1], *packed[1:]], p, t, checked=True)
    with pytest.raises(TypeError):
        scma.sum_packed([packed[0].astype(np.uint16), *packed[1:]], p, t, checked=True)


@pytest.mark.parametrize("p", [P69, _prime_below(40), _prime_below(127)])
def test_the_range_check_resolves_ties_on_the_leading_bytes(p):
    """Rows are led by four bytes: p - 1 (a tie there) is accepted, p and a row that ties on
    the leading bytes but exceeds p - 1 further on are refused and named."""
    width = scma.field_width(p)
    good = scma.pack_elements([0, p - 1, (p - 1) >> 8 << 8], p)
    assert scma.sum_packed([good, good], p, 3).tolist() == [0, (2 * p - 2) % p, 2 * ((p - 1) >> 8 << 8) % p]
    for value in (p, (p - 1) | 0xFF, (1 << 8 * width) - 1):
        if value < p:
            continue
        bad = np.array(good)
        bad[1] = np.frombuffer(value.to_bytes(width, "big"), np.uint8)
        with pytest.raises(ValueError, match=rf"shares\[1\]\[1\] = {value} "):
            scma.sum_packed([good, bad], p, 3)
        with pytest.raises(ValueError, match=rf"x\[1\] = {value} "):
            scma.check_packed("x", bad, p)


def test_decode_update_takes_packed_sums():
    """`decode_update` on two `PackedSums` (no Python int per element) gives the result of the
    lists, and the packed one-bin test finds a single changed bin (and only then)."""
    t, bins, clients, total, kwargs = _five_clients(29)
    before = scma.sum_packed([scma.pack_elements(scma.rs_syndromes(c, P69, t), P69) for c in clients], P69, t)
    first = next(iter(clients[0]))
    for change in ({first: -1}, {first: 2}, {first: 1, 17: 1}, {}, {first: -clients[0][first]}):
        moved = [dict(c) for c in clients]
        for j, c in change.items():
            moved[0][j] = moved[0].get(j, 0) + c
        moved[0] = {j: c for j, c in moved[0].items() if c}
        sums = scma.sum_packed([scma.pack_elements(scma.rs_syndromes(c, P69, t), P69) for c in moved], P69, t)
        decided = _scma_decoding._packed_single_change(sums, before, P69, bins)
        assert decided == ({first: change[first]} if len(change) == 1 else (change == {} or False))
        fast = scma.decode_update(sums, before, dict(sorted(total.items())), P69, validated=True, **kwargs)
        plain = scma.decode_update(tuple(sums), tuple(before), dict(sorted(total.items())), P69, **kwargs)
        assert fast == plain == scma.decode_syndromes(sums, P69, max_support=20, max_index=bins)
    with pytest.raises(ValueError, match="previous_sums must have 40 elements"):
        scma.decode_update(before, before.tolist()[:-1], dict(sorted(total.items())), P69, **kwargs)

"""Shamir sharing for SecAgg+: the prime, reconstruction from any t shares, secrecy of t - 1, errors.

The references below (textbook Lagrange interpolation with one modular inverse per weight,
Horner's rule) are written from the definitions, independently of the module's batched paths.
"""

from __future__ import annotations

import hashlib
import itertools
import random

import flint
import numpy as np
import pytest
from scipy import stats

from fedproto.algorithms.secagg_plus import shamir
from fedproto.algorithms.secagg_plus.shamir import SHARE_BYTES, SHARE_PRIME, combine_many, combine_shares, split_secret

P = SHARE_PRIME


def ref_interpolate(points: list[tuple[int, int]], at: int, p: int = P) -> int:
    """The value at ``at`` of the polynomial of degree < len(points) through ``points`` (mod p)."""
    total = 0
    for i, (xi, yi) in enumerate(points):
        num, den = 1, 1
        for j, (xj, _) in enumerate(points):
            if j != i:
                num = num * (at - xj) % p
                den = den * (xi - xj) % p
        total += yi * num * pow(den, -1, p)
    return total % p


def ref_horner(coefficients: list[int], x: int, p: int) -> int:
    acc = 0
    for c in reversed(coefficients):
        acc = (acc * x + c) % p
    return acc


def entropy(tag: object) -> bytes:
    return hashlib.sha256(repr(tag).encode()).digest()


def shares_of(secret: bytes, xs: list[int], t: int, tag: object = 0) -> dict[int, bytes]:
    return dict(zip(xs, split_secret(secret, xs, t, entropy(tag)), strict=True))


# ------------------------------------------------------------------------------ the prime


def test_share_prime_is_the_smallest_prime_above_2_to_the_256():
    assert P > 2**256
    assert flint.fmpz(P).is_prime()
    assert not any(flint.fmpz(c).is_prime() for c in range(2**256 + 1, P))
    # Every 32-byte secret is a field element, and every field element fits a share.
    assert (P - 1).bit_length() <= 8 * SHARE_BYTES < P.bit_length() + 8
    assert SHARE_BYTES == (P.bit_length() + 7) // 8


# ------------------------------------------------------------------------------ reconstruction


@pytest.mark.parametrize(("t", "n"), [(1, 1), (1, 4), (2, 2), (2, 5), (3, 7), (5, 9), (12, 20), (40, 60)])
def test_any_t_of_n_shares_reconstruct_and_all_subsets_agree(t, n):
    rng = random.Random(t * 1000 + n)
    secret = rng.randbytes(32)
    xs = rng.sample(range(1, 10 * n + 2), n)
    shares = shares_of(secret, xs, t, (t, n))
    subsets = [tuple(xs[:t])] + [tuple(rng.sample(xs, rng.randint(t, n))) for _ in range(20)]
    for subset in subsets:
        assert combine_shares({x: shares[x] for x in subset}, t) == secret
    assert combine_many([{x: shares[x] for x in s} for s in subsets], t) == [secret] * len(subsets)


def test_shares_lie_on_one_polynomial_of_degree_below_t():
    rng = random.Random(7)
    t, xs = 6, rng.sample(range(1, 500), 15)
    shares = shares_of(rng.randbytes(32), xs, t)
    values = {x: int.from_bytes(shares[x], "big") for x in xs}
    basis = [(x, values[x]) for x in xs[:t]]
    for x in xs[t:]:
        assert ref_interpolate(basis, x) == values[x]
    # ... and not of degree below t - 1: t - 1 of them do not predict the t-th.
    assert ref_interpolate(basis[:-1], xs[t - 1]) != values[xs[t - 1]]


def test_threshold_one_shares_are_the_secret():
    secret = bytes(range(32))
    shares = split_secret(secret, [3, 9, 11], 1, entropy("t1"))
    assert all(int.from_bytes(s, "big") == int.from_bytes(secret, "big") for s in shares)


@pytest.mark.parametrize("secret", [bytes(32), b"\xff" * 32, (1).to_bytes(32, "big")])
def test_extreme_secrets_round_trip(secret):
    xs = [1, 2, 5, 6, 7]
    assert combine_shares(shares_of(secret, xs, 3), 3) == secret


def test_large_and_huge_evaluation_points():
    rng = random.Random(3)
    for xs in (
        [2**61 + i for i in (0, 3, 5, 9)],  # near the int64 limit of the NumPy path
        [P - 1, P - 2, 2**200, 12345],  # field arithmetic path
        [2**70 + i for i in range(4)],  # dense interval of huge points
    ):
        secret = rng.randbytes(32)
        shares = shares_of(secret, xs, 3, xs)
        assert combine_shares(shares, 3) == secret
        assert combine_shares(dict(list(shares.items())[1:]), 3) == secret
    # A dense set at the top of the field beside a wider dense set (the tables must stop at p).
    top, wide = [P - 5, P - 3, P - 2], [1, 2, 6]
    secrets = [rng.randbytes(32), rng.randbytes(32)]
    assert combine_many([shares_of(secrets[0], top, 3), shares_of(secrets[1], wide, 3)], 3) == secrets


def test_split_evaluates_the_polynomial_on_both_evaluation_paths():
    rng = random.Random(11)
    p = P
    for t, m in [(2, 3), (5, 10), (12, 24), (13, 25), (30, 60)]:
        coefficients = [rng.randrange(p) for _ in range(t)]
        xs = rng.sample(range(1, 10**6), m)
        assert shamir._evaluate(coefficients, xs, p) == [ref_horner(coefficients, x, p) for x in xs]


# ------------------------------------------------------------------------------ combine_many


def _mixed_items(rng: random.Random, t: int, n_items: int) -> tuple[list[dict[int, bytes]], list[bytes]]:
    """Items whose point sets are dense, sparse, repeated and huge, in one call."""
    items, secrets = [], []
    for i in range(n_items):
        kind = i % 4
        if kind == 0:  # ranks 1..k with dropouts: dense sets
            k = 2 * t + 2
            xs = [x for x in range(1, k + 1) if rng.random() < 0.85]
            xs = xs if len(xs) >= t else list(range(1, t + 1))
        elif kind == 1:  # client indices: sparse sets
            xs = rng.sample(range(1, 10_001), 2 * t)
        elif kind == 2:  # the same set every time
            xs = list(range(5, 5 + 3 * t, 3))
        else:  # beyond int64
            xs = rng.sample(range(2**64, 2**64 + 10**9), t + 3)
        secret = rng.randbytes(32)
        items.append(shares_of(secret, xs, t, (i, t)))
        secrets.append(secret)
    return items, secrets


@pytest.mark.parametrize("t", [1, 2, 3, 8, 21])
def test_combine_many_equals_combine_shares_and_the_reference(t):
    rng = random.Random(t)
    items, secrets = _mixed_items(rng, t, 24)
    assert combine_many(items, t) == secrets
    assert [combine_shares(item, t) for item in items] == secrets
    for item, secret in zip(items, secrets, strict=True):
        used = sorted(item)[:t]
        ref = ref_interpolate([(x, int.from_bytes(item[x], "big")) for x in used], 0)
        assert ref.to_bytes(32, "big") == secret


def test_combine_many_is_chunk_independent(monkeypatch):
    rng = random.Random(5)
    items, secrets = _mixed_items(rng, 9, 16)
    monkeypatch.setattr(shamir, "_CHUNK_ENTRIES", 1)
    assert combine_many(items, 9) == secrets


def test_combine_many_of_nothing_is_empty():
    assert combine_many([], 3) == []


def test_lagrange_weights_match_the_definition_on_both_paths():
    rng = random.Random(2)
    sets = [tuple(sorted(rng.sample(range(1, 40), 6))) for _ in range(5)]  # sparse
    sets += [(3, 4, 5, 7, 8, 9), (1, 2, 3, 4, 5, 6), (10, 12, 13, 14, 15, 16)]  # dense
    assert any(shamir._is_dense(s) for s in sets) and not all(shamir._is_dense(s) for s in sets)
    weights = shamir._lagrange_weights(sets, P)
    for s in sets:
        expected = []
        for i, xi in enumerate(s):
            num = den = 1
            for j, xj in enumerate(s):
                if j != i:
                    num = num * xj % P
                    den = den * (xj - xi) % P
            expected.append(num * pow(den, -1, P) % P)
        got = [weights[s].scale * f % P for f in weights[s].factors]
        assert got == expected


def test_inputs_as_bytearray_memoryview_and_numpy_points():
    secret = bytes(range(1, 33))
    xs = [4, 8, 15, 16]
    shares = split_secret(bytearray(secret), np.asarray(xs).tolist(), 3, memoryview(entropy("bv")))
    assert shares == split_secret(secret, xs, 3, entropy("bv"))
    mixed = {np.int64(4): bytearray(shares[0]), 8: memoryview(shares[1]), np.uint16(16): shares[3]}
    assert combine_shares(mixed, 3) == secret


# ------------------------------------------------------------------------------ secrecy


def test_t_minus_1_shares_fit_every_secret_exactly_once_small_field():
    # Over F_31 with t = 3: for fixed shares at two points, each secret s has exactly one
    # coefficient pair (c1, c2) reproducing them, so the shares say nothing about s.
    p, xs = 31, [2, 9]
    observed = shamir._evaluate([17, 5, 28], xs, p)
    for s in range(p):
        fits = sum(
            shamir._evaluate([s, c1, c2], xs, p) == observed for c1, c2 in itertools.product(range(p), repeat=2)
        )
        assert fits == 1


@pytest.mark.parametrize("secret", [0, 6])
def test_t_minus_1_shares_are_uniform_whatever_the_secret_small_field(secret):
    # The random coefficients come from the module's own entropy -> field sampler: over many
    # entropies, t - 1 = 2 shares are uniform on F_7^2 for each secret (chi-square test; the
    # seeds are fixed, and the critical value at 1e-6 is far above the statistic under H0).
    p, t, xs, draws = 7, 3, [1, 4], 4900
    counts = np.zeros(p * p)
    for i in range(draws):
        coefficients = shamir._coefficients(secret, t, entropy(("uniform", i)), p)
        y1, y2 = shamir._evaluate(coefficients, xs, p)
        counts[y1 * p + y2] += 1
    statistic = stats.chisquare(counts).statistic
    assert statistic < stats.chi2.isf(1e-6, p * p - 1)


def test_t_minus_1_shares_are_consistent_with_any_other_secret():
    # For the real field: t - 1 shares of one secret, plus a suitable t-th share, reconstruct to
    # any other secret we like, so the t - 1 shares cannot pin the secret down.
    rng = random.Random(9)
    t, xs = 5, [3, 10, 11, 40, 41, 57]
    known = dict(list(shares_of(rng.randbytes(32), xs, t).items())[: t - 1])
    extra_x = xs[-1]
    for target in (bytes(32), rng.randbytes(32), b"\xff" * 32):
        points = [(0, int.from_bytes(target, "big"))] + [(x, int.from_bytes(v, "big")) for x, v in known.items()]
        extra = ref_interpolate(points, extra_x).to_bytes(SHARE_BYTES, "big")
        assert combine_shares({**known, extra_x: extra}, t) == target


# ------------------------------------------------------------------------------ determinism


def test_same_entropy_same_shares_other_entropy_other_shares():
    secret, xs = bytes(range(32)), [1, 3, 5, 7, 9]
    first = split_secret(secret, xs, 3, entropy("a"))
    assert split_secret(secret, xs, 3, entropy("a")) == first
    assert split_secret(secret, xs, 3, entropy("b")) != first
    # The share of a point does not depend on the other points or their order.
    assert split_secret(secret, xs[::-1], 3, entropy("a")) == first[::-1]
    assert split_secret(secret, [5, 1000, 1001], 3, entropy("a"))[0] == first[2]


def test_reused_entropy_gives_unrelated_polynomials_for_different_secrets():
    # With equal coefficients, share differences would all equal the secrets' difference.
    xs, e = [1, 2, 3, 4], entropy("reuse")
    s1, s2 = bytes(32), (1).to_bytes(32, "big")
    a = [int.from_bytes(v, "big") for v in split_secret(s1, xs, 3, e)]
    b = [int.from_bytes(v, "big") for v in split_secret(s2, xs, 3, e)]
    assert len({(y2 - y1) % P for y1, y2 in zip(a, b, strict=True)}) > 1


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"secret": bytes(31)}, ValueError, "secret must be 32 bytes, got 31"),
        ({"secret": bytes(33)}, ValueError, "secret must be 32 bytes, got 33"),
        ({"secret": "x" * 32}, TypeError, "secret must be bytes"),
        ({"entropy": bytes(31)}, ValueError, "entropy must be at least 32 bytes"),
        ({"entropy": 5}, TypeError, "entropy must be bytes"),
        ({"xs": [1, 0, 2]}, ValueError, r"xs\[1\] = 0 is not an evaluation point"),
        ({"xs": [1, P, 2]}, ValueError, r"xs\[1\] = .* is not an evaluation point"),
        ({"xs": [1, -4, 2]}, ValueError, r"xs\[1\] = -4"),
        ({"xs": [1, 2, 1]}, ValueError, "evaluation point 1 twice"),
        ({"xs": [1, 2.0, 3]}, TypeError, r"xs\[1\] must be an int"),
        ({"xs": {1, 2, 3}}, TypeError, "xs must be a sequence"),
        ({"xs": b"\x01\x02\x03"}, TypeError, "xs must be a sequence"),
        ({"threshold": 0}, ValueError, "threshold must be >= 1"),
        ({"threshold": 4}, ValueError, "threshold 4 exceeds the number of shares 3"),
        ({"threshold": True}, TypeError, "threshold must be an int"),
    ],
)
def test_split_secret_errors(kwargs, error, match):
    args = {"secret": bytes(32), "xs": [1, 2, 3], "threshold": 2, "entropy": bytes(32)} | kwargs
    with pytest.raises(error, match=match):
        split_secret(**args)


def _valid_shares() -> dict[int, bytes]:
    return shares_of(bytes(range(32)), [2, 4, 6, 8], 3)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda s: {x: s[x] for x in (2, 4)}, ValueError, "2 shares given, but the threshold is 3"),
        (lambda s: s | {2: s[2][:-1]}, ValueError, "the share for x = 2 is 32 bytes, expected 33"),
        (lambda s: s | {4: s[4] + b"\x00"}, ValueError, "the share for x = 4 is 34 bytes, expected 33"),
        (lambda s: s | {2: P.to_bytes(33, "big")}, ValueError, "the share for x = 2 is not a field element"),
        (lambda s: s | {6: b"\xff" * 33}, ValueError, "the share for x = 6 is not a field element"),
        (lambda s: s | {2: "abc"}, TypeError, "the share for x = 2 must be bytes"),
        (lambda s: s | {0: s[2]}, ValueError, "evaluation point 0 is not in"),
        (lambda s: s | {P: s[2]}, ValueError, r"evaluation point \d+ is not in \[1, p\)"),
        (lambda s: s | {2.5: s[2]}, TypeError, "evaluation point must be an int"),
        (lambda s: s | {True: s[2]}, TypeError, "evaluation point must be an int"),
        (lambda s: list(s.items()), TypeError, "shares must be a mapping"),
    ],
)
def test_combine_errors(change, error, match):
    bad = change(_valid_shares())
    with pytest.raises(error, match=match):
        combine_shares(bad, 3)
    with pytest.raises(error, match=r"items\[1\]: " + match):
        combine_many([_valid_shares(), bad], 3)


def test_inconsistent_shares_whose_reconstruction_is_not_32_bytes_are_refused():
    # A "secret" in [2^256, p) shared with the module's own sampler and evaluator.
    xs = [1, 2, 3, 4]
    coefficients = shamir._coefficients(2**256 + 5, 3, entropy("big"), P)
    shares = {x: y.to_bytes(SHARE_BYTES, "big") for x, y in zip(xs, shamir._evaluate(coefficients, xs, P), strict=True)}
    with pytest.raises(ValueError, match="inconsistent shares: the reconstruction is >= 2\\^256"):
        combine_shares(shares, 3)
    with pytest.raises(ValueError, match=r"items\[0\]: inconsistent shares"):
        combine_many([shares], 3)


@pytest.mark.parametrize(
    ("items", "threshold", "error", "match"),
    [
        ({1: bytes(33)}, 1, TypeError, "items must be a sequence of share mappings"),
        ("abc", 1, TypeError, "items\\[0\\]: shares must be a mapping"),
        ([{1: bytes(33)}], 0, ValueError, "threshold must be >= 1"),
        ([{1: bytes(33)}], 1.0, TypeError, "threshold must be an int"),
    ],
)
def test_combine_many_argument_errors(items, threshold, error, match):
    with pytest.raises(error, match=match):
        combine_many(items, threshold)

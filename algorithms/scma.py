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

Where each part lives (this module only gathers the public names):

* :mod:`fedproto.algorithms._scma_field`: the prime and its elements (`field_prime`,
  `field_width`, `uniform_elements`), the packed wire form (`pack_elements`, `unpack_elements`,
  `check_packed`, `PackedSums`) and `SyndromeDecodingError`;
* :mod:`fedproto.algorithms._scma_encoding`: a client's syndromes (`rs_syndromes`, `bin_powers`,
  `update_syndromes`, `mask_syndromes`) and the masks (`dealer_masks`, `pairwise_seed`,
  `pairwise_masks`);
* :mod:`fedproto.algorithms._scma_decoding`: the server's sums (`aggregate_syndromes`,
  `aggregate_packed`, `sum_packed`) and decoding (`error_locator`, `field_roots`,
  `decode_syndromes`, `decode_update`).
"""

from __future__ import annotations

from fedproto.algorithms._scma_decoding import (
    aggregate_packed,
    aggregate_syndromes,
    decode_syndromes,
    decode_update,
    error_locator,
    field_roots,
    sum_packed,
)
from fedproto.algorithms._scma_encoding import (
    bin_powers,
    dealer_masks,
    mask_syndromes,
    pairwise_masks,
    pairwise_seed,
    rs_syndromes,
    update_syndromes,
)
from fedproto.algorithms._scma_field import (
    PROVEN_PRIME_BITS,
    PackedSums,
    SyndromeDecodingError,
    check_packed,
    field_prime,
    field_width,
    pack_elements,
    uniform_elements,
    unpack_elements,
)

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
    "decode_update",
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

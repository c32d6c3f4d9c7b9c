"""SecAgg+'s public parameters: the algebra an aggregation sums in and the neighbourhood graph.

* :class:`Modulus`: the ring ``Z_{2^w}`` (``w`` = 32 or 64, FastLloyd's fixed point) or the prime
  field ``F_p`` (MUFC's syndromes): vectors, masks and their wire form;
* :class:`SecAggPlusConfig`: the clients, the vector length, the algebra, the degree ``k`` and
  the threshold ``t`` of the graph, the same for every party; :func:`plus_config` (Bell et al.'s
  sparse graph) and :func:`complete_config` (classic SecAgg) choose ``k`` and ``t``;
* :func:`session_config` and :func:`check_fits`: what a protocol embedding SecAgg+ (FastLloyd,
  MUFC) derives from its run's public values, and its check of parameters handed to it.

The stage engines that run an aggregation under them are in
:mod:`fedproto.algorithms.secagg_plus.engine`, which re-exports these names.

References:
    Bonawitz et al., ACM CCS 2017, Sec. 4. Bell et al., ACM CCS 2020, Sec. 3-4.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import operator
from collections.abc import Sequence

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from fedproto.algorithms import scma, secagg
from fedproto.algorithms._scma_field import _is_prime
from fedproto.algorithms.secagg_plus import graph

__all__ = ["Modulus", "SecAggPlusConfig", "check_fits", "complete_config", "plus_config", "session_config"]

_UINT64_FIELD_LIMIT = 1 << 63  # primes below this are summed in uint64 without overflow


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value



_ZERO_NONCE = bytes(12)
_LITTLE_ENDIAN = {32: np.dtype("<u4"), 64: np.dtype("<u8")}


def _keystream(key: bytes, n_bytes: int) -> bytes:
    """``n_bytes`` of the ChaCha20 keystream of ``key`` with the zero nonce, from block 1 on
    (RFC 8439: block 0 is the one its AEAD keeps for the Poly1305 key).

    Every key is derived for one (aggregation, purpose, pair) and used for one stream, so the
    zero nonce is safe. The keystream is ChaCha20-Poly1305's encryption of zeros less its tag:
    the same bytes as a bare ChaCha20 cipher at block 1, in a third of the time (one call into
    `cryptography` instead of four)."""
    return ChaCha20Poly1305(key).encrypt(_ZERO_NONCE, bytes(n_bytes), None)[:n_bytes]



# --------------------------------------------------------------------------------------------
# Vectors: a ring Z_{2^w} or a prime field F_p
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Modulus:
    """The algebra an aggregation sums in: the ring ``Z_{2^w}`` or the prime field ``F_p``.

    Build one with :meth:`ring` or :meth:`field`. Vectors are 1-D numpy arrays: ``uint32`` or
    ``uint64`` for the ring (numpy's wrap-around is the ring's addition), ``uint64`` for a prime
    below ``2^63`` and ``object`` (Python ints) for a larger prime.

    Attributes:
        ring_bits: ``w`` for the ring, else ``None``.
        prime: ``p`` for the field, else ``None``.
    """

    ring_bits: int | None = None
    prime: int | None = None

    def __post_init__(self) -> None:
        if (self.ring_bits is None) == (self.prime is None):
            raise ValueError("a Modulus is either a ring (ring_bits) or a prime field (prime), not both or neither")
        if self.ring_bits is not None:
            secagg.ring_dtype(self.ring_bits)
        else:
            p = _check_int("prime", self.prime, 2)
            if not _is_prime(p):
                raise ValueError(f"prime must be a prime number, got {p}")

    @classmethod
    def ring(cls, ring_bits: int) -> Modulus:
        """The ring ``Z_{2^ring_bits}`` (``ring_bits`` = 32 or 64)."""
        return cls(ring_bits=ring_bits)

    @classmethod
    def field(cls, prime: int) -> Modulus:
        """The prime field ``F_prime``.

        Raises:
            ValueError: ``prime`` is not a prime >= 2.
        """
        return cls(prime=prime)

    @property
    def size(self) -> int:
        """The number of elements: ``2^w`` or ``p``."""
        return 1 << self.ring_bits if self.ring_bits is not None else int(self.prime)

    @property
    def width(self) -> int:
        """Bytes per element on the wire: ``w / 8`` or ``ceil(bitlength(p) / 8)``."""
        return self.ring_bits // 8 if self.ring_bits is not None else scma.field_width(self.prime)

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype of a vector."""
        if self.ring_bits is not None:
            return secagg.ring_dtype(self.ring_bits)
        return np.dtype(np.uint64) if self.prime < _UINT64_FIELD_LIMIT else np.dtype(object)

    def describe(self) -> str:
        """``"Z_2^32"``, ``"Z_2^64"`` or ``"F_p (b bits)"``."""
        return f"Z_2^{self.ring_bits}" if self.ring_bits is not None else f"F_p ({self.prime.bit_length()} bits)"

    def zeros(self, length: int) -> np.ndarray:
        """The zero vector ``[length]``."""
        return np.zeros(length, dtype=self.dtype) if self.dtype != object else np.array([0] * length, dtype=object)

    def vector(self, values: object, length: int | None = None) -> np.ndarray:
        """``values`` as a vector of this algebra (a copy), checked.

        Args:
            values: ``[L]`` integers in ``[0, size)``.
            length: the expected ``L``, if any.

        Raises:
            ValueError: wrong length, not 1-D, or an element outside ``[0, size)``.
            TypeError: non-integer values.
        """
        if isinstance(values, np.ndarray) and values.dtype.kind in "ui" and self.dtype != object:
            if values.ndim != 1:
                raise ValueError(f"a vector must be 1-D, got shape {values.shape}")
            if values.size and (int(values.min()) < 0 or int(values.max()) >= self.size):
                raise ValueError(f"vector elements must lie in [0, {self.size}) for {self.describe()}")
            arr = values.astype(self.dtype)
        else:
            objects = np.asarray(values, dtype=object)
            if objects.ndim != 1:
                raise ValueError(f"a vector must be 1-D, got shape {objects.shape}")
            try:
                ints = [operator.index(v) for v in objects]
            except TypeError:
                raise TypeError("vector elements must be integers") from None
            if any(v < 0 or v >= self.size for v in ints):
                raise ValueError(f"vector elements must lie in [0, {self.size}) for {self.describe()}")
            arr = np.array(ints, dtype=self.dtype)
        if length is not None and arr.shape[0] != length:
            raise ValueError(f"the vector has {arr.shape[0]} elements, the aggregation sums {length}")
        return arr

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a + b`` element-wise in the algebra (a new array)."""
        if self.ring_bits is not None:
            return a + b
        s = a + b
        if self.dtype == object:
            return s % self.prime
        return np.where(s >= self.prime, s - np.uint64(self.prime), s)

    def sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a - b`` element-wise in the algebra (a new array)."""
        if self.ring_bits is not None:
            return a - b
        if self.dtype == object:
            return (a - b) % self.prime
        return np.where(a >= b, a - b, a + (np.uint64(self.prime) - b))

    def expand(self, key: bytes, length: int) -> np.ndarray:
        """``length`` independent uniform elements from a 32-byte key (ChaCha20 keystream).

        The ring reads little-endian ``w``-bit words; the field rejection-samples
        (:func:`fedproto.algorithms.scma.uniform_elements`), so both are exactly uniform.
        """
        return self.expand_sum([key], [], length)

    def expand_sum(self, plus: Sequence[bytes], minus: Sequence[bytes], length: int) -> np.ndarray:
        """``sum_{key in plus} expand(key) - sum_{key in minus} expand(key)``, ``[length]``.

        In the ring every keystream is read in one NumPy call (a client's pairwise masks: one
        row per neighbour, summed with wrap-around); the field adds its expansions one by one.
        """
        if self.ring_bits is not None:
            width, little = self.width, _LITTLE_ENDIAN[self.ring_bits]
            n_bytes = length * width
            stream = b"".join(_keystream(key, n_bytes) for key in (*plus, *minus))
            rows = np.frombuffer(stream, dtype=little).reshape(len(plus) + len(minus), length).astype(self.dtype)
            return rows[: len(plus)].sum(axis=0, dtype=self.dtype) - rows[len(plus) :].sum(axis=0, dtype=self.dtype)
        total = self.zeros(length)
        for key in plus:
            total = self.add(total, self.vector(scma.uniform_elements(key, self.prime, length)))
        for key in minus:
            total = self.sub(total, self.vector(scma.uniform_elements(key, self.prime, length)))
        return total

    def to_wire(self, vector: np.ndarray) -> np.ndarray:
        """The wire form: ``[L, 1]`` ring elements or ``uint8 [L, width]`` big-endian rows."""
        if self.ring_bits is not None:
            return np.ascontiguousarray(vector.reshape(-1, 1))
        if self.dtype == object:
            return scma.pack_elements([int(v) for v in vector], self.prime)
        width = self.width
        rows = vector.astype(">u8").view(np.uint8).reshape(-1, 8)
        return np.ascontiguousarray(rows[:, 8 - width :])

    def from_wire(self, wire: np.ndarray, length: int) -> np.ndarray:
        """A vector from its wire form, checked (shape, dtype, every element below ``size``).

        Raises:
            ValueError: wrong shape or dtype, or an element outside the algebra.
        """
        if self.ring_bits is not None:
            if wire.dtype != self.dtype or wire.shape != (length, 1):
                raise ValueError(
                    f"expected {self.describe()} elements as {self.dtype} [{length}, 1], "
                    f"got {wire.dtype} {list(wire.shape)}"
                )
            return wire.reshape(-1).astype(self.dtype)
        width = self.width
        if wire.dtype != np.uint8 or wire.shape != (length, width):
            raise ValueError(f"expected {self.describe()} elements as uint8 [{length}, {width}], got {wire.dtype} {list(wire.shape)}")
        if self.dtype == object:
            values = scma.unpack_elements(wire)
        else:
            padded = np.zeros((length, 8), dtype=np.uint8)
            padded[:, 8 - width :] = wire
            values = padded.view(">u8").reshape(-1).astype(np.uint64)
        return self.vector(values, length)


# --------------------------------------------------------------------------------------------
# Public parameters
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SecAggPlusConfig:
    """The public parameters of a SecAgg+ aggregation, the same for every party.

    Attributes:
        n_clients: ``n``, the clients the graph is drawn over (indices ``0..n-1``).
        vector_length: ``L``, elements per input.
        modulus: the ring or field (:class:`Modulus`).
        degree: ``k``, neighbours per client (``n - 1``: the complete graph, classic SecAgg).
        threshold: ``t``, shares that reconstruct a secret (``1 <= t <= k``).
        graph_seed: 32 bytes of public randomness the graph is drawn from.

    Raises:
        ValueError: a size out of range (``n >= 2``, ``L >= 1``, ``2 <= k <= n - 1``,
            ``1 <= t <= k``) or a seed that is not 32 bytes.
    """

    n_clients: int
    vector_length: int
    modulus: Modulus
    degree: int
    threshold: int
    graph_seed: bytes = bytes(32)

    def __post_init__(self) -> None:
        n = _check_int("n_clients", self.n_clients, 2)
        _check_int("vector_length", self.vector_length, 1)
        if not isinstance(self.modulus, Modulus):
            raise TypeError(f"modulus must be a Modulus, got {type(self.modulus).__name__}")
        k = _check_int("degree", self.degree, 1)
        if k > n - 1:
            raise ValueError(f"degree must be at most n_clients - 1 = {n - 1}, got {k}")
        t = _check_int("threshold", self.threshold, 1)
        if t > k:
            raise ValueError(f"threshold must be at most the degree {k}, got {t}")
        if not isinstance(self.graph_seed, bytes) or len(self.graph_seed) != 32:
            raise ValueError("graph_seed must be 32 bytes")

    @property
    def complete(self) -> bool:
        """True for the complete graph (classic SecAgg)."""
        return self.degree == self.n_clients - 1

    @functools.cached_property
    def neighbours(self) -> tuple[tuple[int, ...], ...]:
        """Each client's neighbours, sorted client indices (computed once)."""
        return graph.neighbourhoods(self.n_clients, self.degree, self.graph_seed)


def plus_config(
    n_clients: int,
    vector_length: int,
    modulus: Modulus,
    *,
    graph_seed: bytes = bytes(32),
    failure_log2: float = 40.0,
    corrupt_fraction: float = 0.2,
    dropout_fraction: float = 0.1,
) -> SecAggPlusConfig:
    """SecAgg+ parameters: a random ``k``-regular graph with Bell et al.'s ``(k, t)``.

    ``k`` and ``t`` come from :func:`~fedproto.algorithms.secagg_plus.graph.plus_parameters` for
    the stated failure probability ``2^-failure_log2``, fraction of corrupt clients and fraction
    of dropouts. Where ``n`` is too small for any graph to meet them, classic SecAgg's complete
    graph and threshold (:func:`complete_config`): with few clients, the bounds cannot hold.

    References:
        Bell et al., ACM CCS 2020, Sec. 3-4.
    """
    try:
        k, t = graph.plus_parameters(
            n_clients, failure_log2=failure_log2, corrupt_fraction=corrupt_fraction, dropout_fraction=dropout_fraction
        )
    except ValueError:
        # Too few clients for the statistical bounds: every client is every other's neighbour.
        k, t = graph.complete_parameters(n_clients)
    return SecAggPlusConfig(n_clients, vector_length, modulus, k, t, graph_seed)


def complete_config(n_clients: int, vector_length: int, modulus: Modulus, *, graph_seed: bytes = bytes(32), **bounds: float) -> SecAggPlusConfig:
    """Classic SecAgg: the complete graph, ``t`` from
    :func:`~fedproto.algorithms.secagg_plus.graph.complete_parameters`.

    References:
        Bonawitz et al., ACM CCS 2017, Sec. 4.
    """
    k, t = graph.complete_parameters(n_clients, **bounds)
    return SecAggPlusConfig(n_clients, vector_length, modulus, k, t, graph_seed)


def session_config(
    kind: str, n_clients: int, vector_length: int, modulus: Modulus, *, graph_label: bytes, session: int
) -> SecAggPlusConfig:
    """The SecAgg+ parameters of one run of a protocol that embeds SecAgg+, from public values
    only, so that every party derives the same ones without a message.

    The graph seed is ``SHA-256(graph_label || session)`` (the session id as 8 big-endian bytes):
    one graph per run, a different one per protocol and per session.

    Args:
        kind: ``"plus"`` (:func:`plus_config`: a random k-regular graph with Bell et al.'s
            ``(k, t)``, the complete graph where ``n_clients`` is too small for their bounds) or
            ``"complete"`` (:func:`complete_config`: classic SecAgg).
        n_clients: the run's clients ``n``.
        vector_length: elements per client input ``L``.
        modulus: the algebra of the inputs.
        graph_label: the protocol's label for its graph seeds (e.g.
            ``b"fedproto/mufc/secagg-graph"``).
        session: the run's session id, ``0 <= session < 2^64``.

    Raises:
        ValueError: another ``kind``, fewer than 2 clients, or sizes :class:`SecAggPlusConfig`
            refuses.

    References:
        Bell et al., ACM CCS 2020, Sec. 3-4; Bonawitz et al., ACM CCS 2017, Sec. 4.
    """
    if kind not in ("plus", "complete"):
        raise ValueError(f"SecAgg+ parameters are 'plus' or 'complete', got {kind!r}")
    if n_clients < 2:
        raise ValueError(f"SecAgg+ needs at least 2 clients, the run has {n_clients}")
    seed = hashlib.sha256(graph_label + session.to_bytes(8, "big")).digest()
    build = plus_config if kind == "plus" else complete_config
    return build(n_clients, vector_length, modulus, graph_seed=seed)


def check_fits(
    secagg_plus: SecAggPlusConfig | None, modulus: Modulus, n_clients: int, vector_length: int, *, length_name: str
) -> None:
    """Refuse SecAgg+ parameters that do not fit a run (``None``, no SecAgg+, always fits).

    Args:
        secagg_plus: the parameters handed to a party of the run.
        modulus: the algebra of the run's inputs.
        n_clients: the run's clients.
        vector_length: elements per client input.
        length_name: how the protocol names its input length in the error, e.g. ``"k (d+1)"``.

    Raises:
        TypeError: ``secagg_plus`` is neither ``None`` nor a :class:`SecAggPlusConfig`.
        ValueError: another algebra, another vector length or another client count.
    """
    if secagg_plus is None:
        return
    if not isinstance(secagg_plus, SecAggPlusConfig):
        raise TypeError(f"secagg_plus must be a SecAggPlusConfig or None, got {type(secagg_plus).__name__}")
    if secagg_plus.modulus != modulus:
        raise ValueError(f"SecAgg+ sums in {secagg_plus.modulus.describe()}, the run in {modulus.describe()}")
    if secagg_plus.vector_length != vector_length or secagg_plus.n_clients != n_clients:
        raise ValueError(
            f"SecAgg+ is configured for {secagg_plus.n_clients} clients and vectors of {secagg_plus.vector_length}; "
            f"the run has {n_clients} clients and vectors of {length_name} = {vector_length}"
        )

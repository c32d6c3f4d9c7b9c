"""FastLloyd's wire messages (spec fastlloyd.md, sections 2.8 and 6).

Setup of the federation's public quantities (phase ``setup.data``, only when each party holds
its own raw data; metered as setup):

* :class:`DataSummary` client -> server: the client's number of points n_i and per-feature
  minimum and maximum, ``float64 [2, d]``;
* :class:`FederationSummary` server -> every client: the total N and the federation's
  per-feature minimum and maximum, ``float64 [2, d]``.

Setup (key agreement for the clients' shared mask seed; metered as setup):

* :class:`PublicKey` client -> server: the client's X25519 public key;
* :class:`PublicKeys` server -> client 0: every client's key, in client order;
* :class:`SealedSeeds` client 0 -> server: the mask seed sealed for each client 1..M-1;
* :class:`SealedSeed` server -> client i: client 0's key and the seed sealed for client i.

Each Lloyd iteration (one round trip):

* :class:`MaskedUpdate` client -> server: ``[k, d+1]`` ring elements: fixed-point relative (or
  absolute) sums in columns ``0..d-1`` and counts in column ``d``, plus the client's mask;
* :class:`NoisyAggregate` server -> every client: the sum of the masked updates plus the server's
  quantised noise, still masked.

With ``--secagg plus`` an iteration is one SecAgg+ aggregation
(:mod:`fedproto.algorithms.secagg_plus.messages`: four stages, the update travels in its
``MaskedInput``), and the server answers with :class:`SurvivorAggregate`, which also names the
clients whose updates the sum holds.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedproto.messages import Message, array_field

__all__ = [
    "DataSummary",
    "FederationSummary",
    "PublicKey", "PublicKeys", "SealedSeeds", "SealedSeed", "MaskedUpdate", "NoisyAggregate", "SurvivorAggregate"]

_KEY_BYTES = 32
_SEALED_BYTES = 48  # a 32-byte seed plus the 16-byte Poly1305 tag


def _check_key(key: bytes, what: str) -> None:
    if not isinstance(key, bytes) or len(key) != _KEY_BYTES:
        raise ValueError(f"{what} must be {_KEY_BYTES} bytes")


def _check_extent(n_points: int, extent: np.ndarray, *, empty_allowed: bool) -> None:
    if not isinstance(n_points, int) or isinstance(n_points, bool) or n_points < (0 if empty_allowed else 1):
        raise ValueError(f"n_points must be an int >= {0 if empty_allowed else 1}, got {n_points!r}")
    if extent.ndim != 2 or extent.shape[0] != 2 or extent.shape[1] < 1:
        raise ValueError(f"extent must have shape [2, d] with d >= 1, got {extent.shape}")
    if n_points == 0:
        # the identities of min and max: what the extent of no points is
        if not (np.all(extent[0] == np.inf) and np.all(extent[1] == -np.inf)):
            raise ValueError("the extent of no points must be [+inf, -inf] per feature")
        return
    if not np.all(np.isfinite(extent)):
        raise ValueError("extent holds NaN or infinite values")
    if np.any(extent[0] > extent[1]):
        raise ValueError("extent has a minimum above its maximum")


def _check_ring(values: np.ndarray, what: str) -> None:
    if values.ndim != 2 or values.shape[1] < 2 or values.shape[0] < 1:
        raise ValueError(f"{what} must have shape [k, d+1] with k >= 1 and d >= 1, got {values.shape}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSummary(Message):
    """A client's share of the federation's public quantities (client -> server, ``setup.data``).

    Attributes:
        n_points: the client's number of points n_i (>= 0).
        extent: ``float64 [2, d]``: row 0 the per-feature minimum of the client's raw points,
            row 1 the maximum (:func:`fedproto.data.feature_extent`); ``+inf`` and ``-inf``
            when ``n_points`` is 0.
    """

    TAG = "fl.data"
    n_points: int
    extent: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        _check_extent(self.n_points, self.extent, empty_allowed=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FederationSummary(Message):
    """The federation's public quantities (server -> every client, ``setup.data``).

    Attributes:
        n_points: the total number of points N (the sum of the clients' n_i, >= 1).
        extent: ``float64 [2, d]``: the element-wise minimum of the clients' minima (row 0) and
            maximum of their maxima (row 1), the extent of the pooled data, by which each client
            normalises its own points (:func:`fedproto.data.normalize`).
    """

    TAG = "fl.fed"
    n_points: int
    extent: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        _check_extent(self.n_points, self.extent, empty_allowed=False)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PublicKey(Message):
    """A client's X25519 public key (32 bytes)."""

    TAG = "fl.pk"
    public_key: bytes

    def __post_init__(self) -> None:
        _check_key(self.public_key, "public_key")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PublicKeys(Message):
    """Every client's public key, in client order (server -> client 0)."""

    TAG = "fl.pks"
    public_keys: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not self.public_keys:
            raise ValueError("public_keys is empty")
        for key in self.public_keys:
            _check_key(key, "each public key")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SealedSeeds(Message):
    """The mask seed sealed for clients 1..M-1, in client order (client 0 -> server)."""

    TAG = "fl.sealed"
    sealed: tuple[bytes, ...]

    def __post_init__(self) -> None:
        for item in self.sealed:
            if not isinstance(item, bytes) or len(item) != _SEALED_BYTES:
                raise ValueError(f"each sealed seed must be {_SEALED_BYTES} bytes")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SealedSeed(Message):
    """Client 0's public key and the seed sealed for the receiving client (server -> client i)."""

    TAG = "fl.seed"
    sender_key: bytes
    sealed: bytes

    def __post_init__(self) -> None:
        _check_key(self.sender_key, "sender_key")
        if not isinstance(self.sealed, bytes) or len(self.sealed) != _SEALED_BYTES:
            raise ValueError(f"sealed must be {_SEALED_BYTES} bytes")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MaskedUpdate(Message):
    """One client's masked fixed-point statistics, ``uint32`` or ``uint64`` ``[k, d+1]``."""

    TAG = "fl.update"
    masked: np.ndarray = array_field(("uint32", "uint64"), 2)

    def __post_init__(self) -> None:
        _check_ring(self.masked, "masked")


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoisyAggregate(Message):
    """Sum of the masked updates plus quantised noise, ``uint32`` or ``uint64`` ``[k, d+1]``."""

    TAG = "fl.agg"
    masked: np.ndarray = array_field(("uint32", "uint64"), 2)

    def __post_init__(self) -> None:
        _check_ring(self.masked, "masked")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SurvivorAggregate(Message):
    """With ``--secagg plus``: the survivors' masked sum plus quantised noise, ``uint32`` or
    ``uint64`` ``[k, d+1]``, and the client indices whose updates it holds (``uint32 [m]``,
    increasing), so each client removes exactly their shared-seed masks."""

    TAG = "fl.agg+"
    masked: np.ndarray = array_field(("uint32", "uint64"), 2)
    survivors: np.ndarray = array_field("uint32", 1)

    def __post_init__(self) -> None:
        _check_ring(self.masked, "masked")
        if self.survivors.ndim != 1 or self.survivors.size == 0:
            raise ValueError("survivors must be a non-empty 1-D array of client indices")
        if self.survivors.size > 1 and not bool(np.all(self.survivors[1:] > self.survivors[:-1])):
            raise ValueError("survivors must be strictly increasing client indices")

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
(:mod:`fedproto.algorithms.secagg_plus.messages`: the keys agreed once, in the first iteration,
then two stages per iteration; the update travels in its ``MaskedInput``), and the server answers
with :class:`SurvivorAggregate`, which also names the clients whose updates the sum does not hold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from fedproto.data import check_extent
from fedproto.messages import Message, array_field

if TYPE_CHECKING:
    from fedproto.algorithms.secagg_plus.config import SecAggPlusConfig

__all__ = [
    "DataSummary",
    "FederationSummary",
    "PublicKey", "PublicKeys", "SealedSeeds", "SealedSeed", "MaskedUpdate", "NoisyAggregate", "SurvivorAggregate",
    "frame_bound",
]

_KEY_BYTES = 32
_SEALED_BYTES = 48  # a 32-byte seed plus the 16-byte Poly1305 tag


def _check_key(key: bytes, what: str) -> None:
    if not isinstance(key, bytes) or len(key) != _KEY_BYTES:
        raise ValueError(f"{what} must be {_KEY_BYTES} bytes")


class _Summary(Message):
    """Base of the two ``setup.data`` messages: a number of points and the per-feature extent of
    those points, ``float64 [2, d]`` (row 0 the minima, row 1 the maxima). It has no tag: it is
    never sent itself.

    Raises:
        ValueError: ``n_points`` not an int (>= 0 where ``EMPTY_ALLOWED``, else >= 1), an extent
            that is not ``[2, d]`` with ``d >= 1``, holds NaN or inf (but for the ``[+inf, -inf]``
            of no points), or has a minimum above its maximum.
    """

    EMPTY_ALLOWED: ClassVar[bool] = False
    n_points: int
    extent: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        n_points, extent, least = self.n_points, self.extent, 0 if self.EMPTY_ALLOWED else 1
        if not isinstance(n_points, int) or isinstance(n_points, bool) or n_points < least:
            raise ValueError(f"n_points must be an int >= {least}, got {n_points!r}")
        check_extent(extent, empty=n_points == 0)


class DataSummary(_Summary, tag="fl.data"):
    """A client's share of the federation's public quantities (client -> server, ``setup.data``).

    Attributes:
        n_points: the client's number of points n_i (>= 0).
        extent: ``float64 [2, d]``: row 0 the per-feature minimum of the client's raw points,
            row 1 the maximum (:func:`fedproto.data.feature_extent`); ``+inf`` and ``-inf``
            when ``n_points`` is 0.
    """

    EMPTY_ALLOWED = True


class FederationSummary(_Summary, tag="fl.fed"):
    """The federation's public quantities (server -> every client, ``setup.data``).

    Attributes:
        n_points: the total number of points N (the sum of the clients' n_i, >= 1).
        extent: ``float64 [2, d]``: the element-wise minimum of the clients' minima (row 0) and
            maximum of their maxima (row 1), the extent of the pooled data, by which each client
            normalises its own points (:func:`fedproto.data.normalize`).
    """



class PublicKey(Message, tag="fl.pk"):
    """A client's X25519 public key (32 bytes)."""

    public_key: bytes

    def __post_init__(self) -> None:
        _check_key(self.public_key, "public_key")


class PublicKeys(Message, tag="fl.pks"):
    """Every client's public key, in client order (server -> client 0)."""

    public_keys: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not self.public_keys:
            raise ValueError("public_keys is empty")
        for key in self.public_keys:
            _check_key(key, "each public key")


class SealedSeeds(Message, tag="fl.sealed"):
    """The mask seed sealed for clients 1..M-1, in client order (client 0 -> server)."""

    sealed: tuple[bytes, ...]

    def __post_init__(self) -> None:
        for item in self.sealed:
            if not isinstance(item, bytes) or len(item) != _SEALED_BYTES:
                raise ValueError(f"each sealed seed must be {_SEALED_BYTES} bytes")


class SealedSeed(Message, tag="fl.seed"):
    """Client 0's public key and the seed sealed for the receiving client (server -> client i)."""

    sender_key: bytes
    sealed: bytes

    def __post_init__(self) -> None:
        _check_key(self.sender_key, "sender_key")
        if not isinstance(self.sealed, bytes) or len(self.sealed) != _SEALED_BYTES:
            raise ValueError(f"sealed must be {_SEALED_BYTES} bytes")


class _RingStatistics(Message):
    """Base of the messages carrying ``[k, d+1]`` statistics in the ring (``uint32`` or ``uint64``
    for ``Z_2^32``/``Z_2^64``): fixed-point sums in columns ``0..d-1``, counts in column ``d``.
    It has no tag: it is never sent itself.

    Raises:
        ValueError: ``masked`` is not ``[k, d+1]`` with ``k >= 1`` and ``d >= 1``.
    """

    masked: np.ndarray = array_field(("uint32", "uint64"), 2)

    def __post_init__(self) -> None:
        if self.masked.ndim != 2 or self.masked.shape[1] < 2 or self.masked.shape[0] < 1:
            raise ValueError(f"masked must have shape [k, d+1] with k >= 1 and d >= 1, got {self.masked.shape}")


class MaskedUpdate(_RingStatistics, tag="fl.update"):
    """One client's masked fixed-point statistics, ``uint32`` or ``uint64`` ``[k, d+1]``."""



class NoisyAggregate(_RingStatistics, tag="fl.agg"):
    """Sum of the masked updates plus quantised noise, ``uint32`` or ``uint64`` ``[k, d+1]``."""



class SurvivorAggregate(_RingStatistics, tag="fl.agg+"):
    """With ``--secagg plus``: the survivors' masked sum plus quantised noise, ``uint32`` or
    ``uint64`` ``[k, d+1]``, and the client indices whose updates it does *not* hold (``uint32
    [D]``, increasing: the clients that dropped in this or an earlier iteration), so each client
    removes exactly the survivors' shared-seed masks. Naming the dropped clients rather than the
    survivors keeps the message ``O(D)`` bytes, ``O(1)`` when no one drops, whatever the number of
    clients (issue 34)."""

    dropped: np.ndarray = array_field("uint32", 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dropped.ndim != 1:
            raise ValueError("dropped must be a 1-D array of client indices")
        if self.dropped.size > 1 and not bool(np.all(self.dropped[1:] > self.dropped[:-1])):
            raise ValueError("dropped must be strictly increasing client indices")


def frame_bound(k: int, d: int, ring_bits: int, n_clients: int, plus: SecAggPlusConfig | None = None) -> int:
    """The largest frame (bytes, envelope included) any party of a FastLloyd run sends.

    ``setup.data`` sends ``float64 [2, d]`` extents and a count each way; the key setup sends
    32-byte keys (every client's to client 0) and 48-byte sealed seeds (client 0's for the other
    ``M - 1`` clients); each iteration sends ``[k, d+1]`` ring elements of ``w / 8`` bytes each
    way, or with SecAgg+ (``plus``) its stages' messages
    (:func:`fedproto.algorithms.secagg_plus.messages.frame_limit`) and a
    :class:`SurvivorAggregate` naming up to ``n_clients - 1`` dropped clients.

    Args:
        k: clusters. d: features. ring_bits: the ring width w (32 or 64).
        n_clients: clients M.
        plus: the run's SecAgg+ parameters, ``None`` for MSA.
    """
    from fedproto.algorithms.secagg import ring_dtype
    from fedproto.framesize import max_frame_bytes

    key, sealed = bytes(_KEY_BYTES), bytes(_SEALED_BYTES)
    ring = {"masked": (k, d + 1)}
    dtype = {"masked": ring_dtype(ring_bits)}
    extent = {"extent": (2, d)}
    limit = max(
        max_frame_bytes(DataSummary, arrays=extent),
        max_frame_bytes(FederationSummary, arrays=extent),
        max_frame_bytes(PublicKey, plain={"public_key": key}),
        max_frame_bytes(PublicKeys, plain={"public_keys": (key,) * n_clients}),
        max_frame_bytes(SealedSeeds, plain={"sealed": (sealed,) * max(n_clients - 1, 0)}),
        max_frame_bytes(SealedSeed, plain={"sender_key": key, "sealed": sealed}),
        max_frame_bytes(MaskedUpdate, arrays=ring, dtypes=dtype),
        max_frame_bytes(NoisyAggregate, arrays=ring, dtypes=dtype),
    )
    if plus is not None:
        from fedproto.algorithms.secagg_plus.messages import frame_limit

        aggregate = {"masked": (k, d + 1), "dropped": (max(n_clients - 1, 0),)}
        limit = max(limit, frame_limit(plus), max_frame_bytes(SurvivorAggregate, arrays=aggregate, dtypes=dtype))
    return limit

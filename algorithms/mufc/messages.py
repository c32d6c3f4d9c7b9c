"""Wire messages of MUFC (spec mufc.md, sections 1.10, 2.3 and 3.5).

The federation's public quantities (phase ``setup.data``, round 0, metered as setup; the first
phase of a run whose parties each hold only their own raw data, :mod:`fedproto.algorithms.mufc.setup`):

* :class:`DataSummary` client -> server: the client's number of points n_l and the per-feature
  minimum and maximum of its raw points, ``float64 [2, d]``;
* :class:`FederationSummary` server -> every client: every client's n_l (client order) and the
  federation's per-feature minimum and maximum, ``float64 [2, d]``.

Setup (phase ``setup``, round 0):

* :class:`PublicKey` client -> server: the client's X25519 public key for pairwise mask seeds;
* :class:`PeerKeys` server -> every client: all clients' public keys in client order; it also
  opens the training aggregation (round 0) with every client active.

Aggregation (phase ``aggregate``):

* :class:`AggregationRequest` server -> active clients: open round ``round_idx`` (attempt
  ``attempt``) among the clients listed in ``active`` (masks are drawn over exactly that set);
* :class:`MaskedSyndromes` client -> server: the client's ``T = 2KL`` power-sum syndromes plus
  its zero-sum mask, as fixed-width big-endian field elements.

Unlearning (phases ``removal`` and ``model``):

* :class:`RemovalRequest` client -> server: the client removed some of its points (which and how
  many stays with the client), or leaves the federation (``whole_client``);
* :class:`ModelUpdate` server -> active clients: the server's centroids after training
  (``version`` 0) and after each removal request; the optional downlink of spec 1.7, metered in
  its own phase.

With SecAgg+ (``--secagg plus``) there is no SCMA setup and no :class:`AggregationRequest` or
:class:`MaskedSyndromes`: SecAgg+ agrees its keys in round 0 and each aggregation is the
``masked-input`` and ``unmask`` stages of :mod:`fedproto.algorithms.secagg_plus.messages` (the
syndromes travel in its ``MaskedInput``);
:class:`RemovalRequest` and :class:`ModelUpdate` are unchanged.
"""

from __future__ import annotations


import numpy as np

from fedproto.data import check_extent
from fedproto.messages import Message, array_field, bigints_field

__all__ = [
    "AggregationRequest",
    "DataSummary",
    "FederationSummary",
    "MaskedSyndromes",
    "ModelUpdate",
    "PeerKeys",
    "PublicKey",
    "RemovalRequest",
]

_X25519_BYTES = 32


def _check_count(value: object, what: str, *, minimum: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}")


class DataSummary(Message, tag="mufc.data"):
    """A client's share of the federation's public quantities (client -> server, ``setup.data``).

    Attributes:
        n_points: the client's number of points n_l (>= 1).
        extent: ``float64 [2, d]``: row 0 the per-feature minimum of the client's raw points,
            row 1 the maximum (:func:`fedproto.data.feature_extent`).
    """

    n_points: int
    extent: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        _check_count(self.n_points, "n_points", minimum=1)
        check_extent(self.extent)


class FederationSummary(Message, tag="mufc.federation"):
    """The federation's public quantities (server -> every client, ``setup.data``).

    Attributes:
        client_points: ``int64 [L]``: every client's n_l, in client order (each >= 1); their sum
            is n, which sets the grid's default step and the prime; each client derives the
            removal stream and its points' ids from them.
        extent: ``float64 [2, d]``: the element-wise minimum of the clients' minima and maximum
            of their maxima (the pooled data's per-feature extent, by which every client scales
            its raw points into ``[0, 1]``).
    """

    client_points: np.ndarray = array_field("int64", 1)
    extent: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        if self.client_points.shape[0] < 1 or np.any(self.client_points < 1):
            raise ValueError("client_points must list at least one client, each with at least one point")
        check_extent(self.extent)


class PublicKey(Message, tag="mufc.key"):
    """A client's raw 32-byte X25519 public key."""

    public_key: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.public_key, bytes) or len(self.public_key) != _X25519_BYTES:
            raise ValueError("public_key must be 32 raw bytes")


class PeerKeys(Message, tag="mufc.peers"):
    """Every client's public key, in client order (index = client index)."""

    keys: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("keys must not be empty")
        if any(not isinstance(k, bytes) or len(k) != _X25519_BYTES for k in self.keys):
            raise ValueError("every key must be 32 raw bytes")
        if len(set(self.keys)) != len(self.keys):
            raise ValueError("two clients announced the same public key")


class AggregationRequest(Message, tag="mufc.open"):
    """Open an aggregation among the clients ``active`` (sorted client indices); ``attempt``
    counts re-openings of the same round after dropouts (masks are fresh per attempt)."""

    active: tuple[int, ...]
    attempt: int

    def __post_init__(self) -> None:
        if not self.active:
            raise ValueError("active must name at least one client")
        for c in self.active:
            _check_count(c, "a client index")
        if list(self.active) != sorted(set(self.active)):
            raise ValueError("active must be strictly increasing")
        _check_count(self.attempt, "attempt")


class MaskedSyndromes(Message, tag="mufc.syndromes"):
    """``T`` masked syndromes, elements of F_p, each ``width = ceil(bitlength(p) / 8)`` bytes on
    the wire (spec 1.10: payload ``T * width`` bytes), for aggregation attempt ``attempt``.

    ``values`` is kept in its wire form, ``uint8 [T, width]`` big-endian rows (a packed
    `~fedproto.messages.bigints_field`), so the server sums the frames' bytes without building
    ``T`` integers per client (`fedproto.algorithms.scma.sum_packed`). A sequence of ints
    is accepted too and packed at construction.
    """

    attempt: int
    width: int
    values: np.ndarray = bigints_field(width_from="width", packed=True)

    def __post_init__(self) -> None:
        _check_count(self.attempt, "attempt")
        _check_count(self.width, "width", minimum=1)
        values = self.values
        if not isinstance(values, np.ndarray):
            try:
                raw = b"".join(int(v).to_bytes(self.width, "big") for v in values)
            except OverflowError:
                raise ValueError(f"every value must be a non-negative integer of {self.width} bytes") from None
            values = np.frombuffer(raw, dtype=np.uint8).reshape(-1, self.width)
            object.__setattr__(self, "values", values)
        if values.dtype != np.uint8 or values.ndim != 2 or values.shape[1] != self.width:
            raise ValueError(f"values must be a uint8 [T, {self.width}] array of packed field elements")
        if not values.shape[0]:
            raise ValueError("values must not be empty")


class RemovalRequest(Message, tag="mufc.remove"):
    """The sender removed some of its points (``whole_client`` False) or leaves (True)."""

    whole_client: bool

    def __post_init__(self) -> None:
        if not isinstance(self.whole_client, bool):
            raise TypeError("whole_client must be a bool")


class ModelUpdate(Message, tag="mufc.model"):
    """The server's model after ``version`` removal requests: ``centroids`` ``float64 [k, d]``;
    ``reclustered`` says whether the server re-ran K-means++ for this version."""

    version: int
    reclustered: bool
    centroids: np.ndarray = array_field("float64", 2)

    def __post_init__(self) -> None:
        _check_count(self.version, "version")
        if not isinstance(self.reclustered, bool):
            raise TypeError("reclustered must be a bool")
        if self.centroids.ndim != 2 or self.centroids.shape[1] < 1:
            raise ValueError(f"centroids must have shape [k, d], got {self.centroids.shape}")
        if not np.all(np.isfinite(self.centroids)):
            raise ValueError("centroids contain NaN or infinite values")

"""Each party holds only its own data: the setup phase ``setup.data`` of the deletion protocols.

Theory of operation (issue 10 part 1, a design of this project: the paper describes no protocol;
Ginart et al. 2019 train on one pooled data set).

A run of Q-k-means (curated or federated) or DC-k-means needs three things of the whole
federation: the number of points n (the algorithms key their randomness by stable point ids
``0 .. n-1``, spec 3.3), the per-feature extent of the raw data (``--normalize minmax`` scales
every feature into ``[0, 1]``, the paper's preprocessing), and, from n and the public options,
the deletion stream and the table point id -> party. A party that holds only its own file learns
them in the setup phase ``setup.data`` (round 0, metered as setup, before training):

1. each data-holding party sends the coordinating party (the DC-k-means root, the Q-k-means
   server, the federated coordinator) a :class:`~.messages.DataSummary`: its ``n_i``, its ``d``
   and, with min-max scaling, the per-feature minimum ``lo_i`` and maximum ``hi_i`` of its raw
   points (:class:`LocalPoints`);
2. when every summary is in, the coordinating party checks that every party has the same d
   (:class:`DataCollector` names the one that differs), takes ``n = sum n_i``, ``lo = min_i
   lo_i`` and ``hi = max_i hi_i`` feature by feature, numbers the points party by party in
   roster order (party i holds the ids ``offset_i .. offset_i + n_i - 1``, ``offset_i = sum_{j <
   i} n_j``) and sends each party a :class:`~.messages.DataAgreement` with n, its offset and the
   extent;
3. each party scales its rows by the federation's extent, which gives exactly the rows that
   scaling the pooled data gives (`fedproto.data.normalize` with ``extent``: the same
   arithmetic), and numbers them in the order of its file.

The deletion stream is ``deletion_stream(arange(n), m, seed)`` (:class:`StreamTerms`: ``m`` is
``--removals``, the seed ``--seed + 1``), a function of n and public options: every party that
needs it draws it after the setup phase. The DC root sends the requests; a Q-k-means client keeps
the positions of its own ids and requests them in turn; the Q server and coordinator check the
requests against the id table. So the stream is the simulation's, drawn over the pooled ids,
without anyone holding the pooled data; :func:`pooled_order` gives the pooled data in this id
order for the simulation's baselines.

What the phase reveals (not a privacy guarantee): the coordinating party learns every party's
``n_i`` (the id table of the whole-data design gave it too) and, with min-max scaling, every
party's per-feature minimum and maximum; each data-holding party learns n, the number of points
of the parties before it in roster order, and the federation's extent.

Cost (P data-holding parties, d features): P summaries up and P agreements down, each with two
``float64 [d]`` arrays under min-max scaling: ``32 P d`` payload array bytes (none without
scaling), plus each frame's envelope and integer fields (:func:`setup_payload_bytes`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from fedproto.algorithms.deletion._store import check_points
from fedproto.algorithms.deletion.messages import DataAgreement, DataSummary
from fedproto.algorithms.deletion.streams import deletion_stream
from fedproto.data import HoldsPoints, agree_feature_count, feature_extent, normalize
from fedproto.errors import RemoteProtocolError
from fedproto.machine import ProtocolMachine

__all__ = [
    "SCALES",
    "SETUP_PHASE",
    "AgreedData",
    "DataCollector",
    "LocalPoints",
    "StreamTerms",
    "pooled_order",
    "scale_points",
    "setup_payload_bytes",
]

#: The envelope phase of the setup phase (``fedproto.metering.is_setup_phase`` counts it as setup).
SETUP_PHASE = "setup.data"
#: ``--normalize`` choices: min-max scaling into ``[0, 1]^d``, or the raw values.
SCALES = ("minmax", "none")
_NO_EXTENT = np.zeros(0)


def _check_scale(scale: str) -> None:
    if scale not in SCALES:
        raise ValueError(f"unknown --normalize {scale!r} (minmax or none)")


def scale_points(raw: np.ndarray, scale: str, extent: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """The points the algorithms see: ``raw`` min-max scaled into ``[0, 1]^d`` by ``extent``
    (default: ``raw``'s own; `fedproto.data.feature_extent`) for ``"minmax"``, unchanged for
    ``"none"``.

    Args:
        raw: ``[n, d]`` float64 raw points. scale: ``"minmax"`` or ``"none"``.
        extent: per-feature ``(lo, hi)``, ``[d]`` each (the federation's, agreed in setup).

    Returns:
        ``[n, d]`` float64.

    Raises:
        ValueError: another ``scale``.
    """
    _check_scale(scale)
    raw = np.asarray(raw, dtype=np.float64)
    if scale == "none":
        return raw
    return normalize(raw, 0.5, extent=extent) + 0.5


@dataclasses.dataclass(frozen=True)
class StreamTerms:
    """The public terms of the deletion stream: ``removals`` ids drawn uniformly without
    replacement from ``0 .. n-1`` with ``seed`` (the CLI's ``--removals`` and ``--seed + 1``).

    Raises:
        ValueError: ``removals`` negative.
    """

    removals: int
    seed: int

    def __post_init__(self) -> None:
        if self.removals < 0:
            raise ValueError("--removals must be non-negative")

    def stream(self, n: int) -> tuple[int, ...]:
        """The ids to delete, in order, for a federation of ``n`` points.

        Raises:
            ValueError: more removals than points.
        """
        return tuple(int(i) for i in deletion_stream(np.arange(n, dtype=np.int64), self.removals, self.seed))

    def requests(self, n: int, offset: int, count: int) -> dict[int, int]:
        """Position in the stream -> id, for the requests of the party holding the ids ``offset ..
        offset + count - 1``."""
        return {pos: i for pos, i in enumerate(self.stream(n)) if offset <= i < offset + count}


def pooled_order(parts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The raw data of ``parts`` (each data-holding party's ``[n_i, d]``, in roster order) pooled
    in the order of the ids the setup phase gives, and those ids ``0 .. n-1``.

    Returns:
        ``(x [n, d] float64, ids [n] int64)``.
    """
    x = np.concatenate([np.asarray(p, dtype=np.float64) for p in parts])
    return x, np.arange(x.shape[0], dtype=np.int64)


def setup_payload_bytes(n_parties: int, d: int, scale: str) -> int:
    """Payload array bytes of the setup phase: ``32 P d`` with min-max scaling (two ``float64
    [d]`` arrays each way per party), 0 without. Frames add their envelopes and integer fields."""
    _check_scale(scale)
    return 32 * n_parties * d if scale == "minmax" else 0


class LocalPoints(HoldsPoints):
    """A data-holding party's raw points before the setup phase.

    Args:
        raw: ``[n_i, d]`` float64 raw points (may be empty).
        scale: ``"minmax"`` or ``"none"``.

    Attributes:
        x: the raw points, ``[n_i, d]`` float64 (``n`` and ``d``: `fedproto.data.HoldsPoints`).
        scale: as given.

    Raises:
        ValueError: not 2-D, no features, NaN or infinite values, or another ``scale``.
    """

    def __init__(self, raw: np.ndarray, scale: str) -> None:
        _check_scale(scale)
        self.x, _ = check_points(raw, None)
        self.scale = scale

    def summary(self) -> DataSummary:
        """This party's :class:`~.messages.DataSummary`."""
        if self.scale == "minmax" and self.n:
            lo, hi = feature_extent(self.x)
        else:
            lo = hi = _NO_EXTENT
        return DataSummary(n_points=self.n, n_features=self.d, lo=lo, hi=hi)

    def agreed(self, message: DataAgreement) -> tuple[np.ndarray, np.ndarray]:
        """This party's points and ids once the federation agreed ``message``.

        Returns:
            ``(points [n_i, d] float64, ids [n_i] int64)``: the rows scaled by the federation's
            extent, numbered from the offset.

        Raises:
            ValueError: the agreement does not fit this party (ids beyond n, an extent of another
                dimension, an extent where the run does not scale or none where it does).
        """
        if message.offset + self.n > message.n_points:
            raise ValueError(f"ids {message.offset} .. {message.offset + self.n - 1} for {self.n} points lie beyond "
                             f"the federation's n = {message.n_points}")
        ids = np.arange(message.offset, message.offset + self.n, dtype=np.int64)
        if self.scale == "none":
            if message.lo.shape != (0,):
                raise ValueError("the agreement scales the data, this party runs with --normalize none")
            return self.x, ids
        if message.lo.shape != (self.d,):
            raise ValueError(f"the agreed extent has {message.lo.shape[0]} features, this party's data {self.d} "
                             "(or the coordinator runs with --normalize none)")
        return scale_points(self.x, "minmax", (message.lo, message.hi)), ids


@dataclasses.dataclass(frozen=True)
class AgreedData:
    """What the setup phase agreed.

    Attributes:
        parties: the data-holding parties, in roster order.
        counts: their numbers of points ``n_i``.
        d: features.
        extent: the federation's per-feature ``(lo, hi)`` (``[d]`` each), or ``None`` without
            scaling.
    """

    parties: tuple[str, ...]
    counts: tuple[int, ...]
    d: int
    extent: tuple[np.ndarray, np.ndarray] | None

    @property
    def n(self) -> int:
        """Points in the federation."""
        return sum(self.counts)

    @property
    def offsets(self) -> tuple[int, ...]:
        """The first id of each party's points."""
        return tuple(int(o) for o in np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64))

    def owners(self) -> dict[int, str]:
        """Point id -> the party holding it (every id)."""
        table: dict[int, str] = {}
        for party, offset, count in zip(self.parties, self.offsets, self.counts):
            table.update(dict.fromkeys(range(offset, offset + count), party))
        return table

    def agreements(self) -> dict[str, DataAgreement]:
        """Each party's :class:`~.messages.DataAgreement`."""
        lo, hi = self.extent if self.extent is not None else (_NO_EXTENT, _NO_EXTENT)
        return {
            party: DataAgreement(n_points=self.n, offset=offset, lo=lo, hi=hi)
            for party, offset in zip(self.parties, self.offsets)
        }


class DataCollector:
    """The coordinating party's side of the setup phase: collects the summaries and agrees.

    Args:
        parties: the data-holding parties, in roster order.
        scale: ``"minmax"`` or ``"none"``.

    Raises:
        ValueError: no parties, repeated names, or another ``scale``.
    """

    def __init__(self, parties: Sequence[str], scale: str) -> None:
        _check_scale(scale)
        self.parties = tuple(parties)
        if not self.parties or len(set(self.parties)) != len(self.parties):
            raise ValueError("the data-holding parties must be unique and non-empty")
        self.scale = scale
        self._summaries: dict[str, DataSummary] = {}

    def pending(self) -> list[str]:
        """The parties whose summary is not in yet."""
        return [p for p in self.parties if p not in self._summaries]

    @property
    def complete(self) -> bool:
        return len(self._summaries) == len(self.parties)

    def add(self, sender: str, message: DataSummary, machine: ProtocolMachine) -> None:
        """Record ``sender``'s summary.

        Raises:
            RemoteProtocolError: ``sender`` holds no data in this run, or sent twice.
        """
        if sender not in self.parties:
            raise _remote(f"{sender} is not a data-holding party of this run", sender, machine)
        if sender in self._summaries:
            raise _remote(f"second data summary from {sender}", sender, machine)
        self._summaries[sender] = message

    def agree(self, machine: ProtocolMachine) -> AgreedData:
        """The agreement, once every summary is in.

        Raises:
            RemoteProtocolError: a party's data has another number of features than the others'
                (it is named; the number most parties have is taken as right, the first party's
                on a tie), or a party's summary has an extent where the run does not scale or
                none where it does.
        """
        summaries = [self._summaries[p] for p in self.parties]
        d, positions = agree_feature_count([s.n_features for s in summaries])
        odd = [(self.parties[i], summaries[i].n_features) for i in positions]
        if odd:
            party, features = odd[0]
            others = "the other parties'" if len(self.parties) > 2 else f"{self._other(party)}'s"
            raise _remote(f"{party}'s data has {features} features, {others} {d}: every party's file needs the same "
                          "columns", party, machine)
        extent = None
        if self.scale == "minmax":
            for party, s in zip(self.parties, summaries):
                if s.lo.shape != ((d,) if s.n_points else (0,)):
                    raise _remote(f"{party} sent {'no' if not s.lo.shape[0] else 'a'} feature extent for its "
                                  f"{s.n_points} points, but this run scales them (every party needs --normalize "
                                  "minmax)", party, machine)
            held = [s for s in summaries if s.n_points]
            if not held:
                raise _remote("no party holds a point", self.parties[0], machine)
            extent = (np.min([s.lo for s in held], axis=0), np.max([s.hi for s in held], axis=0))
        else:
            for party, s in zip(self.parties, summaries):
                if s.lo.shape != (0,):
                    raise _remote(f"{party} sent a feature extent, but this run does not scale the data (every "
                                  "party needs --normalize none)", party, machine)
        counts = tuple(s.n_points for s in summaries)
        if sum(counts) > 2**32:
            raise _remote(f"the parties hold {sum(counts)} points, more than 2^32 ids", self.parties[0], machine)
        return AgreedData(self.parties, counts, d, extent)

    def _other(self, party: str) -> str:
        return next(p for p in self.parties if p != party)


def _remote(message: str, party: str, machine: ProtocolMachine) -> RemoteProtocolError:
    return RemoteProtocolError(message, party=party, round_idx=machine.round_idx, state=machine.state.name,
                               phase=SETUP_PHASE)

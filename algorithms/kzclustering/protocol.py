"""Distributed (k,z)-center with (1+eps)z outliers: Guo & Li's dist-kzc over a grid of radius guesses.

Theory of operation (Guo & Li, "Distributed k-Clustering for Data with Heavy Noise", NeurIPS 2018,
Section 2, Algorithms 1-3 and Appendix B; spec kz-clustering.md sections 2.1-2.7, with the fixes
of GAPs 1 and 2).

Roles: one :class:`KzCoordinator` (party ``coordinator``) and m :class:`KzMachine` s (parties
``machine-0 .. machine-{m-1}``), in a star: machines talk only to the coordinator. Machine i holds
P_i (any partition, possibly empty parts). Everyone knows the :class:`KzCenterConfig` (k, z, eps,
m, d and the search options).

Idea: for a guess L, machine i absorbs every ball ``ball(p, 4L)`` around a point whose ``2L``
ball holds more than ``y = eps z / (k m)`` of its remaining points into one weighted
representative (`solvers.aggregate`); the remaining points are discarded. If L >= L* (the optimal
radius), the machines produce at most ``k m (1 + 1/eps)`` representatives in total and discard at
most ``(1+eps) z`` points (Lemmas 2.6, 2.7), and the coordinator's Charikar-style solver kzc
(Algorithm 1, radii 2L'/4L') covers the representatives with ``z' = (1+eps) z - discarded``
outlier weight at ``L' = 5L``. So the coordinator searches the grid of guesses for the smallest
one that passes.

Message sequence (round ``r`` = one machine upload, then one coordinator download):

* round 0, only without ``radius_bounds`` (spec 2.4, practical alternative): machines send
  :class:`LocalExtent` (phase ``extent``: ``n_i``, the local smallest nonzero distance, an anchor,
  the radius around it); the coordinator bounds the diameter by ``max (r_i + d(a_i, a_j) + r_j)`` and sends
  the grid :class:`RadiusGrid` (phase ``grid``): ``[0, g, g(1+eps), ...]`` up to the first value
  ``>= diameter / 2``, with ``g = min_i dmin_i / 4``. Every machine aggregates identically for
  all L in ``[0, g)`` (its 4L balls hold only copies of a point), so the guess 0 stands for that
  whole interval (the "bottom" guess; see below). With ``radius_bounds = (A, B)`` the grid is
  ``A (1+eps)^t`` up to ``>= B``, known to all, and this round is skipped.
* next round: machines aggregate for every guess and send :class:`AggregatedCounts` (phase
  ``counts``: ``n_i``, ``|P'_i(L_t)|`` and ``|U_i(L_t)|`` for all t, 2 words per guess). The
  coordinator computes PASS2(t) = [sum counts <= k m (1+1/eps)] and [sum discarded <= (1+eps) z]
  (the discarded-count test is the fix of GAP 1: with the count test alone, tiny guesses pass
  because nothing is aggregated), and asks for the data of some candidates with
  :class:`RadiusGuesses` (phase ``fetch``).
* next round: machines send :class:`WeightedPoints` (phase ``points``: representatives and
  weights of the requested guesses). The coordinator evaluates the fetched candidates in
  increasing order: z' = (1+eps) z - sum discarded, then kzc(k, z', P', 5 L_t). A "No" certifies
  L_t < L* (GAP 2); the coordinator then fetches more (phases ``fetch``/``points`` again, one
  round each) according to ``search``:

  - ``linear``: the next ``batch`` untried PASS2 candidates (``batch = 0``: all of them in the
    first fetch). The first success is at the smallest passing guess, which is at most the first
    grid value >= L*.
  - ``binary``: lo-fails/hi-passes search over the grid (hi starts at the top guess, which
    always passes), fetching ``batch`` evenly spaced probes per round; ends when hi follows lo,
    so hi <= first grid value >= L*, with O(log |grid|) fetches even though the predicate is not
    monotone.

  On success the coordinator refines (``refine``, spec 2.5): the smallest kzc radius
  ``L'' <= 5 L_t`` over the exact breakpoints of the fetched points, and certifies
  ``L_out = 4 L'' + 4 L_t <= 24 L_t`` (without refinement ``L_out = 24 L_t``). The bottom guess
  uses ``upper = 5 g`` and no move term (its representatives absorbed only copies), so if
  L* < g it certifies ``L_out <= 4 L*``; if it fails, L* >= g.
* final round: :class:`FinalCentres` (phase ``centres``, broadcast: the k centres and L_out);
  each machine labels its points farther than L_out as outliers and replies with
  :class:`OutlierCount` (phase ``outliers``). Guarantee: at most ``(1+eps) z`` outliers in total,
  and ``L_out <= 24 (1+eps) L*`` (Claim 2.5, Theorem 1.1).

Rounds: without ``radius_bounds``, 3 round trips plus the outlier upload when the first fetch
succeeds (7 message phases), 2 more phases per extra fetch; with ``radius_bounds``, 5 phases
(counts, fetch, points, centres, outliers), i.e. the paper's 4 rounds plus the outlier labels.
Words (the coordinator's result records them per round and phase): extent ``m (d + 3)``, grid
``m T``, counts ``m (2T + 1)``, each fetch ``m b``, each points phase ``<= (d + 1) k m
(1 + 1/eps)`` per fetched guess plus ``2 b m``, centres ``m (k d + 1)``, outliers ``m``. None of
them depends on z or n.

Failure: no dropout tolerance (every machine's data is needed). A silent machine makes the
coordinator fail with :class:`~fedproto.errors.InsufficientParticipants` naming it; a message
out of order, from a stranger, or inconsistent with earlier ones (wrong grid length, sizes that
do not match the counts, weights plus discarded points not equal to ``n_i``) is a
:class:`~fedproto.errors.RemoteProtocolError`. ``k > n`` or ``z >= n`` (learnt with the counts)
fail the coordinator with ``ValueError``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from fedproto.algorithms.kzclustering import _kernels, solvers
from fedproto.algorithms.kzclustering.config import KzCenterConfig, check_instance
from fedproto.algorithms.kzclustering.messages import (
    AggregatedCounts,
    FinalCentres,
    LocalExtent,
    OutlierCount,
    RadiusGrid,
    RadiusGuesses,
    WeightedPoints,
    message_words,
)
from fedproto.errors import RemoteProtocolError
from fedproto.machine import ProtocolMachine
from fedproto.messages import Message, Outgoing

__all__ = [
    "COORDINATOR",
    "CoordinatorResult",
    "KzCoordinator",
    "KzMachine",
    "MachineResult",
    "machine_name",
]

COORDINATOR = "coordinator"


def machine_name(i: int) -> str:
    """Party name of machine ``i``."""
    return f"machine-{i}"


def _check_points(points: np.ndarray, d: int) -> np.ndarray:
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != d:
        raise ValueError(f"points must have shape [n_i, {d}], got {points.shape}")
    if not np.all(np.isfinite(points)):
        raise ValueError("points contain NaN or infinite values")
    return points


@dataclasses.dataclass(frozen=True)
class MachineResult:
    """A machine's output.

    Attributes:
        outliers: bool ``[n_i]``, the local points farther than ``radius`` from every centre.
        centres: the final centres ``[c, d]`` float64 (``c <= k``).
        radius: the certified radius L_out.
    """

    outliers: np.ndarray
    centres: np.ndarray
    radius: float


@dataclasses.dataclass(frozen=True)
class CoordinatorResult:
    """The coordinator's output and what the run cost.

    Attributes:
        centres: ``[c, d]`` float64, real input points (``c = k`` unless fewer than k distinct
            points reached the coordinator, e.g. when every point is discarded, spec oracle 20).
        radius: the certified radius L_out: at most ``(1+eps) z`` points lie farther than it.
        guess: the grid value L_t of the accepted guess (0 for the bottom guess).
        guess_index: its index in ``grid``.
        kzc_radius: L'', the kzc radius used on the representatives.
        z_prime: z' = (1+eps) z - discarded, the outlier weight allowed on the representatives.
        discarded: points discarded by the machines at the accepted guess.
        n: total number of points.
        grid: the radius guesses ``[T]``.
        pass2: bool ``[T]``, the Round-2 pre-test; ``count_ok`` and ``discard_ok`` its two halves.
        count_ok: bool ``[T]``, ``sum counts <= k m (1 + 1/eps)``.
        discard_ok: bool ``[T]``, ``sum discarded <= (1+eps) z``.
        fetches: the guesses fetched, one tuple per fetch round.
        rejected: the fetched guesses kzc rejected (each certifies L_t < L*).
        outliers: points the machines labelled as outliers (sum of their counts).
        representatives: representatives received over all fetches (the paper's Round-3 points).
        words: words (scalars) per ``(round_idx, phase)``, both directions.
    """

    centres: np.ndarray
    radius: float
    guess: float
    guess_index: int
    kzc_radius: float
    z_prime: float
    discarded: int
    n: int
    grid: np.ndarray
    pass2: np.ndarray
    count_ok: np.ndarray
    discard_ok: np.ndarray
    fetches: tuple[tuple[int, ...], ...]
    rejected: tuple[int, ...]
    outliers: int
    representatives: int
    words: dict[tuple[int, str], int]

    @property
    def total_words(self) -> int:
        """All words of the run."""
        return sum(self.words.values())

    def words_by_phase(self) -> dict[str, int]:
        """Words per phase name, summed over rounds."""
        out: dict[str, int] = defaultdict(int)
        for (_, phase), words in self.words.items():
            out[phase] += words
        return dict(out)


# --- machine ------------------------------------------------------------------------------------


class MachineState(enum.Enum):
    """States of a machine."""

    AWAIT_GRID = enum.auto()
    AWAIT_REQUEST = enum.auto()
    DONE = enum.auto()
    ERROR = enum.auto()


class KzMachine(ProtocolMachine):
    """A data-holding machine of distributed (k,z)-center (sans-IO).

    Args:
        party: this machine's party name.
        config: the run's public parameters.
        points: the machine's points P_i ``[n_i, d]`` float64 (``n_i`` may be 0; duplicates are
            fine).
        coordinator: the coordinator's party name.

    Raises:
        ValueError: ``points`` has the wrong shape or holds NaN/inf.

    Memory and time: one ``[n_i, n_i]`` distance matrix, and one aggregation per guess, each
    O(n_i^2) (spec 2.2); guesses below the local spacing or above the local diameter reuse one
    aggregation.
    """

    State = MachineState
    INITIAL_STATE = MachineState.AWAIT_GRID
    DEADLINE_FACTOR = 2.0
    TRANSITIONS = {
        (MachineState.AWAIT_GRID, RadiusGrid): ("_on_grid", MachineState.AWAIT_REQUEST),
        (MachineState.AWAIT_REQUEST, RadiusGuesses): ("_on_guesses", MachineState.AWAIT_REQUEST),
        (MachineState.AWAIT_REQUEST, FinalCentres): ("_on_centres", MachineState.DONE),
    }

    def __init__(
        self, party: str, *, config: KzCenterConfig, points: np.ndarray, coordinator: str = COORDINATOR
    ) -> None:
        super().__init__(party)
        self.config = config
        self.coordinator = coordinator
        self.points = _check_points(points, config.d)
        self._dist: np.ndarray | None = None
        self._grid: np.ndarray | None = None
        self._aggregations: list[solvers.Aggregation] = []

    @property
    def phase(self) -> str:
        return "extent" if self._state is MachineState.AWAIT_GRID else "counts"

    def distances(self) -> np.ndarray:
        """The local distance matrix ``[n_i, n_i]`` (computed once)."""
        if self._dist is None:
            self._dist = _kernels.pairwise_distances(self.points)
        return self._dist

    def aggregations(self) -> list[solvers.Aggregation]:
        """The aggregation of every grid guess (after the grid is known)."""
        return list(self._aggregations)

    def _start(self) -> list[Outgoing]:
        if self.config.radius_bounds is None:
            return [self.send(self.coordinator, self._extent(), phase="extent")]
        lo, hi = self.config.radius_bounds
        self.move_to(MachineState.AWAIT_REQUEST)
        return [self._counts(solvers.radius_grid(lo, hi, self.config.eps))]

    def _extent(self) -> LocalExtent:
        n = self.points.shape[0]
        if n == 0:
            return LocalExtent(n_points=0, min_distance=math.inf, radius=0.0, anchor=np.zeros((0, self.config.d)))
        dist = self.distances()
        positive = dist[dist > 0]
        dmin = float(positive.min()) if positive.size else math.inf
        return LocalExtent(n_points=n, min_distance=dmin, radius=float(dist[0].max()), anchor=self.points[:1].copy())

    def _counts(self, grid: np.ndarray) -> Outgoing:
        """Aggregate for every guess and build the Phase-1 message."""
        cfg = self.config
        self._grid = np.asarray(grid, dtype=np.float64)
        dist = self.distances()
        positive = dist[dist > 0]
        dmin = float(positive.min()) if positive.size else math.inf
        dmax = float(dist.max()) if dist.size else 0.0
        low = high = None
        self._aggregations = []
        for radius in self._grid:
            # below the local spacing every ball holds only copies: same as L = 0; above half the
            # local diameter every ball holds everything: the same result for all such L
            if 4.0 * radius < dmin:
                if low is None:
                    low = solvers.aggregate(
                        dist, 0.0, cfg.threshold, max_reps=cfg.max_reps, candidates=cfg.candidates
                    )
                agg = low
            elif 2.0 * radius >= dmax:
                if high is None:
                    high = solvers.aggregate(
                        dist, float(radius), cfg.threshold, max_reps=cfg.max_reps, candidates=cfg.candidates
                    )
                agg = high
            else:
                agg = solvers.aggregate(
                    dist, float(radius), cfg.threshold, max_reps=cfg.max_reps, candidates=cfg.candidates
                )
            self._aggregations.append(agg)
        counts = np.asarray([a.count for a in self._aggregations], dtype=np.int64)
        discarded = np.asarray([a.discarded for a in self._aggregations], dtype=np.int64)
        message = AggregatedCounts(n_points=int(self.points.shape[0]), counts=counts, discarded=discarded)
        return self.send(self.coordinator, message, phase="counts")

    def _check_sender(self, sender: str) -> None:
        if sender != self.coordinator:
            raise RemoteProtocolError(
                f"{sender} is not the coordinator", party=sender, round_idx=self.round_idx, state=self._state.name
            )

    def _on_grid(self, sender: str, message: RadiusGrid) -> list[Outgoing]:
        self._check_sender(sender)
        self.round_idx += 1
        return [self._counts(message.radii)]

    def _on_guesses(self, sender: str, message: RadiusGuesses) -> list[Outgoing]:
        self._check_sender(sender)
        assert self._grid is not None
        if int(message.indices.max()) >= self._grid.shape[0]:
            raise RemoteProtocolError(
                f"guess index {int(message.indices.max())} is outside the grid of {self._grid.shape[0]}",
                party=sender,
                round_idx=self.round_idx,
            )
        points, weights, sizes = [], [], []
        for t in message.indices:
            agg = self._aggregations[int(t)]
            if agg.overflow:
                raise RemoteProtocolError(
                    f"guess {int(t)} failed the count test on this machine; it cannot be fetched",
                    party=sender,
                    round_idx=self.round_idx,
                )
            points.append(self.points[agg.reps])
            weights.append(agg.weights)
            sizes.append(agg.reps.shape[0])
        self.round_idx += 1
        reply = WeightedPoints(
            indices=np.asarray(message.indices, dtype=np.int64),
            sizes=np.asarray(sizes, dtype=np.int64),
            points=np.concatenate(points, axis=0) if points else np.zeros((0, self.config.d)),
            weights=np.concatenate(weights).astype(np.int64),
        )
        return [self.send(self.coordinator, reply, phase="points")]

    def _on_centres(self, sender: str, message: FinalCentres) -> list[Outgoing]:
        return label_outliers(self, sender, message)


def label_outliers(machine: ProtocolMachine, sender: str, message: FinalCentres) -> list[Outgoing]:
    """A machine's last step (k-center and median/means alike): label its points farther than
    the certified radius from every final centre as outliers, report how many, and finish.

    Raises:
        RemoteProtocolError: the sender is not the coordinator, or the centres have the wrong width.
    """
    machine._check_sender(sender)
    if message.centres.shape[1] != machine.config.d:
        raise RemoteProtocolError(
            f"centres have {message.centres.shape[1]} features, expected {machine.config.d}",
            party=sender,
            round_idx=machine.round_idx,
        )
    dist, _ = _kernels.nearest_centres(machine.points, message.centres)
    outliers = dist > message.radius
    machine.round_idx += 1
    out = machine.send(machine.coordinator, OutlierCount(outliers=int(outliers.sum())), phase="outliers")
    machine._finish(MachineResult(outliers=outliers, centres=np.array(message.centres), radius=message.radius))
    return [out]


# --- coordinator --------------------------------------------------------------------------------


class CoordinatorState(enum.Enum):
    """States of the coordinator."""

    EXTENT = enum.auto()
    COUNTS = enum.auto()
    POINTS = enum.auto()
    OUTLIERS = enum.auto()
    DONE = enum.auto()
    ERROR = enum.auto()


@dataclasses.dataclass
class _Accepted:
    index: int
    centres: np.ndarray
    radius: float
    kzc_radius: float
    z_prime: float
    discarded: int


class KzCoordinator(ProtocolMachine):
    """The coordinator of distributed (k,z)-center (sans-IO).

    Args:
        party: the coordinator's party name.
        config: the run's public parameters.
        machines: every machine's party name, in machine order (``config.n_machines`` of them).

    Raises:
        ValueError: the machine list does not match the configuration, has duplicates, or holds
            the coordinator.
    """

    State = CoordinatorState
    INITIAL_STATE = CoordinatorState.EXTENT
    TRANSITIONS = {
        (CoordinatorState.EXTENT, LocalExtent): ("_on_extent", CoordinatorState.EXTENT),
        (CoordinatorState.COUNTS, AggregatedCounts): ("_on_counts", CoordinatorState.COUNTS),
        (CoordinatorState.POINTS, WeightedPoints): ("_on_points", CoordinatorState.POINTS),
        (CoordinatorState.OUTLIERS, OutlierCount): ("_on_outlier_count", CoordinatorState.OUTLIERS),
    }

    def __init__(self, party: str, *, config: KzCenterConfig, machines: Sequence[str]) -> None:
        super().__init__(party)
        machines = tuple(machines)
        if len(machines) != config.n_machines:
            raise ValueError(f"{len(machines)} machines named, the configuration says {config.n_machines}")
        if len(set(machines)) != len(machines) or party in machines:
            raise ValueError("machine names must be unique and must not include the coordinator")
        self.config = config
        self.machines = machines
        self._inbox: dict[str, Message] = {}
        self._extents: dict[str, LocalExtent] = {}
        self._counts: dict[str, AggregatedCounts] = {}
        self._grid = np.zeros(0)
        self._bottom_upper: float | None = None  # 5 g for the bottom guess (None: no bound)
        self._has_bottom = False
        self._anchors = np.zeros((0, config.d))
        self._n = 0
        self._pass2 = self._count_ok = self._discard_ok = np.zeros(0, dtype=bool)
        self._known: dict[int, bool] = {}
        self._accepted: dict[int, _Accepted] = {}
        self._lo, self._hi = -1, -1
        self._probes: list[int] = []
        self._requested: tuple[int, ...] = ()
        self._fetches: list[tuple[int, ...]] = []
        self._rejected: list[int] = []
        self._representatives = 0
        self._words: dict[tuple[int, str], int] = defaultdict(int)
        self._final: _Accepted | None = None

    # -- bookkeeping -------------------------------------------------------------------------------

    @property
    def phase(self) -> str:
        return {
            CoordinatorState.EXTENT: "extent",
            CoordinatorState.COUNTS: "counts",
            CoordinatorState.POINTS: "points",
            CoordinatorState.OUTLIERS: "outliers",
        }.get(self._state, "done")

    def pending(self) -> Sequence[str]:
        if self._state in (CoordinatorState.DONE, CoordinatorState.ERROR):
            return []
        return [m for m in self.machines if m not in self._inbox]

    def _accept(self, sender: str, message: Message) -> None:
        if sender not in self.machines:
            raise RemoteProtocolError(f"{sender} is not a machine of this run", party=sender, round_idx=self.round_idx)
        if sender in self._inbox:
            raise RemoteProtocolError(
                f"second {self.phase} message from {sender} in round {self.round_idx}",
                party=sender,
                round_idx=self.round_idx,
                phase=self.phase,
            )
        self._inbox[sender] = message
        self._words[(self.round_idx, self.phase)] += message_words(message)

    def _broadcast(self, message: Message, phase: str) -> Outgoing:
        self._words[(self.round_idx, phase)] += message_words(message) * len(self.machines)
        out = self.broadcast(self.machines, message, phase=phase)
        self._inbox = {}
        self.round_idx += 1
        return out

    # -- handlers ----------------------------------------------------------------------------------

    def _start(self) -> list[Outgoing]:
        if self.config.radius_bounds is not None:
            lo, hi = self.config.radius_bounds
            self._grid = solvers.radius_grid(lo, hi, self.config.eps)
            self.move_to(CoordinatorState.COUNTS)
        return []

    def _on_extent(self, sender: str, message: LocalExtent) -> list[Outgoing]:
        if message.anchor.shape[1] != self.config.d:
            raise RemoteProtocolError(
                f"anchor of {sender} has {message.anchor.shape[1]} features, expected {self.config.d}",
                party=sender,
                round_idx=self.round_idx,
            )
        self._accept(sender, message)
        return []

    def _on_counts(self, sender: str, message: AggregatedCounts) -> list[Outgoing]:
        extent = self._extents.get(sender)
        if extent is not None and extent.n_points != message.n_points:
            raise RemoteProtocolError(
                f"{sender} reported {extent.n_points} points, now {message.n_points}",
                party=sender,
                round_idx=self.round_idx,
            )
        if message.counts.shape[0] != self._grid.shape[0]:
            raise RemoteProtocolError(
                f"{sender} sent counts for {message.counts.shape[0]} guesses, the grid has {self._grid.shape[0]}",
                party=sender,
                round_idx=self.round_idx,
            )
        self._accept(sender, message)
        return []

    def _on_points(self, sender: str, message: WeightedPoints) -> list[Outgoing]:
        if tuple(int(t) for t in message.indices) != self._requested:
            raise RemoteProtocolError(
                f"{sender} sent guesses {message.indices.tolist()}, requested {list(self._requested)}",
                party=sender,
                round_idx=self.round_idx,
            )
        if message.points.shape[1] != self.config.d:
            raise RemoteProtocolError(
                f"{sender} sent points with {message.points.shape[1]} features, expected {self.config.d}",
                party=sender,
                round_idx=self.round_idx,
            )
        counts = self._counts[sender]
        offsets = np.concatenate([[0], np.cumsum(message.sizes)])
        for j, t in enumerate(self._requested):
            weight = int(message.weights[offsets[j] : offsets[j + 1]].sum())
            if int(message.sizes[j]) != int(counts.counts[t]) or weight + int(counts.discarded[t]) != counts.n_points:
                raise RemoteProtocolError(
                    f"{sender}'s data for guess {t} ({int(message.sizes[j])} points of weight {weight}) does not "
                    f"match its counts ({int(counts.counts[t])} points, {int(counts.discarded[t])} discarded of "
                    f"{counts.n_points})",
                    party=sender,
                    round_idx=self.round_idx,
                )
        self._accept(sender, message)
        self._representatives += int(message.points.shape[0])
        return []

    def _on_outlier_count(self, sender: str, message: OutlierCount) -> list[Outgoing]:
        self._accept(sender, message)
        return []

    def _advance(self) -> list[Outgoing]:
        if self._state in (CoordinatorState.DONE, CoordinatorState.ERROR) or len(self._inbox) < len(self.machines):
            return []
        if self._state is CoordinatorState.EXTENT:
            self._extents = dict(self._inbox)  # type: ignore[arg-type]
            self._build_grid()
            out = self._broadcast(RadiusGrid(radii=self._grid), "grid")
            self.move_to(CoordinatorState.COUNTS)
            return [out]
        if self._state is CoordinatorState.COUNTS:
            self._counts = dict(self._inbox)  # type: ignore[arg-type]
            self._pre_test()
            return self._next_fetch()
        if self._state is CoordinatorState.POINTS:
            self._evaluate(dict(self._inbox))  # type: ignore[arg-type]
            return self._next_fetch()
        # OUTLIERS
        total = sum(int(m.outliers) for m in self._inbox.values())  # type: ignore[attr-defined]
        self._finish(self._build_result(total))
        return []

    # -- the grid and the search -------------------------------------------------------------------

    def _build_grid(self) -> None:
        """The grid of guesses from the machines' extents (spec 2.4, practical alternative)."""
        extents = [self._extents[m] for m in self.machines]
        anchors = [(e.anchor[0], e.radius) for e in extents if e.anchor.shape[0]]
        self._anchors = np.asarray([a for a, _ in anchors]).reshape(-1, self.config.d)
        diameter = 0.0
        if anchors:
            between = _kernels.pairwise_distances(self._anchors)
            radii = np.asarray([r for _, r in anchors])
            diameter = float(np.max(radii[:, None] + between + radii[None, :]))
        spacing = min(e.min_distance for e in extents) / 4.0
        self._has_bottom = True
        if diameter <= 0 or not math.isfinite(spacing):
            # every machine aggregates identically for every L: the bottom guess stands for all
            self._grid = np.zeros(1)
            self._bottom_upper = None
        else:
            self._grid = np.concatenate([[0.0], solvers.radius_grid(spacing, diameter / 2.0, self.config.eps)])
            self._bottom_upper = 5.0 * spacing

    def _pre_test(self) -> None:
        """PASS2 for every guess (Round 2 with the discarded-count fix of GAP 1)."""
        cfg = self.config
        counts = [self._counts[m] for m in self.machines]
        self._n = sum(c.n_points for c in counts)
        check_instance(self._n, cfg.k, cfg.z)
        total_counts = np.sum([c.counts for c in counts], axis=0)
        total_discarded = np.sum([c.discarded for c in counts], axis=0)
        self._count_ok = total_counts <= cfg.max_reps
        self._discard_ok = total_discarded <= cfg.outlier_budget
        self._pass2 = self._count_ok & self._discard_ok
        self._known = {t: False for t in range(self._grid.shape[0]) if not self._pass2[t]}
        top = self._grid.shape[0] - 1
        if not self._pass2[top]:
            raise ValueError(
                f"the largest radius guess {self._grid[top]:g} fails the Round-2 test; "
                "the radius bounds do not contain the optimal radius"
            )
        self._lo, self._hi = -1, top

    def _next_fetch(self) -> list[Outgoing]:
        """Pick the next guesses to fetch, or broadcast the answer when the search is over."""
        request = self._linear_request() if self.config.search == "linear" else self._binary_request()
        if request is None:
            return self._conclude()
        self._requested = request
        self._fetches.append(request)
        self.move_to(CoordinatorState.POINTS)
        return [self._broadcast(RadiusGuesses(indices=np.asarray(request, dtype=np.int64)), "fetch")]

    def _linear_request(self) -> tuple[int, ...] | None:
        if self._accepted:
            self._final = self._accepted[min(self._accepted)]
            return None
        untried = [t for t in range(self._grid.shape[0]) if t not in self._known]
        if not untried:
            raise ValueError("every radius guess was rejected; the radius bounds do not contain the optimal radius")
        batch = self.config.batch or len(untried)
        return tuple(untried[:batch])

    def _binary_request(self) -> tuple[int, ...] | None:
        batch = self.config.batch
        while True:
            lo, hi = self._lo, self._hi
            if hi - lo <= 1:
                if hi in self._accepted:
                    self._final = self._accepted[hi]
                    return None
                if self._known.get(hi) is False:
                    raise ValueError(
                        f"radius guess {self._grid[hi]:g} was rejected although it must pass; "
                        "the radius bounds do not contain the optimal radius"
                    )
                self._probes = [hi]
                return (hi,)
            inner = hi - lo - 1
            b = min(batch or inner, inner)
            probes = sorted({lo + ((hi - lo) * j) // (b + 1) for j in range(1, b + 1)} - {lo, hi})
            self._probes = probes
            fetch = tuple(t for t in probes if t not in self._known)
            if fetch:
                return fetch
            self._update_bounds()

    def _update_bounds(self) -> None:
        """lo-fails/hi-passes update from the outcomes of the current probes.

        Probes are evaluated in increasing order up to the first success, so those above it may
        be unknown; they do not matter: hi moves to the first passing probe and lo to the last
        failing probe below it (or to the last probe if none passed).
        """
        probes = self._probes
        passing = [t for t in probes if self._known.get(t) is True]
        if passing:
            failing = [t for t in probes if t < passing[0]]
            self._hi = passing[0]
            if failing:
                self._lo = max(self._lo, failing[-1])
        else:
            self._lo = max(self._lo, probes[-1])

    def _evaluate(self, replies: dict[str, WeightedPoints]) -> None:
        """Run kzc on each fetched guess in increasing order, up to the first success."""
        for j, t in enumerate(self._requested):
            parts, weights = [], []
            for m in self.machines:
                reply = replies[m]
                offsets = np.concatenate([[0], np.cumsum(reply.sizes)])
                parts.append(reply.points[offsets[j] : offsets[j + 1]])
                weights.append(reply.weights[offsets[j] : offsets[j + 1]])
            accepted = self._solve(t, np.concatenate(parts, axis=0), np.concatenate(weights))
            self._known[t] = accepted is not None
            if accepted is None:
                self._rejected.append(t)
            else:
                self._accepted[t] = accepted
                break
        if self.config.search == "binary":
            self._update_bounds()

    def _solve(self, t: int, points: np.ndarray, weights: np.ndarray) -> _Accepted | None:
        """Round 4 for guess t: z', then kzc (with the refinement); ``None`` means "No"."""
        cfg = self.config
        discarded = int(sum(int(self._counts[m].discarded[t]) for m in self.machines))
        z_prime = cfg.outlier_budget - discarded
        if z_prime < 0:
            return None
        guess = float(self._grid[t])
        bottom = self._has_bottom and t == 0
        dist = _kernels.pairwise_distances(points)
        if bottom:
            cover = solvers.smallest_cover_radius(
                dist, weights, cfg.k, z_prime, grow=2.0, expand=4.0, upper=self._bottom_upper
            )
            if cover is None:
                return None
            radius = 4.0 * cover.radius  # the bottom guess moved only copies of points
        elif cfg.refine:
            cover = solvers.smallest_cover_radius(dist, weights, cfg.k, z_prime, grow=2.0, expand=4.0, upper=5 * guess)
            if cover is None:
                return None
            radius = 4.0 * cover.radius + 4.0 * guess
        else:
            cover = solvers.kzc(dist, weights, cfg.k, z_prime, 5.0 * guess)
            if not cover.ok:
                return None
            radius = 24.0 * guess
        pool = np.concatenate([points, self._anchors], axis=0)
        chosen = solvers.pad_centres(pool, cover.centres, cfg.k)
        return _Accepted(t, pool[chosen], float(radius), float(cover.radius), float(z_prime), discarded)

    def _conclude(self) -> list[Outgoing]:
        assert self._final is not None
        out = self._broadcast(FinalCentres(radius=self._final.radius, centres=self._final.centres), "centres")
        self.move_to(CoordinatorState.OUTLIERS)
        return [out]

    def _build_result(self, outliers: int) -> CoordinatorResult:
        final = self._final
        assert final is not None
        return CoordinatorResult(
            centres=final.centres,
            radius=final.radius,
            guess=float(self._grid[final.index]),
            guess_index=final.index,
            kzc_radius=final.kzc_radius,
            z_prime=final.z_prime,
            discarded=final.discarded,
            n=self._n,
            grid=self._grid.copy(),
            pass2=self._pass2.copy(),
            count_ok=self._count_ok.copy(),
            discard_ok=self._discard_ok.copy(),
            fetches=tuple(self._fetches),
            rejected=tuple(self._rejected),
            outliers=outliers,
            representatives=self._representatives,
            words=dict(self._words),
        )

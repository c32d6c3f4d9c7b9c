"""Distributed (k,z)-center with (1+eps)z outliers: Guo & Li's dist-kzc over a grid of radius guesses.

Theory of operation (Guo & Li, "Distributed k-Clustering for Data with Heavy Noise", NeurIPS 2018,
Section 2, Algorithms 1-3 and Appendix B; spec kz-clustering.md sections 2.1-2.7, with the fixes
of GAPs 1 and 2; the ``probe`` search, the tight count test and the polishing answer issue 15).

Roles: one :class:`KzCoordinator` (party ``coordinator``) and m :class:`KzMachine` s (parties
``machine-0 .. machine-{m-1}``), in a star: machines talk only to the coordinator. Machine i holds
P_i (any partition, possibly empty parts). Everyone knows the :class:`KzCenterConfig` (k, z, eps,
m, d and the search options); a coordinator whose configuration has ``d = None`` (it holds no
data, and the machines hold only their own) learns d from the first round in which every machine
sends points (the extents' anchors, or with ``radius_bounds`` the first fetched points) and
refuses by name a machine whose points have another number of features
(`fedproto.algorithms.kzclustering.setup.agree_feature_count`).

Idea: for a guess L, machine i absorbs every ball ``ball(p, 4L)`` around a point whose ``2L``
ball holds more than ``y = eps z / (k m)`` of its remaining points into one weighted
representative (`solvers.aggregate`); the remaining points are discarded. If L >= L* (the optimal
radius), the machines produce few representatives in total and discard at most ``(1+eps) z``
points (Lemmas 2.6, 2.7), and the coordinator's Charikar-style solver kzc (Algorithm 1, radii
2L'/4L') covers the representatives with ``z' = (1+eps) z - discarded`` outlier weight at
``L' = 5L``. So the coordinator searches the grid of guesses for the smallest one that passes.
Machines aggregate lazily: only at the radii the coordinator asks about, once per radius
(guesses below the local spacing, or above the local reach, share one aggregation).

Sub-machines (Appendix B, spec 2.7). With ``config.sub_machines = t > 1`` every machine splits
its points into t strided parts (`solvers.split_sub_machines`) and aggregates each part as one
machine, so dist-kzc runs over ``m' = m t`` virtual machines: y, the count bound and the cap are
those of m' (`KzCenterConfig.virtual_machines`) and every guarantee is the paper's for m'
machines. A machine still sends one message per request: the sums of its parts' counts, and
their representatives concatenated in part order (the same run as m' machines holding the parts,
in fewer messages; tested). Local work per guess falls from ``n_i^2`` to ``n_i^2 / t``.

The grid. Without ``radius_bounds`` (spec 2.4, practical alternative) machines first send
:class:`LocalExtent` (phase ``extent``: ``n_i``, the local smallest nonzero distance, an anchor,
the radius around it); the coordinator bounds the diameter by ``max (r_i + d(a_i, a_j) + r_j)``
and builds ``[0, g, g(1+eps), ...]`` up to the first value ``>= diameter / 2``, with ``g = min_i
dmin_i / 4``. Every machine aggregates identically for all L in ``[0, g)`` (its 4L balls hold only
copies of a point), so the guess 0 stands for that whole interval (the "bottom" guess; see
below). With ``radius_bounds = (A, B)`` the grid is ``A (1+eps)^t`` up to ``>= B``, known to all,
and there is no extent round.

PASS2 (Round 2 with the fix of GAP 1): ``sum_i |P'_i(L)| <= count_bound`` and ``sum_i |U_i(L)|
<= (1+eps) z`` (with the count test alone, tiny guesses pass because nothing is aggregated).
``count_bound`` is ``k m + floor(z / (floor(y) + 1))`` (``count_test="tight"``, the default;
proof at :attr:`KzCenterConfig.count_bound`) or the paper's ``k m (1 + 1/eps)`` (``"paper"``). Every
L >= L* passes either, so a guess that fails certifies L < L*.

Search ``probe`` (the default): counts before points, and points only for the chosen guess.

* The coordinator keeps lo (a guess known to fail, or the sentinel -1) and hi (a guess known to
  pass PASS2, or the top guess, which always does) and sends :class:`RadiusProbes` (phase
  ``probe``: ``batch`` evenly spaced radii strictly between them; 1 by default, i.e. bisection;
  ``batch = 0``: every guess up to hi at once); each machine aggregates at those radii and answers
  :class:`ProbeCounts` (phase ``counts``: ``|P'_i(L)|`` per radius, and ``|U_i(L)|`` only when
  ``y >= 1``: below that every point's own ball qualifies, so nothing is ever discarded). hi moves
  to the smallest passing probe, lo to the largest failing probe below it.
* When hi follows lo, the coordinator asks for hi's data with :class:`RadiusFetch` (phase
  ``fetch``; a top guess never probed is probed first) and each machine sends
  :class:`Representatives` (phase ``points``). A kzc "No" certifies L_hi < L* (GAP 2); the search
  then bisects ``(hi, top]`` on the full predicate: one guess per round, its counts first and, if
  it passes PASS2, its points; a failure (PASS2 or kzc) moves lo up, an acceptance moves hi down.

lo < L* always holds, so hi is at most the first grid value >= L*, even though the predicate is
not monotone. The tight count test is what keeps the fetch small: with z = 0 at most k
representatives per machine pass it, where the paper's test lets up to ``k m (1 + 1/eps)``
through, most of which kzc then rejects.

Searches ``linear`` and ``binary`` (spec 2.5 as first built): the coordinator sends the whole grid
:class:`RadiusGrid` (phase ``grid``), which asks for the counts of every guess; machines answer
:class:`AggregatedCounts` (phase ``counts``: ``n_i``, ``|P'_i(L_t)|`` and ``|U_i(L_t)|`` for all
t), and the coordinator asks for the data of some candidates with :class:`RadiusGuesses` (phase
``fetch``); machines send :class:`WeightedPoints` (phase ``points``). The coordinator evaluates
the fetched candidates in increasing order and fetches more (one round each) according to
``search``:

- ``linear``: the next ``batch`` untried PASS2 candidates (``batch = 0``: all of them in the
  first fetch). The first success is at the smallest passing guess, which is at most the first
  grid value >= L*.
- ``binary``: lo-fails/hi-passes search over the grid (hi starts at the top guess, which always
  passes), fetching ``batch`` evenly spaced probes per round; ends when hi follows lo.

On success (every search) the coordinator refines (``refine``, spec 2.5): the smallest kzc radius
``L'' <= 5 L_t`` over the exact breakpoints of the fetched points, and certifies ``L_out = 4 L'' +
4 L_t <= 24 L_t`` (without refinement ``L_out = 24 L_t``). It first searches with outlier weight
``z - discarded``, so that at most z points lie beyond L_out, and falls back to z' only when no
radius up to ``5 L_t`` succeeds with that (the bound ``24 L_t``, hence the guarantee, is the
same). The bottom guess uses z', ``upper = 5 g`` and no move term (its representatives absorbed
only copies), so if L* < g it certifies ``L_out <= 4 L*``; if it fails, L* >= g. Then, when ``z >
0`` and ``polish`` is on, it improves the centres by swap local search on the representatives for
the paper's cost (z points removed), accepting only centres whose own certificate stays at most
L_out (`fedproto.algorithms.kzclustering.polish`).

Final round: :class:`FinalCentres` (phase ``centres``, broadcast: the k centres and L_out); each
machine labels its points farther than L_out as outliers and replies with :class:`OutlierCount`
(phase ``outliers``). Guarantee: at most ``(1+eps) z`` outliers in total, and ``L_out <= 24 (1+eps)
L*`` (Claim 2.5, Theorem 1.1).

Words (scalars in either direction; the coordinator's result records them per round and phase),
for m machines, d features, T grid guesses, and ``[y >= 1]`` = 1 when discarded counts travel:

* ``probe``, with P probes in all and one fetch of R representatives::

      extent m (d + 3)  +  probe m P  +  counts m P (1 + [y >= 1])  +  fetch m
      +  points (d + 1) R  +  centres m (k d + 1)  +  outliers m

  (no extent term with ``radius_bounds``). With ``batch = 1``, ``P <= ceil(log2 T) + 1`` and
  ``R <= count_bound``. After a kzc "No" come at most ``ceil(log2 T) + 1`` more rounds, each a
  probe of one guess and, if it passes PASS2, its fetch (``m`` plus its points). Nothing depends
  on n, and z enters only through ``R <= k m + z / (floor(y) + 1)``. Message phases: 2 per probe
  round, 2 per fetch, 2 for the answer, plus the extent.
* ``linear`` and ``binary``: extent ``m (d + 3)``, grid ``m T``, counts ``m (2T + 1)``, each fetch
  ``m b``, each points phase ``<= (d + 1) count_bound`` per fetched guess plus ``2 b m``, centres
  ``m (k d + 1)``, outliers ``m``: 3 round trips plus the outlier upload when the first fetch
  succeeds (7 message phases; 5 with ``radius_bounds``, the paper's 4 rounds plus the outlier
  labels), 2 more phases per extra fetch.

Failure: no dropout tolerance (every machine's data is needed). A silent machine makes the
coordinator fail with :class:`~fedproto.errors.InsufficientParticipants` naming it; a message
out of order, from a stranger, or inconsistent with earlier ones (wrong number of counts, sizes
that do not match the counts, weights plus discarded points not equal to ``n_i``, a fetch of a
radius never probed) is a :class:`~fedproto.errors.RemoteProtocolError`. ``k > n`` or ``z >= n``
fail the coordinator with ``ValueError`` as soon as it knows n (from the extents; with
``radius_bounds``, from the counts or, in the ``probe`` search, the first fetched points).
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
    ProbeCounts,
    RadiusFetch,
    RadiusGrid,
    RadiusGuesses,
    RadiusProbes,
    Representatives,
    WeightedPoints,
    message_words,
)
from fedproto.algorithms.kzclustering.polish import polish_centres
from fedproto.algorithms.kzclustering.setup import agree_feature_count
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


def _check_points(points: np.ndarray, d: int | None) -> np.ndarray:
    if d is None:
        raise ValueError("a machine's configuration must state d, its points' number of features")
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
        probed: bool ``[T]``, the guesses whose counts the machines reported (all of them in the
            ``linear`` and ``binary`` searches).
        pass2: bool ``[T]``, the Round-2 pre-test; ``count_ok`` and ``discard_ok`` its two halves
            (all three False where not probed).
        count_ok: bool ``[T]``, ``sum counts <= count_bound``.
        discard_ok: bool ``[T]``, ``sum discarded <= (1+eps) z``.
        probe_rounds: the guesses probed, one tuple per probe round (``probe`` search; empty
            otherwise).
        fetches: the guesses fetched, one tuple per fetch round.
        rejected: the fetched guesses kzc rejected (each certifies L_t < L*).
        polished: whether local search changed kzc's centres.
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
    probed: np.ndarray
    pass2: np.ndarray
    count_ok: np.ndarray
    discard_ok: np.ndarray
    probe_rounds: tuple[tuple[int, ...], ...]
    fetches: tuple[tuple[int, ...], ...]
    rejected: tuple[int, ...]
    polished: bool
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

    AWAIT_GRID = enum.auto()  # before the first request (the grid, or the first probes)
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
        workers: threads that aggregate the sub-machines (``config.sub_machines`` parts) at
            once, ``>= 1``; the results do not depend on it.

    Raises:
        ValueError: ``points`` has the wrong shape or holds NaN/inf, or ``workers < 1``.

    Memory and time: no ``[n_i, n_i]`` matrix (`fedproto.algorithms.kzclustering.solvers.SubMachines`
    aggregates from a k-d tree's neighbour pairs or from blocks of rows, exactly as the dense
    Algorithm 2), and one aggregation per radius the coordinator asks about (cached), each at
    most O(n_i^2 / t) time for t = ``config.sub_machines`` parts (spec 2.2 and 2.7); radii below
    the local spacing or above the local reach reuse one aggregation. The local computation goes through
    :meth:`_local_extent` and :meth:`_aggregate_at` only.
    """

    State = MachineState
    INITIAL_STATE = MachineState.AWAIT_GRID
    DEADLINE_FACTOR = 2.0
    TRANSITIONS = {
        (MachineState.AWAIT_GRID, RadiusGrid): ("_on_grid", MachineState.AWAIT_REQUEST),
        (MachineState.AWAIT_GRID, RadiusProbes): ("_on_probes", MachineState.AWAIT_REQUEST),
        (MachineState.AWAIT_REQUEST, RadiusProbes): ("_on_probes", MachineState.AWAIT_REQUEST),
        (MachineState.AWAIT_REQUEST, RadiusFetch): ("_on_fetch", MachineState.AWAIT_REQUEST),
        (MachineState.AWAIT_REQUEST, RadiusGuesses): ("_on_guesses", MachineState.AWAIT_REQUEST),
        (MachineState.AWAIT_REQUEST, FinalCentres): ("_on_centres", MachineState.DONE),
    }

    def __init__(
        self,
        party: str,
        *,
        config: KzCenterConfig,
        points: np.ndarray,
        coordinator: str = COORDINATOR,
        workers: int = 1,
    ) -> None:
        super().__init__(party)
        self.config = config
        self.coordinator = coordinator
        self.points = _check_points(points, config.d)
        # the local work runs without an n_i x n_i matrix (solvers.SubMachines / PointIndex: k-d tree
        # neighbour pairs or blocks of distance rows; the same results as the dense matrix), over
        # config.sub_machines parts, each one virtual machine of the config's threshold and caps
        self._local = solvers.SubMachines(self.points, parts=config.sub_machines, workers=workers)
        self._extent_cache: LocalExtent | None = None
        self._grid: np.ndarray | None = None
        self._asked: list[float] = []  # radii asked about, in order (the grid for linear/binary)
        self._probed: set[float] = set()
        self._cache: dict[float, solvers.Aggregation] = {}

    @property
    def phase(self) -> str:
        return "extent" if self._state is MachineState.AWAIT_GRID else "counts"

    def distances(self) -> np.ndarray:
        """The local distance matrix ``[n_i, n_i]``, for inspection only (computed on each call,
        not kept: the protocol's own work never forms it)."""
        return _kernels.pairwise_distances(self.points)

    def aggregation(self, radius: float) -> solvers.Aggregation:
        """The aggregation at ``radius`` (computed on first use, then cached)."""
        return self._aggregate_at(float(radius))

    def aggregations(self) -> list[solvers.Aggregation]:
        """The aggregations of the radii asked about so far, in the order asked (for the
        ``linear`` and ``binary`` searches: the grid)."""
        return [self._aggregate_at(r) for r in self._asked]

    # -- local computation (the only users of the distance matrix) ---------------------------------

    def _local_extent(self) -> LocalExtent:
        """``n_i``, the smallest nonzero pairwise distance (``inf`` if none), the anchor (point 0)
        and the largest distance from it, as the extent message (computed once)."""
        if self._extent_cache is None:
            local = self._local.extent()  # k-d tree and distance rows, the same numbers as the matrix
            self._extent_cache = LocalExtent(
                n_points=local.n_points,
                min_distance=local.min_distance,
                radius=local.radius,
                anchor=self.points[: min(local.n_points, 1)].copy(),
            )
        return self._extent_cache

    def _aggregate_at(self, radius: float) -> solvers.Aggregation:
        """Aggregating(P_i, radius, y), cached per radius: `solvers.SubMachines.aggregate`, equal
        to `solvers.aggregate` on the distance matrix without forming it.

        Below a quarter of the local spacing every 4L ball holds only copies of its centre, the
        same as L = 0; from the anchor's radius up every 2L ball holds every point (``2L >= 2 r_0
        >= diameter``), the same for all such L. Both ranges share one cached aggregation.
        """
        extent = self._local_extent()
        if 4.0 * radius < extent.min_distance:
            key = 0.0
        elif extent.n_points and radius >= extent.radius:
            key = extent.radius
        else:
            key = radius
        agg = self._cache.get(key)
        if agg is None:
            cfg = self.config
            agg = self._local.aggregate(key, cfg.threshold, max_reps=cfg.max_reps, candidates=cfg.candidates)
            self._cache[key] = agg
        return agg

    # -- handlers ----------------------------------------------------------------------------------

    def _start(self) -> list[Outgoing]:
        if self.config.radius_bounds is None:
            return [self.send(self.coordinator, self._extent(), phase="extent")]
        if self.config.search == "probe":
            return []  # the coordinator sends the first probes
        lo, hi = self.config.radius_bounds
        self.move_to(MachineState.AWAIT_REQUEST)
        return [self._counts(solvers.radius_grid(lo, hi, self.config.eps))]

    def _extent(self) -> LocalExtent:
        return self._local_extent()

    def _counts(self, grid: np.ndarray) -> Outgoing:
        """Aggregate at every guess of the grid and build the Phase-1 message (linear/binary)."""
        self._grid = np.asarray(grid, dtype=np.float64)
        self._asked = [float(r) for r in self._grid]
        aggregations = [self._aggregate_at(r) for r in self._asked]
        counts = np.asarray([a.count for a in aggregations], dtype=np.int64)
        discarded = np.asarray([a.discarded for a in aggregations], dtype=np.int64)
        message = AggregatedCounts(n_points=int(self.points.shape[0]), counts=counts, discarded=discarded)
        return self.send(self.coordinator, message, phase="counts")

    def _check_sender(self, sender: str) -> None:
        if sender != self.coordinator:
            raise RemoteProtocolError(
                f"{sender} is not the coordinator", party=sender, round_idx=self.round_idx, state=self._state.name
            )

    def _check_search(self, sender: str, message: Message, probe: bool) -> None:
        """The request must belong to the configured search (``probe`` or a grid search)."""
        self._check_sender(sender)
        if (self.config.search == "probe") != probe:
            raise RemoteProtocolError(
                f"{type(message).__name__} does not belong to the {self.config.search!r} search",
                party=sender,
                round_idx=self.round_idx,
                state=self._state.name,
            )

    def _on_grid(self, sender: str, message: RadiusGrid) -> list[Outgoing]:
        self._check_search(sender, message, probe=False)
        self.round_idx += 1
        return [self._counts(message.radii)]

    def _on_probes(self, sender: str, message: RadiusProbes) -> list[Outgoing]:
        self._check_search(sender, message, probe=True)
        aggregations = []
        for radius in message.radii:
            radius = float(radius)
            aggregations.append(self._aggregate_at(radius))
            if radius not in self._probed:
                self._probed.add(radius)
                self._asked.append(radius)
        counts = np.asarray([a.count for a in aggregations], dtype=np.int64)
        if self.config.sends_discarded:
            discarded = np.asarray([a.discarded for a in aggregations], dtype=np.int64)
        else:
            discarded = np.zeros(0, dtype=np.int64)
        self.round_idx += 1
        return [self.send(self.coordinator, ProbeCounts(counts=counts, discarded=discarded), phase="counts")]

    def _fetchable(self, sender: str, radius: float, label: str) -> solvers.Aggregation:
        agg = self._aggregate_at(radius)
        if agg.overflow:
            raise RemoteProtocolError(
                f"guess {label} failed the count test on this machine; it cannot be fetched",
                party=sender,
                round_idx=self.round_idx,
            )
        return agg

    def _on_fetch(self, sender: str, message: RadiusFetch) -> list[Outgoing]:
        self._check_search(sender, message, probe=True)
        radius = float(message.radius)
        if radius not in self._probed:
            raise RemoteProtocolError(
                f"radius {radius:g} was never probed; its counts must come before its points",
                party=sender,
                round_idx=self.round_idx,
            )
        agg = self._fetchable(sender, radius, f"{radius:g}")
        self.round_idx += 1
        reply = Representatives(points=self.points[agg.reps], weights=agg.weights.astype(np.int64))
        return [self.send(self.coordinator, reply, phase="points")]

    def _on_guesses(self, sender: str, message: RadiusGuesses) -> list[Outgoing]:
        self._check_search(sender, message, probe=False)
        assert self._grid is not None
        if int(message.indices.max()) >= self._grid.shape[0]:
            raise RemoteProtocolError(
                f"guess index {int(message.indices.max())} is outside the grid of {self._grid.shape[0]}",
                party=sender,
                round_idx=self.round_idx,
            )
        points, weights, sizes = [], [], []
        for t in message.indices:
            agg = self._fetchable(sender, float(self._grid[int(t)]), str(int(t)))
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
    COUNTS = enum.auto()  # linear/binary: the counts of every guess
    PROBE = enum.auto()  # probe: the counts of the probed guesses
    POINTS = enum.auto()  # linear/binary: the fetched guesses' points
    REPRESENTATIVES = enum.auto()  # probe: the fetched guess's points
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
    polished: bool


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
        (CoordinatorState.PROBE, ProbeCounts): ("_on_probe_counts", CoordinatorState.PROBE),
        (CoordinatorState.POINTS, WeightedPoints): ("_on_points", CoordinatorState.POINTS),
        (CoordinatorState.REPRESENTATIVES, Representatives): (
            "_on_representatives",
            CoordinatorState.REPRESENTATIVES,
        ),
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
        self._d = config.d  # None: learnt from the machines' first points (agree_feature_count)
        self._widths: dict[str, int] = {}  # feature counts of this round's points while d is unknown
        self._anchors = np.zeros((0, config.d or 0))
        self._n = 0
        # per machine and guess: (count, discarded), -1 where not reported; and n_i once known
        self._table: dict[str, np.ndarray] = {}
        self._n_of: dict[str, int] = {}
        self._probed = self._pass2 = self._count_ok = self._discard_ok = np.zeros(0, dtype=bool)
        self._known: dict[int, bool] = {}
        self._accepted: dict[int, _Accepted] = {}
        self._lo, self._hi = -1, -1
        self._probes: list[int] = []  # binary search: the probes of the current fetch round
        self._probing: list[int] = []  # probe search: the guesses whose counts are in flight
        self._full = False  # probe search: on the full predicate (after a kzc "No")
        self._probe_rounds: list[tuple[int, ...]] = []
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
            CoordinatorState.PROBE: "counts",
            CoordinatorState.POINTS: "points",
            CoordinatorState.REPRESENTATIVES: "points",
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

    def _start_table(self) -> None:
        """Empty per-guess bookkeeping once the grid is known."""
        t = self._grid.shape[0]
        self._table = {m: np.full((t, 2), -1, dtype=np.int64) for m in self.machines}
        self._probed = np.zeros(t, dtype=bool)
        self._pass2 = np.zeros(t, dtype=bool)
        self._count_ok = np.zeros(t, dtype=bool)
        self._discard_ok = np.zeros(t, dtype=bool)

    def _set_n(self) -> None:
        """n from every machine's n_i, and the instance check (k <= n, z < n)."""
        self._n = sum(self._n_of[m] for m in self.machines)
        check_instance(self._n, self.config.k, self.config.z)

    def _pass2_of(self, guesses: Sequence[int]) -> None:
        """PASS2 for ``guesses`` from the table (Round 2 with the discarded-count fix of GAP 1)."""
        cfg = self.config
        idx = np.asarray(guesses, dtype=np.int64)
        rows = np.stack([self._table[m][idx] for m in self.machines])  # [m, b, 2]
        total = rows.sum(axis=0)
        self._probed[idx] = True
        self._count_ok[idx] = total[:, 0] <= cfg.count_bound
        self._discard_ok[idx] = total[:, 1] <= cfg.outlier_budget
        self._pass2[idx] = self._count_ok[idx] & self._discard_ok[idx]

    def _discarded_at(self, t: int) -> int:
        return int(sum(int(self._table[m][t, 1]) for m in self.machines))

    # -- handlers ----------------------------------------------------------------------------------

    def _start(self) -> list[Outgoing]:
        if self.config.radius_bounds is not None:
            lo, hi = self.config.radius_bounds
            self._grid = solvers.radius_grid(lo, hi, self.config.eps)
            self._start_table()
            if self.config.search == "probe":
                self._lo, self._hi = -1, self._grid.shape[0] - 1
                return self._next_probe()
            self.move_to(CoordinatorState.COUNTS)
        return []

    def _check_width(self, sender: str, width: int, kind: str) -> None:
        """A machine's points have ``self._d`` features; while d is unknown, note the width (the
        round's widths are compared when the round is complete, :meth:`_settle_features`)."""
        if self._d is None:
            if sender in self.machines and sender not in self._inbox:
                self._widths[sender] = int(width)
        elif width != self._d:
            raise RemoteProtocolError(
                f"anchor of {sender} has {width} features, expected {self._d}"
                if kind == "anchor"
                else f"{sender} sent points with {width} features, expected {self._d}",
                party=sender,
                round_idx=self.round_idx,
            )

    def _settle_features(self) -> None:
        """d from the first round in which every machine sent points: the count they agree on
        (a machine with another count is refused by name)."""
        if self._d is None and self._widths:
            self._d = agree_feature_count(
                {m: self._widths[m] for m in self.machines}, round_idx=self.round_idx, phase=self.phase
            )
            self._widths = {}
            if self._anchors.shape[0] == 0:
                self._anchors = np.zeros((0, self._d))

    def _on_extent(self, sender: str, message: LocalExtent) -> list[Outgoing]:
        self._check_width(sender, message.anchor.shape[1], "anchor")
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

    def _on_probe_counts(self, sender: str, message: ProbeCounts) -> list[Outgoing]:
        b = len(self._probing)
        expected = b if self.config.sends_discarded else 0
        if message.counts.shape[0] != b or message.discarded.shape[0] != expected:
            raise RemoteProtocolError(
                f"{sender} sent {message.counts.shape[0]} counts and {message.discarded.shape[0]} discarded "
                f"counts for {b} probes (expected {b} and {expected})",
                party=sender,
                round_idx=self.round_idx,
            )
        n_i = self._n_of.get(sender)
        largest = int(message.counts.max(initial=0))
        if largest > self.config.max_reps + 1 or (n_i is not None and largest > n_i):
            raise RemoteProtocolError(
                f"{sender} reported {largest} representatives, more than aggregation can produce",
                party=sender,
                round_idx=self.round_idx,
            )
        if n_i is not None and message.discarded.size and int(message.discarded.max()) > n_i:
            raise RemoteProtocolError(
                f"{sender} discarded {int(message.discarded.max())} of its {n_i} points",
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
        self._check_width(sender, message.points.shape[1], "points")
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

    def _on_representatives(self, sender: str, message: Representatives) -> list[Outgoing]:
        self._check_width(sender, message.points.shape[1], "points")
        (t,) = self._requested
        count, discarded = (int(v) for v in self._table[sender][t])
        weight = int(message.weights.sum())
        n_i = self._n_of.get(sender)
        if message.points.shape[0] != count or (n_i is not None and weight + discarded != n_i):
            raise RemoteProtocolError(
                f"{sender}'s data for guess {t} ({message.points.shape[0]} points of weight {weight}) does not "
                f"match its counts ({count} points, {discarded} discarded of "
                f"{'its points' if n_i is None else n_i})",
                party=sender,
                round_idx=self.round_idx,
            )
        self._accept(sender, message)
        self._n_of[sender] = weight + discarded  # with radius bounds, n_i is learnt here
        self._representatives += int(message.points.shape[0])
        return []

    def _on_outlier_count(self, sender: str, message: OutlierCount) -> list[Outgoing]:
        self._accept(sender, message)
        return []

    def _advance(self) -> list[Outgoing]:
        if self._state in (CoordinatorState.DONE, CoordinatorState.ERROR) or len(self._inbox) < len(self.machines):
            return []
        self._settle_features()
        if self._state is CoordinatorState.EXTENT:
            self._extents = dict(self._inbox)  # type: ignore[arg-type]
            self._n_of = {m: self._extents[m].n_points for m in self.machines}
            self._set_n()
            self._build_grid()
            self._start_table()
            if self.config.search == "probe":
                self._lo, self._hi = -1, self._grid.shape[0] - 1
                return self._next_probe()
            out = self._broadcast(RadiusGrid(radii=self._grid), "grid")
            self.move_to(CoordinatorState.COUNTS)
            return [out]
        if self._state is CoordinatorState.COUNTS:
            self._counts = dict(self._inbox)  # type: ignore[arg-type]
            self._pre_test()
            return self._next_fetch()
        if self._state is CoordinatorState.PROBE:
            self._record_probes(dict(self._inbox))  # type: ignore[arg-type]
            return self._next_probe()
        if self._state is CoordinatorState.POINTS:
            self._evaluate(dict(self._inbox))  # type: ignore[arg-type]
            return self._next_fetch()
        if self._state is CoordinatorState.REPRESENTATIVES:
            if len(self._fetches) == 1 and self.config.radius_bounds is not None:
                self._set_n()  # n_i first learnt from the fetched weights
            self._record_fetch(dict(self._inbox))  # type: ignore[arg-type]
            return self._next_probe()
        # OUTLIERS
        total = sum(int(m.outliers) for m in self._inbox.values())  # type: ignore[attr-defined]
        self._finish(self._build_result(total))
        return []

    # -- the grid and the search -------------------------------------------------------------------

    def _build_grid(self) -> None:
        """The grid of guesses from the machines' extents (spec 2.4, practical alternative)."""
        extents = [self._extents[m] for m in self.machines]
        anchors = [(e.anchor[0], e.radius) for e in extents if e.anchor.shape[0]]
        self._anchors = np.asarray([a for a, _ in anchors]).reshape(-1, self._d)
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
        for m in self.machines:
            counts = self._counts[m]
            self._n_of[m] = counts.n_points
            self._table[m][:, 0] = counts.counts
            self._table[m][:, 1] = counts.discarded
        self._set_n()
        self._pass2_of(range(self._grid.shape[0]))
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

    # -- the probe search ------------------------------------------------------------------------

    def _next_probe(self) -> list[Outgoing]:
        """The next probe round, fetch, or the answer (counts before points).

        Until kzc first says "No", hi is a guess that passes PASS2 (or the top guess) and the
        bisection runs on PASS2 alone, ``batch`` probes per round; the guess it ends at is
        fetched. After a "No" at t, the search runs on the full predicate over ``(t, top]``: one
        guess per round, probed and then (if it passes PASS2) fetched, hi being a guess kzc
        accepted (or the top guess). Either way lo fails and hi passes, so hi ends at most at the
        first grid value >= L*.
        """
        top = self._grid.shape[0] - 1
        while True:
            lo, hi = self._lo, self._hi
            if hi - lo > 1:
                if self._full:
                    probes = [(lo + hi) // 2]
                elif self.config.batch == 0:
                    probes = list(range(lo + 1, hi + 1))
                else:
                    b = min(self.config.batch, hi - lo - 1)
                    probes = sorted({lo + ((hi - lo) * j) // (b + 1) for j in range(1, b + 1)} - {lo, hi})
            else:
                probes = [hi]
            ask = [t for t in probes if not self._probed[t]]
            if ask:
                self._probing = ask
                self.move_to(CoordinatorState.PROBE)
                return [self._broadcast(RadiusProbes(radii=self._grid[ask]), "probe")]
            if hi - lo > 1 and not self._full:
                self._move_bounds(probes)
                continue
            t = probes[0]  # the bisection point of the full search, or hi once it follows lo
            if not self._pass2[t]:
                if t == hi:
                    raise ValueError(
                        f"the largest radius guess {self._grid[t]:g} fails the Round-2 test; "
                        "the radius bounds do not contain the optimal radius"
                    )
                self._lo = t
            elif t not in self._known:
                self._requested = (t,)
                self._fetches.append((t,))
                self.move_to(CoordinatorState.REPRESENTATIVES)
                return [self._broadcast(RadiusFetch(radius=float(self._grid[t])), "fetch")]
            elif self._known[t]:
                if t == hi:
                    self._final = self._accepted[t]
                    return self._conclude()
                self._hi = t
            elif t < hi:
                self._lo = t
            elif not self._full and hi < top:
                self._full = True  # a "No" at hi certifies L_hi < L*: search (hi, top] in full
                self._lo, self._hi = hi, top
            else:
                raise ValueError(
                    f"radius guess {self._grid[t]:g} was rejected although it must pass; "
                    "the radius bounds do not contain the optimal radius"
                )

    def _move_bounds(self, probes: list[int]) -> None:
        """lo-fails/hi-passes update from probes (sorted, all known): hi moves to the first passing
        probe, lo to the last failing probe below it."""
        passing = [t for t in probes if self._pass2[t]]
        if passing:
            self._hi = min(self._hi, passing[0])
        failing = [t for t in probes if not self._pass2[t] and t < self._hi]
        if failing:
            self._lo = max(self._lo, failing[-1])

    def _record_probes(self, replies: dict[str, ProbeCounts]) -> None:
        idx = np.asarray(self._probing, dtype=np.int64)
        for m in self.machines:
            reply = replies[m]
            self._table[m][idx, 0] = reply.counts
            self._table[m][idx, 1] = reply.discarded if self.config.sends_discarded else 0
        self._pass2_of(self._probing)
        self._probe_rounds.append(tuple(self._probing))

    def _record_fetch(self, replies: dict[str, Representatives]) -> None:
        """Round 4 for the fetched guess (kzc's "No" certifies L_t < L*)."""
        (t,) = self._requested
        points = np.concatenate([replies[m].points for m in self.machines], axis=0)
        weights = np.concatenate([replies[m].weights for m in self.machines])
        accepted = self._solve(t, points, weights)
        self._known[t] = accepted is not None
        if accepted is None:
            self._rejected.append(t)
        else:
            self._accepted[t] = accepted

    # -- evaluation --------------------------------------------------------------------------------

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
        """Round 4 for guess t: z', then kzc (with the refinement and the polishing); ``None``
        means "No"."""
        cfg = self.config
        discarded = self._discarded_at(t)
        z_prime = cfg.outlier_budget - discarded
        if z_prime < 0:
            return None
        guess = float(self._grid[t])
        bottom = self._has_bottom and t == 0
        dist = _kernels.pairwise_distances(points)
        move = 0.0 if bottom else 4.0 * guess
        # certify z outliers (strict) when that succeeds within the same bound 5L, else z'; not at
        # the bottom guess, whose certificate 4 L'' <= 4 L* rests on the search with z'
        budgets = [z_prime] if bottom or cfg.z - discarded < 0 else [cfg.z - discarded, z_prime]
        cover, budget = None, z_prime
        if cfg.refine or bottom:
            upper = self._bottom_upper if bottom else 5.0 * guess
            for budget in budgets:
                cover = solvers.smallest_cover_radius(dist, weights, cfg.k, budget, grow=2.0, expand=4.0, upper=upper)
                if cover is not None:
                    break
            if cover is None:
                return None
            radius = 4.0 * cover.radius + move  # the bottom guess moved only copies of points
        else:
            cover = solvers.kzc(dist, weights, cfg.k, z_prime, 5.0 * guess)
            if not cover.ok:
                return None
            radius = 24.0 * guess
        pool = np.concatenate([points, self._anchors], axis=0)
        centres, polished = cover.centres, False
        if cfg.polish and cfg.z > 0:
            start = solvers.pad_centres(points, cover.centres, cfg.k)
            if start.shape[0] < points.shape[0]:
                result = polish_centres(
                    dist,
                    weights,
                    start,
                    budget=max(cfg.z - discarded, 0),
                    cert_budget=budget,
                    move=move,
                    limit=radius,
                )
                if result.improved:
                    centres, polished = result.centres, True
                    radius = max(radius, result.certificate)
        chosen = solvers.pad_centres(pool, centres, cfg.k)
        return _Accepted(t, pool[chosen], float(radius), float(cover.radius), float(z_prime), discarded, polished)

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
            probed=self._probed.copy(),
            pass2=self._pass2.copy(),
            count_ok=self._count_ok.copy(),
            discard_ok=self._discard_ok.copy(),
            probe_rounds=tuple(self._probe_rounds),
            fetches=tuple(self._fetches),
            rejected=tuple(self._rejected),
            polished=final.polished,
            outliers=outliers,
            representatives=self._representatives,
            words=dict(self._words),
        )

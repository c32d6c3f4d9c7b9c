"""The coordinator of distributed (k,z)-center (Guo & Li, Algorithm 3): the search over the radius grid.

A :class:`KzCoordinator` builds the grid of radius guesses (from the machines' extents or the
known radius bounds), runs the ``probe``, ``linear`` or ``binary`` search over it with the
machines' counts (PASS2), solves kzc (Algorithm 1) on the fetched representatives with the
refinement and the polishing, and broadcasts the final centres and certified radius. The
protocol, its messages, costs and failure rules are described in
`fedproto.algorithms.kzclustering.protocol`; the machines are
`fedproto.algorithms.kzclustering.center_machine`, the collect-and-check loop
`fedproto.algorithms.kzclustering.collect`.

References:
    Guo & Li, NeurIPS 2018, Algorithms 1 and 3, Claim 2.5, Lemmas 2.6-2.7, Theorem 1.1; spec
    kz-clustering.md 2.3-2.6 (GAPs 1 and 2).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from fedproto.algorithms.kzclustering import _kernels, messages, solvers
from fedproto.algorithms.kzclustering.collect import CollectingCoordinator, RunWords, extents_diameter
from fedproto.algorithms.kzclustering.config import KzCenterConfig, check_instance
from fedproto.algorithms.kzclustering.polish import polish_centres
from fedproto.errors import RemoteProtocolError
from fedproto.messages import Outgoing
from fedproto.machine import machine_states

__all__ = ["CoordinatorResult", "CoordinatorState", "KzCoordinator"]


@dataclasses.dataclass(frozen=True)
class CoordinatorResult(RunWords):
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


# COUNTS: linear/binary: the counts of every guess
# PROBE: probe: the counts of the probed guesses
# POINTS: linear/binary: the fetched guesses' points
# REPRESENTATIVES: probe: the fetched guess's points
CoordinatorState = machine_states("CoordinatorState", "EXTENT", "COUNTS", "PROBE", "POINTS", "REPRESENTATIVES", "OUTLIERS")


@dataclasses.dataclass
class _Accepted:
    index: int
    centres: np.ndarray
    radius: float
    kzc_radius: float
    z_prime: float
    discarded: int
    polished: bool


class KzCoordinator(CollectingCoordinator):
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
        (CoordinatorState.EXTENT, messages.LocalExtent): ("_on_extent", CoordinatorState.EXTENT),
        (CoordinatorState.COUNTS, messages.AggregatedCounts): ("_on_counts", CoordinatorState.COUNTS),
        (CoordinatorState.PROBE, messages.ProbeCounts): ("_on_probe_counts", CoordinatorState.PROBE),
        (CoordinatorState.POINTS, messages.WeightedPoints): ("_on_points", CoordinatorState.POINTS),
        (CoordinatorState.REPRESENTATIVES, messages.Representatives): (
            "_on_representatives",
            CoordinatorState.REPRESENTATIVES,
        ),
        (CoordinatorState.OUTLIERS, messages.OutlierCount): ("_on_outlier_count", CoordinatorState.OUTLIERS),
    }

    def __init__(self, party: str, *, config: KzCenterConfig, machines: Sequence[str]) -> None:
        super().__init__(party, config=config, machines=machines)
        self._extents: dict[str, messages.LocalExtent] = {}
        self._counts: dict[str, messages.AggregatedCounts] = {}
        self._grid = np.zeros(0)
        self._bottom_upper: float | None = None  # 5 g for the bottom guess (None: no bound)
        self._has_bottom = False
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

    def _settle_features(self) -> bool:
        learnt = super()._settle_features()
        if learnt and self._anchors.shape[0] == 0:
            self._anchors = np.zeros((0, self._d))
        return learnt

    def _on_extent(self, sender: str, message: messages.LocalExtent) -> list[Outgoing]:
        self._check_width(sender, message.anchor.shape[1], anchor=True)
        return self._collect(sender, message)

    def _on_counts(self, sender: str, message: messages.AggregatedCounts) -> list[Outgoing]:
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
        return self._collect(sender, message)

    def _on_probe_counts(self, sender: str, message: messages.ProbeCounts) -> list[Outgoing]:
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
        return self._collect(sender, message)

    def _check_guess_data(
        self, sender: str, t: int, size: int, weight: int, count: int, discarded: int, n_i: int | None
    ) -> None:
        """A machine's points for guess ``t`` agree with its counts: ``size`` representatives of
        total ``weight`` where it reported ``count`` of them and ``discarded`` points, and weight
        plus discarded is its ``n_i`` (unchecked while ``n_i`` is unknown, ``None``).

        Raises:
            RemoteProtocolError: they do not agree, naming ``sender``.
        """
        if size != count or (n_i is not None and weight + discarded != n_i):
            raise RemoteProtocolError(
                f"{sender}'s data for guess {t} ({size} points of weight {weight}) does not "
                f"match its counts ({count} points, {discarded} discarded of "
                f"{'its points' if n_i is None else n_i})",
                party=sender,
                round_idx=self.round_idx,
            )

    def _on_points(self, sender: str, message: messages.WeightedPoints) -> list[Outgoing]:
        if tuple(int(t) for t in message.indices) != self._requested:
            raise RemoteProtocolError(
                f"{sender} sent guesses {message.indices.tolist()}, requested {list(self._requested)}",
                party=sender,
                round_idx=self.round_idx,
            )
        self._check_width(sender, message.points.shape[1])
        counts = self._counts[sender]
        offsets = np.concatenate([[0], np.cumsum(message.sizes)])
        for j, t in enumerate(self._requested):
            weight = int(message.weights[offsets[j] : offsets[j + 1]].sum())
            self._check_guess_data(
                sender, t, int(message.sizes[j]), weight, int(counts.counts[t]), int(counts.discarded[t]),
                counts.n_points,
            )
        self._collect(sender, message)
        self._representatives += int(message.points.shape[0])
        return []

    def _on_representatives(self, sender: str, message: messages.Representatives) -> list[Outgoing]:
        self._check_width(sender, message.points.shape[1])
        (t,) = self._requested
        count, discarded = (int(v) for v in self._table[sender][t])
        weight = int(message.weights.sum())
        self._check_guess_data(sender, t, message.points.shape[0], weight, count, discarded, self._n_of.get(sender))
        self._collect(sender, message)
        self._n_of[sender] = weight + discarded  # with radius bounds, n_i is learnt here
        self._representatives += int(message.points.shape[0])
        return []

    def _on_outlier_count(self, sender: str, message: messages.OutlierCount) -> list[Outgoing]:
        return self._collect(sender, message)

    def _advance(self) -> list[Outgoing]:
        if not self._round_complete():
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
            out = self._broadcast(messages.RadiusGrid(radii=self._grid), "grid")
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
        self._anchors, diameter = extents_diameter(extents, self._d)
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
        return [self._broadcast(messages.RadiusGuesses(indices=np.asarray(request, dtype=np.int64)), "fetch")]

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
                return [self._broadcast(messages.RadiusProbes(radii=self._grid[ask]), "probe")]
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
                return [self._broadcast(messages.RadiusFetch(radius=float(self._grid[t])), "fetch")]
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

    def _record_probes(self, replies: dict[str, messages.ProbeCounts]) -> None:
        idx = np.asarray(self._probing, dtype=np.int64)
        for m in self.machines:
            reply = replies[m]
            self._table[m][idx, 0] = reply.counts
            self._table[m][idx, 1] = reply.discarded if self.config.sends_discarded else 0
        self._pass2_of(self._probing)
        self._probe_rounds.append(tuple(self._probing))

    def _record_fetch(self, replies: dict[str, messages.Representatives]) -> None:
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

    def _evaluate(self, replies: dict[str, messages.WeightedPoints]) -> None:
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
        out = self._broadcast(messages.FinalCentres(radius=self._final.radius, centres=self._final.centres), "centres")
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

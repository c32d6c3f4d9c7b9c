"""Distributed (k,z)-median and (k,z)-means: one truncated-cost coreset per radius guess (Appendix C).

Theory of operation (Guo & Li, NeurIPS 2018, Theorem 1.2 and Appendix C; spec kz-clustering.md
sections 3.1-3.5 and Appendix D.2's practical choices).

Reformulation (Lemma C.1): with l = 1 (median) or 2 (means), the cost with z outliers is
``cost_z(C) = sup_{L >= 0} [ sum_p min(d(p, C), L)^l - z L^l ]``, attained at the
(n - z)-th smallest distance. So the coordinator needs, for every L of a geometric grid, a
coreset for the *truncated* cost ``min(d, L)^l`` (which has no outliers), and then picks C
minimising ``max_L [ cost_L(C) - z L^l ]`` (Lemma C.2 bounds the discretisation: the grid sup
with ``z`` is at least the true cost with ``(1+eps)^l z``).

Roles and messages: one :class:`KzMeansCoordinator` and m :class:`KzMeansMachine` s, star
topology, party names as in (k,z)-center. Everyone knows the :class:`KzMeansConfig`; a
coordinator configured with ``d = None`` learns d from the first round of points (the extents'
anchors, or the coresets), as in (k,z)-center.

* round 0 (unless ``radius_bounds`` are given): machines send :class:`LocalExtent` (phase
  ``extent``); the coordinator sends the grid :class:`RadiusGrid` (phase ``grid``): ``(1+eps)^t``
  steps from ``eps * min_i dmin_i / (2 (1+eps) n)`` to ``2 * diameter`` (spec 3.2, with the local
  minimum spacing and the anchor bound on the diameter standing in for the global ones). In
  ``bel`` mode (the Balcan-Ehrlich-Liang baseline) the grid is the single radius ``inf`` (no
  truncation) and this round is skipped.
* next round: machine i computes a local solution B_i (k-means++ seeding and Lloyd, reused for
  every L) and sends :class:`LocalCosts` (phase ``costs``): ``n_i`` and
  ``c_i(L) = sum_{p in P_i} min(d(p, B_i), L)^l`` for all L. The coordinator sends
  :class:`CostTotals` (phase ``totals``): ``T(L) = sum_i c_i(L)`` and the coreset size t per L.
* next round: machine i draws ``t_i(L) = round(t c_i(L) / T(L))`` samples with probability
  proportional to ``min(d(p, B_i), L)^l`` for every L, weights them ``c_i(L) / (t_i m(q))``,
  weights its centres by ``|P_b| - sum of sample weights in P_b`` (so every coreset's weights sum
  to n exactly) and sends everything as :class:`Coresets` (phase ``coresets``).
* The coordinator solves locally: facilities are up to ``facilities`` of the pooled coreset points
  of positive weight (k-means++ over them when there are more); reverse greedy (Anthony et al.)
  over the client sets "coreset of radius L with the truncated metric", with B found by a geometric search in
  ``[4 min_L L^l W_L, 8 max_L L^l W_L]`` until ``ub <= 1.01 lb``; each success is scored by
  ``max_L [ cost_L(C) - (1+eps) z L^l ]`` and the best kept (Appendix D.2); then (``polish``)
  truncated Lloyd steps move the centres off the facilities while the score drops. In ``bel`` mode the
  coordinator runs weighted k-means on its one coreset instead.
* final round: :class:`FinalCentres` (phase ``centres``: C and the threshold ``L_bar``, the grid
  radius attaining the score's maximum, which estimates the (n - (1+eps)z)-th smallest distance);
  machines label the points farther than it as outliers and reply :class:`OutlierCount` (phase
  ``outliers``).

Rounds: 7 message phases (5 with ``radius_bounds`` or in ``bel`` mode). Words: extent
``m (d+3)``, grid ``m T``, costs ``m (T+1)``, totals ``m (T+1)``, coresets
``sum_L (t_L + m k)(d+1) + m T``, centres ``m (k d + 1)``, outliers m; none depends on z (spec 3.5).
The reverse-greedy solver is the paper's heuristic: Theorem 1.2's guarantee belongs to an
exponential-time solver that is not implemented (spec section 8).

Randomness: ``jax.random`` keys from ``config.seed`` folded with the party index (machines
0..m-1, coordinator m) and the radius index. Failure handling as in (k,z)-center.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np

from fedproto.algorithms.kzclustering import _kernels, solvers
from fedproto.algorithms.kzclustering.collect import CollectingCoordinator, RunWords, extents_diameter
from fedproto.algorithms.kzclustering.config import KzInstance, check_instance, check_radius_bounds, check_slack
from fedproto.algorithms.kzclustering.messages import (
    Coresets,
    CostTotals,
    FinalCentres,
    LocalCosts,
    LocalExtent,
    OutlierCount,
    RadiusGrid,
)
from fedproto.algorithms.kzclustering.parties import COORDINATOR, DataMachine, extent_message
from fedproto.errors import RemoteProtocolError
from fedproto.messages import Message, Outgoing
from fedproto.machine import machine_states

__all__ = [
    "MODES",
    "centralised_kmeans",
    "centralised_kmeans_minus_minus",
    "KzMeansConfig",
    "KzMeansCoordinator",
    "KzMeansMachine",
    "MeansResult",
    "solve_reverse_greedy",
]

MODES = ("truncated", "bel")


@dataclasses.dataclass(frozen=True)
class KzMeansConfig(KzInstance):
    """Parameters shared by the coordinator and every machine.

    Attributes:
        k: centres.
        z: outliers.
        eps: slack in (0, 1]: grid ratio ``1+eps`` and the ``(1+eps) z`` budget of the score.
        n_machines: m.
        d: features; ``None`` for a coordinator that learns it from the machines' first points (a
            run whose parties each hold only their own data). A machine's configuration states it.
        power: l = 1 (median) or 2 (means).
        mode: ``"truncated"`` (Guo & Li) or ``"bel"`` (the BEL baseline: one untruncated coreset,
            weighted k-means at the coordinator, z outliers only at evaluation).
        samples: coreset samples t per radius (over all machines); ``None``: the coordinator picks
            ``max(10 k, n / (10 T))`` (Appendix D.2; ``max(10 k, n / 10)`` in ``bel`` mode).
        facilities: the most facilities reverse greedy starts from (default ``8 k``).
        local_iterations: Lloyd iterations of the local solutions B_i.
        polish: after reverse greedy, descend the min-max objective with truncated Lloyd steps
            (`solvers.polish_minmax`; a design addition: reverse greedy's centres are coreset
            points, and means centres at data points cost about twice the optimum).
        radius_bounds: a known ``[A, B]`` for the grid (skips the extent round).
        seed: seed of the ``jax.random`` keys.

    Raises:
        ValueError: a parameter out of range.
    """

    power: int = 2
    mode: str = "truncated"
    samples: int | None = None
    facilities: int | None = None
    local_iterations: int = 10
    polish: bool = True
    radius_bounds: tuple[float, float] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.k < 1 or self.z < 0 or self.n_machines < 1 or (self.d is not None and self.d < 1):
            raise ValueError("need k >= 1, z >= 0, n_machines >= 1 and d >= 1")
        check_slack(self.eps)
        if self.power not in (1, 2):
            raise ValueError("power must be 1 (median) or 2 (means)")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        if self.samples is not None and self.samples < 0:
            raise ValueError("samples must be >= 0")
        if self.facilities is not None and self.facilities < self.k:
            raise ValueError("facilities must be at least k")
        if self.local_iterations < 0:
            raise ValueError("local_iterations must be >= 0")
        check_radius_bounds(self.radius_bounds)

    @property
    def outlier_budget(self) -> float:
        """The budget of the coordinator's score and of the evaluation: ``(1+eps) z`` (``z`` for BEL)."""
        return float(self.z) if self.mode == "bel" else (1.0 + self.eps) * self.z

    def key(self, party_index: int) -> jax.Array:
        """The ``jax.random`` key of a party (machines 0..m-1, coordinator m)."""
        return jax.random.fold_in(jax.random.PRNGKey(self.seed), party_index)


@dataclasses.dataclass(frozen=True)
class MeansResult(RunWords):
    """The coordinator's output.

    Attributes:
        centres: ``[c, d]`` float64 (``c <= k``).
        threshold: L_bar; machines labelled points farther than it as outliers.
        score: the coordinator's objective ``max_L [cost_L(C) - budget L^l]`` on the coresets.
        bound: the reverse-greedy B that produced the centres (0 in ``bel`` mode).
        n: total points.
        grid: the radii ``[T]`` (``[inf]`` in ``bel`` mode).
        samples: coreset samples per radius.
        coreset_points: points received in the coresets.
        outliers: points the machines labelled as outliers.
        words: words per ``(round_idx, phase)``.
    """

    centres: np.ndarray
    threshold: float
    score: float
    bound: float
    n: int
    grid: np.ndarray
    samples: int
    coreset_points: int
    outliers: int
    words: dict[tuple[int, str], int]


def _grid_from_bounds(config: KzMeansConfig) -> np.ndarray:
    if config.mode == "bel":
        return np.array([math.inf])
    assert config.radius_bounds is not None
    return solvers.radius_grid(config.radius_bounds[0], config.radius_bounds[1], config.eps)


def solve_reverse_greedy(
    points: np.ndarray,
    group: np.ndarray,
    weights: np.ndarray,
    radii: np.ndarray,
    facilities: np.ndarray,
    k: int,
    budget: float,
    power: int,
) -> tuple[np.ndarray, float, float, float]:
    """The coordinator's practical solver: reverse greedy with a search over B (Appendix D.2).

    Args:
        points: pooled coreset points ``[P, d]``.
        group: radius index of each point ``[P]``.
        weights: coreset weights ``[P]``.
        radii: the grid ``[T]``.
        facilities: candidate centres ``[N, d]``, ``N >= 1``.
        k: centres.
        budget: outlier budget of the score (``(1+eps) z``).
        power: l.

    Returns:
        ``(centres [min(k, N), d], score, argmax L, B)`` of the best-scoring success.

    References:
        Guo & Li, Appendix D.2; spec section 3.4, oracle 27.
    """
    dist = _kernels.pairwise_distances(points, facilities)
    keep = min(k, facilities.shape[0])
    positive = np.bincount(group, weights=np.maximum(weights, 0.0), minlength=radii.shape[0])
    scale = radii**power * positive
    scale = scale[np.isfinite(scale) & (scale > 0)]
    lb = 4.0 * float(scale.min()) if scale.size else 1.0
    ub = 8.0 * float(scale.max()) if scale.size else 1.0
    best: tuple[float, np.ndarray, float, float] | None = None

    def attempt(bound: float) -> bool:
        nonlocal best
        chosen = solvers.reverse_greedy(dist, group, weights, radii, keep, bound, power)
        if chosen is None:
            return False
        d_c = dist[:, chosen].min(axis=1)
        scores = solvers.minmax_scores(d_c, group, weights, radii, power, budget)
        j = int(np.argmax(scores))
        if best is None or scores[j] < best[0]:
            best = (float(scores[j]), chosen, float(radii[j]), bound)
        return True

    for _ in range(60):  # a large enough B always succeeds (oracle 27)
        if attempt(ub):
            break
        lb, ub = ub, 2.0 * ub
    else:
        raise RuntimeError("reverse greedy failed for every bound tried")
    while ub > 1.01 * lb:
        mid = math.sqrt(lb * ub)
        if attempt(mid):
            ub = mid
        else:
            lb = mid
    assert best is not None
    score, chosen, threshold, bound = best
    return facilities[chosen], score, threshold, bound


MeansMachineState = machine_states("MeansMachineState", "AWAIT_GRID", "AWAIT_TOTALS", "AWAIT_CENTRES")


class KzMeansMachine(DataMachine):
    """A data-holding machine of distributed (k,z)-median/means (sans-IO).

    Args:
        party, config, points, coordinator: as :class:`~fedproto.algorithms.kzclustering.parties.DataMachine`.
        index: this machine's index (folds its random keys).
    """

    State = MeansMachineState
    INITIAL_STATE = MeansMachineState.AWAIT_GRID
    TRANSITIONS = {
        (MeansMachineState.AWAIT_GRID, RadiusGrid): ("_on_grid", MeansMachineState.AWAIT_TOTALS),
        (MeansMachineState.AWAIT_TOTALS, CostTotals): ("_on_totals", MeansMachineState.AWAIT_CENTRES),
        (MeansMachineState.AWAIT_CENTRES, FinalCentres): ("_on_centres", MeansMachineState.DONE),
    }

    def __init__(
        self, party: str, *, config: KzMeansConfig, points: np.ndarray, index: int, coordinator: str = COORDINATOR
    ) -> None:
        super().__init__(party, config=config, points=points, coordinator=coordinator)
        self.index = index
        self._key = config.key(index)
        self._grid = np.zeros(0)
        self._centres = np.zeros((0, config.d))
        self._nearest: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0, dtype=np.int64))
        self._costs = np.zeros(0)

    def local_solution(self) -> np.ndarray:
        """B_i: k-means++ seeding and Lloyd on the local points (``[min(k, n_i), d]``)."""
        cfg = self.config
        x = self.points
        if x.shape[0] == 0:
            return np.zeros((0, cfg.d))
        draws = _kernels.uniform_draws(jax.random.fold_in(self._key, 0), cfg.k)
        seeds = x[solvers.kmeanspp_seeding(draws, x, cfg.k, power=cfg.power)]
        return solvers.weighted_lloyd(x, np.ones(x.shape[0]), seeds, cfg.local_iterations)

    def _start(self) -> list[Outgoing]:
        cfg = self.config
        if cfg.mode == "truncated" and cfg.radius_bounds is None:
            # k-d tree and distance rows: the same numbers as the dense matrix, without the n_i^2 memory
            extent = extent_message(self.points, solvers.local_extent(self.points))
            return [self.send(self.coordinator, extent, phase="extent")]
        self.move_to(MeansMachineState.AWAIT_TOTALS)
        return [self._local_costs(_grid_from_bounds(cfg))]

    def _local_costs(self, grid: np.ndarray) -> Outgoing:
        self._grid = np.asarray(grid, dtype=np.float64)
        self._centres = self.local_solution()
        self._nearest = _kernels.nearest_centres(self.points, self._centres)  # reused by every radius's coreset
        dist, _ = self._nearest
        if self.points.shape[0] == 0:
            self._costs = np.zeros(self._grid.shape[0])
        else:
            finite = np.where(np.isfinite(self._grid), self._grid, np.max(dist) + 1.0)
            self._costs = _kernels.truncated_cost_curve(dist, np.ones_like(dist), finite, self.config.power)
        message = LocalCosts(n_points=int(self.points.shape[0]), costs=self._costs)
        return self.send(self.coordinator, message, phase="costs")

    def _on_grid(self, sender: str, message: RadiusGrid) -> list[Outgoing]:
        self._check_sender(sender)
        self.round_idx += 1
        return [self._local_costs(message.radii)]

    def _on_totals(self, sender: str, message: CostTotals) -> list[Outgoing]:
        self._check_sender(sender)
        cfg = self.config
        if message.totals.shape != self._grid.shape:
            raise RemoteProtocolError(
                f"{message.totals.shape[0]} totals for a grid of {self._grid.shape[0]}", party=sender,
                round_idx=self.round_idx,
            )
        parts, weights, sizes = [], [], []
        for j, radius in enumerate(self._grid):
            total = float(message.totals[j])
            share = self._costs[j] / total if total > 0 else 0.0
            count = int(round(message.samples * share))
            draws = _kernels.uniform_draws(jax.random.fold_in(self._key, j + 1), count)
            pts, w = solvers.bel_coreset(draws, self.points, self._centres, float(radius), cfg.power,
                                         nearest=self._nearest)
            parts.append(pts)
            weights.append(w)
            sizes.append(pts.shape[0])
        self.round_idx += 1
        coresets = Coresets(
            sizes=np.asarray(sizes, dtype=np.int64),
            points=np.concatenate(parts, axis=0) if parts else np.zeros((0, cfg.d)),
            weights=np.concatenate(weights) if weights else np.zeros(0),
        )
        return [self.send(self.coordinator, coresets, phase="coresets")]


MeansCoordinatorState = machine_states("MeansCoordinatorState", "EXTENT", "COSTS", "CORESETS", "OUTLIERS")


_PHASES = {
    MeansCoordinatorState.EXTENT: "extent",
    MeansCoordinatorState.COSTS: "costs",
    MeansCoordinatorState.CORESETS: "coresets",
    MeansCoordinatorState.OUTLIERS: "outliers",
}


class KzMeansCoordinator(CollectingCoordinator):
    """The coordinator of distributed (k,z)-median/means (sans-IO).

    Args:
        party: the coordinator's party name.
        config: the run's parameters.
        machines: every machine's party name, in machine order.

    Raises:
        ValueError: the machine list does not match the configuration or has duplicates.
    """

    State = MeansCoordinatorState
    INITIAL_STATE = MeansCoordinatorState.EXTENT
    TRANSITIONS = {
        (MeansCoordinatorState.EXTENT, LocalExtent): ("_on_message", MeansCoordinatorState.EXTENT),
        (MeansCoordinatorState.COSTS, LocalCosts): ("_on_message", MeansCoordinatorState.COSTS),
        (MeansCoordinatorState.CORESETS, Coresets): ("_on_message", MeansCoordinatorState.CORESETS),
        (MeansCoordinatorState.OUTLIERS, OutlierCount): ("_on_message", MeansCoordinatorState.OUTLIERS),
    }

    def __init__(self, party: str, *, config: KzMeansConfig, machines: Sequence[str]) -> None:
        super().__init__(party, config=config, machines=machines)
        self._grid = np.zeros(0)
        self._n = 0
        self._local_n: dict[str, int] = {}
        self._samples = 0
        self._coreset_points = 0
        self._answer: tuple[np.ndarray, float, float, float] | None = None

    @property
    def phase(self) -> str:
        return _PHASES.get(self._state, "done")

    def _start(self) -> list[Outgoing]:
        if self.config.mode == "bel" or self.config.radius_bounds is not None:
            self._grid = _grid_from_bounds(self.config)
            self.move_to(MeansCoordinatorState.COSTS)
        return []

    def _on_message(self, sender: str, message: Message) -> list[Outgoing]:
        self._admit(sender)
        if isinstance(message, LocalCosts) and message.costs.shape != self._grid.shape:
            raise RemoteProtocolError(
                f"{sender} sent {message.costs.shape[0]} costs for a grid of {self._grid.shape[0]}",
                party=sender, round_idx=self.round_idx,
            )
        if isinstance(message, LocalExtent):
            self._check_width(sender, message.anchor.shape[1], anchor=True)
        if isinstance(message, Coresets):
            self._check_width(sender, message.points.shape[1])
            if message.sizes.shape != self._grid.shape:
                raise RemoteProtocolError(f"{sender} sent coresets of the wrong shape", party=sender,
                                          round_idx=self.round_idx)
            n_i = self._local_n[sender]
            offsets = np.concatenate([[0], np.cumsum(message.sizes)])
            sums = np.asarray([message.weights[a:b].sum() for a, b in zip(offsets[:-1], offsets[1:])])
            if np.any(np.abs(sums - n_i) > 1e-6 * max(n_i, 1)):
                raise RemoteProtocolError(
                    f"{sender}'s coreset weights sum to {sums.tolist()}, not its {n_i} points",
                    party=sender, round_idx=self.round_idx,
                )
        return self._collect(sender, message)

    def _advance(self) -> list[Outgoing]:
        if not self._round_complete():
            return []
        cfg = self.config
        self._settle_features()  # the first round with every machine's points
        inbox = self._replies()
        if self._state is MeansCoordinatorState.EXTENT:
            self._grid = self._build_grid(inbox)  # type: ignore[arg-type]
            self.move_to(MeansCoordinatorState.COSTS)
            return [self._broadcast(RadiusGrid(radii=self._grid), "grid")]
        if self._state is MeansCoordinatorState.COSTS:
            self._local_n = {m: int(self._inbox[m].n_points) for m in self.machines}  # type: ignore[attr-defined]
            self._n = sum(self._local_n.values())
            check_instance(self._n, cfg.k, cfg.z)
            totals = np.sum([c.costs for c in inbox], axis=0)  # type: ignore[attr-defined]
            if cfg.samples is not None:
                self._samples = cfg.samples
            else:
                self._samples = max(10 * cfg.k, self._n // (10 * self._grid.shape[0]))
            self.move_to(MeansCoordinatorState.CORESETS)
            return [self._broadcast(CostTotals(totals=totals, samples=self._samples), "totals")]
        if self._state is MeansCoordinatorState.CORESETS:
            self._answer = self._solve(inbox)  # type: ignore[arg-type]
            centres, _, threshold, _ = self._answer
            self.move_to(MeansCoordinatorState.OUTLIERS)
            return [self._broadcast(FinalCentres(radius=threshold, centres=centres), "centres")]
        assert self._answer is not None
        centres, score, threshold, bound = self._answer
        total = sum(int(c.outliers) for c in inbox)  # type: ignore[attr-defined]
        self._finish(MeansResult(centres, threshold, score, bound, self._n, self._grid.copy(), self._samples,
                                 self._coreset_points, total, dict(self._words)))
        return []

    def _build_grid(self, extents: list[LocalExtent]) -> np.ndarray:
        """``(1+eps)^t`` steps over ``(eps dmin / (2 (1+eps) n), 2 diameter]`` (spec 3.2)."""
        n = sum(e.n_points for e in extents)
        _, diameter = extents_diameter(extents, self._d)
        spacing = min(e.min_distance for e in extents)
        if diameter <= 0 or not math.isfinite(spacing):
            return np.array([max(diameter, 1.0)])  # every point on one location per machine
        eps = self.config.eps
        return solvers.radius_grid(eps * spacing / (2 * (1 + eps) * max(n, 1)), 2 * diameter, eps)

    def _solve(self, coresets: list[Coresets]) -> tuple[np.ndarray, float, float, float]:
        cfg = self.config
        t_len = self._grid.shape[0]
        points, weights, group = [], [], []
        for c in coresets:
            offsets = np.concatenate([[0], np.cumsum(c.sizes)])
            for j in range(t_len):
                points.append(c.points[offsets[j] : offsets[j + 1]])
                weights.append(c.weights[offsets[j] : offsets[j + 1]])
                group.append(np.full(int(c.sizes[j]), j, dtype=np.int64))
        pts = np.concatenate(points, axis=0)
        w = np.concatenate(weights)
        g = np.concatenate(group)
        self._coreset_points = int(pts.shape[0])
        key = cfg.key(cfg.n_machines)
        if pts.shape[0] == 0:
            return np.zeros((0, self._d)), 0.0, 0.0, 0.0
        if cfg.mode == "bel":
            draws = _kernels.uniform_draws(key, cfg.k)
            seeds = pts[solvers.kmeanspp_seeding(draws, pts, cfg.k, weights=w, power=cfg.power)]
            centres = solvers.weighted_lloyd(pts, w, seeds, 100, tol=1e-9)
            dist, _ = _kernels.nearest_centres(pts, centres)
            threshold = _weighted_quantile(dist, w, cfg.outlier_budget)
            return centres, 0.0, threshold, 0.0
        # facilities: k-means++ over the pooled positive-weight samples (coreset points)
        pool = np.unique(pts[w > 0], axis=0)
        limit = cfg.facilities or 8 * cfg.k
        if pool.shape[0] > limit:
            draws = _kernels.uniform_draws(key, limit)
            pool = pool[solvers.kmeanspp_seeding(draws, pool, limit, power=cfg.power)]
        radii = self._grid
        centres, score, _, bound = solve_reverse_greedy(pts, g, w, radii, pool, cfg.k, cfg.outlier_budget, cfg.power)
        if cfg.polish:
            centres, score = solvers.polish_minmax(pts, g, w, radii, centres, cfg.outlier_budget, cfg.power)
        dist, _ = _kernels.nearest_centres(pts, centres)
        threshold = float(radii[int(np.argmax(solvers.minmax_scores(dist, g, w, radii, cfg.power,
                                                                     cfg.outlier_budget)))])
        return centres, score, threshold, bound


def centralised_kmeans(x: np.ndarray, k: int, *, seed: int = 0, iterations: int = 100) -> np.ndarray:
    """Plain k-means (k-means++ seeding, Lloyd), the outlier-blind baseline (spec section 4 item 7).

    Returns:
        Centres ``[min(k, n), d]`` float64.
    """
    draws = _kernels.uniform_draws(jax.random.PRNGKey(seed), k)
    seeds = x[solvers.kmeanspp_seeding(draws, x, k)]
    return solvers.weighted_lloyd(x, np.ones(x.shape[0]), seeds, iterations, tol=1e-9)


def centralised_kmeans_minus_minus(x: np.ndarray, k: int, z: int, *, seed: int = 0) -> np.ndarray:
    """k-means-- on the pooled data (random initial centres; spec section 4 item 8).

    Returns:
        Centres ``[min(k, n), d]`` float64.
    """
    draws = _kernels.uniform_draws(jax.random.PRNGKey(seed), x.shape[0])
    return solvers.kmeans_minus_minus(draws, x, k, z)


def _weighted_quantile(dist: np.ndarray, weights: np.ndarray, budget: float) -> float:
    """Smallest r with the (signed) coreset weight beyond r at most ``budget``."""
    order = np.argsort(-dist, kind="stable")
    beyond = np.cumsum(weights[order])
    over = np.flatnonzero(beyond > budget)
    return float(dist[order[over[0]]]) if over.size else 0.0

"""Baselines of distributed (k,z)-center: the distributed protocols as machines, the centralised ones as functions.

Theory of operation (spec kz-clustering.md, section 4; Guo & Li, Appendix D.1). Every k-center
baseline returns k input points as centres; its cost is the radius after removing z points.

Centralised (functions on the pooled data, no communication):

* :func:`greedy`: Gonzalez's farthest-first (ignores outliers; 2-approximation for z = 0);
* :func:`charikar`: Charikar et al.'s (1, 3) greedy with the exact radius search (3-approximation
  with z outliers); :func:`centralised_kzc` is the paper's (2, 4) variant.

Distributed (a :class:`BaselineCoordinator` and m :class:`BaselineMachine` s, the same roles,
party names and star topology as Guo & Li's protocol, so their bytes are metered the same way):

=================  ======================================================  =====================
method             what machine i sends                                    coordinator
=================  ======================================================  =====================
``random-random``  k+z points uniformly without replacement (unweighted)   k of them at random
``random-kzc``     the same sample                                         Charikar (1,3), z
``mkcwm``          k+z farthest-first points + Voronoi cell sizes          greedy (5,11), z
                   (Malkomes et al. 2015)
``glz``            round 1: cost curve f_i(q) at q = 1, 2, 4, ..., z;      weighted Charikar
                   round 2: k local (k, t_i)-center centres + the points   (1,3), z
                   they serve (Guha, Li, Zhang 2017, as Guo & Li
                   implemented it)
``glz-z``          round 1 as glz; round 2: the first 2k + t_i             weighted Charikar
                   farthest-first points + Voronoi cell sizes              (1,3), z
=================  ======================================================  =====================

Message sequence: one-shot methods use one phase (``summary``, round 0: :class:`LocalSummary`
machine -> coordinator). GLZ uses three: ``curve`` (round 0, :class:`CostCurve`: the local
covering radius after k+q farthest-first centres, at geometric q), ``budget`` (round 0,
:class:`OutlierBudget`: t_i = max{q : f_i(q) >= tau}, tau the largest curve value with
sum_i t_i >= rho z, rho = 2), ``summary`` (round 1). Words: random-* send exactly ``m (k+z) d``
(when n_i >= k+z), MKCWM ``m (k+z)(d+1)``, GLZ ``O(m log z) + m k (d+1)``, GLZ-z
``O(m log z) + (2 m k + sum t_i)(d+1)``; all but GLZ grow linearly with z.

Randomness: ``jax.random`` keys from the configured seed, folded with the party index (machines
0..m-1, the coordinator m). Failure handling as in Guo & Li's protocol: a silent machine fails the
coordinator naming it; an unexpected message is a :class:`~fedproto.errors.RemoteProtocolError`.

References:
    Malkomes, Kusner, Chen, Weinberger, Moseley, "Fast distributed k-center clustering with
    outliers on massive data", NIPS 2015. Guha, Li, Zhang, "Distributed partial clustering",
    SPAA 2017. Charikar, Khuller, Mount, Narasimhan, SODA 2001. Gonzalez, TCS 1985.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from fedproto.algorithms.kzclustering import _kernels, solvers
from fedproto.algorithms.kzclustering.collect import CollectingCoordinator, RunWords
from fedproto.algorithms.kzclustering.messages import CostCurve, LocalSummary, OutlierBudget
from fedproto.algorithms.kzclustering.parties import COORDINATOR, DataMachine
from fedproto.messages import Message, Outgoing
from fedproto.machine import machine_states

__all__ = [
    "METHODS",
    "BaselineConfig",
    "BaselineCoordinator",
    "BaselineMachine",
    "BaselineResult",
    "centralised_kzc",
    "charikar",
    "glz_budgets",
    "glz_curve",
    "greedy",
]

METHODS = ("random-random", "random-kzc", "mkcwm", "glz", "glz-z")
_TWO_ROUNDS = ("glz", "glz-z")


# --- centralised ----------------------------------------------------------------------------------


def greedy(x: np.ndarray, k: int, *, start: int = 0) -> np.ndarray:
    """Gonzalez's farthest-first k-center (outliers ignored).

    Args:
        x: points ``[n, d]`` float64.
        k: centres.
        start: index of the first centre (the paper starts from a random point).

    Returns:
        Indices of the centres, int64 ``[<= k]`` (fewer only with fewer distinct points).

    References:
        Gonzalez 1985; spec section 4 item 1, oracle 22.
    """
    return solvers.farthest_first(x, k, start=start)[0]


def charikar(
    x: np.ndarray,
    k: int,
    z: float,
    *,
    weights: np.ndarray | None = None,
    grow: float = 1.0,
    expand: float = 3.0,
) -> tuple[np.ndarray, float]:
    """Charikar et al.'s greedy with the exact radius search, padded to k centres by farthest-first.

    Args:
        x: points ``[n, d]`` float64, ``n >= 1``.
        k: centres.
        z: outlier weight allowed.
        weights: positive integer weights ``[n]`` (default ones).
        grow: densest-ball factor (1 for Charikar, 2 for kzc, 5 for MKCWM).
        expand: removal factor (3, 4, 11).

    Returns:
        ``(indices, radius)``: int64 centre indices into ``x`` and the radius r found; every
        point but at most z weight lies within ``expand * r`` of a centre.

    References:
        Charikar et al. 2001; spec section 4 item 2, oracle 23.
    """
    x = np.asarray(x, dtype=np.float64)
    w = np.ones(x.shape[0], dtype=np.int64) if weights is None else np.asarray(weights, dtype=np.int64)
    cover = solvers.smallest_cover_radius(
        _kernels.pairwise_distances(x), w, k, z, grow=grow, expand=expand
    )
    assert cover is not None  # the largest breakpoint always succeeds
    return solvers.pad_centres(x, cover.centres, k), cover.radius


def centralised_kzc(x: np.ndarray, k: int, z: float) -> np.ndarray:
    """The paper's coordinator solver (2, 4) run on the pooled data (the "kzc" curve of Fig. 3)."""
    return charikar(x, k, z, grow=2.0, expand=4.0)[0]


# --- local summaries ----------------------------------------------------------------------------


def _voronoi_weights(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    _, labels = _kernels.nearest_centres(x, centres)
    return np.bincount(labels, minlength=centres.shape[0]).astype(np.int64)


def glz_curve(x: np.ndarray, k: int, z: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GLZ round 1: the local cost curve at geometric outlier counts.

    Farthest-first chooses c_0, c_1, ...; ``f(q) = d(c_{k+q}, {c_0 .. c_{k+q-1}})``, the covering
    radius of k+q centres (0 once every point is a centre), non-increasing in q.

    Args:
        x: local points ``[n_i, d]``.
        k: centres.
        z: outliers.

    Returns:
        ``(qs, radii, order)``: the sampled counts ``q in {1, 2, 4, ..} + {z}`` (int64, empty for
        z = 0), ``f(q)`` float64, and the farthest-first order (``min(n_i, 2k + z + 1)`` indices,
        reused by GLZ-z).

    References:
        Spec section 4 item 6 (rho = 2 geometric sampling).
    """
    qs = np.unique([q for q in (2 ** np.arange(0, max(z, 1).bit_length())) if q <= z] + ([z] if z else []))
    qs = qs.astype(np.int64)
    if x.shape[0] == 0:
        return qs, np.zeros(qs.shape[0]), np.zeros(0, dtype=np.int64)
    order, radii = solvers.farthest_first(x, 2 * k + z + 1)
    f = np.asarray([radii[k + q] if k + q < radii.shape[0] else 0.0 for q in qs], dtype=np.float64)
    return qs, f, order


def glz_budgets(curves: Sequence[tuple[np.ndarray, np.ndarray]], z: int, rho: float = 2.0) -> list[int]:
    """GLZ coordinator: local outlier budgets t_i from the machines' sampled curves.

    tau is the largest sampled value for which ``sum_i t_i(tau) >= rho z``, where ``t_i(tau)`` is
    the largest sampled q with ``f_i(q) >= tau`` (0 if none); if no value reaches ``rho z``, tau
    is the smallest value.

    Args:
        curves: ``(qs, radii)`` per machine.
        z: outliers.
        rho: the budget factor (2).

    Returns:
        ``t_i`` per machine.
    """
    if z == 0:
        return [0] * len(curves)
    values = np.unique(np.concatenate([f for _, f in curves]))[::-1]

    def budgets(tau: float) -> list[int]:
        return [int(qs[f >= tau].max()) if np.any(f >= tau) else 0 for qs, f in curves]

    for tau in values:
        t = budgets(float(tau))
        if sum(t) >= rho * z:
            return t
    return budgets(float(values[-1])) if values.size else [0] * len(curves)


def _glz_local(x: np.ndarray, k: int, t: int) -> tuple[np.ndarray, np.ndarray]:
    """GLZ round 2: a local (k, t)-center solution and the number of kept points each centre serves."""
    idx, _ = charikar(x, k, t)
    centres = x[idx]
    dist, labels = _kernels.nearest_centres(x, centres)
    keep = np.ones(x.shape[0], dtype=bool)
    if t:
        keep[np.argsort(-dist, kind="stable")[:t]] = False
    weights = np.bincount(labels[keep], minlength=centres.shape[0]).astype(np.int64)
    return centres[weights > 0], weights[weights > 0]


# --- machines ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BaselineConfig:
    """Parameters shared by a baseline's coordinator and machines.

    Attributes:
        method: one of :data:`METHODS`.
        k: centres.
        z: outliers.
        n_machines: m.
        d: features.
        seed: seed of the ``jax.random`` key (random sampling).
        rho: GLZ's budget factor.
    """

    method: str
    k: int
    z: int
    n_machines: int
    d: int
    seed: int = 0
    rho: float = 2.0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.k < 1 or self.z < 0 or self.n_machines < 1 or self.d < 1:
            raise ValueError("need k >= 1, z >= 0, n_machines >= 1 and d >= 1")
        if not self.rho >= 1:
            raise ValueError("rho must be >= 1")

    def key(self, party_index: int) -> jax.Array:
        """The ``jax.random`` key of party ``party_index`` (machines 0..m-1, coordinator m)."""
        return jax.random.fold_in(jax.random.PRNGKey(self.seed), party_index)


@dataclasses.dataclass(frozen=True)
class BaselineResult(RunWords):
    """A baseline coordinator's output.

    Attributes:
        method: the baseline.
        centres: ``[c, d]`` float64 (``c <= k``).
        points_received: summary points received (the paper's communication is this times d).
        words: words per ``(round_idx, phase)``, both directions.
        budgets: GLZ's local budgets t_i (empty for other methods).
    """

    method: str
    centres: np.ndarray
    points_received: int
    words: dict[tuple[int, str], int]
    budgets: tuple[int, ...] = ()


BaselineMachineState = machine_states("BaselineMachineState", "SUMMARY", "AWAIT_BUDGET")


class BaselineMachine(DataMachine):
    """A data-holding machine of a distributed baseline (sans-IO).

    Args:
        party, config, points, coordinator: as :class:`~fedproto.algorithms.kzclustering.parties.DataMachine`.
        index: this machine's index (folds its random key).
    """

    State = BaselineMachineState
    INITIAL_STATE = BaselineMachineState.SUMMARY
    TRANSITIONS = {
        (BaselineMachineState.AWAIT_BUDGET, OutlierBudget): ("_on_budget", BaselineMachineState.DONE),
    }

    def __init__(
        self, party: str, *, config: BaselineConfig, points: np.ndarray, index: int, coordinator: str = COORDINATOR
    ) -> None:
        super().__init__(party, config=config, points=points, coordinator=coordinator)
        self.index = index
        self._order = np.zeros(0, dtype=np.int64)

    def _start(self) -> list[Outgoing]:
        cfg = self.config
        x = self.points
        if cfg.method in _TWO_ROUNDS:
            qs, radii, self._order = glz_curve(x, cfg.k, cfg.z)
            self.move_to(BaselineMachineState.AWAIT_BUDGET)
            return [self.send(self.coordinator, CostCurve(outliers=qs, radii=radii), phase="curve")]
        size = min(cfg.k + cfg.z, x.shape[0])
        if cfg.method in ("random-random", "random-kzc"):
            draws = _kernels.uniform_draws(cfg.key(self.index), x.shape[0])
            chosen = np.sort(np.argsort(draws, kind="stable")[:size])
            summary = LocalSummary(points=x[chosen], weights=np.zeros(0, dtype=np.int64))
        else:  # mkcwm
            if x.shape[0]:
                centres = x[solvers.farthest_first(x, cfg.k + cfg.z)[0]]
                summary = LocalSummary(points=centres, weights=_voronoi_weights(x, centres))
            else:
                summary = LocalSummary(points=np.zeros((0, cfg.d)), weights=np.zeros(0, dtype=np.int64))
        out = self.send(self.coordinator, summary, phase="summary")
        self._finish(summary.points.shape[0])
        return [out]

    def _on_budget(self, sender: str, message: OutlierBudget) -> list[Outgoing]:
        self._check_sender(sender)
        cfg = self.config
        x = self.points
        t = min(int(message.outliers), x.shape[0])
        if x.shape[0] == 0:
            points, weights = np.zeros((0, cfg.d)), np.zeros(0, dtype=np.int64)
        elif cfg.method == "glz":
            points, weights = _glz_local(x, cfg.k, t)
        else:  # glz-z: the first 2k + t farthest-first points with their Voronoi cells
            order = self._order[: 2 * cfg.k + t]
            points = x[order]
            weights = _voronoi_weights(x, points)
        self.round_idx += 1
        summary = LocalSummary(points=points, weights=weights)
        out = self.send(self.coordinator, summary, phase="summary")
        self._finish(points.shape[0])
        return [out]


BaselineCoordinatorState = machine_states("BaselineCoordinatorState", "CURVES", "SUMMARIES")


class BaselineCoordinator(CollectingCoordinator):
    """The coordinator of a distributed baseline (sans-IO).

    Args:
        party: the coordinator's party name.
        config: the baseline's parameters.
        machines: every machine's party name, in machine order.

    Raises:
        ValueError: the machine list does not match the configuration or has duplicates.
    """

    State = BaselineCoordinatorState
    INITIAL_STATE = BaselineCoordinatorState.SUMMARIES
    TRANSITIONS = {
        (BaselineCoordinatorState.CURVES, CostCurve): ("_on_message", BaselineCoordinatorState.CURVES),
        (BaselineCoordinatorState.SUMMARIES, LocalSummary): ("_on_message", BaselineCoordinatorState.SUMMARIES),
    }

    def __init__(self, party: str, *, config: BaselineConfig, machines: Sequence[str]) -> None:
        super().__init__(party, config=config, machines=machines)
        self._budgets: tuple[int, ...] = ()
        if config.method in _TWO_ROUNDS:
            self.move_to(BaselineCoordinatorState.CURVES)

    @property
    def phase(self) -> str:
        return "curve" if self._state is BaselineCoordinatorState.CURVES else "summary"

    def _on_message(self, sender: str, message: Message) -> list[Outgoing]:
        self._admit(sender)
        if isinstance(message, LocalSummary):
            self._check_width(sender, message.points.shape[1])
        return self._collect(sender, message)

    def _advance(self) -> list[Outgoing]:
        if not self._round_complete():
            return []
        cfg = self.config
        if self._state is BaselineCoordinatorState.CURVES:
            curves = [(c.outliers, c.radii) for c in self._replies()]  # type: ignore[attr-defined]
            self._budgets = tuple(glz_budgets(curves, cfg.z, cfg.rho))
            budgets = {m: OutlierBudget(outliers=t) for m, t in zip(self.machines, self._budgets)}
            out = self._send_each(budgets, "budget")
            self.move_to(BaselineCoordinatorState.SUMMARIES)
            return out
        summaries: list[LocalSummary] = self._replies()  # type: ignore[assignment]
        points = np.concatenate([s.points for s in summaries], axis=0)
        weights = np.concatenate(
            [s.weights if s.weights.shape[0] else np.ones(s.points.shape[0], np.int64) for s in summaries]
        )
        centres = self._solve(points, weights)
        self._finish(BaselineResult(cfg.method, centres, int(points.shape[0]), dict(self._words), self._budgets))
        return []

    def _solve(self, points: np.ndarray, weights: np.ndarray) -> np.ndarray:
        cfg = self.config
        if points.shape[0] == 0:
            return np.zeros((0, cfg.d))
        if cfg.method == "random-random":
            draws = _kernels.uniform_draws(cfg.key(cfg.n_machines), points.shape[0])
            return points[np.sort(np.argsort(draws, kind="stable")[: cfg.k])]
        grow, expand = (5.0, 11.0) if cfg.method == "mkcwm" else (1.0, 3.0)
        idx, _ = charikar(points, cfg.k, cfg.z, weights=weights, grow=grow, expand=expand)
        return points[idx]

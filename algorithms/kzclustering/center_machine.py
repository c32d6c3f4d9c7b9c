"""The machine of distributed (k,z)-center (Guo & Li, Algorithm 3): aggregation at the radii asked.

A :class:`KzMachine` holds P_i and answers the coordinator's requests: its extent (unless radius
bounds are known), the counts ``|P'_i(L)|`` and ``|U_i(L)|`` of aggregation at the probed radii
(``probe`` search) or at every guess of the grid (``linear``, ``binary``), the weighted
representatives of a fetched guess, and at the end the outliers beyond the certified radius.
The protocol, its messages and its costs are described in
`fedproto.algorithms.kzclustering.protocol`; the coordinator is
`fedproto.algorithms.kzclustering.center_coordinator`.

References:
    Guo & Li, NeurIPS 2018, Algorithms 2 and 3, Appendix B; spec kz-clustering.md 2.1-2.7.
"""

from __future__ import annotations


import numpy as np

from fedproto.algorithms.kzclustering import _kernels, solvers
from fedproto.algorithms.kzclustering.config import KzCenterConfig
from fedproto.algorithms.kzclustering.messages import (
    AggregatedCounts,
    FinalCentres,
    LocalExtent,
    ProbeCounts,
    RadiusFetch,
    RadiusGrid,
    RadiusGuesses,
    RadiusProbes,
    Representatives,
    WeightedPoints,
)
from fedproto.algorithms.kzclustering.parties import COORDINATOR, DataMachine, extent_message
from fedproto.errors import RemoteProtocolError
from fedproto.messages import Message, Outgoing
from fedproto.machine import machine_states

__all__ = ["KzMachine", "MachineState"]


# AWAIT_GRID: before the first request (the grid, or the first probes)
MachineState = machine_states("MachineState", "AWAIT_GRID", "AWAIT_REQUEST")


class KzMachine(DataMachine):
    """A data-holding machine of distributed (k,z)-center (sans-IO).

    Args:
        party, config, coordinator: as :class:`~fedproto.algorithms.kzclustering.parties.DataMachine`.
        points: the machine's points P_i ``[n_i, d]`` float64 (``n_i`` may be 0; duplicates are
            fine).
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
        super().__init__(party, config=config, points=points, coordinator=coordinator)
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
            # k-d tree and distance rows, the same numbers as the matrix
            self._extent_cache = extent_message(self.points, self._local.extent())
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

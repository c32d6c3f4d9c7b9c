"""The parties of a (k,z)-clustering run and what every data-holding machine does alike.

Every protocol of the family (Guo & Li's (k,z)-center, the (k,z)-median/means of Appendix C, the
distributed baselines) is a star: one coordinator (party ``coordinator``) and m machines
(``machine-0 .. machine-{m-1}``; Guo & Li's word for the clients), each holding only its own
points. This module holds:

* the names (:data:`COORDINATOR`, :func:`machine_name`) and the roster of a run,
  :class:`KzParties` (a `fedproto.star.StarParties` whose clients are machines: role
  ``machine``, each built from its own raw rows, behind the ``setup.data`` phase of
  ``--normalize minmax`` when asked, `fedproto.algorithms.kzclustering.setup`);
* the machines' shared steps: :func:`check_points`, :class:`DataMachine` (points, coordinator,
  the sender check), :func:`extent_message` (the extent round's message) and the last step,
  :func:`label_outliers` with its :class:`MachineResult`.

The coordinators' shared loop is in `fedproto.algorithms.kzclustering.collect`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fedproto.algorithms.kzclustering import _kernels
from fedproto.algorithms.kzclustering.messages import FinalCentres, LocalExtent, OutlierCount
from fedproto.algorithms.kzclustering.setup import DataSetupCoordinator, DataSetupMachine
from fedproto.errors import RemoteProtocolError
from fedproto.machine import ProtocolMachine
from fedproto.messages import Outgoing
from fedproto.star import StarParties

__all__ = [
    "COORDINATOR",
    "DataMachine",
    "KzParties",
    "MachineResult",
    "check_points",
    "extent_message",
    "label_outliers",
    "machine_name",
]

COORDINATOR = "coordinator"


def machine_name(i: int) -> str:
    """Party name of machine ``i``."""
    return f"machine-{i}"


def check_points(points: Any, d: int | None) -> np.ndarray:
    """A machine's points as float64 ``[n_i, d]`` (``n_i`` may be 0).

    Raises:
        ValueError: ``d`` is ``None`` (a machine's configuration states it), the points do not
            have shape ``[n_i, d]``, or they hold NaN or infinite values.
    """
    if d is None:
        raise ValueError("a machine's configuration must state d, its points' number of features")
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != d:
        raise ValueError(f"points must have shape [n_i, {d}], got {points.shape}")
    if not np.all(np.isfinite(points)):
        raise ValueError("points contain NaN or infinite values")
    return points


def extent_message(points: np.ndarray, extent: Any) -> LocalExtent:
    """The extent round's message of a machine: ``n_i``, its smallest nonzero distance, its first
    point as the anchor (``[1, d]``; ``[0, d]`` when it holds none) and the radius around it.

    Args:
        points: the machine's points ``[n_i, d]`` float64.
        extent: their `fedproto.algorithms.kzclustering.solvers.Extent` (``n_points``,
            ``min_distance``, ``radius``).

    References:
        Spec kz-clustering.md 2.4 (practical alternative) and 3.2.
    """
    return LocalExtent(
        n_points=extent.n_points,
        min_distance=extent.min_distance,
        radius=extent.radius,
        anchor=points[: min(extent.n_points, 1)].copy(),
    )


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


class DataMachine(ProtocolMachine):
    """A data-holding machine of the family (abstract: subclasses give ``State`` and ``TRANSITIONS``).

    Args:
        party: this machine's party name.
        config: the run's public parameters (with ``d``, the points' number of features).
        points: the machine's points ``[n_i, d]`` float64 (``n_i`` may be 0).
        coordinator: the coordinator's party name.

    Raises:
        ValueError: as :func:`check_points`.
    """

    DEADLINE_FACTOR = 2.0  # waits on the coordinator, whose own wait names a silent machine first

    def __init__(self, party: str, *, config: Any, points: Any, coordinator: str = COORDINATOR) -> None:
        super().__init__(party)
        self.config = config
        self.coordinator = coordinator
        self.points = check_points(points, config.d)

    def _check_sender(self, sender: str) -> None:
        if sender != self.coordinator:
            raise RemoteProtocolError(
                f"{sender} is not the coordinator", party=sender, round_idx=self.round_idx, state=self._state.name
            )

    def _on_centres(self, sender: str, message: FinalCentres) -> list[Outgoing]:
        return label_outliers(self, sender, message)


def label_outliers(machine: DataMachine, sender: str, message: FinalCentres) -> list[Outgoing]:
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


class KzParties(StarParties):
    """The roster and machines of a (k,z) run: the coordinator, then the machines in order.

    Every party is built from its own data only (``own_data``): the coordinator from nothing, a
    machine from its own raw rows. With ``scale`` (``--normalize minmax``) each party first runs
    the ``setup.data`` phase and builds the algorithm's machine from what it agreed.

    Args:
        machines: the machines' names, in machine order.
        scale: run ``setup.data`` first (each machine scales its rows by the federation's extent).
        coordinator_of: ``(d or None) -> coordinator`` (``None``: it learns d from the machines).
        machine_of: ``(index, party, points [n_i, d]) -> machine``.

    Raises:
        ValueError: no machines, repeated names, or the coordinator among them.
    """

    own_data = True
    client_role = "machine"

    def __init__(
        self,
        machines: Sequence[str],
        *,
        scale: bool,
        coordinator_of: Callable[[int | None], ProtocolMachine],
        machine_of: Callable[[int, str, np.ndarray], ProtocolMachine],
    ) -> None:
        super().__init__(hub=COORDINATOR, clients=machines)
        self.scale = scale
        self.coordinator_of = coordinator_of
        self.machine_of = machine_of

    def hub_machine(self) -> ProtocolMachine:
        if self.scale:
            return DataSetupCoordinator(self.hub, machines=self.clients, build=self.coordinator_of)
        return self.coordinator_of(None)

    def client_machine(self, index: int, party: str, data: Any) -> ProtocolMachine:
        if self.scale:
            return DataSetupMachine(
                party, points=data, build=lambda x: self.machine_of(index, party, x), coordinator=self.hub
            )
        return self.machine_of(index, party, data)

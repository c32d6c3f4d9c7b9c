"""The setup phase ``setup.data`` of the (k,z)-clustering runs, and the feature-count agreement.

Each machine holds only its own raw points (issue 10). What a run needs from the whole
federation is agreed as follows (the plugins in `fedproto.algorithms.kzclustering.cli` build
the parties this way in every mode: a simulation in one process, or one process per party):

* n (and every n_i) and the number of features d: inside the protocol itself. The coordinator
  learns n_i from the extent round (or, with radius bounds, the counts and the first fetched
  points) and d from the first round in which every machine sent points (the extents' anchors,
  or the fetched representatives), and refuses a machine whose feature count differs from the
  others' (:func:`agree_feature_count`, naming it).
* the per-feature extent of ``--normalize minmax``: in the setup phase ``setup.data``, first,
  only when normalising (it is the one quantity the protocol does not already agree). Each
  machine sends :class:`~fedproto.algorithms.kzclustering.messages.DataSummary` (the per-feature
  minimum and maximum of its raw points, ``2 d`` words); the coordinator refuses a machine with
  another feature count, takes the element-wise minimum and maximum and sends every machine
  :class:`~fedproto.algorithms.kzclustering.messages.FederationSummary` (``2 d`` words). Each machine
  then scales its own points by the federation's extent (`fedproto.data.normalize`), which gives
  exactly the rows the pooled data scaled at once would (the same arithmetic, row by row), builds
  its protocol machine on them and starts the algorithm. The coordinator learns each machine's
  per-feature minimum and maximum; the machines learn the federation's.

:class:`DataSetupMachine` and :class:`DataSetupCoordinator` run that phase and then hand every
later input to the algorithm's machine they built (:class:`StagedMachine`). The setup frames are
stamped round 0 and phase ``setup.data``; the metering counts them as setup
(`fedproto.metering.is_setup_phase`), apart from the algorithm's rounds and words, and the
algorithm's machines start at round 0 as they would without a setup. A silent machine fails the
coordinator at the runtime's phase deadline with
:class:`~fedproto.errors.InsufficientParticipants` naming it.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fedproto.algorithms.kzclustering.messages import DataSummary, FederationSummary
from fedproto.data import feature_extent, normalize
from fedproto.errors import LocalProtocolError, RemoteProtocolError
from fedproto.machine import ProtocolMachine, machine_states
from fedproto.messages import Event, Message, Outgoing
from fedproto.star import check_clients

__all__ = [
    "SETUP_PHASE",
    "DataSetupCoordinator",
    "DataSetupMachine",
    "StagedMachine",
    "agree_feature_count",
    "data_summary",
]

#: The envelope phase of the setup frames (one name in every protocol family).
SETUP_PHASE = "setup.data"


def agree_feature_count(
    widths: Mapping[str, int], expected: int | None = None, *, round_idx: int = 0, phase: str | None = None
) -> int:
    """The number of features d the machines agree on, or an error naming the odd ones.

    Args:
        widths: ``{machine: its feature count}`` for every machine of a round, in machine order.
        expected: d when already known (then every other count is wrong); ``None``: the count a
            strict majority of the machines has.

    Returns:
        d.

    Raises:
        RemoteProtocolError: a machine's count differs from ``expected`` or from the majority's
            (``party`` is that machine when there is one), or no count has a strict majority (the
            message names every machine's count).
    """
    if not widths:
        raise ValueError("no machine to agree with")
    if expected is None:
        ranked = Counter(widths.values()).most_common()
        if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
            counts = ", ".join(f"{p} has {w}" for p, w in widths.items())
            raise RemoteProtocolError(
                f"the machines disagree on the number of features ({counts}): every machine's data must have the "
                "same features",
                round_idx=round_idx,
                phase=phase,
            )
        expected = ranked[0][0]
    odd = [p for p, w in widths.items() if w != expected]
    if odd:
        named = ", ".join(f"{p} has {widths[p]}" for p in odd)
        raise RemoteProtocolError(
            f"{named} features where the other machines have {expected}: every machine's data must have the same "
            "features",
            party=odd[0] if len(odd) == 1 else None,
            round_idx=round_idx,
            phase=phase,
        )
    return expected


def data_summary(points: np.ndarray) -> DataSummary:
    """A machine's setup message: the per-feature minimum and maximum of its raw points
    ``[n_i, d]`` (``+inf`` and ``-inf`` when ``n_i = 0``)."""
    points = np.asarray(points, dtype=np.float64)
    if points.shape[0] == 0:
        d = points.shape[1]
        return DataSummary(extent=np.stack([np.full(d, np.inf), np.full(d, -np.inf)]))
    return DataSummary(extent=np.stack(feature_extent(points)))


class StagedMachine(ProtocolMachine):
    """A setup phase, then an algorithm's machine built from what it agreed (sans-IO).

    The subclass handles the setup with its own ``State``/``TRANSITIONS`` and, when the setup is
    over, sets :attr:`inner` (a fresh machine) and returns ``inner.start()`` with its own last
    messages. From then on every input, event and query (``round_idx``, ``state``, ``phase``,
    ``pending``, ``result``, and any other attribute) goes to :attr:`inner`.

    Attributes:
        inner: the algorithm's machine, ``None`` during the setup.
    """

    def __init__(self, party: str) -> None:
        self.inner: ProtocolMachine | None = None
        self._setup_round = 0
        super().__init__(party)

    def __getattr__(self, name: str) -> Any:
        # only reached for attributes the wrapper lacks: the algorithm machine's (config, points, ...)
        inner = self.__dict__.get("inner")
        if inner is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r} (the setup is not over)")
        return getattr(inner, name)

    @property  # type: ignore[override]
    def round_idx(self) -> int:
        return self.inner.round_idx if self.inner is not None else self._setup_round

    @round_idx.setter
    def round_idx(self, value: int) -> None:
        if self.inner is not None:
            self.inner.round_idx = value
        else:
            self._setup_round = value

    @property
    def state(self) -> enum.Enum:
        if self.inner is not None and self._state is not self.State.ERROR:
            return self.inner.state
        return self._state

    @property
    def done(self) -> bool:
        return self.inner is not None and self._state is not self.State.ERROR and self.inner.done

    @property
    def failed(self) -> bool:
        return self._state is self.State.ERROR or (self.inner is not None and self.inner.failed)

    @property
    def phase(self) -> str:
        return self.inner.phase if self.inner is not None else SETUP_PHASE

    def pending(self) -> Sequence[str]:
        return self.inner.pending() if self.inner is not None else self._setup_pending()

    def _setup_pending(self) -> Sequence[str]:
        return ()

    def receive(self, sender: str, message: Message, *, round_idx: int | None = None) -> list[Outgoing]:
        if self.inner is not None and self._state is not self.State.ERROR:
            return self.inner.receive(sender, message, round_idx=round_idx)
        return super().receive(sender, message, round_idx=round_idx)

    def handle(self, event: Event) -> list[Outgoing]:
        if self.inner is not None and self._state is not self.State.ERROR:
            return self.inner.handle(event)
        return super().handle(event)

    def result(self) -> Any:
        if self.inner is not None and self._state is not self.State.ERROR:
            return self.inner.result()
        if self._state is self.State.ERROR:
            return super().result()  # raises, chained to the setup's failure
        raise LocalProtocolError("result() during the setup", party=self.party, state=self._state.name)

    def _begin(self, inner: ProtocolMachine) -> list[Outgoing]:
        """End the setup: ``inner`` takes over (started here; its first messages are returned)."""
        self.move_to(self.State.RUNNING)  # type: ignore[attr-defined]
        self.inner = inner
        return inner.start()


# RUNNING: the algorithm's machine has taken over
SetupMachineState = machine_states("SetupMachineState", "AWAIT_EXTENT", "RUNNING")


class DataSetupMachine(StagedMachine):
    """A data-holding machine's ``setup.data`` (min-max scaling by the federation's extent).

    Args:
        party: this machine's party name.
        points: its raw points ``[n_i, d]`` float64.
        build: ``(scaled points [n_i, d]) -> machine``: the algorithm's machine on the scaled points.
        coordinator: the coordinator's party name.
        bound: the half-width B of the scaled domain ``[-B, B]``.

    Raises:
        ValueError: ``points`` is not a 2-D array of at least one feature.
    """

    State = SetupMachineState
    INITIAL_STATE = SetupMachineState.AWAIT_EXTENT
    DEADLINE_FACTOR = 2.0  # waits on the coordinator, whose own wait names the silent machine first
    TRANSITIONS = {(SetupMachineState.AWAIT_EXTENT, FederationSummary): ("_on_summary", SetupMachineState.RUNNING)}

    def __init__(
        self,
        party: str,
        *,
        points: np.ndarray,
        build: Callable[[np.ndarray], ProtocolMachine],
        coordinator: str,
        bound: float = 1.0,
    ) -> None:
        super().__init__(party)
        points = np.asarray(points, dtype=np.float64)
        if points.ndim != 2 or points.shape[1] < 1:
            raise ValueError(f"points must have shape [n_i, d] with d >= 1, got {points.shape}")
        self.raw_points = points
        self.coordinator = coordinator
        self._build = build
        self._bound = bound

    def _start(self) -> list[Outgoing]:
        return [self.send(self.coordinator, data_summary(self.raw_points), phase=SETUP_PHASE)]

    def _on_summary(self, sender: str, message: FederationSummary) -> list[Outgoing]:
        if sender != self.coordinator:
            raise RemoteProtocolError(f"{sender} is not the coordinator", party=sender, round_idx=self.round_idx,
                                      phase=SETUP_PHASE)
        d = self.raw_points.shape[1]
        if message.extent.shape[1] != d:
            raise RemoteProtocolError(
                f"the federation's extent has {message.extent.shape[1]} features, this machine's data {d}",
                party=sender, round_idx=self.round_idx, phase=SETUP_PHASE,
            )
        scaled = normalize(self.raw_points, self._bound, extent=(message.extent[0], message.extent[1]))
        return self._begin(self._build(scaled))


SetupCoordinatorState = machine_states("SetupCoordinatorState", "COLLECT", "RUNNING")


class DataSetupCoordinator(StagedMachine):
    """The coordinator's ``setup.data``: agree the federation's per-feature extent.

    Args:
        party: the coordinator's party name.
        machines: every machine's party name, in machine order.
        build: ``(d) -> machine``: the algorithm's coordinator, once the machines agreed on d
            features.

    Raises:
        ValueError: no machines, duplicates, or the coordinator among them.
    """

    State = SetupCoordinatorState
    INITIAL_STATE = SetupCoordinatorState.COLLECT
    TRANSITIONS = {
        (SetupCoordinatorState.COLLECT, DataSummary): ("_on_summary", SetupCoordinatorState.COLLECT),
    }

    def __init__(self, party: str, *, machines: Sequence[str], build: Callable[[int], ProtocolMachine]) -> None:
        super().__init__(party)
        self.machines = check_clients(party, machines, noun="machines")
        self._build = build
        self._inbox: dict[str, DataSummary] = {}

    def _setup_pending(self) -> Sequence[str]:
        return [m for m in self.machines if m not in self._inbox]

    def _on_summary(self, sender: str, message: DataSummary) -> list[Outgoing]:
        if sender not in self.machines:
            raise RemoteProtocolError(f"{sender} is not a machine of this run", party=sender, round_idx=self.round_idx,
                                      phase=SETUP_PHASE)
        if sender in self._inbox:
            raise RemoteProtocolError(f"second data summary from {sender}", party=sender, round_idx=self.round_idx,
                                      phase=SETUP_PHASE)
        self._inbox[sender] = message
        return []

    def _advance(self) -> list[Outgoing]:
        if self._state is not SetupCoordinatorState.COLLECT or len(self._inbox) < len(self.machines):
            return []
        d = agree_feature_count({m: int(self._inbox[m].extent.shape[1]) for m in self.machines}, phase=SETUP_PHASE)
        extents = np.stack([self._inbox[m].extent for m in self.machines])  # [m, 2, d]
        extent = np.stack([extents[:, 0].min(axis=0), extents[:, 1].max(axis=0)])
        if not np.all(np.isfinite(extent)):
            raise ValueError("there are no points: every machine is empty")
        out = self.broadcast(self.machines, FederationSummary(extent=extent), phase=SETUP_PHASE)
        return [out, *self._begin(self._build(d))]

"""The coordinator's collect-and-check loop, shared by every coordinator of the (k,z) family.

Each round of Guo & Li's (k,z)-center, the (k,z)-median/means of Appendix C and the distributed
baselines has the same shape at the coordinator: it waits for one message from every machine,
refuses a stranger or a second message, checks the width of the points it receives (learning
d from the first round of points when its configuration leaves it ``None``), meters the words
of every message in and out per ``(round_idx, phase)``, and when the last machine's message is
in, answers them all and moves to the next round. :class:`CollectingCoordinator` holds that loop;
a protocol's coordinator adds its states, its own checks and what it computes from a full round.

:class:`RunWords` gives the coordinators' results their word totals; :func:`extents_diameter`
is the bound on the diameter both grids are built from (spec kz-clustering.md 2.4, 3.2).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedproto.algorithms.kzclustering import _kernels
from fedproto.algorithms.kzclustering.messages import LocalExtent, message_words
from fedproto.algorithms.kzclustering.setup import agree_feature_count
from fedproto.errors import RemoteProtocolError
from fedproto.machine import ProtocolMachine
from fedproto.messages import Message, Outgoing
from fedproto.star import check_clients

__all__ = ["CollectingCoordinator", "RunWords", "extents_diameter"]


class RunWords:
    """Word totals of a coordinator's result (a mixin of its frozen dataclass).

    The result has ``words``: words (scalars: a point of R^d is d words, a weight or count 1) per
    ``(round_idx, phase)``, both directions.
    """

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


def extents_diameter(extents: Sequence[LocalExtent], d: int) -> tuple[np.ndarray, float]:
    """The machines' anchors and the bound on the data's diameter from their extents.

    ``max_{i,j} (r_i + d(a_i, a_j) + r_j)`` over the machines that hold points (anchor ``a_i``,
    every point of machine i within ``r_i`` of it); 0 when at most one location is held.

    Args:
        extents: every machine's extent, in machine order.
        d: the points' number of features.

    Returns:
        ``(anchors [a, d] float64, diameter)`` with ``a`` the machines that hold points.
    """
    held = [(e.anchor[0], e.radius) for e in extents if e.anchor.shape[0]]
    anchors = np.asarray([a for a, _ in held]).reshape(-1, d)
    if not held:
        return anchors, 0.0
    radii = np.asarray([r for _, r in held])
    return anchors, float(np.max(radii[:, None] + _kernels.pairwise_distances(anchors) + radii[None, :]))


class CollectingCoordinator(ProtocolMachine):
    """A coordinator that collects one message per machine and round (abstract: subclasses give
    ``State``, ``INITIAL_STATE``, ``TRANSITIONS`` and ``phase``).

    Handlers check what is particular to a message, then :meth:`_collect` it; ``_advance`` acts
    once :meth:`_round_complete` and answers with :meth:`_broadcast` or :meth:`_send_each`.

    Args:
        party: the coordinator's party name.
        config: the run's public parameters, with ``n_machines`` (how many machines) and ``d`` (the
            points' number of features; ``None`` to learn it from the first round in which every
            machine sends points, :meth:`_check_width`, :meth:`_settle_features`).
        machines: every machine's party name, in machine order (``config.n_machines`` of them).

    Attributes:
        config: the run's public parameters.
        machines: the machines' names, in machine order.

    Raises:
        ValueError: the machine list does not match ``config.n_machines``, has duplicates, or holds
            the coordinator.
    """

    def __init__(self, party: str, *, config: Any, machines: Sequence[str]) -> None:
        super().__init__(party)
        machines = tuple(machines)
        n_machines = config.n_machines
        if len(machines) != n_machines:
            raise ValueError(f"{len(machines)} machines named, the configuration says {n_machines}")
        check_clients(party, machines, noun="machines")
        self.config = config
        self.machines = machines
        self._inbox: dict[str, Message] = {}
        self._words: dict[tuple[int, str], int] = defaultdict(int)
        self._d: int | None = config.d
        self._widths: dict[str, int] = {}  # feature counts of this round's points while d is unknown

    def pending(self) -> Sequence[str]:
        if self.done or self.failed:
            return []
        return [m for m in self.machines if m not in self._inbox]

    def _admit(self, sender: str) -> None:
        """Refuse a party that is not a machine of this run, or a second message this round.

        Raises:
            RemoteProtocolError: naming ``sender``.
        """
        if sender not in self.machines:
            raise RemoteProtocolError(f"{sender} is not a machine of this run", party=sender, round_idx=self.round_idx)
        if sender in self._inbox:
            raise RemoteProtocolError(
                f"second {self.phase} message from {sender} in round {self.round_idx}",
                party=sender,
                round_idx=self.round_idx,
                phase=self.phase,
            )

    def _collect(self, sender: str, message: Message) -> list[Outgoing]:
        """Keep ``sender``'s message of this round and meter its words (after :meth:`_admit`)."""
        self._admit(sender)
        self._inbox[sender] = message
        self._words[(self.round_idx, self.phase)] += message_words(message)
        return []

    def _round_complete(self) -> bool:
        """Every machine's message of this round is in (and the coordinator has not ended)."""
        return not (self.done or self.failed) and len(self._inbox) == len(self.machines)

    def _replies(self) -> list[Message]:
        """This round's messages, in machine order (when :meth:`_round_complete`)."""
        return [self._inbox[m] for m in self.machines]

    def _next_round(self) -> None:
        self._inbox = {}
        self.round_idx += 1

    def _broadcast(self, message: Message, phase: str) -> Outgoing:
        """``message`` to every machine (metered once per machine), then the next round."""
        self._words[(self.round_idx, phase)] += message_words(message) * len(self.machines)
        out = self.broadcast(self.machines, message, phase=phase)
        self._next_round()
        return out

    def _send_each(self, messages: Mapping[str, Message], phase: str) -> list[Outgoing]:
        """One message per machine (``{machine: message}``, metered), then the next round."""
        out = []
        for machine, message in messages.items():
            self._words[(self.round_idx, phase)] += message_words(message)
            out.append(self.send(machine, message, phase=phase))
        self._next_round()
        return out

    def _check_width(self, sender: str, width: int, *, anchor: bool = False) -> None:
        """``sender``'s points (or extent anchor) have ``d`` features; while d is unknown, note the
        width (this round's widths are compared once it is complete, :meth:`_settle_features`).

        Raises:
            RemoteProtocolError: ``width`` is not d.
        """
        if self._d is None:
            if sender in self.machines and sender not in self._inbox:
                self._widths[sender] = int(width)
        elif width != self._d:
            raise RemoteProtocolError(
                f"anchor of {sender} has {width} features, expected {self._d}"
                if anchor
                else f"{sender} sent points with {width} features, expected {self._d}",
                party=sender,
                round_idx=self.round_idx,
            )

    def _settle_features(self) -> bool:
        """d from the first round in which every machine sent points: the count they agree on.

        Returns:
            True when this call learnt d.

        Raises:
            RemoteProtocolError: a machine's count differs from the others' (naming it), or no
                count has a majority (`fedproto.algorithms.kzclustering.setup.agree_feature_count`).
        """
        if self._d is not None or not self._widths:
            return False
        self._d = agree_feature_count(
            {m: self._widths[m] for m in self.machines}, round_idx=self.round_idx, phase=self.phase
        )
        self._widths = {}
        return True

"""Exact metering of rounds and bytes, and the run report.

Counting happens once, at the codec boundary in the runtime (never inside algorithm code): every
frame's exact encoded length is added to a counter keyed by ``(round_idx, phase, sender,
receiver, tag)``. A frame is counted by its *sender* when it is sent; a party may also record the
frames it receives, which is how the report of one process of a multi-process run sees its
inbound links. Transports' own framing overhead (length prefixes) is counted separately.

Terms:

* *algorithm rounds*: distinct ``round_idx`` values among non-setup frames (for FastLloyd, the
  Lloyd iterations);
* *communication rounds*: distinct ``(round_idx, phase)`` pairs (sequential message phases);
* *setup*: frames whose phase starts with ``"setup"`` (key agreement and the like).
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["Meter", "LinkRecord", "RunReport", "is_setup_phase"]


def is_setup_phase(phase: str) -> bool:
    """True for phases that belong to a protocol's setup (metered as setup, not as rounds)."""
    return phase.startswith("setup")


class Meter:
    """Counters for one run (or one process of a run).

    Args:
        clock: returns the current time in seconds (the runtime passes ``trio.current_time``).
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock
        self.sent: dict[tuple[int, str, str, str, str], list[int]] = defaultdict(lambda: [0, 0])
        self.received: dict[tuple[int, str, str, str, str], list[int]] = defaultdict(lambda: [0, 0])
        self.framing_overhead_bytes = 0
        self.rejected: list[dict[str, Any]] = []
        self.round_started_s: dict[int, float] = {}
        self.started_s: float | None = None
        self.finished_s: float | None = None

    def _now(self) -> float:
        return self._clock() if self._clock is not None else 0.0

    def start(self) -> None:
        """Mark the start of the run (first call wins)."""
        if self.started_s is None:
            self.started_s = self._now()

    def finish(self) -> None:
        """Mark the end of the run (last call wins)."""
        self.finished_s = self._now()

    def record_sent(
        self, round_idx: int, phase: str, sender: str, receiver: str, tag: str, nbytes: int, overhead: int = 0
    ) -> None:
        """Count one frame of ``nbytes`` encoded bytes sent from ``sender`` to ``receiver``."""
        counter = self.sent[(round_idx, phase, sender, receiver, tag)]
        counter[0] += 1
        counter[1] += nbytes
        self.framing_overhead_bytes += overhead
        if round_idx not in self.round_started_s and not is_setup_phase(phase):
            self.round_started_s[round_idx] = self._now()

    def record_received(self, round_idx: int, phase: str, sender: str, receiver: str, tag: str, nbytes: int) -> None:
        """Count one frame received (kept apart from the sent counters)."""
        counter = self.received[(round_idx, phase, sender, receiver, tag)]
        counter[0] += 1
        counter[1] += nbytes

    def record_rejected(self, sender: str, reason: str) -> None:
        """Remember a frame that was refused before reaching a machine."""
        self.rejected.append({"sender": sender, "reason": reason})

    def report(
        self,
        *,
        protocol: str,
        transport: str,
        session: int,
        parties: Iterable[str],
        include_received: bool = False,
        results: Mapping[str, Any] | None = None,
    ) -> "RunReport":
        """Freeze the counters into a :class:`RunReport`.

        Args:
            include_received: also count frames that were only recorded on receipt (for the
                report of a single process that did not send them); frames present in both
                tables are counted once.
        """
        table = dict(self.sent)
        if include_received:
            for key, value in self.received.items():
                table.setdefault(key, value)
        links = tuple(
            LinkRecord(r, p, s, d, t, c[0], c[1]) for (r, p, s, d, t), c in sorted(table.items())
        )
        started = self.started_s if self.started_s is not None else 0.0
        finished = self.finished_s if self.finished_s is not None else started
        starts = sorted(self.round_started_s.items())
        round_wall = []
        for i, (r, t0) in enumerate(starts):
            t1 = starts[i + 1][1] if i + 1 < len(starts) else finished
            round_wall.append(max(t1 - t0, 0.0))
        return RunReport.from_links(
            protocol=protocol,
            transport=transport,
            session=session,
            parties=tuple(parties),
            links=links,
            framing_overhead_bytes=self.framing_overhead_bytes,
            wall_time_s=max(finished - started, 0.0),
            round_wall_s=tuple(round_wall),
            rejected_frames=len(self.rejected),
            results=dict(results or {}),
        )


@dataclasses.dataclass(frozen=True)
class LinkRecord:
    """Frames of one ``(round, phase, sender, receiver, tag)`` key.

    Attributes:
        round_idx: 0-based round.
        phase: protocol phase.
        sender: sending party.
        receiver: receiving party.
        tag: message tag.
        messages: number of frames.
        payload_bytes: their exact encoded bytes (envelope included, transport framing excluded).
    """

    round_idx: int
    phase: str
    sender: str
    receiver: str
    tag: str
    messages: int
    payload_bytes: int


@dataclasses.dataclass(frozen=True)
class RunReport:
    """What one run cost and produced; serialises to JSON, renders as a table and as plots.

    Attributes:
        protocol: protocol name.
        transport: transport name.
        session: the run's session id.
        parties: the roster.
        links: per-key frame counts and bytes.
        payload_bytes: total encoded bytes of all frames.
        setup_bytes: the part of ``payload_bytes`` sent in setup phases.
        messages: total frames.
        algorithm_rounds: distinct rounds among non-setup frames.
        communication_rounds: distinct ``(round, phase)`` pairs.
        framing_overhead_bytes: bytes the transport added on the wire (e.g. TCP length prefixes).
        wall_time_s: wall time of the run.
        round_wall_s: wall time of each algorithm round (first frame of a round to the first frame
            of the next, or to the end of the run).
        rejected_frames: frames refused before reaching a machine (undecodable, wrong session,
            unknown sender).
        results: protocol-specific results and metrics (JSON-serialisable).
    """

    protocol: str
    transport: str
    session: int
    parties: tuple[str, ...]
    links: tuple[LinkRecord, ...]
    payload_bytes: int
    setup_bytes: int
    messages: int
    algorithm_rounds: int
    communication_rounds: int
    framing_overhead_bytes: int
    wall_time_s: float
    round_wall_s: tuple[float, ...]
    rejected_frames: int
    results: dict[str, Any]

    @classmethod
    def from_links(cls, *, links: tuple[LinkRecord, ...], **fields: Any) -> "RunReport":
        """Build a report, deriving the totals from ``links``."""
        payload = sum(link.payload_bytes for link in links)
        setup = sum(link.payload_bytes for link in links if is_setup_phase(link.phase))
        rounds = {link.round_idx for link in links if not is_setup_phase(link.phase)}
        comm = {(link.round_idx, link.phase) for link in links}
        return cls(
            links=links,
            payload_bytes=payload,
            setup_bytes=setup,
            messages=sum(link.messages for link in links),
            algorithm_rounds=len(rounds),
            communication_rounds=len(comm),
            **fields,
        )

    # -- views --------------------------------------------------------------------------------------

    def bytes_by_link(self) -> dict[tuple[str, str], int]:
        """Payload bytes per ``(sender, receiver)``."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        for link in self.links:
            out[(link.sender, link.receiver)] += link.payload_bytes
        return dict(sorted(out.items()))

    def bytes_by_round(self, *, setup: bool = False) -> dict[int, int]:
        """Payload bytes per round (setup frames excluded unless ``setup``)."""
        out: dict[int, int] = defaultdict(int)
        for link in self.links:
            if setup or not is_setup_phase(link.phase):
                out[link.round_idx] += link.payload_bytes
        return dict(sorted(out.items()))

    def bytes_by_phase(self) -> dict[str, int]:
        """Payload bytes per phase."""
        out: dict[str, int] = defaultdict(int)
        for link in self.links:
            out[link.phase] += link.payload_bytes
        return dict(out)

    def bytes_by_role(self, role_of: Callable[[str], str]) -> dict[str, dict[str, int]]:
        """Sent and received payload bytes per role (``role_of(party)`` names the role)."""
        out: dict[str, dict[str, int]] = defaultdict(lambda: {"sent_bytes": 0, "received_bytes": 0, "parties": 0})
        for party in self.parties:
            out[role_of(party)]["parties"] += 1
        for link in self.links:
            out[role_of(link.sender)]["sent_bytes"] += link.payload_bytes
            out[role_of(link.receiver)]["received_bytes"] += link.payload_bytes
        return dict(out)

    # -- serialisation ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        data = dataclasses.asdict(self)
        data["links"] = [dataclasses.asdict(link) for link in self.links]
        return data

    def to_json(self, path: str | Path | None = None) -> str:
        """Serialise to JSON; also write it to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True, default=_json_default)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunReport":
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: a field is missing or malformed.
        """
        try:
            fields = dict(data)
            fields["links"] = tuple(LinkRecord(**link) for link in data["links"])
            fields["parties"] = tuple(data["parties"])
            fields["round_wall_s"] = tuple(data["round_wall_s"])
            return cls(**fields)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a run report: {exc}") from exc

    @classmethod
    def from_json(cls, text: str) -> "RunReport":
        """Parse a report written by :meth:`to_json`."""
        return cls.from_dict(json.loads(text))

    @classmethod
    def merge(cls, reports: Iterable["RunReport"], **overrides: Any) -> "RunReport":
        """Combine the reports of the processes of one run (each counting the frames it sent).

        Links are summed per key; wall time is the longest; results are merged in order.
        """
        reports = list(reports)
        if not reports:
            raise ValueError("nothing to merge")
        table: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
        for report in reports:
            for link in report.links:
                c = table[(link.round_idx, link.phase, link.sender, link.receiver, link.tag)]
                c[0] += link.messages
                c[1] += link.payload_bytes
        links = tuple(LinkRecord(*key, c[0], c[1]) for key, c in sorted(table.items()))
        results: dict[str, Any] = {}
        for report in reports:
            results.update(report.results)
        longest = max(reports, key=lambda r: r.wall_time_s)
        fields = dict(
            protocol=reports[0].protocol,
            transport=reports[0].transport,
            session=reports[0].session,
            parties=reports[0].parties,
            framing_overhead_bytes=sum(r.framing_overhead_bytes for r in reports),
            wall_time_s=longest.wall_time_s,
            round_wall_s=longest.round_wall_s,
            rejected_frames=sum(r.rejected_frames for r in reports),
            results=results,
        )
        fields.update(overrides)
        return cls.from_links(links=links, **fields)


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")

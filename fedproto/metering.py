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
import datetime
import functools
import importlib.metadata
import importlib.resources
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from fedproto.compilation import compile_seconds, device_description, kernels_compiled

__all__ = [
    "ANY_PARTY",
    "ConnectionBytes",
    "Meter",
    "LinkRecord",
    "RunReport",
    "REPORT_SCHEMA_VERSION",
    "RUN_STATUSES",
    "error_record",
    "is_setup_phase",
    "report_schema",
]

#: Version of the report layout (bumped when a field is renamed, removed or changes meaning, or a
#: new field becomes required; :file:`fedproto/report.schema.json` describes this version and the
#: ones before it). Version 2 added the required ``status``: every version-1 report was written by
#: a completed run, so one loads with ``status="completed"``.
REPORT_SCHEMA_VERSION = 2

#: The values of :attr:`RunReport.status`.
RUN_STATUSES = ("completed", "failed", "interrupted")

#: How many refused frames a :class:`Meter` keeps with their reasons (all are counted).
MAX_REJECTED_KEPT = 1000

#: The name that stands for many parties at one end of a grouped link record (see
#: :class:`Meter`'s ``group_links`` and :attr:`LinkRecord.parties`).
ANY_PARTY = "*"


def is_setup_phase(phase: str) -> bool:
    """True for phases that belong to a protocol's setup (metered as setup, not as rounds)."""
    return phase.startswith("setup")


class ConnectionBytes:
    """The counts of bytes a transport writes on the wire besides frames, each starting at 0.

    What a :class:`Meter` totals for a run and what a TCP endpoint counts as it goes
    (:class:`fedproto.transports.tcp.TcpTransport`); each count is described at the
    :class:`RunReport` field of the same name.

    Attributes:
        handshake_bytes: bytes written authenticating connections.
        tls_overhead_bytes: bytes TLS wrote around the frames after its handshakes.
        relay_overhead_bytes: bytes relaying frames through a third party cost.
        resumption_overhead_bytes: bytes that making links resumable cost.
        refused_bytes: bytes written to connections that were refused.
    """

    def __init__(self) -> None:
        self.handshake_bytes = 0
        self.tls_overhead_bytes = 0
        self.relay_overhead_bytes = 0
        self.resumption_overhead_bytes = 0
        self.refused_bytes = 0


class Meter(ConnectionBytes):
    """Counters for one run (or one process of a run).

    Args:
        clock: returns the current time in seconds (the runtime passes ``trio.current_time``).
        group_links: keep sent frames grouped by ``(round_idx, phase, tag, frame bytes)``, each
            group two lists of party names (sender and receiver of each frame: 16 bytes a frame
            instead of a dict entry of about 200 bytes per link), for simulations of 10^5 clients
            and more. Totals stay exact; :meth:`report` then writes one record for the links of a
            ``(round_idx, phase, tag)`` that share one end (the server's broadcast, the clients'
            uploads), its other end :data:`ANY_PARTY` and its :attr:`LinkRecord.parties` the
            number of parties that end stands for, and ``report(..., expand_links=True)`` or
            :meth:`link_records` give every link's record. Received frames are kept per link as
            usual. Default ``False``: one counter per ``(round_idx, phase, sender, receiver,
            tag)`` in :attr:`sent`.
        trace_compute: keep :attr:`compute_trace`, each handler's CPU time (the report's
            ``compute_trace``, the input of ``--compute trace:PATH``; see
            :class:`fedproto.netmodel.ComputeTrace`). Default ``False``.

    Attributes:
        sent: ``{(round_idx, phase, sender, receiver, tag): (frames, bytes)}``, the frames sent
            on each link (without ``group_links``).
        received: the same for the frames received (:meth:`record_received`).
        grouped: with ``group_links``, ``{(round_idx, phase, tag, nbytes): (senders, receivers)}``,
            one entry in each list per frame sent.
        rejected: the first :data:`MAX_REJECTED_KEPT` refused frames, as ``{"sender", "reason",
            "cause"}`` dicts in arrival order.
        rejected_frames: how many frames were refused in all.
        rejected_by_cause: refused frames per ``(sender, cause)``.
        prediction: the link model's prediction of the run's wall time, set by
            :func:`fedproto.simulation.simulate` with ``network=`` when the run completes (the
            report's ``prediction``, see :mod:`fedproto.netmodel`); empty otherwise.
        compute_trace: with ``trace_compute``, ``{party: [(round_idx, trigger, seconds), ...]}``,
            each handler the runtime ran for the party, in order (:meth:`record_compute`);
            ``None`` otherwise.
    """

    def __init__(
        self, clock: Callable[[], float] | None = None, *, group_links: bool = False, trace_compute: bool = False
    ) -> None:
        self._clock = clock
        self.group_links = group_links
        self.grouped: dict[tuple[int, str, str, int], tuple[list[str], list[str]]] = {}
        # (count, bytes) pairs, replaced rather than updated: a tuple of ints (as the key) is
        # untracked by the cyclic collector once it has seen it, so a long run's counters never
        # lengthen its full collections (a list per key did: 2-3 us per message in a 100k-object
        # process, benchmarks/message_rate.py's metering table)
        self.sent: dict[tuple[int, str, str, str, str], tuple[int, int]] = defaultdict(lambda: (0, 0))
        self.received: dict[tuple[int, str, str, str, str], tuple[int, int]] = defaultdict(lambda: (0, 0))
        super().__init__()  # the connection byte counts
        self.framing_overhead_bytes = 0
        self.rejected: list[dict[str, Any]] = []  # the first MAX_REJECTED_KEPT refusals, in order
        self.rejected_frames = 0
        self.rejected_by_cause: Counter[tuple[str, str]] = Counter()
        self.round_started_s: dict[int, float] = {}
        self.started_s: float | None = None
        self.finished_s: float | None = None
        self._compile_started = 0.0
        self._compile_finished: float | None = None
        self.prediction: dict[str, Any] = {}
        self.compute_trace: dict[str, list[tuple[int, str, float]]] | None = {} if trace_compute else None
        # a sharded simulation's ranks (fedproto.shards): set at rank 0 when the meters are gathered
        self.ranks: list[dict[str, Any]] = []

    def _now(self) -> float:
        return self._clock() if self._clock is not None else 0.0

    def start(self) -> None:
        """Mark the start of the run (first call wins)."""
        if self.started_s is None:
            self.started_s = self._now()
            self._compile_started = compile_seconds()

    def finish(self) -> None:
        """Mark the end of the run (last call wins)."""
        self.finished_s = self._now()
        self._compile_finished = compile_seconds()

    @property
    def compile_s(self) -> float:
        """Seconds spent compiling JAX kernels between :meth:`start` and :meth:`finish` (or now)."""
        if self.started_s is None:
            return 0.0
        end = self._compile_finished if self._compile_finished is not None else compile_seconds()
        return max(end - self._compile_started, 0.0)

    def record_sent(
        self, round_idx: int, phase: str, sender: str, receiver: str, tag: str, nbytes: int, overhead: int = 0
    ) -> None:
        """Count one frame of ``nbytes`` encoded bytes sent from ``sender`` to ``receiver``."""
        if self.group_links:
            group = self.grouped.get((round_idx, phase, tag, nbytes))
            if group is None:
                self.grouped[(round_idx, phase, tag, nbytes)] = ([sender], [receiver])
            else:
                group[0].append(sender)
                group[1].append(receiver)
        else:
            key = (round_idx, phase, sender, receiver, tag)
            counter = self.sent.get(key)  # (not the defaultdict's factory: a new key costs one call less)
            self.sent[key] = (1, nbytes) if counter is None else (counter[0] + 1, counter[1] + nbytes)
        if overhead:
            self.framing_overhead_bytes += overhead
        if round_idx not in self.round_started_s and not phase.startswith("setup"):  # is_setup_phase
            self.round_started_s[round_idx] = self._clock() if self._clock is not None else 0.0

    def link_records(self, *, grouped: bool = True, include_received: bool = False) -> tuple["LinkRecord", ...]:
        """The sent frames as link records, sorted by key (what :meth:`report` puts in ``links``).

        Args:
            grouped: with ``group_links``, one record for the links of a ``(round_idx, phase,
                tag)`` whose frames all have one sender (its receivers become
                :data:`ANY_PARTY`) or one receiver (its senders do), when more than one party is
                at the other end; the other links one record each. ``False``: one record per
                link, as a meter without ``group_links`` gives. Without ``group_links``, no effect.
            include_received: also the links that were only recorded on receipt (see
                :meth:`report`).

        Returns:
            :class:`LinkRecord` s; their ``messages`` and ``payload_bytes`` sum to every frame's.
        """
        table: dict[tuple[int, str, str, str, str], tuple[int, int]] = dict(self.sent)
        records: list[LinkRecord] = []
        by_kind: dict[tuple[int, str, str], list[tuple[int, list[str], list[str]]]] = defaultdict(list)
        for (r, p, t, nbytes), (senders, receivers) in self.grouped.items():
            by_kind[(r, p, t)].append((nbytes, senders, receivers))
        for (r, p, t), groups in by_kind.items():
            record = _one_ended(r, p, t, groups) if grouped else None
            if record is not None:
                records.append(record)
                continue
            for nbytes, senders, receivers in groups:
                for s, d in zip(senders, receivers, strict=True):
                    counter = table.get((r, p, s, d, t))
                    table[(r, p, s, d, t)] = (1, nbytes) if counter is None else (counter[0] + 1, counter[1] + nbytes)
        if include_received:
            grouped_links = {
                (r, p, s, d, t)
                for (r, p, t, _), (senders, receivers) in self.grouped.items()
                for s, d in zip(senders, receivers, strict=True)
            }
            for key, value in self.received.items():
                if key not in grouped_links:
                    table.setdefault(key, value)
        records.extend(LinkRecord(r, p, s, d, t, c[0], c[1]) for (r, p, s, d, t), c in table.items())
        return tuple(sorted(records, key=_link_key))

    def record_connection_bytes(
        self,
        *,
        handshake_bytes: int = 0,
        tls_overhead_bytes: int = 0,
        relay_overhead_bytes: int = 0,
        resumption_overhead_bytes: int = 0,
        refused_bytes: int = 0,
    ) -> None:
        """Add what a transport wrote on the wire besides frames (its endpoints' own counts).

        Args:
            handshake_bytes: bytes written while authenticating connections (TLS handshakes, the
                hello), e.g. :attr:`fedproto.transports.tcp.TcpTransport.handshake_bytes`.
            tls_overhead_bytes: bytes TLS added around the frames after its handshakes (record
                headers, content types, AEAD tags).
            relay_overhead_bytes: bytes that relaying frames between two parties through a third
                cost (route headers, and the relay's second hop), e.g.
                :attr:`fedproto.transports.tcp.TcpTransport.relay_overhead_bytes`.
            resumption_overhead_bytes: bytes that making links resumable cost (acknowledgements,
                goodbyes, frames written again after a broken connection was re-dialled), e.g.
                :attr:`fedproto.transports.tcp.TcpTransport.resumption_overhead_bytes`.
            refused_bytes: bytes written to connections the transport refused during their
                handshake (strangers, forged certificates), kept apart from ``handshake_bytes``,
                e.g. :attr:`fedproto.transports.tcp.TcpTransport.refused_bytes`.
        """
        self.handshake_bytes += handshake_bytes
        self.refused_bytes += refused_bytes
        self.tls_overhead_bytes += tls_overhead_bytes
        self.relay_overhead_bytes += relay_overhead_bytes
        self.resumption_overhead_bytes += resumption_overhead_bytes

    def record_received(self, round_idx: int, phase: str, sender: str, receiver: str, tag: str, nbytes: int) -> None:
        """Count one frame received (kept apart from the sent counters)."""
        key = (round_idx, phase, sender, receiver, tag)
        counter = self.received.get(key)
        self.received[key] = (1, nbytes) if counter is None else (counter[0] + 1, counter[1] + nbytes)

    def record_compute(self, party: str, round_idx: int, trigger: str, seconds: float) -> None:
        """Note one handler's compute (with ``trace_compute``; nothing otherwise).

        Args:
            party: the party that ran it.
            round_idx: the round of what triggered it (the frame's round; for ``"start"`` the
                machine's round after its start, for ``"timeout"`` its round when the deadline
                passed).
            trigger: ``"start"``, ``"timeout"``, or the tag of the message it received.
            seconds: the process CPU seconds it took (decoding the frame, the machine's
                ``start``, ``receive`` or ``handle``, and encoding what it sends; not the
                transport's writes).
        """
        trace = self.compute_trace
        if trace is not None:
            entries = trace.get(party)
            if entries is None:
                entries = trace[party] = []
            entries.append((round_idx, trigger, seconds))  # a tuple: untracked by the collector

    def record_rejected(self, sender: str, reason: str, cause: str = "refused") -> None:
        """Count a frame that was refused before reaching a machine.

        Args:
            sender: the party the transport says sent it.
            reason: why, in one line (kept for the first :data:`MAX_REJECTED_KEPT` refusals, so a
                peer that sends garbage for ever cannot grow the meter without bound).
            cause: the kind of refusal (a small fixed set), counted per ``(sender, cause)`` in
                :attr:`rejected_by_cause`.
        """
        self.rejected_frames += 1
        self.rejected_by_cause[(sender, cause)] += 1
        if len(self.rejected) < MAX_REJECTED_KEPT:
            self.rejected.append({"sender": sender, "reason": reason, "cause": cause})

    def report(
        self,
        *,
        protocol: str,
        transport: str,
        session: int,
        parties: Iterable[str],
        include_received: bool = False,
        results: Mapping[str, Any] | None = None,
        expand_links: bool = False,
    ) -> "RunReport":
        """Freeze the counters into a :class:`RunReport`.

        Args:
            include_received: also count frames that were only recorded on receipt (for the
                report of a single process that did not send them); frames present in both
                tables are counted once (with ``group_links``, received frames are added only
                on links that sent none).
            expand_links: with ``group_links``, one record per link instead of the grouped ones
                (see :meth:`link_records`); without it, no effect.
        """
        links = self.link_records(grouped=not expand_links, include_received=include_received)
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
            handshake_bytes=self.handshake_bytes,
            tls_overhead_bytes=self.tls_overhead_bytes,
            relay_overhead_bytes=self.relay_overhead_bytes,
            resumption_overhead_bytes=self.resumption_overhead_bytes,
            refused_bytes=self.refused_bytes,
            wall_time_s=max(finished - started, 0.0),
            round_wall_s=tuple(round_wall),
            rejected_frames=self.rejected_frames,
            results=dict(results or {}),
            compile_s=self.compile_s,
            device=device_description() if kernels_compiled() else "",
            prediction=dict(self.prediction),
            ranks=[dict(r) for r in self.ranks],
            compute_trace={party: [list(h) for h in trace] for party, trace in (self.compute_trace or {}).items()},
        )


@dataclasses.dataclass(frozen=True)
class LinkRecord:
    """Frames of one ``(round, phase, sender, receiver, tag)`` key.

    Attributes:
        round_idx: 0-based round.
        phase: protocol phase.
        sender: sending party, or :data:`ANY_PARTY` in a grouped record.
        receiver: receiving party, or :data:`ANY_PARTY` in a grouped record.
        tag: message tag.
        messages: number of frames.
        payload_bytes: their exact encoded bytes (envelope included, transport framing excluded).
        parties: how many distinct parties the :data:`ANY_PARTY` end of a grouped record stands
            for (a :class:`Meter` with ``group_links``: the links of one ``(round, phase, tag)``
            that share their other end, in one record); 1 for the record of one link.
    """

    round_idx: int
    phase: str
    sender: str
    receiver: str
    tag: str
    messages: int
    payload_bytes: int
    parties: int = 1


@dataclasses.dataclass(frozen=True)
class RunReport:
    """What one run cost and produced; serialises to JSON, renders as a table and as plots.

    The JSON form (:meth:`to_dict`, :meth:`to_json`) is described by the JSON Schema that
    :func:`report_schema` returns (``fedproto/report.schema.json``, draft 2020-12). Fields added
    after the first release have defaults, so reports written by older code still load.

    Attributes:
        protocol: protocol name (the entry-point name, e.g. ``"fastlloyd"``).
        transport: transport name (``"memory"``, ``"tcp"``, ``"mpi"``).
        session: the run's session id (non-negative integer, same in every process of the run).
        parties: the roster, in roster order.
        links: per-key frame counts and bytes.
        payload_bytes: total encoded bytes of all frames (bytes).
        setup_bytes: the part of ``payload_bytes`` sent in setup phases (bytes).
        messages: total frames (count).
        algorithm_rounds: distinct rounds among non-setup frames (count).
        communication_rounds: distinct ``(round, phase)`` pairs (count).
        framing_overhead_bytes: bytes the transport added on the wire, e.g. TCP length prefixes
            (bytes).
        wall_time_s: wall time of the run (seconds, on the runtime's clock).
        round_wall_s: wall time of each algorithm round, first frame of a round to the first frame
            of the next or to the end of the run (seconds).
        rejected_frames: frames refused before reaching a machine (undecodable, wrong session,
            unknown sender) (count).
        results: measured results of the protocol: snake_case keys with units in the name
            (``nicv``, ``removal_ms_mean``, ``payload_bytes``), numbers as numbers, nested
            objects obeying the same rules (see the schema).
        schema_version: version of this layout, :data:`REPORT_SCHEMA_VERSION`.
        fedproto_version: version of the installed ``fedproto`` package that wrote the report
            (``"0.0.0+unknown"`` when it is not installed as a distribution).
        options: every command-line option of the run by its argparse destination
            (``{"seed": 0, "clients": 4, ...}``); empty for a report built by a program.
        command: the command line (argv) that started the run; empty when unknown.
        started_at: when the run started, ISO-8601 in UTC (``"2024-05-01T12:00:00.123456+00:00"``,
            see :meth:`timestamp`), or ``None``.
        finished_at: when the run finished, same format, or ``None``.
        paper: figures the paper reports for this setting, kept apart from the measured
            ``results`` (same key rules as ``results``); empty when there are none.
        device: the device JAX ran the kernels on, ``"<platform>: <kind>"`` (``"cpu: cpu"``,
            ``"gpu: NVIDIA H100 80GB HBM3"``; `fedproto.compilation.device_description`), the
            distinct ones joined by ``"; "`` in a merged run; ``""`` when the process compiled
            no JAX kernel (`fedproto.compilation.kernels_compiled`: a protocol that does not
            use JAX).
        compile_s: seconds the run's process spent tracing, lowering and compiling JAX kernels
            (`fedproto.compilation.compile_seconds`), part of ``wall_time_s`` and of the
            rounds where it happened; the largest over the processes of a merged run; 0.0 when
            not measured.
        faults: the faults injected into the run, ``{"dropouts": [{"party": ..., "stage": ...,
            "round_idx": ... or None, "crashed": bool}, ...]}`` (``fedproto run --dropout``,
            ``--dropout-rate``; ``crashed`` says whether the party reached that stage and crashed
            there); empty when none were, and then left out of the JSON form.
        handshake_bytes: bytes the transport wrote authenticating connections: TLS handshakes and
            the hello inside them, or the shared-secret handshake (bytes; 0 in memory and MPI).
        tls_overhead_bytes: bytes TLS wrote around the frames after its handshakes: record
            headers, content types and AEAD tags (bytes; 0 without TLS).
        relay_overhead_bytes: bytes relaying cost where a frame between two parties travels
            through a third (the TCP star's hub): each relayed frame's route header on its first
            hop and its whole second hop as written to the socket (bytes; 0 when nothing was
            relayed). The frame itself is counted once, in ``payload_bytes``, on its logical link.
        resumption_overhead_bytes: bytes that making links resumable cost (the TCP star): the
            acknowledgements and goodbyes of its links, and frames written again after a broken
            connection was re-dialled and resumed, each as written to the socket (bytes; 0 in
            memory, MPI and the TCP mesh). The re-dials' handshakes are in ``handshake_bytes``;
            a frame written again is counted once in ``payload_bytes``.
        refused_bytes: bytes the transport wrote to connections it refused (a stranger's or a
            forger's TLS handshake, the refusal itself) (bytes; 0 in memory and MPI). Kept apart
            from ``handshake_bytes`` so that an attacker cannot inflate what the honest
            parties' links cost.
        status: how the run ended, one of :data:`RUN_STATUSES`: ``"completed"`` (every party
            finished; ``results`` are whole), ``"failed"`` (a party raised: ``error`` says who
            and why; the counters hold what was metered up to the failure, ``results`` may be
            empty) or ``"interrupted"`` (SIGINT or SIGTERM: ``error`` names the signal; the
            counters hold what was metered until then).
        error: why a run that did not complete ended, ``None`` for a completed one:
            ``{"type": exception class name, "message": one line, "party": the party that
            reported it or None, "culprits": [parties the reporter blames], "round_idx": int or
            None, "phase": str or None, "signal": "SIGINT"/"SIGTERM" or None}``.
        privacy: the privacy ledger of a run that adds noise (see :mod:`fedproto.algorithms.dp`
            and the report schema): mechanism, sensitivity and its norm, the noise scale of each
            release, epsilon and delta per round and composed, the accountant; empty (and left
            out of the JSON form) for a run that adds none.
        prediction: the link model's prediction of the run's wall time between real sites
            (``fedproto run --engine lean --network ...``, :mod:`fedproto.netmodel`): predicted
            wall time and its critical-path split into network, compute and deadline waiting
            (seconds, shares), latency hops, per round, per phase, and a per-party timeline;
            empty (and left out of the JSON form) when no model ran.
        ranks: the MPI ranks of a sharded lean simulation (``mpiexec -n R fedproto run ...
            --engine lean``, :mod:`fedproto.shards`), one entry per rank in rank order:
            ``{"rank": int, "parties": parties it hosted, "peak_rss_mib": its peak resident
            memory (MiB), "exchange_s": seconds it spent in the exchanges between ranks (waiting
            for the others included)}``; empty (and left out of the JSON form) for a run in one
            process.
        compute_trace: each handler the runtime ran, per party, in order, with ``--compute-trace``
            (:class:`Meter`'s ``trace_compute``): ``{party: [[round_idx, trigger, seconds], ...]}``,
            ``trigger`` ``"start"``, ``"timeout"`` or the received message's tag, ``seconds`` the
            handler's process CPU time (decoding, the machine, encoding; not the transport's
            writes). The input of ``fedproto run --engine lean --network ... --compute
            trace:PATH`` (:class:`fedproto.netmodel.ComputeTrace`); empty (and left out of the
            JSON form) otherwise. Merged reports hold every process's parties.
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
    schema_version: int = REPORT_SCHEMA_VERSION
    fedproto_version: str = dataclasses.field(default_factory=lambda: _fedproto_version())
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    command: tuple[str, ...] = ()
    started_at: str | None = None
    finished_at: str | None = None
    paper: dict[str, Any] = dataclasses.field(default_factory=dict)
    compile_s: float = 0.0
    device: str = ""
    faults: dict[str, Any] = dataclasses.field(default_factory=dict)
    handshake_bytes: int = 0
    tls_overhead_bytes: int = 0
    relay_overhead_bytes: int = 0
    resumption_overhead_bytes: int = 0
    refused_bytes: int = 0
    status: str = "completed"
    error: dict[str, Any] | None = None
    privacy: dict[str, Any] = dataclasses.field(default_factory=dict)
    prediction: dict[str, Any] = dataclasses.field(default_factory=dict)
    ranks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    compute_trace: dict[str, list[list[Any]]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in RUN_STATUSES:
            raise ValueError(f"report status must be one of {', '.join(RUN_STATUSES)}, got {self.status!r}")
        if (self.error is None) != (self.status == "completed"):
            raise ValueError(f"a {self.status} run's report {'has no' if self.error is None else 'has an'} error")

    @staticmethod
    def timestamp(when: datetime.datetime | None = None) -> str:
        """An ISO-8601 UTC timestamp in the report's format (``started_at``, ``finished_at``).

        Args:
            when: the instant (naive values are taken as UTC); default now.
        """
        if when is None:
            when = datetime.datetime.now(datetime.timezone.utc)
        elif when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        return when.astimezone(datetime.timezone.utc).isoformat()

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
        """A JSON-ready dict (the layout of ``report.schema.json``)."""
        data = dataclasses.asdict(self)
        data["links"] = [_link_dict(link) for link in self.links]
        for name in ("parties", "round_wall_s", "command"):
            data[name] = list(data[name])
        if not self.faults:
            del data["faults"]  # only a run with injected faults says so
        if self.error is None:
            del data["error"]  # only a run that did not complete says why
        if not self.privacy:
            del data["privacy"]  # only a run that adds noise keeps a ledger
        if not self.prediction:
            del data["prediction"]  # only a run with a link model predicts its time
        if not self.ranks:
            del data["ranks"]  # only a sharded simulation has ranks
        if not self.compute_trace:
            del data["compute_trace"]  # only a run asked to trace its handlers has one
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

        Reports without the fields added after the first layout (``schema_version`` and later)
        load with their defaults; a version-1 report (written only by completed runs) loads with
        ``status="completed"``.

        Raises:
            ValueError: a field is missing or malformed, or the report was written in a newer
                layout than :data:`REPORT_SCHEMA_VERSION`.
        """
        try:
            fields = dict(data)
            version = fields.get("schema_version", REPORT_SCHEMA_VERSION)
            if not isinstance(version, int) or isinstance(version, bool) or version > REPORT_SCHEMA_VERSION:
                raise ValueError(
                    f"report schema_version {version!r} is not supported (this fedproto reads up to "
                    f"{REPORT_SCHEMA_VERSION})"
                )
            fields["links"] = tuple(LinkRecord(**link) for link in data["links"])
            fields["parties"] = tuple(data["parties"])
            fields["round_wall_s"] = tuple(data["round_wall_s"])
            if "command" in fields:
                fields["command"] = tuple(fields["command"])
            fields["schema_version"] = REPORT_SCHEMA_VERSION
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

        Links are summed per key (a grouped record's ``parties`` too: each process groups the
        parties whose frames it sent); wall time and compile time are the longest; results and paper figures are merged
        in order; options, command and versions are the first report's; ``started_at`` is the
        earliest and ``finished_at`` the latest of those known. The status is ``"failed"`` when
        any process failed, else ``"interrupted"`` when any was, else ``"completed"``; the error
        is the first of that status's; the privacy ledger and the link model's prediction are the first non-empty ones.
        """
        reports = list(reports)
        if not reports:
            raise ValueError("nothing to merge")
        table: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])
        for report in reports:
            for link in report.links:
                c = table[(link.round_idx, link.phase, link.sender, link.receiver, link.tag)]
                c[0] += link.messages
                c[1] += link.payload_bytes
                c[2] += link.parties  # each process groups the parties whose frames it sent
        links = tuple(
            LinkRecord(*key, c[0], c[1], c[2] if ANY_PARTY in key[2:4] else 1) for key, c in sorted(table.items())
        )
        results: dict[str, Any] = {}
        paper: dict[str, Any] = {}
        for report in reports:
            results.update(report.results)
            paper.update(report.paper)
        longest = max(reports, key=lambda r: r.wall_time_s)
        starts = [r.started_at for r in reports if r.started_at is not None]
        ends = [r.finished_at for r in reports if r.finished_at is not None]
        first = reports[0]
        statuses = {r.status for r in reports}
        status = next(s for s in ("failed", "interrupted", "completed") if s in statuses)
        fields = dict(
            schema_version=first.schema_version,
            fedproto_version=first.fedproto_version,
            options=dict(first.options),
            command=first.command,
            started_at=min(starts, key=_parse_timestamp) if starts else None,
            finished_at=max(ends, key=_parse_timestamp) if ends else None,
            paper=paper,
            protocol=reports[0].protocol,
            transport=reports[0].transport,
            session=reports[0].session,
            parties=reports[0].parties,
            framing_overhead_bytes=sum(r.framing_overhead_bytes for r in reports),
            handshake_bytes=sum(r.handshake_bytes for r in reports),
            tls_overhead_bytes=sum(r.tls_overhead_bytes for r in reports),
            relay_overhead_bytes=sum(r.relay_overhead_bytes for r in reports),
            resumption_overhead_bytes=sum(r.resumption_overhead_bytes for r in reports),
            refused_bytes=sum(r.refused_bytes for r in reports),
            status=status,
            error=next((dict(r.error) for r in reports if r.status == status and r.error is not None), None),
            privacy=next((dict(r.privacy) for r in reports if r.privacy), {}),
            prediction=next((dict(r.prediction) for r in reports if r.prediction), {}),
            ranks=next((list(r.ranks) for r in reports if r.ranks), []),
            compute_trace={party: list(h) for r in reports for party, h in r.compute_trace.items()},
            wall_time_s=longest.wall_time_s,
            round_wall_s=longest.round_wall_s,
            rejected_frames=sum(r.rejected_frames for r in reports),
            results=results,
            compile_s=max(r.compile_s for r in reports),
            faults=next((dict(r.faults) for r in reports if r.faults), {}),
            device="; ".join(dict.fromkeys(r.device for r in reports if r.device)),
        )
        fields.update(overrides)
        return cls.from_links(links=links, **fields)


def error_record(
    exc: BaseException, *, reporter: str | None = None, signal: str | None = None
) -> dict[str, Any]:
    """The ``error`` of a failed or interrupted run's report, from the exception that ended it.

    Args:
        exc: the exception (a :class:`~fedproto.errors.FedProtoError` gives its structured
            attributes; any other gives its class name and message).
        reporter: the party whose process saw ``exc`` (``None`` for the launcher or a signal);
            a :class:`~fedproto.errors.RunAborted` names its own reporter instead, the party
            that sent the failure notice.
        signal: ``"SIGINT"`` or ``"SIGTERM"`` for an interrupted run.

    Returns:
        ``{"type", "message", "party", "culprits", "round_idx", "phase", "signal"}`` (see the
        report schema): ``culprits`` are the reporter's claim (a notice's culprits, a quorum's
        missing parties, the peer a remote protocol error names, the reporter itself for a local
        one), never a verified fact.
    """
    from fedproto.errors import FedProtoError, InsufficientParticipants, LocalProtocolError, RunAborted

    party = reporter
    culprits: tuple[str, ...] = ()
    if isinstance(exc, RunAborted):
        party = exc.reporter or reporter
        culprits = exc.culprits
    elif isinstance(exc, InsufficientParticipants):
        culprits = exc.missing
    elif isinstance(exc, LocalProtocolError):
        culprits = (reporter,) if reporter else ()
    elif isinstance(exc, FedProtoError) and exc.party and exc.party != reporter:
        culprits = (exc.party,)
    message = " ".join(str(exc).split()) or type(exc).__name__
    return {
        "type": type(exc).__name__,
        "message": message,
        "party": party,
        "culprits": list(culprits),
        "round_idx": getattr(exc, "round_idx", None) if isinstance(exc, FedProtoError) else None,
        "phase": getattr(exc, "phase", None) if isinstance(exc, FedProtoError) else None,
        "signal": signal,
    }


def _link_dict(link: LinkRecord) -> dict[str, Any]:
    """A link record's JSON form (``parties`` only in a grouped record: ordinary reports keep their
    layout)."""
    data = dataclasses.asdict(link)
    if link.parties == 1:
        del data["parties"]
    return data


def _link_key(link: LinkRecord) -> tuple[int, str, str, str, str]:
    return (link.round_idx, link.phase, link.sender, link.receiver, link.tag)


def _one_ended(
    round_idx: int, phase: str, tag: str, groups: list[tuple[int, list[str], list[str]]]
) -> LinkRecord | None:
    """The grouped record of one ``(round_idx, phase, tag)``'s frames (``(nbytes, senders,
    receivers)`` lists), when they all share a sender or a receiver and more than one party is at
    the other end; else ``None``."""
    for fixed_at in (0, 1):
        end = groups[0][1 + fixed_at][0]
        if all(names.count(end) == len(names) for names in (g[1 + fixed_at] for g in groups)):
            others = {name for g in groups for name in g[2 - fixed_at]}
            if len(others) < 2:
                return None
            sender, receiver = (end, ANY_PARTY) if fixed_at == 0 else (ANY_PARTY, end)
            messages = sum(len(g[1]) for g in groups)
            payload = sum(g[0] * len(g[1]) for g in groups)
            return LinkRecord(round_idx, phase, sender, receiver, tag, messages, payload, len(others))
    return None


def report_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a report's JSON form, shipped as package data.

    Returns:
        A fresh dict parsed from ``fedproto/report.schema.json`` (safe to modify).

    Example:
        >>> import jsonschema  # doctest: +SKIP
        >>> jsonschema.validate(json.loads(path.read_text()), report_schema())  # doctest: +SKIP
    """
    return json.loads(_schema_text())


@functools.cache
def _schema_text() -> str:
    return importlib.resources.files("fedproto").joinpath("report.schema.json").read_text(encoding="utf-8")


@functools.cache
def _fedproto_version() -> str:
    try:
        return importlib.metadata.version("fedproto")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0+unknown"


def _parse_timestamp(text: str) -> datetime.datetime:
    """A report timestamp as an aware datetime (naive values are taken as UTC)."""
    when = datetime.datetime.fromisoformat(text)
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.timezone.utc)


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")

"""What each handler costs in the link model's prediction: ``--compute measured|fixed:SECONDS|trace:PATH``.

Part of :mod:`fedproto.netmodel` (which exports both names): :func:`parse_compute` reads the
option, :class:`ComputeTrace` holds the compute a run's parties measured where they ran.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["ComputeTrace", "parse_compute"]


class ComputeTrace:
    """Each handler's compute time as measured where the parties ran: ``--compute trace:PATH``.

    A run's parties note every handler's process CPU time when asked (``fedproto run`` or
    ``fedproto party`` with ``--compute-trace``: the report's ``compute_trace``). Predicting a
    run from that trace charges each handler what it cost on the machines that ran it (their
    processors, their caches, and each party process compiling or loading its own kernels)
    instead of what it costs in the lean engine's one process: a check of the link model apart
    from the compute, or the same deployment's compute over other links.

    The lean engine's ``k``-th handler of a party for a ``(round, trigger)`` is charged the
    trace's ``k``-th figure for the same party, round and trigger (``"start"``, ``"timeout"`` or
    the received message's tag), so the hub's last update of a round (the one that aggregates)
    takes the last update's figure, whichever client sent it. A handler the trace has no figure
    for is charged its measured compute and counted in the prediction's ``untraced_handlers``;
    figures no handler took are counted in its ``unused_trace_figures`` (both 0 when the trace is
    of the same run: a trace of another run, other options or another roster, shows there).
    The trace holds each party process's own compilation and first kernel, so the model's
    ``compile`` and ``first_kernel_s`` add nothing for traced handlers; ``per_frame_s`` (the
    transport's share, which the trace leaves out) and the connection set-up still apply.

    Args:
        handlers: ``{party: [(round_idx, trigger, seconds), ...]}`` in the order each party ran them.
        source: where it was read (for messages).

    Raises:
        ValueError: an entry is not ``[round_idx >= 0, trigger, seconds >= 0]``.
    """

    def __init__(self, handlers: Mapping[str, Sequence[Sequence[Any]]], source: str = "") -> None:
        self.source = source
        self._figures: dict[tuple[str, int, str], list[float]] = defaultdict(list)
        self.handlers = 0  # figures in all
        for party, entries in handlers.items():
            for i, entry in enumerate(entries):
                where = f"{source or 'compute trace'}: {party}[{i}]"
                if not isinstance(entry, Sequence) or isinstance(entry, str) or len(entry) != 3:
                    raise ValueError(f"{where}: expected [round_idx, trigger, seconds], got {entry!r}")
                round_idx, trigger, seconds = entry
                if isinstance(round_idx, bool) or not isinstance(round_idx, int) or round_idx < 0:
                    raise ValueError(f"{where}: round_idx must be an integer >= 0, got {round_idx!r}")
                if not isinstance(trigger, str) or not trigger:
                    raise ValueError(f"{where}: trigger must be a non-empty string, got {trigger!r}")
                if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not (
                    math.isfinite(seconds) and seconds >= 0
                ):
                    raise ValueError(f"{where}: seconds must be a finite number >= 0, got {seconds!r}")
                self._figures[(str(party), round_idx, trigger)].append(float(seconds))
                self.handlers += 1

    @classmethod
    def load(cls, path: str | Path) -> "ComputeTrace":
        """Read the ``compute_trace`` of a run report (JSON; a merged one holds every party), or of
        every report in a directory (``*.json``: the party reports of a deployment, ``fedproto
        party --party-report``, each holding its own party).

        Raises:
            ValueError: the path cannot be read, a file is not JSON or holds no ``compute_trace``,
                two reports trace the same party, or an entry is malformed.
        """
        path = Path(path)
        files = sorted(path.glob("*.json")) if path.is_dir() else [path]
        merged: dict[str, Any] = {}
        for file in files:
            try:
                doc = json.loads(file.read_text())
            except OSError as exc:
                raise ValueError(f"cannot read the compute trace {file}: {exc.strerror or exc}") from None
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValueError(f"{file}: not a JSON run report ({exc})") from None
            if isinstance(doc, dict) and isinstance(doc.get("report"), dict):
                doc = doc["report"]  # a party report (fedproto party --party-report): the report inside
            trace = doc.get("compute_trace") if isinstance(doc, dict) else None
            if not isinstance(trace, dict) or not trace:
                if path.is_dir() and not (isinstance(doc, dict) and "links" in doc):
                    continue  # a directory may hold other JSON files (a roster, a split)
                raise ValueError(f"{file}: the report has no compute_trace (run the parties with --compute-trace)")
            for party, entries in trace.items():
                if party in merged:
                    raise ValueError(f"{file}: party {party!r} is traced in two reports")
                if not isinstance(entries, list):
                    raise ValueError(f"{file}: compute_trace[{party!r}] must be a list")
                merged[party] = entries
        if not merged:
            raise ValueError(f"{path}: no run report with a compute_trace there")
        return cls(merged, source=str(path))

    def figure(self, party: str, round_idx: int, trigger: str, k: int) -> float | None:
        """The ``k``-th figure (0-based) for ``party``'s handlers of ``(round_idx, trigger)``
        (seconds); ``None`` when the trace has fewer. A trace is read-only: each prediction
        counts its own handlers (:class:`~fedproto.netmodel.LinkSimulator`)."""
        figures = self._figures.get((party, round_idx, trigger))
        return figures[k] if figures is not None and k < len(figures) else None


def parse_compute(spec: str | float | ComputeTrace | None) -> float | ComputeTrace | None:
    """``--compute``: ``"measured"`` (or ``None``) gives ``None``; ``"fixed:SECONDS"`` (or a number)
    gives the seconds every handler costs; ``"trace:PATH"`` gives the :class:`ComputeTrace` read
    from the run report(s) at ``PATH`` (a :class:`ComputeTrace` is taken as it is).

    Measured compute is each handler's ``time.perf_counter`` span on this process (wall time, not
    CPU time): numeric kernels run on worker threads (XLA, multi-threaded BLAS) or on an
    accelerator, which this thread's CPU time would miss and the process's would count once per
    busy thread. It therefore includes any time the operating system gave to other processes:
    use ``fixed`` for repeatable predictions, ``trace`` for the compute of the machines that ran
    the parties.

    Raises:
        ValueError: not ``measured``, ``fixed:`` followed by a finite number >= 0, nor
            ``trace:`` followed by a readable trace (:meth:`ComputeTrace.load`).
    """
    if spec is None or spec == "measured":
        return None
    if isinstance(spec, ComputeTrace):
        return spec
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        seconds = float(spec)
    else:
        text = str(spec)
        if text.startswith("trace:"):
            if not text[len("trace:"):]:
                raise ValueError("compute trace:PATH needs the path of a run report with a compute_trace")
            return ComputeTrace.load(text[len("trace:"):])
        if not text.startswith("fixed:"):
            raise ValueError(f"compute must be measured, fixed:SECONDS or trace:PATH, got {spec!r}")
        try:
            seconds = float(text[len("fixed:"):])
        except ValueError:
            raise ValueError(f"compute fixed:SECONDS needs a number of seconds, got {spec!r}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"compute seconds must be a finite number >= 0, got {spec!r}")
    return seconds

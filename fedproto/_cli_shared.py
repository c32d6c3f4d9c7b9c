"""What several ``fedproto`` commands share: the options as a run's agreement and report keep
them, the frame limit in force, the run's data, the compile cache, and the report of a run that
ended early.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import logging
import signal
from collections.abc import Mapping, Sequence
from typing import Any

from fedproto import memo
from fedproto._cli_parser import _INTERNAL_KEYS
from fedproto._interrupt import Interrupted
from fedproto.agreement import PARTY_LOCAL_OPTIONS, Agreement
from fedproto.compilation import enable_compile_cache
from fedproto.data import Dataset, load_dataset, session_id
from fedproto.errors import LocalProtocolError
from fedproto.framesize import abort_notice_frame_bytes
from fedproto.metering import Meter, RunReport, error_record
from fedproto.plugin import RunPlan

__all__ = [
    "_agreement",
    "_compile_cache",
    "_end_start_up",
    "_dataset",
    "_failing_party",
    "_frame_limit",
    "_json_ready",
    "_log",
    "_model_options",
    "_names",
    "_one_line",
    "_options",
    "_pause_collector_for_start_up",
    "_resolved_options",
    "_single_leaf",
    "_split_parts",
    "_timestamp",
    "_unfinished_report",
    "local_session",
]

#: The command line's logger (every ``_cli_*`` module logs under the same name).
_log = logging.getLogger("fedproto.cli")
#: Whether :func:`_pause_collector_for_start_up` paused the collector and the start-up goes on.
_start_up_paused = False


def _pause_collector_for_start_up() -> None:
    """Pause Python's cyclic garbage collector while a ``fedproto`` process starts: its imports
    (JAX, the protocol, rich), the parser, the data and the plan make objects that live as long as
    the process, and collecting among them found nothing but cost a run about 0.1-0.2 s of CPU
    (some 300 collections, two or three full ones; ``benchmarks/startup.py``). Only for a process
    that is the command line (never a library caller's): :func:`_end_start_up` ends the pause.
    Nothing if the collector is already off. A process forked during the pause (the fork
    server's zygote, and through it the parties) inherits it, and a party ends it as a run does."""
    global _start_up_paused
    if gc.isenabled():
        gc.disable()
        _start_up_paused = True


def _end_start_up() -> None:
    """End :func:`_pause_collector_for_start_up`'s pause, before the run: what exists now moves to
    the collector's permanent generation (:func:`gc.freeze`; full collections never walk it
    again) and the collector runs again. Idempotent; nothing where no pause is on."""
    global _start_up_paused
    if _start_up_paused:
        _start_up_paused = False
        gc.freeze()
        gc.enable()


def _agreement(
    args: argparse.Namespace,
    parties: Sequence[str],
    *,
    topology: str | None,
    session: int | None,
    own_data: Dataset | None = None,
    local_data: bool = False,
) -> Agreement:
    """What this process runs, for the other parties to compare (:mod:`fedproto.agreement`):
    every parsed option but the party-local ones (``--data`` too when each party holds its own),
    with ``--k`` left unset recorded as the k of the party's own file where it states one (the
    k the plugins then use)."""
    options = {k: v for k, v in vars(args).items() if k not in _INTERNAL_KEYS and k != "protocol"}
    if options.get("k", 0) is None and own_data is not None and own_data.paper_k is not None:
        options["k"] = int(own_data.paper_k)
    local = PARTY_LOCAL_OPTIONS | ({"data"} if local_data else set())
    return Agreement.of_options(
        args.protocol_name, options, parties, local=local, spelling=getattr(args, "option_spelling", None),
        topology=topology, session=session,
    )


def local_session(args: argparse.Namespace, parties: Sequence[str], agreement: Agreement | None = None) -> int:
    """The session id of a run whose parties each hold only their own data and whose roster
    fixes none: derived from the protocol, the roster and the options every party must agree on
    (``agreement``, without a session; without it, from ``--seed`` alone), so parties started
    with other options are in other sessions."""
    if agreement is None:
        return session_id(args.protocol_name, tuple(parties), args.seed)
    return session_id(args.protocol_name, tuple(parties), agreement.digest().hex())


def _unfinished_report(
    meter: Meter, exc: BaseException, *, reporter: str | None, stopped_by: str | None = None, **fields: Any
) -> RunReport:
    """The report of a run, or of one party's share of a run, that ended early.

    Everything ``meter`` counted until ``exc`` ended the run, with ``status`` ``"interrupted"``
    (a signal: ``stopped_by``, or SIGINT for a ``KeyboardInterrupt``) or ``"failed"``, and the
    ``error`` that :func:`fedproto.metering.error_record` makes of ``exc`` (of an
    :class:`~fedproto._interrupt.Interrupted` for a signal: ``exc`` itself when it is one, whose
    message is kept); ``results`` empty.

    Args:
        meter: the run's counters. Call its :meth:`~fedproto.metering.Meter.finish` where the
            run ended (inside Trio for a Trio clock): its wall time ends there.
        exc: the exception that ended the run.
        reporter: the party whose process saw ``exc`` (``None`` for an interrupt, which no party
            reports).
        stopped_by: ``"SIGINT"`` or ``"SIGTERM"`` when a signal ended the run.
        **fields: :meth:`~fedproto.metering.Meter.report`'s keyword arguments (``protocol``,
            ``transport``, ``session``, ``parties``, ...).

    Returns:
        The report, ``status`` ``"failed"`` or ``"interrupted"``.
    """
    if stopped_by is None and isinstance(exc, KeyboardInterrupt):
        stopped_by = "SIGINT"
    if stopped_by is not None and not isinstance(exc, Interrupted):
        exc = Interrupted(signal.Signals[stopped_by])  # the same error type whatever was stopped
    report = meter.report(**fields)
    return dataclasses.replace(
        report,
        status="interrupted" if stopped_by else "failed",
        error=error_record(exc, reporter=None if stopped_by else reporter, signal=stopped_by),
    )


def _failing_party(machines: Mapping[str, Any], exc: BaseException) -> str | None:
    """The party of an in-process run whose process saw ``exc``: the one whose machine failed with
    it (the runtime and the lean engine raise a machine's own error), else the party a
    :class:`~fedproto.errors.LocalProtocolError` names (a message its machine could not encode),
    else ``None``."""
    for party, machine in machines.items():
        if machine.error is exc:
            return party
    return exc.party if isinstance(exc, LocalProtocolError) else None


def _frame_limit(plan: RunPlan, args: argparse.Namespace) -> int:
    """The frame limit in force for every party: ``--max-frame-bytes``, lowered to the largest
    frame the plan's protocol sends (:attr:`RunPlan.max_frame_bytes`) where the plan states one,
    but never below the runtime's own abort notice for this roster."""
    if plan.max_frame_bytes is None:
        return args.max_frame_bytes
    needed = max(plan.max_frame_bytes, abort_notice_frame_bytes(plan.roster))
    return min(args.max_frame_bytes, needed)


def _names(parties: Sequence[str], shown: int = 4) -> str:
    """A few party names for a message (a roster may hold thousands)."""
    head = ", ".join(parties[:shown])
    return head if len(parties) <= shown else f"{head}, ... ({len(parties)} in all)"


def _json_ready(value: Any) -> Any:
    """An option value as JSON data (paths and other objects as strings)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_ready(v) for k, v in value.items()}
    return str(value)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """Every option of the run by its destination (the CLI's bookkeeping left out)."""
    return {k: _json_ready(v) for k, v in sorted(vars(args).items()) if k not in _INTERNAL_KEYS}


def _model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The link model's resolved parameters for the report's options (none without a model)."""
    model = getattr(args, "network_model", None)
    return {} if model is None else {"network_model": model.to_dict()}


def _timestamp(seconds: float) -> str:
    return RunReport.timestamp(datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc))


def _dataset(plugin: Any, args: argparse.Namespace) -> Any:
    """The run's data: ``None`` for a plugin with ``needs_data = False``; a set the plugin
    generates by name (``plugin.generated_datasets``, e.g. a paper's synthetic Gaussian mixture,
    built from ``--seed``); else :func:`load_dataset`."""
    if not getattr(plugin, "needs_data", True):
        return None
    generators = getattr(plugin, "generated_datasets", None) or {}
    if args.data in generators:
        return generators[args.data](args.seed)
    return load_dataset(args.data)


def _resolved_options(plugin: Any, args: argparse.Namespace, dataset: Any) -> list[str]:
    """The plugin's ``resolved_options`` tokens (options whose default depends on the whole data
    set, spelt out for parties that hold only their own), as strings; ``[]`` without the method."""
    resolve = getattr(plugin, "resolved_options", None)
    return [] if resolve is None else [str(token) for token in resolve(args, dataset)]


def _split_parts(plugin: Any, args: argparse.Namespace, dataset: Any, roster: Sequence[str]) -> dict[str, Any]:
    """``plugin.split(args, dataset)``, checked: parties of ``roster``, each a non-empty 2-D set."""
    parts = dict(plugin.split(args, dataset))
    unknown = [p for p in parts if p not in roster]
    if unknown:
        raise ValueError(f"the plugin split data for parties outside its roster: {_names(unknown)}")
    for party, part in parts.items():
        if not isinstance(part, Dataset) or part.x.ndim != 2 or part.n == 0:
            raise ValueError(f"the plugin's split gave {party} no data (every data-holding party needs a point)")
    return parts


def _compile_cache(args: argparse.Namespace) -> None:
    """JAX's persistent compilation cache for this run unless ``--no-compile-cache`` (a cache
    directory that cannot be made only costs the speed-up: one line on the log, no failure);
    ``--no-compile-cache`` also turns off the on-disk memo of calibrations (:mod:`fedproto.memo`)."""
    if args.no_compile_cache:
        memo.set_enabled(False)
        return
    try:
        directory = enable_compile_cache()
    except (OSError, RuntimeError) as exc:  # RuntimeError: no home directory to put it in
        _log.warning("compile cache off: %s", exc)
        return
    _log.info("compiled kernels cached in %s", directory)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _single_leaf(group: BaseExceptionGroup) -> BaseException | None:
    """The one exception inside nested single-member groups, else ``None``."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        if len(exc.exceptions) != 1:
            return None
        exc = exc.exceptions[0]
    return exc

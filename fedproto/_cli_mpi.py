"""``fedproto run`` under ``mpiexec``: one party per rank (``--transport mpi``, every rank's
report merged at rank 0), or the lean engine's one simulation spread over the ranks
(``--engine lean`` with more than one rank: :class:`fedproto.shards.Shards`). mpi4py is imported
only when a run needs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from fedproto import registry
from fedproto._cli_parser import _QuietExit
from fedproto._cli_shared import _agreement, _failing_party, _frame_limit, _single_leaf, _unfinished_report
from fedproto._interrupt import signal_name
from fedproto.errors import AgreementMismatch, FedProtoError
from fedproto.metering import Meter, RunReport
from fedproto.plugin import RunPlan
from fedproto.runtime import RuntimeConfig, run_party

__all__ = [
    "_abort_ranks",
    "_check_mpi_installed",
    "_mpi_rank_from_environment",
    "_mpi_size_from_environment",
    "_run_mpi",
    "_sharded_outcome",
    "_shards",
]


def _mpi_size_from_environment() -> int:
    """The number of MPI ranks the launcher announces (1 when not under mpiexec or srun), read
    without initialising MPI."""
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 1


def _mpi_rank_from_environment() -> int:
    """This process's MPI rank as the launcher announces it (0 when not under mpiexec), read
    without initialising MPI."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def _check_mpi_installed() -> None:
    """Fail before any work when mpi4py is missing, saying how to install it."""
    try:
        import mpi4py  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "the MPI transport needs mpi4py and an MPI library: pip install 'fedproto[mpi]', "
            "then start the run with mpiexec -n <parties>"
        ) from exc


def _shards(plan: RunPlan, args: argparse.Namespace) -> Any:
    """The lean engine's placement over MPI ranks when ``fedproto run`` runs under ``mpiexec -n R``
    with R > 1 (``None`` in one process): ``--placement`` (``blocks``, the default, or
    ``coordinator-alone``, or a JSON file ``{party: rank}``)."""
    if _mpi_size_from_environment() <= 1:
        return None
    from mpi4py import MPI

    from fedproto.shards import Shards

    comm = MPI.COMM_WORLD
    choice = getattr(args, "placement", None) or "blocks"
    placement = None
    if choice == "coordinator-alone" and comm.Get_size() > 1:
        clients, others = plan.roster[1:], comm.Get_size() - 1
        placement = {plan.roster[0]: 0, **{p: 1 + j * others // len(clients) for j, p in enumerate(clients)}}
    elif choice not in ("blocks", "coordinator-alone"):
        placement = _read_placement(choice, plan.roster)
    return Shards(plan.roster, comm, placement=placement)


def _abort_ranks(shards: Any, exc: BaseException) -> None:
    """End every rank of a sharded run from this one, which failed where the others cannot hear
    of it (before the run's first exchange): one line naming the rank, then ``MPI_Abort`` (MPICH
    adds its own line, and ``mpiexec`` exits non-zero)."""
    print(f"fedproto: error: rank {shards.rank}: {' '.join(str(exc).split()) or type(exc).__name__}",
          file=sys.stderr, flush=True)
    shards.abort(1)


def _read_placement(path: str, roster: Sequence[str]) -> dict[str, int]:
    """A placement file: a JSON object ``{party: rank}`` naming every party."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--placement {path}: not a JSON placement file ({exc})") from None
    if not isinstance(data, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in data.values()):
        raise ValueError(f"--placement {path}: expected a JSON object {{party: rank}} with integer ranks")
    return data


def _sharded_outcome(
    shards: Any, plan: RunPlan, machines: Mapping[str, Any], meter: Meter, as_json: dict[str, Any],
    error: BaseException | None, fields: dict[str, Any], received: Sequence[int],
) -> tuple[dict[str, Any], RunReport, BaseException | None]:
    """Rank 0's view of a sharded lean run: every rank's results gathered in roster order, the
    report from the gathered meter (``ranks`` included), the error as the rank that saw it
    recorded it. Other ranks raise :class:`_QuietExit` (0, 1 after a failure, 130 or 143 after a
    signal): rank 0 speaks. A signal reaches every rank (``mpiexec`` passes it on), each at its
    own point of the run, so nothing more is exchanged then: rank 0 reports what it metered."""
    from fedproto.shards import ShardFailed

    if isinstance(error, KeyboardInterrupt):
        stopped_by = signal_name(received[0]) if received else "SIGINT"
        if shards.rank != 0:
            raise _QuietExit(143 if stopped_by == "SIGTERM" else 130)
        return {}, _unfinished_report(meter, error, reporter=None, stopped_by=stopped_by, **fields), error
    blobs = shards.gather(json.dumps(as_json if error is None else {}).encode())
    if blobs is None:
        raise _QuietExit(0 if error is None else 1)
    if error is None:
        gathered: dict[str, Any] = {}
        for blob in blobs:
            gathered.update(json.loads(blob))
        return {p: gathered[p] for p in plan.roster if p in gathered}, meter.report(**fields), None
    report = _unfinished_report(meter, error, reporter=_failing_party(machines, error), **fields)
    if isinstance(error, ShardFailed):
        report = dataclasses.replace(report, error=dict(error.record))
    return {}, report, error


def _party_json(plan: RunPlan, party: str, result: Any, report: RunReport) -> dict[str, Any]:
    return {"party": party, "result": plan.result_to_json(party, result), "report": report.to_dict()}


def _run_mpi(
    plan: RunPlan, args: argparse.Namespace, received: Sequence[int] = ()
) -> tuple[dict[str, Any], RunReport, BaseException | None] | None:
    """Run this rank's party; every rank's report (up to its failure or interruption, if it did
    not complete) is gathered at rank 0 and merged.

    An interrupt reaches every rank at once (``mpiexec`` passes SIGINT and SIGTERM on to all of
    them), so each rank stops its party, and the ranks still meet in the gather: the merged report
    is ``interrupted``.

    Returns:
        At rank 0, ``(results as JSON, merged report, error)``: ``error`` is ``None`` when every
        rank completed; the ``KeyboardInterrupt`` when a signal stopped the run (the report
        ``interrupted`` by the first signal in ``received``, else SIGINT); else one naming the
        failed party (one that failed on its own rather than one told of a failure), with
        ``results`` empty and the report ``failed``. ``None`` at the other ranks.

    Raises:
        _QuietExit: at a rank other than 0 whose party failed or was interrupted (rank 0
            reports it).
    """
    agreement = _agreement(args, plan.roster, topology=None, session=plan.session)
    network = registry.load_transport("mpi")(max_frame_bytes=_frame_limit(plan, args), agreement=agreement)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.Get_size() != len(plan.roster):
        if comm.Get_rank() != 0:
            raise _QuietExit(1)  # rank 0 says why, once
        raise ValueError(
            f"this run has {len(plan.roster)} parties; start it with mpiexec -n {len(plan.roster)} "
            f"(got {comm.Get_size()} ranks)"
        )
    party = plan.roster[comm.Get_rank()]
    config = RuntimeConfig(session=plan.session, deadline_s=args.deadline, max_frame_bytes=_frame_limit(plan, args))
    meter = Meter(trio.current_time, trace_compute=args.compute_trace)
    error: BaseException | None = None

    async def go() -> Any:
        async with network.endpoints(plan.roster) as endpoints:
            try:
                return await run_party(plan.make_machine(party), endpoints[party], config=config, meter=meter)
            except BaseException:
                meter.finish()  # run_party marks the end only of a run that completes
                raise

    interrupt: KeyboardInterrupt | None = None
    try:
        result = trio.run(go)
    except KeyboardInterrupt as exc:
        interrupt = exc
    except (FedProtoError, ValueError) as exc:
        error = exc
    except BaseExceptionGroup as group:
        leaf = _single_leaf(group)
        if isinstance(leaf, KeyboardInterrupt):
            interrupt = leaf
        elif isinstance(leaf, FedProtoError | ValueError):
            error = leaf
        else:
            raise
    fields = dict(protocol=args.protocol_name, transport="mpi", session=plan.session, parties=plan.roster)
    stopped_by = signal_name(received[0]) if received else "SIGINT"
    if interrupt is not None:
        report = _unfinished_report(meter, interrupt, reporter=party, stopped_by=stopped_by, **fields)
        doc = {"party": party, "interrupted": stopped_by, "report": report.to_dict()}
    elif error is None:
        doc = _party_json(plan, party, result, meter.report(**fields))
    else:
        report = _unfinished_report(meter, error, reporter=party, **fields)
        doc = {"party": party, "error": str(error), "report": report.to_dict()}
    from fedproto.shards import gather_bytes

    docs = gather_bytes(comm, json.dumps(doc).encode())
    if docs is None:
        if interrupt is not None:
            raise _QuietExit(143 if stopped_by == "SIGTERM" else 130)  # rank 0 says so, once
        if error:
            raise _QuietExit(1)  # rank 0 reports every rank's error
        return None
    parsed = [json.loads(d) for d in docs]
    if any("interrupted" in d for d in parsed):
        # A party that completed before the signal came still counts what it metered.
        report = RunReport.merge([RunReport.from_dict(d["report"]) for d in parsed], transport="mpi")
        return {}, report, interrupt if interrupt is not None else KeyboardInterrupt()
    errors = [d for d in parsed if "error" in d]
    reports = [RunReport.from_dict(d["report"]) for d in parsed]
    if not errors:
        report = RunReport.merge(reports, transport="mpi")
        return {d["party"]: d["result"] for d in parsed}, report, None
    # The merged error is the first failed report's: a party that failed on its own goes before
    # those it told (RunAborted), whatever their ranks.
    def told(r: RunReport) -> bool:
        return r.error is None or r.error["type"] == "RunAborted"

    report = RunReport.merge(sorted(reports, key=told), transport="mpi")
    if isinstance(error, AgreementMismatch):
        return {}, report, error  # this rank's own line names the option and the party
    first = next((d for d, r in zip(parsed, reports) if "error" in d and not told(r)), errors[0])
    return {}, report, FedProtoError(f"party {first['party']} failed: {first['error']}", party=first["party"])

"""``fedproto run --transport tcp`` (every party its own process on loopback, their reports
merged) and ``fedproto party`` (one party of a TCP run, on any host, from its kit's roster).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

from fedproto import registry
from fedproto._cli_checks import _check_options
from fedproto._cli_parser import _GLOBAL_WITH_VALUE, _LAUNCHER_OPTIONS, _WHOLE_DATA_OPTIONS, _without_options
from fedproto._cli_parser import holds_local_data
from fedproto._cli_shared import _agreement, _compile_cache, _dataset, _frame_limit, _log, _names, _options
from fedproto._cli_shared import _resolved_options, _single_leaf, _split_parts, _timestamp, _unfinished_report
from fedproto._cli_shared import _end_start_up, local_session
from fedproto._fork_server import ForkServer
from fedproto._interrupt import Interrupted, SignalGuard, exit_by_signal, signal_name, write_json
from fedproto._launch_dir import launch_directory, private_file
from fedproto.agreement import Agreement
from fedproto.compilation import select_device
from fedproto.data import load_dataset, save_dataset
from fedproto.launcher import LaunchError, LaunchInterrupted, discard_launched_kit, launch_local
from fedproto.metering import Meter, RunReport, error_record
from fedproto.plugin import RunPlan
from fedproto.progress import progress_task
from fedproto.roster import Roster
from fedproto.runtime import RuntimeConfig, run_party

__all__ = ["_command_party", "_failed_tcp_report", "_party_fork_server", "_run_tcp_launcher"]


def _child_argv(argv: Sequence[str], spec: str, strip: Mapping[str, bool] = _LAUNCHER_OPTIONS) -> list[str]:
    """The ``party`` command line of a TCP party: ``run`` becomes ``party``, the protocol spec is
    one any working directory can load, and the options in ``strip`` (``{option: takes a
    value}``: the launcher's own, and the whole data set's where each party gets its own file)
    are left out."""
    out: list[str] = []
    tokens = iter(argv)
    for token in tokens:
        if token in _GLOBAL_WITH_VALUE:
            out += [token, next(tokens, "")]
        elif token == "run":
            out.append("party")
            if next(tokens, None) is not None:  # the protocol spec as the user gave it
                out.append(spec)
            return out + _without_options(tokens, strip)
        else:
            out.append(token)
    return out


@contextmanager
def _party_fork_server(args: argparse.Namespace, *, zygote: bool) -> Iterator[None]:
    """With ``--transport tcp``, a fork server for the parties while inside, as ``args.fork_server``
    (:mod:`fedproto._fork_server`): this very process forked (``zygote``, where safe: before any
    data, key or thread), else a fresh interpreter. ``FEDPROTO_FORK_SERVER=0``, another system or
    a server that failed to start: ``None``, and every party is a fresh interpreter."""
    server = None
    run_tcp = args.command == "run" and getattr(args, "transport", None) == "tcp"
    if run_tcp and os.environ.get("FEDPROTO_FORK_SERVER", "1") != "0":
        try:
            server = ForkServer.start(zygote=zygote)
        except OSError as exc:
            _log.info("no fork server (%s): every party starts a fresh interpreter", exc)
    args.fork_server = server
    try:
        yield
    finally:
        if server is not None:
            server.close()


def _run_tcp_launcher(
    plan: RunPlan, args: argparse.Namespace, argv: Sequence[str], plugin: Any, dataset: Any
) -> tuple[dict[str, Any], RunReport]:
    """Run every party as its own process over TCP and merge their reports.

    Raises:
        LaunchError: a party failed or the run timed out; LaunchInterrupted: SIGINT/SIGTERM. With
            ``--report``, the run's report (``failed`` or ``interrupted``, merged from the party
            reports that exist: :func:`_failed_tcp_report`) is written first and the message
            says where.
    """
    started_s = time.time()
    local = holds_local_data(plugin)
    strip = {**_LAUNCHER_OPTIONS, **_WHOLE_DATA_OPTIONS} if local else _LAUNCHER_OPTIONS
    base = _child_argv(argv, registry.resolve_protocol_spec(args.protocol), strip)
    # A private directory (0700) for the parties' reports; the launcher makes its own for the
    # kits. Both are removed at the end, and a later run removes them if this one is killed.
    with launch_directory() as tmp:
        parts: dict[str, Any] = {}
        if local:
            # Each party process gets only its own part, as on separate machines.
            base += _resolved_options(plugin, args, dataset)
            parts = _split_parts(plugin, args, dataset, plan.roster)

        def command(party: str, roster_path: Path, listen_fd: int | None) -> list[str]:
            listen = [] if listen_fd is None else ["--listen-fd", str(listen_fd)]
            own_data = []
            if party in parts:
                # Beside its kit, which the party removes (data part included) once loaded.
                data_path = private_file(roster_path.parent / "data.npz")
                own_data = ["--data", str(save_dataset(data_path, parts[party]))]
            return [
                sys.executable, "-m", "fedproto", *base, *own_data, "--party", party,
                "--roster", str(roster_path), *listen, "--party-report", str(tmp / f"{party}.json"),
            ]

        timeout_s = args.deadline * (plan.iterations + 6) + 120
        topology = args.topology = args.topology or "star"  # the report's options say which ran
        description = f"{len(plan.roster)} parties running as separate processes over TCP ({topology})"
        with progress_task(description):
            try:
                outcomes = launch_local(
                    plan.roster, command, timeout_s=timeout_s, session=plan.session, topology=topology,
                    fork_server=getattr(args, "fork_server", None),
                )
            except (LaunchError, LaunchInterrupted) as exc:
                if isinstance(exc, LaunchError):
                    _forward_party_logs(exc.outcomes)
                if not args.report:
                    raise
                report = dataclasses.replace(
                    _failed_tcp_report(plan, args, exc, Path(tmp)),
                    options={**_options(args), "max_frame_bytes_in_force": _frame_limit(plan, args)},
                    command=("fedproto", *argv),
                    started_at=_timestamp(started_s),
                    finished_at=_timestamp(time.time()),
                )
                report.to_json(args.report)
                note = f"; report written to {args.report}"
                if isinstance(exc, LaunchInterrupted):
                    raise LaunchInterrupted(exc.signum, note=note) from None
                raise LaunchError(
                    f"{exc}{note}", outcomes=exc.outcomes, party=exc.party, timed_out=exc.timed_out
                ) from None
        _forward_party_logs(outcomes)
        docs = {p: json.loads((Path(tmp) / f"{p}.json").read_text()) for p in plan.roster}
    reports = [RunReport.from_dict(doc["report"]) for doc in docs.values()]
    report = RunReport.merge(reports, transport="tcp")
    return {p: doc["result"] for p, doc in docs.items()}, report


def _failed_tcp_report(
    plan: RunPlan, args: argparse.Namespace, exc: LaunchError | LaunchInterrupted, directory: Path
) -> RunReport:
    """The report of a TCP run that failed or was interrupted, from the party reports in
    ``directory`` (``PARTY.json``, as ``fedproto party --party-report`` writes them).

    The reports that exist are merged (:meth:`RunReport.merge`), the failing party's first, so
    the counters hold what every reporting party metered up to its end. A failed launch is
    ``failed`` with the failing party's own error when its report has one, else another party's
    failure, else the launcher's (a party killed, a timeout); an interrupted launch is
    ``interrupted`` with the signal the launcher received. Parties whose report is missing or
    unreadable (killed, crashed before their run) are named in the error's message.
    """
    docs: dict[str, RunReport] = {}
    missing: list[str] = []
    for party in plan.roster:
        try:
            docs[party] = RunReport.from_dict(json.loads((directory / f"{party}.json").read_text())["report"])
        except (OSError, ValueError, KeyError, TypeError):
            missing.append(party)
    first = exc.party if isinstance(exc, LaunchError) else None
    order = sorted(docs, key=lambda p: p != first)  # stable: roster order after the failing party
    if order:
        report = RunReport.merge([docs[p] for p in order], transport="tcp")
    else:
        report = Meter().report(
            protocol=args.protocol_name, transport="tcp", session=plan.session, parties=plan.roster
        )
    if isinstance(exc, LaunchInterrupted):
        stopped = Interrupted(exc.signum, str(exc))
        status, error = "interrupted", error_record(stopped, signal=stopped.signal_name)
    elif first in docs and docs[first].status == "failed":
        status, error = "failed", dict(docs[first].error or {})
    elif report.status == "failed":
        status, error = "failed", dict(report.error or {})
    else:
        status, error = "failed", error_record(exc)
    if missing:
        outcomes = exc.outcomes if isinstance(exc, LaunchError) else {}
        last = {
            p: o.last_line().removeprefix("fedproto: error: ").removeprefix("fedproto: ") for p, o in outcomes.items()
        }
        named = [f"{p} ({last[p]})" if p in last else p for p in missing]
        error["message"] = f"{error['message']}; no party report from {', '.join(named)}"
    return dataclasses.replace(report, status=status, error=error)


def _forward_party_logs(outcomes: Mapping[str, Any]) -> None:
    """With logging on (``-v``/``--log-level``), copy every party's stderr to ours, prefixed with
    its name; otherwise a party's stderr only reaches the user through a failure's message."""
    if not logging.getLogger("fedproto").isEnabledFor(logging.INFO):
        return
    for party, outcome in outcomes.items():
        for line in outcome.stderr.splitlines():
            if line.strip():
                print(f"[{party}] {line}", file=sys.stderr)


def _party_roster(args: argparse.Namespace) -> Roster:
    """The party's roster file, checked to hold what ``--insecure-shared-secret`` (or its absence)
    needs: its TLS material by default, a secret with the option."""
    roster = Roster.load(args.roster)
    if args.insecure_shared_secret:
        if roster.secret is None:
            raise ValueError(
                f"roster {args.roster} has no secret for --insecure-shared-secret "
                "(it holds a TLS kit: leave the option out)"
            )
    elif roster.tls is None:
        raise ValueError(
            f"roster {args.roster} has no TLS material (make one kit per party with fedproto provision); to use its "
            "shared secret instead, which is insecure, pass --insecure-shared-secret"
        )
    else:
        from fedproto.provision import certificate_party

        try:
            named = certificate_party(roster.tls.cert.read_bytes())
        except OSError as exc:
            raise ValueError(f"cannot read the certificate {roster.tls.cert}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ValueError(f"the certificate {roster.tls.cert}: {exc}") from None
        if named != args.party:
            raise ValueError(
                f"roster {args.roster} is the kit of {named} (its certificate names {named!r}), "
                f"not of --party {args.party}"
            )
    return roster


def _run_party_tcp(
    plan: RunPlan, args: argparse.Namespace, roster: Roster | None = None, agreement: Agreement | None = None
) -> int:
    """Run this process's party of a TCP run and leave its party report however the run ends.

    Completed: the report (and result) go to ``--party-report``, else a summary line to stdout;
    exit 0. Failed: the report says ``failed`` with the error, which is raised again (the CLI's
    one error line, exit 1). SIGINT/SIGTERM: the run is cancelled, its endpoint closed (pending
    refusal counts are logged), the report says ``interrupted``, one line names the signal and the
    file, and the process ends as the signal asks (killed by SIGTERM; 130 for SIGINT). Every
    report holds what was metered up to the end, the endpoint's connection bytes included.
    """
    meter = Meter(trio.current_time, trace_compute=args.compute_trace)
    hosted: dict[str, Any] = {}
    result: Any = None
    failure: Exception | None = None
    interrupted = False
    with SignalGuard() as guard:
        try:
            result = _serve_party_tcp(plan, args, roster, meter, hosted, guard, agreement)
        except Interrupted:
            interrupted = True  # guard.signum says by which signal
        except Exception as exc:  # recorded in the report, then raised again
            failure = exc
        guard.hold()
        endpoint = hosted.get(args.party)
        if endpoint is not None:  # closed by now (or never served): its counts are final
            meter.record_connection_bytes(
                handshake_bytes=getattr(endpoint, "handshake_bytes", 0),
                tls_overhead_bytes=getattr(endpoint, "tls_overhead_bytes", 0),
                relay_overhead_bytes=getattr(endpoint, "relay_overhead_bytes", 0),
                resumption_overhead_bytes=getattr(endpoint, "resumption_overhead_bytes", 0),
                refused_bytes=getattr(endpoint, "refused_bytes", 0),
            )
        fields = dict(protocol=args.protocol_name, transport="tcp", session=plan.session, parties=plan.roster)
        if failure is not None:
            leaf = _single_leaf(failure) if isinstance(failure, BaseExceptionGroup) else failure
            report = _unfinished_report(meter, leaf or failure, reporter=args.party, **fields)
        elif interrupted:
            signum = guard.signum or signal.SIGTERM
            stopped = Interrupted(signum, f"{args.party} interrupted by {signal_name(signum)}")
            report = _unfinished_report(meter, stopped, reporter=args.party, stopped_by=stopped.signal_name, **fields)
        else:
            report = meter.report(**fields)
        completed = report.status == "completed"
        doc = {
            "party": args.party,
            "result": plan.result_to_json(args.party, result) if completed else None,
            "report": report.to_dict(),
        }
        if args.party_report:
            write_json(args.party_report, doc)
        elif completed:
            print(json.dumps({"party": args.party, "result": doc["result"], "payload_bytes": report.payload_bytes}))
        if failure is not None:
            raise failure
        # A signal that came after this party's own run completed (a hub lingering for its
        # clients) or while the record was written still ends the process, with the same line.
        signum = guard.signum
        if signum is not None:
            written = f"; party report written to {args.party_report}" if args.party_report else ""
            print(f"fedproto: {args.party} interrupted by {signal_name(signum)}{written}", file=sys.stderr)
    if signum is not None:
        return exit_by_signal(signum)
    return 0


def _serve_party_tcp(
    plan: RunPlan, args: argparse.Namespace, roster: Roster | None, meter: Meter, hosted: dict[str, Any],
    guard: SignalGuard, agreement: Agreement | None = None,
) -> Any:
    """Build this party's machine and endpoint and run it; the endpoint is put in ``hosted`` so
    its byte counts can be read after it closed, however the run ends.

    Returns:
        The party's result, also when a signal came after it (while a hub lingered for its
        clients: the run of this party had completed).

    Raises:
        Interrupted: a signal arrived before the party's run completed (before the event loop,
            or during it: the run was cancelled).
    """
    if roster is None:
        roster = _party_roster(args)
    roster.check_matches(plan.roster, plan.session, source=f"roster {args.roster}")
    if args.party not in plan.roster:
        raise ValueError(f"--party {args.party!r} is not in the roster {list(plan.roster)}")
    listen_fds = {args.party: args.listen_fd} if args.listen_fd is not None else None
    limit = _frame_limit(plan, args)
    tcp = registry.load_transport("tcp")

    # A client gives up on a hub it has not heard from for one deadline (the protocols' clients
    # would wait two), hearing it at least every quarter deadline (the star's keep-alive); a peer
    # that never answers a dial is given up on after one deadline too.
    network = tcp.from_roster(
        roster, listen_fds=listen_fds, session=plan.session, max_frame_bytes=limit,
        insecure_shared_secret=args.insecure_shared_secret, agreement=agreement,
        resume_timeout_s=args.deadline, keepalive_s=min(tcp.default_keepalive_s, args.deadline / 4),
        connect_timeout_s=args.deadline,
    )
    machine = plan.make_machine(args.party)
    config = RuntimeConfig(session=plan.session, deadline_s=args.deadline, max_frame_bytes=limit, record_received=True)

    done: dict[str, Any] = {}

    async def body() -> None:
        async with network.endpoints(plan.roster, [args.party]) as endpoints:
            hosted.update(endpoints)
            # Everything of a launched kit is in memory now (the TLS contexts, the data):
            # give it up (only where the launcher said it is a throwaway one).
            discard_launched_kit(args.roster)
            try:
                done["result"] = await run_party(machine, endpoints[args.party], config=config, meter=meter)
            finally:
                if meter.started_s is not None and meter.finished_s is None:
                    meter.finish()  # the run ended early: its wall time runs to here

    trio.run(guard.run, body)
    if "result" not in done:  # cancelled by a signal (an error would have been raised)
        raise Interrupted(guard.signum or signal.SIGTERM)
    return done["result"]


def _command_party(args: argparse.Namespace) -> int:
    plugin = registry.load_protocol(args.protocol)
    _check_options(args, registry.load_transport("tcp"))
    roster = _party_roster(args)  # before any work: a roster without TLS material is refused at once
    if args.party not in roster.parties:
        raise ValueError(f"--party {args.party!r} is not in the roster {args.roster} ({_names(roster.parties)})")
    select_device(args.device)
    _compile_cache(args)
    if holds_local_data(plugin):
        data = load_dataset(args.data) if args.data is not None else None
        options = _agreement(args, roster.parties, topology=roster.topology, session=None, own_data=data,
                             local_data=True)
        # The roster's session, when it states one, is the run's (a launcher's roster carries the
        # simulation's, so that the run is the simulation's byte for byte); parties started with
        # other options are then told apart by the agreement, in the handshake.
        session = roster.session if roster.session is not None else local_session(args, roster.parties, options)
        plan = plugin.plan_party(args, args.party, tuple(roster.parties), session, data)
    else:
        plan = plugin.plan(args, _dataset(plugin, args))
        options = _agreement(args, plan.roster, topology=roster.topology, session=None)
    _end_start_up()  # the run starts: the collector runs again (see _pause_collector_for_start_up)
    return _run_party_tcp(plan, args, roster, dataclasses.replace(options, session=plan.session))

"""``fedproto run``: the run in this process (``--transport memory``: one trio task per party,
or the lean engine), over TCP or MPI through :mod:`fedproto._cli_tcp` and
:mod:`fedproto._cli_mpi`; dropouts injected; and what it prints and writes: the summary, the
costs, the report and the plot.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from fedproto import registry
from fedproto._cli_checks import _check_options, _load_transport
from fedproto._cli_mpi import _abort_ranks, _check_mpi_installed, _mpi_rank_from_environment, _run_mpi
from fedproto._cli_mpi import _sharded_outcome, _shards
from fedproto._cli_parser import UsageError, _did_you_mean, _Dropout
from fedproto._cli_shared import _compile_cache, _dataset, _end_start_up, _failing_party, _frame_limit
from fedproto._cli_shared import _model_options, _names
from fedproto._cli_shared import _options, _single_leaf, _timestamp, _unfinished_report
from fedproto._cli_tcp import _run_tcp_launcher
from fedproto._interrupt import Terminated, signal_name, sigterm_interrupts
from fedproto.compilation import select_device
from fedproto.metering import Meter, RunReport
from fedproto.plugin import RunPlan
from fedproto.progress import progress_display, progress_task
from fedproto.runtime import RuntimeConfig, run_parties

__all__ = ["_command_run", "_dropouts", "_print_run"]


def _dropouts(plan: RunPlan, args: argparse.Namespace) -> list[_Dropout]:
    """The parties told to drop out, in roster order: ``--dropout`` as given, and for every other
    client a draw at ``--dropout-rate`` (see ``docs/cli.md``).

    The draw uses ``random.Random("fedproto.dropout|<seed>")`` (a string seed is hashed with
    SHA-512, the same on every platform and Python 3 release); it visits the clients
    (``plan.roster[1:]``) in roster order and draws, for each, a uniform number, a stage uniformly
    from ``plan.dropout_stages`` and a round uniformly from ``[0, plan.iterations)``, whether the
    client drops or not, so a higher rate keeps every dropout of a lower one, at the same stage and
    round.

    Raises:
        UsageError: the plan declares no dropout stage, a ``--dropout`` names the first party of
            the roster, a party outside it, or a stage that is not one of the plan's phases.
    """
    requested: list[_Dropout] = args.dropout or []
    rate: float | None = args.dropout_rate
    if not requested and rate is None:
        return []
    prog = f"fedproto run {args.protocol}"
    flag = "--dropout" if requested else "--dropout-rate"
    if not plan.dropout_stages:
        reason = plan.dropout_unsupported or f"{args.protocol_name} declares no stage at which a party may drop out"
        raise UsageError(f"argument {flag}: {reason}", prog=prog)
    coordinator, clients = plan.roster[0], plan.roster[1:]
    chosen: dict[str, _Dropout] = {}
    for dropout in requested:
        if dropout.party == coordinator:
            raise UsageError(
                f"argument --dropout: {coordinator} is the coordinating party (the first of the roster) and "
                f"cannot drop out; the clients are {_names(clients)}",
                prog=prog,
            )
        if dropout.party not in plan.roster:
            hint = _did_you_mean(registry.suggest(dropout.party, clients))
            raise UsageError(
                f"argument --dropout: {dropout.party!r} is not a party of this run{hint} "
                f"(the clients are {_names(clients)})",
                prog=prog,
            )
        if plan.phases and dropout.stage not in plan.phases:
            hint = _did_you_mean(registry.suggest(dropout.stage, plan.phases))
            raise UsageError(
                f"argument --dropout: {dropout.stage!r} is not a phase of {args.protocol_name}{hint} "
                f"(it survives dropouts at {', '.join(plan.dropout_stages)})",
                prog=prog,
            )
        chosen[dropout.party] = dropout
    if rate is not None:
        rng = random.Random(f"fedproto.dropout|{args.seed}")
        stages = plan.dropout_stages
        rounds = max(plan.iterations, 1)
        for party in clients:
            drops = rng.random() < rate
            stage = stages[rng.randrange(len(stages))]
            round_idx = rng.randrange(rounds)
            if drops and party not in chosen:
                chosen[party] = _Dropout(party, stage, round_idx)
    return [chosen[p] for p in plan.roster if p in chosen]


def _run_memory(
    plan: RunPlan,
    args: argparse.Namespace,
    console: Any,
    dropouts: Sequence[_Dropout] = (),
    received: Sequence[int] = (),
) -> tuple[dict[str, Any], RunReport, BaseException | None]:
    """Run every party in this process (``--engine tasks`` or ``lean``).

    Returns:
        ``(results as JSON, report, error)``: ``error`` is ``None`` for a completed run, else the
        exception that ended it (a party's failure, or ``KeyboardInterrupt``), with ``results``
        empty and the report ``failed`` or ``interrupted`` (by the first signal in ``received``,
        else SIGINT), holding what was metered until then.
    """
    from fedproto.testing.faults import CrashPoint, Faults

    network_cls = registry.load_transport("memory")
    limit = _frame_limit(plan, args)
    if dropouts:
        # Each dropout crashes its party at the stage's first frame; the others hear of it at once
        # (report_drops), as the machines' PartyDropped handling expects.
        faults = Faults(seed=args.seed, crash_at={d.party: CrashPoint(d.stage, d.round_idx) for d in dropouts})
        network = network_cls(plan.roster, max_frame_bytes=limit, faults=faults, report_drops=True)
    else:
        network = network_cls(plan.roster, max_frame_bytes=limit)
    lean = getattr(args, "engine", "tasks") == "lean"
    shards = _shards(plan, args) if lean else None
    try:
        machines = {p: plan.make_machine(p) for p in (shards.local if shards is not None else plan.roster)}
    except Exception as exc:
        if shards is not None:
            _abort_ranks(shards, exc)  # the other ranks wait for this one in the run's first exchange
        raise
    config = RuntimeConfig(session=plan.session, deadline_s=args.deadline, max_frame_bytes=limit)
    meter = Meter(time.perf_counter) if lean else Meter(trio.current_time, trace_compute=args.compute_trace)
    coordinator = plan.roster[0]
    results: dict[str, Any] = {}
    error: BaseException | None = None
    with progress_task(f"{args.protocol_name} rounds", total=plan.iterations) as advance:
        rounds_done = 0

        def observer(party: str, round_idx: int, state: str) -> None:
            nonlocal rounds_done
            if party == coordinator and min(round_idx, plan.iterations) > rounds_done:
                advance(min(round_idx, plan.iterations) - rounds_done)
                rounds_done = min(round_idx, plan.iterations)

        async def go() -> dict[str, Any]:
            try:
                return await run_parties(machines, network, config=config, meter=meter, observer=observer)
            except BaseException:
                meter.finish()  # an interrupt leaves run_parties before it marks the end
                raise

        try:
            if lean:
                from fedproto.simulation import simulate

                try:
                    results = simulate(
                        machines, config=config, meter=meter, observer=observer,
                        network=getattr(args, "network_model", None), compute=getattr(args, "compute_model", None),
                        shards=shards,
                    )
                except BaseException:
                    meter.finish()
                    raise
            else:
                results = trio.run(go)
        except (Exception, KeyboardInterrupt, BaseExceptionGroup) as exc:
            leaf = _single_leaf(exc) if isinstance(exc, BaseExceptionGroup) else exc
            error = leaf if leaf is not None else exc
    fields = dict(protocol=args.protocol_name, transport="memory", session=plan.session, parties=plan.roster)
    as_json = {p: plan.result_to_json(p, r) for p, r in results.items()}
    if shards is not None:
        return _sharded_outcome(shards, plan, machines, meter, as_json, error, fields, received)
    if error is None:
        report = meter.report(**fields)
    else:
        stopped_by = signal_name(received[0]) if received and isinstance(error, KeyboardInterrupt) else None
        report = _unfinished_report(
            meter, error, reporter=_failing_party(machines, error), stopped_by=stopped_by, **fields
        )
        as_json = {}
    if dropouts:
        crashed = getattr(network, "crashed", {})
        report = dataclasses.replace(report, faults={"dropouts": [d.record(d.party in crashed) for d in dropouts]})
    # a party that dropped out has no result: the plan's summary gets the survivors'
    return as_json, report, error


def _label(plan: RunPlan, key: str) -> str:
    return plan.labels.get(key, key.replace("_", " "))


def _print_run(
    plan: RunPlan,
    args: argparse.Namespace,
    summary: dict[str, Any],
    report: RunReport,
    console: Any,
) -> None:
    from fedproto.report import plot_report, render_privacy, render_report, render_summary

    shown = {_label(plan, k): v for k, v in summary.items() if not isinstance(v, list | dict)}
    # the analytic costs beside the measured ones, in a table of their own so that a long
    # summary, shortened, never hides them
    costs = {_label(plan, k): v for k, v in plan.analytic.items()}
    if report.algorithm_rounds:
        per_iteration = (report.payload_bytes - report.setup_bytes) / report.algorithm_rounds
        costs["measured payload bytes per algorithm round (envelopes included)"] = per_iteration
    costs["largest frame accepted (bytes)"] = report.options.get("max_frame_bytes_in_force", args.max_frame_bytes)
    data_name = summary.get("data_set", getattr(args, "data", None))
    title = args.protocol_name if data_name is None else f"{args.protocol_name} on {data_name}"
    render_summary(console, title, shown, full=args.full)
    render_summary(console, "Cost: analytic and measured", costs, full=args.full)
    if report.paper:
        paper = {_label(plan, k): v for k, v in report.paper.items() if not isinstance(v, list | dict)}
        render_summary(console, "Figures from the paper", paper, full=args.full)
    if report.faults.get("dropouts"):
        dropped = {
            d["party"]: f"{d['stage']}, " + ("any round" if d["round_idx"] is None else f"round {d['round_idx']}")
            + ("" if d["crashed"] else " (not reached: did not drop)")
            for d in report.faults["dropouts"]
        }
        render_summary(console, "Dropouts injected", dropped, full=args.full)
    if report.privacy:
        render_privacy(console, report.privacy, full=args.full)
    if report.prediction:
        render_summary(console, "Predicted time (link model)", _prediction_rows(report, args), full=args.full)
    if report.ranks:
        rows = {
            f"rank {r['rank']}": f"{r['parties']:,} parties, peak RSS {r['peak_rss_mib']:,.0f} MiB, "
            f"{r['exchange_s']:.2f} s in exchanges"
            for r in report.ranks
        }
        render_summary(console, f"MPI ranks ({len(report.ranks)}, one lean simulation)", rows, full=args.full)
    if not args.quiet:
        render_report(console, report, plan.role_of, phases=plan.phases, full=args.full)
    if args.report:
        report.to_json(args.report)
        console.print(f"report written to {args.report}")
    default_plot = str(Path(args.report).with_suffix(".png")) if args.report else None
    plot_path = None if args.no_plot else args.plot or default_plot
    if plot_path:
        extra = (lambda ax: plan.plot_results(ax, summary)) if plan.plot_results else None
        plot_report(report, plot_path, phases=plan.phases, extra=extra)
        console.print(f"plot written to {plot_path}")
        if report.prediction:
            from fedproto.netmodel import plot_timeline

            timeline_path = Path(plot_path).with_suffix(".timeline" + Path(plot_path).suffix)
            plot_timeline(report.prediction, timeline_path, title=f"{args.protocol_name} over {args.network}")
            console.print(f"timeline written to {timeline_path}")


def _prediction_rows(report: RunReport, args: argparse.Namespace) -> dict[str, Any]:
    """The CLI's table of the link model's prediction: the whole run, then each round."""
    p = report.prediction
    model = report.options.get("network_model", {})
    rows: dict[str, Any] = {
        "network model": f"{model.get('name', args.network)} ({model.get('topology', 'star')})",
        "compute per handler": args.compute or "measured",
        "predicted wall time (s)": p["wall_time_s"],
        "network on the critical path (s)": p["network_s"],
        "compute on the critical path (s)": p["compute_s"],
        "network share": f"{p['network_share']:.1%}",
        "latency hops on the critical path": p["latency_hops"],
    }
    if p.get("timeout_wait_s"):
        rows["deadlines waited for (s)"] = p["timeout_wait_s"]
    if p.get("untraced_handlers") or p.get("unused_trace_figures"):
        # a trace of another run (other options, another roster): handlers without a figure cost
        # as measured here, and figures of handlers this run does not have stay unused
        rows["handlers not in the trace (measured here)"] = p["untraced_handlers"]
        rows["trace figures unused"] = p["unused_trace_figures"]
    for entry in p["rounds"]:
        rows[f"round {entry['round_idx']} (s, critical party)"] = (
            f"{entry['wall_time_s']:.6g} ({entry['critical_party']})"
        )
    return rows


def _command_run(args: argparse.Namespace, argv: Sequence[str], epilogue: list[str]) -> int:
    """``fedproto run``. A run that fails or is interrupted once its parties have started writes
    its ``--report`` too (``failed`` or ``interrupted``, no plot), says where in ``epilogue``
    (printed after the error line) and raises what ended it; SIGTERM acts as SIGINT meanwhile and
    ends in :class:`Terminated`."""
    from rich.console import Console

    plugin = registry.load_protocol(args.protocol)
    network_cls = _load_transport(args)
    _check_options(args, network_cls)
    if args.transport == "mpi":
        _check_mpi_installed()
    select_device(args.device)
    _compile_cache(args)
    started_s = time.time()
    console = Console()
    show_progress = not args.quiet and _mpi_rank_from_environment() == 0
    received: list[int] = []
    try:
        with sigterm_interrupts(received), progress_display(Console(stderr=True), enabled=show_progress):
            dataset = _dataset(plugin, args)
            plan = plugin.plan(args, dataset)
            _end_start_up()  # the run starts: the collector runs again (see _pause_collector_for_start_up)
            error: BaseException | None = None
            if args.transport == "memory":
                results, report, error = _run_memory(plan, args, console, _dropouts(plan, args), received)
            elif args.transport == "tcp":
                results, report = _run_tcp_launcher(plan, args, argv, plugin, dataset)
            elif args.transport == "mpi":
                outcome = _run_mpi(plan, args, received)
                if outcome is None:
                    return 0
                results, report, error = outcome
            else:
                raise ValueError(f"transport {args.transport!r} has no runner in this CLI")
            # the plan's summary is for whole results: a run that ended early has none
            summary = dict(plan.summarize(results)) if error is None else {}
        paper = summary.pop("paper") if isinstance(summary.get("paper"), dict) else {}
        privacy = summary.pop("privacy") if isinstance(summary.get("privacy"), dict) else report.privacy
        report = dataclasses.replace(
            report,
            results=summary,
            paper={**report.paper, **paper},
            privacy=privacy,
            options={**_options(args), "max_frame_bytes_in_force": _frame_limit(plan, args), **_model_options(args)},
            command=("fedproto", *argv),
            started_at=_timestamp(started_s),
            finished_at=_timestamp(time.time()),
        )
        if error is not None:
            if args.report:
                report.to_json(args.report)
                epilogue.append(f"report written to {args.report}")
            raise error
    except KeyboardInterrupt as exc:
        if received and not isinstance(exc, Terminated):
            raise Terminated(received[0]) from exc
        raise
    _print_run(plan, args, summary, report, console)
    return 0

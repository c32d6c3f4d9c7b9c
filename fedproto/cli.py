"""The ``fedproto`` command line.

Commands:

* ``fedproto run PROTOCOL [options]``: run a protocol end to end. ``--transport memory`` runs every
  party in this process; ``--transport tcp`` starts every party as its own OS process on
  loopback and merges their reports; ``--transport mpi`` is run under
  ``mpiexec -n <parties> fedproto run ...`` with one party per rank (rank 0 prints).
* ``fedproto party PROTOCOL --party NAME --roster FILE [options]``: run one party of a TCP run
  (on any host), given the roster file (party addresses, session id and the run's secret).
* ``fedproto list``: installed protocols and transports.

User errors (bad flags, unreadable data, k > n, a silent party...) print one line and exit
non-zero, without a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from fedproto import registry
from fedproto.data import PARTITIONS, load_dataset
from fedproto.errors import FedProtoError
from fedproto.metering import Meter, RunReport
from fedproto.plugin import RunPlan
from fedproto.runtime import RuntimeConfig, run_parties, run_party

__all__ = ["main", "build_parser"]


class UsageError(Exception):
    """A bad command line."""


class _QuietExit(Exception):
    """Exit with ``code`` without printing (an MPI rank whose error rank 0 reports)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def _common_arguments(parser: argparse.ArgumentParser, *, party: bool) -> None:
    group = parser.add_argument_group("run")
    group.add_argument("--data", default="iris", help="bundled name (iris, wine, breast_cancer, digits) or a file path")
    group.add_argument("--clients", type=int, default=2, help="number of clients (default 2)")
    group.add_argument("--seed", type=int, default=0, help="seed of the split, initialisation and noise (default 0)")
    group.add_argument("--partition", choices=PARTITIONS, default="iid", help="how data is split over clients")
    group.add_argument("--deadline", type=float, default=60.0, help="seconds a phase may wait for a party (default 60)")
    group.add_argument("--max-frame-bytes", type=int, default=256 * 1024 * 1024, help="largest frame accepted")
    if party:
        group.add_argument("--party", required=True, help="the party this process runs (e.g. server, client-0)")
        group.add_argument("--roster", required=True, help="roster JSON: session, secret, party addresses")
        group.add_argument("--party-report", default=None, help="write this party's report and result here (JSON)")
    else:
        group.add_argument("--transport", default="memory", help="memory (default), tcp or mpi")
        group.add_argument("--report", default=None, help="write the run report here (JSON); a plot goes beside it")
        group.add_argument("--plot", default=None, help="write the plot here (PNG/SVG/PDF)")
        group.add_argument("--quiet", action="store_true", help="print only the summary")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, with one sub-command per installed protocol."""
    parser = _Parser(prog="fedproto", description="Round-based federated protocols with exact metering.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = commands.add_parser("run", help="run a protocol end to end")
    party = commands.add_parser("party", help="run one party of a TCP run")
    commands.add_parser("list", help="list protocols and transports")
    for command, is_party in ((run, False), (party, True)):
        protocols = command.add_subparsers(dest="protocol", required=True, parser_class=_Parser)
        for name in registry.protocol_names():
            plugin = registry.load_protocol(name)
            sub = protocols.add_parser(name, help=plugin.description)
            _common_arguments(sub, party=is_party)
            plugin.add_arguments(sub)
    return parser


# --- running -----------------------------------------------------------------------------------------


def _party_json(plan: RunPlan, party: str, result: Any, report: RunReport) -> dict[str, Any]:
    return {"party": party, "result": plan.result_to_json(party, result), "report": report.to_dict()}


def _run_memory(plan: RunPlan, args: argparse.Namespace, console: Any) -> tuple[dict[str, Any], RunReport]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    network_cls = registry.load_transport("memory")
    network = network_cls(plan.roster, max_frame_bytes=args.max_frame_bytes)
    machines = {p: plan.make_machine(p) for p in plan.roster}
    config = RuntimeConfig(session=plan.session, deadline_s=args.deadline, max_frame_bytes=args.max_frame_bytes)
    meter = Meter(trio.current_time)
    coordinator = plan.roster[0]
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=args.quiet,
    ) as progress:
        task = progress.add_task(f"{args.protocol} rounds", total=plan.iterations)

        def observer(party: str, round_idx: int, state: str) -> None:
            if party == coordinator:
                progress.update(task, completed=min(round_idx, plan.iterations))

        async def go() -> dict[str, Any]:
            endpoints = network.endpoints()
            try:
                return await run_parties(machines, endpoints, config=config, meter=meter, observer=observer)
            finally:
                for endpoint in endpoints.values():
                    await endpoint.aclose()

        results = trio.run(go)
    report = meter.report(protocol=args.protocol, transport="memory", session=plan.session, parties=plan.roster)
    return {p: plan.result_to_json(p, r) for p, r in results.items()}, report


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _child_argv(argv: Sequence[str]) -> list[str]:
    """The original ``run`` arguments without the options only the launcher understands."""
    out: list[str] = []
    skip_value = {"--transport", "--report", "--plot"}
    it = iter(argv)
    for token in it:
        name = token.split("=", 1)[0]
        if name in skip_value:
            if "=" not in token:
                next(it, None)
            continue
        if token == "--quiet":
            continue
        out.append(token)
    return out


def _run_tcp_launcher(
    plan: RunPlan, args: argparse.Namespace, argv: Sequence[str], console: Any
) -> tuple[dict[str, Any], RunReport]:
    ports = _free_ports(len(plan.roster))
    with tempfile.TemporaryDirectory(prefix="fedproto-tcp-") as tmp:
        roster_path = Path(tmp) / "roster.json"
        roster_path.write_text(
            json.dumps(
                {
                    "session": plan.session,
                    "secret": os.urandom(32).hex(),
                    "parties": [{"name": p, "address": f"127.0.0.1:{port}"} for p, port in zip(plan.roster, ports)],
                }
            )
        )
        base = _child_argv(argv)
        base[0] = "party"
        processes: dict[str, subprocess.Popen] = {}
        try:
            for party in plan.roster:
                out = Path(tmp) / f"{party}.json"
                cmd = [sys.executable, "-m", "fedproto", *base, "--party", party, "--roster", str(roster_path)]
                cmd += ["--party-report", str(out)]
                processes[party] = subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
                )
            limit = time.monotonic() + args.deadline * (plan.iterations + 6) + 120
            with console.status(f"{len(processes)} parties running as separate processes over TCP", spinner="dots"):
                outputs = {}
                for party, proc in processes.items():
                    remaining = max(limit - time.monotonic(), 1.0)
                    try:
                        outputs[party] = proc.communicate(timeout=remaining)
                    except subprocess.TimeoutExpired:
                        raise FedProtoError(f"party {party} did not finish in time", party=party) from None
            failed = [(p, proc.returncode) for p, proc in processes.items() if proc.returncode != 0]
            if failed:
                party, code = failed[0]
                lines = [ln for ln in outputs[party][1].strip().splitlines() if ln.strip()]
                last = lines[-1] if lines else f"exit code {code}"
                raise FedProtoError(f"party {party} failed: {last.removeprefix('fedproto: error: ')}", party=party)
            docs = {p: json.loads((Path(tmp) / f"{p}.json").read_text()) for p in plan.roster}
        finally:
            for proc in processes.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    reports = [RunReport.from_dict(doc["report"]) for doc in docs.values()]
    report = RunReport.merge(reports, transport="tcp")
    return {p: doc["result"] for p, doc in docs.items()}, report


def _read_roster(path: str) -> tuple[list[str], dict[str, str], bytes, int | None]:
    """Parse a roster file: parties with addresses, the run's secret, optionally the session."""
    try:
        doc = json.loads(Path(path).read_text())
        names = [str(entry["name"]) for entry in doc["parties"]]
        addresses = {str(entry["name"]): str(entry["address"]) for entry in doc["parties"]}
        session = int(doc["session"]) if "session" in doc else None
        return names, addresses, bytes.fromhex(doc["secret"]), session
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"cannot read roster {path}: {exc}") from exc


def _run_party_tcp(plan: RunPlan, args: argparse.Namespace) -> int:
    names, addresses, secret, session = _read_roster(args.roster)
    if tuple(names) != plan.roster:
        raise ValueError(f"roster {args.roster} lists {names}, this run needs {list(plan.roster)}")
    if session is not None and session != plan.session:
        raise ValueError(f"roster {args.roster} is for session {session}, these arguments make session {plan.session}")
    if args.party not in plan.roster:
        raise ValueError(f"--party {args.party!r} is not in the roster {list(plan.roster)}")
    network = registry.load_transport("tcp")(
        addresses, secret, session=plan.session, max_frame_bytes=args.max_frame_bytes
    )
    machine = plan.make_machine(args.party)
    config = RuntimeConfig(
        session=plan.session, deadline_s=args.deadline, max_frame_bytes=args.max_frame_bytes, record_received=True
    )
    meter = Meter(trio.current_time)

    async def go() -> Any:
        async with network.endpoints(plan.roster, [args.party]) as endpoints:
            return await run_party(machine, endpoints[args.party], config=config, meter=meter)

    result = trio.run(go)
    report = meter.report(protocol=args.protocol, transport="tcp", session=plan.session, parties=plan.roster)
    doc = _party_json(plan, args.party, result, report)
    if args.party_report:
        Path(args.party_report).write_text(json.dumps(doc))
    else:
        print(json.dumps({"party": args.party, "result": doc["result"], "payload_bytes": report.payload_bytes}))
    return 0


def _mpi_gather(comm: Any, payload: bytes) -> list[bytes] | None:
    """Gather one byte string per rank at rank 0 (raw buffers: nothing is pickled)."""
    import numpy as np
    from mpi4py import MPI

    size = comm.Get_size()
    sizes = np.zeros(size, dtype=np.int64)
    comm.Allgather(np.array([len(payload)], dtype=np.int64), sizes)
    displs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    send = np.frombuffer(payload, dtype=np.uint8)
    if comm.Get_rank() == 0:
        recv = np.empty(int(sizes.sum()), dtype=np.uint8)
        comm.Gatherv(send, [recv, sizes.tolist(), displs.tolist(), MPI.BYTE], root=0)
        return [recv[o : o + s].tobytes() for o, s in zip(displs, sizes)]
    comm.Gatherv(send, None, root=0)
    return None


def _run_mpi(plan: RunPlan, args: argparse.Namespace) -> tuple[dict[str, Any], RunReport] | None:
    network = registry.load_transport("mpi")(max_frame_bytes=args.max_frame_bytes)
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
    config = RuntimeConfig(session=plan.session, deadline_s=args.deadline, max_frame_bytes=args.max_frame_bytes)
    meter = Meter(trio.current_time)
    error: str | None = None

    async def go() -> Any:
        async with network.endpoints(plan.roster) as endpoints:
            return await run_party(plan.make_machine(party), endpoints[party], config=config, meter=meter)

    try:
        result = trio.run(go)
        report = meter.report(protocol=args.protocol, transport="mpi", session=plan.session, parties=plan.roster)
        doc = _party_json(plan, party, result, report)
    except (FedProtoError, ValueError) as exc:
        error = str(exc)
        doc = {"party": party, "error": error}
    except BaseExceptionGroup as group:
        leaf = _single_leaf(group)
        if not isinstance(leaf, FedProtoError | ValueError):
            raise
        error = str(leaf)
        doc = {"party": party, "error": error}
    docs = _mpi_gather(comm, json.dumps(doc).encode())
    if docs is None:
        if error:
            raise _QuietExit(1)  # rank 0 reports every rank's error
        return None
    parsed = [json.loads(d) for d in docs]
    errors = [d for d in parsed if "error" in d]
    if errors:
        raise FedProtoError(f"party {errors[0]['party']} failed: {errors[0]['error']}", party=errors[0]["party"])
    report = RunReport.merge([RunReport.from_dict(d["report"]) for d in parsed], transport="mpi")
    return {d["party"]: d["result"] for d in parsed}, report


def _print_run(plan: RunPlan, args: argparse.Namespace, results: dict[str, Any], report: RunReport, console: Any) -> None:
    from fedproto.report import plot_report, render_report, render_summary

    summary = plan.summarize(results)
    shown = {k: v for k, v in summary.items() if not isinstance(v, list | dict)}
    shown.update(plan.analytic)
    if report.algorithm_rounds:
        per_iteration = (report.payload_bytes - report.setup_bytes) / report.algorithm_rounds
        shown["measured payload bytes per algorithm round (envelopes included)"] = per_iteration
    render_summary(console, f"{args.protocol} on {summary.get('data set', args.data)}", shown)
    if not args.quiet:
        render_report(console, report, plan.role_of, phases=plan.phases)
    final = RunReport.from_dict({**report.to_dict(), "results": summary})
    if args.report:
        final.to_json(args.report)
        console.print(f"report written to {args.report}")
    plot_path = args.plot or (str(Path(args.report).with_suffix(".png")) if args.report else None)
    if plot_path:
        extra = (lambda ax: plan.plot_results(ax, summary)) if plan.plot_results else None
        plot_report(final, plot_path, phases=plan.phases, extra=extra)
        console.print(f"plot written to {plot_path}")


def _dataset(plugin: Any, args: argparse.Namespace) -> Any:
    """The run's data: a set the plugin generates by name (``plugin.generated_datasets``, e.g. a
    paper's synthetic Gaussian mixture, built from ``--seed``), else :func:`load_dataset`."""
    generators = getattr(plugin, "generated_datasets", None) or {}
    if args.data in generators:
        return generators[args.data](args.seed)
    return load_dataset(args.data)


def _command_run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from rich.console import Console

    console = Console()
    plugin = registry.load_protocol(args.protocol)
    plan = plugin.plan(args, _dataset(plugin, args))
    if args.transport == "memory":
        results, report = _run_memory(plan, args, console)
    elif args.transport == "tcp":
        results, report = _run_tcp_launcher(plan, args, argv, console)
    elif args.transport == "mpi":
        outcome = _run_mpi(plan, args)
        if outcome is None:
            return 0
        results, report = outcome
    else:
        registry.load_transport(args.transport)  # raises a clear error for unknown names
        raise ValueError(f"transport {args.transport!r} has no runner in this CLI")
    _print_run(plan, args, results, report, console)
    return 0


def _command_party(args: argparse.Namespace) -> int:
    plugin = registry.load_protocol(args.protocol)
    plan = plugin.plan(args, _dataset(plugin, args))
    return _run_party_tcp(plan, args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 run error, 2 usage error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command == "list":
            print("protocols: " + ", ".join(registry.protocol_names()))
            print("transports: " + ", ".join(registry.transport_names()))
            return 0
        if args.command == "party":
            return _command_party(args)
        return _command_run(args, argv)
    except _QuietExit as exc:
        return exc.code
    except UsageError as exc:
        print(f"fedproto: usage error: {exc} (see fedproto --help)", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except KeyboardInterrupt:
        print("fedproto: interrupted", file=sys.stderr)
        return 130
    except (FedProtoError, ValueError, OSError, ImportError) as exc:
        print(f"fedproto: error: {exc}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        leaf = _single_leaf(group)
        if isinstance(leaf, FedProtoError | ValueError | OSError):
            print(f"fedproto: error: {leaf}", file=sys.stderr)
            return 1
        raise


def _single_leaf(group: BaseExceptionGroup) -> BaseException | None:
    """The one exception inside nested single-member groups, else ``None``."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        if len(exc.exceptions) != 1:
            return None
        exc = exc.exceptions[0]
    return exc

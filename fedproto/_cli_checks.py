"""The checks of ``fedproto run`` and ``fedproto party`` options that argparse cannot make alone:
usage errors (exit status 2) found before any protocol work starts, so a long run is not lost at
its end to an unwritable report path.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from fedproto import registry
from fedproto._cli_mpi import _mpi_size_from_environment
from fedproto._cli_parser import UsageError

__all__ = ["_check_options", "_load_transport"]


def _check_output_path(flag: str, path: str, *, prog: str, plot: bool = False) -> None:
    """A file we will write after the run: its directory exists and is writable (usage error
    otherwise, so a long run is not lost at its end)."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise UsageError(f"{flag} {path}: is a directory, not a file", prog=prog)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise UsageError(f"{flag} {path}: the directory {directory} does not exist", prog=prog)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: the directory {directory} is not writable", prog=prog)
    if target.exists() and not os.access(target, os.W_OK):
        raise UsageError(f"{flag} {path}: the file exists and is not writable", prog=prog)
    if plot:
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        suffix = target.suffix.lower().lstrip(".")
        if suffix not in formats:
            raise UsageError(
                f"{flag} {path}: unknown plot format {target.suffix!r} (use .png, .svg or .pdf)", prog=prog
            )


def _check_options(args: argparse.Namespace, network_cls: Any) -> None:
    """Option values that argparse cannot check alone (usage errors, before any work)."""
    prog = f"fedproto {args.command} {args.protocol}"
    limit = getattr(network_cls, "max_frame_bytes_limit", None)
    if limit is not None and args.max_frame_bytes > limit:
        raise UsageError(
            f"argument --max-frame-bytes: the {network_cls.name} transport carries frames of at most "
            f"{limit:,} bytes, got {args.max_frame_bytes:,}",
            prog=prog,
        )
    if args.command == "run":
        if args.report:
            _check_output_path("--report", args.report, prog=prog)
        if args.plot:
            _check_output_path("--plot", args.plot, prog=prog, plot=True)
        _check_dropout_options(args, prog)
        if args.topology is not None and args.transport != "tcp":
            raise UsageError(f"argument --topology: applies to --transport tcp, not {args.transport}", prog=prog)
        _check_network_options(args, prog)
        _check_placement_options(args, prog)
        if args.compute_trace and args.engine == "lean":
            raise UsageError(
                "argument --compute-trace: the lean engine runs no party's runtime; trace a run with --engine tasks, "
                "--transport tcp or --transport mpi",
                prog=prog,
            )
    elif args.party_report:
        _check_output_path("--party-report", args.party_report, prog=prog)


def _check_placement_options(args: argparse.Namespace, prog: str) -> None:
    """``--placement`` (a sharded lean run only) and what a sharded run cannot do (``--network``)."""
    sharded = getattr(args, "engine", "tasks") == "lean" and _mpi_size_from_environment() > 1
    if args.placement is not None:
        if not sharded:
            raise UsageError(
                "argument --placement: applies to --engine lean under mpiexec -n R with R > 1", prog=prog
            )
        if args.placement not in ("blocks", "coordinator-alone") and not Path(args.placement).is_file():
            raise UsageError(f"argument --placement: no placement file {args.placement}", prog=prog)
    if sharded and args.network != "none":
        raise UsageError("argument --network: the link model runs in one process, not over MPI ranks", prog=prog)


def _check_network_options(args: argparse.Namespace, prog: str) -> None:
    """``--network`` (lean engine only; the preset or file is read here and kept in
    ``args.network_model``) and ``--compute`` (only with a model; parsed here, a trace read once,
    and kept in ``args.compute_model``)."""
    args.network_model = args.compute_model = None
    if args.network == "none":
        if args.compute is not None:
            raise UsageError("argument --compute: applies with --network, not --network none", prog=prog)
        return
    from fedproto.netmodel import LinkModel, parse_compute  # only with a model: the module and tomllib cost ~30 ms

    if getattr(args, "engine", "tasks") != "lean":
        raise UsageError("argument --network: the link model runs on --engine lean only", prog=prog)
    try:
        args.network_model = LinkModel.parse(args.network)
    except ValueError as exc:
        raise UsageError(f"argument --network: {exc}", prog=prog) from None
    try:
        args.compute_model = parse_compute(args.compute)
    except ValueError as exc:
        raise UsageError(f"argument --compute: {exc}", prog=prog) from None


def _check_dropout_options(args: argparse.Namespace, prog: str) -> None:
    """``--dropout``/``--dropout-rate``: memory transport only, one ``--dropout`` per party."""
    flag = "--dropout" if args.dropout else "--dropout-rate" if args.dropout_rate is not None else None
    if getattr(args, "engine", "tasks") == "lean":
        if args.transport != "memory":
            raise UsageError(f"argument --engine: lean runs only on --transport memory, not {args.transport}", prog=prog)
        if flag is not None:
            raise UsageError(
                f"argument {flag}: fault injection needs --engine tasks (the lean engine crashes no party)", prog=prog
            )
    if flag is None:
        return
    if args.transport != "memory":
        raise UsageError(
            f"argument {flag}: fault injection runs only on --transport memory, not {args.transport}", prog=prog
        )
    seen: set[str] = set()
    for dropout in args.dropout or ():
        if dropout.party in seen:
            raise UsageError(f"argument --dropout: {dropout.party} is given more than once", prog=prog)
        seen.add(dropout.party)


def _load_transport(args: argparse.Namespace) -> Any:
    try:
        return registry.load_transport(args.transport)
    except registry.UnknownPluginError as exc:
        raise UsageError(f"argument --transport: {exc}", prog=f"fedproto run {args.protocol}") from None

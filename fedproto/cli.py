"""The ``fedproto`` command line.

Commands:

* ``fedproto run PROTOCOL [options]``: run a protocol end to end. ``--transport memory`` runs every
  party in this process; ``--transport tcp`` starts every party as its own OS process on
  loopback (:func:`fedproto.launcher.launch_local`; ``--topology star``, the default, has only the
  first party listen and the others dial out to it, ``--topology mesh`` has every party listen)
  and merges their reports; ``--transport mpi``
  is run under ``mpiexec -n <parties> fedproto run ...`` with one party per rank (rank 0 prints).
* ``fedproto party PROTOCOL --party NAME --roster FILE [--data FILE] [options]``: run one party
  of a TCP run (on any host), given the roster file of its kit (:class:`fedproto.roster.Roster`:
  party addresses, topology, the party's TLS material, the session); links are mutual TLS 1.3, or
  the insecure shared-secret handshake with ``--insecure-shared-secret``. For a protocol whose
  parties can each hold only their own data (its plugin has ``split`` and ``plan_party``:
  every built-in one), ``--data`` is this party's own file and a party without data gives none;
  the roster decides the parties. Otherwise every party loads the whole ``--data`` and cuts its
  part by ``--seed``.
* ``fedproto split PROTOCOL --data DATA --clients M [--partition P] [--seed S] [options] --out
  DIR``: write the split that ``fedproto run`` makes of a data set, one ``DIR/PARTY.npz`` per
  data-holding party (:func:`fedproto.data.save_dataset`) and ``DIR/split.json``; parties
  started on those files compute the result and payload bytes of the simulation. With
  ``--transport tcp``, ``fedproto run`` splits this way itself and gives each party process only
  its own part.
* ``fedproto provision --parties NAME,NAME,... --hub HOST:PORT [--topology mesh --address
  PARTY=HOST:PORT ...] --out DIR``: make a federation's CA and one kit per party
  (:mod:`fedproto.provision`); in the default star only the hub (the first party) has an address.
* ``fedproto list``: installed protocols and transports, one line each (a plugin that cannot be
  imported is listed as broken, with the reason).
* ``fedproto data list|fetch NAME... [--all]|path NAME``: the papers' registered data sets
  (:mod:`fedproto.datasets`): a table of them and where each is found, download and verify them
  into the user's cache, print one's verified path.

``PROTOCOL`` is an installed protocol's name, a Python file ``path/to/proto.py[:ATTR]`` or a
module ``package.module:ATTR`` (``ATTR`` defaults to ``PROTOCOL``); only that plugin is imported.

Global options: ``--version``, ``-v/--verbose`` (repeat for more), ``--log-level LEVEL`` (log
messages go to stderr).

Exit status: 0 success; 1 the run failed (unreadable data, k > n, a silent party...); 2 a usage
error (unknown protocol or option, a bad option value, a report path that cannot be written),
found before any protocol work starts; 130 SIGINT, 143 SIGTERM. Either way stderr gets one line,
without a traceback. ``fedproto run --report`` writes the report of a run that failed or was
interrupted once its parties started too (``status`` ``failed`` or ``interrupted``, see
``docs/cli.md``), and says where after that line.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import math
import os
import random
import re
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

from fedproto import __version__, datasets, memo, registry
from fedproto._interrupt import (
    Interrupted,
    SignalGuard,
    Terminated,
    exit_by_signal,
    signal_name,
    sigterm_interrupts,
    write_json,
)
from fedproto.agreement import PARTY_LOCAL_OPTIONS, Agreement
from fedproto.compilation import DEVICES, enable_compile_cache, select_device
from fedproto.data import BUNDLED, PARTITIONS, Dataset, load_dataset, save_dataset, session_id
from fedproto.errors import AgreementMismatch, FedProtoError, LocalProtocolError
from fedproto.framesize import abort_notice_frame_bytes
from fedproto._fork_server import ForkServer
from fedproto._launch_dir import launch_directory, private_file
from fedproto.launcher import LaunchError, LaunchInterrupted, discard_launched_kit, launch_local
from fedproto.metering import Meter, RunReport, error_record
from fedproto.plugin import RunPlan
from fedproto.progress import progress_display, progress_task
from fedproto.roster import Roster, _check_address
from fedproto.runtime import RuntimeConfig, run_parties, run_party

__all__ = ["main", "build_parser"]

COMMANDS = ("run", "party", "split", "provision", "list", "data")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: ``fedproto run`` options that only the launching process uses (not passed to TCP parties).
_LAUNCHER_OPTIONS = {
    "--transport": True, "--report": True, "--plot": True, "--no-plot": False, "--quiet": False, "--full": False,
    "--topology": True,
}
#: ``fedproto run`` options that a TCP party holding only its own data does not take (the launcher
#: gives it ``--data FILE`` instead): the whole data set and how it is cut.
_WHOLE_DATA_OPTIONS = {"--data": True, "--clients": True, "--partition": True}
#: Namespace entries that are the CLI's bookkeeping, not options of the run.
_INTERNAL_KEYS = {"command", "protocol_name", "argv", "network_model", "option_spelling", "fork_server"}
#: Global options (before the command) that take a value.
_GLOBAL_WITH_VALUE = {"--log-level"}
_log = logging.getLogger("fedproto.cli")


class UsageError(Exception):
    """A bad command line (exit status 2).

    Attributes:
        prog: the (sub)command whose usage was wrong, for the ``--help`` hint.
    """

    def __init__(self, message: str, *, prog: str = "fedproto") -> None:
        super().__init__(message)
        self.prog = prog


class _QuietExit(Exception):
    """Exit with ``code`` without printing (an MPI rank whose error rank 0 reports)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<value>[^']*)' \(choose from (?P<choices>.*)\)")


class _Parser(argparse.ArgumentParser):
    """Raises :class:`UsageError` instead of printing usage and exiting; no option abbreviations
    (one spelling per option, so typos get "did you mean" instead of a silent prefix match)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        match = _INVALID_CHOICE.search(message)
        if match:
            choices = re.findall(r"'([^']*)'", match.group("choices"))
            hint = _did_you_mean(registry.suggest(match.group("value"), choices))
            message = message + hint
        raise UsageError(message, prog=self.prog)


def _did_you_mean(suggestions: Sequence[str]) -> str:
    return f"; did you mean {' or '.join(suggestions)}?" if suggestions else ""


# --- option types (a bad value is a usage error that names its flag) ------------------------------


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text}")
    return value


def _compute_spec(text: str) -> str:
    """``--compute``: ``measured`` or ``fixed:SECONDS`` (kept as text; checked here)."""
    from fedproto.netmodel import parse_compute

    try:
        parse_compute(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


@dataclasses.dataclass(frozen=True)
class _Dropout:
    """One party told to drop out: it crashes at its first frame of ``stage`` (in ``round_idx``)."""

    party: str
    stage: str
    round_idx: int | None = None

    def __str__(self) -> str:  # the --dropout spelling, as the report's options keep it
        return f"{self.party}@{self.stage}" + ("" if self.round_idx is None else f":{self.round_idx}")

    def record(self, crashed: bool) -> dict[str, Any]:
        """The report's entry for this dropout."""
        return {"party": self.party, "stage": self.stage, "round_idx": self.round_idx, "crashed": crashed}


def _dropout_spec(text: str) -> _Dropout:
    """``PARTY@STAGE[:ROUND]`` (the party and stage are checked against the run's plan later)."""
    party, at, rest = text.partition("@")
    stage, colon, round_text = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if not (at and party and stage) or "@" in rest:
        raise argparse.ArgumentTypeError(f"expected PARTY@STAGE or PARTY@STAGE:ROUND, got {text!r}")
    if colon and not (round_text.isascii() and round_text.isdigit()):
        raise argparse.ArgumentTypeError(f"ROUND must be a non-negative integer, got {round_text!r} in {text!r}")
    return _Dropout(party, stage, int(round_text) if colon else None)


def _dropout_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a probability, got {text!r}") from None
    if not 0.0 <= value < 1.0:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, got {text}")
    return value


def _int_at_least(minimum: int, what: str = "an integer") -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = f"int>={minimum}"
    return parse


# --- the parser --------------------------------------------------------------------------------------


def _global_arguments(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """``-v`` and ``--log-level``, accepted before the command and after the protocol."""
    group = parser.add_argument_group("logging") if not top else parser
    group.add_argument(
        "-v", "--verbose", action="count", default=0 if top else argparse.SUPPRESS,
        help="log more on stderr (-v: INFO, -vv: DEBUG)",
    )
    group.add_argument(
        "--log-level", type=str.upper, choices=LOG_LEVELS, default=None if top else argparse.SUPPRESS,
        metavar="LEVEL", help=f"log level on stderr, one of {', '.join(LOG_LEVELS)} (overrides -v)",
    )


def _common_arguments(
    parser: argparse.ArgumentParser,
    *,
    party: bool,
    needs_data: bool = True,
    partitions: Sequence[str] = PARTITIONS,
    default_partition: str = "iid",
    local_data: bool = False,
    split: bool = False,
) -> None:
    """The options every protocol shares (``needs_data=False``: no data options; a plugin may
    name its own ``--partition`` schemes and default, e.g. a paper's own split).

    The help texts show the defaults through ``%(default)s``, so a plugin that changes one in
    ``add_arguments`` (``parser.set_defaults(clients=5)``) sees ``--help`` show its own.

    ``party`` with ``local_data`` (a plugin with ``split`` and ``plan_party``): ``--data`` is the
    party's own file and the options that cut a whole data set (``--clients``, ``--partition``)
    are absent. ``split``: the options of ``fedproto split`` (the data, how it is cut, ``--out``).
    """
    group = parser.add_argument_group("run" if not split else "split")
    whole_data = not (party and local_data)
    if needs_data and whole_data:
        group.add_argument(
            "--data", default="iris", help="bundled name (iris, wine, breast_cancer, digits) or a file path"
        )
    elif needs_data:
        group.add_argument(
            "--data", default=None, metavar="FILE",
            help="this party's own data (a file fedproto split writes, or any data file: text, .npy, .npz); "
            "a party that holds no data (the hub) gives none",
        )
    if whole_data:
        group.add_argument("--clients", type=_int_at_least(1), default=2, help="number of clients (default %(default)s)")
    group.add_argument(
        "--seed", type=_int_at_least(0, "a non-negative integer"), default=0,
        help="seed of the split, initialisation and noise (default %(default)s)",
    )
    if needs_data and whole_data:
        group.add_argument(
            "--partition", choices=tuple(partitions), default=default_partition,
            help="how data is split over clients (default %(default)s)",
        )
    if split:
        group.add_argument(
            "--out", required=True, metavar="DIR",
            help="write one file per data-holding party here (DIR/PARTY.npz) and DIR/split.json; the directory "
            "must not exist, or be empty",
        )
        _global_arguments(parser, top=False)
        return
    group.add_argument(
        "--deadline", type=_positive_seconds, default=60.0, help="seconds a phase may wait for a party (default %(default)g)"
    )
    group.add_argument(
        "--device", choices=DEVICES, default="auto",
        help="where JAX runs the kernels: auto (a GPU when JAX sees one, default), cpu or gpu",
    )
    group.add_argument(
        "--no-compile-cache", action="store_true",
        help="do not keep compiled JAX kernels between runs (default: cached in the user's cache directory)",
    )
    group.add_argument(
        "--max-frame-bytes", type=_int_at_least(1), default=256 * 1024 * 1024,
        help="largest frame accepted (bytes; at most what the transport's wire allows); parties refuse "
        "frames above the smaller of this and the largest frame the protocol sends in this run",
    )
    if party:
        group.add_argument("--party", required=True, help="the party this process runs (e.g. server, client-0)")
        group.add_argument(
            "--roster", required=True,
            help="roster JSON of this party's kit (fedproto provision): party addresses, TLS files, session",
        )
        group.add_argument(
            "--insecure-shared-secret", action="store_true",
            help="authenticate with the roster's shared secret instead of TLS: any holder of the secret can "
            "claim any party's name and frames travel unencrypted (loopback experiments only)",
        )
        group.add_argument("--party-report", default=None, help="write this party's report and result here (JSON)")
        group.add_argument(
            "--listen-fd", type=_int_at_least(0), default=None, metavar="FD",
            help="serve on this inherited listening socket instead of binding the roster address "
            "(set by the process launcher)",
        )
    else:
        group.add_argument("--transport", default="memory", help="memory (default), tcp or mpi")
        group.add_argument(
            "--topology", choices=("star", "mesh"), default=None,
            help="with --transport tcp: star (default: only the first party listens, the others dial out to it "
            "and it relays their frames to each other) or mesh (every party listens)",
        )
        group.add_argument(
            "--engine", choices=("tasks", "lean"), default="tasks",
            help="with --transport memory: tasks (default: one trio task per party, the runtime TCP and MPI "
            "parties run) or lean (fedproto.simulation: every party driven from one loop, the same frames and "
            "bytes, deadlines on a virtual clock; for 10^4 to 10^6 clients; no fault injection)",
        )
        group.add_argument(
            "--network", default="none", metavar="none|lan|wan|cross-region|PATH",
            help="with --engine lean: predict the run's wall time over modelled links (fedproto.netmodel): a "
            "preset or a JSON/TOML link file; the prediction goes in the report and a timeline figure beside "
            "the plot (default none)",
        )
        group.add_argument(
            "--compute", type=_compute_spec, default=None, metavar="measured|fixed:SECONDS",
            help="with --network: each handler's compute time, measured on this process (default) or the "
            "same fixed seconds for every handler (repeatable predictions)",
        )
        group.add_argument(
            "--placement", default=None, metavar="blocks|coordinator-alone|PATH",
            help="with --engine lean under mpiexec -n R (R > 1: one simulation over R ranks): which rank hosts "
            "which party: blocks (default: the coordinator on rank 0, the clients in contiguous blocks over all "
            "ranks), coordinator-alone (rank 0 hosts only the coordinator) or a JSON file {party: rank}",
        )
        group.add_argument("--report", default=None, help="write the run report here (JSON); a plot goes beside it")
        plots = group.add_mutually_exclusive_group()
        plots.add_argument("--plot", default=None, help="write the plot here (PNG/SVG/PDF)")
        plots.add_argument(
            "--no-plot", action="store_true", help="write no plot (the report alone; no matplotlib start-up)"
        )
        group.add_argument("--quiet", action="store_true", help="print only the summary, no progress")
        group.add_argument(
            "--full", action="store_true", help="print long tables whole (default: their first rows and totals)"
        )
        faults = parser.add_argument_group("dropout (fault injection, memory transport only)")
        faults.add_argument(
            "--dropout", action="append", type=_dropout_spec, default=None, metavar="PARTY@STAGE[:ROUND]",
            help="crash PARTY (a client, not the first party of the roster) when it sends its first frame "
            "of phase STAGE (of round ROUND, 0-based, when given); repeatable",
        )
        faults.add_argument(
            "--dropout-rate", type=_dropout_rate, default=None, metavar="R",
            help="each client drops out with probability R (0 <= R < 1) at a stage and round drawn "
            "uniformly from those the protocol survives, from --seed",
        )
    _global_arguments(parser, top=False)


def _provision_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``fedproto provision`` (checked further in :func:`_command_provision`)."""
    parser.add_argument(
        "--parties", required=True, metavar="NAME,NAME,...",
        help="every party in roster order, comma-separated (e.g. server,client-0,client-1); each name one DNS "
        "label: lowercase letters, digits and '-'",
    )
    parser.add_argument(
        "--topology", choices=("star", "mesh"), default="star",
        help="star (default): only the hub, the first party, listens and the others dial out to it; mesh: every "
        "party listens (needs an address for each)",
    )
    parser.add_argument(
        "--address", action="append", default=None, metavar="PARTY=HOST:PORT",
        help="where PARTY listens (repeatable): the hub's (or use --hub); with --topology mesh every party needs one "
        "unless --hub numbers them",
    )
    parser.add_argument(
        "--hub", default=None, metavar="HOST:PORT",
        help="where the first party (the coordinating one, the hub) listens; with --topology mesh every other party "
        "without --address gets the hub's host and the next free port from --base-port",
    )
    parser.add_argument(
        "--base-port", type=_int_at_least(1), default=None, metavar="PORT",
        help="with --topology mesh and --hub: first port of the other parties, numbered in roster order (default: "
        "the hub's port + 1)",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory: must not exist, or be empty")
    parser.add_argument(
        "--valid-days", type=_int_at_least(1), default=365, metavar="N",
        help="days the certificates are valid (default 365)",
    )
    parser.add_argument(
        "--session", type=_int_at_least(0, "a non-negative integer"), default=None, metavar="N",
        help="write this session id into every roster: the run's session (parties started with different options "
        "are refused in the handshake, by option, either way)",
    )
    _global_arguments(parser, top=False)


def _scan(argv: Sequence[str]) -> tuple[str | None, str | None]:
    """The command and the protocol spec ``argv`` names (``None`` where absent), without parsing
    the options (which depend on the protocol)."""
    tokens = iter(argv)
    for token in tokens:
        if token == "--":
            token = next(tokens, None)
            if token is None:
                return None, None
        elif token.startswith("-"):
            if token in _GLOBAL_WITH_VALUE:
                next(tokens, None)
            continue
        if token not in ("run", "party", "split"):
            return token, None
        spec = next(tokens, None)
        return token, (spec if spec is not None and not spec.startswith("-") else None)
    return None, None


def holds_local_data(plugin: Any) -> bool:
    """Whether a plugin's parties can each hold only their own data: it has ``split`` and
    ``plan_party`` (see :mod:`fedproto.plugin`). Then ``fedproto party --data FILE`` is the
    party's own file, ``fedproto split`` writes those files, and ``fedproto run --transport tcp``
    gives each party process only its own."""
    return (
        getattr(plugin, "needs_data", True)
        and callable(getattr(plugin, "split", None))
        and callable(getattr(plugin, "plan_party", None))
    )


def _plugin_description(plugin: Any) -> str:
    text = getattr(plugin, "description", "") or ""
    return " ".join(str(text).split())


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser.

    Args:
        argv: the command line to be parsed. Only the protocol it names is imported (a file or
            module spec included). ``None``: every installed protocol (the ones that fail to
            import are left out), for tools that want the complete parser.

    Raises:
        registry.UnknownPluginError: ``argv`` names an unknown protocol.
        registry.PluginLoadError: that protocol cannot be imported.
    """
    parser = _Parser(prog="fedproto", description="Round-based federated protocols with exact metering.")
    parser.add_argument("--version", action="version", version=f"fedproto {__version__}")
    _global_arguments(parser, top=True)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    installed = ", ".join(registry.protocol_names()) or "none"
    protocol_help = (
        f"installed protocols: {installed} (fedproto list describes them); or a Python file "
        "path/to/proto.py[:ATTR] or a module package.module:ATTR (ATTR defaults to PROTOCOL)"
    )
    run = commands.add_parser("run", help="run a protocol end to end", description=protocol_help)
    party = commands.add_parser("party", help="run one party of a TCP run", description=protocol_help)
    split = commands.add_parser(
        "split", help="write each party's share of a data set to its own file", description=protocol_help
    )
    commands.add_parser("list", help="list protocols and transports", description="installed protocols and transports")
    _provision_arguments(
        commands.add_parser(
            "provision", help="make a federation's CA and one TLS kit per party",
            description="Make a federation CA and, per party, a kit directory OUT/PARTY (the CA's certificate, the "
            "party's certificate and private key, its roster.json) to copy to that party's host; the CA's key goes "
            "to OUT/ca/ca.key only.",
        )
    )
    _data_arguments(commands)
    plugins: dict[str, Any] = {}
    if argv is None:
        for name in registry.protocol_names():
            try:
                plugins[name] = registry.load_protocol(name)
            except registry.PluginLoadError:
                continue
    else:
        command, spec = _scan(argv)
        if command in ("run", "party", "split") and spec is not None:
            plugins[spec] = registry.load_protocol(spec)
    for command_parser, name in ((run, "run"), (party, "party"), (split, "split")):
        protocols = command_parser.add_subparsers(
            dest="protocol", required=True, parser_class=_Parser, metavar="PROTOCOL"
        )
        for spec, plugin in plugins.items():
            description = _plugin_description(plugin)
            sub = protocols.add_parser(spec, help=description, description=description)
            _common_arguments(
                sub,
                party=name == "party",
                needs_data=getattr(plugin, "needs_data", True),
                partitions=getattr(plugin, "partitions", PARTITIONS),
                default_partition=getattr(plugin, "default_partition", "iid"),
                local_data=holds_local_data(plugin),
                split=name == "split",
            )
            add_arguments = getattr(plugin, "add_arguments", None)
            if add_arguments is not None:
                add_arguments(sub)
    return parser


def _subparser(parser: argparse.ArgumentParser, *names: str) -> argparse.ArgumentParser:
    """The parser of ``fedproto NAME NAME ...`` (the deepest that exists)."""
    for name in names:
        found = None
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) and name in action.choices:
                found = action.choices[name]
        if found is None:
            break
        parser = found
    return parser


def _unknown_options_error(parser: argparse.ArgumentParser, extras: Sequence[str]) -> UsageError:
    """"unrecognized arguments" with "did you mean" for each unknown option (hidden aliases are
    valid spellings; a suggestion names the visible option of the same destination)."""
    visible: dict[str, str] = {}
    for action in parser._actions:
        if action.help is not argparse.SUPPRESS and action.option_strings:
            visible.setdefault(action.dest, max(action.option_strings, key=len))
    known = {
        option: (visible.get(action.dest, option) if action.help is argparse.SUPPRESS else option)
        for option, action in parser._option_string_actions.items()
    }
    parts = []
    after_option = False
    for token in extras:
        name = token.split("=", 1)[0]
        if not name.startswith("-") or name == "-":
            if not after_option:  # else: most likely the unknown option's value
                parts.append(f"unexpected argument {token!r}")
            after_option = False
            continue
        after_option = "=" not in token
        suggestions = list(dict.fromkeys(known[m] for m in registry.suggest(name, list(known))))
        parts.append(f"unknown option {name}{_did_you_mean(suggestions)}")
    return UsageError("; ".join(parts), prog=parser.prog)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    command, spec = _scan(argv)
    if command is not None and command not in COMMANDS:
        raise UsageError(
            f"unknown command {command!r}{_did_you_mean(registry.suggest(command, COMMANDS))} "
            f"(commands: {', '.join(COMMANDS)})"
        )
    try:
        parser = build_parser(argv)
    except registry.UnknownPluginError as exc:
        raise UsageError(str(exc), prog=f"fedproto {command}") from None
    args, extras = parser.parse_known_args(argv)
    deepest = _subparser(parser, *(n for n in (command, spec) if n))
    if extras:
        raise _unknown_options_error(deepest, extras)
    args.option_spelling = _option_spelling(deepest)
    return args


def _option_spelling(parser: argparse.ArgumentParser) -> dict[str, str]:
    """``{dest: "--option"}``: how a user spells each option (a hidden alias by its visible name)."""
    spelling: dict[str, str] = {}
    for action in parser._actions:
        if action.option_strings and (action.help is not argparse.SUPPRESS or action.dest not in spelling):
            spelling[action.dest] = max(action.option_strings, key=len)
    return spelling


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


# --- running -----------------------------------------------------------------------------------------


def _party_json(plan: RunPlan, party: str, result: Any, report: RunReport) -> dict[str, Any]:
    return {"party": party, "result": plan.result_to_json(party, result), "report": report.to_dict()}


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
    meter = Meter(time.perf_counter) if lean else Meter(trio.current_time)
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
                        network=getattr(args, "network_model", None), compute=getattr(args, "compute", None),
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


def _mpi_size_from_environment() -> int:
    """The number of MPI ranks the launcher announces (1 when not under mpiexec or srun), read
    without initialising MPI."""
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 1


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


def _child_argv(argv: Sequence[str], spec: str, strip: Mapping[str, bool] = _LAUNCHER_OPTIONS) -> list[str]:
    """The ``party`` command line of a TCP party: ``run`` becomes ``party``, the protocol spec is
    one any working directory can load, and the options in ``strip`` (``{option: takes a
    value}``: the launcher's own, and the whole data set's where each party gets its own file)
    are left out."""
    out: list[str] = []
    tokens = iter(argv)
    command_seen = protocol_seen = False
    for token in tokens:
        if not command_seen:
            if token in _GLOBAL_WITH_VALUE:
                out += [token, next(tokens, "")]
                continue
            if token == "run":
                command_seen = True
                out.append("party")
            else:
                out.append(token)
            continue
        if not protocol_seen:
            protocol_seen = True
            out.append(spec)
            continue
        name = token.split("=", 1)[0]
        if name in strip:
            if strip[name] and "=" not in token:
                next(tokens, None)
            continue
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
    meter = Meter(trio.current_time)
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
    from fedproto.transports.tcp import DEFAULT_KEEPALIVE_S  # loaded just above

    # A client gives up on a hub it has not heard from for one deadline (the protocols' clients
    # would wait two), hearing it at least every quarter deadline (the star's keep-alive); a peer
    # that never answers a dial is given up on after one deadline too.
    network = tcp.from_roster(
        roster, listen_fds=listen_fds, session=plan.session, max_frame_bytes=limit,
        insecure_shared_secret=args.insecure_shared_secret, agreement=agreement,
        resume_timeout_s=args.deadline, keepalive_s=min(DEFAULT_KEEPALIVE_S, args.deadline / 4),
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
    meter = Meter(trio.current_time)
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


def _check_mpi_installed() -> None:
    """Fail before any work when mpi4py is missing, saying how to install it."""
    try:
        import mpi4py  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "the MPI transport needs mpi4py and an MPI library: pip install 'fedproto[mpi]', "
            "then start the run with mpiexec -n <parties>"
        ) from exc


def _mpi_rank_from_environment() -> int:
    """This process's MPI rank as the launcher announces it (0 when not under mpiexec), read
    without initialising MPI."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


# --- output --------------------------------------------------------------------------------------------


def _label(plan: RunPlan, key: str) -> str:
    return plan.labels.get(key, key.replace("_", " "))


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
    for entry in p["rounds"]:
        rows[f"round {entry['round_idx']} (s, critical party)"] = (
            f"{entry['wall_time_s']:.6g} ({entry['critical_party']})"
        )
    return rows


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


# --- checks before any work --------------------------------------------------------------------------------


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
    ``args.network_model``) and ``--compute`` (only with a model)."""
    args.network_model = None
    if args.network == "none":
        if args.compute is not None:
            raise UsageError("argument --compute: applies with --network, not --network none", prog=prog)
        return
    from fedproto.netmodel import LinkModel  # only with a model: its module and tomllib cost ~30 ms

    if getattr(args, "engine", "tasks") != "lean":
        raise UsageError("argument --network: the link model runs on --engine lean only", prog=prog)
    try:
        args.network_model = LinkModel.parse(args.network)
    except ValueError as exc:
        raise UsageError(f"argument --network: {exc}", prog=prog) from None


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


# --- commands ----------------------------------------------------------------------------------------------


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
    return _run_party_tcp(plan, args, roster, dataclasses.replace(options, session=plan.session))


def local_session(args: argparse.Namespace, parties: Sequence[str], agreement: Agreement | None = None) -> int:
    """The session id of a run whose parties each hold only their own data and whose roster
    fixes none: derived from the protocol, the roster and the options every party must agree on
    (``agreement``, without a session; without it, from ``--seed`` alone), so parties started
    with other options are in other sessions."""
    if agreement is None:
        return session_id(args.protocol_name, tuple(parties), args.seed)
    return session_id(args.protocol_name, tuple(parties), agreement.digest().hex())


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


def _command_split(args: argparse.Namespace) -> int:
    """``fedproto split``: the simulation's split of a data set, one file per data-holding party."""
    prog = f"fedproto split {args.protocol}"
    plugin = registry.load_protocol(args.protocol)
    if not getattr(plugin, "needs_data", True):
        raise UsageError(f"{args.protocol_name} holds no data: there is nothing to split", prog=prog)
    if not holds_local_data(plugin):
        raise UsageError(
            f"{args.protocol_name} cannot run on per-party files (its plugin has no split and plan_party)", prog=prog
        )
    out = Path(args.out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {args.out}: exists and is not an empty directory", prog=prog)
    parent = out.parent if str(out.parent) else Path(".")
    if not out.exists() and not parent.is_dir():
        raise UsageError(f"--out {args.out}: the directory {parent} does not exist", prog=prog)
    if not os.access(out if out.exists() else parent, os.W_OK | os.X_OK):
        raise UsageError(f"--out {args.out}: not writable", prog=prog)
    dataset = _dataset(plugin, args)
    # The roster of the run these files are for: the one plan() describes (it cuts the data the same way).
    plan = plugin.plan(args, dataset)
    parts = _split_parts(plugin, args, dataset, plan.roster)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for party in plan.roster:
        if party not in parts:
            continue
        path = save_dataset(out / f"{party}.npz", parts[party])
        entries.append({"party": party, "file": path.name, "n_points": parts[party].n, "d": parts[party].d})
        print(f"{path}: {parts[party].n} points of {parts[party].d} features for {party}")
    manifest = {
        "protocol": args.protocol_name,
        "data_set": dataset.name,
        "parties": list(plan.roster),
        "files": entries,
        "options": _options(args),
        "resolved_options": _resolved_options(plugin, args, dataset),
        "command": ["fedproto", *args.argv],
    }
    (out / "split.json").write_text(json.dumps(_json_ready(manifest), indent=2) + "\n")
    without = [p for p in plan.roster if p not in parts]
    print(
        f"{out / 'split.json'}: the split of {dataset.name} ({dataset.n} points) over {len(entries)} parties; "
        + (
            f"{_names(without)} {'holds' if len(without) == 1 else 'hold'} no data "
            f"(start {'it' if len(without) == 1 else 'them'} without --data)"
            if without
            else "every party holds data"
        )
    )
    return 0


def _provision_addresses(args: argparse.Namespace, parties: Sequence[str]) -> dict[str, str]:
    """``{party: "host:port"}`` from ``--address`` and ``--hub``/``--base-port`` (see their help).

    In the star only the hub needs one (the others' are kept but not used); in the mesh every
    party does.

    Raises:
        UsageError: a malformed or repeated ``--address``, one for a party not in ``--parties``,
            a bad ``--hub``, ``--base-port`` without ``--hub`` or in the star, a port 0 or past
            65535, a party (the hub, in the star) left without an address.
    """
    prog = "fedproto provision"
    addresses: dict[str, str] = {}
    for spec in args.address or ():
        party, sep, address = spec.partition("=")
        if not sep or not party:
            raise UsageError(f"argument --address: expected PARTY=HOST:PORT, got {spec!r}", prog=prog)
        if party not in parties:
            raise UsageError(f"argument --address: {party!r} is not one of --parties", prog=prog)
        if party in addresses:
            raise UsageError(f"argument --address: {party} is given more than once", prog=prog)
        addresses[party] = _provision_address("--address", party, address)
    if args.base_port is not None and args.hub is None:
        raise UsageError("argument --base-port: needs --hub", prog=prog)
    if args.base_port is not None and args.topology == "star":
        raise UsageError(
            "argument --base-port: numbers the ports of the other parties, which only listen in a mesh "
            "(--topology mesh); in the star they dial out to the hub",
            prog=prog,
        )
    hub = parties[0]
    if args.hub is not None:
        if hub in addresses:
            raise UsageError(f"argument --hub: {hub} (the first party) also has an --address; give one", prog=prog)
        addresses[hub] = _provision_address("--hub", hub, args.hub)
    if args.topology == "star":
        if hub not in addresses:
            raise UsageError(
                f"no address for the hub {hub} (the first party, the only one that listens): give --hub HOST:PORT",
                prog=prog,
            )
        return {p: addresses[p] for p in parties if p in addresses}
    if args.hub is not None:
        host, _, port = addresses[hub].rpartition(":")
        next_port = args.base_port if args.base_port is not None else int(port) + 1
        for party in parties:
            if party not in addresses:
                if next_port > 65535:
                    flag = "--base-port" if args.base_port is not None else "--hub"
                    raise UsageError(f"argument {flag}: no port left for {party} (past 65535)", prog=prog)
                addresses[party] = f"{host}:{next_port}"
                next_port += 1
    missing = [p for p in parties if p not in addresses]
    if missing:
        raise UsageError(
            f"no address for {_names(missing)}: give --address {missing[0]}=HOST:PORT for each, or --hub HOST:PORT",
            prog=prog,
        )
    return {p: addresses[p] for p in parties}


def _provision_address(flag: str, party: str, address: str) -> str:
    try:
        checked = _check_address(party, address)
    except ValueError as exc:
        raise UsageError(f"argument {flag}: {exc}", prog="fedproto provision") from None
    if checked.rpartition(":")[2].lstrip("0") == "":
        raise UsageError(f"argument {flag}: the port of {party} must not be 0", prog="fedproto provision")
    return checked


def _command_provision(args: argparse.Namespace) -> int:
    from fedproto.provision import MAX_VALID_DAYS, check_output_directory, check_party_name, provision

    prog = "fedproto provision"
    try:
        check_output_directory(args.out)
    except ValueError as exc:
        raise UsageError(f"argument --out: {exc}", prog=prog) from None
    parties = [name.strip() for name in args.parties.split(",")]
    if any(not name for name in parties):
        raise UsageError(f"argument --parties: an empty name in {args.parties!r}", prog=prog)
    repeated = sorted({p for p in parties if parties.count(p) > 1})
    if repeated:
        raise UsageError(f"argument --parties: repeated: {', '.join(repeated)}", prog=prog)
    if len(parties) < 2:
        raise UsageError("argument --parties: a federation needs at least two parties", prog=prog)
    for name in parties:
        try:
            check_party_name(name)
        except ValueError as exc:
            raise UsageError(f"argument --parties: {exc}", prog=prog) from None
    if "ca" in parties:
        raise UsageError("argument --parties: 'ca' is the name of the CA's directory; choose another", prog=prog)
    if args.valid_days > MAX_VALID_DAYS:
        raise UsageError(f"argument --valid-days: at most {MAX_VALID_DAYS}, got {args.valid_days}", prog=prog)
    if args.session is not None and args.session >= 2**64:
        raise UsageError(f"argument --session: must be below 2**64, got {args.session}", prog=prog)
    addresses = _provision_addresses(args, parties)
    kits = provision(
        parties, addresses, args.out, valid_days=args.valid_days, session=args.session, topology=args.topology
    )
    out = Path(args.out)
    print(f"federation provisioned in {out} ({args.topology}; certificates valid for {args.valid_days} days)")
    print(f"  {out / 'ca' / 'ca.key'}: the CA's private key; keep it offline, on no party's host")
    width = max(len(str(kit)) for kit in kits.values()) + 1
    for party, kit in kits.items():
        if args.topology == "star" and party != parties[0]:
            role = f"dials out to the hub {parties[0]}"
        else:
            role = f"listens on {addresses[party]}"
        print(f"  {str(kit) + '/':<{width}} {party} {role}; copy this kit to its host only")
    print("start each party with: fedproto party PROTOCOL --party NAME --roster KIT/roster.json [options]")
    return 0


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


def _command_list() -> int:
    sections = {"protocols": registry.describe_protocols(), "transports": registry.describe_transports()}
    width = max((len(info.name) for infos in sections.values() for info in infos), default=0)
    for title, infos in sections.items():
        print(f"{title}:")
        for info in infos:
            text = info.description if info.error is None else f"(broken) {info.error}"
            print(f"  {info.name:<{width}}  {text}".rstrip())
    return 0


# --- fedproto data ---------------------------------------------------------------------------------------


def _data_arguments(commands: Any) -> None:
    """The ``fedproto data`` command and its actions ``list``, ``fetch`` and ``path``."""
    data = commands.add_parser(
        "data", help="list, fetch and locate the papers' data sets",
        description="The papers' data sets by name. --data NAME looks in the directories of FEDPROTO_DATA "
        "(os.pathsep-separated, an offline mirror), then in the user's cache, where `fedproto data fetch` "
        "downloads; every copy is checked against its pinned sha256.",
    )
    actions = data.add_subparsers(dest="data_action", required=True, parser_class=_Parser, metavar="ACTION")
    listing = actions.add_parser("list", help="the registered sets and where each is found now")
    fetch = actions.add_parser(
        "fetch", help="download sets into the cache and verify them (a set in a mirror is verified, not copied)"
    )
    fetch.add_argument("names", nargs="*", metavar="NAME", help="registered set names (fedproto data list)")
    fetch.add_argument("--all", action="store_true", help="every registered set")
    path = actions.add_parser("path", help="print the verified path of a set (no download)")
    path.add_argument("name", metavar="NAME", help="a registered set name")
    for action in (listing, fetch, path):
        _global_arguments(action, top=False)


def _registered(name: str, prog: str) -> str:
    """``name`` if it is a registered set, else a usage error with "did you mean"."""
    if name in datasets.REGISTRY:
        return name
    if name in BUNDLED:
        raise UsageError(f"{name!r} is scikit-learn's bundled set: --data {name} needs no fetch", prog=prog)
    hint = _did_you_mean(registry.suggest(name, list(datasets.REGISTRY)))
    raise UsageError(f"unknown data set {name!r}{hint} (registered: {', '.join(datasets.REGISTRY)})", prog=prog)


def _command_data(args: argparse.Namespace) -> int:
    prog = f"fedproto data {args.data_action}"
    if args.data_action == "list":
        return _data_list()
    if args.data_action == "path":
        print(datasets.dataset_path(_registered(args.name, prog)))
        return 0
    if args.all == bool(args.names):
        raise UsageError("name the sets to fetch, or give --all (not both)", prog=prog)
    names = list(datasets.REGISTRY) if args.all else [_registered(name, prog) for name in args.names]
    failed = 0
    for name in dict.fromkeys(names):
        try:
            result = datasets.fetch(name)
        except (datasets.DatasetError, OSError) as exc:
            print(f"fedproto: error: {_one_line(exc)}", file=sys.stderr)
            failed += 1
            continue
        said = {"mirror": "verified in the mirror", "cache": "already in the cache", "downloaded": "downloaded to"}
        print(f"{name}: {said[result.where]} {result.path}")
    return 1 if failed else 0


def _data_list() -> int:
    rows = [("name", "shape", "k", "used by", "licence", "found")]
    for name, entry in datasets.REGISTRY.items():
        try:
            found = datasets.locate(name)
        except datasets.DatasetCorrupted as exc:
            where = f"refused (sha256 differs): {exc.path}"
        else:
            if found is not None:
                where = f"{found[1]}: {found[0]}"
            elif entry.url is None:
                where = f"not fetched (mirror only: fedproto data fetch {name} says why)"
            else:
                where = "not fetched"
        rows.append((name, f"{entry.rows} x {entry.cols}", str(entry.k), entry.used_by, entry.licence, where))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    return 0


@contextmanager
def _logging_to_stderr(verbose: int, level_name: str | None) -> Iterator[None]:
    """Log fedproto's messages to stderr at the level ``-v``/``--log-level`` ask for (nothing is
    installed without them)."""
    if not verbose and level_name is None:
        yield
        return
    level = getattr(logging, level_name) if level_name else (logging.INFO if verbose == 1 else logging.DEBUG)
    logger = logging.getLogger("fedproto")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 run error, 2 usage error, 130 SIGINT,
    143 SIGTERM)."""
    whole_process = argv is None  # this process is the command line (not a caller's library call)
    argv = list(sys.argv[1:] if argv is None else argv)
    epilogue: list[str] = []  # what follows a run's error line: where its report went
    try:
        return _main(argv, epilogue, whole_process=whole_process)
    finally:
        for line in epilogue:
            print(line, flush=True)


def _main(argv: list[str], epilogue: list[str], *, whole_process: bool = False) -> int:
    try:
        args = _parse(argv)
        if args.command in ("run", "party", "split"):
            args.protocol_name = _protocol_name(args.protocol)
        # the fork server first: a zygote copies this process, logging set-up included
        with _party_fork_server(args, zygote=whole_process), _logging_to_stderr(args.verbose, args.log_level):
            _log.debug("fedproto %s: %s", __version__, " ".join(argv))
            if args.command == "list":
                return _command_list()
            if args.command == "data":
                return _command_data(args)
            if args.command == "party":
                return _command_party(args)
            if args.command == "provision":
                return _command_provision(args)
            if args.command == "split":
                args.argv = argv
                return _command_split(args)
            return _command_run(args, argv, epilogue)
    except _QuietExit as exc:
        return exc.code
    except UsageError as exc:
        print(f"fedproto: usage error: {exc} (see {exc.prog} --help)", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help, --version
        return int(exc.code or 0)
    except LaunchInterrupted as exc:
        print(f"fedproto: {exc}", file=sys.stderr)
        return 128 + exc.signum
    except Terminated as exc:
        print(f"fedproto: interrupted by {signal_name(exc.signum)}", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print("fedproto: interrupted", file=sys.stderr)
        return 130
    except (FedProtoError, ValueError, OSError, ImportError) as exc:
        print(f"fedproto: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        leaf = _single_leaf(group)
        if isinstance(leaf, FedProtoError | ValueError | OSError):
            print(f"fedproto: error: {_one_line(leaf)}", file=sys.stderr)
            return 1
        raise


def _protocol_name(spec: str) -> str:
    """The protocol's name for reports: the plugin's ``name``, else the spec's file or module."""
    name = getattr(registry.load_protocol(spec), "name", None)
    if isinstance(name, str) and name:
        return name
    module = spec.rpartition(":")[0] if ":" in spec else spec
    return Path(module).stem if module.endswith(".py") else module


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

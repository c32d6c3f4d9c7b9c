"""The ``fedproto`` command line's parser: the commands, every option and its type, and the
usage errors (exit status 2) found while parsing.

:func:`build_parser` imports only the protocol the command line names and gives it, beside its
own options (the plugin's ``add_arguments``), the ones every protocol shares
(:func:`_common_arguments`: a ``run``, a ``party`` or a ``split``). An option's bad value is a
:class:`UsageError` that names its flag; an unknown option or command gets "did you mean".
:mod:`fedproto.cli` parses with :func:`_parse` and dispatches to the command's module.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fedproto import __version__, registry
from fedproto.compilation import DEVICES
from fedproto.data import PARTITIONS

__all__ = [
    "COMMANDS",
    "LOG_LEVELS",
    "UsageError",
    "_Dropout",
    "_QuietExit",
    "_common_arguments",
    "_did_you_mean",
    "_parse",
    "_subparser",
    "_without_options",
    "build_parser",
    "holds_local_data",
]


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
_INTERNAL_KEYS = {
    "command", "protocol_name", "argv", "network_model", "compute_model", "option_spelling", "fork_server",
}
#: Global options (before the command) that take a value.
_GLOBAL_WITH_VALUE = {"--log-level"}


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
    group.add_argument(
        "--compute-trace", action="store_true",
        help="note each handler's process CPU seconds per party in the report's compute_trace (the input of "
        "--engine lean --network ... --compute trace:REPORT); not with --engine lean",
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
            "--compute", default=None, metavar="measured|fixed:SECONDS|trace:PATH",
            help="with --network: each handler's compute time, measured on this process (default), the "
            "same fixed seconds for every handler (repeatable predictions), or as traced where an earlier run's "
            "parties ran (a report, or a directory of party reports, written with --compute-trace)",
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


def _without_options(tokens: Iterable[str], strip: Mapping[str, bool]) -> list[str]:
    """``tokens`` without the options named in ``strip`` (``{option: takes a value}``), each with
    its value where it takes one (``--option VALUE`` or ``--option=VALUE``)."""
    out: list[str] = []
    remaining = iter(tokens)
    for token in remaining:
        name = token.split("=", 1)[0]
        if name in strip:
            if strip[name] and "=" not in token:
                next(remaining, None)
            continue
        out.append(token)
    return out


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

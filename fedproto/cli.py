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

import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from fedproto import __version__, registry
from fedproto._cli_parser import UsageError, _QuietExit, _parse, build_parser
from fedproto._cli_prepare import _command_data, _command_list, _command_provision, _command_split
from fedproto._cli_run import _command_run
from fedproto._cli_shared import _end_start_up, _log, _one_line, _pause_collector_for_start_up, _single_leaf
from fedproto._cli_tcp import _command_party, _party_fork_server
from fedproto._interrupt import Terminated, signal_name
from fedproto.errors import FedProtoError
from fedproto.launcher import LaunchInterrupted

# Tests and tools import these from here, where they were defined before the command line was
# split by command; each lives in the module named.
from fedproto._cli_parser import _WHOLE_DATA_OPTIONS, _common_arguments, _Dropout, _subparser  # noqa: F401
from fedproto._cli_parser import holds_local_data  # noqa: F401
from fedproto._cli_run import _dropouts, _print_run  # noqa: F401
from fedproto._cli_shared import _compile_cache, _dataset, _frame_limit, _resolved_options  # noqa: F401
from fedproto._cli_shared import _split_parts, local_session  # noqa: F401
from fedproto._cli_tcp import _failed_tcp_report  # noqa: F401

__all__ = ["build_parser", "main"]


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
        _end_start_up()  # where the run did not start (an error before it): the collector runs again
        for line in epilogue:
            print(line, flush=True)


def _main(argv: list[str], epilogue: list[str], *, whole_process: bool = False) -> int:
    if whole_process:
        _pause_collector_for_start_up()  # until the run starts (a run or party command) or now
    try:
        args = _parse(argv)
        if args.command not in ("run", "party"):
            _end_start_up()
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

"""What the example scripts share (not an example itself): their options, and the TCP plumbing.

* :func:`fastlloyd_options` and :func:`deletion_options`: the options of the FastLloyd examples
  (memory, MPI, TCP) and of the deletion examples (memory, TCP). One definition each, so that every
  deployment of an example runs the same federation from the same command line and prints the
  same centroids and bytes.
* What the examples print: :func:`print_centroids`, :func:`print_round_bytes` and, for the
  deletion examples, :func:`print_deletion_bytes` (the bytes each party sent for each deletion).
* The two modes of a TCP example (:func:`run_modes`). Without ``--party`` the script is the launcher:
  :func:`launch_parties` has :func:`fedproto.launch_local` bind one loopback socket per party,
  provision a throwaway kit per party (TLS key and certificate, roster file) and start the script
  once per party; it collects what each party wrote and merges their reports. With ``--party NAME
  --roster KIT/roster.json`` (:func:`add_party_options`) the script is that party:
  :func:`run_party_from_kit` serves its ``TcpTransport`` on the socket it inherited (or on the
  roster's address) and runs only its own machine with :func:`fedproto.run_party`.

The examples are run as ``python examples/<name>.py``; the script's own directory is then first on
``sys.path``, which is how they import this module.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from fedproto import Roster, launch_local
from fedproto.launcher import LaunchError, discard_launched_kit, launch_directory
from fedproto.machine import ProtocolMachine
from fedproto.metering import Meter, RunReport
from fedproto.runtime import RuntimeConfig, run_party
from fedproto.transports.tcp import TcpNetwork

__all__ = [
    "add_party_options",
    "deletion_options",
    "fastlloyd_options",
    "launch_parties",
    "print_centroids",
    "print_deletion_bytes",
    "print_round_bytes",
    "run_modes",
    "run_party_from_kit",
]


def fastlloyd_options(description: str) -> argparse.ArgumentParser:
    """The FastLloyd examples' parser: ``--data`` (iris), ``--clients`` (2), ``--epsilon`` (1.0,
    the differential-privacy budget of the whole run) and ``--seed`` (0)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data", default="iris")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def deletion_options(description: str) -> argparse.ArgumentParser:
    """The deletion examples' parser: ``--data`` (iris), ``--removals`` (5 deletion requests; also
    spelt ``--deletions``, the old name) and ``--seed`` (0)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data", default="iris")
    parser.add_argument("--removals", type=int, default=5, help="deletion requests (default 5)")
    parser.add_argument("--deletions", dest="removals", type=int, help=argparse.SUPPRESS)  # the old spelling
    parser.add_argument("--seed", type=int, default=0)
    return parser


def add_party_options(parser: argparse.ArgumentParser) -> None:
    """The hidden options of party mode, which the launcher passes to each party process."""
    parser.add_argument("--party", help=argparse.SUPPRESS)  # party mode (started by the launcher)
    parser.add_argument("--roster", help=argparse.SUPPRESS)
    parser.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)


def run_party_from_kit(
    args: argparse.Namespace, make_machine: Callable[[int], ProtocolMachine], *, protocol: str, session: int
) -> tuple[Any, RunReport]:
    """Party mode: load this party's kit, serve its endpoint, run its machine to the end.

    Args:
        args: the parsed options, with ``party``, ``roster`` (the kit's roster file) and
            ``listen_fd`` (the socket the launcher bound, or None to bind the roster's address).
        make_machine: builds this party's machine, given the run's session.
        protocol: the protocol's name in the report.
        session: the session when the roster names none.

    Returns:
        The machine's result and this party's report (the frames it sent).
    """
    roster_file = Roster.load(args.roster)
    roster = roster_file.parties
    session = roster_file.session if roster_file.session is not None else session
    machine = make_machine(session)
    listen_fds = {args.party: args.listen_fd} if args.listen_fd is not None else None
    network = TcpNetwork.from_roster(roster_file, listen_fds=listen_fds, session=session)
    meter = Meter(trio.current_time)

    async def run():
        async with network.endpoints(roster, [args.party]) as endpoints:
            discard_launched_kit(args.roster)  # loaded: a kit launch_local made goes (yours stays)
            return await run_party(machine, endpoints[args.party], config=RuntimeConfig(session=session), meter=meter)

    result = trio.run(run)
    return result, meter.report(protocol=protocol, transport="tcp", session=session, parties=roster)


def launch_parties(
    script: str, roster: Sequence[str], options: Sequence[str], *, name: str, session: int, timeout_s: float
) -> tuple[dict[str, Any], RunReport]:
    """Launcher mode: start ``script`` once per party (each on a socket bound for it) and collect
    what each wrote to its ``--out`` file.

    Args:
        script: the example's path (``__file__``).
        roster: the parties, in roster order.
        options: the example's own options, passed on to every party.
        name: the example's name, before the one-line error of a failed run.
        session: the run's session.
        timeout_s: how long the whole run may take (seconds).

    Returns:
        ``{party: its JSON output}`` and the merged report: each process counted the frames it
        sent, so together they count every frame once.

    Raises:
        SystemExit: a party failed or the run timed out (one line, no traceback).
    """
    with launch_directory() as tmp:  # private; a later launch removes it if this one is killed

        def party_command(party: str, roster_file: Path, listen_fd: int) -> list[str]:
            return [sys.executable, script, *options, "--party", party, "--roster", str(roster_file),
                    "--listen-fd", str(listen_fd), "--out", str(Path(tmp, f"{party}.json"))]

        try:
            launch_local(list(roster), party_command, timeout_s=timeout_s, session=session)
        except LaunchError as exc:
            sys.exit(f"{name}: {exc}")
        outputs = {p: json.loads(Path(tmp, f"{p}.json").read_text()) for p in roster}
    return outputs, RunReport.merge([RunReport.from_dict(o["report"]) for o in outputs.values()])


def run_modes(
    parser: argparse.ArgumentParser,
    party_mode: Callable[[argparse.Namespace], None],
    launcher_mode: Callable[[argparse.Namespace], None],
) -> None:
    """A TCP example's ``main``: add the hidden party options to ``parser``, parse the command
    line, and run ``party_mode(args)`` when ``--party`` is given, else ``launcher_mode(args)``."""
    add_party_options(parser)
    args = parser.parse_args()
    if args.party:
        party_mode(args)
    else:
        launcher_mode(args)


def print_centroids(centroids: Sequence[Sequence[float]]) -> None:
    """Print the ``[k, d]`` centroids, one ``c<j>:`` row each, six decimals."""
    print("centroids:")
    for j, row in enumerate(centroids):
        print(f"  c{j}: " + " ".join(f"{v:+.6f}" for v in row))


def print_round_bytes(report: RunReport, *, tcp: bool = False) -> None:
    """Print the payload bytes of every round and the total (with the TCP length prefixes beside
    it when ``tcp``)."""
    for round_idx, nbytes in report.bytes_by_round().items():
        print(f"round {round_idx} bytes: {nbytes}")
    prefixes = f" (+ {report.framing_overhead_bytes} bytes of TCP length prefixes)" if tcp else ""
    print(f"total payload bytes: {report.payload_bytes} in {report.messages} messages{prefixes}")


def print_deletion_bytes(
    report: RunReport, deletions: Sequence[int], owners: Any, root: str, leaves: Sequence[str]
) -> None:
    """Print, for each deletion (round ``r``, 1-based), the payload bytes the root, the point's
    owner and all the other leaves sent in that round: the leaves off the deletion's path send 0.

    Args:
        report: the run's report.
        deletions: the deleted point ids, in order.
        owners: ``owners[point_id]`` is the leaf holding that point.
        root: the root's name.
        leaves: the leaves' names.
    """
    sent: dict[tuple[int, str], int] = {}
    for link in report.links:
        sent[(link.round_idx, link.sender)] = sent.get((link.round_idx, link.sender), 0) + link.payload_bytes
    for r, point_id in enumerate(deletions, start=1):
        owner = owners[point_id]
        others = sum(sent.get((r, leaf), 0) for leaf in leaves if leaf != owner)
        print(f"deletion {r}: point {point_id} at {owner}: root sent {sent.get((r, root), 0)} bytes, "
              f"{owner} sent {sent.get((r, owner), 0)} bytes, the other {len(leaves) - 1} leaves sent {others} bytes")

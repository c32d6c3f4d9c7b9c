"""Check that a plugin's parties, each holding only its own data, compute what the simulation does.

A plugin with ``split`` and ``plan_party`` (see :mod:`fedproto.plugin`) promises that parties
started on their own files (``fedproto split`` + ``fedproto party --data FILE``) give the same
results and payload bytes as ``fedproto run``'s simulation. :func:`run_per_party` runs both in
this process over the memory transport, the way the command line builds them, so a protocol
author's test is three lines::

    from fedproto.testing import run_per_party

    def test_my_parties_on_their_own_files(tmp_path):
        run = run_per_party("path/to/my_protocol.py", ["--data", "iris", "--clients", "3"], tmp_path)
        assert run.per_party_results == run.simulation_results
        assert run.per_party_links == run.simulation_links

The per-party side parses each party's options with the ``fedproto party`` parser (so an option
that a party cannot take fails here as it would there), gives each data-holding party only its
part as written to ``directory`` and read back (:func:`fedproto.data.save_dataset`), adds the
plugin's ``resolved_options`` and builds every machine with ``plan_party``.

The pieces, for the other checks of the same contract:

* :func:`plan_per_party`: the simulation's plan and every party's own plan (a
  :class:`PerPartyPlans`), optionally with the parties' files changed after they are read back
  (:func:`other_feature_count` gives a party a column more or less, to check that it is refused
  by name; :func:`run_with_other_feature_count` plans and runs that in one call);
* :func:`run_over_tcp`: the real command line, ``fedproto run --report`` (the reference),
  ``fedproto split``, ``fedproto provision`` and one ``fedproto party`` process per party over
  TCP (a :class:`TcpRun`: the memory run's report, the split's manifest, every party's
  ``--party-report`` and their union);
* :func:`run_party_processes`: start one process per party, wait for all, kill what is left.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedproto import registry
from fedproto.data import Dataset, load_dataset, save_dataset
from fedproto.errors import FedProtoError
from fedproto.metering import RunReport
from fedproto.testing.runs import LinkKey, link_costs, run_in_memory

__all__ = [
    "PerPartyPlans", "PerPartyRun", "TcpRun", "other_feature_count", "plan_per_party", "run_over_tcp",
    "run_party_processes", "run_per_party", "run_with_other_feature_count",
]

#: Changes the parties' files after they are read back: ``{party: data}`` in, ``{party: data}`` out.
Tamper = Callable[[dict[str, Dataset]], dict[str, Dataset]]


@dataclasses.dataclass(frozen=True)
class PerPartyPlans:
    """The simulation's plan and every party's own plan, for one set of ``fedproto run`` options.

    Attributes:
        dataset: the whole data set the simulation ran on.
        plan: the simulation's plan (``plugin.plan``: every party in one process).
        files: ``{party: path}`` of each data-holding party's file, as ``split`` gave it.
        data: ``{party: Dataset}``: what each data-holding party was given (its file read back,
            then changed by the ``tamper`` of :func:`plan_per_party`, if any).
        plans: ``{party: plan}``: each party's ``plan_party``, in roster order.
    """

    dataset: Any
    plan: Any
    files: Mapping[str, Path]
    data: Mapping[str, Dataset]
    plans: Mapping[str, Any]

    def machines(self) -> dict[str, Any]:
        """``{party: machine}``: each party's machine built by its own plan, in roster order."""
        return {party: plan.make_machine(party) for party, plan in self.plans.items()}


@dataclasses.dataclass(frozen=True)
class PerPartyRun:
    """The simulation and the per-party run of one set of options.

    Attributes:
        roster: the parties, in roster order.
        files: ``{party: path}`` of each data-holding party's file.
        simulation_results, per_party_results: ``{party: result}`` as the plan's
            ``result_to_json`` gives it (JSON-ready dicts).
        simulation_report, per_party_report: the two runs' reports.
        simulation_links, per_party_links: ``{(round, phase, sender, receiver, tag): (messages,
            payload bytes)}`` of each run.
        plans: the plans both runs were built from (:class:`PerPartyPlans`).
    """

    roster: tuple[str, ...]
    files: Mapping[str, Path]
    simulation_results: Mapping[str, Any]
    per_party_results: Mapping[str, Any]
    simulation_report: RunReport
    per_party_report: RunReport
    simulation_links: Mapping[LinkKey, tuple[int, int]]
    per_party_links: Mapping[LinkKey, tuple[int, int]]
    plans: PerPartyPlans


def _run_memory(
    roster: Sequence[str], session: int, machines: Mapping[str, Any], to_json: Any, deadline_s: float
) -> tuple[dict[str, Any], RunReport]:
    """Run ``machines`` over the memory transport; ``to_json(party)`` is that party's
    ``result_to_json``."""
    raw, report = run_in_memory(machines, session, roster=roster, deadline_s=deadline_s, protocol="per-party")
    return {party: to_json(party)(party, raw[party]) for party in roster if party in raw}, report


def _parse(command: str, spec: str, argv: Sequence[str]) -> argparse.Namespace:
    from fedproto._cli_parser import _parse as parse

    args = parse([command, spec, *argv])
    args.protocol_name = getattr(registry.load_protocol(spec), "name", spec)
    return args


def plan_per_party(
    protocol: str,
    run_argv: Sequence[str],
    directory: str | Path,
    *,
    resolved_to_data_holders: bool = True,
    tamper: Tamper | None = None,
) -> PerPartyPlans:
    """The simulation's plan of ``fedproto run PROTOCOL *run_argv`` and every party's plan as
    ``fedproto party`` builds it, each data-holding party given only its own part.

    Each part is written to ``directory/PARTY.npz`` and read back; each party's options are the
    run's without the whole data set's (``--data``, ``--clients``, ``--partition``), parsed by the
    ``fedproto party`` parser, plus the plugin's ``resolved_options``.

    Args:
        protocol: the protocol as the command line names it (see :func:`run_per_party`).
        run_argv: the ``fedproto run`` options.
        directory: where the per-party files are written (an existing, writable directory).
        resolved_to_data_holders: False: a party that holds a file runs without the plugin's
            ``resolved_options``, to check that it works them out from its file (e.g. ``--k``
            from the paper's k the file records); the parties without a file still get them.
        tamper: changes the parts after they are read back, before any ``plan_party`` (e.g.
            :func:`other_feature_count`).

    Returns:
        The :class:`PerPartyPlans`.

    Raises:
        ValueError: the plugin has no ``split`` or ``plan_party``, its split names a party
            outside the roster, or a party's plan has another roster or session than the
            simulation's; whatever the plugin raises for the options.
        fedproto.cli.UsageError: an option the ``run`` or ``party`` command refuses.
    """
    from fedproto._cli_parser import (
        _WHOLE_DATA_OPTIONS,
        _without_options,
        holds_local_data,
    )
    from fedproto._cli_shared import _dataset, _resolved_options, _split_parts

    plugin = registry.load_protocol(protocol)
    if not holds_local_data(plugin):
        raise ValueError(f"{protocol}: its plugin has no split and plan_party (parties cannot hold only their own data)")
    args = _parse("run", protocol, run_argv)
    dataset = _dataset(plugin, args)
    plan = plugin.plan(args, dataset)
    parts = _split_parts(plugin, args, dataset, plan.roster)
    files = {party: save_dataset(Path(directory) / f"{party}.npz", part) for party, part in parts.items()}
    data = {party: load_dataset(str(path)) for party, path in files.items()}
    if tamper is not None:
        data = tamper(data)
    own_argv = _without_options(run_argv, _WHOLE_DATA_OPTIONS)
    resolved = _resolved_options(plugin, args, dataset)
    plans = {}
    for party in plan.roster:
        holds = party in files
        argv = [*own_argv, *([] if holds and not resolved_to_data_holders else resolved)]
        own = ["--data", str(files[party])] if holds else []
        party_args = _parse("party", protocol, [*argv, *own, "--party", party, "--roster", "unused.json"])
        plans[party] = plugin.plan_party(party_args, party, tuple(plan.roster), plan.session, data.get(party))
        if tuple(plans[party].roster) != tuple(plan.roster) or plans[party].session != plan.session:
            raise ValueError(f"{party}'s plan_party gave another roster or session than the simulation's plan")
    return PerPartyPlans(dataset=dataset, plan=plan, files=files, data=data, plans=plans)


def run_per_party(
    protocol: str,
    run_argv: Sequence[str],
    directory: str | Path,
    *,
    deadline_s: float = 60.0,
    resolved_to_data_holders: bool = True,
) -> PerPartyRun:
    """Run ``fedproto run PROTOCOL *run_argv`` in memory, then the same run with every party
    built from only its own part, and return both.

    Args:
        protocol: the protocol as the command line names it (an installed name, a file
            ``path/to/proto.py[:ATTR]`` or a module ``package.module:ATTR``).
        run_argv: the ``fedproto run`` options (``--data``, ``--clients``, the protocol's own);
            transport and output options are not allowed.
        directory: where the per-party files are written (an existing, writable directory).
        deadline_s: the phase deadline of both runs (seconds).
        resolved_to_data_holders: as in :func:`plan_per_party`.

    Returns:
        The :class:`PerPartyRun`; compare its two sides as your protocol requires (results that
        hold timings differ in them).

    Raises:
        ValueError: the plugin has no ``split`` or ``plan_party``, or its split names a party
            outside the roster; whatever the plugin raises for the options.
        fedproto.cli.UsageError: an option the ``run`` or ``party`` command refuses.
    """
    built = plan_per_party(protocol, run_argv, directory, resolved_to_data_holders=resolved_to_data_holders)
    plan, plans = built.plan, built.plans
    simulation_results, simulation_report = _run_memory(
        plan.roster, plan.session, {p: plan.make_machine(p) for p in plan.roster},
        lambda party: plan.result_to_json, deadline_s,
    )
    per_party_results, per_party_report = _run_memory(
        plan.roster, plan.session, built.machines(), lambda party: plans[party].result_to_json, deadline_s
    )
    return PerPartyRun(
        roster=tuple(plan.roster),
        files=built.files,
        simulation_results=simulation_results,
        per_party_results=per_party_results,
        simulation_report=simulation_report,
        per_party_report=per_party_report,
        simulation_links=link_costs(simulation_report),
        per_party_links=link_costs(per_party_report),
        plans=built,
    )


def other_feature_count(party: str, change: int) -> Tamper:
    """A ``tamper`` for :func:`plan_per_party` that gives ``party`` ``change`` features more
    (copies of its first columns, appended) or, when negative, fewer (its last columns dropped);
    its rows, labels, name and paper k stay.

    Raises:
        ValueError: ``change`` is 0.
    """
    if change == 0:
        raise ValueError("change the feature count by at least one")

    def tamper(data: dict[str, Dataset]) -> dict[str, Dataset]:
        x = data[party].x
        x = np.concatenate([x, x[:, :change]], axis=1) if change > 0 else x[:, :change]
        return {**data, party: dataclasses.replace(data[party], x=x)}

    return tamper


def run_with_other_feature_count(
    protocol: str, run_argv: Sequence[str], directory: str | Path, *, party: str, change: int,
    deadline_s: float = 60.0,
) -> tuple[FedProtoError, dict[str, Any]]:
    """Run every party from its own file, ``party``'s given ``change`` features more or fewer
    (:func:`other_feature_count`), over the memory transport, and return how the run failed.

    The per-party plans are :func:`plan_per_party`'s for ``protocol`` and ``run_argv`` (files in
    ``directory``); the run is :func:`~fedproto.testing.run_in_memory`'s, with a phase deadline of
    ``deadline_s`` seconds. A protocol that checks its parties' data should fail it, naming
    ``party``: the caller asserts on the error (its party, phase, round and text) and on the
    machines (which of them failed).

    Returns:
        ``(error, machines)``: the :class:`~fedproto.errors.FedProtoError` the run raised and the
        ``{party: machine}`` it ran, in roster order.

    Raises:
        AssertionError: the run ended without an error.
        ValueError: ``change`` is 0 (as :func:`other_feature_count`).
    """
    built = plan_per_party(protocol, run_argv, directory, tamper=other_feature_count(party, change))
    machines = built.machines()
    try:
        run_in_memory(machines, built.plan.session, deadline_s=deadline_s, protocol=protocol)
    except FedProtoError as error:
        return error, machines
    raise AssertionError(f"{protocol}: a run with {party} given {change:+d} features ended without an error")


# --- the command line over TCP, one OS process per party --------------------------------------------------------

#: ``fedproto`` as a command, run by this interpreter.
_FEDPROTO = (sys.executable, "-m", "fedproto")


@dataclasses.dataclass(frozen=True)
class TcpRun:
    """What :func:`run_over_tcp` ran and read back.

    Attributes:
        memory: the reference run's report (``fedproto run --report DIR/memory.json``).
        manifest: the split's ``DIR/parts/split.json`` (its ``parties`` and ``files`` entries).
        docs: ``{party: its --party-report JSON}`` (``DIR/PARTY.json``: ``result`` and ``report``).
        merged: the union of the parties' own reports (:meth:`RunReport.merge`, transport ``tcp``).
    """

    memory: RunReport
    manifest: Mapping[str, Any]
    docs: Mapping[str, Any]
    merged: RunReport


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _fedproto(argv: Sequence[str], cwd: Path, in_process: bool, timeout_s: float) -> None:
    """``fedproto ARGV``, in this process (the same ``main``) or a subprocess; asserts exit 0."""
    if in_process:
        from fedproto.cli import main

        code = main(list(argv))
        assert code == 0, f"fedproto {' '.join(argv[:2])} exited {code}"
        return
    done = subprocess.run([*_FEDPROTO, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def run_party_processes(
    commands: Mapping[str, Sequence[str]], cwd: Path, *, timeout_s: float, env: Mapping[str, str] | None = None
) -> dict[str, tuple[int, str, str]]:
    """Start one process per party (each in its own session), wait for all, kill what is left.

    Args:
        commands: ``{party: argv}``.
        cwd: their working directory.
        timeout_s: how long to wait for each one, in turn (seconds).
        env: their environment (default: this process's).

    Returns:
        ``{party: (exit code, stdout, stderr)}`` in the order of ``commands``.

    Raises:
        subprocess.TimeoutExpired: a party ran past its timeout (every process group is killed first).
    """
    procs: dict[str, subprocess.Popen] = {}
    try:
        for party, argv in commands.items():
            procs[party] = subprocess.Popen(list(argv), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            text=True, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        outputs = {party: proc.communicate(timeout=timeout_s) for party, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
    return {party: (procs[party].returncode, *outputs[party]) for party in procs}


def run_over_tcp(
    protocol: str,
    run_argv: Sequence[str],
    party_argv: Sequence[str],
    directory: str | Path,
    *,
    hub_argv: Sequence[str] = (),
    run_only: Sequence[str] = (),
    in_process: bool = False,
    timeout_s: float = 300.0,
    env: Mapping[str, str] | None = None,
) -> TcpRun:
    """The real command line, every party in its own process over TCP, and the memory run.

    In ``directory``: ``fedproto run PROTOCOL *run_argv *run_only --quiet --report memory.json``;
    ``fedproto split PROTOCOL *run_argv --out parts``; ``fedproto provision`` of the memory run's
    parties (the first the hub, on a free port of 127.0.0.1) with its session, so that every
    envelope is the same size, into ``kits``; then one ``fedproto party PROTOCOL *party_argv``
    process per party with its kit's roster and ``--party-report PARTY.json``, a data-holding
    party given ``--data parts/FILE`` (its file only), the others ``hub_argv``.

    Args:
        protocol: the protocol as the command line names it.
        run_argv: the options of both ``fedproto run`` and ``fedproto split`` (``--data``...).
        party_argv: every party's options (the run's without the whole data set's, and what a
            party needs spelt out).
        directory: an existing, empty, writable directory.
        hub_argv: the options of the parties that hold no file only (e.g. the plugin's
            ``resolved_options``, which a data-holding party works out from its file).
        run_only: options of ``fedproto run`` only (e.g. ``--no-plot``).
        in_process: run ``run``, ``split`` and ``provision`` in this process (JAX starts once)
            rather than in subprocesses; the parties always get processes of their own.
        timeout_s: the limit of each subprocess (seconds).
        env: the party processes' environment (default: this process's).

    Returns:
        The :class:`TcpRun`.

    Raises:
        AssertionError: a command exited non-zero (with the end of its stderr).
        subprocess.TimeoutExpired: a process ran past ``timeout_s``.
    """
    out = Path(directory)
    _fedproto(["run", protocol, *run_argv, *run_only, "--quiet", "--report", str(out / "memory.json")], out,
              in_process, timeout_s)
    memory = RunReport.from_json((out / "memory.json").read_text())
    _fedproto(["split", protocol, *run_argv, "--out", str(out / "parts")], out, in_process, timeout_s)
    manifest = json.loads((out / "parts" / "split.json").read_text())
    files = {entry["party"]: out / "parts" / entry["file"] for entry in manifest["files"]}
    parties = list(memory.parties)
    _fedproto(["provision", "--parties", ",".join(parties), "--hub", f"127.0.0.1:{_free_port()}",
               "--session", str(memory.session), "--out", str(out / "kits")], out, in_process, timeout_s)
    commands = {}
    for party in parties:
        own = ["--data", str(files[party])] if party in files else list(hub_argv)
        commands[party] = [*_FEDPROTO, "party", protocol, *party_argv, *own, "--party", party,
                           "--roster", str(out / "kits" / party / "roster.json"),
                           "--party-report", str(out / f"{party}.json")]
    for party, (code, _, err) in run_party_processes(commands, out, timeout_s=timeout_s, env=env).items():
        assert code == 0, f"{party}: {err[-3000:]}"
    docs = {party: json.loads((out / f"{party}.json").read_text()) for party in parties}
    merged = RunReport.merge([RunReport.from_dict(doc["report"]) for doc in docs.values()], transport="tcp")
    return TcpRun(memory=memory, manifest=manifest, docs=docs, merged=merged)

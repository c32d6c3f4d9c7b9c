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
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedproto import registry
from fedproto.data import load_dataset, save_dataset
from fedproto.metering import RunReport
from fedproto.testing.runs import LinkKey, link_costs, run_in_memory

__all__ = ["PerPartyRun", "run_per_party"]


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
    """

    roster: tuple[str, ...]
    files: Mapping[str, Path]
    simulation_results: Mapping[str, Any]
    per_party_results: Mapping[str, Any]
    simulation_report: RunReport
    per_party_report: RunReport
    simulation_links: Mapping[LinkKey, tuple[int, int]]
    per_party_links: Mapping[LinkKey, tuple[int, int]]


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


def run_per_party(
    protocol: str, run_argv: Sequence[str], directory: str | Path, *, deadline_s: float = 60.0
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

    Returns:
        The :class:`PerPartyRun`; compare its two sides as your protocol requires (results that
        hold timings differ in them).

    Raises:
        ValueError: the plugin has no ``split`` or ``plan_party``, or its split names a party
            outside the roster; whatever the plugin raises for the options.
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
    simulation_results, simulation_report = _run_memory(
        plan.roster, plan.session, {p: plan.make_machine(p) for p in plan.roster},
        lambda party: plan.result_to_json, deadline_s,
    )

    parts = _split_parts(plugin, args, dataset, plan.roster)
    files = {party: save_dataset(Path(directory) / f"{party}.npz", part) for party, part in parts.items()}
    party_argv = [*_without_options(run_argv, _WHOLE_DATA_OPTIONS), *_resolved_options(plugin, args, dataset)]
    machines = {}
    plans = {}
    for party in plan.roster:
        own = ["--data", str(files[party])] if party in files else []
        party_args = _parse("party", protocol, [*party_argv, *own, "--party", party, "--roster", "unused.json"])
        data = load_dataset(str(files[party])) if party in files else None
        plans[party] = plugin.plan_party(party_args, party, tuple(plan.roster), plan.session, data)
        if tuple(plans[party].roster) != tuple(plan.roster) or plans[party].session != plan.session:
            raise ValueError(f"{party}'s plan_party gave another roster or session than the simulation's plan")
        machines[party] = plans[party].make_machine(party)

    per_party_results, per_party_report = _run_memory(
        plan.roster, plan.session, machines, lambda party: plans[party].result_to_json, deadline_s
    )
    return PerPartyRun(
        roster=tuple(plan.roster),
        files=files,
        simulation_results=simulation_results,
        per_party_results=per_party_results,
        simulation_report=simulation_report,
        per_party_report=per_party_report,
        simulation_links=link_costs(simulation_report),
        per_party_links=link_costs(per_party_report),
    )

"""Run a set of protocol machines, or a plugin's plan, over the memory transport in one call.

A protocol's tests often want "these machines, run to the end, and what they sent":
:func:`run_in_memory` runs ``{party: machine}`` over :class:`fedproto.transports.memory.MemoryNetwork`
with a :class:`fedproto.metering.Meter` on Trio's clock and returns the results and the report;
:func:`run_plan_in_memory` does it for a :class:`fedproto.plugin.RunPlan` (every party's machine
from ``make_machine``, results through ``result_to_json``); :func:`link_costs` keys a report's
links for comparing two runs link by link::

    results, report = run_plan_in_memory(plugin.plan(args, dataset))
    assert link_costs(report) == link_costs(other_report)

Both runners start their own Trio loop (``trio.run``): call them from synchronous tests.
:func:`run_each_party` is the asynchronous one for any transport: every party in its own task,
as separate processes would run them, and how and when each ended.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from fedproto import registry
from fedproto.metering import Meter, RunReport
from fedproto.runtime import RuntimeConfig, run_parties, run_party

__all__ = ["LinkKey", "link_costs", "run_each_party", "run_in_memory", "run_plan_in_memory"]

#: Key of :func:`link_costs`: (round_idx, phase, sender, receiver, tag).
LinkKey = tuple[int, str, str, str, str]


def run_in_memory(
    machines: Mapping[str, Any],
    session: int,
    *,
    roster: Sequence[str] | None = None,
    deadline_s: float | None = None,
    protocol: str = "test",
) -> tuple[dict[str, Any], RunReport]:
    """Run ``machines`` to the end over the memory transport.

    Args:
        machines: ``{party: ProtocolMachine}``, not started.
        session: the session id every frame carries.
        roster: the memory network's roster (default: the parties of ``machines``, in order).
        deadline_s: the phase deadline in seconds (default: :class:`RuntimeConfig`'s).
        protocol: the protocol name written in the report.

    Returns:
        ``({party: result}, report)``: each machine's raw result (as ``run_parties`` returns it)
        and the metered report of the run (transport ``"memory"``).

    Raises:
        Whatever :func:`fedproto.runtime.run_parties` raises (a party's error ends the run).
    """
    parties = list(machines) if roster is None else list(roster)
    config = RuntimeConfig(session=session) if deadline_s is None else RuntimeConfig(session=session, deadline_s=deadline_s)
    meter = Meter(trio.current_time)

    async def go() -> dict[str, Any]:
        network = registry.load_transport("memory")(parties)  # the core does not import transports
        return await run_parties(machines, network, config=config, meter=meter)

    results = trio.run(go)
    return results, meter.report(protocol=protocol, transport="memory", session=session, parties=parties)


def run_plan_in_memory(
    plan: Any,
    *,
    make_machine: Callable[[str], Any] | None = None,
    to_json: Callable[[str], Callable[[str, Any], Any]] | None = None,
    protocol: str = "test",
) -> tuple[dict[str, Any], RunReport]:
    """Run every party of a plugin's plan over the memory transport.

    Args:
        plan: a :class:`fedproto.plugin.RunPlan` (its ``roster``, ``session``, ``make_machine``
            and ``result_to_json`` are used).
        make_machine: builds one party's machine (default: ``plan.make_machine``); per-party
            plans pass ``lambda party: plans[party].make_machine(party)``.
        to_json: ``to_json(party)`` is the ``result_to_json`` for that party's result (default:
            ``plan.result_to_json`` for every party).
        protocol: the protocol name written in the report.

    Returns:
        ``({party: JSON-ready result}, report)`` for the parties that returned a result.
    """
    build = plan.make_machine if make_machine is None else make_machine
    machines = {party: build(party) for party in plan.roster}
    raw, report = run_in_memory(machines, plan.session, roster=plan.roster, protocol=protocol)
    convert = (lambda party: plan.result_to_json) if to_json is None else to_json
    return {party: convert(party)(party, result) for party, result in raw.items()}, report


async def run_each_party(
    machines: Mapping[str, Any],
    transports: Mapping[str, Any],
    config: RuntimeConfig,
    *,
    meter: Meter | None = None,
    order: Sequence[str] | None = None,
) -> dict[str, tuple[float, Any]]:
    """Run every party with :func:`fedproto.runtime.run_party` in its own task, as separate
    processes would, and record how each ended.

    Args:
        machines: ``{party: ProtocolMachine}``, not started.
        transports: ``{party: Transport}`` (the endpoints of any network).
        config: the runtime configuration of every party.
        meter: a meter shared by every party (default: none).
        order: the order in which the parties' tasks start (default: that of ``machines``).

    Returns:
        ``{party: (end time on Trio's clock, result or the exception it raised)}``: a party's
        error does not stop the others.
    """
    outcomes: dict[str, tuple[float, Any]] = {}

    async def one(party: str) -> None:
        try:
            value = await run_party(machines[party], transports[party], config=config, meter=meter)
        except Exception as exc:  # noqa: BLE001 (a party's error is its outcome, recorded)
            value = exc
        outcomes[party] = (trio.current_time(), value)

    async with trio.open_nursery() as nursery:
        for party in machines if order is None else order:
            nursery.start_soon(one, party)
    return outcomes


def link_costs(report: RunReport) -> dict[LinkKey, tuple[int, int]]:
    """A report's links by key: ``{(round_idx, phase, sender, receiver, tag): (messages, payload_bytes)}``.

    Two runs that sent the same frames have equal link costs, whatever their timings.
    """
    return {
        (link.round_idx, link.phase, link.sender, link.receiver, link.tag): (link.messages, link.payload_bytes)
        for link in report.links
    }

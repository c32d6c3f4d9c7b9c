"""The interface between the CLI and a protocol family (found through entry points).

A protocol plugin is registered in ``pyproject.toml`` under the ``fedproto.protocols`` entry-point
group and is an object with:

* ``name`` and ``description``;
* ``add_arguments(parser)``: its own command-line options;
* ``plan(args, dataset) -> RunPlan``: the roster, how to build each party's machine, and how to
  turn results into JSON and a summary;
* optionally ``generated_datasets``: ``{name: (seed) -> Dataset}``, data sets the plugin builds
  itself (a paper's synthetic mixture); ``--data NAME`` picks them before any file lookup.

The core never imports a plugin module directly, so new protocols plug in without touching it.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from fedproto.data import Dataset
from fedproto.machine import ProtocolMachine

__all__ = ["ProtocolPlugin", "RunPlan"]


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """Everything the CLI needs to run one protocol instance on any transport.

    Attributes:
        roster: every party, in roster order (index = MPI rank).
        session: the run's session id (same in every process of the run).
        make_machine: builds the machine of one party (called only for parties this process hosts).
        result_to_json: ``(party, result) -> dict``: a party's result as JSON-ready data.
        summarize: ``{party: result json} -> dict`` of metrics to print and store (may run other
            computations, e.g. baselines).
        role_of: party name -> role name (for bytes per role).
        iterations: algorithm rounds expected (for progress bars).
        analytic: analytic costs to print beside the measured ones, e.g. bytes per iteration.
        phases: the protocol's phases in message order (for tables and plots).
        plot_results: ``(axis, summary) -> None`` draws the protocol's results (e.g. clusters)
            on a matplotlib axis, or ``None``.
    """

    roster: tuple[str, ...]
    session: int
    make_machine: Callable[[str], ProtocolMachine]
    result_to_json: Callable[[str, Any], dict[str, Any]]
    summarize: Callable[[Mapping[str, dict[str, Any]]], dict[str, Any]]
    role_of: Callable[[str], str]
    iterations: int
    analytic: dict[str, Any] = dataclasses.field(default_factory=dict)
    phases: tuple[str, ...] = ()
    plot_results: Callable[[Any, Mapping[str, Any]], None] | None = None


class ProtocolPlugin(Protocol):
    """What the ``fedproto.protocols`` entry points must provide."""

    name: str
    description: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the protocol's own options."""

    def plan(self, args: argparse.Namespace, dataset: Dataset) -> RunPlan:
        """Build the run plan.

        Raises:
            ValueError: the arguments do not fit the data (e.g. k > n).
        """

"""The interface between the CLI and a protocol family.

A protocol plugin is an object with:

* ``name`` and ``description`` (one line, shown by ``fedproto list``);
* ``add_arguments(parser)``: its own command-line options (optional); it may also change the
  default of a common option (``parser.set_defaults(clients=5)``), which ``--help`` then shows;
* ``plan(args, dataset) -> RunPlan``: the roster, how to build each party's machine, and how to
  turn results into JSON and a summary;
* optionally ``needs_data = False``: a protocol without data (a secure sum, gossip); the CLI then
  adds no data options (``--data``, ``--partition``) and calls ``plan(args, None)``;
* optionally ``partitions`` and ``default_partition``: the ``--partition`` schemes the plugin
  understands, when they are not :data:`fedproto.data.PARTITIONS` (``iid``, ``uneven``,
  ``label-skew``) with default ``iid`` (MUFC offers the paper's ``noniid`` split and a file's own);
* optionally ``generated_datasets``: ``{name: (seed) -> Dataset}``, data sets the plugin builds
  itself (a paper's synthetic mixture); ``--data NAME`` picks them before any file lookup.
* optionally, so that each party can hold **only its own data** (parties on separate machines),
  the three methods below. With them, ``fedproto split`` writes each data-holding party's part
  to its own file, ``fedproto party --data FILE`` runs a party on its file alone, and ``fedproto
  run --transport tcp`` gives each party process only its part:

  - ``split(args, dataset) -> {party: Dataset}``: the raw (not normalised) rows of every
    data-holding party of the run that ``plan(args, dataset)`` describes;
  - ``plan_party(args, party, roster, session, data) -> RunPlan``: the plan of one party that
    holds only ``data`` (``None`` for a party without data), for the parties ``roster`` (from
    the roster file: the number of clients is read there, not from ``--clients``) and the
    session id ``session`` (the roster's, else one derived from the protocol, the roster and
    ``--seed``). Its ``make_machine`` need only build ``party``; ``summarize`` is not called;
  - ``resolved_options(args, dataset) -> list[str]``: command-line tokens that spell out options
    whose default depends on the whole data set (``["--k", "15"]``), given to the launcher's
    party processes (optional; ``[]`` by default).

  Whatever public quantity the machines need from the whole federation (the total number of
  points, the features' extent) is then agreed in a metered setup phase of the protocol
  (``setup.data``), and ``plan`` builds every machine exactly as ``plan_party`` does, from its own
  part, so that a run over per-party files gives the simulation's result and payload bytes.

``fedproto run`` finds it by the name it is registered under in the ``fedproto.protocols``
entry-point group of an installed package, or, without packaging, in a Python file
(``fedproto run path/to/proto.py[:ATTR]``) or module (``fedproto run package.module:ATTR``);
``ATTR`` defaults to ``PROTOCOL``. Only the plugin a command names is imported. The core never
imports a plugin module directly, so new protocols plug in without touching it.
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
            computations, e.g. baselines, reporting them with
            :func:`fedproto.progress.progress_task`). An entry ``"paper"`` (a dict) holds
            figures from the paper; the CLI moves it to the report's ``paper``. An entry
            ``"privacy"`` (a dict) holds the privacy ledger of a run that adds noise
            (:func:`fedproto.algorithms.dp.privacy_ledger`); the CLI moves it to the report's
            ``privacy``.
        role_of: party name -> role name (for bytes per role).
        iterations: algorithm rounds expected (for progress bars).
        analytic: analytic costs to print beside the measured ones, e.g. bytes per iteration.
        phases: the protocol's phases in message order (for tables and plots).
        plot_results: ``(axis, summary) -> None`` draws the protocol's results (e.g. clusters)
            on a matplotlib axis, or ``None``.
        labels: result key -> human label for the terminal tables (e.g. ``{"nicv": "NICV"}``);
            a key without one is shown with ``_`` as spaces. The JSON report keeps the keys.
        max_frame_bytes: the largest frame (bytes, envelope included) any party of this run can
            legitimately send, from the run's options and data sizes: the largest of
            :func:`fedproto.framesize.max_frame_bytes` over the messages its parties send, at
            the shapes they take in this run; ``None`` when the plugin states none. The CLI
            makes every party refuse larger frames (the smaller of this and
            ``--max-frame-bytes``, raised to fit the runtime's own abort notice), so a peer
            cannot make a party read and decode more than the protocol needs.
        dropout_stages: the phases (envelope phase names, each one of ``phases`` when ``phases``
            is given) at which a client of this run may drop out and the protocol carries on
            without it; ``fedproto run --dropout-rate`` draws its dropouts among them, and
            ``--dropout``/``--dropout-rate`` are refused when there are none (the default).
        dropout_unsupported: why this run supports no dropout, in one line the CLI shows when it
            refuses ``--dropout`` (e.g. ``"fastlloyd supports dropout only with --secagg
            plus"``); ``""`` for a generic message.

    Raises:
        ValueError: ``max_frame_bytes`` is not a positive int, or ``dropout_stages`` holds a name
            that is empty or not one of ``phases``.
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
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    max_frame_bytes: int | None = None
    dropout_stages: tuple[str, ...] = ()
    dropout_unsupported: str = ""

    def __post_init__(self) -> None:
        limit = self.max_frame_bytes
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise ValueError(f"RunPlan.max_frame_bytes must be a positive int or None, got {self.max_frame_bytes!r}")
        stages = () if isinstance(self.dropout_stages, str) else tuple(self.dropout_stages)
        if isinstance(self.dropout_stages, str) or not all(isinstance(stage, str) and stage for stage in stages):
            raise ValueError(f"RunPlan.dropout_stages must be non-empty phase names, got {self.dropout_stages!r}")
        unknown = [stage for stage in stages if self.phases and stage not in self.phases]
        if unknown:
            raise ValueError(f"RunPlan.dropout_stages {unknown} are not among the plan's phases {list(self.phases)}")
        object.__setattr__(self, "dropout_stages", tuple(dict.fromkeys(stages)))


class ProtocolPlugin(Protocol):
    """What a protocol plugin provides (see the module docstring for the optional parts)."""

    name: str
    description: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the protocol's own options (and change common defaults with ``parser.set_defaults``)."""

    def plan(self, args: argparse.Namespace, dataset: Dataset | None) -> RunPlan:
        """Build the run plan (``dataset`` is ``None`` for a plugin with ``needs_data = False``).

        Raises:
            ValueError: the arguments do not fit the data (e.g. k > n).
        """

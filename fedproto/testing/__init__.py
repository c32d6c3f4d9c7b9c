"""Public test helpers for protocol and transport authors.

* :class:`Harness` and :class:`Frame`: drive protocol machines against each other synchronously,
  through the real codec and meter, without Trio or sockets.
* :class:`Faults` and :class:`CrashPoint`: seeded fault injection (drop, duplicate, delay, crash
  after N frames or at a phase and round) for the memory transport
  (``MemoryNetwork(roster, faults=Faults(...))``).
* :func:`run_conformance`, :data:`CHECKS` and :func:`check_close_semantics`: the transport
  conformance suite, for a new transport's tests.
* :func:`run_per_party` and :class:`PerPartyRun`: run a plugin's simulation and the same run
  with every party built from only its own file (``split`` + ``plan_party``), to check they
  agree in results and payload bytes; :func:`plan_per_party` (:class:`PerPartyPlans`) builds
  those plans, :func:`other_feature_count` changes a party's file to check it is refused
  (:func:`run_with_other_feature_count` runs that and returns the error), and
  :func:`run_over_tcp` (:class:`TcpRun`) runs ``fedproto split``, ``provision`` and one
  ``fedproto party`` process per party over TCP (:func:`run_party_processes`) beside the memory run.
* The toy protocol (federated sum): :class:`SumCoordinator`, :class:`SumWorker` and their messages
  :class:`Query`, :class:`Contribution`, :class:`Finished`, a small complete protocol to test
  runtimes and transports with; :func:`sum_machines` builds a whole federation of it and
  :func:`expected_sums` is its result; :class:`SumPlugin` is it as a command-line plugin.
* :func:`run_in_memory`, :func:`run_plan_in_memory` and :func:`link_costs`: run machines or a
  plugin's plan over the memory transport in one call, and compare two runs link by link;
  :func:`run_each_party`: every party in its own task over any transport, and how each ended.
* :func:`load_file`: import a script, a tutorial or a test's helper file by its path.
* :mod:`fedproto.testing.netns` (imported by name): a star of Linux network namespaces standing
  for hosts, for tests and benchmarks across hosts (needs root).
"""

from typing import TYPE_CHECKING

from fedproto._lazy import lazy_exports

if TYPE_CHECKING:
    from fedproto.testing.conformance import CHECKS, check_close_semantics, run_conformance
    from fedproto.testing.faults import CrashPoint, DelegatingTransport, Faults
    from fedproto.testing.files import load_file
    from fedproto.testing.harness import Frame, Harness
    from fedproto.testing.local_data import (
        PerPartyPlans, PerPartyRun, TcpRun, other_feature_count, plan_per_party, run_over_tcp, run_party_processes,
        run_per_party, run_with_other_feature_count,
    )
    from fedproto.testing.runs import link_costs, run_each_party, run_in_memory, run_plan_in_memory
    from fedproto.testing.toy import (
        Contribution, Finished, Query, SumCoordinator, SumPlugin, SumWorker, expected_sums, sum_machines,
    )

# Each helper loads on first use (PEP 562): the memory transport imports only the fault injection
# (fedproto.testing.faults), not the conformance suite, the harness or the toy protocol.
_LAZY = {
    **dict.fromkeys(("CHECKS", "check_close_semantics", "run_conformance"), "conformance"),
    **dict.fromkeys(("CrashPoint", "DelegatingTransport", "Faults"), "faults"),
    **dict.fromkeys(("Frame", "Harness"), "harness"),
    **dict.fromkeys(
        ("PerPartyPlans", "PerPartyRun", "TcpRun", "other_feature_count", "plan_per_party", "run_over_tcp",
         "run_party_processes", "run_per_party", "run_with_other_feature_count"),
        "local_data",
    ),
    **dict.fromkeys(("load_file",), "files"),
    **dict.fromkeys(("link_costs", "run_each_party", "run_in_memory", "run_plan_in_memory"), "runs"),
    **dict.fromkeys(
        ("Contribution", "Finished", "Query", "SumCoordinator", "SumPlugin", "SumWorker", "expected_sums", "sum_machines"),
        "toy",
    ),
}

__getattr__, __dir__ = lazy_exports(globals(), {name: f".{module}" for name, module in _LAZY.items()})


__all__ = [
    "CrashPoint",
    "DelegatingTransport",
    "Harness",
    "Frame",
    "Faults",
    "run_conformance",
    "CHECKS",
    "check_close_semantics",
    "PerPartyPlans",
    "PerPartyRun",
    "TcpRun",
    "other_feature_count",
    "plan_per_party",
    "run_over_tcp",
    "run_party_processes",
    "run_per_party",
    "run_with_other_feature_count",
    "SumCoordinator",
    "SumWorker",
    "SumPlugin",
    "Query",
    "Contribution",
    "Finished",
    "sum_machines",
    "expected_sums",
    "run_each_party",
    "run_in_memory",
    "run_plan_in_memory",
    "link_costs",
    "load_file",
]

"""The link model's predicted wall time against a real network, and against the FastLloyd paper.

What it measures
----------------
**Predicted against measured** (issue 31, part 3). For FastLloyd on S1 and MUFC on Celltype
(``--partition iid``), 10 clients each, fixed seeds, at a one-way link latency of 1 ms and 25 ms:

* ``predicted s, lean compute``: ``fedproto run PROTOCOL ... --engine lean --network NET.json --compute
  measured``, the report's ``prediction.wall_time_s``, with ``NET.json`` the deployment the
  measured side runs on: ``{"topology": "star", "default": {"latency_s": L,
  "bandwidth_bytes_per_s": null}, "hosts": {"vm": {"cores": C, "parties": "*"}}, "per_frame_s":
  F, "compile": "per_party", "first_kernel_s": K, "connect_trips": 4, "connect_s": S}``: every
  party on this machine's C cores (``os.cpu_count()``); F, K and S this machine's figures,
  measured first (below);
  every party's process paying its own kernels' compilation or cache loading (as the lean
  process measured it for the first party that ran each kernel) and its first kernel's one-time
  set-up; and a client's connection able to carry its first frame only after ``connect_trips``
  = 4 one-way latencies (:data:`CONNECT_TRIPS`: what remains of TCP, TLS 1.3 and fedproto's
  hello in this harness, where the relay ends TCP locally). One unused lean run first fills
  JAX's persistent compile
  cache, so both sides load compiled kernels instead of compiling; then the median prediction
  of :data:`PREDICTION_RUNS` lean runs (measured compute, compilation above all, varies from
  run to run by tens of percent here);
* ``measured s``: the same run as 11 TLS parties, one process each, each in its own network
  namespace, every client-hub link through a user-space relay that delays every chunk by L each
  way (``benchmarks/_netns_star.py``, ``benchmarks/_delay_relay.py``; this kernel has no ``tc
  netem``); the parties are started warm (imports done) and let go together
  (``benchmarks/_party_at_go.py``). One unmeasured run of each protocol (at the first latency)
  comes first, to fill the persistent compile cache for the parties' own kernels; then the
  median of :data:`MEASURED_RUNS` runs. The measured span is **from the last party's start**
  (its meter's start) **to the last party's finish**: the span the model predicts, where every
  party starts at 0. What it leaves out is printed beside it: the merged report's
  ``wall_time_s`` (the longest party run) and the start skew (first to last meter start after
  "go": eleven command lines starting on the same cores). The parties run with
  ``--compute-trace``: the merged report holds each handler's process CPU seconds;
* ``predicted s, parties' compute``: the same lean run with ``--compute trace:`` the measured
  run's own report: every handler charged the CPU its party's process spent on it, where the
  parties ran, instead of what it costs in the lean process. This is **the check**: the link
  model (latencies, queueing, the cores the processes share, the per-frame, first-kernel and
  connection costs) apart from the compute, which eleven processes on two cores inflate (a
  FastLloyd client's handler takes about twice its lean-process CPU there: cold caches);
* ``predicted s, other latency's trace``: the same, from the trace of the same protocol's run at
  the other latency (compute measured once, other links predicted: what a deployment does);
* each ``ratio`` = predicted / measured; ``within 15%`` is the check's (0.85 to 1.15).

**The machine's figures**, measured before the check, with other protocols than the check's
(nothing is fitted to the check's own times):

* the per-frame cost ``F`` (:func:`_frame_cost.deployment_per_frame_s`): the full-runtime round
  trip of a ping and a pong machine (``tcp_rate.py``'s, a 24 B payload) between two party
  processes in two namespaces, the client's link through the relay at 0 ms, the median of 3 runs
  of 2,000 round trips, divided by 4 (a round trip is two frames, each charged at its sender and
  its receiver). It holds what a frame costs on the measured side's path: TLS, the runtime, the
  relay's two threads and sockets and the processes' wake-ups, all on the same cores. The
  same figure over a loopback TLS star in one process (:func:`measure_per_frame_s`, without the
  relay and the wake-ups; the model's figure where namespaces cannot be made) is printed beside
  it. Both include the codec's encoding and decoding of a 24 B frame (microseconds), which the
  lean run measures as compute too;
* a process's first kernel ``K`` (:func:`measure_first_kernel_s`): in a fresh process set up as
  ``fedproto party`` sets it up, the first call of a trivial jitted kernel less the first call of
  a second one, both loaded from the persistent compile cache; the median of 5 processes;
* a connection's set-up CPU at each end ``S`` (:func:`measure_connect_s`): TLS stars of two
  endpoints opened in one process (both ends' TLS 1.3 handshakes and fedproto's hello) with one
  round trip; the process CPU of one, less the round trip's four per-frame costs (the loopback
  figure), halved; the median of 7.

A second table says where the time goes: round 0 (connections, key agreement and the first
update, with the kernels' first compilation or cache load) and the steady rounds (median of the
middle rounds), predicted (the prediction's per-round wall times, from the lean compute and from
the parties' trace) against measured (round 0: from
the last party's start to the hub's first frame of round 1; a round: the hub's ``round_wall_s``,
its first frame of a round to its first of the next); the measured parties' start skew and the
merged report's wall time (both left out of ``measured s``); the lean run's ``compile_s`` and the
longest ``compile_s`` of a TCP party (tracing, lowering and compiling or cache loading, which each
party process pays for its own kernels: in the measured span, and in the prediction only as far
as the lean process paid it once).

The measured side needs root and ``ip netns``; without them its columns say why and only the
predictions are printed.

**The FastLloyd paper's Table 3, LAN rows**: M = 2 clients, epsilon = 0.1, ``--network lan``
(the paper's code: 0.125 ms slept before each gather and each broadcast), ``--compute measured``;
``predicted ms/iter`` = the predicted wall time / T (the paper's method: the whole protocol call
over T; here it includes the kernels' compilation or compile-cache load, ``compile s``, which the
paper's warm MPI ranks, timed over 100 runs, did not pay), ``less compile ms/iter`` = (the
predicted wall time - ``compile s``) / T, compared with the paper's FastLloyd ms (an M2 Max with
30 cores, 3 MPI ranks; here a 2-core VM) in ``ratio``, and ``steady round ms`` (the median
predicted round after the first). TimeSynth is not a data set fedproto ships or fetches: the rows use the
TimeSynth-like stand-in of ``benchmarks/fastlloyd_timing.py`` (:func:`fastlloyd_timing.timesynth`:
k equal Gaussian clusters, nearest centres 22.2 stds apart, in place of R's clusterGeneration
with sepVal 0.70), written to an ``.npz`` that ``--data`` reads.

Run::

    python benchmarks/network_model.py            # both protocols x 1 and 25 ms; Table 3's LAN rows
    python benchmarks/network_model.py --quick    # FastLloyd only (1 and 25 ms); LSun, S1, TimeSynth 10K k=5 d=2
    python benchmarks/network_model.py --profile  # also: FastLloyd without the relay, the relay at 0 ms, 2 clients
    python benchmarks/network_model.py --json nm.json

``--profile`` adds FastLloyd rows that tell the model's misses apart: the veths alone (no relay;
the hub listens on the roster's address) and the relay at 0 ms, both against the model at 0 ms
(the relay's own cost), and 2 clients against 10 at 1 ms (three processes on the two cores
against eleven).

With ``FEDPROTO_NETCHECK_FRAMES=1`` in the environment the measured parties also note every
frame's send and receive time and every handler's wall and CPU time (:mod:`_party_at_go`;
:attr:`_netns_star.TcpRun.frames`), for tracing where a run's time goes against the
prediction's phases.

``--json PATH`` writes one record per row: table ``network_model`` (``protocol``, ``data_set``,
``clients``, ``latency_ms``, ``relay``, ``cores``, ``per_frame_s``, ``first_kernel_s``, ``connect_s``,
``predicted_s`` (lean compute), ``measured_s`` (``null`` where it could not be measured, as every
``measured_*``; from the last party's start), ``ratio``, ``predicted_traced_s`` (the parties'
compute), ``traced_ratio``, ``untraced_handlers`` and ``unused_trace_figures`` (handlers the trace had no
figure for, figures no handler took: both 0, the trace being the same run's),
``within_15_percent`` (of ``traced_ratio``), ``predicted_cross_s``, ``cross_ratio``,
``cross_trace_latency_ms`` (the other latency's trace), ``latency_hops``,
``predicted_compute_s``, ``predicted_round0_s``, ``predicted_steady_round_ms``,
``predicted_traced_round0_s``, ``predicted_traced_steady_round_ms``,
``measured_start_skew_s``, ``measured_merged_wall_s``, ``measured_round0_s``,
``measured_steady_round_ms``, ``lean_compile_s``, ``tcp_compile_s``), with ``--profile`` table
``network_model_profile`` (the same keys), and table ``network_model_paper``
(``data_set``, ``n_points``, ``k``, ``d``, ``iterations``, ``predicted_ms_per_iteration``,
``predicted_warm_ms_per_iteration`` (compilation set apart), ``paper_ms_per_iteration``, ``ratio`` (of
the warm figure to the paper's), ``predicted_steady_round_ms``, ``compile_s``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from _common import (
    PAYLOAD_SHAPES,
    add_common_arguments,
    make_console,
    parse_args,
    payload_array,
    print_machine_facts,
    record,
    write_records,
)
from _frame_cost import deployment_per_frame_s
from _netns_star import NetnsUnavailable, netns_unavailable_reason, run_tcp_star
from fastlloyd_timing import timesynth
from rich.table import Table
from tcp_rate import SESSION, runtime_round_trips

from fedproto.data import Dataset, find_data_file, save_dataset
from fedproto.provision import FederationCA
from fedproto.transports.tcp import open_tcp_network

TITLE = "Link model: predicted against measured wall time (TCP parties in namespaces, delaying relay)"
SPLIT_TITLE = ("Where the time goes: round 0 (from the last party's start to the hub's first frame of round 1), "
               "steady rounds (the hub's, first frame to first frame; the median of the middle rounds), start skew of "
               "the parties, the run after the last party started")
PROFILE_TITLE = ("Profile (--profile), FastLloyd on S1: the veths alone (no relay), the relay at 0 ms, "
                 "2 clients (3 processes on the 2 cores) and 10 clients at 1 ms")
PAPER_TITLE = "FastLloyd paper, Table 3 LAN rows (M = 2, 0.125 ms per gather and per broadcast): ms per iteration"
CLIENTS = 10
TOLERANCE = 0.15
LATENCIES_MS = (1.0, 25.0)


@dataclasses.dataclass(frozen=True)
class Case:
    """A protocol run to predict and measure."""

    protocol: str
    data: str
    options: tuple[str, ...]
    split_options: tuple[str, ...] = ()

    def argv(self, clients: int) -> list[str]:
        """``fedproto run``'s arguments for this case with ``clients`` clients (the whole data set,
        cut as ``fedproto split`` cuts it for the measured parties)."""
        return [self.protocol, "--data", self.data, "--clients", str(clients), *self.split_options, *self.options]


#: FastLloyd with its defaults on S1; MUFC cut to a few seconds of compute (2 removals, one
#: retraining, 2 k-means++ restarts, no baselines) with an iid split into 10 clients (the
#: default split of Celltype is its own 100 clients).
CASES = (
    Case("fastlloyd", "s1", ("--seed", "0")),
    Case("mufc", "celltype", ("--seed", "0", "--removals", "2", "--retrains", "1", "--n-init", "2", "--no-baselines"),
         ("--partition", "iid")),
)
#: Table 3's FastLloyd LAN rows: (data set, N, k, d) -> paper ms per iteration.
PAPER_ROWS: dict[tuple[str, int, int, int], float] = {
    ("lsun", 400, 3, 2): 2.6,
    ("s1", 5000, 15, 2): 5.81,
    ("timesynth", 10_000, 2, 2): 3.03,
    ("timesynth", 10_000, 2, 5): 3.24,
    ("timesynth", 10_000, 5, 2): 4.32,
    ("timesynth", 10_000, 5, 5): 4.95,
    ("timesynth", 100_000, 2, 2): 12.57,
    ("timesynth", 100_000, 2, 5): 13.17,
    ("timesynth", 100_000, 5, 2): 22.05,
    ("timesynth", 100_000, 5, 5): 22.56,
}
QUICK_PAPER_ROWS = (("lsun", 400, 3, 2), ("s1", 5000, 15, 2), ("timesynth", 10_000, 5, 2))


#: Lean runs per prediction of the check (after the unused warm-up run), and measured TCP runs
#: per row (after the warm-up run of its protocol); the median of each is used.
PREDICTION_RUNS = 5
MEASURED_RUNS = 3
#: The same with ``--quick``.
QUICK_RUNS = (3, 1)


def predict(argv: list[str], network: str, workdir: Path, *, warm: bool = False, runs: int = 1,
            compute: str = "measured") -> dict[str, Any]:
    """The lean engine's report for ``fedproto run ARGV --engine lean --network NETWORK
    --compute measured`` (a fresh process); ``warm``: run it once first, unused, so that the
    reported run loads its kernels from the persistent compile cache; ``runs`` > 1: the report
    of median predicted wall time among that many runs (measured compute varies with what else
    the cores run).

    Raises:
        RuntimeError: the run failed (its last error line) or its report has no prediction.
    """
    if warm:
        predict(argv, network, workdir)
    if runs > 1:
        docs = sorted((predict(argv, network, workdir) for _ in range(runs)),
                      key=lambda doc: doc["prediction"]["wall_time_s"])
        return docs[(runs - 1) // 2]
    report = workdir / "lean.json"
    done = subprocess.run(
        [sys.executable, "-m", "fedproto", "run", *argv, "--engine", "lean", "--network", network,
         "--compute", compute, "--quiet", "--no-plot", "--report", str(report)],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise RuntimeError(f"fedproto run {' '.join(argv)} --engine lean: {done.stderr.strip()[-1000:]}")
    doc = json.loads(report.read_text())
    if not doc.get("prediction"):
        raise RuntimeError(f"fedproto run {' '.join(argv)} --engine lean --network: the report has no prediction")
    return doc


#: The measured side's machine: every party process on these cores.
CORES = os.cpu_count() or 1
#: The per-frame measurement: round trips per run, runs (the best is kept).
FRAME_ROUND_TRIPS, FRAME_REPEATS = 2_000, 3


def _two_kits(directory: Path) -> dict[str, Any]:
    """TLS kits of a throwaway federation of two parties, ``a`` and ``b``, written under ``directory``."""
    ca = FederationCA.create()
    kits = {}
    for party in ("a", "b"):
        (directory / party).mkdir()
        kits[party] = ca.issue(party).write(directory / party)
    return kits


def measure_per_frame_s(round_trips: int = FRAME_ROUND_TRIPS, repeats: int = FRAME_REPEATS) -> float:
    """The per-frame cost on this machine (seconds; see the module docstring): the best
    full-runtime round trip of a 24 B payload over a loopback TLS star, divided by 4."""
    array = payload_array(PAYLOAD_SHAPES["24 B"], seed=0)

    async def best() -> float:
        with tempfile.TemporaryDirectory(prefix="fedproto-frame-") as tmp:
            kits = _two_kits(Path(tmp))
            async with open_tcp_network(["a", "b"], tls=kits, topology="star", session=SESSION) as endpoints:
                await runtime_round_trips(endpoints, array, 20)  # handshakes and first frames, untimed
                return min([await runtime_round_trips(endpoints, array, round_trips) for _ in range(repeats)])

    return trio.run(best) / round_trips / 4


#: One-way trips of connection set-up before a client's first frame, in this harness (stated
#: from the handshake, not fitted; docs/transports.md "Connection set-up"): the relay ends TCP
#: locally (its SYN and SYN-ACK are not delayed), then the client's TLS ClientHello (1), the
#: hub's TLS 1.3 flight (2), the client's Finished with fedproto's hello (3) and the hub's
#: ["ok"] (4). A cold start over real links adds TCP's SYN and SYN-ACK: 6. (This was 3, on the
#: premise that the hub starts last with the ClientHellos already in its backlog; traced runs
#: showed clients starting after the hub, the last one writing its first frame 4.4 latencies
#: after its start.)
CONNECT_TRIPS = 4


#: A fresh process's first two kernels (see :func:`measure_first_kernel_s`): JAX set up as
#: ``fedproto party`` sets it up, then two trivial kernels, each timed over its first call.
_FIRST_KERNEL_SCRIPT = """
import time
import fedproto.algorithms
from fedproto.compilation import enable_compile_cache, select_device
import jax
select_device("auto")
enable_compile_cache()
x = jax.device_put(1.0)
first, second = jax.jit(lambda v: v + 1.0), jax.jit(lambda v: v * 2.0 - 1.0)
began = time.perf_counter(); first(x).block_until_ready(); a = time.perf_counter() - began
began = time.perf_counter(); second(x).block_until_ready(); b = time.perf_counter() - began
print(repr(a - b))
"""
#: Fresh processes timed for the first-kernel cost (after one that fills the compile cache).
FIRST_KERNEL_RUNS = 5


def measure_first_kernel_s(runs: int = FIRST_KERNEL_RUNS) -> float:
    """A fresh process's one-time cost of its first JAX kernel on this machine (seconds): the
    first call of a trivial kernel less the first call of a second trivial kernel in the same
    process, both loaded from the persistent compile cache (one process first fills it), the
    median over ``runs`` processes. Measured apart from the check (no protocol runs)."""
    def once() -> float:
        done = subprocess.run([sys.executable, "-c", _FIRST_KERNEL_SCRIPT], check=False, capture_output=True, text=True,
                              timeout=300, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"the first-kernel measurement failed: {done.stderr.strip()[-1000:]}")
        return float(done.stdout.strip().splitlines()[-1])

    once()
    return max(statistics.median(once() for _ in range(runs)), 0.0)


#: Connections timed for the connection CPU (after two untimed ones).
CONNECT_RUNS = 7


def measure_connect_s(loopback_per_frame_s: float, runs: int = CONNECT_RUNS) -> float:
    """The CPU seconds a connection's set-up costs each end on this machine: a TLS star of two
    endpoints opened in this process (both ends' TLS 1.3 handshakes and fedproto's hello) with
    one full-runtime round trip, closed; its process CPU, less the round trip's four per-frame
    costs, halved; the median of ``runs`` (after two untimed ones). Measured apart from the check."""
    array = payload_array(PAYLOAD_SHAPES["24 B"], seed=0)

    async def opened(kits: dict) -> float:
        began = time.process_time()
        async with open_tcp_network(["a", "b"], tls=kits, topology="star", session=SESSION) as endpoints:
            await runtime_round_trips(endpoints, array, 1)
        return time.process_time() - began

    async def all_runs() -> list[float]:
        with tempfile.TemporaryDirectory(prefix="fedproto-connect-") as tmp:
            kits = _two_kits(Path(tmp))
            for _ in range(2):
                await opened(kits)
            return [await opened(kits) for _ in range(runs)]

    return max((statistics.median(trio.run(all_runs)) - 4 * loopback_per_frame_s) / 2, 0.0)


def star_network(path: Path, latency_s: float, *, cores: int | None = None, per_frame_s: float = 0.0,
                 first_kernel_s: float = 0.0, connect_s: float = 0.0, connect_trips: int = CONNECT_TRIPS) -> str:
    """Write the star link file of one latency, every party on one host of ``cores`` cores (a
    host each when ``None``), the per-frame cost, every party compiling its own kernels (as
    the measured parties, one process each, do) and paying its process's first kernel, and
    ``connect_trips`` one-way trips and ``connect_s`` of each end's CPU of connection set-up;
    returns its path."""
    doc: dict[str, Any] = {"topology": "star", "default": {"latency_s": latency_s, "bandwidth_bytes_per_s": None},
                           "per_frame_s": per_frame_s, "compile": "per_party", "first_kernel_s": first_kernel_s,
                           "connect_trips": connect_trips, "connect_s": connect_s}
    if cores is not None:
        doc["hosts"] = {"vm": {"cores": cores, "parties": "*"}}
    path.write_text(json.dumps(doc) + "\n")
    return str(path)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def warm_up(case: Case, clients: int, latency_ms: float) -> None:
    """One unmeasured TCP run of ``case`` (fills the persistent compile cache for the parties'
    kernels); printed, not recorded."""
    with tempfile.TemporaryDirectory(prefix="fedproto-netcheck-") as tmp:
        run_tcp_star(case.protocol, data=case.data, clients=clients, options=case.options,
                     split_options=case.split_options, latency_s=latency_ms / 1000, workdir=Path(tmp))
    print(f"  {case.protocol} on {case.data}, {clients} clients, {latency_ms:g} ms: warm-up TCP run (unmeasured)",
          flush=True)


def measured_span(run: Any) -> float:
    """The measured span the model predicts: from the last party's meter start to the last
    party's finish (seconds)."""
    starts = [t["start"] for t in run.traces.values() if t.get("start") is not None]
    ends = [t["finish"] for t in run.traces.values() if t.get("finish") is not None]
    if len(starts) != len(run.traces) or not ends:
        raise RuntimeError("a party's trace has no meter start or finish")
    return max(ends) - max(starts)


@dataclasses.dataclass(frozen=True)
class Costs:
    """This machine's figures the model is given, measured before the check and apart from it:
    the per-frame cost (seconds, :func:`_frame_cost.deployment_per_frame_s`), a process's first
    kernel (seconds, :func:`measure_first_kernel_s`) and a connection's set-up CPU at each end
    (seconds, :func:`measure_connect_s`)."""

    per_frame_s: float
    first_kernel_s: float
    connect_s: float

    def network(self, path: Path, latency_s: float) -> str:
        """The measured side's deployment as a link file at ``path`` (:func:`star_network`: every
        party on this machine's :data:`CORES`, these figures); returns its path."""
        return star_network(path, latency_s, cores=CORES, per_frame_s=self.per_frame_s,
                            first_kernel_s=self.first_kernel_s, connect_s=self.connect_s)


def median_run(case: Case, clients: int, latency_s: float | None, workdir: Path, runs: int = MEASURED_RUNS) -> Any:
    """The run of median measured span among ``runs`` TCP runs of ``case`` (:func:`run_tcp_star`;
    ``latency_s`` ``None``: no relay), each in its own directory under ``workdir``.

    Raises:
        NetnsUnavailable: namespaces cannot be made here.
        RuntimeError: a run failed.
    """
    done = []
    for i in range(runs):
        (workdir / f"tcp{i}").mkdir()
        done.append(run_tcp_star(case.protocol, data=case.data, clients=clients, options=case.options,
                                 split_options=case.split_options, latency_s=latency_s, workdir=workdir / f"tcp{i}"))
    done.sort(key=measured_span)
    return done[(len(done) - 1) // 2]


def measure_costs() -> tuple[Costs, float, str]:
    """The machine's figures for the model (see :class:`Costs`), the loopback per-frame figure
    (seconds) and which path the model's per-frame figure was measured on: the check's own path
    through namespaces and the relay where namespaces can be made, else the loopback star."""
    loopback = measure_per_frame_s()
    per_frame, path = loopback, "a loopback TLS star in one process (the best run: no namespaces here)"
    if netns_unavailable_reason() is None:
        per_frame = deployment_per_frame_s(FRAME_ROUND_TRIPS, FRAME_REPEATS)
        path = ("two party processes in two namespaces, the client's link through the relay at 0 ms: the measured "
                "side's path, with a ping-pong protocol")
    return Costs(per_frame, measure_first_kernel_s(), measure_connect_s(loopback)), loopback, path


def one_row(case: Case, clients: int, latency_ms: float, skip: str | None, *, costs: Costs,
            relay: bool = True, runs: tuple[int, int] = (PREDICTION_RUNS, MEASURED_RUNS),
            keep_trace: Path | None = None) -> dict[str, Any]:
    """Predict and (unless ``skip`` says why not) measure ``case`` with ``clients`` clients at one
    latency, the median of ``runs`` = (lean runs, TCP runs); ``relay=False`` (latency 0 only): the
    hub listens itself, no relay (a profile); ``keep_trace``: write the measured run's report (its
    parties' compute trace) there."""
    latency_s = latency_ms / 1000
    with tempfile.TemporaryDirectory(prefix="fedproto-netcheck-") as tmp:
        work = Path(tmp)
        network = costs.network(work / "net.json", latency_s)
        argv = case.argv(clients)
        lean = predict(argv, network, work, warm=True, runs=runs[0])
        run = None
        if skip is None:
            try:
                run = median_run(case, clients, latency_s if relay else None, work, runs[1])
            except NetnsUnavailable as exc:
                skip = str(exc)
        traced = None
        if run is not None:
            # the same run predicted from the compute its own parties measured (--compute-trace)
            trace = work / "tcp_report.json"
            run.report.to_json(trace)
            if keep_trace is not None:
                run.report.to_json(keep_trace)
            traced = predict(argv, network, work, compute=f"trace:{trace}")["prediction"]
    prediction = lean["prediction"]
    predicted = float(prediction["wall_time_s"])
    rounds = [float(r["wall_time_s"]) for r in prediction["rounds"]]
    row = dict(
        protocol=case.protocol, data_set=case.data, clients=clients, latency_ms=latency_ms, relay=relay,
        cores=CORES, per_frame_s=costs.per_frame_s, first_kernel_s=costs.first_kernel_s, connect_s=costs.connect_s,
        predicted_s=predicted, measured_s=None, ratio=None, predicted_traced_s=None, traced_ratio=None,
        untraced_handlers=None, unused_trace_figures=None, predicted_cross_s=None, cross_ratio=None,
        cross_trace_latency_ms=None,
        predicted_traced_round0_s=None, predicted_traced_steady_round_ms=None,
        within_15_percent=None,
        latency_hops=prediction.get("latency_hops"), predicted_compute_s=prediction.get("compute_s"),
        predicted_round0_s=rounds[0] if rounds else None,
        predicted_steady_round_ms=None if len(rounds) < 2 else 1000 * _median(rounds[1:]),
        measured_start_skew_s=None, measured_merged_wall_s=None, measured_round0_s=None,
        measured_steady_round_ms=None, lean_compile_s=lean.get("compile_s"), tcp_compile_s=None, not_measured=skip,
    )
    if run is not None:
        hub = run.report.parties[0]
        starts = [t["start"] for t in run.traces.values() if t.get("start") is not None]
        hub_rounds = list(run.parties[hub].round_wall_s)
        measured = measured_span(run)
        ratio = predicted / measured
        traced_ratio = float(traced["wall_time_s"]) / measured
        traced_rounds = [float(r["wall_time_s"]) for r in traced["rounds"]]
        row.update(
            measured_s=measured, ratio=ratio, predicted_traced_s=float(traced["wall_time_s"]),
            traced_ratio=traced_ratio, untraced_handlers=traced.get("untraced_handlers"),
            unused_trace_figures=traced.get("unused_trace_figures"),
            predicted_traced_round0_s=traced_rounds[0] if traced_rounds else None,
            predicted_traced_steady_round_ms=None if len(traced_rounds) < 2 else 1000 * _median(traced_rounds[1:]),
            within_15_percent=abs(traced_ratio - 1) <= TOLERANCE,
            measured_start_skew_s=max(starts) - min(starts),
            measured_merged_wall_s=run.wall_time_s,
            tcp_compile_s=max(r.compile_s for r in run.parties.values()),
            # round 0 as the prediction counts it: from the last party's start to the hub's first
            # frame of round 1 (the hub's rounds run from its first frame of a round to its first
            # of the next, the last one to its finish)
            measured_round0_s=None if len(hub_rounds) < 2 else
            run.traces[hub]["finish"] - sum(hub_rounds[1:]) - max(starts),
            measured_steady_round_ms=None if len(hub_rounds) < 3 else 1000 * _median(hub_rounds[1:-1]),
        )
    measured = row["measured_s"]
    print(f"  {case.protocol} on {case.data}, {clients} clients, {latency_ms:g} ms{'' if relay else ', no relay'}: "
          f"predicted {predicted:.3f} s (lean compute), "
          f"{'-' if row['predicted_traced_s'] is None else format(row['predicted_traced_s'], '.3f')} s (parties' "
          f"compute), measured {'-' if measured is None else f'{measured:.3f} s'}", flush=True)
    return row


def check_rows(cases: tuple[Case, ...], latencies_ms: tuple[float, ...], costs: Costs,
               runs: tuple[int, int] = (PREDICTION_RUNS, MEASURED_RUNS)) -> list[dict[str, Any]]:
    """Predict and measure every case at every latency (medians of ``runs`` = (lean runs, TCP
    runs)), after one warm-up TCP run of each case (see the module docstring)."""
    rows: list[dict[str, Any]] = []
    skip = netns_unavailable_reason()
    with tempfile.TemporaryDirectory(prefix="fedproto-traces-") as tmp:
        for case in cases:
            if skip is None:
                try:
                    warm_up(case, CLIENTS, latencies_ms[0])
                except NetnsUnavailable as exc:
                    skip = str(exc)
            traces: dict[float, Path] = {}
            for latency_ms in latencies_ms:
                keep = Path(tmp) / f"{case.protocol}-{latency_ms:g}.json"
                rows.append(one_row(case, CLIENTS, latency_ms, skip, costs=costs, runs=runs, keep_trace=keep))
                skip = rows[-1]["not_measured"]
                if keep.is_file():
                    traces[latency_ms] = keep
            for row in rows[-len(latencies_ms):]:
                cross_predict(case, row, traces, costs)
    return rows


def cross_predict(case: Case, row: dict[str, Any], traces: dict[float, Path], costs: Costs) -> None:
    """Predict ``row``'s run from the compute trace of the same case's run at another latency (the
    use a deployment makes of a trace: its compute measured once, other links predicted), into
    ``row`` (``predicted_cross_s``, ``cross_ratio``, ``cross_trace_latency_ms``)."""
    others = [latency for latency in traces if latency != row["latency_ms"]]
    if row["measured_s"] is None or not others:
        return
    other = others[0]
    with tempfile.TemporaryDirectory(prefix="fedproto-netcheck-") as tmp:
        work = Path(tmp)
        network = costs.network(work / "net.json", row["latency_ms"] / 1000)
        predicted = float(predict(case.argv(row["clients"]), network, work,
                                  compute=f"trace:{traces[other]}")["prediction"]["wall_time_s"])
    row.update(predicted_cross_s=predicted, cross_ratio=predicted / row["measured_s"], cross_trace_latency_ms=other)
    print(f"  {case.protocol} on {case.data}, {row['clients']} clients, {row['latency_ms']:g} ms: predicted "
          f"{predicted:.3f} s from the {other:g} ms run's trace", flush=True)


def profile_rows(costs: Costs) -> list[dict[str, Any]]:
    """FastLloyd on S1 (``--profile``): without the relay, the relay at 0 ms, 2 clients at 1 ms."""
    skip = netns_unavailable_reason()
    case = CASES[0]
    return [one_row(case, CLIENTS, 0.0, skip, costs=costs, relay=False),
            one_row(case, CLIENTS, 0.0, skip, costs=costs),
            one_row(case, 2, 1.0, skip, costs=costs),
            one_row(case, CLIENTS, 1.0, skip, costs=costs)]


def paper_rows(keys: tuple[tuple[str, int, int, int], ...]) -> list[dict[str, Any]]:
    """Table 3's LAN rows predicted with ``--network lan`` (see the module docstring)."""
    rows = []
    for name, n, k, d in keys:
        with tempfile.TemporaryDirectory(prefix="fedproto-netcheck-") as tmp:
            work = Path(tmp)
            data = name
            if name == "timesynth":
                x = timesynth(n, k, d, seed=0)
                data = str(save_dataset(work / f"timesynth_{n}_{k}_{d}.npz", Dataset("timesynth", x, None, k)))
            doc = predict(["fastlloyd", "--data", data, "--clients", "2", "--k", str(k), "--epsilon", "0.1",
                           "--seed", "0"], "lan", work)
        iterations = int(doc["results"]["iterations"])
        prediction = doc["prediction"]
        wall_s, compile_s = float(prediction["wall_time_s"]), float(doc.get("compile_s") or 0.0)
        per_iteration_ms = 1000 * wall_s / iterations
        # the paper's ranks were warm (100 timed runs): its figure holds no compilation
        warm_ms = 1000 * max(wall_s - compile_s, 0.0) / iterations
        rounds = [float(r["wall_time_s"]) for r in prediction["rounds"]]
        paper = PAPER_ROWS[(name, n, k, d)]
        rows.append(dict(data_set=name, n_points=n, k=k, d=d, iterations=iterations,
                         predicted_ms_per_iteration=per_iteration_ms,
                         predicted_warm_ms_per_iteration=warm_ms, paper_ms_per_iteration=paper,
                         ratio=warm_ms / paper,
                         predicted_steady_round_ms=None if len(rounds) < 2 else 1000 * _median(rounds[1:]),
                         compile_s=doc.get("compile_s")))
    return rows


def print_split(console: Any, title: str, rows: list[dict[str, Any]]) -> None:
    """The "where the time goes" table of ``rows``."""
    table = Table(title=title, title_justify="left")
    for column in ("protocol", "clients", "latency", "pred. s", "meas. s", "ratio", "pred. round 0 s",
                   "traced round 0 s", "meas. round 0 s", "pred. steady ms", "traced steady ms", "meas. steady ms",
                   "meas. start skew s",
                   "meas. merged wall s", "lean compile s", "TCP party compile s"):
        table.add_column(column, justify="left" if column == "protocol" else "right")
    for row in rows:
        latency = f"{row['latency_ms']:g} ms" + ("" if row["relay"] else " (no relay)")
        table.add_row(row["protocol"], str(row["clients"]), latency, _fmt(row["predicted_s"]),
                      _fmt(row["measured_s"]), _fmt(row["ratio"]), _fmt(row["predicted_round0_s"]),
                      _fmt(row["predicted_traced_round0_s"]), _fmt(row["measured_round0_s"]),
                      _fmt(row["predicted_steady_round_ms"], 1), _fmt(row["predicted_traced_steady_round_ms"], 1),
                      _fmt(row["measured_steady_round_ms"], 1), _fmt(row["measured_start_skew_s"]),
                      _fmt(row["measured_merged_wall_s"]), _fmt(row["lean_compile_s"]),
                      _fmt(row["tcp_compile_s"]))
    console.print(table)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser, quick="FastLloyd only in the check; three of Table 3's rows")
    parser.add_argument("--profile", action="store_true",
                        help="also FastLloyd without the relay, the relay at 0 ms, and 2 clients at 1 ms")
    args = parse_args(parser, argv)
    cases = CASES[:1] if args.quick else CASES
    missing = [name for name in {c.data for c in cases} | {"lsun", "s1"} if find_data_file(name) is None]
    if missing:
        parser.error(f"data sets not found: {', '.join(sorted(missing))} (set FEDPROTO_DATA to their directory "
                     "or run fedproto data fetch NAME)")
    console = make_console()
    print_machine_facts(console, TITLE, {
        "clients": CLIENTS, "latencies (one way, each client-hub link)": ", ".join(f"{x:g} ms" for x in LATENCIES_MS),
        "measured side": netns_unavailable_reason() or "TLS parties in network namespaces, delaying relay",
    })
    costs, loopback_per_frame_s, path = measure_costs()
    runs = QUICK_RUNS if args.quick else (PREDICTION_RUNS, MEASURED_RUNS)
    console.print(f"connection set-up: {CONNECT_TRIPS} one-way latencies before a client's first frame (TLS 1.3 "
                  "ClientHello, server flight, client Finished + fedproto hello, hub ok; the relay ends TCP "
                  "locally)", highlight=False)
    console.print(f"per-frame cost, measured here: {1e6 * costs.per_frame_s:.1f} us, used by the model (the median "
                  f"full-runtime round trip of a 24 B payload, {FRAME_REPEATS} runs of {FRAME_ROUND_TRIPS:,}, over 4, "
                  f"on {path}); the best such round trip over a loopback TLS star in one process: "
                  f"{1e6 * loopback_per_frame_s:.1f} us; "
                  f"hosts: every party on this machine's {CORES} cores", highlight=False)
    console.print(f"a process's first kernel, measured here: {1e3 * costs.first_kernel_s:.1f} ms (a trivial kernel's "
                  "first call less a second one's, in a fresh process set up as fedproto party sets it up, the "
                  f"median of {FIRST_KERNEL_RUNS} processes), charged once per party that runs a kernel",
                  highlight=False)
    console.print(f"a connection's set-up, measured here: {1e3 * costs.connect_s:.1f} ms of CPU at each end (TLS "
                  "stars of two endpoints opened in one process with one round trip, less its four per-frame "
                  f"costs, halved; the median of {CONNECT_RUNS}), charged to each client and to the hub per client "
                  "at the start", highlight=False)
    console.print(f"measured = the median of {runs[1]} TCP run(s), each from the last party's meter start to the "
                  "last finish (the start skew and the merged wall time it leaves out are in the second table); "
                  f"predicted = the median of {runs[0]} lean runs; warm-up: one unmeasured TCP run per protocol "
                  "and one unused lean run per prediction (persistent compile cache)", highlight=False)
    check = check_rows(cases, LATENCIES_MS, costs, runs)
    table = Table(title=TITLE, title_justify="left")
    for column in ("protocol", "data", "latency", "hops", "measured s", "predicted s, lean compute", "ratio",
                   "predicted s, parties' compute", "ratio ", "within 15%", "predicted s, other latency's trace",
                   "ratio  "):
        table.add_column(column, justify="left" if column in ("protocol", "data") else "right")
    for row in check:
        ok = "-" if row["within_15_percent"] is None else ("yes" if row["within_15_percent"] else "NO")
        table.add_row(row["protocol"], row["data_set"], f"{row['latency_ms']:g} ms", str(row["latency_hops"]),
                      _fmt(row["measured_s"]), _fmt(row["predicted_s"]), _fmt(row["ratio"]),
                      _fmt(row["predicted_traced_s"]), _fmt(row["traced_ratio"]), ok, _fmt(row["predicted_cross_s"]),
                      _fmt(row["cross_ratio"]))
    console.print(table)
    print_split(console, SPLIT_TITLE, check)
    if any(row["not_measured"] for row in check):
        console.print(f"not measured: {check[0]['not_measured']}", highlight=False)
    profile = profile_rows(costs) if args.profile else []
    if profile:
        print_split(console, PROFILE_TITLE, profile)

    paper = paper_rows(QUICK_PAPER_ROWS if args.quick else tuple(PAPER_ROWS))
    table = Table(title=PAPER_TITLE, title_justify="left")
    for column in ("data", "N", "k", "d", "T", "predicted ms/iter", "compile s", "less compile ms/iter",
                   "paper ms/iter", "ratio", "steady round ms"):
        table.add_column(column, justify="left" if column == "data" else "right")
    for row in paper:
        table.add_row(row["data_set"], f"{row['n_points']:,}", str(row["k"]), str(row["d"]), str(row["iterations"]),
                      f"{row['predicted_ms_per_iteration']:.2f}", _fmt(row["compile_s"]),
                      f"{row['predicted_warm_ms_per_iteration']:.2f}", f"{row['paper_ms_per_iteration']:.2f}",
                      f"{row['ratio']:.2f}", _fmt(row["predicted_steady_round_ms"], 2))
    console.print(table)
    console.print(
        "The paper ran 3 MPI ranks on an Apple M2 Max (30 cores); this is a 2-core VM, one process driving "
        "every party. TimeSynth here is the TimeSynth-like stand-in of benchmarks/fastlloyd_timing.py (fedproto "
        "neither ships nor fetches TimeSynth).", highlight=False,
    )
    records = [record("network_model", **{k: v for k, v in row.items() if k != "not_measured"}) for row in check]
    records += [record("network_model_profile", **{k: v for k, v in row.items() if k != "not_measured"})
                for row in profile]
    records += [record("network_model_paper", **row) for row in paper]
    write_records(args.json, records, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())

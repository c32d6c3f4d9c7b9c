"""A link model: predicted wall time of a run between real sites, on the lean engine's virtual clock.

:func:`fedproto.simulation.simulate` with ``network=`` runs the protocol exactly as without it
(the same frames, bytes, results and report counters) and, beside it, replays every frame through
a discrete-event model of the links. Nothing sleeps: the model is a prediction computed from the
frame sizes and the handlers' compute times.

The model:

* Each directed link ``(sender, receiver)`` has a latency (seconds, one way) and a bandwidth
  (bytes per second; ``None`` = unlimited). A link carries one frame at a time: a frame entering
  it at time ``t`` starts transmitting at ``max(t, the link's free time)``, takes ``bytes /
  bandwidth`` seconds (the frame as metered: the encoded frame, envelope included; transport
  framing and TLS are not modelled), frees the link, and arrives ``latency`` later.
* **Topology.** ``"star"`` (the default, as ``--transport tcp`` runs): a frame between two parties
  that are not the coordinator (``roster[0]``, the star's hub) travels two links, sender -> hub and
  hub -> receiver, queueing on both; the hub forwards it as it arrives, without running a
  handler. ``"mesh"``: every frame travels its own direct link.
* **Parties.** Each party has a clock, starting at 0 when the run starts. A frame sent by a party
  leaves at the party's clock when its handler ends. When a party handles a frame, its clock
  becomes ``max(its clock, the frame's arrival) + the handler's compute time``. Frames are
  delivered in arrival-time order, ties broken by the order they entered their last link (a
  sequence number), so a prediction is the same for the same compute trace.
* **Compute time** of a handler (decoding the frame, the machine's ``receive`` or ``handle``, and
  encoding what it sends) is ``fixed`` (every handler, the start of each party and each
  timeout included, costs the same seconds: bit-for-bit repeatable predictions), ``measured``
  on this process with ``time.perf_counter`` (see :func:`parse_compute`), or ``trace``: what
  each handler cost where the parties of an earlier run ran (:class:`ComputeTrace`, the
  report's ``compute_trace``).
* **Hosts and cores.** Parties may share a host with a number of cores (``hosts``): on a host,
  at most ``cores`` handlers run at once. A handler takes the host's core that frees first and
  starts at ``max(its ready time, the core's free time)``; handlers take cores in the order the
  model runs them (arrival order, ties by sequence number), and a core's idle gap before a
  handler already placed on it is not filled, so a prediction stays deterministic for a given
  compute trace. A party no host names is on a host of its own with one core (a party runs one
  handler at a time anyway): the default, every party on its own machine.
* **Per-frame cost** (``per_frame_s``, 0 by default): CPU seconds each frame costs its sender and
  its receiver beyond what the lean engine measures (the transport: framing, TLS, system calls,
  the runtime's loop). A handler's compute grows by ``per_frame_s`` for the frame that triggered
  it and by ``per_frame_s`` for each delivery it sends (a broadcast to ``n`` parties costs ``n``:
  each goes over its own connection). On the star, the hub forwards a frame between two other
  parties at ``2 * per_frame_s`` of its own CPU (receiving and sending it again): a handler of the
  hub's (it occupies the hub's clock and a core) that the frame waits for between its two links.
* **Compilation per party** (``compile``: ``"once"``, the default, or ``"per_party"``). The lean
  engine runs every party in one process, which traces and compiles (or loads from the
  persistent cache) each JAX kernel once, in the first handler that uses it; a deployment runs
  each party in its own process, which pays that for its own kernels. With ``"per_party"`` and
  measured compute, the engine reports each handler's compile seconds (JAX's own compile events,
  :func:`fedproto.compilation.compile_seconds`) under a key (the machine's class, the round, and
  what triggered it); a party's first handler of a key is charged the largest compile seconds
  seen for that key, less what its own measured time already holds. With fixed compute nothing
  is added, nor with a trace (each traced figure holds its own process's compilation).
* **A process's first kernel** (``first_kernel_s``, 0 by default; only with ``compile``
  ``"per_party"`` and measured compute): CPU seconds a fresh process spends on its first JAX
  kernel beyond that kernel's own compile events (JAX's one-time set-up of its tracing, lowering
  and dispatch machinery), which the lean process paid once, before or outside the handlers it
  measures. Each party is charged it once, on its first handler of a key with compile seconds
  above 0. A figure for the machine, measured apart from any run (``benchmarks/network_model.py``:
  a trivial kernel's first call in a fresh process less a second trivial kernel's first call).
* **Connection set-up** (``connect_trips``, 0 by default): a link carries no frame before
  ``connect_trips`` of its one-way latencies have passed since the run's start (time 0): a frame
  entering it earlier starts transmitting then. It stands for the round trips a connection needs
  before its first frame (TCP's, TLS's, the transport's own hello), stated from the deployment's
  handshake, not fitted: over fedproto's TLS star a client writes its first frame after TCP's
  SYN and SYN-ACK, TLS 1.3's ClientHello and server flight, its Finished with fedproto's hello,
  and the hub's ``["ok"]``: 6 one-way trips from a cold start (see docs/transports.md). Both
  directions of a link share the figure (the hub never writes to a client before that client's
  connection is up).
* **Connection CPU** (``connect_s``, 0 by default): CPU seconds a connection's set-up costs each
  of its two ends (the TLS handshake's key exchange, signatures and certificate checks, the
  transport's hello). At the start every connection is set up: on the star each client's link to
  the hub, on a mesh every pair of parties. Each end runs a set-up handler of ``connect_s`` at
  time 0, on its clock and its host's cores (a hub sets up its clients' connections one after
  another, in roster order, before its own start), and the connection carries no frame before
  both ends' set-up handlers have ended. A figure for the machine, measured apart from any run
  (``benchmarks/network_model.py``: TLS stars of two endpoints opened in one process).
* **Deadlines** (:class:`~fedproto.messages.PhaseTimedOut`) fire on the same clock: a party's
  deadline is armed at its clock when it makes progress, and fires when the model's time reaches
  it before a frame for that party does.

The prediction (:meth:`LinkSimulator.prediction`, the report's ``prediction`` field) holds the
predicted wall time (first party start, 0, to the last handler's end), its split along the
critical path into network, compute and deadline waiting, per round and per phase, and a per-party
timeline of compute and waiting. The critical path is walked back from the handler that ends last:
from a handler to the frame that triggered it (and on to the handler that sent that frame, or
that forwarded it), to the same party's previous handler, or to the handler that held the core it
waited for, whichever it waited for last (a frame first on ties, then the party's previous
handler).

Example::

    meter = Meter(time.perf_counter)
    simulate(machines, meter=meter, network=LinkModel.preset("wan"), compute="fixed:0.001")
    meter.prediction["wall_time_s"]
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import math
import tomllib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedproto._netmodel_compute import ComputeTrace, parse_compute

__all__ = ["ComputeTrace", "Host", "Link", "LinkModel", "LinkSimulator", "PRESETS", "parse_compute", "plot_timeline"]

#: Topologies a model file may name.
TOPOLOGIES = ("star", "mesh")

#: Parties shown by name in the timeline (the busiest by compute); the rest form one summary row.
TIMELINE_PARTIES = 6


@dataclasses.dataclass(frozen=True)
class Link:
    """One directed link.

    Attributes:
        latency_s: one-way latency (seconds, >= 0).
        bandwidth_bytes_per_s: transmission rate (bytes per second, > 0), or ``None`` for
            unlimited (a frame takes no transmission time).
    """

    latency_s: float = 0.0
    bandwidth_bytes_per_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{"latency_s", "bandwidth_bytes_per_s"}`` (``None`` for unlimited)."""
        return {"latency_s": self.latency_s, "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s}


#: 1 Gbit/s in bytes per second.
_GBIT = 1e9 / 8

#: The presets, by name: ``(description with its source, model)``.
#:
#: * ``lan``: the FastLloyd paper's LAN setting (Table 3; its MPI code sleeps 0.125 ms before each
#:   gather and each broadcast, i.e. 0.125 ms one way), at 1 Gbit/s, a common data-centre
#:   Ethernet rate (the paper's code models latency only).
#: * ``wan``: the same code's WAN profile, 25 ms per operation, at the same 1 Gbit/s, so that
#:   ``lan`` and ``wan`` differ in latency alone, as in the paper's code.
#: * ``cross-region``: 75 ms one way at 100 Mbit/s, a round illustrative figure for sites on
#:   different continents (not a measurement).
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "lan": (
        "FastLloyd paper's LAN: 0.125 ms one way, 1 Gbit/s",
        {"topology": "star", "default": {"latency_s": 0.000125, "bandwidth_bytes_per_s": _GBIT}},
    ),
    "wan": (
        "FastLloyd paper's WAN profile: 25 ms one way, 1 Gbit/s",
        {"topology": "star", "default": {"latency_s": 0.025, "bandwidth_bytes_per_s": _GBIT}},
    ),
    "cross-region": (
        "cross-region WAN (round illustrative figure): 75 ms one way, 100 Mbit/s",
        {"topology": "star", "default": {"latency_s": 0.075, "bandwidth_bytes_per_s": 100e6 / 8}},
    ),
}

_LINK_KEYS = ("latency_s", "bandwidth_bytes_per_s")
_TOP_KEYS = ("topology", "default", "parties", "links", "hosts", "per_frame_s", "compile", "first_kernel_s",
             "connect_trips", "connect_s")
#: What a model file's ``compile`` may say (see the module docstring).
COMPILE_MODES = ("once", "per_party")
_HOST_KEYS = ("cores", "parties")


@dataclasses.dataclass(frozen=True)
class Host:
    """Parties that share a machine, and its cores.

    Attributes:
        cores: how many handlers may run at once on it (>= 1).
        parties: the parties on it, or ``"*"``: every party no other host names.
    """

    cores: int = 1
    parties: tuple[str, ...] | str = "*"

    def to_dict(self) -> dict[str, Any]:
        """``{"cores", "parties"}`` (``"*"`` or a list of names)."""
        return {"cores": self.cores, "parties": self.parties if self.parties == "*" else list(self.parties)}


@dataclasses.dataclass(frozen=True)
class LinkModel:
    """Latency and bandwidth of every link of a run, and its topology.

    Resolution of the link ``sender -> receiver``, key by key (``latency_s`` and
    ``bandwidth_bytes_per_s`` separately): ``default``, then the ``parties`` entries of its two
    ends (an entry sets both directions of every link of that party; where both ends have one,
    the slower value wins: the larger latency, the smaller bandwidth), then its own ``links``
    entry, which overrides everything. Entries naming parties the run does not have are unused.

    Attributes:
        name: the preset's name or the file it was read from (``"custom"`` for a program's).
        topology: ``"star"`` (frames between two non-coordinators travel through ``roster[0]``)
            or ``"mesh"`` (direct).
        default: the link parameters of every link without an entry (``latency_s`` 0 and unlimited
            bandwidth when absent).
        parties: ``{party: {key: value}}`` (partial link parameters).
        links: ``{(sender, receiver): {key: value}}`` (partial link parameters).
        hosts: ``{host: Host}``, which parties share a machine and its cores (see the module
            docstring); a party no host names has a host and a core of its own.
        per_frame_s: CPU seconds a frame costs its sender and its receiver each (>= 0; the hub
            twice for a frame it forwards), see the module docstring.
        compile: ``"once"`` (the lean process's compilation as measured) or ``"per_party"``
            (every party's process compiles its own kernels), see the module docstring.
        first_kernel_s: CPU seconds a party's process spends on its first JAX kernel beyond its
            compile events (>= 0; charged with ``"per_party"`` compilation), see the module docstring.
        connect_trips: one-way latencies of connection set-up before a link's first frame may
            leave (a whole number >= 0), see the module docstring.
        connect_s: CPU seconds a connection's set-up costs each of its ends (>= 0), see the
            module docstring.
    """

    name: str = "custom"
    topology: str = "star"
    default: Link = Link()
    parties: Mapping[str, Mapping[str, float | None]] = dataclasses.field(default_factory=dict)
    links: Mapping[tuple[str, str], Mapping[str, float | None]] = dataclasses.field(default_factory=dict)
    hosts: Mapping[str, Host] = dataclasses.field(default_factory=dict)
    per_frame_s: float = 0.0
    compile: str = "once"
    first_kernel_s: float = 0.0
    connect_trips: int = 0
    connect_s: float = 0.0

    @classmethod
    def preset(cls, name: str) -> "LinkModel":
        """The preset ``name`` (see :data:`PRESETS`).

        Raises:
            ValueError: no preset of that name.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown network preset {name!r} (presets: {', '.join(PRESETS)})")
        return cls.from_mapping(PRESETS[name][1], name=name)

    @classmethod
    def load(cls, path: str | Path) -> "LinkModel":
        """Read a model file: JSON, or TOML when the name ends in ``.toml``.

        Layout: ``{"topology": "star"|"mesh", "default": {"latency_s": s, "bandwidth_bytes_per_s":
        B}, "parties": {"client-3": {...}}, "links": {"server->client-0": {...}}, "hosts": {"vm":
        {"cores": 2, "parties": "*"}}, "per_frame_s": s, "compile": "once"|"per_party", "first_kernel_s":
        s, "connect_trips": n, "connect_s": s}``, every
        key optional; a bandwidth of ``null`` (JSON) or an absent one is unlimited; a host's
        ``parties`` is a list of names or ``"*"`` (every party no other host names; at most one
        host says so).

        Raises:
            ValueError: the file cannot be read or parsed, or a key or value is wrong (names it).
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the network model {path}: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            data = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
            raise ValueError(f"network model {path}: not valid {kind}: {exc}") from None
        return cls.from_mapping(data, name=str(path))

    @classmethod
    def parse(cls, spec: str) -> "LinkModel | None":
        """``--network``: ``"none"`` (``None``), a preset's name, or a model file's path.

        Raises:
            ValueError: neither a preset nor a readable, well-formed file.
        """
        if spec == "none":
            return None
        if spec in PRESETS:
            return cls.preset(spec)
        if not Path(spec).exists():
            raise ValueError(f"{spec!r} is neither a preset ({', '.join(PRESETS)}, none) nor an existing file")
        return cls.load(spec)

    @classmethod
    def from_mapping(cls, data: Any, *, name: str = "custom") -> "LinkModel":
        """Build a model from the file layout (see :meth:`load`).

        Raises:
            ValueError: an unknown key, a wrong type, a negative latency or a non-positive bandwidth,
                a host without a whole number of cores >= 1, a party on two hosts, two hosts of
                ``"*"``, a negative ``per_frame_s``, ``first_kernel_s`` or ``connect_s``, a
                ``connect_trips`` that is not a whole
                number >= 0 (the message names the key, e.g.
                ``links.server->client-0.latency_s``).
        """
        where = f"network model {name}"
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected a table of {', '.join(_TOP_KEYS)}")
        for key in data:
            if key not in _TOP_KEYS:
                raise ValueError(f"{where}: unknown key {key!r} (expected {', '.join(_TOP_KEYS)})")
        topology = data.get("topology", "star")
        if topology not in TOPOLOGIES:
            raise ValueError(f"{where}: topology must be star or mesh, got {topology!r}")
        default = _link_entry(data.get("default", {}), f"{where}: default")
        parties = {
            str(party): _link_entry(entry, f"{where}: parties.{party}")
            for party, entry in _table(data.get("parties", {}), f"{where}: parties").items()
        }
        links: dict[tuple[str, str], dict[str, float | None]] = {}
        for key, entry in _table(data.get("links", {}), f"{where}: links").items():
            sender, arrow, receiver = str(key).partition("->")
            if not arrow or not sender.strip() or not receiver.strip():
                raise ValueError(f"{where}: links.{key}: a link is named SENDER->RECEIVER")
            links[(sender.strip(), receiver.strip())] = _link_entry(entry, f"{where}: links.{key}")
        hosts = _hosts(data.get("hosts", {}), f"{where}: hosts")
        per_frame = _seconds(data.get("per_frame_s", 0.0), f"{where}: per_frame_s")
        first_kernel = _seconds(data.get("first_kernel_s", 0.0), f"{where}: first_kernel_s")
        connect = _seconds(data.get("connect_s", 0.0), f"{where}: connect_s")
        compile_mode = data.get("compile", "once")
        if compile_mode not in COMPILE_MODES:
            raise ValueError(f"{where}: compile must be once or per_party, got {compile_mode!r}")
        trips = data.get("connect_trips", 0)
        if isinstance(trips, bool) or not isinstance(trips, int) or trips < 0:
            raise ValueError(f"{where}: connect_trips: expected a whole number >= 0, got {trips!r}")
        return cls(
            name=name,
            topology=topology,
            default=Link(default.get("latency_s") or 0.0, default.get("bandwidth_bytes_per_s")),
            parties=parties,
            links=links,
            hosts=hosts,
            per_frame_s=float(per_frame),
            compile=compile_mode,
            first_kernel_s=float(first_kernel),
            connect_trips=trips,
            connect_s=connect,
        )

    def placement(self, roster: Sequence[str]) -> dict[str, tuple[str, int]]:
        """``{party: (host key, cores)}`` for every party of ``roster``: its host's name and cores,
        or a host of its own (key ``"party:NAME"``) with one core."""
        named = {p: h for h, host in self.hosts.items() if host.parties != "*" for p in host.parties}
        star = next((h for h, host in self.hosts.items() if host.parties == "*"), None)
        out: dict[str, tuple[str, int]] = {}
        for party in roster:
            host = named.get(party, star)
            out[party] = (f"party:{party}", 1) if host is None else (f"host:{host}", self.hosts[host].cores)
        return out

    def link(self, sender: str, receiver: str) -> Link:
        """The resolved parameters of the directed link ``sender -> receiver`` (see the class)."""
        latency = self.default.latency_s
        bandwidth = self.default.bandwidth_bytes_per_s
        ends = [self.parties[p] for p in (sender, receiver) if p in self.parties]
        lat_values = [e["latency_s"] for e in ends if "latency_s" in e]
        if lat_values:
            latency = max(lat_values)
        bw_values = [e["bandwidth_bytes_per_s"] for e in ends if "bandwidth_bytes_per_s" in e]
        if bw_values:
            finite = [b for b in bw_values if b is not None]
            bandwidth = min(finite) if finite else None
        own = self.links.get((sender, receiver), {})
        latency = own.get("latency_s", latency)
        bandwidth = own.get("bandwidth_bytes_per_s", bandwidth)
        return Link(float(latency or 0.0), bandwidth)

    def to_dict(self) -> dict[str, Any]:
        """The model in the file layout plus its ``name`` (the report's ``options["network_model"]``)."""
        return {
            "name": self.name,
            "topology": self.topology,
            "default": self.default.to_dict(),
            "parties": {p: dict(e) for p, e in self.parties.items()},
            "links": {f"{s}->{r}": dict(e) for (s, r), e in self.links.items()},
            "hosts": {h: host.to_dict() for h, host in self.hosts.items()},
            "per_frame_s": self.per_frame_s,
            "compile": self.compile,
            "first_kernel_s": self.first_kernel_s,
            "connect_trips": self.connect_trips,
            "connect_s": self.connect_s,
        }


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: expected a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _table(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a table, got {type(value).__name__}")
    return value


def _hosts(value: Any, where: str) -> dict[str, Host]:
    """The ``hosts`` table, checked: cores a whole number >= 1, parties a list of names or ``"*"``,
    no party on two hosts, at most one ``"*"``."""
    out: dict[str, Host] = {}
    seen: dict[str, str] = {}
    star = None
    for name, entry in _table(value, where).items():
        entry = _table(entry, f"{where}.{name}")
        for key in entry:
            if key not in _HOST_KEYS:
                raise ValueError(f"{where}.{name}: unknown key {key!r} (expected cores, parties)")
        cores = entry.get("cores", 1)
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise ValueError(f"{where}.{name}.cores: expected a whole number >= 1, got {cores!r}")
        parties = entry.get("parties", "*")
        if parties == "*":
            if star is not None:
                raise ValueError(f"{where}.{name}.parties: only one host may take the rest (\"*\"); {star} does")
            star = name
            placed: tuple[str, ...] | str = "*"
        elif isinstance(parties, list) and all(isinstance(p, str) and p for p in parties):
            for party in parties:
                if party in seen:
                    raise ValueError(f"{where}.{name}.parties: {party} is already on host {seen[party]}")
                seen[party] = name
            placed = tuple(parties)
        else:
            raise ValueError(f"{where}.{name}.parties: expected a list of party names or \"*\", got {parties!r}")
        out[str(name)] = Host(cores, placed)
    return out


def _link_entry(value: Any, where: str) -> dict[str, float | None]:
    """A partial link entry, checked: latency a number >= 0, bandwidth a number > 0 or null."""
    entry = _table(value, where)
    out: dict[str, float | None] = {}
    for key, item in entry.items():
        if key not in _LINK_KEYS:
            raise ValueError(f"{where}: unknown key {key!r} (expected latency_s, bandwidth_bytes_per_s)")
        if item is None and key == "bandwidth_bytes_per_s":
            out[key] = None
            continue
        if isinstance(item, bool) or not isinstance(item, int | float) or not math.isfinite(item):
            raise ValueError(f"{where}.{key}: expected a finite number, got {item!r}")
        if key == "latency_s" and item < 0:
            raise ValueError(f"{where}.latency_s: must be >= 0 seconds, got {item!r}")
        if key == "bandwidth_bytes_per_s" and item <= 0:
            raise ValueError(f"{where}.bandwidth_bytes_per_s: must be > 0 (omit it for unlimited), got {item!r}")
        out[key] = float(item)
    return out


# Event kinds in the simulator's heap: a frame entering a link, a frame reaching the star's hub to
# be forwarded (only with a per-frame cost), and a frame arriving at a party.
_ENTER, _FORWARD, _ARRIVE = 0, 1, 2


class LinkSimulator:
    """The model's event bookkeeping for one run (driven by :func:`fedproto.simulation.simulate`).

    The engine reports each handler (:meth:`handled`) and each frame it sends (:meth:`send`), and
    asks for the next frames to deliver (:meth:`next_arrivals`); the simulator keeps the party
    clocks, the links' free times, and a record of handlers and deliveries for
    :meth:`prediction`.

    Args:
        model: the link parameters.
        parties: the roster, coordinator (the star's hub) first.
        compute_s: seconds per handler, a :class:`ComputeTrace`, or ``None`` for measured (see
            :func:`parse_compute`).
    """

    def __init__(
        self, model: LinkModel, parties: Sequence[str], compute_s: float | ComputeTrace | None = None
    ) -> None:
        self.model = model
        self.parties = list(parties)
        self.hub = self.parties[0] if self.parties else ""
        self.trace = compute_s if isinstance(compute_s, ComputeTrace) else None
        self.compute_s = None if self.trace is not None else compute_s
        self.untraced = 0  # handlers the trace had no figure for
        self._traced: dict[tuple[str, int, str], int] = defaultdict(int)  # figures taken per trace key
        self.clock: dict[str, float] = dict.fromkeys(self.parties, 0.0)
        self.per_frame_s = model.per_frame_s
        self.compile_per_party = model.compile == "per_party"
        self._kernel_s: dict[Any, float] = {}  # kernel key -> the largest compile seconds seen
        self._paid: set[tuple[str, Any]] = set()  # (party, kernel key) already charged
        self.first_kernel_s = model.first_kernel_s
        self._started: set[str] = set()  # parties already charged their process's first kernel
        placement = model.placement(self.parties)
        self._host = {party: host for party, (host, _) in placement.items()}
        # per host: a heap of (free time, core number, the handler that last held it)
        self._cores: dict[str, list[tuple[float, int, int]]] = {}
        for host, cores in placement.values():
            self._cores.setdefault(host, [(0.0, core, -1) for core in range(cores)])
        self._links: dict[tuple[str, str], Link] = {}
        self._free: dict[tuple[str, str], float] = defaultdict(float)
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._last: dict[str, int] = {}  # party -> its last handler
        # handlers (parallel lists): party, round, start, end, compute, trigger delivery, previous
        self.h_party: list[str] = []
        self.h_round: list[int] = []
        self.h_start: list[float] = []
        self.h_end: list[float] = []
        self.h_compute: list[float] = []
        self.h_trigger: list[int] = []
        self.h_prev: list[int] = []
        self.h_ready: list[float] = []
        self.h_core: list[int] = []  # the handler that held its core before it, -1 for none
        # deliveries (one per frame and receiver): sending handler, send time, arrival, latency
        # hops, round, phase, the handler it triggered
        self.d_handler: list[int] = []
        self.d_sent: list[float] = []
        self.d_arrival: list[float] = []
        self.d_hops: list[int] = []
        self.d_round: list[int] = []
        self.d_phase: list[str] = []
        self.d_handled: list[int] = []
        self.d_forward: dict[int, int] = {}  # delivery -> the hub's forwarding handler (star, per-frame cost)
        self._connected: dict[frozenset[str], float] = {}  # a connection -> when both ends have set it up
        if model.connect_s > 0 and len(self.parties) > 1:
            self._set_up_connections(model.connect_s)

    def _set_up_connections(self, seconds: float) -> None:
        """Every connection's set-up handlers at time 0 (see the module docstring)."""
        if self.model.topology == "star":
            pairs = [(client, self.hub) for client in self.parties[1:]]
        else:
            pairs = [(a, b) for i, a in enumerate(self.parties) for b in self.parties[i + 1:]]
        for a, b in pairs:
            ends = [self._run(a, 0, 0.0, seconds, -1), self._run(b, 0, 0.0, seconds, -1)]
            self._connected[frozenset((a, b))] = max(self.h_end[h] for h in ends)

    def _link(self, sender: str, receiver: str) -> Link:
        link = self._links.get((sender, receiver))
        if link is None:
            link = self._links[(sender, receiver)] = self.model.link(sender, receiver)
        return link

    def _push(self, when: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._heap, (when, self._seq, kind, payload))
        self._seq += 1

    def handled(
        self, party: str, round_idx: int, ready_s: float, compute_s: float, trigger: int = -1, frames_out: int = 0,
        kernels: tuple[Any, float, float] | None = None, cause: str = "",
    ) -> int:
        """Record a handler of ``party``, place it on a core of its host and advance its clock.

        Args:
            party: who handled.
            round_idx: the round it belongs to (the triggering frame's, else the machine's).
            ready_s: when its input was there: 0 at the start, a frame's arrival, a deadline.
            compute_s: the measured seconds (replaced by the fixed figure when there is one).
            trigger: the delivery that triggered it (:meth:`next_arrivals`), -1 for none.
            frames_out: deliveries it sends (each costs the model's ``per_frame_s``, as does the
                frame that triggered it).
            kernels: ``(key, compile_s, included_s)``: what the handler is (any hashable: its
                machine's class, round and trigger), the compile seconds the lean process spent
                in it (a batch's whole), and how much of them ``compute_s`` holds; used with the
                model's ``compile`` ``"per_party"`` and measured compute (see the module docstring).
            cause: what triggered it, ``"start"``, ``"timeout"`` or the received message's tag
                (the key of a :class:`ComputeTrace`, with ``round_idx``).

        Returns:
            The handler's id (for :meth:`send`).
        """
        compute = self.compute_s if self.compute_s is not None else compute_s
        if self.trace is not None:
            key = (party, round_idx, cause)
            traced = self.trace.figure(party, round_idx, cause, self._traced[key])
            if traced is None:
                self.untraced += 1
            else:
                self._traced[key] += 1
                compute = traced  # the party's own process: its compilation and first kernel included
            kernels = None
        if kernels is not None and self.compile_per_party and self.compute_s is None:
            key, compiled, included = kernels
            self._kernel_s[key] = max(self._kernel_s.get(key, 0.0), compiled)
            if (party, key) not in self._paid:
                self._paid.add((party, key))
                compute += max(self._kernel_s[key] - included, 0.0)
            if self._kernel_s[key] > 0.0 and party not in self._started:
                self._started.add(party)
                compute += self.first_kernel_s
        compute += self.per_frame_s * (frames_out + (1 if trigger >= 0 else 0))
        return self._run(party, round_idx, ready_s, compute, trigger)

    def _run(self, party: str, round_idx: int, ready_s: float, compute: float, trigger: int,
             forward: bool = False) -> int:
        """A handler of ``compute`` seconds on ``party``'s clock and the first free core of its host."""
        cores = self._cores[self._host[party]]
        free, core, holder = heapq.heappop(cores)
        start = max(self.clock[party], ready_s, free)
        end = start + compute
        handler = len(self.h_party)
        heapq.heappush(cores, (end, core, handler))
        self.clock[party] = end
        self.h_party.append(party)
        self.h_round.append(round_idx)
        self.h_start.append(start)
        self.h_end.append(end)
        self.h_compute.append(compute)
        self.h_trigger.append(trigger)
        self.h_prev.append(self._last.get(party, -1))
        self.h_ready.append(ready_s)
        self.h_core.append(holder)
        self._last[party] = handler
        if trigger >= 0 and not forward:
            self.d_handled[trigger] = handler
        return handler

    def send(self, handler: int, receiver: str, nbytes: int, round_idx: int, phase: str, frame: Any) -> None:
        """A frame of ``nbytes`` from ``handler``'s party to ``receiver``, leaving at the end of
        ``handler``; ``frame`` is handed back by :meth:`next_arrivals` (one object for the
        receivers of one broadcast, so that they arrive together)."""
        sender = self.h_party[handler]
        if self.model.topology == "star" and self.hub not in (sender, receiver):
            route = (sender, self.hub, receiver)
        else:
            route = (sender, receiver)
        delivery = len(self.d_handler)
        self.d_handler.append(handler)
        self.d_sent.append(self.h_end[handler])
        self.d_arrival.append(math.inf)
        self.d_hops.append(len(route) - 1)
        self.d_round.append(round_idx)
        self.d_phase.append(phase)
        self.d_handled.append(-1)
        self._push(self.h_end[handler], _ENTER, (route, 0, nbytes, delivery, frame))

    def next_time(self) -> float:
        """When the next frame arrives (``math.inf`` when none is in flight). Moves frames along
        their links up to then."""
        heap = self._heap
        while heap and heap[0][2] != _ARRIVE:
            when, _, kind, (route, hop, nbytes, delivery, frame) = heapq.heappop(heap)
            if kind == _FORWARD:
                # the hub receives the frame and sends it on: its CPU, its clock, one of its cores
                forward = self._run(route[hop], self.d_round[delivery], when, 2 * self.per_frame_s, delivery,
                                    forward=True)
                self.d_forward[delivery] = forward
                self._push(self.h_end[forward], _ENTER, (route, hop, nbytes, delivery, frame))
                continue
            link = self._link(route[hop], route[hop + 1])
            # connection set-up: nothing leaves before the link's handshake trips are over and
            # both ends have done their part of it
            when = max(when, self.model.connect_trips * link.latency_s)
            if self._connected:
                when = max(when, self._connected.get(frozenset((route[hop], route[hop + 1])), 0.0))
            if link.bandwidth_bytes_per_s is None:
                done = when
            else:
                key = (route[hop], route[hop + 1])
                done = max(when, self._free[key]) + nbytes / link.bandwidth_bytes_per_s
                self._free[key] = done
            arrival = done + link.latency_s
            if hop + 2 < len(route):
                kind = _FORWARD if self.per_frame_s > 0 else _ENTER
                self._push(arrival, kind, (route, hop + 1, nbytes, delivery, frame))
            else:
                self._push(arrival, _ARRIVE, (route[-1], delivery, frame))
        return heap[0][0] if heap else math.inf

    def next_arrivals(self) -> tuple[float, Any, list[tuple[str, int]]]:
        """The next arrival time, its frame, and every ``(receiver, delivery)`` of that frame
        arriving then (consecutive in the delivery order). Call after :meth:`next_time` found one."""
        when, _, _, (receiver, delivery, frame) = heapq.heappop(self._heap)
        self.d_arrival[delivery] = when
        group = [(receiver, delivery)]
        heap = self._heap
        while heap and heap[0][0] == when and heap[0][2] == _ARRIVE and heap[0][3][2] is frame:
            _, _, _, (receiver, delivery, _) = heapq.heappop(heap)
            self.d_arrival[delivery] = when
            group.append((receiver, delivery))
        return when, frame, group

    # -- the prediction ----------------------------------------------------------------------------

    def prediction(self) -> dict[str, Any]:
        """The report's ``prediction`` (see docs/report.md): wall time, its critical-path split,
        per round, per phase, and the timeline. Empty when no handler ran."""
        if not self.h_party:
            return {}
        ends = self.h_end
        last = max(range(len(ends)), key=lambda h: (ends[h], h))
        wall = ends[last]
        network = compute = waited = 0.0
        hops = 0
        per_round: dict[int, dict[str, Any]] = {}

        def row(round_idx: int) -> dict[str, Any]:
            entry = per_round.get(round_idx)
            if entry is None:
                entry = per_round[round_idx] = {
                    "round_idx": round_idx, "wall_time_s": 0.0, "network_s": 0.0, "compute_s": 0.0,
                    "timeout_wait_s": 0.0, "critical_party": None, "latency_hops": 0,
                }
            return entry

        handler = last
        while handler >= 0:
            entry = row(self.h_round[handler])
            if entry["critical_party"] is None:
                entry["critical_party"] = self.h_party[handler]  # the handler that ends the round's path
            compute += self.h_compute[handler]
            entry["compute_s"] += self.h_compute[handler]
            prev, trigger, holder = self.h_prev[handler], self.h_trigger[handler], self.h_core[handler]
            prev_end = ends[prev] if prev >= 0 else 0.0
            core_end = ends[holder] if holder >= 0 else 0.0
            if trigger >= 0 and self.h_ready[handler] >= max(prev_end, core_end):
                # the frame it waited for: from the handler that sent it, or from the hub's
                # forwarding of it (a forwarding handler goes on to the sender, one hop)
                forward = self.d_forward.get(trigger, -1)
                if forward == handler:  # the hub's forwarding: the frame's first link
                    source, sent, hop_count = self.d_handler[trigger], self.d_sent[trigger], 1
                elif forward >= 0:
                    source, sent, hop_count = forward, ends[forward], 1
                else:
                    source, sent, hop_count = self.d_handler[trigger], self.d_sent[trigger], self.d_hops[trigger]
                spent = self.h_ready[handler] - sent
                frame_row = row(self.d_round[trigger])
                frame_row["network_s"] += spent
                frame_row["latency_hops"] += hop_count
                network += spent
                hops += hop_count
                handler = source
            elif holder >= 0 and core_end > max(prev_end, self.h_ready[handler]):
                handler = holder  # it waited for a core of its host, held by that handler
            else:
                gap = self.h_start[handler] - prev_end  # a deadline waited for (0 otherwise)
                waited += gap
                entry["timeout_wait_s"] += gap
                handler = prev
        rounds = [per_round[r] for r in sorted(per_round)]
        for entry in rounds:
            entry["wall_time_s"] = entry["network_s"] + entry["compute_s"] + entry["timeout_wait_s"]
        return {
            "wall_time_s": wall,
            "network_s": network,
            "compute_s": compute,
            "timeout_wait_s": waited,
            "network_share": network / wall if wall > 0 else 0.0,
            "compute_share": compute / wall if wall > 0 else 0.0,
            "latency_hops": hops,
            "rounds": rounds,
            "phases": self._phases(),
            "timeline": self._timeline(wall),
            **({"untraced_handlers": self.untraced,
                "unused_trace_figures": self.trace.handlers - sum(self._traced.values())}
               if self.trace is not None else {}),
        }

    def _phases(self) -> list[dict[str, Any]]:
        """Each ``(round, phase)``: its first frame's send time to the end of the last handler one
        of its frames triggered (its last arrival for frames no handler took)."""
        spans: dict[tuple[int, str], list[float]] = {}
        for d in range(len(self.d_handler)):
            handled = self.d_handled[d]
            end = self.h_end[handled] if handled >= 0 else self.d_arrival[d]
            if not math.isfinite(end):
                continue
            key = (self.d_round[d], self.d_phase[d])
            span = spans.get(key)
            if span is None:
                spans[key] = [self.d_sent[d], end]
            else:
                span[0] = min(span[0], self.d_sent[d])
                span[1] = max(span[1], end)
        ordered = sorted(spans.items(), key=lambda item: (item[1][0], item[0]))
        return [{"round_idx": r, "phase": p, "start_s": s, "end_s": e} for (r, p), (s, e) in ordered]

    def _timeline(self, wall: float) -> dict[str, list[dict[str, Any]]]:
        """Per party and round: compute, and waiting (the gaps before its handlers of that round;
        after its last handler, the wait to the end of the run counts in that handler's round).
        The :data:`TIMELINE_PARTIES` busiest by compute by name, the rest as one ``"summary"``
        row per round (their mean, with ``"parties"``: how many)."""
        compute: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        wait: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        rounds: set[int] = set()
        for h, party in enumerate(self.h_party):
            r = self.h_round[h]
            rounds.add(r)
            prev = self.h_prev[h]
            compute[party][r] += self.h_compute[h]
            wait[party][r] += self.h_start[h] - (self.h_end[prev] if prev >= 0 else 0.0)
        for party, h in self._last.items():
            wait[party][self.h_round[h]] += wall - self.h_end[h]
        order = {p: i for i, p in enumerate(self.parties)}
        ran = sorted(compute, key=lambda p: (-sum(compute[p].values()), order.get(p, len(order)), p))
        shown = ran if len(ran) <= TIMELINE_PARTIES + 1 else ran[:TIMELINE_PARTIES]
        rest = [p for p in ran if p not in set(shown)]
        out: dict[str, list[dict[str, Any]]] = {}
        for party in shown:
            out[party] = [
                {"round_idx": r, "compute_s": compute[party].get(r, 0.0), "wait_s": wait[party].get(r, 0.0)}
                for r in sorted(rounds)
            ]
        if rest:
            n = len(rest)
            out["summary"] = [
                {
                    "round_idx": r,
                    "compute_s": sum(compute[p].get(r, 0.0) for p in rest) / n,
                    "wait_s": sum(wait[p].get(r, 0.0) for p in rest) / n,
                    "parties": n,
                }
                for r in sorted(rounds)
            ]
        return out


def plot_timeline(prediction: Mapping[str, Any], path: str | Path, *, title: str = "") -> Path:
    """Save the timeline figure of a prediction: one row per party (the busiest by compute, then
    one row for the mean of the rest), each round a segment of waiting (hatched, pale) then
    compute (solid), rounds in alternating colours and labelled ``r0``, ``r1``, ... where wide
    enough, predicted seconds on the x axis.

    Args:
        prediction: a report's ``prediction`` (:meth:`LinkSimulator.prediction`).
        path: output file (PNG, SVG or PDF by suffix).
        title: the figure's title (the protocol and the network, say).

    Returns:
        The path written.

    Raises:
        ValueError: ``prediction`` is empty (no model ran).
    """
    timeline = prediction.get("timeline") or {}
    if not timeline:
        raise ValueError("no prediction to draw: the run had no link model")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = list(timeline)
    wall = max(prediction.get("wall_time_s", 0.0), 1e-9)
    colours = plt.get_cmap("tab10").colors
    height = 1.2 + 0.45 * len(rows)
    fig, ax = plt.subplots(figsize=(9.0, height), layout="constrained")
    for y, party in enumerate(rows):
        x = 0.0
        for entry in timeline[party]:
            colour = colours[entry["round_idx"] % 2]
            span = entry["wait_s"] + entry["compute_s"]
            ax.barh(y, entry["wait_s"], left=x, height=0.6, color=colour, alpha=0.25, hatch="///", edgecolor="white")
            ax.barh(y, entry["compute_s"], left=x + entry["wait_s"], height=0.6, color=colour, edgecolor="none")
            if span > 0.04 * wall:
                ax.text(x + span / 2, y, f"r{entry['round_idx']}", ha="center", va="center", fontsize=8)
            x += span
    labels = []
    for party in rows:
        if party == "summary":
            labels.append(f"mean of {timeline[party][0].get('parties', 0)} others" if timeline[party] else "others")
        else:
            labels.append(party)
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("predicted time (s)")
    ax.set_xlim(0, wall)
    handles = [
        Patch(color=colours[0], label="compute (even rounds)"),
        Patch(color=colours[1], label="compute (odd rounds)"),
        Patch(facecolor=colours[0], alpha=0.25, hatch="///", edgecolor="white", label="waiting"),
    ]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(rows) < 4 else -0.12), ncols=3)
    share = prediction.get("network_share", 0.0)
    ax.set_title(
        (f"{title}: " if title else "")
        + f"predicted {prediction.get('wall_time_s', 0.0):.3g} s, network {share:.0%} of the critical path"
    )
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

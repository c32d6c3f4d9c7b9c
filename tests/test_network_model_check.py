"""The link model checked against a real network (issue 31, part 3).

* the delaying relay of ``benchmarks/_delay_relay.py``, on loopback: bytes arrive whole and in
  order both ways, every chunk at least its latency late (a lower bound: a late scheduler can
  only add to it), with a bandwidth at least bytes / bandwidth late, a half-close is forwarded,
  and stopping it ends every thread it started;
* slow, root only: FastLloyd on S1 with 10 clients as TLS parties in network namespaces whose
  client-hub links go through the relay at 25 ms (``benchmarks/_netns_star.py``), after one
  unmeasured run that fills the compile cache: the lean engine's predicted wall time
  (``--network`` with the same link, every party on this machine's cores, this machine's
  per-frame, first-kernel and connection set-up costs measured as ``benchmarks/network_model.py``
  does, and ``--compute trace:`` the measured run's own report: each handler charged the CPU its
  party's process spent on it) is within 15% of the measured span (the last party's start to the
  last finish; the median of three TCP runs), and the trace has a figure for every handler.
  Skipped where namespaces cannot be made.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from fedproto.testing import load_file

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    return load_file(BENCHMARKS / f"{name}.py", f"netcheck_{name}", sibling_imports=True)


delay_relay = _load("_delay_relay")


class Echo:
    """A loopback TCP server that sends back what it reads, then half-closes when its peer does."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def address(self) -> tuple[str, int]:
        return self.listener.getsockname()[:2]

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.thread.join(10)
        self.listener.close()
        assert not self.thread.is_alive()


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, f"connection ended after {len(out)} of {n} bytes"
        out += chunk
    return bytes(out)


@pytest.mark.parametrize(("latency_s", "bandwidth"), [(0.02, None), (0.0, 200_000.0)])
def test_the_relay_delivers_every_byte_in_order_and_late_by_its_latency(latency_s, bandwidth):
    threads_before = threading.active_count()
    echo = Echo()
    relay = delay_relay.DelayRelay(("127.0.0.1", 0), echo.address, latency_s, bandwidth)
    with relay:
        with socket.create_connection(relay.address) as sock:
            payload = bytes(range(256)) * 40  # 10,240 bytes
            rounds = 3
            started = time.monotonic()
            for i in range(rounds):
                message = bytes([i]) + payload
                sock.sendall(message)
                assert _recv_exactly(sock, len(message)) == message
            elapsed = time.monotonic() - started
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(1) == b""  # the echo's half-close came back through the relay
    echo.close()
    # each round trip crosses the relay twice: two latencies at least, and with a bandwidth,
    # the message's bytes at that rate in each direction
    per_trip = 2 * latency_s + (2 * (len(payload) + 1) / bandwidth if bandwidth else 0.0)
    assert elapsed >= rounds * per_trip
    assert relay.bytes == 2 * rounds * (len(payload) + 1)
    assert threading.active_count() == threads_before  # every relay thread ended


def test_the_relay_refuses_a_negative_latency_and_a_zero_bandwidth():
    with pytest.raises(ValueError, match="latency_s"):
        delay_relay.DelayRelay(("127.0.0.1", 0), ("127.0.0.1", 1), -0.001)
    with pytest.raises(ValueError, match="bandwidth"):
        delay_relay.DelayRelay(("127.0.0.1", 0), ("127.0.0.1", 1), 0.001, 0.0)


def test_a_relay_whose_target_is_down_closes_the_connection_and_stops_cleanly():
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        dead = placeholder.getsockname()[:2]  # a port nobody listens on once this closes
    threads_before = threading.active_count()
    with delay_relay.DelayRelay(("127.0.0.1", 0), dead, 0.001) as relay:
        with socket.create_connection(relay.address) as sock:
            sock.settimeout(10)
            assert sock.recv(1) == b""
    assert threading.active_count() == threads_before


@pytest.mark.slow  # four runs of eleven processes starting JAX, then a lean run: about a minute
def test_the_predicted_wall_time_of_fastlloyd_on_s1_is_within_15_percent_of_a_namespaced_tcp_run(tmp_path):
    netns_star = _load("_netns_star")
    reason = netns_star.netns_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    network_model = _load("network_model")
    case = network_model.CASES[0]
    assert (case.protocol, case.data) == ("fastlloyd", "s1")
    latency_s = 0.025
    try:
        costs, _, _ = network_model.measure_costs()
        network_model.warm_up(case, 10, 1000 * latency_s)
        run = network_model.median_run(case, 10, latency_s, tmp_path)
    except netns_star.NetnsUnavailable as exc:
        pytest.skip(str(exc))
    assert run.report.status == "completed" and len(run.parties) == 11
    assert run.relay_bytes > run.report.payload_bytes  # every frame went through the relay (plus TLS)
    assert sorted(run.report.compute_trace) == sorted(run.report.parties)  # each party traced its handlers
    network = costs.network(tmp_path / "net.json", latency_s)
    argv = case.argv(10)
    trace = tmp_path / "tcp_report.json"
    run.report.to_json(trace)
    lean = network_model.predict(argv, network, tmp_path, compute=f"trace:{trace}")
    assert lean["messages"] == run.report.messages  # the same run, frame for frame
    # every handler found its party's figure, and every figure its handler
    assert lean["prediction"]["untraced_handlers"] == lean["prediction"]["unused_trace_figures"] == 0
    predicted = lean["prediction"]["wall_time_s"]
    measured = network_model.measured_span(run)
    assert measured <= run.wall_time_s  # the span from the last start is within the longest party run
    print(f"predicted {predicted:.5f} s, measured {measured:.5f} s, ratio {predicted / measured:.4f}")
    assert abs(predicted / measured - 1) <= 0.15, (predicted, measured)

"""Every TCP run leaves its record: the parties' reports, however the run ends.

* a provisioned federation's hub (``fedproto party ... --party server``), started alone, refusing
  two strangers and then sent SIGTERM, flushes its pending refusal count, prints one line naming
  the signal and its report, writes that report (``interrupted``, ``SIGTERM``) and still ends
  killed by SIGTERM.

Every subprocess runs in its own process group with a timeout; the group is killed in ``finally``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from fedproto.metering import RunReport, report_schema

FEDPROTO = [sys.executable, "-m", "fedproto"]
SECURE_SUM = Path(__file__).resolve().parents[1] / "docs" / "tutorial" / "secure_sum.py"
TIMEOUT_S = 120


def _validate(doc: dict) -> RunReport:
    jsonschema.Draft202012Validator(report_schema()).validate(doc)
    return RunReport.from_dict(doc)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _communicate(proc: subprocess.Popen) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(map(str, proc.args))} did not finish within {TIMEOUT_S} s")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# --- a hub sent SIGTERM ----------------------------------------------------------------------------


def _refused_stranger(port: int) -> None:
    """Connect to the hub, say something that is not TLS, and wait until it hangs up (it has
    refused, and logged or counted the refusal, by then)."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as stranger:
        stranger.sendall(b"GET / HTTP/1.0\r\n\r\n")
        try:
            while stranger.recv(4096):
                pass
        except ConnectionResetError:
            pass


def test_sigterm_to_a_hub_started_alone_leaves_its_line_its_counts_and_its_report(tmp_path):
    from fedproto.provision import provision

    listener = socket.create_server(("127.0.0.1", 0))  # the hub inherits it: no port race
    port = listener.getsockname()[1]
    kits = provision(["server", "client-0", "client-1"], {"server": f"127.0.0.1:{port}"}, tmp_path / "kits")
    path = tmp_path / "server.json"
    cmd = [
        *FEDPROTO, "party", str(SECURE_SUM), "--clients", "2", "--party", "server",
        "--roster", str(kits["server"] / "roster.json"), "--listen-fd", str(listener.fileno()),
        "--party-report", str(path),
    ]
    try:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, start_new_session=True, pass_fds=(listener.fileno(),),
        )
    finally:
        listener.close()
    try:
        _refused_stranger(port)  # logged in full
        _refused_stranger(port)  # counted, its line held back (same host, within the interval)
        proc.send_signal(signal.SIGTERM)
        out, err = _communicate(proc)
    finally:
        _kill_group(proc)
    assert proc.returncode == -signal.SIGTERM, err
    assert out == ""
    lines = _lines(err)
    assert lines[-1] == f"fedproto: server interrupted by SIGTERM; party report written to {path}", err
    assert [line for line in lines if line.startswith("fedproto:")] == lines[-1:], err
    refused, flushed = lines[:-1]
    assert refused.startswith("server: refused connection from 127.0.0.1:"), err
    assert flushed.startswith("server: refused 1 more (connection at the handshake) from 127.0.0.1 "), err

    doc = json.loads(path.read_text())
    assert doc["party"] == "server" and doc["result"] is None
    report = _validate(doc["report"])
    assert report.status == "interrupted"
    assert report.error["signal"] == "SIGTERM" and report.error["type"] == "Interrupted"
    assert report.error["message"] == "server interrupted by SIGTERM"
    assert report.payload_bytes == 0 and report.parties == ("server", "client-0", "client-1")

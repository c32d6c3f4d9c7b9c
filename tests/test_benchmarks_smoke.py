"""Every benchmark script runs with ``--quick`` and prints its table (a smoke test, not a timing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: script -> a line of its main table's title.
SCRIPTS = {
    "message_rate.py": "Message rate (messages/s, best of repeats)",
    "tcp_rate.py": "Round trips/s over TCP loopback",
    "fastlloyd_timing.py": "FastLloyd, M = 2, epsilon = 0.1",
    "scale.py": "One FastLloyd iteration, all parties in one process",
    "kz_communication.py": "(k,z)-center: communication and radius (z points removed) against z",
    "kz_scale.py": "dist-kzc over the memory transport: time per round as n grows",
    "deletion_streams.py": "Amortised seconds per deletion",
    "scma.py": "SCMA decoding time as the support m = K*L grows",
    "mufc_unlearning.py": "Unlearning: mean seconds per random removal",
}
#: scripts whose quick run still takes tens of seconds: run with ``-m slow``.
SLOW = {"kz_communication.py", "kz_scale.py", "deletion_streams.py", "mufc_unlearning.py"}


@pytest.mark.parametrize(
    "script", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW else s for s in sorted(SCRIPTS)]
)
def test_benchmark_runs_quick_and_prints_its_table(script):
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert SCRIPTS[script] in out.stdout, out.stdout[-4000:]
    assert "numpy" in out.stdout and "jax" in out.stdout  # the machine facts come first

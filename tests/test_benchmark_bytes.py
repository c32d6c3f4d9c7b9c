"""The bytes that benchmarks/fastlloyd_timing.py reports are the analytic payload plus envelopes.

The benchmark measures bytes per iteration with its own ``run_once`` and ``iteration_bytes``
(and ``measure`` for the table's row); these tests hold those functions to
``config.payload_bytes_per_iteration(M) = 8 M k (d+1)`` (32-bit ring) plus one envelope per
frame, where the envelope is computed independently from the encoded length of a zero array of
the same shape, and check the envelope is at most 48 bytes per message.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedproto.algorithms.fastlloyd.config import make_config
from fedproto.algorithms.fastlloyd.messages import MaskedUpdate, NoisyAggregate
from fedproto.codec import encode_frame
from fedproto.testing import load_file

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
KDS = [(2, 2), (2, 5), (5, 2), (5, 5)]
M = 2
N = 400


def _load_benchmark(name: str):
    """Import ``benchmarks/<name>.py`` (a script, not a package; it imports its sibling ``_common``)."""
    return load_file(BENCHMARKS / f"{name}.py", f"benchmark_{name}", sibling_imports=True)


timing = _load_benchmark("fastlloyd_timing")


def envelope(message_cls: type, k: int, d: int, *, round_idx: int, phase: str) -> int:
    """Encoded frame length minus raw bytes of a zero ``uint32 [k, d+1]`` array."""
    masked = np.zeros((k, d + 1), np.uint32)
    frame = encode_frame(message_cls(masked=masked), session=timing.SESSION, round_idx=round_idx, phase=phase)
    return len(frame) - masked.nbytes


@pytest.mark.parametrize(("k", "d"), KDS)
async def test_measured_bytes_per_iteration_are_payload_plus_envelopes(k, d):
    x = timing.timesynth(N, k, d, seed=1)
    config = make_config("fastlloyd", n=N, k=k, d=d, epsilon=timing.EPSILON, ring_bits=32, iterations=3)
    report = await timing.run_once(x, config, M, seed=1)
    by_round = timing.iteration_bytes(report)
    assert sorted(by_round) == [0, 1, 2]
    assert timing.iteration_messages(report) == {0: 2 * M, 1: 2 * M, 2: 2 * M}
    analytic = config.payload_bytes_per_iteration(M)
    assert analytic == 8 * M * k * (d + 1)
    for round_idx, nbytes in by_round.items():
        up = envelope(MaskedUpdate, k, d, round_idx=round_idx, phase="update")
        down = envelope(NoisyAggregate, k, d, round_idx=round_idx, phase="aggregate")
        assert up <= 48 and down <= 48
        assert nbytes == analytic + M * (up + down)


@pytest.mark.parametrize(("k", "d"), KDS)
def test_table_row_envelope_column_is_the_frames_envelopes(k, d):
    """``measure`` (one table row): bytes/iter - analytic = 2 M envelopes of <= 48 bytes."""
    row = timing.measure(N, k, d, repeats=1, latency_s=0.0, seed=2, ring_bits=32)
    assert row.ring_bits == 32
    assert row.analytic_bytes == 8 * M * k * (d + 1)
    envelopes = [
        envelope(MaskedUpdate, k, d, round_idx=t, phase="update")
        + envelope(NoisyAggregate, k, d, round_idx=t, phase="aggregate")
        for t in range(row.iterations)
    ]
    assert row.bytes_per_iteration - row.analytic_bytes == M * sum(envelopes) / len(envelopes)
    assert (row.bytes_per_iteration - row.analytic_bytes) / (2 * M) <= 48

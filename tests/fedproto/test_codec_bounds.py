"""Decoding is total and bounded (issue 14): hostile frames cost a small multiple of their size.

Peak allocations are measured with ``tracemalloc`` while ``decode_frame`` runs on a frame built
beforehand (the frame itself is not counted). No test here is timed: linear time shows as bounded
allocation, since every object the decoder builds is counted.
"""

from __future__ import annotations

import sys
import tracemalloc

import msgpack
import numpy as np
import pytest

import fedproto.algorithms.fastlloyd.messages as fastlloyd
import fedproto.algorithms.mufc.messages as mufc
from fedproto.codec import decode_frame, encode_frame
from fedproto.errors import DecodeError
from fedproto.messages import Message, array_field, bigints_field

MiB = 1 << 20
HOSTILE_BYTES = 16 * MiB
PEAK_LIMIT = 64 * MiB  # the issue's bound for a 16 MiB hostile frame


def _envelope(tag: str, body: bytes, *, phase: bytes = b"\xa1x") -> bytes:
    """A frame of ``body`` and ``phase``, msgpack bytes built by hand (key order v, t, s, r, p, b)."""
    head = b"\x86" + b"".join(msgpack.packb(x) for x in ("v", 1, "t", tag, "s", 0, "r", 0, "p"))
    return head + phase + msgpack.packb("b") + body


def _array32(n: int) -> bytes:
    return b"\xdd" + n.to_bytes(4, "big")


def _bin32(n: int) -> bytes:
    return b"\xc6" + n.to_bytes(4, "big")


def _peak(frame: bytes, **kwargs) -> tuple[int, object]:
    """Peak bytes allocated while decoding ``frame``, and the outcome (message or DecodeError)."""
    tracemalloc.start()
    try:
        outcome: object = decode_frame(frame, max_frame_bytes=1 << 30, **kwargs)[1]
    except DecodeError as exc:
        outcome = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, outcome


# --- totality --------------------------------------------------------------------------------------


def test_issue_reproducer_raises_decode_error_naming_the_field():
    frame = msgpack.packb({"v": 1, "t": "fl.update", "s": 0, "r": 0, "p": "x", "b": [["u4", [0, 2**63], b""]]})
    with pytest.raises(DecodeError, match=r"^fl\.update\.masked: dimension 9223372036854775808"):
        decode_frame(frame)


@pytest.mark.parametrize(
    "shape",
    [[0, 2**63], [2**63, 0], [0, 2**64 - 1], [2**40, 0], [0, 2**31, 2**31], [1, 2**62]],
    ids=str,
)
def test_zero_size_arrays_with_huge_dimensions_are_refused(shape):
    frame = msgpack.packb({"v": 1, "t": "fl.update", "s": 0, "r": 0, "p": "x", "b": [["u4", shape, b""]]})
    with pytest.raises(DecodeError, match=r"^fl\.update\.masked: "):
        decode_frame(frame)


def test_dimension_bound_follows_max_frame_bytes():
    class Table(Message, tag="test.bounds.table"):
        rows: np.ndarray = array_field("float64", 2)

    empty = Table(rows=np.zeros((0, 1000)))
    frame = encode_frame(empty, session=0, round_idx=0, phase="p")
    assert decode_frame(frame)[1].rows.shape == (0, 1000)  # an empty table of 1000 columns is fine
    # ... unless 1000 columns of float64 could not travel in a frame this receiver accepts
    with pytest.raises(DecodeError, match=r"test\.bounds\.table\.rows: dimension 1000 .* exceeds 999 elements"):
        decode_frame(frame, max_frame_bytes=8 * 999 + 7)
    assert decode_frame(frame, max_frame_bytes=8 * 1000)[1].rows.shape == (0, 1000)


class Fragile(Message, tag="test.bounds.fragile"):
    """A message whose validation raises whatever ``mode`` asks for (not only ValueError)."""

    mode: int

    def __post_init__(self) -> None:
        if self.mode == 1:
            raise OverflowError("too large")
        if self.mode == 2:
            (1,)[self.mode]  # IndexError
        if self.mode == 3:
            self.mode // 0  # ZeroDivisionError
        if self.mode == 4:
            np.zeros(2**62)  # numpy: MemoryError or ValueError
        if self.mode == 5:
            raise KeyError("mode")


@pytest.mark.parametrize("mode", [1, 2, 3, 4, 5])
def test_any_exception_of_message_validation_is_a_decode_error_naming_the_tag(mode):
    frame = msgpack.packb({"v": 1, "t": "test.bounds.fragile", "s": 0, "r": 0, "p": "x", "b": [mode]})
    with pytest.raises(DecodeError, match=r"^test\.bounds\.fragile: invalid field values: \w+Error"):
        decode_frame(frame)
    assert decode_frame(msgpack.packb({"v": 1, "t": "test.bounds.fragile", "s": 0, "r": 0, "p": "x", "b": [0]}))


def test_body_before_tag_decodes_as_the_canonical_order_does():
    message = fastlloyd.MaskedUpdate(masked=np.arange(12, dtype=np.uint32).reshape(3, 4))
    canonical = msgpack.unpackb(encode_frame(message, session=5, round_idx=2, phase="p"))
    for order in ("bvtsrp", "vbtsrp", "ptsrvb"):
        frame = msgpack.packb({key: canonical[key] for key in order}, use_bin_type=True)
        envelope, decoded = decode_frame(frame)
        assert (envelope.session, envelope.round_idx, envelope.phase) == (5, 2, "p")
        assert decoded.masked.tolist() == message.masked.tolist()
    broken = {**canonical, "b": [["u4", [3, 5], canonical["b"][0][2]]]}
    with pytest.raises(DecodeError, match=r"^fl\.update\.masked: 48 data bytes do not match shape \(3, 5\)"):
        decode_frame(msgpack.packb({key: broken[key] for key in "bvtsrp"}, use_bin_type=True))


def test_trailing_bytes_and_truncation_are_refused():
    frame = encode_frame(mufc.AggregationRequest(active=tuple(range(40)), attempt=1), session=0, round_idx=0, phase="p")
    assert decode_frame(frame)[1].active == tuple(range(40))
    with pytest.raises(DecodeError, match="trailing"):
        decode_frame(frame + b"\x00")
    for cut in range(len(frame)):
        with pytest.raises(DecodeError):
            decode_frame(frame[:cut])


def test_frames_may_be_any_contiguous_buffer_and_are_copied_out_of_it():
    message = fastlloyd.MaskedUpdate(masked=np.arange(6, dtype=np.uint32).reshape(2, 3))
    frame = bytearray(encode_frame(message, session=0, round_idx=0, phase="p"))
    for buffer in (frame, memoryview(frame), np.frombuffer(frame, dtype=np.uint8).reshape(1, -1).data):
        assert decode_frame(buffer)[1].masked.tolist() == [[0, 1, 2], [3, 4, 5]]
    decoded = decode_frame(frame)[1]
    frame[:] = bytes(len(frame))  # a transport reusing its receive buffer does not change the message
    assert decoded.masked.tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(DecodeError, match="contiguous"):
        decode_frame(memoryview(bytes(frame) * 2)[::2])


def test_width_contradicting_the_stated_width_is_refused_naming_the_field():
    frame = msgpack.packb(
        {"v": 1, "t": "mufc.syndromes", "s": 0, "r": 0, "p": "x", "b": [0, 2, [1, b"\x07" * 10]]},
        use_bin_type=True,
    )
    with pytest.raises(DecodeError, match=r"^mufc\.syndromes\.values: big integers travel with width 1"):
        decode_frame(frame)


# --- bounded cost ----------------------------------------------------------------------------------


def _wide_phase(n: int) -> bytes:
    """An ASCII phase string but for one 4-byte character, as long as the budget allows (the frame
    padded by array data after it): CPython builds it 1 byte wide, then widens it to 4 bytes."""
    words = n // 2 // 4
    body = b"\x91\x93\xa2u4\x92\x01\xce" + words.to_bytes(4, "big") + _bin32(4 * words) + bytes(4 * words)
    phase = b"\xdb" + (n // 2).to_bytes(4, "big") + b"a" * (n // 2 - 4) + "\U0001f600".encode()
    return _envelope("fl.update", body, phase=phase)


def _body_first(n: int) -> bytes:
    """Nested empty arrays as the body, sent before the tag (the decoder steps over it unbuilt)."""
    tail = b"".join(msgpack.packb(x) for x in ("v", 1, "t", "fl.update", "s", 0, "r", 0, "p", "x"))
    return b"\x86" + msgpack.packb("b") + b"\x91" + _array32(n) + b"\x90" * n + tail


# Frames of 16 MiB built by their test (n: bytes for the hostile part); all but the wide phase
# string are refused.
HOSTILE = {
    # the issue's frame: a body of nested empty arrays (1,164 MiB before)
    "nested empty arrays in a field": lambda n: _envelope("fl.update", b"\x91" + _array32(n) + b"\x90" * n),
    "nested empty arrays as the body": lambda n: _envelope("fl.update", _array32(n) + b"\x90" * n),
    "nested empty arrays before the tag": _body_first,
    "deep nesting": lambda n: _envelope("fl.update", b"\x91" * n),
    "tiny ints in a tuple field": lambda n: _envelope("mufc.open", b"\x92" + _array32(n) + b"\x01" * n + b"\x00"),
    "empty bytes in a tuple field": lambda n: _envelope(
        "fl.sealed", b"\x91" + _array32(n // 2) + b"\xc4\x00" * (n // 2)
    ),
    "a phase string of 4-byte characters": lambda n: _envelope(
        "fl.update",
        b"\x91\x93\xa2u4\x92\x01\x02\xc4\x08" + bytes(8),
        phase=b"\xdb" + (n // 4 * 4).to_bytes(4, "big") + "\U0001f600".encode() * (n // 4),
    ),
    "a wide phase string up to the budget (a valid message)": _wide_phase,
    "a width-1 big integer field stated as width 2": lambda n: _envelope(
        "mufc.syndromes", b"\x93\x00\x02\x92\x01" + _bin32(n) + b"\x07" * n
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_16_mib_frame_allocates_under_64_mib(name):
    frame = HOSTILE[name](HOSTILE_BYTES - 64)
    assert HOSTILE_BYTES - 64 < len(frame) <= HOSTILE_BYTES + 64
    peak, outcome = _peak(frame)
    assert isinstance(outcome, fastlloyd.MaskedUpdate if "valid message" in name else DecodeError)
    assert peak < PEAK_LIMIT, f"{name}: {peak / MiB:.0f} MiB"


def test_plain_values_up_to_the_budget_allocate_under_4x_the_frame():
    # as many 3-byte ints (28-byte int objects) as the budget allows, the frame then padded by a
    # bytes value where an int belongs: the budget, not the ints, decides where decoding stops
    n_bytes = 2 * MiB
    n_ints = n_bytes // 8
    padding = n_bytes - 3 * n_ints - 64
    ints = _array32(n_ints) + b"\xcd\x01\x01" * n_ints
    frame = _envelope("mufc.open", b"\x92" + ints + _bin32(padding) + bytes(padding))
    peak, outcome = _peak(frame)
    assert isinstance(outcome, DecodeError) and str(outcome).startswith("mufc.open.active: decoded values would")
    assert peak < 3.5 * len(frame) + 1.1 * MiB


def test_legitimate_16_mib_array_frame_costs_about_its_size():
    message = fastlloyd.MaskedUpdate(masked=np.ones((HOSTILE_BYTES // 4 // 1024, 1024), dtype=np.uint32))
    frame = encode_frame(message, session=0, round_idx=0, phase="p")
    peak, outcome = _peak(frame)
    assert isinstance(outcome, fastlloyd.MaskedUpdate) and outcome.masked.shape == message.masked.shape
    assert peak < 1.1 * len(frame)  # the data bytes once; the array is a view of them


def test_legitimate_plain_tuples_fit_the_budget():
    keys = tuple(i.to_bytes(32, "big") for i in range(1, 100_001))  # 100,000 parties' keys
    frame = encode_frame(fastlloyd.PublicKeys(public_keys=keys), session=0, round_idx=0, phase="p")
    peak, outcome = _peak(frame)
    assert isinstance(outcome, fastlloyd.PublicKeys) and outcome.public_keys == keys
    assert peak < 4 * len(frame)


class BigInts(Message, tag="test.bigints"):
    """Big integers decoded as a tuple of ints (MUFC's shares, in contrast, stay packed)."""

    attempt: int
    width: int
    values: tuple[int, ...] = bigints_field(width_from="width")


def _syndromes(count: int, width: int, tag: str = "test.bigints") -> bytes:
    values = b"\xff" * (count * width)
    body = b"\x93\x00" + bytes([width]) + b"\x92" + bytes([width]) + _bin32(len(values)) + values
    return _envelope(tag, body)


def _decoded_int_bytes(count: int, width: int) -> int:
    # the message's tuple of ints is unavoidable: 8 bytes of tuple per value, plus an int object
    # where the value is not a shared small int
    return count * (8 + (0 if width == 1 else sys.getsizeof(256**width - 1)))


@pytest.mark.parametrize("width", [1, 2, 3, 8, 16, 32])
def test_big_integers_within_the_budget_cost_their_python_ints_and_no_more(width):
    # as many integers as the frame's budget (2.5 bytes per frame byte + 1 MiB) admits at this
    # width, up to 2 MiB of them: count * per_value <= 2.5 * count * width + 1 MiB
    per_value = _decoded_int_bytes(1, width) + (8 if 2 < width < 8 else 0)
    excess = per_value - 2.5 * width
    count = 2 * MiB // width if excess <= 0 else min(2 * MiB // width, int(MiB / excess) - 64)
    frame = _syndromes(count, width)
    peak, outcome = _peak(frame)
    assert isinstance(outcome, BigInts) and len(outcome.values) == count
    scratch = 8 * count if 1 < width < 8 else 0  # the values as native 8-byte integers, vectorised
    assert peak < _decoded_int_bytes(count, width) + scratch + 2 * len(frame) + 64 * 1024


@pytest.mark.parametrize("width", [1, 2, 3, 8, 16])
def test_a_16_mib_frame_of_narrow_big_integers_is_refused_before_they_are_built(width):
    frame = _syndromes(HOSTILE_BYTES // width, width)
    peak, outcome = _peak(frame)
    assert isinstance(outcome, DecodeError) and "would take" in str(outcome)
    assert str(outcome).startswith("test.bigints.values:")
    assert peak < PEAK_LIMIT


def test_wide_big_integers_of_a_16_mib_frame_decode_within_the_issue_bound():
    # 32-byte field elements (a 256-bit prime, as MUFC's grids give) cost about twice their bytes
    frame = _syndromes(HOSTILE_BYTES // 32, 32)
    peak, outcome = _peak(frame)
    assert isinstance(outcome, BigInts)
    assert peak < 3.5 * len(frame) + MiB


@pytest.mark.parametrize("width", [1, 9, 32])
def test_a_16_mib_frame_of_packed_big_integers_decodes_as_a_view_of_its_bytes(width):
    frame = _syndromes(HOSTILE_BYTES // width, width, tag="mufc.syndromes")
    peak, outcome = _peak(frame)
    assert isinstance(outcome, mufc.MaskedSyndromes) and outcome.values.shape == (HOSTILE_BYTES // width, width)
    assert peak < 1.1 * len(frame)
"""fedproto.framesize: the bound of a frame's encoded size from a message class's declared fields.

The bound must hold for every message no larger than the stated sizes (a party of a run must never
send a frame its peers refuse) and stay within a small constant of the exact size (else the
per-run frame limit would not limit much).
"""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fedproto
from fedproto.codec import encode_frame
from fedproto.framesize import MAX_PHASE_BYTES, abort_notice_frame_bytes, max_frame_bytes
from fedproto.messages import ABORT_REASON_MAX_CHARS, AbortNotice, Message, array_field, bigints_field


class Everything(Message, tag="test.framesize.everything"):
    """One field of every kind the codec knows."""

    version: int
    loss: float
    final: bool
    label: str
    key: bytes
    keys: tuple[bytes, ...]
    members: tuple[int, ...]
    width: int
    values: tuple[int, ...] = bigints_field(width_from="width")
    fixed: tuple[int, ...] = bigints_field(16)
    ring: np.ndarray = array_field(("uint32", "uint64"), 2)
    ids: np.ndarray = array_field("int64", 1)
    cube: np.ndarray = array_field("float64", 3)
    flags: np.ndarray = array_field("bool", 1)


class Empty(Message, tag="test.framesize.empty"):
    """No fields: the envelope alone."""


def _dims(max_size: int):
    return st.integers(min_value=0, max_value=max_size)


@st.composite
def _messages(draw):
    """A random message and the sizes a plugin would state for it (the message's own sizes)."""
    dtype = draw(st.sampled_from(["uint32", "uint64"]))
    ring_shape = (draw(_dims(40)), draw(_dims(40)))
    n_ids = draw(st.sampled_from([0, 1, 15, 16, 255, 256, 70_000]))  # msgpack header boundaries
    cube_shape = (draw(_dims(5)), draw(_dims(300)), draw(_dims(3)))
    width = draw(st.integers(min_value=1, max_value=40))
    n_values = draw(_dims(300))
    n_keys = draw(_dims(40))
    key_bytes = draw(st.sampled_from([0, 31, 32, 255, 256, 70_000]))
    message = Everything(
        version=draw(st.integers(min_value=-(2**63), max_value=2**64 - 1)),
        loss=draw(st.floats(allow_nan=False)),
        final=draw(st.booleans()),
        label=draw(st.text(max_size=300)),
        key=bytes(key_bytes),
        keys=tuple(bytes(32) for _ in range(n_keys)),
        members=tuple(draw(st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=30))),
        width=width,
        values=tuple(draw(st.lists(st.integers(0, 2 ** (8 * width) - 1), min_size=n_values, max_size=n_values))),
        fixed=tuple(range(draw(_dims(20)))),
        ring=np.zeros(ring_shape, dtype=dtype),
        ids=np.zeros(n_ids, dtype=np.int64),
        cube=np.zeros(cube_shape),
        flags=np.zeros(draw(_dims(70)), dtype=bool),
    )
    stated = dict(
        arrays={"ring": ring_shape, "ids": (n_ids,), "cube": cube_shape, "flags": (message.flags.shape[0],)},
        dtypes={"ring": dtype},
        bigints={"values": (n_values, width), "fixed": (len(message.fixed), 16)},
        # plain values as their largest example: the label's UTF-8 length, the tuples' lengths
        plain={"label": message.label, "key": message.key, "keys": message.keys, "members": message.members},
    )
    return message, stated


# Slack of the bound over the exact size: session and round (8 bytes each beyond a fixint), the
# phase (its length up to MAX_PHASE_BYTES, and a longer str header), and 8 bytes per number
# smaller than its widest encoding (Everything's 3 numeric fields and the members tuple).
def _slack(message: Everything, phase: str) -> int:
    numbers = 3 + len(message.members)
    return 2 * 8 + (MAX_PHASE_BYTES - len(phase.encode())) + 1 + 8 * numbers


@settings(max_examples=150, deadline=None)
@given(
    case=_messages(),
    session=st.integers(min_value=0, max_value=2**64 - 1),
    round_idx=st.integers(min_value=0, max_value=2**64 - 1),
    phase=st.text(max_size=16).filter(lambda p: len(p.encode()) <= MAX_PHASE_BYTES),
)
def test_the_bound_holds_and_is_tight_for_random_shapes(case, session, round_idx, phase):
    message, stated = case
    frame = encode_frame(message, session=session, round_idx=round_idx, phase=phase)
    bound = max_frame_bytes(Everything, **stated)
    assert len(frame) <= bound <= len(frame) + _slack(message, phase)


@pytest.mark.parametrize("size", [0, 1, 15, 16, 31, 32, 255, 256, 65_535, 65_536])
def test_the_bound_is_exact_at_the_widest_envelope_and_numbers(size):
    # every msgpack header size (fix, 8, 16 and 32-bit) of str, bin, array and int
    message = Everything(
        version=2**64 - 1, loss=0.5, final=True, label="x" * size, key=bytes(size), keys=(bytes(size),) * min(size, 20),
        members=(2**64 - 1,) * size, width=3, values=(7,) * size, fixed=(1,) * size,
        ring=np.zeros((size, 1), dtype=np.uint32), ids=np.zeros(size, dtype=np.int64), cube=np.zeros((1, size, 2)),
        flags=np.zeros(size, dtype=bool),
    )
    frame = encode_frame(message, session=2**64 - 1, round_idx=2**64 - 1, phase="p" * MAX_PHASE_BYTES)
    stated = {
        "arrays": {"ring": (size, 1), "ids": (size,), "cube": (1, size, 2), "flags": (size,)},
        "dtypes": {"ring": "uint32"},
        "bigints": {"values": (size, 3), "fixed": (size, 16)},
        "plain": {"label": message.label, "key": message.key, "keys": message.keys, "members": message.members},
    }
    # every number at its widest but the bool and the width 3 (1 byte each, counted as 9)
    assert max_frame_bytes(Everything, **stated) == len(frame) + 2 * 8


def test_smaller_messages_stay_under_the_bound_of_the_largest():
    # a plugin states the largest shapes; every smaller message of the run fits
    bound = max_frame_bytes(Everything, arrays={"ring": (8, 5), "ids": (300,), "cube": (2, 3, 4), "flags": (9,)},
                            bigints={"values": (100, 9), "fixed": (4, 16)},
                            plain={"label": "x" * 40, "key": bytes(32), "keys": (bytes(32),) * 5, "members": (0,) * 5})
    rng = np.random.default_rng(0)
    for _ in range(200):
        width = int(rng.integers(1, 10))
        message = Everything(
            version=int(rng.integers(-(2**62), 2**62)), loss=float(rng.normal()), final=bool(rng.integers(2)),
            label="é" * int(rng.integers(0, 21)), key=bytes(int(rng.integers(0, 33))),
            keys=(bytes(32),) * int(rng.integers(0, 6)), members=tuple(range(int(rng.integers(0, 6)))),
            width=width, values=(2 ** (8 * width) - 1,) * int(rng.integers(1, 101)), fixed=(1,) * int(rng.integers(5)),
            ring=np.zeros((int(rng.integers(9)), int(rng.integers(6))), dtype=np.uint64),
            ids=np.zeros(int(rng.integers(301)), dtype=np.int64),
            cube=np.zeros((int(rng.integers(3)), int(rng.integers(4)), int(rng.integers(5)))),
            flags=np.zeros(int(rng.integers(10)), dtype=bool),
        )
        frame = encode_frame(message, session=2**64 - 1, round_idx=2**64 - 1, phase="p" * MAX_PHASE_BYTES)
        assert len(frame) <= bound


def test_a_message_without_fields_is_its_envelope():
    frame = encode_frame(Empty(), session=0, round_idx=0, phase="")
    assert len(frame) <= max_frame_bytes(Empty) <= len(frame) + 2 * 8 + MAX_PHASE_BYTES + 1
    assert max_frame_bytes(Empty, phase_bytes=0) < max_frame_bytes(Empty)


def test_the_array_dtype_defaults_to_the_widest_the_field_declares():
    arrays = {"ring": (10, 10), "ids": (0,), "cube": (0, 0, 0), "flags": (0,)}
    plain = {"label": "", "key": b"", "keys": (), "members": ()}
    bigints = {"values": (0, 1), "fixed": (0, 16)}
    wide = max_frame_bytes(Everything, arrays=arrays, bigints=bigints, plain=plain)
    narrow = max_frame_bytes(Everything, arrays=arrays, bigints=bigints, plain=plain, dtypes={"ring": "uint32"})
    assert wide - narrow == 100 * 4


def test_the_abort_notice_bound_covers_the_longest_notice():
    parties = ("coordinator", *(f"machine-{i}" for i in range(30)))
    notice = AbortNotice(culprits=parties, reason="\U0010ffff" * ABORT_REASON_MAX_CHARS, origin="coordinator")
    frame = encode_frame(notice, session=2**64 - 1, round_idx=2**64 - 1, phase="abort")
    assert len(frame) <= abort_notice_frame_bytes(parties) <= len(frame) + 2 * MAX_PHASE_BYTES


_PLAIN = {"label": "", "key": b"", "keys": (), "members": ()}
_BIGINTS = {"values": (1, 1), "fixed": (1, 16)}
_ARRAYS = {"ring": (1, 2), "ids": (1,), "cube": (1, 1, 1), "flags": (1,)}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"arrays": {**_ARRAYS, "nope": (1,)}}, "arrays names fields the message does not have: nope"),
        ({"arrays": {k: v for k, v in _ARRAYS.items() if k != "ring"}}, r"everything\.ring: state the array's"),
        ({"arrays": {**_ARRAYS, "ring": (1, 2, 3)}}, r"everything\.ring: the field has 2 dimensions"),
        ({"arrays": {**_ARRAYS, "ids": (-2,)}}, r"everything\.ids: shape \(-2,\) must hold non-negative"),
        ({"dtypes": {"ring": "float64"}}, r"everything\.ring: dtype float64 is not one the field declares"),
        ({"bigints": {"values": (1, 2)}}, r"everything\.fixed: state \(count, width_bytes\)"),
        ({"bigints": {**_BIGINTS, "fixed": (1, 8)}}, r"everything\.fixed: the field's width is 16 bytes, got 8"),
        ({"bigints": {**_BIGINTS, "values": (-1, 2)}}, r"everything\.values: count must be >= 0"),
        ({"phase_bytes": -1}, "phase_bytes must be non-negative"),
    ],
)
def test_bad_statements_name_the_field(change, match):
    kwargs = {"arrays": _ARRAYS, "bigints": _BIGINTS, "plain": _PLAIN, **change}
    with pytest.raises(ValueError, match=match):
        max_frame_bytes(Everything, **kwargs)


def test_a_plain_field_that_is_not_a_number_must_be_stated():
    plain = {k: v for k, v in _PLAIN.items() if k != "keys"}
    with pytest.raises(TypeError, match=r"everything\.keys: state the field's largest value in plain="):
        max_frame_bytes(Everything, arrays=_ARRAYS, bigints=_BIGINTS, plain=plain)
    with pytest.raises(TypeError, match=r"everything\.label: cannot bound the encoded size of a object"):
        max_frame_bytes(Everything, arrays=_ARRAYS, bigints=_BIGINTS, plain={**_PLAIN, "label": object()})


def test_only_registered_message_classes_are_bounded():
    class Loose:
        TAG = "test.framesize.loose"

    with pytest.raises(TypeError, match="not a registered message class"):
        max_frame_bytes(Loose)  # type: ignore[arg-type]


def test_protocol_authors_find_it_at_the_top():
    assert fedproto.max_frame_bytes is max_frame_bytes and "max_frame_bytes" in fedproto.__all__

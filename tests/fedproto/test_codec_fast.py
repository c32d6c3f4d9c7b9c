"""The codec's one-pass decoding of common frames changes no outcome, only the cost.

``decode_frame`` first tries ``codec._decode_fast`` on ``bytes`` of at most 16 KiB: the canonical
frame of a message whose fields are arrays, packed big integers and plain scalars (or tuples of
scalars), checked in one pass. It must accept only what the general paths (one msgpack call for small frames, the
streaming reader for any frame) accept, with the same envelope and message, and decline the rest,
which the general paths then decide. (The small-frame path takes the same one-pass checks on what
it unpacked, which ``test_codec_fuzz`` compares with the streaming path; here the fast pass is
compared with the streaming path directly.) Checked here on the structured fuzz of ``test_codec_fuzz``
(another seed), on random shapes, and on the edges of its use (frame limit, buffer types, size).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedproto import codec
from fedproto import messages as messages_module
from fedproto.algorithms.fastlloyd.messages import MaskedUpdate
from fedproto.algorithms.mufc.messages import MaskedSyndromes
from fedproto.codec import DEFAULT_MAX_FRAME_BYTES, decode_frame, encode_frame
from fedproto.errors import DecodeError
from fedproto.messages import registered_tags
from fedproto.testing import load_file


#: ``test_codec_fuzz`` (its frame generator, message comparison and array fields), loaded by path
fuzz = load_file(Path(__file__).with_name("test_codec_fuzz.py"), "codec_fuzz_helpers")
SEED = 1411


def _general(frame: bytes):
    """What the streaming path (which decides any frame, and shares no shortcut with the fast
    pass) makes of ``frame``: the decoded pair, or None for a DecodeError."""
    try:
        return codec._decode_streaming(memoryview(frame), DEFAULT_MAX_FRAME_BYTES)
    except DecodeError:
        return None


def _agrees(frame: bytes) -> bool:
    """The fast pass accepts only what the general paths accept, identically; True if it accepted."""
    fast = codec._decode_fast(frame, DEFAULT_MAX_FRAME_BYTES)
    if fast is None:
        return False
    general = _general(frame)
    assert general is not None, f"only the fast pass accepts frame {frame[:300].hex()}"
    assert fast[0] == general[0] and type(fast[0]) is type(general[0])
    assert fuzz._same_message(fast[1], general[1]), frame[:300].hex()
    for f in dataclasses.fields(fast[1]):
        value = getattr(fast[1], f.name)
        if isinstance(value, np.ndarray):  # a read-only view of the frame's bytes, as the general paths give
            assert not value.flags.writeable
    return True


def test_fuzzed_frames_are_decided_alike():
    rng = np.random.default_rng(SEED)
    tags = sorted(registered_tags())
    accepted = 0
    for i in range(10_000):
        frame = fuzz._fuzzed_frame(rng, registered_tags()[tags[i % len(tags)]], tags)
        accepted += _agrees(frame)
    assert accepted > 300  # the fast pass is exercised, not vacuously declining


def test_valid_frames_of_most_classes_take_the_fast_pass():
    rng = np.random.default_rng(SEED)
    taken = set()
    for tag, cls in sorted(registered_tags().items()):
        for _ in range(10):
            frame, message = fuzz._seed(rng, cls)
            if message is not None and len(frame) <= codec._FAST_FRAME_BYTES and _agrees(frame):
                taken.add(tag)
    assert {MaskedUpdate.TAG, MaskedSyndromes.TAG} <= taken and len(taken) >= 0.5 * len(registered_tags())


@pytest.mark.parametrize(
    "width, data, stated",
    [(9, bytes(27), 9), (9, bytes(26), 9), (8, bytes(24), 9), (0, b"", 9), (-1, bytes(9), 9), (9.0, bytes(9), 9),
     (9, "x" * 9, 9), (9, bytes(9), 8), (True, bytes(3), 1), (1, bytes(3), True), (2**62, b"", 2**62)],
)
def test_packed_big_integers_are_decided_alike(width, data, stated):
    """MUFC's shares (big integers kept packed, their width stated by another field) take the
    fast pass only when the general paths accept the frame with the same view."""
    frame = encode_frame(MaskedSyndromes(attempt=0, width=9, values=(1, 2, 3)), session=1, round_idx=0, phase="a")
    obj = msgpack.unpackb(frame)
    body = obj["b"]
    index = [f.name for f in dataclasses.fields(MaskedSyndromes)].index("values")
    body[index] = [width, data]
    body[[f.name for f in dataclasses.fields(MaskedSyndromes)].index("width")] = stated
    forged = msgpack.packb(obj, use_bin_type=True)
    taken = _agrees(forged)
    assert taken == (_general(forged) is not None)
    assert taken == ((width, len(data), stated) == (9, 27, 9))


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.data())
def test_any_shape_for_any_array_field_is_decided_alike(data):
    cls, index, field = data.draw(st.sampled_from(fuzz.array_fields()))
    frame, _ = fuzz._seed(np.random.default_rng(data.draw(st.integers(0, 2**32))), cls)
    obj = msgpack.unpackb(frame)
    dims = st.integers(0, 2**64 - 1) | st.sampled_from([0, 1, 2, 3, 2**31, 2**62, 2**64 - 1])
    obj["b"][index][1] = data.draw(st.lists(dims, max_size=field.metadata["ndim"] + 1))
    if data.draw(st.booleans()):
        obj["b"][index][2] = data.draw(st.binary(max_size=64))
    _agrees(msgpack.packb(obj, use_bin_type=True))


def test_the_frame_limit_and_the_dimension_bound_hold_on_the_fast_pass():
    frame = encode_frame(MaskedUpdate(masked=np.ones((4, 3), dtype=np.uint32)), session=1, round_idx=0, phase="p")
    with pytest.raises(DecodeError, match="exceeds the maximum"):
        decode_frame(frame, max_frame_bytes=len(frame) - 1)
    # 12 elements of 4 bytes: a limit of 44 bytes allows 11 elements per array
    assert codec._decode_fast(frame, 44) is None
    with pytest.raises(DecodeError, match="describes more than 11 elements"):
        codec._decode_small(memoryview(frame), 44)


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_every_buffer_type_and_size_decodes_the_same(wrap, monkeypatch):
    tried = []
    fast = codec._decode_fast
    monkeypatch.setattr(codec, "_decode_fast", lambda frame, limit: tried.append(len(frame)) or fast(frame, limit))
    for rows in (1, 64, 2048):  # 2048 x 3 x 4 bytes: beyond the fast pass's 16 KiB
        message = MaskedUpdate(masked=np.arange(3 * rows, dtype=np.uint32).reshape(rows, 3))
        frame = encode_frame(message, session=7, round_idx=2, phase="p")
        envelope, decoded = decode_frame(wrap(frame))
        assert envelope == codec.Envelope(1, MaskedUpdate.TAG, 7, 2, "p")
        np.testing.assert_array_equal(decoded.masked, message.masked)
    # only bytes of at most 16 KiB take the fast pass; the rest go straight to the general paths
    assert all(n <= codec._FAST_FRAME_BYTES for n in tried) and (len(tried) == 2) == (wrap is bytes)


@pytest.mark.parametrize("filler", [b"\x90", b"\x80"], ids=["empty arrays", "empty maps"])
def test_what_the_fast_pass_builds_is_bounded(filler):
    import tracemalloc

    n = codec._FAST_FRAME_BYTES - 64
    head = b"".join(msgpack.packb(x) for x in ("v", 1, "t", MaskedUpdate.TAG, "s", 0, "r", 0, "p", "p", "b"))
    frame = b"\x86" + head + b"\xdd" + n.to_bytes(4, "big") + filler * n
    assert len(frame) <= codec._FAST_FRAME_BYTES
    tracemalloc.start()
    try:
        assert codec._decode_fast(frame, DEFAULT_MAX_FRAME_BYTES) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024  # the module's bound for this pass
    with pytest.raises(DecodeError):
        decode_frame(frame)


# --- how the fast pass builds a message ------------------------------------------------------------


@pytest.fixture
def local_messages():
    """Three message classes registered for one test only (other tests walk the registry):
    ``counted``, a plain frozen dataclass the fast pass builds without its ``__init__``;
    ``own_init``, one whose ``__init__`` is its own (it counts its calls) and must be called;
    ``derived``, one with a field its ``__init__`` does not take (set by ``__post_init__``)."""

    class Counted(codec.Message, tag="test.fast.counted"):
        count: int
        label: str = "x"

        def __post_init__(self) -> None:
            if self.count < 0:
                raise ValueError("count must be >= 0")

    class OwnInit(codec.Message, tag="test.fast.own-init"):
        count: int

        def __init__(self, *, count: int) -> None:
            own_init_calls.append(count)
            object.__setattr__(self, "count", count)

    class Derived(codec.Message, tag="test.fast.derived"):
        count: int
        double: int = dataclasses.field(init=False, default=0)

        def __post_init__(self) -> None:
            object.__setattr__(self, "double", 2 * self.count)

    own_init_calls: list[int] = []
    OwnInit.calls = own_init_calls  # type: ignore[attr-defined]  # set after the dataclass: no field
    classes = {"counted": Counted, "own_init": OwnInit, "derived": Derived}
    try:
        yield classes
    finally:
        for cls in classes.values():
            messages_module._REGISTRY.pop(cls.TAG, None)


def test_the_fast_pass_builds_a_message_as_its_constructor_does(local_messages):
    counted = local_messages["counted"]
    frame = encode_frame(counted(count=3, label="y"), session=1, round_idx=0, phase="p")
    _, message = codec._decode_fast(frame, DEFAULT_MAX_FRAME_BYTES)
    assert type(message) is counted and message == counted(count=3, label="y")
    assert message.__dict__ == {"count": 3, "label": "y"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        message.count = 4  # still frozen
    # __post_init__ still runs: its refusal declines the fast pass and the general path words it.
    refused = msgpack.packb({"v": 1, "t": counted.TAG, "s": 1, "r": 0, "p": "p", "b": [-1, "y"]})
    assert codec._decode_fast(refused, DEFAULT_MAX_FRAME_BYTES) is None
    with pytest.raises(DecodeError, match="count must be >= 0"):
        decode_frame(refused)


def test_a_message_with_its_own_init_is_built_by_its_constructor(local_messages):
    own_init = local_messages["own_init"]
    frame = encode_frame(own_init(count=3), session=1, round_idx=0, phase="p")
    before = len(own_init.calls)
    _, message = codec._decode_fast(frame, DEFAULT_MAX_FRAME_BYTES)
    assert message == own_init(count=3) and len(own_init.calls) == before + 2  # decoding called it


def test_a_field_the_constructor_does_not_take_is_still_refused(local_messages):
    # Its frame carries the derived field, which cls(**kwargs) refuses; filling the instance's
    # __dict__ directly would have taken it.
    derived = local_messages["derived"]
    frame = encode_frame(derived(count=3), session=1, round_idx=0, phase="p")
    assert codec._decode_fast(frame, DEFAULT_MAX_FRAME_BYTES) is None
    with pytest.raises(DecodeError, match="invalid field values"):
        decode_frame(frame)

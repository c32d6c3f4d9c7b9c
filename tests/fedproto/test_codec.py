"""Codec: round trips of every message shape, and corrupted, truncated and oversized frames."""

from __future__ import annotations


import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedproto.codec import WIRE_VERSION, array_payload_bytes, decode_frame, encode_frame
from fedproto.errors import DecodeError
from fedproto.messages import Message, array_field, bigints_field, registered_tags

DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64")


class Sample(Message, tag="test.sample"):
    values: np.ndarray = array_field(DTYPES, 2)
    elements: tuple[int, ...] = bigints_field()
    name: str
    count: int
    scale: float
    flag: bool
    blob: bytes
    ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError("count must be non-negative")


class Vector(Message, tag="test.vector"):
    masked: np.ndarray = array_field("uint32", 1)


class FixedWidth(Message, tag="test.fixed"):
    elements: tuple[int, ...] = bigints_field(width_bytes=16)


class PackedPair(Message, tag="test.packed"):
    """The same integers twice: as ints and in their packed wire form."""

    width: int
    ints: tuple[int, ...] = bigints_field(width_from="width")
    packed: np.ndarray = bigints_field(width_from="width", packed=True)


arrays = st.sampled_from(DTYPES).flatmap(
    lambda dt: hnp.arrays(np.dtype(dt), hnp.array_shapes(min_dims=2, max_dims=2, min_side=0, max_side=6))
)
samples = st.builds(
    Sample,
    values=arrays,
    elements=st.lists(st.integers(min_value=0, max_value=2**300), max_size=5).map(tuple),
    name=st.text(max_size=20),
    count=st.integers(min_value=0, max_value=2**63 - 1),
    scale=st.floats(allow_nan=False),
    flag=st.booleans(),
    blob=st.binary(max_size=40),
    ids=st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=5).map(tuple),
)


def _equal(a: Sample, b: Sample) -> bool:
    return (
        a.values.dtype == b.values.dtype
        and a.values.shape == b.values.shape
        and a.values.tobytes() == b.values.tobytes()
        and a.elements == b.elements
        and (a.name, a.count, a.flag, a.blob, a.ids) == (b.name, b.count, b.flag, b.blob, b.ids)
        and (a.scale == b.scale)
    )


@settings(max_examples=200, deadline=None)
@given(samples, st.integers(0, 2**64 - 1), st.integers(0, 2**32), st.text(max_size=12))
def test_round_trip_every_field_kind(message, session, round_idx, phase):
    frame = encode_frame(message, session=session, round_idx=round_idx, phase=phase)
    envelope, decoded = decode_frame(frame)
    assert (envelope.version, envelope.tag, envelope.session, envelope.round_idx, envelope.phase) == (
        WIRE_VERSION,
        "test.sample",
        session,
        round_idx,
        phase,
    )
    assert _equal(message, decoded)


@settings(max_examples=50, deadline=None)
@given(hnp.arrays(np.uint32, st.integers(0, 3000)))
def test_envelope_overhead_is_small(values):
    frame = encode_frame(Vector(masked=values), session=2**32 - 1, round_idx=127, phase="update")
    overhead = len(frame) - array_payload_bytes(Vector(masked=values))
    # at most 34 bytes of structure (1-D arrays under 64 KiB) plus the tag and phase strings;
    # FastLloyd's tags and phases total 15 characters (an .npy header alone is 128 bytes)
    assert overhead <= 34 + len(Vector.TAG) + len("update")


def test_big_endian_input_is_sent_little_endian():
    values = np.arange(6, dtype=">u4")
    _, decoded = decode_frame(encode_frame(Vector(masked=values), session=0, round_idx=0, phase="p"))
    assert decoded.masked.dtype == np.dtype("<u4")
    assert decoded.masked.tolist() == list(range(6))


def test_fixed_width_big_integers_beyond_64_bits():
    message = FixedWidth(elements=(0, 1, 2**64 + 5, 2**127))
    frame = encode_frame(message, session=0, round_idx=0, phase="p")
    assert decode_frame(frame)[1].elements == message.elements
    with pytest.raises(ValueError, match="needs 17 bytes"):
        encode_frame(FixedWidth(elements=(2**128,)), session=0, round_idx=0, phase="p")
    with pytest.raises(ValueError, match="non-negative"):
        encode_frame(FixedWidth(elements=(-1,)), session=0, round_idx=0, phase="p")


def test_encode_refuses_wrong_dtype_and_rank():
    with pytest.raises(TypeError, match="dtype"):
        encode_frame(Vector(masked=np.zeros(3, np.int32)), session=0, round_idx=0, phase="p")
    with pytest.raises(TypeError, match="dimensions"):
        encode_frame(Vector(masked=np.zeros((3, 1), np.uint32)), session=0, round_idx=0, phase="p")


def _sample(**overrides):
    fields = dict(
        values=np.zeros((1, 1)), elements=(), name="n", count=1, scale=0.5, flag=False, blob=b"", ids=(1, 2)
    )
    fields.update(overrides)
    return Sample(**fields)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("count", 0.5),
        ("count", True),
        ("count", np.int64(3)),  # msgpack cannot pack it either: say so in the sender's terms
        ("name", 3),
        ("scale", "0.5"),
        ("scale", np.float32(0.5)),
        ("flag", 1),
        ("name", b"n"),
        ("blob", "text"),
        ("ids", (1, 2.5)),
        ("ids", 3),
    ],
)
def test_encode_refuses_plain_fields_of_the_wrong_type_naming_the_field(field, value):
    with pytest.raises(TypeError, match=rf"^test\.sample\.{field}: .* is not a valid "):
        encode_frame(_sample(**{field: value}), session=0, round_idx=0, phase="p")


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [("count", 2**70, r"2\*\*70"), ("count", 2**64, r"2\*\*64"), ("ids", (1, -(2**63) - 1), "-9223372036854775809")],
)
def test_an_integer_msgpack_cannot_carry_names_the_class_the_field_and_the_limit(field, value, shown):
    with pytest.raises(ValueError) as raised:
        encode_frame(_sample(**{field: value}), session=0, round_idx=0, phase="p")
    assert type(raised.value) is ValueError  # not msgpack's bare OverflowError
    assert raised.match(rf"^Sample\.{field} \(test\.sample\): the integer {shown} does not fit a plain int field "
                        r"\(from -2\*\*63 to 2\*\*64 - 1, what msgpack carries\); .* bigints_field$")
    # the same encoder still packs the next frame, and the limits themselves travel
    for edge in (2**64 - 1, -(2**63)):
        _, decoded = decode_frame(encode_frame(_sample(ids=(edge,)), session=0, round_idx=0, phase="p"))
        assert decoded.ids == (edge,)
    with pytest.raises(ValueError, match=r"^Sample \(test\.sample\): the frame's session 2\*\*64 is out of range"):
        encode_frame(_sample(), session=2**64, round_idx=0, phase="p")


def test_encode_accepts_what_decode_accepts():
    # ints where a float is declared, a numpy float64 (a float subclass), lists for tuples
    for message in (_sample(scale=2), _sample(scale=np.float64(0.25)), _sample(ids=[4, 5])):
        _, decoded = decode_frame(encode_frame(message, session=0, round_idx=0, phase="p"))
        assert decoded.scale == message.scale and decoded.ids == tuple(message.ids)


def _frame(**overrides):
    envelope = {"v": WIRE_VERSION, "t": "test.vector", "s": 1, "r": 0, "p": "x", "b": [["u4", [2], b"\0" * 8]]}
    envelope.update(overrides)
    return msgpack.packb(envelope, use_bin_type=True)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"v": 2}, "version"),
        ({"v": True}, "version"),
        ({"t": "no.such"}, "unknown message tag"),
        ({"t": 5}, "tag must be a string"),
        ({"s": -1}, "session"),
        ({"r": "0"}, "round_idx"),
        ({"p": 3}, "phase"),
        ({"b": []}, "exactly 1 fields"),
        ({"b": [["u4", [3], b"\0" * 8]]}, "do not match shape"),
        ({"b": [["i4", [2], b"\0" * 8]]}, "dtype"),
        ({"b": [["zz", [2], b"\0" * 8]]}, "unknown dtype"),
        ({"b": [["u4", [2, 1], b"\0" * 8]]}, "dimensions"),
        ({"b": [["u4", [-2], b"\0" * 8]]}, "shape"),
        ({"b": [["u4", [2], "text"]]}, "bytes"),
        ({"b": [["u4", [2]]]}, r"\[dtype, shape, bytes\]"),
    ],
)
def test_invalid_envelopes_and_bodies_raise_decode_error(overrides, match):
    with pytest.raises(DecodeError, match=match):
        decode_frame(_frame(**overrides))


def test_missing_and_extra_envelope_keys():
    good = msgpack.unpackb(_frame())
    for key in list(good):
        broken = dict(good)
        del broken[key]
        with pytest.raises(DecodeError, match="envelope"):
            decode_frame(msgpack.packb(broken, use_bin_type=True))
    with pytest.raises(DecodeError, match="envelope"):
        decode_frame(msgpack.packb({**good, "x": 1}, use_bin_type=True))


def test_post_init_validation_runs_on_decode():
    frame = encode_frame(
        Sample(values=np.zeros((1, 1)), elements=(), name="", count=0, scale=0.0, flag=False, blob=b"", ids=()),
        session=0,
        round_idx=0,
        phase="p",
    )
    obj = msgpack.unpackb(frame)
    obj["b"][3] = -5  # count
    with pytest.raises(DecodeError, match="count must be non-negative"):
        decode_frame(msgpack.packb(obj, use_bin_type=True))
    obj["b"][3] = "five"
    with pytest.raises(DecodeError, match="count"):
        decode_frame(msgpack.packb(obj, use_bin_type=True))


def test_oversized_frame_refused_before_parsing():
    frame = encode_frame(Vector(masked=np.zeros(1000, np.uint32)), session=0, round_idx=0, phase="p")
    with pytest.raises(DecodeError, match="exceeds the maximum"):
        decode_frame(frame, max_frame_bytes=len(frame) - 1)
    assert decode_frame(frame, max_frame_bytes=len(frame))[1].masked.shape == (1000,)


def test_every_truncation_is_a_decode_error():
    frame = encode_frame(
        Sample(values=np.arange(6.0).reshape(2, 3), elements=(2**70,), name="a", count=1, scale=0.5,
               flag=True, blob=b"xy", ids=(1, -1)),
        session=9,
        round_idx=3,
        phase="update",
    )
    for cut in range(len(frame)):
        with pytest.raises(DecodeError):
            decode_frame(frame[:cut])


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_corrupted_bytes_never_escape_as_other_errors(data):
    frame = bytearray(encode_frame(Vector(masked=np.arange(4, dtype=np.uint32)), session=1, round_idx=2, phase="u"))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(frame) - 1))
        frame[i] = data.draw(st.integers(0, 255))
    try:
        decode_frame(bytes(frame))
    except DecodeError:
        pass


@given(st.binary(max_size=200))
def test_garbage_is_a_decode_error(blob):
    try:
        decode_frame(blob)
    except DecodeError:
        pass


def test_not_bytes():
    with pytest.raises(DecodeError, match="bytes"):
        decode_frame("text")  # type: ignore[arg-type]


def test_tags_are_unique_and_registered():
    assert registered_tags()["test.vector"] is Vector
    with pytest.raises(ValueError, match="used by both"):

        class Clash(Message, tag="test.vector"):
            """Takes a tag another class holds."""

    with pytest.raises(TypeError, match="non-empty string"):

        class NoTag(Message, tag=""):
            """An empty tag."""

    with pytest.raises(TypeError, match=r"class Old\(Message, tag=\.\.\.\)"):

        class Old(Message):
            """Sets TAG in its body, the spelling messages no longer use."""

            TAG = "test.old"

    assert "test.old" not in registered_tags()


def test_array_field_rejects_unwireable_dtype():
    with pytest.raises(ValueError, match="cannot travel"):
        array_field("complex128", 1)
    with pytest.raises(ValueError, match="cannot travel"):
        array_field("object", 1)


@pytest.mark.parametrize("width", [1, 3, 9, 40])
def test_a_packed_bigints_field_travels_as_the_same_bytes_and_decodes_without_building_ints(width):
    rng = np.random.default_rng(width)
    ints = tuple(int(v) for v in rng.integers(0, 256, size=(7, width), dtype=np.uint64).astype(object).sum(axis=1))
    rows = np.frombuffer(b"".join(v.to_bytes(width, "big") for v in ints), np.uint8).reshape(7, width)
    message = PackedPair(width=width, ints=ints, packed=rows)
    frame = encode_frame(message, session=1, round_idx=0, phase="x")
    body = msgpack.unpackb(frame)["b"]
    assert body[1] == body[2] == [width, rows.tobytes()]  # identical wire form
    _, decoded = decode_frame(frame)
    assert decoded.ints == ints
    assert decoded.packed.dtype == np.uint8 and decoded.packed.shape == (7, width)
    assert np.array_equal(decoded.packed, rows) and not decoded.packed.flags.writeable
    empty = decode_frame(encode_frame(PackedPair(width=width, ints=(), packed=rows[:0]), session=1, round_idx=0,
                                      phase="x"))[1]
    assert empty.packed.shape == (0, width)


def test_a_packed_bigints_field_refuses_wrong_values_on_both_ends():
    rows = np.zeros((2, 4), np.uint8)
    with pytest.raises(TypeError, match="uint8"):
        encode_frame(PackedPair(width=4, ints=(0, 0), packed=[[0] * 4] * 2), session=1, round_idx=0, phase="x")
    with pytest.raises(ValueError, match="rows of 4 bytes"):
        encode_frame(PackedPair(width=3, ints=(0, 0), packed=rows), session=1, round_idx=0, phase="x")
    frame = encode_frame(PackedPair(width=4, ints=(0, 0), packed=rows), session=1, round_idx=0, phase="x")
    packed = msgpack.unpackb(frame)
    packed["b"][2] = [4, b"\x00" * 7]  # not a multiple of the width
    with pytest.raises(DecodeError, match="multiple of width"):
        decode_frame(msgpack.packb(packed, use_bin_type=True))
    packed["b"][2] = [2, b"\x00" * 8]  # a width other than the stated one
    with pytest.raises(DecodeError):
        decode_frame(msgpack.packb(packed, use_bin_type=True))

"""Structured fuzz of ``decode_frame`` over every registered message class (issue 14).

Whatever the bytes, ``decode_frame`` returns an ``(Envelope, Message)`` whose class is the one the
tag names, or raises ``DecodeError``; never anything else. Frames start as encodings of random
messages of every registered class (FastLloyd, MUFC, deletion, (k,z)-clustering, the toy protocol,
and whatever else the test session registered): valid ones where random values pass the class's
own validation, else the same values packed by hand. Then they are mutated: truncated; bytes
flipped, inserted or deleted; trailing bytes; array shapes replaced by huge, zero or malformed
dimensions; big-integer widths made wrong; fields wrapped in arrays or replaced by random msgpack
objects (nested empty arrays included); bodies sent under another class's tag; envelope keys
reordered, dropped or duplicated. Every frame also goes through both of the decoder's paths (one
msgpack call for small frames, the streaming reader for any frame) and they must agree.

The default run fuzzes about 10^4 frames from a fixed seed; the ``slow`` test runs 10^6.
"""

from __future__ import annotations

import dataclasses
import functools
import typing

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fedproto.algorithms.deletion.messages
import fedproto.algorithms.fastlloyd.messages
import fedproto.algorithms.kzclustering.messages
import fedproto.algorithms.mufc.messages
import fedproto.testing.toy  # noqa: F401  (registers the toy protocol's messages)
from fedproto import codec
from fedproto.codec import DEFAULT_MAX_FRAME_BYTES, Envelope, decode_frame, encode_frame
from fedproto.errors import DecodeError
from fedproto.messages import Message, registered_tags

SEED = 14
ALGORITHM_MODULES = (
    fedproto.algorithms.deletion.messages,
    fedproto.algorithms.fastlloyd.messages,
    fedproto.algorithms.kzclustering.messages,
    fedproto.algorithms.mufc.messages,
    fedproto.testing.toy,
)


# --- random messages of any class ------------------------------------------------------------------


def _code(dtype: np.dtype) -> str:
    return dtype.str.lstrip("<>|")


def _random_plain(rng: np.random.Generator, annotation: object) -> object:
    if annotation is bool:
        return bool(rng.integers(2))
    if annotation is int:
        return int(rng.choice([0, 1, 2, 3, 5, 8, int(rng.integers(0, 2**20))]))
    if annotation is float:
        return float(rng.random() * 10)
    if annotation is str:
        return "".join(rng.choice(list("abxyz_."), size=int(rng.integers(0, 8))))
    if annotation is bytes:
        return rng.bytes(int(rng.choice([32, 48, int(rng.integers(0, 50))])))
    if annotation is type(None):
        return None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is tuple:
        items = [_random_plain(rng, args[0] if args else int) for _ in range(int(rng.integers(1, 6)))]
        return tuple(sorted(set(items), key=repr))  # distinct and increasing, as indices and keys are
    if args:  # a union
        return _random_plain(rng, args[int(rng.integers(len(args)))])
    return 0


#: A class's field annotations, evaluated once per class (the modules use postponed annotations,
#: which typing.get_type_hints compiles and evaluates again on every call).
_type_hints = functools.cache(typing.get_type_hints)


def _random_fields(rng: np.random.Generator, cls: type[Message]) -> dict[str, object]:
    """Random values for every field of ``cls``, sized from one pool so that shapes tend to agree."""
    rows, d = int(rng.integers(1, 6)), int(rng.integers(1, 5))
    hints = _type_hints(cls)
    fields: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        kind = f.metadata.get("kind")
        if kind == "array":
            dtype = sorted(f.metadata["dtypes"], key=str)[int(rng.integers(len(f.metadata["dtypes"])))]
            ndim = f.metadata["ndim"]
            shape = [rows if rng.random() > 0.05 else 0] + [int(rng.choice([d, d + 1])) for _ in range(ndim - 1)]
            if ndim == 1 and rng.random() < 0.5:
                shape = [int(rng.choice([d, d + 1]))]
            shape = shape[:ndim]
            if dtype.kind == "f":
                values = rng.random(shape)
            elif dtype.kind == "b":
                values = rng.random(shape) < 0.5
            else:
                values = rng.integers(0, max(rows, 2), shape)
            fields[f.name] = values.astype(dtype)
        elif kind == "bigints":
            stated = fields.get(f.metadata.get("width_from") or "")  # a width another field already set
            width = f.metadata["width"] or stated or int(rng.integers(1, 20))
            count = int(rng.integers(1, 7))
            if f.metadata.get("packed"):
                fields[f.name] = np.frombuffer(rng.bytes(width * count), np.uint8).reshape(count, width)
            else:
                fields[f.name] = tuple(int.from_bytes(rng.bytes(width), "big") for _ in range(count))
            if f.metadata.get("width_from"):
                fields[f.metadata["width_from"]] = width
        elif f.name not in fields:
            fields[f.name] = _random_plain(rng, hints[f.name])
    return fields


def _raw_body(cls: type[Message], fields: dict[str, object]) -> list[object]:
    """The wire body of ``fields`` packed by hand (for values the class itself refuses)."""
    body: list[object] = []
    for f in dataclasses.fields(cls):
        value = fields[f.name]
        kind = f.metadata.get("kind")
        if kind == "array":
            arr = np.ascontiguousarray(value)
            body.append([_code(arr.dtype), list(arr.shape), arr.tobytes()])
        elif kind == "bigints":
            width = f.metadata["width"] or fields.get(f.metadata.get("width_from") or "", 0) or 8
            data = value.tobytes() if isinstance(value, np.ndarray) else b"".join(v.to_bytes(width, "big") for v in value)
            body.append([width, data])
        else:
            body.append(list(value) if isinstance(value, tuple) else value)
    return body


def _seed(rng: np.random.Generator, cls: type[Message]) -> tuple[bytes, Message | None]:
    """A frame of a random ``cls`` message: ``(frame, message)``, message None if the class refuses
    the values (the frame then holds them packed by hand)."""
    for _ in range(8):
        fields = _random_fields(rng, cls)
        try:
            message = cls(**fields)
        except Exception:
            continue
        return encode_frame(message, session=int(rng.integers(0, 2**64, dtype=np.uint64)),
                            round_idx=int(rng.integers(0, 100)), phase="fuzz"), message
    envelope = {"v": 1, "t": cls.TAG, "s": 0, "r": 0, "p": "fuzz", "b": _raw_body(cls, fields)}
    return msgpack.packb(envelope, use_bin_type=True), None


# --- mutations -------------------------------------------------------------------------------------

HUGE_SHAPES = (
    [0, 2**63], [2**63, 0], [0, 2**64 - 1], [2**64 - 1], [2**62, 4], [0, 2**40, 2**40], [1, 2**31, 2**31],
    [-1, 4], [1.5, 2], [True, 2], ["2", 2], [], [[2], 2], [0] * 70, [2**32, 0],
)  # fmt: skip
BAD_WIDTHS = (0, -1, 2**64 - 1, 2**31, True, 1.0, "8", None, [8])


def _random_object(rng: np.random.Generator, depth: int = 0) -> object:
    """A random msgpack-packable value: scalars of every kind, lists, maps and extension types."""
    choice = int(rng.integers(12 if depth < 4 else 8))
    if choice == 0:
        return None
    if choice == 1:
        return bool(rng.integers(2))
    if choice == 2:
        return int(rng.choice([0, -1, 1, 127, 128, 255, 256, 2**16, 2**32, 2**63 - 1, 2**64 - 1, -(2**63)]))
    if choice == 3:
        return float(rng.choice([0.0, -0.0, 1e308, np.inf, np.nan, 0.5]))
    if choice == 4:
        return "".join(rng.choice(list("ab\u00e9\U0001f600u4f8"), size=int(rng.integers(0, 40))))
    if choice == 5:
        return rng.bytes(int(rng.integers(0, 40)))
    if choice == 6:
        return msgpack.ExtType(int(rng.integers(0, 128)), rng.bytes(int(rng.integers(0, 9))))
    if choice == 7:
        return [[] for _ in range(int(rng.integers(0, 300)))]  # many empty arrays
    if choice in (8, 9):
        return [_random_object(rng, depth + 1) for _ in range(int(rng.integers(0, 5)))]
    if choice == 10:
        return {str(i): _random_object(rng, depth + 1) for i in range(int(rng.integers(0, 4)))}
    value: object = []
    for _ in range(int(rng.integers(1, 40))):  # deep nesting
        value = [value]
    return value


def _kinds(cls: type[Message]) -> list[tuple[int, str, dict]]:
    return [(i, f.metadata.get("kind", "plain"), f.metadata) for i, f in enumerate(dataclasses.fields(cls))]


def _mutate_structure(rng: np.random.Generator, obj: dict, tags: list[str]) -> dict | object:
    """One structural mutation of an unpacked frame."""
    body = obj.get("b")
    cls = registered_tags().get(obj.get("t")) if isinstance(obj.get("t"), str) else None
    fields = _kinds(cls) if cls is not None and isinstance(body, list) and len(body) == len(_kinds(cls)) else []
    op = int(rng.integers(11))
    if op == 0 and fields:  # huge, zero or malformed array shapes
        arrays = [i for i, kind, _ in fields if kind == "array" and isinstance(body[i], list) and len(body[i]) == 3]
        if arrays:
            i = arrays[int(rng.integers(len(arrays)))]
            body[i][1] = list(HUGE_SHAPES[int(rng.integers(len(HUGE_SHAPES)))])
            if rng.random() < 0.5:
                body[i][2] = b""
            return obj
    if op == 1 and fields:  # wrong big-integer widths, or a width field that disagrees
        bigints = [(i, meta) for i, kind, meta in fields if kind == "bigints" and isinstance(body[i], list)]
        if bigints:
            i, meta = bigints[int(rng.integers(len(bigints)))]
            if meta.get("width_from") and rng.random() < 0.5:
                names = [f.name for f in dataclasses.fields(cls)]
                j = names.index(meta["width_from"])
                body[j] = BAD_WIDTHS[int(rng.integers(len(BAD_WIDTHS)))] if rng.random() < 0.5 else 1
            elif body[i]:
                body[i][0] = BAD_WIDTHS[int(rng.integers(len(BAD_WIDTHS)))]
            return obj
    if op == 2 and fields:  # a field wrapped in arrays
        i = int(rng.integers(len(body)))
        for _ in range(int(rng.integers(1, 4))):
            body[i] = [body[i]]
        return obj
    if op == 3 and isinstance(body, list) and body:  # a field replaced by a random object
        body[int(rng.integers(len(body)))] = _random_object(rng)
        return obj
    if op == 4:  # an envelope value replaced by a random object
        key = "vtsrpb"[int(rng.integers(6))]
        obj[key] = _random_object(rng)
        return obj
    if op == 5:  # the body of one class under another's tag
        obj["t"] = tags[int(rng.integers(len(tags)))]
        return obj
    if op == 6:  # envelope keys in another order (the body before the tag, say)
        keys = list(obj)
        rng.shuffle(keys)
        return {key: obj[key] for key in keys}
    if op == 7:  # a key dropped, or one too many
        if rng.random() < 0.5 and obj:
            obj.pop(list(obj)[int(rng.integers(len(obj)))])
        else:
            obj["x"] = 1
        return obj
    if op == 8 and isinstance(body, list):  # a field too many or too few
        if body and rng.random() < 0.5:
            body.pop()
        else:
            body.append(_random_object(rng))
        return obj
    if op == 9 and fields:  # array data or shape inconsistent, dtype codes swapped
        arrays = [i for i, kind, _ in fields if kind == "array" and isinstance(body[i], list) and len(body[i]) == 3]
        if arrays:
            part = body[arrays[int(rng.integers(len(arrays)))]]
            j = int(rng.integers(3))
            part[j] = [rng.choice(["u4", "u8", "f8", "i8", "b1", "c16", "O", "<f8"]), [3, 3], rng.bytes(7)][j]
            return obj
    return _random_object(rng)  # the whole frame replaced by a random object


def _mutate_bytes(rng: np.random.Generator, frame: bytes) -> bytes:
    data = bytearray(frame)
    op = int(rng.integers(5))
    if op == 0:
        return bytes(data[: int(rng.integers(0, len(data) + 1))])
    if op == 1 and data:
        for _ in range(int(rng.integers(1, 5))):
            data[int(rng.integers(len(data)))] ^= int(rng.integers(1, 256))
    elif op == 2:
        at = int(rng.integers(0, len(data) + 1))
        data[at:at] = rng.bytes(int(rng.integers(1, 6)))
    elif op == 3 and data:
        at = int(rng.integers(len(data)))
        del data[at : at + int(rng.integers(1, 6))]
    else:
        data += rng.bytes(int(rng.integers(1, 6)))
    return bytes(data)


def _fuzzed_frame(rng: np.random.Generator, cls: type[Message], tags: list[str]) -> bytes:
    frame, _ = _seed(rng, cls)
    if rng.random() < 0.6:
        obj: object = msgpack.unpackb(frame)
        for _ in range(int(rng.integers(1, 3))):
            obj = _mutate_structure(rng, obj, tags) if isinstance(obj, dict) else _random_object(rng)
        try:
            frame = msgpack.packb(obj, use_bin_type=True)
        except (OverflowError, ValueError, TypeError):  # e.g. an int msgpack cannot hold
            pass
    if rng.random() < 0.4:
        frame = _mutate_bytes(rng, frame)
    return frame


# --- the properties --------------------------------------------------------------------------------


def _same_message(a: Message, b: Message) -> bool:
    if type(a) is not type(b):
        return False
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            x, y = np.asarray(x), np.asarray(y)
            if (x.dtype, x.shape, x.tobytes()) != (y.dtype, y.shape, y.tobytes()):
                return False
        elif x != y and not (x != x and y != y):  # NaN equals NaN here
            return False
    return True


def _outcome(decode, frame: bytes) -> tuple[Envelope, Message] | None:
    """``decode(frame)``: the decoded pair, or None for a DecodeError; anything else fails."""
    try:
        result = decode(frame)
    except DecodeError:
        return None
    except Exception as exc:  # the property under test: nothing but DecodeError escapes
        pytest.fail(f"{type(exc).__name__}: {exc} escaped decoding frame {frame[:300].hex()}")
    return result


def _check(frame: bytes) -> bool:
    """Fuzz one frame; True when it decoded to a message."""
    result = _outcome(decode_frame, frame)
    if result is not None:
        envelope, message = result
        assert isinstance(envelope, Envelope)
        assert type(message) is registered_tags()[envelope.tag]
    # where the small-frame path decides (it does not hand the frame on), the streaming path agrees
    try:
        small = codec._decode_small(memoryview(frame), DEFAULT_MAX_FRAME_BYTES)
    except DecodeError:
        small = "refused"
    if small is not None:
        streamed = _outcome(lambda f: codec._decode_streaming(memoryview(f), DEFAULT_MAX_FRAME_BYTES), frame)
        if small == "refused":
            assert streamed is None, f"only the small-frame path refuses frame {frame[:300].hex()}"
        else:
            assert streamed is not None, f"only the streaming path refuses frame {frame[:300].hex()}"
            assert small[0] == streamed[0] and _same_message(small[1], streamed[1])
    return result is not None


def _fuzz(n_frames: int) -> dict[str, list[int]]:
    """Fuzz ``n_frames`` frames spread over every registered class: per tag, [decoded, refused]."""
    rng = np.random.default_rng(SEED)
    tags = sorted(registered_tags())
    counts = {tag: [0, 0] for tag in tags}
    for i in range(n_frames):
        tag = tags[i % len(tags)]
        decoded = _check(_fuzzed_frame(rng, registered_tags()[tag], tags))
        counts[tag][0 if decoded else 1] += 1
    return counts


def test_every_algorithm_message_class_is_fuzzed():
    fuzzed = set(registered_tags())
    for module in ALGORITHM_MODULES:
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Message) and getattr(value, "TAG", None):
                assert value.TAG in fuzzed


def test_valid_random_messages_round_trip():
    rng = np.random.default_rng(SEED)
    valid = set()
    for tag, cls in sorted(registered_tags().items()):
        for _ in range(20):
            frame, message = _seed(rng, cls)
            if message is None:
                continue
            valid.add(tag)
            envelope, decoded = decode_frame(frame)
            assert envelope.tag == tag and _same_message(message, decoded)
            assert _same_message(message, codec._decode_streaming(memoryview(frame), DEFAULT_MAX_FRAME_BYTES)[1])
    # the generator satisfies most classes' own validation, so the fuzz starts from real frames
    assert len(valid) >= 0.75 * len(registered_tags())


def test_fuzzed_frames_decode_or_raise_decode_error():
    counts = _fuzz(10_000)
    decoded = sum(c[0] for c in counts.values())
    refused = sum(c[1] for c in counts.values())
    # both outcomes are common: the mutations neither always break frames nor never do
    assert decoded > 500 and refused > 5_000


@pytest.mark.slow
def test_a_million_fuzzed_frames_decode_or_raise_decode_error():
    counts = _fuzz(1_000_000)
    assert sum(c[0] for c in counts.values()) > 50_000


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=40)
    | st.binary(max_size=40),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=24,
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(registered_tags())), msgpack_values, st.permutations("vtsrpb"))
def test_any_msgpack_body_under_any_tag(tag, body, order):
    envelope = {"v": 1, "t": tag, "s": 0, "r": 0, "p": "x", "b": body}
    _check(msgpack.packb({key: envelope[key] for key in order}, use_bin_type=True))


def array_fields() -> list[tuple[type, int, dataclasses.Field]]:
    """Every array field of every registered message: ``(class, field index, field)``, by tag."""
    return [
        (cls, i, f)
        for _, cls in sorted(registered_tags().items())
        for i, f in enumerate(dataclasses.fields(cls))
        if f.metadata.get("kind") == "array"
    ]


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.data())
def test_any_shape_for_any_array_field(data):
    cls, index, field = data.draw(st.sampled_from(array_fields()))
    frame, _ = _seed(np.random.default_rng(data.draw(st.integers(0, 2**32))), cls)
    obj = msgpack.unpackb(frame)
    dims = st.integers(-(2**63), 2**64 - 1) | st.sampled_from([0, 1, 2**31, 2**32, 2**62, 2**63, 2**64 - 1])
    obj["b"][index][1] = data.draw(st.lists(dims, max_size=field.metadata["ndim"] + 2))
    if data.draw(st.booleans()):
        obj["b"][index][2] = data.draw(st.binary(max_size=64))
    _check(msgpack.packb(obj, use_bin_type=True))

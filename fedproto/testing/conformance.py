"""Transport conformance suite: the contract of :class:`fedproto.transport.Transport`, checked.

Every check is a *role coroutine*: ``await check(endpoint)`` plays the part of ``endpoint.party``
(its index in ``endpoint.roster`` decides what it sends and what it expects), so the same suite
runs with all parties in one process (:func:`run_conformance`, for the memory and TCP transports)
and with one party per process (MPI under ``mpiexec``: every rank awaits each check of
:data:`CHECKS` on its own endpoint, in order, then :func:`check_close_semantics`). Rosters need at
least 3 parties and endpoints must accept frames of at least :data:`LARGE_FRAME_BYTES` + 64 bytes.

A check returns once this party has sent everything it sends and received everything sent to it,
so no frame of a check is in flight when every party has returned. Parties are not in lockstep,
though: a fast party may already send frames of the next check to a party still finishing this
one. Every frame therefore starts with its check's id byte (empty frames belong to
:func:`check_empty_frames`), and frames of a later check that arrive early are set aside, per
endpoint, for that check. A frame of a check that is already over (a duplicate, or an extra one)
fails the check that receives it, and frames never consumed fail :func:`check_close_semantics`.

Each check raises :class:`AssertionError` naming the check, the party and what went wrong, and
gives up after :data:`CHECK_TIMEOUT_S` (a lost frame would otherwise hang it).
"""

from __future__ import annotations

import contextlib
import functools
import random
import struct
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping

import trio

from fedproto.errors import PeerUnreachable, TransportClosed
from fedproto.transport import Transport

__all__ = [
    "CHECKS",
    "CHECK_TIMEOUT_S",
    "LARGE_FRAME_BYTES",
    "check_ordered_delivery",
    "check_empty_frames",
    "check_large_frames",
    "check_concurrent_senders",
    "check_receive_cancellation",
    "check_unknown_peer",
    "check_close_semantics",
    "run_conformance",
]

#: Longest any single check may take on one party (seconds).
CHECK_TIMEOUT_S = 60.0
#: Size of the large frames of :func:`check_large_frames` (bytes; party ``i`` adds ``i``).
LARGE_FRAME_BYTES = 4 * 1024 * 1024

_ORDERED_FRAMES = 200
_CONCURRENT_TASKS = 8
_FRAMES_PER_TASK = 25
_CANCELLATION_FRAMES = 60

# Check ids: the first byte of every frame a check sends.
_ID_ORDERED, _ID_EMPTY, _ID_LARGE, _ID_CONCURRENT, _ID_CANCELLATION = 1, 2, 3, 4, 5
_ID_NAMES = {
    _ID_ORDERED: "check_ordered_delivery",
    _ID_EMPTY: "check_empty_frames",
    _ID_LARGE: "check_large_frames",
    _ID_CONCURRENT: "check_concurrent_senders",
    _ID_CANCELLATION: "check_receive_cancellation",
}


class _Demux:
    """Frames set aside for later checks, and the checks this endpoint has finished."""

    def __init__(self) -> None:
        self.stash: list[tuple[str, int, bytes]] = []
        self.finished: set[int] = set()


_DEMUX: "weakref.WeakKeyDictionary[Transport, _Demux]" = weakref.WeakKeyDictionary()


def _demux(ep: Transport) -> _Demux:
    demux = _DEMUX.get(ep)
    if demux is None:
        demux = _DEMUX[ep] = _Demux()
    return demux


def _split(frame: bytes) -> tuple[int, bytes]:
    if not frame:
        return _ID_EMPTY, b""
    return frame[0], bytes(frame[1:])


def _set_aside(ep: Transport, check: str, sender: str, check_id: int, payload: bytes) -> None:
    demux = _demux(ep)
    if check_id not in _ID_NAMES:
        raise AssertionError(
            f"{check}: {ep.party} received a frame from {sender} that no check sent "
            f"(first byte {check_id}, {len(payload) + 1} bytes): corrupted frame?"
        )
    if check_id in demux.finished:
        raise AssertionError(
            f"{check}: {ep.party} received a frame of {_ID_NAMES[check_id]} from {sender} after "
            "that check was over: a duplicated or extra frame"
        )
    demux.stash.append((sender, check_id, payload))


def _take_stashed(ep: Transport, check_id: int) -> tuple[str, bytes] | None:
    stash = _demux(ep).stash
    for index, (sender, frame_check, payload) in enumerate(stash):
        if frame_check == check_id:
            del stash[index]
            return sender, payload
    return None


async def _receive(ep: Transport, check_id: int, check: str) -> tuple[str, bytes]:
    """Next ``(sender, payload)`` of check ``check_id`` (set-aside frames first)."""
    stashed = _take_stashed(ep, check_id)
    if stashed is not None:
        return stashed
    while True:
        sender, frame = await ep.receive()
        frame_check, payload = _split(frame)
        if frame_check == check_id:
            return sender, payload
        _set_aside(ep, check, sender, frame_check, payload)


async def _send(ep: Transport, dest: str, check_id: int, payload: bytes) -> None:
    await ep.send(dest, bytes([check_id]) + payload)


def _role(ep: Transport, check: str) -> tuple[int, int]:
    roster = tuple(ep.roster)
    if len(roster) < 3:
        raise AssertionError(f"{check}: the conformance suite needs at least 3 parties, got {len(roster)}")
    if ep.party not in roster:
        raise AssertionError(f"{check}: party {ep.party!r} is not in its own roster {list(roster)}")
    return roster.index(ep.party), len(roster)


def _sender_index(ep: Transport, check: str, sender: str) -> int:
    if sender not in ep.roster:
        raise AssertionError(f"{check}: {ep.party} received a frame from {sender!r}, not in the roster")
    return tuple(ep.roster).index(sender)


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


@contextlib.contextmanager
def _checking(ep: Transport, check: str, check_id: int | None) -> Iterator[None]:
    """Deadline, plain AssertionErrors out of nurseries, and bookkeeping of finished checks."""
    try:
        with trio.fail_after(CHECK_TIMEOUT_S):
            yield
    except BaseException as exc:
        leaf = _leaf(exc)
        if isinstance(leaf, trio.TooSlowError):
            raise AssertionError(
                f"{check}: {ep.party} timed out after {CHECK_TIMEOUT_S} s (a frame was lost or a "
                "peer is stuck)"
            ) from exc
        if isinstance(leaf, AssertionError) and leaf is not exc:
            raise leaf from exc
        raise
    if check_id is not None:
        _demux(ep).finished.add(check_id)


Check = Callable[[Transport], Awaitable[None]]


def _as_check(check_id: int | None) -> Callable[[Check], Check]:
    def decorate(body: Check) -> Check:
        @functools.wraps(body)
        async def check(ep: Transport) -> None:
            with _checking(ep, body.__name__, check_id):
                await body(ep)

        return check

    return decorate


# ------------------------------------------------------------------------------ ordered delivery

_ORDERED_HEADER = struct.Struct(">HI")


def _ordered_payload(sender: int, seq: int) -> bytes:
    filler = bytes([(seq + sender) % 256]) * ((seq * 7 + sender) % 300)
    return _ORDERED_HEADER.pack(sender, seq) + filler


@_as_check(_ID_ORDERED)
async def check_ordered_delivery(ep: Transport) -> None:
    """Every party sends 200 numbered frames to every other, concurrently; each arrives in order.

    Also checks that the transport names the true sender of every frame.

    Raises:
        AssertionError: a frame is missing, reordered, altered or attributed to the wrong sender.
    """
    check = "check_ordered_delivery"
    me, n = _role(ep, check)

    async def send_all(dest: str) -> None:
        for seq in range(_ORDERED_FRAMES):
            await _send(ep, dest, _ID_ORDERED, _ordered_payload(me, seq))

    async with trio.open_nursery() as nursery:
        for j, dest in enumerate(ep.roster):
            if j != me:
                nursery.start_soon(send_all, dest)
        expected = {j: 0 for j in range(n) if j != me}
        for _ in range((n - 1) * _ORDERED_FRAMES):
            sender, payload = await _receive(ep, _ID_ORDERED, check)
            j = _sender_index(ep, check, sender)
            if j not in expected:
                raise AssertionError(f"{check}: {ep.party} received a frame from itself")
            seq = expected[j]
            if payload != _ordered_payload(j, seq):
                got = _ORDERED_HEADER.unpack_from(payload) if len(payload) >= _ORDERED_HEADER.size else None
                raise AssertionError(
                    f"{check}: {ep.party} expected frame #{seq} from {sender}, got (sender index, "
                    f"seq) = {got} with {len(payload)} bytes: reordered, altered or misattributed"
                )
            expected[j] = seq + 1


# ---------------------------------------------------------------------------------- empty frames

# None is an empty frame; an int is a tagged marker frame carrying that number.
_EMPTY_PATTERN: tuple[int | None, ...] = (None, 0, None, None, 1, *([None] * 5), 2, None)


@_as_check(_ID_EMPTY)
async def check_empty_frames(ep: Transport) -> None:
    """Every party sends a pattern of empty and marker frames to every other; it arrives intact.

    Raises:
        AssertionError: an empty frame is lost, added, or reordered with the markers.
    """
    check = "check_empty_frames"
    me, n = _role(ep, check)

    async def send_pattern(dest: str) -> None:
        for item in _EMPTY_PATTERN:
            if item is None:
                await ep.send(dest, b"")
            else:
                await _send(ep, dest, _ID_EMPTY, struct.pack(">HB", me, item))

    async with trio.open_nursery() as nursery:
        for j, dest in enumerate(ep.roster):
            if j != me:
                nursery.start_soon(send_pattern, dest)
        position = {j: 0 for j in range(n) if j != me}
        for _ in range((n - 1) * len(_EMPTY_PATTERN)):
            sender, payload = await _receive(ep, _ID_EMPTY, check)
            j = _sender_index(ep, check, sender)
            if j == me or position[j] >= len(_EMPTY_PATTERN):
                raise AssertionError(f"{check}: {ep.party} received an extra frame from {sender}")
            item = _EMPTY_PATTERN[position[j]]
            want = b"" if item is None else struct.pack(">HB", j, item)
            if payload != want:
                raise AssertionError(
                    f"{check}: {ep.party} expected {'an empty frame' if item is None else f'marker {item}'} "
                    f"at position {position[j]} from {sender}, got {len(payload)} payload bytes"
                )
            position[j] += 1


# ---------------------------------------------------------------------------------- large frames


def _large_frame(sender: int) -> bytes:
    return random.Random(f"fedproto-large-{sender}").randbytes(LARGE_FRAME_BYTES + sender)


@_as_check(_ID_LARGE)
async def check_large_frames(ep: Transport) -> None:
    """Every party sends a 4 MiB frame, then a small one, to every other; both arrive intact.

    Raises:
        AssertionError: a large frame is truncated, altered, or overtaken by the small one.
    """
    check = "check_large_frames"
    me, n = _role(ep, check)
    mine = _large_frame(me)

    async def send_pair(dest: str) -> None:
        await _send(ep, dest, _ID_LARGE, mine)
        await _send(ep, dest, _ID_LARGE, b"small")

    async with trio.open_nursery() as nursery:
        for j, dest in enumerate(ep.roster):
            if j != me:
                nursery.start_soon(send_pair, dest)
        got_large: set[int] = set()
        got_small: set[int] = set()
        for _ in range(2 * (n - 1)):
            sender, payload = await _receive(ep, _ID_LARGE, check)
            j = _sender_index(ep, check, sender)
            if j not in got_large:
                if payload != _large_frame(j):
                    raise AssertionError(
                        f"{check}: {ep.party} expected {LARGE_FRAME_BYTES + j} bytes from {sender}, "
                        f"got {len(payload)} bytes that differ (truncated, altered or reordered)"
                    )
                got_large.add(j)
            elif j not in got_small and payload == b"small":
                got_small.add(j)
            else:
                raise AssertionError(f"{check}: {ep.party} received an unexpected frame from {sender}")


# ----------------------------------------------------------------------------- concurrent senders

_CONCURRENT_HEADER = struct.Struct(">HHHI")


def _concurrent_payload(sender: int, task: int, seq: int) -> bytes:
    size = ((task * 31 + seq * 17) % 16 + 1) * 8 * 1024
    return _CONCURRENT_HEADER.pack(sender, task, seq, size) + bytes([(task * 16 + seq) % 256]) * size


@_as_check(_ID_CONCURRENT)
async def check_concurrent_senders(ep: Transport) -> None:
    """Eight tasks of each party send 25 frames (8 to 128 KiB) each to the next party at once.

    Raises:
        AssertionError: frames are interleaved (not whole), lost, or one task's frames reordered.
    """
    check = "check_concurrent_senders"
    me, n = _role(ep, check)
    dest = ep.roster[(me + 1) % n]
    source = (me - 1) % n

    async def sender_task(task: int) -> None:
        for seq in range(_FRAMES_PER_TASK):
            await _send(ep, dest, _ID_CONCURRENT, _concurrent_payload(me, task, seq))
            await trio.sleep(0)

    async with trio.open_nursery() as nursery:
        for task in range(_CONCURRENT_TASKS):
            nursery.start_soon(sender_task, task)
        next_seq = [0] * _CONCURRENT_TASKS
        for _ in range(_CONCURRENT_TASKS * _FRAMES_PER_TASK):
            sender, payload = await _receive(ep, _ID_CONCURRENT, check)
            j = _sender_index(ep, check, sender)
            if j != source or len(payload) < _CONCURRENT_HEADER.size:
                raise AssertionError(f"{check}: {ep.party} received an unexpected frame from {sender}")
            _, task, seq, _size = _CONCURRENT_HEADER.unpack_from(payload)
            if task >= _CONCURRENT_TASKS or payload != _concurrent_payload(j, task, seq):
                raise AssertionError(
                    f"{check}: {ep.party} received a frame from {sender} that is not whole "
                    f"(header says task {task} seq {seq}; {len(payload)} bytes): interleaved writes?"
                )
            if seq != next_seq[task]:
                raise AssertionError(
                    f"{check}: {ep.party} expected frame #{next_seq[task]} of task {task} from "
                    f"{sender}, got #{seq}"
                )
            next_seq[task] += 1


# -------------------------------------------------------------------------- receive cancellation

_CANCELLATION_HEADER = struct.Struct(">HI")


def _cancellation_payload(sender: int, seq: int) -> bytes:
    # Every 10th frame is large, so a cancellation can land while a transport is mid-receive.
    size = 1024 * 1024 if seq % 10 == 9 else seq
    return _CANCELLATION_HEADER.pack(sender, seq) + bytes([seq % 256]) * size


@_as_check(_ID_CANCELLATION)
async def check_receive_cancellation(ep: Transport) -> None:
    """Receives cancelled by timeouts (0 to 5 ms) lose no frame: later receives get every one.

    Each party sends 60 frames (some of 1 MiB) to the next party at an uneven pace while it
    receives from the previous one under short ``trio.move_on_after`` timeouts.

    Raises:
        AssertionError: a frame is lost or reordered, or no receive was ever cancelled.
    """
    check = "check_receive_cancellation"
    me, n = _role(ep, check)
    dest = ep.roster[(me + 1) % n]
    source = (me - 1) % n
    rng = random.Random(f"fedproto-cancellation-{me}")

    async def pace_sends() -> None:
        pace = random.Random(f"fedproto-cancellation-pace-{me}")
        for seq in range(_CANCELLATION_FRAMES):
            await _send(ep, dest, _ID_CANCELLATION, _cancellation_payload(me, seq))
            await trio.sleep(pace.choice((0.0, 0.0, 0.0005, 0.002)))

    cancelled = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pace_sends)
        seq = 0
        while seq < _CANCELLATION_FRAMES:
            got = _take_stashed(ep, _ID_CANCELLATION)
            if got is None:
                with trio.move_on_after(rng.choice((0.0, 0.0, 0.0001, 0.001, 0.005))):
                    got = await ep.receive()
                if got is None:
                    cancelled += 1
                    continue
                frame_check, payload = _split(got[1])
                if frame_check != _ID_CANCELLATION:
                    _set_aside(ep, check, got[0], frame_check, payload)
                    continue
                got = (got[0], payload)
            sender, payload = got
            if _sender_index(ep, check, sender) != source or payload != _cancellation_payload(source, seq):
                raise AssertionError(
                    f"{check}: {ep.party} expected frame #{seq} from {ep.roster[source]}, got "
                    f"{len(payload)} bytes from {sender} (a cancelled receive lost a frame?)"
                )
            seq += 1
    if cancelled == 0:
        raise AssertionError(f"{check}: no receive of {ep.party} was cancelled, so nothing was checked")


# ---------------------------------------------------------------------------------- unknown peer


@_as_check(None)
async def check_unknown_peer(ep: Transport) -> None:
    """Sending to a party outside the roster raises PeerUnreachable (and sends nothing).

    Raises:
        AssertionError: the send succeeded or raised something else.
    """
    check = "check_unknown_peer"
    _role(ep, check)
    for stranger in ("__not-in-the-roster__", f"{ep.party}-impostor"):
        try:
            await ep.send(stranger, b"\x00hello")
        except PeerUnreachable:
            continue
        except Exception as exc:
            raise AssertionError(
                f"{check}: send from {ep.party} to {stranger!r} raised {type(exc).__name__}: {exc}, "
                "expected PeerUnreachable"
            ) from exc
        raise AssertionError(f"{check}: send from {ep.party} to {stranger!r} (not in the roster) succeeded")


# -------------------------------------------------------------------------------- close semantics


async def check_close_semantics(ep: Transport) -> None:
    """After ``aclose()``, send and receive raise TransportClosed; a second ``aclose()`` is fine.

    Run it last: it closes the endpoint. It first checks that every frame received during the
    other checks was consumed by its check.

    Raises:
        AssertionError: frames were left over, or the closed endpoint misbehaves.
    """
    check = "check_close_semantics"
    me, n = _role(ep, check)
    leftover = _demux(ep).stash
    if leftover:
        names = sorted({f"{_ID_NAMES[c]} from {s}" for s, c, _ in leftover})
        raise AssertionError(f"{check}: {ep.party} has {len(leftover)} frames no check consumed: {names}")
    with trio.fail_after(CHECK_TIMEOUT_S):
        await ep.aclose()
        peer = ep.roster[(me + 1) % n]
        for name, attempt in (
            ("send", lambda: ep.send(peer, b"\x00after close")),
            ("receive", ep.receive),
        ):
            try:
                await attempt()
            except TransportClosed:
                continue
            except Exception as exc:
                raise AssertionError(
                    f"{check}: {name} on the closed endpoint of {ep.party} raised "
                    f"{type(exc).__name__}: {exc}, expected TransportClosed"
                ) from exc
            raise AssertionError(f"{check}: {name} on the closed endpoint of {ep.party} succeeded")
        try:
            await ep.aclose()
        except Exception as exc:
            raise AssertionError(f"{check}: a second aclose() of {ep.party} raised {exc!r}") from exc
    _DEMUX.pop(ep, None)


#: The checks, in the order to run them (then :func:`check_close_semantics`).
CHECKS: tuple[Callable[[Transport], Awaitable[None]], ...] = (
    check_ordered_delivery,
    check_empty_frames,
    check_large_frames,
    check_concurrent_senders,
    check_receive_cancellation,
    check_unknown_peer,
)


async def run_conformance(endpoints: Mapping[str, Transport], *, close: bool = True) -> None:
    """Run every check on endpoints hosted in this process (memory, TCP).

    Each check runs with all endpoints concurrently, in one nursery per check.

    Args:
        endpoints: ``{party: endpoint}`` for every party of the (common) roster, at least 3.
        close: finish with :func:`check_close_semantics` on every endpoint (closing them).

    Raises:
        AssertionError: a check failed (the first failure; the others are in ``__context__``).
        ValueError: the endpoints do not cover their roster.
    """
    if not endpoints:
        raise ValueError("run_conformance needs the endpoints of every party")
    roster = tuple(next(iter(endpoints.values())).roster)
    if set(endpoints) != set(roster) or any(ep.party != p for p, ep in endpoints.items()):
        raise ValueError(f"the endpoints {sorted(endpoints)} do not match the roster {list(roster)}")
    steps = [*CHECKS, check_close_semantics] if close else list(CHECKS)
    for check in steps:
        try:
            async with trio.open_nursery() as nursery:
                for ep in endpoints.values():
                    nursery.start_soon(check, ep)
        except BaseExceptionGroup as group:
            first = _first_assertion(group)
            if first is not None:
                raise first from group
            raise


def _first_assertion(exc: BaseException) -> AssertionError | None:
    if isinstance(exc, AssertionError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first_assertion(inner)
            if found is not None:
                return found
    return None

"""The memory transport's stage-targeted crashes (``Faults.crash_at``) and drop reports (``report_drops``).

* ``crash_at={party: CrashPoint(phase[, round_idx])}`` crashes the party at its first frame whose
  envelope matches: every frame it sent before is delivered, that one and none after;
* frames that are not fedproto frames never match; the configuration is validated;
* with ``report_drops=True`` every other endpoint's ``receive``/``receive_nowait`` raises
  ``PeerDropped`` once per crashed party, after the frames that party sent before it crashed;
  without it (the default) nothing is reported.
"""

from __future__ import annotations

import msgpack
import pytest
import trio

from fedproto.codec import decode_frame, encode_frame
from fedproto.errors import PartyCrashed, PeerDropped, TransportError
from fedproto.testing import CrashPoint
from fedproto.testing.toy import Query
from fedproto.transports.memory import Faults, MemoryNetwork

ROSTER = ("server", "alice", "bob")


def frame(phase: str, round_idx: int) -> bytes:
    return encode_frame(Query(), session=0, round_idx=round_idx, phase=phase)


async def drain(endpoint) -> list[tuple[str, str, int] | str]:
    """What is waiting for ``endpoint``: ``(sender, phase, round)`` per frame, ``"dropped:X"`` per report."""
    out: list[tuple[str, str, int] | str] = []
    while True:
        try:
            item = endpoint.receive_nowait()
        except PeerDropped as exc:
            out.append(f"dropped:{exc.party}")
            continue
        if item is None:
            return out
        envelope, _ = decode_frame(item[1])
        out.append((item[0], envelope.phase, envelope.round_idx))


async def send_schedule(endpoint, schedule) -> int:
    """Send ``(phase, round)`` frames to the server in order until the endpoint crashes; frames sent."""
    sent = 0
    for phase, round_idx in schedule:
        try:
            await endpoint.send("server", frame(phase, round_idx))
        except PartyCrashed:
            return sent
        sent += 1
    return sent


SCHEDULE = [("share-keys", 0), ("masked-input", 0), ("unmask", 0), ("share-keys", 1), ("masked-input", 1)]


@pytest.mark.parametrize(
    ("point", "delivered"),
    [
        (CrashPoint("masked-input"), 1),  # first masked-input frame, whatever its round
        (CrashPoint("masked-input", 1), 4),  # only round 1's
        (("unmask", 0), 2),  # a (phase, round) pair is accepted
        (CrashPoint("unmask", 5), 5),  # never reached: no crash
        (CrashPoint("advertise-keys"), 5),  # a phase the party never sends in: no crash
    ],
)
async def test_crash_at_a_phase_delivers_what_came_before_and_nothing_after(point, delivered) -> None:
    network = MemoryNetwork(ROSTER, faults=Faults(crash_at={"alice": point}))
    async with network.endpoints() as endpoints:
        sent = await send_schedule(endpoints["alice"], SCHEDULE)
        got = await drain(endpoints["server"])
        assert sent == delivered
        assert got == [("alice", p, r) for p, r in SCHEDULE[:delivered]]
        crashed = delivered < len(SCHEDULE)
        assert ("alice" in network.crashed) == crashed
        if crashed:
            assert network.crashed["alice"] == SCHEDULE[delivered]  # the frame it was sending
            # a crashed party stays crashed: every later send and receive raises
            for attempt in (endpoints["alice"].send("server", b"x"), endpoints["alice"].receive()):
                with pytest.raises(PartyCrashed):
                    await attempt
            await endpoints["bob"].send("alice", b"lost")  # frames to it are lost, silently
        # the other parties are untouched
        await endpoints["bob"].send("server", frame("masked-input", 0))
        assert await drain(endpoints["server"]) == [("bob", "masked-input", 0)]


async def test_crash_at_ignores_bytes_that_are_not_fedproto_frames() -> None:
    network = MemoryNetwork(ROSTER, faults=Faults(crash_at={"alice": CrashPoint("b")}))
    async with network.endpoints() as endpoints:
        for raw in (b"", b"masked-input", b"\x81\xa1b\xa1b", b"\xc1\xc1", b"\x80"):
            await endpoints["alice"].send("server", raw)
        assert [item for _, item in [endpoints["server"].receive_nowait() for _ in range(5)]] == [
            b"", b"masked-input", b"\x81\xa1b\xa1b", b"\xc1\xc1", b"\x80"
        ]
        with pytest.raises(PartyCrashed):
            await endpoints["alice"].send("server", frame("b", 0))


async def test_a_long_phase_name_is_still_found() -> None:
    phase = "p" * 1000  # beyond the first bytes read for the envelope
    network = MemoryNetwork(ROSTER, faults=Faults(crash_at={"alice": CrashPoint(phase, 0)}))
    async with network.endpoints() as endpoints:
        await endpoints["alice"].send("server", frame("p" * 999, 0))
        with pytest.raises(PartyCrashed):
            await endpoints["alice"].send("server", frame(phase, 0))


async def test_a_frame_with_its_body_first_is_still_matched() -> None:
    standard = msgpack.unpackb(frame("unmask", 3))
    reordered = msgpack.packb({"b": standard["b"], **{k: standard[k] for k in "vtsrp"}})
    network = MemoryNetwork(ROSTER, faults=Faults(crash_at={"alice": CrashPoint("unmask", 3)}))
    async with network.endpoints() as endpoints:
        with pytest.raises(PartyCrashed):
            await endpoints["alice"].send("server", reordered)


@pytest.mark.parametrize(
    ("crash_after", "point", "delivered"), [(2, ("share-keys", 1), 2), (4, ("masked-input", 0), 1)]
)
async def test_crash_after_and_crash_at_together_whichever_comes_first(crash_after, point, delivered) -> None:
    network = MemoryNetwork(ROSTER, faults=Faults(crash_after={"alice": crash_after}, crash_at={"alice": point}))
    async with network.endpoints() as endpoints:
        assert await send_schedule(endpoints["alice"], SCHEDULE) == delivered
        assert network.crashed == {"alice": SCHEDULE[delivered]}


@pytest.mark.parametrize(
    ("crash_at", "words"),
    [
        ({"alice": ("x", -1)}, "round_idx"),
        ({"alice": ("", 0)}, "phase"),
        ({"alice": ("x", True)}, "round_idx"),
        ({"alice": ("x", 1.0)}, "round_idx"),
        ({"alice": "masked-input"}, "CrashPoint or a (phase, round_idx) pair"),
        ({"alice": ("x", 0, 1)}, "CrashPoint or a (phase, round_idx) pair"),
        ({3: ("x", 0)}, "party names"),
        ([("alice", ("x", 0))], "must be a dict"),
    ],
)
def test_crash_at_is_validated(crash_at, words) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Faults(crash_at=crash_at)


def test_crash_at_naming_a_party_outside_the_roster_is_refused() -> None:
    with pytest.raises(ValueError, match=r"crash_at names \['carol'\], not in the roster"):
        MemoryNetwork(ROSTER, faults=Faults(crash_at={"carol": ("unmask", None)}))


def test_faults_keep_the_callers_dict_and_convert_pairs() -> None:
    given = {"alice": ("unmask", 2)}
    faults = Faults(crash_at=given)
    assert faults.crash_at == {"alice": CrashPoint("unmask", 2)}
    assert given == {"alice": ("unmask", 2)}


# --- drop reports --------------------------------------------------------------------------------------


async def test_each_other_endpoint_hears_once_after_the_frames_sent_before_the_crash() -> None:
    network = MemoryNetwork(ROSTER, faults=Faults(crash_at={"alice": ("unmask", 0)}), report_drops=True)
    async with network.endpoints() as endpoints:
        await endpoints["alice"].send("bob", frame("share-keys", 0))
        await endpoints["bob"].send("server", frame("masked-input", 0))
        assert await send_schedule(endpoints["alice"], SCHEDULE) == 2
        # later traffic lands behind the report
        await endpoints["bob"].send("server", frame("unmask", 0))
        assert await drain(endpoints["server"]) == [
            ("bob", "masked-input", 0),
            ("alice", "share-keys", 0),
            ("alice", "masked-input", 0),
            "dropped:alice",
            ("bob", "unmask", 0),
        ]
        assert await drain(endpoints["bob"]) == [("alice", "share-keys", 0), "dropped:alice"]
        # once only: nothing more, and the endpoints keep working
        assert await drain(endpoints["server"]) == [] and await drain(endpoints["bob"]) == []
        await endpoints["server"].send("bob", frame("unmask", 1))
        assert await drain(endpoints["bob"]) == [("server", "unmask", 1)]


async def test_receive_raises_the_report_and_then_returns_the_next_frame() -> None:
    network = MemoryNetwork(ROSTER, faults=Faults(crash_after={"alice": 0, "bob": 0}), report_drops=True)
    async with network.endpoints() as endpoints:
        for name in ("bob", "alice"):
            with pytest.raises(PartyCrashed):
                await endpoints[name].send("server", b"x")
        await endpoints["server"].send("server", b"to myself")
        reports = []
        for _ in range(2):
            with pytest.raises(PeerDropped) as info:
                await endpoints["server"].receive()
            reports.append(info.value.party)
            assert isinstance(info.value, TransportError)
        assert reports == ["bob", "alice"]  # in the order they crashed
        assert await endpoints["server"].receive() == ("server", b"to myself")
        assert network.crashed == {"bob": None, "alice": None}  # raw bytes: no envelope to record


async def test_a_closed_endpoint_is_not_told() -> None:
    network = MemoryNetwork(ROSTER, faults=Faults(crash_after={"alice": 0}), report_drops=True)
    async with network.endpoints() as endpoints:
        await endpoints["bob"].aclose()
        with pytest.raises(PartyCrashed):
            await endpoints["alice"].send("server", b"x")
        assert await drain(endpoints["server"]) == ["dropped:alice"]


async def test_by_default_no_drop_is_reported() -> None:
    network = MemoryNetwork(ROSTER, faults=Faults(crash_at={"alice": ("unmask", None)}))
    assert network.report_drops is False
    async with network.endpoints() as endpoints:
        assert await send_schedule(endpoints["alice"], SCHEDULE) == 2
        assert await drain(endpoints["server"]) == [("alice", "share-keys", 0), ("alice", "masked-input", 0)]
        assert await drain(endpoints["bob"]) == []
        with trio.move_on_after(0.01) as scope:
            await endpoints["bob"].receive()
        assert scope.cancelled_caught  # bob hears nothing: the crash shows only as silence

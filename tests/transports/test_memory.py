"""The memory transport: the conformance suite, and seeded fault injection as documented."""

from __future__ import annotations

import math

import pytest
import trio

import fedproto.testing
from fedproto.errors import PartyCrashed, PeerUnreachable, TransportBroken, TransportClosed
from fedproto.testing.conformance import CHECK_TIMEOUT_S, run_conformance
from fedproto.testing.faults import DelegatingTransport
from fedproto.transport import Network, Transport
from fedproto.transports.memory import Faults, MemoryNetwork

ROSTER = ("alice", "bob", "carol")


async def test_conformance() -> None:
    async with MemoryNetwork(ROSTER).endpoints() as endpoints:
        await run_conformance(endpoints)


async def test_conformance_five_parties_with_mock_clock(autojump_clock: trio.testing.MockClock) -> None:
    async with MemoryNetwork([f"p{i}" for i in range(5)]).endpoints() as endpoints:
        await run_conformance(endpoints)


# The suite must be able to fail: each broken transport below has to be caught. Each is a
# DelegatingTransport (every call passed to the real endpoint) that changes one thing.


class _SwapsPairs(DelegatingTransport):
    """Delivers frames 2k+1 before 2k (per receiver)."""

    def __init__(self, inner: Transport) -> None:
        super().__init__(inner)
        self._held: tuple[str, bytes] | None = None

    async def receive(self) -> tuple[str, bytes]:
        if self._held is not None:
            held, self._held = self._held, None
            return held
        first = await self.inner.receive()
        self._held = first
        return await self.inner.receive()


class _BlamesAlice(DelegatingTransport):
    async def receive(self) -> tuple[str, bytes]:
        _, frame = await self.inner.receive()
        return "alice", frame


class _CorruptsLargeFrames(DelegatingTransport):
    async def send(self, dest: str, frame: bytes) -> None:
        if len(frame) > 1_000_000:
            frame = frame[:-1] + bytes([frame[-1] ^ 1])
        await self.inner.send(dest, frame)


class _DropsEmptyFrames(DelegatingTransport):
    async def send(self, dest: str, frame: bytes) -> None:
        if frame:
            await self.inner.send(dest, frame)


class _ClosedStillSends(DelegatingTransport):
    async def send(self, dest: str, frame: bytes) -> None:
        await self.inner.network._route(self.party, dest, frame)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("wrapper", "message"),
    [
        (_SwapsPairs, "reordered|lost a frame"),
        (_BlamesAlice, "from itself|misattributed"),
        (_CorruptsLargeFrames, "differ"),
        (_DropsEmptyFrames, "expected an empty frame"),
        (_ClosedStillSends, "PeerUnreachable"),
    ],
)
async def test_conformance_catches_broken_transports(
    autojump_clock: trio.testing.MockClock, wrapper: type[DelegatingTransport], message: str
) -> None:
    async with MemoryNetwork(ROSTER).endpoints() as opened:
        endpoints = {p: wrapper(ep) for p, ep in opened.items()}
        with pytest.raises(AssertionError, match=message):
            await run_conformance(endpoints)


class _DropsEverythingToCarol(DelegatingTransport):
    async def send(self, dest: str, frame: bytes) -> None:
        if dest != "carol":
            await self.inner.send(dest, frame)


async def test_conformance_catches_lost_frames(autojump_clock: trio.testing.MockClock) -> None:
    network = MemoryNetwork(ROSTER, faults=Faults(seed=3, drop=0.01))
    with pytest.raises(AssertionError, match="expected frame"):
        async with network.endpoints() as endpoints:
            await run_conformance(endpoints)
    start = trio.current_time()
    with pytest.raises(AssertionError, match="carol timed out"):
        async with MemoryNetwork(ROSTER).endpoints() as opened:
            await run_conformance({p: _DropsEverythingToCarol(ep) for p, ep in opened.items()})
    assert trio.current_time() - start >= CHECK_TIMEOUT_S


async def test_conformance_catches_duplicated_frames(autojump_clock: trio.testing.MockClock) -> None:
    network = MemoryNetwork(ROSTER, faults=Faults(seed=3, duplicate=0.01))
    with pytest.raises(AssertionError):
        async with network.endpoints() as endpoints:
            await run_conformance(endpoints)


# --------------------------------------------------------------------------------- basics


async def test_oversized_frame_and_unknown_party_are_refused() -> None:
    network = MemoryNetwork(ROSTER, max_frame_bytes=10)
    alice = network.endpoint("alice")
    await alice.send("bob", b"x" * 10)
    with pytest.raises(ValueError, match="exceeds the maximum"):
        await alice.send("bob", b"x" * 11)
    with pytest.raises(PeerUnreachable):
        network.endpoint("mallory")
    assert await network.endpoint("bob").receive() == ("alice", b"x" * 10)


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ValueError):
        MemoryNetwork([])
    with pytest.raises(ValueError):
        MemoryNetwork(["a", "a"])
    bad_faults = (
        dict(drop=1.5), dict(duplicate=-0.1), dict(delay_s=-1.0), dict(delay_s=math.inf),
        dict(crash_after={"alice": -1}), dict(crash_after={"alice": 1.5}),
    )
    for bad in bad_faults:
        with pytest.raises(ValueError):
            Faults(**bad)


def test_faults_live_in_fedproto_testing_and_memory_reexports_them() -> None:
    assert Faults is fedproto.testing.Faults
    assert Faults.__module__ == "fedproto.testing.faults"


# ------------------------------------------------------------------- the Network interface


async def test_endpoints_is_an_async_context_manager_that_closes_them() -> None:
    network = MemoryNetwork(ROSTER)
    assert isinstance(network, Network)
    async with network.endpoints() as endpoints:
        assert list(endpoints) == list(ROSTER)
        assert all(ep.party == p and ep.roster == ROSTER for p, ep in endpoints.items())
        await endpoints["alice"].send("bob", b"hi")
        assert await endpoints["bob"].receive() == ("alice", b"hi")
    for ep in endpoints.values():
        with pytest.raises(TransportClosed):
            await ep.send("alice", b"")
        with pytest.raises(TransportClosed):
            await ep.receive()


async def test_endpoints_opens_only_the_local_parties_and_checks_the_roster() -> None:
    network = MemoryNetwork(ROSTER)
    async with network.endpoints(ROSTER, local=["carol"]) as endpoints:
        assert list(endpoints) == ["carol"]
        assert endpoints["carol"] is network.endpoint("carol")  # the sync accessor stays
    assert not network.endpoint("alice")._closed  # only what was opened is closed
    with pytest.raises(ValueError, match="roster"):
        async with network.endpoints(["alice", "bob"]):
            pass
    with pytest.raises(ValueError, match="mallory"):
        async with network.endpoints(local=["mallory"]):
            pass


# ------------------------------------------------------------------------ fault injection


async def _drain(ep: Transport, quiet_s: float = 10.0) -> list[tuple[str, bytes, float]]:
    """Every frame that arrives until none has for ``quiet_s`` (use with autojump_clock)."""
    got = []
    while True:
        with trio.move_on_after(quiet_s):
            sender, frame = await ep.receive()
            got.append((sender, frame, trio.current_time()))
            continue
        return got


async def _send_numbered(faults: Faults, n: int = 400) -> list[int]:
    network = MemoryNetwork(ROSTER, faults=faults)
    alice, bob = network.endpoint("alice"), network.endpoint("bob")
    for i in range(n):
        await alice.send("bob", i.to_bytes(2, "big"))
    return [int.from_bytes(frame, "big") for _, frame, _ in await _drain(bob)]


async def test_drop_repeats_for_a_seed(autojump_clock: trio.testing.MockClock) -> None:
    first = await _send_numbered(Faults(seed=7, drop=0.25))
    again = await _send_numbered(Faults(seed=7, drop=0.25))
    other = await _send_numbered(Faults(seed=8, drop=0.25))
    assert first == again
    assert first != other
    assert first == sorted(first) and len(set(first)) == len(first)
    # 400 frames, p = 0.25: 100 expected drops, sd 8.7; the seed is fixed, so this cannot flake.
    assert 60 <= 400 - len(first) <= 140
    assert await _send_numbered(Faults(seed=7, drop=0.0)) == list(range(400))
    assert await _send_numbered(Faults(seed=7, drop=1.0)) == []


async def test_duplicate_delivers_copies_in_place(autojump_clock: trio.testing.MockClock) -> None:
    always = await _send_numbered(Faults(seed=1, duplicate=1.0), n=50)
    assert always == [i for i in range(50) for _ in range(2)]
    some = await _send_numbered(Faults(seed=1, duplicate=0.3))
    assert some == await _send_numbered(Faults(seed=1, duplicate=0.3))
    assert some == sorted(some) and sorted(set(some)) == list(range(400))
    copies = len(some) - 400
    assert 60 <= copies <= 180  # 120 expected, sd 9.2


async def test_delay_with_nursery_is_bounded_and_may_reorder(autojump_clock: trio.testing.MockClock) -> None:
    async def run(seed: int) -> list[tuple[int, float]]:
        network = MemoryNetwork(ROSTER, faults=Faults(seed=seed, delay_s=2.0))
        alice, bob = network.endpoint("alice"), network.endpoint("bob")
        async with trio.open_nursery() as nursery:
            network.attach_nursery(nursery)
            start = trio.current_time()
            for i in range(50):
                await alice.send("bob", bytes([i]))
            assert trio.current_time() == start  # the sender is not held up
            got = await _drain(bob)
        return [(frame[0], round(t - start, 6)) for _, frame, t in got]

    got = await run(5)
    assert got == await run(5)
    assert sorted(i for i, _ in got) == list(range(50))
    assert all(0.0 <= delay <= 2.0 for _, delay in got)
    assert [i for i, _ in got] != list(range(50))  # delayed frames overtake each other


async def test_delay_without_nursery_holds_the_sender_and_keeps_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork(ROSTER, faults=Faults(seed=5, delay_s=2.0))
    alice, bob = network.endpoint("alice"), network.endpoint("bob")
    start = trio.current_time()
    for i in range(20):
        await alice.send("bob", bytes([i]))
    elapsed = trio.current_time() - start
    assert 0.0 < elapsed <= 20 * 2.0
    assert [frame[0] for _, frame, _ in await _drain(bob)] == list(range(20))


async def test_crash_after_n_frames(autojump_clock: trio.testing.MockClock) -> None:
    network = MemoryNetwork(ROSTER, faults=Faults(crash_after={"alice": 3}))
    alice, bob = network.endpoint("alice"), network.endpoint("bob")
    for i in range(3):
        await alice.send("bob", bytes([i]))
    with pytest.raises(PartyCrashed, match="crashed") as info:
        await alice.send("bob", b"\x03")
    assert isinstance(info.value, TransportBroken) and info.value.party == "alice"
    with pytest.raises(PartyCrashed, match="crashed"):
        await alice.receive()
    await bob.send("alice", b"lost")  # a crashed peer swallows frames silently
    assert [frame for _, frame, _ in await _drain(bob)] == [b"\x00", b"\x01", b"\x02"]
    await alice.aclose()
    await bob.send("carol", b"still works")
    assert await network.endpoint("carol").receive() == ("bob", b"still works")

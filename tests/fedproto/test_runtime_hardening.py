"""Runtime hardening: no frame crashes a party, deadlines count silence, failures travel, logs stay short.

Issue 14: a frame that makes the decoder raise anything is the sender's fault; frames already
waiting are read before a deadline counts as silence; a failing party tells every other party who
failed, so all end promptly naming the same culprit; repeated refusals are logged as counts.
"""

from __future__ import annotations

import logging
import math

import msgpack
import numpy as np
import pytest
import trio

import fedproto
import fedproto.runtime
from fedproto._logging import RateLimitedLog
from fedproto.codec import encode_frame
from fedproto.errors import InsufficientParticipants, LocalProtocolError, PartyCrashed, RunAborted
from fedproto.messages import AbortNotice, Message, array_field
from fedproto.metering import MAX_REJECTED_KEPT, Meter
from fedproto.runtime import ABORT_PHASE, RuntimeConfig, run_parties, run_party
from fedproto.testing.toy import Contribution, SumCoordinator, SumWorker
from fedproto.testing import DelegatingTransport, run_each_party
from fedproto.transports.memory import Faults, MemoryNetwork

LOGGER = "fedproto.runtime"


def make(workers=("w0", "w1"), rounds=2, dim=3):
    machines = {"c": SumCoordinator("c", workers=list(workers), rounds=rounds, dim=dim)}
    for i, w in enumerate(workers):
        machines[w] = SumWorker(w, coordinator="c", values=np.arange(dim) + i)
    return machines


def expected_sums(n_workers=2, rounds=2, dim=3):
    """Per-round sums of the toy protocol: sum_i (arange(dim) + i) * (r + 1)."""
    total = sum(np.arange(dim) + i for i in range(n_workers))
    return np.stack([total * (r + 1) for r in range(rounds)]).astype(np.float64)




# --- 1. a frame that crashes the decoder is the sender's fault ----------------------------------

class Grid(Message, tag="test.hardening.grid"):
    """A message with a 2-D array, the shape of issue 14's decoder-crashing frame."""

    cells: np.ndarray = array_field("uint32", 2)


# A zero-length dimension next to 2**63: the byte length check passes with no data (issue 14).
HUGE_SHAPE_FRAME = msgpack.packb({"v": 1, "t": Grid.TAG, "s": 0, "r": 0, "p": "x", "b": [["u4", [0, 2**63], b""]]})


async def test_any_decoder_exception_is_refused_and_counted_and_the_run_completes(monkeypatch, caplog):
    machines = make()
    network = MemoryNetwork([*machines, "mallory"])  # mallory is in the roster but runs no machine
    poison = encode_frame(Contribution(values=np.zeros(3)), session=0, round_idx=0, phase="answer")
    real_decode = fedproto.runtime.decode_frame

    def decode(frame, **kwargs):
        if frame == poison:  # the one frame the decoder chokes on, with something not a DecodeError
            raise ValueError("Maximum allowed dimension exceeded")
        return real_decode(frame, **kwargs)

    monkeypatch.setattr(fedproto.runtime, "decode_frame", decode)
    mallory = network.endpoint("mallory")
    garbage = [np.random.default_rng(0).bytes(64), b"", b"\xc1", HUGE_SHAPE_FRAME, poison]
    for frame in garbage:
        await mallory.send("c", frame)
    meter = Meter(trio.current_time)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        results = await run_parties(machines, network, config=RuntimeConfig(deadline_s=5.0), meter=meter)
    np.testing.assert_array_equal(results["c"], expected_sums())
    assert meter.rejected_frames == len(garbage)
    assert {r["sender"] for r in meter.rejected} == {"mallory"}
    assert "ValueError: Maximum allowed dimension exceeded" in meter.rejected[-1]["reason"]
    assert meter.rejected_by_cause == {("mallory", "undecodable frame"): len(garbage)}
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert lines and all("mallory" in line for line in lines)  # every line names the sender
    assert meter.report(protocol="toy", transport="memory", session=0, parties=list(machines)).rejected_frames == 5


async def test_a_decoder_exception_in_a_party_alone_does_not_end_it(monkeypatch, autojump_clock):
    """run_party itself (the path of one CLI process) survives the frame, not just run_parties."""
    network = MemoryNetwork(["c", "w0"])
    coordinator = SumCoordinator("c", workers=["w0"], rounds=1, dim=1)
    worker = SumWorker("w0", coordinator="c", values=np.ones(1))
    bomb = b"a frame the decoder runs out of memory on"
    real_decode = fedproto.runtime.decode_frame

    def decode(frame, **kwargs):
        if frame == bomb:
            raise MemoryError("simulated: the frame asked for too much")
        return real_decode(frame, **kwargs)

    monkeypatch.setattr(fedproto.runtime, "decode_frame", decode)
    await network.endpoint("w0").send("c", bomb)
    meter = Meter(trio.current_time)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_party, worker, network.endpoint("w0"))
        result = await run_party(coordinator, network.endpoint("c"), meter=meter)
    np.testing.assert_array_equal(result, [[1.0]])
    assert meter.rejected_frames == 1 and "MemoryError" in meter.rejected[0]["reason"]


# --- 2. deadlines count silence, not work -----------------------------------------------------------


class SlowFirstFrame(DelegatingTransport):
    """Takes ``busy_s`` over the first frame it returns, as a party busy with one hostile frame."""

    def __init__(self, inner, busy_s):
        super().__init__(inner)
        self.busy_s = busy_s
        self.first = True

    async def receive(self):
        sender, frame = await self.inner.receive()
        if self.first:
            self.first = False
            with trio.CancelScope(shield=True):  # the work cannot be interrupted by the deadline
                await trio.sleep(self.busy_s)
        return sender, frame


class SlowFirstFrameWithoutHook(SlowFirstFrame):
    """The same, for a transport that cannot tell what is waiting (the old behaviour)."""

    receive_nowait = None


async def run_with_slow_coordinator(wrapper, deadline_s):
    machines = make()
    network = MemoryNetwork([*machines, "mallory"])
    await network.endpoint("mallory").send("c", b"\xc1 a frame that takes long to refuse")
    meter = Meter(trio.current_time)
    async with network.endpoints(local=list(machines)) as endpoints:
        endpoints["c"] = wrapper(endpoints["c"], busy_s=1.5 * deadline_s)
        results = await run_parties(machines, endpoints, config=RuntimeConfig(deadline_s=deadline_s), meter=meter)
    return results, meter


async def test_frames_queued_while_busy_are_read_before_the_deadline_counts(autojump_clock):
    deadline_s = 10.0
    start = trio.current_time()
    results, meter = await run_with_slow_coordinator(SlowFirstFrame, deadline_s)
    # The coordinator spent 1.5 deadlines on mallory's frame while both answers waited: they are
    # read, nobody is blamed, and every round has both workers.
    assert trio.current_time() - start == pytest.approx(1.5 * deadline_s)
    np.testing.assert_array_equal(results["c"], expected_sums())
    assert meter.rejected_frames == 1 and meter.rejected[0]["sender"] == "mallory"


async def test_without_the_hook_the_same_run_blames_parties_that_were_on_time(autojump_clock):
    """The control: the property above comes from reading waiting frames, not from luck."""
    with pytest.raises(InsufficientParticipants) as info:
        await run_with_slow_coordinator(SlowFirstFrameWithoutHook, 10.0)
    assert info.value.missing == ("w0", "w1")


async def test_a_flooding_peer_cannot_postpone_a_timeout(autojump_clock):
    machines = make()
    network = MemoryNetwork([*machines, "mallory"])
    del machines["w1"]  # silent
    start = trio.current_time()

    async def flood():
        mallory = network.endpoint("mallory")
        while True:
            await mallory.send("c", b"\xc1")
            await trio.sleep(0.001)

    outcome = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(flood)
        try:
            await run_parties(machines, network, config=RuntimeConfig(deadline_s=10.0))
        except InsufficientParticipants as exc:
            outcome.append(exc)
        nursery.cancel_scope.cancel()
    assert outcome and outcome[0].missing == ("w1",)
    assert trio.current_time() - start == pytest.approx(10.0, abs=0.01)


# --- 3. failures travel ------------------------------------------------------------------------------


async def run_each(machines, endpoints, config, meter=None):
    """Run every party in its own task, as separate processes would: ``{party: (end time, result
    or exception)}``."""
    return await run_each_party(machines, endpoints, config, meter=meter)


async def test_a_crashed_worker_is_named_by_every_survivor_within_one_deadline(autojump_clock):
    deadline_s = 10.0
    machines = make(workers=("w0", "w1", "w2"), rounds=3)
    network = MemoryNetwork(list(machines), faults=Faults(crash_after={"w0": 1}))
    meter = Meter(trio.current_time)
    start = trio.current_time()
    async with network.endpoints() as endpoints:
        outcomes = await run_each(machines, endpoints, RuntimeConfig(deadline_s=deadline_s), meter)
    # w0 answered round 0 and crashed sending its round-1 answer, at time 0.
    assert isinstance(outcomes["w0"][1], PartyCrashed)
    ended, error = outcomes["c"]
    assert isinstance(error, InsufficientParticipants) and error.missing == ("w0",)
    assert ended - start == pytest.approx(deadline_s)
    for survivor in ("w1", "w2"):
        ended, error = outcomes[survivor]
        assert isinstance(error, RunAborted), error
        # the error is about its reporter; the culprits are the reporter's claim
        assert error.culprits == ("w0",) and error.party == "c" and error.reporter == "c"
        assert str(error).startswith("c reports that w0 failed: ") and str(error).count("party=") == 1
        # told at the coordinator's deadline, not at their own (2 deadlines) blaming c
        assert ended - start == pytest.approx(deadline_s)
    aborts = [k for k in meter.sent if k[1] == ABORT_PHASE]
    assert sorted(k[3] for k in aborts) == ["w0", "w1", "w2"]  # one notice to every other party
    assert {(k[2], k[4]) for k in aborts} == {("c", AbortNotice.TAG)}


async def test_run_parties_raises_the_failing_party_s_error_not_the_notice(autojump_clock):
    machines = make(workers=("w0", "w1", "w2"), rounds=3)
    network = MemoryNetwork(list(machines), faults=Faults(crash_after={"w0": 1}))
    with pytest.raises(InsufficientParticipants) as info:
        await run_parties(machines, network, config=RuntimeConfig(deadline_s=10.0))
    assert info.value.missing == ("w0",)


async def test_a_party_that_fails_on_its_own_is_named_by_the_others(autojump_clock):
    machines = make(workers=("w0", "w1"), rounds=2)

    class Miscounting(SumWorker):
        def _on_query(self, sender, message):
            self.values = np.full(3, "x", dtype=object)  # a message it cannot encode
            return super()._on_query(sender, message)

    machines["w1"] = Miscounting("w1", coordinator="c", values=np.zeros(3))
    meter = Meter(trio.current_time)
    start = trio.current_time()
    async with MemoryNetwork(list(machines)).endpoints() as endpoints:
        outcomes = await run_each(machines, endpoints, RuntimeConfig(deadline_s=10.0), meter)
    assert isinstance(outcomes["w1"][1], LocalProtocolError)
    # w1 only ever talked to c, so it tells c; c passes the notice on to w0, its other contact,
    # as w1's: it does not make w1's report its own.
    for survivor, relay in (("c", ""), ("w0", "c")):
        ended, error = outcomes[survivor]
        assert isinstance(error, RunAborted) and error.culprits == ("w1",) and error.reporter == "w1"
        assert error.party == "w1" and error.relayed_by == relay
        assert "cannot send" in error.reason
        said = "w1 failed and ended the run: "
        assert str(error).startswith(f"c says {said}" if relay else said), error
        assert ended == start  # at once, not after a deadline
    assert sorted((k[2], k[3]) for k in meter.sent if k[1] == ABORT_PHASE) == [("c", "w0"), ("w1", "c")]


async def test_notices_stay_linear_when_every_client_of_a_dead_coordinator_fails(autojump_clock):
    n_workers = 50
    machines = make(workers=[f"w{i}" for i in range(n_workers)], rounds=2)
    network = MemoryNetwork(list(machines), faults=Faults(crash_after={"c": n_workers}))  # dies after round 0
    meter = Meter(trio.current_time)
    async with network.endpoints() as endpoints:
        outcomes = await run_each(machines, endpoints, RuntimeConfig(deadline_s=10.0), meter)
    assert isinstance(outcomes["c"][1], PartyCrashed)
    for w in (f"w{i}" for i in range(n_workers)):
        error = outcomes[w][1]
        assert isinstance(error, InsufficientParticipants | RunAborted) and error.party == "c", error
    # each client tells only the party it talked to (here the culprit): n notices, not n * (n - 1)
    aborts = {k: c[0] for k, c in meter.sent.items() if k[1] == ABORT_PHASE}
    assert sum(aborts.values()) <= n_workers and {k[3] for k in aborts} == {"c"}


class SendToHangs(DelegatingTransport):
    """After its first frame, sending to ``stuck`` never completes (a peer behind a dead link)."""

    def __init__(self, inner, stuck):
        super().__init__(inner)
        self.stuck = stuck
        self.sent_to_stuck = 0

    async def send(self, dest, frame):
        if dest == self.stuck:
            self.sent_to_stuck += 1
            if self.sent_to_stuck > 1:
                await trio.sleep_forever()
        await self.inner.send(dest, frame)


async def test_telling_the_others_is_bounded_and_skips_an_unreachable_peer(autojump_clock):
    machines = make(workers=("w0", "w1", "w2"), rounds=2)
    network = MemoryNetwork(list(machines))
    silent = machines.pop("w2")
    assert silent is not None
    start = trio.current_time()
    async with network.endpoints(local=list(machines)) as endpoints:
        outcomes = {}
        config = RuntimeConfig(deadline_s=10.0)

        async def coordinator():
            try:
                await run_party(machines["c"], SendToHangs(endpoints["c"], stuck="w2"), config=config)
            except Exception as exc:
                outcomes["c"] = (trio.current_time(), exc)

        async def worker(party):
            try:
                await run_party(machines[party], endpoints[party], config=config)
            except Exception as exc:
                outcomes[party] = (trio.current_time(), exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(coordinator)
            for w in ("w0", "w1"):
                nursery.start_soon(worker, w)
    ended, error = outcomes["c"]
    assert isinstance(error, InsufficientParticipants) and error.missing == ("w2",)
    assert ended - start == pytest.approx(10.0 + fedproto.runtime.ABORT_NOTICE_TIMEOUT_S)
    for w in ("w0", "w1"):
        assert isinstance(outcomes[w][1], RunAborted) and outcomes[w][0] - start == pytest.approx(10.0)


async def test_a_notice_is_not_echoed_and_names_several_culprits(autojump_clock):
    network = MemoryNetwork(["c", "w0"])
    meter = Meter(trio.current_time)
    notice = AbortNotice(culprits=("w2", "w1"), reason="no progress within 10 s;\nstill waiting for w1, w2")
    await network.endpoint("c").send("w0", encode_frame(notice, session=0, round_idx=0, phase=ABORT_PHASE))
    worker = SumWorker("w0", coordinator="c", values=np.zeros(1))
    with pytest.raises(RunAborted) as info:
        await run_party(worker, network.endpoint("w0"), meter=meter)
    error = info.value
    assert error.culprits == ("w1", "w2") and error.party == "c" and error.reporter == "c"
    assert "\n" not in str(error) and str(error).startswith("c reports that w1, w2 failed: ")
    assert not meter.sent  # the told party tells nobody
    assert isinstance(error, fedproto.RemoteProtocolError) and fedproto.RunAborted is RunAborted


async def test_a_notice_naming_many_culprits_keeps_the_message_short(autojump_clock):
    network = MemoryNetwork(["c", "w0"])
    culprits = tuple(f"w{i}" for i in range(1, 101))
    notice = AbortNotice(culprits=culprits, reason="silent")
    await network.endpoint("c").send("w0", encode_frame(notice, session=0, round_idx=0, phase=ABORT_PHASE))
    with pytest.raises(RunAborted) as info:
        await run_party(SumWorker("w0", coordinator="c", values=np.zeros(1)), network.endpoint("w0"))
    assert len(info.value.culprits) == 100 and str(info.value).startswith(
        "c reports that w1, w10, w100, w11, w12, w13, w14, w15, w16, w17 and 90 more failed: silent"
    )


def test_abort_notice_validation():
    with pytest.raises(ValueError):
        AbortNotice(culprits=(), reason="x")
    with pytest.raises(ValueError):
        AbortNotice(culprits=("",), reason="x")
    with pytest.raises(ValueError):
        AbortNotice(culprits=("w0",), reason="x" * 1001)


# --- 5. rate-limited logs ---------------------------------------------------------------------------


async def test_a_thousand_refusals_make_a_handful_of_lines_with_the_count(caplog):
    machines = make(rounds=1)
    network = MemoryNetwork([*machines, "mallory"])
    mallory = network.endpoint("mallory")
    for i in range(1000):
        await mallory.send("c", b"\xc1" + i.to_bytes(2, "big"))
    await mallory.send("c", encode_frame(Contribution(values=np.zeros(3)), session=9, round_idx=0, phase="answer"))
    meter = Meter(trio.current_time)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        results = await run_parties(machines, network, meter=meter)
    np.testing.assert_array_equal(results["c"], expected_sums(rounds=1))
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) <= 3, lines
    assert any("refused 999 more (undecodable frame) from mallory" in line for line in lines), lines
    assert any("session 9" in line for line in lines)  # another cause is not folded into the count
    assert meter.rejected_frames == 1001 and len(meter.rejected) == min(1001, MAX_REJECTED_KEPT)
    assert meter.rejected_by_cause[("mallory", "undecodable frame")] == 1000


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_rate_limited_log_summarises_per_peer_and_cause_per_interval(caplog):
    clock = FakeClock()
    limiter = RateLimitedLog(logging.getLogger("test.ratelimit"), "c", interval_s=10.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.ratelimit"):
        for i in range(500):
            clock.now = i * 0.01  # 5 s of refusals: one line
            limiter.log("m", "bad", "c refused frame %d from m", i)
        limiter.log("n", "bad", "c refused a frame from n")  # another peer: its own line
        limiter.log("m", "worse", "c refused a worse frame from m")  # another cause: its own line
        clock.now = 12.0
        limiter.log("m", "bad", "c refused frame %d from m", 500)  # interval passed: one summary
        clock.now = 13.0
        limiter.log("m", "bad", "c refused frame %d from m", 501)  # held back again
        limiter.flush()
        limiter.flush()  # nothing left to say
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "c refused frame 0 from m",
        "c refused a frame from n",
        "c refused a worse frame from m",
        "c: refused 500 more (bad) from m in the last 12.0 s; latest: c refused frame 500 from m",
        "c: refused 1 more (bad) from m in the last 1.0 s; latest: c refused frame 501 from m",
    ]


def test_rate_limited_log_after_a_quiet_interval_logs_in_full_and_bounds_its_keys(caplog):
    clock = FakeClock()
    limiter = RateLimitedLog(logging.getLogger("test.ratelimit"), "c", interval_s=10.0, clock=clock, max_keys=2)
    with caplog.at_level(logging.WARNING, logger="test.ratelimit"):
        limiter.log("a", "x", "first from a")
        clock.now = 20.0
        limiter.log("a", "x", "second from a")  # nothing was held back: a full line, no summary
        limiter.log("a", "x", "third from a")
        limiter.log("b", "x", "first from b")
        limiter.log("c", "x", "first from c")  # evicts a, summarising its held-back line
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "first from a",
        "second from a",
        "first from b",
        "c: refused 1 more (x) from a in the last 0.0 s; latest: third from a",
        "first from c",
    ]
    assert math.isclose(limiter.interval_s, 10.0)
    with pytest.raises(ValueError):
        RateLimitedLog(logging.getLogger("x"), "c", interval_s=0)

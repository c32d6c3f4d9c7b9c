"""A failure notice is evidence about its sender only (issue 33, item 1).

The attack: client-1, with its own valid kit, sends a forged ``AbortNotice`` blaming an honest
party. Before, every party adopted the culprits as a fact ("client-0 failed, reported by
client-1"; passed on by the hub, "client-0 failed, reported by server"), and a notice relayed to
client-0 blaming the hub ended client-0, after which the hub blamed client-0 for its silence.
Now, on the memory transport and over TCP (star, mutual TLS):

* every honest party's error names the insider as its ``party`` and reporter, leads with it, and
  states the culprits only as its claim; a notice passed on by the hub says that it passes it on;
* the party report's error names the insider as ``party`` and the culprits as the claim;
* in a dropout-tolerant protocol (SecAgg+ summation, FastLloyd with SecAgg+) the insider's notice
  ends only its own part: the others get the result of a run in which it dropped out;
* a passed-on notice whose origin cannot be (outside the roster, the receiver itself) counts as
  its sender's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import msgpack
import numpy as np
import pytest
import trio
from fedproto.algorithms.secagg_plus import Modulus, SecAggPlusConfig, SumClient, SumServer
from fedproto.transports.memory import MemoryNetwork
from fedproto.transports.tcp import open_tcp_network

from fedproto.codec import decode_frame, encode_frame
from fedproto.errors import DecodeError, PartyCrashed, RunAborted
from fedproto.messages import AbortNotice
from fedproto.metering import error_record
from fedproto.runtime import ABORT_PHASE, RuntimeConfig, run_parties, run_party
from fedproto.testing import DelegatingTransport, Faults
from fedproto.testing.toy import SumCoordinator, SumWorker

KINDS = ["memory", "tcp-tls-star"]
TOY = ("c", "w0", "w1", "w2")  # c is the hub of the star; w1 is the insider
DEADLINE_S = 20.0
LIMIT_S = 60.0


@contextlib.asynccontextmanager
async def endpoints(kind: str, roster: tuple[str, ...], session: int = 0) -> AsyncIterator[dict]:
    """Every party's endpoint: an in-process memory network, or TCP in a star (the roster's first
    party is the hub) with mutual TLS from a throwaway federation's kits."""
    if kind == "memory":
        async with MemoryNetwork(list(roster)).endpoints() as eps:
            yield eps
    else:
        async with open_tcp_network(roster, topology="star", session=session) as eps:
            assert all(ep.uses_tls for ep in eps.values())
            yield eps


class Insider(DelegatingTransport):
    """An insider's endpoint: when its party receives frame number ``after``, it sends ``target``
    a forged notice blaming ``culprits``, then goes away without another word (a crash)."""

    def __init__(
        self, inner, *, after: int, target: str, culprits: tuple[str, ...], origin: str = "", session: int = 0
    ) -> None:
        super().__init__(inner)
        self.after, self.target, self.received = after, target, 0
        self.notice = _notice(culprits, origin, session)

    async def receive(self):
        item = await self.inner.receive()
        self.received += 1
        if self.received == self.after:
            await self.inner.send(self.target, self.notice)
            raise PartyCrashed(f"{self.party} forged a notice and left", party=self.party)
        return item

    def receive_nowait(self):
        return None  # every frame goes through receive(), which counts it


def _notice(culprits: tuple[str, ...], origin: str = "", session: int = 0) -> bytes:
    notice = AbortNotice(culprits=culprits, reason="it sent garbage", origin=origin)
    return encode_frame(notice, session=session, round_idx=0, phase=ABORT_PHASE)


async def run_each(machines: dict, eps: dict, transports: dict | None = None, session: int = 0) -> dict:
    """Run every party in its own task, as separate processes would: ``{party: result or error}``."""
    outcomes: dict = {}
    transports = transports or {}
    config = RuntimeConfig(session=session, deadline_s=DEADLINE_S)

    async def one(party):
        try:
            outcomes[party] = await run_party(machines[party], transports.get(party, eps[party]), config=config)
        except Exception as exc:
            outcomes[party] = exc

    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            for party in machines:
                nursery.start_soon(one, party)
    return outcomes


def toy_machines(rounds: int = 3) -> dict:
    machines = {"c": SumCoordinator("c", workers=["w0", "w1", "w2"], rounds=rounds, dim=2)}
    for i, w in enumerate(("w0", "w1", "w2")):
        machines[w] = SumWorker(w, coordinator="c", values=np.arange(2.0) + i)
    return machines


def assert_names_only_the_insider(outcomes: dict, insider: str, culprit: str) -> None:
    """Every honest party's error is about the insider, and blames ``culprit`` only as its claim."""
    for party, error in outcomes.items():
        if party == insider:
            continue
        assert isinstance(error, RunAborted), (party, error)
        assert error.party == error.reporter == insider, (party, error)
        assert error.culprits == (culprit,)
        text = str(error)
        assert not text.startswith(f"{culprit} failed"), text  # never stated as a fact
        assert f"{insider} reports that {culprit} failed: it sent garbage" in text, text
        said_by = f"{error.relayed_by} says " if error.relayed_by else ""
        assert text.startswith(said_by + insider), text
        record = error_record(error, reporter=party)
        assert record["party"] == insider and record["culprits"] == [culprit], record


@pytest.mark.parametrize("kind", KINDS)
async def test_a_forged_notice_to_the_hub_names_the_insider_everywhere(kind: str) -> None:
    """w1 answers round 0, then tells the hub that w0 failed: the hub's error and the errors of
    the clients it passes the notice on to all name w1; the clients hear it from the hub as w1's."""
    machines = toy_machines()
    async with endpoints(kind, TOY) as eps:
        insider = Insider(eps["w1"], after=2, target="c", culprits=("w0",))
        outcomes = await run_each(machines, eps, {"w1": insider})
    assert isinstance(outcomes["w1"], PartyCrashed)
    assert_names_only_the_insider(outcomes, "w1", "w0")
    assert outcomes["c"].relayed_by == ""
    assert str(outcomes["c"]).startswith("w1 reports that w0 failed: it sent garbage (party=w1")
    for client in ("w0", "w2"):
        assert outcomes[client].relayed_by == "c"
        assert str(outcomes[client]).startswith("c says w1 reports that w0 failed: it sent garbage (party=w1")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_forged_notice_to_a_client_blaming_the_hub_names_the_insider_everywhere(kind: str) -> None:
    """w1 tells w0 (over TCP, through the hub's relay) that the hub failed: w0 ends naming w1 and
    passes the notice on to the hub, which so never blames w0's silence, and on to w2."""
    machines = toy_machines()
    async with endpoints(kind, TOY) as eps:
        # The round-1 query: w0 has answered round 0 by then, so it knows the hub.
        insider = Insider(eps["w1"], after=2, target="w0", culprits=("c",))
        outcomes = await run_each(machines, eps, {"w1": insider})
    assert_names_only_the_insider(outcomes, "w1", "c")
    assert str(outcomes["w0"]).startswith("w1 reports that c failed: it sent garbage")
    assert str(outcomes["c"]).startswith("w0 says w1 reports that c failed: it sent garbage")
    assert str(outcomes["w2"]).startswith("c says w1 reports that c failed: it sent garbage")


async def test_a_relayed_notice_whose_origin_cannot_be_counts_as_the_senders_own(autojump_clock) -> None:
    """A sender cannot pin its notice on the receiver or on a name outside the roster."""
    for origin in ("w0", "stranger"):
        network = MemoryNetwork(["c", "w0"])
        await network.endpoint("c").send("w0", _notice(("w1",), origin=origin))
        with pytest.raises(RunAborted) as info:
            await run_party(SumWorker("w0", coordinator="c", values=np.zeros(1)), network.endpoint("w0"))
        error = info.value
        assert error.reporter == error.party == "c" and error.relayed_by == "", error
        assert str(error).startswith("c reports that w1 failed: it sent garbage")


def test_the_origin_travels_and_is_decoded_strictly() -> None:
    frame = _notice(("w0",), origin="w1")
    _, notice = decode_frame(frame)
    assert notice == AbortNotice(culprits=("w0",), reason="it sent garbage", origin="w1")
    # the origin must be a string: anything else is a DecodeError, never another exception
    envelope = msgpack.unpackb(frame)
    envelope["b"][2] = 7
    with pytest.raises(DecodeError):
        decode_frame(msgpack.packb(envelope))
    envelope["b"] = envelope["b"][:2] + ["w1", "extra"]
    with pytest.raises(DecodeError):
        decode_frame(msgpack.packb(envelope))


# --- dropout-tolerant protocols: a client's notice is its dropout -------------------------------------

N_CLIENTS, LENGTH, ROUNDS, SESSION = 5, 4, 2, 9
CLIENTS = tuple(f"client-{i}" for i in range(N_CLIENTS))
SUM_ROSTER = ("server", *CLIENTS)


def sum_machines() -> dict:
    modulus = Modulus.ring(32)
    config = SecAggPlusConfig(N_CLIENTS, LENGTH, modulus, 4, 3, bytes(range(32)))  # 3 of 5 recover
    rng = np.random.default_rng(5)
    machines = {"server": SumServer("server", config=config, clients=CLIENTS, rounds=ROUNDS, session=SESSION)}
    for i, name in enumerate(CLIENTS):
        inputs = [rng.integers(0, 2**31, LENGTH, dtype=np.uint64) for _ in range(ROUNDS)]
        machines[name] = SumClient(
            name, config=config, server="server", clients=CLIENTS, inputs=inputs, entropy=bytes([i + 1]) * 32,
            session=SESSION,
        )
    return machines


def dropout_reference() -> dict:
    """The results of the run in which client-1 drops out as it would send its masked input."""
    machines = sum_machines()
    network = MemoryNetwork(list(machines), faults=Faults(crash_at={"client-1": ("masked-input", 0)}), report_drops=True)

    async def go():
        return await run_parties(machines, network, config=RuntimeConfig(session=SESSION, deadline_s=DEADLINE_S))

    return trio.run(go)


@pytest.fixture(scope="module")
def reference() -> dict:
    return dropout_reference()


@pytest.mark.parametrize("kind", KINDS)
async def test_in_secagg_plus_a_clients_forged_notice_ends_only_its_own_part(kind: str, reference: dict) -> None:
    """client-1 tells the server that client-0 failed as it gets its neighbours' keys: the server
    counts client-1 as dropped at that stage and every other client gets the sums of the run in
    which client-1 dropped out there."""
    machines = sum_machines()
    async with endpoints(kind, SUM_ROSTER, session=SESSION) as eps:
        insider = Insider(eps["client-1"], after=1, target="server", culprits=("client-0",), session=SESSION)
        outcomes = await run_each(machines, eps, {"client-1": insider}, session=SESSION)
        assert eps["client-1"].receive_nowait() is None  # its part is over: nothing more was sent to it
    assert isinstance(outcomes["client-1"], PartyCrashed)
    server = outcomes["server"]
    assert not isinstance(server, BaseException), server
    assert server.dropouts == reference["server"].dropouts == {"client-1": (0, "masked-input")}
    assert server.survivors == reference["server"].survivors
    for r in range(ROUNDS):
        assert np.array_equal(server.totals[r], reference["server"].totals[r])
    for name in CLIENTS:
        if name == "client-1":
            continue
        result = outcomes[name]
        assert not isinstance(result, BaseException), (name, result)
        assert all(np.array_equal(a, b) for a, b in zip(result.totals, reference[name].totals, strict=True))


def test_a_secagg_plus_client_does_not_carry_on_without_its_server() -> None:
    machines = sum_machines()
    assert machines["server"].carries_on_without("client-3")
    assert not machines["server"].carries_on_without("server") and not machines["server"].carries_on_without("x")
    assert not machines["client-0"].carries_on_without("server")
    assert not machines["client-0"].carries_on_without("client-1")


async def test_a_notice_from_a_dropped_party_is_not_news(autojump_clock) -> None:
    """A second notice from a party already counted as dropped is ignored; the run completes."""
    machines = sum_machines()
    async with MemoryNetwork(list(machines)).endpoints() as eps:

        class Twice(Insider):
            async def receive(self):
                if self.received + 1 == self.after:
                    await self.inner.send(self.target, self.notice)
                return await super().receive()

        insider = Twice(eps["client-1"], after=1, target="server", culprits=("client-0",), session=SESSION)
        outcomes = await run_each(machines, eps, {"client-1": insider}, session=SESSION)
    assert outcomes["server"].dropouts == {"client-1": (0, "masked-input")}
    assert all(not isinstance(outcomes[c], BaseException) for c in CLIENTS if c != "client-1")


def test_in_fastlloyd_with_secagg_plus_a_forged_notice_is_a_dropout() -> None:
    """FastLloyd's server with SecAgg+ takes a client's notice as its dropout: the others'
    centroids are those of the run in which that client dropped out at the same stage."""
    from fedproto.algorithms.fastlloyd.config import make_config
    from fedproto.algorithms.fastlloyd.protocol import FastLloydClient, FastLloydServer
    from fedproto.algorithms.secagg_plus import engine

    from fedproto.data import normalize, partition

    rng = np.random.default_rng(77)
    blobs = normalize(np.concatenate([rng.normal(c, 0.4, size=(40, 2)) for c in ((0, 0), (4, 0), (0, 4))]))
    config = make_config("fastlloyd", n=len(blobs), k=3, d=2, epsilon=2.0, iterations=2, init_seed=1)
    plus = engine.plus_config(N_CLIENTS, config.k * (config.d + 1), engine.Modulus.ring(config.ring_bits))
    parts = partition(len(blobs), N_CLIENTS, scheme="iid", seed=0)

    def machines():
        out = {"server": FastLloydServer("server", config=config, clients=CLIENTS, noise_seed=3, session=SESSION,
                                         secagg_plus=plus)}
        for i, name in enumerate(CLIENTS):
            out[name] = FastLloydClient(name, config=config, server="server", clients=CLIENTS, points=blobs[parts[i]],
                                        entropy=bytes([i + 1]) * 32, session=SESSION, secagg_plus=plus)
        return out

    async def forged():
        async with MemoryNetwork(list(SUM_ROSTER)).endpoints() as eps:
            insider = Insider(eps["client-1"], after=1, target="server", culprits=("client-0",), session=SESSION)
            return await run_each(machines(), eps, {"client-1": insider}, session=SESSION)

    async def dropped():
        # Its first frame is the server's opening of iteration 0: it would advertise its keys next.
        faults = Faults(crash_at={"client-1": ("advertise-keys", 0)})
        network = MemoryNetwork(list(SUM_ROSTER), faults=faults, report_drops=True)
        return await run_parties(machines(), network, config=RuntimeConfig(session=SESSION, deadline_s=DEADLINE_S))

    got, want = trio.run(forged), trio.run(dropped)
    assert got["server"].dropouts == want["server"].dropouts == {"client-1": (0, "advertise-keys")}
    for name in CLIENTS:
        if name != "client-1":
            assert np.array_equal(got[name].centroids, want[name].centroids), name

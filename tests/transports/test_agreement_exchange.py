"""TCP endpoints compare their agreement records in the handshake, MPI ranks in one collective (fedproto.agreement)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import msgpack
import pytest
import trio

from fedproto.agreement import Agreement
from fedproto.errors import AgreementMismatch
from fedproto.provision import FederationCA
from fedproto.transports._framing import FrameReader, send_frame
from fedproto.transports.tcp import HANDSHAKE_VERSION, TcpAddress, TcpTransport, roster_digest

ROSTER = ("c", "w0", "w1")
SECRET = b"s" * 32
MODES = [("tls", "star"), ("secret", "star"), ("tls", "mesh"), ("secret", "mesh")]


def record(seed: int) -> Agreement:
    return Agreement("toy", {"--seed": seed, "--k": 3}, ROSTER, topology="star", session=7)


@pytest.fixture
def kits(tmp_path: Path) -> dict:
    ca = FederationCA.create()
    out = {}
    for p in ROSTER:
        (tmp_path / p).mkdir()
        out[p] = ca.issue(p).write(tmp_path / p)
    return out


@contextlib.asynccontextmanager
async def serving(
    kits: dict, security: str, topology: str, seeds: dict[str, int | None]
) -> AsyncIterator[dict[str, TcpTransport]]:
    """One endpoint per party (``seeds[p]``: its record's seed, ``None``: no record), all serving."""
    listening = ROSTER if topology == "mesh" else ROSTER[:1]
    addresses = {p: TcpAddress("127.0.0.1", 0) for p in listening}
    endpoints = {}
    for p in ROSTER:
        auth = {"tls": kits[p]} if security == "tls" else {"secret": SECRET}
        agreement = None if seeds[p] is None else record(seeds[p])
        endpoints[p] = TcpTransport(
            p, ROSTER, addresses, topology=topology, session=7, agreement=agreement, connect_timeout_s=10.0, **auth
        )
    async with trio.open_nursery() as nursery:
        for p in listening:
            await nursery.start(endpoints[p].serve)
        for endpoint in endpoints.values():
            endpoint.addresses.update({p: endpoints[p].addresses[p] for p in listening})
        for p in ROSTER:
            if p not in listening:
                await nursery.start(endpoints[p].serve)
        try:
            yield endpoints
        finally:
            for endpoint in endpoints.values():
                await endpoint.aclose()
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("security", "topology"), MODES)
async def test_a_party_with_another_seed_ends_both_ends_naming_the_option(
    kits: dict, security: str, topology: str
) -> None:
    with trio.fail_after(20):
        async with serving(kits, security, topology, {"c": 3, "w0": 3, "w1": 4}) as eps:
            await eps["w0"].send("c", b"fine")  # a party that agrees is admitted
            with pytest.raises(AgreementMismatch) as dialer:
                await eps["w1"].send("c", b"never")
                await eps["w1"].receive()
            assert dialer.value.party == "c"
            assert dialer.value.detail == (
                "c runs with --seed 3, this party (w1) with --seed 4; every party must run the same options"
            )
            with pytest.raises(AgreementMismatch) as listener:  # the listener learnt it too: its run is over
                while True:
                    assert (await eps["c"].receive())[0] == "w0"  # w0's frame, if it came first
            assert listener.value.party == "w1"
            assert "w1 runs with --seed 4, this party (c) with --seed 3" in listener.value.detail
            with pytest.raises(AgreementMismatch):
                await eps["c"].send("w1", b"x")
            await eps["c"].send("w0", b"notice")  # its other peers can still be told
            assert await eps["w0"].receive() == ("c", b"notice")


@pytest.mark.parametrize(("security", "topology"), MODES)
async def test_equal_records_run_and_no_record_agrees_only_with_none(kits: dict, security: str, topology: str) -> None:
    with trio.fail_after(20):
        for seeds in ({"c": 3, "w0": 3, "w1": 3}, {"c": None, "w0": None, "w1": None}):
            async with serving(kits, security, topology, seeds) as eps:  # None: API users' old behaviour
                await eps["w1"].send("w0", b"a")
                await eps["w0"].send("c", b"b")
                assert await eps["w0"].receive() == ("w1", b"a")
                assert await eps["c"].receive() == ("w0", b"b")
        async with serving(kits, security, topology, {"c": 3, "w0": 3, "w1": None}) as eps:
            with pytest.raises(AgreementMismatch, match="this party .w1. without stating its options"):
                await eps["w1"].send("c", b"c")  # in a mesh it dials now
            with pytest.raises(AgreementMismatch, match="w1 runs without stating its options"):
                await eps["c"].receive()


async def test_a_stranger_without_the_secret_cannot_end_the_run_with_other_options(kits: dict) -> None:
    with trio.fail_after(20):
        async with serving(kits, "secret", "mesh", {"c": 3, "w0": 3, "w1": 3}) as eps:
            address = eps["c"].addresses["c"]
            stream = await trio.open_tcp_stream(address.host, address.port)
            hello = [HANDSHAKE_VERSION, 7, roster_digest(ROSTER), "w1", "c", b"n" * 32, record(4).to_bytes()]
            await send_frame(stream, msgpack.packb(hello))
            challenge = msgpack.unpackb(await FrameReader(stream).receive_frame(1 << 14))
            assert len(challenge) == 3  # the listener's record comes with its challenge
            await send_frame(stream, msgpack.packb([b"f" * 32]))  # a forged proof
            with pytest.raises(trio.EndOfChannel):
                await FrameReader(stream).receive_frame(1 << 14)
            stream.socket.close()
            await eps["w1"].send("c", b"still on")  # the run goes on
            assert await eps["c"].receive() == ("w1", b"still on")


async def test_handshake_records_are_handshake_bytes_not_payload(kits: dict) -> None:
    with trio.fail_after(20):
        async with serving(kits, "secret", "star", {"c": 3, "w0": 3, "w1": 3}) as eps:
            await eps["w0"].send("c", b"x")
            await eps["c"].receive()
        async with serving(kits, "secret", "star", {"c": None, "w0": None, "w1": None}) as bare:
            await bare["w0"].send("c", b"x")
            await bare["c"].receive()
        # the record (its JSON, once per hello) is the only difference in what w0 wrote
        assert eps["w0"].handshake_bytes - bare["w0"].handshake_bytes == len(record(3).to_bytes()) + 2


class _FakeComm:
    """The view of one rank of ranks whose records are ``records`` (only the calls the check makes)."""

    def __init__(self, records: list[bytes], rank: int) -> None:
        self.records, self.rank = records, rank

    def Get_size(self) -> int:
        return len(self.records)

    def Get_rank(self) -> int:
        return self.rank

    def Allgather(self, send, recv) -> None:
        import hashlib

        if recv.ndim == 2:  # the digests
            for r, rec in enumerate(self.records):
                recv[r] = list(hashlib.sha256(rec).digest() if rec else bytes(32))
        else:  # the records' lengths
            recv[:] = [len(rec) for rec in self.records]

    def Allgatherv(self, send, spec) -> None:
        spec[0][:] = list(b"".join(self.records))


def test_mpi_ranks_compare_records_in_one_collective_and_name_the_option(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedproto.transports import mpi

    monkeypatch.setattr(mpi, "_import_mpi", lambda: type("MPI", (), {"BYTE": "byte"}))
    same = [record(3).to_bytes()] * 3
    mpi._compare_agreements(_FakeComm(same, 1), record(3), ROSTER)  # agreeing ranks: no error
    mixed = [record(3).to_bytes(), record(3).to_bytes(), record(4).to_bytes()]
    with pytest.raises(AgreementMismatch) as at_zero:
        mpi._compare_agreements(_FakeComm(mixed, 0), record(3), ROSTER)
    assert at_zero.value.detail.startswith("w1 runs with --seed 4, this party (c) with --seed 3;")
    with pytest.raises(AgreementMismatch) as at_odd:
        mpi._compare_agreements(_FakeComm(mixed, 2), record(4), ROSTER)
    assert at_odd.value.detail.startswith("c runs with --seed 3, this party (w1) with --seed 4;")

"""The TCP transport's mutual TLS 1.3 (issue 10, part 3).

* a run of the toy protocol over a provisioned federation gives the right sums, and the
  conformance suite passes over TLS;
* while that run goes on, a dialer presenting another party's certificate (valid CA, another name
  claimed in the hello), a certificate for a name outside the roster, one from another CA, an
  expired one, none at all, or no TLS (plaintext) is refused and logged, and the run completes;
* a dialer refuses a listener whose certificate names another party before it says anything;
* frames on the wire are encrypted (a recording proxy sees no plaintext; in shared-secret mode it
  does), and the TLS overhead counted is exactly the RFC 8446 record overhead;
* an endpoint refuses, at construction, a kit for another party, an expired certificate, one not
  signed by the kit's CA, and party names that cannot be certificate names.
"""

from __future__ import annotations

import datetime
import functools
import logging
import math
import ssl
from pathlib import Path

import msgpack
import numpy as np
import pytest
import trio
import trio.testing

from fedproto.errors import PeerUnreachable, TransportClosed
from fedproto.metering import Meter
from fedproto.provision import FederationCA, PartyCredentials
from fedproto.roster import TlsFiles
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.testing import DelegatingTransport, load_file
from fedproto.testing.conformance import run_conformance
from fedproto.testing.toy import expected_sums
from fedproto.testing.toy import sum_machines as toy_machines
from fedproto.transports._framing import FRAMING_OVERHEAD_BYTES, send_frame
from fedproto.transports.tcp import (
    HANDSHAKE_VERSION,
    TLS_HELLO_VERSION,
    TcpAddress,
    TcpTransport,
    open_tcp_network,
    roster_digest,
)

ROSTER = ("c", "w0", "w1")
helpers = load_file(Path(__file__).resolve().parents[1] / "_helpers.py", "tests_helpers")
LOGGER = "fedproto.transports.tcp"
#: What TLS 1.3 adds to each record: 5-byte header, 1-byte inner content type, 16-byte AEAD tag.
RECORD_OVERHEAD_BYTES = 22
RECORD_PLAINTEXT_BYTES = 16384


def write(credentials: PartyCredentials, directory: Path) -> TlsFiles:
    directory.mkdir(parents=True)
    return credentials.write(directory)


@pytest.fixture
def federation(tmp_path: Path) -> tuple[FederationCA, dict[str, TlsFiles]]:
    ca = FederationCA.create()
    return ca, {p: write(ca.issue(p), tmp_path / "kits" / p) for p in ROSTER}


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return helpers.warnings_of(caplog, LOGGER)


class WaitsBeforeAnswering(DelegatingTransport):
    """Holds its party's first frame until ``event`` is set (so the run is under way meanwhile)."""

    def __init__(self, inner, event: trio.Event) -> None:
        super().__init__(inner)
        self.event = event

    async def send(self, dest: str, frame: bytes) -> None:
        await self.event.wait()
        await self.inner.send(dest, frame)


async def test_a_provisioned_tls_run_of_the_toy_protocol(federation) -> None:
    _, kits = federation
    meter = Meter(trio.current_time)
    with trio.fail_after(60):
        async with open_tcp_network(ROSTER, tls=kits) as endpoints:
            assert all(ep.uses_tls for ep in endpoints.values())
            results = await run_parties(toy_machines(), endpoints, config=RuntimeConfig(deadline_s=20.0), meter=meter)
    np.testing.assert_array_equal(results["c"], expected_sums())
    assert results["w0"] == results["w1"] == 3
    assert meter.rejected_frames == 0
    # every party dialled and was dialled: each wrote handshake bytes, certificates included
    assert all(ep.handshake_bytes > 1000 for ep in endpoints.values())


async def test_conformance_over_tls() -> None:
    async with open_tcp_network(ROSTER) as endpoints:  # a throwaway federation
        assert all(ep.uses_tls and ep.framing_overhead_bytes == 4 for ep in endpoints.values())
        await run_conformance(endpoints)


# --- rogue dialers, refused while a run goes on --------------------------------------------------------


def _hello(claimed: str, listener: str = "c") -> bytes:
    return msgpack.packb([TLS_HELLO_VERSION, 0, roster_digest(ROSTER), claimed, listener], use_bin_type=True)


def _client_context(trusted_ca: Path, files: TlsFiles | None) -> ssl.SSLContext:
    """A TLS 1.3 client that trusts the federation's (public) CA certificate and presents ``files``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_verify_locations(str(trusted_ca))
    if files is not None:
        context.load_cert_chain(str(files.cert), str(files.key))
    return context


async def _rogue_dial(address: TcpAddress, trusted_ca: Path, files: TlsFiles | None, claimed: str,
                      *, plaintext: bool = False) -> bytes:
    """Dial, speak (TLS with ``files`` or plaintext), send a hello claiming ``claimed``; return what
    comes back before the listener closes (b"" when refused)."""
    stream = await trio.open_tcp_stream(address.host, address.port)
    try:
        channel: trio.abc.Stream = stream
        if plaintext:  # a client of the shared-secret handshake, or anyone without TLS
            await send_frame(stream, msgpack.packb(
                [HANDSHAKE_VERSION, 0, roster_digest(ROSTER), claimed, "c", b"n" * 32], use_bin_type=True
            ))
        else:
            channel = trio.SSLStream(stream, _client_context(trusted_ca, files), server_hostname="c",
                                     https_compatible=True)
            await channel.do_handshake()
            await send_frame(channel, _hello(claimed))
        received = b""
        with trio.fail_after(10):
            while chunk := await channel.receive_some():
                received += chunk
        return received
    except trio.BrokenResourceError:  # a TLS alert or a reset: refused as well
        return b""
    finally:
        await stream.aclose()


def _past(days: int) -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=days)


#: rogue -> the words c's warning must hold
ROGUES = {
    "another party's certificate": "the certificate names 'w1' but the hello claims 'w0'",
    "a name outside the roster": "certificate for 'mallory', who is not in the roster",
    "another federation's CA": "certificate refused: unable to get local issuer certificate",
    "an expired certificate": "certificate refused: certificate has expired",
    "no certificate": "peer did not return a certificate",
    "plaintext": "TLS handshake failed",
}


@pytest.mark.parametrize("rogue", list(ROGUES))
async def test_a_rogue_dialer_is_refused_and_logged_while_the_run_completes(
    federation, tmp_path: Path, caplog: pytest.LogCaptureFixture, rogue: str
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    ca, kits = federation
    files: TlsFiles | None
    if rogue == "another party's certificate":  # w1, a member, tries to pass as w0
        files, claimed = kits["w1"], "w0"
    elif rogue == "a name outside the roster":
        files, claimed = write(ca.issue("mallory"), tmp_path / "mallory"), "mallory"
    elif rogue == "another federation's CA":
        files, claimed = write(FederationCA.create().issue("w0"), tmp_path / "other"), "w0"
    elif rogue == "an expired certificate":
        files, claimed = write(ca.issue("w0", valid_days=1, not_before=_past(10)), tmp_path / "expired"), "w0"
    else:
        files, claimed = None, "w0"
    refused = trio.Event()
    answers: list[bytes] = []
    meter = Meter(trio.current_time)
    with trio.fail_after(60):
        async with open_tcp_network(ROSTER, tls=kits) as endpoints:
            address = endpoints["c"].addresses["c"]
            transports = {**endpoints, "w0": WaitsBeforeAnswering(endpoints["w0"], refused)}

            async def rogue_dials() -> None:
                answers.append(await _rogue_dial(address, kits["c"].ca, files, claimed, plaintext=rogue == "plaintext"))
                refused.set()  # only now may w0 answer c's first query: the run waits on it

            async with trio.open_nursery() as nursery:
                nursery.start_soon(rogue_dials)
                results = await run_parties(toy_machines(), transports, config=RuntimeConfig(deadline_s=20.0),
                                            meter=meter)
    assert answers == [b""]  # no acknowledgement: the connection was closed on the rogue
    np.testing.assert_array_equal(results["c"], expected_sums())
    assert results["w0"] == results["w1"] == 3
    assert meter.rejected_frames == 0  # nothing of the rogue's reached a machine
    if rogue != "plaintext":  # c's TLS records to it (a plaintext hello gets none, it is not TLS)
        assert endpoints["c"].refused_bytes > 0
    assert endpoints["w0"].refused_bytes == endpoints["w1"].refused_bytes == 0
    logged = [m for m in warnings_of(caplog) if "refused connection from 127.0.0.1" in m]
    assert len(logged) == 1 and logged[0].startswith("c: ") and ROGUES[rogue] in logged[0], warnings_of(caplog)


async def test_a_hello_for_another_session_roster_or_listener_is_refused(
    federation, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    _, kits = federation
    cases = {
        msgpack.packb([TLS_HELLO_VERSION, 7, roster_digest(ROSTER), "w0", "c"]): "session 7",
        msgpack.packb([TLS_HELLO_VERSION, 0, roster_digest(["w0", "c"]), "w0", "c"]): "different roster",
        msgpack.packb([TLS_HELLO_VERSION, 0, roster_digest(ROSTER), "w0", "w1"]): "wanted party 'w1', this is 'c'",
        msgpack.packb(["fedproto-tls/0", 0, roster_digest(ROSTER), "w0", "c"]): "unsupported hello version",
    }
    async with open_tcp_network(ROSTER, tls=kits) as endpoints:
        address = endpoints["c"].addresses["c"]
        for hello, words in cases.items():
            refused_before = endpoints["c"].refused_bytes
            stream = await trio.open_tcp_stream(address.host, address.port)
            channel = trio.SSLStream(stream, _client_context(kits["c"].ca, kits["w0"]), server_hostname="c",
                                     https_compatible=True)
            await channel.do_handshake()
            await send_frame(channel, hello)
            with trio.fail_after(10):
                assert await channel.receive_some() == b""
            await stream.aclose()
            endpoints["c"]._refusals.flush()  # one line per case, not a count at the end
            assert any(words in m for m in warnings_of(caplog)), (words, warnings_of(caplog))
            # c's whole TLS handshake (its certificate included) went to a connection it refused
            assert endpoints["c"].refused_bytes - refused_before > 1000
        assert endpoints["c"].handshake_bytes == 0  # nobody of the run dialled: no link's handshake


async def test_a_silent_dialer_times_out_and_closing_mid_handshake_is_clean(
    federation, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    _, kits = federation
    with trio.fail_after(20):
        async with open_tcp_network(ROSTER, tls=kits, handshake_timeout_s=0.3) as endpoints:
            address = endpoints["c"].addresses["c"]
            silent = await trio.open_tcp_stream(address.host, address.port)
            assert await silent.receive_some() == b""  # closed on it after the handshake timeout
            assert any("no handshake within 0.3 s" in m for m in warnings_of(caplog)), warnings_of(caplog)
            waiting = await trio.open_tcp_stream(address.host, address.port)
            await trio.testing.wait_all_tasks_blocked()  # c's handler waits in the TLS handshake
            await endpoints["c"].aclose()  # ends that handler quietly; the network closes cleanly
            assert await waiting.receive_some() == b""
            await silent.aclose()
            await waiting.aclose()
    assert len(warnings_of(caplog)) == 1


async def test_closing_an_endpoint_while_it_dials_ends_the_send_with_transport_closed(federation) -> None:
    _, kits = federation
    mute = await trio.open_tcp_listeners(0, host="127.0.0.1")  # accepts, never speaks TLS
    async with open_tcp_network(ROSTER, tls=kits) as endpoints, trio.open_nursery() as nursery:
        c = endpoints["c"]
        c.addresses["w0"] = TcpAddress("127.0.0.1", mute[0].socket.getsockname()[1])
        outcome: list[BaseException] = []

        async def send() -> None:
            try:
                await c.send("w0", b"never")
            except TransportClosed as exc:
                outcome.append(exc)

        nursery.start_soon(send)
        await trio.testing.wait_all_tasks_blocked()  # c waits for the TLS handshake's answer
        await c.aclose()
        with trio.fail_after(5):
            while not outcome:
                await trio.sleep(0.01)
    for listener in mute:
        await listener.aclose()
    assert isinstance(outcome[0], TransportClosed)


# --- the dialer's side ------------------------------------------------------------------------------


async def test_a_dialer_refuses_a_listener_with_another_partys_certificate(
    federation, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    _, kits = federation
    async with open_tcp_network(ROSTER, tls=kits) as endpoints:
        c, w0, w1 = (endpoints[p] for p in ROSTER)
        c.addresses["w0"] = w1.addresses["w1"]  # a misconfigured address book, or w1 squatting w0's address
        with trio.fail_after(5):  # at once, not retried until the connect timeout
            with pytest.raises(PeerUnreachable, match="handshake with w0 .*certificate refused: Hostname mismatch"):
                await c.send("w0", b"for w0 only")
        with trio.fail_after(5):
            while not warnings_of(caplog):  # w1 saw the dialer abort
                await trio.sleep(0.01)
        assert w1.receive_nowait() is None and w0.receive_nowait() is None


async def test_frames_are_encrypted_on_the_wire_and_tls_overhead_is_exact(federation) -> None:
    _, kits = federation
    secret_words = b"attack at dawn, bring the centroids"
    # 105 kB: one write with its prefix; 1 MiB + 1: the prefix written apart
    frames = [secret_words, b"", b"x" * 16380, b"y" * 16381, secret_words * 3000, b"z" * (1024 * 1024 + 1)]

    def tls_records(frame: bytes) -> int:  # see transports/_framing.py: frames <= 1 MiB go with their prefix
        if len(frame) <= 1024 * 1024:
            return math.ceil((len(frame) + FRAMING_OVERHEAD_BYTES) / RECORD_PLAINTEXT_BYTES)
        return 1 + math.ceil(len(frame) / RECORD_PLAINTEXT_BYTES)

    for mode in ("tls", "shared secret"):
        recorded = bytearray()

        async def relay(source: trio.abc.ReceiveStream, sink: trio.abc.SendStream, record: bool) -> None:
            try:
                while chunk := await source.receive_some():
                    if record:
                        recorded.extend(chunk)
                    await sink.send_all(chunk)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        security = {"tls": kits} if mode == "tls" else {"secret": b"0123456789abcdef-run-secret"}
        async with open_tcp_network(ROSTER, **security) as endpoints, trio.open_nursery() as nursery:
            target = endpoints["w0"].addresses["w0"]

            async def proxy(client: trio.SocketStream) -> None:
                server = await trio.open_tcp_stream(target.host, target.port)
                async with client, server, trio.open_nursery() as pair:
                    pair.start_soon(relay, client, server, True)
                    pair.start_soon(relay, server, client, False)

            listeners = await nursery.start(functools.partial(trio.serve_tcp, proxy, 0, host="127.0.0.1"))
            endpoints["c"].addresses["w0"] = TcpAddress("127.0.0.1", listeners[0].socket.getsockname()[1])
            for frame in frames:
                await endpoints["c"].send("w0", frame)
            with trio.fail_after(10):
                for frame in frames:
                    assert await endpoints["w0"].receive() == ("c", frame)
            c = endpoints["c"]
            if mode == "tls":
                assert secret_words not in recorded  # and the hello's names are not in clear either
                assert c.tls_overhead_bytes == RECORD_OVERHEAD_BYTES * sum(tls_records(f) for f in frames)
                plaintext = sum(FRAMING_OVERHEAD_BYTES + len(f) for f in frames)
                assert len(recorded) == c.handshake_bytes + plaintext + c.tls_overhead_bytes
            else:
                assert secret_words in recorded and c.tls_overhead_bytes == 0
            nursery.cancel_scope.cancel()


# --- checks at construction ---------------------------------------------------------------------------


def test_an_endpoint_checks_its_own_kit(federation, tmp_path: Path) -> None:
    ca, kits = federation
    addresses = {p: "127.0.0.1:0" for p in ROSTER}
    with pytest.raises(ValueError, match=r"is for 'w0', not 'c' \(another party's kit\?\)"):
        TcpTransport("c", ROSTER, addresses, tls=kits["w0"])
    expired = write(ca.issue("c", valid_days=1, not_before=_past(3)), tmp_path / "expired")
    with pytest.raises(ValueError, match="expired on"):
        TcpTransport("c", ROSTER, addresses, tls=expired)
    foreign = write(FederationCA.create().issue("c"), tmp_path / "foreign")
    mixed = TlsFiles(kits["c"].ca, foreign.cert, foreign.key)
    with pytest.raises(ValueError, match="is not signed by the CA"):
        TcpTransport("c", ROSTER, addresses, tls=mixed)
    wrong_key = TlsFiles(kits["c"].ca, kits["c"].cert, kits["w0"].key)
    with pytest.raises(ValueError, match="cannot load the TLS key"):
        TcpTransport("c", ROSTER, addresses, tls=wrong_key)
    with pytest.raises(ValueError, match="cannot read the CA certificate"):
        TcpTransport("c", ROSTER, addresses, tls=TlsFiles(tmp_path / "missing.pem", kits["c"].cert, kits["c"].key))
    with pytest.raises(ValueError, match="cannot be a certificate name"):
        TcpTransport("c", ("c", "W_0"), {"c": "127.0.0.1:0", "W_0": "127.0.0.1:0"}, tls=kits["c"])
    with pytest.raises(ValueError, match="not both or neither"):
        TcpTransport("c", ROSTER, addresses, b"0123456789abcdef-run-secret", tls=kits["c"])
    with pytest.raises(ValueError, match="not both or neither"):
        TcpTransport("c", ROSTER, addresses)

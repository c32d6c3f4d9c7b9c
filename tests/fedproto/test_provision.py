"""Provisioning a federation (issue 10, part 3): ``fedproto.provision`` and ``fedproto provision``.

* one kit per party: the CA's certificate, the party's certificate (its name as CN and SAN DNS
  name, serverAuth + clientAuth, not a CA, signed by the CA) and key (0600), a roster that differs
  from the others' only in its ``tls`` block; the CA's key only in ``OUT/ca`` (0600), in no kit;
* every bad input (party names that cannot be DNS labels, a missing or malformed address, an
  existing non-empty output directory...) is one line, before anything is written;
* the command line's kits run a protocol, one ``fedproto party`` process per party, over mutual
  TLS; ``fedproto party`` refuses a roster without TLS material unless ``--insecure-shared-secret``.
"""

from __future__ import annotations

import datetime
import json
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedproto.launcher import launch_local
from fedproto.metering import RunReport
from fedproto.provision import DEFAULT_VALID_DAYS, FederationCA, check_party_name, provision
from fedproto.roster import Roster
from fedproto.testing import load_file

helpers = load_file(Path(__file__).resolve().parents[1] / "_helpers.py", "tests_helpers")

PARTIES = ("server", "client-0", "client-1")
ADDRESSES = {"server": "10.0.0.1:7000", "client-0": "10.0.0.2:7001", "client-1": "[fd00::3]:7002"}
FEDPROTO = [sys.executable, "-m", "fedproto"]
SECURE_SUM = Path(__file__).resolve().parents[2] / "docs" / "tutorial" / "secure_sum.py"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_provision_writes_one_kit_per_party_and_keeps_the_ca_key_apart(tmp_path):
    out = tmp_path / "federation"
    kits = provision(PARTIES, ADDRESSES, out, valid_days=30, session=77)
    assert list(kits) == list(PARTIES) and all(kits[p] == out / p for p in PARTIES)
    assert sorted(p.name for p in out.iterdir()) == sorted([*PARTIES, "ca"])
    assert sorted(p.name for p in (out / "ca").iterdir()) == ["ca.key", "ca.pem"]
    assert _mode(out / "ca" / "ca.key") == 0o600 and _mode(out / "ca") == 0o700
    ca_key = (out / "ca" / "ca.key").read_bytes()
    ca = x509.load_pem_x509_certificate((out / "ca" / "ca.pem").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    rosters = {}
    for party, kit in kits.items():
        files = sorted(p.name for p in kit.iterdir())
        assert files == sorted(["ca.pem", f"{party}.pem", f"{party}.key", "roster.json"])
        assert _mode(kit) == 0o700 and _mode(kit / f"{party}.key") == 0o600 and _mode(kit / "roster.json") == 0o600
        assert all(ca_key not in f.read_bytes() for f in kit.iterdir())  # no kit holds the CA's key
        assert (kit / "ca.pem").read_bytes() == (out / "ca" / "ca.pem").read_bytes()
        cert = x509.load_pem_x509_certificate((kit / f"{party}.pem").read_bytes())
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == party
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == [party]
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        assert cert.not_valid_after_utc - cert.not_valid_before_utc == datetime.timedelta(days=30)
        assert cert.not_valid_before_utc <= datetime.datetime.now(datetime.timezone.utc)
        key = serialization.load_pem_private_key((kit / f"{party}.key").read_bytes(), password=None)
        assert key.public_key().public_numbers() == cert.public_key().public_numbers()
        doc = json.loads((kit / "roster.json").read_text())
        assert doc.pop("tls") == {"ca": "ca.pem", "cert": f"{party}.pem", "key": f"{party}.key"}
        rosters[party] = doc
        loaded = Roster.load(kit / "roster.json")
        assert loaded.secret is None and loaded.tls.cert == kit / f"{party}.pem"
    # the rosters differ only in their tls block: same parties, addresses and session, no secret
    assert all(doc == rosters["server"] for doc in rosters.values())
    assert rosters["server"] == {
        "session": 77, "parties": [{"name": p, "address": ADDRESSES[p]} for p in PARTIES],
    }


def test_two_federations_do_not_share_a_ca(tmp_path):
    first = provision(PARTIES, ADDRESSES, tmp_path / "a")
    second = provision(PARTIES, ADDRESSES, tmp_path / "b")
    a = x509.load_pem_x509_certificate((first["server"] / "ca.pem").read_bytes())
    b = x509.load_pem_x509_certificate((second["server"] / "ca.pem").read_bytes())
    assert a.subject != b.subject and a.public_key().public_numbers() != b.public_key().public_numbers()
    with pytest.raises(ValueError):  # a certificate of one federation is no good for the other
        x509.load_pem_x509_certificate((first["server"] / "server.pem").read_bytes()).verify_directly_issued_by(b)


@pytest.mark.parametrize("name", ["server", "client-0", "machine-12", "a", "x" * 63])
def test_good_party_names(name):
    assert check_party_name(name) == name


@pytest.mark.parametrize("name", ["Server", "client_0", "-a", "a-", "0client", "a.b", "", "x" * 64, "é", 3])
def test_names_that_cannot_be_a_certificate_identity_are_refused(name):
    with pytest.raises(ValueError, match="cannot be a certificate name: use one DNS label"):
        check_party_name(name)
    with pytest.raises(ValueError, match="cannot be a certificate name"):
        FederationCA.create().issue(name)


@pytest.mark.parametrize(
    ("parties", "addresses", "match"),
    [
        (("server", "Client-0"), None, "'Client-0' cannot be a certificate name"),
        (("server", "ca"), None, "taken by the CA's directory"),
        (("server",), None, "at least two parties"),
        (("server", "server"), None, "unique; repeated: server"),
        (("server", "client-0"), {"client-0": "h:1"}, "no address for the hub server"),
        (("server", "client-0"), {"server": "h:1", "client-0": "h"}, "host:port"),
        (("server", "client-0"), {"server": "h:1", "client-0": "h:0"}, "port 0"),
    ],
)
def test_provision_refuses_bad_input_before_writing_anything(tmp_path, parties, addresses, match):
    if addresses is None:
        addresses = {p: f"h:{i + 1}" for i, p in enumerate(parties)}
    with pytest.raises(ValueError, match=match):
        provision(parties, addresses, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_provision_refuses_an_output_it_would_clobber(tmp_path):
    addresses = {"server": "h:1", "client-0": "h:2"}
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    (tmp_path / "file").write_text("mine")
    for out, match in [("full", "not empty"), ("file", "not a directory"), ("no/such/dir", "does not exist")]:
        with pytest.raises(ValueError, match=match):
            provision(("server", "client-0"), addresses, tmp_path / out)
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["keep.txt"]
    with pytest.raises(ValueError, match="valid_days"):
        provision(("server", "client-0"), addresses, tmp_path / "new", valid_days=0)
    (tmp_path / "empty").mkdir()
    assert set(provision(("server", "client-0"), addresses, tmp_path / "empty")) == {"server", "client-0"}


# --- the command line ----------------------------------------------------------------------------------


def test_the_provision_command_with_a_hub_and_defaults(tmp_path, capsys):
    from fedproto.cli import main

    out = tmp_path / "fed"
    assert main(["provision", "--parties", "server,client-0,client-1", "--hub", "127.0.0.1:7100", "--topology", "mesh",
                 "--address", "client-1=10.0.0.9:9000", "--out", str(out), "--session", "5"]) == 0
    printed = capsys.readouterr().out
    assert "ca.key" in printed and "keep it offline" in printed and "fedproto party" in printed
    roster = Roster.load(out / "client-0" / "roster.json")
    # in a mesh, the hub is the first party; the others without --address get the hub's host, from its port + 1
    assert roster.addresses == {"server": "127.0.0.1:7100", "client-0": "127.0.0.1:7101", "client-1": "10.0.0.9:9000"}
    assert roster.session == 5
    cert = x509.load_pem_x509_certificate((out / "client-0" / "client-0.pem").read_bytes())
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == datetime.timedelta(days=DEFAULT_VALID_DAYS)
    assert main(["provision", "--parties", "a,b", "--hub", "[::1]:7000", "--base-port", "8000", "--topology", "mesh",
                 "--out", str(tmp_path / "v6"), "--valid-days", "2"]) == 0
    assert Roster.load(tmp_path / "v6" / "b" / "roster.json").addresses == {"a": "[::1]:7000", "b": "[::1]:8000"}


def _provision_usage_cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    base = ["provision", "--parties", "server,client-0"]
    out = ["--out", str(tmp / "out")]
    return {
        "non-empty output": ([*base, "--hub", "h:1", "--out", str(tmp / "full")], "argument --out: "),
        "output in a missing directory": ([*base, "--hub", "h:1", "--out", str(tmp / "no" / "dir")], "does not exist"),
        "bad name": (["provision", "--parties", "server,Client_0", "--hub", "h:1", *out], "'Client_0' cannot be"),
        "repeated name": (["provision", "--parties", "server,server", "--hub", "h:1", *out], "repeated: server"),
        "one party": (["provision", "--parties", "server", "--hub", "h:1", *out], "at least two parties"),
        "empty name": (["provision", "--parties", "server,,client-0", "--hub", "h:1", *out], "an empty name"),
        "party named ca": (["provision", "--parties", "server,ca", "--hub", "h:1", *out], "CA's directory"),
        "bad address": ([*base, "--address", "server=h:1", "--address", "client-0=h:99999", *out], "port in 0..65535"),
        "address without party": ([*base, "--address", "h:1", *out], "expected PARTY=HOST:PORT"),
        "address of a stranger": ([*base, "--hub", "h:1", "--address", "bob=h:2", *out], "'bob' is not one of"),
        "address given twice": ([*base, "--address", "server=h:1", "--address", "server=h:2", *out], "more than once"),
        "missing address": ([*base, "--topology", "mesh", "--address", "server=h:1", *out], "no address for client-0"),
        "star without its hub": ([*base, "--address", "client-0=h:1", *out], "no address for the hub server"),
        "base port in the star": ([*base, "--hub", "h:1", "--base-port", "9000", *out], "only listen in a mesh"),
        "port 0 hub": ([*base, "--hub", "h:0", *out], "must not be 0"),
        "base port without hub": ([*base, "--base-port", "9000", *out], "--base-port: needs --hub"),
        "ports run out": ([*base, "--topology", "mesh", "--hub", "h:65535", *out], "no port left for client-0"),
        "too many days": ([*base, "--hub", "h:1", "--valid-days", "99999", *out], "--valid-days: at most"),
    }


@pytest.mark.parametrize("case", list(_provision_usage_cases(Path("/tmp"))))
def test_provision_usage_errors_are_one_line_and_write_nothing(tmp_path, capfd, case):
    from fedproto.cli import main

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    argv, words = _provision_usage_cases(tmp_path)[case]
    assert main(argv) == 2
    err = capfd.readouterr().err.strip()
    assert "\n" not in err and err.startswith("fedproto: usage error: ") and words in err, err
    assert "see fedproto provision --help" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # nothing written
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]


def test_kits_from_the_command_run_a_protocol_one_process_per_party_over_tls(tmp_path):
    """The deployment path: ``fedproto provision``, then each party started on its own kit."""
    listeners = {p: socket.create_server(("127.0.0.1", 0)) for p in PARTIES}
    procs: dict[str, subprocess.Popen] = {}
    try:
        addresses = [f"--address={p}=127.0.0.1:{s.getsockname()[1]}" for p, s in listeners.items()]
        done = subprocess.run([*FEDPROTO, "provision", "--parties", ",".join(PARTIES), *addresses,
                               "--out", str(tmp_path / "fed")], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        for party, sock in listeners.items():
            fd = sock.fileno()
            procs[party] = subprocess.Popen(
                [*FEDPROTO, "party", str(SECURE_SUM), "--party", party, "--roster",
                 str(tmp_path / "fed" / party / "roster.json"), "--listen-fd", str(fd),
                 "--party-report", str(tmp_path / f"{party}.json"), "--deadline", "30"],
                pass_fds=(fd,), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
        for sock in listeners.values():
            sock.close()  # the children hold their own copies
        for party, proc in procs.items():
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"{party}: {err[-2000:]}"
    finally:
        for sock in listeners.values():
            sock.close()
        helpers.kill_all(procs.values())
    docs = {p: json.loads((tmp_path / f"{p}.json").read_text()) for p in PARTIES}
    reports = [RunReport.from_dict(doc["report"]) for doc in docs.values()]
    report = RunReport.merge(reports, transport="tcp")
    for doc in reports:  # each party counted the TLS it wrote: one 22-byte record overhead per frame sent
        assert doc.handshake_bytes > 0 and doc.tls_overhead_bytes == 22 * doc.messages
    assert report.handshake_bytes == sum(r.handshake_bytes for r in reports)
    tutorial = load_file(SECURE_SUM, "secure_sum_for_provision_test")
    expected = sum(tutorial.client_values(0, i, 8) for i in range(2))  # --seed 0, --d 8, --clients 2
    assert docs["server"]["result"]["sum"] == expected.tolist()


def test_a_party_refuses_a_roster_without_tls_unless_told_before_any_work(tmp_path, capfd, monkeypatch):
    from fedproto import registry
    from fedproto.cli import main

    plugin = registry.load_protocol("fastlloyd")
    monkeypatch.setattr(plugin, "plan", lambda args, dataset: pytest.fail("plan() ran before the roster was checked"))
    insecure = Roster.create({"server": "127.0.0.1:1", "client-0": "127.0.0.1:2", "client-1": "127.0.0.1:3"})
    path = insecure.save(tmp_path / "roster.json")
    argv = ["party", "fastlloyd", "--party", "server", "--roster", str(path), "--data", "iris"]
    assert main(argv) == 1
    err = capfd.readouterr().err.strip()
    assert "\n" not in err and "has no TLS material" in err and "--insecure-shared-secret" in err, err
    # and a TLS kit is not taken for a shared-secret run either
    kits = provision(PARTIES, {p: f"127.0.0.1:{i + 1}" for i, p in enumerate(PARTIES)}, tmp_path / "fed")
    assert main(["party", "fastlloyd", "--party", "server", "--roster", str(kits["server"] / "roster.json"),
                 "--insecure-shared-secret"]) == 1
    err = capfd.readouterr().err.strip()
    assert "\n" not in err and "no secret for --insecure-shared-secret" in err, err
    # nor another party's kit
    assert main(["party", "fastlloyd", "--party", "server", "--roster", str(kits["client-0"] / "roster.json")]) == 1
    err = capfd.readouterr().err.strip()
    assert "\n" not in err and "is the kit of client-0" in err and "not of --party server" in err, err


def test_insecure_shared_secret_is_still_there_when_asked_for(tmp_path):
    def command(party, roster_path, fd):
        return [*FEDPROTO, "party", str(SECURE_SUM), "--party", party, "--roster", str(roster_path),
                "--listen-fd", str(fd), "--insecure-shared-secret",
                "--party-report", str(tmp_path / f"{party}.json")]

    launch_local(PARTIES, command, timeout_s=120, tls=False)
    reports = [RunReport.from_dict(json.loads((tmp_path / f"{p}.json").read_text())["report"]) for p in PARTIES]
    assert all(r.tls_overhead_bytes == 0 and r.handshake_bytes > 0 for r in reports)
